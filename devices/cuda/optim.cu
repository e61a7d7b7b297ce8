/* Optimizer updates: SGD, SGD with momentum and weight decay, AdamW (math shared with the CPU in
 * devices/math.h). No kernel adds floats across threads, so results are deterministic. */

#include "devices/cuda/cuda_impl.cuh"

/* Each also writes the updated parameter's bf16 rounding to p16 when it is given. */
__global__ void k_sgd(int64_t n, float lr, float *p, const float *g, uint16_t *p16) {
    GRID_LOOP(i, n) {
        float x = p[i] - lr * g[i];
        p[i] = x;
        if (p16) p16[i] = mw__bf16_from_f32(x);
    }
}

__global__ void k_adamw(mw__k_adamw k) {
    GRID_LOOP(i, k.count) {
        float m = k.m[i], v = k.v[i];
        float p = mw__adamw_update(k.p[i], k.grad_scale * k.g[i], &m, &v, k.lr, k.beta1, k.beta2,
                                   k.eps, k.weight_decay, k.bias1, k.bias2);
        k.p[i] = p;
        k.m[i] = m;
        k.v[i] = v;
        if (k.p16) k.p16[i] = mw__bf16_from_f32(p);
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

mw_status mw__cuda_sgd(mw__device *dev, const mw__k_sgd *k) {
    ENTER(dev);
    if (k->count <= 0) return MW_OK;
    LAUNCH(k_sgd, blocks_for(k->count, THREADS), THREADS, 0, k->count, k->lr, k->p, k->g, k->p16);
    return mw__cuda_launched(dev, "sgd kernel");
}

mw_status mw__cuda_adamw(mw__device *dev, const mw__k_adamw *k) {
    ENTER(dev);
    if (k->count <= 0) return MW_OK;
    LAUNCH(k_adamw, blocks_for(k->count, THREADS), THREADS, 0, *k);
    return mw__cuda_launched(dev, "adamw kernel");
}

extern "C" mw_status mw__cuda_sgd_momentum(mw__device *dev, const mw__k_sgd_momentum *k) {
    mw_status st = enter_gpu(dev);
    if (st || k->count <= 0) return st;
    k_sgd_momentum<<<wide_blocks(k->count), THREADS, 0, mw__cuda_stream(dev)>>>(*k);
    return launch_error(dev, "sgd momentum kernel");
}
