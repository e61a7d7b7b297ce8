/* Compiling a graph for one device: the live nodes, the fusion pass (plan_fuse.c), the buffers'
 * lifetimes (plan_memory.c), the flat parameter layout and the input views, then one pass over the
 * nodes that assigns each its buffer, lowers it (plan_lower.c) and closes the gradient buckets it
 * finishes. */
#include "core/plan.h"
#include "core/alloc.h"
#include "core/plan_impl.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

int64_t mw__split_len(int64_t n, int parts, int c) { return n / parts + (c < n % parts); }

int64_t mw__split_lo(int64_t n, int parts, int c) {
    int64_t r = n % parts;
    return (int64_t)c * (n / parts) + (c < r ? c : r);
}

void mw__box_of(const mw__type *t, const mw__placement *pl, mw__box *out) {
    memset(out, 0, sizeof *out);
    out->rank = t->rank;
    for (int i = 0; i < t->rank; i++) {
        const mw__axis *a = &t->ax[i];
        out->global[i] = out->len[i] = a->size;
        if (a->mesh < 0) continue;
        out->lo[i] = mw__split_lo(a->size, pl->size[a->mesh], pl->coord[a->mesh]);
        out->len[i] = mw__split_len(a->size, pl->size[a->mesh], pl->coord[a->mesh]);
    }
}

int64_t mw__box_run(const mw__box *b, int64_t e, int64_t to, int64_t *at) {
    int64_t idx[MW_MAX_RANK] = {0}, rest = e, off = 0, stride = 1;
    for (int i = b->rank - 1; i >= 0; i--) {
        idx[i] = rest % b->len[i];
        rest /= b->len[i];
        off += (b->lo[i] + idx[i]) * stride;
        stride *= b->global[i];
    }
    *at = off;
    if (b->rank == 0) return to > e ? 1 : 0;
    /* To the end of the last axis; then, while the run covers every inner axis from its start and
     * those axes are whole in the array, over the rest of the next axis out. */
    int i = b->rank - 1;
    int64_t run = b->len[i] - idx[i], span = b->len[i];
    while (i > 0 && b->len[i] == b->global[i] && run == span) {
        i--;
        run = (b->len[i] - idx[i]) * span;
        span *= b->len[i];
    }
    return run < to - e ? run : to - e;
}

/* Where each input (or shard of it) lives on this device. */
static int add_view(builder *b, const mw_tensor *n) {
    const mw_tensor *leaf = n;
    while (leaf->op == MW__OP_SHARD) leaf = leaf->in[0];
    mw__plan *p = b->p;
    mw__view *v = &p->views[p->nviews];
    memset(v, 0, sizeof *v);
    v->input = leaf->leaf;
    v->dtype = n->type.dtype;
    mw__box_of(&n->type, b->pl, &v->box);
    v->count = 1;
    for (int i = 0; i < v->box.rank; i++) v->count *= v->box.len[i];
    /* Contiguous iff the box is one run of the array. */
    v->contiguous = mw__box_run(&v->box, 0, v->count, &v->host_offset) == v->count;
    b->node[n->id].ref = mw__ref_at(MW__BASE_VIEW0 + p->nviews, n->type.dtype, 0);
    p->nviews++;
    return 0;
}

/* FSDP's prefetch: after GATHER node i, the next live GATHER's all-gather is started, when its
 * input is ready and it lies in the same pass (forward or backward: a plan runs its
 * forward alone too), so it proceeds while the nodes between them run. 0, or -1 when memory ran
 * out. */
static int prefetch_after(builder *b, int i, int fwd_last) {
    const mw_graph *g = b->g;
    for (int j = i + 1; j < g->nnodes; j++) {
        const mw_tensor *t = g->nodes[j];
        if (!b->node[j].live || t->op != MW__OP_GATHER) continue;
        /* A parameter (or its bf16 copy) has its place from the start; other inputs once
         * computed. */
        const mw_tensor *src = t->in[0];
        int ready = src->id <= i || src->op == MW__OP_PARAM ||
                    (src->op == MW__OP_CAST && b->fuse[src->id].cast == CAST_PARAM);
        if ((i <= fwd_last) != (j <= fwd_last) || !ready) return 0;
        return mw__plan_start_gather(b, t);
    }
    return 0;
}

