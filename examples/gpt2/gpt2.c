/* gpt2: trains GPT-2 over a mesh of devices (data parallel, and with --model-axis tensor parallel),
 * on byte-level text, llm.c token shards
 * or a built-in arithmetic corpus; evaluates, samples, and reads and writes llm.c model files and
 * Hugging Face GPT-2 safetensors.
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
 * Exit status: 0 done, 2 bad arguments, bad data or a library error, 130/143 interrupted. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../common/cli.h"
#include "../common/gpt2_data.h"
#include "../common/gpt2_model.h"

#define MESH_AXIS "X"
#define VAL_FRACTION 0.1 /* held out of --data (or the default corpus) when no --val-data */

typedef struct options {
    const char *devices, *data, *val_data, *preset, *load, *save, *prompt, *checkpoint;
    const char *mesh;       /* mesh axes ("X=2,Y=2"); default one axis X over every device */
    const char *model_axis; /* mesh axis splitting heads and MLP units, or NULL */
    char data_axis[64];     /* mesh axis sharding the batch ("" when none) */
    gpt2_data_format format;
    int preset_given; /* --preset given: with --load, its sizes must be the file's */
    gpt2_config model;
    int batch, seq, steps, warmup, val_every, val_batches, sample, eval_batches;
    int cosine, sequential, eval_only, checkpoint_every, resume, stop_at;
    int checkpoint_every_given, allow_nonfinite, skip_nonfinite, check_replicas, shard_optimizer;
    int shard_params;         /* FSDP over the data axis */
    int keep_gathered;        /* FSDP: keep the gathered parameters from forward to backward */
    int serial_gathers;       /* FSDP: no all-gather started ahead of its use */
    int cpu_threads;          /* mw_trainer_config.cpu_threads */
    int bf16;                 /* --precision bf16 */
    int recompute;            /* --recompute: an mw_recompute */
    int sample_recompute;     /* --sample-recompute: no key/value cache */
    const char *tokenizer;    /* --tokenizer FILE */
    int tok_vocab;            /* its vocabulary size (0: no tokenizer) */
    const char *allow_change; /* --allow-change: settings a --resume may change, comma-separated */
    int start_over;           /* --start-over: a new run may replace the --checkpoint's */
    uint64_t seed;
    double lr, beta1, beta2, eps, weight_decay, grad_clip, min_lr_ratio, temperature;
} options;

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: gpt2 [options]\n"
        "Trains GPT-2 over a mesh of devices: data parallel, and tensor parallel with\n"
        "--model-axis. Without --data it trains on a\n"
        "built-in corpus of arithmetic lines (\"123+456=579\"), byte-level, 10%% held out for\n"
        "validation.\n"
        "\n"
        "devices and data\n"
        "  --devices SPEC      devices, sharding the batch over them (default cpu:2;\n"
        "                      e.g. cpu:1, cpu:4, cuda:0,1)\n"
        "  --data FILE         training data: any file as bytes (vocab 256), or an llm.c token\n"
        "                      shard (uint16 GPT-2 tokens); the last 10%% is held out unless\n"
        "                      --val-data is given. With --eval-only: the data evaluated, whole\n"
        "  --val-data FILE     validation data (with --eval-only: evaluated instead of --data)\n"
        "  --tokenizer FILE    a GPT-2 byte-level BPE tokenizer (tokenizer.json, or a folder\n"
        "                      with vocab.json and merges.txt): text --data is encoded with it,\n"
        "                      --prompt is text and samples print as text; without --load the\n"
        "                      vocabulary is the tokenizer's\n"
        "  --data-format F     auto (default: a token shard when the name ends in .bin or the\n"
        "                      file starts with its magic), text or tokens\n"
        "model\n"
        "  --preset NAME       tiny (default; 4 layers, 128 channels, context 128, bytes),\n"
        "                      small, gpt2-124m (context 1024, vocab 50257 padded to 50304)\n"
        "  --layers N, --heads N, --channels N, --context N, --vocab N, --padded-vocab N\n"
        "                      override the preset's sizes (--vocab pads to a multiple of 128)\n"
        "  --load FILE         start from a model file: FILE.bin is llm.c's (fp32),\n"
        "                      FILE.safetensors Hugging Face's GPT-2 (with its config.json\n"
        "                      beside it); the model takes its sizes from the file (a --preset\n"
        "                      or sizes given must agree with it; --padded-vocab may pad a\n"
        "                      .safetensors vocabulary)\n"
        "  --save FILE         write the model after training: .bin llm.c's format,\n"
        "                      .safetensors Hugging Face's (and config.json beside it, so that\n"
        "                      GPT2LMHeadModel.from_pretrained(folder) reads model.safetensors)\n"
        "  --checkpoint FILE   resumable training state (parameters, AdamW moments, step, data\n"
        "                      position and RNG), written atomically every --checkpoint-every N\n"
        "                      steps (default 100) and at the end\n"
        "  --resume            continue from --checkpoint FILE exactly where it stopped; the\n"
        "                      checkpoint records the run (sizes, data, batch, seq, steps, lr,\n"
        "                      AdamW, schedule, precision) and a difference is refused, naming\n"
        "                      each setting and both values\n"
        "  --allow-change LIST with --resume: the settings that may differ (e.g. lr,steps)\n"
        "  --start-over        let a new run replace what --checkpoint FILE holds (without it,\n"
        "                      and without --resume, an existing FILE is refused)\n"
        "  --stop-at N         stop after step N as if interrupted (the schedule still spans\n"
        "                      --steps; with --checkpoint the state at step N is saved)\n"
        "  --allow-nonfinite   load a --load file even when it holds NaN or Inf\n"
        "training\n"
        "  --batch N           global batch, in sequences (default 32)\n"
        "  --seq N             tokens per sequence (default 32)\n"
        "  --steps N           training steps (default 600)\n"
        "  --seed N            seed of the initial weights, the batches and sampling (default 1)\n"
        "  --sequential        batches in file order (llm.c's windows) instead of random ones\n"
        "  --lr X              peak learning rate (default 2e-3)\n"
        "  --beta1 X, --beta2 X, --eps X, --weight-decay X\n"
        "                      AdamW (defaults 0.9, 0.95, 1e-8, 0.1)\n"
        "  --warmup N          steps of linear warm-up (default 20)\n"
        "  --schedule S        cosine (default: decays to --min-lr-ratio x lr by the last step)\n"
        "                      or constant\n"
        "  --min-lr-ratio X    the cosine schedule's final fraction of lr (default 0.1)\n"
        "  --grad-clip X       clip the global gradient norm to X; 0 turns it off (default 1)\n"
        "  --val-every N       validation loss every N steps and at the end; 0: never\n"
        "                      (default 100)\n"
        "  --val-batches N     sequential batches per validation (default 8)\n"
        "  --skip-nonfinite    skip a step whose gradients hold NaN or Inf (counted, reported)\n"
        "                      instead of stopping\n"
        "  --mesh AXES         arrange the devices on named mesh axes, e.g. X=2,Y=2 (the last\n"
        "                      axis varies fastest over the device list; default: one axis X)\n"
        "  --model-axis A      tensor parallelism: split every layer's attention heads and MLP\n"
        "                      hidden units over mesh axis A; the batch is sharded over the\n"
        "                      other axis of --mesh, if any (e.g. --mesh X=2,Y=2 --model-axis Y:\n"
        "                      data parallel over X, tensor parallel over Y)\n"
        "  --shard-optimizer   ZeRO-1: each device keeps and updates the AdamW moments of its own\n"
        "                      slice of the parameters (same results, less memory per device)\n"
        "  --shard-params      FSDP: split every parameter of 16384 elements or more over the\n"
        "                      data axis; each device stores its part, gathers a parameter where\n"
        "                      it is used and reduce-scatters its gradient (same results, a\n"
        "                      quarter of the parameters, gradients and moments on 4 devices)\n"
        "  --keep-gathered     with --shard-params: keep each gathered parameter from forward to\n"
        "                      backward instead of gathering it again there (more memory, one\n"
        "                      all-gather per parameter and step)\n"
        "  --serial-gathers    with --shard-params: gather each parameter where it is used, not\n"
        "                      one layer ahead (less memory; the same results)\n"
        "  --precision P       fp32 (default) or bf16: contractions and attention in bf16 with\n"
        "                      f32 sums, master weights and optimizer state in f32, as PyTorch's\n"
        "                      autocast (on the CPU's AMX or AVX512-BF16 units where it has them)\n"
        "  --recompute WHAT    none (default), blocks (every transformer block's activations\n"
        "                      freed in forward and recomputed in backward: less memory, one\n"
        "                      more forward pass) or dots (blocks, but the contractions' outputs\n"
        "                      kept); the same bits either way\n"
        "  --check-replicas N  compare a checksum of every replica's parameters every N steps\n"
        "  --cpu-threads HOW   threads running the CPU devices: auto (default: a thread each,\n"
        "                      or fewer while that is faster, as when other work keeps the\n"
        "                      cores busy or devices outnumber cores), per-device, or a count N\n"
        "                      (1: every device on the main thread, in turn); the results are\n"
        "                      the same bits either way\n"
        "evaluation and sampling\n"
        "  --eval-only         print the loss over --eval-batches sequential batches, no training\n"
        "  --eval-batches N    (default 16)\n"
        "  --sample N          generate N tokens at the end (default 200; 0: none)\n"
        "  --temperature X     sampling temperature; 0 picks the likeliest token (default 0.7)\n"
        "  --sample-recompute  sample by running the model over the whole context for every\n"
        "                      token instead of through a key/value cache (the same tokens at\n"
        "                      temperature 0: both ways the context holds at most --seq\n"
        "                      tokens, and, full, starts again from its last half)\n"
        "  --prompt TEXT       start of the sample, byte-level data only (default a newline)\n"
        "  --help              this text\n"
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
        "Exit status: 0 done, 2 bad arguments, bad data or an error, 130/143 interrupted.\n");
}

