/* Bench case "gpt2-124m": GPT-2 124M (12 layers, 12 heads, 768 channels, vocab 50257 padded to
 * 50304) at context 1024, batch 8 x 1024, AdamW, on each --devices spec (default: cuda:0 when a
 * GPU is present; on CPUs it takes tens of seconds a step, so it runs there only when asked),
 * in bf16 (and f32 with --precision fp32 or both): ms/step, tokens/s and MFU, the model's FLOP/s
 * (6 N + 12 L C T per token) against the device's dense peak for that precision, from
 * MESHWIT_PEAK_BF16_TFLOPS and MESHWIT_PEAK_TFLOPS (an H100/H200 SXM: 989 and 67). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "gpt2_run.h"

#define BATCH 8
#define SEQ 1024

static double peak(int bf16) {
    const char *v = getenv(bf16 ? "MESHWIT_PEAK_BF16_TFLOPS" : "MESHWIT_PEAK_TFLOPS");
    double t = v ? atof(v) : 0.0;
    return t > 0.0 ? t * 1e12 : 0.0;
}

int mwb_case_gpt2_124m(mwb_ctx *ctx) {
    const char *specs[8];
    int n = 0;
    for (int i = 0; i < ctx->ndevices && n < 8; i++) specs[n++] = ctx->devices[i];
    if (!n) {
        mw_mesh *probe = NULL;
        if (mw_mesh_new("cuda:0", "X", &probe) == MW_OK) specs[n++] = "cuda:0";
        mw_mesh_free(probe);
    }
    if (!n) {
        printf("skipped: no GPU (give --devices, e.g. cpu:2, to run it on CPUs: slowly)\n");
        return 0;
    }
    int precisions = ctx->precision ? ctx->precision : MWB_BF16;
    mwb_gpt2_setup s = {.batch = BATCH, .seq = SEQ, .warmup = ctx->quick ? 1 : 2};
    s.repeats = ctx->quick ? 1 : 3;
    s.steps = ctx->quick ? 1 : 3;
    gpt2_preset("gpt2-124m", &s.model);
    double fpt = mwb_gpt2_flops_per_token(&s.model, SEQ), tokens = (double)BATCH * SEQ;
    printf("GPT-2 124M (%lld parameters), batch %d x %d, AdamW; median of %d x %d steps after %d "
           "warm-up; MFU against MESHWIT_PEAK_TFLOPS (f32) and MESHWIT_PEAK_BF16_TFLOPS (bf16)\n",
           (long long)gpt2_num_params(&s.model), BATCH, SEQ, s.repeats, s.steps, s.warmup);
    printf("%-12s %-6s %10s %10s %13s %7s %12s\n", "devices", "prec", "ms/step", "tokens/s",
           "model TFLOP/s", "MFU", "memory (MB)");
    fflush(stdout);
    int failed = 0;
    for (int i = 0; i < n; i++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            if (!(precisions & (bf16 ? MWB_BF16 : MWB_FP32))) continue;
            s.devices = specs[i];
            s.precision = bf16 ? MW_PRECISION_BF16 : MW_PRECISION_FP32;
            mwb_gpt2_result r;
            mwb_gpt2_measure(&s, &r);
            if (!r.ok) {
                fprintf(stderr, "gpt2-124m: %s %s: %s\n", specs[i], bf16 ? "bf16" : "fp32",
                        r.error);
                failed = 1;
                continue;
            }
            double flops = tokens / (r.ms * 1e-3) * fpt, p = peak(bf16);
            double mem = (double)(r.memory.parameters + r.memory.gradients + r.memory.optimizer +
                                  r.memory.activations + r.memory.workspace) /
                         1e6;
            char mfu[16] = "-";
            if (p > 0) snprintf(mfu, sizeof mfu, "%.1f%%", 100.0 * flops / p);
            printf("%-12s %-6s %10.1f %10.0f %13.2f %7s %12.0f\n", specs[i], bf16 ? "bf16" : "fp32",
                   r.ms, tokens / (r.ms * 1e-3), flops * 1e-12, mfu, mem);
            fflush(stdout);
            mwb_record rec = {0};
            mwb_record_str(&rec, "case", "gpt2-124m");
            mwb_record_str(&rec, "devices", specs[i]);
            mwb_record_str(&rec, "precision", bf16 ? "bf16" : "fp32");
            mwb_record_num(&rec, "batch", BATCH);
            mwb_record_num(&rec, "seq", SEQ);
            mwb_record_num(&rec, "ms_per_step", r.ms);
            mwb_record_num(&rec, "tokens_per_s", tokens / (r.ms * 1e-3));
            mwb_record_num(&rec, "model_tflops", flops * 1e-12);
            if (p > 0) mwb_record_num(&rec, "mfu", flops / p);
            mwb_record_num(&rec, "memory_mb", mem);
            ctx->emit(ctx, &rec);
        }
    return failed;
}
