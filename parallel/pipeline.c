/* Pipeline parallelism (meshwit/pipeline.h): the graph cut into stages at its regions, a trainer
 * per stage over the devices at that coordinate of the pipeline axis, and the schedule's forward
 * and backward parts of the micro-batches run by a thread per device position, the values that
 * cross stages handed over in host memory.
 *
 * Cutting: a node outside every region that depends on no region's value (a parameter, an input,
 * a constant, and what is made of them alone outside regions: the embedding lookup, the targets)
 * is "free": it is copied into every stage that reads it. Every other node belongs to its
 * region's stage, or, outside regions, to the latest stage among its inputs.
 * A value of stage s read in stage t > s becomes an input of stage t ("pipe.<node>") whose
 * gradient stage t's trainer returns, and that gradient is the seed ("pipe.grad.<node>") of
 * stage s's backward pass: autodiff sums it first, then what stage s's own readers add, the
 * order the whole graph's backward pass sums them in. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/graph_impl.h"
#include "meshwit.h"
#include "meshwit/pipeline.h"
#include "parallel/mesh_impl.h"
#include "parallel/pipeline_impl.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/program.h"
#include "parallel/trainer_impl.h"

/* A value stage s sends on: its node in s's graph, where it goes, and per micro-batch its value
 * (held here) and the gradient that comes back (held by the reader). */
typedef struct pipe_out {
    mw_tensor *node;      /* in the stage's graph (one of its trainer's outputs) */
    mw_tensor *seed;      /* the input its gradient is fed through */
    int src;              /* the node of the whole graph it is */
    int reader, in;       /* the stage that reads it (-1 until built), its boundary input there */
    int64_t count;        /* elements (f32) */
    float **value;        /* [micro] */
    unsigned char *ready; /* [micro]: value written */
} pipe_out;

/* A value stage t reads from an earlier stage, and its gradient going back. */
typedef struct pipe_in {
    mw_tensor *node; /* the input (or its last shard) in t's graph: a wrt of its trainer */
    int from, out;   /* the stage and which of its pipe_outs */
    int64_t count;
    float **grad;         /* [micro] */
    unsigned char *ready; /* [micro]: grad written */
} pipe_in;

typedef struct norm_ctx {
    struct mw_pipeline *p;
    int stage;
} norm_ctx;

/* A parameter read by two stages (tied embeddings): the earlier one (owner) holds it, the later
 * one a copy (shadow) whose gradient, per micro-batch and per device, is the owner's seed, added
 * first, as the whole graph's backward pass adds the later reader's part first. After the update
 * the owner's value is copied into the shadow. */
typedef struct tied_param {
    int node; /* the parameter in the whole graph */
    int via;  /* split over a mesh axis (FSDP): its one reader, the GATHER that makes it whole,
                 whose gradient (before the reduce-scatter) the shares are; else -1 */
    int owner, other;
    int64_t count;        /* elements */
    int shares;           /* devices of a stage: one gradient share each */
    mw_tensor *seed;      /* in the owner's graph */
    mw_tensor *held;      /* the parameter in the owner's graph */
    mw_tensor *shadow;    /* the parameter in the other's graph */
    float **share;        /* [micro]: shares x count */
    unsigned char *ready; /* [micro] */
    float *value;         /* host copy for the shadow's refresh */
} tied_param;

#define MAX_TIED 8

/* How a stage's graph input is fed. */
typedef enum { FEED_USER, FEED_VALUE, FEED_SEED, FEED_TIED } feed_kind;
typedef struct stage_feed {
    feed_kind kind;
    int index;     /* FEED_USER: the user's input leaf; else the pipe_in / pipe_out */
    int64_t count; /* elements per micro-batch */
    int64_t esize; /* bytes per element */
} stage_feed;

typedef struct stage {
    mw_graph *g;
    mw_mesh mesh; /* the devices of its coordinate, the other axes */
    mw_trainer *tr;
    int device, first_region, nregions;
    int64_t parameters;
    int nout, nin;
    pipe_out *out;
    pipe_in *in;
    int nfeeds;
    stage_feed *feed;
    mw_feed *feeds;      /* handed to the trainer */
    int slots, *slot_of; /* slot_of[micro]: its arena while in flight */
    unsigned char *slot_busy;
    int max_in_flight;
    float *losses;              /* [micro] (last stage) */
    double busy_ms, part_ms[3]; /* the last step's: all, and F, B, W apart */
    norm_ctx norm;              /* its trainer's global_norm_ctx */
} stage;

struct mw_pipeline {
    mw_graph *g;
    mw_mesh *mesh;
    int P, V, S, M;
    mw_pipeline_schedule kind;
    mw__pipe_schedule sched;
    stage *st;
    float *zeros;            /* the seeds' feed during a forward part (not read) */
    const mw_feed **user_of; /* this step's user feeds, by input leaf */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    mw_status failed;
    char msg[MW__MSG_SIZE];
    /* Global gradient norm of the update (global_norm): per stage its norm, and how many posted. */
    float *norms;
    int nposted;
    int64_t norm_round, round_now;
    double *idle;
    int stepped;
    const int *region_stage; /* the configuration's, during mw_pipeline_new */
    int ntied;
    tied_param tied[MAX_TIED];
    double step_ms; /* the last step's */
};

