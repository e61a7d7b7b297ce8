/* meshwit: trainers.
 *
 * A trainer compiles a graph once for every device of a mesh (autodiff, SPMD collectives, buffer
 * planning; all memory is allocated here), starts one worker thread per device (except the first
 * of a mesh of CPU devices in one process, which runs on the thread that calls the trainer), and
 * then runs steps: each step splits the host batch over the sharded axes, runs forward and
 * backward on every device, all-reduces the gradients in a fixed order and updates every replica
 * identically. meshwit allocates no memory in a step; oneDNN, where the CPU backend runs a
 * contraction on it, allocates inside each of its calls (the README says how much).
 *
 * Thread-safety: one trainer is driven from one host thread at a time. Different trainers are
 * independent. */
#ifndef MESHWIT_TRAINER_H
#define MESHWIT_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include "graph.h"
#include "mesh.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mw_optimizer_kind {
    MW_SGD = 0,  /* p -= lr * grad, with optional momentum, Nesterov and L2 weight decay */
    MW_ADAMW = 1 /* Adam with decoupled weight decay */
} mw_optimizer_kind;

/* Which parameters weight decay applies to, when mw_optimizer.decays is NULL. */
typedef enum mw_decay_rule {
    /* Parameters of rank >= 2 that are not biases, where a bias is a parameter whose every use
     * is an addition (through renames, splits, shards, broadcasts and casts): so a multi-head
     * bias [Part, Head, HeadDim] is not decayed, as nanoGPT's and llm.c's 1-D biases are not;
     * matrices and tables looked up with mw_embedding are; but so is not a table only ever added
     * to activations (x + wpe over the whole context): it counts as a bias. */
    MW_DECAY_MATRICES = 0,
    /* nanoGPT's rule (which PyTorch users carry over): every parameter of rank >= 2, a
     * multi-axis bias and an added position table too. */
    MW_DECAY_RANK2 = 1
} mw_decay_rule;

/* The optimizer and its learning-rate schedule. Every field means what it says: 0 is zero (a
 * beta1 of 0 is Adam without first-moment averaging, a weight_decay of 0 no decay). Start from
 * MW_ADAMW_INIT(lr) / MW_SGD_INIT(lr) (or mw_optimizer_defaults), which give PyTorch's defaults
 * (AdamW: beta1 0.9, beta2 0.999, eps 1e-8, no weight decay: unlike torch.optim.AdamW, whose
 * weight_decay defaults to 0.01), and change fields from there. Fields a kind does not use are
 * ignored. mw_trainer_new refuses a value outside the range written beside it with
 * MW_ERR_INVALID and a message naming the field, so a plain {.kind = MW_ADAMW, .lr = 1e-3f}
 * (eps 0) is refused, not run with other values than it says. The update rules are PyTorch's
 * (torch.optim.SGD and torch.optim.AdamW), applied to the gradient after clipping:
 *   SGD:   g += weight_decay * p (decayed parameters only); with momentum, buf = g on the first
 *          step, buf = momentum * buf + (1 - dampening) * g after, and g = g + momentum * buf
 *          (Nesterov) or g = buf; then p -= lr * g.
 *   AdamW: p -= lr * weight_decay * p (decayed parameters only), then the Adam step. */
typedef struct mw_optimizer {
    mw_optimizer_kind kind;
    float lr;           /* peak learning rate, >= 0 */
    float beta1, beta2; /* AdamW moment decay rates in [0, 1) */
    float eps;          /* AdamW denominator term, > 0 (with 0 an element whose gradient has
                           always been 0 would be 0 / 0) */
    float weight_decay; /* >= 0; AdamW: decoupled; SGD: L2 added to the gradient */
    float grad_clip;    /* >= 0; > 0: scale gradients so their global L2 norm is at most this */
    int warmup_steps;   /* >= 0; lr rises linearly over the first warmup_steps steps */
    int decay_steps;    /* >= 0; > 0: cosine decay from lr (at warmup_steps) to
                           lr * min_lr_ratio by this step */
    float min_lr_ratio; /* in [0, 1] */
    float momentum;     /* SGD: in [0, 1] */
    float dampening;    /* SGD: in [0, 1] */
    int nesterov;       /* SGD: non-zero for Nesterov momentum (needs momentum > 0, dampening 0) */
    mw_decay_rule decay_rule; /* which parameters decay, when decays is NULL */
    /* Which parameters weight decay applies to, instead of decay_rule: called once per parameter
     * by mw_trainer_new with its name and rank (and decay_user), non-zero to decay it.
     * mw_trainer_param_info (weights.h) says what was decided for each parameter. */
    int (*decays)(const char *name, int rank, void *decay_user);
    void *decay_user;
} mw_optimizer;

/* Initialisers with PyTorch's defaults (torch.optim.AdamW without its weight decay, and
 * torch.optim.SGD), for a declaration or a configuration's .optimizer:
 *   mw_trainer_config c = {.optimizer = MW_ADAMW_INIT(3e-4f)};  c.optimizer.weight_decay = 0.1f; */
