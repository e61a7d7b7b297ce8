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
    else if (!(c->ln_eps >= 0.0f && c->ln_eps < 1.0f))
        snprintf(err, errsize, "layer-norm epsilon %g outside [0, 1)", (double)c->ln_eps);
    else if (c->padded_vocab < c->vocab)
        snprintf(err, errsize, "padded vocab (%d) is smaller than vocab (%d)", c->padded_vocab,
                 c->vocab);
    else
        return 0;
    return -1;
}

static float ln_eps(const gpt2_config *c) { return c->ln_eps > 0.0f ? c->ln_eps : 1e-5f; }

int gpt2_config_is_plain(const gpt2_config *c) {
    return ln_eps(c) == 1e-5f && !c->gelu_exact && !c->attn_unscaled && !c->attn_layer_scaled;
}

int gpt2_config_equal(const gpt2_config *a, const gpt2_config *b) {
    return a->layers == b->layers && a->heads == b->heads && a->channels == b->channels &&
           a->max_seq == b->max_seq && a->vocab == b->vocab && a->padded_vocab == b->padded_vocab &&
           ln_eps(a) == ln_eps(b) && !a->gelu_exact == !b->gelu_exact &&
           !a->attn_unscaled == !b->attn_unscaled && !a->attn_layer_scaled == !b->attn_layer_scaled;
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
    const char *model_axis; /* mesh axis the heads and MLP units are split over, or NULL */
    const char *fsdp_axis;  /* mesh axis the parameters are split over (FSDP), or NULL */
    char name[64];
} tracer;

static mw_tensor *param(tracer *t, int layer, const char *what, mw_axes axes, mw_init init) {
    if (layer >= 0)
        snprintf(t->name, sizeof t->name, "h%d.%s", layer, what);
    else
        snprintf(t->name, sizeof t->name, "%s", what);
    return mw_param(t->g, t->name, axes, init);
}

mw_tensor *gpt2_fsdp_split(mw_graph *g, mw_tensor *p, const char *fsdp_axis) {
    if (!fsdp_axis || !p || mw_tensor_numel(p) < GPT2_FSDP_MIN_ELEMS) return p;
    const char *best = NULL, *name, *mesh;
    int64_t best_size = 0, size;
    for (int i = 0; i < mw_tensor_rank(p); i++)
        if (mw_tensor_axis(p, i, &name, &size, &mesh) == MW_OK && !mesh && size > best_size)
            best = name, best_size = size;
    return best ? mw_shard(g, p, best, fsdp_axis) : p;
}

static mw_tensor *own(tracer *t, mw_tensor *p) { return gpt2_fsdp_split(t->g, p, t->fsdp_axis); }

/* p with axis `axis` split over the model axis (tensor parallelism), or p as it is; then FSDP's
 * split (own). */
static mw_tensor *split(tracer *t, mw_tensor *p, const char *axis) {
    return own(t, t->model_axis ? mw_shard(t->g, p, axis, t->model_axis) : p);
}

static mw_tensor *layernorm(tracer *t, mw_tensor *x, int layer, const char *w, const char *b,
                            const gpt2_config *c) {
    int64_t C = c->channels;
    mw_tensor *lw = own(t, param(t, layer, w, MW_AXES({"Embed", C}), MW_INIT_CONST(1.0f)));
    mw_tensor *lb = own(t, param(t, layer, b, MW_AXES({"Embed", C}), MW_INIT_ZEROS));
    return mw_layernorm(t->g, x, lw, lb, "Embed", ln_eps(c));
}

/* Causal self-attention, with llm.c's weights: qkvw [QKV=3C, Embed] holds (q, k, v) x heads x
 * head dimension, so it is declared [Part=3, Head, HeadDim, Embed] (the same values in the same
 * order), and attprojw [Out, Embed=(Head, HeadDim)] as [Out, Head, HeadDim]. The heads are
 * independent, so splitting Head over the model axis gives each device whole heads: the
 * projection contracts Head, and its partial sums are all-reduced before the bias is added. */
static mw_tensor *qkv_of(tracer *t, mw_tensor *x, int layer, const gpt2_config *c, float std) {
    mw_graph *g = t->g;
    const int64_t C = c->channels, H = c->heads, D = c->channels / c->heads;
    mw_tensor *w = split(t,
                         param(t, layer, "qkvw",
                               MW_AXES({"Part", 3}, {"Head", H}, {"HeadDim", D}, {"Embed", C}),
                               MW_INIT_NORMAL(std)),
                         "Head");
    mw_tensor *b = split(
        t,
        param(t, layer, "qkvb", MW_AXES({"Part", 3}, {"Head", H}, {"HeadDim", D}), MW_INIT_ZEROS),
        "Head");
    return mw_add(g, mw_dot(g, x, w, "Embed"), b); /* [Batch, (Seq,) Part, Head, HeadDim] */
}

