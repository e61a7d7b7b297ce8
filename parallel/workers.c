/* The worker threads, one per local device, and the host's hand-off to them. The host hands
 * every worker the same command (a generation count and a futex event, no lock) and waits until
 * all are done; the first CPU device of a one-process mesh has no thread: the host runs it
 * meanwhile. Inside a step, workers meet only in the collectives. A failing worker aborts the
 * communicators so no peer is left waiting, and the host reports the root cause.
 *
 * CPU devices of one process may instead all run on the host's thread, as a gang (fiber.h): each
 * device's command is a task that gives the thread to the next where it would wait in a
 * collective. When other processes keep the cores busy, threads spend their steps waiting for a
 * peer the scheduler has not run yet; the gang never waits for a thread. Under
 * MW_CPU_THREADS_AUTO the host times both ways (mw__sched_after) and keeps the faster. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/plan.h"
#include "meshwit.h"
#include "parallel/fiber.h"
#include "parallel/optimizer.h"
#include "parallel/reducer.h"
#include "parallel/trainer_impl.h"
#include "parallel/wait.h"

static mw_status worker_init(worker *w) {
    const mw__device_vtable *vt = w->dev.vt;
    mw_status st = vt->init(&w->dev);
    if (st) return st;
    mw__plan *p = &w->plan;
    size_t pbytes = (size_t)p->param_elems * 4;
    mw_trainer *from = w->tr->params_from;
    if (from) w->params = from->w[w->index].params; /* shared, not copied */
    if ((st = vt->alloc(&w->dev, (size_t)p->arena_bytes, &w->arena)) ||
        (!from && (st = vt->alloc(&w->dev, pbytes, &w->params))) ||
        (!w->tr->forward_only && (st = vt->alloc(&w->dev, pbytes, &w->grads))))
        return st;
    size_t scratch = (size_t)w->tr->nworkers * sizeof(float);
    size_t pieces = (size_t)w->tr->g->nparams * (size_t)w->zparts * sizeof(float);
    if (w->tr->sharded_params && pieces > scratch) scratch = pieces;
    if ((st = vt->alloc(&w->dev, scratch > 64 ? scratch : 64, (void **)&w->scratch))) return st;
    if (!vt->host_memory && vt->host_alloc && vt->upload_async) {
        size_t staged = 0;
        for (int v = 0; v < p->nviews; v++)
            if (p->views[v].staging.off >= 0)
                staged += (size_t)(p->views[v].count * mw__dtype_bytes(p->views[v].dtype));
        if ((st = vt->host_alloc(&w->dev, staged, &w->pinned))) return st;
    }
    int moments = mw__optimizer_moments(&w->tr->cfg.optimizer);
    if (moments) {
        int64_t elems = moments * (w->own_hi - w->own_lo);
        if ((st = vt->alloc(&w->dev, (size_t)(elems ? elems : 1) * 4, &w->moments))) return st;
        mw__k_fill z = {.value = 0.0f, .count = elems, .out = w->moments};
        if (elems && (st = vt->fill(&w->dev, &z))) return st;
    }
    if (w->tr->cfg.grad_accumulation) {
        int64_t elems = w->own_hi - w->own_lo; /* this device's slice */
        if ((st = vt->alloc(&w->dev, (size_t)(elems ? elems : 1) * 4, &w->accum))) return st;
        mw__k_fill z = {.value = 0.0f, .count = elems, .out = w->accum};
        if (elems && (st = vt->fill(&w->dev, &z))) return st;
    }
    w->bases[MW__BASE_ARENA] = w->arena;
    w->bases[MW__BASE_PARAMS] = w->params;
    w->bases[MW__BASE_GRADS] = w->grads;
    if ((st = mw__executor_init(w))) return st;
    const float *init =
        w->tr->init_boxes ? w->tr->init_boxes[w->index - w->tr->first] : w->tr->init_values;
    if (!from && (st = vt->upload(&w->dev, w->params, init, pbytes))) return st;
    /* A parameter the loss does not depend on keeps a zero gradient. */
    mw__k_fill zero = {.value = 0.0f, .count = p->param_elems, .out = w->grads};
    if (w->grads && (st = vt->fill(&w->dev, &zero))) return st;
    return vt->sync(&w->dev);
}

