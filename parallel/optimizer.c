/* The optimizer: configuration (defaults, validation, which parameters decay) and, on each
 * device, its state and its step: the gradient norm (clipping, finiteness), SGD with momentum and
 * weight decay, AdamW, gradient accumulation, and with ZeRO-1 the all-gather of the updated
 * slices. Each device updates the slice of the parameters it owns (all of them unless ZeRO-1);
 * the slice's gradients are already summed over the devices, so every device computes the same
 * norm and the same update of what it holds. */
#include "parallel/optimizer.h"

#include <float.h>
#include <math.h>
#include <stdio.h>

#include "collectives/reducer.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/plan.h"
#include "meshwit.h"

mw_optimizer mw_optimizer_defaults(mw_optimizer_kind kind) {
    mw_optimizer adamw = MW_ADAMW_INIT(1e-3f), sgd = MW_SGD_INIT(1e-3f);
    if (kind == MW_ADAMW) return adamw;
    sgd.kind = kind; /* another value is refused by mw_trainer_new, naming it */
    return sgd;
}

static mw_status bad(const char *field, double value, const char *range) {
    return mw__error(MW_ERR_INVALID, "mw_trainer_new: optimizer.%s is %g; it must be %s", field,
                     value, range);
}

mw_status mw__optimizer_resolve(mw_optimizer *o) {
    if (o->kind != MW_SGD && o->kind != MW_ADAMW)
        return mw__error(MW_ERR_INVALID,
                         "mw_trainer_new: optimizer.kind is %d; it must be MW_SGD or MW_ADAMW",
                         (int)o->kind);
    if (!(o->lr >= 0.0f) || !isfinite(o->lr)) return bad("lr", o->lr, "finite and >= 0");
    if (!(o->weight_decay >= 0.0f) || !isfinite(o->weight_decay))
        return bad("weight_decay", o->weight_decay, "finite and >= 0");
    if (!(o->grad_clip >= 0.0f) || !isfinite(o->grad_clip))
        return bad("grad_clip", o->grad_clip, "finite and >= 0 (0: no clipping)");
    if (o->warmup_steps < 0) return bad("warmup_steps", o->warmup_steps, ">= 0");
    if (o->decay_steps < 0) return bad("decay_steps", o->decay_steps, ">= 0 (0: no decay)");
    if (!(o->min_lr_ratio >= 0.0f && o->min_lr_ratio <= 1.0f))
        return bad("min_lr_ratio", o->min_lr_ratio, "in [0, 1]");
    if (o->decay_rule != MW_DECAY_MATRICES && o->decay_rule != MW_DECAY_RANK2)
        return mw__error(MW_ERR_INVALID,
                         "mw_trainer_new: optimizer.decay_rule is %d; it must be "
                         "MW_DECAY_MATRICES or MW_DECAY_RANK2",
                         (int)o->decay_rule);
    if (o->kind == MW_ADAMW) {
        if (!(o->beta1 >= 0.0f && o->beta1 < 1.0f)) return bad("beta1", o->beta1, "in [0, 1)");
        if (!(o->beta2 >= 0.0f && o->beta2 < 1.0f)) return bad("beta2", o->beta2, "in [0, 1)");
        if (!(o->eps > 0.0f) || !isfinite(o->eps))
            return mw__error(MW_ERR_INVALID,
                             "mw_trainer_new: optimizer.eps is %g; it must be finite and > 0 (with "
                             "0 an element whose gradient was always 0 divides 0 by 0). "
                             "MW_ADAMW_INIT(lr) and mw_optimizer_defaults(MW_ADAMW) give "
                             "PyTorch's defaults: beta1 0.9, beta2 0.999, eps 1e-8",
                             o->eps);
    } else {
        if (!(o->momentum >= 0.0f && o->momentum <= 1.0f))
            return bad("momentum", o->momentum, "in [0, 1]");
        if (!(o->dampening >= 0.0f && o->dampening <= 1.0f))
            return bad("dampening", o->dampening, "in [0, 1]");
        if (o->nesterov && (o->momentum <= 0.0f || o->dampening != 0.0f))
            return mw__error(MW_ERR_INVALID,
                             "mw_trainer_new: optimizer.nesterov needs optimizer.momentum > 0 "
                             "and optimizer.dampening 0 (momentum %g, dampening %g)",
                             o->momentum, o->dampening);
    }
    return MW_OK;
}

