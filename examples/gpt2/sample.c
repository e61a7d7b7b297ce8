/* The gpt2 program's sampling: an inference program reading the trained parameters, fed the
 * prompt and then its own tokens, each drawn by the library's sampler (meshwit/sample.h: as
 * Hugging Face's generate samples, with --temperature, --top-k, --top-p and --seed) until --sample
 * tokens or the --eos token. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2.h"

/* A byte as itself, except control characters other than newline and tab, which could upset the
 * terminal; a BPE token as its id. */
static void print_token(int token, int byte_level) {
    if (!byte_level)
        printf("%d ", token);
    else if ((token < 0x20 && token != '\n' && token != '\t') || token == 0x7f)
        printf("\\x%02x", token);
    else
        putchar(token);
}

/* A token as its text (the bytes the tokenizer decodes it to; a token's bytes do not depend on
 * its neighbours, so printing them one by one prints the text). */
static void print_text_token(const mw_tokenizer *tok, int32_t id) {
    char buf[256];
    size_t len = 0;
    if (mw_tokenizer_decode(tok, &id, 1, buf, sizeof buf, &len) == MW_OK)
        fwrite(buf, 1, len, stdout);
    else
        printf("<%d>", (int)id);
}

/* What produces the logits of the next token: a decoding program with a key/value cache (one
 * position per run), or the model over the whole window each time (--sample-recompute). */
typedef struct sampler {
    int cached, window, at; /* at: positions in the cache (cached) */
    int start, fed;         /* the context's first token in the history; tokens seen so far */
    mw_graph *g;
    mw_infer *inf;
    mw_tensor *logits;
    int32_t *tokens; /* recompute: the window */
    float *out;      /* recompute: window x Vp logits; cached: Vp */
} sampler;

static mw_status sampler_open(run *r, sampler *s) {
    const options *o = &r->o;
    const gpt2_config *c = &o->model;
    memset(s, 0, sizeof *s);
    s->cached = !o->sample_recompute;
    s->window = o->seq;
    s->tokens = calloc((size_t)s->window, sizeof *s->tokens);
    s->out = malloc((size_t)(s->cached ? 1 : s->window) * (size_t)c->padded_vocab * sizeof *s->out);
    mw_status st = s->tokens && s->out ? mw_graph_new(&s->g) : MW_ERR_NOMEM;
    if (st == MW_OK && s->cached) {
        gpt2_graph d;
        st = model_build(
            o, s->g, &(gpt2_layout){.mode = GPT2_DECODE, .batch = 1, .model_axis = o->model_axis},
            &d);
        s->logits = d.logits;
    } else if (st == MW_OK) {
        gpt2_graph m;
        st = model_build(
            o, s->g, &(gpt2_layout){.batch = 1, .seq = s->window, .model_axis = o->model_axis}, &m);
        s->logits = m.logits;
    }
    if (st == MW_OK) {
        mw_infer_config ic = {.outputs = &s->logits,
                              .noutputs = 1,
                              .precision = o->bf16 ? MW_PRECISION_BF16 : MW_PRECISION_FP32};
        /* FSDP splits the trainer's parameters over the data axis, which a sequence at a time
         * cannot shard, and a pipeline holds them in stages: the program holds them whole,
         * copied from the trainer. */
        if ((o->shard_params && o->data_axis[0]) || o->pipeline_axis) {
            st = mw_infer_new(s->g, r->mesh, &ic, &s->inf);
            if (st == MW_OK) st = model_copy_params(o, r->tr, s->inf);
        } else {
            st = mw_infer_from_trainer(r->tr, s->g, &ic, &s->inf);
        }
    }
    return st;
}

static void sampler_close(sampler *s) {
    mw_infer_free(s->inf);
    mw_graph_free(s->g);
    free(s->tokens);
    free(s->out);
}

/* One decoding step: the token at cache position s->at; its logits to s->out. */
static mw_status sampler_feed(sampler *s, int32_t token) {
    int32_t pos = s->at;
    mw_feed in[2] = {{"tokens", &token, 1}, {"pos", &pos, 1}};
    mw_fetch f = {s->logits, s->out, mw_tensor_numel(s->logits)};
    mw_status st = mw_infer_run(s->inf, in, 2, 1, &f, 1);
    if (st == MW_OK) s->at++;
    return st;
}

/* The logits of the token after hist[0, n), in *logits. The model sees the context
 * hist[start, n) at positions 0, 1, ...: when it would grow beyond the window it starts again
 * from its last half, so the model never sees a position beyond the window it was trained on.
 * The key/value cache is fed the tokens since the last call one by one (and the kept half again
 * at such a restart); recomputing runs the model over the context each time. Both see the same
 * context, so at temperature 0 they pick the same tokens, beyond the window too. */
static mw_status sampler_next(sampler *s, const int32_t *hist, int n, int Vp,
                              const float **logits) {
    mw_status st = MW_OK;
    const int keep = s->window / 2 > 0 ? s->window / 2 : 1;
    for (int i = s->fed; i < n && st == MW_OK; i++) {
        if (i - s->start == s->window) { /* full: keep the last half */
            s->start = i - keep;
            s->at = 0;
            for (int k = s->start; s->cached && k < i && st == MW_OK; k++)
                st = sampler_feed(s, hist[k]);
        }
        if (s->cached && st == MW_OK) st = sampler_feed(s, hist[i]);
    }
    s->fed = n;
    *logits = s->out;
    if (s->cached || st != MW_OK) return st;
    int len = n - s->start;
    memcpy(s->tokens, hist + s->start, (size_t)len * sizeof *s->tokens);
    mw_feed feed = {"tokens", s->tokens, s->window};
    mw_fetch f = {s->logits, s->out, (int64_t)s->window * Vp};
    st = mw_infer_run(s->inf, &feed, 1, 1, &f, 1);
    *logits = s->out + (size_t)(len - 1) * (size_t)Vp;
    return st;
}

