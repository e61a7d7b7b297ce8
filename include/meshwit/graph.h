/* meshwit: graphs of named-axis tensors.
 *
 * A model is traced once into an mw_graph by calling ops on symbolic tensors; nothing is computed
 * while tracing. Every axis has a name; ops match axes by name, never by position. A sharded axis
 * carries the mesh axis it is split over and prints as "Batch@X": it is a different axis from
 * "Batch", so a sharded tensor never mixes implicitly with an unsharded one.
 *
 * Errors while tracing are sticky: the first failing op records its message in the graph (and in
 * mw_last_error()), returns NULL, and every later op given a NULL tensor also returns NULL. So a
 * model can be written as plain nested calls and checked once with mw_graph_status().
 *
 * Besides the errors its comment lists, every op fails (in a graph without an error yet) with
 * MW_ERR_INVALID for a NULL tensor, a tensor of another graph, or a NULL string where a name or
 * a list of names is required (mw_sum's and mw_mean's axes may be NULL), with MW_ERR_DTYPE for
 * an operand of a dtype the op does not take (see mw_cast), and with MW_ERR_NOMEM. Given a NULL
 * graph an op returns NULL and records nothing.
 *
 * Thread-safety: a graph is not thread-safe; build it on one thread. Once a trainer is made from
 * it, the graph is read-only and may be shared by any number of trainers. */
#ifndef MESHWIT_GRAPH_H
#define MESHWIT_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MW_MAX_RANK 8  /* most axes a tensor can have */
#define MW_MAX_NAME 48 /* longest axis, tensor or mesh-axis name, terminator included */

typedef enum mw_dtype {
    MW_F32 = 0,  /* 32-bit float: every op */
    MW_BF16 = 1, /* bfloat16: mw_cast, mw_dot, mw_contract, mw_attention and the reshapes */
    MW_I32 = 2,  /* integer ids (inputs only) */
    MW_U16 = 3   /* reserved for compact token storage; no op accepts it yet */
} mw_dtype;

/* An axis: a name and a (global) size. */
typedef struct mw_axis {
    const char *name;
    int64_t size;
} mw_axis;

/* An ordered list of axes; the order is the memory layout (row-major, last axis fastest). */
typedef struct mw_axes {
    int rank;
    mw_axis axis[MW_MAX_RANK];
} mw_axes;

/* MW_AXES({"Batch", 8192}, {"Feature", 64}) builds an mw_axes; MW_SCALAR has no axes. */
#define MW_AXES(...)                                                                               \
    ((mw_axes){(int)(sizeof((mw_axis[]){__VA_ARGS__}) / sizeof(mw_axis)), {__VA_ARGS__}})
#define MW_SCALAR ((mw_axes){0, {{0, 0}}})

typedef enum mw_init_kind {
    MW_INIT_KIND_ZEROS = 0,
    MW_INIT_KIND_CONST,  /* every element = value */
    MW_INIT_KIND_NORMAL, /* mean 0, standard deviation = value */
    MW_INIT_KIND_UNIFORM /* uniform in [-value, value] */
} mw_init_kind;

/* How a parameter starts. Random initialisers draw from the graph's seed and the parameter's
 * name, so every replica on every device starts identical and runs are repeatable. */
typedef struct mw_init {
    mw_init_kind kind;
    float value;
} mw_init;

#define MW_INIT_ZEROS ((mw_init){MW_INIT_KIND_ZEROS, 0.0f})
#define MW_INIT_CONST(v) ((mw_init){MW_INIT_KIND_CONST, (v)})
#define MW_INIT_NORMAL(std) ((mw_init){MW_INIT_KIND_NORMAL, (std)})
#define MW_INIT_UNIFORM(limit) ((mw_init){MW_INIT_KIND_UNIFORM, (limit)})

typedef struct mw_graph mw_graph;
typedef struct mw_tensor mw_tensor; /* a symbolic tensor; owned by its graph */

/* Makes an empty graph. *out is owned by the caller (mw_graph_free). Errors: MW_ERR_NOMEM,
 * MW_ERR_INVALID when out is NULL. */
mw_status mw_graph_new(mw_graph **out);

/* Frees a graph and every tensor in it. NULL is a no-op. Trainers made from the graph must be
 * freed first. */
void mw_graph_free(mw_graph *g);

/* MW_OK, or the status of the first op that failed while tracing (a later failure does not
 * replace it); MW_ERR_INVALID for NULL. */
mw_status mw_graph_status(const mw_graph *g);

/* The message of the first op that failed while tracing, or "". Owned by the graph. For NULL, a
 * static message saying so. */
