/* Forward values of every op against an independent reference: inputs and outputs computed in
 * float64 by NumPy from the ops' definitions (tests/data/forward_ref.txt, made by
 * tools/forward_reference.py). The finite-difference tests take our forward kernels as ground
 * truth; these cases check the kernels themselves.
 *
 * Each case traces one op on fed inputs, evaluates it on "cpu:1" and reads the result with
 * mw_trainer_read_output. Tolerances are |got - ref| <= atol + rtol |ref|, derived per case from
 * the float32 arithmetic the op does (u = 2^-24 = 6.0e-8, inputs in [-1, 1] unless the case says
 * otherwise); every bug that matters here (a wrong element, a mask off by one, a missing term or
 * factor) is off by more than 1e-2. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "meshwit.h"
#include "tests/reference_text.h"

#define U 5.9604644775390625e-8 /* 2^-24 */
#define MAXV 128
#define MAXREC 4

typedef mw_tensor *(*build_fn)(mw_graph *g);

static mw_tensor *in(mw_graph *g, const char *name, mw_axes axes) {
    return mw_input(g, name, MW_F32, axes);
}

static mw_tensor *ids(mw_graph *g, const char *name, mw_axes axes) {
    return mw_input(g, name, MW_I32, axes);
}

#define BF MW_AXES({"B", 3}, {"F", 4})
#define BFG MW_AXES({"B", 3}, {"F", 4}, {"G", 2})

static mw_tensor *add_any_order(mw_graph *g) {
    return mw_add(g, in(g, "a", BF), in(g, "b", MW_AXES({"F", 4}, {"B", 3})));
}
static mw_tensor *sub_broadcast(mw_graph *g) {
    return mw_sub(g, in(g, "a", BF), in(g, "b", MW_AXES({"F", 4})));
}
static mw_tensor *mul_broadcast_left(mw_graph *g) {
    return mw_mul(g, in(g, "a", MW_AXES({"F", 4})), in(g, "b", BF));
}
static mw_tensor *div_broadcast(mw_graph *g) {
    return mw_div(g, in(g, "a", BF), in(g, "b", MW_AXES({"B", 3})));
}
static mw_tensor *div_broadcast_middle(mw_graph *g) {
    return mw_div(g, in(g, "a", MW_AXES({"H", 2}, {"B", 3}, {"F", 4})),
                  in(g, "b", MW_AXES({"H", 2}, {"F", 4})));
}
static mw_tensor *scale(mw_graph *g) { return mw_scale(g, in(g, "a", BF), -2.5f); }
static mw_tensor *dot(mw_graph *g) {
    return mw_dot(g, in(g, "x", BF), in(g, "w", MW_AXES({"F", 4}, {"O", 2})), "F");
}
static mw_tensor *dot_batched(mw_graph *g) {
    return mw_dot(g, in(g, "a", MW_AXES({"H", 2}, {"T", 3}, {"D", 4})),
                  in(g, "b", MW_AXES({"H", 2}, {"S", 5}, {"D", 4})), "D");
}
static mw_tensor *contract(mw_graph *g) {
    return mw_contract(g, in(g, "a", BFG), in(g, "b", MW_AXES({"F", 4}, {"G", 2}, {"O", 5})),
                       "O,B");
}
static mw_tensor *sum_axis(mw_graph *g) { return mw_sum(g, in(g, "x", BFG), "F"); }
static mw_tensor *sum_two_axes(mw_graph *g) { return mw_sum(g, in(g, "x", BFG), "B,G"); }
static mw_tensor *sum_all(mw_graph *g) { return mw_sum(g, in(g, "x", BFG), NULL); }
static mw_tensor *mean_axis(mw_graph *g) { return mw_mean(g, in(g, "x", BFG), "B"); }
static mw_tensor *mean_all(mw_graph *g) { return mw_mean(g, in(g, "x", BFG), NULL); }
static mw_tensor *slice(mw_graph *g) {
    return mw_slice(g, in(g, "x", MW_AXES({"B", 3}, {"F", 6})), "F", 2, 3, NULL);
}
static mw_tensor *select(mw_graph *g) {
    return mw_select(g, in(g, "x", MW_AXES({"B", 3}, {"F", 6})), "B", 1);
}
static mw_tensor *split_sum(mw_graph *g) {
    mw_tensor *x = mw_split(g, in(g, "x", MW_AXES({"B", 2}, {"F", 6})), "F", "P=2,Q");
    return mw_sum(g, x, "P");
}
static mw_tensor *merge_select(mw_graph *g) {
    mw_tensor *x = in(g, "x", MW_AXES({"B", 2}, {"P", 2}, {"Q", 3}));
    return mw_select(g, mw_merge(g, x, "P,Q", "F"), "F", 4);
}
static mw_tensor *gelu(mw_graph *g) { return mw_gelu(g, in(g, "x", MW_AXES({"N", 17}))); }
static mw_tensor *gelu_erf(mw_graph *g) { return mw_gelu_erf(g, in(g, "x", MW_AXES({"N", 17}))); }
static mw_tensor *layernorm(mw_graph *g) {
    mw_axes c = MW_AXES({"C", 8});
    return mw_layernorm(g, in(g, "x", MW_AXES({"B", 3}, {"C", 8})), in(g, "w", c), in(g, "b", c),
                        "C", 1e-5f);
}
static mw_tensor *softmax(mw_graph *g) {
    return mw_softmax(g, in(g, "x", MW_AXES({"B", 3}, {"K", 5})), "K", 0.7f);
}
static mw_tensor *causal_softmax(mw_graph *g) {
    return mw_causal_softmax(g, in(g, "x", MW_AXES({"H", 2}, {"Q", 3}, {"K", 5})), "Q", "K", 0.5f);
}
static mw_tensor *causal_softmax_square(mw_graph *g) {
    return mw_causal_softmax(g, in(g, "x", MW_AXES({"Q", 4}, {"K", 4})), "Q", "K", 1.0f);
}
static mw_tensor *embedding(mw_graph *g) {
    return mw_embedding(g, in(g, "table", MW_AXES({"V", 5}, {"D", 3})),
                        ids(g, "ids", MW_AXES({"B", 2}, {"T", 3})), "V");
}
static mw_tensor *cross_entropy(mw_graph *g) {
    return mw_cross_entropy(g, in(g, "logits", MW_AXES({"B", 4}, {"V", 6})),
                            ids(g, "targets", MW_AXES({"B", 4})), "V", 5);
}

