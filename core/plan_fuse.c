/* The plan's fusion pass: for the whole graph, before anything is emitted, which node's kernel
 * also computes another node (a bias or residual ADD in a GEMM's epilogue or in its C, a residual
 * gradient in the layer norm's dx kernel, bias and layer-norm weight gradients beside the kernel
 * that reads their input anyway, a cast to bf16 written by the kernel that makes the value, the
 * attention probabilities kept for backward): one fusion record per node. */
#include "core/plan_impl.h"

/* How a GEMM's epilogue can read an addend x of the sum `sum` (whose type has the product's
 * layout): as a bias (x is exactly the sum's last `cols` axes, the GEMM's columns: added to every
 * row), as an array laid out like C (x has the sum's layout), or not (EPI_NONE). */
static int epilogue_of(const mw_tensor *x, const mw_tensor *sum, int cols) {
    const mw__type *t = &x->type, *u = &sum->type;
    if (t->dtype != MW_F32 || t->partial) return EPI_NONE;
    if (same_layout(t, u)) return EPI_FULL;
    if (t->rank != cols || cols > u->rank) return EPI_NONE;
    for (int i = 0; i < cols; i++) {
        const mw__axis *a = &t->ax[i], *c = &u->ax[u->rank - cols + i];
        if (a->name != c->name || a->mesh != c->mesh) return EPI_NONE;
    }
    return EPI_BIAS;
}

void mw__plan_contraction(const builder *b, const mw_tensor *n, contraction *c) {
    const mw_tensor *ta = n->in[0], *tb = n->in[1];
    memset(c, 0, sizeof *c);
    for (int i = 0; i < n->type.rank; i++) {
        const mw__axis *ax = &n->type.ax[i];
        int ina = mw__type_find(&ta->type, ax) >= 0, inb = mw__type_find(&tb->type, ax) >= 0;
        axlist *dst = ina && inb ? &c->bt : ina ? &c->m : &c->nn;
        dst->ax[dst->n++] = *ax;
    }
    for (int i = 0; i < ta->type.rank; i++)
        if (mw__type_find(&n->type, &ta->type.ax[i]) < 0) c->k.ax[c->k.n++] = ta->type.ax[i];
    const axlist *c_direct[] = {&c->bt, &c->m, &c->nn}, *c_trans[] = {&c->bt, &c->nn, &c->m};
    c->swap = !seq_equals(&n->type, c_direct, 3) && seq_equals(&n->type, c_trans, 3);
    c->permute_out = !seq_equals(&n->type, c_direct, 3) && !c->swap;
    /* The sum's type has the product's layout (its axes possibly renamed): the addend is mapped
     * onto it by name. A residual added to that sum goes into C with the addend, in the sum's
     * layout. */
    c->addend = c->residual = -1;
    c->sum = b->fuse[n->id].addend >= 0 ? b->g->nodes[b->fuse[n->id].addend] : NULL;
    if (c->sum)
        c->addend = b->node[c->sum->in[0]->id].root == b->node[n->id].root ? c->sum->in[1]->id
                                                                           : c->sum->in[0]->id;
    c->sum2 = b->fuse[n->id].addend2 >= 0 ? b->g->nodes[b->fuse[n->id].addend2] : NULL;
    if (c->sum2)
        c->residual = b->node[c->sum2->in[0]->id].root == b->node[n->id].root ? c->sum2->in[1]->id
                                                                              : c->sum2->in[0]->id;
    /* The GEMM's own epilogue where the addends fit it: a bias along C's rows, an array laid
     * out like C; both are read by the kernel as it writes C (no pass of their own). */
    c->epi_addend = c->epi_residual = EPI_NONE;
    if (c->addend >= 0 && !c->permute_out) {
        int cols = c->swap ? c->m.n : c->nn.n; /* C's trailing axes: the GEMM's columns */
        int ka = epilogue_of(b->g->nodes[c->addend], c->sum, cols);
        int kr = c->residual >= 0 ? epilogue_of(b->g->nodes[c->residual], c->sum2, cols) : EPI_NONE;
        if (ka != EPI_NONE && (c->residual < 0 || (kr != EPI_NONE && kr != ka))) {
            c->epi_addend = ka;
            c->epi_residual = kr;
        }
    }
}

