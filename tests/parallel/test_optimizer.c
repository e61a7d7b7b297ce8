/* The optimizers and the learning-rate schedule against independent values.
 *
 * Closed forms: the model is linear in its parameters, L = sum(W * GW) + sum(b * GB) + s * GS
 * with W [Out=2, In=3] (a matrix), b [Out=2] (a vector) and s (a scalar), where GW, GB and GS are
 * fed inputs, so dL/dp is exactly the fed value and every update can be written down by hand:
 * SGD p - lr g, clipping's scale clip / |g|, AdamW's bias-corrected moments of a constant gradient
 * (m_t / (1 - b1^t) = g and v_t / (1 - b2^t) = g^2, so the step is g / (|g| + eps)), decoupled
 * weight decay on W only, and the schedule's values at hand-picked steps. The expected values are
 * computed here in double from those formulas, never by the library.
 *
 * PyTorch: a small two-layer model trained for several steps by torch.optim.AdamW with
 * clip_grad_norm_ and a warm-up/cosine LambdaLR, in float64 (tests/data/optimizer_ref.txt, made by
 * tools/optimizer_reference.py); the losses, gradient norms and parameters after every step must
 * match, on one device and with the batch sharded over two. */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2_model.h"
#include "meshwit.h"
#include "parallel/trainer_impl.h"
#include "tests/reference_text.h"

#define PI 3.14159265358979323846
#define NW 6 /* W: Out=2 x In=3 */
#define NB 2 /* b: Out=2 */
#define NP (NW + NB + 1)

/* Starting parameters: W, then b, then s. */
static const float P0[NP] = {0.5f, -1.25f, 2.0f, 0.75f, -0.5f, 1.5f, 0.25f, -2.0f, 1.0f};

typedef struct linear {
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
} linear;

static void linear_open(linear *m, const mw_optimizer *o) {
    memset(m, 0, sizeof *m);
    cr_assert_eq(mw_graph_new(&m->g), MW_OK, "%s", mw_last_error());
    mw_graph *g = m->g;
    mw_axes wa = MW_AXES({"Out", 2}, {"In", 3}), ba = MW_AXES({"Out", 2});
    mw_tensor *w = mw_param(g, "W", wa, MW_INIT_ZEROS);
    mw_tensor *b = mw_param(g, "b", ba, MW_INIT_ZEROS);
    mw_tensor *s = mw_param(g, "s", MW_SCALAR, MW_INIT_ZEROS);
    mw_tensor *gw = mw_input(g, "GW", MW_F32, wa);
    mw_tensor *gb = mw_input(g, "GB", MW_F32, ba);
    mw_tensor *gs = mw_input(g, "GS", MW_F32, MW_SCALAR);
    mw_tensor *loss =
        mw_add(g, mw_add(g, mw_sum(g, mw_mul(g, w, gw), NULL), mw_sum(g, mw_mul(g, b, gb), NULL)),
               mw_mul(g, s, gs));
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &m->mesh), MW_OK, "%s", mw_last_error());
    mw_trainer_config cfg = {.optimizer = *o};
    cr_assert_eq(mw_trainer_new(g, loss, m->mesh, &cfg, &m->tr), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_write_param(m->tr, "W", P0, NW), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_write_param(m->tr, "b", P0 + NW, NB), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_write_param(m->tr, "s", P0 + NW + NB, 1), MW_OK, "%s", mw_last_error());
}

static void linear_close(linear *m) {
    mw_trainer_free(m->tr);
    mw_mesh_free(m->mesh);
    mw_graph_free(m->g);
}

/* One step with gradient grad (W, b, s); returns the loss before the update. */
static float linear_step(linear *m, const float grad[NP]) {
    mw_feed feeds[3] = {{"GW", grad, NW}, {"GB", grad + NW, NB}, {"GS", grad + NW + NB, 1}};
    float loss = NAN;
    mw_status st = mw_trainer_step(m->tr, feeds, 3, &loss);
    cr_assert_eq(st, MW_OK, "step: %s: %s", mw_status_name(st), mw_last_error());
    return loss;
}

