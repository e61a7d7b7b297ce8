/* Run under `mpirun -np 2`: trust between processes.
 *
 *   mpi_trust all       every check below, one after another; exit 0 when all pass
 *     graph     rank 1 traces another hidden size: trainer creation fails on both ranks, naming
 *               the parameter, its axes on each rank and both ranks
 *     config    rank 1 asks for another learning rate: likewise, naming the option
 *     seed      each rank seeds its graph differently: rank 0's initial parameters win
 *     replicas  rank 1 changes a parameter behind the trainer's back: the periodic replica
 *               check fails on both ranks, naming the parameter and the ranks; also with the
 *               parameters split over a mesh axis inside each process (X=2,Y=2 over cpu:2 per
 *               rank: data parallel across the ranks, w1 and w2 split over Y), where each shard's
 *               replicas live on both ranks
 *     stop      rank 1 requests a stop: both stop at the same step, then go on together
 *     skip      a NaN in rank 1's rows only: both ranks skip the step
 *     agree     mw_distributed_agree names the first differing line and the ranks
 *   mpi_trust timeout   rank 1 makes the mesh, never the trainer: rank 0 fails with MW_ERR_TIMEOUT
 *                       within the collective timeout and ends the job (expect_failure.cmake)
 * Exit status: 0 passed, 1 a check failed, 2 an unexpected error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meshwit.h"

#define ROWS 16
#define FEATURES 4

static int rank;
static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "[rank %d] %s:%d: check failed: %s: ", rank, __FILE__, __LINE__,       \
                    #cond);                                                                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

typedef struct model {
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
    float x[ROWS * FEATURES], y[ROWS];
    mw_feed feeds[2];
} model;

/* loss = mean((relu-free two-layer x . w1 . w2 + b - y)^2), Batch sharded over every process.
 * split: each process holds cpu:2 as Y, Hidden split over Y (tensor parallel inside a process),
 * the batch over X across the processes. */
static mw_status model_make_on(model *m, int hidden, uint64_t seed, const mw_trainer_config *cfg,
                               int split) {
    memset(m, 0, sizeof *m);
    mw_status st = mw_graph_new(&m->g);
    if (st) return st;
    mw_graph *g = m->g;
    mw_graph_set_seed(g, seed);
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", ROWS}, {"Feature", FEATURES}));
    mw_tensor *y = mw_input(g, "y", MW_F32, MW_AXES({"Batch", ROWS}));
    x = mw_shard(g, x, "Batch", "X");
    y = mw_shard(g, y, "Batch", "X");
    mw_tensor *w1 =
        mw_param(g, "w1", MW_AXES({"Feature", FEATURES}, {"Hidden", hidden}), MW_INIT_NORMAL(0.5f));
    mw_tensor *w2 = mw_param(g, "w2", MW_AXES({"Hidden", hidden}), MW_INIT_NORMAL(0.5f));
    mw_tensor *b = mw_param(g, "b", MW_SCALAR, MW_INIT_CONST(0.25f));
    if (split) {
        mw_shard(g, w1, "Hidden", "Y");
        mw_shard(g, w2, "Hidden", "Y");
    }
    mw_tensor *h = mw_dot(g, x, w1, "Feature");
    mw_tensor *err = mw_sub(g, mw_add(g, mw_dot(g, h, w2, "Hidden"), b), y);
    mw_tensor *loss = mw_mean(g, mw_mul(g, err, err), NULL);
    if ((st = mw_graph_status(g)) ||
        (st = mw_mesh_new(split ? "cpu:2" : "cpu:1", split ? "X=2,Y=2" : "X", &m->mesh)))
        return st;
    for (int r = 0; r < ROWS; r++) {
        for (int f = 0; f < FEATURES; f++) m->x[r * FEATURES + f] = (float)((r * 3 + f) % 7) - 3;
        m->y[r] = (float)(r % 5) - 2;
    }
    m->feeds[0] = (mw_feed){"x", m->x, ROWS * FEATURES};
    m->feeds[1] = (mw_feed){"y", m->y, ROWS};
    return mw_trainer_new(g, loss, m->mesh, cfg, &m->tr);
}

static mw_status model_make(model *m, int hidden, uint64_t seed, const mw_trainer_config *cfg) {
    return model_make_on(m, hidden, seed, cfg, 0);
}

