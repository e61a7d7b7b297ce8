/* Per-element math shared by every backend: plain functions that compile for the host and, under
 * nvcc, for the device too, so the CUDA kernels and the CPU reference compute the same formulas
 * and the host instantiation can be tested without a GPU. */
#ifndef MW__MATH_H
#define MW__MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define MW__HD __host__ __device__ __forceinline__
#else
#define MW__HD static inline
#endif

#define MW__GELU_K 0.7978845608028654f /* sqrt(2/pi) */

/* e^x in plain arithmetic, so loops over it vectorise (libm's expf is a call per element):
 * x = n ln2 + r with |r| <= ln2/2, e^r by its Taylor polynomial to r^6 (error ~1e-7 relative),
 * 2^n built in the exponent bits. Inputs below -87 give ~1e-38 (not 0), above 88 give ~1e38.
 * Branch-free and defined for every input: a NaN stays NaN (the clamps let it through and the
 * exponent is built with unsigned integer arithmetic, never a float-to-int conversion of it). */
MW__HD float mw__expf(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    /* Round x/ln2 to the nearest integer with the 1.5 * 2^23 trick (exact in round-to-nearest):
     * the low mantissa bits of t then hold n + 2^22 as an integer. */
    float t = x * 1.44269504f + 12582912.0f;
    float n = t - 12582912.0f;
    float r = (x - n * 0.693145752f) - n * 1.42860677e-6f; /* ln2 split in two for accuracy */
    float p =
        1.0f +
        r * (1.0f +
             r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    uint32_t tb;
    memcpy(&tb, &t, sizeof tb);
    uint32_t bits = (tb - 0x4B400000u + 127u) << 23; /* (n + 127) << 23, modulo 2^32 */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* tanh through one exponential: (1 - e^-2|u|) / (1 + e^-2|u|) with u's sign. Absolute error
 * ~1e-7, which is all GELU needs, at a fraction of the cost of libm's tanhf. */
MW__HD float mw__tanh(float u) {
    float t = mw__expf(-2.0f * fabsf(u));
    return copysignf((1.0f - t) / (1.0f + t), u);
}

/* GELU, tanh form: 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3). Since
 * 0.5 (1 + tanh u) = 1 / (1 + e^-2u), this is x / (1 + e^-2u): one exponential and a division,
 * no sign to carry, and accurate to a few ulp of the result (1 - tanh, near -1, is not formed).
 * A NaN stays NaN; +Inf gives +Inf. */
MW__HD float mw__gelu(float x) {
    float e = mw__expf(x * (-2.0f * MW__GELU_K - 2.0f * MW__GELU_K * 0.044715f * x * x));
    return x / (1.0f + e);
}

/* d/dx of the above: s + 0.5 x (1 - tanh^2 u) du/dx with s = 1 / (1 + e^-2u), and
 * 0.5 (1 - tanh^2 u) = 2 s (1 - s) = 2 s (e^-2u s): the factor 1 - s is formed as a product,
 * so it keeps its precision where s is near 1. */
MW__HD float mw__gelu_grad(float x) {
    float x2 = x * x;
    float e = mw__expf(x * (-2.0f * MW__GELU_K - 2.0f * MW__GELU_K * 0.044715f * x2));
    float s = 1.0f / (1.0f + e), du = MW__GELU_K * (1.0f + 3.0f * 0.044715f * x2);
    return s * (1.0f + 2.0f * x * du * (e * s));
}

/* GELU, exact (torch.nn.GELU(), approximate='none'): x Phi(x) = 0.5 x erfc(-x / sqrt 2), through
 * erfc so that it keeps its relative precision where Phi(x) is small (x far below 0). */
MW__HD float mw__gelu_erf(float x) { return 0.5f * x * erfcf(-0.70710678118654752f * x); }

/* Its derivative: Phi(x) + x phi(x), phi(x) = e^(-x^2 / 2) / sqrt(2 pi). */
MW__HD float mw__gelu_erf_grad(float x) {
    return 0.5f * erfcf(-0.70710678118654752f * x) +
           x * 0.39894228040143268f * mw__expf(-0.5f * x * x);
}

MW__HD float mw__binop_apply(int op, float a, float b) {
    return op == 0 ? a + b : op == 1 ? a - b : op == 2 ? a * b : a / b;
}

/* bf16 is the top half of an f32: sign, the same 8 exponent bits, 7 mantissa bits. Converting
 * rounds to the nearest, ties to even, on the bits (so subnormals round like normals, a carry out
 * of the mantissa moves to the next binade and past the largest finite value to Inf); a NaN stays
 * a NaN of the same sign and top payload bits, made quiet (as the CPUs' VCVTNEPS2BF16 does, but
 * without its flushing of subnormal inputs to zero). Every bf16 value is exactly an f32. */
MW__HD uint16_t mw__bf16_from_f32(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

MW__HD float mw__bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* One AdamW update of one element; returns the new parameter and updates *m, *v. */
MW__HD float mw__adamw_update(float p, float g, float *m, float *v, float lr, float beta1,
                              float beta2, float eps, float wd, float bias1, float bias2) {
    *m = beta1 * *m + (1.0f - beta1) * g;
    *v = beta2 * *v + (1.0f - beta2) * g * g;
    float mhat = *m / bias1, vhat = *v / bias2;
    return p - lr * (mhat / (sqrtf(vhat) + eps) + wd * p);
}

#endif
