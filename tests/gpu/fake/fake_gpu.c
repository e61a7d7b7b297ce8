/* Fakes of the CUDA runtime, NCCL and MPI calls the GPU reducers make (tests/gpu/fake/include/),
 * the CUDA backend's services for fake devices (mw__cuda_services) and the hierarchical host
 * communicator NCCL over MPI takes its barriers and point-to-point meetings from
 * (mw__reducer_mpi_hier): a world of one process, GPUs that exist only as ordinals, NCCL work
 * that completes after a few polls. Every call is recorded under one lock (fake_gpu.h says
 * what). */
#include "fake_gpu.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include "collectives/mpi/mpi_impl.h"
#include "collectives/reducer.h"
#include "devices/cuda/cuda.h" /* mw__find_shared_gpu (cuda_host_under_test.c) */
#include "devices/module_abi.h"

struct CUstream_st {
    int index; /* in the record; -1 for a device's compute stream */
};
struct CUevent_st {
    int index;
};
struct ncclComm {
    int rank;
    int aborted;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static fake_record rec;
static struct CUstream_st stream_pool[FAKE_MAX], compute_pool[8];
static struct CUevent_st event_pool[FAKE_MAX];
static struct ncclComm comm_pool[FAKE_MAX];
static _Thread_local int current_device;
static _Atomic int stalled;

void fake_stall(int on) { atomic_store(&stalled, on); }

const fake_record *fake_gpu(void) { return &rec; }

int fake_stream_index(const struct CUstream_st *s) {
    return s && s >= stream_pool && s < stream_pool + FAKE_MAX ? s->index : -1;
}

static int pending_on(int device) {
    pthread_mutex_lock(&lock);
    int n = 0;
    for (int i = 0; i < rec.nstreams; i++)
        if (device < 0 || rec.stream[i].device == device) n += rec.stream[i].pending;
    pthread_mutex_unlock(&lock);
    return n;
}

int fake_pending(void) { return pending_on(-1); }

int fake_pending_on(int device) { return pending_on(device); }

/* --- the CUDA runtime ------------------------------------------------------------------------ */

cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= 8) return cudaErrorInvalidDevice;
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }

const char *cudaGetErrorString(cudaError_t error) {
    return error == cudaSuccess ? "no error" : "fake CUDA error";
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    cudaError_t e = cudaErrorMemoryAllocation;
    if (rec.nstreams < FAKE_MAX) {
        int i = rec.nstreams++;
        stream_pool[i].index = i;
        rec.streams[i] = &stream_pool[i];
        rec.stream[i] = (fake_stream_info){.device = current_device, .thread = pthread_self()};
        *stream = &stream_pool[i];
        e = cudaSuccess;
    }
    pthread_mutex_unlock(&lock);
    return e;
}

/* A stream the calls may use: not NULL (the legacy stream, which the reducers never mean) and
 * not destroyed. Called with the lock held. */
static int usable(cudaStream_t s) {
    if (!s) {
        rec.legacy++;
        return 0;
    }
    int i = fake_stream_index(s);
    if (i >= 0 && rec.stream[i].destroyed) {
        rec.bad_handles++;
        return 0;
    }
    return 1;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    pthread_mutex_lock(&lock);
    int i = fake_stream_index(stream);
    if (i >= 0) rec.stream[i].destroyed = 1;
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
    pthread_mutex_lock(&lock);
    cudaError_t e = cudaErrorInvalidResourceHandle;
    if (usable(stream)) {
        int i = fake_stream_index(stream);
        e = cudaSuccess;
        if (i >= 0 && rec.stream[i].pending > 0) {
            if (!atomic_load(&stalled)) rec.stream[i].pending--;
            e = cudaErrorNotReady;
        }
    }
    pthread_mutex_unlock(&lock);
    return e;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    pthread_mutex_lock(&lock);
    cudaError_t e = cudaErrorInvalidResourceHandle;
    if (usable(stream)) {
        int i = fake_stream_index(stream);
        if (i >= 0) rec.stream[i].pending = 0;
        e = cudaSuccess;
    }
    pthread_mutex_unlock(&lock);
    return e;
}

static cudaError_t event_call(cudaEvent_t event, cudaStream_t stream) {
    pthread_mutex_lock(&lock);
    cudaError_t e = cudaErrorInvalidResourceHandle;
    if (!event)
        rec.bad_handles++;
    else if (usable(stream))
        e = cudaSuccess;
    pthread_mutex_unlock(&lock);
    return e;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    (void)flags;
    return event_call(event, stream);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    return event_call(event, stream);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    cudaError_t e = cudaErrorMemoryAllocation;
    if (rec.nevents < FAKE_MAX) {
        int i = rec.nevents++;
        event_pool[i].index = i;
        rec.event_thread[i] = pthread_self();
        *event = &event_pool[i];
        e = cudaSuccess;
    }
    pthread_mutex_unlock(&lock);
    return e;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    (void)event;
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    (void)kind;
    pthread_mutex_lock(&lock);
    cudaError_t e = usable(stream) ? cudaSuccess : cudaErrorInvalidResourceHandle;
    if (e == cudaSuccess && rec.ncopies < FAKE_MAX)
        rec.copies[rec.ncopies++] = (fake_copy){dst, src, count, stream};
    pthread_mutex_unlock(&lock);
    return e;
}

/* --- NCCL ------------------------------------------------------------------------------------- */

const char *ncclGetErrorString(ncclResult_t result) {
    return result == ncclSuccess ? "no error" : "fake NCCL error";
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return "";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof *id);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config) {
    (void)nranks, (void)id, (void)config;
    pthread_mutex_lock(&lock);
    ncclResult_t res = ncclSystemError;
    if (rec.ncomms < FAKE_MAX) {
        comm_pool[rec.ncomms] = (struct ncclComm){.rank = rank};
        *comm = &comm_pool[rec.ncomms++];
        res = ncclSuccess;
    }
    pthread_mutex_unlock(&lock);
    return res;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state) {
    *state = ncclSuccess;
    return comm && !comm->aborted ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    pthread_mutex_lock(&lock);
    if (comm) {
        comm->aborted = 1;
        rec.aborted++;
    }
    pthread_mutex_unlock(&lock);
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) { return ncclSuccess; }

ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

/* Queues one operation: recorded, and pending on its stream for FAKE_POLLS_PER_OP queries. */
static ncclResult_t enqueue_p2p(const char *what, ncclComm_t comm, cudaStream_t stream, int peer,
                                size_t count) {
    pthread_mutex_lock(&lock);
    ncclResult_t res = ncclInvalidArgument;
    if (!comm || comm->aborted) {
        rec.bad_handles++;
    } else if (usable(stream) && rec.ncalls < FAKE_MAX * 4) {
        rec.calls[rec.ncalls++] = (fake_call){.what = what,
                                              .rank = comm->rank,
                                              .stream = stream,
                                              .thread = pthread_self(),
                                              .peer = peer,
                                              .count = count};
        int i = fake_stream_index(stream);
        if (i >= 0) rec.stream[i].pending += FAKE_POLLS_PER_OP;
        res = ncclSuccess;
    }
    pthread_mutex_unlock(&lock);
    return res;
}

static ncclResult_t enqueue(const char *what, ncclComm_t comm, cudaStream_t stream) {
    return enqueue_p2p(what, comm, stream, -1, 0);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    (void)sendbuff, (void)datatype;
    return enqueue_p2p("ncclSend", comm, stream, peer, count);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    (void)recvbuff, (void)datatype;
    return enqueue_p2p("ncclRecv", comm, stream, peer, count);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
    (void)sendbuff, (void)recvbuff, (void)count, (void)datatype, (void)op;
    return enqueue("ncclAllReduce", comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    (void)sendbuff, (void)recvbuff, (void)count, (void)datatype, (void)root;
    return enqueue("ncclBroadcast", comm, stream);
}

/* --- MPI: a world of one process ------------------------------------------------------------ */

int MPI_Comm_size(MPI_Comm comm, int *size) {
    (void)comm;
    *size = 1;
    return MPI_SUCCESS;
}

int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm *newcomm) {
    (void)color, (void)key;
    *newcomm = comm;
    return MPI_SUCCESS;
}

int MPI_Comm_free(MPI_Comm *comm) {
    (void)comm;
    return MPI_SUCCESS;
}

int MPI_Bcast(void *buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm) {
    (void)buffer, (void)count, (void)datatype, (void)root, (void)comm;
    return MPI_SUCCESS;
}

int MPI_Allgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                  int recvcount, MPI_Datatype recvtype, MPI_Comm comm) {
    (void)sendtype, (void)recvcount, (void)recvtype, (void)comm;
    memcpy(recvbuf, sendbuf, (size_t)sendcount); /* MPI_CHAR, one process */
    return MPI_SUCCESS;
}

void mw__mpi_lock(void) {}

void mw__mpi_unlock(void) {}

/* --- the host communicator of NCCL over MPI: barriers that never wait (one process), and the
 * shared-memory reducer's point-to-point calls among the ranks of that process ------------- */

typedef struct fake_host {
    mw__comm *shm;
} fake_host;

static mw_status hier_comm_new(int nranks, struct mw__device *const *devices,
                               const mw__comm_options *opt, mw__comm **out) {
    (void)devices;
    *out = NULL;
    int here = 0;
    for (int r = 0; r < nranks; r++)
        here |= !opt || !opt->proc_of || opt->proc_of[r] == opt->self_proc;
    if (!here) return MW_OK;
    fake_host *h = calloc(1, sizeof *h);
    mw__comm_options so = {.timeout_ms = opt ? opt->timeout_ms : 0};
    mw_status st = h ? mw__reducer_shm.comm_new(nranks, NULL, &so, &h->shm) : MW_ERR_NOMEM;
    if (st) {
        free(h);
        return st;
    }
    *out = (mw__comm *)h;
    return MW_OK;
}

static void hier_comm_free(mw__comm *comm) {
    fake_host *h = (fake_host *)comm;
    if (!h) return;
    mw__reducer_shm.comm_free(h->shm);
    free(h);
}

static mw_status hier_barrier(mw__comm *comm, int rank) {
    (void)comm, (void)rank;
    return MW_OK;
}

static void hier_abort(mw__comm *comm) {
    if (comm) mw__reducer_shm.abort(((fake_host *)comm)->shm);
}

static void hier_reset(mw__comm *comm) {
    if (comm) mw__reducer_shm.reset(((fake_host *)comm)->shm);
}

static mw_status hier_send(mw__comm *comm, int rank, int peer, const void *buf, size_t n,
                           mw_dtype dtype) {
    return mw__reducer_shm.send(((fake_host *)comm)->shm, rank, peer, buf, n, dtype);
}

static mw_status hier_recv(mw__comm *comm, int rank, int peer, void *buf, size_t n,
                           mw_dtype dtype) {
    return mw__reducer_shm.recv(((fake_host *)comm)->shm, rank, peer, buf, n, dtype);
}

static mw_status hier_sendrecv(mw__comm *comm, int rank, int send_peer, const void *sendbuf,
                               int recv_peer, void *recvbuf, size_t n, mw_dtype dtype) {
    return mw__reducer_shm.sendrecv(((fake_host *)comm)->shm, rank, send_peer, sendbuf, recv_peer,
                                    recvbuf, n, dtype);
}

const mw__reducer_vtable mw__reducer_mpi_hier = {.name = "fake-hier",
                                                 .comm_new = hier_comm_new,
                                                 .comm_free = hier_comm_free,
                                                 .barrier = hier_barrier,
                                                 .abort = hier_abort,
                                                 .reset = hier_reset,
                                                 .send = hier_send,
                                                 .recv = hier_recv,
                                                 .sendrecv = hier_sendrecv};

/* --- the CUDA backend's services for fake devices --------------------------------------------- */

static mw_status fake_sync(mw__device *dev) {
    (void)dev;
    return MW_OK;
}

const mw__device_vtable fake_cuda_device = {.kind = "cuda", .sync = fake_sync};

void fake_device(mw__device *dev, const char *name, int ordinal) {
    memset(dev, 0, sizeof *dev);
    dev->vt = &fake_cuda_device;
    dev->ordinal = ordinal;
    snprintf(dev->name, sizeof dev->name, "%s", name);
}

static struct CUstream_st *compute_stream(const mw__device *dev) {
    compute_pool[dev->ordinal & 7].index = -1;
    return &compute_pool[dev->ordinal & 7];
}

static mw_status gpu_identity(int ordinal, char out[MW__GPU_ID_SIZE]) {
    snprintf(out, MW__GPU_ID_SIZE, "fakehost 0000:%02x:00.0 GPU-%02x", ordinal, ordinal);
    return MW_OK;
}

static mw_status sum_slices_on(struct mw__device *dev, struct CUstream_st *stream,
                               float *const *bufs, int nbufs, size_t lo, size_t hi) {
    (void)dev, (void)stream, (void)bufs, (void)nbufs, (void)lo, (void)hi;
    return MW_OK;
}

static mw_status sum_slices(struct mw__device *dev, float *const *bufs, int nbufs, size_t lo,
                            size_t hi) {
    return sum_slices_on(dev, NULL, bufs, nbufs, lo, hi);
}

const mw__cuda_api mw__cuda_services = {.device = &fake_cuda_device,
                                        .stream = compute_stream,
                                        .gpu_identity = gpu_identity,
                                        .find_shared_gpu = mw__find_shared_gpu,
                                        .sum_slices = sum_slices,
                                        .sum_slices_on = sum_slices_on};
