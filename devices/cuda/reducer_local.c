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
 * worker done only once no kernel of the collective runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "devices/cuda/cuda.h"
#include "meshwit/mesh.h"
#include "parallel/reducer_select.h"

#define RUN_FLOATS 32 /* 128 bytes */

typedef struct local_comm {
    int nranks;
    mw__comm *sync; /* shared-memory communicator: barriers, abort, timeout */
    mw__device **devs;
    float **bufs; /* published for the current collective */
    size_t *lens;
} local_comm;

static local_comm *as_local(mw__comm *c) { return (local_comm *)c; }

/* Re-labels a synchronisation failure as this collective's, keeping its message. */
static mw_status relabel(mw_status st, const char *what) {
    char msg[MW__MSG_SIZE];
    snprintf(msg, sizeof msg, "%s", mw_last_error());
    return mw__error(st, "%s (cuda-local): %s", what, msg);
}

static void local_comm_free(mw__comm *comm) {
    local_comm *c = as_local(comm);
    if (!c) return;
    mw__reducer_shm.comm_free(c->sync);
    mw__free(c->devs);
    mw__free(c->bufs);
    mw__free(c->lens);
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
        if (!devices[r] || devices[r]->vt != &mw__cuda_device)
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
    if (!c->devs || !c->bufs || !c->lens) {
        local_comm_free((mw__comm *)c);
        return mw__error(MW_ERR_NOMEM, "cuda-local comm_new: out of memory");
    }
    for (int r = 0; r < nranks; r++) c->devs[r] = devices[r];
    mw_status st = mw__reducer_shm.comm_new(nranks, NULL, opt, &c->sync);
    if (st) {
        local_comm_free((mw__comm *)c);
        return st;
    }
    *out = (mw__comm *)c;
    return MW_OK;
}

static mw_status local_allreduce_sum(mw__comm *comm, int rank, float *buf, size_t n) {
    local_comm *c = as_local(comm);
    if (!c) return mw__error(MW_ERR_INVALID, "all-reduce (cuda-local): communicator is NULL");
    if (rank < 0 || rank >= c->nranks) {
        mw__reducer_shm.abort(c->sync); /* peers would wait for a rank that never comes */
        return mw__error(MW_ERR_INVALID, "all-reduce (cuda-local): rank %d out of range 0..%d",
                         rank, c->nranks - 1);
    }
    mw__device *dev = c->devs[rank];
    if (!buf && n > 0) {
        mw__reducer_shm.abort(c->sync);
        return mw__error(MW_ERR_INVALID, "all-reduce (cuda-local): rank %d passed a NULL buffer",
                         rank);
    }
    /* Step 1. The buffer must be complete before a peer reads it. */
    mw_status st = dev->vt->sync(dev);
    if (st) {
        mw__reducer_shm.abort(c->sync);
        return st;
    }
    c->bufs[rank] = buf;
    c->lens[rank] = n;
    if ((st = mw__reducer_shm.barrier(c->sync, rank))) return relabel(st, "all-reduce");
    for (int q = 1; q < c->nranks; q++)
        if (c->lens[q] != c->lens[0]) /* every rank sees the same lengths: all fail alike */
            return mw__error(MW_ERR_INVALID,
                             "all-reduce (cuda-local): ranks disagree on the length: rank 0 has "
                             "%zu floats, rank %d has %zu",
                             c->lens[0], q, c->lens[q]);
    if (n == 0 || c->nranks == 1) return MW_OK;

    /* Step 2: this rank's slice. */
    int p = c->nranks;
    size_t runs = (n + RUN_FLOATS - 1) / RUN_FLOATS;
    size_t lo = runs * (size_t)rank / (size_t)p * RUN_FLOATS;
    size_t hi = runs * (size_t)(rank + 1) / (size_t)p * RUN_FLOATS;
    if (hi > n) hi = n;
    st = mw__cuda_sum_slices(dev, c->bufs, p, lo, hi);
    char msg[MW__MSG_SIZE];
    if (st) snprintf(msg, sizeof msg, "%s", mw_last_error());

    /* Step 3, taken even after a failure so no peer is left waiting for this rank. */
    mw_status st3 = mw__reducer_shm.barrier(c->sync, rank);
    if (st) {
        mw__reducer_shm.abort(c->sync);
        return mw__error_copy(st, msg);
    }
    return st3 ? relabel(st3, "all-reduce") : MW_OK;
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
    if (comm) mw__reducer_shm.reset(as_local(comm)->sync);
}

const mw__reducer_vtable mw__reducer_cuda_local = {
    .name = "cuda-local",
    .comm_new = local_comm_new,
    .comm_free = local_comm_free,
    .allreduce_sum = local_allreduce_sum,
    .barrier = local_barrier,
    .abort = local_abort,
    .reset = local_reset,
};
