/* Tracing: result axes of every op, the error of every misuse (code and message), sticky errors,
 * inspection, status names, and how parameters are initialised. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "meshwit.h"

static mw_graph *new_graph(void) {
    mw_graph *g = NULL;
    cr_assert_eq(mw_graph_new(&g), MW_OK, "%s", mw_last_error());
    cr_assert_not_null(g);
    return g;
}

static mw_tensor *input(mw_graph *g, const char *name, mw_axes axes) {
    mw_tensor *t = mw_input(g, name, MW_F32, axes);
    cr_assert_not_null(t, "mw_input(%s): %s", name, mw_graph_error(g));
    return t;
}

/* x: f32[Batch=8, Feature=4], sharded over X when `sharded`. */
static mw_tensor *batch_input(mw_graph *g, const char *name, int sharded) {
    mw_tensor *x = input(g, name, MW_AXES({"Batch", 8}, {"Feature", 4}));
    return sharded ? mw_shard(g, x, "Batch", "X") : x;
}

static void assert_describes(const mw_tensor *t, const char *expected) {
    char buf[128];
    cr_assert_not_null(t, "expected %s, got NULL (%s)", expected, mw_last_error());
    cr_assert_str_eq(mw_tensor_describe(t, buf, sizeof buf), expected);
}

/* The op returned NULL, the graph recorded `code`, and the message (in the graph and in
 * mw_last_error()) contains every needle. */
static void expect_trace_error(mw_graph *g, const mw_tensor *result, mw_status code,
                               const char *const *needles) {
    cr_assert_null(result, "the op should have failed with %s", mw_status_name(code));
    cr_assert_eq(mw_graph_status(g), code, "expected %s, got %s: %s", mw_status_name(code),
                 mw_status_name(mw_graph_status(g)), mw_graph_error(g));
    for (const char *const *n = needles; *n; n++) {
        cr_assert_not_null(strstr(mw_graph_error(g), *n), "graph error \"%s\" does not name \"%s\"",
                           mw_graph_error(g), *n);
        cr_assert_not_null(strstr(mw_last_error(), *n), "mw_last_error \"%s\" does not name \"%s\"",
                           mw_last_error(), *n);
    }
}
#define EXPECT_TRACE_ERROR(g, result, code, ...)                                                   \
    expect_trace_error((g), (result), (code), (const char *const[]){__VA_ARGS__, NULL})

/* --- result axes ------------------------------------------------------------------------------ */

TestSuite(axes, .description = "result axes of every op");

Test(axes, describe_and_inspect_a_sharded_input) {
    mw_graph *g = new_graph();
    mw_tensor *x = input(g, "x", MW_AXES({"Batch", 8192}, {"Feature", 64}));
    assert_describes(x, "f32[Batch=8192, Feature=64]");
    mw_tensor *xs = mw_shard(g, x, "Batch", "X");
    assert_describes(xs, "f32[Batch@X=8192, Feature=64]");
    cr_assert_eq(mw_tensor_rank(xs), 2);
    cr_assert_eq(mw_tensor_dtype(xs), MW_F32);
    cr_assert_eq(mw_tensor_numel(xs), 8192 * 64, "numel is global");

    const char *name = NULL, *mesh_axis = NULL;
    int64_t size = 0;
    cr_assert_eq(mw_tensor_axis(xs, 0, &name, &size, &mesh_axis), MW_OK);
    cr_assert_str_eq(name, "Batch", "the base name, without @X");
    cr_assert_eq(size, 8192, "the global size");
    cr_assert_str_eq(mesh_axis, "X");
    cr_assert_eq(mw_tensor_axis(xs, 1, &name, &size, &mesh_axis), MW_OK);
    cr_assert_str_eq(name, "Feature");
    cr_assert_eq(size, 64);
    cr_assert_null(mesh_axis);
    cr_assert_eq(mw_tensor_axis(xs, 2, &name, &size, &mesh_axis), MW_ERR_INVALID);
    cr_assert_eq(mw_tensor_axis(xs, -1, &name, &size, &mesh_axis), MW_ERR_INVALID);
    cr_assert_eq(mw_graph_status(g), MW_OK);
    mw_graph_free(g);
}

Test(axes, describe_truncates_and_terminates) {
    mw_graph *g = new_graph();
    mw_tensor *x = input(g, "x", MW_AXES({"Batch", 8192}, {"Feature", 64}));
    char buf[10];
    memset(buf, 'z', sizeof buf);
    cr_assert_eq(mw_tensor_describe(x, buf, sizeof buf), buf);
    cr_assert_str_eq(buf, "f32[Batch", "the first 9 characters, terminated");
    mw_graph_free(g);
}

