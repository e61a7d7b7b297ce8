/* The gpt2 command line: one table of every flag (its name, type, field, default and help, and
 * whether a checkpoint records it), the checks between flags, and the model the flags choose. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2.h"

#define F(field) offsetof(options, field)
#define BIG (1 << 30) /* the largest count a flag takes */

/* Every flag, once. CLI_RUN: a setting of the run, which its checkpoints record and --resume
 * compares (checkpoint.c). CLI_LOCAL: not compared between the processes of a job as given:
 * each has its own devices, and the model and the data are compared as what they make. */
static const cli_option table[] = {
    CLI_SECTION("devices and data"),
    CLI_OPT("--devices", CLI_STRING, F(devices), "cpu:2", "SPEC",
            "devices, sharding the batch over them (e.g. cpu:1, cpu:4, cuda:0,1)",
            .flags = CLI_LOCAL),
    CLI_OPT(
        "--data", CLI_STRING, F(data), NULL, "FILE",
        "training data: any file as bytes (vocab 256), or an llm.c token shard (uint16 GPT-2 "
        "tokens); the last 10% is held out unless --val-data is given. With --eval-only: the data "
        "evaluated, whole",
        .flags = CLI_LOCAL /* compared by its tokens */),
    CLI_OPT("--val-data", CLI_STRING, F(val_data), NULL, "FILE",
            "validation data (with --eval-only: evaluated instead of --data)", .flags = CLI_LOCAL),
    CLI_OPT(
        "--tokenizer", CLI_STRING, F(tokenizer), NULL, "FILE",
        "a GPT-2 byte-level BPE tokenizer (tokenizer.json, or a folder with vocab.json and "
        "merges.txt): text --data is encoded with it, --prompt is text and samples print as text; "
        "without --load the vocabulary is the tokenizer's",
        .flags = CLI_FILE),
    CLI_OPT(
        "--data-format", CLI_CHOICE, F(format), "auto", "F",
        "auto (a token shard when the name ends in .bin or the file starts with its magic), text "
        "or tokens",
        .choices = CLI_CHOICES({"auto", GPT2_DATA_AUTO}, {"text", GPT2_DATA_TEXT},
                               {"tokens", GPT2_DATA_SHARD})),
    CLI_SECTION("model"),
    CLI_OPT("--preset", CLI_NAME, F(preset), "tiny", "NAME",
            "tiny (4 layers, 128 channels, context 128, bytes), small (6 layers, 384 channels, "
            "context 256), gpt2-124m (context 1024, vocab 50257 padded to 50304)",
            .choices = CLI_CHOICES({"tiny", 0}, {"small", 0}, {"gpt2-124m", 0}),
            .given = F(preset_given), .flags = CLI_LOCAL /* compared as the model it makes */),
    CLI_OPT("--layers", CLI_INT, F(sizes.layers), NULL, "N", "layers, instead of the preset's",
            .min = 1, .max = 1000, .flags = CLI_LOCAL),
    CLI_OPT("--heads", CLI_INT, F(sizes.heads), NULL, "N",
            "attention heads, instead of the preset's", .min = 1, .max = 1000, .flags = CLI_LOCAL),
    CLI_OPT("--channels", CLI_INT, F(sizes.channels), NULL, "N",
            "channels, instead of the preset's", .min = 1, .max = 1 << 16, .flags = CLI_LOCAL),
    CLI_OPT("--context", CLI_INT, F(sizes.context), NULL, "N",
            "context (positions), instead of the preset's", .min = 1, .max = 1 << 20,
            .flags = CLI_LOCAL),
    CLI_OPT("--vocab", CLI_INT, F(sizes.vocab), NULL, "N",
            "vocabulary, instead of the preset's (padded to a multiple of 128)", .min = 1,
            .max = 65536, .flags = CLI_LOCAL),
    CLI_OPT("--padded-vocab", CLI_INT, F(sizes.padded_vocab), NULL, "N",
            "padded vocabulary, instead of the preset's", .min = 1, .max = 1 << 20,
            .flags = CLI_LOCAL),
    CLI_OPT("--load", CLI_STRING, F(load), NULL, "FILE",
            "start from a model file: FILE.bin is llm.c's (fp32), FILE.safetensors Hugging Face's "
            "GPT-2 (with its config.json beside it); the model takes its sizes from the file (a "
            "--preset or sizes given must agree with it; --padded-vocab may pad a .safetensors "
            "vocabulary)",
            .flags = CLI_FILE),
    CLI_OPT("--save", CLI_STRING, F(save), NULL, "FILE",
            "write the model after training: .bin llm.c's format, .safetensors Hugging Face's (and "
            "config.json beside it, so that GPT2LMHeadModel.from_pretrained(folder) reads "
            "model.safetensors)",
            .flags = CLI_LOCAL /* rank 0 writes it */),
    CLI_OPT("--checkpoint", CLI_STRING, F(checkpoint), NULL, "FILE",
            "resumable training state (parameters, AdamW moments, step, data position and RNG), "
            "written atomically every --checkpoint-every steps and at the end",
            .flags = CLI_FILE),
    CLI_OPT("--checkpoint-every", CLI_INT, F(checkpoint_every), "100", "N",
            "steps between two writes of --checkpoint", .min = 1, .max = BIG,
            .given = F(checkpoint_every_given)),
    CLI_OPT(
        "--resume", CLI_FLAG, F(resume), NULL, NULL,
        "continue from --checkpoint FILE exactly where it stopped; the checkpoint records the run "
        "(sizes, data, batch, seq, steps, lr, AdamW, schedule, precision) and a difference is "
        "refused, naming each setting and both values"),
    CLI_OPT("--allow-change", CLI_STRING, F(allow_change), NULL, "LIST",
            "with --resume: the settings that may differ (e.g. lr,steps)"),
    CLI_OPT(
        "--start-over", CLI_FLAG, F(start_over), NULL, NULL,
        "let a new run replace what --checkpoint FILE holds (without it, and without --resume, an "
        "existing FILE is refused)"),
    CLI_OPT(
        "--stop-at", CLI_INT, F(stop_at), NULL, "N",
        "stop after step N as if interrupted (the schedule still spans --steps; with --checkpoint "
        "the state at step N is saved)",
        .min = 1, .max = BIG),
    CLI_OPT("--allow-nonfinite", CLI_FLAG, F(allow_nonfinite), NULL, NULL,
            "load a --load file even when it holds NaN or Inf"),
    CLI_SECTION("training"),
    CLI_OPT("--batch", CLI_INT, F(batch), "32", "N", "global batch, in sequences", .min = 1,
            .max = BIG, .flags = CLI_RUN),
    CLI_OPT("--seq", CLI_INT, F(seq), "32", "N", "tokens per sequence", .min = 1, .max = 1 << 20,
            .flags = CLI_RUN),
    CLI_OPT(
        "--micro-batches", CLI_INT, F(micro_batches), "1", "M",
        "gradient accumulation: run each step's --batch as M micro-batches of batch/M sequences "
        "(rows in order), one after another, and update once with the mean of their gradients: "
        "the update and loss of the whole batch (to float tolerance) with the activation memory "
        "of one micro-batch; M divides --batch",
        .min = 1, .max = BIG),
    CLI_OPT("--steps", CLI_INT, F(steps), "600", "N", "training steps", .min = 0, .max = BIG,
            .flags = CLI_RUN),
    CLI_OPT("--seed", CLI_U64, F(seed), "1", "N",
            "seed of the initial weights, the batches and sampling (the sample depends on the "
            "model, --prompt, the sampling flags and N alone)"),
    CLI_OPT("--sequential", CLI_FLAG, F(sequential), NULL, NULL,
            "batches in file order (llm.c's windows) instead of random ones", .flags = CLI_RUN),
    CLI_OPT("--lr", CLI_DOUBLE, F(lr), "2e-3", "X", "peak learning rate", .min = 0, .max = 1e3,
            .flags = CLI_RUN),
    CLI_OPT("--beta1", CLI_DOUBLE, F(beta1), "0.9", "X", "AdamW's first-moment decay", .min = 0,
            .max = 0.999999, .flags = CLI_RUN),
    CLI_OPT("--beta2", CLI_DOUBLE, F(beta2), "0.95", "X", "AdamW's second-moment decay", .min = 0,
            .max = 0.999999, .flags = CLI_RUN),
    /* 0 would divide 0 by 0 where a gradient has always been 0: AdamW refuses it */
    CLI_OPT("--eps", CLI_DOUBLE, F(eps), "1e-8", "X", "AdamW's denominator term, above 0", .min = 0,
            .max = 1, .flags = CLI_RUN | CLI_ABOVE_MIN),
    CLI_OPT("--weight-decay", CLI_DOUBLE, F(weight_decay), "0.1", "X",
            "AdamW's decoupled weight decay", .min = 0, .max = 1e3, .flags = CLI_RUN),
    CLI_OPT("--grad-clip", CLI_DOUBLE, F(grad_clip), "1", "X",
            "clip the global gradient norm to X; 0 turns it off", .min = 0, .max = 1e30,
            .flags = CLI_RUN),
    CLI_OPT("--warmup", CLI_INT, F(warmup), "20", "N", "steps of linear warm-up", .min = 0,
            .max = BIG, .flags = CLI_RUN),
    CLI_OPT("--schedule", CLI_CHOICE, F(cosine), "cosine", "S",
            "cosine (decays to --min-lr-ratio x lr by the last step) or constant",
            .choices = CLI_CHOICES({"cosine", 1}, {"constant", 0}), .flags = CLI_RUN),
    CLI_OPT("--min-lr-ratio", CLI_DOUBLE, F(min_lr_ratio), "0.1", "X",
            "the cosine schedule's final fraction of lr", .min = 0, .max = 1, .flags = CLI_RUN),
    CLI_OPT("--val-every", CLI_INT, F(val_every), "100", "N",
            "validation loss every N steps and at the end; 0: never", .min = 0, .max = BIG),
    CLI_OPT("--val-batches", CLI_INT, F(val_batches), "8", "N", "sequential batches per validation",
            .min = 1, .max = BIG),
    CLI_OPT("--skip-nonfinite", CLI_FLAG, F(skip_nonfinite), NULL, NULL,
            "skip a step whose gradients hold NaN or Inf (counted, reported) instead of stopping",
            .flags = CLI_RUN),
    CLI_SECTION("parallelism, precision and memory"),
    CLI_OPT(
        "--mesh", CLI_STRING, F(mesh), "X", "AXES",
        "arrange the devices on named mesh axes, e.g. X=2,Y=2 (the last axis varies fastest over "
        "the device list)"),
    CLI_OPT(
        "--model-axis", CLI_STRING, F(model_axis), NULL, "A",
        "tensor parallelism: split every layer's attention heads and MLP hidden units over mesh "
        "axis A; the batch is sharded over the other axis of --mesh, if any (e.g. --mesh X=2,Y=2 "
        "--model-axis Y: data parallel over X, tensor parallel over Y)"),
    CLI_OPT("--pipeline-axis", CLI_STRING, F(pipeline_axis), NULL, "A",
            "pipeline parallelism: the model's blocks in stages along mesh axis A (e.g. --devices "
            "cpu:4 --mesh P=4), the --micro-batches of each step flowing between them in the order "
            "of --pipeline-schedule: the same model, byte for byte, as the run without A"),
    CLI_OPT("--pipeline-schedule", CLI_CHOICE, F(pipeline_schedule), "1f1b", "S",
            "with --pipeline-axis: gpipe, 1f1b, interleaved (--virtual-stages per device) or "
            "zero-bubble",
            .choices =
                CLI_CHOICES({"gpipe", 0}, {"1f1b", 1}, {"interleaved", 2}, {"zero-bubble", 3}),
            .given = F(pipeline_schedule_given)),
    CLI_OPT("--virtual-stages", CLI_INT, F(virtual_stages), "2", "V",
            "with --pipeline-schedule interleaved: stages per device", .min = 2, .max = 64),
    CLI_OPT("--shard-optimizer", CLI_FLAG, F(shard_optimizer), NULL, NULL,
            "ZeRO-1: each device keeps and updates the AdamW moments of its own slice of the "
            "parameters (same results, less memory per device)"),
    CLI_OPT(
        "--shard-params", CLI_FLAG, F(shard_params), NULL, NULL,
        "FSDP: split every parameter of 16384 elements or more over the data axis; each device "
        "stores its part, gathers a parameter where it is used and reduce-scatters its gradient "
        "(same results, a quarter of the parameters, gradients and moments on 4 devices)"),
    CLI_OPT("--keep-gathered", CLI_FLAG, F(keep_gathered), NULL, NULL,
            "with --shard-params: keep each gathered parameter from forward to backward instead of "
            "gathering it again there (more memory, one all-gather per parameter and step)"),
    CLI_OPT(
        "--serial-gathers", CLI_FLAG, F(serial_gathers), NULL, NULL,
        "with --shard-params: gather each parameter where it is used, not one layer ahead (less "
        "memory; the same results)",
        .flags = CLI_LOCAL),
    CLI_OPT("--precision", CLI_CHOICE, F(bf16), "fp32", "P",
            "fp32 or bf16: contractions and attention in bf16 with f32 sums, master weights and "
            "optimizer state in f32, as PyTorch's autocast (on the CPU's AMX or AVX512-BF16 units "
            "where it has them)",
            .choices = CLI_CHOICES({"fp32", 0}, {"bf16", 1}), .flags = CLI_RUN),
    CLI_OPT(
        "--recompute", CLI_CHOICE, F(recompute), "none", "WHAT",
        "none, blocks (every transformer block's activations freed in forward and recomputed in "
        "backward: less memory, one more forward pass) or dots (blocks, but the contractions' "
        "outputs kept); the same bits either way",
        .choices = CLI_CHOICES({"none", MW_RECOMPUTE_NONE}, {"blocks", MW_RECOMPUTE_BLOCKS},
                               {"dots", MW_RECOMPUTE_DOTS})),
    CLI_OPT("--check-replicas", CLI_INT, F(check_replicas), NULL, "N",
            "compare a checksum of every replica's parameters every N steps", .min = 1, .max = BIG),
    CLI_OPT(
        "--cpu-threads", CLI_CHOICE, F(cpu_threads), "auto", "HOW",
        "threads running the CPU devices: auto (a thread each, or fewer while that is faster, as "
        "when other work keeps the cores busy or devices outnumber cores), per-device, or a count "
        "N (1: every device on the main thread, in turn); the results are the same bits either way",
        .choices =
            CLI_CHOICES({"auto", MW_CPU_THREADS_AUTO}, {"per-device", MW_CPU_THREADS_PER_DEVICE}),
        .min = 1, .max = 4096, .flags = CLI_LOCAL),
    CLI_SECTION("evaluation and sampling"),
    CLI_OPT("--eval-only", CLI_FLAG, F(eval_only), NULL, NULL,
            "print the loss over --eval-batches sequential batches, no training"),
    CLI_OPT("--eval-batches", CLI_INT, F(eval_batches), "16", "N", "batches --eval-only evaluates",
            .min = 1, .max = BIG),
    CLI_OPT("--sample", CLI_INT, F(sample), "200", "N", "generate N tokens at the end; 0: none",
            .min = 0, .max = BIG),
    CLI_OPT("--temperature", CLI_DOUBLE, F(temperature), "0.7", "X",
            "sampling temperature: the logits are divided by X; 0 picks the likeliest token "
            "(greedy, as Hugging Face's do_sample=False)",
            .min = 0, .max = 1e3),
    CLI_OPT("--top-k", CLI_INT, F(top_k), "0", "K",
            "sample among the K likeliest tokens (and those tied with the K-th), as Hugging "
            "Face's top_k; 0: every token",
            .min = 0, .max = BIG),
    CLI_OPT("--top-p", CLI_DOUBLE, F(top_p), "1", "P",
            "nucleus sampling, as Hugging Face's top_p (after --top-k): among the fewest likeliest "
            "tokens whose probabilities add up to P or more; 1: every token",
            .min = 0, .max = 1, .flags = CLI_ABOVE_MIN),
    CLI_OPT("--eos", CLI_CHOICE, F(eos), "auto", "ID",
            "the sample ends after drawing token ID (counted, as generate keeps it among the ids; "
            "a special token's text is not printed): auto is --tokenizer's <|endoftext|>, or "
            "50256 for GPT-2's tokens (vocab 50257), else none; none: it never ends early",
            .choices = CLI_CHOICES({"auto", EOS_AUTO}, {"none", EOS_NONE}), .min = 0, .max = BIG),
    CLI_OPT(
        "--sample-recompute", CLI_FLAG, F(sample_recompute), NULL, NULL,
        "sample by running the model over the whole context for every token instead of through a "
        "key/value cache (the same tokens at temperature 0: both ways the context holds at most "
        "--seq tokens, and, full, starts again from its last half)"),
    CLI_OPT("--prompt", CLI_STRING, F(prompt), "\n", "TEXT",
            "start of the sample, byte-level data (or text with --tokenizer)", .flags = CLI_HASHED),
};

