/* Making, running and freeing a program: a copy of the graph placed over the mesh, one plan per
 * local device, the reduction groups and their communicators, the initial parameters, and the
 * workers that run the plans (workers.c). */
#include "parallel/program.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "collectives/reducer.h"
#include "collectives/reducer_select.h"
#include "collectives/wait.h"
#include "core/alloc.h"
#include "core/autocast.h"
#include "core/error.h"
#include "core/graph_impl.h"
#include "core/init.h"
#include "core/plan.h"
#include "devices/backend.h"
#include "meshwit.h"
#include "parallel/mesh_impl.h"

/* Whether device d of the mesh is one of this process's. */
static int local(const mw__program *prog, int d) {
    return d >= prog->first && d < prog->first + prog->nlocal;
}

mw_status mw__program_new(const mw_graph *graph, mw_mesh *mesh, const mw__program_config *cfg,
                          mw__program *params_from, const char *caller, mw__program **out) {
    *out = NULL;
    const mw__reducer_vtable *reducer =
        mw__reducer_for_procs(mesh->vt->kind, mesh->ndevices, mesh->ordinal, mesh->nprocs);
    if (!reducer) return mw__error(MW_ERR_UNSUPPORTED, "%s: no reducer for %s", caller, mesh->desc);
    mw__program *prog = mw__calloc(1, sizeof *prog);
    if (!prog) return mw__error(MW_ERR_NOMEM, "%s: out of memory", caller);
    prog->mesh = mesh;
    prog->cfg = *cfg;
    prog->caller = caller;
    prog->params_from = params_from;
    prog->reducer = reducer;
    prog->all_reducer = mw__reducer_host(mesh->nprocs); /* host-memory barriers */
    mw_status st = mw__graph_clone(graph, &prog->g);
    if (st == MW_OK)
        prog->feed_of = mw__calloc((size_t)prog->g->ninputs + 1, sizeof *prog->feed_of);
    if (st == MW_OK && !prog->feed_of) st = mw__error(MW_ERR_NOMEM, "%s: out of memory", caller);
    if (st) {
        mw__program_free(prog);
        return st;
    }
    *out = prog;
    return MW_OK;
}

mw_status mw__program_outputs(mw__program *prog, mw_tensor *const *outputs, int n) {
    mw_graph *g = prog->g;
    prog->noutputs = n;
    prog->outputs = mw__calloc((size_t)n + 1, sizeof *prog->outputs);
    prog->user_outputs = mw__calloc((size_t)n + 1, sizeof *prog->user_outputs);
    if (!prog->outputs || !prog->user_outputs)
        return mw__error(MW_ERR_NOMEM, "%s: out of memory", prog->caller);
    for (int o = 0; o < n; o++) {
        prog->user_outputs[o] = outputs[o];
        prog->outputs[o] = mw__replicated(g, g->nodes[outputs[o]->id]);
        if (!prog->outputs[o]) return mw__error_copy(g->status, g->error);
    }
    return prog->cfg.precision == MW_PRECISION_BF16 ? mw__autocast_bf16(g) : MW_OK;
}

mw_status mw__program_add_output(mw__program *prog, mw_tensor *t, int replicate,
                                 const mw_tensor **handle) {
    mw_graph *g = prog->g;
    int n = prog->noutputs + 1;
    mw_tensor **o = mw__realloc(prog->outputs, (size_t)n * sizeof *o);
    if (o) prog->outputs = o;
    const mw_tensor **u = o ? mw__realloc(prog->user_outputs, (size_t)n * sizeof *u) : NULL;
    if (u) prog->user_outputs = u;
    if (!o || !u) return mw__error(MW_ERR_NOMEM, "%s: out of memory", prog->caller);
    if (!(o[n - 1] = replicate ? mw__replicated(g, t) : t))
        return mw__error_copy(g->status, g->error);
    u[n - 1] = *handle = o[n - 1];
    prog->noutputs = n;
    return MW_OK;
}

