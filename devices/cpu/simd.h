/* Internal: how the CPU kernels get wide vector code without a -march flag on the whole build.
 * The files of the hot kernels are compiled once per x86-64 level (AVX-512, AVX2+FMA, baseline)
 * and the process runs one level, the widest the CPU has and MESHWIT_CPU_ISA allows
 * (cpu_kernels.h, cpu_isa.h). The loops are plain C written so that the compiler vectorises them:
 * no branches in the body, partial sums in eight interleaved lanes. A given machine and level
 * always runs the same code, so results repeat bit for bit there; two levels may differ in the
 * last bits (fused multiply-add). */
#ifndef MW__CPU_SIMD_H
#define MW__CPU_SIMD_H

#include <stdint.h> /* also defines __GLIBC__ where it applies */
#include <string.h>

#include "devices/math.h"

/* A helper of the kernels: inlined into each, so it is compiled for the kernel's vector unit
 * (an out-of-line copy would be compiled for the baseline). */
#define MW__CPU_INLINE static inline __attribute__((always_inline))

/* Eight floats (and eight int32 lanes) as one vector: GCC/Clang vector extensions, so a loop the
 * auto-vectoriser would leave scalar (a NaN-propagating max, a register-tiled product) is still
 * vector code; the baseline build runs each as two SSE halves. Values pass through memcpy and
 * pointers, never by value across a function boundary (that would depend on the vector unit). */
typedef float mw__v8 __attribute__((vector_size(32)));
typedef int32_t mw__v8i __attribute__((vector_size(32)));
typedef uint32_t mw__v8u __attribute__((vector_size(32)));

/* Eight bf16 (or other 16-bit) lanes. */
typedef uint16_t mw__v8h __attribute__((vector_size(16)));

/* The bf16 bits of float bits u, lane by lane in the low half of each lane of a vector of
 * uint32 (any width), rounded as mw__bf16_from_f32 (devices/math.h) rounds: to the nearest even
 * on the bits, a NaN kept a NaN and made quiet. */
#define MW__BF16_ROUNDED(u)                                                                        \
    __extension__({                                                                                \
        __typeof__(u) u_ = (u), r_ = (u_ + 0x7fffu + ((u_ >> 16) & 1u)) >> 16;                     \
        __typeof__(u) q_ = (u_ >> 16) | 0x40u,                                                     \
                      nan_ = (__typeof__(u))((u_ & 0x7fffffffu) > 0x7f800000u);                    \
        (r_ & ~nan_) | (q_ & nan_);                                                                \
    })

/* Eight floats stored as bf16, each rounded as MW__BF16_ROUNDED says. */
MW__CPU_INLINE void mw__bf16_store8(uint16_t *dst, const mw__v8 *x) {
    mw__v8u u;
    memcpy(&u, x, sizeof u);
    mw__v8h h = __builtin_convertvector(MW__BF16_ROUNDED(u), mw__v8h);
    memcpy(dst, &h, sizeof h);
}

/* Sixteen floats stored as bf16, the same rounding (one AVX-512 vector of work where the level
 * has it, two or four narrower ones elsewhere). */
typedef float mw__v16 __attribute__((vector_size(64)));
typedef int32_t mw__v16i __attribute__((vector_size(64)));
typedef uint32_t mw__v16u __attribute__((vector_size(64)));
typedef uint16_t mw__v16h __attribute__((vector_size(32)));
MW__CPU_INLINE void mw__bf16_store16(uint16_t *dst, const mw__v16 *x) {
    mw__v16u u;
    memcpy(&u, x, sizeof u);
    mw__v16h h = __builtin_convertvector(MW__BF16_ROUNDED(u), mw__v16h);
    memcpy(dst, &h, sizeof h);
}

/* Eight bf16 values widened to floats (exactly). */
MW__CPU_INLINE void mw__bf16_load8(mw__v8 *x, const uint16_t *src) {
    mw__v8h h;
    memcpy(&h, src, sizeof h);
    mw__v8u u = __builtin_convertvector(h, mw__v8u) << 16;
    memcpy(x, &u, sizeof u);
}

