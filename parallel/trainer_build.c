/* Making and freeing a trainer: a program (parallel/program.h) whose graph gets the backward
 * pass, the optimizer's configuration, the parameter slices (ZeRO-1) and the work the trainer
 * runs on each worker (optimizer.c). */
#include <stdio.h>
#include <string.h>

#include "collectives/reducer.h"
#include "collectives/reducer_select.h"
#include "collectives/wait.h"
#include "core/alloc.h"
#include "core/autodiff.h"
#include "core/error.h"
#include "core/graph_impl.h"
#include "core/plan.h"
#include "meshwit.h"
#include "parallel/consistency.h"
#include "parallel/mesh_impl.h"
#include "parallel/optimizer.h"
#include "parallel/pipeline_impl.h"
#include "parallel/program.h"
#include "parallel/trainer_impl.h"

_Static_assert((int)MW_RECOMPUTE_NONE == (int)MW__RECOMPUTE_NONE &&
                   (int)MW_RECOMPUTE_BLOCKS == (int)MW__RECOMPUTE_BLOCKS &&
                   (int)MW_RECOMPUTE_DOTS == (int)MW__RECOMPUTE_DOTS,
               "mw_recompute and mw__recompute agree");

/* After autodiff: every gradient must be a node of its own that nothing else reads, since it is
 * written straight into the flat gradient buffer and reduced there in place. */
static mw_status own_gradients(mw_trainer *tr) {
    mw_graph *g = tr->prog->g;
    int n = g->nnodes;
    int *readers = mw__calloc((size_t)n, sizeof *readers);
    char *claimed = mw__calloc((size_t)n, 1);
    if (!readers || !claimed) {
        mw__free(readers);
        mw__free(claimed);
        return mw__error(MW_ERR_NOMEM, "out of memory preparing gradients");
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < g->nodes[i]->nin; k++) readers[g->nodes[i]->in[k]->id]++;
    for (int p = 0; p < g->nparams && g->status == MW_OK; p++) {
        mw_tensor *gr = tr->grads[p];
        if (!gr) continue;
        mw__op op = gr->op;
        if (gr->id < n &&
            (claimed[gr->id] || readers[gr->id] || gr->id <= tr->loss->id || op == MW__OP_FILL ||
             op == MW__OP_INPUT || op == MW__OP_PARAM || op == MW__OP_SHARD || op == MW__OP_ALIAS))
            tr->grads[p] = mw_scale(g, gr, 1.0f);
        else if (gr->id < n)
            claimed[gr->id] = 1;
    }
    mw__free(readers);
    mw__free(claimed);
    return g->status ? mw__error_copy(g->status, g->error) : MW_OK;
}

/* The graph mesh names some parameter is split over (a bit each). */
static uint32_t param_splits(const mw_graph *g) {
    uint32_t split = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const mw_tensor *t = g->nodes[i];
        for (int k = 0; t->op == MW__OP_PARAM && k < t->type.rank; k++)
            if (t->type.ax[k].mesh >= 0) split |= 1u << t->type.ax[k].mesh;
    }
    return split;
}

/* With parameters split over mesh axes that shard no input (model axes), a gradient that is
 * partial over those axes (a replicated parameter whose gradient flows through a split layer,
 * e.g. a layer norm before it) is first summed over them alone; afterwards every gradient is
 * partial over the data axes only, so the gradient buckets (and ZeRO-1's slices) are those of one
 * group, and both modes of the optimizer sum every gradient in the same order. */
static mw_status reduce_over_model_axes(mw_trainer *tr) {
    mw_graph *g = tr->prog->g;
    uint32_t data = 0;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i]->op == MW__OP_SHARD)
            data |= 1u << g->nodes[i]->type.ax[g->nodes[i]->p.shard.axis].mesh;
    /* An axis that shards the batch stays a data axis when parameters are split over it too
     * (FSDP): its sums are the buckets', as with the parameters replicated. */
    uint32_t model = param_splits(g);
    model &= ~data;
    for (int p = 0; model && p < g->nparams; p++) {
        mw_tensor *gr = tr->grads[p];
        if (!gr || !(gr->type.partial & model)) continue;
        mw_tensor proto = {.op = MW__OP_ALLREDUCE, .nin = 1, .in = {gr}, .type = gr->type};
        proto.type.partial &= ~model;
        if (!(tr->grads[p] = mw__node_new(g, &proto))) return mw__error_copy(g->status, g->error);
    }
    return MW_OK;
}

