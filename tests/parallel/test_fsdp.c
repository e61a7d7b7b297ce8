/* Parameters split over the axis that also shards the batch (FSDP): a parameter labelled
 * Hidden@X is stored as each device's rows, gathered whole where an op meets it, and its gradient
 * reduce-scattered back. Against the same model with every parameter replicated on the same mesh:
 * the gathered parameters are the whole ones, the reduce-scatter gives each device the bits the
 * all-reduce gives, and the gradient norm is exact (integer bins), so however the gradient is cut
 * among the devices the norm, clipping by it, every loss and every parameter are bitwise equal.
 * Also: the memory a device holds, uneven splits, FSDP beside tensor parallelism on a 2-D mesh,
 * checkpoints that load into the replicated model, and the errors. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpt2_model.h"
#include "meshwit.h"
#include "parallel/program.h"
#include "parallel/trainer_impl.h"
#include "tests/common/rng.h"

#define BATCH 12
#define IN 6
#define HIDDEN 10
#define OUT 5
#define STEPS 6

typedef struct model {
    mw_graph *g;
    mw_tensor *loss;
    mw_mesh *mesh;
    mw_trainer *tr;
} model;

static float data_x[BATCH * IN], data_y[BATCH * OUT];

static void make_data(int step) {
    uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(step + 3);
    for (int i = 0; i < BATCH * IN; i++) data_x[i] = (float)rng_range(rng_lcg64(&s), -1, 1);
    for (int r = 0; r < BATCH; r++)
        for (int o = 0; o < OUT; o++) {
            double v = 0.1 * o;
            for (int i = 0; i < IN; i++) v += cos(0.7 * (i + 1) * (o + 2)) * data_x[r * IN + i];
            data_y[r * OUT + o] = (float)tanh(v);
        }
}

static const char *const names[] = {"w1", "b1", "w2", "b2"};
static int along_in; /* the next FSDP models split w1 along In instead of Hidden */
static const int64_t sizes[] = {HIDDEN * IN, HIDDEN, OUT *HIDDEN, OUT};

/* fsdp: the mesh axis the parameters are split over (NULL: replicated); model: a second mesh axis
 * w2's Hidden is split over (tensor parallelism), or NULL. */
