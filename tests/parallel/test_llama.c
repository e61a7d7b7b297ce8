/* The Llama-family model (examples/common/llama_model.c): grouped-query attention, rotary
 * embeddings, SwiGLU and RMS norm trained in every layout equal one device (data parallel,
 * tensor parallel over key/value heads and MLP units, FSDP, bf16 against bf16, recomputation),
 * and decoding with the key/value cache gives the training model's logits. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama_model.h"
#include "meshwit.h"
#include "tests/common/rng.h"

#define B 4
#define T 16
#define STEPS 4
#define NPROBE 64 /* elements of l1.qkv compared after the steps */

static llama_config small_config(int kv_heads, int tied, int bias) {
    llama_config c = {.family = bias ? LLAMA_FAMILY_QWEN2 : LLAMA_FAMILY_LLAMA,
                      .layers = 2,
                      .heads = 4,
                      .kv_heads = kv_heads,
                      .channels = 32,
                      .head_dim = 8,
                      .hidden = 88,
                      .max_seq = 32,
                      .vocab = 64,
                      .rms_eps = 1e-5f,
                      .tied = tied,
                      .qkv_bias = bias,
                      .rope = {.theta = 10000.0f},
                      .bos_id = -1,
                      .eos_id = -1};
    return c;
}

typedef struct layout_run {
    const char *devices, *axes, *data, *model, *fsdp;
    mw_precision precision;
    mw_recompute recompute;
} layout_run;

static void train(const llama_config *cfg, const layout_run *lr, float *loss, float *probe) {
    mw_graph *g;
    gpt2_graph m;
    mw_mesh *mesh;
    mw_trainer *tr;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_graph_set_seed(g, 11);
    gpt2_layout lo = {.batch = B,
                      .seq = T,
                      .data_axis = lr->data,
                      .model_axis = lr->model,
                      .fsdp_axis = lr->fsdp};
    cr_assert_eq(llama_build(g, cfg, &lo, &m), MW_OK, "%s", mw_graph_error(g));
    cr_assert_eq(mw_mesh_new(lr->devices, lr->axes, &mesh), MW_OK, "%s", mw_last_error());
    mw_trainer_config c = {.optimizer = {MW_ADAMW, .lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f,
                                         .eps = 1e-8f, .grad_clip = 1.0f},
                           .precision = lr->precision,
                           .recompute = lr->recompute};
    cr_assert_eq(mw_trainer_new(g, m.loss, mesh, &c, &tr), MW_OK, "%s %s: %s", lr->devices,
                 lr->axes, mw_last_error());
    int32_t in[B * T], tg[B * T];
    for (int s = 0; s < STEPS; s++) {
        uint64_t r = 5 + (uint64_t)s;
        for (int i = 0; i < B * T; i++) {
            in[i] = rng_below(&r, cfg->vocab);
            tg[i] = (int32_t)((uint32_t)in[i] * 5u % (uint32_t)cfg->vocab);
        }
        mw_feed f[2] = {{"tokens", in, B * T}, {"targets", tg, B * T}};
        cr_assert_eq(mw_trainer_step(tr, f, 2, &loss[s]), MW_OK, "%s step %d: %s", lr->devices, s,
                     mw_last_error());
    }
    int64_t n =
        (int64_t)cfg->kv_heads * (cfg->heads / cfg->kv_heads + 2) * cfg->head_dim * cfg->channels;
    float *all = malloc((size_t)n * sizeof *all);
    cr_assert(all);
    cr_assert_eq(mw_trainer_read_param(tr, "l1.qkv", all, n), MW_OK, "%s", mw_last_error());
    memcpy(probe, all, NPROBE * sizeof *probe);
    free(all);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

static void expect_same(const char *what, const float *a, const float *b, int n, float tol) {
    for (int i = 0; i < n; i++)
        cr_assert(fabsf(a[i] - b[i]) <= tol * (1.0f + fabsf(b[i])), "%s [%d]: %.9g vs %.9g", what,
                  i, a[i], b[i]);
}

/* Sums reordered by the split (partial sums over heads and units added in device order) differ
 * by f32 rounding; AdamW's steps carry that as lr x a relative gradient change: 1e-5 bounds it
 * with room, while a missing or doubled collective moves the losses by 1e-2 or more. */
Test(llama, layouts_equal_one_device, .timeout = 300) {
    const llama_config cfgs[] = {small_config(2, 0, 0), small_config(1, 1, 1),
                                 small_config(4, 1, 0)};
    const layout_run runs[] = {
        {"cpu:2", "X", "X", NULL, NULL, MW_PRECISION_FP32, MW_RECOMPUTE_NONE},
        {"cpu:2", "Y", NULL, "Y", NULL, MW_PRECISION_FP32, MW_RECOMPUTE_NONE},
        {"cpu:2", "X", "X", NULL, "X", MW_PRECISION_FP32, MW_RECOMPUTE_NONE},
        {"cpu:1", "X", NULL, NULL, NULL, MW_PRECISION_FP32, MW_RECOMPUTE_BLOCKS},
    };
    for (size_t k = 0; k < sizeof cfgs / sizeof *cfgs; k++) {
        float one[STEPS], p1[NPROBE];
        layout_run base = {"cpu:1", "X", NULL, NULL, NULL, MW_PRECISION_FP32, MW_RECOMPUTE_NONE};
        train(&cfgs[k], &base, one, p1);
        cr_assert_lt(one[STEPS - 1], one[0], "config %zu does not learn", k);
        for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
            if (runs[r].model && cfgs[k].kv_heads % 2) continue; /* one key/value head */
            float loss[STEPS], p[NPROBE];
            train(&cfgs[k], &runs[r], loss, p);
            char what[96];
            snprintf(what, sizeof what, "config %zu on %s %s%s%s", k, runs[r].devices, runs[r].axes,
                     runs[r].fsdp ? " FSDP" : "", runs[r].recompute ? " recompute" : "");
            expect_same(what, loss, one, STEPS, 1e-5f);
            expect_same(what, p, p1, NPROBE, 2e-5f);
        }
    }
}