int mw__optimizer_moments(const mw_optimizer *o) {
    return o->kind == MW_ADAMW ? 2 : o->momentum > 0.0f ? 1 : 0;
}

/* Ops that hand a parameter on as it is (MW__T_SAME): the same values under other axes (renames,
 * splits, merges, a shard's label), in another order or dtype, broadcast, or gathered whole. */
static int passes_on(mw__op op) { return (mw__op_traits(op) & MW__T_SAME) != 0; }

mw_status mw__decay_flags(const mw_graph *g, const mw_optimizer *o, unsigned char *decays) {
    /* origin[node]: the parameter leaf a node hands on unchanged, or -1; not_bias[leaf]: the
     * parameter (through such nodes) reaches an op other than an addition. */
    int *origin = mw__malloc((size_t)g->nnodes * sizeof *origin + 1);
    char *not_bias = mw__calloc((size_t)g->nparams + 1, 1);
    if (!origin || !not_bias) {
        mw__free(origin);
        mw__free(not_bias);
        return mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
    }
    for (int i = 0; i < g->nnodes; i++) {
        const mw_tensor *t = g->nodes[i];
        origin[i] = t->op == MW__OP_PARAM ? t->leaf : -1;
        for (int k = 0; k < t->nin; k++) {
            int p = origin[t->in[k]->id];
            if (p < 0) continue;
            if (passes_on(t->op))
                origin[i] = p;
            else if (t->op != MW__OP_ADD && t->op != MW__OP_SUB)
                not_bias[p] = 1;
        }
    }
    for (int i = 0; i < g->nnodes; i++) {
        const mw_tensor *t = g->nodes[i];
        if (t->op != MW__OP_PARAM) continue;
        decays[t->leaf] = o->decays ? o->decays(t->name, t->type.rank, o->decay_user) != 0
                          : o->decay_rule == MW_DECAY_RANK2
                              ? t->type.rank >= 2
                              : t->type.rank >= 2 && not_bias[t->leaf];
    }
    mw__free(origin);
    mw__free(not_bias);
    return MW_OK;
}

mw_status mw__optimizer_decays(mw_trainer *tr) {
    const mw_graph *g = tr->prog->g;
    tr->decays = mw__calloc((size_t)g->nparams + 1, 1);
    if (!tr->decays) return mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
    return mw__decay_flags(g, &tr->cfg.optimizer, tr->decays);
}

int mw__own_part(const replica *r, const mw__param_slot *s, int64_t *lo, int64_t *hi) {
    *lo = s->off > r->own_lo ? s->off : r->own_lo;
    *hi = s->off + s->count < r->own_hi ? s->off + s->count : r->own_hi;
    return *lo < *hi;
}

/* The SGD update of replica r's slice with learning rate lr and gradient scale `scale`. */
static mw_status sgd_update(replica *r, float lr, float scale) {
    mw_trainer *tr = r->tr;
    worker *w = r->w;
    const mw__device_vtable *vt = w->dev.vt;
    const mw_optimizer *o = &tr->cfg.optimizer;
    if (o->momentum == 0.0f && o->weight_decay == 0.0f) {
        mw__k_sgd k = {.lr = lr * scale,
                       .count = r->own_hi - r->own_lo,
                       .p = (float *)w->params + r->own_lo,
                       .g = (const float *)w->grads + r->own_lo,
                       .p16 = w->params16 ? (uint16_t *)w->params16 + r->own_lo : NULL};
        return k.count ? vt->sgd(&w->dev, &k) : MW_OK;
    }
    for (int i = 0; i < tr->prog->g->nnodes; i++) {
        const mw_tensor *pn = tr->prog->g->nodes[i];
        int64_t lo, hi;
        if (pn->op != MW__OP_PARAM || !mw__own_part(r, &w->plan.params[pn->leaf], &lo, &hi))
            continue;
        mw__k_sgd_momentum k = {
            .count = hi - lo,
            .lr = lr,
            .momentum = o->momentum,
            .dampening = o->dampening,
            .weight_decay = tr->decays[pn->leaf] ? o->weight_decay : 0.0f,
            .grad_scale = scale,
            .nesterov = o->nesterov,
            .first = tr->prog->steps == 0,
            .p = (float *)w->params + lo,
            .buf = o->momentum > 0.0f ? (float *)r->moments + (lo - r->own_lo) : NULL,
            .g = (const float *)w->grads + lo,
            .p16 = w->plan.params[pn->leaf].bf16 ? (uint16_t *)w->params16 + lo : NULL};
        mw_status st = vt->sgd_momentum(&w->dev, &k);
        if (st) return st;
    }
    return MW_OK;
}

