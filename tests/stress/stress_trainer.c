/* Stress of the worker pool for ThreadSanitizer: many trainers made and freed over 1 to 4
 * virtual devices (oversubscribed on small machines), steps, evals and gradient computations
 * interleaved, faults injected at random phases, half of the rounds with the optimizer sharded
 * (ZeRO-1: reduce-scatter, slice update, all-gather), half of them with devices sharing one or
 * two threads (mw_trainer_config.cpu_threads), and every result checked against a
 * single-device trainer. A plain C program (Criterion does not run under ThreadSanitizer): exit
 * 0 on success, 1 with a message on the first failure. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "linreg_model.h"
#include "meshwit.h"
#include "meshwit/testing.h"
#include "tests/common/rng.h"

#define ROWS 61
#define FEATURES 20 /* 21 parameters: two slices of the flat buffer */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static int below(int n) { return (int)(rng_splitmix64(&rng) % (uint64_t)n); }

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "stress_trainer: " __VA_ARGS__);                                       \
            fprintf(stderr, " (%s)\n", mw_last_error());                                           \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

typedef struct rig {
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
} rig;

static int rig_make(rig *r, const char *devices, int shard, int cpu_threads) {
    mw_tensor *loss;
    memset(r, 0, sizeof *r);
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.05f, .momentum = 0.5f},
                             .shard_optimizer = shard,
                             .cpu_threads = cpu_threads};
    return mw_graph_new(&r->g) || linreg_build(r->g, ROWS, FEATURES, 1, "X", &loss) ||
           mw_mesh_new(devices, "X", &r->mesh) || mw_trainer_new(r->g, loss, r->mesh, &cfg, &r->tr);
}

static void rig_free(rig *r) {
    mw_trainer_free(r->tr);
    mw_mesh_free(r->mesh);
    mw_graph_free(r->g);
}

int main(void) {
    linreg_data d;
    if (linreg_data_make(ROWS, FEATURES, 3, &d)) return 1;
    mw_feed feeds[2] = {{"x", d.x, ROWS * FEATURES}, {"y", d.y, ROWS}};
    int faults = 0, sharded = 0, one_thread = 0;
    for (int round = 0; round < 24; round++) {
        char spec[16];
        snprintf(spec, sizeof spec, "cpu:%d", 1 + below(4));
        rig ref, r;
        int shard = below(2), threads = below(4) - 1; /* PER_DEVICE, AUTO, 1 or 2 threads */
        sharded += shard && strcmp(spec, "cpu:1") != 0;
        one_thread += threads >= 1 && strcmp(spec, "cpu:1") != 0;
        CHECK(!rig_make(&ref, "cpu:1", 0, 0) && !rig_make(&r, spec, shard, threads),
              "cannot make trainers on %s", spec);
        int steps = 1 + below(12);
        for (int s = 0; s < steps; s++) {
            float a, b;
            if (below(4) == 0) {
                int dev = below(mw_trainer_devices(r.tr));
                mw_phase ph = (mw_phase)below(5);
                CHECK(mw_test_control(MW_TEST_FAULT, r.tr, dev, ph,
                                      (int64_t)(mw_trainer_steps(r.tr)), MW_ERR_DEVICE) == MW_OK,
                      "inject");
                CHECK(mw_trainer_step(r.tr, feeds, 2, NULL) == MW_ERR_DEVICE,
                      "an injected fault on %s device %d did not fail the step", spec, dev);
                faults++;
            }
            switch (below(3)) {
            case 0:
                CHECK(mw_trainer_eval(r.tr, feeds, 2, &a) == MW_OK &&
                          mw_trainer_eval(ref.tr, feeds, 2, &b) == MW_OK,
                      "eval on %s", spec);
                break;
            case 1:
                CHECK(mw_trainer_compute_grads(r.tr, feeds, 2, &a) == MW_OK &&
                          mw_trainer_compute_grads(ref.tr, feeds, 2, &b) == MW_OK,
                      "compute_grads on %s", spec);
                break;
            default:
                CHECK(mw_trainer_step(r.tr, feeds, 2, &a) == MW_OK &&
                          mw_trainer_step(ref.tr, feeds, 2, &b) == MW_OK,
                      "step on %s", spec);
            }
            CHECK(fabsf(a - b) <= 1e-5f * (1.0f + fabsf(b)), "loss %g on %s, %g on cpu:1", a, spec,
                  b);
        }
        float w[FEATURES], wr[FEATURES];
        CHECK(mw_trainer_read_param(r.tr, "weights", w, FEATURES) == MW_OK &&
                  mw_trainer_read_param(ref.tr, "weights", wr, FEATURES) == MW_OK,
              "read");
        for (int i = 0; i < FEATURES; i++)
            CHECK(fabsf(w[i] - wr[i]) <= 1e-5f, "weights[%d] %g on %s, %g on cpu:1", i, w[i], spec,
                  wr[i]);
        rig_free(&r);
        rig_free(&ref);
    }
    linreg_data_free(&d);
    printf("stress_trainer: 24 rounds (%d with ZeRO-1 on several devices, %d on 1-2 threads), %d "
           "injected faults, results equal to one device\n",
           sharded, one_thread, faults);
    return 0;
}