static void model_free(model *m) {
    mw_trainer_free(m->tr);
    mw_mesh_free(m->mesh);
    mw_graph_free(m->g);
    memset(m, 0, sizeof *m);
}

static mw_trainer_config config(float lr) {
    return (mw_trainer_config){
        .optimizer = {MW_ADAMW, .lr = lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f},
        .collective_timeout_ms = 20000};
}

static int contains(const char *msg, const char *part) { return strstr(msg, part) != NULL; }

static void check_graph(void) {
    model m;
    mw_trainer_config cfg = config(0.05f);
    mw_status st = model_make(&m, rank == 1 ? 3 : 4, 1, &cfg);
    const char *msg = mw_last_error();
    CHECK(st == MW_ERR_INVALID, "%s: %s", mw_status_name(st), msg);
    CHECK(contains(msg, "rank 1: parameter 'w1' has axes f32[Feature=4, Hidden=3]"), "%s", msg);
    CHECK(contains(msg, "rank 0: parameter 'w1' has axes f32[Feature=4, Hidden=4]"), "%s", msg);
    model_free(&m);
}

static void check_config(void) {
    model m;
    mw_trainer_config cfg = config(rank == 1 ? 0.1f : 0.05f);
    mw_status st = model_make(&m, 4, 1, &cfg);
    const char *msg = mw_last_error();
    CHECK(st == MW_ERR_INVALID, "%s: %s", mw_status_name(st), msg);
    CHECK(contains(msg, "rank 1: optimizer.lr 0.100000001; rank 0: optimizer.lr 0.0500000007"),
          "%s", msg);
    model_free(&m);
}

/* Decays w2, where the default rule decays w1 (a matrix) only. */
static int decays_w2_only(const char *name, int rank_, void *user) {
    (void)rank_, (void)user;
    return strcmp(name, "w2") == 0;
}

/* Fields the fingerprint once left out: SGD's momentum, gradient accumulation, what to do with a
 * non-finite step, and the parameters a decays function picks (each process's own function). */
static void check_more_fields(void) {
    static const char *const want[] = {"optimizer.momentum", "grad_accumulation", "nonfinite",
                                       "weight decay"};
    for (int k = 0; k < 4; k++) {
        model m;
        mw_trainer_config cfg = config(0.05f);
        int odd = rank == 1;
        if (k == 0)
            cfg.optimizer = (mw_optimizer)MW_SGD_INIT(0.05f),
            cfg.optimizer.momentum = odd ? 0.9f : 0.8f;
        if (k == 1) cfg.grad_accumulation = odd;
        if (k == 2) cfg.nonfinite = odd ? MW_NONFINITE_SKIP : MW_NONFINITE_STOP;
        if (k == 3) {
            cfg.optimizer.weight_decay = 0.1f;
            if (odd) cfg.optimizer.decays = decays_w2_only;
        }
        mw_status st = model_make(&m, 4, 1, &cfg);
        const char *msg = mw_last_error();
        CHECK(st == MW_ERR_INVALID, "%s differing: %s: %s", want[k], mw_status_name(st), msg);
        CHECK(contains(msg, "rank 1: ") && contains(msg, want[k]), "%s differing: %s", want[k],
              msg);
        model_free(&m);
    }
}

/* The parameters as one text line per value, for mw_distributed_agree. */
static void param_text(mw_trainer *tr, char *text, size_t size) {
    float w1[FEATURES * 4], w2[4], b;
    mw_trainer_read_param(tr, "w1", w1, FEATURES * 4);
    mw_trainer_read_param(tr, "w2", w2, 4);
    mw_trainer_read_param(tr, "b", &b, 1);
    size_t n = 0;
    for (int i = 0; i < FEATURES * 4; i++)
        n += (size_t)snprintf(text + n, size - n, "w1[%d] %a\n", i, w1[i]);
    for (int i = 0; i < 4; i++) n += (size_t)snprintf(text + n, size - n, "w2[%d] %a\n", i, w2[i]);
    snprintf(text + n, size - n, "b %a\n", b);
}

