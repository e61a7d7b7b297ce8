/* Hugging Face GPT-2 weights in both directions, against transformers itself: the files in
 * tests/data/hf_gpt2_tiny were written by GPT2LMHeadModel.save_pretrained on a random tiny model
 * (tools/make_hf_gpt2_ref.py), with the loss and logits transformers computes on a fixed batch.
 * Loaded here (with and without the "transformer." prefix), the model gives transformers' loss
 * and logits; saved again, it gives back transformers' own tensors bit for bit, and config.json
 * with transformers' sizes. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
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
    cr_assert_eq(
        gpt2_build(m->g, &m->c,
                   &(gpt2_layout){.batch = r->B, .seq = r->T, .data_axis = sharded ? "X" : NULL},
                   &m->gg),
        MW_OK, "%s", mw_graph_error(m->g));
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

/* --- config.json: every field honoured or refused ----------------------------------------------
 */

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot create %s", path);
    cr_assert_eq(fwrite(text, 1, strlen(text), f), strlen(text));
    cr_assert_eq(fclose(f), 0);
}

static void copy_file(const char *from, const char *to) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    cr_assert_eq(system(cmd), 0);
}

static void remove_dir(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* The reference config.json with `fields` (a JSON object's members, "a":1,"b":2) given again at
 * its end: the last value of a key counts, as in Python's json. */
static void config_with(const char *dir, const char *fields) {
    char src[4096], dst[512];
    data_path(src, sizeof src, "config.json");
    char *text = read_text(src), *end = strrchr(text, '}');
    cr_assert(end);
    *end = '\0';
    static char out[70000];
    snprintf(out, sizeof out, "%s%s%s}\n", text, *fields ? ",\n  " : "", fields);
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    write_text(dst, out);
}

/* Layer-norm epsilon, exact GELU and both attention scalings as transformers computes them, on
 * weights (variants.safetensors: the reference's matrices x 20) where each changes the loss by
 * 10 to 10^4 times the tolerance. */
Test(gpt2_hf, config_fields_are_computed_as_transformers_does) {
    ref r;
    read_ref(&r);
    char path[4096], weights[4096], dir[256], dst[512];
    data_path(path, sizeof path, "variants.txt");
    data_path(weights, sizeof weights, "variants.safetensors");
    scratch_dir(dir, sizeof dir);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    copy_file(weights, dst);
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot open %s", path);
    char name[32], fields[512];
    double want;
    int cases = 0;
    while (fscanf(f, "%31s %lf %511s", name, &want, fields) == 3) {
        size_t n = strlen(fields); /* {"a":1,...} -> "a":1,... */
        cr_assert(n >= 2 && fields[0] == '{' && fields[n - 1] == '}');
        fields[n - 1] = '\0';
        config_with(dir, fields + 1);
        model m;
        model_open(&m, dst, &r, cases % 2 ? "cpu:2" : "cpu:1");
        mw_feed feeds[2] = {{"tokens", r.tokens, r.B * r.T}, {"targets", r.targets, r.B * r.T}};
        float loss;
        cr_assert_eq(mw_trainer_eval(m.tr, feeds, 2, &loss), MW_OK, "%s", mw_last_error());
        cr_assert(fabs(loss - want) <= 2e-6 * fabs(want), "%s: loss %.9g, transformers %.9g", name,
                  loss, want);
        model_close(&m);
        cases++;
    }
    fclose(f);
    cr_assert_eq(cases, 6);
    remove_dir(dir);
}

Test(gpt2_hf, config_fields_are_honoured_or_refused_by_name, .timeout = 30) {
    char dir[256], weights[512];
    scratch_dir(dir, sizeof dir);
    snprintf(weights, sizeof weights, "%s/model.safetensors", dir);
    const struct {
        const char *fields;
        mw_status st;
        const char *words;
    } cases[] = {
        {"\"n_layer\": 2.9", MW_ERR_FORMAT, "\"n_layer\" is a number; expected a whole number"},
        {"\"n_layer\": 2.0", MW_ERR_FORMAT, "expected a whole number"},
        {"\"n_head\": \"3\"", MW_ERR_FORMAT, "\"n_head\" is 3; expected a whole number"},
        {"\"rotary_dim\": 8", MW_ERR_UNSUPPORTED, "unknown field \"rotary_dim\""},
        {"\"tie_word_embeddings\": false", MW_ERR_UNSUPPORTED, "output head"},
        {"\"activation_function\": \"relu\"", MW_ERR_UNSUPPORTED,
         "\"activation_function\" is relu"},
        {"\"model_type\": \"llama\"", MW_ERR_UNSUPPORTED, "expected \"gpt2\""},
        {"\"n_inner\": 100", MW_ERR_UNSUPPORTED, "4 x n_embd"},
        {"\"n_ctx\": 32", MW_ERR_UNSUPPORTED, "n_positions"},
        {"\"add_cross_attention\": true", MW_ERR_UNSUPPORTED, "decoder alone"},
        {"\"pruned_heads\": {\"0\": [1]}", MW_ERR_UNSUPPORTED, "every head"},
        {"\"layer_norm_epsilon\": -1", MW_ERR_FORMAT, "(0, 1)"},
        {"\"scale_attn_weights\": 1", MW_ERR_FORMAT, "true or false"},
        {"\"n_layer\": 02", MW_ERR_FORMAT, "leading zero"},
        {"\"n_layer\": 2 \"x\": 1", MW_ERR_FORMAT, "expected ',' or '}'"},
        {"\"n_layer\": tru", MW_ERR_FORMAT, "expected a value"},
        {"\"a\\q\": 1", MW_ERR_FORMAT, "bad escape"},
        /* U+0000 ends no key or value early: "n_layer\0x" is not n_layer, "gelu\0new" not gelu */
        {"\"n_layer\\u0000x\": 9", MW_ERR_UNSUPPORTED, "unknown field \"n_layer\\u0000...\""},
        {"\"activation_function\": \"gelu\\u0000new\"", MW_ERR_UNSUPPORTED,
         "\"activation_function\" is gelu\\u0000...;"},
    };
    char err[1024];
    gpt2_config c;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        config_with(dir, cases[i].fields);
        mw_status st = gpt2_hf_read_config(weights, &c, err, sizeof err);
        cr_assert_eq(st, cases[i].st, "case %zu (%s): %s: %s", i, cases[i].fields,
                     mw_status_name(st), err);
        cr_assert(strstr(err, cases[i].words), "case %zu (%s): message lacks '%s': %s", i,
                  cases[i].fields, cases[i].words, err);
        cr_assert(strstr(err, "config.json"), "case %zu: no file name: %s", i, err);
    }
    /* A field's place: line and column of its value. */
    config_with(dir, "\"n_layer\": 2.9");
    cr_assert_eq(gpt2_hf_read_config(weights, &c, err, sizeof err), MW_ERR_FORMAT);
    cr_assert(strstr(err, "config.json:35:14:"), "%s", err);
    /* A key given twice: its last value, as Python's json. */
    config_with(dir, "\"n_layer\": 3, \"n_layer\": 1");
    cr_assert_eq(gpt2_hf_read_config(weights, &c, err, sizeof err), MW_OK, "%s", err);
    cr_assert_eq(c.layers, 1);
    /* A number of any length is read (here 3e-5 in 117 characters; the last value counts). */
    char digits[160] = "\"layer_norm_epsilon\": 0.00003";
    for (int i = 0; i < 110; i++) strcat(digits, "0");
    config_with(dir, digits);
    cr_assert_eq(gpt2_hf_read_config(weights, &c, err, sizeof err), MW_OK, "%s", err);
    cr_assert(c.ln_eps == 3e-5f, "%.9g", (double)c.ln_eps);
    /* Truncated. */
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    write_text(cfg, "{\n  \"n_layer\": 2,\n  \"n_");
    cr_assert_eq(gpt2_hf_read_config(weights, &c, err, sizeof err), MW_ERR_FORMAT);
    cr_assert(strstr(err, "config.json:3:") && strstr(err, "unterminated string"), "%s", err);
    /* Dropout is read and said not to be applied. */
    config_with(dir, "\"resid_pdrop\": 0.1, \"attn_pdrop\": 0.1");
    char note[256];
    cr_assert_eq(gpt2_hf_read_config_note(weights, &c, note, sizeof note, err, sizeof err), MW_OK,
                 "%s", err);
    cr_assert(strstr(note, "resid_pdrop 0.1") && strstr(note, "attn_pdrop 0.1") &&
                  strstr(note, "not applied"),
              "%s", note);
    /* A FIFO as config.json is refused without blocking. */
    unlink(cfg);
    cr_assert_eq(mkfifo(cfg, 0600), 0);
    cr_assert_eq(gpt2_hf_read_config(weights, &c, err, sizeof err), MW_ERR_IO);
    cr_assert(strstr(err, "a FIFO"), "%s", err);
    remove_dir(dir);
}

/* A file holding tensors the model does not use is not loaded in part: a model of fewer layers
 * than the file, or an untied head, is an error naming them. */
Test(gpt2_hf, a_file_with_unused_tensors_is_refused) {
    ref r;
    read_ref(&r);
    char src[4096];
    data_path(src, sizeof src, "model.safetensors");
    model m;
    model_open(&m, src, &r, "cpu:1");
    char err[1024];
    gpt2_config fewer = m.c;
    fewer.layers = 1;
    cr_assert_eq(gpt2_hf_load(m.tr, &fewer, src, err, sizeof err), MW_ERR_FORMAT);
    cr_assert(strstr(err, "holds 12 tensors a GPT-2 of 1 layers does not use") &&
                  strstr(err, "'transformer.h.1."),
              "%s", err);
    /* lm_head.weight: accepted when it is wte again, refused when it differs. */
    char dir[256], dst[512];
    scratch_dir(dir, sizeof dir);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    mw_safetensors *f;
    cr_assert_eq(mw_safetensors_open(src, &f), MW_OK);
    int n = mw_safetensors_count(f);
    mw_safetensors_entry *e = calloc((size_t)n + 1, sizeof *e);
    float *wte = NULL;
    for (int i = 0; i < n; i++) {
        mw_stored_tensor t;
        cr_assert_eq(mw_safetensors_tensor(f, i, &t), MW_OK);
        e[i].name = t.name;
        e[i].rank = t.rank;
        memcpy(e[i].shape, t.shape, sizeof t.shape);
        float *d = malloc((size_t)t.count * sizeof *d);
        cr_assert_eq(mw_safetensors_read(f, t.name, d, t.count), MW_OK);
        e[i].data = d;
        if (!strcmp(t.name, "transformer.wte.weight")) {
            e[n] = e[i];
            e[n].name = "lm_head.weight";
            wte = malloc((size_t)t.count * sizeof *wte);
            memcpy(wte, d, (size_t)t.count * sizeof *wte);
            e[n].data = wte;
        }
    }
    cr_assert(wte);
    cr_assert_eq(mw_safetensors_write(dst, e, n + 1), MW_OK, "%s", mw_last_error());
    cr_assert_eq(gpt2_hf_load(m.tr, &m.c, dst, err, sizeof err), MW_OK, "%s", err);
    check_against_transformers(&m, &r);
    wte[3] += 1.0f;
    cr_assert_eq(mw_safetensors_write(dst, e, n + 1), MW_OK, "%s", mw_last_error());
    cr_assert_eq(gpt2_hf_load(m.tr, &m.c, dst, err, sizeof err), MW_ERR_UNSUPPORTED);
    cr_assert(strstr(err, "untied output head"), "%s", err);
    for (int i = 0; i <= n; i++) free((void *)e[i].data);
    free(e);
    mw_safetensors_close(f);
    model_close(&m);
    remove_dir(dir);
}

/* config.json beside a save: written after the weights; another model's (or a file that is not
 * a GPT-2 config) is never replaced, and nothing is written then. */
Test(gpt2_hf, a_save_never_replaces_another_models_config) {
    ref r;
    read_ref(&r);
    char src[4096], dir[256], dst[512], cfg[512], err[1024];
    data_path(src, sizeof src, "model.safetensors");
    scratch_dir(dir, sizeof dir); /* holds the reference's config.json: this very model */
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    model m;
    model_open(&m, src, &r, "cpu:1");
    cr_assert_eq(gpt2_hf_save(m.tr, &m.c, dst, err, sizeof err), MW_OK, "%s", err);
    gpt2_config other = m.c;
    other.layers = 1; /* saved into the same folder as a model of another size */
    char second[512];
    snprintf(second, sizeof second, "%s/other.safetensors", dir);
    char *before = strdup(read_text(cfg));
    cr_assert_eq(gpt2_hf_check_save(second, &other, err, sizeof err), MW_ERR_IO);
    cr_assert(strstr(err, "describes another model"), "%s", err);
    cr_assert_eq(gpt2_hf_save(m.tr, &other, second, err, sizeof err), MW_ERR_IO);
    cr_assert_str_eq(read_text(cfg), before);
    cr_assert_eq(access(second, F_OK), -1, "the weights were written");
    write_text(cfg, "{\"foo\": 1}\n"); /* an unrelated config.json */
    cr_assert_eq(gpt2_hf_save(m.tr, &m.c, dst, err, sizeof err), MW_ERR_IO);
    cr_assert(strstr(err, "not a GPT-2 config.json"), "%s", err);
    cr_assert_str_eq(read_text(cfg), "{\"foo\": 1}\n");
    free(before);
    model_close(&m);
    remove_dir(dir);
}

/* The weights and their config.json are both on the disk before either is renamed: on a file
 * system with room for the weights alone (a tmpfs of their size), the save fails and leaves no
 * weights without their config.json. Needs root, for the tmpfs. */
Test(gpt2_hf, a_full_disk_leaves_no_weights_without_their_config) {
    ref r;
    read_ref(&r);
    char src[4096], dir[256], full[300], dst[512], err[1024];
    data_path(src, sizeof src, "model.safetensors");
    scratch_dir(dir, sizeof dir);
    snprintf(dst, sizeof dst, "%s/sized.safetensors", dir);
    model m;
    model_open(&m, src, &r, "cpu:1");
    cr_assert_eq(gpt2_hf_save(m.tr, &m.c, dst, err, sizeof err), MW_OK, "%s", err);
    struct stat sb;
    cr_assert_eq(stat(dst, &sb), 0);
    long page = sysconf(_SC_PAGESIZE);
    long long room = ((long long)sb.st_size + page - 1) / page * page; /* the weights' pages */
    snprintf(full, sizeof full, "%s/full", dir);
    cr_assert_eq(mkdir(full, 0700), 0);
    char opts[64];
    snprintf(opts, sizeof opts, "size=%lld", room);
    if (mount("tmpfs", full, "tmpfs", 0, opts) != 0) {
        model_close(&m);
        remove_dir(dir);
        cr_skip_test("cannot mount a tmpfs here (%s): needs root", strerror(errno));
    }
    snprintf(dst, sizeof dst, "%s/model.safetensors", full);
    mw_status st = gpt2_hf_save(m.tr, &m.c, dst, err, sizeof err);
    int weights = access(dst, F_OK) == 0;
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/config.json", full);
    int config = access(cfg, F_OK) == 0;
    umount2(full, MNT_DETACH);
    model_close(&m);
    remove_dir(dir);
    cr_assert_neq(st, MW_OK, "a save that cannot fit succeeded");
    cr_assert(strstr(err, "No space left on device"), "%s", err);
    cr_assert(!weights, "the weights were renamed into place without their config.json (%s)", err);
    cr_assert(!config, "config.json was written without the weights");
}

/* A config.json that is not a regular file (a FIFO) is refused by reading it, without blocking:
 * the file discipline's kind check, not one of this file's own. */
Test(gpt2_hf, a_config_that_is_a_fifo_is_refused_without_blocking, .timeout = 30) {
    char dir[256], dst[512], cfg[512], err[1024];
    scratch_dir(dir, sizeof dir);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    cr_assert_eq(unlink(cfg), 0);
    cr_assert_eq(mkfifo(cfg, 0600), 0);
    ref r;
    read_ref(&r);
    char src[4096];
    data_path(src, sizeof src, "model.safetensors");
    model m;
    model_open(&m, src, &r, "cpu:1");
    mw_status st = gpt2_hf_check_save(dst, &m.c, err, sizeof err);
    model_close(&m);
    struct stat sb;
    int fifo = stat(cfg, &sb) == 0 && S_ISFIFO(sb.st_mode);
    remove_dir(dir);
    cr_assert_eq(st, MW_ERR_IO, "%s", err);
    cr_assert(strstr(err, "it is a FIFO, not a regular file"), "%s", err);
    cr_assert(fifo, "the FIFO was replaced");
}
