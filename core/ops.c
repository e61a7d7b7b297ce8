/* The op rules: every op checks its operands by axis name, decides the result's axes and
 * sharding, and applies the SPMD rules: a reduction over a sharded axis leaves a partial sum, which
 * linear ops carry along and every other op first all-reduces. */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/graph_impl.h"

#define DESC(t, buf) mw__type_describe(g, &(t)->type, buf, sizeof buf)

/* Common entry checks: a usable graph, non-NULL operands from this graph, f32 data (or, for a
 * contraction, bf16 in both). */
static int check_operands(mw_graph *g, const char *op, mw_tensor *a, mw_tensor *b, int nin) {
    if (!g || g->status) return -1;
    if (!a || (nin == 2 && !b)) {
        mw__graph_fail(g, MW_ERR_INVALID, "%s: operand is NULL", op);
        return -1;
    }
    if (a->g != g || (nin == 2 && b->g != g)) {
        mw__graph_fail(g, MW_ERR_INVALID, "%s: operand belongs to another graph", op);
        return -1;
    }
    int contraction = strcmp(op, "mw_dot") == 0 || strcmp(op, "mw_contract") == 0;
    mw_tensor *odd = a->type.dtype != MW_F32 ? a : nin == 2 && b->type.dtype != MW_F32 ? b : NULL;
    if (odd && contraction && a->type.dtype == MW_BF16 && b->type.dtype == MW_BF16) odd = NULL;
    if (odd) {
        char d[256];
        if (contraction && (a->type.dtype == MW_BF16 || b->type.dtype == MW_BF16))
            mw__graph_fail(g, MW_ERR_DTYPE,
                           "%s: %s %s is %s but the other operand is not; contract two bf16 "
                           "tensors or two f32 ones (mw_cast one of them)",
                           op, odd == a ? "a" : "b", DESC(odd, d), mw__dtype_name(odd->type.dtype));
        else
            mw__graph_fail(g, MW_ERR_DTYPE, "%s: %s %s is %s; only f32 operands are supported%s",
                           op, odd == a ? "a" : "b", DESC(odd, d), mw__dtype_name(odd->type.dtype),
                           odd->type.dtype == MW_BF16
                               ? " (bf16 only by mw_dot, mw_contract and mw_attention: mw_cast it "
                                 "to f32 first)"
                               : "");
        return -1;
    }
    return 0;
}

/* An axis of x that has the same base name as `a` but other sharding is the error the design
 * promises to explain: which axes met, and what to shard. */
static int check_sharding(mw_graph *g, const char *op, mw_tensor *x, const char *xn, mw_tensor *y,
                          const char *yn) {
    for (int i = 0; i < x->type.rank; i++) {
        int j = mw__type_find_name(&y->type, x->type.ax[i].name);
        if (j < 0 || y->type.ax[j].mesh == x->type.ax[i].mesh) continue;
        const mw__axis *sx = &x->type.ax[i], *sy = &y->type.ax[j];
        char lx[2 * MW_MAX_NAME], ly[2 * MW_MAX_NAME], dx[256], dy[256];
        mw__axis_label(g, sx, lx, sizeof lx);
        mw__axis_label(g, sy, ly, sizeof ly);
        const mw__axis *sharded = sx->mesh >= 0 ? sx : sy;
        const char *other = sx->mesh >= 0 ? yn : xn;
        if (sx->mesh >= 0 && sy->mesh >= 0)
            mw__graph_fail(g, MW_ERR_SHARDING,
                           "%s: axis %s of %s %s meets axis %s of %s %s: the same axis is sharded "
                           "over different mesh axes",
                           op, lx, xn, DESC(x, dx), ly, yn, DESC(y, dy));
        else
            mw__graph_fail(g, MW_ERR_SHARDING,
                           "%s: axis %s of %s %s meets axis %s of %s %s: sharded and unsharded "
                           "tensors do not mix implicitly; shard %s too with mw_shard(g, %s, "
                           "\"%s\", \"%s\")",
                           op, lx, xn, DESC(x, dx), ly, yn, DESC(y, dy), other, other,
                           g->names[sharded->name], g->mesh_names[sharded->mesh]);
        return -1;
    }
    return 0;
}

