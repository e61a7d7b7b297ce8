/* Internal: a program, the runtime beneath the trainer and inference. A program is a copy of a
 * graph compiled once per device of a mesh (placement, one plan each), the reduction groups and
 * their communicators, a worker per local device that runs its plan, the host's hand-off of
 * commands to the workers, and the moves of parameters and outputs between the host and the
 * devices. What is built on it (the trainer's gradients, optimizer and checks; inference's
 * chunking) extends the graph before it is planned and hooks its per-device work into the
 * commands.
 *
 * Files: program.c (making and freeing, placement, groups, feeds and commands), workers.c (the
 * threads and the hand-off), executor.c (running a plan), transfer.c (parameters and outputs
 * between host and devices, split parameters' boxes, borrowed parameters), sched.c (the thread
 * count under MW_CPU_THREADS_AUTO), profile.c (per-op timings). */
#ifndef MW__PROGRAM_H
#define MW__PROGRAM_H

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
#include "meshwit/testing.h" /* mw_phase: where a step is, for messages and faults */
#include "parallel/config.h"
#include "parallel/mesh_impl.h"
#include "parallel/sched.h"

#define MAX_GROUPS 16

typedef struct mw__program mw__program;

/* A command for every local worker: CMD_FORWARD runs the forward part of the plan, CMD_BACKWARD
 * the forward and backward parts, the gradient reductions and then the after_backward hook. */
typedef enum cmd {
    CMD_NONE,
    CMD_INIT,
    CMD_FORWARD,
    CMD_BACKWARD,
    /* A pipeline stage's halves of CMD_BACKWARD, run apart with other micro-batches between them:
     * the forward part of a training pass, its activations kept in arena slot prog->slot, and
     * later the backward part (with the reductions and after_backward) from that slot. */
    CMD_FORWARD_KEEP,
    CMD_BACKWARD_REST,
    /* CMD_BACKWARD_REST in two (the zero-bubble schedule): the input gradients (the plan's
     * backward part up to bwd_split), then the weight gradients with the reductions and
     * after_backward. */
    CMD_BACKWARD_INPUT,
    CMD_BACKWARD_WEIGHT,
    /* after_backward alone (a pipeline's update once every stage has its gradients) */
    CMD_UPDATE,
    CMD_QUIT
} cmd;

/* What running one device's plan needs. */
typedef struct worker {
    mw__program *prog;
    int index;
    pthread_t thread;
    int started;
    int on_host;         /* run by the thread that calls the program, not a thread of its own */
    _Atomic uint64_t go; /* commands handed to this worker's thread (workers.c) */
    mw__event go_ev;
    mw__device dev;
    mw__plan plan;
    void *arena, *params, *grads; /* grads: with a backward part only */
    /* With prog->slots > 1: that many arenas, each the activations of one micro-batch in flight
     * (arena is the one the current command runs in). */
    void **slot_arena;
    /* plan.params16: the bf16 copy of the flat parameters that bf16 contractions read. version
     * counts the changes of this device's parameters (the optimizer's, and writes from the
     * host); version16 is the version the copy was made from (see mw__params16_sync). */
    void *params16;
    void *state; /* the program's states (plan.state_elems), or NULL */
    uint64_t version, version16;
    void *pinned; /* page-locked staging of the input shards (devices that offer it) */
    char **bases; /* per plan base: resolved address (views rebound every step) */
    /* The plan's kernels with their buffer pointers resolved (mw__executor_init); those of the
     * instructions in rebind[0 .. nrebind), which read an input in place in the caller's array,
     * are resolved again every step. */
    union mw__kernel *kern;
    int *rebind, nrebind;
    mw__comm *comm[MAX_GROUPS];
    int rank[MAX_GROUPS];
    /* Per group: which of its communicators this device belongs to (its coordinates off the
     * group's axes), set for every device of the mesh, also another process's (whose comm[] is
     * NULL here). */
    int group_class[MAX_GROUPS];
    /* With prog->zero1, a gradient bucket is reduce-scattered into the zparts slices that the
     * zparts + 1 offsets zslices cut the flat gradients into; bounds (zparts + 1) is host
     * scratch for the slices' parts of one bucket. Set and owned by the layer above. */
    const size_t *zslices;
    int zparts;
    size_t *bounds;
    uint32_t inflight; /* groups with collectives started and not finished (bit per group) */
    /* The parts of the all-gather started ahead (GATHER_START), read by the reducer until its
     * GATHER_WAIT; the plan starts the next only after that. */
    size_t gather_bounds[MW_MAX_DEVICES + 1];
    mw_status status;
    char msg[MW__MSG_SIZE];
    double reduce_ms; /* of the current command */
    mw_phase phase;   /* where the current command is, for messages */
    int fault_armed;  /* testing hook: fail at fault_phase of step fault_step */
    mw_phase fault_phase;
    int64_t fault_step;
    mw_status fault_status; /* MW_OK: a stall of fault_ms instead of a failure */
    int fault_ms;
    /* Profiling (cfg.profile): a category per instruction, and time and calls per category. */
    int *prof_cat;
    double *prof_ms;
    int64_t *prof_calls;
    int training; /* the current command trains (dropout is active) */
} worker;

