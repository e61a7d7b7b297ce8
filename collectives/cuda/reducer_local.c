/* The CUDA-local reducer: collectives among devices that share one GPU (cuda:0x2), where NCCL
 * refuses two ranks on a device.
 *
 * The worker threads meet through a shared-memory communicator (mw__reducer_shm), which brings
 * its spin flags with generation counts, abort, timeout and reset; the data never leaves the
 * GPU. One all-reduce:
 *   1. each rank waits for its own stream (its buffer is complete) and publishes buffer and
 *      length; barrier (refusable: abort and timeout release it);
 *   2. rank r sums slice r over all ranks' buffers in rank order (rank 0 + rank 1 + ...) with a
 *      kernel on its own stream and writes the sum into every buffer's slice r, then waits for
 *      its stream; slices are whole 128-byte runs, so no two ranks write the same line;
 *   3. barrier: every slice of every buffer is written, so each rank may go on.
 * Every element is added in the same order whichever rank sums it, so all ranks get the same
 * bits, on every run. A rank's published pointer is only read between barriers 1 and 3, and it
 * republishes only after barrier 3, so one slot per rank suffices.
 *
 * Abort: a rank released from barrier 3 by an abort may return while a peer's kernel is still
 * writing into its buffer; the step fails anyway, the buffer stays allocated, and the peer's
 * kernel finishes before the peer returns (step 2 waits), so the trainer's host sees every
 * worker done only once no kernel of the collective runs.
 *
 * Overlapped sums (allreduce_start/finish), for the gradient buckets: nothing waits for
 * the GPU. Each rank records an event on its compute stream and publishes it with its buffer;
 * after barrier 1 rank r's communication stream waits for every rank's event, sums slice r there
 * and records a done event; barrier 2 makes every done event recorded before anyone waits on it.
 * finish makes the rank's compute stream wait for every rank's done event. The host only
 * meets its peers at barriers, so abort and timeout work as above; every GPU wait is on work
 * already queued, so no stream waits for a peer that never comes. An event is re-recorded only
 * after a later barrier, once every peer has queued its wait on it. reset() and comm_free() wait
 * for the communication streams, so no sum outlives a failed step or the buffers.
 *
 * Reduce-scatter, all-gather and broadcast take the blocking all-reduce's three steps
 * (local_collective); a reduce-scatter's part is summed by the all-reduce's kernel, so it holds
 * the all-reduce's bits. A started all-gather (all_gather_start, FSDP's prefetch) is queued like
 * an overlapped sum, its copies on the communication stream. Point-to-point calls meet on the
 * host without barriers and copy on the compute streams, ordered by events (local_p2p). */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/p2p_meet.h"
#include "collectives/reducer_select.h"
#include "core/alloc.h"
#include "core/error.h"
#include "devices/device.h"
#include "devices/module_abi.h"
#include "meshwit/mesh.h"

#define RUN_FLOATS 32 /* 128 bytes */

typedef struct local_comm {
    int nranks;
    mw__comm *sync; /* shared-memory communicator: barriers, abort, timeout */
    mw__device **devs;
    float **bufs; /* published for the current collective */
    size_t *lens;
    const size_t **parts;  /* reduce-scatter and all-gather: each rank's bounds */
    int *roots;            /* broadcast: each rank's root */
    cudaStream_t *streams; /* per rank: the overlapped sums */
    cudaEvent_t *ready;    /* per rank: its buffer is complete on its compute stream */
    cudaEvent_t *done;     /* per rank: its last slice sum */
    cudaEvent_t *arrived;  /* per rank: the copy of its last receive (point-to-point) */
} local_comm;

static local_comm *as_local(mw__comm *c) { return (local_comm *)c; }

/* Re-labels a synchronisation failure as this collective's, keeping its message. */
static mw_status relabel(mw_status st, const char *what) {
    char msg[MW__MSG_SIZE];
    snprintf(msg, sizeof msg, "%s", mw_last_error());
    return mw__error(st, "%s (cuda-local): %s", what, msg);
}

/* Waits for every rank's overlapped sums (the host calls it when no rank is inside a
 * collective). */
static void drain(local_comm *c) {
    for (int r = 0; c->streams && r < c->nranks; r++)
        if (c->streams[r] && cudaSetDevice(c->devs[r]->ordinal) == cudaSuccess)
            cudaStreamSynchronize(c->streams[r]);
    (void)cudaGetLastError();
}

