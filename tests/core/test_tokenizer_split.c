/* The tokenizers Llama 3 and Qwen2 ship (meshwit/tokenizer.h) against Hugging Face `tokenizers`:
 * byte-level BPE behind a Split pre-tokenizer with their own regex, special tokens in the text,
 * Llama 3's TemplateProcessing (<|begin_of_text|> before the text), Qwen2's NFC normalizer. The
 * ids `tokenizers` gives every line of a corpus (tests/data/tokenizer/split_corpus.txt and
 * split_ids.txt, made with the tokenizers by tools/make_split_tokenizer_ref.py) with and without
 * the special tokens the post-processor adds; decode(encode(x)) == x; the files refused by name.
 *
 * Files written by a test go to its own mkdtemp directory, removed afterwards. */
#include <criterion/criterion.h>

#include <dirent.h>
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

/* --- the corpus and its ids ------------------------------------------------------------------- */

typedef struct text_line {
    char *text;
    size_t len;
} text_line;

static text_line *lines;
static size_t nlines;

static void load_lines(void) {
    char *all = read_all(data_path("split_corpus.txt"), NULL);
    size_t cap = 256;
    lines = calloc(cap, sizeof *lines);
    nlines = 0;
    for (char *line = all; *line;) {
        char *nl = strchr(line, '\n');
        cr_assert_not_null(nl);
        if (nlines == cap) lines = realloc(lines, (cap *= 2) * sizeof *lines);
        size_t n = (size_t)(nl - line);
        text_line *t = &lines[nlines++];
        t->text = malloc(n + 1);
        memcpy(t->text, line, n);
        t->len = unescape(t->text, n);
        line = nl + 1;
    }
    free(all);
    cr_assert_gt(nlines, 200);
}

static void free_lines(void) {
    for (size_t i = 0; i < nlines; i++) free(lines[i].text);
    free(lines);
    lines = NULL;
    nlines = 0;
}

/* Every row of split_ids.txt for tokenizer `name` ("name line plain|special<TAB>ids"), checked
 * against the ids of tok; the number of rows checked (*special of them with the flag). The rows
 * "name line nfc<TAB>text" are what NFC makes of a line, for the round trip. */
static int check_rows(mw_tokenizer *tok, const char *name, int *special) {
    char *all = read_all(data_path("split_ids.txt"), NULL);
    int checked = 0;
    *special = 0;
    for (char *row = all; *row;) {
        char *nl = strchr(row, '\n');
        *nl = '\0';
        char who[32], how[16];
        size_t at;
        cr_assert_eq(sscanf(row, "%31s %zu %15s", who, &at, how), 3, "row: %.80s", row);
        if (strcmp(who, name) == 0 && strcmp(how, "nfc") != 0) {
            cr_assert(at >= 1 && at <= nlines);
            const text_line *t = &lines[at - 1];
            size_t nwant, n;
            int32_t *want = parse_ids(strchr(row, '\t') + 1, &nwant);
            int with = strcmp(how, "special") == 0;
            int32_t *ids = encode_with(tok, t->text, t->len, with ? MW_ENCODE_ADD_SPECIAL : 0, &n);
            size_t i = 0;
            while (i < n && i < nwant && ids[i] == want[i]) i++;
            cr_expect(i == n && n == nwant,
                      "%s, corpus line %zu %s (%.60s): id %zu is %d, Hugging Face has %d (%zu ids, "
                      "it has %zu)",
                      name, at, how, t->text, i, i < n ? ids[i] : -1, i < nwant ? want[i] : -1, n,
                      nwant);
            free(ids);
            free(want);
            checked++;
            *special += with;
        }
        row = nl + 1;
    }
    free(all);
    return checked;
}

TestSuite(tokenizer_split, .init = load_lines, .fini = free_lines, .timeout = 60);

Test(tokenizer_split, llama3_every_line) {
    mw_tokenizer *tok = load(data_path("llama3.json"));
    cr_assert_eq(mw_tokenizer_vocab_size(tok), 2061 + 12);
    int special;
    for (int pass = 0; pass < 2; pass++) /* the second pass takes words from the cache */
        cr_assert_eq(check_rows(tok, "llama3", &special), (int)nlines + special);
    cr_assert_gt(special, 25);
    mw_tokenizer_free(tok);
}