#define MW_ADAMW_INIT(lr_)                                                                         \
    { .kind = MW_ADAMW, .lr = (lr_), .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f }
#define MW_SGD_INIT(lr_)                                                                           \
    { .kind = MW_SGD, .lr = (lr_) }

/* The optimizer of `kind` with lr 1e-3 and every other field as MW_ADAMW_INIT / MW_SGD_INIT set
 * them: a starting point to change fields of. Another kind gets MW_SGD_INIT's fields with that
 * kind, which mw_trainer_new refuses (MW_ERR_INVALID naming optimizer.kind). */
mw_optimizer mw_optimizer_defaults(mw_optimizer_kind kind);

/* What contractions and attention compute in (mw_trainer_config.precision). */
typedef enum mw_precision {
    MW_PRECISION_FP32 = 0, /* everything in f32 */
    MW_PRECISION_BF16 = 1  /* contractions and attention in bf16, summed in f32 (see below) */
} mw_precision;

/* Which activations of the graph's regions (mw_region_begin in graph.h) the backward pass
 * computes again instead of keeping them from forward (mw_trainer_config.recompute). */
typedef enum mw_recompute {
    MW_RECOMPUTE_NONE = 0,   /* every activation is kept for backward */
    MW_RECOMPUTE_BLOCKS = 1, /* a region's outputs are kept, the rest recomputed */
    MW_RECOMPUTE_DOTS = 2    /* as BLOCKS, but contraction outputs are kept too (jax's
                                checkpoint_dots) */
} mw_recompute;

/* Where a process's CPU workers run (mw_trainer_config.pin_threads). */
typedef enum mw_pinning {
    MW_PIN_NONE = 0, /* never pinned: the scheduler moves them (the default) */
    MW_PIN_CORES = 1 /* each worker on its own core, where the process may use enough cores */
} mw_pinning;

/* When FSDP gathers a sharded parameter (mw_trainer_config.gathers). */
typedef enum mw_gathers {
    MW_GATHERS_AHEAD = 0, /* started one parameter ahead, waited for where it is used */
    MW_GATHERS_AT_USE = 1 /* run where the parameter is used, nothing in flight */
} mw_gathers;

/* What a step with a non-finite loss or gradient does (mw_trainer_config.nonfinite). */
typedef enum mw_nonfinite {
    /* The step fails with MW_ERR_NONFINITE, naming the step and the loss or the first parameter
     * whose gradient is not finite; nothing is updated. The default: a run never trains on NaN
     * silently. It costs one pass over the gradients where nothing else computes their norm (SGD
     * without clipping; AdamW and clipping compute it anyway). */
    MW_NONFINITE_STOP = 0,
    /* The step is skipped: parameters, optimizer moments and the step count stay as they were,
     * the step returns MW_OK and mw_trainer_skipped_steps counts it, as mixed-precision loss
     * scaling needs. */
    MW_NONFINITE_SKIP = 1,
    /* Nothing is checked: the update uses whatever the gradients hold. */
    MW_NONFINITE_IGNORE = 2
} mw_nonfinite;

/* The order in which each device runs the forward and backward parts of the micro-batches. */
typedef enum mw_pipeline_schedule {
    /* Every forward first, then every backward: activations of all M micro-batches in flight. */
    MW_SCHEDULE_GPIPE = 0,
    /* One forward, one backward (PipeDream-flush, Megatron's default): stage s keeps at most
     * P - s micro-batches' activations; the same idle time as GPipe. */
    MW_SCHEDULE_1F1B = 1,
    /* 1F1B over virtual stages (virtual_stages per device, Megatron's interleaving): the idle
     * time divided by about virtual_stages, for more transfers. M must be a multiple of P. */
    MW_SCHEDULE_INTERLEAVED = 2,
    /* ZB-H1: each stage's backward part in two, the input gradients the stage before waits for
     * (B) and the weight gradients (W), the W's placed where 1F1B would leave the device idle
     * (Qi et al., 2023): about a third of 1F1B's idle time when F, B and W take alike. */
    MW_SCHEDULE_ZERO_BUBBLE = 3
} mw_pipeline_schedule;