/* Gradient accumulation on replica r after a backward pass: fold 0 adds the gradients to the
 * accumulator (copies them into it for the first micro-batch); fold 1 replaces the gradients by
 * the mean of the accumulated micro-batches and this one. */
static mw_status accumulate_grads(replica *r, int fold) {
    worker *w = r->w;
    int n = r->tr->accumulated;
    /* Only this device's slice (the accumulator holds no more): with ZeRO-1 the rest of its
     * gradients is not summed over the devices. */
    int64_t count = r->own_hi - r->own_lo;
    if (count == 0) return MW_OK;
    mw__nd nd = {.rank = 1, .dims = {count}, .stride = {{1}, {1}, {1}}};
    float *grads = (float *)w->grads + r->own_lo, *accum = r->accum;
    if (fold && r->tr->fold_only) { /* every micro-batch is in the accumulator already */
        mw__k_copy mean = {.alpha = 1.0f / (float)n, .nd = nd, .out = grads, .a = accum};
        return w->dev.vt->copy(&w->dev, &mean);
    }
    if (!fold && n == 0) {
        mw__k_copy k = {.alpha = 1.0f, .nd = nd, .out = accum, .a = grads};
        return w->dev.vt->copy(&w->dev, &k);
    }
    float *dst = fold ? grads : accum;
    mw__k_binary sum = {.op = MW__BIN_ADD, .nd = nd, .out = dst, .a = accum, .b = grads};
    mw_status st = w->dev.vt->binary(&w->dev, &sum);
    if (st || !fold) return st;
    mw__k_copy mean = {.alpha = 1.0f / (float)(n + 1), .nd = nd, .out = dst, .a = dst};
    return w->dev.vt->copy(&w->dev, &mean);
}

/* The part [*lo, *hi) of parameter p's local elements that device e adds to the gradient norm,
 * so that every element of the model's gradient is added once and the work is shared: the
 * devices holding p's shard (its box) each add an even part of it. With ZeRO-1 a device's reduced
 * gradient is only its own slice, so there it adds its slice of p, if its data group is the one of
 * the shard's first holder (each holds its own slice of the shard). */
static void norm_part(const mw_trainer *tr, int e, const mw_tensor *p, int64_t *lo, int64_t *hi) {
    const mw__program *prog = tr->prog;
    const worker *w = &prog->w[e];
    const mw__param_slot *s = &w->plan.params[p->leaf];
    *lo = *hi = s->off;
    if (prog->zero1) {
        int gi = tr->zero_group, counts = 0;
        for (int d = 0; d < prog->nworkers && !counts; d++)
            counts =
                prog->w[d].group_class[gi] == w->group_class[gi] && mw__param_box_first(prog, d, p);
        if (!counts) return;
        int k = w->rank[gi];
        *lo = (int64_t)w->zslices[k] > s->off ? (int64_t)w->zslices[k] : s->off;
        *hi = (int64_t)w->zslices[k + 1] < s->off + s->count ? (int64_t)w->zslices[k + 1]
                                                             : s->off + s->count;
        if (*hi < *lo) *hi = *lo;
        return;
    }
    int holders = 0, rank = 0;
    for (int d = 0; d < prog->nworkers; d++)
        if (mw__same_box(prog, d, e, p)) rank += d < e, holders++;
    *lo = s->off + (int64_t)mw__slice_lo((size_t)s->count, holders, rank);
    *hi = s->off + (int64_t)mw__slice_lo((size_t)s->count, holders, rank + 1);
}

