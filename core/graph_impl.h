/* Internal: the traced graph. Nodes are created in topological order (an op can only take tensors
 * that already exist), so the node array is also the execution order. */
#ifndef MW__GRAPH_IMPL_H
#define MW__GRAPH_IMPL_H

#include <stdint.h>

#include "meshwit/graph.h"

#define MW__MAX_MESH_NAMES 16 /* distinct mesh-axis names one graph may shard over */

/* What an op is, beside its rules (the traits of its row of MW__OPS); the passes read these
 * instead of lists of ops of their own:
 *   MW__T_PARTIAL  it carries a partial sum (a linear op: its result is partial where its input
 *                  is); every other op reads its inputs replicated (mw__node_new all-reduces a
 *                  partial input)
 *   MW__T_SAME     it hands its input's values on unchanged (renamed, reordered, broadcast,
 *                  labelled, converted, gathered): what reaches a parameter through it is still
 *                  that parameter (the weight-decay rule's biases)
 *   MW__T_DOT      a contraction: MW_RECOMPUTE_DOTS keeps its output
 *   MW__T_NORM_DX  the input gradient of a normalisation: its kernel can add a residual gradient
 *                  and write the weight gradient (a later MW__T_NORM_DW node of the same gy, x and
 *                  parameters) in its one pass
 *   MW__T_NORM_DB  with MW__T_NORM_DX: its kernel writes the bias gradient too (the column sums
 *                  of gy), and fuses the weight gradient only with it (layer norm's; RMS norm has
 *                  no bias)
 *   MW__T_NORM_DW  the weight gradient such a kernel writes
 *   MW__T_COLSUM   its kernel can sum its output's columns as it writes them (a bias gradient)
 *   MW__T_MIX_*    along which axis of its inputs it mixes positions (an inference program's
 *                  chunk axis must not be one): its input's last (LAST), the axis of its
 *                  parameters (ALONG, SLICE: p.along.axis, p.slice.axis), attention's part,
 *                  sequence and feature axes (ATTENTION), cached attention's kv axes (CACHED), an
 *                  axis a reshape splits or merges (RESHAPE). Reductions and contractions need
 *                  none: a value without the axis computed from it is caught as such. */
enum {
    MW__T_PARTIAL = 1 << 0,
    MW__T_SAME = 1 << 1,
    MW__T_DOT = 1 << 2,
    MW__T_NORM_DX = 1 << 3,
    MW__T_NORM_DW = 1 << 4,
    MW__T_COLSUM = 1 << 5,
    MW__T_NORM_DB = 1 << 6,
    MW__T_MIX_LAST = 1 << 8,
    MW__T_MIX_ALONG = 2 << 8,
    MW__T_MIX_SLICE = 3 << 8,
    MW__T_MIX_ATTENTION = 4 << 8,
    MW__T_MIX_CACHED = 5 << 8,
    MW__T_MIX_RESHAPE = 6 << 8,
    MW__T_MIX = 15 << 8 /* the field */
};

/* The graph ops: XX(KIND, name, params, traits, bf16), one row per op, in node-kind order
 * (MW__OP_<KIND>).
 *   name    the op's name in messages (mw__op_name)
 *   params  the member of mw__op_params holding the node's parameters, or none (which
 *           mw__op_params_describe prints)
 *   traits  MW__T_* above, or 0
 *   bf16    the instruction (mw__ins_kind, devices/device.h: MW__I_<bf16>) of its kernel when
 *           that kernel can write its result in bf16, so that a value only read as bf16 is
 *           written so; NONE otherwise
 * A new op: its row here (and its parameters' member of mw__op_params, described in graph.c),
 * its constructor (graph.h, core/), its gradient (autodiff.c), its lowering (plan_lower.c's
 * dispatch, plan_lower_kernels.c) to kernels of MW__KERNELS with a kernel per backend, and a
 * row of the conformance table: README's "Adding an op" lists the places and what catches each. */
