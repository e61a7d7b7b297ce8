/* Shared by the fuzz harnesses: the input is written to a per-process file, since every loader
 * under test reads from a path, as a user's program does. A harness whose set-up fails aborts
 * (libFuzzer reports it as a crash) rather than fuzz a NULL trainer and test nothing. */
#ifndef MW_FUZZ_COMMON_H
#define MW_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "meshwit.h"

/* Stops the run: `what` failed with status st while setting up the harness. */
static inline void fuzz_setup_failed(const char *what, mw_status st) {
    fprintf(stderr, "fuzz: set-up failed: %s: %s: %s\n", what, mw_status_name(st), mw_last_error());
    abort();
}

static inline const char *fuzz_file(const uint8_t *data, size_t size) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/meshwit_fuzz_%d", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror(path);
        abort(); /* every input would test nothing */
    }
    return path;
}

#endif
