/* The "reduce" case: the shared-memory reducer's all-reduce over P virtual CPU devices (one
 * thread each), message sizes 4 B .. 256 MB, against the bound that this machine's memory
 * bandwidth sets.
 *
 * The bound. An in-place all-reduce of B bytes on each of P ranks must read every buffer once and
 * write every buffer once: at least 2 * P * B bytes of memory traffic once the buffers outgrow the
 * caches. The reducer moves exactly that: each line is read, summed and written back from cache,
 * so no store needs a read-for-ownership of a line that is not already cached. The best rate for
 * that traffic is measured with the same access pattern: T = min(P, online CPUs) threads (a core
 * each at most, like the ranks) each stream through their share of a 256 MB array, reading and
 * writing back every line (x[i] += 1), which is 2 bytes of traffic per byte of array. With R the
 * measured traffic rate, t >= 2 * P * B / R, so the algorithm bandwidth B / t is at most R / (2P).
 *
 * memcpy bandwidth is printed and recorded too, but the bound does not rest on it: whether memcpy
 * costs 2 or 3 bytes of traffic per byte copied depends on whether glibc picks non-temporal
 * stores, which turns on its tuned threshold (here 192 MB: a 256 MB copy streams, two threads'
 * 128 MB copies read-for-ownership), so "memcpy bandwidth / P" can understate the bound by 1.5x.
 * All rates are medians over a few runs, like the all-reduce times. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "collectives/reducer.h"
#include "core/error.h"
#include "devices/cpu/cpu.h"
#include "devices/device.h"

#define MAX_P 64
#define MAX_SIZES 16
#define MAX_TIMES 20000
#define PROBE_BYTES ((size_t)256 << 20)

/* ---- memory bandwidth ---- */

enum probe { PROBE_COPY, PROBE_RMW };

typedef struct prober {
    pthread_t thread;
    pthread_barrier_t *start, *stop;
    _Atomic int *go; /* 1: all threads exist, run; -1: some could not start, leave */
    int kind, reps;
    float *dst, *src;
    size_t n; /* floats */
} prober;

/* Reads and writes back every line of two halves at once: two streams, as a rank of the
 * reducer has at least. The fixed inner count lets GCC -O2 vectorise it. */
static void rmw_pass(float *restrict a, float *restrict b, size_t n) {
    for (size_t i = 0; i + 16 <= n; i += 16)
        for (size_t j = 0; j < 16; j++) {
            a[i + j] += 1.0f;
            b[i + j] += 1.0f;
        }
}

static void *prober_main(void *arg) {
    prober *p = arg;
    memset(p->dst, 0, p->n * sizeof(float)); /* first touch on this thread */
    if (p->src) memset(p->src, 0, p->n * sizeof(float));
    int go;
    while ((go = atomic_load(p->go)) == 0) sched_yield();
    for (int i = 0; go > 0 && i < p->reps; i++) {
        pthread_barrier_wait(p->start);
        if (p->kind == PROBE_COPY)
            memcpy(p->dst, p->src, p->n * sizeof(float));
        else
            rmw_pass(p->dst, p->dst + p->n / 2, p->n / 2);
        pthread_barrier_wait(p->stop);
    }
    return NULL;
}

/* Median rate in GB/s of `threads` threads working at once on `total` bytes split between them:
 * bytes copied per second (PROBE_COPY) or bytes of traffic, read plus written, per second
 * (PROBE_RMW). 0 when memory or threads run out. The first round is a warm-up. */
