/* Hugging Face Llama, Mistral and Qwen2 models (llama_model.h): config.json read strictly (every
 * field honoured or refused by name) and written back, and the safetensors weights in the layout
 * LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM save_pretrained writes:
 *   model.embed_tokens.weight [Vocab, Embed], model.norm.weight, lm_head.weight (untied only)
 *   model.layers.<l>.{input_layernorm, post_attention_layernorm}.weight [Embed]
 *   model.layers.<l>.self_attn.{q,k,v}_proj.weight [heads x HeadDim, Embed] (Qwen2: and .bias)
 *   model.layers.<l>.self_attn.o_proj.weight [Embed, heads x HeadDim]
 *   model.layers.<l>.mlp.{gate,up}_proj.weight [Hidden, Embed], mlp.down_proj.weight [Embed,
 * Hidden] q, k and v are interleaved into the fused qkv [KvHead, G + 2, HeadDim, Embed] on the way
 * in and taken apart on the way out; gate and up are stacked into gate_up; o and down keep their
 * order. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hf_json.h"
#include "llama_model.h"

/* --- config.json ------------------------------------------------------------------------------ */

#define MAX_MEMBERS 160
#define MAX_DEPTH 17

typedef struct sizes_field {
    const char *key;
    int *field;
    int required;
} sizes_field;

/* A whole number in [1, 2^30] into *out. */
static mw_status whole(const hf_reader *r, const mw__json_node *m, int *out) {
    if (m->type != MW__JSON_NUMBER || !m->is_integer || m->ival < 1 || m->ival > (1 << 30))
        return hf_bad_value(r, m, "expected a whole number from 1 to 2^30", MW_ERR_FORMAT);
    *out = (int)m->ival;
    return MW_OK;
}

static mw_status positive(const hf_reader *r, const mw__json_node *m, double *v) {
    mw_status st = m->type == MW__JSON_NUMBER ? hf_number(r, m, v) : MW_OK;
    if (st) return st;
    if (m->type != MW__JSON_NUMBER || !(*v > 0.0) || !isfinite(*v))
        return hf_bad_value(r, m, "expected a positive number", MW_ERR_FORMAT);
    return MW_OK;
}

/* rope_scaling (or transformers 5's rope_parameters): null, {"rope_type": "default"} or Llama
 * 3's; every other kind refused by name. `params` also carries rope_theta. */
static mw_status rope_object(const hf_reader *r, const mw__json_node *m, llama_config *c,
                             int params) {
    const mw__json *doc = r->doc;
    if (m->type == MW__JSON_NULL) return MW_OK;
    if (m->type != MW__JSON_OBJECT)
        return hf_bad_value(r, m, "expected null or an object", MW_ERR_FORMAT);
    const mw__json_node *type = hf_field(doc, m, "rope_type");
    if (!type) type = hf_field(doc, m, "type");
    if (!type || type->type != MW__JSON_STRING)
        return hf_refuse(r, m, MW_ERR_FORMAT, "\"%s\" has no \"rope_type\"", mw__json_key(doc, m));
    int llama3 = hf_is_str(doc, type, "llama3");
    if (!llama3 && !hf_is_str(doc, type, "default"))
        return hf_refuse(r, type, MW_ERR_UNSUPPORTED,
                         "rope_type \"%.40s\" is not supported (this model computes the default "
                         "rotary frequencies and Llama 3's \"llama3\" scaling)",
                         mw__json_str(doc, type));
    c->rope.scaling = llama3 ? MW_ROPE_SCALING_LLAMA3 : MW_ROPE_SCALING_NONE;
    int have = 0;
    for (const mw__json_node *f = mw__json_node_at(doc, m->first); f;
         f = mw__json_node_at(doc, f->next)) {
        const char *k = mw__json_key(doc, f);
        double v = 0;
        mw_status st = MW_OK;
        if (!strcmp(k, "rope_type") || !strcmp(k, "type")) continue;
        if (params && !strcmp(k, "rope_theta")) {
            if ((st = positive(r, f, &v)) == MW_OK) c->rope.theta = (float)v;
        } else if (llama3 && !strcmp(k, "factor")) {
            if ((st = positive(r, f, &v)) == MW_OK) c->rope.factor = (float)v, have |= 1;
        } else if (llama3 && !strcmp(k, "low_freq_factor")) {
            if ((st = positive(r, f, &v)) == MW_OK) c->rope.low_freq_factor = (float)v, have |= 2;
        } else if (llama3 && !strcmp(k, "high_freq_factor")) {
            if ((st = positive(r, f, &v)) == MW_OK) c->rope.high_freq_factor = (float)v, have |= 4;
        } else if (llama3 && !strcmp(k, "original_max_position_embeddings")) {
            int n = 0;
            if ((st = whole(r, f, &n)) == MW_OK) c->rope.original_max_positions = n, have |= 8;
        } else {
            st = hf_refuse(r, f, MW_ERR_UNSUPPORTED, "\"%.60s\" of \"%s\" is not supported", k,
                           mw__json_key(doc, m));
        }
        if (st) return st;
    }
    if (llama3 && have != 15)
        return hf_refuse(r, m, MW_ERR_FORMAT,
                         "llama3 rope scaling needs factor, low_freq_factor, high_freq_factor and "
                         "original_max_position_embeddings");
    if (llama3 && !(c->rope.high_freq_factor > c->rope.low_freq_factor))
        return hf_refuse(r, m, MW_ERR_FORMAT, "high_freq_factor must exceed low_freq_factor");
    return MW_OK;
}

