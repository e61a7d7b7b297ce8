/* meshwit: the files a program reads and writes, all through one discipline.
 *
 * Inputs are opened without blocking and checked for their kind before a byte is read: a FIFO
 * without a writer, a device or a folder named where a file is expected is an error, said at
 * once (a plain fopen of a FIFO waits for a writer forever).
 *
 * Outputs are checked before any work is done and written so that a file is either what it was
 * or the complete new one:
 *   - an mw_file_set collects a run's inputs and outputs and refuses, as each is added, an
 *     output that is an input of the run (the same device and inode: also through "./name", a
 *     symbolic link or a hard link), that another output names too, that exists and is not a
 *     regular file (a FIFO, a device, a folder: a rename would replace it with a regular file)
 *     or is one the process may not replace (see mw_file_set_add_output), whose folder is
 *     missing or takes no new file (read-only, no permission, a name too long), or that needs,
 *     with the run's other outputs on the same file system, more room than it has free (when
 *     the sizes are given);
 *   - mw_output writes to a temporary file beside the final name, a hidden one whose name does
 *     not grow with the final name's (".<at most 32 bytes of the name>.tmp-mw-<writer>-<pid>-
 *     <n>", <writer> naming this kernel's boot and process namespace), which mw_output_commit
 *     flushes, syncs to the disk and renames over the final name only once it is complete. A
 *     failed write (a full disk) or an abandoned output removes the temporary file and leaves
 *     the final name as it was. An output named through a symbolic link writes the file the
 *     link names (the link stays), unless the link is another user's in a sticky
 *     world-writable folder such as /tmp (refused: it could name any file of theirs).
 *   - "-" is standard output (or standard input, for an input) where the caller allows it
 *     (MW_FILE_STDIO): written in place, never replaced. No other non-regular output is written.
 *
 * Arguments: the object, then the path, then `what`: the flag or role the path was given as,
 * named in every message ("--save", "checkpoint"; NULL: messages name the path alone; copied
 * where it is kept). Every function returns an mw_status and leaves a message in
 * mw_last_error() naming the file, its role and what is wrong; nothing is printed. The class
 * says whose fault it is: MW_ERR_INVALID for what the arguments say on their own or among
 * themselves (a NULL argument, an empty file name, two roles naming one file, an output that is
 * an input), MW_ERR_IO for what the file system says of a file (missing, not a regular file,
 * not replaceable, a folder that takes no file, no room; a failed read or write), MW_ERR_NOMEM.
 * For a program's exit status both classes of a refusal before the work are a refused argument
 * (the examples exit 2); an MW_ERR_IO once the work has started is a failure of the work.
 *
 * Thread-safety: the functions are reentrant; one mw_file_set or mw_output is used by one thread
 * at a time. Writers in several threads or processes may write one final name at once: each has
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

/* --- inputs ----------------------------------------------------------------------------------- */

/* Opens `path` for reading: read-only and without blocking, then checked to be a regular file
 * (fstat of what was opened, so nothing can be swapped in between), then blocking again.
 * *out: a stream of its own, owned by the caller, who fcloses it (also for "-": with
 * MW_FILE_STDIO, "-" gives a stream on a duplicate of standard input's descriptor, so closing
 * it leaves standard input open; read standard input through it only, since what stdin has
 * buffered is not in it). *size: the file's size (NULL: not wanted; -1 for standard input).
 * Errors: MW_ERR_INVALID (NULL path or out, an empty path), MW_ERR_IO ("cannot open --data
 * x.txt: No such file or directory", "cannot read --data f: it is a FIFO, not a regular file"),
 * MW_ERR_NOMEM. *out is NULL on failure. */
mw_status mw_input_open(const char *path, const char *what, unsigned flags, FILE **out,
                        int64_t *size);

/* --- a run's files ---------------------------------------------------------------------------- */

typedef struct mw_file_set mw_file_set;

/* An empty set of a run's files (owned: mw_file_set_free). Errors: MW_ERR_INVALID (out NULL),
 * MW_ERR_NOMEM. */
mw_status mw_file_set_new(mw_file_set **out);

