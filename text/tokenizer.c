/* Encoding and decoding (include/meshwit/tokenizer.h): added tokens cut out of the text, the rest
 * split by the pre-tokenizer's regex (tokenizer_split.c), each word merged by BPE through a heap as
 * tokenizers' Word::merge_all does, repeated words taken from a cache. */
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "text/tokenizer_impl.h"
#include "text/tokenizer_nfc.h"
#include "text/tokenizer_split.h"
#include "text/unicode.h"

/* --- output ------------------------------------------------------------------------------------
 */

#define STACK_SYMBOLS 64

typedef struct encoder {
    const mw_tokenizer *tok;
    mw__cache_slot *cache; /* NULL: another call holds it */
    int32_t *ids;
    size_t cap, n;
    mw_status st;
    /* scratch: the symbols of a word (sym, prev, next, gone), its heap, its result */
    size_t scap;
    int32_t *sym, *prev, *next, *word;
    uint8_t *gone;
    uint64_t *heap;
    int32_t s_sym[STACK_SYMBOLS], s_prev[STACK_SYMBOLS], s_next[STACK_SYMBOLS];
    int32_t s_word[STACK_SYMBOLS];
    uint8_t s_gone[STACK_SYMBOLS];
    uint64_t s_heap[3 * STACK_SYMBOLS];
    uint8_t *text; /* a piece with its prefix space */
    size_t tcap;
    uint8_t *alpha; /* a word in the byte alphabet (ignore_merges) */
    size_t acap;
    mw__nfc_buf nfc;   /* a piece normalized */
    size_t *word_lens; /* mw__tokenizer_words: each word's length instead of ids */
} encoder;

static void put(encoder *e, int32_t id) {
    if (e->word_lens) return;
    if (e->n < e->cap) e->ids[e->n] = id;
    e->n++;
}

static int nomem(encoder *e) {
    if (e->st == MW_OK) e->st = mw__error(MW_ERR_NOMEM, "out of memory encoding a word");
    return -1;
}

/* The word buffers back on the stack, those on the heap (if any) freed. */
static void stack_words(encoder *e) {
    if (e->sym != e->s_sym) {
        mw__free(e->sym);
        mw__free(e->prev);
        mw__free(e->next);
        mw__free(e->word);
        mw__free(e->gone);
        mw__free(e->heap);
    }
    e->sym = e->s_sym;
    e->prev = e->s_prev;
    e->next = e->s_next;
    e->word = e->s_word;
    e->gone = e->s_gone;
    e->heap = e->s_heap;
    e->scap = STACK_SYMBOLS;
}

/* Room for words of m symbols: 0, or -1 (out of memory). */
static int reserve(encoder *e, size_t m) {
    if (m <= e->scap) return 0;
    if (m > SIZE_MAX / (3 * sizeof(uint64_t))) return nomem(e);
    stack_words(e);
    e->sym = mw__malloc(m * sizeof *e->sym);
    e->prev = mw__malloc(m * sizeof *e->prev);
    e->next = mw__malloc(m * sizeof *e->next);
    e->word = mw__malloc(m * sizeof *e->word);
    e->gone = mw__malloc(m);
    e->heap = mw__malloc(3 * m * sizeof *e->heap);
    e->scap = m;
    if (!e->sym || !e->prev || !e->next || !e->word || !e->gone || !e->heap) {
        stack_words(e); /* frees what was made; nothing is freed twice */
        return nomem(e);
    }
    return 0;
}

/* *buf with room for n bytes (*cap of them now), or NULL out of memory. */
static uint8_t *grow(encoder *e, uint8_t **buf, size_t *cap, size_t n) {
    if (n > *cap) {
        uint8_t *t = mw__realloc(*buf, n);
        if (!t) {
            nomem(e);
            return NULL;
        }
        *buf = t;
        *cap = n;
    }
    return *buf;
}

/* --- BPE on one word ---------------------------------------------------------------------------
 */

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (h[parent] <= v) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0, len = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= len) break;
        if (c + 1 < len && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    if (len) h[i] = v;
    return top;
}

