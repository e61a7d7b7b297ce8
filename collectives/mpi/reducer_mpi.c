/* The hierarchical reducer: collectives among devices of several processes. Inside a process the
 * shared-memory reducer does the work; between processes one thread per process (the leader: the
 * process's lowest rank in the communicator) talks MPI on a communicator of its own.
 *
 * All-reduce, in three moves:
 *   1. the process's ranks all-reduce in shared memory (sum in rank order);
 *   2. the leader all-reduces the process sums with the other leaders (collectives/mpi/exchange.c:
 *      a reduce-scatter and an all-gather on MPI point-to-point messages, every element summed in
 *      process order by one process and copied to the others);
 *   3. the other ranks copy the leader's result (a broadcast in shared memory), bit for bit.
 * With one device per process (the common case) moves 1 and 3 vanish: the device's worker
 * thread exchanges its own buffer. With several devices per process, one thread per process talks
 * MPI and the shared-memory moves add a pass over memory and a copy; an exchange per device (every
 * worker thread on MPI with a slice of the buffer) is not implemented, so it was not measured.
 * A group whose ranks all live in one process is just the shared-memory reducer.
 *
 * Determinism. Every element is the same bits on every rank and every run for a fixed layout of
 * devices over processes, independent of Open MPI's algorithm selection and tuning: with one
 * device per process it is the sum in rank order, bitwise what the shared-memory reducer gives
 * inside one process; with several, the sum in process order of each process's sum in rank
 * order ((r0 + r1) + (r2 + r3) for two processes of two devices), which agrees with rank order to
 * float rounding.
 *
 * Overlap. allreduce_start does moves 1 and starts 2 and returns; progress advances move 2
 * between the caller's other work; finish completes move 2 and then does move 3 for
 * every all-reduce started, in order. allreduce_sum is start then finish. all_gather_start
 * likewise collects the process's parts and posts the exchange between processes; progress
 * advances it, and finish completes it and copies the parts into the other local buffers.
 *
 * Waiting. Only non-blocking MPI is used, polled with MPI_Test, so a leader notices an abort from
 * a local peer and gives up after timeout_ms (MW_DISTRIBUTED_DEFAULT_TIMEOUT_MS when 0). An MPI
 * collective cannot be cancelled: after a leader gave up, the communicator is poisoned and every
 * later collective fails with MW_ERR_STATE (the job should end with mw_distributed_abort).
 *
 * Reduce-scatter, all-gather and broadcast take the same moves, exchanging between processes only
 * the parts they move (mw__mpi_exchange_parts; see each function). A reduce-scatter sums every
 * element exactly as the all-reduce does (the same move 1, the same process order), so its
 * parts are the all-reduce's bits.
 *
 * Point-to-point (send, recv, sendrecv) involves only its two ranks: in one process the
 * shared-memory reducer's, between processes MPI messages from the rank's own thread
 * (collectives/mpi/p2p.c), not the leader's; see hier_p2p. */
#include <limits.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "collectives/mpi/mpi_impl.h"
#include "collectives/reducer.h"
#include "core/alloc.h"
#include "core/error.h"
#include "meshwit/distributed.h"

#define MAX_RANKS 4096

/* An all-reduce a rank started whose move 3 is still to do. */
typedef struct started {
    float *buf;
    size_t n;
} started;

typedef struct hier_comm {
    int nranks;
    int *local_of; /* rank -> index among this process's ranks, -1 for another process's */
    int nlocal;
    mw__comm *local; /* shared memory among this process's ranks; NULL for one rank */
    int multi;       /* the ranks span processes */
    MPI_Comm comm;   /* the leaders, ordered by world rank */
    int nprocs;
    int timeout_ms;      /* between processes */
    mw__mpi_exchange *x; /* the leader's, between processes */
    mw__mpi_p2p *p2p;    /* every rank's point-to-point calls between processes */
    started *todo;       /* nlocal * MW__MPI_MAX_INFLIGHT, by local index */
    int *ntodo;          /* per local index */
    _Atomic int aborted;
    _Atomic int poisoned; /* set by the leader, read by every rank */
    char procs[96];       /* "0, 1, 2" for messages */
    int *proc_index;      /* rank -> its process's rank among the leaders */
    mw__mpi_part *parts;  /* nranks: the parts of a reduce-scatter or all-gather */
    float **bufs;         /* by local index: buffers published to the other local ranks */
    /* By local index: the all-gather all_gather_start began (buf NULL: none), whose exchange
     * between processes and last local move finish completes. */
    struct gathering {
        float *buf;
        const size_t *bounds;
    } * gathering;
} hier_comm;

