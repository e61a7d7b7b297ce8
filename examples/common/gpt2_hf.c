/* Hugging Face GPT-2 weights: the safetensors layout GPT2LMHeadModel.save_pretrained writes
 * ("transformer.h.0.attn.c_attn.weight", ...; GPT2Model's own files have no "transformer."
 * prefix) and the config.json beside it.
 *
 * The differences from a meshwit GPT-2: HF's Conv1D layers store their weight [In, Out] where
 * ours is [Out, In] (as nn.Linear and llm.c), so every linear weight is transposed on the way in
 * and out; wte has the real vocabulary's rows only (ours may have padding rows, zero when
 * loaded); the output head is tied to wte, so the file has no lm_head.weight. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2_model.h"

/* One tensor of the HF layout and the meshwit parameter it is. */
typedef struct hf_tensor {
    const char *hf;   /* after "transformer." and, per layer, "h.<l>." */
    const char *ours; /* after "h<l>." per layer */
    int per_layer;    /* one per layer */
    int transpose;    /* a Conv1D weight: [In, Out] in the file */
} hf_tensor;

static const hf_tensor hf_tensors[] = {
    {"wte.weight", "wte", 0, 0},
    {"wpe.weight", "wpe", 0, 0},
    {"ln_1.weight", "ln1w", 1, 0},
    {"ln_1.bias", "ln1b", 1, 0},
    {"attn.c_attn.weight", "qkvw", 1, 1},
    {"attn.c_attn.bias", "qkvb", 1, 0},
    {"attn.c_proj.weight", "attprojw", 1, 1},
    {"attn.c_proj.bias", "attprojb", 1, 0},
    {"ln_2.weight", "ln2w", 1, 0},
    {"ln_2.bias", "ln2b", 1, 0},
    {"mlp.c_fc.weight", "fcw", 1, 1},
    {"mlp.c_fc.bias", "fcb", 1, 0},
    {"mlp.c_proj.weight", "fcprojw", 1, 1},
    {"mlp.c_proj.bias", "fcprojb", 1, 0},
    {"ln_f.weight", "lnfw", 0, 0},
    {"ln_f.bias", "lnfb", 0, 0},
};
#define NHF ((int)(sizeof hf_tensors / sizeof *hf_tensors))

/* The file's shape of tensor t (rank 1 or 2) for model c: wte has the real vocabulary. */
static int hf_shape(const hf_tensor *t, const gpt2_config *c, int64_t shape[2]) {
    int64_t C = c->channels;
    const char *o = t->ours;
    if (!strcmp(o, "wte")) return shape[0] = c->vocab, shape[1] = C, 2;
    if (!strcmp(o, "wpe")) return shape[0] = c->max_seq, shape[1] = C, 2;
    int64_t out = !strcmp(o, "qkvw") || !strcmp(o, "qkvb") ? 3 * C
                  : !strcmp(o, "fcw") || !strcmp(o, "fcb") ? 4 * C
                                                           : C;
    int64_t in = !strcmp(o, "fcprojw") ? 4 * C : C;
    if (t->transpose) return shape[0] = in, shape[1] = out, 2;
    return shape[0] = out, 1;
}

static void names(const hf_tensor *t, int l, const char *prefix, char *hf, char *ours, size_t n) {
    if (t->per_layer) {
        snprintf(hf, n, "%sh.%d.%s", prefix, l, t->hf);
        snprintf(ours, n, "h%d.%s", l, t->ours);
    } else {
        snprintf(hf, n, "%s%s", prefix, t->hf);
        snprintf(ours, n, "%s", t->ours);
    }
}

static void transpose(const float *src, float *dst, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < cols; k++) dst[k * rows + r] = src[r * cols + k];
}

/* --- config.json ------------------------------------------------------------------------------ */

/* The folder of path, with a trailing '/' ("" for a bare file name). */
static void folder_of(const char *path, char *dir, size_t n) {
    const char *slash = strrchr(path, '/');
    size_t len = slash ? (size_t)(slash - path) + 1 : 0;
    snprintf(dir, n, "%.*s", (int)len, path);
}

/* The text after `"key":` in json (white space skipped), or NULL. Enough for the flat object
 * config.json is. */
