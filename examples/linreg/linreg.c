/* linreg: the same linear-regression model trained on one device, then sharded over a mesh.
 *
 * Only the data's axis changes between the two runs (Batch becomes Batch@X); the library inserts
 * the collectives. The program checks that both runs end with the same parameters.
 *
 * Under mpirun (one process per host or per device) the sharded mesh spans every process: each
 * passes its own --devices and reads only its devices' rows; the single-device baseline runs in
 * every process on its own, and only rank 0 prints.
 *
 * Under mpirun every process must be given the same flags (all but --devices): they are compared
 * before training. SIGINT or SIGTERM finishes the step in flight and exits 130 or 143; a second
 * signal exits at once.
 *
 * --load starts both runs from a safetensors file of "weights" and "bias" (as --save writes it:
 * the sharded run's parameters); both go through the library's file discipline (meshwit/file.h),
 * checked before training.
 *
 * Exit status: 0 when the sharded parameters match single device within 1e-5, 1 when they do not,
 * 2 on bad arguments, a file that cannot be used or a library error, 130/143 interrupted. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/cli.h"
#include "../common/linreg_model.h"
#include "../common/options.h"

/* Largest |sharded - single| accepted: float sums taken in another order differ by ulps. */
#define TOLERANCE 1e-5

typedef struct options {
    const char *devices;
    const char *load, *save; /* --load, --save: safetensors files of "weights" and "bias" */
    int64_t rows;
    int64_t features;
    int64_t steps;
    double lr;
    uint64_t seed;
} options;

#define F(field) offsetof(options, field)
#define STR(x) #x
#define XSTR(x) STR(x)

/* Every flag; under mpirun every process must be given the same, but for the CLI_LOCAL ones. */
static const cli_option table[] = {
    CLI_OPT("--devices", CLI_STRING, F(devices), "cpu:2", "SPEC",
            "devices of the sharded run (e.g. cpu:4, cuda:0,1); under mpirun, each process's own "
            "devices",
            .flags = CLI_LOCAL),
    CLI_OPT("--rows", CLI_I64, F(rows), "8192", "N", "rows of X", .min = 1,
            .max = (double)(INT64_C(1) << 40)),
    CLI_OPT("--features", CLI_I64, F(features), "64", "N", "columns of X", .min = 1,
            .max = (double)(INT64_C(1) << 30)),
    CLI_OPT("--steps", CLI_I64, F(steps), "200", "N", "training steps", .min = 1, .max = 1e9),
    CLI_OPT("--lr", CLI_DOUBLE, F(lr), "0.05", "X", "learning rate, above 0", .min = 0,
            .max = HUGE_VAL, .flags = CLI_ABOVE_MIN),
    CLI_OPT("--seed", CLI_U64, F(seed), "1", "N", "data seed"),
    CLI_OPT("--load", CLI_STRING, F(load), NULL, "FILE",
            "start both runs from FILE's \"weights\" and \"bias\" (else from zeros)",
            .flags = CLI_FILE),
    CLI_OPT("--save", CLI_STRING, F(save), NULL, "FILE",
            "write the sharded run's parameters to FILE (safetensors; under mpirun rank 0 writes "
            "it)",
            .flags = CLI_LOCAL),
};

static const cli_program program = {
    "linreg",
    sizeof(options),
    table,
    CLI_COUNT(table),
    "usage: linreg [options]     (or: mpirun -np P linreg [options])\n"
    "Trains y = X.w + b by full-batch gradient descent on one device, then with the batch\n"
    "sharded over a mesh, and checks that both give the same parameters.\n"
    "\n",
    "\n"
    "The single-device run uses cpu:1, or cuda:N for a spec starting with cuda:N.\n"
    "Exit status: 0 results agree within " XSTR(
        TOLERANCE) ", 1 they differ, 2 bad arguments or an\n"
                   "error, 130/143 interrupted by SIGINT/SIGTERM.\n",
    NULL,
};

