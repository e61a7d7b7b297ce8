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
#include <sys/statvfs.h>
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
    /* Decimal, or hex after 0x: a leading zero is not octal ("010" is ten). */
    int hex = s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
    unsigned long long v = strtoull(s, &end, hex ? 16 : 10);
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

/* The folder of path ("." for a bare name), into dir. */
static void folder_of(const char *path, char *dir, size_t n) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, n, ".");
    else if (slash == path)
        snprintf(dir, n, "/");
    else
        snprintf(dir, n, "%.*s", (int)(slash - path), path);
}

int cli_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    if (!a || !b) return 0;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0)
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    return strcmp(a, b) == 0; /* neither exists yet, or one does not: the same name is the same */
}

int cli_check_output(const char *program, const cli_file *out, const cli_file *inputs, int n,
                     int64_t bytes) {
    if (!out->path) return 0;
    for (int i = 0; i < n; i++)
        if (inputs[i].path && cli_same_file(out->path, inputs[i].path)) {
            fprintf(stderr, "%s: %s %s is also %s %s: writing it would destroy an input\n", program,
                    out->flag, out->path, inputs[i].flag, inputs[i].path);
            return -1;
        }
    struct stat sb;
    if (stat(out->path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        fprintf(stderr, "%s: %s %s exists and is %s, not a regular file\n", program, out->flag,
                out->path, file_kind(sb.st_mode));
        return -1;
    }
    /* The file is written to a temporary name beside it, then renamed: the folder must take a
     * new file. Tried now, so that a missing folder or a read-only file system is said before
     * the work rather than after it. */
    char dir[4096], probe[4200];
    folder_of(out->path, dir, sizeof dir);
    snprintf(probe, sizeof probe, "%s/.%s-probe-%ld", dir, program, (long)getpid());
    int fd = open(probe, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "%s: %s %s cannot be written: cannot create a file in %s: %s\n", program,
                out->flag, out->path, dir, strerror(errno));
        return -1;
    }
    close(fd);
    unlink(probe);
    struct statvfs vf;
    if (bytes > 0 && statvfs(dir, &vf) == 0 &&
        (double)vf.f_bavail * (double)vf.f_frsize < (double)bytes) {
        fprintf(stderr, "%s: %s %s needs %.1f MB, and %s has %.1f MB free\n", program, out->flag,
                out->path, (double)bytes / 1e6, dir,
                (double)vf.f_bavail * (double)vf.f_frsize / 1e6);
        return -1;
    }
    return 0;
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
