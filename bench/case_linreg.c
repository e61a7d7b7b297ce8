/* Bench case "linreg": ms/step of the linear-regression example on one device and sharded.
 *
 * For every device spec the single-device model (on cpu:1, or the spec's first GPU) and the
 * sharded one both live for the whole measurement and their repeats alternate, so a noisy
 * neighbour slows both alike. A repeat times K steps, K chosen so that it lasts about
 * REPEAT_SECONDS (a step here takes well under a millisecond, so a fixed 20 steps would mostly
 * measure the timer and the scheduler); the table shows the median of the repeats. */
#include <math.h>
#include <stdio.h>

#include "../examples/common/linreg_model.h"
#include "bench.h"

#define ROWS 8192
#define FEATURES 64
#define LR 0.05f
#define SEED 1
#define WARMUP_STEPS 3
#define CALIBRATION_STEPS 9 /* timed one by one */
#define REPEATS 7
#define QUICK_REPEATS 3
#define MIN_STEPS 20     /* per repeat */
#define MAX_STEPS 100000 /* per repeat */
#define QUICK_STEPS 5    /* per repeat, with --quick */
#define REPEAT_SECONDS 0.1

static const char *const default_devices[] = {"cpu:1", "cpu:2", "cpu:4"};

/* One measurement: both models, their medians. */
typedef struct run {
    mw_trainer *tr[2]; /* single, sharded */
    int repeats;
    int steps;            /* per repeat */
    double ms[2];         /* median ms/step: single, sharded */
    int threads[REPEATS]; /* threads that ran the sharded trainer's last step of each repeat */
} run;

static int report(const char *devices, mw_status st, const char *what) {
    fflush(stdout);
    fprintf(stderr, "linreg: %s on %s: %s [%s]: %s\n", what, devices, mw_strerror(st),
            mw_status_name(st), mw_last_error());
    return 1;
}

/* Warms both models up and, unless quick, picks the steps per repeat from the slower model's
 * median step time (a median, so that one hiccup of a busy machine does not shorten every
 * repeat). */
static mw_status calibrate(run *m, const linreg_data *data, int quick) {
    double slowest = 0.0, t[CALIBRATION_STEPS];
    for (int i = 0; i < 2; i++) {
        mw_status st = linreg_steps(m->tr[i], data, WARMUP_STEPS, NULL, NULL);
        for (int k = 0; k < CALIBRATION_STEPS && st == MW_OK; k++)
            st = linreg_steps(m->tr[i], data, 1, &t[k], NULL);
        if (st != MW_OK) return st;
        double step = mwb_median(t, CALIBRATION_STEPS);
        if (step > slowest) slowest = step;
    }
    m->repeats = quick ? QUICK_REPEATS : REPEATS;
    m->steps = QUICK_STEPS;
    if (!quick) {
        double steps = ceil(REPEAT_SECONDS / fmax(slowest, 1e-9));
        m->steps = steps < MIN_STEPS ? MIN_STEPS : steps > MAX_STEPS ? MAX_STEPS : (int)steps;
    }
    return MW_OK;
}

/* Times m->repeats x m->steps steps of each model, alternating which goes first. */
static mw_status measure(run *m, const linreg_data *data) {
    double t[2][REPEATS], seconds;
    for (int r = 0; r < m->repeats; r++) {
        for (int k = 0; k < 2; k++) {
            int i = (r + k) % 2;
            mw_status st = linreg_steps(m->tr[i], data, m->steps, &seconds, NULL);
            if (st != MW_OK) return st;
            t[i][r] = 1e3 * seconds / m->steps;
            mw_step_stats stats;
            if (i == 1 && mw_trainer_stats(m->tr[i], &stats) == MW_OK)
                m->threads[r] = stats.threads;
        }
    }
    for (int i = 0; i < 2; i++) m->ms[i] = mwb_median(t[i], m->repeats);
    return MW_OK;
}