static mw_status worker_run(worker *w, cmd c) {
    mw_status st;
    w->training = c != CMD_EVAL;
    switch (c) {
    case CMD_INIT: return worker_init(w);
    case CMD_EVAL:
        if ((st = mw__bind_views(w)) || (st = mw__run_range(w, 0, w->plan.fwd_end))) return st;
        return w->dev.vt->sync(&w->dev);
    case CMD_GRADS:
    case CMD_STEP:
    case CMD_ACCUM:
        w->skipped = 0;
        w->inflight = 0;
        if ((st = mw__bind_views(w)) || (st = mw__run_range(w, 0, w->plan.bwd_end))) return st;
        if (w->inflight) {
            w->phase = MW_PHASE_GRAD_REDUCE;
            if ((st = mw__reductions(w, 1))) return st;
        }
        if (c == CMD_ACCUM)
            return (st = mw__accumulate_grads(w, 0)) ? st : w->dev.vt->sync(&w->dev);
        if (c == CMD_STEP && w->tr->accumulated && (st = mw__accumulate_grads(w, 1))) return st;
        if (c == CMD_STEP && (w->tr->cfg.check_finite || w->tr->cfg.skip_nonfinite)) {
            /* The loss is replicated: every device sees the same value and stops alike. */
            float loss;
            if ((st = w->dev.vt->download(&w->dev, &loss, mw__ptr(w, w->plan.loss), sizeof loss)))
                return st;
            if (!isfinite(loss) && w->tr->cfg.skip_nonfinite) {
                w->skipped = 1;
                return w->dev.vt->sync(&w->dev);
            }
            if (!isfinite(loss))
                return mw__error(MW_ERR_NONFINITE, "the loss is %g; no parameter was updated",
                                 loss);
        }
        if (c == CMD_STEP) {
            int64_t t0 = mw__now_ns();
            st = mw__enter(w, MW_PHASE_UPDATE);
            /* A data error (bad id or target) a GPU kernel found is reported by the sync, before
             * any parameter changes, also with one device. */
            if (st == MW_OK) st = w->dev.vt->sync(&w->dev);
            /* Nobody updates unless everybody got this far: replicas stay identical when a device
             * fails before its update. */
            if (st == MW_OK && w->tr->all) st = w->tr->all_reducer->barrier(w->tr->all, w->index);
            if (st == MW_OK) st = mw__update(w);
            if (st == MW_OK) st = w->dev.vt->sync(&w->dev);
            w->update_ms = (double)(mw__now_ns() - t0) * 1e-6;
            if (w->prof_cat) {
                w->prof_ms[MW__PROF_UPDATE] += w->update_ms;
                w->prof_calls[MW__PROF_UPDATE]++;
            }
            return st;
        }
        return w->dev.vt->sync(&w->dev);
    case CMD_NONE:
    case CMD_QUIT: break;
    }
    return MW_OK;
}

static void abort_all(mw_trainer *tr) {
    if (tr->all) tr->all_reducer->abort(tr->all);
    for (int gi = 0; gi < tr->ngroups; gi++)
        for (int c = 0; c < tr->groups[gi].ncomms; c++)
            if (tr->groups[gi].comms[c]) tr->reducer->abort(tr->groups[gi].comms[c]);
}

/* Steps usually follow each other within microseconds, and waking a sleeping thread costs tens
 * of them; so a waiter first spins for a few tens of microseconds (parallel/wait.h: less when
 * threads outnumber cores), then sleeps on the event ev. It spins with a pause, never
 * sched_yield: on a busy machine a yielding thread stays runnable and keeps competing for the
 * core that the thread it waits for needs. Waits until *v64 differs from old, or (v64 NULL) *zero
 * is 0. The waker changes that state, then notifies ev (a system call only while a waiter sleeps;
 * no lock is taken on either side). */
static int arrived(_Atomic uint64_t *v64, uint64_t old, _Atomic int *zero) {
    return v64 ? atomic_load_explicit(v64, memory_order_acquire) != old
               : atomic_load_explicit(zero, memory_order_acquire) == 0;
}

static void wait_until(const mw_trainer *tr, mw__event *ev, _Atomic uint64_t *v64, uint64_t old,
                       _Atomic int *zero) {
    int64_t start = 0;
    for (unsigned spins = 0;; spins++) {
        if (arrived(v64, old, zero)) return;
        if (spins % 64 != 63) {
            mw__cpu_relax();
            continue;
        }
        int64_t now = mw__now_ns();
        if (!start) start = now;
        if (now - start > tr->spin_ns) break;
    }
    for (;;) {
        uint32_t seen = mw__event_prepare(ev);
        if (arrived(v64, old, zero)) {
            mw__event_cancel(ev);
            return;
        }
        mw__event_sleep(ev, seen, 0);
    }
}

