/* Internal: the file discipline (meshwit/file.h) as the library's own readers and writers use
 * it: inputs opened without blocking and refused by kind before a byte is read; outputs written
 * beside their final name and renamed when complete, never over what is not a regular file. */
#ifndef MW_CORE_FILE_H
#define MW_CORE_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "meshwit/file.h"
#include "meshwit/status.h"

/* "a directory", "a FIFO", "a character device", ... for a st_mode that is not a regular file. */
const char *mw__file_kind(mode_t mode);

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

/* Whether a file written to a temporary name may be renamed over path: absent or a regular file
 * (a symbolic link to one counts as one). MW_ERR_IO naming path and what it is otherwise: a
 * rename would put a regular file in place of the FIFO, device or socket. */
mw_status mw__file_replaceable(const char *path, const char *what);

/* The folder of path ("." for a bare name, "/" for a name in the root) into dir; -1 when it
 * does not fit. */
int mw__file_folder(const char *path, char *dir, size_t size);

#endif
