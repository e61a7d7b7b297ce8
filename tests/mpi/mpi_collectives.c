/* Run under mpirun: the reduce-scatter, all-gather and broadcast of the reducer between
 * processes (collectives/mpi/reducer_mpi.c), each against its definition, on every process:
 *
 *   mpi_collectives LOCAL LAYOUT     LOCAL ranks (threads) per process; LAYOUT block (ranks of a
 *                                    process consecutive) or interleaved (rank r in process
 *                                    r mod P)
 *   mpi_collectives faults           2 processes: a process that gives up (timeout, abort)
 *
 * Checks: a reduce-scatter's part is bitwise the all-reduce's there (and, with one rank per
 * process in rank order, bitwise the float sum in rank order computed here), for parts even,
 * uneven, empty, or not covering the buffer; a reduce-scatter then an all-gather is the
 * all-reduce; an all-gather gives every rank each part from its owner; a broadcast the root's
 * buffer; sizes on both sides of the exchange's small path. Faults: process 0 waits in each
 * collective while process 1 holds back (a second communicator orders them, no sleeping): it
 * times out, or is aborted from another thread, with MW_ERR_TIMEOUT / MW_ERR_ABORTED naming the
 * collective; later calls fail with MW_ERR_STATE; process 1, arriving late, completes with the
 * right values; bad parts or roots are refused. Exit 0 when every check passes, 1 when one fails, 2
 * on an error. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collectives/reducer.h"
#include "core/error.h"
#include "devices/module.h"
#include "meshwit.h"
#include "mpi_values.h"
#include "tests/mpi/mpi_ranks.h"

static const size_t sizes[] = {0, 1, 7, 2048, 2049, 65537, (1u << 20) + 3};
#define NSIZES (sizeof sizes / sizeof *sizes)
#define NCUTS 4

/* Cut k of n floats over the ranks: even slices; uneven (some ranks empty, others several
 * slices wide); parts in the middle of the buffer only; everything in the last rank's part. */
static void cut(int k, size_t n, size_t *b) {
    for (int r = 0; r <= nranks; r++) {
        switch (k) {
        case 0: b[r] = mw__slice_lo(n, nranks, r); break;
        case 1: b[r] = r == 0 ? 0 : r % 3 == 1 ? n * (size_t)r / (size_t)nranks : b[r - 1]; break;
        case 2: b[r] = n / 4 + (n / 2) * (size_t)r / (size_t)nranks; break;
        default: b[r] = r == nranks ? n : 0; break;
        }
    }
    b[nranks] = k == 2 ? n / 4 + n / 2 : n;
}

