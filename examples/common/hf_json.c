/* hf_json.h: strict reading of Hugging Face config.json files. */
#include "hf_json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const mw__json_node *hf_member(const mw__json *doc, const mw__json_node *obj, const char *key,
                               size_t n) {
    const mw__json_node *last = NULL;
    for (const mw__json_node *m = mw__json_node_at(doc, obj->first); m;
         m = mw__json_node_at(doc, m->next))
        if (m->klen == n && memcmp(mw__json_key(doc, m), key, n) == 0) last = m;
    return last;
}

const mw__json_node *hf_field(const mw__json *doc, const mw__json_node *obj, const char *key) {
    return hf_member(doc, obj, key, strlen(key));
}

int hf_is_str(const mw__json *doc, const mw__json_node *m, const char *s) {
    return m->type == MW__JSON_STRING && m->len == strlen(s) &&
           memcmp(mw__json_str(doc, m), s, m->len) == 0;
}

mw_status hf_refuse(const hf_reader *r, const mw__json_node *m, mw_status st, const char *fmt,
                    ...) {
    char where[48];
    mw__json_where(r->doc, m->offset, where, sizeof where);
    int k = snprintf(r->err, r->errsize, "%s:%s: ", r->cfg, where);
    if (k >= 0 && (size_t)k < r->errsize) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->err + k, r->errsize - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return st;
}

mw_status hf_bad_value(const hf_reader *r, const mw__json_node *m, const char *want, mw_status st) {
    const char *s = m->type == MW__JSON_STRING ? mw__json_str(r->doc, m) : NULL;
    return hf_refuse(r, m, st, "\"%s\" is %.63s%s; %s", mw__json_key(r->doc, m),
                     s ? s : mw__json_type_name(m->type),
                     s && strlen(s) != m->len ? "\\u0000..." : "", want);
}

mw_status hf_number(const hf_reader *r, const mw__json_node *m, double *v) {
    mw_status st = mw__json_double(r->doc, m, v);
    if (st) snprintf(r->err, r->errsize, "%s", mw_last_error());
    return st;
}

static const char *const inert_fields[] = {"architectures",
                                           "transformers_version",
                                           "torch_dtype",
                                           "dtype",
                                           "_name_or_path",
                                           "initializer_range",
                                           "pad_token_id",
                                           "sep_token_id",
                                           "decoder_start_token_id",
                                           "use_cache",
                                           "task_specific_params",
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
                                           "gradient_checkpointing",
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
                                           "_attn_implementation",
                                           "attn_implementation"};

int hf_inert_field(const char *key) {
    return hf_in_list(key, inert_fields, sizeof inert_fields / sizeof *inert_fields);
}

int hf_in_list(const char *key, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(key, list[i]) == 0) return 1;
    return 0;
}

int hf_tensors_equal(const mw_safetensors *f, const char *a, const char *b, int64_t count) {
    mw_stored_tensor ta, tb;
    if (mw_safetensors_find(f, a, &ta) != MW_OK || mw_safetensors_find(f, b, &tb) != MW_OK ||
        ta.count != count || tb.count != count)
        return 0;
    float *x = malloc((size_t)count * sizeof *x), *y = malloc((size_t)count * sizeof *y);
    int same = x && y && mw_safetensors_read(f, a, x, count) == MW_OK &&
               mw_safetensors_read(f, b, y, count) == MW_OK &&
               memcmp(x, y, (size_t)count * sizeof *x) == 0;
    free(x);
    free(y);
    return same;
}

mw_status hf_read_text(const char *cfg, const char *path, char **text, size_t *len, char *err,
                       size_t errsize) {
    char why[512];
    int64_t size = 0;
    FILE *f;
    *text = NULL;
    if (mw_input_open(cfg, NULL, 0, &f, &size) != MW_OK) {
        snprintf(why, sizeof why, "%s", mw_last_error());
        snprintf(err, errsize, "%s (the model's config.json beside %s)", why, path);
        return MW_ERR_IO;
    }
    if (size > 65536) {
        fclose(f);
        snprintf(err, errsize, "%s: larger than 64 KiB, not a model's config.json", cfg);
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
    *text = json;
    *len = n;
    return MW_OK;
}
