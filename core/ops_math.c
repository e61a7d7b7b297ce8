/* Math functions and selections: activations and other elementwise functions, comparisons and
 * selection, elementwise and reduced maxima, argmax, concatenation and dropout. Most are one
 * elementwise MAP node (f and f' in devices/math.h) or compositions of the core ops, which
 * then get their sharding rules and gradients from those ops; the rest (dropout, reduce max,
 * argmax) are nodes of their own with kernels of their own. */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/graph_impl.h"
#include "core/plan.h"
#include "devices/math.h"

#define DESC(t, buf) mw__type_describe(g, &(t)->type, buf, sizeof buf)

int mw__f32_operand(mw_graph *g, const char *op, mw_tensor *x) {
    if (!g || g->status) return 0;
    if (!x) {
        mw__graph_fail(g, MW_ERR_INVALID, "%s: operand is NULL", op);
        return 0;
    }
    if (x->g != g) {
        mw__graph_fail(g, MW_ERR_INVALID, "%s: operand belongs to another graph", op);
        return 0;
    }
    if (x->type.dtype != MW_F32) {
        char d[256];
        mw__graph_fail(g, MW_ERR_DTYPE, "%s: operand %s must be f32", op, DESC(x, d));
        return 0;
    }
    return 1;
}

static mw_tensor *map(mw_graph *g, const char *op, mw_tensor *x, mw__mapfn fn) {
    if (!mw__f32_operand(g, op, x) || !(x = mw__replicated(g, x))) return NULL;
    mw_tensor proto = {.op = MW__OP_MAP, .nin = 1, .in = {x}, .type = x->type, .p.map.fn = (int)fn};
    return mw__node_new(g, &proto);
}

mw_tensor *mw_relu(mw_graph *g, mw_tensor *x) { return map(g, "mw_relu", x, MW__F_RELU); }
mw_tensor *mw_tanh(mw_graph *g, mw_tensor *x) { return map(g, "mw_tanh", x, MW__F_TANH); }
mw_tensor *mw_sigmoid(mw_graph *g, mw_tensor *x) { return map(g, "mw_sigmoid", x, MW__F_SIGMOID); }
mw_tensor *mw_exp(mw_graph *g, mw_tensor *x) { return map(g, "mw_exp", x, MW__F_EXP); }
mw_tensor *mw_log(mw_graph *g, mw_tensor *x) { return map(g, "mw_log", x, MW__F_LOG); }
mw_tensor *mw_sqrt(mw_graph *g, mw_tensor *x) { return map(g, "mw_sqrt", x, MW__F_SQRT); }
mw_tensor *mw_abs(mw_graph *g, mw_tensor *x) { return map(g, "mw_abs", x, MW__F_ABS); }

/* The ops below are made of others: a failure among them names the op the caller called first
 * ("mw_maximum: mw_sub: ..."). t is returned; `clean` says the graph had no error before. */
static mw_tensor *named(mw_graph *g, int clean, const char *op, mw_tensor *t) {
    if (!g || !clean || !g->status) return t;
    char msg[sizeof g->error + MW_MAX_NAME];
    snprintf(msg, sizeof msg, "%s: %s", op, g->error);
    snprintf(g->error, sizeof g->error, "%.*s", (int)sizeof g->error - 1, msg);
    mw__error_copy(g->status, g->error);
    return t;
}

static mw_tensor *compare(mw_graph *g, mw_tensor *a, mw_tensor *b, mw_comparison cmp) {
    static const mw__mapfn fn[] = {MW__F_GT0, MW__F_GE0, MW__F_LT0,
                                   MW__F_LE0, MW__F_EQ0, MW__F_NE0};
    /* a - b has the sign of the comparison for every pair of finite floats (a difference of two
     * distinct floats is never rounded to 0), and mw_sub brings the broadcasting and sharding
     * rules. */
    return map(g, "mw_compare", mw_sub(g, a, b), fn[cmp]);
}

static mw_tensor *where(mw_graph *g, mw_tensor *mask, mw_tensor *x, mw_tensor *y) {
    return mw_add(g, y, mw_mul(g, mask, mw_sub(g, x, y)));
}

