/* libmeshwit-cuda.so's entry point: hands the core the CUDA backend (devices/cuda/cuda_backend.c),
 * its services (mw__cuda_services) and the reducers among the GPUs of one process
 * (collectives/cuda/reducer_local.c, collectives/nccl/reducer_nccl.c), which
 * collectives/reducer_select.c chooses from. The entry sits on the collectives floor because it
 * names both floors' parts of the module. The CUDA runtime, cuBLAS and NCCL are this module's
 * dependencies, never libmeshwit's. */
#include "collectives/reducer_select.h"
#include "devices/backend.h"
#include "devices/module/imports.h"

extern const mw__backend mw__cuda_backend;

static const mw__cuda_module_api api = {
    .cuda = &mw__cuda_services,
    .local = &mw__reducer_cuda_local,
#ifdef MESHWIT_HAVE_NCCL
    .nccl = &mw__reducer_nccl,
#endif
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
