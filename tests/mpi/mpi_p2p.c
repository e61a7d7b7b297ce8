/* Run under mpirun: the point-to-point calls of the reducer between processes
 * (collectives/mpi/reducer_mpi.c, collectives/mpi/p2p.c), against their definition:
 *
 *   mpi_p2p LOCAL LAYOUT     LOCAL ranks (threads) per process; LAYOUT block (ranks of a process
 *                            consecutive) or interleaved (rank r in process r mod P)
 *   mpi_p2p faults           2 processes: a transfer given up (timeout, abort), calls that
 *                            disagree, bad arguments
 *
 * Checks: every ordered pair of ranks (in one process or two) receives what was sent, bit for
 * bit, f32 and bf16, at lengths 0, 1, odd, past the exchange's small path and large; rings of
 * sendrecv both ways (a rank's two peers in shared memory, over MPI, or one of each); the order
 * of several messages of a pair while another sender interleaves; calls that disagree fail on
 * both sides naming both, and the communicator goes on; an all-reduce in flight completes
 * first. Faults: process 0 waits in a recv while process 1 holds back (a second communicator
 * orders them): it times out, or is aborted from another thread, with MW_ERR_TIMEOUT /
 * MW_ERR_ABORTED naming the call; later calls fail with MW_ERR_STATE; process 1, arriving late,
 * completes its send. Exit 0 when every check passes, 1 when one fails, 2 on an error. */
#include <float.h>
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

#define LARGE ((1u << 20) + 3)

static const size_t sizes[] = {0, 1, 7, 2049, 65537, LARGE};
#define NSIZES (sizeof sizes / sizeof *sizes)

static uint8_t byte_of(int rank, int k, size_t i) {
    uint32_t x = (uint32_t)(rank * 131 + k * 7919 + 1) * 2654435761u ^ (uint32_t)i * 40503u;
    x ^= x >> 13;
    return (uint8_t)(x * 0x5bd1e995u >> 19);
}

static void fill_bytes(uint8_t *b, size_t bytes, int rank, int k) {
    for (size_t i = 0; i < bytes; i++) b[i] = byte_of(rank, k, i);
}

/* Bytes of b that are not message k of rank `from`; past bytes, the canary 0xa5. */
static long wrong(const uint8_t *b, size_t bytes, int from, int k) {
    long n = 0;
    for (size_t i = 0; i < bytes; i++) n += b[i] != byte_of(from, k, i);
    for (size_t i = bytes; i < bytes + 16; i++) n += b[i] != 0xa5;
    return n;
}

static size_t esize(mw_dtype d) { return d == MW_BF16 ? 2 : 4; }

