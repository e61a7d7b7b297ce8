/* Trust within one process: stop requests at step boundaries (also from a real signal handler),
 * skipped non-finite steps, replica checksums, and checkpoints that are damaged, odd files,
 * forged or written by several writers at once. (Across processes: tests/mpi/mpi_trust.c.) */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "meshwit.h"
#include "parallel/config.h"
#include "parallel/trainer_impl.h"

#define ROWS 16
#define FEATURES 4

/* loss = mean((x . w + b - y)^2) over Batch@X, AdamW. */
typedef struct model {
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
    float x[ROWS * FEATURES], y[ROWS];
    mw_feed feeds[2];
} model;

static void model_make(model *m, const char *devices, const mw_trainer_config *extra) {
    memset(m, 0, sizeof *m);
    cr_assert_eq(mw_graph_new(&m->g), MW_OK);
    mw_graph *g = m->g;
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", ROWS}, {"Feature", FEATURES}));
    mw_tensor *y = mw_input(g, "y", MW_F32, MW_AXES({"Batch", ROWS}));
    x = mw_shard(g, x, "Batch", "X");
    y = mw_shard(g, y, "Batch", "X");
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Feature", FEATURES}), MW_INIT_NORMAL(0.5f));
    mw_tensor *b = mw_param(g, "b", MW_SCALAR, MW_INIT_CONST(0.25f));
    mw_tensor *err = mw_sub(g, mw_add(g, mw_dot(g, x, w, "Feature"), b), y);
    mw_tensor *loss = mw_mean(g, mw_mul(g, err, err), NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    cr_assert_eq(mw_mesh_new(devices, "X", &m->mesh), MW_OK);
    mw_trainer_config cfg = extra ? *extra : (mw_trainer_config){0};
    cfg.optimizer = (mw_optimizer){MW_ADAMW,       .lr = 0.05f,  .beta1 = 0.9f,
                                   .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    cr_assert_eq(mw_trainer_new(g, loss, m->mesh, &cfg, &m->tr), MW_OK, "%s", mw_last_error());
    for (int r = 0; r < ROWS; r++) {
        for (int f = 0; f < FEATURES; f++) m->x[r * FEATURES + f] = (float)((r * 3 + f) % 7) - 3;
        m->y[r] = (float)(r % 5) - 2;
    }
    m->feeds[0] = (mw_feed){"x", m->x, ROWS * FEATURES};
    m->feeds[1] = (mw_feed){"y", m->y, ROWS};
}

static void model_free(model *m) {
    mw_trainer_free(m->tr);
    mw_mesh_free(m->mesh);
    mw_graph_free(m->g);
}

static void params(model *m, float out[FEATURES + 1]) {
    cr_assert_eq(mw_trainer_read_param(m->tr, "w", out, FEATURES), MW_OK);
    cr_assert_eq(mw_trainer_read_param(m->tr, "b", out + FEATURES, 1), MW_OK);
}

/* --- stop requests ------------------------------------------------------------------------------
 */

Test(stop, trainer_request_stops_the_next_step_once) {
    model m;
    model_make(&m, "cpu:2", NULL);
    cr_assert_eq(mw_trainer_step(m.tr, m.feeds, 2, NULL), MW_OK);
    float before[FEATURES + 1], after[FEATURES + 1];
    params(&m, before);
    mw_trainer_request_stop(m.tr);
    float loss = -1.0f;
    cr_assert_eq(mw_trainer_step(m.tr, m.feeds, 2, &loss), MW_ERR_INTERRUPTED);
    cr_assert(strstr(mw_last_error(), "stopped after step 1"), "%s", mw_last_error());
    cr_assert_eq(loss, -1.0f, "an interrupted step writes no loss");
    cr_assert_eq(mw_trainer_steps(m.tr), 1);
    params(&m, after);
    cr_assert_arr_eq(before, after, sizeof before, "an interrupted step changes nothing");
    /* Evaluation is not a step; the request was consumed by the step that reported it. */
    cr_assert_eq(mw_trainer_eval(m.tr, m.feeds, 2, NULL), MW_OK);
    cr_assert_eq(mw_trainer_step(m.tr, m.feeds, 2, NULL), MW_OK);
    cr_assert_eq(mw_trainer_steps(m.tr), 2);
    model_free(&m);
}

static void on_sigint(int sig) {
    (void)sig;
    mw_request_stop();
}

Test(stop, a_signal_handler_stops_every_trainer_until_cancelled) {
    model a, b;
    model_make(&a, "cpu:2", NULL);
    model_make(&b, "cpu:1", NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    cr_assert_eq(sigaction(SIGINT, &sa, NULL), 0);
    cr_assert_eq(mw_trainer_step(a.tr, a.feeds, 2, NULL), MW_OK);
    cr_assert_eq(raise(SIGINT), 0);
    cr_assert(mw_stop_requested());
    cr_assert_eq(mw_trainer_step(a.tr, a.feeds, 2, NULL), MW_ERR_INTERRUPTED);
    cr_assert_eq(mw_trainer_step(a.tr, a.feeds, 2, NULL), MW_ERR_INTERRUPTED, "it stays set");
    cr_assert_eq(mw_trainer_step(b.tr, b.feeds, 2, NULL), MW_ERR_INTERRUPTED);
    cr_assert_str_eq(mw_status_name(MW_ERR_INTERRUPTED), "MW_ERR_INTERRUPTED");
    mw_cancel_stop();
    cr_assert_not(mw_stop_requested());
    cr_assert_eq(mw_trainer_step(a.tr, a.feeds, 2, NULL), MW_OK);
    cr_assert_eq(mw_trainer_steps(a.tr), 2);
    model_free(&a);
    model_free(&b);
}

/* --- non-finite steps ---------------------------------------------------------------------------
 */

/* A NaN in the batch (loss and gradients NaN) and huge values (a finite loss, gradients whose
 * squared norm overflows) are skipped: afterwards the run equals one that never saw them. */
Test(nonfinite, skipped_steps_leave_parameters_moments_and_count_alone) {
    mw_trainer_config cfg = {.nonfinite = MW_NONFINITE_SKIP};
    model m, ref;
    model_make(&m, "cpu:2", &cfg);
    model_make(&ref, "cpu:2", NULL);
    cr_assert_eq(mw_trainer_step(m.tr, m.feeds, 2, NULL), MW_OK);
    cr_assert_eq(mw_trainer_step(ref.tr, ref.feeds, 2, NULL), MW_OK);

    float x = m.x[5];
    m.x[5] = NAN;
    float loss = 0.0f;
    cr_assert_eq(mw_trainer_step(m.tr, m.feeds, 2, &loss), MW_OK, "%s", mw_last_error());
    cr_assert(isnan(loss));
    cr_assert_eq(mw_trainer_skipped_steps(m.tr), 1);
    cr_assert_eq(mw_trainer_steps(m.tr), 1);

    float big[ROWS * FEATURES], zero[ROWS] = {0};
    for (int i = 0; i < ROWS * FEATURES; i++) big[i] = 1e15f;
    mw_feed huge[2] = {{"x", big, ROWS * FEATURES}, {"y", zero, ROWS}};
    cr_assert_eq(mw_trainer_eval(m.tr, huge, 2, &loss), MW_OK);
    cr_assert(isfinite(loss), "the loss is finite (%g): the gradient norm must catch it", loss);
    cr_assert_eq(mw_trainer_step(m.tr, huge, 2, &loss), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_skipped_steps(m.tr), 2);
    cr_assert_eq(mw_trainer_steps(m.tr), 1);
    cr_assert(!isfinite(mw_trainer_grad_norm(m.tr)));

    m.x[5] = x;
    for (int s = 0; s < 3; s++) {
        cr_assert_eq(mw_trainer_step(m.tr, m.feeds, 2, NULL), MW_OK);
        cr_assert_eq(mw_trainer_step(ref.tr, ref.feeds, 2, NULL), MW_OK);
    }
    float got[FEATURES + 1], want[FEATURES + 1];
    params(&m, got);
    params(&ref, want);
    cr_assert_arr_eq(got, want, sizeof got, "moments or the step count changed in a skipped step");
    cr_assert_eq(mw_trainer_steps(m.tr), 4);
    cr_assert_eq(mw_trainer_skipped_steps(ref.tr), 0);
    model_free(&m);
    model_free(&ref);
}

Test(nonfinite, by_default_a_nonfinite_step_fails) {
    model m;
    model_make(&m, "cpu:1", NULL);
    m.x[0] = INFINITY;
    cr_assert_eq(mw_trainer_step(m.tr, m.feeds, 2, NULL), MW_ERR_NONFINITE);
    cr_assert(strstr(mw_last_error(), "step 0: the loss is") &&
                  strstr(mw_last_error(), "MW_NONFINITE_SKIP"),
              "%s", mw_last_error());
    cr_assert_eq(mw_trainer_skipped_steps(m.tr), 0);
    cr_assert_eq(mw_trainer_steps(m.tr), 0);
    model_free(&m);
    /* MW_NONFINITE_IGNORE: the step runs (and trains on what it got). */
    mw_trainer_config cfg = {.nonfinite = MW_NONFINITE_IGNORE};
    model_make(&m, "cpu:1", &cfg);
    m.x[0] = INFINITY;
    cr_assert_eq(mw_trainer_step(m.tr, m.feeds, 2, NULL), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_steps(m.tr), 1);
    model_free(&m);
}

/* A finite loss whose gradient is not: sqrt's slope at 0 is Inf. The error names the parameter
 * whose gradient holds it (the first such, in graph order), on one device and sharded. */
Test(nonfinite, the_first_parameter_with_a_nonfinite_gradient_is_named) {
    const char *devs[] = {"cpu:1", "cpu:2"};
    for (int d = 0; d < 2; d++) {
        mw_graph *g;
        cr_assert_eq(mw_graph_new(&g), MW_OK);
        mw_tensor *x =
            mw_shard(g, mw_input(g, "x", MW_F32, MW_AXES({"Batch", 4}, {"F", 3})), "Batch", "X");
        mw_tensor *a = mw_param(g, "a", MW_AXES({"F", 3}), MW_INIT_CONST(1.0f));
        mw_tensor *r = mw_param(g, "root", MW_AXES({"F", 3}), MW_INIT_ZEROS);
        mw_tensor *loss = mw_mean(g, mw_mul(g, mw_add(g, mw_mul(g, x, a), mw_sqrt(g, r)), x), NULL);
        mw_mesh *mesh;
        mw_trainer *tr;
        cr_assert_eq(mw_mesh_new(devs[d], "X", &mesh), MW_OK);
        mw_trainer_config cfg = {.optimizer = MW_SGD_INIT(0.1f)};
        cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());
        float xs[12];
        for (int i = 0; i < 12; i++) xs[i] = 0.5f + 0.1f * (float)i;
        mw_feed f = {"x", xs, 12};
        float l;
        mw_status st = mw_trainer_step(tr, &f, 1, &l);
        cr_assert(isfinite(l), "the loss is finite (%g)", l);
        cr_assert_eq(st, MW_ERR_NONFINITE, "%s: %s", devs[d], mw_status_name(st));
        cr_assert(strstr(mw_last_error(), "step 0: the gradients hold NaN or Inf") &&
                      strstr(mw_last_error(), "parameter 'root'"),
                  "%s: %s", devs[d], mw_last_error());
        float back[3];
        cr_assert_eq(mw_trainer_read_param(tr, "a", back, 3), MW_OK);
        cr_assert(back[0] == 1.0f && back[2] == 1.0f, "a parameter changed");
        mw_trainer_free(tr);
        mw_mesh_free(mesh);
        mw_graph_free(g);
    }
}

/* --- replicas -----------------------------------------------------------------------------------
 */

Test(replicas, a_diverged_replica_is_named) {
    mw_trainer_config cfg = {.check_replicas_every = 2};
    model m;
    model_make(&m, "cpu:2", &cfg);
    cr_assert_eq(mw_trainer_check_replicas(m.tr), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_step(m.tr, m.feeds, 2, NULL), MW_OK);
    /* Silent corruption of device 1's copy of b (CPU parameters live in host memory). */
    mw_trainer *tr = m.tr;
    const mw_tensor *b = NULL;
    for (int i = 0; i < tr->prog->g->nnodes; i++)
        if (tr->prog->g->nodes[i]->op == MW__OP_PARAM &&
            strcmp(tr->prog->g->nodes[i]->name, "b") == 0)
            b = tr->prog->g->nodes[i];
    cr_assert(b);
    ((float *)tr->prog->w[1].params)[tr->prog->w[1].plan.params[b->leaf].off] += 1e-6f;
    mw_status st = mw_trainer_step(m.tr, m.feeds, 2, NULL);
    cr_assert_eq(st, MW_ERR_STATE, "step 2 must run the check (%s)", mw_status_name(st));
    cr_assert(strstr(mw_last_error(), "parameter 'b' differs between devices cpu:1 and cpu:0"),
              "%s", mw_last_error());
    model_free(&m);
}

Test(replicas, one_process_always_agrees) {
    cr_assert_eq(mw_distributed_agree("flags", "--seed 1\n", 0), MW_OK);
    cr_assert_eq(mw_distributed_agree(NULL, "x", 0), MW_ERR_INVALID);
}

/* --- checkpoints --------------------------------------------------------------------------------
 */

static char dir[64], path[128];

static void setup(void) {
    snprintf(dir, sizeof dir, "/tmp/mw_trust_XXXXXX");
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/state.mwc", dir);
}

static void teardown(void) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

static uint64_t fnv1a(const unsigned char *p, size_t n) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}

static unsigned char *read_all(const char *p, size_t *n) {
    FILE *f = fopen(p, "rb");
    cr_assert(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *d = malloc(*n);
    cr_assert_eq(fread(d, 1, *n, f), *n);
    fclose(f);
    return d;
}

static void write_all(const char *p, const unsigned char *d, size_t n) {
    FILE *f = fopen(p, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(d, 1, n, f), n);
    fclose(f);
}

/* A forged step (the checksum recomputed, so only the range check can catch it). */
Test(checkpoint_trust, a_step_out_of_range_is_refused, .init = setup, .fini = teardown) {
    model m;
    model_make(&m, "cpu:1", NULL);
    cr_assert_eq(mw_trainer_step(m.tr, m.feeds, 2, NULL), MW_OK);
    cr_assert_eq(mw_trainer_save(m.tr, path, NULL, 0), MW_OK, "%s", mw_last_error());
    size_t n;
    unsigned char *d = read_all(path, &n);
    const int64_t forged[] = {-7, (int64_t)1 << 54};
    for (int i = 0; i < 2; i++) {
        memcpy(d + 16, &forged[i], 8); /* after magic, version and optimizer */
        uint64_t sum = fnv1a(d, n - 8);
        memcpy(d + n - 8, &sum, 8);
        write_all(path, d, n);
        cr_assert_eq(mw_trainer_load(m.tr, path, NULL, 0, NULL), MW_ERR_FORMAT);
        cr_assert(strstr(mw_last_error(), "outside [0, 2^53]"), "%s", mw_last_error());
        cr_assert_eq(mw_trainer_steps(m.tr), 1);
    }
    free(d);
    model_free(&m);
}

Test(checkpoint_trust, odd_files_are_refused_without_blocking, .init = setup, .fini = teardown,
     .timeout = 60) {
    model m;
    model_make(&m, "cpu:1", NULL);
    char fifo[160];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    struct {
        const char *path, *kind;
    } odd[] = {{dir, "is a directory"}, {fifo, "is a FIFO"}, {"/dev/null", "character"}};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(mw_trainer_load(m.tr, odd[i].path, NULL, 0, NULL), MW_ERR_IO);
        cr_assert(strstr(mw_last_error(), odd[i].kind), "%s", mw_last_error());
        /* Nor is one replaced by a save: a rename would put a regular file in its place. */
        cr_assert_eq(mw_trainer_save(m.tr, odd[i].path, NULL, 0), MW_ERR_IO);
        cr_assert(strstr(mw_last_error(), odd[i].kind) && strstr(mw_last_error(), "not replaced"),
                  "%s", mw_last_error());
    }
    struct stat sb;
    cr_assert(stat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode));
    cr_assert(stat("/dev/null", &sb) == 0 && S_ISCHR(sb.st_mode));
    model_free(&m);
}