const char *mw_graph_error(const mw_graph *g);

/* Seed of the random parameter initialisers (default 1337). NULL is a no-op. */
void mw_graph_set_seed(mw_graph *g, uint64_t seed);

/* --- recomputation regions ----------------------------------------------------------------- */

/* Marks the nodes traced from now until mw_region_end as one region (a transformer block, say),
 * named `name` in messages. A trainer whose configuration asks for recomputation
 * (mw_trainer_config.recompute) frees the activations made inside a region after their last
 * use in forward and computes them again in the backward pass, just before the region's
 * gradients need them; without such a policy, and in inference programs, regions change
 * nothing. What a region reads from outside (its inputs, parameters) and what is read outside
 * it (its outputs) is always kept. Regions do not nest: begin, trace, end, then the next one.
 * Errors (sticky, as a failing op's: recorded in the graph and returned): MW_ERR_INVALID for a
 * NULL graph, a NULL or empty name, a name of MW_MAX_NAME characters or more, and a region begun
 * while another is open (the message names both); the graph's earlier error when it has one. */
mw_status mw_region_begin(mw_graph *g, const char *name);

/* Ends the region mw_region_begin opened. Errors (sticky): MW_ERR_INVALID for a NULL graph or
 * when no region is open; the graph's earlier error when it has one. A region still open when a
 * trainer is made fails mw_trainer_new with MW_ERR_INVALID. */
mw_status mw_region_end(mw_graph *g);

/* --- leaves ------------------------------------------------------------------------------- */

/* A value fed at every step under `name` (unique among inputs, parameters and states). Axis
 * sizes are global: a sharded input is still fed whole, and each device reads its own rows.
 * Errors: MW_ERR_INVALID (a NULL or empty name, one of MW_MAX_NAME characters or more, a name
 * an input, parameter or state has already, an axis name that is empty or holds '@' or ','),
 * MW_ERR_DTYPE (a dtype other than MW_F32 and MW_I32: a bf16 value is an mw_cast of an f32
 * input), MW_ERR_SHAPE (a rank outside 0..MW_MAX_RANK, a size below 1, an axis named twice). */
mw_tensor *mw_input(mw_graph *g, const char *name, mw_dtype dtype, mw_axes axes);

/* A constant: f32 of the given axes (MW_SCALAR for a scalar) with every element `value`, as
 * torch.full; it has no gradient and is neither fed nor trained. mw_shard splits one of its axes
 * like an input's (to meet a sharded tensor of the same axes; a constant of fewer axes broadcasts
 * instead). Errors: as mw_input's axes. */
mw_tensor *mw_full(mw_graph *g, mw_axes axes, float value);

/* A trained parameter (f32), replicated on every device unless mw_shard splits one of its axes,
 * initialised by `init`. Errors: as mw_input's; MW_ERR_INVALID (an unknown initialiser kind). */
mw_tensor *mw_param(mw_graph *g, const char *name, mw_axes axes, mw_init init);

/* --- sharding ------------------------------------------------------------------------------ */

/* Splits axis `axis` of x over mesh axis `mesh_axis`: "Batch" becomes "Batch@X".
 *
 * On a graph input (or a tensor derived from inputs by nothing but other mw_shard calls on
 * different axes) the split happens when the host feeds the batch: each device reads its own
 * rows; the result is a new tensor.
 *
 * On a parameter, the parameter itself is relabelled and returned: each device then stores and
 * updates only its shard (rows [lo, lo + len) of that axis, shards differing by at most one row),
 * and the SPMD rules insert every collective the model needs. A contraction over the sharded axis
 * gives a partial sum that is all-reduced where it is used, so a first linear layer whose output
 * axis is sharded ("Hidden@Y") and a second one contracting it is Megatron-style tensor
 * parallelism, with one all-reduce forward and one backward and none written by hand. A sharded
 * parameter's gradient is reduced over exactly the mesh axes along which it is replicated (the
 * data axes); the gradient norm counts each element once; reading, writing, saving and loading a
 * parameter gather and scatter its shards, so files and host arrays always hold the whole
 * tensor. Shard a parameter right after mw_param, before its first use.
 *
 * FSDP: where an op meets a split parameter with that axis whole ("Embed" against "Embed@X"), or
 * with the same mesh axis splitting another axis ("Batch@X": the parameter is split over the axis
 * that also shards the batch), the parameter is gathered whole first (an all-gather of every
 * device's rows, once per parameter and axis however many ops use it) and its gradient
 * reduce-scattered back to the rows each device holds, so the model computes exactly what it
 * would with the parameter replicated while each device stores, updates and keeps optimizer state
 * for its rows only. The backward pass gathers it again where it reads it
 * (mw_trainer_config.keep_gathered keeps the forward's copy instead). Only parameters are
 * gathered: a computed value split over an axis the op needs whole is an error.
 *
 * On a constant (mw_full) the result is the same constant with the axis split: every shard holds
 * the value.
 *
 * One tensor splits at most one axis over each mesh axis, and an op whose result would split two
 * axes over the same mesh axis fails. The mesh axis is looked up when a trainer is made. Errors:
 * MW_ERR_AXIS (x has no such axis), MW_ERR_SHARDING (the axis is already sharded, x already
 * splits an axis over that mesh axis, x is computed rather than an input, a parameter or a
 * constant, or the parameter is already used), MW_ERR_INVALID (a mesh-axis name that is empty,
 * of MW_MAX_NAME characters or more or holds '@'; more than 16 mesh-axis names in one graph). */
