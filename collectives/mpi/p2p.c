/* Point-to-point between processes (the contract in collectives/reducer.h; the hierarchical
 * reducer, collectives/mpi/reducer_mpi.c, hands every transfer with a rank of another process
 * here and does the ones inside the process in shared memory).
 *
 * A transfer from rank s to rank r is three messages on tags of the pair, after the exchange's
 * (MW__MPI_P2P_TAG0): the sender's header (its n and dtype) to r, the receiver's header to s,
 * then the data. Both ranks post their header's send and the receive of the other's at once; each
 * compares the two headers as soon as the peer's is in, the same two on both sides, and only
 * when they agree is the data posted (MPI_Isend on one side, MPI_Irecv into the receiver's buffer
 * on the other). So calls that disagree fail on both sides naming both, with no data message
 * sent and the pair still in step; and a send waits for its receiver, as in shared memory
 * (rendezvous). Between one pair of processes messages of one tag arrive in the order sent, so
 * the k-th send of s to r matches r's k-th receive from s.
 *
 * Each local rank has a slot of its own (headers, requests), so the ranks of a process transfer
 * at once, from their own threads (MPI calls under mw__mpi_lock). Waiting polls with MPI_Test,
 * as the exchange does: it gives up when a device of this process aborts or after timeout_ms,
 * and then, since a posted message cannot be taken back, poisons the communicator; MPI may yet
 * write into the slots, which are kept until MPI is finalised (mw__mpi_abandon). */
#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "collectives/mpi/mpi_impl.h"
#include "collectives/reducer.h"
#include "core/alloc.h"
#include "core/error.h"

/* What each rank tells the other before any data moves. */
typedef struct wire {
    uint64_t n;
    int64_t dtype;
} wire;

enum { HDR_SEND = 0, HDR_RECV = 1, DATA = 2 }; /* tag offsets of a pair */

/* One rank's half of a transfer: its header out, the peer's in, the data. */
typedef struct half {
    int peer;  /* the other rank, -1 when this half is absent */
    int proc;  /* the peer's process, in the communicator */
    int tag;   /* the pair's first tag */
    void *buf; /* sendbuf or recvbuf */
    wire mine, theirs;
    MPI_Request out, in, data;
    int compared; /* the headers were compared (and, when they agree, the data posted) */
} half;

typedef struct slot {
    half send, recv;
    const char *what;
    int rank;
    mw_status st; /* the first failure seen */
    char msg[MW__MSG_SIZE];
} slot;

struct mw__mpi_p2p {
    MPI_Comm comm;
    int nranks;
    const int *proc_index;
    int timeout_ms;
    const _Atomic int *aborted;
    _Atomic int *poisoned;
    const char *procs;
    long tag_ub;
    slot *slots;
    _Atomic int abandoned; /* a wait gave up with messages in flight: MPI may write into slots */
};

mw_status mw__mpi_p2p_new(MPI_Comm comm, int nranks, int nlocal, const int *proc_index,
                          int timeout_ms, const _Atomic int *aborted, _Atomic int *poisoned,
                          const char *procs, mw__mpi_p2p **out) {
    *out = NULL;
    mw__mpi_p2p *x = mw__calloc(1, sizeof *x);
    slot *slots = mw__calloc((size_t)nlocal, sizeof *slots);
    if (!x || !slots) {
        mw__free(x);
        mw__free(slots);
        return mw__error(MW_ERR_NOMEM, "mpi point-to-point: out of memory");
    }
    *x = (mw__mpi_p2p){.comm = comm,
                       .nranks = nranks,
                       .proc_index = proc_index,
                       .timeout_ms = timeout_ms,
                       .aborted = aborted,
                       .poisoned = poisoned,
                       .procs = procs,
                       .tag_ub = 32767, /* what MPI guarantees */
                       .slots = slots};
    int *ub = NULL, flag = 0;
    mw__mpi_lock();
    MPI_Comm_get_attr(comm, MPI_TAG_UB, &ub, &flag);
    mw__mpi_unlock();
    if (flag && ub && *ub > x->tag_ub) x->tag_ub = *ub;
    *out = x;
    return MW_OK;
}

