/* bf16 on the CPU backend: the rounding (against the definition: the nearest bf16, ties to the
 * even one), every kernel that writes bf16 against the rounding of its f32 result, the bf16
 * GEMMs of every engine (oneDNN on bf16 instructions where the CPU has them, the f32 path for
 * widened operands, OpenBLAS) against a float64 reference, and the f32 GEMMs of oneDNN and
 * OpenBLAS against each other and the reference. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/plan.h"
#include "devices/cpu/cpu.h"
#include "devices/cpu/cpu_isa.h"
#include "devices/cpu/cpu_state.h"
#include "devices/cpu/simd.h"
#include "devices/device.h"
#include "devices/math.h"
#include "meshwit.h"

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static float bits_f(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static uint32_t f_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* Values in [-1, 1) with a random exponent spread (a few binades). */
static void fill(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)((double)(next() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static uint16_t *to_bf16(const float *x, int64_t n) {
    uint16_t *h = malloc((size_t)(n ? n : 1) * sizeof *h);
    for (int64_t i = 0; i < n; i++) h[i] = mw__bf16_from_f32(x[i]);
    return h;
}

/* --- the rounding ----------------------------------------------------------------------------- */

/* The definition, independently: among the bf16 values on either side of x (the truncation and
 * the next one up in magnitude), the nearer, and on a tie the one whose last mantissa bit is 0;
 * past the largest finite value, infinity. */
static uint16_t reference_round(float x) {
    uint32_t u = f_bits(x);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    double dx = x, dl = mw__bf16_to_f32(lo);
    double dh = (hi & 0x7f80) == 0x7f80 && (hi & 0x7f) == 0 && (lo & 0x7fff) == 0x7f7f
                    ? copysign(ldexp(1.0, 128), dx) /* the rounding boundary above the maximum */
                    : mw__bf16_to_f32(hi);
    double el = fabs(dx - dl), eh = fabs(dx - dh);
    if (el < eh) return lo;
    if (eh < el) return hi;
    return (lo & 1) ? hi : lo;
}

Test(bf16, rounding_is_nearest_even) {
    static const struct {
        uint32_t in;
        uint16_t out;
    } cases[] = {
        {0x3f800000, 0x3f80}, /* 1 */
        {0x3f808000, 0x3f80}, /* a tie: to the even 1.0 */
        {0x3f818000, 0x3f82}, /* a tie: to the even one above */
        {0x3f808001, 0x3f81}, /* just past the tie */
        {0x3f807fff, 0x3f80}, /* just below it */
        {0x7f7fffff, 0x7f80}, /* the largest float rounds past bf16's largest: Inf */
        {0x7f7f7fff, 0x7f7f}, /* below that boundary it stays finite */
        {0x7f800000, 0x7f80}, /* Inf */
        {0xff800000, 0xff80}, /* -Inf */
        {0x80000000, 0x8000}, /* -0 */
        {0x00008000, 0x0000}, /* a subnormal tie: to even zero */
        {0x00018000, 0x0002}, /* a subnormal tie: up to even */
        {0x007fffff, 0x0080}, /* the largest subnormal rounds up into the normals */
        {0x80010000, 0x8001}, /* -smallest bf16 subnormal, exactly */
        {0x7f800001, 0x7fc0}, /* a signalling NaN: quiet, still a NaN (not Inf) */
        {0xffc00001, 0xffc0}, /* a negative quiet NaN keeps its sign */
        {0x7fff0000, 0x7fff}, /* a NaN's top payload bits are kept */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint16_t got = mw__bf16_from_f32(bits_f(cases[i].in));
        cr_assert_eq(got, cases[i].out, "bf16(0x%08x) = 0x%04x, want 0x%04x", cases[i].in, got,
                     cases[i].out);
    }
    /* Widening is exact: every bf16 is the top half of the f32. */
    for (uint32_t h = 0; h < 65536; h++)
        cr_assert_eq(f_bits(mw__bf16_to_f32((uint16_t)h)), h << 16, "0x%04x", h);
}

Test(bf16, rounding_matches_the_definition_on_random_floats) {
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)next();
        float x = bits_f(u);
        if (isnan(x)) continue;
        uint16_t got = mw__bf16_from_f32(x), want = reference_round(x);
        cr_assert_eq(got, want, "bf16(0x%08x = %.9g) = 0x%04x, want 0x%04x", u, x, got, want);
    }
}

/* The vector rounding compiled for each x86-64 level the kernels are built for (cpu_kernels.h);
 * the test runs those the CPU has. */
#define STORE_VECTORS(name, attr)                                                                  \
    attr static void name(int64_t n, const float *x, uint16_t *out) {                              \
        for (int64_t i = 0; i + 8 <= n; i += 8) {                                                  \
            mw__v8 v;                                                                              \
            memcpy(&v, x + i, sizeof v);                                                           \
            mw__bf16_store8(out + i, &v);                                                          \
        }                                                                                          \
    }
STORE_VECTORS(store_vectors, )
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
STORE_VECTORS(store_vectors_v3, __attribute__((target("arch=x86-64-v3"))))
STORE_VECTORS(store_vectors_v4, __attribute__((target("arch=x86-64-v4"))))
#define LEVELS 3
#else
#define LEVELS 1
#endif

