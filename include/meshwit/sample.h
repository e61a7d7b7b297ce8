/* meshwit: drawing the next token from a model's logits, as Hugging Face's `generate` samples.
 *
 * A sampler turns one row of f32 logits over `vocab` tokens into a token id. Its config holds
 * what `generate`'s GenerationConfig holds for sampling, and a draw applies the same logits
 * processors in the same order:
 *
 *   1. temperature: the logits divided by it (TemperatureLogitsWarper); temperature 0 is greedy
 *      decoding (`do_sample=False`): the likeliest token, the lowest id among equal logits
 *      (torch.argmax's choice), whatever top_k and top_p say, with no random number used;
 *   2. top_k > 0: every token whose logit is below the k-th largest is removed
 *      (TopKLogitsWarper): tokens tied with the k-th largest are all kept, so more than k may
 *      remain; k above vocab keeps every token; 0 turns it off;
 *   3. top_p < 1: nucleus filtering (TopPLogitsWarper, min_tokens_to_keep 1): the remaining
 *      tokens in order of falling probability, equal ones by rising id (transformers takes them
 *      in torch.sort's order, unspecified for equal values), are kept while the probability of
 *      those before them adds up to less than top_p: the smallest such prefix whose probability
 *      reaches top_p, never fewer than one token; 1 turns it off;
 *   4. softmax over what remains and one multinomial draw.
 * Dividing by a positive temperature keeps the order, so steps 1-3 compare the logits
 * themselves; probabilities and their sums are computed in double precision from the f32
 * logits (torch computes them in f32: a top_p that falls within f32 rounding of a cumulative
 * sum may keep one token more or less there). A logit of -Inf rules its token out (probability
 * 0), as a logits processor's mask does; NaN and +Inf are refused.
 *
 * Cost: one pass over the logits, and the softmax of the tokens that remain; top-k keeps a heap
 * of the k largest (O(vocab log k)); top-p sorts only the likeliest tokens it needs: those
 * within a factor e^4 of the likeliest, then e^8, e^16, ... until they hold top_p of the
 * probability (a full sort only when the nucleus spans nearly every token).
 *
 * Random numbers: each sampling draw uses one uniform number in [0, 1), the top 53 bits of the
 * next output of SplitMix64 started from the seed (a counter-based stream: output n is a mix of
 * seed + n x 0x9e3779b97f4a7c15), so the same seed, config and logits give the same tokens in
 * every run and on every thread (and machine, but for a last bit of the C library's exp where
 * a draw falls on a boundary), and mw_sampler_position / mw_sampler_set_position say and set
 * where the sampler stands in it (to resume a generation). Greedy draws and failed draws use
 * none.
 *
 * Stopping. mw_sampler_is_eos says whether a token is one of the config's end-of-sequence ids;
 * a generation loop stops after drawing one, as `generate` does, keeping it as the last id of
 * the sequence (`generate` returns it among the ids; a decode with skip_special_tokens leaves
 * its text out).
 *
 * Thread-safety: a sampler is used by one thread at a time; samplers are independent. */
#ifndef MESHWIT_SAMPLE_H
#define MESHWIT_SAMPLE_H

#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mw_sampler mw_sampler;

typedef struct mw_sample_config {
    /* >= 0 and finite: the logits are divided by it; 0: greedy (the likeliest token). */
    double temperature;
    /* >= 0: keep the top_k largest logits and those tied with the k-th; 0 keeps every token. */
    int top_k;
    /* In (0, 1]: keep the likeliest tokens until their probability reaches top_p; 1 keeps every
     * token. */
    double top_p;
    /* The random stream's seed: any value. */
    uint64_t seed;
    /* The end-of-sequence ids (Hugging Face's eos_token_id: one id or a list), each >= 0;
     * borrowed during mw_sampler_new, which copies them. neos 0 (eos_ids may be NULL): none. */
    const int32_t *eos_ids;
    int neos;
} mw_sample_config;

/* Plain sampling from the softmax: temperature 1, no top-k, no top-p, seed 0, no EOS; a starting
 * point to change fields of (`mw_sample_config c = MW_SAMPLE_CONFIG_INIT; c.top_p = 0.9;`).
 * Hugging Face's GenerationConfig defaults top_k to 50: set it so to sample as its defaults do. */
#define MW_SAMPLE_CONFIG_INIT                                                                      \
    { .temperature = 1.0, .top_k = 0, .top_p = 1.0, .seed = 0, .eos_ids = 0, .neos = 0 }

/* A sampler for `config` (copied, EOS ids included) into *out, owned by the caller
 * (mw_sampler_free), at position 0 of the seed's stream. *out is NULL on failure. Errors:
 * MW_ERR_INVALID (config or out NULL; temperature negative, NaN or infinite; top_k negative;
 * top_p not in (0, 1]; neos negative, eos_ids NULL with neos > 0, an EOS id negative: the
 * message names the field, its value and the values it takes), MW_ERR_NOMEM. */
mw_status mw_sampler_new(const mw_sample_config *config, mw_sampler **out);

/* Frees the sampler. NULL is a no-op. */
void mw_sampler_free(mw_sampler *s);

/* Draws a token from logits[0, vocab) (borrowed: a padded row may be longer; only the first
 * vocab entries are read) into *token, as above. A sampling draw over more tokens than any
 * before it allocates the sampler's scratch (20 bytes a token at most); the others allocate
 * nothing. On failure *token and the sampler's position are unchanged. Errors:
 * MW_ERR_INVALID (s, logits or token NULL; vocab < 1), MW_ERR_NONFINITE (a logit that is NaN or
 * +Inf, or every logit -Inf: the message names the first bad index), MW_ERR_NOMEM. */
mw_status mw_sampler_draw(mw_sampler *s, const float *logits, int vocab, int32_t *token);

/* 1 when token is one of the sampler's EOS ids, else 0 (0 for a NULL sampler). */
int mw_sampler_is_eos(const mw_sampler *s, int32_t token);

/* The uniform numbers the sampler has used: its sampling draws since it was made or last set (0
 * for a NULL sampler). */
uint64_t mw_sampler_position(const mw_sampler *s);

/* Sets the position: the next sampling draw uses the number a sampler of the same seed uses after
 * `position` numbers, as if it had been drawing all along. Errors: MW_ERR_INVALID (s NULL). */
mw_status mw_sampler_set_position(mw_sampler *s, uint64_t position);

#ifdef __cplusplus
}
#endif
#endif