void mw__program_placement(const mw__program *prog, int d, mw__placement *out) {
    *out = (mw__placement){.nmesh = prog->g->nmesh_names};
    for (int m = 0; m < prog->g->nmesh_names; m++) {
        int a = prog->mesh_axis_of[m];
        out->size[m] = prog->mesh->axis_size[a];
        out->coord[m] = mw__mesh_coord(prog->mesh, d, a);
    }
}

/* Resolves the graph's mesh names to mesh axes and checks that every sharded axis can be placed. */
static mw_status place(mw__program *prog) {
    const mw_graph *g = prog->g;
    for (int m = 0; m < g->nmesh_names; m++) {
        int a = mw__mesh_axis(prog->mesh, g->mesh_names[m]);
        if (a < 0)
            return mw__error(MW_ERR_SHARDING,
                             "the graph shards over mesh axis '%s', but %s has no such axis",
                             g->mesh_names[m], prog->mesh->desc);
        prog->mesh_axis_of[m] = a;
    }
    for (int i = 0; i < g->nnodes; i++) {
        const mw_tensor *t = g->nodes[i];
        if (t->op != MW__OP_SHARD) continue;
        const mw__axis *a = &t->type.ax[t->p.shard.axis];
        int parts = prog->mesh->axis_size[prog->mesh_axis_of[a->mesh]];
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
        prog->sharded_params = 1;
        for (int k = 0; k < t->type.rank; k++) {
            const mw__axis *a = &t->type.ax[k];
            if (a->mesh < 0) continue;
            int parts = prog->mesh->axis_size[prog->mesh_axis_of[a->mesh]];
            if (a->size < parts)
                return mw__error(MW_ERR_SHARDING,
                                 "axis %s@%s of parameter '%s' has %lld rows but mesh axis %s "
                                 "has %d devices: every device needs at least one row",
                                 g->names[a->name], g->mesh_names[a->mesh], t->name,
                                 (long long)a->size, g->mesh_names[a->mesh], parts);
        }
    }
    return MW_OK;
}

/* Makes the communicators of every group mask the plans use. */
static mw_status make_groups(mw__program *prog) {
    mw_mesh *mesh = prog->mesh;
    int distributed = mesh->nprocs > 1;
    if (mesh->ndevices > 1) {
        mw__device *devs[MW_MAX_DEVICES];
        for (int d = 0; d < mesh->ndevices; d++) devs[d] = local(prog, d) ? &prog->w[d].dev : NULL;
        mw__comm_options opt = {.timeout_ms = prog->cfg.collective_timeout_ms,
                                .proc_of = distributed ? mesh->proc_of : NULL,
                                .self_proc = mesh->proc,
                                .wake = &prog->wake};
        /* A host barrier: the shared-memory reducer serves it for every kind of device (across
         * processes, the hierarchical one, which never touches device memory for a barrier). */
        mw_status st = prog->all_reducer->comm_new(mesh->ndevices, devs, &opt, &prog->all);
        if (st) return st;
    }
    const mw__plan *p = &prog->w[prog->first].plan;
    for (int i = 0; i < p->nins; i++) {
        const mw__ins *in = &p->ins[i];
        if (in->kind < MW__I_ALLREDUCE || in->kind >= MW__I_COUNT || /* not a collective */
            mw__group_index(prog, in->group) >= 0)
            continue;
        if (prog->ngroups == MAX_GROUPS)
            return mw__error(MW_ERR_UNSUPPORTED, "more than %d reduction groups", MAX_GROUPS);
        prog->groups[prog->ngroups++] = (group){.mask = in->group};
    }
    for (int gi = 0; gi < prog->ngroups; gi++) {
        group *gr = &prog->groups[gi];
        int in_group[MW_MAX_MESH_AXES] = {0}, members = 1;
        for (int m = 0; m < prog->g->nmesh_names; m++)
            if (gr->mask & (1u << m)) in_group[prog->mesh_axis_of[m]] = 1;
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
                prog->w[d].rank[gi] = r;
                devs[r] = local(prog, d) ? &prog->w[d].dev : NULL;
                proc_of[r] = mesh->proc_of[d];
                n++;
            }
            mw__comm_options opt = {.timeout_ms = prog->cfg.collective_timeout_ms,
                                    .proc_of = distributed ? proc_of : NULL,
                                    .self_proc = mesh->proc,
                                    .wake = &prog->wake};
            mw_status st = prog->reducer->comm_new(n, devs, &opt, &gr->comms[c]);
            if (st) return st;
            for (int d = 0; d < mesh->ndevices; d++) {
                int k = 0;
                for (int a = 0; a < mesh->naxes; a++)
                    if (!in_group[a]) k = k * mesh->axis_size[a] + mw__mesh_coord(mesh, d, a);
                if (k == c) prog->w[d].comm[gi] = gr->comms[c];
                if (k == c) prog->w[d].group_class[gi] = c;
            }
            assigned += n;
        }
        if (assigned != mesh->ndevices)
            return mw__error(MW_ERR_STATE, "internal: reduction groups do not cover the mesh");
    }
    return MW_OK;
}

