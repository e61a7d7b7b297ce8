/* How a process's CPU devices share threads (mw_trainer_config.cpu_threads): the gang that runs
 * several tasks on one thread (collectives/fiber.h), the trainer's choice between one thread per
 * device and fewer threads, and the configuration's errors. That one thread gives the same
 * bits as a thread per device is checked on data and tensor parallel meshes in
 * test_tensor_parallel.c, and a device failing in every phase on one thread in test_faults.c. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "collectives/fiber.h"
#include "linreg_model.h"
#include "meshwit.h"
#include "parallel/sched.h"

/* ---- the gang (tasks record what they saw; the test asserts on its own stack afterwards) ---- */

#define TASKS 3
#define TURNS 4

static int always(void *arg) {
    (void)arg;
    return 1;
}

typedef struct log {
    int order[TASKS * (TURNS + 1)];
    int n;
} log_t;

typedef struct task_arg {
    log_t *log;
    int id, turns, parked;
} task_arg;

static void logging_task(void *p) {
    task_arg *a = p;
    a->parked = 0;
    for (int t = 0; t < a->turns; t++) {
        a->log->order[a->log->n++] = a->id;
        a->parked += mw__gang_wait(always, NULL);
    }
    a->log->order[a->log->n++] = a->id;
}

static mw__gang *gang(int capacity) {
    mw__gang *g = NULL;
    cr_assert_eq(mw__gang_new(capacity, NULL, 0, &g), MW_OK);
    return g;
}

/* Tasks start in order, and a task that parks (ready at once) resumes after every other
 * runnable task had a turn: round robin, with finished tasks left out. */
Test(gang, tasks_take_turns_in_order) {
    mw__gang *g = gang(TASKS + 1);
    log_t log = {{0}, 0};
    task_arg args[TASKS] = {{&log, 0, 2, 0}, {&log, 1, 0, 0}, {&log, 2, 3, 0}};
    void *p[TASKS] = {&args[0], &args[1], &args[2]};
    for (int rep = 0; rep < 2; rep++) { /* a gang runs again and again */
        log.n = 0;
        mw__gang_run(g, TASKS, logging_task, p);
        /* 0 logs and parks, 1 logs and ends, 2 logs and parks, 0, 2, 0 ends, then 2 alone: its
         * last wait finds nobody else and returns 0 without parking, so 2 ends after logging
         * twice more. */
        static const int want[] = {0, 1, 2, 0, 2, 0, 2, 2};
        cr_assert_eq(log.n, 8, "rep %d: %d entries", rep, log.n);
        for (int i = 0; i < 8; i++) cr_assert_eq(log.order[i], want[i], "rep %d entry %d", rep, i);
        cr_assert_eq(args[0].parked, 2);
        cr_assert_eq(args[2].parked, 2, "the last wait, alone, parked");
    }
    mw__gang_free(g);
}

static void lone_task(void *p) {
    int *parked = p;
    *parked = mw__gang_wait(always, NULL) + 10 * mw__gang_wait(always, NULL);
}

Test(gang, a_wait_with_nobody_else_does_not_park) {
    cr_assert_eq(mw__gang_wait(always, NULL), 0, "outside a gang");
    mw__gang *g = gang(1);
    int parked = -1;
    void *p[1] = {&parked};
    mw__gang_run(g, 1, lone_task, p);
    cr_assert_eq(parked, 0);
    mw__gang_free(g);
}

/* Tasks running different functions: each task's argument names its own. */
typedef struct job {
    void (*fn)(void *);
    void *arg;
} job;

static void run_job(void *p) {
    job *j = p;
    j->fn(j->arg);
}

/* A parked task resumes only once its test passes: task 0 waits for a counter that task 1 bumps
 * once per turn. */
typedef struct counted {
    int count, seen_at, parked;
} counted;

static int three(void *p) { return ((counted *)p)->count >= 3; }