static const cli_program program = {
    "gpt2",
    sizeof(options),
    table,
    CLI_COUNT(table),
    "usage: gpt2 [options]\n"
    "Trains GPT-2 over a mesh of devices: data parallel, and tensor parallel with --model-axis.\n"
    "Without --data it trains on a built-in corpus of arithmetic lines (\"123+456=579\"),\n"
    "byte-level, 10% held out for validation.\n"
    "\n",
    "\n"
    "Prints one line per step, \"step N: loss X  (M ms/step, K tokens/s)\", \"val loss X\"\n"
    "at intervals and \"final loss X\" (the last training loss). Losses are in nats/token.\n"
    "SIGINT/SIGTERM (Ctrl-C) finish the current step, write the --checkpoint and exit\n"
    "130/143 (\"interrupted at step N\"); a second one exits at once.\n"
    "Under mpirun, Ctrl-C reaches each process as SIGTERM odls_base_sigkill_timeout\n"
    "seconds later (default 1) and SIGKILL as long again after it: give the step and the\n"
    "checkpoint time with mpirun --mca odls_base_sigkill_timeout N; mpirun exits 1.\n"
    "Every file is checked before the first step: inputs are regular files (never opened\n"
    "so that they block), outputs are no input, no other output, no FIFO, device or\n"
    "folder, in a folder that takes a new file, with room; each is written beside its\n"
    "name and renamed over it when complete.\n"
    "Exit status: 0 done, 2 bad arguments, bad data or an error, 130/143 interrupted.\n",
    NULL,
};

