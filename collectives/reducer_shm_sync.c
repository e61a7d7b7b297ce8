/* The shared-memory reducer's synchronisation (reducer_shm.c tells the design): the steps every
 * collective is made of, the abort word and its causes, the check that every rank made the same
 * call, and the waits, spinning, sleeping or, in a gang, yielding. */
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "collectives/fiber.h"
#include "collectives/reducer_shm_impl.h"
#include "collectives/wait.h"
#include "core/error.h"

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

uint64_t mw__shm_pack_why(int cause, int rank, int peer, int ms) {
    return (uint64_t)cause | (uint64_t)(rank + 1) << 4 | (uint64_t)(peer + 1) << 17 |
           (uint64_t)(uint32_t)ms << 30;
}

/* Records the cause (the first one wins) and sets the abort bit; returns the word before. */
uint64_t mw__shm_set_abort(mw__comm *c, uint64_t why) {
    uint64_t none = 0;
    atomic_compare_exchange_strong_explicit(&c->why, &none, why, memory_order_relaxed,
                                            memory_order_relaxed);
    uint64_t old = atomic_fetch_or_explicit(&c->sync, ABORT_BIT, memory_order_seq_cst);
    mw__shm_notify(c);
    return old;
}

void mw__shm_describe_why(mw__comm *c, char *out, size_t size) {
    uint64_t w = atomic_load_explicit(&c->why, memory_order_relaxed);
    int cause = (int)(w & 15), rank = (int)(w >> 4 & 0x1fff) - 1;
    int peer = (int)(w >> 17 & 0x1fff) - 1, ms = (int)(uint32_t)(w >> 30);
    switch (cause) {
    case CAUSE_TIMEOUT:
        if (peer >= 0)
            snprintf(out, size, "rank %d timed out after %d ms waiting for rank %d", rank, ms,
                     peer);
        else
            snprintf(out, size, "rank %d timed out after %d ms", rank, ms);
        break;
    case CAUSE_INVALID:
        if (rank >= 0)
            snprintf(out, size, "rank %d passed an invalid argument", rank);
        else
            snprintf(out, size, "a caller passed an out-of-range rank");
        break;
    default: snprintf(out, size, "a peer failed and aborted the communicator"); break;
    }
}

/* A rank that has not yet arrived at step `step`, or -1 (only for messages). */
static int missing_rank(mw__comm *c, int self, uint64_t step) {
    for (int q = 0; q < c->nranks; q++)
        if (q != self && atomic_load_explicit(&c->ranks[q].arrived, memory_order_relaxed) < step)
            return q;
    return -1;
}

static const char *op_name(int op) {
    switch (op) {
    case OP_BARRIER: return "barrier";
    case OP_REDUCE_SCATTER: return "reduce-scatter";
    case OP_ALL_GATHER: return "all-gather";
    case OP_BROADCAST: return "broadcast";
    default: return "all-reduce";
    }
}

mw_status mw__shm_aborted_error(mw__comm *c, int rank, int op, uint64_t step, int entering) {
    char why[160];
    mw__shm_describe_why(c, why, sizeof why);
    if (entering)
        return mw__error(MW_ERR_ABORTED,
                         "%s aborted: rank %d entered after the communicator was aborted (%s); "
                         "reset it first",
                         op_name(op), rank, why);
    int peer = missing_rank(c, rank, step);
    if (peer < 0)
        return mw__error(MW_ERR_ABORTED, "%s aborted: rank %d was waiting for its peers (%s)",
                         op_name(op), rank, why);
    return mw__error(MW_ERR_ABORTED, "%s aborted: rank %d was waiting for rank %d (%s)",
                     op_name(op), rank, peer, why);
}

/* What a gang's parked task waits for: ready(arg), or (abortable) an abort, or its deadline (0:
 * none) passed. */
typedef struct waiter {
    mw__comm *c;
    int (*ready)(void *);
    void *arg;
    int abortable;
    int64_t deadline;
} waiter;

