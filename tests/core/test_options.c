/* The examples' option tables (examples/common/options.h): the defaults are the usage's, values are
 * read by type and range in either spelling, every bad argument is refused with a message naming
 * it, and the run's settings and the text the processes compare come from the same table. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/common/options.h"

typedef struct opts {
    const char *devices, *file, *mode, *text;
    int count, count_given, flag, pick, threads;
    int64_t rows;
    uint64_t seed;
    double rate, eps;
    const char *positional[4];
    int npositional;
} opts;

#define F(field) offsetof(opts, field)

static const cli_option table[] = {
    CLI_SECTION("things"),
    CLI_OPT("--devices", CLI_STRING, F(devices), "cpu:2", "SPEC", "devices", .flags = CLI_LOCAL),
    CLI_OPT("--file", CLI_STRING, F(file), NULL, "FILE", "a file", .flags = CLI_FILE),
    CLI_OPT("--count", CLI_INT, F(count), "32", "N", "how many", .min = 1, .max = 1000,
            .flags = CLI_RUN, .given = F(count_given)),
    CLI_OPT("--rows", CLI_I64, F(rows), "8192", "N", "rows", .min = 1, .max = 1e12),
    CLI_OPT("--seed", CLI_U64, F(seed), "1", "N", "seed"),
    CLI_OPT("--rate", CLI_DOUBLE, F(rate), "2e-3", "X", "a rate", .min = 0, .max = 1,
            .flags = CLI_RUN),
    CLI_OPT("--eps", CLI_DOUBLE, F(eps), "1e-8", "X", "above zero", .min = 0, .max = 1,
            .flags = CLI_ABOVE_MIN),
    CLI_OPT("--flag", CLI_FLAG, F(flag), NULL, NULL, "a flag", .flags = CLI_RUN),
    CLI_SECTION("choices"),
    CLI_OPT("--pick", CLI_CHOICE, F(pick), "cosine", "S", "cosine or constant",
            .choices = CLI_CHOICES({"cosine", 1}, {"constant", 0}), .flags = CLI_RUN),
    CLI_OPT("--threads", CLI_CHOICE, F(threads), "auto", "HOW", "auto, per-device or a count",
            .choices = CLI_CHOICES({"auto", 0}, {"per-device", -1}), .min = 1, .max = 64),
    CLI_OPT("--mode", CLI_NAME, F(mode), "tiny", "NAME", "a preset",
            .choices = CLI_CHOICES({"tiny", 0}, {"small", 0})),
    CLI_OPT("--text", CLI_STRING, F(text), "\n", "TEXT",
            "a text long enough to be wrapped over more than one line of the usage, which is "
            "94 columns wide",
            .flags = CLI_HASHED),
};

static int take(void *o_, const char *arg) {
    opts *o = o_;
    if (o->npositional == 4 || strcmp(arg, "-") == 0) return -1;
    o->positional[o->npositional++] = arg;
    return 0;
}

static const cli_program program = {"t",          sizeof(opts), table, CLI_COUNT(table),
                                    "usage: t\n", "the end\n",  NULL};
static const cli_program with_positional = {"t",  sizeof(opts), table, CLI_COUNT(table),
                                            NULL, NULL,         take};

static int parse(const cli_program *p, opts *o, ...) {
    char *argv[16] = {"t"};
    int argc = 1;
    va_list ap;
    va_start(ap, o);
    for (char *a; argc < 16 && (a = va_arg(ap, char *));) argv[argc++] = a;
    va_end(ap);
    memset(o, 0x5a, sizeof *o); /* cli_parse clears it */
    return cli_parse(p, argc, argv, o);
}

