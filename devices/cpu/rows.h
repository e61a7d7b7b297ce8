/* Internal: row helpers shared by the CPU kernels. Always inlined (MW__CPU_INLINE), so each kernel
 * compiled for several vector units (simd.h) gets them compiled for the same unit (a copy kept
 * out of line would be the baseline one: slower, and without FMA). Every sum is taken over
 * interleaved lanes (eight, sixteen, or simd.h's 32 wide ones in double) combined in a fixed
 * order, so results depend only on the data and the row length. */
#ifndef MW__CPU_ROWS_H
#define MW__CPU_ROWS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "devices/cpu/simd.h"
#include "devices/device.h"
#include "devices/math.h"

/* Walks every index of nd but the last dim, calling body(o0, o1, o2) with the element offsets of
 * each operand at the start of an innermost row. */
#define MW__ND_ROWS(nd, nops, body)                                                                \
    do {                                                                                           \
        int r_ = (nd)->rank;                                                                       \
        int64_t idx_[MW__ND_MAX] = {0};                                                            \
        int64_t o_[3] = {0, 0, 0};                                                                 \
        for (;;) {                                                                                 \
            int64_t o0 = o_[0], o1 = o_[1], o2 = o_[2];                                            \
            (void)o0, (void)o1, (void)o2;                                                          \
            body;                                                                                  \
            int d_ = r_ - 2;                                                                       \
            while (d_ >= 0) {                                                                      \
                for (int k_ = 0; k_ < (nops); k_++) o_[k_] += (nd)->stride[k_][d_];                \
                if (++idx_[d_] < (nd)->dims[d_]) break;                                            \
                for (int k_ = 0; k_ < (nops); k_++)                                                \
                    o_[k_] -= (nd)->stride[k_][d_] * (nd)->dims[d_];                               \
                idx_[d_] = 0;                                                                      \
                d_--;                                                                              \
            }                                                                                      \
            if (d_ < 0) break;                                                                     \
        }                                                                                          \
    } while (0)

/* *y = e^x lane by lane: mw__expf (devices/math.h) step for step in vector code, its clamps as
 * mask selects. Written out because the compiler, given mw__expf's clamps as scalar selects,
 * may copy the arithmetic that follows into each side of them (in GELU: two divisions). Defined
 * for eight lanes (mw__exp8) and sixteen (mw__exp16: one AVX-512 vector of work where the level
 * has it, two or four narrower ones elsewhere), the same steps lane by lane. */
#define MW__DEFINE_EXP(name, V, VI, VU)                                                            \
    MW__CPU_INLINE void name(V *y, const V *xp) {                                                  \
        V x = *xp, lo = (V){0} - 87.0f, hi = (V){0} + 88.0f;                                       \
        VI below = (x < -87.0f), above = (x > 88.0f); /* false in a NaN lane: it stays */          \
        x = (V)(((VI)x & ~below) | ((VI)lo & below));                                              \
        x = (V)(((VI)x & ~above) | ((VI)hi & above));                                              \
        V t = x * 1.44269504f + 12582912.0f;                                                       \
        V n = t - 12582912.0f;                                                                     \
        V r = (x - n * 0.693145752f) - n * 1.42860677e-6f;                                         \
        V p =                                                                                      \
            1.0f +                                                                                 \
            r * (1.0f + r * (0.5f + r * (1.0f / 6 +                                                \
                                         r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720)))))); \
        VU bits = ((VU)t - 0x4B400000u + 127u) << 23;                                              \
        *y = p * (V)bits;                                                                          \
    }
MW__DEFINE_EXP(mw__exp8, mw__v8, mw__v8i, mw__v8u)
MW__DEFINE_EXP(mw__exp16, mw__v16, mw__v16i, mw__v16u)

/* mv = v where v > mv or v is NaN, lane by lane. */
#define MW__MAX8(mv, v)                                                                            \
    do {                                                                                           \
        mw__v8i take_ = ((v) > (mv)) | ((v) != (v));                                               \
        (mv) = (mw__v8)(((mw__v8i)(v)&take_) | ((mw__v8i)(mv) & ~take_));                          \
    } while (0)

/* max of scale * a[j] over a row; a NaN anywhere makes it NaN. Lane l holds the elements
 * j = l mod 8 of the whole blocks (a sticky NaN: once a lane is NaN, v > NaN is false). */