static int cmp_slot(const void *x, const void *y) {
    const mw__param_slot *a = *(const mw__param_slot *const *)x;
    const mw__param_slot *c = *(const mw__param_slot *const *)y;
    int ka = a->grad_node < 0 ? 1 << 30 : a->grad_node;
    int kc = c->grad_node < 0 ? 1 << 30 : c->grad_node;
    return (ka > kc) - (ka < kc);
}

static mw_status build(const mw_graph *g, const mw_tensor *loss, mw_tensor *const *param_grads,
                       mw_tensor *const *outputs, int noutputs, const mw__placement *pl,
                       const mw__plan_target *target, mw__plan *out, arena *ar) {
    memset(out, 0, sizeof *out);
    int failed = 1, lowered = 0;
    int nn = g->nnodes;
    int host_memory = target->host_memory;
    int64_t bucket_elems = target->bucket_elems;
    builder bld = {.g = g,
                   .pl = pl,
                   .p = out,
                   .host_memory = host_memory,
                   .bf16_out = target->bf16_out,
                   .prefetch = target->prefetch_gathers,
                   .split = target->split_nodes,
                   .rotary = target->rotary};
    builder *b = &bld;
    b->ar = *ar; /* the record of the first build, or the offsets the second replays */
    b->node = mw__calloc((size_t)nn + 1, sizeof *b->node);
    b->fuse = mw__calloc((size_t)nn + 1, sizeof *b->fuse);
    mw__param_slot **order = mw__calloc((size_t)g->nparams + 1, sizeof *order);
    out->views = mw__calloc((size_t)g->ninputs * 4 + (size_t)nn, sizeof *out->views);
    out->params = mw__calloc((size_t)g->nparams + 1, sizeof *out->params);
    out->nparams = g->nparams;
    out->outputs = mw__calloc((size_t)noutputs + 1, sizeof *out->outputs);
    out->noutputs = noutputs;
    if (!out->outputs || !b->node || !b->fuse || !order || !out->views || !out->params) goto oom;

    /* Live nodes: ancestors of the loss and of the gradients. */
    for (int i = 0; i < nn; i++) b->node[i].grad_of = -1;
    b->node[loss->id].live = 1;
    for (int o = 0; o < noutputs; o++) b->node[outputs[o]->id].live = 1;
    for (int p = 0; p < g->nparams; p++)
        if (param_grads[p]) {
            b->node[param_grads[p]->id].live = 1;
            b->node[param_grads[p]->id].grad_of = p;
        }
    /* A state's writes are kept for the next run even where this one reads none of them. */
    for (int i = 0; i < nn; i++) b->node[i].live |= g->nodes[i]->op == MW__OP_STATE_WRITE;
    for (int i = nn - 1; i >= 0; i--)
        if (b->node[i].live)
            for (int k = 0; k < g->nodes[i]->nin; k++) b->node[g->nodes[i]->in[k]->id].live = 1;
    /* The loss and the outputs are read by the host: never absorbed into a GEMM. */
    b->node[loss->id].uses += 2;
    for (int o = 0; o < noutputs; o++) b->node[outputs[o]->id].uses += 2;
    mw__plan_fuse(b, loss, outputs, noutputs);
    mw__plan_liveness(b, loss, outputs, noutputs);

    /* The flat parameter/gradient layout: in the order backward finishes the gradients. */
    for (int i = 0; i < nn; i++) {
        const mw_tensor *t = g->nodes[i];
        if (t->op != MW__OP_PARAM) continue;
        mw__param_slot *s = &out->params[t->leaf];
        s->count = local_type(&t->type, pl).numel;
        s->grad_node = param_grads[t->leaf] ? param_grads[t->leaf]->id : -1;
        s->group = param_grads[t->leaf] ? param_grads[t->leaf]->type.partial : 0;
        order[t->leaf] = s;
    }
    qsort(order, (size_t)g->nparams, sizeof *order, cmp_slot);
    for (int i = 0; i < g->nparams; i++) {
        order[i]->off = out->param_elems;
        out->param_elems += order[i]->count;
    }

    for (int i = 0; i < nn; i++) {
        const mw_tensor *t = g->nodes[i];
        if (!b->node[i].live) continue;
        if (t->op == MW__OP_STATE) { /* the states, one after another in node order */
            b->node[i].ref = mw__ref_at(MW__BASE_STATE, MW_F32, out->state_elems);
            out->state_elems += local_type(&t->type, pl).numel;
        } else if (t->op == MW__OP_PARAM) {
            b->node[i].ref = mw__ref_at(MW__BASE_PARAMS, MW_F32, out->params[t->leaf].off);
        } else if (t->op == MW__OP_CAST && b->fuse[i].cast == CAST_PARAM) {
            const mw_tensor *p = t->in[0];
            while (p->op == MW__OP_ALIAS) p = p->in[0];
            out->params[p->leaf].bf16 = out->params16 = 1;
            b->node[i].ref = mw__ref_at(MW__BASE_PARAMS16, MW_BF16, out->params[p->leaf].off);
        } else if (t->op == MW__OP_INPUT || t->op == MW__OP_SHARD) {
            /* A shard chain only needs the view of its last link. */
            int used = 0;
            for (int j = i + 1; j < nn && !used; j++)
                for (int k = 0; k < g->nodes[j]->nin; k++)
                    used |= b->node[j].live && g->nodes[j]->in[k] == t &&
                            g->nodes[j]->op != MW__OP_SHARD;
            if (used && add_view(b, t)) goto oom;
        }
    }

    /* Views that cannot be read in place get a staging buffer for the whole step. */
    for (int v = 0; v < out->nviews; v++) {
        mw__view *w = &out->views[v];
        w->staging = (mw__ref){MW__BASE_ARENA, w->dtype, -1};
        if (!w->contiguous || !host_memory)
            w->staging = arena_ref(w->dtype, mw__arena_alloc(&b->ar, units_of(w->count, w->dtype)));
    }

    /* Gradient buckets: runs of consecutive slots partial over the same group, at most
     * bucket_elems long (a larger gradient is a bucket of its own), each reduced right after the
     * node that finishes its last gradient. */
    /* The forward pass ends with the loss or the last requested output, whichever is later. */
    int fwd_last = loss->id;
    for (int o = 0; o < noutputs; o++)
        if (outputs[o]->id > fwd_last &&
            (!target->forward_nodes || outputs[o]->id < target->forward_nodes))
            fwd_last = outputs[o]->id;
    int bucket_first = 0;
    int i_order = 0;
    for (int i = 0; i < nn; i++) {
        const mw_tensor *t = g->nodes[i];
        if (i == fwd_last + 1) out->fwd_end = out->nins;
        if (target->split_nodes && i == target->split_nodes) out->bwd_split = out->nins;
        if (!b->node[i].live) continue;
        if (t->op == MW__OP_ALIAS || b->fuse[i].pass ||
            (t->op == MW__OP_CAST && b->fuse[i].cast == CAST_FUSED)) {
            /* an alias, a fused cast (its input's kernel wrote bf16), or a node the attention's
             * kernels compute (find_rotary) */
            b->node[i].ref = b->node[t->in[0]->id].ref;
        } else if (b->fuse[i].fused >= 0) {
            b->node[i].ref =
                b->node[b->fuse[i].fused].ref; /* the GEMM already wrote the sum there */
        } else if (t->op == MW__OP_STATE_WRITE) {
            b->node[i].ref = b->node[t->in[0]->id].ref; /* written in place */
            if ((lowered = mw__plan_lower_node(b, t))) goto oom;
        } else if (t->op == MW__OP_CAST && b->fuse[i].cast == CAST_PARAM) {
            /* the parameter's bf16 copy, set above */
        } else if (t->op != MW__OP_INPUT && t->op != MW__OP_PARAM && t->op != MW__OP_SHARD &&
                   t->op != MW__OP_STATE) {
            if (b->node[i].started != 2) mw__plan_assign(b, i);
            if (!b->fuse[i].absorbed && (lowered = mw__plan_lower_node(b, t))) goto oom;
            if (t->op == MW__OP_GATHER && b->prefetch && (lowered = prefetch_after(b, i, fwd_last)))
                goto oom;
        }
        if (mw__plan_release_inputs(b, i)) goto oom;
        /* Close every bucket whose gradients are now all final. */
        while (i_order < g->nparams && order[i_order]->grad_node == i) {
            mw__param_slot *s = order[i_order++];
            mw__param_slot *first = order[bucket_first];
            int64_t len = s->off + s->count - first->off;
            int next_same = i_order < g->nparams && order[i_order]->grad_node >= 0 &&
                            order[i_order]->group == s->group;
            int64_t next_len =
                next_same ? order[i_order]->off + order[i_order]->count - first->off : 0;
            if (!s->group) {
                bucket_first = i_order;
                continue;
            }
            if (next_same && next_len <= bucket_elems) continue;
            mw__ins *in = mw__plan_emit(b, MW__I_GRAD_BUCKET, i);
            if (!in) goto oom;
            in->ref.collective.buf = mw__ref_at(MW__BASE_GRADS, MW_F32, first->off);
            in->count = len;
            in->group = s->group;
            bucket_first = i_order;
        }
    }
    if (fwd_last + 1 >= nn) out->fwd_end = out->nins;
    out->bwd_end = out->nins;
    if (!target->split_nodes || target->split_nodes >= nn) out->bwd_split = out->bwd_end;
    out->loss = b->node[loss->id].ref;
    for (int o = 0; o < noutputs; o++) out->outputs[o] = b->node[outputs[o]->id].ref;
    out->arena_bytes = b->ar.top * 4;
    failed = 0;
oom: /* every allocation failure above jumps here with failed still set */
    mw__free(b->node);
    mw__free(b->fuse);
    mw__free(order);
    mw__free(b->ar.free);
    b->ar.free = NULL;
    b->ar.nfree = b->ar.cap = 0;
    *ar = b->ar;
    if (!failed) return MW_OK;
    mw__plan_free(out);
    if (lowered == -2) return MW_ERR_UNSUPPORTED; /* cannot_lower's message */
    return mw__error(MW_ERR_NOMEM, "out of memory compiling the graph");
}