/* Profile categories (profile.c): (graph op, plain or copy) in each of three phases, plus the
 * gradient all-reduce and the optimizer. */
#define MW__PROF_PER_PHASE (2 * MW__OP_COUNT + 2)
#define MW__PROF_CATS (3 * MW__PROF_PER_PHASE)
#define MW__PROF_UPDATE (2 * MW__PROF_PER_PHASE + 2 * MW__OP_COUNT + 1)
/* Points worker w's kernels at the arena of slot prog->slot (a no-op with one arena). */
void mw__executor_select_slot(worker *w);

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

/* What the layer above runs on each worker, on the worker's thread (every hook may be NULL). */
typedef struct mw__program_hooks {
    void *ctx;
    /* CMD_INIT, after the program's buffers are made and its parameters uploaded. */
    mw_status (*init)(void *ctx, worker *w);
    /* CMD_BACKWARD, after the gradients are reduced (without it: the device is synchronised). */
    mw_status (*after_backward)(void *ctx, worker *w);
    /* CMD_QUIT, before the device shuts down: frees what init made. */
    void (*quit)(void *ctx, worker *w);
} mw__program_hooks;

struct mw__program {
    mw_graph *g;         /* the program's own copy, extended by the layer above before planning */
    mw_tensor *loss;     /* the value a forward part ends with (the trainer's loss) */
    mw_tensor **grads;   /* per parameter leaf, its gradient node; NULL: no backward part */
    mw_tensor **outputs; /* in the program's graph */
    const mw_tensor **user_outputs; /* the caller's handles, same order */
    int noutputs;
    int outputs_ready; /* a command has run: the outputs hold values */
    mw_mesh *mesh;
    mw__program_config cfg;
    /* The public call that made the program ("mw_trainer_new", "mw_infer_new", ...): the
     * prefix of the errors its making reports. */
    const char *caller;
    /* What makes the outputs hold values, for the error of reading them first ("a step, eval or
     * compute_grads"); set by the layer above. */
    const char *commands;
    /* Non-NULL: this program's parameters are those of params_from's devices (same mesh), read
     * in place through its plans' rebased parameter references (mw__share_params). */
    mw__program *params_from;
    const mw__reducer_vtable *reducer;
    int mesh_axis_of[MW__MAX_MESH_NAMES]; /* graph mesh name -> mesh axis */
    group groups[MAX_GROUPS];
    int ngroups;
    mw__comm *all; /* every device: a host barrier and gathers (NULL for one device) */
    const mw__reducer_vtable *all_reducer; /* of `all`: shared memory, or across processes */
    int nworkers;                          /* devices of the mesh, all processes together */
    /* This process's workers: w[first .. first + nlocal). On a mesh spanning processes the
     * others are placeholders that are never planned or started. */
    int first, nlocal;
    /* A command failed on a mesh spanning processes: peers may still be inside a collective that
     * cannot be cancelled, so no further command may start collectives. */
    int broken;
    worker *w;
    /* Initial parameters, only during start-up: flat (init_values), or with split parameters
     * each local device's boxes in its own flat layout (init_boxes). */
    float *init_values;
    float **init_boxes;
    int sharded_params; /* some parameter is split over a mesh axis (devices' layouts differ) */
    const mw_feed **feed_of; /* the current command's feeds, by input leaf */
    /* Commands (workers.c): the host writes command and remaining, then bumps each receiving
     * worker's `go` and notifies its go_ev; the last worker done notifies `finished`. Waiters
     * spin briefly on these before sleeping on the event. */
    _Atomic int command;
    _Atomic int remaining;
    mw__event finished;
    /* Set by the layer above: the step being run (messages, fault hooks, dropout's masks) and
     * the micro-batch within it (dropout's masks). */
    int64_t steps;
    int micro;
    /* Set by the layer above before planning: nodes from forward_nodes on are the backward pass
     * (mw__plan_target.forward_nodes; 0: none told apart); and before start: how many arenas each
     * worker has (slots, 0 or 1: one), and the one the next command runs in (slot). */
    int forward_nodes;
    int split_nodes; /* mw__plan_target.split_nodes */
    int slots, slot;
    /* Set by the layer above before start: gradient buckets are reduce-scattered into each
     * device's slice (worker zslices) instead of all-reduced (ZeRO-1). */
    int zero1;
    mw_step_stats stats; /* of the last command (update_ms: the layer above's) */
    int blas_prev;
    /* The backend's thread hook that blas_prev restores (a program may free the mesh first). */
    int (*set_threads)(int n);
    int64_t spin_ns; /* how long host and workers spin before they sleep (collectives/wait.h) */
    /* How many threads run the local devices (workers.c, cpu_threads): all of them, one each,
     * or fewer, each running a contiguous block of devices as a gang. gangs[k] (ngangs of them;
     * none when the devices cannot share threads: not every device a CPU device of this
     * process, or pinned) runs block k with the tasks gang_args; wake is the event their
     * communicators notify. sched.threads_now is the count the next command runs with,
     * run_threads the count the current (or last) one ran with. */
    struct mw__gang **gangs;
    int ngangs;
    void **gang_args;
    mw__event wake;
    int run_threads;
    mw__sched sched;
    mw__program_hooks hooks;
};