/* " (1, 2, 4 or 8)": the divisors of n, when n is at most 1024 and has 2 to 8 of them; else
 * nothing. */
static void divisors(int n, char *out, size_t size) {
    int d[8], count = 0;
    out[0] = '\0';
    for (int k = 1; k <= n && n <= 1024 && count <= 8; k++)
        if (n % k == 0) {
            if (count < 8) d[count] = k;
            count++;
        }
    if (count < 2 || count > 8) return;
    size_t at = 0;
    for (int i = 0; i < count && at < size; i++) {
        const char *sep = i == 0 ? " (" : i < count - 1 ? ", " : " or ";
        at += (size_t)snprintf(out + at, size - at, "%s%d", sep, d[i]);
    }
    if (at < size) snprintf(out + at, size - at, ")");
}

/* Flags that contradict each other: -1 (reported), or 0. */
static int check_flags(const options *o) {
    const char *why = NULL;
    char buf[240];
    if (o->stop_at > 0 && o->stop_at >= o->steps) {
        snprintf(buf, sizeof buf, "--stop-at %d is not before the last step (--steps %d)",
                 o->stop_at, o->steps);
        why = buf;
    } else if (o->pipeline_schedule_given && !o->pipeline_axis) {
        why = "--pipeline-schedule needs --pipeline-axis A (the mesh axis of the stages)";
    } else if (o->resume && !o->checkpoint) {
        why = "--resume needs --checkpoint FILE";
    } else if (o->checkpoint_every_given && !o->checkpoint) {
        why = "--checkpoint-every needs --checkpoint FILE";
    } else if (o->allow_change && !o->resume) {
        why = "--allow-change needs --resume (it names the settings a resumed run may change)";
    } else if (o->start_over && !o->checkpoint) {
        why = "--start-over needs --checkpoint FILE";
    } else if (o->start_over && o->resume) {
        why = "--start-over and --resume contradict each other (start a new run, or continue one)";
    } else if (o->eval_only && (o->save || o->stop_at || o->skip_nonfinite)) {
        why = "--eval-only trains nothing: --save, --stop-at and --skip-nonfinite do not apply";
    } else if (o->eval_only && o->checkpoint && !o->resume) {
        why = "--eval-only trains nothing: it evaluates a --checkpoint only with --resume";
    } else if (o->batch % o->micro_batches != 0) {
        int n = snprintf(buf, sizeof buf,
                         "--micro-batches %d does not divide --batch %d: use a divisor of %d",
                         o->micro_batches, o->batch, o->batch);
        divisors(o->batch, buf + n, sizeof buf - (size_t)n);
        why = buf;
    }
    if (!why) return 0;
    perr("%s\n", why);
    return -1;
}

