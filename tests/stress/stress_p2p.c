/* Stress for the shared-memory reducer's point-to-point calls, meant to run under
 * ThreadSanitizer: rounds of random events among 2, 3 and 4 ranks, each event a transfer from
 * one rank to another (send and recv, or a sendrecv exchange both ways), a ring of sendrecv
 * over every rank, an all-reduce, or an all-gather started on every rank, then a transfer that
 * completes it, with random sizes (f32 and bf16) and random delays; every rank takes its part of
 * the events in their order. Rounds run on one thread per rank, or all ranks as a gang of tasks
 * on one thread; some rounds have a rank abort instead of taking part in an event, or the host
 * abort at a random moment.
 *
 * Checks: a call that succeeded received exactly what was sent; a transfer is all-or-nothing
 * (its send succeeded exactly when its recv did, and a failed recv left its buffer untouched);
 * after reset() the communicator works again. Exits 0 when all is well, 1 otherwise. */
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collectives/fiber.h"
#include "collectives/reducer.h"
#include "collectives/wait.h"
#include "core/error.h"
#include "tests/common/rng.h"
#include "tests/stress/stress.h"

#define EVENTS 40
#define MAX_N 70001 /* elements */
#define MAX_RANKS 4

enum kind { EV_PAIR, EV_EXCHANGE, EV_RING, EV_ALLREDUCE, EV_GATHER_THEN_PAIR, NKINDS };
enum round_kind { ROUND_PLAIN, ROUND_VICTIM, ROUND_HOST_ABORT };

typedef struct event {
    int kind, from, to; /* the pair of EV_PAIR, EV_EXCHANGE and EV_GATHER_THEN_PAIR */
    size_t n;
    mw_dtype dtype;
} event;

typedef struct round_plan {
    int kind, gang;
    int victim, victim_at; /* ROUND_VICTIM: this rank aborts instead of taking part in this */
    event ev[EVENTS];
} round_plan;

typedef struct shared {
    const mw__reducer_vtable *red;
    mw__comm *comm;
    mw__event wake;
    int p, round;
    const round_plan *plan;
    pthread_barrier_t start, end; /* p ranks + the host, around each threaded round */
    /* Per event and rank: its send and its recv of a transfer, and its other calls; 1 until
     * made. */
    mw_status st[EVENTS][MAX_RANKS][3];
    int rep[EVENTS][MAX_RANKS]; /* which repetition of the events st is of */
    _Atomic long errors, calls;
} shared;

typedef struct rank_arg {
    shared *sh;
    int rank;
    uint64_t rng;
    pthread_t thread;
    uint8_t *out, *in;
    float *gather;
} rank_arg;

static void fail(shared *sh, const char *fmt, ...) {
    if (atomic_fetch_add(&sh->errors, 1) >= 20) return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "stress_p2p: %d ranks, round %d: %s\n", sh->p, sh->round, line);
}

/* Nothing, a spin, a yield, or a sleep of up to 50 us (a thread round only: a gang's task must
 * not sleep while its peers are on its thread). */
static void jitter(uint64_t *rng, int gang) {
    uint64_t x = rng_xorshift64(rng) % 100;
    if (x < 60) return;
    if (x < 85 || gang) {
        volatile uint64_t spin = rng_xorshift64(rng) % 1000;
        while (spin) spin--;
        return;
    }
    if (x < 90) {
        sched_yield();
        return;
    }
    stress_nap(rng, 50000);
}

static uint8_t byte_of(int rank, int k, size_t i) {
    return (uint8_t)((i * 131 + (size_t)rank * 17 + (size_t)k * 7) % 251);
}

static size_t esize(mw_dtype d) { return d == MW_BF16 ? 2 : 4; }

/* Checks a received buffer: message k of rank `from` when ok, else untouched (0xa5). */
static void check_in(shared *sh, const rank_arg *a, int k, int from, size_t bytes, int ok) {
    for (size_t i = 0; i < bytes + 16; i++) {
        uint8_t want = ok && i < bytes ? byte_of(from, k, i) : 0xa5;
        if (a->in[i] != want) {
            fail(sh, "event %d rank %d: byte %zu of %zu from rank %d is %u, not %u (%s)", k,
                 a->rank, i, bytes, from, a->in[i], want, ok ? "received" : "failed");
            return;
        }
    }
}

/* This rank's part of event k (of repetition rep); returns non-zero once it failed (the round
 * is over for it then). */
