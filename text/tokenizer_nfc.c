/* NFC (tokenizer_nfc.h), in the three steps of Unicode's algorithm over the tables of
 * text/unicode_nfc.c. tools/make_nfc_tables.py --check runs the same steps over the same tables
 * against tokenizers' NFC on every code point and on millions of sequences. */
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "formats/utf8.h"
#include "text/tokenizer_nfc.h"

#define RAW 0x80000000u /* a byte that is not UTF-8: RAW | the byte */

enum {
    SBASE = 0xAC00,
    LBASE = 0x1100,
    VBASE = 0x1161,
    TBASE = 0x11A7,
    LCOUNT = 19,
    VCOUNT = 21,
    TCOUNT = 28,
    NCOUNT = VCOUNT * TCOUNT,
    SCOUNT = LCOUNT * NCOUNT
};

static int may_change(uint32_t cp) {
    return mw__nfc_stage2[mw__nfc_stage1[cp >> 8]][(cp & 255) >> 3] >> (cp & 7) & 1;
}

int mw__nfc_may_change(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        if (s[i] < 0xCC) { /* below U+0300 nothing changes */
            i++;
            continue;
        }
        uint32_t cp;
        size_t l = mw__utf8_decode(s + i, n - i, &cp);
        if (l && may_change(cp)) return 1;
        i += l ? l : 1;
    }
    return 0;
}