/* The mesh axes' roles: the model axis (--model-axis) and the data axis, the one other axis of
 * --mesh that the batch is sharded over (none when the model axis is the only one). 0, or -1
 * with the error reported. */
static int mesh_roles(options *o) {
    const char *p = o->mesh;
    int found_model = 0, found_pipe = 0, data = 0, count = 0;
    char names[16][64];
    o->data_axis[0] = '\0';
    while (*p) {
        size_t n = strcspn(p, "=,");
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1), p);
        for (int k = 0; k < count && k < 16; k++)
            if (strcmp(names[k], name) == 0) {
                perr("--mesh %s names axis %s twice\n", o->mesh, name);
                return -1;
            }
        if (count < 16) snprintf(names[count], sizeof names[count], "%s", name);
        count++;
        if (o->model_axis && strcmp(name, o->model_axis) == 0) {
            found_model = 1;
        } else if (o->pipeline_axis && strcmp(name, o->pipeline_axis) == 0) {
            found_pipe = 1;
        } else if (data++ == 0) {
            snprintf(o->data_axis, sizeof o->data_axis, "%s", name);
        }
        p += n;
        p += strcspn(p, ",");
        if (*p == ',') p++;
    }
    const char *why = NULL;
    char buf[200];
    if (o->model_axis && !found_model) {
        snprintf(buf, sizeof buf, "--model-axis %s is not an axis of the mesh %s", o->model_axis,
                 o->mesh);
        why = buf;
    } else if (o->pipeline_axis && !found_pipe) {
        snprintf(buf, sizeof buf,
                 "--pipeline-axis %s is not an axis of the mesh %s (e.g. --mesh "
                 "%s=4)",
                 o->pipeline_axis, o->mesh, o->pipeline_axis);
        why = buf;
    } else if (data > 1) {
        snprintf(buf, sizeof buf,
                 "the batch is sharded over one mesh axis, but the mesh %s has %d axes besides "
                 "the model axis",
                 o->mesh, data);
        why = buf;
    }
    if (!why) return 0;
    perr("%s\n", why);
    return -1;
}