/* Reports a failed library call; returns the exit status for it. */
static int fail(mw_status st, const char *what, const char *subject) {
    fflush(stdout);
    const char *msg = mw_last_error();
    if (mw_distributed_size() > 1) fprintf(stderr, "[rank %d] ", mw_distributed_rank());
    fprintf(stderr, "linreg: %s%s: %s [%s]%s%s\n", what, subject ? subject : "", mw_strerror(st),
            mw_status_name(st), *msg ? ": " : "", msg);
    return 2;
}

static void print_run(const char *label, int64_t steps, const linreg_result *r) {
    printf("%-15s%" PRId64 " steps in %6.3f s  (%5.2f ms/step)\n", label, steps, r->seconds,
           1e3 * r->seconds / (double)steps);
    printf("               final bias %+.4f, weights[0] %+.4f\n", r->bias, r->weight0);
    fflush(stdout);
}

/* "batch Batch@X x Feature, 4096 rows per device" (or "2731-2730" when uneven). */
static void print_batch(mw_trainer *tr) {
    int64_t lo = INT64_MAX, hi = 0;
    for (int d = 0; d < mw_trainer_devices(tr); d++) {
        int64_t n = mw_trainer_local_size(tr, d, "Batch");
        if (n < lo) lo = n;
        if (n > hi) hi = n;
    }
    printf("batch Batch@%s x Feature, ", LINREG_MESH_AXIS);
    if (lo == hi) {
        printf("%" PRId64 " row%s per device\n", hi, hi == 1 ? "" : "s");
    } else {
        printf("%" PRId64 "-%" PRId64 " rows per device\n", hi, lo);
    }
}

/* Trains one model on `mesh` and reads back its parameters into weights[] and *bias. */
static int train(const options *o, const linreg_data *data, mw_mesh *mesh, int sharded,
                 float *weights, float *bias) {
    linreg_model m;
    mw_status st = linreg_model_new(mesh, o->rows, o->features, sharded, (float)o->lr, &m);
    if (st != MW_OK) return fail(st, "cannot make the trainer on ", mw_mesh_describe(mesh));
    if (sharded) print_batch(m.trainer);
    if (o->load && (st = mw_trainer_load_weights(m.trainer, o->load, NULL, 0)) != MW_OK) {
        linreg_model_free(&m);
        return fail(st, "cannot load --load ", o->load);
    }

    linreg_result r;
    st = linreg_train(m.trainer, data, (int)o->steps, &r);
    if (st == MW_ERR_INTERRUPTED) {
        printf("interrupted at step %lld of the %s run\n", (long long)mw_trainer_steps(m.trainer),
               sharded ? "sharded" : "single-device");
        fflush(stdout);
        linreg_model_free(&m);
        return cli_stop_status();
    }
    if (st == MW_OK) st = linreg_read_params(m.trainer, o->features, weights, bias);
    if (st == MW_OK && sharded && o->save && mw_distributed_rank() == 0 &&
        (st = mw_trainer_save_weights(m.trainer, o->save, NULL, 0)) != MW_OK) {
        linreg_model_free(&m);
        return fail(st, "cannot write --save ", o->save);
    }
    linreg_model_free(&m);
    if (st != MW_OK) return fail(st, "training failed", NULL);
    print_run(sharded ? "sharded" : "single device", o->steps, &r);
    return 0;
}

static double max_abs_diff(const float *a, const float *b, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d; /* keeps a NaN */
    }
    return m;
}

static int all_finite(const float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return 0;
    return 1;
}