static void hier_comm_free(mw__comm *comm) {
    hier_comm *c = (hier_comm *)comm;
    if (!c) return;
    if (c->local) mw__reducer_shm.comm_free(c->local);
    if (c->multi && c->comm != MPI_COMM_NULL && mw__mpi_active()) {
        mw__mpi_lock();
        MPI_Comm_free(&c->comm);
        mw__mpi_unlock();
    }
    mw__mpi_exchange_free(c->x);
    mw__mpi_p2p_free(c->p2p);
    mw__free(c->todo);
    mw__free(c->ntodo);
    mw__free(c->local_of);
    mw__free(c->proc_index);
    mw__free(c->parts);
    mw__free(c->bufs);
    mw__free(c->gathering);
    mw__free(c);
}

static mw_status hier_comm_new(int nranks, struct mw__device *const *devices,
                               const mw__comm_options *opt, mw__comm **out) {
    if (!out) return mw__error(MW_ERR_INVALID, "mpi comm_new: out is NULL");
    *out = NULL;
    if (nranks < 1 || nranks > MAX_RANKS)
        return mw__error(MW_ERR_INVALID, "mpi comm_new: %d ranks (expected 1..%d)", nranks,
                         MAX_RANKS);
    if (opt && opt->timeout_ms < 0)
        return mw__error(MW_ERR_INVALID, "mpi comm_new: timeout_ms is %d (expected >= 0)",
                         opt->timeout_ms);
    const int *proc_of = opt ? opt->proc_of : NULL;
    int self = proc_of ? opt->self_proc : 0;
    int multi = 0, nlocal = 0;
    for (int r = 0; r < nranks; r++) {
        if (proc_of && proc_of[r] != proc_of[0]) multi = 1;
        if (!proc_of || proc_of[r] == self) nlocal++;
    }
    if (multi && !mw__mpi_active())
        return mw__error(MW_ERR_STATE, "mpi comm_new: ranks span processes but MPI is not "
                                       "initialised (call mw_distributed_init)");
    MPI_Comm split = MPI_COMM_NULL;
    if (multi) {
        /* Collective over the world: every process calls it, also one without ranks here. */
        mw__mpi_lock();
        int rc = MPI_Comm_split(MPI_COMM_WORLD, nlocal ? 0 : MPI_UNDEFINED, self, &split);
        mw__mpi_unlock();
        if (rc != MPI_SUCCESS)
            return mw__error(MW_ERR_DEVICE, "mpi comm_new: MPI_Comm_split failed (%d)", rc);
    }
    if (nlocal == 0) return MW_OK;
    hier_comm *c = mw__calloc(1, sizeof *c);
    if (!c) goto nomem;
    c->comm = split;
    c->multi = multi;
    c->nranks = nranks;
    c->nlocal = nlocal;
    c->local_of = mw__malloc((size_t)nranks * sizeof *c->local_of);
    if (!c->local_of) goto nomem;
    for (int r = 0, i = 0; r < nranks; r++)
        c->local_of[r] = !proc_of || proc_of[r] == self ? i++ : -1;
    int user_timeout = opt ? opt->timeout_ms : 0;
    c->timeout_ms = user_timeout ? user_timeout : MW_DISTRIBUTED_DEFAULT_TIMEOUT_MS;
    if (multi) {
        MPI_Comm_size(split, &c->nprocs);
        c->todo = mw__malloc((size_t)nlocal * MW__MPI_MAX_INFLIGHT * sizeof *c->todo);
        c->ntodo = mw__calloc((size_t)nlocal, sizeof *c->ntodo);
        c->proc_index = mw__malloc((size_t)nranks * sizeof *c->proc_index);
        c->parts = mw__malloc((size_t)nranks * sizeof *c->parts);
        c->bufs = mw__calloc((size_t)nlocal, sizeof *c->bufs);
        c->gathering = mw__calloc((size_t)nlocal, sizeof *c->gathering);
        if (!c->todo || !c->ntodo || !c->proc_index || !c->parts || !c->bufs || !c->gathering)
            goto nomem;
        /* The leaders' communicator orders processes by world rank: a rank's process index is
         * the number of processes of the group with a lower world rank (parts[].owner holds
         * whether a rank is its process's first meanwhile). */
        for (int q = 0; q < nranks; q++) {
            c->parts[q].owner = 1;
            for (int e = 0; e < q && c->parts[q].owner; e++)
                c->parts[q].owner = proc_of[e] != proc_of[q];
        }
        for (int r = 0; r < nranks; r++) {
            c->proc_index[r] = 0;
            for (int q = 0; q < nranks; q++)
                c->proc_index[r] += c->parts[q].owner && proc_of[q] < proc_of[r];
        }
        size_t n = 0;
        for (int r = 0, last = -1; r < nranks; r++) {
            int seen = 0;
            for (int q = 0; q < r; q++) seen |= proc_of[q] == proc_of[r];
            if (seen || n + 16 >= sizeof c->procs) continue;
            n += (size_t)snprintf(c->procs + n, sizeof c->procs - n, "%s%d", last < 0 ? "" : ", ",
                                  proc_of[r]);
            last = proc_of[r];
        }
        mw_status st =
            mw__mpi_exchange_new(split, c->timeout_ms, &c->aborted, &c->poisoned, c->procs, &c->x);
        if (!st)
            st = mw__mpi_p2p_new(split, nranks, nlocal, c->proc_index, c->timeout_ms, &c->aborted,
                                 &c->poisoned, c->procs, &c->p2p);
        if (st) {
            hier_comm_free((mw__comm *)c);
            return st;
        }
    }
    if (nlocal > 1) {
        struct mw__device *locals[MAX_RANKS];
        int names[MAX_RANKS];
        for (int r = 0; r < nranks; r++)
            if (c->local_of[r] >= 0) {
                locals[c->local_of[r]] = devices ? devices[r] : NULL;
                names[c->local_of[r]] = r;
            }
        /* Locally, peers wait on the leader while it waits on MPI: give the leader's clearer
         * timeout time to fire first. */
        mw__comm_options lo = {.timeout_ms = multi ? 2 * c->timeout_ms : user_timeout,
                               .names = names};
        mw_status st = mw__reducer_shm.comm_new(nlocal, locals, &lo, &c->local);
        if (st) {
            hier_comm_free((mw__comm *)c);
            return st;
        }
    }
    *out = (mw__comm *)c;
    return MW_OK;
nomem:
    if (c) {
        hier_comm_free((mw__comm *)c);
    } else if (split != MPI_COMM_NULL) {
        mw__mpi_lock();
        MPI_Comm_free(&split);
        mw__mpi_unlock();
    }
    return mw__error(MW_ERR_NOMEM, "mpi comm_new: out of memory");
}

