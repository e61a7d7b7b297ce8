/* Per-element math shared by every backend: plain functions that compile for the host and, under
 * nvcc, for the device too, so the CUDA kernels and the CPU reference compute the same formulas
 * and the host instantiation can be tested without a GPU. The exponential and tanh, GELU, the
 * binary ops, bf16 rounding, the optimizers' updates (AdamW, SGD with momentum), the functions of
 * the elementwise maps and their derivatives, and dropout's mask. */
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

/* SiLU, x / (1 + e^-x), and its derivative s (1 + x (1 - s)) with s = 1 / (1 + e^-x), where
 * 1 - s = e^-x s keeps its precision as s nears 1. A NaN stays NaN. */
MW__HD float mw__silu(float x) { return x / (1.0f + mw__expf(-x)); }
MW__HD float mw__silu_grad(float x) {
    float e = mw__expf(-x), s = 1.0f / (1.0f + e);
    return s * (1.0f + x * (e * s));
}

/* The frequencies of rotary embeddings, f_j = 1 / theta^(2j / dims) for j < dims / 2, in f32 as
 * transformers computes them, with Llama 3's scaling when llama3 is set (transformers'
 * _compute_llama3_parameters): wavelengths 2 pi / f_j shorter than original / high are kept,
 * those longer than original / low divided by factor, and those between interpolated. */
typedef struct mw__rope_freqs {
    float theta, factor, low, high;
    int64_t original;
    int dims, llama3;
} mw__rope_freqs;

MW__HD float mw__rope_freq(const mw__rope_freqs *f, int j) {
    float inv = 1.0f / powf(f->theta, (float)(2 * j) / (float)f->dims);
    if (!f->llama3) return inv;
    float wl = 6.28318548f / inv, old = (float)f->original;
    float low_wl = (float)((double)f->original / (double)f->low);
    float high_wl = (float)((double)f->original / (double)f->high);
    if (wl < high_wl) return inv;
    if (wl > low_wl) return inv / f->factor;
    float smooth = (old / wl - f->low) / (f->high - f->low);
    return (1.0f - smooth) * inv / f->factor + smooth * inv;
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

/* One AdamW update of one element; returns the new parameter and updates *m, *v. The bias
 * corrections multiply by their reciprocals, which a loop over the elements computes once: a
 * vector divider is slow enough that three divisions and a square root an element bound the
 * whole update (on the 2-core Intel Xeon, a kernel over 3.3M parameters went from 3.5-3.7 ms to
 * 2.5-3.6 ms, reading and writing p, m and v and reading g from memory). */
MW__HD float mw__adamw_update(float p, float g, float *m, float *v, float lr, float beta1,
                              float beta2, float eps, float wd, float bias1, float bias2) {
    *m = beta1 * *m + (1.0f - beta1) * g;
    *v = beta2 * *v + (1.0f - beta2) * g * g;
    float mhat = *m * (1.0f / bias1), vhat = *v * (1.0f / bias2);
    return p - lr * (mhat / (sqrtf(vhat) + eps) + wd * p);
}

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

/* --- the exact sum of squares (the gradient norm) ------------------------------------------
 * The square of a float is exact in double and a multiple of 2^-298; a sum of at most 2^63 of them
 * is below 2^320. An mw__sqacc holds such a sum exactly, as the integer N of units of 2^-320 in
 * MW__SQ_WORDS little-endian 64-bit words (two's complement while a kernel folds its parts in).
 * N is the exact sum, so the accumulator of a set of values has the same bits however the set is
 * cut into pieces (over devices, processes, threads, blocks) and whatever the order of the
 * additions: that makes the gradient norm, and clipping by it, identical whether the gradient is
 * whole on every device or split into ZeRO-1 slices, FSDP shards and tensor-parallel parts, on any
 * backend. NaNs and infinities are counted apart. */
#define MW__SQ_WORDS 11
#define MW__SQ_UNIT 320 /* N counts units of 2^-MW__SQ_UNIT */
typedef struct mw__sqacc {
    uint64_t w[MW__SQ_WORDS];
    uint64_t nan, inf;
} mw__sqacc;

/* acc += v 2^s, for a signed v and 0 <= s < 64 (MW__SQ_WORDS - 2). */
MW__HD void mw__sqacc_add_shifted(mw__sqacc *acc, int64_t v, unsigned s) {
    unsigned i = s / 64u, b = s % 64u;
    uint64_t ext = v < 0 ? ~(uint64_t)0 : 0, u = (uint64_t)v;
    uint64_t part[2] = {u << b, b ? (u >> (64u - b)) | (ext << b) : ext};
    uint64_t carry = 0;
    for (unsigned j = i; j < MW__SQ_WORDS; j++) {
        uint64_t add = j - i < 2 ? part[j - i] : ext;
        uint64_t t = acc->w[j] + add, c = t < add;
        acc->w[j] = t + carry;
        carry = c | (acc->w[j] < t);
    }
}

/* dst += src, exactly. */
MW__HD void mw__sqacc_add(mw__sqacc *dst, const mw__sqacc *src) {
    uint64_t carry = 0;
    for (unsigned j = 0; j < MW__SQ_WORDS; j++) {
        uint64_t t = dst->w[j] + src->w[j], c = t < src->w[j];
        dst->w[j] = t + carry;
        carry = c | (dst->w[j] < t);
    }
    dst->nan += src->nan;
    dst->inf += src->inf;
}

/* The exponent bin of x and its significand squared: x = m 2^(e-150) with e in 1..254 (1 for
 * subnormals) and m < 2^24, so x^2 = m^2 2^(2e-300) with m^2 < 2^48 exact. Returns 0, or 1 for a
 * NaN and 2 for an infinity (neither binned). */
MW__HD int mw__sq_split(float x, unsigned *bin, uint64_t *m2) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    uint32_t e = (b >> 23) & 255u, m = b & 0x7fffffu;
    if (e == 255u) return m ? 1 : 2;
    if (e)
        m |= 0x800000u;
    else
        e = 1u;
    *bin = e;
    *m2 = (uint64_t)m * m;
    return 0;
}

