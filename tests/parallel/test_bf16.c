/* bf16 precision (mw_cast, mw_trainer_config.precision) end to end: the type rules and their
 * messages; the gradient of a cast (the incoming one, unrounded); GPT-2 trained in bf16 on one
 * device and sharded (to the tolerance bf16's rounding leaves), bitwise repeatable per mesh,
 * bitwise the same with ZeRO-1, through the bf16 instructions and through the f32 fallback; the
 * bf16 parameter copy kept current (host writes, checkpoints, an inference program sharing the
 * parameters); and the memory it takes and saves. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "devices/math.h"
#include "gpt2_model.h"
#include "meshwit.h"
#include "tests/common/gpt2_fixture.h"

/* --- the type rules ------------------------------------------------------------------------- */

Test(bf16_graph, casts_and_their_errors) {
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", 4}, {"In", 3}));
    mw_tensor *w = mw_param(g, "w", MW_AXES({"In", 3}, {"Out", 2}), MW_INIT_ZEROS);
    cr_assert_eq(mw_cast(g, x, MW_F32), x, "a cast to its own dtype is the tensor itself");
    mw_tensor *xb = mw_cast(g, x, MW_BF16), *wb = mw_cast(g, w, MW_BF16);
    cr_assert_eq(mw_tensor_dtype(xb), MW_BF16);
    mw_tensor *y = mw_dot(g, xb, wb, "In");
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    cr_assert_eq(mw_tensor_dtype(y), MW_F32, "a bf16 contraction sums in f32");
    cr_assert_eq(mw_tensor_dtype(mw_cast(g, xb, MW_F32)), MW_F32);
    cr_assert_eq(mw_tensor_dtype(mw_rename(g, xb, "In", "Feature")), MW_BF16, "reshapes keep it");
    mw_graph_free(g);

    /* a bf16 operand meeting an f32 one in a contraction */
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", 4}, {"In", 3}));
    w = mw_param(g, "w", MW_AXES({"In", 3}), MW_INIT_ZEROS);
    cr_assert_null(mw_dot(g, mw_cast(g, x, MW_BF16), w, "In"));
    cr_assert_eq(mw_graph_status(g), MW_ERR_DTYPE);
    cr_assert(strstr(mw_graph_error(g), "bf16") && strstr(mw_graph_error(g), "mw_cast"), "%s",
              mw_graph_error(g));
    mw_graph_free(g);

    /* an op that takes f32 only, given bf16 */
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", 4}, {"In", 3}));
    cr_assert_null(mw_add(g, mw_cast(g, x, MW_BF16), x));
    cr_assert_eq(mw_graph_status(g), MW_ERR_DTYPE);
    cr_assert(strstr(mw_graph_error(g), "mw_add") && strstr(mw_graph_error(g), "bf16[Batch=4") &&
                  strstr(mw_graph_error(g), "mw_cast it to f32"),
              "%s", mw_graph_error(g));
    mw_graph_free(g);

    /* ids do not convert */
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *ids = mw_input(g, "ids", MW_I32, MW_AXES({"Batch", 4}));
    cr_assert_null(mw_cast(g, ids, MW_BF16));
    cr_assert_eq(mw_graph_status(g), MW_ERR_DTYPE);
    cr_assert(strstr(mw_graph_error(g), "i32"), "%s", mw_graph_error(g));
    mw_graph_free(g);
}

Test(bf16_graph, attention_takes_bf16) {
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *qkv =
        mw_input(g, "qkv", MW_F32, MW_AXES({"Seq", 8}, {"Part", 3}, {"Head", 2}, {"HeadDim", 4}));
    mw_tensor *y = mw_attention(g, mw_cast(g, qkv, MW_BF16), "Part", "Seq", "HeadDim", 1, 0.5f);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    cr_assert_eq(mw_tensor_dtype(y), MW_F32);
    mw_graph_free(g);
}

