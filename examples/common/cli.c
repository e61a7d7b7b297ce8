/* Command-line helpers shared by the examples and the bench. */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

double cli_mpirun_grace(void) {
    if (!getenv("OMPI_COMM_WORLD_SIZE")) return -1.0;
    const char *v = getenv("OMPI_MCA_odls_base_sigkill_timeout");
    double t;
    return v && cli_parse_double(v, 0.0, 1e9, &t) == 0 ? t : 1.0; /* Open MPI's default: 1 s */
}

/* --- a run's identity ------------------------------------------------------------------------- */

/* A line beyond the identity's room: a bug, said and ended (see cli.h). */
static void identity_full(const cli_identity *id, const char *name) {
    fprintf(stderr,
            "cli_identity_add: setting '%s' does not fit the run's identity (%zu of %zu bytes "
            "used): every setting must be compared; make cli_identity.text larger\n",
            name, id->len, sizeof id->text);
    abort();
}

void cli_identity_add(cli_identity *id, const char *name, const char *fmt, ...) {
    size_t room = sizeof id->text - id->len;
    int n = snprintf(id->text + id->len, room, "%s ", name), m = -1;
    if (n >= 0 && (size_t)n < room) {
        va_list ap;
        va_start(ap, fmt);
        m = vsnprintf(id->text + id->len + (size_t)n, room - (size_t)n, fmt, ap);
        va_end(ap);
    }
    if (n < 0 || m < 0 || (size_t)(n + m + 1) >= room) {
        id->text[id->len] = '\0';
        identity_full(id, name);
    }
    id->len += (size_t)(n + m);
    id->text[id->len++] = '\n';
    id->text[id->len] = '\0';
}

/* The value of setting `name` in identity text (a pointer into it and its length), or NULL. */
static const char *identity_value(const char *text, const char *name, size_t *len) {
    size_t n = strlen(name);
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        size_t l = end ? (size_t)(end - line) : strlen(line);
        if (l > n && strncmp(line, name, n) == 0 && line[n] == ' ') {
            *len = l - n - 1;
            return line + n + 1;
        }
        line += l + (end ? 1 : 0);
    }
    return NULL;
}

/* Whether `name` is in the comma-separated list. */
static int listed(const char *list, const char *name, size_t n) {
    for (const char *p = list; p && *p;) {
        size_t l = strcspn(p, ",");
        if (l == n && strncmp(p, name, n) == 0) return 1;
        p += l + (p[l] == ',');
    }
    return 0;
}

int cli_identity_check_names(const char *text, const char *list, char *bad, size_t size) {
    for (const char *p = list; *p;) {
        size_t l = strcspn(p, ",");
        char name[64];
        size_t len;
        snprintf(name, sizeof name, "%.*s", (int)(l < sizeof name ? l : sizeof name - 1), p);
        if (l == 0 || l >= sizeof name || !identity_value(text, name, &len)) {
            snprintf(bad, size, "%.*s", (int)l, p);
            return -1;
        }
        p += l + (p[l] == ',');
    }
    return 0;
}

void cli_identity_names(const char *text, char *out, size_t size) {
    size_t k = 0;
    out[0] = '\0';
    for (const char *line = text; *line && k + 1 < size;) {
        const char *end = strchr(line, '\n');
        size_t l = strcspn(line, " \n");
        int w = snprintf(out + k, size - k, "%s%.*s", k ? ", " : "", (int)l, line);
        if (w < 0 || (size_t)w >= size - k) break;
        k += (size_t)w;
        if (!end) break;
        line = end + 1;
    }
}

int cli_identity_compare(const char *saved, const char *current, const char *allowed, char *report,
                         size_t size) {
    int differ = 0;
    size_t k = 0;
    report[0] = '\0';
    for (const char *line = current; *line;) {
        const char *end = strchr(line, '\n');
        size_t l = end ? (size_t)(end - line) : strlen(line), n = strcspn(line, " \n");
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1), line);
        const char *now = line + (n < l ? n + 1 : n);
        size_t now_len = l - (size_t)(now - line), then_len = 0;
        const char *then = identity_value(saved, name, &then_len);
        int same = then && then_len == now_len && strncmp(then, now, now_len) == 0;
        if (!same && !listed(allowed, name, strlen(name))) {
            int w = snprintf(report + k, size > k ? size - k : 0,
                             "%s  %s: %.*s in the checkpoint, %.*s now", differ ? "\n" : "", name,
                             then ? (int)then_len : 4, then ? then : "none", (int)now_len, now);
            if (w > 0 && (size_t)w < size - k) k += (size_t)w;
            differ++;
        }
        line += l + (end ? 1 : 0);
    }
    return differ;
}
