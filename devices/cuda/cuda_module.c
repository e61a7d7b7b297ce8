/* libmeshwit-cuda.so's entry point: hands the core the CUDA backend (devices/cuda/cuda_backend.c)
 * with the core that loads it. The CUDA runtime, cuBLAS and NCCL are this module's dependencies,
 * never libmeshwit's. */
#include "devices/backend.h"
#include "devices/module/imports.h"

extern const mw__backend mw__cuda_backend;

__attribute__((visibility("default"))) mw_status mw__module_entry(const mw__core_api *core,
                                                                  mw__module_info *out) {
    mw_status st = mw__module_check(core, "libmeshwit-cuda.so");
    if (st) return st;
    *out = (mw__module_info){
        .abi = MW__MODULE_ABI, .version = MW__VERSION_STRING, .backend = &mw__cuda_backend};
    return MW_OK;
}
