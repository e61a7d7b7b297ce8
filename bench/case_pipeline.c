/* The "pipeline" case: GPT-2 in stages along P (meshwit/pipeline.h), every schedule (GPipe,
 * 1F1B, interleaved 1F1B with 2 virtual stages per device, zero-bubble ZB-H1) on cpu:4 as P=4
 * (or the --devices given, all on P), beside gradient accumulation over the same micro-batches
 * on cpu:1: tokens/s, parameters and memory per stage, and each device's idle fraction, measured
 * from its own timeline (1 - its busy time / the step's) and modelled (the schedule simulated
 * with each stage's measured forward, backward and weight-gradient times: what a machine with a
 * core per stage would see; with fewer cores than stages the measured one also counts the
 * stages waiting for a core). Full run: GPT-2 124M (L12 C768, vocab 50257) at T=128, micro-batch
 * 1, 8 micro-batches; --quick: a tiny GPT-2 (L8 C64, vocab 256, T=32), micro-batch 2. Then the
 * parameters per device of the same model on X=2,P=4 (cpu:8) with FSDP over X. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/common/gpt2_model.h"
#include "bench.h"
#include "meshwit.h"
#include "meshwit/pipeline.h"
#include "parallel/pipeline_schedule.h"

typedef struct pipe_shape {
    gpt2_config model;
    int batch, seq, micro, steps;
} pipe_shape;

static void tokens(int vocab, int n, int step, int32_t *in, int32_t *tg) {
    uint32_t s = 2654435761u * (uint32_t)(step + 1);
    for (int i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        in[i] = (int32_t)((s >> 8) % (uint32_t)vocab);
        tg[i] = (int32_t)((uint32_t)(in[i] * 3 + 1) % (uint32_t)vocab);
    }
}

static mw_trainer_config train_config(void) {
    mw_trainer_config c = {.optimizer = MW_ADAMW_INIT(3e-4f)};
    return c;
}

/* ms/step of gradient accumulation over sh->micro micro-batches on cpu:1. */
static int accumulation_ms(const pipe_shape *sh, int32_t *in, int32_t *tg, double *ms) {
    mw_graph *g = NULL;
    mw_mesh *mesh = NULL;
    mw_trainer *tr = NULL;
    gpt2_graph m;
    int rc = -1, n = sh->batch * sh->seq;
    mw_trainer_config c = train_config();
    c.grad_accumulation = 1;
    if (mw_graph_new(&g) ||
        gpt2_build(g, &sh->model, &(gpt2_layout){.batch = sh->batch, .seq = sh->seq}, &m) ||
        mw_mesh_new("cpu:1", NULL, &mesh) || mw_trainer_new(g, m.loss, mesh, &c, &tr))
        goto out;
    double t[8];
    for (int s = 0; s <= sh->steps; s++) {
        double t0 = mwb_now();
        for (int k = 0; k < sh->micro; k++) {
            mw_feed f[2] = {{"tokens", in + k * n, n}, {"targets", tg + k * n, n}};
            if ((k < sh->micro - 1 ? mw_trainer_accumulate(tr, f, 2, NULL)
                                   : mw_trainer_step(tr, f, 2, NULL)) != MW_OK)
                goto out;
        }
        if (s) t[s - 1] = (mwb_now() - t0) * 1e3; /* step 0 warms up */
    }
    *ms = mwb_median(t, sh->steps);
    rc = 0;
out:
    if (rc) fprintf(stderr, "pipeline: accumulation on cpu:1: %s\n", mw_last_error());
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    return rc;
}

static const char *schedule_name(mw_pipeline_schedule s) {
    switch (s) {
    case MW_SCHEDULE_GPIPE: return "gpipe";
    case MW_SCHEDULE_1F1B: return "1f1b";
    case MW_SCHEDULE_INTERLEAVED: return "interleaved";
    case MW_SCHEDULE_ZERO_BUBBLE: return "zero-bubble";
    }
    return "?";
}

