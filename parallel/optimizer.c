/* Optimizer configuration (defaults, validation, which parameters decay) and the SGD update with
 * momentum and weight decay. AdamW's update is in update.c beside the gradient norm. */
#include "parallel/optimizer.h"

#include <math.h>
#include <stdio.h>

#include "core/alloc.h"

mw_optimizer mw_optimizer_defaults(mw_optimizer_kind kind) {
    mw_optimizer o = {.kind = kind, .lr = 1e-3f};
    mw__optimizer_resolve(&o);
    return o;
}

/* 0 means the default; MW_ZERO (-0.0f) an explicit zero. */
static void fill(float *field, float value) {
    if (*field == 0.0f) *field = signbit(*field) ? 0.0f : value;
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
    fill(&o->beta1, 0.9f);
    fill(&o->beta2, 0.999f);
    fill(&o->eps, 1e-8f);
    if (!(o->lr >= 0.0f) || !isfinite(o->lr)) return bad("lr", o->lr, "finite and >= 0");
    if (!(o->weight_decay >= 0.0f) || !isfinite(o->weight_decay))
        return bad("weight_decay", o->weight_decay, "finite and >= 0");
    if (!(o->grad_clip >= 0.0f) || !isfinite(o->grad_clip))
        return bad("grad_clip", o->grad_clip, "finite and >= 0 (0: no clipping)");
    if (o->warmup_steps < 0) return bad("warmup_steps", o->warmup_steps, ">= 0");
    if (o->decay_steps < 0) return bad("decay_steps", o->decay_steps, ">= 0 (0: no decay)");
    if (!(o->min_lr_ratio >= 0.0f && o->min_lr_ratio <= 1.0f))
        return bad("min_lr_ratio", o->min_lr_ratio, "in [0, 1]");
    if (o->kind == MW_ADAMW) {
        if (!(o->beta1 >= 0.0f && o->beta1 < 1.0f)) return bad("beta1", o->beta1, "in [0, 1)");
        if (!(o->beta2 >= 0.0f && o->beta2 < 1.0f)) return bad("beta2", o->beta2, "in [0, 1)");
        if (!(o->eps >= 0.0f) || !isfinite(o->eps)) return bad("eps", o->eps, "finite and >= 0");
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

/* Ops that hand a parameter on as it is: the same values under other axes (renames, splits,
 * merges, a shard's label), in another order or dtype, or broadcast. */
static int passes_on(mw__op op) {
    return op == MW__OP_ALIAS || op == MW__OP_SHARD || op == MW__OP_PERMUTE ||
           op == MW__OP_BROADCAST || op == MW__OP_CAST;
}

mw_status mw__optimizer_decays(mw_trainer *tr) {
    const mw_graph *g = tr->g;
    const mw_optimizer *o = &tr->cfg.optimizer;
    tr->decays = mw__calloc((size_t)g->nparams + 1, 1);
    /* origin[node]: the parameter leaf a node hands on unchanged, or -1; not_bias[leaf]: the
     * parameter (through such nodes) reaches an op other than an addition. */
    int *origin = mw__malloc((size_t)g->nnodes * sizeof *origin + 1);
    char *not_bias = mw__calloc((size_t)g->nparams + 1, 1);
    if (!tr->decays || !origin || !not_bias) {
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
        tr->decays[t->leaf] = o->decays ? o->decays(t->name, t->type.rank, o->decay_user) != 0
                                        : t->type.rank >= 2 && not_bias[t->leaf];
    }
    mw__free(origin);
    mw__free(not_bias);
    return MW_OK;
}

int mw__own_part(const worker *w, const mw__param_slot *s, int64_t *lo, int64_t *hi) {
    *lo = s->off > w->own_lo ? s->off : w->own_lo;
    *hi = s->off + s->count < w->own_hi ? s->off + s->count : w->own_hi;
    return *lo < *hi;
}

mw_status mw__sgd_update(worker *w, float lr, float scale) {
    mw_trainer *tr = w->tr;
    const mw__device_vtable *vt = w->dev.vt;
    const mw_optimizer *o = &tr->cfg.optimizer;
    if (o->momentum == 0.0f && o->weight_decay == 0.0f) {
        mw__k_sgd k = {.lr = lr * scale,
                       .count = w->own_hi - w->own_lo,
                       .p = (float *)w->params + w->own_lo,
                       .g = (const float *)w->grads + w->own_lo,
                       .p16 = w->params16 ? (uint16_t *)w->params16 + w->own_lo : NULL};
        return k.count ? vt->sgd(&w->dev, &k) : MW_OK;
    }
    for (int i = 0; i < tr->g->nnodes; i++) {
        const mw_tensor *pn = tr->g->nodes[i];
        int64_t lo, hi;
        if (pn->op != MW__OP_PARAM || !mw__own_part(w, &w->plan.params[pn->leaf], &lo, &hi))
            continue;
        mw__k_sgd_momentum k = {
            .count = hi - lo,
            .lr = lr,
            .momentum = o->momentum,
            .dampening = o->dampening,
            .weight_decay = tr->decays[pn->leaf] ? o->weight_decay : 0.0f,
            .grad_scale = scale,
            .nesterov = o->nesterov,
            .first = tr->steps == 0,
            .p = (float *)w->params + lo,
            .buf = o->momentum > 0.0f ? (float *)w->moments + (lo - w->own_lo) : NULL,
            .g = (const float *)w->grads + lo,
            .p16 = w->plan.params[pn->leaf].bf16 ? (uint16_t *)w->params16 + lo : NULL};
        mw_status st = vt->sgd_momentum(&w->dev, &k);
        if (st) return st;
    }
    return MW_OK;
}

mw_status mw__accumulate_grads(worker *w, int fold) {
    int n = w->tr->accumulated;
    /* Only this device's slice (the accumulator holds no more): with ZeRO-1 the rest of its
     * gradients is not summed over the devices. */
    int64_t count = w->own_hi - w->own_lo;
    if (count == 0) return MW_OK;
    mw__nd nd = {.rank = 1, .dims = {count}, .stride = {{1}, {1}, {1}}};
    float *grads = (float *)w->grads + w->own_lo, *accum = w->accum;
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