typedef struct mw_trainer_config {
    mw_optimizer optimizer;
    /* --- every program's options (mw_infer_config has them too) --- */
    /* MW_PRECISION_BF16: mixed precision with no change to the model, as PyTorch's CPU autocast.
     * Every contraction (mw_dot, mw_contract) of two f32 tensors, and every mw_attention, reads
     * bf16 roundings of its operands (mw_cast) and sums its products in f32: its result is f32,
     * as is every other op's. The master parameters, their gradients, the gradient all-reduce
     * and the optimizer state stay f32; the optimizer writes the bf16 copy of each parameter a
     * contraction reads as it updates it. An activation a bf16 contraction reads is written in
     * bf16 by the kernel that makes it, and kept so for the backward pass (a layer norm's output,
     * an attention's). Gradients are rounded to bf16 only where a contraction multiplies them
     * (the gradients reaching a parameter are summed in f32). bf16 has f32's exponent range, so
     * no loss scaling is needed; nonfinite = MW_NONFINITE_SKIP skips a step that overflowed. On a
     * CPU the products run on its bf16 instructions (AMX, AVX512-BF16) where it has them, and on
     * its f32 units otherwise (exactly the same products, slower); on GPUs on tensor cores. Sharded
     * runs equal one device's to float tolerance and repeat bitwise per mesh, as in f32.
     * MW_PRECISION_FP32 (0, the default): every op in f32. Other values: MW_ERR_INVALID. */
    mw_precision precision;
    /* How many threads run this process's CPU devices (a mesh of several virtual CPU devices in
     * one process, not pinned; other meshes always run one thread per device). With fewer
     * threads than devices, each thread runs a contiguous block of devices in turn, switching
     * device wherever one would wait for another in a collective. The choice never changes a
     * result: the devices run the same kernels and collectives either way.
     * MW_CPU_THREADS_AUTO (0, the default): a thread per device while that is fastest. When the
     * calling thread gets less than 60 % of a core during steps (other processes keep the cores
     * busy, or devices outnumber cores), the trainer times a few steps with one thread per core
     * (when there are fewer cores than devices) and with one thread, and keeps whichever is at
     * least 10 % faster; with fewer threads it tries the others again after 8, 16, ... up to 256
     * steps. mw_trainer_stats says how many threads ran the last step.
     * MW_CPU_THREADS_PER_DEVICE (-1): always a thread per device.
     * n >= 1: always n threads (at most one per device); 1 (MW_CPU_THREADS_ONE) runs every device
     * on the calling thread, e.g. to test an 8-device program on a machine with one free core.
     * Below -1: MW_ERR_INVALID. Devices sharing a thread wait for each other's kernels: a device
     * stalled inside one holds up the others of its thread, and their collective_timeout_ms
     * counts from when they started waiting, checked whenever the thread is free. */
    int cpu_threads;
    /* Pinning of CPU workers to cores. MW_PIN_NONE (0, the default): never, so that when
     * another process keeps a core busy the scheduler can move that core's worker to a core
     * where a worker waiting in a collective went to sleep (pinned, it would queue behind the
     * other process while its peers wait). MW_PIN_CORES: each worker on its own core when the
     * process may use at least as many cores as there are devices (else none is pinned). Other
     * values: MW_ERR_INVALID. */
    mw_pinning pin_threads;
    /* OpenBLAS threads per CPU device. OpenBLAS's thread count is process-wide: a program on CPU
     * devices sets it when it is made and restores the previous value when it is freed.
     * MW_BLAS_THREADS_ONE (0, the default): 1 thread, so that devices do not compete for cores.
     * MW_BLAS_THREADS_KEEP (-1): left as it is. n >= 1: n threads. Below -1: MW_ERR_INVALID. */
    int blas_threads;
    /* A collective whose peers do not all arrive within this many milliseconds fails the step
     * with MW_ERR_TIMEOUT instead of waiting forever (0: wait forever; on a mesh spanning
     * processes, 0 means MW_DISTRIBUTED_DEFAULT_TIMEOUT_MS for the waits between processes).
     * Negative: MW_ERR_INVALID. */
    int collective_timeout_ms;
    /* --- a training program's --- */
    /* Gradient all-reduce bucket size in bytes; 0 picks the default (1 MiB). */
    size_t bucket_bytes;
    /* FSDP's prefetch. MW_GATHERS_AHEAD (0, the default): where the mesh's reducer can start an
     * all-gather and complete it later (every reducer of meshwit: shared memory, MPI, NCCL,
     * devices sharing one GPU), each parameter's all-gather is started where the one before it
     * completes and waited for where the parameter is used, so the next layer's parameters
     * arrive while this layer computes; its copy is alive one layer longer. MW_GATHERS_AT_USE:
     * each all-gather runs where its parameter is used. Either way the same bits. Other values:
     * MW_ERR_INVALID. */
    mw_gathers gathers;
    /* Non-zero: time every kernel and collective of every step by op (see mw_trainer_profile).
     * Costs a clock read per kernel on CPU devices and a stream synchronisation per kernel on
     * GPUs (so GPU steps get slower while profiling). */
    int profile;
    /* --- the trainer's --- */
    /* What a step whose loss or gradients hold NaN or Inf (or whose gradient norm overflows
     * float) does, checked before any parameter is touched; every replica sees the same
     * all-reduced values, so all decide alike (mw_nonfinite). */
    mw_nonfinite nonfinite;
    /* Activation recomputation (gradient checkpointing) over the graph's regions
     * (mw_region_begin), e.g. one per transformer block. MW_RECOMPUTE_NONE (0, the default):
     * every value the backward pass reads is kept from forward. MW_RECOMPUTE_BLOCKS: of each
     * region only what is read outside it (its outputs: the next block's input) is kept; the
     * region's other activations are freed after their last use in forward and computed again,
     * from the region's inputs, when the backward pass reaches the region (as
     * torch.utils.checkpoint around each block), so activation memory holds the regions' outputs
     * plus one region's activations, for one more forward pass of the regions.
     * MW_RECOMPUTE_DOTS: as BLOCKS, but the contractions' and attentions' outputs (with the bias
     * and residual adds their kernels write) are kept too, so only the cheap ops (layer norms,
     * GELU, casts, dropout) run again. The recomputed values are the same bits as the forward's
     * (the kernels are deterministic; a dropout mask depends only on the seed, the step and the
     * element), so the trained model is byte-identical to that without recomputation, on every
     * mesh and precision. mw_trainer_memory's activations show the saving. A graph without
     * regions is unchanged. Other values: MW_ERR_INVALID. */
    mw_recompute recompute;
    /* FSDP (a parameter split over the mesh axis that also shards the batch: see mw_shard): by
     * default (0) the copy an op's all-gather makes is freed after its last use in forward and
     * the parameter gathered again where the backward pass needs it, so no more than a layer's
     * parameters are whole at a time beside their own rows. Non-zero keeps each gathered copy
     * from forward to backward instead (one all-gather per parameter and step, the memory of the
     * whole parameters; ZeRO-2-like). Either way the same bits. */
    int keep_gathered;
    /* Non-zero: the trainer keeps a gradient accumulator (one more parameter-sized buffer per
     * device) so that mw_trainer_accumulate can be used. */
    int grad_accumulation;
    /* Non-zero: ZeRO-1. The optimizer state is sharded over the devices: the flat parameters are
     * cut into one slice per device (whole 64-byte lines, balanced, cutting across parameters),
     * gradients are reduce-scattered so that each device holds the sum of its slice only, each
     * device updates its slice and keeps AdamW moments or SGD momentum (and the gradient
     * accumulator) for it alone (optimizer memory per device divided by the device count), and
     * the parameters are then all-gathered.
     * The result is bitwise equal to the replicated update (clipping, weight decay, warm-up and
     * gradient accumulation included: the gradient norm is exact, the same in every layout), and
     * checkpoints hold the full moments, so they load in either mode and on any mesh.
     * mw_trainer_read_grad gathers each slice from its owner (in one process; across processes
     * it is refused). On a mesh spanning processes mw_trainer_save gathers the other processes'
     * moments, so every process must call it (a collective call, within collective_timeout_ms).
     * Works with every reducer (CPU
     * devices in one process or across MPI processes, NCCL, devices sharing a GPU; on NCCL the
     * reduce-scatter costs an all-reduce) and needs gradients reduced over every device of the
     * mesh; MW_ERR_UNSUPPORTED otherwise. On a mesh of one device it changes nothing.
     * With parameters split over a mesh axis (mw_shard on a parameter), the state is split over
     * the data axes instead (the devices that sum gradients together, each cutting its own
     * shards' flat layout), again bitwise equal to the update without it; with no data axis
     * there is nothing to split and it changes nothing; with parameters split over the data axes
     * themselves (FSDP, see mw_shard) their state is split already and it changes nothing
     * either. */
    int shard_optimizer;
    /* > 0: after every this many completed steps, the trainer compares a checksum of every
     * parameter across all replicas (this process's devices and, on a mesh spanning processes,
     * every process) and fails the step with MW_ERR_STATE, naming the first parameter that
     * differs and where, when replicas silently diverged. 0: never (mw_trainer_check_replicas
     * checks on demand). */
    int check_replicas_every;
    /* Tensors of the graph (besides the loss) whose values the host reads after a step or eval
     * with mw_trainer_read_output, e.g. logits for sampling. Borrowed during mw_trainer_new. */
    mw_tensor *const *outputs;
    int noutputs;
    /* --- pipeline parallelism (meshwit/pipeline.h) --- */
    /* Non-NULL: the mesh axis whose devices hold the stages of the model (its regions, cut as
     * mw_pipeline_new cuts them), the graph traced for one micro-batch, each step fed
     * micro_batches of them one after another (feeds of micro_batches times the inputs'
     * elements) and run in the order pipeline_schedule gives (virtual_stages per device for
     * MW_SCHEDULE_INTERLEAVED). A step is then gradient accumulation over its micro-batches on
     * one device, byte for byte. mw_trainer_step, eval, read_param, write_param (a tied
     * parameter's two stages alike), param_count, param_info, memory (per device: its stages'),
     * kernels (the first stage's), stats, steps, devices, lr, set_lr, grad_norm,
     * skipped_steps, request_stop, MW_TEST_FAULT, and save, load, save_weights and
     * load_weights work on such a trainer (the files hold whole tensors, the same files as any
     * other layout's: a checkpoint saved by a pipeline resumes on one device and the other way
     * round), and check_replicas (each stage's replicas and a tied parameter's copy; across
     * processes a collective, as read_param and save are); accumulate, compute_grads,
     * read_grad, read_output, profile, local_size and mw_infer_from_trainer return
     * MW_ERR_UNSUPPORTED. The axis may cross processes, each stage inside one (see
     * meshwit/pipeline.h). NULL (the default): no
     * pipeline, and the three fields after it must be 0. Errors: those of mw_pipeline_new. */
    const char *pipeline_axis;
    int micro_batches; /* >= 1 with a pipeline axis (0: 1) */
    mw_pipeline_schedule pipeline_schedule;
    int virtual_stages;
} mw_trainer_config;

