/* The all-reduce between processes, on MPI point-to-point messages: a reduce-scatter, then an
 * all-gather.
 *
 * Why not MPI_Iallreduce. Measured here (Open MPI 4.1, 2 processes on one host, in-place float
 * sums): MPI_Iallreduce took 1.6-2.7x the time of the blocking MPI_Allreduce at 1 MiB and 16 MiB
 * (Open MPI 4.1's coll/libnbc reduces along a binomial tree to one process and broadcasts back
 * whenever the buffer is in place or there are fewer than 4 processes), and the blocking call
 * cannot time out, be aborted or overlap with work. The exchange below moves the bytes of a ring
 * all-reduce (each process sends and receives (P-1)/P of the buffer twice; forcing Open MPI's
 * algorithms here, its default timed like its ring at 1 MiB between two processes) and measured
 * 0.72-1.13x MPI_Allreduce at 4 KiB, 1 MiB and 16 MiB (bench/case_mpi.c times both side by
 * side).
 *
 * The algorithm. Process q owns block q of the buffer (n * q / P .. n * (q + 1) / P).
 *   1. reduce-scatter: every process sends block q to process q and receives the other
 *      processes' copies of its own block into scratch; it then sums its block in process order
 *      (process 0 + process 1 + ..., element by element);
 *   2. all-gather: every process sends its summed block to every other and receives theirs in
 *      place.
 * So every element is summed in process order by exactly one process and copied to the others:
 * the same bits on every process and on every run, whatever the message size, MPI's algorithm
 * choices or tuning parameters; with one device per process this is bitwise the order of the
 * shared-memory reducer inside one process.
 *
 * Non-blocking. start posts step 1 and returns; progress tests the requests of every operation
 * in flight (MPI_Testall: Open MPI moves data only inside MPI calls), does the sum and posts
 * step 2 as soon as step 1 of an operation is complete; wait polls until none is left, giving
 * up on an abort or after timeout_ms. Operations of one exchange use distinct tags (two per
 * operation, cycling through TAG_PERIOD), so messages of several in flight never match each
 * other's receives. Every process starts the same operations in the same order.
 *
 * Memory. Step 1 receives (P - 1) / P of the buffer into scratch. Scratch is one block shared by
 * the operations in flight; when it is too small the exchange first completes what is in flight
 * and allocates a larger one, and wait(end of batch) enlarges it to what the whole batch needed,
 * so from the second training step on no step allocates.
 *
 * Reduce-scatter, all-gather and broadcast (mw__mpi_exchange_parts) are the two steps above on
 * parts the caller chooses (a rank's part of the buffer, owned by its process) instead of the
 * exchange's own blocks, run one at a time to completion: the owner of a part sums the copies
 * with the same sum_block, so a reduce-scatter gives the all-reduce's bits whatever the parts,
 * and the all-gather step alone copies parts from their owners (a broadcast is one part). */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "collectives/mpi/mpi_impl.h"
#include "core/alloc.h"
#include "core/error.h"

#define TAG_PERIOD 8192
/* The collectives over parts: one tag after the all-reduces' (MPI guarantees at least 32767).
 * They run one at a time, and between two processes messages of one tag arrive in the order
 * sent, so every receive matches the send of the same part and collective. */
#define TAG_PARTS (2 * TAG_PERIOD)
_Static_assert(TAG_PARTS < MW__MPI_P2P_TAG0, "the exchange's tags run into the point-to-point's");
#define TILE 1024 /* floats summed at once: stays in L1 while the contributions are added */
/* Small messages take one round instead of two: every process sends its whole buffer to every
 * other, in pieces of PIECE_FLOATS, and sums all copies in process order. A piece of 2 KiB stays
 * under the eager limit of Open MPI's shared-memory transport (4 KiB with its header), so it
 * needs no rendezvous. Measured between 2 processes at 4 KiB (loaded machine, 3 runs): one 4 KiB
 * message each way (a rendezvous) 6-11 us, two rounds of 2 KiB 3.5-6.4 us, MPI_Allreduce
 * 3.5-7.4 us; with these pieces `meshwit-bench mpi` gives 0.88-0.97x MPI_Allreduce. The 8 KiB
 * limit is not tuned. */
