/* Making and freeing a trainer: the backward pass, placement over the mesh, one plan per device,
 * the reduction groups, the parameter slices, the initial values and the worker threads. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "collectives/reducer.h"
#include "collectives/reducer_select.h"
#include "collectives/wait.h"
#include "core/alloc.h"
#include "core/autocast.h"
#include "core/autodiff.h"
#include "core/error.h"
#include "core/graph_impl.h"
#include "core/init.h"
#include "core/plan.h"
#include "devices/backend.h"
#include "meshwit.h"
#include "parallel/consistency.h"
#include "parallel/mesh_impl.h"
#include "parallel/optimizer.h"
#include "parallel/shards.h"
#include "parallel/trainer_impl.h"

/* Whether device d of the mesh is one of this process's. */
static int local(const mw_trainer *tr, int d) {
    return d >= tr->first && d < tr->first + tr->nlocal;
}

/* After autodiff: every gradient must be a node of its own that nothing else reads, since it is
 * written straight into the flat gradient buffer and reduced there in place. */
static mw_status own_gradients(mw_trainer *tr) {
    mw_graph *g = tr->g;
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

/* With parameters split over mesh axes, a gradient that is partial over those axes (a replicated
 * parameter whose gradient flows through a split layer, e.g. a layer norm before it) is first
 * summed over them alone; afterwards every gradient is partial over the data axes only, so the
 * gradient buckets (and ZeRO-1's slices) are those of one group, and both modes of the optimizer
 * sum every gradient in the same order. */
static mw_status reduce_over_model_axes(mw_trainer *tr) {
    mw_graph *g = tr->g;
    uint32_t model = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const mw_tensor *t = g->nodes[i];
        for (int k = 0; t->op == MW__OP_PARAM && k < t->type.rank; k++)
            if (t->type.ax[k].mesh >= 0) model |= 1u << t->type.ax[k].mesh;
    }
    for (int p = 0; model && p < g->nparams; p++) {
        mw_tensor *gr = tr->grads[p];
        if (!gr || !(gr->type.partial & model)) continue;
        mw_tensor proto = {.op = MW__OP_ALLREDUCE, .nin = 1, .in = {gr}, .type = gr->type};
        proto.type.partial &= ~model;
        if (!(tr->grads[p] = mw__node_new(g, &proto))) return mw__error_copy(g->status, g->error);
    }
    return MW_OK;
}

void mw__trainer_placement(const mw_trainer *tr, int d, mw__placement *out) {
    *out = (mw__placement){.nmesh = tr->g->nmesh_names};
    for (int m = 0; m < tr->g->nmesh_names; m++) {
        int a = tr->mesh_axis_of[m];
        out->size[m] = tr->mesh->axis_size[a];
        out->coord[m] = mw__mesh_coord(tr->mesh, d, a);
    }
}

