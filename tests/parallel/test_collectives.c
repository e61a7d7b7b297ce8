/* The shared-memory reducer's broadcast, and abort, timeout and reset for each of reduce-scatter,
 * all-gather and broadcast as for the all-reduce (tests/parallel/test_reducer_rs.c checks the
 * sums and parts). Worker threads only record what they saw; the test thread asserts after
 * joining them. */
#include <criterion/criterion.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collectives/reducer.h"
#include "core/error.h"

#define MAXP 4

enum op { RS, AG, BC, NOPS };
static const char *const op_names[NOPS] = {"reduce-scatter", "all-gather", "broadcast"};

static const mw__reducer_vtable *R = &mw__reducer_shm;

typedef struct job {
    pthread_t thread;
    mw__comm *comm;
    int rank, p, op, root, skip; /* skip: this rank does not call (it fails or aborts) */
    int abort_after;             /* this rank aborts once the others entered */
    _Atomic int *entered;
    float *buf;
    size_t n;
    size_t bounds[MAXP + 1];
    mw_status st;
    char msg[MW__MSG_SIZE];
} job;

static float input(int r, size_t i) {
    uint32_t x = (uint32_t)(r * 7919 + 3) * 2654435761u ^ (uint32_t)i * 40503u;
    x ^= x >> 15;
    return (float)(x & 0xffff) / 64.0f - 512.0f;
}

static mw_status call(job *j) {
    switch (j->op) {
    case RS: return R->reduce_scatter_sum(j->comm, j->rank, j->buf, j->n, MW_F32, j->bounds);
    case AG: return R->all_gather(j->comm, j->rank, j->buf, j->n, MW_F32, j->bounds);
    default: return R->broadcast(j->comm, j->rank, j->buf, j->n, MW_F32, j->root);
    }
}

static void *job_main(void *arg) {
    job *j = arg;
    if (j->abort_after) {
        while (atomic_load(j->entered) < j->p - 1) sched_yield();
        struct timespec nap = {0, 20 * 1000000L}; /* most likely asleep in the wait by now */
        nanosleep(&nap, NULL);
        R->abort(j->comm);
        return NULL;
    }
    if (j->skip) return NULL;
    if (j->entered) atomic_fetch_add(j->entered, 1);
    j->st = call(j);
    snprintf(j->msg, sizeof j->msg, "%s", mw_last_error());
    return NULL;
}

/* Runs op on p ranks, buffers of n floats filled with input(rank, .), and joins them. */
static void run(mw__comm *comm, int p, job *j, int op, size_t n, int root) {
    for (int r = 0; r < p; r++) {
        j[r].comm = comm;
        j[r].rank = r;
        j[r].p = p;
        j[r].op = op;
        j[r].root = root;
        j[r].n = n;
        j[r].buf = malloc((n ? n : 1) * sizeof(float));
        cr_assert_not_null(j[r].buf);
        for (size_t i = 0; i < n; i++) j[r].buf[i] = input(r, i);
        for (int q = 0; q <= p; q++) j[r].bounds[q] = mw__slice_lo(n, p, q);
        cr_assert_eq(pthread_create(&j[r].thread, NULL, job_main, &j[r]), 0);
    }
    for (int r = 0; r < p; r++) pthread_join(j[r].thread, NULL);
}

static void release(job *j, int p) {
    for (int r = 0; r < p; r++) free(j[r].buf);
}

static mw__comm *new_comm(int p, int timeout_ms) {
    mw__comm *comm = NULL;
    mw__comm_options opt = {.timeout_ms = timeout_ms};
    cr_assert_eq(R->comm_new(p, NULL, &opt, &comm), MW_OK, "%s", mw_last_error());
    return comm;
}

Test(collectives, broadcast_copies_the_root_everywhere, .timeout = 60) {
    static const size_t sizes[] = {0, 1, 17, 513, 20000};
    for (int p = 1; p <= MAXP; p++) {
        mw__comm *comm = new_comm(p, 20000);
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
            for (int root = 0; root < p; root++) {
                job j[MAXP] = {{0}};
                run(comm, p, j, BC, sizes[k], root);
                for (int r = 0; r < p; r++) {
                    cr_assert_eq(j[r].st, MW_OK, "p %d root %d rank %d: %s", p, root, r, j[r].msg);
                    for (size_t i = 0; i < sizes[k]; i++)
                        cr_assert(j[r].buf[i] == input(root, i),
                                  "p %d n %zu root %d rank %d element %zu", p, sizes[k], root, r,
                                  i);
                }
                release(j, p);
            }
        R->comm_free(comm);
    }
}

