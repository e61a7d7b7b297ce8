/* Internal: the plan builder's state, shared by the compiler's passes over a graph (plan.c runs
 * them in order):
 *   plan_fuse.c    which nodes another node's kernel computes too, chosen for the whole graph
 *                  before anything is emitted: one fusion record per node
 *   plan_memory.c  the arena and the buffers' lifetimes (liveness)
 *   plan_lower.c   each node's kernels (contractions to batched GEMMs) and collectives
 *   plan.c         live nodes, the parameter layout, input views, the pass that assigns buffers
 *                  and lowers node after node, and the gradient buckets */
#ifndef MW__PLAN_IMPL_H
#define MW__PLAN_IMPL_H

#include <stdint.h>
#include <string.h>

#include "core/plan.h"

/* --- local shapes ------------------------------------------------------------------------------
 */

typedef struct ltype {
    int rank;
    int64_t size[MW_MAX_RANK];
    int64_t stride[MW_MAX_RANK];
    int64_t numel;
} ltype;

/* The extents (and row-major strides) of t on the device at placement pl. */
static inline ltype local_type(const mw__type *t, const mw__placement *pl) {
    ltype l = {.rank = t->rank, .numel = 1};
    for (int i = t->rank - 1; i >= 0; i--) {
        const mw__axis *a = &t->ax[i];
        l.size[i] =
            a->mesh >= 0 ? mw__split_len(a->size, pl->size[a->mesh], pl->coord[a->mesh]) : a->size;
        l.stride[i] = l.numel;
        l.numel *= l.size[i];
    }
    return l;
}

/* Whether t's axes are a subset of u's (by name and sharding). */
static inline int axes_within(const mw__type *t, const mw__type *u) {
    for (int i = 0; i < t->rank; i++)
        if (mw__type_find(u, &t->ax[i]) < 0) return 0;
    return 1;
}

/* Whether a and c have the same axes in the same order. */
static inline int same_layout(const mw__type *a, const mw__type *c) {
    if (a->rank != c->rank) return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->ax[i].name != c->ax[i].name || a->ax[i].mesh != c->ax[i].mesh) return 0;
    return 1;
}

/* --- the arena (plan_memory.c): placed online, recorded, then packed and replayed ------------ */

typedef struct block {
    int64_t off, len;
} block;

/* One buffer of the first build: its size, its online offset, and its lifetime in the arena's
 * clock (ticks at every allocation and release; died INT64_MAX: alive to the end). */
typedef struct arena_rec {
    int64_t n, off, born, died;
} arena_rec;

typedef struct arena {
    block *free;
    int nfree, cap;
    int64_t top;
    /* The first build's record. */
    arena_rec *recs;
    int nrecs, reccap;
    int64_t clock;
    int failed;          /* the record is incomplete (out of memory): no packing */
    int64_t *placed_own; /* mw__arena_pack's offsets, one per record */
    /* The second build: the offsets replayed (placed, NULL while recording), the next one. */
    const int64_t *placed;
    int next, mismatch;
} arena;

/* The arena's 4-byte units that numel elements of dtype take. */
static inline int64_t units_of(int64_t numel, mw_dtype dtype) {
    return (numel * mw__dtype_bytes(dtype) + 3) / 4;
}

/* The ref of a buffer of dtype at arena unit `unit`. */
static inline mw__ref arena_ref(mw_dtype dtype, int64_t unit) {
    return (mw__ref){MW__BASE_ARENA, dtype, unit * 4};
}

/* No operand (an optional ref a kernel goes without). */
static const mw__ref no_ref = {MW__BASE_ARENA, MW_F32, -1};

/* n units (rounded up to 64 bytes): the unit they start at (a free block, or the top grown). */
int64_t mw__arena_alloc(arena *a, int64_t n);
/* Gives n units at off back; -1 when memory ran out. */
int mw__arena_release(arena *a, int64_t off, int64_t n);
/* Places every recorded buffer at once (largest first, each at the lowest offset clear of the
 * placed ones whose lifetimes overlap its own) into a->placed_own: the units the packing needs,
 * -1 when there is nothing to place, -2 when memory ran out (now or while recording). */
int64_t mw__arena_pack(arena *a);

/* --- the builder -------------------------------------------------------------------------------
 */