/* Pushes the merge of the pair (a, b) at position pos when there is one: rank first, then
 * position, so the heap yields the lowest rank and, among equals, the leftmost. */
static void candidate(const mw_tokenizer *tok, uint64_t *h, size_t *n, int32_t a, int32_t b,
                      int32_t pos) {
    const mw__pairmap_slot *s = mw__pairmap_find(&tok->merges, (uint32_t)a, (uint32_t)b);
    if (s->key != UINT64_MAX) heap_push(h, n, (uint64_t)s->rank << 32 | (uint32_t)pos);
}

/* The ids of word w (n >= 1 bytes) into e->word; their count, or -1 out of memory. The first
 * part is tokenizers' BPE::merge_word (a symbol per byte-level character, with the prefix, the
 * suffix, byte fallback and the unknown token as it has them), the second Word::merge_all. */
static int bpe(encoder *e, const uint8_t *w, size_t n) {
    const mw_tokenizer *tok = e->tok;
    if (n > SIZE_MAX / tok->max_ids_per_byte) return nomem(e);
    if (reserve(e, n * tok->max_ids_per_byte)) return -1;
    int32_t *sym = e->sym, *prev = e->prev, *next = e->next;
    int32_t count = 0, unk = MW__NO_ID;
#define ADD(id) (sym[count] = (id), count++)
    for (size_t i = 0; i < n; i++) {
        int v = (i > 0) | (i == n - 1) << 1;
        int32_t id = tok->byte_id[v][w[i]];
        if (id != MW__NO_ID) {
            if (unk != MW__NO_ID) ADD(unk);
            unk = MW__NO_ID;
            ADD(id);
            continue;
        }
        if (tok->byte_fallback && tok->byte_fb_count[v][w[i]]) {
            /* tokenizers adds these before an unknown token still pending */
            const int32_t *fb = tok->byte_fb_ids + tok->byte_fb_off[v][w[i]];
            for (int k = 0; k < tok->byte_fb_count[v][w[i]]; k++) ADD(fb[k]);
            continue;
        }
        if (tok->unk_id == MW__NO_ID) continue; /* no unk_token: the character is dropped */
        if (unk != MW__NO_ID && !tok->fuse_unk) ADD(unk);
        unk = tok->unk_id;
    }
    if (unk != MW__NO_ID) ADD(unk);
#undef ADD
    uint8_t *gone = e->gone;
    uint64_t *heap = e->heap;
    size_t nh = 0;
    for (int32_t i = 0; i < count; i++) {
        prev[i] = i - 1;
        next[i] = i + 1 < count ? i + 1 : -1;
        gone[i] = 0;
    }
    for (int32_t i = 0; i + 1 < count; i++) candidate(tok, heap, &nh, sym[i], sym[i + 1], i);
    while (nh) {
        uint64_t top = heap_pop(heap, &nh);
        uint32_t rank = (uint32_t)(top >> 32);
        int32_t p = (int32_t)(uint32_t)top, q = next[p];
        if (gone[p] || q < 0) continue;
        /* A stale entry: the pair at p has changed since it was pushed. */
        const mw__pairmap_slot *s =
            mw__pairmap_find(&tok->merges, (uint32_t)sym[p], (uint32_t)sym[q]);
        if (s->key == UINT64_MAX || s->id != tok->merge_id[rank]) continue;
        sym[p] = tok->merge_id[rank];
        gone[q] = 1;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = p;
        if (prev[p] >= 0) candidate(tok, heap, &nh, sym[prev[p]], sym[p], prev[p]);
        if (next[p] >= 0) candidate(tok, heap, &nh, sym[p], sym[next[p]], p);
    }
    int32_t k = 0;
    for (int32_t i = 0; i < count; i++)
        if (!gone[i]) e->word[k++] = sym[i];
    return k;
}

/* --- words -------------------------------------------------------------------------------------
 */

