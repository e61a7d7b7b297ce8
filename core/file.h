/* Internal: the file discipline (meshwit/file.h) as the library's own readers and writers use
 * it: inputs opened without blocking and refused by kind before a byte is read; outputs written
 * beside their final name and renamed when complete, never over what is not a regular file the
 * process may replace. */
#ifndef MW_CORE_FILE_H
#define MW_CORE_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "meshwit/file.h"
#include "meshwit/status.h"

/* "a directory", "a FIFO", "a character device", ... for a st_mode that is not a regular file. */
const char *mw__file_kind(mode_t mode);

/* The one message for an empty file name: MW_ERR_INVALID, "--save: an empty file name: give a
 * path" (what NULL: "an empty file name: give a path"). */
mw_status mw__file_empty_name(const char *what);

/* Opens path read-only without blocking (a FIFO without a writer would block in fopen) and
 * checks that it is a regular file; the descriptor (blocking again) to *fd, its size to *size.
 * what names the file in messages ("checkpoint", "--data"; NULL: the path alone). MW_ERR_IO
 * otherwise, with the path and what it is. */
mw_status mw__file_open_read(const char *path, const char *what, int *fd, int64_t *size);

/* Reads exactly n bytes at offset at of fd (retrying short reads and EINTR); MW_ERR_IO naming
 * path when the file ends first or a read fails. */
mw_status mw__file_read_at(int fd, void *buf, size_t n, int64_t at, const char *path);

/* The whole of a regular file (opened as mw__file_open_read opens it) into *data (mw__malloc'ed,
 * one byte more than *size, which holds a NUL); MW_ERR_FORMAT when it is larger than max bytes,
 * MW_ERR_IO, MW_ERR_NOMEM. */
mw_status mw__file_read_all(const char *path, const char *what, size_t max, char **data,
                            size_t *size);

/* The file an output named path writes, into *target (mw__malloc'ed, the caller frees it):
 * path itself, or through a symbolic link the file it names (its real path). Refused with
 * MW_ERR_IO: a link to a missing file, and a link in a sticky world-writable folder (/tmp) that
 * neither the effective user nor the folder's owner owns (someone else's link: following it
 * would write a file of the link owner's choosing). MW_ERR_NOMEM. */
mw_status mw__file_target(const char *path, const char *what, char **target);

/* Whether a file written to a temporary name may be renamed over path (a target, links already
 * followed): absent, or a regular file that the effective user may replace. MW_ERR_IO naming
 * path and why otherwise: not a regular file (a rename would put a regular file in place of the
 * FIFO, device, socket or folder); read-only (no write permission bit at all: refused for root
 * too), or not writable by the effective user (faccessat with AT_EACCESS); owned by another user
 * in a sticky folder (the rename would fail with EPERM); or a name that cannot be looked up
 * (too long, a component that is not a folder, no permission to search the folder). */
mw_status mw__file_replaceable(const char *path, const char *what);

/* Creates, exclusively and with mode (less the umask), a temporary file beside target in its
 * folder: ".<at most 32 bytes of target's name>.tmp-mw-<writer>-<pid>-<n>", where <writer>
 * names this kernel's boot and process namespace (16 hex digits) and n counts this process's
 * temporary files. The name never grows with target's, so a final name that fits its folder
 * has a temporary one that fits too. *fd the open descriptor, *name its path (mw__malloc'ed).
 * MW_ERR_IO naming target and its folder ("No such file or directory", "Permission denied",
 * "Read-only file system"), MW_ERR_NOMEM. */
mw_status mw__file_temp_create(const char *target, const char *what, mode_t mode, int *fd,
                               char **name);

/* The folder of path ("." for a bare name, "/" for a name in the root) into dir; -1 when it
 * does not fit. */
int mw__file_folder(const char *path, char *dir, size_t size);

#endif