#define MW__OPS(XX)                                                                                \
    XX(INPUT, "input", none, 0, NONE)           /* fed by the host every step */                   \
    XX(PARAM, "param", none, 0, NONE)           /* trained; replicated unless split by mw_shard */ \
    XX(SHARD, "shard", shard, MW__T_SAME, NONE) /* one axis relabelled Batch -> Batch@X */         \
    XX(FILL, "fill", fill, 0, NONE)             /* every element = value */                        \
    XX(ADD, "add", none, MW__T_PARTIAL, NONE)   /* elementwise with subset broadcasting */         \
    XX(SUB, "sub", none, MW__T_PARTIAL, NONE)                                                      \
    XX(MUL, "mul", none, 0, NONE)                                                                  \
    XX(DIV, "div", none, 0, NONE)                                                                  \
    XX(SCALE, "scale", scale, MW__T_PARTIAL, NONE) /* factor * x; factor 1 is a plain copy */      \
    XX(PERMUTE, "permute", none, MW__T_PARTIAL | MW__T_SAME, NONE)     /* x in another order */    \
    XX(BROADCAST, "broadcast", none, MW__T_PARTIAL | MW__T_SAME, NONE) /* along new axes */        \
    XX(SUM, "sum", none, MW__T_PARTIAL, NONE)       /* x summed over the axes the output lacks */  \
    XX(CONTRACT, "contract", none, MW__T_DOT, GEMM) /* einsum over names */                        \
    XX(ALLREDUCE, "all-reduce", none, MW__T_PARTIAL, NONE) /* partial -> the sum over mesh */      \
    /* the same data under other axes: split, merge, rename */                                     \
    XX(ALIAS, "alias", none, MW__T_PARTIAL | MW__T_SAME | MW__T_MIX_RESHAPE, NONE)                 \
    XX(SLICE, "slice", slice, MW__T_PARTIAL | MW__T_MIX_SLICE, NONE) /* rows of an axis of x */    \
    /* SLICE's adjoint: x placed at start, zeros around */                                         \
    XX(PAD, "pad", slice, MW__T_PARTIAL | MW__T_MIX_SLICE, NONE)                                   \
    XX(GELU, "gelu", gelu, 0, UNARY)                                                               \
    XX(GELU_GRAD, "gelu_grad", gelu, MW__T_COLSUM, UNARY_GRAD)       /* (gy, x) */                 \
    XX(LAYERNORM, "layernorm", layernorm, MW__T_MIX_LAST, LAYERNORM) /* (x, w, b), last axis */    \
    XX(LN_DX, "layernorm_dx", layernorm, MW__T_NORM_DX | MW__T_NORM_DB, NONE) /* (gy, x, w) */     \
    XX(LN_DW, "layernorm_dw", layernorm, MW__T_NORM_DW, NONE)                 /* (gy, x) */        \
    XX(RMSNORM, "rmsnorm", rmsnorm, MW__T_MIX_LAST, RMSNORM)   /* (x, w), last axis */             \
    XX(RMSNORM_DX, "rmsnorm_dx", rmsnorm, MW__T_NORM_DX, NONE) /* (gy, x, w) */                    \
    XX(RMSNORM_DW, "rmsnorm_dw", rmsnorm, MW__T_NORM_DW, NONE) /* (gy, x) */                       \
    XX(SILU, "silu", none, 0, UNARY)                                                               \
    XX(SILU_GRAD, "silu_grad", none, MW__T_COLSUM, UNARY_GRAD) /* (gy, x) */                       \
    /* silu(x[0]) * x[1] along p.along.axis (of size 2), which the output lacks */                 \
    XX(SWIGLU, "swiglu", along, 0, SWIGLU)                                                         \
    XX(SWIGLU_GRAD, "swiglu_grad", along, 0, SWIGLU_GRAD) /* (gy, x): both halves' gradients */    \
    /* rotary embeddings over the last axis (x[, pos]); ROPE_GRAD rotates gy back */               \
    XX(ROPE, "rope", rope, MW__T_MIX_LAST, ROPE)                                                   \
    XX(ROPE_GRAD, "rope_grad", rope, 0, NONE) /* (gy[, pos]) */                                    \
    /* over the last axis (causal: over the last two) */                                           \
    XX(SOFTMAX, "softmax", softmax, MW__T_MIX_LAST, NONE)                                          \
    XX(SOFTMAX_GRAD, "softmax_grad", softmax, 0, NONE) /* (gy, y) */                               \
    XX(EMBED, "embedding", none, 0, NONE)              /* (table, ids) */                          \
    XX(EMBED_GRAD, "embedding_grad", none, 0, NONE)    /* (gy, ids) */                             \
    XX(XENT, "cross_entropy", xent, 0, NONE)           /* (logits, targets), last axis */          \
    XX(XENT_GRAD, "cross_entropy_grad", xent, 0, NONE) /* (gy, logits, targets) */                 \
    XX(ATTENTION, "attention", attention, MW__T_DOT | MW__T_MIX_ATTENTION, ATTENTION) /* qkv */    \
    XX(ATTENTION_GRAD, "attention_grad", attention, 0, NONE) /* (gy, qkv, the ATTENTION node) */   \
    XX(MAP, "map", map, 0, NONE)             /* an elementwise function of x (relu, exp, ...) */   \
    XX(MAP_GRAD, "map_grad", map, 0, NONE)   /* (x, gy): gy * f'(x) */                             \
    XX(DROPOUT, "dropout", dropout, 0, NONE) /* x * keep / (1 - p); its own adjoint */             \
    XX(ARGMAX, "argmax", along, 0, NONE)     /* index of the largest element along an axis */      \
    XX(REDUCE_MAX, "reduce_max", along, 0, NONE) /* the largest element along an axis */           \
    XX(CAST, "cast", none, MW__T_SAME, NONE) /* x as another dtype (f32 <-> bf16), nearest even */ \
    XX(STATE, "state", none, 0, NONE)        /* an inference program's state: kept between runs */ \
    /* (state, value, index): value written in place */                                            \
    XX(STATE_WRITE, "state_write", along, MW__T_MIX_ALONG, NONE)                                   \
    /* (q, kv, pos): q against keys 0..pos */                                                      \
    XX(ATTENTION_CACHED, "attention_cached", cached, MW__T_MIX_CACHED, NONE)                       \
    /* a split parameter whole on every device (FSDP) */                                           \
    XX(GATHER, "all-gather", along, MW__T_SAME, NONE)                                              \
    /* GATHER's adjoint: each device's rows, summed */                                             \
    XX(SCATTER, "reduce-scatter", along, MW__T_PARTIAL, NONE)

