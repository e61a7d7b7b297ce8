/* A run's files (meshwit/file.h): every input and output, each output checked against all of
 * them and against its file system before the work starts. Writing is file.c. */
#define _DEFAULT_SOURCE /* realpath */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/file.h"

/* One file of the run: an existing one is known by device and inode (so "./a", a symbolic link
 * and a hard link to it are it), an output that does not exist yet by its folder's real path
 * and its name. */
typedef struct entry {
    char *what, *path, *canon; /* canon: NULL when the file exists */
    int output, exists;
    dev_t dev;
    ino_t ino;
} entry;

struct mw_files {
    entry *e;
    int n, cap;
};

mw_status mw_files_new(mw_files **out) {
    if (!out) return mw__error(MW_ERR_INVALID, "mw_files_new: NULL argument");
    *out = mw__calloc(1, sizeof **out);
    return *out ? MW_OK : mw__error(MW_ERR_NOMEM, "out of memory for a run's files");
}

static void entry_free(entry *e) {
    mw__free(e->what);
    mw__free(e->path);
    mw__free(e->canon);
}

void mw_files_free(mw_files *fs) {
    if (!fs) return;
    for (int i = 0; i < fs->n; i++) entry_free(&fs->e[i]);
    mw__free(fs->e);
    mw__free(fs);
}

static char *copy(const char *s) {
    char *c = mw__malloc(strlen(s) + 1);
    if (c) strcpy(c, s);
    return c;
}

/* The canonical name of a file that does not exist: its folder's real path and its name. */
static char *canonical(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    char *real = mw__file_folder(path, dir, sizeof dir) == 0 ? realpath(dir, NULL) : NULL;
    if (!real) return copy(path);
    size_t n = strlen(real) + strlen(base) + 2;
    char *c = mw__malloc(n);
    if (c) snprintf(c, n, "%s/%s", real, base);
    free(real);
    return c;
}

/* Fills e's identity from sb (the file exists) or from its name; -1 when out of memory. */
static int identify(entry *e, const char *path, const struct stat *sb) {
    if (sb) {
        e->exists = 1;
        e->dev = sb->st_dev;
        e->ino = sb->st_ino;
        return 0;
    }
    return (e->canon = canonical(path)) ? 0 : -1;
}

static int same(const entry *a, const entry *b) {
    if (a->exists && b->exists) return a->dev == b->dev && a->ino == b->ino;
    if (a->exists || b->exists) return 0;
    return a->canon && b->canon && strcmp(a->canon, b->canon) == 0;
}

/* A conflict of the new entry e with one of the set: MW_ERR_INVALID naming both, or MW_OK. */
static mw_status conflicts(const mw_files *fs, const entry *e) {
    for (int i = 0; i < fs->n; i++) {
        const entry *o = &fs->e[i];
        if ((!o->output && !e->output) || !same(o, e)) continue;
        if (o->output && e->output)
            return mw__error(MW_ERR_INVALID, "%s and %s name the same file %s: give each its own",
                             o->what, e->what, e->path);
        const entry *out = e->output ? e : o, *in = e->output ? o : e;
        return mw__error(MW_ERR_INVALID,
                         "%s %s is also %s %s: writing it would destroy an input (name another "
                         "file)",
                         out->what, out->path, in->what, in->path);
    }
    return MW_OK;
}

/* Checks e against the set and appends it (taking its strings), or frees them. */
static mw_status add(mw_files *fs, entry *e) {
    mw_status st = conflicts(fs, e);
    if (!st && fs->n == fs->cap) {
        int cap = fs->cap ? 2 * fs->cap : 8;
        entry *grown = mw__realloc(fs->e, (size_t)cap * sizeof *grown);
        if (!grown) st = mw__error(MW_ERR_NOMEM, "out of memory for a run's files");
        if (grown) fs->e = grown, fs->cap = cap;
    }
    if (st) {
        entry_free(e);
        return st;
    }
    fs->e[fs->n++] = *e;
    return MW_OK;
}

static mw_status empty_name(const char *what) {
    return mw__error(MW_ERR_INVALID, "%s: an empty file name: give a path", what);
}

