/* CPU kernels of the neural-network ops and the optimizers: straight loops over contiguous rows,
 * in a fixed order (so results are repeatable), with the per-element math of devices/math.h. */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "devices/cpu/cpu_nn.h"
#include "devices/cpu/rows.h"
#include "devices/math.h"

/* GELU and its derivative on eight lanes: mw__gelu and mw__gelu_grad (devices/math.h) with the
 * exponential of mw__exp8. */
MW__CPU_INLINE void gelu8(mw__v8 *y, const mw__v8 *xp) {
    mw__v8 x = *xp, e, v = x * (-2.0f * MW__GELU_K - 2.0f * MW__GELU_K * 0.044715f * x * x);
    mw__exp8(&e, &v);
    *y = x / (1.0f + e);
}

MW__CPU_INLINE void gelu_grad8(mw__v8 *y, const mw__v8 *xp) {
    mw__v8 x = *xp, x2 = x * x, e,
           v = x * (-2.0f * MW__GELU_K - 2.0f * MW__GELU_K * 0.044715f * x2);
    mw__exp8(&e, &v);
    mw__v8 s = 1.0f / (1.0f + e), du = MW__GELU_K * (1.0f + 3.0f * 0.044715f * x2);
    *y = s * (1.0f + 2.0f * x * du * (e * s));
}

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

