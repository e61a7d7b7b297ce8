/* The trainer on GPUs against the trainer on the CPU (suite gpu_trainer): ten GPT-2 steps with
 * AdamW on cuda:0 and on cuda:0x2 (two devices on one GPU, gradient buckets overlapped with
 * backward by the cuda-local reducer) against cpu:1; bitwise repeats; a bad token or target that
 * updates nothing; a failed or abandoned collective that the next step survives; ZeRO-1 bitwise
 * the replicated update.
 *
 * Tolerances, derived. The GPU computes the same formulas as the CPU in other summation orders
 * (cuBLAS, tree reductions, fused multiply-adds); over ten AdamW steps such differences grow in a
 * way no closed-form bound follows usefully. So the bound is measured on the CPU: cpu:2 sums each
 * gradient as two half-batch sums, a different but equally valid order, and its drift from cpu:1
 * (per step for the loss, per tensor for the parameters) is the scale of an order change. A GPU
 * run may differ from cpu:1 by at most 16 times that drift plus 16 ulp of the value. */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "gpt2_model.h"
#include "meshwit.h"
#include "meshwit/testing.h"
#include "tests/common/rng.h"

#ifdef MESHWIT_HAVE_CUDA
#include "devices/cuda/cuda.h"
#include "gpu_test.h"

#define STEPS 10
#define BATCH 4
#define SEQ 64
#define MAX_TENSORS 64

static const gpt2_config cfg = {
    .layers = 2, .heads = 4, .channels = 128, .max_seq = 64, .vocab = 250, .padded_vocab = 256};

typedef struct tensor {
    char name[32];
    int64_t count, offset;
} tensor;

static int list_tensors(tensor *t) {
    int64_t C = cfg.channels, n = 0, off = 0;
    struct {
        const char *name;
        int64_t count;
    } per_layer[] = {{"ln1w", C},
                     {"ln1b", C},
                     {"qkvw", 3 * C * C},
                     {"qkvb", 3 * C},
                     {"attprojw", C * C},
                     {"attprojb", C},
                     {"ln2w", C},
                     {"ln2b", C},
                     {"fcw", 4 * C * C},
                     {"fcb", 4 * C},
                     {"fcprojw", 4 * C * C},
                     {"fcprojb", C}};
#define ADD(nm, cnt)                                                                               \
    do {                                                                                           \
        snprintf(t[n].name, sizeof t[n].name, "%s", nm);                                           \
        t[n].count = (cnt);                                                                        \
        t[n].offset = off;                                                                         \
        off += t[n].count;                                                                         \
        n++;                                                                                       \
    } while (0)
    ADD("wte", (int64_t)cfg.padded_vocab * C);
    ADD("wpe", (int64_t)cfg.max_seq * C);
    for (int l = 0; l < cfg.layers; l++)
        for (size_t k = 0; k < sizeof per_layer / sizeof *per_layer; k++) {
            char nm[32];
            snprintf(nm, sizeof nm, "h%d.%s", l, per_layer[k].name);
            ADD(nm, per_layer[k].count);
        }
    ADD("lnfw", C);
    ADD("lnfb", C);
#undef ADD
    cr_assert_eq(off, gpt2_num_params(&cfg), "the tensor list covers %lld of %lld parameters",
                 (long long)off, (long long)gpt2_num_params(&cfg));
    return (int)n;
}

/* Token stream of a fixed seed: ids in [0, vocab). */
static void tokens(int32_t *out, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) out[i] = rng_below(&seed, cfg.vocab);
}

typedef struct run {
    float loss[STEPS];
    float *params;
    mw_status st; /* of the step that failed, or MW_OK */
} run;

typedef struct model {
    mw_graph *g;
    gpt2_graph gg;
    mw_mesh *mesh;
    mw_trainer *tr;
} model;

/* Non-NULL: the next models split heads and MLP units over this mesh axis (when on several
 * devices) instead of sharding the batch. */
