/* Fused attention (mw_attention) against an independent reference: attention and its gradient
 * written out in double precision in this file, on sequences long enough for several query
 * blocks (MW__ATTN_BLOCK is 64), causal and not, with the batch and head axes in either order;
 * and bitwise repeatability. The finite-difference check of the gradient on a small case is in
 * test_nn_grad.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "meshwit.h"
#include "tests/common/rng.h"

typedef struct dims {
    int b, t, h, d;
} dims;

/* Element (b, t, part, h, e) of qkv laid out [Batch, Seq, Part, Head, HeadDim]. */
static int64_t qi(dims s, int b, int t, int part, int h, int e) {
    return ((((int64_t)b * s.t + t) * 3 + part) * s.h + h) * s.d + e;
}

/* Element (b, t, h, e) of out laid out [Batch, Seq, Head, HeadDim]. */
static int64_t oi(dims s, int b, int t, int h, int e) {
    return (((int64_t)b * s.t + t) * s.h + h) * s.d + e;
}

/* out = attention(qkv); dqkv = d(sum(out * r)) / d qkv, all in double. */
static void reference(dims s, int causal, double scale, const float *qkv, const float *r,
                      double *out, double *dqkv) {
    double *p = malloc(sizeof(double) * (size_t)s.t), *dp = malloc(sizeof(double) * (size_t)s.t);
    memset(dqkv, 0, sizeof(double) * (size_t)s.b * s.t * 3 * s.h * s.d);
    for (int b = 0; b < s.b; b++)
        for (int h = 0; h < s.h; h++)
            for (int i = 0; i < s.t; i++) {
                int n = causal ? i + 1 : s.t;
                double mx = -INFINITY, sum = 0, dsum = 0;
                for (int j = 0; j < n; j++) {
                    double dot = 0;
                    for (int e = 0; e < s.d; e++)
                        dot += (double)qkv[qi(s, b, i, 0, h, e)] * qkv[qi(s, b, j, 1, h, e)];
                    p[j] = scale * dot;
                    mx = fmax(mx, p[j]);
                }
                for (int j = 0; j < n; j++) sum += p[j] = exp(p[j] - mx);
                for (int j = 0; j < n; j++) p[j] /= sum;
                for (int e = 0; e < s.d; e++) {
                    double o = 0;
                    for (int j = 0; j < n; j++) o += p[j] * qkv[qi(s, b, j, 2, h, e)];
                    out[oi(s, b, i, h, e)] = o;
                }
                /* dO = r; dP_j = dO . v_j; dS_j = P_j (dP_j - sum_k P_k dP_k) */
                for (int j = 0; j < n; j++) {
                    dp[j] = 0;
                    for (int e = 0; e < s.d; e++)
                        dp[j] += (double)r[oi(s, b, i, h, e)] * qkv[qi(s, b, j, 2, h, e)];
                    dsum += p[j] * dp[j];
                }
                for (int j = 0; j < n; j++) {
                    double ds = p[j] * (dp[j] - dsum) * scale;
                    for (int e = 0; e < s.d; e++) {
                        dqkv[qi(s, b, i, 0, h, e)] += ds * qkv[qi(s, b, j, 1, h, e)];
                        dqkv[qi(s, b, j, 1, h, e)] += ds * qkv[qi(s, b, i, 0, h, e)];
                        dqkv[qi(s, b, j, 2, h, e)] += p[j] * r[oi(s, b, i, h, e)];
                    }
                }
            }
    free(p);
    free(dp);
}

typedef struct run {
    float *out, *grad;
} run;

/* L = sum(attention(qkv) * r) on cpu:1 (or sharded over cpu:2 along Batch); the output in
 * [Batch, Seq, Head, HeadDim] order and the gradient of qkv. head_first traces qkv as
 * [Head, Batch, Seq, Part, HeadDim] instead (a permuted copy of the same values). */
