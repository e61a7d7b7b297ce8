/* The plan's memory: the arena that activations share and the buffers' lifetimes, so that a
 * buffer is reused once its value's last reader ran.
 *
 * The plan is built twice. The first build places each buffer as it comes (best fit over a sorted
 * free list, with coalescing) and records every buffer's size and lifetime; mw__arena_pack then
 * places them all at once, knowing the whole step: largest first, each at the lowest offset clear
 * of the buffers already placed whose lifetimes overlap its own. The second build replays those
 * offsets. An online allocator cannot know that the scalar it puts at the start of a large hole
 * lives to the end of the step, and that a buffer of the hole's size comes next (an FSDP step's
 * gathered embedding, freed and gathered again for the output layer); packing does. */
#include <stdlib.h>

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

/* Best fit: the smallest free block that holds n (the lowest of equals), else the top grown,
 * absorbing a free block that ends there. */
static int64_t place_online(arena *a, int64_t n) {
    int best = -1;
    for (int i = 0; i < a->nfree; i++)
        if (a->free[i].len >= n && (best < 0 || a->free[i].len < a->free[best].len)) best = i;
    if (best >= 0) {
        int i = best;
        int64_t off = a->free[i].off;
        a->free[i].off += n;
        a->free[i].len -= n;
        if (!a->free[i].len) {
            memmove(a->free + i, a->free + i + 1, (size_t)(a->nfree - i - 1) * sizeof *a->free);
            a->nfree--;
        }
        return off;
    }
    if (a->nfree && a->free[a->nfree - 1].off + a->free[a->nfree - 1].len == a->top) {
        int64_t off = a->free[--a->nfree].off;
        a->top = off + n;
        return off;
    }
    int64_t off = a->top;
    a->top += n;
    return off;
}

