/* The plan's memory: the arena that activations share (first-fit over a sorted free list, with
 * coalescing) and the buffers' lifetimes, so that a buffer is reused once its value's last reader
 * ran. */
#include "core/alloc.h"
#include "core/plan_impl.h"

#define ALIGN_ELEMS 16 /* 64 bytes */

static int arena_push(arena *a, int at, block b) {
    if (a->nfree == a->cap) {
        int cap = a->cap ? 2 * a->cap : 32;
        block *p = mw__realloc(a->free, (size_t)cap * sizeof *p);
        if (!p) return -1;
        a->free = p;
        a->cap = cap;
    }
    memmove(a->free + at + 1, a->free + at, (size_t)(a->nfree - at) * sizeof *a->free);
    a->free[at] = b;
    a->nfree++;
    return 0;
}

int64_t mw__arena_alloc(arena *a, int64_t n) {
    n = (n + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS;
    for (int i = 0; i < a->nfree; i++) {
        if (a->free[i].len < n) continue;
        int64_t off = a->free[i].off;
        a->free[i].off += n;
        a->free[i].len -= n;
        if (!a->free[i].len) {
            memmove(a->free + i, a->free + i + 1, (size_t)(a->nfree - i - 1) * sizeof *a->free);
            a->nfree--;
        }
        return off;
    }
    /* Grow the top, absorbing a free block that ends there. */
    if (a->nfree && a->free[a->nfree - 1].off + a->free[a->nfree - 1].len == a->top) {
        int64_t off = a->free[--a->nfree].off;
        a->top = off + n;
        return off;
    }
    int64_t off = a->top;
    a->top += n;
    return off;
}

int mw__arena_release(arena *a, int64_t off, int64_t n) {
    n = (n + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS;
    int i = 0;
    while (i < a->nfree && a->free[i].off < off) i++;
    if (i > 0 && a->free[i - 1].off + a->free[i - 1].len == off) {
        a->free[i - 1].len += n;
        if (i < a->nfree && a->free[i - 1].off + a->free[i - 1].len == a->free[i].off) {
            a->free[i - 1].len += a->free[i].len;
            memmove(a->free + i, a->free + i + 1, (size_t)(a->nfree - i - 1) * sizeof *a->free);
            a->nfree--;
        }
        return 0;
    }
    if (i < a->nfree && off + n == a->free[i].off) {
        a->free[i].off = off;
        a->free[i].len += n;
        return 0;
    }
    return arena_push(a, i, (block){off, n});
}

void mw__plan_liveness(builder *b, const mw_tensor *loss, mw_tensor *const *outputs, int noutputs) {
    const mw_graph *g = b->g;
    int nn = g->nnodes;
    for (int i = 0; i < nn; i++) {
        const mw_tensor *t = g->nodes[i];
        b->node[i].last_use = i;
        if (!b->node[i].live) continue;
        /* A buffer lives until the last use of any alias of it. */
        for (int k = 0; k < t->nin; k++) b->node[b->node[t->in[k]->id].root].last_use = i;
    }
    b->node[b->node[loss->id].root].last_use = nn; /* read by the host after the step */
    for (int o = 0; o < noutputs; o++) b->node[b->node[outputs[o]->id].root].last_use = nn;
}

void mw__plan_assign(builder *b, int i) {
    const mw_tensor *t = b->g->nodes[i];
    if (b->node[i].grad_of >= 0) {
        b->node[i].ref = grad_ref(b, i);
        return;
    }
    int64_t n = local_type(&t->type, b->pl).numel;
    /* The cross-entropy's gradient takes over the logits' buffer when nothing reads them after
     * (the kernel reads a row whole before it writes it): the largest two buffers of a language
     * model's step are then one. */
    if (t->op == MW__OP_XENT_GRAD) {
        const mw_tensor *l = t->in[1];
        node_info *r = &b->node[b->node[l->id].root];
        if (r->in_arena && r->last_use == i && r->ref.dtype == MW_F32 && !r->host_read &&
            t->type.dtype == MW_F32 && !b->fuse[b->node[l->id].root].extra &&
            local_type(&l->type, b->pl).numel == n) {
            b->node[i].ref = r->ref;
            r->in_arena = 0;
            b->node[i].in_arena = 1;
            return;
        }
    }
    mw_dtype d = b->fuse[i].buf16 ? MW_BF16 : t->type.dtype;
    b->node[i].ref = arena_ref(d, mw__arena_alloc(&b->ar, units_of(n, d) + b->fuse[i].extra));
    b->node[i].in_arena = 1;
}

int mw__plan_release_inputs(builder *b, int i) {
    const mw_tensor *t = b->g->nodes[i];
    for (int k = 0; k < t->nin; k++) {
        int a = b->node[t->in[k]->id].root;
        if (b->node[a].last_use != i || !b->node[a].in_arena) continue;
        b->node[a].in_arena = 0;
        int64_t n = local_type(&b->g->nodes[a]->type, b->pl).numel;
        if (mw__arena_release(&b->ar, b->node[a].ref.off / 4,
                              units_of(n, b->node[a].ref.dtype) + b->fuse[a].extra))
            return -1;
    }
    return 0;
}