/* Polls one non-blocking MPI call to completion, an abort, or the timeout. */
static mw_status wait_request(hier_comm *c, MPI_Request *req, const char *what) {
    double start = mw__mpi_now_ms(), deadline = start + c->timeout_ms;
    for (int i = 0;; i++) {
        int done = 0;
        mw__mpi_lock();
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        mw__mpi_unlock();
        if (rc != MPI_SUCCESS) {
            c->poisoned = 1;
            return mw__error(MW_ERR_DEVICE, "%s between processes %s failed in MPI (%d)", what,
                             c->procs, rc);
        }
        if (done) return MW_OK;
        if (atomic_load_explicit(&c->aborted, memory_order_acquire)) {
            c->poisoned = 1;
            return mw__error(MW_ERR_ABORTED,
                             "%s between processes %s aborted because a device of this process "
                             "failed",
                             what, c->procs);
        }
        if ((i & 15) != 15) continue;
        double t = mw__mpi_now_ms();
        if (t > deadline) {
            c->poisoned = 1;
            return mw__error(MW_ERR_TIMEOUT,
                             "%s between processes %s: not every process arrived within %d ms "
                             "(one of them failed or stalls; end the job with "
                             "mw_distributed_abort)",
                             what, c->procs, c->timeout_ms);
        }
        mw__mpi_backoff(t - start, 0);
    }
}

