/* The shared-memory reducer's point-to-point calls against their definition (reducer.h): what a
 * rank receives is what its peer sent, bit for bit (f32 and bf16, NaN payloads included), for
 * every ordered pair of 2, 3 and 4 ranks and lengths 0, 1, odd and large; rings of sendrecv;
 * the order of several messages per pair while another sender interleaves; calls that disagree
 * refused on both sides, naming both; abort, timeout and reset; bad arguments; an all-gather in
 * flight completed first; and ranks run as a gang of tasks on one thread. Worker threads only
 * record what they saw; the test thread asserts after joining them. */
#define _GNU_SOURCE /* syscall(SYS_gettid) */
#include <criterion/criterion.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "collectives/fiber.h"
#include "collectives/reducer.h"
#include "collectives/wait.h"
#include "core/error.h"
#include "tests/parallel/ranks.h"

#define MAXP 4
#define LARGE ((1u << 20) + 3)

static const mw__reducer_vtable *R = &mw__reducer_shm;

static void record(worker *w, mw_status st) {
    if (st && !w->st) {
        w->st = st;
        snprintf(w->msg, sizeof w->msg, "%s", mw_last_error());
    }
}

static void assert_all_ok(worker *w, int p, const char *what) {
    for (int r = 0; r < p; r++) {
        cr_assert_eq(w[r].st, MW_OK, "%s: rank %d got %s: %s", what, r, mw_status_name(w[r].st),
                     w[r].msg);
        cr_assert_eq(w[r].wrong, 0, "%s: rank %d received %ld wrong elements", what, r, w[r].wrong);
    }
}

/* Bytes of message k from rank r: every bit pattern, NaNs and infinities included. */
static uint8_t byte_of(int r, int k, size_t i) {
    uint32_t x = (uint32_t)(r * 131 + k * 7919 + 1) * 2654435761u ^ (uint32_t)i * 40503u;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    return (uint8_t)(x >> 17);
}

static void fill(uint8_t *buf, size_t bytes, int r, int k) {
    for (size_t i = 0; i < bytes; i++) buf[i] = byte_of(r, k, i);
}

/* Counts the bytes of buf that are not message k of rank r; past `bytes`, the canary 0xa5. */
static long wrong_bytes(const uint8_t *buf, size_t bytes, size_t room, int r, int k) {
    long bad = 0;
    for (size_t i = 0; i < bytes; i++) bad += buf[i] != byte_of(r, k, i);
    for (size_t i = bytes; i < room; i++) bad += buf[i] != 0xa5;
    return bad;
}

static size_t esize(mw_dtype d) { return d == MW_BF16 ? 2 : 4; }

/* ---- every ordered pair: rank `from` sends, rank `to` receives, the others stand by ---- */

typedef struct pairs_arg {
    size_t n;
    mw_dtype dtype;
} pairs_arg;

static void do_pairs(worker *w) {
    const pairs_arg *a = w->arg;
    size_t bytes = a->n * esize(a->dtype), room = bytes + 64;
    uint8_t *buf = malloc(room);
    if (!buf) {
        R->abort(w->comm);
        record(w, MW_ERR_NOMEM);
        return;
    }
    /* Every rank walks the same list of pairs, so the calls pair up in that order. */
    for (int from = 0; from < w->p && !w->st; from++)
        for (int to = 0; to < w->p && !w->st; to++) {
            if (from == to) continue;
            int k = from * MAXP + to;
            if (w->rank == from) {
                fill(buf, bytes, from, k);
                record(w, R->send(w->comm, w->rank, to, buf, a->n, a->dtype));
                /* The sender's buffer is left as it was. */
                w->wrong += wrong_bytes(buf, bytes, 0, from, k);
            } else if (w->rank == to) {
                memset(buf, 0xa5, room);
                record(w, R->recv(w->comm, w->rank, from, buf, a->n, a->dtype));
                if (!w->st) w->wrong += wrong_bytes(buf, bytes, room, from, k);
            }
        }
    free(buf);
}