typedef enum mw__op {
#define MW__OP_KIND_(KIND, name, params, traits, bf16) MW__OP_##KIND,
    MW__OPS(MW__OP_KIND_)
#undef MW__OP_KIND_
        MW__OP_COUNT
} mw__op;

/* The traits of op (MW__T_*), 0 for a value out of range. */
unsigned mw__op_traits(int op);

/* The instruction kind (mw__ins_kind) whose kernel computes op and can write bf16, or -1. */
int mw__op_bf16_kernel(int op);

/* A node's parameters: the member its op's row names. */
typedef union mw__op_params {
    struct {
        int axis; /* the axis (index into the type) that was sharded */
    } shard;
    struct {
        float value;
    } fill;
    struct {
        float factor;
    } scale;
    struct {
        int axis;           /* of the larger tensor (x for SLICE, the output for PAD) */
        int64_t start, len; /* len 0: the axis is dropped (a select of row start) */
    } slice;
    struct {
        int exact; /* the erf form (mw_gelu_erf) */
    } gelu;
    struct {
        float eps;
    } layernorm;
    struct {
        float eps;
    } rmsnorm;
    struct {
        int seq;     /* x's axis of positions, -1: none */
        int style;   /* mw_rope_style */
        int dims;    /* features rotated */
        int scaling; /* mw_rope_scaling */
        int part;    /* the axis whose first `parts` rows are rotated, -1: none (every row) */
        int parts;
        int64_t offset, original;
        float theta, factor, low, high;
    } rope;
    struct {
        float scale;
        int causal;
    } softmax;
    struct {
        int64_t valid; /* columns of the logits that are classes */
    } xent;
    struct {
        int part, seq, feature; /* axes of qkv */
        float scale;
        int causal;
        int group; /* queries per key/value head: the part axis holds them, then k, then v */
        int keep;  /* the output keeps the part axis (as the group axis, of size group) */
    } attention;
    struct {
        int fn; /* an mw__mapfn */
    } map;
    struct {
        float p;
        uint64_t stream; /* the seed's stream for this call (mw_dropout) */
    } dropout;
    struct {
        int axis; /* ARGMAX, REDUCE_MAX: of x; STATE_WRITE: of the state; GATHER: of x, SCATTER:
                     of the output (the split axis) */
    } along;
    struct {
        int seq, part; /* axes of kv */
        float scale;
    } cached;
} mw__op_params;

