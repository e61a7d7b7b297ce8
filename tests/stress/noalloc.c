/* A training step allocates nothing after the first ones.
 *
 * This program replaces the allocator (malloc, calloc, realloc, free, posix_memalign,
 * aligned_alloc, memalign) with counting wrappers around glibc's own, so every allocation in the
 * process is seen, from any thread: the library's, its worker threads', OpenBLAS's. It trains the
 * linear regression model on one device (unsharded) and on two (sharded, also with AdamW), warms
 * each up with 2 steps, and then requires that 20 more steps, and a compute_grads and an eval, make
 * no allocation. Exit status 0 on success, 1 with a message otherwise. Its products are all
 * matrix-vector ones, which never run on oneDNN; a matrix product on oneDNN allocates inside
 * oneDNN on every call (its execute's map of the arguments), whatever meshwit does, so a model
 * with one would fail here wherever oneDNN runs it. Also the shared-memory reducer's
 * point-to-point calls: two ranks' sends, receives and sendrecvs, f32 and bf16, allocate nothing.
 *
 * Build it without sanitizers: AddressSanitizer and ThreadSanitizer bring their own allocators,
 * which these definitions would fight. Under a sanitizer the program defines no allocator, says
 * so and exits with 77 (the conventional "skipped" status). */
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "collectives/reducer.h"
#include "meshwit.h"
#include "tests/common/rng.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define NOALLOC_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define NOALLOC_SANITIZED 1
#endif
#endif

#ifdef NOALLOC_SANITIZED
int main(void) {
    printf("noalloc: skipped: built with a sanitizer, whose allocator this program cannot wrap\n");
    return 77;
}
#else

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);
extern void __libc_free(void *p);

static atomic_long allocations;
static atomic_long releases;

static void counted(void) { atomic_fetch_add_explicit(&allocations, 1, memory_order_relaxed); }

void *malloc(size_t size) {
    counted();
    return __libc_malloc(size);
}

void *calloc(size_t n, size_t size) {
    counted();
    return __libc_calloc(n, size);
}

void *realloc(void *p, size_t size) {
    counted();
    return __libc_realloc(p, size);
}

void free(void *p) {
    if (p) atomic_fetch_add_explicit(&releases, 1, memory_order_relaxed);
    __libc_free(p);
}

void *memalign(size_t alignment, size_t size);
void *memalign(size_t alignment, size_t size) {
    counted();
    return __libc_memalign(alignment, size);
}

void *aligned_alloc(size_t alignment, size_t size) {
    counted();
    return __libc_memalign(alignment, size);
}

int posix_memalign(void **out, size_t alignment, size_t size) {
    counted();
    if (alignment < sizeof(void *) || (alignment & (alignment - 1)) != 0) return 22; /* EINVAL */
    void *p = __libc_memalign(alignment, size);
    if (!p) return 12; /* ENOMEM */
    *out = p;
    return 0;
}

/* --- the model -------------------------------------------------------------------------------- */

#define ROWS 4099 /* odd: the two shards are uneven */
#define FEATURES 64
#define WARMUP 2
#define STEPS 20

static float xs[ROWS * FEATURES], ys[ROWS];

static int check(mw_status st, const char *what) {
    if (st != MW_OK)
        fprintf(stderr, "noalloc: %s failed: %s: %s\n", what, mw_status_name(st), mw_last_error());
    return st == MW_OK;
}

static void make_data(void) {
    uint64_t s = 42;
    for (size_t i = 0; i < ROWS * FEATURES; i++) xs[i] = (float)rng_range(rng_lcg64(&s), -0.5, 0.5);
    for (size_t r = 0; r < ROWS; r++) {
        float t = 0.25f;
        for (size_t f = 0; f < FEATURES; f++)
            t += xs[r * FEATURES + f] * (float)((int)(f % 7) - 3) * 0.1f;
        ys[r] = t;
    }
}

/* Returns the number of allocations made by STEPS steps, a compute_grads and an eval after
 * WARMUP steps on `devices`, or -1 when something failed. */
static long measure(const char *devices, int sharded, mw_optimizer optimizer) {
    mw_graph *g = NULL;
    mw_mesh *mesh = NULL;
    mw_trainer *tr = NULL;
    long result = -1;
    if (!check(mw_graph_new(&g), "mw_graph_new")) return -1;
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", ROWS}, {"Feature", FEATURES}));
    mw_tensor *y = mw_input(g, "y", MW_F32, MW_AXES({"Batch", ROWS}));
    if (sharded) {
        x = mw_shard(g, x, "Batch", "X");
        y = mw_shard(g, y, "Batch", "X");
    }
    mw_tensor *w = mw_param(g, "weights", MW_AXES({"Feature", FEATURES}), MW_INIT_ZEROS);
    mw_tensor *b = mw_param(g, "bias", MW_SCALAR, MW_INIT_ZEROS);
    mw_tensor *err = mw_sub(g, mw_add(g, mw_dot(g, x, w, "Feature"), b), y);
    mw_tensor *loss = mw_mean(g, mw_mul(g, err, err), NULL);
    mw_trainer_config cfg = {.optimizer = optimizer};
    const mw_feed feeds[] = {{"x", xs, ROWS * FEATURES}, {"y", ys, ROWS}};

    if (check(mw_graph_status(g), "tracing") && check(mw_mesh_new(devices, "X", &mesh), devices) &&
        check(mw_trainer_new(g, loss, mesh, &cfg, &tr), "mw_trainer_new")) {
        float first = 0, last = 0;
        int ok = 1;
        for (int s = 0; ok && s < WARMUP; s++)
            ok = check(mw_trainer_step(tr, feeds, 2, &first), "warm-up step");
        long allocs0 = atomic_load(&allocations), frees0 = atomic_load(&releases);
        for (int s = 0; ok && s < STEPS; s++)
            ok = check(mw_trainer_step(tr, feeds, 2, &last), "step");
        long step_allocs = atomic_load(&allocations) - allocs0;
        long step_frees = atomic_load(&releases) - frees0;
        float other;
        ok = ok && check(mw_trainer_compute_grads(tr, feeds, 2, &other), "compute_grads") &&
             check(mw_trainer_eval(tr, feeds, 2, &other), "eval");
        long all_allocs = atomic_load(&allocations) - allocs0;
        long all_frees = atomic_load(&releases) - frees0;
        if (ok) {
            printf(
                "%-6s %-9s %-5s %d steps: %ld allocations, %ld frees; with compute_grads and eval: "
                "%ld, %ld (loss %.6g -> %.6g)\n",
                devices, sharded ? "sharded" : "unsharded",
                optimizer.kind == MW_ADAMW ? "AdamW" : "SGD", STEPS, step_allocs, step_frees,
                all_allocs, all_frees, first, last);
            result = all_allocs;
        }
        if (ok && !(last < first)) {
            fprintf(stderr, "noalloc: %s: the loss did not decrease (%g -> %g)\n", devices, first,
                    last);
            result = -1;
        }
    }
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    return result;
}