#define SMALL_FLOATS 2048
#define PIECE_FLOATS 512
/* Waiting polls MPI_Testall without pause, as MPI's blocking calls do (a sched_yield there could
 * hand the core to another process for a whole time slice: up to 8x the time at 1 MiB on a
 * loaded machine), then naps NAP_US between polls, so that a long wait (a slower or stalled peer)
 * leaves the core to others instead of pushing them onto the peer's. It spins for SPIN_MS plus
 * the time the bytes in flight take at SPIN_BYTES_PER_MS: Open MPI moves data only inside MPI
 * calls (over shared memory the receiver copies a large message out of the sender's memory
 * within MPI_Test), so a nap while a transfer is still under way only delays it. With a flat
 * 1 ms spin the 16 MiB all-reduce between 2 processes (about 2.5 ms) napped through its second
 * half: 1.09-1.11x MPI_Allreduce on the 2-core Intel Xeon, against 0.97-0.99x sized by its
 * bytes. 1 GB/s is well under what moves here (6-7 GB/s at 16 MiB), so only a late peer naps. */
#define SPIN_MS 1.0
#define SPIN_BYTES_PER_MS 1e6
#define NAP_US 50

typedef struct xop {
    float *buf;
    size_t n;
    float *scratch; /* the other processes' copies of my block, in process order */
    size_t lo, mine;
    int tag;
    int small; /* one round: the whole buffer to every process */
    int phase; /* 0: reduce-scatter (small: the exchange) in flight, 1: all-gather, 2: done */
} xop;

struct mw__mpi_exchange {
    MPI_Comm comm;
    int me, p;
    int timeout_ms;
    const _Atomic int *aborted; /* set by another thread: give up waiting */
    _Atomic int *poisoned;      /* set here on a failure */
    const char *procs;          /* "0, 1" for messages; borrowed */
    xop ops[MW__MPI_MAX_INFLIGHT];
    int nreq;         /* per operation slot: the most a step posts */
    MPI_Request *req; /* nreq per operation slot */
    int head, count;
    unsigned seq;
    float *scratch;
    size_t cap, used, wanted; /* floats: allocated, taken by the operations in flight, asked
                                 for since the last end of batch */
    const char *coll;         /* the collective running, for messages: "all-reduce" */
    MPI_Request *preq;        /* the collectives over parts: their requests */
    size_t npreq;             /* preq's capacity */
    int pcount;               /* requests of the collective over parts running */
    size_t pbytes;            /* the bytes the latest collective over parts moves */
    int pstarted;             /* an all-gather over parts is in flight (started, not waited) */
    int parts_failed;         /* one gave up: MPI may still write into scratch */
};

void mw__mpi_backoff(double waited_ms, size_t bytes) {
    if (waited_ms < SPIN_MS + (double)bytes / SPIN_BYTES_PER_MS) return;
    struct timespec ts = {0, NAP_US * 1000L};
    nanosleep(&ts, NULL);
}

static size_t part(size_t n, int p, int q) { return n * (size_t)q / (size_t)p; }

mw_status mw__mpi_exchange_new(MPI_Comm comm, int timeout_ms, const _Atomic int *aborted,
                               _Atomic int *poisoned, const char *procs, mw__mpi_exchange **out) {
    *out = NULL;
    mw__mpi_exchange *x = mw__calloc(1, sizeof *x);
    if (!x) return mw__error(MW_ERR_NOMEM, "mpi exchange: out of memory");
    x->comm = comm;
    MPI_Comm_rank(comm, &x->me);
    MPI_Comm_size(comm, &x->p);
    x->timeout_ms = timeout_ms;
    x->aborted = aborted;
    x->poisoned = poisoned;
    x->procs = procs;
    x->coll = "all-reduce";
    int pieces = (SMALL_FLOATS + PIECE_FLOATS - 1) / PIECE_FLOATS;
    x->nreq = 2 * (x->p > 1 ? x->p - 1 : 1) * pieces;
    size_t nreq = (size_t)MW__MPI_MAX_INFLIGHT * (size_t)x->nreq;
    x->req = mw__malloc(nreq * sizeof *x->req);
    if (!x->req) {
        mw__free(x);
        return mw__error(MW_ERR_NOMEM, "mpi exchange: out of memory");
    }
    for (size_t i = 0; i < nreq; i++) x->req[i] = MPI_REQUEST_NULL;
    *out = x;
    return MW_OK;
}

/* Memory that operations still in flight after a failure may yet receive into (an exchange's
 * scratch, the point-to-point slots): kept until MPI is finalised (then nothing can land in it),
 * and still reachable meanwhile. */
