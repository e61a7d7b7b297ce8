/* Hugging Face GPT-2's config.json (the weights are gpt2_hf.c's): read strictly through the
 * library's JSON reader, every field honoured or refused by name, and written beside the weights
 * as GPT2LMHeadModel.from_pretrained reads it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gpt2_model.h"
#include "hf_json.h"

/* The config.json beside path (path's folder, with its trailing '/', then "config.json") into
 * cfg; -1 when the path is too long. */
int gpt2_hf_config_path(const char *path, char *cfg, size_t n) {
    const char *slash = strrchr(path, '/');
    int len = slash ? (int)(slash - path) + 1 : 0;
    int k = snprintf(cfg, n, "%.*sconfig.json", len, path);
    return k < 0 || (size_t)k >= n ? -1 : 0;
}

/* config.json is one JSON object, read by the library's reader: at most 128 fields, nested
 * values to 16 levels inside it. A key given twice takes its last value, as Python's json does. */
#define MAX_MEMBERS 128
#define MAX_DEPTH 17 /* the object and 16 levels inside it */

/* Fields of GPT2Config (besides every config's, hf_inert_field) that do not change what the
 * language model computes from its weights: metadata, generation settings, initialisation, the
 * heads of other model classes. */
static const char *const gpt2_fields[] = {"model_type",
                                          "bos_token_id",
                                          "eos_token_id",
                                          "summary_type",
                                          "summary_use_proj",
                                          "summary_activation",
                                          "summary_proj_to_labels",
                                          "summary_first_dropout",
                                          "tf_legacy_loss",
                                          "n_special",
                                          "predict_special_tokens",
                                          "output_past",
                                          "reorder_and_upcast_attn"};

/* The dropout probabilities: read (they only act in training mode), not applied. */
static const char *const dropout_fields[] = {"resid_pdrop", "embd_pdrop", "attn_pdrop"};

