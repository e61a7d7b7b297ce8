/* Run under mpirun -n 2: a small GPT-2 (examples/common/gpt2_model.c, its head tied to the token
 * embedding) in a pipeline whose axis P=2 crosses the processes, stage 0 in process 0 and stage 1
 * in process 1, through mw_trainer_config.pipeline_axis.
 *
 *   mpi_pipeline fault   rank 1's device fails (injected fault) in the backward pass of step 2:
 *                        that step fails in both processes with the same status and rank 1's
 *                        message, changes nothing, and the job goes on; after the steps every
 *                        parameter (read through the pipeline, a collective) equals, bit for
 *                        bit, gradient accumulation over the same micro-batches on one device of
 *                        this process that skipped the failed step's batch, every step's loss too;
 *                        the replica check (the tied embedding's copy in process 1 against
 *                        process 0's) passes, and after one process's copy is changed behind the
 *                        pipeline's back it fails in both, naming the parameter
 *   mpi_pipeline stall   rank 1's device stalls for 30 s in step 1; rank 0, waiting for the
 *                        gradient that process sends, gives up after collective_timeout_ms
 *                        (2 s) with MW_ERR_TIMEOUT, and ends the job
 * Exit 0 when all holds, 1 when it does not, 2 on an error (the stall mode: the job ends through
 * mw_distributed_abort; tests/mpi/expect_failure.cmake checks the status and message). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2_model.h"
#include "meshwit/testing.h"
#include "parallel/pipeline_impl.h"
#include "parallel/trainer_impl.h"

enum { BM = 2, M = 4, SEQ = 16, STEPS = 5, FAIL_AT = 2, MAXP = 64 };

static const gpt2_config config = {
    .layers = 2, .heads = 2, .channels = 32, .max_seq = 16, .vocab = 61, .padded_vocab = 64};

static mw_trainer_config train_config(int timeout_ms) {
    return (mw_trainer_config){.optimizer = {.kind = MW_ADAMW,
                                             .lr = 3e-3f,
                                             .beta1 = 0.9f,
                                             .beta2 = 0.95f,
                                             .eps = 1e-8f,
                                             .weight_decay = 0.1f},
                               .collective_timeout_ms = timeout_ms};
}

/* Step s's batch: M micro-batches of BM rows. */
static void batch(int s, int32_t *tokens, int32_t *targets) {
    for (int i = 0; i < M * BM * SEQ; i++) {
        tokens[i] = (int32_t)((i * 7 + s * 13 + i / SEQ) % config.vocab);
        targets[i] = (int32_t)((tokens[i] * 3 + 1) % config.vocab);
    }
}

typedef struct model {
    int n;
    char name[MAXP][MW_MAX_NAME];
    int64_t count[MAXP];
    float *value[MAXP];
    float loss[STEPS];
} model;

static mw_status read_all(mw_trainer *tr, model *out) {
    out->n = mw_trainer_param_count(tr);
    mw_status st = out->n <= MAXP ? MW_OK : MW_ERR_INVALID;
    for (int i = 0; st == MW_OK && i < out->n; i++) {
        mw_param_info pi;
        if ((st = mw_trainer_param_info(tr, i, &pi))) break;
        snprintf(out->name[i], MW_MAX_NAME, "%s", pi.name);
        out->count[i] = pi.count;
        out->value[i] = malloc((size_t)pi.count * sizeof(float));
        st = out->value[i] ? mw_trainer_read_param(tr, pi.name, out->value[i], pi.count)
                           : MW_ERR_NOMEM;
    }
    return st;
}

static void model_free(model *m) {
    for (int i = 0; i < m->n; i++) free(m->value[i]);
}

static mw_status build(mw_graph **g, gpt2_graph *m) {
    mw_status st = mw_graph_new(g);
    if (st) return st;
    mw_graph_set_seed(*g, 23);
    gpt2_layout lo = {.batch = BM, .seq = SEQ};
    st = gpt2_build(*g, &config, &lo, m);
    if (st) fprintf(stderr, "gpt2_build: %s\n", mw_graph_error(*g));
    return st;
}

/* Gradient accumulation over the micro-batches on one device of this process, the failed
 * step's batch skipped. */
