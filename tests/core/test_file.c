/* The file discipline (meshwit/file.h): inputs that never block and are refused by kind; a run's
 * files, where an output may be no input (by path, dir/./name, symbolic or hard link), no other
 * output, no FIFO, device, folder or file the process may not replace (read-only, another
 * user's), and must have a folder that takes its temporary file and room, summed over the run's
 * outputs; outputs written beside their final name and renamed only when complete, a failed or
 * abandoned one leaving the final name as it was, the final name checked again at the commit,
 * and nothing else in the folder touched; every allocation failing in turn.
 *
 * Every test works in its own mkdtemp folder, removed afterwards. Tests of what another user may
 * do need root, to make that user's files and become that user in a child process; they skip,
 * saying so, otherwise. */
#define _DEFAULT_SOURCE /* setgroups, lchown */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "meshwit.h"
#include "meshwit/testing.h"

static char dir[64];

static void make_dir(void) {
    snprintf(dir, sizeof dir, "/tmp/mw_file_XXXXXX");
    cr_assert_not_null(mkdtemp(dir), "mkdtemp failed");
}

static void remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        char sub[1024];
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
    static char buf[8][512];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", dir, name);
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

/* "-" is a stream of its own on standard input's descriptor: the caller fcloses whatever it got,
 * and standard input stays open. */
Test(file, dash_is_standard_input_only_when_allowed) {
    write_text(path_of("in.txt"), "from stdin");
    int saved = dup(0), fd = open(path_of("in.txt"), O_RDONLY);
    cr_assert(saved >= 0 && fd >= 0);
    cr_assert_eq(dup2(fd, 0), 0);
    close(fd);
    FILE *f;
    int64_t size = 0;
    mw_status st = mw_input_open("-", "TEXT", MW_FILE_STDIO, &f, &size);
    char buf[32] = "";
    size_t n = st == MW_OK ? fread(buf, 1, sizeof buf - 1, f) : 0;
    int own = st == MW_OK && f != stdin && fileno(f) != 0;
    if (st == MW_OK) fclose(f);
    int still_open = fcntl(0, F_GETFD) != -1;
    dup2(saved, 0);
    close(saved);
    cr_assert_eq(st, MW_OK, "%s", mw_last_error());
    cr_assert(own, "standard input itself was returned: closing it would close stdin");
    cr_assert(still_open, "closing the stream closed standard input");
    cr_assert_eq(size, -1);
    cr_assert_eq(n, 10);
    cr_assert_str_eq(buf, "from stdin");
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
        mw_file_set *fs;
        cr_assert_eq(mw_file_set_new(&fs), MW_OK);
        cr_assert_eq(mw_file_set_add_input(fs, path_of("in.txt"), "--data", 0), MW_OK);
        EXPECT(mw_file_set_add_output(fs, spellings[i], "--save", 0, 0), MW_ERR_INVALID, "--save",
               "is also --data", "writing it would destroy an input");
        mw_file_set_free(fs);
        /* The other order: an input named after the output is refused just the same. */
        cr_assert_eq(mw_file_set_new(&fs), MW_OK);
        cr_assert_eq(mw_file_set_add_output(fs, spellings[i], "--save", 0, 0), MW_OK, "%s",
                     mw_last_error());
        EXPECT(mw_file_set_add_input(fs, path_of("in.txt"), "--data", 0), MW_ERR_INVALID,
               "is also --data");
        mw_file_set_free(fs);
    }
    /* Another file of the same folder is another file. */
    write_text(path_of("other.txt"), "other");
    mw_file_set *fs;
    cr_assert_eq(mw_file_set_new(&fs), MW_OK);
    cr_assert_eq(mw_file_set_add_input(fs, path_of("in.txt"), "--data", 0), MW_OK);
    cr_assert_eq(mw_file_set_add_output(fs, path_of("other.txt"), "--save", 0, 0), MW_OK, "%s",
                 mw_last_error());
    mw_file_set_free(fs);
    cr_assert_str_eq(read_text(path_of("in.txt")), "input");
    cr_assert_str_eq(listing(), "hard in.txt link other.txt");
}

