/* Internal: oneDNN matmul primitives for the CPU backend's GEMMs (built with MESHWIT_HAVE_DNNL).
 * A GEMM's shape, dtypes and epilogue are fixed when its plan is built, so its primitive is made
 * once, when the worker starts, and only executed per step; the scratchpad is the caller's (user
 * scratchpad mode). Every call runs oneDNN on one thread, the calling one, whatever the process's
 * OpenMP settings, and leaves those settings as it found them. oneDNN itself allocates in every
 * run (dnnl_primitive_execute builds a map of the arguments; gemm:jit mallocs its packing
 * buffer), so a product that must not allocate in a step stays off it.
 *
 * Thread-safety: an engine (mw__dnnl) and its GEMMs are used by one thread at a time (the
 * device's); different engines are independent. */
#ifndef MW__CPU_DNNL_H
#define MW__CPU_DNNL_H

#include <stddef.h>

#include "devices/device.h"

typedef struct mw__dnnl mw__dnnl;
typedef struct mw__dnnl_gemm mw__dnnl_gemm;

/* Caps the instruction sets oneDNN may use, by name ("avx2", "avx512", "avx512_bf16", "amx";
 * anything else: no cap). Process-wide, and possible only before oneDNN first looks at the CPU:
 * returns 0 when it came too late and oneDNN already uses wider instructions, else 1. */
int mw__dnnl_cap_isa(const char *name);

/* An engine and stream for one device. Errors: MW_ERR_DEVICE, MW_ERR_NOMEM. */
mw_status mw__dnnl_new(mw__dnnl **out);
void mw__dnnl_free(mw__dnnl *d);

/* The matmul of k (shape, dtypes, bias, addend, beta); its pointers are only used for their
 * alignment. *out is NULL (and MW_OK returned) when oneDNN has no implementation of it. */
mw_status mw__dnnl_gemm_new(mw__dnnl *d, const mw__k_gemm *k, mw__dnnl_gemm **out);
void mw__dnnl_gemm_free(mw__dnnl_gemm *g);

/* oneDNN's name for the implementation it chose ("brg:avx512_core_amx_bf16"). */
const char *mw__dnnl_gemm_impl(const mw__dnnl_gemm *g);

/* Bytes of scratchpad the GEMM needs (64-byte aligned), possibly 0. */
size_t mw__dnnl_gemm_scratch(const mw__dnnl_gemm *g);

/* Runs the GEMM on k's pointers (same shape as when made) with `scratch` (at least
 * mw__dnnl_gemm_scratch bytes). Errors: MW_ERR_DEVICE naming oneDNN's status. */
mw_status mw__dnnl_gemm_run(mw__dnnl *d, mw__dnnl_gemm *g, const mw__k_gemm *k, void *scratch);

#endif
