/* Reading the steps of a tokenizer.json around its model: the settings helpers every reader
 * shares, the normalizer (none, or NFC as Qwen2's), the pre-tokenizer (ByteLevel alone, or a Split
 * by a known pattern then ByteLevel, as Llama 3's and Qwen2's files have it) and the post-processor
 * (ByteLevel, TemplateProcessing, a Sequence of them). Whatever is not implemented is refused by
 * its JSON path and name. */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "text/tokenizer_read.h"

/* --- settings --------------------------------------------------------------------------------- */

mw_status mw__tok_get_bool(mw__loader *ld, const mw__json_node *obj, const char *key,
                           const char *path, int nullable, int *out) {
    const mw__json_node *v = mw__json_get(ld->doc, obj, key);
    char p[160], buf[96];
    snprintf(p, sizeof p, "%s.%s", path, key);
    if (!v || (nullable && v->type == MW__JSON_NULL)) return MW_OK;
    if (v->type != MW__JSON_TRUE && v->type != MW__JSON_FALSE)
        return mw__tok_fail_at(ld, v, MW_ERR_FORMAT, p, "expected true or false, found %s",
                               mw__tok_what(ld, v, buf, sizeof buf));
    *out = v->type == MW__JSON_TRUE;
    return MW_OK;
}

const mw__json_node *mw__tok_get_string(mw__loader *ld, const mw__json_node *obj, const char *key,
                                        const char *path, mw_status *st) {
    const mw__json_node *v = mw__json_get(ld->doc, obj, key);
    char p[160], buf[96];
    *st = MW_OK;
    if (!v || v->type == MW__JSON_NULL) return NULL;
    if (v->type == MW__JSON_STRING) return v;
    snprintf(p, sizeof p, "%s.%s", path, key);
    *st = mw__tok_fail_at(ld, v, MW_ERR_FORMAT, p, "expected a string or null, found %s",
                          mw__tok_what(ld, v, buf, sizeof buf));
    return NULL;
}

/* 1 when string node s is `want`. */
static int is(const mw__loader *ld, const mw__json_node *s, const char *want) {
    return s && s->type == MW__JSON_STRING && s->len == strlen(want) &&
           memcmp(mw__json_str(ld->doc, s), want, s->len) == 0;
}

mw_status mw__tok_type_of(mw__loader *ld, const mw__json_node *v, const char *path,
                          const mw__json_node **type) {
    char buf[96], p[160];
    *type = NULL;
    if (v->type != MW__JSON_OBJECT)
        return mw__tok_fail_at(ld, v, MW_ERR_FORMAT, path, "expected an object, found %s",
                               mw__tok_what(ld, v, buf, sizeof buf));
    const mw__json_node *t = mw__json_get(ld->doc, v, "type");
    snprintf(p, sizeof p, "%s.type", path);
    if (!t || t->type != MW__JSON_STRING)
        return mw__tok_fail_at(ld, t ? t : v, MW_ERR_FORMAT, t ? p : path,
                               "expected a \"type\" string");
    *type = t;
    return MW_OK;
}

mw_status mw__tok_check_type(mw__loader *ld, const mw__json_node *v, const char *path,
                             const char *want, const char *why) {
    if (!v || v->type == MW__JSON_NULL)
        return mw__tok_fail_at(ld, v, MW_ERR_UNSUPPORTED, path,
                               "%s is missing; only \"%s\" is supported (%s)", path, want, why);
    const mw__json_node *t;
    mw_status st = mw__tok_type_of(ld, v, path, &t);
    if (st) return st;
    if (!is(ld, t, want)) {
        char q[64], p[160];
        snprintf(p, sizeof p, "%s.type", path);
        return mw__tok_fail_at(
            ld, t, MW_ERR_UNSUPPORTED, p, "%s is not supported: only \"%s\" (%s)",
            mw__tok_quote(mw__json_str(ld->doc, t), t->len, q, sizeof q), want, why);
    }
    return MW_OK;
}

/* v (at path): an array, else refused. */
static mw_status want_array(mw__loader *ld, const mw__json_node *v, const mw__json_node *parent,
                            const char *path) {
    char buf[96];
    if (!v) return mw__tok_fail_at(ld, parent, MW_ERR_FORMAT, path, "the field is missing");
    if (v->type != MW__JSON_ARRAY)
        return mw__tok_fail_at(ld, v, MW_ERR_FORMAT, path, "expected an array, found %s",
                               mw__tok_what(ld, v, buf, sizeof buf));
    return MW_OK;
}

