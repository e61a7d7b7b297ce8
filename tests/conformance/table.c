/* The rows of the conformance table: for each op, its operands (canonical axes, values, the axis
 * orders its header allows), shapes (odd sizes that are no multiple of a vector or a GEMM block,
 * batch axes of size 1, one row, long rows), which axes may be split, the op as the library
 * builds it and as the float64 reference computes it. Composite ops (attention, cached attention)
 * are written out in the reference from contractions and softmaxes, never fused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

/* Shorthands: the axes of a reference node and a node of a named axis renamed. */
static int renamed(rg_graph *r, int x, const char *from, const char *to) {
    rg_axes ax = *rg_axes_of(r, x);
    int a = rg_find(&ax, from);
    strcpy(ax.name[a], to);
    return rg_reshape(r, x, &ax);
}

static const char *const *names(const rg_axes *ax, const char **buf) {
    for (int i = 0; i < ax->rank; i++) buf[i] = ax->name[i];
    return buf;
}

/* --- elementwise binary ops --------------------------------------------------------------------
 */

static mw_tensor *b_binary(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    mw_tensor *a = x[0], *b = x[1];
    if (v->i[1]) a = x[1], b = x[0]; /* the subset first */
    switch (v->i[0]) {
    case 0: return mw_add(g, a, b);
    case 1: return mw_sub(g, a, b);
    case 2: return mw_mul(g, a, b);
    default: return mw_div(g, a, b);
    }
}

static int r_binary(rg_graph *r, const int *x, const cf_variant *v) {
    int a = x[0], b = x[1];
    if (v->i[1]) a = x[1], b = x[0];
    switch (v->i[0]) {
    case 0: return rg_add(r, a, b);
    case 1: return rg_sub(r, a, b);
    case 2: return rg_mul(r, a, b);
    default: return rg_div(r, a, b);
    }
}

static mw_tensor *b_scale(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    return mw_scale(g, x[0], (float)v->f[0]);
}
static int r_scale(rg_graph *r, const int *x, const cf_variant *v) {
    return rg_scale(r, x[0], (double)(float)v->f[0]);
}

/* f32(bf16(x)): rounded to the nearest bfloat16; the gradient passes unrounded. */
static mw_tensor *b_cast(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    (void)v;
    return mw_cast(g, mw_cast(g, x[0], MW_BF16), MW_F32);
}
static int r_cast(rg_graph *r, const int *x, const cf_variant *v) {
    (void)v;
    return rg_map(r, x[0], RG_BF16);
}

/* x + a constant of x's axes (mw_full). */
static mw_tensor *b_full(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    mw_axes ax = {.rank = mw_tensor_rank(x[0])};
    const char *mesh[MW_MAX_RANK];
    for (int i = 0; i < ax.rank; i++)
        mw_tensor_axis(x[0], i, &ax.axis[i].name, &ax.axis[i].size, &mesh[i]);
    mw_tensor *c = mw_full(g, ax, (float)v->f[0]);
    for (int i = 0; i < ax.rank; i++)
        if (mesh[i]) c = mw_shard(g, c, ax.axis[i].name, mesh[i]);
    return mw_add(g, x[0], c);
}
static int r_full(rg_graph *r, const int *x, const cf_variant *v) {
    return rg_add(r, x[0], rg_const(r, rg_axes_of(r, x[0]), (double)(float)v->f[0]));
}

/* --- elementwise functions -------------------------------------------------------------------- */

static mw_tensor *b_map(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    switch (v->i[0]) {
    case 0: return mw_relu(g, x[0]);
    case 1: return mw_abs(g, x[0]);
    case 2: return mw_tanh(g, x[0]);
    case 3: return mw_sigmoid(g, x[0]);
    case 4: return mw_exp(g, x[0]);
    case 5: return mw_log(g, x[0]);
    case 6: return mw_sqrt(g, x[0]);
    case 7: return mw_gelu(g, x[0]);
    case 8: return mw_gelu_erf(g, x[0]);
    default: return mw_silu(g, x[0]);
    }
}
static int r_map(rg_graph *r, const int *x, const cf_variant *v) {
    static const rg_fn fn[] = {RG_RELU, RG_ABS,  RG_TANH,      RG_SIGMOID,  RG_EXP,
                               RG_LOG,  RG_SQRT, RG_GELU_TANH, RG_GELU_ERF, RG_SILU};
    return rg_map(r, x[0], fn[v->i[0]]);
}

/* a cmp b as 0/1 (no gradient). */
static mw_tensor *b_compare(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    return mw_compare(g, x[0], x[1], (mw_comparison)v->i[0]);
}
static int r_compare(rg_graph *r, const int *x, const cf_variant *v) {
    int d = rg_sub(r, x[0], x[1]), n = rg_scale(r, d, -1.0);
    int gt = rg_map(r, d, RG_STEP_GT), lt = rg_map(r, n, RG_STEP_GT);
    const rg_axes *ax = rg_axes_of(r, gt);
    int one = rg_const(r, ax, 1.0);
    switch ((mw_comparison)v->i[0]) {
    case MW_GT: return gt;
    case MW_LT: return lt;
    case MW_GE: return rg_sub(r, one, lt);
    case MW_LE: return rg_sub(r, one, gt);
    case MW_EQ: return rg_sub(r, rg_sub(r, one, gt), lt);
    default: return rg_add(r, gt, lt);
    }
}

/* mask ? x : y. */
static mw_tensor *b_where(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    (void)v;
    return mw_where(g, x[2], x[0], x[1]);
}
static int r_where(rg_graph *r, const int *x, const cf_variant *v) {
    (void)v;
    return rg_add(r, x[1], rg_mul(r, x[2], rg_sub(r, x[0], x[1])));
}

/* maximum / minimum: where a and b tie each gets half the gradient. */
static mw_tensor *b_extremum(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    return v->i[0] ? mw_minimum(g, x[0], x[1]) : mw_maximum(g, x[0], x[1]);
}
static int r_extremum(rg_graph *r, const int *x, const cf_variant *v) {
    int d = v->i[0] ? rg_sub(r, x[1], x[0]) : rg_sub(r, x[0], x[1]);
    int gt = rg_map(r, d, RG_STEP_GT), lt = rg_map(r, rg_scale(r, d, -1.0), RG_STEP_GT);
    const rg_axes *ax = rg_axes_of(r, gt);
    int eq = rg_sub(r, rg_sub(r, rg_const(r, ax, 1.0), gt), lt);
    int m = rg_add(r, gt, rg_scale(r, eq, 0.5)); /* 1, 1/2 or 0: a's share */
    return rg_add(r, x[1], rg_mul(r, m, rg_sub(r, x[0], x[1])));
}

static mw_tensor *b_dropout(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    return mw_dropout(g, x[0], (float)v->f[0], 1234);
}
static int r_identity(rg_graph *r, const int *x, const cf_variant *v) {
    (void)v;
    return rg_scale(r, x[0], 1.0);
}

/* --- reductions ---------------------------------------------------------------------------------
 */

/* i[0]: 0 sums "Seq", 1 "Batch,Feat", 2 every axis; i[1]: mean instead of sum. */
static const char *const sum_axes[] = {"Seq", "Batch,Feat", NULL};

static mw_tensor *b_sum(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    return v->i[1] ? mw_mean(g, x[0], sum_axes[v->i[0]]) : mw_sum(g, x[0], sum_axes[v->i[0]]);
}
static int r_sum(rg_graph *r, const int *x, const cf_variant *v) {
    const rg_axes *ax = rg_axes_of(r, x[0]);
    const char *keep[RG_MAX_RANK];
    int n = 0;
    double count = 1;
    for (int i = 0; i < ax->rank; i++) {
        const char *list = sum_axes[v->i[0]];
        int drop = !list || strstr(list, ax->name[i]) != NULL;
        if (drop)
            count *= (double)ax->size[i];
        else
            keep[n++] = ax->name[i];
    }
    int s = rg_sum_to(r, x[0], keep, n);
    return v->i[1] ? rg_scale(r, s, (double)(float)(1.0 / count)) : s;
}

/* The largest element along Seq (i[0] 0), its index (1). */
static mw_tensor *b_max(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    return v->i[0] ? mw_argmax(g, x[0], "Seq") : mw_max(g, x[0], "Seq");
}
static int r_max(rg_graph *r, const int *x, const cf_variant *v) {
    return v->i[0] ? rg_argmax(r, x[0], "Seq") : rg_max(r, x[0], "Seq");
}

/* --- contractions -------------------------------------------------------------------------------
 */

static mw_tensor *b_dot(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    (void)v;
    return mw_dot(g, x[0], x[1], "K");
}
/* mw_dot's result: shared axes (a's order), a's own, b's own. */
static int r_dot(rg_graph *r, const int *x, const cf_variant *v) {
    (void)v;
    const rg_axes *a = rg_axes_of(r, x[0]), *b = rg_axes_of(r, x[1]);
    const char *out[RG_MAX_RANK];
    int n = 0;
    for (int i = 0; i < a->rank; i++)
        if (strcmp(a->name[i], "K")) out[n++] = a->name[i];
    for (int i = 0; i < b->rank; i++)
        if (strcmp(b->name[i], "K") && rg_find(a, b->name[i]) < 0) out[n++] = b->name[i];
    return rg_contract(r, x[0], x[1], out, n);
}

/* mw_contract to an explicit order, summing K and L. */
static const char *const contract_out[] = {"N,Batch,M", "M,N,Batch", "Batch,N,M"};
static mw_tensor *b_contract(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    return mw_contract(g, x[0], x[1], contract_out[v->i[0]]);
}
static int r_contract(rg_graph *r, const int *x, const cf_variant *v) {
    const char *out[3];
    const char *list = contract_out[v->i[0]];
    static char buf[3][16];
    for (int i = 0; i < 3; i++) {
        const char *p = list;
        for (int k = 0; k < i; k++) p = strchr(p, ',') + 1;
        size_t len = strcspn(p, ",");
        memcpy(buf[i], p, len);
        buf[i][len] = '\0';
        out[i] = buf[i];
    }
    return rg_contract(r, x[0], x[1], out, 3);
}

/* gelu(x . w + b): the bias fused into the GEMM's epilogue, its gradient's column sums into the
 * GELU gradient's kernel; i[0] selects the exact GELU. */
