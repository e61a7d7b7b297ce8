/* Inside libmeshwit-nccl-mpi.so only: what NCCL over MPI (collectives/mpi/nccl_mpi.c) takes from
 * the other modules, through the core: the MPI lock and the reducer between processes of
 * libmeshwit-mpi.so (one lock and one MPI world for the whole process), and the CUDA backend's
 * services of libmeshwit-cuda.so (mw__cuda_api: the very vtable its devices carry, their streams,
 * GPU identities). nccl_mpi.c is compiled with mw__reducer_mpi_hier defined as (*mw__mpi_hier())
 * and mw__cuda_services as (*mw__cuda_peer()) (cmake/MeshwitModules.cmake). The reducer is used
 * only on a mesh of CUDA devices spanning processes: both modules are loaded then. */
#include <stdatomic.h>

#include "collectives/mpi/mpi_impl.h"
#include "collectives/reducer.h"
#include "devices/module/imports.h"

const mw__reducer_vtable *mw__mpi_hier(void);
const mw__cuda_api *mw__cuda_peer(void);

static const mw__dist_api *dist(void) {
    static const mw__dist_api *_Atomic d;
    const mw__dist_api *p = atomic_load(&d);
    if (!p) atomic_store(&d, p = mw__core->module(MW__MODULE_MPI));
    return p;
}

static const mw__cuda_module_api *cuda(void) {
    static const mw__cuda_module_api *_Atomic c;
    const mw__cuda_module_api *p = atomic_load(&c);
    if (!p) atomic_store(&c, p = mw__core->module(MW__MODULE_CUDA));
    return p;
}

const mw__reducer_vtable *mw__mpi_hier(void) { return dist()->reducer_hier; }

void mw__mpi_lock(void) { dist()->lock(); }

void mw__mpi_unlock(void) { dist()->unlock(); }

const mw__cuda_api *mw__cuda_peer(void) { return cuda()->cuda; }
