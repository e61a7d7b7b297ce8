/* The harness of the reducer's tests under mpirun (mpi_collectives.c, mpi_p2p.c): the ranks of
 * a communicator spread over the processes, a thread per rank of this process that records
 * what failed, the fault checks' helpers, and main's command line:
 *
 *   NAME LOCAL LAYOUT     LOCAL ranks (threads) per process; LAYOUT block (ranks of a process
 *                         consecutive) or interleaved (rank r in process r mod P)
 *   NAME faults           2 processes
 *
 * Exit 0 when every check passes, 1 when one fails, 2 on an error. */
#ifndef MW_TESTS_MPI_MPI_RANKS_H
#define MW_TESTS_MPI_MPI_RANKS_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collectives/reducer.h"
#include "core/error.h"
#include "devices/module.h"
#include "meshwit.h"

#define MAX_RANKS 16

static const mw__reducer_vtable *R; /* libmeshwit-mpi.so's, once MPI is initialised */
static int nranks, procs, me;
static int proc_of[MAX_RANKS];
static mw__comm *comm;

typedef struct rank_job {
    pthread_t thread;
    int rank;
    long bad; /* checks that failed */
    mw_status st;
    char msg[MW__MSG_SIZE];
} rank_job;

/* In a rank's checks (rank_job *j in scope): counts a failed check, printing the first. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond) && j->bad++ == 0) {                                                            \
            printf("[rank %d] ", j->rank);                                                         \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

/* Makes a communicator of procs * local ranks in the given layout, runs rank_main on a thread
 * for each rank of this process, and reports what they recorded; `passed` says what held when
 * all is well. */
static inline int ranks_run(int local, int interleaved, void *(*rank_main)(void *),
                            const char *passed) {
    nranks = procs * local;
    if (nranks > MAX_RANKS) return 2;
    for (int r = 0; r < nranks; r++) proc_of[r] = interleaved ? r % procs : r / local;
    mw__comm_options opt = {.timeout_ms = 60000, .proc_of = proc_of, .self_proc = me};
    if (R->comm_new(nranks, NULL, &opt, &comm)) {
        fprintf(stderr, "[process %d] comm_new: %s\n", me, mw_last_error());
        return 2;
    }
    rank_job jobs[MAX_RANKS] = {{0}};
    int n = 0, rc = 0;
    for (int r = 0; r < nranks; r++)
        if (proc_of[r] == me) {
            jobs[n].rank = r;
            if (pthread_create(&jobs[n].thread, NULL, rank_main, &jobs[n])) return 2;
            n++;
        }
    for (int i = 0; i < n; i++) pthread_join(jobs[i].thread, NULL);
    for (int i = 0; i < n; i++) {
        if (jobs[i].st) {
            fprintf(stderr, "[rank %d] %s: %s\n", jobs[i].rank, mw_status_name(jobs[i].st),
                    jobs[i].msg);
            rc = 2;
        } else if (jobs[i].bad) {
            printf("[rank %d] %ld checks failed\n", jobs[i].rank, jobs[i].bad);
            if (!rc) rc = 1;
        }
    }
    R->comm_free(comm);
    printf("[process %d] %d ranks (%d here, %s): %s\n", me, nranks, n,
           interleaved ? "interleaved" : "block", rc ? "FAILED" : passed);
    return rc;
}

/* The faults' two ranks: rank r in process r. */
static inline int ranks_two_processes(void) {
    if (procs != 2) return 0;
    nranks = 2;
    proc_of[0] = 0;
    proc_of[1] = 1;
    return 1;
}

/* A communicator of the faults' two ranks that gives up after timeout_ms; 0, or 2 on an error. */
static inline int ranks_comm_of_two(int timeout_ms, mw__comm **c) {
    mw__comm_options opt = {.timeout_ms = timeout_ms, .proc_of = proc_of, .self_proc = me};
    return R->comm_new(2, NULL, &opt, c) ? 2 : 0;
}

/* A thread's body: aborts the communicator arg after 100 ms, while the test's call waits. */
static inline void *abort_later(void *arg) {
    struct timespec nap = {0, 100 * 1000000L};
    nanosleep(&nap, NULL);
    R->abort(arg);
    return NULL;
}

/* 0 when ok, else 1 with a line naming what failed and the last error. */
static inline int expect(int ok, const char *what) {
    if (!ok) printf("[process %d] FAILED: %s (%s)\n", me, what, mw_last_error());
    return ok ? 0 : 1;
}

/* main: initialises MPI and R, runs ranks_run(LOCAL, LAYOUT, rank_main, passed) or faults(), and
 * aborts every process on an error (2). */
static inline int ranks_main(int argc, char **argv, const char *name, void *(*rank_main)(void *),
                             const char *passed, int (*faults)(void)) {
    if (mw_distributed_init(&argc, &argv) != MW_OK) return 2;
    R = mw__dist()->reducer_hier;
    procs = mw_distributed_size();
    me = mw_distributed_rank();
    int rc = 2;
    if (argc == 2 && strcmp(argv[1], "faults") == 0)
        rc = faults();
    else if (argc == 3 && atoi(argv[1]) >= 1)
        rc = ranks_run(atoi(argv[1]), strcmp(argv[2], "interleaved") == 0, rank_main, passed);
    else
        fprintf(stderr, "usage: %s LOCAL block|interleaved, or faults\n", name);
    if (rc == 2) mw_distributed_abort(2);
    mw_distributed_finalize();
    return rc;
}

#endif
