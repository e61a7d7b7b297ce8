/* A device that fails mid-step: every phase, the error names the device and the phase, no
 * parameter changes, every worker is released, and the trainer goes on as if the step had not
 * been tried. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "linreg_model.h"
#include "meshwit.h"
#include "meshwit/testing.h"

#define ROWS 257
#define FEATURES 8

typedef struct rig {
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
    linreg_data data;
    mw_feed feeds[2];
} rig;

static void rig_make_threads(rig *r, const char *devices, int timeout_ms, int cpu_threads) {
    memset(r, 0, sizeof *r);
    cr_assert_eq(linreg_data_make(ROWS, FEATURES, 7, &r->data), MW_OK);
    cr_assert_eq(mw_graph_new(&r->g), MW_OK);
    mw_tensor *loss;
    cr_assert_eq(linreg_build(r->g, ROWS, FEATURES, 1, "X", &loss), MW_OK);
    cr_assert_eq(mw_mesh_new(devices, "X", &r->mesh), MW_OK);
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.05f},
                             .collective_timeout_ms = timeout_ms,
                             .cpu_threads = cpu_threads};
    cr_assert_eq(mw_trainer_new(r->g, loss, r->mesh, &cfg, &r->tr), MW_OK, "%s", mw_last_error());
    r->feeds[0] = (mw_feed){"x", r->data.x, ROWS * FEATURES};
    r->feeds[1] = (mw_feed){"y", r->data.y, ROWS};
}

static void rig_make(rig *r, const char *devices, int timeout_ms) {
    rig_make_threads(r, devices, timeout_ms, MW_CPU_THREADS_AUTO);
}

static void rig_free(rig *r) {
    mw_trainer_free(r->tr);
    mw_mesh_free(r->mesh);
    mw_graph_free(r->g);
    linreg_data_free(&r->data);
}

static void read_weights(rig *r, float *w, float *b) {
    cr_assert_eq(mw_trainer_read_param(r->tr, "weights", w, FEATURES), MW_OK);
    cr_assert_eq(mw_trainer_read_param(r->tr, "bias", b, 1), MW_OK);
}

/* Fault at `phase` of step 2 on `device`: the step fails as promised, and afterwards the trainer
 * produces exactly (bit for bit) what a trainer that never failed produces. */
static void check_fault_threads(const char *devices, int device, mw_phase phase, int cpu_threads) {
    rig r, clean;
    rig_make_threads(&r, devices, 0, cpu_threads);
    rig_make(&clean, devices, 0);
    for (int s = 0; s < 2; s++) {
        cr_assert_eq(mw_trainer_step(r.tr, r.feeds, 2, NULL), MW_OK);
        cr_assert_eq(mw_trainer_step(clean.tr, clean.feeds, 2, NULL), MW_OK);
    }
    float w0[FEATURES], b0, w1[FEATURES], b1;
    read_weights(&r, w0, &b0);
    cr_assert_eq(mw_test_control(MW_TEST_FAULT, r.tr, device, phase, (int64_t)(2), MW_ERR_DEVICE),
                 MW_OK);
    mw_status st = mw_trainer_step(r.tr, r.feeds, 2, NULL);
    cr_assert_eq(st, MW_ERR_DEVICE, "phase %s gave %s", mw_phase_name(phase), mw_status_name(st));
    const char *msg = mw_last_error();
    char dev[16];
    snprintf(dev, sizeof dev, "cpu:%d", device);
    cr_assert(strstr(msg, dev), "message does not name %s: %s", dev, msg);
    cr_assert(strstr(msg, mw_phase_name(phase)), "message does not name the phase: %s", msg);
    cr_assert(strstr(msg, "injected fault"), "message does not give the cause: %s", msg);
    cr_assert_eq(mw_trainer_steps(r.tr), 2);
    read_weights(&r, w1, &b1);
    cr_assert(memcmp(w0, w1, sizeof w0) == 0 && b0 == b1, "a failed step changed parameters");
    for (int s = 0; s < 3; s++) {
        cr_assert_eq(mw_trainer_step(r.tr, r.feeds, 2, NULL), MW_OK, "%s", mw_last_error());
        cr_assert_eq(mw_trainer_step(clean.tr, clean.feeds, 2, NULL), MW_OK);
    }
    float wc[FEATURES], bc;
    read_weights(&r, w1, &b1);
    read_weights(&clean, wc, &bc);
    cr_assert(memcmp(w1, wc, sizeof w1) == 0 && b1 == bc, "the trainer diverged after a fault");
    rig_free(&r);
    rig_free(&clean);
}

