/* Pipelines (meshwit/pipeline.h): a step. The schedule's forward and backward parts of the
 * micro-batches run by a thread per device position along the pipeline axis, the values that
 * cross stages handed over in host memory; then every stage updates at once, meeting in
 * mw__pipe_global_norm for the whole model's gradient norm. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "parallel/pipeline_impl.h"
#include "parallel/pipeline_state.h"
#include "parallel/program.h"
#include "parallel/trainer_impl.h"

void mw__pipe_stage_feeds(mw_pipeline *p, stage *sg, int m, int backward) {
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
    mw_status st = mw__pipe_values_in(p, s, m);
    if (st) return st;
    int slot = 0;
    while (slot < sg->slots && sg->slot_busy[slot]) slot++;
    if (slot == sg->slots)
        return mw__pipe_fail(
            p, mw__error(MW_ERR_STATE, "no free activation slot for micro-batch %d", m), s,
            "forward");
    sg->slot_busy[slot] = 1;
    sg->slot_of[m] = slot;
    mw__pipe_stage_feeds(p, sg, m, 0);
    int64_t t0 = mw__now_ns();
    st = mw__trainer_forward_keep(sg->tr, slot, m, sg->feeds, sg->nfeeds);
    for (int j = 0; st == MW_OK && j < sg->nout; j++)
        st = mw__program_read_output(sg->tr->prog, "mw_pipeline_step", sg->out[j].node,
                                     sg->out[j].value[m], sg->out[j].count);
    sg->part_ms[0] += (double)(mw__now_ns() - t0) * 1e-6;
    if (st) return mw__pipe_fail(p, st, s, "forward");
    return mw__pipe_values_out(p, s, m);
}

static mw_status run_backward(mw_pipeline *p, int s, int m) {
    stage *sg = &p->st[s];
    mw_status st = mw__pipe_grads_in(p, s, m);
    if (st) return st;
    mw__pipe_stage_feeds(p, sg, m, 1);
    int64_t t0 = mw__now_ns();
    float loss = 0.0f;
    int zb = p->kind == MW_SCHEDULE_ZERO_BUBBLE;
    st = zb ? mw__trainer_backward_input(sg->tr, sg->slot_of[m], m, sg->feeds, sg->nfeeds)
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
    if (st) return mw__pipe_fail(p, st, s, "backward");
    if (sg->losses && !zb) sg->losses[m] = loss;
    return mw__pipe_grads_out(p, s, m);
}

/* Zero-bubble's W: the weight gradients of micro-batch m, accumulated; its slot is free again. */
static mw_status run_weights(mw_pipeline *p, int s, int m) {
    stage *sg = &p->st[s];
    mw__pipe_stage_feeds(p, sg, m, 1);
    int64_t t0 = mw__now_ns();
    float loss = 0.0f;
    mw_status st =
        mw__trainer_backward_weight(sg->tr, sg->slot_of[m], m, sg->feeds, sg->nfeeds, &loss);
    sg->part_ms[2] += (double)(mw__now_ns() - t0) * 1e-6;
    sg->slot_busy[sg->slot_of[m]] = 0;
    if (st) return mw__pipe_fail(p, st, s, "weight gradients");
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
 * and gets the whole model's: the root of the sum of the stages' squares. The last of this
 * process's stages to post gathers the other processes' (a collective, outside the lock). */
float mw__pipe_global_norm(void *ctx, int device, float norm) {
    norm_ctx *c = ctx;
    mw_pipeline *p = c->p;
    pthread_mutex_lock(&p->mu);
    if (device == 0) {
        p->norms[c->stage] = norm;
        if (++p->nposted == p->nlocal) {
            if (p->nprocs > 1) {
                pthread_mutex_unlock(&p->mu);
                mw_status st = mw__pipe_link_norms(p);
                char msg[MW__MSG_SIZE];
                snprintf(msg, sizeof msg, "%s", st ? mw_last_error() : "");
                pthread_mutex_lock(&p->mu);
                if (st && !p->failed) {
                    p->failed = st;
                    snprintf(p->msg, sizeof p->msg, "%s", msg);
                }
            }
            p->norm_round++;
            pthread_cond_broadcast(&p->cv);
        }
    }
    while (p->norm_round == p->round_now && !p->failed) pthread_cond_wait(&p->cv, &p->mu);
    double sq = 0;
    for (int s = 0; s < p->S; s++) sq += (double)p->norms[s] * (double)p->norms[s];
    int failed = p->failed != MW_OK;
    pthread_mutex_unlock(&p->mu);
    return failed ? NAN : (float)sqrt(sq);
}

static void release(mw_pipeline *p) {
    /* A failed update must not keep a stage waiting in global_norm. */
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

mw_status mw__pipe_check_feeds(mw_pipeline *p, const mw_feed *feeds, int nfeeds,
                               const char *caller) {
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

/* Phase 2: this process's stages update at once (they meet in mw__pipe_global_norm); the
 * processes agree on the outcome. */
static mw_status update_all(mw_pipeline *p) {
    updater up[64];
    int mine[64], n = 0, started = 0;
    for (int s = 0; s < p->S; s++)
        if (mw__pipe_local(p, s)) mine[n++] = s;
    p->nposted = 0;
    p->round_now = p->norm_round;
    memset(p->norms, 0, (size_t)p->S * sizeof *p->norms);
    for (int i = 0; i < n; i++) up[i] = (updater){.p = p, .s = mine[i]};
    for (int i = 1; i < n; i++) {
        if (pthread_create(&up[i].thread, NULL, update_stage, &up[i]) != 0) break;
        started = i;
    }
    if (started == n - 1 || n == 0) {
        if (n) update_stage(&up[0]);
    } else {
        up[0].st = mw__error(MW_ERR_NOMEM, "cannot start a thread");
        snprintf(up[0].msg, sizeof up[0].msg, "%s", mw_last_error());
        pthread_mutex_lock(&p->mu);
        p->failed = MW_ERR_NOMEM;
        pthread_mutex_unlock(&p->mu);
        release(p);
    }
    for (int i = 1; i <= started; i++) pthread_join(up[i].thread, NULL);
    int updated = 0, bad = -1;
    for (int i = 0; i < n; i++) {
        if (up[i].st == MW_OK)
            updated++;
        else if (bad < 0)
            bad = i;
    }
    char msg[MW__MSG_SIZE] = "";
    if (bad >= 0) snprintf(msg, sizeof msg, "stage %d (update): %s", mine[bad], up[bad].msg);
    int ok_procs = 0;
    mw_status st = mw__pipe_link_agree(p, bad >= 0 ? up[bad].st : MW_OK, msg, p->msg, sizeof p->msg,
                                       &ok_procs);
    if (st && (updated || ok_procs))
        snprintf(p->msg + strlen(p->msg), sizeof p->msg - strlen(p->msg),
                 "; other stages updated: the model is no longer consistent, load a checkpoint");
    return st;
}

/* The mean of the micro-batches' losses (p->loss_buf, every process's copy of the last stage's),
 * summed in micro-batch order in double. */
static float mean_loss(const mw_pipeline *p) {
    double sum = 0;
    for (int m = 0; m < p->M; m++) sum += p->loss_buf[m];
    return (float)(sum / p->M);
}

mw_status mw_pipeline_step(mw_pipeline *p, const mw_feed *feeds, int nfeeds, float *loss) {
    if (!p) return mw__error(MW_ERR_INVALID, "mw_pipeline_step: pipeline is NULL");
    if (mw_stop_requested())
        return mw__error(MW_ERR_INTERRUPTED,
                         "mw_pipeline_step: a stop was requested; the pipeline is unchanged");
    mw_status fst = mw__pipe_check_feeds(p, feeds, nfeeds, "mw_pipeline_step");
    if (fst) return fst;
    /* Phase 1: the schedule of this process's device positions; every micro-batch accumulated
     * on every stage. */
    mw__pipe_link_begin(p);
    for (int s = 0; s < p->S; s++) {
        stage *sg = &p->st[s];
        sg->busy_ms = sg->part_ms[0] = sg->part_ms[1] = sg->part_ms[2] = 0;
        memset(sg->slot_busy, 0, (size_t)sg->slots);
    }
    driver dr[MW_MAX_DEVICES];
    int mine[MW_MAX_DEVICES], n = 0, started = 0;
    for (int d = 0; d < p->P; d++) {
        dr[d] = (driver){.p = p, .d = d};
        if (mw__pipe_local(p, d)) mine[n++] = d; /* stage d is device position d's first */
    }
    for (int i = 1; i < n; i++) {
        if (pthread_create(&dr[mine[i]].thread, NULL, drive, &dr[mine[i]]) != 0) {
            mw__pipe_fail(p, mw__error(MW_ERR_NOMEM, "cannot start a thread"), mine[i], "start");
            break;
        }
        started = i;
    }
    if (n && !p->failed) drive(&dr[mine[0]]);
    for (int i = 1; i <= started; i++) pthread_join(dr[mine[i]].thread, NULL);
    int64_t t0 = 0, t1 = 0;
    for (int i = 0; i < n; i++) {
        const driver *x = &dr[mine[i]];
        if (!t0 || x->first_ns < t0) t0 = x->first_ns;
        if (x->last_ns > t1) t1 = x->last_ns;
    }
    mw_status st = mw__pipe_link_settle(p, p->failed);
    if (st == MW_OK) st = update_all(p);
    if (st == MW_OK && (st = mw__pipe_link_tied(p)) == MW_OK)
        st = mw__pipe_link_losses(p, p->loss_buf);
    if (st) {
        for (int s = 0; s < p->S; s++)
            if (p->st[s].tr) p->st[s].tr->accumulated = 0; /* the next step afresh */
        return mw__error(st, "mw_pipeline_step: %s", p->msg);
    }
    for (int s = 0; s < p->S; s++)
        p->st[s].busy_ms = p->st[s].part_ms[0] + p->st[s].part_ms[1] + p->st[s].part_ms[2];
    /* Idle fractions per device (of this process) over the step's schedule. */
    double wall = (double)(t1 - t0) * 1e-6;
    for (int d = 0; d < p->P; d++) {
        double busy = 0;
        for (int c = 0; c < p->V; c++) busy += p->st[c * p->P + d].busy_ms;
        p->idle[d] = !mw__pipe_local(p, d) ? -1.0 : wall > 0 ? 1.0 - busy / wall : 0.0;
    }
    p->stepped = 1;
    p->step_ms = wall;
    if (loss) *loss = mean_loss(p);
    return MW_OK;
}

mw_status mw__pipeline_eval(mw_pipeline *p, const mw_feed *feeds, int nfeeds, float *loss) {
    mw_status st = mw__pipe_check_feeds(p, feeds, nfeeds, "mw_trainer_eval");
    if (st) return st;
    mw__pipe_link_begin(p);
    for (int m = 0; st == MW_OK && m < p->M; m++)
        for (int s = 0; st == MW_OK && s < p->S; s++) {
            if (!mw__pipe_local(p, s)) continue;
            stage *sg = &p->st[s];
            float l = 0.0f;
            if ((st = mw__pipe_values_in(p, s, m))) break;
            mw__pipe_stage_feeds(p, sg, m, 0);
            st = mw_trainer_eval(sg->tr, sg->feeds, sg->nfeeds, &l);
            for (int j = 0; st == MW_OK && j < sg->nout; j++)
                st = mw__program_read_output(sg->tr->prog, "mw_trainer_eval", sg->out[j].node,
                                             sg->out[j].value[m], sg->out[j].count);
            if (st) {
                char what[64];
                snprintf(what, sizeof what, "evaluation, micro-batch %d", m);
                st = mw__pipe_fail(p, st, s, what);
                break;
            }
            if (sg->losses) sg->losses[m] = l;
            st = mw__pipe_values_out(p, s, m);
        }
    st = mw__pipe_link_settle(p, p->failed);
    if (st == MW_OK) st = mw__pipe_link_losses(p, p->loss_buf);
    if (st) return mw__error(st, "mw_trainer_eval: %s", st == p->failed ? p->msg : mw_last_error());
    if (loss) *loss = mean_loss(p);
    return MW_OK;
}