static void local_comm_free(mw__comm *comm) {
    local_comm *c = as_local(comm);
    if (!c) return;
    drain(c);
    for (int r = 0; r < c->nranks; r++) {
        if (c->devs && c->devs[r] && cudaSetDevice(c->devs[r]->ordinal) != cudaSuccess) continue;
        if (c->streams && c->streams[r]) cudaStreamDestroy(c->streams[r]);
        if (c->ready && c->ready[r]) cudaEventDestroy(c->ready[r]);
        if (c->done && c->done[r]) cudaEventDestroy(c->done[r]);
        if (c->arrived && c->arrived[r]) cudaEventDestroy(c->arrived[r]);
    }
    (void)cudaGetLastError();
    mw__free(c->streams);
    mw__free(c->ready);
    mw__free(c->done);
    mw__free(c->arrived);
    mw__reducer_shm.comm_free(c->sync);
    mw__free(c->devs);
    mw__free(c->bufs);
    mw__free(c->lens);
    mw__free(c->parts);
    mw__free(c->roots);
    mw__free(c);
}

static mw_status local_comm_new(int nranks, struct mw__device *const *devices,
                                const mw__comm_options *opt, mw__comm **out) {
    if (!out) return mw__error(MW_ERR_INVALID, "cuda-local comm_new: out is NULL");
    *out = NULL;
    if (nranks < 1 || nranks > MW_MAX_DEVICES || !devices)
        return mw__error(MW_ERR_INVALID,
                         "cuda-local comm_new: %d ranks (expected 1..%d, with "
                         "their devices)",
                         nranks, MW_MAX_DEVICES);
    for (int r = 0; r < nranks; r++) {
        if (!devices[r] || devices[r]->vt != mw__cuda_services.device)
            return mw__error(MW_ERR_INVALID, "cuda-local comm_new: rank %d is not a CUDA device",
                             r);
        if (devices[r]->ordinal != devices[0]->ordinal)
            return mw__error(MW_ERR_INVALID,
                             "cuda-local comm_new: %s and %s are on different GPUs (%d, %d); "
                             "devices on distinct GPUs reduce through NCCL",
                             devices[0]->name, devices[r]->name, devices[0]->ordinal,
                             devices[r]->ordinal);
    }
    local_comm *c = mw__calloc(1, sizeof *c);
    if (!c) return mw__error(MW_ERR_NOMEM, "cuda-local comm_new: out of memory");
    c->nranks = nranks;
    c->devs = mw__calloc((size_t)nranks, sizeof *c->devs);
    c->bufs = mw__calloc((size_t)nranks, sizeof *c->bufs);
    c->lens = mw__calloc((size_t)nranks, sizeof *c->lens);
    c->parts = mw__calloc((size_t)nranks, sizeof *c->parts);
    c->roots = mw__calloc((size_t)nranks, sizeof *c->roots);
    if (!c->devs || !c->bufs || !c->lens || !c->parts || !c->roots) {
        local_comm_free((mw__comm *)c);
        return mw__error(MW_ERR_NOMEM, "cuda-local comm_new: out of memory");
    }
    c->streams = mw__calloc((size_t)nranks, sizeof *c->streams);
    c->ready = mw__calloc((size_t)nranks, sizeof *c->ready);
    c->done = mw__calloc((size_t)nranks, sizeof *c->done);
    c->arrived = mw__calloc((size_t)nranks, sizeof *c->arrived);
    if (!c->streams || !c->ready || !c->done || !c->arrived) {
        local_comm_free((mw__comm *)c);
        return mw__error(MW_ERR_NOMEM, "cuda-local comm_new: out of memory");
    }
    for (int r = 0; r < nranks; r++) c->devs[r] = devices[r];
    mw_status st = mw__reducer_shm.comm_new(nranks, NULL, opt, &c->sync);
    for (int r = 0; r < nranks && !st; r++) {
        cudaError_t e = cudaSetDevice(devices[r]->ordinal);
        if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->streams[r], cudaStreamNonBlocking);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->ready[r], cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->done[r], cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->arrived[r], cudaEventDisableTiming);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            st = mw__error(e == cudaErrorMemoryAllocation ? MW_ERR_NOMEM : MW_ERR_DEVICE,
                           "cuda-local comm_new: %s: making its stream and events failed: %s",
                           devices[r]->name, cudaGetErrorString(e));
        }
    }
    if (st) {
        char msg[MW__MSG_SIZE];
        snprintf(msg, sizeof msg, "%s", mw_last_error());
        local_comm_free((mw__comm *)c);
        return mw__error_copy(st, msg);
    }
    *out = (mw__comm *)c;
    return MW_OK;
}