/* What the plan knows of one node besides its fusions. */
typedef struct node_info {
    mw__ref ref;    /* where its value lives */
    int root;       /* the node owning its buffer (itself unless an alias or fused) */
    int last_use;   /* the last node reading its buffer (the root's: any alias of it) */
    int grad_of;    /* the parameter it is the gradient of, or -1 */
    int uses;       /* live nodes reading it (+2 when the host reads it) */
    char live;      /* an ancestor of the loss, an output, a gradient or a state's write */
    char in_arena;  /* ref is an arena buffer to release after its last use */
    char host_read; /* the host reads its buffer after the step (the loss, an output) */
    /* A GATHER whose all-gather was started ahead (prefetch_gathers): 1 through scratch, its
     * output still to assign; 2 in its output, assigned then. */
    char started;
    int64_t tmp; /* such a GATHER's scratch in the arena until it completes, or -1 */
} node_info;

enum {
    CAST_CONVERT = 0, /* a converting copy of its own */
    CAST_PARAM,       /* a parameter's bf16 copy (MW__BASE_PARAMS16), written by whoever changes
                         the parameter */
    CAST_FUSED        /* written in bf16 by the kernel that makes the value, which nobody else
                         reads */
};

/* The fusion record of one node (plan_fuse.c): -1 / 0 where none applies. */
typedef struct fusion {
    /* CONTRACT c: the ADD whose other operand its GEMM accumulates onto (in its epilogue, or
     * beta = 1 after copying it into c's buffer), and a second ADD whose other operand (a
     * residual) goes into the same buffer with it (x + (A B + b)). */
    int addend, addend2;
    /* ADD a: the CONTRACT (or normalisation's dx) whose buffer it takes over; it then emits
     * nothing. */
    int fused;
    /* LN_DX, RMSNORM_DX: the node its kernel adds to dx (a residual stream's gradient), the
     * LN_DW / RMSNORM_DW node it writes too; LN_DX and GELU_GRAD: the SUM (a bias gradient) it
     * writes too. */
    int ln_addend, ln_dw, col_sum;
    /* ATTENTION, ATTENTION_GRAD: the ROPE whose rotation its kernel applies to q and k as it
     * reads them (reading the ROPE's input), the gradient's kernel also rotating d(qkv) back. */
    int rotary;
    /* A ROPE so applied, the CAST to bf16 between it and the attention, and the ROPE_GRAD that
     * the attention gradient's kernel computes: it emits nothing, and its value is its input's
     * buffer (for the ROPE and the cast, the unrotated f32 projection that only the attention's
     * kernels read). */
    char pass;
    char absorbed; /* another node's kernel writes it: it emits nothing */
    char cast;     /* a CAST to bf16: CAST_CONVERT, CAST_PARAM or CAST_FUSED */
    char buf16;    /* the buffer this node owns holds bf16 (its kernel writes a cast's value) */
    /* Floats allocated after its value in the same buffer, freed with it: the probabilities an
     * ATTENTION node keeps for its gradient node. */
    int64_t extra;
} fusion;

typedef struct builder {
    const mw_graph *g;
    const mw__placement *pl;
    mw__plan *p;
    arena ar;
    node_info *node; /* per node */
    fusion *fuse;    /* per node */
    int host_memory;
    uint64_t bf16_out; /* mw__plan_target's */
    int prefetch;      /* mw__plan_target's prefetch_gathers */
    int split;         /* mw__plan_target's split_nodes */
    int rotary;        /* mw__plan_target's rotary */
} builder;

/* Whether node j may be computed by the kernel of node i: not when the plan runs its backward
 * in two parts and j is in the second (a weight gradient written by an input gradient's kernel
 * would land in the gradients before the micro-batch's weight part runs, over another's). */
static inline int same_part(const builder *b, int i, int j) {
    return !b->split || (i < b->split) == (j < b->split);
}

/* Where the gradient node i (node[i].grad_of >= 0) lives: its parameter's slot of the gradients. */
static inline mw__ref grad_ref(const builder *b, int i) {
    return mw__ref_at(MW__BASE_GRADS, MW_F32, b->p->params[b->node[i].grad_of].off);
}

/* --- contractions ------------------------------------------------------------------------------
 */

/* A type made of the listed axes (by position in src types), in that order. */
typedef struct axlist {
    int n;
    mw__axis ax[MW_MAX_RANK];
} axlist;

