/* Internal: every entry of the CUDA backend's device vtable (cuda_vtable.c, C for its designated
 * initializers, fills the table by name), one line per op in the file of its family, the
 * families and their files named as the CPU backend's (devices/cpu/cpu_kernels.h): device state,
 * memory and streams in device.cu; elementwise.cu, reduce.cu, gemm.cu, nn.cu, embed.cu,
 * attention.cu, optim.cu. Includes no CUDA header. Only code built with MESHWIT_HAVE_CUDA may
 * reference these symbols. */
#ifndef MW__CUDA_KERNELS_H
#define MW__CUDA_KERNELS_H

#include <stddef.h>

#include "devices/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* device.cu */
mw_status mw__cuda_init(mw__device *dev);
void mw__cuda_shutdown(mw__device *dev);
mw_status mw__cuda_alloc(mw__device *dev, size_t bytes, void **out);
void mw__cuda_free(mw__device *dev, void *p);
mw_status mw__cuda_upload(mw__device *dev, void *dst, const void *src, size_t bytes);
mw_status mw__cuda_download(mw__device *dev, void *dst, const void *src, size_t bytes);
mw_status mw__cuda_sync(mw__device *dev);
mw_status mw__cuda_host_alloc(mw__device *dev, size_t bytes, void **out);
void mw__cuda_host_free(mw__device *dev, void *p);
mw_status mw__cuda_upload_async(mw__device *dev, void *dst, const void *src, size_t bytes);

/* elementwise.cu */
mw_status mw__cuda_binary(mw__device *dev, const mw__k_binary *k);
mw_status mw__cuda_copy(mw__device *dev, const mw__k_copy *k);
mw_status mw__cuda_fill(mw__device *dev, const mw__k_fill *k);
mw_status mw__cuda_unary(mw__device *dev, const mw__k_unary *k);
mw_status mw__cuda_unary_grad(mw__device *dev, const mw__k_unary_grad *k);
mw_status mw__cuda_map(mw__device *dev, const mw__k_map *k);
mw_status mw__cuda_map_grad(mw__device *dev, const mw__k_map_grad *k);
mw_status mw__cuda_dropout(mw__device *dev, const mw__k_dropout *k);

/* reduce.cu */
mw_status mw__cuda_reduce(mw__device *dev, const mw__k_reduce *k);
mw_status mw__cuda_sumsq(mw__device *dev, const mw__k_sumsq *k);
mw_status mw__cuda_argmax(mw__device *dev, const mw__k_max *k);
mw_status mw__cuda_reduce_max(mw__device *dev, const mw__k_max *k);

/* gemm.cu */
mw_status mw__cuda_gemm(mw__device *dev, const mw__k_gemm *k);

/* nn.cu */
mw_status mw__cuda_layernorm(mw__device *dev, const mw__k_layernorm *k);
mw_status mw__cuda_layernorm_dx(mw__device *dev, const mw__k_layernorm_grad *k);
mw_status mw__cuda_layernorm_dw(mw__device *dev, const mw__k_layernorm_grad *k);
mw_status mw__cuda_softmax(mw__device *dev, const mw__k_softmax *k);
mw_status mw__cuda_softmax_grad(mw__device *dev, const mw__k_softmax_grad *k);
mw_status mw__cuda_xent(mw__device *dev, const mw__k_xent *k);
mw_status mw__cuda_xent_grad(mw__device *dev, const mw__k_xent_grad *k);

/* embed.cu */
mw_status mw__cuda_embed(mw__device *dev, const mw__k_embed *k);
mw_status mw__cuda_embed_grad(mw__device *dev, const mw__k_embed_grad *k);
mw_status mw__cuda_state_write(mw__device *dev, const mw__k_state_write *k);

/* The kernels' limits, which the backend's check (cuda_host.c) refuses a plan beyond when it is
 * made, and the kernels' launches obey: fused attention runs a block of MW__CUDA_ATT_THREADS
 * threads per query row, holding a row of scores (and, backward, of their gradients) in shared
 * memory, each thread at most 4 features; cached attention holds a head's features in registers,
 * 32 lanes of MW__CUDA_CACHED_MAX_DIM / 32 each; a grid has at most 65535 blocks along y; cuBLAS
 * takes 32-bit sizes. */
#define MW__CUDA_ATT_THREADS 128
#define MW__CUDA_ATT_WARPS (MW__CUDA_ATT_THREADS / 32)
#define MW__CUDA_ATT_MAX_D (4 * MW__CUDA_ATT_THREADS)
#define MW__CUDA_SHARED_BYTES (48 * 1024)
#define MW__CUDA_MAX_GRID_Y 65535
#define MW__CUDA_CACHED_MAX_DIM 256

/* The shared memory a fused attention launch of t keys may need: its block's reductions and two
 * rows of t (backward: the scores and their gradients; forward uses one). */
static inline size_t mw__cuda_attention_smem(int64_t t) {
    return (size_t)(MW__CUDA_ATT_WARPS + 2 * t) * sizeof(float);
}

/* cuda_host.c: the backend's check (mw__device_vtable.check). */
mw_status mw__cuda_check(int kind, const void *k);

/* attention.cu */
mw_status mw__cuda_attention(mw__device *dev, const mw__k_attention *k);
mw_status mw__cuda_attention_grad(mw__device *dev, const mw__k_attention *k);
mw_status mw__cuda_attention_cached(mw__device *dev, const mw__k_attention_cached *k);

/* optim.cu */
mw_status mw__cuda_sgd(mw__device *dev, const mw__k_sgd *k);
mw_status mw__cuda_sgd_momentum(mw__device *dev, const mw__k_sgd_momentum *k);
mw_status mw__cuda_adamw(mw__device *dev, const mw__k_adamw *k);

#ifdef __cplusplus
}
#endif

#endif