MW__CPU_INLINE float mw__row_max(const float *restrict a, int64_t n, float scale) {
    mw__v8 mv, mv2, v, v2; /* two chains of compare-and-select, so that they overlap */
    for (int l = 0; l < 8; l++) mv[l] = mv2[l] = -INFINITY;
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        memcpy(&v, a + j, sizeof v);
        memcpy(&v2, a + j + 8, sizeof v2);
        v *= scale;
        v2 *= scale;
        MW__MAX8(mv, v);
        MW__MAX8(mv2, v2);
    }
    MW__MAX8(mv, mv2);
    for (; j + 8 <= n; j += 8) {
        memcpy(&v, a + j, sizeof v);
        v *= scale;
        MW__MAX8(mv, v);
    }
    float m[8];
    memcpy(m, &mv, sizeof m);
    for (int l = 0; j < n; j++, l++) {
        float v = scale * a[j];
        m[l] = v > m[l] || v != v ? v : m[l];
    }
    float r = m[0];
    for (int l = 1; l < 8; l++) r = m[l] > r || m[l] != m[l] ? m[l] : r;
    return r;
}

/* sum of a[j] * b[j] over a row, in double (each product is exact there), rounded once: the
 * softmax gradient subtracts it from gy, where a float sum's error would show. The wide lanes of
 * simd.h (mw__wide_sum), sixteen products a vector. */
MW__CPU_INLINE void mw__wide_add_prod(mw__wide_sum *s, int h, mw__v16 a, mw__v16 b) {
    mw__v8d alo, ahi, blo, bhi;
    mw__widen16(a, &alo, &ahi);
    mw__widen16(b, &blo, &bhi);
    s->v[2 * h] += alo * blo;
    s->v[2 * h + 1] += ahi * bhi;
}

MW__CPU_INLINE float mw__row_dot(const float *restrict a, const float *restrict b, int64_t n) {
    mw__wide_sum s = {0};
    mw__v16 x, y, u, w;
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        memcpy(&x, a + j, sizeof x);
        memcpy(&y, b + j, sizeof y);
        memcpy(&u, a + j + 16, sizeof u);
        memcpy(&w, b + j + 16, sizeof w);
        mw__wide_add_prod(&s, 0, x, y);
        mw__wide_add_prod(&s, 1, u, w);
    }
    for (; j + 16 <= n; j += 16) {
        memcpy(&x, a + j, sizeof x);
        memcpy(&y, b + j, sizeof y);
        mw__wide_add_prod(&s, 0, x, y);
    }
    for (; j < n; j++) s.tail += (double)a[j] * b[j];
    return (float)mw__wide_total(&s);
}

/* A row's last rem (0 < rem < 16) floats: read into lanes 0.. of a vector (zeros after them), and
 * lanes 0.. of v written there. At AVX-512 through masks; elsewhere a copy, whose size varies
 * (a call to memcpy: at attention's rows, where a row is 1 to 256 long, these calls and a
 * scalar tail of the maximum were about 40 % of the softmax). */
#ifdef __AVX512F__
MW__CPU_INLINE __mmask16 mw__part_mask16(int64_t rem) { return (__mmask16)((1u << rem) - 1u); }
#endif
MW__CPU_INLINE void mw__load_part16(mw__v16 *v, const float *src, int64_t rem) {
#ifdef __AVX512F__
    *v = (mw__v16)_mm512_maskz_loadu_ps(mw__part_mask16(rem), src);
#else
    *v = (mw__v16){0};
    memcpy(v, src, (size_t)rem * sizeof(float));
#endif
}
MW__CPU_INLINE void mw__store_part16(float *dst, const mw__v16 *v, int64_t rem) {
#ifdef __AVX512F__
    _mm512_mask_storeu_ps(dst, mw__part_mask16(rem), (__m512)*v);
#else
    memcpy(dst, v, (size_t)rem * sizeof(float));
#endif
}

/* The maximum of scale * a over a row, for the softmax. At AVX-512 by vector max in two chains,
 * the tail through a mask; a NaN in the row need not reach it there: its exponential is NaN, and
 * through the sum so is every output (elsewhere mw__row_max, where a NaN makes it NaN). */