static mw_tensor *b_linear(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    mw_tensor *h = mw_add(g, mw_dot(g, x[0], x[1], "In"), x[2]);
    return v->i[0] == 2 ? mw_silu(g, h) : v->i[0] ? mw_gelu_erf(g, h) : mw_gelu(g, h);
}
static int r_linear(rg_graph *r, const int *x, const cf_variant *v) {
    const char *out[] = {"Batch", "Seq", "Out"};
    int h = rg_add(r, rg_contract(r, x[0], x[1], out, 3), x[2]);
    return rg_map(r, h, v->i[0] == 2 ? RG_SILU : v->i[0] ? RG_GELU_ERF : RG_GELU_TANH);
}

/* silu(x[Part=0]) * x[Part=1]. */
static int swiglu_of(rg_graph *r, int x) {
    int gate = rg_slice(r, x, "Part", 0, 0, NULL), up = rg_slice(r, x, "Part", 1, 0, NULL);
    return rg_mul(r, rg_map(r, gate, RG_SILU), up);
}
static mw_tensor *b_swiglu(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    (void)v;
    return mw_swiglu(g, x[0], "Part");
}
static int r_swiglu(rg_graph *r, const int *x, const cf_variant *v) {
    (void)v;
    return swiglu_of(r, x[0]);
}

/* Llama's MLP: swiglu(x . w_gate_up) . w_down, the gate and up projections one contraction, the
 * SwiGLU's output read by the down projection (bf16 where the policy asks). */
static mw_tensor *b_swiglu_mlp(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    (void)v;
    return mw_dot(g, mw_swiglu(g, mw_dot(g, x[0], x[1], "Embed"), "Part"), x[2], "Hid");
}
static int r_swiglu_mlp(rg_graph *r, const int *x, const cf_variant *v) {
    (void)v;
    const char *o1[] = {"Batch", "Part", "Hid"}, *o2[] = {"Batch", "Out"};
    return rg_contract(r, swiglu_of(r, rg_contract(r, x[0], x[1], o1, 3)), x[2], o2, 2);
}

/* (gelu(x . w1 + b1)) . w2 + b2: the GELU's output read by a contraction (bf16 where the policy
 * asks), its gradient made for one. */
static mw_tensor *b_mlp(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    (void)v;
    mw_tensor *h = mw_gelu(g, mw_add(g, mw_dot(g, x[0], x[1], "In"), x[2]));
    return mw_dot(g, h, x[3], "Hid");
}
static int r_mlp(rg_graph *r, const int *x, const cf_variant *v) {
    (void)v;
    const char *o1[] = {"Batch", "Hid"}, *o2[] = {"Batch", "Out"};
    int h = rg_map(r, rg_add(r, rg_contract(r, x[0], x[1], o1, 2), x[2]), RG_GELU_TANH);
    return rg_contract(r, h, x[3], o2, 2);
}

/* x + (h . w): the residual added by the GEMM (its addend). */
static mw_tensor *b_residual(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    (void)v;
    return mw_add(g, x[0], mw_rename(g, mw_dot(g, x[1], x[2], "In"), "Out", "Feat"));
}
static int r_residual(rg_graph *r, const int *x, const cf_variant *v) {
    (void)v;
    const char *out[] = {"Batch", "Out"};
    return rg_add(r, x[0], renamed(r, rg_contract(r, x[1], x[2], out, 2), "Out", "Feat"));
}

/* FSDP: the weights split over X, the mesh axis that also splits the batch (the configuration's
 * Batch@X): gathered before use (the second prefetched), gradients reduce-scattered. */
static mw_tensor *b_fsdp(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    (void)v;
    mw_shard(g, x[1], "In", "X");
    mw_shard(g, x[2], "Hid", "X");
    return mw_dot(g, mw_tanh(g, mw_dot(g, x[0], x[1], "In")), x[2], "Hid");
}
static int r_fsdp(rg_graph *r, const int *x, const cf_variant *v) {
    (void)v;
    const char *o1[] = {"Batch", "Hid"}, *o2[] = {"Batch", "Out"};
    return rg_contract(r, rg_map(r, rg_contract(r, x[0], x[1], o1, 2), RG_TANH), x[2], o2, 2);
}

/* --- normalisation and softmax ------------------------------------------------------------------
 */

static mw_tensor *b_layernorm(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    return mw_layernorm(g, x[0], x[1], x[2], "Feat", (float)v->f[0]);
}
static int r_layernorm(rg_graph *r, const int *x, const cf_variant *v) {
    return rg_layernorm(r, x[0], x[1], x[2], "Feat", (double)(float)v->f[0]);
}

/* x + ln(x) . w: the layer norm's output read by a contraction (written in bf16 where the policy
 * asks), its weight and bias gradients fused into the dx kernel, the residual's gradient added by
 * it. */
static mw_tensor *b_prenorm(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    mw_tensor *h = mw_layernorm(g, x[0], x[1], x[2], "Feat", (float)v->f[0]);
    return mw_add(g, x[0], mw_rename(g, mw_dot(g, h, x[3], "Feat"), "Out", "Feat"));
}
static int r_prenorm(rg_graph *r, const int *x, const cf_variant *v) {
    int h = rg_layernorm(r, x[0], x[1], x[2], "Feat", (double)(float)v->f[0]);
    const rg_axes *ax = rg_axes_of(r, h);
    const char *out[RG_MAX_RANK];
    int n = 0;
    for (int i = 0; i < ax->rank; i++)
        if (strcmp(ax->name[i], "Feat")) out[n++] = ax->name[i];
    out[n++] = "Out";
    return rg_add(r, x[0], renamed(r, rg_contract(r, h, x[3], out, n), "Out", "Feat"));
}

/* Layer norm without a bias (b NULL: no bias operand, no bias gradient); the reference's
 * bias is a constant 0 over w's axis. */
static int zero_bias(rg_graph *r, int w) {
    const rg_axes ax = *rg_axes_of(r, w);
    return rg_const(r, &ax, 0.0);
}
static mw_tensor *b_layernorm_nobias(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    return mw_layernorm(g, x[0], x[1], NULL, "Feat", (float)v->f[0]);
}
static int r_layernorm_nobias(rg_graph *r, const int *x, const cf_variant *v) {
    return rg_layernorm(r, x[0], x[1], zero_bias(r, x[1]), "Feat", (double)(float)v->f[0]);
}

/* x + ln(x) . w without a bias: the weight gradient fused into the dx kernel alone. */
static mw_tensor *b_prenorm_nobias(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    mw_tensor *h = mw_layernorm(g, x[0], x[1], NULL, "Feat", (float)v->f[0]);
    return mw_add(g, x[0], mw_rename(g, mw_dot(g, h, x[2], "Feat"), "Out", "Feat"));
}
static int r_prenorm_nobias(rg_graph *r, const int *x, const cf_variant *v) {
    int h = rg_layernorm(r, x[0], x[1], zero_bias(r, x[1]), "Feat", (double)(float)v->f[0]);
    const rg_axes ax = *rg_axes_of(r, h);
    const char *out[RG_MAX_RANK];
    int n = 0;
    for (int i = 0; i < ax.rank; i++)
        if (strcmp(ax.name[i], "Feat")) out[n++] = ax.name[i];
    out[n++] = "Out";
    return rg_add(r, x[0], renamed(r, rg_contract(r, h, x[2], out, n), "Out", "Feat"));
}

static mw_tensor *b_rmsnorm(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    return mw_rmsnorm(g, x[0], x[1], "Feat", (float)v->f[0]);
}

/* x / sqrt(sum(x^2 over Feat) / n + eps) * w, written out from the reference's primitives. */
static int rmsnorm_of(rg_graph *r, int x, int w, double eps) {
    /* Copies: a new node may move the reference's node array. */
    const rg_axes ax = *rg_axes_of(r, x);
    const char *keep[RG_MAX_RANK];
    int nkeep = 0;
    for (int i = 0; i < ax.rank; i++)
        if (strcmp(ax.name[i], "Feat")) keep[nkeep++] = ax.name[i];
    double n = (double)ax.size[rg_find(&ax, "Feat")];
    int ms = rg_scale(r, rg_sum_to(r, rg_mul(r, x, x), keep, nkeep), 1.0 / n);
    const rg_axes ma = *rg_axes_of(r, ms);
    int den = rg_map(r, rg_add(r, ms, rg_const(r, &ma, eps)), RG_SQRT);
    return rg_mul(r, rg_div(r, x, den), w);
}
static int r_rmsnorm(rg_graph *r, const int *x, const cf_variant *v) {
    return rmsnorm_of(r, x[0], x[1], (double)(float)v->f[0]);
}

/* x + rmsnorm(x) . w, as b_prenorm: the output read by a contraction (bf16 where the policy asks),
 * the weight's gradient fused into the dx kernel, the residual's gradient added by it. */
static mw_tensor *b_rms_prenorm(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    mw_tensor *h = mw_rmsnorm(g, x[0], x[1], "Feat", (float)v->f[0]);
    return mw_add(g, x[0], mw_rename(g, mw_dot(g, h, x[2], "Feat"), "Out", "Feat"));
}
static int r_rms_prenorm(rg_graph *r, const int *x, const cf_variant *v) {
    int h = rmsnorm_of(r, x[0], x[1], (double)(float)v->f[0]);
    const rg_axes ax = *rg_axes_of(r, h);
    const char *out[RG_MAX_RANK];
    int n = 0;
    for (int i = 0; i < ax.rank; i++)
        if (strcmp(ax.name[i], "Feat")) out[n++] = ax.name[i];
    out[n++] = "Out";
    return rg_add(r, x[0], renamed(r, rg_contract(r, h, x[2], out, n), "Out", "Feat"));
}

static mw_tensor *b_softmax(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    return v->i[0] ? mw_causal_softmax(g, x[0], "Q", "K", (float)v->f[0])
                   : mw_softmax(g, x[0], "K", (float)v->f[0]);
}
static int r_softmax(rg_graph *r, const int *x, const cf_variant *v) {
    return rg_softmax(r, x[0], "K", (double)(float)v->f[0], v->i[0] ? "Q" : NULL);
}

/* --- attention -------------------------------------------------------------------------------- */

static mw_tensor *b_attention(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    return mw_attention(g, x[0], "Part", "Seq", "HeadDim", v->i[0], (float)v->f[0]);
}

