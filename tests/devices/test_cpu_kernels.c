/* The CPU kernels' fast paths called directly, on shapes chosen to reach every branch (blocks,
 * strips and their tails), against plain loops written out here. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "devices/cpu/cpu.h"
#include "devices/device.h"
#include "tests/common/rng.h"

/* out[j] = alpha * sum over r of a[r * lda + j] through the reduce kernel, nd as the planner
 * gives a column sum: [rows, n] with out's stride 0 along the rows. */
static void column_sums(int64_t rows, int64_t n, int64_t lda, float alpha, const float *a,
                        float *out) {
    mw__k_reduce k = mw__column_sums(rows, n, lda, alpha, out, a);
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
        rng_fill(a, rows * lda, 3 + s);
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

/* Attention over [Batch, Seq, Part, Head, HeadDim] as the planner lowers it: three blocks of
 * queries (64, 64, 22), with probs kept (probs != NULL) or not. */
typedef struct attn_case {
    int64_t b, t, h, d;
    int causal;
} attn_case;

static mw__k_attention attn_kernel(attn_case c, int grad, float *scratch) {
    mw__k_attention k = {.causal = c.causal,
                         .scale = 0.3f,
                         .t = c.t,
                         .d = c.d,
                         .seq_qkv = 3 * c.h * c.d,
                         .seq_out = c.h * c.d,
                         .part = c.h * c.d,
                         .slices = c.b * c.h,
                         .block = c.t < MW__ATTN_BLOCK ? c.t : MW__ATTN_BLOCK,
                         .scratch = scratch};
    k.walk.rank = 2;
    k.walk.dims[0] = c.b;
    k.walk.dims[1] = c.h;
    k.walk.stride[0][0] = c.t * c.h * c.d;
    k.walk.stride[0][1] = c.d;
    k.walk.stride[1][0] = c.t * 3 * c.h * c.d;
    k.walk.stride[1][1] = c.d;
    k.scratch_elems =
        grad ? 2 * k.block * k.t + 2 * k.slices * k.t + 3 * k.d * k.t + 2 * k.block * k.d
             : k.block * k.t + 2 * k.d * k.t;
    return k;
}

Test(cpu_kernels, attention_kept_probabilities_same_bits) {
    /* The backward reading the forward's kept probabilities gives the bits of the one that
     * recomputes them; the kept rows are the softmax rows, block after block, as long as the
     * keys each block may see, and 0 past a row's last visible key. */
    for (int causal = 0; causal < 2; causal++) {
        attn_case c = {2, 150, 2, 16, causal};
        int64_t nq = c.b * c.t * 3 * c.h * c.d, no = c.b * c.t * c.h * c.d;
        int64_t per = mw__attn_probs_per_slice(c.t, MW__ATTN_BLOCK, causal);
        cr_assert_eq(per, causal ? 64 * 64 + 64 * 128 + 22 * 150 : 150 * 150);
        float *qkv = malloc(sizeof(float) * (size_t)nq), *gy = malloc(sizeof(float) * (size_t)no);
        float *out[2], *dqkv[2], *probs = malloc(sizeof(float) * (size_t)(c.b * c.h * per));
        rng_fill(qkv, nq, 11);
        rng_fill(gy, no, 12);
        for (int keep = 0; keep < 2; keep++) {
            mw__k_attention f = attn_kernel(c, 0, NULL), g = attn_kernel(c, 1, NULL);
            float *sf = malloc(sizeof(float) * (size_t)f.scratch_elems);
            float *sg = malloc(sizeof(float) * (size_t)g.scratch_elems);
            out[keep] = malloc(sizeof(float) * (size_t)no);
            dqkv[keep] = malloc(sizeof(float) * (size_t)nq);
            f.scratch = sf, g.scratch = sg;
            f.qkv = g.qkv = qkv;
            f.out = out[keep];
            g.out = dqkv[keep];
            g.gy = gy;
            f.probs = g.probs = keep ? probs : NULL;
            cr_assert_eq(mw__cpu_device.attention(NULL, &f), MW_OK);
            memset(sg, 0xff, sizeof(float) * (size_t)g.scratch_elems); /* NaN: nothing read */
            cr_assert_eq(mw__cpu_device.attention_grad(NULL, &g), MW_OK);
            free(sf);
            free(sg);
        }
        cr_assert_eq(memcmp(out[0], out[1], sizeof(float) * (size_t)no), 0, "causal %d", causal);
        cr_assert_eq(memcmp(dqkv[0], dqkv[1], sizeof(float) * (size_t)nq), 0, "causal %d", causal);
        for (int64_t s = 0; s < c.b * c.h; s++) {
            const float *p = probs + s * per;
            for (int64_t i0 = 0; i0 < c.t; i0 += MW__ATTN_BLOCK) {
                int64_t m = c.t - i0 < MW__ATTN_BLOCK ? c.t - i0 : MW__ATTN_BLOCK;
                int64_t kend = causal ? i0 + m : c.t;
                for (int64_t r = 0; r < m; r++, p += kend) {
                    int64_t seen = causal ? i0 + r + 1 : c.t;
                    double sum = 0.0;
                    for (int64_t j = 0; j < kend; j++) {
                        if (j >= seen) cr_assert_eq(p[j], 0.0f, "masked key %lld", (long long)j);
                        cr_assert(p[j] >= 0.0f && p[j] <= 1.0f);
                        sum += p[j];
                    }
                    cr_assert(fabs(sum - 1.0) < 1e-5, "slice %lld row %lld: sum %.9g", (long long)s,
                              (long long)(i0 + r), sum);
                }
            }
            cr_assert_eq(p, probs + (s + 1) * per);
        }
        for (int keep = 0; keep < 2; keep++) {
            free(out[keep]);
            free(dqkv[keep]);
        }
        free(qkv);
        free(gy);
        free(probs);
    }
}

Test(cpu_kernels, layernorm_gradients_in_one_pass_same_bits) {
    /* The dx kernel given dw and db writes the bits of the dx and dw kernels and of the column
     * sums of gy, on widths below, at and past a vector, over rows that start anywhere; given an
     * addend, the bits of adding it to dx. */
    static const int64_t shapes[][2] = {{1, 7}, {37, 8}, {300, 257}, {64, 256}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t rows = shapes[s][0], n = shapes[s][1], len = rows * n;
        float *x = malloc(sizeof(float) * (size_t)len), *gy = malloc(sizeof(float) * (size_t)len);
        float *w = malloc(sizeof(float) * (size_t)n), *f[6];
        for (int i = 0; i < 6; i++) f[i] = malloc(sizeof(float) * (size_t)(i < 2 ? len : n));
        rng_fill(x, len, 21 + s);
        rng_fill(gy, len, 22 + s);
        rng_fill(w, n, 23 + s);
        mw__k_layernorm_grad d = {
            .rows = rows, .n = n, .eps = 1e-5f, .out = f[0], .gy = gy, .x = x, .w = w};
        cr_assert_eq(mw__cpu_device.layernorm_dx(NULL, &d), MW_OK);
        d.out = f[2];
        d.w = NULL;
        cr_assert_eq(mw__cpu_device.layernorm_dw(NULL, &d), MW_OK);
        column_sums(rows, n, n, 1.0f, gy, f[3]);
        memset(f[4], 0xff, sizeof(float) * (size_t)n); /* NaN: written, not added to */
        memset(f[5], 0xff, sizeof(float) * (size_t)n);
        d.out = f[1];
        d.w = w;
        d.dw = f[4];
        d.db = f[5];
        cr_assert_eq(mw__cpu_device.layernorm_dx(NULL, &d), MW_OK);
        cr_assert_eq(memcmp(f[1], f[0], sizeof(float) * (size_t)len), 0, "dx, shape %zu", s);
        cr_assert_eq(memcmp(f[4], f[2], sizeof(float) * (size_t)n), 0, "dw, shape %zu", s);
        cr_assert_eq(memcmp(f[5], f[3], sizeof(float) * (size_t)n), 0, "db, shape %zu", s);
        /* With an addend (a residual gradient folded in): addend + dx, rounded as the ADD. */
        float *ad = malloc(sizeof(float) * (size_t)len),
              *want = malloc(sizeof(float) * (size_t)len);
        rng_fill(ad, len, 24 + s);
        for (int64_t i = 0; i < len; i++) want[i] = ad[i] + f[0][i];
        for (int fused = 0; fused < 2; fused++) {
            d.dw = fused ? f[4] : NULL;
            d.db = fused ? f[5] : NULL;
            d.addend = ad;
            cr_assert_eq(mw__cpu_device.layernorm_dx(NULL, &d), MW_OK);
            cr_assert_eq(memcmp(f[1], want, sizeof(float) * (size_t)len), 0,
                         "dx + addend, shape %zu, dw and db %d", s, fused);
        }
        free(ad);
        free(want);
        for (int i = 0; i < 6; i++) free(f[i]);
        free(x);
        free(gy);
        free(w);
    }
}

Test(cpu_kernels, gelu_gradient_with_column_sums_same_bits) {
    /* The GELU gradient given colsum writes the bits it writes without, and the column sums the
     * reduce kernel gives for them: rows narrower than a vector, with a vector tail, and wide. */
    static const int64_t shapes[][2] = {{1, 5}, {3, 8}, {37, 13}, {64, 1024}, {9, 1031}};
    for (size_t j = 0; j < 2 * sizeof shapes / sizeof *shapes; j++) {
        size_t s = j / 2; /* each shape in the tanh form, then exact */
        mw__unop op = j % 2 ? MW__UN_GELU_ERF : MW__UN_GELU;
        int64_t rows = shapes[s][0], cols = shapes[s][1], len = rows * cols;
        float *x = malloc(sizeof(float) * (size_t)len), *gy = malloc(sizeof(float) * (size_t)len);
        float *out[2], *sums[2];
        rng_fill(x, len, 31 + s);
        rng_fill(gy, len, 32 + s);
        for (int i = 0; i < 2; i++) {
            out[i] = malloc(sizeof(float) * (size_t)len);
            sums[i] = malloc(sizeof(float) * (size_t)cols);
            memset(sums[i], 0xff, sizeof(float) * (size_t)cols); /* NaN: written, not added to */
        }
        mw__k_unary_grad k = {.op = op, .count = len, .out = out[0], .gy = gy, .x = x};
        cr_assert_eq(mw__cpu_device.unary_grad(NULL, &k), MW_OK);
        column_sums(rows, cols, cols, 1.0f, out[0], sums[0]);
        k.out = out[1];
        k.cols = cols;
        k.colsum = sums[1];
        cr_assert_eq(mw__cpu_device.unary_grad(NULL, &k), MW_OK);
        cr_assert_eq(memcmp(out[1], out[0], sizeof(float) * (size_t)len), 0, "shape %zu", s);
        cr_assert_eq(memcmp(sums[1], sums[0], sizeof(float) * (size_t)cols), 0, "shape %zu", s);
        for (int i = 0; i < 2; i++) {
            free(out[i]);
            free(sums[i]);
        }
        free(x);
        free(gy);
    }
}

Test(cpu_kernels, softmax_rows_of_every_length_match_double) {
    /* Rows of every length from 1 to 70 (no vector, one, two and the tails between: the vector
     * loops take 16 and 32 at a time, the tail through masks where the CPU has AVX-512) and 255,
     * 256: each element within 2e-6 relative of the softmax in double, and nothing written past
     * the row. */
    float a[260], y[260];
    double e[260];
    for (int64_t n = 1; n <= 256; n = n == 70 ? 255 : n + 1) {
        rng_fill(a, n, 500 + n);
        for (int64_t j = 0; j < n; j++) a[j] *= 8.0f;
        for (int64_t j = n; j < 260; j++) y[j] = -7.0f;
        const float scale = 0.75f;
        mw__k_softmax k = {.outer = 1, .s = 1, .k = n, .scale = scale, .out = y, .a = a};
        cr_assert_eq(mw__cpu_device.softmax(NULL, &k), MW_OK);
        double mx = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < n; j++) mx = fmax(mx, (double)scale * a[j]);
        for (int64_t j = 0; j < n; j++) sum += e[j] = exp((double)scale * a[j] - mx);
        for (int64_t j = 0; j < n; j++)
            cr_assert(fabs(y[j] - e[j] / sum) <= 2e-6 * (e[j] / sum) + 1e-30,
                      "n %lld, element %lld: %.9g against %.9g", (long long)n, (long long)j, y[j],
                      e[j] / sum);
        for (int64_t j = n; j < 260; j++)
            cr_assert_eq(y[j], -7.0f, "n %lld: past the row", (long long)n);
    }
}

