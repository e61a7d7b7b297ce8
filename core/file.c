/* The file discipline (meshwit/file.h): opening inputs without blocking, writing outputs beside
 * their final name and renaming them when complete. The run's set of files, checked before the
 * work, is files.c. */
#define _DEFAULT_SOURCE /* realpath, gethostname */
#include "core/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"

#define OUT_BUFFER (1u << 16)

/* "what path" or "path" for messages. */
#define WHAT(w) (w) ? (w) : "", (w) ? " " : ""

const char *mw__file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

int mw__file_folder(const char *path, char *dir, size_t n) {
    const char *slash = strrchr(path, '/');
    int len = !slash          ? snprintf(dir, n, ".")
              : slash == path ? snprintf(dir, n, "/")
                              : snprintf(dir, n, "%.*s", (int)(slash - path), path);
    return len < 0 || (size_t)len >= n ? -1 : 0;
}

/* --- inputs ----------------------------------------------------------------------------------- */

mw_status mw__file_open_read(const char *path, const char *what, int *fd, int64_t *size) {
    *fd = -1;
    *size = 0;
    int d = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (d < 0)
        return mw__error(MW_ERR_IO, "cannot open %s%s%s: %s", WHAT(what), path, strerror(errno));
    struct stat sb;
    mw_status st = MW_OK;
    if (fstat(d, &sb) != 0)
        st = mw__error(MW_ERR_IO, "cannot read %s%s%s: %s", WHAT(what), path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        st = mw__error(MW_ERR_IO, "cannot read %s%s%s: it is %s, not a regular file", WHAT(what),
                       path, mw__file_kind(sb.st_mode));
    else if (fcntl(d, F_SETFL, fcntl(d, F_GETFL) & ~O_NONBLOCK) != 0)
        st = mw__error(MW_ERR_IO, "cannot read %s%s%s: %s", WHAT(what), path, strerror(errno));
    if (st) {
        close(d);
        return st;
    }
    *fd = d;
    *size = (int64_t)sb.st_size;
    return MW_OK;
}

mw_status mw__file_read_at(int fd, void *buf, size_t n, int64_t at, const char *path) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(at + (int64_t)got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return mw__error(MW_ERR_IO, "cannot read %s: %s", path,
                             r < 0 ? strerror(errno) : "the file shrank while it was read");
        got += (size_t)r;
    }
    return MW_OK;
}

mw_status mw__file_read_all(const char *path, const char *what, size_t max, char **data,
                            size_t *size) {
    *data = NULL;
    *size = 0;
    int fd;
    int64_t n;
    mw_status st = mw__file_open_read(path, what, &fd, &n);
    if (st) return st;
    if ((uint64_t)n > (uint64_t)max)
        st = mw__error(MW_ERR_FORMAT, "%s%s%s: %lld bytes is more than it may have (%zu)",
                       WHAT(what), path, (long long)n, max);
    char *buf = st ? NULL : mw__malloc((size_t)n + 1);
    if (!st && !buf)
        st = mw__error(MW_ERR_NOMEM, "out of memory reading %s (%lld bytes)", path, (long long)n);
    if (!st) st = mw__file_read_at(fd, buf, (size_t)n, 0, path);
    close(fd);
    if (st) {
        mw__free(buf);
        return st;
    }
    buf[n] = '\0';
    *data = buf;
    *size = (size_t)n;
    return MW_OK;
}

mw_status mw_input_open(const char *path, const char *what, unsigned flags, FILE **out,
                        int64_t *size) {
    if (out) *out = NULL;
    if (size) *size = 0;
    if (!path || !out) return mw__error(MW_ERR_INVALID, "mw_input_open: NULL argument");
    if (!*path)
        return mw__error(MW_ERR_INVALID, "%s%san empty file name: give a path", what ? what : "",
                         what ? ": " : "");
    if ((flags & MW_FILE_STDIO) && strcmp(path, "-") == 0) {
        *out = stdin;
        if (size) *size = -1;
        return MW_OK;
    }
    int fd;
    int64_t n;
    mw_status st = mw__file_open_read(path, what, &fd, &n);
    if (st) return st;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        return e == ENOMEM
                   ? mw__error(MW_ERR_NOMEM, "out of memory opening %s", path)
                   : mw__error(MW_ERR_IO, "cannot read %s%s%s: %s", WHAT(what), path, strerror(e));
    }
    *out = f;
    if (size) *size = n;
    return MW_OK;
}

/* --- outputs ---------------------------------------------------------------------------------- */

mw_status mw__file_replaceable(const char *path, const char *what) {
    struct stat sb;
    if (stat(path, &sb) != 0 || S_ISREG(sb.st_mode)) return MW_OK; /* absent, or replaceable */
    return mw__error(MW_ERR_IO, "cannot write %s %s: it is %s, not a regular file (not replaced)",
                     what, path, mw__file_kind(sb.st_mode));
}

