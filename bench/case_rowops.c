/* The "rowops" case: the row kernels of Llama-family models (RMS norm, rotary embeddings, SwiGLU)
 * and GPT-2's layer norm, with the norms' gradients as the models run them (dx with the weight's
 * gradient and a residual's folded in), on a CPU device, each beside the copy kernel moving the
 * same bytes (read once, written once), at the llama case's shapes (L4 C256 T256 batch 8:
 * cache-resident) and at 64 MiB (memory-bound). A kernel that reads and writes what a copy does
 * runs at "copy's rate" when its time equals the copy's: the ratio copy / kernel is the fraction of
 * the memory bandwidth (or of the cache's) it reaches. Medians over several runs; the CPU and the
 * instruction level that ran are printed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "devices/cpu/cpu.h"
#include "devices/device.h"
#include "meshwit.h"

typedef struct shape {
    const char *name;
    int64_t rows, n; /* rows of n floats in */
} shape;

/* Median seconds of `reps` runs of one kernel (after a warm-up run); negative on failure. */
typedef mw_status (*kernel_fn)(mw__device *dev, const void *k);
static double time_kernel(mw__device *dev, kernel_fn fn, const void *k, int reps) {
    double t[15];
    if (reps > 15) reps = 15;
    for (int i = -1; i < reps; i++) {
        double t0 = mwb_now();
        if (fn(dev, k) != MW_OK) return -1;
        if (i >= 0) t[i] = mwb_now() - t0;
    }
    return mwb_median(t, reps);
}

static mw_status run_copy(mw__device *d, const void *k) { return d->vt->copy(d, k); }
static mw_status run_rmsnorm(mw__device *d, const void *k) { return d->vt->rmsnorm(d, k); }
static mw_status run_rope(mw__device *d, const void *k) { return d->vt->rope(d, k); }
static mw_status run_layernorm(mw__device *d, const void *k) { return d->vt->layernorm(d, k); }
static mw_status run_layernorm_dx(mw__device *d, const void *k) {
    return d->vt->layernorm_dx(d, k);
}
static mw_status run_rmsnorm_dx(mw__device *d, const void *k) { return d->vt->rmsnorm_dx(d, k); }
static mw_status run_unary(mw__device *d, const void *k) { return d->vt->unary(d, k); }
static mw_status run_unary_grad(mw__device *d, const void *k) { return d->vt->unary_grad(d, k); }
static mw_status run_swiglu(mw__device *d, const void *k) { return d->vt->swiglu(d, k); }

/* copy of `in` floats to `out` elements of dtype od */
static double copy_time(mw__device *dev, float *x, void *y, int64_t count, mw_dtype od, int reps) {
    mw__k_copy c = {.alpha = 1.0f, .out_dtype = od, .a_dtype = MW_F32, .out = y, .a = x};
    c.nd.rank = 1, c.nd.dims[0] = count, c.nd.stride[0][0] = 1, c.nd.stride[1][0] = 1;
    return time_kernel(dev, run_copy, &c, reps);
}

/* bytes: what the kernel reads and writes in t; cbytes: what the copy moved in tcopy. */
static void report(mwb_ctx *ctx, const char *op, const shape *s, mw_dtype od, double bytes,
                   double t, double cbytes, double tcopy) {
    double rate = bytes / t, crate = cbytes / tcopy;
    printf("%-9s %-6s %-5s %10.3f %10.3f %9.1f %9.1f %8.2f\n", op, s->name,
           od == MW_BF16 ? "bf16" : "f32", t * 1e3, tcopy * 1e3, rate * 1e-9, crate * 1e-9,
           rate / crate);
    mwb_record rec = {0};
    mwb_record_str(&rec, "case", "rowops");
    mwb_record_str(&rec, "op", op);
    mwb_record_str(&rec, "shape", s->name);
    mwb_record_str(&rec, "out_dtype", od == MW_BF16 ? "bf16" : "f32");
    mwb_record_num(&rec, "rows", (double)s->rows);
    mwb_record_num(&rec, "n", (double)s->n);
    mwb_record_num(&rec, "ms", t * 1e3);
    mwb_record_num(&rec, "copy_ms", tcopy * 1e3);
    mwb_record_num(&rec, "gbps", rate * 1e-9);
    mwb_record_num(&rec, "copy_gbps", crate * 1e-9);
    mwb_record_num(&rec, "of_copy", rate / crate);
    ctx->emit(ctx, &rec);
}

