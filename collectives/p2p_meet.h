/* Internal: how a reducer of device memory (collectives/cuda/reducer_local.c,
 * collectives/nccl/reducer_nccl.c, collectives/mpi/nccl_mpi.c) meets for a point-to-point call
 * before any data moves, through the send, recv and sendrecv of its host communicator (shared
 * memory, or the hierarchical reducer across processes), which bring the matching per pair, the
 * abort and the timeout. Two rounds:
 *   1. every sender tells its receiver its call (and where its data is ready);
 *   2. every receiver, having checked the two calls (and queued its part), tells its sender
 *      its own call (and when the data will have arrived).
 * The sender then checks the same two calls, so both sides fail alike on a disagreement
 * (mw__p2p_check) or both go on. A sendrecv takes both roles; each round's messages run one way
 * round a ring, so a ring of sendrecv meets without waiting in a circle. A sendrecv against the
 * peer's separate send and recv would cross the rounds (the host calls are rendezvous), so it
 * is detected and refused (mw__p2p_meet). */
#ifndef MW__P2P_MEET_H
#define MW__P2P_MEET_H

#include <stdint.h>

#include "collectives/reducer.h"
#include "core/error.h"

/* One side's call, as the other side reads it. */
typedef struct mw__p2p_call {
    uint64_t n;
    int32_t dtype;
    int32_t round; /* 1 or 2: which round's message this is */
    void *buf;     /* in this process's address space (cuda-local reads it) */
    void *event;   /* cuda-local: the event the other side's stream waits for, or NULL */
} mw__p2p_call;

/* One round: this rank's call *out to rank `to` and the call of rank `from` into *in (either -1:
 * none), on host communicator hc of reducer host. The messages of both rounds go through the
 * same pairs, so a rank whose sendrecv meets a peer's separate send and recv would take the
 * other round's message for this one's: that is refused (MW_ERR_INVALID, the host communicator
 * aborted, as the peer would wait). */
static inline mw_status mw__p2p_meet(const mw__reducer_vtable *host, mw__comm *hc, const char *what,
                                     int rank, int round, int to, mw__p2p_call *out, int from,
                                     mw__p2p_call *in) {
    size_t n = sizeof *out / sizeof(float);
    out->round = round;
    in->round = round;
    mw_status st = to >= 0 && from >= 0 ? host->sendrecv(hc, rank, to, out, from, in, n, MW_F32)
                   : to >= 0            ? host->send(hc, rank, to, out, n, MW_F32)
                                        : host->recv(hc, rank, from, in, n, MW_F32);
    if (st || in->round == round) return st;
    host->abort(hc);
    return mw__error(MW_ERR_INVALID,
                     "%s: rank %d's call met a call of rank %d that pairs differently (a sendrecv "
                     "against a separate send and recv?): on this reducer a sendrecv pairs with "
                     "the peer's sendrecv, and a send with a recv",
                     what, rank, from);
}

/* MW_OK when the call of sender `from` and that of its receiver `to` agree; else
 * MW_ERR_INVALID naming both, worded as on every reducer. */
static inline mw_status mw__p2p_check(const char *what, int from, const mw__p2p_call *sent, int to,
                                      const mw__p2p_call *got) {
    if (sent->n == got->n && sent->dtype == got->dtype) return MW_OK;
    return mw__error(MW_ERR_INVALID,
                     "%s: rank %d sends %llu %s elements to rank %d, but rank %d receives %llu %s "
                     "elements from rank %d",
                     what, from, (unsigned long long)sent->n,
                     mw__p2p_dtype_name((mw_dtype)sent->dtype), to, to, (unsigned long long)got->n,
                     mw__p2p_dtype_name((mw_dtype)got->dtype), from);
}

#endif