/* An axis of a traced tensor. Names and mesh axes are interned per graph. Two axes are the same
 * axis only if name and mesh agree: Batch and Batch@X differ. */
typedef struct mw__axis {
    int name;     /* index into the graph's name table */
    int mesh;     /* index into the graph's mesh-name table, or -1 when not sharded */
    int64_t size; /* global size */
} mw__axis;

typedef struct mw__type {
    mw_dtype dtype;
    int rank;
    mw__axis ax[MW_MAX_RANK];
    /* Bit m set: on each device the value is only this device's share of a sum over mesh-name m;
     * the true value is the sum over the devices along m (a pending all-reduce). */
    uint32_t partial;
} mw__type;

struct mw_tensor {
    mw_graph *g;
    int id;
    mw__op op;
    mw__type type;
    int nin;
    mw_tensor *in[3];
    mw__op_params p;        /* the op's parameters (its row of MW__OPS names the member) */
    int leaf;               /* INPUT / PARAM / STATE: index among the graph's inputs / params /
                               states */
    int region;             /* 1 + index of the recomputation region it was traced in, or 0 */
    mw_init init;           /* PARAM */
    char name[MW_MAX_NAME]; /* INPUT / PARAM / STATE */
};

struct mw_graph {
    mw_tensor **nodes;
    int nnodes, cap;
    char (*names)[MW_MAX_NAME]; /* interned axis names */
    int nnames, names_cap;
    char mesh_names[MW__MAX_MESH_NAMES][MW_MAX_NAME];
    int nmesh_names;
    int ninputs, nparams, nstates;
    uint64_t seed;
    int region_open;               /* 1 + index of the open region (mw_region_begin), or 0 */
    int nregions;                  /* regions begun so far */
    char region_name[MW_MAX_NAME]; /* the open region's, or the last one's */
    mw_status status;
    char error[512];
};

/* "f32", "bf16", "i32", "u16"; "?" for a value out of range. */
const char *mw__dtype_name(mw_dtype d);

/* The op's name ("contract", "gelu_grad", "attention", ...), "?" for a value out of range. */
const char *mw__op_name(int op);

/* n's parameters as text ("eps 1e-05", "axis 1, rows 0+4"; "" for an op without any), the same
 * on every process for the same graph (cross-process consistency checks compare it). */
char *mw__op_params_describe(const mw_tensor *n, char *buf, size_t size);

/* Interns an axis name; -1 when it is too long or memory ran out (sets the graph error). */
int mw__graph_intern(mw_graph *g, const char *name);
/* Looks a name up without interning; -1 when absent. */
int mw__graph_find_name(const mw_graph *g, const char *name);

/* "Batch" or "Batch@X" */
const char *mw__axis_label(const mw_graph *g, const mw__axis *a, char *buf, size_t size);
/* "f32[Batch@X=8192, Feature=64]" */
char *mw__type_describe(const mw_graph *g, const mw__type *t, char *buf, size_t size);
/* Index of the axis equal to a (name and mesh) in t, or -1. */
int mw__type_find(const mw__type *t, const mw__axis *a);
/* Index of the axis whose base name is `name` in t (sharded or not), or -1. */
int mw__type_find_name(const mw__type *t, int name);

/* Whether node t's value at one position of the axis named `name` (interned) depends on its
 * inputs at other positions along it, by its op's MW__T_MIX_* trait: xat is the axis's place in
 * t's first input (-1: absent), at its place in t; from_rows, whether an input holding the axis
 * depends on it (a reshape mixes only then). An inference program refuses to chunk along an
 * axis an output mixes (parallel/infer.c); the conformance table checks each op's answer
 * against its float64 reference. mw__node_mixes_what: what such a node does, for messages. */
int mw__node_mixes(const mw_tensor *t, int name, int from_rows, int xat, int at);
const char *mw__node_mixes_what(const mw_tensor *t);

/* Which nodes of g depend on the positions of the axis named `name` and which mix them, every
 * node in order: dep[i] (g->nnodes flags) is set on entry for the sources (the nodes whose values
 * differ by position along the axis: an inference program's inputs holding it) and propagated;
 * mix[i] is set, why[i] saying how (mw__node_mixes_what), where node i's value at one position
 * depends on other positions, or where it lacks the axis and depends on it. mix and why start
 * zero. */