mw_tensor *mw_compare(mw_graph *g, mw_tensor *a, mw_tensor *b, mw_comparison cmp) {
    if (!g || g->status) return NULL;
    if ((int)cmp < 0 || (int)cmp > (int)MW_NE)
        return mw__graph_fail(g, MW_ERR_INVALID, "mw_compare: unknown comparison %d", (int)cmp);
    return named(g, 1, "mw_compare", compare(g, a, b, cmp));
}

mw_tensor *mw_where(mw_graph *g, mw_tensor *mask, mw_tensor *x, mw_tensor *y) {
    int clean = g && !g->status;
    return named(g, clean, "mw_where", where(g, mask, x, y));
}

/* PyTorch's convention: where a and b tie, each gets half the gradient. */
static mw_tensor *extremum(mw_graph *g, const char *op, mw_tensor *a, mw_tensor *b,
                           mw_comparison cmp) {
    int clean = g && !g->status;
    mw_tensor *m = mw_add(g, compare(g, a, b, cmp), mw_scale(g, compare(g, a, b, MW_EQ), 0.5f));
    return named(g, clean, op, where(g, m, a, b));
}

mw_tensor *mw_maximum(mw_graph *g, mw_tensor *a, mw_tensor *b) {
    return extremum(g, "mw_maximum", a, b, MW_GT);
}
mw_tensor *mw_minimum(mw_graph *g, mw_tensor *a, mw_tensor *b) {
    return extremum(g, "mw_minimum", a, b, MW_LT);
}

/* Index of x's unsharded axis named `axis`, or -1 with the graph error set. */
static int whole_axis(mw_graph *g, const char *op, mw_tensor *x, const char *axis) {
    if (!axis) {
        mw__graph_fail(g, MW_ERR_INVALID, "%s: the axis name is NULL", op);
        return -1;
    }
    int id = mw__graph_find_name(g, axis);
    int i = id < 0 ? -1 : mw__type_find_name(&x->type, id);
    char d[256];
    if (i < 0) {
        mw__graph_fail(g, MW_ERR_AXIS, "%s: no axis named '%s' in %s", op, axis, DESC(x, d));
        return -1;
    }
    if (x->type.ax[i].mesh >= 0) {
        mw__graph_fail(g, MW_ERR_SHARDING,
                       "%s: axis %s of %s is sharded; this op needs the whole axis on every device",
                       op, axis, DESC(x, d));
        return -1;
    }
    return i;
}

static mw_tensor *reduce(mw_graph *g, const char *op, mw_tensor *x, const char *axis, mw__op kind) {
    if (!mw__f32_operand(g, op, x) || !(x = mw__replicated(g, x))) return NULL;
    int i = whole_axis(g, op, x, axis);
    if (i < 0) return NULL;
    mw_tensor proto = {.op = kind, .nin = 1, .in = {x}, .type = x->type, .p.along.axis = i};
    memmove(&proto.type.ax[i], &proto.type.ax[i + 1],
            (size_t)(x->type.rank - i - 1) * sizeof proto.type.ax[0]);
    proto.type.rank--;
    return mw__node_new(g, &proto);
}

mw_tensor *mw_max(mw_graph *g, mw_tensor *x, const char *axis) {
    return reduce(g, "mw_max", x, axis, MW__OP_REDUCE_MAX);
}

mw_tensor *mw_argmax(mw_graph *g, mw_tensor *x, const char *axis) {
    return reduce(g, "mw_argmax", x, axis, MW__OP_ARGMAX);
}

