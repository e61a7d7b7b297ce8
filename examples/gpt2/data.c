/* The gpt2 program's inputs: the data (a file, or the default corpus; encoded with --tokenizer),
 * its train/validation split, the sample's prompt, and every file checked before the first step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2.h"

/* The default corpus (bytes) as text through the tokenizer. */
static mw_status encode_corpus(run *r) {
    size_t len = (size_t)r->data.count, n = 0, cap = mw_tokenizer_max_ids(r->tok, len);
    char *text = malloc(len + 1);
    int32_t *ids = malloc((cap ? cap : 1) * sizeof *ids);
    mw_status st = text && ids ? MW_OK : MW_ERR_NOMEM;
    for (size_t i = 0; st == MW_OK && i < len; i++) text[i] = (char)r->data.ids[i];
    if (st == MW_OK) st = mw_tokenizer_encode(r->tok, text, len, ids, cap, &n);
    uint16_t *narrow = st == MW_OK ? malloc((n ? n : 1) * sizeof *narrow) : NULL;
    if (st == MW_OK && !narrow) st = MW_ERR_NOMEM;
    if (st == MW_OK && mw_tokenizer_vocab_size(r->tok) > 65536)
        st = MW_ERR_UNSUPPORTED; /* its ids do not fit the token data's uint16 */
    for (size_t i = 0; st == MW_OK && i < n; i++) narrow[i] = (uint16_t)ids[i];
    if (st == MW_OK) {
        gpt2_tokens_free(&r->data);
        r->data = (gpt2_tokens){narrow, (int64_t)n, 1};
        narrow = NULL;
    }
    free(narrow);
    free(text);
    free(ids);
    return st;
}

/* Loads or generates the data and splits it; checks every token against the vocabulary and that
 * the sets hold a batch. Returns 0 or the exit status. */
int prepare_data(run *r) {
    const options *o = &r->o;
    char err[512];
    mw_status st;
    if (o->data && r->tok && gpt2_data_detect(o->data, o->format) == GPT2_DATA_TEXT) {
        double secs = 0;
        st = gpt2_tokens_encode_text(o->data, r->tok, &r->data, &secs, err, sizeof err);
        if (st != MW_OK) return fail_msg(st, err);
        printf("encoded %s with %s: %lld tokens in %.2f s\n", o->data, o->tokenizer,
               (long long)r->data.count, secs);
    } else if (o->data) {
        st = gpt2_tokens_load(o->data, o->format, &r->data, err, sizeof err);
        if (st != MW_OK) return fail_msg(st, err);
        r->byte_level = !r->tok && gpt2_data_detect(o->data, o->format) == GPT2_DATA_TEXT;
    } else {
        st = gpt2_corpus_generate(GPT2_CORPUS_SEED, GPT2_CORPUS_BYTES, &r->data);
        if (st != MW_OK) return fail_msg(st, "cannot generate the default corpus");
        r->corpus = 1;
        r->byte_level = !r->tok;
        if (r->tok && (st = encode_corpus(r)) != MW_OK)
            return fail(st, "cannot encode the default corpus with --tokenizer");
    }
    if (o->val_data && r->tok && gpt2_data_detect(o->val_data, o->format) == GPT2_DATA_TEXT) {
        st = gpt2_tokens_encode_text(o->val_data, r->tok, &r->val_file, NULL, err, sizeof err);
        if (st != MW_OK) return fail_msg(st, err);
        r->train = (gpt2_tokens){r->data.ids, r->data.count, 0};
        r->val = (gpt2_tokens){r->val_file.ids, r->val_file.count, 0};
    } else if (o->val_data) {
        st = gpt2_tokens_load(o->val_data, o->format, &r->val_file, err, sizeof err);
        if (st != MW_OK) return fail_msg(st, err);
        r->train = (gpt2_tokens){r->data.ids, r->data.count, 0};
        r->val = (gpt2_tokens){r->val_file.ids, r->val_file.count, 0};
    } else if (o->eval_only && o->data) {
        r->val = (gpt2_tokens){r->data.ids, r->data.count, 0}; /* the whole file is evaluated */
    } else {
        gpt2_tokens_split(&r->data, VAL_FRACTION, &r->train, &r->val);
    }
    const char *data_name = o->data ? o->data : "the default corpus";
    const char *val_name = o->val_data ? o->val_data : "the validation data";
    if (!o->eval_only) {
        st = gpt2_tokens_check_vocab(&r->train, o->model.vocab, data_name, err, sizeof err);
        if (st != MW_OK) {
            fail_msg(st, err);
            if (!r->byte_level) perr("(GPT-2 tokens need --preset gpt2-124m or --vocab 50257)\n");
            return 2;
        }
        st = gpt2_batch_check(&r->train, o->batch, o->seq, !o->sequential, data_name, err,
                              sizeof err);
        if (st != MW_OK) return fail_msg(st, err);
    }
    if (o->eval_only || o->val_every > 0) {
        st = gpt2_tokens_check_vocab(&r->val, o->model.vocab, val_name, err, sizeof err);
        if (st == MW_OK)
            st = gpt2_batch_check(&r->val, o->batch, o->seq, 0, val_name, err, sizeof err);
        if (st != MW_OK) {
            fail_msg(st, err);
            if (!o->eval_only && !o->val_data)
                perr("(the last 10%% of %s is held out for validation; give "
                     "--val-data, smaller --batch/--seq, or --val-every 0)\n",
                     data_name);
            return 2;
        }
    }
    return 0;
}

