/* The tokenizer suites' reference files (tests/data/tokenizer, made by tools/make_tokenizer_ref.py
 * and tools/make_split_tokenizer_ref.py): their paths, their escaped texts and id lists, and
 * loading and encoding with the asserts every suite makes. Header-only (Criterion's asserts). */
#ifndef MW_TESTS_COMMON_TOKENIZER_DATA_H
#define MW_TESTS_COMMON_TOKENIZER_DATA_H

#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshwit.h"

/* tests/data/tokenizer/<name>, beside this file's folder. */
static inline const char *data_path(const char *name) {
    static char buf[4][4096];
    static int next;
    char *p = buf[next++ % 4];
    const char *file = __FILE__, *slash = strrchr(file, '/');
    snprintf(p, 4096, "%.*s/../data/tokenizer%s%s", slash ? (int)(slash - file) : 1,
             slash ? file : ".", *name ? "/" : "", name);
    return p;
}

/* The whole file, NUL-terminated; its size in *size (when not NULL). */
static inline char *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    cr_assert_not_null(buf);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    buf[n] = '\0';
    if (size) *size = (size_t)n;
    return buf;
}

/* The text of a corpus line, unescaped (\\ \n \r \t \xNN) in place; its length. */
static inline size_t unescape(char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            s[k++] = s[i];
            continue;
        }
        char e = s[++i];
        if (e == 'n')
            s[k++] = '\n';
        else if (e == 'r')
            s[k++] = '\r';
        else if (e == 't')
            s[k++] = '\t';
        else if (e == 'x') {
            char hex[3] = {s[i + 1], s[i + 2], 0};
            s[k++] = (char)strtol(hex, NULL, 16);
            i += 2;
        } else
            s[k++] = e;
    }
    return k;
}

/* Space-separated ids into a new array. */
static inline int32_t *parse_ids(const char *s, size_t *n) {
    size_t cap = 16;
    int32_t *ids = malloc(cap * sizeof *ids);
    *n = 0;
    char *end;
    for (long v = strtol(s, &end, 10); end != s; v = strtol(s, &end, 10)) {
        if (*n == cap) ids = realloc(ids, (cap *= 2) * sizeof *ids);
        ids[(*n)++] = (int32_t)v;
        s = end;
    }
    return ids;
}

static inline mw_tokenizer *load(const char *path) {
    mw_tokenizer *tok = NULL;
    mw_status st = mw_tokenizer_load(path, &tok);
    cr_assert_eq(st, MW_OK, "loading %s: %s: %s", path, mw_status_name(st), mw_last_error());
    cr_assert_not_null(tok);
    return tok;
}

/* The ids of text with `flags` (mw_tokenizer_encode_with) into a new array (*n of them). */
static inline int32_t *encode_with(mw_tokenizer *tok, const char *text, size_t len, unsigned flags,
                                   size_t *n) {
    size_t cap = mw_tokenizer_max_ids(tok, len);
    int32_t *ids = malloc((cap ? cap : 1) * sizeof *ids);
    mw_status st = mw_tokenizer_encode_with(tok, text, len, flags, ids, cap, n);
    cr_assert_eq(st, MW_OK, "encode: %s: %s", mw_status_name(st), mw_last_error());
    cr_assert_leq(*n, cap);
    return ids;
}

static inline int32_t *encode(mw_tokenizer *tok, const char *text, size_t len, size_t *n) {
    return encode_with(tok, text, len, 0, n);
}

#endif
