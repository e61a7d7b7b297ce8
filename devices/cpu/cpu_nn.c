/* CPU kernels of the neural-network row ops: layer norm and RMS norm and their gradients, rotary
 * embeddings, softmax and its gradient, cross-entropy and its gradient. Straight loops over
 * contiguous rows, in a fixed order (so results are repeatable), with the per-element math of
 * devices/math.h. */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "devices/cpu/cpu_kernels.h"
#include "devices/cpu/cpu_state.h"
#include "devices/cpu/rope_angles.h"
#include "devices/cpu/rows.h"
#include "devices/math.h"

/* Mean and reciprocal standard deviation of one row: two passes, each summed in double in the
 * wide lanes of simd.h (mw__wide_sum: a fixed order that vectorises, four chains deep). */
MW__CPU_INLINE void row_stats(const float *restrict x, int64_t n, float eps, float *mean,
                              float *rstd) {
    mw__wide_sum s = {0}, q = {0};
    mw__v16 v, u;
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        memcpy(&v, x + j, sizeof v);
        memcpy(&u, x + j + 16, sizeof u);
        mw__wide_add(&s, 0, v);
        mw__wide_add(&s, 1, u);
    }
    for (; j + 16 <= n; j += 16) {
        memcpy(&v, x + j, sizeof v);
        mw__wide_add(&s, 0, v);
    }
    for (; j < n; j++) s.tail += x[j];
    float mf = (float)(mw__wide_total(&s) / (double)n);
    for (j = 0; j + 32 <= n; j += 32) {
        memcpy(&v, x + j, sizeof v);
        memcpy(&u, x + j + 16, sizeof u);
        v -= mf;
        u -= mf;
        mw__wide_add(&q, 0, v * v);
        mw__wide_add(&q, 1, u * u);
    }
    for (; j + 16 <= n; j += 16) {
        memcpy(&v, x + j, sizeof v);
        v -= mf;
        mw__wide_add(&q, 0, v * v);
    }
    for (; j < n; j++) {
        float d = x[j] - mf;
        q.tail += (double)(d * d);
    }
    *mean = mf;
    *rstd = (float)(1.0 / sqrt(mw__wide_total(&q) / (double)n + eps));
}

mw_status MW__CPU(mw__cpu_layernorm)(mw__device *dev, const mw__k_layernorm *k) {
    (void)dev;
    int bf16 = k->out_dtype == MW_BF16;
    for (int64_t r = 0; r < k->rows; r++) {
        const float *x = k->x + r * k->n;
        float mean, rstd;
        row_stats(x, k->n, k->eps, &mean, &rstd);
        const float *restrict bias = k->b; /* NULL: no bias */
        if (!bf16) {
            float *y = (float *)k->out + r * k->n;
            if (bias)
                for (int64_t j = 0; j < k->n; j++) y[j] = (x[j] - mean) * rstd * k->w[j] + bias[j];
            else
                for (int64_t j = 0; j < k->n; j++) y[j] = (x[j] - mean) * rstd * k->w[j];
            continue;
        }
        uint16_t *y = (uint16_t *)k->out + r * k->n;
        int64_t j = 0;
        for (; j + 16 <= k->n; j += 16) {
            mw__v16 xv, w, b = {0};
            memcpy(&xv, x + j, sizeof xv);
            memcpy(&w, k->w + j, sizeof w);
            if (bias) memcpy(&b, bias + j, sizeof b);
            xv = (xv - mean) * rstd * w + b;
            mw__bf16_store16(y + j, &xv);
        }
        for (; j < k->n; j++)
            y[j] = mw__bf16_from_f32((x[j] - mean) * rstd * k->w[j] + (bias ? bias[j] : 0.0f));
    }
    return MW_OK;
}

/* dx += the residual gradient the plan folded into a normalisation's dx (its row is in the L1
 * cache: a second pass costs next to nothing). */
static void add_addend(float *restrict dx, const float *restrict addend, int64_t n) {
    for (int64_t j = 0; j < n; j++) dx[j] = addend[j] + dx[j];
}

