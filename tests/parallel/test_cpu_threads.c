/* How a process's CPU devices share threads (mw_trainer_config.cpu_threads): the gang that runs
 * several tasks on one thread (parallel/fiber.h), the trainer's choice between one thread per
 * device and one thread for all, and the configuration's errors. That one thread gives the same
 * bits as a thread per device is checked on data and tensor parallel meshes in
 * test_tensor_parallel.c, and a device failing in every phase on one thread in test_faults.c. */
#include <criterion/criterion.h>
#include <string.h>

#include "linreg_model.h"
#include "meshwit.h"
#include "parallel/fiber.h"
#include "parallel/trainer_impl.h"

/* ---- the gang ---- */

#define TASKS 3
#define TURNS 4

typedef struct log {
    int order[TASKS * (TURNS + 1)];
    int n;
} log_t;

typedef struct task_arg {
    log_t *log;
    int id, turns, switched;
} task_arg;

static void logging_task(void *p) {
    task_arg *a = p;
    a->switched = 0;
    for (int t = 0; t < a->turns; t++) {
        a->log->order[a->log->n++] = a->id;
        a->switched += mw__gang_yield();
    }
    a->log->order[a->log->n++] = a->id;
}

/* Tasks start in order, and a task that yields resumes after every other unfinished task had a
 * turn: round robin, with finished tasks left out. */
Test(gang, tasks_take_turns_in_order) {
    mw__gang *g;
    cr_assert_eq(mw__gang_new(TASKS, &g), MW_OK);
    log_t log = {{0}, 0};
    task_arg args[TASKS] = {{&log, 0, 2, 0}, {&log, 1, 0, 0}, {&log, 2, 3, 0}};
    void *p[TASKS] = {&args[0], &args[1], &args[2]};
    for (int rep = 0; rep < 2; rep++) { /* a gang runs again and again */
        log.n = 0;
        mw__gang_run(g, logging_task, p);
        /* 0 logs and yields, 1 logs and ends, 2 logs and yields, 0, 2, 0 ends, then 2 alone:
         * its last yield finds nobody else and returns 0 without switching, so 2 ends after
         * logging twice more. */
        static const int want[] = {0, 1, 2, 0, 2, 0, 2, 2};
        cr_assert_eq(log.n, 8, "rep %d: %d entries", rep, log.n);
        for (int i = 0; i < 8; i++) cr_assert_eq(log.order[i], want[i], "rep %d entry %d", rep, i);
        cr_assert_eq(args[0].switched, 2);
        cr_assert_eq(args[2].switched, 2, "the last yield, alone, switched");
    }
    mw__gang_free(g);
}

static void lone_task(void *p) {
    int *yields = p;
    *yields = mw__gang_yield() + 10 * mw__gang_yield();
}

Test(gang, yield_with_nobody_else_does_not_switch) {
    cr_assert_eq(mw__gang_yield(), 0, "outside a gang");
    mw__gang *g;
    cr_assert_eq(mw__gang_new(1, &g), MW_OK);
    int yields = -1;
    void *p[1] = {&yields};
    mw__gang_run(g, lone_task, p);
    cr_assert_eq(yields, 0);
    mw__gang_free(g);
}

/* Tasks that wait for each other through memory, as ranks of a collective do: each publishes a
 * value, yields until every other has published, then sums them in order. */
typedef struct meet {
    volatile int arrived;
    volatile double value[TASKS];
    double sum[TASKS];
} meet;

typedef struct meet_arg {
    meet *m;
    int id;
} meet_arg;

static void meeting_task(void *p) {
    meet_arg *a = p;
    char deep[64 * 1024]; /* the task's own stack holds it */
    memset(deep, a->id, sizeof deep);
    a->m->value[a->id] = 1.5 * (a->id + 1);
    a->m->arrived++;
    while (a->m->arrived < TASKS) cr_assert_eq(mw__gang_yield(), 1);
    double s = 0;
    for (int q = 0; q < TASKS; q++) s += a->m->value[q];
    a->m->sum[a->id] = s + (deep[sizeof deep - 1] - a->id);
}

