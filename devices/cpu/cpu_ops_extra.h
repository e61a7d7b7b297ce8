/* Internal: the CPU kernels of the ops and optimizers beyond the core set (cpu_ops_extra.c). */
#ifndef MW__CPU_OPS_EXTRA_H
#define MW__CPU_OPS_EXTRA_H

#include "devices/device.h"

mw_status mw__cpu_sgd_momentum(mw__device *dev, const mw__k_sgd_momentum *k);
mw_status mw__cpu_extra(mw__device *dev, const mw__k_extra *k);

#endif