/* Two outputs naming one file, also one that does not exist yet under two spellings. */
Test(file, two_outputs_never_name_one_file) {
    mkdir(path_of("sub"), 0700);
    char dotted[300];
    snprintf(dotted, sizeof dotted, "%s/sub/../new.bin", dir);
    mw_file_set *fs;
    cr_assert_eq(mw_file_set_new(&fs), MW_OK);
    cr_assert_eq(mw_file_set_add_output(fs, path_of("new.bin"), "--out", 0, 0), MW_OK);
    EXPECT(mw_file_set_add_output(fs, dotted, "--val-out", 0, 0), MW_ERR_INVALID,
           "--out and --val-out name the same file");
    cr_assert_eq(mw_file_set_add_output(fs, path_of("other.bin"), "--val-out", 0, 0), MW_OK);
    /* Standard output twice is one file too; standard input is not standard output. */
    cr_assert_eq(mw_file_set_add_input(fs, "-", "TEXT", MW_FILE_STDIO), MW_OK, "%s",
                 mw_last_error());
    cr_assert_eq(mw_file_set_add_output(fs, "-", "--a", MW_FILE_STDIO, 0), MW_OK, "%s",
                 mw_last_error());
    EXPECT(mw_file_set_add_output(fs, "-", "--b", MW_FILE_STDIO, 0), MW_ERR_INVALID,
           "--a and --b name the same file");
    mw_file_set_free(fs);
    cr_assert_str_eq(listing(), "sub", "a check created a file: %s", listing());
}

/* Standard output redirected to an input: "-" is that file. */
Test(file, standard_output_redirected_to_an_input_is_refused) {
    write_text(path_of("in.txt"), "input");
    fflush(stdout);
    int saved = dup(1), fd = open(path_of("in.txt"), O_WRONLY | O_APPEND);
    cr_assert(saved >= 0 && fd >= 0);
    cr_assert_eq(dup2(fd, 1), 1);
    mw_file_set *fs;
    cr_assert_eq(mw_file_set_new(&fs), MW_OK);
    cr_assert_eq(mw_file_set_add_input(fs, path_of("in.txt"), "--decode", 0), MW_OK);
    mw_status st = mw_file_set_add_output(fs, "-", "--out", MW_FILE_STDIO, 0);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", mw_last_error());
    mw_file_set_free(fs);
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
    mw_file_set *fs;
    cr_assert_eq(mw_file_set_new(&fs), MW_OK);
    EXPECT(mw_file_set_add_output(fs, path_of("fifo"), "--save", 0, 0), MW_ERR_IO,
           "exists and is a FIFO, not a regular file");
    EXPECT(mw_file_set_add_output(fs, path_of("to_fifo"), "--save", 0, 0), MW_ERR_IO, "is a FIFO");
    EXPECT(mw_file_set_add_output(fs, "/dev/null", "--save", 0, 0), MW_ERR_IO,
           "--save /dev/null exists and is a character device");
    EXPECT(mw_file_set_add_output(fs, path_of("folder"), "--save", 0, 0), MW_ERR_IO,
           "is a directory");
    EXPECT(mw_file_set_add_output(fs, path_of("dangling"), "--save", 0, 0), MW_ERR_IO,
           "a symbolic link to a missing file");
    EXPECT(mw_file_set_add_output(fs, "", "--save", 0, 0), MW_ERR_INVALID,
           "--save: an empty file name");
    EXPECT(mw_file_set_add_input(fs, path_of("fifo"), "--data", 0), MW_ERR_IO, "is a FIFO");
    EXPECT(mw_file_set_add_input(fs, path_of("folder"), "--data", 0), MW_ERR_IO, "is a directory");
    EXPECT(mw_file_set_add_input(fs, path_of("missing"), "--data", 0), MW_ERR_IO, "No such file");
    mw_file_set_free(fs);
    struct stat sb;
    cr_assert(stat(path_of("fifo"), &sb) == 0 && S_ISFIFO(sb.st_mode));
    cr_assert(stat("/dev/null", &sb) == 0 && S_ISCHR(sb.st_mode));
}

