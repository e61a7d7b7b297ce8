/* The shared-memory reducer: sums against a double-precision reference and against the exact
 * rank-order float sum, determinism, back-to-back collectives, abort, timeout and barrier.
 * Worker threads only record what they saw; the test thread asserts after joining them. */
#define _GNU_SOURCE /* syscall(SYS_gettid) */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "collectives/reducer.h"
#include "core/error.h"
#include "meshwit/testing.h"
#include "tests/parallel/ranks.h"

#define MAXP 8

/* Every test has a timeout (generous for sanitizer builds on a loaded machine), so a collective
 * that never returns fails its test instead of hanging the suite. */

static const mw__reducer_vtable *R = &mw__reducer_shm;

/* A reproducible value in [-1, 1) for rank r, element i. */
static float input(uint32_t seed, int r, size_t i) {
    uint64_t x = (uint64_t)seed * 0x9e3779b97f4a7c15u ^ (uint64_t)r << 40 ^ (uint64_t)i;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdu;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53u;
    x ^= x >> 33;
    return (float)((double)(x >> 40) / (double)(1u << 23)) - 1.0f;
}

static void fill(worker *w, int p, size_t n, uint32_t seed) {
    for (int r = 0; r < p; r++) {
        w[r].n = n;
        w[r].buf = malloc((n ? n : 1) * sizeof(float));
        cr_assert_not_null(w[r].buf);
        for (size_t i = 0; i < n; i++) w[r].buf[i] = input(seed, r, i);
    }
}

static void release(worker *w, int p) {
    for (int r = 0; r < p; r++) {
        free(w[r].buf);
        w[r].buf = NULL;
    }
}

static void do_allreduce(worker *w) {
    w->st = R->allreduce_sum(w->comm, w->rank, w->buf, w->n, MW_F32);
    snprintf(w->msg, sizeof w->msg, "%s", mw_last_error());
}

static void assert_all_ok(worker *w, int p, const char *what) {
    for (int r = 0; r < p; r++)
        cr_assert_eq(w[r].st, MW_OK, "%s: rank %d got %s: %s", what, r, mw_status_name(w[r].st),
                     w[r].msg);
}

Test(reducer, matches_double_reference, .timeout = 60) {
    static const size_t lens[] = {0, 1, 7, 1023, (1u << 20) + 3};
    for (int p = 1; p <= MAXP; p++) {
        mw__comm *comm = shm_comm(p, 0, NULL);
        for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
            size_t n = lens[k];
            worker w[MAXP] = {0};
            uint32_t seed = (uint32_t)(p * 100 + k);
            fill(w, p, n, seed);
            run_ranks(comm, p, w, do_allreduce, NULL);
            assert_all_ok(w, p, "all-reduce");
            for (size_t i = 0; i < n; i++) {
                double ref = 0, mag = 0;
                for (int r = 0; r < p; r++) {
                    ref += input(seed, r, i);
                    mag += fabs(input(seed, r, i));
                }
                /* Adding p floats in sequence rounds p - 1 times, each by at most FLT_EPSILON/2
                 * of a partial sum bounded by sum|x|: |error| <= (p-1) * FLT_EPSILON/2 * sum|x|.
                 * rtol = p * FLT_EPSILON on sum|x| covers it with margin; the double reference
                 * of at most 8 floats is exact to ~1e-16. atol only matters when all inputs are
                 * 0. (sum|x| rather than |ref|: the bound must hold under cancellation.) */
                double tol = FLT_MIN + p * FLT_EPSILON * mag;
                for (int r = 0; r < p; r++)
                    cr_assert(fabs(w[r].buf[i] - ref) <= tol,
                              "p=%d n=%zu rank %d element %zu: got %.9g, reference %.17g", p, n, r,
                              i, (double)w[r].buf[i], ref);
            }
            release(w, p);
        }
        R->comm_free(comm);
    }
}