void mw__mpi_p2p_free(mw__mpi_p2p *x) {
    if (!x) return;
    if (atomic_load(&x->abandoned))
        mw__mpi_abandon(x->slots);
    else
        mw__free(x->slots);
    mw__free(x);
}

/* Records the slot's first failure. */
static void note(slot *s, mw_status st) {
    if (st == MW_OK || s->st != MW_OK) return;
    s->st = st;
    snprintf(s->msg, sizeof s->msg, "%s", mw_last_error());
}

static mw_status fail(mw__mpi_p2p *x, slot *s, mw_status st, const char *why, int rc) {
    atomic_store_explicit(x->poisoned, 1, memory_order_release);
    atomic_store(&x->abandoned, 1);
    int peer = s->recv.peer >= 0 ? s->recv.peer : s->send.peer;
    switch (st) {
    case MW_ERR_ABORTED:
        return mw__error(st,
                         "%s between processes %s aborted: rank %d was waiting for rank %d "
                         "because a device of this process failed",
                         s->what, x->procs, s->rank, peer);
    case MW_ERR_TIMEOUT:
        return mw__error(st,
                         "%s between processes %s timed out after %d ms: rank %d waited for rank "
                         "%d (its process failed or stalls; end the job with "
                         "mw_distributed_abort)",
                         s->what, x->procs, x->timeout_ms, s->rank, peer);
    default:
        return mw__error(st, "%s between processes %s: %s failed in MPI (%d)", s->what, x->procs,
                         why, rc);
    }
}

static MPI_Datatype type_of(int64_t dtype) { return dtype == MW_BF16 ? MPI_UINT16_T : MPI_FLOAT; }

/* Posts a half's two headers. */
static int post_headers(mw__mpi_p2p *x, half *h, int sending) {
    int rc = MPI_Isend(&h->mine, (int)sizeof h->mine, MPI_BYTE, h->proc,
                       h->tag + (sending ? HDR_SEND : HDR_RECV), x->comm, &h->out);
    if (rc == MPI_SUCCESS)
        rc = MPI_Irecv(&h->theirs, (int)sizeof h->theirs, MPI_BYTE, h->proc,
                       h->tag + (sending ? HDR_RECV : HDR_SEND), x->comm, &h->in);
    return rc;
}

mw_status mw__mpi_p2p_post(mw__mpi_p2p *x, int li, const char *what, int rank, int send_peer,
                           const void *sendbuf, int recv_peer, void *recvbuf, size_t n,
                           mw_dtype dtype) {
    slot *s = &x->slots[li];
    memset(s, 0, sizeof *s);
    s->what = what;
    s->rank = rank;
    half *hs[2] = {&s->send, &s->recv};
    int peers[2] = {send_peer, recv_peer};
    for (int k = 0; k < 2; k++) {
        half *h = hs[k];
        h->peer = peers[k];
        h->out = h->in = h->data = MPI_REQUEST_NULL;
        h->compared = h->peer < 0;
        if (h->peer < 0) continue;
        int from = k == 0 ? rank : h->peer, to = k == 0 ? h->peer : rank;
        long tag = MW__MPI_P2P_TAG0 + 3L * ((long)from * x->nranks + to);
        if (tag + DATA > x->tag_ub)
            return mw__error(MW_ERR_UNSUPPORTED,
                             "%s between processes %s: ranks %d and %d need MPI tag %ld, past "
                             "this MPI's largest (%ld)",
                             what, x->procs, from, to, tag + DATA, x->tag_ub);
        h->tag = (int)tag;
        h->proc = x->proc_index[h->peer];
        h->buf = k == 0 ? (void *)sendbuf : recvbuf;
        h->mine = (wire){(uint64_t)n, (int64_t)dtype};
    }
    int rc = MPI_SUCCESS;
    mw__mpi_lock();
    for (int k = 0; k < 2 && rc == MPI_SUCCESS; k++)
        if (hs[k]->peer >= 0) rc = post_headers(x, hs[k], k == 0);
    mw__mpi_unlock();
    return rc == MPI_SUCCESS ? MW_OK : fail(x, s, MW_ERR_DEVICE, "posting a message", rc);
}

