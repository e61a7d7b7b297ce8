/* Reduce-scatter, all-gather and broadcast of the GPU reducers (suite gpu, so CTest runs them
 * through main.c's gate: skipped without a GPU, failed then when MESHWIT_REQUIRE_GPU=1): the
 * cuda-local reducer (devices sharing GPU 0) and NCCL (one rank on GPU 0; several ranks where
 * there are several GPUs), each collective against its definition with even, uneven and empty
 * parts (the all-gather also started and finished where the reducer can), a reduce-scatter's
 * part bitwise the all-reduce's there, abort and timeout then reset as
 * for the all-reduce (ZeRO-1 training on them: tests/gpu/test_gpu_trainer.c). */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collectives/reducer_select.h"
#include "core/error.h"
#include "devices/device.h"

#ifdef MESHWIT_HAVE_CUDA

#include "devices/cuda/cuda.h"
#include "gpu_ranks.h"
#include "gpu_test.h"

enum op { AR, RS, AG, BC, AGS }; /* AGS: all_gather_start, then finish */

typedef struct job {
    pthread_t thread;
    ranks *k;
    int rank, op, root;
    float *buf; /* device memory */
    size_t n;
    const size_t *bounds;
    mw_status st;
    char msg[MW__MSG_SIZE];
} job;

static void *job_main(void *arg) {
    job *j = arg;
    const mw__reducer_vtable *R = j->k->R;
    mw__comm *c = j->k->comm;
    switch (j->op) {
    case AR: j->st = R->allreduce_sum(c, j->rank, j->buf, j->n, MW_F32); break;
    case RS: j->st = R->reduce_scatter_sum(c, j->rank, j->buf, j->n, MW_F32, j->bounds); break;
    case AG: j->st = R->all_gather(c, j->rank, j->buf, j->n, MW_F32, j->bounds); break;
    case AGS:
        j->st = R->all_gather_start(c, j->rank, j->buf, j->n, MW_F32, j->bounds);
        if (j->st == MW_OK) j->st = R->finish(c, j->rank);
        break;
    default: j->st = R->broadcast(c, j->rank, j->buf, j->n, MW_F32, j->root); break;
    }
    snprintf(j->msg, sizeof j->msg, "%s", mw_last_error());
    return NULL;
}

/* A reproducible value of mixed magnitude and sign for rank r, element i. */
static float input(int r, size_t i, int salt) {
    uint32_t x = (uint32_t)(r * 7919 + salt * 104729 + 1) * 2654435761u ^ (uint32_t)i * 40503u;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    float mag = (x & 3) == 0 ? 1e4f : (x & 3) == 1 ? 1.0f : 1e-3f;
    return mag * ((float)(x >> 8 & 0xffff) / 65536.0f - 0.5f);
}

/* Runs op on every rank with buffers filled with input(rank, ., salt); every rank's result into
 * out (rank r's at out + r n). Asserts only on this thread. */
static void run_op(ranks *k, int op, size_t n, const size_t *bounds, int root, int salt,
                   float *out) {
    job j[MAXR];
    float *host = malloc((n ? n : 1) * sizeof(float));
    cr_assert_not_null(host);
    for (int r = 0; r < k->p; r++) {
        mw__device *d = k->dp[r];
        j[r] = (job){.k = k, .rank = r, .op = op, .root = root, .n = n, .bounds = bounds};
        OK(d->vt->alloc(d, n ? n * sizeof(float) : 4, (void **)&j[r].buf));
        for (size_t i = 0; i < n; i++) host[i] = input(r, i, salt);
        if (n) OK(d->vt->upload(d, j[r].buf, host, n * sizeof(float)));
        OK(d->vt->sync(d));
    }
    for (int r = 0; r < k->p; r++)
        cr_assert_eq(pthread_create(&j[r].thread, NULL, job_main, &j[r]), 0);
    for (int r = 0; r < k->p; r++) pthread_join(j[r].thread, NULL);
    for (int r = 0; r < k->p; r++) {
        mw__device *d = k->dp[r];
        cr_assert_eq(j[r].st, MW_OK, "%s op %d rank %d: %s: %s", k->R->name, op, r,
                     mw_status_name(j[r].st), j[r].msg);
        if (n) OK(d->vt->download(d, out + (size_t)r * n, j[r].buf, n * sizeof(float)));
        d->vt->free(d, j[r].buf);
    }
    free(host);
}