/* This process's temporary file name for path, up to and including its writer id and the dash
 * after it (".state.mwc.tmp-mw-0123456789abcdef-"): seen beside path while an output is open. */
static void temp_prefix(char *out, size_t size) {
    mw_output *o;
    cr_assert_eq(mw_output_open(path, "probe", 0, &o), MW_OK, "%s", mw_last_error());
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    out[0] = '\0';
    for (struct dirent *e; (e = readdir(d));) {
        const char *mark = strstr(e->d_name, ".tmp-mw-");
        if (mark && strlen(mark) > 8 + 17)
            snprintf(out, size, "%s/%.*s", dir, (int)(mark - e->d_name) + 8 + 17, e->d_name);
    }
    closedir(d);
    mw_output_abandon(o);
    cr_assert(out[0], "no temporary file was seen beside %s", path);
}

/* A writer killed while saving left temporary files behind: the first save of a process into the
 * folder removes them, but not one that a running process is still writing, nor one of another
 * kernel boot or process namespace (whose processes this one cannot ask about), nor a file that
 * only looks like one (an older version's "<path>.tmp": perhaps an input); and a folder is
 * swept once per process, not at every save. */
Test(checkpoint_trust, stale_temporary_files_are_removed, .init = setup, .fini = teardown) {
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    cr_assert(dead > 0);
    cr_assert_eq(waitpid(dead, NULL, 0), dead);
    char prefix[512], stale[600], live[600], remote[600], old[600], later[600];
    temp_prefix(prefix, sizeof prefix);
    snprintf(stale, sizeof stale, "%s%ld-0", prefix, (long)dead);
    snprintf(live, sizeof live, "%s%ld-3", prefix, (long)getppid());
    snprintf(remote, sizeof remote, "%s%ld-0", prefix, (long)dead);
    char *digit = remote + strlen(prefix) - 2; /* the writer id's last digit */
    *digit = *digit == '0' ? '1' : '0';
    snprintf(old, sizeof old, "%s.tmp", path);
    write_all(old, (const unsigned char *)"x", 1);
    write_all(stale, (const unsigned char *)"x", 1);
    write_all(live, (const unsigned char *)"x", 1);
    write_all(remote, (const unsigned char *)"x", 1);
    model m;
    model_make(&m, "cpu:1", NULL);
    cr_assert_eq(mw_trainer_save(m.tr, path, NULL, 0), MW_OK, "%s", mw_last_error());
    cr_assert_eq(access(stale, F_OK), -1, "a dead writer's temporary file is still there");
    cr_assert_eq(access(old, F_OK), 0, "a file named <path>.tmp was removed");
    cr_assert_eq(access(live, F_OK), 0, "a running writer's temporary file was removed");
    cr_assert_eq(access(remote, F_OK), 0, "another namespace's temporary file was removed");
    snprintf(later, sizeof later, "%s%ld-1", prefix, (long)dead);
    write_all(later, (const unsigned char *)"x", 1);
    cr_assert_eq(mw_trainer_save(m.tr, path, NULL, 0), MW_OK, "%s", mw_last_error());
    cr_assert_eq(access(later, F_OK), 0, "the folder was read again at the second save");
    cr_assert_eq(mw_trainer_load(m.tr, path, NULL, 0, NULL), MW_OK);
    model_free(&m);
}

