/* Pipelines (meshwit/pipeline.h): the graph cut into stages at its regions.
 *
 * A node outside every region that depends on no region's value (a parameter, an input,
 * a constant, and what is made of them alone outside regions: the embedding lookup, the targets)
 * is "free": it is copied into every stage that reads it. Every other node belongs to its
 * region's stage, or, outside regions, to the latest stage among its inputs.
 * A value of stage s read in stage t > s becomes an input of stage t ("pipe.<node>") whose
 * gradient stage t's trainer returns, and that gradient is the seed ("pipe.grad.<node>") of
 * stage s's backward pass: autodiff sums it first, then what stage s's own readers add, the
 * order the whole graph's backward pass sums them in. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "parallel/pipeline_state.h"

static int is_leaf(const mw_tensor *t) {
    return t->op == MW__OP_INPUT || t->op == MW__OP_PARAM || t->op == MW__OP_FILL ||
           t->op == MW__OP_STATE;
}

/* A node's estimated cost: a contraction's multiply-adds, an attention's (its scores and
 * their products, ~ 4 T^2 D per head), every other op's elements. */
static double node_cost(const mw_tensor *t) {
    double n = (double)mw__type_numel(&t->type);
    if (t->op == MW__OP_CONTRACT && t->nin == 2) {
        double k = 1;
        const mw__type *a = &t->in[0]->type;
        for (int i = 0; i < a->rank; i++)
            if (mw__type_find(&t->type, &a->ax[i]) < 0) k *= (double)a->ax[i].size;
        return 2 * n * k;
    }
    if (t->op == MW__OP_ATTENTION) {
        int s = t->p.attention.seq;
        double T = s >= 0 && s < t->in[0]->type.rank ? (double)t->in[0]->type.ax[s].size : 1;
        return 4 * n * T;
    }
    return n;
}

/* Contiguous cut of R region costs into S parts minimising the largest part. */
static mw_status balance(const double *cost, int R, int S, int *stage_of) {
    double *best = mw__calloc((size_t)(R + 1) * (size_t)(S + 1), sizeof *best);
    int *cut = mw__calloc((size_t)(R + 1) * (size_t)(S + 1), sizeof *cut);
    double *pre = mw__calloc((size_t)R + 1, sizeof *pre);
    if (!best || !cut || !pre) {
        mw__free(best);
        mw__free(cut);
        mw__free(pre);
        return mw__error(MW_ERR_NOMEM, "mw_pipeline_new: out of memory");
    }
    for (int r = 0; r < R; r++) pre[r + 1] = pre[r] + cost[r];
#define B(r, s) best[(size_t)(r) * (size_t)(S + 1) + (size_t)(s)]
#define C(r, s) cut[(size_t)(r) * (size_t)(S + 1) + (size_t)(s)]
    for (int r = 0; r <= R; r++)
        for (int s = 0; s <= S; s++) B(r, s) = INFINITY;
    B(0, 0) = 0;
    for (int s = 1; s <= S; s++)
        for (int r = s; r <= R; r++)
            for (int k = s - 1; k < r; k++) {
                double v = fmax(B(k, s - 1), pre[r] - pre[k]);
                if (v < B(r, s)) {
                    B(r, s) = v;
                    C(r, s) = k;
                }
            }
    for (int s = S, r = R; s > 0; s--) {
        int k = C(r, s);
        for (int j = k; j < r; j++) stage_of[j] = s - 1;
        r = k;
    }
#undef B
#undef C
    mw__free(best);
    mw__free(cut);
    mw__free(pre);
    return MW_OK;
}

