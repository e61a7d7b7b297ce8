/* The CUDA backend's bf16 kernels (suite gpu): conversions bit for bit with the CPU's rounding,
 * every bf16-writing kernel as the rounding of its own f32 result, attention of bf16 q, k, v as
 * the f32 kernel on the widened values, the bf16 GEMMs on tensor cores against float64, and the
 * optimizers' bf16 copies. Skipped without a GPU (failed with MESHWIT_REQUIRE_GPU=1). */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devices/device.h"
#include "devices/math.h"
#include "tests/common/rng.h"

#ifdef MESHWIT_HAVE_CUDA

#include "devices/cpu/cpu.h"
#include "devices/cuda/cuda.h"
#include "gpu_test.h"

static mw__device dev;
static void *bufs[64];
static int nbufs;

static void start(void) {
    need_gpu();
    memset(&dev, 0, sizeof dev);
    dev.vt = &mw__cuda_device;
    snprintf(dev.name, sizeof dev.name, "cuda:0");
    OK(dev.vt->init(&dev));
}

static void finish(void) {
    for (int i = 0; i < nbufs; i++) dev.vt->free(&dev, bufs[i]);
    nbufs = 0;
    if (dev.impl) dev.vt->shutdown(&dev);
}

TestSuite(gpu_bf16, .fini = finish);

static void *up(const void *host, size_t bytes) {
    void *d = NULL;
    OK(dev.vt->alloc(&dev, bytes ? bytes : 4, &d));
    bufs[nbufs++] = d;
    if (bytes) OK(dev.vt->upload(&dev, d, host, bytes));
    return d;
}

static void down(void *host, const void *d, size_t bytes) {
    OK(dev.vt->sync(&dev));
    OK(dev.vt->download(&dev, host, d, bytes));
}

static uint64_t seed = 12345;
static float *randoms(int64_t n, float scale) {
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    rng_fill_stream(&seed, x, n);
    for (int64_t i = 0; i < n; i++) x[i] *= scale;
    return x;
}

static void expect_rounded(const uint16_t *got, const float *f32, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(got[i], mw__bf16_from_f32(f32[i]), "%s[%lld]: 0x%04x, f32 %.9g", what,
                     (long long)i, got[i], f32[i]);
}

Test(gpu_bf16, conversions_round_as_the_cpu) {
    start();
    enum { N = 100003 };
    float *x = randoms(N, 3.0f), *back = malloc(N * 4);
    x[0] = NAN, x[1] = INFINITY, x[2] = 1e-40f, x[3] = -0.0f, x[4] = 3.3895314e38f;
    uint16_t *h = malloc(N * 2);
    void *gx = up(x, N * 4), *gh = up(NULL, N * 2), *gb = up(NULL, N * 4);
    mw__k_copy k = {.alpha = 0.5f, .out_dtype = MW_BF16, .a_dtype = MW_F32, .out = gh, .a = gx};
    k.nd.rank = 1, k.nd.dims[0] = N, k.nd.stride[0][0] = k.nd.stride[1][0] = 1;
    OK(dev.vt->copy(&dev, &k));
    down(h, gh, N * 2);
    for (int64_t i = 0; i < N; i++) {
        uint16_t want = mw__bf16_from_f32(0.5f * x[i]);
        cr_assert(h[i] == want || (isnan(x[i]) && (h[i] & 0x7fff) > 0x7f80), "x[%lld] = %a: 0x%04x",
                  (long long)i, (double)x[i], h[i]);
    }
    mw__k_copy w = {.alpha = 1.0f, .out_dtype = MW_F32, .a_dtype = MW_BF16, .out = gb, .a = gh};
    w.nd = k.nd;
    OK(dev.vt->copy(&dev, &w));
    down(back, gb, N * 4);
    for (int64_t i = 5; i < N; i++) cr_assert_eq(back[i], mw__bf16_to_f32(h[i]));
    free(x), free(back), free(h);
}