mw_status mw__zero1_collectives(const mw__reducer_vtable *reducer,
                                const mw__reducer_vtable *all_reducer, const char *mesh) {
    const mw__reducer_vtable *lacking = !reducer->reduce_scatter_sum || !reducer->all_gather
                                            ? reducer
                                        : !all_reducer->all_gather ? all_reducer
                                                                   : NULL;
    if (!lacking) return MW_OK;
    return mw__error(MW_ERR_UNSUPPORTED,
                     "mw_trainer_new: shard_optimizer needs reduce-scatter and all-gather, which "
                     "the %s reducer of %s lacks",
                     lacking->name, mesh);
}

/* With sharded parameters the flat layouts differ between shards, so each device cuts its own
 * into zparts slices, one per device that sums gradients with it (the data axes: the group every
 * gradient bucket is summed over; one slice when there is none). With ZeRO-1 each device keeps
 * the optimizer state of its slice; without, the slices still order the gradient norm's partial
 * sums, so both modes add the same numbers in the same order. */
static mw_status plan_shard_slices(mw_trainer *tr) {
    mw__program *prog = tr->prog;
    const mw__plan *p = &prog->w[prog->first].plan;
    int gi = -1, mixed = 0;
    for (int i = 0; i < p->nins; i++) {
        if (p->ins[i].kind != MW__I_GRAD_BUCKET) continue;
        int g = mw__group_index(prog, p->ins[i].group);
        mixed |= gi >= 0 && g != gi;
        gi = g;
    }
    if (mixed && prog->zero1)
        return mw__error(MW_ERR_UNSUPPORTED,
                         "mw_trainer_new: shard_optimizer with sharded parameters needs every "
                         "gradient summed over the same mesh axes");
    if (mixed || (gi >= 0 && prog->groups[gi].ncomms == 0)) gi = -1;
    /* FSDP: parameters split over the data axes themselves hold different rows on the devices
     * that sum gradients together, so their flat layouts cannot be cut alike; their optimizer
     * state is split already, and ZeRO-1 has nothing left to share. */
    uint32_t split = param_splits(prog->g);
    if (gi >= 0 && (prog->groups[gi].mask & split)) gi = -1;
    if (gi < 0) prog->zero1 = 0; /* no data axis: nothing to share */
    mw_status st =
        prog->zero1 ? mw__zero1_collectives(prog->reducer, prog->reducer, prog->mesh->desc) : MW_OK;
    if (st) return st;
    tr->zero_group = gi;
    int n = prog->nworkers, parts = gi >= 0 ? n / prog->groups[gi].ncomms : 1;
    tr->slices = mw__calloc((size_t)(n + 1), sizeof *tr->slices); /* per device instead */
    if (!tr->slices) return mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
    for (int d = prog->first; d < prog->first + prog->nlocal; d++) {
        worker *w = &prog->w[d];
        replica *r = &tr->rep[d];
        r->zslices_own = mw__malloc((size_t)(parts + 1) * sizeof *r->zslices_own);
        if (!r->zslices_own) return mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
        for (int k = 0; k <= parts; k++)
            r->zslices_own[k] = mw__slice_lo((size_t)w->plan.param_elems, parts, k);
        w->zslices = r->zslices_own;
        w->zparts = parts;
        int rank = gi >= 0 ? w->rank[gi] : 0;
        r->own_lo = prog->zero1 ? (int64_t)w->zslices[rank] : 0;
        r->own_hi = prog->zero1 ? (int64_t)w->zslices[rank + 1] : w->plan.param_elems;
    }
    return MW_OK;
}

static mw_status cut_slices(mw_trainer *tr);

/* Cuts the flat parameters into one slice per device (tr->slices) and, with shard_optimizer on
 * several devices, turns ZeRO-1 on once the reducers and gradient groups allow it. */
