/* Gradients of every op against central finite differences.
 *
 * Each test traces a small graph whose leaves are parameters (random, deterministic initial
 * values), applies one op, and reduces the result to the scalar loss L = sum(out * r), where r is a
 * fed input of fixed random weights, so that every output element reaches the loss with its own
 * weight (a gradient sent to the wrong element, or summed over the wrong axis, changes L's
 * gradient). The analytic gradient from mw_trainer_compute_grads is compared, element by element,
 * with (L(p + h) - L(p - h)) / (2h) computed in double from two mw_trainer_eval calls. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "meshwit.h"

/* Tolerances of |analytic - numeric| <= ATOL + RTOL * |numeric|.
 *
 * The forward pass runs in f32 (unit roundoff u = 2^-24 = 6e-8). The losses here have at most a
 * few dozen terms of order one, so each evaluation of L carries a rounding error of about
 * sqrt(n) * u * sum|terms| ~ 1e-5; the central difference divides the difference of two such
 * evaluations by 2h, giving ~1e-5 / h = 1e-3 with h = 1e-2. The truncation error of a central
 * difference is h^2 / 6 * |L'''|: zero for every op here that is linear or quadratic in each
 * parameter (all but div), and at most h^2 * |a * r| <= 3e-4 for a / b with |b| >= 1. The largest
 * error measured over this suite is about 2% of the bound; a wrong gradient (a missing term, a
 * transposed or mis-broadcast one) is off by O(1). The neural-network and reshaping ops have
 * their own suite (test_nn_grad.c). */
#define STEP 1e-2
#define ATOL 3e-3
#define RTOL 3e-3

#define MAX_LEAVES 4
#define MAX_ELEMS 128

typedef struct leaf {
    char name[MW_MAX_NAME];
    int64_t count;
    int away_from_zero;    /* parameter used as a divisor: rewritten with 1 <= |value| <= 2 */
    float data[MAX_ELEMS]; /* input: the values fed at every step */
} leaf;

typedef struct grad_case {
    mw_graph *g;
    uint64_t rng;
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
    c->rng = 20240611;
    cr_assert_eq(mw_graph_new(&c->g), MW_OK, "%s", mw_last_error());
}

static leaf *add_leaf(leaf *list, int *n, const char *name, int64_t count) {
    cr_assert_lt(*n, MAX_LEAVES);
    cr_assert_leq(count, MAX_ELEMS, "%s has %lld elements", name, (long long)count);
    leaf *l = &list[(*n)++];
    strncpy(l->name, name, sizeof l->name - 1);
    l->count = count;
    return l;
}

static mw_tensor *case_param(grad_case *c, const char *name, mw_axes axes, int away_from_zero) {
    mw_tensor *p = mw_param(c->g, name, axes, MW_INIT_NORMAL(1.0f));
    cr_assert_not_null(p, "mw_param(%s): %s", name, mw_graph_error(c->g));
    add_leaf(c->param, &c->nparams, name, mw_tensor_numel(p))->away_from_zero = away_from_zero;
    return p;
}