static void linear_read(linear *m, float p[NP]) {
    cr_assert_eq(mw_trainer_read_param(m->tr, "W", p, NW), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_param(m->tr, "b", p + NW, NB), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_param(m->tr, "s", p + NW + NB, 1), MW_OK, "%s", mw_last_error());
}

/* The updates run in float: each step rounds p, the lr product and (AdamW) the moments and the
 * square root, a few units of 2^-24 relative each, so after at most 12 steps the parameters
 * (of order one) are within ~100 float ulps of the double-precision closed form: 2e-6
 * absolute + relative. Every bug the cases target moves a parameter by at least lr * 1e-2. */
#define PTOL 2e-6

static void assert_params(const float got[NP], const double want[NP], const char *where) {
    static const char *names[NP] = {"W[0]", "W[1]", "W[2]", "W[3]", "W[4]",
                                    "W[5]", "b[0]", "b[1]", "s"};
    for (int i = 0; i < NP; i++)
        cr_assert_leq(fabs(got[i] - want[i]), PTOL * (1.0 + fabs(want[i])),
                      "%s: %s = %.9g, closed form %.9g", where, names[i], got[i], want[i]);
}

/* The schedule by its definition in trainer.h, in double: linear warm-up to lr over the first
 * warmup steps (step 0 already gets lr / warmup), then a half cosine from lr to
 * lr * min_lr_ratio by decay_steps, then that floor. */
static double schedule(const mw_optimizer *o, int64_t step) {
    if (step < o->warmup_steps) return o->lr * (double)(step + 1) / o->warmup_steps;
    if (o->decay_steps <= 0) return o->lr;
    double floor_lr = (double)o->lr * o->min_lr_ratio;
    if (step >= o->decay_steps) return floor_lr;
    double r = (double)(step - o->warmup_steps) / (double)(o->decay_steps - o->warmup_steps);
    return floor_lr + 0.5 * (1.0 + cos(PI * r)) * (o->lr - floor_lr);
}

static double norm(const float g[NP]) {
    double sq = 0;
    for (int i = 0; i < NP; i++) sq += (double)g[i] * g[i];
    return sqrt(sq);
}

/* --- the schedule ----------------------------------------------------------------------------- */

static float lr_at(const mw_optimizer *o, int64_t step) {
    linear m;
    linear_open(&m, o);
    float lr = mw_trainer_lr(m.tr, step);
    linear_close(&m);
    return lr;
}

/* lr 1, 4 warm-up steps, cosine to 0.1 by step 20: values worked out by hand. The cosine's
 * quarter points are 0.5 (1 + cos(pi/4)) = 0.853553390593 and 0.5 (1 - cos(pi/4)) =
 * 0.146446609407. The lr is a float computed from a double cosine: 2 ulps. */
Test(optimizer, schedule_values_by_hand) {
    mw_optimizer o = {
        .kind = MW_SGD, .lr = 1.0f, .warmup_steps = 4, .decay_steps = 20, .min_lr_ratio = 0.1f};
    static const struct {
        int64_t step;
        double lr;
    } want[] = {
        {0, 0.25},
        {1, 0.5},
        {2, 0.75},
        {3, 1.0},
        {4, 1.0}, /* the cosine starts at its peak */
        {8, 0.1 + 0.9 * 0.853553390593},
        {12, 0.55}, /* half-way: the mean of peak and floor */
        {16, 0.1 + 0.9 * 0.146446609407},
        {19, 0.1 + 0.9 * 0.5 * (1 + cos(PI * 15 / 16))},
        {20, 0.1},
        {21, 0.1},
        {1000, 0.1},
    };
    linear m;
    linear_open(&m, &o);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        float got = mw_trainer_lr(m.tr, want[i].step);
        cr_assert_leq(fabs(got - want[i].lr), 2 * FLT_EPSILON * want[i].lr,
                      "lr at step %lld: %.9g, expected %.9g", (long long)want[i].step, got,
                      want[i].lr);
    }
    linear_close(&m);
}