Test(gpu_bf16, kernels_write_their_f32_results_rounded) {
    start();
    enum { ROWS = 37, N = 300 };
    float *x = randoms(ROWS * N, 2.0f), *gy = randoms(ROWS * N, 1.0f), *w = randoms(N, 1.0f),
          *b = randoms(N, 1.0f), *f = malloc(ROWS * N * 4), *cs32 = malloc(N * 4),
          *cs16 = malloc(N * 4);
    uint16_t *h = malloc(ROWS * N * 2);
    void *gx = up(x, ROWS * N * 4), *ggy = up(gy, ROWS * N * 4), *gw = up(w, N * 4),
         *gb = up(b, N * 4), *gf = up(NULL, ROWS * N * 4), *gh = up(NULL, ROWS * N * 2),
         *gc32 = up(NULL, N * 4), *gc16 = up(NULL, N * 4);
    for (int op = 0; op < 3; op++) {
        for (int bf16 = 0; bf16 < 2; bf16++) {
            void *out = bf16 ? gh : gf;
            mw_dtype dt = bf16 ? MW_BF16 : MW_F32;
            if (op == 0) {
                mw__k_layernorm k = {.rows = ROWS, .n = N, .eps = 1e-5f, .out_dtype = dt};
                k.out = out, k.x = gx, k.w = gw, k.b = gb;
                OK(dev.vt->layernorm(&dev, &k));
            } else if (op == 1) {
                mw__k_unary k = {.op = MW__UN_GELU, .out_dtype = dt, .count = ROWS * N};
                k.out = out, k.a = gx;
                OK(dev.vt->unary(&dev, &k));
            } else {
                mw__k_unary_grad k = {.op = MW__UN_GELU, .out_dtype = dt, .count = ROWS * N};
                k.out = out, k.gy = ggy, k.x = gx, k.cols = N, k.colsum = bf16 ? gc16 : gc32;
                OK(dev.vt->unary_grad(&dev, &k));
            }
        }
        down(f, gf, ROWS * N * 4);
        down(h, gh, ROWS * N * 2);
        expect_rounded(h, f, ROWS * N, op == 0 ? "layernorm" : op == 1 ? "gelu" : "gelu_grad");
    }
    /* The bias gradient of the bf16 GELU gradient sums the same f32 terms in row order; the f32
     * one's reduce kernel in its own order: (rows - 1) eps sum |term| apart at most. */
    down(cs32, gc32, N * 4);
    down(cs16, gc16, N * 4);
    for (int j = 0; j < N; j++) {
        double mag = 0;
        for (int r = 0; r < ROWS; r++) mag += fabs((double)f[r * N + j]);
        cr_assert(fabs(cs32[j] - cs16[j]) <= (ROWS - 1) * FLT_EPSILON * mag + 1e-30,
                  "column %d: %.9g vs %.9g", j, cs32[j], cs16[j]);
    }
    free(x), free(gy), free(w), free(b), free(f), free(cs32), free(cs16), free(h);
}

Test(gpu_bf16, attention_of_bf16_is_the_f32_kernel_on_the_widened_values) {
    start();
    enum { B = 2, T = 70, H = 2, D = 32 };
    int64_t nq = B * T * 3 * H * D, no = B * T * H * D;
    float *qkv = randoms(nq, 2.0f), *gy = randoms(no, 1.0f);
    uint16_t *h = malloc(nq * 2), *o16 = malloc(no * 2);
    for (int64_t i = 0; i < nq; i++)
        h[i] = mw__bf16_from_f32(qkv[i]), qkv[i] = mw__bf16_to_f32(h[i]);
    float *o32 = malloc(no * 4), *d32 = malloc(nq * 4), *d16 = malloc(nq * 4);
    void *gq32 = up(qkv, nq * 4), *gq16 = up(h, nq * 2), *ggy = up(gy, no * 4);
    void *go32 = up(NULL, no * 4), *go16 = up(NULL, no * 2), *gd32 = up(NULL, nq * 4),
         *gd16 = up(NULL, nq * 4);
    mw__k_attention k = {.causal = 1, .scale = 0.17f, .t = T, .d = D};
    k.seq_qkv = 3 * H * D, k.part = H * D, k.seq_out = H * D;
    k.walk.rank = 2, k.walk.dims[0] = B, k.walk.dims[1] = H;
    k.walk.stride[0][0] = T * H * D, k.walk.stride[0][1] = D;
    k.walk.stride[1][0] = T * 3 * H * D, k.walk.stride[1][1] = D;
    k.slices = B * H, k.block = T < MW__ATTN_BLOCK ? T : MW__ATTN_BLOCK;
    k.scratch_elems = 2 * k.block * T + 2 * k.slices * T + 3 * D * T + 2 * k.block * D;
    k.scratch = up(NULL, (size_t)k.scratch_elems * 4);
    k.gy = ggy;
    for (int q16 = 0; q16 < 2; q16++) {
        k.qkv_dtype = q16 ? MW_BF16 : MW_F32, k.qkv = q16 ? gq16 : gq32;
        k.out_dtype = q16 ? MW_BF16 : MW_F32, k.out = q16 ? go16 : go32;
        OK(dev.vt->attention(&dev, &k));
        k.out_dtype = MW_F32, k.out = q16 ? gd16 : gd32;
        OK(dev.vt->attention_grad(&dev, &k));
    }
    down(o32, go32, no * 4), down(o16, go16, no * 2);
    down(d32, gd32, nq * 4), down(d16, gd16, nq * 4);
    expect_rounded(o16, o32, no, "attention");
    cr_assert_eq(memcmp(d32, d16, nq * 4), 0, "d(qkv) of bf16 q, k, v differs");
    free(qkv), free(gy), free(h), free(o16), free(o32), free(d32), free(d16);
}

