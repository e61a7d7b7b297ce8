/* ZeRO-1 (mw_trainer_config.shard_optimizer): the same bits as the replicated update, step by
 * step (parameters, loss, gradient norm) with AdamW, clipping, weight decay on some parameters
 * and warm-up, with SGD momentum, and with gradient accumulation; on cpu:2 and on cpu:3 with a
 * parameter count that 3 does not divide (slices cut across parameters); gradients read back
 * whole; checkpoints that move between the modes and meshes; the option on one device; and the
 * refusals. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collectives/reducer.h"
#include "meshwit.h"
#include "parallel/trainer_impl.h"
#include "tests/common/rng.h"

#define BATCH 12
#define IN 5
#define HIDDEN 37
#define OUT 3
#define NPARAMS 5
/* 5*37 + 37 + 37 + 37*3 + 3 = 373 floats: not a multiple of 3 (or of 16). */
static const char *names[NPARAMS] = {"W1", "b1", "gain", "W2", "b2"};
static const int64_t sizes[NPARAMS] = {IN * HIDDEN, HIDDEN, HIDDEN, HIDDEN *OUT, OUT};

typedef struct model {
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
} model;

/* A two-layer MLP with the batch sharded over X; the initial parameters come from the graph's
 * seed, so every model starts from the same ones. */