/* The other shapes of the schedule: none (constant), warm-up only, cosine only, and a GPT-2
 * sized peak, against the definition at every step through the floor. */
Test(optimizer, schedule_shapes) {
    cr_assert_float_eq(lr_at(&(mw_optimizer){.lr = 0.25f}, 0), 0.25f, 0);
    cr_assert_float_eq(lr_at(&(mw_optimizer){.lr = 0.25f}, 5000), 0.25f, 0);
    mw_optimizer shapes[] = {
        {.kind = MW_SGD, .lr = 0.5f, .warmup_steps = 10},
        {.kind = MW_SGD, .lr = 0.5f, .decay_steps = 10, .min_lr_ratio = 0.0f},
        {.kind = MW_ADAMW,
         .beta1 = 0.9f,
         .beta2 = 0.999f,
         .eps = 1e-8f,
         .lr = 6e-4f,
         .warmup_steps = 7,
         .decay_steps = 50,
         .min_lr_ratio = 0.1f},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        linear m;
        linear_open(&m, &shapes[k]);
        for (int64_t step = 0; step < 60; step++) {
            double want = schedule(&shapes[k], step);
            float got = mw_trainer_lr(m.tr, step);
            cr_assert_leq(fabs(got - want), 2 * FLT_EPSILON * shapes[k].lr,
                          "shape %zu, step %lld: %.9g, expected %.9g", k, (long long)step, got,
                          want);
        }
        linear_close(&m);
    }
    /* Warm-up only: step 0 gets a tenth of the peak, step 9 the peak. Cosine only: step 0
     * starts at the peak and step 5 is half-way down to 0. */
    cr_assert_float_eq(lr_at(&shapes[0], 0), 0.05f, 1e-8f);
    cr_assert_float_eq(lr_at(&shapes[0], 9), 0.5f, 1e-8f);
    cr_assert_float_eq(lr_at(&shapes[1], 0), 0.5f, 1e-8f);
    cr_assert_float_eq(lr_at(&shapes[1], 5), 0.25f, 1e-7f);
}

/* The update of step t uses the schedule's value at t: SGD with a constant gradient moves p by
 * exactly -lr_t g at step t, through the warm-up, the cosine and the floor. */
Test(optimizer, updates_follow_the_schedule) {
    mw_optimizer o = {
        .kind = MW_SGD, .lr = 0.5f, .warmup_steps = 3, .decay_steps = 8, .min_lr_ratio = 0.2f};
    static const float grad[NP] = {1, -2, 0.5f, 0, 3, -1, 2, -0.25f, 1.5f};
    linear m;
    linear_open(&m, &o);
    double want[NP];
    for (int i = 0; i < NP; i++) want[i] = P0[i];
    for (int step = 0; step < 10; step++) {
        linear_step(&m, grad);
        for (int i = 0; i < NP; i++) want[i] -= schedule(&o, step) * grad[i];
        float p[NP];
        linear_read(&m, p);
        char where[64];
        snprintf(where, sizeof where, "after step %d", step);
        assert_params(p, want, where);
    }
    linear_close(&m);
}

/* --- SGD -------------------------------------------------------------------------------------- */

Test(optimizer, sgd_without_clipping) {
    static const float grad[NP] = {0.5f, 1, -1.5f, 2, 0, -3, 4, 0.25f, -2};
    linear m;
    linear_open(&m, &(mw_optimizer){.kind = MW_SGD, .lr = 0.125f});
    float loss = linear_step(&m, grad);
    double want_loss = 0, want[NP];
    for (int i = 0; i < NP; i++) {
        want_loss += (double)P0[i] * grad[i];
        want[i] = P0[i] - 0.125 * grad[i];
    }
    cr_assert_float_eq(loss, want_loss, 1e-6, "loss %.9g, expected %.9g", loss, want_loss);
    float p[NP];
    linear_read(&m, p);
    assert_params(p, want, "SGD, one step");
    /* The norm is computed for the finiteness check (MW_NONFINITE_STOP) even without clipping. */
    cr_assert_float_eq(mw_trainer_grad_norm(m.tr), norm(grad), 1e-6, "norm %g, expected %g",
                       mw_trainer_grad_norm(m.tr), norm(grad));
    linear_close(&m);
}