Test(bf16_graph, precision_out_of_range_is_refused) {
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr = NULL;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", 4}));
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Batch", 4}), MW_INIT_ZEROS);
    mw_tensor *loss = mw_sum(g, mw_mul(g, x, w), NULL);
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &mesh), MW_OK);
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.1f}, .precision = (mw_precision)7};
    cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "precision is 7"), "%s", mw_last_error());
    cr_assert_null(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

/* --- attention of qkv as a contraction leaves it ------------------------------------------------
 */

/* grad of wqkv [Part, Head, HeadDim, Embed] through attention of qkv = x . wqkv, which is laid out
 * [Batch, Seq, Part, Head, HeadDim] (legal: the feature axis is last). Under the bf16 policy the
 * backward GEMM reads d(qkv) in bf16; the attention gradient's kernels write f32 only, so the
 * plan must convert rather than ask them for bf16 (which once wrote f32 values into a bf16-sized
 * buffer: non-finite gradients with the bf16 instructions, a failed step without them). */
static void qkv_grad(const char *devices, mw_precision precision, float *grad, int n, float *loss) {
    enum { B = 2, T = 19, C = 24, H = 2, D = 8 };
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", B}, {"Seq", T}, {"Embed", C}));
    if (strcmp(devices, "cpu:1") != 0) x = mw_shard(g, x, "Batch", "X");
    mw_tensor *w =
        mw_param(g, "wqkv", MW_AXES({"Part", 3}, {"Head", H}, {"HeadDim", D}, {"Embed", C}),
                 MW_INIT_NORMAL(0.3f));
    mw_tensor *a = mw_attention(g, mw_dot(g, x, w, "Embed"), "Part", "Seq", "HeadDim", 1, 0.35f);
    mw_tensor *l = mw_mean(g, mw_mul(g, a, a), NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    cr_assert_eq(n, 3 * H * D * C);
    cr_assert_eq(mw_mesh_new(devices, "X", &mesh), MW_OK);
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.1f}, .precision = precision};
    cr_assert_eq(mw_trainer_new(g, l, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());
    static float xs[B * T * C];
    for (int i = 0; i < B * T * C; i++) xs[i] = sinf(0.37f * (float)i) * 0.8f;
    mw_feed feed = {"x", xs, B * T * C};
    cr_assert_eq(mw_trainer_compute_grads(tr, &feed, 1, loss), MW_OK, "%s on %s: %s",
                 precision ? "bf16" : "f32", devices, mw_last_error());
    cr_assert_eq(mw_trainer_read_grad(tr, "wqkv", grad, n), MW_OK, "%s", mw_last_error());
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

Test(bf16_training, attention_of_qkv_as_a_contraction_leaves_it) {
    enum { N = 3 * 2 * 8 * 24 };
    static float f32[N], b16[N];
    float lf, lb;
    qkv_grad("cpu:1", MW_PRECISION_FP32, f32, N, &lf);
    double big = 0;
    for (int i = 0; i < N; i++) big = fmax(big, fabs(f32[i]));
    cr_assert_gt(big, 0.0);
    const char *devs[] = {"cpu:1", "cpu:2"};
    for (int d = 0; d < 2; d++) {
        qkv_grad(devs[d], MW_PRECISION_BF16, b16, N, &lb);
        cr_assert(fabsf(lb - lf) <= 3e-2f * fabsf(lf), "%s: loss %g in bf16, %g in f32", devs[d],
                  lb, lf);
        /* bf16 keeps 8 bits: within 3e-2 of f32 relative to the largest element. */
        for (int i = 0; i < N; i++)
            cr_assert(isfinite(b16[i]) && fabs(b16[i] - f32[i]) <= 3e-2 * big,
                      "%s: d(wqkv)[%d] = %g in bf16, %g in f32 (largest %g)", devs[d], i, b16[i],
                      f32[i], big);
    }
}

/* loss = mean(y * y) + mean(h * h), h = gelu(x w1), y = h w2, in the given precision on cpu:1:
 * under the bf16 policy h is read twice, by a cast (for y's contraction) and as it is (h * h),
 * so GELU's kernel must not write it in bf16 for the cast alone. Returns the loss; d(w1) in g1. */
static float read_twice(mw_precision precision, float *g1, int n1) {
    enum { B = 6, F = 8, H = 16, O = 4 };
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", B}, {"F", F}));
    mw_tensor *w1 = mw_param(g, "w1", MW_AXES({"F", F}, {"H", H}), MW_INIT_NORMAL(0.5f));
    mw_tensor *w2 = mw_param(g, "w2", MW_AXES({"H", H}, {"O", O}), MW_INIT_NORMAL(0.5f));
    mw_tensor *h = mw_gelu(g, mw_dot(g, x, w1, "F"));
    mw_tensor *y = mw_dot(g, h, w2, "H");
    mw_tensor *l = mw_add(g, mw_mean(g, mw_mul(g, y, y), NULL), mw_mean(g, mw_mul(g, h, h), NULL));
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    cr_assert_eq(n1, F * H);
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &mesh), MW_OK);
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.1f}, .precision = precision};
    cr_assert_eq(mw_trainer_new(g, l, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());
    static float xs[B * F];
    for (int i = 0; i < B * F; i++) xs[i] = cosf(0.61f * (float)i);
    mw_feed feed = {"x", xs, B * F};
    float loss;
    cr_assert_eq(mw_trainer_compute_grads(tr, &feed, 1, &loss), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_grad(tr, "w1", g1, n1), MW_OK, "%s", mw_last_error());
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    return loss;
}