/* Two builds (plan_memory.c): the first records every arena buffer's size and lifetime, the
 * second replays the packing of them all when it needs less memory than the first's online
 * placement. Both builds make the same buffers in the same order: only their offsets differ. */
mw_status mw__plan_build(const mw_graph *g, const mw_tensor *loss, mw_tensor *const *param_grads,
                         mw_tensor *const *outputs, int noutputs, const mw__placement *pl,
                         const mw__plan_target *target, mw__plan *out) {
    arena ar = {0};
    mw_status st = build(g, loss, param_grads, outputs, noutputs, pl, target, out, &ar);
    int64_t packed = st ? -1 : mw__arena_pack(&ar);
    if (packed == -2) {
        mw__plan_free(out);
        st = mw__error(MW_ERR_NOMEM, "out of memory compiling the graph");
    }
    if (packed >= 0 && packed * 4 < out->arena_bytes) {
        mw__plan second;
        arena replay = {.recs = ar.recs, .nrecs = ar.nrecs, .placed = ar.placed_own};
        st = build(g, loss, param_grads, outputs, noutputs, pl, target, &second, &replay);
        if (st == MW_OK && !replay.mismatch && replay.next == ar.nrecs) {
            second.arena_bytes = packed * 4;
            mw__plan_free(out);
            *out = second;
        } else if (st == MW_OK) {
            mw__plan_free(&second); /* another sequence than recorded: the first plan stands */
        } else {
            mw__plan_free(out);
        }
    }
    mw__free(ar.recs);
    mw__free(ar.placed_own);
    return st;
}

void mw__plan_free(mw__plan *p) {
    if (!p) return;
    mw__free(p->ins);
    mw__free(p->views);
    mw__free(p->params);
    mw__free(p->outputs);
    memset(p, 0, sizeof *p);
}
