/* GPT-2 (examples/common/gpt2_model.c) end to end: its loss and every gradient against an
 * independent reference (PyTorch, float64: tests/data/gpt2_ref.bin, made by
 * tools/gpt2_reference.py), its gradients against finite differences of the whole model, and
 * data-parallel training over cpu:2 and cpu:3 (an uneven batch) against one device. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2_model.h"
#include "meshwit.h"
#include "tests/common/fd_grad.h"
#include "tests/common/rng.h"

/* --- parameters in llm.c's order -------------------------------------------------------------- */

/* The parameter tensors of llm.c's model file, in order; per-layer ones are stacked over L. */
static const struct {
    const char *name;
    int layered;
} KINDS[] = {{"wte", 0},      {"wpe", 0},      {"ln1w", 1}, {"ln1b", 1}, {"qkvw", 1}, {"qkvb", 1},
             {"attprojw", 1}, {"attprojb", 1}, {"ln2w", 1}, {"ln2b", 1}, {"fcw", 1},  {"fcb", 1},
             {"fcprojw", 1},  {"fcprojb", 1},  {"lnfw", 0}, {"lnfb", 0}};
#define NKINDS ((int)(sizeof KINDS / sizeof *KINDS))
#define MAX_TENSORS (4 + 12 * 8)

/* Elements of one tensor of kind k (one layer's, for per-layer kinds). */
static int64_t kind_count(const gpt2_config *c, int k) {
    int64_t C = c->channels;
    static const int64_t per_c2[NKINDS] = {0, 0, 0, 0, 3, 0, 1, 0, 0, 0, 4, 0, 4, 0, 0, 0};
    static const int64_t per_c[NKINDS] = {0, 0, 1, 1, 0, 3, 0, 1, 1, 1, 0, 4, 0, 1, 1, 1};
    if (k == 0) return (int64_t)c->padded_vocab * C;
    if (k == 1) return (int64_t)c->max_seq * C;
    return per_c2[k] * C * C + per_c[k] * C;
}

/* One parameter of the built model: its meshwit name ("h1.qkvw"), where it starts in llm.c's
 * flat order, its size and its kind. */
typedef struct tensor_ref {
    char name[32];
    int64_t offset, count;
    int kind;
} tensor_ref;

static int list_tensors(const gpt2_config *c, tensor_ref *out) {
    int n = 0;
    int64_t offset = 0;
    cr_assert_leq(c->layers, 8);
    for (int k = 0; k < NKINDS; k++) {
        int64_t count = kind_count(c, k);
        for (int l = 0; l < (KINDS[k].layered ? c->layers : 1); l++) {
            tensor_ref *t = &out[n++];
            if (KINDS[k].layered)
                snprintf(t->name, sizeof t->name, "h%d.%s", l, KINDS[k].name);
            else
                snprintf(t->name, sizeof t->name, "%s", KINDS[k].name);
            t->offset = offset;
            t->count = count;
            t->kind = k;
            offset += count;
        }
    }
    cr_assert_eq(offset, gpt2_num_params(c), "llm.c's order covers %lld of %lld parameters",
                 (long long)offset, (long long)gpt2_num_params(c));
    return n;
}

/* --- a model on a mesh ------------------------------------------------------------------------ */

typedef struct model {
    gpt2_config cfg;
    int batch, seq;
    mw_graph *g;
    gpt2_graph gg;
    mw_mesh *mesh;
    mw_trainer *tr;
    tensor_ref t[MAX_TENSORS];
    int nt;
} model;

static void model_open(model *m, const gpt2_config *c, int batch, int seq, const char *devices,
                       const char *mesh_axis, const mw_optimizer *opt) {
    memset(m, 0, sizeof *m);
    m->cfg = *c;
    m->batch = batch;
    m->seq = seq;
    cr_assert_eq(mw_graph_new(&m->g), MW_OK, "%s", mw_last_error());
    mw_status st = gpt2_build(
        m->g, c, &(gpt2_layout){.batch = batch, .seq = seq, .data_axis = mesh_axis}, &m->gg);
    cr_assert_eq(st, MW_OK, "gpt2_build: %s", mw_graph_error(m->g));
    cr_assert_eq(mw_mesh_new(devices, "X", &m->mesh), MW_OK, "%s", mw_last_error());
    mw_trainer_config cfg = {.optimizer = opt ? *opt : (mw_optimizer){MW_SGD, .lr = 0.0f}};
    st = mw_trainer_new(m->g, m->gg.loss, m->mesh, &cfg, &m->tr);
    cr_assert_eq(st, MW_OK, "trainer on %s: %s", devices, mw_last_error());
    m->nt = list_tensors(c, m->t);
}