/* Sixteen elements' terms of layer norm's gradient sums: d = gy w and d xhat. */
MW__CPU_INLINE void dx_terms(const float *gy, const float *w, const float *x, float mean,
                             float rstd, mw__v16 *d, mw__v16 *dx_hat) {
    mw__v16 g, ww, xh;
    memcpy(&g, gy, sizeof g);
    memcpy(&ww, w, sizeof ww);
    memcpy(&xh, x, sizeof xh);
    *d = g * ww;
    *dx_hat = (xh - mean) * rstd * *d;
}

mw_status MW__CPU(mw__cpu_layernorm_dx)(mw__device *dev, const mw__k_layernorm_grad *k) {
    (void)dev;
    float *restrict dw = k->dw, *restrict db = k->db;
    if (dw) memset(dw, 0, (size_t)k->n * sizeof *dw);
    if (db) memset(db, 0, (size_t)k->n * sizeof *db);
    for (int64_t r = 0; r < k->rows; r++) {
        const float *x = k->x + r * k->n, *gy = k->gy + r * k->n;
        float *dx = k->out + r * k->n, mean, rstd;
        row_stats(x, k->n, k->eps, &mean, &rstd);
        /* dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = gy w */
        const float *restrict w = k->w;
        mw__wide_sum m1 = {0}, m2 = {0};
        mw__v16 d, dx_hat, e, ex_hat;
        int64_t j = 0;
        for (; j + 32 <= k->n; j += 32) {
            dx_terms(gy + j, w + j, x + j, mean, rstd, &d, &dx_hat);
            dx_terms(gy + j + 16, w + j + 16, x + j + 16, mean, rstd, &e, &ex_hat);
            mw__wide_add(&m1, 0, d);
            mw__wide_add(&m2, 0, dx_hat);
            mw__wide_add(&m1, 1, e);
            mw__wide_add(&m2, 1, ex_hat);
        }
        for (; j + 16 <= k->n; j += 16) {
            dx_terms(gy + j, w + j, x + j, mean, rstd, &d, &dx_hat);
            mw__wide_add(&m1, 0, d);
            mw__wide_add(&m2, 0, dx_hat);
        }
        for (; j < k->n; j++) {
            float dj = gy[j] * w[j], xh = (x[j] - mean) * rstd;
            m1.tail += (double)dj;
            m2.tail += (double)(xh * dj);
        }
        float a = (float)(mw__wide_total(&m1) / (double)k->n),
              c = (float)(mw__wide_total(&m2) / (double)k->n);
        /* dx, and with dw and db the dw kernel's terms and order, db as a column sum of gy, row
         * after row */
        int64_t i = 0;
        for (; i + 16 <= k->n; i += 16) {
            mw__v16 g, xv, ww, y;
            memcpy(&g, gy + i, sizeof g);
            memcpy(&xv, x + i, sizeof xv);
            memcpy(&ww, w + i, sizeof ww);
            mw__v16 d = g * ww, xh = (xv - mean) * rstd;
            y = rstd * (d - a - xh * c);
            memcpy(dx + i, &y, sizeof y);
            if (dw) {
                mw__v16 sw;
                memcpy(&sw, dw + i, sizeof sw);
                sw += g * (xv - mean) * rstd;
                memcpy(dw + i, &sw, sizeof sw);
            }
            if (db) {
                mw__v16 sb;
                memcpy(&sb, db + i, sizeof sb);
                sb += g;
                memcpy(db + i, &sb, sizeof sb);
            }
        }
        for (; i < k->n; i++) {
            float d = gy[i] * w[i], xh = (x[i] - mean) * rstd;
            dx[i] = rstd * (d - a - xh * c);
            if (dw) dw[i] += gy[i] * (x[i] - mean) * rstd;
            if (db) db[i] += gy[i];
        }
        if (k->addend) add_addend(dx, k->addend + r * k->n, k->n);
    }
    return MW_OK;
}

