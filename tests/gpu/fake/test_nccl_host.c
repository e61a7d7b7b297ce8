/* The in-process NCCL reducer's point-to-point calls on fakes of CUDA and NCCL (suite nccl_host;
 * no GPU): after the ranks met on the host, each half of a transfer is an ncclSend or ncclRecv
 * of its bytes on the rank's own communication stream, awaited before the call returns; a half
 * whose calls disagree is queued on neither side while the rank's other half goes on; a wait
 * for a peer that never comes ends with the timeout or an abort before any NCCL call, and the
 * reset keeps the communicators. */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "collectives/reducer_select.h"
#include "core/error.h"
#include "fake_gpu.h"
#include "fake_ranks.h"

static const mw__reducer_vtable *R = &mw__reducer_nccl;

static mw__comm *open_comm(int n, mw__device *devs, int timeout_ms) {
    mw__comm_options opt = {.timeout_ms = timeout_ms};
    return fake_comm_new(R, n, devs, &opt);
}

/* The NCCL calls made since call `from` of the record: (what, rank, peer) each. */
static int count_calls(int from, const char *what, int rank, int peer, size_t bytes) {
    const fake_record *f = fake_gpu();
    int n = 0;
    for (int i = from; i < f->ncalls; i++) {
        const fake_call *k = &f->calls[i];
        int s = fake_stream_index(k->stream);
        if (strcmp(k->what, what) || k->rank != rank || k->peer != peer) continue;
        cr_assert_eq(k->count, bytes, "%s of rank %d: %zu bytes, want %zu", what, rank, k->count,
                     bytes);
        cr_assert(s >= 0 && f->stream[s].device == rank, "%s of rank %d on stream %d", what, rank,
                  s);
        n++;
    }
    return n;
}

Test(nccl_host, a_ring_is_one_send_and_one_recv_per_rank_awaited) {
    mw__device devs[3];
    mw__comm *c = open_comm(3, devs, 5000);
    const fake_record *f = fake_gpu();
    for (int d = 0; d < 2; d++) {
        int calls = f->ncalls;
        p2p_worker w[3];
        memset(w, 0, sizeof w);
        for (int r = 0; r < 3; r++)
            w[r] = (p2p_worker){.comm = c,
                                .rank = r,
                                .to = (r + 1) % 3,
                                .from = (r + 2) % 3,
                                .n = 33,
                                .dtype = d ? MW_BF16 : MW_F32};
        p2p_run(R, w, 3);
        size_t bytes = 33u * (d ? 2 : 4);
        for (int r = 0; r < 3; r++) {
            cr_assert_eq(w[r].st, MW_OK, "rank %d: %s", r, w[r].msg);
            cr_assert_eq(w[r].pending_after, 0, "rank %d returned before its transfer ran", r);
            cr_assert_eq(count_calls(calls, "ncclSend", r, (r + 1) % 3, bytes), 1, "rank %d", r);
            cr_assert_eq(count_calls(calls, "ncclRecv", r, (r + 2) % 3, bytes), 1, "rank %d", r);
        }
        cr_assert_eq(f->ncalls - calls, 6);
    }
    cr_assert_eq(f->legacy, 0);
    cr_assert_eq(f->bad_handles, 0);
    R->comm_free(c);
}

/* Rank 0 sends 8 floats to rank 1, which receives 4 from it in a sendrecv that also sends 4 to
 * rank 2: the pair 0 -> 1 fails on both sides, naming both, and queues nothing; 1 -> 2 goes. */
Test(nccl_host, a_half_that_disagrees_is_queued_on_neither_side) {
    mw__device devs[3];
    mw__comm *c = open_comm(3, devs, 5000);
    const fake_record *f = fake_gpu();
    p2p_worker w[3] = {{.comm = c, .rank = 0, .to = 1, .from = -1, .n = 8, .dtype = MW_F32},
                       {.comm = c, .rank = 1, .to = 2, .from = 0, .n = 4, .dtype = MW_F32},
                       {.comm = c, .rank = 2, .to = -1, .from = 1, .n = 4, .dtype = MW_F32}};
    p2p_run(R, w, 3);
    const char *want = "rank 0 sends 8 f32 elements to rank 1, but rank 1 receives 4 f32 elements "
                       "from rank 0";
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(w[r].st, MW_ERR_INVALID, "rank %d: %s", r, w[r].msg);
        cr_assert(strstr(w[r].msg, want), "rank %d: %s", r, w[r].msg);
    }
    cr_assert_eq(w[2].st, MW_OK, "rank 2: %s", w[2].msg);
    cr_assert_eq(f->ncalls, 2, "NCCL calls: %d", f->ncalls);
    cr_assert_eq(count_calls(0, "ncclSend", 1, 2, 16), 1);
    cr_assert_eq(count_calls(0, "ncclRecv", 2, 1, 16), 1);
    R->reset(c);
    cr_assert_eq(f->aborted, 0, "the reset aborted %d communicators", f->aborted);
    R->comm_free(c);
}

/* A sender whose receiver never comes: the timeout, or an abort, at the host meeting; the
 * latecomer is refused; the reset keeps the communicators (nothing was queued); then it goes. */
Test(nccl_host, a_lonely_sender_gives_up_before_any_nccl_call) {
    for (int abort = 0; abort < 2; abort++) {
        mw__device devs[2];
        mw__comm *c = open_comm(2, devs, abort ? 0 : 100);
        const fake_record *f = fake_gpu();
        int calls = f->ncalls, aborted = f->aborted;
        p2p_worker w[2] = {{.comm = c, .rank = 0, .to = 1, .from = -1, .n = 8, .dtype = MW_BF16},
                           {.comm = c, .rank = 1, .to = -1, .from = 0, .n = 8, .dtype = MW_BF16}};
        p2p_start(R, &w[0]);
        if (abort) {
            struct timespec nap = {0, 50 * 1000 * 1000};
            nanosleep(&nap, NULL);
            R->abort(c);
        }
        pthread_join(w[0].thread, NULL);
        cr_assert_eq(w[0].st, abort ? MW_ERR_ABORTED : MW_ERR_TIMEOUT, "%s: %s",
                     mw_status_name(w[0].st), w[0].msg);
        cr_assert(strstr(w[0].msg, "send (nccl)"), "%s", w[0].msg);
        cr_assert_eq(R->recv(c, 1, 0, w[1].in, 8, MW_BF16), MW_ERR_ABORTED, "%s", mw_last_error());
        cr_assert_eq(f->ncalls, calls);
        R->reset(c);
        cr_assert_eq(f->aborted, aborted, "the reset re-created the communicators");
        p2p_run(R, w, 2);
        for (int r = 0; r < 2; r++) cr_assert_eq(w[r].st, MW_OK, "rank %d: %s", r, w[r].msg);
        cr_assert_eq(f->ncalls - calls, 2);
        R->comm_free(c);
    }
}