/* One schedule on `devices` (all on P): prints its line and emits its record. */
static int run_schedule(mwb_ctx *ctx, const pipe_shape *sh, const char *devices,
                        mw_pipeline_schedule kind, double base_ms, int32_t *in, int32_t *tg) {
    mw_graph *g = NULL;
    mw_mesh *mesh = NULL;
    mw_pipeline *p = NULL;
    gpt2_graph m;
    int rc = -1, n = sh->batch * sh->seq, V = kind == MW_SCHEDULE_INTERLEAVED ? 2 : 1;
    mw__pipe_schedule sc = {0};
    if (mw_graph_new(&g) ||
        gpt2_build(g, &sh->model, &(gpt2_layout){.batch = sh->batch, .seq = sh->seq}, &m) ||
        mw_mesh_new(devices, "P", &mesh))
        goto out;
    int P = mw_mesh_size(mesh);
    mw_pipeline_config c = {.trainer = train_config(),
                            .axis = "P",
                            .micro_batches = sh->micro,
                            .schedule = kind,
                            .virtual_stages = V};
    if (mw_pipeline_new(g, m.loss, mesh, &c, &p)) goto out;
    double t[8];
    mw_feed f[2] = {{"tokens", in, (int64_t)n * sh->micro},
                    {"targets", tg, (int64_t)n * sh->micro}};
    for (int s = 0; s <= sh->steps; s++) {
        double t0 = mwb_now();
        if (mw_pipeline_step(p, f, 2, NULL)) goto out;
        if (s) t[s - 1] = (mwb_now() - t0) * 1e3;
    }
    double ms = mwb_median(t, sh->steps);
    /* The model: the last step's per-stage times per micro-batch. */
    int S = mw_pipeline_stages(p);
    double tf[64], tb[64], tw[64], total, modelled[MW_MAX_DEVICES];
    mw_pipeline_stage_info info[64];
    for (int s = 0; s < S; s++) {
        if (mw_pipeline_stage(p, s, &info[s])) goto out;
        tf[s] = info[s].forward_ms / sh->micro;
        tb[s] = info[s].backward_ms / sh->micro;
        tw[s] = info[s].weight_ms / sh->micro;
    }
    if (mw__pipe_schedule_make((mw__pipe_sched)kind, P, sh->micro, V, &sc) ||
        mw__pipe_schedule_simulate(&sc, tf, tb, kind == MW_SCHEDULE_ZERO_BUBBLE ? tw : NULL, 0.0,
                                   &total, modelled))
        goto out;
    double tok_s = (double)n * sh->micro / (ms * 1e-3);
    printf("  %-12s %9.1f ms %9.0f tok/s  %5.2fx cpu:1  idle measured/modelled:",
           schedule_name(kind), ms, tok_s, base_ms / ms);
    double mean_meas = 0, mean_model = 0;
    for (int d = 0; d < P; d++) {
        double idle = mw_pipeline_idle(p, d);
        mean_meas += idle / P;
        mean_model += modelled[d] / P;
        printf(" %.2f/%.2f", idle, modelled[d]);
    }
    printf("\n  %-12s stage params (M) / memory (MB):", "");
    double max_params = 0, whole = 0;
    for (int s = 0; s < S; s++) {
        const mw_device_memory *mm = &info[s].memory;
        double mb =
            (double)(mm->parameters + mm->gradients + mm->optimizer + mm->activations) / (1 << 20);
        printf(" %.2f/%.0f", (double)info[s].parameters / 1e6, mb);
        whole += (double)info[s].parameters;
    }
    for (int d = 0; d < P; d++) {
        double on = 0;
        for (int s = d; s < S; s += P) on += (double)info[s].parameters;
        if (on > max_params) max_params = on;
    }
    printf("\n");
    mwb_record r = {0};
    mwb_record_str(&r, "case", "pipeline");
    mwb_record_str(&r, "devices", devices);
    mwb_record_str(&r, "schedule", schedule_name(kind));
    mwb_record_num(&r, "stages", S);
    mwb_record_num(&r, "micro_batches", sh->micro);
    mwb_record_num(&r, "ms_per_step", ms);
    mwb_record_num(&r, "tokens_per_s", tok_s);
    mwb_record_num(&r, "vs_cpu1_accumulation", base_ms / ms);
    mwb_record_num(&r, "idle_measured", mean_meas);
    mwb_record_num(&r, "idle_modelled", mean_model);
    mwb_record_num(&r, "max_device_params_fraction", whole > 0 ? max_params / whole : 0);
    ctx->emit(ctx, &r);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "pipeline: %s on %s: %s\n", schedule_name(kind), devices, mw_last_error());
    mw__pipe_schedule_free(&sc);
    mw_pipeline_free(p);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    return rc;
}

/* Parameters per device of the same model in stages along P=4 over data-parallel pairs (X=2,
 * cpu:8) with FSDP over X: the tied embedding, too large for one stage's share, split over X on
 * both stages that read it. Memory only: no step is timed. */
