/* The fakes of the CUDA runtime, NCCL and MPI behind tests/gpu/fake/include/ (fake_gpu.c), and
 * what the host-side tests of the GPU reducers read back from them: which thread made each
 * stream and event and on which GPU, which stream each NCCL call was queued on, which
 * communicators were aborted. A stream with queued NCCL work reports cudaErrorNotReady to the
 * next FAKE_POLLS_PER_OP queries per operation, so a finish that returns early leaves work
 * pending. Also the CUDA backend's services (mw__cuda_services) for fake devices: a fake device
 * has vt == &fake_cuda_device and a GPU ordinal. Criterion runs every test in a process of its
 * own, so the record starts empty in each. */
#ifndef MW_TESTS_FAKE_GPU_H
#define MW_TESTS_FAKE_GPU_H

#include <pthread.h>

#include "devices/device.h"

#define FAKE_MAX 128
#define FAKE_POLLS_PER_OP 3

typedef struct fake_stream_info {
    int device;       /* the GPU current when it was made */
    pthread_t thread; /* the thread that made it */
    int pending;      /* queries still to answer cudaErrorNotReady */
    int destroyed;
} fake_stream_info;

typedef struct fake_call {
    const char *what; /* "ncclAllReduce", "ncclBroadcast", "ncclSend", "ncclRecv" */
    int rank;         /* the communicator's rank */
    struct CUstream_st *stream;
    pthread_t thread;
    int peer;     /* ncclSend and ncclRecv: the other rank */
    size_t count; /* ncclSend and ncclRecv: elements (bytes: ncclUint8) */
} fake_call;

typedef struct fake_copy { /* a cudaMemcpyAsync */
    void *dst;
    const void *src;
    size_t bytes;
    struct CUstream_st *stream;
} fake_copy;

typedef struct fake_record {
    int nstreams, nevents;
    struct CUstream_st *streams[FAKE_MAX];
    fake_stream_info stream[FAKE_MAX];
    pthread_t event_thread[FAKE_MAX];
    int ncomms, aborted; /* communicators made, and aborted */
    int legacy;          /* NCCL calls or queries on the legacy stream (NULL) */
    int bad_handles;     /* calls with a NULL event or stream that was destroyed */
    int ncalls;
    fake_call calls[FAKE_MAX * 4];
    int ncopies;
    fake_copy copies[FAKE_MAX];
} fake_record;

/* The record so far (read it when no other thread is inside a fake). */
const fake_record *fake_gpu(void);

/* The index in fake_gpu()->streams of s, or -1. */
int fake_stream_index(const struct CUstream_st *s);

/* Queued NCCL work not yet reported done, on every stream together, and on the streams made on
 * GPU device. */
int fake_pending(void);
int fake_pending_on(int device);

/* While stalled, queued NCCL work never completes: every query of a stream holding some answers
 * cudaErrorNotReady (a peer that never comes). */
void fake_stall(int on);

/* The fake CUDA device (its kind "cuda"; its sync returns MW_OK) and a device of it named name on
 * GPU ordinal. */
extern const mw__device_vtable fake_cuda_device;
void fake_device(mw__device *dev, const char *name, int ordinal);

#endif
