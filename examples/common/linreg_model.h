/* Linear regression on synthetic data: the model shared by the linreg example, the bench and the
 * tests.
 *
 * Data: X is rows x features, standard normal; the true weights are w[i] = (i % 5) - 2 with no
 * bias; y = X.w + 0.1 * noise (standard normal). Model: inputs "x" [Batch, Feature] and "y"
 * [Batch], parameters "weights" [Feature] and "bias" (scalar), both starting at zero;
 * err = dot(x, weights, "Feature") + bias - y; loss = mean over Batch of err^2. Sharding changes
 * only the data's axis: Batch becomes Batch@X. */
#ifndef LINREG_MODEL_H
#define LINREG_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "meshwit.h"

/* The mesh axis the examples and the bench shard Batch over. */
#define LINREG_MESH_AXIS "X"

/* A synthetic data set; every array is owned by the struct (linreg_data_free). */
typedef struct linreg_data {
    int64_t rows;
    int64_t features;
    float *x;      /* rows x features, row-major */
    float *y;      /* rows */
    float *true_w; /* features: the weights y was made from */
} linreg_data;

/* Fills *out with a data set drawn from `seed`. The generator (splitmix64 seeding xoshiro256**,
 * Marsaglia's polar method for normals, computed in double and rounded to float) gives the same
 * numbers on every platform. Row r draws its features in order, then its noise. On failure *out is
 * left empty (safe to free). Errors: MW_ERR_INVALID (NULL out, rows or features < 1, a size that
 * overflows), MW_ERR_NOMEM. No message is recorded in mw_last_error(). */
mw_status linreg_data_make(int64_t rows, int64_t features, uint64_t seed, linreg_data *out);

/* Frees the arrays and empties *d. NULL and an already empty struct are no-ops. */
void linreg_data_free(linreg_data *d);

/* Traces the model into g (see the top of this file) and writes the loss tensor (owned by g) to
 * *loss. With `sharded` non-zero both inputs are split over mesh axis `mesh_axis` (NULL means
 * LINREG_MESH_AXIS). Returns mw_graph_status(g): the first tracing error, with its message in
 * mw_graph_error(g) and mw_last_error(); MW_ERR_INVALID (no message) when g or loss is NULL. */
mw_status linreg_build(mw_graph *g, int64_t rows, int64_t features, int sharded,
                       const char *mesh_axis, mw_tensor **loss);

/* A traced model and its trainer. */
typedef struct linreg_model {
    mw_graph *graph;
    mw_trainer *trainer;
} linreg_model;

/* Builds the model (sharded over LINREG_MESH_AXIS when `sharded`) and a plain-SGD trainer with
 * learning rate lr on `mesh` (borrowed; it must outlive the model). On failure *out is left empty
 * and mw_last_error() says why (tracing errors, MW_ERR_SHARDING for a mesh without axis X or fewer
 * rows than devices, MW_ERR_NOMEM, MW_ERR_DEVICE). */
mw_status linreg_model_new(mw_mesh *mesh, int64_t rows, int64_t features, int sharded, float lr,
                           linreg_model *out);

/* Frees the trainer, then the graph, and empties *m. NULL is a no-op. */
void linreg_model_free(linreg_model *m);

/* The two feeds of a step, pointing into d (borrowed). */
void linreg_feeds(const linreg_data *d, mw_feed feeds[2]);

/* Runs `steps` training steps on the whole of d, timing only the step loop (CLOCK_MONOTONIC).
 * *seconds and *last_loss (the loss before the last update; NaN when steps is 0) may be NULL.
 * Errors: whatever mw_trainer_step returns; the steps before it are kept. */
mw_status linreg_steps(mw_trainer *tr, const linreg_data *d, int steps, double *seconds,
                       float *last_loss);

/* Copies the trained parameters out of tr: `features` weights into weights[] and the bias into
 * *bias. Errors: those of mw_trainer_read_param. */
mw_status linreg_read_params(mw_trainer *tr, int64_t features, float *weights, float *bias);

/* What linreg_train measured. */
typedef struct linreg_result {
    double seconds;  /* the step loop only */
    float last_loss; /* the loss before the last update */
    float bias;      /* after the last step */
    float weight0;   /* weights[0] after the last step */
} linreg_result;

/* linreg_steps, then reads the final bias and weights[0]. Errors: those of linreg_steps and
 * linreg_read_params, MW_ERR_NOMEM (no message recorded). */
mw_status linreg_train(mw_trainer *tr, const linreg_data *d, int steps, linreg_result *out);

/* The single-device counterpart of a device spec, written to buf: "cuda:N" for a spec starting
 * "cuda:N" (N its first GPU), "cuda:0" for other CUDA specs, otherwise "cpu:1". */
void linreg_single_device(const char *devices, char *buf, size_t size);

#endif
