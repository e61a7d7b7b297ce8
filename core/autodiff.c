/* Reverse-mode autodiff as a graph transform: walks the forward nodes backwards and appends, for
 * each, the ops of its vector-Jacobian product. Gradients reaching a node from several uses are
 * summed. The backward ops go through the same rules as the forward ones, so the SPMD rules place
 * the collectives of the backward pass too (a parameter's gradient built from sharded activations
 * comes out partial: the trainer all-reduces it in buckets). With a recomputation policy the
 * rules read a region's values through val(): a copy of the forward node, made on first use. */
#include <stdlib.h>

#include "core/alloc.h"
#include "core/autodiff.h"
#include "core/error.h"
#include "core/graph_impl.h"

/* grads[id] += contribution, with the contribution first brought to the node's own axes (in f32,
 * the dtype of every gradient). */
static int accumulate(mw_graph *g, mw_tensor **grads, mw_tensor *node, mw_tensor *contrib) {
    if (!contrib) return -1;
    mw__type t = mw__grad_type(&node->type);
    contrib = mw__to_type(g, contrib, &t);
    if (!contrib) return -1;
    if (!grads[node->id]) {
        grads[node->id] = contrib;
        return 0;
    }
    grads[node->id] = mw_add(g, grads[node->id], contrib);
    return grads[node->id] ? 0 : -1;
}

/* Recomputation: per node of the forward graph, whether the backward reads it as the forward
 * made it, and its copy once made. */
typedef struct recompute {
    int n;             /* forward nodes (the graph's nodes before autodiff) */
    int regions;       /* the policy recomputes regions */
    int regather;      /* FSDP: a gathered parameter is gathered again where backward reads it */
    char *keep;        /* 1: read as made in forward */
    mw_tensor **clone; /* the recomputed copy, or NULL */
} recompute;

/* The value of forward node x as the backward reads it: x itself, or its recomputed copy (whose
 * inputs are recomputed copies in turn, down to the region's kept nodes and inputs). NULL on
 * OOM (graph error set). */
static mw_tensor *val(mw_graph *g, recompute *rc, mw_tensor *x) {
    if (!rc || !x || x->id >= rc->n) return x;
    int again = x->op == MW__OP_GATHER ? rc->regather || (rc->regions && x->region)
                                       : rc->regions && x->region;
    if (!again || rc->keep[x->id]) return x;
    if (rc->clone[x->id]) return rc->clone[x->id];
    mw_tensor proto = *x;
    proto.region = 0;
    for (int k = 0; k < x->nin; k++)
        if (!(proto.in[k] = val(g, rc, x->in[k]))) return NULL;
    return rc->clone[x->id] = mw__node_new(g, &proto);
}

/* x through the aliases it is a view of. */
static const mw_tensor *unalias(const mw_tensor *x) {
    while (x->op == MW__OP_ALIAS) x = x->in[0];
    return x;
}

/* Which region nodes the policy keeps: leaves, whatever is read outside its region (the
 * region's outputs), and with DOTS the contractions, attentions and the adds of a kept
 * contraction or add (which a GEMM writes itself: plan_fuse.c; recomputing the add alone would
 * leave the kernel a second reader and the forward unfused), and the casts of kept values. */
static void choose_kept(const mw_graph *g, recompute *rc, mw__recompute policy) {
    for (int i = 0; i < rc->n; i++) {
        const mw_tensor *t = g->nodes[i];
        mw__op op = t->op;
        for (int k = 0; k < t->nin; k++)
            if (t->in[k]->region != t->region) rc->keep[t->in[k]->id] = 1;
        if (!t->region) continue;
        rc->keep[i] |= op == MW__OP_INPUT || op == MW__OP_PARAM || op == MW__OP_SHARD ||
                       op == MW__OP_FILL || op == MW__OP_STATE;
        if (policy == MW__RECOMPUTE_DOTS) {
            rc->keep[i] |= (mw__op_traits(op) & MW__T_DOT) != 0;
            /* A bf16 cast of a kept value is kept too: recomputing it would read the value a
             * second time, which then could not be written in bf16 alone (plan_fuse.c). */
            const mw_tensor *src = op == MW__OP_CAST ? unalias(t->in[0]) : NULL;
            rc->keep[i] |= src && src->region == t->region && rc->keep[src->id];
            for (int k = 0; op == MW__OP_ADD && k < 2; k++) {
                const mw_tensor *y = unalias(t->in[k]);
                rc->keep[i] |= y->region == t->region && rc->keep[y->id] &&
                               (y->op == MW__OP_CONTRACT || y->op == MW__OP_ADD);
            }
        }
    }
}

