/* The CUDA attention kernels against the CPU backend's (suite gpu_attention). Skipped, visibly,
 * without a GPU; MESHWIT_REQUIRE_GPU=1 turns the skip into a failure (main.c's gate).
 *
 *   - L = sum(attention(qkv * w) * r) on cuda:0 and on cpu:1, small (several query blocks, batch
 *     and head axes): the output and the gradient of w, and the GPU result repeated bit for bit;
 *   - GPT-2 124M's attention, T = 1024 and 12 heads of 64, causal and not, in f32 and in bf16
 *     (trainer precision bf16: q, k, v and the output rounded to bf16 on both sides): the output
 *     and d(qkv) of L = sum(dot(attention(x * w), r)) with w = 1 of x's shape, so d w = x d(qkv);
 *   - cached attention (inference) over a cache of 1024 positions, 12 heads, f32 values and
 *     values of bf16;
 *   - the tensor-core kernels (MESHWIT_CUDA_ATTENTION=tensor) at GPT-2 124M's shapes and with
 *     grouped queries over a sequence that ends inside a tile, in bf16, named on the kernels line;
 *   - no rows or no slices: nothing launched, nothing failed.
 *
 * Tolerances at T = 1024 come from the sums' lengths: two float evaluations of a sum of n terms
 * differ by at most 2 (n - 1) eps sum |term|, and an error e in a score moves its probability by
 * a factor e^e. A score's D products differ by at most 2 D eps scale sum |q k|, and the
 * probabilities then by that plus the 2 n eps of their normalisation, relatively. Each result
 * is held to (4 (n + D smax) + 64) eps times the sum of its terms' magnitudes (mag, computed here
 * in double; smax the largest scale sum |q k|): the errors of the terms and of their sum, with a
 * factor 2 to spare. In bf16 both sides read the same bf16 values and compute in f32, so the
 * same bound holds, plus one bf16 ulp (at most 2^-7 relative: two roundings of nearly equal
 * values may fall either side of a midpoint) where the result is stored in bf16. */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devices/device.h"
#include "devices/math.h"
#include "meshwit.h"
#include "tests/common/rng.h"

#ifdef MESHWIT_HAVE_CUDA

#include "devices/cpu/cpu.h"
#include "devices/cuda/cuda.h"
#include "devices/cuda/cuda_kernels.h"
#include "gpu_test.h"

TestSuite(gpu_attention, .description = "CUDA attention vs the CPU backend", .timeout = 240);

/* --- small shapes: the gradient of a shared weight ---------------------------------------------
 */

enum { B = 2, T = 130, H = 2, D = 32 };
#define NQ ((int64_t)B * T * 3 * H * D)
#define NO (NQ / 3)
#define NW (3 * H * D)

static void run(const char *devices, int causal, const float *qkv, const float *r, float *out,
                float *grad) {
    mw_graph *g;
    OK(mw_graph_new(&g));
    mw_tensor *x =
        mw_input(g, "x", MW_F32,
                 MW_AXES({"Batch", B}, {"Seq", T}, {"Part", 3}, {"Head", H}, {"HeadDim", D}));
    mw_tensor *rr =
        mw_input(g, "r", MW_F32, MW_AXES({"Batch", B}, {"Seq", T}, {"Head", H}, {"HeadDim", D}));
    mw_tensor *w =
        mw_param(g, "w", MW_AXES({"Part", 3}, {"Head", H}, {"HeadDim", D}), MW_INIT_CONST(1.0f));
    mw_tensor *y = mw_attention(g, mw_mul(g, x, w), "Part", "Seq", "HeadDim", causal, 0.125f);
    mw_tensor *loss = mw_sum(g, mw_mul(g, y, rr), NULL);
    mw_tensor *outs[1] = {y};
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.0f}, .outputs = outs, .noutputs = 1};
    mw_mesh *mesh;
    mw_trainer *tr;
    OK(mw_mesh_new(devices, "X", &mesh));
    OK(mw_trainer_new(g, loss, mesh, &cfg, &tr));
    mw_feed feeds[2] = {{"x", qkv, NQ}, {"r", r, NO}};
    float l;
    OK(mw_trainer_compute_grads(tr, feeds, 2, &l));
    OK(mw_trainer_read_output(tr, y, out, NO));
    OK(mw_trainer_read_grad(tr, "w", grad, NW));
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

