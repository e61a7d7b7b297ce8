/* Internal: the fingerprint every process of a mesh compares before it builds a program
 * (parallel/agree.c), over the collectives with a deadline between processes (collectives/
 * dist.h). */
#ifndef MW__AGREE_H
#define MW__AGREE_H

#include <stddef.h>

#include "meshwit/status.h"

struct mw_graph;
struct mw_tensor;

/* A growing text of lines; oom is set (and the text kept as it was) when it could not grow. */
typedef struct mw__text {
    char *s;
    size_t len, cap;
    int oom;
} mw__text;

/* Appends one line (a newline is added). */
void mw__text_add(mw__text *t, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Compares the fingerprint of a program of `graph` computing `result` (NULL: none) with the
 * configuration described in `config` (parallel/config.h's text) and the caller's `extra` lines
 * (NULL: none) across every process (MW_OK at once for one process). When they differ, every
 * process fails with MW_ERR_INVALID, "caller: the model or its configuration: the processes
 * disagree: rank 1: <its line>; rank 0: <rank 0's>"; MW_ERR_TIMEOUT when a process does not
 * arrive within timeout_ms (0: the distributed default). */
mw_status mw__program_agree(const char *caller, const struct mw_graph *graph,
                            const struct mw_tensor *result, const char *config,
                            const mw__text *extra, int timeout_ms);

#endif