static mw_status plan_slices(mw_trainer *tr) {
    mw__program *prog = tr->prog;
    tr->rep = mw__calloc((size_t)prog->nworkers, sizeof *tr->rep);
    if (!tr->rep) return mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
    for (int d = 0; d < prog->nworkers; d++) tr->rep[d] = (replica){.tr = tr, .w = &prog->w[d]};
    prog->zero1 = tr->cfg.shard_optimizer && prog->nworkers > 1;
    mw_status st = prog->sharded_params ? plan_shard_slices(tr) : cut_slices(tr);
    /* Host scratch: every device's gradient norm accumulator (gathered), and the parts of a
     * collective (a ZeRO-1 bucket's slices, the norm's accumulators; zparts <= n). */
    int n = prog->nworkers;
    for (int d = prog->first; st == MW_OK && d < prog->first + prog->nlocal; d++) {
        tr->rep[d].accs = mw__malloc((size_t)n * sizeof *tr->rep[d].accs);
        prog->w[d].bounds = mw__malloc((size_t)(n + 1) * sizeof *prog->w[d].bounds);
        if (!tr->rep[d].accs || !prog->w[d].bounds)
            st = mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
    }
    return st;
}

/* plan_slices without sharded parameters. */
static mw_status cut_slices(mw_trainer *tr) {
    mw__program *prog = tr->prog;
    int n = prog->nworkers;
    const mw__plan *p = &prog->w[prog->first].plan;
    tr->slices = mw__malloc((size_t)(n + 1) * sizeof *tr->slices);
    if (!tr->slices) return mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
    for (int r = 0; r <= n; r++) tr->slices[r] = mw__slice_lo((size_t)p->param_elems, n, r);
    mw_status st = prog->zero1
                       ? mw__zero1_collectives(prog->reducer, prog->all_reducer, prog->mesh->desc)
                       : MW_OK;
    if (st) return st;
    for (int i = 0; prog->zero1 && i < p->nins; i++) {
        if (p->ins[i].kind != MW__I_GRAD_BUCKET) continue;
        int gi = mw__group_index(prog, p->ins[i].group), ok = prog->groups[gi].ncomms <= 1;
        for (int d = 0; ok && prog->groups[gi].ncomms == 1 && d < n; d++)
            ok = prog->w[d].rank[gi] == d;
        if (!ok)
            return mw__error(MW_ERR_UNSUPPORTED,
                             "mw_trainer_new: shard_optimizer needs every gradient summed over "
                             "all %d devices of %s, but some are summed over groups of %d (the "
                             "batch is not sharded over every mesh axis)",
                             n, prog->mesh->desc, n / prog->groups[gi].ncomms);
    }
    for (int d = prog->first; d < prog->first + prog->nlocal; d++) {
        worker *w = &prog->w[d];
        replica *r = &tr->rep[d];
        r->own_lo = prog->zero1 ? (int64_t)tr->slices[d] : 0;
        r->own_hi = prog->zero1 ? (int64_t)tr->slices[d + 1] : w->plan.param_elems;
        w->zslices = tr->slices;
        w->zparts = n;
    }
    return MW_OK;
}

void mw_trainer_free(mw_trainer *tr) {
    if (!tr) return;
    if (tr->pipe) {
        mw_pipeline_free(tr->pipe);
        mw__free(tr);
        return;
    }
    mw__program *prog = tr->prog;
    int n = prog && prog->w ? prog->nworkers : 0;
    /* Host scratch the trainer gave the workers; no command runs now. */
    for (int d = 0; d < n; d++) mw__free(prog->w[d].bounds);
    mw__program_free(prog); /* stops the workers: they free their optimizer state */
    for (int d = 0; tr->rep && d < n; d++) {
        mw__free(tr->rep[d].accs);
        mw__free(tr->rep[d].zslices_own);
    }
    mw__free(tr->rep);
    mw__free(tr->grads);
    mw__trainer_consistency_free(tr);
    mw__free(tr->decays);
    mw__free(tr->slices);
    mw__free(tr->wrt_out);
    mw__free(tr->share_out);
    mw__free(tr);
}