/* Values of mw_trainer_config.cpu_threads besides a thread count. */
enum { MW_CPU_THREADS_AUTO = 0, MW_CPU_THREADS_PER_DEVICE = -1, MW_CPU_THREADS_ONE = 1 };

/* Values of mw_trainer_config.blas_threads besides a thread count. */
enum { MW_BLAS_THREADS_ONE = 0, MW_BLAS_THREADS_KEEP = -1 };

/* A host array fed to an input by name. Its element count must be the input's global element
 * count; data must hold that many elements of the input's dtype and stay valid during the call. */
typedef struct mw_feed {
    const char *name;
    const void *data;
    int64_t count;
} mw_feed;

typedef struct mw_trainer mw_trainer;

/* Makes a trainer that minimises `loss` (a replicated f32 scalar of `graph`) over `mesh`. On a
 * mesh spanning processes this is a collective call (every process makes the same trainers in
 * the same order) and the trainer runs workers for this process's devices only; read_param and
 * the loss come from this process's first device (replicas are identical everywhere). Across
 * processes it first compares a fingerprint of the graph (every op, name, axis, size and
 * sharding) and of the configuration with every other process, within the collective timeout:
 * every field of mw_trainer_config and its optimizer, and the parameters the weight decay
 * applies to, except those that are each process's own and change no result: cpu_threads,
 * pin_threads, blas_threads, collective_timeout_ms, profile, and the optimizer's decays and
 * decay_user (a function of this process: what it decides is compared). When they differ every
 * process fails with MW_ERR_INVALID naming the first difference and both ranks ("rank 1:
 * parameter 'h0.fcw' has axes f32[...]; rank 0: ...", "rank 1: optimizer.momentum 0.9; rank 0:
 * optimizer.momentum 0"), or
 * MW_ERR_TIMEOUT when a process does not arrive. Then rank 0's initial parameters are broadcast,
 * so replicas start equal whatever each process's graph seed (a split parameter whole, each
 * process keeping its devices' boxes). A parameter may be split over any mesh axis, one inside
 * each process (tensor parallel inside a host, data parallel across hosts) or one crossing
 * processes: its collectives run through the reducer between processes, and reading it whole
 * (mw_trainer_read_param, mw_trainer_save, mw_trainer_save_weights) gathers the boxes other
 * processes hold, a collective call that every process makes in the same order, when some
 * process lacks some of its boxes. The
 * graph and mesh are borrowed and must outlive the trainer; config is copied (NULL: SGD with
 * lr 0.01). Errors: MW_ERR_INVALID (out, graph, mesh or loss NULL; the loss or an output NULL or
 * of another graph; a field of config or its optimizer outside the range its comment gives, the
 * message naming the field; a region begun and not ended); whatever the graph recorded while
 * tracing; MW_ERR_SHAPE (loss not an f32 scalar); MW_ERR_SHARDING (a mesh axis named by mw_shard
 * that the mesh lacks, a sharded axis with fewer rows than devices); MW_ERR_UNSUPPORTED (a graph
 * with states, mw_state: they belong to inference programs; shard_optimizer with split
 * parameters whose gradients are summed over different mesh axes; an op a device's backend
 * lacks; SGD with momentum or weight decay on devices without it); MW_ERR_NOMEM; MW_ERR_DEVICE
 * (a device failed to start); across processes MW_ERR_INVALID and MW_ERR_TIMEOUT as above. */