/* bf16 on two devices (data, then tensor parallel) against bf16 on one. */
Test(llama, bf16_layouts_equal_one_device, .timeout = 300) {
    const llama_config cfg = small_config(2, 0, 1);
    float one[STEPS], p1[NPROBE], loss[STEPS], p[NPROBE];
    layout_run base = {"cpu:1", "X", NULL, NULL, NULL, MW_PRECISION_BF16, MW_RECOMPUTE_NONE};
    train(&cfg, &base, one, p1);
    layout_run x = {"cpu:2", "X", "X", NULL, NULL, MW_PRECISION_BF16, MW_RECOMPUTE_NONE};
    train(&cfg, &x, loss, p);
    expect_same("bf16 X=2", loss, one, STEPS, 1e-5f);
    layout_run y = {"cpu:2", "Y", NULL, "Y", NULL, MW_PRECISION_BF16, MW_RECOMPUTE_NONE};
    train(&cfg, &y, loss, p);
    /* the split sums round to bf16 at other places: bf16's tolerance */
    expect_same("bf16 Y=2", loss, one, STEPS, 2e-2f);
    float f32[STEPS], pf[NPROBE];
    base.precision = MW_PRECISION_FP32;
    train(&cfg, &base, f32, pf);
    expect_same("bf16 vs f32", one, f32, STEPS, 2e-2f);
}

/* Rotary embeddings fused into the attention that reads them (the CPU's default: the kernels
 * rotate q and k as they stage a slice, and d(qkv) back) compute what the rope passes of their own
 * compute (MESHWIT_ROPE=separate): the same rotation code, the same rounding to bf16 after it, the
 * same products, so the same bits, in f32 and bf16, with and without recomputation, grouped
 * (two queries per key/value head), ungrouped and multi-query. */
