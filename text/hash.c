/* The tokenizer's hash maps (tokenizer_impl.h): open addressing with linear probing, tables a
 * power of two at most half full, so a probe sequence always ends on an empty slot. */
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "text/tokenizer_impl.h"

static uint64_t mix(uint64_t h) {
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ull;
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ull;
    return h ^ (h >> 32);
}

static uint64_t load64(const unsigned char *s) {
    uint64_t w;
    memcpy(&w, s, 8);
    return w;
}

static uint64_t load32(const unsigned char *s) {
    uint32_t w;
    memcpy(&w, s, 4);
    return w;
}

/* Whole words, the last one overlapping the one before when n is not a multiple of 8: no byte
 * loop, which matters for the short words the tokenizer hashes most. */
uint64_t mw__hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull), w;
    if (n >= 8) {
        for (size_t i = 0; i + 8 < n; i += 8) {
            h = (h ^ load64(s + i)) * 0x9FB21C651E98DF25ull;
            h ^= h >> 29;
        }
        w = load64(s + n - 8);
    } else if (n >= 4) {
        w = load32(s) << 32 | load32(s + n - 4);
    } else if (n) {
        w = (uint64_t)s[0] << 16 | (uint64_t)s[n / 2] << 8 | s[n - 1];
    } else {
        w = 0;
    }
    h = (h ^ w) * 0x9FB21C651E98DF25ull;
    return mix(h);
}

/* The table size for `expected` entries: a power of two at least twice as large. */
static size_t table_size(size_t expected) {
    size_t n = 16;
    while (n < 2 * expected + 2) n *= 2;
    return n;
}

mw_status mw__strmap_init(mw__strmap *m, size_t expected) {
    size_t n = table_size(expected);
    m->slots = mw__malloc(n * sizeof *m->slots);
    m->mask = n - 1;
    m->count = 0;
    if (!m->slots) return mw__error(MW_ERR_NOMEM, "out of memory for a table of %zu tokens", n);
    for (size_t i = 0; i < n; i++) m->slots[i].len = UINT32_MAX;
    return MW_OK;
}

void mw__strmap_free(mw__strmap *m) {
    mw__free(m->slots);
    m->slots = NULL;
}

const mw__strmap_slot *mw__strmap_get(const mw__strmap *m, const char *base, const char *key,
                                      size_t len) {
    uint64_t h = mw__hash_bytes(key, len);
    uint32_t h32 = (uint32_t)h;
    for (size_t i = (size_t)(h >> 32) & m->mask;; i = (i + 1) & m->mask) {
        const mw__strmap_slot *s = &m->slots[i];
        if (s->len == UINT32_MAX) return NULL;
        if (s->hash == h32 && s->len == len && memcmp(base + s->off, key, len) == 0) return s;
    }
}

mw__strmap_slot *mw__strmap_put(mw__strmap *m, const char *base, uint32_t off, uint32_t len,
                                int *added) {
    uint64_t h = mw__hash_bytes(base + off, len);
    uint32_t h32 = (uint32_t)h;
    for (size_t i = (size_t)(h >> 32) & m->mask;; i = (i + 1) & m->mask) {
        mw__strmap_slot *s = &m->slots[i];
        if (s->len == UINT32_MAX) {
            *s = (mw__strmap_slot){.hash = h32, .off = off, .len = len, .value = MW__NO_ID};
            m->count++;
            *added = 1;
            return s;
        }
        if (s->hash == h32 && s->len == len && memcmp(base + s->off, base + off, len) == 0) {
            *added = 0;
            return s;
        }
    }
}

mw_status mw__pairmap_init(mw__pairmap *m, size_t expected) {
    size_t n = table_size(expected);
    m->slots = mw__malloc(n * sizeof *m->slots);
    m->mask = n - 1;
    if (!m->slots) return mw__error(MW_ERR_NOMEM, "out of memory for a table of %zu merges", n);
    for (size_t i = 0; i < n; i++) m->slots[i].key = UINT64_MAX;
    return MW_OK;
}

void mw__pairmap_free(mw__pairmap *m) {
    mw__free(m->slots);
    m->slots = NULL;
}

mw__pairmap_slot *mw__pairmap_find(const mw__pairmap *m, uint32_t a, uint32_t b) {
    uint64_t key = mw__pair_key(a, b);
    for (size_t i = (size_t)mix(key) & m->mask;; i = (i + 1) & m->mask) {
        mw__pairmap_slot *s = &m->slots[i];
        if (s->key == key || s->key == UINT64_MAX) return s;
    }
}
