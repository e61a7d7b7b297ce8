/* meshwit: pipeline parallelism.
 *
 * A pipeline lays a model's layers along one mesh axis: the graph's regions (mw_region_begin,
 * one per transformer block, say) are cut into stages, one after another, and stage s runs on the
 * devices at coordinate s of the pipeline axis (with interleaving, stages s, s + P, s + 2P, ...
 * on those of coordinate s). What the graph computes before its first region goes with the first
 * stage, what it computes after its last region (the final norm, the head, the loss) with the
 * last. Each stage is a trainer of its own over the other axes of the mesh (data parallel, tensor
 * parallel, FSDP and ZeRO-1 inside a stage work as in mw_trainer), holding only its stage's
 * parameters and optimizer state. A step feeds M micro-batches; a value that crosses a stage
 * boundary is sent to the next stage after a micro-batch's forward part, and its gradient sent
 * back after the next stage's backward part, in the order the schedule gives each device. Every
 * stage accumulates the gradients of the M micro-batches in micro-batch order, and once every
 * stage has them all, all stages update: so a step is the update that gradient accumulation over
 * the same M micro-batches makes on one device (mw_trainer_accumulate, then mw_trainer_step),
 * byte for byte where the stage's kernels sum as the whole model's do (every layout of the
 * trainer that gives the same bits without a pipeline gives them with one).
 *
 * A parameter read by two stages (GPT-2's tied embedding) lives on the first; the last sends its
 * share of the gradient back, which the first adds before its own, as the whole graph's backward
 * pass does, and after the update gets the first's value. Split over a mesh axis (FSDP), it is
 * shared as the whole its GATHER makes: the share is the gathered whole's gradient, added before
 * the first stage's reduce-scatter. Writing it (mw_pipeline_write_param) writes both stages.
 *
 * Values cross stages through host memory in this version (a copy out of the producing stage's
 * devices, read in place by CPU devices of the next), which costs two copies of each boundary
 * activation per micro-batch.
 *
 * Across processes (a mesh of mw_mesh_new under mpirun), the pipeline axis may cross them: each
 * stage lies inside one process (e.g. P=2,X=2 with two devices per process: stage 0 in process 0,
 * stage 1 in process 1), every process builds and runs only its own stages, and the values,
 * gradients and tied parameters that cross from a stage of one process to a stage of another
 * are MPI messages (one per boundary value and micro-batch, from the same host buffers). The
 * step's outcome is agreed by every process before any updates: a stage failing in one process
 * fails the step in all with that process's status and message ("process 1, stage 1 ..."), the
 * others' receives given up at once, and nothing changes anywhere; a process that stalls is
 * given up after collective_timeout_ms. The whole model's gradient norm, the losses, reading a
 * parameter, checkpoints and mw_trainer_check_replicas are collectives of every process of the
 * pipeline; writing a parameter writes the stages of this process that hold it, so every
 * process writes the same values.
 *
 * Thread-safety: one pipeline is driven from one host thread at a time; it runs a thread per
 * device position along the pipeline axis during a step. */
#ifndef MESHWIT_PIPELINE_H
#define MESHWIT_PIPELINE_H

#include <stdint.h>

#include "graph.h"
#include "mesh.h"
#include "status.h"
#include "trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* mw_pipeline_schedule: see trainer.h. */

typedef struct mw_pipeline_config {
    /* Every stage's trainer configuration. Its outputs must be empty (noutputs 0: a stage's
     * values are not read back yet), grad_accumulation is implied. The gradient norm that
     * grad_clip and nonfinite use is the whole model's (each stage's norm combined, to float
     * rounding of the one-device norm). */
    mw_trainer_config trainer;
    /* The mesh axis the stages lie along (e.g. "P"). No tensor of the graph may be split over
     * it. */
    const char *axis;
    int micro_batches; /* M >= 1 micro-batches per step */
    mw_pipeline_schedule schedule;
    int virtual_stages; /* MW_SCHEDULE_INTERLEAVED: stages per device, >= 2; else 0 or 1 */
    /* NULL: the regions are cut into stages of about equal cost (the contractions' and
     * attentions' FLOPs and every other op's elements, from the graph); else per region (in the
     * order they were begun) its stage: non-decreasing from 0 to the last stage, none skipped. */
    const int *region_stage;
} mw_pipeline_config;

