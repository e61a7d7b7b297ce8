/* Stress for the shared-memory reducer, meant to run under ThreadSanitizer: thousands of
 * all-reduces (blocking, and started then finished after a delay), reduce-scatters, all-gathers
 * (blocking, and started then finished after a delay),
 * broadcasts and barriers of random sizes (0 .. ~100k
 * floats) with random delays on every rank, for 2, 3 and 4 ranks, plus rounds where a rank fails or
 * the host aborts at a random moment.
 *
 * Checks: every sum is exact (integer-valued inputs), and an abort is all-or-nothing: every rank
 * fails at the same collective, none of them had its buffer touched by it, and after reset() the
 * communicator works again. Prints a line per rank count; exits 0 when all is well, 1 otherwise.
 */
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collectives/reducer.h"
#include "core/error.h"
#include "tests/common/rng.h"
#include "tests/stress/stress.h"

#define ROUND_LEN 40 /* collectives per round */
#define MAX_N 100003 /* floats */
#define MAX_RANKS 4

enum round_kind { ROUND_PLAIN, ROUND_VICTIM, ROUND_HOST_ABORT };

typedef struct round_plan {
    int kind;
    int victim;          /* ROUND_VICTIM: the rank that aborts instead of entering... */
    int victim_at;       /* ...at this collective */
    size_t n[ROUND_LEN]; /* SIZE_MAX: a barrier */
    int op[ROUND_LEN];   /* enum op */
} round_plan;

/* OP_GATHER_STARTED: all_gather_start, a delay, then finish (FSDP's prefetch). OP_SUM_STARTED:
 * allreduce_start, a delay, then finish (the gradient buckets). */
enum op {
    OP_ALLREDUCE,
    OP_REDUCE_SCATTER,
    OP_ALL_GATHER,
    OP_BROADCAST,
    OP_GATHER_STARTED,
    OP_SUM_STARTED,
    OP_COUNT
};

typedef struct shared {
    const mw__reducer_vtable *red;
    mw__comm *comm;
    int p, nrounds;
    round_plan *plans;
    pthread_barrier_t round_end, round_start; /* p ranks + the host */
    int failed_at[MAX_RANKS];                 /* per round: first failing collective, or -1 */
    _Atomic long errors;
} shared;

typedef struct rank_arg {
    shared *sh;
    int rank;
    uint64_t rng;
    pthread_t thread;
} rank_arg;

static void fail(shared *sh, const char *fmt, ...) {
    if (atomic_fetch_add(&sh->errors, 1) >= 20) return; /* the first few tell the story */
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "stress_reducer: %d ranks: %s\n", sh->p, line);
}

/* A short random pause: nothing, a spin, or a sleep of up to 50 us. */
static void jitter(uint64_t *rng) {
    uint64_t x = rng_xorshift64(rng) % 100;
    if (x < 50) return;
    if (x < 80) {
        uint64_t spins = rng_xorshift64(rng) % 2000, x0 = *rng;
        for (uint64_t i = 0; i < spins; i++) x0 = x0 * 6364136223846793005u + i;
        *rng ^= x0 & 1; /* keeps the loop */
        return;
    }
    if (x < 85) {
        sched_yield();
        return;
    }
    stress_nap(rng, 50000);
}

static float value(int rank, size_t i, int salt) {
    return (float)((i * 7 + (size_t)rank * 3 + (size_t)salt) % 61);
}

/* What rank `rank` puts into element i before a collective: its value, except that an
 * all-gather's input outside the rank's own part is junk the collective must overwrite. */
static float input(int op, int rank, size_t i, int salt, const size_t *bounds) {
    int gather = op == OP_ALL_GATHER || op == OP_GATHER_STARTED;
    if (gather && (i < bounds[rank] || i >= bounds[rank + 1])) return -1.0f;
    return value(rank, i, salt);
}

/* The element after a collective that completed. */
static float expected(const shared *sh, int op, int rank, size_t i, int salt,
                      const size_t *bounds) {
    int owner = 0;
    while (i >= bounds[owner + 1]) owner++;
    if (op == OP_ALL_GATHER || op == OP_GATHER_STARTED) return value(owner, i, salt);
    if (op == OP_BROADCAST) return value(salt % sh->p, i, salt); /* the root */
    if (op == OP_REDUCE_SCATTER && owner != rank) return value(rank, i, salt);
    float want = 0;
    for (int r = 0; r < sh->p; r++) want += value(r, i, salt);
    return want;
}