static run run_meshwit(dims s, int causal, float scale, const float *qkv, const float *r,
                       int sharded, int head_first) {
    int64_t nq = (int64_t)s.b * s.t * 3 * s.h * s.d, no = nq / 3;
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    /* head_first: qkv traced as [Head, Batch, Seq, Part, HeadDim], fed a permuted copy. */
    float *fed = (float *)qkv;
    mw_tensor *x;
    if (head_first) {
        fed = malloc(sizeof(float) * (size_t)nq);
        for (int h = 0; h < s.h; h++)
            for (int b = 0; b < s.b; b++)
                for (int t = 0; t < s.t; t++)
                    for (int part = 0; part < 3; part++)
                        memcpy(fed + ((((int64_t)h * s.b + b) * s.t + t) * 3 + part) * s.d,
                               qkv + qi(s, b, t, part, h, 0), sizeof(float) * s.d);
        x = mw_input(
            g, "x", MW_F32,
            MW_AXES({"Head", s.h}, {"Batch", s.b}, {"Seq", s.t}, {"Part", 3}, {"HeadDim", s.d}));
    } else {
        x = mw_input(
            g, "x", MW_F32,
            MW_AXES({"Batch", s.b}, {"Seq", s.t}, {"Part", 3}, {"Head", s.h}, {"HeadDim", s.d}));
    }
    mw_tensor *rr = mw_input(
        g, "r", MW_F32, MW_AXES({"Batch", s.b}, {"Seq", s.t}, {"Head", s.h}, {"HeadDim", s.d}));
    if (sharded) {
        x = mw_shard(g, x, "Batch", "X");
        rr = mw_shard(g, rr, "Batch", "X");
    }
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Part", 3}, {"Head", s.h}, {"HeadDim", s.d}),
                            MW_INIT_CONST(1.0f));
    mw_tensor *in = mw_mul(g, x, w); /* qkv itself (w = 1), with a gradient to read: d w */
    mw_tensor *y = mw_attention(g, in, "Part", "Seq", "HeadDim", causal, scale);
    mw_tensor *loss = mw_sum(g, mw_mul(g, y, rr), NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    mw_tensor *outs[1] = {y};
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.0f}, .outputs = outs, .noutputs = 1};
    mw_mesh *mesh;
    mw_trainer *tr;
    cr_assert_eq(mw_mesh_new(sharded ? "cpu:2" : "cpu:1", "X", &mesh), MW_OK);
    cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());
    mw_feed feeds[2] = {{"x", fed, nq}, {"r", r, no}};
    float l;
    cr_assert_eq(mw_trainer_compute_grads(tr, feeds, 2, &l), MW_OK, "%s", mw_last_error());
    run res = {malloc(sizeof(float) * (size_t)no), malloc(sizeof(float) * (size_t)3 * s.h * s.d)};
    float *yo = malloc(sizeof(float) * (size_t)no);
    cr_assert_eq(mw_trainer_read_output(tr, y, yo, no), MW_OK, "%s", mw_last_error());
    if (head_first) /* [Head, Batch, Seq, HeadDim] -> [Batch, Seq, Head, HeadDim] */
        for (int h = 0; h < s.h; h++)
            for (int b = 0; b < s.b; b++)
                for (int t = 0; t < s.t; t++)
                    memcpy(res.out + oi(s, b, t, h, 0),
                           yo + (((int64_t)h * s.b + b) * s.t + t) * s.d, sizeof(float) * s.d);
    else
        memcpy(res.out, yo, sizeof(float) * (size_t)no);
    free(yo);
    if (fed != qkv) free(fed);
    cr_assert_eq(mw_trainer_read_grad(tr, "w", res.grad, 3 * s.h * s.d), MW_OK, "%s",
                 mw_last_error());
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    return res;
}

/* Compares with the double reference. d w[part, h, e] = sum over b, t of dqkv * qkv. Tolerance:
 * float rounding of sums over at most T terms of O(1) values, ~T * 2^-24 relative to the scale of
 * the terms, with a wide margin (1e-5 absolute + 1e-4 relative). */
static void check_case(dims s, int causal, int sharded, int head_first) {
    int64_t nq = (int64_t)s.b * s.t * 3 * s.h * s.d, no = nq / 3;
    float *qkv = malloc(sizeof(float) * (size_t)nq), *r = malloc(sizeof(float) * (size_t)no);
    rng_fill(qkv, nq, 11);
    rng_fill(r, no, 12);
    double *out = malloc(sizeof(double) * (size_t)no), *dq = malloc(sizeof(double) * (size_t)nq);
    float scale = 1.0f / sqrtf((float)s.d);
    reference(s, causal, scale, qkv, r, out, dq);
    run m = run_meshwit(s, causal, scale, qkv, r, sharded, head_first);
    for (int64_t i = 0; i < no; i++)
        cr_assert_leq(fabs(m.out[i] - out[i]), 1e-5 + 1e-4 * fabs(out[i]),
                      "out[%lld] = %.8g, reference %.8g", (long long)i, m.out[i], out[i]);
    int64_t per = 3 * s.h * s.d;
    for (int64_t k = 0; k < per; k++) {
        double want = 0, mag = 0;
        for (int64_t row = 0; row < (int64_t)s.b * s.t; row++) {
            want += dq[row * per + k] * qkv[row * per + k];
            mag += fabs(dq[row * per + k] * qkv[row * per + k]);
        }
        cr_assert_leq(fabs(m.grad[k] - want), 1e-5 + 1e-4 * mag, "d w[%lld] = %.8g, reference %.8g",
                      (long long)k, m.grad[k], want);
    }
    free(m.out);
    free(m.grad);
    free(qkv);
    free(r);
    free(out);
    free(dq);
}

