/* Command-line helpers shared by the examples and the bench. */
#ifndef MW_EXAMPLES_CLI_H
#define MW_EXAMPLES_CLI_H

#include <stdint.h>

/* "--name value" or "--name=value" at argv[*i]: the value (advancing *i past a separate value),
 * or NULL when argv[*i] is not --name; *missing is set when --name has no value. */
const char *cli_option_value(int argc, char **argv, int *i, const char *name, int *missing);

/* Number parsers for option values: 0 and *out set when all of s is a number in [min, max]
 * (decimal; cli_parse_u64 also takes 0x hex and rejects a sign), -1 otherwise. */
int cli_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out);
int cli_parse_int(const char *s, long min, long max, int *out);
int cli_parse_u64(const char *s, uint64_t *out);
/* Finite and within [min, max]. */
int cli_parse_double(const char *s, double min, double max, double *out);

/* After trying every option on argv[*i]: reports an unknown argument (when no option matched and
 * nothing is missing), a missing value, or a bad value v, prefixed with the program's name.
 * Returns 0 when there is nothing to report, -1 otherwise. */
int cli_report(const char *program, const char *arg, const char *v, int matched, int missing,
               int bad);

#endif
