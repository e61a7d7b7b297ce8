/* The executor and the hand-off: a worker resolves its kernels once, then re-points the ones
 * that read the caller's input arrays in place at every step's arrays; the first CPU device runs
 * on whichever thread calls the trainer. Both must give the same bits as the plain use (the same
 * arrays every step, one calling thread). */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "meshwit.h"
#include "tests/common/rng.h"

#define ROWS 1024
#define FEATURES 8

typedef struct data {
    float x[ROWS * FEATURES];
    float y[ROWS];
} data;

typedef struct model {
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
} model;

static void fill(data *d, uint64_t seed) {
    uint64_t s = seed;
    for (int i = 0; i < ROWS * FEATURES; i++) d->x[i] = (float)rng_range(rng_lcg64(&s), -1, 1);
    for (int r = 0; r < ROWS; r++) {
        double t = 0.25;
        for (int f = 0; f < FEATURES; f++) t += (f - 3.5) * 0.5 * d->x[r * FEATURES + f];
        d->y[r] = (float)t;
    }
}

/* Linear regression with x and y sharded over X (read in place by CPU devices). */
static void open_model(model *m, const char *devices) {
    memset(m, 0, sizeof *m);
    cr_assert_eq(mw_graph_new(&m->g), MW_OK);
    mw_graph *g = m->g;
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", ROWS}, {"Feature", FEATURES}));
    mw_tensor *y = mw_input(g, "y", MW_F32, MW_AXES({"Batch", ROWS}));
    x = mw_shard(g, x, "Batch", "X");
    y = mw_shard(g, y, "Batch", "X");
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Feature", FEATURES}), MW_INIT_NORMAL(0.5f));
    mw_tensor *err = mw_sub(g, mw_dot(g, x, w, "Feature"), y);
    mw_tensor *loss = mw_mean(g, mw_mul(g, err, err), NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    cr_assert_eq(mw_mesh_new(devices, "X", &m->mesh), MW_OK, "%s", mw_last_error());
    mw_trainer_config cfg = {.optimizer = {.kind = MW_SGD, .lr = 0.1f}};
    cr_assert_eq(mw_trainer_new(g, loss, m->mesh, &cfg, &m->tr), MW_OK, "%s", mw_last_error());
}

static void close_model(model *m) {
    mw_trainer_free(m->tr);
    mw_mesh_free(m->mesh);
    mw_graph_free(m->g);
}

static float step(mw_trainer *tr, const data *d) {
    mw_feed feeds[2] = {{"x", d->x, ROWS * FEATURES}, {"y", d->y, ROWS}};
    float loss = NAN;
    mw_status st = mw_trainer_step(tr, feeds, 2, &loss);
    cr_assert_eq(st, MW_OK, "%s: %s", mw_status_name(st), mw_last_error());
    return loss;
}

static void read_w(mw_trainer *tr, float w[FEATURES]) {
    cr_assert_eq(mw_trainer_read_param(tr, "w", w, FEATURES), MW_OK, "%s", mw_last_error());
}

/* Both models hold the same bits; then frees them. */
static void expect_same_and_close(model *a, model *b, const char *devices) {
    float wa[FEATURES], wb[FEATURES];
    read_w(a->tr, wa);
    read_w(b->tr, wb);
    cr_assert_arr_eq(wa, wb, sizeof wa, "%s", devices);
    close_model(a);
    close_model(b);
}

/* Feeding a new array every step equals copying each step's data into one array. */
static void check_moving_inputs(const char *devices) {
    data *d = malloc(3 * sizeof *d), *same = malloc(sizeof *same);
    cr_assert(d && same);
    fill(&d[0], 1);
    fill(&d[1], 2);
    fill(&d[2], 3);
    model a, b;
    open_model(&a, devices);
    open_model(&b, devices);
    float first[3];
    for (int s = 0; s < 6; s++) {
        memcpy(same, &d[s % 3], sizeof *same);
        float la = step(a.tr, &d[s % 3]), lb = step(b.tr, same);
        cr_assert_eq(memcmp(&la, &lb, sizeof la), 0, "%s step %d: loss %.9g vs %.9g", devices, s,
                     la, lb);
        if (s < 3) first[s] = la;
    }
    /* The data sets differ, so a stale pointer would show. */
    cr_assert_neq(first[0], first[1]);
    cr_assert_neq(first[1], first[2]);
    expect_same_and_close(&a, &b, devices);
    free(d);
    free(same);
}

Test(executor, inputs_move_between_steps_cpu1) { check_moving_inputs("cpu:1"); }
Test(executor, inputs_move_between_steps_cpu2) { check_moving_inputs("cpu:2"); }
Test(executor, inputs_move_between_steps_cpu3) { check_moving_inputs("cpu:3"); }

typedef struct steps_job {
    mw_trainer *tr;
    const data *d;
    int steps;
} steps_job;

static void *run_steps(void *arg) {
    steps_job *j = arg;
    for (int s = 0; s < j->steps; s++) {
        mw_feed feeds[2] = {{"x", j->d->x, ROWS * FEATURES}, {"y", j->d->y, ROWS}};
        if (mw_trainer_step(j->tr, feeds, 2, NULL) != MW_OK) return (void *)1;
    }
    return NULL;
}

/* A trainer made on one thread, stepped on another, then on the first again and freed there. */
static void check_other_thread(const char *devices) {
    data *d = malloc(sizeof *d);
    cr_assert(d);
    fill(d, 7);
    model a, b;
    open_model(&a, devices);
    open_model(&b, devices);
    for (int s = 0; s < 9; s++) step(a.tr, d);
    step(b.tr, d);
    steps_job job = {b.tr, d, 4};
    pthread_t t;
    void *failed = (void *)1;
    cr_assert_eq(pthread_create(&t, NULL, run_steps, &job), 0);
    cr_assert_eq(pthread_join(t, &failed), 0);
    cr_assert_null(failed, "%s: a step on another thread failed", devices);
    for (int s = 0; s < 4; s++) step(b.tr, d);
    expect_same_and_close(&a, &b, devices);
    free(d);
}

Test(executor, steps_from_another_thread_cpu1) { check_other_thread("cpu:1"); }
Test(executor, steps_from_another_thread_cpu2) { check_other_thread("cpu:2"); }