Test(bf16, vector_rounding_equals_scalar) {
    enum { N = 1 << 16 };
    float *x = malloc(N * sizeof *x);
    uint16_t *got = malloc(N * sizeof *got);
    for (int i = 0; i < N; i++) x[i] = bits_f((uint32_t)next()); /* NaNs, Infs, subnormals too */
    for (int level = 0; level < LEVELS; level++) {
        memset(got, 0, N * sizeof *got);
#if LEVELS > 1
        if (level == 1 && mw__isa_of_cpu() < MW__ISA_AVX2) continue;
        if (level == 2 && mw__isa_of_cpu() < MW__ISA_AVX512) continue;
        (level == 2 ? store_vectors_v4 : level == 1 ? store_vectors_v3 : store_vectors)(N, x, got);
#else
        store_vectors(N, x, got);
#endif
        for (int i = 0; i < N; i++)
            cr_assert_eq(got[i], mw__bf16_from_f32(x[i]), "level %d, lane %d of 0x%08x", level,
                         i % 8, f_bits(x[i]));
    }
    free(x);
    free(got);
}

/* --- conversions through the copy kernel ------------------------------------------------------ */

Test(bf16, copy_converts_strided) {
    /* A 37 x 29 transpose (strided on both sides) and a contiguous run, f32 <-> bf16 both ways
     * and bf16 -> bf16, with alpha 1 and 0.5. */
    enum { R = 37, C = 29 };
    float *x = malloc(R * C * sizeof *x), *back = malloc(R * C * sizeof *back);
    uint16_t *h = malloc(R * C * sizeof *h), *h2 = malloc(R * C * sizeof *h2);
    fill(x, R * C);
    for (int a = 0; a < 2; a++) {
        float alpha = a ? 0.5f : 1.0f;
        mw__k_copy k = {.alpha = alpha, .out_dtype = MW_BF16, .a_dtype = MW_F32};
        k.nd.rank = 2;
        k.nd.dims[0] = R, k.nd.dims[1] = C;
        k.nd.stride[0][0] = 1, k.nd.stride[0][1] = R; /* out is C x R */
        k.nd.stride[1][0] = C, k.nd.stride[1][1] = 1;
        k.out = h, k.a = x;
        cr_assert_eq(mw__cpu_device.copy(NULL, &k), MW_OK);
        for (int i = 0; i < R; i++)
            for (int j = 0; j < C; j++)
                cr_assert_eq(h[j * R + i], mw__bf16_from_f32(alpha * x[i * C + j]), "(%d, %d)", i,
                             j);
        /* bf16 -> f32 back (exact, times alpha), contiguous */
        mw__k_copy w = {.alpha = alpha, .out_dtype = MW_F32, .a_dtype = MW_BF16};
        w.nd.rank = 1;
        w.nd.dims[0] = R * C;
        w.nd.stride[0][0] = w.nd.stride[1][0] = 1;
        w.out = back, w.a = h;
        cr_assert_eq(mw__cpu_device.copy(NULL, &w), MW_OK);
        for (int i = 0; i < R * C; i++)
            cr_assert_eq(back[i], alpha * mw__bf16_to_f32(h[i]), "widened %d", i);
        /* bf16 -> bf16: a copy (alpha 1) or rounded again */
        w.out_dtype = MW_BF16;
        w.out = h2;
        cr_assert_eq(mw__cpu_device.copy(NULL, &w), MW_OK);
        for (int i = 0; i < R * C; i++)
            cr_assert_eq(h2[i], mw__bf16_from_f32(alpha * mw__bf16_to_f32(h[i])), "bf16 %d", i);
    }
    /* A single element (rank 0). */
    float one = 3.14159f;
    uint16_t out = 0;
    mw__k_copy k = {.alpha = 1.0f, .out_dtype = MW_BF16, .a_dtype = MW_F32, .out = &out, .a = &one};
    cr_assert_eq(mw__cpu_device.copy(NULL, &k), MW_OK);
    cr_assert_eq(out, mw__bf16_from_f32(one));
    free(x);
    free(back);
    free(h);
    free(h2);
}

/* --- kernels that write bf16: the rounding of what they write in f32 ------------------------- */

static void expect_rounded(const uint16_t *got, const float *f32, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(got[i], mw__bf16_from_f32(f32[i]), "%s[%lld]: 0x%04x, f32 %.9g", what,
                     (long long)i, got[i], f32[i]);
}

