/* What the GPU suites share: a check that a call returned MW_OK, and the skip without a GPU.
 * Each suite runs through main.c's gate, which reports a run without a GPU as skipped, or as
 * failed when MESHWIT_REQUIRE_GPU=1. */
#ifndef MW_TESTS_GPU_TEST_H
#define MW_TESTS_GPU_TEST_H

#include <criterion/criterion.h>

#include "devices/cuda/cuda.h"
#include "meshwit.h"

#define OK(call)                                                                                   \
    do {                                                                                           \
        mw_status st_ = (call);                                                                    \
        cr_assert_eq(st_, MW_OK, "%s returned %s: %s", #call, mw_status_name(st_),                 \
                     mw_last_error());                                                             \
    } while (0)

/* Skips the test without a GPU; fails it when MESHWIT_REQUIRE_GPU is set and none is usable (the
 * probe then reports the CUDA error). Returns the number of GPUs. */
static inline int need_gpu(void) {
    int n = 0;
    cr_assert_eq(mw__cuda_probe(&n), MW_OK, "%s", mw_last_error());
    if (n == 0) cr_skip("no CUDA device: mw__cuda_probe found none, so the GPU tests are skipped");
    return n;
}

#endif