typedef struct abandoned {
    struct abandoned *next;
    void *scratch;
} abandoned;
static abandoned *graveyard;
static pthread_mutex_t graveyard_mu = PTHREAD_MUTEX_INITIALIZER;

void mw__mpi_exchange_release_abandoned(void) {
    pthread_mutex_lock(&graveyard_mu);
    while (graveyard) {
        abandoned *a = graveyard;
        graveyard = a->next;
        mw__free(a->scratch);
        mw__free(a);
    }
    pthread_mutex_unlock(&graveyard_mu);
}

void mw__mpi_abandon(void *p) {
    if (!p) return;
    abandoned *a = mw__malloc(sizeof *a);
    /* Without memory for the record the buffer stays allocated, unreachable: still safe. */
    if (a) {
        pthread_mutex_lock(&graveyard_mu);
        *a = (abandoned){graveyard, p};
        graveyard = a;
        pthread_mutex_unlock(&graveyard_mu);
    }
}

void mw__mpi_exchange_free(mw__mpi_exchange *x) {
    if (!x) return;
    if (x->count == 0 && !x->parts_failed)
        mw__free(x->scratch);
    else
        mw__mpi_abandon(x->scratch);
    mw__free(x->req);
    mw__free(x->preq);
    mw__free(x);
}

static mw_status fail(mw__mpi_exchange *x, mw_status st, const char *what, int rc) {
    atomic_store_explicit(x->poisoned, 1, memory_order_release);
    switch (st) {
    case MW_ERR_ABORTED:
        return mw__error(st,
                         "%s between processes %s aborted because a device of this process "
                         "failed",
                         x->coll, x->procs);
    case MW_ERR_TIMEOUT:
        return mw__error(st,
                         "%s between processes %s: not every process arrived within %d ms (one "
                         "of them failed or stalls; end the job with mw_distributed_abort)",
                         x->coll, x->procs, x->timeout_ms);
    case MW_ERR_NOMEM:
        return mw__error(st, "%s between processes %s: out of memory for %s", x->coll, x->procs,
                         what);
    case MW_ERR_INVALID:
        return mw__error(st, "%s between processes %s: %s", x->coll, x->procs, what);
    default:
        return mw__error(st, "%s between processes %s: %s failed in MPI (%d)", x->coll, x->procs,
                         what, rc);
    }
}

/* Posts one step of op: receives first, then sends, each to the processes after this one first
 * so that not every process starts with process 0. */
static mw_status post(mw__mpi_exchange *x, xop *op, MPI_Request *req) {
    int p = x->p, me = x->me, rc = MPI_SUCCESS, k = 0;
    for (int i = k; i < x->nreq; i++) req[i] = MPI_REQUEST_NULL;
    mw__mpi_lock();
    for (size_t off = 0; op->small && off < op->n && rc == MPI_SUCCESS; off += PIECE_FLOATS) {
        int len = (int)(op->n - off < PIECE_FLOATS ? op->n - off : PIECE_FLOATS);
        for (int i = 1; i < p && rc == MPI_SUCCESS; i++) {
            int q = (me + i) % p;
            rc = MPI_Irecv(op->scratch + (size_t)(q < me ? q : q - 1) * op->n + off, len, MPI_FLOAT,
                           q, op->tag, x->comm, &req[k++]);
        }
        for (int i = 1; i < p && rc == MPI_SUCCESS; i++)
            rc =
                MPI_Isend(op->buf + off, len, MPI_FLOAT, (me + i) % p, op->tag, x->comm, &req[k++]);
    }
    if (op->small) goto posted;
    for (int i = 1; i < p && rc == MPI_SUCCESS; i++) {
        int q = (me + i) % p;
        size_t qlo = part(op->n, p, q), qlen = part(op->n, p, q + 1) - qlo;
        if (op->phase == 0)
            rc = MPI_Irecv(op->scratch + (size_t)(q < me ? q : q - 1) * op->mine, (int)op->mine,
                           MPI_FLOAT, q, op->tag, x->comm, &req[k++]);
        else
            rc = MPI_Irecv(op->buf + qlo, (int)qlen, MPI_FLOAT, q, op->tag + 1, x->comm, &req[k++]);
    }
    for (int i = 1; i < p && rc == MPI_SUCCESS; i++) {
        int q = (me + i) % p;
        size_t qlo = part(op->n, p, q), qlen = part(op->n, p, q + 1) - qlo;
        if (op->phase == 0)
            rc = MPI_Isend(op->buf + qlo, (int)qlen, MPI_FLOAT, q, op->tag, x->comm, &req[k++]);
        else
            rc = MPI_Isend(op->buf + op->lo, (int)op->mine, MPI_FLOAT, q, op->tag + 1, x->comm,
                           &req[k++]);
    }
posted:
    mw__mpi_unlock();
    return rc == MPI_SUCCESS ? MW_OK : fail(x, MW_ERR_DEVICE, "posting a message", rc);
}

