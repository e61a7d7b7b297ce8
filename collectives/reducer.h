/* Internal: the reducer interface. A reducer implements collectives among the ranks of a
 * communicator; the trainer makes one communicator per group of devices that reduce together
 * (for a one-axis mesh, one communicator over all devices) and each device's worker thread calls
 * the collectives with its own rank.
 *
 * Contract for every implementation:
 * - Every rank of a communicator calls the same collectives in the same order with the same n
 *   (point-to-point calls, send, recv and sendrecv below, concern only their two ranks).
 * - allreduce_sum is in place and deterministic: the result is the sum over ranks in rank order
 *   (rank 0 + rank 1 + ... for each element), the same bits on every rank and on every run.
 * - Buffers hold n elements of a dtype: every reducer takes MW_F32 (the gradients, the
 *   parameters); one that also takes MW_BF16 sums the widened values in f32, in rank order, and
 *   rounds each sum once (the shared-memory reducer); the others refuse it with
 *   MW_ERR_UNSUPPORTED before any rank waits (mw__reducer_dtype).
 * - A rank that fails calls abort(): every rank blocked in (or later entering) a collective on
 *   that communicator returns MW_ERR_ABORTED promptly, with a message. reset() (called by the
 *   host when no rank is inside a collective) makes the communicator usable again.
 * - With a timeout set, a rank waiting longer than timeout_ms for its peers returns
 *   MW_ERR_TIMEOUT and aborts the communicator.
 * - No allocation inside a collective or a point-to-point call. */
#ifndef MW__REDUCER_H
#define MW__REDUCER_H

#include <stddef.h>

#include "core/error.h"
#include "meshwit/graph.h"
#include "meshwit/status.h"

typedef struct mw__comm mw__comm;
struct mw__device;

typedef struct mw__comm_options {
    int timeout_ms; /* 0: wait forever */
    /* Reducers between processes only: the MPI world rank of each rank's process (nranks
     * entries), and this process's. devices[r] is NULL for a rank of another process. Every
     * process calls comm_new for every communicator in the same order, also one with no rank of
     * its own (it then gets *out == NULL). NULL: every rank is in this process. */
    const int *proc_of;
    int self_proc;
    /* Shared-memory reducer: an event notified, besides the communicator's own, after every
     * arrival and abort, so that a thread running several ranks as a gang (collectives/fiber.h)
     * can sleep until any of its communicators moves. NULL: none. */
    struct mw__event *wake;
    /* Shared-memory reducer: the number each rank goes by in the messages of point-to-point
     * calls (nranks entries, copied), for a communicator of some ranks of a larger group (the
     * hierarchical reducer's ranks of one process). NULL: its rank. */
    const int *names;
} mw__comm_options;

