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

/* Every kernel of the instruction table (devices/device.h's MW__KERNELS) is mw__cuda_<name>,
 * declared here from the table, defined in the .cu file of its family, and cuda_vtable.c's
 * vtable is made from the table, so a kernel the CUDA backend lacks fails the module's link. */
#define MW__CUDA_KERNEL_DECL_(KIND, name, type, dtypes, ROLES)                                     \
    mw_status mw__cuda_##name(mw__device *dev, const type *k);
MW__KERNELS(MW__CUDA_KERNEL_DECL_)
#undef MW__CUDA_KERNEL_DECL_

/* reduce.cu: the gradient norm's exact sum of squares (the vtable's sumsq). */
mw_status mw__cuda_sumsq(mw__device *dev, const mw__k_sumsq *k);

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

/* attention_tc.cu: what runs an attention or its gradient (mw__device_vtable.describe): the
 * tensor-core kernels or attention.cu's; NULL for the other kernels. */
const char *mw__cuda_describe(const mw__device *dev, int kind, const void *k);
/* Whether GPU `ordinal` can run attention of head dimension d, forward and gradient, on the
 * tensor-core kernels (compute capability, the kernels' build, shared memory per block). */
int mw__cuda_flash_fits(int ordinal, int64_t d);

/* cuda_host.c: the backend's check (mw__device_vtable.check). */
mw_status mw__cuda_check(int kind, const void *k);

/* optim.cu */
mw_status mw__cuda_sgd(mw__device *dev, const mw__k_sgd *k);
mw_status mw__cuda_sgd_momentum(mw__device *dev, const mw__k_sgd_momentum *k);
mw_status mw__cuda_adamw(mw__device *dev, const mw__k_adamw *k);

#ifdef __cplusplus
}
#endif

#endif