mw_status mw_trainer_new(mw_graph *graph, mw_tensor *loss, mw_mesh *mesh,
                         const mw_trainer_config *config, mw_trainer **out);

/* Stops the workers and frees every buffer. NULL is a no-op. */
void mw_trainer_free(mw_trainer *tr);

/* One training step on the global batch in `feeds` (every input of the graph, once). Writes the
 * loss before the update to *loss when loss is not NULL (also when the step stops with
 * MW_ERR_NONFINITE: the loss is what the forward pass computed). On error no parameter has changed
 * unless the failure happened during the update itself (the message says so); every worker is
 * released and the trainer can step again. Errors: MW_ERR_INVALID (a NULL trainer; a missing,
 * unknown, repeated or wrong-sized feed, one with NULL data, nfeeds < 0, feeds NULL with
 * nfeeds > 0; an id or target outside its range, naming it and its global row), MW_ERR_INTERRUPTED
 * (a stop was requested: see mw_request_stop), MW_ERR_NONFINITE (see
 * mw_trainer_config.nonfinite), MW_ERR_STATE (replicas diverged, with check_replicas_every; an
 * earlier step of a trainer spanning processes failed), MW_ERR_TIMEOUT (see
 * collective_timeout_ms), any error a device or collective reports (the message names the
 * device), the status of an injected fault. */
mw_status mw_trainer_step(mw_trainer *tr, const mw_feed *feeds, int nfeeds, float *loss);

