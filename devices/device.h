/* Internal: the device interface. A backend is a table of functions (NULL = not supported); core
 * code lowers every graph node to the kernels below and never includes a backend's own headers.
 *
 * Threading: every function is called from the thread that runs the device (its worker thread;
 * for the first CPU device of a one-process mesh, whichever thread calls the trainer), except
 * alloc/free and the copies, which the host may also call while that thread is idle; a backend
 * binds its device itself where it has to (CUDA: cudaSetDevice). Kernels run in order on the
 * device's stream; sync() waits for all of them. */
#ifndef MW__DEVICE_H
#define MW__DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "devices/math.h"
#include "meshwit/graph.h"
#include "meshwit/status.h"

#define MW__ND_MAX MW_MAX_RANK

/* A strided walk over an n-d index space: dims[] is the space, stride[k][] the element stride of
 * operand k along each dim (0 = broadcast). Operand 0 is the output. */
typedef struct mw__nd {
    int rank;
    int64_t dims[MW__ND_MAX];
    int64_t stride[3][MW__ND_MAX];
} mw__nd;

typedef enum mw__binop { MW__BIN_ADD, MW__BIN_SUB, MW__BIN_MUL, MW__BIN_DIV } mw__binop;

/* out[i] = a[i] op b[i] over nd (operands 0, 1, 2 = out, a, b). out may be a or b, with the same
 * strides (in place). */
typedef struct mw__k_binary {
    mw__binop op;
    mw__nd nd;
    float *out;
    const float *a, *b;
} mw__k_binary;

/* out[i] = alpha * a[i] over nd (operands 0, 1): copies, permutations, broadcasts, scaling, and
 * conversions between f32 and bf16 (a value computed in f32, then rounded to out's dtype to the
 * nearest even; see devices/bf16.h). */
typedef struct mw__k_copy {
    float alpha;
    mw_dtype out_dtype, a_dtype; /* MW_F32 or MW_BF16 each; MW_I32 only to MW_I32 */
    mw__nd nd;
    void *out;
    const void *a;
} mw__k_copy;

/* out = alpha * sum of a over the dims where out's stride is 0 (operands 0, 1; nd walks a). The
 * summation order is fixed (row-major over nd), so the result is deterministic. */
typedef struct mw__k_reduce {
    float alpha;
    mw__nd nd;
    int64_t out_count; /* elements of out */
    float *out;
    const float *a;
} mw__k_reduce;

/* The reduce that sums the columns of a (rows x n, rows lda apart) into out: out[j] = alpha *
 * sum over r of a[r * lda + j], the planner's layout of a bias gradient. */
static inline mw__k_reduce mw__column_sums(int64_t rows, int64_t n, int64_t lda, float alpha,
                                           float *out, const float *a) {
    mw__k_reduce k = {0};
    k.alpha = alpha;
    k.out_count = n;
    k.out = out;
    k.a = a;
    k.nd.rank = 2;
    k.nd.dims[0] = rows;
    k.nd.dims[1] = n;
    k.nd.stride[0][1] = 1;
    k.nd.stride[1][0] = lda;
    k.nd.stride[1][1] = 1;
    return k;
}

/* C[b] = A[b] * B[b] + bias + addend[b] + beta * C[b] for b < batch, row-major; A is M x K (K x M
 * when trans_a), B is K x N (N x K when trans_b), C is M x N; leading dimensions are those of the
 * stored matrices.
 * - A and B are both f32 or both bf16 (products and sums in f32 either way); C is f32, or bf16
 *   (rounded once, after the epilogue) when A and B are.
 * - beta is 0 (C is only written) or 1 (the product is added to what C holds: an addend the plan
 *   copied there first; f32 C only).
 * - bias, when not NULL: N floats added to every row of every C[b]; addend, when not NULL: an f32
 *   array laid out like C (ldc, stride_c) added to it. The epilogue the plan fuses: x W + b and
 *   x + (h W + b).
 * - impl: what the backend's gemm_prepare made for this instruction, or NULL (a kernel called on
 *   its own: it then works without one, more slowly where it must convert). */
typedef struct mw__k_gemm {
    float beta;
    int64_t batch, m, n, k;
    int trans_a, trans_b;
    int64_t lda, ldb, ldc;
    int64_t stride_a, stride_b, stride_c;
    mw_dtype ab_dtype, c_dtype;
    void *c;
    const void *a, *b;
    const float *bias, *addend;
    void *impl;
} mw__k_gemm;

typedef struct mw__k_fill {
    float value;
    int64_t count;
    float *out;
} mw__k_fill;

/* p[i] -= lr * g[i]. The optimizers' kernels also write, when p16 is not NULL, each updated
 * parameter's bf16 rounding to p16[i] (the copy bf16 contractions read), as they update it. */
typedef struct mw__k_sgd {
    float lr;
    int64_t count;
    float *p;
    const float *g;
    uint16_t *p16;
} mw__k_sgd;