static mw_status config_fields(const hf_reader *r, llama_config *c) {
    const mw__json *doc = r->doc;
    const mw__json_node *root = mw__json_node_at(doc, 0);
    if (root->type != MW__JSON_OBJECT)
        return hf_refuse(r, root, MW_ERR_FORMAT, "expected '{': config.json holds one JSON object");
    if (root->count > MAX_MEMBERS)
        return hf_refuse(r, root, MW_ERR_FORMAT, "more fields than a Llama config has");
    const mw__json_node *mt = hf_field(doc, root, "model_type");
    if (!mt) {
        snprintf(r->err, r->errsize, "%s: no \"model_type\"", r->cfg);
        return MW_ERR_FORMAT;
    }
    if (hf_is_str(doc, mt, "llama"))
        c->family = LLAMA_FAMILY_LLAMA;
    else if (hf_is_str(doc, mt, "mistral"))
        c->family = LLAMA_FAMILY_MISTRAL;
    else if (hf_is_str(doc, mt, "qwen2"))
        c->family = LLAMA_FAMILY_QWEN2;
    else
        return hf_bad_value(r, mt, "expected \"llama\", \"mistral\" or \"qwen2\"",
                            MW_ERR_UNSUPPORTED);
    c->qkv_bias = c->family == LLAMA_FAMILY_QWEN2;
    c->rope.theta = 10000.0f;
    c->rms_eps = 1e-6f; /* LlamaConfig's default */
    c->bos_id = c->eos_id = -1;
    mw_status st = MW_OK;
    const sizes_field sizes[] = {
        {"num_hidden_layers", &c->layers, 1}, {"num_attention_heads", &c->heads, 1},
        {"hidden_size", &c->channels, 1},     {"intermediate_size", &c->hidden, 1},
        {"vocab_size", &c->vocab, 1},         {"max_position_embeddings", &c->max_seq, 1}};
    for (size_t i = 0; st == MW_OK && i < sizeof sizes / sizeof *sizes; i++) {
        const mw__json_node *m = hf_field(doc, root, sizes[i].key);
        if (!m) {
            snprintf(r->err, r->errsize, "%s: no \"%s\"", r->cfg, sizes[i].key);
            st = MW_ERR_FORMAT;
        } else {
            st = whole(r, m, sizes[i].field);
        }
    }
    if (st) return st;
    c->kv_heads = c->heads;
    c->head_dim = c->channels / c->heads;
    int sliding = 0;
    for (const mw__json_node *m = mw__json_node_at(doc, root->first); st == MW_OK && m;
         m = mw__json_node_at(doc, m->next)) {
        const char *k = mw__json_key(doc, m);
        double v = 0.0;
        if (hf_member(doc, root, k, m->klen) != m) continue; /* an earlier duplicate */
        if (strlen(k) != m->klen) {
            st = hf_refuse(r, m, MW_ERR_UNSUPPORTED, "unknown field \"%s\\u0000...\"", k);
        } else if (!strcmp(k, "model_type") || !strcmp(k, "num_hidden_layers") ||
                   !strcmp(k, "num_attention_heads") || !strcmp(k, "hidden_size") ||
                   !strcmp(k, "intermediate_size") || !strcmp(k, "vocab_size") ||
                   !strcmp(k, "max_position_embeddings")) {
            continue;
        } else if (!strcmp(k, "num_key_value_heads")) {
            if (m->type != MW__JSON_NULL) st = whole(r, m, &c->kv_heads);
        } else if (!strcmp(k, "head_dim")) {
            if (m->type != MW__JSON_NULL) st = whole(r, m, &c->head_dim);
        } else if (!strcmp(k, "rms_norm_eps")) {
            if ((st = positive(r, m, &v)) == MW_OK) c->rms_eps = (float)v;
        } else if (!strcmp(k, "rope_theta")) {
            if ((st = positive(r, m, &v)) == MW_OK) c->rope.theta = (float)v;
        } else if (!strcmp(k, "rope_scaling")) {
            st = rope_object(r, m, c, 0);
        } else if (!strcmp(k, "rope_parameters")) {
            st = rope_object(r, m, c, 1);
        } else if (!strcmp(k, "tie_word_embeddings")) {
            if (m->type != MW__JSON_TRUE && m->type != MW__JSON_FALSE)
                st = hf_bad_value(r, m, "expected true or false", MW_ERR_FORMAT);
            c->tied = m->type == MW__JSON_TRUE;
        } else if (!strcmp(k, "hidden_act")) {
            if (!hf_is_str(doc, m, "silu"))
                st =
                    hf_bad_value(r, m, "this model's MLP is SwiGLU (\"silu\")", MW_ERR_UNSUPPORTED);
        } else if (!strcmp(k, "attention_bias") || !strcmp(k, "mlp_bias")) {
            if (m->type != MW__JSON_FALSE)
                st = hf_bad_value(r, m,
                                  "biases on every attention or MLP projection are not supported "
                                  "(false)",
                                  MW_ERR_UNSUPPORTED);
        } else if (!strcmp(k, "add_cross_attention") || !strcmp(k, "is_encoder_decoder")) {
            if (m->type != MW__JSON_FALSE)
                st =
                    hf_bad_value(r, m, "this model is a decoder alone (false)", MW_ERR_UNSUPPORTED);
        } else if (!strcmp(k, "attention_dropout")) {
            if (m->type == MW__JSON_NUMBER && (st = hf_number(r, m, &v))) break;
            if (m->type != MW__JSON_NUMBER || !(v >= 0.0 && v <= 1.0))
                st = hf_bad_value(r, m, "expected a probability", MW_ERR_FORMAT);
        } else if (!strcmp(k, "pretraining_tp")) {
            if (m->type != MW__JSON_NUMBER || !m->is_integer || m->ival != 1)
                st = hf_bad_value(r, m, "expected 1 (the projections computed whole)",
                                  MW_ERR_UNSUPPORTED);
        } else if (!strcmp(k, "use_sliding_window")) {
            if (m->type != MW__JSON_FALSE && m->type != MW__JSON_TRUE)
                st = hf_bad_value(r, m, "expected true or false", MW_ERR_FORMAT);
            sliding |= m->type == MW__JSON_TRUE;
        } else if (!strcmp(k, "sliding_window")) {
            /* Mistral's window applies when set; Qwen2's only with use_sliding_window */
            if (m->type != MW__JSON_NULL && c->family == LLAMA_FAMILY_MISTRAL) sliding = 1;
        } else if (!strcmp(k, "max_window_layers")) {
            continue; /* Qwen2: where a sliding window would start (refused above if used) */
        } else if (!strcmp(k, "layer_types")) {
            if (m->type != MW__JSON_ARRAY) {
                st = hf_bad_value(r, m, "expected an array", MW_ERR_FORMAT);
                break;
            }
            for (const mw__json_node *e = mw__json_node_at(doc, m->first); e && !st;
                 e = mw__json_node_at(doc, e->next))
                if (!hf_is_str(doc, e, "full_attention"))
                    st = hf_refuse(r, e, MW_ERR_UNSUPPORTED,
                                   "a layer of another kind than \"full_attention\" (a sliding "
                                   "window) is not supported");
        } else if (!strcmp(k, "bos_token_id") || !strcmp(k, "eos_token_id")) {
            const mw__json_node *e =
                m->type == MW__JSON_ARRAY ? mw__json_node_at(doc, m->first) : m;
            int *id = k[0] == 'b' ? &c->bos_id : &c->eos_id;
            if (e && e->type == MW__JSON_NUMBER && e->is_integer && e->ival >= 0 &&
                e->ival < (1 << 30))
                *id = (int)e->ival;
            else if (m->type != MW__JSON_NULL && !(m->type == MW__JSON_ARRAY && !e))
                st = hf_bad_value(r, m, "expected a token id, a list of them or null",
                                  MW_ERR_FORMAT);
        } else if (!hf_inert_field(k)) {
            st = hf_refuse(r, m, MW_ERR_UNSUPPORTED,
                           "unknown field \"%.80s%s\": not one of LlamaConfig's, MistralConfig's "
                           "or Qwen2Config's, so whether it changes the model cannot be told",
                           k, m->klen > 80 ? "..." : "");
        }
    }
    if (st == MW_OK && sliding)
        st = hf_refuse(r, root, MW_ERR_UNSUPPORTED,
                       "a sliding attention window is not supported (use_sliding_window false, "
                       "sliding_window null)");
    return st;
}

