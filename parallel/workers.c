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
 * Under MW_CPU_THREADS_AUTO the host times the ways it may run (sched.c) and keeps the fastest. */
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
#include "parallel/program.h"

static mw_status worker_init(worker *w) {
    const mw__device_vtable *vt = w->dev.vt;
    mw_status st = vt->init(&w->dev);
    if (st) return st;
    mw__program *prog = w->prog;
    mw__plan *p = &w->plan;
    size_t pbytes = (size_t)p->param_elems * 4;
    mw__program *from = prog->params_from;
    if (from) w->params = from->w[w->index].params; /* shared, not copied */
    if ((st = vt->alloc(&w->dev, (size_t)p->arena_bytes, &w->arena)) ||
        (!from && (st = vt->alloc(&w->dev, pbytes, &w->params))) ||
        (prog->grads && (st = vt->alloc(&w->dev, pbytes, &w->grads))) ||
        (p->params16 && (st = vt->alloc(&w->dev, mw__params16_elems(w) * 2, &w->params16))))
        return st;
    if (!vt->host_memory && vt->host_alloc && vt->upload_async) {
        size_t staged = 0;
        for (int v = 0; v < p->nviews; v++)
            if (p->views[v].staging.off >= 0)
                staged += (size_t)(p->views[v].count * mw__dtype_bytes(p->views[v].dtype));
        if ((st = vt->host_alloc(&w->dev, staged, &w->pinned))) return st;
    }
    if (prog->slots > 1) {
        if (!(w->slot_arena = mw__calloc((size_t)prog->slots, sizeof *w->slot_arena)))
            return mw__error(MW_ERR_NOMEM, "out of memory making device %s's arenas", w->dev.name);
        w->slot_arena[0] = w->arena;
        for (int k = 1; k < prog->slots; k++)
            if ((st = vt->alloc(&w->dev, (size_t)p->arena_bytes, &w->slot_arena[k]))) return st;
    }
    w->bases[MW__BASE_ARENA] = w->arena;
    w->bases[MW__BASE_PARAMS] = w->params;
    w->bases[MW__BASE_GRADS] = w->grads;
    w->bases[MW__BASE_PARAMS16] = w->params16;
    if (p->state_elems) { /* the program's states: zero until first written */
        if ((st = vt->alloc(&w->dev, (size_t)p->state_elems * 4, &w->state))) return st;
        mw__k_fill z = {.value = 0.0f, .count = p->state_elems, .out = w->state};
        if ((st = vt->fill(&w->dev, &z))) return st;
    }
    w->bases[MW__BASE_STATE] = w->state;
    if ((st = mw__executor_init(w))) return st;
    const float *init =
        prog->init_boxes ? prog->init_boxes[w->index - prog->first] : prog->init_values;
    if (!from && (st = vt->upload(&w->dev, w->params, init, pbytes))) return st;
    w->version = 1; /* the bf16 copy (version16 0) is made before the first forward pass */
    /* A parameter the loss does not depend on keeps a zero gradient. */
    mw__k_fill zero = {.value = 0.0f, .count = p->param_elems, .out = w->grads};
    if (w->grads && (st = vt->fill(&w->dev, &zero))) return st;
    if (prog->hooks.init && (st = prog->hooks.init(prog->hooks.ctx, w))) return st;
    return vt->sync(&w->dev);
}

/* Runs instructions [from, to) of w's plan on this command's feeds; a backward part (with) is
 * followed by the collectives still in flight and, unless it is the input part alone (backward
 * 2), the after_backward hook. */
static mw_status run_part(worker *w, int from, int to, int backward) {
    mw__program *prog = w->prog;
    mw_status st;
    if (backward) w->inflight = 0;
    if ((st = mw__params16_sync(w)) || (st = mw__bind_views(w)) ||
        (st = mw__run_range(w, from, to)))
        return st;
    if (!backward) return w->dev.vt->sync(&w->dev);
    if (w->inflight) {
        w->phase = MW_PHASE_GRAD_REDUCE;
        if ((st = mw__reductions(w, 1))) return st;
    }
    if (backward == 1 && prog->hooks.after_backward)
        return prog->hooks.after_backward(prog->hooks.ctx, w);
    return w->dev.vt->sync(&w->dev);
}

