/* Per-element math shared by every backend: plain functions that compile for the host and, under
 * nvcc, for the device too, so the CUDA kernels and the CPU reference compute the same formulas
 * and the host instantiation can be tested without a GPU. */
#ifndef MW__MATH_H
#define MW__MATH_H

#include <math.h>

#ifdef __CUDACC__
#define MW__HD __host__ __device__ __forceinline__
#else
#define MW__HD static inline
#endif

#define MW__GELU_K 0.7978845608028654f /* sqrt(2/pi) */

/* GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
MW__HD float mw__gelu(float x) {
    float u = MW__GELU_K * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

MW__HD float mw__gelu_grad(float x) {
    float u = MW__GELU_K * (x + 0.044715f * x * x * x);
    float t = tanhf(u);
    float du = MW__GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

MW__HD float mw__binop_apply(int op, float a, float b) {
    return op == 0 ? a + b : op == 1 ? a - b : op == 2 ? a * b : a / b;
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
