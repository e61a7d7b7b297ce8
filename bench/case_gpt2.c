/* Bench case "gpt2": ms/step and tokens/s of the tiny GPT-2 (the gpt2 example's default model and
 * batch) on one CPU device with one BLAS thread, on one device with two BLAS threads (what a user
 * would try instead of sharding), and data-parallel over cpu:2 and cpu:4 (oversubscribed on a
 * 2-core machine), plus every --devices spec given.
 *
 * Each configuration runs in its own forked process, which builds the model, runs WARMUP steps,
 * then REPEATS repeats of STEPS steps, and reports the median ms/step and its peak resident set
 * (getrusage's ru_maxrss is process-wide and only grows, so measuring every configuration in one
 * process would report the largest so far; a fresh child reports its own, plus the few MB of the
 * bench binary it starts as a copy of). Nothing is built in the parent, so no worker thread or
 * BLAS pool is running when it forks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "gpt2_run.h"

#define BATCH MWB_GPT2_BATCH
#define SEQ MWB_GPT2_SEQ
#define WARMUP 3
#define REPEATS 5
#define STEPS 5
#define QUICK_WARMUP 1
#define QUICK_REPEATS 3
#define QUICK_STEPS 2

typedef struct config {
    const char *devices;
    int blas_threads; /* mw_trainer_config.blas_threads: 0 is one per device */
} config;

typedef mwb_gpt2_result result;

/* Runs one configuration in a child process (gpt2_run.c) and collects its result. */
static void run_isolated(const config *cf, int quick, result *r) {
    mwb_gpt2_setup s = {.batch = BATCH,
                        .seq = SEQ,
                        .devices = cf->devices,
                        .blas_threads = cf->blas_threads,
                        .warmup = quick ? QUICK_WARMUP : WARMUP,
                        .repeats = quick ? QUICK_REPEATS : REPEATS,
                        .steps = quick ? QUICK_STEPS : STEPS};
    gpt2_preset("tiny", &s.model);
    mwb_gpt2_measure(&s, r);
}

static double flops_per_token(const gpt2_config *c) { return mwb_gpt2_flops_per_token(c, SEQ); }

/* The peak FLOP/s to compare with, from MESHWIT_PEAK_TFLOPS (e.g. 67 for an H100/H200's FP32
 * peak); 0 when unset. */
static double peak_flops(void) {
    const char *v = getenv("MESHWIT_PEAK_TFLOPS");
    double t = v ? atof(v) : 0.0;
    return t > 0.0 ? t * 1e12 : 0.0;
}

static void emit(mwb_ctx *ctx, const config *cf, const result *r, double speedup, int64_t params,
                 int quick) {
    mwb_record rec = {0};
    mwb_record_str(&rec, "case", "gpt2");
    mwb_record_str(&rec, "devices", cf->devices);
    mwb_record_num(&rec, "blas_threads", cf->blas_threads > 0 ? cf->blas_threads : 1);
    mwb_record_num(&rec, "batch", BATCH);
    mwb_record_num(&rec, "seq", SEQ);
    mwb_record_num(&rec, "params", (double)params);
    mwb_record_num(&rec, "repeats", quick ? QUICK_REPEATS : REPEATS);
    mwb_record_num(&rec, "steps_per_repeat", quick ? QUICK_STEPS : STEPS);
    mwb_record_num(&rec, "ms_per_step", r->ms);
    mwb_record_num(&rec, "tokens_per_s", BATCH * SEQ / (r->ms * 1e-3));
    mwb_record_num(&rec, "speedup", speedup);
    mwb_record_num(&rec, "peak_rss_mb", r->peak_mb);
    mwb_record_num(&rec, "threads", r->threads);
    gpt2_config c;
    gpt2_preset("tiny", &c);
    double achieved = BATCH * SEQ / (r->ms * 1e-3) * flops_per_token(&c);
    mwb_record_num(&rec, "model_gflops", achieved * 1e-9);
    if (peak_flops() > 0.0) mwb_record_num(&rec, "mfu", achieved / peak_flops());
    ctx->emit(ctx, &rec);
}

