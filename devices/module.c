/* Loading the modules built beside libmeshwit: libmeshwit-cuda.so (the CUDA backend, NCCL),
 * libmeshwit-mpi.so (processes through MPI) and libmeshwit-nccl-mpi.so (NCCL among the GPUs of
 * several processes, asked for by the choice of reducer, collectives/reducer_select.c). Each is
 * loaded at most once, the first time it is needed, and stays loaded; a failure is remembered and
 * reported again with the same message.
 *
 * Where a module is looked for, in order: the directories of MESHWIT_MODULE_PATH (':'-separated,
 * an override), the directory of the binary that holds libmeshwit (a shared libmeshwit's own
 * directory), the install library directory compiled in, and the build tree compiled in (for
 * the tests). */
#define _GNU_SOURCE /* dladdr1, realpath */
#include "devices/module.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "devices/backend.h"
#include "devices/module_abi.h"
#include "meshwit.h"

typedef struct module {
    const char *file; /* "libmeshwit-cuda.so" */
    int built;        /* this build of meshwit makes it */
    /* Optional: whether the process needs the module; asked only before it was first tried
     * (NULL: whenever it is asked for). */
    int (*wanted)(void);
    int tried;
    mw_status status;
    char error[MW__MSG_SIZE];
    void *handle;
    mw__module_info info;
} module;

#ifndef MESHWIT_CUDA_MODULE
#define MESHWIT_CUDA_MODULE 0
#endif
#ifndef MESHWIT_MPI_MODULE
#define MESHWIT_MPI_MODULE 0
#endif
#ifndef MESHWIT_NCCL_MPI_MODULE
#define MESHWIT_NCCL_MPI_MODULE 0
#endif

/* One process needs no MPI: the MPI module is loaded only under a launcher. */
static int launched_by_mpi(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

static module modules[MW__MODULE_COUNT] = {
    [MW__MODULE_CUDA] = {.file = "libmeshwit-cuda.so", .built = MESHWIT_CUDA_MODULE},
    [MW__MODULE_MPI] = {.file = "libmeshwit-mpi.so",
                        .built = MESHWIT_MPI_MODULE,
                        .wanted = launched_by_mpi},
    [MW__MODULE_NCCL_MPI] = {.file = "libmeshwit-nccl-mpi.so", .built = MESHWIT_NCCL_MPI_MODULE},
};
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static const void *core_module(int id) { return mw__module_api((mw__module_id)id); }

static const mw__core_api core_api = {
    .abi = MW__MODULE_ABI,
    .version = MW__VERSION_STRING,
    .error_copy = mw__error_copy,
    .last_error = mw_last_error,
    .malloc = mw__malloc,
    .calloc = mw__calloc,
    .realloc = mw__realloc,
    .aligned_alloc = mw__aligned_alloc,
    .free = mw__free,
    .module = core_module,
};

/* Appends dir/file to the list of places looked at; tries it when it exists. 1: found (loaded
 * or failed; m says which), 0: not there. */
static int try_dir(module *m, const char *dir, size_t len, char *looked, size_t cap) {
    char path[4096];
    if (len == 0 || len + strlen(m->file) + 2 > sizeof path) return 0;
    snprintf(path, sizeof path, "%.*s/%s", (int)len, dir, m->file);
    size_t used = strlen(looked);
    snprintf(looked + used, cap - used, "%s%.*s", used ? ", " : "", (int)len, dir);
    if (access(path, F_OK) != 0) return 0;
    m->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!m->handle) {
        const char *why = dlerror();
        m->status = mw__error(MW_ERR_DEVICE, "cannot load %s: %s", path, why ? why : "?");
        return 1;
    }
    mw__module_entry_fn entry;
    *(void **)&entry = dlsym(m->handle, MW__MODULE_ENTRY);
    /* What an entry that refuses our table without a word (another interface) leaves. */
    mw__error(MW_ERR_UNSUPPORTED, "the module refused this libmeshwit's interface %d",
              MW__MODULE_ABI);
    if (!entry) {
        m->status = mw__error(MW_ERR_UNSUPPORTED, "%s has no entry point %s: not a meshwit module",
                              path, MW__MODULE_ENTRY);
    } else if ((m->status = entry(&core_api, &m->info)) == MW_OK &&
               (m->info.abi != MW__MODULE_ABI || !m->info.version ||
                strcmp(m->info.version, MW__VERSION_STRING) != 0)) {
        m->status = mw__error(MW_ERR_UNSUPPORTED,
                              "%s is from meshwit %s (module interface %d); this libmeshwit is "
                              "%s (interface %d): install matching versions",
                              path, m->info.version ? m->info.version : "?", m->info.abi,
                              MW__VERSION_STRING, MW__MODULE_ABI);
    } else if (m->status) {
        char msg[MW__MSG_SIZE];
        snprintf(msg, sizeof msg, "%s", mw_last_error());
        m->status = mw__error(m->status, "%s: %s", path, msg);
    } else if (m->info.backend) {
        m->status = mw__backend_register(m->info.backend);
    }
    return 1;
}

