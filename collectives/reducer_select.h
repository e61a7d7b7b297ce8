/* Internal: the reducers of every backend, and the choice among them. A backend names the family
 * of reducers that moves its buffers (mw__backend::reducers, devices/backend.h); this floor picks
 * the family's reducer for a group of devices, so the trainer asks for a mesh's reducer by the
 * backend's name and never names a backend or a reducer of one. */
#ifndef MW__REDUCER_SELECT_H
#define MW__REDUCER_SELECT_H

#include "collectives/reducer.h"

/* NCCL among devices on distinct GPUs of this process (builds with MESHWIT_HAVE_NCCL only). */
extern const mw__reducer_vtable mw__reducer_nccl;

/* Devices that share one GPU (cuda:0x2), where NCCL refuses two ranks on a device (builds with
 * MESHWIT_HAVE_CUDA only). */
extern const mw__reducer_vtable mw__reducer_cuda_local;

/* NCCL among GPUs of several processes, its communicators set up from a unique id broadcast
 * over MPI (builds with MESHWIT_HAVE_NCCL and MESHWIT_HAVE_MPI only). */
extern const mw__reducer_vtable mw__reducer_nccl_mpi;

/* The reducer for a mesh of ndevices devices of backend device_kind ("cpu", "cuda") whose
 * backend numbers are ordinals[0..ndevices), by the backend's family: the shared-memory reducer
 * for host memory ("cpu"); for CUDA memory ("cuda", whose module this loads), the local one when
 * every device is on the same GPU and NCCL when all are on distinct GPUs. NULL when none fits (an
 * unknown kind, no devices, a build without CUDA or NCCL, or a mix of shared and distinct GPUs).
 * The result is static; never free it. */
const mw__reducer_vtable *mw__reducer_for(const char *device_kind, int ndevices,
                                          const int *ordinals);

/* The same for a mesh spanning nprocs processes: for nprocs > 1 the hierarchical reducer (cpu)
 * or NCCL over MPI (cuda), NULL in a build without them; for nprocs <= 1, mw__reducer_for. */
const mw__reducer_vtable *mw__reducer_for_procs(const char *device_kind, int ndevices,
                                                const int *ordinals, int nprocs);

/* The reducer among buffers in host memory, whatever the devices: the shared-memory reducer for
 * one process, the hierarchical one (the MPI module's) across nprocs > 1 processes, NULL when
 * the MPI module is not loaded. The trainer's host-memory barriers use it. */
const mw__reducer_vtable *mw__reducer_host(int nprocs);

#endif
