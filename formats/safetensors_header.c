/* A safetensors header, read strictly (safetensors_impl.h): the JSON through formats/json, then
 * every tensor's entry, the metadata and the checks across tensors, before any tensor is used.
 * Every message names the file, the tensor when there is one, and the header byte where the
 * offending value starts. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "formats/safetensors_impl.h"

/* The header is an object of entries of arrays: a fourth level is never valid. */
#define MAX_DEPTH 4

static const struct {
    const char *name;
    int size;
} dtypes[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
              {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
              {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};

static mw_status fail(const mw_safetensors *f, const char *tensor, size_t at, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static mw_status fail(const mw_safetensors *f, const char *tensor, size_t at, const char *fmt,
                      ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (tensor)
        return mw__error(MW_ERR_FORMAT, "%s: tensor '%.80s': %s (header byte %zu)", f->label,
                         tensor, msg, at);
    return mw__error(MW_ERR_FORMAT, "%s: %s (header byte %zu)", f->label, msg, at);
}

static int is_key(const mw__json *doc, const mw__json_node *n, const char *key) {
    return n->klen == strlen(key) && memcmp(mw__json_key(doc, n), key, n->klen) == 0;
}

/* A non-negative integer below 2^63, written without sign, fraction or exponent. */
static mw_status integer(const mw_safetensors *f, const char *tensor, const mw__json_node *n,
                         uint64_t *out) {
    const mw__json *doc = f->header;
    if (n->type != MW__JSON_NUMBER)
        return fail(f, tensor, n->offset, "expected a non-negative integer, found %s",
                    mw__json_type_name(n->type));
    const char *text = doc->text + n->str;
    if (text[0] == '-') return fail(f, tensor, n->offset, "expected a non-negative integer");
    if (!n->is_integer)
        return memchr(text, '.', n->len) || memchr(text, 'e', n->len) || memchr(text, 'E', n->len)
                   ? fail(f, tensor, n->offset, "expected an integer, found a fraction or exponent")
                   : fail(f, tensor, n->offset, "integer too large");
    *out = (uint64_t)n->ival;
    return MW_OK;
}

static mw_status shape(const mw_safetensors *f, mw__st_tensor *t, const mw__json_node *v) {
    const mw__json *doc = f->header;
    if (v->type != MW__JSON_ARRAY)
        return fail(f, t->name, v->offset, "expected '[' opening the shape, found %s",
                    mw__json_type_name(v->type));
    t->count = 1;
    for (const mw__json_node *d = mw__json_node_at(doc, v->first); d;
         d = mw__json_node_at(doc, d->next)) {
        uint64_t n;
        mw_status st;
        if (t->rank == MW_MAX_RANK)
            return fail(f, t->name, d->offset, "more than %d dimensions", MW_MAX_RANK);
        if ((st = integer(f, t->name, d, &n))) return st;
        if (n && (uint64_t)t->count > (UINT64_C(1) << 62) / n)
            return fail(f, t->name, d->offset, "the shape's element count overflows");
        t->shape[t->rank++] = (int64_t)n;
        t->count *= (int64_t)n;
    }
    return MW_OK;
}

static mw_status offsets(const mw_safetensors *f, mw__st_tensor *t, const mw__json_node *v) {
    const mw__json *doc = f->header;
    if (v->type != MW__JSON_ARRAY)
        return fail(f, t->name, v->offset, "expected '[' opening data_offsets, found %s",
                    mw__json_type_name(v->type));
    if (v->count != 2)
        return fail(f, t->name, v->offset,
                    v->count == 0   ? "data_offsets is empty: expected [begin, end]"
                    : v->count == 1 ? "data_offsets holds one offset: expected ',' and the end"
                                    : "data_offsets holds more than two offsets: expected ']' "
                                      "after begin and end");
    const mw__json_node *begin = mw__json_node_at(doc, v->first);
    mw_status st = integer(f, t->name, begin, &t->begin);
    return st ? st : integer(f, t->name, mw__json_node_at(doc, begin->next), &t->end);
}

static mw_status tensor_fields(const mw_safetensors *f, mw__st_tensor *t, const mw__json_node *e) {
    const mw__json *doc = f->header;
    static const char *const fields[] = {"dtype", "shape", "data_offsets"};
    const mw__json_node *seen[3] = {NULL, NULL, NULL};
    if (e->type != MW__JSON_OBJECT)
        return fail(f, t->name, e->offset, "expected '{' opening the tensor's entry, found %s",
                    mw__json_type_name(e->type));
    if (!e->count) return fail(f, t->name, e->offset, "the entry has no fields");
    for (const mw__json_node *v = mw__json_node_at(doc, e->first); v;
         v = mw__json_node_at(doc, v->next)) {
        int which = 0;
        while (which < 3 && !is_key(doc, v, fields[which])) which++;
        if (which == 3)
            return fail(f, t->name, v->offset,
                        "unknown field \"%.40s\" (only dtype, shape, data_offsets)",
                        mw__json_key(doc, v));
        if (seen[which])
            return fail(f, t->name, v->offset, "field \"%s\" appears twice", fields[which]);
        seen[which] = v;
        mw_status st = MW_OK;
        if (which == 0) {
            if (v->type != MW__JSON_STRING)
                return fail(f, t->name, v->offset, "\"dtype\" is %s: expected a string",
                            mw__json_type_name(v->type));
            const char *d = mw__json_str(doc, v);
            for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes && !t->dtype; i++)
                if (v->len == strlen(dtypes[i].name) && memcmp(d, dtypes[i].name, v->len) == 0) {
                    t->dtype = dtypes[i].name;
                    t->esize = dtypes[i].size;
                }
            if (!t->dtype) return fail(f, t->name, v->offset, "unknown dtype '%.20s'", d);
        } else if (which == 1) {
            st = shape(f, t, v);
        } else {
            st = offsets(f, t, v);
        }
        if (st) return st;
    }
    for (int i = 0; i < 3; i++)
        if (!seen[i]) return fail(f, t->name, e->offset, "the entry lacks \"%s\"", fields[i]);
    return MW_OK;
}

static mw_status metadata(mw_safetensors *f, const mw__json_node *m) {
    const mw__json *doc = f->header;
    if (m->type != MW__JSON_OBJECT)
        return fail(f, NULL, m->offset, "expected '{' opening \"__metadata__\", found %s",
                    mw__json_type_name(m->type));
    const mw__json_node *again = mw__json_repeated(doc, m);
    for (const mw__json_node *v = mw__json_node_at(doc, m->first); v;
         v = mw__json_node_at(doc, v->next)) {
        const char *key = mw__json_key(doc, v);
        if (v == again) return fail(f, NULL, v->offset, "metadata key '%.80s' appears twice", key);
        if (memchr(key, '\0', v->klen))
            return fail(f, NULL, v->offset, "U+0000 in a string (a metadata key)");
        if (v->type != MW__JSON_STRING)
            return fail(f, NULL, v->offset, "metadata value of '%.80s' is %s: expected a string",
                        key, mw__json_type_name(v->type));
        if (memchr(mw__json_str(doc, v), '\0', v->len))
            return fail(f, NULL, v->offset, "U+0000 in a string (the value of '%.80s')", key);
    }
    f->meta = m;
    return MW_OK;
}

/* --- checks across tensors ----------------------------------------------------------------- */

static int by_name(const void *a, const void *b) {
    const mw__st_tensor *x = *(const mw__st_tensor *const *)a;
    const mw__st_tensor *y = *(const mw__st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

static int by_offset(const void *a, const void *b) {
    const mw__st_tensor *x = *(const mw__st_tensor *const *)a;
    const mw__st_tensor *y = *(const mw__st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

static mw_status check_layout(mw_safetensors *f) {
    for (int i = 0; i < f->n; i++) {
        mw__st_tensor *t = &f->t[i];
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
    /* Both orders sort pointers to the tensors, so the comparisons need no context. */
    size_t n = (size_t)(f->n ? f->n : 1);
    const mw__st_tensor **order = mw__malloc(n * sizeof *order);
    f->byname = mw__malloc(n * sizeof *f->byname);
    if (!order || !f->byname) {
        mw__free(order);
        return mw__error(MW_ERR_NOMEM, "out of memory reading %s", f->label);
    }
    for (int i = 0; i < f->n; i++) order[i] = f->byname[i] = &f->t[i];
    qsort(f->byname, (size_t)f->n, sizeof *f->byname, by_name);
    qsort(order, (size_t)f->n, sizeof *order, by_offset);
    mw_status st = MW_OK;
    for (int i = 1; i < f->n && st == MW_OK; i++)
        if (strcmp(f->byname[i]->name, f->byname[i - 1]->name) == 0)
            st = mw__error(MW_ERR_FORMAT, "%s: tensor '%.80s' appears twice in the header",
                           f->label, f->byname[i]->name);
    /* The tensors tile the data: each begins where the previous one ends. */
    uint64_t at = 0;
    for (int i = 0; i < f->n && st == MW_OK; i++) {
        const mw__st_tensor *t = order[i];
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

/* --- the header ---------------------------------------------------------------------------- */

/* A syntax error in a tensor's entry names the tensor, as the checks of its fields do. */
static void name_tensor(const char *key, size_t klen, char *buf, size_t size) {
    if (klen == 12 && memcmp(key, "__metadata__", 12) == 0) return;
    snprintf(buf, size, "tensor '%.80s': ", key);
}

mw_status mw__st_read_header(mw_safetensors *f, const char *text, size_t n) {
    static const mw__json_options opt = {
        .max_depth = MAX_DEPTH, .prefix = 1, .part = "header", .member = name_tensor};
    mw_status st = mw__json_parse_with(text, n, f->label, &opt, &f->header);
    if (st) return st;
    const mw__json *doc = f->header;
    const mw__json_node *root = mw__json_node_at(doc, 0);
    if (root->type != MW__JSON_OBJECT)
        return fail(f, NULL, root->offset, "expected '{' opening the header, found %s",
                    mw__json_type_name(root->type));
    /* Padding is white space (a value's trailing white space is in doc->end). */
    if (doc->end != n) return fail(f, NULL, doc->end, "bytes after the header's closing '}'");
    static const char *const reserved[] = {"__metadata__", NULL};
    const mw__json_node *again = mw__json_duplicate(doc, root, reserved);
    f->t = mw__calloc(root->count ? root->count : 1, sizeof *f->t);
    if (!f->t) return mw__error(MW_ERR_NOMEM, "out of memory reading %s", f->label);
    for (const mw__json_node *e = mw__json_node_at(doc, root->first); e;
         e = mw__json_node_at(doc, e->next)) {
        if (e == again) return fail(f, NULL, e->offset, "\"__metadata__\" appears twice");
        if (is_key(doc, e, "__metadata__")) {
            if ((st = metadata(f, e))) return st;
            continue;
        }
        mw__st_tensor *t = &f->t[f->n];
        t->name = mw__json_key(doc, e);
        if (!e->klen) return fail(f, NULL, e->offset, "a tensor with an empty name");
        if (memchr(t->name, '\0', e->klen))
            return fail(f, NULL, e->offset, "U+0000 in a string (a tensor's name)");
        f->n++;
        if ((st = tensor_fields(f, t, e))) return st;
    }
    return check_layout(f);
}
