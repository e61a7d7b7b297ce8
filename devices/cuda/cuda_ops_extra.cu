/* CUDA kernels of the ops and optimizer options beyond the core set: the per-element math of
 * devices/math.h (shared with the CPU reference), one thread per output element, queued on
 * the device's stream. No kernel adds floats across threads, so results are deterministic. */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "core/error.h"
#include "devices/cuda/cuda.h"
#include "devices/cuda/cuda_kernels.h"
}
#include "devices/cuda/cuda_impl.cuh"
#include "devices/math.h"

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
__global__ void k_dropout(mw__k_dropout k, uint64_t key, uint32_t threshold) {
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

/* out[o, ids[o], i] = a[o, i]; a row with a position outside [0, n) is left and recorded. */
__global__ void k_state_write(int64_t outer, int64_t n, int64_t inner, float *out, const float *a,
                              const int32_t *ids, err_rec *err, int *flag) {
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < outer * inner;
         t += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = t / inner, i = t % inner;
        int32_t at = ids[o];
        if (at < 0 || at >= n) {
            if (i == 0) record_bad(&err[ERR_POSITION], flag, o, at, n);
            continue;
        }
        out[(o * n + at) * inner + i] = a[t];
    }
}

/* One warp per (row, head): the query against keys 0..pos in key order, with a running maximum
 * (the CPU kernel's order of terms per feature; the dot products summed by a fixed shuffle
 * tree). Each lane keeps the features lane, lane + 32, ... (dim <= 256). */
