/* Sharded training computes what one device computes.
 *
 * The model is linear regression, loss = mean((x . w + b - y)^2) with x [Batch, Feature] and
 * y [Batch]. Sharding labels x and y "Batch@X"; the trainer then splits every batch over the mesh,
 * all-reduces the loss and the gradients, and must agree with the same model, unsharded, on one
 * device: loss and gradients of one batch, and parameters after 20 SGD steps (also on a 2-D mesh,
 * and with AdamW and clipping). Also: gathered outputs, bitwise repeatability on one mesh, the
 * uneven split, and every error of trainer_new and step. */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshwit.h"
#include "tests/common/rng.h"

#define FEATURES 16
#define STEPS 20
#define LR 0.1f

/* Agreement of sharded and single-device numbers: |got - ref| <= TOL * max(1, |ref|).
 *
 * Both compute every value in f32 from the same data; only the order of the batch sums differs
 * (each device sums its rows, then the partial sums are added). Reassociating a sum of n terms
 * changes it by at most ~n * u * sum|terms| (u = 2^-24), but rounding errors have random signs,
 * so the difference grows like sqrt(n) * u * sum|terms|: for the mean over n = 8192 rows of terms
 * of order one, 90 * 6e-8 = 5e-6. The bar, 1e-5 absolute on weights of order one, is
 * twice that and holds for the loss, the gradients and the weights after 20 steps (SGD on a
 * convex quadratic with a stable step contracts earlier differences instead of amplifying them).
 * The same bound holds between the single-device result and the double-precision host
 * reference. The largest difference measured here is under a tenth of the bound. */
#define TOL 1e-5

typedef struct dataset {
    int64_t rows;
    float *x; /* rows x FEATURES */
    float *y; /* rows */
} dataset;

typedef struct model {
    mw_graph *g;
    mw_tensor *loss;
    mw_tensor *pred; /* x . w + b, f32[Batch] (Batch@X when sharded) */
    mw_mesh *mesh;
    mw_trainer *tr;
} model;

/* How a model is traced and trained. */
typedef struct setup {
    const char *devices;    /* a device spec, optionally "/" and mesh axes: "cpu:4/Host=2,X=2" */
    const char *shard_over; /* mesh axis that x and y are sharded over; NULL: unsharded */
    int unreduced_loss;     /* leave the loss f32[Batch] (for the non-scalar error) */
    int with_output;        /* configure pred as an output */
    mw_optimizer optimizer; /* lr 0: SGD with LR */
} setup;

/* What one trainer computes: loss and gradients at the initial parameters, then the
 * parameters after STEPS steps. */
typedef struct outcome {
    float loss, grad_w[FEATURES], grad_b;
    float w[FEATURES], b;
    float grad_norm; /* mw_trainer_grad_norm after the last step */
} outcome;

/* y = x . w_true + 0.5 + noise, x uniform in [-1, 1). */
static dataset make_data(int64_t rows) {
    uint64_t rng = 0xC0FFEE + (uint64_t)rows;
    dataset d = {rows, malloc(sizeof(float) * (size_t)(rows * FEATURES)),
                 malloc(sizeof(float) * (size_t)rows)};
    cr_assert(d.x && d.y);
    float w_true[FEATURES];
    for (int f = 0; f < FEATURES; f++) w_true[f] = (float)(1.5 * rng_uniform(&rng));
    for (int64_t i = 0; i < rows; i++) {
        double t = 0.5 + 0.1 * rng_uniform(&rng);
        for (int f = 0; f < FEATURES; f++) {
            d.x[i * FEATURES + f] = (float)rng_uniform(&rng);
            t += (double)w_true[f] * d.x[i * FEATURES + f];
        }
        d.y[i] = (float)t;
    }
    return d;
}

static void free_data(dataset *d) {
    free(d->x);
    free(d->y);
}

static int set_feeds(const dataset *d, mw_feed feeds[2]) {
    feeds[0] = (mw_feed){"features", d->x, d->rows * FEATURES};
    feeds[1] = (mw_feed){"targets", d->y, d->rows};
    return 2;
}