/* Elementwise unary ops and their gradients (math in devices/math.h). */
/* GELU in its tanh form (mw_gelu) or exact, through erf (mw_gelu_erf); SiLU: x / (1 + e^-x)
 * (mw_silu). */
typedef enum mw__unop { MW__UN_GELU, MW__UN_GELU_ERF, MW__UN_SILU } mw__unop;

/* out[i] = f(a[i]); out is f32 or bf16 (rounded once). */
typedef struct mw__k_unary {
    mw__unop op;
    mw_dtype out_dtype;
    int64_t count;
    void *out;
    const float *a;
} mw__k_unary;

/* out[i] = gy[i] * f'(x[i]). When colsum is not NULL, out is also read as rows of cols (count a
 * multiple of it) and colsum[j] = the sum over rows of out[r * cols + j], added row after row
 * (the order of the reduce kernel's column sums): the plan gives it for a bias gradient. */
typedef struct mw__k_unary_grad {
    mw__unop op;
    mw_dtype out_dtype; /* f32, or bf16 (the column sums are of the f32 values, unrounded) */
    int64_t count;
    void *out;
    const float *gy, *x;
    int64_t cols;
    float *colsum;
} mw__k_unary_grad;

/* Layer norm over contiguous rows of n: out = (x - mean) * rstd * w + b, rstd = 1/sqrt(var+eps)
 * with the biased variance (b NULL: no bias); out is f32 or bf16 (rounded once). */
typedef struct mw__k_layernorm {
    int64_t rows, n;
    float eps;
    mw_dtype out_dtype;
    void *out;
    const float *x, *w, *b;
} mw__k_layernorm;

/* Layer norm backward. dx: the input gradient (w given); dw: sum over rows of gy * xhat (w NULL,
 * out has n elements). Statistics are recomputed from x. The dx kernel also writes, when they are
 * not NULL, dw (as the dw kernel would) and db = the sum over rows of gy, row after row: the plan
 * gives them when the layer norm's weight (and bias) gradients come straight from the same gy, so
 * one pass over gy and x serves all three. */
typedef struct mw__k_layernorm_grad {
    int64_t rows, n;
    float eps;
    float *out;
    const float *gy, *x, *w;
    float *dw, *db; /* dx only: each NULL, or n floats (db only with dw) */
    /* dx only: NULL, or what to add to dx (the same rows): out = addend + dx, a gradient the plan
     * folded in (a residual stream's). */
    const float *addend;
} mw__k_layernorm_grad;

/* RMS norm over contiguous rows of n: out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); out is
 * f32 or bf16 (rounded once). */
typedef struct mw__k_rmsnorm {
    int64_t rows, n;
    float eps;
    mw_dtype out_dtype;
    void *out;
    const float *x, *w;
} mw__k_rmsnorm;

/* RMS norm backward. dx: the input gradient (w given); dw: sum over rows of gy * x * rstd (w
 * NULL, out has n elements). rstd is recomputed from x. The dx kernel also writes, when it is not
 * NULL, dw (as the dw kernel would, in its order): the plan gives it when the weight's gradient
 * comes straight from the same gy and x. */
typedef struct mw__k_rmsnorm_grad {
    int64_t rows, n;
    float eps;
    float *out;
    const float *gy, *x, *w;
    float *dw; /* dx only: NULL, or n floats */
    /* dx only: NULL, or what to add to dx (the same rows): out = addend + dx (a residual
     * stream's gradient the plan folded in). */
    const float *addend;
} mw__k_rmsnorm_grad;

/* SwiGLU over `outer` blocks of x, each a gate row of `inner` then an up row of `inner`:
 * out[o * inner + i] = silu(gate[i]) * up[i]; out is f32 or bf16 (rounded once). The gradient
 * (mw__k_swiglu with gy given) writes both halves of dx in x's layout: gy * up * silu'(gate),
 * then gy * silu(gate). */
typedef struct mw__k_swiglu {
    int64_t outer, inner;
    mw_dtype out_dtype;
    void *out;
    const float *x, *gy; /* gy: the gradient only */
} mw__k_swiglu;

/* Rotary embeddings over rows of n features: row r at position offset + (r / inner) % seq (+
 * pos[r / prefix] when pos is given) has features j < dims rotated with their pair (style: j and
 * j + dims/2, or 2j and 2j + 1) by the angle position * f_j (devices/math.h, mw__rope_freq; the
 * opposite angle when inverse: the gradient); features from dims on are copied, and so are the rows
 * past `parts` of the part axis. out is f32 or bf16 (rounded once). */
typedef struct mw__k_rope {
    int64_t rows, n, inner, seq, prefix, offset;
    /* Rows with (r / part_inner) % part_size >= parts are copied, not rotated (0: every row). */
    int64_t part_inner, part_size, parts;
    int dims, style, inverse;
    mw__rope_freqs freqs;
    mw_dtype out_dtype;
    void *out;
    const float *x;
    const int32_t *pos;
} mw__k_rope;

