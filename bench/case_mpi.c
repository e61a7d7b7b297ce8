/* The "mpi" case: meshwit between processes against Open MPI itself, side by side in one run.
 *
 * 1. The all-reduce between processes (the hierarchical reducer, one device per process) beside
 *    MPI_Allreduce (in place, MPI_FLOAT, MPI_SUM on MPI_COMM_WORLD) at the same sizes, the two
 *    alternating repeat by repeat so they share the machine's noise; and beside the all-reduce
 *    among as many threads of one process (the shared-memory reducer).
 * 2. The tiny GPT-2 of the gpt2 case (batch 32 x 32, AdamW) over the processes, one cpu:1 device
 *    each, beside cpu:P (P threads) and cpu:1 in one process; and the same model in P pipeline
 *    stages, one per process (1F1B over 8 micro-batches of 4 sequences).
 *
 * Run it under mpirun with more than one process, e.g.
 *   mpirun -np 2 build/meshwit-bench mpi
 *   mpirun -np 2 --mca btl tcp,self build/meshwit-bench mpi    (TCP between processes, as
 *                                                              between two hosts)
 * Otherwise it prints a note and skips. Only rank 0 prints and emits records (main.c). While
 * rank 0 measures inside its own process, the others sleep in a barrier (MPI's own barrier
 * would spin on a core the measurement needs), and rank 0 lifts the launcher's binding to one
 * core so that its threads can use every core. Times are medians. */
#define _GNU_SOURCE /* sched_getaffinity */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/gpt2_run.h"
#include "collectives/reducer.h"
#include "core/error.h"
#include "meshwit.h"

#ifndef MESHWIT_HAVE_MPI
int mwb_case_mpi(mwb_ctx *ctx) {
    (void)ctx;
    printf("mpi: this build has no MPI (configure with -DMESHWIT_MPI=ON); skipped\n");
    return 0;
}
#else
#include <mpi.h>

#include "devices/module.h"

/* The reducer between processes, from libmeshwit-mpi.so (loaded under mpirun). */
#define HIER (*mw__dist()->reducer_hier)

#define MAX_RANKS 64
/* Repeats per size: a few microseconds per call below 1 MiB, where a median of 21 moved by a
 * quarter between runs, so many more there. */
#define REPS 101
#define REPS_LARGE 21
#define LARGE (1u << 22) /* floats: from 16 MiB */

static int reps_for(size_t n, int quick) { return quick ? 5 : n >= LARGE ? REPS_LARGE : REPS; }

typedef struct shm_rank {
    pthread_t thread;
    mw__comm *comm;
    int rank, reps;
    float *buf;
    size_t n;
    double *times;
    mw_status st;
} shm_rank;

static void *shm_main(void *arg) {
    shm_rank *r = arg;
    for (int i = 0; i < r->reps && r->st == MW_OK; i++) {
        r->st = mw__reducer_shm.barrier(r->comm, r->rank);
        double t0 = mwb_now();
        if (r->st == MW_OK)
            r->st = mw__reducer_shm.allreduce_sum(r->comm, r->rank, r->buf, r->n, MW_F32);
        r->times[i] = mwb_now() - t0;
    }
    return NULL;
}

/* Median seconds of one all-reduce of n floats among p threads of this process. */
static double time_shm(int p, size_t n, int reps) {
    mw__comm *comm = NULL;
    shm_rank r[MAX_RANKS];
    double times[MAX_RANKS][REPS];
    mw__comm_options opt = {0};
    if (mw__reducer_shm.comm_new(p, NULL, &opt, &comm)) return -1;
    int ok = 1;
    for (int i = 0; i < p; i++) {
        r[i] = (shm_rank){.comm = comm, .rank = i, .reps = reps, .n = n, .times = times[i]};
        r[i].buf = calloc(n ? n : 1, sizeof(float));
        if (!r[i].buf) ok = 0;
    }
    int started = 0;
    for (; ok && started < p; started++)
        if (pthread_create(&r[started].thread, NULL, shm_main, &r[started])) break;
    if (started < p) mw__reducer_shm.abort(comm);
    for (int i = 0; i < started; i++) pthread_join(r[i].thread, NULL);
    for (int i = 0; i < p; i++) {
        ok &= r[i].st == MW_OK && started == p;
        free(r[i].buf);
    }
    mw__reducer_shm.comm_free(comm);
    return ok ? mwb_median(times[0], reps) : -1;
}

/* Median seconds (rank 0's clock) of one all-reduce of n floats among the processes: meshwit's
 * in meshwit_s, MPI_Allreduce's in mpi_s; each repeat times one of each, after a barrier. */
