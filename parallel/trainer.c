/* The trainer: compiles the graph for every device of the mesh, runs one worker thread per device
 * and drives steps. The host hands every worker the same command under a mutex and waits until
 * all are done; inside a step, workers meet only in the collectives. A failing worker aborts the
 * communicators so no peer is left waiting, and the host reports the root cause. */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/autodiff.h"
#include "core/error.h"
#include "core/graph_impl.h"
#include "core/init.h"
#include "core/plan.h"
#include "devices/backend.h"
#include "meshwit.h"
#include "parallel/consistency.h"
#include "parallel/data_errors.h"
#include "parallel/mesh_impl.h"
#include "parallel/optimizer.h"
#include "parallel/reducer.h"
#include "parallel/reducer_select.h"
#include "parallel/trainer_impl.h"
#include "parallel/wait.h"

/* --- worker side ----------------------------------------------------------------------------- */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Whether device d of the mesh is one of this process's. */
static int local(const mw_trainer *tr, int d) {
    return d >= tr->first && d < tr->first + tr->nlocal;
}

static int group_index(const mw_trainer *tr, uint32_t mask) {
    for (int i = 0; i < tr->ngroups; i++)
        if (tr->groups[i].mask == mask) return i;
    return -1;
}

static void *ptr(worker *w, mw__ref r) { return w->bases[r.base] + r.off * 4; }

static mw_status run_ins(worker *w, mw__ins *in) {
    const mw__device_vtable *vt = w->dev.vt;
    mw__device *dev = &w->dev;
    switch (in->kind) {
    case MW__I_BINARY:
        in->k.binary.out = ptr(w, in->ref[0]);
        in->k.binary.a = ptr(w, in->ref[1]);
        in->k.binary.b = ptr(w, in->ref[2]);
        return vt->binary(dev, &in->k.binary);
    case MW__I_COPY:
        in->k.copy.out = ptr(w, in->ref[0]);
        in->k.copy.a = ptr(w, in->ref[1]);
        return vt->copy(dev, &in->k.copy);
    case MW__I_REDUCE:
        in->k.reduce.out = ptr(w, in->ref[0]);
        in->k.reduce.a = ptr(w, in->ref[1]);
        return vt->reduce(dev, &in->k.reduce);
    case MW__I_GEMM:
        in->k.gemm.c = ptr(w, in->ref[0]);
        in->k.gemm.a = ptr(w, in->ref[1]);
        in->k.gemm.b = ptr(w, in->ref[2]);
        return vt->gemm(dev, &in->k.gemm);
    case MW__I_FILL: in->k.fill.out = ptr(w, in->ref[0]); return vt->fill(dev, &in->k.fill);
    case MW__I_UNARY:
        in->k.unary.out = ptr(w, in->ref[0]);
        in->k.unary.a = ptr(w, in->ref[1]);
        return vt->unary(dev, &in->k.unary);
    case MW__I_UNARY_GRAD:
        in->k.unary_grad.out = ptr(w, in->ref[0]);
        in->k.unary_grad.gy = ptr(w, in->ref[1]);
        in->k.unary_grad.x = ptr(w, in->ref[2]);
        return vt->unary_grad(dev, &in->k.unary_grad);
    case MW__I_LAYERNORM:
        in->k.layernorm.out = ptr(w, in->ref[0]);
        in->k.layernorm.x = ptr(w, in->ref[1]);
        in->k.layernorm.w = ptr(w, in->ref[2]);
        in->k.layernorm.b = ptr(w, in->ref[3]);
        return vt->layernorm(dev, &in->k.layernorm);
    case MW__I_LN_DX:
    case MW__I_LN_DW:
        in->k.ln_grad.out = ptr(w, in->ref[0]);
        in->k.ln_grad.gy = ptr(w, in->ref[1]);
        in->k.ln_grad.x = ptr(w, in->ref[2]);
        in->k.ln_grad.w = in->kind == MW__I_LN_DX ? ptr(w, in->ref[3]) : NULL;
        return in->kind == MW__I_LN_DX ? vt->layernorm_dx(dev, &in->k.ln_grad)
                                       : vt->layernorm_dw(dev, &in->k.ln_grad);
    case MW__I_SOFTMAX:
        in->k.softmax.out = ptr(w, in->ref[0]);
        in->k.softmax.a = ptr(w, in->ref[1]);
        return vt->softmax(dev, &in->k.softmax);
    case MW__I_SOFTMAX_GRAD:
        in->k.softmax_grad.out = ptr(w, in->ref[0]);
        in->k.softmax_grad.gy = ptr(w, in->ref[1]);
        in->k.softmax_grad.p = ptr(w, in->ref[2]);
        return vt->softmax_grad(dev, &in->k.softmax_grad);
    case MW__I_EMBED:
        in->k.embed.out = ptr(w, in->ref[0]);
        in->k.embed.table = ptr(w, in->ref[1]);
        in->k.embed.ids = ptr(w, in->ref[2]);
        return vt->embed(dev, &in->k.embed);
    case MW__I_EMBED_GRAD:
        in->k.embed_grad.out = ptr(w, in->ref[0]);
        in->k.embed_grad.gy = ptr(w, in->ref[1]);
        in->k.embed_grad.ids = ptr(w, in->ref[2]);
        return vt->embed_grad(dev, &in->k.embed_grad);
    case MW__I_XENT:
        in->k.xent.out = ptr(w, in->ref[0]);
        in->k.xent.logits = ptr(w, in->ref[1]);
        in->k.xent.targets = ptr(w, in->ref[2]);
        return vt->xent(dev, &in->k.xent);
    case MW__I_XENT_GRAD:
        in->k.xent_grad.out = ptr(w, in->ref[0]);
        in->k.xent_grad.gy = ptr(w, in->ref[1]);
        in->k.xent_grad.logits = ptr(w, in->ref[2]);
        in->k.xent_grad.targets = ptr(w, in->ref[3]);
        return vt->xent_grad(dev, &in->k.xent_grad);
    case MW__I_ATTENTION:
        in->k.attention.out = ptr(w, in->ref[0]);
        in->k.attention.qkv = ptr(w, in->ref[1]);
        in->k.attention.scratch = ptr(w, in->ref[2]);
        return vt->attention(dev, &in->k.attention);
    case MW__I_ATTENTION_GRAD:
        in->k.attention.out = ptr(w, in->ref[0]);
        in->k.attention.gy = ptr(w, in->ref[1]);
        in->k.attention.qkv = ptr(w, in->ref[2]);
        in->k.attention.scratch = ptr(w, in->ref[3]);
        return vt->attention_grad(dev, &in->k.attention);
    case MW__I_EXTRA:
        if (!vt->extra)
            return mw__error(MW_ERR_UNSUPPORTED, "%s devices do not implement this op yet",
                             vt->kind);
        in->k.extra.out = ptr(w, in->ref[0]);
        in->k.extra.a = ptr(w, in->ref[1]);
        in->k.extra.b = in->k.extra.op == MW__X_MAP_GRAD ? ptr(w, in->ref[2]) : NULL;
        /* Dropout's mask: a new one every update and every micro-batch of it. */
        in->k.extra.step = (uint64_t)w->tr->steps << 16 | (uint64_t)w->tr->accumulated;
        in->k.extra.active = w->training;
        return vt->extra(dev, &in->k.extra);
    case MW__I_ALLREDUCE:
    case MW__I_GRAD_BUCKET: {
        int gi = group_index(w->tr, in->group);
        if (!w->comm[gi]) return MW_OK; /* a group of one device */
        int64_t t0 = now_ns();
        mw_status st;
        const mw__reducer_vtable *r = w->tr->reducer;
        if (in->kind == MW__I_GRAD_BUCKET && w->tr->zero1) {
            /* ZeRO-1: this device needs only its slice of the bucket summed. Every group of
             * gradients spans the mesh, with rank d on device d (checked when built). */
            const size_t *sl = w->tr->slices;
            size_t at = (size_t)in->ref[0].off, n = (size_t)in->count;
            for (int k = 0; k <= w->tr->nworkers; k++)
                w->bounds[k] = sl[k] <= at ? 0 : sl[k] - at < n ? sl[k] - at : n;
            if ((st = vt->sync(dev)) == MW_OK)
                st = r->reduce_scatter_sum(w->comm[gi], w->rank[gi], ptr(w, in->ref[0]), n,
                                           w->bounds);
        } else if (in->kind == MW__I_GRAD_BUCKET && r->allreduce_start) {
            /* A bucket is reduced while backward continues, where the reducer can: queued
             * behind the kernels that wrote it on a GPU, progressed between instructions across
             * processes; reductions() completes it before the gradients are read. */
            w->inflight |= 1u << gi;
            st =
                r->allreduce_start(w->comm[gi], w->rank[gi], ptr(w, in->ref[0]), (size_t)in->count);
        } else if ((st = vt->sync(dev)) == MW_OK) {
            st = r->allreduce_sum(w->comm[gi], w->rank[gi], ptr(w, in->ref[0]), (size_t)in->count);
        }
        w->reduce_ms += (double)(now_ns() - t0) * 1e-6;
        return st;
    }
    }
    return mw__error(MW_ERR_UNSUPPORTED, "unknown instruction %d", (int)in->kind);
}

