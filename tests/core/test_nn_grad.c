/* Gradients of the neural-network and reshaping ops against central finite differences, and the
 * errors of their rules.
 *
 * Each case traces a small graph whose differentiable leaves are parameters (MW_INIT_NORMAL, so
 * deterministic), applies one op (or the few ops of one GPT-2 building block), and reduces the
 * result to L = sum(out * r), where r is a fed input of fixed random weights: every output
 * element reaches the loss with its own weight, so a gradient routed to the wrong element, or
 * summed over the wrong axis, changes L's gradient. The analytic gradient (mw_trainer_compute_grads
 * on "cpu:1", read with mw_trainer_read_grad) is compared element by element with
 * (L(p + h) - L(p - h)) / (2h), from two mw_trainer_eval calls, computed in double.
 *
 * Where an op only moves values (relabels, slices, lookups) the expected gradient is also known
 * exactly (r itself, zero outside a slice, a sum of rows of r), and is checked as such. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "meshwit.h"

/* Error of a central difference, and the tolerances below.
 *
 * Rounding: the forward pass runs in f32 (u = 2^-24 = 6e-8). Every loss here is a sum of at most
 * ~50 terms out_i * r_i with |r_i| < 1 and |out_i| of order one (a few for the larger ops), so
 * one evaluation of L is off by about sqrt(n) u sum|terms| <~ 7 * 6e-8 * 20 = 1e-5 at worst; the
 * central difference divides the difference of two evaluations by 2h, giving <~ 1e-5 / h = 1e-3
 * for h = 1e-2, and typically far less (the rounding of the two evaluations is the same except
 * near the perturbed element). Measured: at most 2.2e-5 for single ops, 3.6e-5 through a layer
 * norm, and 4.9e-4 on a gradient of about 3 in the residual block (layer norm, GELU, a linear
 * layer and the residual add).
 *
 * Truncation: h^2 / 6 * |d^3 L / dp^3|. Zero for ops linear in each parameter (relabels,
 * slices, the embedding lookup, a contraction: at most quadratic in a tied parameter); for
 * the smooth nonlinear ops the third derivative is of order one at our values (GELU:
 * |gelu'''| < 1; softmax and cross-entropy: bounded by a few times scale^3; layer norm: by
 * rstd^3 with rows whose standard deviation is near one), so h = 1e-2 costs ~2e-5.
 *
 * Hence |analytic - numeric| <= ATOL + RTOL * |numeric| with ATOL = RTOL = 1e-3, the worst-case
 * rounding estimate, while a wrong gradient (a missing term, a transposed or mis-broadcast one, a
 * missing factor of the scale) is off by O(0.1 - 1). Layer norm divides by a row's standard
 * deviation, whose derivative amplifies the rounding of the two evaluations: the cases through
 * one get twice the tolerance. Every measured error is below 6% of its bound. */
#define STEP 1e-2
#define ATOL 1e-3
#define RTOL 1e-3

#define MAX_LEAVES 6
#define MAX_ELEMS 192

typedef struct leaf {
    char name[MW_MAX_NAME];
    int64_t count;
    int is_ids;
    int has_values;         /* parameter: data is written into the trainer before checking */
    float data[MAX_ELEMS];  /* f32 input: values fed at every step; parameter: see has_values */
    int32_t ids[MAX_ELEMS]; /* i32 input: the ids fed at every step */
    float grad[MAX_ELEMS];  /* parameter: the analytic gradient, after case_run */
    float value[MAX_ELEMS]; /* parameter: its value, after case_run */
} leaf;

typedef struct grad_case {
    mw_graph *g;
    uint64_t rng;
    double tol_scale; /* multiplies ATOL and RTOL */
    int nparams, ninputs;
    leaf param[MAX_LEAVES];
    leaf input[MAX_LEAVES];
} grad_case;

/* splitmix64: uniform in [-1, 1). */
static double uniform(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1p-52 - 1.0;
}

static void case_begin(grad_case *c) {
    memset(c, 0, sizeof *c);
    c->rng = 0x5EED0FA11;
    c->tol_scale = 1.0;
    cr_assert_eq(mw_graph_new(&c->g), MW_OK, "%s", mw_last_error());
}

static leaf *add_leaf(leaf *list, int *n, const char *name, int64_t count) {
    cr_assert_lt(*n, MAX_LEAVES);
    cr_assert_leq(count, MAX_ELEMS, "%s has %lld elements", name, (long long)count);
    leaf *l = &list[(*n)++];
    snprintf(l->name, sizeof l->name, "%s", name);
    l->count = count;
    return l;
}

static leaf *find_leaf(leaf *list, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(list[i].name, name) == 0) return &list[i];
    cr_assert_fail("no leaf named %s", name);
    return NULL;
}

/* A parameter drawn from N(0, std^2) by the graph's initialiser. */
static mw_tensor *case_param(grad_case *c, const char *name, mw_axes axes, float std) {
    mw_tensor *p = mw_param(c->g, name, axes, MW_INIT_NORMAL(std));
    cr_assert_not_null(p, "mw_param(%s): %s", name, mw_graph_error(c->g));
    add_leaf(c->param, &c->nparams, name, mw_tensor_numel(p));
    return p;
}

/* A parameter that starts at the given values. */
static mw_tensor *case_param_values(grad_case *c, const char *name, mw_axes axes,
                                    const float *values) {
    mw_tensor *p = case_param(c, name, axes, 1.0f);
    leaf *l = &c->param[c->nparams - 1];
    l->has_values = 1;
    memcpy(l->data, values, sizeof(float) * (size_t)l->count);
    return p;
}

/* An f32 input fed with uniform values in [-1, 1). */
static mw_tensor *case_input(grad_case *c, const char *name, mw_axes axes) {
    mw_tensor *x = mw_input(c->g, name, MW_F32, axes);
    cr_assert_not_null(x, "mw_input(%s): %s", name, mw_graph_error(c->g));
    leaf *l = add_leaf(c->input, &c->ninputs, name, mw_tensor_numel(x));
    for (int64_t i = 0; i < l->count; i++) l->data[i] = (float)uniform(&c->rng);
    return x;
}

/* An i32 input fed with `ids` (numel(axes) of them). */
static mw_tensor *case_ids(grad_case *c, const char *name, mw_axes axes, const int32_t *ids) {
    mw_tensor *x = mw_input(c->g, name, MW_I32, axes);
    cr_assert_not_null(x, "mw_input(%s): %s", name, mw_graph_error(c->g));
    leaf *l = add_leaf(c->input, &c->ninputs, name, mw_tensor_numel(x));
    l->is_ids = 1;
    memcpy(l->ids, ids, sizeof(int32_t) * (size_t)l->count);
    return x;
}