/* |g| = 5 with clip 1: the step is lr g / 5; then |g| = 0.5, under the clip: lr g unscaled. */
Test(optimizer, sgd_with_clipping) {
    static const float big[NP] = {1, 2, -2, 0, 0, 0, 0, 4, 0};
    float small[NP];
    for (int i = 0; i < NP; i++) small[i] = 0.1f * big[i];
    cr_assert_float_eq(norm(big), 5.0, 1e-12);
    linear m;
    linear_open(&m, &(mw_optimizer){.kind = MW_SGD, .lr = 0.5f, .grad_clip = 1.0f});
    double want[NP];
    float p[NP];
    linear_step(&m, big);
    for (int i = 0; i < NP; i++) want[i] = P0[i] - 0.5 * big[i] / 5.0;
    linear_read(&m, p);
    assert_params(p, want, "clipped step");
    cr_assert_float_eq(mw_trainer_grad_norm(m.tr), 5.0f, 1e-6f, "norm before clipping: %.9g",
                       mw_trainer_grad_norm(m.tr));
    linear_step(&m, small);
    for (int i = 0; i < NP; i++) want[i] -= 0.5 * small[i];
    linear_read(&m, p);
    assert_params(p, want, "step under the clip");
    cr_assert_float_eq(mw_trainer_grad_norm(m.tr), 0.5f, 1e-7f);
    linear_close(&m);
}

/* --- AdamW ------------------------------------------------------------------------------------ */

/* AdamW with a constant gradient g, by hand: m_t = (1 - b1^t) g and v_t = (1 - b2^t) g^2, so the
 * bias-corrected step is g / (|g| + eps) at every t, and decoupled decay takes lr wd p (with the
 * p before the step) from matrices only: p_t = p_{t-1} (1 - lr_t wd [rank >= 2])
 * - lr_t g / (|g| + eps). `scale` is the clipping factor applied to g first. */
static void adamw_by_hand(const mw_optimizer *o, int64_t step, const float grad[NP], double scale,
                          double p[NP]) {
    double lr = schedule(o, step);
    for (int i = 0; i < NP; i++) {
        double g = scale * grad[i], wd = i < NW ? o->weight_decay : 0.0;
        p[i] = p[i] * (1 - lr * wd) - lr * g / (fabs(g) + o->eps);
    }
}

static void run_adamw(const mw_optimizer *o, const float grad[NP], int steps, double scale,
                      const char *what) {
    linear m;
    linear_open(&m, o);
    double want[NP];
    for (int i = 0; i < NP; i++) want[i] = P0[i];
    for (int step = 0; step < steps; step++) {
        linear_step(&m, grad);
        adamw_by_hand(o, step, grad, scale, want);
        float p[NP];
        linear_read(&m, p);
        char where[96];
        snprintf(where, sizeof where, "%s, after step %d", what, step);
        assert_params(p, want, where);
    }
    linear_close(&m);
}

/* Without bias correction the first step would be lr (1 - b1) g / sqrt((1 - b2) g^2), 0.45 lr
 * here instead of lr; it is the same at every step only with the correction. */
