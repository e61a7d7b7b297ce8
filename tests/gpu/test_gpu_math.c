/* The CUDA kernels of the math ops (the maps and dropout in
 * devices/cuda/elementwise.cu, max and argmax in reduce.cu, SGD with momentum in optim.cu) against
 * the CPU kernels, on random inputs: elementwise functions and their gradients within 4 ulp (CUDA's
 * tanhf/expf/logf differ from glibc's by up to 2 ulp each), dropout, max and argmax bit for bit
 * (dropout's mask is the same integer hash on both), SGD with momentum within 2 ulp (the GPU
 * fuses multiply-adds). Skipped with a message where there is no GPU. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "devices/cpu/cpu.h"
#include "devices/device.h"

#ifndef MESHWIT_HAVE_CUDA

Test(gpu_math, cuda_kernels) {
    cr_skip("no CUDA device: this build of meshwit has no CUDA backend");
}

#else

#include "devices/cpu/cpu_kernels.h"
#include "devices/cuda/cuda.h"
#include "devices/cuda/cuda_kernels.h"
#include "devices/math.h"

static mw__device gpu, host = {.vt = &mw__cpu_device, .name = "cpu:0"};

static void need_gpu(void) {
    if (mw__cuda_device_count() == 0)
        cr_skip("no CUDA device: mw__cuda_device_count() is 0, so the GPU tests are skipped");
    memset(&gpu, 0, sizeof gpu);
    gpu.vt = &mw__cuda_device;
    snprintf(gpu.name, sizeof gpu.name, "cuda:0");
    cr_assert_eq(gpu.vt->init(&gpu), MW_OK, "%s", mw_last_error());
}

static void finish(void) {
    if (gpu.impl) gpu.vt->shutdown(&gpu);
}

TestSuite(gpu_math, .fini = finish);

static float *to_gpu(const float *h, int64_t n) {
    void *d;
    cr_assert_eq(gpu.vt->alloc(&gpu, (size_t)n * 4, &d), MW_OK);
    cr_assert_eq(gpu.vt->upload(&gpu, d, h, (size_t)n * 4), MW_OK);
    return d;
}

static void from_gpu(float *h, const float *d, int64_t n) {
    cr_assert_eq(gpu.vt->sync(&gpu), MW_OK, "%s", mw_last_error());
    cr_assert_eq(gpu.vt->download(&gpu, h, d, (size_t)n * 4), MW_OK);
}

static void near_ulp(const float *a, const float *b, int64_t n, int ulps, const char *what) {
    for (int64_t i = 0; i < n; i++) {
        if (a[i] == b[i] || (isnan(a[i]) && isnan(b[i]))) continue;
        float tol = ulps * (nextafterf(fabsf(a[i]), INFINITY) - fabsf(a[i]));
        cr_assert(fabsf(a[i] - b[i]) <= tol, "%s[%lld]: cpu %.9g, cuda %.9g", what, (long long)i,
                  a[i], b[i]);
    }
}

#define N 4099

static float *randoms(double lo, double hi, uint64_t seed) {
    float *p = malloc(N * sizeof *p);
    for (int i = 0; i < N; i++)
        p[i] = (float)(lo + (hi - lo) * (double)(mw__mix64(seed + i) >> 11) * 0x1p-53);
    return p;
}

Test(gpu_math, map_and_gradient) {
    need_gpu();
    float *x = randoms(0.1, 3, 1), *gy = randoms(-1, 1, 2), *cpu = malloc(N * 4),
          *out = malloc(N * 4);
    for (int i = 0; i < N; i += 3) x[i] = -x[i]; /* negatives for all but log and sqrt */
    float *dx = to_gpu(x, N), *dgy = to_gpu(gy, N), *dout = to_gpu(x, N);
    for (int fn = MW__F_RELU; fn <= MW__F_NE0; fn++) {
        for (int grad = 0; grad < 2; grad++) {
            mw__k_map m = {.fn = fn, .count = N, .out = cpu, .a = x};
            mw__k_map_grad mg = {.fn = fn, .count = N, .out = cpu, .x = x, .gy = gy};
            cr_assert_eq(grad ? mw__cpu_map_grad(&host, &mg) : mw__cpu_map(&host, &m), MW_OK);
            m.out = mg.out = dout, m.a = mg.x = dx, mg.gy = dgy;
            cr_assert_eq(grad ? mw__cuda_map_grad(&gpu, &mg) : mw__cuda_map(&gpu, &m), MW_OK, "%s",
                         mw_last_error());
            from_gpu(out, dout, N);
            near_ulp(cpu, out, N, 4, grad ? "map gradient" : "map");
        }
    }
    free(x), free(gy), free(cpu), free(out);
}

