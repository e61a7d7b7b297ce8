/* The file discipline (meshwit/file.h): inputs that never block and are refused by kind; a run's
 * files, where an output may be no input (by path, dir/./name, symbolic or hard link), no other
 * output, no FIFO, device or folder, and must have a folder that takes a file and room; outputs
 * written beside their final name and renamed only when complete, a failed or abandoned one
 * leaving the final name as it was; every allocation failing in turn.
 *
 * Every test works in its own mkdtemp folder, removed afterwards. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "meshwit.h"

static char dir[64];

static void make_dir(void) {
    snprintf(dir, sizeof dir, "/tmp/mw_file_XXXXXX");
    cr_assert_not_null(mkdtemp(dir), "mkdtemp failed");
}

static void remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        char sub[512];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
                struct stat sb;
                if (lstat(sub, &sb) == 0 && S_ISDIR(sb.st_mode)) {
                    chmod(sub, 0700);
                    remove_tree(sub);
                } else {
                    unlink(sub);
                }
            }
        closedir(d);
    }
    rmdir(path);
}

static void remove_dir(void) { remove_tree(dir); }

TestSuite(file, .init = make_dir, .fini = remove_dir, .timeout = 30);

static const char *path_of(const char *name) {
    static char buf[8][256];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, 256, "%s/%s", dir, name);
    return p;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    cr_assert_eq(fwrite(text, 1, strlen(text), f), strlen(text));
    cr_assert_eq(fclose(f), 0);
}

static char *read_text(const char *path) {
    static char buf[1 << 16];
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

/* The names in the test's folder, sorted and joined by spaces: a temporary file left behind
 * shows here. */
static const char *listing(void) {
    static char out[2048];
    char names[32][256];
    int n = 0;
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    for (struct dirent *e; (e = readdir(d)) && n < 32;)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            snprintf(names[n++], sizeof names[0], "%s", e->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], (int (*)(const void *, const void *))strcmp);
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        strcat(out, i ? " " : "");
        strcat(out, names[i]);
    }
    return out;
}