/* Checks a call's rank and buffer; a bad one aborts, since peers would wait for it. */
static mw_status check_call(local_comm *c, int rank, const float *buf, size_t n) {
    if (!c) return mw__error(MW_ERR_INVALID, "all-reduce (cuda-local): communicator is NULL");
    if (rank >= 0 && rank < c->nranks && (buf || n == 0)) return MW_OK;
    mw__reducer_shm.abort(c->sync);
    return mw__error(MW_ERR_INVALID, "all-reduce (cuda-local): rank %d of %d, buffer %p", rank,
                     c->nranks, (const void *)buf);
}

/* Publishes the rank's buffer (and parts or root) and meets the peers (barrier 1); then every
 * rank sees the same arguments, so all fail alike when they disagree. */
static mw_status publish_call(local_comm *c, int rank, const char *what, float *buf, size_t n,
                              const size_t *bounds, int root) {
    c->bufs[rank] = buf;
    c->lens[rank] = n;
    c->parts[rank] = bounds;
    c->roots[rank] = root;
    mw_status st = mw__reducer_shm.barrier(c->sync, rank);
    if (st) return relabel(st, what);
    size_t psize = (size_t)(c->nranks + 1) * sizeof **c->parts;
    for (int q = 1; q < c->nranks; q++) {
        if (c->lens[q] != c->lens[0])
            return mw__error(MW_ERR_INVALID,
                             "%s (cuda-local): ranks disagree on the length: rank 0 has %zu "
                             "floats, rank %d has %zu",
                             what, c->lens[0], q, c->lens[q]);
        if (c->roots[q] != c->roots[0] || (bounds && memcmp(c->parts[q], c->parts[0], psize) != 0))
            return mw__error(MW_ERR_INVALID, "%s (cuda-local): ranks 0 and %d disagree on the %s",
                             what, q, bounds ? "parts" : "root");
    }
    return MW_OK;
}

static mw_status publish(local_comm *c, int rank, float *buf, size_t n) {
    return publish_call(c, rank, "all-reduce", buf, n, NULL, 0);
}

/* Rank r's slice of n floats: whole 128-byte runs. */
static void slice_of(const local_comm *c, int rank, size_t n, size_t *lo, size_t *hi) {
    size_t runs = (n + RUN_FLOATS - 1) / RUN_FLOATS, p = (size_t)c->nranks;
    *lo = runs * (size_t)rank / p * RUN_FLOATS;
    *hi = runs * (size_t)(rank + 1) / p * RUN_FLOATS;
    if (*hi > n) *hi = n;
}

/* The closing barrier, taken even after the rank's sum failed so that no peer is left waiting
 * for it, and after a collective of 0 floats too: a peer may still be comparing what this rank
 * published, which its next collective would overwrite. The sum's failure (st, with its
 * message) wins. */
static mw_status close_sum(local_comm *c, int rank, mw_status st) {
    char msg[MW__MSG_SIZE];
    if (st) snprintf(msg, sizeof msg, "%s", mw_last_error());
    mw_status closing = mw__reducer_shm.barrier(c->sync, rank);
    if (st) {
        mw__reducer_shm.abort(c->sync);
        return mw__error_copy(st, msg);
    }
    return closing ? relabel(closing, "all-reduce") : MW_OK;
}

static mw_status local_allreduce_sum_f32(mw__comm *comm, int rank, float *buf, size_t n) {
    local_comm *c = as_local(comm);
    mw_status st = check_call(c, rank, buf, n);
    if (st) return st;
    /* Step 1. The buffer must be complete before a peer reads it. */
    mw__device *dev = c->devs[rank];
    if ((st = dev->vt->sync(dev))) {
        mw__reducer_shm.abort(c->sync);
        return st;
    }
    if ((st = publish(c, rank, buf, n)) || c->nranks == 1) return st;
    if (n == 0) return close_sum(c, rank, MW_OK);
    /* Step 2: this rank's slice; step 3: the closing barrier. */
    size_t lo, hi;
    slice_of(c, rank, n, &lo, &hi);
    return close_sum(c, rank, mw__cuda_services.sum_slices(dev, c->bufs, c->nranks, lo, hi));
}