/* The sample's first tokens, made (and checked against the vocabulary) before training: the
 * --prompt's bytes, or its tokens through --tokenizer, or <|endoftext|>. 0, or the exit status
 * (reported). */
int prepare_prompt(run *r) {
    const options *o = &r->o;
    const int V = o->model.vocab;
    size_t len = strlen(o->prompt), cap = (r->tok ? mw_tokenizer_max_ids(r->tok, len) : len) + 1;
    if (!(r->prompt = malloc(cap * sizeof *r->prompt))) return fail(MW_ERR_NOMEM, "--prompt");
    if (r->tok && strcmp(o->prompt, "\n") != 0) {
        size_t got = 0;
        mw_status st = mw_tokenizer_encode(r->tok, o->prompt, len, r->prompt, cap, &got);
        if (st != MW_OK) return fail(st, "cannot encode --prompt");
        r->prompt_len = (int)got;
    } else if (r->tok) { /* no prompt: the tokenizer's <|endoftext|>, else token 0 */
        int32_t eot = 0;
        if (mw_tokenizer_token_id(r->tok, "<|endoftext|>", &eot) != MW_OK) eot = 0;
        r->prompt[r->prompt_len++] = eot;
    } else if (r->byte_level) {
        for (size_t i = 0; i < len; i++) {
            int b = (unsigned char)o->prompt[i];
            if (b >= V) {
                perr("--prompt byte %zu is 0x%02x (%d), outside the model's vocabulary "
                     "of %d tokens (--vocab): the model has no token for it (give a prompt "
                     "of bytes below %d, or a larger --vocab)\n",
                     i + 1, b, b, V, V);
                return 2;
            }
            r->prompt[r->prompt_len++] = b;
        }
    } else {
        r->prompt[r->prompt_len++] = V == 50257 ? 50256 : 0; /* GPT-2's <|endoftext|> */
    }
    return 0;
}

/* The token that ends the sample: --eos, checked against the vocabulary, or for auto the
 * tokenizer's <|endoftext|> (when it has one), GPT-2's 50256 for its token data, else none. 0, or
 * the exit status (reported). */
int prepare_eos(run *r) {
    const options *o = &r->o;
    const int V = o->model.vocab;
    r->eos = -1;
    if (o->eos >= 0) {
        if (o->eos >= V) {
            perr("--eos %d is not a token of the model's vocabulary of %d (give an id "
                 "below %d, auto or none)\n",
                 o->eos, V, V);
            return 2;
        }
        r->eos = o->eos;
    } else if (o->eos == EOS_AUTO && r->tok) {
        int32_t id;
        if (mw_tokenizer_token_id(r->tok, "<|endoftext|>", &id) == MW_OK) r->eos = id;
    } else if (o->eos == EOS_AUTO && !r->byte_level && V == 50257) {
        r->eos = 50256;
    }
    return 0;
}

