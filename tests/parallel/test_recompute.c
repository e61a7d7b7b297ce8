/* Activation recomputation (mw_region_begin, mw_trainer_config.recompute): GPT-2 trained with
 * every block recomputed, and with only the contractions kept, gives the same bits as keeping
 * every activation (losses and every parameter after several AdamW steps) on cpu:1 and cpu:2, in
 * f32 and bf16, and with tensor parallelism on a 2-D mesh; the backward pass recomputes exactly
 * what the policy says (counted by op), the recomputed GEMMs still absorb their bias and
 * residual adds, and activation memory shrinks; a graph without regions is unchanged by the
 * policy; the misuses of regions and of the option fail with messages that say what to do. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/graph_impl.h"
#include "gpt2_model.h"
#include "meshwit.h"
#include "parallel/program.h"
#include "parallel/trainer_impl.h"
#include "tests/common/gpt2_fixture.h"

#define BATCH 4
#define SEQ 16
#define STEPS 4
#define LAYERS 3

static const gpt2_config CFG = {
    .layers = LAYERS, .heads = 2, .channels = 32, .max_seq = 16, .vocab = 50, .padded_vocab = 64};

static mw_trainer_config config(mw_precision p, mw_recompute rc) {
    mw_trainer_config c = fixture_config(p);
    c.recompute = rc;
    return c;
}

/* GPT-2 (every block a region) on `devices`, the batch over X and, with `model`, the heads and
 * MLP units over Y; every run starts from the same parameters (the graph's seed). */
static void open_run(fixture_run *r, const char *devices, const char *axes, int model,
                     mw_trainer_config cfg) {
    fixture_open(r, &CFG, BATCH, SEQ, 5, devices, axes, model, cfg);
}

static float step(fixture_run *r, int k) {
    int32_t tok[BATCH * SEQ], tgt[BATCH * SEQ];
    fixture_tokens(CFG.vocab, BATCH * SEQ, 4099u, 257u, k, tok, tgt);
    mw_feed f[2] = {{"tokens", tok, BATCH * SEQ}, {"targets", tgt, BATCH * SEQ}};
    float loss = NAN;
    cr_assert_eq(mw_trainer_step(r->tr, f, 2, &loss), MW_OK, "step %d: %s", k, mw_last_error());
    return loss;
}

/* A run's losses and all its parameters, one after another. */
typedef struct outcome {
    float loss[STEPS];
    float *params;
    int64_t count;
    mw_device_memory mem;
} outcome;

static void trajectory(const char *devices, const char *axes, int model, mw_trainer_config cfg,
                       outcome *o) {
    fixture_run r;
    open_run(&r, devices, axes, model, cfg);
    cr_assert_eq(mw_trainer_memory(r.tr, 0, &o->mem), MW_OK, "%s", mw_last_error());
    for (int k = 0; k < STEPS; k++) o->loss[k] = step(&r, k);
    int n = mw_trainer_param_count(r.tr);
    o->count = 0;
    for (int i = 0; i < n; i++) {
        mw_param_info pi;
        cr_assert_eq(mw_trainer_param_info(r.tr, i, &pi), MW_OK);
        o->count += pi.count;
    }
    o->params = malloc((size_t)o->count * sizeof *o->params);
    cr_assert_not_null(o->params);
    for (int i = 0, at = 0; i < n; i++) {
        mw_param_info pi;
        cr_assert_eq(mw_trainer_param_info(r.tr, i, &pi), MW_OK);
        cr_assert_eq(mw_trainer_read_param(r.tr, pi.name, o->params + at, pi.count), MW_OK, "%s",
                     mw_last_error());
        at += (int)pi.count;
    }
    fixture_close(&r);
}

static void same_bits(const outcome *a, const outcome *b, const char *what) {
    for (int k = 0; k < STEPS; k++)
        cr_assert(memcmp(&a->loss[k], &b->loss[k], sizeof(float)) == 0, "%s: step %d loss %a vs %a",
                  what, k, (double)a->loss[k], (double)b->loss[k]);
    cr_assert_eq(a->count, b->count);
    for (int64_t i = 0; i < a->count; i++)
        cr_assert(memcmp(&a->params[i], &b->params[i], sizeof(float)) == 0,
                  "%s: parameter element %lld: %a vs %a", what, (long long)i, (double)a->params[i],
                  (double)b->params[i]);
}

/* Both policies against keeping everything on one mesh and precision; returns the activations
 * of the three runs (none, blocks, dots). */