/* One rank's checks, with room for a message out and one in; returns the first failing status. */
static mw_status rank_checks(rank_job *j, uint8_t *out, uint8_t *in) {
    int r = j->rank;
    mw_status st;
    /* Every ordered pair, in one list every rank walks. */
    for (size_t s = 0; s < NSIZES; s++)
        for (int d = 0; d < 2; d++) {
            mw_dtype dt = d ? MW_BF16 : MW_F32;
            size_t n = sizes[s], bytes = n * esize(dt);
            for (int from = 0; from < nranks; from++)
                for (int to = 0; to < nranks; to++) {
                    int k = (int)(s * 2 + (size_t)d) * 1000 + from * MAX_RANKS + to;
                    if (from == to || (r != from && r != to)) continue;
                    if (r == from) {
                        fill_bytes(out, bytes, r, k);
                        if ((st = R->send(comm, r, to, out, n, dt))) return st;
                        continue;
                    }
                    memset(in, 0xa5, bytes + 16);
                    if ((st = R->recv(comm, r, from, in, n, dt))) return st;
                    CHECK(!wrong(in, bytes, from, k), "pair %d -> %d n %zu %s: wrong bytes", from,
                          to, n, d ? "bf16" : "f32");
                }
        }
    /* Rings both ways, every rank at once. */
    for (int step = -1; step <= 1; step += 2)
        for (size_t s = 0; s < NSIZES; s++)
            for (int round = 0; round < 3; round++) {
                mw_dtype dt = round == 1 ? MW_BF16 : MW_F32;
                size_t n = sizes[s], bytes = n * esize(dt);
                int to = (r + step + nranks) % nranks, from = (r - step + nranks) % nranks;
                int k = 50000 + (int)s * 10 + round;
                fill_bytes(out, bytes, r, k);
                memset(in, 0xa5, bytes + 16);
                if ((st = R->sendrecv(comm, r, to, out, from, in, n, dt))) return st;
                CHECK(!wrong(in, bytes, from, k), "ring step %d n %zu round %d: wrong bytes", step,
                      n, round);
            }
    /* Order: ranks 0 and nranks - 1 each send rank 1 a sequence; rank 1 alternates. */
    if (nranks >= 3) {
        for (int k = 0; k < 30; k++) {
            int senders[2] = {0, nranks - 1};
            for (int i = 0; i < 2; i++) {
                int from = senders[i];
                size_t n = (size_t)(k * 37 + from * 11) % 3000;
                if (r == from) {
                    fill_bytes(out, n * 4, r, 70000 + k);
                    if ((st = R->send(comm, r, 1, out, n, MW_F32))) return st;
                } else if (r == 1) {
                    memset(in, 0xa5, n * 4 + 16);
                    if ((st = R->recv(comm, 1, from, in, n, MW_F32))) return st;
                    CHECK(!wrong(in, n * 4, from, 70000 + k), "message %d of rank %d", k, from);
                }
            }
        }
    }
    /* Calls that disagree, between rank 0 and the last rank (in another process in the block
     * layout): both fail, naming both, and the pair goes on. */
    int last = nranks - 1;
    if (r == 0 || r == last) {
        float x[8] = {0};
        st = r == 0 ? R->send(comm, 0, last, x, 5, MW_F32) : R->recv(comm, last, 0, x, 4, MW_F32);
        char want[160];
        snprintf(want, sizeof want,
                 "rank 0 sends 5 f32 elements to rank %d, but rank %d receives 4 f32 elements "
                 "from rank 0",
                 last, last);
        CHECK(st == MW_ERR_INVALID && strstr(mw_last_error(), want), "mismatch: %s: %s",
              mw_status_name(st), mw_last_error());
        int peer = r == 0 ? last : 0;
        fill_bytes(out, 40, r, 90000);
        memset(in, 0xa5, 56);
        if ((st = R->sendrecv(comm, r, peer, out, peer, in, 10, MW_F32))) return st;
        CHECK(!wrong(in, 40, peer, 90000), "the exchange after a mismatch");
    }
    /* An all-reduce in flight completes before a transfer. */
    float *ar = (float *)(void *)out + (LARGE + 16), sum = 0;
    fill(ar, 64, r, 5);
    if ((st = R->allreduce_start(comm, r, ar, 64, MW_F32))) return st;
    int to = (r + 1) % nranks, from = (r + nranks - 1) % nranks;
    fill_bytes(out, 64, r, 95000);
    memset(in, 0xa5, 80);
    if ((st = R->sendrecv(comm, r, to, out, from, in, 16, MW_F32))) return st;
    if ((st = R->finish(comm, r))) return st;
    CHECK(!wrong(in, 64, from, 95000), "the sendrecv beside an all-reduce");
    for (int q = 0; q < nranks; q++) sum += value(q, 3, 5);
    /* Summed in process order, not rank order: equal to float rounding of |values| <= 2^10. */
    float tol = (float)nranks * 1024.0f * FLT_EPSILON;
    CHECK(fabsf(ar[3] - sum) <= tol, "the all-reduce beside a sendrecv: %g, not %g", (double)ar[3],
          (double)sum);
    return MW_OK;
}

static void *rank_main(void *arg) {
    rank_job *j = arg;
    uint8_t *out = malloc((LARGE + 16) * 4 + 64 * sizeof(float)), *in = malloc(LARGE * 4 + 16);
    j->st = out && in ? rank_checks(j, out, in) : MW_ERR_NOMEM;
    if (j->st) {
        snprintf(j->msg, sizeof j->msg, "%s", mw_last_error());
        R->abort(comm);
    }
    free(out);
    free(in);
    return NULL;
}

/* ---- faults ---- */