/* Copies the box of a host array that view v covers into its staging buffer, one contiguous
 * run at a time. */
static mw_status stage_view(worker *w, const mw__view *v, const char *host, char *dst,
                            int dst_on_host) {
    int r = v->rank;
    /* Innermost run: trailing axes that are whole, plus the first cut one. */
    int inner = r - 1;
    int64_t run = r ? v->len[r - 1] : 1;
    while (inner > 0 && v->len[inner] == v->global[inner]) run *= v->len[--inner];
    if (inner < 0) inner = 0;
    int64_t stride[MW_MAX_RANK], s = 1;
    for (int i = r - 1; i >= 0; i--) {
        stride[i] = s;
        s *= v->global[i];
    }
    int64_t idx[MW_MAX_RANK] = {0};
    size_t bytes = (size_t)run * 4;
    for (int64_t done = 0; done < v->count; done += run) {
        int64_t off = 0;
        for (int i = 0; i < inner; i++) off += (v->lo[i] + idx[i]) * stride[i];
        if (r) off += v->lo[inner] * stride[inner];
        if (dst_on_host) {
            memcpy(dst, host + off * 4, bytes);
        } else {
            mw_status st = w->dev.vt->upload(&w->dev, dst, host + off * 4, bytes);
            if (st) return st;
        }
        dst += bytes;
        for (int i = inner - 1; i >= 0; i--) {
            if (++idx[i] < v->len[i]) break;
            idx[i] = 0;
        }
    }
    return MW_OK;
}

/* Points every input view at this step's data: in place in the host array when the device reads
 * host memory and the shard is contiguous; otherwise staged into the device. A device with
 * page-locked buffers gets each shard packed into one and sent with a single queued copy. */
static mw_status bind_views(worker *w) {
    const mw__device_vtable *vt = w->dev.vt;
    size_t pinned_off = 0;
    for (int v = 0; v < w->plan.nviews; v++) {
        const mw__view *view = &w->plan.views[v];
        const char *host = w->tr->feed_of[view->input]->data;
        if (view->staging.off < 0) {
            w->bases[MW__BASE_VIEW0 + v] = (char *)host + view->host_offset * 4;
            continue;
        }
        char *dst = (char *)w->arena + view->staging.off * 4;
        w->bases[MW__BASE_VIEW0 + v] = dst;
        mw_status st;
        if (vt->host_memory) {
            st = stage_view(w, view, host, dst, 1);
        } else if (w->pinned) {
            char *pack = (char *)w->pinned + pinned_off;
            size_t bytes = (size_t)view->count * 4;
            pinned_off += bytes;
            st = stage_view(w, view, host, pack, 1);
            if (st == MW_OK) st = vt->upload_async(&w->dev, dst, pack, bytes);
        } else {
            st = stage_view(w, view, host, dst, 0);
        }
        if (st) return st;
    }
    return MW_OK;
}

static mw_phase phase_of(const worker *w, int i) {
    mw__ins_kind k = w->plan.ins[i].kind;
    if (i < w->plan.fwd_end)
        return k == MW__I_ALLREDUCE ? MW_PHASE_FORWARD_COLLECTIVE : MW_PHASE_FORWARD;
    return k == MW__I_GRAD_BUCKET ? MW_PHASE_GRAD_REDUCE : MW_PHASE_BACKWARD;
}