/* Softmax over contiguous rows of k, of `outer` blocks of s rows: out = softmax(scale * a). When
 * causal, row i of a block sees only columns j <= i + (k - s); the rest are 0. */
typedef struct mw__k_softmax {
    int64_t outer, s, k;
    int causal;
    float scale;
    float *out;
    const float *a;
} mw__k_softmax;

/* Its backward from the forward output p: out = scale * p * (gy - sum_j gy_j p_j). */
typedef struct mw__k_softmax_grad {
    int64_t outer, s, k;
    int causal;
    float scale;
    float *out;
    const float *gy, *p;
} mw__k_softmax_grad;

/* Embedding lookup: out[i, :] = table[ids[i], :] (rows of dim). An id outside [0, vocab) is an
 * error (MW_ERR_INVALID naming the id and its position). */
typedef struct mw__k_embed {
    int64_t n_ids, vocab, dim;
    float *out;
    const int32_t *ids;
    const float *table;
} mw__k_embed;

/* Its backward: out (vocab x dim) = 0, then out[ids[i], :] += gy[i, :] in order of i. */
typedef struct mw__k_embed_grad {
    int64_t n_ids, vocab, dim;
    float *out;
    const int32_t *ids;
    const float *gy;
} mw__k_embed_grad;

/* Softmax cross-entropy per row of v logits, over the first `valid` columns only:
 * out[r] = logsumexp(logits[r, :valid]) - logits[r, target[r]]. A target outside [0, valid) is
 * an error (MW_ERR_INVALID). */
typedef struct mw__k_xent {
    int64_t rows, v, valid;
    float *out;
    const float *logits;
    const int32_t *targets;
} mw__k_xent;

/* Its backward: out[r, j] = gy[r] * (softmax_j - [j == target]) for j < valid, 0 beyond. out may
 * be logits (in place: a row is read whole before it is written). */
typedef struct mw__k_xent_grad {
    int64_t rows, v, valid;
    float *out;
    const float *gy, *logits;
    const int32_t *targets;
} mw__k_xent_grad;

/* *out += the exact squares of a[0..count) (mw__sqacc, devices/math.h), cleared first when zero is
 * set; out is device memory. The same bits on every backend, whatever its threads' order. */
typedef struct mw__k_sumsq {
    int64_t count;
    mw__sqacc *out;
    const float *a;
    int zero;
} mw__k_sumsq;

/* AdamW on one parameter: g' = grad_scale * g; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;
 * p -= lr * (m (1 / bias1) / (sqrt(v (1 / bias2)) + eps) + weight_decay * p), where bias1 = 1 -
 * b1^t and bias2 = 1 - b2^t (the decoupled weight decay of AdamW; each correction a multiplication
 * by its reciprocal, rounded: mw__adamw_update). */
typedef struct mw__k_adamw {
    int64_t count;
    float lr, beta1, beta2, eps, weight_decay, bias1, bias2, grad_scale;
    float *p, *m, *v;
    const float *g;
    uint16_t *p16; /* NULL, or the bf16 copy to write (see mw__k_sgd) */
} mw__k_adamw;

/* Fused self-attention (mw_attention) over `outer` independent (batch, head) slices. For slice
 * s, walk.dims/stride give its offset: operand 0 in out (or gy), operand 1 in qkv. Within a
 * slice, position i of q starts at qkv + i * seq_qkv, k and v lie `part` elements after q and
 * 2 * part after it; position i of out (gy) starts at out + i * seq_out; the d features of a
 * position are contiguous. Forward: out_i = sum_j softmax_j(scale * q_i . k_j) v_j, over j <= i
 * when causal. Backward (grad): out is d(qkv), laid out like qkv, from gy = d(out); the scores
 * are recomputed. scratch holds scratch_elems floats (mw__attn_scratch_elems) the kernel may use
 * as it likes: forward MW__ATTN_BLOCK x T plus 2 D x T, backward 2 MW__ATTN_BLOCK x (T + D) +
 * 3 D x T plus 2 per query row of every slice, and a bf16 slice staged in f32. */
