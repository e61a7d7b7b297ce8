/* Internal: what GPT-2's pre-tokenization regex needs to know about a character (its class among
 * \p{L}, \p{N}, \s and the rest, for every code point of Unicode 16.0.0, as the Oniguruma inside
 * Hugging Face tokenizers 0.23 has them), and UTF-8 decoding that never fails: a byte that does
 * not start a valid sequence is a character of its own. */
#ifndef MW__TEXT_UNICODE_H
#define MW__TEXT_UNICODE_H

#include <stddef.h>
#include <stdint.h>

#define MW__UNICODE_VERSION "16.0.0"

enum { MW__UC_OTHER = 0, MW__UC_LETTER = 1, MW__UC_NUMBER = 2, MW__UC_SPACE = 3 };

/* text/unicode_tables.c, made by tools/make_unicode_tables.py. */
extern const uint8_t mw__uc_stage1[0x110000 >> 8];
extern const uint8_t mw__uc_stage2[][64];

/* The class of code point cp (at most 0x10FFFF). */
static inline int mw__uc_class(uint32_t cp) {
    return (mw__uc_stage2[mw__uc_stage1[cp >> 8]][(cp & 255) >> 2] >> (2 * (cp & 3))) & 3;
}

/* Length of the valid UTF-8 sequence at s (n >= 1 bytes available) and its code point in *cp,
 * or 0 (and s[0] in *cp) when s[0] does not start one (a stray continuation byte, an overlong form,
 * a surrogate, a value above U+10FFFF or a sequence cut short). */
static inline size_t mw__utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    uint32_t c = s[0];
    *cp = c; /* also where no sequence starts: *cp is always set */
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c < 0xC2 || c > 0xF4) return 0;
    if (c < 0xE0) {
        if (n < 2 || (s[1] & 0xC0) != 0x80) return 0;
        *cp = (c & 0x1F) << 6 | (s[1] & 0x3F);
        return 2;
    }
    if (c < 0xF0) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
        uint32_t v = (c & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
        if (v < 0x800 || (v >= 0xD800 && v <= 0xDFFF)) return 0;
        *cp = v;
        return 3;
    }
    if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
    uint32_t v = (c & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 |
                 (s[3] & 0x3F);
    if (v < 0x10000 || v > 0x10FFFF) return 0;
    *cp = v;
    return 4;
}

/* Writes cp (at most 0x10FFFF, not a surrogate) as UTF-8 into o; its length. */
size_t mw__utf8_encode(uint32_t cp, uint8_t *o);

#endif
