/* Internal: the CPU backend's contractions (their kernels, mw__cpu_gemm and mw__cpu_gemm_prepare,
 * are declared with the others in cpu_kernels.h) and its per-device state. A device's GEMMs run on
 * oneDNN's matmul primitives where that is built and measures faster, else OpenBLAS; bf16
 * operands run on the CPU's bf16 instructions (AVX512-BF16, AMX) through oneDNN where it has
 * them, else they are widened to f32 (exactly) and multiplied there. Two environment variables,
 * read when a device starts, override the choice (for testing every path on one machine):
 *   MESHWIT_CPU_GEMM = auto | onednn | openblas   the f32 engine (bf16 needs onednn for speed)
 *   MESHWIT_CPU_ISA  = auto | avx2 | avx512 | avx512_bf16 | amx
 *                      the widest instructions the CPU kernels may use: below avx512_bf16, bf16
 *                      contractions take the f32 path; oneDNN is capped alike (process-wide, from
 *                      its first use on). */
#ifndef MW__CPU_GEMM_H
#define MW__CPU_GEMM_H

#include "devices/device.h"

/* The device's state (dev->impl): made by init, freed by shutdown. */
mw_status mw__cpu_state_init(mw__device *dev);
void mw__cpu_state_free(mw__device *dev);

/* What runs a prepared GEMM ("onednn brg:avx512_core_bf16", "openblas sgemm", ...). */
const char *mw__cpu_gemm_impl(const mw__k_gemm *k);

/* For the CPU backend's other prepared kernels (attention): the device's oneDNN engine (NULL
 * without one), its work buffer (shared by the prepared kernels, made at least `bytes` while the
 * worker starts; its address is final once every kernel is prepared) and a list of what they
 * made, freed with the device (free_fn(p) at once when it cannot be recorded). */
struct mw__dnnl *mw__cpu_dnnl(const mw__device *dev);
mw_status mw__cpu_work_reserve(mw__device *dev, size_t bytes);
void *mw__cpu_work(const mw__device *dev);
mw_status mw__cpu_own(mw__device *dev, void *p, void (*free_fn)(void *p));

/* The vtable's describe and workspace (devices/device.h). */
const char *mw__cpu_describe(const mw__device *dev, int kind, const void *k);
size_t mw__cpu_workspace(const mw__device *dev);

/* The widest vector unit the CPU kernels' clones use here: "avx512", "avx2" or "sse2". */
const char *mw__cpu_vector_isa(void);

/* Whether this device may run bf16 products on bf16 instructions (the CPU has them,
 * MESHWIT_CPU_ISA allows them and libmeshwit was built with oneDNN); dev NULL: the process's CPU
 * and environment. */
int mw__cpu_bf16_native(const mw__device *dev);

#endif
