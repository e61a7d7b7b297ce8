/* GPT-2's byte-level BPE tokenizer (meshwit/tokenizer.h) against Hugging Face `tokenizers`: the
 * ids it gives every line of a corpus of prose, code, white space, emoji and many scripts, for a
 * tokenizer trained by `tokenizers` and saved both as tokenizer.json and as vocab.json +
 * merges.txt, and for variants with the settings GPT-2 does not use (tests/data/tokenizer, made
 * by tools/make_tokenizer_ref.py); decode(encode(x)) == x for any bytes; damaged files refused
 * with the file and the place; out of memory everywhere.
 *
 * Files written by a test go to its own mkdtemp directory, removed afterwards. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "meshwit.h"
#include "meshwit/testing.h"
#include "tests/common/tokenizer_data.h"

/* --- the reference files ---------------------------------------------------------------------- */

typedef struct ref_case {
    char *text;
    size_t len;
    int32_t *ids;
    size_t nids;
} ref_case;

static ref_case *corpus;
static size_t ncorpus;

/* corpus.txt: "text<TAB>ids" per line. */
static void load_corpus(void) {
    char *all = read_all(data_path("corpus.txt"), NULL);
    size_t cap = 256;
    corpus = calloc(cap, sizeof *corpus);
    ncorpus = 0;
    for (char *line = all; *line;) {
        char *nl = strchr(line, '\n');
        *nl = '\0';
        char *tab = strrchr(line, '\t');
        cr_assert_not_null(tab, "corpus.txt line %zu has no tab", ncorpus + 1);
        *tab = '\0';
        if (ncorpus == cap) corpus = realloc(corpus, (cap *= 2) * sizeof *corpus);
        ref_case *c = &corpus[ncorpus++];
        size_t n = (size_t)(tab - line);
        c->text = malloc(n + 1);
        memcpy(c->text, line, n);
        c->len = unescape(c->text, n);
        c->ids = parse_ids(tab + 1, &c->nids);
        line = nl + 1;
    }
    free(all);
    cr_assert_gt(ncorpus, 200);
}

static void free_corpus(void) {
    for (size_t i = 0; i < ncorpus; i++) {
        free(corpus[i].text);
        free(corpus[i].ids);
    }
    free(corpus);
    corpus = NULL;
    ncorpus = 0;
}

static void expect_ids(mw_tokenizer *tok, const ref_case *c, const char *what, size_t line) {
    size_t n;
    int32_t *ids = encode(tok, c->text, c->len, &n);
    size_t i = 0;
    while (i < n && i < c->nids && ids[i] == c->ids[i]) i++;
    cr_expect(i == n && n == c->nids,
              "%s, corpus line %zu (%.60s): id %zu is %d, Hugging Face has %d (%zu ids, it has "
              "%zu)",
              what, line, c->text, i, i < n ? ids[i] : -1, i < c->nids ? c->ids[i] : -1, n,
              c->nids);
    free(ids);
}

/* --- ids as Hugging Face gives them ------------------------------------------------------------
 */

TestSuite(tokenizer_hf, .init = load_corpus, .fini = free_corpus, .timeout = 60);

Test(tokenizer_hf, tokenizer_json_every_line) {
    mw_tokenizer *tok = load(data_path("tokenizer.json"));
    cr_assert_eq(mw_tokenizer_vocab_size(tok), 3000);
    for (int pass = 0; pass < 2; pass++) /* the second pass takes words from the cache */
        for (size_t i = 0; i < ncorpus; i++) expect_ids(tok, &corpus[i], "tokenizer.json", i + 1);
    mw_tokenizer_free(tok);
}

Test(tokenizer_hf, gpt2_vocab_and_merges_every_line) {
    mw_tokenizer *tok = load(data_path("gpt2"));
    cr_assert_eq(mw_tokenizer_vocab_size(tok), 3000);
    int32_t eot;
    cr_assert_eq(mw_tokenizer_token_id(tok, "<|endoftext|>", &eot), MW_OK);
    cr_assert(mw_tokenizer_is_special(tok, eot), "<|endoftext|> is special, as in GPT-2");
    for (size_t i = 0; i < ncorpus; i++)
        expect_ids(tok, &corpus[i], "vocab.json + merges.txt", i + 1);
    mw_tokenizer_free(tok);
}

Test(tokenizer_hf, folder_prefers_its_tokenizer_json) {
    mw_tokenizer *tok = load(data_path(""));
    for (size_t i = 0; i < ncorpus; i += 7) expect_ids(tok, &corpus[i], "folder", i + 1);
    mw_tokenizer_free(tok);
}

/* variants.txt: "name line<TAB>ids". */
Test(tokenizer_hf, variants_every_listed_line) {
    char *all = read_all(data_path("variants.txt"), NULL);
    char current[64] = "";
    mw_tokenizer *tok = NULL;
    int checked = 0, variants = 0;
    for (char *line = all; *line;) {
        char *nl = strchr(line, '\n');
        *nl = '\0';
        char name[64];
        size_t at;
        cr_assert_eq(sscanf(line, "%63s %zu", name, &at), 2);
        if (strcmp(name, current) != 0) {
            mw_tokenizer_free(tok);
            char file[96];
            snprintf(file, sizeof file, "variants/%s.json", name);
            tok = load(data_path(file));
            snprintf(current, sizeof current, "%s", name);
            variants++;
        }
        ref_case c = corpus[at - 1];
        c.ids = parse_ids(strchr(line, '\t') + 1, &c.nids);
        expect_ids(tok, &c, name, at);
        free(c.ids);
        checked++;
        line = nl + 1;
    }
    mw_tokenizer_free(tok);
    free(all);
    cr_assert_eq(variants, 6);
    cr_assert_gt(checked, 400);
}

/* The cache is shared: encodings from several threads at once are each as from one. */
typedef struct worker {
    mw_tokenizer *tok;
    int id;
    size_t mismatches;
} worker;