static void word(encoder *e, const uint8_t *w, size_t n) {
    const mw_tokenizer *tok = e->tok;
    mw__cache_slot *slot = NULL;
    uint32_t h32 = 0;
    if (e->word_lens) {
        if (e->n < e->cap) e->word_lens[e->n] = n;
        e->n++;
        return;
    }
    if (e->cache && n <= MW__CACHE_KEY) {
        uint64_t h = mw__hash_bytes(w, n);
        h32 = (uint32_t)(h >> 32) | 1;
        slot = &e->cache[2 * (h & (MW__CACHE_SETS - 1))];
        for (int k = 0; k < 2; k++)
            if (slot[k].hash == h32 && slot[k].klen == n && memcmp(slot[k].key, w, n) == 0) {
                for (int i = 0; i < slot[k].nids; i++) put(e, slot[k].ids[i]);
                return;
            }
    }
    int count;
    if (tok->ignore_merges) {
        /* A word that is a token as a whole is that token (in the byte alphabet, at most two
         * bytes a byte). */
        uint8_t *t = grow(e, &e->alpha, &e->acap, 2 * n);
        if (!t) return;
        size_t k = 0;
        for (size_t i = 0; i < n; i++) k += mw__utf8_encode(mw__byte_char(w[i]), t + k);
        const mw__strmap_slot *s = mw__strmap_get(&tok->vocab, tok->arena, (const char *)t, k);
        if (s) {
            e->word[0] = s->value;
            count = 1;
        } else {
            count = bpe(e, w, n);
        }
    } else {
        count = bpe(e, w, n);
    }
    if (count < 0) return;
    for (int i = 0; i < count; i++) put(e, e->word[i]);
    if (slot && count <= MW__CACHE_IDS) {
        slot[1] = slot[0]; /* the older entry of the set makes way */
        slot[0].hash = h32;
        slot[0].klen = (uint8_t)n;
        slot[0].nids = (uint8_t)count;
        memcpy(slot[0].key, w, n);
        memcpy(slot[0].ids, e->word, (size_t)count * sizeof *e->word);
    }
}

/* A piece for the ByteLevel pre-tokenizer: its prefix space, then GPT-2's regex (use_regex) or
 * the piece whole, each word to BPE. */
static void byte_level(encoder *e, const uint8_t *s, size_t n) {
    if (n == 0) return;
    if (e->tok->add_prefix_space && s[0] != ' ') {
        uint8_t *t = grow(e, &e->text, &e->tcap, n + 1);
        if (!t) return;
        t[0] = ' ';
        memcpy(t + 1, s, n);
        s = t;
        n++;
    }
    if (!e->tok->use_regex) {
        word(e, s, n);
        return;
    }
    for (size_t i = 0; i < n && e->st == MW_OK;) {
        size_t j = mw__split_end(MW__SPLIT_GPT2, s, i, n);
        word(e, s + i, j - i);
        i = j;
    }
}

/* A piece of text between added tokens: cut by the Split pre-tokenizer's pattern when there is
 * one, each part through ByteLevel. */
static void segment(encoder *e, const uint8_t *s, size_t n) {
    mw__split split = e->tok->split;
    if (split == MW__SPLIT_NONE) {
        byte_level(e, s, n);
        return;
    }
    for (size_t i = 0; i < n && e->st == MW_OK;) {
        size_t j = mw__split_end(split, s, i, n);
        byte_level(e, s + i, j - i);
        i = j;
    }
}

/* --- added tokens ------------------------------------------------------------------------------
 */

/* Where the white space ending at `end` starts (Rust's regex \s*$ on s[0, end), White_Space). */
static size_t space_before(const uint8_t *s, size_t end) {
    while (end > 0) {
        size_t back = 0;
        uint32_t cp;
        for (size_t l = 1; l <= 3 && l <= end && !back; l++)
            if (mw__utf8_decode(s + end - l, l, &cp) == l && mw__uc_class(cp) == MW__UC_SPACE)
                back = l;
        if (!back) break;
        end -= back;
    }
    return end;
}

/* The length of the white space at the start of s[0, n). */
static size_t space_after(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t l;
        if (mw__split_class(s, i, n, &l) != MW__UC_SPACE) break;
        i += l;
    }
    return i;
}

/* Whether s[0, end) ends with a word character (tokenizers' r"\w$", mw__uc_is_word). A byte
 * that does not end a valid UTF-8 sequence is a character of its own, and not a word one. */