static const float *copy_of(const mw__mpi_exchange *x, const xop *op, int q) {
    return q == x->me ? op->buf + op->lo : op->scratch + (size_t)(q < x->me ? q : q - 1) * op->mine;
}

/* My block := the sum of every process's copy, in process order. Process 0 adds the others into
 * its own copy in place, and so may process 1 of 2 (float addition commutes: c0 + c1 is c1 + c0
 * bit for bit); anyone else sums tile by tile starting from process 0's copy. */
static void sum_block(const mw__mpi_exchange *x, xop *op) {
    float *restrict own = op->buf + op->lo;
    if (x->me == 0 || x->p == 2) {
        for (int q = 0; q < x->p; q++) {
            if (q == x->me) continue;
            const float *restrict c = copy_of(x, op, q);
            for (size_t j = 0; j < op->mine; j++) own[j] += c[j];
        }
        return;
    }
    float acc[TILE];
    for (size_t t = 0; t < op->mine; t += TILE) {
        size_t m = op->mine - t < TILE ? op->mine - t : TILE;
        memcpy(acc, copy_of(x, op, 0) + t, m * sizeof *acc);
        for (int q = 1; q < x->p; q++) {
            const float *restrict c = copy_of(x, op, q) + t;
            for (size_t j = 0; j < m; j++) acc[j] += c[j];
        }
        memcpy(own + t, acc, m * sizeof *acc);
    }
}

static mw_status progress_parts(mw__mpi_exchange *x);

mw_status mw__mpi_exchange_progress(mw__mpi_exchange *x) {
    int nreq = x->nreq;
    for (int i = 0; i < x->count; i++) {
        int slot = (x->head + i) % MW__MPI_MAX_INFLIGHT;
        xop *op = &x->ops[slot];
        if (op->phase == 2) continue;
        MPI_Request *req = x->req + (size_t)slot * (size_t)nreq;
        int done = 0;
        mw__mpi_lock();
        int rc = MPI_Testall(nreq, req, &done, MPI_STATUSES_IGNORE);
        mw__mpi_unlock();
        if (rc != MPI_SUCCESS) return fail(x, MW_ERR_DEVICE, "MPI_Testall", rc);
        if (!done) continue;
        if (op->phase == 1) {
            op->phase = 2;
            continue;
        }
        sum_block(x, op);
        if (op->small) {
            op->phase = 2;
            continue;
        }
        op->phase = 1;
        mw_status st = post(x, op, req);
        if (st) return st;
    }
    while (x->count && x->ops[x->head].phase == 2) {
        x->head = (x->head + 1) % MW__MPI_MAX_INFLIGHT;
        if (--x->count == 0) x->used = 0;
    }
    return progress_parts(x);
}

/* Makes scratch hold at least floats; only while nothing is in flight. */
static mw_status grow(mw__mpi_exchange *x, size_t floats) {
    if (floats <= x->cap) return MW_OK;
    mw__free(x->scratch);
    x->cap = 0;
    x->scratch = mw__malloc(floats * sizeof *x->scratch);
    if (!x->scratch) return fail(x, MW_ERR_NOMEM, "its scratch", 0);
    x->cap = floats;
    return MW_OK;
}

static mw_status test_parts(mw__mpi_exchange *x, int *done);

/* Polls test until it reports done: MW_ERR_ABORTED when *aborted is set, MW_ERR_TIMEOUT after the
 * exchange's timeout. */