#define MW__ATTN_BLOCK 64 /* query rows per block of scores */
typedef struct mw__k_attention {
    int causal;
    /* qkv (both passes) in f32 or bf16; out f32, or bf16 in the forward pass. gy is f32. Where
     * qkv or out are bf16 the CPU kernels stage a slice of them in f32 in the scratch: forward
     * 3 D x T more floats for qkv and D x T for out (after the block of probabilities), backward
     * 3 D x T for qkv (after the 2 per query row). */
    mw_dtype qkv_dtype, out_dtype;
    float scale;
    int64_t t, d;
    int64_t seq_qkv, seq_out, part;
    /* Queries per key/value head (mw_attention_grouped; 1 otherwise): a slice's qkv holds the
     * group's queries `part` apart, then its key and its value; their outputs (backward: gy) lie
     * out_group apart. The backward sums the group's dK and dV in group order. */
    int64_t group, out_group;
    /* Rotary embeddings applied to the queries and the key as the kernel reads them (dims 0:
     * none; the plan sets it only for devices whose target asks, mw__plan_target.rotary):
     * qkv is then the f32 projection before rotation, the queries and the key of position i
     * rotated by the angles of position offset + i (mw__k_rope's rotation, features past dims
     * kept) and, where qkv_dtype is bf16, rounded after rotating, as a rope writing bf16 would
     * round them. The backward writes d(qkv) rotated back: the projection's gradient. */
    struct {
        int dims, style;
        int64_t offset;
        mw__rope_freqs freqs;
    } rope;
    mw__nd walk;    /* the batch axes: operand 0 = out (forward) or gy (backward), 1 = qkv */
    int64_t slices; /* walk's index count: the (batch, key/value head) slices */
    int64_t block;  /* query rows per block: min(t, MW__ATTN_BLOCK) */
    int64_t scratch_elems;
    void *out;
    float *scratch;
    const void *qkv;
    const float *gy;
    /* The probabilities kept from the forward pass for the backward one, or NULL: slice after
     * slice of mw__attn_probs_per_slice floats, each slice's blocks in order, a block's m rows as
     * long as the keys it may see. Set only for the CPU kernels (the plan's host-memory devices):
     * the forward writes them, and the backward reads them instead of recomputing the scores. */
    float *probs;
    void *impl; /* what the backend's attention_prepare made, or NULL */
} mw__k_attention;

/* Queries per key/value head of an attention descriptor (0, a descriptor made without it: 1). */
static inline int64_t mw__attn_group(const mw__k_attention *k) {
    return k->group > 0 ? k->group : 1;
}

/* A rotary attention's kernel of one slice (k->rope.dims set): the slice staged compactly
 * (queries, key and value one after another, each t x d) in qkv_dtype, its output (forward) where
 * k's lies, its d(qkv) (backward) compact in f32; no rotation, no walk. The rotary wrapper runs it
 * per slice, and the backend's attention_prepare prepares it. */
static inline mw__k_attention mw__attn_rotary_inner(const mw__k_attention *k) {
    mw__k_attention in = *k;
    in.rope.dims = 0;
    in.seq_qkv = k->d;
    in.part = k->t * k->d;
    in.walk.rank = 0;
    in.slices = 1;
    in.probs = NULL;
    in.scratch = NULL;
    in.scratch_elems = 0;
    return in;
}

/* Where a rotary attention's own scratch lies (floats from its start), each part a whole number
 * of 64-byte lines: off[0] the cos, sin and sine negated of every position (where the device
 * keeps no table of them) and a row of d, off[1] the rotated slice (in qkv_dtype, or in f32 where
 * the CPU's f32 tiles read it), off[2] the slice's d(qkv) in f32 (backward), off[3] the scratch of
 * its kernel of one slice (mw__attn_rotary_inner). */
static inline void mw__attn_rotary_layout(const mw__k_attention *k, int grad, int64_t off[4]) {
    int64_t t = k->t, n = (mw__attn_group(k) + 2) * t * k->d, half = k->rope.dims / 2;
#define MW__LINES_(x) (((x) + 15) / 16 * 16)
    off[0] = 0;
    off[1] = MW__LINES_(3 * t * half + k->d);
    off[2] = off[1] + MW__LINES_(n);
    off[3] = off[2] + (grad ? MW__LINES_(n) : 0);
#undef MW__LINES_
}

/* The floats of scratch an attention kernel of k's sizes, dtypes, block, slices and group is
 * given (the plan's, and any other caller's): CPU, one block of probabilities (and of their
 * gradients), a slice's k and v (backward also a block's q and dO) packed for its products, and
 * a bf16 slice (and a bf16 output) staged in f32; with rotary embeddings, its own
 * (mw__attn_rotary_layout) before those of its kernel of one slice; GPU backward, the log-sum-exp
 * and sum_j P_ij dP_ij of every row. */
static inline int64_t mw__attn_scratch_elems(const mw__k_attention *k, int grad) {
    if (k->rope.dims) {
        mw__k_attention in = mw__attn_rotary_inner(k);
        int64_t off[4];
        mw__attn_rotary_layout(k, grad, off);
        return off[3] + mw__attn_scratch_elems(&in, grad);
    }
    int64_t t = k->t, d = k->d, blk = k->block, g = mw__attn_group(k);
    int64_t stage = (k->qkv_dtype == MW_BF16 ? (g + 2) * d * t : 0) +
                    (!grad && k->out_dtype == MW_BF16 ? d * t : 0);
    return grad ? 2 * blk * t + 2 * k->slices * g * t + stage + 3 * d * t + 2 * blk * d
                : blk * t + stage + 2 * d * t;
}

