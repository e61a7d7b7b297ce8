/* Optimizer options against closed forms: the defaults a partially filled config gets, the
 * validation of every field, SGD momentum and Nesterov (torch.optim.SGD's recurrences), which
 * parameters decay, a learning rate set from the host, and gradient accumulation equal to the
 * one big batch. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "linreg_model.h"
#include "meshwit.h"

/* loss = sum(c * m) + sum(k * b): the gradients are exactly the fed constants c (of the matrix m,
 * [Row=2, Col=2]) and k (of the vector b, [Col=2]), whatever the parameters are. */
typedef struct lin {
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
    float c[4], k[2];
    mw_feed feeds[2];
} lin;

static mw_status lin_make(lin *r, const mw_optimizer *opt) {
    memset(r, 0, sizeof *r);
    const float c[4] = {0.5f, -1.0f, 2.0f, 0.0f}, k[2] = {0.25f, -3.0f};
    memcpy(r->c, c, sizeof c);
    memcpy(r->k, k, sizeof k);
    cr_assert_eq(mw_graph_new(&r->g), MW_OK);
    mw_tensor *ci = mw_input(r->g, "c", MW_F32, MW_AXES({"Row", 2}, {"Col", 2}));
    mw_tensor *ki = mw_input(r->g, "k", MW_F32, MW_AXES({"Col", 2}));
    mw_tensor *m = mw_param(r->g, "m", MW_AXES({"Row", 2}, {"Col", 2}), MW_INIT_CONST(1.0f));
    mw_tensor *b = mw_param(r->g, "b", MW_AXES({"Col", 2}), MW_INIT_CONST(1.0f));
    mw_tensor *loss = mw_add(r->g, mw_sum(r->g, mw_mul(r->g, ci, m), NULL),
                             mw_sum(r->g, mw_mul(r->g, ki, b), NULL));
    cr_assert_eq(mw_graph_status(r->g), MW_OK, "%s", mw_graph_error(r->g));
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &r->mesh), MW_OK);
    r->feeds[0] = (mw_feed){"c", r->c, 4};
    r->feeds[1] = (mw_feed){"k", r->k, 2};
    mw_trainer_config cfg = {.optimizer = *opt};
    return mw_trainer_new(r->g, loss, r->mesh, &cfg, &r->tr);
}

static void lin_free(lin *r) {
    mw_trainer_free(r->tr);
    mw_mesh_free(r->mesh);
    mw_graph_free(r->g);
}

static void lin_read(lin *r, float m[4], float b[2]) {
    cr_assert_eq(mw_trainer_read_param(r->tr, "m", m, 4), MW_OK);
    cr_assert_eq(mw_trainer_read_param(r->tr, "b", b, 2), MW_OK);
}

/* |got - want| <= 4 ulp-ish relative plus a small absolute term for values near 0. */
static void near(double got, double want, const char *what) {
    double tol = 1e-6 + 2e-6 * fabs(want);
    cr_assert(fabs(got - want) <= tol, "%s: got %.9g, want %.9g", what, got, want);
}

Test(optimizer_options, adamw_init_has_pytorch_defaults) {
    /* MW_ADAMW_INIT(lr): beta1 0.9, beta2 0.999, eps 1e-8. With a constant gradient g,
     * m_t/(1-b1^t) = g and v_t/(1-b2^t) = g^2, so every step moves p by lr * g / (|g| + eps):
     * exactly lr * sign(g) up to eps, and a parameter whose gradient is 0 (c[3]) stays put
     * instead of becoming 0/0. */
    lin r;
    cr_assert_eq(lin_make(&r, &(mw_optimizer)MW_ADAMW_INIT(1e-3f)), MW_OK, "%s", mw_last_error());
    for (int s = 0; s < 5; s++) cr_assert_eq(mw_trainer_step(r.tr, r.feeds, 2, NULL), MW_OK);
    float m[4], b[2];
    lin_read(&r, m, b);
    for (int i = 0; i < 4; i++) {
        double g = r.c[i], want = 1.0 - 5 * 1e-3 * (g / (fabs(g) + 1e-8));
        near(m[i], want, "m");
    }
    for (int i = 0; i < 2; i++) near(b[i], 1.0 - 5 * 1e-3 * (r.k[i] / (fabs(r.k[i]) + 1e-8)), "b");
    cr_assert_eq(m[3], 1.0f, "a zero gradient must leave the parameter unchanged");
    lin_free(&r);
}

