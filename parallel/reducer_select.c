/* Choosing a reducer from the mesh's backend and GPU numbers. */
#include "parallel/reducer_select.h"

#include <string.h>

const mw__reducer_vtable *mw__reducer_for_procs(const char *device_kind, int ndevices,
                                                const int *ordinals, int nprocs) {
    if (nprocs <= 1) return mw__reducer_for(device_kind, ndevices, ordinals);
    if (!device_kind || ndevices < 1) return NULL;
#ifdef MESHWIT_HAVE_MPI
    if (strcmp(device_kind, "cpu") == 0) return &mw__reducer_mpi_hier;
#ifdef MESHWIT_HAVE_NCCL
    /* One GPU per rank across processes; NCCL refuses two ranks on a device. */
    if (strcmp(device_kind, "cuda") == 0) return &mw__reducer_nccl_mpi;
#endif
#endif
    (void)ordinals;
    return NULL;
}

const mw__reducer_vtable *mw__reducer_for(const char *device_kind, int ndevices,
                                          const int *ordinals) {
    if (!device_kind || ndevices < 1) return NULL;
    if (strcmp(device_kind, "cpu") == 0) return &mw__reducer_shm;
    if (strcmp(device_kind, "cuda") != 0 || !ordinals) return NULL;
    int same = 1, distinct = 1;
    for (int i = 1; i < ndevices; i++) {
        if (ordinals[i] != ordinals[0]) same = 0;
        for (int j = 0; j < i; j++)
            if (ordinals[i] == ordinals[j]) distinct = 0;
    }
#ifdef MESHWIT_HAVE_CUDA
    if (same) return &mw__reducer_cuda_local; /* also a single device: no collective runs */
#endif
#ifdef MESHWIT_HAVE_NCCL
    if (distinct) return &mw__reducer_nccl;
#endif
    (void)same;
    (void)distinct;
    return NULL;
}
