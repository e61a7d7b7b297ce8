/* The shared-memory reducer's point-to-point calls (the contract in reducer.h): rendezvous, with
 * no step and no copy through scratch.
 *
 * A receiver posts its receive in its own slot (buffer, length, type, and the one sender it
 * waits for) and opens it; the sender waits until the slot of its peer is open for it, claims it
 * with a compare-exchange, copies straight into the receiver's buffer (or, when the calls
 * disagree, leaves its own call beside the receiver's) and closes the slot; the receiver waits
 * for that. A rank receives from one peer at a time, so one slot per rank suffices, and since
 * both ranks' calls come in program order, the k-th send of r to q claims q's k-th receive from
 * r. sendrecv posts its receive before it sends, so a ring of sendrecv calls (or a sendrecv and
 * a peer's send and recv in either order) never waits in a circle.
 *
 * Abort. Waiting ranks watch the communicator's abort word, as the collectives' steps do. A
 * receiver that gives up withdraws its slot with a compare-exchange from open to idle: either it
 * succeeds, and no sender will write into its buffer, or a sender claimed the slot first, and the
 * receiver waits for that copy (bounded work that waits for nobody) and succeeds too. A sender
 * gives up only before it claimed. So a transfer happens on both sides or on neither, and no
 * buffer is written after its owner returned. A rank that times out aborts the communicator, as
 * in a collective.
 *
 * Waits spin, sleep or, in a gang of ranks on one thread (collectives/fiber.h), park, as the
 * collectives' do (mw__shm_wait); every open and close notifies the communicator's events. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "collectives/reducer_shm_impl.h"
#include "core/error.h"

/* A sender waits for its peer's slot to be open for it. */
typedef struct open_wait {
    p2p_slot *slot;
    uint64_t open;
} open_wait;

static int slot_open(void *arg) {
    const open_wait *w = arg;
    return atomic_load_explicit(&w->slot->state, memory_order_acquire) == w->open;
}

/* A receiver waits for its sender to close its slot. */
static int slot_closed(void *arg) {
    int phase = P2P_PHASE(atomic_load_explicit(&((p2p_slot *)arg)->state, memory_order_acquire));
    return phase == P2P_DONE || phase == P2P_MISMATCH;
}

/* The error of calls that disagree, the same on both sides. */
static mw_status mismatch(const mw__comm *c, const char *what, int from, size_t sent_n,
                          mw_dtype sent_dtype, int to, size_t n, mw_dtype dtype) {
    from = mw__shm_name(c, from);
    to = mw__shm_name(c, to);
    return mw__error(MW_ERR_INVALID,
                     "%s: rank %d sends %zu %s elements to rank %d, but rank %d receives %zu %s "
                     "elements from rank %d",
                     what, from, sent_n, mw__p2p_dtype_name(sent_dtype), to, to, n,
                     mw__p2p_dtype_name(dtype), from);
}

static mw_status aborted(mw__comm *c, const char *what, int rank, int peer, int entering,
                         const char *doing) {
    char why[160];
    mw__shm_describe_why(c, why, sizeof why);
    rank = mw__shm_name(c, rank);
    peer = mw__shm_name(c, peer);
    if (entering)
        return mw__error(MW_ERR_ABORTED,
                         "%s aborted: rank %d entered after the communicator was aborted (%s); "
                         "reset it first",
                         what, rank, why);
    return mw__error(MW_ERR_ABORTED, "%s aborted: rank %d was waiting for rank %d to %s (%s)", what,
                     rank, peer, doing, why);
}

static mw_status timed_out(mw__comm *c, const char *what, int rank, int peer, const char *doing) {
    mw__shm_set_abort(c, mw__shm_pack_why(CAUSE_TIMEOUT, rank, peer, c->timeout_ms));
    return mw__error(MW_ERR_TIMEOUT, "%s timed out after %d ms: rank %d waited for rank %d to %s",
                     what, c->timeout_ms, mw__shm_name(c, rank), mw__shm_name(c, peer), doing);
}

static void post(mw__comm *c, int rank, int peer, void *buf, size_t n, mw_dtype dtype) {
    p2p_slot *s = &c->ranks[rank].recv;
    s->buf = buf;
    s->n = n;
    s->dtype = dtype;
    atomic_store_explicit(&s->state, P2P_STATE(P2P_OPEN, peer), memory_order_release);
    mw__shm_notify(c);
}

/* Waits for the receive posted (from peer) to be closed, or withdraws it on abort or timeout. */
static mw_status await_receive(mw__comm *c, const char *what, int rank, int peer) {
    p2p_slot *s = &c->ranks[rank].recv;
    int end = mw__shm_wait(c, slot_closed, s, 1);
    if (end != WAIT_READY) {
        uint64_t open = P2P_STATE(P2P_OPEN, peer);
        if (atomic_compare_exchange_strong_explicit(&s->state, &open, P2P_IDLE,
                                                    memory_order_acq_rel, memory_order_acquire))
            return end == WAIT_ABORTED ? aborted(c, what, rank, peer, 0, "send")
                                       : timed_out(c, what, rank, peer, "send");
        mw__shm_wait(c, slot_closed, s, 0); /* claimed: the copy is under way */
    }
    uint64_t v = atomic_load_explicit(&s->state, memory_order_acquire);
    atomic_store_explicit(&s->state, P2P_IDLE, memory_order_relaxed);
    if (P2P_PHASE(v) == P2P_DONE) return MW_OK;
    return mismatch(c, what, peer, s->sent_n, s->sent_dtype, rank, s->n, s->dtype);
}