/* Traces the model with `rows` rows; shards x and y over mesh axis `shard_over` unless NULL.
 * `scalar_loss` = 0 leaves the loss unreduced (for the non-scalar error). */
static void trace(model *m, int64_t rows, const setup *su) {
    cr_assert_eq(mw_graph_new(&m->g), MW_OK, "%s", mw_last_error());
    mw_graph *g = m->g;
    mw_tensor *x = mw_input(g, "features", MW_F32, MW_AXES({"Batch", rows}, {"Feature", FEATURES}));
    mw_tensor *y = mw_input(g, "targets", MW_F32, MW_AXES({"Batch", rows}));
    if (su->shard_over) {
        x = mw_shard(g, x, "Batch", su->shard_over);
        y = mw_shard(g, y, "Batch", su->shard_over);
    }
    mw_tensor *w = mw_param(g, "weights", MW_AXES({"Feature", FEATURES}), MW_INIT_NORMAL(0.5f));
    mw_tensor *b = mw_param(g, "bias", MW_SCALAR, MW_INIT_NORMAL(0.5f));
    m->pred = mw_add(g, mw_dot(g, x, w, "Feature"), b);
    mw_tensor *err = mw_sub(g, m->pred, y);
    mw_tensor *sq = mw_mul(g, err, err);
    m->loss = su->unreduced_loss ? sq : mw_mean(g, sq, NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
}

/* Makes the mesh and tries to make the trainer; returns mw_trainer_new's status. */
static mw_status try_open(model *m, int64_t rows, const setup *su) {
    memset(m, 0, sizeof *m);
    trace(m, rows, su);
    char spec[64];
    snprintf(spec, sizeof spec, "%s", su->devices);
    char *axes = strchr(spec, '/');
    if (axes) *axes++ = '\0';
    cr_assert_eq(mw_mesh_new(spec, axes ? axes : "X", &m->mesh), MW_OK, "%s", mw_last_error());
    mw_trainer_config cfg = {.optimizer = su->optimizer};
    if (cfg.optimizer.lr == 0) cfg.optimizer = (mw_optimizer){.kind = MW_SGD, .lr = LR};
    if (su->with_output) {
        cfg.outputs = &m->pred;
        cfg.noutputs = 1;
    }
    return mw_trainer_new(m->g, m->loss, m->mesh, &cfg, &m->tr);
}

static void open_setup(model *m, int64_t rows, const setup *su) {
    mw_status st = try_open(m, rows, su);
    cr_assert_eq(st, MW_OK, "trainer on %s, %lld rows: %s: %s", su->devices, (long long)rows,
                 mw_status_name(st), mw_last_error());
}

static void open_model(model *m, int64_t rows, const char *devices, const char *shard_over) {
    open_setup(m, rows, &(setup){.devices = devices, .shard_over = shard_over});
}

static void close_model(model *m) {
    mw_trainer_free(m->tr);
    mw_mesh_free(m->mesh);
    mw_graph_free(m->g);
}

static void read_params(mw_trainer *tr, float w[FEATURES], float *b) {
    cr_assert_eq(mw_trainer_read_param(tr, "weights", w, FEATURES), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_param(tr, "bias", b, 1), MW_OK, "%s", mw_last_error());
}

static float step(mw_trainer *tr, const dataset *d) {
    mw_feed feeds[2];
    float loss = NAN;
    mw_status st = mw_trainer_step(tr, feeds, set_feeds(d, feeds), &loss);
    cr_assert_eq(st, MW_OK, "step: %s: %s", mw_status_name(st), mw_last_error());
    return loss;
}

static outcome run_setup(const dataset *d, const setup *su) {
    model m;
    outcome o;
    open_setup(&m, d->rows, su);
    mw_feed feeds[2];
    int n = set_feeds(d, feeds);
    cr_assert_eq(mw_trainer_compute_grads(m.tr, feeds, n, &o.loss), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_grad(m.tr, "weights", o.grad_w, FEATURES), MW_OK, "%s",
                 mw_last_error());
    cr_assert_eq(mw_trainer_read_grad(m.tr, "bias", &o.grad_b, 1), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_steps(m.tr), 0, "compute_grads does not count as a step");
    for (int s = 0; s < STEPS; s++) step(m.tr, d);
    cr_assert_eq(mw_trainer_steps(m.tr), STEPS);
    read_params(m.tr, o.w, &o.b);
    o.grad_norm = mw_trainer_grad_norm(m.tr);
    close_model(&m);
    return o;
}

static outcome run(const dataset *d, const char *devices, const char *shard_over) {
    return run_setup(d, &(setup){.devices = devices, .shard_over = shard_over});
}

static void assert_close(double got, double ref, const char *what, const char *where) {
    cr_assert_leq(fabs(got - ref), TOL * fmax(1.0, fabs(ref)), "%s (%s): %.9g vs reference %.9g",
                  what, where, got, ref);
}

static void assert_outcomes_close(const outcome *got, const outcome *ref, const char *where) {
    assert_close(got->loss, ref->loss, "loss", where);
    assert_close(got->grad_b, ref->grad_b, "d loss / d bias", where);
    assert_close(got->b, ref->b, "bias after 20 steps", where);
    for (int f = 0; f < FEATURES; f++) {
        assert_close(got->grad_w[f], ref->grad_w[f], "d loss / d weights", where);
        assert_close(got->w[f], ref->w[f], "weights after 20 steps", where);
    }
}

/* The loss and gradients at the initial parameters, in double on the host. */
static void reference_grads(const dataset *d, const float w[FEATURES], float b, outcome *ref) {
    double loss = 0, gw[FEATURES] = {0}, gb = 0;
    for (int64_t i = 0; i < d->rows; i++) {
        double e = b - (double)d->y[i];
        for (int f = 0; f < FEATURES; f++) e += (double)d->x[i * FEATURES + f] * w[f];
        loss += e * e;
        gb += 2 * e;
        for (int f = 0; f < FEATURES; f++) gw[f] += 2 * e * d->x[i * FEATURES + f];
    }
    ref->loss = (float)(loss / d->rows);
    ref->grad_b = (float)(gb / d->rows);
    for (int f = 0; f < FEATURES; f++) ref->grad_w[f] = (float)(gw[f] / d->rows);
}

/* The single-device run against the host reference, then every mesh size against it. */
static void check_rows(int64_t rows, const int *device_counts, int ncounts) {
    dataset d = make_data(rows);
    outcome single = run(&d, "cpu:1", NULL);

    model m;
    outcome ref;
    open_model(&m, rows, "cpu:1", NULL);
    read_params(m.tr, ref.w, &ref.b);
    close_model(&m);
    reference_grads(&d, ref.w, ref.b, &ref);
    char where[64];
    snprintf(where, sizeof where, "cpu:1, %lld rows, against double", (long long)rows);
    assert_close(single.loss, ref.loss, "loss", where);
    assert_close(single.grad_b, ref.grad_b, "d loss / d bias", where);
    for (int f = 0; f < FEATURES; f++)
        assert_close(single.grad_w[f], ref.grad_w[f], "d loss / d weights", where);

    for (int i = 0; i < ncounts; i++) {
        char devices[16];
        snprintf(devices, sizeof devices, "cpu:%d", device_counts[i]);
        snprintf(where, sizeof where, "%s sharded, %lld rows", devices, (long long)rows);
        outcome sharded = run(&d, devices, "X");
        assert_outcomes_close(&sharded, &single, where);
    }
    free_data(&d);
}

static const int meshes[] = {2, 3, 4};
#define NMESHES ((int)(sizeof meshes / sizeof *meshes))

TestSuite(sharded, .description = "sharded over cpu:N equals one device", .timeout = 120);

Test(sharded, rows_8192) { check_rows(8192, meshes, NMESHES); }
Test(sharded, rows_8191_uneven) { check_rows(8191, meshes, NMESHES); }
Test(sharded, rows_7) { check_rows(7, meshes, NMESHES); }

Test(sharded, one_row_per_device) {
    for (int i = 0; i < NMESHES; i++) check_rows(meshes[i], &meshes[i], 1);
}

/* On a 2 x 2 mesh, the batch split over one axis is replicated along the other: the gradients
 * are summed over the split axis only. */
Test(sharded, two_axis_mesh) {
    dataset d = make_data(1001);
    outcome single = run(&d, "cpu:1", NULL);
    outcome over_x = run(&d, "cpu:4/Host=2,X=2", "X");
    assert_outcomes_close(&over_x, &single, "cpu:4 as Host=2,X=2, sharded over X");
    outcome over_host = run(&d, "cpu:4/Host=2,X=2", "Host");
    assert_outcomes_close(&over_host, &single, "cpu:4 as Host=2,X=2, sharded over Host");

    model m;
    open_model(&m, d.rows, "cpu:4/Host=2,X=2", "X");
    const int64_t rows_on[4] = {501, 500, 501, 500}; /* the last mesh axis varies fastest */
    for (int i = 0; i < 4; i++)
        cr_assert_eq(mw_trainer_local_size(m.tr, i, "Batch"), rows_on[i], "device %d", i);
    close_model(&m);
    free_data(&d);
}

/* Nothing sharded on two devices: each replica computes the whole batch, and the gradient is
 * already complete on each (it must not be summed over the replicas). */
Test(sharded, replicated_batch_on_two_devices) {
    dataset d = make_data(257);
    outcome single = run(&d, "cpu:1", NULL);
    outcome replicated = run(&d, "cpu:2", NULL);
    assert_outcomes_close(&replicated, &single, "cpu:2, nothing sharded");
    free_data(&d);
}

/* The same mesh, the same data: the same bits, step after step. */
Test(sharded, bitwise_repeatable) {
    dataset d = make_data(8191);
    model a, b;
    open_model(&a, d.rows, "cpu:3", "X");
    open_model(&b, d.rows, "cpu:3", "X");
    for (int s = 0; s < 5; s++) {
        float la = step(a.tr, &d), lb = step(b.tr, &d);
        cr_assert_eq(memcmp(&la, &lb, sizeof la), 0, "step %d: loss %.9g vs %.9g", s, la, lb);
    }
    float wa[FEATURES], wb[FEATURES], ba, bb;
    read_params(a.tr, wa, &ba);
    read_params(b.tr, wb, &bb);
    cr_assert_arr_eq(wa, wb, sizeof wa);
    cr_assert_eq(memcmp(&ba, &bb, sizeof ba), 0);
    cr_assert_eq(mw_trainer_read_grad(a.tr, "weights", wa, FEATURES), MW_OK);
    cr_assert_eq(mw_trainer_read_grad(b.tr, "weights", wb, FEATURES), MW_OK);
    cr_assert_arr_eq(wa, wb, sizeof wa, "gradients of the last step");
    close_model(&a);
    close_model(&b);
    free_data(&d);
}

/* compute_grads, eval and step see the same loss at the same parameters, and step then applies
 * p -= lr * grad (to within the rounding of that one update). */
Test(sharded, step_is_compute_grads_then_sgd) {
    dataset d = make_data(1001);
    model m;
    open_model(&m, d.rows, "cpu:2", "X");
    mw_feed feeds[2];
    int n = set_feeds(&d, feeds);
    float l_grads, l_eval, w0[FEATURES], g[FEATURES], w1[FEATURES], b0, gb, b1;
    read_params(m.tr, w0, &b0);
    cr_assert_eq(mw_trainer_compute_grads(m.tr, feeds, n, &l_grads), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_grad(m.tr, "weights", g, FEATURES), MW_OK);
    cr_assert_eq(mw_trainer_read_grad(m.tr, "bias", &gb, 1), MW_OK);
    cr_assert_eq(mw_trainer_eval(m.tr, feeds, n, &l_eval), MW_OK, "%s", mw_last_error());
    float l_step = step(m.tr, &d);
    cr_assert_eq(l_grads, l_eval, "the same forward pass: %.9g vs %.9g", l_grads, l_eval);
    cr_assert_eq(l_step, l_grads, "step reports the loss before the update");
    read_params(m.tr, w1, &b1);
    for (int f = 0; f < FEATURES; f++) {
        float expect = w0[f] - LR * g[f];
        cr_assert_leq(fabsf(w1[f] - expect), 2 * FLT_EPSILON * (fabsf(w0[f]) + fabsf(LR * g[f])),
                      "weights[%d]: %.9g, expected %.9g", f, w1[f], expect);
    }
    cr_assert_leq(fabsf(b1 - (b0 - LR * gb)), 2 * FLT_EPSILON * (fabsf(b0) + fabsf(LR * gb)));
    cr_assert_eq(mw_trainer_steps(m.tr), 1);
    close_model(&m);
    free_data(&d);
}

/* Shards differ by at most one row; the unsharded axis is whole on every device. */
static void check_split(int64_t rows, const char *devices, const int64_t *expected, int ndev) {
    model m;
    open_model(&m, rows, devices, "X");
    cr_assert_eq(mw_trainer_devices(m.tr), ndev);
    int64_t total = 0;
    for (int i = 0; i < ndev; i++) {
        int64_t local = mw_trainer_local_size(m.tr, i, "Batch");
        cr_assert_eq(local, expected[i], "%s, %lld rows: device %d holds %lld rows, expected %lld",
                     devices, (long long)rows, i, (long long)local, (long long)expected[i]);
        cr_assert_eq(mw_trainer_local_size(m.tr, i, "Feature"), FEATURES);
        total += local;
    }
    cr_assert_eq(total, rows, "nothing padded or dropped");
    cr_assert_eq(mw_trainer_local_size(m.tr, 0, "Hidden"), -1);
    cr_assert_eq(mw_trainer_local_size(m.tr, -1, "Batch"), -1);
    cr_assert_eq(mw_trainer_local_size(m.tr, ndev, "Batch"), -1);
    close_model(&m);
}

Test(sharded, uneven_split) {
    check_split(8191, "cpu:2", (const int64_t[]){4096, 4095}, 2);
    check_split(8191, "cpu:3", (const int64_t[]){2731, 2730, 2730}, 3);
    check_split(7, "cpu:4", (const int64_t[]){2, 2, 2, 1}, 4);
    check_split(8192, "cpu:4", (const int64_t[]){2048, 2048, 2048, 2048}, 4);

    model m;
    open_model(&m, 8191, "cpu:2", NULL);
    cr_assert_eq(mw_trainer_local_size(m.tr, 1, "Batch"), 8191, "not sharded: the full size");
    close_model(&m);
}

/* AdamW with gradient clipping: the update is no longer linear in the gradient, and the clipping
 * needs the global gradient norm, which must be the same on every replica and on one device. */
Test(sharded, adamw_with_clipping) {
    const mw_optimizer adamw = {.kind = MW_ADAMW,
                                .lr = 0.01f,
                                .beta1 = 0.9f,
                                .beta2 = 0.95f,
                                .eps = 1e-8f,
                                .grad_clip = 0.5f};
    dataset d = make_data(8191);
    outcome single =
        run_setup(&d, &(setup){.devices = "cpu:1", .shard_over = NULL, .optimizer = adamw});
    cr_assert_gt(single.grad_norm, 0.5f, "the clipping is active (norm %g)", single.grad_norm);
    for (int i = 0; i < NMESHES; i++) {
        char devices[16], where[64];
        snprintf(devices, sizeof devices, "cpu:%d", meshes[i]);
        snprintf(where, sizeof where, "AdamW on %s sharded", devices);
        outcome sharded =
            run_setup(&d, &(setup){.devices = devices, .shard_over = "X", .optimizer = adamw});
        assert_outcomes_close(&sharded, &single, where);
        assert_close(sharded.grad_norm, single.grad_norm, "gradient norm", where);
    }
    free_data(&d);
}

/* A sharded output is gathered from every device: the whole prediction, row by row, equals the
 * host's x . w + b (a 16-term f32 dot product: error <= 16 u sum|terms|, well inside TOL). */
Test(sharded, outputs_are_gathered) {
    dataset d = make_data(8191);
    static float pred[8191];
    float w[FEATURES], b, loss;
    for (int i = 0; i < NMESHES; i++) {
        char devices[16];
        snprintf(devices, sizeof devices, "cpu:%d", meshes[i]);
        model m;
        open_setup(&m, d.rows, &(setup){.devices = devices, .shard_over = "X", .with_output = 1});
        mw_feed feeds[2];
        cr_assert_eq(mw_trainer_eval(m.tr, feeds, set_feeds(&d, feeds), &loss), MW_OK, "%s",
                     mw_last_error());
        cr_assert_eq(mw_trainer_read_output(m.tr, m.pred, pred, d.rows), MW_OK, "%s",
                     mw_last_error());
        read_params(m.tr, w, &b);
        for (int64_t r = 0; r < d.rows; r++) {
            double ref = b;
            for (int f = 0; f < FEATURES; f++) ref += (double)d.x[r * FEATURES + f] * w[f];
            cr_assert_leq(fabs(pred[r] - ref), TOL * fmax(1.0, fabs(ref)),
                          "%s: row %lld: %.9g vs %.9g", devices, (long long)r, pred[r], ref);
        }
        cr_assert_eq(mw_trainer_read_output(m.tr, m.pred, pred, d.rows - 1), MW_ERR_SHAPE);
        cr_assert_eq(mw_trainer_read_output(m.tr, m.loss, &loss, 1), MW_ERR_NOT_FOUND,
                     "the loss was not configured as an output");
        close_model(&m);
    }
    free_data(&d);
}

/* --- errors ----------------------------------------------------------------------------------- */

TestSuite(trainer_errors, .description = "errors of trainer_new and step", .timeout = 60);

static void expect_message(const char *const *needles) {
    for (const char *const *n = needles; *n; n++)
        cr_assert_not_null(strstr(mw_last_error(), *n), "message \"%s\" does not name \"%s\"",
                           mw_last_error(), *n);
}
#define EXPECT_MESSAGE(...) expect_message((const char *const[]){__VA_ARGS__, NULL})

static void expect_open_fails(int64_t rows, const setup *su, mw_status code) {
    model m;
    mw_status st = try_open(&m, rows, su);
    cr_assert_eq(st, code, "expected %s, got %s: %s", mw_status_name(code), mw_status_name(st),
                 mw_last_error());
    cr_assert_null(m.tr);
    close_model(&m);
}

Test(trainer_errors, shard_over_a_mesh_axis_the_mesh_lacks) {
    expect_open_fails(64, &(setup){.devices = "cpu:2", .shard_over = "Y"}, MW_ERR_SHARDING);
    EXPECT_MESSAGE("Y", "X -> 2");
    expect_open_fails(64, &(setup){.devices = "cpu:2", .shard_over = "Model"}, MW_ERR_SHARDING);
    EXPECT_MESSAGE("Model", "X -> 2");
}

Test(trainer_errors, more_devices_than_rows) {
    expect_open_fails(3, &(setup){.devices = "cpu:4", .shard_over = "X"}, MW_ERR_SHARDING);
    EXPECT_MESSAGE("Batch", "3", "4");
}

Test(trainer_errors, loss_not_a_scalar) {
    expect_open_fails(8, &(setup){.devices = "cpu:1", .shard_over = NULL, .unreduced_loss = 1},
                      MW_ERR_SHAPE);
    EXPECT_MESSAGE("Batch=8");
    expect_open_fails(8, &(setup){.devices = "cpu:2", .shard_over = "X", .unreduced_loss = 1},
                      MW_ERR_SHAPE);
    EXPECT_MESSAGE("Batch@X=8");
}

/* A step with bad feeds fails with MW_ERR_INVALID naming the input, changes nothing, and the
 * trainer then steps exactly like one that never failed. */
Test(trainer_errors, bad_feeds_then_recovery) {
    dataset d = make_data(101);
    model m, clean;
    open_model(&m, d.rows, "cpu:2", "X");
    open_model(&clean, d.rows, "cpu:2", "X");
    float w0[FEATURES], b0, w[FEATURES], b, loss = -1.0f;

    struct {
        mw_feed feeds[3];
        int n;
        const char *needle;
    } bad[] = {
        {{{"features", d.x, d.rows * FEATURES}}, 1, "targets"},
        {{{"features", d.x, d.rows * FEATURES}, {"targets", d.y, d.rows}, {"labels", d.y, d.rows}},
         3,
         "labels"},
        {{{"features", d.x, d.rows * FEATURES}, {"targets", d.y, d.rows - 1}}, 2, "targets"},
        {{{"features", d.x, d.rows * FEATURES + 1}, {"targets", d.y, d.rows}}, 2, "features"},
        {{{"features", d.x, d.rows * FEATURES}, {"targets", NULL, d.rows}}, 2, "targets"},
        {{{"features", d.x, d.rows * FEATURES}, {"targets", d.y, d.rows}, {"targets", d.y, d.rows}},
         3,
         "targets"},
    };
    step(m.tr, &d);
    step(clean.tr, &d);
    read_params(m.tr, w0, &b0);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        mw_status st = mw_trainer_step(m.tr, bad[i].feeds, bad[i].n, &loss);
        cr_assert_eq(st, MW_ERR_INVALID, "bad feed %zu: %s: %s", i, mw_status_name(st),
                     mw_last_error());
        EXPECT_MESSAGE(bad[i].needle);
        cr_assert_eq(mw_trainer_eval(m.tr, bad[i].feeds, bad[i].n, &loss), MW_ERR_INVALID);
        cr_assert_eq(mw_trainer_compute_grads(m.tr, bad[i].feeds, bad[i].n, &loss), MW_ERR_INVALID);
    }
    cr_assert_eq(mw_trainer_steps(m.tr), 1, "failed steps are not counted");
    read_params(m.tr, w, &b);
    cr_assert_arr_eq(w, w0, sizeof w, "a failed step changes no parameter");
    cr_assert_eq(b, b0);

    for (int s = 0; s < 3; s++) {
        float la = step(m.tr, &d), lb = step(clean.tr, &d);
        cr_assert_eq(la, lb, "after the failures, step %d: %.9g vs %.9g", s, la, lb);
    }
    float wc[FEATURES], bc;
    read_params(m.tr, w, &b);
    read_params(clean.tr, wc, &bc);
    cr_assert_arr_eq(w, wc, sizeof w);
    cr_assert_eq(b, bc);
    close_model(&m);
    close_model(&clean);
    free_data(&d);
}

Test(trainer_errors, unknown_or_misfit_parameters) {
    model m;
    open_model(&m, 16, "cpu:2", "X");
    float buf[FEATURES + 1] = {0};
    cr_assert_eq(mw_trainer_read_param(m.tr, "weight", buf, FEATURES), MW_ERR_NOT_FOUND);
    EXPECT_MESSAGE("weight");
    cr_assert_eq(mw_trainer_read_grad(m.tr, "gain", buf, 1), MW_ERR_NOT_FOUND);
    EXPECT_MESSAGE("gain");
    cr_assert_eq(mw_trainer_write_param(m.tr, "features", buf, FEATURES), MW_ERR_NOT_FOUND,
                 "an input is not a parameter");
    EXPECT_MESSAGE("features");
    cr_assert_eq(mw_trainer_read_param(m.tr, "weights", buf, FEATURES + 1), MW_ERR_SHAPE);
    EXPECT_MESSAGE("weights");
    cr_assert_eq(mw_trainer_write_param(m.tr, "bias", buf, 2), MW_ERR_SHAPE);
    EXPECT_MESSAGE("bias");
    close_model(&m);
}