Test(bf16, layernorm_gelu_and_gelu_grad_write_the_rounded_f32_results) {
    enum { ROWS = 13, N = 77 }; /* rows past a vector multiple: the tails too */
    float *x = malloc(ROWS * N * 4), *gy = malloc(ROWS * N * 4), *w = malloc(N * 4),
          *b = malloc(N * 4), *f = malloc(ROWS * N * 4), *cs32 = malloc(N * 4),
          *cs16 = malloc(N * 4);
    uint16_t *h = malloc(ROWS * N * 2);
    fill(x, ROWS * N), fill(gy, ROWS * N), fill(w, N), fill(b, N);
    mw__k_layernorm ln = {.rows = ROWS, .n = N, .eps = 1e-5f, .out = f, .x = x, .w = w, .b = b};
    cr_assert_eq(mw__cpu_device.layernorm(NULL, &ln), MW_OK);
    ln.out_dtype = MW_BF16, ln.out = h;
    cr_assert_eq(mw__cpu_device.layernorm(NULL, &ln), MW_OK);
    expect_rounded(h, f, ROWS * N, "layernorm");

    for (int e = 0; e < 2; e++) { /* the tanh form, then the exact one */
        mw__unop op = e ? MW__UN_GELU_ERF : MW__UN_GELU;
        mw__k_unary u = {.op = op, .count = ROWS * N, .out = f, .a = x};
        cr_assert_eq(mw__cpu_device.unary(NULL, &u), MW_OK);
        u.out_dtype = MW_BF16, u.out = h;
        cr_assert_eq(mw__cpu_device.unary(NULL, &u), MW_OK);
        expect_rounded(h, f, ROWS * N, op ? "gelu_erf" : "gelu");

        mw__k_unary_grad g = {
            .op = op, .count = ROWS * N, .out = f, .gy = gy, .x = x, .cols = N, .colsum = cs32};
        cr_assert_eq(mw__cpu_device.unary_grad(NULL, &g), MW_OK);
        g.out_dtype = MW_BF16, g.out = h, g.colsum = cs16;
        cr_assert_eq(mw__cpu_device.unary_grad(NULL, &g), MW_OK);
        expect_rounded(h, f, ROWS * N, op ? "gelu_erf_grad" : "gelu_grad");
        /* The bias gradient is summed from the f32 values, before they are rounded. */
        cr_assert_eq(memcmp(cs32, cs16, N * 4), 0, "column sums differ");
    }
    free(x), free(gy), free(w), free(b), free(f), free(cs32), free(cs16), free(h);
}

Test(bf16, optimizers_write_the_rounded_parameters) {
    enum { N = 1029 };
    float *p0 = malloc(N * 4), *g = malloc(N * 4), *p = malloc(N * 4), *q = malloc(N * 4),
          *m = calloc(N, 4), *v = calloc(N, 4), *m2 = calloc(N, 4), *v2 = calloc(N, 4);
    uint16_t *h = malloc(N * 2);
    fill(p0, N), fill(g, N);
    for (int kind = 0; kind < 3; kind++) {
        memcpy(p, p0, N * 4), memcpy(q, p0, N * 4);
        memset(m, 0, N * 4), memset(v, 0, N * 4), memset(m2, 0, N * 4), memset(v2, 0, N * 4);
        if (kind == 0) {
            mw__k_adamw a = {.count = N,
                             .lr = 1e-2f,
                             .beta1 = 0.9f,
                             .beta2 = 0.95f,
                             .eps = 1e-8f,
                             .weight_decay = 0.1f,
                             .bias1 = 0.1f,
                             .bias2 = 0.05f,
                             .grad_scale = 0.5f,
                             .p = p,
                             .m = m,
                             .v = v,
                             .g = g};
            cr_assert_eq(mw__cpu_device.adamw(NULL, &a), MW_OK);
            a.p = q, a.m = m2, a.v = v2, a.p16 = h;
            cr_assert_eq(mw__cpu_device.adamw(NULL, &a), MW_OK);
        } else if (kind == 1) {
            mw__k_sgd s = {.lr = 0.1f, .count = N, .p = p, .g = g};
            cr_assert_eq(mw__cpu_device.sgd(NULL, &s), MW_OK);
            s.p = q, s.p16 = h;
            cr_assert_eq(mw__cpu_device.sgd(NULL, &s), MW_OK);
        } else {
            mw__k_sgd_momentum s = {.count = N,
                                    .lr = 0.1f,
                                    .momentum = 0.9f,
                                    .weight_decay = 0.01f,
                                    .grad_scale = 1.0f,
                                    .first = 1,
                                    .p = p,
                                    .buf = m,
                                    .g = g};
            cr_assert_eq(mw__cpu_device.sgd_momentum(NULL, &s), MW_OK);
            s.p = q, s.buf = m2, s.p16 = h;
            cr_assert_eq(mw__cpu_device.sgd_momentum(NULL, &s), MW_OK);
        }
        cr_assert_eq(memcmp(p, q, N * 4), 0, "optimizer %d: the f32 update changed", kind);
        expect_rounded(h, p, N, kind == 0 ? "adamw" : kind == 1 ? "sgd" : "sgd_momentum");
    }
    free(p0), free(g), free(p), free(q), free(m), free(v), free(m2), free(v2), free(h);
}

/* --- attention with bf16 q, k, v: the f32 kernel on their widened values ---------------------- */

/* [Batch, Seq, Part, Head, HeadDim] as the planner lowers it, causal, with blocks of 64 queries
 * (two full ones and a tail). */
static mw__k_attention attention_of(int64_t B, int64_t T, int64_t H, int64_t D, int grad) {
    mw__k_attention k = {.causal = 1, .scale = 0.125f, .t = T, .d = D};
    k.seq_qkv = 3 * H * D, k.part = H * D, k.seq_out = H * D;
    k.walk.rank = 2;
    k.walk.dims[0] = B, k.walk.dims[1] = H;
    k.walk.stride[0][0] = T * H * D, k.walk.stride[0][1] = D; /* out / gy */
    k.walk.stride[1][0] = T * 3 * H * D, k.walk.stride[1][1] = D;
    k.slices = B * H;
    k.block = T < MW__ATTN_BLOCK ? T : MW__ATTN_BLOCK;
    k.scratch_elems = grad ? 2 * k.block * T + 2 * k.slices * T + 3 * D * T + 2 * k.block * D
                           : k.block * T + 2 * D * T;
    return k;
}