/* Resolves the graph's mesh names to mesh axes and checks that every sharded axis can be placed. */
static mw_status place(mw_trainer *tr) {
    const mw_graph *g = tr->g;
    for (int m = 0; m < g->nmesh_names; m++) {
        int a = mw__mesh_axis(tr->mesh, g->mesh_names[m]);
        if (a < 0)
            return mw__error(MW_ERR_SHARDING,
                             "the graph shards over mesh axis '%s', but %s has no such axis",
                             g->mesh_names[m], tr->mesh->desc);
        tr->mesh_axis_of[m] = a;
    }
    for (int i = 0; i < g->nnodes; i++) {
        const mw_tensor *t = g->nodes[i];
        if (t->op != MW__OP_SHARD) continue;
        const mw__axis *a = &t->type.ax[t->p.shard.axis];
        int parts = tr->mesh->axis_size[tr->mesh_axis_of[a->mesh]];
        if (a->size < parts)
            return mw__error(MW_ERR_SHARDING,
                             "axis %s@%s of input '%s' has %lld rows but mesh axis %s has %d "
                             "devices: every device needs at least one row",
                             g->names[a->name], g->mesh_names[a->mesh], t->in[0]->name,
                             (long long)a->size, g->mesh_names[a->mesh], parts);
    }
    for (int i = 0; i < g->nnodes; i++) {
        const mw_tensor *t = g->nodes[i];
        if (t->op != MW__OP_PARAM || !mw__param_sharded(t)) continue;
        tr->sharded_params = 1;
        const char *over = NULL;
        for (int k = 0; k < t->type.rank; k++) {
            const mw__axis *a = &t->type.ax[k];
            if (a->mesh < 0) continue;
            over = g->mesh_names[a->mesh];
            int parts = tr->mesh->axis_size[tr->mesh_axis_of[a->mesh]];
            if (a->size < parts)
                return mw__error(MW_ERR_SHARDING,
                                 "axis %s@%s of parameter '%s' has %lld rows but mesh axis %s "
                                 "has %d devices: every device needs at least one row",
                                 g->names[a->name], g->mesh_names[a->mesh], t->name,
                                 (long long)a->size, g->mesh_names[a->mesh], parts);
        }
        if (tr->mesh->nprocs > 1)
            return mw__error(MW_ERR_UNSUPPORTED,
                             "parameter '%s' is split over mesh axis %s, but %s spans %d "
                             "processes: sharded parameters need every device in one process "
                             "(shard only the batch across processes)",
                             t->name, over, tr->mesh->desc, tr->mesh->nprocs);
    }
    return MW_OK;
}

