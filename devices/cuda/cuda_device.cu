/* The CUDA backend: device memory, cuBLAS for contractions, our kernels for everything else.
 *
 * Each mw__device owns a non-blocking stream, a cuBLAS handle bound to it (with its own
 * workspace) and a scratch arena for reduction partials, all made in init on the worker thread;
 * a step allocates nothing. Every kernel is queued on the device's stream; sync() waits for them
 * and turns any failure into an mw_status. Several devices may share one GPU (cuda:0x2): each has
 * its own stream, so they run concurrently and never share scratch.
 *
 * Determinism: no kernel adds floats with atomics. Every reduction (reduce, layer-norm weight
 * gradient, sumsq, softmax and cross-entropy rows, the embedding gradient) sums in an order fixed
 * by the problem's sizes only (not by the GPU model or timing), so a run is bitwise repeatable.
 *
 * Data errors (an embedding id or a cross-entropy target out of range) are found on the device:
 * the kernel records the smallest bad position of its kind in a device record and raises a flag
 * in mapped host memory; the launch wrapper reads that flag (no copy, no wait), and sync() and
 * every download read it after their wait, so nothing computed from bad data reaches the host
 * unreported. The report names every kind recorded (MW_ERR_INVALID with each id or target and
 * its position) and clears them. The trainer syncs before its update, so a bad id fails a step
 * before any parameter changes, also on one device.
 *
 * The embedding gradient is linear in tokens: a stable radix sort (CUB) of (id, position) pairs,
 * then one block per run of equal ids adds the run's rows in position order, the CPU's order. */
#include <cub/device/device_radix_sort.cuh>
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
#include "devices/math.h"

#define THREADS 256     /* block size of element-wise kernels */
#define MAX_BLOCKS 8192 /* grid cap: kernels loop (grid-stride) beyond it */
#define ROW_THREADS 256 /* block size of row kernels (layer norm, cross-entropy) */
#define BLAS_WORKSPACE ((size_t)32 << 20) /* cuBLAS's recommendation for Hopper */
#define SCRATCH_BYTES ((size_t)16 << 20)
#define REDUCE_TARGET_JOBS ((int64_t)1 << 17) /* threads a split reduction aims for */
#define SUMSQ_MAX_BLOCKS 1024

/* A data error found by a kernel: key = position << 32 | (uint32) value, the smallest wins. */
typedef struct err_rec {
    unsigned long long key;
    long long limit;
} err_rec;

enum { ERR_EMBED = 0, ERR_TARGET = 1, NERR = 2 };
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

static mw_status cuda_fail(const mw__device *dev, const char *call, cudaError_t e) {
    (void)cudaGetLastError(); /* reported here: not again by the next launch check */
    mw_status st = e == cudaErrorMemoryAllocation ? MW_ERR_NOMEM : MW_ERR_DEVICE;
    return mw__error(st, "%s: %s failed: %s (%s)", dev->name, call, cudaGetErrorString(e),
                     cudaGetErrorName(e));
}

static mw_status blas_fail(const mw__device *dev, const char *call, cublasStatus_t s) {
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

static cuda_impl *impl_of(const mw__device *dev) { return (cuda_impl *)dev->impl; }

/* Makes dev's GPU current on the calling thread (the host thread may call alloc, free and the
 * copies; a thread may drive several devices). Cheap when it already is. */
static mw_status bind(mw__device *dev) {
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

/* Reads, reports and clears the data errors kernels recorded: both kinds, each with its first
 * bad position. Waits for the stream first, so the records are complete. */
static mw_status report_data_error(mw__device *dev) {
    cuda_impl *im = impl_of(dev);
    err_rec rec[NERR];
    CU(dev, cudaStreamSynchronize, im->stream);
    CU(dev, cudaMemcpyAsync, rec, im->err, sizeof rec, cudaMemcpyDeviceToHost, im->stream);
    CU(dev, cudaMemsetAsync, im->err, 0xff, sizeof rec, im->stream);
    CU(dev, cudaStreamSynchronize, im->stream);
    *im->flag = 0;
    mw__cuda_data_error kinds[NERR];
    for (int kind = 0; kind < NERR; kind++) {
        kinds[kind].set = rec[kind].key != ERR_NONE;
        kinds[kind].pos = (long long)(rec[kind].key >> 32);
        kinds[kind].value = (int)(uint32_t)(rec[kind].key & 0xffffffffu);
        kinds[kind].limit = rec[kind].limit;
    }
    /* MW_OK when the flag was raised but no record is set: nothing to report. */
    return mw__cuda_data_errors(dev->name, &kinds[ERR_EMBED], &kinds[ERR_TARGET]);
}

/* A data error an earlier kernel flagged (read without waiting). */
static mw_status flagged(mw__device *dev) {
    return *impl_of(dev)->flag ? report_data_error(dev) : MW_OK;
}

/* After a launch: its failure, or a data error an earlier kernel flagged. */
static mw_status launched(mw__device *dev, const char *kernel) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return cuda_fail(dev, kernel, e);
    return flagged(dev);
}

/* --- device helpers --------------------------------------------------------------------------- */

#define GRID_LOOP(i, n)                                                                            \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)blockDim.x * gridDim.x)

static unsigned blocks_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b > MAX_BLOCKS) b = MAX_BLOCKS;
    return (unsigned)(b < 1 ? 1 : b);
}

/* Row kernels: one block (or warp) per row, looping when rows exceed the grid. */
static unsigned row_blocks(int64_t rows) {
    return (unsigned)(rows < 1 ? 1 : rows > 65535 ? 65535 : rows);
}

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

__device__ void record_bad(err_rec *r, int *flag, int64_t pos, int32_t value, int64_t limit) {
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

static int64_t nd_total(const mw__nd *nd) {
    int64_t t = 1;
    for (int d = 0; d < nd->rank; d++) t *= nd->dims[d];
    return t;
}

/* --- element-wise kernels --------------------------------------------------------------------- */

template <int OP>
__global__ void k_binary_1d(int64_t n, float *out, int64_t so, const float *a, int64_t sa,
                            const float *b, int64_t sb) {
    GRID_LOOP(i, n) out[i * so] = mw__binop_apply(OP, a[i * sa], b[i * sb]);
}

template <int OP, typename I>
__global__ void k_binary_nd(mw__nd nd, I total, float *out, const float *a, const float *b) {
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (I)blockDim.x * gridDim.x) {
        int64_t o[3];
        nd_offsets<3>(nd, i, o);
        out[o[0]] = mw__binop_apply(OP, a[o[1]], b[o[2]]);
    }
}

__global__ void k_copy_1d(int64_t n, float alpha, float *out, int64_t so, const float *a,
                          int64_t sa) {
    GRID_LOOP(i, n) out[i * so] = alpha * a[i * sa];
}

template <typename I>
__global__ void k_copy_nd(mw__nd nd, I total, float alpha, float *out, const float *a) {
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (I)blockDim.x * gridDim.x) {
        int64_t o[2];
        nd_offsets<2>(nd, i, o);
        out[o[0]] = alpha * a[o[1]];
    }
}