Test(gang, tasks_meet_through_memory) {
    mw__gang *g;
    cr_assert_eq(mw__gang_new(TASKS, &g), MW_OK);
    meet m = {0, {0}, {0}};
    meet_arg args[TASKS];
    void *p[TASKS];
    for (int i = 0; i < TASKS; i++) {
        args[i] = (meet_arg){&m, i};
        p[i] = &args[i];
    }
    mw__gang_run(g, meeting_task, p);
    for (int i = 0; i < TASKS; i++) cr_assert_eq(m.sum[i], 1.5 * (1 + 2 + 3));
    mw__gang_free(g);
}

/* ---- the choice (mw__sched_after on a bare trainer: it touches only the scheduling state) ---- */

/* Runs `steps` commands that take ms_threads or ms_one milliseconds as the trainer runs them
 * (the host getting `share` of a core with threads); returns how many ran on one thread. */
static int simulate(mw_trainer *tr, int steps, double ms_threads, double ms_one, double share) {
    int one = 0;
    for (int i = 0; i < steps; i++) {
        one += tr->one_thread;
        mw__sched_after(tr, tr->one_thread ? ms_one : ms_threads, tr->one_thread ? 1.0 : share);
    }
    return one;
}

Test(cpu_threads, threads_stay_while_the_host_gets_its_core) {
    mw_trainer tr;
    memset(&tr, 0, sizeof tr);
    /* Even if one thread would be faster: no trial without a sign of starved threads. */
    cr_assert_eq(simulate(&tr, 2000, 1.0, 0.5, 0.95), 0);
}

Test(cpu_threads, one_thread_wins_when_the_cores_are_busy_and_it_is_faster) {
    mw_trainer tr;
    memset(&tr, 0, sizeof tr);
    /* The host gets a third of a core and one thread takes half the time: after the warm-up
     * and three steps that show the starving, a trial of three steps, kept. */
    int one = simulate(&tr, 20, 1.0, 0.5, 0.3);
    cr_assert_eq(tr.one_thread, 1);
    cr_assert_geq(one, 12, "%d of 20 steps on one thread", one);
    /* Trials of threads come back, ever more rarely while they lose: over 2000 steps at most a
     * few dozen run with threads. */
    one = simulate(&tr, 2000, 1.0, 0.5, 0.3);
    cr_assert_eq(tr.one_thread, 1);
    cr_assert_geq(one, 2000 - 60, "%d of 2000 steps on one thread", one);
    /* The busy process ends: threads are twice as fast again; the next trial (at most 256
     * steps away) goes back to them for good. */
    one = simulate(&tr, 600, 0.5, 1.0, 1.0);
    cr_assert_eq(tr.one_thread, 0);
    cr_assert_leq(one, 256 + 3, "%d steps stayed on one thread", one);
    cr_assert_eq(simulate(&tr, 2000, 0.5, 1.0, 1.0), 0);
}

Test(cpu_threads, a_losing_trial_is_dropped_and_tried_more_rarely) {
    mw_trainer tr;
    memset(&tr, 0, sizeof tr);
    /* Starved, but threads still win (devices outnumber idle cores): trials of one thread are
     * dropped, each wait twice the last, up to 256 steps. */
    int one = simulate(&tr, 2000, 1.0, 1.5, 0.3);
    cr_assert_eq(tr.one_thread, 0);
    cr_assert_leq(one, 3 * 14, "%d of 2000 steps on one thread", one);
    cr_assert_geq(one, 3, "never tried one thread");
    /* A trial needs a clear win: 5 % faster is noise. */
    memset(&tr, 0, sizeof tr);
    simulate(&tr, 2000, 1.0, 0.95, 0.3);
    cr_assert_eq(tr.one_thread, 0);
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
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.05f}, .cpu_threads = 3};
    mw_trainer *tr = (mw_trainer *)1;
    cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_ERR_INVALID);
    cr_assert_null(tr);
    cr_assert(strstr(mw_last_error(), "cpu_threads is 3"), "%s", mw_last_error());
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