/* Each local device's boxes of the initial parameters (sharded parameters). */
static mw_status init_boxes(mw__program *prog) {
    prog->init_boxes = mw__calloc((size_t)prog->nlocal, sizeof *prog->init_boxes);
    if (!prog->init_boxes) return mw__error(MW_ERR_NOMEM, "out of memory initialising parameters");
    for (int d = prog->first; d < prog->first + prog->nlocal; d++) {
        int64_t n = prog->w[d].plan.param_elems;
        float *box = mw__malloc((size_t)(n ? n : 1) * sizeof *box);
        prog->init_boxes[d - prog->first] = box;
        if (!box) return mw__error(MW_ERR_NOMEM, "out of memory initialising parameters");
    }
    return mw__param_init_boxes(prog, prog->init_boxes);
}

static void free_init(mw__program *prog) {
    for (int i = 0; prog->init_boxes && i < prog->nlocal; i++) mw__free(prog->init_boxes[i]);
    mw__free(prog->init_boxes);
    prog->init_boxes = NULL;
    mw__free(prog->init_values);
    prog->init_values = NULL;
}

static mw_status init_values(mw__program *prog) {
    if (prog->sharded_params) return prog->params_from ? MW_OK : init_boxes(prog);
    const mw__plan *p = &prog->w[prog->first].plan;
    prog->init_values = mw__malloc((size_t)(p->param_elems ? p->param_elems : 1) * sizeof(float));
    if (!prog->init_values) return mw__error(MW_ERR_NOMEM, "out of memory initialising parameters");
    for (int i = 0; i < prog->g->nnodes; i++) {
        const mw_tensor *t = prog->g->nodes[i];
        if (t->op == MW__OP_PARAM)
            mw__param_init(prog->g, t, prog->init_values + p->params[t->leaf].off);
    }
    return MW_OK;
}

