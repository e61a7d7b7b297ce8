/* Hugging Face GPT-2 weights: the safetensors layout GPT2LMHeadModel.save_pretrained writes
 * ("transformer.h.0.attn.c_attn.weight", ...; GPT2Model's own files have no "transformer."
 * prefix) and the config.json beside it.
 *
 * The differences from a meshwit GPT-2: HF's Conv1D layers store their weight [In, Out] where
 * ours is [Out, In] (as nn.Linear and llm.c), so every linear weight is transposed on the way in
 * and out; wte has the real vocabulary's rows only (ours may have padding rows, zero when
 * loaded); the output head is tied to wte, so the file has no lm_head.weight. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
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

/* The config.json beside path (path's folder, with its trailing '/', then "config.json") into
 * cfg; -1 when the path is too long. */
int gpt2_hf_config_path(const char *path, char *cfg, size_t n) {
    const char *slash = strrchr(path, '/');
    int len = slash ? (int)(slash - path) + 1 : 0;
    int k = snprintf(cfg, n, "%.*sconfig.json", len, path);
    return k < 0 || (size_t)k >= n ? -1 : 0;
}

/* A strict reader of the one JSON object config.json holds: each member's key and value (nested
 * objects and arrays are checked and kept as their kind and member count only). A key that comes
 * twice takes its last value, as Python's json does. */
typedef enum jkind { J_NULL, J_BOOL, J_NUMBER, J_STRING, J_ARRAY, J_OBJECT } jkind;

typedef struct jmember {
    char key[64];
    int key_long; /* the key did not fit: no known field has such a key */
    jkind kind;
    int boolean;
    double number;
    int integer;   /* a number written without fraction or exponent */
    char str[64];  /* a string value (ASCII; longer ones are cut and never match a known value) */
    int members;   /* an object's or array's member count */
    int line, col; /* where the value starts */
} jmember;

#define MAX_MEMBERS 128
#define MAX_DEPTH 16

typedef struct jreader {
    const char *s, *file;
    size_t n, pos;
    jmember m[MAX_MEMBERS];
    int nm;
    char *err;
    size_t errsize;
} jreader;

static void where(const jreader *r, size_t pos, int *line, int *col) {
    *line = 1, *col = 1;
    for (size_t i = 0; i < pos && i < r->n; i++) {
        if (r->s[i] == '\n')
            ++*line, *col = 1;
        else
            ++*col;
    }
}

static mw_status jfail(jreader *r, const char *what) {
    int line, col;
    where(r, r->pos, &line, &col);
    snprintf(r->err, r->errsize, "%s:%d:%d: %s", r->file, line, col, what);
    return MW_ERR_FORMAT;
}

static void jspace(jreader *r) {
    while (r->pos < r->n && (r->s[r->pos] == ' ' || r->s[r->pos] == '\t' || r->s[r->pos] == '\n' ||
                             r->s[r->pos] == '\r'))
        r->pos++;
}

static int jpeek(jreader *r) {
    jspace(r);
    return r->pos < r->n ? (unsigned char)r->s[r->pos] : -1;
}

/* A string into out (at most n - 1 bytes kept; *cut set when more came; \u escapes of non-ASCII
 * characters kept as '?'). */
static mw_status jstring(jreader *r, char *out, size_t n, int *cut) {
    if (jpeek(r) != '"') return jfail(r, "expected a string");
    r->pos++;
    size_t k = 0;
    *cut = 0;
    for (;;) {
        if (r->pos >= r->n) return jfail(r, "unterminated string");
        unsigned char c = (unsigned char)r->s[r->pos++];
        if (c == '"') break;
        if (c < 0x20) return jfail(r, "a control character in a string");
        if (c == '\\') {
            if (r->pos >= r->n) return jfail(r, "unterminated string");
            char e = r->s[r->pos++];
            const char *esc = strchr("\"\\/bfnrtu", e);
            if (!e || !esc) return jfail(r, "a bad escape in a string");
            if (e == 'u') {
                unsigned v = 0;
                for (int i = 0; i < 4; i++, r->pos++) {
                    char h = r->pos < r->n ? r->s[r->pos] : '\0';
                    int d = h >= '0' && h <= '9'   ? h - '0'
                            : h >= 'a' && h <= 'f' ? h - 'a' + 10
                            : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                                   : -1;
                    if (d < 0) return jfail(r, "a bad \\u escape in a string");
                    v = v * 16 + (unsigned)d;
                }
                c = v < 0x80 ? (unsigned char)v : '?';
            } else {
                static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
                c = (unsigned char)to[strchr(from, e) - from];
            }
        }
        if (k + 1 < n)
            out[k++] = (char)c;
        else
            *cut = 1;
    }
    out[k] = '\0';
    return MW_OK;
}