/* Both sides sum at most T products of O(1) values in float, in different orders: a few hundred
 * ULPs of the magnitudes involved; 1e-5 absolute + 1e-4 relative (outputs) and 1e-4 of the sum of
 * magnitudes (gradients, summed over B x T rows) are well above that and far below any bug. */
static void compare(int causal) {
    need_gpu();
    float *qkv = malloc(sizeof(float) * NQ), *r = malloc(sizeof(float) * NO);
    float *oc = malloc(sizeof(float) * NO), *og = malloc(sizeof(float) * NO);
    float gc[NW], gg[NW], og2_grad[NW];
    float *og2 = malloc(sizeof(float) * NO);
    rng_fill(qkv, NQ, 21);
    rng_fill(r, NO, 22);
    run("cpu:1", causal, qkv, r, oc, gc);
    run("cuda:0", causal, qkv, r, og, gg);
    for (int64_t i = 0; i < NO; i++)
        cr_assert_leq(fabsf(og[i] - oc[i]), 1e-5f + 1e-4f * fabsf(oc[i]), "out[%lld]: %g vs %g",
                      (long long)i, og[i], oc[i]);
    for (int i = 0; i < NW; i++)
        cr_assert_leq(fabsf(gg[i] - gc[i]), 1e-3f * (1.0f + fabsf(gc[i])), "d w[%d]: %g vs %g", i,
                      gg[i], gc[i]);
    run("cuda:0", causal, qkv, r, og2, og2_grad);
    cr_assert_eq(memcmp(og, og2, sizeof(float) * NO), 0, "GPU output not repeatable");
    cr_assert_eq(memcmp(gg, og2_grad, sizeof gg), 0, "GPU gradient not repeatable");
    free(qkv), free(r), free(oc), free(og), free(og2);
}

Test(gpu_attention, causal) { compare(1); }

Test(gpu_attention, full) { compare(0); }

/* --- GPT-2 124M's attention: T = 1024, 12 heads of 64 ----------------------------------------- */

enum { LT = 1024, LH = 12, LD = 64 };
#define LNX ((int64_t)LT * 3 * LH * LD)
#define LNY ((int64_t)LT * LH * LD)
#define LSCALE 0.125f

static int64_t xat(int64_t t, int part, int64_t h, int64_t e) {
    return ((t * 3 + part) * LH + h) * LD + e;
}

/* One step of L = loss on devices, in precision, at lr 0: y's value into y_out (ny), the gradient
 * of w into dw (nw), and the kernels line into kernels (when not NULL). Frees g. */
typedef struct step_io {
    const float *x, *r;
    int64_t nx, nr;
    float *y_out, *dw;
    int64_t ny, nw;
    char *kernels;
    size_t ksize;
} step_io;