static int check_sizes(mw_graph *g, const char *op, mw_tensor *a, mw_tensor *b) {
    for (int i = 0; i < a->type.rank; i++) {
        int j = mw__type_find(&b->type, &a->type.ax[i]);
        if (j >= 0 && b->type.ax[j].size != a->type.ax[i].size) {
            char da[256], db[256], l[2 * MW_MAX_NAME];
            mw__graph_fail(g, MW_ERR_SHAPE, "%s: axis %s has size %lld in a %s but %lld in b %s",
                           op, mw__axis_label(g, &a->type.ax[i], l, sizeof l),
                           (long long)a->type.ax[i].size, DESC(a, da),
                           (long long)b->type.ax[j].size, DESC(b, db));
            return -1;
        }
    }
    return 0;
}

static int subset(const mw__type *x, const mw__type *y) {
    for (int i = 0; i < x->rank; i++)
        if (mw__type_find(y, &x->ax[i]) < 0) return 0;
    return 1;
}

mw_tensor *mw__replicated(mw_graph *g, mw_tensor *x) {
    if (!x || !x->type.partial) return x;
    mw_tensor proto = {.op = MW__OP_ALLREDUCE, .nin = 1, .in = {x}, .type = x->type};
    proto.type.partial = 0;
    return mw__node_new(g, &proto);
}

static mw_tensor *binary(mw_graph *g, mw__op op, const char *name, mw_tensor *a, mw_tensor *b) {
    if (check_operands(g, name, a, b, 2)) return NULL;
    if (!(a = mw__gathered(g, a, b)) || !(b = mw__gathered(g, b, a))) return NULL;
    if (check_sharding(g, name, a, "a", b, "b") || check_sizes(g, name, a, b)) return NULL;
    int a_in_b = subset(&a->type, &b->type), b_in_a = subset(&b->type, &a->type);
    if (!a_in_b && !b_in_a) {
        char da[256], db[256];
        return mw__graph_fail(g, MW_ERR_SHAPE,
                              "%s: axes of a %s and b %s do not match, and neither set is a "
                              "subset of the other (so neither can broadcast)",
                              name, DESC(a, da), DESC(b, db));
    }
    /* Sums of partial sums stay partial (the all-reduce commutes with them); anything else needs
     * the true values first. */
    int linear = (op == MW__OP_ADD || op == MW__OP_SUB) && a->type.partial &&
                 a->type.partial == b->type.partial;
    if (!linear) {
        a = mw__replicated(g, a);
        b = mw__replicated(g, b);
        if (!a || !b) return NULL;
    }
    mw_tensor proto = {.op = op, .nin = 2, .in = {a, b}};
    proto.type = b_in_a ? a->type : b->type;
    return mw__node_new(g, &proto);
}

mw_tensor *mw_add(mw_graph *g, mw_tensor *a, mw_tensor *b) {
    return binary(g, MW__OP_ADD, "mw_add", a, b);
}
mw_tensor *mw_sub(mw_graph *g, mw_tensor *a, mw_tensor *b) {
    return binary(g, MW__OP_SUB, "mw_sub", a, b);
}
mw_tensor *mw_mul(mw_graph *g, mw_tensor *a, mw_tensor *b) {
    return binary(g, MW__OP_MUL, "mw_mul", a, b);
}
mw_tensor *mw_div(mw_graph *g, mw_tensor *a, mw_tensor *b) {
    return binary(g, MW__OP_DIV, "mw_div", a, b);
}

mw_tensor *mw_scale(mw_graph *g, mw_tensor *x, float factor) {
    if (check_operands(g, "mw_scale", x, NULL, 1)) return NULL;
    mw_tensor proto = {
        .op = MW__OP_SCALE, .nin = 1, .in = {x}, .type = x->type, .p.scale.factor = factor};
    return mw__node_new(g, &proto);
}

mw_tensor *mw__cast(mw_graph *g, mw_tensor *x, mw_dtype dtype) {
    if (!x || x->type.dtype == dtype) return x;
    x = mw__replicated(g, x); /* rounding is not linear: the true values first */
    if (!x) return NULL;
    mw_tensor proto = {.op = MW__OP_CAST, .nin = 1, .in = {x}, .type = x->type};
    proto.type.dtype = dtype;
    return mw__node_new(g, &proto);
}