static int same(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* One rank's checks; returns the first failing status. */
static mw_status rank_checks(rank_job *j, float *ar, float *buf) {
    int r = j->rank, rank_order = 1;
    for (int q = 1; q < nranks; q++) rank_order &= proc_of[q] >= proc_of[q - 1];
    rank_order &= nranks == procs; /* one rank per process, in process order */
    /* -0 + -0 is -0: on every rank, so the result is copied, never added to a +0. */
    float zeros[5] = {-0.0f, -0.0f, -0.0f, -0.0f, -0.0f};
    mw_status st = R->allreduce_sum(comm, r, zeros, 5, MW_F32);
    if (st) return st;
    for (int i = 0; i < 5; i++) CHECK(signbit(zeros[i]), "all-reduce of -0: element %d is +0", i);
    for (size_t k = 0; k < NSIZES; k++) {
        size_t n = sizes[k], b[MAX_RANKS + 1];
        for (int c = 0; c < NCUTS; c++) {
            int salt = (int)(k * 10 + (size_t)c);
            cut(c, n, b);
            fill(ar, n, r, salt);
            if ((st = R->allreduce_sum(comm, r, ar, n, MW_F32))) return st;
            fill(buf, n, r, salt);
            if ((st = R->reduce_scatter_sum(comm, r, buf, n, MW_F32, b))) return st;
            for (size_t i = b[r]; i < b[r + 1]; i++) {
                CHECK(same(buf[i], ar[i]),
                      "reduce-scatter n %zu cut %d element %zu: %a, all-reduce %a", n, c, i,
                      (double)buf[i], (double)ar[i]);
                if (!rank_order) continue;
                float s = value(0, i, salt);
                for (int q = 1; q < nranks; q++) s += value(q, i, salt);
                CHECK(same(buf[i], s), "reduce-scatter n %zu element %zu: not the rank-order sum",
                      n, i);
            }
            if ((st = R->all_gather(comm, r, buf, n, MW_F32, b))) return st;
            for (size_t i = b[0]; i < b[nranks]; i++)
                CHECK(same(buf[i], ar[i]), "reduce-scatter + all-gather n %zu cut %d element %zu",
                      n, c, i);
            fill(buf, n, r, salt + 1);
            if ((st = R->all_gather(comm, r, buf, n, MW_F32, b))) return st;
            for (int q = 0; q < nranks; q++)
                for (size_t i = b[q]; i < b[q + 1]; i++)
                    CHECK(buf[i] == value(q, i, salt + 1), "all-gather n %zu cut %d element %zu", n,
                          c, i);
            for (size_t i = 0; i < b[0]; i++)
                CHECK(buf[i] == value(r, i, salt + 1), "all-gather wrote outside the parts");
            /* Started (FSDP's prefetch), progressed, and finished; with every other cut an
             * all-reduce started meanwhile, its result then that of a blocking one. */
            fill(buf, n, r, salt + 2);
            fill(ar, n, r, salt + 3);
            if ((st = R->all_gather_start(comm, r, buf, n, MW_F32, b))) return st;
            if (R->progress && (st = R->progress(comm, r))) return st;
            if (c % 2 == 0 && (st = R->allreduce_start(comm, r, ar, n, MW_F32))) return st;
            if (R->progress && (st = R->progress(comm, r))) return st;
            if ((st = R->finish(comm, r))) return st;
            for (int q = 0; q < nranks; q++)
                for (size_t i = b[q]; i < b[q + 1]; i++)
                    CHECK(buf[i] == value(q, i, salt + 2),
                          "started all-gather n %zu cut %d element %zu", n, c, i);
            if (c % 2 != 0) continue;
            fill(buf, n, r, salt + 3);
            if ((st = R->allreduce_sum(comm, r, buf, n, MW_F32))) return st;
            for (size_t i = 0; i < n; i++)
                CHECK(same(buf[i], ar[i]),
                      "all-reduce beside a started all-gather n %zu element %zu", n, i);
        }
        for (int root = 0; root<nranks; root += nranks - 1> 0 ? nranks - 1 : 1) {
            fill(buf, n, r, (int)k + 500);
            if ((st = R->broadcast(comm, r, buf, n, MW_F32, root))) return st;
            for (size_t i = 0; i < n; i++)
                CHECK(buf[i] == value(root, i, (int)k + 500), "broadcast n %zu root %d element %zu",
                      n, root, i);
        }
    }
    return MW_OK;
}

static void *rank_main(void *arg) {
    rank_job *j = arg;
    size_t most = sizes[NSIZES - 1];
    float *ar = malloc(most * sizeof(float)), *buf = malloc(most * sizeof(float));
    j->st = ar && buf ? rank_checks(j, ar, buf) : MW_ERR_NOMEM;
    if (j->st) snprintf(j->msg, sizeof j->msg, "%s", mw_last_error());
    free(ar);
    free(buf);
    return NULL;
}

/* ---- faults ---- */

enum { RS, AG, BC };
static const char *const names[] = {"reduce-scatter", "all-gather", "broadcast"};
#define FAULT_N 64 /* small messages: sent eagerly, so the late process completes alone */
static float fault_bufs[6][FAULT_N]; /* receives of a process that gave up may land later */

static mw_status call(mw__comm *c, int op, float *buf, const size_t *b) {
    if (op == RS) return R->reduce_scatter_sum(c, me, buf, FAULT_N, MW_F32, b);
    if (op == AG) return R->all_gather(c, me, buf, FAULT_N, MW_F32, b);
    return R->broadcast(c, me, buf, FAULT_N, MW_F32, 1); /* a root may finish before the others */
}

static int faults(void) {
    if (!ranks_two_processes()) return 2;
    int rc = 0;
    size_t b[3] = {0, 40, FAULT_N};
    for (int k = 0; k < 6; k++) {
        int op = k % 3, aborting = k >= 3;
        mw__comm *c = NULL, *order = NULL;
        if (ranks_comm_of_two(aborting ? 60000 : 300, &c) || ranks_comm_of_two(60000, &order))
            return 2;
        float *buf = fault_bufs[k];
        fill(buf, FAULT_N, me, 900 + k);
        if (me == 0) {
            pthread_t t;
            if (aborting && pthread_create(&t, NULL, abort_later, c)) return 2;
            mw_status st = call(c, op, buf, b);
            if (aborting) pthread_join(t, NULL);
            char want[96];
            snprintf(want, sizeof want, "%s between processes", names[op]);
            rc |= expect(st == (aborting ? MW_ERR_ABORTED : MW_ERR_TIMEOUT) &&
                             strstr(mw_last_error(), want),
                         names[op]);
            printf("[process 0] %s %s: %s\n", names[op], aborting ? "aborted" : "timed out",
                   mw_last_error());
            rc |= expect(call(c, op, buf, b) == MW_ERR_STATE, "a later call refused");
            if (R->barrier(order, 0)) return 2; /* now process 1 may come */
        } else {
            if (R->barrier(order, 1)) return 2;
            mw_status st = call(c, op, buf, b);
            rc |= expect(st == MW_OK, "the late process completes");
            for (size_t i = 0; st == MW_OK && i < FAULT_N; i++) {
                /* Process 1 (rank 1) owns [b[1], b[2]) and is the broadcast's root. */
                float mine = value(1, i, 900 + k), theirs = value(0, i, 900 + k);
                float want = op == BC || i >= b[1] ? mine : op == AG ? theirs : mine;
                if (op == RS && i >= b[1]) want = theirs + mine;
                rc |= expect(same(buf[i], want), "the late process's values");
            }
        }
        if (R->barrier(order, me)) return 2;
        R->comm_free(c);
        R->comm_free(order);
    }
    /* Bad arguments (every process passes them alike): refused before any message, the
     * communicator aborted until reset, then it works. */
    mw__comm *c = NULL;
    if (ranks_comm_of_two(60000, &c)) return 2;
    float *buf = fault_bufs[0];
    size_t past[3] = {0, 40, FAULT_N + 1};
    rc |= expect(R->reduce_scatter_sum(c, me, buf, FAULT_N, MW_F32, past) == MW_ERR_INVALID &&
                     strstr(mw_last_error(), "parts outside the buffer"),
                 "parts past the buffer refused");
    R->reset(c);
    rc |= expect(R->broadcast(c, me, buf, FAULT_N, MW_F32, 2) == MW_ERR_INVALID &&
                     strstr(mw_last_error(), "a root out of range"),
                 "a root out of range refused");
    R->reset(c);
    fill(buf, FAULT_N, me, 999);
    rc |= expect(R->broadcast(c, me, buf, FAULT_N, MW_F32, 0) == MW_OK, "a broadcast after reset");
    for (size_t i = 0; i < FAULT_N; i++)
        rc |= expect(same(buf[i], value(0, i, 999)), "the broadcast's values after reset");
    R->comm_free(c);
    printf("[process %d] faults: %s\n", me, rc ? "FAILED" : "as expected");
    return rc;
}

int main(int argc, char **argv) {
    return ranks_main(argc, argv, "mpi_collectives", rank_main, "every element as defined", faults);
}
