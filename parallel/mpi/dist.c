/* The MPI world: initialisation, rank and size, aborting the job, and the one collective the mesh
 * needs. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "meshwit.h"
#include "parallel/mesh_impl.h"
#include "parallel/mpi/mpi_impl.h"

static int initialised_here;
static int thread_level = MPI_THREAD_SINGLE;
static pthread_mutex_t mpi_mu = PTHREAD_MUTEX_INITIALIZER;

int mw__mpi_active(void) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

/* MPI may have been initialised by the program itself: ask for its thread level once. */
static int serialize(void) {
    if (thread_level == MPI_THREAD_SINGLE && mw__mpi_active()) MPI_Query_thread(&thread_level);
    return thread_level < MPI_THREAD_MULTIPLE;
}

void mw__mpi_lock(void) {
    if (serialize()) pthread_mutex_lock(&mpi_mu);
}

void mw__mpi_unlock(void) {
    if (serialize()) pthread_mutex_unlock(&mpi_mu);
}

static int launched_by_mpi(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

mw_status mw_distributed_init(int *argc, char ***argv) {
    if (mw__mpi_active() || !launched_by_mpi()) return MW_OK;
    int provided = MPI_THREAD_SINGLE;
    int rc = argc && argv ? MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided)
                          : MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS)
        return mw__error(MW_ERR_DEVICE, "mw_distributed_init: MPI_Init_thread failed (%d)", rc);
    initialised_here = 1;
    thread_level = provided;
    if (provided < MPI_THREAD_SERIALIZED) {
        /* Worker threads call MPI (one at a time); a library that cannot allow it is unusable. */
        MPI_Finalize();
        initialised_here = 0;
        return mw__error(MW_ERR_DEVICE,
                         "mw_distributed_init: this MPI gives thread level %d; meshwit needs at "
                         "least MPI_THREAD_SERIALIZED",
                         provided);
    }
    return MW_OK;
}

void mw_distributed_finalize(void) {
    if (initialised_here && mw__mpi_active()) MPI_Finalize();
    initialised_here = 0;
}

int mw_distributed_rank(void) { return mw__dist_rank(); }

int mw_distributed_size(void) { return mw__dist_size(); }

int mw_distributed_available(void) { return 1; }

void mw_distributed_abort(int code) {
    if (mw__mpi_active()) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

int mw__dist_size(void) {
    int n = 1;
    if (mw__mpi_active()) MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

int mw__dist_rank(void) {
    int r = 0;
    if (mw__mpi_active()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

mw_status mw__dist_allgather_ints(const int *mine, int n, int *out) {
    if (!mw__mpi_active()) {
        memcpy(out, mine, (size_t)n * sizeof *out);
        return MW_OK;
    }
    mw__mpi_lock();
    int rc = MPI_Allgather(mine, n, MPI_INT, out, n, MPI_INT, MPI_COMM_WORLD);
    mw__mpi_unlock();
    if (rc != MPI_SUCCESS)
        return mw__error(MW_ERR_DEVICE, "MPI_Allgather among the processes failed (%d)", rc);
    return MW_OK;
}
