/* The conformance table: one row per op of the library (and per fused or cached variant the planner
 * can choose), each run over every legal layout of its operands, every configuration of this
 * machine (devices and their splits, precisions; the driver also sweeps the CPU's instruction
 * levels and GEMM engines, and cuda:0 where a GPU is present), against the float64 reference of
 * ref.h. Adding an op means adding a row here (table.c); an op of MW__OPS no row covers fails the
 * run. */
#ifndef CONFORMANCE_H
#define CONFORMANCE_H

#include <stdint.h>

#include "meshwit.h"
#include "ref.h"

#define CF_MAX_OPS 10
#define CF_MAX_VARIANTS 6

typedef enum cf_kind {
    CF_PARAM, /* f32, trained: its gradient is checked (a parameter, or computed from one) */
    CF_MASK,  /* f32, fed: no gradient */
    CF_IDS,   /* i32, fed: ids, targets, positions */
    CF_STATE  /* an inference program's state (mw_state), zero when the program is made */
} cf_kind;

/* Which axis orders an operand may take (each a layout the op's header allows). */
typedef enum cf_order {
    CF_ANY,     /* every permutation */
    CF_LAST,    /* every permutation with `pin` last */
    CF_FIRST,   /* every permutation with `pin` first */
    CF_FIXED,   /* the canonical order only */
    CF_LIKE,    /* the order of operand `pin` (by name), its other axes dropped */
    CF_TAIL,    /* `pin` ("A,B") last, in that order; the others in any order */
    CF_LAST_BUT /* `pin` "A,B": A last once B is left out (a contraction over B leaves A last) */
} cf_order;

typedef struct cf_operand {
    const char *name; /* the tensor's name in the graph (and the reference's leaf) */
    const char *axes; /* canonical order, "Batch,Seq,Embed" */
    cf_kind kind;
    double lo, hi; /* values uniform in [lo, hi); ids: integers in [lo, hi) */
    cf_order order;
    const char *pin;
    /* Values kept at least this far from 0 (|x| >= away: kinks of relu, abs; divisors), and
     * distinct along the operand (maxima without ties) when `distinct` is set. */
    double away;
    int distinct;
    double grid; /* > 0: values rounded to multiples of it (ties on purpose: comparisons, masks) */
} cf_operand;

/* One shape and its op parameters. */
typedef struct cf_variant {
    const char *sizes; /* "Batch=2,Seq=5,Embed=7" */
    int i[4];          /* per row: causal flag, start, length, valid count, ... */
    double f[2];       /* per row: eps, scale, p, ... */
} cf_variant;

enum {
    CF_NO_GRAD = 1,     /* the op has no gradient (comparisons, argmax): values only */
    CF_INFER = 2,       /* runs in an inference program (states, cached attention) */
    CF_DROPOUT = 4,     /* checked against its definition, not a reference (a random mask) */
    CF_EXACT = 8,       /* values are exact (indices, 0/1 masks): compared for equality */
    CF_TIES = 16,       /* operands have exact ties: no finite-difference check of the reference */
    CF_NO_SOURCES = 32, /* operands are parameters only (no computed producers) */
    CF_NO_FD = 64       /* the gradient is a convention, not a derivative (a rounding's) */
};

typedef struct cf_row {
    const char *name;
    const char *covers; /* the MW__OPS names (mw__op_name) this row exercises, "add,sub" */
    cf_operand op[CF_MAX_OPS];
    int nops;
    cf_variant var[CF_MAX_VARIANTS];
    int nvar;
    /* Axes tried split over a mesh axis (every operand holding one split alike); of those, the
     * ones the op refuses split whatever the operands are (MW_ERR_SHARDING, naming the axis), and
     * those it needs whole: gathered where every operand holding them is a parameter (FSDP),
     * refused where one is computed. */
    const char *split, *refuse, *whole;
    /* The axes whose sizes multiply into the longest reduction of the op (for the tolerance);
     * NULL: none (1). */
    const char *reduce;
    double amp; /* how much the op amplifies rounding errors (0: 1) */
    int flags;
    mw_tensor *(*build)(mw_graph *g, mw_tensor *const *x, const cf_variant *v);
    int (*ref)(rg_graph *r, const int *x, const cf_variant *v);
} cf_row;

extern const cf_row cf_rows[];
extern const int cf_nrows;

#endif
