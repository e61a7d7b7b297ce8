/* Internal: the trainer's state, shared by its files (trainer.c: the public API; trainer_build.c:
 * construction; optimizer.c: the optimizer's state and step on each device; consistency.c and
 * checkpoint.c: checks between replicas, saving and restoring). A trainer is a program
 * (parallel/program.h) whose graph it extends with the backward pass, plus the optimizer. */
#ifndef MW__TRAINER_IMPL_H
#define MW__TRAINER_IMPL_H

#include <stdatomic.h>
#include <stdint.h>

#include "collectives/reducer.h"
#include "collectives/wait.h"
#include "core/error.h"
#include "core/graph_impl.h"
#include "core/plan.h"
#include "meshwit.h"
#include "parallel/program.h"

/* What the trainer runs after a backward pass (tr->train). */
typedef enum mw__train { TRAIN_GRADS, TRAIN_STEP, TRAIN_ACCUM } mw__train;

/* A pipeline stage's trainer (parallel/pipeline.c): its graph is one stage of a model, so its
 * backward pass also starts from the gradients the next stage sends back (seeds[i], an input of
 * the graph, for value seed_of[i]) and also gives the gradients of the values the stage before
 * sent (wrt[i]); the nodes are the caller's graph's. slots: micro-batches in flight, each with
 * an arena of its own. */
typedef struct mw__trainer_stage {
    int nseeds, nwrt, slots;
    mw_tensor *const *seed_of, *const *seeds, *const *wrt;
    /* Parameters that are another stage's (a tied weight's copy): each device's share of their
     * gradient is read (tr->share_out, raw: not summed over the devices) and they get none of
     * their own (the other stage updates them and their values are copied here). A parameter
     * split over a mesh axis (FSDP) is named by its GATHER node: the share is the gradient of
     * the gathered whole, before its reduce-scatter. */
    int nshares;
    mw_tensor *const *share_of;
    /* Non-zero: the backward part in two, the input gradients (what the wrts' gradients and the
     * shares need) before the weight gradients (mw__trainer_backward_input, _weight). */
    int split_weights;
} mw__trainer_stage;

/* The trainer's part of one device: its optimizer state and its slice of the parameters. */
typedef struct replica {
    mw_trainer *tr;
    worker *w;
    /* AdamW: m then v; SGD with momentum: its buffer. Each covers this device's slice
     * [own_lo, own_hi) of the flat parameters: all of them, or with ZeRO-1 its own slice. */
    void *moments;
    int64_t own_lo, own_hi;
    /* With sharded parameters the zparts + 1 offsets that cut this device's own flat layout
     * (worker zslices points at them; else at tr->slices). */
    size_t *zslices_own;
    void *accum;    /* gradient accumulation: the sum of the accumulated micro-batches' gradients of
                     * [own_lo, own_hi) */
    mw__sqacc *acc; /* device: the exact sum of squares of the gradient elements this device adds
                     * to the norm */
    mw__sqacc *accs;  /* host: every device's, gathered (nworkers) */
    double update_ms; /* of the current command */
    int skipped;      /* the current step skipped its update (MW_NONFINITE_SKIP) */
} replica;