Test(reducer_p2p, every_pair_receives_what_was_sent_bit_for_bit, .timeout = 120) {
    static const size_t lens[] = {0, 1, 7, 1023, LARGE};
    static const mw_dtype dtypes[] = {MW_F32, MW_BF16};
    for (int p = 2; p <= 4; p++) {
        mw__comm *comm = shm_comm(p, 0, NULL);
        for (size_t k = 0; k < sizeof lens / sizeof *lens; k++)
            for (int d = 0; d < 2; d++) {
                worker w[MAXP] = {0};
                pairs_arg a = {lens[k], dtypes[d]};
                run_ranks(comm, p, w, do_pairs, &a);
                char what[64];
                snprintf(what, sizeof what, "p %d n %zu %s", p, lens[k], d ? "bf16" : "f32");
                assert_all_ok(w, p, what);
            }
        R->comm_free(comm);
    }
}

/* ---- rings of sendrecv: every rank sends to rank + step, receives from rank - step ---- */

typedef struct ring_arg {
    size_t n;
    mw_dtype dtype;
    int step;
    int rounds;
} ring_arg;

static void do_ring(worker *w) {
    const ring_arg *a = w->arg;
    int p = w->p, to = (w->rank + a->step + p) % p, from = (w->rank - a->step + p) % p;
    size_t bytes = a->n * esize(a->dtype), room = bytes + 64;
    uint8_t *out = malloc(bytes ? bytes : 1), *in = malloc(room);
    for (int k = 0; out && in && k < a->rounds && !w->st; k++) {
        fill(out, bytes, w->rank, k);
        memset(in, 0xa5, room);
        record(w, R->sendrecv(w->comm, w->rank, to, out, from, in, a->n, a->dtype));
        if (!w->st) w->wrong += wrong_bytes(in, bytes, room, from, k);
        w->wrong += wrong_bytes(out, bytes, 0, w->rank, k);
    }
    if (!out || !in) record(w, MW_ERR_NOMEM), R->abort(w->comm);
    free(out);
    free(in);
}

Test(reducer_p2p, a_ring_of_sendrecv_passes_every_buffer_on, .timeout = 120) {
    static const size_t lens[] = {0, 1, 513, LARGE};
    for (int p = 1; p <= 4; p++) {
        mw__comm *comm = shm_comm(p, 0, NULL);
        for (size_t k = 0; k < sizeof lens / sizeof *lens; k++)
            for (int d = 0; d < 2; d++)
                for (int step = -1; step <= 1; step++) { /* step 0: each rank to itself */
                    worker w[MAXP] = {0};
                    ring_arg a = {lens[k], d ? MW_BF16 : MW_F32, step, lens[k] > 1000 ? 2 : 20};
                    run_ranks(comm, p, w, do_ring, &a);
                    char what[80];
                    snprintf(what, sizeof what, "ring p %d n %zu %s step %d", p, lens[k],
                             d ? "bf16" : "f32", step);
                    assert_all_ok(w, p, what);
                }
        R->comm_free(comm);
    }
}

/* ---- order: ranks 0 and 2 each send rank 1 a sequence, rank 1 alternates its receives ---- */

#define SEQ 40

static size_t seq_n(int from, int k) { return (size_t)(k * 37 + from * 11) % 700; }

static void do_sequences(worker *w) {
    uint8_t *buf = malloc(700 * 4 + 64);
    for (int k = 0; buf && k < SEQ && !w->st; k++) {
        if (w->rank == 0 || w->rank == 2) {
            size_t n = seq_n(w->rank, k);
            fill(buf, n * 4, w->rank, k);
            record(w, R->send(w->comm, w->rank, 1, buf, n, MW_F32));
        } else if (w->rank == 1) {
            for (int from = 0; from <= 2 && !w->st; from += 2) {
                size_t n = seq_n(from, k);
                memset(buf, 0xa5, n * 4 + 64);
                record(w, R->recv(w->comm, 1, from, buf, n, MW_F32));
                if (!w->st) w->wrong += wrong_bytes(buf, n * 4, n * 4 + 64, from, k);
            }
        }
    }
    if (!buf) record(w, MW_ERR_NOMEM), R->abort(w->comm);
    free(buf);
}