/* --- the normalizer ----------------------------------------------------------------------------
 */

mw_status mw__tok_read_normalizer(mw__loader *ld, const mw__json_node *root) {
    const mw__json_node *v = mw__json_get(ld->doc, root, "normalizer"), *t;
    if (!v || v->type == MW__JSON_NULL) return MW_OK;
    mw_status st = mw__tok_type_of(ld, v, "normalizer", &t);
    if (st) return st;
    if (!is(ld, t, "NFC")) {
        char q[64];
        return mw__tok_fail_at(ld, t, MW_ERR_UNSUPPORTED, "normalizer.type",
                               "%s is not supported: only none (GPT-2's, Llama 3's) or \"NFC\" "
                               "(Qwen2's)",
                               mw__tok_quote(mw__json_str(ld->doc, t), t->len, q, sizeof q));
    }
    ld->tok->nfc = 1;
    return MW_OK;
}

/* --- the pre-tokenizer -------------------------------------------------------------------------
 */

static mw_status read_byte_level(mw__loader *ld, const mw__json_node *v, const char *path) {
    mw_tokenizer *tok = ld->tok;
    if (!mw__json_get(ld->doc, v, "add_prefix_space"))
        return mw__tok_fail_at(ld, v, MW_ERR_FORMAT, path, "it has no \"add_prefix_space\"");
    int trim = 0;
    mw_status st;
    if ((st = mw__tok_get_bool(ld, v, "add_prefix_space", path, 0, &tok->add_prefix_space)) ||
        (st = mw__tok_get_bool(ld, v, "use_regex", path, 0, &tok->use_regex)) ||
        (st = mw__tok_get_bool(ld, v, "trim_offsets", path, 0, &trim)))
        return st;
    return MW_OK;
}

/* {"type": "Split", "pattern": {"Regex": ...}, "behavior": "Isolated", "invert": false}, the
 * pattern one of tokenizer_split.h's. */
static mw_status read_split(mw__loader *ld, const mw__json_node *v, const char *path) {
    const mw__json *doc = ld->doc;
    char p[160], buf[96], q[256];
    const mw__json_node *pat = mw__json_get(doc, v, "pattern");
    snprintf(p, sizeof p, "%s.pattern", path);
    if (!pat || pat->type != MW__JSON_OBJECT || pat->count != 1)
        return mw__tok_fail_at(ld, pat ? pat : v, MW_ERR_FORMAT, p,
                               "expected {\"Regex\": pattern} or {\"String\": text}, found %s",
                               pat ? mw__tok_what(ld, pat, buf, sizeof buf) : "nothing");
    const mw__json_node *re = mw__json_node_at(doc, pat->first);
    const char *key = mw__json_key(doc, re);
    if (re->klen == 6 && memcmp(key, "String", 6) == 0)
        return mw__tok_fail_at(ld, re, MW_ERR_UNSUPPORTED, p,
                               "a Split by a literal String is not supported: only by the "
                               "Regex of GPT-2, Llama 3 or Qwen2");
    snprintf(p, sizeof p, "%s.pattern.%.*s", path, (int)(re->klen > 20 ? 20 : re->klen), key);
    if (re->klen != 5 || memcmp(key, "Regex", 5) != 0 || re->type != MW__JSON_STRING)
        return mw__tok_fail_at(ld, re, MW_ERR_FORMAT, p,
                               "expected {\"Regex\": pattern} or {\"String\": text}");
    mw__split which = mw__split_pattern(mw__json_str(doc, re), re->len);
    if (which == MW__SPLIT_NONE)
        return mw__tok_fail_at(ld, re, MW_ERR_UNSUPPORTED, p,
                               "the Split pattern %s is not one this tokenizer implements: it "
                               "knows GPT-2's, Llama 3's and Qwen2's, written out by hand (there "
                               "is no regex engine), and compares the pattern character for "
                               "character",
                               mw__tok_quote(mw__json_str(doc, re), re->len, q, sizeof q));
    const mw__json_node *behavior = mw__json_get(doc, v, "behavior");
    snprintf(p, sizeof p, "%s.behavior", path);
    if (!behavior) return mw__tok_fail_at(ld, v, MW_ERR_FORMAT, p, "the Split has no \"behavior\"");
    if (behavior->type != MW__JSON_STRING)
        return mw__tok_fail_at(ld, behavior, MW_ERR_FORMAT, p, "expected a string, found %s",
                               mw__tok_what(ld, behavior, buf, sizeof buf));
    if (!is(ld, behavior, "Isolated"))
        return mw__tok_fail_at(
            ld, behavior, MW_ERR_UNSUPPORTED, p,
            "%s is not supported: only \"Isolated\" (each match a word of its own)",
            mw__tok_quote(mw__json_str(doc, behavior), behavior->len, q, 64));
    int invert = 0;
    mw_status st = mw__tok_get_bool(ld, v, "invert", path, 0, &invert);
    if (st) return st;
    snprintf(p, sizeof p, "%s.invert", path);
    if (invert)
        return mw__tok_fail_at(ld, mw__json_get(doc, v, "invert"), MW_ERR_UNSUPPORTED, p,
                               "\"invert\": true is not supported (the words are the matches)");
    ld->tok->split = which;
    return MW_OK;
}