static const char *json_value(const char *json, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    for (const char *p = strstr(json, pat); p; p = strstr(p + 1, pat)) {
        const char *v = p + strlen(pat);
        while (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r') v++;
        if (*v != ':') continue;
        v++;
        while (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r') v++;
        return v;
    }
    return NULL;
}

static int json_int(const char *json, const char *key, int *out) {
    const char *v = json_value(json, key);
    if (!v) return -1;
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || x < 1 || x > (1L << 30)) return -2;
    *out = (int)x;
    return 0;
}

mw_status gpt2_hf_read_config(const char *path, gpt2_config *c, char *err, size_t errsize) {
    char cfg[4096];
    folder_of(path, cfg, sizeof cfg);
    if (strlen(cfg) + 12 >= sizeof cfg) {
        snprintf(err, errsize, "%s: path too long", path);
        return MW_ERR_INVALID;
    }
    strcat(cfg, "config.json");
    FILE *f = fopen(cfg, "rb");
    if (!f) {
        snprintf(err, errsize, "cannot open %s (the model's config.json beside %s): %s", cfg, path,
                 strerror(errno));
        return MW_ERR_IO;
    }
    char json[65536];
    size_t n = fread(json, 1, sizeof json - 1, f);
    int big = !feof(f);
    fclose(f);
    json[n] = '\0';
    if (big) {
        snprintf(err, errsize, "%s: larger than 64 KiB, not a GPT-2 config.json", cfg);
        return MW_ERR_FORMAT;
    }
    memset(c, 0, sizeof *c);
    const struct {
        const char *key, *alt;
        int *field;
    } fields[] = {{"n_layer", NULL, &c->layers},
                  {"n_head", NULL, &c->heads},
                  {"n_embd", NULL, &c->channels},
                  {"n_positions", "n_ctx", &c->max_seq},
                  {"vocab_size", NULL, &c->vocab}};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        int rc = json_int(json, fields[i].key, fields[i].field);
        if (rc == -1 && fields[i].alt) rc = json_int(json, fields[i].alt, fields[i].field);
        if (rc) {
            snprintf(err, errsize, "%s: %s \"%s\"", cfg, rc == -1 ? "no" : "a bad value for",
                     fields[i].key);
            return MW_ERR_FORMAT;
        }
    }
    c->padded_vocab = c->vocab;
    const char *act = json_value(json, "activation_function");
    if (act && strncmp(act, "\"gelu_new\"", 10) != 0 && strncmp(act, "\"gelu_pytorch_tanh\"", 19)) {
        snprintf(err, errsize,
                 "%s: activation_function %.24s; this GPT-2 has GELU with the tanh approximation "
                 "(\"gelu_new\")",
                 cfg, act);
        return MW_ERR_UNSUPPORTED;
    }
    const char *eps = json_value(json, "layer_norm_epsilon");
    if (eps && strtod(eps, NULL) != 1e-5) {
        snprintf(err, errsize, "%s: layer_norm_epsilon %g; this GPT-2 uses 1e-05", cfg,
                 strtod(eps, NULL));
        return MW_ERR_UNSUPPORTED;
    }
    const char *tied = json_value(json, "tie_word_embeddings");
    if (tied && strncmp(tied, "true", 4) != 0) {
        snprintf(err, errsize,
                 "%s: tie_word_embeddings is not true; this GPT-2's output head is "
                 "the token embedding",
                 cfg);
        return MW_ERR_UNSUPPORTED;
    }
    char why[160];
    if (gpt2_config_check(c, why, sizeof why) != 0) {
        snprintf(err, errsize, "%s describes no valid model: %s", cfg, why);
        return MW_ERR_FORMAT;
    }
    return MW_OK;
}

static mw_status write_config(const char *path, const gpt2_config *c, char *err, size_t errsize) {
    char cfg[4096];
    folder_of(path, cfg, sizeof cfg);
    strncat(cfg, "config.json", sizeof cfg - strlen(cfg) - 1);
    FILE *f = fopen(cfg, "wb");
    if (!f) {
        snprintf(err, errsize, "cannot create %s: %s", cfg, strerror(errno));
        return MW_ERR_IO;
    }
    int ok = fprintf(f,
                     "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
                     "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n"
                     "  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_embd\": %d,\n"
                     "  \"n_positions\": %d,\n  \"n_ctx\": %d,\n  \"vocab_size\": %d,\n"
                     "  \"n_inner\": null,\n  \"tie_word_embeddings\": true,\n"
                     "  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0\n}\n",
                     c->layers, c->heads, c->channels, c->max_seq, c->max_seq, c->vocab) > 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok) {
        snprintf(err, errsize, "cannot write %s: %s", cfg, strerror(errno));
        return MW_ERR_IO;
    }
    return MW_OK;
}

/* --- weights ---------------------------------------------------------------------------------- */

