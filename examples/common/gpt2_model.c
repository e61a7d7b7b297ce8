/* The GPT-2 model as named-axis ops, one block after another, as in llm.c's train_gpt2.c: the
 * sharded and single-device models are the same code; only the inputs' Batch axis differs. */
#include "gpt2_model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int gpt2_preset(const char *name, gpt2_config *out) {
    static const struct {
        const char *name;
        gpt2_config c;
    } presets[] = {
        {"tiny",
         {.layers = 4,
          .heads = 4,
          .channels = 128,
          .max_seq = 128,
          .vocab = 256,
          .padded_vocab = 256}},
        {"small",
         {.layers = 6,
          .heads = 6,
          .channels = 384,
          .max_seq = 256,
          .vocab = 256,
          .padded_vocab = 256}},
        {"gpt2-124m",
         {.layers = 12,
          .heads = 12,
          .channels = 768,
          .max_seq = 1024,
          .vocab = 50257,
          .padded_vocab = 50304}},
    };
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
        if (strcmp(presets[i].name, name) == 0) {
            *out = presets[i].c;
            return 0;
        }
    return -1;
}

int gpt2_config_check(const gpt2_config *c, char *err, size_t errsize) {
    if (c->layers < 1 || c->heads < 1 || c->channels < 1 || c->max_seq < 1 || c->vocab < 1)
        snprintf(err, errsize, "layers, heads, channels, context and vocab must be positive");
    /* Bounds far beyond any real GPT-2 that keep every size computation within int64 (a damaged
     * file header must not overflow them). */
    else if (c->layers > 4096 || c->channels > 65536 || c->max_seq > (1 << 24) ||
             c->padded_vocab > (1 << 24))
        snprintf(err, errsize,
                 "sizes out of range (layers <= 4096, channels <= 65536, context and "
                 "vocab <= 16777216)");
    else if (c->channels % c->heads)
        snprintf(err, errsize, "channels (%d) must be divisible by heads (%d)", c->channels,
                 c->heads);
    else if (c->padded_vocab < c->vocab)
        snprintf(err, errsize, "padded vocab (%d) is smaller than vocab (%d)", c->padded_vocab,
                 c->vocab);
    else
        return 0;
    return -1;
}

int64_t gpt2_num_params(const gpt2_config *c) {
    int64_t C = c->channels, L = c->layers;
    int64_t per_layer =
        2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
    return (int64_t)c->padded_vocab * C + (int64_t)c->max_seq * C + L * per_layer + 2 * C;
}

/* Shorthands for tracing one model. */
typedef struct tracer {
    mw_graph *g;
    char name[64];
} tracer;

static mw_tensor *param(tracer *t, int layer, const char *what, mw_axes axes, mw_init init) {
    if (layer >= 0)
        snprintf(t->name, sizeof t->name, "h%d.%s", layer, what);
    else
        snprintf(t->name, sizeof t->name, "%s", what);
    return mw_param(t->g, t->name, axes, init);
}

/* x . W^T + b over axis `in`, for W [Out, in] and b [Out], with the result's new axis renamed
 * from Out to `out` (nothing to rename when out is "Out"). */
static mw_tensor *linear(tracer *t, mw_tensor *x, int layer, const char *wname, const char *bname,
                         const char *in, int64_t in_size, const char *out, int64_t out_size,
                         float std) {
    mw_graph *g = t->g;
    mw_tensor *w =
        param(t, layer, wname, MW_AXES({out, out_size}, {in, in_size}), MW_INIT_NORMAL(std));
    mw_tensor *b = param(t, layer, bname, MW_AXES({out, out_size}), MW_INIT_ZEROS);
    return mw_add(g, mw_dot(g, x, w, in), b);
}

static mw_tensor *layernorm(tracer *t, mw_tensor *x, int layer, const char *w, const char *b,
                            int64_t C) {
    mw_tensor *lw = param(t, layer, w, MW_AXES({"Embed", C}), MW_INIT_CONST(1.0f));
    mw_tensor *lb = param(t, layer, b, MW_AXES({"Embed", C}), MW_INIT_ZEROS);
    return mw_layernorm(t->g, x, lw, lb, "Embed", 1e-5f);
}

/* Causal self-attention on qkv [Batch, Seq, QKV=3C] laid out as llm.c's (q, k, v) x heads: the
 * fused kernel reads q, k and v where they lie, per (batch, head). */
static mw_tensor *attention(tracer *t, mw_tensor *qkv, const gpt2_config *c) {
    mw_graph *g = t->g;
    char split[64];
    int hd = c->channels / c->heads;
    snprintf(split, sizeof split, "Part=3,Head=%d,HeadDim=%d", c->heads, hd);
    mw_tensor *parts = mw_split(g, qkv, "QKV", split);
    mw_tensor *y = mw_attention(g, parts, "Part", "Seq", "HeadDim", 1, 1.0f / sqrtf((float)hd));
    return mw_merge(g, y, "Head,HeadDim", "Embed");
}

mw_status gpt2_build(mw_graph *g, const gpt2_config *c, int batch, int seq, const char *mesh_axis,
                     gpt2_graph *out) {
    tracer t = {.g = g};
    const int64_t C = c->channels, L = c->layers;
    const float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)L);
    memset(out, 0, sizeof *out);
    out->tokens = mw_input(g, "tokens", MW_I32, MW_AXES({"Batch", batch}, {"Seq", seq}));
    out->targets = mw_input(g, "targets", MW_I32, MW_AXES({"Batch", batch}, {"Seq", seq}));
    mw_tensor *tokens = out->tokens, *targets = out->targets;
    if (mesh_axis) { /* Batch -> Batch@X: the only change for data parallelism */
        tokens = mw_shard(g, tokens, "Batch", mesh_axis);
        targets = mw_shard(g, targets, "Batch", mesh_axis);
    }
    mw_tensor *wte = param(&t, -1, "wte", MW_AXES({"Vocab", c->padded_vocab}, {"Embed", C}),
                           MW_INIT_NORMAL(std));
    mw_tensor *wpe =
        param(&t, -1, "wpe", MW_AXES({"Ctx", c->max_seq}, {"Embed", C}), MW_INIT_NORMAL(0.01f));
    mw_tensor *x =
        mw_add(g, mw_embedding(g, wte, tokens, "Vocab"), mw_slice(g, wpe, "Ctx", 0, seq, "Seq"));
    for (int l = 0; l < L; l++) {
        mw_tensor *h = layernorm(&t, x, l, "ln1w", "ln1b", C);
        mw_tensor *qkv = linear(&t, h, l, "qkvw", "qkvb", "Embed", C, "QKV", 3 * C, std);
        mw_tensor *a = attention(&t, qkv, c);
        a = linear(&t, a, l, "attprojw", "attprojb", "Embed", C, "Out", C, proj_std);
        x = mw_add(g, x, mw_rename(g, a, "Out", "Embed"));
        h = layernorm(&t, x, l, "ln2w", "ln2b", C);
        h = mw_gelu(g, linear(&t, h, l, "fcw", "fcb", "Embed", C, "Hidden", 4 * C, std));
        h = linear(&t, h, l, "fcprojw", "fcprojb", "Hidden", 4 * C, "Out", C, proj_std);
        x = mw_add(g, x, mw_rename(g, h, "Out", "Embed"));
    }
    x = layernorm(&t, x, -1, "lnfw", "lnfb", C);
    out->logits = mw_dot(g, x, wte, "Embed"); /* the head shares the token embedding */
    out->loss = mw_mean(g, mw_cross_entropy(g, out->logits, targets, "Vocab", c->vocab), NULL);
    return mw_graph_status(g);
}