Test(bf16_training, a_value_read_as_it_is_and_through_a_cast_keeps_its_f32) {
    enum { N = 8 * 16 };
    float f32[N], b16[N];
    float lf = read_twice(MW_PRECISION_FP32, f32, N), lb = read_twice(MW_PRECISION_BF16, b16, N);
    cr_assert(fabsf(lb - lf) <= 2e-2f * fabsf(lf), "loss %g in bf16, %g in f32", lb, lf);
    double big = 0;
    for (int i = 0; i < N; i++) big = fmax(big, fabs(f32[i]));
    cr_assert_gt(big, 0.0);
    for (int i = 0; i < N; i++)
        cr_assert(isfinite(b16[i]) && fabs(b16[i] - f32[i]) <= 3e-2 * big,
                  "d(w1)[%d] = %g in bf16, %g in f32 (largest %g)", i, b16[i], f32[i], big);
}

/* --- the gradient of a cast --------------------------------------------------------------------
 */

Test(bf16_graph, the_gradient_through_casts_is_the_incoming_one) {
    /* loss = mean over Batch of sum_f bf16(x)[b, f] * bf16(w)[f]: its gradient for w is the mean
     * of bf16(x) over the batch (the incoming gradient, 1/B, is exact in bf16 and the sums are
     * exact in f32: x is a multiple of 1/64), with no rounding of the gradient itself; under the
     * bf16 policy the same model without the explicit casts gives the same numbers. */
    enum { B = 4, F = 5 };
    float x[B * F], w[F] = {0.3f, -1.7f, 2.25f, 0.0f, 1e-3f}, want[F] = {0};
    for (int i = 0; i < B * F; i++) x[i] = (float)((i * 37) % 128 - 64) / 64.0f;
    for (int f = 0; f < F; f++)
        for (int b = 0; b < B; b++) want[f] += x[b * F + f] / B;
    for (int policy = 0; policy < 2; policy++) {
        mw_graph *g;
        mw_mesh *mesh;
        mw_trainer *tr;
        cr_assert_eq(mw_graph_new(&g), MW_OK);
        mw_tensor *xi = mw_input(g, "x", MW_F32, MW_AXES({"Batch", B}, {"F", F}));
        mw_tensor *wp = mw_param(g, "w", MW_AXES({"F", F}), MW_INIT_ZEROS);
        mw_tensor *y = policy ? mw_dot(g, xi, wp, "F")
                              : mw_dot(g, mw_cast(g, xi, MW_BF16), mw_cast(g, wp, MW_BF16), "F");
        mw_tensor *loss = mw_mean(g, y, NULL);
        cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
        cr_assert_eq(mw_mesh_new("cpu:1", "X", &mesh), MW_OK);
        mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.1f},
                                 .precision = policy ? MW_PRECISION_BF16 : MW_PRECISION_FP32};
        cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());
        cr_assert_eq(mw_trainer_write_param(tr, "w", w, F), MW_OK);
        mw_feed feed = {"x", x, B * F};
        float l, grad[F];
        cr_assert_eq(mw_trainer_compute_grads(tr, &feed, 1, &l), MW_OK, "%s", mw_last_error());
        cr_assert_eq(mw_trainer_read_grad(tr, "w", grad, F), MW_OK);
        for (int f = 0; f < F; f++)
            cr_assert_eq(grad[f], want[f], "policy %d: dL/dw[%d] = %a, want %a", policy, f,
                         (double)grad[f], (double)want[f]);
        double ref = 0;
        for (int b = 0; b < B; b++)
            for (int f = 0; f < F; f++)
                ref += (double)x[b * F + f] * (double)mw__bf16_to_f32(mw__bf16_from_f32(w[f])) / B;
        cr_assert(fabs(l - ref) <= 1e-6 * (1 + fabs(ref)), "loss %.9g, want %.9g", l, ref);
        mw_trainer_free(tr);
        mw_mesh_free(mesh);
        mw_graph_free(g);
    }
}