static void waiter(void *p) {
    counted *c = p;
    c->parked = mw__gang_wait(three, c);
    c->seen_at = c->count;
}

static void bumper(void *p) {
    counted *c = p;
    for (int i = 0; i < 5; i++) {
        c->count++;
        mw__gang_wait(always, NULL);
    }
}

Test(gang, a_parked_task_waits_for_its_test) {
    mw__gang *g = gang(2);
    counted c = {0, 0, 0};
    job jobs[2] = {{waiter, &c}, {bumper, &c}};
    void *p[2] = {&jobs[0], &jobs[1]};
    mw__gang_run(g, 2, run_job, p);
    cr_assert_eq(c.parked, 1);
    cr_assert_eq(c.seen_at, 3, "the waiter resumed at count %d", c.seen_at);
    cr_assert_eq(c.count, 5);
    mw__gang_free(g);
}

/* Tasks that wait for each other through memory, as ranks of a collective do: each publishes a
 * value, parks until every other has published, then sums them in order. */
typedef struct meet {
    int arrived;
    double value[TASKS];
    double sum[TASKS];
    int seen[TASKS]; /* arrivals each task saw when it went on */
} meet;

typedef struct meet_arg {
    meet *m;
    int id;
} meet_arg;

static int all_arrived(void *p) { return ((meet *)p)->arrived == TASKS; }

static void meeting_task(void *p) {
    meet_arg *a = p;
    char deep[64 * 1024]; /* the task's own stack holds it */
    memset(deep, a->id, sizeof deep);
    a->m->value[a->id] = 1.5 * (a->id + 1);
    a->m->arrived++;
    if (a->m->arrived < TASKS) mw__gang_wait(all_arrived, a->m);
    a->m->seen[a->id] = a->m->arrived;
    double s = 0;
    for (int q = 0; q < TASKS; q++) s += a->m->value[q];
    a->m->sum[a->id] = s + (deep[sizeof deep - 1] - a->id);
}

Test(gang, tasks_meet_through_memory) {
    mw__gang *g = gang(TASKS);
    meet m = {0, {0}, {0}, {0}};
    meet_arg args[TASKS];
    void *p[TASKS];
    for (int i = 0; i < TASKS; i++) {
        args[i] = (meet_arg){&m, i};
        p[i] = &args[i];
    }
    mw__gang_run(g, TASKS, meeting_task, p);
    for (int i = 0; i < TASKS; i++) {
        cr_assert_eq(m.seen[i], TASKS, "task %d went on before every task arrived", i);
        cr_assert_eq(m.sum[i], 1.5 * (1 + 2 + 3));
    }
    mw__gang_free(g);
}

/* Every task of a gang parked on another thread: the gang sleeps until that thread sets the flag
 * (with a notification of the gang's event, or without one: the sleep is cut short regularly). */
typedef struct other {
    _Atomic int flag;
    mw__event *wake;
    int resumed;
} other;

static int flag_set(void *p) { return atomic_load(&((other *)p)->flag); }

static void flag_waiter(void *p) {
    other *o = p;
    /* The first waiter parks; the second parks too, or (when the first already finished)
     * waits alone as a thread would: either way it goes on only once the flag is set. */
    if (!mw__gang_wait(flag_set, o))
        while (!flag_set(o)) sched_yield();
    o->resumed += flag_set(o);
}

static void *set_flag_later(void *p) {
    other *o = p;
    struct timespec nap = {0, 20 * 1000 * 1000};
    nanosleep(&nap, NULL);
    atomic_store(&o->flag, 1);
    if (o->wake) mw__event_notify(o->wake);
    return NULL;
}

