/* The CPU kernels' fast paths called directly, on shapes chosen to reach every branch (blocks,
 * strips and their tails), against plain loops written out here. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "devices/device.h"

/* Deterministic values in [-1, 1). */
static void fill(float *x, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(seed >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
    }
}

/* out[j] = alpha * sum over r of a[r * lda + j] through the reduce kernel, nd as the planner
 * gives a column sum: [rows, n] with out's stride 0 along the rows. */
static void column_sums(int64_t rows, int64_t n, int64_t lda, float alpha, const float *a,
                        float *out) {
    mw__k_reduce k = {.alpha = alpha, .out_count = n, .out = out, .a = a};
    k.nd.rank = 2;
    k.nd.dims[0] = rows;
    k.nd.dims[1] = n;
    k.nd.stride[0][1] = 1;
    k.nd.stride[1][0] = lda;
    k.nd.stride[1][1] = 1;
    cr_assert_eq(mw__cpu_device.reduce(NULL, &k), MW_OK);
}

Test(cpu_kernels, column_sums_in_row_order) {
    /* The kernel documents its order (row after row, per column), so a float loop in that order
     * gives the same bits. Shapes: fewer rows than one pass (32) and a partial last pass, widths
     * below one vector, between a vector and a strip (64), past a strip with a vector and a
     * scalar tail, and rows wider than the sum (lda > n). */
    static const int64_t shapes[][3] = {{1, 1, 1},    {5, 7, 7},      {31, 77, 77},
                                        {33, 64, 64}, {45, 130, 131}, {100, 1033, 1040},
                                        {64, 8, 24},  {97, 200, 256}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t rows = shapes[s][0], n = shapes[s][1], lda = shapes[s][2];
        float *a = malloc(sizeof(float) * (size_t)(rows * lda));
        float *got = malloc(sizeof(float) * (size_t)n), *want = malloc(sizeof(float) * (size_t)n);
        fill(a, rows * lda, 3 + s);
        for (int i = 0; i < 2; i++) {
            float alpha = i ? 0.5f : 1.0f;
            for (int64_t j = 0; j < n; j++) {
                float acc = 0.0f;
                for (int64_t r = 0; r < rows; r++) acc += a[r * lda + j];
                want[j] = alpha * acc;
            }
            memset(got, 0xff, sizeof(float) * (size_t)n); /* NaN: out is written, not added to */
            column_sums(rows, n, lda, alpha, a, got);
            for (int64_t j = 0; j < n; j++)
                cr_assert_eq(
                    got[j], want[j], "rows %lld, n %lld, lda %lld: out[%lld] = %.9g, want %.9g",
                    (long long)rows, (long long)n, (long long)lda, (long long)j, got[j], want[j]);
        }
        free(a);
        free(got);
        free(want);
    }
}
