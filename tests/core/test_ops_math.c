/* The math ops (core/ops_math.c): values against the C library in double, gradients against central
 * finite differences, argmax, concatenation, and dropout's mask, which must not depend on how
 * the tensor is sharded.
 *
 * Gradient checks: tests/common/fd_grad.h's, L = sum(out * r) with r fixed random weights in
 * [-1, 1), within its FD_ATOL + FD_RTOL |numeric| = 1e-3 + 1e-3 |numeric| (derived there: the f32
 * rounding of L divided by 2h, and the truncation h^2/6 |f'''|, at most ~2e-4 here: |f'''| < 8
 * for these functions on these ranges), both losses of each difference from the training pass
 * (so dropout draws the same mask). Parameters are set away from kinks (|x| >= 0.1 for relu and
 * abs, x >= 0.5 for log and sqrt), so the difference never straddles one; a wrong gradient is off
 * by O(0.1). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "devices/cpu/cpu.h"
#include "devices/device.h"
#include "devices/math.h"
#include "meshwit.h"
#include "tests/common/fd_grad.h"
#include "tests/common/rng.h"

#define N 12

typedef mw_tensor *(*build_fn)(mw_graph *g, mw_tensor *a, mw_tensor *b);

/* Parameters a and b ([Row=3, Col=4]) at va, vb; out = f(a, b), its values read into c->out;
 * with finite_differences, both parameters' gradients checked. r is drawn from seed 99. */
static void run_case(fd_case *c, build_fn f, const float *va, const float *vb,
                     int finite_differences) {
    fd_begin(c, 99);
    c->train_pass = 1;
    c->read_out = 1;
    mw_tensor *a = fd_param_values(c, "a", MW_AXES({"Row", 3}, {"Col", 4}), va);
    mw_tensor *b = fd_param_values(c, "b", MW_AXES({"Row", 3}, {"Col", 4}), vb);
    fd_run(c, f(c->g, a, b), finite_differences);
}

/* Values in [lo, hi), kept at least `gap` from 0. */
static void values(float *v, double lo, double hi, double gap, uint64_t seed) {
    for (int i = 0; i < N; i++) {
        double x = rng_range(rng_splitmix64(&seed), lo, hi);
        if (fabs(x) < gap) x = x < 0 ? -gap : gap;
        v[i] = (float)x;
    }
}

/* f(a) * b: b makes every output's gradient depend on its own factor. */
#define TIMES_B(fn)                                                                                \
    static mw_tensor *f_##fn(mw_graph *g, mw_tensor *a, mw_tensor *b) {                            \
        return mw_mul(g, mw_##fn(g, a), b);                                                        \
    }
TIMES_B(relu)
TIMES_B(tanh)
TIMES_B(sigmoid)
TIMES_B(exp)
TIMES_B(log)
TIMES_B(sqrt)
TIMES_B(abs)

typedef struct unary_case {
    const char *name;
    build_fn f;
    double (*ref)(double);
    double lo, hi, gap;
} unary_case;

static double relu_d(double x) { return x > 0 ? x : 0; }
static double sigmoid_d(double x) { return 1 / (1 + exp(-x)); }

static const unary_case unary[] = {
    {"relu", f_relu, relu_d, -1, 1, 0.1},
    {"tanh", f_tanh, tanh, -2, 2, 0},
    {"sigmoid", f_sigmoid, sigmoid_d, -3, 3, 0},
    {"exp", f_exp, exp, -1, 1, 0},
    {"log", f_log, log, 0.5, 2, 0},
    {"sqrt", f_sqrt, sqrt, 0.5, 2, 0},
    {"abs", f_abs, fabs, -1, 1, 0.1},
};

Test(ops_math, activations_values_and_gradients) {
    for (size_t c = 0; c < sizeof unary / sizeof *unary; c++) {
        float va[N], vb[N];
        values(va, unary[c].lo, unary[c].hi, unary[c].gap, 7 + c);
        values(vb, -1, 1, 0, 70 + c);
        fd_case u;
        run_case(&u, unary[c].f, va, vb, 1);
        const float *out = u.out;
        for (int i = 0; i < N; i++) {
            double want = unary[c].ref(va[i]) * vb[i];
            cr_assert(fabs(out[i] - want) <= 4e-7 * (1 + fabs(want)), "%s(%g): %.9g vs %.9g",
                      unary[c].name, va[i], out[i], want);
        }
    }
}

static mw_tensor *f_max(mw_graph *g, mw_tensor *a, mw_tensor *b) { return mw_maximum(g, a, b); }
static mw_tensor *f_min(mw_graph *g, mw_tensor *a, mw_tensor *b) { return mw_minimum(g, a, b); }
static mw_tensor *f_where(mw_graph *g, mw_tensor *a, mw_tensor *b) {
    return mw_where(g, mw_compare(g, a, b, MW_GE), mw_exp(g, a), mw_mul(g, b, b));
}

