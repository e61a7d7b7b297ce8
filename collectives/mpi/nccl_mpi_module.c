/* libmeshwit-nccl-mpi.so's entry point: NCCL among the GPUs of several processes
 * (collectives/mpi/nccl_mpi.c), loaded by the CUDA backend for a mesh spanning processes. It links
 * NCCL, the CUDA runtime and MPI, so that neither the CUDA module needs MPI nor the MPI module
 * CUDA; what it takes from those two modules comes through the core
 * (collectives/mpi/nccl_mpi_peers.c). */
#include "collectives/reducer_select.h"
#include "devices/module/imports.h"

__attribute__((visibility("default"))) mw_status mw__module_entry(const mw__core_api *core,
                                                                  mw__module_info *out) {
    mw_status st = mw__module_check(core, "libmeshwit-nccl-mpi.so");
    if (st) return st;
    *out = (mw__module_info){
        .abi = MW__MODULE_ABI, .version = MW__VERSION_STRING, .api = &mw__reducer_nccl_mpi};
    return MW_OK;
}