static int backward_node(mw_graph *g, mw_tensor *n, mw_tensor *gy, mw_tensor **grads,
                         const char *needs, recompute *rc) {
#define V(x) val(g, rc, (x))
    mw_tensor *a = n->nin > 0 ? n->in[0] : NULL, *b = n->nin > 1 ? n->in[1] : NULL;
    int na = a && needs[a->id], nb = b && needs[b->id];
    switch (n->op) {
    case MW__OP_INPUT:
    case MW__OP_PARAM:
    case MW__OP_SHARD:
    case MW__OP_FILL:
    case MW__OP_STATE: return 0;
    case MW__OP_STATE_WRITE:
    case MW__OP_ATTENTION_CACHED:
        mw__graph_fail(g, MW_ERR_UNSUPPORTED, "%s has no gradient (inference programs only)",
                       mw__op_name(n->op));
        return -1;
    case MW__OP_ADD:
        if (na && accumulate(g, grads, a, gy)) return -1;
        if (nb && accumulate(g, grads, b, gy)) return -1;
        return 0;
    case MW__OP_SUB:
        if (na && accumulate(g, grads, a, gy)) return -1;
        if (nb && accumulate(g, grads, b, mw_scale(g, gy, -1.0f))) return -1;
        return 0;
    case MW__OP_MUL:
        if (na && accumulate(g, grads, a, mw_mul(g, gy, V(b)))) return -1;
        if (nb && accumulate(g, grads, b, mw_mul(g, gy, V(a)))) return -1;
        return 0;
    case MW__OP_DIV:
        /* d(a/b)/da = 1/b; d(a/b)/db = -(a/b)/b */
        if (na && accumulate(g, grads, a, mw_div(g, gy, V(b)))) return -1;
        if (nb && accumulate(g, grads, b, mw_scale(g, mw_div(g, mw_mul(g, gy, V(n)), V(b)), -1.0f)))
            return -1;
        return 0;
    case MW__OP_SCALE: return na ? accumulate(g, grads, a, mw_scale(g, gy, n->p.scale.factor)) : 0;
    case MW__OP_PERMUTE:
    case MW__OP_BROADCAST:
    case MW__OP_SUM:
    case MW__OP_ALLREDUCE:
    case MW__OP_CAST: /* the gradient passes in f32: a cast to bf16 does not round it */
        /* Linear reshapes of the data: the gradient is the adjoint reshape, which accumulate()'s
         * conversion to a's axes performs (sum for broadcast, broadcast for sum). For an
         * all-reduce, every device's share receives the whole (replicated) gradient. */
        return na ? accumulate(g, grads, a, gy) : 0;
    case MW__OP_CONTRACT:
        /* out = sum_K a*b; da = sum over b's own axes of gy*b, expressed as a contraction into
         * a's axes, and likewise for b. Of bf16 operands, gy is multiplied in bf16 too (one
         * rounding of it serves both products). */
        if (a->type.dtype == MW_BF16 && (na || nb)) gy = mw__cast(g, gy, MW_BF16);
        if (na && accumulate(g, grads, a, V(b) ? mw__contract_to(g, gy, V(b), &a->type) : NULL))
            return -1;
        if (nb && accumulate(g, grads, b, V(a) ? mw__contract_to(g, gy, V(a), &b->type) : NULL))
            return -1;
        return 0;
    case MW__OP_ALIAS: {
        /* The same data under a's axes. */
        mw_tensor proto = {
            .op = MW__OP_ALIAS, .nin = 1, .in = {gy}, .type = mw__grad_type(&a->type)};
        proto.type.partial = gy->type.partial;
        return na ? accumulate(g, grads, a, mw__node_new(g, &proto)) : 0;
    }
    case MW__OP_SLICE:
    case MW__OP_PAD: {
        mw__type ta = mw__grad_type(&a->type);
        return na ? accumulate(g, grads, a,
                               mw__slice_node(g, n->op == MW__OP_SLICE ? MW__OP_PAD : MW__OP_SLICE,
                                              gy, &ta, n->p.slice.axis, n->p.slice.start,
                                              n->p.slice.len))
                  : 0;
    }
    case MW__OP_GELU:
        return na ? accumulate(
                        g, grads, a,
                        V(a) ? mw__backward_op(g, MW__OP_GELU_GRAD, &a->type, gy, V(a), NULL, n)
                             : NULL)
                  : 0;
    case MW__OP_LAYERNORM: {
        mw_tensor *w = n->in[1], *bias = n->nin > 2 ? n->in[2] : NULL; /* b may be absent */
        mw_tensor *x = (na || nb) ? V(a) : a, *vw = V(w);
        if (!x || !vw) return -1;
        if (na && accumulate(g, grads, a, mw__backward_op(g, MW__OP_LN_DX, &a->type, gy, x, vw, n)))
            return -1;
        if (nb &&
            accumulate(g, grads, w, mw__backward_op(g, MW__OP_LN_DW, &w->type, gy, x, NULL, n)))
            return -1;
        if (bias && needs[bias->id] && accumulate(g, grads, bias, gy)) return -1; /* row sums */
        return 0;
    }
    case MW__OP_RMSNORM: {
        mw_tensor *x = (na || nb) ? V(a) : a, *vw = V(b);
        if (!x || !vw) return -1;
        if (na &&
            accumulate(g, grads, a, mw__backward_op(g, MW__OP_RMSNORM_DX, &a->type, gy, x, vw, n)))
            return -1;
        if (nb && accumulate(g, grads, b,
                             mw__backward_op(g, MW__OP_RMSNORM_DW, &b->type, gy, x, NULL, n)))
            return -1;
        return 0;
    }
    case MW__OP_SILU:
        return na ? accumulate(
                        g, grads, a,
                        V(a) ? mw__backward_op(g, MW__OP_SILU_GRAD, &a->type, gy, V(a), NULL, n)
                             : NULL)
                  : 0;
    case MW__OP_SWIGLU: {
        if (!na) return 0;
        mw_tensor *x = V(a);
        if (!x) return -1;
        return accumulate(g, grads, a,
                          mw__backward_op(g, MW__OP_SWIGLU_GRAD, &a->type,
                                          mw__to_type(g, gy, &n->type), x, NULL, n));
    }
    case MW__OP_ROPE: {
        /* The adjoint of a rotation is the rotation back: the same kernel, the angle negated. */
        if (!na) return 0;
        mw_tensor *t = mw__to_type(g, gy, &n->type), *pos = n->nin > 1 ? n->in[1] : NULL;
        if (!t || !(t = mw__replicated(g, t))) return -1;
        mw_tensor proto = {
            .op = MW__OP_ROPE_GRAD, .nin = n->nin, .in = {t, pos}, .type = a->type, .p = n->p};
        proto.type.partial = 0;
        return accumulate(g, grads, a, mw__node_new(g, &proto));
    }
    case MW__OP_SOFTMAX:
        return na ? accumulate(
                        g, grads, a,
                        V(n) ? mw__backward_op(g, MW__OP_SOFTMAX_GRAD, &a->type, gy, V(n), NULL, n)
                             : NULL)
                  : 0;
    case MW__OP_EMBED:
        return na ? accumulate(
                        g, grads, a,
                        V(b) ? mw__backward_op(g, MW__OP_EMBED_GRAD, &a->type, gy, V(b), NULL, n)
                             : NULL)
                  : 0;
    case MW__OP_XENT:
        return na ? accumulate(g, grads, a,
                               V(a) && V(b) ? mw__backward_op(g, MW__OP_XENT_GRAD, &a->type, gy,
                                                              V(a), V(b), n)
                                            : NULL)
                  : 0;
    case MW__OP_ATTENTION: {
        if (!na) return 0;
        /* The kernel reads gy in the forward output's axis order. The forward node is the third
         * input: the plan may keep the probabilities beside its output (plan_fuse.c, attn_probs).
         */
        mw__type ta = mw__grad_type(&a->type);
        mw_tensor *qkv = V(a), *fwd = V(n);
        if (!qkv || !fwd) return -1;
        return accumulate(g, grads, a,
                          mw__backward_op(g, MW__OP_ATTENTION_GRAD, &ta,
                                          mw__to_type(g, gy, &n->type), qkv, fwd, n));
    }
    case MW__OP_GATHER: /* FSDP: the whole parameter's gradient back to this device's rows */
        return na ? accumulate(
                        g, grads, a,
                        mw__scatter(g, mw__to_type(g, gy, &n->type), &a->type, n->p.along.axis))
                  : 0;
    case MW__OP_MAP:
    case MW__OP_DROPOUT:
    case MW__OP_REDUCE_MAX:
    case MW__OP_ARGMAX:
        /* ops_math.c: NULL with no error for an op without a gradient (argmax, comparisons). */
        if (!na) return 0;
        {
            mw_tensor *vn = V(n), *d = vn ? mw__backward_math(g, vn, gy) : NULL;
            if (!d) return g->status ? -1 : 0;
            return accumulate(g, grads, a, d);
        }
    case MW__OP_ATTENTION_GRAD:
    case MW__OP_MAP_GRAD:
    case MW__OP_GELU_GRAD:
    case MW__OP_LN_DX:
    case MW__OP_LN_DW:
    case MW__OP_RMSNORM_DX:
    case MW__OP_RMSNORM_DW:
    case MW__OP_SILU_GRAD:
    case MW__OP_SWIGLU_GRAD:
    case MW__OP_ROPE_GRAD:
    case MW__OP_SOFTMAX_GRAD:
    case MW__OP_EMBED_GRAD:
    case MW__OP_XENT_GRAD:
    case MW__OP_SCATTER:
    case MW__OP_COUNT: break;
    }
    mw__graph_fail(g, MW_ERR_UNSUPPORTED, "autodiff: op %d has no gradient rule", (int)n->op);
    return -1;
#undef V
}