mw_status mw__tok_read_pre_tokenizer(mw__loader *ld, const mw__json_node *root) {
    static const char why[] = "GPT-2's regex and byte alphabet, or a Split by the regex of "
                              "GPT-2, Llama 3 or Qwen2 then ByteLevel";
    const mw__json *doc = ld->doc;
    const mw__json_node *v = mw__json_get(doc, root, "pre_tokenizer"), *t;
    if (!v || v->type == MW__JSON_NULL)
        return mw__tok_check_type(ld, v, "pre_tokenizer", "ByteLevel", why);
    mw_status st = mw__tok_type_of(ld, v, "pre_tokenizer", &t);
    if (st) return st;
    if (is(ld, t, "ByteLevel")) return read_byte_level(ld, v, "pre_tokenizer");
    char q[64];
    if (!is(ld, t, "Sequence"))
        return mw__tok_fail_at(ld, t, MW_ERR_UNSUPPORTED, "pre_tokenizer.type",
                               "%s is not supported: only \"ByteLevel\" or a \"Sequence\" (%s)",
                               mw__tok_quote(mw__json_str(doc, t), t->len, q, sizeof q), why);
    const mw__json_node *list = mw__json_get(doc, v, "pretokenizers");
    if ((st = want_array(ld, list, v, "pre_tokenizer.pretokenizers"))) return st;
    /* [Split, ByteLevel] or [ByteLevel] */
    int k = 0, split = 0, byte_level = 0;
    for (const mw__json_node *c = mw__json_node_at(doc, list->first); c;
         c = mw__json_node_at(doc, c->next), k++) {
        char p[64];
        snprintf(p, sizeof p, "pre_tokenizer.pretokenizers[%d]", k);
        if ((st = mw__tok_type_of(ld, c, p, &t))) return st;
        if (is(ld, t, "Split") && k == 0) {
            if ((st = read_split(ld, c, p))) return st;
            split = 1;
        } else if (is(ld, t, "ByteLevel") && !byte_level) {
            if ((st = read_byte_level(ld, c, p))) return st;
            byte_level = 1;
        } else {
            char pt[80];
            snprintf(pt, sizeof pt, "%s.type", p);
            return mw__tok_fail_at(
                ld, t, MW_ERR_UNSUPPORTED, pt,
                "%s %s is not supported: the sequence must be a Split then a ByteLevel, or "
                "a ByteLevel alone (%s)",
                mw__tok_quote(mw__json_str(doc, t), t->len, q, sizeof q),
                is(ld, t, "Split") ? "after the first" : "here", why);
        }
    }
    if (!byte_level)
        return mw__tok_fail_at(ld, list, MW_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers",
                               "the sequence has %s but no ByteLevel (GPT-2's byte alphabet, "
                               "which the vocabulary is written in)",
                               split ? "a Split" : "nothing");
    return MW_OK;
}

/* --- the post-processor ------------------------------------------------------------------------
 */

/* 1 when id is a token of the vocabulary or an added token. */
static int is_token(const mw__loader *ld, int64_t id) {
    const mw_tokenizer *tok = ld->tok;
    if (id < 0 || id >= tok->size) return 0;
    if ((size_t)id < ld->nused && ld->used[id]) return 1;
    for (uint32_t i = 0; i < tok->nadded; i++)
        if (tok->added[i].id == id) return 1;
    return 0;
}