static mw_status check_rank(hier_comm *c, int rank, const char *what) {
    if (!c) return mw__error(MW_ERR_INVALID, "mpi %s: communicator is NULL", what);
    if (rank < 0 || rank >= c->nranks || c->local_of[rank] < 0)
        return mw__error(MW_ERR_INVALID, "mpi %s: rank %d is not a rank of this process", what,
                         rank);
    if (c->poisoned)
        return mw__error(MW_ERR_STATE,
                         "a collective between processes %s failed earlier and cannot be "
                         "resumed; end the job (mw_distributed_abort)",
                         c->procs);
    return MW_OK;
}

static void copy_part(float *to, const float *from, const size_t *bounds, int r);

/* The last local move of an all-gather, once the leader's buffer holds every part: the other
 * local ranks copy the parts they lack from it. */
static mw_status gather_from_leader(hier_comm *c, int rank, float *buf, const size_t *bounds) {
    int li = c->local_of[rank];
    mw_status st = mw__reducer_shm.barrier(c->local, li);
    if (st) return st;
    for (int r = 0; li != 0 && r < c->nranks; r++)
        if (r != rank) copy_part(buf, c->bufs[0], bounds, r);
    return mw__reducer_shm.barrier(c->local, li);
}

/* Move 3 of everything this rank started, after the leader completed move 2, and the rest of an
 * all-gather it started. */
static mw_status hier_allreduce_finish(mw__comm *comm, int rank) {
    hier_comm *c = (hier_comm *)comm;
    mw_status st = check_rank(c, rank, "all-reduce");
    if (st) return st;
    int li = c->local_of[rank];
    if (!c->multi) return c->local ? mw__reducer_shm.finish(c->local, li) : MW_OK;
    if (li == 0 && (st = mw__mpi_exchange_wait(c->x, 1))) {
        if (c->local) mw__reducer_shm.abort(c->local);
        c->gathering[li].buf = NULL;
        return st;
    }
    struct gathering g = c->gathering[li];
    c->gathering[li].buf = NULL;
    if (!c->local) return MW_OK;
    started *todo = c->todo + (size_t)li * MW__MPI_MAX_INFLIGHT;
    for (int i = 0; i < c->ntodo[li] && st == MW_OK; i++)
        st = mw__reducer_shm.broadcast(c->local, li, todo[i].buf, todo[i].n, MW_F32, 0);
    c->ntodo[li] = 0;
    if (st == MW_OK && g.buf) st = gather_from_leader(c, rank, g.buf, g.bounds);
    return st;
}

/* Moves 1 and the start of 2. */
static mw_status hier_allreduce_start_f32(mw__comm *comm, int rank, float *buf, size_t n) {
    hier_comm *c = (hier_comm *)comm;
    mw_status st = check_rank(c, rank, "all-reduce");
    if (st) return st;
    int li = c->local_of[rank];
    if (c->local && (st = mw__reducer_shm.allreduce_sum(c->local, li, buf, n, MW_F32))) return st;
    if (!c->multi) return MW_OK;
    /* Every local rank reaches a full list at the same all-reduce. */
    if (c->ntodo[li] == MW__MPI_MAX_INFLIGHT && (st = hier_allreduce_finish(comm, rank))) return st;
    if (li == 0 && (st = mw__mpi_exchange_start(c->x, buf, n))) {
        if (c->local) mw__reducer_shm.abort(c->local);
        return st;
    }
    if (c->local)
        c->todo[(size_t)li * MW__MPI_MAX_INFLIGHT + (size_t)c->ntodo[li]++] = (started){buf, n};
    return MW_OK;
}