/* Floats of one slice's kept probabilities (mw__k_attention.probs). */
static inline int64_t mw__attn_probs_per_slice(int64_t t, int64_t block, int causal) {
    int64_t n = 0;
    for (int64_t i0 = 0; i0 < t; i0 += block) {
        int64_t m = t - i0 < block ? t - i0 : block;
        n += m * (causal ? i0 + m : t);
    }
    return n;
}
/* SGD with momentum and L2 weight decay, as torch.optim.SGD: g' = grad_scale * g +
 * weight_decay * p; with momentum, buf = g' on the first step and momentum * buf +
 * (1 - dampening) * g' after, and the step is g' + momentum * buf (Nesterov) or buf; without
 * momentum (buf NULL) it is g'. Then p -= lr * step. Math in devices/math.h. */
typedef struct mw__k_sgd_momentum {
    int64_t count;
    float lr, momentum, dampening, weight_decay, grad_scale;
    int nesterov, first;
    float *p, *buf;
    const float *g;
    uint16_t *p16; /* NULL, or the bf16 copy to write (see mw__k_sgd) */
} mw__k_sgd_momentum;

/* out[i] = f(a[i]), f = fn (an mw__mapfn; per-element math in devices/math.h). */
typedef struct mw__k_map {
    int fn;
    int64_t count;
    float *out;
    const float *a;
} mw__k_map;

/* out[i] = gy[i] * f'(x[i]). */
typedef struct mw__k_map_grad {
    int fn;
    int64_t count;
    float *out;
    const float *x, *gy;
} mw__k_map_grad;

/* out[i] = a[i] * keep(i) / (1 - p) when active, else a[i]; keep(i) depends only on (seed, step,
 * the element's index in the whole tensor), so every sharding of the tensor draws the same mask.
 * The local elements form the box [lo, lo + len) of the global tensor, whose row-major strides
 * are gstride. step and active are set by the executor before every run (a new mask every update
 * and micro-batch; none outside training). */
typedef struct mw__k_dropout {
    float p;
    uint64_t seed, step;
    int active;
    int rank;
    int64_t count;
    int64_t len[MW_MAX_RANK], lo[MW_MAX_RANK], gstride[MW_MAX_RANK];
    float *out;
    const float *a;
} mw__k_dropout;

/* ARGMAX / REDUCE_MAX: a as [outer, n, inner], out[o, i] = argmax / max over k of a[o, k, i] (the
 * first index among equal maxima; NaN compares as smallest). */
typedef struct mw__k_max {
    int64_t outer, n, inner;
    float *out;
    const float *a;
} mw__k_max;

/* out (a state, written in place) as [outer, n, inner], value as [outer, inner]:
 * out[o, ids[o], :] = value[o, :]; ids[o] outside [0, n) fails naming it. */
typedef struct mw__k_state_write {
    int64_t outer, n, inner;
    float *out;
    const float *value;
    const int32_t *ids;
} mw__k_state_write;

/* kv (keys and values) as [outer, n, 2, heads, dim], q and out as [outer, heads, dim]:
 * out[o, h] = softmax_j(scale q[o, h] . k[o, j, h]) v[o, j, h] over j in [0, pos[o]] (f32, in key
 * order); pos[o] outside [0, n) fails naming it. */
typedef struct mw__k_attention_cached {
    int64_t outer, n, heads, dim;
    int64_t group; /* queries per key/value head: q and out hold heads x group rows per outer */
    float scale;
    float *out;
    const float *q, *kv;
    const int32_t *pos;
} mw__k_attention_cached;

/* --- the instruction table ----------------------------------------------------------------------
 *
 * One row per kernel a plan runs: XX(KIND, name, descriptor, dtypes, ROLES).
 *   KIND        the instruction kind MW__I_<KIND> (core/plan.h's mw__ins.kind)
 *   name        the instruction's name in messages, the device vtable's slot that runs it, and the
 *               member of union mw__kernel (its descriptor) and of mw__ins's operands
 *   descriptor  the kernel descriptor's type
 *   dtypes      what a backend with bf16 kernels (mw__supports_bf16_kernels) runs it on besides
 *               f32: MW__DT_BF16 (an input operand may be bf16), MW__DT_BF16_OUT (the output may
 *               be bf16: the kernel rounds what it writes), MW__DT_I32 (i32 values pass
 *               through)
 *   ROLES       its operands, the output first: each the descriptor's pointer field of that name,
 *               which the executor points at the operand's buffer (NULL for an operand the plan
 *               leaves out); a kernel's inputs follow its graph node's inputs in order.
 * Adding a kernel is one row here, its descriptor above, its lowering (core/), its kernels in
 * every backend and its tests; names, dispatch, vtable slots, support checks and the module ABI
 * follow from the row. */
#define MW__DT_BF16 1
#define MW__DT_I32 2
#define MW__DT_BF16_OUT 4

