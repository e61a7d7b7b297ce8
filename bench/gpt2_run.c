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
#include "core/plan.h"
#include "devices/cpu/cpu.h"
#include "devices/device.h"

#define DATA_BYTES (1 << 18)
#define MAX_REPEATS 32

struct mwb_gpt2 {
    gpt2_tokens data;
    gpt2_batch batch;
    mw_graph *g;
    mw_trainer *tr;
    gpt2_rng rng;
    mw_feed feeds[2];
};

static void describe(char *err, size_t errlen, const char *what, mw_status st) {
    snprintf(err, errlen, "%s: %s [%s]: %s", what, mw_strerror(st), mw_status_name(st),
             mw_last_error());
}

void mwb_gpt2_free(mwb_gpt2 *m) {
    if (!m) return;
    mw_trainer_free(m->tr);
    mw_graph_free(m->g);
    gpt2_batch_free(&m->batch);
    gpt2_tokens_free(&m->data);
    free(m);
}

int mwb_gpt2_make(mw_mesh *mesh, const gpt2_config *model, int batch, int seq,
                  const mw_trainer_config *tc, mwb_gpt2 **out, char *err, size_t errlen) {
    return mwb_gpt2_make_mesh(mesh, model, batch, seq, "X", NULL, tc, out, err, errlen);
}

int mwb_gpt2_make_mesh(mw_mesh *mesh, const gpt2_config *model, int batch, int seq,
                       const char *data_axis, const char *model_axis, const mw_trainer_config *tc,
                       mwb_gpt2 **out, char *err, size_t errlen) {
    return mwb_gpt2_make_fsdp(mesh, model, batch, seq, data_axis, model_axis, NULL, tc, out, err,
                              errlen);
}

static int make_model(mw_mesh *mesh, const gpt2_config *model, const llama_config *llama, int batch,
                      int seq, const char *data_axis, const char *model_axis, const char *fsdp_axis,
                      const mw_trainer_config *tc, mwb_gpt2 **out, char *err, size_t errlen);

int mwb_gpt2_make_fsdp(mw_mesh *mesh, const gpt2_config *model, int batch, int seq,
                       const char *data_axis, const char *model_axis, const char *fsdp_axis,
                       const mw_trainer_config *tc, mwb_gpt2 **out, char *err, size_t errlen) {
    return make_model(mesh, model, NULL, batch, seq, data_axis, model_axis, fsdp_axis, tc, out, err,
                      errlen);
}

int mwb_llama_make(mw_mesh *mesh, const llama_config *model, int batch, int seq,
                   const char *data_axis, const char *model_axis, const char *fsdp_axis,
                   const mw_trainer_config *tc, mwb_gpt2 **out, char *err, size_t errlen) {
    return make_model(mesh, NULL, model, batch, seq, data_axis, model_axis, fsdp_axis, tc, out, err,
                      errlen);
}

static int make_model(mw_mesh *mesh, const gpt2_config *model, const llama_config *llama, int batch,
                      int seq, const char *data_axis, const char *model_axis, const char *fsdp_axis,
                      const mw_trainer_config *tc, mwb_gpt2 **out, char *err, size_t errlen) {
    mwb_gpt2 *m = calloc(1, sizeof *m);
    *out = NULL;
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return 1;
    }
    mw_status st = gpt2_corpus_generate(GPT2_CORPUS_SEED, DATA_BYTES, &m->data);
    if (st == MW_OK) st = gpt2_batch_new(batch, seq, &m->batch);
    if (st != MW_OK) {
        describe(err, errlen, "cannot make the data", st);
        mwb_gpt2_free(m);
        return 1;
    }
    gpt2_graph gm;
    st = mw_graph_new(&m->g);
    /* A pipeline's graph is one micro-batch's; each step feeds all of them, the batch. */
    int micro = tc && tc->pipeline_axis && tc->micro_batches > 1 ? tc->micro_batches : 1;
    gpt2_layout lo = {.batch = batch / micro,
                      .seq = seq,
                      .data_axis = data_axis,
                      .model_axis = model_axis,
                      .fsdp_axis = fsdp_axis};
    if (st == MW_OK)
        st = llama ? llama_build(m->g, llama, &lo, &gm) : gpt2_build(m->g, model, &lo, &gm);
    if (st == MW_OK) st = mw_trainer_new(m->g, gm.loss, mesh, tc, &m->tr);
    if (st != MW_OK) {
        describe(err, errlen, "cannot build the model", st);
        mwb_gpt2_free(m);
        return 1;
    }
    gpt2_rng_seed(&m->rng, 1);
    gpt2_batch_feeds(&m->batch, m->feeds);
    *out = m;
    return 0;
}