/* A CUDA failure of an overlapped sum: aborts the communicator (peers would wait for this rank)
 * and reports it. */
static mw_status cuda_failed(local_comm *c, int rank, const char *call, cudaError_t e) {
    (void)cudaGetLastError();
    mw__reducer_shm.abort(c->sync);
    return mw__error(MW_ERR_DEVICE, "all-reduce (cuda-local): %s: %s failed: %s",
                     c->devs[rank]->name, call, cudaGetErrorString(e));
}

static mw_status local_allreduce_start_f32(mw__comm *comm, int rank, float *buf, size_t n) {
    local_comm *c = as_local(comm);
    mw_status st = check_call(c, rank, buf, n);
    if (st) return st;
    mw__device *dev = c->devs[rank];
    cudaError_t e = cudaSetDevice(dev->ordinal);
    if (e == cudaSuccess)
        e = cudaEventRecord(c->ready[rank], (cudaStream_t)mw__cuda_services.stream(dev));
    if (e != cudaSuccess) return cuda_failed(c, rank, "cudaEventRecord", e);
    if ((st = publish(c, rank, buf, n)) || c->nranks == 1) return st;
    if (n == 0) return close_sum(c, rank, MW_OK);
    cudaStream_t s = c->streams[rank];
    for (int q = 0; q < c->nranks && e == cudaSuccess; q++)
        e = cudaStreamWaitEvent(s, c->ready[q], 0);
    if (e != cudaSuccess) return cuda_failed(c, rank, "cudaStreamWaitEvent", e);
    size_t lo, hi;
    slice_of(c, rank, n, &lo, &hi);
    st = mw__cuda_services.sum_slices_on(dev, (struct CUstream_st *)s, c->bufs, c->nranks, lo, hi);
    if (st == MW_OK && (e = cudaEventRecord(c->done[rank], s)) != cudaSuccess)
        st = mw__error(MW_ERR_DEVICE, "all-reduce (cuda-local): %s: cudaEventRecord failed: %s",
                       dev->name, cudaGetErrorString(e));
    return close_sum(c, rank, st); /* barrier 2: every done event is recorded */
}

static mw_status local_allreduce_finish(mw__comm *comm, int rank) {
    local_comm *c = as_local(comm);
    if (!c || rank < 0 || rank >= c->nranks)
        return mw__error(MW_ERR_INVALID, "all-reduce wait (cuda-local): bad communicator or rank");
    if (c->nranks == 1) return MW_OK;
    mw__device *dev = c->devs[rank];
    cudaStream_t s = (cudaStream_t)mw__cuda_services.stream(dev);
    cudaError_t e = cudaSetDevice(dev->ordinal);
    for (int q = 0; q < c->nranks && e == cudaSuccess; q++)
        e = cudaStreamWaitEvent(s, c->done[q], 0);
    if (e != cudaSuccess) return cuda_failed(c, rank, "cudaStreamWaitEvent", e);
    return MW_OK;
}

enum local_op { LOCAL_REDUCE_SCATTER, LOCAL_ALL_GATHER, LOCAL_BROADCAST };

/* On stream s of the rank (its compute stream when NULL): to[lo, hi) = from[lo, hi), device to
 * device. */
static mw_status copy_range(local_comm *c, int rank, cudaStream_t s, float *to, const float *from,
                            size_t lo, size_t hi) {
    if (hi <= lo || to == from) return MW_OK;
    if (!s) s = (cudaStream_t)mw__cuda_services.stream(c->devs[rank]);
    cudaError_t e =
        cudaMemcpyAsync(to + lo, from + lo, (hi - lo) * sizeof *to, cudaMemcpyDeviceToDevice, s);
    if (e == cudaSuccess) return MW_OK;
    (void)cudaGetLastError();
    return mw__error(MW_ERR_DEVICE, "%s: copying between the ranks' buffers failed: %s",
                     c->devs[rank]->name, cudaGetErrorString(e));
}

