/* Command-line helpers shared by the examples and the bench. */
#ifndef MW_EXAMPLES_CLI_H
#define MW_EXAMPLES_CLI_H

/* "--name value" or "--name=value" at argv[*i]: the value (advancing *i past a separate value),
 * or NULL when argv[*i] is not --name; *missing is set when --name has no value. */
const char *cli_option_value(int argc, char **argv, int *i, const char *name, int *missing);

/* After trying every option on argv[*i]: reports an unknown argument (when no option matched and
 * nothing is missing), a missing value, or a bad value v, prefixed with the program's name.
 * Returns 0 when there is nothing to report, -1 otherwise. */
int cli_report(const char *program, const char *arg, const char *v, int matched, int missing,
               int bad);

#endif