__global__ void k_fill(int64_t n, float value, float *out) { GRID_LOOP(i, n) out[i] = value; }

__global__ void k_sgd(int64_t n, float lr, float *p, const float *g) {
    GRID_LOOP(i, n) p[i] -= lr * g[i];
}

__global__ void k_gelu(int64_t n, float *out, const float *a) {
    GRID_LOOP(i, n) out[i] = mw__gelu(a[i]);
}

__global__ void k_gelu_grad(int64_t n, float *out, const float *gy, const float *x) {
    GRID_LOOP(i, n) out[i] = gy[i] * mw__gelu_grad(x[i]);
}

__global__ void k_adamw(mw__k_adamw k) {
    GRID_LOOP(i, k.count) {
        float m = k.m[i], v = k.v[i];
        k.p[i] = mw__adamw_update(k.p[i], k.grad_scale * k.g[i], &m, &v, k.lr, k.beta1, k.beta2,
                                  k.eps, k.weight_decay, k.bias1, k.bias2);
        k.m[i] = m;
        k.v[i] = v;
    }
}

/* Zeroes C[b] (m x n, leading dimension ldc) for every b: a product over an empty K. */
__global__ void k_zero_matrices(int64_t batch, int64_t m, int64_t n, int64_t ldc, int64_t sc,
                                float *c) {
    GRID_LOOP(i, batch * m * n) {
        int64_t b = i / (m * n), r = i / n % m, col = i % n;
        c[b * sc + r * ldc + col] = 0.0f;
    }
}

/* --- reduce ----------------------------------------------------------------------------------- */

/* The dims of nd split into kept ones (out's stride is not 0: K outputs) and reduced ones (R
 * terms per output). A job (k, p) sums the terms r = p, p + P, p + 2P, ... of output k in order;
 * with P > 1 the P partials of each output are then summed in order of p by a second kernel.
 * P depends only on K and R, so the order is fixed. */

typedef struct sub_nd {
    int rank;
    int64_t dims[MW__ND_MAX];
    int64_t sa[MW__ND_MAX]; /* stride in a */
    int64_t so[MW__ND_MAX]; /* stride in out */
} sub_nd;

__device__ __forceinline__ void sub_offsets(const sub_nd &s, int64_t i, int64_t *oa, int64_t *oo) {
    int64_t a = 0, o = 0;
    for (int d = s.rank - 1; d >= 0; d--) {
        int64_t x = i % s.dims[d];
        i /= s.dims[d];
        a += x * s.sa[d];
        o += x * s.so[d];
    }
    *oa = a;
    *oo = o;
}

__global__ void k_reduce_jobs(sub_nd kept, sub_nd red, int64_t K, int64_t R, int64_t P,
                              int p_fastest, float alpha, float *out, float *partial,
                              const float *a) {
    GRID_LOOP(j, K * P) {
        int64_t k = p_fastest ? j / P : j % K;
        int64_t p = p_fastest ? j % P : j / K;
        int64_t oa, oo;
        sub_offsets(kept, k, &oa, &oo);
        float s = 0.0f;
        if (red.rank <= 1) {
            int64_t st = red.rank ? red.sa[0] : 0;
            for (int64_t r = p; r < R; r += P) s += a[oa + r * st];
        } else {
            for (int64_t r = p; r < R; r += P) {
                int64_t ra, unused;
                sub_offsets(red, r, &ra, &unused);
                s += a[oa + ra];
            }
        }
        if (P == 1)
            out[oo] = alpha * s;
        else
            partial[p * K + k] = s;
    }
}

/* Few partials: one thread per output adds them in order. */
__global__ void k_reduce_parts_seq(sub_nd kept, int64_t K, int64_t P, float alpha, float *out,
                                   const float *partial) {
    GRID_LOOP(k, K) {
        float s = 0.0f;
        for (int64_t p = 0; p < P; p++) s += partial[p * K + k];
        int64_t oa, oo;
        sub_offsets(kept, k, &oa, &oo);
        out[oo] = alpha * s;
    }
}

/* Many partials: one block per output, a fixed tree over them. */
template <int BS>
__global__ void k_reduce_parts_tree(sub_nd kept, int64_t K, int64_t P, float alpha, float *out,
                                    const float *partial) {
    __shared__ float sh[32];
    for (int64_t k = blockIdx.x; k < K; k += gridDim.x) {
        float s = 0.0f;
        for (int64_t p = threadIdx.x; p < P; p += BS) s += partial[p * K + k];
        s = block_sum<BS>(s, sh);
        if (threadIdx.x == 0) {
            int64_t oa, oo;
            sub_offsets(kept, k, &oa, &oo);
            out[oo] = alpha * s;
        }
    }
}

/* --- layer norm ------------------------------------------------------------------------------- */

/* Mean and 1/sqrt(biased variance + eps) of a row of n: two passes accumulated in double, as the
 * CPU backend does; every thread gets both. */
template <int BS>
__device__ __forceinline__ void row_stats(const float *x, int64_t n, float eps, double *sh,
                                          float *mean, float *rstd) {
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += BS) s += x[j];
    double mu = block_sum_d<BS>(s, sh) / (double)n;
    double q = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += BS) {
        double d = x[j] - mu;
        q += d * d;
    }
    double var = block_sum_d<BS>(q, sh) / (double)n;
    *mean = (float)mu;
    *rstd = (float)(1.0 / sqrt(var + eps));
}

template <int BS>
__global__ void k_layernorm(int64_t rows, int64_t n, float eps, float *out, const float *x,
                            const float *w, const float *b) {
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * n;
        float *o = out + r * n;
        float mean, rstd;
        row_stats<BS>(xr, n, eps, sh, &mean, &rstd);
        for (int64_t j = threadIdx.x; j < n; j += BS) o[j] = (xr[j] - mean) * rstd * w[j] + b[j];
    }
}

/* dx = rstd * (dy - mean(dy) - xhat * mean(dy * xhat)), dy = gy * w; the means in double. */
template <int BS>
__global__ void k_layernorm_dx(int64_t rows, int64_t n, float eps, float *out, const float *gy,
                               const float *x, const float *w) {
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * n, *gr = gy + r * n;
        float *o = out + r * n;
        float mean, rstd;
        row_stats<BS>(xr, n, eps, sh, &mean, &rstd);
        double s1 = 0.0, s2 = 0.0;
        for (int64_t j = threadIdx.x; j < n; j += BS) {
            float dy = gr[j] * w[j], xhat = (xr[j] - mean) * rstd;
            s1 += dy;
            s2 += dy * xhat;
        }
        float c1 = (float)(block_sum_d<BS>(s1, sh) / (double)n);
        float c2 = (float)(block_sum_d<BS>(s2, sh) / (double)n);
        for (int64_t j = threadIdx.x; j < n; j += BS) {
            float dy = gr[j] * w[j], xhat = (xr[j] - mean) * rstd;
            o[j] = rstd * (dy - c1 - xhat * c2);
        }
    }
}