#define WRITERS 3
#define SAVES 40

/* Writers save states that differ in every value (all parameters = k, user bytes = k) to one
 * path at once while a reader loads it: every load succeeds and holds one writer's state. */
Test(checkpoint_trust, concurrent_writers_leave_one_complete_state, .init = setup, .fini = teardown,
     .timeout = 240) {
    pid_t pids[WRITERS];
    for (int k = 0; k < WRITERS; k++) {
        pids[k] = fork();
        cr_assert(pids[k] >= 0);
        if (pids[k] > 0) continue;
        model m;
        model_make(&m, "cpu:1", NULL);
        float v[FEATURES + 1];
        for (int i = 0; i < FEATURES + 1; i++) v[i] = (float)(k + 1);
        int ok = mw_trainer_write_param(m.tr, "w", v, FEATURES) == MW_OK &&
                 mw_trainer_write_param(m.tr, "b", v, 1) == MW_OK;
        uint64_t user[64];
        for (int i = 0; i < 64; i++) user[i] = (uint64_t)(k + 1) * 0x0101010101010101ull;
        for (int s = 0; ok && s < SAVES; s++)
            ok = mw_trainer_save(m.tr, path, user, sizeof user) == MW_OK;
        if (!ok) fprintf(stderr, "writer %d: %s\n", k, mw_last_error());
        model_free(&m);
        _exit(ok ? 0 : 1);
    }
    model m;
    model_make(&m, "cpu:1", NULL);
    int loads = 0, running = WRITERS;
    while (running > 0) {
        for (int k = 0; k < WRITERS; k++) {
            int status;
            if (pids[k] > 0 && waitpid(pids[k], &status, WNOHANG) == pids[k]) {
                cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "writer %d failed", k);
                pids[k] = 0;
                running--;
            }
        }
        if (access(path, F_OK) != 0) continue;
        uint64_t user[64];
        size_t n = 0;
        cr_assert_eq(mw_trainer_load(m.tr, path, user, sizeof user, &n), MW_OK, "%s",
                     mw_last_error());
        float v[FEATURES + 1];
        params(&m, v);
        cr_assert(v[0] >= 1.0f && v[0] <= (float)WRITERS && v[0] == floorf(v[0]));
        for (int i = 0; i < FEATURES + 1; i++) cr_assert_eq(v[i], v[0], "a mixed state");
        cr_assert_eq(n, sizeof user);
        for (int i = 0; i < 64; i++)
            cr_assert_eq(user[i], (uint64_t)v[0] * 0x0101010101010101ull, "a mixed state");
        loads++;
    }
    cr_assert_gt(loads, 0);
    /* Every writer cleaned up after itself. */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls %s | grep -q tmp", dir);
    cr_assert_neq(system(cmd), 0, "temporary files were left behind");
    model_free(&m);
}

