/* Hugging Face Llama-family models into the Llama builder (examples/common/llama_hf.c): random
 * tiny models written by transformers' save_pretrained (tests/data/llama, made by
 * tools/make_llama_refs.py: grouped-query attention, multi-query with Llama 3's rope scaling,
 * tied and untied heads, several rope_theta, MLP widths that are not 4x, Qwen2's qkv bias,
 * Mistral) give transformers' loss, its last logits and its greedy continuation, in f32 on one
 * device, data and tensor parallel, and in bf16; what llama_hf_save writes loads back to the
 * same loss; a transformers 4.x config.json (rope_theta, rope_scaling) reads as the 5.x one
 * (rope_parameters); a config field this model cannot honour is refused by name. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llama_model.h"
#include "meshwit.h"

#define RB 4
#define RT 32
#define VOCAB 256

typedef struct ref {
    int32_t tokens[RB][RT + 1];
    double loss, loss_bf16;
    float logits0[VOCAB];
    int32_t greedy[24];
} ref;

static void path_of(char *buf, size_t size, const char *model, const char *file) {
    const char *src = __FILE__, *slash = strrchr(src, '/');
    snprintf(buf, size, "%.*s/../data/llama/%s/%s", slash ? (int)(slash - src) : 1,
             slash ? src : ".", model, file);
}

static void read_ref(const char *model, ref *r) {
    char p[512], key[64];
    path_of(p, sizeof p, model, "ref.txt");
    FILE *f = fopen(p, "r");
    cr_assert(f, "cannot open %s", p);
    int seq = 0;
    memset(r, 0, sizeof *r);
    while (fscanf(f, "%63s", key) == 1) {
        if (!strcmp(key, "tokens:")) {
            for (int i = 0; i <= RT; i++) cr_assert_eq(fscanf(f, "%d", &r->tokens[seq][i]), 1);
            seq++;
        } else if (!strcmp(key, "loss:")) {
            cr_assert_eq(fscanf(f, "%lf", &r->loss), 1);
        } else if (!strcmp(key, "loss_bf16:")) {
            cr_assert_eq(fscanf(f, "%lf", &r->loss_bf16), 1);
        } else if (!strcmp(key, "logits0:")) {
            for (int i = 0; i < VOCAB; i++) cr_assert_eq(fscanf(f, "%f", &r->logits0[i]), 1);
        } else if (!strcmp(key, "greedy:")) {
            for (int i = 0; i < 24; i++) cr_assert_eq(fscanf(f, "%d", &r->greedy[i]), 1);
        } else {
            int ch;
            while ((ch = fgetc(f)) != EOF && ch != '\n') continue;
        }
    }
    fclose(f);
    cr_assert_eq(seq, RB, "%s: %d token lines", p, seq);
}

typedef struct loaded {
    mw_graph *g;
    gpt2_graph m;
    mw_mesh *mesh;
    mw_trainer *tr;
} loaded;

static void load(loaded *l, const llama_config *c, const char *weights, const char *devices,
                 const char *axes, const char *data, const char *model, mw_precision prec) {
    char err[512] = "";
    memset(l, 0, sizeof *l);
    cr_assert_eq(mw_graph_new(&l->g), MW_OK);
    gpt2_layout lo = {.batch = RB, .seq = RT, .data_axis = data, .model_axis = model};
    cr_assert_eq(llama_build(l->g, c, &lo, &l->m), MW_OK, "%s", mw_graph_error(l->g));
    cr_assert_eq(mw_mesh_new(devices, axes, &l->mesh), MW_OK, "%s", mw_last_error());
    mw_trainer_config tc = {.optimizer = {MW_SGD, .lr = 0.0f}, .precision = prec};
    cr_assert_eq(mw_trainer_new(l->g, l->m.loss, l->mesh, &tc, &l->tr), MW_OK, "%s",
                 mw_last_error());
    cr_assert_eq(llama_hf_load(l->tr, c, weights, err, sizeof err), MW_OK, "%s", err);
}

static void unload(loaded *l) {
    mw_trainer_free(l->tr);
    mw_mesh_free(l->mesh);
    mw_graph_free(l->g);
}

static float eval_loss(loaded *l, const ref *r) {
    int32_t in[RB * RT], tg[RB * RT];
    for (int b = 0; b < RB; b++)
        for (int t = 0; t < RT; t++)
            in[b * RT + t] = r->tokens[b][t], tg[b * RT + t] = r->tokens[b][t + 1];
    mw_feed f[2] = {{"tokens", in, RB * RT}, {"targets", tg, RB * RT}};
    float loss = 0;
    cr_assert_eq(mw_trainer_eval(l->tr, f, 2, &loss), MW_OK, "%s", mw_last_error());
    return loss;
}

static const char *const models[] = {"llama-gqa", "llama-tied", "llama3-smooth", "qwen2",
                                     "mistral"};
#define NMODELS ((int)(sizeof models / sizeof *models))

static void config_of(const char *model, llama_config *c, char *weights, size_t n) {
    char err[512] = "";
    path_of(weights, n, model, "model.safetensors");
    cr_assert_eq(llama_hf_read_config(weights, c, err, sizeof err), MW_OK, "%s", err);
}

/* transformers' f32 loss to 2e-4 on one device, data parallel and tensor parallel. */
Test(llama_hf, loss_equals_transformers, .timeout = 240) {
    for (int k = 0; k < NMODELS; k++) {
        llama_config c;
        char w[512];
        ref r;
        config_of(models[k], &c, w, sizeof w);
        read_ref(models[k], &r);
        const struct {
            const char *devices, *axes, *data, *model;
        } lay[] = {
            {"cpu:1", "X", NULL, NULL}, {"cpu:2", "X", "X", NULL}, {"cpu:2", "Y", NULL, "Y"}};
        for (int i = 0; i < 3; i++) {
            if (lay[i].model && c.kv_heads % 2) continue; /* one key/value head */
            loaded l;
            load(&l, &c, w, lay[i].devices, lay[i].axes, lay[i].data, lay[i].model,
                 MW_PRECISION_FP32);
            float loss = eval_loss(&l, &r);
            cr_assert(fabs(loss - r.loss) <= 2e-4, "%s on %s %s: loss %.9g, transformers %.9g",
                      models[k], lay[i].devices, lay[i].axes, loss, r.loss);
            unload(&l);
        }
    }
}