/* The sub-mesh of the devices at coordinate c of mesh axis a. */
static int sub_mesh(const mw_mesh *m, int a, int c, mw_mesh *out) {
    *out = *m;
    out->ndevices = 0;
    int proc = -2;
    for (int d = 0; d < m->ndevices; d++) {
        if (mw__mesh_coord(m, d, a) != c) continue;
        int k = out->ndevices++;
        memcpy(out->device_name[k], m->device_name[d], sizeof out->device_name[k]);
        out->ordinal[k] = m->ordinal[d];
        out->proc_of[k] = 0;
        proc = proc == -2 || proc == m->proc_of[d] ? m->proc_of[d] : -1;
    }
    out->nprocs = 1; /* a stage's mesh is its process's own */
    out->proc = 0;
    out->naxes = 0;
    for (int i = 0; i < m->naxes; i++) {
        if (i == a) continue;
        memcpy(out->axis_name[out->naxes], m->axis_name[i], sizeof out->axis_name[0]);
        out->axis_size[out->naxes++] = m->axis_size[i];
    }
    if (!out->naxes) { /* one device per stage: an axis of one */
        snprintf(out->axis_name[0], sizeof out->axis_name[0], "%s", m->axis_name[a]);
        out->axis_size[0] = 1;
        out->naxes = 1;
    }
    out->local_first = 0;
    out->local_count = out->ndevices;
    int at = snprintf(out->desc, sizeof out->desc, "Mesh(");
    for (int i = 0; i < out->naxes; i++)
        at += snprintf(out->desc + at, sizeof out->desc - (size_t)at, "%s%s -> %d", i ? ", " : "",
                       out->axis_name[i], out->axis_size[i]);
    at += snprintf(out->desc + at, sizeof out->desc - (size_t)at, ") over");
    for (int d = 0; d < out->ndevices; d++)
        at += snprintf(out->desc + at, sizeof out->desc - (size_t)at, "%s %s", d ? "," : "",
                       out->device_name[d]);
    return proc;
}

/* A copy of node t of the whole graph in graph gs, its inputs mapped; leaves renumbered. */
static mw_tensor *copy_node(mw_graph *gs, const mw_tensor *t, mw_tensor *const *map) {
    mw_tensor proto = *t;
    for (int k = 0; k < t->nin; k++) proto.in[k] = map[t->in[k]->id];
    if (t->op == MW__OP_INPUT) proto.leaf = gs->ninputs;
    if (t->op == MW__OP_PARAM) proto.leaf = gs->nparams;
    if (t->op == MW__OP_STATE) proto.leaf = gs->nstates;
    mw_tensor *c = mw__node_new(gs, &proto);
    if (c && t->op == MW__OP_INPUT) gs->ninputs++;
    if (c && t->op == MW__OP_PARAM) gs->nparams++;
    if (c && t->op == MW__OP_STATE) gs->nstates++;
    return c;
}

/* An input of gs with type t (f32), its sharded axes split as t's are. */
static mw_tensor *typed_input(mw_graph *gs, const mw__type *t, const char *name) {
    mw_axes axes = {.rank = t->rank};
    for (int i = 0; i < t->rank; i++) {
        axes.axis[i].name = gs->names[t->ax[i].name];
        axes.axis[i].size = t->ax[i].size;
    }
    mw_tensor *x = mw_input(gs, name, MW_F32, axes);
    for (int i = 0; x && i < t->rank; i++)
        if (t->ax[i].mesh >= 0)
            x = mw_shard(gs, x, gs->names[t->ax[i].name], gs->mesh_names[t->ax[i].mesh]);
    if (!x) return NULL;
    int same = x->type.rank == t->rank && x->type.dtype == t->dtype;
    for (int i = 0; same && i < t->rank; i++)
        same = x->type.ax[i].name == t->ax[i].name && x->type.ax[i].mesh == t->ax[i].mesh &&
               x->type.ax[i].size == t->ax[i].size;
    if (!same)
        return mw__graph_fail(gs, MW_ERR_UNSUPPORTED,
                              "mw_pipeline_new: the value crossing stages as '%s' cannot be fed "
                              "with its sharding",
                              name);
    return x;
}

