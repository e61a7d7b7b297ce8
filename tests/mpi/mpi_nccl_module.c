/* Under mpirun with 2 processes, without a GPU: the CUDA backend's reducer for GPUs spanning
 * processes is NCCL over MPI, loaded on demand from libmeshwit-nccl-mpi.so through the core; the
 * CUDA module itself maps no MPI (only this third module and the MPI module do). Exit 0: as
 * expected; 77: this build has no NCCL. */
#include <stdio.h>
#include <string.h>

#include "collectives/reducer_select.h"
#include "meshwit.h"

#ifdef MESHWIT_HAVE_NCCL
/* Whether a mapped file's name contains part. */
static int mapped(const char *part) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    int hit = 0;
    while (f && !hit && fgets(line, sizeof line, f)) hit = strstr(line, part) != NULL;
    if (f) fclose(f);
    return hit;
}
#endif

int main(int argc, char **argv) {
    if (mw_distributed_init(&argc, &argv) != MW_OK) {
        fprintf(stderr, "mw_distributed_init: %s\n", mw_last_error());
        return 2;
    }
    int rc = 0, procs = mw_distributed_size(), ordinals[1] = {0};
#ifndef MESHWIT_HAVE_NCCL
    rc = 77;
#else
    if (procs != 2) {
        fprintf(stderr, "mpi_nccl_module: run under mpirun with 2 processes\n");
        rc = 2;
    } else if (mapped("libmeshwit-nccl-mpi")) {
        fprintf(stderr, "libmeshwit-nccl-mpi.so is loaded before anything asked for it\n");
        rc = 1;
    } else {
        const mw__reducer_vtable *one = mw__reducer_for_procs("cuda", 1, ordinals, 1);
        const mw__reducer_vtable *r = mw__reducer_for_procs("cuda", 1, ordinals, procs);
        if (!one || !r || strcmp(r->name, "nccl-mpi") != 0 || !mapped("libmeshwit-nccl-mpi")) {
            fprintf(stderr, "expected nccl-mpi from libmeshwit-nccl-mpi.so, got %s: %s\n",
                    r ? r->name : "none", mw_last_error());
            rc = 1;
        }
    }
#endif
    (void)ordinals;
    mw_distributed_finalize();
    if (rc == 0) printf("rank %d of %d: nccl-mpi loaded on demand\n", mw_distributed_rank(), procs);
    return rc;
}
