/* Bench case "sample": generating text from llm.c's GPT-2 (4 layers, 4 heads, 256 channels,
 * vocab 256; context 512 here, so that the whole sample fits one window) on one sequence: 256
 * tokens at temperature 0 after a 16-token prompt, through the key/value cache (one position
 * per run of the decoding program) and by recomputing the model over the window of every token
 * so far for each new one (a graph of the whole 272-token window, as a program without a cache
 * must do). Rows of case "sample", mode "cache" and "recompute", with tokens_per_s (the 256 new
 * tokens over the whole time, the prompt included) and same_tokens: whether both produced the
 * same tokens. Each --devices spec (default cpu:1) is measured alike. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../examples/common/gpt2_model.h"
#include "bench.h"
#include "meshwit.h"

#define PROMPT 16
#define NEW 256
#define WINDOW (PROMPT + NEW)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int argmax(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

static int fail(const char *what, mw_status st) {
    fprintf(stderr, "sample: %s: %s [%s]: %s\n", what, mw_strerror(st), mw_status_name(st),
            mw_last_error());
    return 1;
}

/* Generates NEW tokens after hist[0, PROMPT) into hist, with a program reading tr's parameters:
 * cached, the decoding step; otherwise the model over the window. Seconds to *secs. */
static int generate(mw_trainer *tr, const gpt2_config *c, int cached, int32_t *hist, double *secs) {
    mw_graph *g = NULL;
    mw_infer *inf = NULL;
    mw_tensor *logits = NULL;
    float *out = malloc((size_t)(cached ? 1 : WINDOW) * (size_t)c->padded_vocab * sizeof *out);
    int32_t *window = calloc(WINDOW, sizeof *window);
    mw_status st = out && window ? mw_graph_new(&g) : MW_ERR_NOMEM;
    if (st == MW_OK && cached) {
        gpt2_graph d;
        st = gpt2_build(g, c, &(gpt2_layout){.mode = GPT2_DECODE, .batch = 1}, &d);
        logits = d.logits;
    } else if (st == MW_OK) {
        gpt2_graph m;
        st = gpt2_build(g, c, &(gpt2_layout){.batch = 1, .seq = WINDOW}, &m);
        logits = m.logits;
    }
    mw_infer_config ic = {.outputs = &logits, .noutputs = 1};
    if (st == MW_OK) st = mw_infer_from_trainer(tr, g, &ic, &inf);
    int rc = st ? fail("cannot make the program", st) : 0;
    double t0 = now();
    for (int n = PROMPT, pos = 0; rc == 0 && n < WINDOW; n++) {
        const float *next;
        if (cached) {
            for (; pos < n && st == MW_OK; pos++) {
                int32_t tok = hist[pos], p = pos;
                mw_feed in[2] = {{"tokens", &tok, 1}, {"pos", &p, 1}};
                mw_fetch f = {logits, out, c->padded_vocab};
                st = mw_infer_run(inf, in, 2, 1, &f, 1);
            }
            next = out;
        } else {
            memcpy(window, hist, (size_t)n * sizeof *window);
            mw_feed in = {"tokens", window, WINDOW};
            mw_fetch f = {logits, out, (int64_t)WINDOW * c->padded_vocab};
            st = mw_infer_run(inf, &in, 1, 1, &f, 1);
            next = out + (size_t)(n - 1) * (size_t)c->padded_vocab;
        }
        if (st) rc = fail("a run failed", st);
        if (rc == 0) hist[n] = argmax(next, c->vocab);
    }
    *secs = now() - t0;
    mw_infer_free(inf);
    mw_graph_free(g);
    free(out);
    free(window);
    return rc;
}

int mwb_case_sample(mwb_ctx *ctx) {
    const char *specs[8] = {"cpu:1"};
    int nspecs = 1;
    for (int i = 0; i < ctx->ndevices && i < 8; i++) specs[i] = ctx->devices[i];
    if (ctx->ndevices) nspecs = ctx->ndevices < 8 ? ctx->ndevices : 8;
    gpt2_config c = {.layers = 4,
                     .heads = 4,
                     .channels = ctx->quick ? 64 : 256,
                     .max_seq = 512,
                     .vocab = 256,
                     .padded_vocab = 256};
    printf("GPT-2 L%d H%d C%d (vocab %d, context %d), one sequence: %d tokens at temperature 0 "
           "after a %d-token prompt\n",
           c.layers, c.heads, c.channels, c.vocab, c.max_seq, NEW, PROMPT);
    printf("%-12s %-10s %12s %12s %14s %s\n", "devices", "mode", "seconds", "tokens/s", "ms/token",
           "same tokens");
    int failed = 0;
    for (int s = 0; s < nspecs; s++) {
        mw_graph *g = NULL;
        mw_mesh *mesh = NULL;
        mw_trainer *tr = NULL;
        gpt2_graph m;
        mw_status st = mw_graph_new(&g);
        if (st == MW_OK) mw_graph_set_seed(g, 7);
        if (st == MW_OK) st = gpt2_build(g, &c, &(gpt2_layout){.batch = 1, .seq = 16}, &m);
        if (st == MW_OK) st = mw_mesh_new(specs[s], "X", &mesh);
        mw_trainer_config tc = {.optimizer = {MW_SGD, .lr = 0.0f}};
        if (st == MW_OK) st = mw_trainer_new(g, m.loss, mesh, &tc, &tr);
        if (st) {
            failed |= fail(specs[s], st);
        } else {
            int32_t hist[2][WINDOW];
            double secs[2] = {0, 0};
            for (int k = 0; k < 2; k++) {
                for (int i = 0; i < PROMPT; i++) hist[k][i] = (int32_t)("the prompt, 16 b"[i]);
                failed |= generate(tr, &c, k == 0, hist[k], &secs[k]);
            }
            int same = memcmp(hist[0], hist[1], sizeof hist[0]) == 0;
            for (int k = 0; k < 2 && !failed; k++) {
                double tps = NEW / secs[k];
                printf("%-12s %-10s %12.3f %12.1f %14.3f %s\n", specs[s], k ? "recompute" : "cache",
                       secs[k], tps, 1e3 * secs[k] / NEW, same ? "yes" : "NO");
                mwb_record rec = {0};
                mwb_record_str(&rec, "case", "sample");
                mwb_record_str(&rec, "devices", specs[s]);
                mwb_record_str(&rec, "mode", k ? "recompute" : "cache");
                mwb_record_num(&rec, "prompt_tokens", PROMPT);
                mwb_record_num(&rec, "new_tokens", NEW);
                mwb_record_num(&rec, "seconds", secs[k]);
                mwb_record_num(&rec, "tokens_per_s", tps);
                mwb_record_num(&rec, "same_tokens", same);
                ctx->emit(ctx, &rec);
            }
            if (!failed && secs[0] > 0)
                printf("%s: the cache samples %.1fx faster per token\n", specs[s],
                       secs[1] / secs[0]);
            if (!same) {
                fprintf(stderr, "sample: %s: the cached and recomputed tokens differ\n", specs[s]);
                failed = 1;
            }
        }
        mw_trainer_free(tr);
        mw_mesh_free(mesh);
        mw_graph_free(g);
    }
    return failed;
}