typedef struct fwd_case {
    const char *name;
    build_fn build;
    double atol, rtol;
    const char *why; /* where the tolerance comes from */
} fwd_case;

/* K terms of magnitude <= 1 summed in float: <= K u per term, K terms: K^2 u. */
#define SUM_TOL(k) ((double)(k) * (k)*U)

static const fwd_case cases[] = {
    {"add_any_order", add_any_order, 0, U, "one correctly rounded operation"},
    {"sub_broadcast", sub_broadcast, 0, U, "one correctly rounded operation"},
    {"mul_broadcast_left", mul_broadcast_left, 0, U, "one correctly rounded operation"},
    {"div_broadcast", div_broadcast, 0, U, "one correctly rounded operation"},
    {"div_broadcast_middle", div_broadcast_middle, 0, U, "one correctly rounded operation"},
    {"scale", scale, 0, U, "one correctly rounded operation"},
    {"dot", dot, SUM_TOL(4), 0, "4 products summed"},
    {"dot_batched", dot_batched, SUM_TOL(4), 0, "4 products summed"},
    {"contract", contract, SUM_TOL(8), 0, "8 products summed"},
    {"sum_axis", sum_axis, SUM_TOL(4), 0, "4 terms summed"},
    {"sum_two_axes", sum_two_axes, SUM_TOL(6), 0, "6 terms summed"},
    {"sum_all", sum_all, SUM_TOL(24), 0, "24 terms summed"},
    {"mean_axis", mean_axis, SUM_TOL(3) + U, 0, "3 terms summed, then scaled"},
    {"mean_all", mean_all, SUM_TOL(24) + U, 0, "24 terms summed, then scaled"},
    {"slice", slice, 0, 0, "a copy"},
    {"select", select, 0, 0, "a copy"},
    {"split_sum", split_sum, 0, U, "a relabel, then one addition"},
    {"merge_select", merge_select, 0, 0, "a relabel and a copy"},
    /* tanh's absolute error ~1e-7 (devices/math.h) times |x| / 2 <= 2, plus ~10 roundings of
     * terms up to 4 (x + 0.044715 x^3 at |x| = 4): 2e-7 + 40 u = 2.6e-6. */
    {"gelu", gelu, 2.6e-6, U, "tanh approximation and ~10 roundings at |x| <= 4"},
    /* x / sqrt 2 is rounded (u), and erfc amplifies its argument's relative error by
     * |z erfc'(z) / erfc(z)| ~ 2 z^2 + 1 <= 17 at z = 4 / sqrt 2; libm's erfcf adds a few ulp and
     * the two products two roundings: 24 u relative, which the tail values (|ref| ~1e-4 at
     * x = -4) need. */
    {"gelu_erf", gelu_erf, 0, 24 * U, "erfc of a rounded argument and two roundings, relative"},
    /* mean and variance of 8 terms |x| <= 2 (SUM_TOL(8) * 4 relative to the variance of ~1),
     * rstd from them, then (x - mean) rstd w + b with |(x - mean) rstd| <= sqrt(8) and w <= 1.3:
     * ~3.7 * (300 u) = 6.6e-5 at worst; typically far less. */
    {"layernorm", layernorm, 7e-5, 0, "8-term mean and variance, normalised values <= 3.7"},
    /* expf's relative error ~1e-7 (devices/math.h) per term, 5 terms summed, one division:
     * 1e-7 + 7 u relative, on values <= 1. */
    {"softmax", softmax, 0, 1e-7 + 7 * U, "exp approximation, 5-term sum, one division"},
    {"causal_softmax", causal_softmax, 0, 1e-7 + 7 * U, "as softmax"},
    {"causal_softmax_square", causal_softmax_square, 0, 1e-7 + 7 * U, "as softmax"},
    {"embedding", embedding, 0, 0, "a copy of rows"},
    /* log-sum-exp of 5 logits |x| <= 3: the max, exp's 1e-7 and 7 u relative in the sum, log
     * (absolute = relative error of its argument), then |lse - x_t| <= 8: 2e-7 + 7 u + 8 u. */
    {"cross_entropy", cross_entropy, 2e-7 + 15 * U, 0, "log-sum-exp of 5 logits |x| <= 3"},
};