mw_tensor *mw_cast(mw_graph *g, mw_tensor *x, mw_dtype dtype) {
    if (!g || g->status) return NULL;
    if (!x) return mw__graph_fail(g, MW_ERR_INVALID, "mw_cast: operand is NULL");
    if (x->g != g)
        return mw__graph_fail(g, MW_ERR_INVALID, "mw_cast: operand belongs to another graph");
    int ok = (x->type.dtype == MW_F32 || x->type.dtype == MW_BF16) &&
             (dtype == MW_F32 || dtype == MW_BF16);
    if (!ok) {
        char d[256];
        return mw__graph_fail(g, MW_ERR_DTYPE, "mw_cast: %s to %s: only f32 and bf16 convert",
                              DESC(x, d), mw__dtype_name(dtype));
    }
    return mw__cast(g, x, dtype);
}

mw_tensor *mw__fill(mw_graph *g, const mw__type *type, float value) {
    mw_tensor proto = {.op = MW__OP_FILL, .type = *type, .p.fill.value = value};
    proto.type.partial = 0;
    return mw__node_new(g, &proto);
}

mw_tensor *mw__permute(mw_graph *g, mw_tensor *x, const mw__type *target) {
    if (!x) return NULL;
    mw_tensor proto = {.op = MW__OP_PERMUTE, .nin = 1, .in = {x}, .type = *target};
    proto.type.partial = x->type.partial;
    return mw__node_new(g, &proto);
}

mw_tensor *mw__broadcast(mw_graph *g, mw_tensor *x, const mw__type *target) {
    if (!x) return NULL;
    mw_tensor proto = {.op = MW__OP_BROADCAST, .nin = 1, .in = {x}, .type = *target};
    proto.type.partial = x->type.partial;
    return mw__node_new(g, &proto);
}

/* x summed over the axes `keep` lacks; the result keeps x's order of the remaining axes. */
static mw_tensor *sum_except(mw_graph *g, mw_tensor *x, const mw__type *keep) {
    mw_tensor proto = {.op = MW__OP_SUM, .nin = 1, .in = {x}};
    proto.type.dtype = x->type.dtype;
    proto.type.partial = x->type.partial;
    for (int i = 0; i < x->type.rank; i++) {
        const mw__axis *a = &x->type.ax[i];
        if (mw__type_find(keep, a) >= 0)
            proto.type.ax[proto.type.rank++] = *a;
        else if (a->mesh >= 0)
            proto.type.partial |= 1u << a->mesh; /* the SPMD rule: a sharded sum is partial */
    }
    return mw__node_new(g, &proto);
}

mw_tensor *mw__sum_to(mw_graph *g, mw_tensor *x, const mw__type *target) {
    return x ? sum_except(g, x, target) : NULL;
}

static int same_order(const mw__type *a, const mw__type *b) {
    if (a->rank != b->rank) return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->ax[i].name != b->ax[i].name || a->ax[i].mesh != b->ax[i].mesh) return 0;
    return 1;
}

mw_tensor *mw__to_type(mw_graph *g, mw_tensor *x, const mw__type *target) {
    if (!x) return NULL;
    if (!subset(&x->type, target)) x = sum_except(g, x, target);
    if (!x || same_order(&x->type, target)) return x;
    return x->type.rank < target->rank ? mw__broadcast(g, x, target) : mw__permute(g, x, target);
}

mw_tensor *mw__contract_to(mw_graph *g, mw_tensor *a, mw_tensor *b, const mw__type *out) {
    if (!a || !b) return NULL;
    a = mw__replicated(g, a);
    b = mw__replicated(g, b);
    /* A gradient (f32) meeting a bf16 operand in the backward pass is multiplied in bf16. */
    if (a && b && a->type.dtype != b->type.dtype) {
        a = mw__cast(g, a, MW_BF16);
        b = mw__cast(g, b, MW_BF16);
    }
    if (!a || !b) return NULL;
    /* Products are summed in f32, also of bf16 operands. */
    mw_tensor proto = {.op = MW__OP_CONTRACT, .nin = 2, .in = {a, b}, .type = mw__grad_type(out)};
    proto.type.partial = 0;
    for (int i = 0; i < a->type.rank; i++) {
        const mw__axis *ax = &a->type.ax[i];
        if (mw__type_find(out, ax) < 0 && ax->mesh >= 0) proto.type.partial |= 1u << ax->mesh;
    }
    return mw__node_new(g, &proto);
}

