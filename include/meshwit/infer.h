/* meshwit: inference programs.
 *
 * An inference program is a graph compiled forward-only for a set of outputs: no gradients, no
 * optimizer state, and only the inputs those outputs depend on need feeding (no labels, no
 * loss). It runs on a mesh like a trainer, with the inputs sharded as the graph says, and on any
 * number of rows: a call with more (or fewer) rows than the graph was traced with runs it
 * chunk by chunk along the chunk axis, padding the last chunk, so a model traced at 64 rows
 * evaluates 360 in one call. Its parameters are either its own (initialised as the graph says,
 * then loaded or written) or, with mw_infer_from_trainer, those of a trainer on the same mesh,
 * read in place: no copy, and every step of the trainer is seen by the next run.
 *
 * Chunking asks two things of the graph: the chunk axis is the first axis of every input and
 * output that has it (inputs without it are fed whole to every chunk), and no output mixes rows
 * (a mean over the batch would average the padding rows in).
 *
 * Thread-safety: one program is driven from one host thread at a time; a program sharing a
 * trainer's parameters must not run while that trainer steps. */
#ifndef MESHWIT_INFER_H
#define MESHWIT_INFER_H

#include <stdint.h>

#include "graph.h"
#include "mesh.h"
#include "status.h"
#include "trainer.h"
#include "weights.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mw_infer mw_infer;

typedef struct mw_infer_config {
    /* The tensors to compute (at least one), of the program's graph. Borrowed during the call. */
    mw_tensor *const *outputs;
    int noutputs;
    /* The axis along which a run of any number of rows is chunked (base name; NULL: "Batch"). */
    const char *chunk_axis;
    /* As in mw_trainer_config: MW_PRECISION_BF16 computes the contractions and attention in
     * bf16 (a program reading a trainer's parameters keeps its own bf16 copy of them, made again
     * after the trainer changed them). */
    mw_precision precision;
    /* As in mw_trainer_config (cpu_threads: under MW_CPU_THREADS_AUTO the program times its
     * runs' chunks as a trainer times its steps). Each process's own: the cross-process
     * fingerprint (as mw_trainer_new's) compares the graph, the outputs, chunk_axis and
     * precision. */
    int cpu_threads;
    mw_pinning pin_threads;
    int blas_threads;
    int collective_timeout_ms;
} mw_infer_config;

/* Compiles `graph` forward-only for config->outputs over `mesh`, with its own parameters
 * initialised as the graph says. The graph and mesh are borrowed and must outlive the program.
 * Errors: those of mw_trainer_new that concern the graph, the mesh and the options it shares
 * (whatever the graph recorded, MW_ERR_SHARDING, MW_ERR_UNSUPPORTED, MW_ERR_NOMEM,
 * MW_ERR_DEVICE; MW_ERR_INVALID for a field of config outside its range, as mw_trainer_new),
 * MW_ERR_INVALID (out, graph, mesh or config NULL, no outputs, an output NULL or of another graph),
 * MW_ERR_AXIS (an input or output with the chunk axis elsewhere than first), MW_ERR_SHAPE (an
 * output that mixes rows of the chunk axis: a sum, mean, softmax or layer norm over it, a value
 * without it computed from it, or one computed from such a value; the message names the output and
 * how; inputs and outputs whose chunk axes differ in size). */
mw_status mw_infer_new(mw_graph *graph, mw_mesh *mesh, const mw_infer_config *config,
                       mw_infer **out);

/* The same, reading the parameters of `trainer` in place (on its mesh): graph may be the
 * trainer's graph or another one with parameters of the same names and shapes (e.g. the model
 * traced for another batch size). The trainer must outlive the program. Errors: as
 * mw_infer_new, MW_ERR_INVALID (a NULL trainer), MW_ERR_NOT_FOUND (a parameter the trainer
 * lacks), MW_ERR_SHAPE (one of another shape), MW_ERR_SHARDING (one split otherwise than the
 * trainer's: mw_shard it alike); each message names the parameter. */
mw_status mw_infer_from_trainer(mw_trainer *trainer, mw_graph *graph, const mw_infer_config *config,
                                mw_infer **out);

/* Stops the program's workers and frees it (not a trainer's parameters). NULL is a no-op. */
void mw_infer_free(mw_infer *inf);

/* The rows of the chunk axis the graph was traced with (each chunk's), or 0 for NULL. */
int64_t mw_infer_chunk_rows(const mw_infer *inf);

/* Where an output's values go: count = rows x the output's elements per row. */
typedef struct mw_fetch {
    const mw_tensor *output;
    float *data;
    int64_t count;
} mw_fetch;

/* Computes the outputs for `rows` rows (any number >= 1). An input with the chunk axis is fed
 * rows x its elements per row; one without it, its whole size. fetches name where outputs go
 * (any subset of the configured outputs; i32 inputs pass through as they are, outputs are f32).
 * Errors: MW_ERR_INVALID (a NULL program; a missing, unknown, repeated or wrong-sized feed or
 * fetch, or one with NULL data; rows < 1; rows other than the chunk's for a program with states,
 * or with a fetch of an output without the chunk axis; rows > 1 when no input has the chunk
 * axis), MW_ERR_NOT_FOUND (a fetch of a tensor that is not an output), any error of a device. */
mw_status mw_infer_run(mw_infer *inf, const mw_feed *feeds, int nfeeds, int64_t rows,
                       const mw_fetch *fetches, int nfetches);

/* The program's own parameters: weights loaded from a safetensors file (as
 * mw_trainer_load_weights) and single parameters written or read (as mw_trainer_write_param /
 * read_param). Loading or writing into a program that shares a trainer's parameters changes the
 * trainer's. Errors: those of the trainer's functions, and MW_ERR_INVALID for a NULL program. */
mw_status mw_infer_load_weights(mw_infer *inf, const char *path, const mw_weight_name *names,
                                int nnames);
mw_status mw_infer_write_param(mw_infer *inf, const char *name, const float *src, int64_t count);
mw_status mw_infer_read_param(mw_infer *inf, const char *name, float *dst, int64_t count);

#ifdef __cplusplus
}
#endif
#endif
