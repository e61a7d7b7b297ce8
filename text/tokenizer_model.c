/* The parts of a tokenizer that do not depend on the file it came from: its string arena, the
 * vocabulary and merges once read, GPT-2's byte alphabet, the per-byte tables, the added-token
 * passes, the decoding table and freeing. tokenizer_load.c reads the files into these. */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "text/tokenizer_model.h"
#include "text/unicode.h"

/* --- GPT-2's byte alphabet ------------------------------------------------------------------- */

/* Printable bytes stand for themselves; the other 68 (controls, space, DEL, the C1 range, NBSP
 * and the soft hyphen) take U+0100 onwards, in byte order. */
static int printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

uint32_t mw__byte_char(uint8_t b) {
    if (printable(b)) return b;
    if (b <= 0x20) return 0x100 + b;               /* 33 controls and the space */
    if (b <= 0xA0) return 0x100 + 33 + (b - 0x7F); /* DEL, C1 and NBSP: 34 */
    return 0x100 + 67;                             /* the soft hyphen, 0xAD */
}

int mw__char_byte(uint32_t cp) {
    if (cp < 0x100) return printable(cp) ? (int)cp : -1;
    uint32_t n = cp - 0x100;
    if (n < 33) return (int)n;
    if (n < 67) return (int)(0x7F + n - 33);
    return n == 67 ? 0xAD : -1;
}

/* --- the arena ---------------------------------------------------------------------------------
 */

mw_status mw__tok_store(mw_tokenizer *tok, const void *s, size_t n, uint32_t *off) {
    if (tok->arena_len + n + 1 > UINT32_MAX)
        return mw__error(MW_ERR_UNSUPPORTED, "the tokenizer's strings exceed 4 GiB");
    if (tok->arena_len + n + 1 > tok->arena_cap) {
        size_t cap = tok->arena_cap ? tok->arena_cap : 4096;
        while (cap < tok->arena_len + n + 1) cap *= 2;
        if (cap > UINT32_MAX) cap = UINT32_MAX;
        char *a = mw__realloc(tok->arena, cap);
        if (!a) return mw__error(MW_ERR_NOMEM, "out of memory for the tokenizer's strings");
        tok->arena = a;
        tok->arena_cap = cap;
    }
    if (n) memcpy(tok->arena + tok->arena_len, s, n);
    *off = (uint32_t)tok->arena_len;
    tok->arena_len += n;
    return MW_OK;
}

/* --- a new tokenizer and freeing it -------------------------------------------------------------
 */

mw_status mw__tok_new(mw_tokenizer **out) {
    mw_tokenizer *tok = mw__calloc(1, sizeof *tok);
    *out = tok;
    if (!tok) return mw__error(MW_ERR_NOMEM, "out of memory for a tokenizer");
    tok->unk_id = MW__NO_ID;
    tok->use_regex = 1;
    tok->max_ids_per_byte = 1;
    pthread_mutex_init(&tok->cache_lock, NULL);
    return MW_OK;
}

void mw_tokenizer_free(mw_tokenizer *tok) {
    if (!tok) return;
    mw__strmap_free(&tok->vocab);
    mw__pairmap_free(&tok->merges);
    mw__free(tok->merge_id);
    mw__free(tok->byte_fb_ids);
    mw__free(tok->added);
    for (int p = 0; p < 2; p++) mw__free(tok->pass[p].order);
    mw__free(tok->decoded_off);
    mw__free(tok->decoded_len);
    mw__free(tok->is_special);
    mw__free(tok->template_ids);
    mw__free(tok->cache);
    mw__free(tok->arena);
    pthread_mutex_destroy(&tok->cache_lock);
    mw__free(tok);
}

/* --- what the model's settings derive ----------------------------------------------------------
 */

/* The id of `s` (n bytes) in the vocabulary, or MW__NO_ID. */
int32_t mw__tok_vocab_id(const mw_tokenizer *tok, const char *s, size_t n) {
    const mw__strmap_slot *e = mw__strmap_get(&tok->vocab, tok->arena, s, n);
    return e ? e->value : MW__NO_ID;
}