static mw_status hier_progress(mw__comm *comm, int rank) {
    hier_comm *c = (hier_comm *)comm;
    mw_status st = check_rank(c, rank, "all-reduce");
    if (st || !c->multi || c->local_of[rank] != 0) return st;
    if ((st = mw__mpi_exchange_progress(c->x)) && c->local) mw__reducer_shm.abort(c->local);
    return st;
}

static mw_status hier_allreduce_sum_f32(mw__comm *comm, int rank, float *buf, size_t n) {
    mw_status st = hier_allreduce_start_f32(comm, rank, buf, n);
    return st ? st : hier_allreduce_finish(comm, rank);
}

static mw_status hier_barrier(mw__comm *comm, int rank) {
    hier_comm *c = (hier_comm *)comm;
    mw_status st = check_rank(c, rank, "barrier");
    if (st || (st = hier_allreduce_finish(comm, rank))) return st;
    int li = c->local_of[rank];
    if (c->local && (st = mw__reducer_shm.barrier(c->local, li))) return st;
    if (!c->multi) return MW_OK;
    if (li == 0) {
        MPI_Request req;
        mw__mpi_lock();
        int rc = MPI_Ibarrier(c->comm, &req);
        mw__mpi_unlock();
        st = rc == MPI_SUCCESS ? wait_request(c, &req, "barrier")
                               : mw__error(MW_ERR_DEVICE,
                                           "barrier between processes %s: "
                                           "MPI_Ibarrier failed (%d)",
                                           c->procs, rc);
        if (st) {
            if (rc != MPI_SUCCESS) c->poisoned = 1;
            if (c->local) mw__reducer_shm.abort(c->local);
            return st;
        }
    }
    return c->local ? mw__reducer_shm.barrier(c->local, li) : MW_OK;
}

static void hier_abort(mw__comm *comm) {
    hier_comm *c = (hier_comm *)comm;
    if (!c) return;
    atomic_store_explicit(&c->aborted, 1, memory_order_release);
    if (c->local) mw__reducer_shm.abort(c->local);
}

static void hier_reset(mw__comm *comm) {
    hier_comm *c = (hier_comm *)comm;
    if (!c) return;
    if (c->local) mw__reducer_shm.reset(c->local);
    if (c->ntodo) memset(c->ntodo, 0, (size_t)c->nlocal * sizeof *c->ntodo);
    if (c->gathering) memset(c->gathering, 0, (size_t)c->nlocal * sizeof *c->gathering);
    atomic_store_explicit(&c->aborted, 0, memory_order_release);
}

/* ---- reduce-scatter, all-gather, broadcast ---- */

/* A call's checks (bounds with root -1, else the root) and the all-reduces this rank has in
 * flight, completed first. */
static mw_status enter_parts(hier_comm *c, int rank, const char *what, const float *buf, size_t n,
                             const size_t *bounds, int root) {
    mw_status st = check_rank(c, rank, what);
    if (st || (st = hier_allreduce_finish((mw__comm *)c, rank))) return st;
    int with_parts = root < 0; /* root -1: a reduce-scatter or all-gather */
    if (with_parts) root = 0;
    const char *bad = !buf && n ? "a NULL buffer"
                      : with_parts && mw__bad_bounds(bounds, c->nranks, n)
                          ? "no parts, or parts outside the buffer"
                      : root < 0 || root >= c->nranks ? "a root out of range"
                                                      : NULL;
    if (!bad) return MW_OK;
    hier_abort((mw__comm *)c); /* the peers would wait for this rank */
    return mw__error(MW_ERR_INVALID, "mpi %s: rank %d passed %s (%zu floats, %d ranks)", what, rank,
                     bad, n, c->nranks);
}

/* The leader's exchange over the processes of the first nparts of c->parts, or, with bounds,
 * of every rank's part; begun (an all-gather, sum 0) it is left to progress and finish. A failure
 * releases the local ranks, which wait. */
