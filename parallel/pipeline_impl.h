/* Internal: what a trainer made with mw_trainer_config.pipeline_axis (parallel/trainer*.c)
 * asks of the pipeline it wraps (parallel/pipeline.c). */
#ifndef MW__PIPELINE_IMPL_H
#define MW__PIPELINE_IMPL_H

#include "meshwit.h"

/* Forward only over the step's micro-batches, stage after stage: the mean of their losses. */
mw_status mw__pipeline_eval(mw_pipeline *p, const mw_feed *feeds, int nfeeds, float *loss);
/* The trainer of stage s (0 .. stages-1), and the one holding parameter `name` (the owner of a
 * shared one), or NULL (also a stage of another process). */
mw_trainer *mw__pipeline_stage_trainer(const mw_pipeline *p, int s);
mw_trainer *mw__pipeline_param_trainer(const mw_pipeline *p, const char *name);
/* The first stage of this process (a pipeline across processes holds only some), or NULL. */
mw_trainer *mw__pipeline_first_trainer(const mw_pipeline *p);
/* The processes the pipeline spans. */
int mw__pipeline_processes(const mw_pipeline *p);
/* count floats of buf from the process whose stage holds parameter `name` (its owner's) into
 * every process's buf: a collective of every process of the pipeline. */
mw_status mw__pipeline_share_param(mw_pipeline *p, const char *name, float *buf, int64_t count);
/* mw_trainer_check_replicas of every stage of this process, and each tied parameter's copy
 * against its owner's value: a collective of every process of the pipeline, all told the first
 * difference found. */
mw_status mw__pipeline_check_replicas(mw_pipeline *p);
/* The whole model's graph (the caller's). */
const mw_graph *mw__pipeline_graph(const mw_pipeline *p);
/* Device `device` of the pipeline's mesh: its stages' trainers (out, up to 64; returns how
 * many) and its index within their meshes. */
int mw__pipeline_device(const mw_pipeline *p, int device, mw_trainer **out, int *local);
/* Devices of the pipeline's mesh. */
int mw__pipeline_devices(const mw_pipeline *p);
/* The last step's wall time in ms (0 before a step). */
double mw__pipeline_step_ms(const mw_pipeline *p);

#endif
