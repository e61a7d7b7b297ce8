/* CPU kernels of the elementwise ops: binary arithmetic, copies (permute, broadcast, scale,
 * convert between f32, bf16 and i32), fill, GELU and its gradient, the maps of devices/math.h and
 * their gradients, dropout. One IEEE operation per element, so these are the CUDA kernels' bits;
 * the contiguous cases are loops the compiler vectorises. */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "devices/cpu/cpu_kernels.h"
#include "devices/cpu/rows.h"
#include "devices/cpu/simd.h"
#include "devices/device.h"
#include "devices/math.h"

static inline float apply(mw__binop op, float a, float b) {
    switch (op) {
    case MW__BIN_ADD: return a + b;
    case MW__BIN_SUB: return a - b;
    case MW__BIN_MUL: return a * b;
    case MW__BIN_DIV: return a / b;
    }
    return 0.0f;
}

/* One innermost row of a binary op; the common stride patterns get loops the compiler vectorises.
 */
#define BIN_ROW(OPEXPR)                                                                            \
    do {                                                                                           \
        if (sa == 1 && sb == 1)                                                                    \
            for (int64_t i = 0; i < n; i++) {                                                      \
                float x = a[i], y = b[i];                                                          \
                out[i] = OPEXPR;                                                                   \
            }                                                                                      \
        else if (sa == 1 && sb == 0) {                                                             \
            float y = b[0];                                                                        \
            for (int64_t i = 0; i < n; i++) {                                                      \
                float x = a[i];                                                                    \
                out[i] = OPEXPR;                                                                   \
            }                                                                                      \
        } else if (sa == 0 && sb == 1) {                                                           \
            float x = a[0];                                                                        \
            for (int64_t i = 0; i < n; i++) {                                                      \
                float y = b[i];                                                                    \
                out[i] = OPEXPR;                                                                   \
            }                                                                                      \
        } else                                                                                     \
            for (int64_t i = 0; i < n; i++) {                                                      \
                float x = a[i * sa], y = b[i * sb];                                                \
                out[i * so] = OPEXPR;                                                              \
            }                                                                                      \
    } while (0)

#define BIN_ROWS                                                                                   \
    do {                                                                                           \
        if (so != 1) {                                                                             \
            for (int64_t i = 0; i < n; i++) out[i * so] = apply(op, a[i * sa], b[i * sb]);         \
            return;                                                                                \
        }                                                                                          \
        switch (op) {                                                                              \
        case MW__BIN_ADD: BIN_ROW(x + y); break;                                                   \
        case MW__BIN_SUB: BIN_ROW(x - y); break;                                                   \
        case MW__BIN_MUL: BIN_ROW(x *y); break;                                                    \
        case MW__BIN_DIV: BIN_ROW(x / y); break;                                                   \
        }                                                                                          \
    } while (0)

static void binary_row(mw__binop op, int64_t n, float *restrict out, int64_t so,
                       const float *restrict a, int64_t sa, const float *restrict b, int64_t sb) {
    BIN_ROWS;
}

/* The same where out is a or b, element for element (a plan writes an op over an input of its
 * own layout that dies with it): each element is read before it is written. */
static void binary_row_in_place(mw__binop op, int64_t n, float *out, int64_t so, const float *a,
                                int64_t sa, const float *b, int64_t sb) {
    BIN_ROWS;
}

mw_status MW__CPU(mw__cpu_binary)(mw__device *dev, const mw__k_binary *k) {
    (void)dev;
    const mw__nd *nd = &k->nd;
    if (nd->rank == 0) {
        k->out[0] = apply(k->op, k->a[0], k->b[0]);
        return MW_OK;
    }
    int l = nd->rank - 1;
    if (k->out == k->a || k->out == k->b)
        MW__ND_ROWS(nd, 3,
                    binary_row_in_place(k->op, nd->dims[l], k->out + o0, nd->stride[0][l],
                                        k->a + o1, nd->stride[1][l], k->b + o2, nd->stride[2][l]));
    else
        MW__ND_ROWS(nd, 3,
                    binary_row(k->op, nd->dims[l], k->out + o0, nd->stride[0][l], k->a + o1,
                               nd->stride[1][l], k->b + o2, nd->stride[2][l]));
    return MW_OK;
}