Test(tokenizer_split, qwen2_every_line) {
    mw_tokenizer *tok = load(data_path("qwen2.json"));
    cr_assert_eq(mw_tokenizer_vocab_size(tok), 2000 + 5);
    int special;
    cr_assert_eq(check_rows(tok, "qwen2", &special), (int)nlines + special);
    mw_tokenizer_free(tok);
}

Test(tokenizer_split, variants_every_listed_line) {
    const char *names[] = {"split_gpt2", "split_prefix"};
    for (int v = 0; v < 2; v++) {
        char file[64];
        snprintf(file, sizeof file, "variants/%s.json", names[v]);
        mw_tokenizer *tok = load(data_path(file));
        int special;
        cr_assert_geq(check_rows(tok, names[v], &special), (int)nlines / 4, "%s", names[v]);
        mw_tokenizer_free(tok);
    }
}

/* What the post-processor adds: Llama 3's <|begin_of_text|> before the text and nothing after;
 * nothing for Qwen2 (ByteLevel) and GPT-2 (ByteLevel or none). */
Test(tokenizer_split, the_tokens_around_a_text) {
    mw_tokenizer *tok = load(data_path("llama3.json"));
    int32_t bos, want, eos = 7;
    cr_assert_eq(mw_tokenizer_token_id(tok, "<|begin_of_text|>", &want), MW_OK);
    cr_assert_eq(want, 2061);
    cr_assert_eq(mw_tokenizer_bos_id(tok, &bos), MW_OK, "%s", mw_last_error());
    cr_assert_eq(bos, want);
    cr_assert(mw_tokenizer_is_special(tok, bos));
    cr_assert_eq(mw_tokenizer_eos_id(tok, &eos), MW_ERR_NOT_FOUND);
    cr_assert_eq(eos, -1);
    cr_assert(strstr(mw_last_error(), "no token after the text"), "%s", mw_last_error());
    size_t n;
    int32_t *ids = encode_with(tok, "", 0, MW_ENCODE_ADD_SPECIAL, &n);
    cr_assert(n == 1 && ids[0] == bos, "an empty text is its BOS alone");
    free(ids);
    ids = encode(tok, "", 0, &n);
    cr_assert_eq(n, 0);
    free(ids);
    cr_assert_eq(mw_tokenizer_max_ids(tok, 10), 11, "the text's ids and the BOS");
    int32_t buf[4];
    cr_assert_eq(mw_tokenizer_encode_with(tok, "x", 1, 2, buf, 4, &n), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "unknown flags 0x2"), "%s", mw_last_error());
    /* The BOS is counted when the buffer is too small, and comes first. */
    cr_assert_eq(
        mw_tokenizer_encode_with(tok, "Hello world", 11, MW_ENCODE_ADD_SPECIAL, buf, 1, &n),
        MW_ERR_SHAPE);
    cr_assert(n > 1 && buf[0] == bos);
    mw_tokenizer_free(tok);

    const char *none[] = {"qwen2.json", "tokenizer.json", "gpt2"};
    for (int k = 0; k < 3; k++) {
        tok = load(data_path(none[k]));
        cr_assert_eq(mw_tokenizer_bos_id(tok, &bos), MW_ERR_NOT_FOUND, "%s", none[k]);
        cr_assert_eq(mw_tokenizer_eos_id(tok, &eos), MW_ERR_NOT_FOUND, "%s", none[k]);
        ids = encode_with(tok, "", 0, MW_ENCODE_ADD_SPECIAL, &n);
        cr_assert_eq(n, 0, "%s adds nothing", none[k]);
        free(ids);
        /* NFC (qwen2's) makes a text up to 3 times longer */
        cr_assert_eq(mw_tokenizer_max_ids(tok, 10), k == 0 ? 30 : 10, "%s", none[k]);
        mw_tokenizer_free(tok);
    }
    cr_assert_eq(mw_tokenizer_bos_id(NULL, &bos), MW_ERR_INVALID);
}

/* The text decode(encode(line)) must give: the line, or for qwen2 what split_ids.txt says NFC
 * makes of it; *len its length. Owned by the caller. */
