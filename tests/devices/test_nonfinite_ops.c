/* NaN, infinities, overflow, -0 and subnormals through every op, forward and backward, then a
 * step with MW_NONFINITE_SKIP (the gradient norm and AdamW see them too). Every call must succeed
 * and a NaN must reach the loss; the sanitizer build (MESHWIT_SANITIZE=address, which includes
 * UBSan) runs this file to check that no kernel does anything undefined with such values. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "meshwit.h"

#define ROWS 4
#define COLS 8
#define SPECIAL 17 /* row 2, column 1: inside every slice, selection and causal window below */

typedef mw_tensor *(*op_fn)(mw_graph *g, mw_tensor *x, mw_tensor *p);

static mw_tensor *op_add(mw_graph *g, mw_tensor *x, mw_tensor *p) { return mw_add(g, x, p); }
static mw_tensor *op_sub(mw_graph *g, mw_tensor *x, mw_tensor *p) { return mw_sub(g, p, x); }
static mw_tensor *op_mul(mw_graph *g, mw_tensor *x, mw_tensor *p) { return mw_mul(g, x, p); }
static mw_tensor *op_div(mw_graph *g, mw_tensor *x, mw_tensor *p) { return mw_div(g, p, x); }
static mw_tensor *op_scale(mw_graph *g, mw_tensor *x, mw_tensor *p) {
    (void)p;
    return mw_scale(g, x, -3.0f);
}
static mw_tensor *op_dot(mw_graph *g, mw_tensor *x, mw_tensor *p) { return mw_dot(g, x, p, "Col"); }
static mw_tensor *op_contract(mw_graph *g, mw_tensor *x, mw_tensor *p) {
    return mw_contract(g, x, p, "Row");
}
static mw_tensor *op_sum(mw_graph *g, mw_tensor *x, mw_tensor *p) {
    return mw_mul(g, mw_sum(g, x, "Row"), p);
}
static mw_tensor *op_slice(mw_graph *g, mw_tensor *x, mw_tensor *p) {
    (void)p;
    return mw_slice(g, x, "Col", 0, 4, "Part");
}
static mw_tensor *op_select(mw_graph *g, mw_tensor *x, mw_tensor *p) {
    return mw_mul(g, mw_select(g, x, "Row", 2), p);
}
static mw_tensor *op_split_merge(mw_graph *g, mw_tensor *x, mw_tensor *p) {
    mw_tensor *s = mw_split(g, x, "Col", "A=2,B=4");
    return mw_mul(g, mw_merge(g, s, "A,B", "Col"), p);
}
static mw_tensor *op_gelu(mw_graph *g, mw_tensor *x, mw_tensor *p) {
    (void)p;
    return mw_gelu(g, x);
}
static mw_tensor *op_layernorm(mw_graph *g, mw_tensor *x, mw_tensor *p) {
    return mw_layernorm(g, x, p, p, "Col", 1e-5f);
}
static mw_tensor *op_softmax(mw_graph *g, mw_tensor *x, mw_tensor *p) {
    return mw_mul(g, mw_softmax(g, x, "Col", 0.5f), p);
}
static mw_tensor *op_causal(mw_graph *g, mw_tensor *x, mw_tensor *p) {
    return mw_mul(g, mw_causal_softmax(g, x, "Row", "Col", 0.5f), p);
}
static mw_tensor *op_embedding(mw_graph *g, mw_tensor *x, mw_tensor *p) {
    mw_tensor *ids = mw_input(g, "ids", MW_I32, MW_AXES({"Pos", 3}));
    return mw_mul(g, mw_embedding(g, x, ids, "Row"), p);
}
static mw_tensor *op_xent(mw_graph *g, mw_tensor *x, mw_tensor *p) {
    (void)p;
    mw_tensor *t = mw_input(g, "targets", MW_I32, MW_AXES({"Row", ROWS}));
    return mw_cross_entropy(g, x, t, "Col", 0);
}

static const struct {
    const char *name;
    op_fn fn;
} ops[] = {{"add", op_add},
           {"sub", op_sub},
           {"mul", op_mul},
           {"div", op_div},
           {"scale", op_scale},
           {"dot", op_dot},
           {"contract", op_contract},
           {"sum", op_sum},
           {"slice", op_slice},
           {"select", op_select},
           {"split_merge", op_split_merge},
           {"gelu", op_gelu},
           {"layernorm", op_layernorm},
           {"softmax", op_softmax},
           {"causal_softmax", op_causal},
           {"embedding", op_embedding},
           {"cross_entropy", op_xent}};

static const struct {
    const char *name;
    float value;
    int nan; /* the loss must be NaN */
} values[] = {{"NaN", NAN, 1},         {"+Inf", INFINITY, 0},     {"-Inf", -INFINITY, 0},
              {"3e38", 3e38f, 0},      {"-FLT_MAX", -FLT_MAX, 0}, {"-0", -0.0f, 0},
              {"subnormal", 1e-40f, 0}};