static mw_status poll_until(mw__mpi_exchange *x, mw_status (*test)(mw__mpi_exchange *, int *)) {
    double start = mw__mpi_now_ms(), deadline = start + x->timeout_ms;
    /* What the operations in flight move (both steps), and the collective over parts where one
     * is: the one this call waits for, or an all-gather started and not yet waited. */
    size_t bytes = test == test_parts || x->pstarted ? x->pbytes : 0;
    for (int i = 0; i < x->count; i++)
        bytes += 2 * x->ops[(x->head + i) % MW__MPI_MAX_INFLIGHT].n * sizeof(float);
    for (int i = 0;; i++) {
        int done = 0;
        mw_status st = test(x, &done);
        if (st || done) return st;
        if (atomic_load_explicit(x->aborted, memory_order_acquire))
            return fail(x, MW_ERR_ABORTED, NULL, 0);
        if ((i & 15) != 15) continue;
        double t = mw__mpi_now_ms();
        if (t > deadline) return fail(x, MW_ERR_TIMEOUT, NULL, 0);
        mw__mpi_backoff(t - start, bytes);
    }
}

/* Tests the all-gather over parts in flight, if any. */
static mw_status progress_parts(mw__mpi_exchange *x) {
    if (!x->pstarted) return MW_OK;
    int done = 0;
    mw_status st = test_parts(x, &done);
    if (st) x->parts_failed = 1;
    if (st || done) x->pstarted = 0;
    if (done) x->coll = "all-reduce";
    return st;
}

static mw_status test_inflight(mw__mpi_exchange *x, int *done) {
    mw_status st = x->count ? mw__mpi_exchange_progress(x) : progress_parts(x);
    *done = x->count == 0 && !x->pstarted;
    return st;
}

mw_status mw__mpi_exchange_wait(mw__mpi_exchange *x, int end_of_batch) {
    mw_status st = poll_until(x, test_inflight);
    if (st || !end_of_batch) return st;
    size_t wanted = x->wanted;
    x->wanted = 0;
    return grow(x, wanted);
}

mw_status mw__mpi_exchange_start(mw__mpi_exchange *x, float *buf, size_t n) {
    if (n == 0 || x->p < 2) return MW_OK;
    if (n / (size_t)x->p >= (size_t)INT_MAX)
        return fail(x, MW_ERR_INVALID, "a message of more than INT_MAX floats per process", 0);
    mw_status st;
    if (x->count == MW__MPI_MAX_INFLIGHT && (st = mw__mpi_exchange_wait(x, 0))) return st;
    xop op = {.buf = buf, .n = n, .small = n <= SMALL_FLOATS};
    /* The small path's block is the whole buffer. */
    op.lo = op.small ? 0 : part(n, x->p, x->me);
    op.mine = op.small ? n : part(n, x->p, x->me + 1) - op.lo;
    op.tag = (int)(2 * (x->seq++ % TAG_PERIOD));
    size_t need = (size_t)(x->p - 1) * op.mine;
    if (x->used + need > x->cap) {
        if (x->count && (st = mw__mpi_exchange_wait(x, 0))) return st;
        if (x->used + need > x->cap && (st = grow(x, need))) return st;
    }
    x->wanted += need;
    op.scratch = x->scratch + x->used;
    x->used += need;
    int slot = (x->head + x->count) % MW__MPI_MAX_INFLIGHT;
    x->ops[slot] = op;
    x->count++;
    return post(x, &x->ops[slot], x->req + (size_t)slot * (size_t)x->nreq);
}

int mw__mpi_exchange_pending(const mw__mpi_exchange *x) { return x ? x->count : 0; }

static mw_status test_parts(mw__mpi_exchange *x, int *done) {
    mw__mpi_lock();
    int rc = MPI_Testall(x->pcount, x->preq, done, MPI_STATUSES_IGNORE);
    mw__mpi_unlock();
    return rc == MPI_SUCCESS ? MW_OK : fail(x, MW_ERR_DEVICE, "MPI_Testall", rc);
}

/* Posts the messages of a collective over parts: for a part it does not own, a process sends
 * its copy to the owner (sum) or receives the owner's (gather); the owner receives every other
 * copy into scratch, in the layout sum_block reads (sum), or sends its own to every other
 * process (gather). */
