/* The file discipline (meshwit/file.h): opening inputs without blocking, writing outputs beside
 * their final name and renaming them when complete. The run's set of files, checked before the
 * work, is files.c. */
#define _DEFAULT_SOURCE /* realpath, gethostname */
#include "core/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
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
#include "core/hash.h"

#define OUT_BUFFER (1u << 16)
#define TEMP_KEEP 32         /* bytes of the final name kept in a temporary file's name */
#define TEMP_MARK ".tmp-mw-" /* then "<writer>-<pid>-<n>" */

/* "what path", or "path" when what is NULL or empty, for messages: three %s. */
#define NAMED(w, p) (w) && *(w) ? (w) : "", (w) && *(w) ? " " : "", (p)

const char *mw__file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

mw_status mw__file_empty_name(const char *what) {
    return mw__error(MW_ERR_INVALID, "%s%san empty file name: give a path", what ? what : "",
                     what ? ": " : "");
}

int mw__file_folder(const char *path, char *dir, size_t n) {
    const char *slash = strrchr(path, '/');
    int len = !slash          ? snprintf(dir, n, ".")
              : slash == path ? snprintf(dir, n, "/")
                              : snprintf(dir, n, "%.*s", (int)(slash - path), path);
    return len < 0 || (size_t)len >= n ? -1 : 0;
}

static char *copy(const char *s) {
    char *c = mw__malloc(strlen(s) + 1);
    if (c) strcpy(c, s);
    return c;
}

/* --- inputs ----------------------------------------------------------------------------------- */

mw_status mw__file_open_read(const char *path, const char *what, int *fd, int64_t *size) {
    *fd = -1;
    *size = 0;
    int d = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (d < 0)
        return mw__error(MW_ERR_IO, "cannot open %s%s%s: %s", NAMED(what, path), strerror(errno));
    struct stat sb;
    mw_status st = MW_OK;
    if (fstat(d, &sb) != 0)
        st = mw__error(MW_ERR_IO, "cannot read %s%s%s: %s", NAMED(what, path), strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        st = mw__error(MW_ERR_IO, "cannot read %s%s%s: it is %s, not a regular file",
                       NAMED(what, path), mw__file_kind(sb.st_mode));
    else if (fcntl(d, F_SETFL, fcntl(d, F_GETFL) & ~O_NONBLOCK) != 0)
        st = mw__error(MW_ERR_IO, "cannot read %s%s%s: %s", NAMED(what, path), strerror(errno));
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
                       NAMED(what, path), (long long)n, max);
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
    if (!*path) return mw__file_empty_name(what);
    int fd;
    int64_t n = -1;
    mw_status st = MW_OK;
    if ((flags & MW_FILE_STDIO) && strcmp(path, "-") == 0) {
        /* A descriptor of its own, so that every stream this returns is closed the same way. */
        if ((fd = fcntl(0, F_DUPFD_CLOEXEC, 0)) < 0)
            return mw__error(MW_ERR_IO, "cannot read %s%sstandard input: %s", what ? what : "",
                             what ? " " : "", strerror(errno));
    } else if ((st = mw__file_open_read(path, what, &fd, &n)) != MW_OK) {
        return st;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        return e == ENOMEM
                   ? mw__error(MW_ERR_NOMEM, "out of memory opening %s", path)
                   : mw__error(MW_ERR_IO, "cannot read %s%s%s: %s", NAMED(what, path), strerror(e));
    }
    *out = f;
    if (size) *size = n;
    return MW_OK;
}

/* --- outputs ---------------------------------------------------------------------------------- */

mw_status mw__file_target(const char *path, const char *what, char **target) {
    *target = NULL;
    struct stat sb, db;
    char dir[4096];
    char *real = NULL;
    if (lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode)) {
        /* Someone else's link in /tmp names a file of their choosing (the kernel's
         * protected_symlinks rule, applied whatever the system's setting). */
        if (mw__file_folder(path, dir, sizeof dir) == 0 && stat(dir, &db) == 0 &&
            (db.st_mode & S_ISVTX) && (db.st_mode & S_IWOTH) && sb.st_uid != geteuid() &&
            sb.st_uid != db.st_uid)
            return mw__error(MW_ERR_IO,
                             "%s%s%s is a symbolic link that another user (uid %u) owns, in the "
                             "sticky folder %s: not followed; name the file itself",
                             NAMED(what, path), (unsigned)sb.st_uid, dir);
        if (!(real = realpath(path, NULL)))
            return errno == ENOENT
                       ? mw__error(MW_ERR_IO,
                                   "%s%s%s is a symbolic link to a missing file: give the path "
                                   "of the file to write",
                                   NAMED(what, path))
                       : mw__error(MW_ERR_IO,
                                   "%s%s%s is a symbolic link that cannot be followed: %s",
                                   NAMED(what, path), strerror(errno));
    }
    *target = copy(real ? real : path);
    free(real);
    return *target ? MW_OK : mw__error(MW_ERR_NOMEM, "out of memory writing %s", path);
}