static const char *model_axis;
/* Non-zero: the next models split every large parameter over X, the batch's axis (FSDP). */
static int fsdp;

static void open_model(model *m, const char *devices, const mw_trainer_config *extra) {
    memset(m, 0, sizeof *m);
    int sharded = strchr(devices, 'x') || strchr(devices, ',') || strcmp(devices, "cpu:2") == 0;
    const char *data = sharded && !model_axis ? "X" : NULL, *split = sharded ? model_axis : NULL;
    cr_assert_eq(mw_graph_new(&m->g), MW_OK, "%s", mw_last_error());
    mw_status st =
        fsdp && sharded
            ? gpt2_build(
                  m->g, &cfg,
                  &(gpt2_layout){.batch = BATCH, .seq = SEQ, .data_axis = "X", .fsdp_axis = "X"},
                  &m->gg)
            : gpt2_build(m->g, &cfg,
                         &(gpt2_layout){
                             .batch = BATCH, .seq = SEQ, .data_axis = data, .model_axis = split},
                         &m->gg);
    cr_assert_eq(st, MW_OK, "gpt2_build: %s", mw_graph_error(m->g));
    cr_assert_eq(mw_mesh_new(devices, split ? split : "X", &m->mesh), MW_OK, "%s: %s", devices,
                 mw_last_error());
    mw_trainer_config c = {.optimizer = {MW_ADAMW, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f,
                                         .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f},
                           .bucket_bytes = 64 << 10}; /* several buckets to overlap */
    if (extra) {
        c.collective_timeout_ms = extra->collective_timeout_ms;
        c.nonfinite = extra->nonfinite;
        c.shard_optimizer = extra->shard_optimizer;
        c.precision = extra->precision;
    }
    st = mw_trainer_new(m->g, m->gg.loss, m->mesh, &c, &m->tr);
    cr_assert_eq(st, MW_OK, "trainer on %s: %s", devices, mw_last_error());
}

static void close_model(model *m) {
    mw_trainer_free(m->tr);
    mw_mesh_free(m->mesh);
    mw_graph_free(m->g);
}

static float *read_params(model *m, const tensor *t, int nt) {
    float *p = calloc((size_t)gpt2_num_params(&cfg), sizeof *p);
    cr_assert_not_null(p);
    for (int i = 0; i < nt; i++)
        cr_assert_eq(mw_trainer_read_param(m->tr, t[i].name, p + t[i].offset, t[i].count), MW_OK,
                     "%s: %s", t[i].name, mw_last_error());
    return p;
}

static void feed(int step, int32_t *in, int32_t *tg, mw_feed f[2]) {
    int64_t n = (int64_t)BATCH * SEQ;
    int32_t stream[BATCH * SEQ + 1];
    tokens(stream, n + 1, 1000 + (uint64_t)step);
    memcpy(in, stream, sizeof(int32_t) * (size_t)n);
    memcpy(tg, stream + 1, sizeof(int32_t) * (size_t)n);
    f[0] = (mw_feed){"tokens", in, n};
    f[1] = (mw_feed){"targets", tg, n};
}

static run train_with(const char *devices, const tensor *t, int nt,
                      const mw_trainer_config *extra) {
    model m;
    open_model(&m, devices, extra);
    run r = {.st = MW_OK};
    int32_t in[BATCH * SEQ], tg[BATCH * SEQ];
    for (int s = 0; s < STEPS; s++) {
        mw_feed f[2];
        feed(s % 2, in, tg, f); /* two batches in turn: the model learns them, the loss falls */
        mw_status st = mw_trainer_step(m.tr, f, 2, &r.loss[s]);
        cr_assert_eq(st, MW_OK, "%s step %d: %s", devices, s, mw_last_error());
    }
    r.params = read_params(&m, t, nt);
    close_model(&m);
    return r;
}

static run train(const char *devices, const tensor *t, int nt) {
    return train_with(devices, t, nt, NULL);
}