mw_status llama_hf_read_config(const char *path, llama_config *c, char *err, size_t errsize) {
    char cfg[4096];
    memset(c, 0, sizeof *c);
    if (gpt2_hf_config_path(path, cfg, sizeof cfg) != 0) {
        snprintf(err, errsize, "%s: path too long", path);
        return MW_ERR_INVALID;
    }
    char *json;
    size_t n;
    mw_status st = hf_read_text(cfg, path, &json, &n, err, errsize);
    if (st) return st;
    static const mw__json_options opt = {.max_depth = MAX_DEPTH};
    mw__json *doc;
    if ((st = mw__json_parse_with(json, n, cfg, &opt, &doc)) != MW_OK) {
        snprintf(err, errsize, "%s", mw_last_error());
        free(json);
        return st;
    }
    hf_reader r = {.doc = doc, .cfg = cfg, .err = err, .errsize = errsize};
    st = config_fields(&r, c);
    mw__json_free(doc);
    free(json);
    char why[200];
    if (st == MW_OK && llama_config_check(c, why, sizeof why) != 0) {
        snprintf(err, errsize, "%s describes no valid model: %s", cfg, why);
        st = MW_ERR_FORMAT;
    }
    return st;
}

static const char *family_name(llama_family f) {
    return f == LLAMA_FAMILY_QWEN2 ? "qwen2" : f == LLAMA_FAMILY_MISTRAL ? "mistral" : "llama";
}