/* dw partials: block p sums gy * xhat over its chunk of rows, in row order, into partial row p
 * (accumulated in shared memory when n fits, else in the partial row itself). */
template <int BS>
__global__ void k_layernorm_dw_parts(int64_t rows, int64_t n, float eps, int64_t chunk,
                                     int use_shared, float *partial, const float *gy,
                                     const float *x) {
    extern __shared__ float acc_sh[];
    __shared__ double sh[32];
    int64_t p = blockIdx.x;
    int64_t r0 = p * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
    float *acc = use_shared ? acc_sh : partial + p * n;
    for (int64_t j = threadIdx.x; j < n; j += BS) acc[j] = 0.0f; /* each thread owns its j */
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * n, *gr = gy + r * n;
        float mean, rstd;
        row_stats<BS>(xr, n, eps, sh, &mean, &rstd);
        for (int64_t j = threadIdx.x; j < n; j += BS) acc[j] += gr[j] * (xr[j] - mean) * rstd;
    }
    if (use_shared)
        for (int64_t j = threadIdx.x; j < n; j += BS) partial[p * n + j] = acc[j];
}

/* out[j] = sum over p of partial[p][j], in order of p. */
__global__ void k_sum_rows(int64_t n, int64_t nparts, float *out, const float *partial) {
    GRID_LOOP(j, n) {
        float s = 0.0f;
        for (int64_t p = 0; p < nparts; p++) s += partial[p * n + j];
        out[j] = s;
    }
}

/* --- softmax: one warp per row ---------------------------------------------------------------- */

/* Columns row i of a block of s rows sees (0 when none). */
__device__ __forceinline__ int64_t visible_cols(int64_t i, int64_t s, int64_t k, int causal) {
    if (!causal) return k;
    int64_t v = i + (k - s) + 1;
    return v < 0 ? 0 : v > k ? k : v;
}

#define WARP_ROW_LOOP(r, rows)                                                                     \
    for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < (rows);            \
         r += ((int64_t)blockDim.x * gridDim.x) >> 5)

/* As the CPU backend: the row sum in double, then one reciprocal. */
__global__ void k_softmax(int64_t rows, int64_t s, int64_t k, int causal, float scale, float *out,
                          const float *a) {
    int lane = threadIdx.x & 31;
    WARP_ROW_LOOP(r, rows) {
        int64_t vis = visible_cols(r % s, s, k, causal);
        const float *ar = a + r * k;
        float *o = out + r * k;
        float m = -INFINITY;
        for (int64_t j = lane; j < vis; j += 32) m = fmaxf(m, scale * ar[j]);
        m = warp_max(m);
        double sum = 0.0;
        for (int64_t j = lane; j < vis; j += 32) sum += expf(scale * ar[j] - m);
        sum = warp_sum_d(sum);
        float inv = vis ? (float)(1.0 / sum) : 0.0f;
        for (int64_t j = lane; j < k; j += 32)
            o[j] = j < vis ? expf(scale * ar[j] - m) * inv : 0.0f;
    }
}

__global__ void k_softmax_grad(int64_t rows, int64_t s, int64_t k, int causal, float scale,
                               float *out, const float *gy, const float *p) {
    int lane = threadIdx.x & 31;
    WARP_ROW_LOOP(r, rows) {
        int64_t vis = visible_cols(r % s, s, k, causal);
        const float *gr = gy + r * k, *pr = p + r * k;
        float *o = out + r * k;
        double dot = 0.0;
        for (int64_t j = lane; j < vis; j += 32) dot += (double)gr[j] * pr[j];
        float d = (float)warp_sum_d(dot);
        for (int64_t j = lane; j < k; j += 32) o[j] = j < vis ? scale * pr[j] * (gr[j] - d) : 0.0f;
    }
}

/* --- embedding -------------------------------------------------------------------------------- */

__global__ void k_embed(int64_t n_ids, int64_t vocab, int64_t dim, float *out, const int32_t *ids,
                        const float *table, err_rec *err, int *flag) {
    for (int64_t i = blockIdx.x; i < n_ids; i += gridDim.x) {
        int32_t id = ids[i];
        float *o = out + i * dim;
        if (id < 0 || id >= vocab) {
            if (threadIdx.x == 0) record_bad(&err[ERR_EMBED], flag, i, id, vocab);
            for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) o[c] = 0.0f;
            continue;
        }
        const float *t = table + (int64_t)id * dim;
        for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) o[c] = t[c];
    }
}

/* Marks the vocabulary rows that occur (racing stores of the same value) and records a bad id,
 * as the forward does. */
__global__ void k_mark_present(int64_t n_ids, int64_t vocab, const int32_t *ids,
                               unsigned char *present, err_rec *err, int *flag) {
    GRID_LOOP(i, n_ids) {
        int32_t id = ids[i];
        if (id >= 0 && id < vocab) {
            if (present) present[id] = 1;
        } else {
            record_bad(&err[ERR_EMBED], flag, i, id, vocab);
        }
    }
}

/* One block per vocabulary row v: scans ids in order, tile by tile, lists the positions equal to
 * v in increasing order and adds their gradient rows in that order. Each thread owns the columns
 * c = t, t + BS, ... of the row, so no two threads write the same element. Rows absent from ids
 * (present[v] == 0; present NULL: unknown) are just zeroed. */
template <int BS>
__global__ void k_embed_grad(int64_t n_ids, int64_t vocab, int64_t dim, float *out,
                             const int32_t *ids, const float *gy, const unsigned char *present) {
    __shared__ int64_t list[BS];
    __shared__ int wcount[BS / 32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t v = blockIdx.x; v < vocab; v += gridDim.x) {
        float *o = out + v * dim;
        for (int64_t c = threadIdx.x; c < dim; c += BS) o[c] = 0.0f;
        if (present && !present[v]) continue;
        for (int64_t base = 0; base < n_ids; base += BS) {
            int64_t i = base + threadIdx.x;
            int match = i < n_ids && ids[i] == v;
            unsigned ballot = __ballot_sync(0xffffffffu, match);
            if (lane == 0) wcount[warp] = __popc(ballot);
            __syncthreads();
            int before = 0, total = 0;
            for (int w = 0; w < BS / 32; w++) {
                before += w < warp ? wcount[w] : 0;
                total += wcount[w];
            }
            if (match) list[before + __popc(ballot & ((1u << lane) - 1u))] = i;
            __syncthreads();
            for (int q = 0; q < total; q++) {
                const float *g = gy + list[q] * dim;
                for (int64_t c = threadIdx.x; c < dim; c += BS) o[c] += g[c];
            }
            __syncthreads(); /* list and wcount are refilled by the next tile */
        }
    }
}

/* Linear in tokens: the (id, position) pairs sorted by id with a stable radix sort (positions
 * of one id stay in increasing order), then one block per run of equal ids adds that run's
 * gradient rows into the id's row in position order: the CPU's order, so the same bits. Ids
 * outside [0, vocab) get the key vocab and sort last, where no block reads them. */