mw_status mw__autodiff(mw_graph *g, mw_tensor *loss, mw_tensor **param_grads, mw__recompute policy,
                       int regather) {
    return mw__autodiff_from(g, loss, param_grads, policy, regather, NULL);
}

mw_status mw__autodiff_from(mw_graph *g, mw_tensor *loss, mw_tensor **param_grads,
                            mw__recompute policy, int regather, const mw__autodiff_ends *ends) {
    int n = g->nnodes, gathers = 0;
    for (int i = 0; i < n; i++) gathers |= g->nodes[i]->op == MW__OP_GATHER;
    char *needs = mw__calloc((size_t)n + 1, 1);
    mw_tensor **grads = mw__calloc((size_t)n + 1, sizeof *grads);
    recompute rc = {.n = n,
                    .regions = policy != MW__RECOMPUTE_NONE && g->nregions,
                    .regather = regather && gathers};
    recompute *use = rc.regions || rc.regather ? &rc : NULL;
    if (use) {
        rc.keep = mw__calloc((size_t)n + 1, 1);
        rc.clone = mw__calloc((size_t)n + 1, sizeof *rc.clone);
    }
    if (!needs || !grads || (use && (!rc.keep || !rc.clone))) {
        mw__free(needs);
        mw__free(grads);
        mw__free(rc.keep);
        mw__free(rc.clone);
        return mw__error(MW_ERR_NOMEM, "out of memory in autodiff");
    }
    if (rc.regions) choose_kept(g, use, policy);
    if (use) rc.keep[loss->id] = 1;
    int nwrt = ends ? ends->nwrt : 0, nseeds = ends ? ends->nseeds : 0;
    for (int j = 0; j < nwrt; j++) needs[ends->wrt[j]->id] = 1;
    for (int j = 0; use && j < nseeds; j++) rc.keep[ends->seed_of[j]->id] = 1;
    /* A node needs a gradient when a parameter (or a value whose gradient is wanted) flows into
     * it. */
    for (int i = 0; i <= loss->id; i++) {
        mw_tensor *t = g->nodes[i];
        needs[i] |= t->op == MW__OP_PARAM;
        for (int k = 0; k < t->nin; k++) needs[i] |= needs[t->in[k]->id];
    }
    mw__type scalar = loss->type;
    grads[loss->id] = mw__fill(g, &scalar, 1.0f);
    for (int j = 0; j < nseeds && g->status == MW_OK; j++)
        if (needs[ends->seed_of[j]->id] && accumulate(g, grads, ends->seed_of[j], ends->seeds[j]))
            break;
    for (int i = loss->id; i >= 0 && g->status == MW_OK; i--) {
        mw_tensor *t = g->nodes[i];
        if (!needs[i] || !grads[i]) continue;
        if (backward_node(g, t, grads[i], grads, needs, use)) break;
    }
    for (int i = 0; i <= loss->id && g->status == MW_OK; i++) {
        mw_tensor *t = g->nodes[i];
        if (t->op == MW__OP_PARAM) param_grads[t->leaf] = grads[i];
    }
    for (int j = 0; j < nwrt; j++) ends->wrt_grads[j] = grads[ends->wrt[j]->id];
    mw__free(needs);
    mw__free(grads);
    mw__free(rc.keep);
    mw__free(rc.clone);
    if (g->status) return mw__error_copy(g->status, g->error);
    return MW_OK;
}
