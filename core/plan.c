/* Compiling a graph for one device: local shapes, buffer planning by liveness, and lowering of
 * every node to device kernels (contractions to batched GEMMs) and collectives. */
#include "core/plan.h"
#include "core/alloc.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#define ALIGN_ELEMS 16 /* 64 bytes */

int64_t mw__split_len(int64_t n, int parts, int c) { return n / parts + (c < n % parts); }

int64_t mw__split_lo(int64_t n, int parts, int c) {
    int64_t r = n % parts;
    return (int64_t)c * (n / parts) + (c < r ? c : r);
}

/* --- the arena: first-fit over a sorted free list, with coalescing -------------------------- */

/* The arena's 4-byte units that numel elements of dtype take, and the ref of a buffer of dtype
 * at arena unit `unit`. */
static int64_t units_of(int64_t numel, mw_dtype dtype) {
    return (numel * mw__dtype_bytes(dtype) + 3) / 4;
}

static mw__ref arena_ref(mw_dtype dtype, int64_t unit) {
    return (mw__ref){MW__BASE_ARENA, dtype, unit * 4};
}

/* No operand (an optional ref a kernel goes without). */
static const mw__ref no_ref = {MW__BASE_ARENA, MW_F32, -1};

typedef struct block {
    int64_t off, len;
} block;

typedef struct arena {
    block *free;
    int nfree, cap;
    int64_t top;
} arena;

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

