/* The MPI world as the core sees it: every call goes to libmeshwit-mpi.so when the process was
 * started by an MPI launcher (the module is loaded then, devices/module.c), and describes a world
 * of one process otherwise, so a program that never runs under mpirun never loads MPI. */
#include <stdlib.h>
#include <string.h>

#include "collectives/dist.h"
#include "core/error.h"
#include "devices/module.h"
#include "meshwit.h"

/* What the launcher says of this process: the job's size and this rank from Open MPI's or the
 * PMI environment; -1 where it says nothing. */
static void launcher_view(int *size, int *rank, const char **from) {
    static const char *const vars[][2] = {{"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"},
                                          {"PMI_SIZE", "PMI_RANK"}};
    *size = *rank = -1;
    *from = NULL;
    for (size_t i = 0; i < sizeof vars / sizeof *vars && *size < 0; i++) {
        const char *s = getenv(vars[i][0]), *r = getenv(vars[i][1]);
        char *end;
        long v = s ? strtol(s, &end, 10) : -1;
        if (!s || *end || v < 1) continue;
        *size = (int)v;
        *from = vars[i][0];
        v = r ? strtol(r, &end, 10) : -1;
        *rank = r && !*end && v >= 0 ? (int)v : -1;
    }
}

mw_status mw_distributed_init(int *argc, char ***argv) {
    const mw__dist_api *d = mw__dist();
    /* Under a launcher the module must load: without it the processes would run alone. */
    mw_status st = d ? d->init(argc, argv) : mw__dist_failure();
    if (st || !d) return st;
    /* The MPI world must be the one the launcher made: a module of another MPI (or none) would
     * leave every process alone as rank 0 of a world of one. */
    int size, rank;
    const char *from;
    launcher_view(&size, &rank, &from);
    if (size > 0 && (d->size() != size || (rank >= 0 && d->rank() != rank)))
        return mw__error(MW_ERR_STATE,
                         "the launcher started %d processes (%s) and calls this one rank %d, but "
                         "MPI reports rank %d of %d: libmeshwit-mpi.so is built for another MPI "
                         "than the one that launched the job",
                         size, from, rank, d->rank(), d->size());
    return MW_OK;
}

void mw_distributed_finalize(void) {
    const mw__dist_api *d = mw__dist();
    if (d) d->finalize();
}

int mw_distributed_rank(void) { return mw__dist_rank(); }

int mw_distributed_size(void) { return mw__dist_size(); }

int mw_distributed_available(void) { return mw__dist_built(); }

void mw_distributed_abort(int code) {
    const mw__dist_api *d = mw__dist();
    if (d) d->abort(code);
    exit(code);
}

int mw__dist_size(void) {
    const mw__dist_api *d = mw__dist();
    return d ? d->size() : 1;
}

int mw__dist_rank(void) {
    const mw__dist_api *d = mw__dist();
    return d ? d->rank() : 0;
}

mw_status mw__dist_allgather_ints(const int *mine, int n, int *out) {
    const mw__dist_api *d = mw__dist();
    if (d) return d->allgather_ints(mine, n, out);
    memcpy(out, mine, (size_t)n * sizeof *out);
    return MW_OK;
}

mw_status mw__dist_allgather_u64(const uint64_t *mine, int n, uint64_t *out, int timeout_ms,
                                 const char *what) {
    const mw__dist_api *d = mw__dist();
    if (d) return d->allgather_u64(mine, n, out, timeout_ms, what);
    memcpy(out, mine, (size_t)n * sizeof *out);
    return MW_OK;
}

mw_status mw__dist_allgatherv_bytes(const char *mine, const int *counts, char *out, int timeout_ms,
                                    const char *what) {
    const mw__dist_api *d = mw__dist();
    if (d) return d->allgatherv_bytes(mine, counts, out, timeout_ms, what);
    memcpy(out, mine, (size_t)counts[0]);
    return MW_OK;
}

mw_status mw__dist_bcast_bytes(void *buf, size_t n, int timeout_ms, const char *what) {
    const mw__dist_api *d = mw__dist();
    return d ? d->bcast_bytes(buf, n, timeout_ms, what) : MW_OK;
}

mw_status mw__dist_max_int(int mine, int *out, int timeout_ms, const char *what) {
    const mw__dist_api *d = mw__dist();
    if (d) return d->max_int(mine, out, timeout_ms, what);
    *out = mine;
    return MW_OK;
}

static mw_status no_link(void) {
    return mw__error(MW_ERR_STATE, "a link between processes needs MPI: this process was not "
                                   "started by an MPI launcher, or its MPI module did not load");
}

mw_status mw__dist_link_new(mw__dist_link **out) {
    const mw__dist_api *d = mw__dist();
    *out = NULL;
    return d ? d->link_new(out) : no_link();
}

void mw__dist_link_free(mw__dist_link *l) {
    const mw__dist_api *d = mw__dist();
    if (d && l) d->link_free(l);
}

mw_status mw__dist_link_isend(mw__dist_link *l, int dest, int tag, const void *buf, size_t n,
                              mw__dist_send **out) {
    const mw__dist_api *d = mw__dist();
    *out = NULL;
    return d ? d->link_isend(l, dest, tag, buf, n, out) : no_link();
}

mw_status mw__dist_link_wait(mw__dist_link *l, mw__dist_send **sends, int n, int timeout_ms,
                             const char *what) {
    const mw__dist_api *d = mw__dist();
    return d ? d->link_wait(l, sends, n, timeout_ms, what) : no_link();
}

mw_status mw__dist_link_recv(mw__dist_link *l, int src, int tag, void *buf, size_t n, int abort_tag,
                             int (*stop)(void *ctx), void *ctx, int timeout_ms, const char *what) {
    const mw__dist_api *d = mw__dist();
    return d ? d->link_recv(l, src, tag, buf, n, abort_tag, stop, ctx, timeout_ms, what)
             : no_link();
}
