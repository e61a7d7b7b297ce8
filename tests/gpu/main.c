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
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "meshwit/status.h"
#ifdef MESHWIT_HAVE_CUDA
#include "devices/cuda/cuda.h"
#endif

#define SKIP_CODE 77

#ifdef MESHWIT_HAVE_CUDA
/* The probe runs in a child process: CUDA cannot be used in a process forked after CUDA was
 * initialised in its parent, and Criterion forks every test from this one. The child exits 0
 * (GPUs), SKIP_CODE (none) or 1 (none, and required), its message on the pipe. */
static int probe_in_child(char *msg, size_t size) {
    int fds[2];
    msg[0] = '\0';
    if (pipe(fds) != 0) return 1;
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        close(fds[0]);
        int n = 0, code = 0;
        if (mw__cuda_probe(&n) != MW_OK) {
            code = 1;
        } else if (n == 0) {
            /* Why there is none: the probe's message as MESHWIT_REQUIRE_GPU=1 would give it. */
            setenv("MESHWIT_REQUIRE_GPU", "1", 1);
            (void)mw__cuda_probe(&n);
            code = SKIP_CODE;
        }
        if (code) {
            const char *m = mw_last_error();
            ssize_t w = write(fds[1], m, strlen(m));
            (void)w;
        }
        _exit(code);
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < size && (r = read(fds[0], msg + got, size - 1 - got)) > 0) got += (size_t)r;
    msg[got] = '\0';
    close(fds[0]);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 1;
    return WEXITSTATUS(status);
}
#endif

/* -1: go on and run the tests; else the exit code. */
static int gate(void) {
#ifdef MESHWIT_HAVE_CUDA
    char msg[1024];
    int code = probe_in_child(msg, sizeof msg);
    if (code == 0) return -1;
    if (code == SKIP_CODE) {
        const char *why = strstr(msg, " but ");
        printf("SKIP: %s; set MESHWIT_REQUIRE_GPU=1 to make this a failure\n",
               why ? why + 5 : "no GPU");
        return SKIP_CODE;
    }
    fprintf(stderr, "FAIL: %s\n", *msg ? msg : "probing for a GPU failed");
    return 1;
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
