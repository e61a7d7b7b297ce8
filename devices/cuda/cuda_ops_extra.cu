/* CUDA kernels of the ops and optimizer options beyond the core set: the per-element math of
 * devices/math_ops.h (shared with the CPU reference), one thread per output element, queued on
 * the device's stream. No kernel adds floats across threads, so results are deterministic. */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "core/error.h"
#include "devices/cuda/cuda.h"
#include "devices/cuda/cuda_ops_extra.h"
}
#include "devices/math_ops.h"

#define THREADS 256

static unsigned blocks_for(int64_t n) {
    int64_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b > 65535 ? 65535 : b); /* the kernels stride over the rest */
}

__global__ void k_map(int64_t n, int fn, float *out, const float *a) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = mw__map(fn, a[i]);
}

__global__ void k_map_grad(int64_t n, int fn, float *out, const float *x, const float *gy) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = gy[i] * mw__map_grad(fn, x[i]);
}

/* Element i of the local box: its global index from its local coordinates. */
__global__ void k_dropout(mw__k_extra k, uint64_t key, uint32_t threshold) {
    float scale = 1.0f / (1.0f - k.p);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < k.count;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t rest = i, g = 0;
        for (int d = k.rank - 1; d >= 0; d--) {
            g += (k.lo[d] + rest % k.len[d]) * k.gstride[d];
            rest /= k.len[d];
        }
        k.out[i] = mw__dropout_keep(key, (uint64_t)g, threshold) ? k.a[i] * scale : 0.0f;
    }
}

__global__ void k_reduce_max(int64_t outer, int64_t n, int64_t inner, int arg, float *out,
                             const float *a) {
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < outer * inner;
         t += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = t / inner, i = t % inner;
        const float *x = a + o * n * inner + i;
        int64_t best = 0;
        for (int64_t j = 1; j < n; j++) /* the CPU's rule: larger wins, a number beats NaN */
            if (x[j * inner] > x[best * inner] ||
                (x[best * inner] != x[best * inner] && x[j * inner] == x[j * inner]))
                best = j;
        out[t] = arg ? (float)best : x[best * inner];
    }
}

__global__ void k_sgd_momentum(mw__k_sgd_momentum k) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < k.count;
         i += (int64_t)gridDim.x * blockDim.x) {
        k.p[i] =
            mw__sgd_momentum_update(k.p[i], k.grad_scale * k.g[i], k.buf ? &k.buf[i] : NULL, k.lr,
                                    k.momentum, k.dampening, k.weight_decay, k.nesterov, k.first);
        if (k.p16) k.p16[i] = mw__bf16_from_f32(k.p[i]);
    }
}

static mw_status launched(mw__device *dev, const char *kernel) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return MW_OK;
    return mw__error(MW_ERR_DEVICE, "%s: %s failed: %s", dev->name, kernel, cudaGetErrorString(e));
}

static mw_status enter(mw__device *dev) {
    cudaError_t e = cudaSetDevice(dev->ordinal);
    if (e == cudaSuccess) return MW_OK;
    return mw__error(MW_ERR_DEVICE, "%s: cudaSetDevice failed: %s", dev->name,
                     cudaGetErrorString(e));
}

extern "C" mw_status mw__cuda_extra(mw__device *dev, const mw__k_extra *k) {
    mw_status st = enter(dev);
    if (st) return st;
    cudaStream_t s = mw__cuda_stream(dev);
    switch (k->op) {
    case MW__X_MAP:
        if (k->count <= 0) return MW_OK;
        k_map<<<blocks_for(k->count), THREADS, 0, s>>>(k->count, k->fn, k->out, k->a);
        return launched(dev, "map kernel");
    case MW__X_MAP_GRAD:
        if (k->count <= 0) return MW_OK;
        k_map_grad<<<blocks_for(k->count), THREADS, 0, s>>>(k->count, k->fn, k->out, k->a, k->b);
        return launched(dev, "map gradient kernel");
    case MW__X_DROPOUT:
        if (k->count <= 0) return MW_OK;
        if (!k->active || k->p <= 0.0f) {
            if (k->out == k->a) return MW_OK;
            cudaError_t e = cudaMemcpyAsync(k->out, k->a, (size_t)k->count * sizeof(float),
                                            cudaMemcpyDeviceToDevice, s);
            return e == cudaSuccess ? MW_OK
                                    : mw__error(MW_ERR_DEVICE, "%s: dropout copy failed: %s",
                                                dev->name, cudaGetErrorString(e));
        }
        k_dropout<<<blocks_for(k->count), THREADS, 0, s>>>(*k, mw__dropout_key(k->seed, k->step),
                                                           mw__dropout_threshold(k->p));
        return launched(dev, "dropout kernel");
    case MW__X_ARGMAX:
    case MW__X_REDUCE_MAX:
        if (k->outer * k->inner <= 0) return MW_OK;
        k_reduce_max<<<blocks_for(k->outer * k->inner), THREADS, 0, s>>>(
            k->outer, k->n, k->inner, k->op == MW__X_ARGMAX, k->out, k->a);
        return launched(dev, "max kernel");
    }
    return mw__error(MW_ERR_UNSUPPORTED, "%s: unknown extra op %d", dev->name, (int)k->op);
}

extern "C" mw_status mw__cuda_sgd_momentum(mw__device *dev, const mw__k_sgd_momentum *k) {
    mw_status st = enter(dev);
    if (st || k->count <= 0) return st;
    k_sgd_momentum<<<blocks_for(k->count), THREADS, 0, mw__cuda_stream(dev)>>>(*k);
    return launched(dev, "sgd momentum kernel");
}
