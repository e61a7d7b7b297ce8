/* The "mpi" case: the cost of the all-reduce between processes (the hierarchical reducer, one
 * device per process, MPI between them) beside the one inside a process (the shared-memory
 * reducer, one thread per device), for the same number of ranks and message sizes.
 *
 * Run it under mpirun with more than one process, e.g.
 *   mpirun -np 2 build/meshwit-bench mpi
 * Otherwise it prints a note and skips. Only rank 0 prints and emits records; while it measures
 * the in-process reducer, the other processes wait in a barrier. Times are medians. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "core/error.h"
#include "meshwit.h"
#include "parallel/reducer.h"

#ifndef MESHWIT_HAVE_MPI
int mwb_case_mpi(mwb_ctx *ctx) {
    (void)ctx;
    printf("mpi: this build has no MPI (configure with -DMESHWIT_MPI=ON); skipped\n");
    return 0;
}
#else

#define MAX_RANKS 64
#define REPS 21

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
        if (r->st == MW_OK) r->st = mw__reducer_shm.allreduce_sum(r->comm, r->rank, r->buf, r->n);
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

/* Median seconds of one all-reduce of n floats among the processes (rank 0's view). */
static double time_mpi(mw__comm *comm, int rank, size_t n, int reps) {
    float *buf = calloc(n ? n : 1, sizeof(float));
    double times[REPS];
    if (!buf) return -1;
    mw_status st = MW_OK;
    for (int i = 0; i < reps && st == MW_OK; i++) {
        st = mw__reducer_mpi_hier.barrier(comm, rank);
        double t0 = mwb_now();
        if (st == MW_OK) st = mw__reducer_mpi_hier.allreduce_sum(comm, rank, buf, n);
        times[i] = mwb_now() - t0;
    }
    free(buf);
    return st == MW_OK ? mwb_median(times, reps) : -1;
}

static void finalize_at_exit(void) { mw_distributed_finalize(); }

int mwb_case_mpi(mwb_ctx *ctx) {
    if (mw_distributed_init(NULL, NULL) != MW_OK) {
        fprintf(stderr, "mpi: %s\n", mw_last_error());
        return 1;
    }
    atexit(finalize_at_exit);
    int p = mw_distributed_size(), me = mw_distributed_rank();
    if (p < 2) {
        printf("mpi: not launched under mpirun with more than one process; skipped (try: "
               "mpirun -np 2 meshwit-bench mpi)\n");
        return 0;
    }
    if (p > MAX_RANKS) p = MAX_RANKS;
    int proc_of[MAX_RANKS];
    for (int r = 0; r < p; r++) proc_of[r] = r;
    mw__comm_options opt = {.proc_of = proc_of, .self_proc = me};
    mw__comm *comm = NULL;
    if (mw__reducer_mpi_hier.comm_new(p, NULL, &opt, &comm)) {
        fprintf(stderr, "mpi: %s\n", mw_last_error());
        return 1;
    }
    static const size_t sizes[] = {1 << 10, 1 << 14, 1 << 18, 1 << 22}; /* floats */
    int nsizes = ctx->quick ? 2 : 4, reps = ctx->quick ? 5 : REPS, rc = 0;
    if (me == 0) {
        printf("all-reduce over %d ranks: %d processes (1 device each, MPI between them) vs %d "
               "threads of one process (shared memory)\n",
               p, p, p);
        printf("%12s %16s %16s %10s\n", "bytes", "processes (us)", "threads (us)", "ratio");
    }
    for (int s = 0; s < nsizes && !rc; s++) {
        double t_mpi = time_mpi(comm, me, sizes[s], reps);
        double t_shm = 0;
        if (me == 0) t_shm = time_shm(p, sizes[s], reps);
        /* The others wait here while rank 0 measures threads alone. */
        if (mw__reducer_mpi_hier.barrier(comm, me) || t_mpi < 0 || t_shm < 0) {
            fprintf(stderr, "mpi: [rank %d] %s\n", me, mw_last_error());
            rc = 1;
            break;
        }
        if (me != 0) continue;
        double bytes = (double)sizes[s] * 4;
        printf("%12.0f %16.1f %16.1f %9.1fx\n", bytes, t_mpi * 1e6, t_shm * 1e6,
               t_shm > 0 ? t_mpi / t_shm : 0.0);
        mwb_record r = {0};
        mwb_record_str(&r, "case", "mpi");
        char dev[32];
        snprintf(dev, sizeof dev, "%dx cpu:1", p);
        mwb_record_str(&r, "devices", dev);
        mwb_record_num(&r, "bytes", bytes);
        mwb_record_num(&r, "processes_us", t_mpi * 1e6);
        mwb_record_num(&r, "threads_us", t_shm * 1e6);
        ctx->emit(ctx, &r);
    }
    mw__reducer_mpi_hier.comm_free(comm);
    return rc;
}
#endif