/* The sender's half: waits for peer's receive from this rank, claims it, copies, closes it. */
static mw_status deliver(mw__comm *c, const char *what, int rank, int peer, const void *buf,
                         size_t n, mw_dtype dtype) {
    p2p_slot *s = &c->ranks[peer].recv;
    open_wait w = {s, P2P_STATE(P2P_OPEN, rank)};
    for (;;) {
        int end = mw__shm_wait(c, slot_open, &w, 1);
        if (end == WAIT_ABORTED) return aborted(c, what, rank, peer, 0, "receive");
        if (end == WAIT_EXPIRED) return timed_out(c, what, rank, peer, "receive");
        uint64_t open = w.open;
        if (atomic_compare_exchange_strong_explicit(&s->state, &open, P2P_STATE(P2P_CLAIMED, rank),
                                                    memory_order_acq_rel, memory_order_acquire))
            break;
        /* The receiver withdrew (it saw an abort): the next wait sees the abort too. */
    }
    int same = s->n == n && s->dtype == dtype;
    if (same && n > 0) memcpy(s->buf, buf, n * mw__p2p_esize(dtype));
    if (!same) {
        s->sent_n = n;
        s->sent_dtype = dtype;
    }
    size_t their_n = s->n;
    mw_dtype their_dtype = s->dtype;
    atomic_store_explicit(&s->state, P2P_STATE(same ? P2P_DONE : P2P_MISMATCH, rank),
                          memory_order_release);
    mw__shm_notify(c);
    return same ? MW_OK : mismatch(c, what, rank, n, dtype, peer, their_n, their_dtype);
}

/* The checks of a call (a bad one aborts the communicator: the peer would wait for this rank),
 * then the all-gather this rank has in flight. send_peer or recv_peer -1: that half is absent. */
static mw_status enter(mw__comm *c, const char *what, int rank, int send_peer, const void *sendbuf,
                       int recv_peer, void *recvbuf, size_t n, mw_dtype dtype) {
    int bad_buf = n > 0 && ((send_peer >= 0 && !sendbuf) || (recv_peer >= 0 && !recvbuf));
    mw_status st = mw__shm_check_args(c, rank, what, bad_buf, dtype); /* NULL buffers named here */
    if (st) return st;
    int p = c->nranks;
    const char *bad = mw__p2p_bad_args(p, rank, send_peer, sendbuf, recv_peer, recvbuf, n, dtype);
    if (bad) {
        mw__shm_set_abort(c, mw__shm_pack_why(CAUSE_INVALID, rank, -1, 0));
        return mw__error(MW_ERR_INVALID, "%s: rank %d passed %s (peers %d and %d of %d ranks)",
                         what, rank, bad, send_peer, recv_peer, p);
    }
    if (atomic_load_explicit(&c->sync, memory_order_acquire) & ABORT_BIT)
        return aborted(c, what, rank, -1, 1, NULL);
    return MW_OK;
}

mw_status mw__shm_send(mw__comm *c, int rank, int peer, const void *buf, size_t n, mw_dtype dtype) {
    if (peer < 0) peer = c ? c->nranks : 0; /* out of range, not "absent" */
    mw_status st = enter(c, "send", rank, peer, buf, -1, NULL, n, dtype);
    return st ? st : deliver(c, "send", rank, peer, buf, n, dtype);
}

mw_status mw__shm_recv(mw__comm *c, int rank, int peer, void *buf, size_t n, mw_dtype dtype) {
    if (peer < 0) peer = c ? c->nranks : 0;
    mw_status st = enter(c, "recv", rank, -1, NULL, peer, buf, n, dtype);
    if (st) return st;
    post(c, rank, peer, buf, n, dtype);
    return await_receive(c, "recv", rank, peer);
}

mw_status mw__shm_sendrecv(mw__comm *c, int rank, int send_peer, const void *sendbuf, int recv_peer,
                           void *recvbuf, size_t n, mw_dtype dtype) {
    if (send_peer < 0) send_peer = c ? c->nranks : 0;
    if (recv_peer < 0) recv_peer = c ? c->nranks : 0;
    mw_status st = enter(c, "sendrecv", rank, send_peer, sendbuf, recv_peer, recvbuf, n, dtype);
    if (st) return st;
    post(c, rank, recv_peer, recvbuf, n, dtype);
    st = deliver(c, "sendrecv", rank, send_peer, sendbuf, n, dtype);
    char msg[MW__MSG_SIZE];
    if (st) snprintf(msg, sizeof msg, "%s", mw_last_error());
    /* The receive is settled whatever became of the send: a peer may be copying into it. */
    mw_status got = await_receive(c, "sendrecv", rank, recv_peer);
    return st ? mw__error_copy(st, msg) : got;
}