/* --- point-to-point -------------------------------------------------------------------------- */

#define P2P_N 5000

typedef struct p2p_rank {
    mw__comm *comm;
    int rank;
    pthread_barrier_t *start, *end;
    float out[P2P_N], in[P2P_N];
    mw_status st;
} p2p_rank;

static void *p2p_rank_main(void *arg) {
    p2p_rank *a = arg;
    const mw__reducer_vtable *R = &mw__reducer_shm;
    int peer = 1 - a->rank;
    pthread_barrier_wait(a->start);
    for (int k = 0; k < 50 && !a->st; k++) {
        mw_dtype dt = k % 2 ? MW_BF16 : MW_F32;
        a->st = R->sendrecv(a->comm, a->rank, peer, a->out, peer, a->in, P2P_N, dt);
        if (!a->st)
            a->st = a->rank == 0 ? R->send(a->comm, 0, 1, a->out, (size_t)k, dt)
                                 : R->recv(a->comm, 1, 0, a->in, (size_t)k, dt);
    }
    if (a->st) R->abort(a->comm);
    pthread_barrier_wait(a->end);
    return NULL;
}

/* Allocations made by two ranks' point-to-point calls (the threads and the communicator made
 * before counting), or -1 when a call failed. */
static long p2p_allocations(void) {
    static p2p_rank ranks[2];
    pthread_barrier_t start, end;
    mw__comm *comm = NULL;
    if (!check(mw__reducer_shm.comm_new(2, NULL, NULL, &comm), "comm_new")) return -1;
    pthread_barrier_init(&start, NULL, 3);
    pthread_barrier_init(&end, NULL, 3);
    pthread_t threads[2];
    for (int r = 0; r < 2; r++) {
        ranks[r] = (p2p_rank){.comm = comm, .rank = r, .start = &start, .end = &end};
        pthread_create(&threads[r], NULL, p2p_rank_main, &ranks[r]);
    }
    long before = atomic_load(&allocations);
    pthread_barrier_wait(&start);
    pthread_barrier_wait(&end);
    long made = atomic_load(&allocations) - before;
    for (int r = 0; r < 2; r++) pthread_join(threads[r], NULL);
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&end);
    mw__reducer_shm.comm_free(comm);
    for (int r = 0; r < 2; r++)
        if (!check(ranks[r].st, "a point-to-point call")) return -1;
    printf("point-to-point: 2 ranks, 200 calls: %ld allocations\n", made);
    return made;
}

int main(void) {
    make_data();
    long before = atomic_load(&allocations);
    mw_graph *probe = NULL;
    if (!check(mw_graph_new(&probe), "mw_graph_new")) return 1;
    mw_graph_free(probe);
    if (atomic_load(&allocations) == before) {
        fprintf(stderr, "noalloc: the allocator is not interposed (mw_graph_new allocated "
                        "nothing that this program saw)\n");
        return 1;
    }

    const mw_optimizer sgd = {.kind = MW_SGD, .lr = 0.05f};
    /* AdamW keeps moment buffers and clipping needs the global gradient norm. */
    const mw_optimizer adamw = {.kind = MW_ADAMW,
                                .lr = 0.01f,
                                .beta1 = 0.9f,
                                .beta2 = 0.95f,
                                .eps = 1e-8f,
                                .grad_clip = 1.0f,
                                .warmup_steps = 5,
                                .decay_steps = 50,
                                .min_lr_ratio = 0.1f};
    long single = measure("cpu:1", 0, sgd);
    long sharded = measure("cpu:2", 1, sgd);
    long sharded_adamw = measure("cpu:2", 1, adamw);
    long p2p = p2p_allocations();
    if (single != 0 || sharded != 0 || sharded_adamw != 0 || p2p != 0) {
        fprintf(stderr,
                "noalloc: FAILED: steps allocate after warm-up (cpu:1 unsharded SGD: %ld, cpu:2 "
                "sharded SGD: %ld, cpu:2 sharded AdamW: %ld; point-to-point: %ld; -1 means the "
                "run itself failed)\n",
                single, sharded, sharded_adamw, p2p);
        return 1;
    }
    printf("noalloc: ok, no allocation in %d steps on any path\n", STEPS);
    return 0;
}
#endif
