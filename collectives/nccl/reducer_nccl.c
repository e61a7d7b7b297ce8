/* The NCCL reducer: collectives among CUDA devices on distinct GPUs of this process, one NCCL
 * rank per device, each rank's operations on its device's compute stream (so they run in order
 * with its kernels).
 *
 * Communicators are non-blocking (ncclConfig_t.blocking = 0), created together for all ranks in
 * one group (what ncclCommInitAll does, with a config). A non-blocking communicator never blocks
 * the calling thread, also not while NCCL connects ranks at their first collective, so a rank
 * waiting for a peer keeps polling and can honour abort and timeout.
 *
 * An all-reduce enqueues ncclAllReduce (in place, ncclFloat, ncclSum) on the rank's own
 * communication stream, after an event recorded on the device's compute stream, so the sum
 * follows the kernels that wrote buf while later kernels run beside it (allreduce_start, one
 * event record per gradient bucket). finish polls the communication stream until it has
 * run every queued sum, then makes the compute stream wait for it; allreduce_sum is the two in
 * one, so when it returns the sum is in buf, as in the other reducers. Determinism: NCCL's result
 * is the same bits on every rank and on every run with the same GPUs, sizes and NCCL settings, but
 * its summation order follows its ring or tree, not rank order: it agrees with the rank-order sum
 * to float rounding only.
 *
 * Reduce-scatter all-reduces the whole buffer (the part then holds the all-reduce's bits, which
 * ncclReduceScatter would not promise); all-gather broadcasts each part from its owner, and
 * broadcast is ncclBroadcast, both queued like the all-reduce (collectives/nccl/collectives.c).
 * all_gather_start queues the all-gather as allreduce_start queues a sum, for finish.
 * Point-to-point calls meet on the host communicator, then queue ncclSend and ncclRecv likewise
 * (nccl_p2p).
 *
 * Abort, and what is safe. ncclCommAbort frees the communicator, so calling it while another
 * thread may be inside an NCCL call on it would be a use after free. Hence:
 * - abort() only sets a flag (and aborts the host communicator used for barriers): safe from any
 *   thread at any time. A rank polling inside a collective sees it and returns MW_ERR_ABORTED;
 *   its NCCL kernel may still be waiting on the GPU for a peer that never came, and the rank
 *   notes that the communicators are no longer in step.
 * - reset(), which the host calls when no rank is inside a collective, calls ncclCommAbort on
 *   every rank's communicator when any operation was left incomplete (abandoned on abort or
 *   timeout, started but never waited for, or failed in NCCL or CUDA): that stops the waiting
 *   kernels, so the streams drain; then it creates new communicators. When every operation
 *   completed, the communicators are still in step and are kept.
 * - comm_free() uses ncclCommAbort too: it never waits for a peer (ncclCommDestroy may). */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collectives/nccl/collectives.h"
#include "collectives/p2p_meet.h"
#include "collectives/reducer_select.h"
#include "core/alloc.h"
#include "core/error.h"
#include "devices/device.h"
#include "devices/module_abi.h"
#include "meshwit/mesh.h"

enum { WHY_ABORT = 1, WHY_TIMEOUT = 2, WHY_FAILED = 3 };

#define INIT_TIMEOUT_MIN_MS 120000

typedef struct nccl_comm {
    int nranks;
    int timeout_ms;
    mw__device **devs;
    ncclComm_t *comms;
    mw__comm *sync;        /* host communicator (shared memory) for barriers */
    _Atomic int aborted;   /* set by abort() or a failing rank; cleared by reset() */
    _Atomic int why;       /* the first abort's cause | (rank + 1) << 4 */
    _Atomic int in_flight; /* an operation was left incomplete: reset() re-creates */
    int *started;          /* per rank: sums queued and not yet waited for */
    cudaStream_t *streams; /* per rank: its communication stream */
    cudaEvent_t *events;   /* per rank: compute -> communication -> compute ordering */
    int broken;            /* re-creating failed: every call reports broken_msg */
    char broken_msg[MW__MSG_SIZE];
} nccl_comm;

static nccl_comm *as_nccl(mw__comm *c) { return (nccl_comm *)c; }

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static void set_abort(nccl_comm *c, int why, int rank) {
    int none = 0;
    atomic_compare_exchange_strong(&c->why, &none, why | (rank + 1) << 4);
    atomic_store(&c->aborted, 1);
    mw__reducer_shm.abort(c->sync);
}

