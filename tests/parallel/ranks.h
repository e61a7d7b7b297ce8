/* The shared-memory reducer's tests' ranks as threads (test_reducer.c, test_reducer_p2p.c): a
 * worker per rank runs one function and records what it saw, and the test thread asserts on it
 * after run_ranks has joined them all (cr_assert only on the test's own thread). */
#ifndef MW_TESTS_PARALLEL_RANKS_H
#define MW_TESTS_PARALLEL_RANKS_H

#include <criterion/criterion.h>

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "collectives/reducer.h"
#include "collectives/wait.h"
#include "core/error.h"

typedef struct worker worker;
typedef void (*rank_fn)(worker *w);

struct worker {
    pthread_t thread;
    mw__comm *comm;
    int rank, p;
    rank_fn fn;
    void *arg;  /* the test's, for fn */
    float *buf; /* the rank's buffer of n floats, in the tests that give each rank one */
    size_t n;
    mw_status st;
    char msg[MW__MSG_SIZE];
    long wrong; /* what the rank found wrong: elements that differ, barriers left early */
    double elapsed_ms;
};

static inline double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static inline void *thread_main(void *arg) {
    worker *w = arg;
    w->fn(w);
    return NULL;
}

/* A shared-memory communicator of p ranks with the given timeout (0: none) and gang event (or
 * NULL), asserted made. */
static inline mw__comm *shm_comm(int p, int timeout_ms, mw__event *wake) {
    mw__comm *comm = NULL;
    mw__comm_options opt = {.timeout_ms = timeout_ms, .wake = wake};
    cr_assert_eq(mw__reducer_shm.comm_new(p, NULL, &opt, &comm), MW_OK, "comm_new(%d): %s", p,
                 mw_last_error());
    cr_assert_not_null(comm);
    return comm;
}

/* Runs fn on p threads, one per rank, and joins them. */
static inline void run_ranks(mw__comm *comm, int p, worker *w, rank_fn fn, void *arg) {
    for (int r = 0; r < p; r++) {
        w[r].comm = comm;
        w[r].rank = r;
        w[r].p = p;
        w[r].fn = fn;
        w[r].arg = arg;
        cr_assert_eq(pthread_create(&w[r].thread, NULL, thread_main, &w[r]), 0);
    }
    for (int r = 0; r < p; r++) pthread_join(w[r].thread, NULL);
}

/* Whether thread `tid` of this process is asleep (state S in /proc/self/task/<tid>/stat): a
 * rank's thread asleep in a wait, so that an abort or a late peer reaches it there. */
static inline int thread_sleeping(long tid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%ld/stat", tid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *end = strrchr(buf, ')'); /* the thread's name, in parentheses, may hold spaces */
    return end && end[1] == ' ' && end[2] == 'S';
}

#endif