Test(gpu_bf16, gemm_on_tensor_cores_against_float64) {
    start();
    static const int shapes[][5] = {{128, 96, 64, 0, 1}, {37, 53, 29, 1, 0}, {256, 64, 200, 0, 0}};
    for (int s = 0; s < 3; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], ta = shapes[s][3],
            tb = shapes[s][4];
        float *a = randoms((int64_t)M * K, 1.0f), *b = randoms((int64_t)K * N, 1.0f),
              *bias = randoms(N, 1.0f), *c = malloc((size_t)M * N * 4);
        uint16_t *ah = malloc((size_t)M * K * 2), *bh = malloc((size_t)K * N * 2),
                 *ch = malloc((size_t)M * N * 2);
        for (int i = 0; i < M * K; i++)
            ah[i] = mw__bf16_from_f32(a[i]), a[i] = mw__bf16_to_f32(ah[i]);
        for (int i = 0; i < K * N; i++)
            bh[i] = mw__bf16_from_f32(b[i]), b[i] = mw__bf16_to_f32(bh[i]);
        void *ga = up(ah, (size_t)M * K * 2), *gb = up(bh, (size_t)K * N * 2),
             *gbias = up(bias, (size_t)N * 4), *gc = up(NULL, (size_t)M * N * 4),
             *gch = up(NULL, (size_t)M * N * 2);
        for (int c16 = 0; c16 < 2; c16++) {
            mw__k_gemm k = {.batch = 1, .m = M, .n = N, .k = K, .trans_a = ta, .trans_b = tb};
            k.lda = ta ? M : K, k.ldb = tb ? K : N, k.ldc = N;
            k.stride_a = (int64_t)M * K, k.stride_b = (int64_t)K * N, k.stride_c = (int64_t)M * N;
            k.ab_dtype = MW_BF16, k.c_dtype = c16 ? MW_BF16 : MW_F32;
            k.a = ga, k.b = gb, k.c = c16 ? gch : gc, k.bias = gbias;
            OK(dev.vt->gemm(&dev, &k));
        }
        down(c, gc, (size_t)M * N * 4);
        down(ch, gch, (size_t)M * N * 2);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double ref = bias[j], mag = fabs(bias[j]);
                for (int l = 0; l < K; l++) {
                    double x = ta ? a[l * M + i] : a[i * K + l],
                           y = tb ? b[j * K + l] : b[l * N + j];
                    ref += x * y;
                    mag += fabs(x * y);
                }
                /* f32 sums of exact products (tensor cores keep them exact), in any order. */
                double tol = (K + 2) * FLT_EPSILON * mag;
                cr_assert(fabs(c[i * N + j] - ref) <= tol, "f32 C[%d][%d] %.9g, want %.9g", i, j,
                          c[i * N + j], ref);
                /* bf16 C: rounded once more, and the bias rounded to bf16 first (gemm.cu). */
                double tol16 = tol + fabs(ref) * ldexp(1.0, -8) + fabs(bias[j]) * ldexp(1.0, -8);
                cr_assert(fabs(mw__bf16_to_f32(ch[i * N + j]) - ref) <= tol16,
                          "bf16 C[%d][%d] %.9g, want %.9g", i, j, mw__bf16_to_f32(ch[i * N + j]),
                          ref);
            }
        free(a), free(b), free(bias), free(c), free(ah), free(bh), free(ch);
    }
}

