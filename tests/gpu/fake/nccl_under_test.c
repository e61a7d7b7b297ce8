/* The in-process NCCL reducer (collectives/nccl/reducer_nccl.c) against the fakes of
 * tests/gpu/fake/include/, its host communicator the real shared-memory reducer; the NCCL calls
 * it shares with NCCL over MPI come from nccl_mpi_under_test.c. */
#include "collectives/nccl/reducer_nccl.c"
