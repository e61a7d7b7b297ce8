/* Running a compiled plan on one worker: the instructions (kernels and collectives), the input
 * views bound to each step's data, and the gradient buckets reduced while backward runs. */
#include <string.h>
#include <time.h>

#include "collectives/reducer.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/plan.h"
#include "meshwit.h"
#include "parallel/data_errors.h"
#include "parallel/program.h"

int mw__group_index(const mw__program *p, uint32_t mask) {
    for (int i = 0; i < p->ngroups; i++)
        if (p->groups[i].mask == mask) return i;
    return -1;
}

/* The address of operand r on worker w's device; NULL for an operand the kernel goes without. */
static void *operand(worker *w, mw__ref r) { return r.off < 0 ? NULL : mw__ptr(w, r); }

/* Points kernel k of instruction in at worker w's buffers: each role of its row of the instruction
 * table at the descriptor's field of that name (collectives have no kernel). */
static void resolve(worker *w, const mw__ins *in, union mw__kernel *k) {
    switch (in->kind) {
#define RESOLVE_ROLE(name, role) k->name.role = operand(w, in->ref.name.role);
#define RESOLVE(KIND, name, type, dtypes, ROLES)                                                   \
    case MW__I_##KIND: ROLES(RESOLVE_ROLE, name) break;
        MW__KERNELS(RESOLVE)
#undef RESOLVE
#undef RESOLVE_ROLE
    case MW__I_ALLREDUCE:
    case MW__I_GRAD_BUCKET:
    case MW__I_ALLGATHER:
    case MW__I_REDUCE_SCATTER:
    case MW__I_GATHER_START:
    case MW__I_GATHER_WAIT:
    case MW__I_COUNT: break;
    }
}

/* FSDP's collectives: the device at coordinate r along the group's axis owns rows split_lo(r) ..
 * split_lo(r + 1) of the buffer; bounds (in->parts + 1) gets their offsets in elements. */
static void row_parts(const mw__ins *in, size_t *bounds) {
    for (int r = 0; r <= in->parts; r++)
        bounds[r] = (size_t)(mw__split_lo(in->rows, in->parts, r) * in->row_elems);
}

