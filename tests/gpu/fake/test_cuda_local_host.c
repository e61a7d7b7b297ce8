/* The CUDA-local reducer's host-side logic on fakes of CUDA (suite cuda_local_host; no GPU): every
 * collective of two ranks meets at both of its barriers, also with 0 floats, so that a fast rank
 * cannot publish its next collective while a peer still compares what it published for this one
 * (which failed as "ranks disagree"). Its shared-memory communicator's barriers are counted per
 * rank, and one rank can be held just after a given barrier (counted_shm). Point-to-point: a
 * transfer is one device-to-device copy from the sender's buffer into the receiver's, with no
 * barrier; calls that disagree copy nothing; timeout, abort and reset. */
#include <criterion/criterion.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "collectives/reducer_select.h"
#include "core/error.h"
#include "fake_gpu.h"
#include "fake_ranks.h"

/* --- the shared-memory communicator, its barriers counted and held ---------------------------- */

static _Atomic int barriers[2];     /* per rank */
static int hold_rank = -1, hold_at; /* rank hold_rank waits after its hold_at-th barrier */
static _Atomic int holding, released;

static mw_status counted_barrier(mw__comm *comm, int rank) {
    mw_status st = mw__reducer_shm.barrier(comm, rank);
    int n = atomic_fetch_add(&barriers[rank & 1], 1) + 1;
    if (rank == hold_rank && n == hold_at) {
        atomic_store(&holding, 1);
        while (!atomic_load(&released)) sched_yield();
    }
    return st;
}

static mw__reducer_vtable counted_vt;
static pthread_once_t counted_once = PTHREAD_ONCE_INIT;

static void counted_init(void) {
    counted_vt = mw__reducer_shm;
    counted_vt.barrier = counted_barrier;
}

/* What reducer_local.c calls the shared-memory reducer (cuda_local_under_test.c): the real one,
 * its barrier counted. */
const mw__reducer_vtable *counted_shm(void);
const mw__reducer_vtable *counted_shm(void) {
    pthread_once(&counted_once, counted_init);
    return &counted_vt;
}

/* --- two ranks on one fake GPU ---------------------------------------------------------------- */

static mw__device devs[2];

static mw__comm *open_comm(void) {
    mw__device *dp[2];
    for (int r = 0; r < 2; r++) {
        char name[32];
        snprintf(name, sizeof name, "cuda:0#%d", r);
        fake_device(&devs[r], name, 0);
        dp[r] = &devs[r];
    }
    mw__comm_options opt = {.timeout_ms = 5000};
    mw__comm *c = NULL;
    mw_status st = mw__reducer_cuda_local.comm_new(2, dp, &opt, &c);
    cr_assert_eq(st, MW_OK, "comm_new: %s", mw_last_error());
    return c;
}

enum op { AR, ARS, RS, AG, AGS, BC, NOPS };
static const char *const op_names[] = {"all-reduce", "started all-reduce", "reduce-scatter",
                                       "all-gather", "started all-gather", "broadcast"};

static mw_status run_op(mw__comm *c, int rank, int op, float *buf, size_t n, const size_t *b) {
    const mw__reducer_vtable *R = &mw__reducer_cuda_local;
    switch (op) {
    case AR: return R->allreduce_sum(c, rank, buf, n, MW_F32);
    case ARS: {
        mw_status st = R->allreduce_start(c, rank, buf, n, MW_F32);
        return st ? st : R->finish(c, rank);
    }
    case RS: return R->reduce_scatter_sum(c, rank, buf, n, MW_F32, b);
    case AG: return R->all_gather(c, rank, buf, n, MW_F32, b);
    case AGS: {
        mw_status st = R->all_gather_start(c, rank, buf, n, MW_F32, b);
        return st ? st : R->finish(c, rank);
    }
    default: return R->broadcast(c, rank, buf, n, MW_F32, 1);
    }
}

typedef struct job {
    pthread_t thread;
    mw__comm *comm;
    int rank, op;
    size_t n[2]; /* two collectives of n[0], then n[1] floats */
    _Atomic int first_done;
    mw_status st[2];
    char msg[MW__MSG_SIZE];
} job;

static void *job_main(void *arg) {
    job *j = arg;
    static float buf[2][64];
    for (int k = 0; k < 2; k++) {
        size_t b[3] = {0, j->n[k] / 2, j->n[k]};
        j->st[k] = run_op(j->comm, j->rank, j->op, buf[j->rank], j->n[k], b);
        if (j->st[k] && !j->msg[0]) snprintf(j->msg, sizeof j->msg, "%s", mw_last_error());
        if (k == 0) atomic_store(&j->first_done, 1);
    }
    return NULL;
}