static inline int seq_equals(const mw__type *t, const axlist *const *groups, int ngroups) {
    int k = 0;
    for (int gi = 0; gi < ngroups; gi++)
        for (int i = 0; i < groups[gi]->n; i++, k++)
            if (k >= t->rank || t->ax[k].name != groups[gi]->ax[i].name ||
                t->ax[k].mesh != groups[gi]->ax[i].mesh)
                return 0;
    return k == t->rank;
}

/* How a GEMM's epilogue reads an addend: as a bias (added to every row), as an array laid out like
 * C, or not (it goes into C before the product is added). */
enum { EPI_NONE, EPI_BIAS, EPI_FULL };

/* How a contraction maps onto one GEMM: its axis groups (Bt batch, M, N, K); whether C is
 * computed swapped (C^T = B^T A^T, so that the GEMM's rows and columns are C's in memory) or
 * into scratch and permuted after; the addends the plan folds into it (find_gemm_addends: the
 * sum's other operand, and a residual added to that sum) and where each goes: into the GEMM's
 * epilogue (EPI_BIAS, EPI_FULL) or, EPI_NONE, into C before the product is added to it. */
typedef struct contraction {
    axlist bt, m, nn, k;
    int swap, permute_out;
    const mw_tensor *sum, *sum2;
    int addend, residual;
    int epi_addend, epi_residual;
} contraction;

/* --- the passes --------------------------------------------------------------------------------
 */

/* plan_fuse.c: fills b->fuse and b->node[].root for the live nodes (b->node[].live, grad_of and
 * uses set), given the nodes the host reads (the loss and the outputs). */
void mw__plan_fuse(builder *b, const mw_tensor *loss, mw_tensor *const *outputs, int noutputs);
/* plan_fuse.c: how contraction n maps onto a GEMM with the addends its fusion record folds in. */
void mw__plan_contraction(const builder *b, const mw_tensor *n, contraction *c);

/* plan_memory.c: sets b->node[].last_use (the host reads the loss and the outputs after the
 * step). */
void mw__plan_liveness(builder *b, const mw_tensor *loss, mw_tensor *const *outputs, int noutputs);
/* plan_memory.c: a buffer for node i's value in the arena (its gradient slot when it is one). */
void mw__plan_assign(builder *b, int i);
/* plan_memory.c: gives back the arena buffers whose last use is node i; -1 when memory ran out. */
int mw__plan_release_inputs(builder *b, int i);

/* plan_lower.c: appends an instruction of that kind for node `node` (operands all absent); NULL
 * when memory ran out. */
mw__ins *mw__plan_emit(builder *b, mw__ins_kind kind, int node);
/* plan_lower.c: emits node n's kernels into b->p, its operands at b->node[].ref: 0, -1 when memory
 * ran out, -2 when no kernel takes the node in this form (the message set). */
int mw__plan_lower_node(builder *b, const mw_tensor *n);
/* plan_lower_kernels.c: the first half of GATHER node n ahead of its turn: its rows into place
 * and the all-gather started (in scratch, or in its output, then assigned); mw__plan_lower_node
 * then emits the rest. 0, or -1 when memory ran out. */
int mw__plan_start_gather(builder *b, const mw_tensor *n);

/* plan_lower_kernels.c: the lowering of the nodes that are one kernel each, for
 * mw__plan_lower_node, each into out (b->node[n->id].ref) with mw__plan_lower_node's results;
 * lo is n's local type. */
int mw__plan_lower_nn(builder *b, const mw_tensor *n, const ltype *lo, mw__ref out);
int mw__plan_lower_attention(builder *b, const mw_tensor *n, mw__ref out);
int mw__plan_lower_indexed(builder *b, const mw_tensor *n, mw__ref out);
/* Which part of a GATHER (or SCATTER) node to emit: the whole node; a prefetched gather's first
 * half (the rows into place and GATHER_START, its scratch kept in node[].tmp) ahead of the node;
 * its second (GATHER_WAIT and the rest) at the node. */
enum { MW__GATHER_WHOLE, MW__GATHER_BEGIN, MW__GATHER_END };
int mw__plan_lower_gather(builder *b, const mw_tensor *n, mw__ref out, int part);
/* A node no kernel takes in this form: -2, with the message (-1 is out of memory). */
int mw__plan_cannot_lower(const mw_tensor *n);

#endif