Test(axes, leaves) {
    mw_graph *g = new_graph();
    mw_tensor *ids = mw_input(g, "ids", MW_I32, MW_AXES({"Token", 5}));
    cr_assert_not_null(ids, "%s", mw_graph_error(g));
    cr_assert_eq(mw_tensor_dtype(ids), MW_I32);
    cr_assert_eq(mw_tensor_numel(ids), 5);
    mw_tensor *b = mw_param(g, "bias", MW_SCALAR, MW_INIT_ZEROS);
    cr_assert_not_null(b, "%s", mw_graph_error(g));
    cr_assert_eq(mw_tensor_rank(b), 0);
    cr_assert_eq(mw_tensor_numel(b), 1, "a scalar has one element");
    cr_assert_eq(mw_tensor_dtype(b), MW_F32);
    mw_graph_free(g);
}

Test(axes, elementwise_keeps_the_first_operands_order) {
    mw_graph *g = new_graph();
    mw_tensor *ab = input(g, "ab", MW_AXES({"A", 3}, {"B", 4}));
    mw_tensor *ba = input(g, "ba", MW_AXES({"B", 4}, {"A", 3}));
    assert_describes(mw_add(g, ab, ba), "f32[A=3, B=4]");
    assert_describes(mw_sub(g, ba, ab), "f32[B=4, A=3]");
    assert_describes(mw_mul(g, ab, ab), "f32[A=3, B=4]");
    assert_describes(mw_div(g, ba, ab), "f32[B=4, A=3]");
    assert_describes(mw_scale(g, ba, 2.0f), "f32[B=4, A=3]");
    mw_graph_free(g);
}

Test(axes, broadcasting_takes_the_larger_operands_axes) {
    mw_graph *g = new_graph();
    mw_tensor *abc = input(g, "abc", MW_AXES({"A", 3}, {"B", 4}, {"C", 2}));
    mw_tensor *cb = input(g, "cb", MW_AXES({"C", 2}, {"B", 4}));
    mw_tensor *s = mw_param(g, "s", MW_SCALAR, MW_INIT_ZEROS);
    assert_describes(mw_add(g, abc, cb), "f32[A=3, B=4, C=2]");
    assert_describes(mw_mul(g, cb, abc), "f32[A=3, B=4, C=2]");
    assert_describes(mw_sub(g, s, cb), "f32[C=2, B=4]");
    assert_describes(mw_div(g, abc, s), "f32[A=3, B=4, C=2]");
    mw_graph_free(g);
}

Test(axes, sharded_operands_stay_sharded) {
    mw_graph *g = new_graph();
    mw_tensor *x = batch_input(g, "x", 1);
    mw_tensor *y = mw_shard(g, input(g, "y", MW_AXES({"Batch", 8})), "Batch", "X");
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Feature", 4}), MW_INIT_ZEROS);
    assert_describes(mw_add(g, x, w), "f32[Batch@X=8, Feature=4]");
    assert_describes(mw_mul(g, y, x), "f32[Batch@X=8, Feature=4]");
    mw_tensor *pred = mw_dot(g, x, w, "Feature");
    assert_describes(pred, "f32[Batch@X=8]");
    assert_describes(mw_sub(g, pred, y), "f32[Batch@X=8]");
    mw_graph_free(g);
}

/* Shared (batch) axes once in a's order, then a's remaining axes, then b's. */
Test(axes, dot) {
    mw_graph *g = new_graph();
    mw_tensor *m = input(g, "m", MW_AXES({"Row", 3}, {"K", 5}));
    mw_tensor *v = input(g, "v", MW_AXES({"K", 5}));
    assert_describes(mw_dot(g, m, v, "K"), "f32[Row=3]");
    assert_describes(mw_dot(g, v, m, "K"), "f32[Row=3]");
    mw_tensor *vv = mw_dot(g, v, v, "K");
    cr_assert_not_null(vv, "%s", mw_graph_error(g));
    cr_assert_eq(mw_tensor_rank(vv), 0, "vector . vector is a scalar");

    mw_tensor *a = input(g, "a", MW_AXES({"Row", 3}, {"Bt", 2}, {"K", 4}));
    mw_tensor *b = input(g, "b", MW_AXES({"Col", 5}, {"K", 4}, {"Bt", 2}));
    assert_describes(mw_dot(g, a, b, "K"), "f32[Bt=2, Row=3, Col=5]");
    assert_describes(mw_dot(g, b, a, "K"), "f32[Bt=2, Col=5, Row=3]");

    mw_tensor *p = input(g, "p", MW_AXES({"P", 2}, {"Q", 3}, {"K", 4}, {"Row", 5}));
    mw_tensor *q = input(g, "q", MW_AXES({"Q", 3}, {"K", 4}, {"P", 2}, {"Col", 6}));
    assert_describes(mw_dot(g, p, q, "K"), "f32[P=2, Q=3, Row=5, Col=6]");
    assert_describes(mw_dot(g, q, p, "K"), "f32[Q=3, P=2, Col=6, Row=5]");
    mw_graph_free(g);
}

