/* A run's files (meshwit/file.h): every input and output, each output checked against all of
 * them and against its file system before the work starts. Writing is file.c. */
#define _DEFAULT_SOURCE /* realpath */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/file.h"

/* "what path", or "path" when what is empty, for messages: three %s. */
#define NAMED(w, p) *(w) ? (w) : "", *(w) ? " " : "", (p)

/* One file of the run: an existing one is known by device and inode (so "./a", a symbolic link
 * and a hard link to it are it), an output that does not exist yet by its folder's real path
 * and its name. An output's room: the file system of its folder and the bytes it needs. */
typedef struct entry {
    char *what, *path, *canon; /* what: "" when not given; canon: NULL when the file exists */
    int output, exists;
    dev_t dev;
    ino_t ino;
    dev_t fs;
    int64_t bytes;
} entry;

struct mw_file_set {
    entry *e;
    int n, cap;
};

mw_status mw_file_set_new(mw_file_set **out) {
    if (!out) return mw__error(MW_ERR_INVALID, "mw_file_set_new: NULL argument");
    *out = mw__calloc(1, sizeof **out);
    return *out ? MW_OK : mw__error(MW_ERR_NOMEM, "out of memory for a run's files");
}

static void entry_free(entry *e) {
    mw__free(e->what);
    mw__free(e->path);
    mw__free(e->canon);
    e->what = e->path = e->canon = NULL;
}

