/* Point-to-point calls of the GPU reducers against their definition (suite gpu_p2p, through
 * main.c's gate: skipped without a GPU, failed then when MESHWIT_REQUIRE_GPU=1): the cuda-local
 * reducer (2 to 4 devices sharing GPU 0) and NCCL (one rank, sending to itself; every pair and a
 * ring where there are several GPUs). What a rank receives into device memory is what its peer
 * sent, bit for bit (f32 and bf16, NaN payloads included), at lengths 0, 1, odd and large, for
 * every ordered pair and a ring of sendrecv both ways; messages of a pair arrive in order; the
 * sender's next kernels may overwrite its buffer (the transfer is ordered before them); calls
 * that disagree fail on both ranks naming both; a receiver whose sender never comes times out
 * or is aborted, and after reset the pair transfers. The host-side logic is also tested on fakes
 * (tests/gpu/fake: cuda_local_host, nccl_host, nccl_mpi_host). */
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

#define LARGE ((1u << 20) + 3)

/* Byte i of message `salt` from rank r: every bit pattern, NaNs included. */
static uint8_t byte_of(int r, int salt, size_t i) {
    uint32_t x = (uint32_t)(r * 131 + salt * 7919 + 1) * 2654435761u ^ (uint32_t)i * 40503u;
    x ^= x >> 13;
    return (uint8_t)(x * 0x5bd1e995u >> 19);
}

static size_t esize(mw_dtype d) { return d == MW_BF16 ? 2 : 4; }

/* What one rank does: send to `to`, receive from `from` (either -1), n elements. */
typedef struct job {
    pthread_t thread;
    ranks *k;
    int rank, to, from;
    size_t n;
    mw_dtype dtype;
    int messages;  /* in a row, to the same peers */
    int overwrite; /* after each send, the sender's next upload overwrites its buffer */
    mw_status st;
    char msg[MW__MSG_SIZE];
} job;

static void *job_main(void *arg) {
    job *j = arg;
    ranks *k = j->k;
    mw__device *d = k->dp[j->rank];
    size_t bytes = j->n * esize(j->dtype);
    uint8_t *host = malloc(bytes + 1);
    j->st = host ? MW_OK : MW_ERR_NOMEM;
    for (int m = 0; m < j->messages && !j->st; m++) {
        uint8_t *out = k->out[j->rank] + (size_t)m * bytes,
                *in = k->in[j->rank] + (size_t)m * bytes;
        for (size_t i = 0; i < bytes; i++) host[i] = byte_of(j->rank, m, i);
        if (j->to >= 0 && bytes) j->st = d->vt->upload(d, out, host, bytes);
        if (j->st) break;
        j->st = j->from < 0 ? k->R->send(k->comm, j->rank, j->to, out, j->n, j->dtype)
                : j->to < 0
                    ? k->R->recv(k->comm, j->rank, j->from, in, j->n, j->dtype)
                    : k->R->sendrecv(k->comm, j->rank, j->to, out, j->from, in, j->n, j->dtype);
        /* Ordered after the transfer on this device's stream: must not reach the peer. */
        if (!j->st && j->overwrite && j->to >= 0 && bytes) {
            memset(host, 0x5a, bytes);
            j->st = d->vt->upload(d, out, host, bytes);
        }
    }
    if (!j->st) j->st = d->vt->sync(d);
    if (j->st) {
        snprintf(j->msg, sizeof j->msg, "%s", mw_last_error());
        k->R->abort(k->comm);
    }
    free(host);
    return NULL;
}

/* Runs the jobs (one per rank), asserts each went well, and checks every receive buffer: message
 * m of rank r's `from` is there, bit for bit. */
static void run_and_check(ranks *k, job *j, const char *what) {
    for (int r = 0; r < k->p; r++)
        cr_assert_eq(pthread_create(&j[r].thread, NULL, job_main, &j[r]), 0);
    for (int r = 0; r < k->p; r++) pthread_join(j[r].thread, NULL);
    for (int r = 0; r < k->p; r++)
        cr_assert_eq(j[r].st, MW_OK, "%s %s rank %d: %s: %s", k->R->name, what, r,
                     mw_status_name(j[r].st), j[r].msg);
    for (int r = 0; r < k->p; r++) {
        if (j[r].from < 0) continue;
        size_t bytes = j[r].n * esize(j[r].dtype), all = bytes * (size_t)j[r].messages;
        if (!all) continue;
        uint8_t *got = malloc(all);
        cr_assert_not_null(got);
        OK(k->dp[r]->vt->download(k->dp[r], got, k->in[r], all));
        for (int m = 0; m < j[r].messages; m++)
            for (size_t i = 0; i < bytes; i++)
                cr_assert_eq(got[(size_t)m * bytes + i], byte_of(j[r].from, m, i),
                             "%s %s: rank %d message %d from rank %d, byte %zu of %zu", k->R->name,
                             what, r, m, j[r].from, i, bytes);
        free(got);
    }
}

