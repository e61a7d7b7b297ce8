/* The plan's arena (core/plan_memory.c): best fit, small requests kept out of large holes, and
 * coalescing, on the patterns a training step makes. Offsets and sizes are in 4-byte units,
 * rounded up to 16 (64 bytes). */
#include <criterion/criterion.h>

#include "core/alloc.h"
#include "core/plan_impl.h"
#include "tests/common/rng.h"

#define MB (262144) /* units */

static arena fresh(void) { return (arena){0}; }

static void done(arena *a) {
    mw__free(a->free);
    mw__free(a->recs);
}

Test(plan_memory, best_fit_takes_the_smallest_hole_that_holds_the_request) {
    arena a = fresh();
    int64_t h1 = mw__arena_alloc(&a, 4 * MB), k1 = mw__arena_alloc(&a, 16);
    int64_t h2 = mw__arena_alloc(&a, 2 * MB), k2 = mw__arena_alloc(&a, 16);
    int64_t h3 = mw__arena_alloc(&a, 3 * MB), k3 = mw__arena_alloc(&a, 16);
    (void)k1, (void)k2, (void)k3;
    cr_assert_eq(mw__arena_release(&a, h1, 4 * MB), 0);
    cr_assert_eq(mw__arena_release(&a, h2, 2 * MB), 0);
    cr_assert_eq(mw__arena_release(&a, h3, 3 * MB), 0);
    int64_t top = a.top;
    /* 2.5 MB: the 3 MB hole (first fit would take the 4 MB one at the bottom). */
    cr_assert_eq(mw__arena_alloc(&a, 5 * MB / 2), h3);
    cr_assert_eq(mw__arena_alloc(&a, 2 * MB), h2, "an exact fit");
    cr_assert_eq(mw__arena_alloc(&a, 4 * MB), h1);
    cr_assert_eq(a.top, top, "every request fitted a hole");
    done(&a);
}

/* Released neighbours merge, so a request of their total size fits again; a large request still
 * absorbs the free block that ends at the top. */
Test(plan_memory, freed_neighbours_coalesce) {
    arena a = fresh();
    int64_t x = mw__arena_alloc(&a, 2 * MB), y = mw__arena_alloc(&a, 2 * MB),
            z = mw__arena_alloc(&a, 2 * MB), w = mw__arena_alloc(&a, 2 * MB);
    (void)w;
    cr_assert_eq(mw__arena_release(&a, x, 2 * MB), 0);
    cr_assert_eq(mw__arena_release(&a, z, 2 * MB), 0);
    cr_assert_eq(mw__arena_release(&a, y, 2 * MB), 0); /* joins both */
    cr_assert_eq(a.nfree, 1);
    cr_assert_eq(mw__arena_alloc(&a, 6 * MB), x);
    int64_t top = a.top;
    cr_assert_eq(mw__arena_release(&a, w, 2 * MB), 0);
    cr_assert_eq(mw__arena_alloc(&a, 3 * MB), w, "absorbs the block at the top");
    cr_assert_eq(a.top, top + MB);
    done(&a);
}

static void done_record(arena *a) {
    mw__free(a->free);
    mw__free(a->recs);
    mw__free(a->placed_own);
}

/* The pattern of an FSDP step with a tied embedding: the gathered table dies once the logits are
 * made, the loss (a scalar read after the step) is made, and the table is gathered again. Placed
 * online the scalar lands in the table's hole and the second gather goes on top; packed, the
 * step needs what is alive at once: the logits, one table, the rest. */
Test(plan_memory, packing_places_what_the_online_placement_cannot) {
    arena a = fresh();
    int64_t keep = mw__arena_alloc(&a, MB);
    int64_t table = mw__arena_alloc(&a, 40 * MB), logits = mw__arena_alloc(&a, 50 * MB);
    (void)keep, (void)logits;
    cr_assert_eq(mw__arena_release(&a, table, 40 * MB), 0);
    int64_t loss = mw__arena_alloc(&a, 1);
    cr_assert_eq(loss, table, "online: the scalar goes into the table's hole");
    mw__arena_alloc(&a, 40 * MB);
    cr_assert_eq(a.top, 131 * MB, "online: %lld", (long long)a.top);
    cr_assert_eq(mw__arena_pack(&a), 91 * MB + 16);
    cr_assert_eq(a.nrecs, 5);
    done_record(&a);
}

/* Random steps: buffers of any size made and freed in any order, some alive to the end. The
 * packing never gives two buffers alive at once overlapping units, needs at least the most
 * that is alive at once, and is replayed allocation by allocation (a different sequence is
 * caught). */
Test(plan_memory, packing_never_overlaps_live_buffers) {
    uint64_t s = 12345;
    for (int round = 0; round < 20; round++) {
        arena a = fresh();
        int64_t live_off[64], live_n[64];
        int nlive = 0;
        int64_t live_sum = 0, most = 0;
        for (int step = 0; step < 300; step++) {
            uint32_t r = (uint32_t)(rng_lcg64(&s) >> 33);
            if (nlive < 64 && (r % 3 != 0 || nlive == 0)) {
                int64_t n = 1 + (int64_t)(r >> 4) % (r % 7 == 0 ? 4 * MB : 20000);
                int64_t units = (n + 15) / 16 * 16;
                live_off[nlive] = mw__arena_alloc(&a, n);
                live_n[nlive++] = n;
                live_sum += units;
                if (live_sum > most) most = live_sum;
            } else {
                int k = (int)((r >> 8) % (uint32_t)nlive);
                cr_assert_eq(mw__arena_release(&a, live_off[k], live_n[k]), 0);
                live_sum -= (live_n[k] + 15) / 16 * 16;
                live_off[k] = live_off[nlive - 1];
                live_n[k] = live_n[--nlive];
            }
        }
        int64_t top = mw__arena_pack(&a);
        cr_assert_geq(top, most, "round %d: %lld units for %lld alive at once", round,
                      (long long)top, (long long)most);
        for (int i = 0; i < a.nrecs; i++) {
            const arena_rec *x = &a.recs[i];
            int64_t xo = a.placed_own[i];
            cr_assert(xo >= 0 && xo % 16 == 0 && xo + x->n <= top);
            for (int j = i + 1; j < a.nrecs; j++) {
                const arena_rec *y = &a.recs[j];
                int64_t yo = a.placed_own[j];
                if (x->born < y->died && y->born < x->died)
                    cr_assert(xo + x->n <= yo || yo + y->n <= xo,
                              "round %d: buffers %d and %d overlap while both alive", round, i, j);
            }
        }
        /* Replayed: the same sequence gets the packed offsets; another size is caught. */
        arena b = {.recs = a.recs, .nrecs = a.nrecs, .placed = a.placed_own};
        for (int i = 0; i < a.nrecs; i++)
            cr_assert_eq(mw__arena_alloc(&b, a.recs[i].n), a.placed_own[i]);
        cr_assert_not(b.mismatch);
        arena c = {.recs = a.recs, .nrecs = a.nrecs, .placed = a.placed_own};
        mw__arena_alloc(&c, a.recs[0].n + 16);
        cr_assert(c.mismatch, "a different size was replayed");
        done_record(&a);
    }
}