static void build(model *m, const char *fsdp, const char *model_axis) {
    memset(m, 0, sizeof *m);
    cr_assert_eq(mw_graph_new(&m->g), MW_OK);
    mw_graph *g = m->g;
    mw_tensor *x =
        mw_shard(g, mw_input(g, "x", MW_F32, MW_AXES({"Batch", BATCH}, {"In", IN})), "Batch", "X");
    mw_tensor *y = mw_shard(g, mw_input(g, "y", MW_F32, MW_AXES({"Batch", BATCH}, {"Out", OUT})),
                            "Batch", "X");
    mw_tensor *w1 =
        mw_param(g, "w1", MW_AXES({"Hidden", HIDDEN}, {"In", IN}), MW_INIT_NORMAL(0.5f));
    mw_tensor *b1 = mw_param(g, "b1", MW_AXES({"Hidden", HIDDEN}), MW_INIT_UNIFORM(0.1f));
    mw_tensor *w2 =
        mw_param(g, "w2", MW_AXES({"Out", OUT}, {"Hidden", HIDDEN}), MW_INIT_NORMAL(0.5f));
    mw_tensor *b2 = mw_param(g, "b2", MW_AXES({"Out", OUT}), MW_INIT_UNIFORM(0.1f));
    if (model_axis) { /* w1 column-parallel, w2 row-parallel over model_axis */
        cr_assert_not_null(mw_shard(g, w1, "Hidden", model_axis));
        cr_assert_not_null(mw_shard(g, b1, "Hidden", model_axis));
        cr_assert_not_null(mw_shard(g, w2, "Hidden", model_axis));
    }
    if (fsdp) {            /* a parameter's first axis, where no model axis splits it already */
        if (!model_axis) { /* w1 along its second axis: gathered through scratch */
            cr_assert_not_null(mw_shard(g, w1, along_in ? "In" : "Hidden", fsdp), "%s",
                               mw_graph_error(g));
            cr_assert_not_null(mw_shard(g, b1, "Hidden", fsdp));
        } else {
            cr_assert_not_null(mw_shard(g, b2, "Out", fsdp));
        }
        cr_assert_not_null(mw_shard(g, w2, "Out", fsdp));
    }
    mw_tensor *h = mw_gelu(g, mw_add(g, mw_dot(g, x, w1, "In"), b1));
    mw_tensor *e = mw_sub(g, mw_add(g, mw_dot(g, h, w2, "Hidden"), b2), y);
    m->loss = mw_mean(g, mw_mul(g, e, e), NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
}

static void open_model(model *m, const char *devices, const char *axes, const char *fsdp,
                       const char *model_axis, float clip) {
    build(m, fsdp, model_axis);
    cr_assert_eq(mw_mesh_new(devices, axes, &m->mesh), MW_OK, "%s", mw_last_error());
    mw_trainer_config c = {.optimizer = {MW_ADAMW, .lr = 2e-2f, .beta1 = 0.9f, .beta2 = 0.99f,
                                         .eps = 1e-8f, .weight_decay = 0.05f, .grad_clip = clip}};
    cr_assert_eq(mw_trainer_new(m->g, m->loss, m->mesh, &c, &m->tr), MW_OK, "%s on %s: %s",
                 fsdp ? "FSDP" : "replicated", devices, mw_last_error());
}

static void close_model(model *m) {
    mw_trainer_free(m->tr);
    mw_mesh_free(m->mesh);
    mw_graph_free(m->g);
}

typedef struct run {
    float loss[STEPS], norm[STEPS];
    float p[HIDDEN * IN + HIDDEN + OUT * HIDDEN + OUT];
} run;

static void train(model *m, run *r) {
    for (int s = 0; s < STEPS; s++) {
        make_data(s);
        mw_feed f[] = {{"x", data_x, BATCH * IN}, {"y", data_y, BATCH * OUT}};
        cr_assert_eq(mw_trainer_step(m->tr, f, 2, &r->loss[s]), MW_OK, "%s", mw_last_error());
        r->norm[s] = mw_trainer_grad_norm(m->tr);
    }
    float *p = r->p;
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(mw_trainer_read_param(m->tr, names[i], p, sizes[i]), MW_OK, "%s",
                     mw_last_error());
        p += sizes[i];
    }
}

static void run_mode(const char *devices, const char *axes, const char *fsdp,
                     const char *model_axis, float clip, run *r) {
    model m;
    open_model(&m, devices, axes, fsdp, model_axis, clip);
    train(&m, r);
    close_model(&m);
}

static void same_bits(const run *a, const run *b, const char *what) {
    cr_assert(memcmp(a->norm, b->norm, sizeof a->norm) == 0,
              "%s: gradient norms differ (%.9g vs %.9g)", what, (double)a->norm[0],
              (double)b->norm[0]);
    cr_assert(memcmp(a->loss, b->loss, sizeof a->loss) == 0, "%s: losses differ (%.9g vs %.9g)",
              what, (double)a->loss[STEPS - 1], (double)b->loss[STEPS - 1]);
    for (size_t i = 0; i < sizeof a->p / sizeof *a->p; i++)
        cr_assert(memcmp(&a->p[i], &b->p[i], sizeof *a->p) == 0,
                  "%s: parameter element %zu: %.9g vs %.9g", what, i, (double)a->p[i],
                  (double)b->p[i]);
}

#define CLIP 0.05f /* below every step's gradient norm here: clipping scales every step */

Test(fsdp, bitwise_equal_to_replicated_with_and_without_clipping) {
    static const char *const meshes[][2] = {{"cpu:2", "X"}, {"cpu:3", "X"}, {"cpu:4", "X"}};
    for (int k = 0; k < 3; k++)
        for (int c = 0; c < 2; c++) {
            float clip = c ? CLIP : 0.0f;
            char what[64];
            snprintf(what, sizeof what, "%s, clip %g", meshes[k][0], (double)clip);
            run rep, fs;
            run_mode(meshes[k][0], meshes[k][1], NULL, NULL, clip, &rep);
            run_mode(meshes[k][0], meshes[k][1], "X", NULL, clip, &fs);
            same_bits(&rep, &fs, what);
            cr_assert(fs.loss[STEPS - 1] < fs.loss[0], "%s: no learning", what);
            for (int s = 0; c && s < STEPS; s++)
                cr_assert_gt(fs.norm[s], CLIP, "%s: step %d was not clipped", what, s);
            along_in = 1; /* w1 split along its second axis */
            run_mode(meshes[k][0], meshes[k][1], "X", NULL, clip, &fs);
            along_in = 0;
            same_bits(&rep, &fs, what);
        }
}