static const char *architecture(llama_family f) {
    return f == LLAMA_FAMILY_QWEN2     ? "Qwen2ForCausalLM"
           : f == LLAMA_FAMILY_MISTRAL ? "MistralForCausalLM"
                                       : "LlamaForCausalLM";
}

static int config_text(const llama_config *c, char *out, size_t n) {
    char rope[400] = "null", ids[96] = "";
    if (c->rope.scaling == MW_ROPE_SCALING_LLAMA3)
        snprintf(rope, sizeof rope,
                 "{\"rope_type\": \"llama3\", \"factor\": %.9g, \"low_freq_factor\": %.9g, "
                 "\"high_freq_factor\": %.9g, \"original_max_position_embeddings\": %lld}",
                 (double)c->rope.factor, (double)c->rope.low_freq_factor,
                 (double)c->rope.high_freq_factor, (long long)c->rope.original_max_positions);
    if (c->bos_id >= 0)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "  \"bos_token_id\": %d,\n",
                 c->bos_id);
    if (c->eos_id >= 0)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "  \"eos_token_id\": %d,\n",
                 c->eos_id);
    const char *extra = c->family == LLAMA_FAMILY_QWEN2 ? "  \"use_sliding_window\": false,\n"
                        : c->family == LLAMA_FAMILY_MISTRAL
                            ? "  \"sliding_window\": null,\n"
                            : "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n";
    return snprintf(out, n,
                    "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n"
                    "  \"hidden_act\": \"silu\",\n  \"hidden_size\": %d,\n"
                    "  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n"
                    "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n"
                    "  \"head_dim\": %d,\n  \"max_position_embeddings\": %d,\n"
                    "  \"vocab_size\": %d,\n  \"rms_norm_eps\": %.9g,\n  \"rope_theta\": %.9g,\n"
                    "  \"rope_scaling\": %s,\n  \"tie_word_embeddings\": %s,\n%s%s"
                    "  \"attention_dropout\": 0.0,\n  \"torch_dtype\": \"float32\"\n}\n",
                    architecture(c->family), family_name(c->family), c->channels, c->hidden,
                    c->layers, c->heads, c->kv_heads, c->head_dim, c->max_seq, c->vocab,
                    (double)c->rms_eps, (double)c->rope.theta, rope, c->tied ? "true" : "false",
                    extra, ids);
}

/* --- weights ---------------------------------------------------------------------------------- */

/* The file's tensors of one layer (or of the model: layer -1), their shapes and ours. */
enum {
    T_EMBED,
    T_NORM,
    T_HEAD,
    T_IN_NORM,
    T_POST_NORM,
    T_Q,
    T_K,
    T_V,
    T_QB,
    T_KB,
    T_VB,
    T_O,
    T_GATE,
    T_UP,
    T_DOWN,
    T_COUNT
};

static const char *const hf_names[T_COUNT] = {"model.embed_tokens.weight",
                                              "model.norm.weight",
                                              "lm_head.weight",
                                              "input_layernorm.weight",
                                              "post_attention_layernorm.weight",
                                              "self_attn.q_proj.weight",
                                              "self_attn.k_proj.weight",
                                              "self_attn.v_proj.weight",
                                              "self_attn.q_proj.bias",
                                              "self_attn.k_proj.bias",
                                              "self_attn.v_proj.bias",
                                              "self_attn.o_proj.weight",
                                              "mlp.gate_proj.weight",
                                              "mlp.up_proj.weight",
                                              "mlp.down_proj.weight"};