/* The size of the data axis on a mesh of `devices` devices: given in --mesh (X=2), or the
 * devices the other axes leave (X alone); 1 without a data axis. */
static int data_axis_size(const options *o, int devices) {
    int others = 1, size = 0, data = o->data_axis[0] != '\0';
    for (const char *p = o->mesh; *p;) {
        size_t n = strcspn(p, "=,");
        int is_data = data && strlen(o->data_axis) == n && strncmp(p, o->data_axis, n) == 0;
        int given = p[n] == '=' ? atoi(p + n + 1) : 0;
        if (is_data)
            size = given;
        else if (given > 0)
            others *= given;
        p += n;
        p += strcspn(p, ",");
        if (*p == ',') p++;
    }
    if (!data) return 1;
    return size > 0 ? size : devices / others;
}

int check_micro_batches(const options *o, int devices) {
    int m = o->micro_batches, rows = o->batch / m, d = data_axis_size(o, devices);
    if (m == 1 || rows >= d) return 0;
    int most = o->batch / d; /* the largest divisor of --batch that leaves d rows or more */
    while (most > 1 && o->batch % most != 0) most--;
    if (most < 1) {
        perr("--batch %d is smaller than the %d devices of data axis %s that split it, with or "
             "without micro-batches: give a --batch of at least %d\n",
             o->batch, d, o->data_axis, d);
        return -1;
    }
    perr("--micro-batches %d leaves %d sequence%s a micro-batch (--batch %d / %d), fewer than the "
         "%d devices of data axis %s that split it: use a divisor of %d of at most %d, or a larger "
         "--batch\n",
         m, rows, rows == 1 ? "" : "s", o->batch, m, d, o->data_axis, o->batch, most);
    return -1;
}

