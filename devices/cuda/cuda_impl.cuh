/* Internal: what the CUDA backend's files share (devices/cuda/*.cu): the device state, error
 * and launch macros, grid sizing, warp and block reductions, and the kernels' entry points, one
 * file per op family, named as the CPU backend's (elementwise.cu, reduce.cu, gemm.cu, nn.cu,
 * embed.cu, attention.cu, optim.cu; memory, streams and data errors in device.cu). A new op:
 * its kernels and its mw__cuda_<op> in the file of its family, a declaration in cuda_kernels.h,
 * its slot in cuda_vtable.c. Only .cu files include this. */
#ifndef MW__CUDA_IMPL_CUH
#define MW__CUDA_IMPL_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern "C" {
#include "core/alloc.h"
#include "core/error.h"
#include "devices/device.h"
#include "meshwit/mesh.h"
}
#include "devices/cuda/cuda.h"
#include "devices/cuda/cuda_kernels.h"
#include "devices/math.h"

#define THREADS 256     /* block size of element-wise kernels */
#define MAX_BLOCKS 8192 /* grid cap: kernels loop (grid-stride) beyond it */
#define ROW_THREADS 256 /* block size of row kernels (layer norm, cross-entropy) */
#define BLAS_WORKSPACE ((size_t)32 << 20) /* cuBLAS's recommendation for Hopper */
#define SCRATCH_BYTES ((size_t)16 << 20)

/* A data error found by a kernel: key = position << 32 | (uint32) value, the smallest wins. */
typedef struct err_rec {
    unsigned long long key;
    long long limit;
} err_rec;

enum { ERR_EMBED = 0, ERR_TARGET = 1, ERR_POSITION = 2, NERR = 3 };
#define ERR_NONE 0xffffffffffffffffull

typedef struct cuda_impl {
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;
    char *scratch; /* SCRATCH_BYTES of device memory, then the error records */
    err_rec *err;
    volatile int *flag; /* mapped host memory: kernels set it to 1 on a data error */
    int *flag_dev;      /* its device address */
} cuda_impl;

/* --- errors ----------------------------------------------------------------------------------- */

static inline mw_status cuda_fail(const mw__device *dev, const char *call, cudaError_t e) {
    (void)cudaGetLastError(); /* reported here: not again by the next launch check */
    mw_status st = e == cudaErrorMemoryAllocation ? MW_ERR_NOMEM : MW_ERR_DEVICE;
    return mw__error(st, "%s: %s failed: %s (%s)", dev->name, call, cudaGetErrorString(e),
                     cudaGetErrorName(e));
}

static inline mw_status blas_fail(const mw__device *dev, const char *call, cublasStatus_t s) {
    (void)cudaGetLastError();
    mw_status st = s == CUBLAS_STATUS_ALLOC_FAILED ? MW_ERR_NOMEM : MW_ERR_DEVICE;
    return mw__error(st, "%s: %s failed: %s", dev->name, call, cublasGetStatusString(s));
}

/* CU(dev, fn, args...): calls fn(args...) and returns its failure as an mw_status. */
#define CU(dev, fn, ...)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = fn(__VA_ARGS__);                                                          \
        if (e_ != cudaSuccess) return cuda_fail(dev, #fn, e_);                                     \
    } while (0)

#define BLAS(dev, fn, ...)                                                                         \
    do {                                                                                           \
        cublasStatus_t s_ = fn(__VA_ARGS__);                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) return blas_fail(dev, #fn, s_);                           \
    } while (0)

static inline cuda_impl *impl_of(const mw__device *dev) { return (cuda_impl *)dev->impl; }

/* Makes dev's GPU current on the calling thread (the host thread may call alloc, free and the
 * copies; a thread may drive several devices). Cheap when it already is. */
static inline mw_status bind(mw__device *dev) {
    CU(dev, cudaSetDevice, dev->ordinal);
    return MW_OK;
}

/* Entry of every kernel: the device must be initialised and its GPU current. The thread's last
 * error is cleared, so the check after the launch sees only the launch's own failure (a library
 * may leave a benign one behind; a sticky error comes back from every call anyway). */
#define ENTER(dev)                                                                                 \
    cuda_impl *im = impl_of(dev);                                                                  \
    do {                                                                                           \
        if (!im)                                                                                   \
            return mw__error(MW_ERR_STATE, "%s: kernel called before the device's init",           \
                             (dev)->name);                                                         \
        mw_status st_ = bind(dev);                                                                 \
        if (st_) return st_;                                                                       \
        (void)cudaGetLastError();                                                                  \
    } while (0)

/* After a launch: its failure, or a data error an earlier kernel flagged. */
mw_status mw__cuda_launched(mw__device *dev, const char *kernel);

/* A data error an earlier kernel flagged (read without waiting). */
mw_status mw__cuda_flagged(mw__device *dev);

/* The entry and launch check of the map, dropout, max and SGD-momentum kernels: only makes dev's
 * GPU current (no init check: they use no device state; the last error left as it is), and
 * reports only the launch's own failure. The state write and cached attention, which use the
 * device's stream and error records, enter with ENTER and check their launch with launch_error
 * (a data error they flag is reported by the next ENTER-style kernel's check or by sync). */