/* A NULL role: every message names the path alone (as file.h says). */
Test(file, a_null_role_names_the_path_alone) {
    cr_assert_eq(mkfifo(path_of("fifo"), 0600), 0);
    const char *fifo = path_of("fifo");
    mw_file_set *fs;
    cr_assert_eq(mw_file_set_new(&fs), MW_OK);
    EXPECT(mw_file_set_add_output(fs, fifo, NULL, 0, 0), MW_ERR_IO, "is a FIFO");
    cr_assert(strncmp(mw_last_error(), fifo, strlen(fifo)) == 0, "%s", mw_last_error());
    cr_assert_eq(mw_file_set_add_output(fs, path_of("a.bin"), NULL, 0, 0), MW_OK);
    EXPECT(mw_file_set_add_output(fs, path_of("a.bin"), NULL, 0, 0), MW_ERR_INVALID,
           "are the same file");
    EXPECT(mw_file_set_add_output(fs, "", NULL, 0, 0), MW_ERR_INVALID,
           "an empty file name: give a path");
    cr_assert(strncmp(mw_last_error(), "an empty", 8) == 0, "%s", mw_last_error());
    mw_file_set_free(fs);
    mw_output *o;
    EXPECT(mw_output_open(fifo, NULL, 0, &o), MW_ERR_IO, "is a FIFO", "not replaced");
    cr_assert(strncmp(mw_last_error(), fifo, strlen(fifo)) == 0, "%s", mw_last_error());
    FILE *f;
    EXPECT(mw_input_open(fifo, NULL, 0, &f, NULL), MW_ERR_IO, "cannot read /");
}

/* The folder must take the temporary file (tried, not guessed from permissions, which root
 * ignores), and hold the output when its size is known. */
Test(file, the_folder_must_take_the_file_and_have_room) {
    mw_file_set *fs;
    cr_assert_eq(mw_file_set_new(&fs), MW_OK);
    EXPECT(mw_file_set_add_output(fs, path_of("missing/m.bin"), "--save", 0, 0), MW_ERR_IO,
           "--save", "m.bin cannot be written: cannot create a file in", "missing: No such file");
    if (geteuid() != 0) {
        mkdir(path_of("ro"), 0500);
        EXPECT(mw_file_set_add_output(fs, path_of("ro/m.bin"), "--save", 0, 0), MW_ERR_IO,
               "Permission denied");
    }
    /* /proc takes no new file, whoever asks. */
    EXPECT(mw_file_set_add_output(fs, "/proc/meshwit-test.bin", "--save", 0, 0), MW_ERR_IO,
           "cannot create a file in /proc");
    EXPECT(mw_file_set_add_output(fs, path_of("big.bin"), "--save", 0, INT64_C(1) << 62), MW_ERR_IO,
           "big.bin needs 4611686018.4 GB, and", "free");
    cr_assert_eq(mw_file_set_add_output(fs, path_of("small.bin"), "--save", 0, 4096), MW_OK);
    mw_file_set_free(fs);
    cr_assert_str_eq(listing(), geteuid() != 0 ? "ro" : "");
}

/* Outputs on one file system need their room together: every temporary file is complete before
 * any old file goes. Two that each fit alone but not both are refused. */