static int waiter_ready(void *p) {
    const waiter *w = p;
    return w->ready(w->arg) ||
           (w->abortable &&
            (atomic_load_explicit(&w->c->sync, memory_order_seq_cst) & ABORT_BIT)) ||
           (w->deadline > 0 && now_ns() > w->deadline);
}

void mw__shm_notify(mw__comm *c) {
    mw__event_notify(&c->ev);
    if (c->wake) mw__event_notify(c->wake);
}

int mw__shm_wait(mw__comm *c, int (*ready)(void *), void *arg, int abortable) {
    /* Spin while a running peer would arrive soon, then sleep until an arrival or abort wakes
     * this rank (or, with a timeout, until the deadline). The clock is read every 64 spins. A rank
     * run as a gang's task (collectives/fiber.h) parks instead, until the same test passes, and its
     * gang runs the other ranks of its thread meanwhile. */
    waiter w = {c, ready, arg, abortable, 0};
    int64_t start = 0;
    for (unsigned spins = 0;; spins++) {
        if (ready(arg)) return WAIT_READY;
        /* Seen aborted, tested again: what made it ready may have come between the two loads,
         * and nothing that makes an abortable wait ready comes after an abort. */
        if (abortable && (atomic_load_explicit(&c->sync, memory_order_seq_cst) & ABORT_BIT))
            return ready(arg) ? WAIT_READY : WAIT_ABORTED;
        if (spins % 64 != 63 && spins > 0) {
            mw__cpu_relax();
            continue;
        }
        int64_t now = now_ns();
        if (!start) {
            start = now;
            if (abortable && c->timeout_ms > 0) w.deadline = now + (int64_t)c->timeout_ms * 1000000;
        }
        if (w.deadline > 0 && now > w.deadline) return WAIT_EXPIRED;
        if (mw__gang_wait(waiter_ready, &w)) {
            spins = 62; /* ready: the next pass reads the clock for the deadline */
            continue;
        }
        if (now - start < c->spin_ns) continue;
        uint32_t seen = mw__event_prepare(&c->ev);
        if (ready(arg) ||
            (abortable && (atomic_load_explicit(&c->sync, memory_order_seq_cst) & ABORT_BIT))) {
            mw__event_cancel(&c->ev);
            continue;
        }
        int64_t slice = SLEEP_SLICE_NS;
        if (w.deadline > 0 && w.deadline - now < slice) slice = w.deadline - now + 1000;
        mw__event_sleep(&c->ev, seen, slice);
    }
}

/* A step is complete once every rank has arrived at it. */
typedef struct step_wait {
    mw__comm *c;
    uint64_t target;
} step_wait;

static int step_complete(void *arg) {
    const step_wait *sw = arg;
    return (atomic_load_explicit(&sw->c->sync, memory_order_seq_cst) & COUNT_MASK) >= sw->target;
}

/* The first half of a step: this rank arrives (refused once the communicator was aborted) and
 * goes on without waiting for its peers. */
static mw_status arrive(mw__comm *c, int rank, int op, int refusable) {
    rank_state *me = &c->ranks[rank];
    uint64_t step = me->step + 1;
    atomic_store_explicit(&me->arrived, step, memory_order_relaxed);
    if (refusable) {
        uint64_t v = atomic_load_explicit(&c->sync, memory_order_relaxed);
        do {
            if (v & ABORT_BIT) return mw__shm_aborted_error(c, rank, op, step, 1);
        } while (!atomic_compare_exchange_weak_explicit(&c->sync, &v, v + 1, memory_order_acq_rel,
                                                        memory_order_relaxed));
    } else {
        atomic_fetch_add_explicit(&c->sync, 1, memory_order_acq_rel);
    }
    me->step = step;
    mw__shm_notify(c);
    return MW_OK;
}