/* Steps 1 and 3 as in the all-reduce; between them a reduce-scatter sums the rank's part over
 * every buffer with the all-reduce's kernel (so the part holds the all-reduce's bits, and the
 * other buffers receive the sum there too), an all-gather copies each other rank's part from
 * its owner's buffer, and a broadcast copies the root's buffer. */
static const char *const op_names[] = {"reduce-scatter", "all-gather", "broadcast"};

/* check_call, then the parts (or the root) of op; a bad one aborts, as the peers would wait. */
static mw_status check_op(local_comm *c, int rank, enum local_op op, const float *buf, size_t n,
                          const size_t *bounds, int root) {
    mw_status st = check_call(c, rank, buf, n);
    if (st) return st;
    if (op == LOCAL_BROADCAST ? root >= 0 && root < c->nranks
                              : !mw__bad_bounds(bounds, c->nranks, n))
        return MW_OK;
    mw__reducer_shm.abort(c->sync);
    return mw__error(MW_ERR_INVALID, "%s (cuda-local): rank %d passed %s", op_names[op], rank,
                     op == LOCAL_BROADCAST ? "a root out of range"
                                           : "no parts, or parts outside the buffer");
}

/* Every other rank's part of an all-gather, copied on stream s (NULL: the compute stream). */
static mw_status copy_parts(local_comm *c, int rank, cudaStream_t s, float *buf,
                            const size_t *bounds) {
    mw_status st = MW_OK;
    for (int q = 0; q < c->nranks && !st; q++)
        if (q != rank) st = copy_range(c, rank, s, buf, c->bufs[q], bounds[q], bounds[q + 1]);
    return st;
}

static mw_status local_collective(mw__comm *comm, int rank, enum local_op op, float *buf, size_t n,
                                  const size_t *bounds, int root) {
    local_comm *c = as_local(comm);
    mw_status st = check_op(c, rank, op, buf, n, bounds, root);
    if (st) return st;
    mw__device *dev = c->devs[rank];
    /* Sums this rank started complete first; then its buffer must be complete for the peers. */
    if ((st = local_allreduce_finish(comm, rank)) || (st = dev->vt->sync(dev))) {
        mw__reducer_shm.abort(c->sync);
        return st;
    }
    if ((st = publish_call(c, rank, op_names[op], buf, n, op == LOCAL_BROADCAST ? NULL : bounds,
                           op == LOCAL_BROADCAST ? root : 0)) ||
        c->nranks == 1)
        return st;
    if (n == 0) return close_sum(c, rank, MW_OK);
    if (op == LOCAL_REDUCE_SCATTER)
        return close_sum(
            c, rank,
            mw__cuda_services.sum_slices(dev, c->bufs, c->nranks, bounds[rank], bounds[rank + 1]));
    if (op == LOCAL_ALL_GATHER) st = copy_parts(c, rank, NULL, buf, bounds);
    if (op == LOCAL_BROADCAST && root != rank)
        st = copy_range(c, rank, NULL, buf, c->bufs[root], 0, n);
    if (!st) st = dev->vt->sync(dev); /* the copies are done before a peer may go on */
    return close_sum(c, rank, st);
}

static mw_status local_reduce_scatter_sum_f32(mw__comm *comm, int rank, float *buf, size_t n,
                                              const size_t *bounds) {
    return local_collective(comm, rank, LOCAL_REDUCE_SCATTER, buf, n, bounds, 0);
}

static mw_status local_all_gather_f32(mw__comm *comm, int rank, float *buf, size_t n,
                                      const size_t *bounds) {
    return local_collective(comm, rank, LOCAL_ALL_GATHER, buf, n, bounds, 0);
}

/* As the overlapped sum (allreduce_start): after barrier 1 the rank's communication stream waits
 * for every rank's ready event and copies the other ranks' parts out of their buffers, then
 * records its done event; barrier 2; finish makes the compute stream wait for every done event,
 * so no rank writes its part again before every peer has copied it. */
