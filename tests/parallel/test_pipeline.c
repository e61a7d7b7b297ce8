/* Pipeline parallelism (meshwit/pipeline.h): a Llama-family model (untied head, a region per
 * block) cut into stages along P trains to the same bytes as gradient accumulation over the same
 * micro-batches on one device, for GPipe and 1F1B on P=2 and P=4 and with data parallelism inside
 * the stages (X=2, P=2 against cpu:2); each stage holds its own parameters only, 1F1B keeps at
 * most P - s micro-batches in flight and GPipe M; clipping by the whole model's norm; and the
 * misuses fail naming the fix. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2_model.h"
#include "llama_model.h"
#include "meshwit.h"
#include "meshwit/pipeline.h"
#include "meshwit/testing.h"
#include "tests/common/rng.h"

#define BM 2 /* rows per micro-batch */
#define T 8
#define STEPS 3
#define MAXM 8

static llama_config model_config(int layers, int tied) {
    return (llama_config){.family = LLAMA_FAMILY_LLAMA,
                          .layers = layers,
                          .heads = 4,
                          .kv_heads = 2,
                          .channels = 32,
                          .head_dim = 8,
                          .hidden = 88,
                          .max_seq = 16,
                          .vocab = 64,
                          .rms_eps = 1e-5f,
                          .tied = tied,
                          .rope = {.theta = 10000.0f},
                          .bos_id = -1,
                          .eos_id = -1};
}

/* AdamW; with clipping SGD, whose step scales with the clipping factor (AdamW's hardly does), so
 * that a wrong norm shows. */
static mw_precision precision; /* of the test running (each test is its own process) */
static mw_recompute recompute;

static mw_trainer_config train_config(float clip) {
    if (clip > 0)
        return (mw_trainer_config){.optimizer = {MW_SGD, .lr = 0.5f, .grad_clip = clip},
                                   .precision = precision,
                                   .recompute = recompute};
    return (mw_trainer_config){.optimizer = {MW_ADAMW, .lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f,
                                             .eps = 1e-8f, .weight_decay = 0.1f},
                               .precision = precision,
                               .recompute = recompute};
}

/* Step s's tokens and targets for M micro-batches of BM rows. */
static void batch(int s, int M, int vocab, int32_t *in, int32_t *tg) {
    uint64_t r = 17 + (uint64_t)s;
    for (int i = 0; i < M * BM * T; i++) {
        in[i] = rng_below(&r, vocab);
        tg[i] = (int32_t)((uint32_t)in[i] * 7u % (uint32_t)vocab);
    }
}

typedef struct result {
    float loss[STEPS];
    int n;
    char name[64][MW_MAX_NAME];
    int64_t count[64];
    float *value[64];
} result;

static void result_free(result *r) {
    for (int i = 0; i < r->n; i++) free(r->value[i]);
}

/* GPT-2 (its head tied to the token embedding) instead of the Llama of cfg, for the test
 * running (each test is its own process). */
static int use_gpt2;
static const gpt2_config GPT2 = {
    .layers = 4, .heads = 2, .channels = 32, .max_seq = 16, .vocab = 64, .padded_vocab = 64};

static mw_graph *model(const llama_config *cfg, const char *data_axis, gpt2_graph *m) {
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_graph_set_seed(g, 23);
    gpt2_layout lo = {.batch = BM, .seq = T, .data_axis = data_axis};
    if (use_gpt2)
        cr_assert_eq(gpt2_build(g, &GPT2, &lo, m), MW_OK, "%s", mw_graph_error(g));
    else
        cr_assert_eq(llama_build(g, cfg, &lo, m), MW_OK, "%s", mw_graph_error(g));
    return g;
}