static float attention_scale(const gpt2_config *c, int layer) {
    float scale = c->attn_unscaled ? 1.0f : 1.0f / sqrtf((float)(c->channels / c->heads));
    return c->attn_layer_scaled ? scale / (float)(layer + 1) : scale;
}

/* The projection of the heads' outputs y [..., Head, HeadDim] back to Out. */
static mw_tensor *attention_proj(tracer *t, mw_tensor *y, int layer, const gpt2_config *c,
                                 float proj_std, const char *out_axes) {
    mw_graph *g = t->g;
    const int64_t C = c->channels, H = c->heads, D = c->channels / c->heads;
    mw_tensor *pw =
        split(t,
              param(t, layer, "attprojw", MW_AXES({"Out", C}, {"Head", H}, {"HeadDim", D}),
                    MW_INIT_NORMAL(proj_std)),
              "Head");
    mw_tensor *pb = own(t, param(t, layer, "attprojb", MW_AXES({"Out", C}), MW_INIT_ZEROS));
    return mw_add(g, mw_contract(g, y, pw, out_axes), pb);
}

static mw_tensor *attention(tracer *t, mw_tensor *x, int layer, const gpt2_config *c, float std,
                            float proj_std) {
    mw_tensor *qkv = qkv_of(t, x, layer, c, std);
    mw_tensor *y = mw_attention(t->g, qkv, "Part", "Seq", "HeadDim", 1, attention_scale(c, layer));
    return attention_proj(t, y, layer, c, proj_std, "Batch,Seq,Out");
}

/* The MLP: fcw [Hidden=4C, Embed] and fcprojw [Out, Hidden]; splitting Hidden over the model
 * axis is Megatron's column- then row-parallel pair. */
static mw_tensor *mlp(tracer *t, mw_tensor *x, int layer, const gpt2_config *c, float std,
                      float proj_std) {
    mw_graph *g = t->g;
    const int64_t C = c->channels;
    mw_tensor *w = split(
        t, param(t, layer, "fcw", MW_AXES({"Hidden", 4 * C}, {"Embed", C}), MW_INIT_NORMAL(std)),
        "Hidden");
    mw_tensor *b =
        split(t, param(t, layer, "fcb", MW_AXES({"Hidden", 4 * C}), MW_INIT_ZEROS), "Hidden");
    mw_tensor *pre = mw_add(g, mw_dot(g, x, w, "Embed"), b);
    mw_tensor *h = c->gelu_exact ? mw_gelu_erf(g, pre) : mw_gelu(g, pre);
    mw_tensor *pw = split(t,
                          param(t, layer, "fcprojw", MW_AXES({"Out", C}, {"Hidden", 4 * C}),
                                MW_INIT_NORMAL(proj_std)),
                          "Hidden");
    mw_tensor *pb = own(t, param(t, layer, "fcprojb", MW_AXES({"Out", C}), MW_INIT_ZEROS));
    return mw_add(g, mw_dot(g, h, pw, "Hidden"), pb);
}

/* The model for training: [Batch, Seq] tokens -> logits -> the mean cross-entropy against the
 * targets. */
static mw_status train_model(tracer *t, const gpt2_config *c, const gpt2_layout *lo,
                             gpt2_graph *out) {
    mw_graph *g = t->g;
    const int64_t C = c->channels, L = c->layers;
    const float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)L);
    out->tokens = mw_input(g, "tokens", MW_I32, MW_AXES({"Batch", lo->batch}, {"Seq", lo->seq}));
    out->targets = mw_input(g, "targets", MW_I32, MW_AXES({"Batch", lo->batch}, {"Seq", lo->seq}));
    mw_tensor *tokens = out->tokens, *targets = out->targets;
    if (lo->data_axis) { /* Batch -> Batch@X: the only change for data parallelism */
        tokens = mw_shard(g, tokens, "Batch", lo->data_axis);
        targets = mw_shard(g, targets, "Batch", lo->data_axis);
    }
    mw_tensor *wte = own(t, param(t, -1, "wte", MW_AXES({"Vocab", c->padded_vocab}, {"Embed", C}),
                                  MW_INIT_NORMAL(std)));
    mw_tensor *wpe = own(
        t, param(t, -1, "wpe", MW_AXES({"Ctx", c->max_seq}, {"Embed", C}), MW_INIT_NORMAL(0.01f)));
    mw_tensor *x = mw_add(g, mw_embedding(g, wte, tokens, "Vocab"),
                          mw_slice(g, wpe, "Ctx", 0, lo->seq, "Seq"));
    for (int l = 0; l < L; l++) {
        /* Each block a region: a trainer may recompute its activations in backward. */
        char block[16];
        snprintf(block, sizeof block, "h%d", l);
        mw_region_begin(g, block);
        mw_tensor *a = attention(t, layernorm(t, x, l, "ln1w", "ln1b", c), l, c, std, proj_std);
        x = mw_add(g, x, mw_rename(g, a, "Out", "Embed"));
        mw_tensor *h = mlp(t, layernorm(t, x, l, "ln2w", "ln2b", c), l, c, std, proj_std);
        x = mw_add(g, x, mw_rename(g, h, "Out", "Embed"));
        mw_region_end(g);
    }
    x = layernorm(t, x, -1, "lnfw", "lnfb", c);
    out->logits = mw_dot(g, x, wte, "Embed"); /* the head shares the token embedding */
    out->loss = mw_mean(g, mw_cross_entropy(g, out->logits, targets, "Vocab", c->vocab), NULL);
    return mw_graph_status(g);
}