static inline mw_status enter_gpu(mw__device *dev) {
    cudaError_t e = cudaSetDevice(dev->ordinal);
    if (e == cudaSuccess) return MW_OK;
    return mw__error(MW_ERR_DEVICE, "%s: cudaSetDevice failed: %s", dev->name,
                     cudaGetErrorString(e));
}

static inline mw_status launch_error(mw__device *dev, const char *kernel) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return MW_OK;
    return mw__error(MW_ERR_DEVICE, "%s: %s failed: %s", dev->name, kernel, cudaGetErrorString(e));
}

/* --- device helpers --------------------------------------------------------------------------- */

#define GRID_LOOP(i, n)                                                                            \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)blockDim.x * gridDim.x)

static inline unsigned blocks_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b > MAX_BLOCKS) b = MAX_BLOCKS;
    return (unsigned)(b < 1 ? 1 : b);
}

/* Blocks of THREADS for n elements up to 65535 (the grid-stride loops of the kernels entered
 * with enter_gpu cover the rest). */
static inline unsigned wide_blocks(int64_t n) {
    int64_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b > 65535 ? 65535 : b);
}

/* Row kernels: one block (or warp) per row, looping when rows exceed the grid. */
static inline unsigned row_blocks(int64_t rows) {
    return (unsigned)(rows < 1 ? 1 : rows > 65535 ? 65535 : rows);
}

#include "devices/cuda/attention_slice.cuh"

/* attention_tc.cu: runs k (grad: its gradient) on tensor cores where they apply and were asked
 * for (MESHWIT_CUDA_ATTENTION=tensor): returns 1 with the launch's outcome in *st, or 0 when
 * attention.cu's kernels run it. */
int mw__cuda_flash(mw__device *dev, const mw__k_attention *k, int grad, mw_status *st);

/* Butterfly sums: every lane ends with the same bits (each step adds the same two values, in
 * either order, on both partners), so results do not depend on the lane that reads them. */
__device__ __forceinline__ float warp_sum(float v) {
    for (int m = 16; m; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
    for (int m = 16; m; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int m = 16; m; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
    return v;
}

/* Block-wide reductions for a block of BS threads (all must call; sh holds 32 values). Fixed
 * tree: warp butterflies, then warp 0's lanes combine the warps' results the same way. */
template <int BS, typename T, typename F>
__device__ __forceinline__ T block_reduce(T v, T *sh, T identity, F warp_op) {
    v = warp_op(v);
    __syncthreads(); /* sh may still be read by a previous call */
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (int)(threadIdx.x & 31) < BS / 32 ? sh[threadIdx.x & 31] : identity;
    return warp_op(v);
}

struct sum_f {
    __device__ float operator()(float v) const { return warp_sum(v); }
};
struct sum_d {
    __device__ double operator()(double v) const { return warp_sum_d(v); }
};
struct max_f {
    __device__ float operator()(float v) const { return warp_max(v); }
};

template <int BS> __device__ __forceinline__ float block_sum(float v, float *sh) {
    return block_reduce<BS>(v, sh, 0.0f, sum_f());
}
template <int BS> __device__ __forceinline__ double block_sum_d(double v, double *sh) {
    return block_reduce<BS>(v, sh, 0.0, sum_d());
}
template <int BS> __device__ __forceinline__ float block_max(float v, float *sh) {
    return block_reduce<BS>(v, sh, -INFINITY, max_f());
}

static __device__ __forceinline__ void record_bad(err_rec *r, int *flag, int64_t pos, int32_t value,
                                                  int64_t limit) {
    unsigned long long p = pos < 0xfffffffeLL ? (unsigned long long)pos : 0xfffffffeull;
    unsigned long long key = p << 32 | (uint32_t)value;
    unsigned long long old = atomicMin(&r->key, key);
    /* Kernels on one stream run one after another and all threads of one kernel write the same
     * limit, so the limit always belongs to the recorded key. */
    if (key < old) r->limit = limit;
    *(volatile int *)flag = 1;
}

/* Element offsets of the row-major index i of nd for the first NOPS operands. */
template <int NOPS, typename I>
__device__ __forceinline__ void nd_offsets(const mw__nd &nd, I i, int64_t *off) {
#pragma unroll
    for (int k = 0; k < NOPS; k++) off[k] = 0;
    for (int d = nd.rank - 1; d >= 0; d--) {
        I n = (I)nd.dims[d];
        I x = i % n;
        i /= n;
#pragma unroll
        for (int k = 0; k < NOPS; k++) off[k] += (int64_t)x * nd.stride[k][d];
    }
}

static inline int64_t nd_total(const mw__nd *nd) {
    int64_t t = 1;
    for (int d = 0; d < nd->rank; d++) t *= nd->dims[d];
    return t;
}

/* Elements as f32 or bf16: read widened, written rounded (devices/math.h's rounding, so the
 * CPU's bits). */
__device__ __forceinline__ float mw__get(const float *a, int64_t i) { return a[i]; }
__device__ __forceinline__ float mw__get(const uint16_t *a, int64_t i) {
    return mw__bf16_to_f32(a[i]);
}
__device__ __forceinline__ void mw__put(float *o, int64_t i, float v) { o[i] = v; }
__device__ __forceinline__ void mw__put(uint16_t *o, int64_t i, float v) {
    o[i] = mw__bf16_from_f32(v);
}

#define LAUNCH(kernel, grid, block, smem, ...)                                                     \
    kernel<<<(grid), (block), (smem), im->stream>>>(__VA_ARGS__)

#endif
