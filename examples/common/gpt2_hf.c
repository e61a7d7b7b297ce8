/* Hugging Face GPT-2 weights: the safetensors layout GPT2LMHeadModel.save_pretrained writes
 * ("transformer.h.0.attn.c_attn.weight", ...; GPT2Model's own files have no "transformer."
 * prefix). The config.json beside them is gpt2_hf_config.c's.
 *
 * The differences from a meshwit GPT-2: HF's Conv1D layers store their weight [In, Out] where
 * ours is [Out, In] (as nn.Linear and llm.c), so every linear weight is transposed on the way in
 * and out; wte has the real vocabulary's rows only (ours may have padding rows, zero when
 * loaded); the output head is tied to wte, so the file has no lm_head.weight. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2_model.h"
#include "hf_json.h"

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

/* --- weights ---------------------------------------------------------------------------------- */

/* Whether name is one the model reads: a tensor of hf_tensors for layers [0, c->layers). */
static int used_name(const char *name, const gpt2_config *c, const char *prefix) {
    char hf[128], ours[64];
    for (int i = 0; i < NHF; i++)
        for (int l = 0; l < (hf_tensors[i].per_layer ? c->layers : 1); l++) {
            names(&hf_tensors[i], l, prefix, hf, ours, sizeof ours);
            if (strcmp(hf, name) == 0) return 1;
        }
    return 0;
}

/* transformers' attention mask buffers ("h.<l>.attn.bias", "h.<l>.attn.masked_bias"), which
 * older save_pretrained calls stored: constants, not weights. */
static int mask_buffer(const char *name, const gpt2_config *c, const char *prefix) {
    size_t p = strlen(prefix);
    int l, end = 0;
    if (strncmp(name, prefix, p) != 0 || sscanf(name + p, "h.%d.attn.%n", &l, &end) != 1 || !end ||
        l < 0 || l >= c->layers)
        return 0;
    return strcmp(name + p + end, "bias") == 0 || strcmp(name + p + end, "masked_bias") == 0;
}

/* A file tensor the model does not use is an error naming it (a model of more layers, or of
 * another kind, is not loaded in part); an lm_head.weight is accepted only when it holds wte's
 * values (a tied head saved twice). */
static mw_status unused_tensors(mw_safetensors *f, const gpt2_config *c, const char *prefix,
                                const char *path, char *err, size_t errsize) {
    int n = mw_safetensors_count(f), unused = 0;
    char list[400] = "";
    for (int i = 0; i < n; i++) {
        mw_stored_tensor t;
        if (mw_safetensors_tensor(f, i, &t) != MW_OK) continue;
        if (used_name(t.name, c, prefix) || mask_buffer(t.name, c, prefix)) continue;
        if (strcmp(t.name, "lm_head.weight") == 0) {
            char wte[128];
            snprintf(wte, sizeof wte, "%swte.weight", prefix);
            if (hf_tensors_equal(f, t.name, wte, t.count)) continue;
            snprintf(err, errsize,
                     "%s: lm_head.weight differs from %s: an untied output head, which this "
                     "GPT-2 (its head is the token embedding) cannot hold",
                     path, wte);
            return MW_ERR_UNSUPPORTED;
        }
        if (unused++ < 3)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s'%s'",
                     unused > 1 ? ", " : "", t.name);
    }
    if (!unused) return MW_OK;
    snprintf(err, errsize,
             "%s holds %d tensor%s a GPT-2 of %d layers does not use (%s%s): the file is of "
             "another model than its config.json describes",
             path, unused, unused > 1 ? "s" : "", c->layers, list, unused > 3 ? ", ..." : "");
    return MW_ERR_FORMAT;
}

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
    /* Two passes: every tensor is checked before the first parameter changes, and every tensor
     * of the file must be one the model uses (after the first pass). */
    for (int pass = 0; pass < 2 && st == MW_OK; pass++) {
        if (pass == 1 && (st = unused_tensors(f, c, prefix, path, err, errsize)) != MW_OK) break;
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
    /* config.json is written and synced to a temporary file first and renamed into place after
     * the weights: a failure on the way leaves the folder as it was. An existing config.json of
     * another model is never replaced. */
    char cfg[4096];
    mw_output *cfg_out = NULL;
    if (st == MW_OK && !path) goto done; /* another process's part of a gathering save */
    if (st == MW_OK && gpt2_hf_config_path(path, cfg, sizeof cfg) != 0) {
        snprintf(err, errsize, "%s: path too long", path);
        st = MW_ERR_INVALID;
    }
    if (st == MW_OK) st = gpt2_hf_check_save(path, c, err, errsize);
    if (st == MW_OK && (st = gpt2_hf_write_config(cfg, c, &cfg_out, err, errsize)) == MW_OK) {
        /* config.json is on the disk before the weights are written and renamed: a full disk
         * shows before either is renamed, and after the weights only config.json's rename is
         * left to do. */
        if ((st = mw_output_sync(cfg_out)) != MW_OK) {
            snprintf(err, errsize, "%s", mw_last_error());
            mw_output_abandon(cfg_out);
        } else if ((st = mw_safetensors_write(path, e, n)) != MW_OK) {
            snprintf(err, errsize, "%s", mw_last_error());
            mw_output_abandon(cfg_out);
        } else if ((st = mw_output_commit(cfg_out)) != MW_OK) {
            snprintf(err, errsize, "wrote %s, but not its config.json: %s", path, mw_last_error());
        }
    }
done:
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
