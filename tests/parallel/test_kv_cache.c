/* Key/value-cache decoding: a program of one position per run (gpt2_build's GPT2_DECODE: states
 * mw_state, mw_state_write, mw_attention_cached) gives, position after position, the logits of
 * the full forward pass at those positions, on one device, with the sequences sharded over two,
 * with the heads split over two, and both; the states keep between runs and a new sequence
 * starts again at position 0. And what is refused: states in a trainer, a position outside the
 * cache, another number of rows, writes that are not a chain, operands of the wrong shape. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2_model.h"
#include "meshwit.h"
#include "tests/common/rng.h"

#define B 2
#define T 11
#define VP 48

static const gpt2_config cfg = {
    .layers = 2, .heads = 4, .channels = 32, .max_seq = 16, .vocab = 40, .padded_vocab = VP};

typedef struct full {
    mw_graph *g;
    gpt2_graph m;
    mw_mesh *mesh;
    mw_trainer *tr;
} full;

/* The full model on devices (a mesh of axes) with the batch over data and heads over model. */
static void full_open(full *f, const char *devices, const char *axes, const char *data,
                      const char *model) {
    memset(f, 0, sizeof *f);
    cr_assert_eq(mw_graph_new(&f->g), MW_OK);
    mw_graph_set_seed(f->g, 5);
    cr_assert_eq(
        gpt2_build(f->g, &cfg,
                   &(gpt2_layout){.batch = B, .seq = T, .data_axis = data, .model_axis = model},
                   &f->m),
        MW_OK, "%s", mw_graph_error(f->g));
    cr_assert_eq(mw_mesh_new(devices, axes, &f->mesh), MW_OK, "%s", mw_last_error());
    mw_trainer_config tc = {
        .optimizer = {MW_SGD, .lr = 0.0f}, .outputs = &f->m.logits, .noutputs = 1};
    cr_assert_eq(mw_trainer_new(f->g, f->m.loss, f->mesh, &tc, &f->tr), MW_OK, "%s",
                 mw_last_error());
}

static void full_close(full *f) {
    mw_trainer_free(f->tr);
    mw_mesh_free(f->mesh);
    mw_graph_free(f->g);
}

/* The full pass's logits of a batch of token sequences drawn from seed. */
static void full_logits(full *f, uint64_t seed, int32_t *tok, float *logits) {
    int32_t next[B * T];
    for (int i = 0; i < B * T; i++) tok[i] = rng_below(&seed, cfg.vocab);
    for (int i = 0; i < B * T; i++) next[i] = tok[(i + 1) % (B * T)];
    mw_feed feeds[2] = {{"tokens", tok, B * T}, {"targets", next, B * T}};
    cr_assert_eq(mw_trainer_eval(f->tr, feeds, 2, NULL), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_output(f->tr, f->m.logits, logits, B * T * VP), MW_OK);
}

typedef struct decoder {
    mw_graph *g;
    gpt2_graph d;
    mw_infer *inf;
} decoder;

static void decoder_open(decoder *dc, full *f, const char *data, const char *model) {
    cr_assert_eq(mw_graph_new(&dc->g), MW_OK);
    cr_assert_eq(
        gpt2_build(
            dc->g, &cfg,
            &(gpt2_layout){.mode = GPT2_DECODE, .batch = B, .data_axis = data, .model_axis = model},
            &dc->d),
        MW_OK, "%s", mw_graph_error(dc->g));
    mw_infer_config ic = {.outputs = &dc->d.logits, .noutputs = 1};
    cr_assert_eq(mw_infer_from_trainer(f->tr, dc->g, &ic, &dc->inf), MW_OK, "%s", mw_last_error());
}

static mw_status decoder_step(decoder *dc, const int32_t *tok, const int32_t *pos, float *out) {
    mw_feed in[2] = {{"tokens", tok, B}, {"pos", pos, B}};
    mw_fetch fetch = {dc->d.logits, out, B * VP};
    return mw_infer_run(dc->inf, in, 2, B, &fetch, 1);
}

static void decoder_close(decoder *dc) {
    mw_infer_free(dc->inf);
    mw_graph_free(dc->g);
}

/* Feeds the sequences position by position; every logit against the full pass's. */
static void expect_full(decoder *dc, const int32_t *tok, const float *want) {
    float got[B * VP];
    for (int t = 0; t < T; t++) {
        int32_t step_tok[B], step_pos[B];
        for (int b = 0; b < B; b++) step_tok[b] = tok[b * T + t], step_pos[b] = t;
        cr_assert_eq(decoder_step(dc, step_tok, step_pos, got), MW_OK, "%s", mw_last_error());
        /* Both sum the same products in other orders (one query against the cache, blocks of
         * queries against all keys): float32 roundings of values of order 1. */
        for (int b = 0; b < B; b++)
            for (int v = 0; v < cfg.vocab; v++) {
                double w = want[(b * T + t) * VP + v];
                cr_assert(fabs(got[b * VP + v] - w) <= 2e-5 * (1.0 + fabs(w)),
                          "position %d, sequence %d, logit %d: %.9g cached, %.9g full", t, b, v,
                          got[b * VP + v], w);
            }
    }
}

