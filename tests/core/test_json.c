/* The JSON reader beneath the file formats (formats/json.h): integers exactly to int64's ends,
 * numbers as doubles, decoded strings, members in the order of the text, repeated keys, the
 * nesting limit, a prefix of a text, and syntax errors placed by line and column or by byte. */
#include <criterion/criterion.h>
#include <locale.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "formats/json.h"
#include "meshwit.h"

static mw__json *parse(const char *text, const mw__json_options *opt) {
    mw__json *doc;
    mw_status st = mw__json_parse_with(text, strlen(text), "t.json", opt, &doc);
    cr_assert_eq(st, MW_OK, "%s: %s", text, mw_last_error());
    return doc;
}

/* The message parsing `text` gives (it must fail with MW_ERR_FORMAT). */
static const char *refused(const char *text, size_t n, const mw__json_options *opt) {
    mw__json *doc = (mw__json *)1;
    mw_status st = mw__json_parse_with(text, n, "t.json", opt, &doc);
    cr_assert_eq(st, MW_ERR_FORMAT, "%s: %s", text, mw_status_name(st));
    cr_assert_null(doc);
    return mw_last_error();
}

static const mw__json_node *child(const mw__json *doc, const mw__json_node *n, int i) {
    const mw__json_node *c = mw__json_node_at(doc, n->first);
    while (i-- > 0 && c) c = mw__json_node_at(doc, c->next);
    cr_assert(c, "no child %d", i);
    return c;
}

Test(json, integers_are_exact_to_the_ends_of_int64) {
    mw__json *doc = parse("[9223372036854775807, -9223372036854775808, 9223372036854775808, "
                          "-9223372036854775809, -0, 0, 12, 1.0, 1e2, 123456789012345678901]",
                          NULL);
    const mw__json_node *a = mw__json_node_at(doc, 0);
    cr_assert_eq(a->count, 10);
    const struct {
        int integer;
        int64_t v;
    } want[] = {{1, INT64_MAX}, {1, INT64_MIN}, {0, 0}, {0, 0}, {1, 0},
                {1, 0},         {1, 12},        {0, 0}, {0, 0}, {0, 0}};
    for (int i = 0; i < 10; i++) {
        const mw__json_node *c = child(doc, a, i);
        cr_assert_eq(c->type, MW__JSON_NUMBER);
        cr_assert_eq(c->is_integer, want[i].integer, "element %d", i);
        if (want[i].integer)
            cr_assert_eq(c->ival, want[i].v, "element %d: %lld", i, (long long)c->ival);
    }
    mw__json_free(doc);
}

Test(json, numbers_read_as_the_nearest_double) {
    /* 200 zeros then a 1: longer than the reader's own buffer for a number's text. */
    char text[512] = "[0.1, -2.5E+3, 1e-5, 7, 0.";
    for (int i = 0; i < 200; i++) strcat(text, "0");
    strcat(text, "1e201, 1e400]");
    mw__json *doc = parse(text, NULL);
    const mw__json_node *a = mw__json_node_at(doc, 0);
    const double want[] = {0.1, -2500.0, 1e-5, 7.0, 1.0, HUGE_VAL};
    double v;
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(mw__json_double(doc, child(doc, a, i), &v), MW_OK, "%s", mw_last_error());
        cr_assert(v == want[i], "element %d: %.17g, not %.17g", i, v, want[i]);
    }
    cr_assert_eq(mw__json_double(doc, a, &v), MW_ERR_INVALID);
    /* A locale whose decimal point is a comma does not change what "0.1" means. */
    if (setlocale(LC_NUMERIC, "de_DE.UTF-8") || setlocale(LC_NUMERIC, "fr_FR.UTF-8")) {
        cr_assert_eq(mw__json_double(doc, child(doc, a, 0), &v), MW_OK);
        cr_assert(v == 0.1, "%.17g under a comma locale", v);
        setlocale(LC_NUMERIC, "C");
    } else {
        cr_log_info("no locale with a decimal comma here: that case is not checked");
    }
    mw__json_free(doc);
}