static mw_status nccl_fail(nccl_comm *c, int rank, const char *call, ncclResult_t res) {
    const char *detail = ncclGetLastError(rank >= 0 ? c->comms[rank] : NULL);
    mw_status st = mw__error(
        MW_ERR_DEVICE, "%s: %s failed: %s%s%s", rank >= 0 ? c->devs[rank]->name : "nccl", call,
        ncclGetErrorString(res), detail && *detail ? ": " : "", detail ? detail : "");
    set_abort(c, WHY_FAILED, rank);
    return st;
}

static mw_status aborted_error(nccl_comm *c, int rank, int entering) {
    int why = atomic_load(&c->why), by = (why >> 4) - 1;
    char cause[96];
    switch (why & 15) {
    case WHY_TIMEOUT:
        snprintf(cause, sizeof cause, "rank %d timed out after %d ms", by, c->timeout_ms);
        break;
    case WHY_FAILED: snprintf(cause, sizeof cause, "rank %d failed in NCCL", by); break;
    default: snprintf(cause, sizeof cause, "a peer failed and aborted the communicator"); break;
    }
    if (entering)
        return mw__error(MW_ERR_ABORTED,
                         "all-reduce (nccl) aborted: rank %d entered after the communicator was "
                         "aborted (%s); reset it first",
                         rank, cause);
    return mw__error(MW_ERR_ABORTED,
                     "all-reduce (nccl) aborted: rank %d was waiting for its "
                     "peers (%s)",
                     rank, cause);
}

static void destroy_comms(nccl_comm *c) {
    for (int r = 0; r < c->nranks; r++)
        if (c->comms[r]) {
            ncclCommAbort(c->comms[r]);
            c->comms[r] = NULL;
        }
}

/* Creates every rank's communicator in one group and waits until all are ready. */
static mw_status make_comms(nccl_comm *c) {
    ncclUniqueId id;
    ncclResult_t res = ncclGetUniqueId(&id);
    if (res != ncclSuccess) return nccl_fail(c, -1, "ncclGetUniqueId", res);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    mw_status st = MW_OK;
    res = ncclGroupStart();
    if (res != ncclSuccess) return nccl_fail(c, -1, "ncclGroupStart", res);
    for (int r = 0; r < c->nranks && !st; r++) {
        cudaError_t e = cudaSetDevice(c->devs[r]->ordinal);
        if (e != cudaSuccess) {
            st = mw__error(MW_ERR_DEVICE, "%s: cudaSetDevice failed: %s", c->devs[r]->name,
                           cudaGetErrorString(e));
            break;
        }
        res = ncclCommInitRankConfig(&c->comms[r], c->nranks, id, r, &cfg);
        if (res != ncclSuccess && res != ncclInProgress)
            st = nccl_fail(c, r, "ncclCommInitRankConfig", res);
    }
    res = ncclGroupEnd();
    if (!st && res != ncclSuccess && res != ncclInProgress)
        st = nccl_fail(c, -1, "ncclGroupEnd", res);
    /* Creation takes from tens of milliseconds to seconds: the collective timeout bounds it only
     * loosely, so that a short one does not fail a healthy start. */
    double deadline = c->timeout_ms > 0 ? now_ms() + INIT_TIMEOUT_MIN_MS + c->timeout_ms : 0;
    for (int r = 0; r < c->nranks && !st; r++) {
        ncclResult_t state = ncclInProgress;
        while (!st && state == ncclInProgress) {
            res = ncclCommGetAsyncError(c->comms[r], &state);
            if (res != ncclSuccess)
                st = nccl_fail(c, r, "ncclCommGetAsyncError", res);
            else if (state != ncclSuccess && state != ncclInProgress)
                st = nccl_fail(c, r, "ncclCommInitRankConfig", state);
            else if (state == ncclInProgress && deadline > 0 && now_ms() > deadline)
                st = mw__error(MW_ERR_TIMEOUT, "%s: creating the NCCL communicator took over %d ms",
                               c->devs[r]->name, INIT_TIMEOUT_MIN_MS + c->timeout_ms);
            else if (state == ncclInProgress)
                sched_yield();
        }
    }
    if (st) destroy_comms(c);
    return st;
}