static char *decoded_text(const char *name, size_t at, size_t *len) {
    char *all = read_all(data_path("split_ids.txt"), NULL), *out = NULL;
    char prefix[64];
    int k = snprintf(prefix, sizeof prefix, "%s %zu nfc\t", name, at);
    for (char *row = all; *row && !out;) {
        char *nl = strchr(row, '\n');
        *nl = '\0';
        if (strncmp(row, prefix, (size_t)k) == 0) {
            size_t n = strlen(row + k);
            out = malloc(n + 1);
            memcpy(out, row + k, n);
            *len = unescape(out, n);
        }
        row = nl + 1;
    }
    free(all);
    if (!out) {
        out = malloc(lines[at - 1].len + 1);
        memcpy(out, lines[at - 1].text, lines[at - 1].len);
        *len = lines[at - 1].len;
    }
    return out;
}

static void expect_round_trip(mw_tokenizer *tok, const char *text, size_t len, const char *want,
                              size_t wlen, unsigned flags, const char *what) {
    size_t n, got;
    int32_t *ids = encode_with(tok, text, len, flags, &n);
    size_t skip = flags ? 1 : 0; /* the BOS, which decodes to its own text */
    char *back = malloc(wlen + 1);
    mw_status st = mw_tokenizer_decode(tok, ids + skip, n - skip, back, wlen + 1, &got);
    cr_assert_eq(st, MW_OK, "%s", mw_last_error());
    cr_expect(got == wlen && memcmp(back, want, wlen) == 0,
              "%s: round trip of %zu bytes (%.40s) gave %zu", what, len, text, got);
    free(back);
    free(ids);
}

/* decode(encode(x)) == x for every line (qwen2: the NFC of x) and, for Llama 3's and the Split
 * by GPT-2's regex, for any bytes (text that is not UTF-8 included). */
Test(tokenizer_split, round_trip_lines_and_random_bytes) {
    const char *files[] = {"llama3.json", "variants/split_gpt2.json", "qwen2.json"};
    const char *names[] = {"llama3", "split_gpt2", "qwen2"};
    for (int f = 0; f < 3; f++) {
        mw_tokenizer *tok = load(data_path(files[f]));
        cr_assert_eq(mw_tokenizer_missing_byte(tok), -1, "%s", files[f]);
        for (size_t i = 0; i < nlines; i++) {
            size_t wlen;
            char *want = decoded_text(names[f], i + 1, &wlen);
            expect_round_trip(tok, lines[i].text, lines[i].len, want, wlen,
                              f == 0 ? MW_ENCODE_ADD_SPECIAL : 0, files[f]);
            free(want);
        }
        if (f == 2) { /* NFC would compose bytes that happen to be combining marks */
            mw_tokenizer_free(tok);
            break;
        }
        static const char *pieces[] = {"a",
                                       "'s",
                                       "'S",
                                       "'\xc5\xbf",
                                       "1",
                                       "12345",
                                       " ",
                                       "\r\n",
                                       "\t",
                                       "\n",
                                       "\xc3\xa9",
                                       "\xe4\xbd\xa0",
                                       "\xf0\x9f\x91\x8d",
                                       "\x80",
                                       "\xc3",
                                       "\xff",
                                       "!?",
                                       "<|eot_id|>",
                                       "<|im_end|>",
                                       "\xd9\xa3"};
        uint64_t x = 0x9E3779B97F4A7C15ull;
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
            expect_round_trip(tok, buf, len, buf, len, 0, files[f]);
        }
        mw_tokenizer_free(tok);
    }
}

/* --- every code point --------------------------------------------------------------------------
 */