__global__ void k_embed_keys(int64_t n_ids, int64_t vocab, const int32_t *ids, uint32_t *keys,
                             uint32_t *pos) {
    GRID_LOOP(i, n_ids) {
        int32_t id = ids[i];
        keys[i] = id >= 0 && id < vocab ? (uint32_t)id : (uint32_t)vocab;
        pos[i] = (uint32_t)i;
    }
}

__global__ void k_embed_grad_runs(int64_t n_ids, int64_t vocab, int64_t dim, float *out,
                                  const uint32_t *keys, const uint32_t *pos, const float *gy) {
    for (int64_t j = blockIdx.x; j < n_ids; j += gridDim.x) {
        uint32_t key = keys[j];
        if (key >= (uint64_t)vocab || (j > 0 && keys[j - 1] == key)) continue; /* not a run start */
        float *o = out + (int64_t)key * dim;
        for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
            float s = 0.0f;
            for (int64_t q = j; q < n_ids && keys[q] == key; q++)
                s += gy[(int64_t)pos[q] * dim + c];
            o[c] = s;
        }
    }
}

/* --- cross-entropy: one block per row --------------------------------------------------------- */

/* Max and log-sum-exp of the first `valid` logits; the sum in double, as the CPU backend. */
template <int BS>
__device__ __forceinline__ void row_lse(const float *l, int64_t valid, float *shf, double *sh,
                                        float *max_out, double *lse_out) {
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < valid; j += BS) m = fmaxf(m, l[j]);
    m = block_max<BS>(m, shf);
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < valid; j += BS) s += expf(l[j] - m);
    s = block_sum_d<BS>(s, sh);
    *max_out = m;
    *lse_out = (double)m + log(s);
}

template <int BS>
__global__ void k_xent(int64_t rows, int64_t v, int64_t valid, float *out, const float *logits,
                       const int32_t *targets, err_rec *err, int *flag) {
    __shared__ double sh[32];
    __shared__ float shf[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *l = logits + r * v;
        float m;
        double lse;
        row_lse<BS>(l, valid, shf, sh, &m, &lse);
        if (threadIdx.x == 0) {
            int32_t t = targets[r];
            if (t < 0 || t >= valid) {
                record_bad(&err[ERR_TARGET], flag, r, t, valid);
                out[r] = 0.0f;
            } else {
                out[r] = (float)(lse - l[t]);
            }
        }
    }
}

/* softmax_j = e^(l_j - lse): the exponent in double (as the CPU backend), the exponential in
 * float. */
template <int BS>
__global__ void k_xent_grad(int64_t rows, int64_t v, int64_t valid, float *out, const float *gy,
                            const float *logits, const int32_t *targets, err_rec *err, int *flag) {
    __shared__ double sh[32];
    __shared__ float shf[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *l = logits + r * v;
        float *o = out + r * v;
        float m;
        double lse;
        row_lse<BS>(l, valid, shf, sh, &m, &lse);
        int32_t t = targets[r];
        if (t < 0 || t >= valid) {
            if (threadIdx.x == 0) record_bad(&err[ERR_TARGET], flag, r, t, valid);
            t = -1;
        }
        float g = gy[r];
        for (int64_t j = threadIdx.x; j < v; j += BS)
            o[j] =
                j < valid ? g * (expf((float)((double)l[j] - lse)) - (j == t ? 1.0f : 0.0f)) : 0.0f;
    }
}

/* --- sum of squares: fixed grid of double partials, then one block ---------------------------- */