Test(fsdp, beside_tensor_parallelism_on_a_2d_mesh) {
    /* X shards the batch and, FSDP, w2's and b2's first axis (Out); Y splits Hidden (w1, b1 and
     * w2's second axis). Against the tensor-parallel model with the parameters replicated over X:
     * the same bits, clipped or not. */
    for (int c = 0; c < 2; c++) {
        run tp, both;
        run_mode("cpu:4", "X=2,Y=2", NULL, "Y", c ? CLIP : 0.0f, &tp);
        run_mode("cpu:4", "X=2,Y=2", "X", "Y", c ? CLIP : 0.0f, &both);
        same_bits(&tp, &both, c ? "X=2,Y=2, clipped" : "X=2,Y=2");
    }
}

Test(fsdp, a_device_holds_its_share) {
    model rep, fs;
    open_model(&rep, "cpu:2", "X", NULL, NULL, 0.0f);
    open_model(&fs, "cpu:2", "X", "X", NULL, 0.0f);
    mw_device_memory a, b;
    cr_assert_eq(mw_trainer_memory(rep.tr, 0, &a), MW_OK);
    cr_assert_eq(mw_trainer_memory(fs.tr, 0, &b), MW_OK);
    /* w1, b1 and w2 are split in halves (w2's Out: 3 of 5 rows on device 0); b2 is whole. */
    int64_t whole = (HIDDEN * IN + HIDDEN + OUT * HIDDEN + OUT) * 4;
    int64_t mine = (HIDDEN * IN / 2 + HIDDEN / 2 + 3 * HIDDEN + OUT) * 4;
    cr_assert_eq(a.parameters, whole);
    cr_assert_eq(b.parameters, mine, "%lld", (long long)b.parameters);
    cr_assert_eq(b.gradients, mine);
    cr_assert_eq(b.optimizer, 2 * mine);
    close_model(&rep);
    close_model(&fs);
}

Test(fsdp, checkpoints_load_into_the_replicated_model) {
    char path[64];
    snprintf(path, sizeof path, "fsdp.%ld.ckpt", (long)getpid());
    model fs, rep;
    open_model(&fs, "cpu:2", "X", "X", NULL, 0.0f);
    run a;
    train(&fs, &a);
    cr_assert_eq(mw_trainer_save(fs.tr, path, NULL, 0), MW_OK, "%s", mw_last_error());
    /* The same model replicated on one device resumes from it: the same parameters. */
    open_model(&rep, "cpu:1", "X", NULL, NULL, 0.0f);
    cr_assert_eq(mw_trainer_load(rep.tr, path, NULL, 0, NULL), MW_OK, "%s", mw_last_error());
    float *p = malloc(sizeof a.p);
    float *q = p;
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(mw_trainer_read_param(rep.tr, names[i], q, sizes[i]), MW_OK);
        q += sizes[i];
    }
    cr_assert(memcmp(p, a.p, sizeof a.p) == 0, "loaded parameters differ");
    /* And the next step of both agrees (the moments came along): one device and two differ only
     * in the order of sums, to float rounding. */
    make_data(STEPS);
    mw_feed f[] = {{"x", data_x, BATCH * IN}, {"y", data_y, BATCH * OUT}};
    float l1, l2;
    cr_assert_eq(mw_trainer_step(fs.tr, f, 2, &l1), MW_OK);
    cr_assert_eq(mw_trainer_step(rep.tr, f, 2, &l2), MW_OK);
    cr_assert(fabsf(l1 - l2) <= 1e-6f * fabsf(l1), "%.9g vs %.9g", (double)l1, (double)l2);
    free(p);
    remove(path);
    close_model(&fs);
    close_model(&rep);
}