int main(int argc, char **argv) {
    mw_status st = mw_distributed_init(&argc, &argv);
    if (st != MW_OK) return fail(st, "cannot start MPI", NULL);
    int nprocs = mw_distributed_size();
    /* Every process computes the same numbers; one report is enough. */
    if (mw_distributed_rank() > 0 && !freopen("/dev/null", "w", stdout)) return 2;
    options o;
    int rc = cli_parse(&program, argc, argv, &o);
    if (rc > 0) cli_usage(&program, stdout);
    if (rc != 0) {
        mw_distributed_finalize();
        return rc > 0 ? 0 : 2;
    }

    char flags[256] = "";
    cli_options_text(&program, &o, flags, sizeof flags);
    if ((st = mw_distributed_agree("linreg flags", flags, 0)) != MW_OK) {
        rc = fail(st, "the processes were started differently", NULL);
        mw_distributed_abort(rc);
    }
    if (cli_catch_stop_signals() != 0) {
        fprintf(stderr, "linreg: cannot install the SIGINT/SIGTERM handler\n");
        mw_distributed_abort(2);
    }
    /* The files, checked before any training: --load a regular file, --save not it, no FIFO,
     * device or folder, in a folder that takes a new file, with room for the parameters. */
    mw_file_set *fs;
    st = mw_file_set_new(&fs);
    if (!st && o.load) st = mw_file_set_add_input(fs, o.load, "--load", 0);
    if (!st && o.save && mw_distributed_rank() == 0)
        st = mw_file_set_add_output(fs, o.save, "--save", 0, 4 * (o.features + 1) + 4096);
    mw_file_set_free(fs);
    if (st != MW_OK) {
        fprintf(stderr, "linreg: %s\n", mw_last_error());
        if (nprocs > 1) mw_distributed_abort(2);
        mw_distributed_finalize();
        return 2;
    }

    char single_spec[32];
    linreg_single_device(o.devices, single_spec, sizeof single_spec);
    mw_mesh *single_mesh = NULL, *mesh = NULL;
    linreg_data data = {0};
    /* weights then bias, for each run */
    float *single = NULL, *sharded = NULL;

    /* Check both device specs before spending time on training. */
    st = mw_mesh_new(o.devices, LINREG_MESH_AXIS, &mesh);
    if (st != MW_OK) {
        rc = fail(st, "cannot make a mesh over --devices ", o.devices);
        goto done;
    }
    st = mw_mesh_new_local(single_spec, LINREG_MESH_AXIS, &single_mesh);
    if (st != MW_OK) {
        rc = fail(st, "cannot make the single-device mesh ", single_spec);
        goto done;
    }
    st = linreg_data_make(o.rows, o.features, o.seed, &data);
    single = malloc(2 * ((size_t)o.features + 1) * sizeof(float));
    if (st != MW_OK || !single) {
        fprintf(stderr, "linreg: cannot make %" PRId64 " x %" PRId64 " data: %s\n", o.rows,
                o.features, mw_strerror(st != MW_OK ? st : MW_ERR_NOMEM));
        rc = 2;
        goto done;
    }
    sharded = single + o.features + 1;

    rc = train(&o, &data, single_mesh, 0, single, single + o.features);
    if (rc) goto done;
    if (nprocs > 1) printf("%d processes\n", nprocs);
    printf("%s\n", mw_mesh_describe(mesh));
    rc = train(&o, &data, mesh, 1, sharded, sharded + o.features);
    if (rc) goto done;

    double diff = max_abs_diff(single, sharded, o.features + 1);
    printf("max abs difference sharded vs single device: %.3g (tolerance %g)\n", diff, TOLERANCE);
    if (!all_finite(single, o.features + 1)) {
        fflush(stdout);
        fprintf(stderr, "linreg: training diverged (non-finite parameters); try a smaller --lr\n");
        rc = 1;
    } else if (!(diff <= TOLERANCE)) {
        fflush(stdout);
        fprintf(stderr,
                "linreg: the sharded run does not match single device: weights/bias differ by "
                "%.3g, more than %g\n",
                diff, TOLERANCE);
        rc = 1;
    }

done:
    free(single);
    linreg_data_free(&data);
    mw_mesh_free(mesh);
    mw_mesh_free(single_mesh);
    /* A process that failed or was interrupted ends the job: its peers may be waiting for it in
     * a collective. */
    if ((rc == 2 || (rc > 128 && cli_stop_signal())) && nprocs > 1) mw_distributed_abort(rc);
    mw_distributed_finalize();
    return rc;
}
