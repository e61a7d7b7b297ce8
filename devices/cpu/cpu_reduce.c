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
MW__CPU_CLONES
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

mw_status mw__cpu_reduce(mw__device *dev, const mw__k_reduce *k) {
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