Test(optimizer_options, a_zero_field_is_zero_and_adamw_without_eps_is_refused) {
    /* The plain initialiser leaves eps 0, which AdamW refuses (0/0 where a gradient was always
     * 0), pointing at the defaults; nothing is filled in behind the caller's back. */
    lin r;
    cr_assert_eq(lin_make(&r, &(mw_optimizer){.kind = MW_ADAMW, .lr = 1e-3f}), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "optimizer.eps is 0") &&
                  strstr(mw_last_error(), "MW_ADAMW_INIT"),
              "%s", mw_last_error());
    lin_free(&r);
}

Test(optimizer_options, defaults_function_fills_documented_values) {
    mw_optimizer o = mw_optimizer_defaults(MW_ADAMW), init = MW_ADAMW_INIT(1e-3f);
    cr_assert_eq(o.kind, MW_ADAMW);
    cr_assert_float_eq(o.lr, 1e-3f, 0);
    cr_assert_float_eq(o.beta1, 0.9f, 0);
    cr_assert_float_eq(o.beta2, 0.999f, 0);
    cr_assert_float_eq(o.eps, 1e-8f, 0);
    cr_assert_float_eq(o.weight_decay, 0.0f, 0);
    cr_assert_eq(o.decay_rule, MW_DECAY_MATRICES);
    cr_assert(memcmp(&o, &init, sizeof o) == 0, "mw_optimizer_defaults and MW_ADAMW_INIT differ");
    o = mw_optimizer_defaults(MW_SGD);
    cr_assert_eq(o.kind, MW_SGD);
    cr_assert_float_eq(o.momentum, 0.0f, 0);
    cr_assert_eq(o.nesterov, 0);
}

Test(optimizer_options, zero_beta1_means_zero) {
    /* Gradient g, then -g. With beta1 = 0 the second step's m is -g and its bias-corrected v is
     * g^2, so it undoes the first exactly (up to eps): p returns to 1. With 0.9, the second step
     * is only -0.01 g / 0.19 of the way back (p ends near 1 - 0.47 lr sign(g)). */
    const double lr = 0.5;
    for (int zero = 0; zero < 2; zero++) {
        lin r;
        mw_optimizer o = MW_ADAMW_INIT((float)lr);
        o.beta1 = zero ? 0.0f : 0.9f;
        cr_assert_eq(lin_make(&r, &o), MW_OK, "%s", mw_last_error());
        cr_assert_eq(mw_trainer_step(r.tr, r.feeds, 2, NULL), MW_OK);
        for (int i = 0; i < 4; i++) r.c[i] = -r.c[i];
        cr_assert_eq(mw_trainer_step(r.tr, r.feeds, 2, NULL), MW_OK);
        float m[4], b[2];
        lin_read(&r, m, b);
        double g = -r.c[0]; /* the first step's gradient */
        double m2 = 0.9 * 0.1 * g - 0.1 * g, v2 = 0.999 * 0.001 * g * g + 0.001 * g * g;
        double second = (m2 / (1 - 0.81)) / (sqrt(v2 / (1 - 0.999 * 0.999)) + 1e-8);
        double want = zero ? 1.0 : 1.0 - lr * (g / (fabs(g) + 1e-8)) - lr * second;
        near(m[0], want, zero ? "m[0] with beta1 = 0" : "m[0] with beta1 = 0.9");
        lin_free(&r);
    }
}

