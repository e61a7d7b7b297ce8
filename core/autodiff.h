/* Internal: reverse-mode autodiff. */
#ifndef MW__AUTODIFF_H
#define MW__AUTODIFF_H

#include "core/graph_impl.h"

/* Appends the backward pass of the scalar `loss` to g. param_grads[i] receives the gradient
 * tensor of the graph's i-th parameter, or NULL when the loss does not depend on it. */
mw_status mw__autodiff(mw_graph *g, mw_tensor *loss, mw_tensor **param_grads);

#endif