static int time_procs(mw__comm *comm, int rank, size_t n, int reps, double *meshwit_s,
                      double *mpi_s) {
    float *buf = calloc(n ? n : 1, sizeof(float));
    double tm[REPS], tx[REPS];
    if (!buf) return -1;
    mw_status st = MW_OK;
    int rc = MPI_SUCCESS;
    for (int i = 0; i < reps && st == MW_OK && rc == MPI_SUCCESS; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = mwb_now();
        st = HIER.allreduce_sum(comm, rank, buf, n, MW_F32);
        tm[i] = mwb_now() - t0;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = mwb_now();
        rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        tx[i] = mwb_now() - t0;
    }
    free(buf);
    if (st != MW_OK || rc != MPI_SUCCESS) return -1;
    *meshwit_s = mwb_median(tm, reps);
    *mpi_s = mwb_median(tx, reps);
    return 0;
}

/* A barrier that sleeps instead of spinning: the other processes wait here while rank 0 measures
 * threads of its own process. The naps grow from 50 us to 5 ms: the launcher binds each process
 * to a core, and a rank that woke every 200 us took enough of its core from the rank 0 thread
 * sharing it (on the 2-core Intel Xeon, device 1 of cpu:2 computed 29 ms a step against device
 * 0's 25) to make threads look 1.08-1.14x slower than processes. */
static int sleepy_barrier(void) {
    MPI_Request req;
    if (MPI_Ibarrier(MPI_COMM_WORLD, &req) != MPI_SUCCESS) return -1;
    long nap_ns = 50000L;
    for (;;) {
        int done = 0;
        if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return -1;
        if (done) return 0;
        struct timespec ts = {0, nap_ns};
        nanosleep(&ts, NULL);
        if (nap_ns < 5000000L) nap_ns *= 2;
    }
}

/* Rank 0 alone: lifts the launcher's binding to one core for the duration of fn. */
static void on_every_core(void (*fn)(void *), void *arg) {
    cpu_set_t bound, all;
    int have = sched_getaffinity(0, sizeof bound, &bound) == 0;
    CPU_ZERO(&all);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    for (long c = 0; c < cores && c < CPU_SETSIZE; c++) CPU_SET((int)c, &all);
    if (have) sched_setaffinity(0, sizeof all, &all);
    fn(arg);
    if (have) sched_setaffinity(0, sizeof bound, &bound);
}

typedef struct shm_job {
    int p;
    size_t n;
    int reps;
    double seconds;
} shm_job;

static void shm_job_run(void *arg) {
    shm_job *j = arg;
    j->seconds = time_shm(j->p, j->n, j->reps);
}

static int allreduce_table(mwb_ctx *ctx, int p, int me) {
    int proc_of[MAX_RANKS];
    for (int r = 0; r < p; r++) proc_of[r] = r;
    mw__comm_options opt = {.proc_of = proc_of, .self_proc = me};
    mw__comm *comm = NULL;
    if (HIER.comm_new(p, NULL, &opt, &comm)) {
        fprintf(stderr, "mpi: %s\n", mw_last_error());
        return 1;
    }
    static const size_t sizes[] = {1 << 10, 1 << 14, 1 << 18, 1 << 22, 1 << 24}; /* floats */
    int nsizes = ctx->quick ? 2 : 5, rc = 0;
    printf("all-reduce over %d processes (1 device each), in place, float sum: meshwit against "
           "MPI_Allreduce (alternating, median of %d each, %d from 16 MiB), and %d threads of one "
           "process\n",
           p, reps_for(1, ctx->quick), reps_for(LARGE, ctx->quick), p);
    printf("%10s %14s %18s %8s %14s\n", "bytes", "meshwit (us)", "MPI_Allreduce (us)", "ratio",
           "threads (us)");
    for (int s = 0; s < nsizes && !rc; s++) {
        double t_mw = 0, t_mpi = 0;
        int reps = reps_for(sizes[s], ctx->quick);
        int bad = time_procs(comm, me, sizes[s], reps, &t_mw, &t_mpi);
        shm_job job = {.p = p, .n = sizes[s], .reps = reps};
        if (me == 0) on_every_core(shm_job_run, &job);
        if (sleepy_barrier() || bad || job.seconds < 0) {
            fprintf(stderr, "mpi: [rank %d] %s\n", me, bad ? mw_last_error() : "barrier failed");
            rc = 1;
            break;
        }
        double bytes = (double)sizes[s] * 4;
        printf("%10.0f %14.1f %18.1f %7.2fx %14.1f\n", bytes, t_mw * 1e6, t_mpi * 1e6,
               t_mpi > 0 ? t_mw / t_mpi : 0.0, job.seconds * 1e6);
        mwb_record r = {0};
        mwb_record_str(&r, "case", "mpi");
        char dev[32];
        snprintf(dev, sizeof dev, "%dx cpu:1", p);
        mwb_record_str(&r, "devices", dev);
        mwb_record_str(&r, "mode", "allreduce");
        mwb_record_num(&r, "bytes", bytes);
        mwb_record_num(&r, "processes_us", t_mw * 1e6);
        mwb_record_num(&r, "mpi_allreduce_us", t_mpi * 1e6);
        mwb_record_num(&r, "ratio_to_mpi", t_mpi > 0 ? t_mw / t_mpi : 0.0);
        mwb_record_num(&r, "threads_us", job.seconds * 1e6);
        ctx->emit(ctx, &r);
    }
    HIER.comm_free(comm);
    return rc;
}