/* n floats rounded into bf16 (sixteen at a time, then eight) and n bf16 widened into floats
 * (eight at a time), the tail one by one with the same rounding (devices/math.h). */
MW__CPU_INLINE void mw__bf16_narrow(int64_t n, const float *src, uint16_t *dst) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        mw__v16 x;
        memcpy(&x, src + i, sizeof x);
        mw__bf16_store16(dst + i, &x);
    }
    for (; i + 8 <= n; i += 8) {
        mw__v8 x;
        memcpy(&x, src + i, sizeof x);
        mw__bf16_store8(dst + i, &x);
    }
    for (; i < n; i++) dst[i] = mw__bf16_from_f32(src[i]);
}

/* The widening is a plain loop on the bits, which GCC vectorises at -O3 (the level files' flags)
 * into whole-register zero-extensions: 32 values in 8 instructions at AVX-512, where eight lanes
 * through mw__bf16_load8 took 7 (GCC 12 splits that conversion into halves). On the 2-core Intel
 * Xeon (family 6 model 207) it widens 1.4x as fast in L1 and 1.2-1.35x in L2, and the same
 * from memory, which bounds both (about 4 G values/s). */
MW__CPU_INLINE void mw__bf16_widen(int64_t n, const uint16_t *restrict src, float *restrict dst) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(dst + i, &u, sizeof u);
    }
}

/* rows x n of them, rows `from_ld` apart, into rows `to_ld` apart: row by row, so the gaps
 * between rows (someone else's elements, in a view) are neither read nor written. */
MW__CPU_INLINE void mw__bf16_widen_rows(int64_t rows, int64_t n, const uint16_t *from,
                                        int64_t from_ld, float *to, int64_t to_ld) {
    for (int64_t r = 0; r < rows; r++) mw__bf16_widen(n, from + r * from_ld, to + r * to_ld);
}

MW__CPU_INLINE void mw__bf16_narrow_rows(int64_t rows, int64_t n, const float *from,
                                         int64_t from_ld, uint16_t *to, int64_t to_ld) {
    for (int64_t r = 0; r < rows; r++) mw__bf16_narrow(n, from + r * from_ld, to + r * to_ld);
}

/* Sums in double of a row of floats, taken in 32 lanes: four vectors of eight doubles, element j
 * of the row in lane j mod 32 (the row's last n mod 16 elements in a scalar of their own), so
 * that four chains of additions overlap and a 16-float vector widens in two instructions at
 * AVX-512. The lanes are combined in a fixed order (mw__wide_total): the result depends only on
 * the data and the row length, never on the vector unit. */
typedef double mw__v8d __attribute__((vector_size(64)));
typedef struct mw__wide_sum {
    mw__v8d v[4];
    double tail;
} mw__wide_sum;

/* v's lanes 0-7 and 8-15, widened to double (exactly). */
MW__CPU_INLINE void mw__widen16(mw__v16 v, mw__v8d *lo, mw__v8d *hi) {
    *lo = __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), mw__v8d);
    *hi = __builtin_convertvector(__builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15),
                                  mw__v8d);
}

/* s's lanes [16 h, 16 h + 16) += v (h: 0 or 1), widened to double. Give h as a constant (a loop
 * unrolled by two vectors): an index that varies would keep the lanes in memory. */
MW__CPU_INLINE void mw__wide_add(mw__wide_sum *s, int h, mw__v16 v) {
    mw__v8d lo, hi;
    mw__widen16(v, &lo, &hi);
    s->v[2 * h] += lo;
    s->v[2 * h + 1] += hi;
}

MW__CPU_INLINE double mw__wide_total(const mw__wide_sum *s) {
    mw__v8d a = (s->v[0] + s->v[2]) + (s->v[1] + s->v[3]);
    return ((((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])))) + s->tail;
}

/* The eight lanes of an accumulator combined pairwise, always in the same order. */
#define MW__SUM8(acc)                                                                              \
    ((((acc)[0] + (acc)[4]) + ((acc)[1] + (acc)[5])) +                                             \
     (((acc)[2] + (acc)[6]) + ((acc)[3] + (acc)[7])))

#endif
