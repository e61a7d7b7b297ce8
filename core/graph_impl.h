/* Internal: the traced graph. Nodes are created in topological order (an op can only take tensors
 * that already exist), so the node array is also the execution order. */
#ifndef MW__GRAPH_IMPL_H
#define MW__GRAPH_IMPL_H

#include <stdint.h>

#include "meshwit/graph.h"

#define MW__MAX_MESH_NAMES 16 /* distinct mesh-axis names one graph may shard over */

typedef enum mw__op {
    MW__OP_INPUT, /* fed by the host every step */
    MW__OP_PARAM, /* trained, replicated */
    MW__OP_SHARD, /* an input with one axis relabelled Batch -> Batch@X (an alias, no data) */
    MW__OP_FILL,  /* every element = scalar */
    MW__OP_ADD,   /* binary elementwise with subset broadcasting */
    MW__OP_SUB,
    MW__OP_MUL,
    MW__OP_DIV,
    MW__OP_SCALE,     /* scalar * x; scalar 1 is a plain copy */
    MW__OP_PERMUTE,   /* x in another axis order */
    MW__OP_BROADCAST, /* x expanded along the axes of the output it lacks */
    MW__OP_SUM,       /* x summed over the axes the output lacks */
    MW__OP_CONTRACT,  /* einsum over names; axes absent from the output are summed */
    MW__OP_ALLREDUCE, /* partial sum -> the sum over the mesh names its input is partial over and
                         its output is not (a collective; all of them for mw__replicated) */
    MW__OP_ALIAS,     /* the same data under other axes: split, merge, rename */
    MW__OP_SLICE,     /* rows [start, start+len) of axis `axis` of x (dropped when len is 0) */
    MW__OP_PAD,       /* the adjoint of SLICE: x placed at `start` of axis `axis`, zeros around */
    MW__OP_GELU,      /* flag: the exact form (erf) */
    MW__OP_GELU_GRAD, /* (gy, x) */
    MW__OP_LAYERNORM, /* (x, w, b) over the last axis */
    MW__OP_LN_DX,     /* (gy, x, w) */
    MW__OP_LN_DW,     /* (gy, x) */
    MW__OP_SOFTMAX,   /* over the last axis; `flag` = causal over the last two */
    MW__OP_SOFTMAX_GRAD, /* (gy, y) */
    MW__OP_EMBED,        /* (table, ids) */
    MW__OP_EMBED_GRAD,   /* (gy, ids) */
    MW__OP_XENT,         /* (logits, targets) over the last axis, first `count` columns */
    MW__OP_XENT_GRAD,    /* (gy, logits, targets) */
    MW__OP_ATTENTION,    /* (qkv): axis = part axis, start = seq axis, len = feature axis (of qkv);
                            flag = causal, scalar = scale */
    MW__OP_ATTENTION_GRAD, /* (gy, qkv, the ATTENTION node): the gradient of qkv; same fields as
                            * ATTENTION */
    /* ops_extra.c: */
    MW__OP_MAP,         /* elementwise function `flag` (mw__mapfn) of x */
    MW__OP_MAP_GRAD,    /* (x, gy): gy * f'(x) */
    MW__OP_DROPOUT,     /* x * keep / (1 - p): p = `scalar`, seed = `count`; its own adjoint */
    MW__OP_ARGMAX,      /* index of the largest element along axis `axis` of x (f32, no gradient) */
    MW__OP_REDUCE_MAX,  /* the largest element along axis `axis` of x */
    MW__OP_CAST,        /* x as another dtype (f32 <-> bf16), rounded to the nearest even */
    MW__OP_STATE,       /* an inference program's state: kept between runs, zero at first */
    MW__OP_STATE_WRITE, /* (state, value, index): the state with value written at row index[..]
                           of axis `axis`, in place */
    MW__OP_ATTENTION_CACHED, /* (q, kv, pos): q attends to kv's keys 0..pos along the seq axis;
                                axis = kv's seq axis, start = its part axis, scalar = scale */
    MW__OP_COUNT
} mw__op;

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
    float scalar;           /* SCALE factor, FILL value, softmax scale, layer-norm epsilon */
    int axis;               /* SLICE / PAD: the axis (of the larger tensor) */
    int64_t start, len;     /* SLICE / PAD: the rows; len 0 means the axis is dropped (a select) */
    int flag;               /* SOFTMAX: causal */
    int64_t count;          /* XENT: valid columns */
    int leaf;               /* INPUT / PARAM / STATE: index among the graph's inputs / params /
                               states */
    int shard_axis;         /* SHARD: the axis (index into type) that was sharded */
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
    mw_status status;
    char error[512];
};

/* "f32", "bf16", "i32", "u16"; "?" for a value out of range. */
const char *mw__dtype_name(mw_dtype d);

/* The op's name ("contract", "gelu_grad", "attention", ...), "?" for a value out of range. */
const char *mw__op_name(int op);

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

/* The gradient reaching input 0 of ops_extra.c's node n from its output gradient gy; NULL with
 * no error when the op has none (argmax, comparisons). */
mw_tensor *mw__backward_extra(mw_graph *g, mw_tensor *n, mw_tensor *gy);

/* Records the graph's first error (also as the thread's last error); returns NULL for chaining. */
mw_tensor *mw__graph_fail(mw_graph *g, mw_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* A deep copy of g (for a trainer to extend with its backward pass). */
mw_status mw__graph_clone(const mw_graph *g, mw_graph **out);

#endif
