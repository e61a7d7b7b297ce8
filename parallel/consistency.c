/* Trust between a trainer's replicas and processes: its fingerprint (the program's, parallel/
 * agree.c, with the optimizer's decisions) compared across processes when it is made, rank 0's
 * initial parameters broadcast to every process, stop requests honoured at step boundaries,
 * skipped non-finite steps counted, and replicas compared by checksum. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/hash.h"
#include "parallel/agree.h"
#include "parallel/config.h"
#include "parallel/consistency.h"
#include "parallel/optimizer.h"
#include "parallel/pipeline_impl.h"
#include "parallel/trainer_impl.h"

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "a stop request must be a lock-free store");

/* --- stop requests ---------------------------------------------------------------------------- */

static _Atomic int stop_all;

void mw_request_stop(void) { atomic_store(&stop_all, 1); }

void mw_cancel_stop(void) { atomic_store(&stop_all, 0); }

int mw_stop_requested(void) { return atomic_load(&stop_all); }

void mw_trainer_request_stop(mw_trainer *tr) {
    if (tr) atomic_store(&tr->stop, 1);
}

mw_status mw__trainer_stop_point(mw_trainer *tr) {
    int mine = atomic_exchange(&tr->stop, 0) | atomic_load(&stop_all), any = mine;
    if (tr->prog->mesh->nprocs > 1) {
        mw_status st = mw__dist_max_int(mine, &any, tr->cfg.collective_timeout_ms,
                                        "the stop check before a step");
        if (st) {
            tr->prog->broken = 1; /* the request may still be pending: no more collectives */
            return st;
        }
    }
    if (!any) return MW_OK;
    return mw__error(MW_ERR_INTERRUPTED,
                     "a stop was requested%s; the trainer stopped after step %lld, unchanged",
                     mine ? "" : " in another process", (long long)tr->prog->steps);
}

mw_status mw__trainer_agree(const mw_trainer_config *cfg, const mw_mesh *mesh,
                            const mw_graph *graph, const mw_tensor *loss) {
    if (mesh->nprocs <= 1) return MW_OK;
    /* What the weight decay applies to: the decays function is each process's own. */
    mw__text extra = {0};
    unsigned char *decays = mw__calloc((size_t)graph->nparams + 1, 1);
    mw_status st = decays ? mw__decay_flags(graph, &cfg->optimizer, decays)
                          : mw__error(MW_ERR_NOMEM, "mw_trainer_new: out of memory");
    for (int i = 0; st == MW_OK && i < graph->nnodes; i++)
        if (graph->nodes[i]->op == MW__OP_PARAM)
            mw__text_add(&extra, "weight decay %s parameter '%s'",
                         decays[graph->nodes[i]->leaf] ? "applies to" : "skips",
                         graph->nodes[i]->name);
    char *config = st ? NULL : mw__trainer_config_text(cfg);
    if (st == MW_OK && !config) st = mw__error(MW_ERR_NOMEM, "mw_trainer_new: out of memory");
    if (st == MW_OK)
        st = mw__program_agree("mw_trainer_new", graph, loss, config, &extra,
                               cfg->collective_timeout_ms);
    mw__free(config);
    mw__free(extra.s);
    mw__free(decays);
    return st;
}

/* The most devices one process of the mesh holds. */
static int most_local(const mw_mesh *mesh) {
    int count[MW_MAX_DEVICES] = {0}, most = 0;
    for (int d = 0; d < mesh->ndevices; d++)
        if (++count[mesh->proc_of[d]] > most) most = count[mesh->proc_of[d]];
    return most > 0 ? most : 1;
}

/* The host scratch of the replica check: one replica's parameters, and per-parameter checksums
 * of every local device (most_local rows, the last ones unused where this process holds fewer)
 * and of every process's devices. */
static mw_status replica_scratch(mw_trainer *tr) {
    if (tr->replica_buf) return MW_OK;
    const mw_mesh *mesh = tr->prog->mesh;
    size_t np = (size_t)tr->prog->g->nparams + 1, rows = (size_t)most_local(mesh);
    int64_t most = 0;
    for (int d = tr->prog->first; d < tr->prog->first + tr->prog->nlocal; d++)
        if (tr->prog->w[d].plan.param_elems > most) most = tr->prog->w[d].plan.param_elems;
    tr->replica_buf = mw__malloc((size_t)(most + 1) * sizeof(float));
    tr->replica_sums = mw__calloc(np * rows * (1 + (size_t)mesh->nprocs), sizeof(uint64_t));
    if (tr->replica_buf && tr->replica_sums) return MW_OK;
    mw__trainer_consistency_free(tr);
    return mw__error(MW_ERR_NOMEM, "out of memory for the replica check");
}

mw_status mw__trainer_prepare(mw_trainer *tr) {
    mw_status st = tr->cfg.check_replicas_every > 0 ? replica_scratch(tr) : MW_OK;
    /* Sharded parameters were broadcast as they were drawn (mw__param_init_boxes). */
    if (st || tr->prog->mesh->nprocs <= 1 || !tr->prog->init_values) return st;
    size_t bytes = (size_t)tr->prog->w[tr->prog->first].plan.param_elems * sizeof(float);
    return mw__dist_bcast_bytes(tr->prog->init_values, bytes, tr->cfg.collective_timeout_ms,
                                "mw_trainer_new: broadcasting rank 0's initial parameters");
}

/* --- replicas -----------------------------------------------------------------------------------
 */