static void run_mesh(const char *devices, const char *axes, const char *data, const char *model) {
    full f;
    full_open(&f, devices, axes, data, model);
    decoder dc;
    decoder_open(&dc, &f, data, model);
    static int32_t tok[B * T];
    static float want[B * T * VP];
    full_logits(&f, 11, tok, want);
    expect_full(&dc, tok, want);
    /* Another pair of sequences through the same program: it starts again at position 0, and
     * what the first pair left in the cache beyond is never read. */
    full_logits(&f, 12, tok, want);
    expect_full(&dc, tok, want);
    decoder_close(&dc);
    full_close(&f);
}

Test(kv_cache, equals_the_full_forward_on_one_device) { run_mesh("cpu:1", "X", NULL, NULL); }

Test(kv_cache, equals_the_full_forward_with_sequences_sharded) {
    run_mesh("cpu:2", "X", "X", NULL);
}

Test(kv_cache, equals_the_full_forward_with_heads_split) { run_mesh("cpu:2", "Y", NULL, "Y"); }

Test(kv_cache, equals_the_full_forward_data_times_tensor_parallel) {
    run_mesh("cpu:4", "X=2,Y=2", "X", "Y");
}

/* Sequences at different positions in one run: each row attends to its own prefix. */
Test(kv_cache, rows_at_their_own_positions) {
    full f;
    full_open(&f, "cpu:1", "X", NULL, NULL);
    decoder dc;
    decoder_open(&dc, &f, NULL, NULL);
    static int32_t tok[B * T];
    static float want[B * T * VP];
    full_logits(&f, 21, tok, want);
    float got[B * VP];
    /* Sequence 0 first runs 4 positions alone (sequence 1 rewrites its position 0), then both
     * advance together, sequence 1 four positions behind. */
    for (int s = 0; s < T + 4; s++) {
        int32_t st[B], sp[B];
        sp[0] = s < T ? s : T - 1;
        sp[1] = s < 4 ? 0 : s - 4;
        for (int b = 0; b < B; b++) st[b] = tok[b * T + sp[b]];
        cr_assert_eq(decoder_step(&dc, st, sp, got), MW_OK, "%s", mw_last_error());
        for (int b = 0; b < B; b++) {
            if ((b == 0 && s >= T) || (b == 1 && (s < 4 || s - 4 >= T))) continue;
            for (int v = 0; v < cfg.vocab; v++) {
                double w = want[(b * T + sp[b]) * VP + v];
                cr_assert(fabs(got[b * VP + v] - w) <= 2e-5 * (1.0 + fabs(w)),
                          "run %d, sequence %d at %d, logit %d: %.9g vs %.9g", s, b, sp[b], v,
                          got[b * VP + v], w);
            }
        }
    }
    decoder_close(&dc);
    full_close(&f);
}

Test(kv_cache, what_is_refused) {
    full f;
    full_open(&f, "cpu:1", "X", NULL, NULL);
    decoder dc;
    decoder_open(&dc, &f, NULL, NULL);
    float got[B * VP];
    int32_t tok[B] = {1, 2}, pos[B] = {0, 16};
    cr_assert_eq(decoder_step(&dc, tok, pos, got), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "16") && strstr(mw_last_error(), "'pos'") &&
                  strstr(mw_last_error(), "outside [0, 16)"),
              "%s", mw_last_error());
    /* Its rows are its states' rows: a run of another count is refused. */
    mw_feed in[2] = {{"tokens", tok, 1}, {"pos", pos, 1}};
    mw_fetch fetch = {dc.d.logits, got, VP};
    cr_assert_eq(mw_infer_run(dc.inf, in, 2, 1, &fetch, 1), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "run exactly 2 rows"), "%s", mw_last_error());
    decoder_close(&dc);
    /* States have no gradient: a trainer refuses them. */
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    gpt2_graph d;
    cr_assert_eq(gpt2_build(g, &cfg, &(gpt2_layout){.mode = GPT2_DECODE, .batch = B}, &d), MW_OK);
    mw_tensor *loss = mw_sum(g, d.logits, NULL);
    mw_trainer *tr;
    cr_assert_eq(mw_trainer_new(g, loss, f.mesh, NULL, &tr), MW_ERR_UNSUPPORTED);
    cr_assert(strstr(mw_last_error(), "states"), "%s", mw_last_error());
    mw_graph_free(g);
    /* Writes form a chain; shapes must match. */
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *s = mw_state(g, "s", MW_AXES({"Batch", 2}, {"Ctx", 4}, {"F", 3}));
    mw_tensor *v = mw_input(g, "v", MW_F32, MW_AXES({"Batch", 2}, {"F", 3}));
    mw_tensor *p = mw_input(g, "p", MW_I32, MW_AXES({"Batch", 2}));
    cr_assert_not_null(mw_state_write(g, s, v, "Ctx", p));
    cr_assert_null(mw_state_write(g, s, v, "Ctx", p));
    cr_assert(strstr(mw_graph_error(g), "written already"), "%s", mw_graph_error(g));
    mw_graph_free(g);
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    s = mw_state(g, "s", MW_AXES({"Batch", 2}, {"Ctx", 4}, {"F", 3}));
    v = mw_input(g, "v", MW_F32, MW_AXES({"Batch", 2}, {"F", 4}));
    p = mw_input(g, "p", MW_I32, MW_AXES({"Batch", 2}));
    cr_assert_null(mw_state_write(g, s, v, "Ctx", p));
    cr_assert_eq(mw_graph_status(g), MW_ERR_SHAPE, "%s", mw_graph_error(g));
    mw_graph_free(g);
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *kv = mw_state(g, "kv", MW_AXES({"Batch", 2}, {"Ctx", 4}, {"Part", 3}, {"D", 8}));
    mw_tensor *q = mw_input(g, "q", MW_F32, MW_AXES({"Batch", 2}, {"D", 8}));
    p = mw_input(g, "p", MW_I32, MW_AXES({"Batch", 2}));
    cr_assert_null(mw_attention_cached(g, q, kv, "Part", "Ctx", "D", p, 1.0f));
    cr_assert(strstr(mw_graph_error(g), "Part=2 (keys, values)"), "%s", mw_graph_error(g));
    mw_graph_free(g);
    full_close(&f);
}