static mw_status worker_run(worker *w, cmd c) {
    mw__program *prog = w->prog;
    w->training = c != CMD_FORWARD;
    if (c == CMD_FORWARD_KEEP || c == CMD_BACKWARD_REST || c == CMD_BACKWARD_INPUT ||
        c == CMD_BACKWARD_WEIGHT)
        mw__executor_select_slot(w);
    switch (c) {
    case CMD_INIT: return worker_init(w);
    case CMD_FORWARD:
    case CMD_FORWARD_KEEP: return run_part(w, 0, w->plan.fwd_end, 0);
    case CMD_BACKWARD: return run_part(w, 0, w->plan.bwd_end, 1);
    case CMD_BACKWARD_REST: return run_part(w, w->plan.fwd_end, w->plan.bwd_end, 1);
    case CMD_BACKWARD_INPUT: return run_part(w, w->plan.fwd_end, w->plan.bwd_split, 2);
    case CMD_BACKWARD_WEIGHT: return run_part(w, w->plan.bwd_split, w->plan.bwd_end, 1);
    case CMD_UPDATE:
        return prog->hooks.after_backward ? prog->hooks.after_backward(prog->hooks.ctx, w) : MW_OK;
    case CMD_NONE:
    case CMD_QUIT: break;
    }
    return MW_OK;
}

static void abort_all(mw__program *p) {
    if (p->all) p->all_reducer->abort(p->all);
    for (int gi = 0; gi < p->ngroups; gi++)
        for (int c = 0; c < p->groups[gi].ncomms; c++)
            if (p->groups[gi].comms[c]) p->reducer->abort(p->groups[gi].comms[c]);
}

/* Steps usually follow each other within microseconds, and waking a sleeping thread costs tens
 * of them; so a waiter first spins for a few tens of microseconds (collectives/wait.h: less when
 * threads outnumber cores), then sleeps on the event ev. It spins with a pause, never
 * sched_yield: on a busy machine a yielding thread stays runnable and keeps competing for the
 * core that the thread it waits for needs. Waits until *v64 differs from old, or (v64 NULL) *zero
 * is 0. The waker changes that state, then notifies ev (a system call only while a waiter sleeps;
 * no lock is taken on either side). */
static int arrived(_Atomic uint64_t *v64, uint64_t old, _Atomic int *zero) {
    return v64 ? atomic_load_explicit(v64, memory_order_acquire) != old
               : atomic_load_explicit(zero, memory_order_acquire) == 0;
}

static void wait_until(const mw__program *prog, mw__event *ev, _Atomic uint64_t *v64, uint64_t old,
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
        if (now - start > prog->spin_ns) break;
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
    mw__program *p = w->prog;
    w->reduce_ms = 0.0;
    mw_status st = c == CMD_QUIT ? MW_OK : worker_run(w, c);
    w->status = st;
    if (st) {
        snprintf(w->msg, sizeof w->msg, "%s", mw_last_error());
        abort_all(p); /* release every peer waiting in a collective */
    }
    if (c == CMD_QUIT) {
        if (w->slot_arena) {
            for (int k = 0; k < p->slots; k++) w->dev.vt->free(&w->dev, w->slot_arena[k]);
            mw__free(w->slot_arena);
            w->slot_arena = NULL;
        } else {
            w->dev.vt->free(&w->dev, w->arena);
        }
        if (!p->params_from) w->dev.vt->free(&w->dev, w->params);
        w->dev.vt->free(&w->dev, w->grads);
        w->dev.vt->free(&w->dev, w->params16);
        w->dev.vt->free(&w->dev, w->state);
        if (w->pinned) w->dev.vt->host_free(&w->dev, w->pinned);
        if (p->hooks.quit) p->hooks.quit(p->hooks.ctx, w);
        w->dev.vt->shutdown(&w->dev);
    }
}

/* Local devices [block(k), block(k + 1)) of the first local device form gang k when `threads`
 * threads run them: contiguous blocks, so that the devices of a model-parallel group (adjacent
 * on the mesh's last axis) meet on one thread. */
static int block(int k, int devices, int threads) { return (int)((int64_t)k * devices / threads); }

static void gang_task(void *arg) {
    worker *w = arg;
    run_one(w, (cmd)atomic_load_explicit(&w->prog->command, memory_order_relaxed));
}

