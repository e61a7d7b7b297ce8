/* The Llama-family model as named-axis ops (llama_model.h): the sharded and single-device models
 * are the same code; only the inputs' Batch axis and the parameters' splits differ. */
#include "llama_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int llama_preset(const char *name, llama_config *out) {
    llama_config c = {.layers = 4,
                      .heads = 4,
                      .kv_heads = 2,
                      .channels = 128,
                      .head_dim = 32,
                      .hidden = 352,
                      .max_seq = 128,
                      .vocab = 256,
                      .rms_eps = 1e-5f,
                      .rope = {.theta = 10000.0f},
                      .bos_id = -1,
                      .eos_id = -1};
    if (strcmp(name, "tiny") == 0) {
        *out = c;
        return 0;
    }
    if (strcmp(name, "small") == 0) { /* llm.c's GPT-2 size: the bench's llama case */
        c.channels = 256, c.head_dim = 64, c.hidden = 688, c.max_seq = 256;
        *out = c;
        return 0;
    }
    return -1;
}

int llama_config_check(const llama_config *c, char *err, size_t errsize) {
    if (c->layers < 1 || c->heads < 1 || c->kv_heads < 1 || c->channels < 1 || c->head_dim < 1 ||
        c->hidden < 1 || c->max_seq < 1 || c->vocab < 1)
        snprintf(err, errsize,
                 "layers, heads, key/value heads, channels, head size, MLP width, context and "
                 "vocab must be positive");
    else if (c->layers > 4096 || c->channels > 65536 || c->hidden > (1 << 20) ||
             c->head_dim > 4096 || c->heads > 4096 || c->max_seq > (1 << 24) ||
             c->vocab > (1 << 24))
        snprintf(err, errsize, "sizes out of range");
    else if (c->heads % c->kv_heads)
        snprintf(err, errsize,
                 "num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)",
                 c->heads, c->kv_heads);
    else if (c->head_dim % 2)
        snprintf(err, errsize, "the head size (%d) must be even for rotary embeddings",
                 c->head_dim);
    else if (!(c->rms_eps > 0.0f && c->rms_eps < 1.0f))
        snprintf(err, errsize, "rms_norm_eps %g outside (0, 1)", (double)c->rms_eps);
    else if (!(c->rope.theta > 1.0f && isfinite(c->rope.theta)))
        snprintf(err, errsize, "rope_theta %g must be finite and above 1", (double)c->rope.theta);
    else
        return 0;
    return -1;
}

int llama_config_equal(const llama_config *a, const llama_config *b) {
    return a->family == b->family && a->layers == b->layers && a->heads == b->heads &&
           a->kv_heads == b->kv_heads && a->channels == b->channels && a->head_dim == b->head_dim &&
           a->hidden == b->hidden && a->max_seq == b->max_seq && a->vocab == b->vocab &&
           a->rms_eps == b->rms_eps && !a->tied == !b->tied && !a->qkv_bias == !b->qkv_bias &&
           a->rope.theta == b->rope.theta && a->rope.scaling == b->rope.scaling &&
           a->rope.factor == b->rope.factor && a->rope.low_freq_factor == b->rope.low_freq_factor &&
           a->rope.high_freq_factor == b->rope.high_freq_factor &&
           a->rope.original_max_positions == b->rope.original_max_positions;
}

int64_t llama_num_params(const llama_config *c) {
    int64_t C = c->channels, D = c->head_dim, H = c->heads, K = c->kv_heads, F = c->hidden;
    int64_t attn = (H + 2 * K) * D * C + (c->qkv_bias ? (H + 2 * K) * D : 0) + C * H * D;
    int64_t per_layer = 2 * C + attn + 3 * C * F;
    return (int64_t)c->vocab * C * (c->tied ? 1 : 2) + c->layers * per_layer + C;
}

typedef struct tracer {
    mw_graph *g;
    const llama_config *c;
    const char *model_axis, *fsdp_axis;
    char name[64];
} tracer;

static mw_tensor *param(tracer *t, int layer, const char *what, mw_axes axes, mw_init init) {
    if (layer >= 0)
        snprintf(t->name, sizeof t->name, "l%d.%s", layer, what);
    else
        snprintf(t->name, sizeof t->name, "%s", what);
    return mw_param(t->g, t->name, axes, init);
}

/* FSDP's split (gpt2_fsdp_split, as GPT-2's). */
static mw_tensor *own(tracer *t, mw_tensor *p) { return gpt2_fsdp_split(t->g, p, t->fsdp_axis); }

/* Tensor parallelism's split of `axis` over the model axis, then FSDP's. */
static mw_tensor *split(tracer *t, mw_tensor *p, const char *axis) {
    return own(t, t->model_axis ? mw_shard(t->g, p, axis, t->model_axis) : p);
}

static mw_tensor *rmsnorm(tracer *t, mw_tensor *x, int layer, const char *w) {
    mw_tensor *nw =
        own(t, param(t, layer, w, MW_AXES({"Embed", t->c->channels}), MW_INIT_CONST(1.0f)));
    return mw_rmsnorm(t->g, x, nw, "Embed", t->c->rms_eps);
}