static int ccc(uint32_t cp) {
    if (cp < 0x300 || cp & RAW) return 0;
    size_t lo = 0, hi = mw__nfc_nclasses;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        uint32_t c = mw__nfc_classes[mid] >> 8;
        if (c == cp) return (int)(mw__nfc_classes[mid] & 255);
        if (c < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

static const mw__nfc_decomposition *decomposition(uint32_t cp) {
    size_t lo = 0, hi = mw__nfc_ndecompositions;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        uint32_t c = mw__nfc_decompositions[mid].cp;
        if (c == cp) return &mw__nfc_decompositions[mid];
        if (c < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* What a and b compose to, or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
    if (a & RAW || b & RAW) return 0;
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE &&
        b < TBASE + TCOUNT)
        return a + (b - TBASE);
    uint64_t key = (uint64_t)a << 21 | b;
    size_t lo = 0, hi = mw__nfc_npairs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        uint64_t k = mw__nfc_pairs[mid].key;
        if (k == key) return mw__nfc_pairs[mid].cp;
        if (k < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

/* Room for n more bytes at b->out + used. */
static mw_status room(mw__nfc_buf *b, size_t used, size_t n) {
    if (n > SIZE_MAX - used) return mw__error(MW_ERR_NOMEM, "out of memory for NFC");
    if (used + n <= b->ocap && b->out) return MW_OK;
    size_t cap = b->ocap ? b->ocap : 256;
    while (cap < used + n) cap = cap > SIZE_MAX / 2 ? used + n : 2 * cap;
    uint8_t *o = mw__realloc(b->out, cap);
    if (!o) return mw__error(MW_ERR_NOMEM, "out of memory for the NFC of %zu bytes", used + n);
    b->out = o;
    b->ocap = cap;
    return MW_OK;
}

/* The NFC of s[0, n), a stretch that begins and ends where NFC may cut (see mw__nfc), appended
 * at b->out + *o. */
static mw_status nfc_stretch(mw__nfc_buf *b, const uint8_t *s, size_t n, size_t *o) {
    /* A character of k bytes decomposes into at most k + 1 code points (U+0390: 2 bytes, 3). */
    if (n > SIZE_MAX / (2 * sizeof *b->cps))
        return mw__error(MW_ERR_NOMEM, "out of memory for NFC");
    if (2 * n > b->ncap) {
        uint32_t *c = mw__realloc(b->cps, 2 * n * sizeof *c);
        if (!c) return mw__error(MW_ERR_NOMEM, "out of memory for the NFC of %zu bytes", n);
        b->cps = c;
        b->ncap = 2 * n;
    }
    uint32_t *d = b->cps;
    size_t m = 0;
    /* 1. Decompose. */
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = mw__utf8_decode(s + i, n - i, &cp);
        i += l ? l : 1;
        const mw__nfc_decomposition *dc;
        if (!l) {
            d[m++] = RAW | cp;
        } else if (cp >= SBASE && cp < SBASE + SCOUNT) {
            uint32_t k = cp - SBASE;
            d[m++] = LBASE + k / NCOUNT;
            d[m++] = VBASE + k % NCOUNT / TCOUNT;
            if (k % TCOUNT) d[m++] = TBASE + k % TCOUNT;
        } else if (cp >= 0xC0 && (dc = decomposition(cp))) {
            memcpy(d + m, mw__nfc_pool + dc->off, dc->len * sizeof *d);
            m += dc->len;
        } else {
            d[m++] = cp;
        }
    }
    /* 2. Each run of marks in order of class, stably (insertion sort: runs are short). */
    for (size_t i = 1; i < m; i++) {
        int c = ccc(d[i]);
        if (c == 0) continue;
        uint32_t v = d[i];
        size_t j = i;
        while (j > 0 && ccc(d[j - 1]) > c) {
            d[j] = d[j - 1];
            j--;
        }
        d[j] = v;
    }
    /* 3. Compose each character with the last starter when nothing between blocks it: every
     * character between has a class (not 0) below its own, or there is none. Only a character
     * NFC may change is the second of a pair (all are U+0300 or above). */
    size_t k = 0, starter = SIZE_MAX;
    int last = 0;
    for (size_t i = 0; i < m; i++) {
        uint32_t cp = d[i];
        int c = ccc(cp);
        if (starter != SIZE_MAX && cp >= 0x300 && (last < c || (last == 0 && k == starter + 1))) {
            uint32_t p = compose(d[starter], cp);
            if (p) {
                d[starter] = p;
                continue;
            }
        }
        if (c == 0) starter = k;
        last = c;
        d[k++] = cp;
    }
    mw_status st = room(b, *o, 4 * k);
    if (st) return st;
    for (size_t i = 0; i < k; i++) {
        if (d[i] & RAW)
            b->out[(*o)++] = (uint8_t)d[i];
        else
            *o += mw__utf8_encode(d[i], b->out + *o);
    }
    return MW_OK;
}

/* The text is cut before each character NFC cannot change (nor a mark reorder across, nor one
 * compose with: a starter that is not the second of any pair): NFC(x y) is NFC(x) NFC(y) there.
 * Stretches of such characters are copied; each stretch around the others (from the last such
 * character before them, which may compose with what follows, to the next after them) goes
 * through the three steps. A byte that is not UTF-8 is such a character. */
mw_status mw__nfc(mw__nfc_buf *b, const uint8_t *s, size_t n, size_t *len) {
    *len = 0;
    size_t o = 0, done = 0, last = 0;
    mw_status st = room(b, 0, n);
    for (size_t i = 0; i < n && st == MW_OK;) {
        uint32_t cp = s[i];
        size_t l = 1;
        if (cp >= 0x80 && (l = mw__utf8_decode(s + i, n - i, &cp)) == 0) l = 1, cp = 0;
        if (cp < 0x300 || !may_change(cp)) {
            last = i;
            i += l;
            continue;
        }
        size_t j = i + l;
        while (j < n) {
            uint32_t c2 = s[j];
            size_t l2 = 1;
            if (c2 >= 0x80 && (l2 = mw__utf8_decode(s + j, n - j, &c2)) == 0) l2 = 1, c2 = 0;
            if (c2 < 0x300 || !may_change(c2)) break;
            j += l2;
        }
        if ((st = room(b, o, last - done)) != MW_OK) break;
        memcpy(b->out + o, s + done, last - done);
        o += last - done;
        st = nfc_stretch(b, s + last, j - last, &o);
        done = last = i = j;
    }
    if (st == MW_OK && (st = room(b, o, n - done)) == MW_OK) {
        memcpy(b->out + o, s + done, n - done);
        o += n - done;
    }
    if (st) return st;
    *len = o;
    return MW_OK;
}

void mw__nfc_free(mw__nfc_buf *b) {
    mw__free(b->cps);
    mw__free(b->out);
    memset(b, 0, sizeof *b);
}