Test(axes, contract) {
    mw_graph *g = new_graph();
    mw_tensor *a = input(g, "a", MW_AXES({"A", 2}, {"K", 3}, {"B", 4}));
    mw_tensor *b = input(g, "b", MW_AXES({"C", 5}, {"K", 3}, {"A", 2}));
    assert_describes(mw_contract(g, a, b, "C,A,B"), "f32[C=5, A=2, B=4]");
    assert_describes(mw_contract(g, a, b, "B,C,A"), "f32[B=4, C=5, A=2]");
    assert_describes(mw_contract(g, a, b, "K,C,A,B"), "f32[K=3, C=5, A=2, B=4]");
    mw_graph_free(g);
}

Test(axes, reductions) {
    mw_graph *g = new_graph();
    mw_tensor *x = input(g, "x", MW_AXES({"A", 3}, {"B", 4}, {"C", 2}));
    assert_describes(mw_sum(g, x, "B"), "f32[A=3, C=2]");
    assert_describes(mw_mean(g, x, "B"), "f32[A=3, C=2]");
    assert_describes(mw_sum(g, x, "A,C"), "f32[B=4]");
    assert_describes(mw_mean(g, x, "C,A"), "f32[B=4]");
    mw_tensor *all[] = {mw_sum(g, x, NULL), mw_mean(g, x, NULL), mw_sum(g, x, "A,B,C")};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        cr_assert_not_null(all[i], "%s", mw_graph_error(g));
        cr_assert_eq(mw_tensor_rank(all[i]), 0);
    }
    mw_graph_free(g);
}

/* A sharded axis is named by its base name; reducing it gives a replicated result. */
Test(axes, reductions_of_a_sharded_axis) {
    mw_graph *g = new_graph();
    mw_tensor *x = batch_input(g, "x", 1);
    assert_describes(mw_sum(g, x, "Batch"), "f32[Feature=4]");
    assert_describes(mw_mean(g, x, "Batch"), "f32[Feature=4]");
    assert_describes(mw_sum(g, x, "Feature"), "f32[Batch@X=8]");
    assert_describes(mw_mean(g, x, "Feature"), "f32[Batch@X=8]");
    mw_tensor *all = mw_mean(g, x, NULL);
    cr_assert_not_null(all, "%s", mw_graph_error(g));
    cr_assert_eq(mw_tensor_rank(all), 0);
    mw_graph_free(g);
}

Test(axes, reshaping) {
    mw_graph *g = new_graph();
    mw_tensor *x = input(g, "x", MW_AXES({"A", 3}, {"B", 12}));
    assert_describes(mw_rename(g, x, "B", "C"), "f32[A=3, C=12]");
    assert_describes(mw_split(g, x, "B", "Head=3,HeadDim"), "f32[A=3, Head=3, HeadDim=4]");
    assert_describes(mw_split(g, x, "B", "Head,HeadDim=6"), "f32[A=3, Head=2, HeadDim=6]");
    mw_tensor *h = input(g, "h", MW_AXES({"A", 3}, {"Head", 2}, {"HeadDim", 5}));
    assert_describes(mw_merge(g, h, "Head,HeadDim", "Model"), "f32[A=3, Model=10]");
    mw_tensor *t = input(g, "t", MW_AXES({"Time", 8}, {"Dim", 4}));
    assert_describes(mw_slice(g, t, "Time", 2, 3, "Window"), "f32[Window=3, Dim=4]");
    assert_describes(mw_slice(g, t, "Time", 5, 3, NULL), "f32[Time=3, Dim=4]");
    assert_describes(mw_select(g, t, "Time", 7), "f32[Dim=4]");
    assert_describes(mw_rename(g, batch_input(g, "xs", 1), "Feature", "F"), "f32[Batch@X=8, F=4]");
    mw_graph_free(g);
}

Test(axes, neural_network_ops) {
    mw_graph *g = new_graph();
    mw_tensor *table = mw_param(g, "wte", MW_AXES({"Vocab", 10}, {"Dim", 4}), MW_INIT_ZEROS);
    mw_tensor *ids = mw_input(g, "ids", MW_I32, MW_AXES({"Batch", 2}, {"Tok", 3}));
    mw_tensor *emb = mw_embedding(g, table, ids, "Vocab");
    assert_describes(emb, "f32[Batch=2, Tok=3, Dim=4]");
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Dim", 4}), MW_INIT_CONST(1.0f));
    mw_tensor *b = mw_param(g, "b", MW_AXES({"Dim", 4}), MW_INIT_ZEROS);
    assert_describes(mw_layernorm(g, emb, w, b, "Dim", 1e-5f), "f32[Batch=2, Tok=3, Dim=4]");
    assert_describes(mw_gelu(g, emb), "f32[Batch=2, Tok=3, Dim=4]");
    assert_describes(mw_softmax(g, emb, "Dim", 1.0f), "f32[Batch=2, Tok=3, Dim=4]");
    mw_tensor *att = input(g, "att", MW_AXES({"Head", 2}, {"Query", 3}, {"Key", 3}));
    assert_describes(mw_causal_softmax(g, att, "Query", "Key", 0.5f),
                     "f32[Head=2, Query=3, Key=3]");
    mw_tensor *logits = mw_dot(g, emb, table, "Dim");
    assert_describes(logits, "f32[Batch=2, Tok=3, Vocab=10]");
    assert_describes(mw_cross_entropy(g, logits, ids, "Vocab", 0), "f32[Batch=2, Tok=3]");
    assert_describes(mw_cross_entropy(g, logits, ids, "Vocab", 7), "f32[Batch=2, Tok=3]");
    mw_graph_free(g);
}

