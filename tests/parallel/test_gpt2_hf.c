/* Hugging Face GPT-2 weights in both directions, against transformers itself: the files in
 * tests/data/hf_gpt2_tiny were written by GPT2LMHeadModel.save_pretrained on a random tiny model
 * (tools/make_hf_gpt2_ref.py), with the loss and logits transformers computes on a fixed batch.
 * Loaded here (with and without the "transformer." prefix), the model gives transformers' loss
 * and logits; saved again, it gives back transformers' own tensors bit for bit, and config.json
 * with transformers' sizes. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpt2_model.h"
#include "meshwit.h"

#define MAXN 64

typedef struct ref {
    int B, T;
    int32_t tokens[MAXN], targets[MAXN];
    double loss;
    double logits0[8];
} ref;

static void data_path(char *buf, size_t size, const char *name) {
    const char *file = __FILE__, *slash = strrchr(file, '/');
    snprintf(buf, size, "%.*s/../data/hf_gpt2_tiny/%s", slash ? (int)(slash - file) : 1,
             slash ? file : ".", name);
}

static void read_ints(FILE *f, const char *key, int32_t *out, int n) {
    char word[32];
    cr_assert_eq(fscanf(f, "%31s", word), 1);
    cr_assert_str_eq(word, key);
    for (int i = 0; i < n; i++) cr_assert_eq(fscanf(f, "%d", &out[i]), 1);
}

static void read_ref(ref *r) {
    char path[4096];
    data_path(path, sizeof path, "reference.txt");
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot open %s", path);
    cr_assert_eq(fscanf(f, "B %d T %d", &r->B, &r->T), 2);
    cr_assert(r->B * r->T <= MAXN);
    read_ints(f, "tokens", r->tokens, r->B * r->T);
    read_ints(f, "targets", r->targets, r->B * r->T);
    cr_assert_eq(fscanf(f, " loss %lf", &r->loss), 1);
    char word[32];
    cr_assert_eq(fscanf(f, "%31s", word), 1);
    for (int i = 0; i < 8; i++) cr_assert_eq(fscanf(f, "%lf", &r->logits0[i]), 1);
    fclose(f);
}

typedef struct model {
    gpt2_config c;
    mw_graph *g;
    gpt2_graph gg;
    mw_mesh *mesh;
    mw_trainer *tr;
} model;

static void model_open(model *m, const char *weights, const ref *r, const char *devices) {
    memset(m, 0, sizeof *m);
    char err[512];
    cr_assert_eq(gpt2_hf_read_config(weights, &m->c, err, sizeof err), MW_OK, "%s", err);
    cr_assert_eq(mw_graph_new(&m->g), MW_OK);
    int sharded = strcmp(devices, "cpu:1") != 0;
    cr_assert_eq(gpt2_build(m->g, &m->c, r->B, r->T, sharded ? "X" : NULL, &m->gg), MW_OK, "%s",
                 mw_graph_error(m->g));
    cr_assert_eq(mw_mesh_new(devices, "X", &m->mesh), MW_OK);
    mw_trainer_config cfg = {
        .optimizer = {MW_SGD, .lr = 0.0f}, .outputs = &m->gg.logits, .noutputs = 1};
    cr_assert_eq(mw_trainer_new(m->g, m->gg.loss, m->mesh, &cfg, &m->tr), MW_OK, "%s",
                 mw_last_error());
    cr_assert_eq(gpt2_hf_load(m->tr, &m->c, weights, err, sizeof err), MW_OK, "%s", err);
}

static void model_close(model *m) {
    mw_trainer_free(m->tr);
    mw_mesh_free(m->mesh);
    mw_graph_free(m->g);
}

/* The loss and the first logits equal transformers' (float64) to float32 accuracy: a model of
 * this size computes them to a few 1e-7 relative. */
static void check_against_transformers(model *m, const ref *r) {
    mw_feed feeds[2] = {{"tokens", r->tokens, r->B * r->T}, {"targets", r->targets, r->B * r->T}};
    float loss;
    cr_assert_eq(mw_trainer_eval(m->tr, feeds, 2, &loss), MW_OK, "%s", mw_last_error());
    cr_assert(fabs(loss - r->loss) <= 2e-6 * fabs(r->loss), "loss %.9g, transformers %.9g", loss,
              r->loss);
    int64_t n = (int64_t)r->B * r->T * m->c.padded_vocab;
    float *logits = malloc((size_t)n * sizeof *logits);
    cr_assert_eq(mw_trainer_read_output(m->tr, m->gg.logits, logits, n), MW_OK, "%s",
                 mw_last_error());
    for (int i = 0; i < 8; i++)
        cr_assert(fabs(logits[i] - r->logits0[i]) <= 2e-6, "logit %d: %.9g, transformers %.9g", i,
                  logits[i], r->logits0[i]);
    free(logits);
}

Test(gpt2_hf, loads_what_transformers_saved) {
    ref r;
    read_ref(&r);
    char path[4096];
    data_path(path, sizeof path, "model.safetensors");
    model m;
    model_open(&m, path, &r, "cpu:1");
    cr_assert_eq(m.c.layers, 2);
    cr_assert_eq(m.c.heads, 3);
    cr_assert_eq(m.c.channels, 24);
    cr_assert_eq(m.c.vocab, 60);
    cr_assert_eq(m.c.max_seq, 16);
    check_against_transformers(&m, &r);
    model_close(&m);
    model_open(&m, path, &r, "cpu:2");
    check_against_transformers(&m, &r);
    model_close(&m);
}

