/* Token data for GPT-2: loaders, the arithmetic corpus, the split and the batch makers. */
#include "gpt2_data.h"

#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* --- random numbers --------------------------------------------------------------------------- */

void gpt2_rng_seed(gpt2_rng *r, uint64_t seed) { r->state = seed; }

uint64_t gpt2_rng_next(gpt2_rng *r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double gpt2_rng_uniform(gpt2_rng *r) { return (double)(gpt2_rng_next(r) >> 11) * 0x1p-53; }

uint64_t gpt2_rng_below(gpt2_rng *r, uint64_t n) {
    /* Rejects the top partial block of 2^64 so every residue is equally likely. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n, x;
    do x = gpt2_rng_next(r);
    while (x >= limit);
    return x % n;
}

/* --- files ------------------------------------------------------------------------------------ */

/* Opens a regular file and reports its size; MW_ERR_IO naming the path otherwise. */
static mw_status open_file(const char *path, FILE **f, int64_t *size, char *err, size_t errsize) {
    mw_status st = mw_input_open(path, NULL, 0, f, size);
    if (st != MW_OK) snprintf(err, errsize, "%s", mw_last_error());
    return st;
}

/* Reads exactly n bytes; MW_ERR_IO naming the path when the file ends early or fails. */
static mw_status read_exact(FILE *f, void *dst, size_t n, const char *path, char *err,
                            size_t errsize) {
    if (n == 0 || fread(dst, 1, n, f) == n) return MW_OK;
    snprintf(err, errsize, "cannot read %s: %s", path,
             ferror(f) ? strerror(errno) : "the file ended early (changed while reading?)");
    return MW_ERR_IO;
}

mw_status gpt2_tokens_load_text(const char *path, gpt2_tokens *out, char *err, size_t errsize) {
    memset(out, 0, sizeof *out);
    FILE *f;
    int64_t size;
    mw_status st = open_file(path, &f, &size, err, errsize);
    if (st != MW_OK) return st;
    if (size == 0) {
        snprintf(err, errsize, "%s is empty: no tokens to train on", path);
        fclose(f);
        return MW_ERR_FORMAT;
    }
    unsigned char *bytes = malloc((size_t)size);
    uint16_t *ids = malloc((size_t)size * sizeof *ids);
    if (!bytes || !ids) {
        snprintf(err, errsize, "out of memory reading %s (%lld bytes)", path, (long long)size);
        st = MW_ERR_NOMEM;
    } else {
        st = read_exact(f, bytes, (size_t)size, path, err, errsize);
    }
    fclose(f);
    if (st == MW_OK) {
        for (int64_t i = 0; i < size; i++) ids[i] = bytes[i];
        *out = (gpt2_tokens){ids, size, 1};
        ids = NULL;
    }
    free(bytes);
    free(ids);
    return st;
}

mw_status gpt2_tokens_encode_text(const char *path, mw_tokenizer *tok, gpt2_tokens *out,
                                  double *seconds, char *err, size_t errsize) {
    memset(out, 0, sizeof *out);
    if (mw_tokenizer_vocab_size(tok) > 65536) {
        snprintf(err, errsize,
                 "the tokenizer has %d tokens; token data holds ids below 65536 (uint16)",
                 (int)mw_tokenizer_vocab_size(tok));
        return MW_ERR_UNSUPPORTED;
    }
    FILE *f;
    int64_t size;
    mw_status st = open_file(path, &f, &size, err, errsize);
    if (st != MW_OK) return st;
    char *bytes = malloc((size_t)size + 1);
    size_t cap = mw_tokenizer_max_ids(tok, (size_t)size), n = 0;
    int32_t *ids = cap < ((size_t)1 << 40) ? malloc((cap ? cap : 1) * sizeof *ids) : NULL;
    uint16_t *narrow = NULL;
    if (!bytes || !ids) {
        snprintf(err, errsize, "out of memory reading %s (%lld bytes)", path, (long long)size);
        st = MW_ERR_NOMEM;
    } else {
        st = read_exact(f, (unsigned char *)bytes, (size_t)size, path, err, errsize);
    }
    fclose(f);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (st == MW_OK && (st = mw_tokenizer_encode(tok, bytes, (size_t)size, ids, cap, &n)))
        snprintf(err, errsize, "encoding %s: %s", path, mw_last_error());
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (seconds)
        *seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (st == MW_OK && n == 0) {
        snprintf(err, errsize, "%s is empty: no tokens to train on", path);
        st = MW_ERR_FORMAT;
    }
    if (st == MW_OK && !(narrow = malloc(n * sizeof *narrow))) {
        snprintf(err, errsize, "out of memory encoding %s", path);
        st = MW_ERR_NOMEM;
    }
    if (st == MW_OK) {
        for (size_t i = 0; i < n; i++) narrow[i] = (uint16_t)ids[i];
        *out = (gpt2_tokens){narrow, (int64_t)n, 1};
    }
    free(bytes);
    free(ids);
    return st;
}

mw_status gpt2_tokens_load_shard(const char *path, gpt2_tokens *out, char *err, size_t errsize) {
    memset(out, 0, sizeof *out);
    FILE *f;
    int64_t size;
    int32_t header[GPT2_HEADER_INTS];
    const int64_t header_bytes = (int64_t)sizeof header;
    mw_status st = open_file(path, &f, &size, err, errsize);
    if (st != MW_OK) return st;
    if (size < header_bytes) {
        snprintf(err, errsize,
                 "%s is not an llm.c token shard: the header needs %lld bytes, the file has %lld",
                 path, (long long)header_bytes, (long long)size);
        fclose(f);
        return MW_ERR_FORMAT;
    }
    st = read_exact(f, header, sizeof header, path, err, errsize);
    if (st != MW_OK) goto fail;
    st = MW_ERR_FORMAT;
    if (header[0] != GPT2_SHARD_MAGIC) {
        snprintf(err, errsize, "%s is not an llm.c token shard: magic %d, expected %d%s", path,
                 header[0], GPT2_SHARD_MAGIC,
                 header[0] == 20240326 ? " (it is a GPT-2 model file: pass it to --load)" : "");
        goto fail;
    }
    if (header[1] != GPT2_SHARD_VERSION) {
        snprintf(err, errsize, "%s: token shard version %d is not supported (only %d)", path,
                 header[1], GPT2_SHARD_VERSION);
        goto fail;
    }
    int64_t count = header[2];
    int64_t expected = header_bytes + 2 * count;
    if (count < 0 || expected != size) {
        snprintf(err, errsize,
                 "%s: the header says %lld tokens, so the file should have %lld bytes, but it "
                 "has %lld (%s)",
                 path, (long long)count, (long long)expected, (long long)size,
                 expected > size ? "truncated" : "trailing bytes or a wrong count");
        goto fail;
    }
    if (count == 0) {
        snprintf(err, errsize, "%s holds no tokens", path);
        goto fail;
    }
    uint16_t *ids = malloc((size_t)count * sizeof *ids);
    if (!ids) {
        snprintf(err, errsize, "out of memory reading %lld tokens from %s", (long long)count, path);
        st = MW_ERR_NOMEM;
        goto fail;
    }
    st = read_exact(f, ids, (size_t)count * sizeof *ids, path, err, errsize);
    if (st != MW_OK) {
        free(ids);
        goto fail;
    }
    fclose(f);
    *out = (gpt2_tokens){ids, count, 1};
    return MW_OK;
fail:
    fclose(f);
    return st;
}

/* Whether the file starts with the shard magic (any read failure: no). */
static int has_shard_magic(const char *path) {
    FILE *f = NULL;
    int32_t magic = 0;
    int yes = mw_input_open(path, NULL, 0, &f, NULL) == MW_OK &&
              fread(&magic, sizeof magic, 1, f) == 1 && magic == GPT2_SHARD_MAGIC;
    if (f) fclose(f);
    return yes;
}

gpt2_data_format gpt2_data_detect(const char *path, gpt2_data_format format) {
    if (format != GPT2_DATA_AUTO) return format;
    size_t n = strlen(path);
    int bin = n >= 4 && strcmp(path + n - 4, ".bin") == 0;
    return bin || has_shard_magic(path) ? GPT2_DATA_SHARD : GPT2_DATA_TEXT;
}

mw_status gpt2_tokens_load(const char *path, gpt2_data_format format, gpt2_tokens *out, char *err,
                           size_t errsize) {
    format = gpt2_data_detect(path, format);
    return format == GPT2_DATA_SHARD ? gpt2_tokens_load_shard(path, out, err, errsize)
                                     : gpt2_tokens_load_text(path, out, err, errsize);
}

void gpt2_tokens_free(gpt2_tokens *t) {
    if (t->owned) free(t->ids);
    memset(t, 0, sizeof *t);
}

void gpt2_tokens_split(const gpt2_tokens *all, double val_fraction, gpt2_tokens *train,
                       gpt2_tokens *val) {
    int64_t nval = (int64_t)((double)all->count * val_fraction);
    *train = (gpt2_tokens){all->ids, all->count - nval, 0};
    *val = (gpt2_tokens){all->ids + (all->count - nval), nval, 0};
}

mw_status gpt2_tokens_check_vocab(const gpt2_tokens *t, int vocab, const char *what, char *err,
                                  size_t errsize) {
    for (int64_t i = 0; i < t->count; i++) {
        if (t->ids[i] < vocab) continue;
        snprintf(err, errsize,
                 "%s: token %d at position %lld is outside the model's vocabulary of %d", what,
                 t->ids[i], (long long)i, vocab);
        return MW_ERR_INVALID;
    }
    return MW_OK;
}

double gpt2_tokens_entropy(const gpt2_tokens *t) {
    if (t->count <= 0) return NAN;
    int64_t *counts = calloc(65536, sizeof *counts);
    if (!counts) return NAN;
    for (int64_t i = 0; i < t->count; i++) counts[t->ids[i]]++;
    double h = 0.0, n = (double)t->count;
    for (int v = 0; v < 65536; v++)
        if (counts[v]) h -= (double)counts[v] / n * log((double)counts[v] / n);
    free(counts);
    return h;
}

/* --- the arithmetic corpus -------------------------------------------------------------------- */

/* An operand of 1 to 3 digits, each length equally likely; no leading zeros. */
static int operand(gpt2_rng *r) {
    static const int lo[3] = {0, 10, 100}, span[3] = {10, 90, 900};
    int digits = (int)gpt2_rng_below(r, 3);
    return lo[digits] + (int)gpt2_rng_below(r, (uint64_t)span[digits]);
}

mw_status gpt2_corpus_generate(uint64_t seed, int64_t bytes, gpt2_tokens *out) {
    memset(out, 0, sizeof *out);
    if (bytes < 1) return MW_ERR_INVALID;
    const int64_t longest = 16; /* "999+999=1998\n" is 13 */
    uint16_t *ids = malloc((size_t)(bytes + longest) * sizeof *ids);
    if (!ids) return MW_ERR_NOMEM;
    gpt2_rng r;
    gpt2_rng_seed(&r, seed);
    int64_t n = 0;
    while (n < bytes) {
        int a = operand(&r), b = operand(&r), plus = (int)gpt2_rng_below(&r, 2);
        if (!plus && a < b) { /* keep results non-negative */
            int t = a;
            a = b;
            b = t;
        }
        char line[32];
        int len = snprintf(line, sizeof line, "%d%c%d=%d\n", a, plus ? '+' : '-', b,
                           plus ? a + b : a - b);
        for (int i = 0; i < len; i++) ids[n++] = (unsigned char)line[i];
    }
    *out = (gpt2_tokens){ids, n, 1};
    return MW_OK;
}

/* Parses a number of 1 to max_digits digits without leading zeros at s[*i]. -1 when none. */
static long parse_number(const char *s, size_t len, size_t *i, int max_digits) {
    size_t start = *i;
    long v = 0;
    while (*i < len && s[*i] >= '0' && s[*i] <= '9' && (int)(*i - start) < max_digits + 1)
        v = 10 * v + (s[(*i)++] - '0');
    size_t n = *i - start;
    if (n == 0 || (int)n > max_digits || (n > 1 && s[start] == '0')) return -1;
    return v;
}

gpt2_line_kind gpt2_corpus_check_line(const char *line, size_t len) {
    size_t i = 0;
    long a = parse_number(line, len, &i, 3);
    if (a < 0 || i >= len || (line[i] != '+' && line[i] != '-')) return GPT2_LINE_MALFORMED;
    char op = line[i++];
    long b = parse_number(line, len, &i, 3);
    if (b < 0 || i >= len || line[i++] != '=') return GPT2_LINE_MALFORMED;
    long c = parse_number(line, len, &i, 4);
    if (c < 0 || i != len) return GPT2_LINE_MALFORMED;
    return c == (op == '+' ? a + b : a - b) ? GPT2_LINE_CORRECT : GPT2_LINE_WRONG;
}

void gpt2_corpus_score(const char *text, size_t len, int from_line_start, int *lines,
                       int *well_formed, int *correct) {
    *lines = *well_formed = *correct = 0;
    size_t start = 0;
    int complete = from_line_start;
    for (size_t i = 0; i < len; i++) {
        if (text[i] != '\n') continue;
        if (complete) {
            gpt2_line_kind k = gpt2_corpus_check_line(text + start, i - start);
            ++*lines;
            *well_formed += k != GPT2_LINE_MALFORMED;
            *correct += k == GPT2_LINE_CORRECT;
        }
        complete = 1;
        start = i + 1;
    }
}

/* --- batches ---------------------------------------------------------------------------------- */

mw_status gpt2_batch_new(int batch, int seq, gpt2_batch *out) {
    memset(out, 0, sizeof *out);
    if (batch < 1 || seq < 1) return MW_ERR_INVALID;
    size_t n = (size_t)batch * (size_t)seq;
    out->tokens = malloc(n * sizeof *out->tokens);
    out->targets = malloc(n * sizeof *out->targets);
    if (!out->tokens || !out->targets) {
        gpt2_batch_free(out);
        return MW_ERR_NOMEM;
    }
    out->batch = batch;
    out->seq = seq;
    return MW_OK;
}

void gpt2_batch_free(gpt2_batch *b) {
    free(b->tokens);
    free(b->targets);
    memset(b, 0, sizeof *b);
}

void gpt2_batch_feeds(const gpt2_batch *b, mw_feed feeds[2]) {
    int64_t n = (int64_t)b->batch * b->seq;
    feeds[0] = (mw_feed){"tokens", b->tokens, n};
    feeds[1] = (mw_feed){"targets", b->targets, n};
}

int64_t gpt2_batch_count(const gpt2_tokens *t, int batch, int seq) {
    int64_t bt = (int64_t)batch * seq;
    return t->count > bt ? (t->count - 1) / bt : 0;
}

mw_status gpt2_batch_check(const gpt2_tokens *t, int batch, int seq, int random, const char *what,
                           char *err, size_t errsize) {
    int64_t need = random ? (int64_t)seq + 1 : (int64_t)batch * seq + 1;
    if (t->count >= need) return MW_OK;
    if (random)
        snprintf(err, errsize, "%s has %lld tokens; sequences of %d need at least %lld", what,
                 (long long)t->count, seq, (long long)need);
    else
        snprintf(err, errsize, "%s has %lld tokens; a batch of %d x %d needs at least %lld", what,
                 (long long)t->count, batch, seq, (long long)need);
    return MW_ERR_INVALID;
}

void gpt2_batch_sequential(gpt2_batch *b, const gpt2_tokens *t, int64_t k) {
    int64_t bt = (int64_t)b->batch * b->seq;
    const uint16_t *p = t->ids + (k % gpt2_batch_count(t, b->batch, b->seq)) * bt;
    for (int64_t i = 0; i < bt; i++) {
        b->tokens[i] = p[i];
        b->targets[i] = p[i + 1];
    }
}

void gpt2_batch_random(gpt2_batch *b, const gpt2_tokens *t, gpt2_rng *rng) {
    for (int s = 0; s < b->batch; s++) {
        const uint16_t *p = t->ids + gpt2_rng_below(rng, (uint64_t)(t->count - b->seq));
        int32_t *tok = b->tokens + (int64_t)s * b->seq, *tgt = b->targets + (int64_t)s * b->seq;
        for (int i = 0; i < b->seq; i++) {
            tok[i] = p[i];
            tgt[i] = p[i + 1];
        }
    }
}