static int per_layer(int t) { return t >= T_IN_NORM; }

static int used(int t, const llama_config *c) {
    if (t == T_HEAD) return !c->tied;
    if (t == T_QB || t == T_KB || t == T_VB) return c->qkv_bias;
    return 1;
}

/* Rank and shape of tensor t in the file. */
static int shape_of(int t, const llama_config *c, int64_t s[2]) {
    int64_t C = c->channels, D = c->head_dim, H = c->heads, K = c->kv_heads, F = c->hidden;
    switch (t) {
    case T_EMBED:
    case T_HEAD: return s[0] = c->vocab, s[1] = C, 2;
    case T_NORM:
    case T_IN_NORM:
    case T_POST_NORM: return s[0] = C, 1;
    case T_Q: return s[0] = H * D, s[1] = C, 2;
    case T_K:
    case T_V: return s[0] = K * D, s[1] = C, 2;
    case T_QB: return s[0] = H * D, 1;
    case T_KB:
    case T_VB: return s[0] = K * D, 1;
    case T_O: return s[0] = C, s[1] = H * D, 2;
    case T_GATE:
    case T_UP: return s[0] = F, s[1] = C, 2;
    default: return s[0] = C, s[1] = F, 2; /* T_DOWN */
    }
}

static int64_t numel_of(int t, const llama_config *c) {
    int64_t s[2];
    return shape_of(t, c, s) == 2 ? s[0] * s[1] : s[0];
}

static void hf_name(int t, int l, char *buf, size_t n) {
    if (per_layer(t))
        snprintf(buf, n, "model.layers.%d.%s", l, hf_names[t]);
    else
        snprintf(buf, n, "%s", hf_names[t]);
}

/* Whether name is a tensor the model reads, or a buffer that is no weight (inv_freq). */
static int known(const char *name, const llama_config *c) {
    char buf[160];
    for (int t = 0; t < T_COUNT; t++)
        for (int l = 0; l < (per_layer(t) ? c->layers : 1); l++) {
            hf_name(t, l, buf, sizeof buf);
            if (strcmp(buf, name) == 0) return used(t, c) || t == T_HEAD ? 1 : 0;
        }
    size_t n = strlen(name), s = strlen("rotary_emb.inv_freq");
    return n >= s && strcmp(name + n - s, "rotary_emb.inv_freq") == 0;
}

/* The fused qkv [K, G + 2, D, C] (or its bias [K, G + 2, D], cols 1) from q [H D, C], k and v
 * [K D, C]: query head h = j G + g at (j, g). */
static void fuse_qkv(const llama_config *c, const float *q, const float *k, const float *v,
                     int64_t cols, float *out) {
    int64_t G = c->heads / c->kv_heads, D = c->head_dim, row = D * cols;
    for (int64_t j = 0; j < c->kv_heads; j++) {
        float *dst = out + j * (G + 2) * row;
        for (int64_t g = 0; g < G; g++)
            memcpy(dst + g * row, q + (j * G + g) * row, (size_t)row * sizeof *dst);
        memcpy(dst + G * row, k + j * row, (size_t)row * sizeof *dst);
        memcpy(dst + (G + 1) * row, v + j * row, (size_t)row * sizeof *dst);
    }
}

static void split_qkv(const llama_config *c, const float *in, int64_t cols, float *q, float *k,
                      float *v) {
    int64_t G = c->heads / c->kv_heads, D = c->head_dim, row = D * cols;
    for (int64_t j = 0; j < c->kv_heads; j++) {
        const float *src = in + j * (G + 2) * row;
        for (int64_t g = 0; g < G; g++)
            memcpy(q + (j * G + g) * row, src + g * row, (size_t)row * sizeof *q);
        memcpy(k + j * row, src + G * row, (size_t)row * sizeof *k);
        memcpy(v + j * row, src + (G + 1) * row, (size_t)row * sizeof *v);
    }
}

/* A tied model's file may hold lm_head.weight as a copy of the embedding: accepted when equal. */
static mw_status tied_head_ok(mw_safetensors *f, const llama_config *c, const char *path, char *err,
                              size_t errsize) {
    mw_stored_tensor t;
    if (!c->tied || mw_safetensors_find(f, "lm_head.weight", &t) != MW_OK) return MW_OK;
    if (hf_tensors_equal(f, "lm_head.weight", hf_names[T_EMBED], numel_of(T_EMBED, c)))
        return MW_OK;
    snprintf(err, errsize,
             "%s: lm_head.weight differs from the token embedding, but config.json says "
             "tie_word_embeddings true",
             path);
    return MW_ERR_FORMAT;
}

