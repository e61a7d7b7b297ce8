/* Analytic gradients against central finite differences, for the Criterion suites.
 *
 * Two levels:
 *   fd_difference    one element's central difference (L(p + h) - L(p - h)) / (p+ - p-),
 *                    computed in double from two f32 losses of a trainer, dividing by the
 *                    perturbation as stored in f32 rather than by the nominal 2h;
 *   fd_case          a small graph whose differentiable leaves are parameters, reduced to
 *                    L = sum(out * r) with r a fed input of fixed random weights (every output
 *                    element reaches the loss with its own weight, so a gradient routed to the
 *                    wrong element, or summed over the wrong axis, changes L's gradient), on a
 *                    trainer on "cpu:1"; fd_run compares every element of every parameter's
 *                    gradient with its central difference.
 *
 * Error of a central difference, and the tolerances FD_ATOL and FD_RTOL.
 *
 * Rounding: the forward pass runs in f32 (u = 2^-24 = 6e-8). The losses of an fd_case are sums
 * of at most ~50 terms out_i r_i with |r_i| < 1 and |out_i| of order one (a few for the larger
 * ops), so one evaluation of L is off by about sqrt(n) u sum|terms| <~ 7 * 6e-8 * 20 = 1e-5 at
 * worst; the difference divides the difference of two evaluations by 2h, giving <~ 1e-5 / h =
 * 1e-3 for h = FD_STEP = 1e-2, and typically far less (the rounding of the two evaluations is
 * the same except near the perturbed element).
 *
 * Truncation: h^2 / 6 |d^3 L / dp^3|. Zero for ops linear or quadratic in each parameter (sums,
 * products, contractions, relabels, slices, lookups); for the smooth nonlinear ops the third
 * derivative is of order one at the suites' values (GELU: |gelu'''| < 1; softmax and
 * cross-entropy: a few times scale^3; layer norm: rstd^3 with rows of standard deviation near
 * one; tanh, exp, log, sqrt on the ranges test_ops_math.c uses: < 8), so h = 1e-2 costs at most
 * ~2e-4; a / b with |b| >= 1 at most h^2 |a r| <= 3e-4.
 *
 * Hence |analytic - numeric| <= FD_ATOL + FD_RTOL |numeric| with FD_ATOL = FD_RTOL = 1e-3, the
 * worst-case rounding estimate, while a wrong gradient (a missing term, a transposed or
 * mis-broadcast one, a missing factor of a scale) is off by O(0.1 - 1). Layer norm divides by a
 * row's standard deviation, whose derivative amplifies the rounding of the two evaluations: a
 * case through one sets tol_scale = 2. Measured over test_grad.c, test_nn_grad.c and
 * test_ops_math.c: every error is below 6% of its bound (the largest: 4.9e-4 on a gradient of
 * 3.3 and 1.3e-4 on one of 0.08, through the layer norm of test_nn_grad.c's residual block;
 * 1.4e-4 on a divisor's gradient of 1.5). Other models derive their own tolerances for
 * fd_difference (test_gpt2.c: a whole model). */
#ifndef MW_TESTS_COMMON_FD_GRAD_H
#define MW_TESTS_COMMON_FD_GRAD_H

#include <stdint.h>

#include "meshwit.h"

#define FD_STEP 1e-2
#define FD_ATOL 1e-3
#define FD_RTOL 1e-3

#define FD_MAX_LEAVES 6
#define FD_MAX_ELEMS 192

/* The central difference of the loss in element i of parameter `name`, whose count current
 * values are `values` (the trainer's copy holds them too): the parameter is written with element
 * i at values[i] + h and at values[i] - h (rounded to f32), the loss evaluated at each, and both
 * it and `values` are as before on return. Losses come from mw_trainer_eval, or from
 * mw_trainer_compute_grads with train_pass set (the training pass: dropout draws its mask).
 * Asserts on every call. */
double fd_difference(mw_trainer *tr, const mw_feed *feeds, int nfeeds, int train_pass,
                     const char *name, float *values, int64_t count, int64_t i, double h);