/* The axes of t, to declare an input of the same shape. Names stay owned by the graph. */
static mw_axes axes_of(const mw_tensor *t) {
    mw_axes axes = {.rank = mw_tensor_rank(t)};
    for (int i = 0; i < axes.rank; i++) {
        const char *mesh_axis;
        cr_assert_eq(mw_tensor_axis(t, i, &axes.axis[i].name, &axes.axis[i].size, &mesh_axis),
                     MW_OK);
        cr_assert_null(mesh_axis);
    }
    return axes;
}

static double eval_loss(mw_trainer *tr, const mw_feed *feeds, int nfeeds) {
    float loss = NAN;
    cr_assert_eq(mw_trainer_eval(tr, feeds, nfeeds, &loss), MW_OK, "%s", mw_last_error());
    return loss;
}

/* Compares the analytic gradient of parameter p with central differences, then restores p. */
static void check_param(grad_case *c, mw_trainer *tr, const mw_feed *feeds, int nfeeds, leaf *p) {
    float probe[MAX_ELEMS];
    int64_t n = p->count;
    double atol = ATOL * c->tol_scale, rtol = RTOL * c->tol_scale;
    memcpy(probe, p->value, sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        /* Divide by the perturbation actually stored in f32, not by the nominal 2h. */
        probe[i] = (float)(p->value[i] + STEP);
        double up = probe[i];
        cr_assert_eq(mw_trainer_write_param(tr, p->name, probe, n), MW_OK, "%s", mw_last_error());
        double loss_up = eval_loss(tr, feeds, nfeeds);
        probe[i] = (float)(p->value[i] - STEP);
        double down = probe[i];
        cr_assert_eq(mw_trainer_write_param(tr, p->name, probe, n), MW_OK, "%s", mw_last_error());
        double loss_down = eval_loss(tr, feeds, nfeeds);
        probe[i] = p->value[i];

        double numeric = (loss_up - loss_down) / (up - down);
        double err = fabs((double)p->grad[i] - numeric), bound = atol + rtol * fabs(numeric);
        cr_assert_leq(err, bound,
                      "d loss / d %s[%lld]: analytic %.7g, central difference %.7g (error %.3g)",
                      p->name, (long long)i, p->grad[i], numeric, err);
    }
    cr_assert_eq(mw_trainer_write_param(tr, p->name, p->value, n), MW_OK, "%s", mw_last_error());
}

/* Makes L = sum(out * r) (r is the input "r"), a trainer on one CPU device, computes the analytic
 * gradients into each parameter's leaf, and checks them against central differences when
 * `finite_differences` is set. Frees everything but the leaves; returns L. */
static double case_run(grad_case *c, mw_tensor *out, int finite_differences) {
    cr_assert_not_null(out, "tracing failed: %s", mw_graph_error(c->g));
    mw_tensor *r = case_input(c, "r", axes_of(out));
    mw_tensor *loss = mw_sum(c->g, mw_mul(c->g, out, r), NULL);
    cr_assert_eq(mw_graph_status(c->g), MW_OK, "%s", mw_graph_error(c->g));

    mw_mesh *mesh = NULL;
    mw_trainer *tr = NULL;
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &mesh), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_new(c->g, loss, mesh, NULL, &tr), MW_OK, "%s", mw_last_error());
    for (int j = 0; j < c->nparams; j++) {
        leaf *p = &c->param[j];
        if (p->has_values)
            cr_assert_eq(mw_trainer_write_param(tr, p->name, p->data, p->count), MW_OK, "%s",
                         mw_last_error());
        cr_assert_eq(mw_trainer_read_param(tr, p->name, p->value, p->count), MW_OK, "%s",
                     mw_last_error());
    }

    mw_feed feeds[MAX_LEAVES];
    for (int j = 0; j < c->ninputs; j++)
        feeds[j] = (mw_feed){c->input[j].name,
                             c->input[j].is_ids ? (const void *)c->input[j].ids : c->input[j].data,
                             c->input[j].count};
    float value = NAN;
    cr_assert_eq(mw_trainer_compute_grads(tr, feeds, c->ninputs, &value), MW_OK, "%s",
                 mw_last_error());
    cr_assert(isfinite(value));
    for (int j = 0; j < c->nparams; j++)
        cr_assert_eq(
            mw_trainer_read_grad(tr, c->param[j].name, c->param[j].grad, c->param[j].count), MW_OK,
            "%s", mw_last_error());
    if (finite_differences)
        for (int j = 0; j < c->nparams; j++) check_param(c, tr, feeds, c->ninputs, &c->param[j]);

    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(c->g);
    c->g = NULL;
    return value;
}

static void case_check(grad_case *c, mw_tensor *out) { case_run(c, out, 1); }

/* The gradient of an op that only relabels its input (the same elements in the same memory
 * order) is r itself, bit for bit. */
static void expect_grad_is_r(grad_case *c, const char *param) {
    leaf *p = find_leaf(c->param, c->nparams, param), *r = find_leaf(c->input, c->ninputs, "r");
    cr_assert_eq(p->count, r->count);
    for (int64_t i = 0; i < p->count; i++)
        cr_assert_eq(p->grad[i], r->data[i], "d loss / d %s[%lld] = %.9g, expected r = %.9g", param,
                     (long long)i, p->grad[i], r->data[i]);
}

TestSuite(nn_grad, .description = "NN and reshaping ops: gradients against central differences",
          .timeout = 60);

/* --- embedding -------------------------------------------------------------------------------- */

/* ids [Batch=2, Seq=4]: row 1 is picked four times and row 4 twice (their gradients accumulate),
 * rows 2 and 3 never (zero gradient). d L / d table[v] = sum of r over the positions holding v. */
