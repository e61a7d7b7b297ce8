/* Internal: Unicode's canonical composition (NFC) as Hugging Face tokenizers' NFC normalizer
 * applies it (Qwen2's tokenizer.json has one): decompose each character in full, order each run of
 * combining marks by class (stably), compose each mark with the starter before it where nothing
 * between blocks it, Hangul by arithmetic. The tables (text/unicode_nfc.c, written by
 * tools/make_nfc_tables.py) are those of the crate tokenizers runs, Unicode 9.0's, taken from
 * tokenizers' own behaviour. A byte that does not start a valid UTF-8 sequence is a character of
 * its own that neither decomposes nor composes (as in the pre-tokenizer). */
#ifndef MW__TEXT_TOKENIZER_NFC_H
#define MW__TEXT_TOKENIZER_NFC_H

#include <stddef.h>
#include <stdint.h>

#include "meshwit/status.h"

typedef struct mw__nfc_decomposition {
    uint32_t cp;
    uint16_t off; /* into mw__nfc_pool */
    uint8_t len;
} mw__nfc_decomposition;

typedef struct mw__nfc_pair {
    uint64_t key; /* first << 21 | second */
    uint32_t cp;  /* what they compose to */
} mw__nfc_pair;

/* Per code point, one bit: NFC may change text that holds it (a combining mark, a character NFC
 * replaces, the second of a pair, a Hangul vowel or final jamo). */
extern const uint8_t mw__nfc_stage1[0x110000 >> 8];
extern const uint8_t mw__nfc_stage2[][32];
/* Sorted by code point: cp << 8 | combining class, for every mark of a class other than 0. */
extern const uint32_t mw__nfc_classes[];
/* Sorted by code point: each one whose full canonical decomposition is not itself (Hangul
 * syllables aside). */
extern const mw__nfc_decomposition mw__nfc_decompositions[];
extern const uint32_t mw__nfc_pool[];
/* Sorted by key. */
extern const mw__nfc_pair mw__nfc_pairs[];
extern const uint32_t mw__nfc_nclasses, mw__nfc_ndecompositions, mw__nfc_npairs;

/* Scratch space of one caller (an encoder), grown as needed; zero-initialised, freed by
 * mw__nfc_free. */
typedef struct mw__nfc_buf {
    uint32_t *cps;
    size_t ncap;
    uint8_t *out;
    size_t ocap;
} mw__nfc_buf;

/* 1 when NFC may change s[0, n), 0 when s is its own NFC. */
int mw__nfc_may_change(const uint8_t *s, size_t n);

/* The NFC of s[0, n) into b->out, its length in *len. MW_ERR_NOMEM (with a message). */
mw_status mw__nfc(mw__nfc_buf *b, const uint8_t *s, size_t n, size_t *len);

void mw__nfc_free(mw__nfc_buf *b);

#endif