static void refused(mw_optimizer o, const char *field) {
    lin r;
    mw_status st = lin_make(&r, &o);
    cr_assert_eq(st, MW_ERR_INVALID, "%s: got %s", field, mw_status_name(st));
    cr_assert(strstr(mw_last_error(), field), "message lacks '%s': %s", field, mw_last_error());
    cr_assert_null(r.tr);
    lin_free(&r);
}

Test(optimizer_options, invalid_values_are_refused_naming_the_field) {
    refused(
        (mw_optimizer){.kind = MW_ADAMW, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .lr = -1.0f},
        "optimizer.lr");
    refused(
        (mw_optimizer){.kind = MW_ADAMW, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .lr = NAN},
        "optimizer.lr");
    refused(
        (mw_optimizer){.kind = MW_ADAMW, .beta2 = 0.999f, .eps = 1e-8f, .lr = 1e-3f, .beta1 = 1.0f},
        "optimizer.beta1");
    refused(
        (mw_optimizer){.kind = MW_ADAMW, .beta1 = 0.9f, .eps = 1e-8f, .lr = 1e-3f, .beta2 = -0.5f},
        "optimizer.beta2");
    refused(
        (mw_optimizer){
            .kind = MW_ADAMW, .beta1 = 0.9f, .beta2 = 0.999f, .lr = 1e-3f, .eps = -1e-8f},
        "optimizer.eps");
    refused(
        (mw_optimizer){.kind = MW_ADAMW, .beta1 = 0.9f, .beta2 = 0.999f, .lr = 1e-3f, .eps = 0.0f},
        "optimizer.eps");
    refused((mw_optimizer){.kind = MW_SGD, .lr = 1e-3f, .decay_rule = (mw_decay_rule)7},
            "optimizer.decay_rule");
    refused((mw_optimizer){.kind = MW_ADAMW,
                           .beta1 = 0.9f,
                           .beta2 = 0.999f,
                           .eps = 1e-8f,
                           .lr = 1e-3f,
                           .weight_decay = -0.1f},
            "optimizer.weight_decay");
    refused((mw_optimizer){.kind = MW_SGD, .lr = 1e-3f, .grad_clip = -1.0f}, "optimizer.grad_clip");
    refused((mw_optimizer){.kind = MW_SGD, .lr = 1e-3f, .warmup_steps = -1},
            "optimizer.warmup_steps");
    refused((mw_optimizer){.kind = MW_SGD, .lr = 1e-3f, .decay_steps = -5},
            "optimizer.decay_steps");
    refused((mw_optimizer){.kind = MW_SGD, .lr = 1e-3f, .min_lr_ratio = 2.0f},
            "optimizer.min_lr_ratio");
    refused((mw_optimizer){.kind = MW_SGD, .lr = 1e-3f, .momentum = 1.5f}, "optimizer.momentum");
    refused((mw_optimizer){.kind = MW_SGD, .lr = 1e-3f, .dampening = -1.0f}, "optimizer.dampening");
    refused((mw_optimizer){.kind = MW_SGD, .lr = 1e-3f, .nesterov = 1}, "optimizer.nesterov");
    refused(
        (mw_optimizer){
            .kind = MW_SGD, .lr = 1e-3f, .momentum = 0.9f, .dampening = 0.1f, .nesterov = 1},
        "optimizer.nesterov");
    refused((mw_optimizer){.kind = (mw_optimizer_kind)7, .lr = 1e-3f}, "optimizer.kind");
}

/* With a constant gradient g and momentum mu (dampening 0), torch.optim.SGD's buffer after t
 * steps is g (1 - mu^t) / (1 - mu); plain momentum steps by the buffer, Nesterov by g + mu buf. */
static double momentum_travel(double g, double mu, int steps, int nesterov) {
    double total = 0;
    for (int t = 1; t <= steps; t++) {
        double buf = g * (1 - pow(mu, t)) / (1 - mu);
        total += nesterov ? g + mu * buf : buf;
    }
    return total;
}