Test(nn_grad, embedding_repeated_ids) {
    grad_case c;
    case_begin(&c);
    static const int32_t ids[8] = {1, 4, 1, 1, 0, 4, 5, 1};
    mw_tensor *table = case_param(&c, "table", MW_AXES({"Vocab", 6}, {"Dim", 3}), 1.0f);
    mw_tensor *t = case_ids(&c, "ids", MW_AXES({"Batch", 2}, {"Seq", 4}), ids);
    case_check(&c, mw_embedding(c.g, table, t, "Vocab"));

    leaf *p = find_leaf(c.param, c.nparams, "table"), *r = find_leaf(c.input, c.ninputs, "r");
    for (int v = 0; v < 6; v++)
        for (int d = 0; d < 3; d++) {
            double want = 0.0;
            for (int i = 0; i < 8; i++)
                if (ids[i] == v) want += r->data[i * 3 + d];
            /* At most four f32 additions of values below one: within 4 ulps of 4. */
            cr_assert_leq(fabs(p->grad[v * 3 + d] - want), 2e-6, "table[%d][%d]: %.9g, want %.9g",
                          v, d, p->grad[v * 3 + d], want);
            if (v == 2 || v == 3) cr_assert_eq(p->grad[v * 3 + d], 0.0f, "unused row %d", v);
        }
}

/* --- layer norm, GELU, softmax ---------------------------------------------------------------- */

/* x [Batch=2, Row=2, Dim=6]: leading axes are rows. Rows of six N(0, 1) values have standard
 * deviations near one, so 1/std stays small; gain and bias are random so that each term of
 * d/dx (w * xhat) shows. */
Test(nn_grad, layernorm) {
    grad_case c;
    case_begin(&c);
    c.tol_scale = 2.0;
    mw_tensor *x = case_param(&c, "x", MW_AXES({"Batch", 2}, {"Row", 2}, {"Dim", 6}), 1.0f);
    mw_tensor *w = case_param(&c, "w", MW_AXES({"Dim", 6}), 1.0f);
    mw_tensor *b = case_param(&c, "b", MW_AXES({"Dim", 6}), 1.0f);
    case_check(&c, mw_layernorm(c.g, x, w, b, "Dim", 1e-5f));
}

/* The gradient of a permutation is the inverse permutation; a constant adds nothing to it. */
Test(nn_grad, permute_and_full) {
    grad_case c;
    case_begin(&c);
    mw_tensor *x = case_param(&c, "x", MW_AXES({"A", 3}, {"B", 4}, {"C", 2}), 1.0f);
    mw_tensor *y = mw_permute(c.g, x, "C,A,B");
    case_check(&c, mw_mul(c.g, mw_add(c.g, y, mw_full(c.g, MW_AXES({"B", 4}), 0.5f)), y));
}

/* Values with standard deviation 2 reach GELU's curved region and both tails. */
Test(nn_grad, gelu) {
    grad_case c;
    case_begin(&c);
    case_check(&c, mw_gelu(c.g, case_param(&c, "x", MW_AXES({"A", 3}, {"B", 8}), 2.0f)));
}

Test(nn_grad, gelu_erf) {
    grad_case c;
    case_begin(&c);
    case_check(&c, mw_gelu_erf(c.g, case_param(&c, "x", MW_AXES({"A", 3}, {"B", 8}), 2.0f)));
}

/* The scale multiplies the logits, so it multiplies the gradient too. */
Test(nn_grad, softmax) {
    grad_case c;
    case_begin(&c);
    mw_tensor *x = case_param(&c, "x", MW_AXES({"Row", 3}, {"Class", 5}), 1.0f);
    case_check(&c, mw_softmax(c.g, x, "Class", 0.7f));
}

/* x [Head, Query, Key]: query i sees keys j <= i + (keys - queries); the hidden logits take no
 * part in the output, so their gradient is exactly zero. */
static void check_causal_softmax(int64_t queries, int64_t keys) {
    grad_case c;
    case_begin(&c);
    mw_tensor *x =
        case_param(&c, "x", MW_AXES({"Head", 2}, {"Query", queries}, {"Key", keys}), 1.0f);
    case_check(&c, mw_causal_softmax(c.g, x, "Query", "Key", 0.5f));
    leaf *p = &c.param[0];
    for (int64_t h = 0; h < 2; h++)
        for (int64_t i = 0; i < queries; i++)
            for (int64_t j = 0; j < keys; j++) {
                float gr = p->grad[(h * queries + i) * keys + j];
                if (j > i + (keys - queries))
                    cr_assert_eq(gr, 0.0f, "hidden key %lld of query %lld has gradient %g",
                                 (long long)j, (long long)i, gr);
                else if (i + (keys - queries) > 0) /* one visible key: p = 1, a constant */
                    cr_assert_neq(gr, 0.0f, "visible key %lld of query %lld has no gradient",
                                  (long long)j, (long long)i);
            }
}

Test(nn_grad, causal_softmax_square) { check_causal_softmax(4, 4); }

Test(nn_grad, causal_softmax_longer_key) { check_causal_softmax(3, 5); }

/* --- cross-entropy ---------------------------------------------------------------------------- */

/* logits [Batch=2, Seq=3, Vocab=vocab] against targets; with valid < vocab the classes from
 * valid on are padding. Also checks the loss itself against the host's log-sum-exp. */
static void check_cross_entropy(int64_t vocab, int64_t valid, const int32_t targets[6]) {
    grad_case c;
    case_begin(&c);
    mw_tensor *logits =
        case_param(&c, "logits", MW_AXES({"Batch", 2}, {"Seq", 3}, {"Vocab", vocab}), 2.0f);
    mw_tensor *t = case_ids(&c, "targets", MW_AXES({"Batch", 2}, {"Seq", 3}), targets);
    double loss = case_run(&c, mw_cross_entropy(c.g, logits, t, "Vocab", valid), 1);

    leaf *p = &c.param[0], *r = find_leaf(c.input, c.ninputs, "r");
    int64_t classes = valid ? valid : vocab;
    double want = 0.0;
    for (int row = 0; row < 6; row++) {
        const float *x = p->value + row * vocab;
        double s = 0.0;
        for (int64_t j = 0; j < classes; j++) s += exp((double)x[j]);
        want += r->data[row] * (log(s) - x[targets[row]]);
        for (int64_t j = classes; j < vocab; j++)
            cr_assert_eq(p->grad[row * vocab + j], 0.0f, "padded class %lld of row %d: %g",
                         (long long)j, row, p->grad[row * vocab + j]);
    }
    /* Six per-row losses of order one, each in f32: a few ulps of 10. */
    cr_assert_leq(fabs(loss - want), 1e-5 * (1.0 + fabs(want)), "loss %.9g, host %.9g", loss, want);
}

Test(nn_grad, cross_entropy) { check_cross_entropy(5, 0, (const int32_t[6]){0, 4, 2, 2, 1, 3}); }