/* Makes the communicators of every group mask the plans use. */
static mw_status make_groups(mw_trainer *tr) {
    mw_mesh *mesh = tr->mesh;
    int distributed = mesh->nprocs > 1;
    if (mesh->ndevices > 1) {
        mw__device *devs[MW_MAX_DEVICES];
        for (int d = 0; d < mesh->ndevices; d++) devs[d] = local(tr, d) ? &tr->w[d].dev : NULL;
        mw__comm_options opt = {.timeout_ms = tr->cfg.collective_timeout_ms,
                                .proc_of = distributed ? mesh->proc_of : NULL,
                                .self_proc = mesh->proc,
                                .wake = &tr->wake};
        /* A host barrier: the shared-memory reducer serves it for every kind of device (across
         * processes, the hierarchical one, which never touches device memory for a barrier). */
        mw_status st = tr->all_reducer->comm_new(mesh->ndevices, devs, &opt, &tr->all);
        if (st) return st;
    }
    const mw__plan *p = &tr->w[tr->first].plan;
    for (int i = 0; i < p->nins; i++) {
        const mw__ins *in = &p->ins[i];
        if ((in->kind != MW__I_ALLREDUCE && in->kind != MW__I_GRAD_BUCKET) ||
            mw__group_index(tr, in->group) >= 0)
            continue;
        if (tr->ngroups == MAX_GROUPS)
            return mw__error(MW_ERR_UNSUPPORTED, "more than %d reduction groups", MAX_GROUPS);
        tr->groups[tr->ngroups++] = (group){.mask = in->group};
    }
    for (int gi = 0; gi < tr->ngroups; gi++) {
        group *gr = &tr->groups[gi];
        int in_group[MW_MAX_MESH_AXES] = {0}, members = 1;
        for (int m = 0; m < tr->g->nmesh_names; m++)
            if (gr->mask & (1u << m)) in_group[tr->mesh_axis_of[m]] = 1;
        for (int a = 0; a < mesh->naxes; a++)
            if (in_group[a]) members *= mesh->axis_size[a];
        if (members == 1) continue; /* nothing to reduce: worker comm stays NULL */
        int ncomms = mesh->ndevices / members;
        gr->comms = mw__calloc((size_t)ncomms, sizeof *gr->comms);
        if (!gr->comms) return mw__error(MW_ERR_NOMEM, "out of memory making communicators");
        gr->ncomms = ncomms;
        /* Class of a device: its coordinates off the group's axes; rank: on them. */
        int assigned = 0;
        for (int c = 0; c < gr->ncomms; c++) {
            mw__device *devs[MW_MAX_DEVICES];
            int proc_of[MW_MAX_DEVICES];
            int n = 0, cls = -1;
            for (int d = 0; d < mesh->ndevices; d++) {
                int k = 0, r = 0;
                for (int a = 0; a < mesh->naxes; a++) {
                    int x = mw__mesh_coord(mesh, d, a);
                    if (in_group[a])
                        r = r * mesh->axis_size[a] + x;
                    else
                        k = k * mesh->axis_size[a] + x;
                }
                if (k != c) continue;
                (void)cls;
                tr->w[d].rank[gi] = r;
                devs[r] = local(tr, d) ? &tr->w[d].dev : NULL;
                proc_of[r] = mesh->proc_of[d];
                n++;
            }
            mw__comm_options opt = {.timeout_ms = tr->cfg.collective_timeout_ms,
                                    .proc_of = distributed ? proc_of : NULL,
                                    .self_proc = mesh->proc,
                                    .wake = &tr->wake};
            mw_status st = tr->reducer->comm_new(n, devs, &opt, &gr->comms[c]);
            if (st) return st;
            for (int d = 0; d < mesh->ndevices; d++) {
                int k = 0;
                for (int a = 0; a < mesh->naxes; a++)
                    if (!in_group[a]) k = k * mesh->axis_size[a] + mw__mesh_coord(mesh, d, a);
                if (k == c) tr->w[d].comm[gi] = gr->comms[c];
            }
            assigned += n;
        }
        if (assigned != mesh->ndevices)
            return mw__error(MW_ERR_STATE, "internal: reduction groups do not cover the mesh");
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
    const mw__plan *p = &tr->w[tr->first].plan;
    int gi = -1, mixed = 0;
    for (int i = 0; i < p->nins; i++) {
        if (p->ins[i].kind != MW__I_GRAD_BUCKET) continue;
        int g = mw__group_index(tr, p->ins[i].group);
        mixed |= gi >= 0 && g != gi;
        gi = g;
    }
    if (mixed && tr->zero1)
        return mw__error(MW_ERR_UNSUPPORTED,
                         "mw_trainer_new: shard_optimizer with sharded parameters needs every "
                         "gradient summed over the same mesh axes");
    if (mixed || (gi >= 0 && tr->groups[gi].ncomms == 0)) gi = -1;
    if (gi < 0) tr->zero1 = 0; /* no data axis: nothing to share */
    mw_status st =
        tr->zero1 ? mw__zero1_collectives(tr->reducer, tr->reducer, tr->mesh->desc) : MW_OK;
    if (st) return st;
    tr->zero_group = gi;
    int n = tr->nworkers, parts = gi >= 0 ? n / tr->groups[gi].ncomms : 1;
    tr->slices = mw__calloc((size_t)(n + 1), sizeof *tr->slices); /* per device instead */
    if (!tr->slices) return mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
    for (int d = tr->first; d < tr->first + tr->nlocal; d++) {
        worker *w = &tr->w[d];
        size_t pieces = (size_t)n * ((size_t)tr->g->nparams + 1) * (size_t)parts;
        w->zslices_own = mw__malloc((size_t)(parts + 1) * sizeof *w->zslices_own);
        w->partials = mw__malloc(pieces * sizeof *w->partials);
        w->bounds = mw__malloc((size_t)(n + 1) * sizeof *w->bounds);
        if (!w->zslices_own || !w->partials || !w->bounds)
            return mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
        for (int k = 0; k <= parts; k++)
            w->zslices_own[k] = mw__slice_lo((size_t)w->plan.param_elems, parts, k);
        w->zslices = w->zslices_own;
        w->zparts = parts;
        int r = gi >= 0 ? w->rank[gi] : 0;
        w->own_lo = tr->zero1 ? (int64_t)w->zslices[r] : 0;
        w->own_hi = tr->zero1 ? (int64_t)w->zslices[r + 1] : w->plan.param_elems;
    }
    return MW_OK;
}

static mw_status cut_slices(mw_trainer *tr);

/* Cuts the flat parameters into one slice per device (tr->slices) and, with shard_optimizer on
 * several devices, turns ZeRO-1 on once the reducers and gradient groups allow it. */
static mw_status plan_slices(mw_trainer *tr) {
    tr->zero1 = tr->cfg.shard_optimizer && !tr->forward_only && tr->nworkers > 1;
    return tr->sharded_params ? plan_shard_slices(tr) : cut_slices(tr);
}

/* plan_slices without sharded parameters. */
static mw_status cut_slices(mw_trainer *tr) {
    int n = tr->nworkers;
    const mw__plan *p = &tr->w[tr->first].plan;
    tr->slices = mw__malloc((size_t)(n + 1) * sizeof *tr->slices);
    if (!tr->slices) return mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
    for (int r = 0; r <= n; r++) tr->slices[r] = mw__slice_lo((size_t)p->param_elems, n, r);
    mw_status st =
        tr->zero1 ? mw__zero1_collectives(tr->reducer, tr->all_reducer, tr->mesh->desc) : MW_OK;
    if (st) return st;
    for (int i = 0; tr->zero1 && i < p->nins; i++) {
        if (p->ins[i].kind != MW__I_GRAD_BUCKET) continue;
        int gi = mw__group_index(tr, p->ins[i].group), ok = tr->groups[gi].ncomms <= 1;
        for (int d = 0; ok && tr->groups[gi].ncomms == 1 && d < n; d++) ok = tr->w[d].rank[gi] == d;
        if (!ok)
            return mw__error(MW_ERR_UNSUPPORTED,
                             "mw_trainer_new: shard_optimizer needs every gradient summed over "
                             "all %d devices of %s, but some are summed over groups of %d (the "
                             "batch is not sharded over every mesh axis)",
                             n, tr->mesh->desc, n / tr->groups[gi].ncomms);
    }
    for (int d = tr->first; d < tr->first + tr->nlocal; d++) {
        worker *w = &tr->w[d];
        w->own_lo = tr->zero1 ? (int64_t)tr->slices[d] : 0;
        w->own_hi = tr->zero1 ? (int64_t)tr->slices[d + 1] : w->plan.param_elems;
        w->zslices = tr->slices;
        w->zparts = n;
        w->partials = mw__malloc((size_t)n * sizeof *w->partials);
        w->bounds = mw__malloc((size_t)(n + 1) * sizeof *w->bounds);
        if (!w->partials || !w->bounds)
            return mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
    }
    return MW_OK;
}

static mw_status start_workers(mw_trainer *tr) {
    for (int i = tr->first; i < tr->first + tr->nlocal; i++) {
        /* The first CPU device of a mesh in one process runs on the calling thread: one thread
         * fewer to wake and to schedule every step (not when pinned: the caller's thread stays
         * unpinned). */
        tr->w[i].on_host = i == tr->first && tr->mesh->vt->host_memory && tr->mesh->nprocs == 1 &&
                           tr->w[i].dev.pin == 0;
        if (!tr->w[i].on_host &&
            pthread_create(&tr->w[i].thread, NULL, mw__worker_main, &tr->w[i]) != 0)
            return mw__error(MW_ERR_DEVICE, "could not start the worker thread of %s",
                             tr->w[i].dev.name);
        tr->w[i].started = 1;
    }
    return MW_OK;
}

static void free_comms(mw_trainer *tr) {
    if (tr->all) tr->all_reducer->comm_free(tr->all);
    tr->all = NULL;
    for (int gi = 0; gi < tr->ngroups; gi++)
        for (int c = 0; c < tr->groups[gi].ncomms; c++) {
            if (tr->groups[gi].comms[c]) tr->reducer->comm_free(tr->groups[gi].comms[c]);
            tr->groups[gi].comms[c] = NULL;
        }
    for (int i = 0; tr->w && i < tr->nworkers; i++) memset(tr->w[i].comm, 0, sizeof tr->w[i].comm);
}

void mw_trainer_free(mw_trainer *tr) {
    if (!tr) return;
    int running = 0;
    for (int i = 0; tr->w && i < tr->nworkers; i++) running += tr->w[i].started;
    /* The communicators go first (no worker is inside a collective now): freeing one aborts what
     * a failed step left queued on a GPU, which would otherwise block the workers' final frees
     * and stream waits forever. */
    free_comms(tr);
    if (running) mw__stop_workers(tr);
    mw__sched_free(tr);
    for (int gi = 0; gi < tr->ngroups; gi++) mw__free(tr->groups[gi].comms);
    if (tr->w)
        for (int i = 0; i < tr->nworkers; i++) {
            mw__plan_free(&tr->w[i].plan);
            mw__profile_free(&tr->w[i]);
            mw__free(tr->w[i].bases);
            mw__free(tr->w[i].kern);
            mw__free(tr->w[i].rebind);
            mw__free(tr->w[i].partials);
            mw__free(tr->w[i].zslices_own);
            mw__free(tr->w[i].bounds);
        }
    if (tr->blas_prev > 0) tr->set_threads(tr->blas_prev);
    mw__free(tr->w);
    mw__free(tr->feed_of);
    mw__free(tr->grads);
    mw__free(tr->outputs);
    mw__free(tr->user_outputs);
    for (int i = 0; tr->init_boxes && i < tr->nlocal; i++) mw__free(tr->init_boxes[i]);
    mw__free(tr->init_boxes);
    mw__free(tr->init_values);
    mw__trainer_consistency_free(tr);
    mw__free(tr->decays);
    mw__free(tr->slices);
    mw_graph_free(tr->g);
    mw__free(tr);
}

/* Each local device's boxes of the initial parameters (sharded parameters). */
static mw_status init_boxes(mw_trainer *tr) {
    tr->init_boxes = mw__calloc((size_t)tr->nlocal, sizeof *tr->init_boxes);
    if (!tr->init_boxes) return mw__error(MW_ERR_NOMEM, "out of memory initialising parameters");
    for (int d = tr->first; d < tr->first + tr->nlocal; d++) {
        int64_t n = tr->w[d].plan.param_elems;
        float *box = mw__malloc((size_t)(n ? n : 1) * sizeof *box);
        tr->init_boxes[d - tr->first] = box;
        if (!box) return mw__error(MW_ERR_NOMEM, "out of memory initialising parameters");
    }
    return mw__param_init_boxes(tr, tr->init_boxes);
}

static void free_init(mw_trainer *tr) {
    for (int i = 0; tr->init_boxes && i < tr->nlocal; i++) mw__free(tr->init_boxes[i]);
    mw__free(tr->init_boxes);
    tr->init_boxes = NULL;
    mw__free(tr->init_values);
    tr->init_values = NULL;
}

static mw_status init_values(mw_trainer *tr) {
    if (tr->sharded_params) return tr->params_from ? MW_OK : init_boxes(tr); /* one process */
    const mw__plan *p = &tr->w[tr->first].plan;
    tr->init_values = mw__malloc((size_t)(p->param_elems ? p->param_elems : 1) * sizeof(float));
    if (!tr->init_values) return mw__error(MW_ERR_NOMEM, "out of memory initialising parameters");
    for (int i = 0; i < tr->g->nnodes; i++) {
        const mw_tensor *t = tr->g->nodes[i];
        if (t->op == MW__OP_PARAM)
            mw__param_init(tr->g, t, tr->init_values + p->params[t->leaf].off);
    }
    return MW_OK;
}

static mw_status trainer_build(mw_trainer *tr, mw_graph *graph, mw_tensor *loss) {
    mw_status st = mw__graph_clone(graph, &tr->g);
    if (st) return st;
    mw_graph *g = tr->g;
    if ((st = mw__optimizer_decays(tr))) return st;
    tr->loss = mw__replicated(g, g->nodes[loss->id]);
    tr->grads = mw__calloc((size_t)g->nparams + 1, sizeof *tr->grads);
    tr->feed_of = mw__calloc((size_t)g->ninputs + 1, sizeof *tr->feed_of);
    if (!tr->loss || !tr->grads || !tr->feed_of)
        return g->status ? mw__error_copy(g->status, g->error)
                         : mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
    int no = tr->cfg.noutputs;
    tr->outputs = mw__calloc((size_t)no + 1, sizeof *tr->outputs);
    tr->user_outputs = mw__calloc((size_t)no + 1, sizeof *tr->user_outputs);
    if (!tr->outputs || !tr->user_outputs)
        return mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
    for (int o = 0; o < no; o++) {
        const mw_tensor *u = tr->cfg.outputs ? tr->cfg.outputs[o] : NULL;
        if (!u || u->g != graph)
            return mw__error(MW_ERR_INVALID,
                             "mw_trainer_new: output %d is NULL or from another "
                             "graph",
                             o);
        tr->user_outputs[o] = u;
        tr->outputs[o] = mw__replicated(g, g->nodes[u->id]);
        if (!tr->outputs[o]) return mw__error_copy(g->status, g->error);
    }
    if (tr->forward_only) tr->loss = tr->outputs[0];
    tr->cfg.outputs = NULL; /* borrowed only during construction */
    if (tr->cfg.precision == MW_PRECISION_BF16 && (st = mw__autocast_bf16(g))) return st;
    if ((!tr->forward_only && ((st = mw__autodiff(g, tr->loss, tr->grads)) ||
                               (st = reduce_over_model_axes(tr)) || (st = own_gradients(tr)))) ||
        (st = place(tr)))
        return st;

    mw_mesh *mesh = tr->mesh;
    tr->nworkers = mesh->ndevices;
    tr->first = mesh->local_first;
    tr->nlocal = mesh->local_count;
    tr->spin_ns = mw__spin_ns(tr->nlocal + 1); /* the workers and the host */
    tr->w = mw__calloc((size_t)tr->nworkers, sizeof *tr->w);
    if (!tr->w) return mw__error(MW_ERR_NOMEM, "out of memory making workers");
    size_t bucket = tr->cfg.bucket_bytes ? tr->cfg.bucket_bytes : (size_t)1 << 20;
    /* Across processes, the launcher binds processes to cores (mpirun --bind-to). */
    int cores_ok = tr->cfg.pin_threads > 0 && mesh->nprocs == 1;
    for (int d = 0; d < tr->nworkers; d++) {
        worker *w = &tr->w[d];
        w->tr = tr;
        w->index = d;
        if (!local(tr, d)) continue; /* another process's device */
        w->dev = (mw__device){.vt = mesh->vt,
                              .index = d,
                              .ordinal = mesh->ordinal[d],
                              .pin = cores_ok ? mesh->ndevices : 0};
        snprintf(w->dev.name, sizeof w->dev.name, "%s", mesh->device_name[d]);
        mw__placement pl;
        mw__trainer_placement(tr, d, &pl);
        mw__plan_target target = {.host_memory = mesh->vt->host_memory,
                                  .bucket_elems = (int64_t)(bucket / 4),
                                  .bf16_out = mw__backend_bf16_writers(mesh->backend)};
        if ((st = mw__plan_build(g, tr->loss, tr->grads, tr->outputs, tr->cfg.noutputs, &pl,
                                 &target, &w->plan)))
            return st;
        if ((st = mw__backend_check_plan(mesh->backend, g, &w->plan, w->dev.name))) return st;
        if (tr->cfg.profile && (st = mw__profile_init(w, g))) return st;
        w->bases = mw__calloc((size_t)(MW__BASE_VIEW0 + w->plan.nviews), sizeof *w->bases);
        if (!w->bases) return mw__error(MW_ERR_NOMEM, "out of memory making workers");
        if (tr->params_from && (st = mw__share_params(tr, w))) return st;
    }
    if ((st = make_groups(tr)) || (st = plan_slices(tr)) || (st = init_values(tr)) ||
        (st = mw__trainer_prepare(tr)))
        return st;

    if ((tr->set_threads = mesh->backend->set_threads) && tr->cfg.blas_threads >= 0)
        tr->blas_prev = tr->set_threads(tr->cfg.blas_threads ? tr->cfg.blas_threads : 1);
    if ((st = start_workers(tr)) || (st = mw__dispatch(tr, CMD_INIT)) || (st = mw__sched_init(tr)))
        return st;
    free_init(tr);
    return MW_OK;
}

static mw_status trainer_new(mw_graph *graph, mw_tensor *loss, mw_mesh *mesh,
                             const mw_trainer_config *config, int forward_only,
                             mw_trainer *params_from, mw_trainer **out);

mw_status mw_trainer_new(mw_graph *graph, mw_tensor *loss, mw_mesh *mesh,
                         const mw_trainer_config *config, mw_trainer **out) {
    return trainer_new(graph, loss, mesh, config, 0, NULL, out);
}

mw_status mw__trainer_new_forward(mw_graph *graph, mw_mesh *mesh, const mw_trainer_config *config,
                                  mw_trainer *params_from, mw_trainer **out) {
    if (!config || config->noutputs < 1 || !config->outputs)
        return mw__error(MW_ERR_INVALID, "an inference program needs at least one output");
    return trainer_new(graph, config->outputs[0], mesh, config, 1, params_from, out);
}

/* A trainer, or a forward-only one whose "loss" is its first output. */
static mw_status trainer_new(mw_graph *graph, mw_tensor *loss, mw_mesh *mesh,
                             const mw_trainer_config *config, int forward_only,
                             mw_trainer *params_from, mw_trainer **out) {
    if (!out) return mw__error(MW_ERR_INVALID, "mw_trainer_new: out is NULL");
    *out = NULL;
    if (!graph || !mesh) return mw__error(MW_ERR_INVALID, "mw_trainer_new: graph or mesh is NULL");
    if (graph->status) return mw__error_copy(graph->status, graph->error);
    if (!loss || loss->g != graph)
        return mw__error(MW_ERR_INVALID, "mw_trainer_new: the loss is NULL or from another graph");
    if (!forward_only && graph->nstates)
        return mw__error(MW_ERR_UNSUPPORTED,
                         "mw_trainer_new: the graph has states (mw_state), which belong to "
                         "inference programs (mw_infer_new): they have no gradient");
    if (!forward_only && (loss->type.rank != 0 || loss->type.dtype != MW_F32)) {
        char d[256];
        return mw__error(MW_ERR_SHAPE, "mw_trainer_new: the loss must be an f32 scalar, not %s",
                         mw__type_describe(graph, &loss->type, d, sizeof d));
    }
    mw_trainer *tr = mw__calloc(1, sizeof *tr);
    if (!tr) return mw__error(MW_ERR_NOMEM, "mw_trainer_new: out of memory");
    tr->mesh = mesh;
    tr->forward_only = forward_only;
    tr->params_from = params_from;
    tr->reducer =
        mw__reducer_for_procs(mesh->vt->kind, mesh->ndevices, mesh->ordinal, mesh->nprocs);
    tr->all_reducer = mw__reducer_host(mesh->nprocs); /* host-memory barriers */
    if (!tr->reducer) {
        mw__free(tr);
        return mw__error(MW_ERR_UNSUPPORTED, "mw_trainer_new: no reducer for %s", mesh->desc);
    }
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
    if (st == MW_OK && tr->cfg.precision != MW_PRECISION_FP32 &&
        tr->cfg.precision != MW_PRECISION_BF16)
        st = mw__error(MW_ERR_INVALID,
                       "mw_trainer_new: precision is %d (expected MW_PRECISION_FP32 or "
                       "MW_PRECISION_BF16)",
                       (int)tr->cfg.precision);
    if (st == MW_OK && tr->cfg.cpu_threads < MW_CPU_THREADS_PER_DEVICE)
        st = mw__error(MW_ERR_INVALID,
                       "mw_trainer_new: cpu_threads is %d (expected MW_CPU_THREADS_AUTO, "
                       "MW_CPU_THREADS_PER_DEVICE or a thread count >= 1)",
                       tr->cfg.cpu_threads);
    if (st) {
        mw__free(tr);
        return st;
    }
    st = mw__trainer_agree(tr, graph, loss);
    if (st == MW_OK) st = trainer_build(tr, graph, loss);
    if (st) {
        char msg[MW__MSG_SIZE];
        snprintf(msg, sizeof msg, "%s", mw_last_error());
        mw_trainer_free(tr);
        return mw__error_copy(st, msg);
    }
    *out = tr;
    return MW_OK;
}
