/* Internal: the CPU backend's kernels, the entries of its device vtable (cpu_device.c fills the
 * table by name), by op family, each in the file of its family, as the CUDA backend's
 * (devices/cuda/cuda_kernels.h): the device's lifetime, memory and copies in cpu_device.c, its
 * state in cpu_state.c, what each kernel runs in cpu_describe.c, the instruction levels in
 * cpu_isa.c; cpu_elementwise.c, cpu_reduce.c,
 * cpu_gemm.c, cpu_nn.c, cpu_embed.c, cpu_attention.c (with
 * cpu_attention_dnnl.c), cpu_optim.c. A new kernel: its row of MW__KERNELS (devices/device.h),
 * from which its prototype here, its vtable slot and its per-level dispatch are made, and its
 * MW__CPU(mw__cpu_<name>) in the file of its family; nothing else in this folder.
 *
 * Vector levels. The files of MW__CPU_LEVEL_SOURCES (CMakeLists.txt) hold the hot loops and are
 * compiled once per x86-64 level (sse2, avx2 = x86-64-v3, avx512 = x86-64-v4: plain C that the
 * compiler vectorises for each); every function they export is defined as MW__CPU(name), which
 * carries the level in its symbol (mw__cpu_binary_v3), and called by its plain name, a dispatcher
 * (cpu_levels.c) that runs the version of the process's level (mw__cpu_level, cpu_isa.h). One
 * level for the whole process, so every device computes the same bits; MESHWIT_CPU_ISA caps it. */
#ifndef MW__CPU_KERNELS_H
#define MW__CPU_KERNELS_H

#include <stdint.h>

#include "devices/device.h"

/* In a file compiled per level (MW__CPU_LEVEL is _v1, _v3 or _v4): the level's symbol of an
 * entry. Such a file calls another entry of its level by this name too, never through the
 * dispatcher (which would call back into the levels: a call circle scripts/check-layers.sh
 * refuses). */
#define MW__CPU_CAT2_(a, b) a##b
#define MW__CPU_CAT_(a, b) MW__CPU_CAT2_(a, b)
#ifdef MW__CPU_LEVEL
#define MW__CPU(name) MW__CPU_CAT_(name, MW__CPU_LEVEL)
#endif

/* Every kernel of the instruction table (devices/device.h's MW__KERNELS) is mw__cpu_<name>, and
 * cpu_device.c's vtable is made from the table, so a kernel the CPU backend lacks fails the build.
 * The other functions the per-level files export: XS(ret, name, params, args) returning a value,
 * XV(name, params, args) returning nothing. */
#define MW__CPU_EXTRA_ENTRIES(XS, XV)                                                              \
    XV(mw__cpu_narrow_row,                                                                         \
       (float alpha, int64_t n, uint16_t *restrict out, int64_t so, const float *restrict a,       \
        int64_t sa),                                                                               \
       (alpha, n, out, so, a, sa))                                                                 \
    XS(mw_status, mw__cpu_gemm_prepare, (mw__device * dev, mw__k_gemm * k), (dev, k))              \
    XS(const char *, mw__cpu_gemm_impl, (const mw__k_gemm *k), (k))                                \
    XS(mw_status, mw__cpu_out_of_range, (const char *what, int32_t v, int64_t pos, int64_t limit), \
       (what, v, pos, limit))                                                                      \
    XS(mw_status, mw__cpu_positions_ok,                                                            \
       (const mw__device *dev, const int32_t *ids, int64_t outer, int64_t n, const char *what),    \
       (dev, ids, outer, n, what))                                                                 \
    XS(const char *, mw__cpu_attention_impl, (const mw__k_attention *k), (k))                      \
    MW__CPU_DNNL_ENTRIES(XS, XV)                                                                   \
    XS(mw_status, mw__cpu_sgd, (mw__device * dev, const mw__k_sgd *k), (dev, k))                   \
    XS(mw_status, mw__cpu_sgd_momentum, (mw__device * dev, const mw__k_sgd_momentum *k), (dev, k)) \
    XS(mw_status, mw__cpu_adamw, (mw__device * dev, const mw__k_adamw *k), (dev, k))               \
    XS(mw_status, mw__cpu_sumsq, (mw__device * dev, const mw__k_sumsq *k), (dev, k))

