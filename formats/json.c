/* A strict JSON reader that remembers where each value starts (json.h). Recursive descent over
 * the borrowed text; strings decoded into one buffer as long as the text, which no decoding can
 * outgrow: a string's decoded bytes and the NUL after them take no more room than its quotes and
 * the text between them. */
#include "formats/json.h"

#include <locale.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "formats/utf8.h"

#define MAX_DEPTH 128
#define MAX_SIZE ((size_t)UINT32_MAX - 1) /* offsets are 32-bit */

typedef struct parser {
    mw__json *doc;
    const unsigned char *s;
    size_t n, pos;
    int depth, max_depth;
    const char *part; /* mw__json_options.part */
    void (*member)(const char *key, size_t klen, char *buf, size_t size); /* and .member */
    int in_member;                    /* inside the value of a member of the top-level object, */
    uint32_t member_key, member_klen; /* whose key this is */
} parser;

const char *mw__json_type_name(mw__json_type t) {
    switch (t) {
    case MW__JSON_NULL: return "null";
    case MW__JSON_FALSE:
    case MW__JSON_TRUE: return "a boolean";
    case MW__JSON_NUMBER: return "a number";
    case MW__JSON_STRING: return "a string";
    case MW__JSON_ARRAY: return "an array";
    case MW__JSON_OBJECT: return "an object";
    }
    return "a value";
}

void mw__json_where(const mw__json *doc, size_t offset, char *buf, size_t size) {
    size_t line = 1, col = 1;
    if (offset > doc->size) offset = doc->size;
    for (size_t i = 0; i < offset; i++) {
        unsigned char c = (unsigned char)doc->text[i];
        if (c == '\n') {
            line++;
            col = 1;
        } else if ((c & 0xC0) != 0x80) {
            col++;
        }
    }
    snprintf(buf, size, "%zu:%zu", line, col);
}

