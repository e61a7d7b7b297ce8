/* Vocabularies and merges, from tokenizer.json or from GPT-2's vocab.json and merges.txt, as
 * tokenizers reads them (a merge names two tokens of the vocabulary, and their concatenation
 * without the continuing-subword prefix must be one too; a pair listed twice keeps its last
 * rank), with stricter checks where tokenizers would silently skip or overwrite (a non-integer
 * id, a token or an id given twice), and the messages that name the file and the place. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "text/tokenizer_read.h"
#include "text/unicode.h"

/* --- messages ------------------------------------------------------------------------------- */

/* s[0, n) as a JSON string literal, cut to about 40 characters, into buf. */
const char *mw__tok_quote(const char *s, size_t n, char *buf, size_t size) {
    size_t k = 0, i = 0;
    buf[k++] = '"';
    while (i < n && k + 12 < size && (size > 64 || k < 48)) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            buf[k++] = '\\';
            buf[k++] = (char)c;
            i++;
        } else if (c < 0x20 || c == 0x7F) {
            k += (size_t)snprintf(buf + k, size - k, "\\u%04x", c);
            i++;
        } else {
            uint32_t cp;
            size_t l = mw__utf8_decode((const uint8_t *)s + i, n - i, &cp);
            if (!l) {
                k += (size_t)snprintf(buf + k, size - k, "\\x%02x", c);
                i++;
            } else {
                memcpy(buf + k, s + i, l);
                k += l;
                i += l;
            }
        }
    }
    if (i < n) {
        memcpy(buf + k, "...", 3);
        k += 3;
    }
    buf[k++] = '"';
    buf[k] = '\0';
    return buf;
}

/* "file:line:column: path: message" for the value n of the JSON document. */
mw_status mw__tok_fail_at(mw__loader *ld, const mw__json_node *n, mw_status st, const char *path,
                          const char *fmt, ...) {
    char msg[400], where[48];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mw__json_where(ld->doc, n ? n->offset : 0, where, sizeof where);
    return mw__error(st, "%s:%s: %s: %s", ld->label, where, path && *path ? path : "(top level)",
                     msg);
}

/* What a value is, for "found ..." in messages: its type, or a number's text. */
const char *mw__tok_what(mw__loader *ld, const mw__json_node *n, char *buf, size_t size) {
    if (n->type == MW__JSON_NUMBER) {
        snprintf(buf, size, "%.*s", (int)(n->len > 40 ? 40 : n->len), ld->doc->text + n->str);
        return buf;
    }
    if (n->type == MW__JSON_STRING) {
        char q[64];
        snprintf(buf, size, "the string %s",
                 mw__tok_quote(mw__json_str(ld->doc, n), n->len, q, sizeof q));
        return buf;
    }
    return mw__json_type_name(n->type);
}

/* --- the vocabulary --------------------------------------------------------------------------- */

