/* Command-line helpers shared by the examples and the bench. */
#ifndef MW_EXAMPLES_CLI_H
#define MW_EXAMPLES_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "meshwit.h"

/* "--name value" or "--name=value" at argv[*i]: the value (advancing *i past a separate value),
 * or NULL when argv[*i] is not --name; *missing is set when --name has no value. */
const char *cli_option_value(int argc, char **argv, int *i, const char *name, int *missing);

/* Number parsers for option values: 0 and *out set when all of s is a number in [min, max]
 * (decimal, a leading zero included; cli_parse_u64 also takes 0x hex and rejects a sign), -1
 * otherwise. Leading white space is refused: " -5" is as wrong as "-5" for an unsigned option. */
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

/* Opens `path` for reading when it is a regular file, without blocking on the way (a FIFO
 * without a writer would block in fopen); its size to *size when not NULL. NULL with a message in
 * err naming the path and what it is ("it is a directory, not a regular file") otherwise. */
FILE *cli_open_regular(const char *path, int64_t *size, char *err, size_t errsize);

/* A file named on the command line: the flag that named it ("--save") and its path (NULL: not
 * given). */
typedef struct cli_file {
    const char *flag, *path;
} cli_file;

/* Whether a and b name the same file (the same device and inode when both exist, else the same
 * string). */
int cli_same_file(const char *a, const char *b);

/* Checks, before any work is done, that the output *out can be written when the work is done:
 * it is none of the n inputs, it is absent or a regular file (a FIFO or device would be replaced
 * by a regular file), its folder exists and takes a new file (the write goes to a temporary
 * file there, then is renamed), and, when bytes > 0, the file system has that much free space.
 * 0, or -1 with a message on stderr prefixed by program naming the flag and the path. */
int cli_check_output(const char *program, const cli_file *out, const cli_file *inputs, int n,
                     int64_t bytes);

/* SIGINT and SIGTERM request a stop at the next step boundary (mw_request_stop); a second one
 * ends the process at once with 128 + the signal. Returns 0, or -1 when sigaction fails. */
int cli_catch_stop_signals(void);
/* The first stop signal caught (0: none), and the exit status for it: 130 for SIGINT, 143 for
 * SIGTERM (130 when the stop came from another process). */
int cli_stop_signal(void);
int cli_stop_status(void);

/* FNV-1a of n bytes continuing from h (0 starts a new hash). */
uint64_t cli_hash(uint64_t h, const void *data, size_t n);

#endif