/* Runs command c on worker w, on the calling thread. */
static void run_one(worker *w, cmd c) {
    mw_trainer *tr = w->tr;
    w->reduce_ms = w->update_ms = 0.0;
    mw_status st = c == CMD_QUIT ? MW_OK : worker_run(w, c);
    w->status = st;
    if (st) {
        snprintf(w->msg, sizeof w->msg, "%s", mw_last_error());
        abort_all(tr); /* release every peer waiting in a collective */
    }
    if (c == CMD_QUIT) {
        w->dev.vt->free(&w->dev, w->arena);
        if (!tr->params_from) w->dev.vt->free(&w->dev, w->params);
        w->dev.vt->free(&w->dev, w->grads);
        w->dev.vt->free(&w->dev, w->moments);
        w->dev.vt->free(&w->dev, w->accum);
        w->dev.vt->free(&w->dev, w->scratch);
        if (w->pinned) w->dev.vt->host_free(&w->dev, w->pinned);
        w->dev.vt->shutdown(&w->dev);
    }
}

void *mw__worker_main(void *arg) {
    worker *w = arg;
    mw_trainer *tr = w->tr;
    uint64_t seen = 0;
    for (;;) {
        wait_until(tr, &tr->started, &tr->generation, seen, NULL);
        seen = atomic_load(&tr->generation);
        cmd c = (cmd)atomic_load(&tr->command);
        run_one(w, c);
        if (atomic_fetch_sub(&tr->remaining, 1) == 1) mw__event_notify(&tr->finished);
        if (c == CMD_QUIT) return NULL;
    }
}

static void post(mw_trainer *tr, cmd c, int workers) {
    atomic_store(&tr->command, (int)c);
    atomic_store(&tr->remaining, workers);
    atomic_fetch_add(&tr->generation, 1);
    mw__event_notify(&tr->started);
}

static void wait_done(mw_trainer *tr) {
    /* A short spin: on 2 idle cores with 2 workers it cuts the cost of a step's hand-off from
     * about 25 us (sleep and wake) to a few. */
    wait_until(tr, &tr->finished, NULL, 0, &tr->remaining);
}

static void gang_task(void *arg) {
    worker *w = arg;
    run_one(w, (cmd)atomic_load_explicit(&w->tr->command, memory_order_relaxed));
}

/* Runs command c on every started local worker and waits: the threads get it through the
 * generation; a worker that runs on the host (on_host) runs it here meanwhile. With one_thread,
 * the host runs every worker itself, as a gang (start-up and shutdown stay on each worker's
 * thread). */
static void run_all(mw_trainer *tr, cmd c) {
    if (tr->one_thread && c != CMD_INIT && c != CMD_QUIT) {
        atomic_store_explicit(&tr->command, (int)c, memory_order_relaxed);
        mw__gang_run(tr->gang, gang_task, (void *const *)tr->sched.args);
        return;
    }
    int threads = 0;
    worker *mine = NULL;
    for (int i = tr->first; i < tr->first + tr->nlocal; i++) {
        if (tr->w[i].on_host)
            mine = &tr->w[i];
        else
            threads += tr->w[i].started;
    }
    if (threads) post(tr, c, threads);
    if (mine) run_one(mine, c);
    if (threads) wait_done(tr);
}

void mw__stop_workers(mw_trainer *tr) {
    run_all(tr, CMD_QUIT);
    for (int i = tr->first; i < tr->first + tr->nlocal; i++)
        if (tr->w[i].started && !tr->w[i].on_host) pthread_join(tr->w[i].thread, NULL);
}

/* ---- one thread per device, or all on the calling thread (cfg.cpu_threads) ---- */

#define TRIAL_STEPS 3    /* steps a trial of the other way runs */
#define FIRST_INTERVAL 8 /* steps between trials, doubled after each trial that changes nothing */
#define MAX_INTERVAL 256
#define WARM_UP 2         /* first steps not timed: they touch new memory */
#define STARVED_SHARE 0.6 /* the host's share of a core below which one thread may do better */
#define BETTER 0.9        /* a trial wins when its median step takes less than this much */

mw_status mw__sched_init(mw_trainer *tr) {
    int mode = tr->cfg.cpu_threads; /* checked by mw_trainer_new */
    const mw_mesh *m = tr->mesh;
    if (mode == MW_CPU_THREADS_PER_DEVICE || tr->nlocal < 2 || m->nprocs != 1 ||
        !m->vt->host_memory || tr->reducer != &mw__reducer_shm ||
        (tr->all && tr->all_reducer != &mw__reducer_shm) || tr->w[tr->first].dev.pin)
        return MW_OK;
    tr->sched.args = mw__malloc((size_t)tr->nlocal * sizeof *tr->sched.args);
    if (!tr->sched.args) return mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
    for (int i = 0; i < tr->nlocal; i++) tr->sched.args[i] = &tr->w[tr->first + i];
    mw_status st = mw__gang_new(tr->nlocal, &tr->gang);
    if (st) return st;
    tr->one_thread = mode == MW_CPU_THREADS_ONE;
    return MW_OK;
}

