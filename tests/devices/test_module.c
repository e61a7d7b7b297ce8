/* Loading libmeshwit-cuda.so (devices/module.c): a module that cannot be loaded or is not a
 * meshwit module is an error naming its file and the reason; a working one registers its
 * backend. Each Criterion test runs in its own process, so each loads the module afresh. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meshwit.h"

#if defined(MESHWIT_HAVE_CUDA) || defined(MESHWIT_HAVE_MPI)
/* A directory holding a module file called name with the given bytes (or a copy of file
 * copy_of), named in MESHWIT_MODULE_PATH ahead of every other place. */
static void fake_file(char dir[64], const char *name, const char *bytes, const char *copy_of) {
    snprintf(dir, 64, "/tmp/mw_module_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    char path[128], cmd[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (copy_of) {
        snprintf(cmd, sizeof cmd, "cp '%s' '%s'", copy_of, path);
        cr_assert_eq(system(cmd), 0, "%s", cmd);
    } else {
        FILE *f = fopen(path, "w");
        cr_assert_not_null(f);
        fputs(bytes, f);
        fclose(f);
    }
    cr_assert_eq(setenv("MESHWIT_MODULE_PATH", dir, 1), 0);
}

static void remove_fake(const char *dir) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}
#endif

#ifdef MESHWIT_HAVE_MPI
/* Under a launcher (its variable set here), mw_distributed_init must load the MPI module: one
 * that cannot be loaded is an error naming it, never a silent run of one process. */
Test(module, mpi_module_that_cannot_load) {
    char dir[64];
    fake_file(dir, "libmeshwit-mpi.so", "not a shared object\n", NULL);
    cr_assert_eq(setenv("OMPI_COMM_WORLD_SIZE", "2", 1), 0);
    cr_assert_eq(mw_distributed_init(NULL, NULL), MW_ERR_DEVICE);
    const char *msg = mw_last_error();
    cr_assert(strstr(msg, "cannot load") && strstr(msg, dir) && strstr(msg, "libmeshwit-mpi.so"),
              "%s", msg);
    cr_assert_eq(mw_distributed_size(), 1);
    remove_fake(dir);
}
#endif

#ifdef MESHWIT_HAVE_CUDA
static void fake_module(char dir[64], const char *bytes, const char *copy_of) {
    fake_file(dir, "libmeshwit-cuda.so", bytes, copy_of);
}

Test(module, unloadable_file_is_named_with_the_loader_error) {
    char dir[64];
    fake_module(dir, "not a shared object\n", NULL);
    mw_mesh *m = NULL;
    cr_assert_eq(mw_mesh_new("cuda:0", "X", &m), MW_ERR_DEVICE);
    const char *msg = mw_last_error();
    cr_assert(strstr(msg, "device spec 'cuda:0'") && strstr(msg, "cannot load"), "%s", msg);
    cr_assert(strstr(msg, dir) && strstr(msg, "libmeshwit-cuda.so"), "%s", msg);
    /* dlerror's reason follows the path */
    cr_assert(strstr(msg, "libmeshwit-cuda.so: ") != NULL, "%s", msg);
    /* The failure is remembered: the same answer again, and no GPU count. */
    cr_assert_eq(mw_mesh_new("cuda:1", "X", &m), MW_ERR_DEVICE);
    cr_assert(strstr(mw_last_error(), "cannot load"), "%s", mw_last_error());
    cr_assert_eq(mw_cuda_device_count(), 0);
    /* CPU devices are unaffected. */
    cr_assert_eq(mw_mesh_new("cpu:2", "X", &m), MW_OK, "%s", mw_last_error());
    mw_mesh_free(m);
    remove_fake(dir);
}

Test(module, shared_object_without_the_entry_point) {
    char dir[64];
    FILE *p = popen("ldd /bin/sh | grep -o '/[^ ]*libc\\.so\\.6' | head -1", "r");
    char libc[256] = "";
    cr_assert_not_null(p);
    cr_assert_not_null(fgets(libc, sizeof libc, p));
    pclose(p);
    libc[strcspn(libc, "\n")] = '\0';
    fake_module(dir, NULL, libc);
    mw_mesh *m = NULL;
    cr_assert_eq(mw_mesh_new("cuda:0", "X", &m), MW_ERR_UNSUPPORTED);
    cr_assert(strstr(mw_last_error(), "not a meshwit module"), "%s", mw_last_error());
    remove_fake(dir);
}

Test(module, the_built_module_registers_the_cuda_backend) {
    /* Found in the build tree: without a GPU the spec fails in the backend's own parser. */
    mw_mesh *m = NULL;
    mw_status st = mw_mesh_new("cuda:0", "X", &m);
    if (st == MW_OK) {
        mw_mesh_free(m);
        return; /* a GPU machine */
    }
    cr_assert_eq(st, MW_ERR_DEVICE, "%s", mw_last_error());
    cr_assert(strstr(mw_last_error(), "no CUDA devices are available"), "%s", mw_last_error());
    /* The CUDA module needs no MPI: NCCL across processes is a module of its own. */
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    int cuda = 0;
    while (f && fgets(line, sizeof line, f)) {
        cr_assert_null(strstr(line, "libmpi"), "a CUDA program in one process maps %s", line);
        cuda |= strstr(line, "libmeshwit-cuda.so") != NULL;
    }
    if (f) fclose(f);
    cr_assert(cuda, "libmeshwit-cuda.so is mapped");
}
#else
Test(module, no_cuda_in_this_build) {
    mw_mesh *m = NULL;
    cr_assert_eq(mw_mesh_new("cuda:0", "X", &m), MW_ERR_DEVICE);
    cr_assert(strstr(mw_last_error(), "no CUDA backend"), "%s", mw_last_error());
}
#endif
