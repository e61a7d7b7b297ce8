/* Reading a tokenizer: Hugging Face's tokenizer.json, or GPT-2's vocab.json + merges.txt, into a
 * mw_tokenizer (tokenizer_model.c builds the rest). Everything the file says is checked before it
 * is used; every refusal names the file, the line and column (or the merges.txt line) and the
 * JSON path of what was refused. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/file.h"
#include "formats/json.h"
#include "text/tokenizer_nfc.h"
#include "text/tokenizer_read.h"
#include "text/unicode.h"

#define MAX_FILE ((size_t)UINT32_MAX - 1)
#define SPECIAL_EOT "<|endoftext|>" /* GPT-2's one special token */

/* --- reading files ---------------------------------------------------------------------------- */

/* The whole file: opened without blocking and refused unless it is a regular file (a FIFO
 * given as a tokenizer, or as a file of its folder, would wait for a writer forever). */
static mw_status read_file(mw__loader *ld, const char *path, char **data, size_t *size) {
    mw_status st = mw__file_read_all(path, "tokenizer file", MAX_FILE, data, size);
    if (st) return st;
    mw_tokenizer *tok = ld->tok;
    if (tok->nfiles < (int)(sizeof tok->file_off / sizeof *tok->file_off) &&
        (st = mw__tok_store(tok, path, strlen(path) + 1, &tok->file_off[tok->nfiles])) == MW_OK)
        tok->nfiles++;
    if (st) {
        mw__free(*data);
        *data = NULL;
    }
    return st;
}

/* A member that must be absent or null because nothing here implements it. */
static mw_status must_be_null(mw__loader *ld, const mw__json_node *root, const char *key,
                              const char *why) {
    const mw__json_node *v = mw__json_get(ld->doc, root, key);
    if (!v || v->type == MW__JSON_NULL) return MW_OK;
    const mw__json_node *t = v->type == MW__JSON_OBJECT ? mw__json_get(ld->doc, v, "type") : NULL;
    char q[64] = "";
    if (t && t->type == MW__JSON_STRING)
        mw__tok_quote(mw__json_str(ld->doc, t), t->len, q, sizeof q);
    return mw__tok_fail_at(ld, v, MW_ERR_UNSUPPORTED, key, "%s%s%s is not supported (%s)", key,
                           *q ? " of type " : "", q, why);
}

