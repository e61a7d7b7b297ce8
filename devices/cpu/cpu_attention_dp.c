/* Attention of bf16 q, k, v on AVX512-BF16's dot products (VDPBF16PS: sixteen f32 sums, each of
 * two bf16 products), this file's own tiles instead of a oneDNN call per block product: at a head
 * of 64 and blocks of 64 queries a library call spends longer checking, allocating and packing
 * than multiplying. The block layout, the kept probabilities and the order of every sum are those
 * of the oneDNN path (cpu_attention_dnnl.c):
 *
 *   forward, block [i0, i0 + m) of queries over keys [0, kend):
 *     S = scale Q_b K^T (f32) -> P = softmax(S) by row (f32; kept for the backward pass where the
 *     plan says) -> O_b = bf16(P) V, written in out's dtype
 *   backward, the same blocks:
 *     P (kept or made again), dP = bf16(dO_b) V^T (f32), dS = scale P (dP - rowsum(P dP)) ->
 *     dQ_b = bf16(dS) K; dK += bf16(dS)^T Q_b; dV += bf16(P)^T bf16(dO_b) (f32, d(qkv)),
 *     the last two made as their transposes (Q_b^T dS, dO_b^T P: their B operands are then rows of
 *     dS and P) in a slice's scratch, and written into d(qkv) after its last block
 *
 * The bf16 roundings of P, dS and dO flush subnormals to zero (VCVTNE2PS2BF16), as the dot
 * products read bf16 subnormals anyway; otherwise they round to nearest even as everywhere.
 *
 * A product C (m x n, f32) = A B reads A as bf16 rows whose depth is contiguous (pairs of
 * neighbours along the depth are one 32-bit broadcast) and B packed in panels of 16 columns,
 * each depth pair of a column side by side (pack_rows_of_bt, pack_rows_of_b), zero past the depth
 * and the columns. A micro tile is 16 rows of one 16-float accumulator. Causal products stop at
 * the diagonal to the nearest tile, as the f32 kernel's do; what a tile adds past the diagonal
 * is exactly 0 (masked probabilities and their gradients are 0).
 *
 * Only at the AVX-512 level, and chosen by attention_prepare where the CPU has AVX512-BF16 but no
 * AMX (there oneDNN's AMX kernels run the products). */
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "devices/cpu/cpu_attention_impl.h"
#include "devices/cpu/cpu_isa.h"
#include "devices/cpu/cpu_kernels.h"
#include "devices/cpu/cpu_state.h"
#include "devices/cpu/rows.h"
#include "devices/math.h"

#ifdef __AVX512F__
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512bf16")

#define PANEL 16                    /* B's columns per panel */
#define ROWS 16                     /* C's rows per micro tile: 16 accumulators */
#define ALL ((int64_t)1 << 40)      /* a product's limit that limits nothing */
#define EVEN(n) (((n) + 1) / 2 * 2) /* a depth rounded up to whole pairs */
#define PANELS(n) (((n) + PANEL - 1) / PANEL)

/* Bytes of B packed for n columns over depth `depth`. */
static size_t packed_bytes(int64_t n, int64_t depth) {
    return (size_t)(PANELS(n) * PANEL * EVEN(depth)) * sizeof(uint16_t);
}

