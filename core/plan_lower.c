/* Lowering: each node of a compiled graph to device kernels (contractions to batched GEMMs with
 * the epilogues its fusion record chose, layer norms, attention, ...) and collectives, reading
 * and writing the buffers the plan assigned (b->node[].ref). */
#include "core/alloc.h"
#include "core/error.h"
#include "core/plan_impl.h"

mw__ins *mw__plan_emit(builder *b, mw__ins_kind kind, int node) {
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
    mw__ins *in = mw__plan_emit(b, MW__I_COPY, node);
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
    return mw__arena_alloc(&b->ar, *len);
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

/* out = a + c over the type t of the sum `sum` (the product's layout): a is node `a` mapped onto
 * t by name (broadcast as needed), or, when a < 0, what `in` already holds in t's layout; c is
 * node `c` mapped by name, or positionally when it has t's layout under other names (a residual
 * added after a rename). */
static int emit_add(builder *b, const mw_tensor *sum, mw__ref out, mw__ref in, const mw__type *t,
                    int a, int c) {
    ltype lo = local_type(t, b->pl);
    mw__ins *add = mw__plan_emit(b, MW__I_BINARY, sum->id);
    if (!add) return -1;
    add->ref.binary.out = out;
    add->ref.binary.a = a >= 0 ? b->node[a].ref : in;
    add->ref.binary.b = b->node[c].ref;
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

/* Lowers out = contract(a, b) to a batched GEMM over groups Bt (batch), M, N, K, permuting an
 * operand into scratch only when its layout is not one of the two that GEMM reads directly. */
static int lower_contract(builder *b, const mw_tensor *n) {
    const mw_tensor *ta = n->in[0], *tb = n->in[1];
    contraction c;
    mw__plan_contraction(b, n, &c);
    int64_t tmp_off[3] = {-1, -1, -1}, tmp_len[3] = {0};
    mw__ref ra = b->node[ta->id].ref, rb = b->node[tb->id].ref, rc = b->node[n->id].ref;
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
    mw__ins *in = mw__plan_emit(b, MW__I_GEMM, n->id);
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
        *(c.epi_addend == EPI_BIAS ? &in->ref.gemm.bias : &in->ref.gemm.addend) =
            b->node[addend].ref;
        if (residual >= 0)
            *(c.epi_residual == EPI_BIAS ? &in->ref.gemm.bias : &in->ref.gemm.addend) =
                b->node[residual].ref;
        addend = residual = -1;
    }
    if (addend >= 0 && !permute_out) {
        /* out = addend + A B: the addend goes into C first (broadcast as needed), then the GEMM
         * adds onto it, so the ADD costs no pass of its own. */
        mw__ins gemm = *in;
        b->p->nins--;
        const mw_tensor *x = b->g->nodes[addend];
        if (residual < 0) {
            if (emit_copy(b, sum->id, rc, &sum->type, b->node[addend].ref, &x->type, 1.0f))
                return -1;
        } else if (emit_add(b, sum, rc, rc, &sum->type, addend, residual)) {
            return -1;
        }
        mw__ins *g2 = mw__plan_emit(b, MW__I_GEMM, n->id);
        if (!g2) return -1;
        *g2 = gemm;
        g2->k.gemm.beta = 1.0f;
    }
    if (permute_out && emit_copy(b, n->id, b->node[n->id].ref, &n->type, rc, &tc, 1.0f)) return -1;
    if (addend >= 0 && permute_out) {
        /* Rare: the product needed a permuting copy; add the addend (and the residual) in place
         * after it. */
        if (emit_add(b, sum, b->node[n->id].ref, b->node[n->id].ref, &sum->type, -1, addend))
            return -1;
        if (residual >= 0 &&
            emit_add(b, sum, b->node[n->id].ref, b->node[n->id].ref, &sum->type, -1, residual))
            return -1;
    }
    for (int i = 0; i < 3; i++)
        if (tmp_off[i] >= 0 && mw__arena_release(&b->ar, tmp_off[i], tmp_len[i])) return -1;
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
    mw__ref src = b->node[x->id].ref;
    if (!slice) {
        mw__ins *f = mw__plan_emit(b, MW__I_FILL, n->id);
        if (!f) return -1;
        f->ref.fill.out = out;
        f->k.fill = (mw__k_fill){.value = 0.0f, .count = lb.numel};
    }
    mw__ins *in = mw__plan_emit(b, MW__I_COPY, n->id);
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

int mw__plan_lower_node(builder *b, const mw_tensor *n) {
    const mw__placement *pl = b->pl;
    ltype lo = local_type(&n->type, pl);
    mw__ref out = b->node[n->id].ref;
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
    case MW__OP_RMSNORM:
    case MW__OP_RMSNORM_DX:
    case MW__OP_RMSNORM_DW:
    case MW__OP_SILU:
    case MW__OP_SILU_GRAD:
    case MW__OP_SWIGLU:
    case MW__OP_SWIGLU_GRAD:
    case MW__OP_ROPE:
    case MW__OP_ROPE_GRAD:
    case MW__OP_SOFTMAX:
    case MW__OP_SOFTMAX_GRAD:
    case MW__OP_EMBED:
    case MW__OP_EMBED_GRAD:
    case MW__OP_XENT:
    case MW__OP_XENT_GRAD: return mw__plan_lower_nn(b, n, &lo, out);
    case MW__OP_ATTENTION:
    case MW__OP_ATTENTION_GRAD: return mw__plan_lower_attention(b, n, out);
    case MW__OP_MAP:
    case MW__OP_MAP_GRAD:
    case MW__OP_DROPOUT:
    case MW__OP_ARGMAX:
    case MW__OP_REDUCE_MAX:
    case MW__OP_STATE_WRITE:
    case MW__OP_ATTENTION_CACHED: return mw__plan_lower_indexed(b, n, out);
    case MW__OP_GATHER:
    case MW__OP_SCATTER:
        return mw__plan_lower_gather(b, n, out,
                                     b->node[n->id].started ? MW__GATHER_END : MW__GATHER_WHOLE);
    case MW__OP_FILL: {
        mw__ins *in = mw__plan_emit(b, MW__I_FILL, n->id);
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
        mw__ins *in = mw__plan_emit(b, MW__I_BINARY, n->id);
        if (!in) return -1;
        in->ref.binary =
            (mw__refs_binary){.out = out, .a = b->node[a->id].ref, .b = b->node[c->id].ref};
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
        return emit_copy(b, n->id, out, &n->type, b->node[n->in[0]->id].ref, &n->in[0]->type,
                         n->op == MW__OP_SCALE ? n->p.scale.factor : 1.0f);
    case MW__OP_SUM: {
        const mw_tensor *a = n->in[0];
        ltype la = local_type(&a->type, pl);
        mw__ins *in = mw__plan_emit(b, MW__I_REDUCE, n->id);
        if (!in) return -1;
        in->ref.reduce = (mw__refs_reduce){.out = out, .a = b->node[a->id].ref};
        in->k.reduce.alpha = 1.0f;
        in->k.reduce.out_count = lo.numel;
        nd_over(&in->k.reduce.nd, &a->type, &la);
        map_strides(&a->type, &n->type, &lo, in->k.reduce.nd.stride[0]);
        memcpy(in->k.reduce.nd.stride[1], la.stride, sizeof la.stride);
        mw__nd_simplify(&in->k.reduce.nd, 2);
        return 0;
    }
    case MW__OP_ALLREDUCE: {
        if (emit_copy(b, n->id, out, &n->type, b->node[n->in[0]->id].ref, &n->in[0]->type, 1.0f))
            return -1;
        mw__ins *in = mw__plan_emit(b, MW__I_ALLREDUCE, n->id);
        if (!in) return -1;
        in->ref.collective.buf = out;
        in->count = lo.numel;
        in->group = n->in[0]->type.partial & ~n->type.partial; /* the sums it completes */
        return 0;
    }
    case MW__OP_CONTRACT: return lower_contract(b, n);
    case MW__OP_CAST: /* CAST_CONVERT: the others emit nothing */
        return emit_copy(b, n->id, out, &n->type, b->node[n->in[0]->id].ref, &n->in[0]->type, 1.0f);
    case MW__OP_COUNT: break;
    }
    return mw__plan_cannot_lower(n);
}