/* got against ref, with the cpu:2 run (alt) as the measure of how far rounding alone moves this
 * training: drift = alt - ref.
 *
 * cpu:2 differs from cpu:1 in one place per step, the order of the final batch sum of each
 * gradient (one rounding per element). A GPU rounds differently in every op of the forward and
 * backward pass: this model (L = 2) has about 2 x (4 + 12 L) = 56 op outputs per step, each
 * with its own summation order (cuBLAS's GEMM tiling, block reductions, another exp). Independent
 * rounding differences add in quadrature, so the GPU's per-step perturbation is about
 * sqrt(56) = 7.5 times cpu:2's, and to first order two trajectories diverge in proportion to the
 * perturbation that separates them (AdamW's normalisation amplifies both alike). The bound takes
 * K = 64: a factor 8, and 8 more for ops whose results differ by several units of rounding
 * (split-K sums, the exponential), plus 16 units of rounding of the largest value. It is applied to
 * the largest element difference and to the root-mean-square difference of each tensor, the latter
 * being insensitive to the odd element whose tiny gradient AdamW's normalisation turns into a
 * full-size step. A wrong kernel moves these values by the learning rate (1e-3) times the step
 * count, three orders of magnitude above the bound. */
#define DRIFT_FACTOR 64

static void compare(const char *what, const run *got, const run *ref, const run *alt,
                    const tensor *t, int nt) {
    double drift = 0;
    for (int s = 0; s < STEPS; s++) drift = fmax(drift, fabs((double)alt->loss[s] - ref->loss[s]));
    for (int s = 0; s < STEPS; s++) {
        double tol = DRIFT_FACTOR * drift + 16 * FLT_EPSILON * fabs(ref->loss[s]);
        cr_assert(fabs((double)got->loss[s] - ref->loss[s]) <= tol,
                  "%s: loss of step %d is %.9g, cpu:1 has %.9g (tolerance %.3g: cpu:2 drifts "
                  "%.3g)",
                  what, s, got->loss[s], ref->loss[s], tol, drift);
    }
    for (int i = 0; i < nt; i++) {
        double d = 0, big = 0, worst = 0, sq_alt = 0, sq_got = 0;
        int64_t at = 0;
        for (int64_t j = t[i].offset; j < t[i].offset + t[i].count; j++) {
            double da = (double)alt->params[j] - ref->params[j];
            double dg = (double)got->params[j] - ref->params[j];
            d = fmax(d, fabs(da));
            big = fmax(big, fabs((double)ref->params[j]));
            sq_alt += da * da;
            sq_got += dg * dg;
            if (fabs(dg) > worst) {
                worst = fabs(dg);
                at = j - t[i].offset;
            }
        }
        double tol = DRIFT_FACTOR * d + 16 * FLT_EPSILON * big;
        cr_assert(worst <= tol,
                  "%s: parameter %s differs from cpu:1 by %.3g at element %lld (tolerance %.3g: "
                  "cpu:2 drifts %.3g)",
                  what, t[i].name, worst, (long long)at, tol, d);
        double rms_alt = sqrt(sq_alt / (double)t[i].count), rms = sqrt(sq_got / (double)t[i].count);
        double rtol = DRIFT_FACTOR * rms_alt + 16 * FLT_EPSILON * big;
        cr_assert(rms <= rtol,
                  "%s: parameter %s differs from cpu:1 by %.3g root-mean-square (tolerance %.3g: "
                  "cpu:2 drifts %.3g)",
                  what, t[i].name, rms, rtol, rms_alt);
    }
}

static void expect_same_bits(const char *what, const run *a, const run *b) {
    cr_assert(memcmp(a->loss, b->loss, sizeof a->loss) == 0, "%s: the losses differ", what);
    size_t bytes = (size_t)gpt2_num_params(&cfg) * sizeof(float);
    cr_assert(memcmp(a->params, b->params, bytes) == 0, "%s: the parameters differ", what);
}

TestSuite(gpu_trainer, .timeout = 240);

