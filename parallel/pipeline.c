/* Pipelines (meshwit/pipeline.h): making and freeing one (the stages' graphs from
 * pipeline_cut.c, a trainer per stage), and its parameters and stages as the caller sees them;
 * a step is pipeline_run.c's. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/hash.h"
#include "parallel/pipeline_impl.h"
#include "parallel/pipeline_state.h"
#include "parallel/program.h"
#include "parallel/trainer_impl.h"

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
    mw__pipe_link_close(p);
    mw__free(p->st);
    mw__free(p->loss_buf);
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
    for (int i = 0; i < gs->nnodes; i++)
        if (gs->nodes[i]->op == MW__OP_PARAM) sg->parameters += mw__type_numel(&gs->nodes[i]->type);
    if (!mw__pipe_local(p, s)) return MW_OK; /* another process's: no trainer here */
    p->nlocal++;
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
    sg->tr->global_norm = mw__pipe_global_norm;
    sg->tr->global_norm_ctx = &sg->norm;
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
    p->nprocs = mesh->nprocs;
    p->proc = mesh->proc;
    p->timeout_ms = config->trainer.collective_timeout_ms > 0
                        ? config->trainer.collective_timeout_ms
                        : INT_MAX; /* 0: as the trainer's, wait for ever */
    mw__pipe_cut cs = {0};
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
    p->loss_buf = mw__calloc((size_t)p->M, sizeof *p->loss_buf);
    map = mw__calloc((size_t)graph->nnodes + 1, sizeof *map);
    user_leaf = mw__calloc((size_t)graph->nnodes + 1, sizeof *user_leaf);
    if (!p->st || !p->user_of || !p->norms || !p->idle || !p->loss_buf || !map || !user_leaf) {
        st = mw__error(MW_ERR_NOMEM, "mw_pipeline_new: out of memory");
        goto fail;
    }
    if ((st = mw__pipe_cut_graph(p, loss, &cs))) goto fail;
    int64_t zeros = 1;
    for (int s = 0; s < p->S && st == MW_OK; s++) {
        mw_tensor *stage_loss = NULL;
        if ((st = mw__pipe_build_stage(p, loss, &cs, s, axis, map, &stage_loss, user_leaf))) break;
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
    /* A tied parameter's shares and value, where one of its stages is this process's. */
    for (int k = 0; st == MW_OK && k < p->ntied; k++) {
        tied_param *tp = &p->tied[k];
        if (!mw__pipe_local(p, tp->owner) && !mw__pipe_local(p, tp->other)) continue;
        st = micro_buffers(p->M, tp->shares * tp->count, &tp->share, &tp->ready);
        if (st == MW_OK && !(tp->value = mw__malloc((size_t)tp->count * sizeof(float))))
            st = mw__error(MW_ERR_NOMEM, "mw_pipeline_new: out of memory");
    }
    if (st == MW_OK && !(p->zeros = mw__calloc((size_t)zeros, sizeof(float))))
        st = mw__error(MW_ERR_NOMEM, "mw_pipeline_new: out of memory");
    /* Across processes every one must have got this far: the link is made by all at once. */
    if (p->nprocs > 1) {
        int worst = 0;
        mw_status ast = mw__dist_max_int(st ? 1 : 0, &worst, p->timeout_ms,
                                         "mw_pipeline_new: the processes' stages");
        if (st == MW_OK && (ast || worst))
            st = ast ? ast
                     : mw__error(MW_ERR_STATE,
                                 "mw_pipeline_new: another process could not make its stages "
                                 "(its own error says why)");
    }
    if (st == MW_OK) st = mw__pipe_link_open(p);
    if (st) goto fail;
    mw__pipe_cut_free(&cs);
    mw__free(map);
    mw__free(user_leaf);
    p->region_stage = NULL;
    *out = p;
    return MW_OK;
fail : {
    char msg[MW__MSG_SIZE];
    snprintf(msg, sizeof msg, "%s", mw_last_error());
    mw__pipe_cut_free(&cs);
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

/* MW_OK when buf (fn's argument `arg`) holds the whole of parameter `name` (a parameter of the
 * graph): count its elements; else MW_ERR_INVALID. */
static mw_status whole_count(const mw_pipeline *p, const char *fn, const char *name,
                             const char *arg, const void *buf, int64_t count) {
    int64_t n = 0;
    for (int i = 0; i < p->g->nnodes; i++)
        if (p->g->nodes[i]->op == MW__OP_PARAM && !strcmp(p->g->nodes[i]->name, name))
            n = mw__type_numel(&p->g->nodes[i]->type);
    if (buf && count == n) return MW_OK;
    if (!buf)
        return mw__error(MW_ERR_INVALID, "%s: '%s' has %lld values; count is %lld and %s NULL", fn,
                         name, (long long)n, (long long)count, arg);
    return mw__error(MW_ERR_INVALID, "%s: '%s' has %lld values; count is %lld", fn, name,
                     (long long)n, (long long)count);
}

mw_status mw_pipeline_read_param(mw_pipeline *p, const char *name, float *dst, int64_t count) {
    if (!p || !name) return mw__error(MW_ERR_INVALID, "mw_pipeline_read_param: NULL argument");
    int s = stage_of_param(p, name);
    if (s < 0)
        return mw__error(MW_ERR_NOT_FOUND, "mw_pipeline_read_param: no parameter '%s'", name);
    if (p->nprocs == 1) return mw_trainer_read_param(p->st[s].tr, name, dst, count);
    /* Across processes: read where it is, then every process gets it (a collective). */
    mw_status st = whole_count(p, "mw_pipeline_read_param", name, "dst", dst, count);
    if (st) return st;
    st = mw__pipe_local(p, s) ? mw_trainer_read_param(p->st[s].tr, name, dst, count) : MW_OK;
    char msg[MW__MSG_SIZE];
    int ok = 0;
    snprintf(msg, sizeof msg, "%s", st ? mw_last_error() : "");
    mw_status agreed = mw__pipe_link_agree(p, st, msg, msg, sizeof msg, &ok);
    if (agreed) return mw__error(agreed, "mw_pipeline_read_param: %s", msg);
    return mw__pipeline_share_param(p, name, dst, count);
}

mw_status mw_pipeline_write_param(mw_pipeline *p, const char *name, const float *src,
                                  int64_t count) {
    if (!p || !name) return mw__error(MW_ERR_INVALID, "mw_pipeline_write_param: NULL argument");
    int s = stage_of_param(p, name);
    if (s < 0)
        return mw__error(MW_ERR_NOT_FOUND, "mw_pipeline_write_param: no parameter '%s'", name);
    mw_status st = whole_count(p, "mw_pipeline_write_param", name, "src", src, count);
    if (st) return st;
    /* Every stage of this process holding it: the owner, a tied parameter's other stage (its
     * copy must not lag behind). */
    for (int t = s; st == MW_OK && t < p->S; t++) {
        int holds = t == s;
        for (int k = 0; k < p->ntied; k++)
            holds |= p->tied[k].owner == s && p->tied[k].other == t &&
                     !strcmp(p->g->nodes[p->tied[k].node]->name, name);
        if (holds && mw__pipe_local(p, t))
            st = mw_trainer_write_param(p->st[t].tr, name, src, count);
    }
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
    /* another process's stage: what the graph says, no memory or times */
    return sg->tr ? mw_trainer_memory(sg->tr, 0, &out->memory) : MW_OK;
}

double mw_pipeline_idle(const mw_pipeline *p, int d) {
    if (!p || d < 0 || d >= p->P || !p->stepped) return -1.0;
    return p->idle[d];
}

mw_trainer *mw__pipeline_stage_trainer(const mw_pipeline *p, int s) {
    return p && s >= 0 && s < p->S ? p->st[s].tr : NULL;
}

mw_trainer *mw__pipeline_param_trainer(const mw_pipeline *p, const char *name) {
    int s = p && name ? stage_of_param(p, name) : -1;
    return s >= 0 ? p->st[s].tr : NULL;
}

mw_trainer *mw__pipeline_first_trainer(const mw_pipeline *p) {
    for (int s = 0; p && s < p->S; s++)
        if (p->st[s].tr) return p->st[s].tr;
    return NULL;
}

int mw__pipeline_processes(const mw_pipeline *p) { return p ? p->nprocs : 0; }

mw_status mw__pipeline_share_param(mw_pipeline *p, const char *name, float *buf, int64_t count) {
    int s = stage_of_param(p, name);
    if (s < 0) return mw__error(MW_ERR_NOT_FOUND, "no parameter '%s'", name);
    return mw__pipe_link_bcast(p, p->st[s].proc, buf, (size_t)count * sizeof *buf,
                               "a parameter of another process's stage");
}

mw_status mw__pipeline_check_replicas(mw_pipeline *p) {
    mw_status st = MW_OK;
    char msg[MW__MSG_SIZE] = "";
    /* Each stage's replicas, inside its process. */
    for (int s = 0; st == MW_OK && s < p->S; s++)
        if (mw__pipe_local(p, s) && (st = mw_trainer_check_replicas(p->st[s].tr)))
            snprintf(msg, sizeof msg, "stage %d: %s", s, mw_last_error());
    /* A tied parameter's copy against its owner's value (checksums, the owner's sent to the
     * process of the copy). */
    for (int k = 0; k < p->ntied; k++) {
        const tied_param *tp = &p->tied[k];
        const char *name = p->g->nodes[tp->node]->name;
        uint64_t held = 0, copy = 0;
        mw_status rst = MW_OK;
        if (st == MW_OK && mw__pipe_local(p, tp->owner) &&
            (rst = mw_trainer_read_param(p->st[tp->owner].tr, name, tp->value, tp->count)) == MW_OK)
            held = mw__fnv1a(MW__FNV_BASIS, tp->value, (size_t)tp->count * sizeof(float));
        if (st == MW_OK && rst == MW_OK && mw__pipe_local(p, tp->other) &&
            (rst = mw_trainer_read_param(p->st[tp->other].tr, name, tp->value, tp->count)) == MW_OK)
            copy = mw__fnv1a(MW__FNV_BASIS, tp->value, (size_t)tp->count * sizeof(float));
        if (st == MW_OK && rst) {
            st = rst;
            snprintf(msg, sizeof msg, "reading '%s': %s", name, mw_last_error());
        }
        /* every process takes part, whatever it found so far */
        mw_status bst = mw__pipe_link_bcast(p, p->st[tp->owner].proc, &held, sizeof held,
                                            "mw_trainer_check_replicas: a tied parameter");
        if (bst) return bst; /* the processes no longer agree on what comes next */
        if (st == MW_OK && mw__pipe_local(p, tp->other) && held != copy) {
            st = MW_ERR_STATE;
            snprintf(msg, sizeof msg,
                     "replicas diverged: the copy of the shared parameter '%s' read by stage %d "
                     "differs from its value in stage %d",
                     name, tp->other, tp->owner);
        }
    }
    char agreed[MW__MSG_SIZE];
    int ok = 0;
    mw_status ast = mw__pipe_link_agree(p, st, msg, agreed, sizeof agreed, &ok);
    if (ast) return mw__error(ast, "mw_trainer_check_replicas: %s", agreed);
    return MW_OK;
}

const mw_graph *mw__pipeline_graph(const mw_pipeline *p) { return p ? p->g : NULL; }

int mw__pipeline_device(const mw_pipeline *p, int device, mw_trainer **out, int *local) {
    if (!p || device < 0 || device >= p->mesh->ndevices) return 0;
    int n = 0; /* the stage meshes hold the mesh's device names */
    for (int s = 0; s < p->S; s++) {
        const mw_mesh *m = &p->st[s].mesh;
        for (int k = 0; p->st[s].tr && k < m->ndevices; k++)
            if (!strcmp(m->device_name[k], p->mesh->device_name[device])) {
                out[n++] = p->st[s].tr;
                *local = k;
            }
    }
    return n;
}

double mw__pipeline_step_ms(const mw_pipeline *p) { return p ? p->step_ms : 0.0; }

int mw__pipeline_devices(const mw_pipeline *p) { return p ? p->mesh->ndevices : 0; }