Test(file, room_is_summed_over_the_outputs_of_a_file_system) {
    struct statvfs vf;
    cr_assert_eq(statvfs(dir, &vf), 0);
    int64_t free_bytes = (int64_t)vf.f_bavail * (int64_t)vf.f_frsize;
    cr_assert_gt(free_bytes, 1 << 20, "too little free space in %s to test", dir);
    int64_t most = free_bytes / 10 * 6, some = free_bytes / 10 * 3;
    mw_file_set *fs;
    cr_assert_eq(mw_file_set_new(&fs), MW_OK);
    cr_assert_eq(mw_file_set_add_output(fs, path_of("model.bin"), "--save", 0, most), MW_OK, "%s",
                 mw_last_error());
    EXPECT(mw_file_set_add_output(fs, path_of("state.mwc"), "--checkpoint", 0, most), MW_ERR_IO,
           "--checkpoint", "with the run's other outputs on its file system", "in all", "free");
    cr_assert_eq(mw_file_set_add_output(fs, path_of("state.mwc"), "--checkpoint", 0, some), MW_OK,
                 "%s", mw_last_error());
    mw_file_set_free(fs);
    cr_assert_str_eq(listing(), "");
}

/* A file with no write permission bit is read-only: not replaced, by root either; the check and
 * the writer say so, and the file is as it was. */
Test(file, a_read_only_output_is_not_replaced) {
    write_text(path_of("precious.bin"), "precious");
    cr_assert_eq(chmod(path_of("precious.bin"), 0444), 0);
    mw_file_set *fs;
    cr_assert_eq(mw_file_set_new(&fs), MW_OK);
    EXPECT(mw_file_set_add_output(fs, path_of("precious.bin"), "--out", 0, 0), MW_ERR_IO, "--out",
           "precious.bin is read-only (mode 0444): not replaced");
    mw_file_set_free(fs);
    mw_output *o;
    EXPECT(mw_output_open(path_of("precious.bin"), "--out", 0, &o), MW_ERR_IO, "read-only");
    cr_assert_str_eq(read_text(path_of("precious.bin")), "precious");
    cr_assert_str_eq(listing(), "precious.bin");
}

#define NOBODY 65534

/* Runs check in a child process that became the unprivileged user NOBODY, and returns what it
 * wrote (one line per call: the status name and the message). The test's folder is opened to
 * that user first. Needs root. */
static const char *as_nobody(void (*check)(FILE *out)) {
    static char out[8192];
    int fds[2];
    cr_assert_eq(chmod(dir, 0755), 0);
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0) _exit(3);
        FILE *f = fdopen(fds[1], "w");
        if (!f) _exit(4);
        check(f);
        fclose(f);
        _exit(0);
    }
    close(fds[1]);
    size_t n = 0;
    for (ssize_t r; n < sizeof out - 1 && (r = read(fds[0], out + n, sizeof out - 1 - n)) > 0;)
        n += (size_t)r;
    out[n] = '\0';
    close(fds[0]);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed (%d): %s", status,
              out);
    return out;
}

static void report(FILE *f, mw_status st) {
    fprintf(f, "%s %s\n", mw_status_name(st), st ? mw_last_error() : "");
}

static void replace_roots_file(FILE *f) {
    mw_file_set *fs;
    if (mw_file_set_new(&fs) != MW_OK) return;
    report(f, mw_file_set_add_output(fs, path_of("open/root.bin"), "--out", 0, 0));
    mw_file_set_free(fs);
    mw_output *o = NULL;
    report(f, mw_output_open(path_of("open/root.bin"), "--out", 0, &o));
    mw_output_abandon(o);
}

/* A file the effective user may not write, though it has a write bit (the rename itself would
 * need only the folder): refused before any work. As root, root's file of mode 0644 checked by
 * nobody in a folder nobody may write; otherwise one's own file of mode 0060 (the group may
 * write it, its owner not). */
