/* The pre-tokenization regexes (tokenizer_split.h), alternative by alternative. tools/
 * make_unicode_tables.py --check compares the Llama 3 and Qwen2 rules below, over the classes of
 * every code point, with what tokenizers' own Split cuts; the tests compare the ids. */
#include <pthread.h>
#include <string.h>

#include "text/tokenizer_split.h"
#include "text/unicode.h"

mw__split mw__split_pattern(const char *p, size_t n) {
    static const struct {
        const char *text;
        mw__split which;
    } known[] = {{MW__PATTERN_GPT2, MW__SPLIT_GPT2},
                 {MW__PATTERN_LLAMA3, MW__SPLIT_LLAMA3},
                 {MW__PATTERN_QWEN2, MW__SPLIT_QWEN2}};
    for (size_t k = 0; k < sizeof known / sizeof *known; k++)
        if (strlen(known[k].text) == n && memcmp(known[k].text, p, n) == 0) return known[k].which;
    return MW__SPLIT_NONE;
}

const char *mw__split_name(mw__split which) {
    switch (which) {
    case MW__SPLIT_GPT2: return "GPT-2's";
    case MW__SPLIT_LLAMA3: return "Llama 3's";
    case MW__SPLIT_QWEN2: return "Qwen2's";
    default: return "no";
    }
}

/* The classes of ASCII, from the same table. */
static uint8_t ascii_class[128];
static pthread_once_t ascii_once = PTHREAD_ONCE_INIT;

static void ascii_init(void) {
    for (uint32_t c = 0; c < 128; c++) ascii_class[c] = (uint8_t)mw__uc_class(c);
}

void mw__split_init(void) { pthread_once(&ascii_once, ascii_init); }

static inline int char_class(const uint8_t *s, size_t i, size_t n, size_t *len) {
    if (s[i] < 0x80) {
        *len = 1;
        return ascii_class[s[i]];
    }
    uint32_t cp;
    size_t l = mw__utf8_decode(s + i, n - i, &cp);
    if (!l) {
        *len = 1;
        return MW__UC_OTHER;
    }
    *len = l;
    return mw__uc_class(cp);
}

int mw__split_class(const uint8_t *s, size_t i, size_t n, size_t *len) {
    return char_class(s, i, n, len);
}

/* The end of the run of characters of class cls from i. */
static size_t run(const uint8_t *s, size_t i, size_t n, int cls) {
    while (i < n && s[i] < 0x80 && ascii_class[s[i]] == cls) i++;
    while (i < n) {
        size_t l;
        if (char_class(s, i, n, &l) != cls) break;
        i += l;
    }
    return i;
}

/* White space from i (whose character is white space): "\s+(?!\S)", the run less its last
 * character when something follows (which is then not white space), else "\s+", the run. With
 * `crlf` (Llama 3, Qwen2), "\s*[\r\n]+" first: the run up to its last CR or LF, if it has one. */
static size_t space_end(const uint8_t *s, size_t i, size_t n, int crlf) {
    size_t j = i, last = i, after_crlf = 0;
    while (j < n) {
        size_t l;
        if (char_class(s, j, n, &l) != MW__UC_SPACE) break;
        if (s[j] == '\r' || s[j] == '\n') after_crlf = j + 1;
        last = j;
        j += l;
    }
    if (crlf && after_crlf) return after_crlf;
    if (j == n) return n;
    return last > i ? last : j;
}

/* GPT-2's 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t gpt2_end(const uint8_t *s, size_t i, size_t n) {
    uint8_t c = s[i];
    if (c == '\'' && i + 1 < n) {
        uint8_t d = s[i + 1];
        if (d == 's' || d == 't' || d == 'm' || d == 'd') return i + 2;
        if (i + 2 < n && ((d == 'r' && s[i + 2] == 'e') || (d == 'v' && s[i + 2] == 'e') ||
                          (d == 'l' && s[i + 2] == 'l')))
            return i + 3;
    }
    size_t l;
    int cls = char_class(s, i, n, &l);
    if (c == ' ' && i + 1 < n) { /* " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+" */
        size_t l2;
        int next = char_class(s, i + 1, n, &l2);
        if (next != MW__UC_SPACE) return run(s, i + 1 + l2, n, next);
    }
    if (cls != MW__UC_SPACE) return run(s, i + l, n, cls);
    return space_end(s, i, n, 0);
}

/* The length of the letter at s[i] when it is `lower` or its case-folded kin, which under
 * Oniguruma's (?i) are its upper case and, for s, U+017F LATIN SMALL LETTER LONG S; else 0. */
static size_t folds_to(const uint8_t *s, size_t i, size_t n, uint8_t lower) {
    if (i >= n) return 0;
    if ((s[i] | 0x20) == lower) return 1;
    if (lower == 's' && i + 1 < n && s[i] == 0xC5 && s[i + 1] == 0xBF) return 2;
    return 0;
}

/* Llama 3's (digits 3) and Qwen2's (digits 1):
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *   \s*[\r\n]+|\s+(?!\S)|\s+                                  (Qwen2: \p{N} for \p{N}{1,3}) */
static size_t llama_end(const uint8_t *s, size_t i, size_t n, int digits) {
    uint8_t c = s[i];
    if (c == '\'') {
        size_t a;
        if ((a = folds_to(s, i + 1, n, 's')) || (a = folds_to(s, i + 1, n, 't')) ||
            (a = folds_to(s, i + 1, n, 'm')) || (a = folds_to(s, i + 1, n, 'd')))
            return i + 1 + a;
        if ((folds_to(s, i + 1, n, 'r') && folds_to(s, i + 2, n, 'e')) ||
            (folds_to(s, i + 1, n, 'v') && folds_to(s, i + 2, n, 'e')) ||
            (folds_to(s, i + 1, n, 'l') && folds_to(s, i + 2, n, 'l')))
            return i + 3;
    }
    size_t l;
    int cls = char_class(s, i, n, &l);
    if (cls == MW__UC_LETTER) return run(s, i + l, n, MW__UC_LETTER);
    if (cls != MW__UC_NUMBER && c != '\r' && c != '\n' && i + l < n) {
        /* one character that is no letter, number, CR or LF, then letters */
        size_t l2;
        if (char_class(s, i + l, n, &l2) == MW__UC_LETTER)
            return run(s, i + l + l2, n, MW__UC_LETTER);
    }
    if (cls == MW__UC_NUMBER) {
        size_t j = i + l;
        for (int k = 1; k < digits && j < n; k++) {
            size_t l2;
            if (char_class(s, j, n, &l2) != MW__UC_NUMBER) break;
            j += l2;
        }
        return j;
    }
    size_t j = 0;
    if (cls == MW__UC_OTHER) {
        j = run(s, i + l, n, MW__UC_OTHER);
    } else if (c == ' ' && i + 1 < n) {
        size_t l2;
        if (char_class(s, i + 1, n, &l2) == MW__UC_OTHER) j = run(s, i + 1 + l2, n, MW__UC_OTHER);
    }
    if (j) { /* " ?[^\s\p{L}\p{N}]+[\r\n]*" */
        while (j < n && (s[j] == '\r' || s[j] == '\n')) j++;
        return j;
    }
    return space_end(s, i, n, 1);
}

size_t mw__split_end(mw__split which, const uint8_t *s, size_t i, size_t n) {
    switch (which) {
    case MW__SPLIT_LLAMA3: return llama_end(s, i, n, 3);
    case MW__SPLIT_QWEN2: return llama_end(s, i, n, 1);
    default: return gpt2_end(s, i, n);
    }
}