TestSuite(attention, .description = "fused attention against a double-precision reference",
          .timeout = 120);

Test(attention, causal_several_blocks) { check_case((dims){2, 130, 2, 8}, 1, 0, 0); }

Test(attention, full_several_blocks) { check_case((dims){2, 130, 2, 8}, 0, 0, 0); }

Test(attention, one_short_block) { check_case((dims){3, 7, 3, 4}, 1, 0, 0); }

Test(attention, heads_before_batch) { check_case((dims){2, 70, 2, 8}, 1, 0, 1); }

Test(attention, sharded_batch) { check_case((dims){3, 70, 2, 8}, 1, 1, 0); }

/* GPT-2's head size (64: whole 8 x 8 blocks in the transposing pack), and head sizes that leave
 * part of a block (20, 36) with sequences that end inside a 16-key panel and an 8-wide vector. */
Test(attention, causal_head_size_64) { check_case((dims){1, 150, 2, 64}, 1, 0, 0); }

Test(attention, causal_odd_head_size) { check_case((dims){2, 77, 1, 20}, 1, 0, 0); }

Test(attention, full_odd_head_size) { check_case((dims){1, 45, 2, 36}, 0, 0, 0); }

Test(attention, repeatable_bit_for_bit) {
    dims s = {2, 100, 2, 16};
    int64_t nq = (int64_t)s.b * s.t * 3 * s.h * s.d, no = nq / 3;
    float *qkv = malloc(sizeof(float) * (size_t)nq), *r = malloc(sizeof(float) * (size_t)no);
    rng_fill(qkv, nq, 5);
    rng_fill(r, no, 6);
    run a = run_meshwit(s, 1, 0.25f, qkv, r, 0, 0), b = run_meshwit(s, 1, 0.25f, qkv, r, 0, 0);
    cr_assert_eq(memcmp(a.out, b.out, sizeof(float) * (size_t)no), 0);
    cr_assert_eq(memcmp(a.grad, b.grad, sizeof(float) * (size_t)3 * s.h * s.d), 0);
    free(a.out), free(a.grad), free(b.out), free(b.grad), free(qkv), free(r);
}

TestSuite(attention_errors, .description = "mw_attention's rules", .timeout = 30);

Test(attention_errors, one_axis_in_two_roles) {
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", 2}, {"Part", 3}, {"D", 4}));
    cr_expect_null(mw_attention(g, x, "Part", "D", "D", 1, 1.0f)); /* seq == feature */
    cr_expect_eq(mw_graph_status(g), MW_ERR_AXIS, "%s", mw_graph_error(g));
    cr_expect(strstr(mw_graph_error(g), "three different axes"), "%s", mw_graph_error(g));
    mw_graph_free(g);
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", 2}, {"Seq", 5}, {"Part", 3}));
    cr_expect_null(mw_attention(g, x, "Part", "Seq", "Part", 1, 1.0f)); /* part == feature */
    cr_expect_eq(mw_graph_status(g), MW_ERR_AXIS, "%s", mw_graph_error(g));
    mw_graph_free(g);
}