mw_status mw_files_input(mw_files *fs, const char *what, const char *path, unsigned flags) {
    if (!fs || !path) return mw__error(MW_ERR_INVALID, "mw_files_input: NULL argument");
    if (!what) what = "input";
    if (!*path) return empty_name(what);
    struct stat sb;
    int std = (flags & MW_FILE_STDIO) && strcmp(path, "-") == 0;
    int known = std ? fstat(0, &sb) == 0 && S_ISREG(sb.st_mode) : 1;
    if (!std && stat(path, &sb) != 0)
        return mw__error(MW_ERR_IO, "cannot open %s %s: %s", what, path, strerror(errno));
    if (!std && !S_ISREG(sb.st_mode) && !((flags & MW_FILE_FOLDER) && S_ISDIR(sb.st_mode)))
        return mw__error(MW_ERR_IO, "cannot read %s %s: it is %s, not a regular file", what, path,
                         mw__file_kind(sb.st_mode));
    entry e = {.what = copy(what), .path = copy(std ? "- (standard input)" : path)};
    if (!e.what || !e.path || (known && identify(&e, path, &sb) != 0)) {
        entry_free(&e);
        return mw__error(MW_ERR_NOMEM, "out of memory for a run's files");
    }
    if (!known) e.canon = copy("-stdin"); /* a pipe or a terminal: nothing an output could be */
    if (!known && !e.canon) {
        entry_free(&e);
        return mw__error(MW_ERR_NOMEM, "out of memory for a run's files");
    }
    return add(fs, &e);
}

/* Whether the folder takes a new file: one is created and removed (permissions alone do not
 * say it: root ignores them, a read-only mount does not show in them). */
static mw_status folder_takes_a_file(const char *what, const char *path, const char *dir) {
    static _Atomic unsigned counter;
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.mw-probe-%ld-%u", dir, (long)getpid(),
             atomic_fetch_add(&counter, 1));
    int fd = open(probe, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
    if (fd < 0)
        return mw__error(MW_ERR_IO, "%s %s cannot be written: cannot create a file in %s: %s", what,
                         path, dir, strerror(errno));
    close(fd);
    unlink(probe);
    return MW_OK;
}

mw_status mw_files_output(mw_files *fs, const char *what, const char *path, unsigned flags,
                          int64_t bytes) {
    if (!fs || !path) return mw__error(MW_ERR_INVALID, "mw_files_output: NULL argument");
    if (!what) what = "output";
    if (!*path) return empty_name(what);
    struct stat sb;
    if ((flags & MW_FILE_STDIO) && strcmp(path, "-") == 0) {
        /* Standard output redirected to a file: that file must be no input either. */
        int known = fstat(1, &sb) == 0 && S_ISREG(sb.st_mode);
        entry e = {.what = copy(what), .path = copy("- (standard output)"), .output = 1};
        if (e.what && e.path && !known) e.canon = copy("-stdout"); /* two of these: the same */
        if (!e.what || !e.path || (known ? identify(&e, path, &sb) != 0 : !e.canon)) {
            entry_free(&e);
            return mw__error(MW_ERR_NOMEM, "out of memory for a run's files");
        }
        return add(fs, &e);
    }
    char *target = NULL;
    if (lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode) && !(target = realpath(path, NULL)))
        return mw__error(MW_ERR_IO,
                         "%s %s is a symbolic link to a missing file: give the path of the file "
                         "to write",
                         what, path);
    const char *file = target ? target : path;
    int exists = stat(file, &sb) == 0;
    mw_status st = MW_OK;
    if (exists && !S_ISREG(sb.st_mode))
        st = mw__error(MW_ERR_IO,
                       "%s %s exists and is %s, not a regular file (writing would replace it "
                       "with one): name a regular file",
                       what, path, mw__file_kind(sb.st_mode));
    entry e = {.output = 1};
    if (!st && (!(e.what = copy(what)) || !(e.path = copy(path)) ||
                identify(&e, file, exists ? &sb : NULL) != 0))
        st = mw__error(MW_ERR_NOMEM, "out of memory for a run's files");
    if (!st) st = conflicts(fs, &e);
    char dir[4096];
    if (!st && mw__file_folder(file, dir, sizeof dir) != 0)
        st = mw__error(MW_ERR_INVALID, "%s %s: the path is too long", what, path);
    if (!st) st = folder_takes_a_file(what, path, dir);
    struct statvfs vf;
    if (!st && bytes > 0 && statvfs(dir, &vf) == 0 &&
        (double)vf.f_bavail * (double)vf.f_frsize < (double)bytes)
        st = mw__error(MW_ERR_IO, "%s %s needs %.1f MB, and %s has %.1f MB free", what, path,
                       (double)bytes / 1e6, dir, (double)vf.f_bavail * (double)vf.f_frsize / 1e6);
    free(target);
    if (st) {
        entry_free(&e);
        return st;
    }
    return add(fs, &e);
}
