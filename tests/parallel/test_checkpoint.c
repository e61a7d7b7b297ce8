/* Resumable checkpoints: a resumed run equals the uninterrupted one bit for bit, and a damaged,
 * truncated or mismatched file is refused with the trainer and the old file untouched. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpt2_model.h"
#include "meshwit.h"
#include "meshwit/testing.h"

#define B 4
#define T 8

static const gpt2_config config = {
    .layers = 1, .heads = 2, .channels = 16, .max_seq = 8, .vocab = 32, .padded_vocab = 32};

typedef struct run {
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
} run;

static void run_make(run *r, const gpt2_config *c, const char *devices) {
    gpt2_graph m;
    cr_assert_eq(mw_graph_new(&r->g), MW_OK);
    cr_assert_eq(gpt2_build(r->g, c, &(gpt2_layout){.batch = B, .seq = T, .data_axis = "X"}, &m),
                 MW_OK, "%s", mw_graph_error(r->g));
    cr_assert_eq(mw_mesh_new(devices, "X", &r->mesh), MW_OK);
    mw_trainer_config cfg = {.optimizer = {MW_ADAMW, .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f,
                                           .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f,
                                           .warmup_steps = 2, .decay_steps = 8,
                                           .min_lr_ratio = 0.1f}};
    cr_assert_eq(mw_trainer_new(r->g, m.loss, r->mesh, &cfg, &r->tr), MW_OK, "%s", mw_last_error());
}

static void run_free(run *r) {
    mw_trainer_free(r->tr);
    mw_mesh_free(r->mesh);
    mw_graph_free(r->g);
}

/* The batch of step k depends only on k (the "data position"). */
static void step(run *r, int k) {
    int32_t tok[B * T + 1];
    for (int i = 0; i < B * T + 1; i++) tok[i] = (int32_t)((i * 7 + k * 13 + i / 5) % 32);
    mw_feed f[2] = {{"tokens", tok, B * T}, {"targets", tok + 1, B * T}};
    cr_assert_eq(mw_trainer_step(r->tr, f, 2, NULL), MW_OK, "%s", mw_last_error());
}

static float *snapshot(run *r, const char *name, int64_t n) {
    float *v = malloc((size_t)n * sizeof *v);
    cr_assert_eq(mw_trainer_read_param(r->tr, name, v, n), MW_OK);
    return v;
}

static char dir[64];
static char path[128];

static void setup(void) {
    snprintf(dir, sizeof dir, "/tmp/mw_ckpt_XXXXXX");
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/state.mwc", dir);
}

static void teardown(void) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(checkpoint, .init = setup, .fini = teardown);

Test(checkpoint, resume_is_bitwise_identical) {
    run whole, first, resumed;
    run_make(&whole, &config, "cpu:2");
    for (int k = 0; k < 6; k++) step(&whole, k);

    run_make(&first, &config, "cpu:2");
    for (int k = 0; k < 3; k++) step(&first, k);
    uint64_t position = 3;
    cr_assert_eq(mw_trainer_save(first.tr, path, &position, sizeof position), MW_OK, "%s",
                 mw_last_error());
    run_free(&first);

    run_make(&resumed, &config, "cpu:2");
    uint64_t restored = 0;
    size_t n = 0;
    cr_assert_eq(mw_trainer_load(resumed.tr, path, &restored, sizeof restored, &n), MW_OK, "%s",
                 mw_last_error());
    cr_assert_eq(n, sizeof restored);
    cr_assert_eq(restored, 3);
    cr_assert_eq(mw_trainer_steps(resumed.tr), 3);
    for (int k = (int)restored; k < 6; k++) step(&resumed, k);

    const char *names[] = {"wte", "h0.qkvw", "h0.ln2b", "lnfw"};
    const int64_t sizes[] = {32 * 16, 48 * 16, 16, 16};
    for (int i = 0; i < 4; i++) {
        float *a = snapshot(&whole, names[i], sizes[i]),
              *b = snapshot(&resumed, names[i], sizes[i]);
        cr_assert(memcmp(a, b, (size_t)sizes[i] * sizeof *a) == 0, "%s differs after resume",
                  names[i]);
        free(a);
        free(b);
    }
    run_free(&whole);
    run_free(&resumed);
}

/* Writes a copy of the checkpoint with `edit` applied and checks the load fails as expected,
 * leaving the trainer as it was. */
static void refuse(run *r, void (*edit)(unsigned char *, long *), mw_status want,
                   const char *words) {
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    unsigned char *buf = malloc(1 << 20);
    long n = (long)fread(buf, 1, 1 << 20, f);
    fclose(f);
    edit(buf, &n);
    char bad[160];
    snprintf(bad, sizeof bad, "%s/bad.mwc", dir);
    f = fopen(bad, "wb");
    cr_assert(f);
    fwrite(buf, 1, (size_t)n, f);
    fclose(f);
    free(buf);
    float *before = snapshot(r, "wte", 32 * 16);
    int64_t steps = mw_trainer_steps(r->tr);
    mw_status st = mw_trainer_load(r->tr, bad, NULL, 0, NULL);
    cr_assert_eq(st, want, "got %s: %s", mw_status_name(st), mw_last_error());
    cr_assert(strstr(mw_last_error(), words), "message lacks '%s': %s", words, mw_last_error());
    float *after = snapshot(r, "wte", 32 * 16);
    cr_assert(memcmp(before, after, 32 * 16 * sizeof *before) == 0, "a refused load changed wte");
    cr_assert_eq(mw_trainer_steps(r->tr), steps);
    free(before);
    free(after);
}