/* --- errors ----------------------------------------------------------------------------------- */

TestSuite(errors, .description = "tracing errors: codes, messages, stickiness");

Test(errors, dot_over_an_unknown_axis) {
    mw_graph *g = new_graph();
    mw_tensor *x = batch_input(g, "x", 0);
    mw_tensor *w = input(g, "w", MW_AXES({"Feature", 4}));
    EXPECT_TRACE_ERROR(g, mw_dot(g, x, w, "Hidden"), MW_ERR_AXIS, "Hidden", "Batch", "Feature");
    mw_graph_free(g);
}

Test(errors, dot_over_an_axis_missing_from_b) {
    mw_graph *g = new_graph();
    mw_tensor *x = batch_input(g, "x", 0);
    mw_tensor *v = input(g, "v", MW_AXES({"Other", 4}));
    EXPECT_TRACE_ERROR(g, mw_dot(g, x, v, "Feature"), MW_ERR_AXIS, "Feature", "Other");
    mw_graph_free(g);
}

Test(errors, dot_sizes_differ) {
    mw_graph *g = new_graph();
    mw_tensor *x = batch_input(g, "x", 0);
    mw_tensor *w = input(g, "w", MW_AXES({"Feature", 5}));
    EXPECT_TRACE_ERROR(g, mw_dot(g, x, w, "Feature"), MW_ERR_SHAPE, "Feature=4", "Feature=5");
    mw_graph_free(g);
}

Test(errors, sum_over_an_unknown_axis) {
    mw_graph *g = new_graph();
    mw_tensor *x = batch_input(g, "x", 0);
    EXPECT_TRACE_ERROR(g, mw_sum(g, x, "Batch,Hiden"), MW_ERR_AXIS, "Hiden", "Batch", "Feature");
    mw_graph_free(g);
}

Test(errors, mean_over_an_unknown_axis) {
    mw_graph *g = new_graph();
    mw_tensor *x = batch_input(g, "x", 1);
    EXPECT_TRACE_ERROR(g, mw_mean(g, x, "Time"), MW_ERR_AXIS, "Time", "Batch@X", "Feature");
    mw_graph_free(g);
}

Test(errors, elementwise_sizes_differ) {
    mw_graph *g = new_graph();
    mw_tensor *a = input(g, "a", MW_AXES({"A", 3}));
    mw_tensor *b = input(g, "b", MW_AXES({"A", 4}));
    EXPECT_TRACE_ERROR(g, mw_add(g, a, b), MW_ERR_SHAPE, "A=3", "A=4");
    mw_graph_free(g);
}

Test(errors, elementwise_neither_axis_set_contains_the_other) {
    mw_graph *g = new_graph();
    mw_tensor *a = input(g, "a", MW_AXES({"A", 3}, {"B", 2}));
    mw_tensor *b = input(g, "b", MW_AXES({"A", 3}, {"C", 2}));
    EXPECT_TRACE_ERROR(g, mw_mul(g, a, b), MW_ERR_SHAPE, "B=2", "C=2");
    mw_graph_free(g);
}

/* Batch@X and Batch are different axes: no implicit sharding, in either operand order. */
static void check_sharded_with_unsharded(int sharded_first) {
    mw_graph *g = new_graph();
    mw_tensor *pred = mw_sum(g, batch_input(g, "x", 1), "Feature");
    mw_tensor *y = input(g, "y", MW_AXES({"Batch", 8}));
    mw_tensor *r = sharded_first ? mw_sub(g, pred, y) : mw_sub(g, y, pred);
    EXPECT_TRACE_ERROR(g, r, MW_ERR_SHARDING, "Batch@X", "Batch=8", "mw_shard");
    mw_graph_free(g);
}

Test(errors, sharded_with_unsharded) { check_sharded_with_unsharded(1); }
Test(errors, unsharded_with_sharded) { check_sharded_with_unsharded(0); }

Test(errors, dot_of_sharded_with_unsharded) {
    mw_graph *g = new_graph();
    mw_tensor *x = batch_input(g, "x", 1);
    mw_tensor *y = input(g, "y", MW_AXES({"Batch", 8}));
    EXPECT_TRACE_ERROR(g, mw_dot(g, x, y, "Batch"), MW_ERR_SHARDING, "Batch@X", "mw_shard");
    mw_graph_free(g);
}