static int by_value(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* obj: token -> id. path names it ("model.vocab"; "" for vocab.json). */
mw_status mw__tok_read_vocab(mw__loader *ld, const mw__json_node *obj, const char *path) {
    mw_tokenizer *tok = ld->tok;
    const mw__json *doc = ld->doc;
    char buf[96], q[64], p[160];
    if (obj->type != MW__JSON_OBJECT)
        return mw__tok_fail_at(ld, obj, MW_ERR_FORMAT, path,
                               "the vocabulary must be an object (token -> id), found %s",
                               mw__tok_what(ld, obj, buf, sizeof buf));
    size_t n = obj->count;
    mw_status st = mw__strmap_init(&tok->vocab, n);
    if (st) return st;
    ld->vids = mw__malloc((n ? n : 1) * sizeof *ld->vids);
    ld->voff = mw__malloc((n ? n : 1) * sizeof *ld->voff);
    ld->vlen = mw__malloc((n ? n : 1) * sizeof *ld->vlen);
    uint64_t *order = mw__malloc((n ? n : 1) * sizeof *order);
    if (!ld->vids || !ld->voff || !ld->vlen || !order) {
        mw__free(order);
        return mw__error(MW_ERR_NOMEM, "out of memory reading %s (%zu tokens)", ld->label, n);
    }
    int32_t top = -1;
    size_t i = 0;
    for (const mw__json_node *c = mw__json_node_at(doc, obj->first); c;
         c = mw__json_node_at(doc, c->next), i++) {
        const char *key = mw__json_key(doc, c);
        snprintf(p, sizeof p, "%s[%s]", path, mw__tok_quote(key, c->klen, q, sizeof q));
        if (c->type != MW__JSON_NUMBER || !c->is_integer || c->ival < 0 || c->ival > INT32_MAX) {
            st = mw__tok_fail_at(ld, c, MW_ERR_FORMAT, p,
                                 "a token's id must be an integer from 0 to 2147483647, found %s",
                                 mw__tok_what(ld, c, buf, sizeof buf));
            break;
        }
        uint32_t off;
        if ((st = mw__tok_store(tok, key, c->klen, &off))) break;
        int added;
        mw__strmap_slot *e = mw__strmap_put(&tok->vocab, tok->arena, off, c->klen, &added);
        if (!added) {
            const mw__json_node *first = mw__json_node_at(doc, obj->first);
            while (first->klen != c->klen || memcmp(mw__json_key(doc, first), key, c->klen) != 0)
                first = mw__json_node_at(doc, first->next);
            char where[48];
            mw__json_where(doc, first->offset, where, sizeof where);
            st = mw__tok_fail_at(ld, c, MW_ERR_FORMAT, p, "the token appears twice (first at %s)",
                                 where);
            break;
        }
        e->value = (int32_t)c->ival;
        ld->vids[i] = (int32_t)c->ival;
        ld->voff[i] = off;
        ld->vlen[i] = c->klen;
        order[i] = (uint64_t)c->ival << 32 | i;
        if (c->ival > top) top = (int32_t)c->ival;
    }
    if (st == MW_OK) {
        /* Two tokens with one id would make decoding ambiguous. */
        qsort(order, n, sizeof *order, by_value);
        for (size_t k = 1; k < n && st == MW_OK; k++) {
            if (order[k] >> 32 != order[k - 1] >> 32) continue;
            uint32_t a = (uint32_t)order[k - 1], b = (uint32_t)order[k];
            if (a > b) {
                uint32_t t = a;
                a = b;
                b = t;
            }
            const mw__json_node *nb = mw__json_node_at(doc, obj->first);
            for (uint32_t j = 0; j < b; j++) nb = mw__json_node_at(doc, nb->next);
            char qa[64];
            snprintf(p, sizeof p, "%s[%s]", path,
                     mw__tok_quote(mw__json_key(doc, nb), nb->klen, q, sizeof q));
            st = mw__tok_fail_at(
                ld, nb, MW_ERR_FORMAT, p, "id %u is also the id of %s", (unsigned)(order[k] >> 32),
                mw__tok_quote(tok->arena + ld->voff[a], ld->vlen[a], qa, sizeof qa));
        }
    }
    mw__free(order);
    if (st) return st;
    if ((int64_t)top >= 4 * (int64_t)n + 65536)
        return mw__tok_fail_at(ld, obj, MW_ERR_UNSUPPORTED, path,
                               "ids run up to %d for only %zu tokens: too sparse a vocabulary", top,
                               n);
    tok->vocab_count = (int32_t)n;
    tok->size = top + 1;
    ld->used = mw__calloc((size_t)tok->size + 1, 1);
    if (!ld->used) return mw__error(MW_ERR_NOMEM, "out of memory reading %s", ld->label);
    ld->nused = (size_t)tok->size;
    for (size_t k = 0; k < n; k++) ld->used[ld->vids[k]] = 1;
    return MW_OK;
}

/* --- merges ----------------------------------------------------------------------------------- */

static mw_status merges_init(mw__loader *ld, size_t n) {
    mw_tokenizer *tok = ld->tok;
    mw_status st = mw__pairmap_init(&tok->merges, n);
    if (st) return st;
    tok->merge_id = mw__malloc((n ? n : 1) * sizeof *tok->merge_id);
    if (!tok->merge_id) return mw__error(MW_ERR_NOMEM, "out of memory for %zu merges", n);
    return MW_OK;
}

/* Adds the merge (a, b) with the next rank. MW_ERR_FORMAT with the reason in why. As in
 * tokenizers, the merged token is a followed by b without the continuing-subword prefix, and a
 * pair listed twice keeps its last rank. */
static mw_status add_merge(mw__loader *ld, const char *a, size_t alen, const char *b, size_t blen,
                           char *why, size_t whysize) {
    mw_tokenizer *tok = ld->tok;
    char q[64];
    int32_t ia = mw__tok_vocab_id(tok, a, alen), ib = mw__tok_vocab_id(tok, b, blen);
    if (ia == MW__NO_ID || ib == MW__NO_ID) {
        snprintf(why, whysize, "the merge names %s, which is not in the vocabulary",
                 ia == MW__NO_ID ? mw__tok_quote(a, alen, q, sizeof q)
                                 : mw__tok_quote(b, blen, q, sizeof q));
        return MW_ERR_FORMAT;
    }
    size_t plen = tok->has_prefix ? tok->prefix_len : 0;
    if (blen < plen) {
        snprintf(why, whysize,
                 "the right token %s is shorter than the continuing_subword_prefix (%zu bytes)",
                 mw__tok_quote(b, blen, q, sizeof q), plen);
        return MW_ERR_FORMAT;
    }
    size_t mlen = alen + blen - plen;
    if (mlen > ld->scratch_cap) {
        char *s = mw__realloc(ld->scratch, mlen);
        if (!s) return mw__error(MW_ERR_NOMEM, "out of memory reading %s", ld->label);
        ld->scratch = s;
        ld->scratch_cap = mlen;
    }
    memcpy(ld->scratch, a, alen);
    memcpy(ld->scratch + alen, b + plen, blen - plen);
    int32_t im = mw__tok_vocab_id(tok, ld->scratch, mlen);
    if (im == MW__NO_ID) {
        snprintf(why, whysize, "the merged token %s is not in the vocabulary",
                 mw__tok_quote(ld->scratch, mlen, q, sizeof q));
        return MW_ERR_FORMAT;
    }
    mw__pairmap_slot *s = mw__pairmap_find(&tok->merges, (uint32_t)ia, (uint32_t)ib);
    s->key = mw__pair_key((uint32_t)ia, (uint32_t)ib);
    s->rank = tok->nmerges;
    s->id = im;
    tok->merge_id[tok->nmerges++] = im;
    return MW_OK;
}

/* "a b" with exactly one space: the two halves. 0 when it is not that. */
static int split_merge(const char *s, size_t n, size_t *space) {
    const char *sp = memchr(s, ' ', n);
    if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp - s) - 1)) return 0;
    *space = (size_t)(sp - s);
    return 1;
}