/* One plan per local device, and its worker's tables. */
static mw_status plan_devices(mw__program *prog, mw_tensor **grads) {
    mw_graph *g = prog->g;
    mw_status st;
    mw_mesh *mesh = prog->mesh;
    prog->nworkers = mesh->ndevices;
    prog->first = mesh->local_first;
    prog->nlocal = mesh->local_count;
    prog->spin_ns = mw__spin_ns(prog->nlocal + 1); /* the workers and the host */
    prog->w = mw__calloc((size_t)prog->nworkers, sizeof *prog->w);
    if (!prog->w) return mw__error(MW_ERR_NOMEM, "out of memory making workers");
    size_t bucket = prog->cfg.bucket_bytes ? prog->cfg.bucket_bytes : (size_t)1 << 20;
    /* Across processes, the launcher binds processes to cores (mpirun --bind-to). */
    int cores_ok = prog->cfg.pin_threads == MW_PIN_CORES && mesh->nprocs == 1;
    for (int d = 0; d < prog->nworkers; d++) {
        worker *w = &prog->w[d];
        w->prog = prog;
        w->index = d;
        if (!local(prog, d)) continue; /* another process's device */
        w->dev = (mw__device){.vt = mesh->vt,
                              .index = d,
                              .ordinal = mesh->ordinal[d],
                              .pin = cores_ok ? mesh->ndevices : 0};
        snprintf(w->dev.name, sizeof w->dev.name, "%s", mesh->device_name[d]);
        mw__placement pl;
        mw__program_placement(prog, d, &pl);
        mw__plan_target target = {
            .host_memory = mesh->vt->host_memory,
            .bucket_elems = (int64_t)(bucket / 4),
            .bf16_out = mw__backend_bf16_writers(mesh->backend),
            .prefetch_gathers = prog->reducer && prog->reducer->all_gather_start &&
                                prog->reducer->finish && prog->cfg.gathers != MW_GATHERS_AT_USE,
            .forward_nodes = prog->forward_nodes,
            .split_nodes = prog->split_nodes,
            .rotary = mw__backend_rotary_attention(mesh->backend)};
        if ((st = mw__plan_build(g, prog->loss, grads, prog->outputs, prog->noutputs, &pl, &target,
                                 &w->plan)))
            return st;
        if ((st = mw__backend_check_plan(mesh->backend, g, &w->plan, w->dev.name))) return st;
        if (prog->cfg.profile && (st = mw__profile_init(w, g))) return st;
        w->bases = mw__calloc((size_t)(MW__BASE_VIEW0 + w->plan.nviews), sizeof *w->bases);
        if (!w->bases) return mw__error(MW_ERR_NOMEM, "out of memory making workers");
        if (prog->params_from && (st = mw__share_params(prog, w))) return st;
    }
    return MW_OK;
}

mw_status mw__program_plan(mw__program *prog, mw_tensor *loss, mw_tensor **grads) {
    mw_graph *g = prog->g;
    prog->loss = loss;
    prog->grads = grads;
    mw_status st = place(prog);
    if (st) return st;
    /* Without a backward part every parameter's gradient is "none". */
    mw_tensor **none = grads ? NULL : mw__calloc((size_t)g->nparams + 1, sizeof *none);
    if (!grads && !none) return mw__error(MW_ERR_NOMEM, "out of memory making workers");
    st = plan_devices(prog, grads ? grads : none);
    mw__free(none);
    return st ? st : (st = make_groups(prog)) ? st : init_values(prog);
}

mw_status mw__program_start(mw__program *prog, const mw__program_hooks *hooks) {
    if (hooks) prog->hooks = *hooks;
    mw_mesh *mesh = prog->mesh;
    if ((prog->set_threads = mesh->backend->set_threads) &&
        prog->cfg.blas_threads != MW_BLAS_THREADS_KEEP)
        prog->blas_prev = prog->set_threads(prog->cfg.blas_threads ? prog->cfg.blas_threads : 1);
    mw_status st;
    if ((st = mw__start_workers(prog)) || (st = mw__dispatch(prog, CMD_INIT)) ||
        (st = mw__gangs_init(prog)))
        return st;
    free_init(prog);
    return MW_OK;
}

static void free_comms(mw__program *prog) {
    if (prog->all) prog->all_reducer->comm_free(prog->all);
    prog->all = NULL;
    for (int gi = 0; gi < prog->ngroups; gi++)
        for (int c = 0; c < prog->groups[gi].ncomms; c++) {
            if (prog->groups[gi].comms[c]) prog->reducer->comm_free(prog->groups[gi].comms[c]);
            prog->groups[gi].comms[c] = NULL;
        }
    for (int i = 0; prog->w && i < prog->nworkers; i++)
        memset(prog->w[i].comm, 0, sizeof prog->w[i].comm);
}