/* Batched bf16 GEMMs as the planner makes them for attention-free contractions over a batch
 * axis: batch > 1 with strides between the matrices (and a stride of 0, one matrix shared by the
 * batch), leading dimensions wider than the rows (a matrix inside a wider one), transposes, C in
 * f32 and bf16 with a bias, against float64 of the same bf16 operands: the bound of the test
 * above, per batch. The padding between rows and matrices must stay untouched. */
Test(gpu_bf16, batched_gemm_with_strides_and_padding_against_float64) {
    start();
    static const struct {
        int batch, m, n, k, ta, tb, pad_a, pad_b, pad_c, shared_b;
    } cases[] = {
        {3, 64, 48, 40, 0, 0, 0, 0, 0, 0}, /* plain batch */
        {4, 37, 29, 53, 1, 0, 3, 5, 7, 0}, /* padded rows, transposed A */
        {2, 50, 64, 32, 0, 1, 8, 0, 2, 1}, /* B shared by the batch (stride 0), transposed */
        {5, 16, 16, 16, 1, 1, 1, 1, 1, 0},
    };
    for (size_t s = 0; s < sizeof cases / sizeof *cases; s++) {
        int bt = cases[s].batch, M = cases[s].m, N = cases[s].n, K = cases[s].k;
        int ta = cases[s].ta, tb = cases[s].tb;
        /* Stored row-major: A is M x K (K x M transposed), B is K x N (N x K). */
        int64_t lda = (ta ? M : K) + cases[s].pad_a, ldb = (tb ? K : N) + cases[s].pad_b;
        int64_t ldc = N + cases[s].pad_c;
        int64_t rows_a = ta ? K : M, rows_b = tb ? N : K;
        int64_t sa = rows_a * lda + 11, sb = cases[s].shared_b ? 0 : rows_b * ldb + 13,
                sc = (int64_t)M * ldc + 17;
        int64_t na = sa * bt, nb = cases[s].shared_b ? rows_b * ldb : sb * bt, nc = sc * bt;
        float *a = randoms(na, 1.0f), *b = randoms(nb, 1.0f), *bias = randoms(N, 1.0f);
        uint16_t *ah = malloc((size_t)na * 2), *bh = malloc((size_t)nb * 2),
                 *ch = malloc((size_t)nc * 2), *ch0 = malloc((size_t)nc * 2);
        float *c = malloc((size_t)nc * 4), *c0 = randoms(nc, 9.0f);
        for (int64_t i = 0; i < na; i++)
            ah[i] = mw__bf16_from_f32(a[i]), a[i] = mw__bf16_to_f32(ah[i]);
        for (int64_t i = 0; i < nb; i++)
            bh[i] = mw__bf16_from_f32(b[i]), b[i] = mw__bf16_to_f32(bh[i]);
        for (int64_t i = 0; i < nc; i++) ch0[i] = mw__bf16_from_f32(c0[i]);
        void *ga = up(ah, (size_t)na * 2), *gb = up(bh, (size_t)nb * 2),
             *gbias = up(bias, (size_t)N * 4), *gc = up(c0, (size_t)nc * 4),
             *gch = up(ch0, (size_t)nc * 2);
        for (int c16 = 0; c16 < 2; c16++) {
            mw__k_gemm k = {.batch = bt, .m = M, .n = N, .k = K, .trans_a = ta, .trans_b = tb};
            k.lda = lda, k.ldb = ldb, k.ldc = ldc, k.stride_a = sa, k.stride_b = sb,
            k.stride_c = sc;
            k.ab_dtype = MW_BF16, k.c_dtype = c16 ? MW_BF16 : MW_F32;
            k.a = ga, k.b = gb, k.c = c16 ? gch : gc, k.bias = gbias;
            OK(dev.vt->gemm(&dev, &k));
        }
        down(c, gc, (size_t)nc * 4);
        down(ch, gch, (size_t)nc * 2);
        char *inside = calloc((size_t)nc, 1);
        for (int q = 0; q < bt; q++)
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double ref = bias[j], mag = fabs(bias[j]);
                    for (int l = 0; l < K; l++) {
                        double x = a[q * sa + (ta ? l * lda + i : i * lda + l)],
                               y = b[q * sb + (tb ? j * ldb + l : l * ldb + j)];
                        ref += x * y;
                        mag += fabs(x * y);
                    }
                    int64_t at = q * sc + (int64_t)i * ldc + j;
                    inside[at] = 1;
                    double tol = (K + 2) * FLT_EPSILON * mag;
                    cr_assert(fabs(c[at] - ref) <= tol,
                              "case %zu batch %d: f32 C[%d][%d] %.9g, want %.9g", s, q, i, j, c[at],
                              ref);
                    double tol16 =
                        tol + fabs(ref) * ldexp(1.0, -8) + fabs(bias[j]) * ldexp(1.0, -8);
                    cr_assert(fabs(mw__bf16_to_f32(ch[at]) - ref) <= tol16,
                              "case %zu batch %d: bf16 C[%d][%d] %.9g, want %.9g", s, q, i, j,
                              mw__bf16_to_f32(ch[at]), ref);
                }
        for (int64_t i = 0; i < nc; i++)
            if (!inside[i]) {
                cr_assert_eq(c[i], c0[i], "case %zu: f32 padding at %lld was written", s,
                             (long long)i);
                cr_assert_eq(ch[i], ch0[i], "case %zu: bf16 padding at %lld was written", s,
                             (long long)i);
            }
        free(inside);
        free(a), free(b), free(bias), free(c), free(c0), free(ah), free(bh), free(ch), free(ch0);
    }
}