/* The fields of config.json's object (r->doc's root) into c. */
static mw_status config_fields(const hf_reader *r, gpt2_config *c, char *note, size_t notesize) {
    const mw__json *doc = r->doc;
    const mw__json_node *root = mw__json_node_at(doc, 0);
    if (root->type != MW__JSON_OBJECT)
        return hf_refuse(r, root, MW_ERR_FORMAT, "expected '{': config.json holds one JSON object");
    if (root->count > MAX_MEMBERS) {
        const mw__json_node *m = mw__json_node_at(doc, root->first);
        for (int i = 0; i < MAX_MEMBERS; i++) m = mw__json_node_at(doc, m->next);
        return hf_refuse(r, m, MW_ERR_FORMAT, "more fields than a GPT-2 config has");
    }
    mw_status st = MW_OK;
    const struct {
        const char *key;
        int *field;
    } sizes[] = {{"n_layer", &c->layers},
                 {"n_head", &c->heads},
                 {"n_embd", &c->channels},
                 {"n_positions", &c->max_seq},
                 {"vocab_size", &c->vocab}};
    for (size_t i = 0; st == MW_OK && i < sizeof sizes / sizeof *sizes; i++) {
        const mw__json_node *m = hf_field(doc, root, sizes[i].key);
        if (!m && strcmp(sizes[i].key, "n_positions") == 0) m = hf_field(doc, root, "n_ctx");
        if (!m) {
            snprintf(r->err, r->errsize, "%s: no \"%s\"", r->cfg, sizes[i].key);
            st = MW_ERR_FORMAT;
        } else if (m->type != MW__JSON_NUMBER || !m->is_integer || m->ival < 1 ||
                   m->ival > (1 << 30)) {
            st = hf_bad_value(r, m, "expected a whole number from 1 to 2^30", MW_ERR_FORMAT);
        } else {
            *sizes[i].field = (int)m->ival;
        }
    }
    c->padded_vocab = c->vocab;
    for (const mw__json_node *m = mw__json_node_at(doc, root->first); st == MW_OK && m;
         m = mw__json_node_at(doc, m->next)) {
        const char *k = mw__json_key(doc, m);
        double v = 0.0;
        if (hf_member(doc, root, k, m->klen) != m) {
            continue; /* an earlier duplicate: the last one counts */
        } else if (strlen(k) != m->klen) {
            st = hf_refuse(r, m, MW_ERR_UNSUPPORTED,
                           "unknown field \"%s\\u0000...\": not one of GPT2Config's", k);
        } else if (!strcmp(k, "n_layer") || !strcmp(k, "n_head") || !strcmp(k, "n_embd") ||
                   !strcmp(k, "n_positions") || !strcmp(k, "vocab_size")) {
            continue;
        } else if (!strcmp(k, "n_ctx")) {
            if (m->type != MW__JSON_NUMBER || !m->is_integer || m->ival != c->max_seq)
                st = hf_bad_value(r, m, "expected n_positions' value (the context length)",
                                  MW_ERR_UNSUPPORTED);
        } else if (!strcmp(k, "n_inner")) {
            if (m->type == MW__JSON_NUMBER && (st = hf_number(r, m, &v))) break;
            if (m->type != MW__JSON_NULL &&
                (m->type != MW__JSON_NUMBER || v != 4.0 * (double)c->channels))
                st = hf_bad_value(r, m, "this GPT-2's MLP is 4 x n_embd wide (null)",
                                  MW_ERR_UNSUPPORTED);
        } else if (!strcmp(k, "activation_function")) {
            if (hf_is_str(doc, m, "gelu_new") || hf_is_str(doc, m, "gelu_pytorch_tanh") ||
                hf_is_str(doc, m, "gelu_fast"))
                c->gelu_exact = 0;
            else if (hf_is_str(doc, m, "gelu") || hf_is_str(doc, m, "gelu_python"))
                c->gelu_exact = 1;
            else
                st = hf_bad_value(
                    r, m, "this GPT-2 computes GELU, tanh (\"gelu_new\") or exact (\"gelu\")",
                    MW_ERR_UNSUPPORTED);
        } else if (!strcmp(k, "layer_norm_epsilon")) {
            if (m->type == MW__JSON_NUMBER && (st = hf_number(r, m, &v))) break;
            if (m->type != MW__JSON_NUMBER || !(v > 0.0 && v < 1.0))
                st = hf_bad_value(r, m, "expected a number in (0, 1)", MW_ERR_FORMAT);
            else
                c->ln_eps = (float)v;
        } else if (!strcmp(k, "scale_attn_weights") ||
                   !strcmp(k, "scale_attn_by_inverse_layer_idx")) {
            if (m->type != MW__JSON_TRUE && m->type != MW__JSON_FALSE)
                st = hf_bad_value(r, m, "expected true or false", MW_ERR_FORMAT);
            else if (k[11] == 'w')
                c->attn_unscaled = m->type == MW__JSON_FALSE;
            else
                c->attn_layer_scaled = m->type == MW__JSON_TRUE;
        } else if (!strcmp(k, "tie_word_embeddings")) {
            if (m->type != MW__JSON_TRUE)
                st = hf_bad_value(r, m, "this GPT-2's output head is the token embedding (true)",
                                  MW_ERR_UNSUPPORTED);
        } else if (!strcmp(k, "add_cross_attention") || !strcmp(k, "is_encoder_decoder")) {
            if (m->type != MW__JSON_FALSE)
                st =
                    hf_bad_value(r, m, "this GPT-2 is a decoder alone (false)", MW_ERR_UNSUPPORTED);
        } else if (!strcmp(k, "pruned_heads")) {
            if (m->type != MW__JSON_OBJECT || m->count)
                st = hf_bad_value(r, m, "this GPT-2 has every head ({})", MW_ERR_UNSUPPORTED);
        } else if (hf_in_list(k, dropout_fields, sizeof dropout_fields / sizeof *dropout_fields)) {
            if (m->type == MW__JSON_NUMBER && (st = hf_number(r, m, &v))) break;
            if (m->type != MW__JSON_NUMBER || !(v >= 0.0 && v <= 1.0))
                st = hf_bad_value(r, m, "expected a probability", MW_ERR_FORMAT);
            else if (v > 0.0 && note && strlen(note) + 48 < notesize)
                snprintf(note + strlen(note), notesize - strlen(note), "%s%s %g",
                         note[0] ? ", " : "", k, v);
        } else if (!strcmp(k, "model_type")) {
            if (!hf_is_str(doc, m, "gpt2"))
                st = hf_bad_value(r, m, "expected \"gpt2\"", MW_ERR_UNSUPPORTED);
        } else if (!hf_inert_field(k) &&
                   !hf_in_list(k, gpt2_fields, sizeof gpt2_fields / sizeof *gpt2_fields)) {
            st = hf_refuse(r, m, MW_ERR_UNSUPPORTED,
                           "unknown field \"%.80s%s\": not one of GPT2Config's, so whether it "
                           "changes the model cannot be told",
                           k, m->klen > 80 ? "..." : "");
        }
    }
    if (st == MW_OK && note && note[0] && strlen(note) + 80 < notesize)
        snprintf(note + strlen(note), notesize - strlen(note),
                 ": dropout is not applied (evaluation equals transformers' eval mode)");
    return st;
}

static mw_status config_from_json(const char *cfg, const char *json, size_t n, gpt2_config *c,
                                  char *note, size_t notesize, char *err, size_t errsize) {
    static const mw__json_options opt = {.max_depth = MAX_DEPTH};
    mw__json *doc;
    memset(c, 0, sizeof *c);
    if (note && notesize) note[0] = '\0';
    mw_status st = mw__json_parse_with(json, n, cfg, &opt, &doc);
    if (st) {
        snprintf(err, errsize, "%s", mw_last_error());
        return st;
    }
    hf_reader r = {.doc = doc, .cfg = cfg, .err = err, .errsize = errsize};
    st = config_fields(&r, c, note, notesize);
    mw__json_free(doc);
    char why[160];
    if (st == MW_OK && gpt2_config_check(c, why, sizeof why) != 0) {
        snprintf(err, errsize, "%s describes no valid model: %s", cfg, why);
        st = MW_ERR_FORMAT;
    }
    return st;
}