static mw_status post_parts(mw__mpi_exchange *x, float *buf, const mw__mpi_part *parts, int nparts,
                            int sum) {
    int p = x->p, me = x->me, rc = MPI_SUCCESS, k = 0;
    size_t off = 0;
    x->pbytes = 0;
    mw__mpi_lock();
    for (int j = 0; j < nparts && rc == MPI_SUCCESS; j++) {
        int len = (int)(parts[j].hi - parts[j].lo), owner = parts[j].owner;
        float *at = buf + parts[j].lo;
        if (len == 0) continue;
        x->pbytes += (size_t)len * sizeof(float) * (size_t)(owner != me ? 1 : p - 1);
        if (owner != me) {
            rc = sum ? MPI_Isend(at, len, MPI_FLOAT, owner, TAG_PARTS, x->comm, &x->preq[k++])
                     : MPI_Irecv(at, len, MPI_FLOAT, owner, TAG_PARTS, x->comm, &x->preq[k++]);
            continue;
        }
        for (int i = 1; i < p && rc == MPI_SUCCESS; i++) {
            int q = (me + i) % p;
            float *copy = x->scratch + off + (size_t)(q < me ? q : q - 1) * (size_t)len;
            rc = sum ? MPI_Irecv(copy, len, MPI_FLOAT, q, TAG_PARTS, x->comm, &x->preq[k++])
                     : MPI_Isend(at, len, MPI_FLOAT, q, TAG_PARTS, x->comm, &x->preq[k++]);
        }
        if (sum) off += (size_t)(p - 1) * (size_t)len;
    }
    mw__mpi_unlock();
    x->pcount = k;
    return rc == MPI_SUCCESS ? MW_OK : fail(x, MW_ERR_DEVICE, "posting a message", rc);
}

/* Scratch and requests for the parts, kept for the next call (nothing is in flight). */
static mw_status reserve_parts(mw__mpi_exchange *x, const mw__mpi_part *parts, int nparts,
                               int sum) {
    size_t floats = 0, nreq = 0;
    for (int j = 0; j < nparts; j++) {
        size_t len = parts[j].hi - parts[j].lo;
        if (len == 0) continue;
        if (len > (size_t)INT_MAX)
            return fail(x, MW_ERR_INVALID, "a part of more than INT_MAX floats", 0);
        if (parts[j].owner != x->me) {
            nreq++;
            continue;
        }
        nreq += (size_t)(x->p - 1);
        if (sum) floats += (size_t)(x->p - 1) * len;
    }
    mw_status st = grow(x, floats);
    if (st || nreq <= x->npreq) return st;
    mw__free(x->preq);
    x->npreq = 0;
    if (!(x->preq = mw__malloc(nreq * sizeof *x->preq)))
        return fail(x, MW_ERR_NOMEM, "requests", 0);
    x->npreq = nreq;
    return MW_OK;
}

/* Completes what is in flight, then posts a collective over parts, named what in messages. */
static mw_status post_collective(mw__mpi_exchange *x, float *buf, const mw__mpi_part *parts,
                                 int nparts, int sum, const char *what) {
    mw_status st = mw__mpi_exchange_wait(x, 0);
    if (st) return st;
    x->coll = what;
    if (!(st = reserve_parts(x, parts, nparts, sum))) st = post_parts(x, buf, parts, nparts, sum);
    if (st) x->parts_failed = 1; /* receives may still land in scratch */
    return st;
}

mw_status mw__mpi_exchange_parts(mw__mpi_exchange *x, float *buf, const mw__mpi_part *parts,
                                 int nparts, int sum, const char *what) {
    if (x->p < 2) return mw__mpi_exchange_wait(x, 0);
    mw_status st = post_collective(x, buf, parts, nparts, sum, what);
    if (!st && (st = poll_until(x, test_parts))) x->parts_failed = 1;
    size_t off = 0;
    for (int j = 0; sum && !st && j < nparts; j++) {
        size_t len = parts[j].hi - parts[j].lo;
        if (len == 0 || parts[j].owner != x->me) continue;
        xop op = {
            .buf = buf, .n = len, .scratch = x->scratch + off, .lo = parts[j].lo, .mine = len};
        sum_block(x, &op);
        off += (size_t)(x->p - 1) * len;
    }
    x->coll = "all-reduce";
    return st;
}

mw_status mw__mpi_exchange_gather_start(mw__mpi_exchange *x, float *buf, const mw__mpi_part *parts,
                                        int nparts, const char *what) {
    if (x->p < 2) return mw__mpi_exchange_wait(x, 0);
    mw_status st = post_collective(x, buf, parts, nparts, 0, what);
    x->pstarted = !st && x->pcount > 0;
    if (!x->pstarted) x->coll = "all-reduce"; /* else named in messages until it completes */
    return st;
}