/* softmax(scale q k^T) v written out: q, k, v sliced from qkv, the keys' Seq renamed Key. */
static int attention_of(rg_graph *r, int qkv, int causal, double scale) {
    int q = rg_slice(r, qkv, "Part", 0, 0, NULL);
    int k = renamed(r, rg_slice(r, qkv, "Part", 1, 0, NULL), "Seq", "Key");
    int vv = renamed(r, rg_slice(r, qkv, "Part", 2, 0, NULL), "Seq", "Key");
    const rg_axes *qa = rg_axes_of(r, q);
    const char *so[RG_MAX_RANK], *oo[RG_MAX_RANK];
    int n = 0;
    for (int i = 0; i < qa->rank; i++)
        if (strcmp(qa->name[i], "HeadDim")) so[n++] = qa->name[i];
    so[n++] = "Key";
    int s = rg_contract(r, q, k, so, n);
    int p = rg_softmax(r, s, "Key", scale, causal ? "Seq" : NULL);
    return rg_contract(r, p, vv, names(qa, oo), qa->rank);
}

static int r_attention(rg_graph *r, const int *x, const cf_variant *v) {
    return attention_of(r, x[0], v->i[0], (double)(float)v->f[0]);
}

/* The qkv of a contraction, as mw_dot lays it out: x's axes but Embed, then w's. */
static int dot_of(rg_graph *r, int a, int b, const char *axis) {
    const rg_axes *aa = rg_axes_of(r, a), *ba = rg_axes_of(r, b);
    const char *out[RG_MAX_RANK];
    int n = 0;
    for (int i = 0; i < aa->rank; i++)
        if (strcmp(aa->name[i], axis) && rg_find(ba, aa->name[i]) >= 0) out[n++] = aa->name[i];
    for (int i = 0; i < aa->rank; i++)
        if (strcmp(aa->name[i], axis) && rg_find(ba, aa->name[i]) < 0) out[n++] = aa->name[i];
    for (int i = 0; i < ba->rank; i++)
        if (strcmp(ba->name[i], axis) && rg_find(aa, ba->name[i]) < 0) out[n++] = ba->name[i];
    return rg_contract(r, a, b, out, n);
}

/* Grouped-query attention: qkv's Part holds G queries, then the key, then the value; the
 * reference slices the queries as a Group axis and broadcasts the key and value over it. */
static mw_tensor *b_attention_grouped(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    return mw_attention_grouped(g, x[0], "Part", "Group", "Seq", "HeadDim", v->i[0],
                                (float)v->f[0]);
}
static int r_attention_grouped(rg_graph *r, const int *x, const cf_variant *v) {
    const rg_axes *qa0 = rg_axes_of(r, x[0]);
    int64_t G = qa0->size[rg_find(qa0, "Part")] - 2;
    int q = rg_slice(r, x[0], "Part", 0, G, "Group");
    int k = renamed(r, rg_slice(r, x[0], "Part", G, 0, NULL), "Seq", "Key");
    int vv = renamed(r, rg_slice(r, x[0], "Part", G + 1, 0, NULL), "Seq", "Key");
    const rg_axes qa = *rg_axes_of(r, q);
    const char *so[RG_MAX_RANK], *oo[RG_MAX_RANK];
    int n = 0;
    for (int i = 0; i < qa.rank; i++)
        if (strcmp(qa.name[i], "HeadDim")) so[n++] = qa.name[i];
    so[n++] = "Key";
    int sc = rg_contract(r, q, k, so, n);
    int p = rg_softmax(r, sc, "Key", (double)(float)v->f[0], v->i[0] ? "Seq" : NULL);
    return rg_contract(r, p, vv, names(&qa, oo), qa.rank);
}

/* attention(x . wqkv): qkv laid out as the contraction leaves it (the issue of a bf16 d(qkv)). */
static mw_tensor *b_attention_of_dot(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    return mw_attention(g, mw_dot(g, x[0], x[1], "Embed"), "Part", "Seq", "HeadDim", v->i[0],
                        (float)v->f[0]);
}
static int r_attention_of_dot(rg_graph *r, const int *x, const cf_variant *v) {
    return attention_of(r, dot_of(r, x[0], x[1], "Embed"), v->i[0], (double)(float)v->f[0]);
}

/* A pre-norm transformer block: x + attention(ln1(x)) projected, then + an exact-GELU MLP of
 * ln2 of that. Operands: x, ln1w, ln1b, wqkv, wo [Out, Head, HeadDim], ln2w, ln2b, w1 [Hid,
 * Embed], b1, w2 [Out, Hid]. */
static mw_tensor *b_block(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    mw_tensor *h = mw_layernorm(g, x[0], x[1], x[2], "Embed", 1e-5f);
    mw_tensor *a = mw_attention(g, mw_dot(g, h, x[3], "Embed"), "Part", "Seq", "HeadDim", v->i[0],
                                (float)v->f[0]);
    mw_tensor *o = mw_contract(g, a, x[4], "Batch,Seq,Out");
    mw_tensor *r = mw_add(g, x[0], mw_rename(g, o, "Out", "Embed"));
    mw_tensor *m = mw_layernorm(g, r, x[5], x[6], "Embed", 1e-5f);
    mw_tensor *f = mw_gelu_erf(g, mw_add(g, mw_dot(g, m, x[7], "Embed"), x[8]));
    return mw_add(g, r, mw_rename(g, mw_dot(g, f, x[9], "Hid"), "Out", "Embed"));
}
static int r_block(rg_graph *r, const int *x, const cf_variant *v) {
    int h = rg_layernorm(r, x[0], x[1], x[2], "Embed", (double)1e-5f);
    int a = attention_of(r, dot_of(r, h, x[3], "Embed"), v->i[0], (double)(float)v->f[0]);
    const char *bso[] = {"Batch", "Seq", "Out"};
    int res = rg_add(r, x[0], renamed(r, rg_contract(r, a, x[4], bso, 3), "Out", "Embed"));
    int m = rg_layernorm(r, res, x[5], x[6], "Embed", (double)1e-5f);
    int f = rg_map(r, rg_add(r, dot_of(r, m, x[7], "Embed"), x[8]), RG_GELU_ERF);
    return rg_add(r, res, renamed(r, dot_of(r, f, x[9], "Hid"), "Out", "Embed"));
}

/* --- lookups and losses ----------------------------------------------------------------------- */

static mw_tensor *b_embedding(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    (void)v;
    return mw_embedding(g, x[0], x[1], "Vocab");
}
static int r_embedding(rg_graph *r, const int *x, const cf_variant *v) {
    (void)v;
    return rg_embedding(r, x[0], x[1], "Vocab");
}

static mw_tensor *b_xent(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    return mw_cross_entropy(g, x[0], x[1], "Vocab", v->i[0]);
}
static int r_xent(rg_graph *r, const int *x, const cf_variant *v) {
    int64_t valid =
        v->i[0] ? v->i[0] : rg_axes_of(r, x[0])->size[rg_find(rg_axes_of(r, x[0]), "Vocab")];
    return rg_xent(r, x[0], x[1], "Vocab", valid);
}

/* --- moving data -------------------------------------------------------------------------------
 */

static mw_tensor *b_permute(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    (void)v;
    return mw_permute(g, x[0], "Feat,Batch,Seq");
}
static int r_permute(rg_graph *r, const int *x, const cf_variant *v) {
    (void)v;
    const char *order[] = {"Feat", "Batch", "Seq"};
    return rg_permute(r, x[0], order, 3);
}

/* rename Seq -> T, split Feat -> H, D, merge T, H -> TH (x's order ends Seq, Feat). */
static mw_tensor *b_reshape(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    (void)v;
    mw_tensor *t = mw_split(g, mw_rename(g, x[0], "Seq", "T"), "Feat", "H=3,D");
    return mw_merge(g, t, "T,H", "TH");
}
static int r_reshape(rg_graph *r, const int *x, const cf_variant *v) {
    (void)v;
    const rg_axes *ax = rg_axes_of(r, x[0]);
    rg_axes to = {0};
    for (int i = 0; i < ax->rank; i++) {
        if (!strcmp(ax->name[i], "Seq")) {
            strcpy(to.name[to.rank], "TH");
            to.size[to.rank++] = ax->size[i] * 3;
        } else if (!strcmp(ax->name[i], "Feat")) {
            strcpy(to.name[to.rank], "D");
            to.size[to.rank++] = ax->size[i] / 3;
        } else {
            strcpy(to.name[to.rank], ax->name[i]);
            to.size[to.rank++] = ax->size[i];
        }
    }
    return rg_reshape(r, x[0], &to);
}

/* i[0] 0: rows [i[1], i[1] + i[2]) of Seq named S2; 1: row i[1], the axis dropped. */
static mw_tensor *b_slice(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    return v->i[0] ? mw_select(g, x[0], "Seq", v->i[1])
                   : mw_slice(g, x[0], "Seq", v->i[1], v->i[2], "S2");
}
static int r_slice(rg_graph *r, const int *x, const cf_variant *v) {
    return v->i[0] ? rg_slice(r, x[0], "Seq", v->i[1], 0, NULL)
                   : rg_slice(r, x[0], "Seq", v->i[1], v->i[2], "S2");
}

/* a and b joined along Seq (the result in a's order). */
static mw_tensor *b_concat(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    (void)v;
    mw_tensor *xs[2] = {x[0], x[1]};
    return mw_concat(g, xs, 2, "Seq");
}
static int r_concat(rg_graph *r, const int *x, const cf_variant *v) {
    (void)v;
    int64_t n = rg_axes_of(r, x[0])->size[rg_find(rg_axes_of(r, x[0]), "Seq")];
    return rg_add(r, rg_pad(r, x[0], "Seq", 0, 2 * n, NULL),
                  rg_pad(r, x[1], "Seq", n, 2 * n, NULL));
}

/* --- inference: states and cached attention ------------------------------------------------- */

/* The state [Batch, Seq, Feat] with value [Batch, Feat] written at index [Batch] along Seq. */
static mw_tensor *b_state_write(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    (void)v;
    return mw_state_write(g, x[0], x[1], "Seq", x[2]);
}
/* zero + onehot(index) (x) value, per batch row. */
static int r_state_write(rg_graph *r, const int *x, const cf_variant *v) {
    (void)v;
    const rg_axes *sa = rg_axes_of(r, x[0]);
    rg_axes oh = {0};
    for (int i = 0; i < sa->rank; i++)
        if (strcmp(sa->name[i], "Feat")) {
            strcpy(oh.name[oh.rank], sa->name[i]);
            oh.size[oh.rank++] = sa->size[i];
        }
    int64_t nb = oh.size[0], ns = oh.size[1];
    double *hot = calloc((size_t)(nb * ns), sizeof *hot);
    const int32_t *idx = rg_idvalue(r, x[2]);
    for (int64_t b = 0; b < nb; b++) hot[b * ns + idx[b]] = 1.0;
    int h = rg_leaf(r, &oh, hot);
    free(hot);
    const char *out[RG_MAX_RANK];
    return rg_add(r, x[0], rg_contract(r, h, x[1], names(sa, out), sa->rank));
}