mw_status llama_hf_load(mw_trainer *tr, const llama_config *c, const char *path, char *err,
                        size_t errsize) {
    mw_safetensors *f;
    mw_status st = mw_safetensors_open(path, &f);
    if (st) {
        snprintf(err, errsize, "%s", mw_last_error());
        return st;
    }
    /* pass 0: every tensor present with its shape, none unknown; pass 1: the copies */
    char name[160];
    for (int t = 0; t < T_COUNT && st == MW_OK; t++)
        for (int l = 0; l < (per_layer(t) ? c->layers : 1) && st == MW_OK; l++) {
            if (!used(t, c)) continue;
            hf_name(t, l, name, sizeof name);
            mw_stored_tensor info;
            int64_t s[2];
            int rank = shape_of(t, c, s);
            if (mw_safetensors_find(f, name, &info) != MW_OK) {
                snprintf(err, errsize, "%s has no tensor '%s' (a %s model of %d layers)", path,
                         name, family_name(c->family), c->layers);
                st = MW_ERR_NOT_FOUND;
            } else if (info.rank != rank || info.shape[0] != s[0] ||
                       (rank == 2 && info.shape[1] != s[1])) {
                snprintf(err, errsize,
                         "%s: tensor '%s' is [%lld%s%lld], the model (config.json) needs "
                         "[%lld%s%lld]",
                         path, name, (long long)info.shape[0], info.rank > 1 ? ", " : "",
                         (long long)(info.rank > 1 ? info.shape[1] : 0), (long long)s[0],
                         rank > 1 ? ", " : "", (long long)(rank > 1 ? s[1] : 0));
                st = MW_ERR_SHAPE;
            }
        }
    for (int i = 0; st == MW_OK && i < mw_safetensors_count(f); i++) {
        mw_stored_tensor t;
        if (mw_safetensors_tensor(f, i, &t) == MW_OK && !known(t.name, c)) {
            snprintf(err, errsize,
                     "%s holds '%s', which a %s model of %d layers (its config.json) does not "
                     "use",
                     path, t.name, family_name(c->family), c->layers);
            st = MW_ERR_FORMAT;
        }
    }
    if (st == MW_OK) st = tied_head_ok(f, c, path, err, errsize);
    int64_t C = c->channels, G = c->heads / c->kv_heads, D = c->head_dim;
    int64_t most = numel_of(T_EMBED, c), big = (G + 2) * c->kv_heads * D * C;
    if (2 * numel_of(T_GATE, c) > most) most = 2 * numel_of(T_GATE, c);
    if (big > most) most = big;
    float *buf = st ? NULL : malloc((size_t)most * sizeof *buf);
    float *a = st ? NULL : malloc((size_t)most * sizeof *a);
    if (!st && (!buf || !a)) {
        st = MW_ERR_NOMEM;
        snprintf(err, errsize, "out of memory loading %s", path);
    }
#define READ(t, l, dst)                                                                            \
    (hf_name((t), (l), name, sizeof name), mw_safetensors_read(f, name, (dst), numel_of((t), c)))
#define WRITE(ours, src, n)                                                                        \
    ((st = mw_trainer_write_param(tr, (ours), (src), (n))) != MW_OK                                \
         ? (snprintf(err, errsize, "parameter %s: %s", (ours), mw_last_error()), st)               \
         : MW_OK)
    if (st == MW_OK && (st = READ(T_EMBED, 0, buf)) == MW_OK)
        WRITE("embed", buf, numel_of(T_EMBED, c));
    if (st == MW_OK && (st = READ(T_NORM, 0, buf)) == MW_OK) WRITE("norm", buf, C);
    if (st == MW_OK && !c->tied && (st = READ(T_HEAD, 0, buf)) == MW_OK)
        WRITE("lm_head", buf, numel_of(T_HEAD, c));
    for (int l = 0; l < c->layers && st == MW_OK; l++) {
        char ours[64];
        int64_t nq = numel_of(T_Q, c), nk = numel_of(T_K, c);
        snprintf(ours, sizeof ours, "l%d.attn_norm", l);
        if ((st = READ(T_IN_NORM, l, buf)) == MW_OK) WRITE(ours, buf, C);
        snprintf(ours, sizeof ours, "l%d.mlp_norm", l);
        if (st == MW_OK && (st = READ(T_POST_NORM, l, buf)) == MW_OK) WRITE(ours, buf, C);
        /* q, k, v into a, fused into buf */
        if (st == MW_OK && (st = READ(T_Q, l, a)) == MW_OK &&
            (st = READ(T_K, l, a + nq)) == MW_OK && (st = READ(T_V, l, a + nq + nk)) == MW_OK) {
            fuse_qkv(c, a, a + nq, a + nq + nk, C, buf);
            snprintf(ours, sizeof ours, "l%d.qkv", l);
            WRITE(ours, buf, nq + 2 * nk);
        }
        if (st == MW_OK && c->qkv_bias && (st = READ(T_QB, l, a)) == MW_OK &&
            (st = READ(T_KB, l, a + nq / C)) == MW_OK &&
            (st = READ(T_VB, l, a + nq / C + nk / C)) == MW_OK) {
            fuse_qkv(c, a, a + nq / C, a + nq / C + nk / C, 1, buf);
            snprintf(ours, sizeof ours, "l%d.qkv_bias", l);
            WRITE(ours, buf, (nq + 2 * nk) / C);
        }
        snprintf(ours, sizeof ours, "l%d.o", l);
        if (st == MW_OK && (st = READ(T_O, l, buf)) == MW_OK) WRITE(ours, buf, numel_of(T_O, c));
        int64_t nf = numel_of(T_GATE, c);
        if (st == MW_OK && (st = READ(T_GATE, l, buf)) == MW_OK &&
            (st = READ(T_UP, l, buf + nf)) == MW_OK) {
            snprintf(ours, sizeof ours, "l%d.gate_up", l);
            WRITE(ours, buf, 2 * nf);
        }
        snprintf(ours, sizeof ours, "l%d.down", l);
        if (st == MW_OK && (st = READ(T_DOWN, l, buf)) == MW_OK) WRITE(ours, buf, nf);
    }
    if (st && !err[0]) snprintf(err, errsize, "%s", mw_last_error());
#undef READ
#undef WRITE
    free(buf);
    free(a);
    mw_safetensors_close(f);
    return st;
}

