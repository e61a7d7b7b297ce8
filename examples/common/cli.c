/* Command-line helpers shared by the examples and the bench. */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *cli_option_value(int argc, char **argv, int *i, const char *name, int *missing) {
    size_t n = strlen(name);
    const char *arg = argv[*i];
    if (strncmp(arg, name, n) != 0) return NULL;
    if (arg[n] == '=') return arg + n + 1;
    if (arg[n] != '\0') return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

int cli_report(const char *program, const char *arg, const char *v, int matched, int missing,
               int bad) {
    if (missing)
        fprintf(stderr, "%s: %s needs a value (see --help)\n", program, arg);
    else if (!matched)
        fprintf(stderr, "%s: unknown argument '%s' (see --help)\n", program, arg);
    else if (bad)
        fprintf(stderr, "%s: bad value '%s' for %.*s (see --help)\n", program, v,
                (int)strcspn(arg, "="), arg);
    else
        return 0;
    return -1;
}

/* strto* skip leading white space and take a sign: " -5" must be refused like "-5". */
static int starts_number(const char *s, int sign_ok) {
    return isdigit((unsigned char)*s) || *s == '.' || (sign_ok && (*s == '-' || *s == '+'));
}

int cli_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out) {
    char *end;
    if (!starts_number(s, 1)) return -1;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max) return -1;
    *out = v;
    return 0;
}

int cli_parse_int(const char *s, long min, long max, int *out) {
    int64_t v;
    if (cli_parse_i64(s, min, max, &v)) return -1;
    *out = (int)v;
    return 0;
}

int cli_parse_u64(const char *s, uint64_t *out) {
    char *end;
    if (!starts_number(s, 0)) return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

int cli_parse_double(const char *s, double min, double max, double *out) {
    char *end;
    if (!starts_number(s, 1)) return -1;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < min || v > max) return -1;
    *out = v;
    return 0;
}

static const char *file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

FILE *cli_open_regular(const char *path, int64_t *size, char *err, size_t errsize) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errsize, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    FILE *f = NULL;
    if (fstat(fd, &sb) != 0)
        snprintf(err, errsize, "cannot read %s: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        snprintf(err, errsize, "cannot read %s: it is %s, not a regular file", path,
                 file_kind(sb.st_mode));
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0 || !(f = fdopen(fd, "rb")))
        snprintf(err, errsize, "cannot read %s: %s", path, strerror(errno));
    if (!f) {
        close(fd);
        return NULL;
    }
    if (size) *size = (int64_t)sb.st_size;
    return f;
}

/* --- interruptions ---------------------------------------------------------------------------- */

static volatile sig_atomic_t caught;

static void on_stop_signal(int sig) {
    if (caught) _exit(128 + sig); /* the second signal: no more waiting */
    caught = sig;
    mw_request_stop();
}

int cli_catch_stop_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0 ? -1 : 0;
}

int cli_stop_signal(void) { return caught; }

int cli_stop_status(void) { return 128 + (caught ? caught : SIGINT); }

uint64_t cli_hash(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    if (h == 0) h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}