int mwb_gpt2_new(mw_mesh *mesh, int blas_threads, mwb_gpt2 **out, char *err, size_t errlen) {
    gpt2_config c;
    gpt2_preset("tiny", &c);
    mw_trainer_config tc = mwb_gpt2_config(blas_threads);
    return mwb_gpt2_make(mesh, &c, MWB_GPT2_BATCH, MWB_GPT2_SEQ, &tc, out, err, errlen);
}

int mwb_gpt2_steps(mwb_gpt2 *m, int n, mwb_gpt2_times *out, char *err, size_t errlen) {
    double t = 0.0, reduce = 0.0, update = 0.0;
    int threads = 0;
    for (int s = 0; s < n; s++) {
        gpt2_batch_random(&m->batch, &m->data, &m->rng); /* untimed: the host's part */
        double t0 = mwb_now();
        mw_status st = mw_trainer_step(m->tr, m->feeds, 2, NULL);
        t += mwb_now() - t0;
        mw_step_stats ss = {0};
        if (st == MW_OK) st = mw_trainer_stats(m->tr, &ss);
        if (st != MW_OK) {
            describe(err, errlen, "a step failed", st);
            return 1;
        }
        reduce += ss.reduce_ms;
        update += ss.update_ms;
        threads = ss.threads;
    }
    *out = (mwb_gpt2_times){1e3 * t / n, reduce / n, update / n, threads};
    return 0;
}

/* 0 when st is MW_OK, else 1 with the error described in err. */
static int mwb_check(mw_status st, const char *what, char *err, size_t errlen) {
    if (st == MW_OK) return 0;
    describe(err, errlen, what, st);
    return 1;
}