static void copy_row(float alpha, int64_t n, float *restrict out, int64_t so,
                     const float *restrict a, int64_t sa) {
    if (so == 1 && sa == 1 && alpha == 1.0f)
        memcpy(out, a, (size_t)n * sizeof *out);
    else if (so == 1 && sa == 1)
        for (int64_t i = 0; i < n; i++) out[i] = alpha * a[i];
    else if (so == 1 && sa == 0) {
        float v = alpha * a[0];
        for (int64_t i = 0; i < n; i++) out[i] = v;
    } else
        for (int64_t i = 0; i < n; i++) out[i * so] = alpha * a[i * sa];
}

/* f32 -> bf16: alpha * a, rounded. */
void MW__CPU(mw__cpu_narrow_row)(float alpha, int64_t n, uint16_t *restrict out, int64_t so,
                                 const float *restrict a, int64_t sa) {
    int64_t i = 0;
    if (so == 1 && sa == 1)
        for (; i + 8 <= n; i += 8) {
            mw__v8 x;
            memcpy(&x, a + i, sizeof x);
            x *= alpha;
            mw__bf16_store8(out + i, &x);
        }
    for (; i < n; i++) out[i * so] = mw__bf16_from_f32(alpha * a[i * sa]);
}

/* bf16 -> f32 (alpha * a, exact for alpha 1), or bf16 -> bf16 (widen, scale, round). */
static void widen_row(float alpha, int64_t n, void *restrict out, int to_bf16, int64_t so,
                      const uint16_t *restrict a, int64_t sa) {
    uint16_t *o16 = out;
    float *o32 = out;
    int64_t i = 0;
    if (!to_bf16 && so == 1 && sa == 1)
        for (; i + 8 <= n; i += 8) {
            mw__v8 x;
            mw__bf16_load8(&x, a + i);
            x *= alpha;
            memcpy(o32 + i, &x, sizeof x);
        }
    if (to_bf16 && alpha == 1.0f)
        for (; i < n; i++) o16[i * so] = a[i * sa];
    for (; i < n; i++) {
        float v = alpha * mw__bf16_to_f32(a[i * sa]);
        if (to_bf16)
            o16[i * so] = mw__bf16_from_f32(v);
        else
            o32[i * so] = v;
    }
}

/* 4-byte elements moved as they are (i32 ids). */
static void move_row(int64_t n, uint32_t *restrict out, int64_t so, const uint32_t *restrict a,
                     int64_t sa) {
    for (int64_t i = 0; i < n; i++) out[i * so] = a[i * sa];
}

mw_status MW__CPU(mw__cpu_copy)(mw__device *dev, const mw__k_copy *k) {
    (void)dev;
    const mw__nd *nd = &k->nd;
    int l = nd->rank - 1;
    int64_t n = nd->rank ? nd->dims[l] : 1, so = nd->rank ? nd->stride[0][l] : 0,
            sa = nd->rank ? nd->stride[1][l] : 0;
    mw__nd one = {.rank = 1, .dims = {1}};
    if (nd->rank == 0) nd = &one; /* a single element: one row of one */
    l = nd->rank - 1;
    if (k->a_dtype == MW_I32 || k->out_dtype == MW_I32) {
        if (k->a_dtype != k->out_dtype || k->alpha != 1.0f)
            return mw__error(MW_ERR_DTYPE, "copy: i32 elements only move as they are");
        MW__ND_ROWS(nd, 2,
                    move_row(n, (uint32_t *)k->out + o0, so, (const uint32_t *)k->a + o1, sa));
    } else if (k->a_dtype == MW_F32 && k->out_dtype == MW_F32) {
        MW__ND_ROWS(nd, 2,
                    copy_row(k->alpha, n, (float *)k->out + o0, so, (const float *)k->a + o1, sa));
    } else if (k->a_dtype == MW_F32) {
        MW__ND_ROWS(nd, 2,
                    MW__CPU(mw__cpu_narrow_row)(k->alpha, n, (uint16_t *)k->out + o0, so,
                                                (const float *)k->a + o1, sa));
    } else {
        int to16 = k->out_dtype == MW_BF16;
        MW__ND_ROWS(nd, 2,
                    widen_row(k->alpha, n, (char *)k->out + o0 * (to16 ? 2 : 4), to16, so,
                              (const uint16_t *)k->a + o1, sa));
    }
    return MW_OK;
}