/* --- GPT-2 in bf16 ---------------------------------------------------------------------------- */

#define BATCH 6
#define SEQ 16
#define STEPS 4

static const gpt2_config CFG = {
    .layers = 2, .heads = 2, .channels = 32, .max_seq = 16, .vocab = 50, .padded_vocab = 64};

static mw_trainer_config config(mw_precision p, int zero1) {
    mw_trainer_config c = fixture_config(p);
    c.shard_optimizer = zero1;
    return c;
}

/* GPT-2 on `devices` (the batch sharded over X, or over X with the heads and MLP units split over
 * Y when model is set), from the graph's seed: every run starts from the same parameters. */
static void open_run(fixture_run *r, const char *devices, const char *axes, int model,
                     mw_trainer_config cfg) {
    fixture_open(r, &CFG, BATCH, SEQ, 11, devices, axes, model, cfg);
}

/* Tokens of step k (and its targets, shifted by one). */
static void tokens(int k, int32_t *tok, int32_t *tgt) {
    fixture_tokens(CFG.vocab, BATCH * SEQ, 977u, 131u, k, tok, tgt);
}

static float step(fixture_run *r, int k) {
    int32_t tok[BATCH * SEQ], tgt[BATCH * SEQ];
    tokens(k, tok, tgt);
    mw_feed f[2] = {{"tokens", tok, BATCH * SEQ}, {"targets", tgt, BATCH * SEQ}};
    float loss = NAN;
    cr_assert_eq(mw_trainer_step(r->tr, f, 2, &loss), MW_OK, "step %d: %s", k, mw_last_error());
    return loss;
}

static float eval(fixture_run *r, int k) {
    int32_t tok[BATCH * SEQ], tgt[BATCH * SEQ];
    tokens(k, tok, tgt);
    mw_feed f[2] = {{"tokens", tok, BATCH * SEQ}, {"targets", tgt, BATCH * SEQ}};
    float loss = NAN;
    cr_assert_eq(mw_trainer_eval(r->tr, f, 2, &loss), MW_OK, "%s", mw_last_error());
    return loss;
}

static void read_wte(fixture_run *r, float *out) {
    int64_t n = (int64_t)CFG.padded_vocab * CFG.channels;
    cr_assert_eq(mw_trainer_read_param(r->tr, "wte", out, n), MW_OK, "%s", mw_last_error());
}

#define WTE (64 * 32)

/* Losses of STEPS steps, and wte after them. */
static void trajectory(const char *devices, const char *axes, int model, mw_trainer_config cfg,
                       float *losses, float *wte) {
    fixture_run r;
    open_run(&r, devices, axes, model, cfg);
    for (int k = 0; k < STEPS; k++) losses[k] = step(&r, k);
    read_wte(&r, wte);
    fixture_close(&r);
}

/* Sharded runs sum the same products in another order, so an activation near a bf16 rounding
 * boundary may round the other way: a relative change of at most 2^-8 in that value, spread over
 * the mean loss; 2^-8 relative bounds the losses' difference with room to spare. */
static void close_losses(const float *a, const float *b, const char *what) {
    for (int k = 0; k < STEPS; k++)
        cr_assert(fabsf(a[k] - b[k]) <= ldexpf(1.0f, -8) * fabsf(b[k]),
                  "%s: step %d loss %.7f vs %.7f", what, k, a[k], b[k]);
}