Test(cpu_kernels, softmax_rows_with_nonfinite_values) {
    /* A NaN anywhere in a row (in a whole vector or in the tail) makes every output NaN; a -Inf
     * entry gets next to nothing (the exponential's input is clamped at -87, where e^x is
     * 1.6e-38) and the others share the mass. */
    float a[41], y[41];
    for (int64_t n = 2; n <= 41; n += 3) /* one -Inf alone would be a row of -Inf: NaN */
        for (int64_t at = 0; at < n; at += 5) {
            for (int64_t j = 0; j < n; j++) a[j] = (float)(j % 7) * 0.25f;
            a[at] = NAN;
            mw__k_softmax k = {.outer = 1, .s = 1, .k = n, .scale = 1.0f, .out = y, .a = a};
            cr_assert_eq(mw__cpu_device.softmax(NULL, &k), MW_OK);
            for (int64_t j = 0; j < n; j++)
                cr_assert(isnan(y[j]), "n %lld, NaN at %lld: element %lld is %g", (long long)n,
                          (long long)at, (long long)j, y[j]);
            for (int64_t j = 0; j < n; j++) a[j] = 2.0f;
            a[at] = -INFINITY;
            cr_assert_eq(mw__cpu_device.softmax(NULL, &k), MW_OK);
            for (int64_t j = 0; j < n; j++) {
                if (j == at)
                    cr_assert(y[j] >= 0.0f && y[j] < 1e-37f, "n %lld: -Inf gives %g", (long long)n,
                              y[j]);
                else
                    cr_assert_float_eq(y[j], 1.0f / (float)(n - 1), 1e-6);
            }
        }
}

