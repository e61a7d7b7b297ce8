/* The tests' pseudo-random numbers: three generators and the few ways the suites turn their bits
 * into values, so that every suite draws the same streams from the same code. Header-only and
 * free of Criterion (the stress and MPI programs include it too).
 *
 *   rng_splitmix64  SplitMix64 (Steele, Lea and Flood 2014): a counter through a 64-bit mixer;
 *                   every seed, 0 included, gives a good stream.
 *   rng_lcg64       the 64-bit linear congruential step of PCG and Knuth's MMIX
 *                   (6364136223846793005, 1442695040888963407); use its high bits only, the low
 *                   ones have short periods.
 *   rng_lcg32       the 32-bit one of Numerical Recipes (1664525, 1013904223), for the streams
 *                   written against it (token streams of the GPT-2 fixture, test_zero1.c's
 *                   batches); high bits only, likewise.
 *   rng_xorshift64  Marsaglia's xorshift (2003, shifts 13, 7, 17), for the stress programs'
 *                   plans and delays; its state must not be 0.
 *
 * A seed fixes a test's inputs; changing a generator or a mapping changes every test's inputs,
 * so the mappings below are the ones the suites were written against, bit for bit. */
#ifndef MW_TESTS_COMMON_RNG_H
#define MW_TESTS_COMMON_RNG_H

#include <stdint.h>

/* The next output of the SplitMix64 stream whose state is *state. */
static inline uint64_t rng_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The next state (and output) of the 64-bit linear congruential generator. */
static inline uint64_t rng_lcg64(uint64_t *state) {
    return *state = *state * 6364136223846793005ull + 1442695040888963407ull;
}

/* The next state (and output) of the 32-bit linear congruential generator. */
static inline uint32_t rng_lcg32(uint32_t *state) {
    return *state = *state * 1664525u + 1013904223u;
}

/* The next state (and output) of the xorshift generator; *state != 0. */
static inline uint64_t rng_xorshift64(uint64_t *state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

/* The top 53 bits of x as a double in [0, 1): every value a multiple of 2^-53, exactly. */
static inline double rng_unit53(uint64_t x) { return (double)(x >> 11) * 0x1p-53; }

/* The top 24 bits of x as a value in [0, 1) that a float holds exactly. */
static inline double rng_unit24(uint64_t x) { return (double)(x >> 40) * 0x1p-24; }

/* lo + (hi - lo) u for u = rng_unit53(x): one rounding, in [lo, hi). */
static inline double rng_range(uint64_t x, double lo, double hi) {
    return lo + (hi - lo) * rng_unit53(x);
}

/* Uniform in [-1, 1) from the SplitMix64 stream *state. */
static inline double rng_uniform(uint64_t *state) {
    return rng_range(rng_splitmix64(state), -1, 1);
}

/* n floats uniform in [-1, 1) with 24 random bits each: the next n values of the linear
 * congruential stream *state. */
static inline void rng_fill_stream(uint64_t *state, float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(rng_unit24(rng_lcg64(state)) * 2.0 - 1.0);
}

/* The same from a stream started at seed. */
static inline void rng_fill(float *x, int64_t n, uint64_t seed) { rng_fill_stream(&seed, x, n); }

/* A value in [0, n) from the high bits of the linear congruential stream *state (token ids). */
static inline int32_t rng_below(uint64_t *state, int64_t n) {
    return (int32_t)((rng_lcg64(state) >> 33) % (uint64_t)n);
}

#endif