Test(bf16_training, sharded_equals_one_device_and_repeats_bitwise) {
    float l1[STEPS], l2[STEPS], l2b[STEPS], l3[STEPS], f1[STEPS];
    static float w1[WTE], w2[WTE], w2b[WTE], w3[WTE], wf[WTE];
    trajectory("cpu:1", "X", 0, config(MW_PRECISION_BF16, 0), l1, w1);
    trajectory("cpu:2", "X", 0, config(MW_PRECISION_BF16, 0), l2, w2);
    trajectory("cpu:2", "X", 0, config(MW_PRECISION_BF16, 0), l2b, w2b);
    trajectory("cpu:3", "X", 0, config(MW_PRECISION_BF16, 0), l3, w3); /* 6 rows: 2 each */
    trajectory("cpu:1", "X", 0, config(MW_PRECISION_FP32, 0), f1, wf);
    close_losses(l2, l1, "cpu:2 vs cpu:1");
    close_losses(l3, l1, "cpu:3 vs cpu:1");
    cr_assert_eq(memcmp(l2, l2b, sizeof l2), 0, "cpu:2 twice: the losses differ");
    cr_assert_eq(memcmp(w2, w2b, sizeof w2), 0, "cpu:2 twice: the parameters differ");
    /* bf16 is not f32: the runs differ, by about bf16's precision, not more. */
    cr_assert_neq(memcmp(l1, f1, sizeof l1), 0, "the bf16 run computed in f32");
    for (int k = 0; k < STEPS; k++)
        cr_assert(fabsf(l1[k] - f1[k]) <= 2e-2f * f1[k], "step %d: bf16 %.6f, f32 %.6f", k, l1[k],
                  f1[k]);
    for (int i = 0; i < WTE; i++)
        cr_assert(fabsf(w2[i] - w1[i]) <= 1e-3f, "wte[%d]: cpu:2 %g, cpu:1 %g", i, w2[i], w1[i]);
}

Test(bf16_training, zero1_is_the_replicated_update_bitwise) {
    float a[STEPS], b[STEPS];
    static float wa[WTE], wb[WTE];
    trajectory("cpu:2", "X", 0, config(MW_PRECISION_BF16, 0), a, wa);
    trajectory("cpu:2", "X", 0, config(MW_PRECISION_BF16, 1), b, wb);
    cr_assert_eq(memcmp(a, b, sizeof a), 0, "losses differ with ZeRO-1");
    cr_assert_eq(memcmp(wa, wb, sizeof wa), 0, "parameters differ with ZeRO-1");
}

Test(bf16_training, tensor_parallel_equals_one_device) {
    float a[STEPS], b[STEPS];
    static float wa[WTE], wb[WTE];
    trajectory("cpu:1", "X", 0, config(MW_PRECISION_BF16, 0), a, wa);
    trajectory("cpu:4", "X=2,Y=2", 1, config(MW_PRECISION_BF16, 0), b, wb);
    close_losses(b, a, "X=2,Y=2 vs cpu:1");
}

Test(bf16_training, the_f32_fallback_equals_the_bf16_instructions) {
    /* A CPU without bf16 instructions multiplies the same bf16 values in f32. */
    float a[STEPS], b[STEPS];
    static float wa[WTE], wb[WTE];
    trajectory("cpu:2", "X", 0, config(MW_PRECISION_BF16, 0), a, wa);
    setenv("MESHWIT_CPU_ISA", "avx512", 1);
    fixture_run r;
    open_run(&r, "cpu:1", "X", 0, config(MW_PRECISION_BF16, 0));
    char k[512];
    cr_assert_eq(mw_trainer_kernels(r.tr, k, sizeof k), MW_OK);
    cr_assert(strstr(k, "gemm bf16: bf16 widened to f32"), "%s", k);
    fixture_close(&r);
    trajectory("cpu:2", "X", 0, config(MW_PRECISION_BF16, 0), b, wb);
    unsetenv("MESHWIT_CPU_ISA");
    close_losses(b, a, "widened vs bf16 instructions");
}

