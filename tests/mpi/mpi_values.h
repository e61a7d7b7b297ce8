/* The inputs of the collective tests under mpirun (mpi_allreduce.c, mpi_collectives.c): values
 * spanning 2^-10 .. 2^10 with both signs, so that another order of additions changes the bits of
 * many elements. */
#ifndef MPI_VALUES_H
#define MPI_VALUES_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

static inline float value(int rank, size_t i, int salt) {
    uint64_t h = (uint64_t)i * 0x9E3779B97F4A7C15ull ^
                 (uint64_t)(rank + 1) * 0xC2B2AE3D27D4EB4Full ^
                 (uint64_t)salt * 0x165667B19E3779F9ull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return ldexpf((float)((int)(h % 2001) - 1000) / 1000.0f, (int)((h >> 16) % 21) - 10);
}

static inline void fill(float *buf, size_t n, int rank, int salt) {
    for (size_t i = 0; i < n; i++) buf[i] = value(rank, i, salt);
}

#endif