static void policies_same_bits(const char *devices, const char *axes, int model, mw_precision p,
                               int64_t act[3]) {
    outcome o[3];
    const mw_recompute pol[3] = {MW_RECOMPUTE_NONE, MW_RECOMPUTE_BLOCKS, MW_RECOMPUTE_DOTS};
    for (int i = 0; i < 3; i++) trajectory(devices, axes, model, config(p, pol[i]), &o[i]);
    char what[128];
    snprintf(what, sizeof what, "%s %s, blocks recomputed", devices,
             p == MW_PRECISION_BF16 ? "bf16" : "f32");
    same_bits(&o[1], &o[0], what);
    snprintf(what, sizeof what, "%s %s, all but dots recomputed", devices,
             p == MW_PRECISION_BF16 ? "bf16" : "f32");
    same_bits(&o[2], &o[0], what);
    for (int i = 0; i < 3; i++) {
        act[i] = o[i].mem.activations;
        cr_assert_eq(o[i].mem.parameters, o[0].mem.parameters, "recomputation moved parameters");
        cr_assert_eq(o[i].mem.gradients, o[0].mem.gradients);
        free(o[i].params);
    }
}

/* Activations: recomputing blocks keeps their outputs and one block's worth at a time, so it
 * takes less than keeping only contractions, which takes less than keeping everything. */
static void smaller(const int64_t act[3], const char *what) {
    cr_assert_lt(act[1], act[2], "%s: blocks %lld bytes, dots %lld", what, (long long)act[1],
                 (long long)act[2]);
    cr_assert_lt(act[2], act[0], "%s: dots %lld bytes, none %lld", what, (long long)act[2],
                 (long long)act[0]);
    cr_assert_lt((double)act[1], 0.6 * (double)act[0], "%s: blocks %lld bytes, none %lld", what,
                 (long long)act[1], (long long)act[0]);
}

Test(recompute_training, same_bits_f32_cpu1, .timeout = 120) {
    int64_t act[3];
    policies_same_bits("cpu:1", "X", 0, MW_PRECISION_FP32, act);
    smaller(act, "cpu:1 f32");
}

Test(recompute_training, same_bits_f32_cpu2, .timeout = 120) {
    int64_t act[3];
    policies_same_bits("cpu:2", "X", 0, MW_PRECISION_FP32, act);
    smaller(act, "cpu:2 f32");
}

Test(recompute_training, same_bits_bf16, .timeout = 120) {
    int64_t act[3];
    policies_same_bits("cpu:1", "X", 0, MW_PRECISION_BF16, act);
    smaller(act, "cpu:1 bf16");
    policies_same_bits("cpu:2", "X", 0, MW_PRECISION_BF16, act);
    smaller(act, "cpu:2 bf16");
}

Test(recompute_training, same_bits_tensor_parallel_2d_mesh, .timeout = 120) {
    int64_t act[3];
    policies_same_bits("cpu:4", "X=2,Y=2", 1, MW_PRECISION_FP32, act);
    smaller(act, "cpu:4 X=2,Y=2 heads over Y");
}

/* --- what is recomputed ------------------------------------------------------------------------
 */

static int count_op(const mw_graph *g, mw__op op, int from) {
    int n = 0;
    for (int i = from; i < g->nnodes; i++) n += g->nodes[i]->op == op;
    return n;
}

/* Kernels of an op per step, from the profile. */
static int64_t kernels(fixture_run *r, const char *op) {
    mw_profile_row rows[256];
    int n = 0;
    cr_assert_eq(mw_trainer_profile(r->tr, rows, 256, &n), MW_OK, "%s", mw_last_error());
    cr_assert_leq(n, 256);
    int64_t calls = 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(rows[i].op, op)) calls += rows[i].calls;
    return calls;
}