/* The gradient norm, the same bits in every layout. Each device adds the squares of its part of
 * the gradient into one exact accumulator (devices/math.h: an integer, so how the elements are cut
 * among devices and kernels changes nothing): its slice of the flat gradient (tr->slices, or its
 * ZeRO-1 slice), or with sharded parameters its part of each parameter (norm_part). The devices'
 * accumulators are all-gathered and added, exactly too, and the norm is the square root of the
 * total: the same on every device and in every layout of the same gradient, so the replicated
 * run, ZeRO-1, FSDP and tensor parallelism clip by identical norms. */
static mw_status grad_norm(replica *r, float *norm) {
    mw_trainer *tr = r->tr;
    mw__program *prog = tr->prog;
    worker *w = r->w;
    const mw__device_vtable *vt = w->dev.vt;
    int n = prog->nworkers, zero = 1;
    mw_status st;
    for (int i = 0; i < (prog->sharded_params ? prog->g->nnodes : 1); i++) {
        int64_t lo, hi;
        if (prog->sharded_params) {
            const mw_tensor *p = prog->g->nodes[i];
            if (p->op != MW__OP_PARAM) continue;
            norm_part(tr, w->index, p, &lo, &hi);
        } else { /* the whole gradient on every device: one slice each */
            lo = (int64_t)tr->slices[w->index], hi = (int64_t)tr->slices[w->index + 1];
        }
        if (hi <= lo) continue;
        mw__k_sumsq q = {
            .count = hi - lo, .out = r->acc, .a = (const float *)w->grads + lo, .zero = zero};
        if ((st = vt->sumsq(&w->dev, &q))) return st;
        zero = 0;
    }
    mw__sqacc *mine = &r->accs[w->index];
    if (zero)
        memset(mine, 0, sizeof *mine);
    else if ((st = vt->download(&w->dev, mine, r->acc, sizeof *mine)))
        return st;
    mw__sqacc total = *mine;
    if (n > 1) {
        size_t per = sizeof(mw__sqacc) / sizeof(float);
        for (int k = 0; k <= n; k++) w->bounds[k] = (size_t)k * per;
        if ((st = prog->all_reducer->all_gather(prog->all, w->index, (float *)r->accs,
                                                (size_t)n * per, MW_F32, w->bounds)))
            return st;
        memset(&total, 0, sizeof total);
        for (int d = 0; d < n; d++) mw__sqacc_add(&total, &r->accs[d]);
    }
    /* A squared norm beyond float's range counts as infinite, as the gradients' squares overflow
     * AdamW's float second moments: MW_NONFINITE_STOP and _SKIP catch such a step. */
    double sq = mw__sqacc_value(&total);
    *norm = sq > (double)FLT_MAX ? INFINITY : (float)sqrt(sq);
    return MW_OK;
}

/* MW_ERR_NONFINITE for a step whose gradient norm is not finite, naming the first parameter of
 * r's slice whose gradient holds NaN or Inf (read back from the device: the step has failed
 * already, so the time and the host memory do not count against a step). */
