/* Shared by the fuzz harnesses: the input is written to a per-process file, since every loader
 * under test reads from a path, as a user's program does. */
#ifndef MW_FUZZ_COMMON_H
#define MW_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

static const char *fuzz_file(const uint8_t *data, size_t size) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/meshwit_fuzz_%d", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return NULL;
    if (size) fwrite(data, 1, size, f);
    fclose(f);
    return path;
}

#endif