/* Enters a phase; fires the injected fault when it is the armed one. */
static mw_status enter(worker *w, mw_phase phase) {
    w->phase = phase;
    if (w->fault_armed && w->fault_phase == phase && w->fault_step == w->tr->steps) {
        w->fault_armed = 0;
        if (w->fault_status != MW_OK) return mw__error(w->fault_status, "injected fault");
        struct timespec ts = {w->fault_ms / 1000, (long)(w->fault_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    return MW_OK;
}

/* Advances (finish: completes) the all-reduces started and not finished. */
static mw_status reductions(worker *w, int finish) {
    const mw__reducer_vtable *r = w->tr->reducer;
    int64_t t0 = now_ns();
    mw_status st = MW_OK;
    for (int gi = 0; w->inflight && gi < w->tr->ngroups && st == MW_OK; gi++) {
        if (!(w->inflight & (1u << gi))) continue;
        if (finish) w->inflight &= ~(1u << gi);
        st = finish ? r->allreduce_finish(w->comm[gi], w->rank[gi])
                    : r->progress(w->comm[gi], w->rank[gi]);
    }
    if (finish) {
        double ms = (double)(now_ns() - t0) * 1e-6;
        w->reduce_ms += ms;
        if (w->prof_cat) /* the wait for overlapped buckets: the backward all-reduce row */
            w->prof_ms[MW__PROF_PER_PHASE + 2 * MW__OP_COUNT] += ms;
    }
    return st;
}

static mw_status run_range(worker *w, int from, int to) {
    for (int i = from; i < to; i++) {
        mw_phase ph = phase_of(w, i);
        mw_status st = ph != w->phase || i == from ? enter(w, ph) : MW_OK;
        if (st) return st;
        /* Profiling: a GPU's kernels are timed by waiting for each. */
        int64_t t0 = w->prof_cat ? now_ns() : 0;
        if ((st = run_ins(w, &w->plan.ins[i])) ||
            (w->prof_cat && !w->dev.vt->host_memory && (st = w->dev.vt->sync(&w->dev))))
            return mw__explain_index_error(w, &w->plan.ins[i], st);
        if (w->prof_cat) {
            w->prof_ms[w->prof_cat[i]] += (double)(now_ns() - t0) * 1e-6;
            w->prof_calls[w->prof_cat[i]]++;
        }
        if (w->inflight && w->tr->reducer->progress && (st = reductions(w, 0))) return st;
    }
    return MW_OK;
}

/* The gradient norm: one partial sum of squares per slice of tr->slices, added in slice order in
 * double. Replicated, every device computes every partial; with ZeRO-1 each device its own
 * slice's (the only one summed over the devices) and the partials are all-gathered. Both give
 * the same bits. */
static mw_status grad_norm(worker *w, float *norm) {
    mw_trainer *tr = w->tr;
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
        if ((st =
                 tr->all_reducer->all_gather(tr->all, w->index, w->partials, (size_t)n, w->bounds)))
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
                         .g = (const float *)w->grads + lo};
        if ((st = vt->adamw(&w->dev, &k))) return st;
    }
    return MW_OK;
}

/* The optimizer step on this device's slice of the parameters (all of them unless ZeRO-1). The
 * slice's gradients are already summed over the devices, so every device computes the same norm
 * and the same update of what it holds; ZeRO-1 then all-gathers the parameters. */
static mw_status update(worker *w) {
    mw_status st = update_slice(w);
    if (st || !w->tr->zero1 || w->skipped) return st;
    if ((st = w->dev.vt->sync(&w->dev))) return st;
    return w->tr->all_reducer->all_gather(w->tr->all, w->index, w->params,
                                          (size_t)w->plan.param_elems, w->tr->slices);
}

static mw_status worker_init(worker *w) {
    const mw__device_vtable *vt = w->dev.vt;
    mw_status st = vt->init(&w->dev);
    if (st) return st;
    mw__plan *p = &w->plan;
    size_t pbytes = (size_t)p->param_elems * 4;
    mw_trainer *from = w->tr->params_from;
    if (from) w->params = from->w[w->index].params; /* shared, not copied */
    if ((st = vt->alloc(&w->dev, (size_t)p->arena_elems * 4, &w->arena)) ||
        (!from && (st = vt->alloc(&w->dev, pbytes, &w->params))) ||
        (!w->tr->forward_only && (st = vt->alloc(&w->dev, pbytes, &w->grads))))
        return st;
    size_t scratch = (size_t)w->tr->nworkers * sizeof(float);
    if ((st = vt->alloc(&w->dev, scratch > 64 ? scratch : 64, (void **)&w->scratch))) return st;
    if (!vt->host_memory && vt->host_alloc && vt->upload_async) {
        size_t staged = 0;
        for (int v = 0; v < p->nviews; v++)
            if (p->views[v].staging.off >= 0) staged += (size_t)p->views[v].count * 4;
        if ((st = vt->host_alloc(&w->dev, staged, &w->pinned))) return st;
    }
    int moments = mw__optimizer_moments(&w->tr->cfg.optimizer);
    if (moments) {
        int64_t elems = moments * (w->own_hi - w->own_lo);
        if ((st = vt->alloc(&w->dev, (size_t)(elems ? elems : 1) * 4, &w->moments))) return st;
        mw__k_fill z = {.value = 0.0f, .count = elems, .out = w->moments};
        if (elems && (st = vt->fill(&w->dev, &z))) return st;
    }
    if (w->tr->cfg.grad_accumulation) {
        int64_t elems = w->own_hi - w->own_lo; /* this device's slice */
        if ((st = vt->alloc(&w->dev, (size_t)(elems ? elems : 1) * 4, &w->accum))) return st;
        mw__k_fill z = {.value = 0.0f, .count = elems, .out = w->accum};
        if (elems && (st = vt->fill(&w->dev, &z))) return st;
    }
    w->bases[MW__BASE_ARENA] = w->arena;
    w->bases[MW__BASE_PARAMS] = w->params;
    w->bases[MW__BASE_GRADS] = w->grads;
    if (!from && (st = vt->upload(&w->dev, w->params, w->tr->init_values, pbytes))) return st;
    /* A parameter the loss does not depend on keeps a zero gradient. */
    mw__k_fill zero = {.value = 0.0f, .count = p->param_elems, .out = w->grads};
    if (w->grads && (st = vt->fill(&w->dev, &zero))) return st;
    return vt->sync(&w->dev);
}

static mw_status worker_run(worker *w, cmd c) {
    mw_status st;
    w->training = c != CMD_EVAL;
    switch (c) {
    case CMD_INIT: return worker_init(w);
    case CMD_EVAL:
        if ((st = bind_views(w)) || (st = run_range(w, 0, w->plan.fwd_end))) return st;
        return w->dev.vt->sync(&w->dev);
    case CMD_GRADS:
    case CMD_STEP:
    case CMD_ACCUM:
        w->skipped = 0;
        w->inflight = 0;
        if ((st = bind_views(w)) || (st = run_range(w, 0, w->plan.bwd_end))) return st;
        if (w->inflight) {
            w->phase = MW_PHASE_GRAD_REDUCE;
            if ((st = reductions(w, 1))) return st;
        }
        if (c == CMD_ACCUM)
            return (st = mw__accumulate_grads(w, 0)) ? st : w->dev.vt->sync(&w->dev);
        if (c == CMD_STEP && w->tr->accumulated && (st = mw__accumulate_grads(w, 1))) return st;
        if (c == CMD_STEP && (w->tr->cfg.check_finite || w->tr->cfg.skip_nonfinite)) {
            /* The loss is replicated: every device sees the same value and stops alike. */
            float loss;
            if ((st = w->dev.vt->download(&w->dev, &loss, ptr(w, w->plan.loss), sizeof loss)))
                return st;
            if (!isfinite(loss) && w->tr->cfg.skip_nonfinite) {
                w->skipped = 1;
                return w->dev.vt->sync(&w->dev);
            }
            if (!isfinite(loss))
                return mw__error(MW_ERR_NONFINITE, "the loss is %g; no parameter was updated",
                                 loss);
        }
        if (c == CMD_STEP) {
            int64_t t0 = now_ns();
            st = enter(w, MW_PHASE_UPDATE);
            /* A data error (bad id or target) a GPU kernel found is reported by the sync, before
             * any parameter changes, also with one device. */
            if (st == MW_OK) st = w->dev.vt->sync(&w->dev);
            /* Nobody updates unless everybody got this far: replicas stay identical when a device
             * fails before its update. */
            if (st == MW_OK && w->tr->all) st = w->tr->all_reducer->barrier(w->tr->all, w->index);
            if (st == MW_OK) st = update(w);
            if (st == MW_OK) st = w->dev.vt->sync(&w->dev);
            w->update_ms = (double)(now_ns() - t0) * 1e-6;
            if (w->prof_cat) {
                w->prof_ms[MW__PROF_UPDATE] += w->update_ms;
                w->prof_calls[MW__PROF_UPDATE]++;
            }
            return st;
        }
        return w->dev.vt->sync(&w->dev);
    case CMD_NONE:
    case CMD_QUIT: break;
    }
    return MW_OK;
}

static void abort_all(mw_trainer *tr) {
    if (tr->all) tr->all_reducer->abort(tr->all);
    for (int gi = 0; gi < tr->ngroups; gi++)
        for (int c = 0; c < tr->groups[gi].ncomms; c++)
            if (tr->groups[gi].comms[c]) tr->reducer->abort(tr->groups[gi].comms[c]);
}

/* Steps usually follow each other within microseconds, and waking a sleeping thread costs tens
 * of them; so a waiter first spins for a few tens of microseconds (parallel/wait.h: less when
 * threads outnumber cores), then sleeps on the condition variable. It spins with a pause, never
 * sched_yield: on a busy machine a yielding thread stays runnable and keeps competing for the
 * core that the thread it waits for needs. Waits until *v64 differs from old, or (v64 NULL) *zero
 * is 0: 1, or 0 when the spin ran out. */
static int spin_until(const mw_trainer *tr, _Atomic uint64_t *v64, uint64_t old,
                      _Atomic int *zero) {
    int64_t start = 0;
    for (unsigned spins = 0;; spins++) {
        if (v64 ? atomic_load_explicit(v64, memory_order_acquire) != old
                : atomic_load_explicit(zero, memory_order_acquire) == 0)
            return 1;
        if (spins % 64 != 63) {
            mw__cpu_relax();
            continue;
        }
        int64_t now = now_ns();
        if (!start) start = now;
        if (now - start > tr->spin_ns) return 0;
    }
}

static void *worker_main(void *arg) {
    worker *w = arg;
    mw_trainer *tr = w->tr;
    uint64_t seen = 0;
    for (;;) {
        if (!spin_until(tr, &tr->generation, seen, NULL)) {
            pthread_mutex_lock(&tr->mu);
            while (atomic_load(&tr->generation) == seen) pthread_cond_wait(&tr->start, &tr->mu);
            pthread_mutex_unlock(&tr->mu);
        }
        seen = atomic_load(&tr->generation);
        cmd c = (cmd)atomic_load(&tr->command);

        w->reduce_ms = w->update_ms = 0.0;
        mw_status st = c == CMD_QUIT ? MW_OK : worker_run(w, c);
        w->status = st;
        if (st) {
            snprintf(w->msg, sizeof w->msg, "%s", mw_last_error());
            abort_all(tr); /* release every peer waiting in a collective */
        }
        if (c == CMD_QUIT) {
            w->dev.vt->free(&w->dev, w->arena);
            if (!tr->params_from) w->dev.vt->free(&w->dev, w->params);
            w->dev.vt->free(&w->dev, w->grads);
            w->dev.vt->free(&w->dev, w->moments);
            w->dev.vt->free(&w->dev, w->accum);
            w->dev.vt->free(&w->dev, w->scratch);
            if (w->pinned) w->dev.vt->host_free(&w->dev, w->pinned);
            w->dev.vt->shutdown(&w->dev);
        }
        if (atomic_fetch_sub(&tr->remaining, 1) == 1) {
            pthread_mutex_lock(&tr->mu); /* a host asleep in done is woken under the lock */
            pthread_cond_signal(&tr->done);
            pthread_mutex_unlock(&tr->mu);
        }
        if (c == CMD_QUIT) return NULL;
    }
}

/* --- host side -------------------------------------------------------------------------------- */

/* Runs one command on every worker and waits; on failure reports the root cause: the first device
 * whose error is not just "aborted because a peer failed". */
static void post(mw_trainer *tr, cmd c, int workers) {
    pthread_mutex_lock(&tr->mu);
    atomic_store(&tr->command, (int)c);
    atomic_store(&tr->remaining, workers);
    atomic_fetch_add(&tr->generation, 1);
    pthread_cond_broadcast(&tr->start);
    pthread_mutex_unlock(&tr->mu);
}

static void wait_done(mw_trainer *tr) {
    /* A short spin: on 2 idle cores with 2 workers it cuts the cost of a step's hand-off from
     * about 25 us (sleep and wake) to a few. */
    if (spin_until(tr, NULL, 0, &tr->remaining)) return;
    pthread_mutex_lock(&tr->mu);
    while (atomic_load(&tr->remaining) > 0) pthread_cond_wait(&tr->done, &tr->mu);
    pthread_mutex_unlock(&tr->mu);
}

static mw_status dispatch(mw_trainer *tr, cmd c) {
    int64_t t0 = now_ns();
    post(tr, c, tr->nlocal);
    wait_done(tr);
    tr->stats = (mw_step_stats){.step_ms = (double)(now_ns() - t0) * 1e-6,
                                .reduce_ms = tr->w[tr->first].reduce_ms,
                                .update_ms = tr->w[tr->first].update_ms};
    worker *cause = NULL;
    for (int i = tr->first; i < tr->first + tr->nlocal; i++) {
        worker *w = &tr->w[i];
        if (w->status &&
            (!cause || (cause->status == MW_ERR_ABORTED && w->status != MW_ERR_ABORTED)))
            cause = w;
    }
    if (!cause) return MW_OK;
    /* A non-finite loss or gradient is seen alike everywhere, after every collective: every
     * process stops at the same point and the trainer stays usable. */
    if (tr->mesh->nprocs > 1 && cause->status != MW_ERR_NONFINITE) tr->broken = 1;
    if (tr->all) tr->all_reducer->reset(tr->all);
    for (int gi = 0; gi < tr->ngroups; gi++)
        for (int k = 0; k < tr->groups[gi].ncomms; k++)
            if (tr->groups[gi].comms[k]) tr->reducer->reset(tr->groups[gi].comms[k]);
    mw_status st = cause->status;
    for (int i = tr->first; i < tr->first + tr->nlocal; i++) tr->w[i].status = MW_OK;
    if (c == CMD_INIT) return mw__error(st, "device %s: %s", cause->dev.name, cause->msg);
    return mw__error(st, "device %s, %s of step %lld: %s", cause->dev.name,
                     mw_phase_name(cause->phase), (long long)tr->steps, cause->msg);
}

static mw_status check_feeds(mw_trainer *tr, const mw_feed *feeds, int nfeeds) {
    mw_graph *g = tr->g;
    if (nfeeds < 0 || (nfeeds > 0 && !feeds))
        return mw__error(MW_ERR_INVALID, "feeds: %d feeds given with a NULL array", nfeeds);
    for (int i = 0; i < g->ninputs; i++) tr->feed_of[i] = NULL;
    for (int f = 0; f < nfeeds; f++) {
        const mw_feed *fd = &feeds[f];
        const mw_tensor *in = NULL;
        for (int i = 0; i < g->nnodes && !in; i++)
            if (g->nodes[i]->op == MW__OP_INPUT && fd->name &&
                strcmp(g->nodes[i]->name, fd->name) == 0)
                in = g->nodes[i];
        if (!in)
            return mw__error(MW_ERR_INVALID, "feed '%s': the graph has no input of that name",
                             fd->name ? fd->name : "(null)");
        if (tr->feed_of[in->leaf])
            return mw__error(MW_ERR_INVALID, "feed '%s' is given twice", fd->name);
        int64_t n = mw__type_numel(&in->type);
        if (fd->count != n) {
            char d[256];
            return mw__error(MW_ERR_INVALID, "feed '%s' has %lld elements but input %s holds %lld",
                             fd->name, (long long)fd->count,
                             mw__type_describe(g, &in->type, d, sizeof d), (long long)n);
        }
        if (!fd->data) return mw__error(MW_ERR_INVALID, "feed '%s': data is NULL", fd->name);
        tr->feed_of[in->leaf] = fd;
    }
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i]->op == MW__OP_INPUT && !tr->feed_of[g->nodes[i]->leaf])
            return mw__error(MW_ERR_INVALID, "input '%s' is not fed", g->nodes[i]->name);
    return MW_OK;
}

