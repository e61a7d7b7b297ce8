/* What differs between the model families of the program (gpt2.h's program_family): GPT-2 with
 * llm.c files and Hugging Face GPT-2 safetensors, or the Llama family with Hugging Face
 * safetensors (examples/common/llama_model.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2.h"

/* The Llama-family model: a preset or the --load file's config.json, then the sizes given (a
 * loaded model's must be its own); o->model gets its sizes for the data and sampling code. */
int llama_choose_model(options *o) {
    llama_config *c = &o->llama;
    const sizes *sz = &o->sizes;
    char err[512];
    if (sz->padded_vocab) {
        perr("--padded-vocab: a Llama-family model's vocabulary is not padded\n");
        return -1;
    }
    if (o->load) {
        if (!gpt2_is_safetensors(o->load)) {
            perr("--load %s: llama reads Hugging Face safetensors (model.safetensors with its "
                 "config.json), not llm.c files\n",
                 o->load);
            return -1;
        }
        mw_status st = llama_hf_read_config(o->load, c, err, sizeof err);
        if (st != MW_OK) {
            perr("%s [%s]: %s\n", mw_strerror(st), mw_status_name(st), err);
            return -1;
        }
        if (size_agrees("--layers", sz->layers, c->layers, o->load) ||
            size_agrees("--heads", sz->heads, c->heads, o->load) ||
            size_agrees("--channels", sz->channels, c->channels, o->load) ||
            size_agrees("--context", sz->context, c->max_seq, o->load) ||
            size_agrees("--vocab", sz->vocab, c->vocab, o->load))
            return -1;
        if (o->preset_given) {
            perr("--preset with --load: the model is the file's\n");
            return -1;
        }
    } else {
        if (llama_preset(o->preset, c) != 0) {
            perr("--preset %s: the Llama family's presets are tiny and small\n", o->preset);
            return -1;
        }
        if (o->tok_vocab && !o->preset_given && !sz->vocab) c->vocab = o->tok_vocab;
        if (sz->layers) c->layers = sz->layers;
        if (sz->heads) {
            c->heads = sz->heads;
            if (c->kv_heads > c->heads || c->heads % c->kv_heads) c->kv_heads = c->heads;
        }
        if (sz->channels) c->channels = sz->channels;
        if (sz->heads || sz->channels) c->head_dim = c->channels / c->heads;
        if (sz->context) c->max_seq = sz->context;
        if (sz->vocab) c->vocab = sz->vocab;
    }
    if (llama_config_check(c, err, sizeof err) != 0) {
        perr("bad model size: %s\n", err);
        return -1;
    }
    o->model = (gpt2_config){.layers = c->layers,
                             .heads = c->heads,
                             .channels = c->channels,
                             .max_seq = c->max_seq,
                             .vocab = c->vocab,
                             .padded_vocab = c->vocab};
    return 0;
}

mw_status model_build(const options *o, mw_graph *g, const gpt2_layout *lo, gpt2_graph *m) {
    return o->family == FAMILY_LLAMA ? llama_build(g, &o->llama, lo, m)
                                     : gpt2_build(g, &o->model, lo, m);
}

mw_status model_load(const options *o, mw_trainer *tr, char *err, size_t errsize) {
    if (o->family == FAMILY_LLAMA) return llama_hf_load(tr, &o->llama, o->load, err, errsize);
    gpt2_load_options lo = {.allow_nonfinite = o->allow_nonfinite};
    return gpt2_is_safetensors(o->load) ? gpt2_hf_load(tr, &o->model, o->load, err, errsize)
                                        : gpt2_load(tr, &o->model, o->load, &lo, err, errsize);
}

mw_status model_save(const options *o, mw_trainer *tr, const char *to, char *err, size_t errsize) {
    if (o->family == FAMILY_LLAMA) return llama_hf_save(tr, &o->llama, to, err, errsize);
    return gpt2_is_safetensors(o->save) ? gpt2_hf_save(tr, &o->model, to, err, errsize)
                                        : gpt2_save(tr, &o->model, to, err, errsize);
}

int64_t model_num_params(const options *o) {
    return o->family == FAMILY_LLAMA ? llama_num_params(&o->llama) : gpt2_num_params(&o->model);
}

mw_status model_copy_params(const options *o, mw_trainer *tr, mw_infer *inf) {
    return o->family == FAMILY_LLAMA ? llama_copy_params(tr, inf, &o->llama)
                                     : gpt2_copy_params(tr, inf, &o->model);
}
