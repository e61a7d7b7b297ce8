/* Messages between the processes of a pipeline (collectives/dist.h, mw__dist_link): a duplicate of
 * the world's communicator, sends started and completed later (a stage sends its boundary value
 * and goes on computing), receives that wait for their message by probing, so that a wait can
 * end early: on the caller's stop condition (a stage of this process failed), on a message under
 * the abort tag from any process (one of theirs did; left queued for the drain) or at the
 * deadline. Probing before receiving posts no receive that would have to be cancelled. */
#include <limits.h>
#include <stdio.h>

#include "collectives/dist.h"
#include "collectives/mpi/mpi_impl.h"
#include "core/alloc.h"
#include "core/error.h"
#include "meshwit.h"

struct mw__dist_link {
    MPI_Comm comm;
};

struct mw__dist_send {
    MPI_Request req;
};

mw_status mw__dist_link_new(mw__dist_link **out) {
    *out = NULL;
    if (!mw__mpi_active())
        return mw__error(MW_ERR_STATE, "a link between processes needs MPI (mw_distributed_init)");
    mw__dist_link *l = mw__calloc(1, sizeof *l);
    if (!l) return mw__error(MW_ERR_NOMEM, "out of memory making a link between processes");
    mw__mpi_lock();
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &l->comm);
    mw__mpi_unlock();
    if (rc != MPI_SUCCESS) {
        mw__free(l);
        return mw__error(MW_ERR_DEVICE, "MPI_Comm_dup failed (%d)", rc);
    }
    *out = l;
    return MW_OK;
}

void mw__dist_link_free(mw__dist_link *l) {
    if (!l) return;
    if (mw__mpi_active()) {
        mw__mpi_lock();
        MPI_Comm_free(&l->comm);
        mw__mpi_unlock();
    }
    mw__free(l);
}

mw_status mw__dist_link_isend(mw__dist_link *l, int dest, int tag, const void *buf, size_t n,
                              mw__dist_send **out) {
    *out = NULL;
    if (n > (size_t)INT_MAX)
        return mw__error(MW_ERR_UNSUPPORTED,
                         "a message of %zu bytes between processes; at most %d in one", n, INT_MAX);
    mw__dist_send *s = mw__calloc(1, sizeof *s);
    if (!s) return mw__error(MW_ERR_NOMEM, "out of memory sending to process %d", dest);
    mw__mpi_lock();
    int rc = MPI_Isend(buf, (int)n, MPI_BYTE, dest, tag, l->comm, &s->req);
    mw__mpi_unlock();
    if (rc != MPI_SUCCESS) {
        mw__free(s);
        return mw__error(MW_ERR_DEVICE, "MPI_Isend to process %d failed (%d)", dest, rc);
    }
    *out = s;
    return MW_OK;
}

mw_status mw__dist_link_wait(mw__dist_link *l, mw__dist_send **sends, int n, int timeout_ms,
                             const char *what) {
    (void)l;
    int limit = timeout_ms > 0 ? timeout_ms : MW_DISTRIBUTED_DEFAULT_TIMEOUT_MS;
    double start = mw__mpi_now_ms();
    mw_status st = MW_OK;
    for (int i = 0; i < n; i++) {
        while (sends[i] && st == MW_OK) {
            int done = 0;
            mw__mpi_lock();
            int rc = MPI_Test(&sends[i]->req, &done, MPI_STATUS_IGNORE);
            mw__mpi_unlock();
            if (rc != MPI_SUCCESS)
                st = mw__error(MW_ERR_DEVICE, "%s: MPI_Test failed (%d)", what, rc);
            else if (done) {
                mw__free(sends[i]);
                sends[i] = NULL;
            } else if (mw__mpi_now_ms() - start > limit) {
                st = mw__error(MW_ERR_TIMEOUT,
                               "%s: a message was not received within %d ms (the process "
                               "receiving it failed or stalls)",
                               what, limit);
            } else {
                mw__mpi_backoff(mw__mpi_now_ms() - start, 0);
            }
        }
    }
    if (st) /* abandoned: the requests are left to MPI (never freed while it may write them) */
        for (int i = 0; i < n; i++) sends[i] = NULL;
    return st;
}

mw_status mw__dist_link_recv(mw__dist_link *l, int src, int tag, void *buf, size_t n, int abort_tag,
                             int (*stop)(void *ctx), void *ctx, int timeout_ms, const char *what) {
    int limit = timeout_ms > 0 ? timeout_ms : MW_DISTRIBUTED_DEFAULT_TIMEOUT_MS;
    double start = mw__mpi_now_ms();
    for (;;) {
        int there = 0, aborted = 0;
        MPI_Status status;
        mw__mpi_lock();
        int rc = MPI_Iprobe(src, tag, l->comm, &there, &status);
        if (rc == MPI_SUCCESS && !there && abort_tag >= 0)
            rc = MPI_Iprobe(MPI_ANY_SOURCE, abort_tag, l->comm, &aborted, MPI_STATUS_IGNORE);
        mw__mpi_unlock();
        if (rc != MPI_SUCCESS)
            return mw__error(MW_ERR_DEVICE, "%s: MPI_Iprobe failed (%d)", what, rc);
        if (there) {
            int count = 0;
            MPI_Get_count(&status, MPI_BYTE, &count);
            if ((size_t)count != n)
                return mw__error(MW_ERR_STATE,
                                 "%s: process %d sent %d bytes where %zu were expected (the "
                                 "processes run different models or layouts)",
                                 what, src, count, n);
            mw__mpi_lock();
            rc = MPI_Recv(buf, (int)n, MPI_BYTE, src, tag, l->comm, MPI_STATUS_IGNORE);
            mw__mpi_unlock();
            if (rc != MPI_SUCCESS)
                return mw__error(MW_ERR_DEVICE, "%s: MPI_Recv from process %d failed (%d)", what,
                                 src, rc);
            return MW_OK;
        }
        if (aborted || (stop && stop(ctx)))
            return mw__error(MW_ERR_ABORTED, "%s: given up, %s", what,
                             aborted ? "another process failed" : "this process failed");
        double waited = mw__mpi_now_ms() - start;
        if (waited > limit)
            return mw__error(MW_ERR_TIMEOUT,
                             "%s: nothing came from process %d within %d ms (it failed or stalls)",
                             what, src, limit);
        mw__mpi_backoff(waited, 0);
    }
}