Test(bf16_training, the_bf16_copy_follows_every_write) {
    fixture_run r, s;
    open_run(&r, "cpu:2", "X", 0, config(MW_PRECISION_BF16, 0));
    for (int k = 0; k < 2; k++) step(&r, k);
    static float wte[WTE];
    read_wte(&r, wte);
    float before = eval(&r, 9);
    for (int i = 0; i < WTE; i++) wte[i] *= 0.5f; /* the head and the embedding both read it */
    cr_assert_eq(mw_trainer_write_param(r.tr, "wte", wte, WTE), MW_OK);
    float after = eval(&r, 9);
    cr_assert_neq(before, after, "the write did not reach the bf16 contractions");
    /* A fresh trainer given every parameter of r computes the same loss, to the bit. */
    open_run(&s, "cpu:2", "X", 0, config(MW_PRECISION_BF16, 0));
    for (int i = 0; i < mw_trainer_param_count(r.tr); i++) {
        mw_param_info info;
        cr_assert_eq(mw_trainer_param_info(r.tr, i, &info), MW_OK);
        float *v = malloc((size_t)info.count * sizeof *v);
        cr_assert_eq(mw_trainer_read_param(r.tr, info.name, v, info.count), MW_OK);
        cr_assert_eq(mw_trainer_write_param(s.tr, info.name, v, info.count), MW_OK);
        free(v);
    }
    cr_assert_eq(eval(&s, 9), after);
    /* A checkpoint restores it too: both resume alike, bit for bit. */
    char path[] = "/tmp/meshwit-bf16-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert_eq(mw_trainer_save(r.tr, path, NULL, 0), MW_OK, "%s", mw_last_error());
    float lr2 = step(&r, 2), lr3 = step(&r, 3);
    fixture_close(&s);
    open_run(&s, "cpu:2", "X", 0, config(MW_PRECISION_BF16, 0));
    cr_assert_eq(mw_trainer_load(s.tr, path, NULL, 0, NULL), MW_OK, "%s", mw_last_error());
    cr_assert_eq(step(&s, 2), lr2);
    cr_assert_eq(step(&s, 3), lr3);
    unlink(path);
    fixture_close(&s);
    fixture_close(&r);
}

Test(bf16_training, an_inference_program_sees_the_trainers_updates) {
    fixture_run r;
    open_run(&r, "cpu:1", "X", 0, config(MW_PRECISION_BF16, 0));
    mw_infer *inf;
    mw_infer_config ic = {.outputs = &r.m.logits, .noutputs = 1, .precision = MW_PRECISION_BF16};
    cr_assert_eq(mw_infer_from_trainer(r.tr, r.g, &ic, &inf), MW_OK, "%s", mw_last_error());
    int32_t tok[BATCH * SEQ], tgt[BATCH * SEQ];
    tokens(5, tok, tgt);
    int64_t n = (int64_t)BATCH * SEQ * CFG.padded_vocab;
    float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4), *c = malloc((size_t)n * 4);
    mw_feed f = {"tokens", tok, BATCH * SEQ};
    mw_fetch fa = {r.m.logits, a, n}, fb = {r.m.logits, b, n}, fc = {r.m.logits, c, n};
    cr_assert_eq(mw_infer_run(inf, &f, 1, BATCH, &fa, 1), MW_OK, "%s", mw_last_error());
    step(&r, 0);
    cr_assert_eq(mw_infer_run(inf, &f, 1, BATCH, &fb, 1), MW_OK, "%s", mw_last_error());
    cr_assert_neq(memcmp(a, b, (size_t)n * 4), 0, "the program still reads the old bf16 copy");
    cr_assert_eq(mw_infer_run(inf, &f, 1, BATCH, &fc, 1), MW_OK, "%s", mw_last_error());
    cr_assert_eq(memcmp(b, c, (size_t)n * 4), 0, "two runs of one program differ");
    mw_infer_free(inf);
    free(a), free(b), free(c);
    fixture_close(&r);
}

