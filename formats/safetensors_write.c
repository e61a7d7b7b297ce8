/* Writing safetensors files (the layout: safetensors_impl.h; the reader: safetensors.c): every
 * tensor in F32, the header padded so that the data starts 8-byte aligned, written to a temporary
 * file that is synced and then renamed over the path. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/file.h"
#include "meshwit.h"

typedef struct sbuf {
    char *s;
    size_t n, cap;
    int failed;
} sbuf;

static void put(sbuf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void put(sbuf *b, const char *fmt, ...) {
    for (int tries = 0; tries < 2 && !b->failed; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->failed = 1;
            return;
        }
        if (b->s && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->cap + (size_t)k + 1) * 2;
        char *s = mw__realloc(b->s, cap);
        if (!s) {
            b->failed = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

mw_status mw_safetensors_write(const char *path, const mw_safetensors_entry *e, int n) {
    if (!path || n < 0 || (n && !e))
        return mw__error(MW_ERR_INVALID, "mw_safetensors_write: NULL argument");
    for (int i = 0; i < n; i++) {
        const char *name = e[i].name;
        int ok = name && *name && strcmp(name, "__metadata__") != 0 && e[i].rank >= 0 &&
                 e[i].rank <= MW_MAX_RANK;
        for (const char *c = name; ok && *c; c++) ok = (unsigned char)*c >= 0x20;
        int64_t count = 1;
        for (int k = 0; ok && k < e[i].rank; k++) {
            ok = e[i].shape[k] >= 0 &&
                 (!e[i].shape[k] || count <= (INT64_C(1) << 40) / e[i].shape[k]);
            count *= e[i].shape[k];
        }
        ok = ok && (count == 0 || e[i].data);
        for (int j = 0; ok && j < i; j++) ok = strcmp(e[j].name, name) != 0;
        if (!ok)
            return mw__error(MW_ERR_INVALID,
                             "mw_safetensors_write: entry %d ('%s') has an empty, duplicate or "
                             "reserved name, a control character, a bad shape or no data",
                             i, name ? name : "(null)");
    }
    sbuf h = {0};
    put(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        put(&h, ",\"");
        for (const char *c = e[i].name; *c; c++)
            put(&h, *c == '"' || *c == '\\' ? "\\%c" : "%c", *c);
        put(&h, "\":{\"dtype\":\"F32\",\"shape\":[");
        int64_t count = 1;
        for (int k = 0; k < e[i].rank; k++) {
            put(&h, "%s%lld", k ? "," : "", (long long)e[i].shape[k]);
            count *= e[i].shape[k];
        }
        put(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)at,
            (unsigned long long)(at + (uint64_t)count * 4));
        at += (uint64_t)count * 4;
    }
    put(&h, "}");
    while (!h.failed && h.n % 8) put(&h, " "); /* the data starts 8-byte aligned */
    if (h.failed) {
        mw__free(h.s);
        return mw__error(MW_ERR_NOMEM, "out of memory writing %s", path);
    }
    mw_output *out;
    mw_status st = mw_output_open(path, "safetensors file", 0, &out);
    if (st) {
        mw__free(h.s);
        return st;
    }
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)h.n >> (8 * i));
    st = mw_output_write(out, len, 8);
    if (st == MW_OK) st = mw_output_write(out, h.s, h.n);
    for (int i = 0; st == MW_OK && i < n; i++) {
        int64_t count = 1;
        for (int k = 0; k < e[i].rank; k++) count *= e[i].shape[k];
        st = mw_output_write(out, e[i].data, (size_t)count * 4);
    }
    mw__free(h.s);
    if (st) {
        mw_output_abandon(out);
        return st;
    }
    return mw_output_commit(out);
}