static mw_status read_model(mw__loader *ld, const mw__json_node *model) {
    mw_tokenizer *tok = ld->tok;
    const mw__json *doc = ld->doc;
    char buf[96];
    mw_status st;
    if (!model)
        return mw__tok_fail_at(ld, NULL, MW_ERR_FORMAT, "model", "the file has no \"model\"");
    if (model->type != MW__JSON_OBJECT)
        return mw__tok_fail_at(ld, model, MW_ERR_FORMAT, "model", "expected an object, found %s",
                               mw__tok_what(ld, model, buf, sizeof buf));
    static const char *const keys[] = {"type",
                                       "dropout",
                                       "unk_token",
                                       "continuing_subword_prefix",
                                       "end_of_word_suffix",
                                       "fuse_unk",
                                       "byte_fallback",
                                       "ignore_merges",
                                       "vocab",
                                       "merges",
                                       NULL};
    const mw__json_node *dup = mw__json_duplicate(doc, model, keys), *t;
    if (dup) {
        char p[64];
        snprintf(p, sizeof p, "model.%.*s", (int)dup->klen, mw__json_key(doc, dup));
        return mw__tok_fail_at(ld, dup, MW_ERR_FORMAT, p, "the field appears twice");
    }
    if ((t = mw__json_get(doc, model, "type")) &&
        (st = mw__tok_check_type(ld, model, "model", "BPE", "a byte-level BPE model as GPT-2's")))
        return st;
    const mw__json_node *d = mw__json_get(doc, model, "dropout");
    if (d && d->type != MW__JSON_NULL) {
        if (d->type != MW__JSON_NUMBER || doc->text[d->str] == '-')
            return mw__tok_fail_at(ld, d, MW_ERR_FORMAT, "model.dropout",
                                   "expected null or a number from 0 to 1, found %s",
                                   mw__tok_what(ld, d, buf, sizeof buf));
        int zero = 1; /* every digit of the mantissa 0 */
        for (uint32_t i = 0; i < d->len && zero; i++) {
            char c = doc->text[d->str + i];
            if (c == 'e' || c == 'E') break;
            zero = !(c >= '1' && c <= '9');
        }
        if (!zero)
            return mw__tok_fail_at(
                ld, d, MW_ERR_UNSUPPORTED, "model.dropout",
                "dropout %s is not supported (it makes encoding random): use null",
                mw__tok_what(ld, d, buf, sizeof buf));
    }
    const mw__json_node *vocab = mw__json_get(doc, model, "vocab");
    const mw__json_node *merges = mw__json_get(doc, model, "merges");
    if (!vocab || !merges)
        return mw__tok_fail_at(ld, model, MW_ERR_FORMAT, "model", "the model has no \"%s\"",
                               vocab ? "merges" : "vocab");
    const mw__json_node *unk = mw__tok_get_string(ld, model, "unk_token", "model", &st);
    if (st) return st;
    const mw__json_node *pre =
        mw__tok_get_string(ld, model, "continuing_subword_prefix", "model", &st);
    if (st) return st;
    const mw__json_node *suf = mw__tok_get_string(ld, model, "end_of_word_suffix", "model", &st);
    if (st) return st;
    if ((st = mw__tok_get_bool(ld, model, "fuse_unk", "model", 1, &tok->fuse_unk)) ||
        (st = mw__tok_get_bool(ld, model, "byte_fallback", "model", 1, &tok->byte_fallback)) ||
        (st = mw__tok_get_bool(ld, model, "ignore_merges", "model", 1, &tok->ignore_merges)))
        return st;
    if ((st = mw__tok_read_vocab(ld, vocab, "model.vocab"))) return st;
    if (pre) {
        tok->has_prefix = 1;
        tok->prefix_len = pre->len;
        if ((st = mw__tok_store(tok, mw__json_str(doc, pre), pre->len, &tok->prefix_off)))
            return st;
    }
    if (suf) {
        tok->has_suffix = 1;
        tok->suffix_len = suf->len;
        if ((st = mw__tok_store(tok, mw__json_str(doc, suf), suf->len, &tok->suffix_off)))
            return st;
    }
    if (unk) {
        tok->unk_id = mw__tok_vocab_id(tok, mw__json_str(doc, unk), unk->len);
        if (tok->unk_id == MW__NO_ID) {
            char q[64];
            return mw__tok_fail_at(ld, unk, MW_ERR_FORMAT, "model.unk_token",
                                   "%s is not in the vocabulary",
                                   mw__tok_quote(mw__json_str(doc, unk), unk->len, q, sizeof q));
        }
    }
    return mw__tok_read_merges_json(ld, merges);
}

/* The text token i (its content stored) is matched as: its content, or, when it is "normalized"
 * and the normalizer is NFC, the content's NFC, as tokenizers' AddedVocabulary matches the
 * normalizer's output of the content in the normalized text. Two tokens of one pass matching
 * the same text are refused: tokenizers builds its matcher from a hash map, so which of them it
 * finds changes from run to run. */