/* Validates a contraction of a and b into `out` (axes already resolved). */
static mw_tensor *contract_checked(mw_graph *g, const char *op, mw_tensor *a, mw_tensor *b,
                                   const mw__type *out) {
    char da[256], db[256], l[2 * MW_MAX_NAME];
    for (int k = 0; k < 2; k++) {
        mw_tensor *x = k ? b : a, *y = k ? a : b;
        for (int i = 0; i < x->type.rank; i++) {
            const mw__axis *ax = &x->type.ax[i];
            if (mw__type_find(out, ax) < 0 && mw__type_find(&y->type, ax) < 0)
                return mw__graph_fail(g, MW_ERR_AXIS,
                                      "%s: axis %s of %s %s is neither in the result nor in %s "
                                      "%s, so it cannot be contracted",
                                      op, mw__axis_label(g, ax, l, sizeof l), k ? "b" : "a",
                                      DESC(x, da), k ? "a" : "b", DESC(y, db));
        }
    }
    return mw__contract_to(g, a, b, out);
}

mw_tensor *mw_dot(mw_graph *g, mw_tensor *a, mw_tensor *b, const char *axis) {
    if (check_operands(g, "mw_dot", a, b, 2)) return NULL;
    if (!axis) return mw__graph_fail(g, MW_ERR_INVALID, "mw_dot: the axis name is NULL");
    char da[256], db[256];
    int name = mw__graph_find_name(g, axis);
    int ka = name < 0 ? -1 : mw__type_find_name(&a->type, name);
    int kb = name < 0 ? -1 : mw__type_find_name(&b->type, name);
    if (ka < 0 || kb < 0)
        return mw__graph_fail(g, MW_ERR_AXIS, "mw_dot: no axis named '%s' in %s %s", axis,
                              ka < 0 ? "a" : "b", ka < 0 ? DESC(a, da) : DESC(b, db));
    if (!(a = mw__gathered(g, a, b)) || !(b = mw__gathered(g, b, a))) return NULL;
    if (check_sharding(g, "mw_dot", a, "a", b, "b") || check_sizes(g, "mw_dot", a, b)) return NULL;
    mw__type out = {.dtype = MW_F32};
    /* Shared axes once (a's order), then a's own, then b's own. */
    for (int pass = 0; pass < 3; pass++) {
        const mw__type *src = pass < 2 ? &a->type : &b->type;
        for (int i = 0; i < src->rank; i++) {
            const mw__axis *ax = &src->ax[i];
            if (ax->name == name) continue;
            int in_other = mw__type_find(pass < 2 ? &b->type : &a->type, ax) >= 0;
            if ((pass == 0 && !in_other) || (pass == 1 && in_other) || (pass == 2 && in_other))
                continue;
            if (out.rank == MW_MAX_RANK)
                return mw__graph_fail(g, MW_ERR_SHAPE, "mw_dot: result has more than %d axes",
                                      MW_MAX_RANK);
            out.ax[out.rank++] = *ax;
        }
    }
    return mw__contract_to(g, a, b, &out);
}

/* Splits "A,B" into interned-name lookups; returns the count or -1 (graph error set). */
static int parse_names(mw_graph *g, const char *op, const char *list, const mw_tensor *x,
                       int names[MW_MAX_RANK]) {
    int n = 0;
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char nm[MW_MAX_NAME];
        if (len == 0 || len >= sizeof nm || n == MW_MAX_RANK) {
            mw__graph_fail(g, MW_ERR_AXIS, "%s: malformed axis list '%s'", op, list);
            return -1;
        }
        memcpy(nm, p, len);
        nm[len] = '\0';
        int id = mw__graph_find_name(g, nm);
        if (x && (id < 0 || mw__type_find_name(&x->type, id) < 0)) {
            char d[256];
            mw__graph_fail(g, MW_ERR_AXIS, "%s: no axis named '%s' in %s", op, nm,
                           mw__type_describe(g, &x->type, d, sizeof d));
            return -1;
        }
        if (id < 0) {
            mw__graph_fail(g, MW_ERR_AXIS, "%s: no axis named '%s' in either operand", op, nm);
            return -1;
        }
        for (int j = 0; j < n; j++)
            if (names[j] == id) {
                mw__graph_fail(g, MW_ERR_AXIS, "%s: axis '%s' named twice in '%s'", op, nm, list);
                return -1;
            }
        names[n++] = id;
        p = e ? e + 1 : p + len;
    }
    return n;
}