/* ---- program.c ---- */

/* Makes a program over `mesh` from a copy of `graph` (the caller checked both); params_from: see
 * above. Then the layer above extends p->g, calls mw__program_outputs and mw__program_plan,
 * sets what it runs on the workers up and calls mw__program_start. */
mw_status mw__program_new(const mw_graph *graph, mw_mesh *mesh, const mw__program_config *cfg,
                          mw__program *params_from, const char *caller, mw__program **out);
/* The values the host reads (n of the caller's tensors of the graph the program copied,
 * checked), then the precision policy applied to the graph. */
mw_status mw__program_outputs(mw__program *p, mw_tensor *const *outputs, int n);
/* One more value the host reads, of the program's own graph (a gradient autodiff made: after
 * mw__program_outputs), all-reduced first where it is partial (replicate) or read per device as
 * each holds it; *handle is what mw__program_read_output reads it by. */
mw_status mw__program_add_output(mw__program *p, mw_tensor *t, int replicate,
                                 const mw_tensor **handle);
/* Places the graph on the mesh and plans it per local device, up to `loss` (forward part) and,
 * with grads (borrowed, per parameter leaf), the gradients (backward part); makes the
 * reduction groups and the initial parameters. */
mw_status mw__program_plan(mw__program *p, mw_tensor *loss, mw_tensor **grads);
/* Starts the workers with these hooks (copied; NULL: none) and makes their buffers. */
mw_status mw__program_start(mw__program *p, const mw__program_hooks *hooks);
/* Stops the workers and frees everything (NULL: no-op). */
void mw__program_free(mw__program *p);
/* How device d of the mesh sits along each of the graph's mesh names. */
void mw__program_placement(const mw__program *p, int d, mw__placement *out);
/* Checks the feeds of the next command against the graph's inputs and keeps them (borrowed until
 * it has run); MW_ERR_STATE once a failed command broke a program spanning processes. */
