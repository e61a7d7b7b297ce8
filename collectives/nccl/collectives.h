/* Internal: the collectives both NCCL reducers queue (collectives/nccl/reducer_nccl.c inside a
 * process, collectives/mpi/nccl_mpi.c across processes). Builds with MESHWIT_HAVE_NCCL only. */
#ifndef MW__NCCL_COLLECTIVES_H
#define MW__NCCL_COLLECTIVES_H

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stddef.h>

typedef enum mw__nccl_op {
    MW__NCCL_ALLREDUCE,  /* ncclAllReduce, sum */
    MW__NCCL_ALL_GATHER, /* one ncclBroadcast per non-empty part, from its owner, grouped */
    MW__NCCL_BROADCAST   /* ncclBroadcast from root */
} mw__nccl_op;

/* Queues op on stream s of comm, in place on buf[0..n) (bounds: the all-gather's nranks + 1
 * parts; root: the broadcast's). Returns NCCL's result: ncclInProgress while a non-blocking
 * communicator is still enqueuing. */
ncclResult_t mw__nccl_enqueue(ncclComm_t comm, cudaStream_t s, mw__nccl_op op, float *buf, size_t n,
                              const size_t *bounds, int nranks, int root);

/* What is wrong with a call's arguments ("a NULL buffer", ...), or NULL. with_parts: bounds
 * must hold nranks + 1 parts of buf[0..n); a broadcast's root must be a rank. */
const char *mw__nccl_bad_args(mw__nccl_op op, const float *buf, size_t n, const size_t *bounds,
                              int nranks, int with_parts, int root);

/* Queues, in one group on stream s of comm, a send of sendbuf[0..bytes) to rank send_peer and a
 * receive of recvbuf[0..bytes) from rank recv_peer (either -1: none); NCCL's result as above. */
ncclResult_t mw__nccl_p2p(ncclComm_t comm, cudaStream_t s, int send_peer, const void *sendbuf,
                          int recv_peer, void *recvbuf, size_t bytes);

/* The NCCL call that op makes, for messages. */
const char *mw__nccl_call(mw__nccl_op op);

#endif