static int run_configs(mwb_ctx *ctx, const config *cfs, int n);

int mwb_case_gpt2(mwb_ctx *ctx) {
    static const config defaults[] = {{"cpu:1", 1}, {"cpu:1", 2}, {"cpu:2", 0}, {"cpu:4", 0}};
    int ndefault = ctx->quick ? 1 : (int)(sizeof defaults / sizeof *defaults);
    int n = ndefault + (ctx->quick ? 1 : 0) + ctx->ndevices;
    config *cfs = malloc((size_t)n * sizeof *cfs);
    if (!cfs) {
        fprintf(stderr, "gpt2: out of memory\n");
        return 1;
    }
    for (int i = 0; i < ndefault; i++) cfs[i] = defaults[i];
    if (ctx->quick) cfs[ndefault] = defaults[2]; /* cpu:1 and cpu:2 only */
    for (int i = 0; i < ctx->ndevices; i++)
        cfs[n - ctx->ndevices + i] = (config){ctx->devices[i], 0};

    int failed = run_configs(ctx, cfs, n);
    free(cfs);
    return failed;
}

int mwb_gpt2_specs(mwb_ctx *ctx, const char *const *specs, int n) {
    config cfs[16];
    if (n > 16) n = 16;
    for (int i = 0; i < n; i++) cfs[i] = (config){specs[i], 0};
    return run_configs(ctx, cfs, n);
}

/* Measures each configuration in turn and prints the table; speedups are against the first. */
static int run_configs(mwb_ctx *ctx, const config *cfs, int n) {
    gpt2_config c;
    gpt2_preset("tiny", &c);
    int64_t params = gpt2_num_params(&c);
    printf("tiny GPT-2 (%lld parameters), batch %d x %d random windows, AdamW; median of %d x %d "
           "steps after %d warm-up; each configuration in its own process\n",
           (long long)params, BATCH, SEQ, ctx->quick ? QUICK_REPEATS : REPEATS,
           ctx->quick ? QUICK_STEPS : STEPS, ctx->quick ? QUICK_WARMUP : WARMUP);
    printf("model FLOPs per token %.3g (6 N + 12 L C T); MFU against MESHWIT_PEAK_TFLOPS%s\n",
           flops_per_token(&c), peak_flops() > 0.0 ? "" : " (unset: no MFU column)");
    printf("%-16s %6s %10s %10s %9s %14s %13s %6s %8s\n", "devices", "BLAS", "ms/step", "tokens/s",
           "speedup", "peak RSS (MB)", "model GFLOP/s", "MFU", "threads");
    fflush(stdout);
    int failed = 0;
    double base_ms = 0.0;
    for (int i = 0; i < n; i++) {
        result r;
        run_isolated(&cfs[i], ctx->quick, &r);
        if (!r.ok) {
            fprintf(stderr, "gpt2: %s (BLAS threads %d): %s\n", cfs[i].devices,
                    cfs[i].blas_threads > 0 ? cfs[i].blas_threads : 1, r.error);
            failed = 1;
            continue;
        }
        if (i == 0) base_ms = r.ms;                            /* cpu:1 with one BLAS thread */
        double speedup = base_ms > 0.0 ? base_ms / r.ms : NAN; /* NAN: cpu:1 failed */
        double gflops = BATCH * SEQ / (r.ms * 1e-3) * flops_per_token(&c) * 1e-9;
        char mfu[16] = "-";
        if (peak_flops() > 0.0)
            snprintf(mfu, sizeof mfu, "%.1f%%", 100 * gflops * 1e9 / peak_flops());
        printf("%-16s %6d %10.1f %10.0f %8.2fx %14.1f %13.1f %6s %8d\n", cfs[i].devices,
               cfs[i].blas_threads > 0 ? cfs[i].blas_threads : 1, r.ms, BATCH * SEQ / (r.ms * 1e-3),
               speedup, r.peak_mb, gflops, mfu, r.threads);
        fflush(stdout);
        emit(ctx, &cfs[i], &r, speedup, params, ctx->quick);
    }
    return failed;
}