static void model_close(model *m) {
    mw_trainer_free(m->tr);
    mw_mesh_free(m->mesh);
    mw_graph_free(m->g);
}

/* Copies every parameter between the trainer and a flat array in llm.c's order. */
static void write_all(model *m, const float *params) {
    for (int i = 0; i < m->nt; i++)
        cr_assert_eq(
            mw_trainer_write_param(m->tr, m->t[i].name, params + m->t[i].offset, m->t[i].count),
            MW_OK, "%s: %s", m->t[i].name, mw_last_error());
}

static void read_all(model *m, float *dst, int grads) {
    for (int i = 0; i < m->nt; i++) {
        mw_status st =
            grads ? mw_trainer_read_grad(m->tr, m->t[i].name, dst + m->t[i].offset, m->t[i].count)
                  : mw_trainer_read_param(m->tr, m->t[i].name, dst + m->t[i].offset, m->t[i].count);
        cr_assert_eq(st, MW_OK, "%s: %s", m->t[i].name, mw_last_error());
    }
}

/* Feeds for llm.c's batch layout: sequence b is stream[b*T, b*T+T), its targets the same
 * positions shifted by one. `inputs` and `targets` hold batch*seq ids. */
static void feeds_of(const model *m, const int32_t *stream, int32_t *inputs, int32_t *targets,
                     mw_feed feeds[2]) {
    int64_t n = (int64_t)m->batch * m->seq;
    memcpy(inputs, stream, sizeof(int32_t) * (size_t)n);
    memcpy(targets, stream + 1, sizeof(int32_t) * (size_t)n);
    feeds[0] = (mw_feed){"tokens", inputs, n};
    feeds[1] = (mw_feed){"targets", targets, n};
}

static void *xmalloc(size_t size) {
    void *p = malloc(size);
    cr_assert_not_null(p, "out of memory (%zu bytes)", size);
    return p;
}

/* --- (a) against the PyTorch reference -------------------------------------------------------- */

#define REF_MAGIC 20240611
#define REF_VERSION 1

typedef struct reference {
    gpt2_config cfg;
    int batch, seq;
    int32_t *stream; /* batch * seq + 1 tokens */
    float *params, *grads;
    double loss;
} reference;

/* The reference file sits in tests/data, beside this file's folder. */
static void reference_path(char *buf, size_t size) {
    const char *file = __FILE__, *slash = strrchr(file, '/');
    if (slash)
        snprintf(buf, size, "%.*s/../data/gpt2_ref.bin", (int)(slash - file), file);
    else
        snprintf(buf, size, "../data/gpt2_ref.bin");
}

static void read_exact(FILE *f, void *dst, size_t size, const char *what, const char *path) {
    cr_assert_eq(fread(dst, 1, size, f), size, "%s: truncated in %s", path, what);
}

/* Reads the file laid out as tools/gpt2_reference.py documents (little-endian, as every machine
 * that runs these tests). */
static void reference_load(reference *r) {
    char path[4096];
    reference_path(path, sizeof path);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    int32_t h[16];
    read_exact(f, h, sizeof h, "the header", path);
    cr_assert_eq(h[0], REF_MAGIC, "%s: bad magic %d", path, h[0]);
    cr_assert_eq(h[1], REF_VERSION, "%s: version %d", path, h[1]);
    r->cfg = (gpt2_config){.max_seq = h[2],
                           .vocab = h[3],
                           .layers = h[4],
                           .heads = h[5],
                           .channels = h[6],
                           .padded_vocab = h[7]};
    r->batch = h[8];
    r->seq = h[9];
    char err[256];
    cr_assert_eq(gpt2_config_check(&r->cfg, err, sizeof err), 0, "%s: %s", path, err);
    cr_assert(r->batch > 0 && r->seq > 0 && r->seq <= r->cfg.max_seq && r->cfg.layers <= 8,
              "%s: batch %d, seq %d", path, r->batch, r->seq);
    int64_t ntok = (int64_t)r->batch * r->seq + 1, np = gpt2_num_params(&r->cfg);
    r->stream = xmalloc(sizeof(int32_t) * (size_t)ntok);
    r->params = xmalloc(sizeof(float) * (size_t)np);
    r->grads = xmalloc(sizeof(float) * (size_t)np);
    read_exact(f, r->stream, sizeof(int32_t) * (size_t)ntok, "the tokens", path);
    read_exact(f, r->params, sizeof(float) * (size_t)np, "the parameters", path);
    read_exact(f, &r->loss, sizeof r->loss, "the loss", path);
    read_exact(f, r->grads, sizeof(float) * (size_t)np, "the gradients", path);
    cr_assert_eq(fgetc(f), EOF, "%s: bytes after the gradients", path);
    fclose(f);
    for (int64_t i = 0; i < ntok; i++)
        cr_assert(r->stream[i] >= 0 && r->stream[i] < r->cfg.vocab, "%s: token %d", path,
                  r->stream[i]);
}

