/* meshwit: the files a program reads and writes, all through one discipline.
 *
 * Inputs are opened without blocking and checked for their kind before a byte is read: a FIFO
 * without a writer, a device or a folder named where a file is expected is an error, said at
 * once (a plain fopen of a FIFO waits for a writer forever).
 *
 * Outputs are checked before any work is done and written so that a file is either what it was
 * or the complete new one:
 *   - mw_files collects a run's inputs and outputs and refuses, as each is added, an output that
 *     is an input of the run (the same device and inode: also through "./name", a symbolic
 *     link or a hard link), that another output names too, that exists and is not a regular
 *     file (a FIFO, a device, a folder: a rename would replace it with a regular file), whose
 *     folder is missing or takes no new file (read-only, no permission), or that needs more
 *     room than its file system has free (when the size is known);
 *   - mw_output writes to a temporary file beside the final name
 *     ("<name>.tmp.<host>.<pid>.<n>"), which mw_output_commit flushes, syncs to the disk and
 *     renames over the final name only once it is complete. A failed write (a full disk) or an
 *     abandoned output removes the temporary file and leaves the final name as it was. An
 *     output named through a symbolic link writes the file the link names (the link stays).
 *   - "-" is standard output (or standard input, for an input) where the caller allows it
 *     (MW_FILE_STDIO): written in place, never replaced. No other non-regular output is written.
 *
 * Every function returns an mw_status and leaves a message naming the file, the flag or role
 * it was given as (`what`, e.g. "--save" or "checkpoint") and what is wrong; nothing is printed.
 * Errors: MW_ERR_INVALID (a NULL argument, an empty file name, two roles naming one file, an
 * output that is an input), MW_ERR_IO (a file that cannot be opened, read, created or written,
 * or that is not a regular file, or no room), MW_ERR_NOMEM.
 *
 * Thread-safety: the functions are reentrant; one mw_files or mw_output is used by one thread at
 * a time. Writers in several threads or processes may write one final name at once: each has
 * its own temporary file, and the last rename wins with a complete file. */
#ifndef MESHWIT_FILE_H
#define MESHWIT_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "meshwit/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "-" names standard input (an input) or standard output (an output). Without it "-" is a file
 * of that name. */
#define MW_FILE_STDIO 1u
/* An input that may be a folder (a tokenizer's): it is recorded, and refused as an output. */
#define MW_FILE_FOLDER 2u

/* --- inputs ----------------------------------------------------------------------------------- */

/* Opens `path` for reading: read-only and without blocking, then checked to be a regular file
 * (fstat of what was opened, so nothing can be swapped in between), then blocking again.
 * *out: the stream (owned by the caller: fclose it); *size: the file's size (NULL: not wanted;
 * -1 for standard input). With MW_FILE_STDIO, "-" gives stdin (not to be closed by fclose
 * when it is stdin). Errors: MW_ERR_INVALID (NULL or empty path), MW_ERR_IO ("cannot open
 * --data x.txt: No such file or directory", "cannot read --data f: it is a FIFO, not a regular
 * file"). */
mw_status mw_input_open(const char *path, const char *what, unsigned flags, FILE **out,
                        int64_t *size);

/* --- a run's files ---------------------------------------------------------------------------- */

typedef struct mw_files mw_files;

/* An empty set of files (owned: mw_files_free). Errors: MW_ERR_INVALID (out NULL), NOMEM. */
mw_status mw_files_new(mw_files **out);

/* Frees the set (the files themselves are not touched). NULL is a no-op. */
void mw_files_free(mw_files *files);

/* Adds an input of the run: it must exist and be a regular file (or a folder, with
 * MW_FILE_FOLDER; "-", standard input, with MW_FILE_STDIO), and be none of the outputs added
 * before. `what` names it in messages ("--data"); both strings are copied. Errors:
 * MW_ERR_INVALID (an empty name, an output added before), MW_ERR_IO (missing, not a regular
 * file), MW_ERR_NOMEM. A refused input is not added. */
mw_status mw_files_input(mw_files *files, const char *what, const char *path, unsigned flags);

/* Adds an output of the run, checked now, before any work: it is none of the inputs and none of
 * the outputs (both ways: an input added later is refused as well), it is absent or a regular
 * file (through a symbolic link: the file it names must exist), its folder exists and takes a
 * new file (tried by creating and removing one), and, when bytes > 0, the folder's file system
 * has that many bytes free (the temporary file is complete before the old file goes). With
 * MW_FILE_STDIO, "-" is standard output: compared with the inputs when it is a regular file,
 * otherwise accepted as it is. Errors: MW_ERR_INVALID (an empty name, an input, another
 * output, a path too long), MW_ERR_IO (not a regular file, the folder, no room), MW_ERR_NOMEM. */
mw_status mw_files_output(mw_files *files, const char *what, const char *path, unsigned flags,
                          int64_t bytes);

/* --- writing an output ------------------------------------------------------------------------ */

typedef struct mw_output mw_output;

/* Starts writing `path`: creates its temporary file beside it (with the mode of the file it will
 * replace, else 0666 less the umask), or, with MW_FILE_STDIO and "-", writes standard output.
 * *out is owned: finish it with mw_output_commit or mw_output_abandon. Errors: MW_ERR_INVALID
 * (NULL or empty path), MW_ERR_IO (an existing file that is not a regular file, "cannot create
 * x.bin.tmp.host.7.0 (for --save x.bin): No such file or directory"), MW_ERR_NOMEM. */
mw_status mw_output_open(const char *path, const char *what, unsigned flags, mw_output **out);

/* Appends n bytes (buffered). A failure (a full disk) is kept: it is returned by this and every
 * later call, and by mw_output_commit. Errors: MW_ERR_INVALID (o NULL), MW_ERR_IO. */
mw_status mw_output_write(mw_output *o, const void *data, size_t n);

/* Appends printf-formatted text, as mw_output_write (MW_ERR_INVALID for a NULL format too). */
mw_status mw_output_printf(mw_output *o, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Writes what is buffered and syncs the temporary file to the disk (standard output: flushes
 * it); after it succeeds, mw_output_commit only renames. A program with several outputs syncs
 * them all before committing any, so that a failure (a full disk) leaves every one as it was.
 * Errors: those of mw_output_write (a kept failure too); MW_ERR_INVALID (o NULL). */
mw_status mw_output_sync(mw_output *o);

/* Finishes the output and frees o: writes what is buffered, syncs the file to the disk and
 * renames it over the final name (then syncs the folder and removes temporary files of the same
 * name that dead writers of this host left). Standard output is flushed, not closed. On any
 * failure (one kept from a write too) the temporary file is removed and the final name is as it
 * was: MW_ERR_IO naming the file and the cause ("No space left on device"). NULL: MW_ERR_INVALID.
 */
mw_status mw_output_commit(mw_output *o);

/* Gives the output up: removes the temporary file (the final name is untouched) and frees o.
 * NULL is a no-op. */
void mw_output_abandon(mw_output *o);

#ifdef __cplusplus
}
#endif
#endif