/* Runs instruction in with its resolved kernel k. */
static mw_status run_ins(worker *w, const mw__ins *in, union mw__kernel *k) {
    const mw__device_vtable *vt = w->dev.vt;
    mw__device *dev = &w->dev;
    if (in->kind == MW__I_DROPOUT) {
        /* Dropout's mask: a new one every update and every micro-batch of it. */
        k->dropout.step = (uint64_t)w->prog->steps << 16 | (uint64_t)w->prog->micro;
        k->dropout.active = w->training;
    }
    switch (in->kind) {
#define RUN(KIND, name, type, dtypes, ROLES)                                                       \
    case MW__I_##KIND:                                                                             \
        if (!vt->name)                                                                             \
            return mw__error(MW_ERR_UNSUPPORTED, "%s devices do not implement " #name " yet",      \
                             vt->kind);                                                            \
        return vt->name(dev, &k->name);
        MW__KERNELS(RUN)
#undef RUN
    case MW__I_COUNT: break;
    case MW__I_GATHER_START: {
        /* Prefetch: with no wait for the device (a reducer of device memory queues the gather
         * behind the kernels that wrote the rows, as it queues a bucket's sum); completed by the
         * GATHER_WAIT where the parameter is used. */
        int gi = mw__group_index(w->prog, in->group);
        if (!w->comm[gi]) return MW_OK;
        row_parts(in, w->gather_bounds);
        int64_t t0 = mw__now_ns();
        w->inflight |= 1u << gi;
        mw_status st = w->prog->reducer->all_gather_start(
            w->comm[gi], w->rank[gi], mw__ptr(w, in->ref.collective.buf), (size_t)in->count, MW_F32,
            w->gather_bounds);
        w->reduce_ms += (double)(mw__now_ns() - t0) * 1e-6;
        return st;
    }
    case MW__I_GATHER_WAIT: {
        int gi = mw__group_index(w->prog, in->group);
        if (!w->comm[gi] || !(w->inflight & (1u << gi))) return MW_OK;
        int64_t t0 = mw__now_ns();
        w->inflight &= ~(1u << gi);
        mw_status st = w->prog->reducer->finish(w->comm[gi], w->rank[gi]);
        w->reduce_ms += (double)(mw__now_ns() - t0) * 1e-6;
        return st;
    }
    case MW__I_ALLGATHER:
    case MW__I_REDUCE_SCATTER: {
        int gi = mw__group_index(w->prog, in->group);
        if (!w->comm[gi]) return MW_OK; /* a group of one device */
        size_t bounds[MW_MAX_DEVICES + 1];
        row_parts(in, bounds);
        int64_t t0 = mw__now_ns();
        const mw__reducer_vtable *r = w->prog->reducer;
        void *buf = mw__ptr(w, in->ref.collective.buf);
        mw_status st = vt->sync(dev);
        if (st == MW_OK)
            st = in->kind == MW__I_ALLGATHER
                     ? r->all_gather(w->comm[gi], w->rank[gi], buf, (size_t)in->count, MW_F32,
                                     bounds)
                     : r->reduce_scatter_sum(w->comm[gi], w->rank[gi], buf, (size_t)in->count,
                                             MW_F32, bounds);
        w->reduce_ms += (double)(mw__now_ns() - t0) * 1e-6;
        return st;
    }
    case MW__I_ALLREDUCE:
    case MW__I_GRAD_BUCKET: {
        int gi = mw__group_index(w->prog, in->group);
        if (!w->comm[gi]) return MW_OK; /* a group of one device */
        int64_t t0 = mw__now_ns();
        mw_status st;
        const mw__reducer_vtable *r = w->prog->reducer;
        if (in->kind == MW__I_GRAD_BUCKET && w->prog->zero1) {
            /* ZeRO-1: this device needs only its slice of the bucket summed: the slices of the
             * devices that sum gradients together (all of the mesh, rank d on device d; with
             * split parameters the data group, its rank within it; checked when built). */
            const size_t *sl = w->zslices;
            size_t at = (size_t)in->ref.collective.buf.off / 4, n = (size_t)in->count; /* floats */
            for (int k = 0; k <= w->zparts; k++)
                w->bounds[k] = sl[k] <= at ? 0 : sl[k] - at < n ? sl[k] - at : n;
            if ((st = vt->sync(dev)) == MW_OK)
                st =
                    r->reduce_scatter_sum(w->comm[gi], w->rank[gi],
                                          mw__ptr(w, in->ref.collective.buf), n, MW_F32, w->bounds);
        } else if (in->kind == MW__I_GRAD_BUCKET && r->allreduce_start) {
            /* A bucket is reduced while backward continues, where the reducer can: queued
             * behind the kernels that wrote it on a GPU, progressed between instructions across
             * processes; mw__reductions() completes it before the gradients are read. */
            w->inflight |= 1u << gi;
            st = r->allreduce_start(w->comm[gi], w->rank[gi], mw__ptr(w, in->ref.collective.buf),
                                    (size_t)in->count, MW_F32);
        } else if ((st = vt->sync(dev)) == MW_OK) {
            st = r->allreduce_sum(w->comm[gi], w->rank[gi], mw__ptr(w, in->ref.collective.buf),
                                  (size_t)in->count, MW_F32);
        }
        w->reduce_ms += (double)(mw__now_ns() - t0) * 1e-6;
        return st;
    }
    }
    return mw__error(MW_ERR_UNSUPPORTED, "unknown instruction %d", (int)in->kind);
}