/* Classes 5 and 6 are padding; target 4, the last real class, appears. */
Test(nn_grad, cross_entropy_padded_classes) {
    check_cross_entropy(7, 5, (const int32_t[6]){4, 0, 2, 4, 1, 3});
}

/* --- reshaping -------------------------------------------------------------------------------- */

Test(nn_grad, split) {
    grad_case c;
    case_begin(&c);
    mw_tensor *x = case_param(&c, "x", MW_AXES({"A", 2}, {"B", 6}, {"C", 2}), 1.0f);
    case_check(&c, mw_split(c.g, x, "B", "P=2,Q"));
    expect_grad_is_r(&c, "x");
}

Test(nn_grad, merge) {
    grad_case c;
    case_begin(&c);
    mw_tensor *x = case_param(&c, "x", MW_AXES({"A", 2}, {"B", 3}, {"C", 2}), 1.0f);
    case_check(&c, mw_merge(c.g, x, "B,C", "BC"));
    expect_grad_is_r(&c, "x");
}

Test(nn_grad, rename) {
    grad_case c;
    case_begin(&c);
    mw_tensor *x = case_param(&c, "x", MW_AXES({"A", 3}, {"B", 4}), 1.0f);
    case_check(&c, mw_rename(c.g, x, "B", "C"));
    expect_grad_is_r(&c, "x");
}

/* A split and a merge back (GPT-2's heads) is the identity. */
Test(nn_grad, split_then_merge) {
    grad_case c;
    case_begin(&c);
    mw_tensor *x = case_param(&c, "x", MW_AXES({"Seq", 2}, {"Embed", 12}), 1.0f);
    mw_tensor *h = mw_split(c.g, x, "Embed", "Head=3,HeadDim=4");
    case_check(&c, mw_merge(c.g, h, "Head,HeadDim", "Embed"));
    expect_grad_is_r(&c, "x");
}

/* x [A=3, Ctx=6], rows [1, 4) of Ctx as Seq: the gradient is r inside, exactly zero outside. */
Test(nn_grad, slice) {
    grad_case c;
    case_begin(&c);
    mw_tensor *x = case_param(&c, "x", MW_AXES({"A", 3}, {"Ctx", 6}), 1.0f);
    case_check(&c, mw_slice(c.g, x, "Ctx", 1, 3, "Seq"));
    leaf *p = &c.param[0], *r = find_leaf(c.input, c.ninputs, "r");
    for (int a = 0; a < 3; a++)
        for (int j = 0; j < 6; j++) {
            float want = j >= 1 && j < 4 ? r->data[a * 3 + (j - 1)] : 0.0f;
            cr_assert_eq(p->grad[a * 6 + j], want, "x[%d][%d]: %g, want %g", a, j,
                         p->grad[a * 6 + j], want);
        }
}

/* x [A=3, B=4, C=2], B = 2 selected (B dropped): r at B = 2, exactly zero elsewhere. */
Test(nn_grad, select) {
    grad_case c;
    case_begin(&c);
    mw_tensor *x = case_param(&c, "x", MW_AXES({"A", 3}, {"B", 4}, {"C", 2}), 1.0f);
    case_check(&c, mw_select(c.g, x, "B", 2));
    leaf *p = &c.param[0], *r = find_leaf(c.input, c.ninputs, "r");
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 4; b++)
            for (int k = 0; k < 2; k++) {
                float want = b == 2 ? r->data[a * 2 + k] : 0.0f;
                cr_assert_eq(p->grad[(a * 4 + b) * 2 + k], want, "x[%d][%d][%d]", a, b, k);
            }
}

/* GPT-2's qkv: [Seq, QKV=18] split into Part=3 x Head=2 x HeadDim=3, the key part selected from
 * the middle, heads merged back: the gradient is zero in the q and v columns. */
Test(nn_grad, select_part_of_split_axis) {
    grad_case c;
    case_begin(&c);
    mw_tensor *x = case_param(&c, "x", MW_AXES({"Seq", 2}, {"QKV", 18}), 1.0f);
    mw_tensor *parts = mw_split(c.g, x, "QKV", "Part=3,Head=2,HeadDim=3");
    case_check(&c, mw_merge(c.g, mw_select(c.g, parts, "Part", 1), "Head,HeadDim", "Embed"));
    leaf *p = &c.param[0], *r = find_leaf(c.input, c.ninputs, "r");
    for (int s = 0; s < 2; s++)
        for (int j = 0; j < 18; j++) {
            float want = j >= 6 && j < 12 ? r->data[s * 6 + (j - 6)] : 0.0f;
            cr_assert_eq(p->grad[s * 18 + j], want, "x[%d][%d]", s, j);
        }
}

/* --- contractions and GPT-2 blocks ------------------------------------------------------------ */

/* Attention scores: q [Batch, Seq, Head, HeadDim] . k [Batch, Key, Head, HeadDim] over HeadDim,
 * with Batch and Head as batch axes, in the order GPT-2 asks for. */
Test(nn_grad, contract_attention_scores) {
    grad_case c;
    case_begin(&c);
    mw_tensor *q =
        case_param(&c, "q", MW_AXES({"Batch", 2}, {"Seq", 3}, {"Head", 2}, {"HeadDim", 2}), 1.0f);
    mw_tensor *k =
        case_param(&c, "k", MW_AXES({"Batch", 2}, {"Key", 3}, {"Head", 2}, {"HeadDim", 2}), 1.0f);
    case_check(&c, mw_contract(c.g, q, k, "Batch,Head,Seq,Key"));
}

/* Attention output: p [Batch, Head, Seq, Key] . v [Batch, Key, Head, HeadDim] over Key. */
Test(nn_grad, contract_attention_values) {
    grad_case c;
    case_begin(&c);
    mw_tensor *p =
        case_param(&c, "p", MW_AXES({"Batch", 2}, {"Head", 2}, {"Seq", 3}, {"Key", 3}), 1.0f);
    mw_tensor *v =
        case_param(&c, "v", MW_AXES({"Batch", 2}, {"Key", 3}, {"Head", 2}, {"HeadDim", 2}), 1.0f);
    case_check(&c, mw_contract(c.g, p, v, "Batch,Seq,Head,HeadDim"));
}