/* Inputs whose float sum depends on the order of addition: magnitudes spread over 2^-20..2^20. */
static float order_input(uint32_t seed, int r, size_t i) {
    float x = input(seed, r, i);
    int e = (int)((i * 7 + (size_t)r * 13) % 41) - 20;
    return ldexpf(x, e);
}

Test(reducer, exact_rank_order, .timeout = 60) {
    /* Both sides of the small-path limit (512 floats) and uneven slices on the large path. */
    static const size_t lens[] = {7, 333, 512, 513, 4097, 100003};
    for (int p = 2; p <= MAXP; p++) {
        mw__comm *comm = shm_comm(p, 0, NULL);
        for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
            size_t n = lens[k];
            uint32_t seed = (uint32_t)(7 + p * 10 + k);
            worker w[MAXP] = {0};
            for (int r = 0; r < p; r++) {
                w[r].n = n;
                w[r].buf = malloc(n * sizeof(float));
                cr_assert_not_null(w[r].buf);
                for (size_t i = 0; i < n; i++) w[r].buf[i] = order_input(seed, r, i);
            }
            run_ranks(comm, p, w, do_allreduce, NULL);
            assert_all_ok(w, p, "all-reduce");
            size_t order_sensitive = 0;
            for (size_t i = 0; i < n; i++) {
                volatile float fwd = order_input(seed, 0, i), rev = order_input(seed, p - 1, i);
                for (int r = 1; r < p; r++) fwd = fwd + order_input(seed, r, i);
                for (int r = p - 2; r >= 0; r--) rev = rev + order_input(seed, r, i);
                float f = fwd, b = rev;
                if (memcmp(&f, &b, sizeof f) != 0) order_sensitive++;
                for (int r = 0; r < p; r++)
                    cr_assert(memcmp(&w[r].buf[i], &f, sizeof f) == 0,
                              "p=%d n=%zu rank %d element %zu: got %a, rank-order sum %a", p, n, r,
                              i, (double)w[r].buf[i], (double)f);
            }
            /* Otherwise the test could not tell rank order from another order (with two ranks
             * there is only one: float addition commutes). */
            if (p > 2 && n > 100)
                cr_assert_gt(order_sensitive, n / 20, "p=%d n=%zu: inputs are not order-sensitive",
                             p, n);
            release(w, p);
        }
        R->comm_free(comm);
    }
}

Test(reducer, bitwise_identical_across_runs_and_ranks, .timeout = 60) {
    static const int ps[] = {3, 5, 8};
    static const size_t lens[] = {333, 5000, 262147};
    for (size_t a = 0; a < sizeof ps / sizeof ps[0]; a++) {
        int p = ps[a];
        for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
            size_t n = lens[k];
            float *first = malloc(n * sizeof(float));
            cr_assert_not_null(first);
            for (int run = 0; run < 3; run++) {
                mw__comm *comm = shm_comm(p, 0, NULL); /* a fresh communicator each run */
                worker w[MAXP] = {0};
                for (int r = 0; r < p; r++) {
                    w[r].n = n;
                    w[r].buf = malloc(n * sizeof(float));
                    cr_assert_not_null(w[r].buf);
                    for (size_t i = 0; i < n; i++) w[r].buf[i] = order_input(99, r, i);
                }
                run_ranks(comm, p, w, do_allreduce, NULL);
                assert_all_ok(w, p, "all-reduce");
                if (run == 0) memcpy(first, w[0].buf, n * sizeof(float));
                for (int r = 0; r < p; r++)
                    cr_assert(memcmp(w[r].buf, first, n * sizeof(float)) == 0,
                              "p=%d n=%zu run %d rank %d differs from run 0 rank 0", p, n, run, r);
                release(w, p);
                R->comm_free(comm);
            }
            free(first);
        }
    }
}