mw_tensor *mw_shard(mw_graph *g, mw_tensor *x, const char *axis, const char *mesh_axis);

/* --- elementwise ---------------------------------------------------------------------------- */

/* a + b, a - b, a * b, a / b. Both must have the same axes (by name, in any order; the result
 * has a's order), or one's axes must be a subset of the other's, in which case it broadcasts
 * along the missing axes. Errors: MW_ERR_SHAPE (neither is a subset, or sizes differ),
 * MW_ERR_SHARDING (an axis is sharded in one and not in the other: the message says which tensor
 * to mw_shard). */
mw_tensor *mw_add(mw_graph *g, mw_tensor *a, mw_tensor *b);
mw_tensor *mw_sub(mw_graph *g, mw_tensor *a, mw_tensor *b);
mw_tensor *mw_mul(mw_graph *g, mw_tensor *a, mw_tensor *b);
mw_tensor *mw_div(mw_graph *g, mw_tensor *a, mw_tensor *b);

/* factor * x. */
mw_tensor *mw_scale(mw_graph *g, mw_tensor *x, float factor);

/* x in another element type: MW_BF16 rounds each value to the nearest bfloat16 (ties to even; 8
 * bits of mantissa, f32's range), MW_F32 widens exactly; x itself when it has that dtype already.
 * Explicit control over mixed precision: bf16 tensors are taken by mw_dot and mw_contract (both
 * operands bf16; the products are summed in f32 and the result is f32), by mw_attention (q, k and
 * v bf16; softmax statistics and the result in f32) and by the reshapes (mw_rename, mw_split,
 * mw_merge, mw_slice); every other op asks for f32 (MW_ERR_DTYPE). Gradients stay f32: the
 * gradient of a cast is the incoming one, unrounded. mw_trainer_config.precision applies the same
 * casts to every contraction without a change to the model. Errors: MW_ERR_DTYPE (not f32 or
 * bf16). */
mw_tensor *mw_cast(mw_graph *g, mw_tensor *x, mw_dtype dtype);

/* --- contractions ----------------------------------------------------------------------------- */

/* Contracts a and b over their common axis `axis` (a dot product along it). The result has the
 * other axes that both share (batch axes) once, in a's order, then a's remaining axes, then
 * b's. Contracting over a sharded axis gives each device a partial sum; the SPMD rules all-reduce
 * it where the value is used, so the result is replicated. Errors: MW_ERR_AXIS (the axis is
 * missing from a or b), MW_ERR_SHAPE (sizes differ, a result of more than MW_MAX_RANK axes),
 * MW_ERR_SHARDING, MW_ERR_DTYPE (one operand bf16 and the other not: see mw_cast). */
mw_tensor *mw_dot(mw_graph *g, mw_tensor *a, mw_tensor *b, const char *axis);

/* General contraction (einsum over names): the result has exactly the axes named in `out_axes`
 * ("Batch,Out", comma-separated, in that order; "" for a scalar); every axis of a or b not named
 * there must be in both and is summed. Errors: MW_ERR_AXIS (a result axis in neither operand or
 * named twice, a malformed list, an axis of one operand in neither the result nor the other),
 * MW_ERR_SHAPE (sizes differ), MW_ERR_SHARDING, MW_ERR_DTYPE (as mw_dot's). */
mw_tensor *mw_contract(mw_graph *g, mw_tensor *a, mw_tensor *b, const char *out_axes);

/* --- reductions ------------------------------------------------------------------------------- */