/* Whether the GEMM of a contraction writes its whole result itself (nothing added to C by a pass
 * before it or after it): only then may C be bf16. */
static int contract_writes_all(const contraction *c) {
    return !c->permute_out && (c->addend < 0 || c->epi_addend != EPI_NONE);
}

/* The first SUM after node `after` that gives a parameter's whole gradient (so that it lives in
 * the gradient buffer, can be written early, and its bucket closes after it) as the column sums
 * of src read as rows of its last axis, src's last axis kept; -1 when there is none. Kernels that
 * write src's rows (or read them) add them up too, row after row: the SUM's own order, the same
 * bits. */
static int row_sum_of(const builder *b, int after, const mw_tensor *src) {
    ltype ls = local_type(&src->type, b->pl);
    const mw__axis *last = &src->type.ax[src->type.rank - 1];
    if (ls.stride[ls.rank - 1] != 1) return -1;
    for (int j = after + 1; j < b->g->nnodes; j++) {
        const mw_tensor *t = b->g->nodes[j];
        if (b->node[j].live && b->node[j].grad_of >= 0 && same_part(b, after, j) &&
            t->op == MW__OP_SUM && t->in[0] == src && t->type.rank == 1 &&
            t->type.ax[0].name == last->name && t->type.ax[0].mesh == last->mesh &&
            local_type(&t->type, b->pl).numel == ls.size[ls.rank - 1])
            return j;
    }
    return -1;
}

/* Gradients written by the kernel that reads their input anyway, their own nodes then emitting
 * nothing (absorbed):
 * - a normalisation's gradients in one pass over gy and x: a node of MW__T_NORM_DX whose gy and
 *   x also feed a later MW__T_NORM_DW node of the same parameters giving a parameter's whole
 *   gradient, and, for a kernel of MW__T_NORM_DB, whose gy the bias gradient sums (row_sum_of);
 * - a bias gradient summed from the output of a node of MW__T_COLSUM as its kernel writes it. */
static void find_fused_grads(builder *b) {
    const mw_graph *g = b->g;
    for (int i = 0; i < g->nnodes; i++) b->fuse[i].ln_dw = b->fuse[i].col_sum = -1;
    for (int i = 0; i < g->nnodes; i++) {
        const mw_tensor *n = g->nodes[i];
        unsigned traits = mw__op_traits(n->op);
        if (!b->node[i].live) continue;
        if (traits & MW__T_COLSUM) {
            int s = row_sum_of(b, i, n);
            if (s < 0) continue;
            b->fuse[i].col_sum = s;
            b->fuse[s].absorbed = 1;
        }
        if (!(traits & MW__T_NORM_DX)) continue;
        const mw_tensor *gy = n->in[0], *x = n->in[1];
        /* A kernel that can write the bias gradient (MW__T_NORM_DB: layer norm's) writes it
         * when the graph sums gy over rows (a layer norm with a bias, whose gradient is
         * wanted); without (RMS norm's, or a layer norm without bias) it writes dw alone. */
        int has_bias = (traits & MW__T_NORM_DB) != 0;
        int dw = -1, db = has_bias ? row_sum_of(b, i, gy) : -1;
        for (int j = i + 1; j < g->nnodes && dw < 0; j++) {
            const mw_tensor *t = g->nodes[j];
            if (b->node[j].live && b->node[j].grad_of >= 0 && same_part(b, i, j) &&
                (mw__op_traits(t->op) & MW__T_NORM_DW) && t->in[0] == gy && t->in[1] == x &&
                !memcmp(&t->p, &n->p, sizeof t->p))
                dw = j;
        }
        if (dw < 0) continue;
        b->fuse[i].ln_dw = dw;
        b->fuse[dw].absorbed = 1;
        if (db < 0) continue;
        b->fuse[i].col_sum = db;
        b->fuse[db].absorbed = 1;
    }
}