/* The ids of the special token named by string node `name` in template.special_tokens. */
static mw_status special_ids(mw__loader *ld, const mw__json_node *tp, const mw__json_node *name,
                             const char *path, const mw__json_node **ids) {
    const mw__json *doc = ld->doc;
    char q[64], p[200];
    const mw__json_node *map = mw__json_get(doc, tp, "special_tokens"), *entry = NULL;
    snprintf(p, sizeof p, "%s.special_tokens", path);
    if (map && map->type == MW__JSON_OBJECT)
        for (const mw__json_node *c = mw__json_node_at(doc, map->first); c && !entry;
             c = mw__json_node_at(doc, c->next))
            if (c->klen == name->len &&
                memcmp(mw__json_key(doc, c), mw__json_str(doc, name), name->len) == 0)
                entry = c;
    if (!entry)
        return mw__tok_fail_at(ld, map ? map : tp, MW_ERR_FORMAT, p,
                               "the template names the special token %s, which is not here",
                               mw__tok_quote(mw__json_str(doc, name), name->len, q, sizeof q));
    snprintf(p, sizeof p, "%s.special_tokens[%s].ids", path,
             mw__tok_quote(mw__json_str(doc, name), name->len, q, sizeof q));
    const mw__json_node *arr =
        entry->type == MW__JSON_OBJECT ? mw__json_get(doc, entry, "ids") : NULL;
    mw_status st = want_array(ld, arr, entry, p);
    if (st) return st;
    mw_tokenizer *tok = ld->tok;
    for (const mw__json_node *c = mw__json_node_at(doc, arr->first); c;
         c = mw__json_node_at(doc, c->next)) {
        char buf[96];
        if (c->type != MW__JSON_NUMBER || !c->is_integer || c->ival < 0 || c->ival > INT32_MAX)
            return mw__tok_fail_at(ld, c, MW_ERR_FORMAT, p,
                                   "expected integer ids from 0 to 2147483647, found %s",
                                   mw__tok_what(ld, c, buf, sizeof buf));
        if (!is_token(ld, c->ival))
            return mw__tok_fail_at(ld, c, MW_ERR_FORMAT, p,
                                   "id %lld is not a token of the tokenizer (ids 0 to %d): "
                                   "decoding could not give it back",
                                   (long long)c->ival, tok->size - 1);
    }
    *ids = arr;
    return MW_OK;
}

/* Appends the ids of array `arr` (a special token's) to tok->template_ids (room made by the
 * caller). */
static void append_ids(mw__loader *ld, const mw__json_node *arr, uint32_t *count) {
    for (const mw__json_node *c = mw__json_node_at(ld->doc, arr->first); c;
         c = mw__json_node_at(ld->doc, c->next))
        ld->tok->template_ids[(*count)++] = (int32_t)c->ival;
}

/* TemplateProcessing: its "single" template, [special tokens] $A [special tokens], the ids of
 * each special token from "special_tokens"; "pair" is not read (one text is encoded at a time).
 */