static mw_status leader_parts(hier_comm *c, float *buf, const size_t *bounds, int nparts, int sum,
                              int begin, const char *what) {
    for (int r = 0; bounds && r < c->nranks; r++)
        c->parts[r] = (mw__mpi_part){bounds[r], bounds[r + 1], c->proc_index[r]};
    mw_status st = begin ? mw__mpi_exchange_gather_start(c->x, buf, c->parts, nparts, what)
                         : mw__mpi_exchange_parts(c->x, buf, c->parts, nparts, sum, what);
    if (st && c->local) mw__reducer_shm.abort(c->local);
    return st;
}

static void copy_part(float *to, const float *from, const size_t *bounds, int r) {
    if (to != from && bounds[r] < bounds[r + 1])
        memcpy(to + bounds[r], from + bounds[r], (bounds[r + 1] - bounds[r]) * sizeof *to);
}

/* As the all-reduce, up to its move 3: move 1 puts the process's sum in every local buffer,
 * the leaders exchange only the parts (the owner of a part sums it in process order, as the
 * all-reduce's exchange does), and each other local rank copies its part of the leader's
 * buffer. */
static mw_status hier_reduce_scatter_sum_f32(mw__comm *comm, int rank, float *buf, size_t n,
                                             const size_t *bounds) {
    hier_comm *c = (hier_comm *)comm;
    mw_status st = enter_parts(c, rank, "reduce-scatter", buf, n, bounds, -1);
    if (st) return st;
    int li = c->local_of[rank];
    if (!c->multi)
        return c->local ? mw__reducer_shm.reduce_scatter_sum(c->local, li, buf, n, MW_F32, bounds)
                        : MW_OK;
    if (c->local && (st = mw__reducer_shm.allreduce_sum(c->local, li, buf, n, MW_F32))) return st;
    if (li == 0 && (st = leader_parts(c, buf, bounds, c->nranks, 1, 0, "reduce-scatter")))
        return st;
    if (!c->local) return MW_OK;
    if (li == 0) c->bufs[0] = buf;
    if ((st = mw__reducer_shm.barrier(c->local, li))) return st;
    if (li != 0) copy_part(buf, c->bufs[0], bounds, rank);
    return mw__reducer_shm.barrier(c->local, li);
}

/* The leader collects its process's parts from the local buffers, the leaders exchange every
 * part, and the other local ranks copy the rest from the leader's buffer. Started (begin), the
 * exchange is posted and left to progress and finish, which then does the last local move. */
static mw_status all_gather(hier_comm *c, int rank, float *buf, size_t n, const size_t *bounds,
                            int begin) {
    mw_status st = enter_parts(c, rank, "all-gather", buf, n, bounds, -1);
    if (st) return st;
    int li = c->local_of[rank];
    if (!c->multi) {
        if (!c->local) return MW_OK;
        return begin ? mw__reducer_shm.all_gather_start(c->local, li, buf, n, MW_F32, bounds)
                     : mw__reducer_shm.all_gather(c->local, li, buf, n, MW_F32, bounds);
    }
    if (c->local) {
        c->bufs[li] = buf;
        if ((st = mw__reducer_shm.barrier(c->local, li))) return st;
    }
    if (li == 0) {
        for (int r = 0; r < c->nranks; r++)
            if (c->local_of[r] > 0) copy_part(buf, c->bufs[c->local_of[r]], bounds, r);
        if ((st = leader_parts(c, buf, bounds, c->nranks, 0, begin, "all-gather"))) return st;
    }
    if (begin) {
        c->gathering[li] = (struct gathering){buf, bounds};
        return MW_OK;
    }
    return c->local ? gather_from_leader(c, rank, buf, bounds) : MW_OK;
}

static mw_status hier_all_gather_f32(mw__comm *comm, int rank, float *buf, size_t n,
                                     const size_t *bounds) {
    return all_gather((hier_comm *)comm, rank, buf, n, bounds, 0);
}

static mw_status hier_all_gather_start(mw__comm *comm, int rank, void *buf, size_t n,
                                       mw_dtype dtype, const size_t *bounds) {
    mw_status st = mw__reducer_dtype("mpi", "all-gather", dtype);
    return st ? st : all_gather((hier_comm *)comm, rank, buf, n, bounds, 1);
}

