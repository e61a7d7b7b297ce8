/* libmeshwit-mpi.so's entry point: hands the core the MPI world (collectives/mpi/dist.c) and the
 * reducer between processes (collectives/mpi/reducer_mpi.c). libmpi is this module's dependency,
 * never libmeshwit's. */
#include "collectives/dist.h"
#include "collectives/mpi/mpi_impl.h"
#include "collectives/reducer.h"
#include "devices/module/imports.h"
#include "meshwit.h"

static const mw__dist_api api = {
    .init = mw_distributed_init,
    .finalize = mw_distributed_finalize,
    .abort = mw_distributed_abort,
    .size = mw__dist_size,
    .rank = mw__dist_rank,
    .allgather_ints = mw__dist_allgather_ints,
    .allgather_u64 = mw__dist_allgather_u64,
    .allgatherv_bytes = mw__dist_allgatherv_bytes,
    .bcast_bytes = mw__dist_bcast_bytes,
    .max_int = mw__dist_max_int,
    .lock = mw__mpi_lock,
    .unlock = mw__mpi_unlock,
    .reducer_hier = &mw__reducer_mpi_hier,
    .link_new = mw__dist_link_new,
    .link_free = mw__dist_link_free,
    .link_isend = mw__dist_link_isend,
    .link_wait = mw__dist_link_wait,
    .link_recv = mw__dist_link_recv,
};

__attribute__((visibility("default"))) mw_status mw__module_entry(const mw__core_api *core,
                                                                  mw__module_info *out) {
    mw_status st = mw__module_check(core, "libmeshwit-mpi.so");
    if (st) return st;
    *out = (mw__module_info){.abi = MW__MODULE_ABI, .version = MW__VERSION_STRING, .api = &api};
    return MW_OK;
}
