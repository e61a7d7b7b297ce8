/* NCCL between processes: CUDA devices of several processes (one GPU per rank), as llm.c sets
 * them up. The process holding rank 0 calls ncclGetUniqueId and broadcasts the id over MPI; every
 * process then creates one NCCL communicator per local device with ncclCommInitRankConfig (its
 * rank in the group), in one NCCL group call. Collectives run as in the in-process NCCL reducer
 * (collectives/nccl/reducer_nccl.c): non-blocking communicators, ncclAllReduce in place on a
 * communication stream of the device's own that waits (an event) for the kernels queued so far
 * on its compute stream, so a gradient bucket is summed while backward goes on
 * (allreduce_start); finish polls the communication stream until every sum started
 * ran (abort and timeout honoured; a short spin, then naps) and orders the compute stream after
 * them.
 *
 * Barriers and the id broadcast use a hierarchical host communicator (collectives/mpi/
 * reducer_mpi.c), made alongside. Summation order is NCCL's (ring or tree): the same bits on
 * every rank and run for fixed GPUs, sizes and NCCL settings, equal to the rank-order sum to float
 * rounding. After an abort with an operation in flight, or a failure between the start of an
 * operation and its finish (the in-process reducer re-creates its communicators then), the
 * communicators cannot be re-created without every process taking part, so the communicator
 * stays broken (MW_ERR_STATE): end the job with mw_distributed_abort. reset() then aborts this
 * process's NCCL communicators (ncclCommAbort), which stops their kernels still waiting for a
 * peer, so the device streams drain and the trainer can be read and freed instead of hanging in
 * a stream wait; no later collective can step out of order with the peers. The communication
 * streams, events and counts of started operations are made with the communicator, on the
 * calling thread; each worker thread then touches only its own rank's.
 *
 * Reduce-scatter, all-gather and broadcast are queued and awaited like the all-reduce, with the
 * in-process reducer's design (collectives/nccl/collectives.c): a reduce-scatter all-reduces the
 * whole buffer, so its part holds the all-reduce's bits.
 *
 * NCCL needs one GPU per rank. Before creating communicators every process tells the others the
 * GPUs of its ranks (host, PCI bus id and UUID, over MPI): two ranks on one GPU, in one process
 * (cuda:0x2 under mpirun) or in two (both naming cuda:0), are refused with a message naming them,
 * instead of failing inside NCCL's initialisation. The host is the host name or, where it is set,
 * NCCL_HOSTID, which NCCL takes as the host's identity: processes that set different ones are two
 * hosts to NCCL as to this check, also on one GPU (NCCL then connects them through its network
 * transport; scripts/gpu-check.sh runs the module so on one GPU). Builds with MESHWIT_HAVE_NCCL and
 * MESHWIT_HAVE_MPI only. */
#if defined(MESHWIT_HAVE_NCCL) && defined(MESHWIT_HAVE_MPI)

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "collectives/mpi/mpi_impl.h"
#include "collectives/nccl/collectives.h"
#include "collectives/p2p_meet.h"
#include "collectives/reducer_select.h"
#include "core/alloc.h"
#include "core/error.h"
#include "devices/device.h"
#include "devices/module_abi.h"
#include "meshwit/distributed.h"
#include "meshwit/mesh.h"

#define INIT_TIMEOUT_MIN_MS 120000

typedef struct nccl_mpi_comm {
    int nranks;
    int *local_of; /* group rank -> index among this process's ranks, or -1 */
    int nlocal;
    mw__device **devs;     /* by local index */
    ncclComm_t *comms;     /* by local index */
    cudaStream_t *streams; /* by local index: where the sums run, beside the compute stream */
    cudaEvent_t *events;   /* by local index: orders the two streams */
    int *started;          /* by local index: sums started and not finished */
    mw__comm *host;        /* hierarchical host communicator: barriers */
    int timeout_ms;
    _Atomic int aborted;
    _Atomic int broken; /* an operation was left in flight */
} nccl_mpi_comm;

static mw_status nccl_error(const char *who, const char *call, ncclResult_t res) {
    return mw__error(MW_ERR_DEVICE, "%s: %s failed: %s", who, call, ncclGetErrorString(res));
}

static void destroy_comms(nccl_mpi_comm *c) {
    for (int i = 0; c->comms && i < c->nlocal; i++)
        if (c->comms[i]) {
            ncclCommAbort(c->comms[i]); /* never waits for a peer, unlike ncclCommDestroy */
            c->comms[i] = NULL;
        }
}

static void nm_comm_free(mw__comm *comm) {
    nccl_mpi_comm *c = (nccl_mpi_comm *)comm;
    if (!c) return;
    destroy_comms(c);
    for (int i = 0; i < c->nlocal; i++) {
        if (c->devs && c->devs[i]) (void)cudaSetDevice(c->devs[i]->ordinal);
        if (c->streams && c->streams[i]) (void)cudaStreamDestroy(c->streams[i]);
        if (c->events && c->events[i]) (void)cudaEventDestroy(c->events[i]);
    }
    (void)cudaGetLastError();
    mw__free(c->streams);
    mw__free(c->events);
    mw__free(c->started);
    mw__reducer_mpi_hier.comm_free(c->host);
    mw__free(c->comms);
    mw__free(c->devs);
    mw__free(c->local_of);
    mw__free(c);
}

/* Broadcasts the unique id from the process holding rank 0 to every process of the group. A
 * sub-communicator of the world, ordered by world rank, made only for this. */
static mw_status share_id(const int *proc_of, int nranks, int self, ncclUniqueId *id) {
    int nlocal = 0;
    for (int r = 0; r < nranks; r++) nlocal += proc_of[r] == self;
    MPI_Comm comm;
    mw__mpi_lock();
    int rc = MPI_Comm_split(MPI_COMM_WORLD, nlocal ? 0 : MPI_UNDEFINED, self, &comm);
    mw__mpi_unlock();
    if (rc != MPI_SUCCESS)
        return mw__error(MW_ERR_DEVICE, "nccl-mpi: MPI_Comm_split failed (%d)", rc);
    if (!nlocal) return MW_OK;
    /* The root's position in comm: processes of the group with a lower world rank. */
    int root = 0;
    for (int r = 0; r < nranks; r++) {
        int first = 1;
        for (int q = 0; q < r; q++) first &= proc_of[q] != proc_of[r];
        if (first && proc_of[r] < proc_of[0]) root++;
    }
    ncclResult_t res = ncclSuccess;
    if (self == proc_of[0]) res = ncclGetUniqueId(id);
    /* Broadcast even after a failure, so that no process waits forever; the root reports it. */
    mw__mpi_lock();
    rc = MPI_Bcast(id, (int)sizeof *id, MPI_BYTE, root, comm);
    MPI_Comm_free(&comm);
    mw__mpi_unlock();
    if (res != ncclSuccess) return nccl_error("nccl-mpi", "ncclGetUniqueId", res);
    if (rc != MPI_SUCCESS)
        return mw__error(MW_ERR_DEVICE, "nccl-mpi: MPI_Bcast of the NCCL id failed (%d)", rc);
    return MW_OK;
}

/* Refuses two ranks of the group on one GPU. Every process calls it for every communicator (an
 * all-gather over the world: each fills the identities of its own ranks). */
static mw_status check_distinct_gpus(int nranks, struct mw__device *const *devices,
                                     const mw__comm_options *opt) {
    int nprocs = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    size_t row = (size_t)nranks * MW__GPU_ID_SIZE;
    char(*mine)[MW__GPU_ID_SIZE] = mw__calloc((size_t)nranks, MW__GPU_ID_SIZE);
    char(*all)[MW__GPU_ID_SIZE] = mw__calloc((size_t)nprocs * (size_t)nranks, MW__GPU_ID_SIZE);
    char(*ids)[MW__GPU_ID_SIZE] = mw__calloc((size_t)nranks, MW__GPU_ID_SIZE);
    mw_status st = MW_OK;
    if (!mine || !all || !ids) st = mw__error(MW_ERR_NOMEM, "nccl-mpi comm_new: out of memory");
    for (int r = 0; r < nranks && !st; r++)
        if (opt->proc_of[r] == opt->self_proc && devices[r] &&
            (st = mw__cuda_services.gpu_identity(devices[r]->ordinal, mine[r])))
            mine[r][0] = '!'; /* tells the other processes to fail as well */
    /* Gathered even after a local failure, so that no process waits forever. */
    int rc = MPI_SUCCESS;
    if (mine && all) {
        mw__mpi_lock();
        rc = MPI_Allgather(mine, (int)row, MPI_CHAR, all, (int)row, MPI_CHAR, MPI_COMM_WORLD);
        mw__mpi_unlock();
    }
    if (!st && rc != MPI_SUCCESS)
        st = mw__error(MW_ERR_DEVICE, "nccl-mpi: MPI_Allgather of the GPU identities failed (%d)",
                       rc);
    int a, b;
    if (!st) {
        for (int r = 0; r < nranks; r++) {
            memcpy(ids[r], all[(size_t)opt->proc_of[r] * (size_t)nranks + (size_t)r],
                   MW__GPU_ID_SIZE);
            if (ids[r][0] == '!' && !st)
                st = mw__error(MW_ERR_DEVICE,
                               "nccl-mpi comm_new: process %d could not identify the GPU of rank "
                               "%d",
                               opt->proc_of[r], r);
        }
        if (!st &&
            mw__cuda_services.find_shared_gpu((const char(*)[MW__GPU_ID_SIZE])ids, nranks, &a, &b))
            st = mw__error(MW_ERR_INVALID,
                           "nccl-mpi comm_new: ranks %d (process %d) and %d (process %d) are on "
                           "the same GPU (%s); NCCL needs one GPU per rank: give every process "
                           "its own GPU (e.g. cuda:<local rank>), or run devices that share a GPU "
                           "in one process (cuda:0x2, without mpirun), or set a different "
                           "NCCL_HOSTID in each process (NCCL then treats them as two hosts)",
                           a, opt->proc_of[a], b, opt->proc_of[b], ids[a]);
    }
    mw__free(mine);
    mw__free(all);
    mw__free(ids);
    return st;
}

/* Every local rank's communication stream and event, made here on the host thread with the
 * communicator: made on first use, by whichever worker thread came first, two threads could
 * each allocate the arrays and one replace the other's (NCCL then queues on the legacy stream,
 * or finish misses a started sum). */
static mw_status make_streams(nccl_mpi_comm *c) {
    for (int i = 0; i < c->nlocal; i++) {
        cudaError_t e = cudaSetDevice(c->devs[i]->ordinal);
        if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->streams[i], cudaStreamNonBlocking);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->events[i], cudaEventDisableTiming);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return mw__error(e == cudaErrorMemoryAllocation ? MW_ERR_NOMEM : MW_ERR_DEVICE,
                             "%s: making the communication stream and event failed: %s",
                             c->devs[i]->name, cudaGetErrorString(e));
        }
    }
    return MW_OK;
}

static mw_status make_comms(nccl_mpi_comm *c, const ncclUniqueId *id) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    mw_status st = MW_OK;
    ncclResult_t res = ncclGroupStart();
    if (res != ncclSuccess) return nccl_error("nccl-mpi", "ncclGroupStart", res);
    for (int r = 0; r < c->nranks && !st; r++) {
        int i = c->local_of[r];
        if (i < 0) continue;
        cudaError_t e = cudaSetDevice(c->devs[i]->ordinal);
        if (e != cudaSuccess) {
            st = mw__error(MW_ERR_DEVICE, "%s: cudaSetDevice failed: %s", c->devs[i]->name,
                           cudaGetErrorString(e));
            break;
        }
        res = ncclCommInitRankConfig(&c->comms[i], c->nranks, *id, r, &cfg);
        if (res != ncclSuccess && res != ncclInProgress)
            st = nccl_error(c->devs[i]->name, "ncclCommInitRankConfig", res);
    }
    res = ncclGroupEnd();
    if (!st && res != ncclSuccess && res != ncclInProgress)
        st = nccl_error("nccl-mpi", "ncclGroupEnd", res);
    double deadline = mw__mpi_now_ms() + INIT_TIMEOUT_MIN_MS + c->timeout_ms;
    for (int i = 0; i < c->nlocal && !st; i++) {
        ncclResult_t state = ncclInProgress;
        while (!st && state == ncclInProgress) {
            res = ncclCommGetAsyncError(c->comms[i], &state);
            if (res != ncclSuccess)
                st = nccl_error(c->devs[i]->name, "ncclCommGetAsyncError", res);
            else if (state != ncclSuccess && state != ncclInProgress)
                st = nccl_error(c->devs[i]->name, "ncclCommInitRankConfig", state);
            else if (state == ncclInProgress && mw__mpi_now_ms() > deadline)
                st = mw__error(MW_ERR_TIMEOUT,
                               "%s: creating the NCCL communicator across processes took over "
                               "%d ms",
                               c->devs[i]->name, INIT_TIMEOUT_MIN_MS + c->timeout_ms);
            else if (state == ncclInProgress)
                sched_yield();
        }
    }
    if (st) destroy_comms(c);
    return st;
}

static mw_status nm_comm_new(int nranks, struct mw__device *const *devices,
                             const mw__comm_options *opt, mw__comm **out) {
    if (!out) return mw__error(MW_ERR_INVALID, "nccl-mpi comm_new: out is NULL");
    *out = NULL;
    if (!opt || !opt->proc_of || !devices || nranks < 1 || nranks > MW_MAX_DEVICES)
        return mw__error(MW_ERR_INVALID, "nccl-mpi comm_new: %d ranks without their processes",
                         nranks);
    /* The host communicator first: it makes its MPI communicator on every process. */
    mw__comm *host = NULL;
    mw_status st = mw__reducer_mpi_hier.comm_new(nranks, devices, opt, &host);
    if (st) return st;
    if ((st = check_distinct_gpus(nranks, devices, opt))) {
        char msg[MW__MSG_SIZE];
        snprintf(msg, sizeof msg, "%s", mw_last_error());
        mw__reducer_mpi_hier.comm_free(host);
        return mw__error_copy(st, msg);
    }
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    int multi = 0;
    for (int r = 0; r < nranks; r++) multi |= opt->proc_of[r] != opt->proc_of[0];
    if (multi)
        st = share_id(opt->proc_of, nranks, opt->self_proc, &id);
    else if (opt->proc_of[0] == opt->self_proc) {
        ncclResult_t res = ncclGetUniqueId(&id);
        if (res != ncclSuccess) st = nccl_error("nccl-mpi", "ncclGetUniqueId", res);
    }
    if (st || !host) { /* an error, or no rank in this process */
        mw__reducer_mpi_hier.comm_free(host);
        return st;
    }
    nccl_mpi_comm *c = mw__calloc(1, sizeof *c);
    if (!c) {
        mw__reducer_mpi_hier.comm_free(host);
        return mw__error(MW_ERR_NOMEM, "nccl-mpi comm_new: out of memory");
    }
    c->host = host;
    c->nranks = nranks;
    int user_timeout = opt->timeout_ms;
    c->timeout_ms = user_timeout ? user_timeout : MW_DISTRIBUTED_DEFAULT_TIMEOUT_MS;
    c->local_of = mw__malloc((size_t)nranks * sizeof *c->local_of);
    c->devs = mw__calloc((size_t)nranks, sizeof *c->devs);
    c->comms = mw__calloc((size_t)nranks, sizeof *c->comms);
    c->streams = mw__calloc((size_t)nranks, sizeof *c->streams);
    c->events = mw__calloc((size_t)nranks, sizeof *c->events);
    c->started = mw__calloc((size_t)nranks, sizeof *c->started);
    if (!c->local_of || !c->devs || !c->comms || !c->streams || !c->events || !c->started) {
        nm_comm_free((mw__comm *)c);
        return mw__error(MW_ERR_NOMEM, "nccl-mpi comm_new: out of memory");
    }
    for (int r = 0; r < nranks; r++) {
        c->local_of[r] = opt->proc_of[r] == opt->self_proc ? c->nlocal++ : -1;
        if (c->local_of[r] >= 0) {
            if (!devices[r] || devices[r]->vt != mw__cuda_services.device) {
                nm_comm_free((mw__comm *)c);
                return mw__error(MW_ERR_INVALID, "nccl-mpi comm_new: rank %d is not a CUDA device",
                                 r);
            }
            c->devs[c->local_of[r]] = devices[r];
        }
    }
    if ((st = make_streams(c)) || (st = make_comms(c, &id))) {
        char msg[MW__MSG_SIZE];
        snprintf(msg, sizeof msg, "%s", mw_last_error());
        nm_comm_free((mw__comm *)c);
        return mw__error_copy(st, msg);
    }
    *out = (mw__comm *)c;
    return MW_OK;
}

/* Checks the call and binds the rank's device; its local index in *li. */
static mw_status enter(nccl_mpi_comm *c, int rank, int *li) {
    if (!c || rank < 0 || rank >= c->nranks || c->local_of[rank] < 0)
        return mw__error(MW_ERR_INVALID, "all-reduce (nccl-mpi): rank %d is not of this process",
                         rank);
    if (atomic_load(&c->broken))
        return mw__error(MW_ERR_STATE, "all-reduce (nccl-mpi): an earlier collective between "
                                       "processes was abandoned; end the job");
    if (atomic_load(&c->aborted))
        return mw__error(MW_ERR_ABORTED, "all-reduce (nccl-mpi): the communicator was aborted");
    int i = *li = c->local_of[rank];
    cudaError_t e = cudaSetDevice(c->devs[i]->ordinal);
    if (e != cudaSuccess)
        return mw__error(MW_ERR_DEVICE, "%s: cudaSetDevice failed: %s", c->devs[i]->name,
                         cudaGetErrorString(e));
    return MW_OK;
}

/* Polls local rank i's communicator (and, with `complete`, its communication stream) until the
 * operations are enqueued (complete 0) or have run (complete 1). Spins briefly, then naps, so a
 * waiting process does not take the core a peer process needs. */
static mw_status poll_comm(nccl_mpi_comm *c, int i, int complete, double deadline,
                           const char *call) {
    mw__device *dev = c->devs[i];
    for (unsigned spins = 1;; spins++) {
        ncclResult_t state;
        ncclResult_t res = ncclCommGetAsyncError(c->comms[i], &state);
        if (res != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
            atomic_store(&c->broken, 1);
            return nccl_error(dev->name, call, res != ncclSuccess ? res : state);
        }
        if (state == ncclSuccess) {
            if (!complete) return MW_OK;
            cudaError_t e = cudaStreamQuery(c->streams[i]);
            if (e == cudaSuccess) return MW_OK;
            if (e != cudaErrorNotReady) {
                atomic_store(&c->broken, 1);
                return mw__error(MW_ERR_DEVICE, "%s: waiting for %s: %s", dev->name, call,
                                 cudaGetErrorString(e));
            }
        }
        if (atomic_load_explicit(&c->aborted, memory_order_acquire)) {
            atomic_store(&c->broken, 1);
            return mw__error(MW_ERR_ABORTED,
                             "all-reduce (nccl-mpi) aborted: %s was waiting for its peers",
                             dev->name);
        }
        if (spins % 64 == 0 && mw__mpi_now_ms() > deadline) {
            atomic_store(&c->broken, 1);
            return mw__error(MW_ERR_TIMEOUT,
                             "all-reduce (nccl-mpi): %s waited more than %d ms for its peers in "
                             "other processes (one of them failed or stalls; end the job with "
                             "mw_distributed_abort)",
                             dev->name, c->timeout_ms);
        }
        if (spins > 256) {
            struct timespec nap = {0, 20000};
            nanosleep(&nap, NULL);
        }
    }
}

static void nm_abort(mw__comm *comm);

/* Checks the call (a bad argument aborts: the peers would wait) and queues op on local rank i's
 * communication stream after the work queued on its compute stream. */
static mw_status start_op(nccl_mpi_comm *c, int rank, mw__nccl_op op, float *buf, size_t n,
                          const size_t *bounds, int with_parts, int root) {
    int i;
    mw_status st = enter(c, rank, &i);
    if (st) return st;
    /* From here a failure leaves the peers (in other processes too) inside a collective this
     * rank never joins: the communicators are out of step with theirs, so broken. */
    const char *bad = mw__nccl_bad_args(op, buf, n, bounds, c->nranks, with_parts, root);
    if (bad) {
        atomic_store(&c->broken, 1);
        nm_abort((mw__comm *)c);
        return mw__error(MW_ERR_INVALID, "%s (nccl-mpi): rank %d passed %s (%zu floats)",
                         mw__nccl_call(op), rank, bad, n);
    }
    if (n == 0) return MW_OK;
    mw__device *dev = c->devs[i];
    cudaStream_t compute = (cudaStream_t)mw__cuda_services.stream(dev);
    cudaError_t e = cudaEventRecord(c->events[i], compute);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(c->streams[i], c->events[i], 0);
    if (e != cudaSuccess) {
        atomic_store(&c->broken, 1);
        return mw__error(MW_ERR_DEVICE, "%s: ordering the collective after the compute: %s",
                         dev->name, cudaGetErrorString(e));
    }
    c->started[i]++;
    ncclResult_t res =
        mw__nccl_enqueue(c->comms[i], c->streams[i], op, buf, n, bounds, c->nranks, root);
    if (res != ncclSuccess && res != ncclInProgress) {
        atomic_store(&c->broken, 1);
        return nccl_error(dev->name, mw__nccl_call(op), res);
    }
    return res == ncclInProgress
               ? poll_comm(c, i, 0, mw__mpi_now_ms() + c->timeout_ms, mw__nccl_call(op))
               : MW_OK;
}

static mw_status nm_allreduce_start_f32(mw__comm *comm, int rank, float *buf, size_t n) {
    return start_op((nccl_mpi_comm *)comm, rank, MW__NCCL_ALLREDUCE, buf, n, NULL, 0, 0);
}

static mw_status nm_allreduce_finish(mw__comm *comm, int rank) {
    nccl_mpi_comm *c = (nccl_mpi_comm *)comm;
    int i;
    mw_status st = enter(c, rank, &i);
    if (st || !c->started[i]) return st;
    if ((st = poll_comm(c, i, 1, mw__mpi_now_ms() + c->timeout_ms, "the NCCL collectives")))
        return st;
    c->started[i] = 0;
    cudaError_t e = cudaEventRecord(c->events[i], c->streams[i]);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent((cudaStream_t)mw__cuda_services.stream(c->devs[i]), c->events[i],
                                0);
    if (e != cudaSuccess)
        return mw__error(MW_ERR_DEVICE, "%s: ordering the compute after the sum: %s",
                         c->devs[i]->name, cudaGetErrorString(e));
    return MW_OK;
}

static mw_status nm_allreduce_sum_f32(mw__comm *comm, int rank, float *buf, size_t n) {
    mw_status st = nm_allreduce_start_f32(comm, rank, buf, n);
    return st ? st : nm_allreduce_finish(comm, rank);
}

/* The whole buffer is all-reduced, as in the in-process NCCL reducer: only an all-reduce of the
 * same buffer gives the all-reduce's bits on the part. */
static mw_status nm_reduce_scatter_sum_f32(mw__comm *comm, int rank, float *buf, size_t n,
                                           const size_t *bounds) {
    mw_status st = start_op((nccl_mpi_comm *)comm, rank, MW__NCCL_ALLREDUCE, buf, n, bounds, 1, 0);
    return st ? st : nm_allreduce_finish(comm, rank);
}

static mw_status nm_all_gather_f32(mw__comm *comm, int rank, float *buf, size_t n,
                                   const size_t *bounds) {
    mw_status st = start_op((nccl_mpi_comm *)comm, rank, MW__NCCL_ALL_GATHER, buf, n, bounds, 1, 0);
    return st ? st : nm_allreduce_finish(comm, rank);
}

/* Queued like an overlapped sum; finish completes it with them (FSDP's prefetch). */
static mw_status nm_all_gather_start(mw__comm *comm, int rank, void *buf, size_t n, mw_dtype dtype,
                                     const size_t *bounds) {
    mw_status st = mw__reducer_dtype("nccl-mpi", "all-gather", dtype);
    return st ? st
              : start_op((nccl_mpi_comm *)comm, rank, MW__NCCL_ALL_GATHER, buf, n, bounds, 1, 0);
}

static mw_status nm_broadcast_f32(mw__comm *comm, int rank, float *buf, size_t n, int root) {
    mw_status st = start_op((nccl_mpi_comm *)comm, rank, MW__NCCL_BROADCAST, buf, n, NULL, 0, root);
    return st ? st : nm_allreduce_finish(comm, rank);
}

static mw_status nm_barrier(mw__comm *comm, int rank) {
    nccl_mpi_comm *c = (nccl_mpi_comm *)comm;
    if (!c) return mw__error(MW_ERR_INVALID, "barrier (nccl-mpi): communicator is NULL");
    return mw__reducer_mpi_hier.barrier(c->host, rank);
}

static void nm_abort(mw__comm *comm) {
    nccl_mpi_comm *c = (nccl_mpi_comm *)comm;
    if (!c) return;
    atomic_store(&c->aborted, 1);
    mw__reducer_mpi_hier.abort(c->host);
}

static void nm_reset(mw__comm *comm) {
    nccl_mpi_comm *c = (nccl_mpi_comm *)comm;
    if (!c) return;
    /* A collective left in flight (abandoned on abort or timeout, failed, or started and never
     * finished: a rank that failed between its bucket sums and finish) still waits on the GPU
     * for its peers, or has put this process's communicators out of step with theirs: abort the
     * communicators (no rank is inside an NCCL call now), so the streams drain. Re-creating
     * them would need every process to take part, so they stay broken. */
    int started = 0;
    for (int i = 0; i < c->nlocal; i++) started |= c->started[i] != 0;
    if (started) atomic_store(&c->broken, 1);
    if (atomic_load(&c->broken)) destroy_comms(c);
    for (int i = 0; i < c->nlocal; i++) c->started[i] = 0;
    mw__reducer_mpi_hier.reset(c->host);
    atomic_store(&c->aborted, 0);
}

/* ---- point-to-point ---- */

/* A send, recv or sendrecv (send_peer or recv_peer -1: that half absent), as in the in-process
 * NCCL reducer: the ranks meet on the host communicator (the hierarchical reducer's send, recv
 * and sendrecv, across processes too; collectives/p2p_meet.h), which checks that both sides'
 * calls agree; each half that agrees is queued as ncclSend and ncclRecv in one group on the
 * rank's communication stream after its compute, and awaited as the collectives are. After a
 * failure between the meeting and the end of the transfer the communicators are broken, as
 * after a collective given up. */
