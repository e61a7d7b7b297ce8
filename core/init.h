/* Internal: parameter initial values. */
#ifndef MW__INIT_H
#define MW__INIT_H

#include <stdint.h>

#include "core/graph_impl.h"

/* Writes the initial values of parameter node p (numel elements, row-major) into dst. Random
 * initialisers draw from a stream seeded by the graph seed and the parameter's name, so the
 * values do not depend on the order parameters were declared in, nor on the device. */
void mw__param_init(const mw_graph *g, const mw_tensor *p, float *dst);

#endif