mw_status MW__CPU(mw__cpu_fill)(mw__device *dev, const mw__k_fill *k) {
    (void)dev;
    for (int64_t i = 0; i < k->count; i++) k->out[i] = k->value;
    return MW_OK;
}

/* GELU and SiLU and their derivatives: mw__gelu, mw__gelu_grad, mw__silu and mw__silu_grad
 * (devices/math.h) with the exponential of mw__exp8 on eight lanes (gelu8, ...) and of mw__exp16
 * on sixteen (gelu16, ...), the same steps lane by lane; the loops take sixteen elements at a
 * time, then eight. */
#define MW__DEFINE_GATES(w, V)                                                                     \
    MW__CPU_INLINE void gelu##w(V *y, const V *xp) {                                               \
        V x = *xp, e, v = x * (-2.0f * MW__GELU_K - 2.0f * MW__GELU_K * 0.044715f * x * x);        \
        mw__exp##w(&e, &v);                                                                        \
        *y = x / (1.0f + e);                                                                       \
    }                                                                                              \
    MW__CPU_INLINE void gelu_grad##w(V *y, const V *xp) {                                          \
        V x = *xp, x2 = x * x, e,                                                                  \
          v = x * (-2.0f * MW__GELU_K - 2.0f * MW__GELU_K * 0.044715f * x2);                       \
        mw__exp##w(&e, &v);                                                                        \
        V s = 1.0f / (1.0f + e), du = MW__GELU_K * (1.0f + 3.0f * 0.044715f * x2);                 \
        *y = s * (1.0f + 2.0f * x * du * (e * s));                                                 \
    }                                                                                              \
    MW__CPU_INLINE void silu##w(V *y, const V *xp) {                                               \
        V x = *xp, e, v = -x;                                                                      \
        mw__exp##w(&e, &v);                                                                        \
        *y = x / (1.0f + e);                                                                       \
    }                                                                                              \
    MW__CPU_INLINE void silu_grad##w(V *y, const V *xp) {                                          \
        V x = *xp, e, v = -x;                                                                      \
        mw__exp##w(&e, &v);                                                                        \
        V s = 1.0f / (1.0f + e);                                                                   \
        *y = s * (1.0f + x * (e * s));                                                             \
    }
MW__DEFINE_GATES(8, mw__v8)
MW__DEFINE_GATES(16, mw__v16)

/* Stores the first n (at most 8) lanes of y at out + i, as f32 or bf16. */
MW__CPU_INLINE void store_lanes(void *out, int bf16, int64_t i, int64_t n, const mw__v8 *y) {
    if (bf16) {
        uint16_t h[8];
        mw__bf16_store8(n == 8 ? (uint16_t *)out + i : h, y);
        if (n < 8) memcpy((uint16_t *)out + i, h, (size_t)n * sizeof *h);
    } else {
        memcpy((float *)out + i, y, (size_t)n * sizeof(float));
    }
}

/* GELU (or SiLU, silu set) of a[0, n) into out as f32 or bf16 (constants after inlining: one
 * loop each). */
MW__CPU_INLINE void gelu_run(int64_t n, const float *a, void *out, int bf16, int silu) {
    mw__v8 x, y;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        mw__v16 x16, y16;
        memcpy(&x16, a + i, sizeof x16);
        if (silu)
            silu16(&y16, &x16);
        else
            gelu16(&y16, &x16);
        if (bf16)
            mw__bf16_store16((uint16_t *)out + i, &y16);
        else
            memcpy((float *)out + i, &y16, sizeof y16);
    }
    for (; i + 8 <= n; i += 8) {
        memcpy(&x, a + i, sizeof x);
        if (silu)
            silu8(&y, &x);
        else
            gelu8(&y, &x);
        store_lanes(out, bf16, i, 8, &y);
    }
    if (i < n) { /* the last elements in lanes 0.., zeros after them */
        x = (mw__v8){0};
        memcpy(&x, a + i, (size_t)(n - i) * sizeof(float));
        if (silu)
            silu8(&y, &x);
        else
            gelu8(&y, &x);
        store_lanes(out, bf16, i, n - i, &y);
    }
}