static mw_status nonfinite_gradients(replica *r, float norm) {
    mw_trainer *tr = r->tr;
    worker *w = r->w;
    int64_t n = r->own_hi - r->own_lo;
    float *g = n > 0 ? mw__malloc((size_t)n * sizeof *g) : NULL;
    const char *bad = NULL;
    if (g && w->dev.vt->download(&w->dev, g, (const float *)w->grads + r->own_lo,
                                 (size_t)n * sizeof *g) == MW_OK) {
        int64_t first = n;
        for (int i = 0; i < tr->prog->g->nnodes; i++) {
            const mw_tensor *pn = tr->prog->g->nodes[i];
            int64_t lo, hi;
            if (pn->op != MW__OP_PARAM || !mw__own_part(r, &w->plan.params[pn->leaf], &lo, &hi))
                continue;
            for (int64_t e = lo; e < hi && e - r->own_lo < first; e++)
                if (!isfinite(g[e - r->own_lo])) {
                    first = e - r->own_lo;
                    bad = pn->name;
                    break;
                }
        }
    }
    mw__free(g);
    char which[MW_MAX_NAME + 96];
    if (bad)
        snprintf(which, sizeof which, "; the first is of parameter '%s'", bad);
    else if (!g)
        snprintf(which, sizeof which, "%s", n > 0 ? " (out of memory finding which)" : "");
    else if (tr->prog->zero1 && tr->prog->nworkers > 1)
        snprintf(which, sizeof which,
                 "; none in %s's part of them: another device's, or the sum "
                 "of their squares overflows float",
                 w->dev.name);
    else
        snprintf(which, sizeof which,
                 "; every element is finite, but the sum of their squares overflows float");
    return mw__error(MW_ERR_NONFINITE,
                     "step %lld: the gradients hold NaN or Inf (norm %g)%s; no parameter was "
                     "updated (mw_trainer_config.nonfinite = MW_NONFINITE_SKIP skips such steps)",
                     (long long)tr->prog->steps, norm, which);
}

/* The norm (clipping, finiteness) and the optimizer's kernels over [own_lo, own_hi), weight decay
 * and moments applied per parameter part of it. */
static mw_status update_slice(replica *r) {
    mw_trainer *tr = r->tr;
    worker *w = r->w;
    const mw__device_vtable *vt = w->dev.vt;
    const mw_optimizer *o = &tr->cfg.optimizer;
    mw_nonfinite nf = tr->cfg.nonfinite;
    mw_status st;
    float scale = 1.0f;
    if (o->grad_clip > 0.0f || o->kind == MW_ADAMW || nf != MW_NONFINITE_IGNORE) {
        float norm;
        if ((st = grad_norm(r, &norm))) return st;
        if (tr->global_norm) norm = tr->global_norm(tr->global_norm_ctx, w->index, norm);
        if (w->index == 0) tr->grad_norm = norm;
        if (nf == MW_NONFINITE_SKIP && !isfinite(norm)) {
            r->skipped = 1; /* every replica has the same gradients and skips alike */
            return MW_OK;
        }
        if (nf == MW_NONFINITE_STOP && !isfinite(norm)) return nonfinite_gradients(r, norm);
        if (o->grad_clip > 0.0f && norm > o->grad_clip) scale = o->grad_clip / norm;
    }
    float lr = tr->step_lr;
    if (o->kind == MW_SGD) return sgd_update(r, lr, scale);
    double t = (double)tr->prog->steps + 1;
    float bias1 = (float)(1.0 - pow(o->beta1, t)), bias2 = (float)(1.0 - pow(o->beta2, t));
    float *m = r->moments, *v = m + (r->own_hi - r->own_lo);
    for (int i = 0; i < tr->prog->g->nnodes; i++) {
        const mw_tensor *pn = tr->prog->g->nodes[i];
        int64_t lo, hi;
        if (pn->op != MW__OP_PARAM || !mw__own_part(r, &w->plan.params[pn->leaf], &lo, &hi))
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
                         .m = m + (lo - r->own_lo),
                         .v = v + (lo - r->own_lo),
                         .g = (const float *)w->grads + lo,
                         .p16 = slot->bf16 ? (uint16_t *)w->params16 + lo : NULL};
        if ((st = vt->adamw(&w->dev, &k))) return st;
    }
    return MW_OK;
}