static void reference_free(reference *r) {
    free(r->stream);
    free(r->params);
    free(r->grads);
}

TestSuite(gpt2, .description = "GPT-2: PyTorch reference, finite differences, sharded = single",
          .timeout = 120);

/* Loss and gradients, f32 here against f64 there, on the same f32 weights.
 *
 * Loss: a mean of B*T = 16 cross-entropies, each a log-sum-exp over 60 logits that are dot
 * products over C = 24 of values from two blocks of f32 ops: its f32 rounding relative to the
 * loss is ~1e-6 at most (measured: 4e-8). Bound: 1e-5 relative.
 *
 * Gradients: each element passes backward through both blocks: dozens of f32 sums of up to
 * max(4C, B*T) = 96 terms whose magnitudes cancel, so an element's absolute error is relative to
 * the magnitudes of its tensor, not to its own value (an element that is nearly zero by
 * cancellation, such as the key bias, whose exact gradient is zero, is only known to ~1e-7 of
 * its tensor's largest). Hence, per tensor, |g - ref| <= ATOL_REL * max|ref| + RTOL * |ref| with
 * RTOL = 1e-3 and ATOL_REL = 1e-5: twenty times the f32 error (measured worst: 5e-7 of max|ref|,
 * in h0.ln2w), and far below any real error: a missing term, a gradient sent to a wrong element
 * or head, a padded class in the softmax or a missing head contribution to wte changes
 * gradients by a sizeable fraction of their tensor's magnitude. Each tensor as a whole must also
 * agree to 1e-5 in relative L2 norm (measured: at most 4e-7). */
#define REF_LOSS_RTOL 1e-5
#define REF_RTOL 1e-3
#define REF_ATOL_REL 1e-5
#define REF_L2_RTOL 1e-5

Test(gpt2, loss_and_gradients_match_pytorch) {
    reference r;
    reference_load(&r);
    const gpt2_config *c = &r.cfg;
    model m;
    model_open(&m, c, r.batch, r.seq, "cpu:1", NULL, NULL);
    write_all(&m, r.params);

    int64_t n = (int64_t)r.batch * r.seq, np = gpt2_num_params(c);
    int32_t *inputs = xmalloc(sizeof(int32_t) * (size_t)n),
            *targets = xmalloc(sizeof(int32_t) * (size_t)n);
    mw_feed feeds[2];
    feeds_of(&m, r.stream, inputs, targets, feeds);
    float loss = NAN;
    cr_assert_eq(mw_trainer_compute_grads(m.tr, feeds, 2, &loss), MW_OK, "%s", mw_last_error());
    cr_assert_leq(fabs(loss - r.loss), REF_LOSS_RTOL * fabs(r.loss), "loss %.9g, PyTorch %.12g",
                  loss, r.loss);

    float *grads = xmalloc(sizeof(float) * (size_t)np);
    read_all(&m, grads, 1);
    for (int i = 0; i < m.nt; i++) {
        const tensor_ref *t = &m.t[i];
        const float *g = grads + t->offset, *ref = r.grads + t->offset;
        double max_ref = 0.0, diff2 = 0.0, ref2 = 0.0;
        for (int64_t j = 0; j < t->count; j++) max_ref = fmax(max_ref, fabs(ref[j]));
        cr_assert_gt(max_ref, 0.0, "%s: the reference gradient is zero", t->name);
        for (int64_t j = 0; j < t->count; j++) {
            double err = fabs((double)g[j] - ref[j]);
            cr_assert_leq(err, REF_ATOL_REL * max_ref + REF_RTOL * fabs(ref[j]),
                          "d loss / d %s[%lld]: %.7g, PyTorch %.7g (largest %.3g)", t->name,
                          (long long)j, g[j], ref[j], max_ref);
            diff2 += err * err;
            ref2 += (double)ref[j] * ref[j];
        }
        cr_assert_leq(sqrt(diff2), REF_L2_RTOL * sqrt(ref2), "%s: relative L2 error %.3g", t->name,
                      sqrt(diff2 / ref2));
    }
    /* The padded rows of wte (never looked up, their logits ignored) and the rows of wpe past
     * the sequence (never read) get no gradient at all. */
    for (int64_t j = (int64_t)c->vocab * c->channels; j < (int64_t)c->padded_vocab * c->channels;
         j++)
        cr_assert_eq(grads[j], 0.0f, "padded wte element %lld: %g", (long long)j, grads[j]);
    const float *gpe = grads + m.t[1].offset;
    for (int64_t j = (int64_t)r.seq * c->channels; j < m.t[1].count; j++)
        cr_assert_eq(gpe[j], 0.0f, "wpe element %lld past the sequence: %g", (long long)j, gpe[j]);

    free(grads);
    free(inputs);
    free(targets);
    model_close(&m);
    reference_free(&r);
}