/* The second half: waits until every rank has arrived at this rank's last step. */
mw_status mw__shm_await_step(mw__comm *c, int rank, int op, int refusable) {
    uint64_t step = c->ranks[rank].step;
    step_wait sw = {c, step * (uint64_t)c->nranks};
    int end = mw__shm_wait(c, step_complete, &sw, refusable);
    if (end == WAIT_READY) return MW_OK;
    if (end == WAIT_ABORTED) return mw__shm_aborted_error(c, rank, op, step, 0);
    int peer = missing_rank(c, rank, step);
    uint64_t old = mw__shm_set_abort(c, mw__shm_pack_why(CAUSE_TIMEOUT, rank, peer, c->timeout_ms));
    if ((old & COUNT_MASK) >= sw.target) return MW_OK; /* everyone arrived just in time */
    if (peer < 0)
        return mw__error(MW_ERR_TIMEOUT, "%s timed out after %d ms: rank %d waited for its peers",
                         op_name(op), c->timeout_ms, rank);
    return mw__error(MW_ERR_TIMEOUT, "%s timed out after %d ms: rank %d waited for rank %d",
                     op_name(op), c->timeout_ms, rank, peer);
}

/* Takes this rank's next step: arrives, then waits for its peers. A refusable step gives up
 * (abort or timeout) unless the step completed; a committed step always completes, since its
 * peers are past the last refusable step and wait for nobody. Returns MW_OK when every rank has
 * arrived. */
mw_status mw__shm_take_step(mw__comm *c, int rank, int op, int refusable) {
    mw_status st = arrive(c, rank, op, refusable);
    return st ? st : mw__shm_await_step(c, rank, op, refusable);
}

/* Checks that every rank made the same call as published for step parity `parity` (a mismatch
 * would otherwise write past a buffer). All ranks see the same descriptors, so they all fail or
 * all go on. */
mw_status mw__shm_same_calls(mw__comm *c, int op, int parity) {
    const desc *d0 = &c->ranks[0].pub[parity];
    for (int q = 1; q < c->nranks; q++) {
        const desc *d = &c->ranks[q].pub[parity];
        if (d->op != d0->op)
            return mw__error(MW_ERR_INVALID, "%s: rank 0 called %s but rank %d called %s",
                             op_name(op), op_name(d0->op), q, op_name(d->op));
        if (d->n != d0->n)
            return mw__error(MW_ERR_INVALID,
                             "%s: ranks disagree on the length: rank 0 has %zu elements, "
                             "rank %d has %zu",
                             op_name(op), d0->n, q, d->n);
        if (d->dtype != d0->dtype)
            return mw__error(MW_ERR_INVALID, "%s: ranks 0 and %d disagree on the element type",
                             op_name(op), q);
        if (d0->bounds &&
            memcmp(d->bounds, d0->bounds, (size_t)(c->nranks + 1) * sizeof *d->bounds) != 0)
            return mw__error(MW_ERR_INVALID, "%s: ranks 0 and %d disagree on the parts",
                             op_name(op), q);
        if (d->root != d0->root)
            return mw__error(MW_ERR_INVALID,
                             "%s: ranks disagree on the root: rank 0 names rank %d, rank %d "
                             "names rank %d",
                             op_name(op), d0->root, q, d->root);
    }
    return MW_OK;
}

/* Publishes this rank's call and arrives at its refusable first step, without waiting. */
mw_status mw__shm_announce(mw__comm *c, int rank, int op, void *buf, size_t n, mw_dtype dtype,
                           const size_t *bounds, int root) {
    rank_state *me = &c->ranks[rank];
    me->pub[(me->step + 1) & 1] = (desc){buf, n, op, dtype, bounds, root};
    return arrive(c, rank, op, 1);
}

/* Publishes this rank's call, takes a refusable step and checks the calls. */
mw_status mw__shm_enter_root(mw__comm *c, int rank, int op, void *buf, size_t n, mw_dtype dtype,
                             const size_t *bounds, int root) {
    mw_status st = mw__shm_announce(c, rank, op, buf, n, dtype, bounds, root);
    if (st == MW_OK) st = mw__shm_await_step(c, rank, op, 1);
    return st ? st : mw__shm_same_calls(c, op, (int)(c->ranks[rank].step & 1));
}

mw_status mw__shm_enter(mw__comm *c, int rank, int op, void *buf, size_t n, mw_dtype dtype,
                        const size_t *bounds) {
    return mw__shm_enter_root(c, rank, op, buf, n, dtype, bounds, 0);
}
