/* The shared-memory reducer's reduce-scatter and all-gather (ZeRO-1): each rank's part against a
 * double-precision reference and bitwise against the all-reduce, the rest of the buffer left
 * alone, uneven and empty parts, mixed with all-reduces, and parts that ranks disagree on.
 * Worker threads only record what they saw; the test thread asserts after joining them. */
#include <criterion/criterion.h>

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collectives/reducer.h"
#include "core/error.h"

#define MAXP 4

static const mw__reducer_vtable *R = &mw__reducer_shm;

typedef struct rank_job {
    pthread_t thread;
    mw__comm *comm;
    /* op: 0 reduce-scatter, 1 all-gather, 2 all-reduce, 3 all-gather started and finished after
     * rank milliseconds of other work, 4 all-gather started then an all-reduce of buf2 */
    int rank, op;
    float *buf, *buf2;
    size_t n;
    size_t bounds[MAXP + 1];
    mw_status st;
} rank_job;

static void *rank_main(void *arg) {
    rank_job *j = arg;
    if (j->op == 0)
        j->st = R->reduce_scatter_sum(j->comm, j->rank, j->buf, j->n, MW_F32, j->bounds);
    else if (j->op == 1)
        j->st = R->all_gather(j->comm, j->rank, j->buf, j->n, MW_F32, j->bounds);
    else if (j->op == 2)
        j->st = R->allreduce_sum(j->comm, j->rank, j->buf, j->n, MW_F32);
    else if ((j->st = R->all_gather_start(j->comm, j->rank, j->buf, j->n, MW_F32, j->bounds)))
        return NULL;
    if (j->op == 3) {
        struct timespec nap = {0, (long)j->rank * 1000000L};
        nanosleep(&nap, NULL);
    }
    if (j->op == 4 && (j->st = R->allreduce_sum(j->comm, j->rank, j->buf2, j->n, MW_F32)))
        return NULL;
    if (j->op >= 3) j->st = R->finish(j->comm, j->rank);
    return NULL;
}

/* Runs op on p threads (bounds as given) and joins them. */
static void run(mw__comm *comm, int p, rank_job *j, int op, const size_t *bounds) {
    for (int r = 0; r < p; r++) {
        j[r].comm = comm;
        j[r].rank = r;
        j[r].op = op;
        if (bounds) memcpy(j[r].bounds, bounds, (size_t)(p + 1) * sizeof *bounds);
        cr_assert_eq(pthread_create(&j[r].thread, NULL, rank_main, &j[r]), 0);
    }
    for (int r = 0; r < p; r++) pthread_join(j[r].thread, NULL);
}

static mw__comm *new_comm(int p) {
    mw__comm *comm = NULL;
    mw__comm_options opt = {.timeout_ms = 20000};
    cr_assert_eq(R->comm_new(p, NULL, &opt, &comm), MW_OK, "%s", mw_last_error());
    return comm;
}

/* Values of mixed magnitude and sign, so that the order of the adds shows in the bits. */
static float input(int r, size_t i) {
    uint32_t x = (uint32_t)(r * 7919 + 1) * 2654435761u ^ (uint32_t)i * 40503u;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    float mag = (x & 3) == 0 ? 1e4f : (x & 3) == 1 ? 1.0f : 1e-3f;
    return mag * ((float)(x >> 8 & 0xffff) / 65536.0f - 0.5f);
}

static void fill(rank_job *j, int p, size_t n) {
    for (int r = 0; r < p; r++) {
        j[r].n = n;
        j[r].buf = malloc((n ? n : 1) * sizeof(float));
        for (size_t i = 0; i < n; i++) j[r].buf[i] = input(r, i);
    }
}

static void release(rank_job *j, int p) {
    for (int r = 0; r < p; r++) free(j[r].buf);
}

/* A communicator of p ranks and two sets of their buffers of n floats, filled alike. */
static mw__comm *open_two(int p, size_t n, rank_job *a, rank_job *b) {
    fill(a, p, n);
    fill(b, p, n);
    return new_comm(p);
}

/* Reduce-scatter of n floats over p ranks with the given parts: each part bitwise equal to the
 * all-reduce's result there and within float rounding of the double sum; the rest untouched. */
static void check_reduce_scatter(int p, size_t n, const size_t *bounds) {
    rank_job rs[MAXP] = {{0}}, ar[MAXP] = {{0}};
    mw__comm *comm = open_two(p, n, rs, ar);
    run(comm, p, rs, 0, bounds);
    run(comm, p, ar, 2, NULL);
    for (int r = 0; r < p; r++) {
        cr_assert_eq(rs[r].st, MW_OK, "p %d n %zu rank %d", p, n, r);
        cr_assert_eq(ar[r].st, MW_OK);
        for (size_t i = 0; i < n; i++) {
            int mine = i >= bounds[r] && i < bounds[r + 1];
            if (!mine) {
                cr_assert(rs[r].buf[i] == input(r, i), "p %d n %zu rank %d touched %zu", p, n, r,
                          i);
                continue;
            }
            double ref = 0.0, mag = 0.0;
            for (int q = 0; q < p; q++) ref += input(q, i), mag += fabs(input(q, i));
            cr_assert(memcmp(&rs[r].buf[i], &ar[r].buf[i], sizeof(float)) == 0,
                      "p %d n %zu rank %d element %zu: %a, all-reduce %a", p, n, r, i,
                      (double)rs[r].buf[i], (double)ar[r].buf[i]);
            cr_assert(fabs(rs[r].buf[i] - ref) <= 1e-6 * mag + 1e-30, "element %zu: %g vs %g", i,
                      (double)rs[r].buf[i], ref);
        }
    }
    release(rs, p);
    release(ar, p);
    R->comm_free(comm);
}

