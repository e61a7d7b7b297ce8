/* Internal: the body of mw_tokenizer and the hash maps behind it. Loading (tokenizer_load.c)
 * fills it; encoding and decoding (tokenizer.c) only read it, except for the word cache. */
#ifndef MW__TEXT_TOKENIZER_IMPL_H
#define MW__TEXT_TOKENIZER_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "meshwit/tokenizer.h"
#include "text/tokenizer_split.h"

enum { MW__NO_ID = -1 };

/* --- hash maps (text/hash.c) ------------------------------------------------------------------ */

/* A hash of n bytes (8 at a time). */
uint64_t mw__hash_bytes(const void *p, size_t n);

/* Strings -> int32, open addressing. The strings live in a caller's arena (base + offset), so
 * a slot is 16 bytes and the map owns only its slots. */
typedef struct mw__strmap_slot {
    uint32_t hash; /* low 32 bits of the hash; the slot is empty when len is UINT32_MAX */
    uint32_t off, len;
    int32_t value;
} mw__strmap_slot;

typedef struct mw__strmap {
    mw__strmap_slot *slots;
    size_t mask, count;
} mw__strmap;

/* Room for `expected` entries at most half full. MW_ERR_NOMEM. */
mw_status mw__strmap_init(mw__strmap *m, size_t expected);
void mw__strmap_free(mw__strmap *m);
/* The entry of key[0, len), or NULL. */
const mw__strmap_slot *mw__strmap_get(const mw__strmap *m, const char *base, const char *key,
                                      size_t len);
/* The entry of base[off, off + len): the existing one (*added = 0) or a new one holding
 * MW__NO_ID (*added = 1). The caller keeps the map at most half full (mw__strmap_init). */
mw__strmap_slot *mw__strmap_put(mw__strmap *m, const char *base, uint32_t off, uint32_t len,
                                int *added);

/* (uint32, uint32) pairs -> (rank, id), open addressing. */
typedef struct mw__pairmap_slot {
    uint64_t key; /* UINT64_MAX: empty */
    uint32_t rank;
    int32_t id;
} mw__pairmap_slot;

typedef struct mw__pairmap {
    mw__pairmap_slot *slots;
    size_t mask;
} mw__pairmap;

mw_status mw__pairmap_init(mw__pairmap *m, size_t expected);
void mw__pairmap_free(mw__pairmap *m);
/* The slot of the pair (a, b), holding it or the empty one where it would go. */
mw__pairmap_slot *mw__pairmap_find(const mw__pairmap *m, uint32_t a, uint32_t b);

static inline uint64_t mw__pair_key(uint32_t a, uint32_t b) { return (uint64_t)a << 32 | b; }

/* --- the word cache -----------------------------------------------------------------------------
 */

#define MW__CACHE_KEY 26 /* longest word cached, bytes */
#define MW__CACHE_IDS 8  /* most ids of a cached word */
#define MW__CACHE_SETS 16384

/* One cache line: a word and its ids. */
typedef struct mw__cache_slot {
    uint32_t hash; /* 0: empty */
    uint8_t klen, nids;
    uint8_t key[MW__CACHE_KEY];
    int32_t ids[MW__CACHE_IDS];
} mw__cache_slot;

/* --- the tokenizer ------------------------------------------------------------------------------
 */

typedef struct mw__added {
    uint32_t off, len;             /* content in the arena */
    uint32_t match_off, match_len; /* the text matched: the content, or its NFC when the token is
                                      "normalized" and the tokenizer's normalizer is NFC */
    int32_t id;
    int single_word, lstrip, rstrip, normalized, special;
} mw__added;

/* The added tokens matched in one pass (normalized or not): indices into tok->added, sorted by
 * the first byte of the text matched, then longest first; first[b] .. first[b + 1] are those
 * starting with byte b. */
typedef struct mw__added_pass {
    uint32_t *order;
    uint32_t count;
    uint32_t first[257];
} mw__added_pass;

struct mw_tokenizer {
    char *arena; /* every string below, back to back */
    size_t arena_len, arena_cap;
    uint32_t file_off[2]; /* the files it was read from (NUL-terminated, in the arena) */
    int nfiles;

    /* the model */
    mw__strmap vocab;    /* token text (as in the file) -> id */
    int32_t vocab_count; /* entries in the vocabulary */
    int32_t size;        /* largest id + 1, added tokens included */
    mw__pairmap merges;  /* (left id, right id) -> (rank, merged id) */
    int32_t *merge_id;   /* merged id of each rank */
    uint32_t nmerges;
    int32_t unk_id; /* MW__NO_ID: no unk_token */
    int fuse_unk, byte_fallback, ignore_merges;
    uint32_t prefix_off, prefix_len; /* continuing_subword_prefix, "" when none */
    uint32_t suffix_off, suffix_len; /* end_of_word_suffix */
    int has_prefix, has_suffix;
    /* id of byte b's character in each position: [0] first, [1] not first, [2] first and last,
     * [3] last and not first (the prefix goes before every character but the first, the suffix
     * after the last one); MW__NO_ID when the vocabulary lacks it */
    int32_t byte_id[4][256];
    /* byte_fallback: the "<0xXX>" ids spelling that character (byte_fb_count of them, 0 when
     * one is missing), from byte_fb_ids + byte_fb_off */
    uint32_t byte_fb_off[4][256];
    uint8_t byte_fb_count[4][256];
    int32_t *byte_fb_ids;
    size_t max_ids_per_byte;

    int nfc; /* the normalizer: NFC (1) or none (0) */

    /* the pre-tokenizer: a Split's pattern (MW__SPLIT_NONE: none), then ByteLevel's settings */
    mw__split split;
    int add_prefix_space, use_regex;

    /* the post-processor's template for one text (MW_ENCODE_ADD_SPECIAL): the ids before it,
     * then those after it */
    int32_t *template_ids;
    uint32_t template_before, template_after;

    /* added tokens */
    mw__added *added;
    uint32_t nadded;
    mw__added_pass pass[2]; /* [0] "normalized": false, matched first; [1] true */

    /* decoding: the bytes of token id (decoded_len UINT32_MAX: no such token) */
    uint32_t *decoded_off, *decoded_len;
    uint8_t *is_special; /* per id: 1 added, 2 added and special */

    /* the word cache: 2-way sets, held by one encode call at a time */
    pthread_mutex_t cache_lock;
    mw__cache_slot *cache;
};

/* MW_TEST_TOKENIZER_WORDS (meshwit/testing.h): the length of each word BPE is given for text,
 * in the text as normalized (text/tokenizer.c). */
mw_status mw__tokenizer_words(mw_tokenizer *tok, const char *text, size_t len, size_t *lens,
                              size_t cap, size_t *n);

/* GPT-2's byte alphabet: byte b is written as code point mw__byte_char(b). */
uint32_t mw__byte_char(uint8_t b);
/* The byte written as code point cp, or -1 when cp is not in the alphabet. */
int mw__char_byte(uint32_t cp);

#endif
