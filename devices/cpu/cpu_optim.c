/* CPU kernels of the optimizers: SGD, SGD with momentum and weight decay, AdamW (the per-element
 * updates of devices/math.h, the CUDA kernels' formulas), each also writing the updated
 * parameters' bf16 copy when there is one. */
#include "devices/cpu/cpu_kernels.h"
#include "devices/cpu/simd.h"
#include "devices/device.h"
#include "devices/math.h"

mw_status MW__CPU(mw__cpu_sgd)(mw__device *dev, const mw__k_sgd *k) {
    (void)dev;
    float *restrict p = k->p;
    const float *restrict g = k->g;
    for (int64_t i = 0; i < k->count; i++) p[i] -= k->lr * g[i];
    if (k->p16) MW__CPU(mw__cpu_narrow_row)(1.0f, k->count, k->p16, 1, p, 1);
    return MW_OK;
}

mw_status MW__CPU(mw__cpu_sgd_momentum)(mw__device *dev, const mw__k_sgd_momentum *k) {
    (void)dev;
    for (int64_t i = 0; i < k->count; i++) {
        k->p[i] = mw__sgd_momentum_update(k->p[i], k->grad_scale * k->g[i],
                                          k->buf ? &k->buf[i] : NULL, k->lr, k->momentum,
                                          k->dampening, k->weight_decay, k->nesterov, k->first);
        if (k->p16) k->p16[i] = mw__bf16_from_f32(k->p[i]);
    }
    return MW_OK;
}

#define ADAMW_RUN 512 /* elements updated before their bf16 copies are written: in the L1 cache */

mw_status MW__CPU(mw__cpu_adamw)(mw__device *dev, const mw__k_adamw *k) {
    (void)dev;
    for (int64_t i0 = 0; i0 < k->count; i0 += ADAMW_RUN) {
        int64_t i1 = k->count - i0 < ADAMW_RUN ? k->count : i0 + ADAMW_RUN;
        for (int64_t i = i0; i < i1; i++)
            k->p[i] =
                mw__adamw_update(k->p[i], k->grad_scale * k->g[i], &k->m[i], &k->v[i], k->lr,
                                 k->beta1, k->beta2, k->eps, k->weight_decay, k->bias1, k->bias2);
        if (k->p16) mw__bf16_narrow(i1 - i0, k->p + i0, k->p16 + i0);
    }
    return MW_OK;
}