/* y = x . W^T + b over named axes: W [Out, In], b [Out] broadcast over Batch. */
Test(nn_grad, linear_with_bias) {
    grad_case c;
    case_begin(&c);
    mw_tensor *x = case_param(&c, "x", MW_AXES({"Batch", 3}, {"In", 4}), 1.0f);
    mw_tensor *w = case_param(&c, "w", MW_AXES({"Out", 5}, {"In", 4}), 1.0f);
    mw_tensor *b = case_param(&c, "b", MW_AXES({"Out", 5}), 1.0f);
    case_check(&c, mw_add(c.g, mw_dot(c.g, x, w, "In"), b));
}

/* A residual block's output as gpt2_model.c traces it: x + rename(h . W^T + b, Out -> Embed),
 * which the plan computes as one GEMM onto b + x. */
Test(nn_grad, residual_linear_with_bias) {
    grad_case c;
    case_begin(&c);
    mw_tensor *x = case_param(&c, "x", MW_AXES({"Batch", 3}, {"Embed", 4}), 1.0f);
    mw_tensor *h = case_param(&c, "h", MW_AXES({"Batch", 3}, {"Hidden", 5}), 1.0f);
    mw_tensor *w = case_param(&c, "w", MW_AXES({"Out", 4}, {"Hidden", 5}), 1.0f);
    mw_tensor *b = case_param(&c, "b", MW_AXES({"Out", 4}), 1.0f);
    mw_tensor *y = mw_add(c.g, mw_dot(c.g, h, w, "Hidden"), b);
    case_check(&c, mw_add(c.g, x, mw_rename(c.g, y, "Out", "Embed")));
}

/* An addend the GEMM's epilogue cannot read (one value per row, not per column, nor laid out
 * like C): put into C first, then the product is added onto it (beta 1). */
Test(nn_grad, linear_with_row_addend) {
    grad_case c;
    case_begin(&c);
    mw_tensor *x = case_param(&c, "x", MW_AXES({"Batch", 3}, {"In", 4}), 1.0f);
    mw_tensor *w = case_param(&c, "w", MW_AXES({"Out", 5}, {"In", 4}), 1.0f);
    mw_tensor *a = case_param(&c, "a", MW_AXES({"Batch", 3}), 1.0f);
    case_check(&c, mw_add(c.g, mw_dot(c.g, x, w, "In"), a));
}

/* An addend and a residual of the same kind (both laid out like C), which the GEMM's epilogue
 * takes one of at most: they are summed into C before the GEMM adds onto it. */
Test(nn_grad, residual_with_full_addend) {
    grad_case c;
    case_begin(&c);
    mw_tensor *x = case_param(&c, "x", MW_AXES({"Batch", 3}, {"Embed", 4}), 1.0f);
    mw_tensor *h = case_param(&c, "h", MW_AXES({"Batch", 3}, {"Hidden", 5}), 1.0f);
    mw_tensor *w = case_param(&c, "w", MW_AXES({"Out", 4}, {"Hidden", 5}), 1.0f);
    mw_tensor *b = case_param(&c, "b", MW_AXES({"Batch", 3}, {"Out", 4}), 1.0f);
    mw_tensor *y = mw_add(c.g, mw_dot(c.g, h, w, "Hidden"), b);
    case_check(&c, mw_add(c.g, x, mw_rename(c.g, y, "Out", "Embed")));
}

/* Causal multi-head self-attention as gpt2_model.c traces it, from qkv [Batch, Seq, QKV]:
 * split, select q, k, v, rename Seq to Key, scores, causal softmax, values, merge heads. */
Test(nn_grad, causal_self_attention) {
    grad_case c;
    case_begin(&c);
    mw_graph *g = c.g;
    mw_tensor *qkv = case_param(&c, "qkv", MW_AXES({"Batch", 2}, {"Seq", 3}, {"QKV", 12}), 1.0f);
    mw_tensor *parts = mw_split(g, qkv, "QKV", "Part=3,Head=2,HeadDim=2");
    mw_tensor *q = mw_select(g, parts, "Part", 0);
    mw_tensor *k = mw_rename(g, mw_select(g, parts, "Part", 1), "Seq", "Key");
    mw_tensor *v = mw_rename(g, mw_select(g, parts, "Part", 2), "Seq", "Key");
    mw_tensor *s = mw_contract(g, q, k, "Batch,Head,Seq,Key");
    mw_tensor *pr = mw_causal_softmax(g, s, "Seq", "Key", 1.0f / sqrtf(2.0f));
    mw_tensor *y = mw_contract(g, pr, v, "Batch,Seq,Head,HeadDim");
    case_check(&c, mw_merge(g, y, "Head,HeadDim", "Embed"));
}

/* The fused kernel on the same layout: qkv [Batch, Seq, Part, Head, HeadDim], causal or not. */
static void check_fused_attention(int causal) {
    grad_case c;
    case_begin(&c);
    mw_graph *g = c.g;
    mw_tensor *qkv = case_param(&c, "qkv", MW_AXES({"Batch", 2}, {"Seq", 5}, {"QKV", 12}), 1.0f);
    mw_tensor *parts = mw_split(g, qkv, "QKV", "Part=3,Head=2,HeadDim=2");
    mw_tensor *y = mw_attention(g, parts, "Part", "Seq", "HeadDim", causal, 1.0f / sqrtf(2.0f));
    case_check(&c, mw_merge(g, y, "Head,HeadDim", "Embed"));
}

Test(nn_grad, fused_attention_causal) { check_fused_attention(1); }

Test(nn_grad, fused_attention_full) { check_fused_attention(0); }

/* A pre-LN residual block, x + gelu(ln(x) . W^T + b), renamed back to x's axes: x reaches the
 * output twice, once through the residual add. */
Test(nn_grad, residual_block) {
    grad_case c;
    case_begin(&c);
    c.tol_scale = 2.0; /* through a layer norm, as in the layernorm test */
    mw_graph *g = c.g;
    mw_tensor *x = case_param(&c, "x", MW_AXES({"Seq", 3}, {"Embed", 4}), 1.0f);
    mw_tensor *lw = case_param(&c, "lnw", MW_AXES({"Embed", 4}), 1.0f);
    mw_tensor *lb = case_param(&c, "lnb", MW_AXES({"Embed", 4}), 1.0f);
    mw_tensor *w = case_param(&c, "w", MW_AXES({"Out", 4}, {"Embed", 4}), 0.5f);
    mw_tensor *b = case_param(&c, "b", MW_AXES({"Out", 4}), 0.5f);
    mw_tensor *h = mw_layernorm(g, x, lw, lb, "Embed", 1e-5f);
    h = mw_gelu(g, mw_add(g, mw_dot(g, h, w, "Embed"), b));
    case_check(&c, mw_add(g, x, mw_rename(g, h, "Out", "Embed")));
}

