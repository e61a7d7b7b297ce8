/* Internal: a gang runs several tasks on one thread, in turn (cooperative fibers, each with a
 * stack of its own). A task runs until it finishes or waits: a waiter parks with a readiness
 * test (mw__gang_wait) instead of spinning or sleeping, and the gang resumes another task whose
 * test passes. When every unfinished task is parked and none is ready (they wait for a task of
 * another thread), the thread spins briefly, then sleeps on the gang's wake event until a
 * notification or a short timeout, and tests again.
 *
 * The trainer runs a process's CPU devices as gangs when the machine has fewer free cores than
 * devices (parallel/workers.c): the devices' plans and the shared-memory collectives are the same
 * code either way, so the results are the same bits, but no device waits for a thread the
 * scheduler has not run yet. */
#ifndef MW__FIBER_H
#define MW__FIBER_H

#include "collectives/wait.h"
#include "meshwit/status.h"

typedef struct mw__gang mw__gang;

/* A gang of up to `capacity` tasks (>= 1); wake (may be NULL) is the event that whoever makes a
 * parked task ready notifies, so that an idle gang sleeps on it; spin_ns: how long an idle gang
 * spins before it sleeps. MW_ERR_NOMEM when the stacks cannot be mapped. */
mw_status mw__gang_new(int capacity, mw__event *wake, int64_t spin_ns, mw__gang **out);
void mw__gang_free(mw__gang *g);

/* Runs fn(args[i]) for every i < n (n <= capacity) as the gang's tasks on the calling thread and
 * returns when every task has returned. Tasks start in order; a task that parks resumes, once
 * ready, after every other runnable task had a turn. Not re-entrant: a task must not run a gang. */
void mw__gang_run(mw__gang *g, int n, void (*fn)(void *), void *const *args);

/* Inside a gang's task: parks the task until ready(arg) returns non-zero (the gang calls it from
 * the same thread, between tasks), then returns 1. Outside a gang, or when every other task of
 * the gang has finished (nobody on this thread could make it ready), returns 0 at once: the
 * caller then waits as a thread does. ready should also pass when the caller's deadline does. */
int mw__gang_wait(int (*ready)(void *), void *arg);

#endif
