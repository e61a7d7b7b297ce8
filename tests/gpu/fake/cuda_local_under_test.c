/* The CUDA-local reducer (collectives/cuda/reducer_local.c) against the fakes of
 * tests/gpu/fake/include/, its shared-memory communicator's barriers counted and held where a
 * test asks (counted_shm, test_cuda_local_host.c). */
#define mw__reducer_shm (*counted_shm())

#include "collectives/cuda/reducer_local.c"