/* GPT-2's tied head: one table is both the embedding and the output projection,
 * loss = sum(r * xent(embedding(ids) . table)). Its gradient must be the sum of the two uses',
 * which the same graph with two separate tables of the same values gives. */
static mw_tensor *tied_model(grad_case *c, int separate, const float *values,
                             const int32_t *targets) {
    static const int32_t ids[5] = {3, 1, 3, 0, 3};
    mw_graph *g = c->g;
    mw_tensor *in = case_param_values(c, "wte", MW_AXES({"Vocab", 6}, {"Embed", 4}), values);
    mw_tensor *out =
        separate ? case_param_values(c, "head", MW_AXES({"Vocab", 6}, {"Embed", 4}), values) : in;
    mw_tensor *t = case_ids(c, "ids", MW_AXES({"Tok", 5}), ids);
    mw_tensor *y = case_ids(c, "targets", MW_AXES({"Tok", 5}), targets);
    mw_tensor *logits = mw_dot(g, mw_embedding(g, in, t, "Vocab"), out, "Embed");
    return mw_cross_entropy(g, logits, y, "Vocab", 5); /* row 5 is padding */
}

Test(nn_grad, tied_parameter_used_twice) {
    static const int32_t targets[5] = {1, 3, 0, 4, 2};
    float values[24];
    uint64_t rng = 7;
    for (int i = 0; i < 24; i++) values[i] = (float)uniform(&rng);

    grad_case tied, split;
    case_begin(&tied);
    case_check(&tied, tied_model(&tied, 0, values, targets));
    case_begin(&split);
    case_run(&split, tied_model(&split, 1, values, targets), 0);

    /* Both graphs feed the same r (same generator, same order of draws). */
    leaf *t = &tied.param[0], *in = &split.param[0], *out = &split.param[1];
    int both = 0;
    for (int i = 0; i < 24; i++) {
        double want = (double)in->grad[i] + out->grad[i];
        /* One f32 addition of terms of order one: a few ulps. */
        cr_assert_leq(fabs(t->grad[i] - want), 1e-6 * (1.0 + fabs(want)),
                      "wte[%d]: tied %.9g, embedding %.9g + head %.9g", i, t->grad[i], in->grad[i],
                      out->grad[i]);
        both += in->grad[i] != 0.0f && out->grad[i] != 0.0f;
    }
    cr_assert_geq(both, 8, "rows used by both the lookup and the head: each use contributes");
    /* Row 5 is padding and never looked up: no gradient from either use. */
    for (int i = 20; i < 24; i++) cr_assert_eq(t->grad[i], 0.0f, "padded row, wte[%d]", i);
}

/* --- errors of the rules ---------------------------------------------------------------------- */

TestSuite(nn_errors, .description = "errors of the NN and reshaping ops' rules", .timeout = 60);

static void expect_trace_error(mw_graph *g, mw_tensor *t, mw_status want, const char *needle1,
                               const char *needle2) {
    cr_assert_null(t, "the op should fail with %s", mw_status_name(want));
    cr_assert_eq(mw_graph_status(g), want, "%s, not %s: %s", mw_status_name(mw_graph_status(g)),
                 mw_status_name(want), mw_graph_error(g));
    const char *msg = mw_graph_error(g);
    cr_assert_not_null(strstr(msg, needle1), "message '%s' lacks '%s'", msg, needle1);
    if (needle2) cr_assert_not_null(strstr(msg, needle2), "message '%s' lacks '%s'", msg, needle2);
    mw_graph_free(g);
}

static mw_graph *new_graph(void) {
    mw_graph *g = NULL;
    cr_assert_eq(mw_graph_new(&g), MW_OK, "%s", mw_last_error());
    return g;
}

/* Layer norm, softmax and cross-entropy normalise over the last axis only. */
Test(nn_errors, normalising_over_a_non_last_axis) {
    mw_graph *g = new_graph();
    mw_tensor *x = mw_param(g, "x", MW_AXES({"Row", 3}, {"Dim", 4}), MW_INIT_ZEROS);
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Row", 3}), MW_INIT_ZEROS);
    mw_tensor *b = mw_param(g, "b", MW_AXES({"Row", 3}), MW_INIT_ZEROS);
    expect_trace_error(g, mw_layernorm(g, x, w, b, "Row", 1e-5f), MW_ERR_SHAPE, "mw_layernorm",
                       "last axis");

    g = new_graph();
    x = mw_param(g, "x", MW_AXES({"Row", 3}, {"Dim", 4}), MW_INIT_ZEROS);
    expect_trace_error(g, mw_softmax(g, x, "Row", 1.0f), MW_ERR_SHAPE, "mw_softmax", "last axis");

    g = new_graph();
    x = mw_param(g, "x", MW_AXES({"Vocab", 5}, {"Row", 3}), MW_INIT_ZEROS);
    mw_tensor *t = mw_input(g, "t", MW_I32, MW_AXES({"Row", 3}));
    expect_trace_error(g, mw_cross_entropy(g, x, t, "Vocab", 0), MW_ERR_SHAPE, "mw_cross_entropy",
                       "last axis");

    /* Causal softmax: keys last, queries right before them. */
    g = new_graph();
    x = mw_param(g, "x", MW_AXES({"Query", 3}, {"Head", 2}, {"Key", 3}), MW_INIT_ZEROS);
    expect_trace_error(g, mw_causal_softmax(g, x, "Query", "Key", 1.0f), MW_ERR_SHAPE, "Query",
                       "right before");
}

/* Layer norm's gain and bias must have exactly the normalised axis. */
Test(nn_errors, layernorm_gain_with_other_axes) {
    mw_graph *g = new_graph();
    mw_tensor *x = mw_param(g, "x", MW_AXES({"Row", 3}, {"Dim", 4}), MW_INIT_ZEROS);
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Row", 3}, {"Dim", 4}), MW_INIT_ZEROS);
    mw_tensor *b = mw_param(g, "b", MW_AXES({"Dim", 4}), MW_INIT_ZEROS);
    expect_trace_error(g, mw_layernorm(g, x, w, b, "Dim", 1e-5f), MW_ERR_SHAPE, "mw_layernorm",
                       "Dim");
}

/* An input [Row=4, Batch=6] with Batch sharded over X: every op that needs Batch whole on one
 * device refuses it (one fresh graph per op: tracing errors are sticky). */