template <int BS> __global__ void k_sumsq_parts(int64_t count, double *partial, const float *a) {
    __shared__ double sh[32];
    double s = 0.0;
    GRID_LOOP(i, count) {
        double x = (double)a[i];
        s += x * x;
    }
    s = block_sum_d<BS>(s, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

template <int BS> __global__ void k_sumsq_final(int nparts, float *out, const double *partial) {
    __shared__ double sh[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < nparts; i += BS) s += partial[i];
    s = block_sum_d<BS>(s, sh);
    if (threadIdx.x == 0) out[0] = (float)s;
}

/* --- the local reducer's kernel --------------------------------------------------------------- */

typedef struct buf_list {
    float *p[MW_MAX_DEVICES];
} buf_list;

__global__ void k_sum_slices(buf_list b, int nb, int64_t lo, int64_t hi) {
    GRID_LOOP(i, hi - lo) {
        int64_t e = lo + i;
        float s = b.p[0][e];
        for (int q = 1; q < nb; q++) s += b.p[q][e];
        for (int q = 0; q < nb; q++) b.p[q][e] = s;
    }
}

/* --- vtable: lifetime and memory -------------------------------------------------------------- */

static void release(mw__device *dev, cuda_impl *im) {
    if (!im) return;
    if (cudaSetDevice(dev->ordinal) == cudaSuccess) {
        if (im->stream) cudaStreamSynchronize(im->stream);
        if (im->blas) cublasDestroy(im->blas);
        cudaFree(im->blas_ws);
        cudaFree(im->scratch);
        if (im->flag) cudaFreeHost((void *)im->flag);
        if (im->stream) cudaStreamDestroy(im->stream);
    }
    (void)cudaGetLastError(); /* a failure while tearing down is not the next call's error */
    mw__free(im);
}

static mw_status init_impl(mw__device *dev, cuda_impl *im) {
    CU(dev, cudaStreamCreateWithFlags, &im->stream, cudaStreamNonBlocking);
    BLAS(dev, cublasCreate, &im->blas);
    /* setStream resets the handle's workspace, so the workspace is set after it. */
    BLAS(dev, cublasSetStream, im->blas, im->stream);
    BLAS(dev, cublasSetMathMode, im->blas, CUBLAS_DEFAULT_MATH); /* full fp32, no TF32 */
    CU(dev, cudaMalloc, &im->blas_ws, BLAS_WORKSPACE);
    BLAS(dev, cublasSetWorkspace, im->blas, im->blas_ws, BLAS_WORKSPACE);
    CU(dev, cudaMalloc, (void **)&im->scratch, SCRATCH_BYTES + NERR * sizeof(err_rec));
    im->err = (err_rec *)(im->scratch + SCRATCH_BYTES);
    void *flag;
    CU(dev, cudaHostAlloc, &flag, 64, cudaHostAllocMapped);
    im->flag = (volatile int *)flag;
    *im->flag = 0;
    CU(dev, cudaHostGetDevicePointer, (void **)&im->flag_dev, flag, 0);
    CU(dev, cudaMemsetAsync, im->err, 0xff, NERR * sizeof(err_rec), im->stream);
    CU(dev, cudaStreamSynchronize, im->stream);
    return MW_OK;
}

static mw_status cuda_init(mw__device *dev) {
    if (dev->impl) return MW_OK;
    mw_status st = bind(dev);
    if (st) return st;
    cuda_impl *im = (cuda_impl *)mw__calloc(1, sizeof *im);
    if (!im) return mw__error(MW_ERR_NOMEM, "%s: out of host memory initialising", dev->name);
    if ((st = init_impl(dev, im))) {
        char msg[MW__MSG_SIZE];
        snprintf(msg, sizeof msg, "%s", mw_last_error());
        release(dev, im);
        return mw__error_copy(st, msg);
    }
    dev->impl = im;
    return MW_OK;
}

static void cuda_shutdown(mw__device *dev) {
    release(dev, impl_of(dev));
    dev->impl = NULL;
}

static mw_status cuda_alloc(mw__device *dev, size_t bytes, void **out) {
    *out = NULL;
    if (!bytes) return MW_OK;
    mw_status st = bind(dev);
    if (st) return st;
    cudaError_t e = cudaMalloc(out, bytes); /* 256-byte aligned */
    if (e != cudaSuccess) {
        *out = NULL;
        (void)cudaGetLastError();
        mw_status code = e == cudaErrorMemoryAllocation ? MW_ERR_NOMEM : MW_ERR_DEVICE;
        return mw__error(code, "%s: cudaMalloc of %zu bytes failed: %s", dev->name, bytes,
                         cudaGetErrorString(e));
    }
    return MW_OK;
}

static void cuda_free(mw__device *dev, void *p) {
    if (!p || cudaSetDevice(dev->ordinal) != cudaSuccess) return;
    cudaFree(p);
    (void)cudaGetLastError();
}

/* Synchronous copies through the device's stream, so they are ordered after its kernels. The
 * host side is pageable memory; the call returns when the copy is complete. */
static mw_status copy_sync(mw__device *dev, void *dst, const void *src, size_t bytes,
                           cudaMemcpyKind kind) {
    if (!bytes) return MW_OK;
    mw_status st = bind(dev);
    if (st) return st;
    cuda_impl *im = impl_of(dev);
    if (!im) {
        CU(dev, cudaMemcpy, dst, src, bytes, kind);
        return MW_OK;
    }
    CU(dev, cudaMemcpyAsync, dst, src, bytes, kind, im->stream);
    CU(dev, cudaStreamSynchronize, im->stream);
    /* Everything queued before has run: a data error it found is reported now, so a value read
     * back (a loss, a parameter) is never one computed from a bad id or target. */
    return flagged(dev);
}

static mw_status cuda_upload(mw__device *dev, void *dst, const void *src, size_t bytes) {
    return copy_sync(dev, dst, src, bytes, cudaMemcpyHostToDevice);
}

static mw_status cuda_download(mw__device *dev, void *dst, const void *src, size_t bytes) {
    return copy_sync(dev, dst, src, bytes, cudaMemcpyDeviceToHost);
}

static mw_status cuda_host_alloc(mw__device *dev, size_t bytes, void **out) {
    *out = NULL;
    if (!bytes) return MW_OK;
    mw_status st = bind(dev);
    if (st) return st;
    cudaError_t e = cudaMallocHost(out, bytes);
    if (e != cudaSuccess) {
        *out = NULL;
        (void)cudaGetLastError();
        return mw__error(e == cudaErrorMemoryAllocation ? MW_ERR_NOMEM : MW_ERR_DEVICE,
                         "%s: cudaMallocHost of %zu bytes failed: %s", dev->name, bytes,
                         cudaGetErrorString(e));
    }
    return MW_OK;
}

static void cuda_host_free(mw__device *dev, void *p) {
    if (!p || cudaSetDevice(dev->ordinal) != cudaSuccess) return;
    cudaFreeHost(p);
    (void)cudaGetLastError();
}

/* Queued on the stream: the kernels that read dst run after it, and nothing waits here. */
static mw_status cuda_upload_async(mw__device *dev, void *dst, const void *src, size_t bytes) {
    if (!bytes) return MW_OK;
    ENTER(dev);
    CU(dev, cudaMemcpyAsync, dst, src, bytes, cudaMemcpyHostToDevice, im->stream);
    return MW_OK;
}

static mw_status cuda_sync(mw__device *dev) {
    ENTER(dev);
    CU(dev, cudaStreamSynchronize, im->stream);
    return flagged(dev);
}

/* --- vtable: kernels -------------------------------------------------------------------------- */

#define LAUNCH(kernel, grid, block, smem, ...)                                                     \
    kernel<<<(grid), (block), (smem), im->stream>>>(__VA_ARGS__)

template <int OP>
static void launch_binary(cuda_impl *im, const mw__nd &nd, int64_t total, const mw__k_binary *k) {
    if (nd.rank <= 1) {
        int64_t s0 = nd.rank ? nd.stride[0][0] : 0, s1 = nd.rank ? nd.stride[1][0] : 0;
        int64_t s2 = nd.rank ? nd.stride[2][0] : 0;
        LAUNCH(k_binary_1d<OP>, blocks_for(total, THREADS), THREADS, 0, total, k->out, s0, k->a, s1,
               k->b, s2);
    } else if (total < INT32_MAX) {
        k_binary_nd<OP, uint32_t><<<blocks_for(total, THREADS), THREADS, 0, im->stream>>>(
            nd, (uint32_t)total, k->out, k->a, k->b);
    } else {
        k_binary_nd<OP, int64_t>
            <<<blocks_for(total, THREADS), THREADS, 0, im->stream>>>(nd, total, k->out, k->a, k->b);
    }
}

static mw_status cuda_binary(mw__device *dev, const mw__k_binary *k) {
    ENTER(dev);
    mw__nd nd = k->nd;
    mw__nd_simplify(&nd, 3);
    int64_t total = nd_total(&nd);
    if (total <= 0) return MW_OK;
    switch (k->op) {
    case MW__BIN_ADD: launch_binary<MW__BIN_ADD>(im, nd, total, k); break;
    case MW__BIN_SUB: launch_binary<MW__BIN_SUB>(im, nd, total, k); break;
    case MW__BIN_MUL: launch_binary<MW__BIN_MUL>(im, nd, total, k); break;
    case MW__BIN_DIV: launch_binary<MW__BIN_DIV>(im, nd, total, k); break;
    default:
        return mw__error(MW_ERR_UNSUPPORTED, "%s: unknown binary op %d", dev->name, (int)k->op);
    }
    return launched(dev, "binary kernel");
}

static mw_status cuda_copy(mw__device *dev, const mw__k_copy *k) {
    ENTER(dev);
    mw__nd nd = k->nd;
    mw__nd_simplify(&nd, 2);
    int64_t total = nd_total(&nd);
    if (total <= 0) return MW_OK;
    if (nd.rank <= 1) {
        int64_t s0 = nd.rank ? nd.stride[0][0] : 0, s1 = nd.rank ? nd.stride[1][0] : 0;
        if (s0 == 1 && s1 == 1 && k->alpha == 1.0f) {
            CU(dev, cudaMemcpyAsync, k->out, k->a, (size_t)total * sizeof(float),
               cudaMemcpyDeviceToDevice, im->stream);
            return launched(dev, "copy");
        }
        LAUNCH(k_copy_1d, blocks_for(total, THREADS), THREADS, 0, total, k->alpha, k->out, s0, k->a,
               s1);
    } else if (total < INT32_MAX) {
        LAUNCH(k_copy_nd<uint32_t>, blocks_for(total, THREADS), THREADS, 0, nd, (uint32_t)total,
               k->alpha, k->out, k->a);
    } else {
        LAUNCH(k_copy_nd<int64_t>, blocks_for(total, THREADS), THREADS, 0, nd, total, k->alpha,
               k->out, k->a);
    }
    return launched(dev, "copy kernel");
}

static mw_status cuda_reduce(mw__device *dev, const mw__k_reduce *k) {
    ENTER(dev);
    mw__nd nd = k->nd;
    mw__nd_simplify(&nd, 2);
    sub_nd kept, red;
    memset(&kept, 0, sizeof kept);
    memset(&red, 0, sizeof red);
    int64_t K = 1, R = 1;
    for (int d = 0; d < nd.rank; d++) {
        sub_nd *s = nd.stride[0][d] ? &kept : &red;
        s->dims[s->rank] = nd.dims[d];
        s->sa[s->rank] = nd.stride[1][d];
        s->so[s->rank] = nd.stride[0][d];
        s->rank++;
        *(nd.stride[0][d] ? &K : &R) *= nd.dims[d];
    }
    if (K < k->out_count || K == 0 || R == 0)
        CU(dev, cudaMemsetAsync, k->out, 0, (size_t)k->out_count * sizeof(float), im->stream);
    if (K == 0 || R == 0) return launched(dev, "reduce");

    /* Split each output's terms over P jobs when there are few outputs and many terms; each
     * job keeps at least 16 terms. */
    int64_t P = 1;
    if (K < REDUCE_TARGET_JOBS && R >= 32) {
        P = (REDUCE_TARGET_JOBS + K - 1) / K;
        int64_t cap = (R + 15) / 16;
        if (P > cap) P = cap;
        int64_t room = (int64_t)(SCRATCH_BYTES / sizeof(float)) / K;
        if (P > room) P = room;
        if (P < 1) P = 1;
    }
    /* Coalesced reads: neighbouring threads take neighbouring elements of a's innermost dim. */
    int p_fastest = nd.rank > 0 && nd.stride[0][nd.rank - 1] == 0;
    float *partial = (float *)im->scratch;
    LAUNCH(k_reduce_jobs, blocks_for(K * P, THREADS), THREADS, 0, kept, red, K, R, P, p_fastest,
           k->alpha, k->out, partial, k->a);
    if (P > 1) {
        if (P <= 32)
            LAUNCH(k_reduce_parts_seq, blocks_for(K, THREADS), THREADS, 0, kept, K, P, k->alpha,
                   k->out, partial);
        else
            LAUNCH(k_reduce_parts_tree<THREADS>, row_blocks(K), THREADS, 0, kept, K, P, k->alpha,
                   k->out, partial);
    }
    return launched(dev, "reduce kernel");
}

static int fits_int(int64_t v) { return v >= 0 && v <= INT32_MAX; }

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: a row-major matrix is its
 * transpose in column-major with the same leading dimension, so cuBLAS gets B first, then A,
 * with m and n swapped. */
static mw_status cuda_gemm(mw__device *dev, const mw__k_gemm *k) {
    ENTER(dev);
    if (k->batch <= 0 || k->m <= 0 || k->n <= 0) return MW_OK;
    if (k->k <= 0) {
        LAUNCH(k_zero_matrices, blocks_for(k->batch * k->m * k->n, THREADS), THREADS, 0, k->batch,
               k->m, k->n, k->ldc, k->stride_c, k->c);
        return launched(dev, "gemm (empty K)");
    }
    if (!fits_int(k->m) || !fits_int(k->n) || !fits_int(k->k) || !fits_int(k->lda) ||
        !fits_int(k->ldb) || !fits_int(k->ldc) || !fits_int(k->batch))
        return mw__error(MW_ERR_UNSUPPORTED,
                         "%s: gemm of %lld x %lld x %lld (batch %lld) exceeds cuBLAS's 32-bit "
                         "sizes",
                         dev->name, (long long)k->m, (long long)k->n, (long long)k->k,
                         (long long)k->batch);
    const float one = 1.0f, zero = 0.0f;
    BLAS(dev, cublasSgemmStridedBatched, im->blas, k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
         k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)k->n, (int)k->m, (int)k->k, &one, k->b,
         (int)k->ldb, (long long)k->stride_b, k->a, (int)k->lda, (long long)k->stride_a, &zero,
         k->c, (int)k->ldc, (long long)k->stride_c, (int)k->batch);
    return flagged(dev); /* cuBLAS reports its launch failures in its status */
}

static mw_status cuda_fill(mw__device *dev, const mw__k_fill *k) {
    ENTER(dev);
    if (k->count <= 0) return MW_OK;
    if (k->value == 0.0f && !signbit(k->value))
        CU(dev, cudaMemsetAsync, k->out, 0, (size_t)k->count * sizeof(float), im->stream);
    else
        LAUNCH(k_fill, blocks_for(k->count, THREADS), THREADS, 0, k->count, k->value, k->out);
    return launched(dev, "fill kernel");
}

static mw_status cuda_sgd(mw__device *dev, const mw__k_sgd *k) {
    ENTER(dev);
    if (k->count <= 0) return MW_OK;
    LAUNCH(k_sgd, blocks_for(k->count, THREADS), THREADS, 0, k->count, k->lr, k->p, k->g);
    return launched(dev, "sgd kernel");
}

static mw_status cuda_unary(mw__device *dev, const mw__k_unary *k) {
    ENTER(dev);
    if (k->op != MW__UN_GELU)
        return mw__error(MW_ERR_UNSUPPORTED, "%s: unknown unary op %d", dev->name, (int)k->op);
    if (k->count <= 0) return MW_OK;
    LAUNCH(k_gelu, blocks_for(k->count, THREADS), THREADS, 0, k->count, k->out, k->a);
    return launched(dev, "gelu kernel");
}

static mw_status cuda_unary_grad(mw__device *dev, const mw__k_unary_grad *k) {
    ENTER(dev);
    if (k->op != MW__UN_GELU)
        return mw__error(MW_ERR_UNSUPPORTED, "%s: unknown unary op %d", dev->name, (int)k->op);
    if (k->count <= 0) return MW_OK;
    LAUNCH(k_gelu_grad, blocks_for(k->count, THREADS), THREADS, 0, k->count, k->out, k->gy, k->x);
    return launched(dev, "gelu gradient kernel");
}

static mw_status cuda_layernorm(mw__device *dev, const mw__k_layernorm *k) {
    ENTER(dev);
    if (k->rows <= 0 || k->n <= 0) return MW_OK;
    LAUNCH(k_layernorm<ROW_THREADS>, row_blocks(k->rows), ROW_THREADS, 0, k->rows, k->n, k->eps,
           k->out, k->x, k->w, k->b);
    return launched(dev, "layernorm kernel");
}

static mw_status cuda_layernorm_dx(mw__device *dev, const mw__k_layernorm_grad *k) {
    ENTER(dev);
    if (k->rows <= 0 || k->n <= 0) return MW_OK;
    LAUNCH(k_layernorm_dx<ROW_THREADS>, row_blocks(k->rows), ROW_THREADS, 0, k->rows, k->n, k->eps,
           k->out, k->gy, k->x, k->w);
    return launched(dev, "layernorm dx kernel");
}

#define LN_MAX_PARTS 1024
#define LN_SHARED_MAX_FLOATS 8192 /* 32 KiB, well inside the 48 KiB a block gets by default */

static mw_status cuda_layernorm_dw(mw__device *dev, const mw__k_layernorm_grad *k) {
    ENTER(dev);
    if (k->n <= 0) return MW_OK;
    if (k->rows <= 0) {
        CU(dev, cudaMemsetAsync, k->out, 0, (size_t)k->n * sizeof(float), im->stream);
        return launched(dev, "layernorm dw");
    }
    int64_t room = (int64_t)(SCRATCH_BYTES / sizeof(float)) / k->n;
    if (room < 1)
        return mw__error(MW_ERR_UNSUPPORTED, "%s: layernorm rows of %lld exceed the scratch memory",
                         dev->name, (long long)k->n);
    int64_t parts = k->rows < LN_MAX_PARTS ? k->rows : LN_MAX_PARTS;
    if (parts > room) parts = room;
    int64_t chunk = (k->rows + parts - 1) / parts;
    parts = (k->rows + chunk - 1) / chunk;
    int use_shared = k->n <= LN_SHARED_MAX_FLOATS;
    size_t smem = use_shared ? (size_t)k->n * sizeof(float) : 0;
    float *partial = (float *)im->scratch;
    LAUNCH(k_layernorm_dw_parts<ROW_THREADS>, (unsigned)parts, ROW_THREADS, smem, k->rows, k->n,
           k->eps, chunk, use_shared, partial, k->gy, k->x);
    LAUNCH(k_sum_rows, blocks_for(k->n, THREADS), THREADS, 0, k->n, parts, k->out, partial);
    return launched(dev, "layernorm dw kernel");
}

/* Warp-per-row kernels: THREADS / 32 rows per block. */
static unsigned warp_row_blocks(int64_t rows) { return blocks_for(rows * 32, THREADS); }

static mw_status cuda_softmax(mw__device *dev, const mw__k_softmax *k) {
    ENTER(dev);
    int64_t rows = k->outer * k->s;
    if (rows <= 0 || k->k <= 0) return MW_OK;
    LAUNCH(k_softmax, warp_row_blocks(rows), THREADS, 0, rows, k->s, k->k, k->causal, k->scale,
           k->out, k->a);
    return launched(dev, "softmax kernel");
}

static mw_status cuda_softmax_grad(mw__device *dev, const mw__k_softmax_grad *k) {
    ENTER(dev);
    int64_t rows = k->outer * k->s;
    if (rows <= 0 || k->k <= 0) return MW_OK;
    LAUNCH(k_softmax_grad, warp_row_blocks(rows), THREADS, 0, rows, k->s, k->k, k->causal, k->scale,
           k->out, k->gy, k->p);
    return launched(dev, "softmax gradient kernel");
}

static mw_status cuda_embed(mw__device *dev, const mw__k_embed *k) {
    ENTER(dev);
    if (k->n_ids <= 0 || k->dim <= 0) return MW_OK;
    LAUNCH(k_embed, row_blocks(k->n_ids), THREADS, 0, k->n_ids, k->vocab, k->dim, k->out, k->ids,
           k->table, im->err, im->flag_dev);
    return launched(dev, "embedding kernel");
}

/* Scratch bytes of the sorted embedding gradient for n ids (0: too many for the arena). */
static size_t embed_sort_bytes(int64_t n_ids, int64_t vocab, int *end_bit, size_t *temp) {
    if (n_ids <= 0 || n_ids > INT32_MAX || vocab >= INT32_MAX) return 0;
    *end_bit = 1;
    while (*end_bit < 32 && ((uint64_t)1 << *end_bit) <= (uint64_t)vocab) (*end_bit)++;
    *temp = 0;
    if (cub::DeviceRadixSort::SortPairs(NULL, *temp, (const uint32_t *)NULL, (uint32_t *)NULL,
                                        (const uint32_t *)NULL, (uint32_t *)NULL, (int)n_ids, 0,
                                        *end_bit) != cudaSuccess)
        return 0;
    size_t arrays = 4 * (((size_t)n_ids * sizeof(uint32_t) + 255) / 256 * 256);
    size_t total = arrays + *temp;
    return total <= SCRATCH_BYTES ? total : 0;
}

static mw_status cuda_embed_grad(mw__device *dev, const mw__k_embed_grad *k) {
    ENTER(dev);
    if (k->vocab <= 0 || k->dim <= 0) return MW_OK;
    int end_bit = 32;
    size_t temp = 0;
    if (embed_sort_bytes(k->n_ids, k->vocab, &end_bit, &temp)) {
        /* Rows that no id names stay 0; the others are written whole by their run's block. */
        CU(dev, cudaMemsetAsync, k->out, 0, (size_t)(k->vocab * k->dim) * sizeof(float),
           im->stream);
        size_t slot = ((size_t)k->n_ids * sizeof(uint32_t) + 255) / 256 * 256;
        uint32_t *keys = (uint32_t *)im->scratch, *keys_sorted = (uint32_t *)(im->scratch + slot);
        uint32_t *pos = (uint32_t *)(im->scratch + 2 * slot);
        uint32_t *pos_sorted = (uint32_t *)(im->scratch + 3 * slot);
        void *temp_mem = im->scratch + 4 * slot;
        LAUNCH(k_mark_present, blocks_for(k->n_ids, THREADS), THREADS, 0, k->n_ids, k->vocab,
               k->ids, (unsigned char *)NULL, im->err, im->flag_dev);
        LAUNCH(k_embed_keys, blocks_for(k->n_ids, THREADS), THREADS, 0, k->n_ids, k->vocab, k->ids,
               keys, pos);
        CU(dev, cub::DeviceRadixSort::SortPairs, temp_mem, temp, (const uint32_t *)keys,
           keys_sorted, (const uint32_t *)pos, pos_sorted, (int)k->n_ids, 0, end_bit, im->stream);
        LAUNCH(k_embed_grad_runs, row_blocks(k->n_ids), THREADS, 0, k->n_ids, k->vocab, k->dim,
               k->out, keys_sorted, pos_sorted, k->gy);
        return launched(dev, "embedding gradient kernel");
    }
    /* Too many ids for the scratch arena: one block per vocabulary row scans every id. Rows that
     * no id names are only zeroed; a vocabulary too large for the arena scans every row. */
    unsigned char *present = NULL;
    if ((size_t)k->vocab <= SCRATCH_BYTES) {
        present = (unsigned char *)im->scratch;
        CU(dev, cudaMemsetAsync, present, 0, (size_t)k->vocab, im->stream);
    }
    if (k->n_ids > 0)
        LAUNCH(k_mark_present, blocks_for(k->n_ids, THREADS), THREADS, 0, k->n_ids, k->vocab,
               k->ids, present, im->err, im->flag_dev);
    LAUNCH(k_embed_grad<THREADS>, row_blocks(k->vocab), THREADS, 0, k->n_ids, k->vocab, k->dim,
           k->out, k->ids, k->gy, present);
    return launched(dev, "embedding gradient kernel");
}

static mw_status cuda_xent(mw__device *dev, const mw__k_xent *k) {
    ENTER(dev);
    if (k->rows <= 0) return MW_OK;
    LAUNCH(k_xent<ROW_THREADS>, row_blocks(k->rows), ROW_THREADS, 0, k->rows, k->v, k->valid,
           k->out, k->logits, k->targets, im->err, im->flag_dev);
    return launched(dev, "cross-entropy kernel");
}

static mw_status cuda_xent_grad(mw__device *dev, const mw__k_xent_grad *k) {
    ENTER(dev);
    if (k->rows <= 0 || k->v <= 0) return MW_OK;
    LAUNCH(k_xent_grad<ROW_THREADS>, row_blocks(k->rows), ROW_THREADS, 0, k->rows, k->v, k->valid,
           k->out, k->gy, k->logits, k->targets, im->err, im->flag_dev);
    return launched(dev, "cross-entropy gradient kernel");
}

static mw_status cuda_sumsq(mw__device *dev, const mw__k_sumsq *k) {
    ENTER(dev);
    int64_t blocks = (k->count + THREADS - 1) / THREADS;
    if (blocks > SUMSQ_MAX_BLOCKS) blocks = SUMSQ_MAX_BLOCKS;
    if (blocks < 1) blocks = 1;
    double *partial = (double *)im->scratch;
    LAUNCH(k_sumsq_parts<THREADS>, (unsigned)blocks, THREADS, 0, k->count, partial, k->a);
    LAUNCH(k_sumsq_final<SUMSQ_MAX_BLOCKS>, 1, SUMSQ_MAX_BLOCKS, 0, (int)blocks, k->out, partial);
    return launched(dev, "sumsq kernel");
}

static mw_status cuda_adamw(mw__device *dev, const mw__k_adamw *k) {
    ENTER(dev);
    if (k->count <= 0) return MW_OK;
    LAUNCH(k_adamw, blocks_for(k->count, THREADS), THREADS, 0, *k);
    return launched(dev, "adamw kernel");
}

/* --- services --------------------------------------------------------------------------------- */

extern "C" int mw__cuda_device_count(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* e.g. no driver (error 35): no GPUs, and no error left behind */
        return 0;
    }
    return n;
}

