/* Key/value-cache decoding on a GPU (suite gpu_trainer): the decode program on cuda:0 (and on two
 * GPUs sharing the sequences, where there are two) gives, position after position, the logits of
 * the CPU's full forward pass of the same weights; a position outside the cache is named. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gpt2_model.h"
#include "meshwit.h"

#ifdef MESHWIT_HAVE_CUDA
#include "gpu_test.h"

#define B 4
#define T 24
#define VP 128

static const gpt2_config cfg = {
    .layers = 2, .heads = 4, .channels = 64, .max_seq = 32, .vocab = 100, .padded_vocab = VP};

Test(gpu_trainer, kv_cache_decoding_equals_the_cpu_full_forward) {
    need_gpu();
    /* The full pass on the CPU: its logits at every position. */
    mw_graph *g;
    OK(mw_graph_new(&g));
    mw_graph_set_seed(g, 3);
    gpt2_graph m;
    OK(gpt2_build(g, &cfg, &(gpt2_layout){.batch = B, .seq = T}, &m));
    mw_mesh *cpu;
    OK(mw_mesh_new("cpu:1", "X", &cpu));
    mw_trainer_config tc = {.optimizer = {MW_SGD, .lr = 0.0f}, .outputs = &m.logits, .noutputs = 1};
    mw_trainer *tr;
    OK(mw_trainer_new(g, m.loss, cpu, &tc, &tr));
    static int32_t tok[B * T], next[B * T];
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)((i * 37 + 11) % cfg.vocab);
    for (int i = 0; i < B * T; i++) next[i] = tok[(i + 1) % (B * T)];
    mw_feed feeds[2] = {{"tokens", tok, B * T}, {"targets", next, B * T}};
    OK(mw_trainer_eval(tr, feeds, 2, NULL));
    static float want[B * T * VP], params[1 << 20];
    OK(mw_trainer_read_output(tr, m.logits, want, B * T * VP));
    int gpus = 0;
    OK(mw__cuda_probe(&gpus));
    static const char *const specs[] = {"cuda:0", "cuda:0,1"};
    for (int k = 0; k < (gpus > 1 ? 2 : 1); k++) {
        mw_graph *dg;
        OK(mw_graph_new(&dg));
        gpt2_graph d;
        OK(gpt2_build(dg, &cfg,
                      &(gpt2_layout){.mode = GPT2_DECODE, .batch = B, .data_axis = k ? "X" : NULL},
                      &d));
        mw_mesh *mesh;
        OK(mw_mesh_new(specs[k], "X", &mesh));
        mw_infer_config ic = {.outputs = &d.logits, .noutputs = 1};
        mw_infer *inf;
        OK(mw_infer_new(dg, mesh, &ic, &inf));
        /* The CPU trainer's weights into the GPU program, parameter by parameter. */
        int np = mw_trainer_param_count(tr);
        for (int i = 0; i < np; i++) {
            mw_param_info p;
            OK(mw_trainer_param_info(tr, i, &p));
            cr_assert(p.count <= (int64_t)(sizeof params / sizeof *params));
            OK(mw_trainer_read_param(tr, p.name, params, p.count));
            OK(mw_infer_write_param(inf, p.name, params, p.count));
        }
        float got[B * VP];
        for (int t = 0; t < T; t++) {
            int32_t st[B], sp[B];
            for (int b = 0; b < B; b++) st[b] = tok[b * T + t], sp[b] = t;
            mw_feed in[2] = {{"tokens", st, B}, {"pos", sp, B}};
            mw_fetch f = {d.logits, got, B * VP};
            OK(mw_infer_run(inf, in, 2, B, &f, 1));
            for (int b = 0; b < B; b++)
                for (int v = 0; v < cfg.vocab; v++) {
                    double w = want[(b * T + t) * VP + v];
                    cr_assert(fabs(got[b * VP + v] - w) <= 1e-4 * (1.0 + fabs(w)),
                              "%s: position %d, sequence %d, logit %d: %.9g vs %.9g", specs[k], t,
                              b, v, got[b * VP + v], w);
                }
        }
        int32_t st[B] = {0}, sp[B] = {0, 0, 40, 0};
        mw_feed in[2] = {{"tokens", st, B}, {"pos", sp, B}};
        mw_fetch f = {d.logits, got, B * VP};
        cr_assert_neq(mw_infer_run(inf, in, 2, B, &f, 1), MW_OK);
        cr_assert(strstr(mw_last_error(), "outside"), "%s", mw_last_error());
        mw_infer_free(inf);
        mw_mesh_free(mesh);
        mw_graph_free(dg);
    }
    mw_trainer_free(tr);
    mw_mesh_free(cpu);
    mw_graph_free(g);
}

#endif
