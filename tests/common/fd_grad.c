/* Analytic gradients against central finite differences (fd_grad.h). */
#include "fd_grad.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "rng.h"

static double loss_at(mw_trainer *tr, const mw_feed *feeds, int nfeeds, int train_pass) {
    float loss = NAN;
    mw_status st = train_pass ? mw_trainer_compute_grads(tr, feeds, nfeeds, &loss)
                              : mw_trainer_eval(tr, feeds, nfeeds, &loss);
    cr_assert_eq(st, MW_OK, "%s", mw_last_error());
    return loss;
}

static void write_param(mw_trainer *tr, const char *name, const float *values, int64_t count) {
    cr_assert_eq(mw_trainer_write_param(tr, name, values, count), MW_OK, "%s", mw_last_error());
}

double fd_difference(mw_trainer *tr, const mw_feed *feeds, int nfeeds, int train_pass,
                     const char *name, float *values, int64_t count, int64_t i, double h) {
    float base = values[i];
    /* Divide by the perturbation actually stored in f32, not by the nominal 2h. */
    float up = (float)(base + h), down = (float)(base - h);
    values[i] = up;
    write_param(tr, name, values, count);
    double loss_up = loss_at(tr, feeds, nfeeds, train_pass);
    values[i] = down;
    write_param(tr, name, values, count);
    double loss_down = loss_at(tr, feeds, nfeeds, train_pass);
    values[i] = base;
    write_param(tr, name, values, count);
    return (loss_up - loss_down) / ((double)up - down);
}

void fd_expect_close(const char *name, int64_t i, double analytic, double numeric, double atol,
                     double rtol) {
    double err = fabs(analytic - numeric);
    cr_assert_leq(err, atol + rtol * fabs(numeric),
                  "d loss / d %s[%lld]: analytic %.7g, central difference %.7g (error %.3g)", name,
                  (long long)i, analytic, numeric, err);
}

void fd_begin(fd_case *c, uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->rng = seed;
    c->tol_scale = 1.0;
    cr_assert_eq(mw_graph_new(&c->g), MW_OK, "%s", mw_last_error());
}

static fd_leaf *add_leaf(fd_leaf *list, int *n, const char *name, int64_t count) {
    cr_assert_lt(*n, FD_MAX_LEAVES);
    cr_assert_leq(count, FD_MAX_ELEMS, "%s has %lld elements", name, (long long)count);
    fd_leaf *l = &list[(*n)++];
    snprintf(l->name, sizeof l->name, "%s", name);
    l->count = count;
    return l;
}

fd_leaf *fd_find(fd_leaf *list, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(list[i].name, name) == 0) return &list[i];
    cr_assert_fail("no leaf named %s", name);
    return NULL;
}

mw_tensor *fd_param(fd_case *c, const char *name, mw_axes axes, float std) {
    mw_tensor *p = mw_param(c->g, name, axes, MW_INIT_NORMAL(std));
    cr_assert_not_null(p, "mw_param(%s): %s", name, mw_graph_error(c->g));
    add_leaf(c->param, &c->nparams, name, mw_tensor_numel(p));
    return p;
}

mw_tensor *fd_param_values(fd_case *c, const char *name, mw_axes axes, const float *values) {
    mw_tensor *p = fd_param(c, name, axes, 1.0f);
    fd_leaf *l = &c->param[c->nparams - 1];
    l->start = FD_START_VALUES;
    memcpy(l->data, values, sizeof(float) * (size_t)l->count);
    return p;
}

mw_tensor *fd_param_away_from_zero(fd_case *c, const char *name, mw_axes axes) {
    mw_tensor *p = fd_param(c, name, axes, 1.0f);
    c->param[c->nparams - 1].start = FD_START_AWAY_FROM_ZERO;
    return p;
}

mw_tensor *fd_input(fd_case *c, const char *name, mw_axes axes) {
    mw_tensor *x = mw_input(c->g, name, MW_F32, axes);
    cr_assert_not_null(x, "mw_input(%s): %s", name, mw_graph_error(c->g));
    fd_leaf *l = add_leaf(c->input, &c->ninputs, name, mw_tensor_numel(x));
    for (int64_t i = 0; i < l->count; i++) l->data[i] = (float)rng_uniform(&c->rng);
    return x;
}

