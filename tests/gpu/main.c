/* The GPU test program's entry: Criterion's own main, behind a gate for the suites that need a
 * GPU. With --need-gpu (how CTest runs the gpu and gpu_trainer suites) the program first asks
 * CUDA for a GPU: none, and MESHWIT_REQUIRE_GPU unset, exits 77, which CTest reports as skipped
 * (SKIP_RETURN_CODE) rather than passed; none with MESHWIT_REQUIRE_GPU=1 exits 1 with the CUDA
 * error that hid the GPUs (e.g. an insufficient driver), so a GPU machine cannot pass by
 * skipping. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meshwit/status.h"
#ifdef MESHWIT_HAVE_CUDA
#include "devices/cuda/cuda.h"
#endif

#define SKIP_CODE 77

/* -1: go on and run the tests; else the exit code. */
static int gate(void) {
#ifdef MESHWIT_HAVE_CUDA
    int n = 0;
    if (mw__cuda_probe(&n) != MW_OK) {
        fprintf(stderr, "FAIL: %s\n", mw_last_error());
        return 1;
    }
    if (n > 0) return -1;
    /* Why there is none: the probe's message as MESHWIT_REQUIRE_GPU=1 would give it. */
    setenv("MESHWIT_REQUIRE_GPU", "1", 1);
    (void)mw__cuda_probe(&n);
    unsetenv("MESHWIT_REQUIRE_GPU");
    printf("SKIP: no GPU (%s); set MESHWIT_REQUIRE_GPU=1 to make this a failure\n",
           mw_last_error());
    return SKIP_CODE;
#else
    const char *v = getenv("MESHWIT_REQUIRE_GPU");
    if (v && *v && strcmp(v, "0") != 0) {
        fprintf(stderr, "FAIL: MESHWIT_REQUIRE_GPU is set but this build of meshwit has no CUDA "
                        "backend (configure with -DMESHWIT_CUDA=ON)\n");
        return 1;
    }
    printf("SKIP: this build of meshwit has no CUDA backend\n");
    return SKIP_CODE;
#endif
}

int main(int argc, char *argv[]) {
    int need = 0, kept = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--need-gpu") == 0)
            need = 1;
        else
            argv[kept++] = argv[i];
    }
    argv[kept] = NULL;
    if (need) {
        int code = gate();
        if (code >= 0) return code;
    }
    struct criterion_test_set *tests = criterion_initialize();
    int result = 0;
    if (criterion_handle_args(kept, argv, true)) result = !criterion_run_all_tests(tests);
    criterion_finalize(tests);
    return result;
}