extern "C" mw_status mw__cuda_probe(int *count) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) (void)cudaGetLastError();
    return mw__cuda_count_result(n, (int)e, cudaGetErrorName(e), cudaGetErrorString(e),
                                 mw__gpu_required(), count);
}

extern "C" mw_status mw__cuda_gpu_identity(int ordinal, char out[MW__GPU_ID_SIZE]) {
    char host[64] = "?", bus[32] = "?";
    out[0] = 0;
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = 0;
    cudaError_t e = cudaDeviceGetPCIBusId(bus, (int)sizeof bus, ordinal);
    cudaDeviceProp prop;
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, ordinal);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return mw__error(MW_ERR_DEVICE, "GPU %d: its identity (PCI bus id, UUID) is unknown: %s",
                         ordinal, cudaGetErrorString(e));
    }
    int at = snprintf(out, MW__GPU_ID_SIZE, "%s %s GPU-", host, bus);
    for (int i = 0; i < 16 && at > 0 && at < MW__GPU_ID_SIZE - 2; i++)
        at += snprintf(out + at, (size_t)(MW__GPU_ID_SIZE - at), "%02x",
                       (unsigned char)prop.uuid.bytes[i]);
    return MW_OK;
}

extern "C" struct CUstream_st *mw__cuda_stream(const mw__device *dev) {
    cuda_impl *im = impl_of(dev);
    return im ? im->stream : NULL;
}