Test(optimizer, adamw_constant_gradient) {
    mw_optimizer o = {.kind = MW_ADAMW,
                      .lr = 0.01f,
                      .beta1 = 0.9f,
                      .beta2 = 0.95f,
                      .eps = 1e-8f,
                      .weight_decay = 0.1f};
    static const float grad[NP] = {0.5f, -1, 2, -0.125f, 3, 1, -0.75f, 0.25f, 4};
    run_adamw(&o, grad, 6, 1.0, "AdamW");
    /* The same through a warm-up and a cosine to a floor. */
    o.warmup_steps = 2;
    o.decay_steps = 6;
    o.min_lr_ratio = 0.1f;
    run_adamw(&o, grad, 8, 1.0, "AdamW with a schedule");
}

/* A zero gradient leaves only the decay: W shrinks by (1 - lr wd) per step, b and s (a vector
 * and a scalar: biases and gains) do not move at all. */
Test(optimizer, weight_decay_only_on_matrices) {
    mw_optimizer o = {.kind = MW_ADAMW,
                      .lr = 0.1f,
                      .beta1 = 0.9f,
                      .beta2 = 0.999f,
                      .eps = 1e-8f,
                      .weight_decay = 0.5f};
    static const float zero[NP] = {0};
    linear m;
    linear_open(&m, &o);
    for (int step = 1; step <= 3; step++) {
        linear_step(&m, zero);
        float p[NP];
        linear_read(&m, p);
        double want[NP];
        for (int i = 0; i < NP; i++) want[i] = i < NW ? P0[i] * pow(1 - 0.1 * 0.5, step) : P0[i];
        assert_params(p, want, "zero gradient");
        for (int i = NW; i < NP; i++)
            cr_assert_eq(p[i], P0[i], "parameter %d of rank < 2 was decayed: %.9g", i, p[i]);
    }
    linear_close(&m);
}

/* Adam's step g / (|g| + eps) hardly depends on g's scale, so clipping is visible only where eps
 * is not negligible: with eps = 0.1, |g| = 5 and clip 0.5, a clipped element 2 becomes 0.2 and
 * steps 0.2 / 0.3 = 0.67 lr, unclipped 2 / 2.1 = 0.95 lr. Both are checked. */
Test(optimizer, adamw_clipping_is_visible) {
    static const float grad[NP] = {1, 2, -2, 0, 0, 0, 0, 4, 0};
    mw_optimizer o = {.kind = MW_ADAMW,
                      .lr = 0.05f,
                      .beta1 = 0.8f,
                      .beta2 = 0.9f,
                      .eps = 0.1f,
                      .weight_decay = 0.1f};
    run_adamw(&o, grad, 4, 1.0, "AdamW, no clipping");
    o.grad_clip = 0.5f;
    run_adamw(&o, grad, 4, 0.5 / 5.0, "AdamW, clipped to 0.5");
    o.grad_clip = 10.0f; /* above |g|: no effect */
    run_adamw(&o, grad, 4, 1.0, "AdamW, clip above the norm");
}

/* --- PyTorch ---------------------------------------------------------------------------------- */

/* Reads the next record of tests/data/optimizer_ref.txt (its order: tools/optimizer_reference.py),
 * which must be called `name` and hold `count` values. */
static void ref_read(reffile *r, const char *name, int count, double *out) {
    char got[64];
    int n = -1;
    cr_assert_eq(fscanf(r->f, "%63s %d", got, &n), 2, "%s: truncated before %s", r->path, name);
    cr_assert_str_eq(got, name, "%s: record %s where %s was expected", r->path, got, name);
    cr_assert_eq(n, count, "%s: %s has %d values, expected %d", r->path, name, n, count);
    for (int i = 0; i < count; i++)
        cr_assert_eq(fscanf(r->f, "%lf", &out[i]), 1, "%s: %s truncated", r->path, name);
}

static int ref_int(reffile *r, const char *name) {
    double v;
    ref_read(r, name, 1, &v);
    return (int)v;
}

#define REF_MAX 64

static const char *const ref_params[] = {"W1", "b1", "gain", "W2", "b2"};
#define NREF_PARAMS 5

