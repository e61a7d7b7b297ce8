/* Internal: the CUDA backend's services for other modules (the reducers, tests). Includes no CUDA
 * header, so plain C code compiled without the toolkit's include path can use it; only code
 * built with MESHWIT_HAVE_CUDA may reference these symbols. */
#ifndef MW__CUDA_H
#define MW__CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "devices/device.h"

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st; /* cudaStream_t is struct CUstream_st * */

/* The CUDA backend. mw__device::ordinal is the GPU id; several devices may share one GPU, each
 * with its own stream, cuBLAS handle and scratch memory. */
extern const mw__device_vtable mw__cuda_device;

/* The number of visible GPUs: 0 when there is none, no driver, or any other CUDA failure (never
 * prints, never fails). */
int mw__cuda_device_count(void);

/* The device's compute stream (kernels, copies and collectives on it run in order), or NULL
 * before init. Borrowed: valid until the device's shutdown. */
struct CUstream_st *mw__cuda_stream(const mw__device *dev);

/* On dev's stream: for i in [lo, hi), s = bufs[0][i] + bufs[1][i] + ... (buffer order), then
 * bufs[q][i] = s for every q; waits until done. The buffers are device memory of dev's GPU
 * (nbufs <= MW_MAX_DEVICES). Call from dev's worker thread. Errors: MW_ERR_INVALID, and a CUDA
 * failure as MW_ERR_DEVICE. */
mw_status mw__cuda_sum_slices(mw__device *dev, float *const *bufs, int nbufs, size_t lo, size_t hi);

/* Fused attention (devices/cuda/attention.cu), the vtable's attention and attention_grad. */
mw_status mw__cuda_attention(mw__device *dev, const mw__k_attention *k);
mw_status mw__cuda_attention_grad(mw__device *dev, const mw__k_attention *k);

#ifdef __cplusplus
}
#endif

#endif