MW__CPU_INLINE float softmax_max(const float *a, int64_t n, float scale) {
#ifdef __AVX512F__
    __m512 mv = _mm512_set1_ps(-INFINITY), mv2 = mv, sv = _mm512_set1_ps(scale);
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        mv = _mm512_max_ps(mv, _mm512_mul_ps(sv, _mm512_loadu_ps(a + j)));
        mv2 = _mm512_max_ps(mv2, _mm512_mul_ps(sv, _mm512_loadu_ps(a + j + 16)));
    }
    mv = _mm512_max_ps(mv, mv2);
    for (; j + 16 <= n; j += 16) mv = _mm512_max_ps(mv, _mm512_mul_ps(sv, _mm512_loadu_ps(a + j)));
    if (j < n) {
        mw__v16 t;
        mw__load_part16(&t, a + j, n - j);
        mv = _mm512_mask_max_ps(mv, mw__part_mask16(n - j), mv, _mm512_mul_ps(sv, (__m512)t));
    }
    return _mm512_reduce_max_ps(mv);
#else
    return mw__row_max(a, n, scale);
#endif
}

/* y[j] = softmax(scale * a)[j] for j < n (y may be a). An empty row is left alone. Sixteen lanes
 * a vector (mw__exp16), the exponentials summed in float in sixteen lanes (the row's last
 * n mod 16 elements in lanes 0.., the other lanes 0), folded to eight and combined as MW__SUM8
 * does. */
MW__CPU_INLINE void mw__row_softmax(const float *a, float *y, int64_t n, float scale) {
    if (n <= 0) return;
    float mx = softmax_max(a, n, scale);
    mw__v16 acc = {0}, v, e;
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        memcpy(&v, a + j, sizeof v);
        v = scale * v - mx;
        mw__exp16(&e, &v);
        memcpy(y + j, &e, sizeof e);
        acc += e;
    }
    if (j < n) { /* one vector exponential, its lanes past the row set to 0 */
        const mw__v16i lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
        mw__load_part16(&v, a + j, n - j);
        v = scale * v - mx;
        mw__exp16(&e, &v);
        e = (mw__v16)((mw__v16i)e & (lane < (int)(n - j)));
        mw__store_part16(y + j, &e, n - j);
        acc += e;
    }
    mw__v8 lo = __builtin_shufflevector(acc, acc, 0, 1, 2, 3, 4, 5, 6, 7),
           hi = __builtin_shufflevector(acc, acc, 8, 9, 10, 11, 12, 13, 14, 15), s8 = lo + hi;
    float inv = 1.0f / MW__SUM8(s8);
    for (j = 0; j + 16 <= n; j += 16) {
        memcpy(&v, y + j, sizeof v);
        v *= inv;
        memcpy(y + j, &v, sizeof v);
    }
    if (j < n) {
        mw__load_part16(&v, y + j, n - j);
        v *= inv;
        mw__store_part16(y + j, &v, n - j);
    }
}

/* Rotary embeddings (mw__k_rope's rotation, for rope and for the attention that rotates q and k
 * as it reads them): cos and sin of position p times each frequency, as transformers makes them:
 * the angle an f32 product, its cos and sin in f32; the sine negated for the inverse rotation. */
MW__CPU_INLINE void mw__rope_angles(const mw__k_rope *k, const float *freq, int64_t p, float *c,
                                    float *s) {
    int half = k->dims / 2;
    float sign = k->inverse ? -1.0f : 1.0f;
    for (int j = 0; j < half; j++) {
        float a = (float)p * freq[j];
        c[j] = cosf(a);
        s[j] = sign * sinf(a);
    }
}

/* One row: x rotated by (c, s) into out (f32, or bf16 when bf16 is set; a constant after
 * inlining), the features past dims copied. */
MW__CPU_INLINE void mw__rope_row(const mw__k_rope *k, const float *restrict x, void *out, int64_t o,
                                 const float *restrict c, const float *restrict s, int bf16) {
    int half = k->dims / 2;
    float *y = (float *)out + o;
    uint16_t *h = (uint16_t *)out + o;
#define PUT(j, v) (bf16 ? (void)(h[j] = mw__bf16_from_f32(v)) : (void)(y[j] = (v)))
    if (k->style == MW_ROPE_INTERLEAVED) {
        for (int j = 0; j < half; j++) {
            float a = x[2 * j], b = x[2 * j + 1];
            PUT(2 * j, a * c[j] - b * s[j]);
            PUT(2 * j + 1, b * c[j] + a * s[j]);
        }
    } else {
        const float *restrict x2 = x + half;
        for (int j = 0; j < half; j++) PUT(j, x[j] * c[j] - x2[j] * s[j]);
        for (int j = 0; j < half; j++) PUT(half + j, x2[j] * c[j] + x[j] * s[j]);
    }
    for (int64_t j = k->dims; j < k->n; j++) PUT(j, x[j]);
#undef PUT
}

#endif
