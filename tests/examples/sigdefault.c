/* Runs a program with SIGINT and SIGTERM at their default dispositions, as a terminal would
 * start it: a background job of a non-interactive shell inherits SIGINT ignored, and a shell
 * cannot undo a disposition it was started with.
 *
 *   sigdefault PROGRAM [ARG...] */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: sigdefault PROGRAM [ARG...]\n");
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigset_t none;
    sigemptyset(&none);
    if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0 ||
        sigprocmask(SIG_SETMASK, &none, NULL) != 0) {
        perror("sigdefault");
        return 2;
    }
    execvp(argv[1], argv + 1);
    perror(argv[1]);
    return 127;
}