/* Frees the set (the files themselves are not touched). NULL is a no-op. */
void mw_file_set_free(mw_file_set *set);

/* Adds an input of the run: it must exist and be a regular file ("-", standard input, with
 * MW_FILE_STDIO: whatever it is), and be none of the outputs added before. Both strings are
 * copied. Errors: MW_ERR_INVALID (NULL set or path, an empty name, an output added before),
 * MW_ERR_IO (missing, not a regular file), MW_ERR_NOMEM. A refused input is not added. */
mw_status mw_file_set_add_input(mw_file_set *set, const char *path, const char *what,
                                unsigned flags);

/* Adds an output of the run, checked now, before any work: it is none of the inputs and none of
 * the outputs (both ways: an input added later is refused as well); it is absent or a regular
 * file the process may replace: one with a write permission bit (a file with none, mode 0444,
 * is read-only: refused for root too), writable by the effective user, and, in a sticky folder,
 * the effective user's or the folder owner's (else the rename fails; root may); through a
 * symbolic link the file it names must exist (and the link be no other user's in a sticky
 * world-writable folder); its name can be looked up (not too long) and its folder takes the
 * very temporary file an mw_output would create (one is created and removed); and, when
 * bytes > 0, the folder's file system has that many bytes free, plus those of the outputs
 * added before on the same file system (every temporary file is complete before any old file
 * goes). bytes <= 0: not known, no room is asked for. With MW_FILE_STDIO, "-" is standard
 * output: compared with the inputs when it is a regular file, otherwise accepted as it is.
 * Both strings are copied. Errors: MW_ERR_INVALID (NULL set or path, an empty name, an input,
 * another output), MW_ERR_IO (not a regular file, not replaceable, the folder, no room),
 * MW_ERR_NOMEM. A refused output is not added. */
mw_status mw_file_set_add_output(mw_file_set *set, const char *path, const char *what,
                                 unsigned flags, int64_t bytes);

/* --- writing an output ------------------------------------------------------------------------ */

typedef struct mw_output mw_output;

/* Starts writing `path`: creates its temporary file beside it, or, with MW_FILE_STDIO and "-",
 * writes standard output. The new file gets the permission bits (mode & 0777) of the file it
 * will replace, else 0666 less the umask; not its owner, group, set-id or sticky bits, ACLs or
 * extended attributes. *out is owned: finish it with mw_output_commit or mw_output_abandon.
 * Errors: MW_ERR_INVALID (NULL path or out, an empty path), MW_ERR_IO (an existing file that is
 * not one mw_file_set_add_output accepts, "--save d/x.bin cannot be written: cannot create a
 * file in d: No such file or directory"), MW_ERR_NOMEM. */
mw_status mw_output_open(const char *path, const char *what, unsigned flags, mw_output **out);

/* Appends n bytes (buffered). A failure (a full disk) is kept: it is returned by this and every
 * later call, and by mw_output_commit. Errors: MW_ERR_INVALID (o NULL), MW_ERR_IO. */
mw_status mw_output_write(mw_output *o, const void *data, size_t n);

/* Appends printf-formatted text, as mw_output_write. */
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

/* Finishes the output and frees o: writes what is buffered, syncs the file to the disk, checks
 * the final name again (it may have become a FIFO, a device or read-only since the open: then
 * it is not replaced) and renames the file over it, then syncs the folder. The first commit of
 * a process into a folder also removes the temporary files there that writers of this kernel
 * boot and process namespace which no longer run left (a process killed while writing): files
 * of this user with exactly the temporary name pattern, nothing else. Standard output is
 * flushed, not closed. On any failure (one kept from a write too) the temporary file is removed
 * and the final name is as it was: MW_ERR_IO naming the file and the cause ("No space left on
 * device"). NULL: MW_ERR_INVALID. */
mw_status mw_output_commit(mw_output *o);

/* Gives the output up: removes the temporary file (the final name is untouched) and frees o.
 * NULL is a no-op. */
void mw_output_abandon(mw_output *o);

#ifdef __cplusplus
}
#endif
#endif