static mw_status match_form(mw__loader *ld, mw__added *a, uint32_t i,
                            const mw__json_node *content) {
    mw_tokenizer *tok = ld->tok;
    char q[64], r[64], p[64];
    a->match_off = a->off;
    a->match_len = a->len;
    if (tok->nfc && a->normalized &&
        mw__nfc_may_change((const uint8_t *)tok->arena + a->off, a->len)) {
        mw__nfc_buf nb = {0};
        size_t n;
        mw_status st = mw__nfc(&nb, (const uint8_t *)tok->arena + a->off, a->len, &n);
        if (st == MW_OK && (n != a->len || memcmp(nb.out, tok->arena + a->off, n) != 0) &&
            (st = mw__tok_store(tok, nb.out, n, &a->match_off)) == MW_OK)
            a->match_len = (uint32_t)n; /* the store checked it is under 4 GiB */
        mw__nfc_free(&nb);
        if (st) return st;
    }
    for (uint32_t k = 0; k < i; k++) {
        const mw__added *b = &tok->added[k];
        if (b->normalized != a->normalized || b->match_len != a->match_len ||
            memcmp(tok->arena + b->match_off, tok->arena + a->match_off, a->match_len) != 0)
            continue;
        snprintf(p, sizeof p, "added_tokens[%u].content", i);
        return mw__tok_fail_at(
            ld, content, MW_ERR_UNSUPPORTED, p,
            "%s is, normalized (NFC), the text of added_tokens[%u] (%s): Hugging Face tokenizers "
            "matches either of them, a different one from run to run",
            mw__tok_quote(tok->arena + a->off, a->len, q, sizeof q), k,
            mw__tok_quote(tok->arena + b->off, b->len, r, sizeof r));
    }
    return MW_OK;
}

/* added_tokens: each {"id", "content", "single_word", "lstrip", "rstrip", "normalized",
 * "special"}, ids as tokenizers assigns them on loading (a token of the vocabulary keeps its id,
 * the others take the next ids after the vocabulary's size, in order). */
static mw_status read_added(mw__loader *ld, const mw__json_node *arr) {
    mw_tokenizer *tok = ld->tok;
    const mw__json *doc = ld->doc;
    char buf[96], p[64], q[64];
    if (!arr) return MW_OK;
    if (arr->type != MW__JSON_ARRAY)
        return mw__tok_fail_at(ld, arr, MW_ERR_FORMAT, "added_tokens",
                               "expected an array, found %s",
                               mw__tok_what(ld, arr, buf, sizeof buf));
    tok->added = mw__calloc(arr->count ? arr->count : 1, sizeof *tok->added);
    if (!tok->added) return mw__error(MW_ERR_NOMEM, "out of memory reading %s", ld->label);
    int64_t next = tok->vocab_count;
    uint32_t i = 0;
    mw_status st;
    for (const mw__json_node *c = mw__json_node_at(doc, arr->first); c;
         c = mw__json_node_at(doc, c->next), i++) {
        snprintf(p, sizeof p, "added_tokens[%u]", i);
        if (c->type != MW__JSON_OBJECT)
            return mw__tok_fail_at(ld, c, MW_ERR_FORMAT, p, "expected an object, found %s",
                                   mw__tok_what(ld, c, buf, sizeof buf));
        const mw__json_node *id = mw__json_get(doc, c, "id");
        const mw__json_node *content = mw__json_get(doc, c, "content");
        if (!id || !content)
            return mw__tok_fail_at(ld, c, MW_ERR_FORMAT, p, "the token has no \"%s\"",
                                   id ? "content" : "id");
        char pf[96];
        snprintf(pf, sizeof pf, "%s.id", p);
        if (id->type != MW__JSON_NUMBER || !id->is_integer || id->ival < 0 || id->ival > INT32_MAX)
            return mw__tok_fail_at(ld, id, MW_ERR_FORMAT, pf,
                                   "expected an integer from 0 to 2147483647, found %s",
                                   mw__tok_what(ld, id, buf, sizeof buf));
        snprintf(pf, sizeof pf, "%s.content", p);
        if (content->type != MW__JSON_STRING || content->len == 0)
            return mw__tok_fail_at(
                ld, content, MW_ERR_FORMAT, pf, "expected a non-empty string, found %s",
                content->type == MW__JSON_STRING ? "\"\""
                                                 : mw__tok_what(ld, content, buf, sizeof buf));
        mw__added *a = &tok->added[i];
        a->normalized = 1; /* tokenizers' AddedToken::default() */
        if ((st = mw__tok_get_bool(ld, c, "single_word", p, 0, &a->single_word)) ||
            (st = mw__tok_get_bool(ld, c, "lstrip", p, 0, &a->lstrip)) ||
            (st = mw__tok_get_bool(ld, c, "rstrip", p, 0, &a->rstrip)) ||
            (st = mw__tok_get_bool(ld, c, "normalized", p, 0, &a->normalized)) ||
            (st = mw__tok_get_bool(ld, c, "special", p, 0, &a->special)))
            return st;
        const char *s = mw__json_str(doc, content);
        for (uint32_t k = 0; k < i; k++)
            if (tok->added[k].len == content->len &&
                memcmp(tok->arena + tok->added[k].off, s, content->len) == 0)
                return mw__tok_fail_at(ld, content, MW_ERR_FORMAT, pf,
                                       "%s is also added_tokens[%u]",
                                       mw__tok_quote(s, content->len, q, sizeof q), k);
        int32_t model_id = mw__tok_vocab_id(tok, s, content->len);
        int64_t want = model_id != MW__NO_ID ? model_id : next++;
        if (want > INT32_MAX)
            return mw__tok_fail_at(ld, c, MW_ERR_UNSUPPORTED, p, "ids past 2147483647");
        if (want != id->ival)
            return mw__tok_fail_at(
                ld, id, MW_ERR_FORMAT, p,
                "%s has id %lld, but Hugging Face tokenizers gives it %lld (%s)",
                mw__tok_quote(s, content->len, q, sizeof q), (long long)id->ival, (long long)want,
                model_id != MW__NO_ID ? "its id in model.vocab"
                                      : "added tokens not in model.vocab take the ids after it, "
                                        "in order");
        if (model_id == MW__NO_ID && (size_t)want < ld->nused && ld->used[want])
            return mw__tok_fail_at(
                ld, id, MW_ERR_FORMAT, p,
                "id %lld is also a token of model.vocab (the vocabulary has holes)",
                (long long)want);
        a->id = (int32_t)want;
        a->len = content->len;
        if ((st = mw__tok_store(tok, s, content->len, &a->off))) return st;
        tok->nadded = i + 1;
        if ((st = match_form(ld, a, i, content))) return st;
        if (a->id >= tok->size) tok->size = a->id + 1;
    }
    return MW_OK;
}