static void check_momentum(int nesterov) {
    const double lr = 0.1, mu = 0.9;
    lin r;
    cr_assert_eq(lin_make(&r, &(mw_optimizer){.kind = MW_SGD,
                                              .lr = (float)lr,
                                              .momentum = (float)mu,
                                              .nesterov = nesterov}),
                 MW_OK, "%s", mw_last_error());
    for (int s = 0; s < 6; s++) cr_assert_eq(mw_trainer_step(r.tr, r.feeds, 2, NULL), MW_OK);
    float m[4], b[2];
    lin_read(&r, m, b);
    for (int i = 0; i < 4; i++)
        near(m[i], 1.0 - lr * momentum_travel(r.c[i], mu, 6, nesterov), "m");
    for (int i = 0; i < 2; i++)
        near(b[i], 1.0 - lr * momentum_travel(r.k[i], mu, 6, nesterov), "b");
    lin_free(&r);
}

Test(optimizer_options, sgd_momentum_matches_closed_form) { check_momentum(0); }
Test(optimizer_options, sgd_nesterov_matches_closed_form) { check_momentum(1); }

Test(optimizer_options, sgd_dampening_first_step_takes_whole_gradient) {
    /* PyTorch: buf = g on the first step (no dampening), buf = mu buf + (1 - d) g after. */
    const double lr = 0.1, mu = 0.5, d = 0.5;
    lin r;
    cr_assert_eq(lin_make(&r, &(mw_optimizer){.kind = MW_SGD,
                                              .lr = (float)lr,
                                              .momentum = (float)mu,
                                              .dampening = (float)d}),
                 MW_OK, "%s", mw_last_error());
    for (int s = 0; s < 2; s++) cr_assert_eq(mw_trainer_step(r.tr, r.feeds, 2, NULL), MW_OK);
    float m[4], b[2];
    lin_read(&r, m, b);
    double g = r.c[0], buf1 = g, buf2 = mu * buf1 + (1 - d) * g;
    near(m[0], 1.0 - lr * (buf1 + buf2), "m[0]");
    lin_free(&r);
}

Test(optimizer_options, sgd_weight_decay_defaults_to_matrices) {
    /* L2 decay adds wd * p to the gradient of m (rank 2) but not of b (rank 1). One step from
     * p = 1: m = 1 - lr (c + wd), b = 1 - lr k. */
    const double lr = 0.1, wd = 0.5;
    lin r;
    cr_assert_eq(
        lin_make(&r, &(mw_optimizer){.kind = MW_SGD, .lr = (float)lr, .weight_decay = (float)wd}),
        MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_step(r.tr, r.feeds, 2, NULL), MW_OK);
    float m[4], b[2];
    lin_read(&r, m, b);
    for (int i = 0; i < 4; i++) near(m[i], 1.0 - lr * (r.c[i] + wd), "m");
    for (int i = 0; i < 2; i++) near(b[i], 1.0 - lr * r.k[i], "b");
    lin_free(&r);
}

static int decay_only_b(const char *name, int rank, void *user) {
    (void)rank;
    ++*(int *)user;
    return strcmp(name, "b") == 0;
}

Test(optimizer_options, caller_chooses_decayed_parameters) {
    /* AdamW's decoupled decay on b only: b = 1 - lr (wd * 1 + sign(k)), m = 1 - lr sign(c). */
    const double lr = 0.01, wd = 0.5;
    int calls = 0;
    lin r;
    cr_assert_eq(lin_make(&r, &(mw_optimizer){.kind = MW_ADAMW,
                                              .beta1 = 0.9f,
                                              .beta2 = 0.999f,
                                              .eps = 1e-8f,
                                              .lr = (float)lr,
                                              .weight_decay = (float)wd,
                                              .decays = decay_only_b,
                                              .decay_user = &calls}),
                 MW_OK, "%s", mw_last_error());
    cr_assert_eq(calls, 2, "the rule is asked once per parameter");
    cr_assert_eq(mw_trainer_step(r.tr, r.feeds, 2, NULL), MW_OK);
    float m[4], b[2];
    lin_read(&r, m, b);
    for (int i = 0; i < 4; i++) near(m[i], 1.0 - lr * (r.c[i] / (fabs(r.c[i]) + 1e-8)), "m");
    for (int i = 0; i < 2; i++) near(b[i], 1.0 - lr * (wd + r.k[i] / (fabs(r.k[i]) + 1e-8)), "b");
    lin_free(&r);
}