/* --- arguments -------------------------------------------------------------------------------- */

/* Explicit model sizes, applied over the preset (or checked against the --load file's) once all
 * arguments are read; 0 when not given. */
typedef struct sizes {
    int layers, heads, channels, context, vocab, padded_vocab;
} sizes;

/* Flags that contradict each other: -1 (reported), or 0. */
static int check_flags(const options *o) {
    const char *why = NULL;
    char buf[160];
    if (o->stop_at > 0 && o->stop_at >= o->steps) {
        snprintf(buf, sizeof buf, "--stop-at %d is not before the last step (--steps %d)",
                 o->stop_at, o->steps);
        why = buf;
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
    }
    if (!why) return 0;
    fprintf(stderr, "gpt2: %s\n", why);
    return -1;
}

/* The mesh axes' roles: the model axis (--model-axis) and the data axis, the one other axis of
 * --mesh that the batch is sharded over (none when the model axis is the only one). 0, or -1
 * with the error reported. */
static int mesh_roles(options *o) {
    const char *p = o->mesh ? o->mesh : MESH_AXIS;
    int found_model = 0, data = 0, count = 0;
    char names[16][64];
    o->data_axis[0] = '\0';
    while (*p) {
        size_t n = strcspn(p, "=,");
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1), p);
        for (int k = 0; k < count && k < 16; k++)
            if (strcmp(names[k], name) == 0) {
                fprintf(stderr, "gpt2: --mesh %s names axis %s twice\n", o->mesh, name);
                return -1;
            }
        if (count < 16) snprintf(names[count], sizeof names[count], "%s", name);
        count++;
        if (o->model_axis && strcmp(name, o->model_axis) == 0) {
            found_model = 1;
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
                 o->mesh ? o->mesh : MESH_AXIS);
        why = buf;
    } else if (data > 1) {
        snprintf(buf, sizeof buf,
                 "the batch is sharded over one mesh axis, but the mesh %s has %d axes besides "
                 "the model axis",
                 o->mesh ? o->mesh : MESH_AXIS, data);
        why = buf;
    }
    if (!why) return 0;
    fprintf(stderr, "gpt2: %s\n", why);
    return -1;
}

/* 0 ok, 1 --help, -1 bad arguments (already reported). */
static int parse_args(int argc, char **argv, options *o, sizes *sz) {
    *o = (options){.devices = "cpu:2",
                   .preset = "tiny",
                   .prompt = "\n",
                   .batch = 32,
                   .seq = 32,
                   .steps = 600,
                   .warmup = 20,
                   .val_every = 100,
                   .val_batches = 8,
                   .checkpoint_every = 100,
                   .sample = 200,
                   .eval_batches = 16,
                   .cosine = 1,
                   .seed = 1,
                   .lr = 2e-3,
                   .beta1 = 0.9,
                   .beta2 = 0.95,
                   .eps = 1e-8,
                   .weight_decay = 0.1,
                   .grad_clip = 1.0,
                   .min_lr_ratio = 0.1,
                   .temperature = 0.7};
    memset(sz, 0, sizeof *sz);
    const long big = 1L << 30;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *v = NULL;
        int missing = 0, bad = 0, matched = 1;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) return 1;
        if (strcmp(arg, "--sequential") == 0) {
            o->sequential = 1;
        } else if (strcmp(arg, "--eval-only") == 0) {
            o->eval_only = 1;
        } else if (strcmp(arg, "--resume") == 0) {
            o->resume = 1;
        } else if (strcmp(arg, "--start-over") == 0) {
            o->start_over = 1;
        } else if ((v = cli_option_value(argc, argv, &i, "--allow-change", &missing))) {
            o->allow_change = v;
        } else if (strcmp(arg, "--allow-nonfinite") == 0) {
            o->allow_nonfinite = 1;
        } else if (strcmp(arg, "--skip-nonfinite") == 0) {
            o->skip_nonfinite = 1;
        } else if (strcmp(arg, "--shard-optimizer") == 0) {
            o->shard_optimizer = 1;
        } else if (strcmp(arg, "--shard-params") == 0) {
            o->shard_params = 1;
        } else if (strcmp(arg, "--keep-gathered") == 0) {
            o->keep_gathered = 1;
        } else if (strcmp(arg, "--serial-gathers") == 0) {
            o->serial_gathers = 1;
        } else if ((v = cli_option_value(argc, argv, &i, "--precision", &missing))) {
            if (strcmp(v, "bf16") && strcmp(v, "fp32")) {
                fprintf(stderr, "gpt2: --precision %s: expected fp32 or bf16\n", v);
                return -1;
            }
            o->bf16 = !strcmp(v, "bf16");
        } else if ((v = cli_option_value(argc, argv, &i, "--recompute", &missing))) {
            if (strcmp(v, "none") && strcmp(v, "blocks") && strcmp(v, "dots")) {
                fprintf(stderr, "gpt2: --recompute %s: expected none, blocks or dots\n", v);
                return -1;
            }
            o->recompute = !strcmp(v, "blocks") ? MW_RECOMPUTE_BLOCKS
                           : !strcmp(v, "dots") ? MW_RECOMPUTE_DOTS
                                                : MW_RECOMPUTE_NONE;
        } else if ((v = cli_option_value(argc, argv, &i, "--check-replicas", &missing))) {
            bad = cli_parse_int(v, 1, big, &o->check_replicas);
        } else if ((v = cli_option_value(argc, argv, &i, "--cpu-threads", &missing))) {
            if (strcmp(v, "auto") == 0)
                o->cpu_threads = MW_CPU_THREADS_AUTO;
            else if (strcmp(v, "per-device") == 0)
                o->cpu_threads = MW_CPU_THREADS_PER_DEVICE;
            else
                bad = cli_parse_int(v, 1, 4096, &o->cpu_threads);
        } else if ((v = cli_option_value(argc, argv, &i, "--devices", &missing))) {
            o->devices = v;
        } else if ((v = cli_option_value(argc, argv, &i, "--mesh", &missing))) {
            o->mesh = v;
        } else if ((v = cli_option_value(argc, argv, &i, "--model-axis", &missing))) {
            o->model_axis = v;
        } else if ((v = cli_option_value(argc, argv, &i, "--data", &missing))) {
            o->data = v;
        } else if ((v = cli_option_value(argc, argv, &i, "--tokenizer", &missing))) {
            o->tokenizer = v;
        } else if ((v = cli_option_value(argc, argv, &i, "--val-data", &missing))) {
            o->val_data = v;
        } else if ((v = cli_option_value(argc, argv, &i, "--data-format", &missing))) {
            if (strcmp(v, "auto") == 0)
                o->format = GPT2_DATA_AUTO;
            else if (strcmp(v, "text") == 0)
                o->format = GPT2_DATA_TEXT;
            else if (strcmp(v, "tokens") == 0)
                o->format = GPT2_DATA_SHARD;
            else
                bad = 1;
        } else if ((v = cli_option_value(argc, argv, &i, "--preset", &missing))) {
            gpt2_config c;
            o->preset = v;
            o->preset_given = 1;
            if (gpt2_preset(v, &c) != 0) {
                fprintf(stderr, "gpt2: unknown preset '%s' (tiny, small, gpt2-124m)\n", v);
                return -1;
            }
        } else if ((v = cli_option_value(argc, argv, &i, "--layers", &missing))) {
            bad = cli_parse_int(v, 1, 1000, &sz->layers);
        } else if ((v = cli_option_value(argc, argv, &i, "--heads", &missing))) {
            bad = cli_parse_int(v, 1, 1000, &sz->heads);
        } else if ((v = cli_option_value(argc, argv, &i, "--channels", &missing))) {
            bad = cli_parse_int(v, 1, 1L << 16, &sz->channels);
        } else if ((v = cli_option_value(argc, argv, &i, "--context", &missing))) {
            bad = cli_parse_int(v, 1, 1L << 20, &sz->context);
        } else if ((v = cli_option_value(argc, argv, &i, "--vocab", &missing))) {
            bad = cli_parse_int(v, 1, 65536, &sz->vocab);
        } else if ((v = cli_option_value(argc, argv, &i, "--padded-vocab", &missing))) {
            bad = cli_parse_int(v, 1, 1L << 20, &sz->padded_vocab);
        } else if ((v = cli_option_value(argc, argv, &i, "--load", &missing))) {
            o->load = v;
        } else if ((v = cli_option_value(argc, argv, &i, "--save", &missing))) {
            o->save = v;
        } else if ((v = cli_option_value(argc, argv, &i, "--checkpoint", &missing))) {
            o->checkpoint = v;
        } else if ((v = cli_option_value(argc, argv, &i, "--stop-at", &missing))) {
            bad = cli_parse_int(v, 1, big, &o->stop_at);
        } else if ((v = cli_option_value(argc, argv, &i, "--checkpoint-every", &missing))) {
            bad = cli_parse_int(v, 1, big, &o->checkpoint_every);
            o->checkpoint_every_given = 1;
        } else if ((v = cli_option_value(argc, argv, &i, "--batch", &missing))) {
            bad = cli_parse_int(v, 1, big, &o->batch);
        } else if ((v = cli_option_value(argc, argv, &i, "--seq", &missing))) {
            bad = cli_parse_int(v, 1, 1L << 20, &o->seq);
        } else if ((v = cli_option_value(argc, argv, &i, "--steps", &missing))) {
            bad = cli_parse_int(v, 0, big, &o->steps);
        } else if ((v = cli_option_value(argc, argv, &i, "--seed", &missing))) {
            bad = cli_parse_u64(v, &o->seed);
        } else if ((v = cli_option_value(argc, argv, &i, "--lr", &missing))) {
            bad = cli_parse_double(v, 0.0, 1e3, &o->lr);
        } else if ((v = cli_option_value(argc, argv, &i, "--beta1", &missing))) {
            bad = cli_parse_double(v, 0.0, 0.999999, &o->beta1);
        } else if ((v = cli_option_value(argc, argv, &i, "--beta2", &missing))) {
            bad = cli_parse_double(v, 0.0, 0.999999, &o->beta2);
        } else if ((v = cli_option_value(argc, argv, &i, "--eps", &missing))) {
            /* 0 would divide 0 by 0 where a gradient has always been 0: AdamW refuses it */
            bad = cli_parse_double(v, 0.0, 1.0, &o->eps) || !(o->eps > 0.0);
        } else if ((v = cli_option_value(argc, argv, &i, "--weight-decay", &missing))) {
            bad = cli_parse_double(v, 0.0, 1e3, &o->weight_decay);
        } else if ((v = cli_option_value(argc, argv, &i, "--warmup", &missing))) {
            bad = cli_parse_int(v, 0, big, &o->warmup);
        } else if ((v = cli_option_value(argc, argv, &i, "--schedule", &missing))) {
            if (strcmp(v, "cosine") == 0)
                o->cosine = 1;
            else if (strcmp(v, "constant") == 0)
                o->cosine = 0;
            else
                bad = 1;
        } else if ((v = cli_option_value(argc, argv, &i, "--min-lr-ratio", &missing))) {
            bad = cli_parse_double(v, 0.0, 1.0, &o->min_lr_ratio);
        } else if ((v = cli_option_value(argc, argv, &i, "--grad-clip", &missing))) {
            bad = cli_parse_double(v, 0.0, 1e30, &o->grad_clip);
        } else if ((v = cli_option_value(argc, argv, &i, "--val-every", &missing))) {
            bad = cli_parse_int(v, 0, big, &o->val_every);
        } else if ((v = cli_option_value(argc, argv, &i, "--val-batches", &missing))) {
            bad = cli_parse_int(v, 1, big, &o->val_batches);
        } else if ((v = cli_option_value(argc, argv, &i, "--eval-batches", &missing))) {
            bad = cli_parse_int(v, 1, big, &o->eval_batches);
        } else if ((v = cli_option_value(argc, argv, &i, "--sample", &missing))) {
            bad = cli_parse_int(v, 0, big, &o->sample);
        } else if (strcmp(arg, "--sample-recompute") == 0) {
            o->sample_recompute = 1;
        } else if ((v = cli_option_value(argc, argv, &i, "--temperature", &missing))) {
            bad = cli_parse_double(v, 0.0, 1e3, &o->temperature);
        } else if ((v = cli_option_value(argc, argv, &i, "--prompt", &missing))) {
            o->prompt = v;
        } else {
            matched = 0;
        }
        if (cli_report("gpt2", arg, v, matched, missing, bad)) return -1;
    }
    return check_flags(o) || mesh_roles(o) ? -1 : 0;
}