/* ---- cutting the graph ---------------------------------------------------------------------- */

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
static void sub_mesh(const mw_mesh *m, int a, int c, mw_mesh *out) {
    *out = *m;
    out->ndevices = 0;
    for (int d = 0; d < m->ndevices; d++) {
        if (mw__mesh_coord(m, d, a) != c) continue;
        int k = out->ndevices++;
        memcpy(out->device_name[k], m->device_name[d], sizeof out->device_name[k]);
        out->ordinal[k] = m->ordinal[d];
        out->proc_of[k] = 0;
    }
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

typedef struct cut_state {
    int *node_stage;   /* -1: free */
    uint64_t *needed;  /* free nodes: the stages that read them (bit per stage) */
    uint64_t *readers; /* placed nodes: the stages of the placed nodes that read them */
} cut_state;

static mw_status cut_graph(mw_pipeline *p, const mw_tensor *loss, cut_state *cs) {
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

/* Builds stage s's graph: its nodes and the free nodes it reads, values of earlier stages as
 * inputs, seeds for the values later stages read, and its loss (the graph's on the last stage,
 * a constant 0 elsewhere: only the seeds start its backward pass). */
static mw_status build_stage(mw_pipeline *p, const mw_tensor *loss, const cut_state *cs, int s,
                             int axis, mw_tensor **map, mw_tensor **stage_loss,
                             int *user_leaf_of_input) {
    const mw_graph *g = p->g;
    stage *sg = &p->st[s];
    int n = g->nnodes;
    sg->device = s % p->P;
    sub_mesh(p->mesh, axis, sg->device, &sg->mesh);
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

/* ---- running ----------------------------------------------------------------------------- */

static float global_norm(void *ctx, int device, float norm);

static mw_status fail(mw_pipeline *p, mw_status st, int s, const char *what) {
    pthread_mutex_lock(&p->mu);
    if (!p->failed) {
        p->failed = st;
        snprintf(p->msg, sizeof p->msg, "stage %d (%s): %s", s, what, mw_last_error());
    }
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return st;
}

/* Waits until *flag is set or the step failed; 0 when set. */
static int wait_flag(mw_pipeline *p, const unsigned char *flag) {
    pthread_mutex_lock(&p->mu);
    while (!*flag && !p->failed) pthread_cond_wait(&p->cv, &p->mu);
    int bad = !*flag;
    pthread_mutex_unlock(&p->mu);
    return bad;
}

static void set_flag(mw_pipeline *p, unsigned char *flag) {
    pthread_mutex_lock(&p->mu);
    *flag = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* The stage's feeds for micro-batch m; seeds from the readers' gradients (backward) or zeros. */
static void stage_feeds(mw_pipeline *p, stage *sg, int m, int backward) {
    for (int f = 0; f < sg->nfeeds; f++) {
        const stage_feed *sf = &sg->feed[f];
        mw_feed *fd = &sg->feeds[f];
        fd->count = sf->count;
        switch (sf->kind) {
        case FEED_USER:
            fd->data = (const char *)p->user_of[sf->index]->data + m * sf->count * sf->esize;
            break;
        case FEED_VALUE: {
            const pipe_in *pi = &sg->in[sf->index];
            fd->data = p->st[pi->from].out[pi->out].value[m];
            break;
        }
        case FEED_SEED: {
            const pipe_out *po = &sg->out[sf->index];
            fd->data = backward ? (const void *)p->st[po->reader].in[po->in].grad[m] : p->zeros;
            break;
        }
        case FEED_TIED:
            fd->data = backward ? (const void *)p->tied[sf->index].share[m] : p->zeros;
            break;
        }
    }
}

/* Each device's share of the shadow's gradient for micro-batch m (zeros where the stage's loss
 * does not reach it), in the owner's seed layout: device d's at d x count. */
static mw_status read_shares(mw_trainer *tr, int j, tied_param *tp, int m) {
    mw__program *prog = tr->prog;
    const mw_tensor *h = tr->share_out[j];
    int o = 0;
    while (h && o < prog->noutputs && prog->user_outputs[o] != h) o++;
    for (int d = 0; d < prog->nworkers; d++) {
        float *dst = tp->share[m] + (int64_t)d * tp->count;
        worker *w = &prog->w[d];
        if (!h) {
            memset(dst, 0, (size_t)tp->count * sizeof *dst);
            continue;
        }
        mw_status st = w->dev.vt->download(&w->dev, dst, mw__ptr(w, w->plan.outputs[o]),
                                           (size_t)tp->count * sizeof *dst);
        if (st) return st;
    }
    return MW_OK;
}

static mw_status run_forward(mw_pipeline *p, int s, int m) {
    stage *sg = &p->st[s];
    for (int k = 0; k < sg->nin; k++) {
        const pipe_in *pi = &sg->in[k];
        if (wait_flag(p, &p->st[pi->from].out[pi->out].ready[m])) return MW_ERR_INTERRUPTED;
    }
    int slot = 0;
    while (slot < sg->slots && sg->slot_busy[slot]) slot++;
    if (slot == sg->slots)
        return fail(p, mw__error(MW_ERR_STATE, "no free activation slot for micro-batch %d", m), s,
                    "forward");
    sg->slot_busy[slot] = 1;
    sg->slot_of[m] = slot;
    stage_feeds(p, sg, m, 0);
    int64_t t0 = mw__now_ns();
    mw_status st = mw__trainer_forward_keep(sg->tr, slot, m, sg->feeds, sg->nfeeds);
    for (int j = 0; st == MW_OK && j < sg->nout; j++)
        st = mw__program_read_output(sg->tr->prog, "mw_pipeline_step", sg->out[j].node,
                                     sg->out[j].value[m], sg->out[j].count);
    sg->part_ms[0] += (double)(mw__now_ns() - t0) * 1e-6;
    if (st) return fail(p, st, s, "forward");
    for (int j = 0; j < sg->nout; j++) set_flag(p, &sg->out[j].ready[m]);
    return MW_OK;
}

static mw_status run_backward(mw_pipeline *p, int s, int m) {
    stage *sg = &p->st[s];
    for (int j = 0; j < sg->nout; j++) {
        const pipe_out *po = &sg->out[j];
        if (wait_flag(p, &p->st[po->reader].in[po->in].ready[m])) return MW_ERR_INTERRUPTED;
    }
    for (int k = 0; k < p->ntied; k++)
        if (p->tied[k].owner == s && wait_flag(p, &p->tied[k].ready[m])) return MW_ERR_INTERRUPTED;
    stage_feeds(p, sg, m, 1);
    int64_t t0 = mw__now_ns();
    float loss = 0.0f;
    int zb = p->kind == MW_SCHEDULE_ZERO_BUBBLE;
    mw_status st =
        zb ? mw__trainer_backward_input(sg->tr, sg->slot_of[m], m, sg->feeds, sg->nfeeds)
           : mw__trainer_backward_rest(sg->tr, sg->slot_of[m], m, sg->feeds, sg->nfeeds, &loss);
    for (int k = 0; st == MW_OK && k < sg->nin; k++) {
        const mw_tensor *h = sg->tr->wrt_out[k];
        if (h)
            st = mw__program_read_output(sg->tr->prog, "mw_pipeline_step", h, sg->in[k].grad[m],
                                         sg->in[k].count);
        else
            memset(sg->in[k].grad[m], 0, (size_t)sg->in[k].count * sizeof(float));
    }
    for (int k = 0, j = 0; st == MW_OK && k < p->ntied; k++)
        if (p->tied[k].other == s) st = read_shares(sg->tr, j++, &p->tied[k], m);
    sg->part_ms[1] += (double)(mw__now_ns() - t0) * 1e-6;
    if (!zb) sg->slot_busy[sg->slot_of[m]] = 0;
    if (st) return fail(p, st, s, "backward");
    if (sg->losses && !zb) sg->losses[m] = loss;
    for (int k = 0; k < sg->nin; k++) set_flag(p, &sg->in[k].ready[m]);
    for (int k = 0; k < p->ntied; k++)
        if (p->tied[k].other == s) set_flag(p, &p->tied[k].ready[m]);
    return MW_OK;
}

/* Zero-bubble's W: the weight gradients of micro-batch m, accumulated; its slot is free again. */
static mw_status run_weights(mw_pipeline *p, int s, int m) {
    stage *sg = &p->st[s];
    stage_feeds(p, sg, m, 1);
    int64_t t0 = mw__now_ns();
    float loss = 0.0f;
    mw_status st =
        mw__trainer_backward_weight(sg->tr, sg->slot_of[m], m, sg->feeds, sg->nfeeds, &loss);
    sg->part_ms[2] += (double)(mw__now_ns() - t0) * 1e-6;
    sg->slot_busy[sg->slot_of[m]] = 0;
    if (st) return fail(p, st, s, "weight gradients");
    if (sg->losses) sg->losses[m] = loss;
    return MW_OK;
}

typedef struct driver {
    mw_pipeline *p;
    int d;
    pthread_t thread;
    int64_t first_ns, last_ns;
    mw_status st;
} driver;

static void *drive(void *arg) {
    driver *dr = arg;
    mw_pipeline *p = dr->p;
    const mw__pipe_schedule *sc = &p->sched;
    dr->first_ns = mw__now_ns();
    for (int i = 0; i < sc->nact[dr->d] && !dr->st; i++) {
        const mw__pipe_action *a = &sc->act[dr->d][i];
        int s = a->chunk * p->P + dr->d;
        if (a->kind == MW__PIPE_F)
            dr->st = run_forward(p, s, a->micro);
        else if (a->kind == MW__PIPE_B)
            dr->st = run_backward(p, s, a->micro);
        else
            dr->st = run_weights(p, s, a->micro);
    }
    dr->last_ns = mw__now_ns();
    return NULL;
}

typedef struct updater {
    mw_pipeline *p;
    int s;
    pthread_t thread;
    mw_status st;
    char msg[MW__MSG_SIZE];
} updater;

static void *update_stage(void *arg) {
    updater *u = arg;
    u->st = mw__trainer_update(u->p->st[u->s].tr);
    if (u->st) snprintf(u->msg, sizeof u->msg, "%s", mw_last_error());
    return NULL;
}

/* Every stage's device `device` posts its stage's norm (all devices of a stage have the same)
 * and gets the whole model's: the root of the sum of the stages' squares. */
static float global_norm(void *ctx, int device, float norm) {
    norm_ctx *c = ctx;
    mw_pipeline *p = c->p;
    pthread_mutex_lock(&p->mu);
    if (device == 0) {
        p->norms[c->stage] = norm;
        if (++p->nposted == p->S) {
            p->norm_round++;
            pthread_cond_broadcast(&p->cv);
        }
    }
    while (p->norm_round == p->round_now && !p->failed) pthread_cond_wait(&p->cv, &p->mu);
    double sq = 0;
    for (int s = 0; s < p->S; s++) sq += (double)p->norms[s] * (double)p->norms[s];
    pthread_mutex_unlock(&p->mu);
    return p->failed ? NAN : (float)sqrt(sq);
}

static void release(mw_pipeline *p) {
    /* A failed update must not keep a stage waiting in global_norm. */
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Checks a step's feeds (every input once, M micro-batches of it) and keeps them by input leaf. */
static mw_status check_feeds(mw_pipeline *p, const mw_feed *feeds, int nfeeds, const char *caller) {
    if (nfeeds < 0 || (nfeeds > 0 && !feeds))
        return mw__error(MW_ERR_INVALID, "%s: feeds NULL or nfeeds < 0", caller);
    const mw_graph *g = p->g;
    for (int i = 0; i < g->ninputs; i++) p->user_of[i] = NULL;
    for (int f = 0; f < nfeeds; f++) {
        const mw_tensor *in = NULL;
        for (int i = 0; i < g->nnodes && !in; i++)
            if (g->nodes[i]->op == MW__OP_INPUT && feeds[f].name &&
                !strcmp(g->nodes[i]->name, feeds[f].name))
                in = g->nodes[i];
        if (!in)
            return mw__error(MW_ERR_INVALID, "%s: feed '%s' is not an input", caller,
                             feeds[f].name ? feeds[f].name : "(null)");
        if (p->user_of[in->leaf])
            return mw__error(MW_ERR_INVALID, "%s: input '%s' is fed twice", caller, in->name);
        int64_t want = mw__type_numel(&in->type) * p->M;
        if (feeds[f].count != want || !feeds[f].data)
            return mw__error(MW_ERR_INVALID,
                             "%s: feed '%s' has %lld elements%s; it needs %lld "
                             "(%d micro-batches of %lld)",
                             caller, in->name, (long long)feeds[f].count,
                             feeds[f].data ? "" : " and NULL data", (long long)want, p->M,
                             (long long)mw__type_numel(&in->type));
        p->user_of[in->leaf] = &feeds[f];
    }
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i]->op == MW__OP_INPUT && !p->user_of[g->nodes[i]->leaf])
            return mw__error(MW_ERR_INVALID, "%s: input '%s' is not fed", caller,
                             g->nodes[i]->name);
    return MW_OK;
}

mw_status mw_pipeline_step(mw_pipeline *p, const mw_feed *feeds, int nfeeds, float *loss) {
    if (!p) return mw__error(MW_ERR_INVALID, "mw_pipeline_step: pipeline is NULL");
    if (mw_stop_requested())
        return mw__error(MW_ERR_INTERRUPTED,
                         "mw_pipeline_step: a stop was requested; the pipeline is unchanged");
    mw_status fst = check_feeds(p, feeds, nfeeds, "mw_pipeline_step");
    if (fst) return fst;
    /* Phase 1: the schedule; every micro-batch accumulated on every stage. */
    p->failed = MW_OK;
    p->msg[0] = '\0';
    for (int s = 0; s < p->S; s++) {
        stage *sg = &p->st[s];
        sg->busy_ms = sg->part_ms[0] = sg->part_ms[1] = sg->part_ms[2] = 0;
        for (int j = 0; j < sg->nout; j++) memset(sg->out[j].ready, 0, (size_t)p->M);
        for (int k = 0; k < sg->nin; k++) memset(sg->in[k].ready, 0, (size_t)p->M);
        memset(sg->slot_busy, 0, (size_t)sg->slots);
    }
    for (int k = 0; k < p->ntied; k++) memset(p->tied[k].ready, 0, (size_t)p->M);
    driver dr[MW_MAX_DEVICES];
    int started = 0;
    for (int d = 0; d < p->P; d++) dr[d] = (driver){.p = p, .d = d};
    for (int d = 1; d < p->P; d++) {
        if (pthread_create(&dr[d].thread, NULL, drive, &dr[d]) != 0) {
            fail(p, mw__error(MW_ERR_NOMEM, "cannot start a thread"), d, "start");
            break;
        }
        started = d;
    }
    if (!p->failed) drive(&dr[0]);
    for (int d = 1; d <= started; d++) pthread_join(dr[d].thread, NULL);
    int64_t t0 = dr[0].first_ns, t1 = dr[0].last_ns;
    for (int d = 1; d <= started; d++) {
        if (dr[d].first_ns < t0) t0 = dr[d].first_ns;
        if (dr[d].last_ns > t1) t1 = dr[d].last_ns;
    }
    mw_status st = p->failed;
    if (st == MW_OK) {
        /* Phase 2: every stage updates at once (they meet in global_norm). */
        updater up[MW_MAX_DEVICES];
        p->nposted = 0;
        p->round_now = p->norm_round;
        int ups = 0;
        for (int s = 1; s < p->S; s++) {
            up[s] = (updater){.p = p, .s = s};
            if (pthread_create(&up[s].thread, NULL, update_stage, &up[s]) != 0) break;
            ups = s;
        }
        up[0] = (updater){.p = p, .s = 0};
        if (ups == p->S - 1) {
            update_stage(&up[0]);
        } else {
            up[0].st = mw__error(MW_ERR_NOMEM, "cannot start a thread");
            snprintf(up[0].msg, sizeof up[0].msg, "%s", mw_last_error());
            pthread_mutex_lock(&p->mu);
            p->failed = MW_ERR_NOMEM;
            pthread_mutex_unlock(&p->mu);
            release(p);
        }
        for (int s = 1; s <= ups; s++) pthread_join(up[s].thread, NULL);
        int updated = 0, first_bad = -1;
        for (int s = 0; s < p->S; s++) {
            if (up[s].st == MW_OK)
                updated++;
            else if (first_bad < 0)
                first_bad = s;
        }
        if (first_bad >= 0) {
            st = up[first_bad].st;
            snprintf(p->msg, sizeof p->msg, "stage %d (update): %s%s", first_bad, up[first_bad].msg,
                     updated ? "; other stages updated: the model is no longer consistent, "
                               "load a checkpoint"
                             : "");
        }
    }
    for (int k = 0; st == MW_OK && k < p->ntied; k++) {
        tied_param *tp = &p->tied[k];
        const char *name = p->g->nodes[tp->node]->name;
        st = mw_trainer_read_param(p->st[tp->owner].tr, name, tp->value, tp->count);
        if (st == MW_OK)
            st = mw_trainer_write_param(p->st[tp->other].tr, name, tp->value, tp->count);
        if (st)
            snprintf(p->msg, sizeof p->msg, "copying the updated '%s' to stage %d: %s", name,
                     tp->other, mw_last_error());
    }
    if (st) {
        for (int s = 0; s < p->S; s++) p->st[s].tr->accumulated = 0; /* the next step afresh */
        return mw__error(st, "mw_pipeline_step: %s", p->msg);
    }
    for (int s = 0; s < p->S; s++)
        p->st[s].busy_ms = p->st[s].part_ms[0] + p->st[s].part_ms[1] + p->st[s].part_ms[2];
    /* Idle fractions per device over the step's schedule. */
    double wall = (double)(t1 - t0) * 1e-6;
    for (int d = 0; d < p->P; d++) {
        double busy = 0;
        for (int c = 0; c < p->V; c++) busy += p->st[c * p->P + d].busy_ms;
        p->idle[d] = wall > 0 ? 1.0 - busy / wall : 0.0;
    }
    p->stepped = 1;
    p->step_ms = wall;
    if (loss) {
        double sum = 0;
        for (int m = 0; m < p->M; m++) sum += p->st[p->S - 1].losses[m];
        *loss = (float)(sum / p->M);
    }
    return MW_OK;
}

/* ---- making and freeing ------------------------------------------------------------------ */

static void free_micro_buffers(int M, float **buf, unsigned char *ready) {
    for (int m = 0; buf && m < M; m++) mw__free(buf[m]);
    mw__free(buf);
    mw__free(ready);
}

void mw_pipeline_free(mw_pipeline *p) {
    if (!p) return;
    for (int s = 0; p->st && s < p->S; s++) {
        stage *sg = &p->st[s];
        mw_trainer_free(sg->tr);
        for (int j = 0; j < sg->nout; j++)
            free_micro_buffers(p->M, sg->out[j].value, sg->out[j].ready);
        for (int k = 0; k < sg->nin; k++) free_micro_buffers(p->M, sg->in[k].grad, sg->in[k].ready);
        mw__free(sg->out);
        mw__free(sg->in);
        mw__free(sg->feed);
        mw__free(sg->feeds);
        mw__free(sg->slot_of);
        mw__free(sg->slot_busy);
        mw__free(sg->losses);
        mw_graph_free(sg->g);
    }
    for (int k = 0; k < p->ntied; k++) {
        free_micro_buffers(p->M, p->tied[k].share, p->tied[k].ready);
        mw__free(p->tied[k].value);
    }
    mw__free(p->st);
    mw__free(p->zeros);
    mw__free(p->user_of);
    mw__free(p->norms);
    mw__free(p->idle);
    mw__pipe_schedule_free(&p->sched);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    mw__free(p);
}

static mw_status check_config(const mw_pipeline_config *c, const mw_mesh *mesh, int *axis) {
    if (!c->axis)
        return mw__error(MW_ERR_INVALID,
                         "mw_pipeline_new: config.axis (the pipeline axis) is NULL");
    if ((*axis = mw__mesh_axis(mesh, c->axis)) < 0)
        return mw__error(MW_ERR_INVALID, "mw_pipeline_new: the mesh %s has no axis '%s'",
                         mesh->desc, c->axis);
    if (mesh->nprocs > 1)
        return mw__error(MW_ERR_UNSUPPORTED,
                         "mw_pipeline_new: the mesh spans %d processes; pipelines run in one "
                         "process in this version",
                         mesh->nprocs);
    if (c->micro_batches < 1)
        return mw__error(MW_ERR_INVALID, "mw_pipeline_new: micro_batches is %d; it must be >= 1",
                         c->micro_batches);
    if (c->schedule != MW_SCHEDULE_GPIPE && c->schedule != MW_SCHEDULE_1F1B &&
        c->schedule != MW_SCHEDULE_INTERLEAVED && c->schedule != MW_SCHEDULE_ZERO_BUBBLE)
        return mw__error(MW_ERR_INVALID, "mw_pipeline_new: unknown schedule %d", (int)c->schedule);
    if (c->schedule == MW_SCHEDULE_INTERLEAVED ? c->virtual_stages < 2
                                               : c->virtual_stages < 0 || c->virtual_stages > 1)
        return mw__error(MW_ERR_INVALID,
                         "mw_pipeline_new: virtual_stages is %d; the interleaved schedule needs "
                         ">= 2, the others 0 or 1",
                         c->virtual_stages);
    if (c->trainer.pipeline_axis || c->trainer.micro_batches > 1 || c->trainer.virtual_stages > 1)
        return mw__error(MW_ERR_INVALID,
                         "mw_pipeline_new: config.trainer.pipeline_axis, micro_batches or "
                         "virtual_stages is set; a stage is not a pipeline itself (give them in "
                         "mw_pipeline_config)");
    if (c->trainer.noutputs || c->trainer.outputs)
        return mw__error(MW_ERR_UNSUPPORTED,
                         "mw_pipeline_new: config.trainer.outputs: a pipeline's values are not "
                         "read back in this version");
    return MW_OK;
}

/* The input a value fed to a stage is made of (through its shards). */
static const mw_tensor *input_of(const mw_tensor *x) {
    while (x->op == MW__OP_SHARD) x = x->in[0];
    return x;
}

/* M buffers of count floats and their M ready flags. */
static mw_status micro_buffers(int M, int64_t count, float ***buf, unsigned char **ready) {
    *buf = mw__calloc((size_t)M, sizeof **buf);
    *ready = mw__calloc((size_t)M, 1);
    for (int m = 0; *buf && *ready && m < M; m++)
        if (!((*buf)[m] = mw__malloc((size_t)count * sizeof(float)))) break;
    if (*buf && *ready && (*buf)[M - 1]) return MW_OK;
    return mw__error(MW_ERR_NOMEM, "mw_pipeline_new: out of memory");
}

/* Makes stage s's trainer: its feeds, its boundary buffers, its slots. */
static mw_status make_stage(mw_pipeline *p, int s, mw_tensor *stage_loss, const int *user_leaf,
                            const mw_pipeline_config *c) {
    mw_status st;
    stage *sg = &p->st[s];
    mw_graph *gs = sg->g;
    /* Slots: the most micro-batches between their F and their last backward action (B, or
     * zero-bubble's W, which still reads the activations) on this chunk. */
    int chunk = s / p->P, live = 0,
        release = p->kind == MW_SCHEDULE_ZERO_BUBBLE ? MW__PIPE_W : MW__PIPE_B;
    for (int i = 0; i < p->sched.nact[sg->device]; i++) {
        const mw__pipe_action *a = &p->sched.act[sg->device][i];
        if (a->chunk != chunk) continue;
        live += a->kind == MW__PIPE_F ? 1 : a->kind == release ? -1 : 0;
        if (live > sg->max_in_flight) sg->max_in_flight = live;
    }
    sg->slots = sg->max_in_flight < 1 ? 1 : sg->max_in_flight;
    int M = p->M;
    sg->slot_of = mw__calloc((size_t)M, sizeof *sg->slot_of);
    sg->slot_busy = mw__calloc((size_t)sg->slots, 1);
    sg->feed = mw__calloc((size_t)gs->ninputs + 1, sizeof *sg->feed);
    sg->feeds = mw__calloc((size_t)gs->ninputs + 1, sizeof *sg->feeds);
    if (s == p->S - 1) sg->losses = mw__calloc((size_t)M, sizeof *sg->losses);
    if (!sg->slot_of || !sg->slot_busy || !sg->feed || !sg->feeds || (s == p->S - 1 && !sg->losses))
        return mw__error(MW_ERR_NOMEM, "mw_pipeline_new: out of memory");
    for (int j = 0; j < sg->nout; j++)
        if ((st = micro_buffers(M, sg->out[j].count, &sg->out[j].value, &sg->out[j].ready)))
            return st;
    for (int k = 0; k < sg->nin; k++)
        if ((st = micro_buffers(M, sg->in[k].count, &sg->in[k].grad, &sg->in[k].ready))) return st;
    for (int k = 0; k < p->ntied; k++) {
        tied_param *tp = &p->tied[k];
        if (tp->owner != s) continue;
        if ((st = micro_buffers(M, tp->shares * tp->count, &tp->share, &tp->ready))) return st;
        if (!(tp->value = mw__malloc((size_t)tp->count * sizeof(float))))
            return mw__error(MW_ERR_NOMEM, "mw_pipeline_new: out of memory");
    }
    /* The feeds, in the stage graph's input order. */
    for (int i = 0; i < gs->nnodes; i++) {
        const mw_tensor *t = gs->nodes[i];
        if (t->op != MW__OP_INPUT) continue;
        stage_feed *sf = &sg->feed[t->leaf];
        sf->count = mw__type_numel(&t->type);
        sf->esize = mw__dtype_bytes(t->type.dtype);
        sf->kind = FEED_USER;
        sf->index = user_leaf[t->leaf];
        for (int k = 0; k < sg->nin; k++)
            if (input_of(sg->in[k].node) == t)
                *sf = (stage_feed){FEED_VALUE, k, sf->count, sf->esize};
        for (int j = 0; j < sg->nout; j++)
            if (input_of(sg->out[j].seed) == t)
                *sf = (stage_feed){FEED_SEED, j, sf->count, sf->esize};
        for (int k = 0; k < p->ntied; k++)
            if (p->tied[k].owner == s && input_of(p->tied[k].seed) == t)
                *sf = (stage_feed){FEED_TIED, k, sf->count, sf->esize};
        sg->feeds[t->leaf].name = t->name;
    }
    sg->nfeeds = gs->ninputs;
    /* The trainer: the stage's values as outputs, its seeds and wrts. */
    mw_tensor *outs[MW_MAX_DEVICES * 4], *seed_of[MW_MAX_DEVICES * 4], *seeds[MW_MAX_DEVICES * 4],
        *wrt[MW_MAX_DEVICES * 4];
    if (sg->nout > MW_MAX_DEVICES * 4 || sg->nin > MW_MAX_DEVICES * 4)
        return mw__error(MW_ERR_UNSUPPORTED,
                         "mw_pipeline_new: stage %d exchanges %d values with its neighbours; at "
                         "most %d",
                         s, sg->nout > sg->nin ? sg->nout : sg->nin, MW_MAX_DEVICES * 4);
    int nseeds = sg->nout, nshares = 0;
    mw_tensor *shares[MAX_TIED];
    for (int j = 0; j < sg->nout; j++) {
        outs[j] = seed_of[j] = sg->out[j].node;
        seeds[j] = sg->out[j].seed;
    }
    for (int k = 0; k < p->ntied; k++) {
        if (p->tied[k].owner == s) {
            seed_of[nseeds] = p->tied[k].held;
            seeds[nseeds++] = p->tied[k].seed;
        }
        if (p->tied[k].other == s) shares[nshares++] = p->tied[k].shadow;
    }
    for (int k = 0; k < sg->nin; k++) wrt[k] = sg->in[k].node;
    mw_trainer_config tc = c->trainer;
    tc.outputs = outs;
    tc.noutputs = sg->nout;
    tc.grad_accumulation = 1;
    mw__trainer_stage spec = {.split_weights = p->kind == MW_SCHEDULE_ZERO_BUBBLE,
                              .nseeds = nseeds,
                              .nshares = nshares,
                              .share_of = shares,
                              .nwrt = sg->nin,
                              .slots = sg->slots,
                              .seed_of = seed_of,
                              .seeds = seeds,
                              .wrt = wrt};
    st = mw__trainer_new_stage(gs, stage_loss, &sg->mesh, &tc, &spec, &sg->tr);
    if (st) {
        char msg[MW__MSG_SIZE];
        snprintf(msg, sizeof msg, "%s", mw_last_error());
        return mw__error(st, "mw_pipeline_new: stage %d: %s", s, msg);
    }
    sg->norm = (norm_ctx){.p = p, .stage = s};
    sg->tr->global_norm = global_norm;
    sg->tr->global_norm_ctx = &sg->norm;
    for (int i = 0; i < gs->nnodes; i++)
        if (gs->nodes[i]->op == MW__OP_PARAM) sg->parameters += mw__type_numel(&gs->nodes[i]->type);
    return MW_OK;
}

mw_status mw_pipeline_new(mw_graph *graph, mw_tensor *loss, mw_mesh *mesh,
                          const mw_pipeline_config *config, mw_pipeline **out) {
    if (!out) return mw__error(MW_ERR_INVALID, "mw_pipeline_new: out is NULL");
    *out = NULL;
    if (!graph || !mesh || !config || !loss)
        return mw__error(MW_ERR_INVALID, "mw_pipeline_new: graph, loss, mesh or config is NULL");
    if (graph->status) return mw__error_copy(graph->status, graph->error);
    if (loss->g != graph)
        return mw__error(MW_ERR_INVALID, "mw_pipeline_new: the loss is from another graph");
    if (loss->type.rank != 0 || loss->type.dtype != MW_F32)
        return mw__error(MW_ERR_SHAPE, "mw_pipeline_new: the loss must be an f32 scalar");
    if (graph->region_open)
        return mw__error(MW_ERR_INVALID, "mw_pipeline_new: region \"%s\" was begun but never ended",
                         graph->region_name);
    int axis = -1;
    mw_status st = check_config(config, mesh, &axis);
    if (st) return st;
    /* Nothing may be split over the pipeline axis. */
    for (int i = 0; i < graph->nnodes; i++) {
        const mw__type *t = &graph->nodes[i]->type;
        for (int k = 0; k < t->rank; k++)
            if (t->ax[k].mesh >= 0 && !strcmp(graph->mesh_names[t->ax[k].mesh], config->axis)) {
                char d[256];
                return mw__error(MW_ERR_SHARDING,
                                 "mw_pipeline_new: %s (node %d, %s) is split over the pipeline "
                                 "axis %s; the pipeline axis holds stages, so shard over another "
                                 "axis",
                                 mw__type_describe(graph, t, d, sizeof d), i,
                                 mw__op_name(graph->nodes[i]->op), config->axis);
            }
    }
    mw_pipeline *p = mw__calloc(1, sizeof *p);
    if (!p) return mw__error(MW_ERR_NOMEM, "mw_pipeline_new: out of memory");
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->g = graph;
    p->mesh = mesh;
    p->P = mesh->axis_size[axis];
    p->V = config->virtual_stages > 1 ? config->virtual_stages : 1;
    p->S = p->P * p->V;
    p->M = config->micro_batches;
    p->kind = config->schedule;
    p->region_stage = config->region_stage;
    cut_state cs = {0};
    mw_tensor **map = NULL;
    int *user_leaf = NULL;
    if (p->S > 64) {
        st = mw__error(MW_ERR_UNSUPPORTED, "mw_pipeline_new: %d stages; at most 64", p->S);
        goto fail;
    }
    st = mw__pipe_schedule_make((mw__pipe_sched)p->kind, p->P, p->M, p->V, &p->sched);
    if (st) {
        st = mw__error(st, "mw_pipeline_new: %s", mw_last_error());
        goto fail;
    }
    p->st = mw__calloc((size_t)p->S, sizeof *p->st);
    p->user_of = mw__calloc((size_t)graph->ninputs + 1, sizeof *p->user_of);
    p->norms = mw__calloc((size_t)p->S, sizeof *p->norms);
    p->idle = mw__calloc((size_t)p->P, sizeof *p->idle);
    map = mw__calloc((size_t)graph->nnodes + 1, sizeof *map);
    user_leaf = mw__calloc((size_t)graph->nnodes + 1, sizeof *user_leaf);
    if (!p->st || !p->user_of || !p->norms || !p->idle || !map || !user_leaf) {
        st = mw__error(MW_ERR_NOMEM, "mw_pipeline_new: out of memory");
        goto fail;
    }
    if ((st = cut_graph(p, loss, &cs))) goto fail;
    int64_t zeros = 1;
    for (int s = 0; s < p->S && st == MW_OK; s++) {
        mw_tensor *stage_loss = NULL;
        if ((st = build_stage(p, loss, &cs, s, axis, map, &stage_loss, user_leaf))) break;
        for (int j = 0; j < p->st[s].nout; j++)
            if (p->st[s].out[j].count > zeros) zeros = p->st[s].out[j].count;
        for (int k = 0; k < p->ntied; k++)
            if (p->tied[k].owner == s && p->tied[k].shares * p->tied[k].count > zeros)
                zeros = p->tied[k].shares * p->tied[k].count;
        /* The values this stage sends must all have a reader by now... checked below. */
        st = make_stage(p, s, stage_loss, user_leaf, config);
    }
    for (int s = 0; st == MW_OK && s < p->S; s++)
        for (int j = 0; j < p->st[s].nout; j++)
            if (p->st[s].out[j].reader < 0) {
                st = mw__error(MW_ERR_UNSUPPORTED,
                               "mw_pipeline_new: a value of stage %d is read by a later stage "
                               "that did not take it",
                               s);
                break;
            }
    if (st == MW_OK && !(p->zeros = mw__calloc((size_t)zeros, sizeof(float))))
        st = mw__error(MW_ERR_NOMEM, "mw_pipeline_new: out of memory");
    if (st) goto fail;
    mw__free(cs.node_stage);
    mw__free(cs.needed);
    mw__free(cs.readers);
    mw__free(map);
    mw__free(user_leaf);
    p->region_stage = NULL;
    *out = p;
    return MW_OK;
fail : {
    char msg[MW__MSG_SIZE];
    snprintf(msg, sizeof msg, "%s", mw_last_error());
    mw__free(cs.node_stage);
    mw__free(cs.needed);
    mw__free(cs.readers);
    mw__free(map);
    mw__free(user_leaf);
    mw_pipeline_free(p);
    return mw__error_copy(st, msg);
}
}

/* The stage holding parameter `name`, or -1. */
static int stage_of_param(const mw_pipeline *p, const char *name) {
    for (int s = 0; s < p->S; s++) {
        const mw_graph *gs = p->st[s].g;
        for (int i = 0; i < gs->nnodes; i++)
            if (gs->nodes[i]->op == MW__OP_PARAM && !strcmp(gs->nodes[i]->name, name)) return s;
    }
    return -1;
}

mw_status mw_pipeline_read_param(mw_pipeline *p, const char *name, float *dst, int64_t count) {
    if (!p || !name) return mw__error(MW_ERR_INVALID, "mw_pipeline_read_param: NULL argument");
    int s = stage_of_param(p, name);
    if (s < 0)
        return mw__error(MW_ERR_NOT_FOUND, "mw_pipeline_read_param: no parameter '%s'", name);
    return mw_trainer_read_param(p->st[s].tr, name, dst, count);
}

mw_status mw_pipeline_write_param(mw_pipeline *p, const char *name, const float *src,
                                  int64_t count) {
    if (!p || !name) return mw__error(MW_ERR_INVALID, "mw_pipeline_write_param: NULL argument");
    int s = stage_of_param(p, name);
    if (s < 0)
        return mw__error(MW_ERR_NOT_FOUND, "mw_pipeline_write_param: no parameter '%s'", name);
    /* The owner, then a tied parameter's other stage (its copy must not lag behind). */
    mw_status st = mw_trainer_write_param(p->st[s].tr, name, src, count);
    for (int k = 0; st == MW_OK && k < p->ntied; k++)
        if (p->tied[k].owner == s && !strcmp(p->g->nodes[p->tied[k].node]->name, name))
            st = mw_trainer_write_param(p->st[p->tied[k].other].tr, name, src, count);
    return st;
}

int mw_pipeline_stages(const mw_pipeline *p) { return p ? p->S : 0; }

mw_status mw_pipeline_stage(const mw_pipeline *p, int s, mw_pipeline_stage_info *out) {
    if (!p || !out || s < 0 || s >= p->S)
        return mw__error(MW_ERR_INVALID,
                         "mw_pipeline_stage: NULL argument or stage %d out of "
                         "range",
                         s);
    const stage *sg = &p->st[s];
    *out = (mw_pipeline_stage_info){.device = sg->device,
                                    .first_region = sg->first_region,
                                    .nregions = sg->nregions,
                                    .parameters = sg->parameters,
                                    .micro_in_flight = sg->max_in_flight,
                                    .forward_ms = sg->part_ms[0],
                                    .backward_ms = sg->part_ms[1],
                                    .weight_ms = sg->part_ms[2],
                                    .busy_ms = sg->busy_ms};
    return mw_trainer_memory(sg->tr, 0, &out->memory);
}

double mw_pipeline_idle(const mw_pipeline *p, int d) {
    if (!p || d < 0 || d >= p->P || !p->stepped) return -1.0;
    return p->idle[d];
}

mw_status mw__pipeline_eval(mw_pipeline *p, const mw_feed *feeds, int nfeeds, float *loss) {
    mw_status st = check_feeds(p, feeds, nfeeds, "mw_trainer_eval");
    double sum = 0;
    for (int m = 0; st == MW_OK && m < p->M; m++)
        for (int s = 0; st == MW_OK && s < p->S; s++) {
            stage *sg = &p->st[s];
            float l = 0.0f;
            stage_feeds(p, sg, m, 0);
            st = mw_trainer_eval(sg->tr, sg->feeds, sg->nfeeds, &l);
            for (int j = 0; st == MW_OK && j < sg->nout; j++)
                st = mw__program_read_output(sg->tr->prog, "mw_trainer_eval", sg->out[j].node,
                                             sg->out[j].value[m], sg->out[j].count);
            if (st) {
                char msg[MW__MSG_SIZE];
                snprintf(msg, sizeof msg, "%s", mw_last_error());
                st = mw__error(st, "mw_trainer_eval: stage %d, micro-batch %d: %s", s, m, msg);
            }
            if (s == p->S - 1) sum += l;
        }
    if (st == MW_OK && loss) *loss = (float)(sum / p->M);
    return st;
}

mw_trainer *mw__pipeline_stage_trainer(const mw_pipeline *p, int s) {
    return p && s >= 0 && s < p->S ? p->st[s].tr : NULL;
}

mw_trainer *mw__pipeline_param_trainer(const mw_pipeline *p, const char *name) {
    int s = p && name ? stage_of_param(p, name) : -1;
    return s >= 0 ? p->st[s].tr : NULL;
}

const mw_graph *mw__pipeline_graph(const mw_pipeline *p) { return p ? p->g : NULL; }

int mw__pipeline_device(const mw_pipeline *p, int device, mw_trainer **out, int *local) {
    if (!p || device < 0 || device >= p->mesh->ndevices) return 0;
    int n = 0; /* the stage meshes hold the mesh's device names */
    for (int s = 0; s < p->S; s++) {
        const mw_mesh *m = &p->st[s].mesh;
        for (int k = 0; k < m->ndevices; k++)
            if (!strcmp(m->device_name[k], p->mesh->device_name[device])) {
                out[n++] = p->st[s].tr;
                *local = k;
            }
    }
    return n;
}

double mw__pipeline_step_ms(const mw_pipeline *p) { return p ? p->step_ms : 0.0; }

int mw__pipeline_devices(const mw_pipeline *p) { return p ? p->mesh->ndevices : 0; }