#define MW__ROLES_BINARY(R, X) R(X, out) R(X, a) R(X, b)
#define MW__ROLES_COPY(R, X) R(X, out) R(X, a)
#define MW__ROLES_REDUCE(R, X) R(X, out) R(X, a)
#define MW__ROLES_GEMM(R, X) R(X, c) R(X, a) R(X, b) R(X, bias) R(X, addend)
#define MW__ROLES_FILL(R, X) R(X, out)
#define MW__ROLES_UNARY(R, X) R(X, out) R(X, a)
#define MW__ROLES_UNARY_GRAD(R, X) R(X, out) R(X, gy) R(X, x) R(X, colsum)
#define MW__ROLES_LAYERNORM(R, X) R(X, out) R(X, x) R(X, w) R(X, b)
#define MW__ROLES_LAYERNORM_DX(R, X)                                                               \
    R(X, out) R(X, gy) R(X, x) R(X, w) R(X, dw) R(X, db) R(X, addend)
#define MW__ROLES_LAYERNORM_DW(R, X) R(X, out) R(X, gy) R(X, x)
#define MW__ROLES_RMSNORM(R, X) R(X, out) R(X, x) R(X, w)
#define MW__ROLES_RMSNORM_DX(R, X) R(X, out) R(X, gy) R(X, x) R(X, w) R(X, dw) R(X, addend)
#define MW__ROLES_RMSNORM_DW(R, X) R(X, out) R(X, gy) R(X, x)
#define MW__ROLES_SWIGLU(R, X) R(X, out) R(X, x)
#define MW__ROLES_SWIGLU_GRAD(R, X) R(X, out) R(X, gy) R(X, x)
#define MW__ROLES_ROPE(R, X) R(X, out) R(X, x) R(X, pos)
#define MW__ROLES_SOFTMAX(R, X) R(X, out) R(X, a)
#define MW__ROLES_SOFTMAX_GRAD(R, X) R(X, out) R(X, gy) R(X, p)
#define MW__ROLES_EMBED(R, X) R(X, out) R(X, table) R(X, ids)
#define MW__ROLES_EMBED_GRAD(R, X) R(X, out) R(X, gy) R(X, ids)
#define MW__ROLES_XENT(R, X) R(X, out) R(X, logits) R(X, targets)
#define MW__ROLES_XENT_GRAD(R, X) R(X, out) R(X, gy) R(X, logits) R(X, targets)
#define MW__ROLES_ATTENTION(R, X) R(X, out) R(X, qkv) R(X, scratch) R(X, probs)
#define MW__ROLES_ATTENTION_GRAD(R, X) R(X, out) R(X, gy) R(X, qkv) R(X, scratch) R(X, probs)
#define MW__ROLES_MAP(R, X) R(X, out) R(X, a)
#define MW__ROLES_MAP_GRAD(R, X) R(X, out) R(X, x) R(X, gy)
#define MW__ROLES_DROPOUT(R, X) R(X, out) R(X, a)
#define MW__ROLES_ARGMAX(R, X) R(X, out) R(X, a)
#define MW__ROLES_REDUCE_MAX(R, X) R(X, out) R(X, a)
#define MW__ROLES_STATE_WRITE(R, X) R(X, out) R(X, value) R(X, ids)
#define MW__ROLES_ATTENTION_CACHED(R, X) R(X, out) R(X, q) R(X, kv) R(X, pos)