/* The sampler of the flags: greedy at --temperature 0, else --top-k and --top-p, from --seed
 * (so the sample depends on the model, the prompt, those flags and the seed alone), ending at
 * the --eos token. */
static mw_status sampler_of_flags(const run *r, mw_sampler **out) {
    const options *o = &r->o;
    mw_sample_config c = MW_SAMPLE_CONFIG_INIT;
    c.temperature = o->temperature, c.top_k = o->top_k, c.top_p = o->top_p, c.seed = o->seed;
    if (r->eos >= 0) c.eos_ids = &r->eos, c.neos = 1;
    return mw_sampler_new(&c, out);
}

/* Generates o->sample tokens with an inference program reading the trainer's parameters in place
 * (no copy, no targets, no gradients): the decoding step with a key/value cache, or with
 * --sample-recompute the model over the window of the latest seq tokens for every token. The
 * --eos token ends it early, as generate does: it is kept among the tokens (and counted), but a
 * special token's text is not printed (as a decode with skip_special_tokens). */
int sample(run *r) {
    const options *o = &r->o;
    const int V = o->model.vocab, Vp = o->model.padded_vocab;
    sampler sm;
    mw_sampler *draw = NULL;
    int rc = 0, n = r->prompt_len, cap = o->sample + r->prompt_len + 1, stopped = 0;
    int32_t *hist = malloc((size_t)cap * sizeof *hist);
    char *text = malloc((size_t)cap);
    mw_status st = hist && text ? sampler_open(r, &sm) : MW_ERR_NOMEM;
    if (st == MW_OK) st = sampler_of_flags(r, &draw);
    if (st != MW_OK) {
        rc = fail(st, "cannot set up sampling");
        goto done;
    }
    memcpy(hist, r->prompt, (size_t)n * sizeof *hist);
    int prompt_len = n;
    char how[160] = "";
    if (o->temperature > 0)
        snprintf(how, sizeof how, "temperature %g, top-k %d, top-p %g, seed %llu", o->temperature,
                 o->top_k, o->top_p, (unsigned long long)o->seed);
    else
        snprintf(how, sizeof how, "temperature 0: the likeliest tokens");
    if (r->eos >= 0) snprintf(how + strlen(how), sizeof how - strlen(how), ", EOS %d", r->eos);
    printf("sample (%d tokens, %s, %s):\n", o->sample, how,
           sm.cached ? "key/value cache" : "recomputing the window");
    if (r->byte_level || (r->tok && strcmp(o->prompt, "\n") != 0))
        fwrite(o->prompt, 1, strlen(o->prompt), stdout);
    double t0 = now();
    for (int i = 0; i < o->sample && !stopped && !mw_stop_requested(); i++) {
        const float *logits;
        if ((st = sampler_next(&sm, hist, n, Vp, &logits)) != MW_OK ||
            (st = mw_sampler_draw(draw, logits, V, &hist[n])) != MW_OK) {
            rc = fail(st, "sampling failed");
            goto done;
        }
        stopped = mw_sampler_is_eos(draw, hist[n]);
        if (stopped && r->tok && mw_tokenizer_is_special(r->tok, hist[n]))
            n++; /* kept, not printed */
        else if (r->tok)
            print_text_token(r->tok, hist[n++]);
        else
            print_token(hist[n++], r->byte_level);
        fflush(stdout);
    }
    double secs = now() - t0;
    printf("\n");
    if (n > prompt_len)
        printf("sampled %d tokens in %.3f s (%.1f tokens/s)%s\n", n - prompt_len, secs,
               (double)(n - prompt_len) / (secs > 0 ? secs : 1e-9),
               stopped ? "; ended by the --eos token" : "");
    if (stopped && r->tok && mw_tokenizer_is_special(r->tok, hist[n - 1]))
        n--; /* the text scored below is the text printed */
    if (r->corpus) {
        /* The generated part as text: its bytes, or what the tokenizer decodes it to. */
        char *gen = text;
        size_t glen = (size_t)(n - prompt_len);
        if (r->tok) {
            glen = 0;
            mw_tokenizer_decode(r->tok, hist + prompt_len, (size_t)(n - prompt_len), NULL, 0,
                                &glen);
            gen = malloc(glen + 1);
            if (!gen || mw_tokenizer_decode(r->tok, hist + prompt_len, (size_t)(n - prompt_len),
                                            gen, glen, &glen) != MW_OK)
                glen = 0;
        } else {
            for (int i = prompt_len; i < n; i++) text[i - prompt_len] = (char)hist[i];
        }
        int lines = 0, ok = 0, correct = 0; /* the first line counts when the prompt ends one */
        if (gen)
            gpt2_corpus_score(gen, glen, o->prompt[strlen(o->prompt) - 1] == '\n', &lines, &ok,
                              &correct);
        if (gen != text) free(gen);
        printf("sample: %d complete lines, %d well formed, %d correct arithmetic\n", lines, ok,
               correct);
    }
done:
    mw_sampler_free(draw);
    if (hist && text) sampler_close(&sm);
    free(hist);
    free(text);
    return rc;
}
