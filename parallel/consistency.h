/* Internal: trust between a trainer's replicas and processes (parallel/consistency.c), over the
 * collectives with a deadline between processes (collectives/dist.h). */
#ifndef MW__CONSISTENCY_H
#define MW__CONSISTENCY_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/dist.h"
#include "meshwit/status.h"

struct mw_trainer;
struct mw_trainer_config;
struct mw_graph;
struct mw_mesh;
struct mw_tensor;

/* Before a trainer on `mesh` is built: compares the fingerprint of the caller's graph, loss and
 * configuration (every SHARED field of its lists, parallel/config.h, and which parameters
 * decay) with every process the mesh spans (no-op for one process; parallel/agree.h). */
mw_status mw__trainer_agree(const struct mw_trainer_config *cfg, const struct mw_mesh *mesh,
                            const struct mw_graph *graph, const struct mw_tensor *loss);
/* After planning, before the workers start: makes the replica check's scratch when it is
 * configured, and overwrites the program's init_values with rank 0's (across processes). */
mw_status mw__trainer_prepare(struct mw_trainer *tr);
/* At a step boundary: MW_ERR_INTERRUPTED when a stop is requested here or, across processes,
 * in any process. */
mw_status mw__trainer_stop_point(struct mw_trainer *tr);
/* After a completed step: counts it (or the skipped one), runs the periodic replica check. */
mw_status mw__trainer_after_step(struct mw_trainer *tr);
/* Frees what this module added to the trainer. */
void mw__trainer_consistency_free(struct mw_trainer *tr);

#endif