Test(reducer_p2p, messages_of_a_pair_arrive_in_order, .timeout = 60) {
    mw__comm *comm = shm_comm(3, 0, NULL);
    worker w[MAXP] = {0};
    run_ranks(comm, 3, w, do_sequences, NULL);
    assert_all_ok(w, 3, "sequences");
    R->comm_free(comm);
}

/* Two pairs exchange at once, unaware of each other; then every rank all-reduces: the
 * point-to-point calls took no step of the collectives. */
static void do_pairs_then_allreduce(worker *w) {
    int peer = w->rank ^ 1;
    float out[64], in[64], sum[3] = {1, 2, (float)w->rank};
    for (int k = 0; k < 100 && !w->st; k++) {
        for (int i = 0; i < 64; i++) out[i] = (float)(w->rank * 1000 + k * 64 + i);
        record(w, R->sendrecv(w->comm, w->rank, peer, out, peer, in, 64, MW_F32));
        for (int i = 0; !w->st && i < 64; i++)
            w->wrong += in[i] != (float)(peer * 1000 + k * 64 + i);
    }
    if (!w->st) record(w, R->allreduce_sum(w->comm, w->rank, sum, 3, MW_F32));
    w->wrong += !w->st && (sum[0] != 4 || sum[1] != 8 || sum[2] != 6);
}

Test(reducer_p2p, pairs_meet_apart_from_the_collectives, .timeout = 60) {
    mw__comm *comm = shm_comm(4, 0, NULL);
    worker w[MAXP] = {0};
    run_ranks(comm, 4, w, do_pairs_then_allreduce, NULL);
    assert_all_ok(w, 4, "pairs then all-reduce");
    R->comm_free(comm);
}

/* ---- calls that disagree ---- */

typedef struct mismatch_arg {
    size_t n[2];
    mw_dtype dtype[2];
    int sendrecv; /* rank 1 receives with sendrecv (and sends back to rank 0, which receives) */
} mismatch_arg;

static void do_mismatch(worker *w) {
    const mismatch_arg *a = w->arg;
    float buf[64], back[64];
    for (int i = 0; i < 64; i++) buf[i] = back[i] = (float)(w->rank * 100 + i);
    mw_status st;
    if (w->rank == 0) {
        st = R->send(w->comm, 0, 1, buf, a->n[0], a->dtype[0]);
        record(w, st);
        /* The exchange back (sendrecv's send half) still pairs up. */
        if (a->sendrecv) {
            mw_status back_st = R->recv(w->comm, 0, 1, back, a->n[1], a->dtype[1]);
            for (size_t i = 0; i < a->n[1]; i++) w->wrong += back_st || back[i] != (float)(100 + i);
        }
    } else {
        st = a->sendrecv ? R->sendrecv(w->comm, 1, 0, buf, 0, back, a->n[1], a->dtype[1])
                         : R->recv(w->comm, 1, 0, back, a->n[1], a->dtype[1]);
        record(w, st);
        for (int i = 0; i < 64; i++) w->wrong += back[i] != (float)(100 + i); /* untouched */
    }
}