static mw_status local_all_gather_start(mw__comm *comm, int rank, void *vbuf, size_t n,
                                        mw_dtype dtype, const size_t *bounds) {
    local_comm *c = as_local(comm);
    float *buf = vbuf;
    mw_status st = mw__reducer_dtype("cuda-local", "all-gather", dtype);
    if (st || (st = check_op(c, rank, LOCAL_ALL_GATHER, buf, n, bounds, 0))) return st;
    mw__device *dev = c->devs[rank];
    cudaError_t e = cudaSetDevice(dev->ordinal);
    if (e == cudaSuccess)
        e = cudaEventRecord(c->ready[rank], (cudaStream_t)mw__cuda_services.stream(dev));
    if (e != cudaSuccess) return cuda_failed(c, rank, "cudaEventRecord", e);
    if ((st = publish_call(c, rank, "all-gather", buf, n, bounds, 0)) || c->nranks == 1) return st;
    if (n == 0) return close_sum(c, rank, MW_OK);
    cudaStream_t s = c->streams[rank];
    for (int q = 0; q < c->nranks && e == cudaSuccess; q++)
        e = cudaStreamWaitEvent(s, c->ready[q], 0);
    if (e != cudaSuccess) return cuda_failed(c, rank, "cudaStreamWaitEvent", e);
    st = copy_parts(c, rank, s, buf, bounds);
    if (st == MW_OK && (e = cudaEventRecord(c->done[rank], s)) != cudaSuccess)
        st = mw__error(MW_ERR_DEVICE, "all-gather (cuda-local): %s: cudaEventRecord failed: %s",
                       dev->name, cudaGetErrorString(e));
    return close_sum(c, rank, st); /* barrier 2: every done event is recorded */
}

static mw_status local_broadcast_f32(mw__comm *comm, int rank, float *buf, size_t n, int root) {
    return local_collective(comm, rank, LOCAL_BROADCAST, buf, n, NULL, root);
}

static mw_status local_barrier(mw__comm *comm, int rank) {
    local_comm *c = as_local(comm);
    if (!c) return mw__error(MW_ERR_INVALID, "barrier (cuda-local): communicator is NULL");
    return mw__reducer_shm.barrier(c->sync, rank);
}

static void local_abort(mw__comm *comm) {
    if (comm) mw__reducer_shm.abort(as_local(comm)->sync);
}

static void local_reset(mw__comm *comm) {
    if (!comm) return;
    drain(as_local(comm));
    mw__reducer_shm.reset(as_local(comm)->sync);
}

/* ---- point-to-point ---- */

/* A send, recv or sendrecv (send_peer or recv_peer -1: that half absent), queued on the
 * ranks' compute streams without waiting for the GPU. The ranks meet on the host
 * (collectives/p2p_meet.h): round 1, the sender records an event on its stream after the work
 * that writes its buffer and tells its receiver where both are; the receiver's stream waits for
 * that event, copies (device to device, all ranks are on one GPU) and records its `arrived`
 * event; round 2, the receiver tells its sender, whose stream waits for `arrived`, so the
 * sender's later kernels may overwrite its buffer. Every GPU wait is on an event already
 * recorded, so no stream waits for a peer that never comes; the host meets its peers only
 * through the shared-memory communicator, which gives abort and timeout. An event is
 * re-recorded only in a later call, after its peer queued its wait on it (round 2 follows
 * round 1's waits; a later record of `arrived` is later on the same stream, so waiting on it
 * still orders after the copy). */
