/* The trainer's public API: steps, evaluation, accumulation, parameters, outputs, statistics and
 * fault injection. The trainer is a program (parallel/program.h: the graph compiled for every
 * device of the mesh, one worker per device) with the backward pass (trainer_build.c) and the
 * optimizer step run on each worker after it (optimizer.c). */
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
#include "parallel/pipeline_impl.h"
#include "parallel/trainer_impl.h"

/* The loss the current command left on the first local device. */
static mw_status read_loss(mw__program *prog, float *loss) {
    worker *w = &prog->w[prog->first];
    return w->dev.vt->download(&w->dev, loss, mw__ptr(w, w->plan.loss), sizeof *loss);
}

/* The learning rate of the step about to run: the one set from the host, or the schedule's. */
static float step_lr(const mw_trainer *tr) {
    return tr->host_lr >= 0.0f ? tr->host_lr : mw_trainer_lr(tr, tr->prog->steps);
}

/* Runs command c; micro: the micro-batch (dropout's masks), -1 for the count accumulated. */
static mw_status run_micro(mw_trainer *tr, mw__train t, cmd c, int micro, const mw_feed *feeds,
                           int nfeeds, float *loss) {
    if (!tr) return mw__error(MW_ERR_INVALID, "trainer is NULL");
    mw__program *prog = tr->prog;
    mw_status st = mw__program_feed(prog, feeds, nfeeds);
    if (st) return st;
    tr->train = t;
    prog->micro = micro >= 0 ? micro : tr->accumulated;
    for (int d = prog->first; d < prog->first + prog->nlocal; d++) tr->rep[d].update_ms = 0.0;
    st = mw__dispatch(prog, c);
    prog->stats.update_ms = tr->rep[prog->first].update_ms;
    /* A step stopped for non-finite values stops after the all-reduce: its gradients can be read
     * (to find the non-finite ones). */
    int backward = c == CMD_BACKWARD || c == CMD_BACKWARD_REST || c == CMD_BACKWARD_WEIGHT;
    if (backward && t != TRAIN_ACCUM && (st == MW_OK || st == MW_ERR_NONFINITE))
        tr->grads_ready = 1;
    /* A step stopped by its gradients still computed its loss: the caller gets it too. */
    if (st == MW_ERR_NONFINITE && loss && read_loss(prog, loss) != MW_OK) *loss = NAN;
    if (st) return st;
    prog->outputs_ready = 1;
    if (backward && t == TRAIN_STEP && (st = mw__trainer_after_step(tr))) return st;
    return loss ? read_loss(prog, loss) : MW_OK;
}

static mw_status run_command(mw_trainer *tr, mw__train t, cmd c, const mw_feed *feeds, int nfeeds,
                             float *loss) {
    return run_micro(tr, t, c, -1, feeds, nfeeds, loss);
}

mw_status mw__trainer_forward_keep(mw_trainer *tr, int slot, int micro, const mw_feed *feeds,
                                   int nfeeds) {
    tr->prog->slot = slot;
    return run_micro(tr, TRAIN_GRADS, CMD_FORWARD_KEEP, micro, feeds, nfeeds, NULL);
}

/* A pipeline stage's backward command c on slot's micro-batch, its gradients accumulated. */
static mw_status accumulate_slot(mw_trainer *tr, cmd c, int slot, int micro, const mw_feed *feeds,
                                 int nfeeds, float *loss) {
    tr->prog->slot = slot;
    mw_status st = run_micro(tr, TRAIN_ACCUM, c, micro, feeds, nfeeds, loss);
    if (st == MW_OK) tr->accumulated++;
    return st;
}

mw_status mw__trainer_backward_rest(mw_trainer *tr, int slot, int micro, const mw_feed *feeds,
                                    int nfeeds, float *loss) {
    return accumulate_slot(tr, CMD_BACKWARD_REST, slot, micro, feeds, nfeeds, loss);
}

