/* The worker threads, one per local device, and the host's hand-off to them. The host hands
 * every worker the same command (a generation count and a futex event, no lock) and waits until
 * all are done; the first CPU device of a one-process mesh has no thread: the host runs it
 * meanwhile. Inside a step, workers meet only in the collectives. A failing worker aborts the
 * communicators so no peer is left waiting, and the host reports the root cause.
 *
 * CPU devices of one process may instead run on fewer threads, in gangs (fiber.h): each device's
 * command is a task that gives its thread to another where it would wait in a collective. When
 * other processes keep the cores busy, or devices outnumber cores, threads spend their steps
 * waiting for a peer the scheduler has not run yet; a gang never waits for a device of its own.
 * Under MW_CPU_THREADS_AUTO the host times the ways it may run (mw__sched_after) and keeps the
 * fastest. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "collectives/fiber.h"
#include "collectives/reducer.h"
#include "collectives/wait.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/plan.h"
#include "meshwit.h"
#include "parallel/optimizer.h"
#include "parallel/trainer_impl.h"

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
        (!w->tr->forward_only && (st = vt->alloc(&w->dev, pbytes, &w->grads))) ||
        (p->params16 && (st = vt->alloc(&w->dev, mw__params16_elems(w) * 2, &w->params16))))
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
    w->bases[MW__BASE_PARAMS16] = w->params16;
    if (p->state_elems) { /* an inference program's states: zero until first written */
        if ((st = vt->alloc(&w->dev, (size_t)p->state_elems * 4, &w->state))) return st;
        mw__k_fill z = {.value = 0.0f, .count = p->state_elems, .out = w->state};
        if ((st = vt->fill(&w->dev, &z))) return st;
    }
    w->bases[MW__BASE_STATE] = w->state;
    if ((st = mw__executor_init(w))) return st;
    const float *init =
        w->tr->init_boxes ? w->tr->init_boxes[w->index - w->tr->first] : w->tr->init_values;
    if (!from && (st = vt->upload(&w->dev, w->params, init, pbytes))) return st;
    w->version = 1; /* the bf16 copy (version16 0) is made before the first forward pass */
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
        if ((st = mw__params16_sync(w)) || (st = mw__bind_views(w)) ||
            (st = mw__run_range(w, 0, w->plan.fwd_end)))
            return st;
        return w->dev.vt->sync(&w->dev);
    case CMD_GRADS:
    case CMD_STEP:
    case CMD_ACCUM:
        w->skipped = 0;
        w->inflight = 0;
        if ((st = mw__params16_sync(w)) || (st = mw__bind_views(w)) ||
            (st = mw__run_range(w, 0, w->plan.bwd_end)))
            return st;
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
        w->dev.vt->free(&w->dev, w->params16);
        w->dev.vt->free(&w->dev, w->state);
        w->dev.vt->free(&w->dev, w->moments);
        w->dev.vt->free(&w->dev, w->accum);
        w->dev.vt->free(&w->dev, w->scratch);
        if (w->pinned) w->dev.vt->host_free(&w->dev, w->pinned);
        w->dev.vt->shutdown(&w->dev);
    }
}

/* Local devices [block(k), block(k + 1)) of the first local device form gang k when `threads`
 * threads run them: contiguous blocks, so that the devices of a model-parallel group (adjacent
 * on the mesh's last axis) meet on one thread. */
static int block(int k, int devices, int threads) { return (int)((int64_t)k * devices / threads); }

static void gang_task(void *arg) {
    worker *w = arg;
    run_one(w, (cmd)atomic_load_explicit(&w->tr->command, memory_order_relaxed));
}

/* Runs command c (tr->command) on gang k of tr->run_threads threads, on the calling thread. */
static void run_gang(mw_trainer *tr, int k) {
    int t = tr->run_threads, lo = block(k, tr->nlocal, t), hi = block(k + 1, tr->nlocal, t);
    mw__gang_run(tr->gangs[k], hi - lo, gang_task, (void *const *)tr->sched.args + lo);
}