/* Sum or mean of x over the axes named in `axes` ("Batch" or "Batch,Feature"), or over all axes
 * when axes is NULL. Name a sharded axis by its base name ("Batch" reduces "Batch@X"). Reducing a
 * sharded axis sums locally and all-reduces across the mesh axis; mean divides by the global
 * size. Errors: MW_ERR_AXIS (an axis x lacks, one named twice, a malformed list). */
mw_tensor *mw_sum(mw_graph *g, mw_tensor *x, const char *axes);
mw_tensor *mw_mean(mw_graph *g, mw_tensor *x, const char *axes);

/* --- reshaping (no data moves unless said) -------------------------------------------------- */

/* x with axis `axis` called `new_name`. Errors: MW_ERR_AXIS (no such axis, or the new name is
 * taken), MW_ERR_SHARDING (renaming a sharded axis), MW_ERR_INVALID (a new name that is empty or
 * holds '@', ',' or '='). */
mw_tensor *mw_rename(mw_graph *g, mw_tensor *x, const char *axis, const char *new_name);

/* x with its axes in the order `order` names them ("Seq,Batch,Embed": every axis of x once, by
 * base name), as torch.permute does by position; a sharded axis keeps its sharding wherever it
 * moves. x itself when the order is x's. Its gradient is the inverse permutation. Errors:
 * MW_ERR_AXIS (an unknown axis, one named twice, one left out). */
mw_tensor *mw_permute(mw_graph *g, mw_tensor *x, const char *order);

/* Splits axis `axis` into consecutive axes "Head=12,HeadDim=64" (one size may be left out and is
 * inferred); the memory layout is unchanged. Errors: MW_ERR_SHAPE (sizes whose product is not
 * the axis size), MW_ERR_AXIS (no such axis; a new name x has already, or one named twice),
 * MW_ERR_SHARDING (splitting a sharded axis), MW_ERR_INVALID (no new axes, a malformed list or
 * size, more than one size left out, a bad new name as mw_rename's). */
mw_tensor *mw_split(mw_graph *g, mw_tensor *x, const char *axis, const char *new_axes);

/* Merges the adjacent axes "Head,HeadDim" (in that order in x) into one axis `new_name`.
 * Errors: MW_ERR_AXIS (an axis x lacks; a new name another axis of x has), MW_ERR_SHAPE (axes
 * not adjacent and in that order), MW_ERR_SHARDING (a sharded axis), MW_ERR_INVALID (no axes, a
 * malformed list, a bad new name as mw_rename's). */
mw_tensor *mw_merge(mw_graph *g, mw_tensor *x, const char *axes, const char *new_name);

/* Rows [start, start + len) of axis `axis` (a copy), named `new_name` (NULL keeps the name). A
 * parameter split along the axis is gathered whole first (FSDP, see mw_shard). Errors:
 * MW_ERR_SHAPE (len < 1, rows outside the axis), MW_ERR_AXIS (no such axis, a new name x has
 * already), MW_ERR_SHARDING (the axis of a computed tensor sharded), MW_ERR_INVALID (a bad new
 * name as mw_rename's). */
mw_tensor *mw_slice(mw_graph *g, mw_tensor *x, const char *axis, int64_t start, int64_t len,
                    const char *new_name);

/* Row `index` of axis `axis`, which is dropped (a copy). Errors: MW_ERR_SHAPE (index outside
 * the axis), MW_ERR_AXIS, MW_ERR_SHARDING (as mw_slice's). */
mw_tensor *mw_select(mw_graph *g, mw_tensor *x, const char *axis, int64_t index);

/* --- neural-network ops ------------------------------------------------------------------------
 */

/* GELU, elementwise. mw_gelu: the tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715
 * x^3))) (GPT-2's; torch.nn.GELU(approximate='tanh'), Hugging Face's "gelu_new"). mw_gelu_erf:
 * the exact form, x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (torch.nn.GELU()'s default, Hugging
 * Face's "gelu"), slower on the CPU (element by element). */
mw_tensor *mw_gelu(mw_graph *g, mw_tensor *x);
mw_tensor *mw_gelu_erf(mw_graph *g, mw_tensor *x);

/* SiLU (swish), elementwise: x sigmoid(x) = x / (1 + e^-x) (torch.nn.SiLU, Hugging Face's
 * "silu"). Its output is f32, or bf16 where the precision policy reads it as bf16 only. Errors:
 * MW_ERR_DTYPE (x not f32). */
mw_tensor *mw_silu(mw_graph *g, mw_tensor *x);