/* Reads the config.json at cfg (a regular file of at most 64 KiB). */
static mw_status read_config_file(const char *cfg, const char *path, gpt2_config *c, char *note,
                                  size_t notesize, char *err, size_t errsize) {
    char *json;
    size_t n;
    mw_status st = hf_read_text(cfg, path, &json, &n, err, errsize);
    if (st) return st;
    st = config_from_json(cfg, json, n, c, note, notesize, err, errsize);
    free(json);
    return st;
}

mw_status gpt2_hf_read_config_note(const char *path, gpt2_config *c, char *note, size_t notesize,
                                   char *err, size_t errsize) {
    char cfg[4096];
    if (gpt2_hf_config_path(path, cfg, sizeof cfg) != 0) {
        snprintf(err, errsize, "%s: path too long", path);
        return MW_ERR_INVALID;
    }
    return read_config_file(cfg, path, c, note, notesize, err, errsize);
}

mw_status gpt2_hf_read_config(const char *path, gpt2_config *c, char *err, size_t errsize) {
    return gpt2_hf_read_config_note(path, c, NULL, 0, err, errsize);
}

/* The config.json gpt2_hf_save writes for c. */
static int config_text(const gpt2_config *c, char *out, size_t n) {
    return snprintf(out, n,
                    "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
                    "  \"activation_function\": \"%s\",\n  \"layer_norm_epsilon\": %.9g,\n"
                    "  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_embd\": %d,\n"
                    "  \"n_positions\": %d,\n  \"n_ctx\": %d,\n  \"vocab_size\": %d,\n"
                    "  \"n_inner\": null,\n  \"tie_word_embeddings\": true,\n"
                    "  \"scale_attn_weights\": %s,\n  \"scale_attn_by_inverse_layer_idx\": %s,\n"
                    "  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0\n}\n",
                    c->gelu_exact ? "gelu" : "gelu_new",
                    c->ln_eps > 0.0f ? (double)c->ln_eps : 1e-5, c->layers, c->heads, c->channels,
                    c->max_seq, c->max_seq, c->vocab, c->attn_unscaled ? "false" : "true",
                    c->attn_layer_scaled ? "true" : "false");
}

mw_status gpt2_hf_check_save(const char *path, const gpt2_config *c, char *err, size_t errsize) {
    char cfg[4096];
    if (gpt2_hf_config_path(path, cfg, sizeof cfg) != 0) {
        snprintf(err, errsize, "%s: path too long", path);
        return MW_ERR_INVALID;
    }
    /* Its kind (a FIFO, a folder) is the file discipline's to refuse (mw_file_set_add_output,
     * mw_output_open); reading one here refuses it too, without blocking. */
    struct stat sb;
    if (stat(cfg, &sb) != 0) return MW_OK; /* absent: written beside the weights */
    gpt2_config there;
    char why[512];
    if (read_config_file(cfg, path, &there, NULL, 0, why, sizeof why) != MW_OK) {
        snprintf(err, errsize,
                 "cannot save %s: %s exists and is not a GPT-2 config.json this program can "
                 "replace (%s); save into a folder of its own",
                 path, cfg, why);
        return MW_ERR_IO;
    }
    gpt2_config mine = *c;
    mine.padded_vocab = mine.vocab; /* config.json holds the real vocabulary */
    if (!gpt2_config_equal(&there, &mine)) {
        snprintf(err, errsize,
                 "cannot save %s: %s describes another model (%d layers, %d heads, %d channels, "
                 "context %d, vocab %d; this one: %d, %d, %d, %d, %d, or another activation, "
                 "epsilon or attention scale): save into a folder of its own",
                 path, cfg, there.layers, there.heads, there.channels, there.max_seq, there.vocab,
                 c->layers, c->heads, c->channels, c->max_seq, c->vocab);
        return MW_ERR_IO;
    }
    return MW_OK;
}

/* Starts config.json's output (beside its final name) with its text; the caller commits it once
 * the weights are written. */
mw_status gpt2_hf_write_config(const char *cfg, const gpt2_config *c, mw_output **out, char *err,
                               size_t errsize) {
    char text[2048];
    int len = config_text(c, text, sizeof text);
    if (len <= 0 || (size_t)len >= sizeof text) {
        snprintf(err, errsize, "cannot write %s: the configuration does not fit", cfg);
        return MW_ERR_INVALID;
    }
    mw_status st = mw_output_open(cfg, "config.json", 0, out);
    if (st == MW_OK && (st = mw_output_write(*out, text, (size_t)len)) != MW_OK) {
        mw_output_abandon(*out);
        *out = NULL;
    }
    if (st != MW_OK) snprintf(err, errsize, "%s", mw_last_error());
    return st;
}