/* Exact GELU (erfc) written in bf16: the rounding of its f32 result, bit for bit, and within half
 * a bf16 ulp plus the f32 result's bound of float64 (as in tests/gpu/test_gpu.c's float64 test). */
Test(gpu_bf16, exact_gelu_in_bf16) {
    start();
    enum { N = 100003 };
    float *x = randoms(N, 6.0f), *f = malloc(N * 4);
    uint16_t *h = malloc(N * 2);
    void *gx = up(x, N * 4), *gf = up(NULL, N * 4), *gh = up(NULL, N * 2);
    mw__k_unary k = {.op = MW__UN_GELU_ERF, .count = N, .a = gx};
    k.out_dtype = MW_F32, k.out = gf;
    OK(dev.vt->unary(&dev, &k));
    k.out_dtype = MW_BF16, k.out = gh;
    OK(dev.vt->unary(&dev, &k));
    down(f, gf, N * 4), down(h, gh, N * 2);
    expect_rounded(h, f, N, "exact gelu");
    for (int i = 0; i < N; i++) {
        double v = x[i], z = v / sqrt(2.0), want = 0.5 * v * erfc(-z);
        double tol = (2.0 * z * z + 9.0) * FLT_EPSILON * fabs(want) + ldexp(fabs(want), -8) + 1e-30;
        cr_assert(fabs(mw__bf16_to_f32(h[i]) - want) <= tol,
                  "exact gelu(%.9g) in bf16: %.9g, want %.9g", x[i], mw__bf16_to_f32(h[i]), want);
    }
    free(x), free(f), free(h);
}

/* The bias gradient of a bf16 GELU gradient (both forms) at GPT-2's MLP width, tiles left over
 * in both directions: the f32 products gy * gelu'(x) that the f32 kernel writes, added in row
 * order on the host as the CPU kernel adds them (a rounded product, then a rounded sum), are its
 * column sums bit for bit (a fused multiply-add, or another order, gives other bits); and the CPU
 * kernel's sums, whose products may differ by a few ulp (gelu' fuses differently there; erfc is
 * another implementation), within the bound of those differences and of the sums. */