/* llama's rows where they differ from gpt2's: the same flags, fields and defaults, its own help
 * (and presets). */
static const cli_option llama_rows[] = {
    CLI_OPT("--tokenizer", CLI_STRING, F(tokenizer), NULL, "FILE",
            "the model's tokenizer.json (byte-level BPE: Llama 3's and Qwen2's Split "
            "pre-tokenizers, GPT-2's; special tokens and the post-processor's BOS): text --data "
            "is encoded with it, --prompt is text and samples print as text; without --load the "
            "vocabulary is the tokenizer's",
            .flags = CLI_FILE),
    CLI_OPT("--preset", CLI_NAME, F(preset), "tiny", "NAME",
            "tiny (4 layers, 4 heads, 2 key/value heads, 128 channels, SwiGLU 352, context 128, "
            "bytes) or small (the same with 256 channels, SwiGLU 688, context 256)",
            .choices = CLI_CHOICES({"tiny", 0}, {"small", 0}), .given = F(preset_given),
            .flags = CLI_LOCAL),
    CLI_OPT("--load", CLI_STRING, F(load), NULL, "FILE",
            "start from a Hugging Face model: FILE.safetensors with its config.json beside it "
            "(llama, mistral without a sliding window, qwen2; every field honoured or refused by "
            "name); the model takes its sizes from the file (sizes given must agree with it)",
            .flags = CLI_FILE),
    CLI_OPT("--save", CLI_STRING, F(save), NULL, "FILE",
            "write the model after training as FILE.safetensors and config.json beside it, so "
            "that AutoModelForCausalLM.from_pretrained(folder) reads it",
            .flags = CLI_LOCAL),
};