Test(gang, a_gang_sleeps_until_another_thread_makes_a_task_ready) {
    for (int notify = 0; notify < 2; notify++) {
        mw__event wake = {0, 0};
        mw__gang *g = NULL;
        cr_assert_eq(mw__gang_new(2, &wake, 2000, &g), MW_OK);
        other o = {0, notify ? &wake : NULL, 0};
        void *p[2] = {&o, &o};
        pthread_t th;
        cr_assert_eq(pthread_create(&th, NULL, set_flag_later, &o), 0);
        mw__gang_run(g, 2, flag_waiter, p);
        pthread_join(th, NULL);
        /* Both tasks parked on the flag; the first to resume finishes, the second then finds
         * itself alone or already ready. */
        cr_assert_eq(o.resumed, 2);
        mw__gang_free(g);
    }
}

/* ---- the choice (mw__sched_after on a bare policy: it reads only step times) ---- */

/* Milliseconds a step takes with 1, 2 or 4 threads (index: threads). */
typedef struct timing {
    double ms[5];
    double share; /* the host's share of a core with a thread per device */
} timing;

/* Runs `steps` commands as the trainer chooses their thread counts; returns how many ran with
 * `threads` threads. */
static int simulate(mw__sched *tr, int steps, timing t, int threads) {
    int n = 0;
    for (int i = 0; i < steps; i++) {
        int now = tr->threads_now;
        n += now == threads;
        mw__sched_after(tr, t.ms[now], t.share);
    }
    return n;
}

static void bare(mw__sched *tr, int devices, int cores, int setting) {
    memset(tr, 0, sizeof *tr);
    mw__sched_candidates(tr, devices, cores, setting);
}

Test(cpu_threads, threads_stay_while_the_host_gets_its_core) {
    mw__sched tr;
    bare(&tr, 2, 2, MW_CPU_THREADS_AUTO);
    cr_assert_eq(tr.threads_now, 2);
    /* Even if one thread would be faster: no trial without a sign of starved threads. */
    cr_assert_eq(simulate(&tr, 2000, (timing){{0, 0.5, 1.0}, 0.95}, 1), 0);
}

Test(cpu_threads, one_thread_wins_when_the_cores_are_busy_and_it_is_faster) {
    mw__sched tr;
    bare(&tr, 2, 2, MW_CPU_THREADS_AUTO);
    /* The host gets a third of a core and one thread takes half the time: after the warm-up
     * and three steps that show the starving, a trial of three steps, kept. */
    timing busy = {{0, 0.5, 1.0}, 0.3};
    int one = simulate(&tr, 20, busy, 1);
    cr_assert_eq(tr.threads_now, 1);
    cr_assert_geq(one, 12, "%d of 20 steps on one thread", one);
    /* Trials of threads come back, ever more rarely while they lose: over 2000 steps at most a
     * few dozen run with threads. */
    one = simulate(&tr, 2000, busy, 1);
    cr_assert_eq(tr.threads_now, 1);
    cr_assert_geq(one, 2000 - 60, "%d of 2000 steps on one thread", one);
    /* The busy process ends: threads are twice as fast again; the next trial (at most 256
     * steps away) goes back to them for good. */
    timing idle = {{0, 1.0, 0.5}, 1.0};
    one = simulate(&tr, 600, idle, 1);
    cr_assert_eq(tr.threads_now, 2);
    cr_assert_leq(one, 256 + 3, "%d steps stayed on one thread", one);
    cr_assert_eq(simulate(&tr, 2000, idle, 1), 0);
}

Test(cpu_threads, a_losing_trial_is_dropped_and_tried_more_rarely) {
    mw__sched tr;
    bare(&tr, 2, 2, MW_CPU_THREADS_AUTO);
    /* Starved, but threads still win: trials of one thread are dropped, each wait twice the
     * last, up to 256 steps. */
    int one = simulate(&tr, 2000, (timing){{0, 1.5, 1.0}, 0.3}, 1);
    cr_assert_eq(tr.threads_now, 2);
    cr_assert_leq(one, 3 * 14, "%d of 2000 steps on one thread", one);
    cr_assert_geq(one, 3, "never tried one thread");
    /* A trial whose first step takes three times as long ends there: one step per round. */
    bare(&tr, 2, 2, MW_CPU_THREADS_AUTO);
    one = simulate(&tr, 2000, (timing){{0, 3.0, 1.0}, 0.3}, 1);
    cr_assert_eq(tr.threads_now, 2);
    cr_assert_leq(one, 14, "%d of 2000 steps on one thread", one);
    cr_assert_geq(one, 1, "never tried one thread");
    /* A trial needs a clear win: 5 % faster is noise. */
    bare(&tr, 2, 2, MW_CPU_THREADS_AUTO);
    simulate(&tr, 2000, (timing){{0, 0.95, 1.0}, 0.3}, 1);
    cr_assert_eq(tr.threads_now, 2);
}