static int take_part(shared *sh, rank_arg *a, int k, int rep) {
    const event *e = &sh->plan->ev[k];
    const mw__reducer_vtable *R = sh->red;
    int r = a->rank, p = sh->p, gang = sh->plan->gang;
    size_t bytes = e->n * esize(e->dtype);
    mw_status *st = sh->st[k][r]; /* the send, the recv, any other call */
    st[0] = st[1] = st[2] = 1;
    sh->rep[k][r] = rep;
    memset(a->in, 0xa5, bytes + 16);
    for (size_t i = 0; i < bytes; i++) a->out[i] = byte_of(r, k, i);
    jitter(&a->rng, gang);
    int in_pair = r == e->from || r == e->to, peer = r == e->from ? e->to : e->from;
    if (e->kind == EV_PAIR || e->kind == EV_GATHER_THEN_PAIR) {
        size_t bounds[MAX_RANKS + 1];
        for (int q = 0; q <= p; q++) bounds[q] = mw__slice_lo(64, p, q);
        if (e->kind == EV_GATHER_THEN_PAIR) {
            for (int i = 0; i < 64; i++) a->gather[i] = (float)(r * 100 + i);
            st[2] = R->all_gather_start(sh->comm, r, a->gather, 64, MW_F32, bounds);
            if (st[2]) return 1;
            jitter(&a->rng, gang);
        }
        /* The transfer completes the all-gather of its two ranks first; finish, the others'. */
        if (r == e->from) st[0] = R->send(sh->comm, r, e->to, a->out, e->n, e->dtype);
        if (r == e->to) st[1] = R->recv(sh->comm, r, e->from, a->in, e->n, e->dtype);
        if (in_pair) atomic_fetch_add(&sh->calls, 1);
        if (r == e->to) check_in(sh, a, k, e->from, bytes, st[1] == MW_OK);
        if (st[0] < 0 || st[1] < 0) return 1;
        if (e->kind == EV_PAIR) return 0;
        if ((st[2] = R->finish(sh->comm, r))) return 1;
        for (int i = 0; i < 64; i++) {
            int owner = 0;
            while ((size_t)i >= bounds[owner + 1]) owner++;
            if (a->gather[i] != (float)(owner * 100 + i)) {
                fail(sh, "event %d rank %d: gathered element %d is wrong", k, r, i);
                break;
            }
        }
        return 0;
    }
    if (e->kind == EV_EXCHANGE || e->kind == EV_RING) {
        if (e->kind == EV_EXCHANGE && !in_pair) return 0;
        int to = e->kind == EV_RING ? (r + 1) % p : peer;
        int from = e->kind == EV_RING ? (r + p - 1) % p : peer;
        st[2] = R->sendrecv(sh->comm, r, to, a->out, from, a->in, e->n, e->dtype);
        atomic_fetch_add(&sh->calls, 1);
        if (!st[2]) check_in(sh, a, k, from, bytes, 1);
        return st[2] != MW_OK;
    }
    float x[2] = {1.0f, (float)r};
    st[2] = R->allreduce_sum(sh->comm, r, x, 2, MW_F32);
    if (!st[2] && (x[0] != (float)p || x[1] != (float)(p * (p - 1) / 2)))
        fail(sh, "event %d rank %d: all-reduce gave %g %g", k, r, (double)x[0], (double)x[1]);
    return st[2] != MW_OK;
}

/* A rank's part of the round: its events in order, until one fails (or, the victim, it aborts
 * instead of taking part in event victim_at; with a host abort the events repeat until it
 * lands). Every status of the events it did not reach stays "not reached" (1). */
static void run_round(rank_arg *a) {
    shared *sh = a->sh;
    const round_plan *plan = sh->plan;
    for (int k = 0; k < EVENTS; k++)
        for (int h = 0; h < 3; h++) sh->st[k][a->rank][h] = 1;
    int limit = plan->kind == ROUND_HOST_ABORT ? 1 << 30 : EVENTS;
    for (int k = 0; k < limit; k++) {
        if (plan->kind == ROUND_VICTIM && a->rank == plan->victim && k == plan->victim_at) {
            sh->red->abort(sh->comm);
            return;
        }
        if (take_part(sh, a, k % EVENTS, k / EVENTS)) return;
    }
}

static void *rank_thread(void *arg) {
    rank_arg *a = arg;
    for (;;) {
        pthread_barrier_wait(&a->sh->start);
        if (!a->sh->plan) return NULL;
        run_round(a);
        pthread_barrier_wait(&a->sh->end);
    }
}

static void gang_task(void *arg) { run_round(arg); }

/* After a plain round: every call succeeded. After any round: both halves of a transfer agree. */
static void check_round(shared *sh) {
    const round_plan *plan = sh->plan;
    for (int k = 0; k < EVENTS; k++) {
        const event *e = &plan->ev[k];
        for (int r = 0; plan->kind == ROUND_PLAIN && r < sh->p; r++)
            for (int h = 0; h < 3; h++)
                if (sh->st[k][r][h] < 0)
                    fail(sh, "event %d (kind %d) rank %d: %s in a round without faults", k, e->kind,
                         r, mw_status_name(sh->st[k][r][h]));
        if (e->kind != EV_PAIR && e->kind != EV_GATHER_THEN_PAIR) continue;
        mw_status sent = sh->st[k][e->from][0], got = sh->st[k][e->to][1];
        /* Both called it, in the same repetition: the halves must agree. */
        if (sent != 1 && got != 1 && sh->rep[k][e->from] == sh->rep[k][e->to] &&
            (sent == MW_OK) != (got == MW_OK))
            fail(sh, "event %d: rank %d's send gave %s but rank %d's recv gave %s", k, e->from,
                 mw_status_name(sent), e->to, mw_status_name(got));
    }
}

