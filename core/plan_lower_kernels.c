/* Lowering of the nodes that are one kernel each (GELU, layer and RMS norm, softmax, embedding,
 * cross-entropy and their gradients; attention; the indexed ops: maps, dropout, argmax, the
 * maximum, state writes, cached attention) and of the all-gathers and their adjoints, for
 * mw__plan_lower_node (plan_lower.c), which lowers contractions, slices, copies, element-wise
 * arithmetic and sums itself. */
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/plan_impl.h"

/* An instruction writing n's buffer and reading the buffers of n's inputs: its first roles, in
 * the order of the node's inputs (the instruction table's rule). */
static mw__ins *emit_io(builder *b, mw__ins_kind kind, const mw_tensor *n, mw__ref out) {
    mw__ins *in = mw__plan_emit(b, kind, n->id);
    if (!in) return NULL;
    in->ref.all[0] = out;
    for (int k = 0; k < n->nin && k + 1 < mw__ins_roles(kind); k++)
        in->ref.all[k + 1] = b->node[n->in[k]->id].ref;
    return in;
}

/* A node no kernel takes in this form: -2, with the message (-1 is out of memory). */
int mw__plan_cannot_lower(const mw_tensor *n) {
    mw__error(MW_ERR_UNSUPPORTED, "cannot compile node %d (%s) to device kernels", n->id,
              mw__op_name(n->op));
    return -2;
}

/* The unary kernel's function of a GELU or SiLU node (or their gradients'). */
static mw__unop unop_of(const mw_tensor *n) {
    if (n->op == MW__OP_SILU || n->op == MW__OP_SILU_GRAD) return MW__UN_SILU;
    return n->p.gelu.exact ? MW__UN_GELU_ERF : MW__UN_GELU;
}

/* The frequencies of a ROPE node's rotation (devices/math.h). */
static mw__rope_freqs rope_freqs(const mw_tensor *n) {
    return (mw__rope_freqs){.theta = n->p.rope.theta,
                            .factor = n->p.rope.factor,
                            .low = n->p.rope.low,
                            .high = n->p.rope.high,
                            .original = n->p.rope.original,
                            .dims = n->p.rope.dims,
                            .llama3 = n->p.rope.scaling == MW_ROPE_SCALING_LLAMA3};
}

/* Rotary embeddings (or their gradient) over the rows of n's last axis: where each row's
 * position comes from (its index along the sequence axis, the entry of pos its leading axes
 * pick). */
static int lower_rope(builder *b, const mw_tensor *n, mw__ref out) {
    const ltype lx = local_type(&n->in[0]->type, b->pl);
    int64_t feat = lx.size[lx.rank - 1], rows = feat ? lx.numel / feat : 0;
    int s = n->p.rope.seq;
    mw__ins *in = emit_io(b, MW__I_ROPE, n, out);
    if (!in) return -1;
    mw__k_rope k = {.rows = rows,
                    .n = feat,
                    .inner = s >= 0 && feat ? lx.stride[s] / feat : 1,
                    .seq = s >= 0 ? lx.size[s] : 1,
                    .prefix = rows,
                    .offset = n->p.rope.offset,
                    .dims = n->p.rope.dims,
                    .style = n->p.rope.style,
                    .inverse = n->op == MW__OP_ROPE_GRAD,
                    .freqs = rope_freqs(n),
                    .out_dtype = out.dtype};
    int lead = n->nin > 1 ? n->in[1]->type.rank : 0;
    if (lead > 0 && feat) k.prefix = lx.stride[lead - 1] / feat;
    int part = n->p.rope.part;
    if (part >= 0 && feat) {
        k.part_inner = lx.stride[part] / feat;
        k.part_size = lx.size[part];
        k.parts = n->p.rope.parts;
    }
    in->k.rope = k;
    return 0;
}