static double probe_gbps(int kind, int threads, size_t total, int reps) {
    prober p[MAX_P];
    pthread_barrier_t start, stop;
    size_t n = total / (size_t)threads / sizeof(float) / 32 * 32;
    int made = 0, ok = 1;
    _Atomic int go = 0;
    double rates[16];
    if (reps > 15) reps = 15;
    pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&stop, NULL, (unsigned)threads + 1);
    for (int t = 0; t < threads; t++) {
        p[t] = (prober){
            .start = &start, .stop = &stop, .go = &go, .kind = kind, .reps = reps + 1, .n = n};
        p[t].dst = aligned_alloc(64, n * sizeof(float));
        p[t].src = kind == PROBE_COPY ? aligned_alloc(64, n * sizeof(float)) : NULL;
        if (!p[t].dst || (kind == PROBE_COPY && !p[t].src)) ok = 0;
    }
    for (; ok && made < threads; made++)
        if (pthread_create(&p[made].thread, NULL, prober_main, &p[made]) != 0) break;
    atomic_store(&go, made == threads ? 1 : -1);
    if (made == threads) {
        for (int i = 0; i <= reps; i++) {
            pthread_barrier_wait(&start);
            double t0 = mwb_now();
            pthread_barrier_wait(&stop);
            double bytes = (double)n * sizeof(float) * threads * (kind == PROBE_RMW ? 2 : 1);
            if (i > 0) rates[i - 1] = bytes / (mwb_now() - t0) / 1e9;
        }
    }
    for (int t = 0; t < made; t++) pthread_join(p[t].thread, NULL);
    for (int t = 0; t < threads; t++) {
        free(p[t].dst);
        free(p[t].src);
    }
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&stop);
    return made == threads ? mwb_median(rates, reps) : 0;
}

/* ---- all-reduce runs ---- */

typedef struct run {
    mw__comm *comm;
    int p;
    mw_dtype dtype;      /* of the buffers: sizes are bytes all the same */
    const size_t *sizes; /* bytes */
    int nsizes;
    double budget_s;
    int min_reps;
    _Atomic int go[2]; /* rank 0's decision before each barrier, by barrier parity */
    double *times;     /* rank 0's iteration times for the current size */
    int ntimes;
    double median_us[MAX_SIZES];
    _Atomic int failed;
    char error[MW__MSG_SIZE];
} run;

typedef struct rank_arg {
    pthread_t thread;
    run *run;
    int rank;
} rank_arg;

static void *rank_main(void *arg) {
    rank_arg *a = arg;
    run *run = a->run;
    const mw__reducer_vtable *red = &mw__reducer_shm;
    size_t max_bytes = run->sizes[run->nsizes - 1];
    float *buf = aligned_alloc(64, (max_bytes + 63) / 64 * 64);
    mw_status st = MW_OK;
    if (!buf) {
        st = mw__error(MW_ERR_NOMEM, "reduce bench: no memory for a %zu-byte buffer", max_bytes);
        goto fail;
    }
    /* 1.0 grows by a factor P per iteration up to inf, never through subnormals, so the adds
     * run at full speed whatever the values. */
    size_t es = run->dtype == MW_BF16 ? 2 : 4;
    for (size_t i = 0; i < max_bytes / es; i++) {
        if (es == 4)
            buf[i] = 1.0f;
        else
            ((uint16_t *)buf)[i] = 0x3f80; /* bf16 1.0 */
    }
    unsigned long barriers = 0;
    for (int s = 0; s < run->nsizes; s++) {
        size_t n = run->sizes[s] / es;
        int warmup = run->sizes[s] >= ((size_t)16 << 20) ? 1 : 5;
        double started = 0;
        for (int it = 0;; it++) {
            if (a->rank == 0) {
                int timed = it - warmup;
                int more = timed < run->min_reps ||
                           (timed < MAX_TIMES && mwb_now() - started < run->budget_s);
                atomic_store(&run->go[barriers & 1], more);
                if (it == warmup) started = mwb_now();
            }
            st = red->barrier(run->comm, a->rank);
            if (st != MW_OK) goto fail;
            if (!atomic_load(&run->go[barriers++ & 1])) break;
            double t0 = mwb_now();
            st = red->allreduce_sum(run->comm, a->rank, buf, n, run->dtype);
            double t1 = mwb_now();
            if (st != MW_OK) goto fail;
            if (a->rank == 0 && it >= warmup) run->times[it - warmup] = t1 - t0;
            if (a->rank == 0) run->ntimes = it - warmup + 1;
        }
        if (a->rank == 0) run->median_us[s] = mwb_median(run->times, run->ntimes) * 1e6;
    }
    free(buf);
    return NULL;
fail:
    /* The first failure names the cause; the others only follow the abort. */
    if (!atomic_exchange(&run->failed, 1))
        snprintf(run->error, sizeof run->error, "%s: %s", mw_status_name(st), mw_last_error());
    red->abort(run->comm);
    free(buf);
    return NULL;
}