Test(ops_math, maximum_minimum_where) {
    float va[N], vb[N];
    values(va, -1, 1, 0, 3);
    values(vb, -1, 1, 0, 4);
    for (int i = 0; i < N; i++) /* no tie within reach of h: FD would straddle it */
        if (fabs(va[i] - vb[i]) < 0.05) vb[i] = va[i] + 0.3f;
    build_fn fs[] = {f_max, f_min, f_where};
    for (int c = 0; c < 3; c++) {
        fd_case u;
        run_case(&u, fs[c], va, vb, 1);
        const float *out = u.out;
        for (int i = 0; i < N; i++) {
            double want = c == 0           ? fmax(va[i], vb[i])
                          : c == 1         ? fmin(va[i], vb[i])
                          : va[i] >= vb[i] ? exp(va[i])
                                           : (double)vb[i] * vb[i];
            cr_assert(fabs(out[i] - want) <= 4e-7 * (1 + fabs(want)), "case %d [%d]: %g vs %g", c,
                      i, out[i], want);
        }
    }
    /* A tie: each side gets half the gradient (PyTorch's rule). */
    float same[N];
    memcpy(same, va, sizeof same);
    fd_case u;
    run_case(&u, f_max, va, same, 0);
    const float *ga = u.param[0].grad, *gb = u.param[1].grad;
    const float *r = fd_find(u.input, u.ninputs, "r")->data;
    for (int i = 0; i < N; i++) cr_assert(ga[i] == 0.5f * r[i] && gb[i] == ga[i]);
}

static mw_tensor *f_rmax(mw_graph *g, mw_tensor *a, mw_tensor *b) {
    return mw_max(g, mw_mul(g, a, b), "Col");
}
static mw_tensor *f_concat(mw_graph *g, mw_tensor *a, mw_tensor *b) {
    mw_tensor *bt = mw_contract(g, b, mw_exp(g, b), "Col,Row"); /* b * exp(b), other order */
    mw_tensor *xs[3] = {a, bt, mw_slice(g, a, "Col", 1, 2, NULL)};
    return mw_concat(g, xs, 3, "Col");
}

Test(ops_math, reduce_max_and_concat) {
    float va[N], vb[N];
    values(va, -1, 1, 0, 11);
    values(vb, 0.5, 1.5, 0, 12);
    fd_case u;
    run_case(&u, f_rmax, va, vb, 1);
    const float *out = u.out;
    cr_assert_eq(u.nout, 3);
    for (int r = 0; r < 3; r++) {
        double m = -INFINITY;
        for (int c = 0; c < 4; c++) m = fmax(m, (double)((float)(va[r * 4 + c] * vb[r * 4 + c])));
        cr_assert_eq(out[r], (float)m);
    }

    run_case(&u, f_concat, va, vb, 1);
    cr_assert_eq(u.nout, 3 * 10);
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 10; c++) {
            double want = c < 4   ? va[r * 4 + c]
                          : c < 8 ? vb[r * 4 + c - 4] * exp(vb[r * 4 + c - 4])
                                  : va[r * 4 + c - 8 + 1];
            cr_assert(fabs(out[r * 10 + c] - want) <= 4e-7 * (1 + fabs(want)), "[%d, %d]", r, c);
        }
}

Test(ops_math, argmax_first_of_ties_and_no_gradient) {
    const float va[N] = {1, 3, 3, 2, -1, -5, -0.5f, -0.5f, 0, 0, 0, 7};
    float out[3];
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *a = mw_param(g, "a", MW_AXES({"Row", 3}, {"Col", 4}), MW_INIT_ZEROS);
    mw_tensor *am = mw_argmax(g, a, "Col");
    mw_tensor *loss = mw_sum(g, mw_mul(g, am, mw_sum(g, a, "Col")), NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    mw_mesh *mesh;
    mw_trainer *tr;
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &mesh), MW_OK);
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.0f}, .outputs = &am, .noutputs = 1};
    cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_write_param(tr, "a", va, N), MW_OK);
    cr_assert_eq(mw_trainer_compute_grads(tr, NULL, 0, NULL), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_output(tr, am, out, 3), MW_OK);
    cr_assert(out[0] == 1 && out[1] == 2 && out[2] == 3, "%g %g %g", out[0], out[1], out[2]);
    /* L = sum_r argmax_r * sum_c a[r, c]: dL/da[r, c] = argmax_r, argmax itself being constant. */
    float grad[N];
    cr_assert_eq(mw_trainer_read_grad(tr, "a", grad, N), MW_OK);
    for (int i = 0; i < N; i++) cr_assert_eq(grad[i], out[i / 4]);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

