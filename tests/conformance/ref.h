/* The conformance table's float64 reference: a small reverse-mode autodiff over named-axis
 * tensors in double precision, written from the ops' definitions (graph.h) with plain loops and
 * sharing no code with the library's kernels. A composite op (attention, cached attention,
 * softmax cross-entropy) is built from the primitives here, so the reference never takes the
 * fused kernels' shortcuts. Its gradients are the textbook adjoints of each primitive; the
 * table checks them against central finite differences of the reference itself (conformance.c),
 * so the chain of trust runs library -> reference -> finite differences.
 *
 * A reference graph is a list of nodes built in order; every node's value is computed when it is
 * made. rg_backward seeds the gradient of one node and runs the adjoints in reverse. Axis names
 * are strings; an axis is the same axis as another when the names are equal. The order of a
 * node's axes is its memory layout (row-major), but ops match axes by name only. Errors are
 * programmer errors of the table: the reference aborts with a message. */
#ifndef CONFORMANCE_REF_H
#define CONFORMANCE_REF_H

#include <stdint.h>

#define RG_MAX_RANK 8
#define RG_NAME 24

typedef struct rg_axes {
    int rank;
    char name[RG_MAX_RANK][RG_NAME];
    int64_t size[RG_MAX_RANK];
} rg_axes;

typedef enum rg_fn {
    RG_RELU,
    RG_TANH,
    RG_SIGMOID,
    RG_EXP,
    RG_LOG,
    RG_SQRT,
    RG_ABS,
    RG_GELU_TANH,
    RG_GELU_ERF,
    RG_SILU,
    RG_BF16,   /* rounds to the nearest bfloat16 (ties to even); its gradient is the identity */
    RG_STEP_GT /* 1 where x > 0 else 0; no gradient (comparisons, masks) */
} rg_fn;

typedef struct rg_graph rg_graph;

rg_graph *rg_new(void);
void rg_free(rg_graph *r);

/* A leaf: values in the axes' order (copied). */
int rg_leaf(rg_graph *r, const rg_axes *ax, const double *values);
/* Integer ids (embedding, cross-entropy targets, positions): no gradient. */
int rg_ids(rg_graph *r, const rg_axes *ax, const int32_t *values);

int rg_add(rg_graph *r, int a, int b); /* b's axes a subset of a's, or a's of b's */
int rg_sub(rg_graph *r, int a, int b);
int rg_mul(rg_graph *r, int a, int b);
int rg_div(rg_graph *r, int a, int b);
int rg_scale(rg_graph *r, int x, double f);
int rg_map(rg_graph *r, int x, rg_fn fn);
/* A constant of the given axes (no gradient). */
int rg_const(rg_graph *r, const rg_axes *ax, double value);

/* The sum over the products of a and b of every axis not in out (names, in order). */
int rg_contract(rg_graph *r, int a, int b, const char *const *out, int nout);
/* x summed over the axes `keep` does not name. */
int rg_sum_to(rg_graph *r, int x, const char *const *keep, int nkeep);

/* softmax(scale x) over axis `axis`; causal: positions of `query` see keys j <= i + (K - Q) only,
 * the others 0. */
int rg_softmax(rg_graph *r, int x, const char *axis, double scale, const char *query);
int rg_layernorm(rg_graph *r, int x, int w, int b, const char *axis, double eps);
/* table [vocab, Dim] rows picked by ids: ids' axes then Dim. */
int rg_embedding(rg_graph *r, int table, int ids, const char *vocab);
/* logsumexp over the first `valid` entries of axis `vocab` minus the target's logit. */
int rg_xent(rg_graph *r, int logits, int targets, const char *vocab, int64_t valid);
/* Rows [start, start + len) of axis `axis`, renamed `name` (NULL: same name); len 0 drops the
 * axis (one row, start). */
int rg_slice(rg_graph *r, int x, const char *axis, int64_t start, int64_t len, const char *name);
/* x placed at rows [start, ...) of axis `axis` of size `size` (named `name`), zeros around. */
int rg_pad(rg_graph *r, int x, const char *axis, int64_t start, int64_t size, const char *name);
/* The largest element along `axis` (ties share the gradient evenly), and its first index. */
int rg_max(rg_graph *r, int x, const char *axis);
int rg_argmax(rg_graph *r, int x, const char *axis);
/* The same data under new axes of the same total size in the same order (rename, split, merge). */
int rg_reshape(rg_graph *r, int x, const rg_axes *to);
/* x in another axis order (every axis once). */
int rg_permute(rg_graph *r, int x, const char *const *order, int n);

/* Node accessors. */
const rg_axes *rg_axes_of(const rg_graph *r, int n);
int64_t rg_numel(const rg_graph *r, int n);
double *rg_value(rg_graph *r, int n);
double *rg_grad(rg_graph *r, int n); /* after rg_backward */
const int32_t *rg_idvalue(const rg_graph *r, int n);

/* Sets every gradient to 0, the gradient of node `seed` to `dy` (its numel values) and runs the
 * adjoints of every node in reverse. */
void rg_backward(rg_graph *r, int seed, const double *dy);

/* Helpers for axes. */
int rg_parse_axes(const char *spec, const char *sizes, rg_axes *out); /* "A,B" with "A=3,B=4" */
int rg_find(const rg_axes *ax, const char *name);
int64_t rg_axes_numel(const rg_axes *ax);

/* The nearest bfloat16 of x as a double (ties to even; NaN stays NaN). */
double rg_bf16(double x);

#endif