static mw_status model_open(model *m, const char *devices, const char *axes, const char *shard,
                            mw_trainer_config cfg) {
    memset(m, 0, sizeof *m);
    cr_assert_eq(mw_graph_new(&m->g), MW_OK);
    mw_graph *g = m->g;
    mw_graph_set_seed(g, 7);
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", BATCH}, {"In", IN}));
    mw_tensor *y = mw_input(g, "y", MW_F32, MW_AXES({"Batch", BATCH}, {"Out", OUT}));
    if (shard) {
        x = mw_shard(g, x, "Batch", shard);
        y = mw_shard(g, y, "Batch", shard);
    }
    mw_tensor *w1 =
        mw_param(g, "W1", MW_AXES({"In", IN}, {"Hidden", HIDDEN}), MW_INIT_NORMAL(0.5f));
    mw_tensor *b1 = mw_param(g, "b1", MW_AXES({"Hidden", HIDDEN}), MW_INIT_NORMAL(0.1f));
    mw_tensor *gain = mw_param(g, "gain", MW_AXES({"Hidden", HIDDEN}), MW_INIT_CONST(1.0f));
    mw_tensor *w2 =
        mw_param(g, "W2", MW_AXES({"Hidden", HIDDEN}, {"Out", OUT}), MW_INIT_NORMAL(0.3f));
    mw_tensor *b2 = mw_param(g, "b2", MW_AXES({"Out", OUT}), MW_INIT_ZEROS);
    mw_tensor *act = mw_mul(g, mw_gelu(g, mw_add(g, mw_dot(g, x, w1, "In"), b1)), gain);
    mw_tensor *err = mw_sub(g, mw_add(g, mw_dot(g, act, w2, "Hidden"), b2), y);
    mw_tensor *loss = mw_mean(g, mw_mul(g, err, err), NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    cr_assert_eq(mw_mesh_new(devices, axes, &m->mesh), MW_OK, "%s", mw_last_error());
    return mw_trainer_new(g, loss, m->mesh, &cfg, &m->tr);
}

static void model_close(model *m) {
    mw_trainer_free(m->tr);
    mw_mesh_free(m->mesh);
    mw_graph_free(m->g);
}

/* The batch of step k: the same for every model. */
static void batch(int k, float *x, float *y) {
    uint32_t s = 12345u + (uint32_t)k * 7919u;
    for (int i = 0; i < BATCH * IN; i++)
        x[i] = (float)(rng_lcg32(&s) >> 8) / 16777216.0f * 4.0f - 2.0f;
    for (int i = 0; i < BATCH * OUT; i++)
        y[i] = (float)(rng_lcg32(&s) >> 8) / 16777216.0f * 2.0f - 1.0f;
}

typedef enum { STEP, ACCUMULATE, GRADS, NAN_STEP } kind;

static float run_batch(model *m, int k, kind what) {
    float x[BATCH * IN], y[BATCH * OUT], loss = NAN;
    batch(k, x, y);
    if (what == NAN_STEP) x[BATCH * IN - 1] = NAN; /* in the last device's rows */
    mw_feed feeds[2] = {{"x", x, BATCH * IN}, {"y", y, BATCH * OUT}};
    mw_status st = what == STEP || what == NAN_STEP ? mw_trainer_step(m->tr, feeds, 2, &loss)
                   : what == ACCUMULATE             ? mw_trainer_accumulate(m->tr, feeds, 2, &loss)
                                        : mw_trainer_compute_grads(m->tr, feeds, 2, &loss);
    cr_assert_eq(st, MW_OK, "batch %d: %s", k, mw_last_error());
    return loss;
}

/* Every parameter (or gradient) of a and b, bit for bit. */
static void same_bits(model *a, model *b, int grads, const char *what) {
    float pa[IN * HIDDEN], pb[IN * HIDDEN];
    for (int i = 0; i < NPARAMS; i++) {
        mw_status (*read)(mw_trainer *, const char *, float *, int64_t) =
            grads ? mw_trainer_read_grad : mw_trainer_read_param;
        cr_assert_eq(read(a->tr, names[i], pa, sizes[i]), MW_OK, "%s", mw_last_error());
        cr_assert_eq(read(b->tr, names[i], pb, sizes[i]), MW_OK, "%s", mw_last_error());
        for (int64_t e = 0; e < sizes[i]; e++)
            cr_assert(memcmp(&pa[e], &pb[e], sizeof(float)) == 0, "%s: %s %s[%lld]: %a vs %a", what,
                      grads ? "gradient" : "parameter", names[i], (long long)e, (double)pa[e],
                      (double)pb[e]);
    }
}

static mw_trainer_config adamw(int shard) {
    return (mw_trainer_config){.optimizer = {.kind = MW_ADAMW,
                                             .beta1 = 0.9f,
                                             .beta2 = 0.999f,
                                             .eps = 1e-8f,
                                             .lr = 0.05f,
                                             .weight_decay = 0.1f,
                                             .grad_clip = 0.5f,
                                             .warmup_steps = 3,
                                             .decay_steps = 10},
                               .shard_optimizer = shard};
}

static mw_trainer_config sgd(int shard) {
    return (mw_trainer_config){.optimizer = {.kind = MW_SGD,
                                             .lr = 0.05f,
                                             .momentum = 0.9f,
                                             .weight_decay = 0.01f,
                                             .grad_clip = 0.5f,
                                             .warmup_steps = 2},
                               .shard_optimizer = shard};
}

/* Trains a replicated and a ZeRO-1 model side by side and compares every step. */
static void compare_modes(const char *devices, mw_trainer_config cfg, int steps, int micro) {
    model rep, z;
    mw_trainer_config c = cfg;
    c.shard_optimizer = 0;
    c.grad_accumulation = micro > 1;
    cr_assert_eq(model_open(&rep, devices, "X", "X", c), MW_OK, "%s", mw_last_error());
    c.shard_optimizer = 1;
    c.check_replicas_every = 1; /* every device's all-gathered parameters, not only device 0's */
    cr_assert_eq(model_open(&z, devices, "X", "X", c), MW_OK, "%s", mw_last_error());
    same_bits(&rep, &z, 0, "at the start");
    int clipped = 0;
    for (int k = 0; k < steps; k++) {
        for (int u = 0; u + 1 < micro; u++) {
            float la = run_batch(&rep, 100 * k + u, ACCUMULATE),
                  lb = run_batch(&z, 100 * k + u, ACCUMULATE);
            cr_assert(la == lb);
        }
        float la = run_batch(&rep, k, STEP), lb = run_batch(&z, k, STEP);
        cr_assert(memcmp(&la, &lb, sizeof la) == 0, "%s step %d: loss %a vs %a", devices, k,
                  (double)la, (double)lb);
        float na = mw_trainer_grad_norm(rep.tr), nb = mw_trainer_grad_norm(z.tr);
        cr_assert(memcmp(&na, &nb, sizeof na) == 0, "%s step %d: gradient norm %a vs %a", devices,
                  k, (double)na, (double)nb);
        clipped += na > cfg.optimizer.grad_clip;
        char what[64];
        snprintf(what, sizeof what, "%s after step %d", devices, k);
        same_bits(&rep, &z, 0, what);
    }
    cr_assert_gt(clipped, 0, "no step was clipped: the test would not cover clipping");
    if (micro > 1) { /* the accumulator too is kept for the slice only */
        mw_device_memory a, b;
        cr_assert_eq(mw_trainer_memory(rep.tr, 0, &a), MW_OK);
        cr_assert_eq(mw_trainer_memory(z.tr, 0, &b), MW_OK);
        cr_assert_eq(a.gradients, 2 * a.parameters);
        cr_assert_lt(b.gradients, a.parameters + a.parameters / 2);
    }
    model_close(&rep);
    model_close(&z);
}

Test(zero1, adamw_bitwise_equal_on_cpu2, .timeout = 120) { compare_modes("cpu:2", adamw(0), 8, 1); }

Test(zero1, adamw_bitwise_equal_on_cpu3_with_uneven_slices_and_small_buckets, .timeout = 120) {
    mw_trainer_config cfg = adamw(0);
    cfg.bucket_bytes = 256; /* several buckets, each cut by the slices differently */
    compare_modes("cpu:3", cfg, 8, 1);
}

Test(zero1, sgd_momentum_bitwise_equal, .timeout = 120) {
    compare_modes("cpu:2", sgd(0), 6, 1);
    mw_trainer_config nesterov = sgd(0);
    nesterov.optimizer.nesterov = 1;
    nesterov.bucket_bytes = 512;
    compare_modes("cpu:3", nesterov, 6, 1);
}

Test(zero1, plain_sgd_bitwise_equal, .timeout = 120) {
    mw_trainer_config cfg = sgd(0);
    cfg.optimizer.momentum = 0.0f;
    cfg.optimizer.weight_decay = 0.0f;
    compare_modes("cpu:3", cfg, 5, 1);
}

Test(zero1, gradient_accumulation_bitwise_equal, .timeout = 120) {
    compare_modes("cpu:3", adamw(0), 4, 3);
}

/* A step whose batch holds a NaN (on one device's rows) is skipped alike in both modes, and
 * training goes on equal. */
Test(zero1, non_finite_steps_are_skipped_alike, .timeout = 60) {
    model rep, z;
    mw_trainer_config cfg = adamw(0);
    cfg.nonfinite = MW_NONFINITE_SKIP;
    cr_assert_eq(model_open(&rep, "cpu:3", "X", "X", cfg), MW_OK);
    cfg.shard_optimizer = 1;
    cr_assert_eq(model_open(&z, "cpu:3", "X", "X", cfg), MW_OK);
    for (int k = 0; k < 5; k++) {
        run_batch(&rep, k, k == 2 ? NAN_STEP : STEP);
        run_batch(&z, k, k == 2 ? NAN_STEP : STEP);
    }
    cr_assert_eq(mw_trainer_skipped_steps(rep.tr), 1);
    cr_assert_eq(mw_trainer_skipped_steps(z.tr), 1);
    cr_assert_eq(mw_trainer_steps(z.tr), 4);
    same_bits(&rep, &z, 0, "after a skipped step");
    model_close(&rep);
    model_close(&z);
}

Test(zero1, optimizer_memory_divided_by_the_devices, .timeout = 60) {
    model rep, z;
    cr_assert_eq(model_open(&rep, "cpu:3", "X", "X", adamw(0)), MW_OK);
    cr_assert_eq(model_open(&z, "cpu:3", "X", "X", adamw(1)), MW_OK);
    mw_device_memory a, b;
    int64_t total = 0, params = 0;
    for (int i = 0; i < NPARAMS; i++) params += sizes[i] * 4;
    for (int d = 0; d < 3; d++) {
        cr_assert_eq(mw_trainer_memory(rep.tr, d, &a), MW_OK);
        cr_assert_eq(mw_trainer_memory(z.tr, d, &b), MW_OK);
        cr_assert_eq(a.parameters, params);
        cr_assert_eq(b.parameters, params);
        cr_assert_eq(b.gradients, params);
        cr_assert_eq(a.optimizer, 2 * params); /* m and v */
        cr_assert_lt(b.optimizer, a.optimizer / 3 + 2 * 16 * 4, "device %d", d);
        cr_assert_gt(a.activations, 0);
        total += b.optimizer;
    }
    cr_assert_eq(total, 2 * params, "the slices cover the parameters exactly once");
    cr_assert_eq(mw_trainer_memory(z.tr, 3, &b), MW_ERR_INVALID);
    model_close(&rep);
    model_close(&z);
}

Test(zero1, gradients_read_back_whole, .timeout = 60) {
    model rep, z;
    cr_assert_eq(model_open(&rep, "cpu:3", "X", "X", adamw(0)), MW_OK);
    cr_assert_eq(model_open(&z, "cpu:3", "X", "X", adamw(1)), MW_OK);
    run_batch(&rep, 0, GRADS);
    run_batch(&z, 0, GRADS);
    same_bits(&rep, &z, 1, "after compute_grads");
    run_batch(&rep, 1, STEP);
    run_batch(&z, 1, STEP);
    same_bits(&rep, &z, 1, "after a step");
    model_close(&rep);
    model_close(&z);
}

/* Trains `first` for 3 steps, saves, loads into `second`, trains 3 more; the result equals a
 * model of `second`'s kind trained 6 steps without a break. */
static void resume_across(const char *dev_a, int shard_a, const char *dev_b, int shard_b) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/mw_zero1_%d.ckpt", (int)getpid());
    model a, b, whole;
    cr_assert_eq(model_open(&a, dev_a, "X", "X", adamw(shard_a)), MW_OK, "%s", mw_last_error());
    cr_assert_eq(model_open(&whole, dev_b, "X", "X", adamw(shard_b)), MW_OK);
    for (int k = 0; k < 3; k++) run_batch(&a, k, STEP);
    cr_assert_eq(mw_trainer_save(a.tr, path, NULL, 0), MW_OK, "%s", mw_last_error());
    model_close(&a);
    cr_assert_eq(model_open(&b, dev_b, "X", "X", adamw(shard_b)), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_load(b.tr, path, NULL, 0, NULL), MW_OK, "%s", mw_last_error());
    for (int k = 0; k < 3; k++) run_batch(&whole, k, STEP);
    for (int k = 3; k < 6; k++) {
        run_batch(&b, k, STEP);
        run_batch(&whole, k, STEP);
    }
    char what[96];
    snprintf(what, sizeof what, "%s%s -> %s%s", dev_a, shard_a ? " ZeRO-1" : "", dev_b,
             shard_b ? " ZeRO-1" : "");
    same_bits(&b, &whole, 0, what);
    model_close(&b);
    model_close(&whole);
    unlink(path);
}