static int word_before(const uint8_t *s, size_t end) {
    for (size_t l = 1; l <= 4 && l <= end; l++) {
        uint32_t cp;
        if (mw__utf8_decode(s + end - l, l, &cp) == l) return mw__uc_is_word(cp);
    }
    return 0;
}

/* Whether s[0, n) starts with a word character (r"^\w"). */
static int word_after(const uint8_t *s, size_t n) {
    uint32_t cp;
    return n > 0 && mw__utf8_decode(s, n, &cp) > 0 && mw__uc_is_word(cp);
}

static void added_pass(encoder *e, int p, const uint8_t *s, size_t n);

/* A piece between the added tokens of pass 0: normalized (NFC), then to pass 1, as tokenizers'
 * AddedVocabulary::extract_and_normalize normalizes what the tokens with "normalized": false
 * leave and matches those with "normalized": true in the result. */
static void normalized(encoder *e, const uint8_t *s, size_t n) {
    if (e->tok->nfc && mw__nfc_may_change(s, n)) {
        size_t len;
        mw_status st = mw__nfc(&e->nfc, s, n, &len);
        if (st) {
            if (e->st == MW_OK) e->st = st;
            return;
        }
        s = e->nfc.out;
        n = len;
    }
    added_pass(e, 1, s, n);
}

/* Pass p over s[0, n): the added tokens of that pass, leftmost-longest, as tokenizers'
 * AddedVocabulary::find_matches splits; what lies between goes to pass 1 (normalized), then to
 * segment. A "single_word" token next to a word character in s (the whole text in pass 0, one
 * normalized piece in pass 1) is no match, and, as in tokenizers' non-overlapping search, the
 * search goes on after it: neither a shorter token at its start nor one inside it is tried. Its
 * lstrip and rstrip apply only to a match, so white space they would take is no boundary. */
static void added_pass(encoder *e, int p, const uint8_t *s, size_t n) {
    const mw_tokenizer *tok = e->tok;
    const mw__added_pass *ps = &tok->pass[p];
    if (ps->count == 0) {
        if (p == 0)
            normalized(e, s, n);
        else
            segment(e, s, n);
        return;
    }
    size_t offset = 0, i = 0;
    while (i < n && e->st == MW_OK) {
        uint32_t lo = ps->first[s[i]], hi = ps->first[s[i] + 1];
        const mw__added *hit = NULL;
        for (uint32_t k = lo; k < hi && !hit; k++) {
            const mw__added *a = &tok->added[ps->order[k]];
            if (a->match_len <= n - i &&
                memcmp(tok->arena + a->match_off, s + i, a->match_len) == 0)
                hit = a;
        }
        if (!hit) {
            i++;
            continue;
        }
        size_t start = i, stop = i + hit->match_len;
        if (hit->single_word && (word_before(s, start) || word_after(s + stop, n - stop))) {
            i = stop;
            continue;
        }
        if (hit->lstrip) {
            size_t from = space_before(s, start);
            start = from > offset ? from : offset;
        }
        if (hit->rstrip) stop += space_after(s + stop, n - stop);
        if (offset < start) {
            if (p == 0)
                normalized(e, s + offset, start - offset);
            else
                segment(e, s + offset, start - offset);
        }
        put(e, hit->id);
        offset = stop;
        i += hit->match_len;
    }
    if (offset < n && e->st == MW_OK) {
        if (p == 0)
            normalized(e, s + offset, n - offset);
        else
            segment(e, s + offset, n - offset);
    }
}

/* --- the API -----------------------------------------------------------------------------------
 */

/* Runs e over text[0, len) (the template's tokens around it with `special`): e->n ids or words,
 * e->st. */
