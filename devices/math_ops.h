/* Per-element math of the ops and optimizers added beside the core set (devices/math.h holds
 * those): plain functions for the host and, under nvcc, the device. */
#ifndef MW__MATH_OPS_H
#define MW__MATH_OPS_H

#include <math.h>
#include <stdint.h>

#include "devices/math.h"

/* One element of torch.optim.SGD's update (see mw__k_sgd_momentum); buf NULL: no momentum. */
MW__HD float mw__sgd_momentum_update(float p, float g, float *buf, float lr, float momentum,
                                     float dampening, float weight_decay, int nesterov, int first) {
    g += weight_decay * p;
    if (buf) {
        *buf = first ? g : momentum * *buf + (1.0f - dampening) * g;
        g = nesterov ? g + momentum * *buf : *buf;
    }
    return p - lr * g;
}

/* Elementwise functions of MW__OP_MAP. The comparisons test x against 0 (mw_compare applies them
 * to a - b) and give 1 or 0. */
typedef enum mw__mapfn {
    MW__F_RELU,
    MW__F_TANH,
    MW__F_SIGMOID,
    MW__F_EXP,
    MW__F_LOG,
    MW__F_SQRT,
    MW__F_ABS,
    MW__F_GT0,
    MW__F_GE0,
    MW__F_LT0,
    MW__F_LE0,
    MW__F_EQ0,
    MW__F_NE0
} mw__mapfn;

MW__HD float mw__map(int fn, float x) {
    switch (fn) {
    case MW__F_RELU: return x > 0.0f ? x : 0.0f;
    case MW__F_TANH: return tanhf(x);
    case MW__F_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case MW__F_EXP: return expf(x);
    case MW__F_LOG: return logf(x);
    case MW__F_SQRT: return sqrtf(x);
    case MW__F_ABS: return fabsf(x);
    case MW__F_GT0: return x > 0.0f ? 1.0f : 0.0f;
    case MW__F_GE0: return x >= 0.0f ? 1.0f : 0.0f;
    case MW__F_LT0: return x < 0.0f ? 1.0f : 0.0f;
    case MW__F_LE0: return x <= 0.0f ? 1.0f : 0.0f;
    case MW__F_EQ0: return x == 0.0f ? 1.0f : 0.0f;
    default: return x != 0.0f ? 1.0f : 0.0f; /* MW__F_NE0 */
    }
}

/* f'(x), as PyTorch defines it where f has a kink: relu'(0) = 0, abs'(0) = 0; the comparisons
 * have none (0). */
MW__HD float mw__map_grad(int fn, float x) {
    switch (fn) {
    case MW__F_RELU: return x > 0.0f ? 1.0f : 0.0f;
    case MW__F_TANH: {
        float t = tanhf(x);
        return 1.0f - t * t;
    }
    case MW__F_SIGMOID: {
        float s = 1.0f / (1.0f + expf(-x));
        return s * (1.0f - s);
    }
    case MW__F_EXP: return expf(x);
    case MW__F_LOG: return 1.0f / x;
    case MW__F_SQRT: return 0.5f / sqrtf(x);
    case MW__F_ABS: return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : 0.0f;
    default: return 0.0f;
    }
}

MW__HD uint64_t mw__mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Dropout's mask. Whether element `index` (of the whole tensor) is kept at `step` depends on the
 * three alone: key = a hash of (seed, step), made once per kernel; each block of 2^32 elements
 * (index >> 32) gets two 32-bit words from the key; an element's 32-bit hash (lowbias32, a full
 * avalanche finaliser) of its low index bits xor the first word, times the second (odd, so a
 * bijection that differs per key), gives u = its top 24 bits, uniform in [0, 2^24): kept when
 * u >= ceil(p 2^24), i.e. with probability 1 - p to 2^-24. All in 32-bit integer arithmetic, so
 * the CPU's loop runs in vector lanes. */
MW__HD uint64_t mw__dropout_key(uint64_t seed, uint64_t step) {
    uint64_t h = mw__mix64(seed + 0x9E3779B97F4A7C15ull);
    return mw__mix64(h ^ (step * 0xD1B54A32D192ED03ull));
}

MW__HD uint32_t mw__hash32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    return x ^ (x >> 16);
}

/* The two words of block hi of key's stream. */
MW__HD void mw__dropout_block(uint64_t key, uint32_t hi, uint32_t *w0, uint32_t *w1) {
    uint64_t b = mw__mix64(key ^ ((uint64_t)hi * 0x9E3779B97F4A7C15ull));
    *w0 = (uint32_t)b;
    *w1 = (uint32_t)(b >> 32) | 1u;
}

/* p as the threshold of u: ceil(p 2^24) (p 2^24 is exact in float). */
MW__HD uint32_t mw__dropout_threshold(float p) { return (uint32_t)ceilf(p * 16777216.0f); }

MW__HD int mw__dropout_keeps(uint32_t w0, uint32_t w1, uint32_t lo, uint32_t threshold) {
    return (mw__hash32(lo ^ w0) * w1 >> 8) >= threshold;
}

/* The whole test for one element (the GPU's kernel and the tests). */
MW__HD int mw__dropout_keep(uint64_t key, uint64_t index, uint32_t threshold) {
    uint32_t w0, w1;
    mw__dropout_block(key, (uint32_t)(index >> 32), &w0, &w1);
    return mw__dropout_keeps(w0, w1, (uint32_t)index, threshold);
}

#endif