/* Builds loss = mean(op(x, p)) with x the special values, runs forward and backward, reads the
 * gradient, then steps with MW_NONFINITE_SKIP. */
static void run_one(int o, int v, const char *devices) {
    mw_graph *g = NULL;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *x = mw_param(g, "x", MW_AXES({"Row", ROWS}, {"Col", COLS}), MW_INIT_ZEROS);
    mw_tensor *p = mw_param(g, "p", MW_AXES({"Col", COLS}), MW_INIT_CONST(0.5f));
    mw_tensor *loss = mw_mean(g, ops[o].fn(g, x, p), NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s: %s", ops[o].name, mw_graph_error(g));
    mw_mesh *mesh = NULL;
    cr_assert_eq(mw_mesh_new(devices, "X", &mesh), MW_OK);
    mw_trainer_config cfg = {.optimizer = {MW_ADAMW, .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f,
                                           .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f},
                             .nonfinite = MW_NONFINITE_SKIP};
    mw_trainer *tr = NULL;
    cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());
    float xv[ROWS * COLS], grad[ROWS * COLS];
    for (int i = 0; i < ROWS * COLS; i++) xv[i] = 0.1f * (float)(i % 7) - 0.3f;
    xv[SPECIAL] = values[v].value;
    cr_assert_eq(mw_trainer_write_param(tr, "x", xv, ROWS * COLS), MW_OK);
    int32_t ids[3] = {2, 0, 2}, targets[ROWS] = {1, 1, 1, 7};
    mw_feed feeds[2];
    int nfeeds = 0;
    if (ops[o].fn == op_embedding) feeds[nfeeds++] = (mw_feed){"ids", ids, 3};
    if (ops[o].fn == op_xent) feeds[nfeeds++] = (mw_feed){"targets", targets, ROWS};
    float l = 0.0f;
    mw_status st = mw_trainer_compute_grads(tr, feeds, nfeeds, &l);
    cr_assert_eq(st, MW_OK, "%s with %s: %s", ops[o].name, values[v].name, mw_last_error());
    if (values[v].nan) cr_assert(isnan(l), "%s with NaN gives loss %g", ops[o].name, l);
    cr_assert_eq(mw_trainer_read_grad(tr, "x", grad, ROWS * COLS), MW_OK);
    st = mw_trainer_step(tr, feeds, nfeeds, &l);
    cr_assert_eq(st, MW_OK, "%s with %s: %s", ops[o].name, values[v].name, mw_last_error());
    if (values[v].nan) cr_assert_eq(mw_trainer_skipped_steps(tr), 1, "%s", ops[o].name);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

/* Every value, or (nan 0) every value but NaN, or (nan 1) NaN only. */
static void run_op(int o, int nan) {
    for (int v = 0; v < (int)(sizeof values / sizeof *values); v++)
        if (nan < 0 || nan == values[v].nan) run_one(o, v, "cpu:1");
}

#define OP_TEST(op, index, off)                                                                    \
    Test(nonfinite_ops, op, .disabled = off) {                                                     \
        cr_assert_str_eq(ops[index].name, #op);                                                    \
        run_op(index, -1);                                                                         \
    }

OP_TEST(add, 0, 0)
OP_TEST(sub, 1, 0)
OP_TEST(mul, 2, 0)
OP_TEST(div, 3, 0)
OP_TEST(scale, 4, 0)
OP_TEST(dot, 5, 0)
OP_TEST(contract, 6, 0)
OP_TEST(sum, 7, 0)
OP_TEST(slice, 8, 0)
OP_TEST(select, 9, 0)
OP_TEST(split_merge, 10, 0)
/* GELU runs every value in the gelu test, and NaN in gelu_nan (mw__expf builds its exponent with
 * unsigned arithmetic, so a NaN reaches no undefined conversion; UBSan checks that here). */
Test(nonfinite_ops, gelu) {
    cr_assert_str_eq(ops[11].name, "gelu");
    run_op(11, 0);
}
Test(nonfinite_ops, gelu_nan) { run_op(11, 1); }
OP_TEST(layernorm, 12, 0)
OP_TEST(softmax, 13, 0)
OP_TEST(causal_softmax, 14, 0)
OP_TEST(embedding, 15, 0)
OP_TEST(cross_entropy, 16, 0)

/* The all-reduce of a sharded reduction, and the gradient buckets, carry them too. */
Test(nonfinite_ops, across_devices) {
    for (int v = 0; v < (int)(sizeof values / sizeof *values); v++) {
        run_one(0, v, "cpu:2");
        run_one(12, v, "cpu:2");
    }
}