static void nccl_comm_free(mw__comm *comm) {
    nccl_comm *c = as_nccl(comm);
    if (!c) return;
    if (c->comms) destroy_comms(c); /* first: stops kernels that would keep the streams busy */
    for (int r = 0; r < c->nranks; r++) {
        if (!c->devs || !c->devs[r] || cudaSetDevice(c->devs[r]->ordinal) != cudaSuccess) continue;
        if (c->streams && c->streams[r]) {
            cudaStreamSynchronize(c->streams[r]);
            cudaStreamDestroy(c->streams[r]);
        }
        if (c->events && c->events[r]) cudaEventDestroy(c->events[r]);
    }
    (void)cudaGetLastError();
    mw__free(c->streams);
    mw__free(c->events);
    mw__free(c->started);
    mw__reducer_shm.comm_free(c->sync);
    mw__free(c->comms);
    mw__free(c->devs);
    mw__free(c);
}

static mw_status nccl_comm_new(int nranks, struct mw__device *const *devices,
                               const mw__comm_options *opt, mw__comm **out) {
    if (!out) return mw__error(MW_ERR_INVALID, "nccl comm_new: out is NULL");
    *out = NULL;
    if (nranks < 1 || nranks > MW_MAX_DEVICES || !devices)
        return mw__error(MW_ERR_INVALID,
                         "nccl comm_new: %d ranks (expected 1..%d, with their "
                         "devices)",
                         nranks, MW_MAX_DEVICES);
    for (int r = 0; r < nranks; r++) {
        if (!devices[r] || devices[r]->vt != mw__cuda_services.device)
            return mw__error(MW_ERR_INVALID, "nccl comm_new: rank %d is not a CUDA device", r);
        for (int q = 0; q < r; q++)
            if (devices[q]->ordinal == devices[r]->ordinal)
                return mw__error(MW_ERR_INVALID,
                                 "nccl comm_new: %s and %s share GPU %d; NCCL needs one rank per "
                                 "GPU (devices on one GPU reduce with the cuda-local reducer)",
                                 devices[q]->name, devices[r]->name, devices[r]->ordinal);
    }
    nccl_comm *c = mw__calloc(1, sizeof *c);
    if (!c) return mw__error(MW_ERR_NOMEM, "nccl comm_new: out of memory");
    c->nranks = nranks;
    c->timeout_ms = opt ? opt->timeout_ms : 0;
    atomic_init(&c->aborted, 0);
    atomic_init(&c->why, 0);
    atomic_init(&c->in_flight, 0);
    c->devs = mw__calloc((size_t)nranks, sizeof *c->devs);
    c->comms = mw__calloc((size_t)nranks, sizeof *c->comms);
    c->started = mw__calloc((size_t)nranks, sizeof *c->started);
    c->streams = mw__calloc((size_t)nranks, sizeof *c->streams);
    c->events = mw__calloc((size_t)nranks, sizeof *c->events);
    if (!c->devs || !c->comms || !c->started || !c->streams || !c->events) {
        nccl_comm_free((mw__comm *)c);
        return mw__error(MW_ERR_NOMEM, "nccl comm_new: out of memory");
    }
    for (int r = 0; r < nranks; r++) c->devs[r] = devices[r];
    mw_status st = mw__reducer_shm.comm_new(nranks, NULL, opt, &c->sync);
    for (int r = 0; r < nranks && !st; r++) {
        cudaError_t e = cudaSetDevice(devices[r]->ordinal);
        if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->streams[r], cudaStreamNonBlocking);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->events[r], cudaEventDisableTiming);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            st = mw__error(MW_ERR_DEVICE,
                           "nccl comm_new: %s: making its stream and event failed: %s",
                           devices[r]->name, cudaGetErrorString(e));
        }
    }
    if (st == MW_OK) st = make_comms(c);
    if (st) {
        char msg[MW__MSG_SIZE];
        snprintf(msg, sizeof msg, "%s", mw_last_error());
        nccl_comm_free((mw__comm *)c);
        return mw__error_copy(st, msg);
    }
    *out = (mw__comm *)c;
    return MW_OK;
}

/* A failure that leaves the rank's operation incomplete: reset() must abort the communicator. */
static mw_status in_flight_fail(nccl_comm *c, int rank, const char *call, ncclResult_t res) {
    atomic_store(&c->in_flight, 1);
    return nccl_fail(c, rank, call, res);
}