static mw_status run_command(mw_trainer *tr, cmd c, const mw_feed *feeds, int nfeeds, float *loss) {
    if (!tr) return mw__error(MW_ERR_INVALID, "trainer is NULL");
    if (tr->broken)
        return mw__error(MW_ERR_STATE,
                         "the trainer spans %d processes and an earlier step failed: its peers "
                         "may still be inside a collective, so it cannot step again (end the job "
                         "with mw_distributed_abort)",
                         tr->mesh->nprocs);
    mw_status st = check_feeds(tr, feeds, nfeeds);
    if (st) return st;
    if ((st = dispatch(tr, c))) return st;
    tr->outputs_ready = 1;
    if (c == CMD_STEP && (st = mw__trainer_after_step(tr))) return st;
    if (loss) {
        worker *w = &tr->w[tr->first];
        return w->dev.vt->download(&w->dev, loss, ptr(w, w->plan.loss), sizeof *loss);
    }
    return MW_OK;
}

float mw_trainer_lr(const mw_trainer *tr, int64_t step) {
    if (!tr) return 0.0f;
    const mw_optimizer *o = &tr->cfg.optimizer;
    if (o->warmup_steps > 0 && step < o->warmup_steps)
        return o->lr * (float)(step + 1) / (float)o->warmup_steps;
    if (o->decay_steps <= 0) return o->lr;
    float min_lr = o->lr * o->min_lr_ratio;
    if (step >= o->decay_steps) return min_lr;
    double ratio = (double)(step - o->warmup_steps) / (double)(o->decay_steps - o->warmup_steps);
    double coeff = 0.5 * (1.0 + cos(3.141592653589793 * ratio));
    return min_lr + (float)coeff * (o->lr - min_lr);
}

float mw_trainer_grad_norm(const mw_trainer *tr) { return tr ? tr->grad_norm : 0.0f; }

mw_status mw_trainer_step(mw_trainer *tr, const mw_feed *feeds, int nfeeds, float *loss) {
    mw_status st = tr && !tr->broken ? mw__trainer_stop_point(tr) : MW_OK;
    if (st) return st;
    if (tr) tr->step_lr = tr->host_lr >= 0.0f ? tr->host_lr : mw_trainer_lr(tr, tr->steps);
    st = run_command(tr, CMD_STEP, feeds, nfeeds, loss);
    if (st == MW_OK) tr->accumulated = 0;
    return st;
}

mw_status mw_trainer_accumulate(mw_trainer *tr, const mw_feed *feeds, int nfeeds, float *loss) {
    if (tr && !tr->cfg.grad_accumulation)
        return mw__error(MW_ERR_STATE, "mw_trainer_accumulate: the trainer was made without "
                                       "mw_trainer_config.grad_accumulation");
    mw_status st = run_command(tr, CMD_ACCUM, feeds, nfeeds, loss);
    if (st == MW_OK) tr->accumulated++;
    return st;
}

mw_status mw_trainer_set_lr(mw_trainer *tr, float lr) {
    if (!tr) return mw__error(MW_ERR_INVALID, "mw_trainer_set_lr: trainer is NULL");
    if (lr == MW_LR_SCHEDULE) {
        tr->host_lr = -1.0f;
        return MW_OK;
    }
    if (!(lr >= 0.0f) || !isfinite(lr))
        return mw__error(MW_ERR_INVALID,
                         "mw_trainer_set_lr: lr is %g; it must be finite and >= 0 (or "
                         "MW_LR_SCHEDULE)",
                         lr);
    tr->host_lr = lr;
    return MW_OK;
}

