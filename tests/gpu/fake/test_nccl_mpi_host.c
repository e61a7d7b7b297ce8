/* NCCL over MPI's host-side logic on fakes of CUDA, NCCL and MPI (suite nccl_mpi_host; no GPU):
 * the communication streams and events are made with the communicator, on the calling thread,
 * one per local rank on its own GPU, and every worker thread queues its rank's collectives there
 * and finishes only when they ran; a reset after a collective was started and never finished
 * aborts the communicators and leaves them broken (re-creating them would need every process),
 * while a reset after finished collectives keeps them. Point-to-point: an exchange is ncclSend
 * and ncclRecv on each rank's own stream, awaited; calls that disagree fail on both ranks before
 * any NCCL call; a lonely receiver gives up at the host meeting and the reset keeps the
 * communicators. */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "collectives/reducer_select.h"
#include "core/error.h"
#include "fake_gpu.h"
#include "fake_ranks.h"

static const mw__reducer_vtable *R = &mw__reducer_nccl_mpi;

/* A communicator of n ranks, all of this process, on GPUs 0..n-1. */
static mw__comm *open_comm(int n, mw__device *devs) {
    static int proc_of[4];
    for (int r = 0; r < n; r++) proc_of[r] = 0;
    mw__comm_options opt = {.timeout_ms = 5000, .proc_of = proc_of, .self_proc = 0};
    mw__comm *c = fake_comm_new(R, n, devs, &opt);
    cr_assert_not_null(c);
    return c;
}

typedef struct worker {
    pthread_t thread;
    mw__comm *comm;
    int rank;
    mw_status st;
    char msg[MW__MSG_SIZE];
    int pending_after_finish; /* queued work the fake still held when a finish returned */
} worker;

/* Three steps of two bucket sums and a started all-gather, each step finished. */
static void *work(void *arg) {
    worker *w = arg;
    float buf[64];
    size_t bounds[3] = {0, 32, 64};
    for (int step = 0; step < 3 && !w->st; step++) {
        w->st = R->allreduce_start(w->comm, w->rank, buf, 40, MW_F32);
        if (!w->st) w->st = R->allreduce_start(w->comm, w->rank, buf + 40, 24, MW_F32);
        if (!w->st) w->st = R->all_gather_start(w->comm, w->rank, buf, 64, MW_F32, bounds);
        if (!w->st) w->st = R->finish(w->comm, w->rank);
        if (!w->st) w->pending_after_finish += fake_pending_on(w->rank);
    }
    if (w->st) snprintf(w->msg, sizeof w->msg, "%s", mw_last_error());
    return NULL;
}

Test(nccl_mpi_host, streams_are_made_with_the_communicator_on_its_thread) {
    mw__device devs[2];
    pthread_t self = pthread_self();
    mw__comm *c = open_comm(2, devs);
    const fake_record *f = fake_gpu();
    /* Before any worker calls: one stream and one event per local rank, on its GPU, made here. */
    cr_assert_eq(f->nstreams, 2, "communication streams made by comm_new: %d", f->nstreams);
    cr_assert_eq(f->nevents, 2, "events made by comm_new: %d", f->nevents);
    int on_gpu[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        cr_assert(pthread_equal(f->stream[i].thread, self), "stream %d made on another thread", i);
        cr_assert(pthread_equal(f->event_thread[i], self), "event %d made on another thread", i);
        on_gpu[f->stream[i].device]++;
    }
    cr_assert(on_gpu[0] == 1 && on_gpu[1] == 1, "streams on GPUs %d and %d", f->stream[0].device,
              f->stream[1].device);

    worker w[2] = {{.comm = c, .rank = 0}, {.comm = c, .rank = 1}};
    for (int r = 0; r < 2; r++) pthread_create(&w[r].thread, NULL, work, &w[r]);
    for (int r = 0; r < 2; r++) pthread_join(w[r].thread, NULL);
    for (int r = 0; r < 2; r++)
        cr_assert_eq(w[r].st, MW_OK, "rank %d: %s: %s", r, mw_status_name(w[r].st), w[r].msg);
    /* The workers made nothing, queued on their own rank's stream only, never on the legacy
     * one, and every finish waited until the fake reported the work done. */
    cr_assert_eq(f->nstreams, 2, "streams made by the worker threads: %d", f->nstreams - 2);
    cr_assert_eq(f->nevents, 2, "events made by the worker threads: %d", f->nevents - 2);
    cr_assert_eq(f->legacy, 0, "calls on the legacy stream: %d", f->legacy);
    cr_assert_eq(f->bad_handles, 0, "calls with a missing handle: %d", f->bad_handles);
    cr_assert_eq(f->ncalls, 2 * 3 * (2 + 2), "NCCL calls: %d", f->ncalls); /* a gather: 2 parts */
    for (int i = 0; i < f->ncalls; i++) {
        int s = fake_stream_index(f->calls[i].stream);
        cr_assert(s >= 0 && f->stream[s].device == f->calls[i].rank,
                  "call %d (%s) of rank %d queued on stream %d (GPU %d)", i, f->calls[i].what,
                  f->calls[i].rank, s, s >= 0 ? f->stream[s].device : -1);
    }
    for (int r = 0; r < 2; r++)
        cr_assert_eq(w[r].pending_after_finish, 0,
                     "rank %d: finish returned with its collectives still queued", r);
    R->comm_free(c);
    cr_assert_eq(f->aborted, 2, "communicators freed: %d of 2", f->aborted);
}

