/* Added tokens with "single_word": true (meshwit/tokenizer.h) against Hugging Face `tokenizers`:
 * the ids it gives a corpus that puts every kind of character next to such tokens, special or
 * not, normalized or not, with lstrip and rstrip, without and with NFC (tests/data/tokenizer/
 * single_word, made by tools/make_single_word_ref.py); then the boundary rules one by one on a
 * tokenizer whose vocabulary is the 256 bytes, each rule as tokenizers 0.23's
 * AddedVocabulary::find_matches has it (checked there with the same texts). */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meshwit.h"
#include "meshwit/testing.h"
#include "tests/common/tokenizer_data.h"

/* --- ids as Hugging Face gives them ------------------------------------------------------------
 */

TestSuite(tokenizer_single_word, .timeout = 60);

/* ids.txt: "name<TAB>text<TAB>ids" per line, the cases of one tokenizer together. */
Test(tokenizer_single_word, ids_as_tokenizers_gives_them) {
    char *all = read_all(data_path("single_word/ids.txt"), NULL);
    char current[32] = "";
    mw_tokenizer *tok = NULL;
    int checked = 0, tokenizers = 0, matched = 0, line_no = 0;
    for (char *line = all; *line; line_no++) {
        char *nl = strchr(line, '\n');
        *nl = '\0';
        char *tab1 = strchr(line, '\t'), *tab2 = strrchr(line, '\t');
        cr_assert(tab1 && tab2 > tab1, "ids.txt line %d has not three fields", line_no + 1);
        *tab1 = *tab2 = '\0';
        if (strcmp(line, current) != 0) {
            mw_tokenizer_free(tok);
            char file[64];
            snprintf(file, sizeof file, "single_word/%s.json", line);
            tok = load(data_path(file));
            snprintf(current, sizeof current, "%s", line);
            tokenizers++;
        }
        size_t len = unescape(tab1 + 1, (size_t)(tab2 - tab1 - 1)), nwant, n;
        int32_t *want = parse_ids(tab2 + 1, &nwant);
        int32_t *ids = encode(tok, tab1 + 1, len, &n);
        size_t i = 0;
        while (i < n && i < nwant && ids[i] == want[i]) i++;
        cr_expect(i == n && n == nwant,
                  "%s, ids.txt line %d (%.60s): id %zu is %d, Hugging Face has %d (%zu ids, it "
                  "has %zu)",
                  current, line_no + 1, tab1 + 1, i, i < n ? ids[i] : -1, i < nwant ? want[i] : -1,
                  n, nwant);
        for (size_t k = 0; k < nwant; k++) matched += want[k] >= 500; /* the added tokens */
        free(ids);
        free(want);
        checked++;
        line = nl + 1;
    }
    mw_tokenizer_free(tok);
    free(all);
    cr_assert_eq(tokenizers, 2);
    cr_assert_gt(checked, 400);
    cr_assert_gt(matched, 500, "the corpus matches the added tokens often (%d)", matched);
}

/* --- the rules one at a time -------------------------------------------------------------------
 */