typedef struct record {
    char name[32];
    int count;
    float f[MAXV];
    int32_t i[MAXV];
    double d[MAXV];
} record;

static void ref_read(reffile *r, record *rec) {
    cr_assert_eq(fscanf(r->f, "%31s %d", rec->name, &rec->count), 2, "%s: truncated", r->path);
    cr_assert(rec->count >= 0 && rec->count <= MAXV, "%s: record %s has %d values", r->path,
              rec->name, rec->count);
    for (int i = 0; i < rec->count; i++) {
        cr_assert_eq(fscanf(r->f, "%lf", &rec->d[i]), 1, "%s: %s truncated", r->path, rec->name);
        rec->f[i] = (float)rec->d[i];
        rec->i[i] = (int32_t)rec->d[i];
    }
}

/* Skips to the record "case:<name>". */
static void ref_find(reffile *r, const char *name) {
    char want[48];
    snprintf(want, sizeof want, "case:%s", name);
    record rec;
    do {
        cr_assert_eq(fscanf(r->f, "%31s", rec.name), 1, "%s: no %s", r->path, want);
        if (strcmp(rec.name, "end") == 0) cr_assert_fail("%s: no %s", r->path, want);
        cr_assert_eq(fscanf(r->f, "%d", &rec.count), 1, "%s: truncated", r->path);
        for (int i = 0; i < rec.count; i++)
            cr_assert_eq(fscanf(r->f, "%lf", &rec.d[0]), 1, "%s: truncated", r->path);
    } while (strcmp(rec.name, want) != 0);
}

