/* Internal: the CUDA kernels of the ops and optimizer options beyond the core set
 * (cuda_ops_extra.cu), the counterparts of devices/cpu/cpu_ops_extra.c. They are meant for
 * mw__cuda_device's vtable entries `extra` and `sgd_momentum`; until they are listed there, a
 * step on a CUDA device that uses one of these ops fails with MW_ERR_UNSUPPORTED, and the
 * gpu-labelled tests call them directly. Only code built with MESHWIT_HAVE_CUDA may reference
 * them. */
#ifndef MW__CUDA_OPS_EXTRA_H
#define MW__CUDA_OPS_EXTRA_H

#include "devices/device.h"

#ifdef __cplusplus
extern "C" {
#endif

mw_status mw__cuda_extra(mw__device *dev, const mw__k_extra *k);
mw_status mw__cuda_sgd_momentum(mw__device *dev, const mw__k_sgd_momentum *k);

#ifdef __cplusplus
}
#endif

#endif