static void run_step(const char *devices, mw_graph *g, mw_tensor *loss, mw_tensor *y,
                     mw_precision precision, const step_io *io) {
    mw_tensor *outs[1] = {y};
    mw_trainer_config cfg = {
        .optimizer = {MW_SGD, .lr = 0.0f}, .precision = precision, .outputs = outs, .noutputs = 1};
    mw_mesh *mesh;
    mw_trainer *tr;
    OK(mw_mesh_new(devices, "X", &mesh));
    OK(mw_trainer_new(g, loss, mesh, &cfg, &tr));
    if (io->kernels) OK(mw_trainer_kernels(tr, io->kernels, io->ksize));
    mw_feed feeds[2] = {{"x", io->x, io->nx}, {"r", io->r, io->nr}};
    float l;
    OK(mw_trainer_compute_grads(tr, feeds, 2, &l));
    OK(mw_trainer_read_output(tr, y, io->y_out, io->ny));
    OK(mw_trainer_read_grad(tr, "w", io->dw, io->nw));
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

/* y = attention(x * w) and d w (= x d(qkv)) of L = sum(dot(y, r)) on devices, in precision. */
static void run_large(const char *devices, int causal, mw_precision precision, const float *x,
                      const float *r, float *y_out, float *dw, char *kernels, size_t ksize) {
    mw_graph *g;
    OK(mw_graph_new(&g));
    mw_tensor *xt =
        mw_input(g, "x", MW_F32, MW_AXES({"Seq", LT}, {"Part", 3}, {"Head", LH}, {"HeadDim", LD}));
    mw_tensor *rt = mw_input(g, "r", MW_F32, MW_AXES({"Seq", LT}, {"Head", LH}, {"HeadDim", LD}));
    mw_tensor *w =
        mw_param(g, "w", MW_AXES({"Seq", LT}, {"Part", 3}, {"Head", LH}, {"HeadDim", LD}),
                 MW_INIT_CONST(1.0f));
    mw_tensor *y = mw_attention(g, mw_mul(g, xt, w), "Part", "Seq", "HeadDim", causal, LSCALE);
    mw_tensor *loss = mw_sum(g, mw_dot(g, y, rt, "HeadDim"), NULL);
    step_io io = {x, r, LNX, LNY, y_out, dw, LNY, LNX, kernels, ksize};
    run_step(devices, g, loss, y, precision, &io);
}

/* The magnitudes the bounds scale with, in double from q, k, v = x and gy = r: per output
 * element sum_j p_ij |v_j|, per d(qkv) element the sum of its terms' magnitudes (dq_i: scale
 * sum_j |ds_ij| |k_j|; dk_j: scale sum_i |ds_ij| |q_i|; dv_j: sum_i p_ij |gy_i|), and the largest
 * scale sum_e |q_e k_e| (smax). */
typedef struct mags {
    double *y, *dqkv, smax;
} mags;

static mags magnitudes(const float *x, const float *r, int causal) {
    mags m = {calloc((size_t)LNY, sizeof(double)), calloc((size_t)LNX, sizeof(double)), 0.0};
    double *p = malloc(LT * sizeof *p), *ds = malloc(LT * sizeof *ds);
    for (int64_t h = 0; h < LH; h++)
        for (int64_t i = 0; i < LT; i++) {
            int64_t n = causal ? i + 1 : LT;
            double mx = -INFINITY, sum = 0.0, dsum = 0.0;
            for (int64_t j = 0; j < n; j++) {
                double s = 0.0, a = 0.0;
                for (int64_t e = 0; e < LD; e++) {
                    double q = x[xat(i, 0, h, e)], k = x[xat(j, 1, h, e)];
                    s += q * k;
                    a += fabs(q * k);
                }
                p[j] = LSCALE * s;
                if (LSCALE * a > m.smax) m.smax = LSCALE * a;
                if (p[j] > mx) mx = p[j];
            }
            for (int64_t j = 0; j < n; j++) sum += (p[j] = exp(p[j] - mx));
            for (int64_t j = 0; j < n; j++) {
                p[j] /= sum;
                double dp = 0.0;
                for (int64_t e = 0; e < LD; e++)
                    dp += (double)r[(i * LH + h) * LD + e] * x[xat(j, 2, h, e)];
                ds[j] = dp;
                dsum += p[j] * dp;
            }
            for (int64_t j = 0; j < n; j++) {
                ds[j] = fabs(p[j] * (ds[j] - dsum));
                for (int64_t e = 0; e < LD; e++) {
                    m.y[(i * LH + h) * LD + e] += p[j] * fabs(x[xat(j, 2, h, e)]);
                    m.dqkv[xat(i, 0, h, e)] += LSCALE * ds[j] * fabs(x[xat(j, 1, h, e)]);
                    m.dqkv[xat(j, 1, h, e)] += LSCALE * ds[j] * fabs(x[xat(i, 0, h, e)]);
                    m.dqkv[xat(j, 2, h, e)] += p[j] * fabs(r[(i * LH + h) * LD + e]);
                }
            }
        }
    free(p), free(ds);
    return m;
}

/* The bound of a sum of n terms of magnitude mag, its terms from scores of D products. */
static double bound(const mags *m, int64_t n, double mag) {
    return FLT_EPSILON * mag * (4.0 * ((double)n + LD * m->smax) + 64.0);
}

/* Tolerances beyond the f32 bound: extra shares of each result's magnitudes (y_mag, d_mag) and
 * of d(qkv)'s own value (d_own); who names the GPU kernels in messages. */
typedef struct slack {
    double y_mag, d_mag, d_own;
    const char *who;
} slack;

static const slack F32_SLACK = {0.0, 0.0, FLT_EPSILON, "GPU"};

static void check_large(const mags *m, int causal, int bf16, const float *x, const float *yc,
                        const float *yg, const float *dc, const float *dg, const slack *sl);

/* f32, then bf16 (the magnitudes of bf16's roundings of x and r are those of x and r to 2^-8,
 * far inside the bounds' factor 2 to spare). */
static void compare_large(int causal) {
    need_gpu();
    float *x = malloc(LNX * sizeof *x), *r = malloc(LNY * sizeof *r);
    float *yc = malloc(LNY * sizeof *yc), *yg = malloc(LNY * sizeof *yg);
    float *dc = malloc(LNX * sizeof *dc), *dg = malloc(LNX * sizeof *dg);
    rng_fill(x, LNX, 31 + (uint64_t)causal);
    rng_fill(r, LNY, 32);
    mags m = magnitudes(x, r, causal);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        mw_precision precision = bf16 ? MW_PRECISION_BF16 : MW_PRECISION_FP32;
        run_large("cpu:1", causal, precision, x, r, yc, dc, NULL, 0);
        run_large("cuda:0", causal, precision, x, r, yg, dg, NULL, 0);
        check_large(&m, causal, bf16, x, yc, yg, dc, dg, &F32_SLACK);
    }
    free(m.y), free(m.dqkv);
    free(x), free(r), free(yc), free(yg), free(dc), free(dg);
}

