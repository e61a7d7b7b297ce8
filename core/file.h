/* Files the library reads and replaces: opened without blocking, refused by kind before a
 * byte is read or written. */
#ifndef MW_CORE_FILE_H
#define MW_CORE_FILE_H

#include <stdint.h>
#include <sys/types.h>

#include "meshwit/status.h"

/* "a directory", "a FIFO", "a character device", ... for a st_mode that is not a regular file. */
const char *mw__file_kind(mode_t mode);

/* Opens path read-only without blocking (a FIFO without a writer would block in fopen) and
 * checks that it is a regular file; the descriptor (blocking again) to *fd, its size to *size.
 * what names the file in messages ("checkpoint", "safetensors file"). MW_ERR_IO otherwise, with
 * the path and what it is. */
mw_status mw__file_open_read(const char *path, const char *what, int *fd, int64_t *size);

/* Reads exactly n bytes at offset at of fd (retrying short reads and EINTR); MW_ERR_IO naming
 * path when the file ends first or a read fails. */
mw_status mw__file_read_at(int fd, void *buf, size_t n, int64_t at, const char *path);

/* Whether a file written to a temporary name may be renamed over path: absent or a regular file
 * (a symbolic link to one counts as one). MW_ERR_IO naming path and what it is otherwise: a
 * rename would put a regular file in place of the FIFO, device or socket. */
mw_status mw__file_replaceable(const char *path, const char *what);

#endif
