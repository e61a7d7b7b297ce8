/* Internal: the trainer's state, shared by its files (trainer.c: the public API; trainer_build.c:
 * construction; workers.c: the worker threads and the host's hand-off; executor.c: running a plan;
 * update.c: the optimizer step) and by checkpoint.c (saving and restoring the training state). */
#ifndef MW__TRAINER_IMPL_H
#define MW__TRAINER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "collectives/reducer.h"
#include "collectives/wait.h"
#include "core/error.h"
#include "core/graph_impl.h"
#include "core/plan.h"
#include "meshwit.h"
#include "parallel/mesh_impl.h"

#define MAX_GROUPS 16

typedef enum cmd { CMD_NONE, CMD_INIT, CMD_EVAL, CMD_GRADS, CMD_STEP, CMD_QUIT, CMD_ACCUM } cmd;

typedef struct worker {
    mw_trainer *tr;
    int index;
    pthread_t thread;
    int started;
    int on_host;         /* run by the thread that calls the trainer, not a thread of its own */
    _Atomic uint64_t go; /* commands handed to this worker's thread (workers.c) */
    mw__event go_ev;
    mw__device dev;
    mw__plan plan;
    void *arena, *params, *grads;
    /* plan.params16: the bf16 copy of the flat parameters that bf16 contractions read. version
     * counts the changes of this device's parameters (the optimizer's, and writes from the
     * host); version16 is the version the copy was made from (see mw__params16_sync). */
    void *params16;
    void *state; /* an inference program's states (plan.state_elems), or NULL */
    uint64_t version, version16;
    /* AdamW: m then v; SGD with momentum: its buffer. Each covers this device's slice
     * [own_lo, own_hi) of the flat parameters: all of them, or with ZeRO-1 its own slice. */
    void *moments;
    int64_t own_lo, own_hi;
    /* ZeRO-1: the zparts + 1 offsets that cut the flat parameters among the devices that sum
     * gradients together (tr->slices; with sharded parameters the device's own zslices_own,
     * since flat layouts differ between shards); this device owns part rank[zero_group]. */
    const size_t *zslices;
    size_t *zslices_own;
    int zparts;
    void *accum;    /* gradient accumulation: the sum of the accumulated micro-batches' gradients of
                     * [own_lo, own_hi) */
    float *scratch; /* device scalars: the gradient norm's partial sums, one per slice (with
                     * sharded parameters, one per parameter) */
    float *partials; /* host: the same partials (nworkers; with sharded parameters, pieces per
                      * device, parameter and ZeRO slice), gathered from their owners */
    size_t *bounds;  /* host: ZeRO-1 scratch, the slices' parts of one gradient bucket */
    void *pinned;    /* page-locked staging of the input shards (devices that offer it) */
    char **bases;    /* per plan base: resolved address (views rebound every step) */
    /* The plan's kernels with their buffer pointers resolved (mw__executor_init); those of the
     * instructions in rebind[0 .. nrebind), which read an input in place in the caller's array,
     * are resolved again every step. */
    union mw__kernel *kern;
    int *rebind, nrebind;
    mw__comm *comm[MAX_GROUPS];
    int rank[MAX_GROUPS];
    uint32_t inflight; /* groups with all-reduces started and not finished (bit per group) */
    mw_status status;
    char msg[MW__MSG_SIZE];
    double reduce_ms, update_ms; /* of the current command */
    mw_phase phase;              /* where the current command is, for messages */
    int fault_armed;             /* testing hook: fail at fault_phase of step fault_step */
    mw_phase fault_phase;
    int64_t fault_step;
    mw_status fault_status; /* MW_OK: a stall of fault_ms instead of a failure */
    int fault_ms;
    /* Profiling (cfg.profile): a category per instruction, and time and calls per category. */
    int *prof_cat;
    double *prof_ms;
    int64_t *prof_calls;
    int skipped;  /* the current step skipped its update (skip_nonfinite) */
    int training; /* the current command trains (dropout is active) */
} worker;

/* Profile categories (profile.c): (graph op, plain or copy) in each of three phases, plus the
 * gradient all-reduce and the optimizer. */
#define MW__PROF_PER_PHASE (2 * MW__OP_COUNT + 2)
#define MW__PROF_CATS (3 * MW__PROF_PER_PHASE)
#define MW__PROF_UPDATE (2 * MW__PROF_PER_PHASE + 2 * MW__OP_COUNT + 1)
/* Fills w->prof_cat for w's plan (allocating the arrays); MW_ERR_NOMEM. */
mw_status mw__profile_init(worker *w, const mw_graph *g);
void mw__profile_free(worker *w);