/* The text standing for byte b in position v (see byte_id) into buf; its length. buf holds
 * 4 + prefix_len + suffix_len bytes. */
static size_t variant_text(const mw_tokenizer *tok, int v, unsigned b, char *buf) {
    size_t k = 0;
    if ((v == 1 || v == 3) && tok->has_prefix) {
        memcpy(buf, tok->arena + tok->prefix_off, tok->prefix_len);
        k = tok->prefix_len;
    }
    k += mw__utf8_encode(mw__byte_char((uint8_t)b), (uint8_t *)buf + k);
    if (v >= 2 && tok->has_suffix) {
        memcpy(buf + k, tok->arena + tok->suffix_off, tok->suffix_len);
        k += tok->suffix_len;
    }
    return k;
}

mw_status mw__tok_byte_tables(mw_tokenizer *tok) {
    size_t most = 4 + (size_t)tok->prefix_len + tok->suffix_len;
    char *buf = mw__malloc(most);
    if (!buf) return mw__error(MW_ERR_NOMEM, "out of memory for the tokenizer's byte tables");
    if (tok->byte_fallback) {
        tok->byte_fb_ids = mw__malloc(4 * 256 * most * sizeof *tok->byte_fb_ids);
        if (!tok->byte_fb_ids) {
            mw__free(buf);
            return mw__error(MW_ERR_NOMEM, "out of memory for the tokenizer's byte tables");
        }
    }
    size_t nfb = 0;
    for (int v = 0; v < 4; v++)
        for (unsigned b = 0; b < 256; b++) {
            size_t k = variant_text(tok, v, b, buf);
            tok->byte_id[v][b] = mw__tok_vocab_id(tok, buf, k);
            tok->byte_fb_count[v][b] = 0;
            if (!tok->byte_fallback || k > 255) continue;
            /* Each byte of the text as "<0xXX>", as tokenizers spells it ({:#04X}). */
            size_t start = nfb, i;
            for (i = 0; i < k; i++) {
                static const char hex[] = "0123456789ABCDEF";
                unsigned char c = (unsigned char)buf[i];
                char name[6] = {'<', '0', 'x', hex[c >> 4], hex[c & 15], '>'};
                int32_t id = mw__tok_vocab_id(tok, name, sizeof name);
                if (id == MW__NO_ID) break;
                tok->byte_fb_ids[nfb++] = id;
            }
            if (i < k) {
                nfb = start;
                continue;
            }
            tok->byte_fb_off[v][b] = (uint32_t)start;
            tok->byte_fb_count[v][b] = (uint8_t)k;
            if (tok->byte_id[v][b] == MW__NO_ID && k > tok->max_ids_per_byte)
                tok->max_ids_per_byte = k;
        }
    mw__free(buf);
    return MW_OK;
}

/* --- added tokens -------------------------------------------------------------------------------
 */

static const mw_tokenizer *sort_tok; /* qsort has no context argument; guarded by sort_lock */
static pthread_mutex_t sort_lock = PTHREAD_MUTEX_INITIALIZER;

static int by_first_byte_then_longest(const void *pa, const void *pb) {
    const mw__added *a = &sort_tok->added[*(const uint32_t *)pa];
    const mw__added *b = &sort_tok->added[*(const uint32_t *)pb];
    unsigned char fa = (unsigned char)sort_tok->arena[a->match_off];
    unsigned char fb = (unsigned char)sort_tok->arena[b->match_off];
    if (fa != fb) return fa < fb ? -1 : 1;
    if (a->match_len != b->match_len) return a->match_len > b->match_len ? -1 : 1;
    return 0;
}

