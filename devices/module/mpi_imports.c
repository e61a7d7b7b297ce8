/* Inside libmeshwit-cuda.so built with MPI only: what NCCL over MPI (parallel/mpi/nccl_mpi.c)
 * takes from libmeshwit-mpi.so, through the core, so that both modules share one MPI lock and
 * one reducer between processes. nccl_mpi.c is compiled with mw__reducer_mpi_hier defined as
 * (*mw__mpi_hier()) (CMakeLists.txt). Both are called only on a mesh spanning processes, which
 * the MPI module made. */
#include "devices/module/imports.h"
#include "parallel/mpi/mpi_impl.h"
#include "parallel/reducer.h"

const mw__reducer_vtable *mw__mpi_hier(void) { return mw__core->dist()->reducer_hier; }

void mw__mpi_lock(void) { mw__core->dist()->lock(); }

void mw__mpi_unlock(void) { mw__core->dist()->unlock(); }