static void measure(const mwb_gpt2_setup *s, mwb_gpt2_result *r) {
    mw_mesh *mesh = NULL;
    mwb_gpt2 *m = NULL;
    mw_status st = mw_mesh_new(s->devices, s->mesh_axes ? s->mesh_axes : "X", &mesh);
    if (st != MW_OK) {
        describe(r->error, sizeof r->error, "cannot make the mesh", st);
        return;
    }
    mw_trainer_config tc = mwb_gpt2_config(s->blas_threads);
    tc.profile = s->profile;
    tc.shard_optimizer = s->shard_optimizer;
    tc.precision = s->precision;
    tc.recompute = s->recompute;
    tc.gathers = s->serial_gathers ? MW_GATHERS_AT_USE : MW_GATHERS_AHEAD;
    const char *data = s->data_axis ? s->data_axis : s->model_axis ? NULL : "X";
    if (make_model(mesh, s->llama ? NULL : &s->model, s->llama, s->batch, s->seq, data,
                   s->model_axis, s->shard_params ? data : NULL, &tc, &m, r->error,
                   sizeof r->error) ||
        mwb_check(mw_trainer_memory(m->tr, 0, &r->memory), "no memory figures", r->error,
                  sizeof r->error) ||
        mwb_check(mw_trainer_kernels(m->tr, r->kernels, sizeof r->kernels), "no kernel list",
                  r->error, sizeof r->error))
        goto done;
    int repeats = s->repeats < MAX_REPEATS ? s->repeats : MAX_REPEATS;
    double ms[MAX_REPEATS];
    mwb_gpt2_times t;
    if (mwb_gpt2_steps(m, s->warmup, &t, r->error, sizeof r->error)) goto done;
    mw_trainer_profile_reset(m->tr);
    for (int rep = 0; rep < repeats; rep++) {
        if (mwb_gpt2_steps(m, s->steps, &t, r->error, sizeof r->error)) goto done;
        ms[rep] = t.ms;
    }
    r->ms = mwb_median(ms, repeats);
    r->threads = t.threads;
    if (s->profile) {
        int n = 0;
        if ((st = mw_trainer_profile(m->tr, r->profile, MWB_MAX_PROFILE, &n)) != MW_OK) {
            describe(r->error, sizeof r->error, "no profile", st);
            goto done;
        }
        r->nprofile = n < MWB_MAX_PROFILE ? n : MWB_MAX_PROFILE;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    r->peak_mb = (double)ru.ru_maxrss / 1024.0; /* Linux reports kilobytes */
    r->ok = 1;
done:
    mwb_gpt2_free(m);
    mw_mesh_free(mesh);
}

void mwb_print_kernels(const char *who, const mwb_gpt2_result *r) {
    printf("kernels of %s:\n", who);
    for (const char *p = r->kernels; *p;) {
        const char *e = strchr(p, '\n');
        int len = e ? (int)(e - p) : (int)strlen(p);
        while (len > 0 && p[0] == ' ') p++, len--;
        if (len > 0) printf("  %.*s\n", len, p);
        p += len + (e ? 1 : 0);
        if (!e) break;
    }
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

double mwb_llama_flops_per_token(const llama_config *c, int seq) {
    return 6.0 * (double)llama_num_params(c) +
           12.0 * c->layers * (double)c->heads * c->head_dim * (double)seq;
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

typedef struct gemm_rate {
    int n;
    mw_dtype dtype;
    double gflops;
    char impl[96];
} gemm_rate;

/* The CPU backend's own GEMM, prepared as a plan's are, on one thread (in the child). */
static void gemm_fn(const void *arg, void *out) {
    const gemm_rate *in = arg;
    gemm_rate *r = out;
    *r = *in;
    int64_t n = in->n, es = in->dtype == MW_BF16 ? 2 : 4;
    openblas_set_num_threads(1);
    char *a = malloc((size_t)(n * n * es)), *b = malloc((size_t)(n * n * es));
    float *c = malloc(sizeof(float) * (size_t)(n * n));
    mw__device dev = {.vt = &mw__cpu_device, .name = "cpu:0"};
    if (!a || !b || !c || dev.vt->init(&dev) != MW_OK) goto done;
    /* Normal values as the sgemm's (bytes of a pattern would be subnormal floats, which run
     * many times slower than any model's numbers) */
    for (int64_t i = 0; i < n * n; i++) {
        float v = (float)(i % 7) * 0.1f;
        if (in->dtype == MW_BF16) {
            uint32_t u;
            memcpy(&u, &v, sizeof u);
            uint16_t h = (uint16_t)(u >> 16);
            memcpy(a + i * es, &h, sizeof h);
            memcpy(b + i * es, &h, sizeof h);
        } else {
            memcpy(a + i * es, &v, sizeof v);
            memcpy(b + i * es, &v, sizeof v);
        }
    }
    mw__k_gemm k = {.batch = 1, .m = n, .n = n, .k = n, .lda = n, .ldb = n, .ldc = n};
    k.stride_a = k.stride_b = k.stride_c = n * n;
    k.ab_dtype = in->dtype, k.c_dtype = MW_F32, k.a = a, k.b = b, k.c = c;
    if (dev.vt->gemm_prepare(&dev, &k) != MW_OK) goto stop;
    snprintf(r->impl, sizeof r->impl, "%s", dev.vt->describe(&dev, MW__I_GEMM, &k));
    double t[5];
    for (int rep = -1; rep < 5; rep++) {
        double t0 = mwb_now();
        if (dev.vt->gemm(&dev, &k) != MW_OK) goto stop;
        if (rep >= 0) t[rep] = mwb_now() - t0;
    }
    r->gflops = 2.0 * (double)n * n * n / mwb_median(t, 5) * 1e-9;
stop:
    dev.vt->shutdown(&dev);
done:
    free(a);
    free(b);
    free(c);
}

double mwb_gemm_gflops(int n, mw_dtype dtype, char *impl, size_t impl_size) {
    gemm_rate in = {.n = n, .dtype = dtype}, r;
    char error[200];
    in_child(gemm_fn, &in, &r, sizeof r, error, sizeof error);
    snprintf(impl, impl_size, "%s", r.impl[0] ? r.impl : "?");
    return r.gflops;
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