Test(errors, shard_an_unknown_axis) {
    mw_graph *g = new_graph();
    EXPECT_TRACE_ERROR(g, mw_shard(g, batch_input(g, "x", 0), "Time", "X"), MW_ERR_AXIS, "Time");
    mw_graph_free(g);
}

Test(errors, shard_twice) {
    mw_graph *g = new_graph();
    EXPECT_TRACE_ERROR(g, mw_shard(g, batch_input(g, "x", 1), "Batch", "X"), MW_ERR_SHARDING,
                       "Batch");
    mw_graph_free(g);
}

/* A parameter is sharded in place, before its first use; once used, it cannot be. */
Test(errors, shard_a_used_parameter) {
    mw_graph *g = new_graph();
    mw_tensor *w = mw_param(g, "weights", MW_AXES({"Feature", 4}), MW_INIT_ZEROS);
    cr_assert_not_null(mw_scale(g, w, 2.0f));
    EXPECT_TRACE_ERROR(g, mw_shard(g, w, "Feature", "X"), MW_ERR_SHARDING, "Feature=4",
                       "already used");
    mw_graph_free(g);
}

Test(errors, shard_a_tensor_of_another_graph) {
    mw_graph *g = new_graph(), *h = new_graph();
    mw_tensor *w = mw_param(h, "weights", MW_AXES({"Feature", 4}), MW_INIT_ZEROS);
    mw_param(g, "other", MW_AXES({"Feature", 4}), MW_INIT_ZEROS);
    EXPECT_TRACE_ERROR(g, mw_shard(g, w, "Feature", "Y"), MW_ERR_INVALID, "another graph");
    const char *mesh = NULL;
    cr_assert_eq(mw_tensor_axis(w, 0, NULL, NULL, &mesh), MW_OK);
    cr_assert_null(mesh, "the other graph's parameter was relabelled");
    mw_graph_free(g);
    mw_graph_free(h);
}

Test(axes, shard_a_fresh_parameter) {
    mw_graph *g = new_graph();
    mw_tensor *w = mw_param(g, "weights", MW_AXES({"Feature", 4}), MW_INIT_ZEROS);
    cr_assert_eq(mw_shard(g, w, "Feature", "Y"), w);
    const char *mesh = NULL;
    cr_assert_eq(mw_tensor_axis(w, 0, NULL, NULL, &mesh), MW_OK);
    cr_assert_str_eq(mesh, "Y");
    char d[64];
    cr_assert_str_eq(mw_tensor_describe(w, d, sizeof d), "f32[Feature@Y=4]");
    mw_graph_free(g);
}

Test(errors, shard_a_computed_tensor) {
    mw_graph *g = new_graph();
    mw_tensor *x2 = mw_scale(g, batch_input(g, "x", 0), 2.0f);
    EXPECT_TRACE_ERROR(g, mw_shard(g, x2, "Batch", "X"), MW_ERR_SHARDING, "Batch");
    mw_graph_free(g);
}

/* Every axis of a or b left out of the output must be in both: A is in a only, so it is used
 * where it does not exist (b). */
Test(errors, contract_drops_an_unshared_axis) {
    mw_graph *g = new_graph();
    mw_tensor *a = input(g, "a", MW_AXES({"A", 2}, {"K", 3}));
    mw_tensor *b = input(g, "b", MW_AXES({"K", 3}, {"C", 5}));
    EXPECT_TRACE_ERROR(g, mw_contract(g, a, b, "C"), MW_ERR_AXIS, "A=2", "C=5");
    mw_graph_free(g);
}

Test(errors, contract_names_an_unknown_axis) {
    mw_graph *g = new_graph();
    mw_tensor *a = input(g, "a", MW_AXES({"A", 2}, {"K", 3}));
    mw_tensor *b = input(g, "b", MW_AXES({"K", 3}, {"C", 5}));
    EXPECT_TRACE_ERROR(g, mw_contract(g, a, b, "A,Zed,C"), MW_ERR_AXIS, "Zed");
    mw_graph_free(g);
}

Test(errors, duplicate_names) {
    const mw_axes axes = MW_AXES({"A", 3});
    mw_graph *g = new_graph();
    input(g, "features", axes);
    EXPECT_TRACE_ERROR(g, mw_input(g, "features", MW_F32, axes), MW_ERR_INVALID, "features");
    mw_graph_free(g);

    g = new_graph();
    input(g, "features", axes);
    EXPECT_TRACE_ERROR(g, mw_param(g, "features", axes, MW_INIT_ZEROS), MW_ERR_INVALID, "features");
    mw_graph_free(g);

    g = new_graph();
    cr_assert_not_null(mw_param(g, "weights", axes, MW_INIT_ZEROS));
    EXPECT_TRACE_ERROR(g, mw_param(g, "weights", axes, MW_INIT_ZEROS), MW_ERR_INVALID, "weights");
    mw_graph_free(g);

    g = new_graph();
    cr_assert_not_null(mw_param(g, "weights", axes, MW_INIT_ZEROS));
    EXPECT_TRACE_ERROR(g, mw_input(g, "weights", MW_F32, axes), MW_ERR_INVALID, "weights");
    mw_graph_free(g);
}