Test(options, defaults_are_the_tables) {
    opts o;
    cr_assert_eq(parse(&program, &o, NULL), 0);
    cr_assert_str_eq(o.devices, "cpu:2");
    cr_assert_null(o.file);
    cr_assert_eq(o.count, 32);
    cr_assert_eq(o.count_given, 0);
    cr_assert_eq(o.rows, 8192);
    cr_assert_eq(o.seed, 1);
    cr_assert_eq(o.rate, 2e-3);
    cr_assert_eq(o.eps, 1e-8);
    cr_assert_eq(o.flag, 0);
    cr_assert_eq(o.pick, 1);
    cr_assert_eq(o.threads, 0);
    cr_assert_str_eq(o.mode, "tiny");
    cr_assert_str_eq(o.text, "\n");
    cr_assert_eq(o.npositional, 0);
}

Test(options, values_in_either_spelling) {
    opts o;
    cr_assert_eq(parse(&program, &o, "--count", "7", "--rows=1000000000000", "--seed", "0x10",
                       "--rate=0.5", "--flag", "--pick", "constant", "--threads", "12",
                       "--mode=small", "--file", "a.bin", "--text=", NULL),
                 0);
    cr_assert_eq(o.count, 7);
    cr_assert_eq(o.count_given, 1);
    cr_assert_eq(o.rows, 1000000000000);
    cr_assert_eq(o.seed, 16);
    cr_assert_eq(o.rate, 0.5);
    cr_assert_eq(o.flag, 1);
    cr_assert_eq(o.pick, 0);
    cr_assert_eq(o.threads, 12);
    cr_assert_str_eq(o.mode, "small");
    cr_assert_str_eq(o.file, "a.bin");
    cr_assert_str_eq(o.text, "");
    cr_assert_eq(parse(&program, &o, "--threads", "per-device", "--count", "32", NULL), 0);
    cr_assert_eq(o.threads, -1);
    cr_assert_eq(o.count_given, 1, "given even when it is the default");
    /* A value is the next argument whatever it looks like. */
    cr_assert_eq(parse(&program, &o, "--file", "--flag", NULL), 0);
    cr_assert_str_eq(o.file, "--flag");
    cr_assert_eq(o.flag, 0);
}

Test(options, help) {
    opts o;
    cr_assert_eq(parse(&program, &o, "--help", NULL), 1);
    cr_assert_eq(parse(&program, &o, "--count", "3", "-h", NULL), 1);
}

Test(options, positional_arguments) {
    opts o;
    cr_assert_eq(parse(&with_positional, &o, "a.txt", "--count", "2", "b.txt", NULL), 0);
    cr_assert_eq(o.npositional, 2);
    cr_assert_str_eq(o.positional[0], "a.txt");
    cr_assert_str_eq(o.positional[1], "b.txt");
}

/* Each bad argument: -1 and exactly this message. */
static const struct {
    const char *args[3], *message;
} bad[] = {
    {{"--bogus"}, "t: unknown argument '--bogus' (see --help)\n"},
    {{"-"}, "t: unknown argument '-' (see --help)\n"},
    {{"a.txt"}, "t: unknown argument 'a.txt' (see --help)\n"},
    {{"--flag=1"}, "t: unknown argument '--flag=1' (see --help)\n"},
    {{"--countx", "3"}, "t: unknown argument '--countx' (see --help)\n"},
    {{"--count"}, "t: --count needs a value (see --help)\n"},
    {{"--count", "0"}, "t: bad value '0' for --count (see --help)\n"},
    {{"--count=1001"}, "t: bad value '1001' for --count (see --help)\n"},
    {{"--count", " 3"}, "t: bad value ' 3' for --count (see --help)\n"},
    {{"--count", "3x"}, "t: bad value '3x' for --count (see --help)\n"},
    {{"--rows", "0"}, "t: bad value '0' for --rows (see --help)\n"},
    {{"--seed", "-5"}, "t: bad value '-5' for --seed (see --help)\n"},
    {{"--rate", "nan"}, "t: bad value 'nan' for --rate (see --help)\n"},
    {{"--rate", "1.5"}, "t: bad value '1.5' for --rate (see --help)\n"},
    {{"--eps", "0"}, "t: bad value '0' for --eps (see --help)\n"},
    {{"--pick", "bogus"}, "t: bad value 'bogus' for --pick (expected cosine or constant)\n"},
    {{"--pick", "1"}, "t: bad value '1' for --pick (expected cosine or constant)\n"},
    {{"--threads", "0"},
     "t: bad value '0' for --threads (expected auto, per-device or a number from 1 to 64)\n"},
    {{"--mode", "big"}, "t: bad value 'big' for --mode (expected tiny or small)\n"},
};