mw_status mw__trainer_backward_input(mw_trainer *tr, int slot, int micro, const mw_feed *feeds,
                                     int nfeeds) {
    tr->prog->slot = slot;
    return run_micro(tr, TRAIN_GRADS, CMD_BACKWARD_INPUT, micro, feeds, nfeeds, NULL);
}

mw_status mw__trainer_backward_weight(mw_trainer *tr, int slot, int micro, const mw_feed *feeds,
                                      int nfeeds, float *loss) {
    return accumulate_slot(tr, CMD_BACKWARD_WEIGHT, slot, micro, feeds, nfeeds, loss);
}

mw_status mw__trainer_update(mw_trainer *tr) {
    mw__program *prog = tr->prog;
    tr->step_lr = step_lr(tr);
    tr->train = TRAIN_STEP;
    tr->fold_only = 1;
    for (int d = prog->first; d < prog->first + prog->nlocal; d++) tr->rep[d].update_ms = 0.0;
    mw_status st = mw__dispatch(prog, CMD_UPDATE);
    tr->fold_only = 0;
    prog->stats.update_ms = tr->rep[prog->first].update_ms;
    if (st == MW_OK || st == MW_ERR_NONFINITE) tr->grads_ready = 1;
    if (st) return st;
    tr->accumulated = 0;
    return mw__trainer_after_step(tr);
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

float mw_trainer_grad_norm(const mw_trainer *tr) {
    if (tr && tr->pipe) return mw_trainer_grad_norm(mw__pipeline_first_trainer(tr->pipe));
    return tr ? tr->grad_norm : 0.0f;
}

/* A pipeline's step: a stop request (process-wide or this trainer's) refuses it first. */
static mw_status pipeline_step(mw_trainer *tr, const mw_feed *feeds, int nfeeds, float *loss) {
    if (atomic_exchange(&tr->stop, 0))
        return mw__error(MW_ERR_INTERRUPTED,
                         "a stop was requested; the trainer stopped after step "
                         "%lld, unchanged",
                         (long long)mw_trainer_steps(tr));
    for (int s = 0; s < mw_pipeline_stages(tr->pipe); s++) {
        mw_trainer *st = mw__pipeline_stage_trainer(tr->pipe, s); /* (NULL: another process's) */
        if (st) st->host_lr = tr->host_lr;
    }
    return mw_pipeline_step(tr->pipe, feeds, nfeeds, loss);
}

mw_status mw_trainer_step(mw_trainer *tr, const mw_feed *feeds, int nfeeds, float *loss) {
    if (tr && tr->pipe) return pipeline_step(tr, feeds, nfeeds, loss);
    mw_status st = tr && !tr->prog->broken ? mw__trainer_stop_point(tr) : MW_OK;
    if (st) return st;
    if (tr) tr->step_lr = step_lr(tr);
    st = run_command(tr, TRAIN_STEP, CMD_BACKWARD, feeds, nfeeds, loss);
    if (st == MW_OK) tr->accumulated = 0;
    return st;
}

mw_status mw_trainer_accumulate(mw_trainer *tr, const mw_feed *feeds, int nfeeds, float *loss) {
    MW__NOT_PIPELINED(tr, "mw_trainer_accumulate");
    if (tr && !tr->cfg.grad_accumulation)
        return mw__error(MW_ERR_STATE, "mw_trainer_accumulate: the trainer was made without "
                                       "mw_trainer_config.grad_accumulation");
    mw_status st = run_command(tr, TRAIN_ACCUM, CMD_BACKWARD, feeds, nfeeds, loss);
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
    MW__NOT_PIPELINED(tr, "mw_trainer_compute_grads");
    return run_command(tr, TRAIN_GRADS, CMD_BACKWARD, feeds, nfeeds, loss);
}

mw_status mw_trainer_eval(mw_trainer *tr, const mw_feed *feeds, int nfeeds, float *loss) {
    if (tr && tr->pipe) return mw__pipeline_eval(tr->pipe, feeds, nfeeds, loss);
    return run_command(tr, TRAIN_GRADS, CMD_FORWARD, feeds, nfeeds, loss);
}

static mw_status read_flat(mw_trainer *tr, const char *name, float *dst, int64_t count, int grads) {
    if (!grads)
        return tr ? mw__program_param(tr->prog, name, dst, count, 0)
                  : mw__error(MW_ERR_INVALID, "trainer or parameter name is NULL");
    const mw_tensor *p;
    mw_status st = tr ? mw__program_find_param(tr->prog, name, count, &p)
                      : mw__error(MW_ERR_INVALID, "trainer or parameter name is NULL");
    if (st) return st;
    if (count && !dst) return mw__error(MW_ERR_INVALID, "destination is NULL");
    if (tr->prog->zero1 && tr->prog->nlocal < tr->prog->nworkers)
        return mw__error(MW_ERR_UNSUPPORTED,
                         "mw_trainer_read_grad: with shard_optimizer on a mesh spanning processes "
                         "the gradients of other processes' slices are not gathered");
    if (!tr->grads_ready)
        return mw__error(MW_ERR_STATE,
                         "mw_trainer_read_grad: no step or compute_grads has run "
                         "yet, so parameter '%s' has no gradient",
                         name);
    mw__holding h = mw__held_grads(tr);
    return mw__param_transfer(tr->prog, p, &h, dst, 0);
}

mw_status mw_trainer_read_param(mw_trainer *tr, const char *name, float *dst, int64_t count) {
    if (tr && tr->pipe) return mw_pipeline_read_param(tr->pipe, name, dst, count);
    return read_flat(tr, name, dst, count, 0);
}

mw_status mw_trainer_read_grad(mw_trainer *tr, const char *name, float *dst, int64_t count) {
    MW__NOT_PIPELINED(tr, "mw_trainer_read_grad");
    return read_flat(tr, name, dst, count, 1);
}

mw_status mw_trainer_write_param(mw_trainer *tr, const char *name, const float *src,
                                 int64_t count) {
    if (!tr) return mw__error(MW_ERR_INVALID, "trainer or parameter name is NULL");
    if (tr->pipe) return mw_pipeline_write_param(tr->pipe, name, src, count);
    return mw__program_param(tr->prog, name, (float *)(uintptr_t)src, count, 1); /* reads src */
}

mw_status mw_trainer_read_output(mw_trainer *tr, const mw_tensor *output, float *dst,
                                 int64_t count) {
    if (!tr) return mw__error(MW_ERR_INVALID, "mw_trainer_read_output: NULL argument");
    MW__NOT_PIPELINED(tr, "mw_trainer_read_output");
    return mw__program_read_output(tr->prog, "mw_trainer_read_output", output, dst, count);
}

mw_status mw_trainer_stats(const mw_trainer *tr, mw_step_stats *out) {
    if (!tr || !out) return mw__error(MW_ERR_INVALID, "mw_trainer_stats: NULL argument");
    if (tr->pipe) {
        *out = (mw_step_stats){.step_ms = mw__pipeline_step_ms(tr->pipe), .threads = 1};
        return MW_OK;
    }
    *out = tr->prog->stats;
    return MW_OK;
}

int64_t mw_trainer_steps(const mw_trainer *tr) {
    if (tr && tr->pipe) return mw_trainer_steps(mw__pipeline_first_trainer(tr->pipe));
    return tr ? tr->prog->steps : 0;
}

int mw_trainer_devices(const mw_trainer *tr) {
    if (tr && tr->pipe) return mw__pipeline_devices(tr->pipe);
    return tr ? tr->prog->nworkers : 0;
}

mw_status mw_trainer_memory(const mw_trainer *tr, int device, mw_device_memory *out) {
    if (!tr || !out) return mw__error(MW_ERR_INVALID, "mw_trainer_memory: NULL argument");
    if (tr->pipe) { /* the device's stages' */
        mw_trainer *st[64];
        int local = 0, n = mw__pipeline_device(tr->pipe, device, st, &local);
        if (!n)
            return mw__error(MW_ERR_INVALID,
                             "mw_trainer_memory: device %d is not one of this process's", device);
        *out = (mw_device_memory){0};
        for (int k = 0; k < n; k++) {
            mw_device_memory m;
            mw_status e = mw_trainer_memory(st[k], local, &m);
            if (e) return e;
            out->parameters += m.parameters, out->gradients += m.gradients;
            out->optimizer += m.optimizer, out->activations += m.activations;
            out->workspace += m.workspace;
        }
        return MW_OK;
    }
    if (device < tr->prog->first || device >= tr->prog->first + tr->prog->nlocal)
        return mw__error(MW_ERR_INVALID,
                         "mw_trainer_memory: device %d is not one of this process's (%d..%d)",
                         device, tr->prog->first, tr->prog->first + tr->prog->nlocal - 1);
    const worker *w = &tr->prog->w[device];
    int64_t p = w->plan.param_elems * 4;
    int moments = mw__optimizer_moments(&tr->cfg.optimizer); /* allocated in every trainer */
    const replica *r = &tr->rep[device];
    int64_t slice = (r->own_hi - r->own_lo) * 4, accum = tr->cfg.grad_accumulation ? slice : 0;
    int64_t p16 = w->params16 ? (int64_t)mw__params16_elems(w) * 2 : 0;
    const mw__device_vtable *vt = w->dev.vt;
    *out = (mw_device_memory){.parameters = p + p16,
                              .gradients = p + accum,
                              .optimizer = moments * slice,
                              .activations =
                                  w->plan.arena_bytes * (tr->prog->slots > 1 ? tr->prog->slots : 1),
                              .workspace = vt->workspace ? (int64_t)vt->workspace(&w->dev) : 0};
    return MW_OK;
}

mw_status mw_trainer_kernels(const mw_trainer *tr, char *buf, size_t size) {
    if (!tr || !buf || !size)
        return mw__error(MW_ERR_INVALID, "mw_trainer_kernels: NULL trainer or buffer, or size 0");
    if (tr->pipe) return mw_trainer_kernels(mw__pipeline_first_trainer(tr->pipe), buf, size);
    const worker *w = &tr->prog->w[tr->prog->first];
    const mw__device_vtable *vt = w->dev.vt;
    /* Distinct (kind, dtype, implementation) in order of first appearance, with counts. */
    enum { MAX_LINES = 16 };
    struct {
        char text[160];
        int count;
    } lines[MAX_LINES];
    int n = 0, others = 0;
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
        } else if (in->kind < MW__I_ALLREDUCE) { /* the others: what runs the other kernels */
            others++;
            continue;
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
    const char *rest = vt->describe && others ? vt->describe(&w->dev, -1, NULL) : NULL;
    if (rest && *rest && used < size)
        snprintf(buf + used, size - used, "%sother kernels: %s (%d)", n ? "\n" : "", rest, others);
    return MW_OK;
}

int64_t mw_trainer_local_size(const mw_trainer *tr, int device, const char *axis) {
    if (!tr || tr->pipe || !axis || device < 0 || device >= tr->prog->nworkers) return -1;
    const mw_graph *g = tr->prog->g;
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
        int ma = tr->prog->mesh_axis_of[a->mesh];
        return mw__split_len(a->size, tr->prog->mesh->axis_size[ma],
                             mw__mesh_coord(tr->prog->mesh, device, ma));
    }
    return found;
}

mw_status mw_trainer_profile(const mw_trainer *tr, mw_profile_row *rows, int capacity, int *count) {
    if (!tr || !count) return mw__error(MW_ERR_INVALID, "mw_trainer_profile: NULL argument");
    MW__NOT_PIPELINED(tr, "mw_trainer_profile");
    if (!tr->cfg.profile)
        return mw__error(MW_ERR_STATE, "mw_trainer_profile: the trainer was made without "
                                       "mw_trainer_config.profile set");
    mw__program_profile(tr->prog, rows, capacity, count);
    return MW_OK;
}

void mw_trainer_profile_reset(mw_trainer *tr) {
    if (tr && !tr->pipe && tr->cfg.profile) mw__program_profile_reset(tr->prog);
}
