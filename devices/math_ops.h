/* Per-element math of the ops and optimizers added beside the core set (devices/math.h holds
 * those): plain functions for the host and, under nvcc, the device. */
#ifndef MW__MATH_OPS_H
#define MW__MATH_OPS_H

#include <math.h>
#include <stdint.h>

#include "devices/math.h"

/* One element of torch.optim.SGD's update (see mw__k_sgd_momentum); buf NULL: no momentum. */
MW__HD float mw__sgd_momentum_update(float p, float g, float *buf, float lr, float momentum,
                                     float dampening, float weight_decay, int nesterov, int first) {
    g += weight_decay * p;
    if (buf) {
        *buf = first ? g : momentum * *buf + (1.0f - dampening) * g;
        g = nesterov ? g + momentum * *buf : *buf;
    }
    return p - lr * g;
}

#endif