int mw__plan_lower_nn(builder *b, const mw_tensor *n, const ltype *lo, mw__ref out) {
    const ltype la = local_type(&n->in[0]->type, b->pl);
    mw__ins *in;
    switch (n->op) {
    case MW__OP_GELU:
    case MW__OP_SILU:
        if (!(in = emit_io(b, MW__I_UNARY, n, out))) return -1;
        in->k.unary = (mw__k_unary){.op = unop_of(n), .out_dtype = out.dtype, .count = lo->numel};
        return 0;
    case MW__OP_GELU_GRAD:
    case MW__OP_SILU_GRAD:
        if (!(in = emit_io(b, MW__I_UNARY_GRAD, n, out))) return -1;
        in->k.unary_grad =
            (mw__k_unary_grad){.op = unop_of(n), .out_dtype = out.dtype, .count = lo->numel};
        if (b->fuse[n->id].col_sum >= 0) {
            in->ref.unary_grad.colsum = grad_ref(b, b->fuse[n->id].col_sum);
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
            if (b->fuse[n->id].ln_addend >= 0)
                in->ref.layernorm_dx.addend = b->node[b->fuse[n->id].ln_addend].ref;
            if (b->fuse[n->id].ln_dw >= 0) {
                in->ref.layernorm_dx.dw = grad_ref(b, b->fuse[n->id].ln_dw);
                if (b->fuse[n->id].col_sum >= 0) /* none: no bias, or its gradient unwanted */
                    in->ref.layernorm_dx.db = grad_ref(b, b->fuse[n->id].col_sum);
            }
        }
        return 0;
    }
    case MW__OP_RMSNORM:
    case MW__OP_RMSNORM_DX:
    case MW__OP_RMSNORM_DW: {
        /* Rows of the normalised (last) axis of x: input 0 for RMSNORM, input 1 otherwise. */
        const ltype lx = local_type(&n->in[n->op == MW__OP_RMSNORM ? 0 : 1]->type, b->pl);
        int64_t len = lx.size[lx.rank - 1], rows = lx.numel / len;
        float eps = n->p.rmsnorm.eps;
        mw__ins_kind kind = n->op == MW__OP_RMSNORM      ? MW__I_RMSNORM
                            : n->op == MW__OP_RMSNORM_DX ? MW__I_RMSNORM_DX
                                                         : MW__I_RMSNORM_DW;
        if (!(in = emit_io(b, kind, n, out))) return -1;
        mw__k_rmsnorm_grad grad = {.rows = rows, .n = len, .eps = eps};
        if (kind == MW__I_RMSNORM)
            in->k.rmsnorm =
                (mw__k_rmsnorm){.rows = rows, .n = len, .eps = eps, .out_dtype = out.dtype};
        else if (kind == MW__I_RMSNORM_DW)
            in->k.rmsnorm_dw = grad;
        else {
            in->k.rmsnorm_dx = grad;
            const fusion *fu = &b->fuse[n->id];
            if (fu->ln_addend >= 0) in->ref.rmsnorm_dx.addend = b->node[fu->ln_addend].ref;
            if (fu->ln_dw >= 0) in->ref.rmsnorm_dx.dw = grad_ref(b, fu->ln_dw);
        }
        return 0;
    }
    case MW__OP_SWIGLU:
    case MW__OP_SWIGLU_GRAD: {
        /* x: blocks of a gate row and an up row, each the part axis's stride long */
        const ltype lx = local_type(&n->in[n->op == MW__OP_SWIGLU ? 0 : 1]->type, b->pl);
        int64_t inner = lx.stride[n->p.along.axis];
        int grad = n->op == MW__OP_SWIGLU_GRAD;
        if (!(in = emit_io(b, grad ? MW__I_SWIGLU_GRAD : MW__I_SWIGLU, n, out))) return -1;
        mw__k_swiglu k = {
            .outer = inner ? lx.numel / (2 * inner) : 0, .inner = inner, .out_dtype = out.dtype};
        if (grad)
            in->k.swiglu_grad = k;
        else
            in->k.swiglu = k;
        return 0;
    }
    case MW__OP_ROPE:
    case MW__OP_ROPE_GRAD: return lower_rope(b, n, out);
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
    return mw__plan_cannot_lower(n);
}

/* Fused attention: the strides of q/k/v and of the output within one (batch, head) slice, a walk
 * over the slices, and a scratch buffer for one block of scores (two in the backward pass), held
 * only while the kernel runs, and the probabilities the forward keeps (attn_probs). */
