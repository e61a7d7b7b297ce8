/* Internal: a gang runs several tasks on one thread, in turn (cooperative fibers, each with a
 * stack of its own). A task runs until it finishes or waits for another task: a waiter calls
 * mw__gang_yield instead of spinning or sleeping, and the gang resumes the next unfinished task.
 *
 * The trainer runs all of a process's CPU devices as one gang on the calling thread when the
 * machine's cores are taken by other work (parallel/workers.c): the devices' plans and the
 * shared-memory collectives are the same code either way, so the results are the same bits, but
 * no device waits for a thread the scheduler has not run yet. */
#ifndef MW__FIBER_H
#define MW__FIBER_H

#include "meshwit/status.h"

typedef struct mw__gang mw__gang;

/* A gang of n tasks (n >= 1); MW_ERR_NOMEM when the stacks cannot be mapped. */
mw_status mw__gang_new(int n, mw__gang **out);
void mw__gang_free(mw__gang *g);

/* Runs fn(args[i]) for every i < n as the gang's tasks on the calling thread and returns when
 * every task has returned. Task i is first started after tasks 0 .. i-1 finished or waited, and a
 * waiting task resumes after every other unfinished task had a turn. Not re-entrant: a task must
 * not run a gang itself. */
void mw__gang_run(mw__gang *g, void (*fn)(void *), void *const *args);

/* Inside a gang's task: lets the gang's other tasks run, then returns 1. Outside a gang, or in a
 * gang whose other tasks have all finished (nobody else could change what the caller waits
 * for), returns 0 at once: the caller then waits as a thread does. */
int mw__gang_yield(void);

#endif