/* Gradient accumulation over M micro-batches on `devices` (the batch over X). */
static void reference(const llama_config *cfg, const char *devices, int M, float clip, result *r) {
    gpt2_graph m;
    mw_graph *g = model(cfg, "X", &m);
    mw_mesh *mesh;
    cr_assert_eq(mw_mesh_new(devices, "X", &mesh), MW_OK, "%s", mw_last_error());
    mw_trainer_config c = train_config(clip);
    c.grad_accumulation = 1;
    mw_trainer *tr;
    cr_assert_eq(mw_trainer_new(g, m.loss, mesh, &c, &tr), MW_OK, "%s", mw_last_error());
    static int32_t in[MAXM * BM * T], tg[MAXM * BM * T];
    for (int s = 0; s < STEPS; s++) {
        batch(s, M, cfg->vocab, in, tg);
        double sum = 0;
        for (int k = 0; k < M; k++) {
            mw_feed f[2] = {{"tokens", in + k * BM * T, BM * T},
                            {"targets", tg + k * BM * T, BM * T}};
            float l;
            mw_status st =
                k < M - 1 ? mw_trainer_accumulate(tr, f, 2, &l) : mw_trainer_step(tr, f, 2, &l);
            cr_assert_eq(st, MW_OK, "%s", mw_last_error());
            sum += l;
        }
        r->loss[s] = (float)(sum / M);
    }
    r->n = mw_trainer_param_count(tr);
    for (int i = 0; i < r->n; i++) {
        mw_param_info pi;
        cr_assert_eq(mw_trainer_param_info(tr, i, &pi), MW_OK);
        snprintf(r->name[i], MW_MAX_NAME, "%s", pi.name);
        r->count[i] = pi.count;
        r->value[i] = malloc((size_t)pi.count * sizeof(float));
        cr_assert_eq(mw_trainer_read_param(tr, pi.name, r->value[i], pi.count), MW_OK);
    }
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

typedef struct pipe_run {
    const char *devices, *axes;
    int M;
    mw_pipeline_schedule schedule;
    int virtual_stages;
    float clip;
} pipe_run;

static void pipelined(const llama_config *cfg, const pipe_run *pr, const result *ref, result *r,
                      mw_pipeline_stage_info *info, int *stages) {
    gpt2_graph m;
    mw_graph *g = model(cfg, strchr(pr->axes, 'X') ? "X" : NULL, &m);
    mw_mesh *mesh;
    cr_assert_eq(mw_mesh_new(pr->devices, pr->axes, &mesh), MW_OK, "%s", mw_last_error());
    mw_pipeline_config c = {.trainer = train_config(pr->clip),
                            .axis = "P",
                            .micro_batches = pr->M,
                            .schedule = pr->schedule,
                            .virtual_stages = pr->virtual_stages};
    mw_pipeline *p;
    cr_assert_eq(mw_pipeline_new(g, m.loss, mesh, &c, &p), MW_OK, "%s %s: %s", pr->devices,
                 pr->axes, mw_last_error());
    static int32_t in[MAXM * BM * T], tg[MAXM * BM * T];
    for (int s = 0; s < STEPS; s++) {
        batch(s, pr->M, cfg->vocab, in, tg);
        mw_feed f[2] = {{"tokens", in, pr->M * BM * T}, {"targets", tg, pr->M * BM * T}};
        cr_assert_eq(mw_pipeline_step(p, f, 2, &r->loss[s]), MW_OK, "step %d: %s", s,
                     mw_last_error());
    }
    r->n = ref->n;
    for (int i = 0; i < ref->n; i++) {
        r->count[i] = ref->count[i];
        r->value[i] = malloc((size_t)ref->count[i] * sizeof(float));
        cr_assert_eq(mw_pipeline_read_param(p, ref->name[i], r->value[i], ref->count[i]), MW_OK,
                     "%s", mw_last_error());
    }
    *stages = mw_pipeline_stages(p);
    for (int s = 0; s < *stages; s++)
        cr_assert_eq(mw_pipeline_stage(p, s, &info[s]), MW_OK, "%s", mw_last_error());
    for (int d = 0; d < *stages; d++)
        if (d < 4) cr_assert(mw_pipeline_idle(p, d % 4) >= -1.0);
    mw_pipeline_free(p);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

static void expect_bytes(const char *what, const result *a, const result *b) {
    for (int s = 0; s < STEPS; s++)
        cr_assert(memcmp(&a->loss[s], &b->loss[s], sizeof(float)) == 0,
                  "%s: step %d loss %.9g vs %.9g", what, s, (double)a->loss[s], (double)b->loss[s]);
    for (int i = 0; i < a->n; i++)
        for (int64_t e = 0; e < a->count[i]; e++)
            cr_assert(memcmp(&a->value[i][e], &b->value[i][e], sizeof(float)) == 0,
                      "%s: %s[%lld]: %a vs %a", what, b->name[i], (long long)e,
                      (double)a->value[i][e], (double)b->value[i][e]);
}

static void check_run(const llama_config *cfg, const char *ref_devices, const pipe_run *pr) {
    result ref = {0}, got = {0};
    mw_pipeline_stage_info info[16];
    int S = 0;
    reference(cfg, ref_devices, pr->M, pr->clip, &ref);
    pipelined(cfg, pr, &ref, &got, info, &S);
    char what[128];
    snprintf(what, sizeof what, "%s %s schedule %d M=%d", pr->devices, pr->axes, pr->schedule,
             pr->M);
    expect_bytes(what, &got, &ref);
    int64_t total = 0, whole = 0;
    for (int i = 0; i < ref.n; i++) whole += ref.count[i];
    for (int s = 0; s < S; s++) {
        total += info[s].parameters;
        cr_assert(info[s].nregions >= 1, "stage %d has no region", s);
        int P = S / (pr->virtual_stages > 1 ? pr->virtual_stages : 1);
        if (pr->schedule == MW_SCHEDULE_1F1B)
            cr_assert_leq(info[s].micro_in_flight, P - info[s].device, "%s: stage %d holds %d",
                          what, s, info[s].micro_in_flight);
        if (pr->schedule == MW_SCHEDULE_GPIPE) cr_assert_eq(info[s].micro_in_flight, pr->M);
    }
    /* A tied parameter is held by both its stages. */
    if (cfg->tied || use_gpt2)
        cr_assert_gt(total, whole, "%s: the stages hold %lld parameters, the model %lld", what,
                     (long long)total, (long long)whole);
    else
        cr_assert_eq(total, whole, "%s: the stages hold %lld parameters, the model %lld", what,
                     (long long)total, (long long)whole);
    result_free(&ref);
    result_free(&got);
}

Test(pipeline, gpipe_p2_equals_accumulation, .timeout = 300) {
    llama_config cfg = model_config(4, 0);
    check_run(&cfg, "cpu:1", &(pipe_run){"cpu:2", "P=2", 4, MW_SCHEDULE_GPIPE, 0, 0.0f});
}

Test(pipeline, one_f_one_b_p4_equals_accumulation, .timeout = 300) {
    llama_config cfg = model_config(4, 0);
    check_run(&cfg, "cpu:1", &(pipe_run){"cpu:4", "P=4", 8, MW_SCHEDULE_1F1B, 0, 0.0f});
}

Test(pipeline, data_parallel_stages_equal_cpu2, .timeout = 300) {
    llama_config cfg = model_config(4, 0);
    check_run(&cfg, "cpu:2", &(pipe_run){"cpu:4", "P=2,X=2", 4, MW_SCHEDULE_1F1B, 0, 0.0f});
}

Test(pipeline, interleaved_equals_accumulation, .timeout = 300) {
    llama_config cfg = model_config(4, 0);
    check_run(&cfg, "cpu:1", &(pipe_run){"cpu:2", "P=2", 4, MW_SCHEDULE_INTERLEAVED, 2, 0.0f});
}

/* bf16 with every block recomputed, in the stages as on one device. */
Test(pipeline, bf16_recomputed_equals_accumulation, .timeout = 300) {
    precision = MW_PRECISION_BF16;
    recompute = MW_RECOMPUTE_BLOCKS;
    llama_config cfg = model_config(4, 0);
    check_run(&cfg, "cpu:1", &(pipe_run){"cpu:4", "P=4", 4, MW_SCHEDULE_1F1B, 0, 0.0f});
}

/* Zero-bubble: each stage's input gradients first, its weight gradients where the schedule
 * puts them; the same sums, so the same bytes, tied GPT-2 and data parallel stages too. */
Test(pipeline, zero_bubble_p4_equals_accumulation, .timeout = 300) {
    llama_config cfg = model_config(4, 0);
    check_run(&cfg, "cpu:1", &(pipe_run){"cpu:4", "P=4", 8, MW_SCHEDULE_ZERO_BUBBLE, 0, 0.0f});
}

Test(pipeline, zero_bubble_tied_gpt2_data_parallel, .timeout = 300) {
    use_gpt2 = 1;
    llama_config cfg = model_config(4, 0);
    check_run(&cfg, "cpu:2", &(pipe_run){"cpu:4", "P=2,X=2", 4, MW_SCHEDULE_ZERO_BUBBLE, 0, 0.0f});
}

/* Tied embeddings: the last stage's share of the gradient is the first stage's seed, added
 * first as the whole graph adds it, and the updated table copied back: the same bytes. */
Test(pipeline, tied_llama_equals_accumulation, .timeout = 300) {
    llama_config cfg = model_config(4, 1);
    check_run(&cfg, "cpu:1", &(pipe_run){"cpu:2", "P=2", 4, MW_SCHEDULE_1F1B, 0, 0.0f});
}

Test(pipeline, tied_gpt2_p4_equals_accumulation, .timeout = 300) {
    use_gpt2 = 1;
    llama_config cfg = model_config(4, 0);
    check_run(&cfg, "cpu:1", &(pipe_run){"cpu:4", "P=4", 8, MW_SCHEDULE_1F1B, 0, 0.0f});
}

Test(pipeline, tied_gpt2_data_parallel_stages_equal_cpu2, .timeout = 300) {
    use_gpt2 = 1;
    llama_config cfg = model_config(4, 0);
    check_run(&cfg, "cpu:2", &(pipe_run){"cpu:4", "P=2,X=2", 4, MW_SCHEDULE_GPIPE, 0, 0.0f});
}

/* Clipping uses the whole model's norm, combined from the stages' to float rounding. */
Test(pipeline, clipping_by_the_whole_norm, .timeout = 300) {
    llama_config cfg = model_config(4, 0);
    result ref = {0}, got = {0};
    mw_pipeline_stage_info info[16];
    int S;
    reference(&cfg, "cpu:1", 4, 0.05f, &ref);
    pipelined(&cfg, &(pipe_run){"cpu:2", "P=2", 4, MW_SCHEDULE_1F1B, 0, 0.05f}, &ref, &got, info,
              &S);
    for (int i = 0; i < ref.n; i++)
        for (int64_t e = 0; e < ref.count[i]; e++)
            cr_assert(fabsf(got.value[i][e] - ref.value[i][e]) <=
                          1e-5f * (1 + fabsf(ref.value[i][e])),
                      "%s[%lld]: %.9g vs %.9g", ref.name[i], (long long)e, (double)got.value[i][e],
                      (double)ref.value[i][e]);
    result_free(&ref);
    result_free(&got);
}

static mw_status try_new(const llama_config *cfg, const char *devices, const char *axes,
                         mw_pipeline_config c) {
    gpt2_graph m;
    mw_graph *g = model(cfg, NULL, &m);
    mw_mesh *mesh;
    cr_assert_eq(mw_mesh_new(devices, axes, &mesh), MW_OK, "%s", mw_last_error());
    mw_pipeline *p = NULL;
    mw_status st = mw_pipeline_new(g, m.loss, mesh, &c, &p);
    mw_pipeline_free(p);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    return st;
}

Test(pipeline, misuse_names_the_fix, .timeout = 120) {
    llama_config cfg = model_config(2, 0);
    mw_pipeline_config c = {.trainer = train_config(0), .axis = "P", .micro_batches = 2};
    cr_assert_eq(try_new(&cfg, "cpu:4", "P=4", c), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "2 regions but the pipeline has 4 stages"), "%s",
              mw_last_error());
    mw_pipeline_config zb = c;
    zb.virtual_stages = 2;
    zb.schedule = MW_SCHEDULE_ZERO_BUBBLE;
    cr_assert_eq(try_new(&cfg, "cpu:2", "P=2", zb), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "virtual_stages"), "%s", mw_last_error());
    mw_pipeline_config noaxis = c;
    noaxis.axis = "Q";
    cr_assert_eq(try_new(&cfg, "cpu:2", "P=2", noaxis), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "no axis 'Q'"), "%s", mw_last_error());
    mw_pipeline_config zero = c;
    zero.micro_batches = 0;
    cr_assert_eq(try_new(&cfg, "cpu:2", "P=2", zero), MW_ERR_INVALID);
    int bad[2] = {1, 0};
    mw_pipeline_config order = c;
    order.region_stage = bad;
    cr_assert_eq(try_new(&cfg, "cpu:2", "P=2", order), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "region_stage[0]"), "%s", mw_last_error());
}