int mw__plan_lower_attention(builder *b, const mw_tensor *n, mw__ref out) {
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
    /* The output's axes are qkv's without the part axis (grouped: with the group axis in its
     * place), in the same order. */
    int keep = n->p.attention.keep, os = keep ? s : s - (s > p), of = keep ? f : f - (f > p);
    k.seq_out = lo.stride[os];
    k.group = n->p.attention.group > 0 ? n->p.attention.group : 1;
    k.out_group = keep ? lo.stride[p] : 0;
    if (lq.stride[f] != 1 || lo.stride[of] != 1) return mw__plan_cannot_lower(n);
    k.walk.rank = 0;
    for (int i = 0; i < qkv->type.rank; i++) {
        if (i == p || i == s || i == f) continue;
        int oi = keep ? i : i - (i > p);
        k.walk.dims[k.walk.rank] = lq.size[i];
        k.walk.stride[0][k.walk.rank] = lo.stride[oi];
        k.walk.stride[1][k.walk.rank] = lq.stride[i];
        k.walk.rank++;
    }
    k.block = k.t < MW__ATTN_BLOCK ? k.t : MW__ATTN_BLOCK;
    k.slices = 1;
    for (int i = 0; i < k.walk.rank; i++) k.slices *= k.walk.dims[i];
    k.qkv_dtype = b->node[qkv->id].ref.dtype;
    k.out_dtype = out.dtype;
    if (b->fuse[n->id].rotary >= 0) {
        /* qkv's buffer is the f32 projection the ROPE would have rotated (find_rotary); the
         * products read qkv's own dtype */
        const mw_tensor *r = b->g->nodes[b->fuse[n->id].rotary];
        k.qkv_dtype = qkv->type.dtype;
        k.rope.dims = r->p.rope.dims;
        k.rope.style = r->p.rope.style;
        k.rope.offset = r->p.rope.offset;
        k.rope.freqs = rope_freqs(r);
        if (b->node[qkv->id].ref.dtype != MW_F32) return mw__plan_cannot_lower(n);
    }
    k.scratch_elems = mw__attn_scratch_elems(&k, grad);
    int64_t soff = mw__arena_alloc(&b->ar, k.scratch_elems); /* floats */
    mw__ins *in = mw__plan_emit(b, grad ? MW__I_ATTENTION_GRAD : MW__I_ATTENTION, n->id);
    if (!in) return -1;
    /* The kept probabilities follow the forward node's value in its buffer. */
    const mw_tensor *fwd = grad ? n->in[2] : n;
    mw__ref probs = no_ref, scratch = arena_ref(MW_F32, soff);
    if (b->fuse[fwd->id].extra) {
        mw__ref v = b->node[fwd->id].ref;
        probs =
            arena_ref(MW_F32, v.off / 4 + units_of(local_type(&fwd->type, b->pl).numel, v.dtype));
    }
    if (grad) {
        in->ref.attention_grad = (mw__refs_attention_grad){.out = out,
                                                           .gy = b->node[n->in[0]->id].ref,
                                                           .qkv = b->node[n->in[1]->id].ref,
                                                           .scratch = scratch,
                                                           .probs = probs};
        in->k.attention_grad = k;
    } else {
        in->ref.attention = (mw__refs_attention){
            .out = out, .qkv = b->node[n->in[0]->id].ref, .scratch = scratch, .probs = probs};
        in->k.attention = k;
    }
    return mw__arena_release(&b->ar, soff, k.scratch_elems);
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
int mw__plan_lower_indexed(builder *b, const mw_tensor *n, mw__ref out) {
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
        if (!(in = mw__plan_emit(b, MW__I_STATE_WRITE, n->id))) return -1;
        in->ref.state_write = (mw__refs_state_write){
            .out = out, .value = b->node[n->in[1]->id].ref, .ids = b->node[n->in[2]->id].ref};
        in->k.state_write = (mw__k_state_write){0};
        around_axis(&lo, n->p.along.axis, &in->k.state_write.outer, &in->k.state_write.n,
                    &in->k.state_write.inner);
        return 0;
    case MW__OP_ATTENTION_CACHED: { /* kv as [outer, n = seq, 2, heads, dim] */
        if (!(in = emit_io(b, MW__I_ATTENTION_CACHED, n, out))) return -1;
        ltype lkv = local_type(&n->in[1]->type, pl);
        mw__k_attention_cached *k = &in->k.attention_cached;
        *k = (mw__k_attention_cached){
            .outer = 1, .heads = 1, .group = 1, .scale = n->p.cached.scale};
        for (int i = 0; i < lkv.rank; i++) {
            if (i < n->p.cached.seq) k->outer *= lkv.size[i];
            if (i == n->p.cached.seq) k->n = lkv.size[i];
            if (i > n->p.cached.part && i < lkv.rank - 1) k->heads *= lkv.size[i];
            if (i == lkv.rank - 1) k->dim = lkv.size[i];
        }
        const mw_tensor *q = n->in[0]; /* grouped: an axis more than kv's without seq and part */
        if (q->type.rank == n->in[1]->type.rank - 1) k->group = q->type.ax[q->type.rank - 2].size;
        return 0;
    }
    default: break;
    }
    return mw__plan_cannot_lower(n);
}

/* A copy over the dims of `lx` (a local shape) from strides `in` to strides `out`. */
static int emit_strided_copy(builder *b, int node, mw__ref to, const int64_t *out, mw__ref from,
                             const int64_t *in, const ltype *lx) {
    mw__ins *c = mw__plan_emit(b, MW__I_COPY, node);
    if (!c) return -1;
    c->ref.copy.out = to;
    c->ref.copy.a = from;
    c->k.copy = (mw__k_copy){.alpha = 1.0f, .out_dtype = to.dtype, .a_dtype = from.dtype};
    c->k.copy.nd.rank = lx->rank;
    for (int d = 0; d < lx->rank; d++) {
        c->k.copy.nd.dims[d] = lx->size[d];
        c->k.copy.nd.stride[0][d] = out[d];
        c->k.copy.nd.stride[1][d] = in[d];
    }
    mw__nd_simplify(&c->k.copy.nd, 2);
    return 0;
}

