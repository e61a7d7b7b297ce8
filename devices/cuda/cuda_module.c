/* libmeshwit-cuda.so's entry point: hands the core the CUDA backend (devices/cuda/cuda_backend.c)
 * and what NCCL over MPI (libmeshwit-nccl-mpi.so) needs of it. The CUDA runtime, cuBLAS and NCCL
 * are this module's dependencies, never libmeshwit's. */
#include "devices/backend.h"
#include "devices/cuda/cuda.h"
#include "devices/module/imports.h"

extern const mw__backend mw__cuda_backend;

static const mw__cuda_api api = {
    .device = &mw__cuda_device,
    .stream = mw__cuda_stream,
    .gpu_identity = mw__cuda_gpu_identity,
};

__attribute__((visibility("default"))) mw_status mw__module_entry(const mw__core_api *core,
                                                                  mw__module_info *out) {
    mw_status st = mw__module_check(core, "libmeshwit-cuda.so");
    if (st) return st;
    *out = (mw__module_info){.abi = MW__MODULE_ABI,
                             .version = MW__VERSION_STRING,
                             .api = &api,
                             .backend = &mw__cuda_backend};
    return MW_OK;
}