void mw__program_free(mw__program *prog) {
    if (!prog) return;
    int running = 0;
    for (int i = 0; prog->w && i < prog->nworkers; i++) running += prog->w[i].started;
    /* The communicators go first (no worker is inside a collective now): freeing one aborts what
     * a failed step left queued on a GPU, which would otherwise block the workers' final frees
     * and stream waits forever. */
    free_comms(prog);
    if (running) mw__stop_workers(prog);
    mw__gangs_free(prog);
    for (int gi = 0; gi < prog->ngroups; gi++) mw__free(prog->groups[gi].comms);
    if (prog->w)
        for (int i = 0; i < prog->nworkers; i++) {
            mw__plan_free(&prog->w[i].plan);
            mw__profile_free(&prog->w[i]);
            mw__free(prog->w[i].bases);
            mw__free(prog->w[i].kern);
            mw__free(prog->w[i].rebind);
        }
    if (prog->blas_prev > 0) prog->set_threads(prog->blas_prev);
    mw__free(prog->w);
    mw__free(prog->feed_of);
    mw__free(prog->outputs);
    mw__free(prog->user_outputs);
    free_init(prog);
    mw_graph_free(prog->g);
    mw__free(prog);
}

static mw_status check_feeds(mw__program *prog, const mw_feed *feeds, int nfeeds) {
    mw_graph *g = prog->g;
    if (nfeeds < 0 || (nfeeds > 0 && !feeds))
        return mw__error(MW_ERR_INVALID, "feeds: %d feeds%s", nfeeds,
                         nfeeds < 0 ? " (a negative count)" : " given with a NULL array");
    for (int i = 0; i < g->ninputs; i++) prog->feed_of[i] = NULL;
    for (int f = 0; f < nfeeds; f++) {
        const mw_feed *fd = &feeds[f];
        const mw_tensor *in = NULL;
        for (int i = 0; i < g->nnodes && !in; i++)
            if (g->nodes[i]->op == MW__OP_INPUT && fd->name &&
                strcmp(g->nodes[i]->name, fd->name) == 0)
                in = g->nodes[i];
        if (!in)
            return mw__error(MW_ERR_INVALID, "feed '%s': the graph has no input of that name",
                             fd->name ? fd->name : "(null)");
        if (prog->feed_of[in->leaf])
            return mw__error(MW_ERR_INVALID, "feed '%s' is given twice", fd->name);
        int64_t n = mw__type_numel(&in->type);
        if (fd->count != n) {
            char d[256];
            return mw__error(MW_ERR_INVALID, "feed '%s' has %lld elements but input %s holds %lld",
                             fd->name, (long long)fd->count,
                             mw__type_describe(g, &in->type, d, sizeof d), (long long)n);
        }
        if (!fd->data) return mw__error(MW_ERR_INVALID, "feed '%s': data is NULL", fd->name);
        prog->feed_of[in->leaf] = fd;
    }
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i]->op == MW__OP_INPUT && !prog->feed_of[g->nodes[i]->leaf])
            return mw__error(MW_ERR_INVALID, "input '%s' is not fed", g->nodes[i]->name);
    return MW_OK;
}

mw_status mw__program_feed(mw__program *prog, const mw_feed *feeds, int nfeeds) {
    if (prog->broken)
        return mw__error(MW_ERR_STATE,
                         "the trainer spans %d processes and an earlier step failed: its peers "
                         "may still be inside a collective, so it cannot step again (end the job "
                         "with mw_distributed_abort)",
                         prog->mesh->nprocs);
    return check_feeds(prog, feeds, nfeeds);
}

mw_status mw__program_run(mw__program *prog, cmd c, const mw_feed *feeds, int nfeeds) {
    mw_status st = mw__program_feed(prog, feeds, nfeeds);
    if (st || (st = mw__dispatch(prog, c))) return st;
    prog->outputs_ready = 1;
    return MW_OK;
}