Test(cpu_kernels, layernorm_rows_of_every_length_match_double) {
    /* Widths from 1 to 70 and 255, 256, 257 (the double sums take 16 and 32 a turn, the rest
     * apart), rows offset from their mean so that a one-pass variance would lose digits: y
     * within 1e-5 of the layer norm in double, and dx within 1e-4 relative to its largest
     * element, plus what the float mean's rounding (half an ulp of x) and gy w's become through
     * rstd (at width 1, where dx is 0, that is all there is; at width 2, xh is +-1 and dx is
     * all cancellation). */
    enum { ROWS = 3, N = 260 };
    float x[ROWS * N], gy[ROWS * N], w[N], b[N], y[ROWS * N], dx[ROWS * N];
    for (int64_t n = 1; n <= 257; n = n == 70 ? 255 : n + 1) {
        rng_fill(x, ROWS * n, 700 + n);
        rng_fill(gy, ROWS * n, 800 + n);
        rng_fill(w, n, 900 + n);
        rng_fill(b, n, 950 + n);
        for (int64_t i = 0; i < ROWS * n; i++) x[i] += 3.0f;
        mw__k_layernorm f = {.rows = ROWS,
                             .n = n,
                             .eps = 1e-5f,
                             .out_dtype = MW_F32,
                             .out = y,
                             .x = x,
                             .w = w,
                             .b = b};
        cr_assert_eq(mw__cpu_device.layernorm(NULL, &f), MW_OK);
        mw__k_layernorm_grad d = {
            .rows = ROWS, .n = n, .eps = 1e-5f, .out = dx, .gy = gy, .x = x, .w = w};
        cr_assert_eq(mw__cpu_device.layernorm_dx(NULL, &d), MW_OK);
        for (int64_t r = 0; r < ROWS; r++) {
            const float *xr = x + r * n, *gr = gy + r * n;
            double mean = 0.0, var = 0.0, m1 = 0.0, m2 = 0.0, big = 0.0, dmax = 0.0, want[N];
            for (int64_t j = 0; j < n; j++) mean += xr[j];
            mean /= (double)n;
            for (int64_t j = 0; j < n; j++) var += (xr[j] - mean) * (xr[j] - mean);
            double rstd = 1.0 / sqrt(var / (double)n + 1e-5);
            for (int64_t j = 0; j < n; j++) {
                double xh = (xr[j] - mean) * rstd, dh = (double)gr[j] * w[j];
                cr_assert(fabs(y[r * n + j] - (xh * w[j] + b[j])) <= 1e-5 * (1.0 + fabs(xh)),
                          "n %lld row %lld element %lld: y %.9g against %.9g", (long long)n,
                          (long long)r, (long long)j, y[r * n + j], xh * w[j] + b[j]);
                m1 += dh;
                m2 += dh * xh;
                dmax = fmax(dmax, fabs(dh));
            }
            for (int64_t j = 0; j < n; j++) {
                double xh = (xr[j] - mean) * rstd;
                want[j] = rstd * ((double)gr[j] * w[j] - m1 / (double)n - xh * m2 / (double)n);
                big = fmax(big, fabs(want[j]));
            }
            for (int64_t j = 0; j < n; j++)
                cr_assert(fabs(dx[r * n + j] - want[j]) <=
                              1e-4 * big + 1e-6 * rstd * dmax * (1.0 + rstd),
                          "n %lld row %lld element %lld: dx %.9g against %.9g", (long long)n,
                          (long long)r, (long long)j, dx[r * n + j], want[j]);
        }
    }
}