/* Floats of probabilities an ATTENTION node keeps for its gradient node: where the CPU kernels
 * run (host memory), the backward then reads them instead of recomputing the scores and their
 * softmax (about 15 % of the two kernels' time at llm.c's GPT-2 sizes). Kept only where they take
 * no more memory than qkv itself (causal: sequences up to about 6 x the head size), so a long
 * sequence still costs memory linear in its length; above that the backward recomputes them. */
static int64_t attn_probs(const builder *b, const mw_tensor *fwd) {
    if (!b->host_memory) return 0;
    const mw_tensor *qkv = fwd->in[0];
    ltype lq = local_type(&qkv->type, b->pl);
    const int seq = fwd->p.attention.seq, feature = fwd->p.attention.feature;
    int64_t t = lq.size[seq], blk = t < MW__ATTN_BLOCK ? t : MW__ATTN_BLOCK;
    int64_t slices = lq.numel / (t * lq.size[feature] * lq.size[fwd->p.attention.part]);
    int64_t group = fwd->p.attention.group > 0 ? fwd->p.attention.group : 1;
    int64_t n = slices * group * mw__attn_probs_per_slice(t, blk, fwd->p.attention.causal);
    return n <= lq.numel ? n : 0;
}

/* An ADD another kernel may write instead: live, f32, nothing partial, not a parameter's
 * gradient (those live in the gradient buffer) and not taken over already. */
static int foldable_add(const builder *b, int i) {
    const mw_tensor *n = b->g->nodes[i];
    return b->node[i].live && n->op == MW__OP_ADD && !n->type.partial && b->node[i].grad_of < 0 &&
           n->type.dtype == MW_F32 && b->fuse[i].fused < 0;
}

/* Finds ADDs that a GEMM can absorb: out = x + y where y is (a rename or other alias of) a
 * contraction that nothing else reads, x was computed before that contraction and has no axis
 * the sum lacks, nothing is partial, and neither the sum nor the product is a parameter's
 * gradient (those live in the gradient buffer). The product is then written onto a copy of x:
 * bias adds (x . W + b) and residual adds (x + proj(h)). */
