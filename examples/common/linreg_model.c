/* Linear regression: synthetic data, the model and a timed training loop. */
#include "linreg_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* --- a portable random generator -------------------------------------------------------------- */

/* xoshiro256** (Blackman and Vigna) seeded through splitmix64, so any 64-bit seed (0 included)
 * gives a well-mixed state; `spare` keeps the second normal of each polar-method pair. */
typedef struct rng {
    uint64_t s[4];
    int has_spare;
    double spare;
} rng;

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static void rng_seed(rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
    r->has_spare = 0;
    r->spare = 0.0;
}

static uint64_t rng_next(rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform in (-1, 1) from the top 53 bits: exact in double on every platform. */
static double rng_signed_unit(rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-52 - 1.0; }

/* Standard normal by Marsaglia's polar method: only sqrt (correctly rounded everywhere) and log
 * touch the uniforms, and the result is rounded to float by the caller. */
static double rng_normal(rng *r) {
    if (r->has_spare) {
        r->has_spare = 0;
        return r->spare;
    }
    double u, v, s;
    do {
        u = rng_signed_unit(r);
        v = rng_signed_unit(r);
        s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    double f = sqrt(-2.0 * log(s) / s);
    r->spare = v * f;
    r->has_spare = 1;
    return u * f;
}

/* --- data ------------------------------------------------------------------------------------- */

mw_status linreg_data_make(int64_t rows, int64_t features, uint64_t seed, linreg_data *out) {
    if (!out) return MW_ERR_INVALID;
    memset(out, 0, sizeof *out);
    if (rows < 1 || features < 1) return MW_ERR_INVALID;
    if ((uint64_t)rows > SIZE_MAX / sizeof(float) / (uint64_t)features) return MW_ERR_INVALID;

    out->rows = rows;
    out->features = features;
    out->x = malloc((size_t)rows * (size_t)features * sizeof(float));
    out->y = malloc((size_t)rows * sizeof(float));
    out->true_w = malloc((size_t)features * sizeof(float));
    if (!out->x || !out->y || !out->true_w) {
        linreg_data_free(out);
        return MW_ERR_NOMEM;
    }
    for (int64_t i = 0; i < features; i++) out->true_w[i] = (float)(i % 5 - 2);

    rng r;
    rng_seed(&r, seed);
    for (int64_t row = 0; row < rows; row++) {
        float *xr = out->x + row * features;
        double dot = 0.0;
        for (int64_t i = 0; i < features; i++) {
            xr[i] = (float)rng_normal(&r);
            dot += (double)xr[i] * out->true_w[i];
        }
        out->y[row] = (float)(dot + 0.1 * rng_normal(&r));
    }
    return MW_OK;
}

void linreg_data_free(linreg_data *d) {
    if (!d) return;
    free(d->x);
    free(d->y);
    free(d->true_w);
    memset(d, 0, sizeof *d);
}

/* --- model ------------------------------------------------------------------------------------ */

mw_status linreg_build(mw_graph *g, int64_t rows, int64_t features, int sharded,
                       const char *mesh_axis, mw_tensor **loss) {
    if (!g || !loss) return MW_ERR_INVALID;
    if (!mesh_axis) mesh_axis = LINREG_MESH_AXIS;

    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", rows}, {"Feature", features}));
    mw_tensor *y = mw_input(g, "y", MW_F32, MW_AXES({"Batch", rows}));
    if (sharded) { /* Batch -> Batch@X: the only difference from one device */
        x = mw_shard(g, x, "Batch", mesh_axis);
        y = mw_shard(g, y, "Batch", mesh_axis);
    }
    mw_tensor *w = mw_param(g, "weights", MW_AXES({"Feature", features}), MW_INIT_ZEROS);
    mw_tensor *b = mw_param(g, "bias", MW_SCALAR, MW_INIT_ZEROS);
    /* b broadcasts over Batch; the mean over a sharded Batch divides by the global row count. */
    mw_tensor *err = mw_sub(g, mw_add(g, mw_dot(g, x, w, "Feature"), b), y);
    *loss = mw_mean(g, mw_mul(g, err, err), NULL);
    return mw_graph_status(g);
}

mw_status linreg_model_new(mw_mesh *mesh, int64_t rows, int64_t features, int sharded, float lr,
                           linreg_model *out) {
    if (!out) return MW_ERR_INVALID;
    memset(out, 0, sizeof *out);
    mw_status st = mw_graph_new(&out->graph);
    mw_tensor *loss = NULL;
    if (st == MW_OK) st = linreg_build(out->graph, rows, features, sharded, NULL, &loss);
    if (st == MW_OK) {
        mw_trainer_config cfg = {.optimizer = {MW_SGD, lr}, .bucket_bytes = 0};
        st = mw_trainer_new(out->graph, loss, mesh, &cfg, &out->trainer);
    }
    if (st != MW_OK) linreg_model_free(out);
    return st;
}

void linreg_model_free(linreg_model *m) {
    if (!m) return;
    mw_trainer_free(m->trainer);
    mw_graph_free(m->graph);
    m->trainer = NULL;
    m->graph = NULL;
}

/* --- training --------------------------------------------------------------------------------- */

void linreg_feeds(const linreg_data *d, mw_feed feeds[2]) {
    feeds[0] = (mw_feed){"x", d->x, d->rows * d->features};
    feeds[1] = (mw_feed){"y", d->y, d->rows};
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

mw_status linreg_steps(mw_trainer *tr, const linreg_data *d, int steps, double *seconds,
                       float *last_loss) {
    mw_feed feeds[2];
    linreg_feeds(d, feeds);
    float loss = NAN;
    mw_status st = MW_OK;
    double t0 = now_seconds();
    for (int s = 0; s < steps && st == MW_OK; s++) st = mw_trainer_step(tr, feeds, 2, &loss);
    double t1 = now_seconds();
    if (seconds) *seconds = t1 - t0;
    if (last_loss) *last_loss = loss;
    return st;
}

mw_status linreg_read_params(mw_trainer *tr, int64_t features, float *weights, float *bias) {
    mw_status st = mw_trainer_read_param(tr, "weights", weights, features);
    if (st == MW_OK) st = mw_trainer_read_param(tr, "bias", bias, 1);
    return st;
}

mw_status linreg_train(mw_trainer *tr, const linreg_data *d, int steps, linreg_result *out) {
    float *w = malloc((size_t)d->features * sizeof *w);
    if (!w) return MW_ERR_NOMEM;
    mw_status st = linreg_steps(tr, d, steps, &out->seconds, &out->last_loss);
    if (st == MW_OK) st = linreg_read_params(tr, d->features, w, &out->bias);
    if (st == MW_OK) out->weight0 = w[0];
    free(w);
    return st;
}

void linreg_single_device(const char *devices, char *buf, size_t size) {
    if (size == 0) return;
    if (devices && strncmp(devices, "cuda", 4) == 0) {
        size_t n = 0;
        if (devices[4] == ':')
            while (devices[5 + n] >= '0' && devices[5 + n] <= '9') n++;
        if (n == 0 || n > 9) {
            snprintf(buf, size, "cuda:0");
        } else {
            snprintf(buf, size, "cuda:%.*s", (int)n, devices + 5);
        }
        return;
    }
    snprintf(buf, size, "cpu:1");
}