static int run_p(run *run) {
    rank_arg args[MAX_P];
    int made = 0;
    for (; made < run->p; made++) {
        args[made] = (rank_arg){.run = run, .rank = made};
        if (pthread_create(&args[made].thread, NULL, rank_main, &args[made]) != 0) break;
    }
    if (made < run->p) {
        mw__reducer_shm.abort(run->comm); /* the started ranks must not wait for the rest */
        snprintf(run->error, sizeof run->error, "cannot start %d threads", run->p);
        atomic_store(&run->failed, 1);
    }
    for (int r = 0; r < made; r++) pthread_join(args[r].thread, NULL);
    return atomic_load(&run->failed) ? -1 : 0;
}

/* Device counts from specs like "cpu:2"; other kinds are not this case's business. */
static int parse_counts(mwb_ctx *ctx, int *counts) {
    int k = 0;
    for (int i = 0; i < ctx->ndevices; i++) {
        int p;
        char tail;
        if (sscanf(ctx->devices[i], "cpu:%d%c", &p, &tail) != 1 || p < 1 || p > MAX_P) {
            printf("reduce: skipping devices \"%s\" (expected cpu:P with 1 <= P <= %d)\n",
                   ctx->devices[i], MAX_P);
            continue;
        }
        counts[k++] = p;
    }
    if (ctx->ndevices == 0) {
        counts[k++] = 2;
        if (!ctx->quick) {
            counts[k++] = 3;
            counts[k++] = 4;
        }
    }
    return k;
}

static void format_bytes(size_t b, char *out, size_t size) {
    if (b >= (1u << 20))
        snprintf(out, size, "%zu MB", b >> 20);
    else if (b >= 1024)
        snprintf(out, size, "%zu KB", b >> 10);
    else
        snprintf(out, size, "%zu B", b);
}

/* Median all-reduce time in ms of `bytes` bytes of dtype elements over p ranks (one size). */
static double allreduce_ms(int p, size_t bytes, mw_dtype dtype, int quick) {
    run *r = calloc(1, sizeof *r);
    double *times = malloc(MAX_TIMES * sizeof(double));
    mw__comm_options opt = {.timeout_ms = 0};
    mw__comm *comm = NULL;
    double ms = -1;
    if (r && times && mw__reducer_shm.comm_new(p, NULL, &opt, &comm) == MW_OK) {
        *r = (run){.comm = comm,
                   .p = p,
                   .dtype = dtype,
                   .sizes = &bytes,
                   .nsizes = 1,
                   .budget_s = quick ? 0.05 : 0.5,
                   .min_reps = quick ? 3 : 9,
                   .times = times};
        if (run_p(r) == 0) ms = r->median_us[0] * 1e-3;
        mw__reducer_shm.comm_free(comm);
    }
    free(r);
    free(times);
    return ms;
}

/* Median ms of the two conversions a bf16 gradient reduce adds on each device: n f32 gradients
 * rounded to bf16 before, and the summed bf16 widened back after (the CPU backend's copy
 * kernel). */
static double convert_ms(size_t n, int quick) {
    float *f = malloc(n * sizeof *f);
    uint16_t *h = malloc(n * sizeof *h);
    double t[9], ms = -1;
    int reps = quick ? 3 : 9;
    if (f && h) {
        for (size_t i = 0; i < n; i++) f[i] = (float)(i % 97) * 1e-3f;
        mw__k_copy down = {.alpha = 1.0f, .out_dtype = MW_BF16, .a_dtype = MW_F32};
        down.nd.rank = 1, down.nd.dims[0] = (int64_t)n, down.nd.stride[0][0] = 1;
        down.nd.stride[1][0] = 1, down.out = h, down.a = f;
        mw__k_copy up = down;
        up.out_dtype = MW_F32, up.a_dtype = MW_BF16, up.out = f, up.a = h;
        for (int i = -1; i < reps; i++) {
            double t0 = mwb_now();
            mw__cpu_device.copy(NULL, &down);
            mw__cpu_device.copy(NULL, &up);
            if (i >= 0) t[i] = mwb_now() - t0;
        }
        ms = mwb_median(t, reps) * 1e3;
    }
    free(f);
    free(h);
    return ms;
}

/* What the gradient all-reduce of a step costs in f32 (what the trainer runs) and what it would
 * cost in bf16 (half the bytes, plus a conversion each way on every device), for the gradients
 * of llm.c's GPT-2 (3.3M parameters) and of 16M parameters. */