/* Exact GELU and its gradient, element by element (erfc has no vector form here). */
static void gelu_erf_run(int64_t n, const float *a, void *out, int bf16) {
    for (int64_t i = 0; i < n; i++) {
        float y = mw__gelu_erf(a[i]);
        if (bf16)
            ((uint16_t *)out)[i] = mw__bf16_from_f32(y);
        else
            ((float *)out)[i] = y;
    }
}

static void gelu_erf_grad_run(int64_t n, const float *xs, const float *gy, void *out, int bf16,
                              int64_t o, float *sum) {
    for (int64_t i = 0; i < n; i++) {
        float y = gy[i] * mw__gelu_erf_grad(xs[i]);
        if (bf16)
            ((uint16_t *)out)[o + i] = mw__bf16_from_f32(y);
        else
            ((float *)out)[o + i] = y;
        if (sum) sum[i] += y;
    }
}

mw_status MW__CPU(mw__cpu_unary)(mw__device *dev, const mw__k_unary *k) {
    (void)dev;
    int bf16 = k->out_dtype == MW_BF16;
    if (k->op == MW__UN_GELU_ERF)
        gelu_erf_run(k->count, k->a, k->out, bf16);
    else if (k->op == MW__UN_SILU)
        bf16 ? gelu_run(k->count, k->a, k->out, 1, 1) : gelu_run(k->count, k->a, k->out, 0, 1);
    else
        bf16 ? gelu_run(k->count, k->a, k->out, 1, 0) : gelu_run(k->count, k->a, k->out, 0, 0);
    return MW_OK;
}

/* out[i] = gy[i] * gelu'(x[i]) over [0, n), eight at a time (the last ones in lanes 0..), out f32
 * or bf16 (at element offset o of out), and when sum is not NULL, sum[i] += out[i] (the f32
 * value). */
MW__CPU_INLINE void gelu_grad_run(int64_t n, const float *xs, const float *gy, void *out, int bf16,
                                  int64_t o, float *sum, int silu) {
    mw__v8 x, g, y, s;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        mw__v16 x16, g16, y16, s16;
        memcpy(&x16, xs + i, sizeof x16);
        memcpy(&g16, gy + i, sizeof g16);
        if (silu)
            silu_grad16(&y16, &x16);
        else
            gelu_grad16(&y16, &x16);
        y16 *= g16;
        if (bf16)
            mw__bf16_store16((uint16_t *)out + o + i, &y16);
        else
            memcpy((float *)out + o + i, &y16, sizeof y16);
        if (sum) {
            memcpy(&s16, sum + i, sizeof s16);
            s16 += y16;
            memcpy(sum + i, &s16, sizeof s16);
        }
    }
    for (; i + 8 <= n; i += 8) { /* constant sizes: the copies are vector loads and stores */
        memcpy(&x, xs + i, sizeof x);
        memcpy(&g, gy + i, sizeof g);
        if (silu)
            silu_grad8(&y, &x);
        else
            gelu_grad8(&y, &x);
        y *= g;
        store_lanes(out, bf16, o + i, 8, &y);
        if (sum) {
            memcpy(&s, sum + i, sizeof s);
            s += y;
            memcpy(sum + i, &s, sizeof s);
        }
    }
    if (i == n) return;
    size_t b = (size_t)(n - i) * sizeof(float);
    x = g = s = (mw__v8){0};
    memcpy(&x, xs + i, b);
    memcpy(&g, gy + i, b);
    if (silu)
        silu_grad8(&y, &x);
    else
        gelu_grad8(&y, &x);
    y *= g;
    store_lanes(out, bf16, o + i, n - i, &y);
    if (sum) {
        memcpy(&s, sum + i, b);
        s += y;
        memcpy(sum + i, &s, b);
    }
}