/* The communicators of one group mask: devices that agree on every mesh axis outside the mask
 * reduce together. */
typedef struct group {
    uint32_t mask; /* graph mesh names */
    int ncomms;
    mw__comm **comms;
} group;

/* How the trainer chooses the number of threads under MW_CPU_THREADS_AUTO (workers.c). */
typedef struct mw__sched {
    void **args;        /* the gangs' tasks: this process's workers in order */
    int ncand, cand[3]; /* thread counts that may run: a thread per device first */
    int cur, trial;     /* the kept candidate; the one on trial, or -1 */
    int64_t measured, next_trial;
    int interval, trial_left;
    double share; /* the host's share of a core with a thread per device, moving average */
    int64_t mark_wall, mark_cpu; /* where the current reading of that share began */
    int mark_threads;            /* and with how many threads */
    double ms[3][3];             /* each candidate's last step times */
    int nms[3];
} mw__sched;

struct mw_trainer {
    mw_graph *g; /* the trainer's own copy, extended with the backward pass */
    mw_tensor *loss;
    mw_tensor **grads;
    mw_tensor **outputs;            /* in the trainer's graph */
    const mw_tensor **user_outputs; /* the caller's handles, same order */
    mw_mesh *mesh;
    mw_trainer_config cfg;
    const mw__reducer_vtable *reducer;
    int mesh_axis_of[MW__MAX_MESH_NAMES]; /* graph mesh name -> mesh axis */
    group groups[MAX_GROUPS];
    int ngroups;
    mw__comm *all; /* every device: the barrier before the update (NULL for one device) */
    const mw__reducer_vtable *all_reducer; /* of `all`: shared memory, or across processes */
    int nworkers;                          /* devices of the mesh, all processes together */
    /* This process's workers: w[first .. first + nlocal). On a mesh spanning processes the
     * others are placeholders that are never planned or started. */
    int first, nlocal;
    /* A command failed on a mesh spanning processes: peers may still be inside a collective that
     * cannot be cancelled, so no further command may start collectives. */
    int broken;
    worker *w;
    float *init_values;   /* flat initial parameters, only during start-up */
    const mw_feed *feeds; /* the current step's, ordered by input leaf */
    const mw_feed **feed_of;
    /* Commands (workers.c): the host writes command and remaining, then bumps each receiving
     * worker's `go` and notifies its go_ev; the last worker done notifies `finished`. Waiters
     * spin briefly on these before sleeping on the event. */
    _Atomic int command;
    _Atomic int remaining;
    mw__event finished;
    int64_t steps;
    mw_step_stats stats; /* of the last command */
    float step_lr;       /* for the step being run */
    float grad_norm;     /* of the last step */
    int blas_prev;
    /* The backend's thread hook that blas_prev restores (a program may free the mesh first). */
    int (*set_threads)(int n);
    int64_t spin_ns; /* how long host and workers spin before they sleep (parallel/wait.h) */
    /* parallel/consistency.c: a stop requested for this trainer, steps skipped for non-finite
     * values, and host scratch for the replica checksums (made when first needed). */
    _Atomic int stop;
    int64_t skipped;
    float *replica_buf;
    uint64_t *replica_sums;
    unsigned char *decays; /* per parameter leaf: weight decay applies */
    float host_lr;         /* >= 0: set by mw_trainer_set_lr, in place of the schedule */
    int accumulated;       /* micro-batches in the accumulator since the last update */
    int outputs_ready;     /* a command has run: the outputs hold values */
    /* An inference program (infer.c): forward only, no gradients; its parameters are those of
     * params_from's devices when not NULL (same mesh), else its own. */
    int forward_only;
    mw_trainer *params_from;
    /* The flat parameters cut into one slice per device of the mesh (nworkers + 1 offsets,
     * mw__slice_lo): the gradient norm adds one partial per slice, and with ZeRO-1 (zero1, on a
     * mesh of several devices) device d keeps optimizer state and updates only for slice d. */
    size_t *slices;
    int zero1;
    /* Some parameter is split over a mesh axis (parallel/shards.c): each device holds its box of
     * it, so devices' flat parameters differ and init_boxes holds each local device's initial
     * values (during start-up only). */
    int sharded_params;
    float **init_boxes;
    /* ZeRO-1 with sharded parameters: the reduction group whose devices share optimizer state
     * (without them the group spans the mesh). */
    int zero_group;
    /* How many threads run the local devices (workers.c, mw_trainer_config.cpu_threads): all of
     * them, one each, or fewer, each running a contiguous block of devices as a gang. gangs[k]
     * (ngangs of them; none when the devices cannot share threads: not every device a CPU
     * device of this process, or pinned) runs block k; wake is the event their communicators
     * notify. threads_now is the count the next command runs with, run_threads the count the
     * current (or last) one ran with. The rest chooses under MW_CPU_THREADS_AUTO. */
    struct mw__gang **gangs;
    int ngangs;
    mw__event wake;
    int threads_now, run_threads;
    mw__sched sched;
};