/* q [Batch, Head, Feat] against kv [Batch, Seq, Part=2, Head, Feat] up to pos [Batch]. */
static mw_tensor *b_cached(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    return mw_attention_cached(g, x[0], x[1], "Part", "Seq", "Feat", x[2], (float)v->f[0]);
}
static int r_cached(rg_graph *r, const int *x, const cf_variant *v) {
    int k = rg_slice(r, x[1], "Part", 0, 0, NULL), vv = rg_slice(r, x[1], "Part", 1, 0, NULL);
    const char *so[] = {"Batch", "Head", "Seq"}, *oo[] = {"Batch", "Head", "Feat"};
    int s = rg_contract(r, x[0], k, so, 3);
    const rg_axes *sa = rg_axes_of(r, s);
    double *mask = calloc((size_t)rg_axes_numel(sa), sizeof *mask);
    const int32_t *pos = rg_idvalue(r, x[2]);
    for (int64_t b = 0; b < sa->size[0]; b++)
        for (int64_t h = 0; h < sa->size[1]; h++)
            for (int64_t j = 0; j < sa->size[2]; j++)
                mask[(b * sa->size[1] + h) * sa->size[2] + j] = j <= pos[b] ? 0.0 : -INFINITY;
    int m = rg_leaf(r, sa, mask);
    free(mask);
    /* scale s, then the mask: softmax(x, scale 1) */
    int p = rg_softmax(r, rg_add(r, rg_scale(r, s, (double)(float)v->f[0]), m), "Seq", 1.0, NULL);
    return rg_contract(r, p, vv, oo, 3);
}

/* q [Batch, Head, Group, Feat] (each key/value head's G queries) against kv [Batch, Seq, Part=2,
 * Head, Feat] up to pos [Batch]. */
static mw_tensor *b_cached_grouped(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    return mw_attention_cached(g, x[0], x[1], "Part", "Seq", "Feat", x[2], (float)v->f[0]);
}
static int r_cached_grouped(rg_graph *r, const int *x, const cf_variant *v) {
    int k = rg_slice(r, x[1], "Part", 0, 0, NULL), vv = rg_slice(r, x[1], "Part", 1, 0, NULL);
    const char *so[] = {"Batch", "Head", "Group", "Seq"},
               *oo[] = {"Batch", "Head", "Group", "Feat"};
    int s = rg_contract(r, x[0], k, so, 4);
    const rg_axes sa = *rg_axes_of(r, s);
    int64_t rows = sa.size[1] * sa.size[2], n = sa.size[3];
    double *mask = calloc((size_t)rg_axes_numel(&sa), sizeof *mask);
    const int32_t *pos = rg_idvalue(r, x[2]);
    for (int64_t b = 0; b < sa.size[0]; b++)
        for (int64_t h = 0; h < rows; h++)
            for (int64_t j = 0; j < n; j++)
                mask[(b * rows + h) * n + j] = j <= pos[b] ? 0.0 : -INFINITY;
    int m = rg_leaf(r, &sa, mask);
    free(mask);
    int p = rg_softmax(r, rg_add(r, rg_scale(r, s, (double)(float)v->f[0]), m), "Seq", 1.0, NULL);
    return rg_contract(r, p, vv, oo, 4);
}

/* --- rotary embeddings ----------------------------------------------------------------------- */

/* A row's rotary parameters: i[0] the style, i[1] the offset, i[2] the rotated features (0: all),
 * i[3] llama3 scaling (factor 8, low 1, high 4, original 64: with 16 features and theta 1e4 the
 * wavelengths fall in all three bands); f[0] theta. */
static mw_rope_config rope_cfg(const cf_variant *v) {
    mw_rope_config c = {.theta = (float)v->f[0],
                        .style = (mw_rope_style)v->i[0],
                        .offset = v->i[1],
                        .dims = v->i[2]};
    if (v->i[3])
        c.scaling = MW_ROPE_SCALING_LLAMA3, c.factor = 8, c.low_freq_factor = 1,
        c.high_freq_factor = 4, c.original_max_positions = 64;
    return c;
}

/* The definition in float64: f_j = theta^(-2j/dims) (llama3: scaled by wavelength band), a row
 * at position p rotated by p f_j, built from slices, products and pads against tables of cos and
 * sin over the position's axes (pos's, then Seq) and F2 (the pairs). */