Test(bf16, attention_on_bf16_is_the_f32_kernel_on_the_widened_values) {
    enum { B = 2, T = 150, H = 2, D = 24 };
    int64_t nq = B * T * 3 * H * D, no = B * T * H * D;
    float *qkv = malloc(nq * 4), *wide = malloc(nq * 4), *out = malloc(no * 4),
          *gy = malloc(no * 4), *dq32 = malloc(nq * 4), *dq16 = malloc(nq * 4);
    fill(qkv, nq), fill(gy, no);
    uint16_t *h = to_bf16(qkv, nq), *o16 = malloc(no * 2);
    for (int64_t i = 0; i < nq; i++) wide[i] = mw__bf16_to_f32(h[i]);
    for (int grad = 0; grad < 2; grad++) {
        mw__k_attention k = attention_of(B, T, H, D, grad);
        float *scratch = malloc((size_t)(k.scratch_elems + 4 * D * T) * 4);
        k.scratch = scratch;
        k.gy = gy;
        /* f32 on the widened values */
        k.qkv = wide, k.out = grad ? (void *)dq32 : (void *)out;
        cr_assert_eq((grad ? mw__cpu_device.attention_grad : mw__cpu_device.attention)(NULL, &k),
                     MW_OK);
        /* bf16 in (and out, forward), with the staging the plan adds to the scratch */
        k.qkv_dtype = MW_BF16, k.qkv = h;
        k.out_dtype = grad ? MW_F32 : MW_BF16, k.out = grad ? (void *)dq16 : (void *)o16;
        k.scratch_elems += grad ? 3 * D * T : 4 * D * T;
        cr_assert_eq((grad ? mw__cpu_device.attention_grad : mw__cpu_device.attention)(NULL, &k),
                     MW_OK);
        if (grad)
            cr_assert_eq(memcmp(dq32, dq16, nq * 4), 0, "d(qkv) differs");
        else
            expect_rounded(o16, out, no, "attention");
        free(scratch);
    }
    free(qkv), free(wide), free(out), free(gy), free(dq32), free(dq16), free(h), free(o16);
}

/* --- GEMMs ------------------------------------------------------------------------------------ */

typedef struct gemm_case {
    int64_t batch, m, n, k;
    int ta, tb, bias, addend;
    float beta;
    int64_t pad; /* C's rows (and the addend's) pad elements apart beyond N */
} gemm_case;

/* From the thirteenth on: matrix-vector products of every form, past the loops' blocks of 32 (K)
 * and 64 (N) in cpu_gemm.c, a column C with its elements apart. The last two
 * have C's rows apart in matrices (a bf16 C's gaps must keep their values, beta 1 and 0). */
static const gemm_case CASES[] = {
    {1, 64, 48, 32, 0, 0, 0, 0, 0.0f, 0},   {1, 37, 29, 53, 1, 0, 1, 0, 0.0f, 0},
    {1, 40, 33, 17, 0, 1, 1, 1, 0.0f, 0},   {3, 21, 18, 25, 1, 1, 0, 1, 0.0f, 0},
    {2, 16, 70, 40, 0, 0, 0, 0, 1.0f, 0},   {1, 1, 50, 30, 0, 1, 1, 0, 0.0f, 0},
    {1, 45, 1, 30, 1, 0, 0, 0, 1.0f, 0},    {1, 128, 256, 96, 0, 1, 1, 1, 0.0f, 0},
    {1, 256, 96, 128, 1, 0, 0, 0, 0.0f, 0}, {1, 5, 7, 0, 0, 0, 1, 1, 0.0f, 0},
    {2, 6, 9, 0, 1, 1, 0, 0, 1.0f, 0},      {1, 1, 130, 70, 0, 0, 1, 0, 0.0f, 0},
    {1, 77, 1, 100, 0, 0, 0, 1, 1.0f, 3},   {2, 1, 1, 45, 0, 0, 0, 0, 1.0f, 0},
    {1, 1, 9, 200, 0, 1, 0, 0, 0.0f, 0},    {1, 70, 1, 33, 1, 0, 1, 0, 0.0f, 2},
    {2, 30, 20, 24, 0, 1, 1, 1, 1.0f, 5},   {1, 50, 40, 64, 0, 0, 1, 0, 0.0f, 7}};

/* Set by a test before run_case: the device then counts OpenBLAS's kernels as generic (as Debian
 * 12's are on Sapphire Rapids), so that the paths chosen there run on every machine. */
static int generic_blas;

/* Runs one GEMM case in dtype ab (C in c_dtype) on a CPU device started with the environment as
 * it is, and checks C against float64 with the bound of an f32 sum of K products of exactly
 * representable (bf16 or f32) operands in any order: (K + 2) eps sum |a b| + eps |addends|,
 * plus half a bf16 ulp of the result when C is bf16. Returns the implementation's name. */
