/* What the reducer's stress programs (stress_reducer.c, stress_p2p.c) share: their random naps,
 * their command line and the loop over rank counts. */
#ifndef MW_TESTS_STRESS_STRESS_H
#define MW_TESTS_STRESS_STRESS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tests/common/rng.h"

/* Sleeps for a random time under most_ns nanoseconds (below a second), drawn from *rng. */
static inline void stress_nap(uint64_t *rng, long most_ns) {
    struct timespec t = {0, (long)(rng_xorshift64(rng) % (uint64_t)most_ns)};
    nanosleep(&t, NULL);
}

/* Runs run(p, rounds, seed + p) for p = 2 .. max_ranks, rounds and seed from the command line
 * ("name [rounds >= 1] [seed != 0]", else the defaults given). Returns main's status: 0 when
 * every run returned 0, 1 when one failed, 2 on a bad command line. */
static inline int stress_main(int argc, char **argv, const char *name, int max_ranks,
                              int default_rounds, uint64_t default_seed,
                              int (*run)(int p, int nrounds, uint64_t seed)) {
    int nrounds = argc > 1 ? atoi(argv[1]) : default_rounds;
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 10) : default_seed;
    if (nrounds < 1 || seed == 0) {
        fprintf(stderr, "usage: %s [rounds >= 1] [seed != 0]\n", name);
        return 2;
    }
    int bad = 0;
    for (int p = 2; p <= max_ranks; p++) bad |= run(p, nrounds, seed + (uint64_t)p);
    if (bad) fprintf(stderr, "%s: FAILED\n", name);
    return bad;
}

#endif