/* r[i] (16 rows of 16 32-bit words) becomes its transpose: r[i] holds word i of every row. */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(
            _mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(
            _mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(
            _mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(
            _mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    for (int h = 0; h < 16; h += 8)
        for (int i = 0; i < 4; i++) {
            t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
            t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}

/* B(p, j) = src[j * ld + p] (B's columns are rows of src, as K is for Q K^T): panel l, depth pair
 * pp, column jj at dst[(l * pairs + pp) * 32 + 2 jj + {0, 1}]. A full panel's 16 rows are
 * transposed as 32-bit words (pairs), 16 pairs at a time, through registers. */
static void pack_rows_of_bt(const uint16_t *src, int64_t ld, int64_t n, int64_t depth,
                            uint16_t *dst) {
    int64_t pairs = EVEN(depth) / 2;
    for (int64_t l = 0; l < PANELS(n); l++) {
        uint16_t *panel = dst + l * pairs * 2 * PANEL;
        int64_t pp = 0;
        if ((l + 1) * PANEL <= n)
            for (; 2 * (pp + 16) <= depth; pp += 16) {
                __m512 r[16];
                for (int i = 0; i < 16; i++)
                    r[i] = _mm512_loadu_ps(src + (l * PANEL + i) * ld + 2 * pp);
                transpose16(r);
                for (int i = 0; i < 16; i++) _mm512_storeu_ps(panel + (pp + i) * 2 * PANEL, r[i]);
            }
        for (int64_t jj = 0; jj < PANEL; jj++) {
            int64_t j = l * PANEL + jj;
            const uint16_t *row = j < n ? src + j * ld : NULL; /* NULL: a padding column */
            for (int64_t q = pp; q < pairs; q++) {
                int64_t p = 2 * q;
                panel[q * 2 * PANEL + 2 * jj] = row && p < depth ? row[p] : 0;
                panel[q * 2 * PANEL + 2 * jj + 1] = row && p + 1 < depth ? row[p + 1] : 0;
            }
        }
    }
}

/* B(p, j) = src[p * ld + j] (B's rows are rows of src, as V is for P V), packed as above: two
 * rows of src interleaved per depth pair. */
static void pack_rows_of_b(const uint16_t *src, int64_t ld, int64_t depth, int64_t n,
                           uint16_t *dst) {
    int64_t pairs = EVEN(depth) / 2;
    for (int64_t l = 0; l < PANELS(n); l++) {
        uint16_t *panel = dst + l * pairs * 2 * PANEL;
        int64_t j0 = l * PANEL, nc = n - j0 < PANEL ? n - j0 : PANEL;
        for (int64_t pp = 0; pp < pairs; pp++) {
            uint16_t *out = panel + pp * 2 * PANEL;
            int has1 = 2 * pp + 1 < depth; /* the pair's second row exists */
            const uint16_t *r0 = src + 2 * pp * ld + j0, *r1 = has1 ? r0 + ld : r0;
            if (nc == PANEL && has1) { /* interleave two rows of 16 through registers */
                __m256i a = _mm256_loadu_si256((const __m256i *)r0);
                __m256i b = _mm256_loadu_si256((const __m256i *)r1);
                __m256i lo = _mm256_unpacklo_epi16(a, b), hi = _mm256_unpackhi_epi16(a, b);
                _mm256_storeu_si256((__m256i *)out, _mm256_permute2x128_si256(lo, hi, 0x20));
                _mm256_storeu_si256((__m256i *)(out + PANEL),
                                    _mm256_permute2x128_si256(lo, hi, 0x31));
                continue;
            }
            for (int64_t jj = 0; jj < PANEL; jj++) {
                out[2 * jj] = jj < nc ? r0[jj] : 0;
                out[2 * jj + 1] = jj < nc && has1 ? r1[jj] : 0;
            }
        }
    }
}

/* A product's operands: C (ldc apart, f32) = alpha A B (add: +=), B packed for `pairs` depth
 * pairs, column panel l summing the depth from l * PANEL + col_lo on (-ALL: from 0). A is bf16,
 * readable (zero or finite) up to the even depth: the depth pair pp of row r at
 * a + (r / ROWS) * a_tile + (r % ROWS) * a_row + pp * a_pair: rows (a_row = lda, a_pair = 2,
 * a_tile = ROWS lda), or packed as B is (a_row = 2, a_pair = 2 PANEL, a_tile = its panel's size:
 * A^T's rows are then read as A's, ROWS = PANEL). Products start their tiles at multiples of
 * ROWS. */
typedef struct dprod {
    const uint16_t *a;
    int64_t a_row, a_pair, a_tile;
    const uint16_t *b;
    int64_t pairs;
    float *c;
    int64_t ldc;
    float alpha;
    int add;
    int64_t col_lo;
} dprod;

/* Rows [r, r + R) x panel l's nc columns of C over depth pairs [pp0, pp1). */
MW__CPU_INLINE void dmicro(const dprod *x, int R, int64_t r, int64_t l, int nc, int64_t pp0,
                           int64_t pp1) {
    __m512 acc[ROWS];
    for (int i = 0; i < R; i++) acc[i] = _mm512_setzero_ps();
    const uint16_t *a = x->a + r / ROWS * x->a_tile, *b = x->b + l * x->pairs * 2 * PANEL;
    for (int64_t pp = pp0; pp < pp1; pp++) {
        __m512bh bv = (__m512bh)_mm512_loadu_si512(b + pp * 2 * PANEL);
        for (int i = 0; i < R; i++) {
            uint32_t w;
            memcpy(&w, a + i * x->a_row + pp * x->a_pair, sizeof w);
            acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)_mm512_set1_epi32((int)w), bv);
        }
    }
    __mmask16 mask = nc == PANEL ? (__mmask16)0xffff : (__mmask16)((1u << nc) - 1);
    __m512 alpha = _mm512_set1_ps(x->alpha);
    for (int i = 0; i < R; i++) {
        float *c = x->c + (r + i) * x->ldc + l * PANEL;
        __m512 y = x->add ? _mm512_fmadd_ps(alpha, acc[i], _mm512_maskz_loadu_ps(mask, c))
                          : _mm512_mul_ps(alpha, acc[i]);
        _mm512_mask_storeu_ps(c, mask, y);
    }
}

static int64_t clamp(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* C (m x n) = alpha A B over depth kn, row r of a tile starting at r0 summing the depth
 * [r0 + lo, r0 + ROWS + hi) clamped to [0, kn) and rounded out to whole pairs; column panel l
 * computed from row l - cols on (the f32 kernel's product, cpu_attention.c). */
static void dproduct(const dprod *x, int64_t m, int64_t n, int64_t kn, int64_t lo, int64_t hi,
                     int64_t cols) {
    for (int64_t l = 0; l < PANELS(n); l++) {
        int nc = n - l * PANEL < PANEL ? (int)(n - l * PANEL) : PANEL;
        for (int64_t r = clamp(l * PANEL - cols, 0, m); r < m;) {
            int R = m - r >= ROWS ? ROWS : (int)(m - r);
            int64_t p0 = clamp(r + lo, 0, kn), p1 = clamp(r + R + hi, p0, kn);
            if (l * PANEL + x->col_lo > p0) p0 = clamp(l * PANEL + x->col_lo, p0, p1);
            int64_t pp0 = p0 / 2, pp1 = (p1 + 1) / 2;
            if (pp1 > pp0 || !x->add) switch (R) {
                case 16: dmicro(x, 16, r, l, nc, pp0, pp1); break;
                case 15: dmicro(x, 15, r, l, nc, pp0, pp1); break;
                case 14: dmicro(x, 14, r, l, nc, pp0, pp1); break;
                case 13: dmicro(x, 13, r, l, nc, pp0, pp1); break;
                case 12: dmicro(x, 12, r, l, nc, pp0, pp1); break;
                case 11: dmicro(x, 11, r, l, nc, pp0, pp1); break;
                case 10: dmicro(x, 10, r, l, nc, pp0, pp1); break;
                case 9: dmicro(x, 9, r, l, nc, pp0, pp1); break;
                case 8: dmicro(x, 8, r, l, nc, pp0, pp1); break;
                case 7: dmicro(x, 7, r, l, nc, pp0, pp1); break;
                case 6: dmicro(x, 6, r, l, nc, pp0, pp1); break;
                case 5: dmicro(x, 5, r, l, nc, pp0, pp1); break;
                case 4: dmicro(x, 4, r, l, nc, pp0, pp1); break;
                case 3: dmicro(x, 3, r, l, nc, pp0, pp1); break;
                case 2: dmicro(x, 2, r, l, nc, pp0, pp1); break;
                default: dmicro(x, 1, r, l, nc, pp0, pp1); break;
                }
            r += R;
        }
    }
}

/* rows x n bf16 (rows `ld` apart) into rows of EVEN(n), the pad 0. */
static void copy_rows(int64_t rows, int64_t n, const uint16_t *src, int64_t ld, uint16_t *dst) {
    for (int64_t r = 0; r < rows; r++) {
        memcpy(dst + r * EVEN(n), src + r * ld, (size_t)n * sizeof *dst);
        if (n % 2) dst[r * EVEN(n) + n] = 0;
    }
}

/* rows x n f32 (rows `ld` apart) rounded into bf16 rows of EVEN(n), the pad 0: to nearest even,
 * as mw__bf16_narrow, subnormals to zero (the products read them as zero anyway). */
static void narrow_rows(int64_t rows, int64_t n, const float *src, int64_t ld, uint16_t *dst) {
    for (int64_t r = 0; r < rows; r++) {
        const float *x = src + r * ld;
        uint16_t *y = dst + r * EVEN(n);
        int64_t j = 0;
        for (; j + 32 <= n; j += 32) {
            __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + j + 16), _mm512_loadu_ps(x + j));
            _mm512_storeu_si512(y + j, (__m512i)h);
        }
        if (j < n) mw__bf16_narrow(n - j, x + j, y + j);
        if (n % 2) y[n] = 0;
    }
}

/* The scratch of one attention instruction in the device's work buffer (byte offsets). */
typedef struct dp_attention {
    mw__cpu_attention_impl_kind kind; /* MW__ATTN_IMPL_DP */
    size_t kt, vb, vt, kb, s, dp, p16, ds16, q16, do16, qt16, dot16, pb, dsb, dkt, dvt, o32, bytes;
} dp_attention;

static size_t up64(size_t n) { return (n + 63) / 64 * 64; }

mw_status MW__CPU(mw__cpu_attention_dp_prepare)(mw__device *dev, mw__k_attention *k, int grad) {
    dp_attention *a = mw__calloc(1, sizeof *a);
    mw_status st = a ? mw__cpu_own(dev, a, mw__free)
                     : mw__error(MW_ERR_NOMEM, "%s: out of memory preparing attention", dev->name);
    if (st) return st;
    a->kind = MW__ATTN_IMPL_DP;
    int64_t t = k->t, d = k->d, blk = k->block;
    size_t h = sizeof(uint16_t), f = sizeof(float), off = 0;
#define TAKE(field, bytes) (a->field = off, off = up64(off + (bytes)))
    TAKE(kt, packed_bytes(t, d)); /* K^T for S */
    TAKE(s, (size_t)(blk * t) * f);
    TAKE(p16, (size_t)(blk * EVEN(t)) * h);
    TAKE(q16, (size_t)(blk * EVEN(d)) * h);
    if (!grad) {
        TAKE(vb, packed_bytes(d, t)); /* V for P V */
        TAKE(o32, (size_t)(blk * d) * f);
    } else {
        TAKE(vt, packed_bytes(t, d)); /* V^T for dO V^T */
        TAKE(kb, packed_bytes(d, t)); /* K for dS K */
        TAKE(dp, (size_t)(blk * t) * f);
        TAKE(ds16, (size_t)(blk * EVEN(t)) * h);
        TAKE(do16, (size_t)(blk * EVEN(d)) * h);
        TAKE(qt16, packed_bytes(d, blk));  /* Q_b^T for Q_b^T dS, packed as a B */
        TAKE(dot16, packed_bytes(d, blk)); /* dO_b^T for dO_b^T P */
        TAKE(pb, packed_bytes(t, blk));    /* P and dS as B, over the block's queries */
        TAKE(dsb, packed_bytes(t, blk));
        TAKE(dkt, (size_t)(d * t) * f); /* dK^T and dV^T of the slice */
        TAKE(dvt, (size_t)(d * t) * f);
    }
#undef TAKE
    a->bytes = off;
    k->impl = a;
    return mw__cpu_work_reserve(dev, a->bytes);
}

/* e^x in 16 lanes: mw__exp8's steps (devices/cpu/rows.h), its clamps as masked moves. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ),
                           _mm512_set1_ps(-87.0f));
    x = _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.0f), _CMP_GT_OQ),
                           _mm512_set1_ps(88.0f));
    __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504f), _mm512_set1_ps(12582912.0f));
    __m512 n = _mm512_sub_ps(t, _mm512_set1_ps(12582912.0f));
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_fmadd_ps(r, _mm512_set1_ps(1.0f / 720), _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(1.0f));
    __m512i bits = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B400000)),
                         _mm512_set1_epi32(127)),
        23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

/* The first min(16, left) lanes (none when left <= 0). */
static inline __mmask16 lanes(int64_t left) {
    return left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
}

/* Row r of the block: P = softmax(S) over the n keys it sees (S, already scaled, in row), 0 for
 * the rest of the kend; written as bf16 into p16 (EVEN(kend), the pad 0) and, where f32 is
 * wanted (kept for the backward pass, or dS made from it), into row itself. NaN propagates. */
static void softmax_row(float *row, int64_t n, int64_t kend, int f32, uint16_t *p16) {
    __m512 mx = _mm512_set1_ps(-INFINITY), acc = _mm512_setzero_ps();
    __mmask16 nan = 0;
    for (int64_t j = 0; j < n; j += 16) {
        __m512 v = _mm512_maskz_loadu_ps(lanes(n - j), row + j);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        mx = _mm512_mask_max_ps(mx, lanes(n - j), mx, v);
    }
    __m512 m = _mm512_set1_ps(nan ? NAN : _mm512_reduce_max_ps(mx));
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 k = lanes(n - j);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, row + j), m));
        _mm512_mask_storeu_ps(row + j, k, e);
        acc = _mm512_mask_add_ps(acc, k, acc, e);
    }
    __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(acc));
    for (int64_t j = 0; j < EVEN(kend); j += 32) { /* 0 past n, the pad included */
        __m512 a = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes(n - j), row + j), inv);
        __m512 b = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes(n - j - 16), row + j + 16), inv);
        if (f32) {
            _mm512_mask_storeu_ps(row + j, lanes(kend - j), a);
            _mm512_mask_storeu_ps(row + j + 16, lanes(kend - j - 16), b);
        }
        __m512i h = (__m512i)_mm512_cvtne2ps_pbh(b, a);
        _mm512_mask_storeu_epi16(
            p16 + j, (__mmask32)(EVEN(kend) - j >= 32 ? 0xffffffffu : (1u << (EVEN(kend) - j)) - 1),
            h);
    }
}

/* A product of this file: C = alpha A B, A's rows lda apart, B packed for `pairs` depth pairs,
 * every column from depth 0. */
static dprod prod_of(const uint16_t *a, int64_t lda, const void *b, int64_t pairs, float *c,
                     int64_t ldc, float alpha, int add) {
    return (dprod){.a = a,
                   .a_row = lda,
                   .a_pair = 2,
                   .a_tile = ROWS * lda,
                   .b = b,
                   .pairs = pairs,
                   .c = c,
                   .ldc = ldc,
                   .alpha = alpha,
                   .add = add,
                   .col_lo = -ALL};
}

/* The same with A^T packed as B (pack_rows_of_b of `depth` rows): A's rows are its columns. */
static dprod prod_of_packed(const uint16_t *at, int64_t depth, const void *b, int64_t pairs,
                            float *c, int64_t ldc, float alpha, int add) {
    dprod x = prod_of(at, 0, b, pairs, c, ldc, alpha, add);
    x.a_row = 2, x.a_pair = 2 * PANEL, x.a_tile = EVEN(depth) * PANEL;
    return x;
}

/* d x t f32 (rows t apart) into t rows of d, `ld` apart: 16 x 16 blocks through registers. */
static void transpose_out(int64_t d, int64_t t, const float *src, float *dst, int64_t ld) {
    int64_t c0 = 0, j0;
    for (; c0 + 16 <= d; c0 += 16) {
        for (j0 = 0; j0 + 16 <= t; j0 += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + (c0 + i) * t + j0);
            transpose16(r);
            for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + (j0 + i) * ld + c0, r[i]);
        }
        for (int64_t j = j0; j < t; j++)
            for (int64_t c = c0; c < c0 + 16; c++) dst[j * ld + c] = src[c * t + j];
    }
    for (int64_t j = 0; j < t; j++)
        for (int64_t c = c0; c < d; c++) dst[j * ld + c] = src[c * t + j];
}

