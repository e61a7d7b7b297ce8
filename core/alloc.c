/* Host allocations with a fault-injection countdown. */
#include "core/alloc.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

/* Allocations left before the injected failure; negative: none armed. */
static _Atomic int64_t countdown = -1;
static _Atomic int64_t counted = 0;

void mw__alloc_fail_at(int64_t n) {
    atomic_store(&counted, 0);
    atomic_store(&countdown, n > 0 ? n : -1);
}

int64_t mw__alloc_count(void) { return atomic_load(&counted); }

/* True when this allocation is the one that must fail. */
static int should_fail(void) {
    atomic_fetch_add(&counted, 1);
    int64_t left = atomic_load(&countdown);
    while (left > 0) {
        if (atomic_compare_exchange_weak(&countdown, &left, left - 1)) return left == 1;
    }
    return 0;
}

void *mw__malloc(size_t size) { return should_fail() ? NULL : malloc(size); }

void *mw__calloc(size_t n, size_t size) { return should_fail() ? NULL : calloc(n, size); }

void *mw__realloc(void *p, size_t size) { return should_fail() ? NULL : realloc(p, size); }

void *mw__aligned_alloc(size_t align, size_t size) {
    /* aligned_alloc wants a multiple of the alignment. */
    size_t n = (size + align - 1) / align * align;
    return should_fail() ? NULL : aligned_alloc(align, n ? n : align);
}

void mw__free(void *p) { free(p); }
