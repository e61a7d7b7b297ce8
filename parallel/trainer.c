/* The trainer's public API: steps, evaluation, accumulation, parameters, outputs, statistics and
 * fault injection. The trainer compiles the graph for every device of the mesh (trainer_build.c)
 * and runs one worker per device (workers.c: a thread each, except a CPU mesh's first device,
 * which the calling thread runs); a worker runs its plan (executor.c) and the optimizer step
 * (update.c). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/graph_impl.h"
#include "core/plan.h"
#include "meshwit.h"
#include "parallel/consistency.h"
#include "parallel/mesh_impl.h"
#include "parallel/optimizer.h"
#include "parallel/shards.h"
#include "parallel/trainer_impl.h"

static mw_status check_feeds(mw_trainer *tr, const mw_feed *feeds, int nfeeds) {
    mw_graph *g = tr->g;
    if (nfeeds < 0 || (nfeeds > 0 && !feeds))
        return mw__error(MW_ERR_INVALID, "feeds: %d feeds given with a NULL array", nfeeds);
    for (int i = 0; i < g->ninputs; i++) tr->feed_of[i] = NULL;
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
        if (tr->feed_of[in->leaf])
            return mw__error(MW_ERR_INVALID, "feed '%s' is given twice", fd->name);
        int64_t n = mw__type_numel(&in->type);
        if (fd->count != n) {
            char d[256];
            return mw__error(MW_ERR_INVALID, "feed '%s' has %lld elements but input %s holds %lld",
                             fd->name, (long long)fd->count,
                             mw__type_describe(g, &in->type, d, sizeof d), (long long)n);
        }
        if (!fd->data) return mw__error(MW_ERR_INVALID, "feed '%s': data is NULL", fd->name);
        tr->feed_of[in->leaf] = fd;
    }
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i]->op == MW__OP_INPUT && !tr->feed_of[g->nodes[i]->leaf])
            return mw__error(MW_ERR_INVALID, "input '%s' is not fed", g->nodes[i]->name);
    return MW_OK;
}

static mw_status run_command(mw_trainer *tr, cmd c, const mw_feed *feeds, int nfeeds, float *loss) {
    if (!tr) return mw__error(MW_ERR_INVALID, "trainer is NULL");
    if (tr->broken)
        return mw__error(MW_ERR_STATE,
                         "the trainer spans %d processes and an earlier step failed: its peers "
                         "may still be inside a collective, so it cannot step again (end the job "
                         "with mw_distributed_abort)",
                         tr->mesh->nprocs);
    mw_status st = check_feeds(tr, feeds, nfeeds);
    if (st) return st;
    if ((st = mw__dispatch(tr, c))) return st;
    tr->outputs_ready = 1;
    if (c == CMD_STEP && (st = mw__trainer_after_step(tr))) return st;
    if (loss) {
        worker *w = &tr->w[tr->first];
        return w->dev.vt->download(&w->dev, loss, mw__ptr(w, w->plan.loss), sizeof *loss);
    }
    return MW_OK;
}

float mw_trainer_lr(const mw_trainer *tr, int64_t step) {
    if (!tr) return 0.0f;
    const mw_optimizer *o = &tr->cfg.optimizer;
    if (o->warmup_steps > 0 && step < o->warmup_steps)
        return o->lr * (float)(step + 1) / (float)o->warmup_steps;
    if (o->decay_steps <= 0) return o->lr;
    float min_lr = o->lr * o->min_lr_ratio;
    if (step >= o->decay_steps) return min_lr;
    double ratio = (double)(step - o->warmup_steps) / (double)(o->decay_steps - o->warmup_steps);
    double coeff = 0.5 * (1.0 + cos(3.141592653589793 * ratio));
    return min_lr + (float)coeff * (o->lr - min_lr);
}

float mw_trainer_grad_norm(const mw_trainer *tr) { return tr ? tr->grad_norm : 0.0f; }

mw_status mw_trainer_step(mw_trainer *tr, const mw_feed *feeds, int nfeeds, float *loss) {
    mw_status st = tr && !tr->broken ? mw__trainer_stop_point(tr) : MW_OK;
    if (st) return st;
    if (tr) tr->step_lr = tr->host_lr >= 0.0f ? tr->host_lr : mw_trainer_lr(tr, tr->steps);
    st = run_command(tr, CMD_STEP, feeds, nfeeds, loss);
    if (st == MW_OK) tr->accumulated = 0;
    return st;
}

mw_status mw_trainer_accumulate(mw_trainer *tr, const mw_feed *feeds, int nfeeds, float *loss) {
    if (tr && !tr->cfg.grad_accumulation)
        return mw__error(MW_ERR_STATE, "mw_trainer_accumulate: the trainer was made without "
                                       "mw_trainer_config.grad_accumulation");
    mw_status st = run_command(tr, CMD_ACCUM, feeds, nfeeds, loss);
    if (st == MW_OK) tr->accumulated++;
    return st;
}

mw_status mw_trainer_set_lr(mw_trainer *tr, float lr) {
    if (!tr) return mw__error(MW_ERR_INVALID, "mw_trainer_set_lr: trainer is NULL");
    if (lr == MW_LR_SCHEDULE) {
        tr->host_lr = -1.0f;
        return MW_OK;
    }
    if (!(lr >= 0.0f) || !isfinite(lr))
        return mw__error(MW_ERR_INVALID,
                         "mw_trainer_set_lr: lr is %g; it must be finite and >= 0 (or "
                         "MW_LR_SCHEDULE)",
                         lr);
    tr->host_lr = lr;
    return MW_OK;
}

mw_status mw_trainer_compute_grads(mw_trainer *tr, const mw_feed *feeds, int nfeeds, float *loss) {
    return run_command(tr, CMD_GRADS, feeds, nfeeds, loss);
}

mw_status mw_trainer_eval(mw_trainer *tr, const mw_feed *feeds, int nfeeds, float *loss) {
    return run_command(tr, CMD_EVAL, feeds, nfeeds, loss);
}

/* The parameter called name, whose whole tensor must have count elements. */
static mw_status find_param(mw_trainer *tr, const char *name, int64_t count,
                            const mw_tensor **param) {
    if (!tr || !name) return mw__error(MW_ERR_INVALID, "trainer or parameter name is NULL");
    for (int i = 0; i < tr->g->nnodes; i++) {
        const mw_tensor *t = tr->g->nodes[i];
        if (t->op != MW__OP_PARAM || strcmp(t->name, name) != 0) continue;
        int64_t whole = mw__type_numel(&t->type);
        if (whole != count)
            return mw__error(MW_ERR_SHAPE, "parameter '%s' has %lld elements, not %lld", name,
                             (long long)whole, (long long)count);
        *param = t;
        return MW_OK;
    }
    return mw__error(MW_ERR_NOT_FOUND, "the graph has no parameter named '%s'", name);
}