#define MW__KERNELS(XX)                                                                            \
    XX(BINARY, binary, mw__k_binary, 0, MW__ROLES_BINARY)                                          \
    XX(COPY, copy, mw__k_copy, MW__DT_BF16 | MW__DT_BF16_OUT | MW__DT_I32, MW__ROLES_COPY)         \
    XX(REDUCE, reduce, mw__k_reduce, 0, MW__ROLES_REDUCE)                                          \
    XX(GEMM, gemm, mw__k_gemm, MW__DT_BF16 | MW__DT_BF16_OUT, MW__ROLES_GEMM)                      \
    XX(FILL, fill, mw__k_fill, 0, MW__ROLES_FILL)                                                  \
    XX(UNARY, unary, mw__k_unary, MW__DT_BF16_OUT, MW__ROLES_UNARY)                                \
    XX(UNARY_GRAD, unary_grad, mw__k_unary_grad, MW__DT_BF16_OUT, MW__ROLES_UNARY_GRAD)            \
    XX(LAYERNORM, layernorm, mw__k_layernorm, MW__DT_BF16_OUT, MW__ROLES_LAYERNORM)                \
    XX(LAYERNORM_DX, layernorm_dx, mw__k_layernorm_grad, 0, MW__ROLES_LAYERNORM_DX)                \
    XX(LAYERNORM_DW, layernorm_dw, mw__k_layernorm_grad, 0, MW__ROLES_LAYERNORM_DW)                \
    XX(RMSNORM, rmsnorm, mw__k_rmsnorm, MW__DT_BF16_OUT, MW__ROLES_RMSNORM)                        \
    XX(RMSNORM_DX, rmsnorm_dx, mw__k_rmsnorm_grad, 0, MW__ROLES_RMSNORM_DX)                        \
    XX(RMSNORM_DW, rmsnorm_dw, mw__k_rmsnorm_grad, 0, MW__ROLES_RMSNORM_DW)                        \
    XX(SWIGLU, swiglu, mw__k_swiglu, MW__DT_BF16_OUT, MW__ROLES_SWIGLU)                            \
    XX(SWIGLU_GRAD, swiglu_grad, mw__k_swiglu, 0, MW__ROLES_SWIGLU_GRAD)                           \
    XX(ROPE, rope, mw__k_rope, MW__DT_BF16_OUT, MW__ROLES_ROPE)                                    \
    XX(SOFTMAX, softmax, mw__k_softmax, 0, MW__ROLES_SOFTMAX)                                      \
    XX(SOFTMAX_GRAD, softmax_grad, mw__k_softmax_grad, 0, MW__ROLES_SOFTMAX_GRAD)                  \
    XX(EMBED, embed, mw__k_embed, 0, MW__ROLES_EMBED)                                              \
    XX(EMBED_GRAD, embed_grad, mw__k_embed_grad, 0, MW__ROLES_EMBED_GRAD)                          \
    XX(XENT, xent, mw__k_xent, 0, MW__ROLES_XENT)                                                  \
    XX(XENT_GRAD, xent_grad, mw__k_xent_grad, 0, MW__ROLES_XENT_GRAD)                              \
    XX(ATTENTION, attention, mw__k_attention, MW__DT_BF16 | MW__DT_BF16_OUT, MW__ROLES_ATTENTION)  \
    XX(ATTENTION_GRAD, attention_grad, mw__k_attention, MW__DT_BF16, MW__ROLES_ATTENTION_GRAD)     \
    XX(MAP, map, mw__k_map, 0, MW__ROLES_MAP)                                                      \
    XX(MAP_GRAD, map_grad, mw__k_map_grad, 0, MW__ROLES_MAP_GRAD)                                  \
    XX(DROPOUT, dropout, mw__k_dropout, 0, MW__ROLES_DROPOUT)                                      \
    XX(ARGMAX, argmax, mw__k_max, 0, MW__ROLES_ARGMAX)                                             \
    XX(REDUCE_MAX, reduce_max, mw__k_max, 0, MW__ROLES_REDUCE_MAX)                                 \
    XX(STATE_WRITE, state_write, mw__k_state_write, 0, MW__ROLES_STATE_WRITE)                      \
    XX(ATTENTION_CACHED, attention_cached, mw__k_attention_cached, 0, MW__ROLES_ATTENTION_CACHED)

/* The instruction kinds: the kernels of the table, then the collectives (no kernel; the
 * reducer's), each in place over one buffer: an all-reduce of a value a sharded axis was reduced
 * in, and of a bucket of the flat gradient buffer; an all-gather of a split parameter's rows and a
 * reduce-scatter of its whole gradient (FSDP); an all-gather prefetched: started, and waited for
 * where the parameter is used. */
typedef enum mw__ins_kind {
#define MW__KIND_(KIND, name, type, dtypes, ROLES) MW__I_##KIND,
    MW__KERNELS(MW__KIND_)
#undef MW__KIND_
        MW__I_ALLREDUCE,
    MW__I_GRAD_BUCKET,
    MW__I_ALLGATHER,
    MW__I_REDUCE_SCATTER,
    MW__I_GATHER_START,
    MW__I_GATHER_WAIT,
    MW__I_COUNT
} mw__ins_kind;

/* No kernel (core/graph_impl.h's MW__OPS: an op whose kernel writes no bf16). */
#define MW__I_NONE (-1)

/* Compile-time checks in C and in the C++ of CUDA sources. */
#ifdef __cplusplus
#define MW__STATIC_ASSERT static_assert
#else
#define MW__STATIC_ASSERT _Static_assert
#endif

/* Kinds are bits of a 64-bit mask (mw__plan_target.bf16_out). */
MW__STATIC_ASSERT(MW__I_COUNT <= 64, "instruction kinds no longer fit a 64-bit mask");

/* The most operands of any kernel (a row's ROLES). */
#define MW__MAX_ROLES 7

/* A number that changes with the layout of the kernels a table describes: every descriptor's
 * size and the offset of each of its operands, weighted by its row, and the table's length. The
 * module interface's version is made from it for MW__KERNELS (devices/module_abi.h), so a new row,
 * a changed descriptor or a moved operand refuses modules built from other source without a hand
 * bump. */
