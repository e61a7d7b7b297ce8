/* Choosing a reducer: the backend of the mesh's devices decides (devices/backend.h). */
#include "collectives/reducer_select.h"

#include "devices/backend.h"

const mw__reducer_vtable *mw__reducer_for_procs(const char *device_kind, int ndevices,
                                                const int *ordinals, int nprocs) {
    const mw__backend *b = device_kind ? mw__backend_named(device_kind) : NULL;
    return b ? b->reducer(ndevices, ordinals, nprocs > 1 ? nprocs : 1) : NULL;
}

const mw__reducer_vtable *mw__reducer_for(const char *device_kind, int ndevices,
                                          const int *ordinals) {
    return mw__reducer_for_procs(device_kind, ndevices, ordinals, 1);
}
