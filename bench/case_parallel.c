/* Bench case "parallel": the ways meshwit splits GPT-2 training over devices, side by side, on
 * llm.c's GPT-2 (4 layers, 4 heads, 256 channels, context 256, batch 8 x 256, AdamW): one
 * device; data parallel (the batch over X); data parallel with ZeRO-1 (optimizer state over X);
 * tensor parallel (heads and MLP units over Y); data x tensor parallel on a 2 x 2 mesh, with
 * and without ZeRO-1; one device and data parallel with every transformer block's activations
 * recomputed in backward (mw_trainer_config.recompute: blocks, and dots, which keeps the
 * contractions' outputs); FSDP (every large parameter split over X, gathered where used,
 * gradients reduce-scattered; each gather started where the one before completes, and, for the
 * comparison, each where used: serial gathers) on 2 and 4 devices beside data parallel on 4, FSDP
 * with recomputation, and FSDP x tensor. Each reports ms/step, tokens/s and what one device holds:
 * parameters, gradients, optimizer state and activations. Then (not with --quick: tens of seconds
 * a step on a few cores) GPT-2 124M at context 1024, batch 4 on cpu:4: data parallel beside FSDP
 * with every block recomputed, the layout that fits a device's share in under 1 GB.
 *
 * On a 2-core machine, cpu:4 runs four worker threads on two cores, so its times show the cost of
 * the extra collectives rather than a speed-up; the memory columns are exact on any machine. */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "gpt2_run.h"

#define BATCH 8
#define SEQ 256
#define WARMUP 1
#define REPEATS 3
#define STEPS 2

typedef struct config {
    const char *name, *devices, *mesh, *data, *model;
    int zero1;
    mw_recompute recompute;
    int fsdp;
    int serial; /* FSDP: mw_trainer_config.gathers = MW_GATHERS_AT_USE (no gather started ahead) */
} config;

static const config configs[] = {
    {"single device", "cpu:1", "X", "X", NULL, 0, MW_RECOMPUTE_NONE, 0, 0},
    {"data parallel", "cpu:2", "X", "X", NULL, 0, MW_RECOMPUTE_NONE, 0, 0},
    {"data + ZeRO-1", "cpu:2", "X", "X", NULL, 1, MW_RECOMPUTE_NONE, 0, 0},
    {"tensor parallel", "cpu:2", "Y", NULL, "Y", 0, MW_RECOMPUTE_NONE, 0, 0},
    {"data x tensor", "cpu:4", "X=2,Y=2", "X", "Y", 0, MW_RECOMPUTE_NONE, 0, 0},
    {"data x tensor + ZeRO-1", "cpu:4", "X=2,Y=2", "X", "Y", 1, MW_RECOMPUTE_NONE, 0, 0},
    {"single + recompute", "cpu:1", "X", "X", NULL, 0, MW_RECOMPUTE_BLOCKS, 0, 0},
    {"single + recompute dots", "cpu:1", "X", "X", NULL, 0, MW_RECOMPUTE_DOTS, 0, 0},
    {"data + recompute", "cpu:2", "X", "X", NULL, 0, MW_RECOMPUTE_BLOCKS, 0, 0},
    {"data + recompute dots", "cpu:2", "X", "X", NULL, 0, MW_RECOMPUTE_DOTS, 0, 0},
    {"FSDP", "cpu:2", "X", "X", NULL, 0, MW_RECOMPUTE_NONE, 1, 0},
    {"FSDP serial gathers", "cpu:2", "X", "X", NULL, 0, MW_RECOMPUTE_NONE, 1, 1},
    {"FSDP + recompute", "cpu:2", "X", "X", NULL, 0, MW_RECOMPUTE_BLOCKS, 1, 0},
    {"data parallel", "cpu:4", "X", "X", NULL, 0, MW_RECOMPUTE_NONE, 0, 0},
    {"FSDP", "cpu:4", "X", "X", NULL, 0, MW_RECOMPUTE_NONE, 1, 0},
    {"FSDP serial gathers", "cpu:4", "X", "X", NULL, 0, MW_RECOMPUTE_NONE, 1, 1},
    {"FSDP + recompute", "cpu:4", "X", "X", NULL, 0, MW_RECOMPUTE_BLOCKS, 1, 0},
    {"FSDP x tensor", "cpu:4", "X=2,Y=2", "X", "Y", 0, MW_RECOMPUTE_NONE, 1, 0},
};

/* GPT-2 124M at its full context. */
#define BIG_BATCH 4
#define BIG_SEQ 1024
#define BIG_STEPS 1

static const config big_configs[] = {
    {"124M data parallel", "cpu:4", "X", "X", NULL, 0, MW_RECOMPUTE_NONE, 0, 0},
    {"124M FSDP + recompute", "cpu:4", "X", "X", NULL, 0, MW_RECOMPUTE_BLOCKS, 1, 0},
};

/* The model and run of a table. */
typedef struct table {
    gpt2_config model;
    int batch, seq, repeats, steps;
    const char *label; /* the records' "model" */
} table;

static int run_config(mwb_ctx *ctx, const config *c, const table *t, double *base, int first);

static const char *recompute_name(mw_recompute r) {
    return r == MW_RECOMPUTE_BLOCKS ? "blocks" : r == MW_RECOMPUTE_DOTS ? "dots" : "none";
}

