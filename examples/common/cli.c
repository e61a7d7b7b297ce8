/* Command-line helpers shared by the examples and the bench. */
#include "cli.h"

#include <stdio.h>
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
