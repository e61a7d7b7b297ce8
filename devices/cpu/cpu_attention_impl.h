/* Internal: what the CPU backend's attention_prepare made for an attention instruction
 * (mw__k_attention.impl): each kind's struct starts with its kind. */
#ifndef MW__CPU_ATTENTION_IMPL_H
#define MW__CPU_ATTENTION_IMPL_H

#include "devices/cpu/cpu_kernels.h"
#include "devices/device.h"

typedef enum mw__cpu_attention_impl_kind {
    MW__ATTN_IMPL_DNNL = 1, /* oneDNN products (cpu_attention_dnnl.c) */
    MW__ATTN_IMPL_DP = 2    /* AVX512-BF16 dot-product tiles (cpu_attention_dp.c) */
} mw__cpu_attention_impl_kind;

static inline mw__cpu_attention_impl_kind mw__cpu_attention_kind(const mw__k_attention *k) {
    return *(const mw__cpu_attention_impl_kind *)k->impl;
}

/* The offsets of slice s (a (batch, key/value head) pair) in operand 0 (out, or gy) and operand 1
 * (qkv, and d(qkv) alike) of the walk w. */
static inline void mw__attn_slice_offsets(const mw__nd *w, int64_t s, int64_t *o0, int64_t *o1) {
    *o0 = *o1 = 0;
    for (int i = w->rank - 1; i >= 0; i--) {
        int64_t idx = s % w->dims[i];
        s /= w->dims[i];
        *o0 += idx * w->stride[0][i];
        *o1 += idx * w->stride[1][i];
    }
}

/* Where query g of slice s keeps its probabilities (k->probs), or NULL; the blocks follow in
 * order. */
static inline float *mw__attn_kept(const mw__k_attention *k, int64_t s, int64_t g) {
    return k->probs ? k->probs + (s * mw__attn_group(k) + g) *
                                     mw__attn_probs_per_slice(k->t, k->block, k->causal)
                    : NULL;
}

/* cpu_attention_dp.c's, at the AVX-512 level: attention_prepare's choice where the CPU has
 * AVX512-BF16 and no AMX (its work buffer reserved, k->impl set), and the kernel of both passes. */
#if defined(MW__CPU_LEVEL) && defined(__AVX512F__)
mw_status MW__CPU(mw__cpu_attention_dp_prepare)(mw__device *dev, mw__k_attention *k, int grad);
mw_status MW__CPU(mw__cpu_attention_dp)(mw__device *dev, const mw__k_attention *k, int grad);
#endif

#endif