Test(zero1, checkpoints_move_between_modes, .timeout = 120) {
    resume_across("cpu:3", 1, "cpu:3", 0);
    resume_across("cpu:3", 0, "cpu:3", 1);
    resume_across("cpu:2", 1, "cpu:2", 0);
    resume_across("cpu:2", 0, "cpu:2", 1);
}

static unsigned char *slurp(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)*n);
    cr_assert_eq(fread(b, 1, (size_t)*n, f), (size_t)*n);
    fclose(f);
    return b;
}

/* The file holds the whole state whatever the mode and mesh: saved by ZeRO-1 on cpu:2, loaded by
 * ZeRO-1 on cpu:3 and by a replicated cpu:1, and saved again, it is the same bytes. */
Test(zero1, checkpoint_is_the_same_file_on_every_mesh, .timeout = 120) {
    char p2[64], p3[64], p1[64];
    snprintf(p2, sizeof p2, "/tmp/mw_zero1_%d_2.ckpt", (int)getpid());
    snprintf(p3, sizeof p3, "/tmp/mw_zero1_%d_3.ckpt", (int)getpid());
    snprintf(p1, sizeof p1, "/tmp/mw_zero1_%d_1.ckpt", (int)getpid());
    model a, b, c;
    cr_assert_eq(model_open(&a, "cpu:2", "X", "X", adamw(1)), MW_OK);
    for (int k = 0; k < 3; k++) run_batch(&a, k, STEP);
    cr_assert_eq(mw_trainer_save(a.tr, p2, NULL, 0), MW_OK, "%s", mw_last_error());
    cr_assert_eq(model_open(&b, "cpu:3", "X", "X", adamw(1)), MW_OK);
    cr_assert_eq(mw_trainer_load(b.tr, p2, NULL, 0, NULL), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_save(b.tr, p3, NULL, 0), MW_OK, "%s", mw_last_error());
    cr_assert_eq(model_open(&c, "cpu:1", "X", "X", adamw(0)), MW_OK);
    cr_assert_eq(mw_trainer_load(c.tr, p3, NULL, 0, NULL), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_save(c.tr, p1, NULL, 0), MW_OK, "%s", mw_last_error());
    long n2, n3, n1;
    unsigned char *f2 = slurp(p2, &n2), *f3 = slurp(p3, &n3), *f1 = slurp(p1, &n1);
    cr_assert_eq(n2, n3);
    cr_assert_eq(n2, n1);
    cr_assert(memcmp(f2, f3, (size_t)n2) == 0, "cpu:3 ZeRO-1 saved another state");
    cr_assert(memcmp(f2, f1, (size_t)n2) == 0, "cpu:1 saved another state");
    free(f2);
    free(f3);
    free(f1);
    model_close(&a);
    model_close(&b);
    model_close(&c);
    unlink(p2);
    unlink(p3);
    unlink(p1);
}