static void *disagree_main(void *arg) {
    job *j = arg;
    j->st = R->broadcast(j->comm, j->rank, j->buf, j->n, MW_F32, j->rank == 1 ? 1 : 0);
    snprintf(j->msg, sizeof j->msg, "%s", mw_last_error());
    return NULL;
}

Test(collectives, broadcast_roots_that_ranks_disagree_on_or_out_of_range_fail, .timeout = 60) {
    int p = 3;
    mw__comm *comm = new_comm(p, 20000);
    job j[MAXP] = {{0}};
    float bufs[MAXP][8] = {{0}};
    for (int r = 0; r < p; r++) {
        j[r] = (job){.comm = comm, .rank = r, .buf = bufs[r], .n = 8};
        cr_assert_eq(pthread_create(&j[r].thread, NULL, disagree_main, &j[r]), 0);
    }
    for (int r = 0; r < p; r++) pthread_join(j[r].thread, NULL);
    for (int r = 0; r < p; r++) {
        cr_assert_eq(j[r].st, MW_ERR_INVALID, "rank %d", r);
        cr_assert(strstr(j[r].msg, "broadcast: ranks disagree on the root"), "%s", j[r].msg);
    }
    R->comm_free(comm);

    comm = new_comm(2, 20000);
    cr_assert_eq(R->broadcast(comm, 0, bufs[0], 8, MW_F32, 2), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "named root 2 (expected 0..1)"), "%s", mw_last_error());
    /* The bad call aborted the communicator: a peer is not left waiting for it. */
    cr_assert_eq(R->broadcast(comm, 1, bufs[1], 8, MW_F32, 0), MW_ERR_ABORTED);
    R->comm_free(comm);
}

/* After an abort or a timeout and a reset, op works again on the same communicator. */
static void check_works(mw__comm *comm, int p, int op) {
    job j[MAXP] = {{0}};
    size_t n = 3001;
    run(comm, p, j, op, n, p - 1);
    for (int r = 0; r < p; r++) cr_assert_eq(j[r].st, MW_OK, "%s: %s", op_names[op], j[r].msg);
    for (size_t i = j[0].bounds[0]; i < j[0].bounds[1]; i++) {
        float want = op == BC ? input(p - 1, i) : input(0, i);
        if (op == RS)
            for (int q = 1; q < p; q++) want += input(q, i);
        cr_assert(j[0].buf[i] == want, "%s after reset: element %zu", op_names[op], i);
    }
    release(j, p);
}

Test(collectives, abort_releases_waiters_and_reset_recovers, .timeout = 60) {
    static const size_t lens[] = {100, 200000};
    int p = 3;
    mw__comm *comm = new_comm(p, 0);
    for (int op = 0; op < NOPS; op++)
        for (size_t k = 0; k < 2; k++) {
            _Atomic int entered = 0;
            job j[MAXP] = {{0}};
            for (int r = 0; r < p; r++) j[r].entered = &entered;
            j[0].abort_after = 1; /* rank 0 fails instead of entering */
            run(comm, p, j, op, lens[k], 1);
            for (int r = 1; r < p; r++) {
                cr_assert_eq(j[r].st, MW_ERR_ABORTED, "%s rank %d got %s: %s", op_names[op], r,
                             mw_status_name(j[r].st), j[r].msg);
                cr_assert(strstr(j[r].msg, op_names[op]), "%s", j[r].msg);
            }
            release(j, p);
            R->reset(comm);
            check_works(comm, p, op);
        }
    R->comm_free(comm);
}

Test(collectives, timeout_when_a_rank_never_arrives, .timeout = 60) {
    int p = 3, timeout_ms = 200;
    mw__comm *comm = new_comm(p, timeout_ms);
    for (int op = 0; op < NOPS; op++) {
        job j[MAXP] = {{0}};
        j[p - 1].skip = 1;
        run(comm, p, j, op, 50000, 0);
        int timed_out = 0;
        for (int r = 0; r < p - 1; r++) {
            cr_assert(j[r].st == MW_ERR_TIMEOUT || j[r].st == MW_ERR_ABORTED, "rank %d got %s: %s",
                      r, mw_status_name(j[r].st), j[r].msg);
            if (j[r].st != MW_ERR_TIMEOUT) continue;
            timed_out++;
            char want[96];
            snprintf(want, sizeof want, "%s timed out after %d ms: rank %d waited for rank %d",
                     op_names[op], timeout_ms, r, p - 1);
            cr_assert(strstr(j[r].msg, want), "message \"%s\" lacks \"%s\"", j[r].msg, want);
        }
        cr_assert_geq(timed_out, 1);
        release(j, p);
        R->reset(comm);
        check_works(comm, p, op);
    }
    R->comm_free(comm);
}