mw_status mw__executor_init(worker *w) {
    const mw__plan *p = &w->plan;
    w->kern = mw__malloc((size_t)(p->nins ? p->nins : 1) * sizeof *w->kern);
    w->rebind = mw__malloc((size_t)(p->nins ? p->nins : 1) * sizeof *w->rebind);
    if (!w->kern || !w->rebind)
        return mw__error(MW_ERR_NOMEM, "out of memory making the kernels of device %s",
                         w->dev.name);
    /* Inputs read in place are bound every step; until then at a placeholder, so that every
     * kernel is resolved here (a GEMM's preparation sees which operands it has). */
    static char placeholder[64];
    for (int v = 0; v < p->nviews; v++)
        w->bases[MW__BASE_VIEW0 + v] =
            p->views[v].staging.off >= 0 ? (char *)w->arena + p->views[v].staging.off : placeholder;
    w->nrebind = 0;
    for (int i = 0; i < p->nins; i++) {
        const mw__ins *in = &p->ins[i];
        int in_place = 0;
        for (int r = 0; r < mw__ins_roles(in->kind); r++) {
            int v = in->ref.all[r].base - MW__BASE_VIEW0;
            in_place |= v >= 0 && p->views[v].staging.off < 0;
        }
        w->kern[i] = in->k;
        resolve(w, in, &w->kern[i]);
        if (in_place) w->rebind[w->nrebind++] = i; /* resolved again by mw__bind_views */
        /* What depends only on the GEMM's shape is made now, not in a step. */
        mw_status st;
        if (in->kind == MW__I_GEMM && w->dev.vt->gemm_prepare &&
            (st = w->dev.vt->gemm_prepare(&w->dev, &w->kern[i].gemm)))
            return st;
        int attention = in->kind == MW__I_ATTENTION || in->kind == MW__I_ATTENTION_GRAD;
        if (attention && w->dev.vt->attention_prepare &&
            (st = w->dev.vt->attention_prepare(
                 &w->dev,
                 in->kind == MW__I_ATTENTION ? &w->kern[i].attention : &w->kern[i].attention_grad,
                 in->kind == MW__I_ATTENTION_GRAD)))
            return st;
    }
    return MW_OK;
}

void mw__executor_select_slot(worker *w) {
    mw__program *prog = w->prog;
    if (prog->slots <= 1 || !w->slot_arena) return;
    void *a = w->slot_arena[prog->slot];
    if (a == w->arena) return;
    w->arena = w->bases[MW__BASE_ARENA] = a;
    /* Every operand in the arena moves; the kernels' other fields (what gemm_prepare made from
     * the shapes) stay. Views staged in the arena are rebound by mw__bind_views. */
    for (int i = 0; i < w->plan.nins; i++) resolve(w, &w->plan.ins[i], &w->kern[i]);
}

/* Copies the box of a host array that view v covers into its staging buffer, one contiguous
 * run at a time. */
static mw_status stage_view(worker *w, const mw__view *v, const char *host, char *dst,
                            int dst_on_host) {
    int64_t esize = mw__dtype_bytes(v->dtype);
    for (int64_t e = 0, at, run; e < v->count; e += run) {
        run = mw__box_run(&v->box, e, v->count, &at);
        size_t bytes = (size_t)(run * esize);
        if (dst_on_host) {
            memcpy(dst, host + at * esize, bytes);
        } else {
            mw_status st = w->dev.vt->upload(&w->dev, dst, host + at * esize, bytes);
            if (st) return st;
        }
        dst += bytes;
    }
    return MW_OK;
}

/* Points every input view at this step's data: in place in the host array when the device reads
 * host memory and the shard is contiguous; otherwise staged into the device. A device with
 * page-locked buffers gets each shard packed into one and sent with a single queued copy. */