Test(reducer_p2p, calls_that_disagree_fail_on_both_sides_naming_both, .timeout = 60) {
    static const mismatch_arg cases[] = {
        {{5, 4}, {MW_F32, MW_F32}, 0},
        {{8, 8}, {MW_F32, MW_BF16}, 0},
        {{0, 1}, {MW_BF16, MW_BF16}, 0},
    };
    static const char *const want[] = {
        "rank 0 sends 5 f32 elements to rank 1, but rank 1 receives 4 f32 elements from rank 0",
        "rank 0 sends 8 f32 elements to rank 1, but rank 1 receives 8 bf16 elements from rank 0",
        "rank 0 sends 0 bf16 elements to rank 1, but rank 1 receives 1 bf16 elements from rank 0",
    };
    mw__comm *comm = shm_comm(2, 5000, NULL);
    for (size_t c = 0; c < 3; c++) {
        worker w[2] = {0};
        run_ranks(comm, 2, w, do_mismatch, (void *)&cases[c]);
        for (int r = 0; r < 2; r++) {
            cr_assert_eq(w[r].st, MW_ERR_INVALID, "case %zu rank %d: %s: %s", c, r,
                         mw_status_name(w[r].st), w[r].msg);
            cr_assert(strstr(w[r].msg, want[c]), "case %zu rank %d: \"%s\" lacks \"%s\"", c, r,
                      w[r].msg, want[c]);
            cr_assert_eq(w[r].wrong, 0, "case %zu rank %d: a buffer was written", c, r);
        }
    }
    /* Nothing to reset: both ranks stayed in step, and the communicator works. */
    worker w[2] = {0};
    pairs_arg a = {333, MW_F32};
    run_ranks(comm, 2, w, do_pairs, &a);
    assert_all_ok(w, 2, "after the mismatches");
    R->comm_free(comm);
}

Test(reducer_p2p, a_sendrecv_that_disagrees_still_completes_its_other_half, .timeout = 60) {
    mismatch_arg a = {{5, 6}, {MW_F32, MW_F32}, 1};
    mw__comm *comm = shm_comm(2, 5000, NULL);
    worker w[2] = {0};
    run_ranks(comm, 2, w, do_mismatch, &a);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(w[r].st, MW_ERR_INVALID, "rank %d: %s", r, w[r].msg);
        cr_assert(strstr(w[r].msg, "rank 0 sends 5 f32 elements to rank 1, but rank 1 receives 6"),
                  "rank %d: %s", r, w[r].msg);
    }
    cr_assert_eq(w[0].wrong, 0, "rank 0 did not receive rank 1's 6 elements");
    cr_assert_eq(w[1].wrong, 0, "rank 1's receive buffer was written");
    R->comm_free(comm);
}

/* Rank 1's sendrecv sends 6 elements to rank 0, which receives 5 (the send half fails), and
 * receives 6 from rank 0, which sends them only 50 ms later: the sendrecv returns after they
 * arrived, not when its send half failed (a receive left posted would be written after its
 * owner returned). */
static void do_send_half_fails(worker *w) {
    float buf[8], back[8];
    for (int i = 0; i < 8; i++) buf[i] = (float)(w->rank * 100 + i), back[i] = -1;
    if (w->rank == 0) {
        record(w, R->recv(w->comm, 0, 1, back, 5, MW_F32));
        struct timespec nap = {0, 50 * 1000000L};
        nanosleep(&nap, NULL);
        mw_status st = R->send(w->comm, 0, 1, buf, 6, MW_F32);
        w->wrong += st != MW_OK;
        for (int i = 0; i < 8; i++) w->wrong += back[i] != -1; /* untouched */
        return;
    }
    record(w, R->sendrecv(w->comm, 1, 0, buf, 0, back, 6, MW_F32));
    float seen[8];
    memcpy(seen, back, sizeof seen); /* at once, while rank 0 may still be asleep */
    for (int i = 0; i < 6; i++) w->wrong += seen[i] != (float)i;
    w->wrong += seen[6] != -1 || seen[7] != -1;
}