/* bf16 (autocast) to bf16's tolerance of transformers' autocast loss. */
Test(llama_hf, bf16_loss_near_transformers_autocast, .timeout = 240) {
    for (int k = 0; k < NMODELS; k++) {
        llama_config c;
        char w[512];
        ref r;
        config_of(models[k], &c, w, sizeof w);
        read_ref(models[k], &r);
        loaded l;
        load(&l, &c, w, "cpu:1", "X", NULL, NULL, MW_PRECISION_BF16);
        float loss = eval_loss(&l, &r);
        cr_assert(fabs(loss - r.loss_bf16) <= 2e-2 && fabs(loss - r.loss) <= 2e-2,
                  "%s bf16: loss %.9g, transformers autocast %.9g (f32 %.9g)", models[k], loss,
                  r.loss_bf16, r.loss);
        unload(&l);
    }
}

/* The last position's logits of sequence 0 and the greedy continuation through the key/value
 * cache (16 tokens after an 8-token prompt) equal transformers' generate. */
Test(llama_hf, logits_and_greedy_decoding_equal_transformers, .timeout = 240) {
    for (int k = 0; k < NMODELS; k++) {
        llama_config c;
        char w[512];
        ref r;
        config_of(models[k], &c, w, sizeof w);
        read_ref(models[k], &r);
        loaded l;
        load(&l, &c, w, "cpu:1", "X", NULL, NULL, MW_PRECISION_FP32);
        mw_graph *gf, *gd;
        gpt2_graph mf, md;
        mw_infer *full, *dec;
        cr_assert_eq(mw_graph_new(&gf), MW_OK);
        cr_assert_eq(llama_build(gf, &c, &(gpt2_layout){.batch = 1, .seq = RT}, &mf), MW_OK);
        mw_infer_config ic = {.outputs = &mf.logits, .noutputs = 1};
        cr_assert_eq(mw_infer_from_trainer(l.tr, gf, &ic, &full), MW_OK, "%s", mw_last_error());
        static float logits[RT * VOCAB];
        mw_feed f = {"tokens", r.tokens[0], RT};
        mw_fetch fe = {mf.logits, logits, RT * VOCAB};
        cr_assert_eq(mw_infer_run(full, &f, 1, 1, &fe, 1), MW_OK, "%s", mw_last_error());
        for (int v = 0; v < VOCAB; v++)
            cr_assert(fabsf(logits[(RT - 1) * VOCAB + v] - r.logits0[v]) <= 2e-4f,
                      "%s logit %d: %.7g, transformers %.7g", models[k], v,
                      logits[(RT - 1) * VOCAB + v], r.logits0[v]);
        cr_assert_eq(mw_graph_new(&gd), MW_OK);
        cr_assert_eq(llama_build(gd, &c, &(gpt2_layout){.mode = GPT2_DECODE, .batch = 1}, &md),
                     MW_OK);
        mw_infer_config id = {.outputs = &md.logits, .noutputs = 1};
        cr_assert_eq(mw_infer_from_trainer(l.tr, gd, &id, &dec), MW_OK, "%s", mw_last_error());
        int32_t seq[24];
        memcpy(seq, r.greedy, 8 * sizeof *seq);
        float out[VOCAB];
        for (int p = 0; p < 23; p++) {
            int32_t pos = p;
            mw_feed in[2] = {{"tokens", &seq[p], 1}, {"pos", &pos, 1}};
            mw_fetch fo = {md.logits, out, VOCAB};
            cr_assert_eq(mw_infer_run(dec, in, 2, 1, &fo, 1), MW_OK, "%s", mw_last_error());
            if (p < 7) continue;
            int best = 0;
            for (int v = 1; v < VOCAB; v++)
                if (out[v] > out[best]) best = v;
            seq[p + 1] = best;
        }
        for (int i = 8; i < 24; i++)
            cr_assert_eq(seq[i], r.greedy[i], "%s greedy token %d: %d, transformers %d", models[k],
                         i, seq[i], r.greedy[i]);
        mw_infer_free(dec);
        mw_infer_free(full);
        mw_graph_free(gd);
        mw_graph_free(gf);
        unload(&l);
    }
}