/* Many collectives of changing sizes (both paths, and 0) on one communicator, with barriers in
 * between. Integer-valued inputs make every sum exact, so each rank checks its own results. */
#define SEQ_LEN 300
static size_t seq_len(int k) {
    static const size_t fixed[] = {0, 1, 16, 512, 513, 4097, 8191, 70001}; /* small path: <= 512 */
    if (k % 3 == 0) return fixed[(size_t)k / 3 % 8];
    return (size_t)((input(1234, 0, (size_t)k) + 1.0f) * 30000.0f);
}

static void do_sequence(worker *w) {
    float *buf = malloc(70001 * sizeof(float));
    if (!buf) {
        R->abort(w->comm); /* the peers must not wait for this rank */
        w->st = MW_ERR_NOMEM;
        return;
    }
    for (int k = 0; k < SEQ_LEN && w->st == MW_OK; k++) {
        size_t n = seq_len(k);
        for (size_t i = 0; i < n; i++)
            buf[i] = (float)((w->rank + 1) * (int)((i + (size_t)k) % 97));
        w->st = R->allreduce_sum(w->comm, w->rank, buf, n, MW_F32);
        float pp = (float)(w->p * (w->p + 1) / 2);
        for (size_t i = 0; i < n && w->st == MW_OK; i++)
            if (buf[i] != pp * (float)((i + (size_t)k) % 97)) w->wrong++;
        if (w->st == MW_OK && k % 7 == 0) w->st = R->barrier(w->comm, w->rank);
    }
    snprintf(w->msg, sizeof w->msg, "%s", mw_last_error());
    free(buf);
}

Test(reducer, many_consecutive_collectives, .timeout = 60) {
    for (int p = 2; p <= 5; p++) {
        mw__comm *comm = shm_comm(p, 0, NULL);
        worker w[MAXP] = {0};
        run_ranks(comm, p, w, do_sequence, NULL);
        assert_all_ok(w, p, "sequence");
        for (int r = 0; r < p; r++)
            cr_assert_eq(w[r].wrong, 0, "p=%d rank %d: %ld wrong elements", p, r, w[r].wrong);
        R->comm_free(comm);
    }
}

typedef struct abort_handoff {
    _Atomic int entering;
    _Atomic long tid[MAXP];
} abort_handoff;

/* Rank 0 fails: instead of entering, it aborts the communicator while the others wait. It knows
 * they wait when it has seen each of them asleep: between announcing itself and returning, a rank
 * sleeps nowhere but in the reducer's wait for its peers (which naps once a wait has lasted a
 * couple of milliseconds), so seeing it asleep proves it arrived. */
static void abort_or_allreduce(worker *w) {
    abort_handoff *h = w->arg;
    if (w->rank == 0) {
        while (atomic_load(&h->entering) < w->p - 1) sched_yield();
        for (int r = 1; r < w->p; r++)
            while (!thread_sleeping(atomic_load(&h->tid[r]))) sched_yield();
        R->abort(w->comm);
        w->st = MW_OK;
        return;
    }
    atomic_store(&h->tid[w->rank], (long)syscall(SYS_gettid));
    atomic_fetch_add(&h->entering, 1);
    do_allreduce(w);
}

static void check_works(mw__comm *comm, int p, size_t n) {
    worker w[MAXP] = {0};
    fill(w, p, n, 5);
    run_ranks(comm, p, w, do_allreduce, NULL);
    assert_all_ok(w, p, "all-reduce after reset");
    for (size_t i = 0; i < n; i++) {
        float want = input(5, 0, i);
        for (int r = 1; r < p; r++) want += input(5, r, i);
        for (int r = 0; r < p; r++) cr_assert_eq(w[r].buf[i], want);
    }
    release(w, p);
}

