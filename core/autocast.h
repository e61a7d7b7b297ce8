/* Internal: mixed precision as a graph transform. */
#ifndef MW__AUTOCAST_H
#define MW__AUTOCAST_H

#include "core/graph_impl.h"

/* The bf16 policy (mw_trainer_config.precision): every contraction of two f32 tensors reads
 * bf16 casts of them instead, and so does every attention of an f32 qkv; their results stay f32
 * (summed in f32). Each value is cast once, just before its first such reader, so a value read by
 * several contractions (an activation in forward and in the weight gradient, a parameter) has
 * one bf16 copy. Run before autodiff, whose rules then multiply the gradients in bf16 too. The
 * nodes are renumbered to keep them in topological order; pointers to them stay valid. Errors:
 * MW_ERR_NOMEM. */
mw_status mw__autocast_bf16(mw_graph *g);

#endif
