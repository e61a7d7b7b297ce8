/* Internal: what GPT-2's pre-tokenization regex needs to know about a character (its class among
 * \p{L}, \p{N}, \s and the rest, for every code point of Unicode 16.0.0, as the Oniguruma inside
 * Hugging Face tokenizers 0.23 has them), and whether it is a word character to a "single_word"
 * added token. UTF-8 is formats/utf8.h's: a byte that does not start a
 * valid sequence is a character of its own to the tokenizer. */
#ifndef MW__TEXT_UNICODE_H
#define MW__TEXT_UNICODE_H

#include <stddef.h>
#include <stdint.h>

#include "formats/utf8.h" /* mw__utf8_decode, mw__utf8_encode */

#define MW__UNICODE_VERSION "16.0.0"

enum { MW__UC_OTHER = 0, MW__UC_LETTER = 1, MW__UC_NUMBER = 2, MW__UC_SPACE = 3 };

/* text/unicode_tables.c, made by tools/make_unicode_tables.py. */
extern const uint8_t mw__uc_stage1[0x110000 >> 8];
extern const uint8_t mw__uc_stage2[][64];

/* The class of code point cp (at most 0x10FFFF). */
static inline int mw__uc_class(uint32_t cp) {
    return (mw__uc_stage2[mw__uc_stage1[cp >> 8]][(cp & 255) >> 2] >> (2 * (cp & 3))) & 3;
}

/* text/unicode_word.c, made by tools/make_word_table.py: the word characters, as inclusive
 * ranges sorted by code point. */
extern const uint32_t mw__uc_word_ranges[][2];
extern const uint32_t mw__uc_nword_ranges;

/* 1 when code point cp is a word character as a "single_word" added token sees its neighbours:
 * the Rust regex crate's \w inside tokenizers (Alphabetic, marks, decimal digits, connector
 * punctuation, Join_Control; Unicode 16.0), else 0. */
static inline int mw__uc_is_word(uint32_t cp) {
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z') ||
               cp == '_';
    uint32_t lo = 0, hi = mw__uc_nword_ranges;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (cp > mw__uc_word_ranges[mid][1])
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < mw__uc_nword_ranges && cp >= mw__uc_word_ranges[lo][0];
}

#endif