Test(reducer, abort_releases_waiters_and_reset_recovers, .timeout = 60) {
    static const size_t lens[] = {100, 200000};
    int p = 3;
    mw__comm *comm = shm_comm(p, 0, NULL);
    for (size_t k = 0; k < 2; k++) {
        worker w[MAXP] = {0};
        fill(w, p, lens[k], 3);
        abort_handoff handoff = {0};
        run_ranks(comm, p, w, abort_or_allreduce, &handoff);
        for (int r = 1; r < p; r++) {
            cr_assert_eq(w[r].st, MW_ERR_ABORTED, "rank %d got %s", r, mw_status_name(w[r].st));
            char want[64];
            snprintf(want, sizeof want, "rank %d was waiting for rank 0", r);
            cr_assert(strstr(w[r].msg, want), "message \"%s\" lacks \"%s\"", w[r].msg, want);
        }
        release(w, p);

        /* Still aborted: a rank entering now is refused at once. */
        float x = 1;
        cr_assert_eq(R->allreduce_sum(comm, 1, &x, 1, MW_F32), MW_ERR_ABORTED);
        cr_assert(strstr(mw_last_error(), "entered after the communicator was aborted"), "%s",
                  mw_last_error());
        cr_assert_eq(R->barrier(comm, 2), MW_ERR_ABORTED);

        R->reset(comm);
        check_works(comm, p, lens[k]);
    }
    R->comm_free(comm);
}

/* The last rank never arrives; the others must give up after timeout_ms. */
static void all_but_last(worker *w) {
    if (w->rank == w->p - 1) {
        w->st = MW_OK;
        return;
    }
    double t0 = now_ms();
    do_allreduce(w);
    w->elapsed_ms = now_ms() - t0;
}

Test(reducer, timeout_when_a_rank_never_arrives, .timeout = 60) {
    static const size_t lens[] = {10, 300000};
    int p = 3, timeout_ms = 200;
    mw__comm *comm = shm_comm(p, timeout_ms, NULL);
    for (size_t k = 0; k < 2; k++) {
        worker w[MAXP] = {0};
        fill(w, p, lens[k], 4);
        run_ranks(comm, p, w, all_but_last, NULL);
        int timed_out = 0;
        for (int r = 0; r < p - 1; r++) {
            cr_assert(w[r].st == MW_ERR_TIMEOUT || w[r].st == MW_ERR_ABORTED, "rank %d got %s: %s",
                      r, mw_status_name(w[r].st), w[r].msg);
            if (w[r].st == MW_ERR_TIMEOUT) {
                timed_out++;
                /* Never early: it must have waited the whole timeout. */
                cr_assert_geq(w[r].elapsed_ms, timeout_ms - 1, "gave up after %.1f ms",
                              w[r].elapsed_ms);
                char want[96];
                snprintf(want, sizeof want, "timed out after %d ms: rank %d waited for rank %d",
                         timeout_ms, r, p - 1);
                cr_assert(strstr(w[r].msg, want), "message \"%s\" lacks \"%s\"", w[r].msg, want);
            } else {
                cr_assert(strstr(w[r].msg, "timed out"), "message \"%s\" lacks the cause",
                          w[r].msg);
            }
        }
        cr_assert_geq(timed_out, 1);
        release(w, p);
        R->reset(comm);
        check_works(comm, p, lens[k]);
    }
    R->comm_free(comm);
}

/* Each rank counts itself in before barrier k; after it, all p of round k must be in. */
typedef struct barrier_arg {
    _Atomic long count;
} barrier_arg;

static void do_barriers(worker *w) {
    barrier_arg *a = w->arg;
    for (long k = 0; k < 500; k++) {
        atomic_fetch_add(&a->count, 1);
        w->st = R->barrier(w->comm, w->rank);
        if (w->st != MW_OK) break;
        if (atomic_load(&a->count) < (k + 1) * w->p) w->wrong++;
    }
    snprintf(w->msg, sizeof w->msg, "%s", mw_last_error());
}