Test(attention_errors, bad_axes) {
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *x =
        mw_input(g, "x", MW_F32, MW_AXES({"Batch", 2}, {"Seq", 4}, {"Part", 2}, {"D", 4}));
    cr_assert_null(mw_attention(g, x, "Part", "Seq", "D", 1, 1.0f));
    cr_assert_eq(mw_graph_status(g), MW_ERR_SHAPE);
    cr_assert(strstr(mw_graph_error(g), "size 3"), "%s", mw_graph_error(g));
    mw_graph_free(g);

    cr_assert_eq(mw_graph_new(&g), MW_OK);
    x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", 2}, {"Seq", 4}, {"Part", 3}, {"D", 4}));
    cr_assert_null(mw_attention(g, x, "Part", "Time", "D", 1, 1.0f));
    cr_assert_eq(mw_graph_status(g), MW_ERR_AXIS);
    cr_assert(strstr(mw_graph_error(g), "Time"), "%s", mw_graph_error(g));
    mw_graph_free(g);

    cr_assert_eq(mw_graph_new(&g), MW_OK);
    x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", 2}, {"D", 4}, {"Part", 3}, {"Seq", 4}));
    cr_assert_null(mw_attention(g, x, "Part", "Seq", "D", 1, 1.0f));
    cr_assert_eq(mw_graph_status(g), MW_ERR_SHAPE);
    cr_assert(strstr(mw_graph_error(g), "last axis"), "%s", mw_graph_error(g));
    mw_graph_free(g);

    cr_assert_eq(mw_graph_new(&g), MW_OK);
    x = mw_shard(g,
                 mw_input(g, "x", MW_F32, MW_AXES({"Batch", 2}, {"Seq", 4}, {"Part", 3}, {"D", 4})),
                 "Seq", "X");
    cr_assert_null(mw_attention(g, x, "Part", "Seq", "D", 1, 1.0f));
    cr_assert_eq(mw_graph_status(g), MW_ERR_SHARDING);
    cr_assert(strstr(mw_graph_error(g), "Seq"), "%s", mw_graph_error(g));
    mw_graph_free(g);
}

/* --- rotary embeddings inside the attention kernels ----------------------------------------- */

enum { ROPE_ALONE, ROPE_AS_OUTPUT, ROPE_READ_TWICE, ROPE_OF_PARAM };

/* L = sum(attention(rope(x * w)) * r) (ROPE_OF_PARAM: rope(w), broadcast over x's axes being
 * absent: attention of the rotated parameter itself), in f32 or bf16; the rotated qkv requested
 * as an output (ROPE_AS_OUTPUT) or also summed into the loss (ROPE_READ_TWICE). The loss, the
 * attention's output, the rotated qkv where requested and d w, read back into one array. */
static float *rotary_run(int shape, mw_precision precision, int64_t *count) {
    const int B = 2, T = 70, H = 2, D = 8;
    const int64_t nq = (int64_t)B * T * 3 * H * D, no = nq / 3;
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *x =
        mw_input(g, "x", MW_F32,
                 MW_AXES({"Batch", B}, {"Seq", T}, {"Part", 3}, {"Head", H}, {"HeadDim", D}));
    mw_tensor *rr =
        mw_input(g, "r", MW_F32, MW_AXES({"Batch", B}, {"Seq", T}, {"Head", H}, {"HeadDim", D}));
    mw_tensor *w =
        shape == ROPE_OF_PARAM
            ? mw_param(g, "w",
                       MW_AXES({"Batch", B}, {"Seq", T}, {"Part", 3}, {"Head", H}, {"HeadDim", D}),
                       MW_INIT_NORMAL(1.0f))
            : mw_param(g, "w", MW_AXES({"Part", 3}, {"Head", H}, {"HeadDim", D}),
                       MW_INIT_NORMAL(1.0f));
    mw_rope_config c = {.theta = 100.0f, .part_axis = "Part", .parts = 2};
    mw_tensor *q =
        mw_rope(g, shape == ROPE_OF_PARAM ? w : mw_mul(g, x, w), "Seq", "HeadDim", NULL, &c);
    mw_tensor *y = mw_attention(g, q, "Part", "Seq", "HeadDim", 1, 0.3f);
    mw_tensor *loss = mw_sum(g, mw_mul(g, y, rr), NULL);
    if (shape == ROPE_READ_TWICE) loss = mw_add(g, loss, mw_sum(g, mw_mul(g, q, x), NULL));
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    mw_tensor *outs[2] = {y, q};
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.0f},
                             .outputs = outs,
                             .noutputs = shape == ROPE_AS_OUTPUT ? 2 : 1,
                             .precision = precision};
    mw_mesh *mesh;
    mw_trainer *tr;
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &mesh), MW_OK);
    cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());
    float *xv = malloc(sizeof(float) * (size_t)nq), *rv = malloc(sizeof(float) * (size_t)no);
    rng_fill(xv, nq, 21);
    rng_fill(rv, no, 22);
    mw_feed feeds[2] = {{"x", xv, nq}, {"r", rv, no}};
    int64_t nw = shape == ROPE_OF_PARAM ? nq : 3 * H * D;
    *count = 1 + no + nq + nw;
    float *res = calloc((size_t)*count, sizeof(float));
    cr_assert_eq(mw_trainer_compute_grads(tr, feeds, 2, &res[0]), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_output(tr, y, res + 1, no), MW_OK, "%s", mw_last_error());
    if (shape == ROPE_AS_OUTPUT)
        cr_assert_eq(mw_trainer_read_output(tr, q, res + 1 + no, nq), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_grad(tr, "w", res + 1 + no + nq, nw), MW_OK, "%s",
                 mw_last_error());
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    free(xv);
    free(rv);
    return res;
}

