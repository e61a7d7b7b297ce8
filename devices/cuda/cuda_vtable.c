/* The CUDA backend's device vtable, filled by name (C's designated initializers: two slots of
 * one type cannot be swapped unnoticed), in the order of the CPU backend's (cpu_device.c), and
 * its services to the reducers of GPU memory. */
#include "devices/cuda/cuda.h"
#include "devices/cuda/cuda_kernels.h"
#include "devices/module_abi.h"

const mw__device_vtable mw__cuda_device = {
    .kind = "cuda",
    .host_memory = 0,
    .init = mw__cuda_init,
    .shutdown = mw__cuda_shutdown,
    .alloc = mw__cuda_alloc,
    .free = mw__cuda_free,
    .upload = mw__cuda_upload,
    .download = mw__cuda_download,
    .sync = mw__cuda_sync,
/* the instruction table's kernels (devices/device.h's MW__KERNELS), each mw__cuda_<name> */
#define SLOT_(KIND, name, type, dtypes, ROLES) .name = mw__cuda_##name,
    MW__KERNELS(SLOT_)
#undef SLOT_
        .sgd = mw__cuda_sgd,
    .sgd_momentum = mw__cuda_sgd_momentum,
    .adamw = mw__cuda_adamw,
    .sumsq = mw__cuda_sumsq,
    .host_alloc = mw__cuda_host_alloc,
    .host_free = mw__cuda_host_free,
    .upload_async = mw__cuda_upload_async,
    .check = mw__cuda_check,
    .describe = mw__cuda_describe,
};

const mw__cuda_api mw__cuda_services = {
    .device = &mw__cuda_device,
    .stream = mw__cuda_stream,
    .gpu_identity = mw__cuda_gpu_identity,
    .find_shared_gpu = mw__find_shared_gpu,
    .sum_slices = mw__cuda_sum_slices,
    .sum_slices_on = mw__cuda_sum_slices_on,
};