static mw_status jnumber(jreader *r, jmember *m) {
    size_t start = r->pos;
    const char *s = r->s;
    if (r->pos < r->n && s[r->pos] == '-') r->pos++;
    if (r->pos >= r->n || s[r->pos] < '0' || s[r->pos] > '9') return jfail(r, "a bad number");
    if (s[r->pos] == '0' && r->pos + 1 < r->n && s[r->pos + 1] >= '0' && s[r->pos + 1] <= '9')
        return jfail(r, "a number with a leading zero");
    while (r->pos < r->n && s[r->pos] >= '0' && s[r->pos] <= '9') r->pos++;
    m->integer = 1;
    if (r->pos < r->n && s[r->pos] == '.') {
        m->integer = 0;
        if (++r->pos >= r->n || s[r->pos] < '0' || s[r->pos] > '9')
            return jfail(r, "a number without digits after its '.'");
        while (r->pos < r->n && s[r->pos] >= '0' && s[r->pos] <= '9') r->pos++;
    }
    if (r->pos < r->n && (s[r->pos] == 'e' || s[r->pos] == 'E')) {
        m->integer = 0;
        r->pos++;
        if (r->pos < r->n && (s[r->pos] == '+' || s[r->pos] == '-')) r->pos++;
        if (r->pos >= r->n || s[r->pos] < '0' || s[r->pos] > '9')
            return jfail(r, "a number without digits in its exponent");
        while (r->pos < r->n && s[r->pos] >= '0' && s[r->pos] <= '9') r->pos++;
    }
    char text[64];
    size_t len = r->pos - start;
    if (len >= sizeof text) return jfail(r, "a number too long to be a config value");
    memcpy(text, s + start, len);
    text[len] = '\0';
    m->number = strtod(text, NULL);
    m->kind = J_NUMBER;
    return MW_OK;
}

static int jword(jreader *r, const char *w) {
    size_t n = strlen(w);
    if (r->pos + n > r->n || strncmp(r->s + r->pos, w, n) != 0) return 0;
    r->pos += n;
    return 1;
}

