/* Modules that load and say yes to everything, for the tests of what the core does with them:
 * built as libmeshwit-mpi.so (-DFAKE_MPI: an MPI world that is always one process, rank 0, as a
 * module built for another MPI than the launcher's would show) or as libmeshwit-cuda.so
 * (-DFAKE_CUDA: registers no backend), each in a folder of its own that MESHWIT_MODULE_PATH
 * names. */
#include <stdint.h>
#include <string.h>

#include "devices/module_abi.h"

#ifdef FAKE_MPI
static mw_status init(int *argc, char ***argv) {
    (void)argc, (void)argv;
    return MW_OK;
}
static void finalize(void) {}
static void abort_job(int code) { (void)code; }
static int size(void) { return 1; }
static int rank(void) { return 0; }
static mw_status allgather_ints(const int *mine, int n, int *out) {
    memcpy(out, mine, (size_t)n * sizeof *out);
    return MW_OK;
}
static const mw__dist_api api = {.init = init,
                                 .finalize = finalize,
                                 .abort = abort_job,
                                 .size = size,
                                 .rank = rank,
                                 .allgather_ints = allgather_ints};
#define API (&api)
#else
#define API NULL
#endif

#ifdef FAKE_OTHER_LAYOUT
/* A module built from source with one instruction more than this libmeshwit's. */
#define ONE_MORE(XX) MW__KERNELS(XX) XX(FILL, fill, mw__k_fill, 0, MW__ROLES_FILL)
#define ABI MW__MODULE_ABI_OF(ONE_MORE)
#else
#define ABI MW__MODULE_ABI
#endif

__attribute__((visibility("default"))) mw_status mw__module_entry(const mw__core_api *core,
                                                                  mw__module_info *out) {
    (void)core;
    *out = (mw__module_info){.abi = ABI, .version = MW__VERSION_STRING, .api = API};
    return MW_OK;
}