/* This host's name for temporary file names ("host" when it has none usable). */
static void host_name(char *out, size_t size) {
    if (gethostname(out, size) != 0) out[0] = '\0';
    out[size - 1] = '\0';
    for (char *c = out; *c; c++)
        if (*c == '/') *c = '_';
    if (!out[0]) snprintf(out, size, "host");
}

/* The temporary file of one write: "<path>.tmp.<host>.<pid>.<n>", unique per writer (host,
 * process and write), also when hosts share a file system. NULL when out of memory. */
static char *temp_name(const char *path) {
    static _Atomic unsigned counter;
    unsigned n = atomic_fetch_add(&counter, 1);
    char host[256];
    host_name(host, sizeof host);
    size_t size = strlen(path) + strlen(host) + 48;
    char *out = mw__malloc(size);
    if (out) snprintf(out, size, "%s.tmp.%s.%ld.%u", path, host, (long)getpid(), n);
    return out;
}

/* Removes temporary files of `path` that no running writer owns: "<path>.tmp" (older versions)
 * and "<path>.tmp.<host>.<pid>.<n>" of this host whose process no longer exists (another
 * host's processes cannot be asked). Best effort. */
static void remove_stale(const char *path) {
    char dir[4096], prefix[512], host[256];
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    host_name(host, sizeof host);
    if (mw__file_folder(path, dir, sizeof dir) != 0 ||
        snprintf(prefix, sizeof prefix, "%s.tmp.%s.", base, host) >= (int)sizeof prefix)
        return;
    DIR *d = opendir(dir);
    if (!d) return;
    size_t blen = strlen(base), plen = strlen(prefix);
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *name = e->d_name;
        if (strncmp(name, base, blen) != 0 || strcmp(name + blen, ".tmp") != 0) {
            if (strncmp(name, prefix, plen) != 0) continue;
            char *end;
            long pid = strtol(name + plen, &end, 10);
            if (end == name + plen || *end != '.' || pid <= 0) continue;
            if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        }
        char full[8192];
        if (snprintf(full, sizeof full, "%s/%s", dir, name) < (int)sizeof full) remove(full);
    }
    closedir(d);
}

struct mw_output {
    int std;          /* writes standard output in place */
    int fd;           /* the temporary file while open, else -1 */
    char *path, *tmp; /* the final name (through symbolic links) and the temporary one */
    char what[64];    /* the role, for messages ("--save") */
    mw_status failed; /* the first failure, kept */
    char msg[MW__MSG_SIZE];
    size_t used; /* bytes in buf */
    unsigned char *buf;
};

/* Records the first failure of o (the message kept for later calls) and returns it. */
static mw_status output_fail(mw_output *o, mw_status st, const char *cause) {
    if (!o->failed) {
        o->failed = st;
        if (o->std)
            snprintf(o->msg, sizeof o->msg, "cannot write %s to standard output: %s", o->what,
                     cause);
        else
            snprintf(o->msg, sizeof o->msg, "cannot write %s %s: %s (%s is as it was)", o->what,
                     o->path, cause, o->path);
    }
    return mw__error_copy(o->failed, o->msg);
}

static mw_status write_out(mw_output *o, const void *data, size_t n) {
    if (o->std) {
        if (n && fwrite(data, 1, n, stdout) != n) return output_fail(o, MW_ERR_IO, strerror(errno));
        return MW_OK;
    }
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(o->fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return output_fail(o, MW_ERR_IO, w < 0 ? strerror(errno) : "nothing written");
        p += w;
        n -= (size_t)w;
    }
    return MW_OK;
}

static mw_status flush_out(mw_output *o) {
    mw_status st = o->failed ? mw__error_copy(o->failed, o->msg) : write_out(o, o->buf, o->used);
    o->used = 0;
    return st;
}

static void output_free(mw_output *o) {
    if (o->fd >= 0) close(o->fd);
    mw__free(o->path);
    mw__free(o->tmp);
    mw__free(o->buf);
    mw__free(o);
}

