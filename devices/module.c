/* Backends linked into libmeshwit besides the CPU's. */
#include "devices/module.h"

#include <pthread.h>
#include <string.h>

#include "core/error.h"
#include "devices/backend.h"

#ifdef MESHWIT_HAVE_CUDA
extern const mw__backend mw__cuda_backend;
#endif

mw_status mw__module_for_backend(const char *name) {
    if (strcmp(name, "cuda") != 0) return MW_ERR_NOT_FOUND;
#ifdef MESHWIT_HAVE_CUDA
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static int done;
    mw_status st = MW_OK;
    pthread_mutex_lock(&mu);
    if (!done) st = mw__backend_register(&mw__cuda_backend);
    done = 1;
    pthread_mutex_unlock(&mu);
    return st;
#else
    return mw__error(MW_ERR_DEVICE, "this build of meshwit has no CUDA backend (configure with "
                                    "-DMESHWIT_CUDA=ON on a machine with the CUDA toolkit)");
#endif
}