void print_setup(const run *r) {
    const options *o = &r->o;
    const gpt2_config *c = &o->model;
    printf("meshwit %s, cpu: %s\n", mw_version(), mw_backend_describe("cpu"));
    if (*mw_backend_warning("cpu")) printf("warning: %s\n", mw_backend_warning("cpu"));
    printf("%s\n", mw_mesh_describe(r->mesh));
    const llama_config *l = &o->llama;
    if (o->family == FAMILY_LLAMA)
        printf("model: %s, %d layers, %d heads (%d key/value), head size %d, %d channels, MLP %d, "
               "context %d, vocab %d, rope theta %g%s, %s head: %lld parameters\n",
               l->family == LLAMA_FAMILY_QWEN2     ? "qwen2"
               : l->family == LLAMA_FAMILY_MISTRAL ? "mistral"
                                                   : "llama",
               l->layers, l->heads, l->kv_heads, l->head_dim, l->channels, l->hidden, l->max_seq,
               l->vocab, (double)l->rope.theta,
               l->rope.scaling == MW_ROPE_SCALING_LLAMA3 ? " (llama3 scaling)" : "",
               l->tied ? "tied" : "untied", (long long)model_num_params(o));
    else
        printf("model: %d layers, %d heads, %d channels, context %d, vocab %d (padded %d): %lld "
               "parameters\n",
               c->layers, c->heads, c->channels, c->max_seq, c->vocab, c->padded_vocab,
               (long long)model_num_params(o));
    const char *name = o->data ? o->data : "default corpus (arithmetic lines, generated)";
    printf("data: %s, %s, %lld tokens", name,
           r->byte_level ? "bytes"
           : r->tok      ? "tokens of --tokenizer"
                         : "llm.c tokens",
           (long long)r->data.count);
    if (o->eval_only) {
        printf("; evaluating %lld tokens\n", (long long)r->val.count);
    } else {
        printf("; train %lld, val %lld%s\n", (long long)r->train.count, (long long)r->val.count,
               o->val_data ? " (--val-data)" : " (held out)");
        printf("unigram entropy (the loss of a model that knows only token frequencies): train "
               "%.4f, val %.4f nats/token\n",
               gpt2_tokens_entropy(&r->train), gpt2_tokens_entropy(&r->val));
        char micro[80] = "";
        if (o->micro_batches > 1)
            snprintf(micro, sizeof micro, " in %d micro-batches of %d", o->micro_batches,
                     o->batch / o->micro_batches);
        printf("batch %d x %d (%s windows)%s, %d steps, AdamW lr %g (%s, warm-up %d), grad clip "
               "%g\n",
               o->batch, o->seq, o->sequential ? "sequential" : "random", micro, o->steps, o->lr,
               o->cosine ? "cosine" : "constant", o->warmup, o->grad_clip);
    }
    fflush(stdout);
}

/* Every file of the run is checked before the first step, through the library's discipline
 * (meshwit/file.h): inputs are regular files, outputs are no input and no other output, no FIFO,
 * device or folder, in a folder that takes a new file and with room for them (an output that
 * cannot be written is said now, not after the training it would hold). 0, or -1 reported. */
int check_files(const run *r) {
    const options *o = &r->o;
    const int64_t params = model_num_params(o) * (int64_t)sizeof(float);
    int save = o->save && mw_distributed_rank() == 0; /* rank 0 alone writes --save */
    int hf_save = save && gpt2_is_safetensors(o->save);
    char cfg[4200];
    mw_file_set *fs;
    mw_status st = mw_file_set_new(&fs);
    if (!st && o->load) st = mw_file_set_add_input(fs, o->load, "--load", 0);
    /* A .safetensors --load is read with its config.json, an input too, unless a .safetensors
     * --save writes that config.json (it must then describe this very model: checked below). */
    if (!st && o->load && gpt2_is_safetensors(o->load) && !hf_save &&
        gpt2_hf_config_path(o->load, cfg, sizeof cfg) == 0)
        st = mw_file_set_add_input(fs, cfg, "--load's config.json", 0);
    if (!st && o->data) st = mw_file_set_add_input(fs, o->data, "--data", 0);
    if (!st && o->val_data) st = mw_file_set_add_input(fs, o->val_data, "--val-data", 0);
    for (int i = 0; !st && mw_tokenizer_file(r->tok, i); i++)
        st = mw_file_set_add_input(fs, mw_tokenizer_file(r->tok, i), "--tokenizer", 0);
    if (!st && save) st = mw_file_set_add_output(fs, o->save, "--save", 0, params + 1024);
    if (!st && hf_save && gpt2_hf_config_path(o->save, cfg, sizeof cfg) == 0)
        st = mw_file_set_add_output(fs, cfg, "--save's config.json", 0, 0);
    /* A resumed checkpoint is read, then replaced: an output only (read only by --eval-only). */
    if (!st && o->checkpoint && o->eval_only)
        st = mw_file_set_add_input(fs, o->checkpoint, "--checkpoint", 0);
    else if (!st && o->checkpoint)
        st = mw_file_set_add_output(fs, o->checkpoint, "--checkpoint", 0, 3 * params + (1 << 16));
    mw_file_set_free(fs);
    if (st) {
        perr("%s\n", mw_last_error());
        return -1;
    }
    char err[1024];
    if (o->family == FAMILY_LLAMA && save && !hf_save) {
        perr("--save %s: llama writes Hugging Face safetensors (name it model.safetensors)\n",
             o->save);
        return -1;
    }
    if (o->family == FAMILY_LLAMA && hf_save &&
        llama_hf_check_save(o->save, &o->llama, err, sizeof err) != MW_OK) {
        perr("%s\n", err);
        return -1;
    }
    if (o->family == FAMILY_GPT2 && hf_save &&
        gpt2_hf_check_save(o->save, &o->model, err, sizeof err) != MW_OK) {
        perr("%s\n", err);
        return -1;
    }
    if (o->family == FAMILY_GPT2 && save && !hf_save && !gpt2_config_is_plain(&o->model)) {
        perr("--save %s: llm.c's format holds GPT-2's layer-norm epsilon, tanh GELU "
             "and attention scale only, and this model differs (save it as .safetensors)\n",
             o->save);
        return -1;
    }
    return 0;
}
