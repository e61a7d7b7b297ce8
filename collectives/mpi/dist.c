/* The MPI world: initialisation, rank and size, aborting the job, the one collective the mesh
 * needs, and the collectives with a deadline that the checks between processes use. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collectives/dist.h"
#include "collectives/mpi/mpi_impl.h"
#include "core/alloc.h"
#include "core/error.h"
#include "meshwit.h"

static int initialised_here;
static int thread_level = MPI_THREAD_SINGLE;
static pthread_mutex_t mpi_mu = PTHREAD_MUTEX_INITIALIZER;

int mw__mpi_active(void) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

/* MPI may have been initialised by the program itself: ask for its thread level once. */
static int serialize(void) {
    if (thread_level == MPI_THREAD_SINGLE && mw__mpi_active()) MPI_Query_thread(&thread_level);
    return thread_level < MPI_THREAD_MULTIPLE;
}

void mw__mpi_lock(void) {
    if (serialize()) pthread_mutex_lock(&mpi_mu);
}

void mw__mpi_unlock(void) {
    if (serialize()) pthread_mutex_unlock(&mpi_mu);
}

static int launched_by_mpi(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

mw_status mw_distributed_init(int *argc, char ***argv) {
    if (mw__mpi_active() || !launched_by_mpi()) return MW_OK;
    int provided = MPI_THREAD_SINGLE;
    int rc = argc && argv ? MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided)
                          : MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS)
        return mw__error(MW_ERR_DEVICE, "mw_distributed_init: MPI_Init_thread failed (%d)", rc);
    initialised_here = 1;
    thread_level = provided;
    if (provided < MPI_THREAD_SERIALIZED) {
        /* Worker threads call MPI (one at a time); a library that cannot allow it is unusable. */
        MPI_Finalize();
        initialised_here = 0;
        return mw__error(MW_ERR_DEVICE,
                         "mw_distributed_init: this MPI gives thread level %d; meshwit needs at "
                         "least MPI_THREAD_SERIALIZED",
                         provided);
    }
    return MW_OK;
}

void mw_distributed_finalize(void) {
    if (initialised_here && mw__mpi_active()) MPI_Finalize();
    if (!mw__mpi_active()) mw__mpi_exchange_release_abandoned(); /* nothing can land now */
    initialised_here = 0;
}

int mw_distributed_rank(void) { return mw__dist_rank(); }

int mw_distributed_size(void) { return mw__dist_size(); }

int mw_distributed_available(void) { return 1; }

void mw_distributed_abort(int code) {
    if (mw__mpi_active()) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

int mw__dist_size(void) {
    int n = 1;
    if (mw__mpi_active()) MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

int mw__dist_rank(void) {
    int r = 0;
    if (mw__mpi_active()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

mw_status mw__dist_allgather_ints(const int *mine, int n, int *out) {
    if (!mw__mpi_active()) {
        memcpy(out, mine, (size_t)n * sizeof *out);
        return MW_OK;
    }
    mw__mpi_lock();
    int rc = MPI_Allgather(mine, n, MPI_INT, out, n, MPI_INT, MPI_COMM_WORLD);
    mw__mpi_unlock();
    if (rc != MPI_SUCCESS)
        return mw__error(MW_ERR_DEVICE, "MPI_Allgather among the processes failed (%d)", rc);
    return MW_OK;
}

/* --- collectives with a deadline, for the checks between processes (parallel/consistency.c) ---
 * Non-blocking MPI polled until done or timeout_ms: a process that never arrives makes the
 * others fail with MW_ERR_TIMEOUT instead of waiting forever. */

static mw_status dist_wait(MPI_Request *req, int timeout_ms, const char *what) {
    int limit = timeout_ms > 0 ? timeout_ms : MW_DISTRIBUTED_DEFAULT_TIMEOUT_MS;
    double deadline = mw__mpi_now_ms() + limit;
    for (int i = 0;; i++) {
        int done = 0;
        mw__mpi_lock();
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        mw__mpi_unlock();
        if (rc != MPI_SUCCESS)
            return mw__error(MW_ERR_DEVICE, "%s between the processes failed in MPI (%d)", what,
                             rc);
        if (done) return MW_OK;
        if (mw__mpi_now_ms() > deadline)
            return mw__error(MW_ERR_TIMEOUT,
                             "%s: not every process arrived within %d ms (one of them failed, "
                             "stalls or runs another program; end the job with "
                             "mw_distributed_abort)",
                             what, limit);
        if (i < 1000) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50000L};
            nanosleep(&ts, NULL);
        }
    }
}

static mw_status dist_started(int rc, MPI_Request *req, int timeout_ms, const char *what) {
    if (rc != MPI_SUCCESS)
        return mw__error(MW_ERR_DEVICE, "%s between the processes failed in MPI (%d)", what, rc);
    return dist_wait(req, timeout_ms, what);
}

mw_status mw__dist_allgather_u64(const uint64_t *mine, int n, uint64_t *out, int timeout_ms,
                                 const char *what) {
    MPI_Request req;
    mw__mpi_lock();
    int rc = MPI_Iallgather(mine, n, MPI_UINT64_T, out, n, MPI_UINT64_T, MPI_COMM_WORLD, &req);
    mw__mpi_unlock();
    return dist_started(rc, &req, timeout_ms, what);
}

mw_status mw__dist_allgatherv_bytes(const char *mine, const int *counts, char *out, int timeout_ms,
                                    const char *what) {
    int n = mw__dist_size(), me = mw__dist_rank();
    int *displs = mw__malloc((size_t)n * sizeof *displs);
    if (!displs) return mw__error(MW_ERR_NOMEM, "%s: out of memory", what);
    for (int p = 0, off = 0; p < n; p++) {
        displs[p] = off;
        off += counts[p];
    }
    MPI_Request req;
    mw__mpi_lock();
    int rc = MPI_Iallgatherv(mine, counts[me], MPI_CHAR, out, counts, displs, MPI_CHAR,
                             MPI_COMM_WORLD, &req);
    mw__mpi_unlock();
    mw_status st = dist_started(rc, &req, timeout_ms, what);
    mw__free(displs);
    return st;
}

mw_status mw__dist_bcast_bytes(void *buf, size_t n, int timeout_ms, const char *what) {
    const size_t chunk = (size_t)1 << 28;
    for (size_t off = 0; off < n; off += chunk) {
        size_t len = n - off < chunk ? n - off : chunk;
        MPI_Request req;
        mw__mpi_lock();
        int rc = MPI_Ibcast((char *)buf + off, (int)len, MPI_BYTE, 0, MPI_COMM_WORLD, &req);
        mw__mpi_unlock();
        mw_status st = dist_started(rc, &req, timeout_ms, what);
        if (st) return st;
    }
    return MW_OK;
}

mw_status mw__dist_max_int(int mine, int *out, int timeout_ms, const char *what) {
    MPI_Request req;
    mw__mpi_lock();
    int rc = MPI_Iallreduce(&mine, out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &req);
    mw__mpi_unlock();
    return dist_started(rc, &req, timeout_ms, what);
}