/* Every ordered pair (the others stand by), and rings of sendrecv both ways. */
static void check_reducer(const mw__reducer_vtable *R, int p) {
    static const size_t lens[] = {0, 1, 7, 1023, LARGE};
    ranks k;
    open_ranks(&k, p, R, 60000, (size_t)LARGE * 4);
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++)
        for (int d = 0; d < 2; d++) {
            mw_dtype dt = d ? MW_BF16 : MW_F32;
            char what[64];
            for (int from = 0; from < p; from++)
                for (int to = 0; to < p; to++) {
                    if (from == to) continue;
                    job j[MAXR];
                    for (int r = 0; r < p; r++)
                        j[r] = (job){.k = &k,
                                     .rank = r,
                                     .to = -1,
                                     .from = -1,
                                     .n = 0,
                                     .dtype = dt,
                                     .messages = 0};
                    j[from].to = to, j[to].from = from;
                    j[from].n = j[to].n = lens[li];
                    j[from].messages = j[to].messages = 1;
                    j[from].overwrite = 1;
                    snprintf(what, sizeof what, "pair %d -> %d n %zu %s", from, to, lens[li],
                             d ? "bf16" : "f32");
                    run_and_check(&k, j, what);
                }
            for (int step = -1; step <= 1; step++) { /* step 0: each rank to itself */
                job j[MAXR];
                for (int r = 0; r < p; r++)
                    j[r] = (job){.k = &k,
                                 .rank = r,
                                 .to = (r + step + p) % p,
                                 .from = (r - step + p) % p,
                                 .n = lens[li],
                                 .dtype = dt,
                                 .messages = 1,
                                 .overwrite = 1};
                snprintf(what, sizeof what, "ring step %d n %zu %s", step, lens[li],
                         d ? "bf16" : "f32");
                run_and_check(&k, j, what);
            }
        }
    close_ranks(&k);
}

/* Several messages of one pair, in a row, land in order (each into its own part of the buffer). */
static void check_order(const mw__reducer_vtable *R, int p) {
    ranks k;
    open_ranks(&k, p, R, 60000, (size_t)LARGE * 4);
    job j[MAXR];
    for (int r = 0; r < p; r++) j[r] = (job){.k = &k, .rank = r, .to = -1, .from = -1};
    int to = p > 1 ? 1 : 0;
    j[0].to = to, j[to].from = 0;
    j[0].n = j[to].n = 4097;
    j[0].dtype = j[to].dtype = MW_F32;
    j[0].messages = j[to].messages = 20;
    run_and_check(&k, j, "20 messages in a row");
    close_ranks(&k);
}

Test(gpu_p2p, cuda_local_transfers_match_their_definition) {
    need_gpu();
    for (int p = 2; p <= MAXR; p++) check_reducer(&mw__reducer_cuda_local, p);
    check_order(&mw__reducer_cuda_local, 2);
}

/* Calls that disagree, then a receiver alone: the timeout, the latecomer refused, reset. */
static void check_faults(const mw__reducer_vtable *R) {
    ranks k;
    open_ranks(&k, 2, R, 200, (size_t)LARGE * 4);
    job j[2] = {{.k = &k, .rank = 0, .to = 1, .from = -1, .n = 8, .dtype = MW_F32, .messages = 1},
                {.k = &k, .rank = 1, .to = -1, .from = 0, .n = 6, .dtype = MW_F32, .messages = 1}};
    for (int r = 0; r < 2; r++)
        cr_assert_eq(pthread_create(&j[r].thread, NULL, job_main, &j[r]), 0);
    for (int r = 0; r < 2; r++) pthread_join(j[r].thread, NULL);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(j[r].st, MW_ERR_INVALID, "%s rank %d: %s", R->name, r, j[r].msg);
        cr_assert(strstr(j[r].msg, "rank 0 sends 8 f32 elements to rank 1, but rank 1 receives 6 "
                                   "f32 elements from rank 0"),
                  "%s rank %d: %s", R->name, r, j[r].msg);
    }
    R->reset(k.comm); /* job_main aborted on the failure */
    job alone = j[1];
    alone.n = 8;
    job_main(&alone);
    cr_assert_eq(alone.st, MW_ERR_TIMEOUT, "%s alone: %s: %s", R->name, mw_status_name(alone.st),
                 alone.msg);
    cr_assert_eq(R->send(k.comm, 0, 1, k.out[0], 8, MW_F32), MW_ERR_ABORTED, "%s late: %s", R->name,
                 mw_last_error());
    R->reset(k.comm);
    j[1].n = 8;
    run_and_check(&k, j, "after the reset");
    close_ranks(&k);
}

Test(gpu_p2p, cuda_local_refuses_disagreeing_calls_times_out_and_resets) {
    need_gpu();
    check_faults(&mw__reducer_cuda_local);
}

#ifdef MESHWIT_HAVE_NCCL
Test(gpu_p2p, nccl_transfers_match_their_definition) {
    int gpus = need_gpu();
    /* One rank: a sendrecv to itself, at every length. */
    ranks k;
    open_ranks(&k, 1, &mw__reducer_nccl, 60000, (size_t)LARGE * 4);
    static const size_t lens[] = {0, 1, 7, LARGE};
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++)
        for (int d = 0; d < 2; d++) {
            job j = {.k = &k,
                     .rank = 0,
                     .to = 0,
                     .from = 0,
                     .n = lens[li],
                     .dtype = d ? MW_BF16 : MW_F32,
                     .messages = 1,
                     .overwrite = 1};
            run_and_check(&k, &j, "to itself");
        }
    close_ranks(&k);
    if (gpus < 2) cr_skip("NCCL with one rank checked; pairs need several GPUs");
    check_reducer(&mw__reducer_nccl, gpus < MAXR ? gpus : MAXR);
    check_order(&mw__reducer_nccl, 2);
}

Test(gpu_p2p, nccl_refuses_disagreeing_calls_times_out_and_resets) {
    if (need_gpu() < 2) cr_skip("a pair of NCCL ranks needs two GPUs");
    check_faults(&mw__reducer_nccl);
}
#endif

#endif /* MESHWIT_HAVE_CUDA */