/* SwiGLU, the gated unit of Llama's MLP: silu(gate) * up, where x holds gate and up side by side
 * along `part_axis` of size 2 (gate at index 0, up at 1: one contraction makes both, as a fused
 * gate/up projection does); the result has x's axes without `part_axis`, in order. One kernel
 * forward and one backward (which writes the gradient of both halves). Written in bf16 where the
 * precision policy reads it so. The part axis must not be sharded (the others may: tensor
 * parallelism splits the hidden units). Errors: MW_ERR_DTYPE (x not f32), MW_ERR_AXIS (no axis
 * `part_axis`), MW_ERR_SHAPE (its size is not 2), MW_ERR_SHARDING (the part axis sharded). */
mw_tensor *mw_swiglu(mw_graph *g, mw_tensor *x, const char *part_axis);

/* Rotary position embeddings. Rotate-half (MW_ROPE_HALF) pairs feature j with j + dims/2, as
 * Llama, Mistral and Qwen2 in transformers do; interleaved (MW_ROPE_INTERLEAVED) pairs 2j with
 * 2j + 1, as Meta's Llama code and GPT-J do. */
typedef enum mw_rope_style { MW_ROPE_HALF = 0, MW_ROPE_INTERLEAVED = 1 } mw_rope_style;

/* The frequency scalings of rope_scaling in a Hugging Face config: none (the default), or
 * Llama 3.x's ("rope_type": "llama3", with factor, low_freq_factor, high_freq_factor and
 * original_max_position_embeddings). */
typedef enum mw_rope_scaling {
    MW_ROPE_SCALING_NONE = 0,
    MW_ROPE_SCALING_LLAMA3 = 1
} mw_rope_scaling;

typedef struct mw_rope_config {
    float theta;         /* base of the frequencies (rope_theta): 10000, 500000, 1e6, ... */
    mw_rope_style style; /* which features pair up */
    int dims;            /* features rotated (the first dims of the axis, even); 0: all */
    int64_t offset;      /* position of the first row (a prompt's continuation) */
    mw_rope_scaling scaling;
    float factor, low_freq_factor, high_freq_factor; /* llama3 scaling only */
    int64_t original_max_positions;                  /* llama3 scaling only */
    /* NULL, or an axis of x (not the sequence or feature axis): only its first `parts` rows are
     * rotated, the others copied (a fused q/k/v tensor's queries and key rotated, its value
     * not, in one pass). */
    const char *part_axis;
    int64_t parts;
} mw_rope_config;

/* Rotary embeddings over x's last axis `feature_axis` (a head's features): features j and its
 * pair (see mw_rope_style) at position p are rotated by the angle p * f_j, f_j = theta^(-2j /
 * dims) (adjusted as cfg->scaling says), for j < dims / 2; features past dims pass unchanged.
 * Computed as transformers does, in f32: f_j = 1 / theta^(2j / dims), the angle p * f_j, its cos
 * and sin. The position of a row is cfg->offset, plus its index along `seq_axis` (NULL: none,
 * e.g. one decoding step), plus pos[r] when pos is given: pos is i32 with exactly x's leading
 * axes before seq_axis (before the feature axis if seq_axis is NULL), each row's start (cached
 * decoding, where every sequence of a batch has got to a position of its own). The output is f32,
 * or bf16 where the precision policy reads it as bf16 only (the queries and keys of a bf16
 * attention). cfg NULL: theta 10000, rotate-half, every feature, offset 0. The feature and
 * sequence axes must not be sharded (nor cfg->part_axis); the others may (heads under tensor
 * parallelism). Errors:
 * MW_ERR_DTYPE (x not f32, pos not i32), MW_ERR_AXIS, MW_ERR_SHAPE (feature axis not last, dims
 * odd or beyond the axis or above 8192, pos of other axes), MW_ERR_INVALID (theta not finite and
 * > 1, an unknown style or scaling, llama3 factors not finite and positive, high_freq_factor not
 * above low_freq_factor, negative offset, parts outside [1, the part axis's size]), MW_ERR_AXIS
 * (no part axis of that name, or it is the sequence or feature axis), MW_ERR_SHARDING. */
mw_tensor *mw_rope(mw_graph *g, mw_tensor *x, const char *seq_axis, const char *feature_axis,
                   mw_tensor *pos, const mw_rope_config *cfg);

/* Layer norm over axis `axis` (which must be x's last axis), then * w + b, where w and b have
 * exactly that one axis; b NULL: no bias (torch's LayerNorm(bias=False), as OLMo and others use),
 * with no bias operand and no bias gradient. Errors: MW_ERR_AXIS, MW_ERR_SHAPE, MW_ERR_SHARDING
 * (a sharded axis), MW_ERR_DTYPE (x, w or b not f32), MW_ERR_INVALID (eps negative or not
 * finite). */