static void check_large(const mags *m, int causal, int bf16, const float *x, const float *yc,
                        const float *yg, const float *dc, const float *dg, const slack *sl) {
    for (int64_t t = 0; t < LT; t++)
        for (int64_t h = 0; h < LH; h++)
            for (int64_t e = 0; e < LD; e++) {
                int64_t at = (t * LH + h) * LD + e, n = causal ? t + 1 : LT;
                double tol = bound(m, n, m->y[at]) + sl->y_mag * m->y[at] +
                             (bf16 ? ldexp(fabs(yc[at]), -7) : 0.0);
                cr_assert(fabs((double)yg[at] - yc[at]) <= tol,
                          "%s %s y[t %lld, head %lld, %lld]: %s %.9g, CPU %.9g (tolerance %.3g)",
                          causal ? "causal" : "full", bf16 ? "bf16" : "f32", (long long)t,
                          (long long)h, (long long)e, sl->who, yg[at], yc[at], tol);
            }
    /* d w = x d(qkv): the bound of d(qkv) times |x|, and the product's own rounding. dk and dv
     * of key j sum over the queries that see it (n = T - j causally). */
    for (int64_t t = 0; t < LT; t++)
        for (int part = 0; part < 3; part++)
            for (int64_t h = 0; h < LH; h++)
                for (int64_t e = 0; e < LD; e++) {
                    int64_t at = xat(t, part, h, e);
                    int64_t n = !causal ? LT : part == 0 ? t + 1 : LT - t;
                    double tol =
                        fabs(x[at]) * (bound(m, n, m->dqkv[at]) + sl->d_mag * m->dqkv[at]) +
                        sl->d_own * fabs(dc[at]);
                    cr_assert(fabs((double)dg[at] - dc[at]) <= tol + 1e-30,
                              "%s %s d%c[t %lld, head %lld, %lld]: %s %.9g, CPU %.9g "
                              "(tolerance %.3g)",
                              causal ? "causal" : "full", bf16 ? "bf16" : "f32", "qkv"[part],
                              (long long)t, (long long)h, (long long)e, sl -> who, dg[at], dc[at],
                              tol);
                }
}