static void *rank_main(void *arg) {
    rank_arg *a = arg;
    shared *sh = a->sh;
    float *buf = malloc(MAX_N * sizeof(float));
    if (!buf) {
        fail(sh, "rank %d: out of memory", a->rank);
        return NULL;
    }
    for (int round = 0; round < sh->nrounds; round++) {
        const round_plan *plan = &sh->plans[round];
        int failed_at = -1;
        /* A host-abort round repeats its collectives until the abort lands. */
        int limit = plan->kind == ROUND_HOST_ABORT ? 1 << 30 : ROUND_LEN;
        for (int k = 0; k < limit && failed_at < 0; k++) {
            size_t n = plan->n[k % ROUND_LEN], bounds[MAX_RANKS + 1];
            int op = plan->op[k % ROUND_LEN];
            int salt = (round * ROUND_LEN + k) % 1000;
            for (int r = 0; n != SIZE_MAX && r <= sh->p; r++) bounds[r] = mw__slice_lo(n, sh->p, r);
            jitter(&a->rng);
            if (plan->kind == ROUND_VICTIM && a->rank == plan->victim && k == plan->victim_at) {
                sh->red->abort(sh->comm); /* this rank "failed" and will not enter */
                failed_at = k;
                break;
            }
            mw_status st;
            for (size_t i = 0; n != SIZE_MAX && i < n; i++)
                buf[i] = input(op, a->rank, i, salt, bounds);
            if (n == SIZE_MAX) {
                st = sh->red->barrier(sh->comm, a->rank);
            } else if (op == OP_GATHER_STARTED) {
                st = sh->red->all_gather_start(sh->comm, a->rank, buf, n, MW_F32, bounds);
                jitter(&a->rng);
                if (st == MW_OK) st = sh->red->finish(sh->comm, a->rank);
            } else if (op == OP_SUM_STARTED) {
                st = sh->red->allreduce_start(sh->comm, a->rank, buf, n, MW_F32);
                jitter(&a->rng);
                if (st == MW_OK) st = sh->red->finish(sh->comm, a->rank);
            } else {
                st = op == OP_REDUCE_SCATTER
                         ? sh->red->reduce_scatter_sum(sh->comm, a->rank, buf, n, MW_F32, bounds)
                     : op == OP_ALL_GATHER
                         ? sh->red->all_gather(sh->comm, a->rank, buf, n, MW_F32, bounds)
                     : op == OP_BROADCAST
                         ? sh->red->broadcast(sh->comm, a->rank, buf, n, MW_F32, salt % sh->p)
                         : sh->red->allreduce_sum(sh->comm, a->rank, buf, n, MW_F32);
            }
            if (st == MW_ERR_ABORTED && plan->kind != ROUND_PLAIN) {
                failed_at = k;
                /* Nothing may have been written into a buffer of a collective that failed. */
                for (size_t i = 0; n != SIZE_MAX && i < n; i++)
                    if (buf[i] != input(op, a->rank, i, salt, bounds)) {
                        fail(sh, "round %d collective %d rank %d: aborted but buffer changed",
                             round, k, a->rank);
                        break;
                    }
                continue;
            }
            if (st != MW_OK) {
                fail(sh, "round %d collective %d rank %d: %s: %s", round, k, a->rank,
                     mw_status_name(st), mw_last_error());
                failed_at = k;
                continue;
            }
            if (n == SIZE_MAX) continue;
            for (size_t i = 0; i < n; i++) {
                float want = expected(sh, op, a->rank, i, salt, bounds);
                if (buf[i] != want) {
                    fail(sh,
                         "round %d collective %d (op %d, n=%zu) rank %d: element %zu is %g, not %g",
                         round, k, op, n, a->rank, i, (double)buf[i], (double)want);
                    break;
                }
            }
        }
        sh->failed_at[a->rank] = failed_at;
        pthread_barrier_wait(&sh->round_end);
        pthread_barrier_wait(&sh->round_start); /* the host checks and resets in between */
    }
    free(buf);
    return NULL;
}

