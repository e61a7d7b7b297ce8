/* The scaling case: GPT-2 (tiny preset) ms/step and tokens/s over 1, 2 and 4 devices at a fixed
 * global batch, with the share of each step spent in collectives and in the optimizer, so a user
 * sees where the time goes when sharding does or does not pay. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "gpt2_model.h"

#define BATCH 8
#define SEQ 64

typedef struct run_result {
    double ms, reduce_ms, update_ms;
} run_result;

static int measure(const char *devices, int steps, int warmup, run_result *out) {
    gpt2_config c;
    gpt2_preset("tiny", &c);
    mw_graph *g = NULL;
    mw_mesh *mesh = NULL;
    mw_trainer *tr = NULL;
    gpt2_graph m;
    int rc = 1;
    int32_t *tokens = malloc(sizeof *tokens * (BATCH * SEQ + 1));
    if (!tokens || mw_graph_new(&g) || mw_mesh_new(devices, "X", &mesh)) goto done;
    int sharded = mw_mesh_size(mesh) > 1;
    if (gpt2_build(g, &c,
                   &(gpt2_layout){.batch = BATCH, .seq = SEQ, .data_axis = sharded ? "X" : NULL},
                   &m))
        goto done;
    mw_trainer_config cfg = {.optimizer = {MW_ADAMW, .lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f,
                                           .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f}};
    if (mw_trainer_new(g, m.loss, mesh, &cfg, &tr)) goto done;
    uint64_t s = 42;
    for (int i = 0; i < BATCH * SEQ + 1; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (int32_t)((s >> 33) % (uint64_t)c.vocab);
    }
    mw_feed feeds[2] = {{"tokens", tokens, BATCH * SEQ}, {"targets", tokens + 1, BATCH * SEQ}};
    double *ms = malloc(sizeof *ms * (size_t)steps), *red = malloc(sizeof *red * (size_t)steps);
    double *upd = malloc(sizeof *upd * (size_t)steps);
    if (!ms || !red || !upd) {
        free(ms), free(red), free(upd);
        goto done;
    }
    int ok = 1;
    for (int i = 0; ok && i < warmup + steps; i++) {
        mw_step_stats st;
        ok = mw_trainer_step(tr, feeds, 2, NULL) == MW_OK && mw_trainer_stats(tr, &st) == MW_OK;
        if (ok && i >= warmup) {
            ms[i - warmup] = st.step_ms;
            red[i - warmup] = st.reduce_ms;
            upd[i - warmup] = st.update_ms;
        }
    }
    if (ok) {
        out->ms = mwb_median(ms, steps);
        out->reduce_ms = mwb_median(red, steps);
        out->update_ms = mwb_median(upd, steps);
        rc = 0;
    }
    free(ms), free(red), free(upd);
done:
    if (rc) fprintf(stderr, "scaling %s: %s\n", devices, mw_last_error());
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    free(tokens);
    return rc;
}

int mwb_case_scaling(mwb_ctx *ctx) {
    static const char *const defaults[] = {"cpu:1", "cpu:2", "cpu:4"};
    const char *const *specs = ctx->ndevices ? ctx->devices : defaults;
    int n = ctx->ndevices ? ctx->ndevices : 3;
    int steps = ctx->quick ? 3 : 15, warmup = ctx->quick ? 1 : 3;
    printf("GPT-2 tiny, global batch %d x %d tokens, AdamW\n", BATCH, SEQ);
    printf("%-10s %12s %12s %9s %14s %14s\n", "devices", "ms/step", "tokens/s", "speedup",
           "collectives %", "optimizer %");
    double base = 0;
    for (int i = 0; i < n; i++) {
        run_result r;
        if (measure(specs[i], steps, warmup, &r)) return 1;
        double tps = BATCH * SEQ / (r.ms * 1e-3);
        if (i == 0) base = tps;
        printf("%-10s %12.1f %12.0f %8.2fx %13.1f%% %13.1f%%\n", specs[i], r.ms, tps, tps / base,
               100 * r.reduce_ms / r.ms, 100 * r.update_ms / r.ms);
        mwb_record rec = {0};
        mwb_record_str(&rec, "case", "scaling");
        mwb_record_str(&rec, "devices", specs[i]);
        mwb_record_num(&rec, "ms_per_step", r.ms);
        mwb_record_num(&rec, "tokens_per_s", tps);
        mwb_record_num(&rec, "speedup", tps / base);
        mwb_record_num(&rec, "reduce_ms", r.reduce_ms);
        mwb_record_num(&rec, "update_ms", r.update_ms);
        mwb_record_num(&rec, "reduce_share", r.reduce_ms / r.ms);
        ctx->emit(ctx, &rec);
    }
    printf("collectives: device 0's time inside all-reduces (waiting for peers included);\n"
           "optimizer: device 0's update (every replica runs it on the whole model)\n");
    return 0;
}