/* Four devices on two cores: a round tries two threads (a gang of two devices each) and one,
 * and keeps the fastest. */
Test(cpu_threads, devices_outnumbering_cores_share_them) {
    mw__sched tr;
    bare(&tr, 4, 2, MW_CPU_THREADS_AUTO);
    cr_assert_eq(tr.ncand, 3);
    timing t = {{0, 0.9, 0.6, 0, 1.0}, 0.4};
    simulate(&tr, 30, t, 2);
    cr_assert_eq(tr.threads_now, 2);
    int two = simulate(&tr, 2000, t, 2);
    cr_assert_geq(two, 2000 - 2 * 3 * 10, "%d of 2000 steps on two threads", two);
    /* One per device when devices do not outnumber cores: no middle candidate. */
    bare(&tr, 4, 8, MW_CPU_THREADS_AUTO);
    cr_assert_eq(tr.ncand, 2);
}

/* A fixed count is never changed, and is capped at a thread per device. */
Test(cpu_threads, a_fixed_count_stays) {
    mw__sched tr;
    bare(&tr, 4, 2, 3);
    cr_assert_eq(tr.threads_now, 3);
    cr_assert_eq(simulate(&tr, 500, (timing){{0, 0.1, 0.1, 9.0, 0.1}, 0.1}, 3), 500);
    bare(&tr, 4, 2, 9);
    cr_assert_eq(tr.threads_now, 4);
    bare(&tr, 4, 2, MW_CPU_THREADS_PER_DEVICE);
    cr_assert_eq(tr.threads_now, 4);
    bare(&tr, 4, 2, MW_CPU_THREADS_ONE);
    cr_assert_eq(tr.threads_now, 1);
}

/* ---- the configuration ---- */

Test(cpu_threads, bad_value_is_refused) {
    linreg_data d;
    cr_assert_eq(linreg_data_make(64, 4, 3, &d), MW_OK);
    mw_graph *g;
    mw_tensor *loss;
    mw_mesh *mesh;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    cr_assert_eq(linreg_build(g, 64, 4, 1, "X", &loss), MW_OK);
    cr_assert_eq(mw_mesh_new("cpu:2", "X", &mesh), MW_OK);
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.05f}, .cpu_threads = -2};
    mw_trainer *tr = (mw_trainer *)1;
    cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_ERR_INVALID);
    cr_assert_null(tr);
    cr_assert(strstr(mw_last_error(), "cpu_threads is -2"), "%s", mw_last_error());
    /* One device: nothing to share; the setting is accepted and the one device runs alone. */
    mw_mesh *one;
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &one), MW_OK);
    cfg.cpu_threads = MW_CPU_THREADS_ONE;
    cr_assert_eq(mw_trainer_new(g, loss, one, &cfg, &tr), MW_OK, "%s", mw_last_error());
    mw_feed f[2] = {{"x", d.x, 64 * 4}, {"y", d.y, 64}};
    cr_assert_eq(mw_trainer_step(tr, f, 2, NULL), MW_OK);
    mw_step_stats st;
    cr_assert_eq(mw_trainer_stats(tr, &st), MW_OK);
    cr_assert_eq(st.threads, 1);
    mw_trainer_free(tr);
    mw_mesh_free(one);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    linreg_data_free(&d);
}