static mw_status reference(model *out) {
    mw_graph *g = NULL;
    gpt2_graph m;
    mw_mesh *one = NULL;
    mw_trainer *tr = NULL;
    mw_trainer_config c = train_config(0);
    c.grad_accumulation = 1;
    mw_status st = build(&g, &m);
    if (st == MW_OK) st = mw_mesh_new_local("cpu:1", "X", &one);
    if (st == MW_OK) st = mw_trainer_new(g, m.loss, one, &c, &tr);
    static int32_t tokens[M * BM * SEQ], targets[M * BM * SEQ];
    for (int s = 0, k = 0; st == MW_OK && s < STEPS + 1; s++) {
        if (s == FAIL_AT) continue;
        batch(s, tokens, targets);
        double sum = 0;
        for (int j = 0; st == MW_OK && j < M; j++) {
            mw_feed f[2] = {{"tokens", tokens + j * BM * SEQ, BM * SEQ},
                            {"targets", targets + j * BM * SEQ, BM * SEQ}};
            float l = NAN;
            st = j < M - 1 ? mw_trainer_accumulate(tr, f, 2, &l) : mw_trainer_step(tr, f, 2, &l);
            sum += l;
        }
        out->loss[k++] = (float)(sum / M);
    }
    if (st == MW_OK) st = read_all(tr, out);
    if (st) fprintf(stderr, "[rank %d] reference: %s\n", mw_distributed_rank(), mw_last_error());
    mw_trainer_free(tr);
    mw_mesh_free(one);
    mw_graph_free(g);
    return st;
}

/* The pipeline over P=2 across the processes (one cpu:1 device each), as a trainer. */
static mw_status make_pipeline(int timeout_ms, mw_pipeline_schedule schedule, mw_graph **g,
                               mw_mesh **mesh, mw_trainer **tr) {
    gpt2_graph m;
    mw_trainer_config c = train_config(timeout_ms);
    c.pipeline_axis = "P";
    c.micro_batches = M;
    c.pipeline_schedule = schedule;
    mw_status st = build(g, &m);
    if (st == MW_OK) st = mw_mesh_new("cpu:1", "P=2", mesh);
    if (st == MW_OK) st = mw_trainer_new(*g, m.loss, *mesh, &c, tr);
    return st;
}

