/* Internal: the shared-memory reducer's communicator (reducer_shm.c: the collectives and the
 * design; reducer_shm_sync.c: the steps, aborts and waits). */
#ifndef MW__REDUCER_SHM_IMPL_H
#define MW__REDUCER_SHM_IMPL_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "collectives/reducer.h"
#include "collectives/wait.h"

#define LINE 128 /* padding: two 64-byte lines, since adjacent-line prefetch pairs them */
#define MAX_RANKS 4096
/* Largest message (in floats) on the small path: 2 KiB. Measured on a 2-core Zen 3 host with 2
 * ranks: the one-step small path only wins while the step's latency dominates; from 4 KiB on,
 * halving each rank's work on the large path is worth its second step (4 KiB: ~1.0 against
 * ~2.3 us; 8 KiB: ~1.5 against ~4.5 us). */
#define SMALL_MAX_FLOATS 512
/* Floats per chunk of the large path: 8 KiB stays in L1 while the peers' chunks are added. */
#define CHUNK_FLOATS 2048
/* A sleeping waiter wakes at least this often to check its deadline. */
#define SLEEP_SLICE_NS 100000000L
#define ABORT_BIT (UINT64_C(1) << 63)
#define COUNT_MASK (ABORT_BIT - 1)

enum op {
    OP_ALLREDUCE = 1,
    OP_BARRIER = 2,
    OP_REDUCE_SCATTER = 3,
    OP_ALL_GATHER = 4,
    OP_BROADCAST = 5
};
enum cause { CAUSE_ABORT = 1, CAUSE_TIMEOUT = 2, CAUSE_INVALID = 3 };

/* What a rank passes into one collective; peers read it after the step that publishes it. */
typedef struct desc {
    void *buf;
    size_t n;
    int op;
    mw_dtype dtype;
    const size_t *bounds; /* reduce-scatter and all-gather: the parts */
    int root;             /* broadcast: the rank whose buffer is copied */
} desc;

/* Point-to-point (reducer_shm_p2p.c): the receive a rank has posted. Its own thread writes the
 * fields, then opens `state`; the one sender it names claims it, copies into buf (or, on a
 * mismatch, leaves its own call in sent_n and sent_dtype) and closes it. */
enum p2p_phase { P2P_IDLE = 0, P2P_OPEN = 1, P2P_CLAIMED = 2, P2P_DONE = 3, P2P_MISMATCH = 4 };
#define P2P_STATE(phase, peer) ((uint64_t)(phase) | (uint64_t)((peer) + 1) << 8)
#define P2P_PHASE(state) ((int)((state)&0xff))

typedef struct p2p_slot {
    alignas(LINE) _Atomic uint64_t state; /* P2P_STATE(phase, the sender it waits for) */
    void *buf;
    size_t n;
    mw_dtype dtype;
    size_t sent_n;
    mw_dtype sent_dtype;
} p2p_slot;

/* One f32 sum started with allreduce_start and not yet taken. */
typedef struct sum_seg {
    float *buf;
    size_t n;
} sum_seg;

typedef struct rank_state {
    alignas(LINE) desc pub[2]; /* indexed by step parity */
    uint64_t step;             /* steps this rank has taken; only its own thread touches it */
    _Atomic uint64_t arrived;  /* the last step it arrived at: read only to name a missing rank */
    float *slot[2];            /* small-path scratch, indexed by step parity */
    int pending;               /* an all_gather_start's gather waits for finish */
    /* The sums started (allreduce_start) and not yet taken, in order: taken together by the next
     * finish or other call of the rank. Written by its own thread; peers read them between the
     * two steps of that call (nsegs_taken: how many it took), so the rank appends again only
     * after every peer is done reading. */
    sum_seg *segs;
    int nsegs, cap_segs, nsegs_taken;
    p2p_slot recv; /* the receive it posted (point-to-point) */
} rank_state;

struct mw__comm {
    alignas(LINE) _Atomic uint64_t sync; /* arrivals since reset | ABORT_BIT */
    alignas(LINE) _Atomic uint64_t why;  /* the first abort's cause, packed; 0 while none */
    alignas(LINE) mw__event ev;          /* notified after every arrival and abort */
    mw__event *wake;                     /* the same, for gangs waiting on other threads; or NULL */
    int nranks;
    int timeout_ms;
    int64_t spin_ns;
    float *scratch;
    rank_state *ranks;
    int *names; /* what point-to-point messages call each rank; NULL: its rank */
};