/* --- (b) whole-model finite differences ------------------------------------------------------- */

/* Random weights that make every part of the model matter (GPT-2's 0.02 initialisation leaves
 * attention uniform and most gradients tiny), uniform with about the spreads
 * tools/gpt2_reference.py uses: std 1/sqrt(in) for linear weights, gains near 1. */
static void random_weights(const model *m, float *params, uint64_t seed) {
    uint64_t rng = seed;
    for (int i = 0; i < m->nt; i++) {
        const tensor_ref *t = &m->t[i];
        const char *kind = KINDS[t->kind].name;
        int64_t in = strcmp(kind, "fcprojw") == 0 ? 4 * m->cfg.channels : m->cfg.channels;
        double scale, centre = 0.0; /* uniform in centre +- scale */
        if (t->kind <= 1)
            scale = 0.8;
        else if (strstr(kind, "proj") ? kind[strlen(kind) - 1] == 'w'
                                      : strcmp(kind, "qkvw") == 0 || strcmp(kind, "fcw") == 0)
            scale = sqrt(3.0 / (double)in); /* std 1/sqrt(in) */
        else if (kind[0] == 'l' && kind[strlen(kind) - 1] == 'w')
            scale = 0.3, centre = 1.0;
        else
            scale = 0.2;
        for (int64_t j = 0; j < t->count; j++)
            params[t->offset + j] = (float)(centre + scale * rng_uniform(&rng));
    }
}

/* The central difference of the whole model's loss (~3 here). Rounding: one f32 evaluation of
 * the loss is off by ~1e-7 relative, 3e-7, so the quotient carries ~3e-7 / h = 3e-5 (measured:
 * errors of the small gradients are at most 2e-5). Truncation, h^2/6 |L'''|: measured at most
 * 1.5e-4 relative (the largest error, on a gradient of 1.01, drops from 1.5e-4 to 4e-5 with h
 * halved, as h^2 predicts). The bound FD_ATOL + FD_RTOL |numeric| = 1e-4 + 2e-3 |numeric| is
 * five times either; a wrong gradient term is off by far more (the sampled gradients are
 * 1e-3 to 1). The difference itself is tests/common/fd_grad.h's, with its h = FD_STEP = 1e-2. */
#define MODEL_FD_ATOL 1e-4
#define MODEL_FD_RTOL 2e-3
#define FD_SAMPLES 4 /* random elements per tensor, besides its largest gradient */