static void find_gemm_addends(builder *b) {
    const mw_graph *g = b->g;
    int nn = g->nnodes;
    for (int i = 0; i < nn; i++)
        b->fuse[i].addend = b->fuse[i].fused = b->fuse[i].addend2 = b->fuse[i].ln_addend = -1;
    for (int i = 0; i < nn; i++)
        if (b->node[i].live)
            for (int k = 0; k < g->nodes[i]->nin; k++) b->node[g->nodes[i]->in[k]->id].uses++;
    for (int i = 0; i < nn; i++) {
        const mw_tensor *n = g->nodes[i];
        if (!foldable_add(b, i)) continue;
        for (int k = 0; k < 2; k++) {
            const mw_tensor *y = n->in[k], *x = n->in[1 - k], *c = y;
            while (c->op == MW__OP_ALIAS && b->node[c->id].uses == 1) c = c->in[0];
            if (c->op != MW__OP_CONTRACT || b->node[c->id].uses != 1 || c->type.partial ||
                b->node[c->id].grad_of >= 0 || b->fuse[c->id].addend >= 0 || x->id >= c->id ||
                x->type.partial || x->type.dtype != MW_F32 || !same_layout(&n->type, &y->type) ||
                !axes_within(&x->type, &n->type))
                continue;
            /* The copy into c's buffer walks c's type: x's axes must be found there too, under
             * the names the aliases gave them. Only renames that keep every axis are followed. */
            if (!same_layout(&c->type, &y->type)) {
                if (c->type.rank != y->type.rank) continue;
                int ok = 1;
                for (int a = 0; a < y->type.rank && ok; a++)
                    ok = c->type.ax[a].size == y->type.ax[a].size;
                if (!ok) continue;
            }
            b->fuse[c->id].addend = i;
            b->fuse[i].fused = c->id;
            break;
        }
    }
    /* A residual added to such a sum (x + (A B + b)): x goes into the product's buffer with the
     * first addend, where it has the sum's layout exactly (no broadcast) and was computed before
     * the contraction. */
    for (int i = 0; i < nn; i++) {
        const mw_tensor *n = g->nodes[i];
        if (!foldable_add(b, i)) continue;
        for (int k = 0; k < 2; k++) {
            const mw_tensor *y = n->in[k], *x = n->in[1 - k], *s1 = y;
            while (s1->op == MW__OP_ALIAS && b->node[s1->id].uses == 1) s1 = s1->in[0];
            if (s1->op != MW__OP_ADD || b->fuse[s1->id].fused < 0 || b->node[s1->id].uses != 1)
                continue;
            int c = b->fuse[s1->id].fused;
            if (b->fuse[c].addend2 >= 0 || x->id >= c || x->type.partial ||
                x->type.dtype != MW_F32 || !same_layout(&n->type, &y->type) ||
                !same_layout(&x->type, &n->type) || s1->type.rank != n->type.rank)
                continue;
            int ok = 1;
            for (int a = 0; a < n->type.rank && ok; a++)
                ok = s1->type.ax[a].size == n->type.ax[a].size &&
                     s1->type.ax[a].mesh == n->type.ax[a].mesh;
            if (!ok) continue;
            b->fuse[c].addend2 = i;
            b->fuse[i].fused = c;
            break;
        }
    }
    /* A gradient added to a normalisation's input gradient (a residual stream's: g + dx): its dx
     * kernel (MW__T_NORM_DX) adds g as it writes its rows, where g has the sum's layout and was
     * computed first. */
    for (int i = 0; i < nn; i++) {
        const mw_tensor *n = g->nodes[i];
        if (!foldable_add(b, i)) continue;
        for (int k = 0; k < 2; k++) {
            const mw_tensor *y = n->in[k], *x = n->in[1 - k];
            if (!(mw__op_traits(y->op) & MW__T_NORM_DX) || b->node[y->id].uses != 1 ||
                b->fuse[y->id].ln_addend >= 0 || b->node[y->id].grad_of >= 0 || x->id >= y->id ||
                x->type.partial || x->type.dtype != MW_F32 || !same_layout(&n->type, &y->type) ||
                !same_layout(&x->type, &n->type))
                continue;
            b->fuse[y->id].ln_addend = x->id;
            b->fuse[i].fused = y->id;
            break;
        }
    }
}

/* Whether attention a's queries and key are exactly what ROPE r rotates: the part axis's first
 * group + 1 parts, along the attention's sequence axis, over its features (the last axis). */
static int rotates_queries_and_key(const mw_tensor *r, const mw_tensor *a) {
    int64_t group = a->p.attention.group > 0 ? a->p.attention.group : 1;
    return r->p.rope.part >= 0 && r->p.rope.part == a->p.attention.part &&
           r->p.rope.parts == group + 1 && r->p.rope.seq == a->p.attention.seq &&
           a->p.attention.feature == r->type.rank - 1;
}

/* The live nodes reading node v, each through one input: how many, and whether every one is an
 * ATTENTION reading it as qkv or an ATTENTION_GRAD reading it as its qkv (only then, *ok). */
static int attention_readers(const builder *b, const mw_tensor *r, int v, int *ok) {
    int n = 0;
    *ok = 1;
    for (int j = v + 1; j < b->g->nnodes; j++) {
        const mw_tensor *u = b->g->nodes[j];
        if (!b->node[j].live) continue;
        for (int k = 0; k < u->nin; k++) {
            if (u->in[k]->id != v) continue;
            n++;
            int fwd = u->op == MW__OP_ATTENTION && k == 0,
                bwd = u->op == MW__OP_ATTENTION_GRAD && k == 1;
            *ok &= (fwd || bwd) && rotates_queries_and_key(r, bwd ? u->in[2] : u);
        }
    }
    return n;
}

