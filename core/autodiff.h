/* Internal: reverse-mode autodiff. */
#ifndef MW__AUTODIFF_H
#define MW__AUTODIFF_H

#include "core/graph_impl.h"

/* Which activations of the graph's regions (mw_region_begin) the backward pass recomputes
 * instead of reading the forward's (the values of mw_trainer_config.recompute). */
typedef enum mw__recompute {
    MW__RECOMPUTE_NONE = 0,   /* none: every value is read as the forward made it */
    MW__RECOMPUTE_BLOCKS = 1, /* every node of a region but its outputs */
    MW__RECOMPUTE_DOTS = 2    /* as BLOCKS, but contractions, attentions and the adds that a
                                 contraction's kernel writes (bias, residual) are kept */
} mw__recompute;

/* Appends the backward pass of the scalar `loss` to g. param_grads[i] receives the gradient
 * tensor of the graph's i-th parameter, or NULL when the loss does not depend on it. With a
 * recomputation policy, the values a region's gradients read that the policy does not keep are
 * read from copies of their forward nodes (same op, same parameters, same inputs or their
 * copies), made once per region when its backward first needs them: the forward's buffers then
 * die in forward. A graph without regions gets the same backward pass under every policy.
 * regather: the parameters FSDP gathers (GATHER nodes) are gathered again where the backward pass
 * reads them, so the forward's gathered copy dies after its last forward use; 0 keeps it. */
mw_status mw__autodiff(mw_graph *g, mw_tensor *loss, mw_tensor **param_grads, mw__recompute policy,
                       int regather);

/* Where a backward pass starts and what else it differentiates (a pipeline stage's: parallel/
 * pipeline.c). seeds[i] is the gradient that value seed_of[i] receives from outside the graph
 * (the next stage's), added to what the loss gives it; wrt[i] are values besides the parameters
 * whose gradients are wanted (the stage's inputs from the stage before), written to wrt_grads[i]
 * (NULL when nothing that depends on a parameter flows from it into the loss or a seed). */
typedef struct mw__autodiff_ends {
    int nseeds, nwrt;
    mw_tensor *const *seed_of, *const *seeds;
    mw_tensor *const *wrt;
    mw_tensor **wrt_grads;
} mw__autodiff_ends;

/* mw__autodiff with seeds and gradients of other values (ends NULL: mw__autodiff). */
mw_status mw__autodiff_from(mw_graph *g, mw_tensor *loss, mw_tensor **param_grads,
                            mw__recompute policy, int regather, const mw__autodiff_ends *ends);

#endif
