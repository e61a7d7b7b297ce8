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
#include <unistd.h>

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
static gpt2_config GPT2 = {
    .layers = 4, .heads = 2, .channels = 32, .max_seq = 16, .vocab = 64, .padded_vocab = 64};
/* FSDP over the data axis, for the test running: the model's parameters of at least
 * GPT2_FSDP_MIN_ELEMS elements split over X (with GPT-2 of vocab 512: its tied embedding). */
static int use_fsdp;

static mw_graph *model(const llama_config *cfg, const char *data_axis, gpt2_graph *m) {
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_graph_set_seed(g, 23);
    gpt2_layout lo = {
        .batch = BM, .seq = T, .data_axis = data_axis, .fsdp_axis = use_fsdp ? data_axis : NULL};
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
/* GPT-2's tied embedding split over X (FSDP) on a pipeline of data-parallel stages: each stage
 * holds half of it per device, the head's share of its gradient (the gathered whole's, before
 * the reduce-scatter) goes back per device: the bytes of FSDP with gradient accumulation on
 * cpu:2, with 1F1B and with zero-bubble. */
Test(pipeline, tied_gpt2_fsdp_stages_equal_cpu2, .timeout = 300) {
    use_gpt2 = 1;
    use_fsdp = 1;
    GPT2.vocab = GPT2.padded_vocab = 512; /* wte 512 x 32: GPT2_FSDP_MIN_ELEMS, so split */
    llama_config cfg = model_config(4, 1);
    cfg.vocab = 512;
    check_run(&cfg, "cpu:2", &(pipe_run){"cpu:4", "X=2,P=2", 4, MW_SCHEDULE_1F1B, 0, 0.0f});
    check_run(&cfg, "cpu:2", &(pipe_run){"cpu:4", "X=2,P=2", 4, MW_SCHEDULE_ZERO_BUBBLE, 0, 0.0f});
    /* Per device, the first stage holds half the embedding (and its blocks' weights whole). */
    gpt2_graph m;
    mw_graph *g = model(&cfg, "X", &m);
    mw_mesh *mesh;
    cr_assert_eq(mw_mesh_new("cpu:4", "X=2,P=2", &mesh), MW_OK);
    mw_pipeline_config c = {.trainer = train_config(0.0f), .axis = "P", .micro_batches = 4};
    mw_pipeline *p;
    cr_assert_eq(mw_pipeline_new(g, m.loss, mesh, &c, &p), MW_OK, "%s", mw_last_error());
    int64_t wte = (int64_t)GPT2.padded_vocab * GPT2.channels;
    for (int s = 0; s < 2; s++) {
        mw_pipeline_stage_info si;
        cr_assert_eq(mw_pipeline_stage(p, s, &si), MW_OK);
        int64_t per_device = si.memory.parameters / (int64_t)sizeof(float);
        cr_assert_eq(per_device, si.parameters - wte / 2, "stage %d: %lld of %lld per device", s,
                     (long long)per_device, (long long)si.parameters);
    }
    mw_pipeline_free(p);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

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
    cr_assert_eq(mw_trainer_read_grad(tr, ref.name[0], after, ref.count[0]), MW_ERR_UNSUPPORTED);
    free(before);
    free(after);
    result_free(&ref);
    result_free(&got);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

/* ---- checkpoints and weights: the same files as every other layout's ---- */

/* A trainer of cfg over `devices` as `axes` (a pipeline along P when axes names it, M
 * micro-batches; else gradient accumulation over M micro-batches), AdamW. */
static mw_trainer *layout_trainer(const llama_config *cfg, const char *devices, const char *axes,
                                  int M, mw_graph **g, mw_mesh **mesh) {
    gpt2_graph m;
    *g = model(cfg, NULL, &m);
    cr_assert_eq(mw_mesh_new(devices, axes, mesh), MW_OK, "%s", mw_last_error());
    mw_trainer_config c = train_config(0.0f);
    if (axes && strchr(axes, 'P')) {
        c.pipeline_axis = "P";
        c.micro_batches = M;
        c.pipeline_schedule = MW_SCHEDULE_1F1B;
    } else {
        c.grad_accumulation = 1;
    }
    mw_trainer *tr;
    cr_assert_eq(mw_trainer_new(*g, m.loss, *mesh, &c, &tr), MW_OK, "%s", mw_last_error());
    return tr;
}

/* Step s of M micro-batches: one pipeline step, or M - 1 accumulations and a step. */
static float layout_step(mw_trainer *tr, int pipelined, const llama_config *cfg, int s, int M) {
    static int32_t in[MAXM * BM * T], tg[MAXM * BM * T];
    batch(s, M, cfg->vocab, in, tg);
    float l = NAN;
    if (pipelined) {
        mw_feed f[2] = {{"tokens", in, M * BM * T}, {"targets", tg, M * BM * T}};
        cr_assert_eq(mw_trainer_step(tr, f, 2, &l), MW_OK, "%s", mw_last_error());
        return l;
    }
    double sum = 0;
    for (int k = 0; k < M; k++) {
        mw_feed f[2] = {{"tokens", in + k * BM * T, BM * T}, {"targets", tg + k * BM * T, BM * T}};
        mw_status st =
            k < M - 1 ? mw_trainer_accumulate(tr, f, 2, &l) : mw_trainer_step(tr, f, 2, &l);
        cr_assert_eq(st, MW_OK, "%s", mw_last_error());
        sum += l;
    }
    return (float)(sum / M);
}

static void read_all(mw_trainer *tr, const result *like, result *r) {
    r->n = like->n;
    for (int i = 0; i < like->n; i++) {
        snprintf(r->name[i], MW_MAX_NAME, "%s", like->name[i]);
        r->count[i] = like->count[i];
        r->value[i] = malloc((size_t)like->count[i] * sizeof(float));
        cr_assert_eq(mw_trainer_read_param(tr, like->name[i], r->value[i], like->count[i]), MW_OK,
                     "%s", mw_last_error());
    }
}

/* A checkpoint saved by a pipeline (tied Llama, P=2) after one step resumes on one device, and
 * one saved on one device resumes as a pipeline: both runs end with the uninterrupted run's
 * bytes; the pipeline's safetensors file holds the one device's tensors. */
Test(pipeline, checkpoints_cross_layouts, .timeout = 300) {
    llama_config cfg = model_config(4, 1);
    enum { M = 4 };
    result ref = {0};
    reference(&cfg, "cpu:1", M, 0.0f, &ref);
    char dir[] = "/tmp/mw_pipe_ckpt_XXXXXX", a[128], b[128], wa[128], wb[128];
    cr_assert(mkdtemp(dir));
    snprintf(a, sizeof a, "%s/pipe.ckpt", dir);
    snprintf(b, sizeof b, "%s/one.ckpt", dir);
    snprintf(wa, sizeof wa, "%s/pipe.safetensors", dir);
    snprintf(wb, sizeof wb, "%s/one.safetensors", dir);
    const char *user = "caller state";
    for (int from_pipeline = 1; from_pipeline >= 0; from_pipeline--) {
        mw_graph *g1, *g2;
        mw_mesh *m1, *m2;
        /* the first run: one step, saved */
        mw_trainer *t1 = from_pipeline ? layout_trainer(&cfg, "cpu:2", "P=2", M, &g1, &m1)
                                       : layout_trainer(&cfg, "cpu:1", NULL, M, &g1, &m1);
        float l0 = layout_step(t1, from_pipeline, &cfg, 0, M);
        cr_assert(memcmp(&l0, &ref.loss[0], sizeof l0) == 0, "step 0 loss %.9g vs %.9g", (double)l0,
                  (double)ref.loss[0]);
        const char *ck = from_pipeline ? a : b;
        cr_assert_eq(mw_trainer_save(t1, ck, user, strlen(user) + 1), MW_OK, "%s", mw_last_error());
        cr_assert_eq(mw_trainer_save_weights(t1, from_pipeline ? wa : wb, NULL, 0), MW_OK, "%s",
                     mw_last_error());
        mw_trainer_free(t1);
        mw_mesh_free(m1);
        mw_graph_free(g1);
        /* the second: the other layout, resumed */
        mw_trainer *t2 = from_pipeline ? layout_trainer(&cfg, "cpu:1", NULL, M, &g2, &m2)
                                       : layout_trainer(&cfg, "cpu:2", "P=2", M, &g2, &m2);
        char back[32] = "";
        size_t nb = 0;
        cr_assert_eq(mw_trainer_load(t2, ck, back, sizeof back, &nb), MW_OK, "%s", mw_last_error());
        cr_assert_str_eq(back, user);
        cr_assert_eq(mw_trainer_steps(t2), 1);
        result got = {0};
        for (int s = 1; s < STEPS; s++) got.loss[s] = layout_step(t2, !from_pipeline, &cfg, s, M);
        got.loss[0] = ref.loss[0];
        read_all(t2, &ref, &got);
        expect_bytes(from_pipeline ? "saved by a pipeline, resumed on cpu:1"
                                   : "saved on cpu:1, resumed by a pipeline",
                     &got, &ref);
        result_free(&got);
        mw_trainer_free(t2);
        mw_mesh_free(m2);
        mw_graph_free(g2);
    }
    /* The weights the two layouts saved after the same step are the same file's tensors. */
    mw_safetensors *fa, *fb;
    cr_assert_eq(mw_safetensors_open(wa, &fa), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_safetensors_open(wb, &fb), MW_OK, "%s", mw_last_error());
    for (int i = 0; i < ref.n; i++) {
        float *x = malloc((size_t)ref.count[i] * 4), *y = malloc((size_t)ref.count[i] * 4);
        cr_assert_eq(mw_safetensors_read(fa, ref.name[i], x, ref.count[i]), MW_OK, "%s",
                     mw_last_error());
        cr_assert_eq(mw_safetensors_read(fb, ref.name[i], y, ref.count[i]), MW_OK);
        cr_assert(memcmp(x, y, (size_t)ref.count[i] * 4) == 0, "%s differs", ref.name[i]);
        free(x), free(y);
    }
    mw_safetensors_close(fa);
    mw_safetensors_close(fb);
    /* A checkpoint of another model is refused by a pipeline, which stays as it was. */
    llama_config other = model_config(2, 1);
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr = layout_trainer(&other, "cpu:2", "P=2", M, &g, &mesh);
    cr_assert_eq(mw_trainer_load(tr, a, NULL, 0, NULL), MW_ERR_FORMAT);
    cr_assert(strstr(mw_last_error(), "parameters"), "%s", mw_last_error());
    cr_assert_eq(mw_trainer_steps(tr), 0);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    unlink(a), unlink(b), unlink(wa), unlink(wb);
    rmdir(dir);
    result_free(&ref);
}

/* Writing a tied parameter writes both its stages: weights loaded into a pipeline train as the
 * same weights loaded on one device (the head's copy does not keep its initial values). */
Test(pipeline, loaded_weights_reach_both_tied_copies, .timeout = 300) {
    llama_config cfg = model_config(4, 1);
    enum { M = 4 };
    result ref = {0};
    reference(&cfg, "cpu:1", M, 0.0f, &ref); /* trained weights: unlike any initial values */
    result one = {0}, pipe = {0};
    for (int pipelined = 0; pipelined < 2; pipelined++) {
        mw_graph *g;
        mw_mesh *mesh;
        mw_trainer *tr = pipelined ? layout_trainer(&cfg, "cpu:2", "P=2", M, &g, &mesh)
                                   : layout_trainer(&cfg, "cpu:1", NULL, M, &g, &mesh);
        for (int i = 0; i < ref.n; i++)
            cr_assert_eq(mw_trainer_write_param(tr, ref.name[i], ref.value[i], ref.count[i]), MW_OK,
                         "%s", mw_last_error());
        result *r = pipelined ? &pipe : &one;
        for (int s = 0; s < STEPS; s++) r->loss[s] = layout_step(tr, pipelined, &cfg, s, M);
        read_all(tr, &ref, r);
        mw_trainer_free(tr);
        mw_mesh_free(mesh);
        mw_graph_free(g);
    }
    expect_bytes("weights written into a pipeline", &pipe, &one);
    result_free(&one);
    result_free(&pipe);
    result_free(&ref);
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
