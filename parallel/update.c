/* The optimizer step of one worker: the gradient norm (clipping, finiteness) and the update of
 * the parameters it owns. */
#include <math.h>

#include "collectives/reducer.h"
#include "core/error.h"
#include "core/plan.h"
#include "meshwit.h"
#include "parallel/optimizer.h"
#include "parallel/shards.h"
#include "parallel/trainer_impl.h"

/* The gradient norm: one partial sum of squares per slice of tr->slices, added in slice order in
 * double. Replicated, every device computes every partial; with ZeRO-1 each device its own
 * slice's (the only one summed over the devices) and the partials are all-gathered. Both give
 * the same bits. */
static mw_status grad_norm(worker *w, float *norm) {
    mw_trainer *tr = w->tr;
    if (tr->sharded_params) return mw__grad_norm_sharded(w, norm);
    const mw__device_vtable *vt = w->dev.vt;
    const size_t *sl = tr->slices;
    int n = tr->nworkers, first = tr->zero1 ? w->index : 0, last = tr->zero1 ? w->index + 1 : n;
    mw_status st;
    for (int r = first; r < last; r++) {
        mw__k_sumsq k = {.count = (int64_t)(sl[r + 1] - sl[r]),
                         .out = w->scratch + (r - first),
                         .a = (const float *)w->grads + sl[r]};
        if (k.count && (st = vt->sumsq(&w->dev, &k))) return st;
    }
    if ((st = vt->download(&w->dev, w->partials + first, w->scratch,
                           (size_t)(last - first) * sizeof(float))))
        return st;
    for (int r = first; r < last; r++)
        if (sl[r] == sl[r + 1]) w->partials[r] = 0.0f;
    if (tr->zero1) {
        for (int r = 0; r <= n; r++) w->bounds[r] = (size_t)r; /* one partial each */
        if ((st = tr->all_reducer->all_gather(tr->all, w->index, w->partials, (size_t)n, MW_F32,
                                              w->bounds)))
            return st;
    }
    double sq = 0.0;
    for (int r = 0; r < n; r++) sq += (double)w->partials[r];
    *norm = (float)sqrt(sq);
    return MW_OK;
}

/* The norm (clipping, finiteness) and the optimizer's kernels over [own_lo, own_hi), weight decay
 * and moments applied per parameter part of it. */
static mw_status update_slice(worker *w) {
    mw_trainer *tr = w->tr;
    const mw__device_vtable *vt = w->dev.vt;
    const mw_optimizer *o = &tr->cfg.optimizer;
    mw_status st;
    float scale = 1.0f;
    if (o->grad_clip > 0.0f || o->kind == MW_ADAMW || tr->cfg.check_finite ||
        tr->cfg.skip_nonfinite) {
        float norm;
        if ((st = grad_norm(w, &norm))) return st;
        if (w->index == 0) tr->grad_norm = norm;
        if (tr->cfg.skip_nonfinite && !isfinite(norm)) {
            w->skipped = 1; /* every replica has the same gradients and skips alike */
            return MW_OK;
        }
        if (tr->cfg.check_finite && !isfinite(norm))
            return mw__error(MW_ERR_NONFINITE,
                             "the gradients hold NaN or Inf (norm %g); no "
                             "parameter was updated",
                             norm);
        if (o->grad_clip > 0.0f && norm > o->grad_clip) scale = o->grad_clip / norm;
    }
    float lr = tr->step_lr;
    if (o->kind == MW_SGD) return mw__sgd_update(w, lr, scale);
    double t = (double)tr->steps + 1;
    float bias1 = (float)(1.0 - pow(o->beta1, t)), bias2 = (float)(1.0 - pow(o->beta2, t));
    float *m = w->moments, *v = m + (w->own_hi - w->own_lo);
    for (int i = 0; i < tr->g->nnodes; i++) {
        const mw_tensor *pn = tr->g->nodes[i];
        int64_t lo, hi;
        if (pn->op != MW__OP_PARAM || !mw__own_part(w, &w->plan.params[pn->leaf], &lo, &hi))
            continue;
        const mw__param_slot *slot = &w->plan.params[pn->leaf];
        mw__k_adamw k = {.count = hi - lo,
                         .lr = lr,
                         .beta1 = o->beta1,
                         .beta2 = o->beta2,
                         .eps = o->eps,
                         .weight_decay = tr->decays[pn->leaf] ? o->weight_decay : 0,
                         .bias1 = bias1,
                         .bias2 = bias2,
                         .grad_scale = scale,
                         .p = (float *)w->params + lo,
                         .m = m + (lo - w->own_lo),
                         .v = v + (lo - w->own_lo),
                         .g = (const float *)w->grads + lo,
                         .p16 = slot->bf16 ? (uint16_t *)w->params16 + lo : NULL};
        if ((st = vt->adamw(&w->dev, &k))) return st;
    }
    return MW_OK;
}