mw_status mw__file_replaceable(const char *path, const char *what) {
    struct stat sb, db;
    if (stat(path, &sb) != 0) {
        if (errno == ENOENT) return MW_OK; /* absent (or in a missing folder: said on creation) */
        return mw__error(MW_ERR_IO, "cannot write %s%s%s: %s", NAMED(what, path), strerror(errno));
    }
    if (!S_ISREG(sb.st_mode)) /* a FIFO, a device, a folder: never replaced */
        return mw__error(MW_ERR_IO,
                         "%s%s%s exists and is %s, not a regular file: not replaced (a rename "
                         "would put a regular file in its place); name a regular file",
                         NAMED(what, path), mw__file_kind(sb.st_mode));
    unsigned mode = (unsigned)(sb.st_mode & 07777);
    if ((sb.st_mode & 0222) == 0)
        return mw__error(MW_ERR_IO,
                         "%s%s%s is read-only (mode %04o): not replaced; make it writable "
                         "(chmod u+w) or name another file",
                         NAMED(what, path), mode);
    if (faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) != 0)
        return mw__error(MW_ERR_IO,
                         "%s%s%s cannot be replaced: %s (mode %04o, owner uid %u); name another "
                         "file",
                         NAMED(what, path), strerror(errno), mode, (unsigned)sb.st_uid);
    /* In a sticky folder only the file's owner, the folder's or root may rename over it. */
    char dir[4096];
    uid_t me = geteuid();
    if (me != 0 && sb.st_uid != me && mw__file_folder(path, dir, sizeof dir) == 0 &&
        stat(dir, &db) == 0 && (db.st_mode & S_ISVTX) && db.st_uid != me)
        return mw__error(MW_ERR_IO,
                         "%s%s%s belongs to another user (uid %u) in the sticky folder %s: it "
                         "cannot be replaced; name another file",
                         NAMED(what, path), (unsigned)sb.st_uid, dir);
    return MW_OK;
}

/* This writer's kernel boot and process namespace, as 16 hex digits: a process id in a
 * temporary file's name means a process of this namespace exactly when the digits are these
 * (host names repeat across containers; a boot id does not, nor a namespace within a boot). */
static char writer[17];

static void writer_init(void) {
    uint64_t h = MW__FNV_BASIS;
    char buf[256];
    ssize_t n = 0;
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        n = read(fd, buf, sizeof buf);
        close(fd);
    }
    if (n > 0) h = mw__fnv1a(h, buf, (size_t)n);
    n = readlink("/proc/self/ns/pid", buf, sizeof buf);
    if (n > 0) h = mw__fnv1a(h, buf, (size_t)n);
    if (gethostname(buf, sizeof buf) == 0) h = mw__fnv1a(h, buf, strnlen(buf, sizeof buf));
    snprintf(writer, sizeof writer, "%016llx", (unsigned long long)h);
}

static const char *writer_id(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, writer_init);
    return writer;
}

mw_status mw__file_temp_create(const char *target, const char *what, mode_t mode, int *fd,
                               char **name) {
    static _Atomic unsigned counter;
    *fd = -1;
    *name = NULL;
    const char *slash = strrchr(target, '/');
    const char *base = slash ? slash + 1 : target;
    size_t folder = (size_t)(base - target), keep = strlen(base);
    if (keep > TEMP_KEEP) {
        keep = TEMP_KEEP;
        while (keep > 0 && ((unsigned char)base[keep] & 0xC0) == 0x80) keep--; /* whole UTF-8 */
    }
    size_t size = folder + keep + 80;
    char *tmp = mw__malloc(size);
    if (!tmp) return mw__error(MW_ERR_NOMEM, "out of memory writing %s", target);
    for (int tries = 0;; tries++) {
        snprintf(tmp, size, "%.*s.%.*s" TEMP_MARK "%s-%ld-%u", (int)folder, target, (int)keep, base,
                 writer_id(), (long)getpid(), atomic_fetch_add(&counter, 1));
        *fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
        if (*fd >= 0) break;
        if (errno == EEXIST && tries < 100) continue; /* a name this process's counter reused */
        int e = errno;
        char dir[4096];
        if (mw__file_folder(target, dir, sizeof dir) != 0) snprintf(dir, sizeof dir, "its folder");
        mw_status st =
            mw__error(MW_ERR_IO, "%s%s%s cannot be written: cannot create a file in %s: %s",
                      NAMED(what, target), dir, strerror(e));
        mw__free(tmp);
        return st;
    }
    *name = tmp;
    return MW_OK;
}