mw_status MW__CPU(mw__cpu_layernorm_dw)(mw__device *dev, const mw__k_layernorm_grad *k) {
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

/* 1/sqrt(mean(x^2) + eps) of one row: the squares summed in f32 over eight interleaved lanes. */
MW__CPU_INLINE float row_rstd(const float *restrict x, int64_t n, float eps) {
    mw__v8 acc = {0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        mw__v8 v;
        memcpy(&v, x + j, sizeof v);
        acc += v * v;
    }
    float a[8];
    memcpy(a, &acc, sizeof a);
    for (int l = 0; j < n; j++, l++) a[l] += x[j] * x[j];
    return 1.0f / sqrtf(MW__SUM8(a) / (float)n + eps);
}

mw_status MW__CPU(mw__cpu_rmsnorm)(mw__device *dev, const mw__k_rmsnorm *k) {
    (void)dev;
    int bf16 = k->out_dtype == MW_BF16;
    const float *restrict w = k->w;
    for (int64_t r = 0; r < k->rows; r++) {
        const float *x = k->x + r * k->n;
        float rstd = row_rstd(x, k->n, k->eps);
        if (!bf16) {
            float *y = (float *)k->out + r * k->n;
            for (int64_t j = 0; j < k->n; j++) y[j] = x[j] * rstd * w[j];
            continue;
        }
        uint16_t *y = (uint16_t *)k->out + r * k->n;
        int64_t j = 0;
        for (; j + 16 <= k->n; j += 16) {
            mw__v16 xv, wv;
            memcpy(&xv, x + j, sizeof xv);
            memcpy(&wv, w + j, sizeof wv);
            xv = xv * rstd * wv;
            mw__bf16_store16(y + j, &xv);
        }
        for (; j < k->n; j++) y[j] = mw__bf16_from_f32(x[j] * rstd * w[j]);
    }
    return MW_OK;
}

mw_status MW__CPU(mw__cpu_rmsnorm_dx)(mw__device *dev, const mw__k_rmsnorm_grad *k) {
    (void)dev;
    float *restrict dw = k->dw;
    const float *restrict w = k->w;
    if (dw) memset(dw, 0, (size_t)k->n * sizeof *dw);
    for (int64_t r = 0; r < k->rows; r++) {
        const float *x = k->x + r * k->n, *gy = k->gy + r * k->n;
        float *dx = k->out + r * k->n, rstd = row_rstd(x, k->n, k->eps);
        /* dx = rstd (d - xhat mean(d xhat)), d = gy w, xhat = x rstd */
        mw__v8 acc = {0};
        int64_t j = 0;
        for (; j + 8 <= k->n; j += 8) {
            mw__v8 g, xv, wv;
            memcpy(&g, gy + j, sizeof g);
            memcpy(&xv, x + j, sizeof xv);
            memcpy(&wv, w + j, sizeof wv);
            acc += g * wv * (xv * rstd);
        }
        float a[8];
        memcpy(a, &acc, sizeof a);
        for (int l = 0; j < k->n; j++, l++) a[l] += gy[j] * w[j] * (x[j] * rstd);
        float c = MW__SUM8(a) / (float)k->n;
        /* dx, and with dw the dw kernel's terms in its order, row after row */
        int64_t i = 0;
        for (; i + 8 <= k->n; i += 8) {
            mw__v8 g, xv, wv, y;
            memcpy(&g, gy + i, sizeof g);
            memcpy(&xv, x + i, sizeof xv);
            memcpy(&wv, w + i, sizeof wv);
            mw__v8 xh = xv * rstd;
            y = rstd * (g * wv - xh * c);
            memcpy(dx + i, &y, sizeof y);
            if (dw) {
                mw__v8 sw;
                memcpy(&sw, dw + i, sizeof sw);
                sw += g * xh;
                memcpy(dw + i, &sw, sizeof sw);
            }
        }
        for (; i < k->n; i++) {
            float xh = x[i] * rstd;
            dx[i] = rstd * (gy[i] * w[i] - xh * c);
            if (dw) dw[i] += gy[i] * xh;
        }
        if (k->addend) add_addend(dx, k->addend + r * k->n, k->n);
    }
    return MW_OK;
}

mw_status MW__CPU(mw__cpu_rmsnorm_dw)(mw__device *dev, const mw__k_rmsnorm_grad *k) {
    (void)dev;
    memset(k->out, 0, (size_t)k->n * sizeof *k->out);
    for (int64_t r = 0; r < k->rows; r++) {
        const float *x = k->x + r * k->n, *gy = k->gy + r * k->n;
        float rstd = row_rstd(x, k->n, k->eps);
        for (int64_t j = 0; j < k->n; j++) k->out[j] += gy[j] * (x[j] * rstd);
    }
    return MW_OK;
}

/* Columns row i of a block may see. */
static int64_t visible(int causal, int64_t i, int64_t s, int64_t k) {
    if (!causal) return k;
    int64_t v = i + (k - s) + 1;
    return v < 0 ? 0 : v > k ? k : v;
}

mw_status MW__CPU(mw__cpu_softmax)(mw__device *dev, const mw__k_softmax *k) {
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

mw_status MW__CPU(mw__cpu_softmax_grad)(mw__device *dev, const mw__k_softmax_grad *k) {
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

mw_status MW__CPU(mw__cpu_xent)(mw__device *dev, const mw__k_xent *k) {
    (void)dev;
    for (int64_t r = 0; r < k->rows; r++) {
        int32_t t = k->targets[r];
        if (t < 0 || t >= k->valid) return MW__CPU(mw__cpu_out_of_range)("target", t, r, k->valid);
        const float *x = k->logits + r * k->v;
        float mx;
        double sum = row_expsum(x, k->valid, &mx);
        k->out[r] = (float)((double)mx + log(sum) - x[t]);
    }
    return MW_OK;
}

mw_status MW__CPU(mw__cpu_xent_grad)(mw__device *dev, const mw__k_xent_grad *k) {
    (void)dev;
    for (int64_t r = 0; r < k->rows; r++) {
        int32_t t = k->targets[r];
        if (t < 0 || t >= k->valid) return MW__CPU(mw__cpu_out_of_range)("target", t, r, k->valid);
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

/* --- rotary embeddings ------------------------------------------------------------------------ */

/* Positions come from the row's index along the sequence (the device's table of their angles,
 * rope_angles.h, made in the work buffer where it keeps none), or with pos from pos's entry (made
 * per row, or kept while consecutive rows share the position, as the heads of one token do). */
mw_status MW__CPU(mw__cpu_rope)(mw__device *dev, const mw__k_rope *k) {
    int half = k->dims / 2, bf16 = k->out_dtype == MW_BF16;
    if (k->rows <= 0 || half <= 0) return MW_OK;
    if (half > MW__ROPE_HALF_MAX)
        return mw__error(MW_ERR_UNSUPPORTED, "%s: rotary embeddings over %d features (at most %d)",
                         dev->name, k->dims, 2 * MW__ROPE_HALF_MAX);
    float freq[MW__ROPE_HALF_MAX];
    for (int j = 0; k->pos && j < half; j++) freq[j] = mw__rope_freq(&k->freqs, j);
    const float *table = NULL;
    float rc[MW__ROPE_HALF_MAX], rs[MW__ROPE_HALF_MAX];
    if (!k->pos) {
        size_t bytes = (size_t)k->seq * (size_t)half * 3 * sizeof(float);
        mw_status st = mw__cpu_work_reserve(dev, bytes);
        if (st) return st;
        table = mw__cpu_rope_table(dev, k, k->offset, k->seq, mw__cpu_work(dev));
    }
    int64_t last = -1;
    int have = 0;
    for (int64_t r = 0; r < k->rows; r++) {
        if (k->parts > 0 && (r / k->part_inner) % k->part_size >= k->parts) {
            /* a row past the rotated parts (a value): copied */
            const float *x = k->x + r * k->n;
            if (bf16)
                mw__bf16_narrow(k->n, x, (uint16_t *)k->out + r * k->n);
            else
                memcpy((float *)k->out + r * k->n, x, (size_t)k->n * sizeof *x);
            continue;
        }
        int64_t i = (r / k->inner) % k->seq;
        const float *c, *s;
        if (table) {
            c = table + 3 * i * half;
            s = c + (k->inverse ? 2 : 1) * half;
        } else {
            int64_t p = k->offset + i + k->pos[r / k->prefix];
            if (!have || p != last) mw__rope_angles(k, freq, p, rc, rs);
            last = p, have = 1;
            c = rc, s = rs;
        }
        if (bf16)
            mw__rope_row(k, k->x + r * k->n, k->out, r * k->n, c, s, 1);
        else
            mw__rope_row(k, k->x + r * k->n, k->out, r * k->n, c, s, 0);
    }
    return MW_OK;
}
