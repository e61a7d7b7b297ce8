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

/* Whether dropout keeps element `index` (of the whole tensor) at `step`: a hash of the three
 * (splitmix64's finaliser, chained), its top 24 bits a uniform u in [0, 1), kept when u >= p. */
MW__HD int mw__dropout_keep(uint64_t seed, uint64_t step, uint64_t index, float p) {
    uint64_t h = mw__mix64(seed + 0x9E3779B97F4A7C15ull);
    h = mw__mix64(h ^ (step * 0xD1B54A32D192ED03ull));
    h = mw__mix64(h ^ (index * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull));
    return (float)(h >> 40) * (1.0f / 16777216.0f) >= p;
}

#endif