Test(recompute_training, recomputes_what_the_policy_says, .timeout = 60) {
    /* Per block: 2 layer norms, 1 attention, 4 contractions, 1 GELU. Recomputing a block runs
     * its layer norms, attention and GELU again in backward (its contractions too, but those
     * also appear in backward as gradients, so they are not counted here); keeping the dots
     * recomputes the layer norms and the GELU only. */
    int fwd_ln = 2 * LAYERS + 1, att = LAYERS, gelu = LAYERS;
    const struct {
        mw_recompute policy;
        int ln, att, gelu;
    } want[3] = {{MW_RECOMPUTE_NONE, 0, 0, 0},
                 {MW_RECOMPUTE_BLOCKS, 2 * LAYERS, LAYERS, LAYERS},
                 {MW_RECOMPUTE_DOTS, 2 * LAYERS, 0, LAYERS}};
    int64_t adds[3];
    for (int p = 0; p < 3; p++) {
        fixture_run r;
        mw_trainer_config cfg = config(MW_PRECISION_FP32, want[p].policy);
        cfg.profile = 1;
        open_run(&r, "cpu:1", "X", 0, cfg);
        const mw_graph *g = r.tr->prog->g;
        cr_assert_eq(count_op(g, MW__OP_LAYERNORM, 0), fwd_ln + want[p].ln, "policy %d",
                     (int)want[p].policy);
        cr_assert_eq(count_op(g, MW__OP_ATTENTION, 0), att + want[p].att, "policy %d",
                     (int)want[p].policy);
        cr_assert_eq(count_op(g, MW__OP_GELU, 0), gelu + want[p].gelu, "policy %d",
                     (int)want[p].policy);
        /* The recomputed nodes come after the loss (in backward). */
        int loss = r.tr->loss->id;
        cr_assert_eq(count_op(g, MW__OP_LAYERNORM, loss), want[p].ln);
        step(&r, 0);
        /* A GEMM of a block writes its bias and residual adds itself, recomputed or not: no
         * more add kernels than without recomputation. */
        adds[p] = kernels(&r, "add");
        cr_assert_eq(kernels(&r, "layernorm"), fwd_ln + want[p].ln);
        fixture_close(&r);
    }
    cr_assert_eq(adds[1], adds[0], "recomputed blocks ran %lld add kernels, kept ones %lld",
                 (long long)adds[1], (long long)adds[0]);
    cr_assert_eq(adds[2], adds[0], "dots kept: %lld add kernels, everything kept %lld",
                 (long long)adds[2], (long long)adds[0]);
}

Test(recompute_training, bf16_casts_of_kept_values_are_kept, .timeout = 60) {
    /* In bf16 a block casts 5 values for its contractions and attention: the layer norms'
     * outputs, qkv, the attention's output and the GELU's. Recomputing the block casts all 5
     * again; keeping the dots keeps qkv's and the attention output's casts (so their kernels
     * still write them in bf16 alone) and casts the other 3 again. */
    const int per_block[3] = {0, 5, 3};
    int casts[3];
    for (int p = 0; p < 3; p++) {
        fixture_run r;
        open_run(&r, "cpu:1", "X", 0, config(MW_PRECISION_BF16, (mw_recompute)p));
        casts[p] = count_op(r.tr->prog->g, MW__OP_CAST, r.tr->loss->id);
        if (p) step(&r, 0);
        fixture_close(&r);
    }
    for (int p = 1; p < 3; p++)
        cr_assert_eq(casts[p] - casts[0], per_block[p] * LAYERS,
                     "policy %d: %d casts in backward, %d without recomputation", p, casts[p],
                     casts[0]);
}

/* A two-layer MLP traced without regions. */
static void mlp_trainer(mw_recompute policy, fixture_run *r) {
    memset(r, 0, sizeof *r);
    cr_assert_eq(mw_graph_new(&r->g), MW_OK);
    mw_graph *g = r->g;
    mw_tensor *x =
        mw_shard(g, mw_input(g, "x", MW_F32, MW_AXES({"Batch", 8}, {"In", 5})), "Batch", "X");
    mw_tensor *w1 = mw_param(g, "W1", MW_AXES({"In", 5}, {"Hidden", 7}), MW_INIT_NORMAL(0.5f));
    mw_tensor *w2 = mw_param(g, "W2", MW_AXES({"Hidden", 7}), MW_INIT_NORMAL(0.5f));
    mw_tensor *h = mw_gelu(g, mw_dot(g, x, w1, "In"));
    mw_tensor *y = mw_dot(g, h, w2, "Hidden");
    mw_tensor *loss = mw_mean(g, mw_mul(g, y, y), NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    cr_assert_eq(mw_mesh_new("cpu:2", "X", &r->mesh), MW_OK, "%s", mw_last_error());
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.1f}, .recompute = policy};
    cr_assert_eq(mw_trainer_new(g, loss, r->mesh, &cfg, &r->tr), MW_OK, "%s", mw_last_error());
}