mw_tensor *mw_layernorm(mw_graph *g, mw_tensor *x, mw_tensor *w, mw_tensor *b, const char *axis,
                        float eps);

/* RMS norm over axis `axis` (which must be x's last axis): x / sqrt(mean(x^2 over axis) + eps)
 * * w, where w has exactly that one axis (Llama's normalisation: no mean is subtracted and there
 * is no bias). Each row's mean square is summed in f32 or wider; the output is f32 (or bf16
 * where the precision policy reads it as bf16 only). A parameter w split over a mesh axis is
 * gathered whole first (FSDP, see mw_shard). Errors: MW_ERR_DTYPE (x or w not f32), MW_ERR_AXIS (no
 * axis `axis` in x), MW_ERR_SHAPE (axis not x's last, w not of exactly that axis), MW_ERR_SHARDING
 * (axis sharded in x, or w of a computed tensor split), MW_ERR_INVALID (eps negative or not
 * finite). */
mw_tensor *mw_rmsnorm(mw_graph *g, mw_tensor *x, mw_tensor *w, const char *axis, float eps);

/* softmax(scale * x) over axis `axis`, which must be x's last axis. Errors: MW_ERR_AXIS,
 * MW_ERR_SHAPE (not the last axis), MW_ERR_SHARDING (a sharded axis). */
mw_tensor *mw_softmax(mw_graph *g, mw_tensor *x, const char *axis, float scale);

/* Fused multi-head self-attention, softmax(scale * q k^T) v per position, on a tensor that holds
 * queries, keys and values side by side: qkv has an axis `part_axis` of size 3 (q, k, v in that
 * order), a sequence axis `seq_axis` and a feature axis `feature_axis` (the head dimension, which
 * must be qkv's last axis); every other axis (Batch, Head, ...) is a batch of independent
 * attentions. The result has qkv's axes without `part_axis`, in the same order. causal non-zero:
 * position i attends to positions j <= i only. The same numbers as contract, (causal) softmax and
 * contract written out, but the kernel never holds a whole Seq x Seq score tensor (rows of scores
 * are made per block of queries, the masked half is never computed) and the backward pass
 * recomputes the scores instead of keeping them. The sequence and feature axes must not be
 * sharded; the batch axes may be. Errors: MW_ERR_AXIS (an axis missing, or two of the three the
 * same axis), MW_ERR_SHAPE (part axis not of size 3, feature axis not last), MW_ERR_DTYPE (qkv
 * neither f32 nor bf16), MW_ERR_SHARDING. */
mw_tensor *mw_attention(mw_graph *g, mw_tensor *qkv, const char *part_axis, const char *seq_axis,
                        const char *feature_axis, int causal, float scale);

/* Causal softmax(scale * x) over `key_axis`, where x's last two axes are `query_axis` then
 * `key_axis`: query i attends to keys j <= i (+ the difference of the two sizes). Errors:
 * MW_ERR_AXIS, MW_ERR_SHAPE (key_axis not last, query_axis not right before it),
 * MW_ERR_SHARDING (either axis sharded). */
mw_tensor *mw_causal_softmax(mw_graph *g, mw_tensor *x, const char *query_axis,
                             const char *key_axis, float scale);

/* Rows of `table` ([vocab_axis, Dim]: the vocabulary axis first) picked by the i32 tensor `ids`:
 * the result has ids' axes then Dim. An id outside the vocabulary fails the step with
 * MW_ERR_INVALID naming it. A parameter table split over a mesh axis is gathered whole first
 * (FSDP, see mw_shard). Errors: MW_ERR_DTYPE (table not f32, ids not i32), MW_ERR_AXIS (no axis
 * vocab_axis), MW_ERR_SHAPE (table not [vocab_axis, Dim], ids having Dim), MW_ERR_SHARDING (a
 * computed table with a split axis). */
mw_tensor *mw_embedding(mw_graph *g, mw_tensor *table, mw_tensor *ids, const char *vocab_axis);

/* Softmax cross-entropy of `logits` (last axis `vocab_axis`) against i32 `targets` (logits' other
 * axes, same order): one loss per row, over the first `valid` classes (0: all; the rest are
 * padding). A target outside [0, valid) fails the step with MW_ERR_INVALID. Errors:
 * MW_ERR_DTYPE (logits not f32, targets not i32), MW_ERR_AXIS (no axis vocab_axis),
 * MW_ERR_SHAPE (vocab_axis not last, valid outside [0, its size], targets without exactly the
 * other axes of logits in their order), MW_ERR_SHARDING (vocab_axis sharded, logits and targets
 * sharded differently). */
