/* Parameters sharded by named axes: tensor parallelism through mw_shard on parameters.
 *
 * The model is a two-layer MLP regression, out = gelu(x . W1 + b1) . W2 + b2, loss = mean of the
 * squared error, with W1 [Hidden, In], b1 [Hidden], W2 [Out, Hidden], b2 [Out]. Splitting Hidden
 * over a mesh axis Y ("Hidden@Y" in W1, b1 and W2) is Megatron's column-then-row pair: the second
 * contraction leaves partial sums that the SPMD rules all-reduce, and the gradient of x's layer
 * is all-reduced on the way back, with no collective written here. Every run is compared with
 * the same model on one device: the loss of every step and the parameters after AdamW steps with
 * clipping, on Y=2, on an uneven Y=3, and with data parallelism on a 2 x 2 mesh (X=2,Y=2). Also:
 * bitwise repeats, reading and writing whole parameters, checkpoints moved between meshes, the
 * gradient norm, the tiny GPT-2 with heads and MLP units split, and the errors for what cannot
 * be sharded. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpt2_model.h"
#include "meshwit.h"
#include "parallel/trainer_impl.h"
#include "tests/common/rng.h"

#define BATCH 24
#define IN 12
#define HIDDEN 10 /* 5 + 5 over Y=2, 4 + 3 + 3 over Y=3 */
#define OUT 3
#define STEPS 8

/* Agreement with one device.
 *
 * Splitting Hidden changes only the order of additions: the second layer's sum over Hidden is
 * formed as per-device partial sums added in device order, and so are the gradient norm and the
 * backward contraction into x's layer. Every value is of order one and each sum has at most a
 * few dozen terms, so one step differs by a few units of f32 rounding (2^-24 ~ 6e-8 relative).
 * AdamW divides each gradient by its running RMS, so a relative change eps of a gradient element
 * changes its step by about eps * lr: after STEPS steps with lr 1e-2 the parameters differ by
 * about STEPS * 1e-2 * 1e-6 = 1e-7, and the loss by as much relative. The bar below, 2e-5 on
 * values of order one, is a hundred times that: a wrong collective (a missing or doubled
 * all-reduce, a shard read from the wrong rows) moves these values by 1e-3 or more. */
#define TOL 2e-5

typedef struct run {
    float loss[STEPS];
    float w1[HIDDEN * IN], b1[HIDDEN], w2[OUT * HIDDEN], b2[OUT];
    float norm;
} run;

typedef struct mlp {
    mw_graph *g;
    mw_tensor *loss, *out, *w1, *b1, *w2, *b2;
    mw_mesh *mesh;
    mw_trainer *tr;
} mlp;

static float data_x[BATCH * IN], data_y[BATCH * OUT];

static void make_data(int step) {
    uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(step + 1);
    for (int i = 0; i < BATCH * IN; i++) data_x[i] = (float)rng_range(rng_lcg64(&s), -1, 1);
    for (int r = 0; r < BATCH; r++)
        for (int o = 0; o < OUT; o++) {
            double v = 0.25 * o;
            for (int i = 0; i < IN; i++) v += sin(0.3 * (i + 1) * (o + 1)) * data_x[r * IN + i];
            data_y[r * OUT + o] = (float)tanh(v);
        }
}