Test(reducer_p2p, a_sendrecv_whose_send_fails_still_waits_for_its_receive, .timeout = 60) {
    mw__comm *comm = shm_comm(2, 5000, NULL);
    worker w[2] = {0};
    run_ranks(comm, 2, w, do_send_half_fails, NULL);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(w[r].st, MW_ERR_INVALID, "rank %d: %s", r, w[r].msg);
        cr_assert(strstr(w[r].msg, "rank 1 sends 6 f32 elements to rank 0, but rank 0 receives 5"),
                  "rank %d: %s", r, w[r].msg);
        cr_assert_eq(w[r].wrong, 0, "rank %d: %ld elements wrong", r, w[r].wrong);
    }
    R->comm_free(comm);
}

/* ---- abort, timeout, reset ---- */

typedef struct blocked_arg {
    int sending; /* rank 1 sends to rank 0 (else receives from it) */
    _Atomic long tid;
} blocked_arg;

/* Rank 1 blocks in a call whose peer, rank 0, never comes: rank 0 instead waits until rank 1
 * sleeps in the reducer's wait (nowhere else does it sleep), then aborts. */
static void do_blocked(worker *w) {
    blocked_arg *a = w->arg;
    float buf[16] = {0};
    if (w->rank == 0) {
        long tid;
        while (!(tid = atomic_load(&a->tid))) sched_yield();
        while (!thread_sleeping(tid)) sched_yield();
        R->abort(w->comm);
        return;
    }
    atomic_store(&a->tid, (long)syscall(SYS_gettid));
    double t0 = now_ms();
    record(w, a->sending ? R->send(w->comm, 1, 0, buf, 16, MW_F32)
                         : R->recv(w->comm, 1, 0, buf, 16, MW_F32));
    w->elapsed_ms = now_ms() - t0;
}

/* Both ranks exchange once, so the communicator works. */
static void check_works(mw__comm *comm, int p) {
    worker w[MAXP] = {0};
    ring_arg a = {100, MW_F32, 1, 3};
    run_ranks(comm, p, w, do_ring, &a);
    assert_all_ok(w, p, "a ring after reset");
}

Test(reducer_p2p, an_abort_wakes_a_blocked_receiver_or_sender, .timeout = 60) {
    mw__comm *comm = shm_comm(2, 0, NULL);
    for (int sending = 0; sending < 2; sending++) {
        worker w[2] = {0};
        blocked_arg a = {sending, 0};
        run_ranks(comm, 2, w, do_blocked, &a);
        cr_assert_eq(w[1].st, MW_ERR_ABORTED, "%s: %s", mw_status_name(w[1].st), w[1].msg);
        const char *want = sending ? "send aborted: rank 1 was waiting for rank 0 to receive"
                                   : "recv aborted: rank 1 was waiting for rank 0 to send";
        cr_assert(strstr(w[1].msg, want), "\"%s\" lacks \"%s\"", w[1].msg, want);
        /* Still aborted: a call is refused at once, the collectives' too. */
        float x[4];
        cr_assert_eq(R->sendrecv(comm, 0, 1, x, 1, x + 2, 2, MW_F32), MW_ERR_ABORTED);
        cr_assert(strstr(mw_last_error(), "entered after the communicator was aborted"), "%s",
                  mw_last_error());
        cr_assert_eq(R->barrier(comm, 0), MW_ERR_ABORTED);
        R->reset(comm);
        check_works(comm, 2);
    }
    R->comm_free(comm);
}

/* Rank 1 waits for rank 0, which returns at once: it times out and aborts the communicator. */
static void do_alone(worker *w) {
    const int *sending = w->arg;
    float buf[16] = {0};
    if (w->rank == 0) return;
    double t0 = now_ms();
    record(w, *sending ? R->send(w->comm, 1, 0, buf, 16, MW_F32)
                       : R->recv(w->comm, 1, 0, buf, 16, MW_F32));
    w->elapsed_ms = now_ms() - t0;
}

