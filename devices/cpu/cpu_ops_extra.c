/* The CPU kernels of the ops and optimizers beyond the core set: plain loops over the per-element
 * math of devices/math_ops.h. */
#include "devices/cpu/cpu_ops_extra.h"

#include "devices/math_ops.h"

mw_status mw__cpu_sgd_momentum(mw__device *dev, const mw__k_sgd_momentum *k) {
    (void)dev;
    for (int64_t i = 0; i < k->count; i++)
        k->p[i] = mw__sgd_momentum_update(k->p[i], k->grad_scale * k->g[i],
                                          k->buf ? &k->buf[i] : NULL, k->lr, k->momentum,
                                          k->dampening, k->weight_decay, k->nesterov, k->first);
    return MW_OK;
}