static int rope_ref(rg_graph *r, int x, int pos, const char *seq, const cf_variant *v) {
    const mw_rope_config c = rope_cfg(v);
    const rg_axes ax = *rg_axes_of(r, x);
    int64_t n = ax.size[rg_find(&ax, "Feat")], dims = c.dims ? c.dims : n, h = dims / 2;
    double inv[64];
    for (int64_t j = 0; j < h; j++) {
        double f = pow((double)c.theta, -2.0 * (double)j / (double)dims);
        if (c.scaling) {
            double wl = 6.283185307179586 / f, old = (double)c.original_max_positions;
            double lo = old / c.low_freq_factor, hi = old / c.high_freq_factor;
            if (wl > lo)
                f /= c.factor;
            else if (wl >= hi) {
                double sm =
                    (old / wl - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
                f = (1 - sm) * f / c.factor + sm * f;
            }
        }
        inv[j] = f;
    }
    rg_axes t = {0};
    int64_t npos = 1, nseq = 1;
    if (pos >= 0) {
        t = *rg_axes_of(r, pos);
        npos = rg_axes_numel(&t);
    }
    if (seq) {
        nseq = ax.size[rg_find(&ax, seq)];
        snprintf(t.name[t.rank], RG_NAME, "%s", seq);
        t.size[t.rank++] = nseq;
    }
    snprintf(t.name[t.rank], RG_NAME, "F2");
    t.size[t.rank++] = h;
    double *cv = malloc((size_t)(npos * nseq * h) * sizeof *cv);
    double *sv = malloc((size_t)(npos * nseq * h) * sizeof *sv);
    const int32_t *pv = pos >= 0 ? rg_idvalue(r, pos) : NULL;
    for (int64_t e = 0; e < npos; e++)
        for (int64_t i = 0; i < nseq; i++)
            for (int64_t j = 0; j < h; j++) {
                double p = (double)(c.offset + i + (pv ? pv[e] : 0));
                cv[(e * nseq + i) * h + j] = cos(p * inv[j]);
                sv[(e * nseq + i) * h + j] = sin(p * inv[j]);
            }
    int cs = rg_leaf(r, &t, cv), sn = rg_leaf(r, &t, sv);
    free(cv);
    free(sv);
    int xr = rg_slice(r, x, "Feat", 0, dims, "FD"), yr;
    if (c.style == MW_ROPE_HALF) {
        int x1 = rg_slice(r, xr, "FD", 0, h, "F2"), x2 = rg_slice(r, xr, "FD", h, h, "F2");
        int y1 = rg_sub(r, rg_mul(r, x1, cs), rg_mul(r, x2, sn));
        int y2 = rg_add(r, rg_mul(r, x2, cs), rg_mul(r, x1, sn));
        yr = rg_add(r, rg_pad(r, y1, "F2", 0, dims, "FD"), rg_pad(r, y2, "F2", h, dims, "FD"));
    } else {
        rg_axes pa = *rg_axes_of(r, xr); /* FD (last) as F2 x Pair */
        pa.size[pa.rank - 1] = h;
        snprintf(pa.name[pa.rank - 1], RG_NAME, "F2");
        snprintf(pa.name[pa.rank], RG_NAME, "Pair");
        pa.size[pa.rank++] = 2;
        const rg_axes fa = *rg_axes_of(r, xr);
        int xp = rg_reshape(r, xr, &pa);
        int x0 = rg_slice(r, xp, "Pair", 0, 1, NULL), x1 = rg_slice(r, xp, "Pair", 1, 1, NULL);
        int y0 = rg_sub(r, rg_mul(r, x0, cs), rg_mul(r, x1, sn));
        int y1 = rg_add(r, rg_mul(r, x1, cs), rg_mul(r, x0, sn));
        int yp = rg_add(r, rg_pad(r, y0, "Pair", 0, 2, NULL), rg_pad(r, y1, "Pair", 1, 2, NULL));
        yr = rg_reshape(r, yp, &fa);
    }
    int y = rg_pad(r, yr, "FD", 0, n, "Feat");
    if (dims < n)
        y = rg_add(r, y,
                   rg_pad(r, rg_slice(r, x, "Feat", dims, n - dims, "FR"), "FR", dims, n, "Feat"));
    return y;
}

static mw_tensor *b_rope(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    const mw_rope_config c = rope_cfg(v);
    return mw_rope(g, x[0], "Seq", "Feat", NULL, &c);
}
static int r_rope(rg_graph *r, const int *x, const cf_variant *v) {
    return rope_ref(r, x[0], -1, "Seq", v);
}
/* One decoding step: no sequence axis, each batch row at its own position pos[Batch]. */
static mw_tensor *b_rope_pos(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    const mw_rope_config c = rope_cfg(v);
    return mw_rope(g, x[0], NULL, "Feat", x[1], &c);
}
static int r_rope_pos(rg_graph *r, const int *x, const cf_variant *v) {
    return rope_ref(r, x[0], x[1], NULL, v);
}
/* A continued prompt per batch row: Seq positions from each row's start pos[Batch]. */
static mw_tensor *b_rope_seq_pos(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    const mw_rope_config c = rope_cfg(v);
    return mw_rope(g, x[0], "Seq", "Feat", x[1], &c);
}
static int r_rope_seq_pos(rg_graph *r, const int *x, const cf_variant *v) {
    return rope_ref(r, x[0], x[1], "Seq", v);
}

/* Rotary embeddings on the first f[1] rows of a part axis (a fused q/k/v's queries and key), the
 * others copied. */
static mw_tensor *b_rope_parts(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    mw_rope_config c = rope_cfg(v);
    c.part_axis = "Part";
    c.parts = (int64_t)v->f[1];
    return mw_rope(g, x[0], "Seq", "Feat", NULL, &c);
}
static int r_rope_parts(rg_graph *r, const int *x, const cf_variant *v) {
    const rg_axes ax = *rg_axes_of(r, x[0]);
    int64_t size = ax.size[rg_find(&ax, "Part")], parts = (int64_t)v->f[1];
    int y = rg_pad(r, rope_ref(r, rg_slice(r, x[0], "Part", 0, parts, NULL), -1, "Seq", v), "Part",
                   0, size, NULL);
    if (parts == size) return y;
    return rg_add(
        r, y,
        rg_pad(r, rg_slice(r, x[0], "Part", parts, size - parts, NULL), "Part", parts, size, NULL));
}

/* Grouped-query attention of rope(x . w) rotating the queries and the key (the Part axis's first
 * G + 1 rows), always causal, with f[1] the scale: what a Llama layer computes, and the graph
 * whose rotation the plan applies inside the attention kernels where the device's kernels can
 * (find_rotary: the projection's gradient is no parameter's), so that the rows rope_parts and
 * attention_grouped alone no longer run that code. */
static mw_tensor *rope_attention(mw_graph *g, mw_tensor *const *x, const cf_variant *v,
                                 int value_too) {
    mw_rope_config c = rope_cfg(v);
    int64_t parts = 0;
    for (int i = 0; i < mw_tensor_rank(x[1]); i++) {
        const char *name;
        int64_t size;
        if (mw_tensor_axis(x[1], i, &name, &size, NULL) == MW_OK && !strcmp(name, "Part"))
            parts = size - 1 + value_too;
    }
    c.part_axis = "Part";
    c.parts = parts;
    mw_tensor *q = mw_rope(g, mw_dot(g, x[0], x[1], "Embed"), "Seq", "Feat", NULL, &c);
    return mw_attention_grouped(g, q, "Part", "Group", "Seq", "Feat", 1, (float)v->f[1]);
}
static int rope_attention_ref(rg_graph *r, const int *x, const cf_variant *v, int value_too) {
    int qkv = dot_of(r, x[0], x[1], "Embed");
    const rg_axes ax = *rg_axes_of(r, qkv);
    int64_t size = ax.size[rg_find(&ax, "Part")], G = size - 2;
    int rot = rope_ref(r, rg_slice(r, qkv, "Part", 0, G + 1 + value_too, NULL), -1, "Seq", v);
    int q = rg_slice(r, rot, "Part", 0, G, "Group");
    int k = renamed(r, rg_slice(r, rot, "Part", G, 0, NULL), "Seq", "Key");
    int vv = renamed(r, rg_slice(r, value_too ? rot : qkv, "Part", G + 1, 0, NULL), "Seq", "Key");
    const rg_axes qa = *rg_axes_of(r, q);
    const char *so[RG_MAX_RANK], *oo[RG_MAX_RANK];
    int n = 0;
    for (int i = 0; i < qa.rank; i++)
        if (strcmp(qa.name[i], "Feat")) so[n++] = qa.name[i];
    so[n++] = "Key";
    int sc = rg_contract(r, q, k, so, n);
    int p = rg_softmax(r, sc, "Key", (double)(float)v->f[1], "Seq");
    return rg_contract(r, p, vv, names(&qa, oo), qa.rank);
}
static mw_tensor *b_rope_attention(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    return rope_attention(g, x, v, 0);
}
static int r_rope_attention(rg_graph *r, const int *x, const cf_variant *v) {
    return rope_attention_ref(r, x, v, 0);
}
/* The value rotated too: a rotation the attention kernels do not apply (they rotate queries and
 * the key only), so the rope stays a pass of its own. */
static mw_tensor *b_rope_all_attention(mw_graph *g, mw_tensor *const *x, const cf_variant *v) {
    return rope_attention(g, x, v, 1);
}
static int r_rope_all_attention(rg_graph *r, const int *x, const cf_variant *v) {
    return rope_attention_ref(r, x, v, 1);
}

/* --- the table ---------------------------------------------------------------------------------
 */

#define P(name, axes, lo, hi, ...)                                                                 \
    { name, axes, CF_PARAM, lo, hi, __VA_ARGS__ }
#define M(name, axes, lo, hi, ...)                                                                 \
    { name, axes, CF_MASK, lo, hi, __VA_ARGS__ }
#define I(name, axes, lo, hi, ...)                                                                 \
    { name, axes, CF_IDS, lo, hi, __VA_ARGS__ }
#define ANY CF_ANY, NULL

const cf_row cf_rows[] = {
    {.name = "add",
     .covers = "input,param,shard,add,permute,all-reduce",
     .op = {P("a", "Batch,Seq,Feat", -1, 1, ANY), P("b", "Batch,Seq,Feat", -1, 1, ANY)},
     .nops = 2,
     .var = {{"Batch=3,Seq=5,Feat=7", {0}},
             {"Batch=1,Seq=2,Feat=1031", {0}},
             {"Batch=2,Seq=1,Feat=1", {0}}},
     .nvar = 3,
     .split = "Batch,Seq,Feat",
     .build = b_binary,
     .ref = r_binary},
    {.name = "sub_mul",
     .covers = "sub,mul",
     .op = {P("a", "Batch,Seq,Feat", -1, 1, ANY), P("b", "Batch,Seq,Feat", -1, 1, ANY)},
     .nops = 2,
     .var = {{"Batch=3,Seq=5,Feat=7", {1}},
             {"Batch=2,Seq=3,Feat=33", {2}},
             {"Batch=1,Seq=1,Feat=17", {2}}},
     .nvar = 3,
     .split = "Batch,Feat",
     .build = b_binary,
     .ref = r_binary},
    {.name = "div",
     .covers = "div",
     .op = {P("a", "Batch,Seq,Feat", -1, 1, ANY), P("b", "Batch,Seq,Feat", 0.5, 1.5, ANY)},
     .nops = 2,
     .var = {{"Batch=3,Seq=5,Feat=7", {3}}, {"Batch=2,Seq=1,Feat=131", {3}}},
     .nvar = 2,
     .split = "Batch,Feat",
     .amp = 4,
     .build = b_binary,
     .ref = r_binary},
    {.name = "broadcast",
     .covers = "broadcast,sum,add,mul",
     .op = {P("a", "Batch,Seq,Feat", -1, 1, ANY), P("b", "Seq,Feat", -1, 1, ANY)},
     .nops = 2,
     .var = {{"Batch=3,Seq=5,Feat=7", {0, 0}},
             {"Batch=4,Seq=3,Feat=9", {0, 1}},
             {"Batch=3,Seq=2,Feat=5", {2, 1}},
             {"Batch=1,Seq=1,Feat=67", {2, 0}}},
     .nvar = 4,
     .split = "Batch,Seq,Feat",
     .reduce = "Batch",
     .build = b_binary,
     .ref = r_binary},
    {.name = "scale",
     .covers = "scale",
     .op = {P("x", "Batch,Seq,Feat", -1, 1, ANY)},
     .nops = 1,
     .var = {{"Batch=3,Seq=5,Feat=7", .f = {-1.75}}, {"Batch=1,Seq=4,Feat=1031", .f = {0.3}}},
     .nvar = 2,
     .split = "Batch,Feat",
     .build = b_scale,
     .ref = r_scale},
    {.name = "cast",
     .covers = "cast",
     .op = {P("x", "Batch,Seq,Feat", -3, 3, ANY)},
     .nops = 1,
     .var = {{"Batch=3,Seq=5,Feat=7"}, {"Batch=2,Seq=1,Feat=1031"}},
     .nvar = 2,
     .split = "Batch,Feat",
     .flags = CF_EXACT | CF_NO_SOURCES | CF_NO_FD,
     .build = b_cast,
     .ref = r_cast},
    {.name = "full",
     .covers = "fill",
     .op = {P("x", "Batch,Feat", -1, 1, ANY)},
     .nops = 1,
     .var = {{"Batch=3,Feat=7", .f = {0.25}}, {"Batch=1,Feat=33", .f = {-2}}},
     .nvar = 2,
     .split = "Batch",
     .build = b_full,
     .ref = r_full},
    {.name = "maps",
     .covers = "map,map_grad",
     .op = {P("x", "Batch,Seq,Feat", -2, 2, ANY, .away = 0.05)},
     .nops = 1,
     .var = {{"Batch=3,Seq=5,Feat=7", {0}},
             {"Batch=2,Seq=3,Feat=17", {1}},
             {"Batch=3,Seq=4,Feat=9", {2}},
             {"Batch=1,Seq=3,Feat=1031", {3}},
             {"Batch=2,Seq=5,Feat=13", {4}}},
     .nvar = 5,
     .split = "Batch,Feat",
     .build = b_map,
     .ref = r_map},
    {.name = "maps_positive",
     .covers = "map,map_grad",
     .op = {P("x", "Batch,Seq,Feat", 0.2, 3, ANY)},
     .nops = 1,
     .var = {{"Batch=3,Seq=5,Feat=7", {5}}, {"Batch=2,Seq=3,Feat=1031", {6}}},
     .nvar = 2,
     .split = "Batch,Seq",
     .amp = 2,
     .build = b_map,
     .ref = r_map},
    {.name = "gelu",
     .covers = "gelu,gelu_grad",
     .op = {P("x", "Batch,Seq,Feat", -3, 3, ANY)},
     .nops = 1,
     .var = {{"Batch=3,Seq=5,Feat=7", {7}},
             {"Batch=2,Seq=3,Feat=1031", {8}},
             {"Batch=1,Seq=1,Feat=33", {8}}},
     .nvar = 3,
     .split = "Batch,Feat",
     .build = b_map,
     .ref = r_map},
    {.name = "compare",
     .covers = "map,sub",
     .op = {P("a", "Batch,Feat", -2, 2, ANY, .grid = 1),
            P("b", "Batch,Feat", -2, 2, ANY, .grid = 1)},
     .nops = 2,
     .var = {{"Batch=5,Feat=7", {MW_GT}},
             {"Batch=3,Feat=9", {MW_GE}},
             {"Batch=4,Feat=5", {MW_LT}},
             {"Batch=2,Feat=11", {MW_LE}},
             {"Batch=3,Feat=6", {MW_EQ}},
             {"Batch=1,Feat=13", {MW_NE}}},
     .nvar = 6,
     .split = "Batch,Feat",
     .flags = CF_NO_GRAD | CF_EXACT | CF_NO_SOURCES,
     .build = b_compare,
     .ref = r_compare},
    {.name = "where",
     .covers = "add,sub,mul",
     .op = {P("x", "Batch,Feat", -1, 1, ANY), P("y", "Batch,Feat", -1, 1, ANY),
            M("mask", "Batch,Feat", 0, 2, ANY, .grid = 1)},
     .nops = 3,
     .var = {{"Batch=5,Feat=7"}, {"Batch=1,Feat=33"}},
     .nvar = 2,
     .split = "Batch,Feat",
     .build = b_where,
     .ref = r_where},
    {.name = "maximum",
     .covers = "map,mul,add",
     .op = {P("a", "Batch,Feat", -1, 1, ANY), P("b", "Batch,Feat", -1, 1, ANY)},
     .nops = 2,
     .var = {{"Batch=5,Feat=7", {0}}, {"Batch=3,Feat=17", {1}}},
     .nvar = 2,
     .split = "Batch,Feat",
     .build = b_extremum,
     .ref = r_extremum},
    {.name = "maximum_ties",
     .covers = "map",
     .op = {P("a", "Batch,Feat", -2, 2, ANY, .grid = 1),
            P("b", "Batch,Feat", -2, 2, ANY, .grid = 1)},
     .nops = 2,
     .var = {{"Batch=5,Feat=7", {0}}, {"Batch=3,Feat=9", {1}}},
     .nvar = 2,
     .split = "Batch",
     .flags = CF_TIES | CF_NO_SOURCES,
     .build = b_extremum,
     .ref = r_extremum},
    {.name = "dropout",
     .covers = "dropout",
     .op = {P("x", "Batch,Seq,Feat", 0.5, 1.5, ANY)},
     .nops = 1,
     .var = {{"Batch=3,Seq=7,Feat=33", .f = {0.3}}, {"Batch=1,Seq=5,Feat=1031", .f = {0.6}}},
     .nvar = 2,
     .split = "Batch,Feat",
     .flags = CF_DROPOUT,
     .build = b_dropout,
     .ref = r_identity},
    {.name = "sum_mean",
     .covers = "sum,scale,all-reduce",
     .op = {P("x", "Batch,Seq,Feat", -1, 1, ANY)},
     .nops = 1,
     .var = {{"Batch=3,Seq=5,Feat=7", {0, 0}},
             {"Batch=4,Seq=3,Feat=9", {1, 0}},
             {"Batch=3,Seq=7,Feat=5", {2, 1}},
             {"Batch=1,Seq=131,Feat=3", {0, 1}},
             {"Batch=2,Seq=1,Feat=1031", {1, 1}}},
     .nvar = 5,
     .split = "Batch,Seq,Feat",
     .reduce = "Seq,Feat",
     .build = b_sum,
     .ref = r_sum},
    {.name = "max",
     .covers = "reduce_max,sum,div,mul,map",
     .op = {P("x", "Batch,Seq,Feat", -1, 1, ANY, .distinct = 1)},
     .nops = 1,
     .var = {{"Batch=3,Seq=5,Feat=7", {0}}, {"Batch=2,Seq=67,Feat=3", {0}}},
     .nvar = 2,
     .split = "Batch,Seq,Feat",
     .refuse = "Seq",
     .build = b_max,
     .ref = r_max},
    {.name = "max_ties",
     .covers = "reduce_max",
     .op = {P("x", "Batch,Seq,Feat", -2, 2, ANY, .grid = 1)},
     .nops = 1,
     .var = {{"Batch=3,Seq=5,Feat=7", {0}}},
     .nvar = 1,
     .split = "Batch,Feat",
     .refuse = "Seq",
     .flags = CF_TIES | CF_NO_SOURCES,
     .build = b_max,
     .ref = r_max},
    {.name = "argmax",
     .covers = "argmax",
     .op = {P("x", "Batch,Seq,Feat", -1, 1, ANY, .distinct = 1)},
     .nops = 1,
     .var = {{"Batch=3,Seq=5,Feat=7", {1}}, {"Batch=1,Seq=1031,Feat=2", {1}}},
     .nvar = 2,
     .split = "Batch,Seq,Feat",
     .refuse = "Seq",
     .flags = CF_NO_GRAD | CF_EXACT | CF_NO_SOURCES,
     .build = b_max,
     .ref = r_max},
    {.name = "dot",
     .covers = "contract,all-reduce",
     .op = {P("a", "Batch,M,K", -1, 1, ANY), P("b", "K,N", -1, 1, ANY)},
     .nops = 2,
     .var = {{"Batch=3,M=5,K=7,N=9"},
             {"Batch=2,M=33,K=67,N=17"},
             {"Batch=1,M=1,K=1031,N=5"},
             {"Batch=1,M=7,K=1,N=1"}},
     .nvar = 4,
     .split = "Batch,M,K,N",
     .reduce = "K",
     .build = b_dot,
     .ref = r_dot},
    {.name = "dot_batched",
     .covers = "contract",
     .op = {P("a", "Batch,Head,M,K", -1, 1, ANY), P("b", "Batch,Head,K,N", -1, 1, ANY)},
     .nops = 2,
     .var = {{"Batch=2,Head=3,M=5,K=7,N=9"}, {"Batch=1,Head=2,M=17,K=33,N=3"}},
     .nvar = 2,
     .split = "Batch,Head,K",
     .reduce = "K",
     .build = b_dot,
     .ref = r_dot},
    {.name = "contract",
     .covers = "contract",
     .op = {P("a", "Batch,M,K,L", -1, 1, ANY), P("b", "K,L,N", -1, 1, ANY)},
     .nops = 2,
     .var = {{"Batch=2,M=5,K=3,L=7,N=4", {0}},
             {"Batch=3,M=9,K=5,L=2,N=6", {1}},
             {"Batch=1,M=3,K=4,L=5,N=7", {2}}},
     .nvar = 3,
     .split = "Batch,K,N",
     .reduce = "K,L",
     .build = b_contract,
     .ref = r_contract},
    {.name = "silu",
     .covers = "silu,silu_grad",
     .op = {P("x", "Batch,Seq,Feat", -6, 6, ANY)},
     .nops = 1,
     .var = {{"Batch=3,Seq=5,Feat=7", {9}}, {"Batch=2,Seq=3,Feat=1031", {9}}},
     .nvar = 2,
     .split = "Batch,Feat",
     .build = b_map,
     .ref = r_map},
    {.name = "linear_silu",
     .covers = "contract,add,silu,silu_grad",
     .op = {P("x", "Batch,Seq,In", -1, 1, ANY), P("w", "Out,In", -0.5, 0.5, ANY),
            P("bias", "Out", -0.5, 0.5, ANY)},
     .nops = 3,
     .var = {{"Batch=2,Seq=3,In=17,Out=33", {2}}, {"Batch=3,Seq=5,In=9,Out=7", {2}}},
     .nvar = 2,
     .split = "Batch,Out,In",
     .reduce = "In",
     .build = b_linear,
     .ref = r_linear},
    {.name = "swiglu",
     .covers = "swiglu,swiglu_grad",
     .op = {P("x", "Batch,Part,Hid", -4, 4, ANY)},
     .nops = 1,
     .var = {{"Batch=3,Part=2,Hid=7"}, {"Batch=2,Part=2,Hid=1031"}, {"Batch=5,Part=2,Hid=1"}},
     .nvar = 3,
     .split = "Batch,Part,Hid",
     .refuse = "Part",
     .build = b_swiglu,
     .ref = r_swiglu},
    {.name = "swiglu_mlp",
     .covers = "contract,swiglu,swiglu_grad",
     .op = {P("x", "Batch,Embed", -1, 1, ANY), P("wgu", "Part,Hid,Embed", -0.5, 0.5, ANY),
            P("wd", "Out,Hid", -0.5, 0.5, ANY)},
     .nops = 3,
     .var = {{"Batch=4,Embed=9,Part=2,Hid=12,Out=9"}, {"Batch=3,Embed=17,Part=2,Hid=33,Out=5"}},
     .nvar = 2,
     .split = "Batch,Hid",
     .reduce = "Embed,Hid",
     .build = b_swiglu_mlp,
     .ref = r_swiglu_mlp},
    {.name = "rope",
     .covers = "rope,rope_grad",
     .op = {P("x", "Batch,Seq,Head,Feat", -2, 2, CF_LAST, "Feat")},
     .nops = 1,
     .var = {{"Batch=2,Seq=5,Head=3,Feat=8", {0, 0, 0, 0}, {10000}},
             {"Batch=1,Seq=7,Head=2,Feat=16", {1, 3, 0, 0}, {500000}},
             {"Batch=2,Seq=4,Head=1,Feat=12", {0, 0, 8, 0}, {10000}},
             {"Batch=1,Seq=9,Head=2,Feat=16", {0, 100, 0, 1}, {10000}},
             {"Batch=1,Seq=3,Head=2,Feat=10", {1, 0, 6, 1}, {1000000}}},
     .nvar = 5,
     .split = "Batch,Seq,Head,Feat",
     .refuse = "Seq,Feat",
     .amp = 2,
     .build = b_rope,
     .ref = r_rope},
    {.name = "rope_parts",
     .covers = "rope,rope_grad",
     .op = {P("x", "Batch,Seq,KvHead,Part,Feat", -2, 2, CF_LAST, "Feat")},
     .nops = 1,
     .var = {{"Batch=2,Seq=5,KvHead=2,Part=4,Feat=8", {0, 0, 0, 0}, {10000, 3}},
             {"Batch=1,Seq=4,KvHead=1,Part=3,Feat=16", {1, 2, 0, 1}, {500000, 2}},
             {"Batch=1,Seq=3,KvHead=2,Part=3,Feat=8", {0, 0, 0, 0}, {10000, 3}}},
     .nvar = 3,
     .split = "Batch,Seq,KvHead,Part,Feat",
     .refuse = "Seq,Part,Feat",
     .amp = 2,
     .build = b_rope_parts,
     .ref = r_rope_parts},
    {.name = "rope_pos",
     .covers = "rope,rope_grad",
     .op = {P("x", "Batch,Head,Feat", -2, 2, CF_FIXED, NULL),
            I("pos", "Batch", 0, 40, CF_FIXED, NULL)},
     .nops = 2,
     .var = {{"Batch=3,Head=2,Feat=8", {0, 0, 0, 0}, {10000}},
             {"Batch=2,Head=4,Feat=16", {1, 5, 0, 1}, {10000}}},
     .nvar = 2,
     .split = "Batch,Head,Feat",
     .refuse = "Feat",
     .amp = 2,
     .build = b_rope_pos,
     .ref = r_rope_pos},
    {.name = "rope_seq_pos",
     .covers = "rope,rope_grad",
     .op = {P("x", "Batch,Seq,Head,Feat", -2, 2, CF_FIXED, NULL),
            I("pos", "Batch", 0, 40, CF_FIXED, NULL)},
     .nops = 2,
     .var = {{"Batch=2,Seq=3,Head=2,Feat=8", {0, 0, 0, 0}, {10000}},
             {"Batch=3,Seq=2,Head=1,Feat=12", {1, 7, 0, 0}, {500000}}},
     .nvar = 2,
     .split = "Batch,Seq,Head",
     .refuse = "Seq",
     .amp = 2,
     .build = b_rope_seq_pos,
     .ref = r_rope_seq_pos},
    {.name = "linear_gelu",
     .covers = "contract,add,gelu,gelu_grad",
     .op = {P("x", "Batch,Seq,In", -1, 1, ANY), P("w", "Out,In", -0.5, 0.5, ANY),
            P("bias", "Out", -0.5, 0.5, ANY)},
     .nops = 3,
     .var = {{"Batch=2,Seq=3,In=17,Out=33", {0}},
             {"Batch=3,Seq=5,In=9,Out=7", {1}},
             {"Batch=1,Seq=1,In=67,Out=5", {0}}},
     .nvar = 3,
     .split = "Batch,Out,In",
     .reduce = "In",
     .build = b_linear,
     .ref = r_linear},
    {.name = "mlp",
     .covers = "contract,gelu,gelu_grad",
     .op = {P("x", "Batch,In", -1, 1, ANY), P("w1", "Hid,In", -0.5, 0.5, ANY),
            P("b1", "Hid", -0.5, 0.5, ANY), P("w2", "Out,Hid", -0.5, 0.5, ANY)},
     .nops = 4,
     .var = {{"Batch=5,In=17,Hid=33,Out=9"}, {"Batch=3,In=7,Hid=13,Out=3"}},
     .nvar = 2,
     .split = "Batch,Hid",
     .reduce = "Hid",
     .amp = 2,
     .build = b_mlp,
     .ref = r_mlp},
    {.name = "residual",
     .covers = "contract,add,alias",
     .op = {P("x", "Batch,Feat", -1, 1, CF_LAST, "Feat"), P("h", "Batch,In", -1, 1, ANY),
            P("w", "Out,In", -0.5, 0.5, ANY)},
     .nops = 3,
     .var = {{"Batch=5,In=17,Out=9,Feat=9"}, {"Batch=3,In=33,Out=7,Feat=7"}},
     .nvar = 2,
     .split = "Batch,In",
     .reduce = "In",
     .build = b_residual,
     .ref = r_residual},
    {.name = "fsdp",
     .covers = "all-gather,reduce-scatter,contract,map",
     .op = {M("x", "Batch,In", -1, 1, ANY), P("w1", "Hid,In", -0.5, 0.5, ANY),
            P("w2", "Out,Hid", -0.5, 0.5, ANY)},
     .nops = 3,
     .var = {{"Batch=6,In=9,Hid=10,Out=5"}, {"Batch=5,In=7,Hid=17,Out=3"}},
     .nvar = 2,
     .split = "Batch",
     .reduce = "Hid",
     .flags = CF_NO_SOURCES,
     .build = b_fsdp,
     .ref = r_fsdp},
    {.name = "layernorm",
     .covers = "layernorm,layernorm_dx,layernorm_dw",
     .op = {P("x", "Batch,Seq,Feat", -2, 2, CF_LAST, "Feat"), P("w", "Feat", 0.5, 1.5, ANY),
            P("b", "Feat", -0.5, 0.5, ANY)},
     .nops = 3,
     .var = {{"Batch=3,Seq=5,Feat=7", .f = {1e-5}},
             {"Batch=1,Seq=2,Feat=1031", .f = {1e-5}},
             {"Batch=2,Seq=1,Feat=33", .f = {0.1}}},
     .nvar = 3,
     .split = "Batch,Seq,Feat",
     .refuse = "Feat",
     .reduce = "Feat",
     .amp = 8,
     .build = b_layernorm,
     .ref = r_layernorm},
    {.name = "prenorm",
     .covers = "layernorm,layernorm_dx,layernorm_dw,contract,alias",
     .op = {P("x", "Batch,Seq,Feat", -2, 2, CF_LAST, "Feat"), P("w", "Feat", 0.5, 1.5, ANY),
            P("b", "Feat", -0.5, 0.5, ANY), P("wo", "Out,Feat", -0.5, 0.5, ANY)},
     .nops = 4,
     .var = {{"Batch=3,Seq=5,Feat=7,Out=7", .f = {1e-5}},
             {"Batch=2,Seq=3,Feat=33,Out=33", .f = {1e-5}}},
     .nvar = 2,
     .split = "Batch,Seq",
     .reduce = "Feat",
     .amp = 8,
     .build = b_prenorm,
     .ref = r_prenorm},
    {.name = "layernorm_nobias",
     .covers = "layernorm,layernorm_dx,layernorm_dw",
     .op = {P("x", "Batch,Seq,Feat", -2, 2, CF_LAST, "Feat"), P("w", "Feat", 0.5, 1.5, ANY)},
     .nops = 2,
     .var = {{"Batch=3,Seq=5,Feat=7", .f = {1e-5}}, {"Batch=1,Seq=2,Feat=1031", .f = {1e-5}}},
     .nvar = 2,
     .split = "Batch,Seq,Feat",
     .refuse = "Feat",
     .reduce = "Feat",
     .amp = 8,
     .build = b_layernorm_nobias,
     .ref = r_layernorm_nobias},
    {.name = "prenorm_nobias",
     .covers = "layernorm,layernorm_dx,layernorm_dw,contract,alias",
     .op = {P("x", "Batch,Seq,Feat", -2, 2, CF_LAST, "Feat"), P("w", "Feat", 0.5, 1.5, ANY),
            P("wo", "Out,Feat", -0.5, 0.5, ANY)},
     .nops = 3,
     .var = {{"Batch=3,Seq=5,Feat=7,Out=7", .f = {1e-5}},
             {"Batch=2,Seq=3,Feat=33,Out=33", .f = {1e-5}}},
     .nvar = 2,
     .split = "Batch,Seq",
     .reduce = "Feat",
     .amp = 8,
     .build = b_prenorm_nobias,
     .ref = r_prenorm_nobias},
    {.name = "rmsnorm",
     .covers = "rmsnorm,rmsnorm_dx,rmsnorm_dw",
     .op = {P("x", "Batch,Seq,Feat", -2, 2, CF_LAST, "Feat"), P("w", "Feat", 0.5, 1.5, ANY)},
     .nops = 2,
     .var = {{"Batch=3,Seq=5,Feat=7", .f = {1e-5}},
             {"Batch=1,Seq=2,Feat=1031", .f = {1e-5}},
             {"Batch=2,Seq=1,Feat=33", .f = {0.1}}},
     .nvar = 3,
     .split = "Batch,Seq,Feat",
     .refuse = "Feat",
     .reduce = "Feat",
     .amp = 8,
     .build = b_rmsnorm,
     .ref = r_rmsnorm},
    {.name = "rms_prenorm",
     .covers = "rmsnorm,rmsnorm_dx,rmsnorm_dw,contract,alias",
     .op = {P("x", "Batch,Seq,Feat", -2, 2, CF_LAST, "Feat"), P("w", "Feat", 0.5, 1.5, ANY),
            P("wo", "Out,Feat", -0.5, 0.5, ANY)},
     .nops = 3,
     .var = {{"Batch=3,Seq=5,Feat=7,Out=7", .f = {1e-5}},
             {"Batch=2,Seq=3,Feat=33,Out=33", .f = {1e-5}}},
     .nvar = 2,
     .split = "Batch,Seq",
     .reduce = "Feat",
     .amp = 8,
     .build = b_rms_prenorm,
     .ref = r_rms_prenorm},
    {.name = "softmax",
     .covers = "softmax,softmax_grad",
     .op = {P("x", "Batch,Q,K", -2, 2, CF_LAST, "K")},
     .nops = 1,
     .var = {{"Batch=3,Q=5,K=7", {0}, {0.7}},
             {"Batch=2,Q=3,K=1031", {0}, {1.3}},
             {"Batch=1,Q=2,K=1", {0}, {1}}},
     .nvar = 3,
     .split = "Batch,Q,K",
     .refuse = "K",
     .reduce = "K",
     .amp = 2,
     .build = b_softmax,
     .ref = r_softmax},
    {.name = "causal_softmax",
     .covers = "softmax,softmax_grad",
     .op = {P("x", "Batch,Q,K", -2, 2, CF_TAIL, "Q,K")},
     .nops = 1,
     .var = {{"Batch=3,Q=5,K=5", {1}, {0.7}},
             {"Batch=2,Q=3,K=67", {1}, {1.1}},
             {"Batch=1,Q=1,K=9", {1}, {1}}},
     .nvar = 3,
     .split = "Batch,Q,K",
     .refuse = "Q,K",
     .reduce = "K",
     .amp = 2,
     .build = b_softmax,
     .ref = r_softmax},
    {.name = "attention",
     .covers = "attention,attention_grad",
     .op = {P("qkv", "Batch,Seq,Part,Head,HeadDim", -1, 1, CF_LAST, "HeadDim")},
     .nops = 1,
     .var = {{"Batch=2,Seq=19,Part=3,Head=2,HeadDim=8", {1}, {0.35}},
             {"Batch=1,Seq=67,Part=3,Head=2,HeadDim=13", {0}, {0.28}},
             {"Batch=2,Seq=1,Part=3,Head=3,HeadDim=5", {1}, {0.45}},
             {"Batch=1,Seq=70,Part=3,Head=1,HeadDim=16", {1}, {0.25}},
             /* a head of 40: whole 16 x 16 blocks of the bf16 kernels' transposes and a rest */
             {"Batch=1,Seq=70,Part=3,Head=1,HeadDim=40", {1}, {0.15}}},
     .nvar = 5,
     .split = "Batch,Head,Seq",
     .refuse = "Seq,Part,HeadDim",
     .reduce = "Seq",
     .amp = 2,
     .build = b_attention,
     .ref = r_attention},
    {.name = "attention_of_dot",
     .covers = "attention,attention_grad,contract",
     .op = {P("x", "Batch,Seq,Embed", -1, 1, ANY),
            P("w", "Part,Head,HeadDim,Embed", -0.4, 0.4, CF_LAST_BUT, "HeadDim,Embed")},
     .nops = 2,
     .var = {{"Batch=2,Seq=19,Embed=24,Part=3,Head=2,HeadDim=8", {1}, {0.35}},
             {"Batch=1,Seq=67,Embed=13,Part=3,Head=2,HeadDim=5", {0}, {0.4}},
             {"Batch=3,Seq=5,Embed=9,Part=3,Head=1,HeadDim=7", {1}, {0.3}}},
     .nvar = 3,
     .split = "Batch,Head,Embed",
     .refuse = "Seq,Part,HeadDim",
     .reduce = "Seq,Embed",
     .amp = 2,
     .build = b_attention_of_dot,
     .ref = r_attention_of_dot},
    {.name = "block",
     .covers = "layernorm,layernorm_dx,layernorm_dw,attention,attention_grad,contract,gelu,"
               "gelu_grad,add,alias",
     .op = {P("x", "Batch,Seq,Embed", -1, 1, CF_LAST, "Embed"), P("ln1w", "Embed", 0.8, 1.2, ANY),
            P("ln1b", "Embed", -0.1, 0.1, ANY),
            P("wqkv", "Part,Head,HeadDim,Embed", -0.4, 0.4, CF_LAST_BUT, "HeadDim,Embed"),
            P("wo", "Out,Head,HeadDim", -0.3, 0.3, ANY), P("ln2w", "Embed", 0.8, 1.2, ANY),
            P("ln2b", "Embed", -0.1, 0.1, ANY), P("w1", "Hid,Embed", -0.3, 0.3, ANY),
            P("b1", "Hid", -0.1, 0.1, ANY), P("w2", "Out,Hid", -0.3, 0.3, ANY)},
     .nops = 10,
     .var = {{"Batch=2,Seq=11,Embed=12,Part=3,Head=2,HeadDim=6,Out=12,Hid=20", {1}, {0.4}},
             {"Batch=1,Seq=66,Embed=16,Part=3,Head=2,HeadDim=8,Out=16,Hid=33", {1}, {0.35}},
             {"Batch=3,Seq=5,Embed=9,Part=3,Head=3,HeadDim=3,Out=9,Hid=17", {0}, {0.5}}},
     .nvar = 3,
     .split = "Batch,Head,Hid",
     .refuse = "Seq,Part,HeadDim,Embed",
     .reduce = "Seq,Embed",
     .amp = 8,
     .build = b_block,
     .ref = r_block},
    {.name = "embedding",
     .covers = "embedding,embedding_grad",
     .op = {P("table", "Vocab,Dim", -1, 1, CF_FIXED, NULL), I("ids", "Batch,Seq", 0, 11, ANY)},
     .nops = 2,
     .var = {{"Vocab=11,Dim=7,Batch=3,Seq=5"},
             {"Vocab=11,Dim=1031,Batch=1,Seq=9"},
             {"Vocab=11,Dim=3,Batch=2,Seq=1"}},
     .nvar = 3,
     .split = "Batch,Seq,Vocab,Dim",
     .whole = "Vocab,Dim",
     .build = b_embedding,
     .ref = r_embedding},
    {.name = "cross_entropy",
     .covers = "cross_entropy,cross_entropy_grad",
     .op = {P("logits", "Batch,Seq,Vocab", -3, 3, CF_LAST, "Vocab"),
            I("targets", "Batch,Seq", 0, 9, CF_LIKE, "logits")},
     .nops = 2,
     .var = {{"Batch=3,Seq=5,Vocab=11", {0}},
             {"Batch=2,Seq=3,Vocab=1031", {0}},
             {"Batch=1,Seq=4,Vocab=13", {9}}},
     .nvar = 3,
     .split = "Batch,Seq,Vocab",
     .refuse = "Vocab",
     .reduce = "Vocab",
     .amp = 2,
     .build = b_xent,
     .ref = r_xent},
    {.name = "permute",
     .covers = "permute",
     .op = {P("x", "Batch,Seq,Feat", -1, 1, ANY)},
     .nops = 1,
     .var = {{"Batch=3,Seq=5,Feat=7"}, {"Batch=1,Seq=2,Feat=1031"}},
     .nvar = 2,
     .split = "Batch,Seq,Feat",
     .build = b_permute,
     .ref = r_permute},
    {.name = "reshape",
     .covers = "alias",
     .op = {P("x", "Batch,Seq,Feat", -1, 1, CF_TAIL, "Seq,Feat")},
     .nops = 1,
     .var = {{"Batch=3,Seq=5,Feat=12"}, {"Batch=1,Seq=1,Feat=33"}},
     .nvar = 2,
     .split = "Batch,Seq,Feat",
     .refuse = "Seq,Feat",
     .build = b_reshape,
     .ref = r_reshape},
    {.name = "slice",
     .covers = "slice,pad",
     .op = {P("x", "Batch,Seq,Feat", -1, 1, ANY)},
     .nops = 1,
     .var = {{"Batch=3,Seq=7,Feat=5", {0, 1, 3}},
             {"Batch=2,Seq=9,Feat=33", {1, 4}},
             {"Batch=1,Seq=5,Feat=1031", {0, 0, 5}}},
     .nvar = 3,
     .split = "Batch,Seq,Feat",
     .whole = "Seq",
     .build = b_slice,
     .ref = r_slice},
    {.name = "concat",
     .covers = "pad,add,permute",
     .op = {P("a", "Batch,Seq,Feat", -1, 1, ANY), P("b", "Batch,Seq,Feat", -1, 1, ANY)},
     .nops = 2,
     .var = {{"Batch=3,Seq=4,Feat=5"}, {"Batch=1,Seq=2,Feat=33"}},
     .nvar = 2,
     .split = "Batch,Seq,Feat",
     .refuse = "Seq",
     .build = b_concat,
     .ref = r_concat},
    {.name = "state_write",
     .covers = "state,state_write",
     .op = {{"cache", "Batch,Seq,Feat", CF_STATE, 0, 0, CF_FIXED, NULL},
            P("value", "Batch,Feat", -1, 1, CF_FIXED, NULL),
            I("index", "Batch", 0, 7, CF_FIXED, NULL)},
     .nops = 3,
     .var = {{"Batch=3,Seq=7,Feat=5"}, {"Batch=2,Seq=7,Feat=33"}},
     .nvar = 2,
     .split = "Batch,Feat",
     .flags = CF_INFER,
     .build = b_state_write,
     .ref = r_state_write},
    {.name = "attention_cached_grouped",
     .covers = "attention_cached",
     .op = {P("q", "Batch,Head,Group,Feat", -1, 1, CF_FIXED, NULL),
            P("kv", "Batch,Seq,Part,Head,Feat", -1, 1, CF_FIXED, NULL),
            I("pos", "Batch", 0, 9, CF_FIXED, NULL)},
     .nops = 3,
     .var = {{"Batch=3,Seq=9,Part=2,Head=2,Group=3,Feat=8", .f = {0.35}},
             {"Batch=2,Seq=9,Part=2,Head=1,Group=4,Feat=13", .f = {0.28}}},
     .nvar = 2,
     .split = "Batch,Head",
     .reduce = "Seq",
     .flags = CF_INFER,
     .build = b_cached_grouped,
     .ref = r_cached_grouped},
    {.name = "attention_grouped",
     .covers = "attention,attention_grad",
     .op = {P("qkv", "Batch,Seq,KvHead,Part,HeadDim", -1, 1, CF_LAST, "HeadDim")},
     .nops = 1,
     .var = {{"Batch=2,Seq=19,KvHead=2,Part=4,HeadDim=8", {1}, {0.35}},
             {"Batch=1,Seq=67,KvHead=1,Part=5,HeadDim=13", {0}, {0.28}},
             {"Batch=2,Seq=3,KvHead=3,Part=3,HeadDim=5", {1}, {0.45}},
             {"Batch=1,Seq=70,KvHead=2,Part=6,HeadDim=16", {1}, {0.25}}},
     .nvar = 4,
     .split = "Batch,KvHead,Seq",
     .refuse = "Seq,Part,HeadDim",
     .reduce = "Seq",
     .amp = 2,
     .build = b_attention_grouped,
     .ref = r_attention_grouped},
    {.name = "rope_attention",
     .covers = "rope,rope_grad,attention,attention_grad,contract",
     .op = {P("x", "Batch,Seq,Embed", -1, 1, ANY),
            P("w", "KvHead,Part,Feat,Embed", -0.4, 0.4, CF_LAST_BUT, "Feat,Embed")},
     .nops = 2,
     /* two query blocks (Seq 70 > 64) and short ones; both styles; the rotation over part of
      * the head; an offset; llama3's scaled frequencies; one and two queries per key/value head */
     .var = {{"Batch=2,Seq=19,Embed=12,KvHead=2,Part=4,Feat=8", {0, 0, 0, 0}, {10000, 0.35}},
             {"Batch=1,Seq=70,Embed=9,KvHead=1,Part=3,Feat=16", {1, 3, 0, 1}, {10000, 0.25}},
             {"Batch=2,Seq=5,Embed=7,KvHead=2,Part=3,Feat=12", {0, 0, 8, 0}, {500000, 0.3}},
             {"Batch=1,Seq=67,Embed=10,KvHead=2,Part=4,Feat=16", {1, 0, 10, 0}, {1000000, 0.28}}},
     .nvar = 4,
     .split = "Batch,KvHead,Embed",
     .refuse = "Seq,Part,Feat",
     .reduce = "Seq,Embed",
     .amp = 2,
     .build = b_rope_attention,
     .ref = r_rope_attention},
    {.name = "rope_all_attention",
     .covers = "rope,rope_grad,attention,attention_grad,contract",
     .op = {P("x", "Batch,Seq,Embed", -1, 1, ANY),
            P("w", "KvHead,Part,Feat,Embed", -0.4, 0.4, CF_LAST_BUT, "Feat,Embed")},
     .nops = 2,
     .var = {{"Batch=2,Seq=19,Embed=12,KvHead=2,Part=4,Feat=8", {0, 0, 0, 0}, {10000, 0.35}},
             {"Batch=1,Seq=5,Embed=9,KvHead=1,Part=3,Feat=16", {1, 3, 0, 1}, {10000, 0.25}}},
     .nvar = 2,
     .split = "Batch,KvHead,Embed",
     .refuse = "Seq,Part,Feat",
     .reduce = "Seq,Embed",
     .amp = 2,
     .build = b_rope_all_attention,
     .ref = r_rope_all_attention},
    {.name = "attention_cached",
     .covers = "attention_cached",
     .op = {P("q", "Batch,Head,Feat", -1, 1, CF_FIXED, NULL),
            P("kv", "Batch,Seq,Part,Head,Feat", -1, 1, CF_FIXED, NULL),
            I("pos", "Batch", 0, 9, CF_FIXED, NULL)},
     .nops = 3,
     .var = {{"Batch=3,Seq=9,Part=2,Head=2,Feat=8", .f = {0.35}},
             {"Batch=2,Seq=9,Part=2,Head=3,Feat=13", .f = {0.28}}},
     .nvar = 2,
     .split = "Batch,Head",
     .reduce = "Seq",
     .flags = CF_INFER,
     .build = b_cached,
     .ref = r_cached},
};

const int cf_nrows = (int)(sizeof cf_rows / sizeof cf_rows[0]);