Test(fsdp, only_parameters_are_gathered) {
    /* A computed value (or an input) split over X meeting the axis whole is the mixing the
     * design refuses: only a parameter's storage is a label the rules may gather. */
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *x =
        mw_shard(g, mw_input(g, "x", MW_F32, MW_AXES({"Batch", BATCH}, {"In", IN})), "Batch", "X");
    mw_tensor *v = mw_shard(g, mw_input(g, "v", MW_F32, MW_AXES({"In", IN})), "In", "X");
    cr_assert_null(mw_mul(g, x, v));
    cr_assert_eq(mw_graph_status(g), MW_ERR_SHARDING);
    const char *e = mw_graph_error(g);
    cr_assert(strstr(e, "In@X") && strstr(e, "mw_mul"), "%s", e);
    mw_graph_free(g);
}

/* --- GPT-2 ---------------------------------------------------------------------------------- */

#define GB 4
#define GT 32
#define GSTEPS 3
#define NSAVED (4 * 64 * 64 + 64 * 64 + 3 * 64 * 64)

static const gpt2_config gcfg = {
    .layers = 2, .heads = 4, .channels = 64, .max_seq = 32, .vocab = 64, .padded_vocab = 64};

typedef struct gpt2_opts {
    const char *devices, *axes, *model; /* the batch is sharded over X */
    int fsdp, zero1, bf16, accumulate, keep, recompute, serial;
} gpt2_opts;