mw_status gpt2_hf_load(mw_trainer *tr, const gpt2_config *c, const char *path, char *err,
                       size_t errsize) {
    mw_safetensors *f;
    mw_status st = mw_safetensors_open(path, &f);
    if (st) {
        snprintf(err, errsize, "%s", mw_last_error());
        return st;
    }
    mw_stored_tensor info;
    const char *prefix =
        mw_safetensors_find(f, "transformer.wte.weight", &info) == MW_OK ? "transformer." : "";
    int64_t most = (int64_t)c->padded_vocab * c->channels;
    if ((int64_t)c->max_seq * c->channels > most) most = (int64_t)c->max_seq * c->channels;
    if (4 * (int64_t)c->channels * c->channels > most)
        most = 4 * (int64_t)c->channels * c->channels;
    float *buf = calloc((size_t)most, sizeof *buf), *tbuf = calloc((size_t)most, sizeof *tbuf);
    if (!buf || !tbuf) {
        st = MW_ERR_NOMEM;
        snprintf(err, errsize, "out of memory loading %s", path);
    }
    /* Two passes: every tensor is checked before the first parameter changes. */
    for (int pass = 0; pass < 2 && st == MW_OK; pass++)
        for (int i = 0; i < NHF && st == MW_OK; i++)
            for (int l = 0; l < (hf_tensors[i].per_layer ? c->layers : 1) && st == MW_OK; l++) {
                const hf_tensor *t = &hf_tensors[i];
                char hf[128], ours[64];
                names(t, l, prefix, hf, ours, sizeof ours);
                int64_t shape[2];
                int rank = hf_shape(t, c, shape);
                if (pass == 0) {
                    if ((st = mw_safetensors_find(f, hf, &info)) != MW_OK) {
                        snprintf(err, errsize, "%s has no tensor '%s' (a GPT-2 of %d layers)", path,
                                 hf, c->layers);
                    } else if (info.rank != rank || info.shape[0] != shape[0] ||
                               (rank == 2 && info.shape[1] != shape[1])) {
                        st = MW_ERR_SHAPE;
                        snprintf(err, errsize,
                                 "%s: tensor '%s' has %d dimensions [%lld, %lld], the model "
                                 "(config.json) needs [%lld%s%lld]",
                                 path, hf, info.rank, (long long)info.shape[0],
                                 (long long)(info.rank > 1 ? info.shape[1] : 0),
                                 (long long)shape[0], rank == 2 ? ", " : "",
                                 (long long)(rank == 2 ? shape[1] : 0));
                    }
                    continue;
                }
                int64_t n = rank == 2 ? shape[0] * shape[1] : shape[0];
                int64_t count =
                    !strcmp(t->ours, "wte") ? (int64_t)c->padded_vocab * c->channels : n;
                memset(buf, 0, (size_t)count * sizeof *buf); /* wte's padding rows */
                if ((st = mw_safetensors_read(f, hf, buf, n)) != MW_OK) {
                    snprintf(err, errsize, "%s", mw_last_error());
                    break;
                }
                float *src = buf;
                if (t->transpose) {
                    transpose(buf, tbuf, shape[0], shape[1]);
                    src = tbuf;
                }
                if ((st = mw_trainer_write_param(tr, ours, src, count)) != MW_OK)
                    snprintf(err, errsize, "parameter %s: %s", ours, mw_last_error());
            }
    free(buf);
    free(tbuf);
    mw_safetensors_close(f);
    return st;
}

mw_status gpt2_hf_save(mw_trainer *tr, const gpt2_config *c, const char *path, char *err,
                       size_t errsize) {
    int n = 4 + 12 * c->layers;
    mw_safetensors_entry *e = calloc((size_t)n, sizeof *e);
    char(*hf)[128] = calloc((size_t)n, sizeof *hf);
    float **data = calloc((size_t)n, sizeof *data);
    mw_status st = e && hf && data ? MW_OK : MW_ERR_NOMEM;
    if (st) snprintf(err, errsize, "out of memory saving %s", path);
    int k = 0;
    for (int i = 0; i < NHF && st == MW_OK; i++)
        for (int l = 0; l < (hf_tensors[i].per_layer ? c->layers : 1) && st == MW_OK; l++, k++) {
            const hf_tensor *t = &hf_tensors[i];
            char ours[64];
            names(t, l, "transformer.", hf[k], ours, sizeof ours);
            int rank = hf_shape(t, c, e[k].shape);
            int64_t count = rank == 2 ? e[k].shape[0] * e[k].shape[1] : e[k].shape[0];
            int64_t all = !strcmp(t->ours, "wte") ? (int64_t)c->padded_vocab * c->channels : count;
            float *p = malloc((size_t)all * sizeof *p), *q = malloc((size_t)all * sizeof *q);
            if (!p || !q) {
                free(p);
                free(q);
                st = MW_ERR_NOMEM;
                snprintf(err, errsize, "out of memory saving %s", path);
                break;
            }
            if ((st = mw_trainer_read_param(tr, ours, p, all)) != MW_OK) {
                snprintf(err, errsize, "parameter %s: %s", ours, mw_last_error());
                free(p);
                free(q);
                break;
            }
            if (t->transpose) { /* ours [Out, In] = [shape[1], shape[0]] */
                transpose(p, q, e[k].shape[1], e[k].shape[0]);
                free(p);
                p = q;
            } else {
                free(q);
            }
            data[k] = p;
            e[k].name = hf[k];
            e[k].rank = rank;
            e[k].data = p;
        }
    if (st == MW_OK && (st = mw_safetensors_write(path, e, n)) != MW_OK)
        snprintf(err, errsize, "%s", mw_last_error());
    if (st == MW_OK) st = write_config(path, c, err, errsize);
    for (int i = 0; data && i < n; i++) free(data[i]);
    free(data);
    free(hf);
    free(e);
    return st;
}

int gpt2_is_safetensors(const char *path) {
    size_t n = strlen(path), s = strlen(".safetensors");
    return n >= s && strcmp(path + n - s, ".safetensors") == 0;
}