Test(recompute_training, a_graph_without_regions_is_unchanged) {
    fixture_run a, b, c;
    mlp_trainer(MW_RECOMPUTE_NONE, &a);
    mlp_trainer(MW_RECOMPUTE_BLOCKS, &b);
    mlp_trainer(MW_RECOMPUTE_DOTS, &c);
    const mw_graph *ga = a.tr->prog->g, *gb = b.tr->prog->g, *gc = c.tr->prog->g;
    cr_assert_eq(gb->nnodes, ga->nnodes);
    cr_assert_eq(gc->nnodes, ga->nnodes);
    for (int i = 0; i < ga->nnodes; i++) {
        cr_assert_eq(gb->nodes[i]->op, ga->nodes[i]->op, "node %d", i);
        cr_assert_eq(gc->nodes[i]->op, ga->nodes[i]->op, "node %d", i);
        for (int k = 0; k < ga->nodes[i]->nin; k++)
            cr_assert_eq(gb->nodes[i]->in[k]->id, ga->nodes[i]->in[k]->id, "node %d", i);
    }
    mw_device_memory ma, mb;
    cr_assert_eq(mw_trainer_memory(a.tr, 0, &ma), MW_OK);
    cr_assert_eq(mw_trainer_memory(b.tr, 0, &mb), MW_OK);
    cr_assert_eq(mb.activations, ma.activations);
    fixture_close(&a);
    fixture_close(&b);
    fixture_close(&c);
}

/* A region whose recomputed values include a dropout's output (read by the backward of the mul
 * after it): the recomputed mask is the forward's, step after step. */
