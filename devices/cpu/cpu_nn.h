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

#endif