mw_tensor *mw_concat(mw_graph *g, mw_tensor *const *xs, int n, const char *axis) {
    if (!g || g->status) return NULL;
    if (n < 1 || !xs) return mw__graph_fail(g, MW_ERR_INVALID, "mw_concat: no tensors given");
    for (int k = 0; k < n; k++)
        if (!mw__f32_operand(g, "mw_concat", xs[k])) return NULL;
    int i = whole_axis(g, "mw_concat", xs[0], axis);
    if (i < 0) return NULL;
    mw__type t = xs[0]->type;
    t.partial = 0;
    t.ax[i].size = 0;
    for (int k = 0; k < n; k++) {
        const mw__type *tk = &xs[k]->type;
        int j = whole_axis(g, "mw_concat", xs[k], axis);
        if (j < 0) return NULL;
        int same = tk->rank == t.rank;
        for (int a = 0; same && a < tk->rank; a++) {
            if (a == j) continue;
            int at = mw__type_find(&t, &tk->ax[a]);
            same = at >= 0 && at != i && t.ax[at].size == tk->ax[a].size;
        }
        if (!same) {
            char d0[256], dk[256];
            return mw__graph_fail(g, MW_ERR_SHAPE,
                                  "mw_concat: tensor %d %s does not have the axes of tensor 0 %s "
                                  "(all but '%s' must agree)",
                                  k, DESC(xs[k], dk), DESC(xs[0], d0), axis);
        }
        t.ax[i].size += tk->ax[j].size;
    }
    mw_tensor *sum = NULL;
    int64_t start = 0;
    for (int k = 0; k < n; k++) {
        mw__type tk = t;
        int64_t len = xs[k]->type.ax[mw__type_find_name(&xs[k]->type, t.ax[i].name)].size;
        tk.ax[i].size = len;
        mw_tensor *x = mw__to_type(g, mw__replicated(g, xs[k]), &tk); /* into tensor 0's order */
        mw_tensor *placed = mw__slice_node(g, MW__OP_PAD, x, &t, i, start, len);
        sum = sum ? mw_add(g, sum, placed) : placed;
        start += len;
    }
    return sum;
}

mw_tensor *mw_dropout(mw_graph *g, mw_tensor *x, float p, uint64_t seed) {
    if (!mw__f32_operand(g, "mw_dropout", x)) return NULL;
    if (!(p >= 0.0f && p < 1.0f))
        return mw__graph_fail(g, MW_ERR_INVALID, "mw_dropout: p is %g; it must be in [0, 1)", p);
    if (!(x = mw__replicated(g, x))) return NULL;
    /* Each call draws its own mask: the n-th dropout of the graph mixes n into its seed (the
     * first keeps the seed as given), so two calls with one seed do not drop the same elements.
     * Its gradient node copies the mixed seed, and so the mask. */
    uint64_t n = 0;
    for (int i = 0; i < g->nnodes; i++) n += g->nodes[i]->op == MW__OP_DROPOUT;
    uint64_t stream = n ? mw__mix64(seed ^ mw__mix64(n * 0xD6E8FEB86659FD93ull)) : seed;
    mw_tensor proto = {.op = MW__OP_DROPOUT,
                       .nin = 1,
                       .in = {x},
                       .type = x->type,
                       .p.dropout = {.p = p, .stream = stream}};
    return mw__node_new(g, &proto);
}

/* --- gradients -------------------------------------------------------------------------------- */

mw_tensor *mw__backward_math(mw_graph *g, mw_tensor *n, mw_tensor *gy) {
    mw_tensor *x = n->in[0];
    gy = mw__replicated(g, gy);
    if (!gy) return NULL;
    switch (n->op) {
    case MW__OP_MAP: {
        if (n->p.map.fn >= MW__F_GT0) return NULL; /* a comparison: no gradient */
        mw_tensor proto = {
            .op = MW__OP_MAP_GRAD, .nin = 2, .in = {x, gy}, .type = x->type, .p = n->p};
        return mw__node_new(g, &proto);
    }
    case MW__OP_DROPOUT: { /* linear and diagonal: its own adjoint, with the same mask */
        mw_tensor proto = *n;
        proto.in[0] = gy;
        proto.type = gy->type;
        return mw__node_new(g, &proto);
    }
    case MW__OP_REDUCE_MAX: {
        /* The gradient goes to the maxima, split evenly among ties (as torch.amax). */
        mw_tensor *hit = map(g, "mw_max", mw_sub(g, x, n), MW__F_EQ0);
        const char *axis = g->names[x->type.ax[n->p.along.axis].name];
        return mw_mul(g, hit, mw_div(g, gy, mw_sum(g, hit, axis)));
    }
    default: return NULL; /* argmax */
    }
}