static mw_tensor *case_input(grad_case *c, const char *name, mw_axes axes) {
    mw_tensor *x = mw_input(c->g, name, MW_F32, axes);
    cr_assert_not_null(x, "mw_input(%s): %s", name, mw_graph_error(c->g));
    leaf *l = add_leaf(c->input, &c->ninputs, name, mw_tensor_numel(x));
    for (int64_t i = 0; i < l->count; i++) l->data[i] = (float)uniform(&c->rng);
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

/* Compares the analytic gradient of parameter p with central differences, then restores it. */
static void check_param(mw_trainer *tr, const mw_feed *feeds, int nfeeds, const leaf *p) {
    float grad[MAX_ELEMS], base[MAX_ELEMS], probe[MAX_ELEMS];
    int64_t n = p->count;
    cr_assert_eq(mw_trainer_read_grad(tr, p->name, grad, n), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_param(tr, p->name, base, n), MW_OK, "%s", mw_last_error());
    memcpy(probe, base, sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        /* Divide by the perturbation actually stored in f32, not by the nominal 2h. */
        probe[i] = (float)(base[i] + STEP);
        double up = probe[i];
        cr_assert_eq(mw_trainer_write_param(tr, p->name, probe, n), MW_OK, "%s", mw_last_error());
        double loss_up = eval_loss(tr, feeds, nfeeds);
        probe[i] = (float)(base[i] - STEP);
        double down = probe[i];
        cr_assert_eq(mw_trainer_write_param(tr, p->name, probe, n), MW_OK, "%s", mw_last_error());
        double loss_down = eval_loss(tr, feeds, nfeeds);
        probe[i] = base[i];

        double numeric = (loss_up - loss_down) / (up - down);
        double err = fabs((double)grad[i] - numeric);
        cr_assert_leq(err, ATOL + RTOL * fabs(numeric),
                      "d loss / d %s[%lld]: analytic %.7g, central difference %.7g (error %.3g)",
                      p->name, (long long)i, grad[i], numeric, err);
    }
    cr_assert_eq(mw_trainer_write_param(tr, p->name, base, n), MW_OK, "%s", mw_last_error());
}

/* Makes L = sum(out * r), a trainer on one CPU device, and checks every parameter's gradient. */
static void case_check(grad_case *c, mw_tensor *out) {
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
        if (!p->away_from_zero) continue;
        for (int64_t i = 0; i < p->count; i++) {
            double u = uniform(&c->rng);
            p->data[i] = (float)(u < 0 ? u - 1.0 : u + 1.0);
        }
        cr_assert_eq(mw_trainer_write_param(tr, p->name, p->data, p->count), MW_OK, "%s",
                     mw_last_error());
    }

    mw_feed feeds[MAX_LEAVES];
    for (int j = 0; j < c->ninputs; j++)
        feeds[j] = (mw_feed){c->input[j].name, c->input[j].data, c->input[j].count};
    float value = NAN;
    cr_assert_eq(mw_trainer_compute_grads(tr, feeds, c->ninputs, &value), MW_OK, "%s",
                 mw_last_error());
    cr_assert(isfinite(value));
    for (int j = 0; j < c->nparams; j++) check_param(tr, feeds, c->ninputs, &c->param[j]);

    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(c->g);
}

/* --- elementwise ------------------------------------------------------------------------------ */

typedef mw_tensor *(*binary_op)(mw_graph *, mw_tensor *, mw_tensor *);

#define AXES_AB MW_AXES({"A", 3}, {"B", 4})
#define AXES_BA MW_AXES({"B", 4}, {"A", 3})
#define AXES_ABC MW_AXES({"A", 3}, {"B", 4}, {"C", 2})
#define AXES_B MW_AXES({"B", 4})

/* b is the divisor of mw_div, so it is kept away from zero for every op (harmless elsewhere). */
static void check_binary(binary_op op, mw_axes a_axes, mw_axes b_axes) {
    grad_case c;
    case_begin(&c);
    mw_tensor *a = case_param(&c, "a", a_axes, 0);
    mw_tensor *b = case_param(&c, "b", b_axes, 1);
    case_check(&c, op(c.g, a, b));
}

TestSuite(grad, .description = "analytic gradients against central finite differences");