/* Waits, polling, until `done` says the rank's operation finished; gives up on abort or timeout
 * (leaving the operation in flight for reset() to clear). */
typedef enum wait_for { WAIT_ENQUEUED, WAIT_COMPLETE } wait_for;

static mw_status wait_op(nccl_comm *c, int rank, wait_for what, cudaStream_t stream,
                         double deadline, const char *call) {
    ncclComm_t nc = c->comms[rank];
    for (unsigned spins = 1;; spins++) {
        if (what == WAIT_ENQUEUED || spins % 64 == 0) {
            ncclResult_t state;
            ncclResult_t res = ncclCommGetAsyncError(nc, &state);
            /* NCCL says the communicator must be aborted: reset() re-creates it. */
            if (res != ncclSuccess) return in_flight_fail(c, rank, "ncclCommGetAsyncError", res);
            if (state != ncclSuccess && state != ncclInProgress)
                return in_flight_fail(c, rank, call, state);
            if (what == WAIT_ENQUEUED && state == ncclSuccess) return MW_OK;
        }
        if (what == WAIT_COMPLETE) {
            cudaError_t e = cudaStreamQuery(stream);
            if (e == cudaSuccess) return MW_OK;
            if (e != cudaErrorNotReady) {
                (void)cudaGetLastError();
                atomic_store(&c->in_flight, 1);
                set_abort(c, WHY_FAILED, rank);
                return mw__error(MW_ERR_DEVICE, "%s: waiting for %s: %s", c->devs[rank]->name, call,
                                 cudaGetErrorString(e));
            }
        }
        if (atomic_load_explicit(&c->aborted, memory_order_acquire)) {
            atomic_store(&c->in_flight, 1);
            return aborted_error(c, rank, 0);
        }
        if (deadline > 0 && spins % 256 == 0 && now_ms() > deadline) {
            atomic_store(&c->in_flight, 1);
            set_abort(c, WHY_TIMEOUT, rank);
            return mw__error(MW_ERR_TIMEOUT,
                             "all-reduce (nccl) timed out after %d ms: rank %d waited for its "
                             "peers",
                             c->timeout_ms, rank);
        }
        sched_yield();
    }
}

/* Checks a call's communicator and rank; binds the rank's GPU. */
static mw_status enter_rank(nccl_comm *c, int rank, int entering) {
    if (!c) return mw__error(MW_ERR_INVALID, "all-reduce (nccl): communicator is NULL");
    if (rank < 0 || rank >= c->nranks) {
        set_abort(c, WHY_FAILED, -1);
        return mw__error(MW_ERR_INVALID, "all-reduce (nccl): rank %d out of range 0..%d", rank,
                         c->nranks - 1);
    }
    if (c->broken) return mw__error(MW_ERR_DEVICE, "all-reduce (nccl): %s", c->broken_msg);
    if (entering && atomic_load_explicit(&c->aborted, memory_order_acquire))
        return aborted_error(c, rank, 1);
    cudaError_t e = cudaSetDevice(c->devs[rank]->ordinal);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        set_abort(c, WHY_FAILED, rank);
        return mw__error(MW_ERR_DEVICE, "%s: cudaSetDevice failed: %s", c->devs[rank]->name,
                         cudaGetErrorString(e));
    }
    return MW_OK;
}

static mw_status cuda_failed(nccl_comm *c, int rank, const char *call, cudaError_t e) {
    (void)cudaGetLastError();
    set_abort(c, WHY_FAILED, rank);
    return mw__error(MW_ERR_DEVICE, "%s: %s failed: %s", c->devs[rank]->name, call,
                     cudaGetErrorString(e));
}

/* Queues op on the rank's communication stream after the work queued on its compute stream. */
static mw_status start_op(nccl_comm *c, int rank, mw__nccl_op op, float *buf, size_t n,
                          const size_t *bounds, int root) {
    if (n == 0) return MW_OK; /* every rank passes the same n */
    mw__device *dev = c->devs[rank];
    cudaStream_t compute = (cudaStream_t)mw__cuda_services.stream(dev), s = c->streams[rank];
    if (!compute) {
        set_abort(c, WHY_FAILED, rank);
        return mw__error(MW_ERR_INVALID, "%s (nccl): rank %d: its device is not initialised",
                         mw__nccl_call(op), rank);
    }
    cudaError_t e = cudaEventRecord(c->events[rank], compute);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(s, c->events[rank], 0);
    if (e != cudaSuccess)
        return cuda_failed(c, rank, "ordering the collective after the compute", e);
    double deadline = c->timeout_ms > 0 ? now_ms() + c->timeout_ms : 0;
    c->started[rank]++;
    ncclResult_t res = mw__nccl_enqueue(c->comms[rank], s, op, buf, n, bounds, c->nranks, root);
    if (res != ncclSuccess && res != ncclInProgress)
        return in_flight_fail(c, rank, mw__nccl_call(op), res);
    return res == ncclInProgress ? wait_op(c, rank, WAIT_ENQUEUED, s, deadline, mw__nccl_call(op))
                                 : MW_OK;
}