/* Where the rotation runs (inside the attention kernels, where the plan may fuse it, or as rope
 * passes, MESHWIT_ROPE=separate) changes no bit: not when the rotated values are an output the
 * host reads, nor when another op reads them too, nor when the rope's gradient is a parameter's
 * (the plan fuses none of those), nor when it fuses (ROPE_ALONE); in f32 and in bf16. */
Test(attention, rotary_where_fused_or_not_gives_the_same_bits) {
    for (int shape = ROPE_ALONE; shape <= ROPE_OF_PARAM; shape++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            mw_precision prec = bf16 ? MW_PRECISION_BF16 : MW_PRECISION_FP32;
            int64_t n, m;
            cr_assert_eq(setenv("MESHWIT_ROPE", "fused", 1), 0);
            float *fused = rotary_run(shape, prec, &n);
            cr_assert_eq(setenv("MESHWIT_ROPE", "separate", 1), 0);
            float *apart = rotary_run(shape, prec, &m);
            cr_assert_eq(unsetenv("MESHWIT_ROPE"), 0);
            cr_assert_eq(n, m);
            for (int64_t i = 0; i < n; i++)
                cr_assert_eq(memcmp(&fused[i], &apart[i], sizeof(float)), 0,
                             "shape %d, %s: value %lld is %.9g with the rotation in attention's "
                             "kernels, %.9g apart",
                             shape, bf16 ? "bf16" : "f32", (long long)i, fused[i], apart[i]);
            free(fused);
            free(apart);
        }
}

/* The rotation of x by each config in cfgs, all in one program (n > 1) or each in its own
 * (n == 1), read back one after another. */
static void rotations(const mw_rope_config *cfgs, int n, const float *x, int64_t count,
                      float *out) {
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *xi =
        mw_input(g, "x", MW_F32, MW_AXES({"Batch", 2}, {"Seq", 9}, {"Head", 2}, {"Feat", 8}));
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Feat", 8}), MW_INIT_CONST(1.0f));
    mw_tensor *ys[4], *loss = NULL;
    for (int i = 0; i < n; i++) {
        ys[i] = mw_rope(g, mw_mul(g, xi, w), "Seq", "Feat", NULL, &cfgs[i]);
        mw_tensor *s = mw_sum(g, ys[i], NULL);
        loss = loss ? mw_add(g, loss, s) : s;
    }
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.0f}, .outputs = ys, .noutputs = n};
    mw_mesh *mesh;
    mw_trainer *tr;
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &mesh), MW_OK);
    cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());
    mw_feed feeds[1] = {{"x", x, count}};
    float l;
    for (int step = 0; step < 2; step++) /* the second step reads the kept tables */
        cr_assert_eq(mw_trainer_compute_grads(tr, feeds, 1, &l), MW_OK, "%s", mw_last_error());
    for (int i = 0; i < n; i++)
        cr_assert_eq(mw_trainer_read_output(tr, ys[i], out + i * count, count), MW_OK, "%s",
                     mw_last_error());
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

/* A device keeps one table of angles per rotation (positions, frequencies, scaling): ropes of
 * other offsets, thetas, rotated features and scalings in one program each get their own. */
Test(attention, rotary_tables_of_one_device_stay_apart) {
    const mw_rope_config cfgs[4] = {{.theta = 10000.0f},
                                    {.theta = 10000.0f, .offset = 5},
                                    {.theta = 500.0f, .dims = 4},
                                    {.theta = 10000.0f,
                                     .scaling = MW_ROPE_SCALING_LLAMA3,
                                     .factor = 8,
                                     .low_freq_factor = 1,
                                     .high_freq_factor = 4,
                                     .original_max_positions = 4}};
    const int64_t count = 2 * 9 * 2 * 8;
    float x[2 * 9 * 2 * 8], together[4 * 2 * 9 * 2 * 8], alone[2 * 9 * 2 * 8];
    rng_fill(x, count, 31);
    rotations(cfgs, 4, x, count, together);
    for (int i = 0; i < 4; i++) {
        rotations(&cfgs[i], 1, x, count, alone);
        cr_assert_eq(memcmp(together + i * count, alone, sizeof alone), 0,
                     "rotation %d differs beside the others", i);
    }
}
