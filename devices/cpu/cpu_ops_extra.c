/* The CPU kernels of the ops and optimizers beyond the core set: plain loops over the per-element
 * math of devices/math.h. */
#include "devices/cpu/cpu_ops_extra.h"

#include "devices/cpu/simd.h"
#include "devices/math.h"

#include <math.h>
#include <string.h>

#include "core/error.h"

mw_status mw__cpu_sgd_momentum(mw__device *dev, const mw__k_sgd_momentum *k) {
    (void)dev;
    for (int64_t i = 0; i < k->count; i++) {
        k->p[i] = mw__sgd_momentum_update(k->p[i], k->grad_scale * k->g[i],
                                          k->buf ? &k->buf[i] : NULL, k->lr, k->momentum,
                                          k->dampening, k->weight_decay, k->nesterov, k->first);
        if (k->p16) k->p16[i] = mw__bf16_from_f32(k->p[i]);
    }
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
MW__CPU_CLONES
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

/* A position per outer row in [0, n), or an error naming the first that is not. */
static mw_status positions_ok(const mw__device *dev, const int32_t *ids, int64_t outer, int64_t n,
                              const char *what) {
    for (int64_t o = 0; o < outer; o++)
        if (ids[o] < 0 || ids[o] >= n)
            return mw__error(MW_ERR_INVALID, "%s: %s: position %d of row %lld is outside [0, %lld)",
                             dev ? dev->name : "cpu", what, (int)ids[o], (long long)o,
                             (long long)n);
    return MW_OK;
}

mw_status mw__cpu_state_write(mw__device *dev, const mw__k_state_write *k) {
    mw_status st = positions_ok(dev, k->ids, k->outer, k->n, "state write");
    if (st) return st;
    for (int64_t o = 0; o < k->outer; o++)
        memcpy(k->out + (o * k->n + k->ids[o]) * k->inner, k->value + o * k->inner,
               (size_t)k->inner * sizeof *k->out);
    return MW_OK;
}

/* Per row and head, the query against keys 0..pos in key order with a running maximum (the
 * output row holds the weighted sum of values as it grows), f32 throughout. */
mw_status mw__cpu_attention_cached(mw__device *dev, const mw__k_attention_cached *k) {
    mw_status st = positions_ok(dev, k->pos, k->outer, k->n, "cached attention");
    if (st) return st;
    const int64_t H = k->heads, D = k->dim, row = 2 * H * D; /* one key position: keys, values */
    for (int64_t o = 0; o < k->outer; o++)
        for (int64_t h = 0; h < H; h++) {
            const float *q = k->q + (o * H + h) * D, *kv = k->kv + o * k->n * row + h * D;
            float *acc = k->out + (o * H + h) * D, m = -INFINITY, l = 0.0f;
            memset(acc, 0, (size_t)D * sizeof *acc);
            for (int64_t j = 0; j <= k->pos[o]; j++) {
                const float *key = kv + j * row, *val = key + H * D;
                float s = 0.0f;
                for (int64_t d = 0; d < D; d++) s += q[d] * key[d];
                s *= k->scale;
                if (s > m) { /* a new maximum: what is summed so far shrinks by e^(m - s) */
                    float c = mw__expf(m - s);
                    l *= c;
                    for (int64_t d = 0; d < D; d++) acc[d] *= c;
                    m = s;
                }
                float e = mw__expf(s - m);
                l += e;
                for (int64_t d = 0; d < D; d++) acc[d] += e * val[d];
            }
            float inv = 1.0f / l;
            for (int64_t d = 0; d < D; d++) acc[d] *= inv;
        }
    return MW_OK;
}

static void reduce_max(const mw__k_max *k, int arg) {
    for (int64_t o = 0; o < k->outer; o++)
        for (int64_t i = 0; i < k->inner; i++) {
            const float *a = k->a + o * k->n * k->inner + i;
            int64_t best = 0;
            for (int64_t j = 1; j < k->n; j++)
                if (a[j * k->inner] > a[best * k->inner] ||
                    (a[best * k->inner] != a[best * k->inner] &&
                     a[j * k->inner] == a[j * k->inner]))
                    best = j;
            k->out[o * k->inner + i] = arg ? (float)best : a[best * k->inner];
        }
}

mw_status mw__cpu_argmax(mw__device *dev, const mw__k_max *k) {
    (void)dev;
    reduce_max(k, 1);
    return MW_OK;
}

mw_status mw__cpu_reduce_max(mw__device *dev, const mw__k_max *k) {
    (void)dev;
    reduce_max(k, 0);
    return MW_OK;
}

mw_status mw__cpu_map(mw__device *dev, const mw__k_map *k) {
    (void)dev;
    for (int64_t i = 0; i < k->count; i++) k->out[i] = mw__map(k->fn, k->a[i]);
    return MW_OK;
}

mw_status mw__cpu_map_grad(mw__device *dev, const mw__k_map_grad *k) {
    (void)dev;
    for (int64_t i = 0; i < k->count; i++) k->out[i] = k->gy[i] * mw__map_grad(k->fn, k->x[i]);
    return MW_OK;
}

mw_status mw__cpu_dropout(mw__device *dev, const mw__k_dropout *k) {
    (void)dev;
    if (k->active && k->p > 0.0f)
        dropout(k);
    else if (k->out != k->a)
        memcpy(k->out, k->a, (size_t)k->count * sizeof *k->out);
    return MW_OK;
}