static int same(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* Every collective of k against its definition, for n floats cut as bounds. rank_order: the
 * all-reduce sums in rank order (cuda-local), so the parts are checked against that sum too. */
static void check_collectives(ranks *k, size_t n, const size_t *b, int rank_order) {
    int p = k->p;
    float *ar = malloc((size_t)p * n * sizeof(float) + 4), *got = malloc((size_t)p * n * 4 + 4);
    cr_assert(ar && got);
    run_op(k, AR, n, NULL, 0, 1, ar);
    run_op(k, RS, n, b, 0, 1, got);
    for (int r = 0; r < p; r++)
        for (size_t i = b[r]; i < b[r + 1]; i++) {
            float g = got[(size_t)r * n + i];
            cr_assert(same(g, ar[(size_t)r * n + i]),
                      "%s %d ranks n %zu: reduce-scatter rank %d element %zu is %a, the "
                      "all-reduce's %a",
                      k->R->name, p, n, r, i, (double)g, (double)ar[(size_t)r * n + i]);
            if (!rank_order) continue;
            float s = input(0, i, 1);
            for (int q = 1; q < p; q++) s += input(q, i, 1);
            cr_assert(same(g, s), "%s: reduce-scatter element %zu is not the rank-order sum",
                      k->R->name, i);
        }
    run_op(k, AG, n, b, 0, 2, got);
    for (int r = 0; r < p; r++)
        for (int q = 0; q < p; q++)
            for (size_t i = b[q]; i < b[q + 1]; i++)
                cr_assert(same(got[(size_t)r * n + i], input(q, i, 2)),
                          "%s %d ranks n %zu: all-gather rank %d element %zu is not rank %d's",
                          k->R->name, p, n, r, i, q);
    if (k->R->all_gather_start) { /* started ahead (FSDP's prefetch), then finished */
        run_op(k, AGS, n, b, 0, 4, got);
        for (int r = 0; r < p; r++)
            for (int q = 0; q < p; q++)
                for (size_t i = b[q]; i < b[q + 1]; i++)
                    cr_assert(same(got[(size_t)r * n + i], input(q, i, 4)),
                              "%s %d ranks n %zu: started all-gather rank %d element %zu is not "
                              "rank %d's",
                              k->R->name, p, n, r, i, q);
    }
    for (int root = 0; root < p; root++) {
        run_op(k, BC, n, NULL, root, 3, got);
        for (int r = 0; r < p; r++)
            for (size_t i = 0; i < n; i++)
                cr_assert(same(got[(size_t)r * n + i], input(root, i, 3)),
                          "%s %d ranks n %zu: broadcast from %d, rank %d element %zu", k->R->name,
                          p, n, root, r, i);
    }
    free(ar);
    free(got);
}

/* Cuts of n over p ranks: even slices, and uneven with an empty part (rank 0 when p > 1). */
static void cuts(size_t n, int p, size_t even[MAXR + 1], size_t uneven[MAXR + 1]) {
    for (int r = 0; r <= p; r++) {
        even[r] = mw__slice_lo(n, p, r);
        uneven[r] = r == 0 ? 0 : r == p ? n : n / 3 + (size_t)(r - 1) * (n / 7);
        if (uneven[r] > n) uneven[r] = n;
    }
    if (p > 1) uneven[1] = 0; /* rank 0's part is empty */
}

static void check_reducer(const mw__reducer_vtable *R, int p, int rank_order) {
    static const size_t lens[] = {0, 1, 7, 100003};
    ranks k;
    open_ranks(&k, p, R, 60000, 0);
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        size_t even[MAXR + 1], uneven[MAXR + 1];
        cuts(lens[li], p, even, uneven);
        check_collectives(&k, lens[li], even, rank_order);
        check_collectives(&k, lens[li], uneven, rank_order);
    }
    close_ranks(&k);
}

Test(gpu, cuda_local_collectives_match_their_definitions) {
    need_gpu();
    for (int p = 1; p <= 3; p++) check_reducer(&mw__reducer_cuda_local, p, 1);
}

/* One rank stays away: the other times out, later calls are refused until reset, then the
 * collective works. */
Test(gpu, cuda_local_collectives_time_out_and_reset) {
    need_gpu();
    ranks k;
    open_ranks(&k, 2, &mw__reducer_cuda_local, 200, 0);
    size_t b[3] = {0, 20, 64};
    float *d, out[128];
    OK(k.dp[0]->vt->alloc(k.dp[0], 64 * sizeof(float), (void **)&d));
    for (int op = RS; op <= BC; op++) {
        job j = {.k = &k, .rank = 0, .op = op, .root = 1, .buf = d, .n = 64, .bounds = b};
        job_main(&j);
        cr_assert_eq(j.st, MW_ERR_TIMEOUT, "op %d: got %s: %s", op, mw_status_name(j.st), j.msg);
        j.rank = 1;
        job_main(&j);
        cr_assert_eq(j.st, MW_ERR_ABORTED, "op %d: got %s: %s", op, mw_status_name(j.st), j.msg);
        k.R->reset(k.comm);
        run_op(&k, op, 64, b, 1, 4, out);
        for (int i = 0; i < 64; i++) {
            float want = op == BC   ? input(1, (size_t)i, 4)
                         : op == AG ? input(i < 20 ? 0 : 1, (size_t)i, 4)
                                    : input(0, (size_t)i, 4) + input(1, (size_t)i, 4);
            float g = out[(i < 20 ? 0 : 64) + i];
            cr_assert(same(g, want), "op %d after reset: element %d", op, i);
        }
    }
    k.dp[0]->vt->free(k.dp[0], d);
    close_ranks(&k);
}

