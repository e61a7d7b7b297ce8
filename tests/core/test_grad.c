/* Gradients of every op against central finite differences.
 *
 * Each test traces a small graph whose leaves are parameters (random, deterministic initial
 * values), applies one op, and checks the analytic gradient of L = sum(out * r) element by
 * element against central differences in double (tests/common/fd_grad.h: the method and the
 * tolerances FD_ATOL = FD_RTOL = 1e-3, derived there). The neural-network and reshaping ops have
 * their own suite (test_nn_grad.c). */
#include <criterion/criterion.h>

#include "meshwit.h"
#include "tests/common/fd_grad.h"

/* The seed of every case's inputs and away-from-zero parameters. */
#define SEED 20240611

/* --- elementwise ------------------------------------------------------------------------------ */

typedef mw_tensor *(*binary_op)(mw_graph *, mw_tensor *, mw_tensor *);

#define AXES_AB MW_AXES({"A", 3}, {"B", 4})
#define AXES_BA MW_AXES({"B", 4}, {"A", 3})
#define AXES_ABC MW_AXES({"A", 3}, {"B", 4}, {"C", 2})
#define AXES_B MW_AXES({"B", 4})

/* b is the divisor of mw_div, so it is kept away from zero for every op (harmless elsewhere). */
static void check_binary(binary_op op, mw_axes a_axes, mw_axes b_axes) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *a = fd_param(&c, "a", a_axes, 1.0f);
    mw_tensor *b = fd_param_away_from_zero(&c, "b", b_axes);
    fd_check(&c, op(c.g, a, b));
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
    fd_case c;
    fd_begin(&c, SEED);
    fd_check(&c, mw_scale(c.g, fd_param(&c, "x", AXES_AB, 1.0f), -2.5f));
}

/* --- contractions ----------------------------------------------------------------------------- */

static void check_dot(mw_axes a_axes, mw_axes b_axes, const char *axis) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *a = fd_param(&c, "a", a_axes, 1.0f);
    mw_tensor *b = fd_param(&c, "b", b_axes, 1.0f);
    fd_check(&c, mw_dot(c.g, a, b, axis));
}

Test(grad, dot_matrix_vector) { check_dot(MW_AXES({"Row", 3}, {"K", 5}), MW_AXES({"K", 5}), "K"); }

Test(grad, dot_vector_matrix) { check_dot(MW_AXES({"K", 5}), MW_AXES({"K", 5}, {"Col", 3}), "K"); }

Test(grad, dot_matrix_matrix_shared_batch) {
    check_dot(MW_AXES({"Bt", 2}, {"Row", 3}, {"K", 4}), MW_AXES({"K", 4}, {"Bt", 2}, {"Col", 2}),
              "K");
}

Test(grad, dot_vector_vector) { check_dot(MW_AXES({"K", 5}), MW_AXES({"K", 5}), "K"); }

static void check_contract(mw_axes a_axes, mw_axes b_axes, const char *out_axes) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *a = fd_param(&c, "a", a_axes, 1.0f);
    mw_tensor *b = fd_param(&c, "b", b_axes, 1.0f);
    fd_check(&c, mw_contract(c.g, a, b, out_axes));
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
    fd_case c;
    fd_begin(&c, SEED);
    fd_check(&c, op(c.g, fd_param(&c, "x", AXES_ABC, 1.0f), axes));
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
    fd_case c;
    fd_begin(&c, SEED);
    mw_graph *g = c.g;
    mw_tensor *x = fd_input(&c, "x", MW_AXES({"Batch", 6}, {"Feature", 3}));
    mw_tensor *y = fd_input(&c, "y", MW_AXES({"Batch", 6}));
    mw_tensor *w = fd_param(&c, "weights", MW_AXES({"Feature", 3}), 1.0f);
    mw_tensor *b = fd_param(&c, "bias", MW_SCALAR, 1.0f);
    mw_tensor *err = mw_sub(g, mw_add(g, mw_dot(g, x, w, "Feature"), b), y);
    fd_check(&c, mw_mean(g, mw_mul(g, err, err), NULL));
}

/* A parameter used as both operands: its gradient is the sum of both contributions (2 w r). */
Test(grad, param_used_twice) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *w = fd_param(&c, "w", AXES_AB, 1.0f);
    fd_check(&c, mw_mul(c.g, w, w));
}

/* A parameter read by two different ops, one of them through a broadcast. */
Test(grad, param_used_by_two_ops) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_graph *g = c.g;
    mw_tensor *w = fd_param(&c, "w", AXES_B, 1.0f);
    mw_tensor *m = fd_param(&c, "m", AXES_ABC, 1.0f);
    fd_check(&c, mw_add(g, mw_mul(g, m, w), mw_scale(g, w, 3.0f)));
}