/* zlib's CRC-32 of n bytes, continuing from crc. */
static uint32_t crc32_bytes(uint32_t crc, const void *p, size_t n) {
    static uint32_t table[256];
    if (!table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
    const uint8_t *b = p;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ b[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The probes of the code points from *next (surrogates skipped), 4096 of them, into buf (room
 * for 4096 * 64 bytes), as tools/make_split_tokenizer_ref.py's probe writes them: "a" c "1" c
 * "1'" c "a'l" c " " c "!\n" c U+0301 " " c U+1100 c "\t". Its length; *next moves on. */
static size_t probe_text(uint32_t *next, char *buf) {
    size_t k = 0;
    for (int count = 0; count < 4096 && *next < 0x110000; (*next)++) {
        uint32_t cp = *next;
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        static const char *const between[] = {"a",   "1",         "1'",           "a'l", " ",
                                              "!\n", "\xcc\x81 ", "\xe1\x84\x80", "\t"};
        for (int i = 0; i < 9; i++) {
            if (i) k += put_utf8(buf + k, cp);
            memcpy(buf + k, between[i], strlen(between[i]));
            k += strlen(between[i]);
        }
        count++;
    }
    return k;
}

/* The words of the probes of every code point, with each tokenizer, sum up as tokenizers' do
 * (every_code_point.txt: the count and a CRC-32 of their lengths), and so does the NFC of them
 * with qwen2 (decode(encode(x)) is NFC(x)). tools/make_unicode_tables.py --check and
 * tools/make_nfc_tables.py --check say which code point differs. */
Test(tokenizer_split, every_code_point_as_tokenizers_cuts_it, .timeout = 300) {
    char *all = read_all(data_path("every_code_point.txt"), NULL);
    char *buf = malloc(4096 * 64), *back = malloc(3 * 4096 * 64);
    size_t *lens = malloc(4096 * 64 * sizeof *lens);
    int32_t *ids = malloc(3 * 4096 * 64 * sizeof *ids);
    int rows = 0;
    for (char *row = all; *row;) {
        char *nl = strchr(row, '\n');
        *nl = '\0';
        char name[32];
        unsigned long long words, nbytes = 0;
        unsigned long crc, ncrc = 0;
        int got = row[0] == '#'
                      ? 0
                      : sscanf(row, "%31s %llu %lu %llu %lu", name, &words, &crc, &nbytes, &ncrc);
        row = nl + 1;
        if (!got) continue;
        cr_assert(got == 3 || got == 5, "every_code_point.txt: %s", row);
        char file[64];
        snprintf(file, sizeof file, "%s.json", name);
        mw_tokenizer *tok = load(data_path(file));
        uint64_t mine = 0, mine_bytes = 0;
        uint32_t c = 0, nc = 0;
        for (uint32_t next = 0; next < 0x110000;) {
            size_t len = probe_text(&next, buf), n;
            mw_status st = (mw_status)mw_test_control(MW_TEST_TOKENIZER_WORDS, tok, buf, len, lens,
                                                      (size_t)(4096 * 64), &n);
            cr_assert_eq(st, MW_OK, "%s", mw_last_error());
            for (size_t i = 0; i < n; i++) {
                uint8_t le[4] = {(uint8_t)lens[i], (uint8_t)(lens[i] >> 8),
                                 (uint8_t)(lens[i] >> 16), (uint8_t)(lens[i] >> 24)};
                c = crc32_bytes(c, le, 4);
            }
            mine += n;
            if (got == 5) {
                size_t nids, blen;
                cr_assert_eq(mw_tokenizer_encode(tok, buf, len, ids, 3 * 4096 * 64, &nids), MW_OK,
                             "%s", mw_last_error());
                cr_assert_eq(mw_tokenizer_decode(tok, ids, nids, back, 3 * 4096 * 64, &blen), MW_OK,
                             "%s", mw_last_error());
                nc = crc32_bytes(nc, back, blen);
                mine_bytes += blen;
            }
        }
        cr_expect(mine == words && c == crc,
                  "%s: %llu words, CRC-32 %lu of their lengths; tokenizers: %llu, %lu", name,
                  (unsigned long long)mine, (unsigned long)c, words, crc);
        if (got == 5)
            cr_expect(mine_bytes == nbytes && nc == ncrc,
                      "%s: NFC of %llu bytes, CRC-32 %lu; tokenizers: %llu, %lu", name,
                      (unsigned long long)mine_bytes, (unsigned long)nc, nbytes, ncrc);
        mw_tokenizer_free(tok);
        rows++;
    }
    cr_assert_eq(rows, 3);
    free(all);
    free(buf);
    free(back);
    free(lens);
    free(ids);
}

/* --- files refused, by name ------------------------------------------------------------------- */

static char dir[64];

static void make_dir(void) {
    snprintf(dir, sizeof dir, "/tmp/mw_tokenizer_split_XXXXXX");
    cr_assert_not_null(mkdtemp(dir), "mkdtemp failed");
}

static void remove_dir(void) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char sub[512];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
            unlink(sub);
        }
    closedir(d);
    rmdir(dir);
}

TestSuite(tokenizer_split_files, .init = make_dir, .fini = remove_dir, .timeout = 60);

static const char *path_of(const char *name) {
    static char buf[4][256];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, 256, "%s/%s", dir, name);
    return p;
}