static mw_status read_tokenizer_json(mw__loader *ld, const char *text, size_t n) {
    mw__json *doc;
    mw_status st = mw__json_parse(text, n, ld->label, &doc);
    if (st) return st;
    ld->doc = doc;
    const mw__json_node *root = mw__json_node_at(doc, 0), *v;
    char buf[96];
    static const char *const keys[] = {
        "version",       "truncation",     "padding", "added_tokens", "normalizer",
        "pre_tokenizer", "post_processor", "decoder", "model",        NULL};
    if (root->type != MW__JSON_OBJECT) {
        st = mw__tok_fail_at(ld, root, MW_ERR_FORMAT, "", "expected an object, found %s",
                             mw__tok_what(ld, root, buf, sizeof buf));
    } else if ((v = mw__json_duplicate(doc, root, keys))) {
        char p[64];
        snprintf(p, sizeof p, "%.*s", (int)v->klen, mw__json_key(doc, v));
        st = mw__tok_fail_at(ld, v, MW_ERR_FORMAT, p, "the field appears twice");
    } else if ((v = mw__json_get(doc, root, "version")) &&
               (v->type != MW__JSON_STRING || v->len != 3 ||
                memcmp(mw__json_str(doc, v), "1.0", 3) != 0)) {
        st = mw__tok_fail_at(ld, v, MW_ERR_UNSUPPORTED, "version",
                             "the file's format version is %s, not \"1.0\"",
                             mw__tok_what(ld, v, buf, sizeof buf));
    }
    if (!st) st = must_be_null(ld, root, "truncation", "encoding here never truncates");
    if (!st) st = must_be_null(ld, root, "padding", "encoding here never pads");
    if (!st) st = mw__tok_read_normalizer(ld, root);
    if (!st) st = mw__tok_read_pre_tokenizer(ld, root);
    if (!st)
        st = mw__tok_check_type(ld, mw__json_get(doc, root, "decoder"), "decoder", "ByteLevel",
                                "GPT-2's byte alphabet back to bytes");
    if (!st) st = read_model(ld, mw__json_get(doc, root, "model"));
    if (!st) st = read_added(ld, mw__json_get(doc, root, "added_tokens"));
    if (!st) st = mw__tok_read_post_processor(ld, root);
    ld->doc = NULL;
    mw__json_free(doc);
    return st;
}