static void run_case(const char *name) {
    const fwd_case *c = NULL;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        if (strcmp(cases[k].name, name) == 0) c = &cases[k];
    cr_assert_not_null(c, "no case %s", name);
    reffile rf, *r = &rf;
    ref_open(r, "forward_ref.txt");
    ref_find(r, name);
    record recs[MAXREC], out;
    int n = 0;
    for (;;) {
        record *rec = n < MAXREC ? &recs[n] : &out;
        ref_read(r, rec);
        if (strcmp(rec->name, "out") == 0) {
            if (rec != &out) out = *rec;
            break;
        }
        cr_assert_lt(n, MAXREC, "%s: too many inputs", c->name);
        n++;
    }

    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *y = c->build(g);
    mw_tensor *loss = mw_sum(g, y, NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s: %s", c->name, mw_graph_error(g));
    cr_assert_eq(mw_tensor_numel(y), out.count, "%s: %lld outputs, the reference has %d", c->name,
                 (long long)mw_tensor_numel(y), out.count);
    mw_mesh *mesh;
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &mesh), MW_OK, "%s", mw_last_error());
    mw_trainer *tr;
    mw_trainer_config cfg = {.outputs = &y, .noutputs = 1};
    cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_OK, "%s: %s", c->name,
                 mw_last_error());
    mw_feed feeds[MAXREC];
    for (int k = 0; k < n; k++) {
        int is_ids = strcmp(recs[k].name, "ids") == 0 || strcmp(recs[k].name, "targets") == 0;
        feeds[k] =
            (mw_feed){recs[k].name, is_ids ? (const void *)recs[k].i : recs[k].f, recs[k].count};
    }
    float l;
    mw_status st = mw_trainer_eval(tr, feeds, n, &l);
    cr_assert_eq(st, MW_OK, "%s: %s", c->name, mw_last_error());
    float got[MAXV];
    cr_assert_eq(mw_trainer_read_output(tr, y, got, out.count), MW_OK, "%s", mw_last_error());
    for (int i = 0; i < out.count; i++) {
        double err = fabs(got[i] - out.d[i]), tol = c->atol + c->rtol * fabs(out.d[i]);
        cr_assert_leq(err, tol, "%s[%d] = %.9g, reference %.9g (error %.3g > %.3g: %s)", c->name, i,
                      got[i], out.d[i], err, tol, c->why);
    }
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    fclose(r->f);
}

/* The file holds exactly the cases of the table, in its order. */
Test(forward_ref, reference_file_matches_the_table) {
    reffile r;
    ref_open(&r, "forward_ref.txt");
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        record rec;
        ref_read(&r, &rec);
        char want[48];
        snprintf(want, sizeof want, "case:%s", cases[k].name);
        cr_assert_str_eq(rec.name, want, "%s: %s where %s was expected", r.path, rec.name, want);
        do ref_read(&r, &rec);
        while (strcmp(rec.name, "out") != 0);
    }
    ref_close_at_end(&r);
}

#define FORWARD_TEST(op)                                                                           \
    Test(forward_ref, op) { run_case(#op); }

FORWARD_TEST(add_any_order)
FORWARD_TEST(sub_broadcast)
FORWARD_TEST(mul_broadcast_left)
FORWARD_TEST(div_broadcast)
FORWARD_TEST(div_broadcast_middle)
FORWARD_TEST(scale)
FORWARD_TEST(dot)
FORWARD_TEST(dot_batched)
FORWARD_TEST(contract)
FORWARD_TEST(sum_axis)
FORWARD_TEST(sum_two_axes)
FORWARD_TEST(sum_all)
FORWARD_TEST(mean_axis)
FORWARD_TEST(mean_all)
FORWARD_TEST(slice)
FORWARD_TEST(select)
FORWARD_TEST(split_sum)
FORWARD_TEST(merge_select)
FORWARD_TEST(gelu)
FORWARD_TEST(gelu_erf)
FORWARD_TEST(layernorm)
FORWARD_TEST(softmax)
FORWARD_TEST(causal_softmax)
FORWARD_TEST(causal_softmax_square)
FORWARD_TEST(embedding)
FORWARD_TEST(cross_entropy)