static void check_seed(void) {
    model m, own;
    mw_trainer_config cfg = config(0.05f);
    mw_status st = model_make(&m, 4, 100 + (uint64_t)rank, &cfg);
    CHECK(st == MW_OK, "%s", mw_last_error());
    if (st) return;
    char text[2048], mine[2048];
    param_text(m.tr, text, sizeof text);
    st = mw_distributed_agree("initial parameters", text, 0);
    CHECK(st == MW_OK, "replicas start different: %s", mw_last_error());
    /* This rank's own seed would have given other values (so the broadcast did something). */
    mw_graph *g = NULL;
    mw_graph_new(&g);
    mw_graph_set_seed(g, 100 + (uint64_t)rank);
    mw_tensor *w1 =
        mw_param(g, "w1", MW_AXES({"Feature", FEATURES}, {"Hidden", 4}), MW_INIT_NORMAL(0.5f));
    mw_tensor *loss = mw_mean(g, mw_mul(g, w1, w1), NULL);
    mw_mesh *local = NULL;
    mw_trainer *tr = NULL;
    memset(&own, 0, sizeof own);
    if (mw_mesh_new_local("cpu:1", "X", &local) == MW_OK &&
        mw_trainer_new(g, loss, local, &cfg, &tr) == MW_OK) {
        float a[FEATURES * 4], b[FEATURES * 4];
        mw_trainer_read_param(tr, "w1", a, FEATURES * 4);
        mw_trainer_read_param(m.tr, "w1", b, FEATURES * 4);
        int same = memcmp(a, b, sizeof a) == 0;
        CHECK(same == (rank == 0), "rank %d's own initial w1 %s the trained one", rank,
              same ? "equals" : "differs from");
    }
    (void)mine;
    mw_trainer_free(tr);
    mw_mesh_free(local);
    mw_graph_free(g);
    model_free(&m);
}

static void check_replicas(void) {
    model m;
    mw_trainer_config cfg = config(0.05f);
    cfg.check_replicas_every = 2;
    mw_status st = model_make(&m, 4, 1, &cfg);
    CHECK(st == MW_OK, "%s", mw_last_error());
    if (st == MW_OK) st = mw_trainer_step(m.tr, m.feeds, 2, NULL);
    CHECK(st == MW_OK, "step 1: %s", mw_last_error());
    if (rank == 1) {
        float b;
        mw_trainer_read_param(m.tr, "b", &b, 1);
        b += 1e-3f;
        mw_trainer_write_param(m.tr, "b", &b, 1);
    }
    st = mw_trainer_step(m.tr, m.feeds, 2, NULL);
    const char *msg = mw_last_error();
    CHECK(st == MW_ERR_STATE, "step 2: %s: %s", mw_status_name(st), msg);
    CHECK(contains(msg, "replicas diverged by step 2: parameter 'b' differs between rank 1 and "
                        "rank 0"),
          "%s", msg);
    model_free(&m);

    /* Split over Y inside each process: w2's shards, each replicated on both ranks. */
    st = model_make_on(&m, 4, 1, &cfg, 1);
    CHECK(st == MW_OK, "split: %s", mw_last_error());
    if (st) return;
    for (int s = 0; st == MW_OK && s < 2; s++) st = mw_trainer_step(m.tr, m.feeds, 2, NULL);
    CHECK(st == MW_OK, "split, steps 1-2 (checked at 2): %s", mw_last_error());
    if (rank == 1) {
        float w2[4];
        mw_trainer_read_param(m.tr, "w2", w2, 4);
        w2[3] += 1e-3f; /* the second shard's last element */
        mw_status ws = mw_trainer_write_param(m.tr, "w2", w2, 4);
        CHECK(ws == MW_OK, "split: write_param: %s", mw_last_error());
    }
    for (int s = 0; st == MW_OK && s < 2; s++) st = mw_trainer_step(m.tr, m.feeds, 2, NULL);
    msg = mw_last_error();
    CHECK(st == MW_ERR_STATE, "split, step 4: %s: %s", mw_status_name(st), msg);
    if (rank == 0) printf("[rank 0] split: %s\n", msg);
    CHECK(contains(msg, "replicas diverged by step 4: parameter 'w2'") && contains(msg, "rank 1") &&
              contains(msg, "rank 0"),
          "%s", msg);
    model_free(&m);
}