/* A rank that fails between its starts and finish: the host resets the communicator. */
static void started_then_reset(int gather) {
    mw__device devs[1];
    mw__comm *c = open_comm(1, devs);
    const fake_record *f = fake_gpu();
    float buf[16];
    size_t bounds[2] = {0, 16};
    mw_status st = gather ? R->all_gather_start(c, 0, buf, 16, MW_F32, bounds)
                          : R->allreduce_start(c, 0, buf, 16, MW_F32);
    cr_assert_eq(st, MW_OK, "%s", mw_last_error());
    int calls = f->ncalls;
    R->reset(c);
    cr_assert_eq(f->aborted, 1, "reset with a collective in flight aborted %d communicators",
                 f->aborted);
    st = R->allreduce_start(c, 0, buf, 16, MW_F32);
    cr_assert_eq(st, MW_ERR_STATE, "after the reset: %s: %s", mw_status_name(st), mw_last_error());
    cr_assert(strstr(mw_last_error(), "abandoned"), "%s", mw_last_error());
    cr_assert_eq(R->finish(c, 0), MW_ERR_STATE);
    cr_assert_eq(f->ncalls, calls, "NCCL calls after the reset: %d", f->ncalls - calls);
    cr_assert_eq(f->bad_handles, 0, "calls on an aborted communicator: %d", f->bad_handles);
    R->comm_free(c);
}

Test(nccl_mpi_host, reset_after_a_started_sum_breaks_the_communicators) { started_then_reset(0); }

Test(nccl_mpi_host, reset_after_a_started_gather_breaks_the_communicators) {
    started_then_reset(1);
}

/* A started all-gather (FSDP's prefetch) whose peers never come: finish gives up after the
 * timeout, or when the host aborts, and the reset breaks the communicators. */
static void *finish_rank0(void *arg) {
    worker *w = arg;
    w->st = R->finish(w->comm, 0);
    snprintf(w->msg, sizeof w->msg, "%s", mw_last_error());
    return NULL;
}

static void stalled_gather(int abort) {
    mw__device devs[1];
    mw__device *dp[1] = {&devs[0]};
    static int proc_of[1];
    fake_device(&devs[0], "cuda:0", 0);
    mw__comm_options opt = {.timeout_ms = abort ? 0 : 100, .proc_of = proc_of};
    mw__comm *c = NULL;
    cr_assert_eq(R->comm_new(1, dp, &opt, &c), MW_OK, "%s", mw_last_error());
    const fake_record *f = fake_gpu();
    float buf[16];
    size_t bounds[2] = {0, 16};
    fake_stall(1);
    cr_assert_eq(R->all_gather_start(c, 0, buf, 16, MW_F32, bounds), MW_OK, "%s", mw_last_error());
    worker w = {.comm = c};
    pthread_create(&w.thread, NULL, finish_rank0, &w);
    if (abort) {
        struct timespec nap = {0, 50 * 1000 * 1000};
        nanosleep(&nap, NULL);
        R->abort(c);
    }
    pthread_join(w.thread, NULL);
    mw_status want = abort ? MW_ERR_ABORTED : MW_ERR_TIMEOUT;
    cr_assert_eq(w.st, want, "finish: %s: %s", mw_status_name(w.st), w.msg);
    fake_stall(0);
    R->reset(c);
    cr_assert_eq(f->aborted, 1, "reset after an abandoned gather aborted %d communicators",
                 f->aborted);
    cr_assert_eq(R->all_gather_start(c, 0, buf, 16, MW_F32, bounds), MW_ERR_STATE);
    R->comm_free(c);
}