Test(options, bad_arguments_are_named, .init = cr_redirect_stderr) {
    opts o;
    char expected[2048] = "";
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *const *a = bad[i].args;
        int rc = a[1] ? parse(&program, &o, a[0], a[1], NULL) : parse(&program, &o, a[0], NULL);
        cr_assert_eq(rc, -1, "%s %s", a[0], a[1] ? a[1] : "");
        strcat(expected, bad[i].message);
    }
    fflush(stderr);
    cr_assert_stderr_eq_str(expected);
}

Test(options, a_bad_default_is_refused, .init = cr_redirect_stderr) {
    static const cli_option wrong[] = {
        CLI_OPT("--count", CLI_INT, F(count), "0", "N", "how many", .min = 1, .max = 9)};
    const cli_program p = {"t", sizeof(opts), wrong, 1, NULL, NULL, NULL};
    opts o;
    cr_assert_eq(parse(&p, &o, NULL), -1);
    fflush(stderr);
    cr_assert_stderr_eq_str("t: the default of --count, '0', is not a value it takes\n");
}

Test(options, usage_shows_the_defaults) {
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    cli_usage(&program, f);
    fclose(f);
    cr_assert(strncmp(text, "usage: t\nthings\n", 16) == 0, "%s", text);
    cr_assert_not_null(strstr(text, "\n  --devices SPEC      devices (default cpu:2)\n"), "%s",
                       text);
    cr_assert_not_null(strstr(text, "\n  --file FILE         a file\n"), "%s", text);
    cr_assert_not_null(strstr(text, "\n  --count N           how many (default 32)\n"), "%s", text);
    cr_assert_not_null(strstr(text, "\n  --flag              a flag\n"), "%s", text);
    cr_assert_not_null(strstr(text, "(default cosine)"), "%s", text);
    cr_assert_not_null(strstr(text, "(default \\n)"), "%s", text);
    cr_assert_not_null(strstr(text, "\n  --help              this text\nthe end\n"), "%s", text);
    /* --text's help wraps onto a line indented to the help column. */
    cr_assert_not_null(
        strstr(text, "\n                      which is 94 columns wide (default \\n)\n"), "%s",
        text);
    for (char *line = text; *line;) {
        size_t n = strcspn(line, "\n");
        cr_assert_leq(n, 94, "a usage line of %zu columns: %.*s", n, (int)n, line);
        line += n + (line[n] == '\n');
    }
    free(text);
}

Test(options, identity_and_the_compared_text) {
    opts o;
    cr_assert_eq(parse(&program, &o, "--count", "7", "--file", "x", "--pick", "constant", NULL), 0);
    cli_identity id = {0};
    cli_options_identity(&program, &o, &id);
    cr_assert_str_eq(id.text, "count 7\nrate 0.002\nflag no\npick constant\n");
    char text[1024] = "first line\n";
    cli_options_text(&program, &o, text, sizeof text);
    char want[1024];
    snprintf(want, sizeof want,
             "first line\n--file given\n--count 7\n--rows 8192\n--seed 1\n--rate 0.002\n"
             "--eps 1e-08\n--flag no\n--pick constant\n--threads auto\n--mode tiny\n"
             "--text hash %016llx\n",
             (unsigned long long)cli_hash(0, "\n", 1));
    cr_assert_str_eq(text, want);
}

Test(options, exact_numbers) {
    char buf[32];
    cr_assert_str_eq(cli_exact(0.002, buf, sizeof buf), "0.002");
    cr_assert_str_eq(cli_exact(0.1 + 0.2, buf, sizeof buf), "0.30000000000000004");
    cr_assert_str_eq(cli_exact(1e-8, buf, sizeof buf), "1e-08");
}
