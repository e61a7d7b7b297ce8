/* Internal: how many threads run a program's local CPU devices under MW_CPU_THREADS_AUTO
 * (parallel/sched.c). The policy only reads step times and the host's share of a core; the
 * program (parallel/workers.c) runs the commands with the count it chooses. */
#ifndef MW__SCHED_H
#define MW__SCHED_H

#include <stdint.h>

typedef struct mw__sched {
    int ncand, cand[3]; /* thread counts that may run: a thread per device first */
    int cur, trial;     /* the kept candidate; the one on trial, or -1 */
    int threads_now;    /* the count the next command runs with */
    int64_t measured, next_trial;
    int interval, trial_left;
    double share; /* the host's share of a core with a thread per device, moving average */
    int64_t mark_wall, mark_cpu; /* where the current reading of that share began */
    int mark_threads;            /* and with how many threads */
    double ms[3][3];             /* each candidate's last step times */
    int nms[3];
} mw__sched;

/* The thread counts `devices` local devices may run with, on `cores` cores, under cpu_threads
 * `setting` (MW_CPU_THREADS_PER_DEVICE for meshes whose devices cannot share threads); sets
 * threads_now to the first. */
void mw__sched_candidates(mw__sched *s, int devices, int cores, int setting);

/* MW_CPU_THREADS_AUTO: after a timed command of `ms` milliseconds, with `share` the calling
 * thread's time on a core over the last reading's wall time (< 0: no reading ended with this
 * command), sets s->threads_now for the next. */
void mw__sched_after(mw__sched *s, double ms, double share);

/* Around a timed command that starts at t0_ns (mw__now_ns) and lasts wall_ns: begin opens a
 * reading of the host's share of a core when none is open for the current thread count; end
 * closes it once it spans enough time and passes the step to mw__sched_after. */
void mw__sched_begin(mw__sched *s, int64_t t0_ns);
void mw__sched_end(mw__sched *s, int64_t t0_ns, int64_t wall_ns);

#endif