/* A state on its own: written rows land where their positions say and stay between runs, the
 * rest stay zero; a position outside the axis fails naming the row. */
Test(kv_cache, state_writes_keep_between_runs) {
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *s = mw_state(g, "s", MW_AXES({"Batch", 2}, {"Ctx", 4}, {"F", 3}));
    mw_tensor *v = mw_input(g, "v", MW_F32, MW_AXES({"Batch", 2}, {"F", 3}));
    mw_tensor *p = mw_input(g, "p", MW_I32, MW_AXES({"Batch", 2}));
    mw_tensor *out = mw_state_write(g, s, v, "Ctx", p);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    for (int sharded = 0; sharded < 2; sharded++) {
        mw_mesh *mesh;
        cr_assert_eq(mw_mesh_new(sharded ? "cpu:2" : "cpu:1", "X", &mesh), MW_OK);
        mw_graph *h = g;
        mw_tensor *o = out;
        if (sharded) { /* the same program with its rows over two devices */
            cr_assert_eq(mw_graph_new(&h), MW_OK);
            mw_tensor *hs = mw_shard(
                h, mw_state(h, "s", MW_AXES({"Batch", 2}, {"Ctx", 4}, {"F", 3})), "Batch", "X");
            mw_tensor *hv = mw_shard(h, mw_input(h, "v", MW_F32, MW_AXES({"Batch", 2}, {"F", 3})),
                                     "Batch", "X");
            mw_tensor *hp =
                mw_shard(h, mw_input(h, "p", MW_I32, MW_AXES({"Batch", 2})), "Batch", "X");
            o = mw_state_write(h, hs, hv, "Ctx", hp);
            cr_assert_eq(mw_graph_status(h), MW_OK, "%s", mw_graph_error(h));
        }
        mw_infer_config ic = {.outputs = &o, .noutputs = 1};
        mw_infer *inf;
        cr_assert_eq(mw_infer_new(h, mesh, &ic, &inf), MW_OK, "%s", mw_last_error());
        float vals[6], got[24];
        int32_t pos[2];
        for (int run = 0; run < 3; run++) {
            for (int i = 0; i < 6; i++) vals[i] = (float)(100 * run + i + 1);
            pos[0] = run, pos[1] = 3 - run;
            mw_feed in[2] = {{"v", vals, 6}, {"p", pos, 2}};
            mw_fetch f = {o, got, 24};
            cr_assert_eq(mw_infer_run(inf, in, 2, 2, &f, 1), MW_OK, "%s", mw_last_error());
        }
        /* Row 0: positions 0, 1, 2 written by runs 0, 1, 2; row 1: positions 3, 2, 1. */
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < 4; c++)
                for (int k = 0; k < 3; k++) {
                    int run = b == 0 ? c : 3 - c;
                    float want = run >= 0 && run < 3 ? (float)(100 * run + b * 3 + k + 1) : 0.0f;
                    cr_assert_eq(got[(b * 4 + c) * 3 + k], want, "sharded %d [%d, %d, %d]", sharded,
                                 b, c, k);
                }
        pos[0] = 0, pos[1] = 9;
        mw_feed in[2] = {{"v", vals, 6}, {"p", pos, 2}};
        mw_fetch f = {o, got, 24};
        cr_assert_eq(mw_infer_run(inf, in, 2, 2, &f, 1), MW_ERR_INVALID);
        cr_assert(strstr(mw_last_error(), "state write: position 9 of row") &&
                      strstr(mw_last_error(), "outside [0, 4)"),
                  "%s", mw_last_error());
        mw_infer_free(inf);
        mw_mesh_free(mesh);
        if (sharded) mw_graph_free(h);
    }
    mw_graph_free(g);
}