/* --- the tensor-core kernels (attention_tc.cu, MESHWIT_CUDA_ATTENTION=tensor) ------------------
 *
 * They round P, dS and dO to bf16 for their products (relative 2^-9 each), so each result is
 * held to the f32 bound plus 2^-6 (outputs) or 2^-5 (d(qkv), three roundings in a term) of its
 * terms' magnitudes: a factor 4 to spare, far below a wrong mask, tile or index (errors of the
 * order of the magnitudes themselves). The kernels line must name them: a run that fell back to
 * attention.cu's kernels fails here instead of passing unchecked. */

static void tensor_env(int on) {
    if (on)
        setenv("MESHWIT_CUDA_ATTENTION", "tensor", 1);
    else
        unsetenv("MESHWIT_CUDA_ATTENTION");
}

/* Skips where the GPU cannot run them (before compute capability 8.0, or with too little shared
 * memory per block: sm_86 and sm_89 at these sizes); attention.cu's kernels run there. */
static void need_tensor_cores(int64_t d) {
    need_gpu();
    if (!mw__cuda_flash_fits(0, d))
        cr_skip_test("cuda:0 cannot run the tensor-core attention kernels at head dimension %lld",
                     (long long)d);
}

static void compare_tensor_cores(int causal) {
    need_tensor_cores(LD);
    float *x = malloc(LNX * sizeof *x), *r = malloc(LNY * sizeof *r);
    float *yc = malloc(LNY * sizeof *yc), *yg = malloc(LNY * sizeof *yg);
    float *dc = malloc(LNX * sizeof *dc), *dg = malloc(LNX * sizeof *dg);
    float *y2 = malloc(LNY * sizeof *y2), *d2 = malloc(LNX * sizeof *d2);
    char kernels[1024];
    rng_fill(x, LNX, 41 + (uint64_t)causal);
    rng_fill(r, LNY, 42);
    mags m = magnitudes(x, r, causal);
    run_large("cpu:1", causal, MW_PRECISION_BF16, x, r, yc, dc, NULL, 0);
    tensor_env(1);
    run_large("cuda:0", causal, MW_PRECISION_BF16, x, r, yg, dg, kernels, sizeof kernels);
    run_large("cuda:0", causal, MW_PRECISION_BF16, x, r, y2, d2, NULL, 0);
    tensor_env(0);
    cr_assert(strstr(kernels, "attention bf16: tensor cores") &&
                  strstr(kernels, "attention_grad bf16: tensor cores"),
              "the tensor-core kernels did not run: %s", kernels);
    const slack tc = {ldexp(1.0, -6), ldexp(1.0, -5), ldexp(1.0, -7), "tensor cores"};
    check_large(&m, causal, 1, x, yc, yg, dc, dg, &tc);
    cr_assert_eq(memcmp(yg, y2, LNY * sizeof *yg), 0, "tensor-core output not repeatable");
    cr_assert_eq(memcmp(dg, d2, LNX * sizeof *dg), 0, "tensor-core gradient not repeatable");
    free(m.y), free(m.dqkv);
    free(x), free(r), free(yc), free(yg), free(dc), free(dg), free(y2), free(d2);
}