Test(optimizer_options, host_sets_learning_rate_of_next_step) {
    /* The schedule says 0.1 every step (warmup 0, no decay); the host overrides it. */
    lin r;
    cr_assert_eq(lin_make(&r, &(mw_optimizer){.kind = MW_SGD, .lr = 0.1f}), MW_OK);
    const float lrs[3] = {0.5f, 0.0f, 0.25f};
    double travel = 0;
    for (int s = 0; s < 3; s++) {
        cr_assert_eq(mw_trainer_set_lr(r.tr, lrs[s]), MW_OK);
        cr_assert_eq(mw_trainer_step(r.tr, r.feeds, 2, NULL), MW_OK);
        travel += lrs[s];
    }
    cr_assert_eq(mw_trainer_set_lr(r.tr, MW_LR_SCHEDULE), MW_OK);
    cr_assert_eq(mw_trainer_step(r.tr, r.feeds, 2, NULL), MW_OK);
    travel += 0.1;
    float m[4], b[2];
    lin_read(&r, m, b);
    for (int i = 0; i < 4; i++) near(m[i], 1.0 - travel * r.c[i], "m");
    cr_assert_eq(mw_trainer_set_lr(r.tr, -2.0f), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "lr is -2"), "%s", mw_last_error());
    cr_assert_eq(mw_trainer_set_lr(r.tr, INFINITY), MW_ERR_INVALID);
    cr_assert_eq(mw_trainer_set_lr(NULL, 0.1f), MW_ERR_INVALID);
    lin_free(&r);
}

/* --- gradient accumulation ------------------------------------------------------------------ */

#define MICRO 4
#define ROWS 24 /* per micro-batch */
#define FEATURES 5

typedef struct reg {
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
} reg;

static void reg_make(reg *r, int64_t rows, const char *devices, const mw_optimizer *opt,
                     int accum) {
    memset(r, 0, sizeof *r);
    cr_assert_eq(mw_graph_new(&r->g), MW_OK);
    mw_tensor *loss;
    int sharded = strcmp(devices, "cpu:1") != 0;
    cr_assert_eq(linreg_build(r->g, rows, FEATURES, sharded, "X", &loss), MW_OK);
    cr_assert_eq(mw_mesh_new(devices, "X", &r->mesh), MW_OK);
    mw_trainer_config cfg = {.optimizer = *opt, .grad_accumulation = accum};
    cr_assert_eq(mw_trainer_new(r->g, loss, r->mesh, &cfg, &r->tr), MW_OK, "%s", mw_last_error());
}

static void reg_free(reg *r) {
    mw_trainer_free(r->tr);
    mw_mesh_free(r->mesh);
    mw_graph_free(r->g);
}

