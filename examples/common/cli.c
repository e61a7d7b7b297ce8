/* Command-line helpers shared by the examples and the bench. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *cli_option_value(int argc, char **argv, int *i, const char *name, int *missing) {
    size_t n = strlen(name);
    const char *arg = argv[*i];
    if (strncmp(arg, name, n) != 0) return NULL;
    if (arg[n] == '=') return arg + n + 1;
    if (arg[n] != '\0') return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

int cli_report(const char *program, const char *arg, const char *v, int matched, int missing,
               int bad) {
    if (missing)
        fprintf(stderr, "%s: %s needs a value (see --help)\n", program, arg);
    else if (!matched)
        fprintf(stderr, "%s: unknown argument '%s' (see --help)\n", program, arg);
    else if (bad)
        fprintf(stderr, "%s: bad value '%s' for %.*s (see --help)\n", program, v,
                (int)strcspn(arg, "="), arg);
    else
        return 0;
    return -1;
}

int cli_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max) return -1;
    *out = v;
    return 0;
}

int cli_parse_int(const char *s, long min, long max, int *out) {
    int64_t v;
    if (cli_parse_i64(s, min, max, &v)) return -1;
    *out = (int)v;
    return 0;
}

int cli_parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    if (*s == '-') return -1;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

int cli_parse_double(const char *s, double min, double max, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < min || v > max) return -1;
    *out = v;
    return 0;
}