/* Compares the headers of a half whose peer's header is in; posts the data when they agree.
 * Called with the MPI lock held. */
static int compare(mw__mpi_p2p *x, slot *s, half *h, int sending) {
    h->compared = 1;
    const wire *sent = sending ? &h->mine : &h->theirs, *got = sending ? &h->theirs : &h->mine;
    int from = sending ? s->rank : h->peer, to = sending ? h->peer : s->rank;
    if (sent->n != got->n || sent->dtype != got->dtype) {
        note(s,
             mw__error(MW_ERR_INVALID,
                       "%s: rank %d sends %llu %s elements to rank %d, but rank %d receives "
                       "%llu %s elements from rank %d",
                       s->what, from, (unsigned long long)sent->n,
                       mw__p2p_dtype_name((mw_dtype)sent->dtype), to, to,
                       (unsigned long long)got->n, mw__p2p_dtype_name((mw_dtype)got->dtype), from));
        return MPI_SUCCESS;
    }
    if (sent->n > (uint64_t)INT_MAX) {
        note(s, mw__error(MW_ERR_INVALID,
                          "%s: rank %d sends rank %d %llu elements, more than INT_MAX between "
                          "processes",
                          s->what, from, to, (unsigned long long)sent->n));
        return MPI_SUCCESS;
    }
    if (sent->n == 0) return MPI_SUCCESS;
    MPI_Datatype t = type_of(sent->dtype);
    return sending ? MPI_Isend(h->buf, (int)sent->n, t, h->proc, h->tag + DATA, x->comm, &h->data)
                   : MPI_Irecv(h->buf, (int)sent->n, t, h->proc, h->tag + DATA, x->comm, &h->data);
}

/* Advances a half; *done once all its messages are complete. Called with the MPI lock held. */
static int advance(mw__mpi_p2p *x, slot *s, half *h, int sending, int *done) {
    int flag = 0, rc = MPI_SUCCESS;
    if (!h->compared) {
        rc = MPI_Test(&h->in, &flag, MPI_STATUS_IGNORE);
        if (rc == MPI_SUCCESS && flag) rc = compare(x, s, h, sending);
    }
    int out = 0, data = 0;
    if (rc == MPI_SUCCESS) rc = MPI_Test(&h->out, &out, MPI_STATUS_IGNORE);
    if (rc == MPI_SUCCESS) rc = MPI_Test(&h->data, &data, MPI_STATUS_IGNORE);
    *done = h->compared && out && data;
    return rc;
}

mw_status mw__mpi_p2p_wait(mw__mpi_p2p *x, int li) {
    slot *s = &x->slots[li];
    double start = mw__mpi_now_ms(), deadline = start + x->timeout_ms;
    /* At most 4 bytes an element, each way present. */
    size_t bytes = 4 * (size_t)((s->send.peer >= 0 ? s->send.mine.n : 0) +
                                (s->recv.peer >= 0 ? s->recv.mine.n : 0));
    for (int i = 0;; i++) {
        int sent = 0, got = 0;
        mw__mpi_lock();
        int rc = advance(x, s, &s->send, 1, &sent);
        if (rc == MPI_SUCCESS) rc = advance(x, s, &s->recv, 0, &got);
        mw__mpi_unlock();
        if (rc != MPI_SUCCESS) return fail(x, s, MW_ERR_DEVICE, "MPI_Test", rc);
        if (sent && got) return s->st ? mw__error_copy(s->st, s->msg) : MW_OK;
        if (atomic_load_explicit(x->aborted, memory_order_acquire))
            return fail(x, s, MW_ERR_ABORTED, NULL, 0);
        if ((i & 15) != 15) continue;
        double t = mw__mpi_now_ms();
        if (t > deadline) return fail(x, s, MW_ERR_TIMEOUT, NULL, 0);
        mw__mpi_backoff(t - start, bytes);
    }
}