static void check_fault(const char *devices, int device, mw_phase phase) {
    check_fault_threads(devices, device, phase, MW_CPU_THREADS_AUTO);
}

Test(faults, every_phase_on_every_device) {
    const mw_phase phases[] = {MW_PHASE_FORWARD, MW_PHASE_FORWARD_COLLECTIVE, MW_PHASE_BACKWARD,
                               MW_PHASE_GRAD_REDUCE, MW_PHASE_UPDATE};
    for (size_t p = 0; p < sizeof phases / sizeof *phases; p++)
        for (int d = 0; d < 3; d++) check_fault("cpu:3", d, phases[p]);
}

/* The same with devices sharing threads (all on the calling thread, or on two threads): the
 * failing device's turn ends with the error, its peers waiting in a collective get the abort
 * when their turn comes, and the trainer (compared with one running a thread per device) goes
 * on bit for bit. */
Test(faults, every_phase_on_every_device_fewer_threads) {
    const mw_phase phases[] = {MW_PHASE_FORWARD, MW_PHASE_FORWARD_COLLECTIVE, MW_PHASE_BACKWARD,
                               MW_PHASE_GRAD_REDUCE, MW_PHASE_UPDATE};
    for (size_t p = 0; p < sizeof phases / sizeof *phases; p++)
        for (int d = 0; d < 3; d++) {
            check_fault_threads("cpu:3", d, phases[p], MW_CPU_THREADS_ONE);
            check_fault_threads("cpu:3", d, phases[p], 2); /* cpu:0 alone, cpu:1-2 together */
        }
}

Test(faults, single_device) {
    check_fault("cpu:1", 0, MW_PHASE_BACKWARD);
    check_fault("cpu:1", 0, MW_PHASE_UPDATE);
}

Test(faults, bad_hook_arguments) {
    rig r;
    rig_make(&r, "cpu:2", 0);
    cr_assert_eq(
        mw_test_control(MW_TEST_FAULT, r.tr, 2, MW_PHASE_FORWARD, (int64_t)(0), MW_ERR_DEVICE),
        MW_ERR_INVALID);
    cr_assert_eq(mw_test_control(MW_TEST_FAULT, r.tr, 0, MW_PHASE_FORWARD, (int64_t)(0), MW_OK),
                 MW_ERR_INVALID);
    rig_free(&r);
}

Test(faults, phase_names) {
    cr_assert_str_eq(mw_phase_name(MW_PHASE_FORWARD), "forward");
    cr_assert_str_eq(mw_phase_name(MW_PHASE_GRAD_REDUCE), "gradient reduction");
    cr_assert_str_eq(mw_phase_name(MW_PHASE_UPDATE), "update");
}

/* A device that stalls past the collective timeout: its peers give up with MW_ERR_TIMEOUT in
 * bounded time, and the trainer then goes on normally. */