static mw_status read_template(mw__loader *ld, const mw__json_node *tp, const char *path) {
    const mw__json *doc = ld->doc;
    mw_tokenizer *tok = ld->tok;
    char p[160], buf[96];
    snprintf(p, sizeof p, "%s.single", path);
    const mw__json_node *single = mw__json_get(doc, tp, "single");
    mw_status st = want_array(ld, single, tp, p);
    if (st) return st;
    /* Two passes: count the ids, then copy them. */
    size_t total = 0;
    for (const mw__json_node *c = mw__json_node_at(doc, single->first); c;
         c = mw__json_node_at(doc, c->next)) {
        const mw__json_node *body =
            c->type == MW__JSON_OBJECT && c->count == 1 ? mw__json_node_at(doc, c->first) : NULL;
        if (body && body->klen == 12 && memcmp(mw__json_key(doc, body), "SpecialToken", 12) == 0 &&
            body->type == MW__JSON_OBJECT) {
            const mw__json_node *name = mw__json_get(doc, body, "id"), *ids;
            if (!name || name->type != MW__JSON_STRING)
                return mw__tok_fail_at(ld, body, MW_ERR_FORMAT, p,
                                       "a SpecialToken without an \"id\" string");
            if ((st = special_ids(ld, tp, name, path, &ids))) return st;
            total += ids->count;
        }
    }
    if (total > UINT32_MAX / 2)
        return mw__tok_fail_at(ld, single, MW_ERR_UNSUPPORTED, p, "too many special tokens");
    tok->template_ids = mw__malloc((total ? total : 1) * sizeof *tok->template_ids);
    if (!tok->template_ids) return mw__error(MW_ERR_NOMEM, "out of memory reading %s", ld->label);
    uint32_t before = 0, after = 0, n = 0;
    int seen_a = 0;
    for (const mw__json_node *c = mw__json_node_at(doc, single->first); c;
         c = mw__json_node_at(doc, c->next)) {
        const mw__json_node *body =
            c->type == MW__JSON_OBJECT && c->count == 1 ? mw__json_node_at(doc, c->first) : NULL;
        const char *key = body ? mw__json_key(doc, body) : "";
        if (body && body->klen == 12 && memcmp(key, "SpecialToken", 12) == 0 &&
            body->type == MW__JSON_OBJECT) {
            const mw__json_node *ids;
            special_ids(ld, tp, mw__json_get(doc, body, "id"), path, &ids); /* checked above */
            uint32_t was = n;
            append_ids(ld, ids, &n);
            *(seen_a ? &after : &before) += n - was;
        } else if (body && body->klen == 8 && memcmp(key, "Sequence", 8) == 0 &&
                   body->type == MW__JSON_OBJECT) {
            const mw__json_node *id = mw__json_get(doc, body, "id");
            if (!is(ld, id, "A"))
                return mw__tok_fail_at(ld, id ? id : body, MW_ERR_FORMAT, p,
                                       "the single template holds a Sequence that is not \"A\" "
                                       "(found %s)",
                                       id ? mw__tok_what(ld, id, buf, sizeof buf) : "no id");
            if (seen_a)
                return mw__tok_fail_at(ld, body, MW_ERR_FORMAT, p,
                                       "the single template holds $A twice");
            seen_a = 1;
        } else {
            return mw__tok_fail_at(ld, c, MW_ERR_FORMAT, p,
                                   "expected {\"SpecialToken\": {...}} or {\"Sequence\": "
                                   "{...}}, found %s",
                                   mw__tok_what(ld, c, buf, sizeof buf));
        }
    }
    if (!seen_a)
        return mw__tok_fail_at(ld, single, MW_ERR_FORMAT, p,
                               "the single template has no $A (the text)");
    tok->template_before = before;
    tok->template_after = after;
    return MW_OK;
}

mw_status mw__tok_read_post_processor(mw__loader *ld, const mw__json_node *root) {
    static const char why[] = "only \"ByteLevel\" (which moves offsets alone), "
                              "\"TemplateProcessing\" and a \"Sequence\" of them";
    const mw__json *doc = ld->doc;
    const mw__json_node *v = mw__json_get(doc, root, "post_processor"), *t;
    if (!v || v->type == MW__JSON_NULL) return MW_OK;
    mw_status st = mw__tok_type_of(ld, v, "post_processor", &t);
    if (st) return st;
    const mw__json_node *one = v, *list = NULL;
    if (is(ld, t, "Sequence")) {
        list = mw__json_get(doc, v, "processors");
        if ((st = want_array(ld, list, v, "post_processor.processors"))) return st;
        one = mw__json_node_at(doc, list->first);
    }
    int k = 0, templates = 0;
    char q[64], p[64], pt[80];
    for (; one; one = list ? mw__json_node_at(doc, one->next) : NULL, k++) {
        if (list)
            snprintf(p, sizeof p, "post_processor.processors[%d]", k);
        else
            snprintf(p, sizeof p, "post_processor");
        if ((st = mw__tok_type_of(ld, one, p, &t))) return st;
        snprintf(pt, sizeof pt, "%s.type", p);
        if (is(ld, t, "ByteLevel")) continue;
        if (!is(ld, t, "TemplateProcessing"))
            return mw__tok_fail_at(ld, t, MW_ERR_UNSUPPORTED, pt, "%s is not supported: %s",
                                   mw__tok_quote(mw__json_str(doc, t), t->len, q, sizeof q), why);
        if (templates++)
            return mw__tok_fail_at(ld, t, MW_ERR_UNSUPPORTED, pt,
                                   "a second TemplateProcessing is not supported");
        if ((st = read_template(ld, one, p))) return st;
    }
    return MW_OK;
}
