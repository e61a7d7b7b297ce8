/* Internal: the traced graph. Nodes are created in topological order (an op can only take tensors
 * that already exist), so the node array is also the execution order. */
#ifndef MW__GRAPH_IMPL_H
#define MW__GRAPH_IMPL_H

#include <stdint.h>

#include "meshwit/graph.h"

#define MW__MAX_MESH_NAMES 16 /* distinct mesh-axis names one graph may shard over */

/* The graph ops: XX(KIND, name, params), one row per op, in node-kind order (MW__OP_<KIND>).
 *   name    the op's name in messages (mw__op_name)
 *   params  the member of mw__op_params holding the node's parameters, or none (which
 *           mw__op_params_describe prints) */
#define MW__OPS(XX)                                                                                \
    XX(INPUT, "input", none)  /* fed by the host every step */                                     \
    XX(PARAM, "param", none)  /* trained; replicated unless split by mw_shard */                   \
    XX(SHARD, "shard", shard) /* one axis relabelled Batch -> Batch@X (an alias) */                \
    XX(FILL, "fill", fill)    /* every element = value */                                          \
    XX(ADD, "add", none)      /* binary elementwise with subset broadcasting */                    \
    XX(SUB, "sub", none)                                                                           \
    XX(MUL, "mul", none)                                                                           \
    XX(DIV, "div", none)                                                                           \
    XX(SCALE, "scale", scale)         /* factor * x; factor 1 is a plain copy */                   \
    XX(PERMUTE, "permute", none)      /* x in another axis order */                                \
    XX(BROADCAST, "broadcast", none)  /* x expanded along the axes of the output it lacks */       \
    XX(SUM, "sum", none)              /* x summed over the axes the output lacks */                \
    XX(CONTRACT, "contract", none)    /* einsum over names; axes absent from the output summed */  \
    XX(ALLREDUCE, "all-reduce", none) /* partial -> the sum over the mesh names it completes */    \
    XX(ALIAS, "alias", none)          /* the same data under other axes: split, merge, rename */   \
    XX(SLICE, "slice", slice)         /* rows [start, start + len) of an axis of x */              \
    XX(PAD, "pad", slice)             /* SLICE's adjoint: x placed at start, zeros around */       \
    XX(GELU, "gelu", gelu)                                                                         \
    XX(GELU_GRAD, "gelu_grad", gelu)          /* (gy, x) */                                        \
    XX(LAYERNORM, "layernorm", layernorm)     /* (x, w, b) over the last axis */                   \
    XX(LN_DX, "layernorm_dx", layernorm)      /* (gy, x, w) */                                     \
    XX(LN_DW, "layernorm_dw", layernorm)      /* (gy, x) */                                        \
    XX(SOFTMAX, "softmax", softmax)           /* over the last axis (causal: over the last two) */ \
    XX(SOFTMAX_GRAD, "softmax_grad", softmax) /* (gy, y) */                                        \
    XX(EMBED, "embedding", none)              /* (table, ids) */                                   \
    XX(EMBED_GRAD, "embedding_grad", none)    /* (gy, ids) */                                      \
    XX(XENT, "cross_entropy", xent)           /* (logits, targets) over the last axis */           \
    XX(XENT_GRAD, "cross_entropy_grad", xent) /* (gy, logits, targets) */                          \
    XX(ATTENTION, "attention", attention)     /* (qkv) */                                          \
    XX(ATTENTION_GRAD, "attention_grad", attention) /* (gy, qkv, the ATTENTION node) */            \
    XX(MAP, "map", map)                   /* an elementwise function of x (relu, exp, ...) */      \
    XX(MAP_GRAD, "map_grad", map)         /* (x, gy): gy * f'(x) */                                \
    XX(DROPOUT, "dropout", dropout)       /* x * keep / (1 - p); its own adjoint */                \
    XX(ARGMAX, "argmax", along)           /* index of the largest element along an axis (f32) */   \
    XX(REDUCE_MAX, "reduce_max", along)   /* the largest element along an axis */                  \
    XX(CAST, "cast", none)                /* x as another dtype (f32 <-> bf16), nearest even */    \
    XX(STATE, "state", none)              /* an inference program's state: kept between runs */    \
    XX(STATE_WRITE, "state_write", along) /* (state, value, index): value written in place */      \
    XX(ATTENTION_CACHED, "attention_cached", cached) /* (q, kv, pos): q against keys 0..pos */     \
    XX(GATHER, "all-gather", along)      /* a split parameter whole on every device (FSDP) */      \
    XX(SCATTER, "reduce-scatter", along) /* GATHER's adjoint: each device's rows, summed */

typedef enum mw__op {
#define MW__OP_KIND_(KIND, name, params) MW__OP_##KIND,
    MW__OPS(MW__OP_KIND_)
#undef MW__OP_KIND_
        MW__OP_COUNT
} mw__op;

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

#endif