/* Zero-bubble: the backward nodes that the host reads after the input part (the stage's input
 * gradients, the shares) and all they read moved before the others (the weight gradients),
 * keeping each part's order, so the plan runs them as two parts. */
static mw_status split_weight_part(mw_trainer *tr) {
    mw__program *prog = tr->prog;
    mw_graph *g = prog->g;
    int n = g->nnodes, F = prog->forward_nodes;
    char *first = mw__calloc((size_t)n + 1, 1);
    mw_tensor **order = mw__malloc(((size_t)n + 1) * sizeof *order);
    if (!first || !order) {
        mw__free(first);
        mw__free(order);
        return mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
    }
    for (int i = 0; i < tr->stage->nwrt; i++)
        if (tr->wrt_out[i]) first[tr->wrt_out[i]->id] = 1;
    for (int i = 0; i < tr->stage->nshares; i++)
        if (tr->share_out[i]) first[tr->share_out[i]->id] = 1;
    for (int i = n - 1; i >= F; i--)
        for (int k = 0; first[i] && k < g->nodes[i]->nin; k++) first[g->nodes[i]->in[k]->id] = 1;
    int at = F;
    for (int i = F; i < n; i++)
        if (first[i]) order[at++] = g->nodes[i];
    prog->split_nodes = at;
    for (int i = F; i < n; i++)
        if (!first[i]) order[at++] = g->nodes[i];
    for (int i = F; i < n; i++) {
        g->nodes[i] = order[i];
        g->nodes[i]->id = i;
    }
    mw__free(first);
    mw__free(order);
    return MW_OK;
}

