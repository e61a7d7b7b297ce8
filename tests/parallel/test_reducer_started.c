/* The shared-memory reducer's started sums (allreduce_start, then finish or another call): the
 * bits allreduce_sum gives for each buffer, whatever the lengths and however many; taken by a
 * barrier, an all-reduce or a point-to-point call as by finish, and after an all-gather started
 * before them; sums that differ between ranks fail on every rank; an abort between start and
 * finish reaches finish, and reset forgets what was started. */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/reducer.h"
#include "core/error.h"
#include "tests/parallel/ranks.h"

#define MAXP 4
#define NSUMS 7

static const mw__reducer_vtable *R = &mw__reducer_shm;

/* Lengths that take every path of a sum: small, not a multiple of 16 floats, one element,
 * larger than a chunk, and large; their total splits the ranks' slices inside sums. */
static const size_t lens[NSUMS] = {1, 15, 511, 4097, 2048, 100003, 33};

static float value(int r, int k, size_t i) {
    uint32_t x = (uint32_t)(r * 7919 + k * 104729) ^ (uint32_t)i * 2654435761u;
    x ^= x >> 15;
    x *= 0x2c1b3c6du;
    x ^= x >> 12;
    return (float)(x >> 8) / (float)(1u << 23) - 1.0f;
}

/* Each rank's NSUMS buffers (w->arg: float *[MAXP][NSUMS]) and how it takes them. */
typedef enum how { BY_FINISH, BY_BARRIER, BY_ALLREDUCE, BY_SEND, AFTER_GATHER } how;
typedef struct plan {
    how how;
    float *buf[MAXP][NSUMS], *ref[MAXP][NSUMS];
    float extra[MAXP][64]; /* the all-reduce or gather that takes them */
    size_t bounds[MAXP + 1];
} plan;

static void started(worker *w) {
    plan *pl = w->arg;
    int r = w->rank;
    mw_status st = MW_OK;
    /* The reference: allreduce_sum of a copy of each buffer, one after another. */
    for (int k = 0; k < NSUMS && st == MW_OK; k++)
        st = R->allreduce_sum(w->comm, r, pl->ref[r][k], lens[k], MW_F32);
    if (st == MW_OK && pl->how == AFTER_GATHER)
        st = R->all_gather_start(w->comm, r, pl->extra[r], 64, MW_F32, pl->bounds);
    for (int k = 0; k < NSUMS && st == MW_OK; k++)
        st = R->allreduce_start(w->comm, r, pl->buf[r][k], lens[k], MW_F32);
    if (st == MW_OK) switch (pl->how) {
        case BY_FINISH:
        case AFTER_GATHER: st = R->finish(w->comm, r); break;
        case BY_BARRIER: st = R->barrier(w->comm, r); break;
        case BY_ALLREDUCE: st = R->allreduce_sum(w->comm, r, pl->extra[r], 64, MW_F32); break;
        case BY_SEND: /* rank 0 sends to rank 1; the others only finish */
            st = r == 0   ? R->send(w->comm, 0, 1, pl->extra[0], 64, MW_F32)
                 : r == 1 ? R->recv(w->comm, 1, 0, pl->extra[1], 64, MW_F32)
                          : R->finish(w->comm, r);
            break;
        }
    w->st = st;
    snprintf(w->msg, sizeof w->msg, "%s", st ? mw_last_error() : "");
}

static void check(int p, how how) {
    mw__comm *comm = shm_comm(p, 0, NULL);
    static plan pl;
    memset(&pl, 0, sizeof pl);
    pl.how = how;
    for (int q = 0; q <= p; q++) pl.bounds[q] = (size_t)(64 * q / p);
    for (int r = 0; r < p; r++) {
        for (int k = 0; k < NSUMS; k++) {
            pl.buf[r][k] = malloc(lens[k] * sizeof(float));
            pl.ref[r][k] = malloc(lens[k] * sizeof(float));
            for (size_t i = 0; i < lens[k]; i++) pl.buf[r][k][i] = pl.ref[r][k][i] = value(r, k, i);
        }
        for (int i = 0; i < 64; i++) pl.extra[r][i] = (float)(r * 100 + i);
    }
    worker w[MAXP] = {0};
    run_ranks(comm, p, w, started, &pl);
    for (int r = 0; r < p; r++)
        cr_assert_eq(w[r].st, MW_OK, "%d ranks, way %d: rank %d: %s", p, (int)how, r, w[r].msg);
    for (int r = 0; r < p; r++)
        for (int k = 0; k < NSUMS; k++) {
            cr_assert(memcmp(pl.buf[r][k], pl.ref[r][k], lens[k] * sizeof(float)) == 0,
                      "%d ranks, way %d: rank %d, sum %d (%zu elements): not allreduce_sum's bits",
                      p, (int)how, r, k, lens[k]);
            free(pl.buf[r][k]);
            free(pl.ref[r][k]);
        }
    /* What took them did its own work too. */
    for (int r = 0; r < p; r++)
        for (int i = 0; i < 64; i++) {
            float want = (float)(r * 100 + i);
            if (how == BY_ALLREDUCE) {
                want = 0;
                for (int q = 0; q < p; q++) want += (float)(q * 100 + i);
            } else if (how == AFTER_GATHER) {
                int owner = 0;
                while ((size_t)i >= pl.bounds[owner + 1]) owner++;
                want = (float)(owner * 100 + i);
            } else if (how == BY_SEND && r == 1) {
                want = (float)i;
            }
            cr_assert_eq(pl.extra[r][i], want, "way %d: rank %d element %d", (int)how, r, i);
        }
    R->comm_free(comm);
}