Test(gpu_trainer, ten_gpt2_steps_match_the_cpu) {
    need_gpu();
    tensor t[MAX_TENSORS];
    int nt = list_tensors(t);
    run cpu1 = train("cpu:1", t, nt), cpu2 = train("cpu:2", t, nt);
    run gpu1 = train("cuda:0", t, nt), gpu2 = train("cuda:0x2", t, nt);
    /* The losses fall: the runs train, so agreeing is not agreeing on nothing. */
    cr_assert_lt(cpu1.loss[STEPS - 1], cpu1.loss[0]);
    compare("cuda:0", &gpu1, &cpu1, &cpu2, t, nt);
    compare("cuda:0x2", &gpu2, &cpu1, &cpu2, t, nt);
    /* cuda:0x2 against cuda:0 differ only in how the two halves are summed, as cpu:2 and cpu:1:
     * the same bound with cuda:0 as the reference. */
    compare("cuda:0x2 against cuda:0", &gpu2, &gpu1, &cpu2, t, nt);
    /* Bit for bit the same on a second run, also with overlapped buckets on two devices. */
    run again1 = train("cuda:0", t, nt), again2 = train("cuda:0x2", t, nt);
    expect_same_bits("cuda:0 run twice", &gpu1, &again1);
    expect_same_bits("cuda:0x2 run twice", &gpu2, &again2);
}

/* bf16 precision on the GPU (tensor-core GEMMs, bf16 activations) against the CPU's bf16, with
 * the CPU's own cpu:1 / cpu:2 difference in bf16 as the measure of rounding's drift, and bit for
 * bit on a second run. The two backends round in more places apart than in f32 (the CPU's
 * attention rounds P, dS and dO to bf16 for its products, the GPU's computes them in f32 from
 * the same bf16 q, k, v), which the same factor covers: a wrong kernel moves the values by the
 * learning rate times the steps, far above it. */
Test(gpu_trainer, bf16_gpt2_matches_the_cpu_in_bf16) {
    need_gpu();
    tensor t[MAX_TENSORS];
    int nt = list_tensors(t);
    mw_trainer_config bf16 = {.precision = MW_PRECISION_BF16};
    run cpu1 = train_with("cpu:1", t, nt, &bf16), cpu2 = train_with("cpu:2", t, nt, &bf16);
    run gpu1 = train_with("cuda:0", t, nt, &bf16), again = train_with("cuda:0", t, nt, &bf16);
    cr_assert_lt(cpu1.loss[STEPS - 1], cpu1.loss[0]);
    compare("cuda:0 bf16", &gpu1, &cpu1, &cpu2, t, nt);
    expect_same_bits("cuda:0 bf16 run twice", &gpu1, &again);
    model m;
    open_model(&m, "cuda:0", &bf16);
    char k[512];
    OK(mw_trainer_kernels(m.tr, k, sizeof k));
    cr_assert(strstr(k, "gemm bf16"), "%s", k);
    close_model(&m);
}

/* FSDP over two logical devices of one GPU: the all-gathers (each started one ahead, on the
 * communication stream) and reduce-scatters on CUDA, and the exact gradient norm on both devices,
 * give the replicated run's bits (clipping at 1.0 included), and the CPU's losses and parameters
 * to its rounding. */
Test(gpu_trainer, fsdp_equals_the_replicated_run) {
    need_gpu();
    tensor t[MAX_TENSORS];
    int nt = list_tensors(t);
    run cpu1 = train("cpu:1", t, nt), cpu2 = train("cpu:2", t, nt);
    run rep = train("cuda:0x2", t, nt);
    fsdp = 1;
    run fs = train("cuda:0x2", t, nt);
    fsdp = 0;
    expect_same_bits("cuda:0x2 FSDP against replicated", &fs, &rep);
    compare("cuda:0x2 FSDP", &fs, &cpu1, &cpu2, t, nt);
}

/* Heads and MLP units split over two logical devices of one GPU: the shards, the partial-sum
 * all-reduces and the whole-tensor reads on CUDA, against the CPU (cpu:1; cpu:2 with the same
 * split gives the drift), and the same bits on a second run. */