static void flip_body(unsigned char *b, long *n) { b[*n / 2] ^= 0x40; }
static void truncate_half(unsigned char *b, long *n) { (void)b, *n /= 2; }
static void drop_last(unsigned char *b, long *n) { (void)b, *n -= 1; }
static void bad_magic(unsigned char *b, long *n) { (void)n, b[0] = 'X'; }
static void empty(unsigned char *b, long *n) { (void)b, *n = 0; }

Test(checkpoint, damaged_files_are_refused) {
    run r;
    run_make(&r, &config, "cpu:2");
    step(&r, 0);
    cr_assert_eq(mw_trainer_save(r.tr, path, NULL, 0), MW_OK, "%s", mw_last_error());
    step(&r, 1);
    refuse(&r, flip_body, MW_ERR_FORMAT, "checksum");
    refuse(&r, truncate_half, MW_ERR_FORMAT, "truncated");
    refuse(&r, drop_last, MW_ERR_FORMAT, "truncated");
    refuse(&r, bad_magic, MW_ERR_FORMAT, "not a meshwit checkpoint");
    refuse(&r, empty, MW_ERR_FORMAT, "truncated");
    cr_assert_eq(mw_trainer_load(r.tr, "/nonexistent/x.mwc", NULL, 0, NULL), MW_ERR_IO);
    run_free(&r);
}

Test(checkpoint, another_model_is_refused) {
    run r, other;
    run_make(&r, &config, "cpu:1");
    cr_assert_eq(mw_trainer_save(r.tr, path, NULL, 0), MW_OK);
    gpt2_config wider = config;
    wider.channels = 32;
    run_make(&other, &wider, "cpu:1");
    cr_assert_eq(mw_trainer_load(other.tr, path, NULL, 0, NULL), MW_ERR_FORMAT);
    cr_assert(strstr(mw_last_error(), "wte"), "%s", mw_last_error());
    run_free(&r);
    run_free(&other);
}

Test(checkpoint, caller_state_larger_than_buffer_is_refused) {
    run r;
    run_make(&r, &config, "cpu:1");
    char state[32] = "data position and rng";
    cr_assert_eq(mw_trainer_save(r.tr, path, state, sizeof state), MW_OK);
    char small[8];
    cr_assert_eq(mw_trainer_load(r.tr, path, small, sizeof small, NULL), MW_ERR_FORMAT);
    run_free(&r);
}

/* A save that fails (here beyond RLIMIT_FSIZE, as a full disk would) leaves the previous file as
 * it was, loadable, and no temporary file beside it. */
Test(checkpoint, failed_save_keeps_the_previous_file) {
    run r;
    run_make(&r, &config, "cpu:1");
    cr_assert_eq(mw_trainer_save(r.tr, path, NULL, 0), MW_OK);
    struct stat before, after;
    cr_assert_eq(stat(path, &before), 0);
    step(&r, 0);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit saved, lim;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &saved), 0);
    lim = saved;
    lim.rlim_cur = (rlim_t)before.st_size / 2; /* the soft limit alone: raised again below */
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    mw_status st = mw_trainer_save(r.tr, path, NULL, 0);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &saved), 0);
    cr_assert_eq(st, MW_ERR_IO, "%s", mw_last_error());
    cr_assert(strstr(mw_last_error(), "File too large"), "%s", mw_last_error());
    cr_assert_eq(stat(path, &after), 0);
    cr_assert_eq(before.st_size, after.st_size);
    cr_assert_eq(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    for (struct dirent *e; (e = readdir(d));)
        cr_assert(!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
                      !strcmp(e->d_name, strrchr(path, '/') + 1),
                  "%s is left beside the checkpoint", e->d_name);
    closedir(d);
    /* The old file still loads. */
    cr_assert_eq(mw_trainer_load(r.tr, path, NULL, 0, NULL), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_steps(r.tr), 0);
    run_free(&r);
}

Test(checkpoint, out_of_memory_while_loading) {
    run r;
    run_make(&r, &config, "cpu:2");
    cr_assert_eq(mw_trainer_save(r.tr, path, NULL, 0), MW_OK);
    mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)(0));
    cr_assert_eq(mw_trainer_load(r.tr, path, NULL, 0, NULL), MW_OK);
    int64_t total = mw_test_control(MW_TEST_ALLOCATIONS);
    for (int64_t n = 1; n <= total; n++) {
        mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)(n));
        cr_assert_eq(mw_trainer_load(r.tr, path, NULL, 0, NULL), MW_ERR_NOMEM);
    }
    mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)(0));
    run_free(&r);
}