Test(reducer, barrier_waits_for_everyone, .timeout = 60) {
    for (int p = 1; p <= 6; p++) {
        mw__comm *comm = shm_comm(p, 0, NULL);
        barrier_arg a = {0};
        worker w[MAXP] = {0};
        run_ranks(comm, p, w, do_barriers, &a);
        assert_all_ok(w, p, "barrier");
        for (int r = 0; r < p; r++)
            cr_assert_eq(w[r].wrong, 0, "p=%d rank %d left %ld barriers early", p, r, w[r].wrong);
        R->comm_free(comm);
    }
}

/* A contract violation must fail on every rank rather than write past a buffer. */
static void mismatched_lengths(worker *w) {
    w->st = R->allreduce_sum(w->comm, w->rank, w->buf, w->n - (size_t)w->rank, MW_F32);
    snprintf(w->msg, sizeof w->msg, "%s", mw_last_error());
}

Test(reducer, mismatched_lengths_fail_on_every_rank, .timeout = 60) {
    int p = 2;
    mw__comm *comm = shm_comm(p, 0, NULL);
    worker w[MAXP] = {0};
    fill(w, p, 4097, 6); /* rank 0 takes the large path, rank 1 the small one */
    run_ranks(comm, p, w, mismatched_lengths, NULL);
    for (int r = 0; r < p; r++) {
        cr_assert_eq(w[r].st, MW_ERR_INVALID, "rank %d got %s", r, mw_status_name(w[r].st));
        cr_assert(strstr(w[r].msg, "rank 0 has 4097 elements, rank 1 has 4096"), "%s", w[r].msg);
        for (size_t i = 0; i < 4096; i++) cr_assert_eq(w[r].buf[i], input(6, r, i));
    }
    release(w, p);
    check_works(comm, p, 5000); /* nothing to reset: every rank stayed in step */
    R->comm_free(comm);
}

Test(reducer, invalid_arguments, .timeout = 60) {
    mw__comm *comm = NULL;
    cr_assert_eq(R->comm_new(0, NULL, NULL, &comm), MW_ERR_INVALID);
    cr_assert_null(comm);
    cr_assert(strstr(mw_last_error(), "0 ranks"), "%s", mw_last_error());
    mw__comm_options bad = {.timeout_ms = -1};
    cr_assert_eq(R->comm_new(2, NULL, &bad, &comm), MW_ERR_INVALID);
    R->comm_free(NULL);

    comm = shm_comm(2, 0, NULL);
    float x = 1;
    cr_assert_eq(R->allreduce_sum(comm, 2, &x, 1, MW_F32), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "rank 2 out of range"), "%s", mw_last_error());
    /* A bad call aborts the communicator so the peer is not left waiting. */
    cr_assert_eq(R->allreduce_sum(comm, 1, &x, 1, MW_F32), MW_ERR_ABORTED);
    R->reset(comm);
    cr_assert_eq(R->allreduce_sum(comm, 0, NULL, 5, MW_F32), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "rank 0 passed a NULL buffer"), "%s", mw_last_error());
    cr_assert_eq(R->barrier(comm, 1), MW_ERR_ABORTED);
    cr_assert(strstr(mw_last_error(), "rank 0 passed an invalid argument"), "%s", mw_last_error());
    R->reset(comm);
    check_works(comm, 2, 10);
    R->comm_free(comm);
}

Test(reducer, out_of_memory_in_comm_new, .timeout = 60) {
    /* Every allocation comm_new makes, failed in turn, must give MW_ERR_NOMEM and no object. */
    int failures = 0;
    for (int64_t k = 1; k < 20; k++) {
        mw__comm *comm = (mw__comm *)&failures; /* must be overwritten with NULL */
        mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)(k));
        mw_status st = R->comm_new(4, NULL, NULL, &comm);
        int64_t made = mw_test_control(MW_TEST_ALLOCATIONS);
        mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)(0));
        if (st == MW_OK) {
            cr_assert_lt(made, k, "allocation %lld was to fail but comm_new succeeded",
                         (long long)k);
            R->comm_free(comm);
            break;
        }
        failures++;
        cr_assert_eq(st, MW_ERR_NOMEM, "allocation %lld: %s", (long long)k, mw_status_name(st));
        cr_assert_null(comm);
        cr_assert(strstr(mw_last_error(), "out of memory"), "%s", mw_last_error());
    }
    cr_assert_geq(failures, 1);
}