static size_t random_len(uint64_t *rng) {
    uint64_t x = rng_xorshift64(rng) % 100;
    if (x < 10) return 0;
    if (x < 60) return (size_t)(rng_xorshift64(rng) % 600);
    if (x < 90) return (size_t)(rng_xorshift64(rng) % 9000);
    return (size_t)(rng_xorshift64(rng) % MAX_N);
}

static int run(int p, int nrounds, uint64_t seed) {
    shared sh = {.red = &mw__reducer_shm, .p = p};
    atomic_init(&sh.errors, 0);
    atomic_init(&sh.calls, 0);
    mw__comm_options opt = {.timeout_ms = 0, .wake = &sh.wake};
    mw__gang *g = NULL;
    round_plan *plan = calloc(1, sizeof *plan);
    rank_arg args[MAX_RANKS];
    void *targs[MAX_RANKS];
    if (!plan || sh.red->comm_new(p, NULL, &opt, &sh.comm) != MW_OK ||
        mw__gang_new(p, &sh.wake, 0, &g) != MW_OK) {
        fprintf(stderr, "stress_p2p: setup failed: %s\n", mw_last_error());
        return 1;
    }
    pthread_barrier_init(&sh.start, NULL, (unsigned)p + 1);
    pthread_barrier_init(&sh.end, NULL, (unsigned)p + 1);
    uint64_t rng = seed;
    for (int r = 0; r < p; r++) {
        args[r] = (rank_arg){.sh = &sh, .rank = r, .rng = seed * 31 + (uint64_t)r + 1};
        args[r].out = malloc(MAX_N * 4 + 16);
        args[r].in = malloc(MAX_N * 4 + 16);
        args[r].gather = malloc(64 * sizeof(float));
        targs[r] = &args[r];
        if (!args[r].out || !args[r].in || !args[r].gather ||
            pthread_create(&args[r].thread, NULL, rank_thread, &args[r]) != 0) {
            fprintf(stderr, "stress_p2p: cannot start rank %d\n", r);
            exit(1);
        }
    }
    for (int round = 0; round < nrounds; round++) {
        uint64_t x = rng_xorshift64(&rng) % 10;
        plan->kind = x < 6 ? ROUND_PLAIN : x < 8 ? ROUND_VICTIM : ROUND_HOST_ABORT;
        plan->gang = rng_xorshift64(&rng) % 3 == 0 && plan->kind != ROUND_HOST_ABORT;
        plan->victim = (int)(rng_xorshift64(&rng) % (uint64_t)p);
        plan->victim_at = (int)(rng_xorshift64(&rng) % EVENTS);
        for (int k = 0; k < EVENTS; k++) {
            event *e = &plan->ev[k];
            e->kind = (int)(rng_xorshift64(&rng) % NKINDS);
            e->from = (int)(rng_xorshift64(&rng) % (uint64_t)p);
            e->to = (e->from + 1 + (int)(rng_xorshift64(&rng) % (uint64_t)(p - 1))) % p;
            e->n = random_len(&rng);
            e->dtype = rng_xorshift64(&rng) % 2 ? MW_BF16 : MW_F32;
        }
        sh.round = round;
        sh.plan = plan;
        if (plan->gang) {
            mw__gang_run(g, p, gang_task, targs);
        } else {
            pthread_barrier_wait(&sh.start);
            if (plan->kind == ROUND_HOST_ABORT) {
                stress_nap(&rng, 2000000);
                sh.red->abort(sh.comm);
            }
            pthread_barrier_wait(&sh.end);
        }
        check_round(&sh);
        if (plan->kind != ROUND_PLAIN) sh.red->reset(sh.comm);
    }
    sh.plan = NULL;
    pthread_barrier_wait(&sh.start);
    for (int r = 0; r < p; r++) {
        pthread_join(args[r].thread, NULL);
        free(args[r].out);
        free(args[r].in);
        free(args[r].gather);
    }
    pthread_barrier_destroy(&sh.start);
    pthread_barrier_destroy(&sh.end);
    mw__gang_free(g);
    sh.red->comm_free(sh.comm);
    free(plan);
    long errors = atomic_load(&sh.errors);
    printf("stress_p2p: %d ranks: %d rounds, %ld point-to-point calls, %ld errors\n", p, nrounds,
           atomic_load(&sh.calls), errors);
    return errors != 0;
}

int main(int argc, char **argv) {
    return stress_main(argc, argv, "stress_p2p", MAX_RANKS, 40, 20250301, run);
}