/* acc += c m2 2^(2e-300): bin e's integer sum (c m2 as lo + 2^64 hi), for folding bins in. */
MW__HD void mw__sqacc_add_bin(mw__sqacc *acc, unsigned e, uint64_t lo, uint64_t hi) {
    unsigned s = 2u * e + (MW__SQ_UNIT - 300u);
    for (unsigned q = 0; q < 4; q++) {
        uint64_t word = q < 2 ? lo : hi;
        int64_t half = (int64_t)((q & 1u) ? word >> 32 : word & 0xffffffffu);
        if (half) mw__sqacc_add_shifted(acc, half, s + 32u * q);
    }
}

/* acc += x^2, one value at a time (the reference the kernels are tested against). */
MW__HD void mw__sqacc_add_square(mw__sqacc *acc, float x) {
    unsigned e;
    uint64_t m2;
    int kind = mw__sq_split(x, &e, &m2);
    if (kind == 1) acc->nan++;
    if (kind == 2) acc->inf++;
    if (!kind && m2) mw__sqacc_add_bin(acc, e, m2, 0);
}

/* The sum the accumulator holds, in double: NaN if a value was NaN, else infinity if one was
 * infinite, else N 2^-320 from the top word down (a function of N alone, so equal sums give equal
 * bits; within a few ulp). */
MW__HD double mw__sqacc_value(const mw__sqacc *acc) {
    if (acc->nan) return (double)NAN;
    if (acc->inf) return (double)INFINITY;
    double v = 0.0;
    for (int j = MW__SQ_WORDS - 1; j >= 0; j--) v = v * 0x1p64 + (double)acc->w[j];
    return ldexp(v, -MW__SQ_UNIT);
}

#endif