Test(gpu_math, dropout_max_argmax_bitwise) {
    need_gpu();
    float *x = randoms(-2, 2, 3), *cpu = malloc(N * 4), *out = malloc(N * 4);
    float *dx = to_gpu(x, N), *dout = to_gpu(x, N);
    /* Dropout on the box rows [5, 5 + 241) of a global [300, 17] tensor (241 * 17 = 4097). */
    mw__k_dropout k = {.count = 241 * 17,
                       .rank = 2,
                       .len = {241, 17},
                       .lo = {5, 0},
                       .gstride = {17, 1},
                       .p = 0.3f,
                       .seed = 9,
                       .step = 4,
                       .active = 1};
    k.out = cpu, k.a = x;
    cr_assert_eq(mw__cpu_dropout(&host, &k), MW_OK);
    k.out = dout, k.a = dx;
    cr_assert_eq(mw__cuda_dropout(&gpu, &k), MW_OK, "%s", mw_last_error());
    from_gpu(out, dout, k.count);
    cr_assert(memcmp(cpu, out, (size_t)k.count * 4) == 0, "dropout differs");
    for (int arg = 0; arg < 2; arg++) {
        mw__k_max r = {.outer = 7, .n = 97, .inner = 6};
        x[3] = x[3 + 6]; /* a tie: the first index wins on both */
        x[20] = NAN;
        cr_assert_eq(gpu.vt->upload(&gpu, dx, x, N * 4), MW_OK);
        r.out = cpu, r.a = x;
        cr_assert_eq((arg ? mw__cpu_argmax : mw__cpu_reduce_max)(&host, &r), MW_OK);
        r.out = dout, r.a = dx;
        cr_assert_eq((arg ? mw__cuda_argmax : mw__cuda_reduce_max)(&gpu, &r), MW_OK, "%s",
                     mw_last_error());
        from_gpu(out, dout, 42);
        cr_assert(memcmp(cpu, out, 42 * 4) == 0, "%s differs", arg ? "argmax" : "max");
    }
    free(x), free(cpu), free(out);
}

Test(gpu_math, sgd_momentum) {
    need_gpu();
    float *p = randoms(-1, 1, 5), *g = randoms(-1, 1, 6), *b = randoms(-1, 1, 7);
    float *pc = malloc(N * 4), *bc = malloc(N * 4), *out = malloc(N * 4);
    memcpy(pc, p, N * 4);
    memcpy(bc, b, N * 4);
    float *dp = to_gpu(p, N), *dg = to_gpu(g, N), *db = to_gpu(b, N);
    mw__k_sgd_momentum k = {.count = N,
                            .lr = 0.1f,
                            .momentum = 0.9f,
                            .weight_decay = 0.01f,
                            .grad_scale = 0.5f,
                            .nesterov = 1};
    k.p = pc, k.buf = bc, k.g = g;
    cr_assert_eq(mw__cpu_sgd_momentum(&host, &k), MW_OK);
    k.p = dp, k.buf = db, k.g = dg;
    cr_assert_eq(mw__cuda_sgd_momentum(&gpu, &k), MW_OK, "%s", mw_last_error());
    from_gpu(out, dp, N);
    near_ulp(pc, out, N, 2, "parameter");
    from_gpu(out, db, N);
    near_ulp(bc, out, N, 2, "momentum buffer");
    free(p), free(g), free(b), free(pc), free(bc), free(out);
}

#endif