#define EXPECT(call, status, ...)                                                                  \
    do {                                                                                           \
        mw_status st_ = (call);                                                                    \
        cr_assert_eq(st_, status, "%s: %s [%s]", #call, mw_status_name(st_), mw_last_error());     \
        const char *words_[] = {__VA_ARGS__, NULL};                                                \
        for (int w_ = 0; words_[w_]; w_++)                                                         \
            cr_assert(strstr(mw_last_error(), words_[w_]), "'%s' lacks '%s'", mw_last_error(),     \
                      words_[w_]);                                                                 \
    } while (0)

/* --- inputs ----------------------------------------------------------------------------------- */

Test(file, input_opens_a_regular_file_and_gives_its_size) {
    write_text(path_of("in.txt"), "hello");
    FILE *f;
    int64_t size = -7;
    cr_assert_eq(mw_input_open(path_of("in.txt"), "--data", 0, &f, &size), MW_OK);
    cr_assert_eq(size, 5);
    char buf[8] = "";
    cr_assert_eq(fread(buf, 1, sizeof buf, f), 5); /* blocking reads again */
    cr_assert_str_eq(buf, "hello");
    fclose(f);
}

/* A FIFO without a writer would block fopen forever: refused at once (the suite's timeout). */
Test(file, odd_inputs_are_refused_without_blocking) {
    cr_assert_eq(mkfifo(path_of("fifo"), 0600), 0);
    mkdir(path_of("folder"), 0700);
    FILE *f = (FILE *)1;
    int64_t size = 9;
    EXPECT(mw_input_open(path_of("fifo"), "--data", 0, &f, &size), MW_ERR_IO, "cannot read --data",
           "fifo: it is a FIFO, not a regular file");
    cr_assert_null(f);
    cr_assert_eq(size, 0);
    EXPECT(mw_input_open(path_of("folder"), "--data", 0, &f, NULL), MW_ERR_IO,
           "it is a directory, not a regular file");
    EXPECT(mw_input_open("/dev/zero", NULL, 0, &f, NULL), MW_ERR_IO,
           "cannot read /dev/zero: it is a character device");
    EXPECT(mw_input_open(path_of("missing"), "--load", 0, &f, NULL), MW_ERR_IO,
           "cannot open --load", "missing: No such file or directory");
    EXPECT(mw_input_open("", "--data", 0, &f, NULL), MW_ERR_INVALID, "--data: an empty file name");
    EXPECT(mw_input_open(NULL, "--data", 0, &f, NULL), MW_ERR_INVALID, "NULL");
    struct stat sb;
    cr_assert(stat(path_of("fifo"), &sb) == 0 && S_ISFIFO(sb.st_mode));
}

Test(file, dash_is_standard_input_only_when_allowed) {
    FILE *f;
    int64_t size = 0;
    cr_assert_eq(mw_input_open("-", "TEXT", MW_FILE_STDIO, &f, &size), MW_OK);
    cr_assert_eq(f, stdin);
    cr_assert_eq(size, -1);
    cr_assert(chdir(dir) == 0);
    EXPECT(mw_input_open("-", "TEXT", 0, &f, NULL), MW_ERR_IO, "cannot open TEXT -");
}

/* --- a run's files ---------------------------------------------------------------------------- */

/* An output that is an input, by every spelling of it: refused before anything is written, and
 * the input is untouched. */
Test(file, an_output_is_never_an_input) {
    write_text(path_of("in.txt"), "input");
    cr_assert_eq(symlink(path_of("in.txt"), path_of("link")), 0);
    cr_assert_eq(link(path_of("in.txt"), path_of("hard")), 0);
    char dotted[300];
    snprintf(dotted, sizeof dotted, "%s/./in.txt", dir);
    const char *spellings[] = {path_of("in.txt"), dotted, path_of("link"), path_of("hard")};
    for (int i = 0; i < 4; i++) {
        mw_files *fs;
        cr_assert_eq(mw_files_new(&fs), MW_OK);
        cr_assert_eq(mw_files_input(fs, "--data", path_of("in.txt"), 0), MW_OK);
        EXPECT(mw_files_output(fs, "--save", spellings[i], 0, 0), MW_ERR_INVALID, "--save",
               "is also --data", "writing it would destroy an input");
        mw_files_free(fs);
        /* The other order: an input named after the output is refused just the same. */
        cr_assert_eq(mw_files_new(&fs), MW_OK);
        cr_assert_eq(mw_files_output(fs, "--save", spellings[i], 0, 0), MW_OK, "%s",
                     mw_last_error());
        EXPECT(mw_files_input(fs, "--data", path_of("in.txt"), 0), MW_ERR_INVALID,
               "is also --data");
        mw_files_free(fs);
    }
    /* Another file of the same folder is another file. */
    write_text(path_of("other.txt"), "other");
    mw_files *fs;
    cr_assert_eq(mw_files_new(&fs), MW_OK);
    cr_assert_eq(mw_files_input(fs, "--data", path_of("in.txt"), 0), MW_OK);
    cr_assert_eq(mw_files_output(fs, "--save", path_of("other.txt"), 0, 0), MW_OK, "%s",
                 mw_last_error());
    mw_files_free(fs);
    cr_assert_str_eq(read_text(path_of("in.txt")), "input");
    cr_assert_str_eq(listing(), "hard in.txt link other.txt");
}

/* Two outputs naming one file, also one that does not exist yet under two spellings. */
Test(file, two_outputs_never_name_one_file) {
    mkdir(path_of("sub"), 0700);
    char dotted[300];
    snprintf(dotted, sizeof dotted, "%s/sub/../new.bin", dir);
    mw_files *fs;
    cr_assert_eq(mw_files_new(&fs), MW_OK);
    cr_assert_eq(mw_files_output(fs, "--out", path_of("new.bin"), 0, 0), MW_OK);
    EXPECT(mw_files_output(fs, "--val-out", dotted, 0, 0), MW_ERR_INVALID,
           "--out and --val-out name the same file");
    cr_assert_eq(mw_files_output(fs, "--val-out", path_of("other.bin"), 0, 0), MW_OK);
    /* Standard output twice is one file too; standard input is not standard output. */
    cr_assert_eq(mw_files_input(fs, "TEXT", "-", MW_FILE_STDIO), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_files_output(fs, "--a", "-", MW_FILE_STDIO, 0), MW_OK, "%s", mw_last_error());
    EXPECT(mw_files_output(fs, "--b", "-", MW_FILE_STDIO, 0), MW_ERR_INVALID,
           "--a and --b name the same file");
    mw_files_free(fs);
    cr_assert_str_eq(listing(), "sub", "a check created a file: %s", listing());
}

/* Standard output redirected to an input: "-" is that file. */
Test(file, standard_output_redirected_to_an_input_is_refused) {
    write_text(path_of("in.txt"), "input");
    fflush(stdout);
    int saved = dup(1), fd = open(path_of("in.txt"), O_WRONLY | O_APPEND);
    cr_assert(saved >= 0 && fd >= 0);
    cr_assert_eq(dup2(fd, 1), 1);
    mw_files *fs;
    cr_assert_eq(mw_files_new(&fs), MW_OK);
    cr_assert_eq(mw_files_input(fs, "--decode", path_of("in.txt"), 0), MW_OK);
    mw_status st = mw_files_output(fs, "--out", "-", MW_FILE_STDIO, 0);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", mw_last_error());
    mw_files_free(fs);
    dup2(saved, 1);
    close(saved);
    close(fd);
    cr_assert_eq(st, MW_ERR_INVALID, "%s", msg);
    cr_assert(strstr(msg, "- (standard output) is also --decode"), "%s", msg);
}

/* A FIFO, a device, a folder: a rename would replace each with a regular file. */
Test(file, an_output_is_never_a_fifo_device_or_folder) {
    cr_assert_eq(mkfifo(path_of("fifo"), 0600), 0);
    mkdir(path_of("folder"), 0700);
    cr_assert_eq(symlink(path_of("fifo"), path_of("to_fifo")), 0);
    cr_assert_eq(symlink(path_of("gone"), path_of("dangling")), 0);
    mw_files *fs;
    cr_assert_eq(mw_files_new(&fs), MW_OK);
    EXPECT(mw_files_output(fs, "--save", path_of("fifo"), 0, 0), MW_ERR_IO,
           "exists and is a FIFO, not a regular file");
    EXPECT(mw_files_output(fs, "--save", path_of("to_fifo"), 0, 0), MW_ERR_IO, "is a FIFO");
    EXPECT(mw_files_output(fs, "--save", "/dev/null", 0, 0), MW_ERR_IO,
           "--save /dev/null exists and is a character device");
    EXPECT(mw_files_output(fs, "--save", path_of("folder"), 0, 0), MW_ERR_IO, "is a directory");
    EXPECT(mw_files_output(fs, "--save", path_of("dangling"), 0, 0), MW_ERR_IO,
           "a symbolic link to a missing file");
    EXPECT(mw_files_output(fs, "--save", "", 0, 0), MW_ERR_INVALID, "--save: an empty file name");
    EXPECT(mw_files_input(fs, "--data", path_of("fifo"), 0), MW_ERR_IO, "is a FIFO");
    EXPECT(mw_files_input(fs, "--data", path_of("folder"), 0), MW_ERR_IO, "is a directory");
    cr_assert_eq(mw_files_input(fs, "--tokenizer", path_of("folder"), MW_FILE_FOLDER), MW_OK);
    EXPECT(mw_files_input(fs, "--data", path_of("missing"), 0), MW_ERR_IO, "No such file");
    mw_files_free(fs);
    struct stat sb;
    cr_assert(stat(path_of("fifo"), &sb) == 0 && S_ISFIFO(sb.st_mode));
    cr_assert(stat("/dev/null", &sb) == 0 && S_ISCHR(sb.st_mode));
}

/* The folder must take a new file (tried, not guessed from permissions, which root ignores), and
 * hold the output when its size is known. */
Test(file, the_folder_must_take_the_file_and_have_room) {
    mw_files *fs;
    cr_assert_eq(mw_files_new(&fs), MW_OK);
    EXPECT(mw_files_output(fs, "--save", path_of("missing/m.bin"), 0, 0), MW_ERR_IO, "--save",
           "m.bin cannot be written: cannot create a file in", "missing: No such file");
    if (geteuid() != 0) {
        mkdir(path_of("ro"), 0500);
        EXPECT(mw_files_output(fs, "--save", path_of("ro/m.bin"), 0, 0), MW_ERR_IO,
               "Permission denied");
    }
    /* /proc takes no new file, whoever asks. */
    EXPECT(mw_files_output(fs, "--save", "/proc/meshwit-test.bin", 0, 0), MW_ERR_IO,
           "cannot create a file in /proc");
    EXPECT(mw_files_output(fs, "--save", path_of("big.bin"), 0, INT64_C(1) << 62), MW_ERR_IO,
           "needs 4611686018427.4 MB, and", "MB free");
    cr_assert_eq(mw_files_output(fs, "--save", path_of("small.bin"), 0, 4096), MW_OK);
    mw_files_free(fs);
    cr_assert_str_eq(listing(), geteuid() != 0 ? "ro" : "");
}

/* --- writing an output ------------------------------------------------------------------------ */

Test(file, an_output_appears_whole_at_the_commit) {
    write_text(path_of("out.txt"), "old");
    chmod(path_of("out.txt"), 0640);
    mw_output *o;
    cr_assert_eq(mw_output_open(path_of("out.txt"), "--out", 0, &o), MW_OK, "%s", mw_last_error());
    static char big[100000];
    memset(big, 'x', sizeof big);
    cr_assert_eq(mw_output_write(o, "new ", 4), MW_OK);
    cr_assert_eq(mw_output_write(o, big, sizeof big), MW_OK); /* larger than the buffer */
    cr_assert_eq(mw_output_printf(o, " %d %.1999s", 42, big), MW_OK);
    cr_assert_eq(mw_output_write(o, NULL, 0), MW_OK);
    cr_assert_str_eq(read_text(path_of("out.txt")), "old", "replaced before the commit");
    cr_assert_eq(mw_output_commit(o), MW_OK, "%s", mw_last_error());
    const char *got = read_text(path_of("out.txt"));
    cr_assert(strncmp(got, "new xxx", 7) == 0);
    struct stat sb;
    cr_assert_eq(stat(path_of("out.txt"), &sb), 0);
    cr_assert_eq(sb.st_size, 4 + (off_t)sizeof big + 4 + 1999);
    cr_assert_eq(sb.st_mode & 0777, 0640, "the mode of the file replaced is kept");
    cr_assert_str_eq(listing(), "out.txt");
}

Test(file, an_abandoned_output_leaves_the_old_file) {
    write_text(path_of("out.txt"), "old");
    mw_output *o;
    cr_assert_eq(mw_output_open(path_of("out.txt"), "--out", 0, &o), MW_OK);
    cr_assert_eq(mw_output_write(o, "half", 4), MW_OK);
    cr_assert_eq(mw_output_sync(o), MW_OK);
    cr_assert_neq(strcmp(listing(), "out.txt"), 0, "no temporary file beside it");
    mw_output_abandon(o);
    mw_output_abandon(NULL);
    cr_assert_str_eq(read_text(path_of("out.txt")), "old");
    cr_assert_str_eq(listing(), "out.txt");
}

/* A write that fails (here beyond RLIMIT_FSIZE, as a full disk would) is kept: every later call
 * and the commit return it, the temporary file goes and the old file stays. */
Test(file, a_failed_write_leaves_the_old_file) {
    write_text(path_of("out.txt"), "old");
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {4096, 4096};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    mw_output *o;
    cr_assert_eq(mw_output_open(path_of("out.txt"), "--out", 0, &o), MW_OK);
    static char big[200000];
    EXPECT(mw_output_write(o, big, sizeof big), MW_ERR_IO, "cannot write --out", "File too large",
           "is as it was");
    EXPECT(mw_output_write(o, "x", 1), MW_ERR_IO, "File too large");
    EXPECT(mw_output_commit(o), MW_ERR_IO, "File too large");
    cr_assert_str_eq(read_text(path_of("out.txt")), "old");
    cr_assert_str_eq(listing(), "out.txt");
}

/* The same when the failure shows only at the commit (the last buffer). */
Test(file, a_failure_at_the_commit_leaves_the_old_file) {
    write_text(path_of("out.txt"), "old");
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {1000, 1000};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    mw_output *o;
    cr_assert_eq(mw_output_open(path_of("out.txt"), "--out", 0, &o), MW_OK);
    for (int i = 0; i < 200; i++) cr_assert_eq(mw_output_printf(o, "line %d\n", i), MW_OK);
    EXPECT(mw_output_commit(o), MW_ERR_IO, "File too large");
    cr_assert_str_eq(read_text(path_of("out.txt")), "old");
    cr_assert_str_eq(listing(), "out.txt");
}

Test(file, odd_outputs_are_not_replaced) {
    cr_assert_eq(mkfifo(path_of("fifo"), 0600), 0);
    mkdir(path_of("folder"), 0700);
    const char *odd[] = {path_of("fifo"), path_of("folder"), "/dev/null"};
    const char *kind[] = {"a FIFO", "a directory", "a character device"};
    for (int i = 0; i < 3; i++) {
        mw_output *o = (mw_output *)1;
        EXPECT(mw_output_open(odd[i], "checkpoint", 0, &o), MW_ERR_IO, kind[i], "not replaced");
        cr_assert_null(o);
    }
    mw_output *o;
    EXPECT(mw_output_open(path_of("missing/x.bin"), "--save", 0, &o), MW_ERR_IO,
           "missing/x.bin.tmp.", "No such file");
    EXPECT(mw_output_open("", "--save", 0, &o), MW_ERR_INVALID, "--save: an empty file name");
    EXPECT(mw_output_commit(NULL), MW_ERR_INVALID, "NULL");
    struct stat sb;
    cr_assert(stat(path_of("fifo"), &sb) == 0 && S_ISFIFO(sb.st_mode));
    cr_assert_str_eq(listing(), "fifo folder");
}

/* Through a symbolic link the file it names is written; the link stays a link. */
Test(file, an_output_through_a_link_writes_its_file) {
    write_text(path_of("real.txt"), "old");
    cr_assert_eq(symlink(path_of("real.txt"), path_of("link")), 0);
    mw_output *o;
    cr_assert_eq(mw_output_open(path_of("link"), "--out", 0, &o), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_output_write(o, "new", 3), MW_OK);
    cr_assert_eq(mw_output_commit(o), MW_OK, "%s", mw_last_error());
    struct stat sb;
    cr_assert(lstat(path_of("link"), &sb) == 0 && S_ISLNK(sb.st_mode));
    cr_assert_str_eq(read_text(path_of("real.txt")), "new");
    cr_assert_str_eq(listing(), "link real.txt");
}

Test(file, dash_writes_standard_output_in_place) {
    write_text(path_of("captured"), "");
    fflush(stdout);
    int saved = dup(1), fd = open(path_of("captured"), O_WRONLY | O_APPEND);
    cr_assert(saved >= 0 && fd >= 0);
    cr_assert_eq(dup2(fd, 1), 1);
    mw_output *o;
    mw_status st = mw_output_open("-", "--out", MW_FILE_STDIO, &o);
    if (st == MW_OK) st = mw_output_write(o, "to stdout\n", 10);
    if (st == MW_OK) st = mw_output_commit(o);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    close(fd);
    cr_assert_eq(st, MW_OK, "%s", mw_last_error());
    cr_assert_str_eq(read_text(path_of("captured")), "to stdout\n");
    cr_assert_str_eq(listing(), "captured");
}

/* Every allocation of a check or a write failing in turn: MW_ERR_NOMEM, nothing written, nothing
 * left behind (leaks show under LeakSanitizer). */
Test(file, out_of_memory_anywhere) {
    write_text(path_of("in.txt"), "input");
    for (int64_t n = 1;; n++) {
        mw_test_fail_allocation(n);
        mw_files *fs = NULL;
        mw_status st = mw_files_new(&fs);
        if (st == MW_OK) st = mw_files_input(fs, "--data", path_of("in.txt"), 0);
        if (st == MW_OK) st = mw_files_output(fs, "--save", path_of("out.txt"), 0, 0);
        if (st == MW_OK) st = mw_files_output(fs, "--other", path_of("two.txt"), 0, 0);
        mw_output *o = NULL;
        if (st == MW_OK) st = mw_output_open(path_of("out.txt"), "--save", 0, &o);
        if (st == MW_OK) st = mw_output_printf(o, "%2000d", 7);
        if (st == MW_OK) {
            st = mw_output_commit(o);
        } else {
            mw_output_abandon(o);
        }
        mw_files_free(fs);
        int64_t made = mw_test_allocations();
        mw_test_fail_allocation(0);
        if (st == MW_OK) {
            cr_assert_lt(made, n, "allocation %lld was asked to fail, yet all succeeded",
                         (long long)n);
            cr_assert_str_eq(listing(), "in.txt out.txt");
            break;
        }
        cr_assert_eq(st, MW_ERR_NOMEM, "allocation %lld: %s", (long long)n, mw_last_error());
        cr_assert_str_eq(listing(), "in.txt", "allocation %lld left %s", (long long)n, listing());
    }
}