Test(errors, sticky) {
    mw_graph *g = new_graph();
    mw_tensor *a = input(g, "a", MW_AXES({"A", 3}));
    mw_tensor *b = input(g, "b", MW_AXES({"A", 4}));
    mw_tensor *bad = mw_add(g, a, b);
    EXPECT_TRACE_ERROR(g, bad, MW_ERR_SHAPE, "A=3", "A=4");
    char first[512];
    strncpy(first, mw_graph_error(g), sizeof first - 1);
    first[sizeof first - 1] = '\0';

    /* Later ops on NULL give NULL without replacing the first error... */
    cr_assert_null(mw_scale(g, bad, 2.0f));
    cr_assert_null(mw_mul(g, a, bad));
    cr_assert_null(mw_sub(g, bad, a));
    cr_assert_null(mw_dot(g, bad, a, "A"));
    cr_assert_null(mw_contract(g, a, bad, "A"));
    cr_assert_null(mw_mean(g, mw_sum(g, bad, NULL), NULL));
    cr_assert_null(mw_shard(g, bad, "A", "X"));
    /* ...and so does a second failing op on valid tensors. */
    cr_assert_null(mw_sum(g, a, "Nowhere"));
    cr_assert_eq(mw_graph_status(g), MW_ERR_SHAPE, "still the first error, got %s",
                 mw_status_name(mw_graph_status(g)));
    cr_assert_str_eq(mw_graph_error(g), first);
    cr_assert_null(strstr(mw_graph_error(g), "Nowhere"));
    mw_graph_free(g);
}

/* A tracing error reaches the trainer: mw_trainer_new returns the recorded status. */
Test(errors, trainer_new_reports_the_tracing_error) {
    mw_graph *g = new_graph();
    mw_tensor *x = batch_input(g, "x", 0);
    mw_tensor *loss = mw_sum(g, mw_dot(g, x, x, "Hidden"), NULL);
    cr_assert_null(loss);
    mw_mesh *mesh = NULL;
    mw_trainer *tr = NULL;
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &mesh), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_new(g, loss, mesh, NULL, &tr), MW_ERR_AXIS, "%s", mw_last_error());
    cr_assert_not_null(strstr(mw_last_error(), "Hidden"), "%s", mw_last_error());
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

/* --- status codes ----------------------------------------------------------------------------- */

TestSuite(status, .description = "status names, descriptions and NULL handling");