/* Gradient accumulation: forward and backward on one micro-batch, whose gradients are added to
 * those accumulated since the last update; nothing is updated. The next mw_trainer_step runs its
 * own batch as the last micro-batch and updates with the mean of the gradients of all of them:
 * with N micro-batches of a mean loss this is the update of the one batch of N times the rows (to
 * float tolerance), with the activation memory of one micro-batch. Writes the micro-batch's loss
 * to *loss when not NULL. Needs mw_trainer_config.grad_accumulation (else MW_ERR_STATE); a failed
 * micro-batch leaves the accumulated gradients as they were. mw_trainer_save between the
 * micro-batches of one update does not save the accumulated gradients.
 * The order of the sums is fixed, so that N micro-batches give the same bits on every run: with
 * g_k the all-reduced gradient of micro-batch k (what mw_trainer_compute_grads would give for
 * it), the first accumulate copies g_0 into the accumulator, each later one adds its own in f32
 * (acc = acc + g_k, k = 1 .. N-2, in the order of the calls), and the step updates with
 * (acc + g_{N-1}) * (1/N), 1/N rounded to float (exact when N is a power of two), element by
 * element. Layouts whose g_k are the same bits (ZeRO-1, FSDP, recomputation, CPU devices
 * sharing threads, a mesh in one process or across processes) so give the same update; a layout
 * that sums a micro-batch's rows in another order (one device and two) agrees to float
 * tolerance, as without accumulation. A step refused by a stop request (MW_ERR_INTERRUPTED)
 * keeps the accumulated micro-batches for the next step. Errors: MW_ERR_STATE
 * (a trainer made without grad_accumulation), and those of mw_trainer_compute_grads. */
mw_status mw_trainer_accumulate(mw_trainer *tr, const mw_feed *feeds, int nfeeds, float *loss);

/* Forward and backward with the gradient all-reduce, but no update: afterwards
 * mw_trainer_read_grad returns the gradients of the loss for this batch. Errors: those of
 * mw_trainer_step but the ones that come with an update (MW_ERR_INTERRUPTED, MW_ERR_NONFINITE,
 * the replica check): a stop request waits for the next step. */
mw_status mw_trainer_compute_grads(mw_trainer *tr, const mw_feed *feeds, int nfeeds, float *loss);

/* Forward only: the loss for this batch, nothing updated. Errors: as mw_trainer_compute_grads'. */
mw_status mw_trainer_eval(mw_trainer *tr, const mw_feed *feeds, int nfeeds, float *loss);

/* Copies parameter `name` (count elements, row-major in its declared axis order) out of device 0
 * (replicas are identical), or into every replica. A parameter split over a mesh axis is read
 * and written whole: its shards are gathered from, and scattered to, the devices holding them.
 * On a mesh spanning processes, writing takes every process's src (pass the same values
 * everywhere); reading a parameter split over an axis that crosses processes gathers the other
 * processes' shards: a collective call (see mw_trainer_new), like read_grad of it.
 * Errors: MW_ERR_NOT_FOUND (no such parameter; the message names it), MW_ERR_SHAPE (count
 * differs from the parameter's whole size), MW_ERR_INVALID (a NULL trainer or name, dst or src
 * NULL with count > 0). */
mw_status mw_trainer_read_param(mw_trainer *tr, const char *name, float *dst, int64_t count);
mw_status mw_trainer_write_param(mw_trainer *tr, const char *name, const float *src, int64_t count);

/* Copies the all-reduced gradient of parameter `name` from the last step or compute_grads (a step
 * stopped for non-finite values counts: its gradients are complete, to find the non-finite
 * ones). Errors: as mw_trainer_read_param's; MW_ERR_STATE (no step or compute_grads has run yet:
 * eval and accumulate leave no all-reduced gradient); MW_ERR_UNSUPPORTED (shard_optimizer on a
 * mesh spanning processes: other processes hold the slices). */
mw_status mw_trainer_read_grad(mw_trainer *tr, const char *name, float *dst, int64_t count);

/* Copies the value of `output` (one of config->outputs) from the last step, accumulate, eval or
 * compute_grads into dst (count = its global element count, row-major in its axis order),
 * gathering the shards of a sharded output from every device. Errors: MW_ERR_INVALID (a NULL
 * trainer or output, dst NULL with count > 0), MW_ERR_NOT_FOUND (not one of config->outputs),
 * MW_ERR_STATE (none of those has run yet, so the output has no value), MW_ERR_SHAPE (wrong
 * count), MW_ERR_UNSUPPORTED (a sharded output of a mesh spanning processes: other processes
 * hold some of its rows). */
mw_status mw_trainer_read_output(mw_trainer *tr, const mw_tensor *output, float *dst,
                                 int64_t count);

