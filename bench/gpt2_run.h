/* meshwit-bench: timing GPT-2 training steps in a child process (shared by the gpt2, llmc and
 * contention cases). */
#ifndef MWB_GPT2_RUN_H
#define MWB_GPT2_RUN_H

#include "../examples/common/gpt2_model.h"
#include "../examples/common/llama_model.h"
#include "bench.h"
#include "meshwit.h"

#define MWB_MAX_PROFILE 48

typedef struct mwb_gpt2_setup {
    gpt2_config model;
    const llama_config *llama; /* a Llama-family model instead of GPT-2 (model unused), or NULL */
    int batch, seq;
    const char *devices;
    int blas_threads; /* mw_trainer_config.blas_threads: 0 is one per device */
    int warmup, repeats, steps;
    int profile; /* collect a per-op profile of the timed steps */
    /* The mesh's axes (NULL: one axis X), the mesh axis the batch is sharded over (NULL: X
     * unless model_axis is given, then none), the one the heads and MLP units are split over
     * (NULL: none) and ZeRO-1. */
    const char *mesh_axes, *data_axis, *model_axis;
    int shard_optimizer;
    int shard_params;       /* FSDP over the data axis (gpt2_layout.fsdp_axis) */
    mw_precision precision; /* mw_trainer_config.precision */
    mw_recompute recompute; /* mw_trainer_config.recompute */
    int serial_gathers;     /* mw_trainer_config.gathers = MW_GATHERS_AT_USE */
} mwb_gpt2_setup;

/* What the child sends back. */
typedef struct mwb_gpt2_result {
    int ok;
    double ms;      /* median ms/step over the repeats */
    double peak_mb; /* ru_maxrss of the child */
    int threads;    /* that ran the last timed step (fewer than devices: sharing threads) */
    int nprofile;
    mw_profile_row profile[MWB_MAX_PROFILE];
    mw_device_memory memory; /* what device 0 holds */
    char kernels[600];       /* mw_trainer_kernels: what ran the contractions and attention */
    char error[400];
} mwb_gpt2_result;

/* GPT-2 trained on a mesh (a generated arithmetic corpus, random windows), for cases that time it
 * their own way. On a mesh spanning processes every process makes and steps it alike. With
 * tc->pipeline_axis the graph is traced for one of tc->micro_batches micro-batches (which must
 * divide batch) and each step feeds the whole batch. Functions returning int return 0 on success
 * and otherwise leave the error in err. */
#define MWB_GPT2_BATCH 32 /* the gpt2 example's defaults: the tiny model of mwb_gpt2_new */
#define MWB_GPT2_SEQ 32
int mwb_gpt2_make(mw_mesh *mesh, const gpt2_config *model, int batch, int seq,
                  const mw_trainer_config *tc, mwb_gpt2 **out, char *err, size_t errlen);
/* The same with the batch sharded over data_axis (or not, when NULL) and the heads and MLP units
 * split over model_axis (or not). */
int mwb_gpt2_make_mesh(mw_mesh *mesh, const gpt2_config *model, int batch, int seq,
                       const char *data_axis, const char *model_axis, const mw_trainer_config *tc,
                       mwb_gpt2 **out, char *err, size_t errlen);
/* And with the parameters split over fsdp_axis (or not) as gpt2_layout.fsdp_axis splits them. */
int mwb_gpt2_make_fsdp(mw_mesh *mesh, const gpt2_config *model, int batch, int seq,
                       const char *data_axis, const char *model_axis, const char *fsdp_axis,
                       const mw_trainer_config *tc, mwb_gpt2 **out, char *err, size_t errlen);

/* Builds the model and times it in a forked child: warmup steps, then repeats x steps; random
 * windows of the generated arithmetic corpus. Nothing runs in the parent, so no worker thread or
 * BLAS pool exists when it forks. */
void mwb_gpt2_measure(const mwb_gpt2_setup *s, mwb_gpt2_result *r);

/* The trainer configuration every GPT-2 case uses: AdamW (lr 1e-3, betas 0.9/0.95, eps 1e-8,
 * weight decay 0.1) with clipping at 1. */
mw_trainer_config mwb_gpt2_config(int blas_threads);

/* Model FLOPs per training token: 6 per parameter plus attention's 12 L C T (the Llama family:
 * 12 L H D T, the queries' heads times their size). */
double mwb_gpt2_flops_per_token(const gpt2_config *c, int seq);
double mwb_llama_flops_per_token(const llama_config *c, int seq);

/* mwb_gpt2_make_fsdp for a Llama-family model. */
int mwb_llama_make(mw_mesh *mesh, const llama_config *model, int batch, int seq,
                   const char *data_axis, const char *model_axis, const char *fsdp_axis,
                   const mw_trainer_config *tc, mwb_gpt2 **out, char *err, size_t errlen);

/* Single-core sgemm rate in GFLOP/s at n x n x n (median of a few), measured in a child with one
 * BLAS thread; 0 on failure. */
double mwb_sgemm_gflops(int n);

/* The CPU backend's own GEMM rate at n x n x n on one core (as a plan runs it: prepared, on the
 * engine the backend picks for dtype), in GFLOP/s, with what ran it in impl; 0 on failure. */
double mwb_gemm_gflops(int n, mw_dtype dtype, char *impl, size_t impl_size);

/* Prints r->kernels, each line indented and prefixed by who ran them ("meshwit cpu:1 bf16"). */
void mwb_print_kernels(const char *who, const mwb_gpt2_result *r);

/* Prints a profile as a table: op, phase, calls/step, ms/step, share of the summed time. */
void mwb_print_profile(const mwb_gpt2_result *r, int steps);

#endif