static void run_pair(mw__comm *c, int op, size_t n0, size_t n1, job *j) {
    for (int r = 0; r < 2; r++) {
        memset(&j[r], 0, sizeof j[r]);
        j[r].comm = c, j[r].rank = r, j[r].op = op, j[r].n[0] = n0, j[r].n[1] = n1;
        pthread_create(&j[r].thread, NULL, job_main, &j[r]);
    }
}

static void join_pair(job *j, int op) {
    for (int r = 0; r < 2; r++) pthread_join(j[r].thread, NULL);
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 2; k++)
            cr_assert_eq(j[r].st[k], MW_OK, "%s %d of rank %d: %s: %s", op_names[op], k, r,
                         mw_status_name(j[r].st[k]), j[r].msg);
}

/* Rank 1 is held just after the first barrier of a collective of 0 floats (where it compares
 * what rank 0 published): rank 0 must not leave that collective meanwhile, or it republishes
 * for the next one (64 floats) under rank 1's comparison. */
Test(cuda_local_host, an_empty_collective_waits_for_every_peer_to_compare) {
    for (int op = 0; op < NOPS; op++) {
        mw__comm *c = open_comm();
        atomic_store(&barriers[0], 0), atomic_store(&barriers[1], 0);
        atomic_store(&holding, 0), atomic_store(&released, 0);
        hold_rank = 1, hold_at = 1;
        job j[2];
        run_pair(c, op, 0, 64, j);
        while (!atomic_load(&holding)) sched_yield();
        /* 200 ms for rank 0 to leave, if nothing keeps it. */
        struct timespec nap = {0, 1000000};
        int left = 0;
        for (int t = 0; t < 200 && !left; t++) {
            nanosleep(&nap, NULL);
            left = atomic_load(&j[0].first_done);
        }
        atomic_store(&released, 1);
        hold_rank = -1;
        join_pair(j, op);
        cr_assert_not(left, "%s of 0 floats: rank 0 left it while rank 1 was still inside",
                      op_names[op]);
        mw__reducer_cuda_local.comm_free(c);
    }
}

/* A started all-gather whose peer never comes: the rank gives up after the timeout with
 * MW_ERR_TIMEOUT, or with MW_ERR_ABORTED when the host aborts; the latecomer is refused; after
 * reset both ranks' started all-gather completes. */
Test(cuda_local_host, a_started_gather_times_out_or_aborts_and_resets) {
    for (int abort = 0; abort < 2; abort++) {
        mw__device *dp[2];
        for (int r = 0; r < 2; r++) {
            fake_device(&devs[r], r ? "cuda:0#1" : "cuda:0#0", 0);
            dp[r] = &devs[r];
        }
        mw__comm_options opt = {.timeout_ms = abort ? 0 : 100};
        mw__comm *c = NULL;
        cr_assert_eq(mw__reducer_cuda_local.comm_new(2, dp, &opt, &c), MW_OK, "%s",
                     mw_last_error());
        job j[2];
        memset(j, 0, sizeof j);
        j[0].comm = c, j[0].rank = 0, j[0].op = AGS, j[0].n[0] = 64, j[0].n[1] = 64;
        pthread_create(&j[0].thread, NULL, job_main, &j[0]);
        if (abort) {
            struct timespec nap = {0, 50 * 1000 * 1000};
            nanosleep(&nap, NULL);
            mw__reducer_cuda_local.abort(c);
        }
        pthread_join(j[0].thread, NULL);
        mw_status want = abort ? MW_ERR_ABORTED : MW_ERR_TIMEOUT;
        cr_assert_eq(j[0].st[0], want, "alone: %s: %s", mw_status_name(j[0].st[0]), j[0].msg);
        float buf[64];
        size_t b[3] = {0, 32, 64};
        cr_assert_eq(mw__reducer_cuda_local.all_gather_start(c, 1, buf, 64, MW_F32, b),
                     MW_ERR_ABORTED, "late: %s", mw_last_error());
        mw__reducer_cuda_local.reset(c);
        run_pair(c, AGS, 64, 0, j);
        join_pair(j, AGS);
        mw__reducer_cuda_local.comm_free(c);
    }
}

/* Every collective of two ranks takes two barriers on each rank, empty or not. */
Test(cuda_local_host, every_collective_closes_with_a_barrier) {
    for (int op = 0; op < NOPS; op++)
        for (size_t n = 0; n <= 64; n += 64) {
            mw__comm *c = open_comm();
            atomic_store(&barriers[0], 0), atomic_store(&barriers[1], 0);
            job j[2];
            run_pair(c, op, n, n, j);
            join_pair(j, op);
            for (int r = 0; r < 2; r++)
                cr_assert_eq(atomic_load(&barriers[r]), 4,
                             "%s of %zu floats, twice: rank %d took %d barriers (want 4)",
                             op_names[op], n, r, atomic_load(&barriers[r]));
            mw__reducer_cuda_local.comm_free(c);
        }
}