Test(file, a_file_the_user_may_not_write_is_not_replaced) {
    mkdir(path_of("open"), 0777);
    cr_assert_eq(chmod(path_of("open"), 0777), 0);
    write_text(path_of("open/root.bin"), "root's");
    char want[160];
    snprintf(want, sizeof want, "--out %s cannot be replaced: Permission denied",
             path_of("open/root.bin"));
    if (geteuid() == 0) {
        cr_assert_eq(chmod(path_of("open/root.bin"), 0644), 0);
        const char *out = as_nobody(replace_roots_file);
        const char *second = strstr(out, want) ? strstr(strstr(out, want) + 1, want) : NULL;
        cr_assert(strncmp(out, "MW_ERR_IO ", 10) == 0 && second, "two refusals of '%s' wanted:\n%s",
                  want, out);
    } else {
        cr_assert_eq(chmod(path_of("open/root.bin"), 0060), 0);
        mw_file_set *fs;
        cr_assert_eq(mw_file_set_new(&fs), MW_OK);
        EXPECT(mw_file_set_add_output(fs, path_of("open/root.bin"), "--out", 0, 0), MW_ERR_IO,
               want);
        mw_file_set_free(fs);
        mw_output *o;
        EXPECT(mw_output_open(path_of("open/root.bin"), "--out", 0, &o), MW_ERR_IO, want);
        cr_assert_eq(chmod(path_of("open/root.bin"), 0600), 0);
    }
    cr_assert_str_eq(read_text(path_of("open/root.bin")), "root's");
}

static void replace_in_sticky_folder(FILE *f) {
    mw_file_set *fs;
    if (mw_file_set_new(&fs) != MW_OK) return;
    report(f, mw_file_set_add_output(fs, path_of("sticky/root.bin"), "--out", 0, 0));
    report(f, mw_file_set_add_output(fs, path_of("sticky/mine.bin"), "--out", 0, 0));
    mw_file_set_free(fs);
    mw_output *o = NULL;
    report(f, mw_output_open(path_of("sticky/root.bin"), "--out", 0, &o));
    mw_output_abandon(o);
}

/* Another user's file in a sticky folder (as in /tmp), which the effective user may write (mode
 * 0666) but not rename over: refused before any work, not found out at the commit. A new file
 * in the sticky folder is fine. */
Test(file, another_users_file_in_a_sticky_folder_is_not_replaced) {
    if (geteuid() != 0) cr_skip_test("needs root, to make another user's files and be that user");
    mkdir(path_of("sticky"), 0777);
    cr_assert_eq(chmod(path_of("sticky"), 01777), 0);
    write_text(path_of("sticky/root.bin"), "root's");
    cr_assert_eq(chmod(path_of("sticky/root.bin"), 0666), 0);
    const char *out = as_nobody(replace_in_sticky_folder);
    char want[3][160];
    snprintf(want[0], sizeof want[0],
             "MW_ERR_IO --out %s belongs to another user (uid 0) in the sticky folder",
             path_of("sticky/root.bin"));
    snprintf(want[1], sizeof want[1], "MW_OK \n");
    snprintf(want[2], sizeof want[2], "MW_ERR_IO --out %s belongs to another user",
             path_of("sticky/root.bin"));
    const char *at = out;
    for (int i = 0; i < 3; i++) {
        const char *line = strstr(at, want[i]);
        cr_assert_not_null(line, "line %d: no '%s' in:\n%s", i, want[i], at);
        at = strchr(line, '\n') + 1;
    }
    cr_assert_str_eq(read_text(path_of("sticky/root.bin")), "root's");
}

/* In a sticky world-writable folder (/tmp), a link another user owns names a file of their
 * choosing: not followed (the victim's file stays as it was); one's own link is. */