static void dropout_run(mw_recompute policy, float *losses, float *w1) {
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_graph_set_seed(g, 3);
    mw_tensor *x =
        mw_shard(g, mw_input(g, "x", MW_F32, MW_AXES({"Batch", 8}, {"In", 5})), "Batch", "X");
    mw_tensor *w = mw_param(g, "W1", MW_AXES({"In", 5}, {"Hidden", 16}), MW_INIT_NORMAL(0.5f));
    mw_tensor *gain = mw_param(g, "gain", MW_AXES({"Hidden", 16}), MW_INIT_CONST(1.0f));
    mw_tensor *w2 = mw_param(g, "W2", MW_AXES({"Hidden", 16}), MW_INIT_NORMAL(0.5f));
    cr_assert_eq(mw_region_begin(g, "block"), MW_OK);
    mw_tensor *h = mw_mul(g, mw_dropout(g, mw_gelu(g, mw_dot(g, x, w, "In")), 0.3f, 99), gain);
    h = mw_mul(g, h, h);
    cr_assert_eq(mw_region_end(g), MW_OK);
    mw_tensor *y = mw_dot(g, h, w2, "Hidden");
    mw_tensor *loss = mw_mean(g, mw_mul(g, y, y), NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    cr_assert_eq(mw_mesh_new("cpu:2", "X", &mesh), MW_OK, "%s", mw_last_error());
    mw_trainer_config cfg = {
        .optimizer = {.kind = MW_ADAMW, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .lr = 1e-2f},
        .recompute = policy};
    cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());
    /* Recomputed: the region's dropout runs twice a step (forward, and again in backward). */
    int drops = 0;
    for (int i = 0; i < tr->prog->g->nnodes; i++)
        drops += tr->prog->g->nodes[i]->op == MW__OP_DROPOUT;
    cr_assert_eq(drops, 2 + (policy != MW_RECOMPUTE_NONE), "policy %d: %d dropout nodes",
                 (int)policy, drops);
    for (int k = 0; k < STEPS; k++) {
        float xs[40];
        for (int i = 0; i < 40; i++) xs[i] = (float)((i * 7 + k * 3) % 11) / 5.0f - 1.0f;
        mw_feed f = {"x", xs, 40};
        cr_assert_eq(mw_trainer_step(tr, &f, 1, &losses[k]), MW_OK, "%s", mw_last_error());
    }
    cr_assert_eq(mw_trainer_read_param(tr, "W1", w1, 80), MW_OK, "%s", mw_last_error());
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

Test(recompute_training, dropout_masks_recomputed_alike) {
    float l[3][STEPS], w[3][80];
    dropout_run(MW_RECOMPUTE_NONE, l[0], w[0]);
    dropout_run(MW_RECOMPUTE_BLOCKS, l[1], w[1]);
    dropout_run(MW_RECOMPUTE_DOTS, l[2], w[2]);
    for (int p = 1; p < 3; p++) {
        cr_assert_eq(memcmp(l[p], l[0], sizeof l[0]), 0, "policy %d: the losses differ", p);
        cr_assert_eq(memcmp(w[p], w[0], sizeof w[0]), 0, "policy %d: W1 differs", p);
    }
    cr_assert_neq(l[0][0], l[0][1], "the steps train");
}

/* --- misuse ---------------------------------------------------------------------------------- */

Test(recompute_regions, misuse_is_a_sticky_error_with_a_clear_message) {
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    cr_assert_eq(mw_region_end(g), MW_ERR_INVALID);
    cr_assert(strstr(mw_graph_error(g), "mw_region_end: no region is open") &&
                  strstr(mw_graph_error(g), "mw_region_begin"),
              "%s", mw_graph_error(g));
    cr_assert_eq(mw_graph_status(g), MW_ERR_INVALID, "the error is the graph's");
    cr_assert_null(mw_input(g, "x", MW_F32, MW_AXES({"Batch", 2})), "and sticky");
    mw_graph_free(g);

    cr_assert_eq(mw_graph_new(&g), MW_OK);
    cr_assert_eq(mw_region_begin(g, "h0"), MW_OK);
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", 2}));
    cr_assert_eq(mw_region_begin(g, "h1"), MW_ERR_INVALID);
    cr_assert(strstr(mw_graph_error(g), "\"h1\"") && strstr(mw_graph_error(g), "\"h0\"") &&
                  strstr(mw_graph_error(g), "do not nest") &&
                  strstr(mw_graph_error(g), "mw_region_end first"),
              "%s", mw_graph_error(g));
    cr_assert_null(mw_scale(g, x, 2.0f));
    cr_assert_eq(mw_region_end(g), MW_ERR_INVALID, "the earlier error is returned");
    mw_graph_free(g);

    cr_assert_eq(mw_graph_new(&g), MW_OK);
    cr_assert_eq(mw_region_begin(g, ""), MW_ERR_INVALID);
    cr_assert(strstr(mw_graph_error(g), "NULL or empty"), "%s", mw_graph_error(g));
    mw_graph_free(g);
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    char longname[MW_MAX_NAME + 8];
    memset(longname, 'h', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    cr_assert_eq(mw_region_begin(g, longname), MW_ERR_INVALID);
    cr_assert(strstr(mw_graph_error(g), "longer than"), "%s", mw_graph_error(g));
    mw_graph_free(g);
    cr_assert_eq(mw_region_begin(NULL, "h0"), MW_ERR_INVALID);
    cr_assert_eq(mw_region_end(NULL), MW_ERR_INVALID);
}

Test(recompute_regions, trainer_refuses_an_open_region_and_a_bad_policy) {
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr = (mw_trainer *)1;
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &mesh), MW_OK);
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", 2}));
    mw_tensor *w = mw_param(g, "w", MW_SCALAR, MW_INIT_CONST(1.0f));
    cr_assert_eq(mw_region_begin(g, "block"), MW_OK);
    mw_tensor *loss = mw_mean(g, mw_mul(g, mw_mul(g, x, w), x), NULL);
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.1f}, .recompute = MW_RECOMPUTE_BLOCKS};
    cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_ERR_INVALID);
    cr_assert_null(tr);
    cr_assert(strstr(mw_last_error(), "region \"block\"") &&
                  strstr(mw_last_error(), "never ended") &&
                  strstr(mw_last_error(), "mw_region_end"),
              "%s", mw_last_error());
    cr_assert_eq(mw_region_end(g), MW_OK);
    cfg.recompute = (mw_recompute)3;
    cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "recompute is 3") &&
                  strstr(mw_last_error(), "MW_RECOMPUTE_BLOCKS"),
              "%s", mw_last_error());
    /* The region, ended, trains: recomputing x * w inside it. */
    cfg.recompute = MW_RECOMPUTE_BLOCKS;
    cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());
    float xs[2] = {1.0f, 3.0f}, l = 0.0f;
    mw_feed f = {"x", xs, 2};
    cr_assert_eq(mw_trainer_step(tr, &f, 1, &l), MW_OK, "%s", mw_last_error());
    cr_assert_float_eq(l, 5.0f, 1e-6f, "mean(x * w * x) with w = 1: %g", (double)l);
    float wv;
    /* dL/dw = mean(x^2) = 5; w = 1 - 0.1 * 5 */
    cr_assert_eq(mw_trainer_read_param(tr, "w", &wv, 1), MW_OK);
    cr_assert_float_eq(wv, 0.5f, 1e-6f, "w after one step: %g", (double)wv);
    mw_trainer_free(tr);
    mw_graph_free(g);
    mw_mesh_free(mesh);
}
