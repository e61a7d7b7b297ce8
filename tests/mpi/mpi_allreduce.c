/* Run under mpirun: the all-reduce between processes (one rank per process) must give, on every
 * process, bitwise the float sum in rank order (rank 0 + rank 1 + ...) computed here
 * independently, for sizes on both sides of the one-round small path (8 KiB) and blocks that
 * do not divide evenly, started all at once and completed together (the trainer's overlap), one
 * at a time (allreduce_sum), and more at once than the exchange keeps in flight.
 *
 *   mpi_allreduce          e.g. under `mpirun -np 3`
 *
 * The values span 2^-10 .. 2^10 with both signs, so another order of additions changes the
 * bits of many elements (with 3 or more processes; 2 processes commute). Exit 0 when every
 * element matches, 1 when one does not, 2 on an error. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/reducer.h"
#include "devices/module.h"
#include "meshwit.h"
#include "mpi_values.h"

#define MAX_PROCS 16
#define MANY 70 /* more than the exchange keeps in flight (MW__MPI_MAX_INFLIGHT) */

static const size_t sizes[] = {0, 1, 2, 7, 2048, 2049, 65537, (1u << 20) + 3};
#define NSIZES (sizeof sizes / sizeof *sizes)

/* Elements of buf that differ from the rank-order sum. */
static size_t check(const float *buf, size_t n, int procs, int salt) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float s = value(0, i, salt);
        for (int r = 1; r < procs; r++) s += value(r, i, salt);
        if (memcmp(&s, &buf[i], sizeof s) != 0) bad++;
    }
    return bad;
}

int main(int argc, char **argv) {
    if (mw_distributed_init(&argc, &argv) != MW_OK) return 2;
    int procs = mw_distributed_size(), me = mw_distributed_rank(), rc = 0;
    if (procs < 2 || procs > MAX_PROCS) {
        fprintf(stderr, "mpi_allreduce: run under mpirun with 2..%d processes\n", MAX_PROCS);
        return 2;
    }
    const mw__reducer_vtable *R = mw__dist()->reducer_hier; /* libmeshwit-mpi.so's */
    int proc_of[MAX_PROCS];
    for (int r = 0; r < procs; r++) proc_of[r] = r;
    mw__comm_options opt = {.timeout_ms = 30000, .proc_of = proc_of, .self_proc = me};
    mw__comm *comm = NULL;
    float *bufs[NSIZES > MANY ? NSIZES : MANY] = {0};
    mw_status st = R->comm_new(procs, NULL, &opt, &comm);
    for (size_t k = 0; k < NSIZES && st == MW_OK; k++)
        if (!(bufs[k] = malloc((sizes[k] ? sizes[k] : 1) * sizeof(float)))) st = MW_ERR_NOMEM;

    /* All sizes in flight at once, progressed, then finished together; twice, so the second
     * round runs on the scratch the first one left. */
    for (int round = 0; round < 2 && st == MW_OK; round++) {
        for (size_t k = 0; k < NSIZES; k++) fill(bufs[k], sizes[k], me, (int)k + 100 * round);
        for (size_t k = 0; k < NSIZES && st == MW_OK; k++) {
            st = R->allreduce_start(comm, me, bufs[k], sizes[k], MW_F32);
            if (st == MW_OK) st = R->progress(comm, me);
        }
        if (st == MW_OK) st = R->finish(comm, me);
        for (size_t k = 0; k < NSIZES && st == MW_OK; k++) {
            size_t bad = check(bufs[k], sizes[k], procs, (int)k + 100 * round);
            printf("[rank %d] overlapped, round %d, %zu floats: %zu elements differ\n", me, round,
                   sizes[k], bad);
            if (bad) rc = 1;
        }
    }
    /* One at a time. */
    for (size_t k = 0; k < NSIZES && st == MW_OK; k++) {
        fill(bufs[k], sizes[k], me, (int)k + 1000);
        st = R->allreduce_sum(comm, me, bufs[k], sizes[k], MW_F32);
        size_t bad = st == MW_OK ? check(bufs[k], sizes[k], procs, (int)k + 1000) : 0;
        if (bad) {
            printf("[rank %d] blocking, %zu floats: %zu elements differ\n", me, sizes[k], bad);
            rc = 1;
        }
    }
    for (size_t k = 0; k < NSIZES; k++) free(bufs[k]);
    /* More small ones in flight than the exchange holds: it completes the oldest first. */
    float many[MANY][3];
    for (int j = 0; j < MANY; j++) fill(many[j], 3, me, 5000 + j);
    for (int j = 0; j < MANY && st == MW_OK; j++)
        st = R->allreduce_start(comm, me, many[j], 3, MW_F32);
    if (st == MW_OK) st = R->finish(comm, me);
    for (int j = 0; j < MANY && st == MW_OK; j++)
        if (check(many[j], 3, procs, 5000 + j)) {
            printf("[rank %d] %d in flight: all-reduce %d differs\n", me, MANY, j);
            rc = 1;
        }
    if (st != MW_OK) {
        fprintf(stderr, "[rank %d] %s [%s]: %s\n", me, mw_strerror(st), mw_status_name(st),
                mw_last_error());
        mw_distributed_abort(2);
    }
    R->comm_free(comm);
    if (me == 0) printf("%d processes: %s\n", procs, rc ? "MISMATCH" : "every element bitwise");
    mw_distributed_finalize();
    return rc;
}