#define GPT2_ROUNDS 7
#define GPT2_STEPS 4
#define PIPE_MICRO 8 /* micro-batches of the pipeline's step: 8 of 4 sequences */

/* Rank 0's models of one process (cpu:P and cpu:1): made and stepped on every core. */
typedef struct local_models {
    const char *spec[2];
    mwb_gpt2 *m[2];
    mwb_gpt2_times t[2];
    int steps, bad;
    char err[400];
} local_models;

static void local_new(void *arg) {
    local_models *l = arg;
    for (int i = 0; i < 2 && !l->bad; i++) {
        mw_mesh *mesh = NULL;
        l->bad = mw_mesh_new_local(l->spec[i], "X", &mesh) != MW_OK;
        if (l->bad)
            snprintf(l->err, sizeof l->err, "%s: %s", l->spec[i], mw_last_error());
        else
            l->bad = mwb_gpt2_new(mesh, 0, &l->m[i], l->err, sizeof l->err);
        mw_mesh_free(mesh); /* the trainer keeps what it needs */
    }
}

static void local_steps(void *arg) {
    local_models *l = arg;
    for (int i = 0; i < 2 && !l->bad; i++)
        l->bad = mwb_gpt2_steps(l->m[i], l->steps, &l->t[i], l->err, sizeof l->err);
}

static void gpt2_row(mwb_ctx *ctx, const char *devices, const char *mode, int procs,
                     const mwb_gpt2_times *t, double base_ms) {
    double tps = 32.0 * 32.0 / (t->ms * 1e-3);
    printf("%-34s %10.1f %10.0f %8.2fx %11.1f %11.1f\n", devices, t->ms, tps, base_ms / t->ms,
           t->reduce_ms, t->update_ms);
    mwb_record r = {0};
    mwb_record_str(&r, "case", "mpi");
    mwb_record_str(&r, "devices", devices);
    mwb_record_str(&r, "mode", mode);
    mwb_record_num(&r, "processes", procs);
    mwb_record_num(&r, "batch", 32);
    mwb_record_num(&r, "seq", 32);
    mwb_record_num(&r, "ms_per_step", t->ms);
    mwb_record_num(&r, "tokens_per_s", tps);
    mwb_record_num(&r, "speedup", base_ms / t->ms);
    mwb_record_num(&r, "reduce_ms", t->reduce_ms);
    mwb_record_num(&r, "update_ms", t->update_ms);
    ctx->emit(ctx, &r);
}

/* Medians of each field over n rounds (reorders nothing the caller keeps). */
static mwb_gpt2_times median_times(const mwb_gpt2_times *t, int n) {
    double ms[GPT2_ROUNDS], rd[GPT2_ROUNDS], up[GPT2_ROUNDS];
    for (int i = 0; i < n; i++) {
        ms[i] = t[i].ms;
        rd[i] = t[i].reduce_ms;
        up[i] = t[i].update_ms;
    }
    return (mwb_gpt2_times){mwb_median(ms, n), mwb_median(rd, n), mwb_median(up, n), t[0].threads};
}

/* The three configurations in rounds: every round steps the processes' model, then rank 0's
 * cpu:P and cpu:1 while the others sleep, so a change in the machine's load reaches all three. */