Test(file, another_users_link_in_a_sticky_folder_is_not_followed) {
    if (geteuid() != 0) cr_skip_test("needs root, to make another user's symbolic link");
    mkdir(path_of("sticky"), 0777);
    cr_assert_eq(chmod(path_of("sticky"), 01777), 0);
    write_text(path_of("victim.txt"), "the victim's");
    cr_assert_eq(symlink(path_of("victim.txt"), path_of("sticky/planted")), 0);
    cr_assert_eq(lchown(path_of("sticky/planted"), NOBODY, NOBODY), 0);
    cr_assert_eq(symlink(path_of("victim.txt"), path_of("sticky/mine")), 0);
    mw_file_set *fs;
    cr_assert_eq(mw_file_set_new(&fs), MW_OK);
    EXPECT(mw_file_set_add_output(fs, path_of("sticky/planted"), "--save", 0, 0), MW_ERR_IO,
           "is a symbolic link that another user (uid 65534) owns, in the sticky folder",
           "not followed");
    cr_assert_eq(mw_file_set_add_output(fs, path_of("sticky/mine"), "--save", 0, 0), MW_OK, "%s",
                 mw_last_error());
    mw_file_set_free(fs);
    mw_output *o;
    EXPECT(mw_output_open(path_of("sticky/planted"), "--save", 0, &o), MW_ERR_IO, "not followed");
    cr_assert_str_eq(read_text(path_of("victim.txt")), "the victim's");
}

/* A final name as long as a name may be has a temporary name that fits too (it does not grow
 * with the final one); one longer than the file system takes is refused before any work. */
Test(file, a_long_name_is_written_or_refused_before_the_work) {
    char name[300];
    memset(name, 'c', sizeof name);
    name[250] = '\0';
    mw_file_set *fs;
    cr_assert_eq(mw_file_set_new(&fs), MW_OK);
    cr_assert_eq(mw_file_set_add_output(fs, path_of(name), "--checkpoint", 0, 0), MW_OK, "%s",
                 mw_last_error());
    mw_output *o;
    cr_assert_eq(mw_output_open(path_of(name), "--checkpoint", 0, &o), MW_OK, "%s",
                 mw_last_error());
    cr_assert_eq(mw_output_write(o, "long", 4), MW_OK);
    cr_assert_eq(mw_output_commit(o), MW_OK, "%s", mw_last_error());
    cr_assert_str_eq(read_text(path_of(name)), "long");
    cr_assert_str_eq(listing(), name);
    name[250] = 'c';
    name[260] = '\0';
    EXPECT(mw_file_set_add_output(fs, path_of(name), "--checkpoint", 0, 0), MW_ERR_IO,
           "File name too long");
    EXPECT(mw_output_open(path_of(name), "--checkpoint", 0, &o), MW_ERR_IO, "File name too long");
    mw_file_set_free(fs);
}

/* --- writing an output ------------------------------------------------------------------------ */

Test(file, an_output_appears_whole_at_the_commit) {
    write_text(path_of("out.txt"), "old");
    cr_assert_eq(chmod(path_of("out.txt"), 04640), 0);
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
    cr_assert_eq(sb.st_mode & 07777, 0640, "the permission bits are kept, not the set-id bits: %o",
                 (unsigned)(sb.st_mode & 07777));
    cr_assert_str_eq(listing(), "out.txt");
}

/* A commit touches its final name only: a file named like an old temporary name ("<out>.tmp",
 * an input or another output of the run) and one with the pattern of another writer's stay. */
Test(file, a_commit_leaves_every_other_file_alone) {
    write_text(path_of("out.txt.tmp"), "notes");
    const char *foreign = ".out.txt.tmp-mw-0123456789abcdef-999999-0";
    write_text(path_of(foreign), "another namespace's");
    mw_output *o;
    cr_assert_eq(mw_output_open(path_of("out.txt"), "--out", 0, &o), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_output_write(o, "new", 3), MW_OK);
    cr_assert_eq(mw_output_commit(o), MW_OK, "%s", mw_last_error());
    cr_assert_str_eq(read_text(path_of("out.txt.tmp")), "notes");
    cr_assert_str_eq(read_text(path_of(foreign)), "another namespace's");
    cr_assert_str_eq(read_text(path_of("out.txt")), "new");
    cr_assert_str_eq(listing(), ".out.txt.tmp-mw-0123456789abcdef-999999-0 out.txt out.txt.tmp");
}