void *mw__worker_main(void *arg) {
    worker *w = arg;
    mw_trainer *tr = w->tr;
    uint64_t seen = 0;
    for (;;) {
        wait_until(tr, &w->go_ev, &w->go, seen, NULL);
        seen = atomic_load(&w->go);
        cmd c = (cmd)atomic_load(&tr->command);
        int t = tr->run_threads, local = w->index - tr->first;
        if (t >= tr->nlocal)
            run_one(w, c);
        else /* this thread leads the gang its device starts */
            for (int k = 1; k < t; k++)
                if (block(k, tr->nlocal, t) == local) run_gang(tr, k);
        if (atomic_fetch_sub(&tr->remaining, 1) == 1) mw__event_notify(&tr->finished);
        if (c == CMD_QUIT) return NULL;
    }
}

/* Hands command c to worker w's thread. */
static void post(worker *w) {
    atomic_fetch_add(&w->go, 1);
    mw__event_notify(&w->go_ev);
}

static void wait_done(mw_trainer *tr) {
    /* A short spin: on 2 idle cores with 2 workers it cuts the cost of a step's hand-off from
     * about 25 us (sleep and wake) to a few. */
    wait_until(tr, &tr->finished, NULL, 0, &tr->remaining);
}

/* Runs command c on every started local worker and waits. With a thread per device, each
 * worker's thread gets it (a worker that runs on the host, on_host, runs it here meanwhile). With
 * fewer threads (tr->threads_now; start-up and shutdown always use every thread), gang k of
 * devices runs on the thread of its first device, gang 0 on the host's. */
static void run_all(mw_trainer *tr, cmd c) {
    int t = c == CMD_INIT || c == CMD_QUIT ? tr->nlocal : tr->threads_now;
    atomic_store(&tr->command, (int)c);
    tr->run_threads = t;
    worker *mine = NULL;
    int threads = 0;
    if (t >= tr->nlocal) {
        for (int i = tr->first; i < tr->first + tr->nlocal; i++)
            if (tr->w[i].on_host)
                mine = &tr->w[i];
            else
                threads += tr->w[i].started;
        atomic_store(&tr->remaining, threads);
        for (int i = tr->first; i < tr->first + tr->nlocal; i++)
            if (!tr->w[i].on_host && tr->w[i].started) post(&tr->w[i]);
        if (mine) run_one(mine, c);
    } else {
        atomic_store(&tr->remaining, t - 1);
        for (int k = 1; k < t; k++) post(&tr->w[tr->first + block(k, tr->nlocal, t)]);
        threads = t - 1;
        run_gang(tr, 0);
    }
    if (threads) wait_done(tr);
}

void mw__stop_workers(mw_trainer *tr) {
    run_all(tr, CMD_QUIT);
    for (int i = tr->first; i < tr->first + tr->nlocal; i++)
        if (tr->w[i].started && !tr->w[i].on_host) pthread_join(tr->w[i].thread, NULL);
}

/* ---- how many threads run the devices (cfg.cpu_threads) ---- */

#define TRIAL_STEPS 3    /* steps a trial of another way runs */
#define FIRST_INTERVAL 8 /* steps between trials, doubled after each round that changes nothing */
#define MAX_INTERVAL 256
#define WARM_UP 2         /* first steps not timed: they touch new memory */
#define STARVED_SHARE 0.6 /* the host's share of a core below which fewer threads may do better */
#define BETTER 0.9        /* a trial wins when its median step takes less than this much */
#define HOPELESS 1.5      /* a trial ends after one step this much slower than the kept way */
#define SHARE_WINDOW_NS 2000000 /* the host's share of a core is read over at least 2 ms */

