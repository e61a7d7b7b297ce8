/* safetensors files: a strict reader (the whole header is checked before any tensor is used; the
 * writer is safetensors_write.c). Layout: u64 little-endian header length N | N bytes of JSON
 * (UTF-8, maybe padded with spaces) | data. The JSON is an object: "__metadata__" -> {string:
 * string}, and per tensor name -> {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
 * offsets relative to the data section, which the tensors must tile exactly. */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/file.h"
#include "meshwit.h"

#define MAX_HEADER ((uint64_t)100 << 20) /* the safetensors package's own bound */
#define MAX_DEPTH 4

typedef struct st_tensor {
    char *name;
    const char *dtype; /* static string */
    int esize;         /* bytes per element */
    int rank;
    int64_t shape[MW_MAX_RANK];
    int64_t count;
    uint64_t begin, end;
} st_tensor;

struct mw_safetensors {
    unsigned char *buf;
    size_t size;
    const unsigned char *data; /* the data section */
    uint64_t data_size;
    char label[256];
    st_tensor *t;
    int n, cap;
    int *by_name; /* tensor indices sorted by name */
    char **meta;  /* key, value, key, value, ... */
    int nmeta, meta_cap;
};

static const struct {
    const char *name;
    int size;
} dtypes[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
              {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
              {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};

/* --- the JSON header ----------------------------------------------------------------------- */

typedef struct parser {
    const char *s;
    size_t n, pos;
    mw_safetensors *f;
    const char *tensor; /* the tensor being read, for messages */
} parser;

static mw_status fail(parser *p, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static mw_status fail(parser *p, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->tensor)
        return mw__error(MW_ERR_FORMAT, "%s: tensor '%.80s': %s (header byte %zu)", p->f->label,
                         p->tensor, msg, p->pos);
    return mw__error(MW_ERR_FORMAT, "%s: %s (header byte %zu)", p->f->label, msg, p->pos);
}

static void skip_ws(parser *p) {
    while (p->pos < p->n && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' || p->s[p->pos] == '\n' ||
                             p->s[p->pos] == '\r'))
        p->pos++;
}

/* Consumes c (after white space) or fails naming what was expected. */
static mw_status expect(parser *p, char c, const char *what) {
    skip_ws(p);
    if (p->pos < p->n && p->s[p->pos] == c) {
        p->pos++;
        return MW_OK;
    }
    if (p->pos >= p->n) return fail(p, "the header ends where %s was expected", what);
    return fail(p, "expected %s, found '%c'", what, p->s[p->pos]);
}

/* Consumes c when it comes next (after white space). */
static int accept(parser *p, char c) {
    skip_ws(p);
    if (p->pos < p->n && p->s[p->pos] == c) {
        p->pos++;
        return 1;
    }
    return 0;
}

static int hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* Length of the UTF-8 sequence starting at s (at most avail bytes), or 0 when it is not valid
 * (overlong forms, surrogates and code points above U+10FFFF are not). */
static int utf8_len(const unsigned char *s, size_t avail) {
    unsigned c = s[0];
    int len = c < 0x80             ? 1
              : (c & 0xE0) == 0xC0 ? 2
              : (c & 0xF0) == 0xE0 ? 3
              : (c & 0xF8) == 0xF0 ? 4
                                   : 0;
    if (!len || (size_t)len > avail) return 0;
    unsigned cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    static const unsigned min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) return (size_t)(o[0] = (char)cp, 1);
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A JSON string, decoded into a new allocation (*out, owned by the caller). A string holding
 * U+0000 is refused: names are C strings. */
static mw_status string(parser *p, char **out) {
    *out = NULL;
    mw_status st = expect(p, '"', "a string");
    if (st) return st;
    size_t start = p->pos;
    /* Decoding never lengthens the text, so the raw length bounds the result. */
    size_t end = start;
    while (end < p->n && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
    if (end >= p->n) return fail(p, "unterminated string");
    char *o = mw__malloc(end - start + 1);
    if (!o) return mw__error(MW_ERR_NOMEM, "out of memory reading %s", p->f->label);
    size_t k = 0;
    while (p->s[p->pos] != '"') {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c < 0x20) {
            mw__free(o);
            return fail(p, "control character 0x%02x in a string", c);
        }
        if (c != '\\') {
            int len = utf8_len((const unsigned char *)p->s + p->pos, p->n - p->pos);
            if (!len) {
                mw__free(o);
                return fail(p, "invalid UTF-8 in a string");
            }
            memcpy(o + k, p->s + p->pos, (size_t)len);
            k += (size_t)len;
            p->pos += (size_t)len;
            continue;
        }
        char e = p->s[p->pos + 1];
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        const char *hit = e ? strchr(from, e) : NULL;
        if (hit) {
            o[k++] = to[hit - from];
            p->pos += 2;
            continue;
        }
        unsigned cp, lo;
        if (e != 'u' || p->pos + 6 > end || hex4(p->s + p->pos + 2, &cp)) {
            mw__free(o);
            return fail(p, "bad escape in a string");
        }
        p->pos += 6;
        if (cp >= 0xD800 && cp <= 0xDBFF) { /* a surrogate pair */
            if (p->pos + 6 > end || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u' ||
                hex4(p->s + p->pos + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                mw__free(o);
                return fail(p, "unpaired surrogate in a string");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            p->pos += 6;
        } else if ((cp >= 0xDC00 && cp <= 0xDFFF) || cp == 0) {
            mw__free(o);
            return fail(p, cp ? "unpaired surrogate in a string" : "U+0000 in a string");
        }
        k += put_utf8(o + k, cp);
    }
    o[k] = '\0';
    p->pos++; /* the closing quote */
    *out = o;
    return MW_OK;
}

/* A non-negative integer below 2^63, without sign, fraction, exponent or leading zeros. */
static mw_status integer(parser *p, uint64_t *out) {
    skip_ws(p);
    size_t start = p->pos;
    uint64_t v = 0;
    while (p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
        unsigned d = (unsigned)(p->s[p->pos] - '0');
        if (v > (UINT64_C(0x7FFFFFFFFFFFFFFF) - d) / 10) return fail(p, "integer too large");
        v = v * 10 + d;
        p->pos++;
    }
    if (p->pos == start) return fail(p, "expected a non-negative integer");
    if (p->s[start] == '0' && p->pos - start > 1) return fail(p, "integer with a leading zero");
    if (p->pos < p->n && (p->s[p->pos] == '.' || p->s[p->pos] == 'e' || p->s[p->pos] == 'E'))
        return fail(p, "expected an integer, found a fraction or exponent");
    *out = v;
    return MW_OK;
}

static mw_status metadata(parser *p) {
    mw_safetensors *f = p->f;
    if (f->meta) return fail(p, "\"__metadata__\" appears twice");
    f->meta = mw__calloc(8, sizeof *f->meta);
    if (!f->meta) return mw__error(MW_ERR_NOMEM, "out of memory reading %s", f->label);
    f->meta_cap = 4;
    mw_status st = expect(p, '{', "'{' opening \"__metadata__\"");
    if (st || accept(p, '}')) return st;
    do {
        if (f->nmeta == f->meta_cap) {
            char **m = mw__realloc(f->meta, (size_t)f->meta_cap * 4 * sizeof *m);
            if (!m) return mw__error(MW_ERR_NOMEM, "out of memory reading %s", f->label);
            /* The new pairs start empty: a value that fails to parse is freed as NULL. */
            memset(m + 2 * f->meta_cap, 0, (size_t)f->meta_cap * 2 * sizeof *m);
            f->meta = m;
            f->meta_cap *= 2;
        }
        char **kv = f->meta + 2 * f->nmeta;
        kv[1] = NULL;
        if ((st = string(p, &kv[0]))) return st;
        f->nmeta++; /* owned from here on, freed with the file */
        if ((st = expect(p, ':', "':'")) || (st = string(p, &kv[1]))) return st;
        for (int i = 0; i < f->nmeta - 1; i++)
            if (strcmp(f->meta[2 * i], kv[0]) == 0)
                return fail(p, "metadata key '%.80s' appears twice", kv[0]);
    } while (accept(p, ','));
    return expect(p, '}', "',' or '}' in \"__metadata__\"");
}

static mw_status tensor_fields(parser *p, st_tensor *t) {
    int seen_dtype = 0, seen_shape = 0, seen_offsets = 0;
    mw_status st = expect(p, '{', "'{' opening the tensor's entry");
    if (st) return st;
    if (accept(p, '}')) return fail(p, "the entry has no fields");
    do {
        char *key;
        if ((st = string(p, &key))) return st;
        int which = strcmp(key, "dtype") == 0          ? 0
                    : strcmp(key, "shape") == 0        ? 1
                    : strcmp(key, "data_offsets") == 0 ? 2
                                                       : -1;
        mw__free(key);
        if (which < 0) return fail(p, "unknown field (only dtype, shape, data_offsets)");
        int *seen = which == 0 ? &seen_dtype : which == 1 ? &seen_shape : &seen_offsets;
        if (*seen) return fail(p, "a field appears twice");
        *seen = 1;
        if ((st = expect(p, ':', "':'"))) return st;
        if (which == 0) {
            char *d;
            if ((st = string(p, &d))) return st;
            for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes && !t->dtype; i++)
                if (strcmp(d, dtypes[i].name) == 0) {
                    t->dtype = dtypes[i].name;
                    t->esize = dtypes[i].size;
                }
            if (!t->dtype) st = fail(p, "unknown dtype '%.20s'", d);
            mw__free(d);
            if (st) return st;
        } else if (which == 1) {
            if ((st = expect(p, '[', "'[' opening the shape"))) return st;
            t->count = 1;
            if (!accept(p, ']')) {
                do {
                    uint64_t v;
                    if (t->rank == MW_MAX_RANK)
                        return fail(p, "more than %d dimensions", MW_MAX_RANK);
                    if ((st = integer(p, &v))) return st;
                    if (v && (uint64_t)t->count > (UINT64_C(1) << 62) / v)
                        return fail(p, "the shape's element count overflows");
                    t->shape[t->rank++] = (int64_t)v;
                    t->count *= (int64_t)v;
                } while (accept(p, ','));
                if ((st = expect(p, ']', "',' or ']' in the shape"))) return st;
            }
        } else {
            if ((st = expect(p, '[', "'[' opening data_offsets")) || (st = integer(p, &t->begin)) ||
                (st = expect(p, ',', "',' between the two data_offsets")) ||
                (st = integer(p, &t->end)) ||
                (st = expect(p, ']', "']' after the two data_offsets")))
                return st;
        }
    } while (accept(p, ','));
    if ((st = expect(p, '}', "',' or '}' closing the tensor's entry"))) return st;
    if (!seen_dtype || !seen_shape || !seen_offsets)
        return fail(p, "the entry lacks %s",
                    !seen_dtype   ? "\"dtype\""
                    : !seen_shape ? "\"shape\""
                                  : "\"data_offsets\"");
    return MW_OK;
}

static mw_status header(parser *p) {
    mw_safetensors *f = p->f;
    skip_ws(p);
    mw_status st = expect(p, '{', "'{' opening the header");
    if (st || accept(p, '}')) return st;
    do {
        char *name;
        size_t at = p->pos;
        if ((st = string(p, &name))) return st;
        if ((st = expect(p, ':', "':'"))) {
            mw__free(name);
            return st;
        }
        if (strcmp(name, "__metadata__") == 0) {
            mw__free(name);
            if ((st = metadata(p))) return st;
            continue;
        }
        if (f->n == f->cap) {
            int cap = f->cap ? 2 * f->cap : 16;
            st_tensor *t = mw__realloc(f->t, (size_t)cap * sizeof *t);
            if (!t) {
                mw__free(name);
                return mw__error(MW_ERR_NOMEM, "out of memory reading %s", f->label);
            }
            f->t = t;
            f->cap = cap;
        }
        st_tensor *t = &f->t[f->n++];
        memset(t, 0, sizeof *t);
        t->name = name;
        if (!*name) {
            p->pos = at;
            return fail(p, "a tensor with an empty name");
        }
        p->tensor = name;
        if ((st = tensor_fields(p, t))) return st;
        p->tensor = NULL;
    } while (accept(p, ','));
    if ((st = expect(p, '}', "',' or '}' closing the header"))) return st;
    skip_ws(p);
    if (p->pos != p->n) return fail(p, "bytes after the header's closing '}'");
    return MW_OK;
}

/* --- checks across tensors ----------------------------------------------------------------- */

static const mw_safetensors *sort_file; /* qsort has no context argument in C11 */

static int by_name(const void *a, const void *b) {
    return strcmp(sort_file->t[*(const int *)a].name, sort_file->t[*(const int *)b].name);
}

static int by_offset(const void *a, const void *b) {
    const st_tensor *x = &sort_file->t[*(const int *)a], *y = &sort_file->t[*(const int *)b];
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

static pthread_mutex_t sort_lock = PTHREAD_MUTEX_INITIALIZER;

static mw_status check_layout(mw_safetensors *f) {
    for (int i = 0; i < f->n; i++) {
        st_tensor *t = &f->t[i];
        if (t->end < t->begin)
            return mw__error(MW_ERR_FORMAT,
                             "%s: tensor '%.80s': data_offsets [%llu, %llu] end "
                             "before they begin",
                             f->label, t->name, (unsigned long long)t->begin,
                             (unsigned long long)t->end);
        if ((uint64_t)t->count > (UINT64_C(1) << 62) / (uint64_t)t->esize)
            return mw__error(MW_ERR_FORMAT,
                             "%s: tensor '%.80s': %s with %lld elements: its size in bytes "
                             "overflows",
                             f->label, t->name, t->dtype, (long long)t->count);
        if ((uint64_t)t->count * (uint64_t)t->esize != t->end - t->begin)
            return mw__error(MW_ERR_FORMAT,
                             "%s: tensor '%.80s': %s with %lld elements needs %llu bytes but "
                             "data_offsets [%llu, %llu] hold %llu",
                             f->label, t->name, t->dtype, (long long)t->count,
                             (unsigned long long)t->count * (unsigned long long)t->esize,
                             (unsigned long long)t->begin, (unsigned long long)t->end,
                             (unsigned long long)(t->end - t->begin));
        if (t->end > f->data_size)
            return mw__error(MW_ERR_FORMAT,
                             "%s: tensor '%.80s': data_offsets [%llu, %llu] run past the %llu "
                             "bytes of data (the file is truncated?)",
                             f->label, t->name, (unsigned long long)t->begin,
                             (unsigned long long)t->end, (unsigned long long)f->data_size);
    }
    int *order = mw__malloc((size_t)(f->n ? f->n : 1) * sizeof *order);
    f->by_name = mw__malloc((size_t)(f->n ? f->n : 1) * sizeof *f->by_name);
    if (!order || !f->by_name) {
        mw__free(order);
        return mw__error(MW_ERR_NOMEM, "out of memory reading %s", f->label);
    }
    for (int i = 0; i < f->n; i++) order[i] = f->by_name[i] = i;
    pthread_mutex_lock(&sort_lock);
    sort_file = f;
    qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, by_name);
    qsort(order, (size_t)f->n, sizeof *order, by_offset);
    pthread_mutex_unlock(&sort_lock);
    mw_status st = MW_OK;
    for (int i = 1; i < f->n && st == MW_OK; i++)
        if (strcmp(f->t[f->by_name[i]].name, f->t[f->by_name[i - 1]].name) == 0)
            st = mw__error(MW_ERR_FORMAT, "%s: tensor '%.80s' appears twice in the header",
                           f->label, f->t[f->by_name[i]].name);
    /* The tensors tile the data: each begins where the previous one ends. */
    uint64_t at = 0;
    for (int i = 0; i < f->n && st == MW_OK; i++) {
        const st_tensor *t = &f->t[order[i]];
        if (t->begin != at)
            st = mw__error(MW_ERR_FORMAT,
                           "%s: tensor '%.80s' begins at data byte %llu but the data before it "
                           "ends at %llu (%s)",
                           f->label, t->name, (unsigned long long)t->begin, (unsigned long long)at,
                           t->begin > at ? "a gap" : "it overlaps another tensor");
        at = t->end;
    }
    if (st == MW_OK && at != f->data_size)
        st = mw__error(MW_ERR_FORMAT,
                       "%s: the tensors end at data byte %llu but the file holds %llu bytes of "
                       "data after the header",
                       f->label, (unsigned long long)at, (unsigned long long)f->data_size);
    mw__free(order);
    return st;
}

/* --- reading ------------------------------------------------------------------------------- */

void mw_safetensors_close(mw_safetensors *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) mw__free(f->t[i].name);
    for (int i = 0; i < 2 * f->nmeta; i++) mw__free(f->meta[i]);
    mw__free(f->meta);
    mw__free(f->t);
    mw__free(f->by_name);
    mw__free(f->buf);
    mw__free(f);
}

/* Checks the length prefix and parses and checks the header of a file of `size` bytes whose
 * first bytes (at least 8 + the header's length, when the prefix is sane) are in buf; the data
 * section is not read. On success *hlen is the header's length. */
static mw_status parse_head(mw_safetensors *f, const unsigned char *buf, size_t avail, size_t size,
                            uint64_t *hlen_out) {
    const char *label = f->label;
    uint64_t hlen = 0;
    if (size < 8 || avail < 8)
        return mw__error(MW_ERR_FORMAT, "%s: %zu bytes is too short for a safetensors file", label,
                         size);
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    if (hlen > MAX_HEADER || hlen > size - 8)
        return mw__error(MW_ERR_FORMAT,
                         "%s: the header length %llu at byte 0 is more than the %zu bytes after "
                         "it%s",
                         label, (unsigned long long)hlen, size - 8,
                         hlen > MAX_HEADER ? " (or the 100 MB limit)" : "");
    if (hlen < 2)
        return mw__error(MW_ERR_FORMAT, "%s: a header of %llu bytes cannot hold a JSON object",
                         label, (unsigned long long)hlen);
    if (avail < 8 + hlen) return mw__error(MW_ERR_IO, "%s: the header was not read", label);
    f->data_size = size - 8 - hlen;
    parser p = {.s = (const char *)buf + 8, .n = (size_t)hlen, .f = f};
    mw_status st = header(&p);
    if (st == MW_OK) st = check_layout(f);
    *hlen_out = hlen;
    return st;
}

static mw_safetensors *new_file(const char *label) {
    mw_safetensors *f = mw__calloc(1, sizeof *f);
    if (!f) {
        mw__error(MW_ERR_NOMEM, "out of memory reading %s", label);
        return NULL;
    }
    snprintf(f->label, sizeof f->label, "%s", label);
    return f;
}

/* Takes ownership of buf (size bytes). */
static mw_status parse_owned(unsigned char *buf, size_t size, const char *label,
                             mw_safetensors **out) {
    mw_safetensors *f = new_file(label);
    if (!f) {
        mw__free(buf);
        return MW_ERR_NOMEM;
    }
    f->buf = buf;
    f->size = size;
    uint64_t hlen = 0;
    mw_status st = parse_head(f, buf, size, size, &hlen);
    if (st) {
        mw_safetensors_close(f);
        return st;
    }
    f->data = buf + 8 + hlen;
    *out = f;
    return MW_OK;
}

mw_status mw_safetensors_parse(const void *data, size_t size, const char *label,
                               mw_safetensors **out) {
    if (!out || (size && !data))
        return mw__error(MW_ERR_INVALID, "mw_safetensors_parse: NULL argument");
    *out = NULL;
    unsigned char *buf = mw__malloc(size ? size : 1);
    if (!buf) return mw__error(MW_ERR_NOMEM, "out of memory reading %s", label ? label : "data");
    if (size) memcpy(buf, data, size);
    return parse_owned(buf, size, label ? label : "safetensors data", out);
}

mw_status mw_safetensors_open(const char *path, mw_safetensors **out) {
    if (!path || !out) return mw__error(MW_ERR_INVALID, "mw_safetensors_open: NULL argument");
    *out = NULL;
    int fd;
    int64_t size;
    mw_status st = mw__file_open_read(path, "safetensors file", &fd, &size);
    if (st) return st;
    if ((uint64_t)size > (uint64_t)SIZE_MAX - 1) {
        close(fd);
        return mw__error(MW_ERR_NOMEM, "%s: %lld bytes do not fit this process's memory", path,
                         (long long)size);
    }
    /* The length prefix and the header are read and checked before the data: a file that is
     * not one costs no more than its header. */
    mw_safetensors *f = new_file(path);
    unsigned char prefix[8];
    uint64_t hlen = 0;
    if (!f) st = MW_ERR_NOMEM;
    if (st == MW_OK && size >= 8) st = mw__file_read_at(fd, prefix, 8, 0, path);
    if (st == MW_OK) {
        for (int i = 7; i >= 0 && size >= 8; i--) hlen = hlen << 8 | prefix[i];
        /* Whatever is wrong with the prefix, parse_head says it without more than 8 bytes. */
        size_t head = size >= 8 && hlen <= MAX_HEADER && hlen <= (uint64_t)size - 8
                          ? (size_t)(8 + hlen)
                          : (size >= 8 ? 8 : (size_t)size);
        if (!(f->buf = mw__malloc(head ? head : 1)))
            st = mw__error(MW_ERR_NOMEM, "out of memory reading %s", path);
        if (st == MW_OK) st = mw__file_read_at(fd, f->buf, head, 0, path);
        if (st == MW_OK) st = parse_head(f, f->buf, head, (size_t)size, &hlen);
    }
    if (st == MW_OK) {
        unsigned char *all = mw__realloc(f->buf, (size_t)size + 1);
        if (!all)
            st = mw__error(MW_ERR_NOMEM, "out of memory reading %s (%lld bytes)", path,
                           (long long)size);
        else
            f->buf = all;
    }
    if (st == MW_OK)
        st = mw__file_read_at(fd, f->buf + 8 + hlen, (size_t)size - 8 - (size_t)hlen,
                              (int64_t)(8 + hlen), path);
    close(fd);
    if (st) {
        mw_safetensors_close(f);
        return st;
    }
    f->size = (size_t)size;
    f->data = f->buf + 8 + hlen;
    *out = f;
    return MW_OK;
}

int mw_safetensors_count(const mw_safetensors *f) { return f ? f->n : 0; }

static void info(const st_tensor *t, mw_stored_tensor *out) {
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->dtype = t->dtype;
    out->rank = t->rank;
    memcpy(out->shape, t->shape, sizeof t->shape);
    out->count = t->count;
}

mw_status mw_safetensors_tensor(const mw_safetensors *f, int i, mw_stored_tensor *out) {
    if (!f || !out || i < 0 || i >= f->n)
        return mw__error(MW_ERR_INVALID, "mw_safetensors_tensor: NULL argument or index %d", i);
    info(&f->t[i], out);
    return MW_OK;
}

static const st_tensor *lookup(const mw_safetensors *f, const char *name) {
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(f->t[f->by_name[mid]].name, name);
        if (c == 0) return &f->t[f->by_name[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    mw__error(MW_ERR_NOT_FOUND, "%s has no tensor named '%s'", f->label, name);
    return NULL;
}

mw_status mw_safetensors_find(const mw_safetensors *f, const char *name, mw_stored_tensor *out) {
    if (!f || !name || !out) return mw__error(MW_ERR_INVALID, "mw_safetensors_find: NULL argument");
    const st_tensor *t = lookup(f, name);
    if (!t) return MW_ERR_NOT_FOUND;
    info(t, out);
    return MW_OK;
}

const char *mw_safetensors_metadata(const mw_safetensors *f, const char *key) {
    for (int i = 0; f && key && i < f->nmeta; i++)
        if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
    return NULL;
}

/* IEEE half to float, exactly (subnormals included). */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = h >> 10 & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | man << 13;
    } else if (exp) {
        bits = sign | (exp + 112) << 23 | man << 13;
    } else if (man) { /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        bits = sign | (uint32_t)(112 - e) << 23 | (man & 0x3FF) << 13;
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

mw_status mw_safetensors_read(const mw_safetensors *f, const char *name, float *dst,
                              int64_t count) {
    if (!f || !name || (count && !dst))
        return mw__error(MW_ERR_INVALID, "mw_safetensors_read: NULL argument");
    const st_tensor *t = lookup(f, name);
    if (!t) return MW_ERR_NOT_FOUND;
    if (count != t->count)
        return mw__error(MW_ERR_SHAPE, "%s: tensor '%s' has %lld elements, not %lld", f->label,
                         name, (long long)t->count, (long long)count);
    const unsigned char *src = f->data + t->begin;
    if (strcmp(t->dtype, "F32") == 0) {
        memcpy(dst, src, (size_t)count * 4); /* the file and the host are little-endian */
    } else if (strcmp(t->dtype, "F16") == 0 || strcmp(t->dtype, "BF16") == 0) {
        int bf = t->dtype[0] == 'B';
        for (int64_t i = 0; i < count; i++) {
            uint16_t h = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
            uint32_t bits = (uint32_t)h << 16;
            if (bf)
                memcpy(&dst[i], &bits, sizeof bits);
            else
                dst[i] = half_to_float(h);
        }
    } else {
        return mw__error(MW_ERR_DTYPE, "%s: tensor '%s' is %s; only F32, F16 and BF16 read as f32",
                         f->label, name, t->dtype);
    }
    return MW_OK;
}