/* One decoding step: the token at each sequence's position pos -> the next token's logits, with
 * every layer's keys and values of the positions so far in a state. */
static mw_status decode_step(tracer *t, const gpt2_config *c, const gpt2_layout *lo,
                             gpt2_graph *out) {
    mw_graph *g = t->g;
    const int64_t C = c->channels, L = c->layers, H = c->heads, D = c->channels / c->heads;
    const float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)L);
    out->tokens = mw_input(g, "tokens", MW_I32, MW_AXES({"Batch", lo->batch}));
    out->pos = mw_input(g, "pos", MW_I32, MW_AXES({"Batch", lo->batch}));
    mw_tensor *tokens = out->tokens, *pos = out->pos;
    if (lo->data_axis) {
        tokens = mw_shard(g, tokens, "Batch", lo->data_axis);
        pos = mw_shard(g, pos, "Batch", lo->data_axis);
    }
    mw_tensor *wte = own(t, param(t, -1, "wte", MW_AXES({"Vocab", c->padded_vocab}, {"Embed", C}),
                                  MW_INIT_NORMAL(std)));
    mw_tensor *wpe = own(
        t, param(t, -1, "wpe", MW_AXES({"Ctx", c->max_seq}, {"Embed", C}), MW_INIT_NORMAL(0.01f)));
    mw_tensor *x =
        mw_add(g, mw_embedding(g, wte, tokens, "Vocab"), mw_embedding(g, wpe, pos, "Ctx"));
    for (int l = 0; l < L; l++) {
        mw_tensor *qkv = qkv_of(t, layernorm(t, x, l, "ln1w", "ln1b", c), l, c, std);
        /* This position's keys and values join the cache at pos; the query reads 0..pos. */
        char name[32];
        snprintf(name, sizeof name, "h%d.kv", l);
        mw_tensor *kv = mw_state(g, name,
                                 MW_AXES({"Batch", lo->batch}, {"Ctx", c->max_seq}, {"Part", 2},
                                         {"Head", H}, {"HeadDim", D}));
        if (lo->data_axis) kv = mw_shard(g, kv, "Batch", lo->data_axis);
        if (lo->model_axis) kv = mw_shard(g, kv, "Head", lo->model_axis);
        kv = mw_state_write(g, kv, mw_slice(g, qkv, "Part", 1, 2, NULL), "Ctx", pos);
        mw_tensor *y = mw_attention_cached(g, mw_select(g, qkv, "Part", 0), kv, "Part", "Ctx",
                                           "HeadDim", pos, attention_scale(c, l));
        x = mw_add(g, x,
                   mw_rename(g, attention_proj(t, y, l, c, proj_std, "Batch,Out"), "Out", "Embed"));
        mw_tensor *h = mlp(t, layernorm(t, x, l, "ln2w", "ln2b", c), l, c, std, proj_std);
        x = mw_add(g, x, mw_rename(g, h, "Out", "Embed"));
    }
    x = layernorm(t, x, -1, "lnfw", "lnfb", c);
    out->logits = mw_dot(g, x, wte, "Embed"); /* [Batch, Vocab] */
    return mw_graph_status(g);
}

mw_status gpt2_build(mw_graph *g, const gpt2_config *c, const gpt2_layout *layout,
                     gpt2_graph *out) {
    tracer t = {.g = g, .model_axis = layout->model_axis, .fsdp_axis = layout->fsdp_axis};
    memset(out, 0, sizeof *out);
    return layout->mode == GPT2_DECODE ? decode_step(&t, c, layout, out)
                                       : train_model(&t, c, layout, out);
}
