/* The CPU GEMMs' own loops (compiled once per vector level, cpu_levels.h): bf16 operands widened
 * to f32 and a C rounded back, and the epilogue BLAS leaves to us. */
#include <string.h>

#include "devices/cpu/cpu_kernels.h"
#include "devices/cpu/simd.h"

void MW__CPU(mw__cpu_widen)(int64_t n, const uint16_t *restrict src, float *restrict dst) {
    mw__bf16_widen(n, src, dst);
}

void MW__CPU(mw__cpu_narrow)(int64_t n, const float *restrict src, uint16_t *restrict dst) {
    mw__bf16_narrow(n, src, dst);
}

void MW__CPU(mw__cpu_gemm_epilogue)(const mw__k_gemm *k, float *c) {
    for (int64_t bi = 0; bi < k->batch; bi++)
        for (int64_t i = 0; i < k->m; i++) {
            float *row = c + bi * k->stride_c + i * k->ldc;
            const float *add = k->addend ? k->addend + bi * k->stride_c + i * k->ldc : NULL;
            for (int64_t j = 0; j < k->n; j++) {
                float v = k->beta != 0.0f ? row[j] : 0.0f;
                if (k->bias) v += k->bias[j];
                if (add) v += add[j];
                row[j] = v;
            }
        }
}