static int gradients_f32_bf16(mwb_ctx *ctx, const int *counts, int ncounts) {
    static const size_t params[] = {3290624, (size_t)16 << 20};
    printf("gradient all-reduce per step, f32 (what the trainer runs) against bf16 (half the "
           "bytes, plus rounding before and widening after on every device):\n");
    printf("%-8s %12s %10s %10s %14s %16s\n", "devices", "parameters", "f32 ms", "bf16 ms",
           "conversions ms", "bf16 total / f32");
    for (int i = 0; i < ncounts; i++)
        for (size_t k = 0; k < sizeof params / sizeof *params; k++) {
            int p = counts[i];
            if (p < 2 || (ctx->quick && k > 0)) continue;
            double f32 = allreduce_ms(p, params[k] * 4, MW_F32, ctx->quick);
            double b16 = allreduce_ms(p, params[k] * 2, MW_BF16, ctx->quick);
            double conv = convert_ms(params[k], ctx->quick);
            if (f32 < 0 || b16 < 0 || conv < 0) {
                fprintf(stderr, "reduce: cpu:%d: the f32/bf16 comparison failed\n", p);
                return 1;
            }
            char devices[32];
            snprintf(devices, sizeof devices, "cpu:%d", p);
            printf("%-8s %12zu %10.3f %10.3f %14.3f %16.2f\n", devices, params[k], f32, b16, conv,
                   (b16 + conv) / f32);
            mwb_record rec = {0};
            mwb_record_str(&rec, "case", "reduce");
            mwb_record_str(&rec, "devices", devices);
            mwb_record_str(&rec, "mode", "gradients f32 vs bf16");
            mwb_record_num(&rec, "params", (double)params[k]);
            mwb_record_num(&rec, "f32_ms", f32);
            mwb_record_num(&rec, "bf16_ms", b16);
            mwb_record_num(&rec, "convert_ms", conv);
            if (ctx->emit) ctx->emit(ctx, &rec);
        }
    return 0;
}