/* Asserts |analytic - numeric| <= atol + rtol |numeric| for d loss / d name[i]. */
void fd_expect_close(const char *name, int64_t i, double analytic, double numeric, double atol,
                     double rtol);

/* How a parameter of an fd_case starts. */
typedef enum fd_start {
    FD_START_INIT,          /* the graph's initialiser, MW_INIT_NORMAL(std) */
    FD_START_VALUES,        /* the leaf's data, written into the trainer */
    FD_START_AWAY_FROM_ZERO /* drawn from the case's rng when the trainer is made, with
                               1 <= |value| < 2 (a divisor) */
} fd_start;

typedef struct fd_leaf {
    char name[MW_MAX_NAME];
    int64_t count;
    int is_ids;                /* input: i32 ids (ids), else f32 (data) */
    fd_start start;            /* parameter */
    float data[FD_MAX_ELEMS];  /* f32 input: the values fed at every step; parameter: see start */
    int32_t ids[FD_MAX_ELEMS]; /* i32 input: the ids fed at every step */
    float grad[FD_MAX_ELEMS];  /* parameter: the analytic gradient, after fd_run */
    float value[FD_MAX_ELEMS]; /* parameter: its value, after fd_run */
} fd_leaf;

typedef struct fd_case {
    mw_graph *g;
    uint64_t rng;     /* SplitMix64 state (tests/common/rng.h): inputs, away-from-zero values */
    double tol_scale; /* multiplies FD_ATOL and FD_RTOL; 1 unless the case says why */
    int train_pass;   /* losses from mw_trainer_compute_grads, not mw_trainer_eval */
    int read_out;     /* fd_run reads out's values into out (out becomes a trainer output) */
    int nparams, ninputs;
    fd_leaf param[FD_MAX_LEAVES];
    fd_leaf input[FD_MAX_LEAVES];
    int64_t nout;
    float out[FD_MAX_ELEMS]; /* with read_out: out at the parameters' values, after fd_run */
} fd_case;

/* Starts a case: a new graph, the rng at seed, tol_scale 1. */
void fd_begin(fd_case *c, uint64_t seed);

/* A parameter drawn from N(0, std^2) by the graph's initialiser. */
mw_tensor *fd_param(fd_case *c, const char *name, mw_axes axes, float std);

/* A parameter that starts at `values` (numel(axes) of them, copied). */
mw_tensor *fd_param_values(fd_case *c, const char *name, mw_axes axes, const float *values);

/* A parameter drawn away from zero (FD_START_AWAY_FROM_ZERO): a divisor. */
mw_tensor *fd_param_away_from_zero(fd_case *c, const char *name, mw_axes axes);

/* An f32 input fed with values drawn uniform in [-1, 1) from the case's rng, now. */
mw_tensor *fd_input(fd_case *c, const char *name, mw_axes axes);

/* An i32 input fed with `ids` (numel(axes) of them, copied). */
mw_tensor *fd_ids(fd_case *c, const char *name, mw_axes axes, const int32_t *ids);

/* The leaf of `list` (a case's param or input) named `name`; fails the test if there is none. */
fd_leaf *fd_find(fd_leaf *list, int n, const char *name);

/* Makes L = sum(out * r) (r: the input "r", drawn here), a trainer on one CPU device, computes
 * the analytic gradients into each parameter's leaf and, with finite_differences set, checks
 * every element against fd_difference within (FD_ATOL + FD_RTOL |numeric|) * tol_scale. Frees
 * the graph, mesh and trainer (c->g is NULL after), keeps the leaves; returns L. */
double fd_run(fd_case *c, mw_tensor *out, int finite_differences);

/* fd_run with the finite differences. */
void fd_check(fd_case *c, mw_tensor *out);

/* Asserts that parameter `param`'s gradient is r itself, bit for bit: the gradient of an op
 * that only relabels its input (the same elements in the same memory order). */
void fd_expect_grad_is_r(fd_case *c, const char *param);

#endif