Test(gpt2, whole_model_finite_differences) {
    const gpt2_config c = {
        .layers = 1, .heads = 2, .channels = 8, .max_seq = 6, .vocab = 16, .padded_vocab = 20};
    const int batch = 2, seq = 4;
    model m;
    model_open(&m, &c, batch, seq, "cpu:1", NULL, NULL);
    int64_t np = gpt2_num_params(&c);
    float *params = xmalloc(sizeof(float) * (size_t)np),
          *grads = xmalloc(sizeof(float) * (size_t)np);
    random_weights(&m, params, 99);
    write_all(&m, params);

    uint64_t rng = 4242;
    int32_t stream[2 * 4 + 1], inputs[8], targets[8];
    for (int i = 0; i < batch * seq + 1; i++)
        stream[i] = (int32_t)((rng_uniform(&rng) + 1.0) * 0.5 * c.vocab);
    mw_feed feeds[2];
    feeds_of(&m, stream, inputs, targets, feeds);
    float loss = NAN;
    cr_assert_eq(mw_trainer_compute_grads(m.tr, feeds, 2, &loss), MW_OK, "%s", mw_last_error());
    read_all(&m, grads, 1);

    for (int i = 0; i < m.nt; i++) {
        const tensor_ref *t = &m.t[i];
        float *p = params + t->offset;
        const float *g = grads + t->offset;
        int64_t pick[FD_SAMPLES + 1], largest = 0;
        for (int64_t j = 1; j < t->count; j++)
            if (fabsf(g[j]) > fabsf(g[largest])) largest = j;
        pick[0] = largest;
        for (int s = 1; s <= FD_SAMPLES; s++)
            pick[s] = (int64_t)((rng_uniform(&rng) + 1.0) * 0.5 * (double)t->count) % t->count;
        for (int s = 0; s <= FD_SAMPLES; s++) {
            int64_t j = pick[s];
            double numeric = fd_difference(m.tr, feeds, 2, 0, t->name, p, t->count, j, FD_STEP);
            fd_expect_close(t->name, j, g[j], numeric, MODEL_FD_ATOL, MODEL_FD_RTOL);
        }
    }
    free(params);
    free(grads);
    model_close(&m);
}

/* --- (c) sharded over cpu:2 and cpu:3 equals one device --------------------------------------- */

/* Ten AdamW steps (lr 1e-3, betas 0.9 / 0.95, eps 1e-8, weight decay 0.1, clipping at 1) on
 * fixed random batches of 8 sequences, on one device and sharded over 2 and 3 devices.
 *
 * Loss at every step: the runs differ only in the order of the batch sums (each device sums its
 * rows, then the partial sums are added in device order), a relative change of ~1e-7 per sum;
 * the parameters they were computed from differ by the amounts below. Bound: 1e-4 relative
 * (measured: at most 1.7e-7).
 *
 * Parameters after 10 steps. AdamW moves an element by lr * m / (sqrt(v) + eps) per step, which
 * depends on the gradient's relative value: a gradient known to relative precision 1e-6 moves
 * the same to ~lr * 1e-6 per step, so most elements agree to the f32 rounding of the parameters
 * themselves (~1e-7, measured). The exception is an element whose gradient is near zero, where
 * the update is lr * g / (|g| + eps) and a rounding difference dg in g changes it by up to
 * lr * dg / eps: the key bias, whose exact gradient is zero (a softmax does not see a constant
 * added to a row) and whose computed gradient is rounding noise of ~1e-11, and an element whose
 * first gradient happened to be ~3e-8 (h1.fcprojw, dg ~ 1e-9); both give lr * dg / eps of at most
 * ~1e-6 per step, 1e-5 over 10 steps (measured worst: 6.4e-6). Bound: SHARD_PARAM_ATOL = 1e-4
 * for every element, one tenth of a single step of lr, 15 times the measured worst. Also, per
 * tensor, the L2 norm of the difference must be below 2e-3 of how far the tensor moved in the
 * 10 steps (measured: 2e-4 for the key biases, below 1.5e-5 for every other tensor): sharded
 * training follows the same path. */
#define SHARD_STEPS 10
#define SHARD_PARAM_ATOL 1e-4
#define SHARD_MOVED_RTOL 2e-3
#define SHARD_BATCH 8 /* over 3 devices: 3, 3, 2 rows */
#define SHARD_SEQ 32
#define SHARD_LR 1e-3f
#define SHARD_LOSS_RTOL 1e-4

typedef struct trajectory {
    float loss[SHARD_STEPS];
    float *initial, *final; /* parameters before and after SHARD_STEPS steps, llm.c's order */
    int64_t rows[3];        /* rows of Batch on each device */
} trajectory;

