/* Internal: the MPI world, as the rest of meshwit calls it. libmeshwit defines these over the MPI
 * module's table (collectives/distributed.c): a world of one process unless the process was
 * started by an MPI launcher; libmeshwit-mpi.so defines them over MPI itself
 * (collectives/mpi/dist.c). */
#ifndef MW__DIST_H
#define MW__DIST_H

#include <stddef.h>
#include <stdint.h>

#include "meshwit/status.h"

int mw__dist_size(void);
int mw__dist_rank(void);
/* All-gathers n ints from every process into out[proc * n + i] (collective over the world). */
mw_status mw__dist_allgather_ints(const int *mine, int n, int *out);

/* Collectives with a deadline among the processes, for the checks between them
 * (parallel/consistency.c); `what` names the check in messages. */
mw_status mw__dist_allgather_u64(const uint64_t *mine, int n, uint64_t *out, int timeout_ms,
                                 const char *what);
mw_status mw__dist_allgatherv_bytes(const char *mine, const int *counts, char *out, int timeout_ms,
                                    const char *what);
mw_status mw__dist_bcast_bytes(void *buf, size_t n, int timeout_ms, const char *what);
mw_status mw__dist_max_int(int mine, int *out, int timeout_ms, const char *what);

#endif
