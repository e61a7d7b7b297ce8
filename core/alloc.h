/* Internal: every host allocation of the library goes through these, so tests can make the Nth
 * one fail (mw_test_fail_allocation) and check each out-of-memory path. */
#ifndef MW__ALLOC_H
#define MW__ALLOC_H

#include <stddef.h>

void *mw__malloc(size_t size);
void *mw__calloc(size_t n, size_t size);
void *mw__realloc(void *p, size_t size);
void *mw__aligned_alloc(size_t align, size_t size);
void mw__free(void *p);

#endif