mw_tensor *fd_ids(fd_case *c, const char *name, mw_axes axes, const int32_t *ids) {
    mw_tensor *x = mw_input(c->g, name, MW_I32, axes);
    cr_assert_not_null(x, "mw_input(%s): %s", name, mw_graph_error(c->g));
    fd_leaf *l = add_leaf(c->input, &c->ninputs, name, mw_tensor_numel(x));
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

/* Writes each parameter's start into the trainer and reads back the values it is checked at. */
static void start_params(fd_case *c, mw_trainer *tr) {
    for (int j = 0; j < c->nparams; j++) {
        fd_leaf *p = &c->param[j];
        if (p->start == FD_START_AWAY_FROM_ZERO)
            for (int64_t i = 0; i < p->count; i++) {
                double u = rng_uniform(&c->rng);
                p->data[i] = (float)(u < 0 ? u - 1.0 : u + 1.0);
            }
        if (p->start != FD_START_INIT) write_param(tr, p->name, p->data, p->count);
        cr_assert_eq(mw_trainer_read_param(tr, p->name, p->value, p->count), MW_OK, "%s",
                     mw_last_error());
    }
}

double fd_run(fd_case *c, mw_tensor *out, int finite_differences) {
    cr_assert_not_null(out, "tracing failed: %s", mw_graph_error(c->g));
    mw_tensor *r = fd_input(c, "r", axes_of(out));
    mw_tensor *loss = mw_sum(c->g, mw_mul(c->g, out, r), NULL);
    cr_assert_eq(mw_graph_status(c->g), MW_OK, "%s", mw_graph_error(c->g));

    mw_mesh *mesh = NULL;
    mw_trainer *tr = NULL;
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.0f}, .outputs = &out, .noutputs = 1};
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &mesh), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_new(c->g, loss, mesh, c->read_out ? &cfg : NULL, &tr), MW_OK, "%s",
                 mw_last_error());
    start_params(c, tr);

    mw_feed feeds[FD_MAX_LEAVES];
    for (int j = 0; j < c->ninputs; j++)
        feeds[j] = (mw_feed){c->input[j].name,
                             c->input[j].is_ids ? (const void *)c->input[j].ids : c->input[j].data,
                             c->input[j].count};
    float value = NAN;
    cr_assert_eq(mw_trainer_compute_grads(tr, feeds, c->ninputs, &value), MW_OK, "%s",
                 mw_last_error());
    cr_assert(isfinite(value));
    if (c->read_out) {
        c->nout = mw_tensor_numel(out);
        cr_assert_leq(c->nout, FD_MAX_ELEMS, "the output has %lld elements", (long long)c->nout);
        cr_assert_eq(mw_trainer_read_output(tr, out, c->out, c->nout), MW_OK, "%s",
                     mw_last_error());
    }
    for (int j = 0; j < c->nparams; j++)
        cr_assert_eq(
            mw_trainer_read_grad(tr, c->param[j].name, c->param[j].grad, c->param[j].count), MW_OK,
            "%s", mw_last_error());

    if (finite_differences) {
        double atol = FD_ATOL * c->tol_scale, rtol = FD_RTOL * c->tol_scale;
        for (int j = 0; j < c->nparams; j++) {
            fd_leaf *p = &c->param[j];
            float probe[FD_MAX_ELEMS];
            memcpy(probe, p->value, sizeof(float) * (size_t)p->count);
            for (int64_t i = 0; i < p->count; i++) {
                double numeric = fd_difference(tr, feeds, c->ninputs, c->train_pass, p->name, probe,
                                               p->count, i, FD_STEP);
                fd_expect_close(p->name, i, p->grad[i], numeric, atol, rtol);
            }
        }
    }

    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(c->g);
    c->g = NULL;
    return value;
}

void fd_check(fd_case *c, mw_tensor *out) { fd_run(c, out, 1); }

void fd_expect_grad_is_r(fd_case *c, const char *param) {
    fd_leaf *p = fd_find(c->param, c->nparams, param), *r = fd_find(c->input, c->ninputs, "r");
    cr_assert_eq(p->count, r->count);
    for (int64_t i = 0; i < p->count; i++)
        cr_assert_eq(p->grad[i], r->data[i], "d loss / d %s[%lld] = %.9g, expected r = %.9g", param,
                     (long long)i, p->grad[i], r->data[i]);
}