Test(nccl_mpi_host, a_started_gather_times_out_and_breaks_the_communicators) { stalled_gather(0); }

Test(nccl_mpi_host, a_started_gather_aborted_breaks_the_communicators) { stalled_gather(1); }

/* A rank that passes a bad argument never joins the collective its peers (in other processes
 * too) entered: the call aborts, and the reset leaves the communicators broken, so the next
 * collective cannot pair with the peers' stale one. */
Test(nccl_mpi_host, a_bad_argument_breaks_the_communicators) {
    mw__device devs[1];
    mw__comm *c = open_comm(1, devs);
    const fake_record *f = fake_gpu();
    float buf[16];
    size_t bounds[2] = {0, 20}; /* a part past the end of the buffer */
    mw_status st = R->all_gather_start(c, 0, buf, 16, MW_F32, bounds);
    cr_assert_eq(st, MW_ERR_INVALID, "%s: %s", mw_status_name(st), mw_last_error());
    cr_assert(strstr(mw_last_error(), "parts"), "%s", mw_last_error());
    int calls = f->ncalls;
    R->reset(c);
    cr_assert_eq(f->aborted, 1, "reset after a bad argument aborted %d communicators", f->aborted);
    st = R->allreduce_start(c, 0, buf, 16, MW_F32);
    cr_assert_eq(st, MW_ERR_STATE, "after the reset: %s: %s", mw_status_name(st), mw_last_error());
    cr_assert_eq(f->ncalls, calls, "NCCL calls after the reset: %d", f->ncalls - calls);
    R->comm_free(c);
}

Test(nccl_mpi_host, reset_after_finished_collectives_keeps_the_communicators) {
    mw__device devs[2];
    mw__comm *c = open_comm(2, devs);
    const fake_record *f = fake_gpu();
    worker w[2] = {{.comm = c, .rank = 0}, {.comm = c, .rank = 1}};
    for (int r = 0; r < 2; r++) pthread_create(&w[r].thread, NULL, work, &w[r]);
    for (int r = 0; r < 2; r++) pthread_join(w[r].thread, NULL);
    for (int r = 0; r < 2; r++) cr_assert_eq(w[r].st, MW_OK, "rank %d: %s", r, w[r].msg);
    R->reset(c);
    cr_assert_eq(f->aborted, 0, "reset after finished collectives aborted %d", f->aborted);
    float buf[8];
    cr_assert_eq(R->allreduce_sum(c, 0, buf, 8, MW_F32), MW_OK, "%s", mw_last_error());
    cr_assert_eq(fake_pending(), 0);
    R->comm_free(c);
}

/* --- point-to-point ---------------------------------------------------------------------------
 */

/* An exchange of two ranks (GPUs 0 and 1): each rank queues ncclSend to the other and ncclRecv
 * from it, counted in bytes, on its own communication stream, and returns once they ran. */