/* The llama program: gpt2's table with llama_rows in place of the rows of the same names. */
static const cli_program *llama_program(void) {
    static cli_option rows[CLI_COUNT(table)];
    static cli_program p;
    if (!p.name) {
        memcpy(rows, table, sizeof rows);
        for (int i = 0; i < CLI_COUNT(table); i++)
            for (int j = 0; j < CLI_COUNT(llama_rows); j++)
                if (rows[i].name && strcmp(rows[i].name, llama_rows[j].name) == 0)
                    rows[i] = llama_rows[j];
        p = program;
        p.name = "llama";
        p.options = rows;
        p.synopsis =
            "usage: llama [options]\n"
            "Trains Llama-family models (Llama 2/3, Mistral, Qwen2: RMS norm, rotary positions,\n"
            "grouped-query attention, SwiGLU) over a mesh of devices: data parallel, and tensor\n"
            "parallel with --model-axis. Without --data it trains on a built-in corpus of\n"
            "arithmetic lines (\"123+456=579\"), byte-level, 10% held out for validation.\n"
            "\n";
    }
    return &p;
}

static const cli_program *program_of(int family) {
    return family == FAMILY_LLAMA ? llama_program() : &program;
}

int gpt2_args(int argc, char **argv, int family, options *o) {
    const cli_program *p = program_of(family);
    int rc = cli_parse(p, argc, argv, o);
    o->family = family; /* after the flags, which set every other field */
    if (rc > 0) cli_usage(p, stdout);
    if (rc != 0) return rc;
    return check_flags(o) || mesh_roles(o) ? -1 : 0;
}

void gpt2_args_text(const options *o, char *buf, size_t size) {
    cli_options_text(program_of(o->family), o, buf, size);
}

void gpt2_args_identity(const options *o, cli_identity *id) {
    cli_options_identity(program_of(o->family), o, id);
}