Test(json, strings_are_decoded_and_terminated) {
    mw__json *doc =
        parse("{\"k\\u00e9y\": \"a\\\"\\\\\\/\\b\\f\\n\\r\\t\", "
              "\"pair\": \"\\ud83d\\ude00\", \"nul\": \"x\\u0000y\", \"raw\": \"\xc3\xa9\"}",
              NULL);
    const mw__json_node *o = mw__json_node_at(doc, 0);
    const mw__json_node *c = child(doc, o, 0);
    cr_assert_eq(c->klen, 4);
    cr_assert_str_eq(mw__json_key(doc, c), "k\xc3\xa9y");
    cr_assert_str_eq(mw__json_str(doc, c), "a\"\\/\b\f\n\r\t");
    cr_assert_str_eq(mw__json_str(doc, child(doc, o, 1)), "\xf0\x9f\x98\x80");
    c = child(doc, o, 2);
    cr_assert(c->len == 3 && memcmp(mw__json_str(doc, c), "x\0y", 4) == 0);
    cr_assert_str_eq(mw__json_str(doc, child(doc, o, 3)), "\xc3\xa9");
    mw__json_free(doc);
    cr_assert(strstr(refused("\"\\ud800\"", 8, NULL), "lone leading surrogate \\ud800"));
    cr_assert(strstr(refused("\"\\ude00\"", 8, NULL), "lone trailing surrogate \\ude00"));
    cr_assert(strstr(refused("\"a\\qb\"", 6, NULL), "t.json:1:3: JSON syntax: bad escape '\\q'"));
    cr_assert(strstr(refused("\"ab", 3, NULL), "unterminated string (the file ends here"));
    cr_assert(strstr(refused("\"\xff\"", 3, NULL), "invalid UTF-8 (byte 0xff)"));
    cr_assert(strstr(refused("\"a\0\"", 4, NULL), "control character 0x00"));
}

Test(json, members_keep_the_order_of_the_text_and_repeats_are_found) {
    mw__json *doc = parse("{\"z\": 1, \"a\": 2, \"m\": 3, \"a\": 4}", NULL);
    const mw__json_node *o = mw__json_node_at(doc, 0);
    const char *keys = "zama";
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(mw__json_key(doc, child(doc, o, i))[0], keys[i]);
        cr_assert_eq(child(doc, o, i)->ival, i + 1);
    }
    cr_assert_eq(mw__json_get(doc, o, "a")->ival, 2);
    cr_assert_eq(mw__json_repeated(doc, o), child(doc, o, 3));
    static const char *const listed[] = {"z", "a", NULL};
    cr_assert_eq(mw__json_duplicate(doc, o, listed), child(doc, o, 3));
    mw__json_free(doc);
    doc = parse("{\"a\": {\"a\": 1}, \"ab\": 2, \"b\": 3}", NULL);
    cr_assert_null(mw__json_repeated(doc, mw__json_node_at(doc, 0)));
    cr_assert_null(mw__json_repeated(doc, child(doc, mw__json_node_at(doc, 0), 1)));
    mw__json_free(doc);
}

Test(json, nesting_is_limited_as_asked) {
    mw__json_options two = {.max_depth = 2};
    mw__json_free(parse("[[1], {\"a\": 2}]", &two));
    cr_assert(strstr(refused("[[[1]]]", 7, &two), "t.json:1:3: JSON syntax: more than 2 levels"));
    char deep[200] = "";
    for (int i = 0; i < 129; i++) strcat(deep, "[");
    cr_assert(strstr(refused(deep, strlen(deep), NULL), "more than 128 levels of nesting"));
}

static void name_member(const char *key, size_t klen, char *buf, size_t size) {
    snprintf(buf, size, "member '%.*s': ", (int)klen, key);
}

Test(json, a_part_of_a_file_is_placed_by_byte) {
    mw__json_options header = {.part = "header"};
    cr_assert(strstr(refused("{\"a\" 1}", 7, &header),
                     "t.json: JSON syntax: expected ':' after a member name, found '1' "
                     "(header byte 5)"),
              "%s", mw_last_error());
    cr_assert(strstr(refused("{\"a\":", 5, &header), "(header byte 5, where the header ends)"),
              "%s", mw_last_error());
    /* A syntax error inside a member of the top-level object can name the member. */
    mw__json_options named = {.part = "header", .member = name_member};
    const char *in_b = "{\"a\": 1, \"b\": [1 2]}", *after_a = "{\"a\": 1 \"b\": 2}";
    cr_assert(strstr(refused(in_b, strlen(in_b), &named),
                     "t.json: member 'b': JSON syntax: expected ',' or ']' in an array, found '2' "
                     "(header byte 17)"),
              "%s", mw_last_error());
    cr_assert(strstr(refused(after_a, strlen(after_a), &named),
                     "t.json: JSON syntax: expected ',' or '}'"),
              "%s", mw_last_error());
    /* Line and column count characters, not bytes. */
    const char *accented = "{\n \"\xc3\xa9\": x}";
    cr_assert(strstr(refused(accented, strlen(accented), NULL), "t.json:2:7: JSON syntax"), "%s",
              mw_last_error());
}

Test(json, a_prefix_leaves_the_rest_unread) {
    mw__json_options prefix = {.prefix = 1};
    const char *text = "{\"a\": 1}  \t\xff tail";
    mw__json *doc = parse(text, &prefix);
    cr_assert_eq(doc->end, 11);
    mw__json_free(doc);
    doc = parse("[1] ", NULL);
    cr_assert_eq(doc->end, 4);
    mw__json_free(doc);
    cr_assert(strstr(refused(text, strlen(text), NULL), "byte 0xff after the end"), "%s",
              mw_last_error());
}