/* What a checkpoint holds, read without a trainer: its step and the caller's state, after the
 * same checks of the file as a load (a damaged one, a FIFO, a state larger than the buffer are
 * refused); the run it belongs to can be compared before anything is built. */
Test(checkpoint, info_reads_the_step_and_state_without_a_trainer) {
    run r;
    run_make(&r, &config, "cpu:1");
    step(&r, 0);
    step(&r, 1);
    char state[40] = "lr 0.002\nsteps 600\n";
    cr_assert_eq(mw_trainer_save(r.tr, path, state, sizeof state), MW_OK, "%s", mw_last_error());
    run_free(&r);
    int64_t at = -1;
    char got[64] = "";
    size_t n = 0;
    cr_assert_eq(mw_checkpoint_info(path, &at, got, sizeof got, &n), MW_OK, "%s", mw_last_error());
    cr_assert_eq(at, 2);
    cr_assert_eq(n, sizeof state);
    cr_assert_str_eq(got, state);
    /* The step or the state's size alone: no buffer needed, whatever the state's size. */
    at = -1;
    n = 0;
    cr_assert_eq(mw_checkpoint_info(path, &at, NULL, 0, &n), MW_OK, "%s", mw_last_error());
    cr_assert_eq(at, 2);
    cr_assert_eq(n, sizeof state);
    cr_assert_eq(mw_checkpoint_info(path, NULL, NULL, 0, NULL), MW_OK, "%s", mw_last_error());
    /* A buffer too small for the state is refused, and nothing is reported. */
    char small[8] = "";
    at = -1;
    n = 0;
    cr_assert_eq(mw_checkpoint_info(path, &at, small, sizeof small, &n), MW_ERR_FORMAT);
    cr_assert(strstr(mw_last_error(), "carries 40 bytes of caller state; the buffer holds 8"), "%s",
              mw_last_error());
    cr_assert(at == -1 && n == 0);
    /* Truncated by one byte: the size the header implies says so before the checksum. */
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0);
    cr_assert_eq(truncate(path, sb.st_size - 1), 0);
    cr_assert_eq(mw_checkpoint_info(path, &at, NULL, 0, NULL), MW_ERR_FORMAT);
    cr_assert(strstr(mw_last_error(), "is truncated"), "%s", mw_last_error());
    r.tr = NULL;
    run_make(&r, &config, "cpu:1");
    cr_assert_eq(mw_trainer_save(r.tr, path, state, sizeof state), MW_OK, "%s", mw_last_error());
    run_free(&r);
    /* One byte changed: the checksum refuses it. */
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    fseek(f, 100, SEEK_SET);
    fputc('X', f);
    fclose(f);
    cr_assert_eq(mw_checkpoint_info(path, &at, got, sizeof got, &n), MW_ERR_FORMAT);
    cr_assert(strstr(mw_last_error(), "checksum"), "%s", mw_last_error());
    char fifo[160];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    cr_assert_eq(mw_checkpoint_info(fifo, &at, NULL, 0, NULL), MW_ERR_IO);
    cr_assert(strstr(mw_last_error(), "it is a FIFO"), "%s", mw_last_error());
    cr_assert_eq(mw_checkpoint_info(NULL, &at, NULL, 0, NULL), MW_ERR_INVALID);
}

/* Reading what a checkpoint holds needs no memory the size of the file: the header, the state
 * and a streamed checksum (here with the address space limited to what the process has plus
 * 16 MiB, for a checkpoint of 64 MiB). */
Test(checkpoint, info_reads_a_large_checkpoint_in_bounded_memory) {
#if defined(__SANITIZE_ADDRESS__)
    cr_skip_test("AddressSanitizer reserves address space as it goes: no limit to test under");
#endif
    run r;
    run_make(&r, &config, "cpu:1");
    size_t big = (size_t)64 << 20;
    unsigned char *state = malloc(big);
    cr_assert_not_null(state);
    for (size_t i = 0; i < big; i++) state[i] = (unsigned char)(i * 31 + 7);
    cr_assert_eq(mw_trainer_save(r.tr, path, state, big), MW_OK, "%s", mw_last_error());
    free(state);
    run_free(&r);
    long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld", &pages) != 1) cr_skip_test("no /proc/self/statm to size the limit");
    fclose(f);
    struct rlimit saved, lim;
    cr_assert_eq(getrlimit(RLIMIT_AS, &saved), 0);
    lim = saved;
    lim.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)16 << 20);
    cr_assert_eq(setrlimit(RLIMIT_AS, &lim), 0);
    int64_t at = -1;
    size_t n = 0;
    mw_status st = mw_checkpoint_info(path, &at, NULL, 0, &n);
    cr_assert_eq(setrlimit(RLIMIT_AS, &saved), 0);
    cr_assert_eq(st, MW_OK, "%s", mw_last_error());
    cr_assert_eq(at, 0);
    cr_assert_eq(n, big);
}