int64_t mw__arena_alloc(arena *a, int64_t n) {
    n = (n + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS;
    if (a->placed) { /* replaying a packing */
        int k = a->next++;
        if (k >= a->nrecs || a->recs[k].n != n) {
            a->mismatch = 1; /* another sequence than recorded: the caller keeps the first */
            return 0;
        }
        return a->placed[k];
    }
    int64_t off = place_online(a, n);
    if (a->failed) return off;
    if (a->nrecs == a->reccap) {
        int cap = a->reccap ? 2 * a->reccap : 256;
        arena_rec *p = mw__realloc(a->recs, (size_t)cap * sizeof *p);
        if (!p) {
            a->failed = 1; /* reported by mw__plan_build */
            return off;
        }
        a->recs = p;
        a->reccap = cap;
    }
    a->recs[a->nrecs++] = (arena_rec){.n = n, .off = off, .born = a->clock++, .died = INT64_MAX};
    return off;
}

int mw__arena_release(arena *a, int64_t off, int64_t n) {
    n = (n + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS;
    if (a->placed) return 0;
    for (int k = a->nrecs - 1; k >= 0; k--)
        if (a->recs[k].off == off && a->recs[k].n == n && a->recs[k].died == INT64_MAX) {
            a->recs[k].died = a->clock++;
            break;
        }
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

typedef struct pack_key {
    int64_t n, born;
    int k;
} pack_key;

/* Largest first; of equal sizes, the earlier made first. */
static int by_size(const void *x, const void *y) {
    const pack_key *a = x, *b = y;
    if (a->n != b->n) return a->n > b->n ? -1 : 1;
    return a->born < b->born ? -1 : a->born > b->born;
}

static int by_offset(const void *x, const void *y) {
    const block *a = x, *b = y;
    return a->off < b->off ? -1 : a->off > b->off;
}

int64_t mw__arena_pack(arena *a) {
    int n = a->nrecs;
    if (a->failed) return -2;
    if (n == 0) return -1;
    pack_key *order = mw__malloc((size_t)n * sizeof *order);
    block *busy = mw__malloc((size_t)n * sizeof *busy);
    int64_t *placed = mw__malloc((size_t)n * sizeof *placed);
    if (!order || !busy || !placed) {
        mw__free(order);
        mw__free(busy);
        mw__free(placed);
        return -2;
    }
    for (int k = 0; k < n; k++) {
        order[k] = (pack_key){a->recs[k].n, a->recs[k].born, k};
        placed[k] = -1;
    }
    qsort(order, (size_t)n, sizeof *order, by_size);
    int64_t top = 0;
    for (int q = 0; q < n; q++) {
        const arena_rec *r = &a->recs[order[q].k];
        int nb = 0;
        for (int p = 0; p < q; p++) { /* the placed buffers alive while r is */
            const arena_rec *o = &a->recs[order[p].k];
            if (o->born < r->died && r->born < o->died)
                busy[nb++] = (block){placed[order[p].k], o->n};
        }
        qsort(busy, (size_t)nb, sizeof *busy, by_offset);
        int64_t at = 0;
        for (int k = 0; k < nb && busy[k].off < at + r->n; k++)
            if (busy[k].off + busy[k].len > at) at = busy[k].off + busy[k].len;
        placed[order[q].k] = at;
        if (at + r->n > top) top = at + r->n;
    }
    mw__free(order);
    mw__free(busy);
    mw__free(a->placed_own);
    a->placed_own = placed;
    return top;
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

/* Whether node i may write its n-element f32 output over the buffer of its input `in`: an f32
 * arena buffer of as many elements, starting where its value does, that nothing reads after i
 * (the host included) and that carries no scratch. */
static int may_take_over(builder *b, int i, const mw_tensor *in, int64_t n) {
    int root = b->node[in->id].root;
    const node_info *r = &b->node[root];
    return r->in_arena && r->last_use == i && r->ref.dtype == MW_F32 && !r->host_read &&
           !b->fuse[root].extra && b->node[in->id].ref.off == r->ref.off &&
           local_type(&in->type, b->pl).numel == n;
}

static void take_over(builder *b, int i, const mw_tensor *in) {
    node_info *r = &b->node[b->node[in->id].root];
    b->node[i].ref = r->ref;
    r->in_arena = 0;
    b->node[i].in_arena = 1;
}

void mw__plan_assign(builder *b, int i) {
    const mw_tensor *t = b->g->nodes[i];
    if (b->node[i].grad_of >= 0) {
        b->node[i].ref = grad_ref(b, i);
        return;
    }
    int64_t n = local_type(&t->type, b->pl).numel;
    int f32 = t->type.dtype == MW_F32 && !b->fuse[i].buf16 && !b->fuse[i].extra;
    /* The cross-entropy's gradient takes over the logits' buffer when nothing reads them after
     * (the kernel reads a row whole before it writes it): the largest two buffers of a language
     * model's step are then one. */
    if (t->op == MW__OP_XENT_GRAD && t->type.dtype == MW_F32 && may_take_over(b, i, t->in[1], n)) {
        take_over(b, i, t->in[1]);
        return;
    }
    /* An elementwise binary op writes over an input of its own layout that dies with it (the
     * kernel reads element j of each input before it writes element j; the op's rules gave axes
     * of one name one size): the sum of a tied embedding's two gradients needs no third buffer of
     * the table's size. */
    if (t->op >= MW__OP_ADD && t->op <= MW__OP_DIV && f32)
        for (int k = 0; k < 2; k++) {
            const mw_tensor *other = t->in[1 - k];
            int shared = b->node[other->id].root == b->node[t->in[k]->id].root;
            if (same_layout(&t->in[k]->type, &t->type) && may_take_over(b, i, t->in[k], n) &&
                (!shared || (same_layout(&other->type, &t->type) &&
                             b->node[other->id].ref.off == b->node[t->in[k]->id].ref.off))) {
                take_over(b, i, t->in[k]);
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