void mw__sched_candidates(mw_trainer *tr, int devices, int cores, int setting) {
    mw__sched *s = &tr->sched;
    s->ncand = 0;
    s->cur = 0;
    s->trial = -1;
    if (setting != MW_CPU_THREADS_AUTO) {
        s->cand[s->ncand++] = setting < 0 || setting > devices ? devices : setting;
    } else {
        s->cand[s->ncand++] = devices;
        if (cores > 1 && cores < devices) s->cand[s->ncand++] = cores;
        if (devices > 1) s->cand[s->ncand++] = 1;
    }
    tr->threads_now = s->cand[0];
}

mw_status mw__sched_init(mw_trainer *tr) {
    int d = tr->nlocal;
    /* on_host: the first device is a host-memory device of an unpinned one-process mesh. */
    int can = d > 1 && tr->w[tr->first].on_host && tr->reducer == &mw__reducer_shm &&
              (!tr->all || tr->all_reducer == &mw__reducer_shm);
    mw__sched_candidates(tr, d, mw__cores(), can ? tr->cfg.cpu_threads : MW_CPU_THREADS_PER_DEVICE);
    /* Gangs for every thread count that may run: gang k holds the largest block k gets. */
    int most = 0;
    for (int i = 0; i < tr->sched.ncand; i++)
        if (tr->sched.cand[i] < d && tr->sched.cand[i] > most) most = tr->sched.cand[i];
    if (!most) return MW_OK;
    tr->sched.args = mw__malloc((size_t)d * sizeof *tr->sched.args);
    tr->gangs = mw__calloc((size_t)most, sizeof *tr->gangs);
    if (!tr->sched.args || !tr->gangs)
        return mw__error(MW_ERR_NOMEM, "out of memory making the trainer");
    tr->ngangs = most;
    for (int i = 0; i < d; i++) tr->sched.args[i] = &tr->w[tr->first + i];
    for (int k = 0; k < most; k++) {
        int cap = 0;
        for (int i = 0; i < tr->sched.ncand; i++) {
            int t = tr->sched.cand[i];
            if (t < d && k < t && block(k + 1, d, t) - block(k, d, t) > cap)
                cap = block(k + 1, d, t) - block(k, d, t);
        }
        /* Gangs run on at most `most` threads: they spin as long as that many threads may. */
        mw_status st = mw__gang_new(cap, &tr->wake, mw__spin_ns(most), &tr->gangs[k]);
        if (st) return st;
    }
    return MW_OK;
}

