/* Internal: optimizer defaults and validation, and the SGD update (optimizer.c). */
#ifndef MW__OPTIMIZER_H
#define MW__OPTIMIZER_H

#include "parallel/trainer_impl.h"

/* Fills the fields left 0 with their defaults and checks every range; MW_ERR_INVALID naming the
 * field otherwise. */
mw_status mw__optimizer_resolve(mw_optimizer *o);

/* Parameter-sized state buffers the optimizer keeps: 2 (AdamW: m, v), 1 (SGD with momentum), 0. */
int mw__optimizer_moments(const mw_optimizer *o);

/* Decides, per parameter leaf, whether weight decay applies (tr->decays). */
mw_status mw__optimizer_decays(mw_trainer *tr);

/* The part [*lo, *hi) of parameter slot s inside worker w's slice of the flat parameters
 * [own_lo, own_hi); 0 when they do not meet. */
int mw__own_part(const worker *w, const mw__param_slot *s, int64_t *lo, int64_t *hi);

/* The SGD update of worker w's slice with learning rate lr and gradient scale `scale`. */
mw_status mw__sgd_update(worker *w, float lr, float scale);

/* Gradient accumulation on worker w after a backward pass: fold 0 adds the gradients to the
 * accumulator (copies them into it for the first micro-batch); fold 1 replaces the gradients by
 * the mean of the accumulated micro-batches and this one. */
mw_status mw__accumulate_grads(worker *w, int fold);

#endif