void mw__sched_free(mw_trainer *tr) {
    mw__gang_free(tr->gang);
    tr->gang = NULL;
    mw__free(tr->sched.args);
    tr->sched.args = NULL;
}

static int64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static double median(const double *v, int n) {
    if (n < 3) return n == 2 ? 0.5 * (v[0] + v[1]) : v[0];
    double a = v[0], b = v[1], c = v[2];
    return a < b ? (b < c ? b : a < c ? c : a) : (a < c ? a : b < c ? c : b);
}

/* MW_CPU_THREADS_AUTO: after a timed command of `ms` milliseconds in which the calling thread ran
 * `share` of the time (measured with threads), decides how the next one runs. With threads, a
 * host that keeps getting less than STARVED_SHARE of a core starts a trial of one thread; with
 * one thread, trials of threads come by themselves. A trial of TRIAL_STEPS steps is kept when its
 * median beats the median of the last steps before it by BETTER; each trial that is not kept
 * doubles the wait before the next. */
void mw__sched_after(mw_trainer *tr, double ms, double share) {
    __typeof__(tr->sched) *s = &tr->sched;
    int m = tr->one_thread;
    if (!s->interval) { /* the first call */
        s->interval = FIRST_INTERVAL;
        s->share = 1.0;
    }
    if (++s->measured <= WARM_UP) return;
    s->ms[m][s->nms[m]++ % 3] = ms;
    if (!m) s->share = 0.75 * s->share + 0.25 * share;
    if (s->trial_left > 0) {
        if (--s->trial_left > 0) return;
        int before = !m, nb = s->nms[before] < 3 ? s->nms[before] : 3;
        if (median(s->ms[m], 3) < BETTER * median(s->ms[before], nb)) {
            s->interval = FIRST_INTERVAL;
        } else {
            tr->one_thread = before;
            s->interval = s->interval * 2 < MAX_INTERVAL ? s->interval * 2 : MAX_INTERVAL;
        }
        s->next_trial = s->measured + s->interval;
        return;
    }
    if (s->measured < s->next_trial || s->nms[m] < 3 || (!m && s->share >= STARVED_SHARE)) return;
    tr->one_thread = !m;
    s->nms[!m] = 0;
    s->trial_left = TRIAL_STEPS;
}

/* Runs one command on every worker and waits; on failure reports the root cause: the first device
 * whose error is not just "aborted because a peer failed". */
mw_status mw__dispatch(mw_trainer *tr, cmd c) {
    int timed = tr->gang && tr->cfg.cpu_threads == MW_CPU_THREADS_AUTO &&
                (c == CMD_STEP || c == CMD_GRADS || c == CMD_ACCUM);
    int one = tr->one_thread && c != CMD_INIT && c != CMD_QUIT;
    int64_t cpu0 = timed && !one ? thread_cpu_ns() : 0;
    int64_t t0 = mw__now_ns();
    run_all(tr, c);
    int64_t wall = mw__now_ns() - t0;
    tr->stats = (mw_step_stats){.step_ms = (double)wall * 1e-6,
                                .reduce_ms = tr->w[tr->first].reduce_ms,
                                .update_ms = tr->w[tr->first].update_ms,
                                .threads = one ? 1 : tr->nlocal};
    worker *cause = NULL;
    for (int i = tr->first; i < tr->first + tr->nlocal; i++) {
        worker *w = &tr->w[i];
        if (w->status &&
            (!cause || (cause->status == MW_ERR_ABORTED && w->status != MW_ERR_ABORTED)))
            cause = w;
    }
    if (timed && !cause)
        mw__sched_after(tr, tr->stats.step_ms,
                        one ? 1.0
                            : (double)(thread_cpu_ns() - cpu0) / (double)(wall > 0 ? wall : 1));
    if (!cause) return MW_OK;
    /* A non-finite loss or gradient is seen alike everywhere, after every collective: every
     * process stops at the same point and the trainer stays usable. */
    if (tr->mesh->nprocs > 1 && cause->status != MW_ERR_NONFINITE) tr->broken = 1;
    if (tr->all) tr->all_reducer->reset(tr->all);
    for (int gi = 0; gi < tr->ngroups; gi++)
        for (int k = 0; k < tr->groups[gi].ncomms; k++)
            if (tr->groups[gi].comms[k]) tr->reducer->reset(tr->groups[gi].comms[k]);
    mw_status st = cause->status;
    for (int i = tr->first; i < tr->first + tr->nlocal; i++) tr->w[i].status = MW_OK;
    if (c == CMD_INIT) return mw__error(st, "device %s: %s", cause->dev.name, cause->msg);
    return mw__error(st, "device %s, %s of step %lld: %s", cause->dev.name,
                     mw_phase_name(cause->phase), (long long)tr->steps, cause->msg);
}
