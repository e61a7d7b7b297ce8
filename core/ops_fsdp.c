/* Parameters split over the axis that also shards the batch (FSDP, ZeRO-3): a parameter whose
 * axis is labelled Embed@X is stored as each device's rows of it, and wherever an op meets it with
 * that axis whole (or with X splitting another axis, as Batch@X) the rule gathers it first: a
 * GATHER node, the parameter whole on every device. Its adjoint is SCATTER: the gradient of the
 * whole parameter, partial over X since the batch is, summed over the devices along X and cut back
 * to each device's rows (a reduce-scatter). No value changes: the gathered parameter is the whole
 * one, and the reduce-scatter gives each device the bits the all-reduce would. */
#include "core/graph_impl.h"

/* Whether x is a parameter, or an alias (rename, split, merge) of one. */
static int param_backed(const mw_tensor *x) {
    while (x->op == MW__OP_ALIAS) x = x->in[0];
    return x->op == MW__OP_PARAM;
}

/* Whether other needs x's axis i whole: it has that axis unsplit, or splits another axis over the
 * same mesh axis (a device then holds some rows of both, which no op can pair). */
static int needs_whole(const mw_tensor *x, int i, const mw_tensor *other) {
    const mw__axis *a = &x->type.ax[i];
    if (!other) return 1;
    for (int j = 0; j < other->type.rank; j++) {
        const mw__axis *b = &other->type.ax[j];
        if (b->name == a->name && b->mesh < 0) return 1;
        if (b->name != a->name && b->mesh == a->mesh) return 1;
    }
    return 0;
}

mw_tensor *mw__gathered(mw_graph *g, mw_tensor *x, const mw_tensor *other) {
    if (!x || !param_backed(x)) return x;
    for (int i = 0; i < x->type.rank; i++) {
        if (x->type.ax[i].mesh < 0 || !needs_whole(x, i, other)) continue;
        /* One gather per parameter and axis, whatever the number of uses: the gradients of its
         * uses add up before the one reduce-scatter, in the order the replicated parameter's
         * would before its all-reduce. */
        mw_tensor *same = NULL;
        for (int j = g->nnodes - 1; j > x->id && !same; j--)
            if (g->nodes[j]->op == MW__OP_GATHER && g->nodes[j]->in[0] == x &&
                g->nodes[j]->p.along.axis == i)
                same = g->nodes[j];
        if (same) {
            x = same;
            continue;
        }
        mw_tensor proto = {
            .op = MW__OP_GATHER, .nin = 1, .in = {x}, .type = x->type, .p.along.axis = i};
        proto.type.ax[i].mesh = -1;
        if (!(x = mw__node_new(g, &proto))) return NULL;
    }
    return x;
}

mw_tensor *mw__scatter(mw_graph *g, mw_tensor *gy, const mw__type *t, int i) {
    if (!gy) return NULL;
    mw_tensor proto = {.op = MW__OP_SCATTER, .nin = 1, .in = {gy}, .type = mw__grad_type(t)};
    proto.p.along.axis = i;
    proto.type.partial = gy->type.partial & ~(1u << t->ax[i].mesh);
    return mw__node_new(g, &proto);
}