static mw_status read_flat(mw_trainer *tr, const char *name, float *dst, int64_t count, int grads) {
    const mw_tensor *p;
    mw_status st = find_param(tr, name, count, &p);
    if (st) return st;
    if (count && !dst) return mw__error(MW_ERR_INVALID, "destination is NULL");
    if (grads && tr->forward_only)
        return mw__error(MW_ERR_STATE, "an inference program computes no gradients");
    if (grads && tr->zero1 && tr->nlocal < tr->nworkers)
        return mw__error(MW_ERR_UNSUPPORTED,
                         "mw_trainer_read_grad: with shard_optimizer on a mesh spanning processes "
                         "the gradients of other processes' slices are not gathered");
    return mw__param_transfer(tr, p, grads ? MW__HELD_GRADS : MW__HELD_PARAMS, dst, 0);
}

mw_status mw_trainer_read_param(mw_trainer *tr, const char *name, float *dst, int64_t count) {
    return read_flat(tr, name, dst, count, 0);
}

mw_status mw_trainer_read_grad(mw_trainer *tr, const char *name, float *dst, int64_t count) {
    return read_flat(tr, name, dst, count, 1);
}

mw_status mw_trainer_write_param(mw_trainer *tr, const char *name, const float *src,
                                 int64_t count) {
    const mw_tensor *p;
    mw_status st = find_param(tr, name, count, &p);
    if (st) return st;
    if (count && !src) return mw__error(MW_ERR_INVALID, "source is NULL");
    return mw__param_transfer(tr, p, MW__HELD_PARAMS, (float *)(uintptr_t)src, 1); /* reads src */
}