#define CODE(c)                                                                                    \
    { c, #c }
static const struct {
    mw_status code;
    const char *name;
} all_codes[] = {
    CODE(MW_OK),
    CODE(MW_ERR_INVALID),
    CODE(MW_ERR_SHAPE),
    CODE(MW_ERR_AXIS),
    CODE(MW_ERR_SHARDING),
    CODE(MW_ERR_NOMEM),
    CODE(MW_ERR_DEVICE),
    CODE(MW_ERR_IO),
    CODE(MW_ERR_FORMAT),
    CODE(MW_ERR_UNSUPPORTED),
    CODE(MW_ERR_ABORTED),
    CODE(MW_ERR_TIMEOUT),
    CODE(MW_ERR_NONFINITE),
    CODE(MW_ERR_STATE),
    CODE(MW_ERR_INTERRUPTED),
    CODE(MW_ERR_NOT_FOUND),
    CODE(MW_ERR_DTYPE),
};
#define NCODES (sizeof all_codes / sizeof *all_codes)

Test(status, every_code_has_its_name_and_a_distinct_description) {
    for (size_t i = 0; i < NCODES; i++) {
        cr_assert_str_eq(mw_status_name(all_codes[i].code), all_codes[i].name);
        const char *text = mw_strerror(all_codes[i].code);
        cr_assert_not_null(text);
        cr_assert_gt(strlen(text), 0, "%s has an empty description", all_codes[i].name);
        cr_assert_str_neq(text, "unknown error", "%s", all_codes[i].name);
        for (size_t j = 0; j < i; j++)
            cr_assert_str_neq(text, mw_strerror(all_codes[j].code), "%s and %s read alike",
                              all_codes[i].name, all_codes[j].name);
    }
    cr_assert_str_eq(mw_strerror(MW_ERR_INVALID), "invalid argument");
    cr_assert_str_eq(mw_strerror(MW_ERR_SHAPE), "shape mismatch");
}

Test(status, unknown_codes) {
    const mw_status unknown[] = {(mw_status)1, (mw_status)-99, (mw_status)-1000};
    for (size_t i = 0; i < sizeof unknown / sizeof *unknown; i++) {
        cr_assert_str_eq(mw_strerror(unknown[i]), "unknown error");
        const char *name = mw_status_name(unknown[i]);
        cr_assert_not_null(name);
        for (size_t j = 0; j < NCODES; j++) cr_assert_str_neq(name, all_codes[j].name);
    }
}

Test(status, no_error_yet_and_freeing_null) {
    cr_assert_str_eq(mw_last_error(), "", "no call has failed on this thread");
    mw_graph_free(NULL);
    mw_mesh_free(NULL);
    mw_trainer_free(NULL);
    cr_assert_str_eq(mw_last_error(), "", "freeing NULL is not an error");
}

Test(status, graph_new_needs_an_out_parameter) {
    cr_assert_eq(mw_graph_new(NULL), MW_ERR_INVALID);
    cr_assert_gt(strlen(mw_last_error()), 0, "a failing call leaves a message");
    mw_graph *g = new_graph();
    cr_assert_eq(mw_graph_status(g), MW_OK);
    cr_assert_str_eq(mw_graph_error(g), "");
    mw_graph_free(g);
}

Test(status, version) {
    char expected[32];
    snprintf(expected, sizeof expected, "%d.%d.%d", MESHWIT_VERSION_MAJOR, MESHWIT_VERSION_MINOR,
             MESHWIT_VERSION_PATCH);
    cr_assert_str_eq(mw_version(), expected);
}

/* --- parameter initialisation ----------------------------------------------------------------- */

TestSuite(init, .description = "parameter initialisers, read back through a one-device trainer");

#define INIT_N 4096

typedef struct init_spec {
    const char *name;
    mw_init init;
} init_spec;

#define DEFAULT_SEED 0 /* read_init: leave the graph's seed alone */

/* Declares parameters (each [P=INIT_N]) in the order given on a graph with `seed`, and reads the
 * values of the first one back. */
static void read_init(uint64_t seed, const init_spec *specs, int n, float *out) {
    mw_graph *g = new_graph();
    if (seed != DEFAULT_SEED) mw_graph_set_seed(g, seed);
    mw_tensor *loss = NULL;
    for (int i = 0; i < n; i++) {
        mw_tensor *p = mw_param(g, specs[i].name, MW_AXES({"P", INIT_N}), specs[i].init);
        mw_tensor *s = mw_sum(g, p, NULL);
        loss = loss ? mw_add(g, loss, s) : s;
    }
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    mw_mesh *mesh = NULL;
    mw_trainer *tr = NULL;
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &mesh), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_new(g, loss, mesh, NULL, &tr), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_param(tr, specs[0].name, out, INIT_N), MW_OK, "%s",
                 mw_last_error());
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

static void read_one(uint64_t seed, const char *name, mw_init init, float *out) {
    read_init(seed, &(init_spec){name, init}, 1, out);
}

static float values[INIT_N], other[INIT_N];

Test(init, zeros_and_constants) {
    read_one(1337, "p", MW_INIT_ZEROS, values);
    for (int i = 0; i < INIT_N; i++) cr_assert_eq(values[i], 0.0f, "p[%d] = %g", i, values[i]);
    read_one(1337, "p", MW_INIT_CONST(0.5f), values);
    for (int i = 0; i < INIT_N; i++) cr_assert_eq(values[i], 0.5f, "p[%d] = %g", i, values[i]);
}

/* Sample moments of n = 4096 draws: the mean's standard error is sd / 64 and the sample sd's is
 * about sd / sqrt(2n) = sd / 90; the bounds below are more than 5 standard errors wide. */
static void moments(const float *v, double *mean, double *sd) {
    double s = 0, s2 = 0;
    for (int i = 0; i < INIT_N; i++) s += v[i];
    *mean = s / INIT_N;
    for (int i = 0; i < INIT_N; i++) s2 += (v[i] - *mean) * (v[i] - *mean);
    *sd = sqrt(s2 / (INIT_N - 1));
}

Test(init, normal) {
    double mean, sd;
    read_one(1337, "p", MW_INIT_NORMAL(2.0f), values);
    moments(values, &mean, &sd);
    cr_assert_lt(fabs(mean), 2.0 * 6 / 64, "mean %g", mean);
    cr_assert_lt(fabs(sd - 2.0), 2.0 * 6 / 90, "sd %g", sd);
}

Test(init, uniform) {
    double mean, sd;
    read_one(1337, "p", MW_INIT_UNIFORM(0.25f), values);
    float lo = values[0], hi = values[0];
    for (int i = 0; i < INIT_N; i++) {
        cr_assert_leq(fabsf(values[i]), 0.25f, "p[%d] = %g", i, values[i]);
        lo = fminf(lo, values[i]);
        hi = fmaxf(hi, values[i]);
    }
    /* The gap below the extremes of 4096 uniform draws exceeds 0.01 with probability e^-82. */
    cr_assert_lt(lo, -0.24f);
    cr_assert_gt(hi, 0.24f);
    moments(values, &mean, &sd);
    cr_assert_lt(fabs(sd - 0.25 / sqrt(3.0)), 0.25 / sqrt(3.0) * 6 / 90, "sd %g", sd);
}