/* cpu_attention_dnnl.c's, where libmeshwit is built with oneDNN. */
#ifdef MESHWIT_HAVE_DNNL
#define MW__CPU_DNNL_ENTRIES(XS, XV)                                                               \
    XS(mw_status, mw__cpu_attention_prepare, (mw__device * dev, mw__k_attention * k, int grad),    \
       (dev, k, grad))                                                                             \
    XS(mw_status, mw__cpu_attention_dnnl, (mw__device * dev, const mw__k_attention *k, int grad),  \
       (dev, k, grad))                                                                             \
    XS(const char *, mw__cpu_attention_dnnl_name, (const mw__k_attention *k), (k))
#else
#define MW__CPU_DNNL_ENTRIES(XS, XV)
#endif

/* A kernel of the table as an entry of that form. */
#define MW__CPU_KERNEL_ENTRY_(XS, KIND, name, type)                                                \
    XS(mw_status, mw__cpu_##name, (mw__device * dev, const type *k), (dev, k))

/* Each entry's version of every level, and its dispatcher (the plain name). */
#define MW__CPU_DECLARE_S_(ret, name, params, args)                                                \
    ret name##_v1 params;                                                                          \
    ret name##_v3 params;                                                                          \
    ret name##_v4 params;                                                                          \
    ret name params;
#define MW__CPU_DECLARE_V_(name, params, args) MW__CPU_DECLARE_S_(void, name, params, args)
#define MW__CPU_DECLARE_K_(KIND, name, type, dtypes, ROLES)                                        \
    MW__CPU_KERNEL_ENTRY_(MW__CPU_DECLARE_S_, KIND, name, type)
MW__KERNELS(MW__CPU_DECLARE_K_)
MW__CPU_EXTRA_ENTRIES(MW__CPU_DECLARE_S_, MW__CPU_DECLARE_V_)
#undef MW__CPU_DECLARE_K_
#undef MW__CPU_DECLARE_S_
#undef MW__CPU_DECLARE_V_

/* What the entries above do, by family, where the name does not say it:
 *   cpu_elementwise.c: mw__cpu_narrow_row: out[i * so] = bf16(alpha * a[i * sa]) for i < n (the
 *     copy's f32 -> bf16 row; the optimizers' bf16 copies of the parameters).
 *   cpu_gemm.c: mw__cpu_gemm_impl: what runs a prepared GEMM ("onednn brg:avx512_core_bf16",
 *     "openblas sgemm", "gemv loops (avx512)", ...); its GEMMs run on oneDNN's matmul primitives
 *     where that is built and measures faster, else OpenBLAS, f32 matrix-vector products on
 *     OpenBLAS or, where its kernels are generic, on the file's own loops, bf16 on the CPU's
 *     bf16 instructions through oneDNN where it has them and MESHWIT_CPU_ISA allows them, else
 *     widened to f32.
 *   cpu_embed.c: the errors of a bad index, for the kernels that take them:
 *     mw__cpu_out_of_range: MW_ERR_INVALID naming an id or a target v at position pos of this
 *     device's shard outside [0, limit); mw__cpu_positions_ok: MW_OK when every position ids[o]
 *     (o < outer) is in [0, n), else MW_ERR_INVALID naming the device (dev may be NULL), `what`
 *     and the first row that is not.
 *   cpu_attention.c: mw__cpu_attention_impl: what runs the attention kernels for k's dtypes,
 *     for reports.
 *   cpu_attention_dnnl.c: bf16 attention on the CPU's bf16 instructions through oneDNN: prepare
 *     sets k->impl where it applies (bf16 q, k, v, the CPU has bf16 instructions, oneDNN is
 *     built and has the products), and then the attention kernels run through it. */

#endif