/* FSDP (core/ops_fsdp.c). A collective moves whole rows of the split axis i: the device at
 * coordinate r owns rows split_lo(r) .. split_lo(r + 1). When i is the first axis those are one run
 * of the array; otherwise the values go through scratch laid out with axis i first (the others in
 * order, at their local sizes: another mesh axis may split them).
 * GATHER: this device's rows into their place, an in-place all-gather, and, through scratch, the
 * result in the output's layout.
 * SCATTER: where the whole gradient is partial over the split's mesh axis, its sum over the
 * devices along it (an in-place reduce-scatter: in the gradient's own buffer when the first axis
 * is split and nothing reads the buffer after, else in scratch); then this device's rows. part:
 * which of it (MW__GATHER_WHOLE, _BEGIN, _END: plan_impl.h). */
int mw__plan_lower_gather(builder *b, const mw_tensor *n, mw__ref out, int part) {
    int gather = n->op == MW__OP_GATHER, i = n->p.along.axis;
    const mw_tensor *whole = gather ? n : n->in[0], *split = gather ? n->in[0] : n;
    const mw__axis *ax = &split->type.ax[i];
    int m = ax->mesh, parts = b->pl->size[m], c = b->pl->coord[m];
    ltype lw = local_type(&whole->type, b->pl), ls = local_type(&split->type, b->pl);
    int64_t row_elems = ax->size ? lw.numel / ax->size : 0, lo = mw__split_lo(ax->size, parts, c);
    /* Strides of the layout with axis i first (the whole array's when i is the first). */
    int64_t major[MW_MAX_RANK], step = 1;
    for (int d = lw.rank - 1; d >= 0; d--)
        if (d != i) major[d] = step, step *= lw.size[d];
    major[i] = row_elems;
    mw__ref in = b->node[n->in[0]->id].ref;
    int first = i == 0, partial = !gather && (n->in[0]->type.partial & (1u << m));
    int64_t tmp = -1, tmp_units = units_of(lw.numel, MW_F32);
    const node_info *src = &b->node[n->in[0]->id];
    int in_place =
        gather ? first
               : first && src->root == n->in[0]->id && src->in_arena && src->last_use == n->id;
    if (part == MW__GATHER_BEGIN && in_place) { /* the collective works in the output itself */
        mw__plan_assign(b, n->id);
        out = b->node[n->id].ref;
    }
    mw__ref buf = gather ? out : in; /* the buffer the collective works in */
    if (!in_place && (gather || partial)) {
        tmp = part == MW__GATHER_END ? b->node[n->id].tmp : mw__arena_alloc(&b->ar, tmp_units);
        buf = arena_ref(MW_F32, tmp);
        if (!gather && emit_strided_copy(b, n->id, buf, major, in, lw.stride, &lw)) return -1;
    }
    mw__ref rows = buf; /* this device's rows within buf */
    rows.off += lo * row_elems * 4;
    if (gather && part != MW__GATHER_END &&
        emit_strided_copy(b, n->id, rows, major, in, ls.stride, &ls))
        return -1;
    if (gather || partial) {
        mw__ins_kind kind = !gather                    ? MW__I_REDUCE_SCATTER
                            : part == MW__GATHER_WHOLE ? MW__I_ALLGATHER
                            : part == MW__GATHER_BEGIN ? MW__I_GATHER_START
                                                       : MW__I_GATHER_WAIT;
        mw__ins *k = mw__plan_emit(b, kind, n->id);
        if (!k) return -1;
        k->ref.collective.buf = buf;
        k->count = lw.numel;
        k->group = 1u << m;
        k->rows = ax->size, k->row_elems = row_elems, k->parts = parts;
    }
    if (part == MW__GATHER_BEGIN) { /* the output of one through scratch is assigned at its turn */
        b->node[n->id].started = in_place ? 2 : 1;
        b->node[n->id].tmp = tmp;
        return 0;
    }
    if (gather) {
        if (!in_place && emit_strided_copy(b, n->id, out, lw.stride, buf, major, &lw)) return -1;
    } else {
        /* From the whole gradient (f32 in its own layout, or axis-i-major in scratch). */
        const int64_t *from = buf.off == in.off && buf.base == in.base ? lw.stride : major;
        mw__ref at = buf;
        at.off += lo * (from == major ? row_elems : lw.stride[i]) * 4;
        if (emit_strided_copy(b, n->id, out, ls.stride, at, from, &ls)) return -1;
    }
    return tmp >= 0 ? mw__arena_release(&b->ar, tmp, tmp_units) : 0;
}

int mw__plan_start_gather(builder *b, const mw_tensor *n) {
    return mw__plan_lower_gather(b, n, no_ref, MW__GATHER_BEGIN);
}
