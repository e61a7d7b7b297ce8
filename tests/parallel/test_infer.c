/* Inference programs: forward-only, no labels fed, any number of rows (chunked and padded), on a
 * sharded mesh, with a trainer's parameters read in place or with weights loaded from a file;
 * every prediction checked against the host's x . w + b. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meshwit.h"

#define FEATURES 3
#define CLASSES 4
#define ROWS 37 /* predicted in one call; not a multiple of any traced batch below */

typedef struct clf {
    mw_graph *g;
    mw_tensor *logits, *loss;
} clf;

/* logits [Batch, Class] = x . w + b; loss = mean cross-entropy against y (i32). */
static void clf_build(clf *c, int64_t batch, int sharded) {
    cr_assert_eq(mw_graph_new(&c->g), MW_OK);
    mw_graph *g = c->g;
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", batch}, {"Feature", FEATURES}));
    mw_tensor *y = mw_input(g, "y", MW_I32, MW_AXES({"Batch", batch}));
    if (sharded) {
        x = mw_shard(g, x, "Batch", "X");
        y = mw_shard(g, y, "Batch", "X");
    }
    mw_tensor *w =
        mw_param(g, "w", MW_AXES({"Feature", FEATURES}, {"Class", CLASSES}), MW_INIT_NORMAL(0.5f));
    mw_tensor *b = mw_param(g, "b", MW_AXES({"Class", CLASSES}), MW_INIT_NORMAL(0.5f));
    c->logits = mw_add(g, mw_dot(g, x, w, "Feature"), b);
    c->loss = mw_mean(g, mw_cross_entropy(g, c->logits, y, "Class", 0), NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
}

static void data(float *x, int32_t *y, int64_t rows) {
    for (int64_t r = 0; r < rows; r++) {
        for (int f = 0; f < FEATURES; f++) x[r * FEATURES + f] = sinf((float)(r * FEATURES + f));
        y[r] = (int32_t)(r % CLASSES);
    }
}

/* Every predicted logit equals x . w + b from the parameters read back (a 3-term dot product
 * plus a bias in f32: within a few ulp of values of order 1). */
static void check(const float *x, const float *pred, int64_t rows, const float *w, const float *b) {
    for (int64_t r = 0; r < rows; r++)
        for (int k = 0; k < CLASSES; k++) {
            double ref = b[k];
            for (int f = 0; f < FEATURES; f++)
                ref += (double)x[r * FEATURES + f] * w[f * CLASSES + k];
            cr_assert(fabs(pred[r * CLASSES + k] - ref) <= 1e-5 * (1 + fabs(ref)),
                      "row %lld class %d: %.9g vs %.9g", (long long)r, k, pred[r * CLASSES + k],
                      ref);
        }
}

Test(infer, from_trainer_any_rows_sharded_no_labels) {
    clf c;
    clf_build(&c, 8, 1);
    mw_mesh *mesh;
    cr_assert_eq(mw_mesh_new("cpu:2", "X", &mesh), MW_OK);
    mw_trainer *tr;
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.5f}};
    cr_assert_eq(mw_trainer_new(c.g, c.loss, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());
    float xt[8 * FEATURES];
    int32_t yt[8];
    data(xt, yt, 8);
    mw_feed train[2] = {{"x", xt, 8 * FEATURES}, {"y", yt, 8}};
    cr_assert_eq(mw_trainer_step(tr, train, 2, NULL), MW_OK);

    mw_infer *inf;
    mw_infer_config ic = {.outputs = &c.logits, .noutputs = 1};
    cr_assert_eq(mw_infer_from_trainer(tr, c.g, &ic, &inf), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_infer_chunk_rows(inf), 8);
    static float x[ROWS * FEATURES], pred[ROWS * CLASSES];
    static int32_t y[ROWS];
    data(x, y, ROWS);
    mw_feed feed = {"x", x, ROWS * FEATURES}; /* no labels */
    mw_fetch fetch = {c.logits, pred, ROWS * CLASSES};
    cr_assert_eq(mw_infer_run(inf, &feed, 1, ROWS, &fetch, 1), MW_OK, "%s", mw_last_error());
    float w[FEATURES * CLASSES], b[CLASSES];
    cr_assert_eq(mw_trainer_read_param(tr, "w", w, FEATURES * CLASSES), MW_OK);
    cr_assert_eq(mw_trainer_read_param(tr, "b", b, CLASSES), MW_OK);
    check(x, pred, ROWS, w, b);
    /* Both devices on the calling thread: the same bits. */
    mw_infer *one;
    static float pred1[ROWS * CLASSES];
    ic.cpu_threads = MW_CPU_THREADS_ONE;
    cr_assert_eq(mw_infer_from_trainer(tr, c.g, &ic, &one), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_infer_run(one, &feed, 1, ROWS, &(mw_fetch){c.logits, pred1, ROWS * CLASSES}, 1),
                 MW_OK, "%s", mw_last_error());
    cr_assert(memcmp(pred, pred1, sizeof pred) == 0, "one thread predicts other bits");
    mw_infer_free(one);

    /* The parameters are the trainer's own: the next step is seen without any copy. */
    cr_assert_eq(mw_trainer_step(tr, train, 2, NULL), MW_OK);
    float w2[FEATURES * CLASSES];
    cr_assert_eq(mw_trainer_read_param(tr, "w", w2, FEATURES * CLASSES), MW_OK);
    cr_assert(memcmp(w, w2, sizeof w) != 0, "the step changed w");
    cr_assert_eq(mw_trainer_read_param(tr, "b", b, CLASSES), MW_OK);
    mw_feed three = {"x", x, 3 * FEATURES};
    cr_assert_eq(mw_infer_run(inf, &three, 1, 3, &(mw_fetch){c.logits, pred, 3 * CLASSES}, 1),
                 MW_OK, "%s", mw_last_error());
    check(x, pred, 3, w2, b);

    /* Errors: a fetch that is not an output, a missing input, wrong sizes. */
    cr_assert_eq(mw_infer_run(inf, &feed, 1, ROWS, &(mw_fetch){c.loss, pred, 1}, 1),
                 MW_ERR_NOT_FOUND);
    cr_assert_eq(mw_infer_run(inf, NULL, 0, ROWS, &fetch, 1), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "input 'x' is not fed"), "%s", mw_last_error());
    cr_assert_eq(mw_infer_run(inf, &feed, 1, ROWS - 1, &fetch, 1), MW_ERR_INVALID);
    cr_assert_eq(mw_infer_run(inf, &feed, 1, 0, &fetch, 1), MW_ERR_INVALID);
    mw_infer_free(inf);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(c.g);
}