void mw__sched_free(mw_trainer *tr) {
    for (int k = 0; k < tr->ngangs; k++) mw__gang_free(tr->gangs[k]);
    mw__free(tr->gangs);
    tr->gangs = NULL;
    tr->ngangs = 0;
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

/* The candidate after i that is not the kept one, or -1. */
static int next_trial(const mw__sched *s, int i) {
    for (int j = i + 1; j < s->ncand; j++)
        if (j != s->cur) return j;
    return -1;
}

/* MW_CPU_THREADS_AUTO. The candidates are a thread per device, one per core (when devices
 * outnumber cores) and one. With a thread per device, a host that keeps getting less than
 * STARVED_SHARE of a core starts a round of trials; with fewer threads, rounds come by
 * themselves. A round runs each other candidate for TRIAL_STEPS steps (one, when that step is
 * HOPELESS) and keeps the fastest if its median step beats the median of the kept one's last
 * steps by BETTER; each round that changes nothing doubles the wait before the next. */
void mw__sched_after(mw_trainer *tr, double ms, double share) {
    mw__sched *s = &tr->sched;
    if (s->ncand < 2) return;
    if (!s->interval) { /* the first call */
        s->interval = FIRST_INTERVAL;
        s->share = 1.0;
    }
    int m = s->trial >= 0 ? s->trial : s->cur;
    if (++s->measured <= WARM_UP) return;
    s->ms[m][s->nms[m]++ % 3] = ms;
    if (m == 0 && share >= 0.0) s->share = 0.75 * s->share + 0.25 * share;
    if (s->trial >= 0) {
        int nk = s->nms[s->cur] < 3 ? s->nms[s->cur] : 3;
        if (ms > HOPELESS * median(s->ms[s->cur], nk)) { /* no need to see more */
            s->ms[m][0] = s->ms[m][1] = s->ms[m][2] = ms;
            s->trial_left = 1;
        }
        if (--s->trial_left > 0) return;
        int next = next_trial(s, s->trial);
        if (next >= 0) {
            s->trial = next;
            s->nms[next] = 0;
            s->trial_left = TRIAL_STEPS;
            tr->threads_now = s->cand[next];
            return;
        }
        double kept = median(s->ms[s->cur], s->nms[s->cur] < 3 ? s->nms[s->cur] : 3);
        int best = s->cur;
        double best_ms = kept;
        for (int i = 0; i < s->ncand; i++) {
            double t = i == s->cur ? kept : median(s->ms[i], 3);
            if (i != s->cur && t < BETTER * kept && t < best_ms) best = i, best_ms = t;
        }
        if (best != s->cur) {
            s->cur = best;
            s->interval = FIRST_INTERVAL;
        } else {
            s->interval = s->interval * 2 < MAX_INTERVAL ? s->interval * 2 : MAX_INTERVAL;
        }
        s->trial = -1;
        s->next_trial = s->measured + s->interval;
        tr->threads_now = s->cand[s->cur];
        return;
    }
    if (s->measured < s->next_trial || s->nms[m] < 3 || (m == 0 && s->share >= STARVED_SHARE))
        return;
    s->trial = next_trial(s, -1);
    s->nms[s->trial] = 0;
    s->trial_left = TRIAL_STEPS;
    tr->threads_now = s->cand[s->trial];
}

/* Runs one command on every worker and waits; on failure reports the root cause: the first device
 * whose error is not just "aborted because a peer failed". */
mw_status mw__dispatch(mw_trainer *tr, cmd c) {
    /* A trainer times its training commands (evals between them take other times); a
     * forward-only program its evals. */
    int timed =
        tr->sched.ncand > 1 &&
        (tr->forward_only ? c == CMD_EVAL : c == CMD_STEP || c == CMD_GRADS || c == CMD_ACCUM);
    int64_t t0 = mw__now_ns();
    mw__sched *sc = &tr->sched;
    if (timed && (!sc->mark_wall || sc->mark_threads != tr->threads_now)) {
        /* The calling thread's CPU time costs a system call: it is read once per window of
         * SHARE_WINDOW_NS of commands run alike, not every command. */
        sc->mark_wall = t0;
        sc->mark_cpu = thread_cpu_ns();
        sc->mark_threads = tr->threads_now;
    }
    run_all(tr, c);
    int64_t wall = mw__now_ns() - t0;
    tr->stats = (mw_step_stats){.step_ms = (double)wall * 1e-6,
                                .reduce_ms = tr->w[tr->first].reduce_ms,
                                .update_ms = tr->w[tr->first].update_ms,
                                .threads = tr->run_threads};
    worker *cause = NULL;
    for (int i = tr->first; i < tr->first + tr->nlocal; i++) {
        worker *w = &tr->w[i];
        if (w->status &&
            (!cause || (cause->status == MW_ERR_ABORTED && w->status != MW_ERR_ABORTED)))
            cause = w;
    }
    if (timed && !cause) {
        double share = -1.0; /* no reading this time */
        int64_t end = t0 + wall;
        if (end - sc->mark_wall >= SHARE_WINDOW_NS) {
            int64_t cpu = thread_cpu_ns();
            share = (double)(cpu - sc->mark_cpu) / (double)(end - sc->mark_wall);
            sc->mark_wall = end;
            sc->mark_cpu = cpu;
        }
        mw__sched_after(tr, tr->stats.step_ms, share);
    }
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