static int fault_main(void) {
    int rank = mw_distributed_rank(), rc = 0;
    model ref = {0}, got = {0};
    mw_graph *g = NULL;
    mw_mesh *mesh = NULL;
    mw_trainer *tr = NULL;
    mw_status st = reference(&ref);
    if (st == MW_OK) st = make_pipeline(60000, MW_SCHEDULE_1F1B, &g, &mesh, &tr);
    if (st == MW_OK && mw_trainer_devices(tr) != 2) {
        fprintf(stderr, "[rank %d] the pipeline has %d devices, not 2\n", rank,
                mw_trainer_devices(tr));
        st = MW_ERR_STATE;
    }
    /* rank 1 arms its device (device 1 of the mesh); rank 0 cannot arm another process's */
    if (st == MW_OK && rank == 0 &&
        mw_test_control(MW_TEST_FAULT, tr, 1, MW_PHASE_BACKWARD, (int64_t)FAIL_AT,
                        (int)MW_ERR_DEVICE) != MW_ERR_INVALID) {
        fprintf(stderr, "[rank 0] arming another process's device was not refused\n");
        rc = 1;
    }
    if (st == MW_OK && rank == 1)
        st = (mw_status)mw_test_control(MW_TEST_FAULT, tr, 1, MW_PHASE_BACKWARD, (int64_t)FAIL_AT,
                                        (int)MW_ERR_DEVICE);
    static int32_t tokens[M * BM * SEQ], targets[M * BM * SEQ];
    mw_feed f[2] = {{"tokens", tokens, M * BM * SEQ}, {"targets", targets, M * BM * SEQ}};
    for (int s = 0, k = 0; st == MW_OK && s < STEPS + 1; s++) {
        batch(s, tokens, targets);
        float l = NAN;
        mw_status sst = mw_trainer_step(tr, f, 2, &l);
        if (s != FAIL_AT) {
            st = sst;
            got.loss[k++] = l;
            continue;
        }
        const char *msg = mw_last_error();
        int ok = sst == MW_ERR_DEVICE && strstr(msg, "process 1") &&
                 strstr(msg, "injected fault") && mw_trainer_steps(tr) == FAIL_AT;
        printf("[rank %d] step %d failed: %s [%s]: %s\n", rank, s, mw_strerror(sst),
               mw_status_name(sst), msg);
        if (!ok) {
            fprintf(stderr,
                    "[rank %d] the failed step: not MW_ERR_DEVICE naming process 1's "
                    "injected fault with the step count kept\n",
                    rank);
            rc = 1;
        }
    }
    if (st == MW_OK) st = read_all(tr, &got);
    if (st == MW_OK && (st = mw_trainer_check_replicas(tr)))
        fprintf(stderr, "[rank %d] replicas: %s\n", rank, mw_last_error());
    int64_t differ = got.n != ref.n;
    for (int i = 0; st == MW_OK && !differ && i < ref.n; i++)
        differ += got.count[i] != ref.count[i] ||
                  memcmp(got.value[i], ref.value[i], (size_t)ref.count[i] * sizeof(float)) != 0;
    for (int s = 0; st == MW_OK && s < STEPS; s++)
        differ += memcmp(&got.loss[s], &ref.loss[s], sizeof(float)) != 0;
    if (st == MW_OK)
        printf("[rank %d] after %d steps and a failed one: %lld of %d parameters and %d losses "
               "differ from accumulation on one device\n",
               rank, STEPS, (long long)differ, ref.n, STEPS);
    rc |= differ != 0;
    /* One process's copy of the tied embedding changed behind the pipeline's back (through its
     * stage's own trainer): both processes' replica checks fail, naming it. */
    mw_trainer *last = st == MW_OK ? mw__pipeline_stage_trainer(tr->pipe, 1) : NULL;
    if (st == MW_OK && (rank == 1) != (last != NULL)) {
        fprintf(stderr, "[rank %d] stage 1 %s here\n", rank, last ? "is" : "is not");
        rc = 1;
    }
    if (st == MW_OK && last) {
        int w = 0;
        while (w < ref.n && strcmp(ref.name[w], "wte")) w++;
        if (w == ref.n) {
            fprintf(stderr, "[rank 1] no wte\n");
            st = MW_ERR_NOT_FOUND;
        } else {
            ref.value[w][5] += 1.0f;
            st = mw_trainer_write_param(last, "wte", ref.value[w], ref.count[w]);
        }
    }
    if (st == MW_OK) {
        mw_status cst = mw_trainer_check_replicas(tr);
        printf("[rank %d] replica check after a copy changed: %s: %s\n", rank, mw_status_name(cst),
               cst ? mw_last_error() : "");
        if (cst != MW_ERR_STATE || !strstr(mw_last_error(), "'wte'")) rc = 1;
    }
    if (st)
        fprintf(stderr, "[rank %d] %s [%s]: %s\n", rank, mw_strerror(st), mw_status_name(st),
                mw_last_error());
    model_free(&ref);
    model_free(&got);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    return st ? 2 : rc;
}

static int stall_main(void) {
    int rank = mw_distributed_rank();
    mw_graph *g = NULL;
    mw_mesh *mesh = NULL;
    mw_trainer *tr = NULL;
    mw_status st = make_pipeline(2000, MW_SCHEDULE_GPIPE, &g, &mesh, &tr);
    if (st == MW_OK && rank == 1)
        st = (mw_status)mw_test_control(MW_TEST_STALL, tr, 1, MW_PHASE_BACKWARD, (int64_t)1, 30000);
    static int32_t tokens[M * BM * SEQ], targets[M * BM * SEQ];
    mw_feed f[2] = {{"tokens", tokens, M * BM * SEQ}, {"targets", targets, M * BM * SEQ}};
    for (int s = 0; st == MW_OK && s < 3; s++) {
        batch(s, tokens, targets);
        st = mw_trainer_step(tr, f, 2, NULL);
    }
    if (st) {
        fprintf(stderr, "[rank %d] training failed: %s [%s]: %s\n", rank, mw_strerror(st),
                mw_status_name(st), mw_last_error());
        mw_distributed_abort(4);
    }
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    return 0;
}

int main(int argc, char **argv) {
    if (mw_distributed_init(&argc, &argv) != MW_OK) return 2;
    int rc = 2;
    if (argc == 2 && strcmp(argv[1], "fault") == 0)
        rc = fault_main();
    else if (argc == 2 && strcmp(argv[1], "stall") == 0)
        rc = stall_main();
    else
        fprintf(stderr, "usage: mpi_pipeline fault|stall\n");
    if (rc == 2) mw_distributed_abort(2);
    mw_distributed_finalize();
    return rc;
}