mw_status MW__CPU(mw__cpu_unary_grad)(mw__device *dev, const mw__k_unary_grad *k) {
    (void)dev;
    int bf16 = k->out_dtype == MW_BF16;
    if (k->op == MW__UN_GELU_ERF) {
        if (!k->colsum) {
            gelu_erf_grad_run(k->count, k->x, k->gy, k->out, bf16, 0, NULL);
            return MW_OK;
        }
        memset(k->colsum, 0, (size_t)k->cols * sizeof *k->colsum);
        for (int64_t o = 0; o < k->count; o += k->cols)
            gelu_erf_grad_run(k->cols, k->x + o, k->gy + o, k->out, bf16, o, k->colsum);
        return MW_OK;
    }
    int silu = k->op == MW__UN_SILU;
    if (!k->colsum) {
        if (bf16)
            silu ? gelu_grad_run(k->count, k->x, k->gy, k->out, 1, 0, NULL, 1)
                 : gelu_grad_run(k->count, k->x, k->gy, k->out, 1, 0, NULL, 0);
        else
            silu ? gelu_grad_run(k->count, k->x, k->gy, k->out, 0, 0, NULL, 1)
                 : gelu_grad_run(k->count, k->x, k->gy, k->out, 0, 0, NULL, 0);
        return MW_OK;
    }
    /* Row after row, each row's values added into the column sums as they are written. */
    int64_t cols = k->cols;
    memset(k->colsum, 0, (size_t)cols * sizeof *k->colsum);
    for (int64_t o = 0; o < k->count; o += cols)
        if (bf16)
            silu ? gelu_grad_run(cols, k->x + o, k->gy + o, k->out, 1, o, k->colsum, 1)
                 : gelu_grad_run(cols, k->x + o, k->gy + o, k->out, 1, o, k->colsum, 0);
        else
            silu ? gelu_grad_run(cols, k->x + o, k->gy + o, k->out, 0, o, k->colsum, 1)
                 : gelu_grad_run(cols, k->x + o, k->gy + o, k->out, 0, o, k->colsum, 0);
    return MW_OK;
}

mw_status MW__CPU(mw__cpu_map)(mw__device *dev, const mw__k_map *k) {
    (void)dev;
    for (int64_t i = 0; i < k->count; i++) k->out[i] = mw__map(k->fn, k->a[i]);
    return MW_OK;
}

mw_status MW__CPU(mw__cpu_map_grad)(mw__device *dev, const mw__k_map_grad *k) {
    (void)dev;
    for (int64_t i = 0; i < k->count; i++) k->out[i] = k->gy[i] * mw__map_grad(k->fn, k->x[i]);
    return MW_OK;
}

/* Dropout of one contiguous run: elements [g, g + n) of the global tensor, within one block of
 * 2^32 (a loop the compiler runs in vector lanes). */
MW__CPU_INLINE void dropout_run(uint32_t w0, uint32_t w1, uint32_t lo, uint32_t threshold,
                                float scale, int64_t n, const float *a, float *out) {
    for (int64_t j = 0; j < n; j++) {
        uint32_t keep = mw__dropout_keeps(w0, w1, lo + (uint32_t)j, threshold);
        out[j] = keep ? a[j] * scale : 0.0f;
    }
}

/* Dropout over the local box [lo, lo + len) of the global tensor, in local row-major order: row
 * by row of the last axis, which is contiguous in both. */
