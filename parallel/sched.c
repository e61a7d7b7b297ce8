/* The thread-count policy of MW_CPU_THREADS_AUTO: CPU devices of one process may run on a thread
 * each, on one per core, or on one; the host times the ways it may run and keeps the fastest
 * (see mw__sched_after). Results are the same bits whichever way runs. */
#include "parallel/sched.h"

#include <time.h>

#include "meshwit/trainer.h"

#define TRIAL_STEPS 3    /* steps a trial of another way runs */
#define FIRST_INTERVAL 8 /* steps between trials, doubled after each round that changes nothing */
#define MAX_INTERVAL 256
#define WARM_UP 2         /* first steps not timed: they touch new memory */
#define STARVED_SHARE 0.6 /* the host's share of a core below which fewer threads may do better */
#define BETTER 0.9        /* a trial wins when its median step takes less than this much */
#define HOPELESS 1.5      /* a trial ends after one step this much slower than the kept way */
#define SHARE_WINDOW_NS 2000000 /* the host's share of a core is read over at least 2 ms */

void mw__sched_candidates(mw__sched *s, int devices, int cores, int setting) {
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
    s->threads_now = s->cand[0];
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
void mw__sched_after(mw__sched *s, double ms, double share) {
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
            s->threads_now = s->cand[next];
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
        s->threads_now = s->cand[s->cur];
        return;
    }
    if (s->measured < s->next_trial || s->nms[m] < 3 || (m == 0 && s->share >= STARVED_SHARE))
        return;
    s->trial = next_trial(s, -1);
    s->nms[s->trial] = 0;
    s->trial_left = TRIAL_STEPS;
    s->threads_now = s->cand[s->trial];
}

void mw__sched_begin(mw__sched *s, int64_t t0_ns) {
    if (s->mark_wall && s->mark_threads == s->threads_now) return;
    /* The calling thread's CPU time costs a system call: it is read once per window of
     * SHARE_WINDOW_NS of commands run alike, not every command. */
    s->mark_wall = t0_ns;
    s->mark_cpu = thread_cpu_ns();
    s->mark_threads = s->threads_now;
}

void mw__sched_end(mw__sched *s, int64_t t0_ns, int64_t wall_ns) {
    double share = -1.0; /* no reading this time */
    int64_t end = t0_ns + wall_ns;
    if (end - s->mark_wall >= SHARE_WINDOW_NS) {
        int64_t cpu = thread_cpu_ns();
        share = (double)(cpu - s->mark_cpu) / (double)(end - s->mark_wall);
        s->mark_wall = end;
        s->mark_cpu = cpu;
    }
    mw__sched_after(s, (double)wall_ns * 1e-6, share);
}