Test(nccl_mpi_host, an_exchange_is_ncclsend_and_ncclrecv_awaited_on_each_rank) {
    mw__device devs[2];
    mw__comm *c = open_comm(2, devs);
    const fake_record *f = fake_gpu();
    for (int d = 0; d < 2; d++) {
        int calls = f->ncalls;
        p2p_worker w[2] = {{.comm = c, .rank = 0, .to = 1, .from = 1, .n = 40},
                           {.comm = c, .rank = 1, .to = 0, .from = 0, .n = 40}};
        w[0].dtype = w[1].dtype = d ? MW_BF16 : MW_F32;
        p2p_run(R, w, 2);
        for (int r = 0; r < 2; r++) {
            cr_assert_eq(w[r].st, MW_OK, "rank %d: %s", r, w[r].msg);
            cr_assert_eq(w[r].pending_after, 0, "rank %d returned before its transfer ran", r);
        }
        cr_assert_eq(f->ncalls - calls, 4, "NCCL calls: %d", f->ncalls - calls);
        int sends = 0;
        for (int i = calls; i < f->ncalls; i++) {
            const fake_call *k = &f->calls[i];
            int s = fake_stream_index(k->stream);
            sends += strcmp(k->what, "ncclSend") == 0;
            cr_assert(strcmp(k->what, "ncclSend") == 0 || strcmp(k->what, "ncclRecv") == 0, "%s",
                      k->what);
            cr_assert_eq(k->peer, 1 - k->rank, "%s of rank %d with rank %d", k->what, k->rank,
                         k->peer);
            cr_assert_eq(k->count, 40u * (d ? 2 : 4), "%s of %zu bytes", k->what, k->count);
            cr_assert(s >= 0 && f->stream[s].device == k->rank, "%s of rank %d on stream %d",
                      k->what, k->rank, s);
        }
        cr_assert_eq(sends, 2);
    }
    cr_assert_eq(f->legacy, 0);
    cr_assert_eq(f->bad_handles, 0);
    R->comm_free(c);
}

/* Calls that disagree fail on both ranks naming both, before any NCCL call; the pair goes on. */
Test(nccl_mpi_host, calls_that_disagree_queue_nothing) {
    mw__device devs[2];
    mw__comm *c = open_comm(2, devs);
    const fake_record *f = fake_gpu();
    p2p_worker w[2] = {{.comm = c, .rank = 0, .to = 1, .from = -1, .n = 10, .dtype = MW_F32},
                       {.comm = c, .rank = 1, .to = -1, .from = 0, .n = 12, .dtype = MW_F32}};
    p2p_run(R, w, 2);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(w[r].st, MW_ERR_INVALID, "rank %d: %s", r, w[r].msg);
        cr_assert(strstr(w[r].msg, "rank 0 sends 10 f32 elements to rank 1, but rank 1 receives "
                                   "12 f32 elements from rank 0"),
                  "rank %d: %s", r, w[r].msg);
    }
    cr_assert_eq(f->ncalls, 0, "NCCL calls: %d", f->ncalls);
    w[1].n = 10;
    p2p_run(R, w, 2);
    for (int r = 0; r < 2; r++) cr_assert_eq(w[r].st, MW_OK, "rank %d: %s", r, w[r].msg);
    cr_assert_eq(f->ncalls, 2, "NCCL calls: %d", f->ncalls);
    R->reset(c);
    cr_assert_eq(f->aborted, 0, "a reset after completed transfers aborted %d", f->aborted);
    R->comm_free(c);
}

/* A receiver whose sender never comes gives up at the host meeting (nothing was queued): the
 * reset keeps the communicators, and the pair then transfers. */
Test(nccl_mpi_host, a_lonely_receiver_gives_up_before_any_nccl_call) {
    mw__device devs[2];
    mw__comm *c = open_comm(2, devs);
    const fake_record *f = fake_gpu();
    p2p_worker w[2] = {{.comm = c, .rank = 0, .to = 1, .from = -1, .n = 8, .dtype = MW_F32},
                       {.comm = c, .rank = 1, .to = -1, .from = 0, .n = 8, .dtype = MW_F32}};
    p2p_start(R, &w[1]);
    struct timespec nap = {0, 50 * 1000 * 1000};
    nanosleep(&nap, NULL);
    R->abort(c);
    pthread_join(w[1].thread, NULL);
    cr_assert_eq(w[1].st, MW_ERR_ABORTED, "%s: %s", mw_status_name(w[1].st), w[1].msg);
    cr_assert_eq(f->ncalls, 0);
    R->reset(c);
    cr_assert_eq(f->aborted, 0, "the reset aborted %d communicators", f->aborted);
    p2p_run(R, w, 2);
    for (int r = 0; r < 2; r++) cr_assert_eq(w[r].st, MW_OK, "rank %d: %s", r, w[r].msg);
    cr_assert_eq(f->ncalls, 2);
    R->comm_free(c);
}