mw_status mw_output_open(const char *path, const char *what, unsigned flags, mw_output **out) {
    if (out) *out = NULL;
    if (!path || !out) return mw__error(MW_ERR_INVALID, "mw_output_open: NULL argument");
    if (!what) what = "file";
    if (!*path) return mw__error(MW_ERR_INVALID, "%s: an empty file name: give a path", what);
    mw_output *o = mw__calloc(1, sizeof *o);
    if (!o) return mw__error(MW_ERR_NOMEM, "out of memory writing %s", path);
    o->fd = -1;
    snprintf(o->what, sizeof o->what, "%s", what);
    if ((flags & MW_FILE_STDIO) && strcmp(path, "-") == 0) {
        o->std = 1;
        *out = o;
        return MW_OK;
    }
    /* Through a symbolic link the file it names is written; the link stays. */
    struct stat sb;
    char *target = NULL;
    mw_status st = MW_OK;
    if (lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode)) {
        char *real = realpath(path, NULL);
        if (!real)
            st = mw__error(MW_ERR_IO,
                           "cannot write %s %s: it is a symbolic link to a missing file (give "
                           "the path of the file to write)",
                           what, path);
        else if (!(target = mw__malloc(strlen(real) + 1)))
            st = mw__error(MW_ERR_NOMEM, "out of memory writing %s", path);
        else
            strcpy(target, real);
        free(real);
    } else if (!(target = mw__malloc(strlen(path) + 1))) {
        st = mw__error(MW_ERR_NOMEM, "out of memory writing %s", path);
    } else {
        strcpy(target, path);
    }
    o->path = target;
    if (!st) st = mw__file_replaceable(target, what);
    if (!st && !(o->buf = mw__malloc(OUT_BUFFER)))
        st = mw__error(MW_ERR_NOMEM, "out of memory writing %s", path);
    if (!st && !(o->tmp = temp_name(target)))
        st = mw__error(MW_ERR_NOMEM, "out of memory writing %s", path);
    if (!st) {
        /* The new file keeps the permissions of the one it replaces. */
        int replaces = stat(target, &sb) == 0;
        mode_t mode = replaces ? (sb.st_mode & 07777) : 0666;
        o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
        if (o->fd < 0)
            st = mw__error(MW_ERR_IO, "cannot create %s (for %s %s): %s", o->tmp, what, path,
                           strerror(errno));
        else if (replaces)
            (void)fchmod(o->fd, mode);
    }
    if (st) {
        output_free(o);
        return st;
    }
    *out = o;
    return MW_OK;
}

mw_status mw_output_write(mw_output *o, const void *data, size_t n) {
    if (!o || (n && !data)) return mw__error(MW_ERR_INVALID, "mw_output_write: NULL argument");
    if (o->failed) return mw__error_copy(o->failed, o->msg);
    if (n == 0) return MW_OK;
    if (o->std) return write_out(o, data, n);
    if (o->used + n > OUT_BUFFER) {
        mw_status st = flush_out(o);
        if (st) return st;
        if (n >= OUT_BUFFER) return write_out(o, data, n);
    }
    memcpy(o->buf + o->used, data, n);
    o->used += n;
    return MW_OK;
}

mw_status mw_output_printf(mw_output *o, const char *fmt, ...) {
    if (!o || !fmt) return mw__error(MW_ERR_INVALID, "mw_output_printf: NULL argument");
    char small[1024];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (len < 0) return output_fail(o, MW_ERR_INVALID, "a format that cannot be printed");
    if ((size_t)len < sizeof small) return mw_output_write(o, small, (size_t)len);
    char *big = mw__malloc((size_t)len + 1);
    if (!big) return output_fail(o, MW_ERR_NOMEM, "out of memory");
    va_start(ap, fmt);
    vsnprintf(big, (size_t)len + 1, fmt, ap);
    va_end(ap);
    mw_status st = mw_output_write(o, big, (size_t)len);
    mw__free(big);
    return st;
}

/* The folder's entry for the new name is on the disk too (best effort: not every file system
 * syncs a folder). */
static void sync_folder(const char *path) {
    char dir[4096];
    if (mw__file_folder(path, dir, sizeof dir) != 0) return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    (void)fsync(fd);
    close(fd);
}

mw_status mw_output_sync(mw_output *o) {
    if (!o) return mw__error(MW_ERR_INVALID, "mw_output_sync: NULL argument");
    mw_status st = flush_out(o);
    if (!st && o->std && fflush(stdout) != 0) st = output_fail(o, MW_ERR_IO, strerror(errno));
    if (!st && !o->std && fsync(o->fd) != 0) st = output_fail(o, MW_ERR_IO, strerror(errno));
    return st;
}

mw_status mw_output_commit(mw_output *o) {
    if (!o) return mw__error(MW_ERR_INVALID, "mw_output_commit: NULL argument");
    mw_status st = mw_output_sync(o);
    if (o->std) {
        output_free(o);
        return st;
    }
    int fd = o->fd;
    o->fd = -1;
    if (close(fd) != 0 && !st) st = output_fail(o, MW_ERR_IO, strerror(errno));
    /* The final name may have become a FIFO or a device since the open: never replaced. */
    if (!st) st = mw__file_replaceable(o->path, o->what);
    if (!st && rename(o->tmp, o->path) != 0) st = output_fail(o, MW_ERR_IO, strerror(errno));
    if (st) {
        unlink(o->tmp);
    } else {
        sync_folder(o->path);
        remove_stale(o->path);
    }
    output_free(o);
    return st;
}

void mw_output_abandon(mw_output *o) {
    if (!o) return;
    if (o->fd >= 0) {
        close(o->fd);
        o->fd = -1;
        unlink(o->tmp);
    }
    if (o->std) fflush(stdout);
    output_free(o);
}