Test(bf16_training, memory_and_kernels) {
    fixture_run a, b;
    open_run(&a, "cpu:1", "X", 0, config(MW_PRECISION_FP32, 0));
    open_run(&b, "cpu:1", "X", 0, config(MW_PRECISION_BF16, 0));
    mw_device_memory ma, mb;
    cr_assert_eq(mw_trainer_memory(a.tr, 0, &ma), MW_OK);
    cr_assert_eq(mw_trainer_memory(b.tr, 0, &mb), MW_OK);
    int64_t params = gpt2_num_params(&CFG);
    /* The bf16 copy of the parameters: 2 bytes each. */
    cr_assert_eq(mb.parameters, ma.parameters + 2 * params);
    cr_assert_eq(mb.gradients, ma.gradients);
    cr_assert_eq(mb.optimizer, ma.optimizer);
    /* Activations a bf16 contraction reads are kept in bf16. */
    cr_assert_lt(mb.activations, ma.activations, "bf16 %lld, f32 %lld bytes",
                 (long long)mb.activations, (long long)ma.activations);
    char k[512];
    cr_assert_eq(mw_trainer_kernels(b.tr, k, sizeof k), MW_OK);
    cr_assert(strstr(k, "gemm bf16: ") && strstr(k, "attention bf16: "), "%s", k);
    cr_assert_eq(mw_trainer_kernels(a.tr, k, sizeof k), MW_OK);
    cr_assert(strstr(k, "gemm f32: ") && !strstr(k, "bf16"), "%s", k);
    fixture_close(&a);
    fixture_close(&b);
}

Test(bf16_training, a_nonfinite_step_is_skipped) {
    mw_trainer_config cfg = config(MW_PRECISION_BF16, 0);
    cfg.nonfinite = MW_NONFINITE_SKIP;
    fixture_run r;
    open_run(&r, "cpu:2", "X", 0, cfg);
    step(&r, 0);
    static float wte[WTE], after[WTE];
    read_wte(&r, wte);
    float saved = wte[3];
    wte[3] = INFINITY; /* overflows every logit that reads it */
    cr_assert_eq(mw_trainer_write_param(r.tr, "wte", wte, WTE), MW_OK);
    step(&r, 1);
    cr_assert_eq(mw_trainer_skipped_steps(r.tr), 1);
    read_wte(&r, after);
    cr_assert_eq(memcmp(wte, after, sizeof wte), 0, "a skipped step changed the parameters");
    wte[3] = saved;
    cr_assert_eq(mw_trainer_write_param(r.tr, "wte", wte, WTE), MW_OK);
    cr_assert(isfinite(step(&r, 2)));
    cr_assert_eq(mw_trainer_skipped_steps(r.tr), 1);
    fixture_close(&r);
}

/* --- against PyTorch's autocast ------------------------------------------------------------- */

#include "gpt2_data.h"

#define REF_STEPS 60

typedef struct autocast_ref {
    int batch, seq, steps;
    double lr, beta1, beta2, eps, wd, clip;
    double fp32[REF_STEPS], bf16[REF_STEPS];
} autocast_ref;

/* tests/data/gpt2_autocast_ref.txt, beside this file's folder. */
static void read_autocast_ref(autocast_ref *r) {
    char path[1024];
    const char *file = __FILE__, *slash = strrchr(file, '/');
    snprintf(path, sizeof path, "%.*s/../data/gpt2_autocast_ref.txt",
             slash ? (int)(slash - file) : 0, slash ? file : ".");
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot open %s", path);
    char line[1024];
    cr_assert(fgets(line, sizeof line, f) && line[0] == '#', "%s: no header", path);
    cr_assert(fgets(line, sizeof line, f));
    cr_assert_eq(sscanf(line,
                        "batch %d seq %d steps %d lr %lf beta1 %lf beta2 %lf eps %lf weight_decay "
                        "%lf grad_clip %lf",
                        &r->batch, &r->seq, &r->steps, &r->lr, &r->beta1, &r->beta2, &r->eps,
                        &r->wd, &r->clip),
                 9, "%s: %s", path, line);
    cr_assert_eq(r->steps, REF_STEPS);
    for (int k = 0; k < r->steps; k++) {
        int step;
        cr_assert(fgets(line, sizeof line, f), "%s: truncated at step %d", path, k + 1);
        cr_assert_eq(sscanf(line, "%d %lf %lf", &step, &r->fp32[k], &r->bf16[k]), 3);
        cr_assert_eq(step, k + 1);
    }
    fclose(f);
}

/* The gpt2 example's run of the reference (--layers 2 --heads 2 --channels 32 --context 32,
 * seed 1, --sequential on the arithmetic corpus, a constant lr): the loss of every step. */