/* Converts the parameters of [lo, hi) that have a bf16 copy into it. */
static mw_status params16_refresh(worker *w, int64_t lo, int64_t hi) {
    const mw__plan *p = &w->plan;
    for (int j = 0; j < p->nparams; j++) {
        const mw__param_slot *s = &p->params[j];
        int64_t a = s->off > lo ? s->off : lo, b = s->off + s->count < hi ? s->off + s->count : hi;
        if (!s->bf16 || a >= b) continue;
        mw__k_copy k = {.alpha = 1.0f,
                        .out_dtype = MW_BF16,
                        .a_dtype = MW_F32,
                        .nd = {.rank = 1, .dims = {b - a}, .stride = {{1}, {1}}},
                        .out = (uint16_t *)w->params16 + a,
                        .a = (const float *)w->params + a};
        mw_status st = w->dev.vt->copy(&w->dev, &k);
        if (st) return st;
    }
    return MW_OK;
}

mw_status mw__params16_sync(worker *w) {
    if (!w->params16) return MW_OK;
    const mw_trainer *from = w->tr->params_from;
    uint64_t v = from ? from->w[w->index].version : w->version;
    if (v == w->version16) return MW_OK;
    mw_status st = params16_refresh(w, 0, (int64_t)mw__params16_elems(w));
    if (st == MW_OK) w->version16 = v;
    return st;
}

/* ZeRO-1: the parameters after this device updated its slice, all-gathered. */
static mw_status gather_params(worker *w) {
    mw_status st;
    if ((st = w->dev.vt->sync(&w->dev))) return st;
    mw_trainer *tr = w->tr;
    size_t n = (size_t)w->plan.param_elems;
    if (tr->sharded_params) /* among the devices holding the same shards */
        return tr->reducer->all_gather(w->comm[tr->zero_group], w->rank[tr->zero_group], w->params,
                                       n, MW_F32, w->zslices);
    if (w->dev.vt->host_memory)
        return tr->all_reducer->all_gather(tr->all, w->index, w->params, n, MW_F32, tr->slices);
    /* Device memory: through the gradients' reducer, on a group spanning the mesh (rank d on
     * device d, as plan_slices checked). */
    for (int gi = 0; gi < tr->ngroups; gi++)
        if (tr->groups[gi].ncomms == 1 && w->comm[gi])
            return tr->reducer->all_gather(w->comm[gi], w->rank[gi], w->params, n, MW_F32,
                                           tr->slices);
    return mw__error(MW_ERR_STATE, "internal: ZeRO-1 without a reduction group over the mesh");
}

/* The optimizer step on this device's slice of the parameters (all of them unless ZeRO-1). The
 * slice's gradients are already summed over the devices, so every device computes the same norm
 * and the same update of what it holds; ZeRO-1 then all-gathers the parameters. The optimizer's
 * kernels write the bf16 copy of what they update; with ZeRO-1 the rest of it is converted from
 * the gathered parameters (the bits the owner's kernel wrote). */
mw_status mw__update(worker *w) {
    mw_status st = update_slice(w);
    if (st || w->skipped) return st;
    w->version++;
    if (w->tr->zero1) {
        if ((st = gather_params(w)) || (st = params16_refresh(w, 0, w->own_lo)) ||
            (st = params16_refresh(w, w->own_hi, w->plan.param_elems)))
            return st;
    }
    if (w->version16 == w->version - 1) w->version16 = w->version;
    return MW_OK;
}