Test(gpu_attention, tensor_cores_gpt2_124m_causal_bf16) { compare_tensor_cores(1); }

Test(gpu_attention, tensor_cores_gpt2_124m_full_bf16) { compare_tensor_cores(0); }

/* Grouped queries (2 per key/value head), a head dimension of 32 and T = 130 (tiles cut by the
 * sequence's end), causal, bf16: against the CPU, norm-wise (a wrong mask or index moves a
 * result by the order of the largest). */
enum { GB = 2, GT = 130, GH = 2, GG = 2, GD = 32 };
#define GNX ((int64_t)GB * GT * GH * (GG + 2) * GD)
#define GNY ((int64_t)GB * GT * GH * GG * GD)
#define GNW ((int64_t)GH * (GG + 2) * GD)

static void run_grouped(const char *devices, const float *x, const float *r, float *y, float *dw,
                        char *kernels, size_t ksize) {
    mw_graph *g;
    OK(mw_graph_new(&g));
    mw_tensor *xt = mw_input(
        g, "x", MW_F32,
        MW_AXES({"Batch", GB}, {"Seq", GT}, {"KvHead", GH}, {"Part", GG + 2}, {"HeadDim", GD}));
    mw_tensor *rt = mw_input(
        g, "r", MW_F32,
        MW_AXES({"Batch", GB}, {"Seq", GT}, {"KvHead", GH}, {"Group", GG}, {"HeadDim", GD}));
    mw_tensor *w = mw_param(g, "w", MW_AXES({"KvHead", GH}, {"Part", GG + 2}, {"HeadDim", GD}),
                            MW_INIT_CONST(1.0f));
    mw_tensor *yt =
        mw_attention_grouped(g, mw_mul(g, xt, w), "Part", "Group", "Seq", "HeadDim", 1, 0.25f);
    mw_tensor *loss = mw_sum(g, mw_mul(g, yt, rt), NULL);
    step_io io = {x, r, GNX, GNY, y, dw, GNY, GNW, kernels, ksize};
    run_step(devices, g, loss, yt, MW_PRECISION_BF16, &io);
}

static double max_abs(const float *v, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)v[i]));
    return m;
}

Test(gpu_attention, tensor_cores_grouped_short_sequence_bf16) {
    need_tensor_cores(GD);
    float *x = malloc(GNX * sizeof *x), *r = malloc(GNY * sizeof *r);
    float *yc = malloc(GNY * sizeof *yc), *yg = malloc(GNY * sizeof *yg);
    float dc[GNW], dg[GNW];
    char kernels[1024];
    rng_fill(x, GNX, 51);
    rng_fill(r, GNY, 52);
    run_grouped("cpu:1", x, r, yc, dc, NULL, 0);
    tensor_env(1);
    run_grouped("cuda:0", x, r, yg, dg, kernels, sizeof kernels);
    tensor_env(0);
    cr_assert(strstr(kernels, "attention bf16: tensor cores") &&
                  strstr(kernels, "attention_grad bf16: tensor cores"),
              "the tensor-core kernels did not run: %s", kernels);
    double ymax = max_abs(yc, GNY), dmax = max_abs(dc, GNW);
    for (int64_t i = 0; i < GNY; i++)
        cr_assert_leq(fabs((double)yg[i] - yc[i]), ldexp(ymax, -6), "y[%lld]: %g vs %g",
                      (long long)i, yg[i], yc[i]);
    for (int64_t i = 0; i < GNW; i++)
        cr_assert_leq(fabs((double)dg[i] - dc[i]), ldexp(dmax, -4), "d w[%lld]: %g vs %g",
                      (long long)i, dg[i], dc[i]);
    free(x), free(r), free(yc), free(yg);
}

Test(gpu_attention, gpt2_124m_causal_f32_and_bf16) { compare_large(1); }

