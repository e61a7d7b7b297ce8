/* A GPT-2 trainer for the suites that train one model in many configurations (bf16,
 * recomputation in tests/parallel): made on a mesh from a graph seed, so every run of a suite
 * starts from the same parameters, fed token streams that depend only on the step. Header-only
 * (Criterion's asserts, examples/common's gpt2_model.h): each suite includes it once. */
#ifndef MW_TESTS_COMMON_GPT2_FIXTURE_H
#define MW_TESTS_COMMON_GPT2_FIXTURE_H

#include <criterion/criterion.h>

#include <stdint.h>
#include <string.h>

#include "gpt2_model.h"
#include "meshwit.h"
#include "rng.h"

typedef struct fixture_run {
    mw_graph *g;
    gpt2_graph m;
    mw_mesh *mesh;
    mw_trainer *tr;
} fixture_run;

/* The suites' AdamW (lr 3e-3, betas 0.9 and 0.95, weight decay 0.1, clipping at 1) in precision
 * p; the rest of the configuration at its defaults. */
static mw_trainer_config fixture_config(mw_precision p) {
    return (mw_trainer_config){.optimizer = {.kind = MW_ADAMW,
                                             .eps = 1e-8f,
                                             .lr = 3e-3f,
                                             .beta1 = 0.9f,
                                             .beta2 = 0.95f,
                                             .weight_decay = 0.1f,
                                             .grad_clip = 1.0f},
                               .precision = p};
}

/* GPT-2 of cfg (batch x seq tokens) on `devices`, the batch over X and, with model, the heads and
 * MLP units over Y, its parameters drawn from graph seed `seed`. */
static void fixture_open(fixture_run *r, const gpt2_config *cfg, int batch, int seq, uint64_t seed,
                         const char *devices, const char *axes, int model, mw_trainer_config c) {
    memset(r, 0, sizeof *r);
    cr_assert_eq(mw_graph_new(&r->g), MW_OK);
    mw_graph_set_seed(r->g, seed);
    cr_assert_eq(gpt2_build(r->g, cfg,
                            &(gpt2_layout){.batch = batch,
                                           .seq = seq,
                                           .data_axis = "X",
                                           .model_axis = model ? "Y" : NULL},
                            &r->m),
                 MW_OK, "%s", mw_graph_error(r->g));
    cr_assert_eq(mw_mesh_new(devices, axes, &r->mesh), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_new(r->g, r->m.loss, r->mesh, &c, &r->tr), MW_OK, "%s",
                 mw_last_error());
}

static void fixture_close(fixture_run *r) {
    mw_trainer_free(r->tr);
    mw_mesh_free(r->mesh);
    mw_graph_free(r->g);
}

/* The n tokens of step k below vocab, and their targets (the stream shifted by one): a linear
 * congruential stream started at s0 + stride k. */
static void fixture_tokens(int vocab, int n, uint32_t s0, uint32_t stride, int k, int32_t *tok,
                           int32_t *tgt) {
    uint32_t s = s0 + stride * (uint32_t)k;
    for (int i = 0; i < n + 1; i++) {
        int32_t t = (int32_t)((rng_lcg32(&s) >> 9) % (uint32_t)vocab);
        if (i < n) tok[i] = t;
        if (i > 0) tgt[i - 1] = t;
    }
}

#endif