mw_status mw__pipe_cut_graph(mw_pipeline *p, const mw_tensor *loss, mw__pipe_cut *cs) {
    const mw_graph *g = p->g;
    int n = g->nnodes, R = g->nregions, S = p->S;
    cs->node_stage = mw__calloc((size_t)n + 1, sizeof *cs->node_stage);
    cs->needed = mw__calloc((size_t)n + 1, sizeof *cs->needed);
    cs->readers = mw__calloc((size_t)n + 1, sizeof *cs->readers);
    double *cost = mw__calloc((size_t)R + 1, sizeof *cost);
    int *rstage = mw__calloc((size_t)R + 1, sizeof *rstage);
    if (!cs->node_stage || !cs->needed || !cs->readers || !cost || !rstage) {
        mw__free(cost);
        mw__free(rstage);
        return mw__error(MW_ERR_NOMEM, "mw_pipeline_new: out of memory");
    }
    /* Free nodes; costs of the regions (what comes before the first region counts with it,
     * what comes after the last with that). */
    int seen_region = 0;
    for (int i = 0; i < n; i++) {
        const mw_tensor *t = g->nodes[i];
        int fr = is_leaf(t);
        if (!fr && !t->region) {
            fr = 1;
            for (int k = 0; k < t->nin; k++) fr &= cs->node_stage[t->in[k]->id] == -1;
        }
        cs->node_stage[i] = fr ? -1 : -2; /* -2: not yet placed */
        if (R == 0) continue;
        if (t->region) seen_region = t->region;
        int r = t->region ? t->region - 1 : seen_region ? seen_region - 1 : 0;
        cost[r] += node_cost(t);
    }
    mw_status st = MW_OK;
    if (R < S) {
        st = mw__error(MW_ERR_INVALID,
                       "mw_pipeline_new: the graph has %d regions but the pipeline has %d stages "
                       "(%d devices along the axis x %d virtual stages); mark every transformer "
                       "block with mw_region_begin / mw_region_end, or use fewer stages",
                       R, S, p->P, p->V);
        goto done;
    }
    if (p->region_stage) {
        for (int r = 0; r < R; r++) {
            int v = p->region_stage[r], prev = r ? p->region_stage[r - 1] : 0;
            if (v < 0 || v >= S || v < prev || v > prev + 1 || (r == 0 && v != 0) ||
                (r == R - 1 && v != S - 1)) {
                st = mw__error(MW_ERR_INVALID,
                               "mw_pipeline_new: region_stage[%d] is %d; stages must run from 0 "
                               "to %d in the order of the regions, none skipped",
                               r, v, S - 1);
                goto done;
            }
            rstage[r] = v;
        }
    } else if ((st = balance(cost, R, S, rstage))) {
        goto done;
    }
    for (int r = 0; r < R; r++) {
        stage *sg = &p->st[rstage[r]];
        if (!sg->nregions) sg->first_region = r;
        sg->nregions++;
    }
    /* Stages of the other nodes. */
    for (int i = 0; i < n; i++) {
        const mw_tensor *t = g->nodes[i];
        if (cs->node_stage[i] == -1) continue;
        int s = t->region ? rstage[t->region - 1] : 0;
        for (int k = 0; k < t->nin; k++) {
            int u = cs->node_stage[t->in[k]->id];
            if (u > s && t->region) {
                st = mw__error(MW_ERR_INVALID,
                               "mw_pipeline_new: region %d (stage %d) reads a value of stage %d; "
                               "stages must follow the order of the regions",
                               t->region - 1, s, u);
                goto done;
            }
            if (u > s) s = u;
        }
        cs->node_stage[i] = s;
    }
    if (cs->node_stage[loss->id] != S - 1) {
        st = mw__error(MW_ERR_INVALID,
                       "mw_pipeline_new: the loss does not depend on the last stage's regions "
                       "(it belongs to stage %d of %d)",
                       cs->node_stage[loss->id], S);
        goto done;
    }
    /* The stages that read each node: a free one through other free nodes. */
    for (int i = n - 1; i >= 0; i--) {
        const mw_tensor *t = g->nodes[i];
        uint64_t mine = cs->node_stage[i] >= 0 ? (uint64_t)1 << cs->node_stage[i] : cs->needed[i];
        for (int k = 0; k < t->nin; k++) {
            int x = t->in[k]->id;
            if (cs->node_stage[x] == -1)
                cs->needed[x] |= mine;
            else if (cs->node_stage[i] >= 0)
                cs->readers[x] |= mine;
        }
    }
    for (int i = 0; i < n; i++) {
        const mw_tensor *t = g->nodes[i];
        if (t->op != MW__OP_PARAM || (cs->needed[i] & (cs->needed[i] - 1)) == 0) continue;
        int a = -1, b = -1, more = 0;
        for (int s = 0; s < S; s++)
            if (cs->needed[i] >> s & 1) {
                if (a < 0)
                    a = s;
                else if (b < 0)
                    b = s;
                else
                    more = 1;
            }
        int split = 0, via = -1, readers = 0;
        for (int k = 0; k < t->type.rank; k++) split |= t->type.ax[k].mesh >= 0;
        /* Split (FSDP): shared as the whole its one GATHER makes (a gather per axis would be
         * a chain; one split axis, one reader). */
        for (int j = i + 1; split && j < n; j++)
            for (int k = 0; k < g->nodes[j]->nin; k++)
                if (g->nodes[j]->in[k] == t) {
                    readers++;
                    via = g->nodes[j]->op == MW__OP_GATHER ? j : -1;
                }
        int whole = via >= 0 && readers == 1;
        for (int k = 0; whole && k < g->nodes[via]->type.rank; k++)
            whole = g->nodes[via]->type.ax[k].mesh < 0;
        if (more || (split && !whole) || p->ntied == MAX_TIED) {
            st = mw__error(MW_ERR_UNSUPPORTED,
                           "mw_pipeline_new: parameter '%s' is read by stages %d, %d%s; a "
                           "parameter is shared by at most two stages, whole or split over one "
                           "mesh axis and gathered whole where it is read (FSDP), and at most %d "
                           "such parameters",
                           t->name, a, b,
                           more    ? " and more"
                           : split ? " and is split and read where split"
                                   : "",
                           MAX_TIED);
            goto done;
        }
        p->tied[p->ntied++] = (tied_param){.node = i,
                                           .via = split ? via : -1,
                                           .owner = a,
                                           .other = b,
                                           .count = mw__type_numel(&t->type)};
    }
done:
    mw__free(cost);
    mw__free(rstage);
    return st;
}