/* --- the fingerprint of a configuration ---------------------------------------------------------
 */

/* Every SHARED field of the configuration lists (parallel/config.h) has a line of its own in the
 * fingerprint, and a change to it changes the text; no LOCAL field appears. The lists themselves
 * are checked against the structs when libmeshwit is built. */
Test(fingerprint, every_shared_field_is_described_and_no_local_one) {
    mw_trainer_config c = {.optimizer = MW_ADAMW_INIT(1e-3f)};
    mw_infer_config ic = {0};
    char a[4096], b[4096], line[4100], want[96];
    mw__describe_trainer_config(&c, a, sizeof a);
#define LINE_(prefix, name, share)                                                                 \
    snprintf(want, sizeof want, "\n%s%s ", prefix, #name);                                         \
    snprintf(line, sizeof line, "\n%s", a);                                                        \
    cr_assert_eq(strstr(line, want) != NULL, share, "'%s' %s in:\n%s", want + 1,                   \
                 share ? "missing" : "present (a local field)", a);
#define OPT_(type, name, kind, share, range, note) LINE_("optimizer.", name, share)
#define CFG_(type, name, kind, share, range, note) LINE_("", name, share &&kind != P)
#define SHARED 1
#define LOCAL 0
#define P 0
#define I 1
#define Z 1
#define F 1
#define S 1
    MW__OPTIMIZER_FIELDS(OPT_)
    MW__RUNTIME_FIELDS(CFG_)
    MW__TRAINING_RUNTIME_FIELDS(CFG_)
    MW__TRAINER_FIELDS(CFG_)
    mw__describe_infer_config(&ic, a, sizeof a);
    MW__INFER_FIELDS(CFG_)
    MW__RUNTIME_FIELDS(CFG_)
    /* A changed value changes the text, for a field of each kind of value. */
    mw__describe_trainer_config(&c, a, sizeof a);
    c.optimizer.momentum = 0.5f;
    mw__describe_trainer_config(&c, b, sizeof b);
    cr_assert(strcmp(a, b) != 0 && strstr(b, "optimizer.momentum 0.5\n"), "%s", b);
    c.bucket_bytes = 4096;
    mw__describe_trainer_config(&c, b, sizeof b);
    cr_assert(strstr(b, "bucket_bytes 4096\n"), "%s", b);
    c.cpu_threads = 3; /* local: no change */
    mw__describe_trainer_config(&c, a, sizeof a);
    cr_assert_str_eq(a, b);
}
#undef SHARED
#undef LOCAL
#undef P
#undef I
#undef Z
#undef F
#undef S

/* --- the ranges of the configuration lists -------------------------------------------------- */

/* Every field with a range in the lists is refused one past either end, by a message naming it,
 * and accepted at both ends: the checks mw_trainer_new and mw_infer_new run are the lists'. */
#define RANGE_LO_(lo, hi, expected) (lo)
#define RANGE_HI_(lo, hi, expected) (hi)
#define TRY_(check, cfg, type, name, value, ok)                                                    \
    do {                                                                                           \
        cfg = zero;                                                                                \
        cfg.name = (type)(value);                                                                  \
        mw_status st = check(&cfg, "test");                                                        \
        if (ok)                                                                                    \
            cr_assert_eq(st, MW_OK, "%s = %lld refused: %s", #name, (long long)(value),            \
                         mw_last_error());                                                         \
        else                                                                                       \
            cr_assert(st == MW_ERR_INVALID && strstr(mw_last_error(), "test: " #name " is "),      \
                      "%s = %lld: status %d, '%s'", #name, (long long)(value), st,                 \
                      mw_last_error());                                                            \
        checked++;                                                                                 \
    } while (0)
#define ENDS_(check, cfg, type, name, range)                                                       \
    if (RANGE_LO_ range <= RANGE_HI_ range) {                                                      \
        long long lo = RANGE_LO_ range, hi = RANGE_HI_ range;                                      \
        TRY_(check, cfg, type, name, lo, 1);                                                       \
        TRY_(check, cfg, type, name, hi, 1);                                                       \
        if (lo > INT_MIN) TRY_(check, cfg, type, name, lo - 1, 0);                                 \
        if (hi < INT_MAX) TRY_(check, cfg, type, name, hi + 1, 0);                                 \
    }
#define TRAINER_ENDS_(type, name, kind, share, range, note)                                        \
    ENDS_(mw__check_trainer_config, tc, type, name, range)
#define INFER_ENDS_(type, name, kind, share, range, note)                                          \
    ENDS_(mw__check_infer_config, ic, type, name, range)

Test(config, every_range_of_the_lists_is_enforced_at_its_ends) {
    int checked = 0;
    {
        const mw_trainer_config zero = {0};
        mw_trainer_config tc;
        MW__RUNTIME_FIELDS(TRAINER_ENDS_)
        MW__TRAINING_RUNTIME_FIELDS(TRAINER_ENDS_)
        MW__TRAINER_FIELDS(TRAINER_ENDS_)
    }
    {
        const mw_infer_config zero = {0};
        mw_infer_config ic;
        MW__INFER_FIELDS(INFER_ENDS_)
        MW__RUNTIME_FIELDS(INFER_ENDS_)
    }
    /* precision, cpu_threads, pin_threads, blas_threads, collective_timeout_ms twice; gathers,
     * nonfinite, recompute, check_replicas_every, noutputs once: 15 fields. */
    cr_assert_geq(checked, 15 * 3, "only %d values checked", checked);
}
