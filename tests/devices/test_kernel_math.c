/* The per-element math every backend shares (devices/math.h), checked on the host: the CUDA
 * kernels compile the same functions, so this covers their formulas without a GPU. */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "devices/cpu/cpu.h"
#include "devices/device.h"
#include "devices/math.h"
#include "tests/common/rng.h"

static double gelu_ref(double x) {
    double k = sqrt(2.0 / 3.14159265358979323846);
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}

/* Tolerance of the float derivative: 1 + t and 1 - t^2 lose everything but ulp(1) = 6e-8 where
 * tanh saturates, and that error is multiplied by 0.5 |x| du/dx; 4x that bound is ~1.7x the
 * largest error seen on a grid of 400001 points over [-10, 10]. */
static double gelu_grad_tol(double x) {
    double du = sqrt(2.0 / 3.14159265358979323846) * (1.0 + 3.0 * 0.044715 * x * x);
    return 4.0 * 6e-8 * (1.0 + 0.5 * fabs(x) * du);
}

static double gelu_grad_ref(double x) {
    double k = sqrt(2.0 / 3.14159265358979323846);
    double t = tanh(k * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

/* Points over [-10, 10] with a fine step, and a few far out where tanh saturates. */
#define NPOINTS 4001
static float point(int i) { return -10.0f + 20.0f * (float)i / (float)(NPOINTS - 1); }
static const float far_points[] = {-60.0f, -30.0f, -15.0f, 15.0f, 30.0f, 60.0f};

Test(kernel_math, gelu_matches_double_reference) {
    /* mw__tanh has an absolute error of ~1e-7 and GELU multiplies it by x/2; a few float
     * roundings add ~2 ulp of the result: |err| <= 2e-7 (1 + |x|) + 4 ulp covers both with a
     * factor ~2 to spare. */
    for (int i = 0; i < NPOINTS; i++) {
        float x = point(i);
        double ref = gelu_ref(x), got = mw__gelu(x);
        double tol = 2e-7 * (1.0 + fabs(x)) + 4.0 * FLT_EPSILON * fabs(ref);
        cr_assert(fabs(got - ref) <= tol, "gelu(%.9g) = %.9g, reference %.9g (tolerance %.3g)", x,
                  got, ref, tol);
    }
    for (size_t i = 0; i < sizeof far_points / sizeof *far_points; i++) {
        float x = far_points[i];
        double ref = gelu_ref(x), got = mw__gelu(x);
        cr_assert(fabs(got - ref) <= 4.0 * FLT_EPSILON * fabs(ref) + 1e-30,
                  "gelu(%g) = %.9g, reference %.9g", x, got, ref);
    }
    cr_assert_eq(mw__gelu(0.0f), 0.0f);
}

Test(kernel_math, gelu_grad_matches_double_reference) {
    for (int i = 0; i < NPOINTS; i++) {
        float x = point(i);
        double ref = gelu_grad_ref(x), got = mw__gelu_grad(x), tol = gelu_grad_tol(x);
        cr_assert(fabs(got - ref) <= tol, "gelu'(%.9g) = %.9g, reference %.9g (tolerance %.3g)", x,
                  got, ref, tol);
    }
    cr_assert_float_eq(mw__gelu_grad(0.0f), 0.5f, 1e-7);
    cr_assert_float_eq(mw__gelu_grad(60.0f), 1.0f, 1e-6);
    cr_assert_float_eq(mw__gelu_grad(-60.0f), 0.0f, 1e-6);
}

Test(kernel_math, gelu_grad_matches_finite_differences) {
    /* Central differences of the double reference with h = 1e-4 have a truncation error of
     * h^2 |f'''| / 6 < 1e-8 and a rounding error ~1e-12: the float derivative must agree to its
     * own tolerance (above) plus 1e-8. */
    const double h = 1e-4;
    for (int i = 0; i < NPOINTS; i += 3) {
        float x = point(i);
        double fd = (gelu_ref((double)x + h) - gelu_ref((double)x - h)) / (2.0 * h);
        double got = mw__gelu_grad(x);
        cr_assert(fabs(got - fd) <= gelu_grad_tol(x) + 1e-8,
                  "gelu'(%.9g) = %.9g, finite difference %.9g", x, got, fd);
    }
    /* The float pair agree with each other: differences of mw__gelu itself, h = 1e-2, carry a
     * truncation error < 1e-5 and a rounding error of ~2 ulp(gelu) / 2h < 1e-4 over [-10, 10]. */
    const float hf = 1e-2f;
    for (int i = 0; i < NPOINTS; i += 7) {
        float x = point(i);
        double fd = ((double)mw__gelu(x + hf) - (double)mw__gelu(x - hf)) / (2.0 * hf);
        double got = mw__gelu_grad(x);
        cr_assert(fabs(got - fd) <= 2e-4, "gelu'(%.9g) = %.9g, float finite difference %.9g", x,
                  got, fd);
    }
}

/* The CPU backend's GELU kernels (vector code, with their own copy of the exponential) against
 * the double references, to the tolerances above, over the grid (4001 points: the kernels' last
 * vector is partial), the far points, and NaN and +Inf. gy = 1 + x / 20 checks the product
 * with the incoming gradient (exact to 1 ulp more). */
Test(kernel_math, cpu_gelu_kernels_match_reference) {
    enum { NFAR = sizeof far_points / sizeof *far_points, N = NPOINTS + NFAR + 2 };
    static float x[N], gy[N], y[N], dx[N];
    for (int i = 0; i < N; i++)
        x[i] = i < NPOINTS ? point(i) : i < NPOINTS + NFAR ? far_points[i - NPOINTS] : 0.0f;
    x[N - 2] = NAN;
    x[N - 1] = INFINITY;
    for (int i = 0; i < N; i++) gy[i] = 1.0f + x[i] / 20.0f;
    mw__k_unary u = {.count = N, .out = y, .a = x};
    mw__k_unary_grad g = {.count = N, .out = dx, .gy = gy, .x = x};
    cr_assert_eq(mw__cpu_device.unary(NULL, &u), MW_OK);
    cr_assert_eq(mw__cpu_device.unary_grad(NULL, &g), MW_OK);
    for (int i = 0; i < N - 2; i++) {
        double ref = gelu_ref(x[i]),
               tol = 2e-7 * (1.0 + fabs(x[i])) + 4.0 * FLT_EPSILON * fabs(ref);
        cr_assert(fabs(y[i] - ref) <= tol, "gelu kernel(%.9g) = %.9g, reference %.9g", x[i], y[i],
                  ref);
        double gref = gy[i] * gelu_grad_ref(x[i]);
        double gtol = fabs(gy[i]) * gelu_grad_tol(x[i]) + FLT_EPSILON * fabs(gref);
        cr_assert(fabs(dx[i] - gref) <= gtol, "gelu' kernel(%.9g) = %.9g, reference %.9g", x[i],
                  dx[i], gref);
    }
    cr_assert(isnan(y[N - 2]) && isnan(dx[N - 2]));
    cr_assert(isinf(y[N - 1]) && y[N - 1] > 0);
}

/* One AdamW step in double, as device.h states it. */
static double adamw_ref(double p, double g, double *m, double *v, double lr, double b1, double b2,
                        double eps, double wd, int t) {
    *m = b1 * *m + (1.0 - b1) * g;
    *v = b2 * *v + (1.0 - b2) * g * g;
    double mhat = *m / (1.0 - pow(b1, t)), vhat = *v / (1.0 - pow(b2, t));
    return p - lr * (mhat / (sqrt(vhat) + eps) + wd * p);
}

Test(kernel_math, adamw_matches_hand_computed_steps) {
    /* p = 1, lr 0.1, betas 0.9 / 0.999, eps 1e-8, weight decay 0.01.
     * Step 1, g = 0.5: m = 0.05, v = 0.00025, m/bias1 = 0.5, v/bias2 = 0.25, sqrt = 0.5,
     *   p = 1 - 0.1 * (0.5 / (0.5 + 1e-8) + 0.01 * 1) = 0.899000002.
     * Step 2, g = -0.25: m = 0.045 - 0.025 = 0.02, v = 0.00024975 + 0.0000625 = 0.00031225,
     *   bias1 = 0.19, bias2 = 0.001999, m/bias1 = 0.105263158, sqrt(v/bias2) = 0.395225381,
     *   p = 0.899000002 - 0.1 * (0.266337284 + 0.00899000002) = 0.871467299.
     * Float keeps ~7 digits through a handful of operations: 1e-6 relative; except v, whose
     * factor 1 - 0.999f is 1.0000467e-3 (0.999 is not a float): 1e-4 relative. The same factor
     * divides v again through bias2, so p does not see it. */
    float p = 1.0f, m = 0.0f, v = 0.0f;
    float b1 = 0.9f, b2 = 0.999f;
    p = mw__adamw_update(p, 0.5f, &m, &v, 0.1f, b1, b2, 1e-8f, 0.01f, 1.0f - b1, 1.0f - b2);
    cr_assert_float_eq(m, 0.05f, 0.05 * 1e-6);
    cr_assert_float_eq(v, 0.00025f, 0.00025 * 1e-4);
    cr_assert_float_eq(p, 0.899000002f, 1e-6);
    p = mw__adamw_update(p, -0.25f, &m, &v, 0.1f, b1, b2, 1e-8f, 0.01f, 1.0f - b1 * b1,
                         1.0f - b2 * b2);
    cr_assert_float_eq(m, 0.02f, 0.02 * 1e-6);
    cr_assert_float_eq(v, 0.00031225f, 0.00031225 * 1e-4);
    cr_assert_float_eq(p, 0.871467299f, 1e-6);
}

static uint64_t rng_state = 0x243f6a8885a308d3u;
static double uniform(double lo, double hi) { return rng_range(rng_lcg64(&rng_state), lo, hi); }

Test(kernel_math, adamw_tracks_double_reference_over_steps) {
    /* Ten steps on random parameters and gradients, the float state carried across steps as a
     * kernel does. Each step adds a few float roundings of the update (|update| <= lr * (~1 +
     * wd |p|)) and of p, so after ten steps |p - ref| <= 1e-5 (1 + |ref|) with room to spare. */
    const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    for (int trial = 0; trial < 200; trial++) {
        float p = (float)uniform(-2, 2), m = 0.0f, v = 0.0f;
        double pd = p, md = 0.0, vd = 0.0;
        for (int t = 1; t <= 10; t++) {
            float g = (float)uniform(-3, 3);
            float bias1 = (float)(1.0 - pow(b1, t)), bias2 = (float)(1.0 - pow(b2, t));
            p = mw__adamw_update(p, g, &m, &v, (float)lr, (float)b1, (float)b2, (float)eps,
                                 (float)wd, bias1, bias2);
            pd = adamw_ref(pd, g, &md, &vd, lr, b1, b2, eps, wd, t);
            cr_assert(fabs(p - pd) <= 1e-5 * (1.0 + fabs(pd)),
                      "trial %d step %d: p = %.9g, reference %.9g", trial, t, p, pd);
            cr_assert(fabs(m - md) <= 1e-6 * (1.0 + fabs(md)),
                      "trial %d step %d: m = %.9g, "
                      "reference %.9g",
                      trial, t, m, md);
            cr_assert(fabs(v - vd) <= 1e-6 * (1.0 + fabs(vd)),
                      "trial %d step %d: v = %.9g, "
                      "reference %.9g",
                      trial, t, v, vd);
        }
    }
}

Test(kernel_math, adamw_zero_gradient_only_decays) {
    /* With g = 0 and fresh moments the update is the weight decay alone: p (1 - lr wd). */
    float m = 0.0f, v = 0.0f;
    float p = mw__adamw_update(2.0f, 0.0f, &m, &v, 0.5f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.1f, 0.001f);
    cr_assert_eq(m, 0.0f);
    cr_assert_eq(v, 0.0f);
    cr_assert_float_eq(p, 2.0f * (1.0f - 0.05f), 1e-7);
}

Test(kernel_math, binop_codes_match_the_enum) {
    /* Kernels pass mw__binop values as the int code: the two must agree exactly. */
    cr_assert_eq(mw__binop_apply(MW__BIN_ADD, 1.5f, 0.25f), 1.75f);
    cr_assert_eq(mw__binop_apply(MW__BIN_SUB, 1.5f, 0.25f), 1.25f);
    cr_assert_eq(mw__binop_apply(MW__BIN_MUL, 1.5f, 0.25f), 0.375f);
    cr_assert_eq(mw__binop_apply(MW__BIN_DIV, 1.5f, 0.25f), 6.0f);
    for (int i = 0; i < 1000; i++) {
        float a = (float)uniform(-100, 100), b = (float)uniform(-100, 100);
        cr_assert_eq(mw__binop_apply(MW__BIN_ADD, a, b), a + b);
        cr_assert_eq(mw__binop_apply(MW__BIN_SUB, a, b), a - b);
        cr_assert_eq(mw__binop_apply(MW__BIN_MUL, a, b), a * b);
        cr_assert_eq(mw__binop_apply(MW__BIN_DIV, a, b), a / b);
    }
    /* IEEE special cases go through unchanged. */
    cr_assert(isinf(mw__binop_apply(MW__BIN_DIV, 1.0f, 0.0f)));
    cr_assert(isnan(mw__binop_apply(MW__BIN_DIV, 0.0f, 0.0f)));
    cr_assert(isnan(mw__binop_apply(MW__BIN_SUB, INFINITY, INFINITY)));
}

/* mw__expf against libm in double: the degree-6 polynomial on |r| <= ln2/2 leaves ~1e-7 relative,
 * and the reduction and the final scaling add a few roundings; 4e-7 relative is ~2x the largest
 * error seen on this grid. Below -87 the result is clamped to e^-87 (a tiny positive number, as
 * documented), above 88 to e^88. */
Test(kernel_math, expf_matches_double_reference) {
    for (int i = 0; i <= 200000; i++) {
        float x = -87.0f + 175.0f * (float)i / 200000.0f;
        double ref = exp((double)x), got = mw__expf(x);
        cr_assert(fabs(got - ref) <= 4e-7 * ref, "expf(%.9g) = %.9g, reference %.9g", x, got, ref);
    }
    cr_assert_eq(mw__expf(-1000.0f), mw__expf(-87.0f));
    cr_assert_eq(mw__expf(1000.0f), mw__expf(88.0f));
    cr_assert(mw__expf(0.0f) == 1.0f);
}

/* Non-finite inputs give their IEEE answers and no undefined behaviour (the sanitizer build runs
 * this): NaN stays NaN through exp, tanh and GELU, and the infinities saturate. */
Test(kernel_math, non_finite_inputs) {
    cr_assert(isnan(mw__expf(NAN)));
    cr_assert(isnan(mw__tanh(NAN)));
    cr_assert(isnan(mw__gelu(NAN)));
    cr_assert(isnan(mw__gelu_grad(NAN)));
    cr_assert_eq(mw__expf(-INFINITY), mw__expf(-87.0f));
    cr_assert_eq(mw__tanh(INFINITY), 1.0f);
    cr_assert_eq(mw__tanh(-INFINITY), -1.0f);
    cr_assert(isinf(mw__gelu(INFINITY)) && mw__gelu(INFINITY) > 0);
}

/* The CPU backend's sum of squares (the gradient norm of clipping): exact integer bins. */
static void sumsq(const float *a, int64_t n, mw__sqacc *acc, int zero) {
    mw__k_sumsq k = {.count = n, .out = acc, .a = a, .zero = zero};
    cr_assert_eq(mw__cpu_device.sumsq(NULL, &k), MW_OK);
}

/* Lengths that end inside and on a group of lanes: squares exact in double and a sum of at most
 * 21 of them, so the value is the double sum exactly. */
Test(kernel_math, sumsq_every_element_counts) {
    float a[21];
    mw__sqacc acc;
    for (int n = 1; n <= 21; n++) {
        double ref = 0;
        for (int i = 0; i < n; i++) {
            a[i] = 0.5f + (float)i * 0.25f;
            ref += (double)a[i] * a[i];
        }
        memset(&acc, 0xA5, sizeof acc); /* zero clears whatever was there */
        sumsq(a, n, &acc, 1);
        cr_assert_eq(mw__sqacc_value(&acc), ref, "n = %d: %.17g, reference %.17g", n,
                     mw__sqacc_value(&acc), ref);
    }
}

static uint64_t sq_rng = 88172645463325252ull;
static uint32_t sq_next(void) {
    sq_rng ^= sq_rng << 13;
    sq_rng ^= sq_rng >> 7;
    sq_rng ^= sq_rng << 17;
    return (uint32_t)(sq_rng >> 16);
}

/* The accumulator of values added one at a time by exponent bins (mw__sqacc_add_square). */
static void sumsq_ref(const float *a, int64_t n, mw__sqacc *acc) {
    memset(acc, 0, sizeof *acc);
    for (int64_t i = 0; i < n; i++) mw__sqacc_add_square(acc, a[i]);
}

/* The accumulator of a set of values has the same bits however the set is cut and ordered: the
 * whole array at once, the array reversed, random pieces (across the kernel's blocks) added in a
 * random order into one accumulator or into several then added, and the values one at a time by
 * exponent bins, the GPU's way. Values of every exponent, subnormals and zeros included; the value
 * within 1e-15 of a long double sum of the sorted squares. */
Test(kernel_math, sumsq_same_bits_however_split) {
    enum { N = 200003 };
    static float a[N], rev[N];
    long double ref = 0;
    for (int i = 0; i < N; i++) {
        uint32_t b = sq_next();
        int kind = i % 5;
        if (kind == 0) b = (b & 0x807fffffu) | (((sq_next() % 60u) + 100u) << 23); /* ~1e-8..1e8 */
        if (kind == 1) b &= 0x807fffffu;                                           /* subnormal */
        if (kind == 2) b = (b & 0x807fffffu) | (127u << 23);                       /* [1, 2) */
        if (kind == 3) b = (b & 0x807fffffu) | (((sq_next() % 250u) + 2u) << 23);  /* any */
        if (kind == 4) b = i % 7 ? (b & 0x807fffffu) | (126u << 23) : 0; /* [0.5, 1), zeros */
        memcpy(&a[i], &b, sizeof b);
        rev[N - 1 - i] = a[i];
    }
    /* The reference: the squares, each exact in long double, summed smallest first. */
    static long double sq[N];
    for (int i = 0; i < N; i++) sq[i] = (long double)a[i] * a[i];
    for (int gap = N / 2; gap > 0; gap /= 2) /* a shell sort */
        for (int i = gap; i < N; i++)
            for (int j = i; j >= gap && sq[j - gap] > sq[j]; j -= gap) {
                long double t = sq[j];
                sq[j] = sq[j - gap];
                sq[j - gap] = t;
            }
    for (int i = 0; i < N; i++) ref += sq[i];

    mw__sqacc whole, back, pieces, merged, part, bins;
    sumsq(a, N, &whole, 1);
    sumsq(rev, N, &back, 1);
    cr_assert(memcmp(&whole, &back, sizeof whole) == 0, "reversed: other bits");
    sumsq_ref(a, N, &bins);
    cr_assert(memcmp(&whole, &bins, sizeof whole) == 0, "exponent bins: other bits");
    /* Random cuts, visited in a shuffled order. */
    int cut[64], ncut = 0, order[64];
    cut[ncut++] = 0;
    while (ncut < 63) {
        int c = cut[ncut - 1] + 1 + (int)(sq_next() % 9000u);
        if (ncut % 9 == 0) c = cut[ncut - 1] + 65536 + (int)(sq_next() % 3u); /* a long piece */
        if (c >= N) break;
        cut[ncut++] = c;
    }
    cut[ncut] = N;
    for (int i = 0; i < ncut; i++) order[i] = i;
    for (int i = ncut - 1; i > 0; i--) {
        int j = (int)(sq_next() % (uint32_t)(i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    memset(&merged, 0, sizeof merged);
    for (int i = 0; i < ncut; i++) {
        int p = order[i];
        sumsq(a + cut[p], cut[p + 1] - cut[p], &pieces, i == 0);
        sumsq(a + cut[p], cut[p + 1] - cut[p], &part, 1);
        mw__sqacc_add(&merged, &part);
    }
    cr_assert(memcmp(&whole, &pieces, sizeof whole) == 0, "%d pieces: other bits", ncut);
    cr_assert(memcmp(&whole, &merged, sizeof whole) == 0, "merged accumulators: other bits");
    double v = mw__sqacc_value(&whole);
    cr_assert(fabsl((long double)v - ref) <= 1e-15L * ref, "%.17g, reference %.17Lg", v, ref);
}

/* The extremes in one block, so that every chunk of the cut is used: the smallest subnormal (its
 * square 2^-298), FLT_MAX (its square near 2^256) and values between; and a long run of the
 * largest significand of one exponent, whose squares carry through the words. Both against the
 * exponent bins, and the run's value against its double product. */
Test(kernel_math, sumsq_extremes_and_carries) {
    float ext[40];
    for (int i = 0; i < 40; i++) ext[i] = ldexpf(1.0f + (float)i / 64.0f, -149 + 7 * i);
    ext[0] = 0x1p-149f;
    ext[39] = FLT_MAX;
    ext[20] = -ext[20];
    mw__sqacc got, want;
    sumsq(ext, 40, &got, 1);
    sumsq_ref(ext, 40, &want);
    cr_assert(memcmp(&got, &want, sizeof got) == 0, "extremes: other bits");
    sumsq(ext, 1, &got, 1);
    sumsq_ref(ext, 1, &want);
    cr_assert(memcmp(&got, &want, sizeof got) == 0, "the smallest subnormal: other bits");
    cr_assert_eq(mw__sqacc_value(&got), 0x1p-298, "%a", mw__sqacc_value(&got));

    enum { N = 1 << 20 };
    float *a = malloc(N * sizeof *a);
    cr_assert_not_null(a);
    float x = 1.99999988f; /* (2^24 - 1) 2^-23 */
    for (int i = 0; i < N; i++) a[i] = x;
    mw__sqacc acc, half, two, ref;
    sumsq(a, N, &acc, 1);
    sumsq_ref(a, N, &ref);
    cr_assert(memcmp(&acc, &ref, sizeof acc) == 0, "a run of one value: other bits");
    sumsq(a, N / 2, &half, 1);
    memcpy(&two, &half, sizeof two);
    mw__sqacc_add(&two, &half);
    cr_assert(memcmp(&two, &acc, sizeof acc) == 0, "two halves added: other bits");
    double want_v = (double)x * x * N;
    cr_assert(fabs(mw__sqacc_value(&acc) - want_v) <= 4 * DBL_EPSILON * want_v, "%.17g vs %.17g",
              mw__sqacc_value(&acc), want_v);
    free(a);
}

/* A NaN anywhere makes the value NaN, an infinity (and no NaN) infinite; both are counted, and
 * the finite values still summed exactly. */
Test(kernel_math, sumsq_nan_and_infinity) {
    static float a[70000], finite[70000];
    for (int i = 0; i < 70000; i++) a[i] = 0.25f + (float)(i % 13) * 0.125f;
    mw__sqacc acc, ref;
    a[69999] = -INFINITY;
    a[3] = INFINITY;
    sumsq(a, 70000, &acc, 1);
    cr_assert(isinf(mw__sqacc_value(&acc)) && mw__sqacc_value(&acc) > 0);
    cr_assert_eq(acc.inf, 2);
    cr_assert_eq(acc.nan, 0);
    a[65536] = NAN;
    sumsq(a, 70000, &acc, 1);
    cr_assert(isnan(mw__sqacc_value(&acc)));
    cr_assert_eq(acc.nan, 1);
    int n = 0;
    for (int i = 0; i < 70000; i++)
        if (isfinite(a[i])) finite[n++] = a[i];
    sumsq_ref(finite, n, &ref);
    cr_assert(memcmp(acc.w, ref.w, sizeof acc.w) == 0, "the finite values' sum");
}

/* The binary kernel in place (a plan writes an op over an input of its own layout that dies with
 * it): out == a and out == b give the bits of a separate output, for every op, with the other
 * operand whole or broadcast along the rows. */
Test(kernel_math, binary_in_place_equals_out_of_place) {
    enum { R = 7, C = 37 };
    float a[R * C], b[R * C], row[C], want[R * C], got[R * C];
    for (int i = 0; i < R * C; i++)
        a[i] = 0.5f + (float)(i % 11) * 0.37f, b[i] = 1.25f - (float)(i % 5) * 0.3f;
    for (int j = 0; j < C; j++) row[j] = 0.75f + (float)j * 0.01f;
    for (int op = MW__BIN_ADD; op <= MW__BIN_DIV; op++)
        for (int bcast = 0; bcast < 2; bcast++)
            for (int side = 0; side < 2; side++) {
                const float *other = bcast ? row : b;
                mw__nd nd = {.rank = 2, .dims = {R, C}};
                int64_t so[2] = {C, 1}, sw[2] = {C, 1}, sb[2] = {bcast ? 0 : C, 1};
                /* side 0: out is a (a whole, b maybe broadcast); side 1: out is b */
                for (int d = 0; d < 2; d++) {
                    nd.stride[0][d] = so[d];
                    nd.stride[1][d] = side ? sb[d] : sw[d];
                    nd.stride[2][d] = side ? sw[d] : sb[d];
                }
                const float *x = side ? other : a, *y = side ? a : other;
                mw__k_binary k = {.op = (mw__binop)op, .nd = nd, .out = want, .a = x, .b = y};
                cr_assert_eq(mw__cpu_device.binary(NULL, &k), MW_OK);
                memcpy(got, a, sizeof got);
                k.out = got;
                if (side)
                    k.b = got;
                else
                    k.a = got;
                cr_assert_eq(mw__cpu_device.binary(NULL, &k), MW_OK);
                cr_assert(memcmp(got, want, sizeof got) == 0, "op %d, broadcast %d, side %d", op,
                          bcast, side);
            }
}