static void *encode_corpus(void *arg) {
    worker *w = arg;
    for (int rep = 0; rep < 3; rep++)
        for (size_t i = (size_t)w->id; i < ncorpus; i++) {
            size_t cap = mw_tokenizer_max_ids(w->tok, corpus[i].len), n = 0;
            int32_t *ids = malloc((cap ? cap : 1) * sizeof *ids);
            if (mw_tokenizer_encode(w->tok, corpus[i].text, corpus[i].len, ids, cap, &n) != MW_OK ||
                n != corpus[i].nids || memcmp(ids, corpus[i].ids, n * sizeof *ids) != 0)
                w->mismatches++;
            free(ids);
        }
    return NULL;
}

Test(tokenizer_hf, threads_share_one_tokenizer) {
    mw_tokenizer *tok = load(data_path("tokenizer.json"));
    pthread_t t[3];
    worker w[3];
    for (int i = 0; i < 3; i++) {
        w[i] = (worker){tok, i, 0};
        cr_assert_eq(pthread_create(&t[i], NULL, encode_corpus, &w[i]), 0);
    }
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 3; i++) cr_expect_eq(w[i].mismatches, 0, "thread %d", i);
    mw_tokenizer_free(tok);
}

/* --- decoding, buffers, lookups ----------------------------------------------------------------
 */

TestSuite(tokenizer, .timeout = 60);

static void expect_round_trip(mw_tokenizer *tok, const char *text, size_t len) {
    size_t n, got;
    int32_t *ids = encode(tok, text, len, &n);
    char *back = malloc(len + 1);
    mw_status st = mw_tokenizer_decode(tok, ids, n, back, len + 1, &got);
    cr_assert_eq(st, MW_OK, "%s", mw_last_error());
    cr_assert(got == len && memcmp(back, text, len) == 0, "round trip of %zu bytes gave %zu", len,
              got);
    free(back);
    free(ids);
}

Test(tokenizer, round_trip_corpus_and_random_bytes) {
    load_corpus();
    const char *files[] = {"tokenizer.json", "gpt2", "variants/no_regex.json",
                           "variants/legacy_merges.json", "variants/ignore_merges.json"};
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        mw_tokenizer *tok = load(data_path(files[f]));
        for (size_t i = 0; i < ncorpus; i++) expect_round_trip(tok, corpus[i].text, corpus[i].len);
        /* Any bytes: valid UTF-8 of every length, stray continuation bytes, overlong forms,
         * surrogates, sequences cut short, bytes that never appear in UTF-8. */
        static const char *pieces[] = {"a",
                                       " ",
                                       "'s",
                                       "\n",
                                       "\xc3\xa9",
                                       "\xe4\xbd\xa0",
                                       "\xf0\x9f\x91\x8d",
                                       "\x80",
                                       "\xbf",
                                       "\xc0\xaf",
                                       "\xe0\x80\xaf",
                                       "\xed\xa0\x80",
                                       "\xc3",
                                       "\xe4\xbd",
                                       "\xf0\x9f\x91",
                                       "\xf5",
                                       "\xff",
                                       "\xfe",
                                       "\xf4\x90\x80\x80",
                                       "1",
                                       "<|endoftext|>",
                                       "\t",
                                       "\xa0"};
        uint64_t x = 88172645463325252ull;
        char buf[512];
        for (int r = 0; r < 1500; r++) {
            size_t len = 0;
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            int parts = (int)(x % 40);
            for (int k = 0; k < parts; k++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                if (x % 5 == 0) {
                    buf[len++] = (char)(x >> 24); /* any byte */
                    continue;
                }
                const char *p = pieces[(x >> 8) % (sizeof pieces / sizeof *pieces)];
                memcpy(buf + len, p, strlen(p));
                len += strlen(p);
            }
            expect_round_trip(tok, buf, len);
        }
        mw_tokenizer_free(tok);
    }
    free_corpus();
}

/* GPT-2's bytes_to_unicode (encoder.py), written out again here: byte b's character. */
static unsigned gpt2_char(unsigned b) {
    unsigned n = 0;
    for (unsigned x = 0; x < 256; x++) {
        int printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
        if (x == b) return printable ? x : 256 + n;
        if (!printable) n++;
    }
    return 0;
}

static int put_char(char *o, unsigned cp) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    o[0] = (char)(0xC0 | cp >> 6);
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* A tokenizer whose vocabulary is the 256 byte tokens (id = the byte) and one merge of two
 * bytes per pair given, ids 256 on. */
static mw_tokenizer *byte_tokenizer(const unsigned (*pairs)[2], int npairs) {
    static char json[65536];
    char *o = json;
    o += sprintf(o, "{\"version\": \"1.0\", \"added_tokens\": [], \"normalizer\": null, "
                    "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                    "\"trim_offsets\": true}, \"post_processor\": null, "
                    "\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"vocab\": {");
    for (unsigned b = 0; b < 256; b++) {
        *o++ = '"';
        unsigned c = gpt2_char(b);
        if (c == '"' || c == '\\') *o++ = '\\';
        o += put_char(o, c);
        o += sprintf(o, "\": %u, ", b);
    }
    for (int k = 0; k < npairs; k++) {
        *o++ = '"';
        o += put_char(o, gpt2_char(pairs[k][0]));
        o += put_char(o, gpt2_char(pairs[k][1]));
        o += sprintf(o, "\": %d%s", 256 + k, k + 1 < npairs ? ", " : "");
    }
    o += sprintf(o, "}, \"merges\": [");
    for (int k = 0; k < npairs; k++) {
        o += sprintf(o, "%s[\"", k ? ", " : "");
        o += put_char(o, gpt2_char(pairs[k][0]));
        o += sprintf(o, "\", \"");
        o += put_char(o, gpt2_char(pairs[k][1]));
        o += sprintf(o, "\"]");
    }
    sprintf(o, "]}}");
    char path[64];
    snprintf(path, sizeof path, "/tmp/mw_byte_tokenizer_%d.json", (int)getpid());
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    fputs(json, f);
    fclose(f);
    mw_tokenizer *tok = load(path);
    unlink(path);
    return tok;
}