/* Whether node i is the loss or an output (the host reads it). */
static int host_reads(const mw_tensor *loss, mw_tensor *const *outputs, int noutputs, int i) {
    int read = loss->id == i;
    for (int o = 0; o < noutputs; o++) read |= outputs[o]->id == i;
    return read;
}

/* Rotary embeddings applied by the attention that reads them, where the target's kernels can
 * (rotary: they rotate q and k as they stage a slice, and the gradient's kernel rotates d(qkv)
 * back): a ROPE without fed positions, rotating exactly the queries and the key of the attentions
 * that read it (directly, or through one cast to bf16) and read by nothing else, each attention
 * gradient among them read only by the ROPE_GRAD of the same rotation. None of the three then
 * makes a value (pass): the projection is read once by the forward kernel and once by the
 * backward one, and neither the rotated copy of q, k and v nor its gradient goes to memory. */
static void find_rotary(builder *b, const mw_tensor *loss, mw_tensor *const *outputs,
                        int noutputs) {
    const mw_graph *g = b->g;
    for (int i = 0; i < g->nnodes; i++) b->fuse[i].rotary = -1;
    if (!b->rotary || !b->host_memory) return;
    for (int i = 0; i < g->nnodes; i++) {
        const mw_tensor *r = g->nodes[i], *q = r;
        if (!b->node[i].live || r->op != MW__OP_ROPE || r->nin != 1 || b->node[i].grad_of >= 0 ||
            host_reads(loss, outputs, noutputs, i))
            continue;
        /* one cast to bf16 between (mixed precision), read by nothing but the attentions: fused
         * only where asked (rotary 2) */
        for (int j = i + 1; j < g->nnodes && q == r && b->rotary > 1; j++) {
            const mw_tensor *c = g->nodes[j];
            if (b->node[j].live && c->op == MW__OP_CAST && c->in[0] == r &&
                c->type.dtype == MW_BF16 && b->node[i].uses == 1 && b->node[j].grad_of < 0 &&
                !host_reads(loss, outputs, noutputs, j))
                q = c;
        }
        int ok, readers = attention_readers(b, r, q->id, &ok);
        if (!ok || !readers) continue;
        /* every gradient's d(qkv) goes to the ROPE_GRAD of this rotation alone */
        for (int j = q->id + 1; j < g->nnodes && ok; j++) {
            const mw_tensor *ag = g->nodes[j];
            if (!b->node[j].live || ag->op != MW__OP_ATTENTION_GRAD || ag->in[1] != q) continue;
            int rg = -1;
            for (int m = j + 1; m < g->nnodes && rg < 0; m++)
                if (b->node[m].live && g->nodes[m]->nin == 1 && g->nodes[m]->in[0] == ag) rg = m;
            const mw_tensor *t = rg >= 0 ? g->nodes[rg] : NULL;
            ok = t && t->op == MW__OP_ROPE_GRAD && !memcmp(&t->p, &r->p, sizeof t->p) &&
                 b->node[j].uses == 1 && b->node[j].grad_of < 0 && b->node[rg].grad_of < 0 &&
                 same_part(b, j, rg) && !host_reads(loss, outputs, noutputs, j) &&
                 same_layout(&t->type, &ag->type);
        }
        if (!ok) continue;
        b->fuse[i].pass = b->fuse[q->id].pass = 1;
        for (int j = q->id + 1; j < g->nnodes; j++) {
            const mw_tensor *u = g->nodes[j];
            if (!b->node[j].live) continue;
            if ((u->op == MW__OP_ATTENTION && u->in[0] == q) ||
                (u->op == MW__OP_ATTENTION_GRAD && u->in[1] == q))
                b->fuse[j].rotary = i;
            if (u->op == MW__OP_ROPE_GRAD && b->fuse[u->in[0]->id].rotary == i) b->fuse[j].pass = 1;
        }
    }
}

/* The node whose buffer holds node i's value (through aliases and the ADDs a GEMM writes). */
static int owner_of(const builder *b, int i) {
    const mw_tensor *t = b->g->nodes[i];
    for (;;) {
        if (t->op == MW__OP_ALIAS)
            t = t->in[0];
        else if (b->fuse[t->id].fused >= 0)
            t = b->g->nodes[b->fuse[t->id].fused];
        else
            return t->id;
    }
}