/* How device d of the trainer's mesh sits along each of the graph's mesh names (once place() has
 * resolved them to mesh axes). */
void mw__trainer_placement(const mw_trainer *tr, int d, mw__placement *out);

/* Makes a forward-only trainer computing config->outputs (infer.c); params_from as above. */
mw_status mw__trainer_new_forward(mw_graph *graph, mw_mesh *mesh, const mw_trainer_config *config,
                                  mw_trainer *params_from, mw_trainer **out);

/* MW_OK when the reducers of a mesh offer what ZeRO-1 needs (reduce-scatter and all-gather for
 * the gradients' groups, all-gather among all devices); MW_ERR_UNSUPPORTED naming the reducer
 * that lacks them and the mesh otherwise. */
mw_status mw__zero1_collectives(const mw__reducer_vtable *reducer,
                                const mw__reducer_vtable *all_reducer, const char *mesh);

/* Points worker w's plan at params_from's parameter buffer (infer.c). */
mw_status mw__share_params(mw_trainer *tr, worker *w);

static inline int64_t mw__now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The address of a plan reference on worker w's device. */
static inline void *mw__ptr(worker *w, mw__ref r) { return w->bases[r.base] + r.off; }

/* executor.c: running worker w's plan. */
/* Makes w->kern and w->rebind, once w's buffers are allocated and w->bases points at them. */
mw_status mw__executor_init(worker *w);
/* The index in tr->groups of the group with that mask, or -1. */
int mw__group_index(const mw_trainer *tr, uint32_t mask);
/* Points every input view at this step's data (staging it where needed). */
mw_status mw__bind_views(worker *w);
/* Runs instructions [from, to) of the plan. */
mw_status mw__run_range(worker *w, int from, int to);
/* Advances (finish: completes) the all-reduces started and not finished. */
mw_status mw__reductions(worker *w, int finish);
/* Enters a phase; fires the injected fault when it is the armed one. */
mw_status mw__enter(worker *w, mw_phase phase);

/* update.c: the optimizer step on worker w's slice of the parameters. */
mw_status mw__update(worker *w);
/* Makes w's bf16 copy of the parameters current (a conversion of every parameter that has one,
 * when they changed since it was made: written from the host, loaded, or another program's);
 * before every command that runs the forward pass. */
mw_status mw__params16_sync(worker *w);
/* Elements of w's bf16 copy: those of the flat parameters it reads (another program's when it
 * shares them). */
static inline size_t mw__params16_elems(const worker *w) {
    const mw_trainer *from = w->tr->params_from;
    return (size_t)(from ? from->w[w->index].plan.param_elems : w->plan.param_elems);
}

/* workers.c: a worker thread's loop (arg: its worker). */
void *mw__worker_main(void *arg);
/* Ends every started worker (CMD_QUIT) and joins the threads. */
void mw__stop_workers(mw_trainer *tr);
/* Sets up how the local devices share threads (cfg.cpu_threads); MW_ERR_NOMEM. */
mw_status mw__sched_init(mw_trainer *tr);
void mw__sched_free(mw_trainer *tr);
/* The thread counts the trainer may run its `devices` local devices with, on `cores` cores, under
 * cpu_threads `setting` (MW_CPU_THREADS_PER_DEVICE for meshes whose devices cannot share
 * threads); sets threads_now to the first. */
void mw__sched_candidates(mw_trainer *tr, int devices, int cores, int setting);
/* MW_CPU_THREADS_AUTO: after a timed command of `ms` milliseconds, with `share` the calling
 * thread's time on a core over the last reading's wall time (< 0: no reading ended with this
 * command), sets tr->threads_now for the next. Touches only tr->sched and tr->threads_now. */
void mw__sched_after(mw_trainer *tr, double ms, double share);
/* Runs one command on every local worker and waits; on failure reports the root cause. */
mw_status mw__dispatch(mw_trainer *tr, cmd c);

#endif