/* What the final name is at the commit is checked again: become a FIFO or read-only since the
 * open, it is not replaced, and the temporary file goes. */
Test(file, the_final_name_is_checked_again_at_the_commit) {
    write_text(path_of("out.bin"), "old");
    mw_output *o;
    cr_assert_eq(mw_output_open(path_of("out.bin"), "--out", 0, &o), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_output_write(o, "new", 3), MW_OK);
    cr_assert_eq(unlink(path_of("out.bin")), 0);
    cr_assert_eq(mkfifo(path_of("out.bin"), 0600), 0);
    EXPECT(mw_output_commit(o), MW_ERR_IO, "exists and is a FIFO", "not replaced");
    struct stat sb;
    cr_assert(stat(path_of("out.bin"), &sb) == 0 && S_ISFIFO(sb.st_mode), "the FIFO was replaced");
    cr_assert_str_eq(listing(), "out.bin");
    write_text(path_of("ro.bin"), "old");
    cr_assert_eq(mw_output_open(path_of("ro.bin"), "--out", 0, &o), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_output_write(o, "new", 3), MW_OK);
    cr_assert_eq(chmod(path_of("ro.bin"), 0444), 0);
    EXPECT(mw_output_commit(o), MW_ERR_IO, "is read-only");
    cr_assert_str_eq(read_text(path_of("ro.bin")), "old");
    cr_assert_str_eq(listing(), "out.bin ro.bin");
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
 * and the commit return it, the temporary file goes and the old file stays; whether it fails in
 * a write (one larger than the buffer) or only at the commit (the last buffer). */
Test(file, a_failed_write_leaves_the_old_file) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {1000, 1000};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    for (int at_commit = 0; at_commit < 2; at_commit++) {
        write_text(path_of("out.txt"), "old");
        mw_output *o;
        cr_assert_eq(mw_output_open(path_of("out.txt"), "--out", 0, &o), MW_OK);
        if (!at_commit) {
            static char big[200000];
            EXPECT(mw_output_write(o, big, sizeof big), MW_ERR_IO, "cannot write --out",
                   "File too large", "is as it was");
            EXPECT(mw_output_write(o, "x", 1), MW_ERR_IO, "File too large");
        } else {
            for (int i = 0; i < 200; i++) cr_assert_eq(mw_output_printf(o, "line %d\n", i), MW_OK);
        }
        EXPECT(mw_output_commit(o), MW_ERR_IO, "File too large");
        cr_assert_str_eq(read_text(path_of("out.txt")), "old");
        cr_assert_str_eq(listing(), "out.txt");
    }
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
    EXPECT(mw_output_open(path_of("missing/x.bin"), "--save", 0, &o), MW_ERR_IO, "--save",
           "x.bin cannot be written: cannot create a file in", "missing: No such file");
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
        mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)(n));
        mw_file_set *fs = NULL;
        mw_status st = mw_file_set_new(&fs);
        if (st == MW_OK) st = mw_file_set_add_input(fs, path_of("in.txt"), "--data", 0);
        if (st == MW_OK) st = mw_file_set_add_output(fs, path_of("out.txt"), "--save", 0, 10);
        if (st == MW_OK) st = mw_file_set_add_output(fs, path_of("two.txt"), "--other", 0, 10);
        mw_output *o = NULL;
        if (st == MW_OK) st = mw_output_open(path_of("out.txt"), "--save", 0, &o);
        if (st == MW_OK) st = mw_output_printf(o, "%2000d", 7);
        if (st == MW_OK) {
            st = mw_output_commit(o);
        } else {
            mw_output_abandon(o);
        }
        mw_file_set_free(fs);
        int64_t made = mw_test_control(MW_TEST_ALLOCATIONS);
        mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)(0));
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
