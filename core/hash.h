/* Internal: FNV-1a, 64-bit: the hash of fingerprints, replica checksums and file checksums (fast,
 * byte-order independent, no table; not a defence against anyone choosing the bytes). */
#ifndef MW__HASH_H
#define MW__HASH_H

#include <stddef.h>
#include <stdint.h>

#define MW__FNV_BASIS 0xCBF29CE484222325ull

/* h continued over n bytes of data (start from MW__FNV_BASIS). */
static inline uint64_t mw__fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}

#endif
