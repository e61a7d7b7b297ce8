/* API consistency: not-found and dtype statuses, outputs read before any run, data errors that
 * name the global row, and messages that read right. */
#include <criterion/criterion.h>
#include <string.h>

#include "meshwit.h"

#define ROWS 8

typedef struct clf {
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
    mw_tensor *logits;
} clf;

/* logits = x . w over Feature, loss = mean cross-entropy against i32 labels y, on `devices`
 * with the batch sharded over X. */
static void clf_make(clf *c, const char *devices) {
    memset(c, 0, sizeof *c);
    cr_assert_eq(mw_graph_new(&c->g), MW_OK);
    mw_graph *g = c->g;
    mw_tensor *x = mw_shard(g, mw_input(g, "x", MW_F32, MW_AXES({"Batch", ROWS}, {"Feature", 2})),
                            "Batch", "X");
    mw_tensor *y = mw_shard(g, mw_input(g, "y", MW_I32, MW_AXES({"Batch", ROWS})), "Batch", "X");
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Feature", 2}, {"Class", 3}), MW_INIT_NORMAL(0.1f));
    c->logits = mw_dot(g, x, w, "Feature");
    mw_tensor *loss = mw_mean(g, mw_cross_entropy(g, c->logits, y, "Class", 0), NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    cr_assert_eq(mw_mesh_new(devices, "X", &c->mesh), MW_OK);
    mw_trainer_config cfg = {
        .optimizer = {MW_SGD, .lr = 0.1f}, .outputs = &c->logits, .noutputs = 1};
    cr_assert_eq(mw_trainer_new(g, loss, c->mesh, &cfg, &c->tr), MW_OK, "%s", mw_last_error());
}

static void clf_free(clf *c) {
    mw_trainer_free(c->tr);
    mw_mesh_free(c->mesh);
    mw_graph_free(c->g);
}

Test(api, label_out_of_range_names_the_global_row) {
    float x[ROWS * 2] = {0};
    int32_t y[ROWS] = {0, 1, 2, 0, 1, 2, 5, 0}; /* row 6 lies in the second device's shard */
    mw_feed feeds[2] = {{"x", x, ROWS * 2}, {"y", y, ROWS}};
    const char *meshes[] = {"cpu:1", "cpu:2"};
    for (int m = 0; m < 2; m++) {
        clf c;
        clf_make(&c, meshes[m]);
        cr_assert_eq(mw_trainer_step(c.tr, feeds, 2, NULL), MW_ERR_INVALID);
        const char *msg = mw_last_error();
        cr_assert(strstr(msg, "cross-entropy target 5 at [6]") && strstr(msg, "input 'y'") &&
                      strstr(msg, "outside [0, 3)"),
                  "%s: %s", meshes[m], msg);
        clf_free(&c);
    }
}

Test(api, read_output_before_any_run_is_a_state_error) {
    clf c;
    clf_make(&c, "cpu:1");
    float out[ROWS * 3];
    cr_assert_eq(mw_trainer_read_output(c.tr, c.logits, out, ROWS * 3), MW_ERR_STATE);
    cr_assert(strstr(mw_last_error(), "no step"), "%s", mw_last_error());
    float x[ROWS * 2] = {0};
    int32_t y[ROWS] = {0};
    mw_feed feeds[2] = {{"x", x, ROWS * 2}, {"y", y, ROWS}};
    cr_assert_eq(mw_trainer_eval(c.tr, feeds, 2, NULL), MW_OK);
    cr_assert_eq(mw_trainer_read_output(c.tr, c.logits, out, ROWS * 3), MW_OK);
    cr_assert_float_eq(out[0], 0.0f, 0, "x is 0, so the logits are");
    clf_free(&c);
}

Test(api, unknown_names_are_not_found) {
    clf c;
    clf_make(&c, "cpu:1");
    float buf[6];
    cr_assert_eq(mw_trainer_read_param(c.tr, "weights", buf, 6), MW_ERR_NOT_FOUND);
    cr_assert(strstr(mw_last_error(), "'weights'"), "%s", mw_last_error());
    cr_assert_eq(mw_trainer_write_param(c.tr, "v", buf, 6), MW_ERR_NOT_FOUND);
    mw_tensor *other = mw_scale(c.g, c.logits, 2.0f); /* traced, but not a configured output */
    cr_assert_eq(mw_trainer_read_output(c.tr, other, buf, 6), MW_ERR_NOT_FOUND);
    cr_assert_str_eq(mw_status_name(MW_ERR_NOT_FOUND), "MW_ERR_NOT_FOUND");
    clf_free(&c);
}

Test(api, wrong_dtype_is_a_dtype_error) {
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *ids = mw_input(g, "ids", MW_I32, MW_AXES({"Batch", 4}));
    mw_tensor *f = mw_input(g, "f", MW_F32, MW_AXES({"Batch", 4}));
    cr_assert_null(mw_add(g, ids, f));
    cr_assert_eq(mw_graph_status(g), MW_ERR_DTYPE);
    cr_assert_str_eq(mw_status_name(MW_ERR_DTYPE), "MW_ERR_DTYPE");
    mw_graph_free(g);
}

Test(api, duplicate_names_read_right) {
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_param(g, "w", MW_AXES({"A", 2}), MW_INIT_ZEROS);
    cr_assert_null(mw_input(g, "w", MW_F32, MW_AXES({"A", 2})));
    cr_assert(strstr(mw_graph_error(g), "already used by a parameter"), "%s", mw_graph_error(g));
    mw_graph_free(g);
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_input(g, "x", MW_F32, MW_AXES({"A", 2}));
    cr_assert_null(mw_param(g, "x", MW_AXES({"A", 2}), MW_INIT_ZEROS));
    cr_assert(strstr(mw_graph_error(g), "already used by an input"), "%s", mw_graph_error(g));
    mw_graph_free(g);
}