mw_tensor *mw_contract(mw_graph *g, mw_tensor *a, mw_tensor *b, const char *out_axes) {
    if (check_operands(g, "mw_contract", a, b, 2)) return NULL;
    if (!out_axes)
        return mw__graph_fail(g, MW_ERR_INVALID,
                              "mw_contract: out_axes is NULL (\"\" asks for a scalar)");
    if (!(a = mw__gathered(g, a, b)) || !(b = mw__gathered(g, b, a))) return NULL;
    if (check_sharding(g, "mw_contract", a, "a", b, "b") || check_sizes(g, "mw_contract", a, b))
        return NULL;
    int names[MW_MAX_RANK];
    int n = parse_names(g, "mw_contract", out_axes, NULL, names);
    if (n < 0) return NULL;
    mw__type out = {.dtype = MW_F32, .rank = n};
    for (int i = 0; i < n; i++) {
        int j = mw__type_find_name(&a->type, names[i]);
        const mw__axis *ax = j >= 0 ? &a->type.ax[j] : NULL;
        if (!ax) {
            j = mw__type_find_name(&b->type, names[i]);
            ax = j >= 0 ? &b->type.ax[j] : NULL;
        }
        if (!ax)
            return mw__graph_fail(g, MW_ERR_AXIS,
                                  "mw_contract: result axis '%s' is in neither "
                                  "operand",
                                  g->names[names[i]]);
        out.ax[i] = *ax;
    }
    return contract_checked(g, "mw_contract", a, b, &out);
}

mw_tensor *mw_permute(mw_graph *g, mw_tensor *x, const char *order) {
    if (check_operands(g, "mw_permute", x, NULL, 1)) return NULL;
    if (!order) return mw__graph_fail(g, MW_ERR_INVALID, "mw_permute: order is NULL");
    int names[MW_MAX_RANK];
    int n = parse_names(g, "mw_permute", order, x, names);
    if (n < 0) return NULL;
    if (n != x->type.rank) {
        char d[256];
        return mw__graph_fail(g, MW_ERR_AXIS,
                              "mw_permute: '%s' names %d axes but %s has %d: name every axis once",
                              order, n, mw__type_describe(g, &x->type, d, sizeof d), x->type.rank);
    }
    mw__type target = x->type;
    int same = 1;
    for (int i = 0; i < n; i++) {
        int j = mw__type_find_name(&x->type, names[i]);
        target.ax[i] = x->type.ax[j];
        same &= j == i;
    }
    return same ? x : mw__permute(g, x, &target);
}

static mw_tensor *reduce(mw_graph *g, const char *op, mw_tensor *x, const char *axes, int mean) {
    if (check_operands(g, op, x, NULL, 1)) return NULL;
    mw__type keep = x->type;
    double count = 1;
    if (axes) {
        int names[MW_MAX_RANK];
        int n = parse_names(g, op, axes, x, names);
        if (n < 0) return NULL;
        keep.rank = 0;
        for (int i = 0; i < x->type.rank; i++) {
            int drop = 0;
            for (int j = 0; j < n; j++) drop |= x->type.ax[i].name == names[j];
            if (drop)
                count *= (double)x->type.ax[i].size;
            else
                keep.ax[keep.rank++] = x->type.ax[i];
        }
    } else {
        keep.rank = 0;
        count = (double)mw__type_numel(&x->type);
    }
    mw_tensor *s = sum_except(g, x, &keep);
    /* mean divides by the global count, so sharded and single-device runs agree. */
    return mean ? mw_scale(g, s, (float)(1.0 / count)) : s;
}

mw_tensor *mw_sum(mw_graph *g, mw_tensor *x, const char *axes) {
    return reduce(g, "mw_sum", x, axes, 0);
}

mw_tensor *mw_mean(mw_graph *g, mw_tensor *x, const char *axes) {
    return reduce(g, "mw_mean", x, axes, 1);
}