static void check_accumulation(const char *devices, const mw_optimizer *opt) {
    linreg_data d;
    cr_assert_eq(linreg_data_make(MICRO * ROWS, FEATURES, 11, &d), MW_OK);
    reg big, small;
    reg_make(&big, MICRO * ROWS, "cpu:1", opt, 0);
    reg_make(&small, ROWS, devices, opt, 1);
    for (int step = 0; step < 3; step++) {
        mw_feed feeds[2];
        linreg_feeds(&d, feeds);
        cr_assert_eq(mw_trainer_step(big.tr, feeds, 2, NULL), MW_OK);
        for (int mb = 0; mb < MICRO; mb++) {
            mw_feed f[2] = {{"x", d.x + (int64_t)mb * ROWS * FEATURES, ROWS * FEATURES},
                            {"y", d.y + (int64_t)mb * ROWS, ROWS}};
            mw_status st = mb < MICRO - 1 ? mw_trainer_accumulate(small.tr, f, 2, NULL)
                                          : mw_trainer_step(small.tr, f, 2, NULL);
            cr_assert_eq(st, MW_OK, "%s", mw_last_error());
        }
    }
    cr_assert_eq(mw_trainer_steps(small.tr), 3, "micro-batches are not updates");
    float wb[FEATURES], ws[FEATURES], bb, bs;
    cr_assert_eq(linreg_read_params(big.tr, FEATURES, wb, &bb), MW_OK);
    cr_assert_eq(linreg_read_params(small.tr, FEATURES, ws, &bs), MW_OK);
    /* The sums differ only in their order: a few float roundings of values of order 1. */
    for (int i = 0; i < FEATURES; i++)
        cr_assert(fabsf(wb[i] - ws[i]) <= 1e-5f * (1 + fabsf(wb[i])), "w[%d]: %g vs %g", i, wb[i],
                  ws[i]);
    cr_assert(fabsf(bb - bs) <= 1e-5f * (1 + fabsf(bb)), "bias: %g vs %g", bb, bs);
    cr_assert(wb[0] != 0.0f, "the parameters moved");
    reg_free(&big);
    reg_free(&small);
    linreg_data_free(&d);
}

Test(optimizer_options, accumulation_equals_big_batch_sgd) {
    check_accumulation("cpu:1", &(mw_optimizer){.kind = MW_SGD, .lr = 0.05f});
}

Test(optimizer_options, accumulation_equals_big_batch_adamw_sharded) {
    check_accumulation("cpu:2", &(mw_optimizer){.kind = MW_ADAMW,
                                                .beta1 = 0.9f,
                                                .beta2 = 0.999f,
                                                .eps = 1e-8f,
                                                .lr = 0.05f,
                                                .grad_clip = 1.0f});
}

/* The order trainer.h gives for N micro-batches: acc = g0, acc = acc + g1, ..., then the update
 * reads (acc + g_last) * (1/N rounded to float), each g_k the all-reduced gradient of micro-batch
 * k (as mw_trainer_compute_grads gives it). The gradient read after the step is that value, bit
 * for bit, on one device, two, and with ZeRO-1; N = 3 so that 1/N is rounded, and the data are
 * checked to tell this order from another grouping and from a division by N. */