mw_status mw__pipe_build_stage(mw_pipeline *p, const mw_tensor *loss, const mw__pipe_cut *cs, int s,
                               int axis, mw_tensor **map, mw_tensor **stage_loss,
                               int *user_leaf_of_input) {
    const mw_graph *g = p->g;
    stage *sg = &p->st[s];
    int n = g->nnodes;
    sg->device = s % p->P;
    sg->proc = sub_mesh(p->mesh, axis, sg->device, &sg->mesh);
    if (sg->proc < 0)
        return mw__error(MW_ERR_UNSUPPORTED,
                         "mw_pipeline_new: stage %d's devices lie in several processes; a stage "
                         "runs in one process (the pipeline axis across the processes, the other "
                         "axes inside them: e.g. --mesh %s=%d,X=2 with two devices per process)",
                         s, p->mesh->axis_name[axis], p->P);
    /* The same names, so axis and mesh-name indices carry over. */
    mw_status st = mw__graph_new_like(g, &sg->g);
    if (st) return st;
    mw_graph *gs = sg->g;
    for (int i = 0; i < n; i++) map[i] = NULL;
    /* The boundary arrays: values of this stage later ones read, values it reads of earlier. */
    int nin = 0, nout = 0;
    for (int i = 0; i < n; i++) {
        int si = cs->node_stage[i];
        nout += si == s && cs->readers[i] >> s >> 1 != 0;
        nin += si >= 0 && si < s && (cs->readers[i] >> s & 1);
    }
    sg->out = mw__calloc((size_t)nout + 1, sizeof *sg->out);
    sg->in = mw__calloc((size_t)nin + 1, sizeof *sg->in);
    if (!sg->out || !sg->in) return mw__error(MW_ERR_NOMEM, "mw_pipeline_new: out of memory");
    for (int i = 0; i < n && gs->status == MW_OK; i++) {
        const mw_tensor *t = g->nodes[i];
        int si = cs->node_stage[i];
        int here = si == s || (si == -1 && (cs->needed[i] >> s & 1));
        if (here) {
            /* Inputs of earlier stages become inputs of this one. */
            for (int k = 0; k < t->nin; k++) {
                const mw_tensor *x = t->in[k];
                if (map[x->id]) continue;
                int sx = cs->node_stage[x->id];
                if (sx < 0 || sx >= s) continue; /* (free nodes are copied before) */
                char d[256], name[MW_MAX_NAME];
                if (x->type.dtype != MW_F32 || x->type.partial)
                    return mw__error(MW_ERR_UNSUPPORTED,
                                     "mw_pipeline_new: the value %s of node %d (%s) crosses from "
                                     "stage %d to stage %d; only f32 values that are not partial "
                                     "sums cross stages",
                                     mw__type_describe(g, &x->type, d, sizeof d), x->id,
                                     mw__op_name(x->op), sx, s);
                snprintf(name, sizeof name, "pipe.%d", x->id);
                mw_tensor *in = typed_input(gs, &x->type, name);
                if (!in) break;
                map[x->id] = in;
                pipe_in *pi = &sg->in[sg->nin++];
                *pi =
                    (pipe_in){.node = in, .from = sx, .out = -1, .count = mw__type_numel(&x->type)};
                /* Which of stage sx's outputs (that stage is built already); one reader each. */
                stage *src = &p->st[sx];
                for (int j = 0; j < src->nout; j++)
                    if (src->out[j].src == x->id && src->out[j].reader < 0) {
                        pi->out = j;
                        src->out[j].reader = s;
                        src->out[j].in = sg->nin - 1;
                    }
                if (pi->out < 0)
                    return mw__error(MW_ERR_UNSUPPORTED,
                                     "mw_pipeline_new: node %d (%s) of stage %d is read by more "
                                     "than one later stage (stage %d too); a value crossing "
                                     "several stages is not supported yet",
                                     x->id, mw__op_name(x->op), sx, s);
            }
            if (gs->status) break;
            mw_tensor *c = copy_node(gs, t, map);
            if (!c) break;
            map[i] = c;
            if (t->op == MW__OP_INPUT) user_leaf_of_input[c->leaf] = t->leaf;
        }
        /* A value of this stage a later stage reads: sent on, its gradient fed back. */
        if (si == s && cs->readers[i] >> s >> 1)
            sg->out[sg->nout++] = (pipe_out){
                .node = map[i], .src = i, .reader = -1, .count = mw__type_numel(&t->type)};
    }
    if (gs->status) return mw__error_copy(gs->status, gs->error);
    /* Seeds after the forward nodes. */
    for (int j = 0; j < sg->nout; j++) {
        char name[MW_MAX_NAME];
        snprintf(name, sizeof name, "pipe.grad.%d", sg->out[j].src);
        mw__type gt = mw__grad_type(&sg->out[j].node->type);
        if (!(sg->out[j].seed = typed_input(gs, &gt, name)))
            return mw__error_copy(gs->status, gs->error);
    }
    /* Tied parameters: the owner's seed (a share per device along the stage's one data axis),
     * the other's shadow. */
    for (int k = 0; k < p->ntied; k++) {
        tied_param *tp = &p->tied[k];
        const mw_tensor *par = g->nodes[tp->via >= 0 ? tp->via : tp->node];
        if (tp->other == s) tp->shadow = map[par->id];
        if (tp->owner != s) continue;
        tp->held = map[par->id];
        char name[MW_MAX_NAME];
        snprintf(name, sizeof name, "pipe.tied.%d", tp->node);
        mw__type t = mw__grad_type(&par->type);
        tp->shares = sg->mesh.ndevices;
        if (tp->shares > 1) {
            int m = sg->mesh.naxes == 1 ? -1 : -2;
            for (int j = 0; m == -1 && j < gs->nmesh_names; j++)
                if (!strcmp(gs->mesh_names[j], sg->mesh.axis_name[0])) m = j;
            if (m < 0 || t.rank == MW_MAX_RANK)
                return mw__error(MW_ERR_UNSUPPORTED,
                                 "mw_pipeline_new: parameter '%s' is shared by stages %d and %d, "
                                 "whose devices lie on %s: a shared parameter needs stages of "
                                 "one device or of one data axis",
                                 par->name, tp->owner, tp->other, sg->mesh.desc);
            memmove(&t.ax[1], &t.ax[0], (size_t)t.rank * sizeof t.ax[0]);
            t.rank++;
            t.ax[0] = (mw__axis){
                .name = mw__graph_intern(gs, "PipeShare"), .mesh = m, .size = tp->shares};
            if (t.ax[0].name < 0) return mw__error_copy(gs->status, gs->error);
        }
        if (!(tp->seed = typed_input(gs, &t, name))) return mw__error_copy(gs->status, gs->error);
    }
    if (s == p->S - 1) {
        *stage_loss = map[loss->id];
    } else {
        mw__type scalar = {.dtype = MW_F32, .rank = 0};
        *stage_loss = mw__fill(gs, &scalar, 0.0f);
    }
    if (!*stage_loss || gs->status) return mw__error_copy(gs->status, gs->error);
    return MW_OK;
}

void mw__pipe_cut_free(mw__pipe_cut *cs) {
    mw__free(cs->node_stage);
    mw__free(cs->needed);
    mw__free(cs->readers);
}