/* --- GPT-2's original files --------------------------------------------------------------------
 */

static mw_status read_gpt2_files(mw__loader *ld, const char *dir) {
    mw_tokenizer *tok = ld->tok;
    char vpath[4096], mpath[4096];
    if (snprintf(vpath, sizeof vpath, "%s/vocab.json", dir) >= (int)sizeof vpath ||
        snprintf(mpath, sizeof mpath, "%s/merges.txt", dir) >= (int)sizeof mpath)
        return mw__error(MW_ERR_INVALID, "mw_tokenizer_load: the path %.200s... is too long", dir);
    char *text;
    size_t n;
    mw_status st = read_file(ld, vpath, &text, &n);
    if (st) return st;
    mw__json *doc;
    ld->label = vpath;
    st = mw__json_parse(text, n, vpath, &doc);
    if (st == MW_OK) {
        ld->doc = doc;
        st = mw__tok_read_vocab(ld, mw__json_node_at(doc, 0), "");
        ld->doc = NULL;
        mw__json_free(doc);
    }
    mw__free(text);
    if (st) return st;
    ld->label = mpath;
    if ((st = read_file(ld, mpath, &text, &n))) return st;
    st = mw__tok_read_merges_txt(ld, text, n, mpath);
    mw__free(text);
    if (st) return st;
    /* As transformers' GPT-2 tokenizer makes it: a special token, matched in the raw text. */
    int32_t eot = mw__tok_vocab_id(tok, SPECIAL_EOT, strlen(SPECIAL_EOT));
    if (eot == MW__NO_ID) return MW_OK;
    tok->added = mw__calloc(1, sizeof *tok->added);
    if (!tok->added) return mw__error(MW_ERR_NOMEM, "out of memory reading %s", dir);
    mw__added *a = &tok->added[0];
    *a = (mw__added){.len = (uint32_t)strlen(SPECIAL_EOT), .id = eot, .special = 1};
    if ((st = mw__tok_store(tok, SPECIAL_EOT, a->len, &a->off))) return st;
    a->match_off = a->off;
    a->match_len = a->len;
    tok->nadded = 1;
    return MW_OK;
}

/* --- loading ------------------------------------------------------------------------------------
 */

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static mw_status load(mw__loader *ld, const char *path) {
    char json[4096];
    const char *file = path;
    mw_status st;
    if (is_dir(path)) {
        if (snprintf(json, sizeof json, "%s/tokenizer.json", path) >= (int)sizeof json)
            return mw__error(MW_ERR_INVALID, "mw_tokenizer_load: the path %.200s... is too long",
                             path);
        if (!exists(json)) {
            if ((st = read_gpt2_files(ld, path))) return st;
            file = NULL;
        } else {
            file = json;
        }
    }
    if (file) {
        char *text;
        size_t n;
        if ((st = read_file(ld, file, &text, &n))) return st;
        ld->label = file;
        st = read_tokenizer_json(ld, text, n);
        mw__free(text);
        if (st) return st;
    }
    mw_tokenizer *tok = ld->tok;
    if ((st = mw__tok_byte_tables(tok)) || (st = mw__tok_added_passes(tok)) ||
        (st = mw__tok_decode_table(tok, ld->vids, ld->voff, ld->vlen)) || (st = mw__tok_cache(tok)))
        return st;
    return MW_OK;
}

mw_status mw_tokenizer_load(const char *path, mw_tokenizer **out) {
    if (out) *out = NULL;
    if (!path || !out) return mw__error(MW_ERR_INVALID, "mw_tokenizer_load: NULL argument");
    mw__loader ld = {.label = path};
    mw_status st = mw__tok_new(&ld.tok);
    if (st == MW_OK) st = load(&ld, path);
    mw__free(ld.vids);
    mw__free(ld.voff);
    mw__free(ld.vlen);
    mw__free(ld.used);
    mw__free(ld.scratch);
    if (st) {
        mw_tokenizer_free(ld.tok);
        return st;
    }
    *out = ld.tok;
    return MW_OK;
}