/* A value into m (m NULL: a nested value, checked and dropped). */
static mw_status jvalue(jreader *r, jmember *m, int depth) {
    jmember scratch;
    if (!m) m = &scratch;
    memset(&m->kind, 0, sizeof *m - offsetof(jmember, kind));
    int c = jpeek(r);
    where(r, r->pos, &m->line, &m->col);
    if (depth > MAX_DEPTH) return jfail(r, "values nested too deeply");
    if (c == '"') {
        int cut;
        mw_status st = jstring(r, m->str, sizeof m->str, &cut);
        if (cut) m->str[0] = '\x01'; /* never equal to a known value */
        m->kind = J_STRING;
        return st;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return jnumber(r, m);
    if (jword(r, "true") || jword(r, "false")) {
        m->kind = J_BOOL;
        m->boolean = r->s[r->pos - 1] == 'e' && r->s[r->pos - 2] == 'u';
        return MW_OK;
    }
    if (jword(r, "null")) {
        m->kind = J_NULL;
        return MW_OK;
    }
    if (c == '[' || c == '{') {
        int object = c == '{';
        char close = object ? '}' : ']';
        m->kind = object ? J_OBJECT : J_ARRAY;
        r->pos++;
        if (jpeek(r) == close) {
            r->pos++;
            return MW_OK;
        }
        for (;;) {
            mw_status st;
            if (object) {
                char key[8];
                int cut;
                if ((st = jstring(r, key, sizeof key, &cut))) return st;
                if (jpeek(r) != ':') return jfail(r, "expected ':' after a key");
                r->pos++;
            }
            if ((st = jvalue(r, NULL, depth + 1))) return st;
            m->members++;
            int d = jpeek(r);
            if (d == ',') {
                r->pos++;
                continue;
            }
            if (d == close) {
                r->pos++;
                return MW_OK;
            }
            return jfail(r, object ? "expected ',' or '}'" : "expected ',' or ']'");
        }
    }
    return jfail(r, c < 0 ? "the file ends where a value should be" : "expected a value");
}

static mw_status jread(jreader *r) {
    if (jpeek(r) != '{') return jfail(r, "expected '{': config.json holds one JSON object");
    r->pos++;
    if (jpeek(r) == '}') {
        r->pos++;
    } else {
        for (;;) {
            if (r->nm == MAX_MEMBERS) return jfail(r, "more fields than a GPT-2 config has");
            jmember *m = &r->m[r->nm++];
            mw_status st = jstring(r, m->key, sizeof m->key, &m->key_long);
            if (st) return st;
            if (jpeek(r) != ':') return jfail(r, "expected ':' after a key");
            r->pos++;
            if ((st = jvalue(r, m, 1))) return st;
            int d = jpeek(r);
            if (d == ',') {
                r->pos++;
                continue;
            }
            if (d == '}') {
                r->pos++;
                break;
            }
            return jfail(r, "expected ',' or '}'");
        }
    }
    if (jpeek(r) >= 0) return jfail(r, "text after the object's closing '}'");
    return MW_OK;
}

/* The member of key, its last occurrence; NULL when absent. */
static const jmember *jfind(const jreader *r, const char *key) {
    for (int i = r->nm - 1; i >= 0; i--)
        if (!r->m[i].key_long && strcmp(r->m[i].key, key) == 0) return &r->m[i];
    return NULL;
}

static const char *const kind_names[] = {"null",     "a boolean", "a number",
                                         "a string", "an array",  "an object"};

static mw_status bad_value(const jreader *r, const jmember *m, const char *want, mw_status st) {
    snprintf(r->err, r->errsize, "%s:%d:%d: \"%s\" is %s; %s", r->file, m->line, m->col, m->key,
             m->kind == J_STRING ? m->str : kind_names[m->kind], want);
    return st;
}

/* Fields of GPT2Config (and of every transformers config) that do not change what the language
 * model computes from its weights: metadata, generation settings, initialisation, the heads of
 * other model classes. */
static const char *const inert_fields[] = {"architectures",
                                           "model_type",
                                           "transformers_version",
                                           "torch_dtype",
                                           "dtype",
                                           "_name_or_path",
                                           "initializer_range",
                                           "bos_token_id",
                                           "eos_token_id",
                                           "pad_token_id",
                                           "sep_token_id",
                                           "decoder_start_token_id",
                                           "use_cache",
                                           "task_specific_params",
                                           "summary_type",
                                           "summary_use_proj",
                                           "summary_activation",
                                           "summary_proj_to_labels",
                                           "summary_first_dropout",
                                           "id2label",
                                           "label2id",
                                           "num_labels",
                                           "problem_type",
                                           "finetuning_task",
                                           "tokenizer_class",
                                           "prefix",
                                           "return_dict",
                                           "output_hidden_states",
                                           "output_attentions",
                                           "torchscript",
                                           "use_bfloat16",
                                           "tf_legacy_loss",
                                           "gradient_checkpointing",
                                           "n_special",
                                           "predict_special_tokens",
                                           "output_past",
                                           "chunk_size_feed_forward",
                                           "is_decoder",
                                           "tie_encoder_decoder",
                                           "max_length",
                                           "min_length",
                                           "do_sample",
                                           "early_stopping",
                                           "num_beams",
                                           "num_beam_groups",
                                           "diversity_penalty",
                                           "temperature",
                                           "top_k",
                                           "top_p",
                                           "typical_p",
                                           "repetition_penalty",
                                           "length_penalty",
                                           "no_repeat_ngram_size",
                                           "encoder_no_repeat_ngram_size",
                                           "bad_words_ids",
                                           "num_return_sequences",
                                           "output_scores",
                                           "return_dict_in_generate",
                                           "forced_bos_token_id",
                                           "forced_eos_token_id",
                                           "remove_invalid_values",
                                           "exponential_decay_length_penalty",
                                           "suppress_tokens",
                                           "begin_suppress_tokens",
                                           "cross_attention_hidden_size",
                                           "reorder_and_upcast_attn",
                                           "_attn_implementation",
                                           "attn_implementation"};

/* The dropout probabilities: read (they only act in training mode), not applied. */
static const char *const dropout_fields[] = {"resid_pdrop", "embd_pdrop", "attn_pdrop"};

static int in_list(const char *key, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(key, list[i]) == 0) return 1;
    return 0;
}

