/* Internal: compiling a graph for one device. The plan is a straight list of instructions (device
 * kernels and collectives) over buffers named by (base, offset), plus the sizes of the buffers to
 * allocate once: an arena for activations (reused by liveness), the flat parameter buffer and the
 * flat gradient buffer, and the device-side views of the inputs. */
#ifndef MW__PLAN_H
#define MW__PLAN_H

#include <stdint.h>

#include "core/graph_impl.h"
#include "devices/device.h"

enum {
    MW__BASE_ARENA = 0,
    MW__BASE_PARAMS = 1,
    MW__BASE_GRADS = 2,
    MW__BASE_PARAMS16 = 3, /* the bf16 copy of the flat parameters (where plan.params16) */
    MW__BASE_STATE = 4,    /* an inference program's states (mw_state), kept between runs */
    MW__BASE_VIEW0 = 5     /* MW__BASE_VIEW0 + v: input view v */
};

/* A place in a device buffer: its base, the dtype of the elements there, and the offset in bytes
 * (the arena hands out 4-byte units; the flat parameters and gradients are f32). */
typedef struct mw__ref {
    int base;
    mw_dtype dtype;
    int64_t off; /* bytes from the base's start; a view's staging uses -1 for "read in place" */
} mw__ref;

/* Bytes per element of a dtype. */
static inline int64_t mw__dtype_bytes(mw_dtype d) { return d == MW_BF16 || d == MW_U16 ? 2 : 4; }

/* The ref of element `elem` of a buffer of `dtype` elements at `base`. */
static inline mw__ref mw__ref_at(int base, mw_dtype dtype, int64_t elem) {
    return (mw__ref){base, dtype, elem * mw__dtype_bytes(dtype)};
}

/* Each kernel's operands by role: mw__refs_<name> has one mw__ref per role of its row of the
 * instruction table (devices/device.h), named as the descriptor's pointer field it fills. */
#define MW__REF_FIELD_(X, role) mw__ref role;
#define MW__REFS_(KIND, name, type, dtypes, ROLES)                                                 \
    typedef struct mw__refs_##name {                                                               \
        ROLES(MW__REF_FIELD_, name)                                                                \
    } mw__refs_##name;
MW__KERNELS(MW__REFS_)
#undef MW__REFS_
#undef MW__REF_FIELD_

/* An instruction's operands: by role (in->ref.gemm.bias), or all of them in the order of its
 * row's roles (in->ref.all[0 .. mw__ins_roles(kind))). An operand the kernel goes without has off
 * -1. The collectives have one: the buffer reduced in place. */
typedef union mw__operands {
    mw__ref all[MW__MAX_ROLES];
#define MW__OPERANDS_(KIND, name, type, dtypes, ROLES) mw__refs_##name name;
    MW__KERNELS(MW__OPERANDS_)
#undef MW__OPERANDS_
    struct {
        mw__ref buf;
    } collective;
} mw__operands;