Test(ops_math, errors_name_the_problem) {
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", 4}, {"F", 2}));
    cr_assert_null(mw_max(g, mw_shard(g, x, "Batch", "X"), "Batch"));
    cr_assert_eq(mw_graph_status(g), MW_ERR_SHARDING);
    mw_graph_free(g);
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", 4}, {"F", 2}));
    cr_assert_null(mw_dropout(g, x, 1.0f, 1));
    cr_assert(strstr(mw_graph_error(g), "[0, 1)"), "%s", mw_graph_error(g));
    mw_graph_free(g);
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", 4}, {"F", 2}));
    mw_tensor *y = mw_input(g, "y", MW_F32, MW_AXES({"Batch", 3}, {"F", 2}));
    mw_tensor *xs[2] = {x, y};
    cr_assert_null(mw_concat(g, xs, 2, "F"));
    cr_assert_eq(mw_graph_status(g), MW_ERR_SHAPE);
    cr_assert(strstr(mw_graph_error(g), "tensor 1"), "%s", mw_graph_error(g));
    mw_graph_free(g);
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *ids = mw_input(g, "ids", MW_I32, MW_AXES({"Batch", 4}));
    cr_assert_null(mw_relu(g, ids));
    cr_assert_eq(mw_graph_status(g), MW_ERR_DTYPE);
    mw_graph_free(g);
}

/* --- dropout ---------------------------------------------------------------------------------- */

#define DROWS 37
#define DCOLS 16

typedef struct drop {
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
    mw_tensor *y;
} drop;

/* y = dropout(x * w) with x [Batch@X, Feature] fed, w [Feature] a parameter of ones. */
static void drop_open(drop *d, const char *devices, float p) {
    memset(d, 0, sizeof *d);
    cr_assert_eq(mw_graph_new(&d->g), MW_OK);
    mw_graph *g = d->g;
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", DROWS}, {"Feature", DCOLS}));
    x = mw_shard(g, x, "Batch", "X");
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Feature", DCOLS}), MW_INIT_CONST(1.0f));
    d->y = mw_dropout(g, mw_mul(g, x, w), p, 42);
    mw_tensor *loss = mw_mean(g, mw_mul(g, d->y, d->y), NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    cr_assert_eq(mw_mesh_new(devices, "X", &d->mesh), MW_OK);
    /* lr 0: w stays 1 on both meshes (a sharded update differs in the last bits), so any
     * difference in y is the mask's. */
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.0f}, .outputs = &d->y, .noutputs = 1};
    cr_assert_eq(mw_trainer_new(g, loss, d->mesh, &cfg, &d->tr), MW_OK, "%s", mw_last_error());
}

static void drop_close(drop *d) {
    mw_trainer_free(d->tr);
    mw_mesh_free(d->mesh);
    mw_graph_free(d->g);
}

Test(ops_math, dropout_mask_is_the_same_on_every_sharding) {
    static float x[DROWS * DCOLS], y1[DROWS * DCOLS], y3[DROWS * DCOLS];
    for (int i = 0; i < DROWS * DCOLS; i++) x[i] = 1.0f + (float)(i % 7);
    mw_feed feed = {"x", x, DROWS * DCOLS};
    drop one, three;
    drop_open(&one, "cpu:1", 0.25f);
    drop_open(&three, "cpu:3", 0.25f);
    int dropped = 0, changed = 0;
    static float prev[DROWS * DCOLS];
    for (int step = 0; step < 3; step++) {
        cr_assert_eq(mw_trainer_step(one.tr, &feed, 1, NULL), MW_OK, "%s", mw_last_error());
        cr_assert_eq(mw_trainer_step(three.tr, &feed, 1, NULL), MW_OK, "%s", mw_last_error());
        cr_assert_eq(mw_trainer_read_output(one.tr, one.y, y1, DROWS * DCOLS), MW_OK);
        cr_assert_eq(mw_trainer_read_output(three.tr, three.y, y3, DROWS * DCOLS), MW_OK);
        cr_assert(memcmp(y1, y3, sizeof y1) == 0, "step %d: the sharded mask differs", step);
        for (int i = 0; i < DROWS * DCOLS; i++) {
            dropped += y1[i] == 0.0f;
            if (step) changed += (y1[i] == 0.0f) != (prev[i] == 0.0f);
        }
        memcpy(prev, y1, sizeof prev);
    }
    /* 3 x 592 draws at p = 0.25: 444 expected, standard deviation ~18.2; 5 sigma either way. */
    cr_assert(dropped > 444 - 91 && dropped < 444 + 91, "dropped %d of 1776", dropped);
    cr_assert(changed > 100, "the mask must change from step to step (%d changes)", changed);
    /* Kept elements are scaled by 1 / (1 - p); evaluation is the identity. */
    float w[DCOLS];
    cr_assert_eq(mw_trainer_read_param(one.tr, "w", w, DCOLS), MW_OK);
    for (int i = 0; i < DROWS * DCOLS; i++)
        if (y1[i] != 0.0f) cr_assert_float_eq(y1[i], x[i] * w[i % DCOLS] / 0.75f, 1e-5f);
    cr_assert_eq(mw_trainer_eval(one.tr, &feed, 1, NULL), MW_OK);
    cr_assert_eq(mw_trainer_read_output(one.tr, one.y, y1, DROWS * DCOLS), MW_OK);
    for (int i = 0; i < DROWS * DCOLS; i++) cr_assert_eq(y1[i], x[i] * w[i % DCOLS]);
    drop_close(&one);
    drop_close(&three);
}