/* In the root's process the local ranks take the root's buffer, its leader sends it to the
 * other leaders, and in their processes the local ranks take the leader's. */
static mw_status hier_broadcast_f32(mw__comm *comm, int rank, float *buf, size_t n, int root) {
    hier_comm *c = (hier_comm *)comm;
    mw_status st = enter_parts(c, rank, "broadcast", buf, n, NULL, root);
    if (st) return st;
    int li = c->local_of[rank];
    if (!c->multi)
        return c->local ? mw__reducer_shm.broadcast(c->local, li, buf, n, MW_F32, root) : MW_OK;
    int local_root = c->local_of[root];
    if (c->local && local_root >= 0 &&
        (st = mw__reducer_shm.broadcast(c->local, li, buf, n, MW_F32, local_root)))
        return st;
    if (li == 0) {
        c->parts[0] = (mw__mpi_part){0, n, c->proc_index[root]};
        if ((st = leader_parts(c, buf, NULL, 1, 0, 0, "broadcast"))) return st;
    }
    if (c->local && local_root < 0)
        return mw__reducer_shm.broadcast(c->local, li, buf, n, MW_F32, 0);
    return MW_OK;
}

/* ---- point-to-point ---- */

/* The checks of a point-to-point call (as the shared-memory reducer's; a bad one aborts, since
 * the peer would wait), then the collectives this rank has in flight. send_peer or recv_peer -1:
 * that half is absent. */
static mw_status enter_p2p(hier_comm *c, const char *what, int rank, int send_peer,
                           const void *sendbuf, int recv_peer, const void *recvbuf, size_t n,
                           mw_dtype dtype) {
    mw_status st = check_rank(c, rank, what);
    if (st) return st;
    int p = c->nranks;
    if (!mw__p2p_esize(dtype)) {
        hier_abort((mw__comm *)c);
        return mw__error(MW_ERR_UNSUPPORTED, "mpi %s: elements of dtype %d (f32 and bf16 only)",
                         what, (int)dtype);
    }
    const char *bad = mw__p2p_bad_args(p, rank, send_peer, sendbuf, recv_peer, recvbuf, n, dtype);
    if (bad) {
        hier_abort((mw__comm *)c);
        return mw__error(MW_ERR_INVALID, "mpi %s: rank %d passed %s (peers %d and %d of %d ranks)",
                         what, rank, bad, send_peer, recv_peer, p);
    }
    if ((st = hier_allreduce_finish((mw__comm *)c, rank))) return st;
    if (atomic_load_explicit(&c->aborted, memory_order_acquire))
        return mw__error(MW_ERR_ABORTED,
                         "mpi %s aborted: rank %d entered after the communicator was aborted; "
                         "reset it first",
                         what, rank);
    return MW_OK;
}

/* A transfer between ranks of this process: in shared memory (by local index), or a copy when
 * the rank is the only one here (then its only transfer is with itself). */
static mw_status local_p2p(hier_comm *c, int rank, int send_peer, const void *sendbuf,
                           int recv_peer, void *recvbuf, size_t n, mw_dtype dtype) {
    int li = c->local_of[rank];
    if (!c->local) {
        if (n) memcpy(recvbuf, sendbuf, n * mw__p2p_esize(dtype));
        return MW_OK;
    }
    if (recv_peer < 0)
        return mw__reducer_shm.send(c->local, li, c->local_of[send_peer], sendbuf, n, dtype);
    if (send_peer < 0)
        return mw__reducer_shm.recv(c->local, li, c->local_of[recv_peer], recvbuf, n, dtype);
    return mw__reducer_shm.sendrecv(c->local, li, c->local_of[send_peer], sendbuf,
                                    c->local_of[recv_peer], recvbuf, n, dtype);
}