static mw_graph *sharded_graph(mw_tensor **x) {
    mw_graph *g = new_graph();
    *x = mw_shard(g, mw_input(g, "x", MW_F32, MW_AXES({"Row", 4}, {"Batch", 6})), "Batch", "X");
    cr_assert_not_null(*x, "%s", mw_graph_error(g));
    return g;
}

Test(nn_errors, sharded_axis_where_the_op_needs_it_whole) {
    mw_tensor *x;
    mw_graph *g = sharded_graph(&x);
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Batch", 6}), MW_INIT_ZEROS);
    expect_trace_error(g, mw_layernorm(g, x, w, w, "Batch", 1e-5f), MW_ERR_SHARDING, "mw_layernorm",
                       "sharded");

    g = sharded_graph(&x);
    expect_trace_error(g, mw_softmax(g, x, "Batch", 1.0f), MW_ERR_SHARDING, "mw_softmax", "Batch");
    g = sharded_graph(&x);
    expect_trace_error(g, mw_causal_softmax(g, x, "Row", "Batch", 1.0f), MW_ERR_SHARDING,
                       "mw_causal_softmax", "Batch");
    g = sharded_graph(&x);
    expect_trace_error(g, mw_split(g, x, "Batch", "P=2,Q=3"), MW_ERR_SHARDING, "mw_split", "Batch");
    g = sharded_graph(&x);
    expect_trace_error(g, mw_merge(g, x, "Row,Batch", "RB"), MW_ERR_SHARDING, "mw_merge", "Batch");
    g = sharded_graph(&x);
    expect_trace_error(g, mw_rename(g, x, "Batch", "B"), MW_ERR_SHARDING, "mw_rename", "Batch");
    g = sharded_graph(&x);
    expect_trace_error(g, mw_slice(g, x, "Batch", 0, 2, NULL), MW_ERR_SHARDING, "mw_slice",
                       "Batch");
    g = sharded_graph(&x);
    expect_trace_error(g, mw_select(g, x, "Batch", 1), MW_ERR_SHARDING, "mw_select", "Batch");

    /* Classes sharded: the softmax of cross-entropy needs every class of a row. */
    g = sharded_graph(&x);
    mw_tensor *t = mw_input(g, "t", MW_I32, MW_AXES({"Row", 4}));
    expect_trace_error(g, mw_cross_entropy(g, x, t, "Batch", 0), MW_ERR_SHARDING,
                       "mw_cross_entropy", "Batch");
}

/* Sharding the rows is fine, but logits and targets must be sharded alike. */
Test(nn_errors, cross_entropy_targets_sharded_differently) {
    mw_graph *g = new_graph();
    mw_tensor *logits = mw_shard(
        g, mw_input(g, "logits", MW_F32, MW_AXES({"Batch", 4}, {"Vocab", 5})), "Batch", "X");
    mw_tensor *t = mw_input(g, "t", MW_I32, MW_AXES({"Batch", 4}));
    expect_trace_error(g, mw_cross_entropy(g, logits, t, "Vocab", 0), MW_ERR_SHARDING,
                       "sharded differently", "mw_shard");
}

Test(nn_errors, cross_entropy_mismatched_target_axes) {
    /* A different axis name. */
    mw_graph *g = new_graph();
    mw_tensor *x = mw_param(g, "x", MW_AXES({"Seq", 3}, {"Vocab", 5}), MW_INIT_ZEROS);
    mw_tensor *t = mw_input(g, "t", MW_I32, MW_AXES({"Row", 3}));
    expect_trace_error(g, mw_cross_entropy(g, x, t, "Vocab", 0), MW_ERR_SHAPE, "targets",
                       "same order");
    /* The same axes in another order. */
    g = new_graph();
    x = mw_param(g, "x", MW_AXES({"Batch", 2}, {"Seq", 3}, {"Vocab", 5}), MW_INIT_ZEROS);
    t = mw_input(g, "t", MW_I32, MW_AXES({"Seq", 3}, {"Batch", 2}));
    expect_trace_error(g, mw_cross_entropy(g, x, t, "Vocab", 0), MW_ERR_SHAPE, "targets",
                       "same order");
    /* A different size. */
    g = new_graph();
    x = mw_param(g, "x", MW_AXES({"Seq", 3}, {"Vocab", 5}), MW_INIT_ZEROS);
    t = mw_input(g, "t", MW_I32, MW_AXES({"Seq", 4}));
    expect_trace_error(g, mw_cross_entropy(g, x, t, "Vocab", 0), MW_ERR_SHAPE, "targets", NULL);
    /* One axis too many. */
    g = new_graph();
    x = mw_param(g, "x", MW_AXES({"Seq", 3}, {"Vocab", 5}), MW_INIT_ZEROS);
    t = mw_input(g, "t", MW_I32, MW_AXES({"Seq", 3}, {"Vocab", 5}));
    expect_trace_error(g, mw_cross_entropy(g, x, t, "Vocab", 0), MW_ERR_SHAPE, "targets", NULL);
    /* f32 targets. */
    g = new_graph();
    x = mw_param(g, "x", MW_AXES({"Seq", 3}, {"Vocab", 5}), MW_INIT_ZEROS);
    t = mw_input(g, "t", MW_F32, MW_AXES({"Seq", 3}));
    expect_trace_error(g, mw_cross_entropy(g, x, t, "Vocab", 0), MW_ERR_DTYPE, "targets", "i32");
    /* More valid classes than the axis has. */
    g = new_graph();
    x = mw_param(g, "x", MW_AXES({"Seq", 3}, {"Vocab", 5}), MW_INIT_ZEROS);
    t = mw_input(g, "t", MW_I32, MW_AXES({"Seq", 3}));
    expect_trace_error(g, mw_cross_entropy(g, x, t, "Vocab", 6), MW_ERR_SHAPE, "6 valid", "Vocab");
}