Test(reducer_p2p, a_wait_for_a_peer_that_never_comes_times_out, .timeout = 60) {
    int timeout_ms = 200;
    mw__comm *comm = shm_comm(2, timeout_ms, NULL);
    for (int sending = 0; sending < 2; sending++) {
        worker w[2] = {0};
        run_ranks(comm, 2, w, do_alone, &sending);
        cr_assert_eq(w[1].st, MW_ERR_TIMEOUT, "%s: %s", mw_status_name(w[1].st), w[1].msg);
        cr_assert_geq(w[1].elapsed_ms, timeout_ms - 1, "gave up after %.1f ms", w[1].elapsed_ms);
        char want[96];
        snprintf(want, sizeof want, "%s timed out after %d ms: rank 1 waited for rank 0 to %s",
                 sending ? "send" : "recv", timeout_ms, sending ? "receive" : "send");
        cr_assert(strstr(w[1].msg, want), "\"%s\" lacks \"%s\"", w[1].msg, want);
        /* The timeout aborted the communicator, naming its cause. */
        float x[2];
        cr_assert_eq(R->recv(comm, 0, 1, x, 2, MW_F32), MW_ERR_ABORTED);
        cr_assert(strstr(mw_last_error(), "rank 1 timed out after 200 ms waiting for rank 0"), "%s",
                  mw_last_error());
        R->reset(comm);
        check_works(comm, 2);
    }
    R->comm_free(comm);
}

/* Each bad call, one at a time: its message, then the communicator aborted until reset. */
Test(reducer_p2p, a_bad_call_names_its_fault_and_aborts_until_reset, .timeout = 60) {
    mw__comm *comm = shm_comm(3, 0, NULL);
    float x[8] = {0};
    int32_t ids[2] = {0};
    for (int c = 0; c < 9; c++) {
        mw_status st;
        const char *says;
        mw_status want = MW_ERR_INVALID;
        switch (c) {
        case 0:
            st = R->send(comm, 0, 3, x, 1, MW_F32), says = "rank 0 passed a peer out of range";
            break;
        case 1: st = R->recv(comm, 1, -1, x, 1, MW_F32), says = "a peer out of range"; break;
        case 2: st = R->send(comm, 2, 2, x, 1, MW_F32), says = "itself as the peer"; break;
        case 3: st = R->recv(comm, 2, 2, x, 1, MW_F32), says = "itself as the peer"; break;
        case 4:
            st = R->sendrecv(comm, 0, 0, x, 1, x + 4, 1, MW_F32);
            says = "itself as only one of the peers";
            break;
        case 5:
            st = R->sendrecv(comm, 0, 1, x, 2, x + 2, 4, MW_F32);
            says = "overlapping send and receive buffers";
            break;
        case 6:
            st = R->send(comm, 0, 1, NULL, 1, MW_F32), says = "rank 0 passed a NULL buffer";
            break;
        case 7: st = R->recv(comm, 3, 1, x, 1, MW_F32), says = "rank 3 out of range"; break;
        default:
            st = R->send(comm, 0, 1, ids, 2, MW_I32), says = "f32 and bf16 only";
            want = MW_ERR_UNSUPPORTED;
            break;
        }
        cr_assert_eq(st, want, "case %d: %s: %s", c, mw_status_name(st), mw_last_error());
        cr_assert(strstr(mw_last_error(), says), "case %d: \"%s\" lacks \"%s\"", c, mw_last_error(),
                  says);
        cr_assert_eq(R->recv(comm, 1, 0, x, 1, MW_F32), MW_ERR_ABORTED, "case %d", c);
        cr_assert(strstr(mw_last_error(), c == 7 ? "out-of-range rank" : "invalid argument"),
                  "case %d: %s", c, mw_last_error());
        R->reset(comm);
    }
    check_works(comm, 3);
    R->comm_free(comm);
}

/* ---- an all-gather in flight: a point-to-point call completes it first ---- */