extern "C" mw_status mw__cuda_sum_slices_on(mw__device *dev, struct CUstream_st *stream,
                                            float *const *bufs, int nbufs, size_t lo, size_t hi) {
    if (nbufs < 1 || nbufs > MW_MAX_DEVICES || !bufs)
        return mw__error(MW_ERR_INVALID, "%s: sum of %d buffers (expected 1..%d)", dev->name, nbufs,
                         MW_MAX_DEVICES);
    ENTER(dev);
    if (hi > lo) {
        buf_list b;
        memset(&b, 0, sizeof b);
        for (int q = 0; q < nbufs; q++) b.p[q] = bufs[q];
        int64_t n = (int64_t)(hi - lo);
        k_sum_slices<<<blocks_for(n, THREADS), THREADS, 0, stream ? stream : im->stream>>>(
            b, nbufs, (int64_t)lo, (int64_t)hi);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return cuda_fail(dev, "sum kernel", e);
    }
    return MW_OK;
}

extern "C" mw_status mw__cuda_sum_slices(mw__device *dev, float *const *bufs, int nbufs, size_t lo,
                                         size_t hi) {
    mw_status st = mw__cuda_sum_slices_on(dev, NULL, bufs, nbufs, lo, hi);
    if (st) return st;
    CU(dev, cudaStreamSynchronize, impl_of(dev)->stream);
    return MW_OK;
}