mw_status mw_trainer_compute_grads(mw_trainer *tr, const mw_feed *feeds, int nfeeds, float *loss) {
    return run_command(tr, CMD_GRADS, feeds, nfeeds, loss);
}

mw_status mw_trainer_eval(mw_trainer *tr, const mw_feed *feeds, int nfeeds, float *loss) {
    return run_command(tr, CMD_EVAL, feeds, nfeeds, loss);
}

static mw_status find_param(mw_trainer *tr, const char *name, int64_t count,
                            const mw__param_slot **out) {
    if (!tr || !name) return mw__error(MW_ERR_INVALID, "trainer or parameter name is NULL");
    for (int i = 0; i < tr->g->nnodes; i++) {
        const mw_tensor *t = tr->g->nodes[i];
        if (t->op != MW__OP_PARAM || strcmp(t->name, name) != 0) continue;
        const mw__param_slot *s = &tr->w[tr->first].plan.params[t->leaf];
        if (s->count != count)
            return mw__error(MW_ERR_SHAPE, "parameter '%s' has %lld elements, not %lld", name,
                             (long long)s->count, (long long)count);
        *out = s;
        return MW_OK;
    }
    return mw__error(MW_ERR_NOT_FOUND, "the graph has no parameter named '%s'", name);
}

static mw_status read_flat(mw_trainer *tr, const char *name, float *dst, int64_t count, int grads) {
    const mw__param_slot *s;
    mw_status st = find_param(tr, name, count, &s);
    if (st) return st;
    if (count && !dst) return mw__error(MW_ERR_INVALID, "destination is NULL");
    worker *w = &tr->w[tr->first];
    const char *base = grads ? w->grads : w->params;
    if (!grads || !tr->zero1)
        return w->dev.vt->download(&w->dev, dst, base + s->off * 4, (size_t)count * 4);
    /* ZeRO-1: each device holds the summed gradients of its own slice only. */
    for (int d = 0; d < tr->nworkers; d++) {
        int64_t lo, hi;
        w = &tr->w[d];
        if (mw__own_part(w, s, &lo, &hi) &&
            (st = w->dev.vt->download(&w->dev, dst + (lo - s->off), (char *)w->grads + lo * 4,
                                      (size_t)(hi - lo) * 4)))
            return st;
    }
    return MW_OK;
}

mw_status mw_trainer_read_param(mw_trainer *tr, const char *name, float *dst, int64_t count) {
    return read_flat(tr, name, dst, count, 0);
}

mw_status mw_trainer_read_grad(mw_trainer *tr, const char *name, float *dst, int64_t count) {
    return read_flat(tr, name, dst, count, 1);
}

mw_status mw_trainer_write_param(mw_trainer *tr, const char *name, const float *src,
                                 int64_t count) {
    const mw__param_slot *s;
    mw_status st = find_param(tr, name, count, &s);
    if (st) return st;
    if (count && !src) return mw__error(MW_ERR_INVALID, "source is NULL");
    for (int i = tr->first; i < tr->first + tr->nlocal; i++) {
        worker *w = &tr->w[i];
        st = w->dev.vt->upload(&w->dev, (char *)w->params + s->off * 4, src, (size_t)count * 4);
        if (st) return st;
    }
    return MW_OK;
}

mw_status mw_trainer_read_output(mw_trainer *tr, const mw_tensor *output, float *dst,
                                 int64_t count) {
    if (!tr || !output || (count && !dst))
        return mw__error(MW_ERR_INVALID, "mw_trainer_read_output: NULL argument");
    int o = 0;
    while (o < tr->cfg.noutputs && tr->user_outputs[o] != output) o++;
    if (o == tr->cfg.noutputs)
        return mw__error(MW_ERR_NOT_FOUND, "mw_trainer_read_output: not an output of the trainer "
                                           "(list it in mw_trainer_config.outputs)");
    if (!tr->outputs_ready)
        return mw__error(MW_ERR_STATE, "mw_trainer_read_output: no step, eval or compute_grads "
                                       "has run yet, so the output has no value");
    const mw__type *t = &tr->outputs[o]->type;
    if (count != mw__type_numel(t))
        return mw__error(MW_ERR_SHAPE,
                         "mw_trainer_read_output: the output has %lld elements, "
                         "not %lld",
                         (long long)mw__type_numel(t), (long long)count);
    int sharded_output = 0;
    for (int i = 0; i < t->rank; i++) sharded_output |= t->ax[i].mesh >= 0;
    if (sharded_output && tr->mesh->nprocs > 1)
        return mw__error(MW_ERR_UNSUPPORTED,
                         "mw_trainer_read_output: a sharded output of a trainer that spans %d "
                         "processes has rows in other processes; reduce it to a replicated "
                         "tensor in the graph",
                         tr->mesh->nprocs);
    /* Each device holds a box of the global array; copy every box's rows into place. */
    for (int d = tr->first; d < tr->first + tr->nlocal; d++) {
        worker *w = &tr->w[d];
        int64_t lo[MW_MAX_RANK], len[MW_MAX_RANK], stride[MW_MAX_RANK], s = 1, local = 1;
        int sharded = 0;
        for (int i = t->rank - 1; i >= 0; i--) {
            const mw__axis *a = &t->ax[i];
            lo[i] = 0;
            len[i] = a->size;
            if (a->mesh >= 0) {
                int ma = tr->mesh_axis_of[a->mesh], c = mw__mesh_coord(tr->mesh, d, ma);
                lo[i] = mw__split_lo(a->size, tr->mesh->axis_size[ma], c);
                len[i] = mw__split_len(a->size, tr->mesh->axis_size[ma], c);
                sharded = 1;
            }
            stride[i] = s;
            s *= a->size;
            local *= len[i];
        }
        if (!sharded && d > tr->first) break; /* replicated: one device has it all */
        const char *src = ptr(w, w->plan.outputs[o]);
        int64_t run = t->rank ? len[t->rank - 1] : 1;
        int64_t idx[MW_MAX_RANK] = {0};
        for (int64_t done = 0; done < local; done += run) {
            int64_t off = 0;
            for (int i = 0; i < t->rank; i++) off += (lo[i] + idx[i]) * stride[i];
            mw_status st = w->dev.vt->download(&w->dev, dst + off, src + done * 4, (size_t)run * 4);
            if (st) return st;
            for (int i = t->rank - 2; i >= 0; i--) {
                if (++idx[i] < len[i]) break;
                idx[i] = 0;
            }
        }
    }
    return MW_OK;
}

const char *mw_phase_name(mw_phase phase) {
    switch (phase) {
    case MW_PHASE_FORWARD: return "forward";
    case MW_PHASE_FORWARD_COLLECTIVE: return "forward collective";
    case MW_PHASE_BACKWARD: return "backward";
    case MW_PHASE_GRAD_REDUCE: return "gradient reduction";
    case MW_PHASE_UPDATE: return "update";
    }
    return "unknown phase";
}

mw_status mw_trainer_inject_fault(mw_trainer *tr, int device, mw_phase phase, int64_t step,
                                  mw_status status) {
    if (!tr || device < 0 || device >= tr->nworkers || status == MW_OK ||
        phase < MW_PHASE_FORWARD || phase > MW_PHASE_UPDATE)
        return mw__error(MW_ERR_INVALID, "mw_trainer_inject_fault: bad device, phase or status");
    if (device < tr->first || device >= tr->first + tr->nlocal)
        return mw__error(MW_ERR_INVALID, "mw_trainer_inject_fault: device %d belongs to process %d",
                         device, tr->mesh->proc_of[device]);
    worker *w = &tr->w[device];
    w->fault_phase = phase;
    w->fault_step = step;
    w->fault_status = status;
    w->fault_armed = 1;
    return MW_OK;
}

mw_status mw_trainer_inject_stall(mw_trainer *tr, int device, mw_phase phase, int64_t step,
                                  int ms) {
    if (!tr || device < 0 || device >= tr->nworkers || ms <= 0 || phase < MW_PHASE_FORWARD ||
        phase > MW_PHASE_UPDATE)
        return mw__error(MW_ERR_INVALID, "mw_trainer_inject_stall: bad device, phase or time");
    if (device < tr->first || device >= tr->first + tr->nlocal)
        return mw__error(MW_ERR_INVALID, "mw_trainer_inject_stall: device %d belongs to process %d",
                         device, tr->mesh->proc_of[device]);
    worker *w = &tr->w[device];
    w->fault_phase = phase;
    w->fault_step = step;
    w->fault_status = MW_OK;
    w->fault_ms = ms;
    w->fault_armed = 1;
    return MW_OK;
}

