/* Internal: every host allocation of the library goes through these, so tests can make the Nth
 * one fail (mw_test_control's MW_TEST_FAIL_ALLOCATION) and check each out-of-memory path. */
#ifndef MW__ALLOC_H
#define MW__ALLOC_H

#include <stddef.h>
#include <stdint.h>

/* The n-th allocation from now on fails, once (n <= 0: none); the count since this call. */
void mw__alloc_fail_at(int64_t n);
int64_t mw__alloc_count(void);

void *mw__malloc(size_t size);
void *mw__calloc(size_t n, size_t size);
void *mw__realloc(void *p, size_t size);
void *mw__aligned_alloc(size_t align, size_t size);
void mw__free(void *p);

#endif
