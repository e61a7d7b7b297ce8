/* NCCL over MPI (collectives/mpi/nccl_mpi.c) and the NCCL calls it shares with the in-process
 * reducer (collectives/nccl/collectives.c), compiled against the fakes of
 * tests/gpu/fake/include/ as they are compiled into libmeshwit-nccl-mpi.so against the real
 * headers. */
#define MESHWIT_HAVE_NCCL 1
#define MESHWIT_HAVE_MPI 1

#include "collectives/mpi/nccl_mpi.c"
#include "collectives/nccl/collectives.c"