static void expect_encoding(mw_tokenizer *tok, const char *text, size_t len, const int32_t *want,
                            size_t nwant) {
    size_t n;
    int32_t *ids = encode(tok, text, len, &n);
    cr_expect(n == nwant && memcmp(ids, want, n * sizeof *ids) == 0,
              "%zu bytes from 0x%02x: %zu ids, the first %d (want %zu, %d)", len,
              (unsigned char)text[0], n, n ? ids[0] : -1, nwant, want[0]);
    free(ids);
}

Test(tokenizer, invalid_utf8_bytes_are_other_characters) {
    /* Merges that join across a word boundary only when the bytes on both sides are in one
     * word: a byte that does not start a valid sequence is an "other" character of its own, so
     * it is a word apart from a letter, and joins punctuation and other such bytes. */
    static const unsigned pairs[][2] = {{'a', 0x80}, {0x80, 0x81}, {'!', 0x80},  {'a', 0xC3},
                                        {'a', 0xC0}, {'a', 0xED},  {0xE4, 0xBD}, {'a', 0xF4}};
    mw_tokenizer *tok = byte_tokenizer(pairs, 8);
    expect_encoding(tok, "a\x80", 2, (int32_t[]){'a', 0x80}, 2);
    expect_encoding(tok, "\x80\x81", 2, (int32_t[]){257}, 1);
    expect_encoding(tok, "!\x80", 2, (int32_t[]){258}, 1);
    /* a valid letter joins the word: "aé" is one word, so a + 0xC3 merge */
    expect_encoding(tok, "a\xc3\xa9", 3, (int32_t[]){259, 0xA9}, 2);
    /* overlong, surrogate, above U+10FFFF: not letters */
    expect_encoding(tok, "a\xc0\xaf", 3, (int32_t[]){'a', 0xC0, 0xAF}, 3);
    expect_encoding(tok, "a\xed\xa0\x80", 4, (int32_t[]){'a', 0xED, 0xA0, 0x80}, 4);
    expect_encoding(tok, "a\xf4\x90\x80\x80", 5, (int32_t[]){'a', 0xF4, 0x90, 0x80, 0x80}, 5);
    /* a sequence cut short is two bytes of punctuation, one word */
    expect_encoding(tok, "\xe4\xbd", 2, (int32_t[]){262}, 1);
    /* the letter after it starts a word: U+4F60 is a letter, so "\xe4\xbd\xa0" is one */
    expect_encoding(tok, "\xe4\xbd\xe4\xbd\xa0", 5, (int32_t[]){262, 262, 0xA0}, 3);
    /* decoding a lone byte token gives that byte, not U+FFFD */
    char out[4];
    size_t len;
    int32_t e4 = 0xE4;
    cr_assert_eq(mw_tokenizer_decode(tok, &e4, 1, out, sizeof out, &len), MW_OK);
    cr_assert(len == 1 && (unsigned char)out[0] == 0xE4);
    mw_tokenizer_free(tok);
}

Test(tokenizer, buffers_too_small_report_the_size) {
    mw_tokenizer *tok = load(data_path("tokenizer.json"));
    const char *text = "Hello, world! <|endoftext|> Goodbye.";
    size_t len = strlen(text), n, need;
    int32_t *all = encode(tok, text, len, &need);
    cr_assert_gt(need, 4);
    cr_assert_eq(mw_tokenizer_encode(tok, text, len, NULL, 0, &n), MW_ERR_SHAPE);
    cr_assert_eq(n, need);
    int32_t some[4];
    cr_assert_eq(mw_tokenizer_encode(tok, text, len, some, 4, &n), MW_ERR_SHAPE);
    cr_assert_eq(n, need);
    cr_assert_arr_eq(some, all, sizeof some);
    char msg[64];
    snprintf(msg, sizeof msg, "needs %zu ids, the buffer holds 4", need);
    cr_assert(strstr(mw_last_error(), msg), "%s", mw_last_error());
    char small[5];
    size_t got;
    cr_assert_eq(mw_tokenizer_decode(tok, all, need, small, sizeof small, &got), MW_ERR_SHAPE);
    cr_assert_eq(got, len);
    cr_assert_arr_eq(small, text, sizeof small);
    cr_assert(strstr(mw_last_error(), "decode to"), "%s", mw_last_error());
    cr_assert_eq(mw_tokenizer_encode(tok, "", 0, NULL, 0, &n), MW_OK);
    cr_assert_eq(n, 0);
    free(all);
    mw_tokenizer_free(tok);
}

Test(tokenizer, decode_refuses_ids_that_are_not_tokens) {
    mw_tokenizer *tok = load(data_path("tokenizer.json"));
    int32_t ids[] = {52, 297, 3000, 5};
    char buf[64];
    size_t len = 99;
    cr_assert_eq(mw_tokenizer_decode(tok, ids, 4, buf, sizeof buf, &len), MW_ERR_INVALID);
    cr_assert_eq(len, 0);
    cr_assert(strstr(mw_last_error(), "id 3000 at position 2"), "%s", mw_last_error());
    ids[1] = -7;
    cr_assert_eq(mw_tokenizer_decode(tok, ids, 4, buf, sizeof buf, &len), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "id -7 at position 1"), "%s", mw_last_error());
    mw_tokenizer_free(tok);
}