/* enter_rank, then the arguments of a call (a bad one aborts: the peers would wait). */
static mw_status enter_call(nccl_comm *c, int rank, int entering, mw__nccl_op op, const float *buf,
                            size_t n, const size_t *bounds, int with_parts, int root) {
    mw_status st = enter_rank(c, rank, entering);
    if (st) return st;
    const char *bad = mw__nccl_bad_args(op, buf, n, bounds, c->nranks, with_parts, root);
    if (!bad) return MW_OK;
    set_abort(c, WHY_FAILED, rank);
    return mw__error(MW_ERR_INVALID, "%s (nccl): rank %d passed %s (%zu floats)", mw__nccl_call(op),
                     rank, bad, n);
}

static mw_status nccl_allreduce_start_f32(mw__comm *comm, int rank, float *buf, size_t n) {
    nccl_comm *c = as_nccl(comm);
    mw_status st = enter_call(c, rank, 1, MW__NCCL_ALLREDUCE, buf, n, NULL, 0, 0);
    return st ? st : start_op(c, rank, MW__NCCL_ALLREDUCE, buf, n, NULL, 0);
}

static mw_status nccl_allreduce_finish(mw__comm *comm, int rank) {
    nccl_comm *c = as_nccl(comm);
    mw_status st = enter_rank(c, rank, 0);
    if (st || !c->started[rank]) return st;
    double deadline = c->timeout_ms > 0 ? now_ms() + c->timeout_ms : 0;
    cudaStream_t s = c->streams[rank];
    if ((st = wait_op(c, rank, WAIT_COMPLETE, s, deadline, "the NCCL collectives"))) return st;
    c->started[rank] = 0;
    cudaError_t e = cudaEventRecord(c->events[rank], s);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent((cudaStream_t)mw__cuda_services.stream(c->devs[rank]),
                                c->events[rank], 0);
    return e == cudaSuccess ? MW_OK : cuda_failed(c, rank, "ordering the compute after the sum", e);
}

static mw_status nccl_allreduce_sum_f32(mw__comm *comm, int rank, float *buf, size_t n) {
    mw_status st = nccl_allreduce_start_f32(comm, rank, buf, n);
    return st ? st : nccl_allreduce_finish(comm, rank);
}

/* The whole buffer is all-reduced: NCCL's order of additions depends on the length, so only an
 * all-reduce of the same buffer gives the all-reduce's bits on the part. */
static mw_status nccl_reduce_scatter_sum_f32(mw__comm *comm, int rank, float *buf, size_t n,
                                             const size_t *bounds) {
    nccl_comm *c = as_nccl(comm);
    mw_status st = enter_call(c, rank, 1, MW__NCCL_ALLREDUCE, buf, n, bounds, 1, 0);
    return st ? st : nccl_allreduce_sum_f32(comm, rank, buf, n);
}

static mw_status nccl_copies(mw__comm *comm, int rank, mw__nccl_op op, float *buf, size_t n,
                             const size_t *bounds, int root) {
    nccl_comm *c = as_nccl(comm);
    mw_status st = enter_call(c, rank, 1, op, buf, n, bounds, op == MW__NCCL_ALL_GATHER, root);
    if (st || (st = start_op(c, rank, op, buf, n, bounds, root))) return st;
    return nccl_allreduce_finish(comm, rank);
}

static mw_status nccl_all_gather_f32(mw__comm *comm, int rank, float *buf, size_t n,
                                     const size_t *bounds) {
    return nccl_copies(comm, rank, MW__NCCL_ALL_GATHER, buf, n, bounds, 0);
}

