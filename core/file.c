#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

const char *mw__file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

mw_status mw__file_open_read(const char *path, const char *what, int *fd, int64_t *size) {
    *fd = -1;
    *size = 0;
    int d = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (d < 0) return mw__error(MW_ERR_IO, "cannot open %s %s: %s", what, path, strerror(errno));
    struct stat sb;
    mw_status st = MW_OK;
    if (fstat(d, &sb) != 0)
        st = mw__error(MW_ERR_IO, "cannot read %s %s: %s", what, path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        st = mw__error(MW_ERR_IO, "cannot read %s %s: it is %s, not a regular file", what, path,
                       mw__file_kind(sb.st_mode));
    else if (fcntl(d, F_SETFL, fcntl(d, F_GETFL) & ~O_NONBLOCK) != 0)
        st = mw__error(MW_ERR_IO, "cannot read %s %s: %s", what, path, strerror(errno));
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

mw_status mw__file_replaceable(const char *path, const char *what) {
    struct stat sb;
    if (stat(path, &sb) != 0 || S_ISREG(sb.st_mode)) return MW_OK; /* absent, or replaceable */
    return mw__error(MW_ERR_IO, "cannot write %s %s: it is %s, not a regular file (not replaced)",
                     what, path, mw__file_kind(sb.st_mode));
}