typedef struct mw_pipeline mw_pipeline;

/* Makes a pipeline that minimises `loss` (an f32 scalar of `graph`, traced for ONE micro-batch)
 * over `mesh`. The graph and mesh are borrowed and must outlive the pipeline. Errors:
 * MW_ERR_INVALID (a NULL argument; no axis, or one the mesh lacks; micro_batches < 1; the
 * trainer configuration's own pipeline_axis, micro_batches or virtual_stages set;
 * virtual_stages out of range or given to another schedule; region_stage not as described; the
 * trainer configuration's own errors; a graph with fewer regions than stages, naming both counts
 * and the fix; a loss that does not depend on the last stage), MW_ERR_SHARDING (a tensor split
 * over the pipeline axis), MW_ERR_UNSUPPORTED (a stage whose devices lie in more than one process;
 * outputs in the trainer configuration; a parameter read by more than two stages, or split over a
 * mesh axis and read by two where it is split (not through one GATHER to the whole); one read by
 * two stages whose devices lie on more than one axis; a value that crosses a stage boundary that is
 * not f32, or is read by more than one later stage), and those of mw_trainer_new for each stage
 * (the message names the stage). */
mw_status mw_pipeline_new(mw_graph *graph, mw_tensor *loss, mw_mesh *mesh,
                          const mw_pipeline_config *config, mw_pipeline **out);

void mw_pipeline_free(mw_pipeline *p);

/* One step: feeds holds every input of the graph once, each with M times the elements of the
 * graph's input: the M micro-batches one after another (for inputs whose first axis is the
 * batch: the global batch's rows in order, micro-batch k being rows k*B .. (k+1)*B - 1). Writes
 * the mean of the micro-batches' losses (summed in micro-batch order in double) to *loss when
 * not NULL. When a stage fails, no parameter has changed unless the failure came during the
 * update itself (the message says so) and the next step starts afresh. Errors: MW_ERR_INVALID
 * (a missing, unknown, repeated or wrong-sized feed), MW_ERR_NONFINITE (the whole model's
 * gradient norm is not finite, with nonfinite MW_NONFINITE_STOP: no stage updated), and those of
 * the stages' trainers (naming the stage). */
mw_status mw_pipeline_step(mw_pipeline *p, const mw_feed *feeds, int nfeeds, float *loss);

/* Parameter `name` whole, from the stage that holds it (or into every stage that holds it: a
 * tied parameter's two). Across processes reading is a collective (every process calls it with
 * the same name and gets the value), and writing writes this process's stages. Errors: as
 * mw_trainer_read_param's. */
mw_status mw_pipeline_read_param(mw_pipeline *p, const char *name, float *dst, int64_t count);
mw_status mw_pipeline_write_param(mw_pipeline *p, const char *name, const float *src,
                                  int64_t count);

/* What one stage is and holds. */
typedef struct mw_pipeline_stage_info {
    int device; /* its coordinate along the pipeline axis */
    int first_region, nregions;
    int64_t parameters;      /* elements of its parameters, whole */
    int micro_in_flight;     /* the most micro-batches whose activations it holds at once */
    mw_device_memory memory; /* of its first device (activations: every slot's arena); zeros
                                for a stage of another process, as its times */
    /* Its time in the last step's forward parts, backward parts (with the zero-bubble schedule:
     * the input gradients) and, zero-bubble only, weight gradients, summed over the micro-batches
     * (transfers to and from the host included); busy_ms is their sum. */
    double forward_ms, backward_ms, weight_ms, busy_ms;
} mw_pipeline_stage_info;

/* Number of stages (P x virtual stages); 0 for NULL. */
int mw_pipeline_stages(const mw_pipeline *p);

/* Errors: MW_ERR_INVALID (NULL, or a stage out of range). */
mw_status mw_pipeline_stage(const mw_pipeline *p, int stage, mw_pipeline_stage_info *out);

/* The last step's idle fraction of the device at coordinate d of the pipeline axis: 1 - (its
 * stages' busy time) / (the step's wall time from the first action to the last); -1 for a bad
 * argument, before a step, or a coordinate of another process. */
double mw_pipeline_idle(const mw_pipeline *p, int d);

#ifdef __cplusplus
}
#endif
#endif
