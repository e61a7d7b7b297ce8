/* The collectives both NCCL reducers queue. The all-gather broadcasts each rank's part from its
 * owner instead of calling ncclAllGather, which needs equal parts at equal offsets; every copy
 * is exact, so the result is the owners' bits. NCCL's ncclReduceScatter is not used: its order
 * of additions need not be the all-reduce's, and reduce_scatter_sum promises the all-reduce's
 * bits (the reducers all-reduce the whole buffer instead). */
#include "collectives/nccl/collectives.h"

#include "collectives/reducer.h"

ncclResult_t mw__nccl_enqueue(ncclComm_t comm, cudaStream_t s, mw__nccl_op op, float *buf, size_t n,
                              const size_t *bounds, int nranks, int root) {
    if (op == MW__NCCL_ALLREDUCE) return ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm, s);
    if (op == MW__NCCL_BROADCAST) return ncclBroadcast(buf, buf, n, ncclFloat, root, comm, s);
    ncclResult_t res = ncclGroupStart();
    if (res != ncclSuccess) return res;
    for (int q = 0; q < nranks && (res == ncclSuccess || res == ncclInProgress); q++) {
        size_t lo = bounds[q], len = bounds[q + 1] - lo;
        if (len) res = ncclBroadcast(buf + lo, buf + lo, len, ncclFloat, q, comm, s);
    }
    ncclResult_t end = ncclGroupEnd(); /* also after a failure: the group must be closed */
    return res == ncclSuccess || res == ncclInProgress ? end : res;
}

/* Bytes, not elements: point-to-point moves bits, so f32 and bf16 are one type to NCCL. */
ncclResult_t mw__nccl_p2p(ncclComm_t comm, cudaStream_t s, int send_peer, const void *sendbuf,
                          int recv_peer, void *recvbuf, size_t bytes) {
    ncclResult_t res = ncclGroupStart();
    if (res != ncclSuccess) return res;
    if (send_peer >= 0) res = ncclSend(sendbuf, bytes, ncclUint8, send_peer, comm, s);
    if (recv_peer >= 0 && (res == ncclSuccess || res == ncclInProgress))
        res = ncclRecv(recvbuf, bytes, ncclUint8, recv_peer, comm, s);
    ncclResult_t end = ncclGroupEnd(); /* also after a failure: the group must be closed */
    return res == ncclSuccess || res == ncclInProgress ? end : res;
}

const char *mw__nccl_bad_args(mw__nccl_op op, const float *buf, size_t n, const size_t *bounds,
                              int nranks, int with_parts, int root) {
    if (!buf && n > 0) return "a NULL buffer";
    if (with_parts && mw__bad_bounds(bounds, nranks, n))
        return "no parts, or parts outside the buffer";
    if (op == MW__NCCL_BROADCAST && (root < 0 || root >= nranks)) return "a root out of range";
    return NULL;
}

const char *mw__nccl_call(mw__nccl_op op) {
    switch (op) {
    case MW__NCCL_ALL_GATHER: return "ncclBroadcast (all-gather)";
    case MW__NCCL_BROADCAST: return "ncclBroadcast";
    default: return "ncclAllReduce";
    }
}