/* Runs command c (prog->command) on gang k of prog->run_threads threads, on the calling thread. */
static void run_gang(mw__program *prog, int k) {
    int t = prog->run_threads, lo = block(k, prog->nlocal, t), hi = block(k + 1, prog->nlocal, t);
    mw__gang_run(prog->gangs[k], hi - lo, gang_task, (void *const *)prog->gang_args + lo);
}

void *mw__worker_main(void *arg) {
    worker *w = arg;
    mw__program *prog = w->prog;
    uint64_t seen = 0;
    for (;;) {
        wait_until(prog, &w->go_ev, &w->go, seen, NULL);
        seen = atomic_load(&w->go);
        cmd c = (cmd)atomic_load(&prog->command);
        int t = prog->run_threads, local = w->index - prog->first;
        if (t >= prog->nlocal)
            run_one(w, c);
        else /* this thread leads the gang its device starts */
            for (int k = 1; k < t; k++)
                if (block(k, prog->nlocal, t) == local) run_gang(prog, k);
        if (atomic_fetch_sub(&prog->remaining, 1) == 1) mw__event_notify(&prog->finished);
        if (c == CMD_QUIT) return NULL;
    }
}

/* Hands command c to worker w's thread. */
static void post(worker *w) {
    atomic_fetch_add(&w->go, 1);
    mw__event_notify(&w->go_ev);
}

static void wait_done(mw__program *prog) {
    /* A short spin: on 2 idle cores with 2 workers it cuts the cost of a step's hand-off from
     * about 25 us (sleep and wake) to a few. */
    wait_until(prog, &prog->finished, NULL, 0, &prog->remaining);
}

/* Runs command c on every started local worker and waits. With a thread per device, each
 * worker's thread gets it (a worker that runs on the host, on_host, runs it here meanwhile). With
 * fewer threads (sched.threads_now; start-up and shutdown always use every thread), gang k of
 * devices runs on the thread of its first device, gang 0 on the host's. */
static void run_all(mw__program *prog, cmd c) {
    int t = c == CMD_INIT || c == CMD_QUIT ? prog->nlocal : prog->sched.threads_now;
    atomic_store(&prog->command, (int)c);
    prog->run_threads = t;
    worker *mine = NULL;
    int threads = 0;
    if (t >= prog->nlocal) {
        for (int i = prog->first; i < prog->first + prog->nlocal; i++)
            if (prog->w[i].on_host)
                mine = &prog->w[i];
            else
                threads += prog->w[i].started;
        atomic_store(&prog->remaining, threads);
        for (int i = prog->first; i < prog->first + prog->nlocal; i++)
            if (!prog->w[i].on_host && prog->w[i].started) post(&prog->w[i]);
        if (mine) run_one(mine, c);
    } else {
        atomic_store(&prog->remaining, t - 1);
        for (int k = 1; k < t; k++) post(&prog->w[prog->first + block(k, prog->nlocal, t)]);
        threads = t - 1;
        run_gang(prog, 0);
    }
    if (threads) wait_done(prog);
}

mw_status mw__start_workers(mw__program *p) {
    for (int i = p->first; i < p->first + p->nlocal; i++) {
        /* The first CPU device of a mesh in one process runs on the calling thread: one thread
         * fewer to wake and to schedule every step (not when pinned: the caller's thread stays
         * unpinned). */
        p->w[i].on_host = i == p->first && p->mesh->vt->host_memory && p->mesh->nprocs == 1 &&
                          p->w[i].dev.pin == 0;
        if (!p->w[i].on_host &&
            pthread_create(&p->w[i].thread, NULL, mw__worker_main, &p->w[i]) != 0)
            return mw__error(MW_ERR_DEVICE, "could not start the worker thread of %s",
                             p->w[i].dev.name);
        p->w[i].started = 1;
    }
    return MW_OK;
}

void mw__stop_workers(mw__program *prog) {
    run_all(prog, CMD_QUIT);
    for (int i = prog->first; i < prog->first + prog->nlocal; i++)
        if (prog->w[i].started && !prog->w[i].on_host) pthread_join(prog->w[i].thread, NULL);
}
/* ---- how many threads run the devices (cfg.cpu_threads; the choice: sched.c) ---- */