/* The float64 reference against our float32 run. The forward and backward passes are exact to
 * ~1e-7 absolute (float32 sums of a few dozen terms of order one); Adam's step m_hat /
 * (sqrt(v_hat) + eps) moves by that over sqrt(v_hat), which the generator keeps above 1e-3 for
 * every element, so by < 1e-4 of lr per step, plus the rounding of p (6e-8 relative per step):
 * after 12 steps of lr <= 0.05, < 1e-6. 1e-5 absolute + relative leaves a margin of ten, while
 * the bugs this catches (no bias correction, no or inverted clipping, decay on vectors, a
 * schedule off by a step) move parameters by 1e-3 or more. */
#define RTOL_REF 1e-5

static void run_against_pytorch(const char *devices, const char *shard_over) {
    reffile r;
    ref_open(&r, "optimizer_ref.txt");
    int steps = ref_int(&r, "steps"), batch = ref_int(&r, "batch"), in = ref_int(&r, "in"),
        hidden = ref_int(&r, "hidden"), out = ref_int(&r, "out");
    cr_assert(batch * in <= REF_MAX * 4 && in * hidden <= REF_MAX && hidden * out <= REF_MAX);
    double h[9];
    ref_read(&r, "hyper", 9, h);
    mw_optimizer o = {.kind = MW_ADAMW,
                      .lr = (float)h[0],
                      .beta1 = (float)h[1],
                      .beta2 = (float)h[2],
                      .eps = (float)h[3],
                      .weight_decay = (float)h[4],
                      .grad_clip = (float)h[5],
                      .warmup_steps = (int)h[6],
                      .decay_steps = (int)h[7],
                      .min_lr_ratio = (float)h[8]};

    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", batch}, {"In", in}));
    mw_tensor *y = mw_input(g, "y", MW_F32, MW_AXES({"Batch", batch}, {"Out", out}));
    if (shard_over) {
        x = mw_shard(g, x, "Batch", shard_over);
        y = mw_shard(g, y, "Batch", shard_over);
    }
    mw_tensor *w1 = mw_param(g, "W1", MW_AXES({"In", in}, {"Hidden", hidden}), MW_INIT_ZEROS);
    mw_tensor *b1 = mw_param(g, "b1", MW_AXES({"Hidden", hidden}), MW_INIT_ZEROS);
    mw_tensor *gain = mw_param(g, "gain", MW_AXES({"Hidden", hidden}), MW_INIT_ZEROS);
    mw_tensor *w2 = mw_param(g, "W2", MW_AXES({"Hidden", hidden}, {"Out", out}), MW_INIT_ZEROS);
    mw_tensor *b2 = mw_param(g, "b2", MW_AXES({"Out", out}), MW_INIT_ZEROS);
    mw_tensor *act = mw_mul(g, mw_gelu(g, mw_add(g, mw_dot(g, x, w1, "In"), b1)), gain);
    mw_tensor *err = mw_sub(g, mw_add(g, mw_dot(g, act, w2, "Hidden"), b2), y);
    mw_tensor *loss = mw_mean(g, mw_mul(g, err, err), NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    mw_mesh *mesh;
    cr_assert_eq(mw_mesh_new(devices, "X", &mesh), MW_OK, "%s", mw_last_error());
    mw_trainer *tr;
    mw_trainer_config cfg = {.optimizer = o};
    cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());

    mw_tensor *params[NREF_PARAMS] = {w1, b1, gain, w2, b2};
    double vals[REF_MAX];
    float buf[REF_MAX];
    for (int k = 0; k < NREF_PARAMS; k++) {
        int n = (int)mw_tensor_numel(params[k]);
        ref_read(&r, ref_params[k], n, vals);
        for (int i = 0; i < n; i++) buf[i] = (float)vals[i];
        cr_assert_eq(mw_trainer_write_param(tr, ref_params[k], buf, n), MW_OK, "%s",
                     mw_last_error());
    }
    double xs[REF_MAX * 4], ys[REF_MAX * 4];
    float xf[REF_MAX * 4], yf[REF_MAX * 4];
    for (int step = 0; step < steps; step++) {
        ref_read(&r, "x", batch * in, xs);
        ref_read(&r, "y", batch * out, ys);
        for (int i = 0; i < batch * in; i++) xf[i] = (float)xs[i];
        for (int i = 0; i < batch * out; i++) yf[i] = (float)ys[i];
        mw_feed feeds[2] = {{"x", xf, batch * in}, {"y", yf, batch * out}};
        float got_loss = NAN;
        mw_status st = mw_trainer_step(tr, feeds, 2, &got_loss);
        cr_assert_eq(st, MW_OK, "step %d: %s", step, mw_last_error());
        double want[3];
        ref_read(&r, "loss_norm_lr", 3, want);
        cr_assert_leq(fabs(got_loss - want[0]), RTOL_REF * fabs(want[0]),
                      "%s, step %d: loss %.9g, PyTorch %.9g", devices, step, got_loss, want[0]);
        float got_norm = mw_trainer_grad_norm(tr);
        cr_assert_leq(fabs(got_norm - want[1]), RTOL_REF * want[1],
                      "%s, step %d: gradient norm %.9g, PyTorch %.9g", devices, step, got_norm,
                      want[1]);
        cr_assert_leq(fabs(mw_trainer_lr(tr, step) - want[2]), 2 * FLT_EPSILON * o.lr,
                      "step %d: lr %.9g, LambdaLR %.9g", step, mw_trainer_lr(tr, step), want[2]);
        for (int k = 0; k < NREF_PARAMS; k++) {
            int n = (int)mw_tensor_numel(params[k]);
            ref_read(&r, ref_params[k], n, vals);
            cr_assert_eq(mw_trainer_read_param(tr, ref_params[k], buf, n), MW_OK);
            for (int i = 0; i < n; i++)
                cr_assert_leq(fabs(buf[i] - vals[i]), RTOL_REF * (1 + fabs(vals[i])),
                              "%s, after step %d: %s[%d] = %.9g, PyTorch %.9g", devices, step,
                              ref_params[k], i, buf[i], vals[i]);
        }
    }
    ref_close_at_end(&r);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

Test(optimizer, adamw_clipping_and_schedule_match_pytorch) { run_against_pytorch("cpu:1", NULL); }

Test(optimizer, adamw_sharded_matches_pytorch) { run_against_pytorch("cpu:2", "X"); }

/* The default decay rule: matrices and tables decay, biases do not, whatever their rank: a
 * multi-head bias [Part, Head, HeadDim] (renamed and added), a 1-D gain; a position table read
 * through a slice is a table, as in nanoGPT and llm.c. */
Test(optimizer, biases_of_any_rank_are_not_decayed) {
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", 4}, {"Embed", 3}));
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Part", 3}, {"Head", 2}, {"HeadDim", 2}, {"Embed", 3}),
                            MW_INIT_NORMAL(1));
    mw_tensor *b =
        mw_param(g, "b", MW_AXES({"Part", 3}, {"Head", 2}, {"Unit", 2}), MW_INIT_NORMAL(1));
    mw_tensor *pos = mw_param(g, "pos", MW_AXES({"Ctx", 8}, {"Embed", 3}), MW_INIT_NORMAL(1));
    mw_tensor *gain = mw_param(g, "gain", MW_AXES({"Hd", 2}), MW_INIT_CONST(1));
    /* A position table added whole (x + wpe): only ever added, so the default rule calls it a
     * bias; nanoGPT's rule (rank >= 2) decays it. */
    mw_tensor *added = mw_param(g, "added", MW_AXES({"Batch", 4}, {"Embed", 3}), MW_INIT_NORMAL(1));
    x = mw_add(g, x, added);
    mw_tensor *h =
        mw_add(g, mw_dot(g, mw_add(g, x, mw_slice(g, pos, "Ctx", 0, 4, "Batch")), w, "Embed"),
               mw_rename(g, b, "Unit", "HeadDim"));
    h = mw_mul(g, mw_rename(g, h, "HeadDim", "Hd"), gain);
    mw_tensor *loss = mw_sum(g, mw_mul(g, h, h), NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    mw_mesh *mesh;
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &mesh), MW_OK);
    const struct {
        const mw_tensor *p;
        int decays, rank2;
    } want[] = {{w, 1, 1}, {b, 0, 1}, {pos, 1, 1}, {gain, 0, 0}, {added, 0, 1}};
    for (int rule = 0; rule < 2; rule++) {
        mw_trainer_config cfg = {.optimizer = MW_ADAMW_INIT(1e-3f)};
        cfg.optimizer.weight_decay = 0.1f;
        cfg.optimizer.decay_rule = rule ? MW_DECAY_RANK2 : MW_DECAY_MATRICES;
        mw_trainer *tr;
        cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());
        for (int i = 0; i < 5; i++) {
            const mw_tensor *p = want[i].p;
            int expect = rule ? want[i].rank2 : want[i].decays;
            cr_assert_eq(tr->decays[p->leaf], expect, "rule %d, %s: decayed %d", rule, p->name,
                         tr->decays[p->leaf]);
            /* what mw_trainer_param_info reports, by the parameter's place */
            mw_param_info info;
            cr_assert_eq(mw_trainer_param_info(tr, p->leaf, &info), MW_OK);
            cr_assert_str_eq(info.name, p->name);
            cr_assert_eq(info.decayed, expect, "rule %d, %s: param_info says %d", rule, p->name,
                         info.decayed);
        }
        mw_trainer_free(tr);
    }
    mw_param_info info;
    cr_assert_eq(mw_graph_param_info(g, 0, &info), MW_OK);
    cr_assert_eq(info.decayed, -1, "a graph has no optimizer");
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