/* Same axes; same axes in another order; b broadcast along A and C; a broadcast along A and C. */
#define BINARY_TESTS(op)                                                                           \
    Test(grad, op##_same_axes) { check_binary(mw_##op, AXES_AB, AXES_AB); }                        \
    Test(grad, op##_other_order) { check_binary(mw_##op, AXES_AB, AXES_BA); }                      \
    Test(grad, op##_broadcast_second) { check_binary(mw_##op, AXES_ABC, AXES_B); }                 \
    Test(grad, op##_broadcast_first) { check_binary(mw_##op, AXES_B, AXES_ABC); }

BINARY_TESTS(add)
BINARY_TESTS(sub)
BINARY_TESTS(mul)
BINARY_TESTS(div)

Test(grad, scale) {
    grad_case c;
    case_begin(&c);
    case_check(&c, mw_scale(c.g, case_param(&c, "x", AXES_AB, 0), -2.5f));
}

/* --- contractions ----------------------------------------------------------------------------- */

static void check_dot(mw_axes a_axes, mw_axes b_axes, const char *axis) {
    grad_case c;
    case_begin(&c);
    mw_tensor *a = case_param(&c, "a", a_axes, 0);
    mw_tensor *b = case_param(&c, "b", b_axes, 0);
    case_check(&c, mw_dot(c.g, a, b, axis));
}

Test(grad, dot_matrix_vector) { check_dot(MW_AXES({"Row", 3}, {"K", 5}), MW_AXES({"K", 5}), "K"); }

Test(grad, dot_vector_matrix) { check_dot(MW_AXES({"K", 5}), MW_AXES({"K", 5}, {"Col", 3}), "K"); }

Test(grad, dot_matrix_matrix_shared_batch) {
    check_dot(MW_AXES({"Bt", 2}, {"Row", 3}, {"K", 4}), MW_AXES({"K", 4}, {"Bt", 2}, {"Col", 2}),
              "K");
}

Test(grad, dot_vector_vector) { check_dot(MW_AXES({"K", 5}), MW_AXES({"K", 5}), "K"); }

static void check_contract(mw_axes a_axes, mw_axes b_axes, const char *out_axes) {
    grad_case c;
    case_begin(&c);
    mw_tensor *a = case_param(&c, "a", a_axes, 0);
    mw_tensor *b = case_param(&c, "b", b_axes, 0);
    case_check(&c, mw_contract(c.g, a, b, out_axes));
}

/* K is summed; A is shared and kept; the output order is neither a's nor b's. */
Test(grad, contract_explicit_order) {
    check_contract(MW_AXES({"A", 2}, {"K", 3}, {"B", 4}), MW_AXES({"C", 2}, {"K", 3}, {"A", 2}),
                   "C,A,B");
}

/* Two summed axes, named in a different order in a and b. */
Test(grad, contract_two_summed_axes) {
    check_contract(MW_AXES({"A", 2}, {"K", 3}, {"L", 2}), MW_AXES({"L", 2}, {"C", 3}, {"K", 3}),
                   "C,A");
}

/* --- reductions ------------------------------------------------------------------------------- */

typedef mw_tensor *(*reduce_op)(mw_graph *, mw_tensor *, const char *);

static void check_reduce(reduce_op op, const char *axes) {
    grad_case c;
    case_begin(&c);
    case_check(&c, op(c.g, case_param(&c, "x", AXES_ABC, 0), axes));
}

Test(grad, sum_one_axis) { check_reduce(mw_sum, "B"); }
Test(grad, sum_two_axes) { check_reduce(mw_sum, "A,B"); }
Test(grad, sum_all) { check_reduce(mw_sum, NULL); }
Test(grad, mean_one_axis) { check_reduce(mw_mean, "B"); }
Test(grad, mean_two_axes) { check_reduce(mw_mean, "C,A"); }
Test(grad, mean_all) { check_reduce(mw_mean, NULL); }

/* --- compositions ----------------------------------------------------------------------------- */

/* mean((x . w + b - y)^2): dot, a broadcast scalar, sub, a squared error and a mean. */
Test(grad, linreg_loss) {
    grad_case c;
    case_begin(&c);
    mw_graph *g = c.g;
    mw_tensor *x = case_input(&c, "x", MW_AXES({"Batch", 6}, {"Feature", 3}));
    mw_tensor *y = case_input(&c, "y", MW_AXES({"Batch", 6}));
    mw_tensor *w = case_param(&c, "weights", MW_AXES({"Feature", 3}), 0);
    mw_tensor *b = case_param(&c, "bias", MW_SCALAR, 0);
    mw_tensor *err = mw_sub(g, mw_add(g, mw_dot(g, x, w, "Feature"), b), y);
    case_check(&c, mw_mean(g, mw_mul(g, err, err), NULL));
}

/* A parameter used as both operands: its gradient is the sum of both contributions (2 w r). */
Test(grad, param_used_twice) {
    grad_case c;
    case_begin(&c);
    mw_tensor *w = case_param(&c, "w", AXES_AB, 0);
    case_check(&c, mw_mul(c.g, w, w));
}

/* A parameter read by two different ops, one of them through a broadcast. */
Test(grad, param_used_by_two_ops) {
    grad_case c;
    case_begin(&c);
    mw_graph *g = c.g;
    mw_tensor *w = case_param(&c, "w", AXES_B, 0);
    mw_tensor *m = case_param(&c, "m", AXES_ABC, 0);
    case_check(&c, mw_add(g, mw_mul(g, m, w), mw_scale(g, w, 3.0f)));
}