struct mw_trainer {
    mw__program *prog; /* its graph: the trainer's own copy, extended with the backward pass */
    mw_tensor *loss;
    mw_tensor **grads;
    mw_trainer_config cfg;
    replica *rep;    /* per device of the mesh (prog->nworkers) */
    mw__train train; /* what the current backward command runs after the gradients */
    float step_lr;   /* for the step being run */
    float grad_norm; /* of the last step */
    /* parallel/consistency.c: a stop requested for this trainer, steps skipped for non-finite
     * values, and host scratch for the replica checksums (made when first needed). */
    _Atomic int stop;
    int64_t skipped;
    float *replica_buf;
    uint64_t *replica_sums;
    unsigned char *decays; /* per parameter leaf: weight decay applies */
    float host_lr;         /* >= 0: set by mw_trainer_set_lr, in place of the schedule */
    int accumulated;       /* micro-batches in the accumulator since the last update */
    int grads_ready;       /* a step or compute_grads has left all-reduced gradients */
    /* The flat parameters cut into one slice per device of the mesh (nworkers + 1 offsets,
     * mw__slice_lo): the gradient norm adds one partial per slice, and with ZeRO-1
     * (prog->zero1, on a mesh of several devices) device d keeps optimizer state and updates
     * only for slice d. */
    size_t *slices;
    /* ZeRO-1 with sharded parameters: the reduction group whose devices share optimizer state
     * (without them the group spans the mesh). */
    int zero_group;
    /* A pipeline stage's (mw__trainer_new_stage): what it was made with (only during
     * construction), and the handles of its wrt gradients (stage->nwrt). */
    const mw__trainer_stage *stage;
    const mw_tensor **wrt_out, **share_out;
    /* A pipeline stage's update (mw__trainer_update): the gradients are the accumulator's mean
     * alone (every micro-batch was accumulated), and the norm that clipping and the finiteness
     * check use is the whole model's, which global_norm makes of this stage's (called on every
     * device, with its index; it may wait for the other stages). */
    int fold_only;
    float (*global_norm)(void *ctx, int device, float norm);
    void *global_norm_ctx;
    /* A trainer made with mw_trainer_config.pipeline_axis: the pipeline it is (prog is then
     * NULL and every public call goes to the pipeline or is refused). */
    mw_pipeline *pipe;
    /* With pipe: the trainer of device `device`'s first stage and the device's index there
     * (NULL for a device outside the mesh), for the runtime's fault hooks (testing.c), which
     * sit beneath the pipeline. */
    mw_trainer *(*stage_of_device)(const mw_trainer *tr, int device, int *local);
};

/* The calls a pipeline's trainer does not offer: MW_ERR_UNSUPPORTED naming the call. */
#define MW__NOT_PIPELINED(tr, fn)                                                                  \
    do {                                                                                           \
        if ((tr) && (tr)->pipe)                                                                    \
            return mw__error(MW_ERR_UNSUPPORTED,                                                   \
                             fn ": a pipeline's trainer (mw_trainer_config.pipeline_axis) does "   \
                                "not offer it yet");                                               \
    } while (0)

/* mw_trainer_new for a stage: on a mesh of this process only. tr->wrt_out[i] is then the handle
 * that mw__program_read_output reads wrt[i]'s gradient by, or NULL where the loss and the seeds
 * do not depend on it through a parameter. */
mw_status mw__trainer_new_stage(mw_graph *graph, mw_tensor *loss, mw_mesh *mesh,
                                const mw_trainer_config *config, const mw__trainer_stage *stage,
                                mw_trainer **out);
/* The forward part of micro-batch `micro`'s training pass, its activations kept in arena `slot`
 * until mw__trainer_backward_rest of the same slot, which runs the backward part with the same
 * feeds (and the seeds' now) and accumulates its gradients (mw__trainer_update then updates). */
mw_status mw__trainer_forward_keep(mw_trainer *tr, int slot, int micro, const mw_feed *feeds,
                                   int nfeeds);
mw_status mw__trainer_backward_rest(mw_trainer *tr, int slot, int micro, const mw_feed *feeds,
                                    int nfeeds, float *loss);
/* With stage->split_weights: mw__trainer_backward_rest in two, the input gradients (then the
 * wrts' gradients and the shares can be read) and later the weight gradients, which
 * accumulates. */
mw_status mw__trainer_backward_input(mw_trainer *tr, int slot, int micro, const mw_feed *feeds,
                                     int nfeeds);
mw_status mw__trainer_backward_weight(mw_trainer *tr, int slot, int micro, const mw_feed *feeds,
                                      int nfeeds, float *loss);
/* The update of a pipeline stage whose step's micro-batches were all accumulated:
 * with the mean of their gradients, as mw_trainer_step after mw_trainer_accumulate (the same
 * sums in the same order), the norm from tr->global_norm. */
mw_status mw__trainer_update(mw_trainer *tr);

/* MW_OK when the reducers of a mesh offer what ZeRO-1 needs (reduce-scatter and all-gather for
 * the gradients' groups, all-gather among all devices); MW_ERR_UNSUPPORTED naming the reducer
 * that lacks them and the mesh otherwise. */
mw_status mw__zero1_collectives(const mw__reducer_vtable *reducer,
                                const mw__reducer_vtable *all_reducer, const char *mesh);

#endif