int mwb_case_parallel(mwb_ctx *ctx) {
    int n = (int)(sizeof configs / sizeof *configs);
    gpt2_config model = {.layers = 4,
                         .heads = 4,
                         .channels = 256,
                         .max_seq = SEQ,
                         .vocab = 256,
                         .padded_vocab = 256};
    int seq = ctx->quick ? 64 : SEQ;
    printf("llm.c's GPT-2 (%lld parameters), batch %d x %d, AdamW; median of %d x %d steps "
           "after %d warm-up, each configuration in its own process; memory is device 0's\n",
           (long long)gpt2_num_params(&model), BATCH, seq, ctx->quick ? 1 : REPEATS,
           ctx->quick ? 1 : STEPS, WARMUP);
    printf("%-24s %-8s %-8s %9s %9s %7s %8s %8s %8s %8s\n", "configuration", "devices", "mesh",
           "ms/step", "tokens/s", "speedup", "params", "grads", "optim", "activ");
    printf("%-24s %-8s %-8s %9s %9s %7s %8s %8s %8s %8s\n", "", "", "", "", "", "", "MB", "MB",
           "MB", "MB");
    fflush(stdout);
    int failed = 0;
    double base = 0.0;
    table small = {.model = model,
                   .batch = BATCH,
                   .seq = seq,
                   .repeats = ctx->quick ? 1 : REPEATS,
                   .steps = ctx->quick ? 1 : STEPS,
                   .label = "llm.c gpt2 4x256"};
    for (int i = 0; i < n; i++) failed |= run_config(ctx, &configs[i], &small, &base, i == 0);
    if (ctx->quick) return failed;
    table big = {
        .batch = BIG_BATCH, .seq = BIG_SEQ, .repeats = 1, .steps = BIG_STEPS, .label = "gpt2-124m"};
    gpt2_preset("gpt2-124m", &big.model);
    printf("\nGPT-2 124M (%lld parameters), batch %d x %d, AdamW; %d step after %d warm-up\n",
           (long long)gpt2_num_params(&big.model), BIG_BATCH, BIG_SEQ, BIG_STEPS, WARMUP);
    fflush(stdout);
    double big_base = 0.0;
    for (int i = 0; i < (int)(sizeof big_configs / sizeof *big_configs); i++)
        failed |= run_config(ctx, &big_configs[i], &big, &big_base, i == 0);
    return failed;
}

/* One configuration: measured in its own process, printed and emitted. */
static int run_config(mwb_ctx *ctx, const config *c, const table *t, double *base, int first) {
    int batch = t->batch, seq = t->seq;
    mwb_gpt2_setup s = {.model = t->model,
                        .batch = batch,
                        .seq = seq,
                        .devices = c->devices,
                        .warmup = WARMUP,
                        .repeats = t->repeats,
                        .steps = t->steps,
                        .mesh_axes = c->mesh,
                        .data_axis = c->data,
                        .model_axis = c->model,
                        .shard_optimizer = c->zero1,
                        .recompute = c->recompute,
                        .shard_params = c->fsdp,
                        .serial_gathers = c->serial};
    mwb_gpt2_result r;
    mwb_gpt2_measure(&s, &r);
    if (!r.ok) {
        fprintf(stderr, "parallel: %s on %s: %s\n", c->name, c->devices, r.error);
        return 1;
    }
    if (first) *base = r.ms;
    double tps = batch * seq / (r.ms * 1e-3), speedup = *base > 0.0 ? *base / r.ms : 0.0;
    const mw_device_memory *m = &r.memory;
    printf("%-24s %-8s %-8s %9.1f %9.0f %6.2fx %8.2f %8.2f %8.2f %8.2f\n", c->name, c->devices,
           c->mesh, r.ms, tps, speedup, m->parameters / 1e6, m->gradients / 1e6, m->optimizer / 1e6,
           m->activations / 1e6);
    fflush(stdout);
    mwb_record rec = {0};
    mwb_record_str(&rec, "case", "parallel");
    mwb_record_str(&rec, "model", t->label);
    mwb_record_str(&rec, "devices", c->devices);
    mwb_record_str(&rec, "mode", c->name);
    char mesh[32]; /* "X=2 Y=2": no comma in a CSV cell */
    snprintf(mesh, sizeof mesh, "%s", c->mesh);
    for (char *q = mesh; *q; q++)
        if (*q == ',') *q = ' ';
    mwb_record_str(&rec, "mesh", mesh);
    mwb_record_str(&rec, "model_axis", c->model ? c->model : "");
    mwb_record_num(&rec, "zero1", c->zero1);
    mwb_record_str(&rec, "recompute", recompute_name(c->recompute));
    mwb_record_num(&rec, "fsdp", c->fsdp);
    mwb_record_num(&rec, "serial_gathers", c->serial);
    mwb_record_num(&rec, "batch", batch);
    mwb_record_num(&rec, "seq", seq);
    mwb_record_num(&rec, "ms_per_step", r.ms);
    mwb_record_num(&rec, "tokens_per_s", tps);
    mwb_record_num(&rec, "speedup", speedup);
    mwb_record_num(&rec, "param_mb", m->parameters / 1e6);
    mwb_record_num(&rec, "grad_mb", m->gradients / 1e6);
    mwb_record_num(&rec, "optimizer_mb", m->optimizer / 1e6);
    mwb_record_num(&rec, "activation_mb", m->activations / 1e6);
    mwb_record_num(&rec, "peak_rss_mb", r.peak_mb);
    ctx->emit(ctx, &rec);
    return 0;
}
