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
    mw__pipe_stage_feeds(p, sg, m, 0);
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
    mw__pipe_stage_feeds(p, sg, m, 1);
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
    mw__pipe_stage_feeds(p, sg, m, 1);
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
float mw__pipe_global_norm(void *ctx, int device, float norm) {
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

mw_status mw_pipeline_step(mw_pipeline *p, const mw_feed *feeds, int nfeeds, float *loss) {
    if (!p) return mw__error(MW_ERR_INVALID, "mw_pipeline_step: pipeline is NULL");
    if (mw_stop_requested())
        return mw__error(MW_ERR_INTERRUPTED,
                         "mw_pipeline_step: a stop was requested; the pipeline is unchanged");
    mw_status fst = mw__pipe_check_feeds(p, feeds, nfeeds, "mw_pipeline_step");
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

mw_status mw__pipeline_eval(mw_pipeline *p, const mw_feed *feeds, int nfeeds, float *loss) {
    mw_status st = mw__pipe_check_feeds(p, feeds, nfeeds, "mw_trainer_eval");
    double sum = 0;
    for (int m = 0; st == MW_OK && m < p->M; m++)
        for (int s = 0; st == MW_OK && s < p->S; s++) {
            stage *sg = &p->st[s];
            float l = 0.0f;
            mw__pipe_stage_feeds(p, sg, m, 0);
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