static void run_case(const gemm_case *c, mw_dtype ab, mw_dtype cdt, char *impl, size_t isz) {
    int64_t ra = c->ta ? c->k : c->m, ca = c->ta ? c->m : c->k;
    int64_t rb = c->tb ? c->n : c->k, cb = c->tb ? c->k : c->n;
    int64_t ldc = c->n + c->pad, sa = ra * ca, sb = rb * cb, sc = c->m * ldc;
    float *a = malloc((size_t)(c->batch * sa) * 4), *b = malloc((size_t)(c->batch * sb) * 4);
    float *bias = malloc((size_t)c->n * 4), *add = malloc((size_t)(c->batch * sc) * 4);
    float *c0 = malloc((size_t)(c->batch * sc) * 4), *cf = malloc((size_t)(c->batch * sc) * 4);
    fill(a, c->batch * sa), fill(b, c->batch * sb), fill(bias, c->n), fill(add, c->batch * sc);
    fill(c0, c->batch * sc);
    uint16_t *ah = to_bf16(a, c->batch * sa), *bh = to_bf16(b, c->batch * sb);
    uint16_t *ch = to_bf16(c0, c->batch * sc); /* a bf16 C as it was before */
    if (cdt == MW_BF16)
        for (int64_t i = 0; i < c->batch * sc; i++) c0[i] = mw__bf16_to_f32(ch[i]);
    if (ab == MW_BF16) { /* the operands as the kernel sees them */
        for (int64_t i = 0; i < c->batch * sa; i++) a[i] = mw__bf16_to_f32(ah[i]);
        for (int64_t i = 0; i < c->batch * sb; i++) b[i] = mw__bf16_to_f32(bh[i]);
    }
    memcpy(cf, c0, (size_t)(c->batch * sc) * 4);
    mw__k_gemm k = {.beta = c->beta,
                    .batch = c->batch,
                    .m = c->m,
                    .n = c->n,
                    .k = c->k,
                    .trans_a = c->ta,
                    .trans_b = c->tb,
                    .lda = ca,
                    .ldb = cb,
                    .ldc = ldc,
                    .stride_a = sa,
                    .stride_b = sb,
                    .stride_c = sc,
                    .ab_dtype = ab,
                    .c_dtype = cdt,
                    .c = cdt == MW_BF16 ? (void *)ch : (void *)cf,
                    .a = ab == MW_BF16 ? (void *)ah : (void *)a,
                    .b = ab == MW_BF16 ? (void *)bh : (void *)b,
                    .bias = c->bias ? bias : NULL,
                    .addend = c->addend ? add : NULL};
    mw__device dev = {.vt = &mw__cpu_device, .name = "cpu:0"};
    cr_assert_eq(dev.vt->init(&dev), MW_OK);
    if (generic_blas) ((mw__cpu_state *)dev.impl)->blas_tuned = 0;
    cr_assert_eq(dev.vt->gemm_prepare(&dev, &k), MW_OK);
    snprintf(impl, isz, "%s", dev.vt->describe(&dev, MW__I_GEMM, &k));
    cr_assert_eq(dev.vt->gemm(&dev, &k), MW_OK, "%s", impl);
    for (int64_t bi = 0; bi < c->batch; bi++)
        for (int64_t i = 0; i < c->m; i++)
            for (int64_t j = 0; j < c->n; j++) {
                double s = 0, mag = 0, e = 0;
                for (int64_t l = 0; l < c->k; l++) {
                    double x = c->ta ? a[bi * sa + l * ca + i] : a[bi * sa + i * ca + l];
                    double y = c->tb ? b[bi * sb + j * cb + l] : b[bi * sb + l * cb + j];
                    s += x * y;
                    mag += fabs(x * y);
                }
                int64_t at = bi * sc + i * ldc + j;
                if (c->beta != 0.0f) s += c0[at], e += fabs(c0[at]);
                if (c->bias) s += bias[j], e += fabs(bias[j]);
                if (c->addend) s += add[at], e += fabs(add[at]);
                double got = cdt == MW_BF16 ? mw__bf16_to_f32(ch[at]) : cf[at];
                double tol = (c->k + 2) * FLT_EPSILON * (mag + e) + 1e-30;
                if (cdt == MW_BF16) tol += fabs(s) * ldexp(1.0, -8) + tol;
                cr_assert(fabs(got - s) <= tol,
                          "%s: batch %lld, %lld x %lld x %lld (ta %d tb %d, bias %d, addend %d, "
                          "beta %g): C[%lld][%lld][%lld] = %.9g, want %.9g (tolerance %.3g)",
                          impl, (long long)c->batch, (long long)c->m, (long long)c->n,
                          (long long)c->k, c->ta, c->tb, c->bias, c->addend, c->beta, (long long)bi,
                          (long long)i, (long long)j, got, s, tol);
            }
    for (int64_t at = 0; at < c->batch * sc; at++)
        cr_assert(at % ldc < c->n ||
                      (cdt == MW_F32 ? cf[at] == c0[at] : mw__bf16_to_f32(ch[at]) == c0[at]),
                  "%s: C's padding at %lld was written", impl, (long long)at);
    dev.vt->shutdown(&dev);
    free(a), free(b), free(bias), free(add), free(c0), free(cf), free(ah), free(bh), free(ch);
}

static void all_cases(mw_dtype ab, mw_dtype cdt, const char *expect) {
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        char impl[128];
        run_case(&CASES[i], ab, cdt, impl, sizeof impl);
        int vector = CASES[i].m == 1 || CASES[i].n == 1 || CASES[i].k == 0;
        if (expect && !vector)
            cr_assert(strstr(impl, expect), "case %zu ran on '%s', expected '%s'", i, impl, expect);
    }
}