static void write_file(const char *name, const char *data, size_t n) {
    FILE *f = fopen(path_of(name), "wb");
    cr_assert_not_null(f, "cannot create %s", path_of(name));
    cr_assert_eq(fwrite(data, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

/* JSON of Llama 3's pre-tokenizer Split, its pattern and its other fields given. */
#define LLAMA3_REGEX                                                                               \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "         \
    "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+"
#define SPLIT(pattern, rest) "{\"type\": \"Split\", \"pattern\": " pattern ", " rest "}"
#define SPLIT_OK                                                                                   \
    SPLIT("{\"Regex\": \"" LLAMA3_REGEX "\"}", "\"behavior\": \"Isolated\", \"invert\": false")
#define BYTE_LEVEL "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}"
#define SEQ(a, b) "{\"type\": \"Sequence\", \"pretokenizers\": [" a ", " b "]}"
#define BOS_ADDED                                                                                  \
    "[{\"id\": 3, \"content\": \"<|begin_of_text|>\", \"special\": true, \"normalized\": false}]"
#define TEMPLATE(single, specials)                                                                 \
    "{\"type\": \"TemplateProcessing\", \"single\": " single ", \"pair\": [], "                    \
    "\"special_tokens\": " specials "}"
#define BOS_PIECE "{\"SpecialToken\": {\"id\": \"<|begin_of_text|>\", \"type_id\": 0}}"
#define A_PIECE "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}"
#define BOS_SPECIALS                                                                               \
    "{\"<|begin_of_text|>\": {\"id\": \"<|begin_of_text|>\", \"ids\": [3], \"tokens\": "           \
    "[\"<|begin_of_text|>\"]}}"

/* A small tokenizer.json, one part a line (messages name the line). */
static void write_json(const char *name, const char *normalizer, const char *pre,
                       const char *post) {
    char buf[4096];
    int n = snprintf(buf, sizeof buf,
                     "{\n"
                     "  \"version\": \"1.0\",\n"
                     "  \"added_tokens\": " BOS_ADDED ",\n"
                     "  \"normalizer\": %s,\n"
                     "  \"pre_tokenizer\": %s,\n"
                     "  \"post_processor\": %s,\n"
                     "  \"decoder\": {\"type\": \"ByteLevel\"},\n"
                     "  \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": "
                     "2}, \"merges\": [[\"a\", \"b\"]]}\n"
                     "}\n",
                     normalizer, pre, post);
    cr_assert_lt(n, (int)sizeof buf);
    write_file(name, buf, (size_t)n);
}

/* Loads `name` expecting status `want` and a message naming the file and holding each string
 * given (NULL-terminated). */
static void expect_refused(const char *name, mw_status want, ...) {
    mw_tokenizer *tok = (mw_tokenizer *)1;
    mw_status st = mw_tokenizer_load(path_of(name), &tok);
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

Test(tokenizer_split_files, the_small_file_loads) {
    write_json("ok.json", "null", SEQ(SPLIT_OK, BYTE_LEVEL),
               "{\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\"}, " TEMPLATE(
                   "[" BOS_PIECE ", " A_PIECE "]", BOS_SPECIALS) "]}");
    mw_tokenizer *tok = load(path_of("ok.json"));
    int32_t ids[8], bos;
    size_t n;
    cr_assert_eq(mw_tokenizer_encode_with(tok, "abba", 4, MW_ENCODE_ADD_SPECIAL, ids, 8, &n),
                 MW_OK);
    cr_assert(n == 4 && ids[0] == 3 && ids[1] == 2 && ids[2] == 1 && ids[3] == 0, "%zu ids", n);
    cr_assert_eq(mw_tokenizer_bos_id(tok, &bos), MW_OK);
    cr_assert_eq(bos, 3);
    mw_tokenizer_free(tok);
    /* $A before the special token: an eos */
    write_json("eos.json", "{\"type\": \"NFC\"}", BYTE_LEVEL,
               TEMPLATE("[" A_PIECE ", " BOS_PIECE "]", BOS_SPECIALS));
    tok = load(path_of("eos.json"));
    cr_assert_eq(mw_tokenizer_encode_with(tok, "ab", 2, MW_ENCODE_ADD_SPECIAL, ids, 8, &n), MW_OK);
    cr_assert(n == 2 && ids[0] == 2 && ids[1] == 3, "%zu ids", n);
    cr_assert_eq(mw_tokenizer_eos_id(tok, &bos), MW_OK);
    cr_assert_eq(bos, 3);
    cr_assert_eq(mw_tokenizer_bos_id(tok, &bos), MW_ERR_NOT_FOUND);
    mw_tokenizer_free(tok);
}

Test(tokenizer_split_files, pre_tokenizers_not_implemented_are_refused) {
    /* a regex that is not one of the three: named, whole */
    write_json("regex.json", "null",
               SEQ(SPLIT("{\"Regex\": \"\\\\p{L}+|\\\\p{N}{1,4}| ?[^\\\\s\\\\p{L}\\\\p{N}]+\"}",
                         "\"behavior\": \"Isolated\", \"invert\": false"),
                   BYTE_LEVEL),
               "null");
    expect_refused("regex.json", MW_ERR_UNSUPPORTED,
                   "regex.json:5:", "pre_tokenizer.pretokenizers[0].pattern.Regex",
                   "\"\\\\p{L}+|\\\\p{N}{1,4}| ?[^\\\\s\\\\p{L}\\\\p{N}]+\"", "not one this",
                   "Llama 3's", NULL);
    /* Llama 3's with one character changed */
    write_json("near.json", "null",
               SEQ(SPLIT("{\"Regex\": \"" LLAMA3_REGEX "|x\"}",
                         "\"behavior\": \"Isolated\", \"invert\": false"),
                   BYTE_LEVEL),
               "null");
    expect_refused("near.json", MW_ERR_UNSUPPORTED, "pattern.Regex", "not one this", NULL);
    write_json("string.json", "null",
               SEQ(SPLIT("{\"String\": \" \"}", "\"behavior\": \"Isolated\", \"invert\": false"),
                   BYTE_LEVEL),
               "null");
    expect_refused("string.json", MW_ERR_UNSUPPORTED, "pretokenizers[0].pattern", "literal String",
                   NULL);
    write_json("behavior.json", "null",
               SEQ(SPLIT("{\"Regex\": \"" LLAMA3_REGEX "\"}",
                         "\"behavior\": \"MergedWithPrevious\", \"invert\": false"),
                   BYTE_LEVEL),
               "null");
    expect_refused("behavior.json", MW_ERR_UNSUPPORTED, "pretokenizers[0].behavior",
                   "\"MergedWithPrevious\"", "Isolated", NULL);
    write_json("invert.json", "null",
               SEQ(SPLIT("{\"Regex\": \"" LLAMA3_REGEX "\"}",
                         "\"behavior\": \"Isolated\", \"invert\": true"),
                   BYTE_LEVEL),
               "null");
    expect_refused("invert.json", MW_ERR_UNSUPPORTED, "pretokenizers[0].invert", "true", NULL);
    write_json("alone.json", "null", SPLIT_OK, "null");
    expect_refused("alone.json", MW_ERR_UNSUPPORTED, "pre_tokenizer.type", "\"Split\"", NULL);
    write_json("nobyte.json", "null", "{\"type\": \"Sequence\", \"pretokenizers\": [" SPLIT_OK "]}",
               "null");
    expect_refused("nobyte.json", MW_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers", "no ByteLevel",
                   NULL);
    write_json("digits.json", "null",
               SEQ("{\"type\": \"Digits\", \"individual_digits\": true}", BYTE_LEVEL), "null");
    expect_refused("digits.json", MW_ERR_UNSUPPORTED, "pretokenizers[0].type", "\"Digits\"", NULL);
    write_json("order.json", "null", SEQ(BYTE_LEVEL, SPLIT_OK), "null");
    expect_refused("order.json", MW_ERR_UNSUPPORTED, "pretokenizers[1].type", "\"Split\"",
                   "after the first", NULL);
    write_json("nfkc.json", "{\"type\": \"NFKC\"}", BYTE_LEVEL, "null");
    expect_refused("nfkc.json", MW_ERR_UNSUPPORTED, "normalizer.type", "\"NFKC\"", "NFC", NULL);
}

Test(tokenizer_split_files, post_processors_checked) {
    write_json("roberta.json", "null", BYTE_LEVEL,
               "{\"type\": \"RobertaProcessing\", \"sep\": [\"b\", 1], \"cls\": [\"a\", 0]}");
    expect_refused("roberta.json", MW_ERR_UNSUPPORTED, "roberta.json:6:", "post_processor.type",
                   "\"RobertaProcessing\"", "TemplateProcessing", NULL);
    write_json("seqbert.json", "null", BYTE_LEVEL,
               "{\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\"}, "
               "{\"type\": \"BertProcessing\"}]}");
    expect_refused("seqbert.json", MW_ERR_UNSUPPORTED, "post_processor.processors[1].type",
                   "\"BertProcessing\"", NULL);
    write_json("missing.json", "null", BYTE_LEVEL, TEMPLATE("[" BOS_PIECE ", " A_PIECE "]", "{}"));
    expect_refused("missing.json", MW_ERR_FORMAT, "post_processor.special_tokens",
                   "\"<|begin_of_text|>\", which is not here", NULL);
    write_json("badid.json", "null", BYTE_LEVEL,
               TEMPLATE("[" BOS_PIECE ", " A_PIECE "]",
                        "{\"<|begin_of_text|>\": {\"id\": \"<|begin_of_text|>\", \"ids\": [9], "
                        "\"tokens\": [\"<|begin_of_text|>\"]}}"));
    expect_refused("badid.json", MW_ERR_FORMAT, "special_tokens[\"<|begin_of_text|>\"].ids",
                   "id 9 is not a token", NULL);
    write_json("noa.json", "null", BYTE_LEVEL, TEMPLATE("[" BOS_PIECE "]", BOS_SPECIALS));
    expect_refused("noa.json", MW_ERR_FORMAT, "post_processor.single", "no $A", NULL);
    write_json("b.json", "null", BYTE_LEVEL,
               TEMPLATE("[{\"Sequence\": {\"id\": \"B\", \"type_id\": 0}}]", BOS_SPECIALS));
    expect_refused("b.json", MW_ERR_FORMAT, "post_processor.single", "not \"A\"", NULL);
    write_json(
        "two.json", "null", BYTE_LEVEL,
        "{\"type\": \"Sequence\", \"processors\": [" TEMPLATE(
            "[" A_PIECE "]", BOS_SPECIALS) ", " TEMPLATE("[" A_PIECE "]", BOS_SPECIALS) "]}");
    expect_refused("two.json", MW_ERR_UNSUPPORTED, "processors[1].type", "second", NULL);
}

/* Llama 3's file cut anywhere is refused as damaged, never loaded halfway. */
Test(tokenizer_split_files, a_truncated_file_is_refused) {
    size_t size;
    char *all = read_all(data_path("llama3.json"), &size);
    const size_t cuts[] = {1, 100, size / 3, size / 2, size - 2};
    for (int k = 0; k < 5; k++) {
        write_file("cut.json", all, cuts[k]);
        expect_refused("cut.json", MW_ERR_FORMAT, "JSON syntax", NULL);
    }
    free(all);
}

/* --- out of memory -----------------------------------------------------------------------------
 */

/* Loads Llama 3's and Qwen2's, encodes a text with the BOS and one NFC changes: the first
 * error, checked to be MW_ERR_NOMEM. */
static mw_status alloc_scenario(void) {
    mw_tokenizer *a = NULL, *b = NULL;
    static const char text[] = "<|begin_of_text|>It'S 12345 cafe\xcc\x81 \xea\xb0\x80\xe1\x86\xa8"
                               " \r\n\t<|im_start|>x<|eot_id|>";
    int32_t ids[3 * sizeof text + 2];
    size_t n = 0;
    mw_status st = mw_tokenizer_load(data_path("llama3.json"), &a);
    if (st == MW_OK) st = mw_tokenizer_load(data_path("qwen2.json"), &b);
    if (st == MW_OK)
        st = mw_tokenizer_encode_with(a, text, sizeof text - 1, MW_ENCODE_ADD_SPECIAL, ids,
                                      sizeof ids / sizeof *ids, &n);
    if (st == MW_OK)
        st = mw_tokenizer_encode(b, text, sizeof text - 1, ids, sizeof ids / sizeof *ids, &n);
    if (st != MW_OK) {
        cr_assert_eq(st, MW_ERR_NOMEM, "expected MW_ERR_NOMEM, got %s: %s", mw_status_name(st),
                     mw_last_error());
        cr_assert(strstr(mw_last_error(), "out of memory"), "message: %s", mw_last_error());
    }
    mw_tokenizer_free(a);
    mw_tokenizer_free(b);
    return st;
}

Test(tokenizer_split_nomem, every_allocation, .timeout = 120) {
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