/* GPT-2's parameters under the default rule, data and tensor parallel: its multi-head bias qkvb
 * [Part, Head, HeadDim] (split over the model axis) is a bias; wte, wpe and the weights decay. */
Test(optimizer, gpt2_decays_its_matrices_only) {
    gpt2_config c = {
        .layers = 1, .heads = 2, .channels = 8, .max_seq = 8, .vocab = 16, .padded_vocab = 16};
    for (int tp = 0; tp < 2; tp++) {
        mw_graph *g;
        cr_assert_eq(mw_graph_new(&g), MW_OK);
        gpt2_graph m;
        cr_assert_eq(gpt2_build(g, &c,
                                &(gpt2_layout){.batch = 2,
                                               .seq = 4,
                                               .data_axis = tp ? NULL : "X",
                                               .model_axis = tp ? "X" : NULL},
                                &m),
                     MW_OK, "%s", mw_graph_error(g));
        mw_mesh *mesh;
        cr_assert_eq(mw_mesh_new("cpu:2", "X", &mesh), MW_OK);
        mw_trainer_config cfg = {.optimizer = {MW_ADAMW, .beta1 = 0.9f, .beta2 = 0.999f,
                                               .eps = 1e-8f, .lr = 1e-3f, .weight_decay = 0.1f}};
        mw_trainer *tr;
        cr_assert_eq(mw_trainer_new(g, m.loss, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());
        static const char *const decayed[] = {"wte",         "wpe",    "h0.qkvw",
                                              "h0.attprojw", "h0.fcw", "h0.fcprojw"};
        for (int i = 0; i < g->nnodes; i++) {
            const mw_tensor *p = g->nodes[i];
            if (p->op != MW__OP_PARAM) continue;
            int want = 0;
            for (size_t k = 0; k < sizeof decayed / sizeof *decayed; k++)
                want |= strcmp(p->name, decayed[k]) == 0;
            cr_assert_eq(tr->decays[p->leaf], want, "%s (tensor parallel %d): decayed %d", p->name,
                         tp, tr->decays[p->leaf]);
        }
        mw_trainer_free(tr);
        mw_mesh_free(mesh);
        mw_graph_free(g);
    }
}