static int64_t group(const llama_config *c) { return c->heads / c->kv_heads; }

/* The fused projection to [batch axes..., KvHead, Part = G + 2, HeadDim]. */
static mw_tensor *qkv_of(tracer *t, mw_tensor *x, int layer) {
    const llama_config *c = t->c;
    const int64_t C = c->channels, K = c->kv_heads, D = c->head_dim, P = group(c) + 2;
    mw_tensor *w = split(t,
                         param(t, layer, "qkv",
                               MW_AXES({"KvHead", K}, {"Part", P}, {"HeadDim", D}, {"Embed", C}),
                               MW_INIT_NORMAL(0.02f)),
                         "KvHead");
    mw_tensor *y = mw_dot(t->g, x, w, "Embed");
    if (!c->qkv_bias) return y;
    mw_tensor *b = split(t,
                         param(t, layer, "qkv_bias",
                               MW_AXES({"KvHead", K}, {"Part", P}, {"HeadDim", D}), MW_INIT_ZEROS),
                         "KvHead");
    return mw_add(t->g, y, b);
}

/* Rotary embeddings on the queries and the key of qkv (Part = G + 2), the value copied: one pass
 * (mw_rope's part axis). */
static mw_tensor *rotated(tracer *t, mw_tensor *qkv, const char *seq, mw_tensor *pos) {
    mw_rope_config rc = t->c->rope;
    rc.part_axis = "Part";
    rc.parts = group(t->c) + 1;
    return mw_rope(t->g, qkv, seq, "HeadDim", pos, &rc);
}

static mw_tensor *attention_proj(tracer *t, mw_tensor *y, int layer, const char *out_axes) {
    const llama_config *c = t->c;
    const int64_t C = c->channels, K = c->kv_heads, D = c->head_dim;
    mw_tensor *w =
        split(t,
              param(t, layer, "o",
                    MW_AXES({"Out", C}, {"KvHead", K}, {"Group", group(c)}, {"HeadDim", D}),
                    MW_INIT_NORMAL(0.02f / sqrtf(2.0f * (float)c->layers))),
              "KvHead");
    return mw_contract(t->g, y, w, out_axes);
}

static float attention_scale(const llama_config *c) { return 1.0f / sqrtf((float)c->head_dim); }

static mw_tensor *mlp(tracer *t, mw_tensor *x, int layer) {
    const llama_config *c = t->c;
    const int64_t C = c->channels, F = c->hidden;
    mw_graph *g = t->g;
    mw_tensor *gu =
        split(t,
              param(t, layer, "gate_up", MW_AXES({"Part", 2}, {"Hidden", F}, {"Embed", C}),
                    MW_INIT_NORMAL(0.02f)),
              "Hidden");
    mw_tensor *down = split(t,
                            param(t, layer, "down", MW_AXES({"Out", C}, {"Hidden", F}),
                                  MW_INIT_NORMAL(0.02f / sqrtf(2.0f * (float)c->layers))),
                            "Hidden");
    return mw_dot(g, mw_swiglu(g, mw_dot(g, x, gu, "Embed"), "Part"), down, "Hidden");
}

/* The output head: the token embedding (tied) or lm_head. */
static mw_tensor *head(tracer *t, mw_tensor *embed) {
    if (t->c->tied) return embed;
    return own(t,
               param(t, -1, "lm_head", MW_AXES({"Vocab", t->c->vocab}, {"Embed", t->c->channels}),
                     MW_INIT_NORMAL(0.02f)));
}

static mw_status train_model(tracer *t, const gpt2_layout *lo, gpt2_graph *out) {
    mw_graph *g = t->g;
    const llama_config *c = t->c;
    out->tokens = mw_input(g, "tokens", MW_I32, MW_AXES({"Batch", lo->batch}, {"Seq", lo->seq}));
    out->targets = mw_input(g, "targets", MW_I32, MW_AXES({"Batch", lo->batch}, {"Seq", lo->seq}));
    mw_tensor *tokens = out->tokens, *targets = out->targets;
    if (lo->data_axis) {
        tokens = mw_shard(g, tokens, "Batch", lo->data_axis);
        targets = mw_shard(g, targets, "Batch", lo->data_axis);
    }
    mw_tensor *embed =
        own(t, param(t, -1, "embed", MW_AXES({"Vocab", c->vocab}, {"Embed", c->channels}),
                     MW_INIT_NORMAL(0.02f)));
    mw_tensor *x = mw_embedding(g, embed, tokens, "Vocab");
    for (int l = 0; l < c->layers; l++) {
        char block[16];
        snprintf(block, sizeof block, "l%d", l);
        mw_region_begin(g, block);
        mw_tensor *qkv = rotated(t, qkv_of(t, rmsnorm(t, x, l, "attn_norm"), l), "Seq", NULL);
        mw_tensor *y =
            mw_attention_grouped(g, qkv, "Part", "Group", "Seq", "HeadDim", 1, attention_scale(c));
        x = mw_add(g, x, mw_rename(g, attention_proj(t, y, l, "Batch,Seq,Out"), "Out", "Embed"));
        x = mw_add(g, x, mw_rename(g, mlp(t, rmsnorm(t, x, l, "mlp_norm"), l), "Out", "Embed"));
        mw_region_end(g);
    }
    x = rmsnorm(t, x, -1, "norm");
    out->logits = mw_dot(g, x, head(t, embed), "Embed");
    out->loss = mw_mean(g, mw_cross_entropy(g, out->logits, targets, "Vocab", c->vocab), NULL);
    return mw_graph_status(g);
}