/* Queued like an overlapped sum; finish completes it with them (FSDP's prefetch). */
static mw_status nccl_all_gather_start(mw__comm *comm, int rank, void *buf, size_t n,
                                       mw_dtype dtype, const size_t *bounds) {
    nccl_comm *c = as_nccl(comm);
    mw_status st = mw__reducer_dtype("nccl", "all-gather", dtype);
    if (st || (st = enter_call(c, rank, 1, MW__NCCL_ALL_GATHER, buf, n, bounds, 1, 0))) return st;
    return start_op(c, rank, MW__NCCL_ALL_GATHER, buf, n, bounds, 0);
}

static mw_status nccl_broadcast_f32(mw__comm *comm, int rank, float *buf, size_t n, int root) {
    return nccl_copies(comm, rank, MW__NCCL_BROADCAST, buf, n, NULL, root);
}

static mw_status nccl_barrier(mw__comm *comm, int rank) {
    nccl_comm *c = as_nccl(comm);
    if (!c) return mw__error(MW_ERR_INVALID, "barrier (nccl): communicator is NULL");
    return mw__reducer_shm.barrier(c->sync, rank);
}

static void nccl_abort(mw__comm *comm) {
    if (comm) set_abort(as_nccl(comm), WHY_ABORT, -1);
}

static void nccl_reset(mw__comm *comm) {
    nccl_comm *c = as_nccl(comm);
    if (!c) return;
    int started = 0;
    for (int r = 0; r < c->nranks; r++) started |= c->started[r] != 0;
    if (atomic_load(&c->in_flight) || started || c->broken) {
        destroy_comms(c); /* stops kernels still waiting for a peer */
        mw_status st = make_comms(c);
        c->broken = st != MW_OK;
        if (st)
            snprintf(c->broken_msg, sizeof c->broken_msg,
                     "the communicator could not be re-created after an abort: %s",
                     mw_last_error());
    }
    for (int r = 0; r < c->nranks; r++) c->started[r] = 0;
    atomic_store(&c->in_flight, 0);
    atomic_store(&c->why, 0);
    atomic_store(&c->aborted, 0);
    mw__reducer_shm.reset(c->sync);
}

/* ---- point-to-point ---- */

/* Re-labels a failure of the host communicator as this call's, keeping its message. */
static mw_status relabel(mw_status st, const char *what) {
    char msg[MW__MSG_SIZE];
    snprintf(msg, sizeof msg, "%s", mw_last_error());
    return mw__error(st, "%s (nccl): %s", what, msg);
}

/* A send, recv or sendrecv (send_peer or recv_peer -1: that half absent). The ranks first meet
 * on the host (collectives/p2p_meet.h), which checks that both sides' calls agree, with the
 * abort and timeout of the shared-memory communicator; then each half that agrees is queued as
 * ncclSend and ncclRecv, in one group, on the rank's communication stream after the work queued
 * on its compute stream, and awaited as the collectives are (finish: polled, abort and timeout
 * honoured, the compute stream ordered after it). A half that disagrees is queued on neither
 * side, so no NCCL call waits for a peer that never comes. */