static void check_stop(void) {
    model m;
    mw_trainer_config cfg = config(0.05f);
    mw_status st = model_make(&m, 4, 1, &cfg);
    CHECK(st == MW_OK, "%s", mw_last_error());
    for (int s = 0; st == MW_OK && s < 3; s++) st = mw_trainer_step(m.tr, m.feeds, 2, NULL);
    if (rank == 1) mw_trainer_request_stop(m.tr);
    st = mw_trainer_step(m.tr, m.feeds, 2, NULL);
    CHECK(st == MW_ERR_INTERRUPTED, "%s: %s", mw_status_name(st), mw_last_error());
    CHECK(mw_trainer_steps(m.tr) == 3, "stopped at step %lld", (long long)mw_trainer_steps(m.tr));
    if (rank == 0) CHECK(contains(mw_last_error(), "in another process"), "%s", mw_last_error());
    for (int s = 0; s < 2; s++) {
        st = mw_trainer_step(m.tr, m.feeds, 2, NULL);
        CHECK(st == MW_OK, "after the stop: %s", mw_last_error());
    }
    st = mw_trainer_check_replicas(m.tr);
    CHECK(st == MW_OK, "%s", mw_last_error());
    model_free(&m);
}

static void check_skip(void) {
    model m;
    mw_trainer_config cfg = config(0.05f);
    cfg.nonfinite = MW_NONFINITE_SKIP;
    mw_status st = model_make(&m, 4, 1, &cfg);
    CHECK(st == MW_OK, "%s", mw_last_error());
    if (st) return;
    m.x[(ROWS - 1) * FEATURES] = NAN; /* the last row: rank 1's shard */
    st = mw_trainer_step(m.tr, m.feeds, 2, NULL);
    CHECK(st == MW_OK, "%s", mw_last_error());
    CHECK(mw_trainer_skipped_steps(m.tr) == 1 && mw_trainer_steps(m.tr) == 0,
          "skipped %lld, steps %lld", (long long)mw_trainer_skipped_steps(m.tr),
          (long long)mw_trainer_steps(m.tr));
    m.x[(ROWS - 1) * FEATURES] = 1.0f;
    st = mw_trainer_step(m.tr, m.feeds, 2, NULL);
    CHECK(st == MW_OK && mw_trainer_steps(m.tr) == 1, "%s", mw_last_error());
    CHECK(mw_trainer_check_replicas(m.tr) == MW_OK, "%s", mw_last_error());
    model_free(&m);
}

static void check_agree(void) {
    mw_status st = mw_distributed_agree(
        "flags", rank == 1 ? "--steps 10\n--seed 2\n--lr 1\n" : "--steps 10\n--seed 1\n--lr 1\n",
        0);
    CHECK(st == MW_ERR_INVALID, "%s", mw_status_name(st));
    CHECK(strcmp(mw_last_error(), "flags: the processes disagree: rank 1: --seed 2; rank 0: "
                                  "--seed 1") == 0,
          "%s", mw_last_error());
    st = mw_distributed_agree("flags", "--steps 10\n", 0);
    CHECK(st == MW_OK, "%s", mw_last_error());
}

int main(int argc, char **argv) {
    if (mw_distributed_init(&argc, &argv) != MW_OK || argc != 2 || mw_distributed_size() != 2) {
        fprintf(stderr, "usage: mpirun -np 2 mpi_trust all|timeout\n");
        return 2;
    }
    rank = mw_distributed_rank();
    if (strcmp(argv[1], "timeout") == 0) {
        if (rank == 1) { /* makes the mesh (collective), but never the trainer */
            mw_mesh *mesh = NULL;
            if (mw_mesh_new("cpu:1", "X", &mesh) == MW_OK) sleep(30);
            return 0; /* rank 0 ends the job first */
        }
        model m;
        mw_trainer_config cfg = config(0.05f);
        cfg.collective_timeout_ms = 1000;
        mw_status st = model_make(&m, 4, 1, &cfg);
        fprintf(stderr, "[rank 0] trainer: %s: %s\n", mw_status_name(st), mw_last_error());
        mw_distributed_abort(st == MW_ERR_TIMEOUT ? 4 : 0);
    }
    check_graph();
    check_config();
    check_more_fields();
    check_seed();
    check_replicas();
    check_stop();
    check_skip();
    check_agree();
    printf("[rank %d] %s\n", rank, failures ? "FAILED" : "every check passed");
    mw_distributed_finalize();
    return failures ? 1 : 0;
}