/* A step fed the wrong number of elements is refused before anything runs, and the pipeline
 * steps on afterwards. */
Test(pipeline, bad_feed_changes_nothing, .timeout = 120) {
    llama_config cfg = model_config(2, 0);
    gpt2_graph m;
    mw_graph *g = model(&cfg, NULL, &m);
    mw_mesh *mesh;
    cr_assert_eq(mw_mesh_new("cpu:2", "P=2", &mesh), MW_OK);
    mw_pipeline_config c = {.trainer = train_config(0), .axis = "P", .micro_batches = 2};
    mw_pipeline *p;
    cr_assert_eq(mw_pipeline_new(g, m.loss, mesh, &c, &p), MW_OK, "%s", mw_last_error());
    static int32_t in[2 * BM * T], tg[2 * BM * T];
    batch(0, 2, cfg.vocab, in, tg);
    float before[8], after[8];
    cr_assert_eq(mw_pipeline_read_param(p, "l0.qkv", before, 8), MW_ERR_SHAPE);
    int64_t n = 0;
    (void)n;
    mw_feed f[2] = {{"tokens", in, BM * T}, {"targets", tg, 2 * BM * T}};
    cr_assert_eq(mw_pipeline_step(p, f, 2, NULL), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "2 micro-batches"), "%s", mw_last_error());
    f[0].count = 2 * BM * T;
    float loss = NAN;
    cr_assert_eq(mw_pipeline_step(p, f, 2, &loss), MW_OK, "%s", mw_last_error());
    cr_assert(isfinite(loss));
    (void)before;
    (void)after;
    mw_pipeline_free(p);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

