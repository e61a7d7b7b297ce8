/* Internal: what the MPI parts of meshwit share (builds with MESHWIT_HAVE_MPI only). */
#ifndef MW__MPI_IMPL_H
#define MW__MPI_IMPL_H

#include <mpi.h>

/* MPI calls made from worker threads go through these: a no-op when MPI gave
 * MPI_THREAD_MULTIPLE, a process-wide mutex otherwise (MPI_THREAD_SERIALIZED). */
void mw__mpi_lock(void);
void mw__mpi_unlock(void);

/* Non-zero while MPI is initialised and not finalised. */
int mw__mpi_active(void);

#endif