static mw_status config_from_json(const char *cfg, const char *json, size_t n, gpt2_config *c,
                                  char *note, size_t notesize, char *err, size_t errsize) {
    jreader *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, errsize, "out of memory reading %s", cfg);
        return MW_ERR_NOMEM;
    }
    *r = (jreader){.s = json, .n = n, .file = cfg, .err = err, .errsize = errsize};
    mw_status st = jread(r);
    memset(c, 0, sizeof *c);
    if (note && notesize) note[0] = '\0';
    const struct {
        const char *key;
        int *field;
    } sizes[] = {{"n_layer", &c->layers},
                 {"n_head", &c->heads},
                 {"n_embd", &c->channels},
                 {"n_positions", &c->max_seq},
                 {"vocab_size", &c->vocab}};
    for (size_t i = 0; st == MW_OK && i < sizeof sizes / sizeof *sizes; i++) {
        const jmember *m = jfind(r, sizes[i].key);
        if (!m && strcmp(sizes[i].key, "n_positions") == 0) m = jfind(r, "n_ctx");
        if (!m) {
            snprintf(err, errsize, "%s: no \"%s\"", cfg, sizes[i].key);
            st = MW_ERR_FORMAT;
        } else if (m->kind != J_NUMBER || !m->integer || m->number < 1 ||
                   m->number > (double)(1 << 30)) {
            st = bad_value(r, m, "expected a whole number from 1 to 2^30", MW_ERR_FORMAT);
        } else {
            *sizes[i].field = (int)m->number;
        }
    }
    c->padded_vocab = c->vocab;
    for (int i = 0; st == MW_OK && i < r->nm; i++) {
        const jmember *m = &r->m[i];
        const char *k = m->key;
        if (m->key_long) {
            snprintf(err, errsize, "%s:%d:%d: an unknown field with a %zu+ byte name", cfg, m->line,
                     m->col, sizeof m->key - 1);
            st = MW_ERR_UNSUPPORTED;
        } else if (jfind(r, k) != m) {
            continue; /* an earlier duplicate: the last one counts */
        } else if (!strcmp(k, "n_layer") || !strcmp(k, "n_head") || !strcmp(k, "n_embd") ||
                   !strcmp(k, "n_positions") || !strcmp(k, "vocab_size")) {
            continue;
        } else if (!strcmp(k, "n_ctx")) {
            if (m->kind != J_NUMBER || !m->integer || m->number != (double)c->max_seq)
                st = bad_value(r, m, "expected n_positions' value (the context length)",
                               MW_ERR_UNSUPPORTED);
        } else if (!strcmp(k, "n_inner")) {
            if (m->kind != J_NULL &&
                (m->kind != J_NUMBER || m->number != 4.0 * (double)c->channels))
                st = bad_value(r, m, "this GPT-2's MLP is 4 x n_embd wide (null)",
                               MW_ERR_UNSUPPORTED);
        } else if (!strcmp(k, "activation_function")) {
            if (m->kind == J_STRING &&
                (!strcmp(m->str, "gelu_new") || !strcmp(m->str, "gelu_pytorch_tanh") ||
                 !strcmp(m->str, "gelu_fast")))
                c->gelu_exact = 0;
            else if (m->kind == J_STRING &&
                     (!strcmp(m->str, "gelu") || !strcmp(m->str, "gelu_python")))
                c->gelu_exact = 1;
            else
                st = bad_value(r, m,
                               "this GPT-2 computes GELU, tanh (\"gelu_new\") or exact (\"gelu\")",
                               MW_ERR_UNSUPPORTED);
        } else if (!strcmp(k, "layer_norm_epsilon")) {
            if (m->kind != J_NUMBER || !(m->number > 0.0 && m->number < 1.0))
                st = bad_value(r, m, "expected a number in (0, 1)", MW_ERR_FORMAT);
            else
                c->ln_eps = (float)m->number;
        } else if (!strcmp(k, "scale_attn_weights") ||
                   !strcmp(k, "scale_attn_by_inverse_layer_idx")) {
            if (m->kind != J_BOOL)
                st = bad_value(r, m, "expected true or false", MW_ERR_FORMAT);
            else if (k[11] == 'w')
                c->attn_unscaled = !m->boolean;
            else
                c->attn_layer_scaled = m->boolean;
        } else if (!strcmp(k, "tie_word_embeddings")) {
            if (m->kind != J_BOOL || !m->boolean)
                st = bad_value(r, m, "this GPT-2's output head is the token embedding (true)",
                               MW_ERR_UNSUPPORTED);
        } else if (!strcmp(k, "add_cross_attention") || !strcmp(k, "is_encoder_decoder")) {
            if (m->kind != J_BOOL || m->boolean)
                st = bad_value(r, m, "this GPT-2 is a decoder alone (false)", MW_ERR_UNSUPPORTED);
        } else if (!strcmp(k, "pruned_heads")) {
            if (m->kind != J_OBJECT || m->members)
                st = bad_value(r, m, "this GPT-2 has every head ({})", MW_ERR_UNSUPPORTED);
        } else if (in_list(k, dropout_fields, sizeof dropout_fields / sizeof *dropout_fields)) {
            if (m->kind != J_NUMBER || !(m->number >= 0.0 && m->number <= 1.0))
                st = bad_value(r, m, "expected a probability", MW_ERR_FORMAT);
            else if (m->number > 0.0 && note && strlen(note) + 48 < notesize)
                snprintf(note + strlen(note), notesize - strlen(note), "%s%s %g",
                         note[0] ? ", " : "", k, m->number);
        } else if (!strcmp(k, "model_type")) {
            if (m->kind != J_STRING || strcmp(m->str, "gpt2") != 0)
                st = bad_value(r, m, "expected \"gpt2\"", MW_ERR_UNSUPPORTED);
        } else if (!in_list(k, inert_fields, sizeof inert_fields / sizeof *inert_fields)) {
            snprintf(err, errsize,
                     "%s:%d:%d: unknown field \"%s\": not one of GPT2Config's, so whether it "
                     "changes the model cannot be told",
                     cfg, m->line, m->col, k);
            st = MW_ERR_UNSUPPORTED;
        }
    }
    if (st == MW_OK && note && note[0] && strlen(note) + 80 < notesize)
        snprintf(note + strlen(note), notesize - strlen(note),
                 ": dropout is not applied (evaluation equals transformers' eval mode)");
    free(r);
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
    char why[512];
    int64_t size = 0;
    FILE *f;
    if (mw_input_open(cfg, NULL, 0, &f, &size) != MW_OK) {
        snprintf(why, sizeof why, "%s", mw_last_error());
        snprintf(err, errsize, "%s (the model's config.json beside %s)", why, path);
        return MW_ERR_IO;
    }
    if (size > 65536) {
        fclose(f);
        snprintf(err, errsize, "%s: larger than 64 KiB, not a GPT-2 config.json", cfg);
        return MW_ERR_FORMAT;
    }
    char *json = malloc((size_t)size + 1);
    size_t n = json ? fread(json, 1, (size_t)size, f) : 0;
    int bad = ferror(f);
    fclose(f);
    if (!json || bad || n != (size_t)size) {
        snprintf(err, errsize, json ? "cannot read %s" : "out of memory reading %s", cfg);
        free(json);
        return json ? MW_ERR_IO : MW_ERR_NOMEM;
    }
    json[n] = '\0';
    if (memchr(json, '\0', n)) {
        free(json);
        snprintf(err, errsize, "%s: a NUL byte: not a JSON text", cfg);
        return MW_ERR_FORMAT;
    }
    mw_status st = config_from_json(cfg, json, n, c, note, notesize, err, errsize);
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
static mw_status write_config(const char *cfg, const gpt2_config *c, mw_output **out, char *err,
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
            mw_stored_tensor w;
            int same = mw_safetensors_find(f, wte, &w) == MW_OK && w.count == t.count;
            float *a = same ? malloc((size_t)t.count * sizeof *a) : NULL;
            float *b = same ? malloc((size_t)t.count * sizeof *b) : NULL;
            same = a && b && mw_safetensors_read(f, t.name, a, t.count) == MW_OK &&
                   mw_safetensors_read(f, wte, b, t.count) == MW_OK &&
                   memcmp(a, b, (size_t)t.count * sizeof *a) == 0;
            free(a);
            free(b);
            if (same) continue;
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
    if (st == MW_OK && (st = write_config(cfg, c, &cfg_out, err, errsize)) == MW_OK) {
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