void mw_file_set_free(mw_file_set *set) {
    if (!set) return;
    for (int i = 0; i < set->n; i++) entry_free(&set->e[i]);
    mw__free(set->e);
    mw__free(set);
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
static mw_status conflicts(const mw_file_set *set, const entry *e) {
    for (int i = 0; i < set->n; i++) {
        const entry *o = &set->e[i];
        if ((!o->output && !e->output) || !same(o, e)) continue;
        if (o->output && e->output)
            return *o->what && *e->what
                       ? mw__error(MW_ERR_INVALID,
                                   "%s and %s name the same file %s: give each its own", o->what,
                                   e->what, e->path)
                       : mw__error(MW_ERR_INVALID,
                                   "outputs %s and %s are the same file: give each its own",
                                   o->path, e->path);
        const entry *out = e->output ? e : o, *in = e->output ? o : e;
        return mw__error(MW_ERR_INVALID,
                         "%s%s%s is also %s%s%s: writing it would destroy an input (name another "
                         "file)",
                         NAMED(out->what, out->path), NAMED(in->what, in->path));
    }
    return MW_OK;
}

/* Appends e, taking its strings; checked by the caller. MW_ERR_NOMEM (e freed). */
static mw_status append(mw_file_set *set, entry *e) {
    if (set->n == set->cap) {
        int cap = set->cap ? 2 * set->cap : 8;
        entry *grown = mw__realloc(set->e, (size_t)cap * sizeof *grown);
        if (!grown) {
            entry_free(e);
            return mw__error(MW_ERR_NOMEM, "out of memory for a run's files");
        }
        set->e = grown;
        set->cap = cap;
    }
    set->e[set->n++] = *e;
    return MW_OK;
}

static mw_status nomem(entry *e) {
    entry_free(e);
    return mw__error(MW_ERR_NOMEM, "out of memory for a run's files");
}

mw_status mw_file_set_add_input(mw_file_set *set, const char *path, const char *what,
                                unsigned flags) {
    if (!set || !path) return mw__error(MW_ERR_INVALID, "mw_file_set_add_input: NULL argument");
    if (!*path) return mw__file_empty_name(what);
    struct stat sb;
    int std = (flags & MW_FILE_STDIO) && strcmp(path, "-") == 0;
    int known = std ? fstat(0, &sb) == 0 && S_ISREG(sb.st_mode) : 1;
    if (!std && stat(path, &sb) != 0)
        return mw__error(MW_ERR_IO, "cannot open %s%s%s: %s", what ? what : "", what ? " " : "",
                         path, strerror(errno));
    if (!std && !S_ISREG(sb.st_mode))
        return mw__error(MW_ERR_IO, "cannot read %s%s%s: it is %s, not a regular file",
                         what ? what : "", what ? " " : "", path, mw__file_kind(sb.st_mode));
    entry e = {.what = copy(what ? what : ""), .path = copy(std ? "- (standard input)" : path)};
    if (!e.what || !e.path || (known && identify(&e, path, &sb) != 0)) return nomem(&e);
    /* A pipe or a terminal: nothing an output could be. */
    if (!known && !(e.canon = copy("-stdin"))) return nomem(&e);
    mw_status st = conflicts(set, &e);
    if (st) {
        entry_free(&e);
        return st;
    }
    return append(set, &e);
}

/* Whether the folder takes the output's temporary file: one is created, with the very name
 * pattern mw_output_open uses, and removed (permissions alone do not say it: root ignores
 * them, a read-only mount does not show in them, and the name must fit the folder). */
static mw_status folder_takes_a_file(const char *what, const char *target) {
    int fd;
    char *name;
    mw_status st = mw__file_temp_create(target, what, 0600, &fd, &name);
    if (st) return st;
    close(fd);
    unlink(name);
    mw__free(name);
    return MW_OK;
}

/* A size for messages: "432 bytes", "64.0 kB", "1.5 MB", "4.6 GB". */
static const char *size_text(double bytes, char *buf, size_t size) {
    if (bytes < 1e3)
        snprintf(buf, size, "%.0f bytes", bytes);
    else
        snprintf(buf, size, "%.1f %s",
                 bytes < 1e6   ? bytes / 1e3
                 : bytes < 1e9 ? bytes / 1e6
                               : bytes / 1e9,
                 bytes < 1e6   ? "kB"
                 : bytes < 1e9 ? "MB"
                               : "GB");
    return buf;
}

/* Whether the folder's file system holds e's bytes and those of the outputs added before on
 * it: every temporary file is complete before any old file goes. */
static mw_status room(const mw_file_set *set, entry *e, const char *target) {
    char dir[4096], need[32], all[32], avail[32];
    struct stat db;
    struct statvfs vf;
    if (mw__file_folder(target, dir, sizeof dir) != 0 || stat(dir, &db) != 0 ||
        statvfs(dir, &vf) != 0)
        return MW_OK; /* nothing to ask: the writes will say it */
    e->fs = db.st_dev;
    double others = 0;
    for (int i = 0; i < set->n; i++)
        if (set->e[i].output && set->e[i].bytes > 0 && set->e[i].fs == e->fs)
            others += (double)set->e[i].bytes;
    double total = (double)e->bytes + others;
    double free_bytes = (double)vf.f_bavail * (double)vf.f_frsize;
    if (total <= free_bytes) return MW_OK;
    size_text((double)e->bytes, need, sizeof need);
    size_text(free_bytes, avail, sizeof avail);
    if (others > 0)
        return mw__error(MW_ERR_IO,
                         "%s%s%s needs %s, with the run's other outputs on its file system %s in "
                         "all, and %s has %s free",
                         NAMED(e->what, e->path), need, size_text(total, all, sizeof all), dir,
                         avail);
    return mw__error(MW_ERR_IO, "%s%s%s needs %s, and %s has %s free", NAMED(e->what, e->path),
                     need, dir, avail);
}

mw_status mw_file_set_add_output(mw_file_set *set, const char *path, const char *what,
                                 unsigned flags, int64_t bytes) {
    if (!set || !path) return mw__error(MW_ERR_INVALID, "mw_file_set_add_output: NULL argument");
    if (!*path) return mw__file_empty_name(what);
    struct stat sb;
    entry e = {.output = 1, .bytes = bytes > 0 ? bytes : 0};
    char *target = NULL;
    mw_status st = (e.what = copy(what ? what : "")) ? MW_OK : nomem(&e);
    if (!st && (flags & MW_FILE_STDIO) && strcmp(path, "-") == 0) {
        /* Standard output redirected to a file: that file must be no input either. */
        int known = fstat(1, &sb) == 0 && S_ISREG(sb.st_mode);
        e.bytes = 0;
        if (!(e.path = copy("- (standard output)")) ||
            (known ? identify(&e, path, &sb) != 0 : !(e.canon = copy("-stdout"))))
            st = nomem(&e);
        if (!st) st = conflicts(set, &e);
    } else if (!st) {
        st = mw__file_target(path, what, &target);
        if (!st) st = mw__file_replaceable(target, what);
        if (!st && (!(e.path = copy(path)) ||
                    identify(&e, target, stat(target, &sb) == 0 ? &sb : NULL) != 0))
            st = nomem(&e);
        if (!st) st = conflicts(set, &e);
        if (!st) st = folder_takes_a_file(what, target);
        if (!st && e.bytes > 0) st = room(set, &e, target);
        mw__free(target);
    }
    if (st) {
        entry_free(&e);
        return st;
    }
    return append(set, &e);
}
