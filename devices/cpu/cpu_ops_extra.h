/* Internal: the CPU kernels of the ops and optimizers beyond the core set (cpu_ops_extra.c). */
#ifndef MW__CPU_OPS_EXTRA_H
#define MW__CPU_OPS_EXTRA_H

#include "devices/device.h"

mw_status mw__cpu_sgd_momentum(mw__device *dev, const mw__k_sgd_momentum *k);
mw_status mw__cpu_map(mw__device *dev, const mw__k_map *k);
mw_status mw__cpu_map_grad(mw__device *dev, const mw__k_map_grad *k);
mw_status mw__cpu_dropout(mw__device *dev, const mw__k_dropout *k);
mw_status mw__cpu_argmax(mw__device *dev, const mw__k_max *k);
mw_status mw__cpu_reduce_max(mw__device *dev, const mw__k_max *k);
mw_status mw__cpu_state_write(mw__device *dev, const mw__k_state_write *k);
mw_status mw__cpu_attention_cached(mw__device *dev, const mw__k_attention_cached *k);

#endif