Test(bf16, f32_gemm_on_openblas) {
    setenv("MESHWIT_CPU_GEMM", "openblas", 1);
    all_cases(MW_F32, MW_F32, "openblas");
}

Test(bf16, f32_gemm_on_onednn) {
#ifdef MESHWIT_HAVE_DNNL
    setenv("MESHWIT_CPU_GEMM", "onednn", 1);
    all_cases(MW_F32, MW_F32, "onednn");
#else
    cr_skip_test("built without oneDNN");
#endif
}

/* Runs every matrix-vector case (K > 0) and requires its implementation's name to hold `expect`. */
static void vector_cases(mw_dtype ab, mw_dtype cdt, const char *expect) {
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        const gemm_case *c = &CASES[i];
        if ((c->m != 1 && c->n != 1) || c->k == 0 || (cdt == MW_BF16 && c->beta != 0.0f)) continue;
        char impl[128];
        run_case(c, ab, cdt, impl, sizeof impl);
        cr_assert(strstr(impl, expect), "case %zu ran on '%s', expected '%s'", i, impl, expect);
    }
}

Test(bf16, gemv_where_openblas_is_generic) {
    /* Our loops, never oneDNN (each of its calls allocates), under auto and onednn; OpenBLAS's
     * sgemv when asked for. */
    generic_blas = 1;
    vector_cases(MW_F32, MW_F32, "gemv loops");
#ifdef MESHWIT_HAVE_DNNL
    setenv("MESHWIT_CPU_GEMM", "onednn", 1);
    vector_cases(MW_F32, MW_F32, "gemv loops");
#endif
    setenv("MESHWIT_CPU_ISA", "avx512", 1); /* bf16 widened to f32 */
    vector_cases(MW_BF16, MW_F32, "bf16 widened to f32, gemv loops");
    vector_cases(MW_BF16, MW_BF16, "bf16 widened to f32, gemv loops");
    setenv("MESHWIT_CPU_GEMM", "openblas", 1);
    vector_cases(MW_F32, MW_F32, "openblas sgemv");
}

Test(bf16, bf16_gemm_default_engine) {
    /* bf16 instructions where the CPU has them (oneDNN), the widened path elsewhere. */
    all_cases(MW_BF16, MW_F32, mw__cpu_bf16_native(NULL) ? "onednn" : "widened");
    all_cases(MW_BF16, MW_BF16, NULL);
    all_cases(MW_F32, MW_BF16, "widened");
}

Test(bf16, bf16_gemm_widened_to_f32) {
    /* The fallback of a CPU without bf16 instructions, forced: the same products in f32. */
    setenv("MESHWIT_CPU_ISA", "avx512", 1);
    cr_assert(!mw__cpu_bf16_native(NULL));
    all_cases(MW_BF16, MW_F32, "widened");
    all_cases(MW_BF16, MW_BF16, "widened");
    setenv("MESHWIT_CPU_GEMM", "openblas", 1);
    all_cases(MW_BF16, MW_F32, "widened to f32, openblas");
}

Test(bf16, unprepared_gemm_widens) {
    /* A kernel called without gemm_prepare (no device state) still computes bf16 GEMMs. */
    const gemm_case *c = &CASES[1];
    int64_t na = c->m * c->k, nb = c->k * c->n;
    float *a = malloc(na * 4), *b = malloc(nb * 4), *want = calloc(c->m * c->n, 4),
          *got = calloc(c->m * c->n, 4);
    fill(a, na), fill(b, nb);
    uint16_t *ah = to_bf16(a, na), *bh = to_bf16(b, nb);
    for (int64_t i = 0; i < na; i++) a[i] = mw__bf16_to_f32(ah[i]);
    for (int64_t i = 0; i < nb; i++) b[i] = mw__bf16_to_f32(bh[i]);
    mw__k_gemm k = {.batch = 1, .m = c->m, .n = c->n, .k = c->k, .lda = c->k, .ldb = c->n};
    k.ldc = c->n, k.stride_a = na, k.stride_b = nb, k.stride_c = c->m * c->n;
    k.c = want, k.a = a, k.b = b;
    cr_assert_eq(mw__cpu_device.gemm(NULL, &k), MW_OK);
    k.ab_dtype = MW_BF16, k.c = got, k.a = ah, k.b = bh;
    cr_assert_eq(mw__cpu_device.gemm(NULL, &k), MW_OK);
    /* The same f32 products in the same engine: the same bits. */
    cr_assert_eq(memcmp(want, got, (size_t)(c->m * c->n) * 4), 0);
    free(a), free(b), free(want), free(got), free(ah), free(bh);
}

Test(bf16, bad_environment_is_refused_with_its_name) {
    setenv("MESHWIT_CPU_GEMM", "mkl", 1);
    mw__device dev = {.vt = &mw__cpu_device, .name = "cpu:0"};
    cr_assert_eq(dev.vt->init(&dev), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "MESHWIT_CPU_GEMM=mkl"), "%s", mw_last_error());
    unsetenv("MESHWIT_CPU_GEMM");
    setenv("MESHWIT_CPU_ISA", "avx1024", 1);
    cr_assert_eq(dev.vt->init(&dev), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "MESHWIT_CPU_ISA=avx1024"), "%s", mw_last_error());
}