static void dropout(const mw__k_dropout *k) {
    float scale = 1.0f / (1.0f - k->p);
    uint64_t key = mw__dropout_key(k->seed, k->step);
    uint32_t threshold = mw__dropout_threshold(k->p);
    int last = k->rank - 1;
    int64_t row = k->rank ? k->len[last] : 1, rows = row ? k->count / row : 0;
    int64_t idx[MW_MAX_RANK] = {0}, g = 0;
    for (int d = 0; d < k->rank; d++) g += k->lo[d] * k->gstride[d];
    for (int64_t r = 0; r < rows; r++) {
        const float *a = k->a + r * row;
        float *out = k->out + r * row;
        for (int64_t j = 0; j < row;) { /* a run ends where a block of 2^32 does */
            uint64_t at = (uint64_t)(g + j);
            int64_t left = (int64_t)((UINT64_C(1) << 32) - (at & 0xFFFFFFFFu));
            int64_t n = row - j < left ? row - j : left;
            uint32_t w0, w1;
            mw__dropout_block(key, (uint32_t)(at >> 32), &w0, &w1);
            dropout_run(w0, w1, (uint32_t)at, threshold, scale, n, a + j, out + j);
            j += n;
        }
        for (int d = last - 1; d >= 0; d--) { /* the next row's first global index */
            g += k->gstride[d];
            if (++idx[d] < k->len[d]) break;
            g -= k->len[d] * k->gstride[d];
            idx[d] = 0;
        }
    }
}

mw_status MW__CPU(mw__cpu_dropout)(mw__device *dev, const mw__k_dropout *k) {
    (void)dev;
    if (k->active && k->p > 0.0f)
        dropout(k);
    else if (k->out != k->a)
        memcpy(k->out, k->a, (size_t)k->count * sizeof *k->out);
    return MW_OK;
}

/* SwiGLU forward: out = silu(gate) * up, eight at a time, f32 or bf16. */
MW__CPU_INLINE void swiglu_run(int64_t n, const float *gate, const float *up, void *out, int64_t o,
                               int bf16) {
    mw__v8 x, u, y;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&x, gate + i, sizeof x);
        memcpy(&u, up + i, sizeof u);
        silu8(&y, &x);
        y *= u;
        store_lanes(out, bf16, o + i, 8, &y);
    }
    if (i == n) return;
    size_t b = (size_t)(n - i) * sizeof(float);
    x = u = (mw__v8){0};
    memcpy(&x, gate + i, b);
    memcpy(&u, up + i, b);
    silu8(&y, &x);
    y *= u;
    store_lanes(out, bf16, o + i, n - i, &y);
}

mw_status MW__CPU(mw__cpu_swiglu)(mw__device *dev, const mw__k_swiglu *k) {
    (void)dev;
    for (int64_t o = 0; o < k->outer; o++) {
        const float *gate = k->x + 2 * o * k->inner, *up = gate + k->inner;
        if (k->out_dtype == MW_BF16)
            swiglu_run(k->inner, gate, up, k->out, o * k->inner, 1);
        else
            swiglu_run(k->inner, gate, up, k->out, o * k->inner, 0);
    }
    return MW_OK;
}

/* SwiGLU backward over n elements: dgate = gy * up * silu'(gate), dup = gy * silu(gate). */
MW__CPU_INLINE void swiglu_grad8(const float *gate, const float *up, const float *gy, float *dg,
                                 float *du, int64_t n) {
    mw__v8 x, u, g, e, v, s;
    x = u = g = (mw__v8){0};
    size_t b = (size_t)n * sizeof(float);
    memcpy(&x, gate, b);
    memcpy(&u, up, b);
    memcpy(&g, gy, b);
    v = -x;
    mw__exp8(&e, &v);
    s = 1.0f / (1.0f + e);
    mw__v8 a = g * u * (s * (1.0f + x * (e * s))), c = g * (x * s);
    memcpy(dg, &a, b);
    memcpy(du, &c, b);
}

mw_status MW__CPU(mw__cpu_swiglu_grad)(mw__device *dev, const mw__k_swiglu *k) {
    (void)dev;
    float *dx = k->out;
    for (int64_t o = 0; o < k->outer; o++) {
        const float *gate = k->x + 2 * o * k->inner, *up = gate + k->inner;
        const float *gy = k->gy + o * k->inner;
        float *dg = dx + 2 * o * k->inner, *du = dg + k->inner;
        int64_t i = 0;
        for (; i + 8 <= k->inner; i += 8) swiglu_grad8(gate + i, up + i, gy + i, dg + i, du + i, 8);
        if (i < k->inner) swiglu_grad8(gate + i, up + i, gy + i, dg + i, du + i, k->inner - i);
    }
    return MW_OK;
}