/* No row has more roles than mw__operands.all holds. */
#define MW__ROLE_COUNT_(X, role) +1
#define MW__ROLES_FIT_(KIND, name, type, dtypes, ROLES)                                            \
    MW__STATIC_ASSERT((0 ROLES(MW__ROLE_COUNT_, name)) <= MW__MAX_ROLES,                           \
                      "instruction " #name " has more operands than MW__MAX_ROLES");
MW__KERNELS(MW__ROLES_FIT_)
#undef MW__ROLES_FIT_

/* The number of operands of an instruction of that kind. */
static inline int mw__ins_roles(int kind) {
    switch (kind) {
#define MW__ROLES_OF_(KIND, name, type, dtypes, ROLES)                                             \
    case MW__I_##KIND: return 0 ROLES(MW__ROLE_COUNT_, name);
        MW__KERNELS(MW__ROLES_OF_)
#undef MW__ROLES_OF_
    case MW__I_ALLREDUCE:
    case MW__I_GRAD_BUCKET:
    case MW__I_ALLGATHER:
    case MW__I_REDUCE_SCATTER:
    case MW__I_GATHER_START:
    case MW__I_GATHER_WAIT: return 1;
    }
    return 0;
}

typedef struct mw__ins {
    mw__ins_kind kind;
    int node;         /* graph node it implements (for messages) */
    mw__operands ref; /* where the kernel's operands live */
    int64_t count;    /* the collectives: elements of the buffer */
    uint32_t group;   /* the collectives: mask of graph mesh names */
    /* ALLGATHER / REDUCE_SCATTER / GATHER_START: the buffer as rows of row_elems, split over
     * `parts` devices (mw__split_lo): the part of the device at coordinate r along the group's
     * mesh axis. GATHER_WAIT: the group (and buffer) of the GATHER_START it completes. */
    int64_t rows, row_elems;
    int parts;
    /* The kernel's descriptor, its pointers unset: the plan is not changed once built; each
     * worker runs a copy of the kernels with the pointers resolved from ref (the executor). */
    union mw__kernel k;
} mw__ins;

/* A device's box of a whole row-major array: rows [lo, lo + len) of each axis of sizes `global`
 * (an input's shard, a split parameter, a sharded output). */
typedef struct mw__box {
    int rank;
    int64_t global[MW_MAX_RANK], lo[MW_MAX_RANK], len[MW_MAX_RANK];
} mw__box;

/* The run of the box's elements that starts at element e (counted row-major within the box) and
 * is contiguous in the whole array too, cut at element `to`: its length, and in *at the whole
 * array's element where it starts. Consecutive runs from 0 walk the box in order. */
int64_t mw__box_run(const mw__box *b, int64_t e, int64_t to, int64_t *at);

/* An input as one device sees it: a box of the host array. When the box is contiguous in the host
 * array, host-memory devices read it in place. */
typedef struct mw__view {
    int input; /* input leaf index */
    mw_dtype dtype;
    mw__box box;
    int64_t count;       /* local elements */
    int64_t host_offset; /* element offset of the box's first element */
    int contiguous;
    mw__ref staging; /* arena buffer when not read in place (off < 0: in place) */
} mw__view;

typedef struct mw__param_slot {
    int64_t off, count; /* in the flat parameter and gradient buffers (same layout) */
    int grad_node;      /* node computing its gradient, or -1 (gradient is zero) */
    uint32_t group;     /* mesh names its gradient is partial over (0: needs no reduction) */
    int bf16;           /* a bf16 copy of it is read (at the same offset of MW__BASE_PARAMS16):
                           whoever changes the parameter rewrites the copy */
} mw__param_slot;

/* How one device sits in the mesh, per graph mesh name. */
typedef struct mw__placement {
    int nmesh;                     /* graph mesh names */
    int size[MW__MAX_MESH_NAMES];  /* devices along that mesh axis */
    int coord[MW__MAX_MESH_NAMES]; /* this device's coordinate along it */
} mw__placement;

/* The box of a tensor of type t that the device at placement pl holds. */
void mw__box_of(const mw__type *t, const mw__placement *pl, mw__box *out);

typedef struct mw__plan {
    mw__ins *ins;
    int nins, cap;
    int fwd_end;   /* [0, fwd_end): forward up to the loss */
    int bwd_end;   /* [fwd_end, bwd_end): backward and the gradient reductions */
    int bwd_split; /* with target split_nodes: [fwd_end, bwd_split) the nodes before it, the
                      rest after; else bwd_end */
    int64_t arena_bytes, param_elems;
    mw__view *views;
    int nviews;
    mw__param_slot *params; /* by parameter leaf index */
    int nparams;
    int params16; /* some parameter has a bf16 copy: MW__BASE_PARAMS16 holds param_elems bf16 */
    int64_t state_elems; /* f32 elements of this device's states (MW__BASE_STATE) */
    mw__ref loss;
    mw__ref *outputs; /* where each requested output lives (kept to the end of the step) */
    int noutputs;
} mw__plan;

/* What the plan needs to know of the device it compiles for. */
typedef struct mw__plan_target {
    int host_memory;      /* the device reads host arrays in place */
    int64_t bucket_elems; /* bounds a gradient bucket */
    /* Bit k set: the device's kernel of instruction kind k (mw__ins_kind) writes a bf16 output,
     * so a value that is only read as bf16 is written as bf16 by the kernel that makes it,
     * rather than in f32 and converted. */
    uint64_t bf16_out;
    /* FSDP: the device's reducer can start an all-gather and complete it later
     * (all_gather_start), so each gather of a parameter is started where the one before it
     * completes (one ahead: the next layer's parameters arrive while this layer computes) and
     * waited for where the parameter is used. 0: each gathered where it is used. */
    int prefetch_gathers;
    /* > 0: the graph's nodes from this one on are the backward pass, so an output among them (a
     * pipeline stage's gradient of its input) is read after the backward part, not at the end of
     * the forward part. 0: every output ends the forward part where it is made. */
    int forward_nodes;
    /* > 0: the backward nodes from this one on are a second part (a pipeline stage's weight
     * gradients, run apart from its input gradients: plan bwd_split). 0: one backward part. */
    int split_nodes;
    /* The device's attention kernels rotate q and k as they read them (mw__k_attention.rope): a
     * rotary embedding that only attention reads is then applied there, with its gradient, rather
     * than as passes of their own over q, k and v (plan_fuse.c, find_rotary): 2 wherever the
     * graph allows, 1 only where the attention reads f32 (in bf16 the rope's bf16 output, which
     * the backward keeps, takes half the memory of the f32 projection the fused kernels would
     * keep, and on the CPUs measured the fused kernels were no faster), 0 never. */
    int rotary;
} mw__plan_target;

/* Compiles g (forward plus backward) for one device. param_grads[i] is the gradient node of
 * parameter i (or NULL). */
mw_status mw__plan_build(const mw_graph *g, const mw_tensor *loss, mw_tensor *const *param_grads,
                         mw_tensor *const *outputs, int noutputs, const mw__placement *pl,
                         const mw__plan_target *target, mw__plan *out);
void mw__plan_free(mw__plan *p);

/* The local size of a global axis of size n split over `parts` devices, at coordinate c: shards
 * differ by at most one row; the first n % parts devices get the extra row. */
int64_t mw__split_len(int64_t n, int parts, int c);
int64_t mw__split_lo(int64_t n, int parts, int c);

#endif