/* --- bf16 buffers ------------------------------------------------------------------------------
 */

#include "devices/math.h"

typedef struct bf16_job {
    int op; /* 0 all-reduce, 1 reduce-scatter, 2 all-gather, 3 broadcast */
    uint16_t *buf;
    size_t n;
    const size_t *bounds;
} bf16_job;

static void do_bf16(worker *w) {
    bf16_job *j = (bf16_job *)w->arg + w->rank;
    w->st = j->op == 0   ? R->allreduce_sum(w->comm, w->rank, j->buf, j->n, MW_BF16)
            : j->op == 1 ? R->reduce_scatter_sum(w->comm, w->rank, j->buf, j->n, MW_BF16, j->bounds)
            : j->op == 2 ? R->all_gather(w->comm, w->rank, j->buf, j->n, MW_BF16, j->bounds)
                         : R->broadcast(w->comm, w->rank, j->buf, j->n, MW_BF16, 1);
    if (w->st) snprintf(w->msg, sizeof w->msg, "%s", mw_last_error());
}

Test(reducer, bf16_sums_are_f32_sums_in_rank_order_rounded_once, .timeout = 60) {
    /* Sizes on the small and the large path, past a chunk, and odd ones. */
    static const size_t sizes[] = {1, 37, 512, 4097, 70001};
    for (int p = 2; p <= 3; p++)
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
            for (int op = 0; op < 4; op++) {
                size_t n = sizes[si];
                mw__comm *comm = shm_comm(p, 0, NULL);
                worker w[MAXP] = {0};
                bf16_job j[MAXP];
                uint16_t *orig[MAXP];
                size_t bounds[MAXP + 1];
                for (int q = 0; q <= p; q++) bounds[q] = mw__slice_lo(n, p, q);
                for (int r = 0; r < p; r++) {
                    j[r] = (bf16_job){op, malloc(n * 2), n, bounds};
                    orig[r] = malloc(n * 2);
                    for (size_t i = 0; i < n; i++)
                        orig[r][i] = j[r].buf[i] = mw__bf16_from_f32(input(9, r, i));
                    w[r].arg = j;
                }
                run_ranks(comm, p, w, do_bf16, j);
                for (int r = 0; r < p; r++) {
                    cr_assert_eq(w[r].st, MW_OK, "p %d n %zu op %d rank %d: %s", p, n, op, r,
                                 w[r].msg);
                    for (size_t i = 0; i < n; i++) {
                        float sum = 0.0f;
                        for (int q = 0; q < p; q++) sum += mw__bf16_to_f32(orig[q][i]);
                        int owner = 0;
                        while (i >= bounds[owner + 1]) owner++;
                        uint16_t want = op == 0                 ? mw__bf16_from_f32(sum)
                                        : op == 1 && owner == r ? mw__bf16_from_f32(sum)
                                        : op == 1               ? orig[r][i]
                                        : op == 2               ? orig[owner][i]
                                                                : orig[1][i];
                        cr_assert_eq(j[r].buf[i], want,
                                     "p %d n %zu op %d rank %d [%zu]: 0x%04x, "
                                     "want 0x%04x",
                                     p, n, op, r, i, j[r].buf[i], want);
                    }
                }
                for (int r = 0; r < p; r++) free(j[r].buf), free(orig[r]);
                R->comm_free(comm);
            }
}