int mwb_case_rowops(mwb_ctx *ctx) {
    mw__device dev = {.vt = &mw__cpu_device, .name = "cpu:0"};
    if (dev.vt->init(&dev) != MW_OK) {
        fprintf(stderr, "rowops: cannot start a CPU device: %s\n", mw_last_error());
        return 1;
    }
    int reps = ctx->quick ? 3 : 11;
    int64_t big = ctx->quick ? ((int64_t)1 << 20) : ((int64_t)16 << 20); /* floats: 64 MiB */
    /* RMS norm over C=256 rows; rotary over 64 features per head; SwiGLU's hidden width 688 */
    const char *large = ctx->quick ? "4MiB" : "64MiB";
    shape norm[2] = {{"llama", 8 * 256, 256}, {large, big / 1024, 1024}};
    shape rope[2] = {{"llama", 8 * 256 * 4, 64}, {large, big / 64, 64}};
    shape glu[2] = {{"llama", 8 * 256, 2 * 688}, {large, big / 2048, 2 * 1024}};
    /* the largest shape's floats (at --quick the llama shapes outgrow the large ones) */
    int64_t floats = big;
    for (int i = 0; i < 2; i++) {
        if (norm[i].rows * norm[i].n > floats) floats = norm[i].rows * norm[i].n;
        if (rope[i].rows * rope[i].n > floats) floats = rope[i].rows * rope[i].n;
        if (glu[i].rows * glu[i].n > floats) floats = glu[i].rows * glu[i].n;
    }
    size_t most = (size_t)floats * sizeof(float);
    float *x = NULL, *w = NULL, *y = NULL, *g = NULL, *sums = NULL;
    int rc = 0;
    if (dev.vt->alloc(&dev, most, (void **)&x) || dev.vt->alloc(&dev, most, (void **)&y) ||
        dev.vt->alloc(&dev, most, (void **)&g) ||
        dev.vt->alloc(&dev, 4096 * sizeof(float), (void **)&w) ||
        dev.vt->alloc(&dev, 3 * 4096 * sizeof(float), (void **)&sums)) {
        fprintf(stderr, "rowops: out of memory for %zu bytes\n", 3 * most);
        rc = 1;
        goto done;
    }
    for (int64_t i = 0; i < floats; i++) x[i] = (float)((i * 7919) % 2003) * 1e-3f - 1.0f;
    for (int64_t i = 0; i < floats; i++) g[i] = (float)((i * 104729) % 1009) * 1e-3f - 0.5f;
    for (int i = 0; i < 4096; i++) w[i] = 1.0f + (float)(i % 7) * 0.01f;
    memset(y, 0, most);
    printf("row kernels beside a copy of the same bytes, one CPU device (one thread): %s\n",
           mw_backend_describe("cpu"));
    printf("%-9s %-6s %-5s %10s %10s %9s %9s %8s\n", "op", "shape", "out", "ms", "copy ms", "GB/s",
           "copy GB/s", "of copy");
    for (int s = 0; s < 2 && rc == 0; s++) {
        for (int b = 0; b < 2; b++) {
            mw_dtype od = b ? MW_BF16 : MW_F32;
            size_t osz = b ? 2 : 4;
            /* RMS norm: reads rows x n, writes rows x n */
            int64_t cnt = norm[s].rows * norm[s].n;
            mw__k_rmsnorm kn = {.rows = norm[s].rows,
                                .n = norm[s].n,
                                .eps = 1e-5f,
                                .out_dtype = od,
                                .out = y,
                                .x = x,
                                .w = w};
            double t = time_kernel(&dev, run_rmsnorm, &kn, reps);
            double tc = copy_time(&dev, x, y, cnt, od, reps);
            if (t <= 0 || tc <= 0) rc = 1;
            if (!rc)
                report(ctx, "rmsnorm", &norm[s], od, (double)cnt * (4 + osz), t,
                       (double)cnt * (4 + osz), tc);
            /* rotary: x [rows, 64] at positions (r / 4) % 256, as Batch x Seq x Head x 64 */
            cnt = rope[s].rows * rope[s].n;
            mw__k_rope kr = {.rows = rope[s].rows,
                             .n = rope[s].n,
                             .inner = 4,
                             .seq = 256,
                             .prefix = rope[s].rows,
                             .dims = 64,
                             .style = MW_ROPE_HALF,
                             .freqs = {.theta = 500000.0f, .dims = 64},
                             .out_dtype = od,
                             .out = y,
                             .x = x};
            t = time_kernel(&dev, run_rope, &kr, reps);
            tc = copy_time(&dev, x, y, cnt, od, reps);
            if (t <= 0 || tc <= 0) rc = 1;
            if (!rc)
                report(ctx, "rope", &rope[s], od, (double)cnt * (4 + osz), t,
                       (double)cnt * (4 + osz), tc);
            /* SwiGLU: reads rows x 2h, writes rows x h; beside a copy of the rows x 2h read */
            cnt = glu[s].rows * glu[s].n;
            mw__k_swiglu kg = {
                .outer = glu[s].rows, .inner = glu[s].n / 2, .out_dtype = od, .out = y, .x = x};
            t = time_kernel(&dev, run_swiglu, &kg, reps);
            tc = copy_time(&dev, x, y, cnt, od, reps);
            if (t <= 0 || tc <= 0) rc = 1;
            if (!rc)
                report(ctx, "swiglu", &glu[s], od, (double)cnt * 4 + (double)cnt / 2 * (double)osz,
                       t, (double)cnt * (4 + osz), tc);
        }
    }
    /* The norms' gradients (f32 only): dx reads x, gy and the residual's gradient and writes dx
     * (16 bytes an element), beside a copy of as many bytes; the layer norm's forward reads x
     * and writes y. Half of y is the residual gradient (the other half its dx), so the shapes
     * take at most half of the buffers. */
    for (int s = 0; s < 2 && rc == 0; s++) {
        shape h = norm[s];
        if (2 * h.rows * h.n > floats) h.rows = floats / 2 / h.n;
        int64_t cnt = h.rows * h.n;
        mw__k_layernorm kl = {.rows = h.rows,
                              .n = h.n,
                              .eps = 1e-5f,
                              .out_dtype = MW_F32,
                              .out = y,
                              .x = x,
                              .w = w,
                              .b = w};
        double t = time_kernel(&dev, run_layernorm, &kl, reps);
        double tc = copy_time(&dev, x, y, cnt, MW_F32, reps);
        if (t <= 0 || tc <= 0) rc = 1;
        if (!rc) report(ctx, "layernorm", &h, MW_F32, (double)cnt * 8, t, (double)cnt * 8, tc);
        mw__k_layernorm_grad kd = {.rows = h.rows,
                                   .n = h.n,
                                   .eps = 1e-5f,
                                   .out = y + cnt,
                                   .gy = g,
                                   .x = x,
                                   .w = w,
                                   .dw = sums,
                                   .db = sums + 4096,
                                   .addend = y};
        t = time_kernel(&dev, run_layernorm_dx, &kd, reps);
        tc = copy_time(&dev, x, y, 2 * cnt, MW_F32, reps);
        if (t <= 0 || tc <= 0) rc = 1;
        if (!rc) report(ctx, "ln_dx", &h, MW_F32, (double)cnt * 16, t, (double)cnt * 16, tc);
        mw__k_rmsnorm_grad kr = {.rows = h.rows,
                                 .n = h.n,
                                 .eps = 1e-5f,
                                 .out = y + cnt,
                                 .gy = g,
                                 .x = x,
                                 .w = w,
                                 .dw = sums,
                                 .addend = y};
        t = time_kernel(&dev, run_rmsnorm_dx, &kr, reps);
        if (t <= 0) rc = 1;
        if (!rc) report(ctx, "rms_dx", &h, MW_F32, (double)cnt * 16, t, (double)cnt * 16, tc);
    }
    /* GELU (tanh form) over GPT-2's MLP activations (batch 8 x 256 x 1024) and 64 MiB: forward
     * reads x and writes y; the gradient reads x and gy and writes dx. */
    shape act[2] = {{"llmc", 8 * 256, 1024}, {large, big / 1024, 1024}};
    for (int s = 0; s < 2 && rc == 0; s++) {
        shape h = act[s];
        if (h.rows * h.n > floats) h.rows = floats / h.n;
        int64_t cnt = h.rows * h.n;
        mw__k_unary ku = {.op = MW__UN_GELU, .out_dtype = MW_F32, .count = cnt, .out = y, .a = x};
        double t = time_kernel(&dev, run_unary, &ku, reps);
        double tc = copy_time(&dev, x, y, cnt, MW_F32, reps);
        if (t <= 0 || tc <= 0) rc = 1;
        if (!rc) report(ctx, "gelu", &h, MW_F32, (double)cnt * 8, t, (double)cnt * 8, tc);
        mw__k_unary_grad kg = {
            .op = MW__UN_GELU, .out_dtype = MW_F32, .count = cnt, .out = y, .gy = g, .x = x};
        t = time_kernel(&dev, run_unary_grad, &kg, reps);
        if (t <= 0) rc = 1;
        if (!rc) report(ctx, "gelu_dx", &h, MW_F32, (double)cnt * 12, t, (double)cnt * 8, tc);
    }
    if (rc) fprintf(stderr, "rowops: a kernel failed: %s\n", mw_last_error());
done:
    if (x) dev.vt->free(&dev, x);
    if (y) dev.vt->free(&dev, y);
    if (w) dev.vt->free(&dev, w);
    if (g) dev.vt->free(&dev, g);
    if (sums) dev.vt->free(&dev, sums);
    dev.vt->shutdown(&dev);
    return rc;
}