mw_status mw_trainer_read_output(mw_trainer *tr, const mw_tensor *output, float *dst,
                                 int64_t count) {
    if (!tr || !output || (count && !dst))
        return mw__error(MW_ERR_INVALID, "mw_trainer_read_output: NULL argument");
    int o = 0;
    while (o < tr->cfg.noutputs && tr->user_outputs[o] != output) o++;
    if (o == tr->cfg.noutputs)
        return mw__error(MW_ERR_NOT_FOUND, "mw_trainer_read_output: not an output of the trainer "
                                           "(list it in mw_trainer_config.outputs)");
    if (!tr->outputs_ready)
        return mw__error(MW_ERR_STATE, "mw_trainer_read_output: no step, eval or compute_grads "
                                       "has run yet, so the output has no value");
    const mw__type *t = &tr->outputs[o]->type;
    if (count != mw__type_numel(t))
        return mw__error(MW_ERR_SHAPE,
                         "mw_trainer_read_output: the output has %lld elements, "
                         "not %lld",
                         (long long)mw__type_numel(t), (long long)count);
    int sharded_output = 0;
    for (int i = 0; i < t->rank; i++) sharded_output |= t->ax[i].mesh >= 0;
    if (sharded_output && tr->mesh->nprocs > 1)
        return mw__error(MW_ERR_UNSUPPORTED,
                         "mw_trainer_read_output: a sharded output of a trainer that spans %d "
                         "processes has rows in other processes; reduce it to a replicated "
                         "tensor in the graph",
                         tr->mesh->nprocs);
    /* Each device holds a box of the global array; copy every box's rows into place. */
    float *tmp = NULL;
    int64_t cap = 0;
    mw_status st = MW_OK;
    for (int d = tr->first; d < tr->first + tr->nlocal && st == MW_OK; d++) {
        worker *w = &tr->w[d];
        mw__box box;
        mw__type_box(tr, d, t, &box);
        int64_t local = 1;
        for (int i = 0; i < box.rank; i++) local *= box.len[i];
        if (!sharded_output) /* replicated: one device has it all */
            return w->dev.vt->download(&w->dev, dst, mw__ptr(w, w->plan.outputs[o]),
                                       (size_t)count * 4);
        if (local > cap) {
            mw__free(tmp);
            cap = local;
            if (!(tmp = mw__malloc((size_t)cap * sizeof *tmp)))
                return mw__error(MW_ERR_NOMEM, "mw_trainer_read_output: out of memory");
        }
        st = w->dev.vt->download(&w->dev, tmp, mw__ptr(w, w->plan.outputs[o]), (size_t)local * 4);
        if (st == MW_OK) mw__box_copy(&box, 0, local, tmp, dst, 1);
    }
    mw__free(tmp);
    return st;
}

const char *mw_phase_name(mw_phase phase) {
    switch (phase) {
    case MW_PHASE_FORWARD: return "forward";
    case MW_PHASE_FORWARD_COLLECTIVE: return "forward collective";
    case MW_PHASE_BACKWARD: return "backward";
    case MW_PHASE_GRAD_REDUCE: return "gradient reduction";
    case MW_PHASE_UPDATE: return "update";
    }
    return "unknown phase";
}

mw_status mw_trainer_inject_fault(mw_trainer *tr, int device, mw_phase phase, int64_t step,
                                  mw_status status) {
    if (!tr || device < 0 || device >= tr->nworkers || status == MW_OK ||
        phase < MW_PHASE_FORWARD || phase > MW_PHASE_UPDATE)
        return mw__error(MW_ERR_INVALID, "mw_trainer_inject_fault: bad device, phase or status");
    if (device < tr->first || device >= tr->first + tr->nlocal)
        return mw__error(MW_ERR_INVALID, "mw_trainer_inject_fault: device %d belongs to process %d",
                         device, tr->mesh->proc_of[device]);
    worker *w = &tr->w[device];
    w->fault_phase = phase;
    w->fault_step = step;
    w->fault_status = status;
    w->fault_armed = 1;
    return MW_OK;
}

mw_status mw_trainer_inject_stall(mw_trainer *tr, int device, mw_phase phase, int64_t step,
                                  int ms) {
    if (!tr || device < 0 || device >= tr->nworkers || ms <= 0 || phase < MW_PHASE_FORWARD ||
        phase > MW_PHASE_UPDATE)
        return mw__error(MW_ERR_INVALID, "mw_trainer_inject_stall: bad device, phase or time");
    if (device < tr->first || device >= tr->first + tr->nlocal)
        return mw__error(MW_ERR_INVALID, "mw_trainer_inject_stall: device %d belongs to process %d",
                         device, tr->mesh->proc_of[device]);
    worker *w = &tr->w[device];
    w->fault_phase = phase;
    w->fault_step = step;
    w->fault_status = MW_OK;
    w->fault_ms = ms;
    w->fault_armed = 1;
    return MW_OK;
}

mw_status mw_trainer_stats(const mw_trainer *tr, mw_step_stats *out) {
    if (!tr || !out) return mw__error(MW_ERR_INVALID, "mw_trainer_stats: NULL argument");
    *out = tr->stats;
    return MW_OK;
}

int64_t mw_trainer_steps(const mw_trainer *tr) { return tr ? tr->steps : 0; }

