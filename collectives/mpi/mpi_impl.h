/* Internal: what the MPI parts of meshwit share (builds with MESHWIT_HAVE_MPI only). */
#ifndef MW__MPI_IMPL_H
#define MW__MPI_IMPL_H

#include <mpi.h>
#include <stdatomic.h>
#include <stddef.h>
#include <time.h>

#include "meshwit/graph.h"
#include "meshwit/status.h"

/* MPI calls made from worker threads go through these: a no-op when MPI gave
 * MPI_THREAD_MULTIPLE, a process-wide mutex otherwise (MPI_THREAD_SERIALIZED). */
void mw__mpi_lock(void);
void mw__mpi_unlock(void);

/* Non-zero while MPI is initialised and not finalised. */
int mw__mpi_active(void);

/* The monotonic clock in milliseconds, for the waits' deadlines. */
static inline double mw__mpi_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Between two polls of a wait that began waited_ms ago for messages moving `bytes` (0 when
 * unknown): nothing while the transfer may still be under way, then a short nap
 * (collectives/mpi/exchange.c says why and how long). */
void mw__mpi_backoff(double waited_ms, size_t bytes);

/* The all-reduce between processes on MPI point-to-point messages, non-blocking
 * (collectives/mpi/exchange.c: the algorithm, its order of additions and why not MPI_Iallreduce).
 * One exchange per communicator of processes; one thread at a time uses it. */
typedef struct mw__mpi_exchange mw__mpi_exchange;

/* At most this many all-reduces of one exchange are in flight; starting one more first
 * completes those. */
#define MW__MPI_MAX_INFLIGHT 64

/* comm is borrowed (freed by the caller after the exchange); aborted is read while waiting (a
 * non-zero value gives up with MW_ERR_ABORTED); poisoned is set to 1 on every failure; procs
 * ("0, 1") names the processes in messages and is borrowed. Errors: MW_ERR_NOMEM. */
mw_status mw__mpi_exchange_new(MPI_Comm comm, int timeout_ms, const _Atomic int *aborted,
                               _Atomic int *poisoned, const char *procs, mw__mpi_exchange **out);
void mw__mpi_exchange_free(mw__mpi_exchange *x);
/* Frees the scratch of exchanges freed while operations were still in flight (after a failure);
 * call only once MPI is finalised. */
void mw__mpi_exchange_release_abandoned(void);

/* Starts the in-place sum of buf[0..n) over the processes; buf must not be read or written
 * until a wait returned. Every process starts the same all-reduces, in the same order, with the
 * same n. */
mw_status mw__mpi_exchange_start(mw__mpi_exchange *x, float *buf, size_t n);

/* Advances every all-reduce in flight without waiting (call it between other work). */
mw_status mw__mpi_exchange_progress(mw__mpi_exchange *x);

/* Waits until no all-reduce is in flight: MW_ERR_TIMEOUT after the exchange's timeout,
 * MW_ERR_ABORTED when *aborted is set, MW_ERR_DEVICE when MPI fails. end_of_batch: the
 * all-reduces since the last such wait were one step's; their scratch is kept for the next. */
mw_status mw__mpi_exchange_wait(mw__mpi_exchange *x, int end_of_batch);

/* A part buf[lo .. hi) of a buffer and the process that owns it (its rank in the exchange's
 * communicator). */
typedef struct mw__mpi_part {
    size_t lo, hi;
    int owner;
} mw__mpi_part;

/* Collectives over parts, blocking (polled like wait, so abort and timeout are honoured); they
 * first complete the all-reduces in flight. Every process passes the same parts in the same
 * order; parts may be empty and must not overlap. With sum, every part of buf that this
 * process owns becomes the sum of all processes' copies in process order, the same bits the
 * all-reduce gives there (a reduce-scatter), and the rest of buf is left as it was; without,
 * every process's copy of each part becomes its owner's (an all-gather; one part owned by one
 * process is a broadcast). what ("reduce-scatter") names the collective in messages. Errors as
 * wait's, and MW_ERR_INVALID for a part of more than INT_MAX floats. */
mw_status mw__mpi_exchange_parts(mw__mpi_exchange *x, float *buf, const mw__mpi_part *parts,
                                 int nparts, int sum, const char *what);

/* The all-gather of mw__mpi_exchange_parts (sum 0) started without waiting: buf must not be
 * read or written until a wait returned; progress advances it and wait completes it with the
 * all-reduces in flight. One at a time: starting another collective over parts first waits. */
mw_status mw__mpi_exchange_gather_start(mw__mpi_exchange *x, float *buf, const mw__mpi_part *parts,
                                        int nparts, const char *what);

/* All-reduces in flight. */
int mw__mpi_exchange_pending(const mw__mpi_exchange *x);

/* Keeps p (allocated with mw__malloc) until MPI is finalised, then frees it: memory that messages
 * still in flight after a failure may yet be written into. */
void mw__mpi_abandon(void *p);

/* The first tag of the point-to-point messages; the exchange's are below it. */
#define MW__MPI_P2P_TAG0 16400

/* Point-to-point between processes (collectives/mpi/p2p.c): the half of a send, recv or sendrecv
 * that concerns ranks of other processes, over the leaders' communicator. Every local rank has
 * a slot of its own, used only by its thread, so the ranks of a process transfer at once. */
typedef struct mw__mpi_p2p mw__mpi_p2p;

/* nlocal slots for a group of nranks ranks; proc_index[r] is the rank of r's process in comm.
 * comm, proc_index and procs are borrowed; aborted, poisoned and timeout_ms as for the exchange.
 * Errors: MW_ERR_NOMEM. */
mw_status mw__mpi_p2p_new(MPI_Comm comm, int nranks, int nlocal, const int *proc_index,
                          int timeout_ms, const _Atomic int *aborted, _Atomic int *poisoned,
                          const char *procs, mw__mpi_p2p **out);
void mw__mpi_p2p_free(mw__mpi_p2p *x);
/* Posts, in slot li, the messages of group rank `rank`'s call `what` ("send") with ranks of other
 * processes: a send of sendbuf[0..n) to send_peer and a receive of recvbuf[0..n) from recv_peer
 * (-1: none), without waiting. The arguments are checked by the caller. */
mw_status mw__mpi_p2p_post(mw__mpi_p2p *x, int li, const char *what, int rank, int send_peer,
                           const void *sendbuf, int recv_peer, void *recvbuf, size_t n,
                           mw_dtype dtype);
/* Polls slot li until what was posted there is complete: MW_ERR_INVALID (naming both calls, no
 * data moved) when a peer's n or dtype differs; MW_ERR_ABORTED when *aborted is set,
 * MW_ERR_TIMEOUT after timeout_ms and MW_ERR_DEVICE when MPI fails, each of them poisoning the
 * communicator. */
mw_status mw__mpi_p2p_wait(mw__mpi_p2p *x, int li);

#endif