Test(llama, rotary_in_attention_equals_rope_passes, .timeout = 300) {
    const llama_config cfgs[] = {small_config(2, 0, 1), small_config(4, 1, 0),
                                 small_config(1, 0, 0)};
    const layout_run runs[] = {
        {"cpu:1", "X", NULL, NULL, NULL, MW_PRECISION_FP32, MW_RECOMPUTE_NONE},
        {"cpu:1", "X", NULL, NULL, NULL, MW_PRECISION_BF16, MW_RECOMPUTE_NONE},
        {"cpu:1", "X", NULL, NULL, NULL, MW_PRECISION_BF16, MW_RECOMPUTE_BLOCKS},
        {"cpu:2", "Y", NULL, "Y", NULL, MW_PRECISION_FP32, MW_RECOMPUTE_NONE},
    };
    for (size_t k = 0; k < sizeof cfgs / sizeof *cfgs; k++)
        for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
            if (runs[r].model && cfgs[k].kv_heads % 2) continue;
            float fused[STEPS], pf[NPROBE], apart[STEPS], pa[NPROBE];
            cr_assert_eq(setenv("MESHWIT_ROPE", "fused", 1), 0);
            train(&cfgs[k], &runs[r], fused, pf);
            cr_assert_eq(setenv("MESHWIT_ROPE", "separate", 1), 0);
            train(&cfgs[k], &runs[r], apart, pa);
            cr_assert_eq(unsetenv("MESHWIT_ROPE"), 0);
            for (int s = 0; s < STEPS; s++)
                cr_assert_eq(memcmp(&fused[s], &apart[s], sizeof(float)), 0,
                             "config %zu run %zu step %d: loss %.9g fused, %.9g apart", k, r, s,
                             fused[s], apart[s]);
            for (int i = 0; i < NPROBE; i++)
                cr_assert_eq(memcmp(&pf[i], &pa[i], sizeof(float)), 0,
                             "config %zu run %zu l1.qkv[%d]: %.9g fused, %.9g apart", k, r, i,
                             pf[i], pa[i]);
        }
}

/* Decoding token after token through the key/value cache (rotary positions fed per row) gives
 * the training model's logits at every position. */
Test(llama, cached_decoding_equals_the_full_model, .timeout = 120) {
    const llama_config cfg = small_config(2, 0, 1);
    mw_graph *g, *gd;
    gpt2_graph m, d;
    mw_mesh *mesh;
    mw_trainer *tr;
    mw_infer *full, *dec;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_graph_set_seed(g, 3);
    cr_assert_eq(llama_build(g, &cfg, &(gpt2_layout){.batch = 1, .seq = T}, &m), MW_OK, "%s",
                 mw_graph_error(g));
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &mesh), MW_OK);
    mw_trainer_config c = {.optimizer = {MW_SGD, .lr = 0.0f}};
    cr_assert_eq(mw_trainer_new(g, m.loss, mesh, &c, &tr), MW_OK, "%s", mw_last_error());
    mw_infer_config ic = {.outputs = &m.logits, .noutputs = 1};
    cr_assert_eq(mw_infer_from_trainer(tr, g, &ic, &full), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_graph_new(&gd), MW_OK);
    cr_assert_eq(llama_build(gd, &cfg, &(gpt2_layout){.mode = GPT2_DECODE, .batch = 1}, &d), MW_OK,
                 "%s", mw_graph_error(gd));
    mw_infer_config id = {.outputs = &d.logits, .noutputs = 1};
    cr_assert_eq(mw_infer_from_trainer(tr, gd, &id, &dec), MW_OK, "%s", mw_last_error());
    int32_t tok[T];
    uint64_t r = 9;
    for (int i = 0; i < T; i++) tok[i] = rng_below(&r, cfg.vocab);
    float want[T * 64], got[64];
    mw_feed f = {"tokens", tok, T};
    mw_fetch fw = {m.logits, want, T * 64};
    cr_assert_eq(mw_infer_run(full, &f, 1, 1, &fw, 1), MW_OK, "%s", mw_last_error());
    for (int i = 0; i < T; i++) {
        int32_t p = i;
        mw_feed in[2] = {{"tokens", &tok[i], 1}, {"pos", &p, 1}};
        mw_fetch fg = {d.logits, got, 64};
        cr_assert_eq(mw_infer_run(dec, in, 2, 1, &fg, 1), MW_OK, "%s", mw_last_error());
        for (int v = 0; v < 64; v++)
            cr_assert(fabsf(got[v] - want[i * 64 + v]) <= 1e-4f,
                      "position %d logit %d: cached %.9g, full %.9g", i, v, got[v],
                      want[i * 64 + v]);
    }
    mw_infer_free(dec);
    mw_infer_free(full);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(gd);
    mw_graph_free(g);
}