static mw_status nccl_p2p(mw__comm *comm, const char *what, int rank, int send_peer,
                          const void *sendbuf, int recv_peer, void *recvbuf, size_t n,
                          mw_dtype dtype) {
    nccl_comm *c = as_nccl(comm);
    mw_status st = enter_rank(c, rank, 1);
    if (st) return st;
    size_t es = mw__p2p_esize(dtype);
    const char *bad =
        es ? mw__p2p_bad_args(c->nranks, rank, send_peer, sendbuf, recv_peer, recvbuf, n, dtype)
           : NULL;
    if (bad || !es) {
        set_abort(c, WHY_FAILED, rank); /* the peer would wait for this rank */
        if (!bad)
            return mw__error(MW_ERR_UNSUPPORTED,
                             "%s (nccl): elements of dtype %d (f32 and bf16 "
                             "only)",
                             what, (int)dtype);
        return mw__error(MW_ERR_INVALID, "%s (nccl): rank %d passed %s", what, rank, bad);
    }
    if ((st = nccl_allreduce_finish(comm, rank))) return st; /* its collectives come first */
    mw__p2p_call mine = {n, dtype, 0, NULL, NULL}, sender = {0}, receiver = {0};
    if ((st = mw__p2p_meet(&mw__reducer_shm, c->sync, what, rank, 1, send_peer, &mine, recv_peer,
                           &sender)))
        return relabel(st, what);
    mw_status got = recv_peer >= 0 ? mw__p2p_check(what, recv_peer, &sender, rank, &mine) : MW_OK;
    char msg[MW__MSG_SIZE];
    if (got) snprintf(msg, sizeof msg, "%s", mw_last_error());
    if ((st = mw__p2p_meet(&mw__reducer_shm, c->sync, what, rank, 2, recv_peer, &mine, send_peer,
                           &receiver)))
        return relabel(st, what);
    mw_status sent =
        send_peer >= 0 ? mw__p2p_check(what, rank, &mine, send_peer, &receiver) : MW_OK;
    if (!got && sent) snprintf(msg, sizeof msg, "%s", mw_last_error());
    if (sent) send_peer = -1;
    if (got) recv_peer = -1;
    if (n > 0 && (send_peer >= 0 || recv_peer >= 0)) {
        mw__device *dev = c->devs[rank];
        cudaStream_t compute = (cudaStream_t)mw__cuda_services.stream(dev), s = c->streams[rank];
        if (!compute) {
            set_abort(c, WHY_FAILED, rank);
            return mw__error(MW_ERR_INVALID, "%s (nccl): rank %d: its device is not initialised",
                             what, rank);
        }
        cudaError_t e = cudaEventRecord(c->events[rank], compute);
        if (e == cudaSuccess) e = cudaStreamWaitEvent(s, c->events[rank], 0);
        if (e != cudaSuccess)
            return cuda_failed(c, rank, "ordering the transfer after the compute", e);
        double deadline = c->timeout_ms > 0 ? now_ms() + c->timeout_ms : 0;
        c->started[rank]++;
        ncclResult_t res =
            mw__nccl_p2p(c->comms[rank], s, send_peer, sendbuf, recv_peer, recvbuf, n * es);
        if (res != ncclSuccess && res != ncclInProgress)
            return in_flight_fail(c, rank, "ncclSend/ncclRecv", res);
        if (res == ncclInProgress &&
            (st = wait_op(c, rank, WAIT_ENQUEUED, s, deadline, "ncclSend/ncclRecv")))
            return st;
        if ((st = nccl_allreduce_finish(comm, rank))) return st;
    }
    return got || sent ? mw__error_copy(got ? got : sent, msg) : MW_OK;
}

static mw_status nccl_send(mw__comm *comm, int rank, int peer, const void *buf, size_t n,
                           mw_dtype dtype) {
    int p = comm ? as_nccl(comm)->nranks : 0;
    return nccl_p2p(comm, "send", rank, peer < 0 ? p : peer, buf, -1, NULL, n, dtype);
}

static mw_status nccl_recv(mw__comm *comm, int rank, int peer, void *buf, size_t n,
                           mw_dtype dtype) {
    int p = comm ? as_nccl(comm)->nranks : 0;
    return nccl_p2p(comm, "recv", rank, -1, NULL, peer < 0 ? p : peer, buf, n, dtype);
}

static mw_status nccl_sendrecv(mw__comm *comm, int rank, int send_peer, const void *sendbuf,
                               int recv_peer, void *recvbuf, size_t n, mw_dtype dtype) {
    int p = comm ? as_nccl(comm)->nranks : 0;
    return nccl_p2p(comm, "sendrecv", rank, send_peer < 0 ? p : send_peer, sendbuf,
                    recv_peer < 0 ? p : recv_peer, recvbuf, n, dtype);
}

/* The typed entry points: f32 only. */
MW__REDUCER_F32_ONLY(nccl, "nccl")

const mw__reducer_vtable mw__reducer_nccl = {
    .name = "nccl",
    .comm_new = nccl_comm_new,
    .comm_free = nccl_comm_free,
    .allreduce_sum = nccl_allreduce_sum,
    .barrier = nccl_barrier,
    .abort = nccl_abort,
    .reset = nccl_reset,
    .allreduce_start = nccl_allreduce_start,
    .finish = nccl_allreduce_finish,
    .reduce_scatter_sum = nccl_reduce_scatter_sum,
    .all_gather = nccl_all_gather,
    .broadcast = nccl_broadcast,
    .all_gather_start = nccl_all_gather_start,
    .send = nccl_send,
    .recv = nccl_recv,
    .sendrecv = nccl_sendrecv,
};