Test(gpu_attention, gpt2_124m_full_f32_and_bf16) { compare_large(0); }

/* --- kernels called directly -------------------------------------------------------------------
 */

static mw__device cpu, gpu;

static void open_devices(void) {
    need_gpu();
    memset(&cpu, 0, sizeof cpu);
    memset(&gpu, 0, sizeof gpu);
    cpu.vt = &mw__cpu_device, gpu.vt = &mw__cuda_device;
    snprintf(cpu.name, sizeof cpu.name, "cpu:0");
    snprintf(gpu.name, sizeof gpu.name, "cuda:0");
    OK(cpu.vt->init(&cpu));
    OK(gpu.vt->init(&gpu));
}

static void close_devices(void) {
    gpu.vt->shutdown(&gpu);
    cpu.vt->shutdown(&cpu);
}

static void *to_gpu(const void *host, size_t bytes) {
    void *d = NULL;
    OK(gpu.vt->alloc(&gpu, bytes, &d));
    if (host) OK(gpu.vt->upload(&gpu, d, host, bytes));
    return d;
}

/* Rows of the cache read up to pos (one query each) over a cache of 1024 positions, 12 heads of
 * 64: the GPU's against the CPU's kernel. Scores sum D products in another order, and the
 * weighted values pos + 1 terms in the same order per feature on both: the same bound as above.
 * bf16: every value one of bf16 (a bf16 model's cache, widened). */
static void compare_cached(int bf16) {
    open_devices();
    enum { OUTER = 6, N = 1024 };
    int32_t pos[OUTER] = {0, 1, 63, 511, 700, N - 1};
    int64_t nq = (int64_t)OUTER * LH * LD, nkv = (int64_t)OUTER * N * 2 * LH * LD;
    float *q = malloc(nq * sizeof *q), *kv = malloc(nkv * sizeof *kv);
    float *oc = malloc(nq * sizeof *oc), *og = malloc(nq * sizeof *og);
    rng_fill(q, nq, 41);
    rng_fill(kv, nkv, 42);
    if (bf16) {
        for (int64_t i = 0; i < nq; i++) q[i] = mw__bf16_to_f32(mw__bf16_from_f32(q[i]));
        for (int64_t i = 0; i < nkv; i++) kv[i] = mw__bf16_to_f32(mw__bf16_from_f32(kv[i]));
    }
    mw__k_attention_cached k = {.outer = OUTER, .n = N, .heads = LH, .dim = LD, .scale = LSCALE};
    k.out = oc, k.q = q, k.kv = kv, k.pos = pos;
    OK(cpu.vt->attention_cached(&cpu, &k));
    float *gq = to_gpu(q, nq * 4), *gkv = to_gpu(kv, nkv * 4), *gout = to_gpu(NULL, nq * 4);
    int32_t *gpos = to_gpu(pos, sizeof pos);
    k.out = gout, k.q = gq, k.kv = gkv, k.pos = gpos;
    OK(gpu.vt->attention_cached(&gpu, &k));
    OK(gpu.vt->sync(&gpu));
    OK(gpu.vt->download(&gpu, og, gout, nq * 4));
    const int64_t row = 2 * LH * LD;
    for (int64_t o = 0; o < OUTER; o++)
        for (int64_t h = 0; h < LH; h++) {
            const float *qq = q + (o * LH + h) * LD, *base = kv + o * N * row + h * LD;
            double mx = -INFINITY, sum = 0.0, smax = 0.0, *p = malloc((size_t)(pos[o] + 1) * 8);
            for (int64_t j = 0; j <= pos[o]; j++) {
                double s = 0.0, a = 0.0;
                for (int64_t e = 0; e < LD; e++) {
                    s += (double)qq[e] * base[j * row + e];
                    a += fabs((double)qq[e] * base[j * row + e]);
                }
                p[j] = LSCALE * s;
                if (LSCALE * a > smax) smax = LSCALE * a;
                if (p[j] > mx) mx = p[j];
            }
            for (int64_t j = 0; j <= pos[o]; j++) sum += (p[j] = exp(p[j] - mx));
            for (int64_t e = 0; e < LD; e++) {
                double mag = 0.0;
                for (int64_t j = 0; j <= pos[o]; j++)
                    mag += p[j] / sum * fabs(base[j * row + LH * LD + e]);
                mags m = {.smax = smax};
                double tol = bound(&m, pos[o] + 1, mag);
                int64_t at = (o * LH + h) * LD + e;
                cr_assert(fabs((double)og[at] - oc[at]) <= tol,
                          "%s cached attention, row %lld (position %d), head %lld, %lld: GPU "
                          "%.9g, CPU %.9g (tolerance %.3g)",
                          bf16 ? "bf16" : "f32", (long long)o, pos[o], (long long)h, (long long)e,
                          og[at], oc[at], tol);
            }
            free(p);
        }
    gpu.vt->free(&gpu, gq), gpu.vt->free(&gpu, gkv), gpu.vt->free(&gpu, gout);
    gpu.vt->free(&gpu, gpos);
    free(q), free(kv), free(oc), free(og);
    close_devices();
}