static int is_version_line(const char *s, size_t n) {
    return n >= 8 && memcmp(s, "#version", 8) == 0;
}

/* model.merges: ["a b", ...] or [["a", "b"], ...], never both. */
mw_status mw__tok_read_merges_json(mw__loader *ld, const mw__json_node *arr) {
    const mw__json *doc = ld->doc;
    char buf[96], p[48], why[256];
    if (arr->type != MW__JSON_ARRAY)
        return mw__tok_fail_at(ld, arr, MW_ERR_FORMAT, "model.merges",
                               "expected an array of merges, found %s",
                               mw__tok_what(ld, arr, buf, sizeof buf));
    mw_status st = merges_init(ld, arr->count);
    if (st) return st;
    int form = -1; /* 0: strings, 1: pairs */
    uint32_t i = 0;
    for (const mw__json_node *c = mw__json_node_at(doc, arr->first); c;
         c = mw__json_node_at(doc, c->next), i++) {
        snprintf(p, sizeof p, "model.merges[%u]", i);
        const char *a, *b;
        size_t alen, blen;
        int kind = c->type == MW__JSON_STRING ? 0 : c->type == MW__JSON_ARRAY ? 1 : -1;
        if (kind < 0 || (form >= 0 && kind != form))
            return mw__tok_fail_at(ld, c, MW_ERR_FORMAT, p, "expected %s, found %s",
                                   form == 0   ? "a string \"a b\" like the merges before it"
                                   : form == 1 ? "a pair [\"a\", \"b\"] like the merges before it"
                                               : "a string \"a b\" or a pair [\"a\", \"b\"]",
                                   mw__tok_what(ld, c, buf, sizeof buf));
        form = kind;
        if (kind == 0) {
            const char *s = mw__json_str(doc, c);
            size_t space;
            if (is_version_line(s, c->len)) continue;
            if (!split_merge(s, c->len, &space)) {
                char q[64];
                return mw__tok_fail_at(ld, c, MW_ERR_FORMAT, p,
                                       "%s is not two tokens separated by one space",
                                       mw__tok_quote(s, c->len, q, sizeof q));
            }
            a = s;
            alen = space;
            b = s + space + 1;
            blen = c->len - space - 1;
        } else {
            const mw__json_node *x = mw__json_node_at(doc, c->first);
            const mw__json_node *y = x ? mw__json_node_at(doc, x->next) : NULL;
            if (c->count != 2 || x->type != MW__JSON_STRING || y->type != MW__JSON_STRING)
                return mw__tok_fail_at(ld, c, MW_ERR_FORMAT, p,
                                       "a merge must be a pair of two strings");
            a = mw__json_str(doc, x);
            alen = x->len;
            b = mw__json_str(doc, y);
            blen = y->len;
        }
        st = add_merge(ld, a, alen, b, blen, why, sizeof why);
        if (st == MW_ERR_FORMAT) return mw__tok_fail_at(ld, c, st, p, "%s", why);
        if (st) return st;
    }
    return MW_OK;
}