/* A started all-gather (FSDP's prefetch) whose peer never comes: under the timeout the rank gives
 * up with MW_ERR_TIMEOUT and the latecomer finds the communicator aborted; under an abort from
 * the host the waiting rank returns MW_ERR_ABORTED. After reset a started all-gather of both
 * ranks gathers every part. */
static void *start_gather(void *arg) {
    job *j = arg;
    j->st = j->k->R->all_gather_start(j->k->comm, j->rank, j->buf, j->n, MW_F32, j->bounds);
    if (j->st == MW_OK) j->st = j->k->R->finish(j->k->comm, j->rank);
    snprintf(j->msg, sizeof j->msg, "%s", mw_last_error());
    return NULL;
}

Test(gpu, cuda_local_started_all_gather_times_out_or_aborts_and_resets) {
    need_gpu();
    ranks k;
    open_ranks(&k, 2, &mw__reducer_cuda_local, 200, 0);
    size_t b[3] = {0, 20, 64};
    float *d, out[128];
    OK(k.dp[0]->vt->alloc(k.dp[0], 64 * sizeof(float), (void **)&d));
    job j = {.k = &k, .rank = 0, .op = AGS, .buf = d, .n = 64, .bounds = b};
    start_gather(&j);
    cr_assert_eq(j.st, MW_ERR_TIMEOUT, "alone: %s: %s", mw_status_name(j.st), j.msg);
    j.rank = 1;
    start_gather(&j);
    cr_assert_eq(j.st, MW_ERR_ABORTED, "late: %s: %s", mw_status_name(j.st), j.msg);
    k.R->reset(k.comm);
    run_op(&k, AGS, 64, b, 0, 6, out);
    k.R->comm_free(k.comm);
    /* Without a timeout: rank 0 waits until the host aborts. */
    mw__comm_options opt = {.timeout_ms = 0};
    OK(k.R->comm_new(2, k.dp, &opt, &k.comm));
    j = (job){.k = &k, .rank = 0, .op = AGS, .buf = d, .n = 64, .bounds = b};
    cr_assert_eq(pthread_create(&j.thread, NULL, start_gather, &j), 0);
    struct timespec nap = {0, 50 * 1000 * 1000};
    nanosleep(&nap, NULL);
    k.R->abort(k.comm);
    pthread_join(j.thread, NULL);
    cr_assert_eq(j.st, MW_ERR_ABORTED, "aborted: %s: %s", mw_status_name(j.st), j.msg);
    k.R->reset(k.comm);
    run_op(&k, AGS, 64, b, 0, 7, out);
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 64; i++)
            cr_assert(same(out[r * 64 + i], input(i < 20 ? 0 : 1, (size_t)i, 7)),
                      "after the abort and reset: rank %d element %d", r, i);
    k.dp[0]->vt->free(k.dp[0], d);
    close_ranks(&k);
}

#ifdef MESHWIT_HAVE_NCCL
Test(gpu, nccl_collectives_match_their_definitions) {
    int gpus = need_gpu();
    check_reducer(&mw__reducer_nccl, 1, 1);
    if (gpus < 2) cr_skip("NCCL with one rank checked; several ranks need several GPUs");
    check_reducer(&mw__reducer_nccl, gpus < MAXR ? gpus : MAXR, 0);
}

/* A bad argument aborts; later calls are refused until reset, which keeps the communicator when
 * nothing was in flight; then every collective works. */
Test(gpu, nccl_collectives_refuse_bad_arguments_and_reset) {
    need_gpu();
    ranks k;
    open_ranks(&k, 1, &mw__reducer_nccl, 60000, 0);
    float *d, out[64];
    OK(k.dp[0]->vt->alloc(k.dp[0], 64 * sizeof(float), (void **)&d));
    size_t past[2] = {0, 65};
    cr_assert_eq(k.R->reduce_scatter_sum(k.comm, 0, d, 64, MW_F32, past), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "parts outside the buffer"), "%s", mw_last_error());
    cr_assert_eq(k.R->broadcast(k.comm, 0, d, 64, MW_F32, 0), MW_ERR_ABORTED);
    k.R->reset(k.comm);
    cr_assert_eq(k.R->broadcast(k.comm, 0, d, 64, MW_F32, 1), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "root out of range"), "%s", mw_last_error());
    k.R->reset(k.comm);
    size_t b[2] = {0, 64};
    for (int op = RS; op <= BC; op++) {
        run_op(&k, op, 64, b, 0, 5, out);
        for (int i = 0; i < 64; i++)
            cr_assert(same(out[i], input(0, (size_t)i, 5)), "op %d element %d", op, i);
    }
    k.dp[0]->vt->free(k.dp[0], d);
    close_ranks(&k);
}
#endif

#endif /* MESHWIT_HAVE_CUDA */
