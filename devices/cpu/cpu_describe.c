/* What a CPU kernel runs, for the bench and the profile (mw__device_vtable.describe): the GEMM's
 * and attention's own choices (cpu_gemm.c, cpu_attention.c), the vector loops of the process's
 * level for every other kernel. Apart from the device's state (cpu_state.c), which the GEMM
 * reads: describing the GEMM from there made the two files call each other. */
#include <stdio.h>
#include <string.h>

#include "devices/cpu/cpu_isa.h"
#include "devices/cpu/cpu_kernels.h"
#include "devices/cpu/cpu_state.h"

const char *mw__cpu_describe(const mw__device *dev, int kind, const void *k) {
    (void)dev;
    if (kind < 0) { /* every other kernel: the vector loops of the process's level */
        const char *isa = mw__cpu_vector_isa();
        return !strcmp(isa, "avx512") ? "vector loops (avx512)"
               : !strcmp(isa, "avx2") ? "vector loops (avx2)"
               : !strcmp(isa, "sse2") ? "vector loops (sse2)"
                                      : "vector loops";
    }
    if (kind == MW__I_GEMM) return mw__cpu_gemm_impl(k);
    if (kind == MW__I_ATTENTION || kind == MW__I_ATTENTION_GRAD) {
        const mw__k_attention *a = k;
        if (!a->rope.dims) return mw__cpu_attention_impl(k);
        static _Thread_local char text[160]; /* read (copied) by the caller at once */
        snprintf(text, sizeof text, "%s, q and k rotated as read", mw__cpu_attention_impl(k));
        return text;
    }
    return "";
}