/* --- attention on bf16 instructions (oneDNN), against float64 ---------------------------------
 */

/* The causal attention of one slice in float64 from the (bf16) values of qkv, and its
 * gradients for gy: out (t x d), dq, dk, dv (t x d each). */
static void attention_reference(const float *qkv, const float *gy, int64_t T, int64_t H, int64_t D,
                                int64_t b, int64_t h, double scale, double *out, double *dq,
                                double *dk, double *dv) {
    int64_t seq = 3 * H * D, base = b * T * seq + h * D, part = H * D;
    double *p = calloc((size_t)(T * T), sizeof *p), *dp = calloc((size_t)(T * T), sizeof *dp);
    for (int64_t i = 0; i < T; i++) {
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; j++) {
            double s = 0;
            for (int64_t e = 0; e < D; e++)
                s += (double)qkv[base + i * seq + e] * qkv[base + part + j * seq + e];
            p[i * T + j] = scale * s;
            if (p[i * T + j] > mx) mx = p[i * T + j];
        }
        for (int64_t j = 0; j <= i; j++) sum += p[i * T + j] = exp(p[i * T + j] - mx);
        for (int64_t j = 0; j <= i; j++) p[i * T + j] /= sum;
    }
    const float *g = gy + b * T * H * D + h * D;
    for (int64_t i = 0; i < T; i++)
        for (int64_t e = 0; e < D; e++) {
            double o = 0;
            for (int64_t j = 0; j <= i; j++) o += p[i * T + j] * qkv[base + 2 * part + j * seq + e];
            out[i * D + e] = o;
        }
    memset(dq, 0, sizeof(double) * (size_t)(T * D));
    memset(dk, 0, sizeof(double) * (size_t)(T * D));
    memset(dv, 0, sizeof(double) * (size_t)(T * D));
    for (int64_t i = 0; i < T; i++) {
        double dsum = 0;
        for (int64_t j = 0; j <= i; j++) {
            double s = 0;
            for (int64_t e = 0; e < D; e++)
                s += (double)g[i * H * D + e] * qkv[base + 2 * part + j * seq + e];
            dp[i * T + j] = s;
            dsum += s * p[i * T + j];
        }
        for (int64_t j = 0; j <= i; j++) {
            double ds = scale * p[i * T + j] * (dp[i * T + j] - dsum);
            for (int64_t e = 0; e < D; e++) {
                dq[i * D + e] += ds * qkv[base + part + j * seq + e];
                dk[j * D + e] += ds * qkv[base + i * seq + e];
                dv[j * D + e] += p[i * T + j] * g[i * H * D + e];
            }
        }
    }
    free(p);
    free(dp);
}

static double max_abs(const double *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

/* The bf16 attention that runs under MESHWIT_CPU_GEMM=engine (NULL: as set), whose kernel's name
 * holds `impl`, against float64, with a head of D. */
static void attention_against_float64(const char *engine, const char *impl, int64_t D) {
    enum { B = 2, T = 150, H = 2 };
    if (engine) setenv("MESHWIT_CPU_GEMM", engine, 1);
    mw__device dev = {.vt = &mw__cpu_device, .name = "cpu:0"};
    if (!dev.vt->attention_prepare) cr_skip_test("built without oneDNN: the f32 kernel runs");
    cr_assert_eq(dev.vt->init(&dev), MW_OK);
    int64_t nq = B * T * 3 * H * D, no = B * T * H * D;
    float *qkv = malloc(nq * 4), *gy = malloc(no * 4), *dqkv = malloc(nq * 4);
    fill(qkv, nq), fill(gy, no);
    for (int64_t i = 0; i < nq; i++) qkv[i] *= 2.0f; /* scores of a few units: peaked softmaxes */
    uint16_t *h16 = to_bf16(qkv, nq), *o16 = malloc(no * 2);
    for (int64_t i = 0; i < nq; i++) qkv[i] = mw__bf16_to_f32(h16[i]);
    int keep = 0;
    float *probs = malloc((size_t)(B * H * mw__attn_probs_per_slice(T, MW__ATTN_BLOCK, 1)) * 4);
    for (int run = 0; run < 4; run++) {
        int grad = run % 2, kept = run / 2; /* with the probabilities kept, and recomputed */
        mw__k_attention k = attention_of(B, T, H, D, grad);
        k.probs = kept ? probs : NULL;
        k.qkv_dtype = MW_BF16, k.qkv = h16, k.gy = gy;
        k.out_dtype = grad ? MW_F32 : MW_BF16, k.out = grad ? (void *)dqkv : (void *)o16;
        k.scratch = malloc((size_t)(k.scratch_elems + 4 * D * T) * 4);
        k.scratch_elems += grad ? 3 * D * T : 4 * D * T;
        cr_assert_eq(dev.vt->attention_prepare(&dev, &k, grad), MW_OK);
        if (!k.impl) {
            free(k.scratch);
            cr_skip_test("no bf16 instructions, none that pay, or no oneDNN here: the f32 "
                         "kernel runs (tested above)");
        }
        keep = 1;
        const char *ran = dev.vt->describe(&dev, grad ? MW__I_ATTENTION_GRAD : MW__I_ATTENTION, &k);
        cr_assert(strstr(ran, impl), "%s ran, not %s", ran, impl);
        cr_assert_eq((grad ? dev.vt->attention_grad : dev.vt->attention)(&dev, &k), MW_OK);
        free(k.scratch);
        if (run < 3 && run != 1) continue;
        /* P, dO and dS are rounded to bf16 where a product reads them (2^-9 each), and the
         * output once more: against the largest value of each result, 2^-6 leaves room for a
         * few such roundings adding up, and none for a wrong term. Checked after each backward
         * pass (probabilities recomputed, then kept). */
        double ref[T * D], dq[T * D], dk[T * D], dv[T * D];
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++) {
                attention_reference(qkv, gy, T, H, D, b, h, 0.125, ref, dq, dk, dv);
                const double *want[4] = {ref, dq, dk, dv};
                const char *names[4] = {"out", "dq", "dk", "dv"};
                for (int w = 0; w < 4; w++) {
                    double tol = ldexp(max_abs(want[w], T * D), -6);
                    for (int64_t i = 0; i < T; i++)
                        for (int64_t e = 0; e < D; e++) {
                            double got =
                                w == 0 ? mw__bf16_to_f32(o16[b * T * H * D + i * H * D + h * D + e])
                                       : dqkv[b * T * 3 * H * D + i * 3 * H * D + (w - 1) * H * D +
                                              h * D + e];
                            cr_assert(fabs(got - want[w][i * D + e]) <= tol,
                                      "%s[b %lld, h %lld, %lld, %lld] = %.7g, want %.7g (tol %.3g)",
                                      names[w], (long long)b, (long long)h, (long long)i,
                                      (long long)e, got, want[w][i * D + e], tol);
                        }
                }
            }
    }
    cr_assert(keep);
    dev.vt->shutdown(&dev);
    free(qkv), free(gy), free(dqkv), free(h16), free(o16), free(probs);
    unsetenv("MESHWIT_CPU_GEMM");
}