/* ZeRO-1: the parameters after this device updated its slice, all-gathered. */
static mw_status gather_params(replica *r) {
    worker *w = r->w;
    mw_status st;
    if ((st = w->dev.vt->sync(&w->dev))) return st;
    mw_trainer *tr = r->tr;
    mw__program *prog = tr->prog;
    size_t n = (size_t)w->plan.param_elems;
    if (prog->sharded_params) /* among the devices holding the same shards */
        return prog->reducer->all_gather(w->comm[tr->zero_group], w->rank[tr->zero_group],
                                         w->params, n, MW_F32, w->zslices);
    if (w->dev.vt->host_memory)
        return prog->all_reducer->all_gather(prog->all, w->index, w->params, n, MW_F32, tr->slices);
    /* Device memory: through the gradients' reducer, on a group spanning the mesh (rank d on
     * device d, as plan_slices checked). */
    for (int gi = 0; gi < prog->ngroups; gi++)
        if (prog->groups[gi].ncomms == 1 && w->comm[gi])
            return prog->reducer->all_gather(w->comm[gi], w->rank[gi], w->params, n, MW_F32,
                                             tr->slices);
    return mw__error(MW_ERR_STATE, "internal: ZeRO-1 without a reduction group over the mesh");
}

/* The optimizer step on this device's slice of the parameters (all of them unless ZeRO-1). The
 * slice's gradients are already summed over the devices, so every device computes the same norm
 * and the same update of what it holds; ZeRO-1 then all-gathers the parameters. The optimizer's
 * kernels write the bf16 copy of what they update; with ZeRO-1 the rest of it is converted from
 * the gathered parameters (the bits the owner's kernel wrote). */
static mw_status update(replica *r) {
    worker *w = r->w;
    mw_status st = update_slice(r);
    if (st || r->skipped) return st;
    w->version++;
    if (w->prog->zero1) {
        if ((st = gather_params(r)) || (st = mw__params16_refresh(w, 0, r->own_lo)) ||
            (st = mw__params16_refresh(w, r->own_hi, w->plan.param_elems)))
            return st;
    }
    if (w->version16 == w->version - 1) w->version16 = w->version;
    return MW_OK;
}

/* ---- where the devices hold gradients and moments (mw__holding) ---- */

static char *held_grads(void *ctx, const worker *w, const mw__param_slot *s, int64_t *lo,
                        int64_t *hi) {
    const mw_trainer *tr = ctx;
    *lo = s->off;
    *hi = s->off + s->count;
    if (tr->prog->zero1 && !mw__own_part(&tr->rep[w->index], s, lo, hi)) *hi = *lo;
    return (char *)w->grads + *lo * 4;
}

static char *held_moment(const mw_trainer *tr, const worker *w, const mw__param_slot *s,
                         int64_t *lo, int64_t *hi, int k) {
    const replica *r = &tr->rep[w->index];
    if (!mw__own_part(r, s, lo, hi)) *hi = *lo;
    int64_t own = r->own_hi - r->own_lo;
    return (char *)r->moments + ((int64_t)k * own + *lo - r->own_lo) * 4;
}

static char *held_moment0(void *ctx, const worker *w, const mw__param_slot *s, int64_t *lo,
                          int64_t *hi) {
    return held_moment(ctx, w, s, lo, hi, 0);
}

static char *held_moment1(void *ctx, const worker *w, const mw__param_slot *s, int64_t *lo,
                          int64_t *hi) {
    return held_moment(ctx, w, s, lo, hi, 1);
}

mw__holding mw__held_grads(mw_trainer *tr) {
    return (mw__holding){.range = held_grads, .ctx = tr, .sliced = tr->prog->zero1};
}

mw__holding mw__held_moment(mw_trainer *tr, int k) {
    return (mw__holding){
        .range = k ? held_moment1 : held_moment0, .ctx = tr, .sliced = tr->prog->zero1};
}

/* ---- the trainer's work on each worker (mw__program_hooks) ---- */