/* What messages call rank r. */
static inline int mw__shm_name(const mw__comm *c, int r) {
    return c->names && r >= 0 && r < c->nranks ? c->names[r] : r;
}

/* --- reducer_shm_sync.c ------------------------------------------------------------------------
 */

/* What a wait ended by (mw__shm_wait). */
enum wait_end { WAIT_READY = 0, WAIT_ABORTED = 1, WAIT_EXPIRED = 2 };

/* Waits until ready(arg) passes, as every wait of the reducer does: spins while a running peer
 * would soon make it pass, then sleeps on the communicator's event (or, in a gang, parks the
 * task). An abortable wait also ends when the communicator is aborted, and when it has lasted
 * the communicator's timeout (if any); ready is tested first, so a wait that could complete
 * does. Whoever makes ready pass notifies the communicator's events (mw__shm_notify). */
int mw__shm_wait(mw__comm *c, int (*ready)(void *), void *arg, int abortable);
/* Notifies the communicator's event and the gangs' (after a change a waiter may test). */
void mw__shm_notify(mw__comm *c);
/* The first abort's cause, in words ("rank 1 timed out after 200 ms waiting for rank 0"). */
void mw__shm_describe_why(mw__comm *c, char *out, size_t size);

/* An abort's cause (enum cause), the rank that saw it, the peer it waited for and the timeout,
 * packed into one word for `why`. */
uint64_t mw__shm_pack_why(int cause, int rank, int peer, int ms);
/* Records the cause (the first one wins) and sets the abort bit; returns the word before. */
uint64_t mw__shm_set_abort(mw__comm *c, uint64_t why);
/* The error of a collective op the abort stopped at this rank's step (entering: before it
 * published its call), naming the cause and the missing rank. */
mw_status mw__shm_aborted_error(mw__comm *c, int rank, int op, uint64_t step, int entering);
/* Waits until every rank has arrived at this rank's last step (an announced one). */
mw_status mw__shm_await_step(mw__comm *c, int rank, int op, int refusable);
/* Takes this rank's next step: arrives, then waits for its peers. A refusable step gives up
 * (abort or timeout) unless the step completed; a committed step always completes. MW_OK when
 * every rank has arrived. */
mw_status mw__shm_take_step(mw__comm *c, int rank, int op, int refusable);
/* Checks that every rank made the same call as published for step parity `parity`: all ranks
 * see the same descriptors, so they all fail or all go on. */
mw_status mw__shm_same_calls(mw__comm *c, int op, int parity);
/* Publishes this rank's call and arrives at its refusable first step, without waiting. */
mw_status mw__shm_announce(mw__comm *c, int rank, int op, void *buf, size_t n, mw_dtype dtype,
                           const size_t *bounds, int root);
/* Publishes this rank's call, takes a refusable step and checks the calls (a broadcast's root
 * among them); mw__shm_enter, the same without a root. */
mw_status mw__shm_enter_root(mw__comm *c, int rank, int op, void *buf, size_t n, mw_dtype dtype,
                             const size_t *bounds, int root);
mw_status mw__shm_enter(mw__comm *c, int rank, int op, void *buf, size_t n, mw_dtype dtype,
                        const size_t *bounds);

/* --- reducer_shm.c ----------------------------------------------------------------------------
 */

/* Checks the communicator, the rank, the dtype and (bad_buf) the buffer of a call named what; a
 * bad one aborts the communicator. A valid call first completes this rank's all-gather in
 * flight. */
mw_status mw__shm_check_args(mw__comm *c, int rank, const char *what, int bad_buf, mw_dtype dtype);

/* --- reducer_shm_p2p.c: point-to-point (the contract in reducer.h) ---------------------------- */

mw_status mw__shm_send(mw__comm *c, int rank, int peer, const void *buf, size_t n, mw_dtype dtype);
mw_status mw__shm_recv(mw__comm *c, int rank, int peer, void *buf, size_t n, mw_dtype dtype);
mw_status mw__shm_sendrecv(mw__comm *c, int rank, int send_peer, const void *sendbuf, int recv_peer,
                           void *recvbuf, size_t n, mw_dtype dtype);

#endif