mw_status mw__bind_views(worker *w) {
    const mw__device_vtable *vt = w->dev.vt;
    const mw__plan *p = &w->plan;
    size_t pinned_off = 0;
    for (int v = 0; v < p->nviews; v++) {
        const mw__view *view = &p->views[v];
        const char *host = w->prog->feed_of[view->input]->data;
        if (view->staging.off < 0) {
            w->bases[MW__BASE_VIEW0 + v] =
                (char *)host + view->host_offset * mw__dtype_bytes(view->dtype);
            continue;
        }
        char *dst = (char *)w->arena + view->staging.off;
        w->bases[MW__BASE_VIEW0 + v] = dst;
        mw_status st;
        if (vt->host_memory) {
            st = stage_view(w, view, host, dst, 1);
        } else if (w->pinned) {
            char *pack = (char *)w->pinned + pinned_off;
            size_t bytes = (size_t)(view->count * mw__dtype_bytes(view->dtype));
            pinned_off += bytes;
            st = stage_view(w, view, host, pack, 1);
            if (st == MW_OK) st = vt->upload_async(&w->dev, dst, pack, bytes);
        } else {
            st = stage_view(w, view, host, dst, 0);
        }
        if (st) return st;
    }
    for (int j = 0; j < w->nrebind; j++) resolve(w, &p->ins[w->rebind[j]], &w->kern[w->rebind[j]]);
    return MW_OK;
}

static mw_phase phase_of(const worker *w, int i) {
    mw__ins_kind k = w->plan.ins[i].kind;
    if (i < w->plan.fwd_end)
        return k == MW__I_ALLREDUCE || k == MW__I_ALLGATHER || k == MW__I_GATHER_START ||
                       k == MW__I_GATHER_WAIT
                   ? MW_PHASE_FORWARD_COLLECTIVE
                   : MW_PHASE_FORWARD;
    return k == MW__I_GRAD_BUCKET || k == MW__I_REDUCE_SCATTER ? MW_PHASE_GRAD_REDUCE
                                                               : MW_PHASE_BACKWARD;
}

/* Enters a phase; fires the injected fault when it is the armed one. */
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

mw_status mw__enter(worker *w, mw_phase phase) {
    w->phase = phase;
    if (w->fault_armed && w->fault_phase == phase && w->fault_step == w->prog->steps) {
        w->fault_armed = 0;
        if (w->fault_status != MW_OK) return mw__error(w->fault_status, "injected fault");
        struct timespec ts = {w->fault_ms / 1000, (long)(w->fault_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    return MW_OK;
}

/* Advances (finish: completes) the all-reduces started and not finished. */
mw_status mw__reductions(worker *w, int finish) {
    const mw__reducer_vtable *r = w->prog->reducer;
    int64_t t0 = mw__now_ns();
    mw_status st = MW_OK;
    for (int gi = 0; w->inflight && gi < w->prog->ngroups && st == MW_OK; gi++) {
        if (!(w->inflight & (1u << gi))) continue;
        if (finish) w->inflight &= ~(1u << gi);
        st = finish ? r->finish(w->comm[gi], w->rank[gi]) : r->progress(w->comm[gi], w->rank[gi]);
    }
    if (finish) {
        double ms = (double)(mw__now_ns() - t0) * 1e-6;
        w->reduce_ms += ms;
        if (w->prof_cat) /* the wait for overlapped buckets: the backward all-reduce row */
            w->prof_ms[MW__PROF_PER_PHASE + 2 * MW__OP_COUNT] += ms;
    }
    return st;
}

mw_status mw__run_range(worker *w, int from, int to) {
    const mw__plan *p = &w->plan;
    for (int i = from; i < to; i++) {
        mw_phase ph = phase_of(w, i);
        mw_status st = ph != w->phase || i == from ? mw__enter(w, ph) : MW_OK;
        if (st) return st;
        /* Profiling: a GPU's kernels are timed by waiting for each. */
        int64_t t0 = w->prof_cat ? mw__now_ns() : 0;
        if ((st = run_ins(w, &p->ins[i], &w->kern[i])) ||
            (w->prof_cat && !w->dev.vt->host_memory && (st = w->dev.vt->sync(&w->dev))))
            return mw__explain_index_error(w, &p->ins[i], st);
        if (w->prof_cat) {
            w->prof_ms[w->prof_cat[i]] += (double)(mw__now_ns() - t0) * 1e-6;
            w->prof_calls[w->prof_cat[i]]++;
        }
        if (w->inflight && w->prog->reducer->progress && (st = mw__reductions(w, 0))) return st;
    }
    return MW_OK;
}