Test(bf16, attention_on_bf16_instructions_against_float64) {
    /* AVX512-BF16 without AMX: asked for by name, also where it does not pay */
    if (mw__isa_of_cpu() == MW__ISA_AVX512_BF16) setenv("MESHWIT_CPU_ISA", "avx512_bf16", 1);
    attention_against_float64("onednn", "onednn", 24);
}

/* Where the CPU has AVX512-BF16 and no AMX, the default engine runs attention on meshwit's own
 * dot-product tiles (a head of 40: their 16 x 16 transposes and a rest) when they pay, and on the
 * f32 tiles of widened values when they do not (then this skips: those are covered by
 * attention_on_bf16_is_the_f32_kernel_on_the_widened_values); with AMX, on oneDNN. */
Test(bf16, attention_on_the_default_engine_against_float64) {
    attention_against_float64(NULL,
                              mw__isa_of_cpu() == MW__ISA_AMX ? "onednn" : "dot-product tiles", 40);
}

/* MESHWIT_CPU_ISA=avx512_bf16 runs the dot-product tiles wherever the CPU has AVX512-BF16, also
 * where they are slower than f32 FMAs, so a CPU of either kind tests them. */
Test(bf16, attention_on_the_dot_product_tiles_when_asked_against_float64) {
    if (mw__isa_of_cpu() != MW__ISA_AVX512_BF16) cr_skip_test("the CPU has no AVX512-BF16, or AMX");
    if (!mw__cpu_device.attention_prepare)
        cr_skip_test("built without oneDNN: the f32 kernel runs");
    setenv("MESHWIT_CPU_ISA", "avx512_bf16", 1);
    cr_assert(mw__cpu_bf16_native(NULL));
    attention_against_float64(NULL, "dot-product tiles", 40);
}

/* With no cap, bf16 products run on AVX512-BF16 exactly where its dot products multiply at least
 * MW__BF16_DOT_PAYS times as fast as f32 FMAs (measured: 2 on Zen 4 and 5, 0.5 on the Intel Xeon
 * without AMX); the ratio is measured once, so asking again gives the same answer. */
Test(bf16, bf16_instructions_where_they_pay) {
    double r = mw__isa_bf16_dot_ratio();
    mw__isa have = mw__isa_of_cpu();
    if (have == MW__ISA_AVX512_BF16) {
        cr_assert(r > 0.05 && r < 20, "ratio %g", r);
        cr_assert_eq(mw__isa_bf16_dot_pays(), r >= MW__BF16_DOT_PAYS);
    } else {
        cr_assert_eq(r, -1.0);
        cr_assert_eq(mw__isa_bf16_dot_pays(), have == MW__ISA_AMX);
    }
    cr_assert_eq(mw__isa_bf16_dot_ratio(), r);
#ifdef MESHWIT_HAVE_DNNL
    cr_assert_eq(mw__cpu_bf16_native(NULL), mw__isa_bf16_dot_pays());
    setenv("MESHWIT_CPU_ISA", "avx512_bf16", 1);
    cr_assert_eq(mw__cpu_bf16_native(NULL), have >= MW__ISA_AVX512_BF16);
    setenv("MESHWIT_CPU_ISA", "avx512", 1);
    cr_assert(!mw__cpu_bf16_native(NULL));
    unsetenv("MESHWIT_CPU_ISA");
#endif
}