/* Trains a replicated and a ZeRO-1 model with the batch not sharded (no gradient sum at all:
 * every device already has the whole gradient) and compares them. */
static void train_unsharded(const char *devices, model *rep, model *z) {
    cr_assert_eq(model_open(rep, devices, "X", NULL, adamw(0)), MW_OK);
    cr_assert_eq(model_open(z, devices, "X", NULL, adamw(1)), MW_OK, "%s", mw_last_error());
    for (int k = 0; k < 3; k++) {
        run_batch(rep, k, STEP);
        run_batch(z, k, STEP);
    }
    same_bits(rep, z, 0, devices);
}

Test(zero1, one_device_is_the_replicated_trainer, .timeout = 60) {
    model rep, z;
    train_unsharded("cpu:1", &rep, &z);
    mw_device_memory a, b;
    cr_assert_eq(mw_trainer_memory(rep.tr, 0, &a), MW_OK);
    cr_assert_eq(mw_trainer_memory(z.tr, 0, &b), MW_OK);
    cr_assert_eq(a.optimizer, b.optimizer);
    model_close(&rep);
    model_close(&z);
}

Test(zero1, unsharded_batch_on_two_devices, .timeout = 60) {
    model rep, z;
    train_unsharded("cpu:2", &rep, &z);
    mw_device_memory b;
    cr_assert_eq(mw_trainer_memory(z.tr, 1, &b), MW_OK);
    cr_assert_lt(b.optimizer, 2 * 373 * 4, "device 1 keeps only its slice");
    model_close(&rep);
    model_close(&z);
}