/* merges.txt: one "a b" per line; "#version" lines skipped. */
mw_status mw__tok_read_merges_txt(mw__loader *ld, const char *text, size_t n, const char *label) {
    size_t lines = 0;
    for (size_t i = 0; i < n; i++) lines += text[i] == '\n';
    mw_status st = merges_init(ld, lines + 1);
    if (st) return st;
    char why[256], q[64];
    size_t line = 0;
    for (size_t pos = 0; pos < n;) {
        const char *s = text + pos, *nl = memchr(s, '\n', n - pos);
        size_t len = nl ? (size_t)(nl - s) : n - pos, space;
        pos += len + (nl != NULL);
        line++;
        if (len && s[len - 1] == '\r') len--;
        for (size_t k = 0; k < len;) {
            uint32_t cp;
            size_t l = mw__utf8_decode((const uint8_t *)s + k, len - k, &cp);
            if (!l)
                return mw__error(MW_ERR_FORMAT, "%s:%zu: invalid UTF-8 (byte 0x%02x at column %zu)",
                                 label, line, (unsigned char)s[k], k + 1);
            k += l;
        }
        if (is_version_line(s, len)) continue;
        if (!split_merge(s, len, &space))
            return mw__error(MW_ERR_FORMAT, "%s:%zu: %s is not two tokens separated by one space%s",
                             label, line, mw__tok_quote(s, len, q, sizeof q),
                             len ? "" : " (an empty line)");
        st = add_merge(ld, s, space, s + space + 1, len - space - 1, why, sizeof why);
        if (st == MW_ERR_FORMAT) return mw__error(st, "%s:%zu: %s", label, line, why);
        if (st) return st;
    }
    return MW_OK;
}