typedef struct mw__reducer_vtable {
    const char *name;
    /* Makes a communicator of nranks ranks; devices[r] is rank r's device (a reducer that works
     * on device memory binds to them; the shared-memory reducer ignores them). */
    mw_status (*comm_new)(int nranks, struct mw__device *const *devices,
                          const mw__comm_options *opt, mw__comm **out);
    void (*comm_free)(mw__comm *comm);
    /* In-place sum of buf[0..n) over all ranks. */
    mw_status (*allreduce_sum)(mw__comm *comm, int rank, void *buf, size_t n, mw_dtype dtype);
    /* All ranks wait for each other. */
    mw_status (*barrier)(mw__comm *comm, int rank);
    /* Optional (NULL in a reducer without them): allreduce_sum split in two, so that a rank can
     * keep computing while its buffer is reduced (the gradient buckets). allreduce_start begins
     * the in-place sum of buf[0..n) and returns without waiting (buf must not be read or
     * written until finish returned); on a reducer of device memory the sum is queued
     * after the work queued so far on the rank's device, and the device may run later work
     * meanwhile. progress (optional even then: NULL when the sums advance by themselves)
     * advances what this rank started without waiting; call it between other work.
     * finish returns when every sum this rank started is complete (on a device, with
     * the device's later work ordered after them). Ranks start the same all-reduces in the same
     * order; results are those of allreduce_sum, errors likewise. allreduce_sum and barrier may
     * be called with some in flight: they complete those first. */
    mw_status (*allreduce_start)(mw__comm *comm, int rank, void *buf, size_t n, mw_dtype dtype);
    mw_status (*progress)(mw__comm *comm, int rank);
    mw_status (*finish)(mw__comm *comm, int rank);
    void (*abort)(mw__comm *comm);
    void (*reset)(mw__comm *comm);
    /* Reduce-scatter, all-gather and broadcast. Every reducer of meshwit implements them; a NULL
     * slot (a reducer without them) makes ZeRO-1 refuse the communicator. bounds holds
     * nranks + 1 non-decreasing offsets into buf[0..n) that every rank passes alike; rank r's
     * part is buf[bounds[r] .. bounds[r + 1]) (parts may be empty and need not cover buf).
     * Like allreduce_sum they complete the all-reduces a rank has in flight first, give up on
     * abort and timeout alike, and are deterministic.
     * reduce_scatter_sum: in place, rank r's part of its own buf becomes the sum over all ranks'
     * buffers, the same bits allreduce_sum gives there (whatever the parts). Everything else in
     * every rank's buf is unspecified afterwards: a reducer may leave partial or complete sums
     * there (the shared-memory reducer, and the MPI one with one device per process, leave it as
     * it was; NCCL and cuda-local sum more than the part).
     * all_gather: every rank's buf becomes, part by part, the owner's part (rank q's part comes
     * from rank q's buf); outside the parts buf is left as it was.
     * broadcast: every rank's buf[0..n) becomes root's (0 <= root < nranks, alike on every
     * rank). */
    mw_status (*reduce_scatter_sum)(mw__comm *comm, int rank, void *buf, size_t n, mw_dtype dtype,
                                    const size_t *bounds);
    mw_status (*all_gather)(mw__comm *comm, int rank, void *buf, size_t n, mw_dtype dtype,
                            const size_t *bounds);
    mw_status (*broadcast)(mw__comm *comm, int rank, void *buf, size_t n, mw_dtype dtype, int root);
    /* Optional (NULL in a reducer without it): all_gather split in two, so that a rank can keep
     * computing while a parameter is gathered (FSDP's prefetch). all_gather_start begins it and
     * returns without waiting for the peers (on a reducer of device memory it is queued after
     * the work queued so far on the rank's device, as allreduce_start's sum); buf and bounds must
     * stay valid and buf unread and unwritten until finish returned, which completes it with
     * everything else this rank started. progress, where the reducer has it, advances it too. At
     * most one all-gather is in flight per rank and communicator; any other collective on the
     * communicator completes it first. Results and errors are those of all_gather. */
    mw_status (*all_gather_start)(mw__comm *comm, int rank, void *buf, size_t n, mw_dtype dtype,
                                  const size_t *bounds);
    /* Point-to-point between two ranks (a pipeline's stage boundaries). Every reducer of meshwit
     * implements them; NULL in a reducer without them. Unlike a collective, only the two ranks
     * named take part: the others may do anything meanwhile, also other point-to-point calls.
     * send: buf[0..n) of `rank` goes to rank `peer`, into the buffer of its recv with
     * peer == rank; both return once the data is there (on a reducer of device memory: once it
     * is ordered there, below). Matching: the k-th send from r to q is received by q's k-th recv
     * from r, per ordered pair, whatever other pairs do. Both calls must pass the same n and dtype:
     * a mismatch fails both with MW_ERR_INVALID, a message naming both ranks' lengths and types,
     * and nothing written (checked before any data moves, like the collectives' same-call
     * checks; the communicator stays usable).
     * Bits are moved, never added: f32 and bf16 alike in every reducer (another dtype:
     * MW_ERR_UNSUPPORTED, the communicator aborted as for a bad argument).
     * A send waits for its receiver (rendezvous; nothing is buffered, nothing allocated), so two
     * ranks that both send to each other first wait for each other until the timeout: they call
     * sendrecv, which sends sendbuf[0..n) to send_peer while it receives recvbuf[0..n) from
     * recv_peer (the receive posted first), so that every rank of a ring may call it at once;
     * it pairs with a peer's sendrecv (and, in shared memory and between processes of the
     * hierarchical reducer, with the peer's send and recv in either order; the reducers of
     * device memory refuse that pairing, which would cross their two rounds of meeting, with
     * MW_ERR_INVALID and an abort). The two buffers must not overlap. A rank's only transfer with
     * itself is sendrecv with send_peer == recv_peer == rank (a copy); send and recv to or from
     * oneself are refused. Collectives in flight: a point-to-point call first completes the
     * all-reduces and the all-gather this rank started (allreduce_start, all_gather_start), as the
     * collectives do; so a peer must not wait in a point-to-point call for this rank before it
     * joins them. Abort and timeout as for the collectives: a rank blocked in (or later entering) a
     * send, recv or sendrecv returns MW_ERR_ABORTED promptly when any rank aborts the communicator;
     * one waiting longer than timeout_ms for its peer returns MW_ERR_TIMEOUT and aborts it. In
     * shared memory and cuda-local a transfer given up happened on both sides or on neither;
     * NCCL gives up before queueing anything while the ranks meet on the host, and after that
     * as its collectives do (reset() re-creates the communicators); between processes a
     * transfer given up poisons the communicator, as a collective does there. reset() makes
     * the communicator usable again wherever it does so after a collective.
     * Device memory: buffers live on the ranks' devices; the transfer is queued after the work
     * queued so far on both devices and before their later work (the receiver's next kernels
     * read the data, the sender's may overwrite buf); NCCL's calls return once it ran. */
    mw_status (*send)(mw__comm *comm, int rank, int peer, const void *buf, size_t n,
                      mw_dtype dtype);
    mw_status (*recv)(mw__comm *comm, int rank, int peer, void *buf, size_t n, mw_dtype dtype);
    mw_status (*sendrecv)(mw__comm *comm, int rank, int send_peer, const void *sendbuf,
                          int recv_peer, void *recvbuf, size_t n, mw_dtype dtype);
} mw__reducer_vtable;