static void slices(size_t n, int p, size_t *bounds) {
    for (int r = 0; r <= p; r++) bounds[r] = mw__slice_lo(n, p, r);
}

Test(reducer_rs, reduce_scatter_matches_all_reduce_and_double_reference, .timeout = 60) {
    const size_t sizes[] = {1, 15, 17, 100, 513, 4099, 20000};
    for (int p = 2; p <= MAXP; p++)
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            size_t b[MAXP + 1];
            slices(sizes[k], p, b);
            cr_assert_eq(b[0], 0);
            cr_assert_eq(b[p], sizes[k]);
            check_reduce_scatter(p, sizes[k], b);
        }
}

Test(reducer_rs, uneven_and_empty_parts, .timeout = 60) {
    const size_t three[] = {0, 0, 5000, 5003}; /* rank 0 empty, rank 1 big, rank 2 tiny */
    check_reduce_scatter(3, 5003, three);
    const size_t inner[] = {10, 11, 11, 4000, 4001}; /* parts inside the buffer, one empty */
    check_reduce_scatter(4, 4100, inner);
    const size_t none[] = {0, 0, 0};
    check_reduce_scatter(2, 0, none);
}

/* Blocking, and split in two (FSDP's prefetch: started, then finished by each rank after its
 * own delay), round after round. */
Test(reducer_rs, all_gather_assembles_every_part, .timeout = 60) {
    for (int p = 2; p <= MAXP; p++) {
        size_t n = 3001 + (size_t)p, b[MAXP + 1];
        slices(n, p, b);
        mw__comm *comm = new_comm(p);
        rank_job j[MAXP] = {{0}};
        fill(j, p, n); /* rank r's buffer holds input(r, .) everywhere: its part is the truth */
        for (int round = 0; round < 4; round++) {
            run(comm, p, j, round % 2 ? 3 : 1, b);
            for (int r = 0; r < p; r++) {
                cr_assert_eq(j[r].st, MW_OK, "%s", mw_last_error());
                for (int q = 0; q < p; q++)
                    for (size_t i = b[q]; i < b[q + 1]; i++)
                        cr_assert(j[r].buf[i] == input(q, i), "p %d rank %d element %zu", p, r, i);
            }
        }
        cr_assert_eq(R->finish(comm, 0), MW_OK, "finish with nothing started");
        release(j, p);
        R->comm_free(comm);
    }
}

/* A reduce-scatter then an all-gather over the same parts is the all-reduce, bit for bit. */
Test(reducer_rs, reduce_scatter_then_all_gather_is_all_reduce, .timeout = 60) {
    int p = 3;
    size_t n = 10007, b[MAXP + 1];
    slices(n, p, b);
    rank_job j[MAXP] = {{0}}, ar[MAXP] = {{0}};
    mw__comm *comm = open_two(p, n, j, ar);
    run(comm, p, j, 0, b);
    run(comm, p, j, 1, b);
    run(comm, p, ar, 2, NULL);
    for (int r = 0; r < p; r++)
        cr_assert(memcmp(j[r].buf, ar[r].buf, n * sizeof(float)) == 0, "rank %d", r);
    release(j, p);
    release(ar, p);
    R->comm_free(comm);
}

static void *disagree_main(void *arg) {
    rank_job *j = arg;
    if (j->rank == 1) j->bounds[1]++; /* rank 1 cuts the parts elsewhere */
    j->st = R->reduce_scatter_sum(j->comm, j->rank, j->buf, j->n, MW_F32, j->bounds);
    return NULL;
}

/* Runs fn on p threads, rank r's job with comm, rank r and the even slices of its n floats. */
static void run_each(mw__comm *comm, int p, rank_job *j, void *(*fn)(void *)) {
    for (int r = 0; r < p; r++) {
        j[r].comm = comm;
        j[r].rank = r;
        slices(j[r].n, p, j[r].bounds);
        cr_assert_eq(pthread_create(&j[r].thread, NULL, fn, &j[r]), 0);
    }
    for (int r = 0; r < p; r++) pthread_join(j[r].thread, NULL);
}