static void do_gather_then_p2p(worker *w) {
    float buf[8], out[4], in[4];
    size_t bounds[3] = {0, 4, 8};
    for (int i = 0; i < 8; i++) buf[i] = (float)(w->rank * 10 + i);
    record(w, R->all_gather_start(w->comm, w->rank, buf, 8, MW_F32, bounds));
    for (int i = 0; i < 4; i++) out[i] = (float)(w->rank + 100 + i);
    int peer = 1 - w->rank;
    if (!w->st) record(w, R->sendrecv(w->comm, w->rank, peer, out, peer, in, 4, MW_F32));
    if (!w->st) record(w, R->finish(w->comm, w->rank));
    for (int i = 0; !w->st && i < 4; i++) w->wrong += in[i] != (float)(peer + 100 + i);
    for (int i = 0; !w->st && i < 8; i++) w->wrong += buf[i] != (float)((i / 4) * 10 + i);
}

Test(reducer_p2p, an_all_gather_in_flight_completes_first, .timeout = 60) {
    mw__comm *comm = shm_comm(2, 0, NULL);
    worker w[2] = {0};
    run_ranks(comm, 2, w, do_gather_then_p2p, NULL);
    assert_all_ok(w, 2, "all-gather started, then sendrecv");
    R->comm_free(comm);
}

/* ---- ranks as a gang's tasks on one thread ---- */

typedef struct task {
    worker w;
    int kind; /* 0: pairs, 1: a ring, 2: send then recv against recv then send */
    size_t n;
} task;

static void gang_task(void *arg) {
    task *t = arg;
    worker *w = &t->w;
    if (t->kind == 0) {
        pairs_arg a = {t->n, MW_F32};
        w->arg = &a;
        do_pairs(w);
    } else if (t->kind == 1) {
        ring_arg a = {t->n, MW_BF16, 1, 5};
        w->arg = &a;
        do_ring(w);
    } else {
        float out[32], in[32];
        int peer = 1 - w->rank;
        for (int k = 0; k < 10 && !w->st; k++) {
            for (int i = 0; i < 32; i++) out[i] = (float)(w->rank * 1000 + k * 32 + i);
            /* Rank 0 sends first, rank 1 receives first. */
            for (int half = 0; half < 2 && !w->st; half++)
                record(w, (half == w->rank) ? R->send(w->comm, w->rank, peer, out, 32, MW_F32)
                                            : R->recv(w->comm, w->rank, peer, in, 32, MW_F32));
            for (int i = 0; !w->st && i < 32; i++)
                w->wrong += in[i] != (float)(peer * 1000 + k * 32 + i);
        }
    }
}

Test(reducer_p2p, ranks_of_a_gang_on_one_thread_pass_messages, .timeout = 60) {
    static const size_t lens[] = {1, 4097, LARGE};
    for (int kind = 0; kind < 3; kind++)
        for (int p = 2; p <= (kind == 2 ? 2 : 4); p++)
            for (size_t k = 0; k < 3; k++) {
                mw__event wake = {0, 0};
                mw__comm *comm = shm_comm(p, 10000, &wake);
                mw__gang *g = NULL;
                cr_assert_eq(mw__gang_new(p, &wake, 0, &g), MW_OK, "%s", mw_last_error());
                task t[MAXP];
                void *args[MAXP];
                for (int r = 0; r < p; r++) {
                    memset(&t[r], 0, sizeof t[r]);
                    t[r].w.comm = comm, t[r].w.rank = r, t[r].w.p = p;
                    t[r].kind = kind, t[r].n = lens[k];
                    args[r] = &t[r];
                }
                mw__gang_run(g, p, gang_task, args);
                for (int r = 0; r < p; r++) {
                    cr_assert_eq(t[r].w.st, MW_OK, "kind %d p %d n %zu rank %d: %s", kind, p,
                                 lens[k], r, t[r].w.msg);
                    cr_assert_eq(t[r].w.wrong, 0, "kind %d p %d n %zu rank %d: %ld wrong", kind, p,
                                 lens[k], r, t[r].w.wrong);
                }
                mw__gang_free(g);
                R->comm_free(comm);
            }
}
