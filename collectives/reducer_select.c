/* Choosing a reducer: the backend of the mesh's devices names its family (devices/backend.h),
 * and the family's rule picks one for the devices and processes. The reducers of CUDA memory
 * live in libmeshwit-cuda.so and libmeshwit-nccl-mpi.so: they are found through the modules'
 * tables (devices/module_abi.h). */
#include "collectives/reducer_select.h"

#include "devices/backend.h"
#include "devices/module.h"

const mw__reducer_vtable *mw__reducer_host(int nprocs) {
    if (nprocs <= 1) return &mw__reducer_shm;
    const mw__dist_api *d = mw__dist(); /* across processes: the MPI module's */
    return d ? d->reducer_hier : NULL;
}

/* CUDA memory: NCCL over MPI across processes (NCCL refuses two ranks on a device, so one GPU
 * per rank); in one process the local reducer when every device shares one GPU (also a single
 * device: no collective runs), NCCL when all are on distinct GPUs. */
static const mw__reducer_vtable *cuda_reducer(int ndevices, const int *ordinals, int nprocs) {
    if (!ordinals) return NULL;
    if (nprocs > 1) return mw__module_api(MW__MODULE_NCCL_MPI);
    const mw__cuda_module_api *m = mw__module_api(MW__MODULE_CUDA);
    if (!m) return NULL;
    int same = 1, distinct = 1;
    for (int i = 1; i < ndevices; i++) {
        if (ordinals[i] != ordinals[0]) same = 0;
        for (int j = 0; j < i; j++)
            if (ordinals[i] == ordinals[j]) distinct = 0;
    }
    if (same) return m->local;
    return distinct ? m->nccl : NULL;
}

const mw__reducer_vtable *mw__reducer_for_procs(const char *device_kind, int ndevices,
                                                const int *ordinals, int nprocs) {
    const mw__backend *b = device_kind ? mw__backend_named(device_kind) : NULL;
    if (!b || ndevices < 1) return NULL;
    switch (b->reducers) {
    case MW__REDUCERS_HOST: return mw__reducer_host(nprocs);
    case MW__REDUCERS_CUDA: return cuda_reducer(ndevices, ordinals, nprocs);
    case MW__REDUCERS_NONE: break;
    }
    return NULL;
}

const mw__reducer_vtable *mw__reducer_for(const char *device_kind, int ndevices,
                                          const int *ordinals) {
    return mw__reducer_for_procs(device_kind, ndevices, ordinals, 1);
}