/* --- point-to-point: copies between the ranks' buffers, on the GPU, after a meeting on the host */

#define P2P_RANKS 3

static mw__device p2p_devs[P2P_RANKS];

static mw__comm *open_p2p(int p, int timeout_ms) {
    mw__device *dp[P2P_RANKS];
    for (int r = 0; r < p; r++) {
        char name[32];
        snprintf(name, sizeof name, "cuda:0#%d", r);
        fake_device(&p2p_devs[r], name, 0);
        dp[r] = &p2p_devs[r];
    }
    mw__comm_options opt = {.timeout_ms = timeout_ms};
    mw__comm *c = NULL;
    cr_assert_eq(mw__reducer_cuda_local.comm_new(p, dp, &opt, &c), MW_OK, "%s", mw_last_error());
    return c;
}

/* A ring of sendrecv over three ranks, and a send and recv between two: each transfer is one
 * device-to-device copy of n elements from the sender's buffer into the receiver's, queued on a
 * compute stream, and none of them takes a barrier of the collectives. */
Test(cuda_local_host, a_transfer_is_one_copy_between_the_ranks_buffers) {
    static const struct {
        int p, ring;
        size_t n;
        mw_dtype dtype;
    } cases[] = {{3, 1, 64, MW_F32}, {3, 1, 33, MW_BF16}, {2, 0, 17, MW_F32}, {2, 0, 0, MW_BF16}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        int p = cases[k].p;
        mw__comm *c = open_p2p(p, 5000);
        for (int r = 0; r < 2; r++) atomic_store(&barriers[r], 0);
        const fake_record *f = fake_gpu();
        int copies = f->ncopies;
        p2p_worker j[P2P_RANKS];
        memset(j, 0, sizeof j);
        for (int r = 0; r < p; r++) {
            j[r].comm = c, j[r].rank = r, j[r].n = cases[k].n, j[r].dtype = cases[k].dtype;
            j[r].to = cases[k].ring ? (r + 1) % p : r == 0 ? 1 : -1;
            j[r].from = cases[k].ring ? (r + p - 1) % p : r == 1 ? 0 : -1;
        }
        p2p_run(&mw__reducer_cuda_local, j, p);
        for (int r = 0; r < p; r++)
            cr_assert_eq(j[r].st, MW_OK, "case %zu rank %d: %s", k, r, j[r].msg);
        size_t bytes = cases[k].n * (cases[k].dtype == MW_BF16 ? 2 : 4);
        int want = bytes == 0 ? 0 : cases[k].ring ? p : 1;
        cr_assert_eq(f->ncopies - copies, want, "case %zu: %d copies, want %d", k,
                     f->ncopies - copies, want);
        for (int i = copies; i < f->ncopies; i++) {
            int to = -1;
            for (int r = 0; r < p; r++)
                if (f->copies[i].dst == j[r].in) to = r;
            cr_assert_geq(to, 0, "case %zu: copy %d into no rank's receive buffer", k, i);
            cr_assert_eq(f->copies[i].src, j[j[to].from].out, "case %zu: rank %d's copy", k, to);
            cr_assert_eq(f->copies[i].bytes, bytes, "case %zu: %zu bytes", k, f->copies[i].bytes);
            cr_assert_eq(fake_stream_index(f->copies[i].stream), -1,
                         "case %zu: the copy is not on a compute stream", k);
        }
        cr_assert_eq(atomic_load(&barriers[0]) + atomic_load(&barriers[1]), 0,
                     "case %zu: a transfer took a barrier", k);
        cr_assert_eq(f->bad_handles, 0);
        cr_assert_eq(f->legacy, 0);
        mw__reducer_cuda_local.comm_free(c);
    }
}

/* Calls that disagree: both fail naming both, nothing is copied, and the pair goes on. */
Test(cuda_local_host, calls_that_disagree_copy_nothing) {
    mw__comm *c = open_p2p(2, 5000);
    const fake_record *f = fake_gpu();
    p2p_worker j[2];
    memset(j, 0, sizeof j);
    j[0] = (p2p_worker){.comm = c, .rank = 0, .to = 1, .from = -1, .n = 8, .dtype = MW_F32};
    j[1] = (p2p_worker){.comm = c, .rank = 1, .to = -1, .from = 0, .n = 8, .dtype = MW_BF16};
    p2p_run(&mw__reducer_cuda_local, j, 2);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(j[r].st, MW_ERR_INVALID, "rank %d: %s", r, j[r].msg);
        cr_assert(strstr(j[r].msg, "rank 0 sends 8 f32 elements to rank 1, but rank 1 receives 8 "
                                   "bf16 elements from rank 0"),
                  "rank %d: %s", r, j[r].msg);
    }
    cr_assert_eq(f->ncopies, 0, "%d copies", f->ncopies);
    j[1].dtype = MW_F32;
    p2p_run(&mw__reducer_cuda_local, j, 2);
    for (int r = 0; r < 2; r++) cr_assert_eq(j[r].st, MW_OK, "rank %d: %s", r, j[r].msg);
    cr_assert_eq(f->ncopies, 1);
    mw__reducer_cuda_local.comm_free(c);
}

