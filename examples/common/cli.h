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

/* SIGINT and SIGTERM request a stop at the next step boundary (mw_request_stop); a second one
 * ends the process at once with 128 + the signal. Returns 0, or -1 when sigaction fails. */
int cli_catch_stop_signals(void);
/* The first stop signal caught (0: none), and the exit status for it: 130 for SIGINT, 143 for
 * SIGTERM (130 when the stop came from another process). */
int cli_stop_signal(void);
int cli_stop_status(void);

/* FNV-1a of n bytes continuing from h (0 starts a new hash). */
uint64_t cli_hash(uint64_t h, const void *data, size_t n);

/* Under Open MPI's mpirun, the seconds each process has between the SIGTERM that mpirun sends
 * it when mpirun itself gets SIGINT or SIGTERM (after a SIGCONT and this delay) and the SIGKILL
 * that follows after the same delay: the MCA parameter odls_base_sigkill_timeout (default 1),
 * which mpirun passes to the processes in their environment. -1 when not under Open MPI. */
double cli_mpirun_grace(void);

/* A run's identity: one line "name value" per setting that changes what a training run
 * computes (sizes, data, batch, learning rate, ...), kept in a checkpoint so that a resume can
 * say what differs. Filled by cli_identity_add ("lr", "%.17g", lr). */
typedef struct cli_identity {
    char text[3072];
    size_t len;
} cli_identity;

/* Appends the line "name value". A line that does not fit is a bug of the program (its settings
 * are a fixed list of short values): it aborts, saying so, rather than leave a setting out of
 * every comparison. */
void cli_identity_add(cli_identity *id, const char *name, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* The names of identity text, ", "-separated, into out ("layers, heads, ..."). */
void cli_identity_names(const char *text, char *out, size_t size);

/* Every name of the comma-separated list must be a setting of identity text: 0, or -1 with the
 * first that is not into bad. */
int cli_identity_check_names(const char *text, const char *list, char *bad, size_t size);

/* Compares the identity saved in a checkpoint with the current one: the number of settings that
 * differ (a setting the saved one lacks differs) and are not in the comma-separated list
 * allowed, and a report of them ("  lr: 0.002 in the checkpoint, 0.001 now", one per line). */
int cli_identity_compare(const char *saved, const char *current, const char *allowed, char *report,
                         size_t size);

#endif