Test(gpu_bf16, gelu_gradient_column_sums_add_the_rows_in_order) {
    start();
    enum { ROWS = 1030, COLS = 3077 };
    int64_t n = (int64_t)ROWS * COLS;
    float *x = randoms(n, 4.0f), *gy = randoms(n, 1.0f), *f = malloc((size_t)n * 4);
    float *cs = malloc(COLS * 4), *csc = malloc(COLS * 4);
    uint16_t *h = malloc((size_t)n * 2), *hc = malloc((size_t)n * 2);
    void *gx = up(x, (size_t)n * 4), *ggy = up(gy, (size_t)n * 4), *gf = up(NULL, (size_t)n * 4),
         *gh = up(NULL, (size_t)n * 2), *gcs = up(NULL, COLS * 4);
    mw__device cpu;
    memset(&cpu, 0, sizeof cpu);
    cpu.vt = &mw__cpu_device;
    snprintf(cpu.name, sizeof cpu.name, "cpu:0");
    OK(cpu.vt->init(&cpu));
    for (int exact = 0; exact < 2; exact++) {
        mw__unop op = exact ? MW__UN_GELU_ERF : MW__UN_GELU;
        mw__k_unary_grad k = {.op = op, .count = n, .gy = ggy, .x = gx};
        k.out_dtype = MW_F32, k.out = gf;
        OK(dev.vt->unary_grad(&dev, &k));
        k.out_dtype = MW_BF16, k.out = gh, k.cols = COLS, k.colsum = gcs;
        OK(dev.vt->unary_grad(&dev, &k));
        down(f, gf, (size_t)n * 4), down(h, gh, (size_t)n * 2), down(cs, gcs, COLS * 4);
        expect_rounded(h, f, n, exact ? "exact gelu gradient" : "gelu gradient");
        mw__k_unary_grad kc = {.op = op, .count = n, .gy = gy, .x = x, .out_dtype = MW_BF16};
        kc.out = hc, kc.cols = COLS, kc.colsum = csc;
        OK(cpu.vt->unary_grad(&cpu, &kc));
        for (int j = 0; j < COLS; j++) {
            float want = 0.0f;
            double mag = 0.0;
            for (int r = 0; r < ROWS; r++) {
                want = want + f[(int64_t)r * COLS + j];
                mag += fabs(f[(int64_t)r * COLS + j]);
            }
            uint32_t gb, wb;
            memcpy(&gb, &cs[j], 4), memcpy(&wb, &want, 4);
            cr_assert_eq(gb, wb,
                         "%s column %d: %.9g (0x%08x), the rows added in order give %.9g (0x%08x)",
                         exact ? "exact" : "tanh", j, cs[j], gb, want, wb);
            /* Each product within 16 ulp on the two sides, and two sums of ROWS terms. */
            double tol = (16.0 + 2.0 * ROWS) * FLT_EPSILON * mag + 1e-30;
            cr_assert(fabs((double)csc[j] - cs[j]) <= tol, "%s column %d: CPU %.9g, GPU %.9g",
                      exact ? "exact" : "tanh", j, csc[j], cs[j]);
        }
    }
    cpu.vt->shutdown(&cpu);
    free(x), free(gy), free(f), free(cs), free(csc), free(h), free(hc);
}

Test(gpu_bf16, optimizers_write_the_rounded_parameters) {
    start();
    enum { N = 5000 };
    float *p = randoms(N, 1.0f), *g = randoms(N, 1.0f), *got = malloc(N * 4);
    uint16_t *h = malloc(N * 2);
    void *gp = up(p, N * 4), *gg = up(g, N * 4), *gm = up(NULL, N * 4), *gv = up(NULL, N * 4),
         *gh = up(NULL, N * 2);
    float zero = 0.0f;
    for (int i = 0; i < N; i++) {
        OK(dev.vt->upload(&dev, (float *)gm + i, &zero, 4));
        OK(dev.vt->upload(&dev, (float *)gv + i, &zero, 4));
    }
    mw__k_adamw a = {.count = N, .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f};
    a.bias1 = 0.1f, a.bias2 = 0.05f, a.grad_scale = 1.0f;
    a.p = gp, a.m = gm, a.v = gv, a.g = gg, a.p16 = gh;
    OK(dev.vt->adamw(&dev, &a));
    down(got, gp, N * 4), down(h, gh, N * 2);
    expect_rounded(h, got, N, "adamw");
    mw__k_sgd s = {.lr = 0.1f, .count = N, .p = gp, .g = gg, .p16 = gh};
    OK(dev.vt->sgd(&dev, &s));
    down(got, gp, N * 4), down(h, gh, N * 2);
    expect_rounded(h, got, N, "sgd");
    free(p), free(g), free(got), free(h);
}

#endif