/* Values depend on the seed and the parameter's name, not on the declaration order. */
Test(init, seed_and_name_decide_the_values) {
    const init_spec pq[] = {{"p", MW_INIT_NORMAL(1.0f)}, {"q", MW_INIT_NORMAL(1.0f)}};
    const init_spec qp[] = {{"q", MW_INIT_NORMAL(1.0f)}, {"p", MW_INIT_NORMAL(1.0f)}};
    read_init(7, pq, 2, values);
    read_init(7, pq, 2, other);
    cr_assert_arr_eq(values, other, sizeof values, "the same seed gives the same bits");
    read_init(7, &qp[1], 1, other);
    cr_assert_arr_eq(values, other, sizeof values, "other parameters do not shift p's draws");
    read_init(7, qp, 2, other); /* reads q */
    cr_assert_arr_neq(values, other, sizeof values, "p and q differ");
    read_init(8, pq, 2, other);
    cr_assert_arr_neq(values, other, sizeof values, "another seed, other values");
    read_one(DEFAULT_SEED, "p", MW_INIT_NORMAL(1.0f), values);
    read_one(1337, "p", MW_INIT_NORMAL(1.0f), other);
    cr_assert_arr_eq(values, other, sizeof values, "the default seed is 1337");
}

/* --- mw_permute and mw_full ------------------------------------------------------------------- */

Test(axes, permute_moves_axes_and_their_sharding) {
    mw_graph *g = new_graph();
    mw_tensor *x = batch_input(g, "x", 1);
    assert_describes(mw_permute(g, x, "Feature,Batch"), "f32[Feature=4, Batch@X=8]");
    cr_assert_eq(mw_permute(g, x, "Batch,Feature"), x, "the same order is x itself");
    assert_describes(mw_full(g, MW_AXES({"Row", 3}), 1.5f), "f32[Row=3]");
    assert_describes(mw_full(g, MW_SCALAR, 1.0f), "f32[]");
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    mw_graph_free(g);
}

Test(axes, permute_refuses_a_wrong_order) {
    static const char *const orders[] = {"Feature", "Feature,Batch,Feature", "Feature,Seq", ""};
    static const char *const words[] = {"names 1 axes but", "named twice", "no axis named 'Seq'",
                                        "names 0 axes"};
    for (int i = 0; i < 4; i++) {
        mw_graph *g = new_graph();
        mw_tensor *x = batch_input(g, "x", 0);
        EXPECT_TRACE_ERROR(g, mw_permute(g, x, orders[i]), MW_ERR_AXIS, words[i]);
        mw_graph_free(g);
    }
    mw_graph *g = new_graph();
    mw_tensor *bad = mw_full(g, MW_AXES({"Row", 0}), 1.0f);
    EXPECT_TRACE_ERROR(g, bad, MW_ERR_SHAPE, "size 0");
    mw_graph_free(g);
}

/* Values: a permuted tensor on one device and with its batch sharded over three, and a constant
 * added to it. */
Test(axes, permute_and_full_values) {
    enum { B = 6, F = 4 };
    static float x[B * F], y[B * F];
    for (int i = 0; i < B * F; i++) x[i] = (float)i;
    for (int sharded = 0; sharded < 2; sharded++) {
        mw_graph *g = new_graph();
        mw_tensor *in = input(g, "x", MW_AXES({"Batch", B}, {"Feature", F}));
        mw_tensor *xs = sharded ? mw_shard(g, in, "Batch", "X") : in;
        mw_tensor *w = mw_param(g, "w", MW_AXES({"Feature", F}), MW_INIT_CONST(1.0f));
        mw_tensor *out = mw_add(g, mw_permute(g, mw_mul(g, xs, w), "Feature,Batch"),
                                mw_full(g, MW_AXES({"Feature", F}), 0.5f));
        mw_tensor *loss = mw_sum(g, out, NULL);
        cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
        mw_mesh *mesh;
        cr_assert_eq(mw_mesh_new(sharded ? "cpu:3" : "cpu:1", "X", &mesh), MW_OK);
        mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.0f}, .outputs = &out, .noutputs = 1};
        mw_trainer *tr;
        cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());
        mw_feed feed = {"x", x, B * F};
        cr_assert_eq(mw_trainer_eval(tr, &feed, 1, NULL), MW_OK, "%s", mw_last_error());
        cr_assert_eq(mw_trainer_read_output(tr, out, y, B * F), MW_OK, "%s", mw_last_error());
        for (int f = 0; f < F; f++)
            for (int b = 0; b < B; b++)
                cr_assert_eq(y[f * B + b], x[b * F + f] + 0.5f, "sharded %d: [%d, %d]", sharded, f,
                             b);
        mw_trainer_free(tr);
        mw_mesh_free(mesh);
        mw_graph_free(g);
    }
}