static void load(module *m) {
    char looked[2048] = "";
    const char *env = getenv("MESHWIT_MODULE_PATH");
    for (const char *p = env; p && *p;) {
        size_t len = strcspn(p, ":");
        if (try_dir(m, p, len, looked, sizeof looked)) return;
        p += len + (p[len] == ':');
    }
    /* The directory of the file that holds libmeshwit: a shared libmeshwit's own, or, linked
     * statically, the program's, found through /proc/self/exe (dladdr names the main program by
     * its argv[0], which a PATH lookup or a symbolic link makes another place). */
    Dl_info self;
    struct link_map *lm = NULL;
    char real[4096] = "";
    if (dladdr1((void *)&core_api, &self, (void **)&lm, RTLD_DL_LINKMAP) && lm) {
        if (!lm->l_name || !lm->l_name[0]) {
            ssize_t n = readlink("/proc/self/exe", real, sizeof real - 1);
            real[n > 0 ? n : 0] = '\0';
        } else if (!realpath(lm->l_name, real)) {
            snprintf(real, sizeof real, "%s", lm->l_name);
        }
    }
    const char *slash = strrchr(real, '/');
    if (slash && try_dir(m, real, (size_t)(slash - real), looked, sizeof looked)) return;
#ifdef MESHWIT_MODULE_INSTALL_DIR
    if (try_dir(m, MESHWIT_MODULE_INSTALL_DIR, strlen(MESHWIT_MODULE_INSTALL_DIR), looked,
                sizeof looked))
        return;
#endif
#ifdef MESHWIT_MODULE_BUILD_DIR
    if (try_dir(m, MESHWIT_MODULE_BUILD_DIR, strlen(MESHWIT_MODULE_BUILD_DIR), looked,
                sizeof looked))
        return;
#endif
    m->status = mw__error(MW_ERR_UNSUPPORTED,
                          "%s was not found (looked in %s); install it beside libmeshwit or name "
                          "its directory in MESHWIT_MODULE_PATH",
                          m->file, looked);
}

/* The module's table once loaded; NULL (and the reason as the last error) otherwise. */
static const void *module_api(module *m, mw_status *status) {
    pthread_mutex_lock(&mu);
    if (!m->tried) {
        m->tried = 1;
        load(m);
        if (m->status) {
            snprintf(m->error, sizeof m->error, "%s", mw_last_error());
            if (m->handle && !m->info.backend) dlclose(m->handle); /* nothing of it is in use */
        }
    }
    mw_status st = m->status;
    const void *api = st ? NULL : m->info.api;
    pthread_mutex_unlock(&mu);
    if (st) mw__error_copy(st, m->error);
    if (status) *status = st;
    return api;
}

mw_status mw__module_for_backend(const char *name) {
    if (strcmp(name, "cuda") != 0) return MW_ERR_NOT_FOUND;
    module *m = &modules[MW__MODULE_CUDA];
    if (!m->built)
        return mw__error(MW_ERR_DEVICE, "this build of meshwit has no CUDA backend (configure with "
                                        "-DMESHWIT_CUDA=ON on a machine with the CUDA toolkit)");
    mw_status st;
    module_api(m, &st);
    return st;
}

const void *mw__module_api(mw__module_id id) {
    if ((unsigned)id >= MW__MODULE_COUNT) return NULL;
    module *m = &modules[id];
    if (!m->built) return NULL;
    if (m->wanted) {
        pthread_mutex_lock(&mu);
        int tried = m->tried;
        pthread_mutex_unlock(&mu);
        if (!tried && !m->wanted()) return NULL;
    }
    return module_api(m, NULL);
}

const mw__dist_api *mw__dist(void) { return mw__module_api(MW__MODULE_MPI); }

int mw__dist_built(void) { return modules[MW__MODULE_MPI].built; }

mw_status mw__dist_failure(void) {
    module *m = &modules[MW__MODULE_MPI];
    mw_status st;
    pthread_mutex_lock(&mu);
    st = m->status;
    pthread_mutex_unlock(&mu);
    return st ? mw__error_copy(st, m->error) : MW_OK;
}