static trajectory train(const gpt2_config *c, const char *devices, const char *mesh_axis) {
    const mw_optimizer opt = {.kind = MW_ADAMW,
                              .lr = SHARD_LR,
                              .beta1 = 0.9f,
                              .beta2 = 0.95f,
                              .eps = 1e-8f,
                              .weight_decay = 0.1f,
                              .grad_clip = 1.0f};
    model m;
    model_open(&m, c, SHARD_BATCH, SHARD_SEQ, devices, mesh_axis, &opt);
    size_t bytes = sizeof(float) * (size_t)gpt2_num_params(c);
    trajectory tr = {.initial = xmalloc(bytes), .final = xmalloc(bytes)};
    for (int d = 0; d < 3; d++)
        tr.rows[d] = d < mw_trainer_devices(m.tr) ? mw_trainer_local_size(m.tr, d, "Batch") : 0;
    read_all(&m, tr.initial, 0);
    uint64_t rng = 31337; /* the same batches for every run */
    int32_t stream[SHARD_BATCH * SHARD_SEQ + 1], inputs[SHARD_BATCH * SHARD_SEQ],
        targets[SHARD_BATCH * SHARD_SEQ];
    for (int s = 0; s < SHARD_STEPS; s++) {
        for (int i = 0; i < SHARD_BATCH * SHARD_SEQ + 1; i++)
            stream[i] = (int32_t)((rng_uniform(&rng) + 1.0) * 0.5 * c->vocab);
        mw_feed feeds[2];
        feeds_of(&m, stream, inputs, targets, feeds);
        mw_status st = mw_trainer_step(m.tr, feeds, 2, &tr.loss[s]);
        cr_assert_eq(st, MW_OK, "%s, step %d: %s", devices, s, mw_last_error());
    }
    read_all(&m, tr.final, 0);
    model_close(&m);
    return tr;
}

static void trajectory_free(trajectory *t) {
    free(t->initial);
    free(t->final);
}

Test(gpt2, sharded_equals_single_device) {
    const gpt2_config c = {
        .layers = 2, .heads = 4, .channels = 64, .max_seq = 64, .vocab = 250, .padded_vocab = 256};
    int64_t np = gpt2_num_params(&c);
    trajectory single = train(&c, "cpu:1", NULL);
    cr_assert_eq(single.rows[0], SHARD_BATCH);
    const char *meshes[2] = {"cpu:2", "cpu:3"};
    const int64_t rows[2][3] = {{4, 4, 0}, {3, 3, 2}};
    tensor_ref t[MAX_TENSORS];
    int nt = list_tensors(&c, t);
    for (int k = 0; k < 2; k++) {
        trajectory sh = train(&c, meshes[k], "X");
        for (int d = 0; d < 3; d++)
            cr_assert_eq(sh.rows[d], rows[k][d], "%s: device %d holds %lld rows", meshes[k], d,
                         (long long)sh.rows[d]);
        cr_assert_arr_eq(sh.initial, single.initial, sizeof(float) * (size_t)np,
                         "%s: the replicas start from other parameters", meshes[k]);
        for (int s = 0; s < SHARD_STEPS; s++)
            cr_assert_leq(fabs(sh.loss[s] - single.loss[s]), SHARD_LOSS_RTOL * fabs(single.loss[s]),
                          "%s, step %d: loss %.9g, one device %.9g", meshes[k], s, sh.loss[s],
                          single.loss[s]);
        for (int i = 0; i < nt; i++) {
            const float *a = sh.final + t[i].offset, *b = single.final + t[i].offset,
                        *p0 = single.initial + t[i].offset;
            double diff2 = 0.0, moved2 = 0.0;
            for (int64_t j = 0; j < t[i].count; j++) {
                double d = fabs((double)a[j] - b[j]), m = (double)b[j] - p0[j];
                cr_assert_leq(d, SHARD_PARAM_ATOL,
                              "%s: %s[%lld] after %d steps: %.9g, one device %.9g", meshes[k],
                              t[i].name, (long long)j, SHARD_STEPS, a[j], b[j]);
                diff2 += d * d;
                moved2 += m * m;
            }
            cr_assert_gt(moved2, 0.0, "%s did not move in %d steps", t[i].name, SHARD_STEPS);
            cr_assert_leq(sqrt(diff2), SHARD_MOVED_RTOL * sqrt(moved2),
                          "%s: %s differs by %.3g of the %.3g it moved", meshes[k], t[i].name,
                          sqrt(diff2 / moved2), sqrt(moved2));
        }
        trajectory_free(&sh);
    }
    trajectory_free(&single);
}