/* GPT-2's bytes_to_unicode: byte b's character, as UTF-8 into o; its length. */
static int byte_char(unsigned b, char *o) {
    unsigned n = 0, cp = 0;
    for (unsigned x = 0; x < 256; x++) {
        int printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
        if (x == b) {
            cp = printable ? x : 256 + n;
            break;
        }
        if (!printable) n++;
    }
    if (cp < 0x80) return o[0] = (char)cp, 1;
    o[0] = (char)(0xC0 | cp >> 6);
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* A tokenizer.json: the 256 byte tokens (id = the byte), no merges, GPT-2's regex, `normalizer`
 * and the added tokens `added` (a JSON array, ids from 256), written to a file named by `name`
 * and loaded (st: what the load returned; the tokenizer or NULL). */
static mw_tokenizer *bytes_with(const char *name, const char *added, const char *normalizer,
                                mw_status *st) {
    static char json[16384];
    char *o = json;
    o += sprintf(o,
                 "{\"version\": \"1.0\", \"added_tokens\": %s, \"normalizer\": %s, "
                 "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}, "
                 "\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"vocab\": {",
                 added, normalizer);
    for (unsigned b = 0; b < 256; b++) {
        char c[2];
        int l = byte_char(b, c);
        *o++ = '"';
        if (c[0] == '"' || c[0] == '\\') *o++ = '\\';
        memcpy(o, c, (size_t)l);
        o += l;
        o += sprintf(o, "\": %u%s", b, b < 255 ? ", " : "");
    }
    sprintf(o, "}, \"merges\": []}}");
    char path[96];
    snprintf(path, sizeof path, "/tmp/mw_single_word_%d_%s.json", (int)getpid(), name);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    fputs(json, f);
    cr_assert_eq(fclose(f), 0);
    mw_tokenizer *tok = NULL;
    *st = mw_tokenizer_load(path, &tok);
    unlink(path);
    return tok;
}

static mw_tokenizer *bytes_tokenizer(const char *added, const char *normalizer) {
    mw_status st;
    mw_tokenizer *tok = bytes_with("t", added, normalizer, &st);
    cr_assert_eq(st, MW_OK, "%s", mw_last_error());
    return tok;
}

/* The ids of text (NUL-terminated) written as a string of their own: a byte's id as the byte
 * (printable ones as themselves, others as \xNN), and an added token's as [id]. */
static const char *spelled(mw_tokenizer *tok, const char *text) {
    static char out[4][512];
    static int next;
    char *o = out[next++ % 4], *end = o + 500, *p = o;
    size_t n;
    int32_t *ids = encode(tok, text, strlen(text), &n);
    for (size_t i = 0; i < n && p < end; i++) {
        if (ids[i] >= 256)
            p += sprintf(p, "[%d]", ids[i]);
        else if (ids[i] >= 0x20 && ids[i] < 0x7F)
            *p++ = (char)ids[i];
        else
            p += sprintf(p, "\\x%02x", (unsigned)ids[i]);
    }
    *p = '\0';
    free(ids);
    return o;
}

#define EXPECT(tok, text, want)                                                                    \
    do {                                                                                           \
        const char *got_ = spelled(tok, text);                                                     \
        cr_expect(strcmp(got_, want) == 0, "%s: got %s, want %s", #text, got_, want);              \
    } while (0)

/* One added token with single_word and the flags given (JSON members), id 256. */
static mw_tokenizer *one_token(const char *content, const char *flags) {
    char added[256];
    snprintf(
        added, sizeof added,
        "[{\"id\": 256, \"content\": \"%s\", \"single_word\": true, \"normalized\": false%s%s}]",
        content, *flags ? ", " : "", flags);
    return bytes_tokenizer(added, "null");
}

/* A word character is the Rust regex crate's \w: Alphabetic, marks, decimal digits, connector
 * punctuation, Join_Control; the start and the end of the text are boundaries. */
Test(tokenizer_single_word, word_characters_on_either_side) {
    mw_tokenizer *tok = one_token("<x>", "");
    EXPECT(tok, "<x>", "[256]");
    EXPECT(tok, "<x><x>", "[256][256]");
    EXPECT(tok, " <x>.", " [256].");
    EXPECT(tok, "a<x>", "a<x>");
    EXPECT(tok, "<x>Z", "<x>Z");
    EXPECT(tok, "_<x>", "_<x>");
    EXPECT(tok, "<x>7", "<x>7");
    EXPECT(tok, "\xc3\xa9<x>", "\\xc3\\xa9<x>");          /* é */
    EXPECT(tok, "<x>\xe4\xb8\xad", "<x>\\xe4\\xb8\\xad"); /* 中 */
    EXPECT(tok, "<x>\xcc\x81", "<x>\\xcc\\x81");          /* U+0301, a mark */
    EXPECT(tok, "\xe2\x80\x8d<x>", "\\xe2\\x80\\x8d<x>"); /* U+200D, Join_Control */
    EXPECT(tok, "\xe2\x85\xa0<x>", "\\xe2\\x85\\xa0<x>"); /* U+2160, Nl but Alphabetic */
    EXPECT(tok, "<x>\xe2\x92\xb6", "<x>\\xe2\\x92\\xb6"); /* U+24B6, So but Alphabetic */
    EXPECT(tok, "\xd9\xa3<x>", "\\xd9\\xa3<x>");          /* U+0663, an Arabic-Indic digit */
    EXPECT(tok, "<x>\xe2\x80\xbf", "<x>\\xe2\\x80\\xbf"); /* U+203F, connector punctuation */
    /* not word characters: symbols, emoji, other numbers, white space, private use */
    EXPECT(tok, "\xf0\x9f\x91\x8d<x>\xf0\x9f\x91\x8d",
           "\\xf0\\x9f\\x91\\x8d[256]\\xf0\\x9f\\x91\\x8d");
    EXPECT(tok, "<x>\xc2\xb2", "[256]\\xc2\\xb2"); /* ² */
    EXPECT(tok, "\xc2\xbd<x>", "\\xc2\\xbd[256]"); /* ½ */
    EXPECT(tok, "\xc2\xa0<x>\xe3\x80\x80", "\\xc2\\xa0[256]\\xe3\\x80\\x80");
    EXPECT(tok, "\xee\x80\x80<x>", "\\xee\\x80\\x80[256]");
    /* Unicode 16.0's letters are letters; a letter of 17.0 (U+10940) is not yet */
    EXPECT(tok, "\xf0\x90\xb5\x90<x>", "\\xf0\\x90\\xb5\\x90<x>");
    EXPECT(tok, "\xf0\x90\xa5\x80<x>", "\\xf0\\x90\\xa5\\x80[256]");
    mw_tokenizer_free(tok);
}

/* tokenizers cannot be given bytes that are not UTF-8; here such a byte is a character of its
 * own (as in the pre-tokenizer) and not a word character. */
Test(tokenizer_single_word, bytes_that_are_not_utf8_are_not_word_characters) {
    mw_tokenizer *tok = one_token("<x>", "");
    EXPECT(tok, "\x80<x>\xff", "\\x80[256]\\xff");
    EXPECT(tok, "a\xc3<x>", "a\\xc3[256]");                 /* a sequence cut short */
    EXPECT(tok, "\xc3\xa9\xa9<x>", "\\xc3\\xa9\\xa9[256]"); /* é, then a stray continuation */
    EXPECT(tok, "<x>\xa9\xc3\xa9", "[256]\\xa9\\xc3\\xa9");
    EXPECT(tok, "\xed\xa0\x80<x>", "\\xed\\xa0\\x80[256]"); /* a surrogate */
    mw_tokenizer_free(tok);
}

/* The token's own characters do not matter, only its neighbours': a token of letters stands
 * alone between spaces, and a dropped match is not retried one byte later. */
Test(tokenizer_single_word, tokens_of_letters_and_no_overlapping_retry) {
    mw_tokenizer *tok = one_token("ab", "");
    EXPECT(tok, "ab ab", "[256] [256]");
    EXPECT(tok, "abab", "abab");
    EXPECT(tok, "ab-ab", "[256]-[256]");
    EXPECT(tok, "aab abb", "aab abb");
    mw_tokenizer_free(tok);
    /* "abc" found at 0 and dropped: the search goes on at 3, so "bc" (plain) is not found in
     * "abcd", nor a shorter token at the same start */
    tok = bytes_tokenizer("[{\"id\": 256, \"content\": \"abc\", \"single_word\": true, "
                          "\"normalized\": false}, {\"id\": 257, \"content\": \"bc\", "
                          "\"normalized\": false}, {\"id\": 258, \"content\": \"ab\", "
                          "\"normalized\": false}]",
                          "null");
    EXPECT(tok, "abcd", "abcd");
    EXPECT(tok, "abc d", "[256] d");
    EXPECT(tok, "xbcd", "x[257]d");
    EXPECT(tok, "abd", "[258]d");
    mw_tokenizer_free(tok);
}

/* lstrip and rstrip take white space only for a token that stands alone; the white space is not
 * looked through for the word test. */
Test(tokenizer_single_word, lstrip_and_rstrip_after_the_word_test) {
    mw_tokenizer *tok = one_token("<y>", "\"lstrip\": true, \"rstrip\": true");
    EXPECT(tok, "a  <y>  b", "a[256]b");
    EXPECT(tok, "a\t<y>b", "a\\x09<y>b");
    EXPECT(tok, "a<y> b", "a<y> b");
    EXPECT(tok, "<y> <y> <y>", "[256][256][256]");
    EXPECT(tok, "a <y>\xe2\x80\x83", "a[256]");
    mw_tokenizer_free(tok);
}

/* The two passes: a "normalized": false token is matched in the raw text, and what it leaves is
 * a text of its own to the "normalized": true ones, whose ends are boundaries; a dropped token
 * leaves its text to the second pass. */
Test(tokenizer_single_word, each_pass_searches_its_own_text) {
    mw_tokenizer *tok =
        bytes_tokenizer("[{\"id\": 256, \"content\": \"ab\", \"normalized\": false}, "
                        "{\"id\": 257, \"content\": \"cd\", \"single_word\": true, "
                        "\"normalized\": true}, {\"id\": 258, \"content\": \"xy\", "
                        "\"single_word\": true, \"normalized\": false}, "
                        "{\"id\": 259, \"content\": \"yz\", \"normalized\": true}]",
                        "null");
    EXPECT(tok, "abcd", "[256][257]");
    EXPECT(tok, "cdab", "[257][256]");
    EXPECT(tok, "acd", "acd");
    EXPECT(tok, "xyz", "x[259]");
    EXPECT(tok, "xy z", "[258] z");
    mw_tokenizer_free(tok);
}

/* With NFC, a normalized token is found as its content's NFC, in the normalized text, and a
 * mark that NFC leaves after it is a word character; a token with "normalized": false is found
 * as written, in the raw text. Two tokens that are one text once normalized are refused:
 * tokenizers finds either, a different one from run to run. */
Test(tokenizer_single_word, normalized_tokens_are_matched_in_nfc) {
    mw_tokenizer *tok = bytes_tokenizer(
        "[{\"id\": 256, \"content\": \"e\\u0301t\", \"single_word\": true, \"normalized\": true}, "
        "{\"id\": 257, \"content\": \"n\\u0303\", \"single_word\": true, \"normalized\": false}]",
        "{\"type\": \"NFC\"}");
    EXPECT(tok, "e\xcc\x81t", "[256]");
    EXPECT(tok, "\xc3\xa9t", "[256]");
    EXPECT(tok, "\xc3\xa9t\xcc\x81", "\\xc3\\xa9t\\xcc\\x81"); /* U+0301 after it */
    EXPECT(tok, "n\xcc\x83 \xc3\xb1", "[257] \\xc3\\xb1");
    mw_tokenizer_free(tok);
    mw_status st;
    tok = bytes_with("dup",
                     "[{\"id\": 256, \"content\": \"e\\u0301x\"}, {\"id\": 257, \"content\": "
                     "\"\\u00e9x\", \"single_word\": true}]",
                     "{\"type\": \"NFC\"}", &st);
    cr_assert_null(tok);
    cr_assert_eq(st, MW_ERR_UNSUPPORTED, "%s", mw_status_name(st));
    const char *msg = mw_last_error();
    cr_assert(strstr(msg, "added_tokens[1].content") && strstr(msg, "added_tokens[0]") &&
                  strstr(msg, "run to run"),
              "%s", msg);
    /* without a normalizer they are two texts */
    tok = bytes_with("two",
                     "[{\"id\": 256, \"content\": \"e\\u0301x\"}, {\"id\": 257, \"content\": "
                     "\"\\u00e9x\", \"single_word\": true}]",
                     "null", &st);
    cr_assert_eq(st, MW_OK, "%s", mw_last_error());
    EXPECT(tok, "e\xcc\x81x \xc3\xa9x", "[256] [257]");
    mw_tokenizer_free(tok);
}

/* --- out of memory -----------------------------------------------------------------------------
 */

static mw_status alloc_scenario(void) {
    mw_tokenizer *tok = NULL;
    const char *text = "<m> cafe\xcc\x81 e\xcc\x81te\xcc\x81 a<m>b";
    int32_t ids[256];
    size_t n;
    mw_status st = mw_tokenizer_load(data_path("single_word/nfc.json"), &tok);
    if (st == MW_OK) st = mw_tokenizer_encode(tok, text, strlen(text), ids, 256, &n);
    if (st != MW_OK) {
        cr_assert_eq(st, MW_ERR_NOMEM, "expected MW_ERR_NOMEM, got %s: %s", mw_status_name(st),
                     mw_last_error());
        cr_assert(strstr(mw_last_error(), "out of memory"), "message: %s", mw_last_error());
    }
    mw_tokenizer_free(tok);
    return st;
}

Test(tokenizer_single_word, every_allocation, .timeout = 120) {
    mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)0);
    cr_assert_eq(alloc_scenario(), MW_OK, "%s", mw_last_error());
    int64_t total = mw_test_control(MW_TEST_ALLOCATIONS);
    cr_assert_gt(total, 10);
    int failed = 0;
    for (int64_t k = 1; k <= total; k++) {
        mw_test_control(MW_TEST_FAIL_ALLOCATION, k);
        failed += alloc_scenario() != MW_OK;
    }
    mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)0);
    cr_assert_eq(failed, total, "%d of %lld injected failures surfaced", failed, (long long)total);
}
