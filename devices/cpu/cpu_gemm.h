/* Internal: the CPU backend's contractions. Their kernels, mw__cpu_gemm and mw__cpu_gemm_prepare,
 * are declared with the others in cpu_kernels.h; a device's GEMMs run on oneDNN's matmul
 * primitives where that is built and measures faster, else OpenBLAS; bf16 operands run on the
 * CPU's bf16 instructions (AVX512-BF16, AMX) through oneDNN where it has them and
 * MESHWIT_CPU_ISA allows them (cpu_isa.h), else they are widened to f32 (exactly) and multiplied
 * there. MESHWIT_CPU_GEMM chooses the f32 engine (cpu_state.h). */
#ifndef MW__CPU_GEMM_H
#define MW__CPU_GEMM_H

#include "devices/device.h"

/* What runs a prepared GEMM ("onednn brg:avx512_core_bf16", "openblas sgemm", ...). */
const char *mw__cpu_gemm_impl(const mw__k_gemm *k);

#endif