/* Two ranks that call fn fail with MW_ERR_INVALID, both, their buffers untouched. */
static void refused_everywhere(void *(*fn)(void *)) {
    int p = 2;
    mw__comm *comm = new_comm(p);
    rank_job j[MAXP] = {{0}};
    fill(j, p, 64);
    run_each(comm, p, j, fn);
    for (int r = 0; r < p; r++) {
        cr_assert_eq(j[r].st, MW_ERR_INVALID, "rank %d", r);
        for (size_t i = 0; i < 64; i++) cr_assert(j[r].buf[i] == input(r, i), "rank %d", r);
    }
    release(j, p);
    R->comm_free(comm);
}

Test(reducer_rs, parts_that_ranks_disagree_on_fail_everywhere, .timeout = 60) {
    refused_everywhere(disagree_main);
}

Test(reducer_rs, parts_outside_the_buffer_are_refused, .timeout = 60) {
    mw__comm *comm = new_comm(1);
    float x[4] = {0};
    size_t past[] = {0, 5};
    cr_assert_eq(R->reduce_scatter_sum(comm, 0, x, 4, MW_F32, past), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "reduce-scatter"), "%s", mw_last_error());
    R->reset(comm);
    size_t down[] = {3, 1};
    cr_assert_eq(R->all_gather(comm, 0, x, 4, MW_F32, down), MW_ERR_INVALID);
    R->reset(comm);
    cr_assert_eq(R->all_gather(comm, 0, x, 4, MW_F32, NULL), MW_ERR_INVALID);
    R->comm_free(comm);
}

/* A collective called while a gather is in flight completes the gather first: both results as
 * if run one after the other. */
Test(reducer_rs, another_collective_completes_a_started_gather, .timeout = 60) {
    int p = 3;
    size_t n = 2000, b[MAXP + 1];
    slices(n, p, b);
    rank_job j[MAXP] = {{0}}, ar[MAXP] = {{0}};
    mw__comm *comm = open_two(p, n, j, ar);
    for (int r = 0; r < p; r++) {
        j[r].buf2 = malloc(n * sizeof(float));
        memcpy(j[r].buf2, ar[r].buf, n * sizeof(float));
    }
    run(comm, p, j, 4, b);
    run(comm, p, ar, 2, NULL);
    for (int r = 0; r < p; r++) {
        cr_assert_eq(j[r].st, MW_OK, "%s", mw_last_error());
        for (int q = 0; q < p; q++)
            for (size_t i = b[q]; i < b[q + 1]; i++)
                cr_assert(j[r].buf[i] == input(q, i), "rank %d element %zu", r, i);
        cr_assert(memcmp(j[r].buf2, ar[r].buf, n * sizeof(float)) == 0, "rank %d", r);
        free(j[r].buf2);
    }
    release(j, p);
    release(ar, p);
    R->comm_free(comm);
}

static void *short_start_main(void *arg) {
    rank_job *j = arg;
    size_t n = j->rank == 1 ? j->n - 1 : j->n; /* rank 1 passes a shorter buffer */
    if (j->rank == 1) j->bounds[2] = n;
    j->st = R->all_gather_start(j->comm, j->rank, j->buf, n, MW_F32, j->bounds);
    if (j->st == MW_OK) j->st = R->finish(j->comm, j->rank);
    return NULL;
}

/* Ranks that started gathers of different lengths fail when they finish, every one of them,
 * before any copies a part. */
Test(reducer_rs, started_gathers_of_different_lengths_fail_everywhere, .timeout = 60) {
    refused_everywhere(short_start_main);
}

static void *abort_soon(void *arg) {
    struct timespec nap = {0, 50 * 1000000L};
    nanosleep(&nap, NULL);
    R->abort(arg);
    return NULL;
}

/* A rank whose peer never arrives: its started gather returns at once, its finish gives up
 * on the abort; after a reset the communicator gathers again. */
Test(reducer_rs, an_abort_reaches_a_started_gather, .timeout = 60) {
    int p = 2;
    size_t n = 256, b[MAXP + 1];
    slices(n, p, b);
    mw__comm *comm = new_comm(p);
    rank_job j[MAXP] = {{0}};
    fill(j, p, n);
    cr_assert_eq(R->all_gather_start(comm, 0, j[0].buf, n, MW_F32, b), MW_OK);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, abort_soon, comm), 0);
    cr_assert_eq(R->finish(comm, 0), MW_ERR_ABORTED);
    cr_assert(strstr(mw_last_error(), "all-gather aborted"), "%s", mw_last_error());
    cr_assert(strstr(mw_last_error(), "rank 1"), "%s", mw_last_error());
    pthread_join(t, NULL);
    for (size_t i = 0; i < n; i++) cr_assert(j[0].buf[i] == input(0, i));
    R->reset(comm);
    run(comm, p, j, 3, b);
    for (int r = 0; r < p; r++) {
        cr_assert_eq(j[r].st, MW_OK, "%s", mw_last_error());
        for (size_t i = b[1]; i < b[2]; i++) cr_assert(j[r].buf[i] == input(1, i));
    }
    release(j, p);
    R->comm_free(comm);
}