Test(infer, loaded_weights_other_batch_size_and_mesh) {
    /* Train on cpu:2 (batch 8, sharded), save the weights; predict on cpu:1 with a graph traced
     * at batch 5 and the weights loaded from the file, and on cpu:3 sharded from the trainer
     * through a graph traced at batch 6: the same predictions. */
    clf c;
    clf_build(&c, 8, 1);
    mw_mesh *mesh2, *mesh1;
    cr_assert_eq(mw_mesh_new("cpu:2", "X", &mesh2), MW_OK);
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &mesh1), MW_OK);
    mw_trainer *tr;
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.5f}};
    cr_assert_eq(mw_trainer_new(c.g, c.loss, mesh2, &cfg, &tr), MW_OK, "%s", mw_last_error());
    float xt[8 * FEATURES];
    int32_t yt[8];
    data(xt, yt, 8);
    mw_feed train[2] = {{"x", xt, 8 * FEATURES}, {"y", yt, 8}};
    for (int s = 0; s < 3; s++) cr_assert_eq(mw_trainer_step(tr, train, 2, NULL), MW_OK);
    char path[64];
    snprintf(path, sizeof path, "/tmp/mw_infer_%d.safetensors", (int)getpid());
    cr_assert_eq(mw_trainer_save_weights(tr, path, NULL, 0), MW_OK, "%s", mw_last_error());

    clf small;
    clf_build(&small, 5, 0);
    mw_infer *own;
    mw_infer_config ic = {.outputs = &small.logits, .noutputs = 1};
    cr_assert_eq(mw_infer_new(small.g, mesh1, &ic, &own), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_infer_load_weights(own, path, NULL, 0), MW_OK, "%s", mw_last_error());
    remove(path);
    static float x[ROWS * FEATURES], a[ROWS * CLASSES], b6[ROWS * CLASSES];
    static int32_t y[ROWS];
    data(x, y, ROWS);
    mw_feed feed = {"x", x, ROWS * FEATURES};
    cr_assert_eq(mw_infer_run(own, &feed, 1, ROWS, &(mw_fetch){small.logits, a, ROWS * CLASSES}, 1),
                 MW_OK, "%s", mw_last_error());
    float w[FEATURES * CLASSES], b[CLASSES];
    cr_assert_eq(mw_trainer_read_param(tr, "w", w, FEATURES * CLASSES), MW_OK);
    cr_assert_eq(mw_trainer_read_param(tr, "b", b, CLASSES), MW_OK);
    check(x, a, ROWS, w, b);

    clf six;
    clf_build(&six, 6, 1);
    mw_infer *shared;
    ic.outputs = &six.logits;
    cr_assert_eq(mw_infer_from_trainer(tr, six.g, &ic, &shared), MW_OK, "%s", mw_last_error());
    cr_assert_eq(
        mw_infer_run(shared, &feed, 1, ROWS, &(mw_fetch){six.logits, b6, ROWS * CLASSES}, 1), MW_OK,
        "%s", mw_last_error());
    check(x, b6, ROWS, w, b);
    mw_infer_free(shared);
    mw_infer_free(own);

    /* A graph whose parameters differ from the trainer's is refused, naming the parameter. */
    mw_graph *other;
    cr_assert_eq(mw_graph_new(&other), MW_OK);
    mw_tensor *ox = mw_input(other, "x", MW_F32, MW_AXES({"Batch", 4}, {"Feature", FEATURES}));
    mw_tensor *ow =
        mw_param(other, "w", MW_AXES({"Feature", FEATURES}, {"Class", 2}), MW_INIT_ZEROS);
    mw_tensor *ol = mw_dot(other, ox, ow, "Feature");
    ic.outputs = &ol;
    cr_assert_eq(mw_infer_from_trainer(tr, other, &ic, &shared), MW_ERR_SHAPE);
    cr_assert(strstr(mw_last_error(), "parameter 'w'"), "%s", mw_last_error());
    mw_graph_free(other);

    /* The chunk axis must come first. */
    cr_assert_eq(mw_graph_new(&other), MW_OK);
    ox = mw_input(other, "x", MW_F32, MW_AXES({"Feature", FEATURES}, {"Batch", 4}));
    ow = mw_param(other, "w", MW_AXES({"Feature", FEATURES}), MW_INIT_ZEROS);
    ol = mw_dot(other, ox, ow, "Feature");
    ic.outputs = &ol;
    cr_assert_eq(mw_infer_new(other, mesh1, &ic, &shared), MW_ERR_AXIS);
    cr_assert(strstr(mw_last_error(), "not first"), "%s", mw_last_error());
    mw_graph_free(other);

    mw_trainer_free(tr);
    mw_mesh_free(mesh1);
    mw_mesh_free(mesh2);
    mw_graph_free(c.g);
    mw_graph_free(small.g);
    mw_graph_free(six.g);
}