Test(reducer_started, the_bits_of_allreduce_sum_however_taken, .timeout = 120) {
    for (int p = 2; p <= MAXP; p++) {
        check(p, BY_FINISH);
        check(p, BY_BARRIER);
        check(p, BY_ALLREDUCE);
        check(p, BY_SEND);
        check(p, AFTER_GATHER);
    }
}

/* Rank 1 starts one sum fewer (count) or one of another length (length). */
static void differing(worker *w) {
    static float bufs[MAXP][3][300];
    int r = w->rank, n = r == 1 && w->arg == NULL ? 2 : 3;
    mw_status st = MW_OK;
    for (int k = 0; k < n && st == MW_OK; k++) {
        size_t len = r == 1 && w->arg != NULL && k == 1 ? 299 : 300;
        if (r == 1 && w->arg != NULL && k == 2) len = 301; /* the same total */
        st = R->allreduce_start(w->comm, r, bufs[r][k], len, MW_F32);
    }
    w->st = st ? st : R->finish(w->comm, r);
    snprintf(w->msg, sizeof w->msg, "%s", mw_last_error());
}

Test(reducer_started, sums_that_differ_fail_on_every_rank, .timeout = 60) {
    int p = 3;
    mw__comm *comm = shm_comm(p, 0, NULL);
    worker w[MAXP] = {0};
    run_ranks(comm, p, w, differing, NULL); /* rank 1: 2 sums of 300, the others 3 */
    for (int r = 0; r < p; r++) {
        cr_assert_eq(w[r].st, MW_ERR_INVALID, "rank %d got %s", r, mw_status_name(w[r].st));
        cr_assert(strstr(w[r].msg, "rank 0 has 900 elements, rank 1 has 600"), "%s", w[r].msg);
    }
    static int lengths;
    run_ranks(comm, p, w, differing, &lengths); /* rank 1: 300, 299, 301 */
    for (int r = 0; r < p; r++) {
        cr_assert_eq(w[r].st, MW_ERR_INVALID, "rank %d got %s", r, mw_status_name(w[r].st));
        cr_assert(strstr(w[r].msg, "sum 1 started: rank 0 has 300 elements, rank 1 has 299"), "%s",
                  w[r].msg);
    }
    R->comm_free(comm);
}

/* Every rank starts a sum on an aborted communicator: the start only notes it, finish fails. */
static void start_then_finish(worker *w) {
    static float bufs[MAXP][5000];
    mw_status st = R->allreduce_start(w->comm, w->rank, bufs[w->rank], 5000, MW_F32);
    w->st = st ? st : R->finish(w->comm, w->rank);
    snprintf(w->msg, sizeof w->msg, "%s", mw_last_error());
}

Test(reducer_started, an_abort_reaches_finish_and_reset_forgets, .timeout = 60) {
    int p = 2;
    mw__comm *comm = shm_comm(p, 0, NULL);
    R->abort(comm);
    worker w[MAXP] = {0};
    run_ranks(comm, p, w, start_then_finish, NULL);
    for (int r = 0; r < p; r++) {
        cr_assert_eq(w[r].st, MW_ERR_ABORTED, "rank %d got %s: %s", r, mw_status_name(w[r].st),
                     w[r].msg);
        cr_assert(strstr(w[r].msg, "aborted"), "%s", w[r].msg);
    }
    R->reset(comm);
    /* A sum rank 0 alone started, then a reset: were it kept, rank 0's next call would take it
     * and its peers' would not, and every rank would fail. */
    static float lone[100];
    cr_assert_eq(R->allreduce_start(comm, 0, lone, 100, MW_F32), MW_OK);
    R->reset(comm);
    static plan pl;
    memset(&pl, 0, sizeof pl);
    pl.how = BY_FINISH;
    for (int r = 0; r < p; r++)
        for (int k = 0; k < NSUMS; k++) {
            pl.buf[r][k] = malloc(lens[k] * sizeof(float));
            pl.ref[r][k] = malloc(lens[k] * sizeof(float));
            for (size_t i = 0; i < lens[k]; i++) pl.buf[r][k][i] = pl.ref[r][k][i] = value(r, k, i);
        }
    memset(w, 0, sizeof w);
    run_ranks(comm, p, w, started, &pl);
    for (int r = 0; r < p; r++) {
        cr_assert_eq(w[r].st, MW_OK, "after reset: rank %d: %s", r, w[r].msg);
        for (int k = 0; k < NSUMS; k++) {
            cr_assert(memcmp(pl.buf[r][k], pl.ref[r][k], lens[k] * sizeof(float)) == 0);
            free(pl.buf[r][k]);
            free(pl.ref[r][k]);
        }
    }
    R->comm_free(comm);
}
