/* Internal: the CPU backend's neural-network and optimizer kernels (cpu_nn.c). */
#ifndef MW__CPU_NN_H
#define MW__CPU_NN_H

#include "devices/device.h"

mw_status mw__cpu_unary(mw__device *dev, const mw__k_unary *k);
mw_status mw__cpu_unary_grad(mw__device *dev, const mw__k_unary_grad *k);
mw_status mw__cpu_layernorm(mw__device *dev, const mw__k_layernorm *k);
mw_status mw__cpu_layernorm_dx(mw__device *dev, const mw__k_layernorm_grad *k);
mw_status mw__cpu_layernorm_dw(mw__device *dev, const mw__k_layernorm_grad *k);
mw_status mw__cpu_softmax(mw__device *dev, const mw__k_softmax *k);
mw_status mw__cpu_softmax_grad(mw__device *dev, const mw__k_softmax_grad *k);
mw_status mw__cpu_embed(mw__device *dev, const mw__k_embed *k);
mw_status mw__cpu_embed_grad(mw__device *dev, const mw__k_embed_grad *k);
mw_status mw__cpu_xent(mw__device *dev, const mw__k_xent *k);
mw_status mw__cpu_xent_grad(mw__device *dev, const mw__k_xent_grad *k);
mw_status mw__cpu_sumsq(mw__device *dev, const mw__k_sumsq *k);
mw_status mw__cpu_adamw(mw__device *dev, const mw__k_adamw *k);
mw_status mw__cpu_attention(mw__device *dev, const mw__k_attention *k);
mw_status mw__cpu_attention_grad(mw__device *dev, const mw__k_attention *k);
/* What runs the attention kernels for k's dtypes, for reports. */
const char *mw__cpu_attention_impl(const mw__k_attention *k);
/* bf16 attention on the CPU's bf16 instructions through oneDNN (cpu_attention_dnnl.c):
 * prepare sets k->impl where it applies (bf16 q, k, v, the CPU has bf16 instructions, oneDNN
 * is built and has the products), and then the kernels above run through it. */
mw_status mw__cpu_attention_prepare(mw__device *dev, mw__k_attention *k, int grad);
mw_status mw__cpu_attention_dnnl(mw__device *dev, const mw__k_attention *k, int grad);
const char *mw__cpu_attention_dnnl_name(const mw__k_attention *k);

#endif