/* The losses of GSTEPS steps and three parameters after them (h1.fcprojw, wte, h0.qkvw). */
static void gpt2_run(const gpt2_opts *o, float *loss, float *saved, mw_device_memory *mem) {
    mw_graph *g;
    gpt2_graph gg;
    mw_mesh *mesh;
    mw_trainer *tr;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    cr_assert_eq(gpt2_build(g, &gcfg,
                            &(gpt2_layout){.batch = GB,
                                           .seq = GT,
                                           .data_axis = "X",
                                           .model_axis = o->model,
                                           .fsdp_axis = o->fsdp ? "X" : NULL},
                            &gg),
                 MW_OK, "%s", mw_graph_error(g));
    cr_assert_eq(mw_mesh_new(o->devices, o->axes, &mesh), MW_OK);
    mw_trainer_config c = {.optimizer = {MW_ADAMW, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f,
                                         .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 0.25f},
                           .shard_optimizer = o->zero1,
                           .grad_accumulation = o->accumulate,
                           .precision = o->bf16 ? MW_PRECISION_BF16 : MW_PRECISION_FP32,
                           .keep_gathered = o->keep,
                           .gathers = o->serial ? MW_GATHERS_AT_USE : MW_GATHERS_AHEAD,
                           .recompute = o->recompute ? MW_RECOMPUTE_BLOCKS : MW_RECOMPUTE_NONE};
    cr_assert_eq(mw_trainer_new(g, gg.loss, mesh, &c, &tr), MW_OK, "%s: %s", o->devices,
                 mw_last_error());
    int32_t in[GB * GT], tg[GB * GT];
    for (int s = 0; s < GSTEPS; s++) {
        for (int micro = 0; micro <= o->accumulate; micro++) {
            uint64_t r = 91 + (uint64_t)s * 3 + (uint64_t)micro;
            for (int i = 0; i < GB * GT; i++) {
                in[i] = rng_below(&r, gcfg.vocab);
                tg[i] = (int32_t)((uint32_t)in[i] * 5u % (uint32_t)gcfg.vocab);
            }
            mw_feed f[2] = {{"tokens", in, GB * GT}, {"targets", tg, GB * GT}};
            mw_status st = micro < o->accumulate ? mw_trainer_accumulate(tr, f, 2, &loss[s])
                                                 : mw_trainer_step(tr, f, 2, &loss[s]);
            cr_assert_eq(st, MW_OK, "%s step %d: %s", o->devices, s, mw_last_error());
        }
        cr_assert_gt(mw_trainer_grad_norm(tr), 0.25f, "%s step %d: not clipped", o->devices, s);
    }
    cr_assert_eq(mw_trainer_read_param(tr, "h1.fcprojw", saved, 4 * 64 * 64), MW_OK);
    cr_assert_eq(mw_trainer_read_param(tr, "wte", saved + 4 * 64 * 64, 64 * 64), MW_OK);
    cr_assert_eq(mw_trainer_read_param(tr, "h0.qkvw", saved + 5 * 64 * 64, 3 * 64 * 64), MW_OK);
    if (mem) cr_assert_eq(mw_trainer_memory(tr, 0, mem), MW_OK);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

Test(fsdp, gpt2_bitwise_equal_to_replicated, .timeout = 300) {
    static const gpt2_opts modes[] = {
        {.devices = "cpu:2", .axes = "X", .model = NULL},
        {.devices = "cpu:4", .axes = "X", .model = NULL},
        {.devices = "cpu:2", .axes = "X", .model = NULL, .zero1 = 1},
        {.devices = "cpu:2", .axes = "X", .model = NULL, .bf16 = 1},
        {.devices = "cpu:2", .axes = "X", .model = NULL, .accumulate = 1},
        {.devices = "cpu:2",
         .axes = "X",
         .model = NULL,
         .keep = 1}, /* the gathered copies kept to backward */
        {.devices = "cpu:2",
         .axes = "X",
         .model = NULL,
         .recompute = 1}, /* every block recomputed */
        {.devices = "cpu:2",
         .axes = "X",
         .model = NULL,
         .serial = 1}, /* no gather started ahead (the others prefetch) */
        {.devices = "cpu:4", .axes = "X", .model = NULL, .recompute = 1, .serial = 1},
        /* beside tensor parallelism: the layer norms' gradients, partial over both axes, are
         * summed over Y first and then in X's buckets, as with the parameters replicated */
        {.devices = "cpu:4", .axes = "X=2,Y=2", .model = "Y"},
        {.devices = "cpu:4", .axes = "X=2,Y=2", .model = "Y", .zero1 = 1},
    };
    static float a[NSAVED], b[NSAVED];
    for (size_t k = 0; k < sizeof modes / sizeof *modes; k++) {
        gpt2_opts o = modes[k];
        float la[GSTEPS], lb[GSTEPS];
        mw_device_memory ma, mb;
        gpt2_run(&o, la, a, &ma);
        o.fsdp = 1;
        gpt2_run(&o, lb, b, &mb);
        cr_assert(memcmp(la, lb, sizeof la) == 0, "mode %zu: losses %.9g vs %.9g", k,
                  (double)la[GSTEPS - 1], (double)lb[GSTEPS - 1]);
        for (int i = 0; i < NSAVED; i++)
            cr_assert(memcmp(&a[i], &b[i], sizeof *a) == 0,
                      "mode %zu: element %d of fcprojw, wte, qkvw: %.9g vs %.9g", k, i,
                      (double)a[i], (double)b[i]);
        /* Parameters, gradients and moments: the large ones (fcw, fcprojw, wte at these sizes)
         * split over X's devices, the rest whole. */
        cr_assert_lt(mb.parameters + mb.gradients + mb.optimizer,
                     ma.parameters + ma.gradients + ma.optimizer, "mode %zu", k);
    }
}

/* A parameter of rank 2 that only ever is added (a bias) gets no weight decay, gathered or not:
 * the FSDP model's update equals the replicated one's. */
static void bias_run(int fsdp, float *out) {
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *x = mw_shard(g, mw_input(g, "x", MW_F32, MW_AXES({"Batch", 4}, {"A", 4}, {"B", 6})),
                            "Batch", "X");
    mw_tensor *b = mw_param(g, "bias", MW_AXES({"A", 4}, {"B", 6}), MW_INIT_UNIFORM(1.0f));
    if (fsdp) cr_assert_not_null(mw_shard(g, b, "A", "X"));
    mw_tensor *e = mw_add(g, x, b);
    mw_tensor *loss = mw_mean(g, mw_mul(g, e, e), NULL);
    cr_assert_eq(mw_mesh_new("cpu:2", "X", &mesh), MW_OK);
    mw_trainer_config c = {.optimizer = {MW_ADAMW, .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.99f,
                                         .eps = 1e-8f, .weight_decay = 0.5f}};
    cr_assert_eq(mw_trainer_new(g, loss, mesh, &c, &tr), MW_OK, "%s", mw_last_error());
    float xs[4 * 4 * 6];
    for (int i = 0; i < 4 * 4 * 6; i++) xs[i] = (float)(i % 7) * 0.25f - 0.5f;
    mw_feed f = {"x", xs, 4 * 4 * 6};
    for (int s = 0; s < 3; s++) cr_assert_eq(mw_trainer_step(tr, &f, 1, NULL), MW_OK);
    cr_assert_eq(mw_trainer_read_param(tr, "bias", out, 24), MW_OK);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

Test(fsdp, a_gathered_bias_gets_no_weight_decay) {
    float a[24], b[24];
    bias_run(0, a);
    bias_run(1, b);
    cr_assert(memcmp(a, b, sizeof a) == 0, "%.9g vs %.9g", (double)a[0], (double)b[0]);
}

Test(fsdp, gathered_again_in_backward_unless_kept) {
    /* By default a gathered parameter dies after its forward use and is gathered again in
     * backward: the activations are about those of data parallelism; kept, they hold every
     * gathered copy too. The same bits either way (the test above). */
    static float a[NSAVED];
    float l[GSTEPS];
    mw_device_memory dp, again, kept, both;
    gpt2_opts o = {.devices = "cpu:2", .axes = "X", .model = NULL};
    gpt2_run(&o, l, a, &dp);
    o.fsdp = 1;
    gpt2_run(&o, l, a, &again);
    o.keep = 1;
    gpt2_run(&o, l, a, &kept);
    /* At most one gathered copy beside data parallelism's activations (fcw or fcprojw, 64 KB at
     * these sizes) and its scratch (gathered along its second axis). */
    cr_assert_leq(again.activations, dp.activations + 2 * 4 * 4 * 64 * 64, "%lld vs %lld",
                  (long long)again.activations, (long long)dp.activations);
    cr_assert_gt(kept.activations, again.activations);
    /* With every block recomputed too, less again. */
    o.keep = 0, o.recompute = 1;
    gpt2_run(&o, l, a, &both);
    cr_assert_lt(both.activations, again.activations);
}

/* A GPT-2 trainer of `model` on cpu:2, the batch over X and, with fsdp, its parameters too,
 * given to fn with arg, then freed. */
static void with_gpt2_trainer(const gpt2_config *model, int fsdp, const mw_trainer_config *c,
                              void (*fn)(mw_trainer *, void *), void *arg) {
    mw_graph *g;
    gpt2_graph gg;
    mw_mesh *mesh;
    mw_trainer *tr;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    cr_assert_eq(
        gpt2_build(g, model,
                   &(gpt2_layout){
                       .batch = GB, .seq = GT, .data_axis = "X", .fsdp_axis = fsdp ? "X" : NULL},
                   &gg),
        MW_OK, "%s", mw_graph_error(g));
    cr_assert_eq(mw_mesh_new("cpu:2", "X", &mesh), MW_OK);
    cr_assert_eq(mw_trainer_new(g, gg.loss, mesh, c, &tr), MW_OK, "%s", mw_last_error());
    fn(tr, arg);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

static void read_memory(mw_trainer *tr, void *mem) {
    cr_assert_eq(mw_trainer_memory(tr, 0, mem), MW_OK);
}

/* A tied embedding under FSDP with every block recomputed: the table is gathered for the
 * embedding, freed, gathered again for the output layer and again in backward, and the step's
 * buffers are packed knowing their lifetimes, so FSDP needs no more activation memory than the
 * replicated model (the logits and one gathered table at once). Before packing, the loss settled
 * in the first gather's hole and the second gather went on top. */
static void tied_memory(int fsdp, int serial, mw_device_memory *mem) {
    static const gpt2_config big = {.layers = 2,
                                    .heads = 4,
                                    .channels = 64,
                                    .max_seq = 32,
                                    .vocab = 8192,
                                    .padded_vocab = 8192};
    mw_trainer_config c = {
        .optimizer = {MW_ADAMW, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f},
        .recompute = MW_RECOMPUTE_BLOCKS,
        .gathers = serial ? MW_GATHERS_AT_USE : MW_GATHERS_AHEAD};
    with_gpt2_trainer(&big, fsdp, &c, read_memory, mem);
}

Test(fsdp, a_tied_embedding_needs_no_more_activation_memory) {
    mw_device_memory rep, fs, ahead;
    tied_memory(0, 1, &rep);
    tied_memory(1, 1, &fs);
    tied_memory(1, 0, &ahead);
    /* The table (8192 x 64) is the largest parameter: split, it is half on each device. */
    cr_assert_lt(fs.parameters, rep.parameters * 3 / 4);
    cr_assert_leq(fs.activations, rep.activations,
                  "FSDP %lld bytes of activations, replicated %lld", (long long)fs.activations,
                  (long long)rep.activations);
    /* Prefetching keeps one more gathered copy alive where memory peaks: here exactly one of the
     * MLP's 64 x 256 weights. */
    cr_assert_leq(ahead.activations, rep.activations + 64 * 256 * 4,
                  "prefetching FSDP %lld bytes of activations, replicated %lld",
                  (long long)ahead.activations, (long long)rep.activations);
    cr_assert_gt(ahead.activations, fs.activations, "nothing was gathered ahead");
}

typedef struct gather_counts {
    int whole, started,
        overlapped; /* ALLGATHER; GATHER_START; starts with a GEMM before the wait */
} gather_counts;

/* In device 0's plan, every GATHER_START is completed by the next gather instruction, a
 * GATHER_WAIT of its group in the same pass (forward or backward), before any other gather
 * starts. */
static void count_gathers(mw_trainer *tr, void *arg) {
    const mw__plan *p = &tr->prog->w[0].plan;
    gather_counts *n = arg;
    for (int i = 0; i < p->nins; i++) {
        const mw__ins *in = &p->ins[i];
        n->whole += in->kind == MW__I_ALLGATHER;
        cr_assert_neq(in->kind, MW__I_GATHER_WAIT, "instruction %d: a wait with no start", i);
        if (in->kind != MW__I_GATHER_START) continue;
        n->started++;
        int j = i + 1, gemms = 0;
        for (; j < p->nins; j++) {
            mw__ins_kind k = p->ins[j].kind;
            gemms += k == MW__I_GEMM;
            if (k == MW__I_ALLGATHER || k == MW__I_GATHER_START || k == MW__I_GATHER_WAIT) break;
        }
        cr_assert_lt(j, p->nins, "instruction %d: a start never waited for", i);
        cr_assert_eq(p->ins[j].kind, MW__I_GATHER_WAIT, "instruction %d: started, then %d", i,
                     (int)p->ins[j].kind);
        cr_assert_eq(p->ins[j].group, in->group);
        cr_assert_eq(p->ins[j].ref.collective.buf.off, in->ref.collective.buf.off);
        cr_assert_eq(i < p->fwd_end, j < p->fwd_end, "instructions %d and %d span the passes", i,
                     j);
        n->overlapped += gemms > 0;
        i = j;
    }
}

Test(fsdp, each_gather_is_started_where_the_one_before_completes) {
    for (int recompute = 0; recompute <= 1; recompute++) {
        gather_counts serial = {0}, ahead = {0};
        mw_trainer_config c = {.optimizer = {MW_SGD, .lr = 0.1f},
                               .recompute = recompute ? MW_RECOMPUTE_BLOCKS : MW_RECOMPUTE_NONE};
        c.gathers = MW_GATHERS_AT_USE;
        with_gpt2_trainer(&gcfg, 1, &c, count_gathers, &serial);
        c.gathers = MW_GATHERS_AHEAD;
        with_gpt2_trainer(&gcfg, 1, &c, count_gathers, &ahead);
        cr_assert_eq(serial.started, 0);
        cr_assert_gt(serial.whole, 0);
        /* The same gathers; only the first of each pass waits where it starts. */
        cr_assert_eq(ahead.whole + ahead.started, serial.whole, "recompute %d", recompute);
        cr_assert_leq(ahead.whole, 2, "recompute %d: %d gathers not started ahead", recompute,
                      ahead.whole);
        /* Most overlap a contraction (a layer's matmul runs while the next weight arrives). */
        cr_assert_geq(ahead.overlapped * 2, ahead.started, "recompute %d: %d of %d", recompute,
                      ahead.overlapped, ahead.started);
    }
}