/* In the order of mw__device_vtable's members. */
extern "C" const mw__device_vtable mw__cuda_device = {
    "cuda",            /* kind */
    0,                 /* host_memory */
    cuda_init,         /* init */
    cuda_shutdown,     /* shutdown */
    cuda_alloc,        /* alloc */
    cuda_free,         /* free */
    cuda_upload,       /* upload */
    cuda_download,     /* download */
    cuda_sync,         /* sync */
    cuda_binary,       /* binary */
    cuda_copy,         /* copy */
    cuda_reduce,       /* reduce */
    cuda_gemm,         /* gemm */
    cuda_fill,         /* fill */
    cuda_sgd,          /* sgd */
    cuda_unary,        /* unary */
    cuda_unary_grad,   /* unary_grad */
    cuda_layernorm,    /* layernorm */
    cuda_layernorm_dx, /* layernorm_dx */
    cuda_layernorm_dw, /* layernorm_dw */
    cuda_softmax,      /* softmax */
    cuda_softmax_grad, /* softmax_grad */
    cuda_embed,        /* embed */
    cuda_embed_grad,   /* embed_grad */
    cuda_xent,         /* xent */
    cuda_xent_grad,    /* xent_grad */
    cuda_sumsq,        /* sumsq */
    cuda_adamw,        /* adamw */
    cuda_host_alloc,   /* host_alloc */
    cuda_host_free,    /* host_free */
    cuda_upload_async, /* upload_async */
};