/* Any bf16 bit pattern for rank r, element i: finite values of every exponent, subnormals, zeros
 * of both signs, infinities and NaNs; equal exponents often enough that sums round on ties. */
static uint16_t any_bf16(int r, size_t i) {
    static const uint16_t special[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc1,
                                       0x0001, 0x8001, 0x007f, 0x7f7f, 0xff7f, 0x3f81};
    float x = input(17, r, i);
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if (u % 7 == 0) return special[(u >> 8) % (sizeof special / sizeof *special)];
    if (u % 3 == 0) return (uint16_t)(0x3f80 | (u >> 9 & 0x807f)); /* exponent 0: ties */
    return (uint16_t)(u >> 7);
}

Test(reducer, bf16_all_reduce_of_any_bits_is_the_rank_order_sum_rounded_once, .timeout = 60) {
    /* Around a vector (16), a cache line (32 elements), a slice's edge in lines and a chunk (2048),
     * odd lengths; 2 ranks take the one-pass pair kernel, 3 and 4 the accumulator. */
    static const size_t sizes[] = {1,    2,    15,   16,   17,   31,   32,   33,    63,   64,
                                   65,   95,   97,   127,  129,  2047, 2048, 2049,  4095, 4096,
                                   4097, 4127, 4161, 6143, 6145, 8191, 8193, 12289, 40003};
    for (int p = 2; p <= 4; p++)
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
            size_t n = sizes[si];
            mw__comm *comm = shm_comm(p, 0, NULL);
            worker w[MAXP] = {0};
            bf16_job j[MAXP];
            uint16_t *orig[MAXP];
            for (int r = 0; r < p; r++) {
                j[r] = (bf16_job){0, malloc(n * 2), n, NULL};
                orig[r] = malloc(n * 2);
                for (size_t i = 0; i < n; i++) orig[r][i] = j[r].buf[i] = any_bf16(r, i);
            }
            run_ranks(comm, p, w, do_bf16, j);
            for (int r = 0; r < p; r++) {
                cr_assert_eq(w[r].st, MW_OK, "p %d n %zu rank %d: %s", p, n, r, w[r].msg);
                for (size_t i = 0; i < n; i++) {
                    float sum = mw__bf16_to_f32(orig[0][i]); /* x0 + x1 + ...: -0 stays -0 */
                    for (int q = 1; q < p; q++) sum += mw__bf16_to_f32(orig[q][i]);
                    uint16_t want = mw__bf16_from_f32(sum), got = j[r].buf[i];
                    /* Which NaN's payload an add keeps is the compiler's choice of operand order;
                     * every rank must still hold the same bits. */
                    int nan = isnan(sum) && isnan(mw__bf16_to_f32(got));
                    cr_assert(got == want || nan, "p %d n %zu rank %d [%zu]: 0x%04x, want 0x%04x",
                              p, n, r, i, got, want);
                    cr_assert_eq(got, j[0].buf[i],
                                 "p %d n %zu [%zu]: rank %d 0x%04x, rank 0 0x%04x", p, n, i, r, got,
                                 j[0].buf[i]);
                }
            }
            for (int r = 0; r < p; r++) free(j[r].buf), free(orig[r]);
            R->comm_free(comm);
        }
}

Test(reducer, other_dtypes_and_reducers_refuse_by_name) {
    cr_assert_eq(mw__reducer_dtype("mpi", "all-reduce", MW_F32), MW_OK);
    cr_assert_eq(mw__reducer_dtype("mpi", "all-reduce", MW_BF16), MW_ERR_UNSUPPORTED);
    cr_assert(strstr(mw_last_error(), "mpi reducer: all-reduce of bf16"), "%s", mw_last_error());
    mw__comm *comm = shm_comm(1, 0, NULL);
    int32_t x = 3;
    cr_assert_eq(R->allreduce_sum(comm, 0, &x, 1, MW_I32), MW_ERR_UNSUPPORTED);
    R->comm_free(comm);
}