static int64_t arena_alloc(arena *a, int64_t n) {
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

static int arena_release(arena *a, int64_t off, int64_t n) {
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

/* --- local shapes ------------------------------------------------------------------------------
 */

typedef struct ltype {
    int rank;
    int64_t size[MW_MAX_RANK];
    int64_t stride[MW_MAX_RANK];
    int64_t numel;
} ltype;

static ltype local_type(const mw__type *t, const mw__placement *pl) {
    ltype l = {.rank = t->rank, .numel = 1};
    for (int i = t->rank - 1; i >= 0; i--) {
        const mw__axis *a = &t->ax[i];
        l.size[i] =
            a->mesh >= 0 ? mw__split_len(a->size, pl->size[a->mesh], pl->coord[a->mesh]) : a->size;
        l.stride[i] = l.numel;
        l.numel *= l.size[i];
    }
    return l;
}

/* --- building ------------------------------------------------------------------------------------
 */

typedef struct builder {
    const mw_graph *g;
    const mw__placement *pl;
    mw__plan *p;
    arena ar;
    mw__ref *ref;   /* per node: where its value lives */
    int *root;      /* per node: the node owning its buffer (itself unless an alias) */
    char *in_arena; /* per node: ref is an arena buffer to release after its last use */
    int *last_use;  /* per node */
    /* GEMM epilogues: addend[c] is the ADD whose other operand a CONTRACT c's GEMM accumulates
     * onto (beta = 1, after copying it into c's buffer), or -1; fused[a] is the CONTRACT whose
     * buffer that ADD a takes over (a then emits nothing), or -1. */
    int *addend;
    int *fused;
    /* addend2[c]: a second ADD whose other operand (a residual) goes into c's buffer too, with
     * the first addend, in one pass (x + (A B + b) with a bias and a residual), or -1.
     * ln_addend[i]: for an LN_DX node i, the node its kernel adds to dx (fused[] maps the ADD
     * onto i), or -1. */
    int *addend2, *ln_addend;
    /* Per node: floats allocated after its value in the same buffer, freed with it. An ATTENTION
     * node keeps its probabilities there for its gradient node (attn_probs). */
    int64_t *extra;
    int host_memory;
    /* Gradients written beside another kernel's output (find_fused_grads): ln_dw[i] is the
     * LN_DW node an LN_DX node i writes too, col_sum[i] the SUM node (a bias gradient) an LN_DX
     * or GELU_GRAD node i writes too, else -1; absorbed[j]: node j emits nothing. grad_of: node ->
     * the parameter it is the gradient of, or -1. */
    int *ln_dw, *col_sum;
    char *absorbed;
    const int *grad_of;
    /* bf16 (find_bf16_casts): cast[i], for a CAST node i to bf16, says how it is made; buf16[r]
     * says that the buffer owned by node r holds bf16 (its kernel writes a cast's value). */
    char *cast, *buf16;
    uint32_t bf16_out; /* mw__plan_target's */
} builder;

enum {
    CAST_CONVERT = 0, /* a converting copy of its own */
    CAST_PARAM,       /* a parameter's bf16 copy (MW__BASE_PARAMS16), written by whoever changes
                         the parameter */
    CAST_FUSED        /* written in bf16 by the kernel that makes the value, which nobody else
                         reads */
};

static mw__ins *emit(builder *b, mw__ins_kind kind, int node) {
    mw__plan *p = b->p;
    if (p->nins == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        mw__ins *n = mw__realloc(p->ins, (size_t)cap * sizeof *n);
        if (!n) return NULL;
        p->ins = n;
        p->cap = cap;
    }
    mw__ins *in = &p->ins[p->nins++];
    memset(in, 0, sizeof *in);
    in->kind = kind;
    in->node = node;
    for (int r = 0; r < MW__MAX_ROLES; r++) in->ref.all[r] = no_ref;
    return in;
}

/* Strides, over the dims of `space`, of the tensor `x` (0 where x lacks the axis). */
static void map_strides(const mw__type *space, const mw__type *x, const ltype *lx, int64_t *out) {
    for (int i = 0; i < space->rank; i++) {
        int j = mw__type_find(x, &space->ax[i]);
        out[i] = j >= 0 ? lx->stride[j] : 0;
    }
}

static void nd_over(mw__nd *nd, const mw__type *space, const ltype *ls) {
    memset(nd, 0, sizeof *nd);
    nd->rank = space->rank;
    for (int i = 0; i < space->rank; i++) nd->dims[i] = ls->size[i];
}

/* out (type to, contiguous) = alpha * x rearranged: copy, permute or broadcast. */
static int emit_copy(builder *b, int node, mw__ref out, const mw__type *to, mw__ref x,
                     const mw__type *tx, float alpha) {
    ltype lo = local_type(to, b->pl), lx = local_type(tx, b->pl);
    mw__ins *in = emit(b, MW__I_COPY, node);
    if (!in) return -1;
    in->ref.copy.out = out;
    in->ref.copy.a = x;
    in->k.copy.alpha = alpha;
    in->k.copy.out_dtype = out.dtype;
    in->k.copy.a_dtype = x.dtype;
    nd_over(&in->k.copy.nd, to, &lo);
    memcpy(in->k.copy.nd.stride[0], lo.stride, sizeof lo.stride);
    map_strides(to, tx, &lx, in->k.copy.nd.stride[1]);
    mw__nd_simplify(&in->k.copy.nd, 2);
    return 0;
}

static int64_t scratch(builder *b, const mw__type *t, int64_t *len) {
    *len = units_of(local_type(t, b->pl).numel, t->dtype);
    return arena_alloc(&b->ar, *len);
}

/* A type made of the listed axes (by position in src types), in that order. */
typedef struct axlist {
    int n;
    mw__axis ax[MW_MAX_RANK];
} axlist;

static int seq_equals(const mw__type *t, const axlist *const *groups, int ngroups) {
    int k = 0;
    for (int gi = 0; gi < ngroups; gi++)
        for (int i = 0; i < groups[gi]->n; i++, k++)
            if (k >= t->rank || t->ax[k].name != groups[gi]->ax[i].name ||
                t->ax[k].mesh != groups[gi]->ax[i].mesh)
                return 0;
    return k == t->rank;
}

static mw__type type_of(const axlist *const *groups, int ngroups) {
    mw__type t = {.dtype = MW_F32};
    for (int gi = 0; gi < ngroups; gi++)
        for (int i = 0; i < groups[gi]->n; i++) t.ax[t.rank++] = groups[gi]->ax[i];
    return t;
}

static int64_t group_size(const axlist *gr, const mw__placement *pl) {
    mw__type t = {.rank = gr->n};
    memcpy(t.ax, gr->ax, sizeof gr->ax);
    return local_type(&t, pl).numel;
}

/* A batched row-major GEMM of M x K by K x N, each operand stored transposed when its flag is set.
 */
static mw__k_gemm gemm_of(int64_t batch, int64_t m, int64_t n, int64_t k, int trans_a,
                          int trans_b) {
    return (mw__k_gemm){.batch = batch,
                        .m = m,
                        .n = n,
                        .k = k,
                        .trans_a = trans_a,
                        .trans_b = trans_b,
                        .lda = trans_a ? m : k,
                        .ldb = trans_b ? k : n,
                        .ldc = n,
                        .stride_a = m * k,
                        .stride_b = k * n,
                        .stride_c = m * n};
}

/* How GEMM reads one operand of type t: 0 in the `direct` group order, 1 in the `trans` one, or,
 * when neither is t's layout, 0 after a permuting copy into scratch (*ref then points there and
 * *tmp_off / *tmp_len name the scratch to release). -1 on failure. */
static int gemm_operand(builder *b, int node, const mw__type *t, const axlist *const *direct,
                        const axlist *const *trans, mw__ref *ref, int64_t *tmp_off,
                        int64_t *tmp_len) {
    if (seq_equals(t, direct, 3)) return 0;
    if (seq_equals(t, trans, 3)) return 1;
    mw__type want = type_of(direct, 3);
    want.dtype = ref->dtype;
    *tmp_off = scratch(b, &want, tmp_len);
    mw__ref r = arena_ref(ref->dtype, *tmp_off);
    if (emit_copy(b, node, r, &want, *ref, t, 1.0f)) return -1;
    *ref = r;
    return 0;
}

static int axes_within(const mw__type *t, const mw__type *u);
static int same_layout(const mw__type *a, const mw__type *c);

/* out = a + c over the type t of the sum `sum` (the product's layout): a is node `a` mapped onto
 * t by name (broadcast as needed), or, when a < 0, what `in` already holds in t's layout; c is
 * node `c` mapped by name, or positionally when it has t's layout under other names (a residual
 * added after a rename). */
static int emit_add(builder *b, const mw_tensor *sum, mw__ref out, mw__ref in, const mw__type *t,
                    int a, int c) {
    ltype lo = local_type(t, b->pl);
    mw__ins *add = emit(b, MW__I_BINARY, sum->id);
    if (!add) return -1;
    add->ref.binary.out = out;
    add->ref.binary.a = a >= 0 ? b->ref[a] : in;
    add->ref.binary.b = b->ref[c];
    add->k.binary.op = MW__BIN_ADD;
    nd_over(&add->k.binary.nd, t, &lo);
    memcpy(add->k.binary.nd.stride[0], lo.stride, sizeof lo.stride);
    if (a >= 0) {
        const mw_tensor *x = b->g->nodes[a];
        ltype lx = local_type(&x->type, b->pl);
        map_strides(t, &x->type, &lx, add->k.binary.nd.stride[1]);
    } else {
        memcpy(add->k.binary.nd.stride[1], lo.stride, sizeof lo.stride);
    }
    const mw_tensor *y = b->g->nodes[c];
    ltype ly = local_type(&y->type, b->pl);
    if (axes_within(&y->type, t))
        map_strides(t, &y->type, &ly, add->k.binary.nd.stride[2]);
    else
        memcpy(add->k.binary.nd.stride[2], ly.stride, sizeof ly.stride);
    mw__nd_simplify(&add->k.binary.nd, 3);
    return 0;
}

/* How a GEMM's epilogue can read an addend x of the sum `sum` (whose type has the product's
 * layout): as a bias (x is exactly the sum's last `cols` axes, the GEMM's columns: added to every
 * row), as an array laid out like C (x has the sum's layout), or not (EPI_NONE). */
enum { EPI_NONE, EPI_BIAS, EPI_FULL };
static int epilogue_of(const mw_tensor *x, const mw_tensor *sum, int cols) {
    const mw__type *t = &x->type, *u = &sum->type;
    if (t->dtype != MW_F32 || t->partial) return EPI_NONE;
    if (same_layout(t, u)) return EPI_FULL;
    if (t->rank != cols || cols > u->rank) return EPI_NONE;
    for (int i = 0; i < cols; i++) {
        const mw__axis *a = &t->ax[i], *c = &u->ax[u->rank - cols + i];
        if (a->name != c->name || a->mesh != c->mesh) return EPI_NONE;
    }
    return EPI_BIAS;
}

/* How a contraction maps onto one GEMM: its axis groups (Bt batch, M, N, K); whether C is
 * computed swapped (C^T = B^T A^T, so that the GEMM's rows and columns are C's in memory) or
 * into scratch and permuted after; the addends the plan folds into it (find_gemm_addends: the
 * sum's other operand, and a residual added to that sum) and where each goes: into the GEMM's
 * epilogue (EPI_BIAS, EPI_FULL) or, EPI_NONE, into C before the product is added to it. */
typedef struct contraction {
    axlist bt, m, nn, k;
    int swap, permute_out;
    const mw_tensor *sum, *sum2;
    int addend, residual;
    int epi_addend, epi_residual;
} contraction;

static void analyse_contract(const builder *b, const mw_tensor *n, contraction *c) {
    const mw_tensor *ta = n->in[0], *tb = n->in[1];
    memset(c, 0, sizeof *c);
    for (int i = 0; i < n->type.rank; i++) {
        const mw__axis *ax = &n->type.ax[i];
        int ina = mw__type_find(&ta->type, ax) >= 0, inb = mw__type_find(&tb->type, ax) >= 0;
        axlist *dst = ina && inb ? &c->bt : ina ? &c->m : &c->nn;
        dst->ax[dst->n++] = *ax;
    }
    for (int i = 0; i < ta->type.rank; i++)
        if (mw__type_find(&n->type, &ta->type.ax[i]) < 0) c->k.ax[c->k.n++] = ta->type.ax[i];
    const axlist *c_direct[] = {&c->bt, &c->m, &c->nn}, *c_trans[] = {&c->bt, &c->nn, &c->m};
    c->swap = !seq_equals(&n->type, c_direct, 3) && seq_equals(&n->type, c_trans, 3);
    c->permute_out = !seq_equals(&n->type, c_direct, 3) && !c->swap;
    /* The sum's type has the product's layout (its axes possibly renamed): the addend is mapped
     * onto it by name. A residual added to that sum goes into C with the addend, in the sum's
     * layout. */
    c->addend = c->residual = -1;
    c->sum = b->addend[n->id] >= 0 ? b->g->nodes[b->addend[n->id]] : NULL;
    if (c->sum)
        c->addend =
            b->root[c->sum->in[0]->id] == b->root[n->id] ? c->sum->in[1]->id : c->sum->in[0]->id;
    c->sum2 = b->addend2[n->id] >= 0 ? b->g->nodes[b->addend2[n->id]] : NULL;
    if (c->sum2)
        c->residual =
            b->root[c->sum2->in[0]->id] == b->root[n->id] ? c->sum2->in[1]->id : c->sum2->in[0]->id;
    /* The GEMM's own epilogue where the addends fit it: a bias along C's rows, an array laid
     * out like C; both are read by the kernel as it writes C (no pass of their own). */
    c->epi_addend = c->epi_residual = EPI_NONE;
    if (c->addend >= 0 && !c->permute_out) {
        int cols = c->swap ? c->m.n : c->nn.n; /* C's trailing axes: the GEMM's columns */
        int ka = epilogue_of(b->g->nodes[c->addend], c->sum, cols);
        int kr = c->residual >= 0 ? epilogue_of(b->g->nodes[c->residual], c->sum2, cols) : EPI_NONE;
        if (ka != EPI_NONE && (c->residual < 0 || (kr != EPI_NONE && kr != ka))) {
            c->epi_addend = ka;
            c->epi_residual = kr;
        }
    }
}

/* Whether the GEMM of a contraction writes its whole result itself (nothing added to C by a pass
 * before it or after it): only then may C be bf16. */
static int contract_writes_all(const contraction *c) {
    return !c->permute_out && (c->addend < 0 || c->epi_addend != EPI_NONE);
}

/* Lowers out = contract(a, b) to a batched GEMM over groups Bt (batch), M, N, K, permuting an
 * operand into scratch only when its layout is not one of the two that GEMM reads directly. */
static int lower_contract(builder *b, const mw_tensor *n) {
    const mw_tensor *ta = n->in[0], *tb = n->in[1];
    contraction c;
    analyse_contract(b, n, &c);
    int64_t tmp_off[3] = {-1, -1, -1}, tmp_len[3] = {0};
    mw__ref ra = b->ref[ta->id], rb = b->ref[tb->id], rc = b->ref[n->id];
    const axlist *a_direct[] = {&c.bt, &c.m, &c.k}, *a_trans[] = {&c.bt, &c.k, &c.m};
    const axlist *b_direct[] = {&c.bt, &c.k, &c.nn}, *b_trans[] = {&c.bt, &c.nn, &c.k};
    const axlist *c_direct[] = {&c.bt, &c.m, &c.nn};
    int trans_a =
        gemm_operand(b, n->id, &ta->type, a_direct, a_trans, &ra, &tmp_off[0], &tmp_len[0]);
    int trans_b =
        gemm_operand(b, n->id, &tb->type, b_direct, b_trans, &rb, &tmp_off[1], &tmp_len[1]);
    if (trans_a < 0 || trans_b < 0) return -1;
    int swap = c.swap, permute_out = c.permute_out;
    mw__type tc = type_of(c_direct, 3);
    tc.dtype = rc.dtype;
    if (permute_out) {
        tmp_off[2] = scratch(b, &tc, &tmp_len[2]);
        rc = arena_ref(rc.dtype, tmp_off[2]);
    }
    int64_t B = group_size(&c.bt, b->pl), M = group_size(&c.m, b->pl);
    int64_t N = group_size(&c.nn, b->pl), K = group_size(&c.k, b->pl);
    mw__ins *in = emit(b, MW__I_GEMM, n->id);
    if (!in) return -1;
    mw__k_gemm *gm = &in->k.gemm;
    /* Swapped: C^T (N x M) = B^T (N x K) * A^T (K x M), the same kernel with the roles exchanged.
     */
    *gm = swap ? gemm_of(B, N, M, K, !trans_b, !trans_a) : gemm_of(B, M, N, K, trans_a, trans_b);
    in->ref.gemm.a = swap ? rb : ra;
    in->ref.gemm.b = swap ? ra : rb;
    in->ref.gemm.c = rc;
    gm->ab_dtype = ra.dtype;
    gm->c_dtype = rc.dtype;
    const mw_tensor *sum = c.sum;
    int addend = c.addend, residual = c.residual;
    if (c.epi_addend != EPI_NONE) {
        *(c.epi_addend == EPI_BIAS ? &in->ref.gemm.bias : &in->ref.gemm.addend) = b->ref[addend];
        if (residual >= 0)
            *(c.epi_residual == EPI_BIAS ? &in->ref.gemm.bias : &in->ref.gemm.addend) =
                b->ref[residual];
        addend = residual = -1;
    }
    if (addend >= 0 && !permute_out) {
        /* out = addend + A B: the addend goes into C first (broadcast as needed), then the GEMM
         * adds onto it, so the ADD costs no pass of its own. */
        mw__ins gemm = *in;
        b->p->nins--;
        const mw_tensor *x = b->g->nodes[addend];
        if (residual < 0) {
            if (emit_copy(b, sum->id, rc, &sum->type, b->ref[addend], &x->type, 1.0f)) return -1;
        } else if (emit_add(b, sum, rc, rc, &sum->type, addend, residual)) {
            return -1;
        }
        mw__ins *g2 = emit(b, MW__I_GEMM, n->id);
        if (!g2) return -1;
        *g2 = gemm;
        g2->k.gemm.beta = 1.0f;
    }
    if (permute_out && emit_copy(b, n->id, b->ref[n->id], &n->type, rc, &tc, 1.0f)) return -1;
    if (addend >= 0 && permute_out) {
        /* Rare: the product needed a permuting copy; add the addend (and the residual) in place
         * after it. */
        if (emit_add(b, sum, b->ref[n->id], b->ref[n->id], &sum->type, -1, addend)) return -1;
        if (residual >= 0 &&
            emit_add(b, sum, b->ref[n->id], b->ref[n->id], &sum->type, -1, residual))
            return -1;
    }
    for (int i = 0; i < 3; i++)
        if (tmp_off[i] >= 0 && arena_release(&b->ar, tmp_off[i], tmp_len[i])) return -1;
    return 0;
}

/* Strides of the larger tensor `big` of a slice/pad, over the dims of the smaller one; the sliced
 * axis sits at position `axis` of big (absent from small when len is 0). */
static void slice_strides(const mw_tensor *n, const ltype *big, int64_t *out, int small_rank) {
    for (int j = 0; j < small_rank; j++)
        out[j] = big->stride[n->p.slice.len == 0 && j >= n->p.slice.axis ? j + 1 : j];
}

static int lower_slice(builder *b, const mw_tensor *n, mw__ref out) {
    const mw_tensor *x = n->in[0];
    int slice = n->op == MW__OP_SLICE;
    const mw_tensor *big = slice ? x : n, *small = slice ? n : x;
    ltype lb = local_type(&big->type, b->pl), ls = local_type(&small->type, b->pl);
    mw__ref src = b->ref[x->id];
    if (!slice) {
        mw__ins *f = emit(b, MW__I_FILL, n->id);
        if (!f) return -1;
        f->ref.fill.out = out;
        f->k.fill = (mw__k_fill){.value = 0.0f, .count = lb.numel};
    }
    mw__ins *in = emit(b, MW__I_COPY, n->id);
    if (!in) return -1;
    int64_t shift = n->p.slice.start * lb.stride[n->p.slice.axis];
    in->ref.copy.out = out;
    in->ref.copy.a = src;
    if (slice)
        in->ref.copy.a.off += shift * mw__dtype_bytes(src.dtype);
    else
        in->ref.copy.out.off += shift * mw__dtype_bytes(out.dtype);
    in->k.copy.alpha = 1.0f;
    in->k.copy.out_dtype = out.dtype;
    in->k.copy.a_dtype = src.dtype;
    nd_over(&in->k.copy.nd, &small->type, &ls);
    if (slice) {
        memcpy(in->k.copy.nd.stride[0], ls.stride, sizeof ls.stride);
        slice_strides(n, &lb, in->k.copy.nd.stride[1], small->type.rank);
    } else {
        slice_strides(n, &lb, in->k.copy.nd.stride[0], small->type.rank);
        memcpy(in->k.copy.nd.stride[1], ls.stride, sizeof ls.stride);
    }
    mw__nd_simplify(&in->k.copy.nd, 2);
    return 0;
}

/* An instruction writing n's buffer and reading the buffers of n's inputs: its first roles, in
 * the order of the node's inputs (the instruction table's rule). */
static mw__ins *emit_io(builder *b, mw__ins_kind kind, const mw_tensor *n, mw__ref out) {
    mw__ins *in = emit(b, kind, n->id);
    if (!in) return NULL;
    in->ref.all[0] = out;
    for (int k = 0; k < n->nin && k + 1 < mw__ins_roles(kind); k++)
        in->ref.all[k + 1] = b->ref[n->in[k]->id];
    return in;
}

/* A node no kernel takes in this form: -2, with the message (-1 is out of memory). */
static int cannot_lower(const mw_tensor *n) {
    mw__error(MW_ERR_UNSUPPORTED, "cannot compile node %d (%s) to device kernels", n->id,
              mw__op_name(n->op));
    return -2;
}

/* Where the gradient node i (grad_of[i] >= 0) lives: its parameter's slot of the gradients. */
static mw__ref grad_ref(const builder *b, int i) {
    return mw__ref_at(MW__BASE_GRADS, MW_F32, b->p->params[b->grad_of[i]].off);
}

/* The first SUM after node `after` that gives a parameter's whole gradient (so that it lives in
 * the gradient buffer, can be written early, and its bucket closes after it) as the column sums
 * of src read as rows of its last axis, src's last axis kept; -1 when there is none. Kernels that
 * write src's rows (or read them) add them up too, row after row: the SUM's own order, the same
 * bits. */
static int row_sum_of(const builder *b, const char *live, int after, const mw_tensor *src) {
    ltype ls = local_type(&src->type, b->pl);
    const mw__axis *last = &src->type.ax[src->type.rank - 1];
    if (ls.stride[ls.rank - 1] != 1) return -1;
    for (int j = after + 1; j < b->g->nnodes; j++) {
        const mw_tensor *t = b->g->nodes[j];
        if (live[j] && b->grad_of[j] >= 0 && t->op == MW__OP_SUM && t->in[0] == src &&
            t->type.rank == 1 && t->type.ax[0].name == last->name &&
            t->type.ax[0].mesh == last->mesh &&
            local_type(&t->type, b->pl).numel == ls.size[ls.rank - 1])
            return j;
    }
    return -1;
}

/* Gradients written by the kernel that reads their input anyway, their own nodes then emitting
 * nothing (absorbed):
 * - a layer norm's three gradients in one pass over gy and x: an LN_DX node whose gy and x also
 *   feed a later LN_DW node giving a parameter's whole gradient, and whose gy the bias gradient
 *   sums (row_sum_of);
 * - a bias gradient summed from a GELU_GRAD node's output as that kernel writes it. */
static void find_fused_grads(builder *b, const char *live) {
    const mw_graph *g = b->g;
    for (int i = 0; i < g->nnodes; i++) b->ln_dw[i] = b->col_sum[i] = -1;
    for (int i = 0; i < g->nnodes; i++) {
        const mw_tensor *n = g->nodes[i];
        if (!live[i]) continue;
        if (n->op == MW__OP_GELU_GRAD) {
            int s = row_sum_of(b, live, i, n);
            if (s < 0) continue;
            b->col_sum[i] = s;
            b->absorbed[s] = 1;
        }
        if (n->op != MW__OP_LN_DX) continue;
        const mw_tensor *gy = n->in[0], *x = n->in[1];
        int dw = -1, db = row_sum_of(b, live, i, gy);
        for (int j = i + 1; j < g->nnodes && dw < 0; j++) {
            const mw_tensor *t = g->nodes[j];
            if (live[j] && b->grad_of[j] >= 0 && t->op == MW__OP_LN_DW && t->in[0] == gy &&
                t->in[1] == x && t->p.layernorm.eps == n->p.layernorm.eps)
                dw = j;
        }
        if (dw < 0 || db < 0) continue;
        b->ln_dw[i] = dw;
        b->col_sum[i] = db;
        b->absorbed[dw] = b->absorbed[db] = 1;
    }
}

static int lower_nn(builder *b, const mw_tensor *n, const ltype *lo, mw__ref out) {
    const ltype la = local_type(&n->in[0]->type, b->pl);
    mw__ins *in;
    switch (n->op) {
    case MW__OP_GELU:
        if (!(in = emit_io(b, MW__I_UNARY, n, out))) return -1;
        in->k.unary = (mw__k_unary){.op = n->p.gelu.exact ? MW__UN_GELU_ERF : MW__UN_GELU,
                                    .out_dtype = out.dtype,
                                    .count = lo->numel};
        return 0;
    case MW__OP_GELU_GRAD:
        if (!(in = emit_io(b, MW__I_UNARY_GRAD, n, out))) return -1;
        in->k.unary_grad = (mw__k_unary_grad){.op = n->p.gelu.exact ? MW__UN_GELU_ERF : MW__UN_GELU,
                                              .out_dtype = out.dtype,
                                              .count = lo->numel};
        if (b->col_sum[n->id] >= 0) {
            in->ref.unary_grad.colsum = grad_ref(b, b->col_sum[n->id]);
            in->k.unary_grad.cols = lo->size[lo->rank - 1];
        }
        return 0;
    case MW__OP_LAYERNORM:
    case MW__OP_LN_DX:
    case MW__OP_LN_DW: {
        /* Rows of the normalised (last) axis of x: input 0 for LAYERNORM, input 1 otherwise. */
        const ltype lx = local_type(&n->in[n->op == MW__OP_LAYERNORM ? 0 : 1]->type, b->pl);
        int64_t len = lx.size[lx.rank - 1], rows = lx.numel / len;
        mw__ins_kind kind = n->op == MW__OP_LAYERNORM ? MW__I_LAYERNORM
                            : n->op == MW__OP_LN_DX   ? MW__I_LAYERNORM_DX
                                                      : MW__I_LAYERNORM_DW;
        if (!(in = emit_io(b, kind, n, out))) return -1;
        mw__k_layernorm_grad grad = {.rows = rows, .n = len, .eps = n->p.layernorm.eps};
        if (kind == MW__I_LAYERNORM)
            in->k.layernorm = (mw__k_layernorm){
                .rows = rows, .n = len, .eps = n->p.layernorm.eps, .out_dtype = out.dtype};
        else if (kind == MW__I_LAYERNORM_DW)
            in->k.layernorm_dw = grad;
        else
            in->k.layernorm_dx = grad;
        if (kind == MW__I_LAYERNORM_DX) {
            if (b->ln_addend[n->id] >= 0) in->ref.layernorm_dx.addend = b->ref[b->ln_addend[n->id]];
            if (b->ln_dw[n->id] >= 0) {
                in->ref.layernorm_dx.dw = grad_ref(b, b->ln_dw[n->id]);
                in->ref.layernorm_dx.db = grad_ref(b, b->col_sum[n->id]);
            }
        }
        return 0;
    }
    case MW__OP_SOFTMAX:
    case MW__OP_SOFTMAX_GRAD: {
        int causal = n->p.softmax.causal;
        float scale = n->p.softmax.scale;
        int64_t k = lo->size[lo->rank - 1], s = causal ? lo->size[lo->rank - 2] : 1;
        int64_t outer = lo->numel / (k * s);
        if (n->op == MW__OP_SOFTMAX) {
            if (!(in = emit_io(b, MW__I_SOFTMAX, n, out))) return -1;
            in->k.softmax =
                (mw__k_softmax){.outer = outer, .s = s, .k = k, .causal = causal, .scale = scale};
        } else {
            if (!(in = emit_io(b, MW__I_SOFTMAX_GRAD, n, out))) return -1;
            in->k.softmax_grad = (mw__k_softmax_grad){
                .outer = outer, .s = s, .k = k, .causal = causal, .scale = scale};
        }
        return 0;
    }
    case MW__OP_EMBED:
    case MW__OP_EMBED_GRAD: {
        const mw_tensor *table = n->op == MW__OP_EMBED ? n->in[0] : n;
        const mw_tensor *ids = n->in[1];
        int64_t vocab = table->type.ax[0].size, dim = table->type.ax[1].size;
        int64_t nids = local_type(&ids->type, b->pl).numel;
        if (n->op == MW__OP_EMBED) {
            if (!(in = emit_io(b, MW__I_EMBED, n, out))) return -1;
            in->k.embed = (mw__k_embed){.n_ids = nids, .vocab = vocab, .dim = dim};
        } else {
            if (!(in = emit_io(b, MW__I_EMBED_GRAD, n, out))) return -1;
            in->k.embed_grad = (mw__k_embed_grad){.n_ids = nids, .vocab = vocab, .dim = dim};
        }
        return 0;
    }
    case MW__OP_XENT:
    case MW__OP_XENT_GRAD: {
        const ltype ll = n->op == MW__OP_XENT ? la : *lo;
        int64_t v = ll.size[ll.rank - 1], rows = ll.numel / v;
        if (n->op == MW__OP_XENT) {
            if (!(in = emit_io(b, MW__I_XENT, n, out))) return -1;
            in->k.xent = (mw__k_xent){.rows = rows, .v = v, .valid = n->p.xent.valid};
        } else {
            if (!(in = emit_io(b, MW__I_XENT_GRAD, n, out))) return -1;
            in->k.xent_grad = (mw__k_xent_grad){.rows = rows, .v = v, .valid = n->p.xent.valid};
        }
        return 0;
    }
    default: break;
    }
    return cannot_lower(n);
}

/* Floats of probabilities an ATTENTION node keeps for its gradient node: where the CPU kernels
 * run (host memory), the backward then reads them instead of recomputing the scores and their
 * softmax (about 15 % of the two kernels' time at llm.c's GPT-2 sizes). Kept only where they take
 * no more memory than qkv itself (causal: sequences up to about 6 x the head size), so a long
 * sequence still costs memory linear in its length; above that the backward recomputes them. */
static int64_t attn_probs(const builder *b, const mw_tensor *fwd) {
    if (!b->host_memory) return 0;
    const mw_tensor *qkv = fwd->in[0];
    ltype lq = local_type(&qkv->type, b->pl);
    const int seq = fwd->p.attention.seq, feature = fwd->p.attention.feature;
    int64_t t = lq.size[seq], blk = t < MW__ATTN_BLOCK ? t : MW__ATTN_BLOCK;
    int64_t slices = lq.numel / (t * lq.size[feature] * lq.size[fwd->p.attention.part]);
    int64_t n = slices * mw__attn_probs_per_slice(t, blk, fwd->p.attention.causal);
    return n <= lq.numel ? n : 0;
}

/* Fused attention: the strides of q/k/v and of the output within one (batch, head) slice, a walk
 * over the slices, and a scratch buffer for one block of scores (two in the backward pass), held
 * only while the kernel runs, and the probabilities the forward keeps (attn_probs). */
static int lower_attention(builder *b, const mw_tensor *n, mw__ref out) {
    int grad = n->op == MW__OP_ATTENTION_GRAD;
    const mw_tensor *qkv = n->in[grad ? 1 : 0];
    const mw_tensor *o = grad ? n->in[0] : n; /* a tensor of the attention's output type */
    ltype lq = local_type(&qkv->type, b->pl), lo = local_type(&o->type, b->pl);
    int p = n->p.attention.part, s = n->p.attention.seq, f = n->p.attention.feature;
    mw__k_attention k = {.causal = n->p.attention.causal,
                         .scale = n->p.attention.scale,
                         .t = lq.size[s],
                         .d = lq.size[f],
                         .seq_qkv = lq.stride[s],
                         .part = lq.stride[p]};
    /* The output's axes are qkv's without the part axis, in the same order. */
    int os = s - (s > p), of = f - (f > p);
    k.seq_out = lo.stride[os];
    if (lq.stride[f] != 1 || lo.stride[of] != 1) return cannot_lower(n);
    k.walk.rank = 0;
    for (int i = 0; i < qkv->type.rank; i++) {
        if (i == p || i == s || i == f) continue;
        int oi = i - (i > p);
        k.walk.dims[k.walk.rank] = lq.size[i];
        k.walk.stride[0][k.walk.rank] = lo.stride[oi];
        k.walk.stride[1][k.walk.rank] = lq.stride[i];
        k.walk.rank++;
    }
    /* CPU: one block of probabilities (and of their gradients), and last a slice's k and v
     * (backward also a block's q and dO) packed for its products; GPU backward: the log-sum-exp
     * and sum_j P_ij dP_ij of every row. */
    k.block = k.t < MW__ATTN_BLOCK ? k.t : MW__ATTN_BLOCK;
    k.slices = 1;
    for (int i = 0; i < k.walk.rank; i++) k.slices *= k.walk.dims[i];
    k.qkv_dtype = b->ref[qkv->id].dtype;
    k.out_dtype = out.dtype;
    /* CPU: a slice of bf16 q, k, v (and a bf16 output) staged in f32 (mw__k_attention). */
    int64_t stage = (k.qkv_dtype == MW_BF16 ? 3 * k.d * k.t : 0) +
                    (!grad && k.out_dtype == MW_BF16 ? k.d * k.t : 0);
    k.scratch_elems =
        grad ? 2 * k.block * k.t + 2 * k.slices * k.t + stage + 3 * k.d * k.t + 2 * k.block * k.d
             : k.block * k.t + stage + 2 * k.d * k.t;
    int64_t soff = arena_alloc(&b->ar, k.scratch_elems); /* floats */
    mw__ins *in = emit(b, grad ? MW__I_ATTENTION_GRAD : MW__I_ATTENTION, n->id);
    if (!in) return -1;
    /* The kept probabilities follow the forward node's value in its buffer. */
    const mw_tensor *fwd = grad ? n->in[2] : n;
    mw__ref probs = no_ref, scratch = arena_ref(MW_F32, soff);
    if (b->extra[fwd->id]) {
        mw__ref v = b->ref[fwd->id];
        probs =
            arena_ref(MW_F32, v.off / 4 + units_of(local_type(&fwd->type, b->pl).numel, v.dtype));
    }
    if (grad) {
        in->ref.attention_grad = (mw__refs_attention_grad){.out = out,
                                                           .gy = b->ref[n->in[0]->id],
                                                           .qkv = b->ref[n->in[1]->id],
                                                           .scratch = scratch,
                                                           .probs = probs};
        in->k.attention_grad = k;
    } else {
        in->ref.attention = (mw__refs_attention){
            .out = out, .qkv = b->ref[n->in[0]->id], .scratch = scratch, .probs = probs};
        in->k.attention = k;
    }
    return arena_release(&b->ar, soff, k.scratch_elems);
}

/* x's local extents viewed as [outer, n = axis `axis`, inner]. */
static void around_axis(const ltype *lx, int axis, int64_t *outer, int64_t *n, int64_t *inner) {
    *outer = *inner = 1;
    for (int i = 0; i < lx->rank; i++) {
        if (i < axis) *outer *= lx->size[i];
        if (i > axis) *inner *= lx->size[i];
    }
    *n = lx->size[axis];
}

/* The elementwise maps, dropout, the maxima along an axis, a state's write and cached attention. */
static int lower_indexed(builder *b, const mw_tensor *n, mw__ref out) {
    const mw__placement *pl = b->pl;
    ltype lo = local_type(&n->type, pl), la = local_type(&n->in[0]->type, pl);
    mw__ins *in;
    switch (n->op) {
    case MW__OP_MAP:
        if (!(in = emit_io(b, MW__I_MAP, n, out))) return -1;
        in->k.map = (mw__k_map){.fn = n->p.map.fn, .count = lo.numel};
        return 0;
    case MW__OP_MAP_GRAD:
        if (!(in = emit_io(b, MW__I_MAP_GRAD, n, out))) return -1;
        in->k.map_grad = (mw__k_map_grad){.fn = n->p.map.fn, .count = lo.numel};
        return 0;
    case MW__OP_DROPOUT: {
        if (!(in = emit_io(b, MW__I_DROPOUT, n, out))) return -1;
        /* The local box of the global tensor: the mask is drawn by global index. */
        mw__k_dropout *k = &in->k.dropout;
        *k = (mw__k_dropout){.p = n->p.dropout.p,
                             .seed = n->p.dropout.stream,
                             .rank = n->type.rank,
                             .count = lo.numel};
        mw__box box;
        mw__box_of(&n->type, pl, &box);
        int64_t gstride = 1;
        for (int i = n->type.rank - 1; i >= 0; i--) {
            k->len[i] = box.len[i];
            k->lo[i] = box.lo[i];
            k->gstride[i] = gstride;
            gstride *= box.global[i];
        }
        return 0;
    }
    case MW__OP_ARGMAX:
    case MW__OP_REDUCE_MAX: {
        int arg = n->op == MW__OP_ARGMAX;
        if (!(in = emit_io(b, arg ? MW__I_ARGMAX : MW__I_REDUCE_MAX, n, out))) return -1;
        mw__k_max k;
        memset(&k, 0, sizeof k);
        around_axis(&la, n->p.along.axis, &k.outer, &k.n, &k.inner);
        if (arg)
            in->k.argmax = k;
        else
            in->k.reduce_max = k;
        return 0;
    }
    case MW__OP_STATE_WRITE: /* (state, value, index): the state's buffer is written in place */
        if (!(in = emit(b, MW__I_STATE_WRITE, n->id))) return -1;
        in->ref.state_write = (mw__refs_state_write){
            .out = out, .value = b->ref[n->in[1]->id], .ids = b->ref[n->in[2]->id]};
        in->k.state_write = (mw__k_state_write){0};
        around_axis(&lo, n->p.along.axis, &in->k.state_write.outer, &in->k.state_write.n,
                    &in->k.state_write.inner);
        return 0;
    case MW__OP_ATTENTION_CACHED: { /* kv as [outer, n = seq, 2, heads, dim] */
        if (!(in = emit_io(b, MW__I_ATTENTION_CACHED, n, out))) return -1;
        ltype lkv = local_type(&n->in[1]->type, pl);
        mw__k_attention_cached *k = &in->k.attention_cached;
        *k = (mw__k_attention_cached){.outer = 1, .heads = 1, .scale = n->p.cached.scale};
        for (int i = 0; i < lkv.rank; i++) {
            if (i < n->p.cached.seq) k->outer *= lkv.size[i];
            if (i == n->p.cached.seq) k->n = lkv.size[i];
            if (i > n->p.cached.part && i < lkv.rank - 1) k->heads *= lkv.size[i];
            if (i == lkv.rank - 1) k->dim = lkv.size[i];
        }
        return 0;
    }
    default: break;
    }
    return cannot_lower(n);
}

static int lower_node(builder *b, const mw_tensor *n) {
    const mw__placement *pl = b->pl;
    ltype lo = local_type(&n->type, pl);
    mw__ref out = b->ref[n->id];
    switch (n->op) {
    case MW__OP_INPUT:
    case MW__OP_PARAM:
    case MW__OP_SHARD:
    case MW__OP_STATE:
    case MW__OP_ALIAS: return 0;
    case MW__OP_SLICE:
    case MW__OP_PAD: return lower_slice(b, n, out);
    case MW__OP_GELU:
    case MW__OP_GELU_GRAD:
    case MW__OP_LAYERNORM:
    case MW__OP_LN_DX:
    case MW__OP_LN_DW:
    case MW__OP_SOFTMAX:
    case MW__OP_SOFTMAX_GRAD:
    case MW__OP_EMBED:
    case MW__OP_EMBED_GRAD:
    case MW__OP_XENT:
    case MW__OP_XENT_GRAD: return lower_nn(b, n, &lo, out);
    case MW__OP_ATTENTION:
    case MW__OP_ATTENTION_GRAD: return lower_attention(b, n, out);
    case MW__OP_MAP:
    case MW__OP_MAP_GRAD:
    case MW__OP_DROPOUT:
    case MW__OP_ARGMAX:
    case MW__OP_REDUCE_MAX:
    case MW__OP_STATE_WRITE:
    case MW__OP_ATTENTION_CACHED: return lower_indexed(b, n, out);
    case MW__OP_FILL: {
        mw__ins *in = emit(b, MW__I_FILL, n->id);
        if (!in) return -1;
        in->ref.fill.out = out;
        in->k.fill = (mw__k_fill){.value = n->p.fill.value, .count = lo.numel};
        return 0;
    }
    case MW__OP_ADD:
    case MW__OP_SUB:
    case MW__OP_MUL:
    case MW__OP_DIV: {
        const mw_tensor *a = n->in[0], *c = n->in[1];
        ltype la = local_type(&a->type, pl), lc = local_type(&c->type, pl);
        mw__ins *in = emit(b, MW__I_BINARY, n->id);
        if (!in) return -1;
        in->ref.binary = (mw__refs_binary){.out = out, .a = b->ref[a->id], .b = b->ref[c->id]};
        in->k.binary.op = (mw__binop)(n->op - MW__OP_ADD);
        nd_over(&in->k.binary.nd, &n->type, &lo);
        memcpy(in->k.binary.nd.stride[0], lo.stride, sizeof lo.stride);
        map_strides(&n->type, &a->type, &la, in->k.binary.nd.stride[1]);
        map_strides(&n->type, &c->type, &lc, in->k.binary.nd.stride[2]);
        mw__nd_simplify(&in->k.binary.nd, 3);
        return 0;
    }
    case MW__OP_SCALE:
    case MW__OP_PERMUTE:
    case MW__OP_BROADCAST:
        return emit_copy(b, n->id, out, &n->type, b->ref[n->in[0]->id], &n->in[0]->type,
                         n->op == MW__OP_SCALE ? n->p.scale.factor : 1.0f);
    case MW__OP_SUM: {
        const mw_tensor *a = n->in[0];
        ltype la = local_type(&a->type, pl);
        mw__ins *in = emit(b, MW__I_REDUCE, n->id);
        if (!in) return -1;
        in->ref.reduce = (mw__refs_reduce){.out = out, .a = b->ref[a->id]};
        in->k.reduce.alpha = 1.0f;
        in->k.reduce.out_count = lo.numel;
        nd_over(&in->k.reduce.nd, &a->type, &la);
        map_strides(&a->type, &n->type, &lo, in->k.reduce.nd.stride[0]);
        memcpy(in->k.reduce.nd.stride[1], la.stride, sizeof la.stride);
        mw__nd_simplify(&in->k.reduce.nd, 2);
        return 0;
    }
    case MW__OP_ALLREDUCE: {
        if (emit_copy(b, n->id, out, &n->type, b->ref[n->in[0]->id], &n->in[0]->type, 1.0f))
            return -1;
        mw__ins *in = emit(b, MW__I_ALLREDUCE, n->id);
        if (!in) return -1;
        in->ref.collective.buf = out;
        in->count = lo.numel;
        in->group = n->in[0]->type.partial & ~n->type.partial; /* the sums it completes */
        return 0;
    }
    case MW__OP_CONTRACT: return lower_contract(b, n);
    case MW__OP_CAST: /* CAST_CONVERT: the others emit nothing */
        return emit_copy(b, n->id, out, &n->type, b->ref[n->in[0]->id], &n->in[0]->type, 1.0f);
    case MW__OP_COUNT: break;
    }
    return cannot_lower(n);
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
    b->ref[n->id] = mw__ref_at(MW__BASE_VIEW0 + p->nviews, n->type.dtype, 0);
    p->nviews++;
    return 0;
}

/* Whether t's axes are a subset of u's (by name and sharding). */
static int axes_within(const mw__type *t, const mw__type *u) {
    for (int i = 0; i < t->rank; i++)
        if (mw__type_find(u, &t->ax[i]) < 0) return 0;
    return 1;
}

static int same_layout(const mw__type *a, const mw__type *c) {
    if (a->rank != c->rank) return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->ax[i].name != c->ax[i].name || a->ax[i].mesh != c->ax[i].mesh) return 0;
    return 1;
}

/* An ADD another kernel may write instead: live, f32, nothing partial, not a parameter's
 * gradient (those live in the gradient buffer) and not taken over already. */
static int foldable_add(const builder *b, const char *live, const int *grad_of, int i) {
    const mw_tensor *n = b->g->nodes[i];
    return live[i] && n->op == MW__OP_ADD && !n->type.partial && grad_of[i] < 0 &&
           n->type.dtype == MW_F32 && b->fused[i] < 0;
}

/* Finds ADDs that a GEMM can absorb: out = x + y where y is (a rename or other alias of) a
 * contraction that nothing else reads, x was computed before that contraction and has no axis
 * the sum lacks, nothing is partial, and neither the sum nor the product is a parameter's
 * gradient (those live in the gradient buffer). The product is then written onto a copy of x:
 * bias adds (x . W + b) and residual adds (x + proj(h)). */
static void find_gemm_addends(builder *b, const char *live, const int *grad_of, int *uses) {
    const mw_graph *g = b->g;
    int nn = g->nnodes;
    for (int i = 0; i < nn; i++) b->addend[i] = b->fused[i] = b->addend2[i] = b->ln_addend[i] = -1;
    for (int i = 0; i < nn; i++)
        if (live[i])
            for (int k = 0; k < g->nodes[i]->nin; k++) uses[g->nodes[i]->in[k]->id]++;
    for (int i = 0; i < nn; i++) {
        const mw_tensor *n = g->nodes[i];
        if (!foldable_add(b, live, grad_of, i)) continue;
        for (int k = 0; k < 2; k++) {
            const mw_tensor *y = n->in[k], *x = n->in[1 - k], *c = y;
            while (c->op == MW__OP_ALIAS && uses[c->id] == 1) c = c->in[0];
            if (c->op != MW__OP_CONTRACT || uses[c->id] != 1 || c->type.partial ||
                grad_of[c->id] >= 0 || b->addend[c->id] >= 0 || x->id >= c->id || x->type.partial ||
                x->type.dtype != MW_F32 || !same_layout(&n->type, &y->type) ||
                !axes_within(&x->type, &n->type))
                continue;
            /* The copy into c's buffer walks c's type: x's axes must be found there too, under
             * the names the aliases gave them. Only renames that keep every axis are followed. */
            if (!same_layout(&c->type, &y->type)) {
                if (c->type.rank != y->type.rank) continue;
                int ok = 1;
                for (int a = 0; a < y->type.rank && ok; a++)
                    ok = c->type.ax[a].size == y->type.ax[a].size;
                if (!ok) continue;
            }
            b->addend[c->id] = i;
            b->fused[i] = c->id;
            break;
        }
    }
    /* A residual added to such a sum (x + (A B + b)): x goes into the product's buffer with the
     * first addend, where it has the sum's layout exactly (no broadcast) and was computed before
     * the contraction. */
    for (int i = 0; i < nn; i++) {
        const mw_tensor *n = g->nodes[i];
        if (!foldable_add(b, live, grad_of, i)) continue;
        for (int k = 0; k < 2; k++) {
            const mw_tensor *y = n->in[k], *x = n->in[1 - k], *s1 = y;
            while (s1->op == MW__OP_ALIAS && uses[s1->id] == 1) s1 = s1->in[0];
            if (s1->op != MW__OP_ADD || b->fused[s1->id] < 0 || uses[s1->id] != 1) continue;
            int c = b->fused[s1->id];
            if (b->addend2[c] >= 0 || x->id >= c || x->type.partial || x->type.dtype != MW_F32 ||
                !same_layout(&n->type, &y->type) || !same_layout(&x->type, &n->type) ||
                s1->type.rank != n->type.rank)
                continue;
            int ok = 1;
            for (int a = 0; a < n->type.rank && ok; a++)
                ok = s1->type.ax[a].size == n->type.ax[a].size &&
                     s1->type.ax[a].mesh == n->type.ax[a].mesh;
            if (!ok) continue;
            b->addend2[c] = i;
            b->fused[i] = c;
            break;
        }
    }
    /* A gradient added to a layer norm's input gradient (a residual stream's: g + dx): the dx
     * kernel adds g as it writes its rows, where g has the sum's layout and was computed first. */
    for (int i = 0; i < nn; i++) {
        const mw_tensor *n = g->nodes[i];
        if (!foldable_add(b, live, grad_of, i)) continue;
        for (int k = 0; k < 2; k++) {
            const mw_tensor *y = n->in[k], *x = n->in[1 - k];
            if (y->op != MW__OP_LN_DX || uses[y->id] != 1 || b->ln_addend[y->id] >= 0 ||
                grad_of[y->id] >= 0 || x->id >= y->id || x->type.partial ||
                x->type.dtype != MW_F32 || !same_layout(&n->type, &y->type) ||
                !same_layout(&x->type, &n->type))
                continue;
            b->ln_addend[y->id] = x->id;
            b->fused[i] = y->id;
            break;
        }
    }
}

/* The node whose buffer holds node i's value (through aliases and the ADDs a GEMM writes). */
static int owner_of(const builder *b, int i) {
    const mw_tensor *t = b->g->nodes[i];
    for (;;) {
        if (t->op == MW__OP_ALIAS)
            t = t->in[0];
        else if (b->fused[t->id] >= 0)
            t = b->g->nodes[b->fused[t->id]];
        else
            return t->id;
    }
}

/* The instruction a node's kernel is, when that kernel can write its output in bf16 (and the
 * device's does: target bf16_out); -1 otherwise. */
static int bf16_writer(const builder *b, const mw_tensor *t) {
    int kind = t->op == MW__OP_CONTRACT         ? MW__I_GEMM
               : t->op == MW__OP_LAYERNORM      ? MW__I_LAYERNORM
               : t->op == MW__OP_GELU           ? MW__I_UNARY
               : t->op == MW__OP_GELU_GRAD      ? MW__I_UNARY_GRAD
               : t->op == MW__OP_ATTENTION      ? MW__I_ATTENTION
               : t->op == MW__OP_ATTENTION_GRAD ? MW__I_ATTENTION_GRAD
                                                : -1;
    if (kind < 0 || !(b->bf16_out & (1u << kind))) return -1;
    if (t->op == MW__OP_CONTRACT) { /* a bf16 C of bf16 operands only (mw__k_gemm) */
        contraction c;
        analyse_contract(b, t, &c);
        if (!contract_writes_all(&c) || t->in[0]->type.dtype != MW_BF16) return -1;
    }
    return kind;
}

/* Casts to bf16 that need no pass of their own (see CAST_PARAM, CAST_FUSED); the rest convert.
 * A value is written in bf16 by its kernel when the cast is its only reader: nothing else reads
 * its buffer (an attention gradient's third input only locates the kept probabilities; a bias
 * gradient summed by the kernel itself is made from its f32 values), it is no parameter's
 * gradient and the host does not read it. Runs once b->root is known; sets the casts' roots. */
static void find_bf16_casts(builder *b, const char *live, const char *host_read) {
    const mw_graph *g = b->g;
    for (int i = 0; i < g->nnodes; i++) {
        const mw_tensor *c = g->nodes[i];
        if (!live[i] || c->op != MW__OP_CAST || c->type.dtype != MW_BF16) continue;
        const mw_tensor *src = c->in[0];
        while (src->op == MW__OP_ALIAS) src = src->in[0];
        if (src->op == MW__OP_PARAM) {
            b->cast[i] = CAST_PARAM;
            continue;
        }
        int r = owner_of(b, c->in[0]->id);
        const mw_tensor *t = g->nodes[r];
        if (b->buf16[r] || host_read[r] || b->grad_of[r] >= 0 || bf16_writer(b, t) < 0) continue;
        int readers = 0;
        for (int j = 0; j < g->nnodes && !readers; j++) {
            const mw_tensor *u = g->nodes[j];
            if (!live[j] || j == i || b->root[j] == r || j == b->col_sum[r]) continue;
            for (int k = 0; k < u->nin; k++)
                readers +=
                    b->root[u->in[k]->id] == r && !(u->op == MW__OP_ATTENTION_GRAD && k == 2);
        }
        if (readers) continue;
        b->cast[i] = CAST_FUSED;
        b->buf16[r] = 1;
        b->root[i] = b->root[c->in[0]->id];
    }
}

static int cmp_slot(const void *x, const void *y) {
    const mw__param_slot *a = *(const mw__param_slot *const *)x;
    const mw__param_slot *c = *(const mw__param_slot *const *)y;
    int ka = a->grad_node < 0 ? 1 << 30 : a->grad_node;
    int kc = c->grad_node < 0 ? 1 << 30 : c->grad_node;
    return (ka > kc) - (ka < kc);
}

mw_status mw__plan_build(const mw_graph *g, const mw_tensor *loss, mw_tensor *const *param_grads,
                         mw_tensor *const *outputs, int noutputs, const mw__placement *pl,
                         const mw__plan_target *target, mw__plan *out) {
    memset(out, 0, sizeof *out);
    int failed = 1, lowered = 0;
    int nn = g->nnodes;
    int host_memory = target->host_memory;
    int64_t bucket_elems = target->bucket_elems;
    builder b = {
        .g = g, .pl = pl, .p = out, .host_memory = host_memory, .bf16_out = target->bf16_out};
    char *live = mw__calloc((size_t)nn, 1);
    b.ref = mw__calloc((size_t)nn, sizeof *b.ref);
    b.in_arena = mw__calloc((size_t)nn, 1);
    b.last_use = mw__calloc((size_t)nn, sizeof *b.last_use);
    b.root = mw__calloc((size_t)nn, sizeof *b.root);
    b.addend = mw__calloc((size_t)nn + 1, sizeof *b.addend);
    b.fused = mw__calloc((size_t)nn + 1, sizeof *b.fused);
    b.addend2 = mw__calloc((size_t)nn + 1, sizeof *b.addend2);
    b.ln_addend = mw__calloc((size_t)nn + 1, sizeof *b.ln_addend);
    b.extra = mw__calloc((size_t)nn + 1, sizeof *b.extra);
    b.ln_dw = mw__calloc((size_t)nn + 1, sizeof *b.ln_dw);
    b.col_sum = mw__calloc((size_t)nn + 1, sizeof *b.col_sum);
    b.absorbed = mw__calloc((size_t)nn + 1, 1);
    b.cast = mw__calloc((size_t)nn + 1, 1);
    b.buf16 = mw__calloc((size_t)nn + 1, 1);
    char *host_read = mw__calloc((size_t)nn + 1, 1);
    int *uses = mw__calloc((size_t)nn + 1, sizeof *uses);
    int *grad_of =
        mw__malloc((size_t)nn * sizeof *grad_of); /* node -> parameter it is the grad of */
    mw__param_slot **order = mw__calloc((size_t)g->nparams + 1, sizeof *order);
    out->views = mw__calloc((size_t)g->ninputs * 4 + (size_t)nn, sizeof *out->views);
    out->params = mw__calloc((size_t)g->nparams + 1, sizeof *out->params);
    out->nparams = g->nparams;
    out->outputs = mw__calloc((size_t)noutputs + 1, sizeof *out->outputs);
    out->noutputs = noutputs;
    if (!out->outputs || !live || !b.ref || !b.in_arena || !b.last_use || !b.root || !grad_of ||
        !order || !out->views || !out->params || !b.addend || !b.fused || !b.addend2 ||
        !b.ln_addend || !b.extra || !b.ln_dw || !b.col_sum || !b.absorbed || !uses || !b.cast ||
        !b.buf16 || !host_read)
        goto oom;

    /* Live nodes: ancestors of the loss and of the gradients. */
    for (int i = 0; i < nn; i++) grad_of[i] = -1;
    live[loss->id] = 1;
    for (int o = 0; o < noutputs; o++) live[outputs[o]->id] = 1;
    for (int p = 0; p < g->nparams; p++)
        if (param_grads[p]) {
            live[param_grads[p]->id] = 1;
            grad_of[param_grads[p]->id] = p;
        }
    /* A state's writes are kept for the next run even where this one reads none of them. */
    for (int i = 0; i < nn; i++) live[i] |= g->nodes[i]->op == MW__OP_STATE_WRITE;
    for (int i = nn - 1; i >= 0; i--)
        if (live[i])
            for (int k = 0; k < g->nodes[i]->nin; k++) live[g->nodes[i]->in[k]->id] = 1;
    /* The loss and the outputs are read by the host: never absorbed into a GEMM. */
    uses[loss->id] += 2;
    for (int o = 0; o < noutputs; o++) uses[outputs[o]->id] += 2;
    find_gemm_addends(&b, live, grad_of, uses);
    b.grad_of = grad_of;
    find_fused_grads(&b, live);
    for (int i = 0; i < nn; i++) {
        const mw_tensor *t = g->nodes[i];
        b.root[i] = t->op == MW__OP_ALIAS || t->op == MW__OP_STATE_WRITE ? b.root[t->in[0]->id]
                    : b.fused[i] >= 0                                    ? b.root[b.fused[i]]
                                                                         : i;
    }
    host_read[b.root[loss->id]] = 1;
    for (int o = 0; o < noutputs; o++) host_read[b.root[outputs[o]->id]] = 1;
    find_bf16_casts(&b, live, host_read);
    for (int i = 0; i < nn; i++) {
        const mw_tensor *t = g->nodes[i];
        b.last_use[i] = i;
        if (!live[i]) continue;
        /* A buffer lives until the last use of any alias of it. */
        for (int k = 0; k < t->nin; k++) b.last_use[b.root[t->in[k]->id]] = i;
    }
    for (int i = 0; i < nn; i++) {
        const mw_tensor *t = g->nodes[i];
        if (live[i] && t->op == MW__OP_ATTENTION_GRAD)
            b.extra[t->in[2]->id] = attn_probs(&b, t->in[2]);
    }
    b.last_use[b.root[loss->id]] = nn; /* read by the host after the step */
    for (int o = 0; o < noutputs; o++) b.last_use[b.root[outputs[o]->id]] = nn;

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
        if (!live[i]) continue;
        if (t->op == MW__OP_STATE) { /* the states, one after another in node order */
            b.ref[i] = mw__ref_at(MW__BASE_STATE, MW_F32, out->state_elems);
            out->state_elems += local_type(&t->type, pl).numel;
        } else if (t->op == MW__OP_PARAM) {
            b.ref[i] = mw__ref_at(MW__BASE_PARAMS, MW_F32, out->params[t->leaf].off);
        } else if (t->op == MW__OP_CAST && b.cast[i] == CAST_PARAM) {
            const mw_tensor *p = t->in[0];
            while (p->op == MW__OP_ALIAS) p = p->in[0];
            out->params[p->leaf].bf16 = out->params16 = 1;
            b.ref[i] = mw__ref_at(MW__BASE_PARAMS16, MW_BF16, out->params[p->leaf].off);
        } else if (t->op == MW__OP_INPUT || t->op == MW__OP_SHARD) {
            /* A shard chain only needs the view of its last link. */
            int used = 0;
            for (int j = i + 1; j < nn && !used; j++)
                for (int k = 0; k < g->nodes[j]->nin; k++)
                    used |= live[j] && g->nodes[j]->in[k] == t && g->nodes[j]->op != MW__OP_SHARD;
            if (used && add_view(&b, t)) goto oom;
        }
    }

    /* Views that cannot be read in place get a staging buffer for the whole step. */
    for (int v = 0; v < out->nviews; v++) {
        mw__view *w = &out->views[v];
        w->staging = (mw__ref){MW__BASE_ARENA, w->dtype, -1};
        if (!w->contiguous || !host_memory)
            w->staging = arena_ref(w->dtype, arena_alloc(&b.ar, units_of(w->count, w->dtype)));
    }

    /* Gradient buckets: runs of consecutive slots partial over the same group, at most
     * bucket_elems long (a larger gradient is a bucket of its own), each reduced right after the
     * node that finishes its last gradient. */
    /* The forward pass ends with the loss or the last requested output, whichever is later. */
    int fwd_last = loss->id;
    for (int o = 0; o < noutputs; o++)
        if (outputs[o]->id > fwd_last) fwd_last = outputs[o]->id;
    int bucket_first = 0;
    int i_order = 0;
    for (int i = 0; i < nn; i++) {
        const mw_tensor *t = g->nodes[i];
        if (i == fwd_last + 1) out->fwd_end = out->nins;
        if (!live[i]) continue;
        if (t->op == MW__OP_ALIAS || (t->op == MW__OP_CAST && b.cast[i] == CAST_FUSED)) {
            b.ref[i] = b.ref[t->in[0]->id]; /* a fused cast: its input's kernel wrote bf16 */
        } else if (b.fused[i] >= 0) {
            b.ref[i] = b.ref[b.fused[i]]; /* the GEMM already wrote the sum there */
        } else if (t->op == MW__OP_STATE_WRITE) {
            b.ref[i] = b.ref[t->in[0]->id]; /* written in place */
            if ((lowered = lower_node(&b, t))) goto oom;
        } else if (t->op == MW__OP_CAST && b.cast[i] == CAST_PARAM) {
            /* the parameter's bf16 copy, set above */
        } else if (t->op != MW__OP_INPUT && t->op != MW__OP_PARAM && t->op != MW__OP_SHARD &&
                   t->op != MW__OP_STATE) {
            int64_t n = local_type(&t->type, pl).numel;
            if (grad_of[i] >= 0) {
                b.ref[i] = grad_ref(&b, i);
            } else {
                mw_dtype d = b.buf16[i] ? MW_BF16 : t->type.dtype;
                b.ref[i] = arena_ref(d, arena_alloc(&b.ar, units_of(n, d) + b.extra[i]));
                b.in_arena[i] = 1;
            }
            if (!b.absorbed[i] && (lowered = lower_node(&b, t))) goto oom;
        }
        for (int k = 0; k < t->nin; k++) {
            int a = b.root[t->in[k]->id];
            if (b.last_use[a] == i && b.in_arena[a]) {
                b.in_arena[a] = 0;
                if (arena_release(
                        &b.ar, b.ref[a].off / 4,
                        units_of(local_type(&g->nodes[a]->type, pl).numel, b.ref[a].dtype) +
                            b.extra[a]))
                    goto oom;
            }
        }
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
            mw__ins *in = emit(&b, MW__I_GRAD_BUCKET, i);
            if (!in) goto oom;
            in->ref.collective.buf = mw__ref_at(MW__BASE_GRADS, MW_F32, first->off);
            in->count = len;
            in->group = s->group;
            bucket_first = i_order;
        }
    }
    if (fwd_last + 1 >= nn) out->fwd_end = out->nins;
    out->bwd_end = out->nins;
    out->loss = b.ref[loss->id];
    for (int o = 0; o < noutputs; o++) out->outputs[o] = b.ref[outputs[o]->id];
    out->arena_bytes = b.ar.top * 4;
    failed = 0;
oom: /* every allocation failure above jumps here with failed still set */
    mw__free(live);
    mw__free(b.ref);
    mw__free(b.in_arena);
    mw__free(b.last_use);
    mw__free(b.root);
    mw__free(b.addend);
    mw__free(b.fused);
    mw__free(b.addend2);
    mw__free(b.ln_addend);
    mw__free(b.extra);
    mw__free(b.ln_dw);
    mw__free(b.col_sum);
    mw__free(b.absorbed);
    mw__free(b.cast);
    mw__free(b.buf16);
    mw__free(host_read);
    mw__free(uses);
    mw__free(grad_of);
    mw__free(order);
    mw__free(b.ar.free);
    if (!failed) return MW_OK;
    mw__plan_free(out);
    if (lowered == -2) return MW_ERR_UNSUPPORTED; /* cannot_lower's message */
    return mw__error(MW_ERR_NOMEM, "out of memory compiling the graph");
}

void mw__plan_free(mw__plan *p) {
    if (!p) return;
    mw__free(p->ins);
    mw__free(p->views);
    mw__free(p->params);
    mw__free(p->outputs);
    memset(p, 0, sizeof *p);
}