mw_status mw_trainer_stats(const mw_trainer *tr, mw_step_stats *out) {
    if (!tr || !out) return mw__error(MW_ERR_INVALID, "mw_trainer_stats: NULL argument");
    *out = tr->stats;
    return MW_OK;
}

int64_t mw_trainer_steps(const mw_trainer *tr) { return tr ? tr->steps : 0; }

int mw_trainer_devices(const mw_trainer *tr) { return tr ? tr->nworkers : 0; }

mw_status mw_trainer_memory(const mw_trainer *tr, int device, mw_device_memory *out) {
    if (!tr || !out) return mw__error(MW_ERR_INVALID, "mw_trainer_memory: NULL argument");
    if (device < tr->first || device >= tr->first + tr->nlocal)
        return mw__error(MW_ERR_INVALID,
                         "mw_trainer_memory: device %d is not one of this process's (%d..%d)",
                         device, tr->first, tr->first + tr->nlocal - 1);
    const worker *w = &tr->w[device];
    int64_t p = w->plan.param_elems * 4;
    int moments = mw__optimizer_moments(&tr->cfg.optimizer); /* allocated in every trainer */
    int64_t slice = (w->own_hi - w->own_lo) * 4, accum = tr->cfg.grad_accumulation ? slice : 0;
    *out = (mw_device_memory){.parameters = tr->params_from ? 0 : p,
                              .gradients = tr->forward_only ? 0 : p + accum,
                              .optimizer = moments * slice,
                              .activations = w->plan.arena_elems * 4};
    return MW_OK;
}

int64_t mw_trainer_local_size(const mw_trainer *tr, int device, const char *axis) {
    if (!tr || !axis || device < 0 || device >= tr->nworkers) return -1;
    const mw_graph *g = tr->g;
    int name = mw__graph_find_name(g, axis);
    if (name < 0) return -1;
    int64_t found = -1;
    for (int i = 0; i < g->nnodes; i++) {
        const mw__type *t = &g->nodes[i]->type;
        int j = mw__type_find_name(t, name);
        if (j < 0) continue;
        const mw__axis *a = &t->ax[j];
        if (a->mesh < 0) {
            if (found < 0) found = a->size;
            continue;
        }
        int ma = tr->mesh_axis_of[a->mesh];
        return mw__split_len(a->size, tr->mesh->axis_size[ma],
                             mw__mesh_coord(tr->mesh, device, ma));
    }
    return found;
}

/* --- construction ------------------------------------------------------------------------------
 */

/* After autodiff: every gradient must be a node of its own that nothing else reads, since it is
 * written straight into the flat gradient buffer and reduced there in place. */
static mw_status own_gradients(mw_trainer *tr) {
    mw_graph *g = tr->g;
    int n = g->nnodes;
    int *readers = mw__calloc((size_t)n, sizeof *readers);
    char *claimed = mw__calloc((size_t)n, 1);
    if (!readers || !claimed) {
        mw__free(readers);
        mw__free(claimed);
        return mw__error(MW_ERR_NOMEM, "out of memory preparing gradients");
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < g->nodes[i]->nin; k++) readers[g->nodes[i]->in[k]->id]++;
    for (int p = 0; p < g->nparams && g->status == MW_OK; p++) {
        mw_tensor *gr = tr->grads[p];
        if (!gr) continue;
        mw__op op = gr->op;
        if (gr->id < n &&
            (claimed[gr->id] || readers[gr->id] || gr->id <= tr->loss->id || op == MW__OP_FILL ||
             op == MW__OP_INPUT || op == MW__OP_PARAM || op == MW__OP_SHARD || op == MW__OP_ALIAS))
            tr->grads[p] = mw_scale(g, gr, 1.0f);
        else if (gr->id < n)
            claimed[gr->id] = 1;
    }
    mw__free(readers);
    mw__free(claimed);
    return g->status ? mw__error_copy(g->status, g->error) : MW_OK;
}

/* Resolves the graph's mesh names to mesh axes and checks that every sharded axis can be placed. */
static mw_status place(mw_trainer *tr) {
    const mw_graph *g = tr->g;
    for (int m = 0; m < g->nmesh_names; m++) {
        int a = mw__mesh_axis(tr->mesh, g->mesh_names[m]);
        if (a < 0)
            return mw__error(MW_ERR_SHARDING,
                             "the graph shards over mesh axis '%s', but %s has no such axis",
                             g->mesh_names[m], tr->mesh->desc);
        tr->mesh_axis_of[m] = a;
    }
    for (int i = 0; i < g->nnodes; i++) {
        const mw_tensor *t = g->nodes[i];
        if (t->op != MW__OP_SHARD) continue;
        const mw__axis *a = &t->type.ax[t->shard_axis];
        int parts = tr->mesh->axis_size[tr->mesh_axis_of[a->mesh]];
        if (a->size < parts)
            return mw__error(MW_ERR_SHARDING,
                             "axis %s@%s of input '%s' has %lld rows but mesh axis %s has %d "
                             "devices: every device needs at least one row",
                             g->names[a->name], g->mesh_names[a->mesh], t->in[0]->name,
                             (long long)a->size, g->mesh_names[a->mesh], parts);
    }
    return MW_OK;
}

/* Makes the communicators of every group mask the plans use. */
static mw_status make_groups(mw_trainer *tr) {
    mw_mesh *mesh = tr->mesh;
    int distributed = mesh->nprocs > 1;
    if (mesh->ndevices > 1) {
        mw__device *devs[MW_MAX_DEVICES];
        for (int d = 0; d < mesh->ndevices; d++) devs[d] = local(tr, d) ? &tr->w[d].dev : NULL;
        mw__comm_options opt = {.timeout_ms = tr->cfg.collective_timeout_ms,
                                .proc_of = distributed ? mesh->proc_of : NULL,
                                .self_proc = mesh->proc};
        /* A host barrier: the shared-memory reducer serves it for every kind of device (across
         * processes, the hierarchical one, which never touches device memory for a barrier). */
        mw_status st = tr->all_reducer->comm_new(mesh->ndevices, devs, &opt, &tr->all);
        if (st) return st;
    }
    const mw__plan *p = &tr->w[tr->first].plan;
    for (int i = 0; i < p->nins; i++) {
        const mw__ins *in = &p->ins[i];
        if ((in->kind != MW__I_ALLREDUCE && in->kind != MW__I_GRAD_BUCKET) ||
            group_index(tr, in->group) >= 0)
            continue;
        if (tr->ngroups == MAX_GROUPS)
            return mw__error(MW_ERR_UNSUPPORTED, "more than %d reduction groups", MAX_GROUPS);
        tr->groups[tr->ngroups++] = (group){.mask = in->group};
    }
    for (int gi = 0; gi < tr->ngroups; gi++) {
        group *gr = &tr->groups[gi];
        int in_group[MW_MAX_MESH_AXES] = {0}, members = 1;
        for (int m = 0; m < tr->g->nmesh_names; m++)
            if (gr->mask & (1u << m)) in_group[tr->mesh_axis_of[m]] = 1;
        for (int a = 0; a < mesh->naxes; a++)
            if (in_group[a]) members *= mesh->axis_size[a];
        if (members == 1) continue; /* nothing to reduce: worker comm stays NULL */
        int ncomms = mesh->ndevices / members;
        gr->comms = mw__calloc((size_t)ncomms, sizeof *gr->comms);
        if (!gr->comms) return mw__error(MW_ERR_NOMEM, "out of memory making communicators");
        gr->ncomms = ncomms;
        /* Class of a device: its coordinates off the group's axes; rank: on them. */
        int assigned = 0;
        for (int c = 0; c < gr->ncomms; c++) {
            mw__device *devs[MW_MAX_DEVICES];
            int proc_of[MW_MAX_DEVICES];
            int n = 0, cls = -1;
            for (int d = 0; d < mesh->ndevices; d++) {
                int k = 0, r = 0;
                for (int a = 0; a < mesh->naxes; a++) {
                    int x = mw__mesh_coord(mesh, d, a);
                    if (in_group[a])
                        r = r * mesh->axis_size[a] + x;
                    else
                        k = k * mesh->axis_size[a] + x;
                }
                if (k != c) continue;
                (void)cls;
                tr->w[d].rank[gi] = r;
                devs[r] = local(tr, d) ? &tr->w[d].dev : NULL;
                proc_of[r] = mesh->proc_of[d];
                n++;
            }
            mw__comm_options opt = {.timeout_ms = tr->cfg.collective_timeout_ms,
                                    .proc_of = distributed ? proc_of : NULL,
                                    .self_proc = mesh->proc};
            mw_status st = tr->reducer->comm_new(n, devs, &opt, &gr->comms[c]);
            if (st) return st;
            for (int d = 0; d < mesh->ndevices; d++) {
                int k = 0;
                for (int a = 0; a < mesh->naxes; a++)
                    if (!in_group[a]) k = k * mesh->axis_size[a] + mw__mesh_coord(mesh, d, a);
                if (k == c) tr->w[d].comm[gi] = gr->comms[c];
            }
            assigned += n;
        }
        if (assigned != mesh->ndevices)
            return mw__error(MW_ERR_STATE, "internal: reduction groups do not cover the mesh");
    }
    return MW_OK;
}