/* The same pipeline as a trainer (mw_trainer_config.pipeline_axis): a step of all the
 * micro-batches gives gradient accumulation's bytes; eval gives the micro-batches' mean loss;
 * the calls it does not offer say so; a device failing in the middle of a step changes no
 * parameter, and the next step trains on. */
Test(pipeline, as_a_trainer, .timeout = 300) {
    llama_config cfg = model_config(4, 1);
    result ref = {0};
    reference(&cfg, "cpu:1", 4, 0.0f, &ref);
    gpt2_graph m;
    mw_graph *g = model(&cfg, NULL, &m);
    mw_mesh *mesh;
    cr_assert_eq(mw_mesh_new("cpu:2", "P=2", &mesh), MW_OK);
    mw_trainer_config c = train_config(0.0f);
    c.pipeline_axis = "P";
    c.micro_batches = 4;
    c.pipeline_schedule = MW_SCHEDULE_ZERO_BUBBLE;
    mw_trainer *tr;
    cr_assert_eq(mw_trainer_new(g, m.loss, mesh, &c, &tr), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_devices(tr), 2);
    cr_assert_eq(mw_trainer_param_count(tr), ref.n);
    static int32_t in[4 * BM * T], tg[4 * BM * T];
    mw_feed f[2] = {{"tokens", in, 4 * BM * T}, {"targets", tg, 4 * BM * T}};
    /* A fault on the second device's backward pass at step 0: nothing changes. */
    float *before = malloc((size_t)ref.count[0] * sizeof *before),
          *after = malloc((size_t)ref.count[0] * sizeof *after);
    cr_assert(before && after);
    cr_assert_eq(mw_trainer_read_param(tr, ref.name[0], before, ref.count[0]), MW_OK);
    cr_assert_eq(
        mw_test_control(MW_TEST_FAULT, tr, 1, MW_PHASE_BACKWARD, (int64_t)0, (int)MW_ERR_DEVICE),
        MW_OK, "%s", mw_last_error());
    batch(0, 4, cfg.vocab, in, tg);
    float loss = NAN;
    cr_assert_eq(mw_trainer_step(tr, f, 2, &loss), MW_ERR_DEVICE);
    cr_assert(strstr(mw_last_error(), "stage 1") && strstr(mw_last_error(), "injected fault"), "%s",
              mw_last_error());
    cr_assert_eq(mw_trainer_read_param(tr, ref.name[0], after, ref.count[0]), MW_OK);
    cr_assert(memcmp(before, after, (size_t)ref.count[0] * sizeof *after) == 0,
              "a failed step changed %s", ref.name[0]);
    cr_assert_eq(mw_trainer_steps(tr), 0);
    result got = {0};
    for (int s = 0; s < STEPS; s++) {
        batch(s, 4, cfg.vocab, in, tg);
        cr_assert_eq(mw_trainer_step(tr, f, 2, &got.loss[s]), MW_OK, "step %d: %s", s,
                     mw_last_error());
    }
    cr_assert_eq(mw_trainer_steps(tr), STEPS);
    got.n = ref.n;
    for (int i = 0; i < ref.n; i++) {
        got.count[i] = ref.count[i];
        got.value[i] = malloc((size_t)ref.count[i] * sizeof(float));
        cr_assert_eq(mw_trainer_read_param(tr, ref.name[i], got.value[i], ref.count[i]), MW_OK);
    }
    expect_bytes("a pipeline's trainer, zero-bubble, after a failed step", &got, &ref);
    float ev = NAN;
    cr_assert_eq(mw_trainer_eval(tr, f, 2, &ev), MW_OK, "%s", mw_last_error());
    cr_assert(isfinite(ev));
    mw_device_memory mem;
    cr_assert_eq(mw_trainer_memory(tr, 1, &mem), MW_OK, "%s", mw_last_error());
    cr_assert_gt(mem.parameters, 0);
    cr_assert_eq(mw_trainer_accumulate(tr, f, 2, NULL), MW_ERR_UNSUPPORTED);
    cr_assert(strstr(mw_last_error(), "mw_trainer_accumulate"), "%s", mw_last_error());
    cr_assert_eq(mw_trainer_save(tr, "/nonexistent/x", NULL, 0), MW_ERR_UNSUPPORTED);
    free(before);
    free(after);
    result_free(&ref);
    result_free(&got);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

/* Pipeline fields without a pipeline axis are refused, naming the way to accumulate. */
Test(pipeline, micro_batches_need_an_axis, .timeout = 60) {
    llama_config cfg = model_config(2, 0);
    gpt2_graph m;
    mw_graph *g = model(&cfg, NULL, &m);
    mw_mesh *mesh;
    cr_assert_eq(mw_mesh_new("cpu:1", NULL, &mesh), MW_OK);
    mw_trainer_config c = train_config(0.0f);
    c.micro_batches = 4;
    mw_trainer *tr = NULL;
    cr_assert_eq(mw_trainer_new(g, m.loss, mesh, &c, &tr), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "pipeline_axis"), "%s", mw_last_error());
    mw_mesh_free(mesh);
    mw_graph_free(g);
}
