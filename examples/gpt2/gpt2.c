/* gpt2: trains GPT-2 over a mesh of devices (data parallel, and with --model-axis tensor parallel),
 * on byte-level text, llm.c token shards or a built-in arithmetic corpus; evaluates, samples, and
 * reads and writes llm.c model files and Hugging Face GPT-2 safetensors. The small version of the
 * same loop, every setting fixed, is train_gpt2.c beside it.
 *
 * One training step: make a global batch [B, T] on the host (random windows, or file order with
 * --sequential), feed it; the trainer shards it along Batch over the mesh's data axis, all-reduces
 * the gradients and updates every replica with AdamW. With --model-axis, each layer's attention
 * heads and MLP units are split over that mesh axis instead of replicated.
 *
 * SIGINT or SIGTERM finishes the step in flight, writes the --checkpoint and exits 130 or 143; a
 * second signal exits at once. Under mpirun every process must be given the same flags (all but
 * --devices) and data: they are compared before training starts.
 *
 * Every file goes through the library's discipline (meshwit/file.h), checked before the data is
 * read; a checkpoint records the run's settings, and --resume refuses others unless
 * --allow-change names them; a new run does not replace a checkpoint unless --start-over.
 *
 * The program's parts: args.c (every flag, in one table), data.c, checkpoint.c, train.c and
 * sample.c; this file runs them in order.
 *
 * Exit status: 0 done, 2 bad arguments, bad data or a library error, 130/143 interrupted. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpt2.h"

#include <stdarg.h>

static const char *prog = "gpt2"; /* the program's name in messages (program_main sets it) */

const char *program_name(void) { return prog; }