/* Outputs that mix rows would change with the chunking: refused when the program is made,
 * naming the output and how it mixes them. Row-wise outputs beside them are fine. */
Test(infer, outputs_that_mix_rows_are_refused_by_name) {
    clf c;
    clf_build(&c, 8, 0);
    mw_graph *g = c.g;
    mw_mesh *mesh;
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &mesh), MW_OK);
    mw_tensor *mean = mw_mean(g, c.logits, "Batch");
    const struct {
        mw_tensor *out;
        const char *why;
    } bad[] = {
        {mw_sum(g, c.logits, NULL), "without the chunk axis"},
        {mw_sub(g, c.logits, mean), "without the chunk axis"}, /* x - mean over the batch */
        {mw_softmax(g, mw_select(g, c.logits, "Class", 0), "Batch", 1.0f),
         "softmax over the chunk axis"},
    };
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        mw_tensor *outs[2] = {c.logits, bad[i].out};
        mw_infer_config ic = {.outputs = outs, .noutputs = 2};
        mw_infer *inf = (mw_infer *)1;
        cr_assert_eq(mw_infer_new(g, mesh, &ic, &inf), MW_ERR_SHAPE, "case %zu", i);
        cr_assert_null(inf);
        char want[128];
        cr_assert(mw_tensor_describe(bad[i].out, want, sizeof want));
        const char *msg = mw_last_error();
        cr_assert(strstr(msg, "output 1") && strstr(msg, want) && strstr(msg, bad[i].why) &&
                      strstr(msg, "'Batch'"),
                  "case %zu: %s", i, msg);
    }
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

Test(infer, several_outputs_any_subset) {
    /* Outputs: the logits and their argmax. A run fetches any of them. */
    clf c;
    clf_build(&c, 8, 0);
    mw_mesh *mesh;
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &mesh), MW_OK);
    mw_tensor *outs[2] = {c.logits, mw_argmax(c.g, c.logits, "Class")};
    cr_assert_eq(mw_graph_status(c.g), MW_OK, "%s", mw_graph_error(c.g));
    mw_infer *inf;
    mw_infer_config ic = {.outputs = outs, .noutputs = 2};
    cr_assert_eq(mw_infer_new(c.g, mesh, &ic, &inf), MW_OK, "%s", mw_last_error());
    static float x[ROWS * FEATURES], logits[ROWS * CLASSES], arg[ROWS];
    static int32_t y[ROWS];
    data(x, y, ROWS);
    mw_feed feed = {"x", x, ROWS * FEATURES};
    mw_fetch both[2] = {{outs[1], arg, ROWS}, {outs[0], logits, ROWS * CLASSES}};
    cr_assert_eq(mw_infer_run(inf, &feed, 1, ROWS, both, 2), MW_OK, "%s", mw_last_error());
    for (int r = 0; r < ROWS; r++) {
        int best = 0;
        for (int k = 1; k < CLASSES; k++)
            if (logits[r * CLASSES + k] > logits[r * CLASSES + best]) best = k;
        cr_assert_eq(arg[r], (float)best, "row %d", r);
    }
    mw_infer_free(inf);
    mw_mesh_free(mesh);
    mw_graph_free(c.g);
}