static size_t random_len(uint64_t *rng) {
    uint64_t x = rng_xorshift64(rng) % 100;
    if (x < 10) return SIZE_MAX; /* a barrier */
    if (x < 15) return 0;
    if (x < 60) return (size_t)(rng_xorshift64(rng) % 2100); /* around the small-path limit */
    if (x < 90) return (size_t)(rng_xorshift64(rng) % 20000);
    return (size_t)(rng_xorshift64(rng) % MAX_N);
}

static int run(int p, int nrounds, uint64_t seed) {
    shared sh = {.red = &mw__reducer_shm, .p = p, .nrounds = nrounds};
    atomic_init(&sh.errors, 0);
    uint64_t rng = seed;
    sh.plans = calloc((size_t)nrounds, sizeof *sh.plans);
    mw__comm_options opt = {.timeout_ms = 0};
    if (!sh.plans || sh.red->comm_new(p, NULL, &opt, &sh.comm) != MW_OK) {
        fprintf(stderr, "stress_reducer: setup failed: %s\n", mw_last_error());
        return 1;
    }
    for (int r = 0; r < nrounds; r++) {
        round_plan *plan = &sh.plans[r];
        uint64_t x = rng_xorshift64(&rng) % 10;
        plan->kind = x < 6 ? ROUND_PLAIN : x < 8 ? ROUND_VICTIM : ROUND_HOST_ABORT;
        plan->victim = (int)(rng_xorshift64(&rng) % (uint64_t)p);
        plan->victim_at = (int)(rng_xorshift64(&rng) % ROUND_LEN);
        for (int k = 0; k < ROUND_LEN; k++) {
            plan->n[k] = random_len(&rng);
            plan->op[k] = (int)(rng_xorshift64(&rng) % OP_COUNT);
        }
    }
    pthread_barrier_init(&sh.round_end, NULL, (unsigned)p + 1);
    pthread_barrier_init(&sh.round_start, NULL, (unsigned)p + 1);
    rank_arg args[MAX_RANKS];
    for (int r = 0; r < p; r++) {
        args[r] = (rank_arg){.sh = &sh, .rank = r, .rng = seed * 31 + (uint64_t)r + 1};
        if (pthread_create(&args[r].thread, NULL, rank_main, &args[r]) != 0) {
            fprintf(stderr, "stress_reducer: cannot start threads\n");
            exit(1);
        }
    }
    long collectives = 0;
    for (int round = 0; round < nrounds; round++) {
        const round_plan *plan = &sh.plans[round];
        if (plan->kind == ROUND_HOST_ABORT) {
            stress_nap(&rng, 2000000);
            sh.red->abort(sh.comm);
        }
        pthread_barrier_wait(&sh.round_end);
        /* All-or-nothing: every rank stopped at the same collective. */
        int at = sh.failed_at[0];
        for (int r = 1; r < p; r++)
            if (sh.failed_at[r] != at)
                fail(&sh, "round %d: rank 0 stopped at collective %d, rank %d at %d", round, at, r,
                     sh.failed_at[r]);
        if (plan->kind == ROUND_PLAIN && at >= 0)
            fail(&sh, "round %d: a plain round failed at collective %d", round, at);
        if (plan->kind == ROUND_VICTIM && at != plan->victim_at)
            fail(&sh, "round %d: victim aborted at %d but the ranks stopped at %d", round,
                 plan->victim_at, at);
        collectives += at >= 0 ? at + 1 : ROUND_LEN;
        if (plan->kind != ROUND_PLAIN) sh.red->reset(sh.comm);
        pthread_barrier_wait(&sh.round_start);
    }
    for (int r = 0; r < p; r++) pthread_join(args[r].thread, NULL);
    pthread_barrier_destroy(&sh.round_end);
    pthread_barrier_destroy(&sh.round_start);
    sh.red->comm_free(sh.comm);
    free(sh.plans);
    long errors = atomic_load(&sh.errors);
    printf("stress_reducer: %d ranks: %d rounds, %ld collectives, %ld errors\n", p, nrounds,
           collectives, errors);
    return errors != 0;
}

int main(int argc, char **argv) {
    /* Rounds per rank count: 30 make ~2000-2500 collectives over the three counts. */
    return stress_main(argc, argv, "stress_reducer", MAX_RANKS, 30, 20240611, run);
}