mw_tensor *mw_cross_entropy(mw_graph *g, mw_tensor *logits, mw_tensor *targets,
                            const char *vocab_axis, int64_t valid);

/* --- more elementwise ops, comparisons, maxima, concatenation, dropout ------------------------ */

/* Elementwise activations and functions, with PyTorch's gradients (relu'(0) = 0, abs'(0) = 0;
 * log and sqrt of negative values give NaN, their gradient at 0 is Inf, as in IEEE). */
mw_tensor *mw_relu(mw_graph *g, mw_tensor *x);
mw_tensor *mw_tanh(mw_graph *g, mw_tensor *x);
mw_tensor *mw_sigmoid(mw_graph *g, mw_tensor *x);
mw_tensor *mw_exp(mw_graph *g, mw_tensor *x);
mw_tensor *mw_log(mw_graph *g, mw_tensor *x);
mw_tensor *mw_sqrt(mw_graph *g, mw_tensor *x);
mw_tensor *mw_abs(mw_graph *g, mw_tensor *x);

typedef enum mw_comparison { MW_GT, MW_GE, MW_LT, MW_LE, MW_EQ, MW_NE } mw_comparison;

/* 1.0 where `a cmp b` holds, else 0.0 (f32, with a and b broadcast and sharded as in mw_sub; it
 * compares a - b with 0, which is exact for finite values). A mask carries no gradient. Errors:
 * as mw_sub's; MW_ERR_INVALID (a comparison that is not an mw_comparison). */
mw_tensor *mw_compare(mw_graph *g, mw_tensor *a, mw_tensor *b, mw_comparison cmp);

/* x where mask is 1, y where it is 0: y + mask * (x - y), with gradients mask * g to x and
 * (1 - mask) * g to y. Both x and y must be finite (an Inf in the branch not taken gives NaN).
 * Errors: as mw_sub's (x - y, then mask times it). */
mw_tensor *mw_where(mw_graph *g, mw_tensor *mask, mw_tensor *x, mw_tensor *y);

/* Elementwise maximum and minimum (broadcast as in mw_sub); where a and b tie each gets half the
 * gradient, as in PyTorch. Errors: as mw_sub's. */
mw_tensor *mw_maximum(mw_graph *g, mw_tensor *a, mw_tensor *b);
mw_tensor *mw_minimum(mw_graph *g, mw_tensor *a, mw_tensor *b);

/* The largest element along axis `axis` (dropped from the result), its gradient split evenly
 * among tied maxima (as torch.amax); and the index of the first largest element (f32, no
 * gradient; NaN counts as smallest). The axis must not be sharded. Errors: MW_ERR_AXIS,
 * MW_ERR_SHARDING. */
mw_tensor *mw_max(mw_graph *g, mw_tensor *x, const char *axis);
mw_tensor *mw_argmax(mw_graph *g, mw_tensor *x, const char *axis);

/* The n tensors joined along axis `axis` (in order), which they all have unsharded; their other
 * axes must agree (in any order; the result has xs[0]'s). Errors: MW_ERR_AXIS, MW_ERR_SHAPE,
 * MW_ERR_SHARDING, MW_ERR_INVALID (n < 1, xs NULL). */
mw_tensor *mw_concat(mw_graph *g, mw_tensor *const *xs, int n, const char *axis);

/* Dropout: during a training step (mw_trainer_step, compute_grads, accumulate) each element is
 * zeroed with probability p and the others scaled by 1 / (1 - p); in mw_trainer_eval and
 * inference programs it is the identity. Whether an element is kept depends only on (seed, the
 * call's place among the graph's mw_dropout calls, the trainer's step and micro-batch, the
 * element's index in the whole tensor), so a sharded run draws exactly the single-device mask,
 * and two calls given the same seed still draw independent masks (the n-th call mixes n into
 * its seed; the first uses the seed as given). The backward pass recomputes the mask (a hash in
 * 32-bit vector lanes, about as fast as a copy) instead of keeping it. Errors: MW_ERR_INVALID
 * (p outside [0, 1)). */
mw_tensor *mw_dropout(mw_graph *g, mw_tensor *x, float p, uint64_t seed);

/* --- states: what an inference program keeps between runs (key/value caches) ----------------- */