int mw_trainer_devices(const mw_trainer *tr) { return tr ? tr->nworkers : 0; }

mw_status mw_trainer_memory(const mw_trainer *tr, int device, mw_device_memory *out) {
    if (!tr || !out) return mw__error(MW_ERR_INVALID, "mw_trainer_memory: NULL argument");
    if (device < tr->first || device >= tr->first + tr->nlocal)
        return mw__error(MW_ERR_INVALID,
                         "mw_trainer_memory: device %d is not one of this process's (%d..%d)",
                         device, tr->first, tr->first + tr->nlocal - 1);
    const worker *w = &tr->w[device];
    int64_t p = w->plan.param_elems * 4;
    int moments = mw__optimizer_moments(&tr->cfg.optimizer); /* allocated in every trainer */
    int64_t slice = (w->own_hi - w->own_lo) * 4, accum = tr->cfg.grad_accumulation ? slice : 0;
    int64_t p16 = w->params16 ? (int64_t)mw__params16_elems(w) * 2 : 0;
    const mw__device_vtable *vt = w->dev.vt;
    *out = (mw_device_memory){.parameters = (tr->params_from ? 0 : p) + p16,
                              .gradients = tr->forward_only ? 0 : p + accum,
                              .optimizer = moments * slice,
                              .activations = w->plan.arena_bytes,
                              .workspace = vt->workspace ? (int64_t)vt->workspace(&w->dev) : 0};
    return MW_OK;
}

mw_status mw_trainer_kernels(const mw_trainer *tr, char *buf, size_t size) {
    if (!tr || !buf || !size) return mw__error(MW_ERR_INVALID, "mw_trainer_kernels: NULL argument");
    const worker *w = &tr->w[tr->first];
    const mw__device_vtable *vt = w->dev.vt;
    /* Distinct (kind, dtype, implementation) in order of first appearance, with counts. */
    enum { MAX_LINES = 16 };
    struct {
        char text[160];
        int count;
    } lines[MAX_LINES];
    int n = 0;
    for (int i = 0; i < w->plan.nins; i++) {
        const mw__ins *in = &w->plan.ins[i];
        const mw__k_gemm *gm = &w->kern[i].gemm;
        const mw__k_attention *at =
            in->kind == MW__I_ATTENTION_GRAD ? &w->kern[i].attention_grad : &w->kern[i].attention;
        const char *kind, *impl = NULL;
        mw_dtype dt;
        if (in->kind == MW__I_GEMM) {
            kind = "gemm";
            dt = gm->ab_dtype;
        } else if (in->kind == MW__I_ATTENTION || in->kind == MW__I_ATTENTION_GRAD) {
            kind = in->kind == MW__I_ATTENTION ? "attention" : "attention_grad";
            dt = at->qkv_dtype;
        } else {
            continue;
        }
        if (vt->describe) impl = vt->describe(&w->dev, (int)in->kind, &w->kern[i]);
        char text[160];
        snprintf(text, sizeof text, "%s %s: %s", kind, mw__dtype_name(dt),
                 impl && *impl ? impl : vt->kind);
        int j = 0;
        while (j < n && strcmp(lines[j].text, text) != 0) j++;
        if (j == n && n < MAX_LINES) {
            snprintf(lines[n].text, sizeof lines[0].text, "%s", text);
            lines[n++].count = 0;
        }
        if (j < n) lines[j].count++;
    }
    size_t used = 0;
    buf[0] = '\0';
    for (int j = 0; j < n && used < size; j++) {
        int k = snprintf(buf + used, size - used, "%s%s (%d)", j ? "\n" : "", lines[j].text,
                         lines[j].count);
        used += k > 0 ? (size_t)k : 0;
    }
    return MW_OK;
}

int64_t mw_trainer_local_size(const mw_trainer *tr, int device, const char *axis) {
    if (!tr || !axis || device < 0 || device >= tr->nworkers) return -1;
    const mw_graph *g = tr->g;
    int name = mw__graph_find_name(g, axis);
    if (name < 0) return -1;
    int64_t found = -1;
    for (int i = 0; i < g->nnodes; i++) {
        const mw__type *t = &g->nodes[i]->type;
        int j = mw__type_find_name(t, name);
        if (j < 0) continue;
        const mw__axis *a = &t->ax[j];
        if (a->mesh < 0) {
            if (found < 0) found = a->size;
            continue;
        }
        int ma = tr->mesh_axis_of[a->mesh];
        return mw__split_len(a->size, tr->mesh->axis_size[ma],
                             mw__mesh_coord(tr->mesh, device, ma));
    }
    return found;
}
