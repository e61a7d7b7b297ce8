/* Internal: the reducers of every backend, and the choice among them. */
#ifndef MW__REDUCER_SELECT_H
#define MW__REDUCER_SELECT_H

#include "parallel/reducer.h"

/* NCCL among devices on distinct GPUs of this process (builds with MESHWIT_HAVE_NCCL only). */
extern const mw__reducer_vtable mw__reducer_nccl;

/* Devices that share one GPU (cuda:0x2), where NCCL refuses two ranks on a device (builds with
 * MESHWIT_HAVE_CUDA only). */
extern const mw__reducer_vtable mw__reducer_cuda_local;

/* The reducer for a mesh of ndevices devices of backend device_kind ("cpu", "cuda") whose
 * backend numbers are ordinals[0..ndevices): the shared-memory reducer for "cpu"; for "cuda", the
 * local one when every device is on the same GPU and NCCL when all are on distinct GPUs. NULL
 * when none fits (an unknown kind, a build without CUDA or NCCL, or a mix of shared and distinct
 * GPUs). The result is static; never free it. */
const mw__reducer_vtable *mw__reducer_for(const char *device_kind, int ndevices,
                                          const int *ordinals);

#endif