/* A receiver whose sender never comes gives up after the timeout, or when the host aborts; the
 * latecomer is refused until reset; then the pair transfers. */
Test(cuda_local_host, a_lonely_receiver_times_out_or_aborts_and_resets) {
    for (int abort = 0; abort < 2; abort++) {
        mw__comm *c = open_p2p(2, abort ? 0 : 100);
        const fake_record *f = fake_gpu();
        int copies = f->ncopies;
        p2p_worker j[2];
        memset(j, 0, sizeof j);
        j[1] = (p2p_worker){.comm = c, .rank = 1, .to = -1, .from = 0, .n = 8, .dtype = MW_F32};
        p2p_start(&mw__reducer_cuda_local, &j[1]);
        if (abort) {
            struct timespec nap = {0, 50 * 1000 * 1000};
            nanosleep(&nap, NULL);
            mw__reducer_cuda_local.abort(c);
        }
        pthread_join(j[1].thread, NULL);
        cr_assert_eq(j[1].st, abort ? MW_ERR_ABORTED : MW_ERR_TIMEOUT, "%s: %s",
                     mw_status_name(j[1].st), j[1].msg);
        cr_assert(strstr(j[1].msg, "recv (cuda-local)"), "%s", j[1].msg);
        cr_assert_eq(mw__reducer_cuda_local.send(c, 0, 1, j[0].out, 8, MW_F32), MW_ERR_ABORTED,
                     "late: %s", mw_last_error());
        mw__reducer_cuda_local.reset(c);
        j[0] = (p2p_worker){.comm = c, .rank = 0, .to = 1, .from = -1, .n = 8, .dtype = MW_F32};
        p2p_run(&mw__reducer_cuda_local, j, 2);
        for (int r = 0; r < 2; r++) cr_assert_eq(j[r].st, MW_OK, "rank %d: %s", r, j[r].msg);
        cr_assert_eq(f->ncopies - copies, 1);
        mw__reducer_cuda_local.comm_free(c);
    }
}

/* A sendrecv against the peer's separate send and recv would cross the two rounds of meeting
 * (each would read the other round's message): refused, with the communicator aborted so that
 * nobody waits, instead of copying from the wrong buffer. */
static void *send_then_recv(void *arg) {
    p2p_worker *j = arg;
    const mw__reducer_vtable *R = &mw__reducer_cuda_local;
    j->st = R->send(j->comm, 1, 0, j->out, j->n, MW_F32);
    if (!j->st) j->st = R->recv(j->comm, 1, 0, j->in, j->n, MW_F32);
    snprintf(j->msg, sizeof j->msg, "%s", mw_last_error());
    return NULL;
}

Test(cuda_local_host, a_sendrecv_against_a_separate_send_and_recv_is_refused) {
    mw__comm *c = open_p2p(2, 5000);
    const fake_record *f = fake_gpu();
    p2p_worker j[2];
    memset(j, 0, sizeof j);
    j[0] = (p2p_worker){.comm = c, .rank = 0, .to = 1, .from = 1, .n = 8, .dtype = MW_F32};
    j[1] = (p2p_worker){.comm = c, .rank = 1, .n = 8, .dtype = MW_F32};
    p2p_start(&mw__reducer_cuda_local, &j[0]);
    pthread_create(&j[1].thread, NULL, send_then_recv, &j[1]);
    for (int r = 0; r < 2; r++) pthread_join(j[r].thread, NULL);
    int refused = 0;
    for (int r = 0; r < 2; r++) {
        cr_assert_neq(j[r].st, MW_OK, "rank %d went on: %s", r, j[r].msg);
        refused += j[r].st == MW_ERR_INVALID && strstr(j[r].msg, "pairs differently") != NULL;
    }
    cr_assert_geq(refused, 1, "rank 0: %s; rank 1: %s", j[0].msg, j[1].msg);
    for (int i = 0; i < f->ncopies; i++)
        cr_assert(f->copies[i].src == j[1].out && f->copies[i].dst == j[0].in,
                  "copy %d is not of rank 1's send buffer into rank 0's receive buffer", i);
    mw__reducer_cuda_local.reset(c);
    mw__reducer_cuda_local.comm_free(c);
}
