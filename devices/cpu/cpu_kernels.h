/* Internal: the CPU backend's kernels, the entries of its device vtable (cpu_device.c fills the
 * table by name), by op family, each in the file of its family, as the CUDA backend's
 * (devices/cuda/cuda_kernels.h): the device's lifetime, memory and copies in cpu_device.c (the
 * device state and describe/workspace with the GEMMs', cpu_gemm.h); cpu_elementwise.c,
 * cpu_reduce.c, cpu_gemm.c, cpu_nn.c, cpu_embed.c, cpu_attention.c, cpu_optim.c. A new op: its
 * kernel in the file of its family, a line here, its slot in cpu_device.c's table. */
#ifndef MW__CPU_KERNELS_H
#define MW__CPU_KERNELS_H

#include <stdint.h>

#include "devices/device.h"

/* cpu_elementwise.c */
mw_status mw__cpu_binary(mw__device *dev, const mw__k_binary *k);
mw_status mw__cpu_copy(mw__device *dev, const mw__k_copy *k);
mw_status mw__cpu_fill(mw__device *dev, const mw__k_fill *k);
mw_status mw__cpu_unary(mw__device *dev, const mw__k_unary *k);
mw_status mw__cpu_unary_grad(mw__device *dev, const mw__k_unary_grad *k);
mw_status mw__cpu_map(mw__device *dev, const mw__k_map *k);
mw_status mw__cpu_map_grad(mw__device *dev, const mw__k_map_grad *k);
mw_status mw__cpu_dropout(mw__device *dev, const mw__k_dropout *k);
/* out[i * so] = bf16(alpha * a[i * sa]) for i < n (the copy's f32 -> bf16 row; the optimizers'
 * bf16 copies of the parameters). */
void mw__cpu_narrow_row(float alpha, int64_t n, uint16_t *restrict out, int64_t so,
                        const float *restrict a, int64_t sa);

/* cpu_reduce.c */
mw_status mw__cpu_reduce(mw__device *dev, const mw__k_reduce *k);
mw_status mw__cpu_sumsq(mw__device *dev, const mw__k_sumsq *k);
mw_status mw__cpu_argmax(mw__device *dev, const mw__k_max *k);
mw_status mw__cpu_reduce_max(mw__device *dev, const mw__k_max *k);

/* cpu_gemm.c (and cpu_dnnl.c: oneDNN's matmul primitives) */
mw_status mw__cpu_gemm(mw__device *dev, const mw__k_gemm *k);
mw_status mw__cpu_gemm_prepare(mw__device *dev, mw__k_gemm *k);

/* cpu_nn.c */
mw_status mw__cpu_layernorm(mw__device *dev, const mw__k_layernorm *k);
mw_status mw__cpu_layernorm_dx(mw__device *dev, const mw__k_layernorm_grad *k);
mw_status mw__cpu_layernorm_dw(mw__device *dev, const mw__k_layernorm_grad *k);
mw_status mw__cpu_softmax(mw__device *dev, const mw__k_softmax *k);
mw_status mw__cpu_softmax_grad(mw__device *dev, const mw__k_softmax_grad *k);
mw_status mw__cpu_xent(mw__device *dev, const mw__k_xent *k);
mw_status mw__cpu_xent_grad(mw__device *dev, const mw__k_xent_grad *k);

/* cpu_embed.c */
mw_status mw__cpu_embed(mw__device *dev, const mw__k_embed *k);
mw_status mw__cpu_embed_grad(mw__device *dev, const mw__k_embed_grad *k);
mw_status mw__cpu_state_write(mw__device *dev, const mw__k_state_write *k);
/* The errors of a bad index, for the kernels that take them: MW_ERR_INVALID naming an id or a
 * target v at position pos of this device's shard outside [0, limit); and MW_OK when every
 * position ids[o] (o < outer) is in [0, n), else MW_ERR_INVALID naming the device (dev may be
 * NULL), `what` and the first row that is not. */
mw_status mw__cpu_out_of_range(const char *what, int32_t v, int64_t pos, int64_t limit);
mw_status mw__cpu_positions_ok(const mw__device *dev, const int32_t *ids, int64_t outer, int64_t n,
                               const char *what);

/* cpu_attention.c */
mw_status mw__cpu_attention(mw__device *dev, const mw__k_attention *k);
mw_status mw__cpu_attention_grad(mw__device *dev, const mw__k_attention *k);
mw_status mw__cpu_attention_cached(mw__device *dev, const mw__k_attention_cached *k);
/* What runs the attention kernels for k's dtypes, for reports. */
const char *mw__cpu_attention_impl(const mw__k_attention *k);
/* bf16 attention on the CPU's bf16 instructions through oneDNN (cpu_attention_dnnl.c):
 * prepare sets k->impl where it applies (bf16 q, k, v, the CPU has bf16 instructions, oneDNN
 * is built and has the products), and then the kernels above run through it. */
mw_status mw__cpu_attention_prepare(mw__device *dev, mw__k_attention *k, int grad);
mw_status mw__cpu_attention_dnnl(mw__device *dev, const mw__k_attention *k, int grad);
const char *mw__cpu_attention_dnnl_name(const mw__k_attention *k);

/* cpu_optim.c */
mw_status mw__cpu_sgd(mw__device *dev, const mw__k_sgd *k);
mw_status mw__cpu_sgd_momentum(mw__device *dev, const mw__k_sgd_momentum *k);
mw_status mw__cpu_adamw(mw__device *dev, const mw__k_adamw *k);

#endif