/* A state of an inference program (mw_infer_new): f32 of the given axes, zero when the program is
 * made, kept from one mw_infer_run to the next on the devices; shard it with mw_shard like an
 * input (before its first use). A trainer refuses a graph with states (they have no gradient).
 * Errors: as mw_input's. */
mw_tensor *mw_state(mw_graph *g, const char *name, mw_axes axes);

/* The state (or the result of its last mw_state_write) with value written in place at position
 * index[r] of axis `axis` for every row r of the axes before it: index is i32 with exactly the
 * state's axes before `axis`; value has the state's axes without `axis`, in order. Readers of the
 * result see the write; a state's writes form a chain (each must take the latest version). A
 * position outside the axis fails the run with MW_ERR_INVALID naming it. Errors:
 * MW_ERR_INVALID (not a state, or not its latest version), MW_ERR_AXIS, MW_ERR_SHAPE (index or
 * value of other axes), MW_ERR_DTYPE (index not i32), MW_ERR_SHARDING (the written axis
 * sharded). */
mw_tensor *mw_state_write(mw_graph *g, mw_tensor *state, mw_tensor *value, const char *axis,
                          mw_tensor *index);

/* Grouped-query attention (Llama 2/3, Mistral, Qwen2: fewer key/value heads than query heads),
 * as mw_attention but with each key/value head's G queries beside its key and value: qkv's axis
 * `part_axis` has size G + 2, holding the G queries of the group, then the key, then the value
 * (G = 1 is multi-head attention; G = heads is multi-query attention). One contraction makes it
 * (weights [KvHead, Part = G + 2, HeadDim, Embed]); the key/value head axis is one of the batch
 * axes. The result has qkv's axes with `part_axis` replaced by `group_axis` (a new name) of size
 * G, in its place: query head h of transformers' numbering is (kv head h / G, group h % G). Keys
 * and values are read once per group and never expanded in memory; their gradients sum over the
 * group's queries in a fixed order. Tensor parallelism splits the key/value head axis, so every
 * device holds whole groups; the part axis cannot be split. Errors: as mw_attention's, and
 * MW_ERR_SHAPE (part axis of size below 3), MW_ERR_INVALID (group_axis NULL or a bad name),
 * MW_ERR_AXIS (group_axis already an axis of qkv). */
mw_tensor *mw_attention_grouped(mw_graph *g, mw_tensor *qkv, const char *part_axis,
                                const char *group_axis, const char *seq_axis,
                                const char *feature_axis, int causal, float scale);

/* One query per row attending to cached keys and values: kv holds [batch axes..., seq_axis,
 * part_axis = 2 (keys, then values), head axes..., feature_axis]; q has kv's axes without
 * seq_axis and part_axis (grouped-query attention: and one axis more, the G queries of each
 * key/value head, right before feature_axis, as mw_attention_grouped's output has them); pos
 * (i32, the batch axes) says how far each row has got: row r attends
 * to positions 0..pos[r] of seq_axis, softmax(scale q . k) v, in f32 with a running maximum (the
 * decoding step of mw_attention with causal = 1, without a score tensor). The seq, part and
 * feature axes must not be sharded; batch and head axes may be. No gradient. Errors:
 * MW_ERR_AXIS, MW_ERR_SHAPE (kv not laid out so, pos or q of other axes), MW_ERR_DTYPE (pos not
 * i32), MW_ERR_SHARDING; a position outside seq_axis fails the run with MW_ERR_INVALID naming
 * it. */
mw_tensor *mw_attention_cached(mw_graph *g, mw_tensor *q, mw_tensor *kv, const char *part_axis,
                               const char *seq_axis, const char *feature_axis, mw_tensor *pos,
                               float scale);

/* --- inspection ------------------------------------------------------------------------------- */

/* The number of axes (-1 for NULL) and the dtype (MW_F32 for NULL). */
int mw_tensor_rank(const mw_tensor *t);
mw_dtype mw_tensor_dtype(const mw_tensor *t);
/* Axis i: its base name, global size and the mesh axis it is sharded over (NULL if none); each
 * out-parameter may be NULL. Strings are owned by the graph. Errors: MW_ERR_INVALID (t NULL, i
 * out of range). */
mw_status mw_tensor_axis(const mw_tensor *t, int i, const char **name, int64_t *size,
                         const char **mesh_axis);
/* Global number of elements (0 for NULL). */
int64_t mw_tensor_numel(const mw_tensor *t);
/* Writes "f32[Batch@X=8192, Feature=64]" ("(null)" for NULL) into buf, always terminated when
 * size > 0 (size 0 writes nothing); returns buf. */
char *mw_tensor_describe(const mw_tensor *t, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif
