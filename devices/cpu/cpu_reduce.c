/* CPU kernels of the reductions: sums over any set of dims (reduce), the sum of squares (sumsq),
 * the maximum and its position along one axis (reduce_max, argmax). Every sum is taken in an
 * order fixed by the sizes alone, so results repeat bit for bit. */
#include <string.h>

#include "devices/cpu/cpu_kernels.h"
#include "devices/cpu/rows.h"
#include "devices/cpu/simd.h"
#include "devices/device.h"
#include "devices/math.h"

/* Sum of a row in a fixed order: eight interleaved partial sums, then combined pairwise. The
 * order depends only on n, so results are repeatable. */
static float sum_row(int64_t n, const float *restrict a, int64_t sa) {
    if (sa != 1) {
        float s = 0.0f;
        for (int64_t i = 0; i < n; i++) s += a[i * sa];
        return s;
    }
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += a[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

#define COLSUM_ROWS 32 /* rows per pass: 32 rows of up to 1024 floats stay in the L2 cache */
#define COLSUM_VECS 8  /* a strip of 64 columns, summed in registers */

/* out[j] += a[r * lda + j] for r < rows, j < n, each column summed over the rows in order (the
 * order of the row-by-row loop, so the bits are the same). The rows are taken COLSUM_ROWS at a
 * time and, within them, a strip of columns stays in registers over all the rows: out is loaded
 * and stored once per strip and pass instead of once per row. */
static void column_sums(int64_t rows, int64_t n, int64_t lda, const float *restrict a,
                        float *restrict out) {
    for (int64_t r0 = 0; r0 < rows; r0 += COLSUM_ROWS) {
        int64_t r1 = rows - r0 < COLSUM_ROWS ? rows : r0 + COLSUM_ROWS, j = 0;
        for (; j + 8 * COLSUM_VECS <= n; j += 8 * COLSUM_VECS) {
            mw__v8 acc[COLSUM_VECS], v;
            memcpy(acc, out + j, sizeof acc);
            for (int64_t r = r0; r < r1; r++)
                for (int h = 0; h < COLSUM_VECS; h++) {
                    memcpy(&v, a + r * lda + j + 8 * h, sizeof v);
                    acc[h] += v;
                }
            memcpy(out + j, acc, sizeof acc);
        }
        for (; j + 8 <= n; j += 8) {
            mw__v8 acc, v;
            memcpy(&acc, out + j, sizeof acc);
            for (int64_t r = r0; r < r1; r++) {
                memcpy(&v, a + r * lda + j, sizeof v);
                acc += v;
            }
            memcpy(out + j, &acc, sizeof acc);
        }
        for (; j < n; j++)
            for (int64_t r = r0; r < r1; r++) out[j] += a[r * lda + j];
    }
}

mw_status MW__CPU(mw__cpu_reduce)(mw__device *dev, const mw__k_reduce *k) {
    (void)dev;
    const mw__nd *nd = &k->nd;
    memset(k->out, 0, (size_t)k->out_count * sizeof *k->out);
    if (nd->rank == 0) {
        k->out[0] = k->a[0];
    } else {
        int l = nd->rank - 1;
        int64_t n = nd->dims[l], so = nd->stride[0][l], sa = nd->stride[1][l];
        if (nd->rank == 2 && so == 1 && sa == 1 && nd->stride[0][0] == 0)
            column_sums(nd->dims[0], n, nd->stride[1][0], k->a, k->out);
        else
            MW__ND_ROWS(nd, 2, {
                float *restrict out = k->out + o0;
                const float *restrict a = k->a + o1;
                if (so == 0)
                    out[0] += sum_row(n, a, sa);
                else if (so == 1 && sa == 1)
                    for (int64_t i = 0; i < n; i++) out[i] += a[i];
                else
                    for (int64_t i = 0; i < n; i++) out[i * so] += a[i * sa];
            });
    }
    if (k->alpha != 1.0f)
        for (int64_t i = 0; i < k->out_count; i++) k->out[i] *= k->alpha;
    return MW_OK;
}

/* The exact sum of squares, in blocks of SQ_BLOCK values: each square r (exact in double) is cut
 * at the fixed boundaries q_k = 2^(SQ_WIDTH k) into parts t_k, multiples of q_k below
 * 2^SQ_WIDTH q_k in magnitude, by t_k = (r + C_k) - C_k with C_k = 1.5 2^52 q_k (r rounded to a
 * multiple of q_k, exact while |r| < 2^51 q_k), and r -= t_k: from the chunk of the block's
 * largest square down until every remainder is 0 (at the latest at q_k = 2^-320, as squares are
 * multiples of 2^-298). The block's parts of chunk k add up exactly in double (SQ_BLOCK integers
 * below 2^SQ_WIDTH units) and go into the accumulator as an integer. Every step is exact, so the
 * accumulator gets the exact sum, as the GPU's integer bins and mw__sqacc_add_square do: plain
 * double arithmetic on whole vectors, no per-element branch or index. */
#define SQ_BLOCK 2048
#define SQ_WIDTH 40 /* bits per chunk: MW__SQ_UNIT is a multiple; SQ_BLOCK 2^SQ_WIDTH < 2^53 */

/* Both loops run on eight doubles at a time (vector extensions: the auto-vectoriser would not
 * split the sum into lanes without leave to reassociate; here the sums are of integers, multiples
 * of one power of two, exact in any order). */
typedef double sq_v8d __attribute__((vector_size(64)));
typedef int64_t sq_v8l __attribute__((vector_size(64)));

static int sq_chunk(double *restrict r, int64_t n, double c, double *restrict sum) {
    sq_v8d s = {0}, cv = c - (sq_v8d){0};
    sq_v8l left = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        sq_v8d x, t;
        memcpy(&x, r + i, sizeof x);
        t = (x + cv) - cv;
        s += t;
        x -= t;
        memcpy(r + i, &x, sizeof x);
        left |= x != 0.0;
    }
    double total = 0.0;
    int64_t any = 0;
    for (int l = 0; l < 8; l++) total += s[l], any |= left[l];
    for (; i < n; i++) {
        double t = (r[i] + c) - c;
        total += t;
        r[i] -= t;
        any |= r[i] != 0.0;
    }
    *sum = total;
    return any != 0;
}

static double sq_squares(const float *restrict a, int64_t n, double *restrict r,
                         uint32_t *special) {
    sq_v8d top = {0};
    mw__v8u sp = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        mw__v8 f;
        mw__v8u b;
        memcpy(&f, a + i, sizeof f);
        memcpy(&b, a + i, sizeof b);
        sp |= (mw__v8u)((b & 0x7f800000u) == 0x7f800000u);
        sq_v8d x = __builtin_convertvector(f, sq_v8d);
        x *= x;
        memcpy(r + i, &x, sizeof x);
        sq_v8l more = x > top, xb, tb;
        memcpy(&xb, &x, sizeof xb);
        memcpy(&tb, &top, sizeof tb);
        tb = (xb & more) | (tb & ~more);
        memcpy(&top, &tb, sizeof top);
    }
    double m = 0.0;
    uint32_t any = 0;
    for (int l = 0; l < 8; l++) m = top[l] > m ? top[l] : m, any |= sp[l];
    for (; i < n; i++) {
        uint32_t b;
        memcpy(&b, &a[i], sizeof b);
        any |= (b & 0x7f800000u) == 0x7f800000u;
        r[i] = (double)a[i] * (double)a[i];
        m = r[i] > m ? r[i] : m;
    }
    *special = any;
    return m;
}

mw_status MW__CPU(mw__cpu_sumsq)(mw__device *dev, const mw__k_sumsq *k) {
    (void)dev;
    mw__sqacc *acc = k->out;
    if (k->zero) memset(acc, 0, sizeof *acc);
    double r[SQ_BLOCK];
    for (int64_t at = 0; at < k->count; at += SQ_BLOCK) {
        int64_t n = k->count - at < SQ_BLOCK ? k->count - at : SQ_BLOCK;
        uint32_t special;
        double top = sq_squares(k->a + at, n, r, &special);
        if (special) { /* rare: count the NaNs and infinities, and leave them out */
            top = 0.0;
            for (int64_t i = 0; i < n; i++) {
                float x = k->a[at + i];
                if (isnan(x) || isinf(x)) {
                    mw__sqacc_add_square(acc, x);
                    r[i] = 0.0;
                }
                top = r[i] > top ? r[i] : top;
            }
        }
        if (top == 0.0) continue;
        int e = ilogb(top), chunk = (e >= 0 ? e : e - (SQ_WIDTH - 1)) / SQ_WIDTH; /* floor */
        for (; chunk >= -MW__SQ_UNIT / SQ_WIDTH; chunk--) {
            double q = ldexp(1.0, SQ_WIDTH * chunk), sum;
            int left = sq_chunk(r, n, 0x1.8p52 * q, &sum);
            if (sum != 0.0)
                mw__sqacc_add_shifted(acc, (int64_t)(sum / q),
                                      (unsigned)(SQ_WIDTH * chunk + MW__SQ_UNIT));
            if (!left) break;
        }
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

mw_status MW__CPU(mw__cpu_argmax)(mw__device *dev, const mw__k_max *k) {
    (void)dev;
    reduce_max(k, 1);
    return MW_OK;
}

mw_status MW__CPU(mw__cpu_reduce_max)(mw__device *dev, const mw__k_max *k) {
    (void)dev;
    reduce_max(k, 0);
    return MW_OK;
}