Test(gpu_trainer, tensor_parallel_matches_the_cpu) {
    need_gpu();
    tensor t[MAX_TENSORS];
    int nt = list_tensors(t);
    run cpu1 = train("cpu:1", t, nt);
    model_axis = "Y";
    run cpu2 = train("cpu:2", t, nt), gpu2 = train("cuda:0x2", t, nt);
    run again = train("cuda:0x2", t, nt);
    model_axis = NULL;
    compare("cuda:0x2 split over Y", &gpu2, &cpu1, &cpu2, t, nt);
    expect_same_bits("cuda:0x2 split over Y, run twice", &gpu2, &again);
}

/* A bad token (or target) on one GPU: the step fails with the data error and no parameter
 * changes, as on the CPU. With both in one step, the error names at least the one found first
 * (the launch that notices the flag stops the step; which one that is depends on timing). */
Test(gpu_trainer, bad_ids_update_nothing) {
    need_gpu();
    tensor t[MAX_TENSORS];
    int nt = list_tensors(t);
    static const char *const specs[] = {"cuda:0", "cuda:0x2"};
    for (int d = 0; d < 2; d++) {
        model m;
        open_model(&m, specs[d], NULL);
        int32_t in[BATCH * SEQ], tg[BATCH * SEQ];
        mw_feed f[2];
        feed(0, in, tg, f);
        float loss;
        cr_assert_eq(mw_trainer_step(m.tr, f, 2, &loss), MW_OK, "%s", mw_last_error());
        float *before = read_params(&m, t, nt);
        for (int c = 0; c < 3; c++) {
            feed(1, in, tg, f);
            if (c != 1) in[40] = cfg.padded_vocab + 3; /* past wte's rows */
            if (c != 0) tg[17] = cfg.vocab;            /* a padded, invalid class */
            mw_status st = mw_trainer_step(m.tr, f, 2, &loss);
            const char *msg = mw_last_error();
            cr_assert_eq(st, MW_ERR_INVALID, "%s case %d: got %s: %s", specs[d], c,
                         mw_status_name(st), msg);
            int id = strstr(msg, "embedding id 259 at position 40") != NULL;
            int target = strstr(msg, "cross-entropy target 250 at position 17") != NULL;
            cr_assert(c == 0   ? id
                      : c == 1 ? target
                               : id || target,
                      "%s case %d: %s", specs[d], c, msg);
            float *after = read_params(&m, t, nt);
            cr_assert(memcmp(before, after, (size_t)gpt2_num_params(&cfg) * sizeof(float)) == 0,
                      "%s case %d: a parameter changed in a failed step", specs[d], c);
            free(after);
        }
        /* Good data again: the trainer steps on. */
        feed(2, in, tg, f);
        cr_assert_eq(mw_trainer_step(m.tr, f, 2, &loss), MW_OK, "%s", mw_last_error());
        cr_assert(isfinite(loss));
        free(before);
        close_model(&m);
    }
}

/* A device that fails in the gradient reduction, or stalls past the collective timeout, leaves
 * overlapped sums queued; the step fails, the next one works and matches a clean run's step, and
 * the trainer frees without hanging. */