mw_status mw__program_feed(mw__program *p, const mw_feed *feeds, int nfeeds);
/* Runs command c with these feeds (mw__program_feed, mw__dispatch); then the outputs hold its
 * values. */
mw_status mw__program_run(mw__program *p, cmd c, const mw_feed *feeds, int nfeeds);

/* ---- transfer.c ---- */

/* Non-zero when some axis of parameter p is split over a mesh axis. */
int mw__param_sharded(const mw_tensor *p);
/* Device d's box of a tensor of type t (a parameter, an output). */
void mw__type_box(const mw__program *p, int d, const mw__type *t, mw__box *out);
/* Copies the box's elements [from, to) (counted row-major within the box) between `local`
 * (which holds exactly those elements) and the whole array `global`; to_global chooses the
 * direction. */
void mw__box_copy(const mw__box *b, int64_t from, int64_t to, float *local, float *global,
                  int to_global);

/* Which values of a parameter a transfer moves, and where each device holds them: `range` sets
 * the flat range [*lo, *hi) of slot s that worker w holds (empty when none) and returns the
 * address of its first element. params: they are the parameters (a write makes the bf16 copy
 * out of date). */
typedef struct mw__holding {
    char *(*range)(void *ctx, const worker *w, const mw__param_slot *s, int64_t *lo, int64_t *hi);
    void *ctx;
    int params;
    /* The devices hold slices of their flat layouts (ZeRO-1's gradients and moments), not whole
     * boxes: with sharded parameters those slices lie in other processes too. */
    int sliced;
} mw__holding;
/* The parameters themselves: every device holds its whole box. */
extern const mw__holding mw__held_params;

/* Moves the held values of parameter t between the whole host array `global` (numel of t's
 * global type) and this process's devices: write scatters every device's box into it (every
 * process passes the same array); read gathers the boxes from as few devices as hold all of
 * them (mw__param_reader). A part that is one run of the whole array moves directly, without a
 * host copy. On a mesh spanning processes, a read of values some process does not hold whole
 * (mw__param_gathered) also receives the other processes' parts: a collective call, which
 * every process makes for the same parameters in the same order. */
mw_status mw__param_transfer(mw__program *p, const mw_tensor *t, const mw__holding *h,
                             float *global, int write);
/* Whether reading t's values held as h needs the other processes' parts (the same answer in
 * every process): t split over mesh axes that cross processes, or h sliced (ZeRO-1) with
 * sharded parameters, on a mesh spanning processes. */
int mw__param_gathered(const mw__program *p, const mw_tensor *t, const mw__holding *h);
/* Whether devices d and e (of any process) hold the same box of t. */
int mw__same_box(const mw__program *p, int d, int e, const mw_tensor *t);
/* Whether device d (of any process) is the first device of the mesh holding its box of t: the
 * devices for which this holds hold every element of t once. */
int mw__param_box_first(const mw__program *p, int d, const mw_tensor *t);
/* The first of this process's devices (d itself when no earlier one) holding the same part of
 * parameter t's held values as device d: the same box of t and the same flat range. */
int mw__param_holder(const mw__program *p, int d, const mw_tensor *t, const mw__holding *h);
/* Device d holds some of t's held values and is their holder: reading each such device once
 * gathers the whole tensor. */
int mw__param_reader(const mw__program *p, int d, const mw_tensor *t, const mw__holding *h);
/* Writes the initial values of every local device's boxes of every parameter into
 * dst[d - first] (that device's flat parameter layout), drawing each parameter whole once, as a
 * single device would; on a mesh spanning processes, rank 0's values (broadcast whole, one
 * parameter at a time: a collective call). */
