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

/* Messages between processes, for the pipeline's boundaries (parallel/pipeline_link.c): a
 * communicator of their own (made and freed by every process together), messages of bytes
 * matched in order per (source, tag). Sends are started and completed later; a receive waits
 * for its whole message (of exactly n bytes: another size is MW_ERR_STATE) until stop(ctx) is
 * non-zero or a message under abort_tag (>= 0) is queued from any process (MW_ERR_ABORTED, that
 * message left queued), or timeout_ms passed (MW_ERR_TIMEOUT; 0: the default). Without MPI:
 * MW_ERR_STATE. */
typedef struct mw__dist_link mw__dist_link;
typedef struct mw__dist_send mw__dist_send;
mw_status mw__dist_link_new(mw__dist_link **out);
void mw__dist_link_free(mw__dist_link *l);
mw_status mw__dist_link_isend(mw__dist_link *l, int dest, int tag, const void *buf, size_t n,
                              mw__dist_send **out);
/* Completes the n sends (each then freed and set NULL; NULL ones skipped): MW_ERR_TIMEOUT when
 * one is not received within timeout_ms (all of them are then abandoned to MPI). */
mw_status mw__dist_link_wait(mw__dist_link *l, mw__dist_send **sends, int n, int timeout_ms,
                             const char *what);
mw_status mw__dist_link_recv(mw__dist_link *l, int src, int tag, void *buf, size_t n, int abort_tag,
                             int (*stop)(void *ctx), void *ctx, int timeout_ms, const char *what);

#endif