Test(gpu_trainer, failed_and_abandoned_collectives_are_survived) {
    need_gpu();
    tensor t[MAX_TENSORS];
    int nt = list_tensors(t);
    (void)nt;
    mw_trainer_config c = {.collective_timeout_ms = 2000};
    model m;
    open_model(&m, "cuda:0x2", &c);
    int32_t in[BATCH * SEQ], tg[BATCH * SEQ];
    mw_feed f[2];
    float loss;
    feed(0, in, tg, f);
    cr_assert_eq(mw_trainer_step(m.tr, f, 2, &loss), MW_OK, "%s", mw_last_error());
    /* Fault: device 1 fails as it enters the gradient reduction of step 1. */
    cr_assert_eq(
        mw_test_control(MW_TEST_FAULT, m.tr, 1, MW_PHASE_GRAD_REDUCE, (int64_t)(1), MW_ERR_DEVICE),
        MW_OK);
    mw_status st = mw_trainer_step(m.tr, f, 2, &loss);
    cr_assert_eq(st, MW_ERR_DEVICE, "got %s: %s", mw_status_name(st), mw_last_error());
    cr_assert(strstr(mw_last_error(), "injected fault"), "%s", mw_last_error());
    /* Stall: device 0 sleeps 3 s in backward; device 1 times out in a collective. */
    cr_assert_eq(mw_test_control(MW_TEST_STALL, m.tr, 0, MW_PHASE_BACKWARD, (int64_t)(1), 3000),
                 MW_OK);
    st = mw_trainer_step(m.tr, f, 2, &loss);
    cr_assert(st == MW_ERR_TIMEOUT || st == MW_ERR_ABORTED, "got %s: %s", mw_status_name(st),
              mw_last_error());
    /* Both failed steps updated nothing: the next step gives a clean run's step 1 loss. */
    cr_assert_eq(mw_trainer_step(m.tr, f, 2, &loss), MW_OK, "%s", mw_last_error());
    model clean;
    open_model(&clean, "cuda:0x2", &c);
    float l0, l1;
    feed(0, in, tg, f);
    cr_assert_eq(mw_trainer_step(clean.tr, f, 2, &l0), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_step(clean.tr, f, 2, &l1), MW_OK, "%s", mw_last_error());
    cr_assert_eq(loss, l1, "after the failures the loss is %.9g, a clean run's %.9g", loss, l1);
    close_model(&clean);
    close_model(&m);
}

/* ZeRO-1 (shard_optimizer): reduce-scatter and all-gather on the device reducers, bitwise the
 * replicated update (losses and parameters) on devices sharing a GPU, and over NCCL where there
 * are two GPUs. */
Test(gpu_trainer, zero1_is_bitwise_the_replicated_update) {
    int gpus = 0;
    need_gpu();
    cr_assert_eq(mw__cuda_probe(&gpus), MW_OK);
    tensor t[MAX_TENSORS];
    int nt = list_tensors(t);
    mw_trainer_config zero1 = {.shard_optimizer = 1};
    static const char *const specs[] = {"cuda:0x2", "cuda:0,1"};
    for (int k = 0; k < (gpus > 1 ? 2 : 1); k++) {
        run repl = train(specs[k], t, nt), sharded = train_with(specs[k], t, nt, &zero1);
        expect_same_bits(specs[k], &sharded, &repl);
        free(repl.params);
        free(sharded.params);
    }
}

/* Dropout in a trainer: h = dropout(x * w, p) with L = sum(h r), three steps on cpu:1, cuda:0 and
 * cuda:0x2 (the batch sharded over two devices on the GPU). The mask depends only on the seed,
 * the call, the step and the element's index in the whole tensor, so every run draws the same
 * one: h (one multiply and one scaling per element) is the same bits everywhere, its kept
 * fraction that of p within 6 standard deviations, and the masks of two steps differ; d w sums
 * the batch's kept terms in another order, so within (rows - 1) eps of their magnitudes. */
enum { DROP_ROWS = 64, DROP_COLS = 256, DROP_STEPS = 3 };
#define DROP_P 0.25f