#define FAULT_N 64                   /* small: sent eagerly, so the late process completes alone */
static float fault_bufs[4][FAULT_N]; /* a receive given up may still land later */

static int faults(void) {
    if (!ranks_two_processes()) return 2;
    int rc = 0, peer = 1 - me;
    for (int k = 0; k < 2; k++) {
        int aborting = k == 1;
        mw__comm *c = NULL, *order = NULL;
        if (ranks_comm_of_two(aborting ? 60000 : 300, &c) || ranks_comm_of_two(60000, &order))
            return 2;
        float *buf = fault_bufs[k];
        if (me == 0) {
            pthread_t t;
            if (aborting && pthread_create(&t, NULL, abort_later, c)) return 2;
            mw_status st = R->recv(c, 0, 1, buf, FAULT_N, MW_F32);
            if (aborting) pthread_join(t, NULL);
            const char *says =
                aborting ? "rank 0 was waiting for rank 1" : "rank 0 waited for rank 1";
            rc |= expect(st == (aborting ? MW_ERR_ABORTED : MW_ERR_TIMEOUT) &&
                             strstr(mw_last_error(), "recv between processes") &&
                             strstr(mw_last_error(), says),
                         aborting ? "an aborted recv" : "a recv that timed out");
            printf("[process 0] recv %s: %s\n", aborting ? "aborted" : "timed out",
                   mw_last_error());
            rc |= expect(R->send(c, 0, 1, buf, 1, MW_F32) == MW_ERR_STATE, "a later call refused");
            if (R->barrier(order, 0)) return 2; /* now process 1 may come */
        } else {
            if (R->barrier(order, 1)) return 2;
            fill(buf, FAULT_N, 1, 900 + k);
            rc |= expect(R->send(c, 1, 0, buf, FAULT_N, MW_F32) == MW_OK,
                         "the late process completes its send");
        }
        if (R->barrier(order, me)) return 2;
        R->comm_free(c);
        R->comm_free(order);
    }
    /* Calls that disagree: both fail, naming both; the communicator goes on. */
    mw__comm *c = NULL;
    if (ranks_comm_of_two(60000, &c)) return 2;
    float *buf = fault_bufs[2], *back = fault_bufs[3];
    mw_status st = me == 0 ? R->send(c, 0, 1, buf, 8, MW_F32) : R->recv(c, 1, 0, buf, 16, MW_BF16);
    rc |= expect(st == MW_ERR_INVALID &&
                     strstr(mw_last_error(), "rank 0 sends 8 f32 elements to rank 1, but rank 1 "
                                             "receives 16 bf16 elements from rank 0"),
                 "calls that disagree");
    fill(buf, FAULT_N, me, 950);
    st = R->sendrecv(c, me, peer, buf, peer, back, FAULT_N, MW_F32);
    rc |= expect(st == MW_OK, "a sendrecv after the mismatch");
    for (size_t i = 0; st == MW_OK && i < FAULT_N; i++)
        rc |= expect(back[i] == value(peer, i, 950), "the values after the mismatch");
    /* Bad arguments: refused before any message, the communicator aborted until reset. */
    rc |= expect(R->send(c, me, 2, buf, 1, MW_F32) == MW_ERR_INVALID &&
                     strstr(mw_last_error(), "a peer out of range"),
                 "a peer out of range refused");
    rc |= expect(R->recv(c, me, peer, back, 1, MW_F32) == MW_ERR_ABORTED, "aborted until reset");
    R->reset(c);
    rc |= expect(R->sendrecv(c, me, peer, buf, peer, buf + 1, 4, MW_F32) == MW_ERR_INVALID &&
                     strstr(mw_last_error(), "overlapping"),
                 "overlapping buffers refused");
    R->reset(c);
    st = R->sendrecv(c, me, peer, buf, peer, back, FAULT_N, MW_BF16);
    rc |= expect(st == MW_OK, "a bf16 sendrecv after reset");
    R->comm_free(c);
    printf("[process %d] faults: %s\n", me, rc ? "FAILED" : "as expected");
    return rc;
}

int main(int argc, char **argv) {
    return ranks_main(argc, argv, "mpi_p2p", rank_main, "every transfer as defined", faults);
}