/* A size the command line gives for a --load model must be the file's own: 0 when it is (or
 * not given), -1 with a message naming both otherwise. */
static int agrees(const char *what, int given, int file_value, const char *path) {
    if (!given || given == file_value) return 0;
    fprintf(stderr, "gpt2: %s %d, but %s has %d (a loaded model's sizes are the file's)\n", what,
            given, path, file_value);
    return -1;
}

/* The model: the --load file's own (its header, or config.json), which a --preset or explicit
 * sizes given too must agree with; else the preset with the explicit sizes over it. 0, or -1
 * with the error reported. */
static int choose_model(options *o, const sizes *sz) {
    char err[512], note[256] = "";
    gpt2_config *c = &o->model;
    if (o->load) {
        mw_status st =
            gpt2_is_safetensors(o->load)
                ? gpt2_hf_read_config_note(o->load, c, note, sizeof note, err, sizeof err)
                : gpt2_read_header(o->load, c, err, sizeof err);
        if (st != MW_OK) {
            fprintf(stderr, "gpt2: %s [%s]: %s\n", mw_strerror(st), mw_status_name(st), err);
            return -1;
        }
        if (note[0]) printf("%s: %s\n", o->load, note);
        gpt2_config p;
        if (o->preset_given) {
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
                if (agrees(what, f[i].preset, f[i].file, o->load)) return -1;
            }
            if (p.padded_vocab > c->padded_vocab) c->padded_vocab = p.padded_vocab;
        }
        if (agrees("--layers", sz->layers, c->layers, o->load) ||
            agrees("--heads", sz->heads, c->heads, o->load) ||
            agrees("--channels", sz->channels, c->channels, o->load) ||
            agrees("--context", sz->context, c->max_seq, o->load) ||
            agrees("--vocab", sz->vocab, c->vocab, o->load))
            return -1;
        /* Padding rows are not part of a Hugging Face file (wte holds the real vocabulary), so
         * they may be chosen; an llm.c file holds its own. */
        if (sz->padded_vocab && gpt2_is_safetensors(o->load))
            c->padded_vocab = sz->padded_vocab;
        else if (agrees("--padded-vocab", sz->padded_vocab, c->padded_vocab, o->load))
            return -1;
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
    if (gpt2_config_check(c, err, sizeof err) != 0) {
        fprintf(stderr, "gpt2: bad model size: %s\n", err);
        return -1;
    }
    if (o->tok_vocab > c->vocab) {
        fprintf(stderr,
                "gpt2: --tokenizer %s has %d tokens but the model's vocabulary is %d: its ids "
                "would not fit%s\n",
                o->tokenizer, o->tok_vocab, c->vocab,
                o->load ? "" : " (leave out --vocab and --preset, or give a larger --vocab)");
        return -1;
    }
    if (o->seq > c->max_seq) {
        fprintf(stderr, "gpt2: --seq %d is longer than the model's context %d\n", o->seq,
                c->max_seq);
        return -1;
    }
    return 0;
}

/* --- the run ---------------------------------------------------------------------------------- */

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
} run;

/* Reports a failed library call; returns the exit status for it. */
static int fail(mw_status st, const char *what) {
    fflush(stdout);
    const char *msg = mw_last_error();
    fprintf(stderr, "gpt2: %s: %s [%s]%s%s\n", what, mw_strerror(st), mw_status_name(st),
            *msg ? ": " : "", msg);
    return 2;
}