static int fsdp_params(mwb_ctx *ctx, const pipe_shape *sh) {
    mw_graph *g = NULL;
    mw_mesh *mesh = NULL;
    mw_pipeline *p = NULL;
    gpt2_graph m;
    int rc = -1;
    const char *devices = "cpu:8", *axes = "X=2,P=4";
    gpt2_layout lo = {.batch = 2 * sh->batch, .seq = sh->seq, .data_axis = "X", .fsdp_axis = "X"};
    if (mw_graph_new(&g) || gpt2_build(g, &sh->model, &lo, &m) || mw_mesh_new(devices, axes, &mesh))
        goto out;
    mw_pipeline_config c = {.trainer = train_config(),
                            .axis = "P",
                            .micro_batches = sh->micro,
                            .schedule = MW_SCHEDULE_1F1B};
    if (mw_pipeline_new(g, m.loss, mesh, &c, &p)) goto out;
    double whole = 0, most = 0;
    for (int i = 0; i < mw_graph_param_count(g); i++) {
        mw_param_info pi;
        if (mw_graph_param_info(g, i, &pi)) goto out;
        whole += (double)pi.count;
    }
    printf("  FSDP over X, %s as %s, 1F1B: parameters per device (M):", devices, axes);
    for (int s = 0; s < mw_pipeline_stages(p); s++) {
        mw_pipeline_stage_info si;
        if (mw_pipeline_stage(p, s, &si)) goto out;
        double mine = (double)si.memory.parameters / sizeof(float);
        if (mine > most) most = mine;
        printf(" %.2f", mine / 1e6);
    }
    printf(" of %.2f: at most %.2f of the model per device\n", whole / 1e6, most / whole);
    mwb_record r = {0};
    mwb_record_str(&r, "case", "pipeline");
    mwb_record_str(&r, "devices", devices);
    mwb_record_str(&r, "mesh", axes);
    mwb_record_str(&r, "schedule", "1f1b fsdp");
    mwb_record_num(&r, "max_device_params_fraction", most / whole);
    ctx->emit(ctx, &r);
    rc = 0;
out:
    if (rc) fprintf(stderr, "pipeline: FSDP on %s: %s\n", devices, mw_last_error());
    mw_pipeline_free(p);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    return rc;
}

int mwb_case_pipeline(mwb_ctx *ctx) {
    pipe_shape sh = {.batch = 1, .seq = 128, .micro = 8, .steps = 2};
    if (gpt2_preset("gpt2-124m", &sh.model) != 0) {
        fprintf(stderr, "pipeline: no gpt2-124m preset\n");
        return 1;
    }
    if (ctx->quick)
        sh = (pipe_shape){.model = {.layers = 8,
                                    .heads = 2,
                                    .channels = 64,
                                    .max_seq = 32,
                                    .vocab = 256,
                                    .padded_vocab = 256},
                          .batch = 2,
                          .seq = 32,
                          .micro = 8,
                          .steps = 1};
    const char *devices = ctx->ndevices ? ctx->devices[0] : "cpu:4";
    int n = sh.batch * sh.seq * sh.micro;
    int32_t *in = malloc((size_t)n * sizeof *in), *tg = malloc((size_t)n * sizeof *tg);
    if (!in || !tg) {
        free(in);
        free(tg);
        fprintf(stderr, "pipeline: out of memory\n");
        return 1;
    }
    tokens(sh.model.vocab, n, 0, in, tg);
    printf("  GPT-2 L%d C%d vocab %d, T=%d, micro-batch %d x %d micro-batches, %s along P\n",
           sh.model.layers, sh.model.channels, sh.model.vocab, sh.seq, sh.batch, sh.micro, devices);
    double base_ms = 0;
    int rc = accumulation_ms(&sh, in, tg, &base_ms);
    if (rc == 0) {
        printf("  %-12s %9.1f ms %9.0f tok/s  (gradient accumulation, the baseline)\n", "cpu:1",
               base_ms, (double)n / (base_ms * 1e-3));
        mwb_record r = {0};
        mwb_record_str(&r, "case", "pipeline");
        mwb_record_str(&r, "devices", "cpu:1");
        mwb_record_str(&r, "schedule", "accumulation");
        mwb_record_num(&r, "micro_batches", sh.micro);
        mwb_record_num(&r, "ms_per_step", base_ms);
        mwb_record_num(&r, "tokens_per_s", (double)n / (base_ms * 1e-3));
        ctx->emit(ctx, &r);
        const mw_pipeline_schedule kinds[] = {MW_SCHEDULE_GPIPE, MW_SCHEDULE_1F1B,
                                              MW_SCHEDULE_INTERLEAVED, MW_SCHEDULE_ZERO_BUBBLE};
        for (int k = 0; k < 4; k++)
            rc |= run_schedule(ctx, &sh, devices, kinds[k], base_ms, in, tg);
        rc |= fsdp_params(ctx, &sh);
    }
    free(in);
    free(tg);
    return rc ? 1 : 0;
}