static mw_status trainer_build(mw_trainer *tr, mw_graph *graph, mw_tensor *loss, mw_mesh *mesh) {
    const mw_trainer_config *c = &tr->cfg;
    mw__program_config pc = mw__program_config_of_trainer(c);
    mw_status st = mw__program_new(graph, mesh, &pc, NULL, "mw_trainer_new", &tr->prog);
    if (st) return st;
    mw__program *prog = tr->prog;
    prog->commands = "step, eval or compute_grads";
    mw_graph *g = prog->g;
    if ((st = mw__optimizer_decays(tr))) return st;
    tr->loss = mw__replicated(g, g->nodes[loss->id]);
    tr->grads = mw__calloc((size_t)g->nparams + 1, sizeof *tr->grads);
    if (!tr->loss || !tr->grads)
        return g->status ? mw__error_copy(g->status, g->error)
                         : mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
    int no = c->noutputs;
    for (int o = 0; o < no; o++) {
        const mw_tensor *u = c->outputs ? c->outputs[o] : NULL;
        if (!u || u->g != graph)
            return mw__error(MW_ERR_INVALID,
                             "mw_trainer_new: output %d is NULL or from another "
                             "graph",
                             o);
    }
    const mw__trainer_stage *sg = tr->stage;
    mw_tensor **seed_of = NULL, **seeds = NULL, **wrt = NULL, **wrt_grads = NULL;
    mw__autodiff_ends ends = {0};
    int ngathered = 0; /* shares named by a GATHER: wrts after the stage's own */
    for (int i = 0; sg && i < sg->nshares; i++) ngathered += sg->share_of[i]->op != MW__OP_PARAM;
    if (sg) {
        int n = sg->nseeds + sg->nwrt + ngathered + 1;
        seed_of = mw__calloc((size_t)n, sizeof *seed_of);
        seeds = mw__calloc((size_t)n, sizeof *seeds);
        wrt = mw__calloc((size_t)n, sizeof *wrt);
        wrt_grads = mw__calloc((size_t)n, sizeof *wrt_grads);
        tr->wrt_out = mw__calloc((size_t)n, sizeof *tr->wrt_out);
        tr->share_out = mw__calloc((size_t)sg->nshares + 1, sizeof *tr->share_out);
        if (!seed_of || !seeds || !wrt || !wrt_grads || !tr->wrt_out || !tr->share_out) {
            st = mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
            goto ends_done;
        }
        /* The caller's nodes are the copy's of the same id (until the precision policy inserts
         * its casts). */
        for (int i = 0; i < sg->nseeds; i++) {
            seed_of[i] = g->nodes[sg->seed_of[i]->id];
            seeds[i] = g->nodes[sg->seeds[i]->id];
        }
        for (int i = 0; i < sg->nwrt; i++) wrt[i] = g->nodes[sg->wrt[i]->id];
        for (int i = 0, j = sg->nwrt; i < sg->nshares; i++)
            if (sg->share_of[i]->op != MW__OP_PARAM) wrt[j++] = g->nodes[sg->share_of[i]->id];
        ends = (mw__autodiff_ends){.nseeds = sg->nseeds,
                                   .nwrt = sg->nwrt + ngathered,
                                   .seed_of = seed_of,
                                   .seeds = seeds,
                                   .wrt = wrt,
                                   .wrt_grads = wrt_grads};
    }
    if ((st = mw__program_outputs(prog, c->outputs, no))) goto ends_done;
    tr->cfg.outputs = NULL; /* borrowed only during construction */
    if (sg) {
        prog->forward_nodes = g->nnodes;
        prog->slots = sg->slots;
    }
    st = mw__autodiff_from(g, tr->loss, tr->grads, (mw__recompute)c->recompute, !c->keep_gathered,
                           sg ? &ends : NULL);
    for (int i = 0; sg && st == MW_OK && i < sg->nwrt; i++)
        if (wrt_grads[i]) st = mw__program_add_output(prog, wrt_grads[i], 1, &tr->wrt_out[i]);
    for (int i = 0, j = sg ? sg->nwrt : 0; sg && st == MW_OK && i < sg->nshares; i++) {
        const mw_tensor *at = sg->share_of[i];
        int gathered = at->op != MW__OP_PARAM;
        int leaf = gathered ? at->in[0]->leaf : at->leaf; /* leaves keep their index in the copy */
        mw_tensor *share = gathered ? wrt_grads[j++] : tr->grads[leaf];
        if (share) st = mw__program_add_output(prog, share, 0, &tr->share_out[i]);
        tr->grads[leaf] = NULL; /* (its reduce-scatter, if any, is no longer live) */
    }
ends_done:
    mw__free(seed_of);
    mw__free(seeds);
    mw__free(wrt);
    mw__free(wrt_grads);
    if (st || (st = reduce_over_model_axes(tr)) || (st = own_gradients(tr)) ||
        (tr->stage && tr->stage->split_weights && (st = split_weight_part(tr))) ||
        (st = mw__program_plan(prog, tr->loss, tr->grads)) || (st = plan_slices(tr)) ||
        (st = mw__trainer_prepare(tr)))
        return st;
    mw__program_hooks hooks = mw__trainer_hooks;
    hooks.ctx = tr;
    return mw__program_start(prog, &hooks);
}