static mw_status device_init(void *ctx, worker *w) {
    mw_trainer *tr = ctx;
    replica *r = &tr->rep[w->index];
    const mw__device_vtable *vt = w->dev.vt;
    mw_status st;
    if ((st = vt->alloc(&w->dev, sizeof(mw__sqacc), (void **)&r->acc))) return st;
    int moments = mw__optimizer_moments(&tr->cfg.optimizer);
    if (moments) {
        int64_t elems = moments * (r->own_hi - r->own_lo);
        if ((st = vt->alloc(&w->dev, (size_t)(elems ? elems : 1) * 4, &r->moments))) return st;
        mw__k_fill z = {.value = 0.0f, .count = elems, .out = r->moments};
        if (elems && (st = vt->fill(&w->dev, &z))) return st;
    }
    if (tr->cfg.grad_accumulation) {
        int64_t elems = r->own_hi - r->own_lo; /* this device's slice */
        if ((st = vt->alloc(&w->dev, (size_t)(elems ? elems : 1) * 4, &r->accum))) return st;
        mw__k_fill z = {.value = 0.0f, .count = elems, .out = r->accum};
        if (elems && (st = vt->fill(&w->dev, &z))) return st;
    }
    return MW_OK;
}

/* The optimizer step of a worker whose gradients are summed: the loss checked when asked, a
 * barrier so that nobody updates unless everybody got this far, then the update. */
static mw_status device_step(mw_trainer *tr, replica *r) {
    worker *w = r->w;
    mw_status st;
    if (tr->accumulated && (st = accumulate_grads(r, 1))) return st;
    /* A pipeline stage's update runs after all its micro-batches: the gradient norm (the whole
     * model's) finds what a non-finite loss left. */
    if (tr->cfg.nonfinite != MW_NONFINITE_IGNORE && !tr->fold_only) {
        /* The loss is replicated: every device sees the same value and stops alike. */
        float loss;
        if ((st = w->dev.vt->download(&w->dev, &loss, mw__ptr(w, w->plan.loss), sizeof loss)))
            return st;
        if (!isfinite(loss) && tr->cfg.nonfinite == MW_NONFINITE_SKIP) {
            r->skipped = 1;
            return w->dev.vt->sync(&w->dev);
        }
        if (!isfinite(loss))
            return mw__error(MW_ERR_NONFINITE,
                             "step %lld: the loss is %g; no parameter was updated "
                             "(mw_trainer_config.nonfinite = MW_NONFINITE_SKIP skips such steps)",
                             (long long)tr->prog->steps, loss);
    }
    int64_t t0 = mw__now_ns();
    st = mw__enter(w, MW_PHASE_UPDATE);
    /* A data error (bad id or target) a GPU kernel found is reported by the sync, before any
     * parameter changes, also with one device. */
    if (st == MW_OK) st = w->dev.vt->sync(&w->dev);
    /* Nobody updates unless everybody got this far: replicas stay identical when a device fails
     * before its update. */
    if (st == MW_OK && tr->prog->all) st = tr->prog->all_reducer->barrier(tr->prog->all, w->index);
    if (st == MW_OK) st = update(r);
    if (st == MW_OK) st = w->dev.vt->sync(&w->dev);
    r->update_ms = (double)(mw__now_ns() - t0) * 1e-6;
    if (w->prof_cat) {
        w->prof_ms[MW__PROF_UPDATE] += r->update_ms;
        w->prof_calls[MW__PROF_UPDATE]++;
    }
    return st;
}

static mw_status device_after_backward(void *ctx, worker *w) {
    mw_trainer *tr = ctx;
    replica *r = &tr->rep[w->index];
    mw_status st;
    r->skipped = 0;
    switch (tr->train) {
    case TRAIN_ACCUM: return (st = accumulate_grads(r, 0)) ? st : w->dev.vt->sync(&w->dev);
    case TRAIN_STEP: return device_step(tr, r);
    case TRAIN_GRADS: break;
    }
    return w->dev.vt->sync(&w->dev);
}

static void device_quit(void *ctx, worker *w) {
    mw_trainer *tr = ctx;
    replica *r = &tr->rep[w->index];
    w->dev.vt->free(&w->dev, r->moments);
    w->dev.vt->free(&w->dev, r->accum);
    w->dev.vt->free(&w->dev, r->acc);
}

const mw__program_hooks mw__trainer_hooks = {
    .init = device_init, .after_backward = device_after_backward, .quit = device_quit};