/* data: mesh axis the batch is split over (or NULL); model: the one Hidden is split over. */
static void build(mlp *m, const char *data, const char *model) {
    memset(m, 0, sizeof *m);
    cr_assert_eq(mw_graph_new(&m->g), MW_OK);
    mw_graph *g = m->g;
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", BATCH}, {"In", IN}));
    mw_tensor *y = mw_input(g, "y", MW_F32, MW_AXES({"Batch", BATCH}, {"Out", OUT}));
    if (data) {
        x = mw_shard(g, x, "Batch", data);
        y = mw_shard(g, y, "Batch", data);
    }
    m->w1 = mw_param(g, "w1", MW_AXES({"Hidden", HIDDEN}, {"In", IN}), MW_INIT_NORMAL(0.5f));
    m->b1 = mw_param(g, "b1", MW_AXES({"Hidden", HIDDEN}), MW_INIT_UNIFORM(0.1f));
    m->w2 = mw_param(g, "w2", MW_AXES({"Out", OUT}, {"Hidden", HIDDEN}), MW_INIT_NORMAL(0.5f));
    m->b2 = mw_param(g, "b2", MW_AXES({"Out", OUT}), MW_INIT_ZEROS);
    if (model) {
        cr_assert_eq(mw_shard(g, m->w1, "Hidden", model), m->w1, "%s", mw_graph_error(g));
        cr_assert_eq(mw_shard(g, m->b1, "Hidden", model), m->b1);
        cr_assert_eq(mw_shard(g, m->w2, "Hidden", model), m->w2);
    }
    mw_tensor *h = mw_gelu(g, mw_add(g, mw_dot(g, x, m->w1, "In"), m->b1));
    mw_tensor *out = mw_add(g, mw_dot(g, h, m->w2, "Hidden"), m->b2);
    m->out = out;
    mw_tensor *e = mw_sub(g, out, y);
    m->loss = mw_mean(g, mw_mul(g, e, e), NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
}

static int zero1;       /* the next trainers shard the optimizer state (ZeRO-1) */
static int cpu_threads; /* and share threads so (mw_trainer_config.cpu_threads) */

static void open_mlp(mlp *m, const char *devices, const char *axes, const char *data,
                     const char *model) {
    build(m, data, model);
    cr_assert_eq(mw_mesh_new(devices, axes, &m->mesh), MW_OK, "%s", mw_last_error());
    mw_trainer_config c = {.optimizer = {MW_ADAMW, .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.99f,
                                         .eps = 1e-8f, .weight_decay = 0.01f, .grad_clip = 0.5f},
                           .shard_optimizer = zero1,
                           .cpu_threads = cpu_threads};
    mw_status st = mw_trainer_new(m->g, m->loss, m->mesh, &c, &m->tr);
    cr_assert_eq(st, MW_OK, "trainer on %s/%s: %s", devices, axes, mw_last_error());
}

static void close_mlp(mlp *m) {
    mw_trainer_free(m->tr);
    mw_mesh_free(m->mesh);
    mw_graph_free(m->g);
}

static void read_all(mlp *m, run *r) {
    cr_assert_eq(mw_trainer_read_param(m->tr, "w1", r->w1, HIDDEN * IN), MW_OK, "%s",
                 mw_last_error());
    cr_assert_eq(mw_trainer_read_param(m->tr, "b1", r->b1, HIDDEN), MW_OK);
    cr_assert_eq(mw_trainer_read_param(m->tr, "w2", r->w2, OUT * HIDDEN), MW_OK);
    cr_assert_eq(mw_trainer_read_param(m->tr, "b2", r->b2, OUT), MW_OK);
}

static void step(mlp *m, int s, float *loss) {
    make_data(s);
    mw_feed f[2] = {{"x", data_x, BATCH * IN}, {"y", data_y, BATCH * OUT}};
    mw_status st = mw_trainer_step(m->tr, f, 2, loss);
    cr_assert_eq(st, MW_OK, "step %d: %s", s, mw_last_error());
}

static run train(const char *devices, const char *axes, const char *data, const char *model) {
    mlp m;
    open_mlp(&m, devices, axes, data, model);
    run r;
    for (int s = 0; s < STEPS; s++) step(&m, s, &r.loss[s]);
    r.norm = mw_trainer_grad_norm(m.tr);
    read_all(&m, &r);
    close_mlp(&m);
    return r;
}

static void near(const char *what, const float *got, const float *ref, int n) {
    for (int i = 0; i < n; i++)
        cr_assert(fabs((double)got[i] - ref[i]) <= TOL * fmax(1.0, fabs(ref[i])),
                  "%s[%d]: %.9g, one device has %.9g", what, i, got[i], ref[i]);
}

static void agree(const char *what, const run *got, const run *ref) {
    char name[96];
    snprintf(name, sizeof name, "%s loss", what);
    near(name, got->loss, ref->loss, STEPS);
    snprintf(name, sizeof name, "%s w1", what);
    near(name, got->w1, ref->w1, HIDDEN * IN);
    snprintf(name, sizeof name, "%s b1", what);
    near(name, got->b1, ref->b1, HIDDEN);
    snprintf(name, sizeof name, "%s w2", what);
    near(name, got->w2, ref->w2, OUT * HIDDEN);
    snprintf(name, sizeof name, "%s b2", what);
    near(name, got->b2, ref->b2, OUT);
    snprintf(name, sizeof name, "%s gradient norm", what);
    near(name, &got->norm, &ref->norm, 1);
}

TestSuite(tensor_parallel, .timeout = 120);

Test(tensor_parallel, hidden_split_over_y_matches_one_device) {
    run one = train("cpu:1", "X", NULL, NULL);
    /* The model learns: agreeing is not agreeing on nothing. */
    cr_assert_lt(one.loss[STEPS - 1], 0.8f * one.loss[0]);
    run y2 = train("cpu:2", "Y", NULL, "Y");
    agree("Y=2", &y2, &one);
    run y3 = train("cpu:3", "Y", NULL, "Y"); /* Hidden 10 = 4 + 3 + 3 */
    agree("Y=3", &y3, &one);
}

Test(tensor_parallel, data_times_tensor_on_a_2x2_mesh) {
    run one = train("cpu:1", "X", NULL, NULL);
    run dt = train("cpu:4", "X=2,Y=2", "X", "Y");
    agree("X=2,Y=2", &dt, &one);
    /* The same mesh twice: the same bits. */
    run again = train("cpu:4", "X=2,Y=2", "X", "Y");
    cr_assert(memcmp(&dt, &again, sizeof dt) == 0, "X=2,Y=2 run twice differs");
    /* Model axis first: Y varies slowest, so the shards sit on devices 0-1 and 2-3. */
    run yx = train("cpu:4", "Y=2,X=2", "X", "Y");
    agree("Y=2,X=2", &yx, &one);
}

/* ZeRO-1 over the data axis with Hidden split over Y: bitwise the run without ZeRO-1 (the
 * reduce-scatter gives the all-reduce's bits on each part, and the gradient norm adds the same
 * partial sums in the same order in both modes), with half the optimizer state per device. */
Test(tensor_parallel, zero1_with_split_parameters_is_bitwise_the_same) {
    run plain = train("cpu:4", "X=2,Y=2", "X", "Y");
    zero1 = 1;
    run z = train("cpu:4", "X=2,Y=2", "X", "Y");
    cr_assert(memcmp(&plain, &z, sizeof z) == 0, "ZeRO-1 changed the trained model");
    mlp a, b;
    zero1 = 0;
    open_mlp(&a, "cpu:4", "X=2,Y=2", "X", "Y");
    zero1 = 1;
    open_mlp(&b, "cpu:4", "X=2,Y=2", "X", "Y");
    mw_device_memory ma, mb;
    cr_assert_eq(mw_trainer_memory(a.tr, 0, &ma), MW_OK);
    cr_assert_eq(mw_trainer_memory(b.tr, 0, &mb), MW_OK);
    /* Half, rounded to whole 64-byte lines: 83 floats per moment -> 3 lines of 16 each. */
    cr_assert_eq(ma.optimizer, 2 * 83 * 4);
    cr_assert_eq(mb.optimizer, 2 * 48 * 4, "%lld", (long long)mb.optimizer);
    /* The gradients read back whole in both modes. */
    float la, lb, ga[HIDDEN * IN], gb[HIDDEN * IN];
    step(&a, 0, &la);
    step(&b, 0, &lb);
    cr_assert_eq(mw_trainer_read_grad(a.tr, "w1", ga, HIDDEN * IN), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_grad(b.tr, "w1", gb, HIDDEN * IN), MW_OK, "%s", mw_last_error());
    cr_assert(memcmp(ga, gb, sizeof ga) == 0);
    /* Checkpoints move between the modes: the moments are gathered whole. */
    char path[] = "/tmp/mw_tp_zeroXXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(mw_trainer_save(b.tr, path, NULL, 0), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_load(a.tr, path, NULL, 0, NULL), MW_OK, "%s", mw_last_error());
    /* a (no ZeRO) was a step ahead in its own moments; after loading it holds b's state. */
    for (int s = 1; s < 4; s++) {
        step(&a, s, &la);
        step(&b, s, &lb);
        cr_assert(la == lb, "step %d after loading: %.9g vs %.9g", s, la, lb);
    }
    close_mlp(&a);
    close_mlp(&b);
    zero1 = 0;
    close(fd);
    remove(path);
}

/* Devices sharing threads give the bits of one thread per device: every device on the calling
 * thread, or blocks of devices on two or three threads, on data and tensor parallel meshes with
 * and without ZeRO-1 (all-reduces of partial sums, gradient buckets, reduce-scatter, all-gather
 * and the barrier before the update, inside one thread and across threads). */
Test(tensor_parallel, one_thread_is_bitwise_a_thread_per_device) {
    static const struct {
        const char *devices, *axes, *data, *model;
        int zero1;
    } meshes[] = {{"cpu:2", "X", "X", NULL, 0},
                  {"cpu:3", "Y", NULL, "Y", 0},
                  {"cpu:4", "X=2,Y=2", "X", "Y", 0},
                  {"cpu:4", "X=2,Y=2", "X", "Y", 1},
                  {"cpu:4", "X", "X", NULL, 1}};
    for (size_t i = 0; i < sizeof meshes / sizeof *meshes; i++) {
        zero1 = meshes[i].zero1;
        cpu_threads = MW_CPU_THREADS_PER_DEVICE;
        run threads = train(meshes[i].devices, meshes[i].axes, meshes[i].data, meshes[i].model);
        /* One thread; two threads of two devices (cpu:4) or of one and two (cpu:3); three
         * threads of one, one and two devices. */
        for (cpu_threads = 1; cpu_threads <= 3; cpu_threads++) {
            run fewer = train(meshes[i].devices, meshes[i].axes, meshes[i].data, meshes[i].model);
            cr_assert(memcmp(&threads, &fewer, sizeof fewer) == 0,
                      "%s %s (ZeRO-1 %d): %d threads differ", meshes[i].devices, meshes[i].axes,
                      zero1, cpu_threads);
        }
    }
    mlp m;
    cpu_threads = MW_CPU_THREADS_ONE;
    open_mlp(&m, "cpu:4", "X=2,Y=2", "X", "Y");
    float loss;
    step(&m, 0, &loss);
    mw_step_stats st;
    cr_assert_eq(mw_trainer_stats(m.tr, &st), MW_OK);
    cr_assert_eq(st.threads, 1);
    close_mlp(&m);
    cpu_threads = 2;
    open_mlp(&m, "cpu:4", "X=2,Y=2", "X", "Y");
    step(&m, 0, &loss);
    cr_assert_eq(mw_trainer_stats(m.tr, &st), MW_OK);
    cr_assert_eq(st.threads, 2);
    close_mlp(&m);
    cpu_threads = MW_CPU_THREADS_PER_DEVICE;
    open_mlp(&m, "cpu:4", "X=2,Y=2", "X", "Y");
    step(&m, 0, &loss);
    cr_assert_eq(mw_trainer_stats(m.tr, &st), MW_OK);
    cr_assert_eq(st.threads, 4);
    close_mlp(&m);
    zero1 = 0;
    cpu_threads = MW_CPU_THREADS_AUTO;
}

Test(tensor_parallel, initial_values_are_the_whole_tensors_cut) {
    mlp one, two;
    open_mlp(&one, "cpu:1", "X", NULL, NULL);
    open_mlp(&two, "cpu:2", "Y", NULL, "Y");
    run a, b;
    read_all(&one, &a);
    read_all(&two, &b);
    cr_assert(memcmp(a.w1, b.w1, sizeof a.w1) == 0);
    cr_assert(memcmp(a.b1, b.b1, sizeof a.b1) == 0);
    cr_assert(memcmp(a.w2, b.w2, sizeof a.w2) == 0);
    cr_assert(memcmp(a.b2, b.b2, sizeof a.b2) == 0);
    close_mlp(&one);
    close_mlp(&two);
}

Test(tensor_parallel, write_then_read_whole_parameters) {
    mlp m;
    open_mlp(&m, "cpu:3", "Y", NULL, "Y");
    float w[OUT * HIDDEN], back[OUT * HIDDEN];
    for (int i = 0; i < OUT * HIDDEN; i++) w[i] = (float)i * 0.125f - 1.0f;
    cr_assert_eq(mw_trainer_write_param(m.tr, "w2", w, OUT * HIDDEN), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_param(m.tr, "w2", back, OUT * HIDDEN), MW_OK);
    cr_assert(memcmp(w, back, sizeof w) == 0, "w2 read back differs from what was written");
    /* The count is the whole tensor's, not a shard's. */
    cr_assert_eq(mw_trainer_read_param(m.tr, "w2", back, OUT * 4), MW_ERR_SHAPE);
    cr_assert(strstr(mw_last_error(), "30") != NULL, "%s", mw_last_error());
    /* A written model trains like the same model written on one device. */
    mlp one;
    open_mlp(&one, "cpu:1", "X", NULL, NULL);
    cr_assert_eq(mw_trainer_write_param(one.tr, "w2", w, OUT * HIDDEN), MW_OK);
    float l1, l3;
    step(&one, 0, &l1);
    step(&m, 0, &l3);
    cr_assert(fabsf(l1 - l3) <= TOL * fmaxf(1.0f, fabsf(l1)), "%.9g vs %.9g", l3, l1);
    close_mlp(&one);
    close_mlp(&m);
}

/* A checkpoint holds whole tensors: saved on one mesh, it resumes on another. */
Test(tensor_parallel, checkpoints_move_between_meshes) {
    char path[] = "/tmp/mw_tp_ckptXXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    mlp a;
    open_mlp(&a, "cpu:2", "Y", NULL, "Y");
    float loss;
    for (int s = 0; s < 3; s++) step(&a, s, &loss);
    cr_assert_eq(mw_trainer_save(a.tr, path, NULL, 0), MW_OK, "%s", mw_last_error());
    float ref[STEPS];
    for (int s = 3; s < 6; s++) step(&a, s, &ref[s]);
    /* Resumed on one device, on Y=3 and on X=2,Y=2: the same next losses. */
    const char *dev[3] = {"cpu:1", "cpu:3", "cpu:4"}, *axes[3] = {"X", "Y", "X=2,Y=2"};
    const char *data[3] = {NULL, NULL, "X"}, *model[3] = {NULL, "Y", "Y"};
    for (int k = 0; k < 3; k++) {
        mlp b;
        open_mlp(&b, dev[k], axes[k], data[k], model[k]);
        cr_assert_eq(mw_trainer_load(b.tr, path, NULL, 0, NULL), MW_OK, "%s: %s", dev[k],
                     mw_last_error());
        cr_assert_eq(mw_trainer_steps(b.tr), 3);
        for (int s = 3; s < 6; s++) {
            step(&b, s, &loss);
            cr_assert(fabsf(loss - ref[s]) <= TOL * fmaxf(1.0f, fabsf(ref[s])),
                      "%s/%s: step %d loss %.9g, the uninterrupted run %.9g", dev[k], axes[k], s,
                      loss, ref[s]);
        }
        close_mlp(&b);
    }
    close_mlp(&a);
    close(fd);
    remove(path);
}

/* Rows for the inference tests: three batches' worth, no two alike. */
static const float *infer_inputs(void) {
    static float xs[3 * BATCH * IN];
    make_data(7);
    for (int i = 0; i < 3 * BATCH * IN; i++) xs[i] = data_x[i % (BATCH * IN)] * (1 + i / 97);
    return xs;
}

/* An inference program over a split model: whole weights written in, whole outputs out, any
 * number of rows (chunked over Batch, which is sharded over X). */
static void infer(const char *devices, const char *axes, const char *data, const char *model,
                  const run *weights, int64_t rows, float *out) {
    mlp m;
    build(&m, data, model);
    cr_assert_eq(mw_mesh_new(devices, axes, &m.mesh), MW_OK);
    mw_infer_config ic = {.outputs = &m.out, .noutputs = 1};
    mw_infer *inf;
    cr_assert_eq(mw_infer_new(m.g, m.mesh, &ic, &inf), MW_OK, "%s: %s", axes, mw_last_error());
    cr_assert_eq(mw_infer_write_param(inf, "w1", weights->w1, HIDDEN * IN), MW_OK, "%s",
                 mw_last_error());
    cr_assert_eq(mw_infer_write_param(inf, "b1", weights->b1, HIDDEN), MW_OK);
    cr_assert_eq(mw_infer_write_param(inf, "w2", weights->w2, OUT * HIDDEN), MW_OK);
    cr_assert_eq(mw_infer_write_param(inf, "b2", weights->b2, OUT), MW_OK);
    mw_feed f = {"x", infer_inputs(), rows * IN};
    mw_fetch fe = {m.out, out, rows * OUT};
    cr_assert_eq(mw_infer_run(inf, &f, 1, rows, &fe, 1), MW_OK, "%s: %s", axes, mw_last_error());
    mw_infer_free(inf);
    mw_mesh_free(m.mesh);
    mw_graph_free(m.g);
}

Test(tensor_parallel, inference_over_split_weights) {
    run w = train("cpu:1", "X", NULL, NULL); /* trained weights, read whole */
    int64_t rows = 2 * BATCH + 5;            /* two chunks and a padded one */
    static float one[3 * BATCH * OUT], split[3 * BATCH * OUT];
    infer("cpu:1", "X", NULL, NULL, &w, rows, one);
    infer("cpu:4", "X=2,Y=2", "X", "Y", &w, rows, split);
    near("inference X=2,Y=2", split, one, (int)(rows * OUT));
}

/* An inference program reading a split trainer's parameters in place must split them the same
 * way: otherwise it would read another box (or past the shard), so it is refused. */
Test(tensor_parallel, inference_from_a_split_trainer) {
    mlp t;
    open_mlp(&t, "cpu:2", "Y", NULL, "Y");
    float loss;
    step(&t, 0, &loss);
    run w;
    read_all(&t, &w);
    for (int split = 0; split < 2; split++) {
        mlp p;
        build(&p, NULL, split ? "Y" : NULL);
        mw_infer_config ic = {.outputs = &p.out, .noutputs = 1};
        mw_infer *inf = NULL;
        mw_status st = mw_infer_from_trainer(t.tr, p.g, &ic, &inf);
        if (!split) {
            cr_assert_eq(st, MW_ERR_SHARDING, "an unsplit program was accepted");
            cr_assert(strstr(mw_last_error(), "Hidden@Y") != NULL, "%s", mw_last_error());
        } else {
            cr_assert_eq(st, MW_OK, "%s", mw_last_error());
            static float got[BATCH * OUT], ref[BATCH * OUT];
            mw_feed f = {"x", infer_inputs(), BATCH * IN};
            mw_fetch fe = {p.out, got, BATCH * OUT};
            cr_assert_eq(mw_infer_run(inf, &f, 1, BATCH, &fe, 1), MW_OK, "%s", mw_last_error());
            infer("cpu:1", "X", NULL, NULL, &w, BATCH, ref);
            near("inference from the split trainer", got, ref, BATCH * OUT);
        }
        mw_infer_free(inf);
        mw_graph_free(p.g);
    }
    close_mlp(&t);
}

Test(tensor_parallel, replicas_are_checked_per_shard) {
    mlp m;
    open_mlp(&m, "cpu:4", "X=2,Y=2", "X", "Y");
    float loss;
    step(&m, 0, &loss);
    /* Devices 0 and 1 hold different halves of w1 and agree with their X replicas. */
    cr_assert_eq(mw_trainer_check_replicas(m.tr), MW_OK, "%s", mw_last_error());
    /* Silent corruption of device 3's half (X=1, Y=1): it differs from device 1's, the first
     * device holding the same half (CPU parameters live in host memory). */
    mw_trainer *tr = m.tr;
    ((float *)tr->prog->w[3].params)[tr->prog->w[3].plan.params[m.w1->leaf].off] += 1e-6f;
    cr_assert_eq(mw_trainer_check_replicas(m.tr), MW_ERR_STATE);
    cr_assert(strstr(mw_last_error(),
                     "parameter 'w1' (the same shard) differs between devices cpu:3 and cpu:1"),
              "%s", mw_last_error());
    close_mlp(&m);
}

Test(tensor_parallel, memory_per_device_shrinks) {
    mlp one, two;
    open_mlp(&one, "cpu:1", "X", NULL, NULL);
    open_mlp(&two, "cpu:2", "Y", NULL, "Y");
    mw_device_memory a, b;
    cr_assert_eq(mw_trainer_memory(one.tr, 0, &a), MW_OK);
    cr_assert_eq(mw_trainer_memory(two.tr, 1, &b), MW_OK);
    /* w1, b1 and w2 are halved; b2 is whole: 12*10 + 10 + 3*10 + 3 = 163 -> 60 + 5 + 15 + 3. */
    cr_assert_eq(a.parameters, 163 * 4);
    cr_assert_eq(b.parameters, 83 * 4);
    close_mlp(&one);
    close_mlp(&two);
}

/* --- errors ----------------------------------------------------------------------------------- */

Test(tensor_parallel, what_cannot_be_sharded_is_refused) {
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", 4}, {"In", 6}));
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Hidden", 8}, {"In", 6}), MW_INIT_ZEROS);
    mw_tensor *h = mw_dot(g, x, w, "In");
    /* A parameter already used. */
    cr_assert_null(mw_shard(g, w, "Hidden", "Y"));
    cr_assert_eq(mw_graph_status(g), MW_ERR_SHARDING);
    cr_assert(strstr(mw_graph_error(g), "already used") != NULL, "%s", mw_graph_error(g));
    cr_assert_not_null(h);
    mw_graph_free(g);

    /* Two axes of one parameter over one mesh axis. */
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    w = mw_param(g, "w", MW_AXES({"Hidden", 8}, {"In", 6}), MW_INIT_ZEROS);
    cr_assert_not_null(mw_shard(g, w, "Hidden", "Y"));
    cr_assert_null(mw_shard(g, w, "In", "Y"));
    cr_assert_eq(mw_graph_status(g), MW_ERR_SHARDING);
    cr_assert(strstr(mw_graph_error(g), "mesh axis Y") != NULL, "%s", mw_graph_error(g));
    mw_graph_free(g);

    /* A contraction whose result would split two axes over Y: the first parameter is gathered
     * (FSDP), the second stays split (tensor parallelism). */
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *a = mw_param(g, "a", MW_AXES({"M", 4}, {"K", 6}), MW_INIT_ZEROS);
    mw_tensor *b = mw_param(g, "b", MW_AXES({"K", 6}, {"N", 8}), MW_INIT_ZEROS);
    mw_shard(g, a, "M", "Y");
    mw_shard(g, b, "N", "Y");
    mw_tensor *ab = mw_dot(g, a, b, "K");
    cr_assert_not_null(ab, "%s", mw_graph_error(g));
    cr_assert_eq(ab->in[0]->op, MW__OP_GATHER);
    cr_assert_eq(ab->in[1], b);
    mw_graph_free(g);

    /* A parameter split along its second axis, which the other operand holds whole, is
     * gathered along it. */
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", 4}, {"In", 6}));
    w = mw_param(g, "w", MW_AXES({"Out", 8}, {"In", 6}), MW_INIT_ZEROS);
    mw_shard(g, w, "In", "Y");
    mw_tensor *xw = mw_dot(g, x, w, "In");
    cr_assert_not_null(xw, "%s", mw_graph_error(g));
    cr_assert(xw->in[1]->op == MW__OP_GATHER && xw->in[1]->p.along.axis == 1);
    mw_graph_free(g);

    /* Ops that need a parameter's axis whole gather it (layer norm's weights, the embedding's
     * table); the cross-entropy's classes of a computed value cannot be gathered. */
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", 4}, {"Embed", 6}));
    mw_tensor *lw = mw_param(g, "lw", MW_AXES({"Embed", 6}), MW_INIT_ZEROS);
    mw_tensor *lb = mw_param(g, "lb", MW_AXES({"Embed", 6}), MW_INIT_ZEROS);
    mw_shard(g, lw, "Embed", "Y");
    mw_shard(g, lb, "Embed", "Y");
    mw_tensor *ln = mw_layernorm(g, x, lw, lb, "Embed", 1e-5f);
    cr_assert_not_null(ln, "%s", mw_graph_error(g));
    cr_assert(ln->in[1]->op == MW__OP_GATHER && ln->in[2]->op == MW__OP_GATHER);
    mw_graph_free(g);

    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *ids = mw_input(g, "ids", MW_I32, MW_AXES({"Batch", 4}));
    mw_tensor *table = mw_param(g, "table", MW_AXES({"Vocab", 16}, {"Dim", 4}), MW_INIT_ZEROS);
    mw_shard(g, table, "Vocab", "Y");
    mw_tensor *e = mw_embedding(g, table, ids, "Vocab");
    cr_assert_not_null(e, "%s", mw_graph_error(g));
    cr_assert_eq(e->in[0]->op, MW__OP_GATHER);
    mw_graph_free(g);

    cr_assert_eq(mw_graph_new(&g), MW_OK);
    ids = mw_input(g, "ids", MW_I32, MW_AXES({"Batch", 4}));
    x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", 4}, {"Dim", 4}));
    mw_tensor *head = mw_param(g, "head", MW_AXES({"Vocab", 16}, {"Dim", 4}), MW_INIT_ZEROS);
    mw_shard(g, head, "Vocab", "Y");
    mw_tensor *logits = mw_dot(g, x, head, "Dim");
    cr_assert_not_null(logits);
    cr_assert_null(mw_cross_entropy(g, logits, ids, "Vocab", 0));
    cr_assert_eq(mw_graph_status(g), MW_ERR_SHARDING, "%s", mw_graph_error(g));
    mw_graph_free(g);
}

Test(tensor_parallel, trainer_errors_name_the_axis) {
    /* The graph splits over Y; the mesh has no Y. */
    mlp m;
    build(&m, NULL, "Y");
    cr_assert_eq(mw_mesh_new("cpu:2", "X", &m.mesh), MW_OK);
    cr_assert_eq(mw_trainer_new(m.g, m.loss, m.mesh, NULL, &m.tr), MW_ERR_SHARDING);
    cr_assert(strstr(mw_last_error(), "'Y'") != NULL, "%s", mw_last_error());
    mw_mesh_free(m.mesh);
    /* More devices along Y than rows of Hidden. */
    cr_assert_eq(mw_mesh_new("cpu:16", "Y", &m.mesh), MW_OK);
    cr_assert_eq(mw_trainer_new(m.g, m.loss, m.mesh, NULL, &m.tr), MW_ERR_SHARDING);
    cr_assert(strstr(mw_last_error(), "Hidden@Y") != NULL && strstr(mw_last_error(), "w1"), "%s",
              mw_last_error());
    mw_mesh_free(m.mesh);
    mw_graph_free(m.g);
}

/* --- GPT-2 with heads and MLP units split ------------------------------------------------------
 */

#define GB 4
#define GT 32
#define GSTEPS 4

static const gpt2_config gcfg = {
    .layers = 2, .heads = 4, .channels = 64, .max_seq = 32, .vocab = 64, .padded_vocab = 64};

static void gpt2_losses(const char *devices, const char *axes, const char *data, const char *model,
                        float *loss, float *wte) {
    mw_graph *g;
    gpt2_graph gg;
    mw_mesh *mesh;
    mw_trainer *tr;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    cr_assert_eq(
        gpt2_build(g, &gcfg,
                   &(gpt2_layout){.batch = GB, .seq = GT, .data_axis = data, .model_axis = model},
                   &gg),
        MW_OK, "%s", mw_graph_error(g));
    cr_assert_eq(mw_mesh_new(devices, axes, &mesh), MW_OK);
    mw_trainer_config c = {.optimizer = {MW_ADAMW, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f,
                                         .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f},
                           .shard_optimizer = zero1};
    cr_assert_eq(mw_trainer_new(g, gg.loss, mesh, &c, &tr), MW_OK, "%s/%s: %s", devices, axes,
                 mw_last_error());
    int32_t in[GB * GT], tg[GB * GT];
    for (int s = 0; s < GSTEPS; s++) {
        uint64_t r = 77 + (uint64_t)(s % 2);
        for (int i = 0; i < GB * GT; i++) {
            in[i] = rng_below(&r, gcfg.vocab);
            tg[i] = (int32_t)((uint32_t)in[i] * 7u % (uint32_t)gcfg.vocab); /* learnable */
        }
        mw_feed f[2] = {{"tokens", in, GB * GT}, {"targets", tg, GB * GT}};
        cr_assert_eq(mw_trainer_step(tr, f, 2, &loss[s]), MW_OK, "%s step %d: %s", devices, s,
                     mw_last_error());
    }
    cr_assert_eq(mw_trainer_read_param(tr, "h1.fcprojw", wte, 4 * 64 * 64), MW_OK, "%s",
                 mw_last_error());
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

Test(tensor_parallel, gpt2_heads_and_mlp_split_match_one_device, .timeout = 240) {
    float one[GSTEPS], y2[GSTEPS], xy[GSTEPS], xy2[GSTEPS], xyz[GSTEPS];
    static float p1[4 * 64 * 64], p2[4 * 64 * 64], p3[4 * 64 * 64], p4[4 * 64 * 64],
        p5[4 * 64 * 64];
    gpt2_losses("cpu:1", "X", NULL, NULL, one, p1);
    cr_assert_lt(one[GSTEPS - 1], one[0]);
    gpt2_losses("cpu:2", "Y", NULL, "Y", y2, p2);
    gpt2_losses("cpu:4", "X=2,Y=2", "X", "Y", xy, p3);
    gpt2_losses("cpu:4", "X=2,Y=2", "X", "Y", xy2, p4);
    zero1 = 1; /* and with the optimizer state split over X: the same bits */
    gpt2_losses("cpu:4", "X=2,Y=2", "X", "Y", xyz, p5);
    zero1 = 0;
    for (int s = 0; s < GSTEPS; s++) {
        cr_assert(fabsf(y2[s] - one[s]) <= 1e-5f * one[s], "Y=2 step %d: %.9g vs %.9g", s, y2[s],
                  one[s]);
        cr_assert(fabsf(xy[s] - one[s]) <= 1e-5f * one[s], "X=2,Y=2 step %d: %.9g vs %.9g", s,
                  xy[s], one[s]);
    }
    /* After AdamW steps the weights agree to within a few steps' worth of rounding-sized
     * changes (lr 1e-3 times a relative gradient change of ~1e-6 per step). */
    for (int i = 0; i < 4 * 64 * 64; i++) {
        cr_assert(fabsf(p2[i] - p1[i]) <= 2e-5f, "Y=2 h1.fcprojw[%d] %.9g vs %.9g", i, p2[i],
                  p1[i]);
        cr_assert(fabsf(p3[i] - p1[i]) <= 2e-5f, "X=2,Y=2 h1.fcprojw[%d] %.9g vs %.9g", i, p3[i],
                  p1[i]);
    }
    cr_assert(memcmp(xy, xy2, sizeof xy) == 0 && memcmp(p3, p4, sizeof p3) == 0,
              "X=2,Y=2 run twice differs");
    cr_assert(memcmp(xy, xyz, sizeof xy) == 0 && memcmp(p3, p5, sizeof p3) == 0,
              "X=2,Y=2 with ZeRO-1 differs from without");
}

/* --- every op that accepts a split axis ----------------------------------------------------------
 *
 * Each case builds h [Batch, Hidden] = x . W (W [Hidden, In], Hidden split over Y), applies the op
 * under test with other split parameters where it takes two operands, and ends in a scalar loss.
 * The loss and every parameter's gradient on cpu:2 (Y=2), cpu:3 (Y=3, uneven) and cpu:4 (X=2,Y=2,
 * the batch sharded over X) must equal
 * those of one device: the op's kernel runs on local shards, and its reductions, broadcasts and
 * gradients go through the SPMD rules. */

#define OB 6 /* batch */
#define OI 5 /* in */
#define OH 7 /* hidden: 4 + 3 over Y=2, 3 + 2 + 2 over Y=3 */

typedef mw_tensor *(*op_case)(mw_graph *g, mw_tensor *h, mw_tensor *v, const char *y);

/* v: a second parameter [Hidden] split like h, for the binary ops. */
static mw_tensor *op_add(mw_graph *g, mw_tensor *h, mw_tensor *v, const char *y) {
    (void)y;
    return mw_add(g, h, v);
}
static mw_tensor *op_sub(mw_graph *g, mw_tensor *h, mw_tensor *v, const char *y) {
    (void)y;
    return mw_sub(g, v, h);
}
static mw_tensor *op_mul(mw_graph *g, mw_tensor *h, mw_tensor *v, const char *y) {
    (void)y;
    return mw_mul(g, h, v);
}
static mw_tensor *op_div(mw_graph *g, mw_tensor *h, mw_tensor *v, const char *y) {
    (void)y;
    return mw_div(g, h, mw_add(g, mw_mul(g, v, v), mw_scale(g, mw_abs(g, v), 0.0f)));
}
static mw_tensor *op_maps(mw_graph *g, mw_tensor *h, mw_tensor *v, const char *y) {
    (void)v, (void)y;
    mw_tensor *a = mw_add(g, mw_tanh(g, h), mw_sigmoid(g, h));
    mw_tensor *b = mw_add(g, mw_relu(g, h), mw_gelu(g, mw_scale(g, h, 0.5f)));
    mw_tensor *c = mw_log(g, mw_add(g, mw_exp(g, mw_scale(g, h, 0.1f)), mw_abs(g, h)));
    return mw_add(g, mw_add(g, a, b), mw_sqrt(g, mw_add(g, mw_mul(g, c, c), mw_exp(g, h))));
}
static mw_tensor *op_minmax(mw_graph *g, mw_tensor *h, mw_tensor *v, const char *y) {
    (void)y;
    mw_tensor *hi = mw_maximum(g, h, v), *lo = mw_minimum(g, h, v);
    mw_tensor *mask = mw_compare(g, h, v, MW_GT);
    return mw_add(g, mw_mul(g, hi, lo), mw_where(g, mask, h, mw_scale(g, v, 2.0f)));
}
/* Summing the split axis gives a partial sum, all-reduced where used. */
static mw_tensor *op_sum_split(mw_graph *g, mw_tensor *h, mw_tensor *v, const char *y) {
    (void)v, (void)y;
    mw_tensor *s = mw_sum(g, mw_mul(g, h, h), "Hidden"); /* [Batch] partial over Y */
    return mw_mul(g, s, s);                              /* needs the true value */
}
/* Reducing the other axis keeps Hidden@Y. */
static mw_tensor *op_mean_batch(mw_graph *g, mw_tensor *h, mw_tensor *v, const char *y) {
    (void)y;
    mw_tensor *m = mw_mean(g, h, "Batch"); /* [Hidden@Y] */
    return mw_mul(g, mw_mul(g, m, m), v);
}
/* h with an axis K that is split nowhere (an outer product with a replicated k [K=3]): the axis
 * that max, slice, select and concat work along while Batch and Hidden may be split. */
static mw_tensor *with_k(mw_graph *g, mw_tensor *h) {
    mw_tensor *k = mw_param(g, "k", MW_AXES({"K", 3}), MW_INIT_UNIFORM(1.0f));
    return mw_contract(g, h, k, "Batch,Hidden,K");
}
static mw_tensor *op_max(mw_graph *g, mw_tensor *h, mw_tensor *v, const char *y) {
    (void)v, (void)y;
    mw_tensor *hk = with_k(g, h);
    return mw_add(g, mw_max(g, hk, "K"), mw_argmax(g, hk, "K"));
}
static mw_tensor *op_slice(mw_graph *g, mw_tensor *h, mw_tensor *v, const char *y) {
    (void)y;
    mw_tensor *hk = with_k(g, h), *a = mw_slice(g, hk, "K", 1, 2, NULL);
    return mw_add(g, mw_sum(g, mw_mul(g, a, a), "K"), mw_mul(g, mw_select(g, hk, "K", 0), v));
}
static mw_tensor *op_concat(mw_graph *g, mw_tensor *h, mw_tensor *v, const char *y) {
    (void)v, (void)y;
    mw_tensor *hk = with_k(g, h);
    mw_tensor *xs[2] = {hk, mw_scale(g, hk, -0.5f)};
    mw_tensor *c = mw_concat(g, xs, 2, "K");
    return mw_mul(g, c, mw_tanh(g, c));
}
/* The dropout mask follows each element's index in the whole tensor: a split run draws the
 * single device's mask. */
static mw_tensor *op_dropout(mw_graph *g, mw_tensor *h, mw_tensor *v, const char *y) {
    (void)y;
    mw_tensor *d = mw_dropout(g, h, 0.3f, 99);
    return mw_mul(g, mw_mul(g, d, d), v);
}
/* The split axis as a batch axis of the fused attention (heads). */
static mw_tensor *op_attention(mw_graph *g, mw_tensor *h, mw_tensor *v, const char *y) {
    (void)h, (void)v;
    mw_tensor *qkv = mw_param(g, "qkv", MW_AXES({"Part", 3}, {"Head", 3}, {"Seq", 4}, {"D", 2}),
                              MW_INIT_NORMAL(1.0f));
    if (y) qkv = mw_shard(g, qkv, "Head", y);
    mw_tensor *a = mw_attention(g, qkv, "Part", "Seq", "D", 1, 0.7f);
    return mw_mul(g, a, a);
}

static const struct {
    const char *name;
    op_case fn;
} op_cases[] = {
    {"add", op_add},
    {"sub", op_sub},
    {"mul", op_mul},
    {"div", op_div},
    {"maps", op_maps},
    {"min/max/where", op_minmax},
    {"sum", op_sum_split},
    {"mean", op_mean_batch},
    {"max/argmax", op_max},
    {"slice/select", op_slice},
    {"concat", op_concat},
    {"dropout", op_dropout},
    {"attention", op_attention},
};

typedef struct op_run {
    float loss;
    float w[OH * OI], v[OH], u[OI], ub[OI], qkv[3 * 3 * 4 * 2];
} op_run;

/* devices: cpu:1, or cpu:N with Hidden split over Y=N, or cpu:4 as X=2,Y=2 with the batch also
 * sharded over X. A layer norm with replicated weights u and ub [In] comes before the split
 * layer, so their gradients arrive partial over Y (and over X from the batch): summed over Y,
 * then X. */
static op_run op_train(int which, const char *devices) {
    const char *y = strcmp(devices, "cpu:1") == 0 ? NULL : "Y";
    int two_d = strcmp(devices, "cpu:4") == 0;
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", OB}, {"In", OI}));
    if (two_d) x = mw_shard(g, x, "Batch", "X");
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Hidden", OH}, {"In", OI}), MW_INIT_NORMAL(0.7f));
    mw_tensor *v = mw_param(g, "v", MW_AXES({"Hidden", OH}), MW_INIT_UNIFORM(1.0f));
    mw_tensor *u = mw_param(g, "u", MW_AXES({"In", OI}), MW_INIT_UNIFORM(1.0f));
    if (y) {
        mw_shard(g, w, "Hidden", y);
        mw_shard(g, v, "Hidden", y);
    }
    mw_tensor *ub = mw_param(g, "ub", MW_AXES({"In", OI}), MW_INIT_UNIFORM(0.5f));
    mw_tensor *h = mw_dot(g, mw_layernorm(g, x, u, ub, "In", 1e-5f), w, "In");
    mw_tensor *out = op_cases[which].fn(g, h, v, y);
    /* v takes part in every loss, so every case has the same parameters. */
    mw_tensor *loss = mw_add(g, mw_mean(g, out, NULL), mw_mean(g, mw_mul(g, v, v), NULL));
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s: %s", op_cases[which].name, mw_graph_error(g));
    mw_mesh *mesh;
    cr_assert_eq(mw_mesh_new(devices, two_d ? "X=2,Y=2" : y ? "Y" : "X", &mesh), MW_OK);
    mw_trainer *tr;
    mw_trainer_config c = {.optimizer = {MW_SGD, .lr = 0.1f}};
    cr_assert_eq(mw_trainer_new(g, loss, mesh, &c, &tr), MW_OK, "%s on %s: %s",
                 op_cases[which].name, devices, mw_last_error());
    float xs[OB * OI];
    for (int i = 0; i < OB * OI; i++) xs[i] = sinf(0.7f * (float)i + 0.3f);
    mw_feed f = {"x", xs, OB * OI};
    op_run r = {0};
    cr_assert_eq(mw_trainer_compute_grads(tr, &f, 1, &r.loss), MW_OK, "%s: %s",
                 op_cases[which].name, mw_last_error());
    cr_assert_eq(mw_trainer_read_grad(tr, "w", r.w, OH * OI), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_grad(tr, "v", r.v, OH), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_grad(tr, "u", r.u, OI), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_grad(tr, "ub", r.ub, OI), MW_OK, "%s", mw_last_error());
    if (op_cases[which].fn == op_attention)
        cr_assert_eq(mw_trainer_read_grad(tr, "qkv", r.qkv, 3 * 3 * 4 * 2), MW_OK, "%s",
                     mw_last_error());
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    return r;
}

Test(tensor_parallel, every_op_on_a_split_axis_matches_one_device) {
    for (int c = 0; c < (int)(sizeof op_cases / sizeof *op_cases); c++) {
        op_run one = op_train(c, "cpu:1");
        const char *devs[3] = {"cpu:2", "cpu:3", "cpu:4"};
        for (int k = 0; k < 3; k++) {
            op_run got = op_train(c, devs[k]);
            char what[64];
            snprintf(what, sizeof what, "%s on %s: loss", op_cases[c].name, devs[k]);
            near(what, &got.loss, &one.loss, 1);
            snprintf(what, sizeof what, "%s on %s: grad w", op_cases[c].name, devs[k]);
            near(what, got.w, one.w, OH * OI);
            snprintf(what, sizeof what, "%s on %s: grad v", op_cases[c].name, devs[k]);
            near(what, got.v, one.v, OH);
            snprintf(what, sizeof what, "%s on %s: grad u", op_cases[c].name, devs[k]);
            near(what, got.u, one.u, OI);
            snprintf(what, sizeof what, "%s on %s: grad ub", op_cases[c].name, devs[k]);
            near(what, got.ub, one.ub, OI);
            snprintf(what, sizeof what, "%s on %s: grad qkv", op_cases[c].name, devs[k]);
            near(what, got.qkv, one.qkv, 3 * 3 * 4 * 2);
        }
    }
}