/* GELU of a[0, n) into out as f32 or bf16 (a constant after inlining: one loop each). */
MW__CPU_INLINE void gelu_run(int64_t n, const float *a, void *out, int bf16) {
    mw__v8 x, y;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&x, a + i, sizeof x);
        gelu8(&y, &x);
        store_lanes(out, bf16, i, 8, &y);
    }
    if (i < n) { /* the last elements in lanes 0.., zeros after them */
        x = (mw__v8){0};
        memcpy(&x, a + i, (size_t)(n - i) * sizeof(float));
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

MW__CPU_CLONES
mw_status mw__cpu_unary(mw__device *dev, const mw__k_unary *k) {
    (void)dev;
    if (k->op == MW__UN_GELU_ERF)
        gelu_erf_run(k->count, k->a, k->out, k->out_dtype == MW_BF16);
    else if (k->out_dtype == MW_BF16)
        gelu_run(k->count, k->a, k->out, 1);
    else
        gelu_run(k->count, k->a, k->out, 0);
    return MW_OK;
}

/* out[i] = gy[i] * gelu'(x[i]) over [0, n), eight at a time (the last ones in lanes 0..), out f32
 * or bf16 (at element offset o of out), and when sum is not NULL, sum[i] += out[i] (the f32
 * value). */
MW__CPU_INLINE void gelu_grad_run(int64_t n, const float *xs, const float *gy, void *out, int bf16,
                                  int64_t o, float *sum) {
    mw__v8 x, g, y, s;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) { /* constant sizes: the copies are vector loads and stores */
        memcpy(&x, xs + i, sizeof x);
        memcpy(&g, gy + i, sizeof g);
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
    gelu_grad8(&y, &x);
    y *= g;
    store_lanes(out, bf16, o + i, n - i, &y);
    if (sum) {
        memcpy(&s, sum + i, b);
        s += y;
        memcpy(sum + i, &s, b);
    }
}

MW__CPU_CLONES
mw_status mw__cpu_unary_grad(mw__device *dev, const mw__k_unary_grad *k) {
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
    if (!k->colsum) {
        if (bf16)
            gelu_grad_run(k->count, k->x, k->gy, k->out, 1, 0, NULL);
        else
            gelu_grad_run(k->count, k->x, k->gy, k->out, 0, 0, NULL);
        return MW_OK;
    }
    /* Row after row, each row's values added into the column sums as they are written. */
    int64_t cols = k->cols;
    memset(k->colsum, 0, (size_t)cols * sizeof *k->colsum);
    for (int64_t o = 0; o < k->count; o += cols)
        if (bf16)
            gelu_grad_run(cols, k->x + o, k->gy + o, k->out, 1, o, k->colsum);
        else
            gelu_grad_run(cols, k->x + o, k->gy + o, k->out, 0, o, k->colsum);
    return MW_OK;
}

/* Mean and reciprocal standard deviation of one row: two passes, each summed in double over
 * eight interleaved lanes (a fixed order that vectorises). */
MW__CPU_INLINE void row_stats(const float *restrict x, int64_t n, float eps, float *mean,
                              float *rstd) {
    double acc[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) acc[l] += x[j + l];
    for (int l = 0; j < n; j++, l++) acc[l] += x[j];
    double m = MW__SUM8(acc) / (double)n;
    double dv[8] = {0};
    float mf = (float)m;
    for (j = 0; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) {
            float d = x[j + l] - mf;
            dv[l] += (double)(d * d);
        }
    for (int l = 0; j < n; j++, l++) {
        float d = x[j] - mf;
        dv[l] += (double)(d * d);
    }
    *mean = mf;
    *rstd = (float)(1.0 / sqrt(MW__SUM8(dv) / (double)n + eps));
}

MW__CPU_CLONES
mw_status mw__cpu_layernorm(mw__device *dev, const mw__k_layernorm *k) {
    (void)dev;
    int bf16 = k->out_dtype == MW_BF16;
    for (int64_t r = 0; r < k->rows; r++) {
        const float *x = k->x + r * k->n;
        float mean, rstd;
        row_stats(x, k->n, k->eps, &mean, &rstd);
        if (!bf16) {
            float *y = (float *)k->out + r * k->n;
            for (int64_t j = 0; j < k->n; j++) y[j] = (x[j] - mean) * rstd * k->w[j] + k->b[j];
            continue;
        }
        uint16_t *y = (uint16_t *)k->out + r * k->n;
        int64_t j = 0;
        for (; j + 8 <= k->n; j += 8) {
            mw__v8 xv, w, b;
            memcpy(&xv, x + j, sizeof xv);
            memcpy(&w, k->w + j, sizeof w);
            memcpy(&b, k->b + j, sizeof b);
            xv = (xv - mean) * rstd * w + b;
            mw__bf16_store8(y + j, &xv);
        }
        for (; j < k->n; j++) y[j] = mw__bf16_from_f32((x[j] - mean) * rstd * k->w[j] + k->b[j]);
    }
    return MW_OK;
}

MW__CPU_CLONES
mw_status mw__cpu_layernorm_dx(mw__device *dev, const mw__k_layernorm_grad *k) {
    (void)dev;
    float *restrict dw = k->dw, *restrict db = k->db;
    if (dw) {
        memset(dw, 0, (size_t)k->n * sizeof *dw);
        memset(db, 0, (size_t)k->n * sizeof *db);
    }
    for (int64_t r = 0; r < k->rows; r++) {
        const float *x = k->x + r * k->n, *gy = k->gy + r * k->n;
        float *dx = k->out + r * k->n, mean, rstd;
        row_stats(x, k->n, k->eps, &mean, &rstd);
        /* dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = gy w */
        const float *restrict w = k->w;
        mw__v4d m1lo = {0}, m1hi = {0}, m2lo = {0}, m2hi = {0}; /* eight lanes each */
        int64_t j = 0;
        for (; j + 8 <= k->n; j += 8) {
            mw__v8 d, xh, ww;
            memcpy(&d, gy + j, sizeof d);
            memcpy(&ww, w + j, sizeof ww);
            memcpy(&xh, x + j, sizeof xh);
            d *= ww;
            xh = (xh - mean) * rstd;
            MW__ADD_WIDE(m1lo, m1hi, d);
            xh *= d;
            MW__ADD_WIDE(m2lo, m2hi, xh);
        }
        double m1[8], m2[8];
        memcpy(m1, &m1lo, sizeof m1lo);
        memcpy(m1 + 4, &m1hi, sizeof m1hi);
        memcpy(m2, &m2lo, sizeof m2lo);
        memcpy(m2 + 4, &m2hi, sizeof m2hi);
        for (int l = 0; j < k->n; j++, l++) {
            float d = gy[j] * w[j], xh = (x[j] - mean) * rstd;
            m1[l] += (double)d;
            m2[l] += (double)(d * xh);
        }
        float a = (float)(MW__SUM8(m1) / (double)k->n), c = (float)(MW__SUM8(m2) / (double)k->n);
        /* dx, and with dw and db the dw kernel's terms and order, db as a column sum of gy, row
         * after row */
        int64_t i = 0;
        for (; i + 8 <= k->n; i += 8) {
            mw__v8 g, xv, ww, y;
            memcpy(&g, gy + i, sizeof g);
            memcpy(&xv, x + i, sizeof xv);
            memcpy(&ww, w + i, sizeof ww);
            mw__v8 d = g * ww, xh = (xv - mean) * rstd;
            y = rstd * (d - a - xh * c);
            memcpy(dx + i, &y, sizeof y);
            if (dw) {
                mw__v8 sw, sb;
                memcpy(&sw, dw + i, sizeof sw);
                memcpy(&sb, db + i, sizeof sb);
                sw += g * (xv - mean) * rstd;
                sb += g;
                memcpy(dw + i, &sw, sizeof sw);
                memcpy(db + i, &sb, sizeof sb);
            }
        }
        for (; i < k->n; i++) {
            float d = gy[i] * w[i], xh = (x[i] - mean) * rstd;
            dx[i] = rstd * (d - a - xh * c);
            if (dw) {
                dw[i] += gy[i] * (x[i] - mean) * rstd;
                db[i] += gy[i];
            }
        }
        if (k->addend) { /* the row is in the L1 cache: a second pass costs next to nothing */
            const float *restrict ad = k->addend + r * k->n;
            float *restrict o = dx;
            for (int64_t j = 0; j < k->n; j++) o[j] = ad[j] + o[j];
        }
    }
    return MW_OK;
}

MW__CPU_CLONES
mw_status mw__cpu_layernorm_dw(mw__device *dev, const mw__k_layernorm_grad *k) {
    (void)dev;
    memset(k->out, 0, (size_t)k->n * sizeof *k->out);
    for (int64_t r = 0; r < k->rows; r++) {
        const float *x = k->x + r * k->n, *gy = k->gy + r * k->n;
        float mean, rstd;
        row_stats(x, k->n, k->eps, &mean, &rstd);
        for (int64_t j = 0; j < k->n; j++) k->out[j] += gy[j] * (x[j] - mean) * rstd;
    }
    return MW_OK;
}

/* Columns row i of a block may see. */
static int64_t visible(int causal, int64_t i, int64_t s, int64_t k) {
    if (!causal) return k;
    int64_t v = i + (k - s) + 1;
    return v < 0 ? 0 : v > k ? k : v;
}

MW__CPU_CLONES
mw_status mw__cpu_softmax(mw__device *dev, const mw__k_softmax *k) {
    (void)dev;
    for (int64_t o = 0; o < k->outer; o++)
        for (int64_t i = 0; i < k->s; i++) {
            int64_t row = o * k->s + i, n = visible(k->causal, i, k->s, k->k);
            const float *a = k->a + row * k->k;
            float *y = k->out + row * k->k;
            mw__row_softmax(a, y, n, k->scale);
            for (int64_t j = n; j < k->k; j++) y[j] = 0.0f;
        }
    return MW_OK;
}

MW__CPU_CLONES
mw_status mw__cpu_softmax_grad(mw__device *dev, const mw__k_softmax_grad *k) {
    (void)dev;
    for (int64_t o = 0; o < k->outer; o++)
        for (int64_t i = 0; i < k->s; i++) {
            int64_t row = o * k->s + i, n = visible(k->causal, i, k->s, k->k);
            const float *p = k->p + row * k->k, *gy = k->gy + row * k->k;
            float *dx = k->out + row * k->k;
            float dot = mw__row_dot(gy, p, n);
            for (int64_t j = 0; j < n; j++) dx[j] = k->scale * p[j] * (gy[j] - dot);
            for (int64_t j = n; j < k->k; j++) dx[j] = 0.0f;
        }
    return MW_OK;
}

/* A bad id or target: the position is within the device's shard of the batch. */
static mw_status out_of_range(const char *what, int32_t v, int64_t pos, int64_t limit) {
    return mw__error(MW_ERR_INVALID,
                     "%s %d at position %lld of this device's shard is outside [0, %lld)", what, v,
                     (long long)pos, (long long)limit);
}

mw_status mw__cpu_embed(mw__device *dev, const mw__k_embed *k) {
    (void)dev;
    for (int64_t i = 0; i < k->n_ids; i++) {
        int32_t id = k->ids[i];
        if (id < 0 || id >= k->vocab) return out_of_range("embedding id", id, i, k->vocab);
        memcpy(k->out + i * k->dim, k->table + (int64_t)id * k->dim, (size_t)k->dim * 4);
    }
    return MW_OK;
}

MW__CPU_CLONES
mw_status mw__cpu_embed_grad(mw__device *dev, const mw__k_embed_grad *k) {
    (void)dev;
    memset(k->out, 0, (size_t)(k->vocab * k->dim) * sizeof *k->out);
    for (int64_t i = 0; i < k->n_ids; i++) {
        int32_t id = k->ids[i];
        if (id < 0 || id >= k->vocab) return out_of_range("embedding id", id, i, k->vocab);
        float *dst = k->out + (int64_t)id * k->dim;
        const float *src = k->gy + i * k->dim;
        for (int64_t j = 0; j < k->dim; j++) dst[j] += src[j];
    }
    return MW_OK;
}

/* The max of the first `valid` logits of a row and the sum of exp(x - max) over them: the
 * exponentials in float (vectorised), summed in eight lanes in double. */
static inline double row_expsum(const float *restrict x, int64_t valid, float *max) {
    float mx = mw__row_max(x, valid, 1.0f);
    double acc[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= valid; j += 8)
        for (int l = 0; l < 8; l++) acc[l] += (double)mw__expf(x[j + l] - mx);
    for (int l = 0; j < valid; j++, l++) acc[l] += (double)mw__expf(x[j] - mx);
    *max = mx;
    return MW__SUM8(acc);
}

MW__CPU_CLONES
mw_status mw__cpu_xent(mw__device *dev, const mw__k_xent *k) {
    (void)dev;
    for (int64_t r = 0; r < k->rows; r++) {
        int32_t t = k->targets[r];
        if (t < 0 || t >= k->valid) return out_of_range("target", t, r, k->valid);
        const float *x = k->logits + r * k->v;
        float mx;
        double sum = row_expsum(x, k->valid, &mx);
        k->out[r] = (float)((double)mx + log(sum) - x[t]);
    }
    return MW_OK;
}

MW__CPU_CLONES
mw_status mw__cpu_xent_grad(mw__device *dev, const mw__k_xent_grad *k) {
    (void)dev;
    for (int64_t r = 0; r < k->rows; r++) {
        int32_t t = k->targets[r];
        if (t < 0 || t >= k->valid) return out_of_range("target", t, r, k->valid);
        const float *x = k->logits + r * k->v;
        float *dx = k->out + r * k->v;
        float mx;
        /* softmax_j = exp(x_j - max) / sum: both factors near 1, no cancellation. */
        float scale = k->gy[r] * (float)(1.0 / row_expsum(x, k->valid, &mx)), gy = k->gy[r];
        for (int64_t j = 0; j < k->valid; j++) dx[j] = scale * mw__expf(x[j] - mx);
        dx[t] -= gy;
        for (int64_t j = k->valid; j < k->v; j++) dx[j] = 0.0f;
    }
    return MW_OK;
}

MW__CPU_CLONES
mw_status mw__cpu_sumsq(mw__device *dev, const mw__k_sumsq *k) {
    (void)dev;
    const float *restrict a = k->a;
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= k->count; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += (double)a[i + l] * a[i + l];
    for (int l = 0; i < k->count; i++, l++) acc[l] += (double)a[i] * a[i];
    k->out[0] = (float)MW__SUM8(acc);
    return MW_OK;
}

#define ADAMW_RUN 512 /* elements updated before their bf16 copies are written: in the L1 cache */

MW__CPU_CLONES
mw_status mw__cpu_adamw(mw__device *dev, const mw__k_adamw *k) {
    (void)dev;
    for (int64_t i0 = 0; i0 < k->count; i0 += ADAMW_RUN) {
        int64_t i1 = k->count - i0 < ADAMW_RUN ? k->count : i0 + ADAMW_RUN;
        for (int64_t i = i0; i < i1; i++)
            k->p[i] =
                mw__adamw_update(k->p[i], k->grad_scale * k->g[i], &k->m[i], &k->v[i], k->lr,
                                 k->beta1, k->beta2, k->eps, k->weight_decay, k->bias1, k->bias2);
        if (k->p16) mw__bf16_narrow(i1 - i0, k->p + i0, k->p16 + i0);
    }
    return MW_OK;
}