/* --- questions about a tokenizer ----------------------------------------------------------------
 */

int32_t mw_tokenizer_vocab_size(const mw_tokenizer *tok) { return tok ? tok->size : 0; }

const char *mw_tokenizer_file(const mw_tokenizer *tok, int index) {
    return tok && index >= 0 && index < tok->nfiles ? tok->arena + tok->file_off[index] : NULL;
}

int mw_tokenizer_missing_byte(const mw_tokenizer *tok) {
    if (!tok) {
        mw__error(MW_ERR_INVALID, "mw_tokenizer_missing_byte: NULL argument");
        return -2;
    }
    for (int b = 0; b < 256; b++)
        for (int v = 0; v < 4; v++)
            if (tok->byte_id[v][b] == MW__NO_ID &&
                !(tok->byte_fallback && tok->byte_fb_count[v][b]))
                return b;
    return -1;
}

mw_status mw_tokenizer_token_id(const mw_tokenizer *tok, const char *token, int32_t *id) {
    if (!tok || !token || !id)
        return mw__error(MW_ERR_INVALID, "mw_tokenizer_token_id: NULL argument");
    size_t n = strlen(token);
    *id = MW__NO_ID;
    for (uint32_t i = 0; i < tok->nadded; i++)
        if (tok->added[i].len == n && memcmp(tok->arena + tok->added[i].off, token, n) == 0) {
            *id = tok->added[i].id;
            return MW_OK;
        }
    *id = mw__tok_vocab_id(tok, token, n);
    if (*id != MW__NO_ID) return MW_OK;
    char q[64];
    return mw__error(MW_ERR_NOT_FOUND, "the tokenizer has no token %s",
                     mw__tok_quote(token, n, q, sizeof q));
}

int mw_tokenizer_is_special(const mw_tokenizer *tok, int32_t id) {
    return tok && id >= 0 && id < tok->size && tok->is_special[id] == 2;
}

size_t mw_tokenizer_max_ids(const mw_tokenizer *tok, size_t len) {
    if (!tok) return 0;
    /* NFC makes a text at most 3 times longer (U+1D160, 4 bytes, is 12 in NFC) */
    size_t per = tok->max_ids_per_byte * (tok->add_prefix_space ? 2 : 1) * (tok->nfc ? 3 : 1);
    size_t around = (size_t)tok->template_before + tok->template_after;
    if (len > (SIZE_MAX - around) / per) return SIZE_MAX;
    return len * per + around;
}

/* The one id of the template's side (before: 0, after: 1), or MW_ERR_NOT_FOUND. */
static mw_status template_one(const mw_tokenizer *tok, int after, int32_t *id, const char *fn) {
    if (!tok || !id) return mw__error(MW_ERR_INVALID, "%s: NULL argument", fn);
    *id = MW__NO_ID;
    uint32_t count = after ? tok->template_after : tok->template_before;
    if (count == 1) {
        *id = tok->template_ids[after ? tok->template_before : 0];
        return MW_OK;
    }
    return mw__error(MW_ERR_NOT_FOUND,
                     "%s: the tokenizer's post-processor puts %s token %s the text (%s); a "
                     "tokenizer.json names no other: look the token up by name "
                     "(mw_tokenizer_token_id)",
                     fn, count ? "more than one" : "no", after ? "after" : "before",
                     count               ? "encode an empty text with MW_ENCODE_ADD_SPECIAL "
                                           "for them all"
                     : tok->template_ids ? "its TemplateProcessing has none there"
                                         : "it has no TemplateProcessing");
}

mw_status mw_tokenizer_bos_id(const mw_tokenizer *tok, int32_t *id) {
    return template_one(tok, 0, id, "mw_tokenizer_bos_id");
}

mw_status mw_tokenizer_eos_id(const mw_tokenizer *tok, int32_t *id) {
    return template_one(tok, 1, id, "mw_tokenizer_eos_id");
}

const char *mw_tokenizer_unicode_version(void) { return MW__UNICODE_VERSION; }