/* What llama_hf_save writes (safetensors and config.json) reads back to the same config and
 * loss; saving over another model's config.json is refused. */
Test(llama_hf, save_loads_back, .timeout = 240) {
    char dir[] = "/tmp/mw_llama_hf_XXXXXX";
    cr_assert(mkdtemp(dir));
    for (int k = 0; k < NMODELS; k++) {
        llama_config c, back;
        char w[512], out[600], err[512] = "";
        ref r;
        config_of(models[k], &c, w, sizeof w);
        read_ref(models[k], &r);
        loaded l;
        load(&l, &c, w, "cpu:1", "X", NULL, NULL, MW_PRECISION_FP32);
        snprintf(out, sizeof out, "%s/%s", dir, models[k]);
        cr_assert_eq(mkdir(out, 0700), 0);
        snprintf(out, sizeof out, "%s/%s/model.safetensors", dir, models[k]);
        cr_assert_eq(llama_hf_save(l.tr, &c, out, err, sizeof err), MW_OK, "%s", err);
        cr_assert_eq(llama_hf_read_config(out, &back, err, sizeof err), MW_OK, "%s", err);
        cr_assert(llama_config_equal(&c, &back), "%s: the saved config.json differs", models[k]);
        float before = eval_loss(&l, &r);
        unload(&l);
        load(&l, &back, out, "cpu:1", "X", NULL, NULL, MW_PRECISION_FP32);
        float after = eval_loss(&l, &r);
        cr_assert_eq(before, after, "%s: %.9g before saving, %.9g after", models[k], before, after);
        if (k > 0) { /* the previous model's folder holds another model's config.json */
            char other[600];
            snprintf(other, sizeof other, "%s/%s/model.safetensors", dir, models[k - 1]);
            cr_assert_neq(llama_hf_save(l.tr, &back, other, err, sizeof err), MW_OK);
            cr_assert(strstr(err, "another model"), "%s", err);
        }
        unload(&l);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* transformers 4.x writes rope_theta and rope_scaling where 5.x writes rope_parameters: the
 * same config either way. */
Test(llama_hf, legacy_config_reads_alike) {
    for (int k = 0; k < NMODELS; k++) {
        char w[512], dir[] = "/tmp/mw_llama_cfg_XXXXXX", dst[600], src[512], cmd[1400];
        llama_config c, legacy;
        config_of(models[k], &c, w, sizeof w);
        cr_assert(mkdtemp(dir));
        path_of(src, sizeof src, models[k], "config.legacy.json");
        snprintf(cmd, sizeof cmd, "cp '%s' '%s/config.json'", src, dir);
        cr_assert_eq(system(cmd), 0);
        snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
        char err[512] = "";
        cr_assert_eq(llama_hf_read_config(dst, &legacy, err, sizeof err), MW_OK, "%s", err);
        cr_assert(llama_config_equal(&c, &legacy), "%s: config.legacy.json reads otherwise",
                  models[k]);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        cr_assert_eq(system(cmd), 0);
    }
}

/* Fields this model cannot honour are refused by name. */
Test(llama_hf, unsupported_fields_refused_by_name) {
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"\"hidden_act\": \"gelu\"", "hidden_act"},
        {"\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}", "yarn"},
        {"\"attention_bias\": true", "attention_bias"},
        {"\"use_sliding_window\": true", "sliding"},
        {"\"model_type\": \"gemma\"", "gemma"},
        {"\"mystery_field\": 1", "mystery_field"},
        {"\"num_key_value_heads\": 3", "num_key_value_heads"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char dir[] = "/tmp/mw_llama_bad_XXXXXX", p[600], err[512] = "";
        cr_assert(mkdtemp(dir));
        snprintf(p, sizeof p, "%s/config.json", dir);
        FILE *f = fopen(p, "w");
        cr_assert(f);
        int mt = strstr(cases[i].json, "model_type") != NULL;
        fprintf(f,
                "{%s\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"hidden_size\": 64, "
                "\"intermediate_size\": 128, \"vocab_size\": 256, \"max_position_embeddings\": "
                "64, %s}",
                mt ? "" : "\"model_type\": \"llama\", ", cases[i].json);
        fclose(f);
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        llama_config c;
        cr_assert_neq(llama_hf_read_config(p, &c, err, sizeof err), MW_OK, "%s accepted",
                      cases[i].json);
        cr_assert(strstr(err, cases[i].want), "%s: %s", cases[i].json, err);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        cr_assert_eq(system(cmd), 0);
    }
}