mw_status mw__tok_added_passes(mw_tokenizer *tok) {
    for (int p = 0; p < 2; p++) {
        mw__added_pass *pass = &tok->pass[p];
        pass->order = mw__malloc((tok->nadded ? tok->nadded : 1) * sizeof *pass->order);
        if (!pass->order) return mw__error(MW_ERR_NOMEM, "out of memory for the added tokens");
        pass->count = 0;
        for (uint32_t i = 0; i < tok->nadded; i++)
            if (tok->added[i].normalized == p) pass->order[pass->count++] = i;
        pthread_mutex_lock(&sort_lock);
        sort_tok = tok;
        qsort(pass->order, pass->count, sizeof *pass->order, by_first_byte_then_longest);
        pthread_mutex_unlock(&sort_lock);
        uint32_t i = 0;
        for (unsigned b = 0; b <= 256; b++) {
            while (i < pass->count &&
                   (unsigned char)tok->arena[tok->added[pass->order[i]].match_off] < b)
                i++;
            pass->first[b] = i;
        }
    }
    return MW_OK;
}

/* --- decoding -----------------------------------------------------------------------------------
 */

mw_status mw__tok_decode_table(mw_tokenizer *tok, const int32_t *vocab_ids, const uint32_t *offs,
                               const uint32_t *lens) {
    size_t n = (size_t)tok->size;
    tok->decoded_off = mw__malloc((n ? n : 1) * sizeof *tok->decoded_off);
    tok->decoded_len = mw__malloc((n ? n : 1) * sizeof *tok->decoded_len);
    tok->is_special = mw__calloc(n ? n : 1, 1);
    if (!tok->decoded_off || !tok->decoded_len || !tok->is_special)
        return mw__error(MW_ERR_NOMEM, "out of memory for the decoding table of %zu ids", n);
    for (size_t i = 0; i < n; i++) tok->decoded_len[i] = UINT32_MAX;
    /* Vocabulary tokens: through the byte alphabet when every character is in it (the bytes
     * are never more than the text), else their own text, as the ByteLevel decoder does. */
    size_t most = 0;
    for (int32_t i = 0; i < tok->vocab_count; i++)
        if (lens[i] > most) most = lens[i];
    uint8_t *buf = mw__malloc(most ? most : 1);
    if (!buf) return mw__error(MW_ERR_NOMEM, "out of memory for the decoding table");
    mw_status st = MW_OK;
    for (int32_t i = 0; i < tok->vocab_count && st == MW_OK; i++) {
        const uint8_t *s = (const uint8_t *)tok->arena + offs[i];
        size_t k = 0, at = 0;
        int mapped = 1;
        while (at < lens[i] && mapped) {
            uint32_t cp;
            size_t l = mw__utf8_decode(s + at, lens[i] - at, &cp);
            int b = l ? mw__char_byte(cp) : -1;
            if (b < 0) mapped = 0;
            buf[k++] = (uint8_t)b;
            at += l;
        }
        int32_t id = vocab_ids[i];
        if (mapped) {
            st = mw__tok_store(tok, buf, k, &tok->decoded_off[id]);
            tok->decoded_len[id] = (uint32_t)k;
        } else {
            tok->decoded_off[id] = offs[i];
            tok->decoded_len[id] = lens[i];
        }
    }
    mw__free(buf);
    if (st) return st;
    for (uint32_t i = 0; i < tok->nadded; i++) {
        const mw__added *a = &tok->added[i];
        tok->decoded_off[a->id] = a->off;
        tok->decoded_len[a->id] = a->len;
        tok->is_special[a->id] = a->special ? 2 : 1;
    }
    return MW_OK;
}

mw_status mw__tok_cache(mw_tokenizer *tok) {
    size_t bytes = 2 * (size_t)MW__CACHE_SETS * sizeof *tok->cache;
    tok->cache = mw__aligned_alloc(64, bytes);
    if (!tok->cache) return mw__error(MW_ERR_NOMEM, "out of memory for the tokenizer's cache");
    memset(tok->cache, 0, bytes);
    return MW_OK;
}