static mw_status local_p2p(mw__comm *comm, const char *what, int rank, int send_peer,
                           const void *sendbuf, int recv_peer, void *recvbuf, size_t n,
                           mw_dtype dtype) {
    local_comm *c = as_local(comm);
    if (!c) return mw__error(MW_ERR_INVALID, "%s (cuda-local): communicator is NULL", what);
    size_t es = mw__p2p_esize(dtype);
    const char *bad =
        rank < 0 || rank >= c->nranks ? "a rank out of range"
        : !es                         ? NULL
              : mw__p2p_bad_args(c->nranks, rank, send_peer, sendbuf, recv_peer, recvbuf, n, dtype);
    if (bad || !es) {
        mw__reducer_shm.abort(c->sync); /* the peer would wait for this rank */
        if (!bad)
            return mw__error(MW_ERR_UNSUPPORTED,
                             "%s (cuda-local): elements of dtype %d (f32 and bf16 only)", what,
                             (int)dtype);
        return mw__error(MW_ERR_INVALID, "%s (cuda-local): rank %d passed %s", what, rank, bad);
    }
    mw_status st = local_allreduce_finish(comm, rank); /* the sums it started come first */
    if (st) return st;
    mw__device *dev = c->devs[rank];
    cudaStream_t s = (cudaStream_t)mw__cuda_services.stream(dev);
    cudaError_t e = cudaSetDevice(dev->ordinal);
    mw__p2p_call mine_send = {n, dtype, 1, (void *)sendbuf, c->ready[rank]};
    mw__p2p_call mine_recv = {n, dtype, 2, recvbuf, NULL}, sender = {0}, receiver = {0};
    if (e == cudaSuccess && send_peer >= 0) e = cudaEventRecord(c->ready[rank], s);
    if (e != cudaSuccess) return cuda_failed(c, rank, "cudaEventRecord", e);
    if ((st = mw__p2p_meet(&mw__reducer_shm, c->sync, what, rank, 1, send_peer, &mine_send,
                           recv_peer, &sender)))
        return relabel(st, what);
    mw_status got = MW_OK;
    if (recv_peer >= 0 && !(got = mw__p2p_check(what, recv_peer, &sender, rank, &mine_recv))) {
        if (n > 0) {
            e = cudaStreamWaitEvent(s, (cudaEvent_t)sender.event, 0);
            if (e == cudaSuccess)
                e = cudaMemcpyAsync(recvbuf, sender.buf, n * es, cudaMemcpyDeviceToDevice, s);
        }
        if (e == cudaSuccess) e = cudaEventRecord(c->arrived[rank], s);
        if (e != cudaSuccess) return cuda_failed(c, rank, "queueing the copy", e);
        mine_recv.event = c->arrived[rank];
    }
    char msg[MW__MSG_SIZE];
    if (got) snprintf(msg, sizeof msg, "%s", mw_last_error());
    if ((st = mw__p2p_meet(&mw__reducer_shm, c->sync, what, rank, 2, recv_peer, &mine_recv,
                           send_peer, &receiver)))
        return relabel(st, what);
    mw_status sent = MW_OK;
    if (send_peer >= 0 && !(sent = mw__p2p_check(what, rank, &mine_send, send_peer, &receiver)) &&
        (e = cudaStreamWaitEvent(s, (cudaEvent_t)receiver.event, 0)) != cudaSuccess)
        return cuda_failed(c, rank, "cudaStreamWaitEvent", e);
    return got ? mw__error_copy(got, msg) : sent;
}

static mw_status local_send(mw__comm *comm, int rank, int peer, const void *buf, size_t n,
                            mw_dtype dtype) {
    int p = comm ? as_local(comm)->nranks : 0;
    return local_p2p(comm, "send", rank, peer < 0 ? p : peer, buf, -1, NULL, n, dtype);
}

static mw_status local_recv(mw__comm *comm, int rank, int peer, void *buf, size_t n,
                            mw_dtype dtype) {
    int p = comm ? as_local(comm)->nranks : 0;
    return local_p2p(comm, "recv", rank, -1, NULL, peer < 0 ? p : peer, buf, n, dtype);
}

static mw_status local_sendrecv(mw__comm *comm, int rank, int send_peer, const void *sendbuf,
                                int recv_peer, void *recvbuf, size_t n, mw_dtype dtype) {
    int p = comm ? as_local(comm)->nranks : 0;
    return local_p2p(comm, "sendrecv", rank, send_peer < 0 ? p : send_peer, sendbuf,
                     recv_peer < 0 ? p : recv_peer, recvbuf, n, dtype);
}

/* The typed entry points: f32 only. */
MW__REDUCER_F32_ONLY(local, "cuda-local")

const mw__reducer_vtable mw__reducer_cuda_local = {
    .name = "cuda-local",
    .comm_new = local_comm_new,
    .comm_free = local_comm_free,
    .allreduce_sum = local_allreduce_sum,
    .barrier = local_barrier,
    .abort = local_abort,
    .reset = local_reset,
    .allreduce_start = local_allreduce_start,
    .finish = local_allreduce_finish,
    .reduce_scatter_sum = local_reduce_scatter_sum,
    .all_gather = local_all_gather,
    .broadcast = local_broadcast,
    .all_gather_start = local_all_gather_start,
    .send = local_send,
    .recv = local_recv,
    .sendrecv = local_sendrecv,
};