static void emit(mwb_ctx *ctx, const char *devices, const run *m, int sharded) {
    mwb_record r = {0};
    mwb_record_str(&r, "case", "linreg");
    mwb_record_str(&r, "devices", devices);
    mwb_record_str(&r, "mode", sharded ? "sharded" : "single");
    mwb_record_num(&r, "rows", ROWS);
    mwb_record_num(&r, "features", FEATURES);
    mwb_record_num(&r, "repeats", m->repeats);
    mwb_record_num(&r, "steps_per_repeat", m->steps);
    mwb_record_num(&r, "ms_per_step", m->ms[sharded]);
    if (sharded) {
        mwb_record_num(&r, "ratio", m->ms[1] / m->ms[0]);
        mwb_record_num(&r, "threads_last", m->threads[m->repeats - 1]);
    }
    ctx->emit(ctx, &r);
}

/* Measures one device spec and prints its table row; 0, or 1 with the error reported. */
static int run_spec(mwb_ctx *ctx, const linreg_data *data, const char *devices) {
    char single_devices[32];
    linreg_single_device(devices, single_devices, sizeof single_devices);
    mw_mesh *single_mesh = NULL, *mesh = NULL;
    linreg_model single = {0}, sharded = {0};
    run m = {{NULL, NULL}, 0, 0, {0.0, 0.0}, {0}};
    int rc = 0;

    mw_status st = mw_mesh_new(single_devices, LINREG_MESH_AXIS, &single_mesh);
    if (st != MW_OK) {
        rc = report(single_devices, st, "cannot make a mesh");
        goto done;
    }
    st = mw_mesh_new(devices, LINREG_MESH_AXIS, &mesh);
    if (st != MW_OK) {
        rc = report(devices, st, "cannot make a mesh");
        goto done;
    }
    st = linreg_model_new(single_mesh, ROWS, FEATURES, 0, LR, &single);
    if (st != MW_OK) {
        rc = report(single_devices, st, "cannot make the single-device trainer");
        goto done;
    }
    st = linreg_model_new(mesh, ROWS, FEATURES, 1, LR, &sharded);
    if (st != MW_OK) {
        rc = report(devices, st, "cannot make the sharded trainer");
        goto done;
    }
    m.tr[0] = single.trainer;
    m.tr[1] = sharded.trainer;
    st = calibrate(&m, data, ctx->quick);
    if (st == MW_OK) st = measure(&m, data);
    if (st != MW_OK) {
        rc = report(devices, st, "a step failed");
        goto done;
    }
    char threads[3 * REPEATS + 1] = "";
    for (int r = 0, at = 0; r < m.repeats && at < (int)sizeof threads - 4; r++)
        at += snprintf(threads + at, sizeof threads - (size_t)at, r ? ",%d" : "%d", m.threads[r]);
    printf("%-16s %7d x %-6d %14.3f %15.3f %14.2fx  %s\n", devices, m.repeats, m.steps, m.ms[0],
           m.ms[1], m.ms[1] / m.ms[0], threads);
    fflush(stdout);
    emit(ctx, devices, &m, 0);
    emit(ctx, devices, &m, 1);

done:
    linreg_model_free(&sharded);
    linreg_model_free(&single);
    mw_mesh_free(mesh);
    mw_mesh_free(single_mesh);
    return rc;
}

int mwb_case_linreg(mwb_ctx *ctx) {
    const char *const *devices = ctx->ndevices ? ctx->devices : default_devices;
    int ndevices =
        ctx->ndevices ? ctx->ndevices : (int)(sizeof default_devices / sizeof default_devices[0]);
    linreg_data data;
    mw_status st = linreg_data_make(ROWS, FEATURES, SEED, &data);
    if (st != MW_OK) {
        fprintf(stderr, "linreg: cannot make %d x %d data: %s\n", ROWS, FEATURES, mw_strerror(st));
        return 1;
    }
    printf("%d x %d, SGD lr %g; single device vs sharded, repeats alternating; median ms/step\n",
           ROWS, FEATURES, LR);
    printf("(threads: how many ran the sharded trainer's last step of each repeat; fewer than\n"
           " devices when mw_trainer_config.cpu_threads found sharing threads faster)\n");
    printf("%-16s %16s %14s %15s %15s  %s\n", "devices", "repeats x steps", "single ms/step",
           "sharded ms/step", "sharded/single", "threads");
    int failed = 0;
    for (int i = 0; i < ndevices; i++) failed |= run_spec(ctx, &data, devices[i]);
    linreg_data_free(&data);
    return failed;
}
