/* The states and cached attention of inference programs: a state is kept between runs of a
 * program and written in place at a row per outer index; cached attention reads keys and values
 * from such a state up to a position. */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/graph_impl.h"

#define DESC(t, buf) mw__type_describe(g, &(t)->type, buf, sizeof buf)

/* Whether a and b have the same axes (names, sizes, sharding) in the same order, skipping axes
 * skip0 and skip1 of a (-1: none). */
static int same_axes_but(const mw__type *a, int skip0, int skip1, const mw__type *b) {
    int j = 0;
    for (int i = 0; i < a->rank; i++) {
        if (i == skip0 || i == skip1) continue;
        if (j >= b->rank || a->ax[i].name != b->ax[j].name || a->ax[i].size != b->ax[j].size ||
            a->ax[i].mesh != b->ax[j].mesh)
            return 0;
        j++;
    }
    return j == b->rank;
}

/* Whether b is a's first n axes. */
static int prefix_axes(const mw__type *a, int n, const mw__type *b) {
    if (b->rank != n) return 0;
    for (int i = 0; i < n; i++)
        if (a->ax[i].name != b->ax[i].name || a->ax[i].size != b->ax[i].size ||
            a->ax[i].mesh != b->ax[i].mesh)
            return 0;
    return 1;
}

static int find_axis(mw_graph *g, const char *op, const mw_tensor *x, const char *axis) {
    if (!axis) {
        mw__graph_fail(g, MW_ERR_INVALID, "%s: the axis name is NULL", op);
        return -1;
    }
    int id = mw__graph_find_name(g, axis);
    int i = id < 0 ? -1 : mw__type_find_name(&x->type, id);
    if (i < 0) {
        char d[256];
        mw__graph_fail(g, MW_ERR_AXIS, "%s: %s has no axis named '%s'", op, DESC(x, d), axis);
    }
    return i;
}

mw_tensor *mw_state_write(mw_graph *g, mw_tensor *state, mw_tensor *value, const char *axis,
                          mw_tensor *index) {
    const char *op = "mw_state_write";
    if (!mw__f32_operand(g, op, state) || !mw__f32_operand(g, op, value)) return NULL;
    if (!index || index->g != g)
        return mw__graph_fail(g, MW_ERR_INVALID, "%s: index is NULL or of another graph", op);
    char d[256], e[256];
    const mw_tensor *root = state;
    while (root->op == MW__OP_STATE_WRITE) root = root->in[0];
    if (root->op != MW__OP_STATE)
        return mw__graph_fail(g, MW_ERR_INVALID, "%s: %s is not a state (mw_state)", op,
                              DESC(state, d));
    /* A state's writes are a chain: each takes the latest version. */
    for (int i = state->id + 1; i < g->nnodes; i++)
        if (g->nodes[i]->op == MW__OP_STATE_WRITE && g->nodes[i]->in[0] == state)
            return mw__graph_fail(g, MW_ERR_INVALID,
                                  "%s: state '%s' was written already; write the latest version "
                                  "(the result of its last mw_state_write)",
                                  op, root->name);
    int a = find_axis(g, op, state, axis);
    if (a < 0) return NULL;
    if (state->type.ax[a].mesh >= 0)
        return mw__graph_fail(g, MW_ERR_SHARDING, "%s: the written axis %s of %s is sharded", op,
                              axis, DESC(state, d));
    if (index->type.dtype != MW_I32)
        return mw__graph_fail(g, MW_ERR_DTYPE, "%s: index %s must be i32", op, DESC(index, d));
    if (!prefix_axes(&state->type, a, &index->type))
        return mw__graph_fail(g, MW_ERR_SHAPE,
                              "%s: index %s must be i32 with the axes of %s before %s, in order",
                              op, DESC(index, d), DESC(state, e), axis);
    if (!(value = mw__replicated(g, value))) return NULL;
    if (!same_axes_but(&state->type, a, -1, &value->type))
        return mw__graph_fail(g, MW_ERR_SHAPE,
                              "%s: value %s must have the axes of %s without %s, in order", op,
                              DESC(value, d), DESC(state, e), axis);
    mw_tensor proto = {.op = MW__OP_STATE_WRITE,
                       .nin = 3,
                       .in = {state, value, index},
                       .type = state->type,
                       .p.along.axis = a};
    return mw__node_new(g, &proto);
}

mw_tensor *mw_attention_cached(mw_graph *g, mw_tensor *q, mw_tensor *kv, const char *part_axis,
                               const char *seq_axis, const char *feature_axis, mw_tensor *pos,
                               float scale) {
    const char *op = "mw_attention_cached";
    if (!mw__f32_operand(g, op, q) || !mw__f32_operand(g, op, kv)) return NULL;
    if (!pos || pos->g != g)
        return mw__graph_fail(g, MW_ERR_INVALID, "%s: pos is NULL or of another graph", op);
    char d[256], e[256];
    int s = find_axis(g, op, kv, seq_axis), p = s < 0 ? -1 : find_axis(g, op, kv, part_axis);
    int f = p < 0 ? -1 : find_axis(g, op, kv, feature_axis);
    if (f < 0) return NULL;
    if (p != s + 1 || f != kv->type.rank - 1 || kv->type.ax[p].size != 2)
        return mw__graph_fail(g, MW_ERR_SHAPE,
                              "%s: kv %s must hold [batch axes..., %s, %s=2 (keys, values), head "
                              "axes..., %s]",
                              op, DESC(kv, d), seq_axis, part_axis, feature_axis);
    if (kv->type.ax[s].mesh >= 0 || kv->type.ax[p].mesh >= 0 || kv->type.ax[f].mesh >= 0)
        return mw__graph_fail(g, MW_ERR_SHARDING,
                              "%s: the %s, %s and %s axes of %s must not be sharded", op, seq_axis,
                              part_axis, feature_axis, DESC(kv, d));
    if (pos->type.dtype != MW_I32)
        return mw__graph_fail(g, MW_ERR_DTYPE, "%s: pos %s must be i32", op, DESC(pos, d));
    if (!prefix_axes(&kv->type, s, &pos->type))
        return mw__graph_fail(g, MW_ERR_SHAPE,
                              "%s: pos %s must be i32 with the axes of %s before %s, in order", op,
                              DESC(pos, d), DESC(kv, e), seq_axis);
    if (!(q = mw__replicated(g, q)) || !(kv = mw__replicated(g, kv))) return NULL;
    /* Grouped queries: one more axis in q, right before the feature axis (the queries of a
     * key/value head, as mw_attention_grouped's output has them). */
    mw__type qt = q->type;
    int64_t group = 1;
    if (qt.rank == kv->type.rank - 1 && qt.rank >= 2) {
        group = qt.ax[qt.rank - 2].size;
        qt.ax[qt.rank - 2] = qt.ax[qt.rank - 1];
        qt.rank--;
    }
    if (!same_axes_but(&kv->type, s, p, &qt) ||
        (group > 1 && q->type.ax[q->type.rank - 2].mesh >= 0))
        return mw__graph_fail(g, MW_ERR_SHAPE,
                              "%s: q %s must have the axes of kv %s without %s and %s, in order "
                              "(grouped queries: and an unsplit group axis before %s)",
                              op, DESC(q, d), DESC(kv, e), seq_axis, part_axis, feature_axis);
    mw_tensor proto = {.op = MW__OP_ATTENTION_CACHED,
                       .nin = 3,
                       .in = {q, kv, pos},
                       .type = q->type,
                       .p.cached = {.seq = s, .part = p, .scale = scale}};
    return mw__node_new(g, &proto);
}