#define MW__LAYOUT_ROLE_(type, role) +offsetof(type, role) * 31u
#define MW__LAYOUT_ROW_(KIND, name, type, dtypes, ROLES)                                           \
    +(MW__I_##KIND + 1u) * (MW__I_##KIND + 7u) *                                                   \
        ((sizeof(type) ROLES(MW__LAYOUT_ROLE_, type)) * 97u + (unsigned)(dtypes) + 1u)
#define MW__KERNEL_LAYOUT_OF(TABLE) ((unsigned)(0u TABLE(MW__LAYOUT_ROW_)))

/* Every kernel's descriptor by the instruction's name. */
union mw__kernel {
#define MW__KMEMBER_(KIND, name, type, dtypes, ROLES) type name;
    MW__KERNELS(MW__KMEMBER_)
#undef MW__KMEMBER_
};

typedef struct mw__device mw__device;

typedef struct mw__device_vtable {
    const char *kind; /* "cpu", "cuda" */
    int host_memory;  /* buffers are plain host memory: inputs can be read in place */
    /* Its attention kernels rotate q and k as they read them (mw__k_attention.rope), so the plan
     * may fuse a rotary embedding into the attention that reads it. */
    int rotary_attention;
    mw_status (*init)(mw__device *dev);                            /* on the worker thread, once */
    void (*shutdown)(mw__device *dev);                             /* on the worker thread, once */
    mw_status (*alloc)(mw__device *dev, size_t bytes, void **out); /* 64-byte aligned */
    void (*free)(mw__device *dev, void *p);
    mw_status (*upload)(mw__device *dev, void *dst, const void *src, size_t bytes);
    mw_status (*download)(mw__device *dev, void *dst, const void *src, size_t bytes);
    mw_status (*sync)(mw__device *dev);
    /* The kernels of the instruction table, one slot per row, named as the row: NULL where the
     * backend lacks one (a plan that needs it is refused with MW_ERR_UNSUPPORTED when the trainer
     * is made, naming the op). */
#define MW__SLOT_(KIND, name, type, dtypes, ROLES)                                                 \
    mw_status (*name)(mw__device * dev, const type *k);
    MW__KERNELS(MW__SLOT_)
#undef MW__SLOT_
    /* Optional: called once for every GEMM of a plan when the worker starts (on its thread,
     * after init), so that what depends only on the GEMM's shape, dtypes and epilogue (a oneDNN
     * primitive, its scratchpad) is made before the first step and the backend allocates
     * nothing in a step (a library it calls may: oneDNN does in every call, cpu_dnnl.h):
     * sets k->impl, owned by the device until shutdown. Which of k's pointers are NULL is
     * final; the others may still change (an input read in place is bound every step). */
    mw_status (*gemm_prepare)(mw__device *dev, mw__k_gemm *k);
    /* Optional: as gemm_prepare, for the attention of the forward (grad 0) or backward pass. */
    mw_status (*attention_prepare)(mw__device *dev, mw__k_attention *k, int grad);
    /* Optional: MW_OK when the backend's kernel of instruction kind `kind` (an mw__ins_kind) runs
     * the descriptor k (its sizes and strides; pointers unset), else MW_ERR_UNSUPPORTED naming the
     * limit, the size and what to change. Asked for every instruction of a plan when a trainer or
     * an inference program is made (mw__backend_check_plan), so a kernel's limits refuse a plan
     * there, never at a step. NULL: every size is served. */
    mw_status (*check)(int kind, const void *k);
    /* The optimizers' kernels (called by the trainer's update, not by a plan); sgd_momentum is
     * optional (NULL: the trainer refuses momentum and weight decay with SGD). */
    mw_status (*sgd)(mw__device *dev, const mw__k_sgd *k);
    mw_status (*sgd_momentum)(mw__device *dev, const mw__k_sgd_momentum *k);
    mw_status (*adamw)(mw__device *dev, const mw__k_adamw *k);
    mw_status (*sumsq)(mw__device *dev, const mw__k_sumsq *k);
    /* Optional (NULL on host-memory backends): page-locked host buffers, and a copy into the
     * device queued on its stream, from such a buffer, which must stay unchanged until the next
     * sync. The trainer packs each step's input shards into one and uploads them without
     * waiting. */
    mw_status (*host_alloc)(mw__device *dev, size_t bytes, void **out);
    void (*host_free)(mw__device *dev, void *p);
    mw_status (*upload_async)(mw__device *dev, void *dst, const void *src, size_t bytes);
    /* Optional: what implements a kernel of instruction kind `kind` (an mw__ins_kind) whose
     * descriptor is k, as prepared on dev ("onednn brg:avx512_core_amx_bf16", "cublas", ...),
     * or, for kind -1 (k NULL), every kernel the backend does not describe one by one ("vector
     * loops (avx2)"), for reports; NULL or "" when the backend does not say. The string lives as
     * long as dev. */
    const char *(*describe)(const mw__device *dev, int kind, const void *k);
    /* Optional: bytes the device's kernels hold for themselves (workspaces made when the worker
     * started), for mw_trainer_memory. */
    size_t (*workspace)(const mw__device *dev);
} mw__device_vtable;

struct mw__device {
    const mw__device_vtable *vt;
    char name[32]; /* "cpu:0" */
    int index;     /* position in the mesh's device list */
    int ordinal;   /* backend's own number (GPU id) */
    int pin;       /* CPU: devices sharing the host when the worker should pin itself, else 0 */
    void *impl;    /* backend state */
};

/* Merges adjacent dims that are contiguous for every operand (nops operands) and drops size-1
 * dims, so kernels walk as few, as long rows as possible. A rank-0 nd means a single element. */
void mw__nd_simplify(mw__nd *nd, int nops);

#endif