int size_agrees(const char *what, int given, int file_value, const char *path) {
    if (!given || given == file_value) return 0;
    perr("%s %d, but %s has %d (a loaded model's sizes are the file's)\n", what, given, path,
         file_value);
    return -1;
}

/* The --load file's model, which a --preset or sizes given must agree with: 0, or -1 reported. */
static int loaded_model(options *o) {
    char err[512], note[256] = "";
    gpt2_config *c = &o->model;
    const sizes *sz = &o->sizes;
    mw_status st = gpt2_is_safetensors(o->load)
                       ? gpt2_hf_read_config_note(o->load, c, note, sizeof note, err, sizeof err)
                       : gpt2_read_header(o->load, c, err, sizeof err);
    if (st != MW_OK) {
        perr("%s [%s]: %s\n", mw_strerror(st), mw_status_name(st), err);
        return -1;
    }
    if (note[0]) printf("%s: %s\n", o->load, note);
    if (o->preset_given) {
        gpt2_config p;
        char what[96];
        gpt2_preset(o->preset, &p);
        const struct {
            const char *name;
            int preset, file;
        } f[] = {{"layers", p.layers, c->layers},
                 {"heads", p.heads, c->heads},
                 {"channels", p.channels, c->channels},
                 {"context", p.max_seq, c->max_seq},
                 {"vocab", p.vocab, c->vocab}};
        for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
            snprintf(what, sizeof what, "--preset %s has %s", o->preset, f[i].name);
            if (size_agrees(what, f[i].preset, f[i].file, o->load)) return -1;
        }
        if (p.padded_vocab > c->padded_vocab) c->padded_vocab = p.padded_vocab;
    }
    if (size_agrees("--layers", sz->layers, c->layers, o->load) ||
        size_agrees("--heads", sz->heads, c->heads, o->load) ||
        size_agrees("--channels", sz->channels, c->channels, o->load) ||
        size_agrees("--context", sz->context, c->max_seq, o->load) ||
        size_agrees("--vocab", sz->vocab, c->vocab, o->load))
        return -1;
    /* Padding rows are not part of a Hugging Face file (wte holds the real vocabulary), so they
     * may be chosen; an llm.c file holds its own. */
    if (sz->padded_vocab && gpt2_is_safetensors(o->load))
        c->padded_vocab = sz->padded_vocab;
    else if (size_agrees("--padded-vocab", sz->padded_vocab, c->padded_vocab, o->load))
        return -1;
    return 0;
}

int gpt2_choose_model(options *o) {
    char err[512];
    gpt2_config *c = &o->model;
    const sizes *sz = &o->sizes;
    if (o->family == FAMILY_LLAMA) {
        if (llama_choose_model(o) != 0) return -1;
    } else if (o->load) {
        if (loaded_model(o) != 0) return -1;
    } else {
        gpt2_preset(o->preset, c);
        if (o->tok_vocab && !o->preset_given && !sz->vocab) /* the tokenizer's vocabulary */
            c->vocab = o->tok_vocab, c->padded_vocab = (o->tok_vocab + 127) / 128 * 128;
        if (sz->layers) c->layers = sz->layers;
        if (sz->heads) c->heads = sz->heads;
        if (sz->channels) c->channels = sz->channels;
        if (sz->context) c->max_seq = sz->context;
        if (sz->vocab) c->vocab = sz->vocab, c->padded_vocab = (sz->vocab + 127) / 128 * 128;
        if (sz->padded_vocab) c->padded_vocab = sz->padded_vocab;
    }
    if (o->family == FAMILY_GPT2 && gpt2_config_check(c, err, sizeof err) != 0) {
        perr("bad model size: %s\n", err);
        return -1;
    }
    if (o->tok_vocab > c->vocab) {
        perr("--tokenizer %s has %d tokens but the model's vocabulary is %d: its ids "
             "would not fit%s\n",
             o->tokenizer, o->tok_vocab, c->vocab,
             o->load ? "" : " (leave out --vocab and --preset, or give a larger --vocab)");
        return -1;
    }
    if (o->seq > c->max_seq) {
        perr("--seq %d is longer than the model's context %d\n", o->seq, c->max_seq);
        return -1;
    }
    return 0;
}