void mw__graph_mixing(const mw_graph *g, int name, char *dep, char *mix, const char **why);
int64_t mw__type_numel(const mw__type *t);

/* Appends a node (takes ownership of nothing; copies *proto). NULL on OOM (graph error set). */
mw_tensor *mw__node_new(mw_graph *g, const mw_tensor *proto);

/* Internal constructors used by autodiff and the SPMD rules; same checks as the public ops. */
mw_tensor *mw__permute(mw_graph *g, mw_tensor *x, const mw__type *target);
mw_tensor *mw__broadcast(mw_graph *g, mw_tensor *x, const mw__type *target);
mw_tensor *mw__sum_to(mw_graph *g, mw_tensor *x, const mw__type *target);
mw_tensor *mw__contract_to(mw_graph *g, mw_tensor *a, mw_tensor *b, const mw__type *out);
mw_tensor *mw__fill(mw_graph *g, const mw__type *type, float value);
/* x as dtype (MW_F32 or MW_BF16): x itself when it has that dtype already, else a CAST of its
 * replicated value. */
mw_tensor *mw__cast(mw_graph *g, mw_tensor *x, mw_dtype dtype);

/* The type of a gradient of a tensor of type t: t's axes in f32 (gradients are f32 whatever the
 * dtype of the value they belong to, so casting to bf16 does not round them). */
static inline mw__type mw__grad_type(const mw__type *t) {
    mw__type g = *t;
    g.dtype = MW_F32;
    return g;
}

/* FSDP: x itself, or, where x is a parameter (or an alias of one) whose axis i is split over mesh
 * axis m and `other` holds that axis whole or splits another axis over m, a GATHER of x along i:
 * the parameter whole on every device, its gradient reduce-scattered back (SCATTER). other NULL:
 * every split axis is gathered (ops that need their parameters whole: embedding, layer norm).
 * NULL when memory ran out (the graph error set). */
mw_tensor *mw__gathered(mw_graph *g, mw_tensor *x, const mw_tensor *other);
/* GATHER's adjoint: gy (x's gathered type) back to x's split type t along axis i: the sum over the
 * devices along the split's mesh axis where gy is partial over it, else the device's own rows. */
mw_tensor *mw__scatter(mw_graph *g, mw_tensor *gy, const mw__type *t, int i);

/* Returns x itself when it is not partial, else an ALLREDUCE of it. */
mw_tensor *mw__replicated(mw_graph *g, mw_tensor *x);
/* x rearranged (and, where x lacks axes, broadcast, and where x has extra axes, summed) to match
 * `target`'s axes and order. */
mw_tensor *mw__to_type(mw_graph *g, mw_tensor *x, const mw__type *target);

/* SLICE or PAD node of x with result type t. */
mw_tensor *mw__slice_node(mw_graph *g, mw__op op, mw_tensor *x, const mw__type *t, int axis,
                          int64_t start, int64_t len);
/* A backward op (GELU_GRAD, LN_DX, ...) with result type t; copies the forward node's
 * parameters (scale, causal flag, valid count) from fwd. */
mw_tensor *mw__backward_op(mw_graph *g, mw__op op, const mw__type *t, mw_tensor *a, mw_tensor *b,
                           mw_tensor *c, const mw_tensor *fwd);

/* The gradient reaching input 0 of ops_math.c's node n (MAP, DROPOUT, REDUCE_MAX, ARGMAX) from its
 * output gradient gy; NULL with no error when the op has none (argmax, comparisons). */
mw_tensor *mw__backward_math(mw_graph *g, mw_tensor *n, mw_tensor *gy);

/* Whether x can be an f32 operand of op in g: 0 with the graph error set when it is NULL, of
 * another graph or not f32 (ops_math.c). */
int mw__f32_operand(mw_graph *g, const char *op, mw_tensor *x);

/* Records the graph's first error (also as the thread's last error); returns NULL for chaining. */
mw_tensor *mw__graph_fail(mw_graph *g, mw_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* A deep copy of g (for a trainer to extend with its backward pass). */
mw_status mw__graph_clone(const mw_graph *g, mw_graph **out);
/* An empty graph with g's axis and mesh names, seed and region count: an axis or mesh-name index
 * of g means the same axis in it (a pipeline stage's graph, built of g's nodes). */
mw_status mw__graph_new_like(const mw_graph *g, mw_graph **out);

#endif