/* MW_OK for a dtype a reducer that takes only f32 is given f32; else MW_ERR_UNSUPPORTED naming
 * the reducer, the collective and the dtype. */
static inline mw_status mw__reducer_dtype(const char *reducer, const char *what, mw_dtype dtype) {
    if (dtype == MW_F32) return MW_OK;
    return mw__error(MW_ERR_UNSUPPORTED,
                     "%s reducer: %s of %s elements is not implemented (f32 "
                     "only)",
                     reducer, what, dtype == MW_BF16 ? "bf16" : "non-f32");
}

/* The typed entry points of a reducer that moves f32 only: prefix_allreduce_sum,
 * prefix_allreduce_start, prefix_reduce_scatter_sum, prefix_all_gather and prefix_broadcast, each
 * refusing another dtype by name (mw__reducer_dtype, as `name`) before it calls the f32 function
 * of the same name with the suffix _f32. */
#define MW__REDUCER_F32_ONLY(prefix, name)                                                         \
    static mw_status prefix##_allreduce_sum(mw__comm *comm, int rank, void *buf, size_t n,         \
                                            mw_dtype dtype) {                                      \
        mw_status st = mw__reducer_dtype(name, "all-reduce", dtype);                               \
        return st ? st : prefix##_allreduce_sum_f32(comm, rank, buf, n);                           \
    }                                                                                              \
    static mw_status prefix##_allreduce_start(mw__comm *comm, int rank, void *buf, size_t n,       \
                                              mw_dtype dtype) {                                    \
        mw_status st = mw__reducer_dtype(name, "all-reduce", dtype);                               \
        return st ? st : prefix##_allreduce_start_f32(comm, rank, buf, n);                         \
    }                                                                                              \
    static mw_status prefix##_reduce_scatter_sum(mw__comm *comm, int rank, void *buf, size_t n,    \
                                                 mw_dtype dtype, const size_t *bounds) {           \
        mw_status st = mw__reducer_dtype(name, "reduce-scatter", dtype);                           \
        return st ? st : prefix##_reduce_scatter_sum_f32(comm, rank, buf, n, bounds);              \
    }                                                                                              \
    static mw_status prefix##_all_gather(mw__comm *comm, int rank, void *buf, size_t n,            \
                                         mw_dtype dtype, const size_t *bounds) {                   \
        mw_status st = mw__reducer_dtype(name, "all-gather", dtype);                               \
        return st ? st : prefix##_all_gather_f32(comm, rank, buf, n, bounds);                      \
    }                                                                                              \
    static mw_status prefix##_broadcast(mw__comm *comm, int rank, void *buf, size_t n,             \
                                        mw_dtype dtype, int root) {                                \
        mw_status st = mw__reducer_dtype(name, "broadcast", dtype);                                \
        return st ? st : prefix##_broadcast_f32(comm, rank, buf, n, root);                         \
    }