mw_status mw__gangs_init(mw__program *prog) {
    int d = prog->nlocal;
    /* on_host: the first device is a host-memory device of an unpinned one-process mesh. */
    int can = d > 1 && prog->w[prog->first].on_host && prog->reducer == &mw__reducer_shm &&
              (!prog->all || prog->all_reducer == &mw__reducer_shm);
    mw__sched_candidates(&prog->sched, d, mw__cores(),
                         can ? prog->cfg.cpu_threads : MW_CPU_THREADS_PER_DEVICE);
    /* Gangs for every thread count that may run: gang k holds the largest block k gets. */
    int most = 0;
    for (int i = 0; i < prog->sched.ncand; i++)
        if (prog->sched.cand[i] < d && prog->sched.cand[i] > most) most = prog->sched.cand[i];
    if (!most) return MW_OK;
    prog->gang_args = mw__malloc((size_t)d * sizeof *prog->gang_args);
    prog->gangs = mw__calloc((size_t)most, sizeof *prog->gangs);
    if (!prog->gang_args || !prog->gangs)
        return mw__error(MW_ERR_NOMEM, "%s: out of memory", prog->caller);
    prog->ngangs = most;
    for (int i = 0; i < d; i++) prog->gang_args[i] = &prog->w[prog->first + i];
    for (int k = 0; k < most; k++) {
        int cap = 0;
        for (int i = 0; i < prog->sched.ncand; i++) {
            int t = prog->sched.cand[i];
            if (t < d && k < t && block(k + 1, d, t) - block(k, d, t) > cap)
                cap = block(k + 1, d, t) - block(k, d, t);
        }
        /* Gangs run on at most `most` threads: they spin as long as that many threads may. */
        mw_status st = mw__gang_new(cap, &prog->wake, mw__spin_ns(most), &prog->gangs[k]);
        if (st) return st;
    }
    return MW_OK;
}

void mw__gangs_free(mw__program *prog) {
    for (int k = 0; k < prog->ngangs; k++) mw__gang_free(prog->gangs[k]);
    mw__free(prog->gangs);
    prog->gangs = NULL;
    prog->ngangs = 0;
    mw__free(prog->gang_args);
    prog->gang_args = NULL;
}

/* Runs one command on every worker and waits; on failure reports the root cause: the first device
 * whose error is not just "aborted because a peer failed". */
mw_status mw__dispatch(mw__program *prog, cmd c) {
    /* A program with a backward part times those commands (evals between them take other
     * times); a forward-only one its forward commands. */
    int timed = prog->sched.ncand > 1 && c == (prog->grads ? CMD_BACKWARD : CMD_FORWARD);
    int64_t t0 = mw__now_ns();
    if (timed) mw__sched_begin(&prog->sched, t0);
    run_all(prog, c);
    int64_t wall = mw__now_ns() - t0;
    prog->stats = (mw_step_stats){.step_ms = (double)wall * 1e-6,
                                  .reduce_ms = prog->w[prog->first].reduce_ms,
                                  .threads = prog->run_threads};
    worker *cause = NULL;
    for (int i = prog->first; i < prog->first + prog->nlocal; i++) {
        worker *w = &prog->w[i];
        if (w->status &&
            (!cause || (cause->status == MW_ERR_ABORTED && w->status != MW_ERR_ABORTED)))
            cause = w;
    }
    if (timed && !cause) mw__sched_end(&prog->sched, t0, wall);
    if (!cause) return MW_OK;
    /* A non-finite loss or gradient is seen alike everywhere, after every collective: every
     * process stops at the same point and the program stays usable. */
    if (prog->mesh->nprocs > 1 && cause->status != MW_ERR_NONFINITE) prog->broken = 1;
    if (prog->all) prog->all_reducer->reset(prog->all);
    for (int gi = 0; gi < prog->ngroups; gi++)
        for (int k = 0; k < prog->groups[gi].ncomms; k++)
            if (prog->groups[gi].comms[k]) prog->reducer->reset(prog->groups[gi].comms[k]);
    mw_status st = cause->status;
    for (int i = prog->first; i < prog->first + prog->nlocal; i++) prog->w[i].status = MW_OK;
    if (c == CMD_INIT) return mw__error(st, "device %s: %s", cause->dev.name, cause->msg);
    return mw__error(st, "device %s, %s of step %lld: %s", cause->dev.name,
                     mw_phase_name(cause->phase), (long long)prog->steps, cause->msg);
}