Test(tokenizer, lookups) {
    mw_tokenizer *tok = load(data_path("tokenizer.json"));
    int32_t id;
    cr_assert_eq(mw_tokenizer_token_id(tok, "<|endoftext|>", &id), MW_OK);
    cr_assert_eq(id, 0);
    cr_assert(mw_tokenizer_is_special(tok, 0));
    cr_assert(!mw_tokenizer_is_special(tok, 1));
    cr_assert(!mw_tokenizer_is_special(tok, 3000));
    cr_assert_eq(mw_tokenizer_token_id(tok, "\xc4\xa0the", &id), MW_OK); /* "Ġthe" */
    size_t n;
    int32_t *ids = encode(tok, " the", 4, &n);
    cr_assert(n == 1 && ids[0] == id);
    free(ids);
    cr_assert_eq(mw_tokenizer_token_id(tok, "no such token", &id), MW_ERR_NOT_FOUND);
    cr_assert(strstr(mw_last_error(), "\"no such token\""), "%s", mw_last_error());
    cr_assert_str_eq(mw_tokenizer_unicode_version(), "16.0.0");
    cr_assert_eq(mw_tokenizer_max_ids(tok, 10), 10);
    mw_tokenizer_free(tok);
    mw_tokenizer *p = load(data_path("variants/prefix_space.json"));
    cr_assert_eq(mw_tokenizer_max_ids(p, 10), 20);
    mw_tokenizer_free(p);
    cr_assert_eq(mw_tokenizer_load(NULL, &tok), MW_ERR_INVALID);
    cr_assert_eq(mw_tokenizer_vocab_size(NULL), 0);
    mw_tokenizer_free(NULL);
}

/* --- damaged and unsupported files -------------------------------------------------------------
 */

static char dir[64];

static void make_dir(void) {
    snprintf(dir, sizeof dir, "/tmp/mw_tokenizer_XXXXXX");
    cr_assert_not_null(mkdtemp(dir), "mkdtemp failed");
}

static void remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    char sub[512];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            struct stat sb;
            if (stat(sub, &sb) == 0 && S_ISDIR(sb.st_mode))
                remove_tree(sub);
            else
                unlink(sub);
        }
    closedir(d);
    rmdir(path);
}

static void remove_dir(void) { remove_tree(dir); }

TestSuite(tokenizer_files, .init = make_dir, .fini = remove_dir, .timeout = 60);

static const char *path_of(const char *name) {
    static char buf[4][256];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, 256, "%s/%s", dir, name);
    return p;
}