Test(nn_errors, embedding_table_layout) {
    /* The vocabulary must be the table's first axis. */
    mw_graph *g = new_graph();
    mw_tensor *table = mw_param(g, "table", MW_AXES({"Dim", 3}, {"Vocab", 5}), MW_INIT_ZEROS);
    mw_tensor *ids = mw_input(g, "ids", MW_I32, MW_AXES({"Tok", 4}));
    expect_trace_error(g, mw_embedding(g, table, ids, "Vocab"), MW_ERR_SHAPE, "mw_embedding",
                       "Vocab");
    /* f32 ids. */
    g = new_graph();
    table = mw_param(g, "table", MW_AXES({"Vocab", 5}, {"Dim", 3}), MW_INIT_ZEROS);
    ids = mw_input(g, "ids", MW_F32, MW_AXES({"Tok", 4}));
    expect_trace_error(g, mw_embedding(g, table, ids, "Vocab"), MW_ERR_DTYPE, "ids", "i32");
    /* ids that already have the table's Dim axis. */
    g = new_graph();
    table = mw_param(g, "table", MW_AXES({"Vocab", 5}, {"Dim", 3}), MW_INIT_ZEROS);
    ids = mw_input(g, "ids", MW_I32, MW_AXES({"Dim", 4}));
    expect_trace_error(g, mw_embedding(g, table, ids, "Vocab"), MW_ERR_SHAPE, "mw_embedding",
                       "Dim");
}

/* A one-device trainer of loss = sum(r * op(...)) for the run-time errors below. */
typedef struct runner {
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
} runner;

static void runner_start(runner *rn, mw_tensor *out, mw_axes r_axes) {
    mw_graph *g = rn->g;
    mw_tensor *loss = mw_sum(g, mw_mul(g, out, mw_input(g, "r", MW_F32, r_axes)), NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &rn->mesh), MW_OK, "%s", mw_last_error());
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.5f}};
    cr_assert_eq(mw_trainer_new(g, loss, rn->mesh, &cfg, &rn->tr), MW_OK, "%s", mw_last_error());
}

static void runner_free(runner *rn) {
    mw_trainer_free(rn->tr);
    mw_mesh_free(rn->mesh);
    mw_graph_free(rn->g);
}

/* Every way of running the step fails with MW_ERR_INVALID and a message naming the bad value;
 * nothing is updated, and the trainer runs again with good values. */
static void expect_run_error(mw_trainer *tr, const char *ids_name, const int32_t *bad,
                             const int32_t *good, int64_t n, const float *r, int64_t nr,
                             const char *param, int64_t nparam, const char *needle1,
                             const char *needle2) {
    mw_feed feeds[2] = {{ids_name, bad, n}, {"r", r, nr}};
    float before[64], after[64], loss = 0.0f;
    cr_assert_leq(nparam, 64);
    cr_assert_eq(mw_trainer_read_param(tr, param, before, nparam), MW_OK, "%s", mw_last_error());
    for (int way = 0; way < 3; way++) {
        mw_status st = way == 0   ? mw_trainer_eval(tr, feeds, 2, &loss)
                       : way == 1 ? mw_trainer_compute_grads(tr, feeds, 2, &loss)
                                  : mw_trainer_step(tr, feeds, 2, &loss);
        cr_assert_eq(st, MW_ERR_INVALID, "way %d: %s", way, mw_status_name(st));
        const char *msg = mw_last_error();
        cr_assert_not_null(strstr(msg, needle1), "message '%s' lacks '%s'", msg, needle1);
        cr_assert_not_null(strstr(msg, needle2), "message '%s' lacks '%s'", msg, needle2);
    }
    cr_assert_eq(mw_trainer_read_param(tr, param, after, nparam), MW_OK, "%s", mw_last_error());
    cr_assert_arr_eq(before, after, sizeof(float) * (size_t)nparam, "a failed step changed %s",
                     param);
    cr_assert_eq(mw_trainer_steps(tr), 0);

    feeds[0].data = good;
    cr_assert_eq(mw_trainer_step(tr, feeds, 2, &loss), MW_OK, "%s", mw_last_error());
    cr_assert(isfinite(loss));
    cr_assert_eq(mw_trainer_steps(tr), 1);
}

Test(nn_errors, embedding_id_out_of_range_at_run_time) {
    static const float r[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    static const int32_t good[4] = {0, 4, 2, 4};
    runner rn = {.g = new_graph()};
    mw_tensor *table = mw_param(rn.g, "table", MW_AXES({"Vocab", 5}, {"Dim", 2}), MW_INIT_CONST(1));
    mw_tensor *ids = mw_input(rn.g, "ids", MW_I32, MW_AXES({"Tok", 4}));
    runner_start(&rn, mw_embedding(rn.g, table, ids, "Vocab"), MW_AXES({"Tok", 4}, {"Dim", 2}));
    /* The vocabulary's size itself, at position 2. */
    expect_run_error(rn.tr, "ids", (const int32_t[4]){0, 1, 5, 3}, good, 4, r, 8, "table", 10,
                     "embedding id 5", "[0, 5)");
    runner_free(&rn);

    rn = (runner){.g = new_graph()};
    table = mw_param(rn.g, "table", MW_AXES({"Vocab", 5}, {"Dim", 2}), MW_INIT_CONST(1));
    ids = mw_input(rn.g, "ids", MW_I32, MW_AXES({"Tok", 4}));
    runner_start(&rn, mw_embedding(rn.g, table, ids, "Vocab"), MW_AXES({"Tok", 4}, {"Dim", 2}));
    expect_run_error(rn.tr, "ids", (const int32_t[4]){-1, 1, 2, 3}, good, 4, r, 8, "table", 10,
                     "embedding id -1", "at [0] (element 0) of input 'ids'");
    runner_free(&rn);
}

Test(nn_errors, cross_entropy_target_out_of_range_at_run_time) {
    static const float r[3] = {1, 2, 3};
    static const int32_t good[3] = {0, 3, 2};
    const int32_t *bad[3] = {(const int32_t[3]){0, 4, 1},   /* a padded class */
                             (const int32_t[3]){0, 1, 7},   /* beyond the axis */
                             (const int32_t[3]){-2, 1, 1}}; /* negative */
    static const char *needle[3] = {"target 4", "target 7", "target -2"};
    for (int k = 0; k < 3; k++) {
        runner rn = {.g = new_graph()};
        mw_tensor *logits =
            mw_param(rn.g, "logits", MW_AXES({"Row", 3}, {"Vocab", 6}), MW_INIT_NORMAL(1));
        mw_tensor *t = mw_input(rn.g, "targets", MW_I32, MW_AXES({"Row", 3}));
        runner_start(&rn, mw_cross_entropy(rn.g, logits, t, "Vocab", 4), MW_AXES({"Row", 3}));
        expect_run_error(rn.tr, "targets", bad[k], good, 3, r, 3, "logits", 18, needle[k],
                         "[0, 4)");
        runner_free(&rn);
    }
}