static int gpt2_table(mwb_ctx *ctx, int p, int me) {
    int rounds = ctx->quick ? 2 : GPT2_ROUNDS, steps = ctx->quick ? 1 : GPT2_STEPS;
    printf("tiny GPT-2, batch 32 x 32, AdamW: %d processes of cpu:1 against cpu:%d and cpu:1 in "
           "one process (rank 0, the others asleep), and in %d pipeline stages across the "
           "processes (%d micro-batches), in %d rounds of %d steps each after a warm-up, "
           "medians; reduce and update: device 0's ms/step in collectives and in the update (not "
           "split out of a pipeline's step: 0)\n",
           p, p, p, PIPE_MICRO, rounds, steps);
    printf("%-34s %10s %10s %9s %11s %11s\n", "devices", "ms/step", "tokens/s", "vs cpu:1",
           "reduce ms", "update ms");
    char spec[16], err[400] = "";
    snprintf(spec, sizeof spec, "cpu:%d", p);
    local_models l = {.spec = {spec, "cpu:1"}};
    mw_mesh *mesh = NULL, *pmesh = NULL;
    mwb_gpt2 *procs = NULL, *pipe = NULL;
    int bad = mw_mesh_new("cpu:1", "X", &mesh) != MW_OK || mw_mesh_new("cpu:1", "P", &pmesh);
    if (bad)
        snprintf(err, sizeof err, "%s", mw_last_error());
    else
        bad = mwb_gpt2_new(mesh, 0, &procs, err, sizeof err);
    /* The same model in p stages, one per process, the batch in PIPE_MICRO micro-batches. */
    mw_trainer_config ptc = mwb_gpt2_config(0);
    ptc.pipeline_axis = "P";
    ptc.micro_batches = PIPE_MICRO;
    ptc.pipeline_schedule = MW_SCHEDULE_1F1B;
    gpt2_config tiny;
    gpt2_preset("tiny", &tiny);
    if (!bad)
        bad = mwb_gpt2_make_mesh(pmesh, &tiny, MWB_GPT2_BATCH, MWB_GPT2_SEQ, NULL, NULL, &ptc,
                                 &pipe, err, sizeof err);
    if (me == 0 && !bad) on_every_core(local_new, &l);
    mwb_gpt2_times tp[GPT2_ROUNDS], tt[GPT2_ROUNDS], t1[GPT2_ROUNDS], tq[GPT2_ROUNDS];
    for (int r = -1; r < rounds; r++) { /* round -1 is the warm-up */
        mwb_gpt2_times t = {0};
        if (!bad) bad = mwb_gpt2_steps(procs, steps, &t, err, sizeof err);
        if (r >= 0) tp[r] = t;
        if (!bad) bad = mwb_gpt2_steps(pipe, steps, &t, err, sizeof err);
        if (r >= 0) tq[r] = t;
        l.steps = steps;
        if (me == 0 && !bad && !l.bad) on_every_core(local_steps, &l);
        if (r >= 0) {
            tt[r] = l.t[0];
            t1[r] = l.t[1];
        }
        /* Every process learns whether rank 0's models failed before the next round. */
        int failed = bad || l.bad, any = 0;
        if (sleepy_barrier() ||
            MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
            any = 1;
        if (any) {
            bad = 1;
            break;
        }
    }
    for (int i = 0; i < 2; i++) mwb_gpt2_free(l.m[i]);
    mwb_gpt2_free(procs);
    mwb_gpt2_free(pipe);
    mw_mesh_free(mesh);
    mw_mesh_free(pmesh);
    if (bad) {
        fprintf(stderr, "mpi: gpt2: [rank %d] %s\n", me, l.bad ? l.err : err);
        return 1;
    }
    if (me != 0) return 0;
    mwb_gpt2_times mp = median_times(tp, rounds), mt = median_times(tt, rounds),
                   m1 = median_times(t1, rounds), mq = median_times(tq, rounds);
    char what[48];
    snprintf(what, sizeof what, "%d processes x cpu:1", p);
    gpt2_row(ctx, what, "gpt2_processes", p, &mp, m1.ms);
    snprintf(what, sizeof what, "cpu:%d (threads of one process)", p);
    gpt2_row(ctx, what, "gpt2_threads", 1, &mt, m1.ms);
    gpt2_row(ctx, "cpu:1", "gpt2_one_device", 1, &m1, m1.ms);
    snprintf(what, sizeof what, "%d processes as P=%d stages (1F1B)", p, p);
    gpt2_row(ctx, what, "gpt2_pipeline", p, &mq, m1.ms);
    printf("processes / threads: %.2fx the tokens/s\n", mt.ms / mp.ms);
    return 0;
}

int mwb_case_mpi(mwb_ctx *ctx) {
    if (mw_distributed_init(NULL, NULL) != MW_OK) {
        fprintf(stderr, "mpi: %s\n", mw_last_error());
        return 1;
    }
    int p = mw_distributed_size(), me = mw_distributed_rank();
    if (p < 2) {
        printf("mpi: not launched under mpirun with more than one process; skipped (try: "
               "mpirun -np 2 meshwit-bench mpi)\n");
        return 0;
    }
    if (p > MAX_RANKS) {
        fprintf(stderr, "mpi: %d processes; this case measures at most %d\n", p, MAX_RANKS);
        return 1;
    }
    int rc = allreduce_table(ctx, p, me);
    printf("\n");
    return rc ? rc : gpt2_table(ctx, p, me);
}
#endif