/* Folders this process has swept of dead writers' temporary files: each once, at its first
 * commit (a folder of many files is not read again at every checkpoint). */
static pthread_mutex_t swept_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    dev_t dev;
    ino_t ino;
} swept[64];
static int nswept;

/* Whether name is a temporary file of a writer of this namespace, other than this process, that
 * no longer runs: ".<kept>" TEMP_MARK "<writer>-<pid>-<n>", exactly. */
static int dead_writers(const char *name) {
    if (name[0] != '.') return 0;
    const char *mark = NULL;
    for (const char *p = name; (p = strstr(p, TEMP_MARK)); p++) mark = p;
    if (!mark) return 0;
    const char *id = mark + strlen(TEMP_MARK);
    if (strncmp(id, writer_id(), 16) != 0 || id[16] != '-') return 0;
    const char *p = id + 17, *digits = p;
    long pid = 0;
    for (; *p >= '0' && *p <= '9' && pid < INT_MAX / 10; p++) pid = pid * 10 + (*p - '0');
    if (p == digits || *p != '-' || pid <= 0) return 0;
    for (digits = ++p; *p >= '0' && *p <= '9'; p++) continue;
    if (p == digits || *p) return 0;
    if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) return 0;
    return 1;
}

/* Removes temporary files in target's folder that writers of this namespace which no longer run
 * left (a process killed while writing): regular files of this user whose names have the exact
 * pattern, never another name. Best effort, once per folder and process. */
static void remove_stale(const char *target) {
    char dir[4096];
    struct stat db;
    if (mw__file_folder(target, dir, sizeof dir) != 0 || stat(dir, &db) != 0) return;
    pthread_mutex_lock(&swept_mu);
    int seen = 0;
    for (int i = 0; i < nswept && !seen; i++)
        seen = swept[i].dev == db.st_dev && swept[i].ino == db.st_ino;
    if (!seen && nswept < (int)(sizeof swept / sizeof swept[0])) {
        swept[nswept].dev = db.st_dev;
        swept[nswept++].ino = db.st_ino;
    } else {
        seen = 1;
    }
    pthread_mutex_unlock(&swept_mu);
    if (seen) return;
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        char full[8192];
        struct stat sb;
        if (!dead_writers(e->d_name) ||
            snprintf(full, sizeof full, "%s/%s", dir, e->d_name) >= (int)sizeof full)
            continue;
        if (lstat(full, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_uid == geteuid()) unlink(full);
    }
    closedir(d);
}

struct mw_output {
    int std;          /* writes standard output in place */
    int fd;           /* the temporary file while open, else -1 */
    char *path, *tmp; /* the final name (through symbolic links) and the temporary one */
    char what[64];    /* the role, for messages ("--save"; empty: none) */
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
            snprintf(o->msg, sizeof o->msg, "cannot write %s%sstandard output: %s", o->what,
                     *o->what ? " to " : "", cause);
        else
            snprintf(o->msg, sizeof o->msg, "cannot write %s%s%s: %s (%s is as it was)",
                     NAMED(o->what, o->path), cause, o->path);
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
    if (!*path) return mw__file_empty_name(what);
    mw_output *o = mw__calloc(1, sizeof *o);
    if (!o) return mw__error(MW_ERR_NOMEM, "out of memory writing %s", path);
    o->fd = -1;
    snprintf(o->what, sizeof o->what, "%s", what ? what : "");
    if ((flags & MW_FILE_STDIO) && strcmp(path, "-") == 0) {
        o->std = 1;
        *out = o;
        return MW_OK;
    }
    mw_status st = mw__file_target(path, what, &o->path);
    if (!st) st = mw__file_replaceable(o->path, what);
    if (!st && !(o->buf = mw__malloc(OUT_BUFFER)))
        st = mw__error(MW_ERR_NOMEM, "out of memory writing %s", path);
    if (!st) {
        /* The new file keeps the permission bits of the one it replaces (not its owner, group,
         * set-id or sticky bits). */
        struct stat sb;
        int replaces = stat(o->path, &sb) == 0;
        mode_t mode = replaces ? (sb.st_mode & 0777) : 0666;
        st = mw__file_temp_create(o->path, what, mode, &o->fd, &o->tmp);
        if (!st && replaces) (void)fchmod(o->fd, mode);
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
    /* The final name may have become a FIFO, a device or read-only since the open: never
     * replaced then. */
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