/* Saves the whole training state to `path`: parameters, optimizer moments, the step count (and so
 * the learning-rate schedule's position), and `user_bytes` bytes of the caller's own state (its
 * RNG, its data position) copied from `user`. The file carries a magic, a version and a checksum,
 * and is written atomically (a temporary file, flushed and synced, then renamed over `path`): a
 * failed save leaves the previous checkpoint intact. The temporary file is a hidden one beside
 * `path`, unique per writer (mw_output_open, meshwit/file.h), so concurrent writers never share
 * one: the file at `path` always loads and holds one writer's complete state. The first save of
 * a process into a folder removes the temporary files there that writers of this kernel boot
 * and process namespace which no longer run left behind (a process killed while saving). A
 * `path` that is not a regular file the process may replace (a directory, a FIFO, a device, a
 * read-only file) is refused, not replaced. Errors: MW_ERR_INVALID (a NULL trainer or path,
 * user NULL with user_bytes > 0), MW_ERR_IO (the folder is missing or takes no file; path is
 * not replaceable), MW_ERR_NOMEM, and MW_ERR_TIMEOUT when it is a collective call. */
mw_status mw_trainer_save(mw_trainer *tr, const char *path, const void *user, size_t user_bytes);

/* Restores a state saved by mw_trainer_save into a trainer of the same model and optimizer (on
 * any mesh); copies the caller's state into user (at most `capacity` bytes; its size to
 * *user_bytes when not NULL). Resuming reproduces the uninterrupted run bit for bit on the same
 * mesh. The file is checked completely before the trainer changes: MW_ERR_IO (cannot read),
 * MW_ERR_FORMAT (bad magic or version, truncated, checksum mismatch, another model or optimizer,
 * caller state larger than capacity, a step outside [0, 2^53]), MW_ERR_NOMEM, MW_ERR_INVALID (a
 * NULL trainer or path, user NULL with capacity > 0). A path that is not
 * a regular file (a directory, a FIFO, a device) is MW_ERR_IO, said so, before anything is read:
 * opening never blocks. */
mw_status mw_trainer_load(mw_trainer *tr, const char *path, void *user, size_t capacity,
                          size_t *user_bytes);

/* What a checkpoint file written by mw_trainer_save holds, without a trainer: its step to *step
 * and the size of the caller's state to *user_bytes (each when not NULL); with user not NULL,
 * the caller's state copied into user, which must hold it (capacity bytes: MW_ERR_FORMAT when
 * it is larger). user NULL (capacity 0) asks for the size alone, whatever it is. The file is
 * checked as mw_trainer_load checks it (magic, version, size, checksum, step), but against no
 * model, and read in pieces: the header, the checksum streamed over the whole file through a
 * buffer of 1 MiB, then the caller's state; memory does not grow with the checkpoint (the
 * file is still read once, whole). A program reads it before building anything: to compare
 * the run the checkpoint belongs to (kept in its own state) with the one it is asked for, or
 * to refuse to replace a checkpoint that holds a run. On failure nothing is written to *step
 * or *user_bytes (user may hold part of the state after a failed read). Errors:
 * MW_ERR_INVALID (path NULL, capacity without user), MW_ERR_IO (cannot read; not a regular
 * file, said without blocking), MW_ERR_FORMAT (not a checkpoint, damaged, caller state larger
 * than capacity), MW_ERR_NOMEM. */
mw_status mw_checkpoint_info(const char *path, int64_t *step, void *user, size_t capacity,
                             size_t *user_bytes);

/* Timings of the last step, eval or compute_grads, for profiling and the bench. */
typedef struct mw_step_stats {
    double step_ms;   /* wall time of the whole command, as the host saw it */
    double reduce_ms; /* device 0's time inside collectives (gradient buckets and forward
                         all-reduces), including waiting for peers (and, with devices sharing a
                         thread, the other devices' turns meanwhile) */
    double update_ms; /* device 0's time in the optimizer update */
    /* Threads that ran this process's devices: one per device, or fewer when CPU devices shared
     * threads (mw_trainer_config.cpu_threads); 1: all on the calling thread. */
    int threads;
} mw_step_stats;

/* Errors: MW_ERR_INVALID (a NULL argument). */
mw_status mw_trainer_stats(const mw_trainer *tr, mw_step_stats *out);

/* Bytes one device of a trainer holds, by kind. */
typedef struct mw_device_memory {
    int64_t parameters;
    int64_t gradients;   /* the flat gradients, and the accumulator with grad_accumulation (its
                            slice with ZeRO-1) */
    int64_t optimizer;   /* AdamW moments or SGD momentum: this device's slice with ZeRO-1 */
    int64_t activations; /* the plan's arena: activations, their gradients and temporaries (less
                            with mw_trainer_config.recompute) */
    int64_t workspace;   /* the kernels' own buffers: oneDNN scratchpads, bf16 operands widened
                            where the CPU lacks bf16 instructions */
} mw_device_memory;

/* What device `device` of the mesh holds (parameters: the f32 ones and, with bf16 precision,
 * their bf16 copy). MW_ERR_INVALID for a NULL argument or a device that is not this process's. */
mw_status mw_trainer_memory(const mw_trainer *tr, int device, mw_device_memory *out);