static void check_accumulation_order(const char *devices, int zero1) {
    enum { N = 3, F = 64 };
    linreg_data d;
    cr_assert_eq(linreg_data_make(N * ROWS, F, 5, &d), MW_OK);
    mw_graph *g;
    mw_tensor *loss;
    mw_mesh *mesh;
    mw_trainer *tr;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    cr_assert_eq(linreg_build(g, ROWS, F, strcmp(devices, "cpu:1") != 0, "X", &loss), MW_OK);
    cr_assert_eq(mw_mesh_new(devices, "X", &mesh), MW_OK);
    /* lr 0 and no clipping: the gradient read after the step is the one the update saw. */
    mw_trainer_config cfg = {.optimizer = {.kind = MW_SGD, .lr = 0.0f},
                             .grad_accumulation = 1,
                             .shard_optimizer = zero1};
    cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());
    mw_feed f[N][2];
    static float gk[N][F + 1], got[F + 1], want[F + 1];
    for (int k = 0; k < N; k++) {
        f[k][0] = (mw_feed){"x", d.x + (int64_t)k * ROWS * F, ROWS * F};
        f[k][1] = (mw_feed){"y", d.y + (int64_t)k * ROWS, ROWS};
        cr_assert_eq(mw_trainer_compute_grads(tr, f[k], 2, NULL), MW_OK, "%s", mw_last_error());
        cr_assert_eq(mw_trainer_read_grad(tr, "weights", gk[k], F), MW_OK);
        cr_assert_eq(mw_trainer_read_grad(tr, "bias", gk[k] + F, 1), MW_OK);
    }
    for (int k = 0; k < N; k++) {
        mw_status st = k < N - 1 ? mw_trainer_accumulate(tr, f[k], 2, NULL)
                                 : mw_trainer_step(tr, f[k], 2, NULL);
        cr_assert_eq(st, MW_OK, "%s", mw_last_error());
    }
    cr_assert_eq(mw_trainer_read_grad(tr, "weights", got, F), MW_OK);
    cr_assert_eq(mw_trainer_read_grad(tr, "bias", got + F, 1), MW_OK);
    int other_grouping = 0, division = 0;
    for (int i = 0; i <= F; i++) {
        volatile float acc = gk[0][i];
        acc = acc + gk[1][i];
        volatile float sum = acc + gk[2][i], tail = gk[1][i] + gk[2][i];
        want[i] = sum * (1.0f / (float)N);
        volatile float other = (gk[0][i] + tail) * (1.0f / (float)N), div = sum / (float)N;
        other_grouping += other != want[i];
        division += div != want[i];
        cr_assert(got[i] == want[i], "%s%s: element %d is %.9g, the documented order gives %.9g",
                  devices, zero1 ? " ZeRO-1" : "", i, got[i], want[i]);
    }
    cr_assert(other_grouping > 0 && division > 0,
              "the data cannot tell the order (%d elements differ by grouping, %d by division)",
              other_grouping, division);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    linreg_data_free(&d);
}

Test(optimizer_options, accumulation_order_is_the_documented_one) {
    check_accumulation_order("cpu:1", 0);
    check_accumulation_order("cpu:2", 0);
    check_accumulation_order("cpu:2", 1);
}

Test(optimizer_options, accumulate_needs_the_config_flag) {
    lin r;
    cr_assert_eq(lin_make(&r, &(mw_optimizer){.kind = MW_SGD, .lr = 0.1f}), MW_OK);
    cr_assert_eq(mw_trainer_accumulate(r.tr, r.feeds, 2, NULL), MW_ERR_STATE);
    cr_assert(strstr(mw_last_error(), "grad_accumulation"), "%s", mw_last_error());
    lin_free(&r);
}

Test(optimizer_options, momentum_survives_checkpoint) {
    /* Saving after 2 steps and resuming in a fresh trainer gives the uninterrupted 4 steps. */
    const mw_optimizer o = {.kind = MW_SGD, .lr = 0.1f, .momentum = 0.9f};
    lin a, b;
    cr_assert_eq(lin_make(&a, &o), MW_OK);
    cr_assert_eq(lin_make(&b, &o), MW_OK);
    for (int s = 0; s < 2; s++) cr_assert_eq(mw_trainer_step(a.tr, a.feeds, 2, NULL), MW_OK);
    char path[] = "/tmp/mw_momentum_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    cr_assert(fd >= 0);
    cr_assert_eq(mw_trainer_save(a.tr, path, NULL, 0), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_load(b.tr, path, NULL, 0, NULL), MW_OK, "%s", mw_last_error());
    remove(path);
    for (int s = 0; s < 2; s++) {
        cr_assert_eq(mw_trainer_step(a.tr, a.feeds, 2, NULL), MW_OK);
        cr_assert_eq(mw_trainer_step(b.tr, b.feeds, 2, NULL), MW_OK);
    }
    float ma[4], ba[2], mb[4], bb[2];
    lin_read(&a, ma, ba);
    lin_read(&b, mb, bb);
    cr_assert(memcmp(ma, mb, sizeof ma) == 0 && memcmp(ba, bb, sizeof ba) == 0);
    near(ma[0], 1.0 - 0.1 * momentum_travel(a.c[0], 0.9, 4, 0), "m[0]");
    lin_free(&a);
    lin_free(&b);
}
