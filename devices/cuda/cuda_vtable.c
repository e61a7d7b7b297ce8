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
    /* the instruction table's kernels, in its order (devices/device.h's MW__KERNELS) */
    .binary = mw__cuda_binary,
    .copy = mw__cuda_copy,
    .reduce = mw__cuda_reduce,
    .gemm = mw__cuda_gemm,
    .fill = mw__cuda_fill,
    .unary = mw__cuda_unary,
    .unary_grad = mw__cuda_unary_grad,
    .layernorm = mw__cuda_layernorm,
    .layernorm_dx = mw__cuda_layernorm_dx,
    .layernorm_dw = mw__cuda_layernorm_dw,
    .softmax = mw__cuda_softmax,
    .softmax_grad = mw__cuda_softmax_grad,
    .embed = mw__cuda_embed,
    .embed_grad = mw__cuda_embed_grad,
    .xent = mw__cuda_xent,
    .xent_grad = mw__cuda_xent_grad,
    .attention = mw__cuda_attention,
    .attention_grad = mw__cuda_attention_grad,
    .map = mw__cuda_map,
    .map_grad = mw__cuda_map_grad,
    .dropout = mw__cuda_dropout,
    .argmax = mw__cuda_argmax,
    .reduce_max = mw__cuda_reduce_max,
    .state_write = mw__cuda_state_write,
    .attention_cached = mw__cuda_attention_cached,
    .sgd = mw__cuda_sgd,
    .sgd_momentum = mw__cuda_sgd_momentum,
    .adamw = mw__cuda_adamw,
    .sumsq = mw__cuda_sumsq,
    .host_alloc = mw__cuda_host_alloc,
    .host_free = mw__cuda_host_free,
    .upload_async = mw__cuda_upload_async,
    .check = mw__cuda_check,
};

const mw__cuda_api mw__cuda_services = {
    .device = &mw__cuda_device,
    .stream = mw__cuda_stream,
    .gpu_identity = mw__cuda_gpu_identity,
    .find_shared_gpu = mw__find_shared_gpu,
    .sum_slices = mw__cuda_sum_slices,
    .sum_slices_on = mw__cuda_sum_slices_on,
};