/* Writes to buf (at most size bytes, always terminated) what runs the contractions and the
 * attention of this process's first device: a line per kind of kernel and implementation, with
 * how many of the plan's kernels it runs, e.g.
 *   gemm bf16: onednn brg:avx512_core_amx_bf16 (48)
 *   gemm f32: openblas sgemv (1)
 *   attention bf16: f32 tiles (avx512) of bf16 widened to f32 (8)
 *   other kernels: vector loops (avx512) (95)
 * The CPU backend's choices depend on the CPU, on how libmeshwit was built and on the
 * environment (MESHWIT_CPU_GEMM, MESHWIT_CPU_ISA: see the README). Errors: MW_ERR_INVALID (NULL
 * trainer or buf, size 0). */
mw_status mw_trainer_kernels(const mw_trainer *tr, char *buf, size_t size);

/* One row of a profile: the time spent in one kind of kernel in one phase of a step, summed over
 * the steps since the trainer was made or the profile reset, per device (the mean over this
 * process's devices). With devices sharing a thread (mw_trainer_config.cpu_threads), a
 * collective's rows also count the turns the thread's other devices take while it waits. */
typedef struct mw_profile_row {
    /* The graph op the kernels implement ("contract", "gelu", "attention_grad", "add", ...), with
     * ":copy" for the rearranging copies an op needed (an operand a GEMM cannot read in place),
     * or "gradient all-reduce" / "optimizer". */
    char op[40];
    const char *phase; /* "forward", "backward" or "update"; static storage */
    int64_t calls;     /* kernels run, per device */
    double ms;         /* milliseconds, per device */
} mw_profile_row;

/* With mw_trainer_config.profile set: writes up to `capacity` rows, largest time first, and the
 * number of rows there are to *count (which may exceed capacity; rows may be NULL to ask only
 * that). Errors: MW_ERR_INVALID (NULL trainer or count), MW_ERR_STATE (the trainer was made
 * without profiling). */
mw_status mw_trainer_profile(const mw_trainer *tr, mw_profile_row *rows, int capacity, int *count);

/* Clears the profile (e.g. after warm-up steps). Not while a step runs. NULL, or a trainer
 * without profiling, is a no-op. */
void mw_trainer_profile_reset(mw_trainer *tr);

/* Number of completed update steps (0 for NULL). */
int64_t mw_trainer_steps(const mw_trainer *tr);

/* Number of steps skipped for non-finite values (MW_NONFINITE_SKIP; 0 for NULL). */
int64_t mw_trainer_skipped_steps(const mw_trainer *tr);

/* Compares a checksum of every parameter across all replicas, as check_replicas_every does;
 * collective on a mesh spanning processes. Errors: MW_ERR_STATE (replicas differ: the message
 * names the first parameter, the devices or ranks and the step; an earlier step of a trainer
 * spanning processes failed), MW_ERR_TIMEOUT, MW_ERR_NOMEM, MW_ERR_INVALID (a NULL trainer). */
mw_status mw_trainer_check_replicas(mw_trainer *tr);

/* Stopping at a step boundary, e.g. from a SIGINT/SIGTERM handler. Both request functions are
 * async-signal-safe (they store one lock-free atomic int) and may be called from any thread.
 * The step in flight finishes; the next mw_trainer_step returns MW_ERR_INTERRUPTED before it
 * touches anything (parameters and step count as after the last completed step, so the caller
 * can save a checkpoint and exit). mw_request_stop applies to every trainer of the process and
 * stays set until mw_cancel_stop; mw_trainer_request_stop applies to one trainer and is
 * consumed by the step that reports it. On a mesh spanning processes every step boundary agrees
 * on it (one small all-reduce between the processes per step): a request in any process stops
 * every process at the same step. accumulate, eval and compute_grads are not affected.
 * mw_trainer_request_stop(NULL) is a no-op. */
void mw_request_stop(void);
void mw_trainer_request_stop(mw_trainer *tr);
/* Non-zero while a process-wide stop is requested. */
int mw_stop_requested(void);
void mw_cancel_stop(void);

/* The learning rate the schedule gives step `step` (0-based); 0 for NULL. */
float mw_trainer_lr(const mw_trainer *tr, int64_t step);

/* Sets the learning rate of the following steps from the host, in place of the built-in
 * schedule, for any schedule the caller computes (call it before every step to change it each
 * step); lr = MW_LR_SCHEDULE goes back to the built-in schedule. Errors: MW_ERR_INVALID (a NULL
 * trainer, a negative or non-finite lr). */
#define MW_LR_SCHEDULE (-1.0f)
mw_status mw_trainer_set_lr(mw_trainer *tr, float lr);

/* Global L2 norm of the (all-reduced) gradients of the last step, before clipping; 0 before the
 * first step, when nothing asks for it (SGD without clipping with MW_NONFINITE_IGNORE), and for
 * NULL. */
float mw_trainer_grad_norm(const mw_trainer *tr);

/* Number of devices the trainer runs on (0 for NULL), and the number of rows of axis `axis` (base
 * name) that device `device` holds (its full size when the axis is not sharded); -1 for an axis
 * the graph lacks, a device out of range, a NULL trainer or axis. */
int mw_trainer_devices(const mw_trainer *tr);
int64_t mw_trainer_local_size(const mw_trainer *tr, int device, const char *axis);

#ifdef __cplusplus
}
#endif
#endif