/* A folder with config.json copied from the reference and a weights file of our making. */
static void scratch_dir(char *dir, size_t size) {
    snprintf(dir, size, "/tmp/mw_hf_%d", (int)getpid());
    char cmd[8192], cfg[4096];
    data_path(cfg, sizeof cfg, "config.json");
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s %s/", dir, cfg, dir);
    cr_assert_eq(system(cmd), 0);
}

Test(gpt2_hf, loads_files_without_the_transformer_prefix) {
    /* GPT2Model (no head) saves its tensors as "wte.weight", "h.0.ln_1.weight", ... */
    ref r;
    read_ref(&r);
    char src[4096], dir[256], dst[512];
    data_path(src, sizeof src, "model.safetensors");
    scratch_dir(dir, sizeof dir);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    mw_safetensors *f;
    cr_assert_eq(mw_safetensors_open(src, &f), MW_OK, "%s", mw_last_error());
    int n = mw_safetensors_count(f);
    mw_safetensors_entry *e = calloc((size_t)n, sizeof *e);
    for (int i = 0; i < n; i++) {
        mw_stored_tensor t;
        cr_assert_eq(mw_safetensors_tensor(f, i, &t), MW_OK);
        cr_assert(strncmp(t.name, "transformer.", 12) == 0, "%s", t.name);
        e[i].name = t.name + 12;
        e[i].rank = t.rank;
        memcpy(e[i].shape, t.shape, sizeof t.shape);
        float *d = malloc((size_t)t.count * sizeof *d);
        cr_assert_eq(mw_safetensors_read(f, t.name, d, t.count), MW_OK);
        e[i].data = d;
    }
    cr_assert_eq(mw_safetensors_write(dst, e, n), MW_OK, "%s", mw_last_error());
    for (int i = 0; i < n; i++) free((void *)e[i].data);
    free(e);
    mw_safetensors_close(f);
    model m;
    model_open(&m, dst, &r, "cpu:1");
    check_against_transformers(&m, &r);
    model_close(&m);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

Test(gpt2_hf, saves_what_transformers_saved) {
    ref r;
    read_ref(&r);
    char src[4096], dir[256], dst[512];
    data_path(src, sizeof src, "model.safetensors");
    scratch_dir(dir, sizeof dir);
    snprintf(dst, sizeof dst, "%s/out/model.safetensors", dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/out", dir);
    cr_assert_eq(system(cmd), 0);
    model m;
    model_open(&m, src, &r, "cpu:1");
    char err[512];
    cr_assert_eq(gpt2_hf_save(m.tr, &m.c, dst, err, sizeof err), MW_OK, "%s", err);
    model_close(&m);
    /* Every tensor of transformers' file, with its name, shape and bits, and no other. */
    mw_safetensors *a, *b;
    cr_assert_eq(mw_safetensors_open(src, &a), MW_OK);
    cr_assert_eq(mw_safetensors_open(dst, &b), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_safetensors_count(b), mw_safetensors_count(a));
    cr_assert_str_eq(mw_safetensors_metadata(b, "format"), "pt");
    for (int i = 0; i < mw_safetensors_count(a); i++) {
        mw_stored_tensor ta, tb;
        cr_assert_eq(mw_safetensors_tensor(a, i, &ta), MW_OK);
        cr_assert_eq(mw_safetensors_find(b, ta.name, &tb), MW_OK, "missing %s", ta.name);
        cr_assert_eq(tb.rank, ta.rank, "%s", ta.name);
        for (int k = 0; k < ta.rank; k++) cr_assert_eq(tb.shape[k], ta.shape[k], "%s", ta.name);
        float *x = malloc((size_t)ta.count * 4), *y = malloc((size_t)ta.count * 4);
        cr_assert_eq(mw_safetensors_read(a, ta.name, x, ta.count), MW_OK);
        cr_assert_eq(mw_safetensors_read(b, ta.name, y, ta.count), MW_OK);
        cr_assert(memcmp(x, y, (size_t)ta.count * 4) == 0, "%s differs", ta.name);
        free(x);
        free(y);
    }
    mw_safetensors_close(a);
    mw_safetensors_close(b);
    /* The config.json written beside it describes the same model. */
    gpt2_config c;
    cr_assert_eq(gpt2_hf_read_config(dst, &c, err, sizeof err), MW_OK, "%s", err);
    cr_assert(c.layers == 2 && c.heads == 3 && c.channels == 24 && c.vocab == 60 &&
              c.max_seq == 16);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

Test(gpt2_hf, refuses_a_mismatched_file) {
    ref r;
    read_ref(&r);
    char src[4096];
    data_path(src, sizeof src, "model.safetensors");
    model m;
    model_open(&m, src, &r, "cpu:1");
    gpt2_config bigger = m.c;
    bigger.layers = 3;
    char err[512];
    cr_assert_eq(gpt2_hf_load(m.tr, &bigger, src, err, sizeof err), MW_ERR_NOT_FOUND);
    cr_assert(strstr(err, "transformer.h.2.ln_1.weight"), "%s", err);
    gpt2_config wider = m.c;
    wider.max_seq = 32;
    cr_assert_eq(gpt2_hf_load(m.tr, &wider, src, err, sizeof err), MW_ERR_SHAPE);
    cr_assert(strstr(err, "transformer.wpe.weight") && strstr(err, "[16, 24]"), "%s", err);
    model_close(&m);
}
