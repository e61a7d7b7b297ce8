/* meshwit-bench: GPT-2 steps timed in a forked child (see gpt2_run.h). A fresh child per
 * configuration also gives each its own peak RSS: getrusage's ru_maxrss is process-wide and only
 * grows. */
#include "gpt2_run.h"

#include <cblas.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../examples/common/gpt2_data.h"
#include "bench.h"

#define DATA_BYTES (1 << 18)
#define MAX_REPEATS 32

static void child_error(mwb_gpt2_result *r, const char *what, mw_status st) {
    snprintf(r->error, sizeof r->error, "%s: %s [%s]: %s", what, mw_strerror(st),
             mw_status_name(st), mw_last_error());
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

static void measure(const mwb_gpt2_setup *s, mwb_gpt2_result *r) {
    gpt2_tokens data = {0};
    gpt2_batch batch = {0};
    mw_mesh *mesh = NULL;
    mw_graph *g = NULL;
    mw_trainer *tr = NULL;
    gpt2_graph m;
    mw_status st = gpt2_corpus_generate(GPT2_CORPUS_SEED, DATA_BYTES, &data);
    if (st == MW_OK) st = gpt2_batch_new(s->batch, s->seq, &batch);
    if (st != MW_OK) {
        child_error(r, "cannot make the data", st);
        goto done;
    }
    if ((st = mw_mesh_new(s->devices, "X", &mesh)) != MW_OK) {
        child_error(r, "cannot make the mesh", st);
        goto done;
    }
    mw_trainer_config tc = mwb_gpt2_config(s->blas_threads);
    tc.profile = s->profile;
    st = mw_graph_new(&g);
    if (st == MW_OK) st = gpt2_build(g, &s->model, s->batch, s->seq, "X", &m);
    if (st == MW_OK) st = mw_trainer_new(g, m.loss, mesh, &tc, &tr);
    if (st != MW_OK) {
        child_error(r, "cannot build the model", st);
        goto done;
    }
    int repeats = s->repeats < MAX_REPEATS ? s->repeats : MAX_REPEATS;
    double ms[MAX_REPEATS], cpu = 0.0;
    gpt2_rng rng;
    gpt2_rng_seed(&rng, 1);
    mw_feed feeds[2];
    gpt2_batch_feeds(&batch, feeds);
    for (int rep = -1; rep < repeats; rep++) { /* repeat -1 is the warm-up */
        int n = rep < 0 ? s->warmup : s->steps;
        if (rep == 0) {
            mw_trainer_profile_reset(tr);
            cpu = cpu_seconds();
        }
        double t = 0.0;
        for (int k = 0; k < n; k++) {
            gpt2_batch_random(&batch, &data, &rng); /* untimed: the host's part, not the step's */
            float loss;
            double t0 = mwb_now();
            if ((st = mw_trainer_step(tr, feeds, 2, &loss)) != MW_OK) {
                child_error(r, "a step failed", st);
                goto done;
            }
            t += mwb_now() - t0;
            if (rep < 0 && k == 0) r->first_loss = loss;
            r->last_loss = loss;
        }
        if (rep >= 0) ms[rep] = 1e3 * t / n;
    }
    r->cpu_ms = 1e3 * (cpu_seconds() - cpu) / (repeats * s->steps);
    r->ms = mwb_median(ms, repeats);
    if (s->profile) {
        int n = 0;
        if ((st = mw_trainer_profile(tr, r->profile, MWB_MAX_PROFILE, &n)) != MW_OK) {
            child_error(r, "no profile", st);
            goto done;
        }
        r->nprofile = n < MWB_MAX_PROFILE ? n : MWB_MAX_PROFILE;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    r->peak_mb = (double)ru.ru_maxrss / 1024.0; /* Linux reports kilobytes */
    r->ok = 1;
done:
    mw_trainer_free(tr);
    mw_graph_free(g);
    mw_mesh_free(mesh);
    gpt2_batch_free(&batch);
    gpt2_tokens_free(&data);
}

/* Runs fn(arg, out) in a forked child and copies its `bytes` of result back through a pipe. */
static void in_child(void (*fn)(const void *, void *), const void *arg, void *out, size_t bytes,
                     char *error, size_t error_size) {
    memset(out, 0, bytes);
    int fd[2];
    if (pipe(fd) != 0) {
        snprintf(error, error_size, "pipe: %s", strerror(errno));
        return;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(error, error_size, "fork: %s", strerror(errno));
        close(fd[0]);
        close(fd[1]);
        return;
    }
    if (pid == 0) {
        close(fd[0]);
        fn(arg, out);
        ssize_t w = write(fd[1], out, bytes);
        _exit(w == (ssize_t)bytes ? 0 : 1);
    }
    close(fd[1]);
    ssize_t got = 0, n;
    while (got < (ssize_t)bytes && ((n = read(fd[0], (char *)out + got, bytes - (size_t)got)) > 0 ||
                                    (n < 0 && errno == EINTR)))
        if (n > 0) got += n;
    close(fd[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (got != (ssize_t)bytes) {
        memset(out, 0, bytes);
        if (WIFSIGNALED(status))
            snprintf(error, error_size, "the measuring process died of signal %d",
                     WTERMSIG(status));
        else
            snprintf(error, error_size, "the measuring process exited with %d",
                     WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    }
}

static void measure_fn(const void *arg, void *out) { measure(arg, out); }

void mwb_gpt2_measure(const mwb_gpt2_setup *s, mwb_gpt2_result *r) {
    char error[sizeof r->error] = "";
    in_child(measure_fn, s, r, sizeof *r, error, sizeof error);
    if (!r->ok && error[0]) snprintf(r->error, sizeof r->error, "%s", error);
}

mw_trainer_config mwb_gpt2_config(int blas_threads) {
    return (mw_trainer_config){.optimizer = {.kind = MW_ADAMW,
                                             .lr = 1e-3f,
                                             .beta1 = 0.9f,
                                             .beta2 = 0.95f,
                                             .eps = 1e-8f,
                                             .weight_decay = 0.1f,
                                             .grad_clip = 1.0f},
                               .blas_threads = blas_threads};
}

double mwb_gpt2_flops_per_token(const gpt2_config *c, int seq) {
    return 6.0 * (double)gpt2_num_params(c) + 12.0 * c->layers * c->channels * (double)seq;
}

static void sgemm_fn(const void *arg, void *out) {
    int n = *(const int *)arg;
    double *gf = out;
    openblas_set_num_threads(1);
    float *a = malloc(sizeof(float) * (size_t)n * n), *b = malloc(sizeof(float) * (size_t)n * n);
    float *c = malloc(sizeof(float) * (size_t)n * n);
    if (!a || !b || !c) goto done;
    for (size_t i = 0; i < (size_t)n * n; i++) a[i] = b[i] = (float)(i % 7) * 0.1f;
    double t[5];
    for (int rep = -1; rep < 5; rep++) {
        double t0 = mwb_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c,
                    n);
        if (rep >= 0) t[rep] = mwb_now() - t0;
    }
    *gf = 2.0 * n * n * (double)n / mwb_median(t, 5) * 1e-9;
done:
    free(a);
    free(b);
    free(c);
}

double mwb_sgemm_gflops(int n) {
    double gf = 0.0;
    char error[200];
    in_child(sgemm_fn, &n, &gf, sizeof gf, error, sizeof error);
    return gf;
}

void mwb_print_profile(const mwb_gpt2_result *r, int steps) {
    double total = 0.0;
    for (int i = 0; i < r->nprofile; i++) total += r->profile[i].ms;
    printf("  %-28s %-9s %9s %9s %7s\n", "op", "phase", "calls", "ms/step", "share");
    for (int i = 0; i < r->nprofile; i++) {
        const mw_profile_row *p = &r->profile[i];
        if (p->ms / total < 0.002) break;
        printf("  %-28s %-9s %9.0f %9.2f %6.1f%%\n", p->op, p->phase, (double)p->calls / steps,
               p->ms / steps, 100.0 * p->ms / total);
    }
}