/* One decoding step: each sequence's token at its position pos -> the next token's logits, every
 * layer's rotated keys and its values kept in a state. */
static mw_status decode_step(tracer *t, const gpt2_layout *lo, gpt2_graph *out) {
    mw_graph *g = t->g;
    const llama_config *c = t->c;
    const int64_t K = c->kv_heads, D = c->head_dim, G = group(c);
    out->tokens = mw_input(g, "tokens", MW_I32, MW_AXES({"Batch", lo->batch}));
    out->pos = mw_input(g, "pos", MW_I32, MW_AXES({"Batch", lo->batch}));
    mw_tensor *tokens = out->tokens, *pos = out->pos;
    if (lo->data_axis) {
        tokens = mw_shard(g, tokens, "Batch", lo->data_axis);
        pos = mw_shard(g, pos, "Batch", lo->data_axis);
    }
    mw_tensor *embed =
        own(t, param(t, -1, "embed", MW_AXES({"Vocab", c->vocab}, {"Embed", c->channels}),
                     MW_INIT_NORMAL(0.02f)));
    mw_tensor *x = mw_embedding(g, embed, tokens, "Vocab");
    for (int l = 0; l < c->layers; l++) {
        mw_tensor *qkv = qkv_of(t, rmsnorm(t, x, l, "attn_norm"), l); /* [Batch, KvHead, Part, D] */
        mw_tensor *q =
            mw_rope(g, mw_slice(g, qkv, "Part", 0, G, "Group"), NULL, "HeadDim", pos, &c->rope);
        mw_tensor *kv_parts[2] = {
            mw_rope(g, mw_slice(g, qkv, "Part", G, 1, NULL), NULL, "HeadDim", pos, &c->rope),
            mw_slice(g, qkv, "Part", G + 1, 1, NULL)};
        mw_tensor *kv_new =
            mw_permute(g, mw_concat(g, kv_parts, 2, "Part"), "Batch,Part,KvHead,HeadDim");
        char name[32];
        snprintf(name, sizeof name, "l%d.kv", l);
        mw_tensor *kv = mw_state(g, name,
                                 MW_AXES({"Batch", lo->batch}, {"Ctx", c->max_seq}, {"Part", 2},
                                         {"KvHead", K}, {"HeadDim", D}));
        if (lo->data_axis) kv = mw_shard(g, kv, "Batch", lo->data_axis);
        if (lo->model_axis) kv = mw_shard(g, kv, "KvHead", lo->model_axis);
        kv = mw_state_write(g, kv, kv_new, "Ctx", pos);
        mw_tensor *y =
            mw_attention_cached(g, q, kv, "Part", "Ctx", "HeadDim", pos, attention_scale(c));
        x = mw_add(g, x, mw_rename(g, attention_proj(t, y, l, "Batch,Out"), "Out", "Embed"));
        x = mw_add(g, x, mw_rename(g, mlp(t, rmsnorm(t, x, l, "mlp_norm"), l), "Out", "Embed"));
    }
    x = rmsnorm(t, x, -1, "norm");
    out->logits = mw_dot(g, x, head(t, embed), "Embed");
    return mw_graph_status(g);
}

mw_status llama_build(mw_graph *g, const llama_config *c, const gpt2_layout *layout,
                      gpt2_graph *out) {
    tracer t = {.g = g, .c = c, .model_axis = layout->model_axis, .fsdp_axis = layout->fsdp_axis};
    memset(out, 0, sizeof *out);
    return layout->mode == GPT2_DECODE ? decode_step(&t, layout, out)
                                       : train_model(&t, layout, out);
}

mw_status llama_copy_params(mw_trainer *tr, mw_infer *inf, const llama_config *c) {
    (void)c;
    int n = mw_trainer_param_count(tr);
    mw_status st = MW_OK;
    for (int i = 0; i < n && st == MW_OK; i++) {
        mw_param_info info;
        if ((st = mw_trainer_param_info(tr, i, &info)) != MW_OK) break;
        float *buf = malloc((size_t)info.count * sizeof *buf);
        if (!buf) return MW_ERR_NOMEM;
        if ((st = mw_trainer_read_param(tr, info.name, buf, info.count)) == MW_OK)
            st = mw_infer_write_param(inf, info.name, buf, info.count);
        free(buf);
    }
    return st;
}