mw_status llama_hf_check_save(const char *path, const llama_config *c, char *err, size_t errsize) {
    char cfg[4096];
    if (gpt2_hf_config_path(path, cfg, sizeof cfg) != 0) {
        snprintf(err, errsize, "%s: path too long", path);
        return MW_ERR_INVALID;
    }
    /* An existing config.json is replaced only when it describes this model. */
    struct stat sb;
    if (stat(cfg, &sb) != 0) return MW_OK;
    llama_config there;
    char why[512];
    if (llama_hf_read_config(path, &there, why, sizeof why) != MW_OK ||
        !llama_config_equal(&there, c)) {
        snprintf(err, errsize,
                 "cannot save %s: %s exists and describes another model or none this program "
                 "reads; save into a folder of its own",
                 path, cfg);
        return MW_ERR_IO;
    }
    return MW_OK;
}

mw_status llama_hf_save(mw_trainer *tr, const llama_config *c, const char *path, char *err,
                        size_t errsize) {
    int n = 2 + !c->tied + c->layers * (c->qkv_bias ? 12 : 9);
    mw_safetensors_entry *e = calloc((size_t)n, sizeof *e);
    char(*names)[160] = calloc((size_t)n, sizeof *names);
    float **data = calloc((size_t)n, sizeof *data);
    mw_status st = e && names && data ? MW_OK : MW_ERR_NOMEM;
    if (st) snprintf(err, errsize, "out of memory saving %s", path);
    int k = 0;
    /* one tensor: ours read whole into a new buffer */
    float *whole_buf = NULL;
#define TAKE(ours, count)                                                                          \
    (whole_buf = malloc((size_t)(count) * sizeof(float)),                                          \
     !whole_buf ? (st = MW_ERR_NOMEM, snprintf(err, errsize, "out of memory saving %s", path), st) \
     : (st = mw_trainer_read_param(tr, (ours), whole_buf, (count))) != MW_OK                       \
         ? (snprintf(err, errsize, "parameter %s: %s", (ours), mw_last_error()), free(whole_buf),  \
            whole_buf = NULL, st)                                                                  \
         : MW_OK)
#define ADD(t, l, ptr)                                                                             \
    do {                                                                                           \
        hf_name((t), (l), names[k], sizeof names[k]);                                              \
        e[k].name = names[k];                                                                      \
        e[k].rank = shape_of((t), c, e[k].shape);                                                  \
        e[k].data = (ptr);                                                                         \
        k++;                                                                                       \
    } while (0)
    int64_t C = c->channels, nq = numel_of(T_Q, c), nk = numel_of(T_K, c), nf = numel_of(T_GATE, c);
    if (st == MW_OK && TAKE("embed", numel_of(T_EMBED, c)) == MW_OK) {
        data[k] = whole_buf;
        ADD(T_EMBED, 0, whole_buf);
    }
    for (int l = 0; l < c->layers && st == MW_OK; l++) {
        char ours[64];
        snprintf(ours, sizeof ours, "l%d.attn_norm", l);
        if (TAKE(ours, C) != MW_OK) break;
        data[k] = whole_buf;
        ADD(T_IN_NORM, l, whole_buf);
        snprintf(ours, sizeof ours, "l%d.qkv", l);
        if (TAKE(ours, nq + 2 * nk) != MW_OK) break;
        float *q = malloc((size_t)(nq + 2 * nk) * sizeof *q);
        if (!q) {
            free(whole_buf);
            st = MW_ERR_NOMEM;
            snprintf(err, errsize, "out of memory saving %s", path);
            break;
        }
        split_qkv(c, whole_buf, C, q, q + nq, q + nq + nk);
        free(whole_buf);
        data[k] = q;
        ADD(T_Q, l, q);
        ADD(T_K, l, q + nq);
        ADD(T_V, l, q + nq + nk);
        if (c->qkv_bias) {
            snprintf(ours, sizeof ours, "l%d.qkv_bias", l);
            if (TAKE(ours, (nq + 2 * nk) / C) != MW_OK) break;
            float *b = malloc((size_t)((nq + 2 * nk) / C) * sizeof *b);
            if (!b) {
                free(whole_buf);
                st = MW_ERR_NOMEM;
                break;
            }
            split_qkv(c, whole_buf, 1, b, b + nq / C, b + nq / C + nk / C);
            free(whole_buf);
            data[k] = b;
            ADD(T_QB, l, b);
            ADD(T_KB, l, b + nq / C);
            ADD(T_VB, l, b + nq / C + nk / C);
        }
        snprintf(ours, sizeof ours, "l%d.o", l);
        if (TAKE(ours, numel_of(T_O, c)) != MW_OK) break;
        data[k] = whole_buf;
        ADD(T_O, l, whole_buf);
        snprintf(ours, sizeof ours, "l%d.mlp_norm", l);
        if (TAKE(ours, C) != MW_OK) break;
        data[k] = whole_buf;
        ADD(T_POST_NORM, l, whole_buf);
        snprintf(ours, sizeof ours, "l%d.gate_up", l);
        if (TAKE(ours, 2 * nf) != MW_OK) break;
        data[k] = whole_buf;
        ADD(T_GATE, l, whole_buf);
        ADD(T_UP, l, whole_buf + nf);
        snprintf(ours, sizeof ours, "l%d.down", l);
        if (TAKE(ours, nf) != MW_OK) break;
        data[k] = whole_buf;
        ADD(T_DOWN, l, whole_buf);
    }
    if (st == MW_OK && TAKE("norm", C) == MW_OK) {
        data[k] = whole_buf;
        ADD(T_NORM, 0, whole_buf);
    }
    if (st == MW_OK && !c->tied && TAKE("lm_head", numel_of(T_HEAD, c)) == MW_OK) {
        data[k] = whole_buf;
        ADD(T_HEAD, 0, whole_buf);
    }
#undef TAKE
#undef ADD
    char cfg[4096], text[4096];
    mw_output *out = NULL;
    if (st == MW_OK && !path) goto done; /* another process's part of a gathering save */
    if (st == MW_OK && gpt2_hf_config_path(path, cfg, sizeof cfg) != 0) {
        snprintf(err, errsize, "%s: path too long", path);
        st = MW_ERR_INVALID;
    }
    if (st == MW_OK) st = llama_hf_check_save(path, c, err, errsize);
    int len = st == MW_OK ? config_text(c, text, sizeof text) : 0;
    if (st == MW_OK && (len <= 0 || (size_t)len >= sizeof text)) {
        snprintf(err, errsize, "cannot write %s: the configuration does not fit", cfg);
        st = MW_ERR_INVALID;
    }
    if (st == MW_OK && ((st = mw_output_open(cfg, "config.json", 0, &out)) != MW_OK ||
                        (st = mw_output_write(out, text, (size_t)len)) != MW_OK ||
                        (st = mw_output_sync(out)) != MW_OK)) {
        snprintf(err, errsize, "%s", mw_last_error());
        if (out) mw_output_abandon(out);
        out = NULL;
    }
    /* config.json on the disk first, the weights written and renamed, then config.json's rename */
    if (st == MW_OK && (st = mw_safetensors_write(path, e, k)) != MW_OK) {
        snprintf(err, errsize, "%s", mw_last_error());
        mw_output_abandon(out);
    } else if (st == MW_OK && (st = mw_output_commit(out)) != MW_OK) {
        snprintf(err, errsize, "wrote %s, but not its config.json: %s", path, mw_last_error());
    }
done:
    for (int i = 0; data && i < n; i++) free(data[i]);
    free(data);
    free(names);
    free(e);
    return st;
}