static void run_encoder(encoder *e, const char *text, size_t len, int special) {
    mw_tokenizer *tok = (mw_tokenizer *)e->tok;
    e->sym = e->s_sym;
    stack_words(e);
    mw__split_init();
    if (special)
        for (uint32_t k = 0; k < tok->template_before; k++) put(e, tok->template_ids[k]);
    int locked = pthread_mutex_trylock(&tok->cache_lock) == 0;
    if (locked) e->cache = tok->cache;
    added_pass(e, 0, (const uint8_t *)text, len);
    if (locked) pthread_mutex_unlock(&tok->cache_lock);
    if (special)
        for (uint32_t k = 0; k < tok->template_after; k++)
            put(e, tok->template_ids[tok->template_before + k]);
    stack_words(e);
    mw__free(e->text);
    mw__free(e->alpha);
    mw__nfc_free(&e->nfc);
}

mw_status mw_tokenizer_encode_with(mw_tokenizer *tok, const char *text, size_t len, unsigned flags,
                                   int32_t *ids, size_t cap, size_t *n) {
    if (n) *n = 0;
    if (!tok || !n || (len && !text) || (cap && !ids))
        return mw__error(MW_ERR_INVALID, "mw_tokenizer_encode: NULL argument");
    if (flags & ~(unsigned)MW_ENCODE_ADD_SPECIAL)
        return mw__error(MW_ERR_INVALID,
                         "mw_tokenizer_encode_with: unknown flags 0x%x (MW_ENCODE_ADD_SPECIAL is "
                         "0x%x)",
                         flags & ~(unsigned)MW_ENCODE_ADD_SPECIAL, (unsigned)MW_ENCODE_ADD_SPECIAL);
    encoder e = {.tok = tok, .ids = ids, .cap = cap};
    run_encoder(&e, text, len, (flags & MW_ENCODE_ADD_SPECIAL) != 0);
    if (e.st) return e.st;
    *n = e.n;
    if (e.n > cap)
        return mw__error(MW_ERR_SHAPE,
                         "mw_tokenizer_encode: the text (%zu bytes) needs %zu ids, the buffer "
                         "holds %zu",
                         len, e.n, cap);
    return MW_OK;
}

mw_status mw__tokenizer_words(mw_tokenizer *tok, const char *text, size_t len, size_t *lens,
                              size_t cap, size_t *n) {
    if (n) *n = 0;
    if (!tok || !n || (len && !text) || (cap && !lens))
        return mw__error(MW_ERR_INVALID, "MW_TEST_TOKENIZER_WORDS: NULL argument");
    size_t dummy;
    encoder e = {.tok = tok, .word_lens = lens ? lens : &dummy, .cap = cap};
    run_encoder(&e, text, len, 0);
    if (e.st) return e.st;
    *n = e.n;
    if (e.n > cap)
        return mw__error(MW_ERR_SHAPE,
                         "MW_TEST_TOKENIZER_WORDS: the text (%zu bytes) has %zu words, the "
                         "buffer holds %zu",
                         len, e.n, cap);
    return MW_OK;
}

mw_status mw_tokenizer_encode(mw_tokenizer *tok, const char *text, size_t len, int32_t *ids,
                              size_t cap, size_t *n) {
    return mw_tokenizer_encode_with(tok, text, len, 0, ids, cap, n);
}

mw_status mw_tokenizer_decode(const mw_tokenizer *tok, const int32_t *ids, size_t n, char *buf,
                              size_t cap, size_t *len) {
    if (len) *len = 0;
    if (!tok || !len || (n && !ids) || (cap && !buf))
        return mw__error(MW_ERR_INVALID, "mw_tokenizer_decode: NULL argument");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tok->size || tok->decoded_len[id] == UINT32_MAX)
            return mw__error(MW_ERR_INVALID,
                             "mw_tokenizer_decode: id %d at position %zu is not a token of the "
                             "tokenizer (ids 0 to %d%s)",
                             id, i, tok->size - 1,
                             id >= 0 && id < tok->size ? ", with this one unassigned" : "");
        size_t l = tok->decoded_len[id];
        if (total < cap)
            memcpy(buf + total, tok->arena + tok->decoded_off[id],
                   l < cap - total ? l : cap - total);
        total += l;
    }
    *len = total;
    if (total > cap)
        return mw__error(MW_ERR_SHAPE,
                         "mw_tokenizer_decode: the %zu ids decode to %zu bytes, the buffer holds "
                         "%zu",
                         n, total, cap);
    return MW_OK;
}