mw_status mw__zero1_collectives(const mw__reducer_vtable *reducer,
                                const mw__reducer_vtable *all_reducer, const char *mesh) {
    const mw__reducer_vtable *lacking = !reducer->reduce_scatter_sum || !reducer->all_gather
                                            ? reducer
                                        : !all_reducer->all_gather ? all_reducer
                                                                   : NULL;
    if (!lacking) return MW_OK;
    return mw__error(MW_ERR_UNSUPPORTED,
                     "mw_trainer_new: shard_optimizer needs reduce-scatter and all-gather, which "
                     "the %s reducer of %s lacks",
                     lacking->name, mesh);
}

/* Cuts the flat parameters into one slice per device (tr->slices) and, with shard_optimizer on
 * several devices, turns ZeRO-1 on once the reducers and gradient groups allow it. */
static mw_status plan_slices(mw_trainer *tr) {
    int n = tr->nworkers;
    const mw__plan *p = &tr->w[tr->first].plan;
    tr->slices = mw__malloc((size_t)(n + 1) * sizeof *tr->slices);
    if (!tr->slices) return mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
    for (int r = 0; r <= n; r++) tr->slices[r] = mw__slice_lo((size_t)p->param_elems, n, r);
    tr->zero1 = tr->cfg.shard_optimizer && !tr->forward_only && n > 1;
    mw_status st =
        tr->zero1 ? mw__zero1_collectives(tr->reducer, tr->all_reducer, tr->mesh->desc) : MW_OK;
    if (st) return st;
    for (int i = 0; tr->zero1 && i < p->nins; i++) {
        if (p->ins[i].kind != MW__I_GRAD_BUCKET) continue;
        int gi = group_index(tr, p->ins[i].group), ok = tr->groups[gi].ncomms <= 1;
        for (int d = 0; ok && tr->groups[gi].ncomms == 1 && d < n; d++) ok = tr->w[d].rank[gi] == d;
        if (!ok)
            return mw__error(MW_ERR_UNSUPPORTED,
                             "mw_trainer_new: shard_optimizer needs every gradient summed over "
                             "all %d devices of %s, but some are summed over groups of %d (the "
                             "batch is not sharded over every mesh axis)",
                             n, tr->mesh->desc, n / tr->groups[gi].ncomms);
    }
    for (int d = tr->first; d < tr->first + tr->nlocal; d++) {
        worker *w = &tr->w[d];
        w->own_lo = tr->zero1 ? (int64_t)tr->slices[d] : 0;
        w->own_hi = tr->zero1 ? (int64_t)tr->slices[d + 1] : p->param_elems;
        w->partials = mw__malloc((size_t)n * sizeof *w->partials);
        w->bounds = mw__malloc((size_t)(n + 1) * sizeof *w->bounds);
        if (!w->partials || !w->bounds)
            return mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
    }
    return MW_OK;
}

static mw_status start_workers(mw_trainer *tr) {
    for (int i = tr->first; i < tr->first + tr->nlocal; i++) {
        if (pthread_create(&tr->w[i].thread, NULL, worker_main, &tr->w[i]) != 0)
            return mw__error(MW_ERR_DEVICE, "could not start the worker thread of %s",
                             tr->w[i].dev.name);
        tr->w[i].started = 1;
    }
    return MW_OK;
}

static void free_comms(mw_trainer *tr) {
    if (tr->all) tr->all_reducer->comm_free(tr->all);
    tr->all = NULL;
    for (int gi = 0; gi < tr->ngroups; gi++)
        for (int c = 0; c < tr->groups[gi].ncomms; c++) {
            if (tr->groups[gi].comms[c]) tr->reducer->comm_free(tr->groups[gi].comms[c]);
            tr->groups[gi].comms[c] = NULL;
        }
    for (int i = 0; tr->w && i < tr->nworkers; i++) memset(tr->w[i].comm, 0, sizeof tr->w[i].comm);
}

void mw_trainer_free(mw_trainer *tr) {
    if (!tr) return;
    int running = 0;
    for (int i = 0; tr->w && i < tr->nworkers; i++) running += tr->w[i].started;
    /* The communicators go first (no worker is inside a collective now): freeing one aborts what
     * a failed step left queued on a GPU, which would otherwise block the workers' final frees
     * and stream waits forever. */
    free_comms(tr);
    if (running) {
        post(tr, CMD_QUIT, running);
        wait_done(tr);
        for (int i = 0; i < tr->nworkers; i++)
            if (tr->w[i].started) pthread_join(tr->w[i].thread, NULL);
    }
    if (tr->sync_ready) {
        pthread_mutex_destroy(&tr->mu);
        pthread_cond_destroy(&tr->start);
        pthread_cond_destroy(&tr->done);
    }
    for (int gi = 0; gi < tr->ngroups; gi++) mw__free(tr->groups[gi].comms);
    if (tr->w)
        for (int i = 0; i < tr->nworkers; i++) {
            mw__plan_free(&tr->w[i].plan);
            mw__profile_free(&tr->w[i]);
            mw__free(tr->w[i].bases);
            mw__free(tr->w[i].partials);
            mw__free(tr->w[i].bounds);
        }
    if (tr->blas_prev > 0) tr->set_threads(tr->blas_prev);
    mw__free(tr->w);
    mw__free(tr->feed_of);
    mw__free(tr->grads);
    mw__free(tr->outputs);
    mw__free(tr->user_outputs);
    mw__free(tr->init_values);
    mw__trainer_consistency_free(tr);
    mw__free(tr->decays);
    mw__free(tr->slices);
    mw_graph_free(tr->g);
    mw__free(tr);
}

static mw_status init_values(mw_trainer *tr) {
    const mw__plan *p = &tr->w[tr->first].plan;
    tr->init_values = mw__malloc((size_t)(p->param_elems ? p->param_elems : 1) * sizeof(float));
    if (!tr->init_values) return mw__error(MW_ERR_NOMEM, "out of memory initialising parameters");
    for (int i = 0; i < tr->g->nnodes; i++) {
        const mw_tensor *t = tr->g->nodes[i];
        if (t->op == MW__OP_PARAM)
            mw__param_init(tr->g, t, tr->init_values + p->params[t->leaf].off);
    }
    return MW_OK;
}

