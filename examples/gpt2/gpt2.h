/* The gpt2 program's parts: its options (args.c), the data and the files (data.c), the run's
 * identity and checkpoints (checkpoint.c), training (train.c) and sampling (sample.c); main and
 * the run's order in gpt2.c. */
#ifndef GPT2_PROGRAM_H
#define GPT2_PROGRAM_H

#include <stdint.h>

#include "../common/cli.h"
#include "../common/gpt2_data.h"
#include "../common/gpt2_model.h"
#include "../common/llama_model.h"
#include "../common/options.h"

#define VAL_FRACTION 0.1 /* held out of --data (or the default corpus) when no --val-data */
#define EOS_AUTO (-1)    /* --eos auto: the tokenizer's <|endoftext|>, or GPT-2's for its tokens */
#define EOS_NONE (-2)    /* --eos none */

/* Model sizes given on the command line, applied over the preset (or checked against the --load
 * file's); 0 when not given. */
typedef struct sizes {
    int layers, heads, channels, context, vocab, padded_vocab;
} sizes;

/* The model family a program of these sources trains: gpt2 (gpt2.c's main) or llama (llama.c's:
 * Llama, Mistral and Qwen2, Hugging Face safetensors in and out). */
typedef enum program_family { FAMILY_GPT2 = 0, FAMILY_LLAMA = 1 } program_family;

/* Every flag's field (args.c's table says which), then what the program makes of them. */
typedef struct options {
    int family; /* a program_family, set by main */
    const char *devices, *mesh, *model_axis;
    const char *data, *val_data, *tokenizer;
    int format; /* gpt2_data_format */
    const char *preset;
    int preset_given; /* --preset given: with --load, its sizes must be the file's */
    sizes sizes;
    const char *load, *save, *checkpoint, *allow_change;
    int resume, start_over, stop_at, allow_nonfinite;
    int checkpoint_every, checkpoint_every_given;
    int batch, seq, steps, sequential, warmup, cosine;
    int micro_batches;         /* --micro-batches: each step's batch run in this many parts */
    const char *pipeline_axis; /* --pipeline-axis: the mesh axis of the stages, or NULL */
    int pipeline_schedule;     /* --pipeline-schedule: an mw_pipeline_schedule */
    int pipeline_schedule_given, virtual_stages;
    uint64_t seed;
    double lr, beta1, beta2, eps, weight_decay, grad_clip, min_lr_ratio;
    int val_every, val_batches, skip_nonfinite;
    int shard_optimizer, shard_params, keep_gathered, serial_gathers;
    int bf16;      /* --precision */
    int recompute; /* an mw_recompute */
    int check_replicas, cpu_threads;
    int eval_only, eval_batches, sample, sample_recompute;
    double temperature, top_p;
    int top_k;
    int eos; /* a token id, or EOS_AUTO, EOS_NONE */
    const char *prompt;
    /* made of the flags once they are read */
    gpt2_config model;  /* the model: the preset's or the --load file's, with the sizes given
                           (llama: its sizes, vocab unpadded; the model itself is `llama`) */
    llama_config llama; /* llama: the model */
    char data_axis[64]; /* mesh axis sharding the batch ("" when none) */
    int tok_vocab;      /* the --tokenizer's vocabulary size (0: no tokenizer) */
} options;

/* One run of the program: what it read, built and keeps. */
typedef struct run {
    options o;
    gpt2_tokens data, val_file; /* owned */
    gpt2_tokens train, val;     /* views */
    int byte_level;             /* text data: tokens are bytes */
    mw_tokenizer *tok;          /* --tokenizer, or NULL */
    int corpus;                 /* the built-in arithmetic corpus */
    mw_mesh *mesh;
    mw_graph *graph;
    gpt2_graph model;
    mw_trainer *tr;
    gpt2_batch batch;
    gpt2_rng rng;
    cli_identity identity; /* the run's settings, kept in its checkpoints */
    int32_t *prompt;       /* the sample's first tokens (owned) */
    int prompt_len;
    int32_t eos; /* the token that ends the sample (--eos), or -1: none */
} run;

/* args.c: reads the command line of the family's program (a program_family) into o: 0, 1
 * (--help: the usage is printed) or -1 (reported).
 * Then, once the tokenizer is known, the model the flags choose: 0, or -1 reported. */
int gpt2_args(int argc, char **argv, int family, options *o);
int gpt2_choose_model(options *o);
/* A size the command line gives for a --load model must be the file's own: 0 when it is (or
 * not given), -1 with a message naming both otherwise. */
int size_agrees(const char *what, int given, int file_value, const char *path);
/* --micro-batches over a mesh of `devices` devices: each micro-batch's rows must give every
 * device of the data axis at least one. 0, or -1 reported. */
int check_micro_batches(const options *o, int devices);
/* The text every process of a job compares: every flag but the local ones (args.c's table). */
void gpt2_args_text(const options *o, char *buf, size_t size);
/* The run's settings from the table (CLI_RUN), after the model's and the data's. */
void gpt2_args_identity(const options *o, cli_identity *id);

/* data.c */
int check_files(const run *r);
int prepare_data(run *r);
int prepare_prompt(run *r);
int prepare_eos(run *r);
void print_setup(const run *r);

/* checkpoint.c */
void run_identity(run *r);
int check_checkpoint(const run *r);
mw_status save_checkpoint(run *r);
int resume(run *r, int *finished);
mw_status agree_flags(const run *r);

/* train.c */
mw_status build(const options *o, mw_mesh *mesh, mw_graph **g, gpt2_graph *m, mw_trainer **tr);
mw_status evaluate(run *r, const gpt2_tokens *t, int n, float *loss, int *used);
int train(run *r);

/* sample.c */
int sample(run *r);

/* model.c: what differs between the families: the model chosen (llama: from a preset or a
 * --load config.json, with the sizes given; 0 or -1 reported), built, loaded, saved, counted,
 * copied into an inference program, and whether --save may write its file (0 or -1 reported). */
int llama_choose_model(options *o);
mw_status model_build(const options *o, mw_graph *g, const gpt2_layout *lo, gpt2_graph *m);
mw_status model_load(const options *o, mw_trainer *tr, char *err, size_t errsize);
mw_status model_save(const options *o, mw_trainer *tr, const char *to, char *err, size_t errsize);
int64_t model_num_params(const options *o);
mw_status model_copy_params(const options *o, mw_trainer *tr, mw_infer *inf);

/* gpt2.c: the program's entry (main of gpt2.c and llama.c), and its name in messages. */
int program_main(int argc, char **argv, program_family family);
const char *program_name(void);

/* A message to stderr after "<program>: " (printf's format). */
void perr(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* gpt2.c: a failed library call, reported with mw_last_error(); or with its own message (from
 * the data and model-file functions). Both return the exit status, 2. */
int fail(mw_status st, const char *what);
int fail_msg(mw_status st, const char *msg);
double now(void);

#endif