/* The instruction a node's kernel is, when that kernel can write its output in bf16 (and the
 * device's does: target bf16_out); -1 otherwise. */
static int bf16_writer(const builder *b, const mw_tensor *t) {
    int kind = mw__op_bf16_kernel(t->op); /* its row of MW__OPS */
    if (kind < 0 || !(b->bf16_out & (UINT64_C(1) << kind))) return -1;
    if (kind == MW__I_GEMM) { /* a bf16 C of bf16 operands only (mw__k_gemm) */
        contraction c;
        mw__plan_contraction(b, t, &c);
        if (!contract_writes_all(&c) || t->in[0]->type.dtype != MW_BF16) return -1;
    }
    return kind;
}

/* Casts to bf16 that need no pass of their own (see CAST_PARAM, CAST_FUSED); the rest convert.
 * A value is written in bf16 by its kernel when the cast is its only reader: nothing else reads
 * its buffer (an attention gradient's third input only locates the kept probabilities; a bias
 * gradient summed by the kernel itself is made from its f32 values), it is no parameter's
 * gradient and the host does not read it. Runs once b->root is known; sets the casts' roots. */
static void find_bf16_casts(builder *b) {
    const mw_graph *g = b->g;
    for (int i = 0; i < g->nnodes; i++) {
        const mw_tensor *c = g->nodes[i];
        if (!b->node[i].live || c->op != MW__OP_CAST || c->type.dtype != MW_BF16 || b->fuse[i].pass)
            continue;
        const mw_tensor *src = c->in[0];
        while (src->op == MW__OP_ALIAS) src = src->in[0];
        if (src->op == MW__OP_PARAM) {
            b->fuse[i].cast = CAST_PARAM;
            continue;
        }
        int r = owner_of(b, c->in[0]->id);
        const mw_tensor *t = g->nodes[r];
        if (b->fuse[r].buf16 || b->node[r].host_read || b->node[r].grad_of >= 0 ||
            bf16_writer(b, t) < 0)
            continue;
        int readers = 0;
        for (int j = 0; j < g->nnodes && !readers; j++) {
            const mw_tensor *u = g->nodes[j];
            if (!b->node[j].live || j == i || b->node[j].root == r || j == b->fuse[r].col_sum)
                continue;
            for (int k = 0; k < u->nin; k++)
                readers +=
                    b->node[u->in[k]->id].root == r && !(u->op == MW__OP_ATTENTION_GRAD && k == 2);
        }
        if (readers) continue;
        b->fuse[i].cast = CAST_FUSED;
        b->fuse[r].buf16 = 1;
        b->node[i].root = b->node[c->in[0]->id].root;
    }
}

void mw__plan_fuse(builder *b, const mw_tensor *loss, mw_tensor *const *outputs, int noutputs) {
    const mw_graph *g = b->g;
    find_gemm_addends(b);
    find_fused_grads(b);
    find_rotary(b, loss, outputs, noutputs);
    for (int i = 0; i < g->nnodes; i++) {
        const mw_tensor *t = g->nodes[i];
        b->node[i].root = t->op == MW__OP_ALIAS || t->op == MW__OP_STATE_WRITE || b->fuse[i].pass
                              ? b->node[t->in[0]->id].root
                          : b->fuse[i].fused >= 0 ? b->node[b->fuse[i].fused].root
                                                  : i;
    }
    b->node[b->node[loss->id].root].host_read = 1;
    for (int o = 0; o < noutputs; o++) b->node[b->node[outputs[o]->id].root].host_read = 1;
    find_bf16_casts(b);
    for (int i = 0; i < g->nnodes; i++) {
        const mw_tensor *t = g->nodes[i];
        if (b->node[i].live && t->op == MW__OP_ATTENTION_GRAD)
            b->fuse[t->in[2]->id].extra = attn_probs(b, t->in[2]);
    }
}