static mw_status trainer_build(mw_trainer *tr, mw_graph *graph, mw_tensor *loss) {
    mw_status st = mw__graph_clone(graph, &tr->g);
    if (st) return st;
    mw_graph *g = tr->g;
    if ((st = mw__optimizer_decays(tr))) return st;
    tr->loss = mw__replicated(g, g->nodes[loss->id]);
    tr->grads = mw__calloc((size_t)g->nparams + 1, sizeof *tr->grads);
    tr->feed_of = mw__calloc((size_t)g->ninputs + 1, sizeof *tr->feed_of);
    if (!tr->loss || !tr->grads || !tr->feed_of)
        return g->status ? mw__error_copy(g->status, g->error)
                         : mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
    int no = tr->cfg.noutputs;
    tr->outputs = mw__calloc((size_t)no + 1, sizeof *tr->outputs);
    tr->user_outputs = mw__calloc((size_t)no + 1, sizeof *tr->user_outputs);
    if (!tr->outputs || !tr->user_outputs)
        return mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
    for (int o = 0; o < no; o++) {
        const mw_tensor *u = tr->cfg.outputs ? tr->cfg.outputs[o] : NULL;
        if (!u || u->g != graph)
            return mw__error(MW_ERR_INVALID,
                             "mw_trainer_new: output %d is NULL or from another "
                             "graph",
                             o);
        tr->user_outputs[o] = u;
        tr->outputs[o] = mw__replicated(g, g->nodes[u->id]);
        if (!tr->outputs[o]) return mw__error_copy(g->status, g->error);
    }
    if (tr->forward_only) tr->loss = tr->outputs[0];
    tr->cfg.outputs = NULL; /* borrowed only during construction */
    if ((!tr->forward_only &&
         ((st = mw__autodiff(g, tr->loss, tr->grads)) || (st = own_gradients(tr)))) ||
        (st = place(tr)))
        return st;

    mw_mesh *mesh = tr->mesh;
    tr->nworkers = mesh->ndevices;
    tr->first = mesh->local_first;
    tr->nlocal = mesh->local_count;
    tr->spin_ns = mw__spin_ns(tr->nlocal + 1); /* the workers and the host */
    tr->w = mw__calloc((size_t)tr->nworkers, sizeof *tr->w);
    if (!tr->w) return mw__error(MW_ERR_NOMEM, "out of memory making workers");
    size_t bucket = tr->cfg.bucket_bytes ? tr->cfg.bucket_bytes : (size_t)1 << 20;
    /* Across processes, the launcher binds processes to cores (mpirun --bind-to). */
    int cores_ok = tr->cfg.pin_threads > 0 && mesh->nprocs == 1;
    for (int d = 0; d < tr->nworkers; d++) {
        worker *w = &tr->w[d];
        w->tr = tr;
        w->index = d;
        if (!local(tr, d)) continue; /* another process's device */
        w->dev = (mw__device){.vt = mesh->vt,
                              .index = d,
                              .ordinal = mesh->ordinal[d],
                              .pin = cores_ok ? mesh->ndevices : 0};
        snprintf(w->dev.name, sizeof w->dev.name, "%s", mesh->device_name[d]);
        mw__placement pl = {.nmesh = g->nmesh_names};
        for (int m = 0; m < g->nmesh_names; m++) {
            int a = tr->mesh_axis_of[m];
            pl.size[m] = mesh->axis_size[a];
            pl.coord[m] = mw__mesh_coord(mesh, d, a);
        }
        if ((st = mw__plan_build(g, tr->loss, tr->grads, tr->outputs, tr->cfg.noutputs, &pl,
                                 mesh->vt->host_memory, (int64_t)(bucket / 4), &w->plan)))
            return st;
        if ((st = mw__backend_check_plan(mesh->backend, g, &w->plan, w->dev.name))) return st;
        if (tr->cfg.profile && (st = mw__profile_init(w, g))) return st;
        w->bases = mw__calloc((size_t)(MW__BASE_VIEW0 + w->plan.nviews), sizeof *w->bases);
        if (!w->bases) return mw__error(MW_ERR_NOMEM, "out of memory making workers");
        if (tr->params_from && (st = mw__share_params(tr, w))) return st;
    }
    if ((st = make_groups(tr)) || (st = plan_slices(tr)) || (st = init_values(tr)) ||
        (st = mw__trainer_prepare(tr)))
        return st;

    if ((tr->set_threads = mesh->backend->set_threads) && tr->cfg.blas_threads >= 0)
        tr->blas_prev = tr->set_threads(tr->cfg.blas_threads ? tr->cfg.blas_threads : 1);
    if (pthread_mutex_init(&tr->mu, NULL) || pthread_cond_init(&tr->start, NULL) ||
        pthread_cond_init(&tr->done, NULL))
        return mw__error(MW_ERR_NOMEM, "could not make the trainer's synchronisation objects");
    tr->sync_ready = 1;
    if ((st = start_workers(tr)) || (st = dispatch(tr, CMD_INIT))) return st;
    mw__free(tr->init_values);
    tr->init_values = NULL;
    return MW_OK;
}

static mw_status trainer_new(mw_graph *graph, mw_tensor *loss, mw_mesh *mesh,
                             const mw_trainer_config *config, int forward_only,
                             mw_trainer *params_from, mw_trainer **out);

mw_status mw_trainer_new(mw_graph *graph, mw_tensor *loss, mw_mesh *mesh,
                         const mw_trainer_config *config, mw_trainer **out) {
    return trainer_new(graph, loss, mesh, config, 0, NULL, out);
}

mw_status mw__trainer_new_forward(mw_graph *graph, mw_mesh *mesh, const mw_trainer_config *config,
                                  mw_trainer *params_from, mw_trainer **out) {
    if (!config || config->noutputs < 1 || !config->outputs)
        return mw__error(MW_ERR_INVALID, "an inference program needs at least one output");
    return trainer_new(graph, config->outputs[0], mesh, config, 1, params_from, out);
}

/* A trainer, or a forward-only one whose "loss" is its first output. */
static mw_status trainer_new(mw_graph *graph, mw_tensor *loss, mw_mesh *mesh,
                             const mw_trainer_config *config, int forward_only,
                             mw_trainer *params_from, mw_trainer **out) {
    if (!out) return mw__error(MW_ERR_INVALID, "mw_trainer_new: out is NULL");
    *out = NULL;
    if (!graph || !mesh) return mw__error(MW_ERR_INVALID, "mw_trainer_new: graph or mesh is NULL");
    if (graph->status) return mw__error_copy(graph->status, graph->error);
    if (!loss || loss->g != graph)
        return mw__error(MW_ERR_INVALID, "mw_trainer_new: the loss is NULL or from another graph");
    if (!forward_only && (loss->type.rank != 0 || loss->type.dtype != MW_F32)) {
        char d[256];
        return mw__error(MW_ERR_SHAPE, "mw_trainer_new: the loss must be an f32 scalar, not %s",
                         mw__type_describe(graph, &loss->type, d, sizeof d));
    }
    mw_trainer *tr = mw__calloc(1, sizeof *tr);
    if (!tr) return mw__error(MW_ERR_NOMEM, "mw_trainer_new: out of memory");
    tr->mesh = mesh;
    tr->forward_only = forward_only;
    tr->params_from = params_from;
    tr->reducer =
        mw__reducer_for_procs(mesh->vt->kind, mesh->ndevices, mesh->ordinal, mesh->nprocs);
    tr->all_reducer = mw__cpu_backend.reducer(1, NULL, mesh->nprocs); /* host-memory barriers */
    if (!tr->reducer) {
        mw__free(tr);
        return mw__error(MW_ERR_UNSUPPORTED, "mw_trainer_new: no reducer for %s", mesh->desc);
    }
    tr->cfg = config ? *config : (mw_trainer_config){.optimizer = {MW_SGD, 0.01f}};
    tr->host_lr = -1.0f;
    const mw_optimizer *o = &tr->cfg.optimizer;
    mw_status st = mw__optimizer_resolve(&tr->cfg.optimizer);
    if (st == MW_OK && o->kind == MW_SGD && (o->momentum > 0.0f || o->weight_decay > 0.0f) &&
        !mesh->vt->sgd_momentum)
        st = mw__error(MW_ERR_UNSUPPORTED,
                       "mw_trainer_new: SGD with momentum or weight decay is not implemented on "
                       "%s devices",
                       mesh->vt->kind);
    if (st) {
        mw__free(tr);
        return st;
    }
    st = mw__trainer_agree(tr, graph, loss);
    if (st == MW_OK) st = trainer_build(tr, graph, loss);
    if (st) {
        char msg[MW__MSG_SIZE];
        snprintf(msg, sizeof msg, "%s", mw_last_error());
        mw_trainer_free(tr);
        return mw__error_copy(st, msg);
    }
    *out = tr;
    return MW_OK;
}