mw_status mw__param_init_boxes(const mw__program *p, float *const *dst);

/* The parameter called name, whose whole tensor must have count elements. */
mw_status mw__program_find_param(const mw__program *p, const char *name, int64_t count,
                                 const mw_tensor **param);
/* Reads (write 0) or writes parameter `name` as a whole host array of count elements. */
mw_status mw__program_param(mw__program *p, const char *name, float *data, int64_t count,
                            int write);
/* The profile of this process's devices since the last reset, one row per category that ran,
 * slowest first (profile.c; mw_trainer_profile's rows and count); the reset zeroes it. Only for a
 * program made with cfg.profile. */
void mw__program_profile(const mw__program *p, mw_profile_row *rows, int capacity, int *count);
void mw__program_profile_reset(mw__program *p);

/* Copies output `output` (one of the caller's) of the last command into dst (count elements);
 * errors are prefixed with `caller`, the public call reading it. */
mw_status mw__program_read_output(mw__program *p, const char *caller, const mw_tensor *output,
                                  float *dst, int64_t count);
/* Rebases the parameter references of w's plan onto params_from's layout. */
mw_status mw__share_params(mw__program *p, worker *w);
/* Makes w's bf16 copy of the parameters current (a conversion of every parameter that has one,
 * when they changed since it was made: written from the host, loaded, or another program's);
 * before every command that runs the forward pass. */
mw_status mw__params16_sync(worker *w);
/* Converts the parameters of [lo, hi) that have a bf16 copy into it. */
mw_status mw__params16_refresh(worker *w, int64_t lo, int64_t hi);
/* Elements of w's bf16 copy: those of the flat parameters it reads (another program's when it
 * borrows them). */
static inline size_t mw__params16_elems(const worker *w) {
    const mw__program *from = w->prog->params_from;
    return (size_t)(from ? from->w[w->index].plan.param_elems : w->plan.param_elems);
}

/* weights.c: safetensors files of a program's parameters (see mw_trainer_save_weights). */
mw_status mw__program_save_weights(mw__program *p, const char *path, const mw_weight_name *names,
                                   int nnames);
mw_status mw__program_load_weights(mw__program *p, const char *path, const mw_weight_name *names,
                                   int nnames);

static inline int64_t mw__now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The address of a plan reference on worker w's device. */
static inline void *mw__ptr(worker *w, mw__ref r) { return w->bases[r.base] + r.off; }

/* ---- executor.c: running worker w's plan ---- */

/* Makes w->kern and w->rebind, once w's buffers are allocated and w->bases points at them. */
mw_status mw__executor_init(worker *w);
/* The index in p->groups of the group with that mask, or -1. */
int mw__group_index(const mw__program *p, uint32_t mask);
/* Points every input view at this step's data (staging it where needed). */
mw_status mw__bind_views(worker *w);
/* Runs instructions [from, to) of the plan. */
mw_status mw__run_range(worker *w, int from, int to);
/* Advances (finish: completes) the all-reduces started and not finished. */
mw_status mw__reductions(worker *w, int finish);
/* Enters a phase; fires the injected fault when it is the armed one. */
mw_status mw__enter(worker *w, mw_phase phase);

/* ---- workers.c ---- */

/* A worker thread's loop (arg: its worker). */
void *mw__worker_main(void *arg);
/* Starts a thread for every local worker but the one the host runs. */
mw_status mw__start_workers(mw__program *p);
/* Ends every started worker (CMD_QUIT) and joins the threads. */
void mw__stop_workers(mw__program *p);
/* Sets up how the local devices share threads (cfg.cpu_threads); MW_ERR_NOMEM. */
mw_status mw__gangs_init(mw__program *p);
void mw__gangs_free(mw__program *p);
/* Runs one command on every local worker and waits; on failure reports the root cause. */
mw_status mw__dispatch(mw__program *p, cmd c);

#endif