int64_t mw_trainer_skipped_steps(const mw_trainer *tr) {
    if (tr && tr->pipe) return mw_trainer_skipped_steps(mw__pipeline_first_trainer(tr->pipe));
    return tr ? tr->skipped : 0;
}

/* The parameter nodes of the trainer's graph, by leaf index. */
static const mw_tensor *param_of(const mw_trainer *tr, int leaf) {
    for (int i = 0; i < tr->prog->g->nnodes; i++)
        if (tr->prog->g->nodes[i]->op == MW__OP_PARAM && tr->prog->g->nodes[i]->leaf == leaf)
            return tr->prog->g->nodes[i];
    return NULL;
}

mw_status mw_trainer_check_replicas(mw_trainer *tr) {
    if (!tr) return mw__error(MW_ERR_INVALID, "mw_trainer_check_replicas: trainer is NULL");
    if (tr->pipe) return mw__pipeline_check_replicas(tr->pipe);
    if (tr->prog->broken)
        return mw__error(MW_ERR_STATE, "mw_trainer_check_replicas: an earlier step of this "
                                       "trainer failed across processes; end the job");
    int np = tr->prog->g->nparams;
    mw_status st = replica_scratch(tr);
    if (st) return st;
    /* Each device's parameters against those of the first device holding the same values (the
     * same shard of a split parameter). */
    const mw_mesh *mesh = tr->prog->mesh;
    size_t stride = (size_t)np + 1, rows = (size_t)most_local(mesh);
    uint64_t *sums = tr->replica_sums, *all = sums + rows * stride;
    for (int d = tr->prog->first; d < tr->prog->first + tr->prog->nlocal; d++) {
        worker *w = &tr->prog->w[d];
        const mw__plan *p = &w->plan;
        st = w->dev.vt->download(&w->dev, tr->replica_buf, w->params,
                                 (size_t)p->param_elems * sizeof(float));
        if (st) return st;
        uint64_t *mine = sums + (size_t)(d - tr->prog->first) * stride;
        for (int l = 0; l < np; l++)
            mine[l] = mw__fnv1a(MW__FNV_BASIS, tr->replica_buf + p->params[l].off,
                                (size_t)p->params[l].count * sizeof(float));
        for (int l = 0; d > tr->prog->first && l < np; l++) {
            const mw_tensor *pn = param_of(tr, l);
            int e = mw__param_holder(tr->prog, d, pn, &mw__held_params);
            if (e != d && sums[(size_t)(e - tr->prog->first) * stride + (size_t)l] != mine[l])
                return mw__error(MW_ERR_STATE,
                                 "replicas diverged by step %lld: parameter '%s'%s differs between "
                                 "devices %s and %s",
                                 (long long)tr->prog->steps, pn->name,
                                 mw__param_sharded(pn) ? " (the same shard)" : "", w->dev.name,
                                 tr->prog->w[e].dev.name);
        }
    }
    int nprocs = mesh->nprocs;
    if (nprocs <= 1) return MW_OK;
    /* Every process sends every local device's checksums; each device of the mesh is compared
     * with the first device of another process holding the same box (every box of a split
     * parameter, whichever of its devices holds it). */
    st = mw__dist_allgather_u64(sums, (int)(rows * stride), all, tr->cfg.collective_timeout_ms,
                                "the replica check");
    if (st) {
        tr->prog->broken = 1; /* the request may still be pending */
        return st;
    }
    int row[MW_MAX_DEVICES], seen[MW_MAX_DEVICES] = {0};
    for (int d = 0; d < mesh->ndevices; d++) row[d] = seen[mesh->proc_of[d]]++;
    for (int d = 0; d < mesh->ndevices; d++)
        for (int l = 0; l < np; l++) {
            const mw_tensor *pn = param_of(tr, l);
            int pd = mesh->proc_of[d], e = 0;
            while (e < d && (mesh->proc_of[e] == pd || !mw__same_box(tr->prog, e, d, pn))) e++;
            if (e == d) continue; /* the first of its box, or its box's first is in this process */
            int pe = mesh->proc_of[e];
            uint64_t a = all[((size_t)pd * rows + (size_t)row[d]) * stride + (size_t)l],
                     b = all[((size_t)pe * rows + (size_t)row[e]) * stride + (size_t)l];
            if (a == b) continue;
            return mw__error(MW_ERR_STATE,
                             "replicas diverged by step %lld: parameter '%s'%s differs between "
                             "rank %d and rank %d (devices %s and %s; checksums %016llx and "
                             "%016llx)",
                             (long long)tr->prog->steps, pn->name,
                             mw__param_sharded(pn) ? " (the same shard)" : "", pd, pe,
                             mesh->device_name[d], mesh->device_name[e], (unsigned long long)a,
                             (unsigned long long)b);
        }
    return MW_OK;
}

mw_status mw__trainer_after_step(mw_trainer *tr) {
    if (tr->rep[tr->prog->first].skipped) {
        tr->skipped++;
        return MW_OK;
    }
    tr->prog->steps++;
    int every = tr->cfg.check_replicas_every;
    return every > 0 && tr->prog->steps % every == 0 ? mw_trainer_check_replicas(tr) : MW_OK;
}

void mw__trainer_consistency_free(mw_trainer *tr) {
    mw__free(tr->replica_buf);
    mw__free(tr->replica_sums);
    tr->replica_buf = NULL;
    tr->replica_sums = NULL;
}