/* Reports an error with its own message (from the data and model-file functions). */
static int fail_msg(mw_status st, const char *msg) {
    fflush(stdout);
    fprintf(stderr, "gpt2: %s [%s]: %s\n", mw_strerror(st), mw_status_name(st), msg);
    return 2;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The default corpus (bytes) as text through the tokenizer. */
static mw_status encode_corpus(run *r) {
    size_t len = (size_t)r->data.count, n = 0, cap = mw_tokenizer_max_ids(r->tok, len);
    char *text = malloc(len + 1);
    int32_t *ids = malloc((cap ? cap : 1) * sizeof *ids);
    mw_status st = text && ids ? MW_OK : MW_ERR_NOMEM;
    for (size_t i = 0; st == MW_OK && i < len; i++) text[i] = (char)r->data.ids[i];
    if (st == MW_OK) st = mw_tokenizer_encode(r->tok, text, len, ids, cap, &n);
    uint16_t *narrow = st == MW_OK ? malloc((n ? n : 1) * sizeof *narrow) : NULL;
    if (st == MW_OK && !narrow) st = MW_ERR_NOMEM;
    if (st == MW_OK && mw_tokenizer_vocab_size(r->tok) > 65536)
        st = MW_ERR_UNSUPPORTED; /* its ids do not fit the token data's uint16 */
    for (size_t i = 0; st == MW_OK && i < n; i++) narrow[i] = (uint16_t)ids[i];
    if (st == MW_OK) {
        gpt2_tokens_free(&r->data);
        r->data = (gpt2_tokens){narrow, (int64_t)n, 1};
        narrow = NULL;
    }
    free(narrow);
    free(text);
    free(ids);
    return st;
}

/* Loads or generates the data and splits it; checks every token against the vocabulary and that
 * the sets hold a batch. Returns 0 or the exit status. */
static int prepare_data(run *r) {
    const options *o = &r->o;
    char err[512];
    mw_status st;
    if (o->data && r->tok && gpt2_data_detect(o->data, o->format) == GPT2_DATA_TEXT) {
        double secs = 0;
        st = gpt2_tokens_encode_text(o->data, r->tok, &r->data, &secs, err, sizeof err);
        if (st != MW_OK) return fail_msg(st, err);
        printf("encoded %s with %s: %lld tokens in %.2f s\n", o->data, o->tokenizer,
               (long long)r->data.count, secs);
    } else if (o->data) {
        st = gpt2_tokens_load(o->data, o->format, &r->data, err, sizeof err);
        if (st != MW_OK) return fail_msg(st, err);
        r->byte_level = !r->tok && gpt2_data_detect(o->data, o->format) == GPT2_DATA_TEXT;
    } else {
        st = gpt2_corpus_generate(GPT2_CORPUS_SEED, GPT2_CORPUS_BYTES, &r->data);
        if (st != MW_OK) return fail_msg(st, "cannot generate the default corpus");
        r->corpus = 1;
        r->byte_level = !r->tok;
        if (r->tok && (st = encode_corpus(r)) != MW_OK)
            return fail(st, "cannot encode the default corpus with --tokenizer");
    }
    if (o->val_data && r->tok && gpt2_data_detect(o->val_data, o->format) == GPT2_DATA_TEXT) {
        st = gpt2_tokens_encode_text(o->val_data, r->tok, &r->val_file, NULL, err, sizeof err);
        if (st != MW_OK) return fail_msg(st, err);
        r->train = (gpt2_tokens){r->data.ids, r->data.count, 0};
        r->val = (gpt2_tokens){r->val_file.ids, r->val_file.count, 0};
    } else if (o->val_data) {
        st = gpt2_tokens_load(o->val_data, o->format, &r->val_file, err, sizeof err);
        if (st != MW_OK) return fail_msg(st, err);
        r->train = (gpt2_tokens){r->data.ids, r->data.count, 0};
        r->val = (gpt2_tokens){r->val_file.ids, r->val_file.count, 0};
    } else if (o->eval_only && o->data) {
        r->val = (gpt2_tokens){r->data.ids, r->data.count, 0}; /* the whole file is evaluated */
    } else {
        gpt2_tokens_split(&r->data, VAL_FRACTION, &r->train, &r->val);
    }
    const char *data_name = o->data ? o->data : "the default corpus";
    const char *val_name = o->val_data ? o->val_data : "the validation data";
    if (!o->eval_only) {
        st = gpt2_tokens_check_vocab(&r->train, o->model.vocab, data_name, err, sizeof err);
        if (st != MW_OK) {
            fail_msg(st, err);
            if (!r->byte_level)
                fprintf(stderr, "gpt2: (GPT-2 tokens need --preset gpt2-124m or --vocab 50257)\n");
            return 2;
        }
        st = gpt2_batch_check(&r->train, o->batch, o->seq, !o->sequential, data_name, err,
                              sizeof err);
        if (st != MW_OK) return fail_msg(st, err);
    }
    if (o->eval_only || o->val_every > 0) {
        st = gpt2_tokens_check_vocab(&r->val, o->model.vocab, val_name, err, sizeof err);
        if (st == MW_OK)
            st = gpt2_batch_check(&r->val, o->batch, o->seq, 0, val_name, err, sizeof err);
        if (st != MW_OK) {
            fail_msg(st, err);
            if (!o->eval_only && !o->val_data)
                fprintf(stderr,
                        "gpt2: (the last 10%% of %s is held out for validation; give "
                        "--val-data, smaller --batch/--seq, or --val-every 0)\n",
                        data_name);
            return 2;
        }
    }
    return 0;
}

static void print_setup(const run *r) {
    const options *o = &r->o;
    const gpt2_config *c = &o->model;
    printf("meshwit %s, BLAS core %s\n", mw_version(), mw_blas_core());
    if (*mw_blas_warning()) printf("warning: %s\n", mw_blas_warning());
    printf("%s\n", mw_mesh_describe(r->mesh));
    printf("model: %d layers, %d heads, %d channels, context %d, vocab %d (padded %d): %lld "
           "parameters\n",
           c->layers, c->heads, c->channels, c->max_seq, c->vocab, c->padded_vocab,
           (long long)gpt2_num_params(c));
    const char *name = o->data ? o->data : "default corpus (arithmetic lines, generated)";
    printf("data: %s, %s, %lld tokens", name,
           r->byte_level ? "bytes"
           : r->tok      ? "tokens of --tokenizer"
                         : "llm.c tokens",
           (long long)r->data.count);
    if (o->eval_only) {
        printf("; evaluating %lld tokens\n", (long long)r->val.count);
    } else {
        printf("; train %lld, val %lld%s\n", (long long)r->train.count, (long long)r->val.count,
               o->val_data ? " (--val-data)" : " (held out)");
        printf("unigram entropy (the loss of a model that knows only token frequencies): train "
               "%.4f, val %.4f nats/token\n",
               gpt2_tokens_entropy(&r->train), gpt2_tokens_entropy(&r->val));
        printf("batch %d x %d (%s windows), %d steps, AdamW lr %g (%s, warm-up %d), grad clip "
               "%g\n",
               o->batch, o->seq, o->sequential ? "sequential" : "random", o->steps, o->lr,
               o->cosine ? "cosine" : "constant", o->warmup, o->grad_clip);
    }
    fflush(stdout);
}

/* Builds the model for batch x seq over `mesh`, sharded along Batch over the data axis and, with
 * --model-axis, split over the model axis. */
static mw_status build(const options *o, int batch, int seq, mw_mesh *mesh, mw_graph **g,
                       gpt2_graph *m, mw_trainer **tr) {
    mw_status st = mw_graph_new(g);
    if (st != MW_OK) return st;
    mw_graph_set_seed(*g, o->seed);
    const char *data = o->data_axis[0] ? o->data_axis : NULL;
    st = gpt2_build(*g, &o->model,
                    &(gpt2_layout){.batch = batch,
                                   .seq = seq,
                                   .data_axis = data,
                                   .model_axis = o->model_axis,
                                   .fsdp_axis = o->shard_params ? data : NULL},
                    m);
    if (st != MW_OK) return st;
    mw_trainer_config cfg = {.optimizer = {.kind = MW_ADAMW,
                                           .lr = (float)o->lr,
                                           .beta1 = (float)o->beta1,
                                           .beta2 = (float)o->beta2,
                                           .eps = (float)o->eps,
                                           .weight_decay = (float)o->weight_decay,
                                           .grad_clip = (float)o->grad_clip,
                                           .warmup_steps = o->warmup,
                                           .decay_steps = o->cosine ? o->steps : 0,
                                           .min_lr_ratio = (float)o->min_lr_ratio},
                             .nonfinite = o->skip_nonfinite ? MW_NONFINITE_SKIP : MW_NONFINITE_STOP,
                             .check_replicas_every = o->check_replicas,
                             .shard_optimizer = o->shard_optimizer,
                             .cpu_threads = o->cpu_threads,
                             .precision = o->bf16 ? MW_PRECISION_BF16 : MW_PRECISION_FP32,
                             .recompute = (mw_recompute)o->recompute,
                             .keep_gathered = o->keep_gathered,
                             .serial_gathers = o->serial_gathers};
    return mw_trainer_new(*g, m->loss, mesh, &cfg, tr);
}

/* Mean loss over the first n sequential batches of t (fewer when t holds fewer). */
static mw_status evaluate(run *r, const gpt2_tokens *t, int n, float *loss, int *used) {
    int64_t avail = gpt2_batch_count(t, r->o.batch, r->o.seq);
    if (n > avail) n = (int)avail;
    double sum = 0.0;
    mw_feed feeds[2];
    gpt2_batch_feeds(&r->batch, feeds);
    for (int k = 0; k < n; k++) {
        float l;
        gpt2_batch_sequential(&r->batch, t, k);
        mw_status st = mw_trainer_eval(r->tr, feeds, 2, &l);
        if (st != MW_OK) return st;
        sum += l;
    }
    *loss = (float)(sum / n);
    if (used) *used = n;
    return MW_OK;
}

/* The example's own part of a checkpoint: where the data stream and the sampler stand, and the
 * run it belongs to (its settings, as run_identity writes them). */
typedef struct resume_state {
    uint64_t magic; /* RESUME_MAGIC_RUN; RESUME_MAGIC: an older state, without the identity */
    uint64_t rng;
    int64_t step;
    char identity[sizeof((cli_identity *)0)->text];
} resume_state;

#define RESUME_MAGIC 0x6770743272657375ull     /* "gpt2resu" */
#define RESUME_MAGIC_RUN 0x6770743272756e31ull /* "gpt2run1" */
#define RESUME_OLD_BYTES offsetof(resume_state, identity)

/* Under mpirun every process calls it: the save is collective (ZeRO-1 gathers the other
 * processes' moments), and every process writes the file it resumes from (on a shared file
 * system the writers' temporary files differ and each rename leaves one complete state). */
static mw_status save_checkpoint(run *r) {
    static resume_state rs; /* 3 KB: not on the stack of every save */
    memset(&rs, 0, sizeof rs);
    rs = (resume_state){RESUME_MAGIC_RUN, r->rng.state, mw_trainer_steps(r->tr), {0}};
    memcpy(rs.identity, r->identity.text, r->identity.len + 1);
    return mw_trainer_save(r->tr, r->o.checkpoint, &rs, sizeof rs);
}

/* After a stop request: the step in flight has finished; saves the checkpoint when one is
 * configured. Returns 130 (SIGINT) or 143 (SIGTERM), or 2 when the save fails. */
static int interrupted(run *r) {
    long long at = (long long)mw_trainer_steps(r->tr);
    if (r->o.checkpoint) {
        mw_status st = save_checkpoint(r);
        if (st != MW_OK) return fail(st, "interrupted, and cannot write the checkpoint");
        printf("interrupted at step %lld; resume with --resume\n", at);
    } else {
        printf("interrupted at step %lld (no --checkpoint: nothing saved)\n", at);
    }
    fflush(stdout);
    return cli_stop_status();
}

/* Under mpirun a Ctrl-C leaves each process cli_mpirun_grace() seconds between SIGTERM and
 * SIGKILL: said once when a step and a checkpoint take longer, with the flag that gives them
 * the time (else the steps since the last checkpoint are lost). */
static void note_grace(double step_and_save_ms) {
    static int said;
    double grace = cli_mpirun_grace();
    if (said || grace < 0 || step_and_save_ms <= 1e3 * grace) return;
    said = 1;
    printf("note: under mpirun, Ctrl-C leaves each process %g s after its SIGTERM to finish the "
           "step and write the checkpoint, and they take %.1f s here: start mpirun with --mca "
           "odls_base_sigkill_timeout %d to keep the steps since the last checkpoint\n",
           grace, step_and_save_ms / 1e3, (int)ceil(2.0 * step_and_save_ms / 1e3) + 1);
}

static int train(run *r) {
    const options *o = &r->o;
    mw_feed feeds[2];
    gpt2_batch_feeds(&r->batch, feeds);
    float loss = NAN, val;
    for (int s = (int)mw_trainer_steps(r->tr); s < o->steps; s++) {
        double t0 = now();
        gpt2_rng before = r->rng; /* an interrupted step leaves the data stream where it was */
        if (o->sequential)
            gpt2_batch_sequential(&r->batch, &r->train, s);
        else
            gpt2_batch_random(&r->batch, &r->train, &r->rng);
        int64_t skipped = mw_trainer_skipped_steps(r->tr);
        mw_status st = mw_trainer_step(r->tr, feeds, 2, &loss);
        if (st == MW_ERR_INTERRUPTED) {
            r->rng = before;
            return interrupted(r);
        }
        if (st != MW_OK) return fail(st, "training step failed");
        double ms = 1e3 * (now() - t0);
        printf("step %d: loss %.4f  (%.1f ms/step, %.0f tokens/s)\n", s + 1, loss, ms,
               (double)o->batch * o->seq / (ms * 1e-3));
        if (mw_trainer_skipped_steps(r->tr) > skipped)
            printf("step %d skipped: non-finite loss or gradients, nothing updated (%lld "
                   "skipped so far)\n",
                   s + 1, (long long)mw_trainer_skipped_steps(r->tr));
        fflush(stdout);
        if (!isfinite(loss) && !o->skip_nonfinite) {
            fprintf(stderr, "gpt2: the loss is %f at step %d; try a lower --lr\n", loss, s + 1);
            return 2;
        }
        int stop = o->stop_at > 0 && s + 1 == o->stop_at;
        if (o->checkpoint && ((s + 1) % o->checkpoint_every == 0 || s + 1 == o->steps || stop)) {
            double t1 = now();
            if ((st = save_checkpoint(r)) != MW_OK) return fail(st, "cannot write the checkpoint");
            note_grace(ms + 1e3 * (now() - t1));
        }
        if (o->val_every > 0 && ((s + 1) % o->val_every == 0 || s + 1 == o->steps)) {
            st = evaluate(r, &r->val, o->val_batches, &val, NULL);
            if (st != MW_OK) return fail(st, "validation failed");
            printf("val loss %.4f  (after step %d)\n", val, s + 1);
            fflush(stdout);
        }
        if (stop) {
            printf("stopped after step %d (--stop-at)\n", s + 1);
            return 0;
        }
    }
    if (o->steps > 0) printf("final loss %.4f\n", loss);
    if (mw_trainer_skipped_steps(r->tr) > 0)
        printf("%lld steps skipped for non-finite values\n",
               (long long)mw_trainer_skipped_steps(r->tr));
    return 0;
}

/* A token drawn from softmax(logits / temperature) over the first `vocab` entries (the likeliest
 * one at temperature 0). */
static int draw(const float *logits, int vocab, double temperature, gpt2_rng *rng) {
    int best = 0;
    for (int v = 1; v < vocab; v++)
        if (logits[v] > logits[best]) best = v;
    if (temperature <= 0.0) return best;
    double total = 0.0;
    for (int v = 0; v < vocab; v++) total += exp((logits[v] - logits[best]) / temperature);
    double u = gpt2_rng_uniform(rng) * total, acc = 0.0;
    for (int v = 0; v < vocab; v++) {
        acc += exp((logits[v] - logits[best]) / temperature);
        if (u < acc) return v;
    }
    return best;
}

/* A byte as itself, except control characters other than newline and tab, which could upset the
 * terminal; a BPE token as its id. */
static void print_token(int token, int byte_level) {
    if (!byte_level)
        printf("%d ", token);
    else if ((token < 0x20 && token != '\n' && token != '\t') || token == 0x7f)
        printf("\\x%02x", token);
    else
        putchar(token);
}

/* A token as its text (the bytes the tokenizer decodes it to; a token's bytes do not depend on
 * its neighbours, so printing them one by one prints the text). */
static void print_text_token(const mw_tokenizer *tok, int32_t id) {
    char buf[256];
    size_t len = 0;
    if (mw_tokenizer_decode(tok, &id, 1, buf, sizeof buf, &len) == MW_OK)
        fwrite(buf, 1, len, stdout);
    else
        printf("<%d>", (int)id);
}

/* What produces the logits of the next token: a decoding program with a key/value cache (one
 * position per run), or the model over the whole window each time (--sample-recompute). */
typedef struct sampler {
    int cached, window, at; /* at: positions in the cache (cached) */
    int start, fed;         /* the context's first token in the history; tokens seen so far */
    mw_graph *g;
    mw_infer *inf;
    mw_tensor *logits;
    int32_t *tokens; /* recompute: the window */
    float *out;      /* recompute: window x Vp logits; cached: Vp */
} sampler;

static mw_status sampler_open(run *r, sampler *s) {
    const options *o = &r->o;
    const gpt2_config *c = &o->model;
    memset(s, 0, sizeof *s);
    s->cached = !o->sample_recompute;
    s->window = o->seq;
    s->tokens = calloc((size_t)s->window, sizeof *s->tokens);
    s->out = malloc((size_t)(s->cached ? 1 : s->window) * (size_t)c->padded_vocab * sizeof *s->out);
    mw_status st = s->tokens && s->out ? mw_graph_new(&s->g) : MW_ERR_NOMEM;
    if (st == MW_OK && s->cached) {
        gpt2_graph d;
        st = gpt2_build(
            s->g, c, &(gpt2_layout){.mode = GPT2_DECODE, .batch = 1, .model_axis = o->model_axis},
            &d);
        s->logits = d.logits;
    } else if (st == MW_OK) {
        gpt2_graph m;
        st = gpt2_build(
            s->g, c, &(gpt2_layout){.batch = 1, .seq = s->window, .model_axis = o->model_axis}, &m);
        s->logits = m.logits;
    }
    if (st == MW_OK) {
        mw_infer_config ic = {.outputs = &s->logits,
                              .noutputs = 1,
                              .precision = o->bf16 ? MW_PRECISION_BF16 : MW_PRECISION_FP32};
        /* FSDP splits the trainer's parameters over the data axis, which a sequence at a time
         * cannot shard: the program holds them whole, copied from the trainer. */
        if (o->shard_params && o->data_axis[0]) {
            st = mw_infer_new(s->g, r->mesh, &ic, &s->inf);
            if (st == MW_OK) st = gpt2_copy_params(r->tr, s->inf, c);
        } else {
            st = mw_infer_from_trainer(r->tr, s->g, &ic, &s->inf);
        }
    }
    return st;
}

static void sampler_close(sampler *s) {
    mw_infer_free(s->inf);
    mw_graph_free(s->g);
    free(s->tokens);
    free(s->out);
}

/* One decoding step: the token at cache position s->at; its logits to s->out. */
static mw_status sampler_feed(sampler *s, int32_t token) {
    int32_t pos = s->at;
    mw_feed in[2] = {{"tokens", &token, 1}, {"pos", &pos, 1}};
    mw_fetch f = {s->logits, s->out, mw_tensor_numel(s->logits)};
    mw_status st = mw_infer_run(s->inf, in, 2, 1, &f, 1);
    if (st == MW_OK) s->at++;
    return st;
}

/* The logits of the token after hist[0, n), in *logits. The model sees the context
 * hist[start, n) at positions 0, 1, ...: when it would grow beyond the window it starts again
 * from its last half, so the model never sees a position beyond the window it was trained on.
 * The key/value cache is fed the tokens since the last call one by one (and the kept half again
 * at such a restart); recomputing runs the model over the context each time. Both see the same
 * context, so at temperature 0 they pick the same tokens, beyond the window too. */
static mw_status sampler_next(sampler *s, const int32_t *hist, int n, int Vp,
                              const float **logits) {
    mw_status st = MW_OK;
    const int keep = s->window / 2 > 0 ? s->window / 2 : 1;
    for (int i = s->fed; i < n && st == MW_OK; i++) {
        if (i - s->start == s->window) { /* full: keep the last half */
            s->start = i - keep;
            s->at = 0;
            for (int k = s->start; s->cached && k < i && st == MW_OK; k++)
                st = sampler_feed(s, hist[k]);
        }
        if (s->cached && st == MW_OK) st = sampler_feed(s, hist[i]);
    }
    s->fed = n;
    *logits = s->out;
    if (s->cached || st != MW_OK) return st;
    int len = n - s->start;
    memcpy(s->tokens, hist + s->start, (size_t)len * sizeof *s->tokens);
    mw_feed feed = {"tokens", s->tokens, s->window};
    mw_fetch f = {s->logits, s->out, (int64_t)s->window * Vp};
    st = mw_infer_run(s->inf, &feed, 1, 1, &f, 1);
    *logits = s->out + (size_t)(len - 1) * (size_t)Vp;
    return st;
}

/* The sample's first tokens, made (and checked against the vocabulary) before training: the
 * --prompt's bytes, or its tokens through --tokenizer, or <|endoftext|>. 0, or the exit status
 * (reported). */
static int prepare_prompt(run *r) {
    const options *o = &r->o;
    const int V = o->model.vocab;
    size_t len = strlen(o->prompt), cap = (r->tok ? mw_tokenizer_max_ids(r->tok, len) : len) + 1;
    if (!(r->prompt = malloc(cap * sizeof *r->prompt))) return fail(MW_ERR_NOMEM, "--prompt");
    if (r->tok && strcmp(o->prompt, "\n") != 0) {
        size_t got = 0;
        mw_status st = mw_tokenizer_encode(r->tok, o->prompt, len, r->prompt, cap, &got);
        if (st != MW_OK) return fail(st, "cannot encode --prompt");
        r->prompt_len = (int)got;
    } else if (r->tok) { /* no prompt: the tokenizer's <|endoftext|>, else token 0 */
        int32_t eot = 0;
        if (mw_tokenizer_token_id(r->tok, "<|endoftext|>", &eot) != MW_OK) eot = 0;
        r->prompt[r->prompt_len++] = eot;
    } else if (r->byte_level) {
        for (size_t i = 0; i < len; i++) {
            int b = (unsigned char)o->prompt[i];
            if (b >= V) {
                fprintf(stderr,
                        "gpt2: --prompt byte %zu is 0x%02x (%d), outside the model's vocabulary "
                        "of %d tokens (--vocab): the model has no token for it (give a prompt "
                        "of bytes below %d, or a larger --vocab)\n",
                        i + 1, b, b, V, V);
                return 2;
            }
            r->prompt[r->prompt_len++] = b;
        }
    } else {
        r->prompt[r->prompt_len++] = V == 50257 ? 50256 : 0; /* GPT-2's <|endoftext|> */
    }
    return 0;
}

/* Generates o->sample tokens with an inference program reading the trainer's parameters in place
 * (no copy, no targets, no gradients): the decoding step with a key/value cache, or with
 * --sample-recompute the model over the window of the latest seq tokens for every token. */
static int sample(run *r) {
    const options *o = &r->o;
    const int V = o->model.vocab, Vp = o->model.padded_vocab;
    sampler sm;
    int rc = 0, n = r->prompt_len, cap = o->sample + r->prompt_len + 1;
    int32_t *hist = malloc((size_t)cap * sizeof *hist);
    char *text = malloc((size_t)cap);
    mw_status st = hist && text ? sampler_open(r, &sm) : MW_ERR_NOMEM;
    if (st != MW_OK) {
        rc = fail(st, "cannot set up sampling");
        goto done;
    }
    memcpy(hist, r->prompt, (size_t)n * sizeof *hist);
    int prompt_len = n;
    printf("sample (%d tokens, temperature %g, %s):\n", o->sample, o->temperature,
           sm.cached ? "key/value cache" : "recomputing the window");
    if (r->byte_level || (r->tok && strcmp(o->prompt, "\n") != 0))
        fwrite(o->prompt, 1, strlen(o->prompt), stdout);
    double t0 = now();
    for (int i = 0; i < o->sample && !mw_stop_requested(); i++) {
        const float *logits;
        if ((st = sampler_next(&sm, hist, n, Vp, &logits)) != MW_OK) {
            rc = fail(st, "sampling failed");
            goto done;
        }
        hist[n] = draw(logits, V, o->temperature, &r->rng);
        if (r->tok)
            print_text_token(r->tok, hist[n++]);
        else
            print_token(hist[n++], r->byte_level);
        fflush(stdout);
    }
    double secs = now() - t0;
    printf("\n");
    if (n > prompt_len)
        printf("sampled %d tokens in %.3f s (%.1f tokens/s)\n", n - prompt_len, secs,
               (double)(n - prompt_len) / (secs > 0 ? secs : 1e-9));
    if (r->corpus) {
        /* The generated part as text: its bytes, or what the tokenizer decodes it to. */
        char *gen = text;
        size_t glen = (size_t)(n - prompt_len);
        if (r->tok) {
            glen = 0;
            mw_tokenizer_decode(r->tok, hist + prompt_len, (size_t)(n - prompt_len), NULL, 0,
                                &glen);
            gen = malloc(glen + 1);
            if (!gen || mw_tokenizer_decode(r->tok, hist + prompt_len, (size_t)(n - prompt_len),
                                            gen, glen, &glen) != MW_OK)
                glen = 0;
        } else {
            for (int i = prompt_len; i < n; i++) text[i - prompt_len] = (char)hist[i];
        }
        int lines = 0, ok = 0, correct = 0; /* the first line counts when the prompt ends one */
        if (gen)
            gpt2_corpus_score(gen, glen, o->prompt[strlen(o->prompt) - 1] == '\n', &lines, &ok,
                              &correct);
        if (gen != text) free(gen);
        printf("sample: %d complete lines, %d well formed, %d correct arithmetic\n", lines, ok,
               correct);
    }
done:
    if (hist && text) sampler_close(&sm);
    free(hist);
    free(text);
    return rc;
}

/* Every file of the run is checked before the first step, through the library's discipline
 * (meshwit/file.h): inputs are regular files, outputs are no input and no other output, no FIFO,
 * device or folder, in a folder that takes a new file and with room for them (an output that
 * cannot be written is said now, not after the training it would hold). 0, or -1 reported. */
static int check_files(const run *r) {
    const options *o = &r->o;
    const int64_t params = gpt2_num_params(&o->model) * (int64_t)sizeof(float);
    int save = o->save && mw_distributed_rank() == 0; /* rank 0 alone writes --save */
    int hf_save = save && gpt2_is_safetensors(o->save);
    char cfg[4200];
    mw_files *fs;
    mw_status st = mw_files_new(&fs);
    if (!st && o->load) st = mw_files_input(fs, "--load", o->load, 0);
    /* A .safetensors --load is read with its config.json, an input too, unless a .safetensors
     * --save writes that config.json (it must then describe this very model: checked below). */
    if (!st && o->load && gpt2_is_safetensors(o->load) && !hf_save &&
        gpt2_hf_config_path(o->load, cfg, sizeof cfg) == 0)
        st = mw_files_input(fs, "--load's config.json", cfg, 0);
    if (!st && o->data) st = mw_files_input(fs, "--data", o->data, 0);
    if (!st && o->val_data) st = mw_files_input(fs, "--val-data", o->val_data, 0);
    for (int i = 0; !st && mw_tokenizer_file(r->tok, i); i++)
        st = mw_files_input(fs, "--tokenizer", mw_tokenizer_file(r->tok, i), 0);
    if (!st && save) st = mw_files_output(fs, "--save", o->save, 0, params + 1024);
    if (!st && hf_save && gpt2_hf_config_path(o->save, cfg, sizeof cfg) == 0)
        st = mw_files_output(fs, "--save's config.json", cfg, 0, 0);
    /* A resumed checkpoint is read, then replaced: an output only (read only by --eval-only). */
    if (!st && o->checkpoint && o->eval_only)
        st = mw_files_input(fs, "--checkpoint", o->checkpoint, 0);
    else if (!st && o->checkpoint)
        st = mw_files_output(fs, "--checkpoint", o->checkpoint, 0, 3 * params + (1 << 16));
    mw_files_free(fs);
    if (st) {
        fprintf(stderr, "gpt2: %s\n", mw_last_error());
        return -1;
    }
    char err[1024];
    if (hf_save && gpt2_hf_check_save(o->save, &o->model, err, sizeof err) != MW_OK) {
        fprintf(stderr, "gpt2: %s\n", err);
        return -1;
    }
    if (save && !hf_save && !gpt2_config_is_plain(&o->model)) {
        fprintf(stderr,
                "gpt2: --save %s: llm.c's format holds GPT-2's layer-norm epsilon, tanh GELU "
                "and attention scale only, and this model differs (save it as .safetensors)\n",
                o->save);
        return -1;
    }
    return 0;
}

/* The settings that make the run what it is, as a checkpoint records them: a resumed run must
 * have the same (else it would continue another run from this one's state) unless
 * --allow-change names them. The data is its training tokens (count and hash), so the same
 * tokens under another name are the same data. */
/* The shortest text of v that reads back as v ("0.002", not "0.0020000000000000001"). */
static const char *exact(double v, char *buf, size_t size) {
    for (int digits = 6; digits <= 17; digits++) {
        snprintf(buf, size, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) break;
    }
    return buf;
}

static void run_identity(run *r) {
    const options *o = &r->o;
    const gpt2_config *c = &o->model;
    cli_identity *id = &r->identity;
    char b[32];
    memset(id, 0, sizeof *id);
    cli_identity_add(id, "layers", "%d", c->layers);
    cli_identity_add(id, "heads", "%d", c->heads);
    cli_identity_add(id, "channels", "%d", c->channels);
    cli_identity_add(id, "context", "%d", c->max_seq);
    cli_identity_add(id, "vocab", "%d", c->vocab);
    cli_identity_add(id, "padded-vocab", "%d", c->padded_vocab);
    cli_identity_add(id, "data", "%lld tokens, hash %016llx", (long long)r->train.count,
                     (unsigned long long)cli_hash(0, r->train.ids,
                                                  (size_t)r->train.count * sizeof *r->train.ids));
    cli_identity_add(id, "batch", "%d", o->batch);
    cli_identity_add(id, "seq", "%d", o->seq);
    cli_identity_add(id, "steps", "%d", o->steps);
    cli_identity_add(id, "sequential", "%s", o->sequential ? "yes" : "no");
    cli_identity_add(id, "lr", "%s", exact(o->lr, b, sizeof b));
    cli_identity_add(id, "beta1", "%s", exact(o->beta1, b, sizeof b));
    cli_identity_add(id, "beta2", "%s", exact(o->beta2, b, sizeof b));
    cli_identity_add(id, "eps", "%s", exact(o->eps, b, sizeof b));
    cli_identity_add(id, "weight-decay", "%s", exact(o->weight_decay, b, sizeof b));
    cli_identity_add(id, "grad-clip", "%s", exact(o->grad_clip, b, sizeof b));
    cli_identity_add(id, "warmup", "%d", o->warmup);
    cli_identity_add(id, "schedule", "%s", o->cosine ? "cosine" : "constant");
    cli_identity_add(id, "min-lr-ratio", "%s", exact(o->min_lr_ratio, b, sizeof b));
    cli_identity_add(id, "skip-nonfinite", "%s", o->skip_nonfinite ? "yes" : "no");
    cli_identity_add(id, "precision", "%s", o->bf16 ? "bf16" : "fp32");
}

/* What --checkpoint FILE holds, before anything is built: with --resume, a state of this
 * program whose run is this one (each setting that differs is named with both values, unless
 * --allow-change names it); without it, nothing, unless --start-over allows a new run to
 * replace it. 0, or the exit status (reported). */
static int check_checkpoint(const run *r) {
    const options *o = &r->o;
    static resume_state rs;
    size_t n = 0;
    int64_t step = 0;
    char names[512], bad[64];
    cli_identity_names(r->identity.text, names, sizeof names);
    if (o->allow_change &&
        cli_identity_check_names(r->identity.text, o->allow_change, bad, sizeof bad) != 0) {
        fprintf(stderr,
                "gpt2: --allow-change %s: '%s' is not a setting a checkpoint records (%s)\n",
                o->allow_change, bad, names);
        return 2;
    }
    if (!o->resume) {
        struct stat sb;
        if (o->start_over || stat(o->checkpoint, &sb) != 0) return 0;
        if (mw_checkpoint_info(o->checkpoint, &step, &rs, sizeof rs, &n) == MW_OK)
            fprintf(stderr,
                    "gpt2: --checkpoint %s holds a run at step %lld: continue it with --resume, "
                    "or give --start-over to replace it with a new run\n",
                    o->checkpoint, (long long)step);
        else
            fprintf(stderr,
                    "gpt2: --checkpoint %s exists and holds no run (%s): not replaced; name "
                    "another file, or give --start-over to replace it\n",
                    o->checkpoint, mw_last_error());
        return 2;
    }
    mw_status st = mw_checkpoint_info(o->checkpoint, &step, &rs, sizeof rs, &n);
    if (st != MW_OK) return fail(st, "cannot resume");
    if (n == RESUME_OLD_BYTES && rs.magic == RESUME_MAGIC) {
        printf("%s records no settings (an older checkpoint): resuming without comparing them\n",
               o->checkpoint);
        return 0;
    }
    if (n != sizeof rs || rs.magic != RESUME_MAGIC_RUN) {
        fprintf(stderr, "gpt2: %s was not written by this program\n", o->checkpoint);
        return 2;
    }
    if (o->eval_only) return 0; /* evaluating the state: how it was trained does not matter */
    rs.identity[sizeof rs.identity - 1] = '\0';
    char report[2048];
    int differ =
        cli_identity_compare(rs.identity, r->identity.text, o->allow_change ? o->allow_change : "",
                             report, sizeof report);
    if (differ == 0) return 0;
    fprintf(stderr,
            "gpt2: --resume: %s holds another run (at step %lld); %d setting%s differ%s:\n%s\n"
            "gpt2: give the checkpoint's settings, allow a change by name (--allow-change "
            "lr,steps), or start a new run (--start-over, without --resume)\n",
            o->checkpoint, (long long)step, differ, differ > 1 ? "s" : "", differ > 1 ? "" : "s",
            report);
    return 2;
}

/* Every process of an MPI job must train the same model on the same data: compares every flag
 * but --devices, and the data itself, with the other processes. */
static mw_status agree_flags(const run *r) {
    if (mw_distributed_size() <= 1) return MW_OK;
    const options *o = &r->o;
    const gpt2_config *c = &o->model;
    uint64_t data = cli_hash(0, r->data.ids, (size_t)r->data.count * sizeof *r->data.ids);
    uint64_t val = cli_hash(0, r->val_file.ids, (size_t)r->val_file.count * sizeof(uint16_t));
    char text[2048];
    snprintf(text, sizeof text,
             "model: %d layers, %d heads, %d channels, context %d, vocab %d/%d\n"
             "--data: %lld tokens, hash %016llx\n--val-data: %lld tokens, hash %016llx\n"
             "--data-format %d\n--load %s\n--batch %d\n--seq %d\n--steps %d\n--seed %llu\n"
             "--sequential %d\n--lr %.17g\n--beta1 %.17g\n--beta2 %.17g\n--eps %.17g\n"
             "--weight-decay %.17g\n--grad-clip %.17g\n--warmup %d\n--schedule %s\n"
             "--min-lr-ratio %.17g\n--val-every %d\n--val-batches %d\n--eval-only %d\n"
             "--eval-batches %d\n--checkpoint %s\n--checkpoint-every %d\n--resume %d\n"
             "--stop-at %d\n--skip-nonfinite %d\n--check-replicas %d\n--shard-optimizer %d\n"
             "--shard-params %d\n--keep-gathered %d\n--allow-nonfinite %d\n--mesh %s\n--model-axis "
             "%s\n--precision %s\n"
             "--recompute %d\n"
             "--sample %d\n--temperature %.17g\n--prompt hash %016llx\n--tokenizer %s, %d "
             "tokens\n--sample-recompute %d\n--allow-change %s\n--start-over %d\n",
             c->layers, c->heads, c->channels, c->max_seq, c->vocab, c->padded_vocab,
             (long long)r->data.count, (unsigned long long)data, (long long)r->val_file.count,
             (unsigned long long)val, (int)o->format, o->load ? "given" : "none", o->batch, o->seq,
             o->steps, (unsigned long long)o->seed, o->sequential, o->lr, o->beta1, o->beta2,
             o->eps, o->weight_decay, o->grad_clip, o->warmup, o->cosine ? "cosine" : "constant",
             o->min_lr_ratio, o->val_every, o->val_batches, o->eval_only, o->eval_batches,
             o->checkpoint ? "given" : "none", o->checkpoint_every, o->resume, o->stop_at,
             o->skip_nonfinite, o->check_replicas, o->shard_optimizer, o->shard_params,
             o->keep_gathered, o->allow_nonfinite, o->mesh ? o->mesh : MESH_AXIS,
             o->model_axis ? o->model_axis : "none", o->bf16 ? "bf16" : "fp32", o->recompute,
             o->sample, o->temperature,
             (unsigned long long)cli_hash(0, o->prompt, strlen(o->prompt)),
             o->tokenizer ? "given" : "none", o->tok_vocab, o->sample_recompute,
             o->allow_change ? o->allow_change : "", o->start_over);
    return mw_distributed_agree("gpt2 flags", text, 0);
}

static int run_main(int argc, char **argv);

int main(int argc, char **argv) {
    /* Under mpirun the mesh spans every process; only rank 0 prints. */
    if (mw_distributed_init(&argc, &argv) != MW_OK) {
        fprintf(stderr, "gpt2: %s\n", mw_last_error());
        return 2;
    }
    if (mw_distributed_rank() > 0 && !freopen("/dev/null", "w", stdout)) return 2;
    int rc = run_main(argc, argv);
    /* A process that failed alone would leave its peers waiting: end the whole job. */
    if (rc != 0 && rc != 130 && rc != 143 && mw_distributed_size() > 1) mw_distributed_abort(rc);
    mw_distributed_finalize();
    return rc;
}

static int run_main(int argc, char **argv) {
    run r = {0};
    sizes sz;
    int rc = parse_args(argc, argv, &r.o, &sz);
    if (rc > 0) usage(stdout);
    if (rc != 0) return rc > 0 ? 0 : 2;
    options *o = &r.o;
    char err[512];
    mw_status st;
    if (o->tokenizer) {
        if ((st = mw_tokenizer_load(o->tokenizer, &r.tok)) != MW_OK) {
            rc = fail(st, "cannot load --tokenizer");
            goto done;
        }
        o->tok_vocab = mw_tokenizer_vocab_size(r.tok);
    }
    rc = 2;
    if (choose_model(&r.o, &sz) != 0) goto done;
    if (o->prompt[0] == '\0') {
        fprintf(stderr, "gpt2: --prompt must not be empty\n");
        goto done;
    }
    /* Every check that needs no training is made here, before the data is read or the model
     * built: the files, then the data, the checkpoint's run and the prompt. */
    if (check_files(&r) != 0) goto done;
    gpt2_rng_seed(&r.rng, o->seed);
    if ((rc = prepare_data(&r)) != 0) goto done;
    run_identity(&r);
    if (o->checkpoint && (rc = check_checkpoint(&r)) != 0) goto done;
    if (!r.byte_level && !r.tok && strcmp(o->prompt, "\n") != 0) {
        fprintf(stderr, "gpt2: --prompt needs byte-level data (token data starts from "
                        "<|endoftext|>)\n");
        rc = 2;
        goto done;
    }
    if (!o->eval_only && o->sample > 0 && (rc = prepare_prompt(&r)) != 0) goto done;
    if ((st = agree_flags(&r)) != MW_OK) {
        rc = fail(st, "the processes were started differently");
        goto done;
    }
    if (cli_catch_stop_signals() != 0) {
        fprintf(stderr, "gpt2: cannot install the SIGINT/SIGTERM handler: %s\n", strerror(errno));
        rc = 2;
        goto done;
    }
    if ((st = mw_mesh_new(o->devices, o->mesh ? o->mesh : MESH_AXIS, &r.mesh)) != MW_OK) {
        rc = fail(st, "cannot make the mesh");
        goto done;
    }
    print_setup(&r);
    if ((st = gpt2_batch_new(o->batch, o->seq, &r.batch)) != MW_OK ||
        (st = build(o, o->batch, o->seq, r.mesh, &r.graph, &r.model, &r.tr)) != MW_OK) {
        rc = fail(st, "cannot build the model");
        goto done;
    }
    mw_device_memory mem;
    int first = 0;
    mw_mesh_local_devices(r.mesh, &first);
    if (mw_trainer_memory(r.tr, first, &mem) == MW_OK)
        printf("memory per device: parameters %.2f MB, gradients %.2f MB, optimizer state %.2f MB, "
               "activations %.2f MB, kernel workspace %.2f MB\n",
               mem.parameters / 1e6, mem.gradients / 1e6, mem.optimizer / 1e6,
               mem.activations / 1e6, mem.workspace / 1e6);
    char kernels[1024];
    if (mw_trainer_kernels(r.tr, kernels, sizeof kernels) == MW_OK) {
        printf("precision %s; kernels:\n", o->bf16 ? "bf16" : "fp32");
        for (char *line = strtok(kernels, "\n"); line; line = strtok(NULL, "\n"))
            printf("  %s\n", line);
    }
    if (o->load) {
        st = gpt2_is_safetensors(o->load)
                 ? gpt2_hf_load(r.tr, &o->model, o->load, err, sizeof err)
                 : gpt2_load(r.tr, &o->model, o->load,
                             &(gpt2_load_options){.allow_nonfinite = o->allow_nonfinite}, err,
                             sizeof err);
        if (st != MW_OK) {
            rc = fail_msg(st, err);
            goto done;
        }
        printf("loaded %s\n", o->load);
    }
    if (o->resume) {
        resume_state rs;
        size_t n = 0;
        if ((st = mw_trainer_load(r.tr, o->checkpoint, &rs, sizeof rs, &n)) != MW_OK) {
            rc = fail(st, "cannot resume");
            goto done;
        }
        if (!(n == sizeof rs && rs.magic == RESUME_MAGIC_RUN) &&
            !(n == RESUME_OLD_BYTES && rs.magic == RESUME_MAGIC)) {
            fprintf(stderr, "gpt2: %s was not written by this program\n", o->checkpoint);
            rc = 2;
            goto done;
        }
        r.rng.state = rs.rng;
        if (!o->eval_only && rs.step >= o->steps) {
            printf("already at step %lld of %d\n", (long long)rs.step, o->steps);
            goto done;
        }
        printf("resumed %s at step %lld\n", o->checkpoint, (long long)rs.step);
    }
    /* Every process loaded its own --load file or checkpoint: they must hold the same values. */
    if ((o->load || o->resume) && mw_distributed_size() > 1 &&
        (st = mw_trainer_check_replicas(r.tr)) != MW_OK) {
        rc = fail(st, "the processes loaded different weights");
        goto done;
    }
    if (o->eval_only) {
        float loss;
        int used;
        if ((st = evaluate(&r, &r.val, o->eval_batches, &loss, &used)) != MW_OK) {
            rc = fail(st, "evaluation failed");
            goto done;
        }
        printf("eval loss %.6f  (%d batches of %d x %d)\n", loss, used, o->batch, o->seq);
        if (!isfinite(loss)) {
            fflush(stdout);
            fprintf(stderr, "gpt2: the eval loss is %f: the model's outputs are not finite\n",
                    loss);
            rc = 2;
        }
        goto done;
    }
    if ((rc = train(&r)) != 0) goto done;
    if (o->save) { /* one writer; every process reads (split parameters are gathered) */
        const char *to = mw_distributed_rank() == 0 ? o->save : NULL;
        st = gpt2_is_safetensors(o->save) ? gpt2_hf_save(r.tr, &o->model, to, err, sizeof err)
                                          : gpt2_save(r.tr, &o->model, to, err, sizeof err);
        if (st != MW_OK) {
            rc = fail_msg(st, err);
            goto done;
        }
        printf("saved %s\n", o->save);
    }
    if (o->sample > 0) rc = sample(&r);
    if (rc == 0 && cli_stop_signal()) {
        printf(o->sample > 0 ? "interrupted while sampling\n"
                             : "interrupted after training (the run had finished)\n");
        rc = cli_stop_status();
    }
done:
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