Test(gpu_attention, cached_over_1024_positions_f32) { compare_cached(0); }

Test(gpu_attention, cached_over_1024_positions_bf16_values) { compare_cached(1); }

/* No rows or no slices: MW_OK without a launch (a grid of 0 blocks fails to launch, and would
 * leave its error for the next kernel's check); the next kernel still runs. */
Test(gpu_attention, nothing_to_attend_launches_nothing) {
    open_devices();
    enum { T0 = 8, D0 = 16 };
    float *qkv = to_gpu(NULL, 3 * T0 * D0 * 4), *out = to_gpu(NULL, 3 * T0 * D0 * 4);
    float *gy = to_gpu(NULL, T0 * D0 * 4), *scratch = to_gpu(NULL, 1 << 20);
    mw__k_attention k = {.causal = 1, .scale = 0.25f, .t = 0, .d = D0, .slices = 1};
    k.qkv_dtype = MW_F32, k.out_dtype = MW_F32, k.seq_qkv = 3 * D0, k.part = D0, k.seq_out = D0;
    k.walk.rank = 0, k.block = 1, k.qkv = qkv, k.out = out, k.gy = gy, k.scratch = scratch;
    for (int which = 0; which < 2; which++) {
        k.t = which ? T0 : 0, k.slices = which ? 0 : 1;
        OK(gpu.vt->attention(&gpu, &k));
        OK(gpu.vt->attention_grad(&gpu, &k));
    }
    mw__k_attention_cached c = {.outer = 0, .n = T0, .heads = 1, .dim = D0, .scale = 1.0f};
    OK(gpu.vt->attention_cached(&gpu, &c));
    mw__k_state_write w = {.outer = 0, .n = T0, .inner = D0};
    OK(gpu.vt->state_write(&gpu, &w));
    /* A real launch after them reports no error left behind. */
    mw__k_fill f = {.value = 1.5f, .count = T0 * D0, .out = gy};
    OK(gpu.vt->fill(&gpu, &f));
    OK(gpu.vt->sync(&gpu));
    float got[T0 * D0];
    OK(gpu.vt->download(&gpu, got, gy, sizeof got));
    for (int i = 0; i < T0 * D0; i++) cr_assert_eq(got[i], 1.5f, "element %d", i);
    gpu.vt->free(&gpu, qkv), gpu.vt->free(&gpu, out), gpu.vt->free(&gpu, gy);
    gpu.vt->free(&gpu, scratch);
    close_devices();
}

#else

Test(gpu_attention, no_cuda_backend) { cr_skip("this build of meshwit has no CUDA backend"); }

#endif