static mw_status trainer_new(mw_graph *graph, mw_tensor *loss, mw_mesh *mesh,
                             const mw_trainer_config *config, const mw__trainer_stage *stage,
                             mw_trainer **out) {
    if (!out) return mw__error(MW_ERR_INVALID, "mw_trainer_new: out is NULL");
    *out = NULL;
    if (!graph || !mesh) return mw__error(MW_ERR_INVALID, "mw_trainer_new: graph or mesh is NULL");
    if (graph->status) return mw__error_copy(graph->status, graph->error);
    if (!loss || loss->g != graph)
        return mw__error(MW_ERR_INVALID, "mw_trainer_new: the loss is NULL or from another graph");
    if (graph->nstates)
        return mw__error(MW_ERR_UNSUPPORTED,
                         "mw_trainer_new: the graph has states (mw_state), which belong to "
                         "inference programs (mw_infer_new): they have no gradient");
    if (loss->type.rank != 0 || loss->type.dtype != MW_F32) {
        char d[256];
        return mw__error(MW_ERR_SHAPE, "mw_trainer_new: the loss must be an f32 scalar, not %s",
                         mw__type_describe(graph, &loss->type, d, sizeof d));
    }
    mw_trainer *tr = mw__calloc(1, sizeof *tr);
    if (!tr) return mw__error(MW_ERR_NOMEM, "mw_trainer_new: out of memory");
    tr->cfg = config ? *config : (mw_trainer_config){.optimizer = {MW_SGD, 0.01f}};
    tr->host_lr = -1.0f;
    const mw_optimizer *o = &tr->cfg.optimizer;
    mw_status st = mw__optimizer_resolve(&tr->cfg.optimizer);
    if (st == MW_OK && o->kind == MW_SGD && (o->momentum > 0.0f || o->weight_decay > 0.0f) &&
        !mesh->vt->sgd_momentum)
        st = mw__error(MW_ERR_UNSUPPORTED,
                       "mw_trainer_new: SGD with momentum or weight decay is not implemented on "
                       "%s devices",
                       mesh->vt->kind);
    if (st == MW_OK) st = mw__check_trainer_config(&tr->cfg, "mw_trainer_new");
    if (st == MW_OK && graph->region_open)
        st = mw__error(MW_ERR_INVALID,
                       "mw_trainer_new: region \"%s\" was begun but never ended (call "
                       "mw_region_end after its last op)",
                       graph->region_name);
    if (st) {
        mw__free(tr);
        return st;
    }
    tr->stage = stage;
    st = stage ? MW_OK : mw__trainer_agree(&tr->cfg, mesh, graph, loss);
    if (st == MW_OK) st = trainer_build(tr, graph, loss, mesh);
    tr->stage = NULL;
    if (st) {
        char msg[MW__MSG_SIZE];
        snprintf(msg, sizeof msg, "%s", mw_last_error());
        mw_trainer_free(tr);
        return mw__error_copy(st, msg);
    }
    *out = tr;
    return MW_OK;
}

static mw_trainer *stage_of_device(const mw_trainer *tr, int device, int *local) {
    mw_trainer *st[64];
    return mw__pipeline_device(tr->pipe, device, st, local) ? st[0] : NULL;
}

/* A trainer that is a pipeline (config->pipeline_axis). */
static mw_status pipeline_trainer(mw_graph *graph, mw_tensor *loss, mw_mesh *mesh,
                                  const mw_trainer_config *config, mw_trainer **out) {
    mw_trainer *tr = mw__calloc(1, sizeof *tr);
    if (!tr) return mw__error(MW_ERR_NOMEM, "mw_trainer_new: out of memory");
    tr->cfg = *config;
    tr->host_lr = -1.0f;
    tr->stage_of_device = stage_of_device;
    mw_pipeline_config pc = {.trainer = *config,
                             .axis = config->pipeline_axis,
                             .micro_batches = config->micro_batches ? config->micro_batches : 1,
                             .schedule = config->pipeline_schedule,
                             .virtual_stages = config->virtual_stages};
    pc.trainer.pipeline_axis = NULL;
    pc.trainer.micro_batches = pc.trainer.virtual_stages = 0;
    pc.trainer.pipeline_schedule = MW_SCHEDULE_GPIPE;
    mw_status st = mw_pipeline_new(graph, loss, mesh, &pc, &tr->pipe);
    if (st) {
        mw__free(tr);
        return st;
    }
    *out = tr;
    return MW_OK;
}

mw_status mw_trainer_new(mw_graph *graph, mw_tensor *loss, mw_mesh *mesh,
                         const mw_trainer_config *config, mw_trainer **out) {
    if (config && config->pipeline_axis) {
        if (!out) return mw__error(MW_ERR_INVALID, "mw_trainer_new: out is NULL");
        *out = NULL;
        return pipeline_trainer(graph, loss, mesh, config, out);
    }
    if (config &&
        (config->micro_batches > 1 || config->pipeline_schedule || config->virtual_stages > 1))
        return mw__error(MW_ERR_INVALID,
                         "mw_trainer_new: micro_batches, pipeline_schedule and virtual_stages "
                         "are a pipeline's: they need pipeline_axis (gradient accumulation "
                         "without one: grad_accumulation and mw_trainer_accumulate)");
    return trainer_new(graph, loss, mesh, config, NULL, out);
}

mw_status mw__trainer_new_stage(mw_graph *graph, mw_tensor *loss, mw_mesh *mesh,
                                const mw_trainer_config *config, const mw__trainer_stage *stage,
                                mw_trainer **out) {
    return trainer_new(graph, loss, mesh, config, stage, out);
}