void perr(const char *fmt, ...) {
    fprintf(stderr, "%s: ", prog);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

int fail(mw_status st, const char *what) {
    fflush(stdout);
    const char *msg = mw_last_error();
    perr("%s: %s [%s]%s%s\n", what, mw_strerror(st), mw_status_name(st), *msg ? ": " : "", msg);
    return 2;
}

int fail_msg(mw_status st, const char *msg) {
    fflush(stdout);
    perr("%s [%s]: %s\n", mw_strerror(st), mw_status_name(st), msg);
    return 2;
}

double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Every check that needs no training, made before the data is read or the model built: the
 * tokenizer and the model, the files, then the data, the checkpoint's run and the prompt, and
 * that every process was started alike. 0, or the exit status (reported). */
static int prepare(run *r) {
    options *o = &r->o;
    mw_status st;
    int rc;
    if (o->tokenizer) {
        if ((st = mw_tokenizer_load(o->tokenizer, &r->tok)) != MW_OK)
            return fail(st, "cannot load --tokenizer");
        o->tok_vocab = mw_tokenizer_vocab_size(r->tok);
    }
    if (gpt2_choose_model(o) != 0) return 2;
    if (o->prompt[0] == '\0') {
        perr("--prompt must not be empty\n");
        return 2;
    }
    if (check_files(r) != 0) return 2;
    gpt2_rng_seed(&r->rng, o->seed);
    if ((rc = prepare_data(r)) != 0) return rc;
    run_identity(r);
    if (o->checkpoint && (rc = check_checkpoint(r)) != 0) return rc;
    if (!r->byte_level && !r->tok && strcmp(o->prompt, "\n") != 0) {
        perr("--prompt needs byte-level data (token data starts from "
             "<|endoftext|>)\n");
        return 2;
    }
    if (!o->eval_only && o->sample > 0 &&
        ((rc = prepare_prompt(r)) != 0 || (rc = prepare_eos(r)) != 0))
        return rc;
    if ((st = agree_flags(r)) != MW_OK) return fail(st, "the processes were started differently");
    if (cli_catch_stop_signals() != 0) {
        perr("cannot install the SIGINT/SIGTERM handler: %s\n", strerror(errno));
        return 2;
    }
    return 0;
}

/* What one device holds and the kernels the trainer chose. */
static void print_trainer(const run *r) {
    mw_device_memory mem;
    int first = 0;
    mw_mesh_local_devices(r->mesh, &first);
    /* With micro-batches the gradients count the accumulator, which holds a gradient for each
     * element whose AdamW moments (two) this device keeps (trainer.h: mw_device_memory), and the
     * activations are one micro-batch's. */
    char accum[64] = "", micro[64] = "";
    /* A pipeline: each device holds its stages' parameters and the activations of the
     * micro-batches its schedule keeps in flight. */
    int shown = r->o.pipeline_axis ? mw_mesh_size(r->mesh) : 1;
    for (int d = first; d < first + shown; d++) {
        if (mw_trainer_memory(r->tr, d, &mem) != MW_OK) continue;
        if (r->o.micro_batches > 1) {
            snprintf(accum, sizeof accum, " (%.2f MB of them the accumulator)",
                     mem.optimizer / 2e6);
            snprintf(micro, sizeof micro, " (%s micro-batch of %d)",
                     r->o.pipeline_axis ? "each" : "a", r->o.batch / r->o.micro_batches);
        }
        char who[48] = "per device";
        if (r->o.pipeline_axis) snprintf(who, sizeof who, "of device %d", d);
        printf("memory %s: parameters %.2f MB, gradients %.2f MB%s, optimizer state %.2f "
               "MB, activations %.2f MB%s, kernel workspace %.2f MB\n",
               who, mem.parameters / 1e6, mem.gradients / 1e6, accum, mem.optimizer / 1e6,
               mem.activations / 1e6, micro, mem.workspace / 1e6);
    }
    char kernels[1024];
    if (mw_trainer_kernels(r->tr, kernels, sizeof kernels) == MW_OK) {
        printf("precision %s; kernels:\n", r->o.bf16 ? "bf16" : "fp32");
        for (char *line = strtok(kernels, "\n"); line; line = strtok(NULL, "\n"))
            printf("  %s\n", line);
    }
}

/* The mesh, the model and its trainer, its weights from --load and its state from --resume.
 * *finished when a resumed run has nothing left to do. 0, or the exit status (reported). */
static int start(run *r, int *finished) {
    const options *o = &r->o;
    char err[512];
    mw_status st;
    if ((st = mw_mesh_new(o->devices, o->mesh, &r->mesh)) != MW_OK)
        return fail(st, "cannot make the mesh");
    if (check_micro_batches(o, mw_mesh_size(r->mesh)) != 0) return 2;
    print_setup(r);
    if ((st = gpt2_batch_new(o->batch, o->seq, &r->batch)) != MW_OK ||
        (st = build(o, r->mesh, &r->graph, &r->model, &r->tr)) != MW_OK)
        return fail(st, "cannot build the model");
    print_trainer(r);
    if (o->load) {
        if ((st = model_load(o, r->tr, err, sizeof err)) != MW_OK) return fail_msg(st, err);
        printf("loaded %s\n", o->load);
    }
    int rc = o->resume ? resume(r, finished) : 0;
    if (rc != 0 || *finished) return rc;
    /* Every process loaded its own --load file or checkpoint: they must hold the same values. */
    if ((o->load || o->resume) && mw_distributed_size() > 1 &&
        (st = mw_trainer_check_replicas(r->tr)) != MW_OK)
        return fail(st, "the processes loaded different weights");
    return 0;
}

/* --eval-only: the loss over --eval-batches batches. 0, or the exit status. */
static int eval_only(run *r) {
    const options *o = &r->o;
    float loss;
    int used;
    mw_status st = evaluate(r, &r->val, o->eval_batches, &loss, &used);
    if (st != MW_OK) return fail(st, "evaluation failed");
    printf("eval loss %.6f  (%d batches of %d x %d)\n", loss, used, o->batch, o->seq);
    if (isfinite(loss)) return 0;
    fflush(stdout);
    perr("the eval loss is %f: the model's outputs are not finite\n", loss);
    return 2;
}

/* Training, then --save and the sample. 0, or the exit status. */
static int train_save_sample(run *r) {
    const options *o = &r->o;
    char err[512];
    int rc = train(r);
    if (rc != 0) return rc;
    if (o->save) { /* one writer; every process reads (split parameters are gathered) */
        const char *to = mw_distributed_rank() == 0 ? o->save : NULL;
        mw_status st = model_save(o, r->tr, to, err, sizeof err);
        if (st != MW_OK) return fail_msg(st, err);
        printf("saved %s\n", o->save);
    }
    if (o->sample > 0) rc = sample(r);
    if (rc == 0 && cli_stop_signal()) {
        printf(o->sample > 0 ? "interrupted while sampling\n"
                             : "interrupted after training (the run had finished)\n");
        rc = cli_stop_status();
    }
    return rc;
}

static int run_main(int argc, char **argv, program_family family) {
    run r = {0};
    int rc = gpt2_args(argc, argv, family, &r.o), finished = 0;
    if (rc != 0) return rc > 0 ? 0 : 2; /* --help, or a bad argument */
    rc = prepare(&r);
    if (rc == 0) rc = start(&r, &finished);
    if (rc == 0 && !finished) rc = r.o.eval_only ? eval_only(&r) : train_save_sample(&r);
    fflush(stdout);
    mw_trainer_free(r.tr);
    mw_graph_free(r.graph);
    mw_mesh_free(r.mesh);
    gpt2_batch_free(&r.batch);
    gpt2_tokens_free(&r.val_file);
    gpt2_tokens_free(&r.data);
    mw_tokenizer_free(r.tok);
    free(r.prompt);
    return rc;
}

int program_main(int argc, char **argv, program_family family) {
    prog = family == FAMILY_LLAMA ? "llama" : "gpt2";
    /* Under mpirun the mesh spans every process; only rank 0 prints. */
    if (mw_distributed_init(&argc, &argv) != MW_OK) {
        perr("%s\n", mw_last_error());
        return 2;
    }
    if (mw_distributed_rank() > 0 && !freopen("/dev/null", "w", stdout)) return 2;
    int rc = run_main(argc, argv, family);
    /* A process that failed alone would leave its peers waiting: end the whole job. */
    if (rc != 0 && rc != 130 && rc != 143 && mw_distributed_size() > 1) mw_distributed_abort(rc);
    mw_distributed_finalize();
    return rc;
}