/* A send, recv or sendrecv. Halves with ranks of other processes go over MPI (collectives/mpi/
 * p2p.c), from this rank's own thread; a half with a rank of this process goes through shared
 * memory. The MPI messages are posted first, then the shared-memory half runs (its peer,
 * which posts its receive as it enters, never waits for this rank's MPI), then the MPI half is
 * awaited. */
static mw_status hier_p2p(mw__comm *comm, const char *what, int rank, int send_peer,
                          const void *sendbuf, int recv_peer, void *recvbuf, size_t n,
                          mw_dtype dtype) {
    hier_comm *c = (hier_comm *)comm;
    mw_status st = enter_p2p(c, what, rank, send_peer, sendbuf, recv_peer, recvbuf, n, dtype);
    if (st) return st;
    int send_far = send_peer >= 0 && c->local_of[send_peer] < 0;
    int recv_far = recv_peer >= 0 && c->local_of[recv_peer] < 0;
    if (!send_far && !recv_far)
        return local_p2p(c, rank, send_peer, sendbuf, recv_peer, recvbuf, n, dtype);
    int li = c->local_of[rank];
    st = mw__mpi_p2p_post(c->p2p, li, what, rank, send_far ? send_peer : -1, sendbuf,
                          recv_far ? recv_peer : -1, recvbuf, n, dtype);
    if (st) {
        if (c->local) mw__reducer_shm.abort(c->local);
        return st;
    }
    mw_status near = MW_OK;
    if (send_peer >= 0 && !send_far)
        near = local_p2p(c, rank, send_peer, sendbuf, -1, NULL, n, dtype);
    if (recv_peer >= 0 && !recv_far)
        near = local_p2p(c, rank, -1, NULL, recv_peer, recvbuf, n, dtype);
    char msg[MW__MSG_SIZE];
    if (near) snprintf(msg, sizeof msg, "%s", mw_last_error());
    /* Given up locally (not a mere disagreement): the MPI half gives up too. */
    if (near && near != MW_ERR_INVALID) atomic_store_explicit(&c->aborted, 1, memory_order_release);
    mw_status far = mw__mpi_p2p_wait(c->p2p, li);
    if (far && far != MW_ERR_INVALID && c->local) mw__reducer_shm.abort(c->local);
    return near ? mw__error_copy(near, msg) : far;
}

static mw_status hier_send(mw__comm *comm, int rank, int peer, const void *buf, size_t n,
                           mw_dtype dtype) {
    if (peer < 0) peer = INT_MAX; /* out of range, not "absent" */
    return hier_p2p(comm, "send", rank, peer, buf, -1, NULL, n, dtype);
}

static mw_status hier_recv(mw__comm *comm, int rank, int peer, void *buf, size_t n,
                           mw_dtype dtype) {
    if (peer < 0) peer = INT_MAX;
    return hier_p2p(comm, "recv", rank, -1, NULL, peer, buf, n, dtype);
}

static mw_status hier_sendrecv(mw__comm *comm, int rank, int send_peer, const void *sendbuf,
                               int recv_peer, void *recvbuf, size_t n, mw_dtype dtype) {
    if (send_peer < 0) send_peer = INT_MAX;
    if (recv_peer < 0) recv_peer = INT_MAX;
    return hier_p2p(comm, "sendrecv", rank, send_peer, sendbuf, recv_peer, recvbuf, n, dtype);
}

/* The typed entry points: f32 only. */
MW__REDUCER_F32_ONLY(hier, "mpi")

const mw__reducer_vtable mw__reducer_mpi_hier = {
    .name = "mpi-hier",
    .comm_new = hier_comm_new,
    .comm_free = hier_comm_free,
    .allreduce_sum = hier_allreduce_sum,
    .barrier = hier_barrier,
    .allreduce_start = hier_allreduce_start,
    .progress = hier_progress,
    .finish = hier_allreduce_finish,
    .abort = hier_abort,
    .reset = hier_reset,
    .reduce_scatter_sum = hier_reduce_scatter_sum,
    .all_gather = hier_all_gather,
    .broadcast = hier_broadcast,
    .all_gather_start = hier_all_gather_start,
    .send = hier_send,
    .recv = hier_recv,
    .sendrecv = hier_sendrecv,
};
