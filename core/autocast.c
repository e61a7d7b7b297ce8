/* Mixed precision as a graph transform: bf16 casts in front of the contractions and attentions. */
#include "core/autocast.h"

#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

/* Whether input k of node t is read in bf16 under the policy. */
static int cast_input(const mw_tensor *t, int k) {
    if (t->op == MW__OP_CONTRACT)
        return t->in[0]->type.dtype == MW_F32 && t->in[1]->type.dtype == MW_F32;
    return t->op == MW__OP_ATTENTION && k == 0 && t->in[0]->type.dtype == MW_F32;
}

mw_status mw__autocast_bf16(mw_graph *g) {
    int n = g->nnodes;
    mw_tensor **orig = mw__malloc((size_t)(n + 1) * sizeof *orig);
    mw_tensor **cast_of = mw__calloc((size_t)n + 1, sizeof *cast_of);
    /* Every node, casts included, in the new order; the nodes made while casting (the cast, and
     * an all-reduce in front of it were its input partial: at most two per input) go right
     * before the reader. */
    mw_tensor **order = mw__malloc((size_t)(5 * n + 1) * sizeof *order);
    if (!orig || !cast_of || !order) {
        mw__free(orig);
        mw__free(cast_of);
        mw__free(order);
        return mw__error(MW_ERR_NOMEM, "out of memory applying the bf16 precision policy");
    }
    memcpy(orig, g->nodes, (size_t)n * sizeof *orig);
    int m = 0, made = n;
    for (int i = 0; i < n && g->status == MW_OK; i++) {
        mw_tensor *t = orig[i];
        int want[3] = {0};
        for (int k = 0; k < t->nin; k++) want[k] = cast_input(t, k);
        for (int k = 0; k < t->nin; k++) {
            mw_tensor *x = t->in[k];
            if (!want[k]) continue;
            if (!cast_of[x->id] && !(cast_of[x->id] = mw__cast(g, x, MW_BF16))) break;
            /* A cast belongs to its reader's recomputation region, unless it is a parameter's
             * (the optimizer writes those: nothing to recompute). */
            const mw_tensor *src = x;
            while (src->op == MW__OP_ALIAS) src = src->in[0];
            for (; made < g->nnodes; made++) {
                g->nodes[made]->region = src->op == MW__OP_PARAM ? 0 : t->region;
                order[m++] = g->nodes[made];
            }
            t->in[k] = cast_of[x->id];
        }
        order[m++] = t;
    }
    if (g->status == MW_OK) {
        for (int j = 0; j < m; j++) {
            g->nodes[j] = order[j];
            order[j]->id = j;
        }
    }
    mw__free(orig);
    mw__free(cast_of);
    mw__free(order);
    return g->status ? mw__error_copy(g->status, g->error) : MW_OK;
}
