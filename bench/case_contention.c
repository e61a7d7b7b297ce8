/* Bench case "contention": what sharding costs when the machine is not idle. A child process
 * busy-loops (one core's worth of competing work, unpinned, at normal priority) while the linreg
 * case (cpu:1 vs sharded cpu:2 and cpu:4) and the gpt2 case (tiny GPT-2 on cpu:1, cpu:2 and
 * cpu:4) run; the busy process is killed afterwards. Records carry "condition": "busy". */
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "bench.h"

#define BUSY_MAX_SECONDS 900 /* the busy process ends itself even if nobody kills it */

int mwb_case_contention(mwb_ctx *ctx) {
    fflush(stdout);
    fflush(stderr);
    pid_t busy = fork();
    if (busy < 0) {
        perror("contention: fork");
        return 1;
    }
    if (busy == 0) {
#ifdef __linux__
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* dies with the bench, however that ends */
#endif
        time_t end = time(NULL) + BUSY_MAX_SECONDS;
        volatile unsigned long spin = 0;
        while (time(NULL) < end)
            for (int i = 0; i < 1000000; i++) spin++;
        _exit(0);
    }
    printf("one busy-looping process competes for the cores during this case\n");
    mwb_ctx sub = *ctx;
    sub.condition = "busy";
    static const char *const sharded[] = {"cpu:2", "cpu:4"};
    static const char *const gpt[] = {"cpu:1", "cpu:2", "cpu:4"};
    sub.devices = sharded;
    sub.ndevices = 2;
    printf("-- linreg, busy machine\n");
    int failed = mwb_case_linreg(&sub);
    printf("-- gpt2 (tiny), busy machine\n");
    failed |= mwb_gpt2_specs(&sub, gpt, 3);
    kill(busy, SIGKILL);
    waitpid(busy, NULL, 0);
    return failed;
}
