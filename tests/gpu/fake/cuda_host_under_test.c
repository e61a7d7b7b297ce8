/* The CUDA backend's host-side decisions (devices/cuda/cuda_host.c, free of CUDA calls), compiled
 * here as they are compiled into libmeshwit-cuda.so: the fakes' services use its
 * mw__find_shared_gpu instead of a copy. */
#include "devices/cuda/cuda_host.c"