Test(zero1, refused_when_gradients_are_summed_over_part_of_the_mesh, .timeout = 60) {
    model m;
    mw_status st = model_open(&m, "cpu:4", "Y=2,X=2", "X", adamw(1));
    cr_assert_eq(st, MW_ERR_UNSUPPORTED, "got %s: %s", mw_status_name(st), mw_last_error());
    cr_assert(strstr(mw_last_error(), "shard_optimizer") && strstr(mw_last_error(), "groups of 2"),
              "%s", mw_last_error());
    model_close(&m);
}

Test(zero1, refused_when_the_reducer_lacks_the_collectives, .timeout = 60) {
    mw__reducer_vtable without = mw__reducer_shm;
    without.name = "allreduce-only";
    without.reduce_scatter_sum = NULL;
    without.all_gather = NULL;
    cr_assert_eq(mw__zero1_collectives(&mw__reducer_shm, &mw__reducer_shm, "Mesh(X -> 2)"), MW_OK);
    mw_status st = mw__zero1_collectives(&without, &mw__reducer_shm, "Mesh(X -> 2) over cuda:0x2");
    cr_assert_eq(st, MW_ERR_UNSUPPORTED);
    cr_assert(strstr(mw_last_error(), "allreduce-only reducer") &&
                  strstr(mw_last_error(), "cuda:0x2"),
              "%s", mw_last_error());
    cr_assert_eq(mw__zero1_collectives(&mw__reducer_shm, &without, "m"), MW_ERR_UNSUPPORTED);
    cr_assert(strstr(mw_last_error(), "allreduce-only"), "%s", mw_last_error());
}