/* Two dropouts given one seed draw independent masks: of 4096 elements at p = 0.5, the two
 * agree on about half (2048, standard deviation 32; 6 sigma either way). */
Test(ops_math, two_dropouts_with_one_seed_draw_different_masks) {
    enum { DN = 4096 };
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"DN", DN}));
    mw_tensor *w = mw_param(g, "w", MW_AXES({"DN", DN}), MW_INIT_CONST(1.0f));
    mw_tensor *xw = mw_mul(g, x, w);
    mw_tensor *outs[2] = {mw_dropout(g, xw, 0.5f, 7), mw_dropout(g, xw, 0.5f, 7)};
    mw_tensor *loss = mw_sum(g, mw_add(g, outs[0], outs[1]), NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    mw_mesh *mesh;
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &mesh), MW_OK);
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.0f}, .outputs = outs, .noutputs = 2};
    mw_trainer *tr;
    cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());
    static float ones[DN], a[DN], b[DN];
    for (int i = 0; i < DN; i++) ones[i] = 1.0f;
    mw_feed feed = {"x", ones, DN};
    cr_assert_eq(mw_trainer_step(tr, &feed, 1, NULL), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_output(tr, outs[0], a, DN), MW_OK);
    cr_assert_eq(mw_trainer_read_output(tr, outs[1], b, DN), MW_OK);
    int agree = 0, kept = 0;
    for (int i = 0; i < DN; i++) agree += (a[i] == 0.0f) == (b[i] == 0.0f), kept += a[i] != 0.0f;
    cr_assert(agree > 2048 - 192 && agree < 2048 + 192, "the masks agree on %d of %d", agree, DN);
    cr_assert(kept > 2048 - 192 && kept < 2048 + 192, "kept %d of %d", kept, DN);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

/* The CPU kernel keeps exactly the elements mw__dropout_keep says, also where a row crosses a
 * block of 2^32 elements of a (virtual) huge tensor, and about 1 - p of them. */
Test(ops_math, dropout_kernel_follows_the_mask_across_blocks) {
    enum { R = 3, C = 4099 };
    static float a[R * C], out[R * C];
    for (int i = 0; i < R * C; i++) a[i] = 1.0f + (float)(i % 5);
    const int64_t huge = (INT64_C(1) << 33) + 17; /* the global row length */
    for (int c = 0; c < 2; c++) {
        mw__k_dropout k = {.count = R * C,
                           .rank = 2,
                           .len = {R, C},
                           .lo = {1, c ? (INT64_C(1) << 32) - 2000 : 0},
                           .gstride = {huge, 1},
                           .p = 0.3f,
                           .seed = 99,
                           .step = 4,
                           .active = 1,
                           .out = out,
                           .a = a};
        cr_assert_eq(mw__cpu_device.dropout(NULL, &k), MW_OK);
        uint64_t key = mw__dropout_key(99, 4);
        uint32_t th = mw__dropout_threshold(0.3f);
        int kept = 0;
        for (int r = 0; r < R; r++)
            for (int j = 0; j < C; j++) {
                uint64_t g = (uint64_t)((k.lo[0] + r) * huge + k.lo[1] + j);
                int want = mw__dropout_keep(key, g, th);
                float y = out[r * C + j];
                cr_assert_eq(y != 0.0f, want, "row %d column %d (global %llu)", r, j,
                             (unsigned long long)g);
                if (want) cr_assert_eq(y, a[r * C + j] * (1.0f / 0.7f));
                kept += want;
            }
        /* 12297 draws at 0.7: 8608 expected, standard deviation 51; 6 sigma. */
        cr_assert(kept > 8608 - 306 && kept < 8608 + 306, "kept %d", kept);
    }
}

static mw_tensor *f_dropout(mw_graph *g, mw_tensor *a, mw_tensor *b) {
    return mw_mul(g, mw_dropout(g, mw_tanh(g, a), 0.5f, 3), b);
}

Test(ops_math, dropout_gradient) {
    float va[N], vb[N];
    values(va, -1, 1, 0, 21);
    values(vb, -1, 1, 0, 22);
    fd_case u;
    run_case(&u, f_dropout, va, vb, 1);
}