/* Bytes per element of a dtype point-to-point calls move (f32, bf16), or 0 for another. */
static inline size_t mw__p2p_esize(mw_dtype dtype) {
    return dtype == MW_F32 ? 4 : dtype == MW_BF16 ? 2 : 0;
}

/* The name of such a dtype in messages. */
static inline const char *mw__p2p_dtype_name(mw_dtype dtype) {
    return dtype == MW_F32 ? "f32" : dtype == MW_BF16 ? "bf16" : "non-f32";
}

/* What is wrong with the arguments of a point-to-point call of rank `rank` of nranks ("a peer out
 * of range", ...), or NULL; send_peer or recv_peer -1 when the call has no such half (send and
 * recv pass a negative peer as nranks, out of range). The dtype is checked apart
 * (mw__p2p_esize). */
static inline const char *mw__p2p_bad_args(int nranks, int rank, int send_peer, const void *sendbuf,
                                           int recv_peer, const void *recvbuf, size_t n,
                                           mw_dtype dtype) {
    int both = send_peer >= 0 && recv_peer >= 0;
    size_t bytes = n * mw__p2p_esize(dtype);
    if (send_peer >= nranks || recv_peer >= nranks) return "a peer out of range";
    if (n > 0 && ((send_peer >= 0 && !sendbuf) || (recv_peer >= 0 && !recvbuf)))
        return "a NULL buffer";
    if (!both && (send_peer == rank || recv_peer == rank))
        return "itself as the peer (a copy to oneself is a sendrecv)";
    if (both && (send_peer == rank) != (recv_peer == rank))
        return "itself as only one of the peers";
    if (both && bytes > 0 && (const char *)sendbuf < (const char *)recvbuf + bytes &&
        (const char *)recvbuf < (const char *)sendbuf + bytes)
        return "overlapping send and receive buffers";
    return NULL;
}

/* Rank r's slice [lo, hi) of n elements split over `parts` ranks: whole 16-float (64-byte) lines,
 * balanced to within one line; lo of r == parts is n. Depends only on n, parts and r. */
static inline size_t mw__slice_lo(size_t n, int parts, int r) {
    size_t lines = (n + 15) / 16;
    size_t lo = lines * (size_t)r / (size_t)parts * 16;
    return lo < n ? lo : n;
}

/* Whether bounds (nranks + 1 offsets) fail the contract: NULL, decreasing, or past n. */
static inline int mw__bad_bounds(const size_t *bounds, int nranks, size_t n) {
    if (!bounds) return 1;
    for (int q = 0; q < nranks; q++)
        if (bounds[q] > bounds[q + 1]) return 1;
    return bounds[nranks] > n;
}

/* The shared-memory reducer for devices that share the host's address space (virtual CPU
 * devices). */
extern const mw__reducer_vtable mw__reducer_shm;

/* Between processes (builds with MESHWIT_HAVE_MPI only): the shared-memory reducer inside each
 * process, MPI between processes (collectives/mpi/reducer_mpi.c). */
extern const mw__reducer_vtable mw__reducer_mpi_hier;

#endif