#define CACHED_MAX_DIM 256
__global__ void k_attention_cached(mw__k_attention_cached k, err_rec *err, int *flag) {
    int64_t pair = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (pair >= k.outer * k.heads) return;
    int64_t o = pair / k.heads, h = pair % k.heads, H = k.heads, D = k.dim, row = 2 * H * D;
    int32_t pos = k.pos[o];
    if (pos < 0 || pos >= k.n) {
        if (lane == 0 && h == 0) record_bad(&err[ERR_POSITION], flag, o, pos, k.n);
        return;
    }
    const float *q = k.q + (o * H + h) * D, *kv = k.kv + o * k.n * row + h * D;
    float acc[CACHED_MAX_DIM / 32], qv[CACHED_MAX_DIM / 32];
    int per = (int)((D + 31) / 32);
    for (int r = 0; r < per; r++) {
        int64_t d = lane + 32 * r;
        acc[r] = 0.0f;
        qv[r] = d < D ? q[d] : 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = 0; j <= pos; j++) {
        const float *key = kv + j * row, *val = key + H * D;
        float s = 0.0f;
        for (int r = 0; r < per; r++) {
            int64_t d = lane + 32 * r;
            if (d < D) s += qv[r] * key[d];
        }
        for (int w = 16; w > 0; w >>= 1) s += __shfl_xor_sync(0xffffffffu, s, w);
        s *= k.scale;
        if (s > m) {
            float c = mw__expf(m - s);
            l *= c;
            for (int r = 0; r < per; r++) acc[r] *= c;
            m = s;
        }
        float e = mw__expf(s - m);
        l += e;
        for (int r = 0; r < per; r++) {
            int64_t d = lane + 32 * r;
            if (d < D) acc[r] += e * val[d];
        }
    }
    float inv = 1.0f / l;
    for (int r = 0; r < per; r++) {
        int64_t d = lane + 32 * r;
        if (d < D) k.out[(o * H + h) * D + d] = acc[r] * inv;
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

extern "C" mw_status mw__cuda_map(mw__device *dev, const mw__k_map *k) {
    mw_status st = enter(dev);
    if (st || k->count <= 0) return st;
    k_map<<<blocks_for(k->count), THREADS, 0, mw__cuda_stream(dev)>>>(k->count, k->fn, k->out,
                                                                      k->a);
    return launched(dev, "map kernel");
}

extern "C" mw_status mw__cuda_map_grad(mw__device *dev, const mw__k_map_grad *k) {
    mw_status st = enter(dev);
    if (st || k->count <= 0) return st;
    k_map_grad<<<blocks_for(k->count), THREADS, 0, mw__cuda_stream(dev)>>>(k->count, k->fn, k->out,
                                                                           k->x, k->gy);
    return launched(dev, "map gradient kernel");
}

extern "C" mw_status mw__cuda_dropout(mw__device *dev, const mw__k_dropout *k) {
    mw_status st = enter(dev);
    if (st || k->count <= 0) return st;
    cudaStream_t s = mw__cuda_stream(dev);
    if (!k->active || k->p <= 0.0f) {
        if (k->out == k->a) return MW_OK;
        cudaError_t e = cudaMemcpyAsync(k->out, k->a, (size_t)k->count * sizeof(float),
                                        cudaMemcpyDeviceToDevice, s);
        return e == cudaSuccess ? MW_OK
                                : mw__error(MW_ERR_DEVICE, "%s: dropout copy failed: %s", dev->name,
                                            cudaGetErrorString(e));
    }
    k_dropout<<<blocks_for(k->count), THREADS, 0, s>>>(*k, mw__dropout_key(k->seed, k->step),
                                                       mw__dropout_threshold(k->p));
    return launched(dev, "dropout kernel");
}

static mw_status reduce_max(mw__device *dev, const mw__k_max *k, int arg) {
    mw_status st = enter(dev);
    if (st || k->outer * k->inner <= 0) return st;
    k_reduce_max<<<blocks_for(k->outer * k->inner), THREADS, 0, mw__cuda_stream(dev)>>>(
        k->outer, k->n, k->inner, arg, k->out, k->a);
    return launched(dev, "max kernel");
}

extern "C" mw_status mw__cuda_argmax(mw__device *dev, const mw__k_max *k) {
    return reduce_max(dev, k, 1);
}

extern "C" mw_status mw__cuda_reduce_max(mw__device *dev, const mw__k_max *k) {
    return reduce_max(dev, k, 0);
}

extern "C" mw_status mw__cuda_state_write(mw__device *dev, const mw__k_state_write *k) {
    mw_status st = enter(dev);
    if (st || k->outer * k->inner <= 0) return st;
    cuda_impl *im = (cuda_impl *)dev->impl;
    k_state_write<<<blocks_for(k->outer * k->inner), THREADS, 0, mw__cuda_stream(dev)>>>(
        k->outer, k->n, k->inner, k->out, k->value, k->ids, im->err, im->flag_dev);
    return launched(dev, "state write kernel");
}

extern "C" mw_status mw__cuda_attention_cached(mw__device *dev, const mw__k_attention_cached *k) {
    mw_status st = enter(dev);
    if (st || k->outer * k->heads <= 0) return st;
    if (k->dim > CACHED_MAX_DIM)
        return mw__error(MW_ERR_UNSUPPORTED,
                         "%s: cached attention supports head sizes up to %d, not %lld", dev->name,
                         CACHED_MAX_DIM, (long long)k->dim);
    cuda_impl *im = (cuda_impl *)dev->impl;
    int64_t pairs = k->outer * k->heads, per_block = THREADS / 32;
    unsigned blocks = (unsigned)((pairs + per_block - 1) / per_block);
    k_attention_cached<<<blocks, THREADS, 0, mw__cuda_stream(dev)>>>(*k, im->err, im->flag_dev);
    return launched(dev, "cached attention kernel");
}

extern "C" mw_status mw__cuda_sgd_momentum(mw__device *dev, const mw__k_sgd_momentum *k) {
    mw_status st = enter(dev);
    if (st || k->count <= 0) return st;
    k_sgd_momentum<<<blocks_for(k->count), THREADS, 0, mw__cuda_stream(dev)>>>(*k);
    return launched(dev, "sgd momentum kernel");
}