static mw_status syntax(parser *p, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static mw_status syntax(parser *p, const char *fmt, ...) {
    char msg[192], where[48];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char in[160] = "";
    if (p->member && p->in_member)
        p->member(p->doc->strings + p->member_key, p->member_klen, in, sizeof in);
    if (p->part)
        return mw__error(MW_ERR_FORMAT, "%s: %sJSON syntax: %s (%s byte %zu%s%s%s)", p->doc->label,
                         in, msg, p->part, p->pos, p->pos >= p->n ? ", where the " : "",
                         p->pos >= p->n ? p->part : "", p->pos >= p->n ? " ends" : "");
    mw__json_where(p->doc, p->pos, where, sizeof where);
    return mw__error(MW_ERR_FORMAT, "%s:%s: %sJSON syntax: %s%s", p->doc->label, where, in, msg,
                     p->pos >= p->n ? " (the file ends here: truncated?)" : "");
}

static void skip_ws(parser *p) {
    while (p->pos < p->n) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

/* What is at the current position, for messages. */
static const char *found(parser *p) {
    static _Thread_local char buf[64];
    if (p->pos >= p->n && p->part) {
        snprintf(buf, sizeof buf, "the end of the %.40s", p->part);
        return buf;
    }
    if (p->pos >= p->n) return "the end of the file";
    unsigned char c = p->s[p->pos];
    if (c >= 0x20 && c < 0x7F)
        snprintf(buf, sizeof buf, "'%c'", c);
    else
        snprintf(buf, sizeof buf, "byte 0x%02x", c);
    return buf;
}

static mw_status new_node(parser *p, mw__json_type type, uint32_t *out) {
    mw__json *d = p->doc;
    if (d->nnodes == d->cap) {
        if (d->cap >= UINT32_MAX / 2) return syntax(p, "too many values");
        uint32_t cap = d->cap ? 2 * d->cap : 256;
        mw__json_node *nodes = mw__realloc(d->nodes, (size_t)cap * sizeof *nodes);
        if (!nodes) return mw__error(MW_ERR_NOMEM, "out of memory reading %s", d->label);
        d->nodes = nodes;
        d->cap = cap;
    }
    *out = d->nnodes++;
    d->nodes[*out] = (mw__json_node){
        .type = type, .offset = (uint32_t)p->pos, .first = MW__JSON_NONE, .next = MW__JSON_NONE};
    return MW_OK;
}

static int hex4(const unsigned char *s, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'a' && c <= 'f')
            v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* A string at the current position (on its opening quote), decoded to doc->strings: where it
 * starts there and its length. */
static mw_status string(parser *p, uint32_t *str, uint32_t *len) {
    mw__json *d = p->doc;
    uint8_t *o = (uint8_t *)d->strings + d->nstrings;
    size_t k = 0;
    p->pos++; /* the opening quote */
    for (;;) {
        if (p->pos >= p->n) return syntax(p, "unterminated string");
        unsigned char c = p->s[p->pos];
        if (c == '"') break;
        if (c < 0x20) return syntax(p, "control character 0x%02x in a string (escape it)", c);
        if (c != '\\') {
            uint32_t cp;
            size_t l = mw__utf8_decode(p->s + p->pos, p->n - p->pos, &cp);
            if (!l) return syntax(p, "invalid UTF-8 (byte 0x%02x) in a string", c);
            memcpy(o + k, p->s + p->pos, l);
            k += l;
            p->pos += l;
            continue;
        }
        if (p->pos + 1 >= p->n) {
            p->pos++;
            return syntax(p, "unterminated string");
        }
        unsigned char e = p->s[p->pos + 1];
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        const char *hit = e ? strchr(from, e) : NULL;
        if (hit) {
            o[k++] = (uint8_t)to[hit - from];
            p->pos += 2;
            continue;
        }
        uint32_t cp, lo;
        if (e != 'u')
            return syntax(p, "bad escape '\\%c' in a string", e >= 0x20 && e < 0x7F ? e : '?');
        if (p->pos + 6 > p->n || hex4(p->s + p->pos + 2, &cp))
            return syntax(p, "\\u must be followed by four hexadecimal digits");
        if (cp >= 0xDC00 && cp <= 0xDFFF) return syntax(p, "lone trailing surrogate \\u%04x", cp);
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (p->pos + 12 > p->n || p->s[p->pos + 6] != '\\' || p->s[p->pos + 7] != 'u' ||
                hex4(p->s + p->pos + 8, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                return syntax(p, "lone leading surrogate \\u%04x", cp);
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            p->pos += 6;
        }
        p->pos += 6;
        k += mw__utf8_encode(cp, o + k);
    }
    p->pos++; /* the closing quote */
    o[k] = '\0';
    *str = (uint32_t)d->nstrings;
    *len = (uint32_t)k;
    d->nstrings += k + 1;
    return MW_OK;
}

static mw_status number(parser *p, mw__json_node *node) {
    size_t start = p->pos;
    int neg = 0;
    if (p->s[p->pos] == '-') {
        neg = 1;
        p->pos++;
    }
    if (p->pos >= p->n || p->s[p->pos] < '0' || p->s[p->pos] > '9')
        return syntax(p, "expected a digit, found %s", found(p));
    /* The magnitude, up to 2^63 for a negative number (INT64_MIN) and 2^63 - 1 otherwise. */
    uint64_t v = 0, limit = (uint64_t)INT64_MAX + (uint64_t)neg;
    int fits = 1;
    if (p->s[p->pos] == '0') {
        p->pos++;
        if (p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9')
            return syntax(p, "a number with a leading zero");
    } else {
        while (p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
            unsigned dgt = p->s[p->pos++] - '0';
            if (fits && v <= (limit - dgt) / 10)
                v = v * 10 + dgt;
            else
                fits = 0;
        }
    }
    int integer = 1;
    if (p->pos < p->n && p->s[p->pos] == '.') {
        integer = 0;
        p->pos++;
        if (p->pos >= p->n || p->s[p->pos] < '0' || p->s[p->pos] > '9')
            return syntax(p, "expected a digit after the decimal point, found %s", found(p));
        while (p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
    }
    if (p->pos < p->n && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
        integer = 0;
        p->pos++;
        if (p->pos < p->n && (p->s[p->pos] == '+' || p->s[p->pos] == '-')) p->pos++;
        if (p->pos >= p->n || p->s[p->pos] < '0' || p->s[p->pos] > '9')
            return syntax(p, "expected a digit in the exponent, found %s", found(p));
        while (p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
    }
    node->str = (uint32_t)start;
    node->len = (uint32_t)(p->pos - start);
    node->is_integer = integer && fits;
    node->ival = !node->is_integer         ? 0
                 : !neg                    ? (int64_t)v
                 : v > (uint64_t)INT64_MAX ? INT64_MIN
                                           : -(int64_t)v;
    return MW_OK;
}

static mw_status literal(parser *p, const char *word) {
    size_t n = strlen(word);
    if (p->n - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
        return syntax(p, "expected a value, found %s", found(p));
    p->pos += n;
    return MW_OK;
}

static mw_status value(parser *p, uint32_t *out);

/* The children of an array or object whose opening bracket is at the current position. */
static mw_status container(parser *p, uint32_t self, int object) {
    char close = object ? '}' : ']';
    if (++p->depth > p->max_depth) /* placed at the bracket that opens one level too many */
        return syntax(p, "more than %d level%s of nesting", p->max_depth,
                      p->max_depth == 1 ? "" : "s");
    p->pos++;
    skip_ws(p);
    uint32_t last = MW__JSON_NONE, count = 0;
    if (p->pos < p->n && p->s[p->pos] == close) {
        p->pos++;
        p->depth--;
        return MW_OK;
    }
    for (;;) {
        uint32_t key = 0, klen = 0, child;
        mw_status st;
        skip_ws(p);
        if (object) {
            if (p->pos >= p->n || p->s[p->pos] != '"')
                return syntax(p, "expected a member name (a string), found %s", found(p));
            if ((st = string(p, &key, &klen))) return st;
            skip_ws(p);
            if (p->pos >= p->n || p->s[p->pos] != ':')
                return syntax(p, "expected ':' after a member name, found %s", found(p));
            p->pos++;
        }
        int top = object && p->depth == 1;
        if (top) {
            p->in_member = 1;
            p->member_key = key;
            p->member_klen = klen;
        }
        if ((st = value(p, &child))) return st;
        if (top) p->in_member = 0;
        mw__json_node *c = &p->doc->nodes[child];
        c->key = key;
        c->klen = klen;
        if (last == MW__JSON_NONE)
            p->doc->nodes[self].first = child;
        else
            p->doc->nodes[last].next = child;
        last = child;
        count++;
        skip_ws(p);
        if (p->pos < p->n && p->s[p->pos] == ',') {
            p->pos++;
            skip_ws(p);
            if (p->pos < p->n && p->s[p->pos] == close)
                return syntax(p, "a trailing comma before '%c'", close);
            continue;
        }
        if (p->pos < p->n && p->s[p->pos] == close) break;
        return syntax(p, "expected ',' or '%c' in %s, found %s", close,
                      object ? "an object" : "an array", found(p));
    }
    p->pos++;
    p->doc->nodes[self].count = count;
    p->depth--;
    return MW_OK;
}

static mw_status value(parser *p, uint32_t *out) {
    skip_ws(p);
    if (p->pos >= p->n) return syntax(p, "expected a value");
    unsigned char c = p->s[p->pos];
    mw__json_type t = c == '{'   ? MW__JSON_OBJECT
                      : c == '[' ? MW__JSON_ARRAY
                      : c == '"' ? MW__JSON_STRING
                      : c == 't' ? MW__JSON_TRUE
                      : c == 'f' ? MW__JSON_FALSE
                      : c == 'n' ? MW__JSON_NULL
                                 : MW__JSON_NUMBER;
    if (t == MW__JSON_NUMBER && c != '-' && (c < '0' || c > '9'))
        return syntax(p, "expected a value, found %s", found(p));
    mw_status st = new_node(p, t, out);
    if (st) return st;
    switch (t) {
    case MW__JSON_OBJECT:
    case MW__JSON_ARRAY: return container(p, *out, t == MW__JSON_OBJECT);
    case MW__JSON_STRING: {
        uint32_t str, len;
        if ((st = string(p, &str, &len))) return st;
        p->doc->nodes[*out].str = str;
        p->doc->nodes[*out].len = len;
        return MW_OK;
    }
    case MW__JSON_TRUE: return literal(p, "true");
    case MW__JSON_FALSE: return literal(p, "false");
    case MW__JSON_NULL: return literal(p, "null");
    case MW__JSON_NUMBER: return number(p, &p->doc->nodes[*out]);
    }
    return MW_OK;
}

void mw__json_free(mw__json *doc) {
    if (!doc) return;
    mw__free(doc->nodes);
    mw__free(doc->strings);
    mw__free(doc);
}

mw_status mw__json_parse_with(const char *text, size_t size, const char *label,
                              const mw__json_options *opt, mw__json **out) {
    static const mw__json_options defaults = {0};
    if (!opt) opt = &defaults;
    *out = NULL;
    if (size > MAX_SIZE)
        return mw__error(MW_ERR_FORMAT, "%s: %zu bytes is more than the %zu a JSON file may have",
                         label, size, MAX_SIZE);
    mw__json *doc = mw__calloc(1, sizeof *doc);
    if (!doc) return mw__error(MW_ERR_NOMEM, "out of memory reading %s", label);
    doc->text = text;
    doc->size = size;
    snprintf(doc->label, sizeof doc->label, "%s", label);
    doc->strings = mw__malloc(size ? size : 1);
    if (!doc->strings) {
        mw__json_free(doc);
        return mw__error(MW_ERR_NOMEM, "out of memory reading %s", label);
    }
    parser p = {.doc = doc,
                .s = (const unsigned char *)text,
                .n = size,
                .max_depth =
                    opt->max_depth > 0 && opt->max_depth < MAX_DEPTH ? opt->max_depth : MAX_DEPTH,
                .part = opt->part,
                .member = opt->member};
    uint32_t root;
    mw_status st = value(&p, &root);
    if (st == MW_OK) {
        skip_ws(&p);
        if (p.pos < p.n && !opt->prefix)
            st = syntax(&p, "%s after the end of the top-level value", found(&p));
    }
    if (st) {
        mw__json_free(doc);
        return st;
    }
    doc->end = p.pos;
    *out = doc;
    return MW_OK;
}

mw_status mw__json_parse(const char *text, size_t size, const char *label, mw__json **out) {
    return mw__json_parse_with(text, size, label, NULL, out);
}

const mw__json_node *mw__json_get(const mw__json *doc, const mw__json_node *obj, const char *key) {
    if (!obj || obj->type != MW__JSON_OBJECT) return NULL;
    size_t n = strlen(key);
    for (const mw__json_node *c = mw__json_node_at(doc, obj->first); c;
         c = mw__json_node_at(doc, c->next))
        if (c->klen == n && memcmp(mw__json_key(doc, c), key, n) == 0) return c;
    return NULL;
}

const mw__json_node *mw__json_duplicate(const mw__json *doc, const mw__json_node *obj,
                                        const char *const *keys) {
    for (const char *const *k = keys; *k; k++) {
        const mw__json_node *first = mw__json_get(doc, obj, *k);
        if (!first) continue;
        size_t n = strlen(*k);
        for (const mw__json_node *c = mw__json_node_at(doc, first->next); c;
             c = mw__json_node_at(doc, c->next))
            if (c->klen == n && memcmp(mw__json_key(doc, c), *k, n) == 0) return c;
    }
    return NULL;
}

const mw__json_node *mw__json_repeated(const mw__json *doc, const mw__json_node *obj) {
    if (!obj || obj->type != MW__JSON_OBJECT) return NULL;
    for (const mw__json_node *c = mw__json_node_at(doc, obj->first); c;
         c = mw__json_node_at(doc, c->next))
        for (const mw__json_node *e = mw__json_node_at(doc, obj->first); e != c;
             e = mw__json_node_at(doc, e->next))
            if (e->klen == c->klen &&
                memcmp(mw__json_key(doc, e), mw__json_key(doc, c), c->klen) == 0)
                return c;
    return NULL;
}

mw_status mw__json_double(const mw__json *doc, const mw__json_node *n, double *out) {
    if (!n || n->type != MW__JSON_NUMBER)
        return mw__error(MW_ERR_INVALID, "%s: mw__json_double: not a number", doc->label);
    /* strtod reads the locale's decimal point: the text's '.' becomes it. */
    const char *point = localeconv()->decimal_point;
    size_t plen = point && *point ? strlen(point) : 1;
    if (!point || !*point) point = ".";
    char small[128], *buf = small;
    size_t need = (size_t)n->len + plen + 1;
    if (need > sizeof small && !(buf = mw__malloc(need)))
        return mw__error(MW_ERR_NOMEM, "out of memory reading a number of %s", doc->label);
    size_t k = 0;
    for (uint32_t i = 0; i < n->len; i++) {
        char c = doc->text[n->str + i];
        if (c == '.') {
            memcpy(buf + k, point, plen);
            k += plen;
        } else {
            buf[k++] = c;
        }
    }
    buf[k] = '\0';
    *out = strtod(buf, NULL);
    if (buf != small) mw__free(buf);
    return MW_OK;
}
