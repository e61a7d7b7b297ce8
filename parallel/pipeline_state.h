/* Internal: a pipeline's state (meshwit/pipeline.h), shared by its files: pipeline.c (making,
 * freeing, parameters), pipeline_cut.c (the graph cut into stages), pipeline_run.c (a step). */
#ifndef MW__PIPELINE_STATE_H
#define MW__PIPELINE_STATE_H

#include <pthread.h>

#include "collectives/dist.h"
#include "core/error.h"
#include "core/graph_impl.h"
#include "meshwit.h"
#include "meshwit/pipeline.h"
#include "parallel/mesh_impl.h"
#include "parallel/pipeline_schedule.h"

/* A value stage s sends on: its node in s's graph, where it goes, and per micro-batch its value
 * (held here) and the gradient that comes back (held by the reader). */
typedef struct pipe_out {
    mw_tensor *node;      /* in the stage's graph (one of its trainer's outputs) */
    mw_tensor *seed;      /* the input its gradient is fed through */
    int src;              /* the node of the whole graph it is */
    int reader, in;       /* the stage that reads it (-1 until built), its boundary input there */
    int64_t count;        /* elements (f32) */
    float **value;        /* [micro] */
    unsigned char *ready; /* [micro]: value written */
} pipe_out;

/* A value stage t reads from an earlier stage, and its gradient going back. */
typedef struct pipe_in {
    mw_tensor *node; /* the input (or its last shard) in t's graph: a wrt of its trainer */
    int from, out;   /* the stage and which of its pipe_outs */
    int64_t count;
    float **grad;         /* [micro] */
    unsigned char *ready; /* [micro]: grad written */
} pipe_in;

typedef struct norm_ctx {
    struct mw_pipeline *p;
    int stage;
} norm_ctx;

/* A parameter read by two stages (tied embeddings): the earlier one (owner) holds it, the later
 * one a copy (shadow) whose gradient, per micro-batch and per device, is the owner's seed, added
 * first, as the whole graph's backward pass adds the later reader's part first. After the update
 * the owner's value is copied into the shadow. */
typedef struct tied_param {
    int node; /* the parameter in the whole graph */
    int via;  /* split over a mesh axis (FSDP): its one reader, the GATHER that makes it whole,
                 whose gradient (before the reduce-scatter) the shares are; else -1 */
    int owner, other;
    int64_t count;        /* elements */
    int shares;           /* devices of a stage: one gradient share each */
    mw_tensor *seed;      /* in the owner's graph */
    mw_tensor *held;      /* the parameter in the owner's graph */
    mw_tensor *shadow;    /* the parameter in the other's graph */
    float **share;        /* [micro]: shares x count */
    unsigned char *ready; /* [micro] */
    float *value;         /* host copy for the shadow's refresh */
} tied_param;

#define MAX_TIED 8

/* How a stage's graph input is fed. */
typedef enum { FEED_USER, FEED_VALUE, FEED_SEED, FEED_TIED } feed_kind;
typedef struct stage_feed {
    feed_kind kind;
    int index;     /* FEED_USER: the user's input leaf; else the pipe_in / pipe_out */
    int64_t count; /* elements per micro-batch */
    int64_t esize; /* bytes per element */
} stage_feed;

typedef struct stage {
    mw_graph *g;
    mw_mesh mesh; /* the devices of its coordinate, the other axes */
    mw_trainer *tr;
    int device, first_region, nregions;
    int64_t parameters;
    int nout, nin;
    pipe_out *out;
    pipe_in *in;
    int nfeeds;
    stage_feed *feed;
    mw_feed *feeds;      /* handed to the trainer */
    int slots, *slot_of; /* slot_of[micro]: its arena while in flight */
    unsigned char *slot_busy;
    int max_in_flight;
    float *losses;              /* [micro] (last stage) */
    double busy_ms, part_ms[3]; /* the last step's: all, and F, B, W apart */
    norm_ctx norm;              /* its trainer's global_norm_ctx */
    int proc;                   /* the process holding its devices; tr is NULL in the others */
    int chan;                   /* its first channel between processes (pipeline_link.c) */
} stage;

struct mw_pipeline {
    mw_graph *g;
    mw_mesh *mesh;
    int P, V, S, M;
    mw_pipeline_schedule kind;
    mw__pipe_schedule sched;
    stage *st;
    float *zeros;            /* the seeds' feed during a forward part (not read) */
    const mw_feed **user_of; /* this step's user feeds, by input leaf */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    mw_status failed;
    char msg[MW__MSG_SIZE];
    /* Global gradient norm of the update (global_norm): per stage its norm, and how many posted. */
    float *norms;
    int nposted;
    int64_t norm_round, round_now;
    double *idle;
    int stepped;
    const int *region_stage; /* the configuration's, during mw_pipeline_new */
    int ntied;
    tied_param tied[MAX_TIED];
    double step_ms; /* the last step's */
    /* Across processes (pipeline_link.c): this process, how many stages it holds, the link, the
     * channels (2 per boundary value, 2 per tied parameter), the step's messages sent and
     * received per channel, its sends in flight, and whether it told the others it failed. */
    int nprocs, proc, nlocal;
    int timeout_ms;
    mw__dist_link *link;
    int nchan, tied_chan;
    int *sent, *recvd;
    mw__dist_send **sends;
    int nsends, cap_sends;
    int abort_sent;
    float *loss_buf; /* [M]: the last stage's losses, in every process */
};