mw_status MW__CPU(mw__cpu_attention_dp)(mw__device *dev, const mw__k_attention *k, int grad) {
    const dp_attention *a = k->impl;
    char *work = mw__cpu_work(dev);
#define W(type, field) ((type *)(work + a->field))
    uint16_t *kt = W(uint16_t, kt), *p16 = W(uint16_t, p16), *q16 = W(uint16_t, q16);
    float *sbuf = W(float, s);
    const int64_t t = k->t, d = k->d, seq = k->seq_qkv, G = mw__attn_group(k);
    const int64_t dpairs = EVEN(d) / 2, tpairs = EVEN(t) / 2;
    for (int64_t s = 0; s < k->slices; s++) {
        int64_t oo0, oq0;
        mw__attn_slice_offsets(&k->walk, s, &oo0, &oq0);
        const uint16_t *kk = (const uint16_t *)k->qkv + oq0 + G * k->part, *v = kk + k->part;
        if (!grad || !k->probs) pack_rows_of_bt(kk, seq, t, d, kt);
        if (!grad) {
            pack_rows_of_b(v, seq, t, d, W(uint16_t, vb));
        } else {
            pack_rows_of_bt(v, seq, t, d, W(uint16_t, vt));
            pack_rows_of_b(kk, seq, t, d, W(uint16_t, kb));
            /* dK^T and dV^T add up over the blocks and the group's queries */
            memset(W(float, dkt), 0, (size_t)(d * t) * sizeof(float));
            memset(W(float, dvt), 0, (size_t)(d * t) * sizeof(float));
        }
        for (int64_t g = 0; g < G; g++) {
            const uint16_t *q = (const uint16_t *)k->qkv + oq0 + g * k->part;
            int64_t oo = oo0 + g * k->out_group;
            float *keep = mw__attn_kept(k, s, g);
            for (int64_t i0 = 0; i0 < t; i0 += k->block) {
                int64_t m = t - i0 < k->block ? t - i0 : k->block;
                int64_t kend = k->causal ? i0 + m : t;
                /* the keys' limit of a product over them (causal: row r sees keys to i0 + r) */
                int64_t keys_hi = k->causal ? i0 : ALL;
                float *p = keep ? keep : sbuf;
                if (keep) keep += m * kend;
                copy_rows(m, d, q + i0 * seq, seq, q16);
                if (!grad || !keep) { /* S = scale Q_b K^T, then P */
                    dprod x = prod_of(q16, EVEN(d), kt, dpairs, p, kend, k->scale, 0);
                    dproduct(&x, m, kend, d, -ALL, ALL, keys_hi);
                    for (int64_t r = 0; r < m; r++)
                        softmax_row(p + r * kend, k->causal ? i0 + r + 1 : kend, kend, grad || keep,
                                    p16 + r * EVEN(kend));
                } else {
                    narrow_rows(m, kend, p, kend, p16);
                }
                if (!grad) { /* O_b = P V */
                    int bf16 = k->out_dtype == MW_BF16;
                    float *o = bf16 ? W(float, o32) : (float *)k->out + oo + i0 * k->seq_out;
                    dprod x = prod_of(p16, EVEN(kend), W(uint16_t, vb), tpairs, o,
                                      bf16 ? d : k->seq_out, 1.0f, 0);
                    dproduct(&x, m, d, kend, -ALL, keys_hi, ALL);
                    if (bf16)
                        for (int64_t r = 0; r < m; r++)
                            mw__bf16_narrow(d, o + r * d,
                                            (uint16_t *)k->out + oo + (i0 + r) * k->seq_out);
                    continue;
                }
                float *dp = W(float, dp);
                uint16_t *do16 = W(uint16_t, do16), *ds16 = W(uint16_t, ds16);
                narrow_rows(m, d, k->gy + oo + i0 * k->seq_out, k->seq_out, do16);
                /* dP = dO_b V^T */
                dprod x = prod_of(do16, EVEN(d), W(uint16_t, vt), dpairs, dp, kend, 1.0f, 0);
                dproduct(&x, m, kend, d, -ALL, ALL, keys_hi);
                /* dS = scale P (dP - D), D = rowsum(P dP), rounded to bf16 */
                for (int64_t r = 0; r < m; r++) {
                    const float *pr = p + r * kend, *dr = dp + r * kend;
                    int64_t n = k->causal ? i0 + r + 1 : kend;
                    __m512 dsum = _mm512_set1_ps(mw__row_dot(pr, dr, n));
                    __m512 scale = _mm512_set1_ps(k->scale);
                    uint16_t *out = ds16 + r * EVEN(kend);
                    for (int64_t j = 0; j < EVEN(kend); j += 32) { /* 0 past n, the pad included */
                        __mmask16 k0 = lanes(n - j), k1 = lanes(n - j - 16);
                        __m512 a =
                            _mm512_mul_ps(_mm512_mul_ps(scale, _mm512_maskz_loadu_ps(k0, pr + j)),
                                          _mm512_sub_ps(_mm512_maskz_loadu_ps(k0, dr + j), dsum));
                        __m512 b = _mm512_mul_ps(
                            _mm512_mul_ps(scale, _mm512_maskz_loadu_ps(k1, pr + j + 16)),
                            _mm512_sub_ps(_mm512_maskz_loadu_ps(k1, dr + j + 16), dsum));
                        a = _mm512_maskz_mov_ps(k0, a), b = _mm512_maskz_mov_ps(k1, b);
                        __m512i h = (__m512i)_mm512_cvtne2ps_pbh(b, a);
                        int64_t left = EVEN(kend) - j;
                        _mm512_mask_storeu_epi16(
                            out + j, left >= 32 ? 0xffffffffu : (__mmask32)((1u << left) - 1), h);
                    }
                }
                /* dQ_b = dS K */
                x = prod_of(ds16, EVEN(kend), W(uint16_t, kb), tpairs,
                            (float *)k->out + oq0 + g * k->part + i0 * seq, seq, 1.0f, 0);
                dproduct(&x, m, d, kend, -ALL, keys_hi, ALL);
                /* dK^T += Q_b^T dS, dV^T += dO_b^T P: key column j meets the block's queries
                 * from j - i0 on (causal) */
                pack_rows_of_b(q16, EVEN(d), m, d, W(uint16_t, qt16));
                pack_rows_of_b(do16, EVEN(d), m, d, W(uint16_t, dot16));
                pack_rows_of_b(ds16, EVEN(kend), m, kend, W(uint16_t, dsb));
                pack_rows_of_b(p16, EVEN(kend), m, kend, W(uint16_t, pb));
                x = prod_of_packed(W(uint16_t, qt16), m, W(uint16_t, dsb), EVEN(m) / 2,
                                   W(float, dkt), t, 1.0f, 1);
                x.col_lo = k->causal ? -i0 : -ALL;
                dproduct(&x, d, kend, m, -ALL, ALL, ALL);
                x.a = W(uint16_t, dot16), x.b = W(uint16_t, pb), x.c = W(float, dvt);
                dproduct(&x, d, kend, m, -ALL, ALL, ALL);
            }
        }
        if (!grad) continue;
        /* dK and dV into d(qkv), rows of the keys */
        float *dk = (float *)k->out + oq0 + G * k->part, *dv = dk + k->part;
        transpose_out(d, t, W(float, dkt), dk, seq);
        transpose_out(d, t, W(float, dvt), dv, seq);
    }
#undef W
    return MW_OK;
}

#pragma GCC pop_options

#else
/* Compiled at the AVX-512 level only. */
typedef int mw__cpu_attention_dp_unused;
#endif