Test(faults, stalled_peer_times_out, .timeout = 30) {
    rig r;
    rig_make(&r, "cpu:2", 200);
    cr_assert_eq(mw_trainer_step(r.tr, r.feeds, 2, NULL), MW_OK);
    cr_assert_eq(mw_test_control(MW_TEST_STALL, r.tr, 1, MW_PHASE_GRAD_REDUCE, (int64_t)(1), 1500),
                 MW_OK);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    mw_status st = mw_trainer_step(r.tr, r.feeds, 2, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cr_assert_eq(st, MW_ERR_TIMEOUT, "got %s: %s", mw_status_name(st), mw_last_error());
    cr_assert(strstr(mw_last_error(), "cpu:0"), "%s", mw_last_error());
    /* Bounded: the step ends once the stalled device wakes (1.5 s), never hangs. */
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cr_assert_lt(s, 20.0);
    cr_assert_eq(mw_trainer_step(r.tr, r.feeds, 2, NULL), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_steps(r.tr), 2);
    rig_free(&r);
}

/* The same with four devices on two threads (cpu:0-1 on the caller's, cpu:2-3 on another):
 * while cpu:2 stalls, the caller's gang has nothing to run, sleeps, and wakes for the deadline;
 * cpu:3, behind the stall on its thread, then finds the communicator aborted. */
Test(faults, stalled_peer_times_out_across_gangs, .timeout = 30) {
    rig r;
    rig_make_threads(&r, "cpu:4", 200, 2);
    cr_assert_eq(mw_trainer_step(r.tr, r.feeds, 2, NULL), MW_OK);
    mw_step_stats stats;
    cr_assert_eq(mw_trainer_stats(r.tr, &stats), MW_OK);
    cr_assert_eq(stats.threads, 2);
    cr_assert_eq(mw_test_control(MW_TEST_STALL, r.tr, 2, MW_PHASE_GRAD_REDUCE, (int64_t)(1), 1500),
                 MW_OK);
    mw_status st = mw_trainer_step(r.tr, r.feeds, 2, NULL);
    cr_assert_eq(st, MW_ERR_TIMEOUT, "got %s: %s", mw_status_name(st), mw_last_error());
    cr_assert(strstr(mw_last_error(), "cpu:0") || strstr(mw_last_error(), "cpu:1"), "%s",
              mw_last_error());
    cr_assert_eq(mw_trainer_step(r.tr, r.feeds, 2, NULL), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_steps(r.tr), 2);
    rig_free(&r);
}

/* By default (MW_NONFINITE_STOP) a NaN loss stops the step before the update, naming the step. */
Test(faults, non_finite_loss_stops_the_step) {
    linreg_data d;
    cr_assert_eq(linreg_data_make(ROWS, FEATURES, 7, &d), MW_OK);
    mw_graph *g;
    mw_tensor *loss;
    mw_mesh *mesh;
    mw_trainer *tr;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    cr_assert_eq(linreg_build(g, ROWS, FEATURES, 1, "X", &loss), MW_OK);
    cr_assert_eq(mw_mesh_new("cpu:2", "X", &mesh), MW_OK);
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.05f}};
    cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_OK);
    mw_feed feeds[2] = {{"x", d.x, ROWS * FEATURES}, {"y", d.y, ROWS}};
    cr_assert_eq(mw_trainer_step(tr, feeds, 2, NULL), MW_OK);
    float w0[FEATURES], w1[FEATURES];
    cr_assert_eq(mw_trainer_read_param(tr, "weights", w0, FEATURES), MW_OK);
    float saved = d.y[ROWS - 1];
    d.y[ROWS - 1] = NAN; /* on the last device's shard */
    mw_status st = mw_trainer_step(tr, feeds, 2, NULL);
    cr_assert_eq(st, MW_ERR_NONFINITE, "got %s: %s", mw_status_name(st), mw_last_error());
    cr_assert(strstr(mw_last_error(), "no parameter was updated") &&
                  strstr(mw_last_error(), "step 1: the loss is nan"),
              "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_param(tr, "weights", w1, FEATURES), MW_OK);
    cr_assert(memcmp(w0, w1, sizeof w0) == 0);
    d.y[ROWS - 1] = saved;
    cr_assert_eq(mw_trainer_step(tr, feeds, 2, NULL), MW_OK);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    linreg_data_free(&d);
}