/* Whether stage s runs in this process. */
static inline int mw__pipe_local(const mw_pipeline *p, int s) { return p->st[s].proc == p->proc; }

/* ---- cutting (pipeline_cut.c) ---- */

typedef struct mw__pipe_cut {
    int *node_stage;   /* -1: free */
    uint64_t *needed;  /* free nodes: the stages that read them (bit per stage) */
    uint64_t *readers; /* placed nodes: the stages of the placed nodes that read them */
} mw__pipe_cut;

/* Places every node of p->g: the regions cut into p->S stages (p->region_stage, or balanced by
 * cost), the free nodes, the tied parameters (p->tied). cs is freed by mw__pipe_cut_free. */
mw_status mw__pipe_cut_graph(mw_pipeline *p, const mw_tensor *loss, mw__pipe_cut *cs);
void mw__pipe_cut_free(mw__pipe_cut *cs);
/* Builds stage s's graph: its nodes and the free nodes it reads, values of earlier stages as
 * inputs, seeds for the values later stages read, and its loss (the graph's on the last stage,
 * a constant 0 elsewhere: only the seeds start its backward pass). map: scratch of p->g->nnodes;
 * user_leaf_of_input[leaf of an input of the stage] = the leaf of the whole graph's input. */
mw_status mw__pipe_build_stage(mw_pipeline *p, const mw_tensor *loss, const mw__pipe_cut *cs, int s,
                               int axis, mw_tensor **map, mw_tensor **stage_loss,
                               int *user_leaf_of_input);

/* ---- what crosses stages (pipeline_link.c) ----
 * Between stages of this process: host buffers and ready flags. Between processes: messages of
 * the link, one channel per boundary value and direction and per tied parameter and direction
 * (matched in micro-batch order), and the collectives that make every process agree. Each
 * returns MW_OK or a failure recorded with mw__pipe_fail. */

/* Records the step's first failure (stage s, in `what`), wakes the waiting threads and tells
 * the other processes; returns st. */
mw_status mw__pipe_fail(mw_pipeline *p, mw_status st, int s, const char *what);
/* The link, channels and counters (every process calls it at once); freed by _close. */
mw_status mw__pipe_link_open(mw_pipeline *p);
void mw__pipe_link_close(mw_pipeline *p);
/* Before a step's (or an evaluation's) schedule: flags and counters cleared. */
void mw__pipe_link_begin(mw_pipeline *p);
/* After stage s's forward part of micro-batch m: its values go to their readers. Before stage
 * t's: its inputs' values are there. */
mw_status mw__pipe_values_out(mw_pipeline *p, int s, int m);
mw_status mw__pipe_values_in(mw_pipeline *p, int t, int m);
/* After stage t's backward (input) part of m: its inputs' gradients and its tied shares go back.
 * Before stage s's: the gradients of its values and the shares of what it owns are there. */
mw_status mw__pipe_grads_out(mw_pipeline *p, int t, int m);
mw_status mw__pipe_grads_in(mw_pipeline *p, int s, int m);
/* After the schedule, in every process: the step's status agreed (the first failure anywhere,
 * its message in p->msg), every message sent received or drained, every send completed. */
mw_status mw__pipe_link_settle(mw_pipeline *p, mw_status st);
/* The statuses of a phase every process ran (the update): the first failure anywhere, its
 * message, and how many processes succeeded (*ok_procs). */
mw_status mw__pipe_link_agree(mw_pipeline *p, mw_status st, const char *msg, char *out, size_t size,
                              int *ok_procs);
/* Every stage's norm in p->norms from the processes holding them (a collective). */
mw_status mw__pipe_link_norms(mw_pipeline *p);
/* The last stage's M losses into every process's buf (a collective). */
mw_status mw__pipe_link_losses(mw_pipeline *p, float *buf);
/* n bytes of buf, from process root into every process's buf (a collective). */
mw_status mw__pipe_link_bcast(mw_pipeline *p, int root, void *buf, size_t n, const char *what);
/* After an update: every tied parameter's updated value from its owner into its copy. */
mw_status mw__pipe_link_tied(mw_pipeline *p);

/* ---- running (pipeline_run.c) ---- */

/* A stage trainer's global_norm: the whole model's norm from every stage's. */
float mw__pipe_global_norm(void *ctx, int device, float norm);
/* Checks a step's feeds (every input once, M micro-batches of it) and keeps them by input leaf. */
mw_status mw__pipe_check_feeds(mw_pipeline *p, const mw_feed *feeds, int nfeeds,
                               const char *caller);
/* The stage's feeds for micro-batch m; seeds from the readers' gradients (backward) or zeros. */
void mw__pipe_stage_feeds(mw_pipeline *p, stage *sg, int m, int backward);

#endif