static void dropout_run(const char *devices, const float *x, const float *r, float *h, float *dw) {
    mw_graph *g;
    OK(mw_graph_new(&g));
    int sharded = strcmp(devices, "cuda:0x2") == 0;
    mw_tensor *xt = mw_input(g, "x", MW_F32, MW_AXES({"Batch", DROP_ROWS}, {"Feature", DROP_COLS}));
    mw_tensor *rt = mw_input(g, "r", MW_F32, MW_AXES({"Batch", DROP_ROWS}, {"Feature", DROP_COLS}));
    if (sharded) xt = mw_shard(g, xt, "Batch", "X"), rt = mw_shard(g, rt, "Batch", "X");
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Feature", DROP_COLS}), MW_INIT_CONST(1.0f));
    mw_tensor *ht = mw_dropout(g, mw_mul(g, xt, w), DROP_P, 77);
    mw_tensor *loss = mw_sum(g, mw_mul(g, ht, rt), NULL);
    mw_tensor *outs[1] = {ht};
    mw_trainer_config c = {.optimizer = {MW_SGD, .lr = 0.0f}, .outputs = outs, .noutputs = 1};
    mw_mesh *mesh;
    mw_trainer *tr;
    OK(mw_mesh_new(devices, "X", &mesh));
    OK(mw_trainer_new(g, loss, mesh, &c, &tr));
    mw_feed f[2] = {{"x", x, DROP_ROWS * DROP_COLS}, {"r", r, DROP_ROWS * DROP_COLS}};
    for (int s = 0; s < DROP_STEPS; s++) {
        float l;
        OK(mw_trainer_compute_grads(tr, f, 2, &l));
        OK(mw_trainer_read_output(tr, ht, h + s * DROP_ROWS * DROP_COLS, DROP_ROWS * DROP_COLS));
        OK(mw_trainer_read_grad(tr, "w", dw + s * DROP_COLS, DROP_COLS));
        OK(mw_trainer_step(tr, f, 2, &l)); /* the next step draws the next mask */
    }
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

Test(gpu_trainer, dropout_draws_the_cpus_mask) {
    need_gpu();
    enum { N = DROP_ROWS * DROP_COLS };
    static float x[N], r[N], hc[DROP_STEPS * N], hg[DROP_STEPS * N];
    static float dc[DROP_STEPS * DROP_COLS], dg[DROP_STEPS * DROP_COLS];
    uint64_t seed = 5;
    for (int i = 0; i < N; i++) {
        rng_lcg64(&seed);
        x[i] = (float)rng_unit24(seed) + 0.5f; /* never 0 */
        r[i] = (float)((double)(seed >> 16 & 0xffffff) / (double)(1ull << 24) - 0.5);
    }
    dropout_run("cpu:1", x, r, hc, dc);
    static const char *const specs[] = {"cuda:0", "cuda:0x2"};
    for (int k = 0; k < 2; k++) {
        dropout_run(specs[k], x, r, hg, dg);
        for (int s = 0; s < DROP_STEPS; s++) {
            const float *c = hc + s * N, *gp = hg + s * N;
            cr_assert(memcmp(c, gp, sizeof(float) * N) == 0,
                      "%s step %d: dropout's output is not the CPU's bits", specs[k], s);
            int kept = 0;
            for (int i = 0; i < N; i++) kept += c[i] != 0.0f;
            double want = (1.0 - DROP_P) * N, sd = sqrt(N * DROP_P * (1.0 - DROP_P));
            cr_assert(fabs(kept - want) <= 6 * sd, "step %d kept %d of %d (p %.2f)", s, kept, N,
                      (double)DROP_P);
            for (int j = 0; j < DROP_COLS; j++) {
                double mag = 0;
                for (int b = 0; b < DROP_ROWS; b++)
                    mag += fabs((double)c[b * DROP_COLS + j] * r[b * DROP_COLS + j]);
                double tol = (2.0 * DROP_ROWS) * FLT_EPSILON * mag + 1e-30;
                cr_assert(fabs((double)dg[s * DROP_COLS + j] - dc[s * DROP_COLS + j]) <= tol,
                          "%s step %d: d w[%d] %.9g, the CPU's %.9g", specs[k], s, j,
                          dg[s * DROP_COLS + j], dc[s * DROP_COLS + j]);
            }
        }
        cr_assert(memcmp(hc, hc + N, sizeof(float) * N) != 0, "steps 0 and 1 drew the same mask");
    }
}

#else

Test(gpu_trainer, no_cuda_backend) { cr_skip("this build of meshwit has no CUDA backend"); }

#endif