int mwb_case_reduce(mwb_ctx *ctx) {
    int counts[64];
    int ncounts = parse_counts(ctx, counts);
    if (ncounts == 0) {
        fprintf(stderr, "reduce: no cpu:P device counts to run\n");
        return 1;
    }
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int cores = online > 0 ? (int)online : 1;
    size_t sizes[MAX_SIZES];
    int nsizes = 0;
    size_t largest = ctx->quick ? (size_t)4 << 20 : (size_t)256 << 20;
    for (size_t b = 4; b <= largest && nsizes < MAX_SIZES; b *= 4) sizes[nsizes++] = b;

    /* Rates with 1 thread and with every thread count the bounds need. */
    size_t probe_bytes = ctx->quick ? PROBE_BYTES / 4 : PROBE_BYTES;
    int probe_reps = ctx->quick ? 3 : 5;
    double copy_gbps[MAX_P + 1] = {0}, rmw_gbps[MAX_P + 1] = {0};
    copy_gbps[1] = probe_gbps(PROBE_COPY, 1, probe_bytes, probe_reps);
    rmw_gbps[1] = probe_gbps(PROBE_RMW, 1, probe_bytes, probe_reps);
    for (int i = 0; i < ncounts; i++) {
        int t = counts[i] < cores ? counts[i] : cores;
        if (copy_gbps[t] == 0) copy_gbps[t] = probe_gbps(PROBE_COPY, t, probe_bytes, probe_reps);
        if (rmw_gbps[t] == 0) rmw_gbps[t] = probe_gbps(PROBE_RMW, t, probe_bytes, probe_reps);
    }
    printf("reduce: shared-memory all-reduce, %d online CPUs, %zu MB probes (medians)\n", cores,
           probe_bytes >> 20);
    for (int t = 1; t <= MAX_P; t++)
        if (rmw_gbps[t] > 0)
            printf(
                "  %d thread%s: memcpy %.2f GB/s copied; in-place read+write stream %.2f GB/s of "
                "traffic\n",
                t, t > 1 ? "s" : " ", copy_gbps[t], rmw_gbps[t]);
    printf("%-8s %10s %12s %12s %12s %12s %9s\n", "devices", "bytes", "median us", "algbw GB/s",
           "busbw GB/s", "bound GB/s", "of bound");

    double ratio_64m_2 = -1, algbw_64m_2 = 0, bound_64m_2 = 0;
    for (int i = 0; i < ncounts; i++) {
        int p = counts[i];
        int threads = p < cores ? p : cores;
        double bound = rmw_gbps[threads] / (2.0 * p);
        run *r = calloc(1, sizeof *r);
        double *times = malloc(MAX_TIMES * sizeof(double));
        mw__comm_options opt = {.timeout_ms = 0};
        mw__comm *comm = NULL;
        mw_status st = r && times ? mw__reducer_shm.comm_new(p, NULL, &opt, &comm)
                                  : mw__error(MW_ERR_NOMEM, "out of memory for the timings");
        if (st != MW_OK) {
            fprintf(stderr, "reduce: cpu:%d: %s\n", p, mw_last_error());
            free(r);
            free(times);
            return 1;
        }
        r->comm = comm;
        r->p = p;
        r->sizes = sizes;
        r->nsizes = nsizes;
        r->budget_s = ctx->quick ? 0.05 : 0.25;
        r->min_reps = ctx->quick ? 3 : 7;
        r->times = times;
        int rc = run_p(r);
        if (rc == 0) {
            char devices[32];
            snprintf(devices, sizeof devices, "cpu:%d", p);
            for (int s = 0; s < nsizes; s++) {
                double us = r->median_us[s];
                double algbw = (double)sizes[s] / (us * 1e-6) / 1e9;
                double busbw = algbw * 2.0 * (p - 1) / p;
                double ratio = bound > 0 ? algbw / bound : 0;
                char bytes[32];
                format_bytes(sizes[s], bytes, sizeof bytes);
                /* The bound holds once the P buffers outgrow the caches. */
                if (sizes[s] * (size_t)p >= ((size_t)64 << 20))
                    printf("%-8s %10s %12.1f %12.3f %12.3f %12.2f %9.2f\n", devices, bytes, us,
                           algbw, busbw, bound, ratio);
                else
                    printf("%-8s %10s %12.1f %12.3f %12.3f %12s %9s\n", devices, bytes, us, algbw,
                           busbw, "-", "-");
                mwb_record rec = {0};
                mwb_record_str(&rec, "case", "reduce");
                mwb_record_str(&rec, "devices", devices);
                mwb_record_num(&rec, "bytes", (double)sizes[s]);
                mwb_record_num(&rec, "us", us);
                mwb_record_num(&rec, "algbw_gbps", algbw);
                mwb_record_num(&rec, "busbw_gbps", busbw);
                mwb_record_num(&rec, "memcpy_gbps", copy_gbps[1]);
                mwb_record_num(&rec, "probe_threads", threads);
                mwb_record_num(&rec, "memcpy_agg_gbps", copy_gbps[threads]);
                mwb_record_num(&rec, "rw_stream_gbps", rmw_gbps[threads]);
                mwb_record_num(&rec, "bound_gbps", bound);
                mwb_record_num(&rec, "bound_ratio", ratio);
                if (ctx->emit) ctx->emit(ctx, &rec);
                if (p == 2 && sizes[s] == ((size_t)64 << 20)) {
                    ratio_64m_2 = ratio;
                    algbw_64m_2 = algbw;
                    bound_64m_2 = bound;
                }
            }
            if (p > cores)
                printf("(cpu:%d runs %d ranks on %d CPUs: oversubscribed)\n", p, p, cores);
        } else {
            fprintf(stderr, "reduce: cpu:%d failed: %s\n", p, r->error);
        }
        mw__reducer_shm.comm_free(comm);
        free(times);
        free(r);
        if (rc != 0) return 1;
    }
    if (gradients_f32_bf16(ctx, counts, ncounts)) return 1;
    if (ratio_64m_2 >= 0) {
        int threads = 2 < cores ? 2 : cores;
        printf("64 MB over 2 devices: %.2f GB/s = %.2f of the memory-bandwidth bound %.2f GB/s\n",
               algbw_64m_2, ratio_64m_2, bound_64m_2);
        printf("bound = R / (2P) = %.2f / 4, R = traffic rate of an in-place read+write stream "
               "with %d thread%s: an in-place all-reduce must read and write each of the P "
               "buffers once (2*P*bytes of traffic)\n",
               rmw_gbps[threads], threads, threads > 1 ? "s" : "");
    }
    return 0;
}