static void reference_run(const autocast_ref *r, mw_precision p, float *losses) {
    gpt2_config c = {
        .layers = 2, .heads = 2, .channels = 32, .max_seq = 32, .vocab = 256, .padded_vocab = 256};
    gpt2_tokens all, train, val;
    gpt2_batch batch;
    cr_assert_eq(gpt2_corpus_generate(GPT2_CORPUS_SEED, GPT2_CORPUS_BYTES, &all), MW_OK);
    gpt2_tokens_split(&all, 0.1, &train, &val);
    cr_assert_eq(gpt2_batch_new(r->batch, r->seq, &batch), MW_OK);
    mw_graph *g;
    gpt2_graph m;
    mw_mesh *mesh;
    mw_trainer *tr;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_graph_set_seed(g, 1);
    cr_assert_eq(
        gpt2_build(g, &c, &(gpt2_layout){.batch = r->batch, .seq = r->seq, .data_axis = "X"}, &m),
        MW_OK);
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &mesh), MW_OK);
    mw_trainer_config cfg = {.optimizer = {.kind = MW_ADAMW,
                                           .lr = (float)r->lr,
                                           .beta1 = (float)r->beta1,
                                           .beta2 = (float)r->beta2,
                                           .eps = (float)r->eps,
                                           .weight_decay = (float)r->wd,
                                           .grad_clip = (float)r->clip},
                             .precision = p};
    cr_assert_eq(mw_trainer_new(g, m.loss, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());
    mw_feed feeds[2];
    gpt2_batch_feeds(&batch, feeds);
    for (int k = 0; k < r->steps; k++) {
        gpt2_batch_sequential(&batch, &train, k);
        cr_assert_eq(mw_trainer_step(tr, feeds, 2, &losses[k]), MW_OK, "%s", mw_last_error());
    }
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    gpt2_batch_free(&batch);
    gpt2_tokens_free(&all);
}

Test(bf16_training, learns_as_pytorch_autocast_does) {
    autocast_ref r;
    read_autocast_ref(&r);
    float f32[REF_STEPS], b16[REF_STEPS];
    reference_run(&r, MW_PRECISION_FP32, f32);
    reference_run(&r, MW_PRECISION_BF16, b16);
    /* f32 against f32: the same sums in other orders, 1e-4 relative after 60 steps. */
    for (int k = 0; k < r.steps; k++)
        cr_assert(fabs(f32[k] - r.fp32[k]) <= 1e-4 * r.fp32[k], "step %d: f32 %.6f, PyTorch %.6f",
                  k + 1, f32[k], r.fp32[k]);
    /* bf16 against PyTorch's autocast: both stray from the f32 trajectory by their roundings
     * (autocast also rounds every product's result to bf16; meshwit keeps them f32). meshwit's
     * bf16 stays at least as close to f32 as autocast does, up to a third more on a single
     * step, no further on average, and it learns as well: its mean loss over the second half is
     * no worse than autocast's, to within autocast's own mean distance from f32 there (the
     * noise of either rounding). */
    double worst_pt = 0, worst_mw = 0, mean_pt = 0, mean_mw = 0, late_pt = 0, late_mw = 0;
    double late_dev = 0;
    for (int k = 0; k < r.steps; k++) {
        double dpt = fabs(r.bf16[k] - r.fp32[k]), dmw = fabs(b16[k] - r.fp32[k]);
        worst_pt = fmax(worst_pt, dpt), worst_mw = fmax(worst_mw, dmw);
        mean_pt += dpt / r.steps, mean_mw += dmw / r.steps;
        if (k >= r.steps / 2) late_pt += r.bf16[k], late_mw += b16[k], late_dev += dpt;
    }
    cr_assert_gt(worst_mw, 0.0, "the bf16 run is the f32 one");
    cr_assert(worst_mw <= 1.34 * worst_pt,
              "largest step difference from f32: meshwit %.6f, "
              "autocast %.6f",
              worst_mw, worst_pt);
    cr_assert(mean_mw <= mean_pt, "mean difference from f32: meshwit %.6f, autocast %.6f", mean_mw,
              mean_pt);
    cr_assert(late_mw <= late_pt + late_dev,
              "mean loss of the second half: meshwit %.6f, autocast %.6f (+- %.6f)",
              late_mw / (r.steps / 2), late_pt / (r.steps / 2), late_dev / (r.steps / 2));
}