static mw_status nm_p2p(mw__comm *comm, const char *what, int rank, int send_peer,
                        const void *sendbuf, int recv_peer, void *recvbuf, size_t n,
                        mw_dtype dtype) {
    nccl_mpi_comm *c = (nccl_mpi_comm *)comm;
    int i;
    mw_status st = enter(c, rank, &i);
    if (st) return st;
    size_t es = mw__p2p_esize(dtype);
    const char *bad =
        es ? mw__p2p_bad_args(c->nranks, rank, send_peer, sendbuf, recv_peer, recvbuf, n, dtype)
           : NULL;
    if (bad || !es) {
        nm_abort(comm); /* the peer would wait for this rank */
        if (!bad)
            return mw__error(MW_ERR_UNSUPPORTED,
                             "%s (nccl-mpi): elements of dtype %d (f32 and bf16 only)", what,
                             (int)dtype);
        return mw__error(MW_ERR_INVALID, "%s (nccl-mpi): rank %d passed %s", what, rank, bad);
    }
    if ((st = nm_allreduce_finish(comm, rank))) return st; /* its collectives come first */
    mw__p2p_call mine = {n, dtype, 0, NULL, NULL}, sender = {0}, receiver = {0};
    if ((st = mw__p2p_meet(&mw__reducer_mpi_hier, c->host, what, rank, 1, send_peer, &mine,
                           recv_peer, &sender)))
        return st;
    mw_status got = recv_peer >= 0 ? mw__p2p_check(what, recv_peer, &sender, rank, &mine) : MW_OK;
    char msg[MW__MSG_SIZE];
    if (got) snprintf(msg, sizeof msg, "%s", mw_last_error());
    if ((st = mw__p2p_meet(&mw__reducer_mpi_hier, c->host, what, rank, 2, recv_peer, &mine,
                           send_peer, &receiver)))
        return st;
    mw_status sent =
        send_peer >= 0 ? mw__p2p_check(what, rank, &mine, send_peer, &receiver) : MW_OK;
    if (!got && sent) snprintf(msg, sizeof msg, "%s", mw_last_error());
    if (sent) send_peer = -1;
    if (got) recv_peer = -1;
    if (n > 0 && (send_peer >= 0 || recv_peer >= 0)) {
        mw__device *dev = c->devs[i];
        cudaError_t e = cudaEventRecord(c->events[i], (cudaStream_t)mw__cuda_services.stream(dev));
        if (e == cudaSuccess) e = cudaStreamWaitEvent(c->streams[i], c->events[i], 0);
        if (e != cudaSuccess) {
            atomic_store(&c->broken, 1);
            return mw__error(MW_ERR_DEVICE, "%s: ordering the transfer after the compute: %s",
                             dev->name, cudaGetErrorString(e));
        }
        c->started[i]++;
        ncclResult_t res = mw__nccl_p2p(c->comms[i], c->streams[i], send_peer, sendbuf, recv_peer,
                                        recvbuf, n * es);
        if (res != ncclSuccess && res != ncclInProgress) {
            atomic_store(&c->broken, 1);
            return nccl_error(dev->name, "ncclSend/ncclRecv", res);
        }
        if (res == ncclInProgress &&
            (st = poll_comm(c, i, 0, mw__mpi_now_ms() + c->timeout_ms, "ncclSend/ncclRecv")))
            return st;
        if ((st = nm_allreduce_finish(comm, rank))) return st;
    }
    return got || sent ? mw__error_copy(got ? got : sent, msg) : MW_OK;
}

static mw_status nm_send(mw__comm *comm, int rank, int peer, const void *buf, size_t n,
                         mw_dtype dtype) {
    int p = comm ? ((nccl_mpi_comm *)comm)->nranks : 0;
    return nm_p2p(comm, "send", rank, peer < 0 ? p : peer, buf, -1, NULL, n, dtype);
}

static mw_status nm_recv(mw__comm *comm, int rank, int peer, void *buf, size_t n, mw_dtype dtype) {
    int p = comm ? ((nccl_mpi_comm *)comm)->nranks : 0;
    return nm_p2p(comm, "recv", rank, -1, NULL, peer < 0 ? p : peer, buf, n, dtype);
}

static mw_status nm_sendrecv(mw__comm *comm, int rank, int send_peer, const void *sendbuf,
                             int recv_peer, void *recvbuf, size_t n, mw_dtype dtype) {
    int p = comm ? ((nccl_mpi_comm *)comm)->nranks : 0;
    return nm_p2p(comm, "sendrecv", rank, send_peer < 0 ? p : send_peer, sendbuf,
                  recv_peer < 0 ? p : recv_peer, recvbuf, n, dtype);
}

/* The typed entry points: f32 only. */
MW__REDUCER_F32_ONLY(nm, "nccl-mpi")

const mw__reducer_vtable mw__reducer_nccl_mpi = {
    .name = "nccl-mpi",
    .comm_new = nm_comm_new,
    .comm_free = nm_comm_free,
    .allreduce_sum = nm_allreduce_sum,
    .barrier = nm_barrier,
    .allreduce_start = nm_allreduce_start,
    .finish = nm_allreduce_finish,
    .abort = nm_abort,
    .reset = nm_reset,
    .reduce_scatter_sum = nm_reduce_scatter_sum,
    .all_gather = nm_all_gather,
    .broadcast = nm_broadcast,
    .all_gather_start = nm_all_gather_start,
    .send = nm_send,
    .recv = nm_recv,
    .sendrecv = nm_sendrecv,
};

#else
/* ISO C forbids an empty translation unit. */
typedef int mw__nccl_mpi_unused;
#endif
