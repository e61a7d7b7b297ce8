/* Internal: the optimizer (optimizer.c): defaults and validation, which parameters decay, and on
 * each device its state (moments, accumulator) and its step: the gradient norm, SGD (with
 * momentum and weight decay), AdamW, gradient accumulation and ZeRO-1's gather. */
#ifndef MW__OPTIMIZER_H
#define MW__OPTIMIZER_H

#include "parallel/trainer_impl.h"

/* Checks every field's range; MW_ERR_INVALID naming the field otherwise. */
mw_status mw__optimizer_resolve(mw_optimizer *o);

/* Parameter-sized state buffers the optimizer keeps: 2 (AdamW: m, v), 1 (SGD with momentum), 0. */
int mw__optimizer_moments(const mw_optimizer *o);

/* Decides, per parameter leaf of g, whether weight decay applies under o (decays, nparams
 * bytes): o->decays, or o->decay_rule. MW_ERR_NOMEM. */
mw_status mw__decay_flags(const mw_graph *g, const mw_optimizer *o, unsigned char *decays);
/* The same for the trainer's graph, into tr->decays. */
mw_status mw__optimizer_decays(mw_trainer *tr);

/* The part [*lo, *hi) of parameter slot s inside replica r's slice of the flat parameters
 * [own_lo, own_hi); 0 when they do not meet. */
int mw__own_part(const replica *r, const mw__param_slot *s, int64_t *lo, int64_t *hi);

/* Where the devices hold a parameter's gradients (all of them, or with ZeRO-1 those of their
 * slice) and the optimizer's moment k (0: AdamW's m or SGD's momentum buffer, 1: AdamW's v; of
 * their slice), for mw__param_transfer and mw__param_holder. */
mw__holding mw__held_grads(mw_trainer *tr);
mw__holding mw__held_moment(mw_trainer *tr, int k);

/* What the trainer runs on each worker (mw__program_hooks, ctx: the trainer): its device state
 * made and freed, and after a backward pass (tr->train) accumulation or the optimizer step. */
extern const mw__program_hooks mw__trainer_hooks;

#endif