static void write_file(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

/* A small valid tokenizer.json with `model`, `pre` and `added` substituted in (one per line, so
 * that messages can be checked for the line). */
static const char *tiny(const char *version, const char *added, const char *normalizer,
                        const char *pre, const char *post, const char *decoder, const char *model) {
    static char buf[4096];
    snprintf(buf, sizeof buf,
             "{\n"
             "  \"version\": %s,\n"
             "  \"truncation\": null,\n"
             "  \"padding\": null,\n"
             "  \"added_tokens\": %s,\n"
             "  \"normalizer\": %s,\n"
             "  \"pre_tokenizer\": %s,\n"
             "  \"post_processor\": %s,\n"
             "  \"decoder\": %s,\n"
             "  \"model\": %s\n"
             "}\n",
             version, added, normalizer, pre, post, decoder, model);
    return buf;
}

#define ADDED                                                                                      \
    "[{\"id\": 3, \"content\": \"<|endoftext|>\", \"special\": true, \"normalized\": false}]"
#define PRE "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true}"
#define POST "{\"type\": \"ByteLevel\", \"trim_offsets\": false}"
#define DEC "{\"type\": \"ByteLevel\"}"
#define VOCAB "{\"a\": 0, \"b\": 1, \"ab\": 2}"
#define MODEL                                                                                      \
    "{\"type\": \"BPE\", \"dropout\": null, \"vocab\": " VOCAB ", \"merges\": [[\"a\", \"b\"]]}"

static void write_tiny(const char *name, const char *json) {
    write_file(path_of(name), json, strlen(json));
}

/* Loads `name` from the test's folder expecting status `want` and a message holding the file's
 * path and each of the strings given (NULL-terminated). */
static void expect_refused(const char *name, mw_status want, ...) {
    mw_tokenizer *tok = (mw_tokenizer *)1;
    const char *path = path_of(name);
    mw_status st = mw_tokenizer_load(path, &tok);
    const char *msg = mw_last_error();
    cr_assert_eq(st, want, "%s: got %s, want %s: %s", name, mw_status_name(st),
                 mw_status_name(want), msg);
    cr_assert_null(tok);
    cr_assert(strstr(msg, dir), "the message does not name the file: %s", msg);
    va_list ap;
    va_start(ap, want);
    for (const char *s = va_arg(ap, const char *); s; s = va_arg(ap, const char *))
        cr_assert(strstr(msg, s), "%s: the message lacks '%s': %s", name, s, msg);
    va_end(ap);
}

Test(tokenizer_files, the_tiny_file_loads_and_encodes) {
    write_tiny("t.json", tiny("\"1.0\"", ADDED, "null", PRE, POST, DEC, MODEL));
    mw_tokenizer *tok = load(path_of("t.json"));
    int32_t ids[8];
    size_t n;
    cr_assert_eq(mw_tokenizer_encode(tok, "abba<|endoftext|>ab", 19, ids, 8, &n), MW_OK);
    int32_t want[] = {2, 1, 0, 3, 2};
    cr_assert_eq(n, 5);
    cr_assert_arr_eq(ids, want, sizeof want);
    mw_tokenizer_free(tok);
}

/* As in tokenizers, a pair listed twice keeps the rank of its last listing (checked against
 * tokenizers 0.23: "abc" is [3, 2] with these merges, [0, 4] without the last one). */
Test(tokenizer_files, a_merge_listed_twice_keeps_its_last_rank) {
    const char *model = "{\"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"bc\": 4}, "
                        "\"merges\": [\"b c\", \"a b\", \"b c\"]}";
    write_tiny("twice.json", tiny("\"1.0\"", "[]", "null", PRE, POST, DEC, model));
    mw_tokenizer *tok = load(path_of("twice.json"));
    int32_t ids[4];
    size_t n;
    cr_assert_eq(mw_tokenizer_encode(tok, "abc", 3, ids, 4, &n), MW_OK);
    cr_assert(n == 2 && ids[0] == 3 && ids[1] == 2, "%zu ids: %d %d", n, ids[0], ids[1]);
    mw_tokenizer_free(tok);
    model = "{\"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"bc\": 4}, "
            "\"merges\": [\"b c\", \"a b\"]}";
    write_tiny("once.json", tiny("\"1.0\"", "[]", "null", PRE, POST, DEC, model));
    tok = load(path_of("once.json"));
    cr_assert_eq(mw_tokenizer_encode(tok, "abc", 3, ids, 4, &n), MW_OK);
    cr_assert(n == 2 && ids[0] == 0 && ids[1] == 4, "%zu ids: %d %d", n, ids[0], ids[1]);
    mw_tokenizer_free(tok);
}

Test(tokenizer_files, json_syntax_names_line_and_column) {
    const char *good = tiny("\"1.0\"", ADDED, "null", PRE, POST, DEC, MODEL);
    write_file(path_of("cut.json"), good, strlen(good) / 2);
    expect_refused("cut.json", MW_ERR_FORMAT, "JSON syntax", "truncated", NULL);
    write_tiny("comma.json", tiny("\"1.0\"", "[1,]", "null", PRE, POST, DEC, MODEL));
    expect_refused("comma.json", MW_ERR_FORMAT, "comma.json:5:22: JSON syntax", "trailing comma",
                   NULL);
    write_tiny("junk.json", "{}\n  x");
    expect_refused("junk.json", MW_ERR_FORMAT, "junk.json:2:3:", "after the end", NULL);
    write_tiny("utf8.json", "{\"model\": \"\xe4\xbd\"}");
    expect_refused("utf8.json", MW_ERR_FORMAT, "utf8.json:1:12:", "invalid UTF-8", NULL);
    write_tiny("surrogate.json", "{\"model\": \"\\ud800x\"}");
    expect_refused("surrogate.json", MW_ERR_FORMAT, "lone leading surrogate", NULL);
    char deep[400] = "";
    for (int i = 0; i < 150; i++) strcat(deep, "[");
    write_tiny("deep.json", deep);
    expect_refused("deep.json", MW_ERR_FORMAT, "levels of nesting", NULL);
    write_tiny("top.json", "[1, 2]");
    expect_refused("top.json", MW_ERR_FORMAT, "top.json:1:1:", "expected an object", NULL);
    write_tiny("empty.json", "");
    expect_refused("empty.json", MW_ERR_FORMAT, "JSON syntax", NULL);
    write_tiny("number.json", "{\"a\": 01}");
    expect_refused("number.json", MW_ERR_FORMAT, "leading zero", NULL);
}

Test(tokenizer_files, model_damage_names_the_json_path) {
    write_tiny("nomodel.json",
               "{\"version\": \"1.0\", \"pre_tokenizer\": " PRE ", \"decoder\": " DEC "}");
    expect_refused("nomodel.json", MW_ERR_FORMAT, "model", "no \"model\"", NULL);
    write_tiny("type.json", tiny("\"1.0\"", "[]", "null", PRE, POST, DEC,
                                 "{\"type\": \"WordPiece\", \"vocab\": {}}"));
    expect_refused("type.json", MW_ERR_UNSUPPORTED, "type.json:10:", "model.type", "\"WordPiece\"",
                   NULL);
    write_tiny("array.json", tiny("\"1.0\"", "[]", "null", PRE, POST, DEC,
                                  "{\"type\": \"BPE\", \"vocab\": [\"a\"], \"merges\": []}"));
    expect_refused("array.json", MW_ERR_FORMAT, "model.vocab", "must be an object", NULL);
    write_tiny("strid.json", tiny("\"1.0\"", "[]", "null", PRE, POST, DEC,
                                  "{\"vocab\": {\"a\": 0, \"b\": \"1\"}, \"merges\": []}"));
    expect_refused("strid.json", MW_ERR_FORMAT, "model.vocab[\"b\"]", "the string \"1\"", NULL);
    write_tiny("float.json", tiny("\"1.0\"", "[]", "null", PRE, POST, DEC,
                                  "{\"vocab\": {\"a\": 0, \"b\": 1.0}, \"merges\": []}"));
    expect_refused("float.json", MW_ERR_FORMAT, "model.vocab[\"b\"]", "found 1.0", NULL);
    write_tiny("neg.json", tiny("\"1.0\"", "[]", "null", PRE, POST, DEC,
                                "{\"vocab\": {\"a\": -1}, \"merges\": []}"));
    expect_refused("neg.json", MW_ERR_FORMAT, "model.vocab[\"a\"]", "found -1", NULL);
    write_tiny("duptok.json", tiny("\"1.0\"", "[]", "null", PRE, POST, DEC,
                                   "{\"vocab\": {\"a\": 0, \"a\": 1}, \"merges\": []}"));
    expect_refused("duptok.json", MW_ERR_FORMAT, "model.vocab[\"a\"]", "appears twice", NULL);
    write_tiny("dupid.json", tiny("\"1.0\"", "[]", "null", PRE, POST, DEC,
                                  "{\"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}"));
    expect_refused("dupid.json", MW_ERR_FORMAT, "model.vocab[\"b\"]",
                   "id 0 is also the id of \"a\"", NULL);
    write_tiny("nomerges.json", tiny("\"1.0\"", "[]", "null", PRE, POST, DEC, "{\"vocab\": {}}"));
    expect_refused("nomerges.json", MW_ERR_FORMAT, "no \"merges\"", NULL);
    write_tiny("unknown.json", tiny("\"1.0\"", "[]", "null", PRE, POST, DEC,
                                    "{\"vocab\": " VOCAB ", \"merges\": [[\"a\", \"b\"], "
                                    "[\"a\", \"c\"]]}"));
    expect_refused("unknown.json", MW_ERR_FORMAT, "model.merges[1]", "\"c\"",
                   "not in the vocabulary", NULL);
    write_tiny("merged.json", tiny("\"1.0\"", "[]", "null", PRE, POST, DEC,
                                   "{\"vocab\": " VOCAB ", \"merges\": [\"b a\"]}"));
    expect_refused("merged.json", MW_ERR_FORMAT, "model.merges[0]", "merged token \"ba\"", NULL);
    write_tiny("spaces.json", tiny("\"1.0\"", "[]", "null", PRE, POST, DEC,
                                   "{\"vocab\": " VOCAB ", \"merges\": [\"a  b\"]}"));
    expect_refused("spaces.json", MW_ERR_FORMAT, "model.merges[0]", "one space", NULL);
    write_tiny("mixed.json", tiny("\"1.0\"", "[]", "null", PRE, POST, DEC,
                                  "{\"vocab\": " VOCAB ", \"merges\": [\"a b\", [\"a\", \"b\"]]}"));
    expect_refused("mixed.json", MW_ERR_FORMAT, "model.merges[1]", "like the merges before it",
                   NULL);
    write_tiny("unk.json",
               tiny("\"1.0\"", "[]", "null", PRE, POST, DEC,
                    "{\"vocab\": " VOCAB ", \"merges\": [], \"unk_token\": \"<unk>\"}"));
    expect_refused("unk.json", MW_ERR_FORMAT, "model.unk_token", "\"<unk>\"", NULL);
    write_tiny("dropout.json", tiny("\"1.0\"", "[]", "null", PRE, POST, DEC,
                                    "{\"vocab\": " VOCAB ", \"merges\": [], \"dropout\": 0.1}"));
    expect_refused("dropout.json", MW_ERR_UNSUPPORTED, "model.dropout", "0.1", NULL);
    write_tiny("dropout0.json", tiny("\"1.0\"", "[]", "null", PRE, POST, DEC,
                                     "{\"vocab\": " VOCAB ", \"merges\": [], \"dropout\": 0.0}"));
    mw_tokenizer_free(load(path_of("dropout0.json")));
    write_tiny("dupfield.json", tiny("\"1.0\"", "[]", "null", PRE, POST, DEC,
                                     "{\"vocab\": {}, \"merges\": [], \"vocab\": {}}"));
    expect_refused("dupfield.json", MW_ERR_FORMAT, "model.vocab", "appears twice", NULL);
}

Test(tokenizer_files, settings_not_implemented_are_refused) {
    write_tiny("norm.json", tiny("\"1.0\"", "[]", "{\"type\": \"NFKC\"}", PRE, POST, DEC, MODEL));
    expect_refused("norm.json", MW_ERR_UNSUPPORTED, "norm.json:6:", "normalizer", "\"NFKC\"", NULL);
    write_tiny("meta.json",
               tiny("\"1.0\"", "[]", "null", "{\"type\": \"Metaspace\"}", POST, DEC, MODEL));
    expect_refused("meta.json", MW_ERR_UNSUPPORTED, "pre_tokenizer.type", "\"Metaspace\"", NULL);
    write_tiny("nopre.json", tiny("\"1.0\"", "[]", "null", "null", POST, DEC, MODEL));
    expect_refused("nopre.json", MW_ERR_UNSUPPORTED, "pre_tokenizer", "missing", NULL);
    write_tiny("aps.json",
               tiny("\"1.0\"", "[]", "null",
                    "{\"type\": \"ByteLevel\", \"add_prefix_space\": \"yes\"}", POST, DEC, MODEL));
    expect_refused("aps.json", MW_ERR_FORMAT, "pre_tokenizer.add_prefix_space", "true or false",
                   NULL);
    write_tiny("post.json",
               tiny("\"1.0\"", "[]", "null", PRE, "{\"type\": \"RobertaProcessing\"}", DEC, MODEL));
    expect_refused("post.json", MW_ERR_UNSUPPORTED, "post_processor.type", "\"RobertaProcessing\"",
                   "TemplateProcessing", NULL);
    write_tiny("dec.json", tiny("\"1.0\"", "[]", "null", PRE, POST, "null", MODEL));
    expect_refused("dec.json", MW_ERR_UNSUPPORTED, "decoder", NULL);
    write_tiny("ver.json", tiny("\"2.0\"", "[]", "null", PRE, POST, DEC, MODEL));
    expect_refused("ver.json", MW_ERR_UNSUPPORTED, "ver.json:2:14: version", "\"2.0\"", NULL);
    char trunc[4096];
    snprintf(trunc, sizeof trunc, "%s", tiny("\"1.0\"", "[]", "null", PRE, POST, DEC, MODEL));
    char *t = strstr(trunc, "\"truncation\": null");
    memcpy(t, "\"truncation\": {}  ", 18);
    write_tiny("trunc.json", trunc);
    expect_refused("trunc.json", MW_ERR_UNSUPPORTED, "truncation", NULL);
}

Test(tokenizer_files, added_tokens_checked) {
    write_tiny("id.json", tiny("\"1.0\"",
                               "[{\"id\": 7, \"content\": \"<x>\", \"special\": true, "
                               "\"normalized\": false}]",
                               "null", PRE, POST, DEC, MODEL));
    expect_refused("id.json", MW_ERR_FORMAT, "added_tokens[0]", "has id 7", "tokenizers gives it 3",
                   NULL);
    /* single_word is honoured (tests/core/test_tokenizer_single_word.c), and checked a bool */
    write_tiny("word.json",
               tiny("\"1.0\"", "[{\"id\": 3, \"content\": \"<x>\", \"single_word\": true}]", "null",
                    PRE, POST, DEC, MODEL));
    mw_tokenizer *tok = load(path_of("word.json"));
    int32_t ids[4];
    size_t n;
    cr_assert_eq(mw_tokenizer_encode(tok, "<x>b<x>", 7, ids, 4, &n), MW_OK);
    cr_assert(n == 1 && ids[0] == 1, "<x> beside a letter is no match (%zu ids)", n);
    cr_assert_eq(mw_tokenizer_encode(tok, "<x><x>", 6, ids, 4, &n), MW_OK);
    cr_assert(n == 2 && ids[0] == 3 && ids[1] == 3, "%zu ids", n);
    mw_tokenizer_free(tok);
    write_tiny("wordtype.json",
               tiny("\"1.0\"", "[{\"id\": 3, \"content\": \"<x>\", \"single_word\": 1}]", "null",
                    PRE, POST, DEC, MODEL));
    expect_refused("wordtype.json", MW_ERR_FORMAT, "added_tokens[0]", "single_word", NULL);
    write_tiny("empty.json",
               tiny("\"1.0\"", "[{\"id\": 3, \"content\": \"\"}]", "null", PRE, POST, DEC, MODEL));
    expect_refused("empty.json", MW_ERR_FORMAT, "added_tokens[0].content", NULL);
    write_tiny("twice.json", tiny("\"1.0\"",
                                  "[{\"id\": 2, \"content\": \"ab\"}, {\"id\": 2, \"content\": "
                                  "\"ab\"}]",
                                  "null", PRE, POST, DEC, MODEL));
    expect_refused("twice.json", MW_ERR_FORMAT, "added_tokens[1].content", "also added_tokens[0]",
                   NULL);
    write_tiny("noid.json",
               tiny("\"1.0\"", "[{\"content\": \"x\"}]", "null", PRE, POST, DEC, MODEL));
    expect_refused("noid.json", MW_ERR_FORMAT, "added_tokens[0]", "no \"id\"", NULL);
}

/* The files a tokenizer was read from (a program counts them among its inputs), and whether it
 * has a token for every byte (the round trip holds exactly then). */
Test(tokenizer_files, the_files_read_and_the_bytes_covered) {
    mw_tokenizer *tok = load(data_path("tokenizer.json"));
    cr_assert(strstr(mw_tokenizer_file(tok, 0), "tokenizer/tokenizer.json"), "%s",
              mw_tokenizer_file(tok, 0));
    cr_assert_null(mw_tokenizer_file(tok, 1));
    cr_assert_null(mw_tokenizer_file(tok, -1));
    cr_assert_eq(mw_tokenizer_missing_byte(tok), -1);
    mw_tokenizer_free(tok);
    tok = load(data_path("gpt2"));
    cr_assert(strstr(mw_tokenizer_file(tok, 0), "gpt2/vocab.json"), "%s",
              mw_tokenizer_file(tok, 0));
    cr_assert(strstr(mw_tokenizer_file(tok, 1), "gpt2/merges.txt"), "%s",
              mw_tokenizer_file(tok, 1));
    cr_assert_null(mw_tokenizer_file(tok, 2));
    mw_tokenizer_free(tok);
    /* The tiny vocabulary holds "a", "b" and "ab": byte 0 is the first it lacks, and "x" (0x78)
     * would be dropped by encoding. */
    write_tiny("t.json", tiny("\"1.0\"", "[]", "null", PRE, POST, DEC, MODEL));
    tok = load(path_of("t.json"));
    cr_assert_eq(mw_tokenizer_missing_byte(tok), 0);
    int32_t ids[4];
    size_t n = 9;
    char back[8];
    size_t len = 0;
    cr_assert_eq(mw_tokenizer_encode(tok, "axb", 3, ids, 4, &n), MW_OK);
    cr_assert_eq(mw_tokenizer_decode(tok, ids, n, back, sizeof back, &len), MW_OK);
    cr_assert(len == 2 && memcmp(back, "ab", 2) == 0, "the byte without a token was not dropped");
    mw_tokenizer_free(tok);
    static const unsigned ab[1][2] = {{'a', 'b'}};
    tok = byte_tokenizer(ab, 1);
    cr_assert_eq(mw_tokenizer_missing_byte(tok), -1);
    mw_tokenizer_free(tok);
    cr_assert_eq(mw_tokenizer_missing_byte(NULL), -2, "NULL is no answer, not 'every byte'");
    cr_assert_null(mw_tokenizer_file(NULL, 0));
    /* The variants the round-trip test leaves out are those that lack a byte, and that byte
     * alone does not come back. */
    const char *lacking[] = {"variants/fallback.json", "variants/subword.json"};
    for (int i = 0; i < 2; i++) {
        tok = load(data_path(lacking[i]));
        int b = mw_tokenizer_missing_byte(tok);
        cr_assert(b >= 0 && b < 256, "%s: %d", lacking[i], b);
        char in = (char)b, out[16] = "";
        cr_assert_eq(mw_tokenizer_encode(tok, &in, 1, ids, 4, &n), MW_OK);
        len = 0;
        cr_assert_eq(mw_tokenizer_decode(tok, ids, n, out, sizeof out, &len), MW_OK);
        cr_assert(len != 1 || out[0] != in, "%s: byte %d came back", lacking[i], b);
        mw_tokenizer_free(tok);
    }
    const char *whole[] = {"variants/no_regex.json", "variants/legacy_merges.json",
                           "variants/ignore_merges.json", "variants/prefix_space.json"};
    for (int i = 0; i < 4; i++) {
        tok = load(data_path(whole[i]));
        cr_assert_eq(mw_tokenizer_missing_byte(tok), -1, "%s", whole[i]);
        mw_tokenizer_free(tok);
    }
}

/* A FIFO in the folder, as vocab.json or tokenizer.json, is refused without blocking (the
 * suite's timeout); so is a FIFO given as the tokenizer itself. */
Test(tokenizer_files, fifos_are_refused_without_blocking, .timeout = 30) {
    char sub[256];
    snprintf(sub, sizeof sub, "%s/f", dir);
    cr_assert_eq(mkdir(sub, 0700), 0);
    cr_assert_eq(mkfifo(path_of("f/vocab.json"), 0600), 0);
    write_tiny("f/merges.txt", "a b\n");
    expect_refused("f", MW_ERR_IO, "f/vocab.json: it is a FIFO, not a regular file", NULL);
    cr_assert_eq(mkfifo(path_of("f/tokenizer.json"), 0600), 0);
    expect_refused("f", MW_ERR_IO, "f/tokenizer.json: it is a FIFO", NULL);
    expect_refused("f/tokenizer.json", MW_ERR_IO, "it is a FIFO", NULL);
}

Test(tokenizer_files, gpt2_files_checked) {
    char sub[256];
    snprintf(sub, sizeof sub, "%s/g", dir);
    cr_assert_eq(mkdir(sub, 0700), 0);
    mw_tokenizer *tok = (mw_tokenizer *)1;
    cr_assert_eq(mw_tokenizer_load(sub, &tok), MW_ERR_IO);
    cr_assert(strstr(mw_last_error(), "g/vocab.json"), "%s", mw_last_error());
    cr_assert_null(tok);
    write_tiny("g/vocab.json", VOCAB);
    cr_assert_eq(mw_tokenizer_load(sub, &tok), MW_ERR_IO);
    cr_assert(strstr(mw_last_error(), "g/merges.txt"), "%s", mw_last_error());
    write_tiny("g/merges.txt", "#version: 0.2\na b\n");
    tok = load(sub);
    mw_tokenizer_free(tok);
    write_tiny("g/merges.txt", "#version: 0.2\na b\nb\n");
    expect_refused("g", MW_ERR_FORMAT, "merges.txt:3:", "\"b\" is not two tokens", NULL);
    write_tiny("g/merges.txt", "a b\n\nb a\n");
    expect_refused("g", MW_ERR_FORMAT, "merges.txt:2:", "empty line", NULL);
    write_tiny("g/merges.txt", "a b\r\nb c\r\n");
    expect_refused("g", MW_ERR_FORMAT, "merges.txt:2:", "\"c\"", "not in the vocabulary", NULL);
    write_tiny("g/merges.txt", "a \xff\n");
    expect_refused("g", MW_ERR_FORMAT, "merges.txt:1:", "invalid UTF-8", NULL);
    write_tiny("g/merges.txt", "a b\n");
    write_tiny("g/vocab.json", "[\"a\"]");
    expect_refused("g", MW_ERR_FORMAT, "vocab.json:1:1:", "must be an object", NULL);
    write_tiny("g/vocab.json", "{\"a\": 0,\n \"b\": null}");
    expect_refused("g", MW_ERR_FORMAT, "vocab.json:2:7: [\"b\"]", "found null", NULL);
    cr_assert_eq(mw_tokenizer_load(path_of("missing.json"), &tok), MW_ERR_IO);
    cr_assert(strstr(mw_last_error(), "missing.json"), "%s", mw_last_error());
}

/* --- out of memory -----------------------------------------------------------------------------
 */

/* Loads both forms and a variant, encodes text with long words (scratch past the stack) and with
 * the prefix space, decodes: the first error, checked to be MW_ERR_NOMEM. */
static mw_status alloc_scenario(void) {
    mw_tokenizer *a = NULL, *b = NULL, *c = NULL;
    char text[1200];
    for (int i = 0; i < 1199; i++) text[i] = i % 97 == 96 ? ' ' : (char)('a' + i % 23);
    text[1199] = '\0';
    int32_t ids[1200 * 2];
    char back[1300];
    size_t n = 0, len;
    mw_status st = mw_tokenizer_load(data_path("tokenizer.json"), &a);
    if (st == MW_OK) st = mw_tokenizer_load(data_path("gpt2"), &b);
    if (st == MW_OK) st = mw_tokenizer_load(data_path("variants/prefix_space.json"), &c);
    if (st == MW_OK) st = mw_tokenizer_encode(a, text, sizeof text - 1, ids, 2400, &n);
    if (st == MW_OK) st = mw_tokenizer_decode(a, ids, n, back, sizeof back, &len);
    if (st == MW_OK) st = mw_tokenizer_encode(b, text, sizeof text - 1, ids, 2400, &n);
    if (st == MW_OK) st = mw_tokenizer_encode(c, text, sizeof text - 1, ids, 2400, &n);
    if (st != MW_OK) {
        cr_assert_eq(st, MW_ERR_NOMEM, "expected MW_ERR_NOMEM, got %s: %s", mw_status_name(st),
                     mw_last_error());
        cr_assert(strstr(mw_last_error(), "out of memory"), "message: %s", mw_last_error());
    }
    mw_tokenizer_free(a);
    mw_tokenizer_free(b);
    mw_tokenizer_free(c);
    return st;
}

Test(tokenizer_nomem, every_allocation, .timeout = 120) {
    mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)(0));
    cr_assert_eq(alloc_scenario(), MW_OK, "%s", mw_last_error());
    int64_t total = mw_test_control(MW_TEST_ALLOCATIONS);
    cr_assert_gt(total, 20);
    int failed = 0;
    for (int64_t k = 1; k <= total; k++) {
        mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)(k));
        failed += alloc_scenario() != MW_OK;
    }
    mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)(0));
    cr_assert_eq(failed, total, "%d of %lld injected failures surfaced", failed, (long long)total);
    cr_assert_eq(alloc_scenario(), MW_OK, "the library does not recover after failures");
}
