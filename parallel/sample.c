/* Drawing the next token as Hugging Face's generate samples (meshwit/sample.h): temperature,
 * top-k and top-p over one row of logits, a softmax and a multinomial draw from a counter-based
 * random stream; greedy at temperature 0. */
#include "parallel/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

#define GOLDEN 0x9e3779b97f4a7c15ull /* SplitMix64's increment */
#define NUCLEUS_LEVELS 8             /* top-p's widening cuts: e^-4, e^-8, ..., e^-512, then 0 */

struct mw_sampler {
    double temperature, top_p;
    int top_k, neos;
    uint64_t seed, position;
    int32_t *eos;
    /* Scratch, grown to the largest vocabulary sampled from: the candidates, and the heap of
     * the k largest logits. */
    mw__sample_entry *entries;
    int entries_cap;
    float *heap;
    int heap_cap;
    mw__sample_entry greedy; /* the greedy choice, for mw__sampler_filter */
};

/* SplitMix64's output for counter value z. */
static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The uniform number in [0, 1) used at `position` (0, 1, ...) of the sampler's stream. */
static double uniform(const mw_sampler *s, uint64_t position) {
    return (double)(mix(s->seed + (position + 1) * GOLDEN) >> 11) * 0x1p-53;
}

mw_status mw_sampler_new(const mw_sample_config *c, mw_sampler **out) {
    if (out) *out = NULL;
    if (!c || !out)
        return mw__error(MW_ERR_INVALID, "mw_sampler_new: %s is NULL", !c ? "config" : "out");
    if (!(c->temperature >= 0.0) || isinf(c->temperature))
        return mw__error(MW_ERR_INVALID,
                         "mw_sampler_new: temperature %g is not a finite number >= 0 (0 picks the "
                         "likeliest token; 1 samples the model's own distribution)",
                         c->temperature);
    if (c->top_k < 0)
        return mw__error(MW_ERR_INVALID,
                         "mw_sampler_new: top_k %d is negative (0 keeps every token; k > 0 the k "
                         "likeliest)",
                         c->top_k);
    if (!(c->top_p > 0.0 && c->top_p <= 1.0))
        return mw__error(MW_ERR_INVALID,
                         "mw_sampler_new: top_p %g is not in (0, 1] (1 keeps every token, as "
                         "MW_SAMPLE_CONFIG_INIT sets it)",
                         c->top_p);
    if (c->neos < 0 || (c->neos > 0 && !c->eos_ids))
        return mw__error(MW_ERR_INVALID,
                         "mw_sampler_new: neos %d with eos_ids %s (give neos >= 0 ids, or 0 for "
                         "none)",
                         c->neos, c->eos_ids ? "set" : "NULL");
    for (int i = 0; i < c->neos; i++)
        if (c->eos_ids[i] < 0)
            return mw__error(MW_ERR_INVALID,
                             "mw_sampler_new: eos_ids[%d] is %d: a token id is >= 0", i,
                             (int)c->eos_ids[i]);
    mw_sampler *s = mw__calloc(1, sizeof *s);
    if (!s) return mw__error(MW_ERR_NOMEM, "mw_sampler_new: out of memory");
    if (c->neos > 0 && !(s->eos = mw__malloc((size_t)c->neos * sizeof *s->eos))) {
        mw__free(s);
        return mw__error(MW_ERR_NOMEM, "mw_sampler_new: out of memory for %d EOS ids", c->neos);
    }
    if (c->neos > 0) memcpy(s->eos, c->eos_ids, (size_t)c->neos * sizeof *s->eos);
    s->temperature = c->temperature;
    s->top_k = c->top_k;
    s->top_p = c->top_p;
    s->seed = c->seed;
    s->neos = c->neos;
    *out = s;
    return MW_OK;
}

void mw_sampler_free(mw_sampler *s) {
    if (!s) return;
    mw__free(s->eos);
    mw__free(s->entries);
    mw__free(s->heap);
    mw__free(s);
}

int mw_sampler_is_eos(const mw_sampler *s, int32_t token) {
    for (int i = 0; s && i < s->neos; i++)
        if (s->eos[i] == token) return 1;
    return 0;
}

uint64_t mw_sampler_position(const mw_sampler *s) { return s ? s->position : 0; }

mw_status mw_sampler_set_position(mw_sampler *s, uint64_t position) {
    if (!s) return mw__error(MW_ERR_INVALID, "mw_sampler_set_position: the sampler is NULL");
    s->position = position;
    return MW_OK;
}

/* The likeliest token into *best (the lowest id among equal logits), having checked that every
 * logit is finite or -Inf and one is finite. */
static mw_status scan(const char *fn, const float *logits, int vocab, int *best) {
    int b = -1;
    float max = -INFINITY;
    for (int i = 0; i < vocab; i++) {
        float x = logits[i];
        if (!(x < INFINITY))
            return mw__error(MW_ERR_NONFINITE,
                             "%s: logit %d of %d is %s: a logit must be finite, or -Inf to rule "
                             "its token out",
                             fn, i, vocab, isnan(x) ? "NaN" : "+Inf");
        if (x > max) max = x, b = i;
    }
    if (b < 0)
        return mw__error(MW_ERR_NONFINITE,
                         "%s: all %d logits are -Inf: every token is ruled out, none can be drawn",
                         fn, vocab);
    *best = b;
    return MW_OK;
}

/* The k-th largest of logits[0, vocab), 1 <= k < vocab: a min-heap of the k largest seen. */
static float kth_largest(const float *logits, int vocab, int k, float *heap) {
    for (int i = 0; i < k; i++) {
        float x = logits[i];
        int j = i;
        for (; j > 0 && heap[(j - 1) / 2] > x; j = (j - 1) / 2) heap[j] = heap[(j - 1) / 2];
        heap[j] = x;
    }
    for (int i = k; i < vocab; i++) {
        float x = logits[i];
        if (!(x > heap[0])) continue;
        int j = 0;
        for (;;) {
            int c = 2 * j + 1;
            if (c >= k) break;
            if (c + 1 < k && heap[c + 1] < heap[c]) c++;
            if (heap[c] >= x) break;
            heap[j] = heap[c];
            j = c;
        }
        heap[j] = x;
    }
    return heap[0];
}

/* Falling weight, then rising id: a total order, so the sort's result is unique. */
static int by_weight(const void *a, const void *b) {
    const mw__sample_entry *x = a, *y = b;
    if (x->weight != y->weight) return x->weight > y->weight ? -1 : 1;
    return (x->token > y->token) - (x->token < y->token);
}

/* Top-p over e[0, n): orders the likeliest entries first and returns how many are kept, those
 * whose predecessors' weight is below target; *kept is their weight. Only what is needed is
 * sorted: the entries of weight >= e^-4 (of the likeliest's 1), then those in [e^-8, e^-4), and
 * so on, each band below the one before, until the kept prefix ends inside one. The sums run
 * over the sorted order, so the result does not depend on where the bands fall. */
static int nucleus(mw__sample_entry *e, int n, double target, double *kept) {
    int done = 0;
    double before = 0.0;
    for (int level = 0;; level++) {
        double cut = level < NUCLEUS_LEVELS ? exp(-(double)(4 << level)) : 0.0;
        int m = done;
        for (int j = done; j < n; j++)
            if (e[j].weight >= cut) {
                mw__sample_entry t = e[m];
                e[m++] = e[j];
                e[j] = t;
            }
        qsort(e + done, (size_t)(m - done), sizeof *e, by_weight);
        for (int j = done; j < m; j++) {
            if (before >= target) {
                *kept = before;
                return j;
            }
            before += e[j].weight;
        }
        done = m;
        if (done == n) {
            *kept = before;
            return n;
        }
    }
}

/* Room for vocab candidates and a heap of k. */
static mw_status reserve(mw_sampler *s, const char *fn, int vocab, int k) {
    if (vocab > s->entries_cap) {
        mw__sample_entry *e = mw__malloc((size_t)vocab * sizeof *e);
        if (!e)
            return mw__error(MW_ERR_NOMEM, "%s: out of memory for %d tokens' scratch", fn, vocab);
        mw__free(s->entries);
        s->entries = e;
        s->entries_cap = vocab;
    }
    if (k > s->heap_cap) {
        float *h = mw__malloc((size_t)k * sizeof *h);
        if (!h) return mw__error(MW_ERR_NOMEM, "%s: out of memory for a top-%d heap", fn, k);
        mw__free(s->heap);
        s->heap = h;
        s->heap_cap = k;
    }
    return MW_OK;
}

static mw_status filter(mw_sampler *s, const char *fn, const float *logits, int vocab,
                        const mw__sample_entry **kept, int *count, double *total) {
    int best = 0;
    mw_status st = scan(fn, logits, vocab, &best);
    if (st != MW_OK) return st;
    if (s->temperature == 0.0) {
        s->greedy = (mw__sample_entry){1.0, best};
        *kept = &s->greedy, *count = 1, *total = 1.0;
        return MW_OK;
    }
    const int k = s->top_k > 0 && s->top_k < vocab ? s->top_k : 0;
    if ((st = reserve(s, fn, vocab, k)) != MW_OK) return st;
    /* Top-k: every logit below the k-th largest goes; the tied ones stay, as in Hugging Face's
     * `scores < topk(scores, k)[..., -1]`. */
    const float cut = k ? kth_largest(logits, vocab, k, s->heap) : -INFINITY;
    const double max = logits[best], t = s->temperature;
    double z = 0.0;
    int n = 0;
    for (int i = 0; i < vocab; i++)
        if (logits[i] >= cut) {
            double w = exp(((double)logits[i] - max) / t);
            s->entries[n++] = (mw__sample_entry){w, i};
            z += w;
        }
    if (s->top_p < 1.0) n = nucleus(s->entries, n, s->top_p * z, &z);
    *kept = s->entries, *count = n, *total = z;
    return MW_OK;
}

static mw_status check_args(const char *fn, const mw_sampler *s, const float *logits, int vocab,
                            const void *out, const char *out_name) {
    const char *null = !s ? "the sampler" : !logits ? "logits" : !out ? out_name : NULL;
    if (null) return mw__error(MW_ERR_INVALID, "%s: %s is NULL", fn, null);
    if (vocab < 1)
        return mw__error(MW_ERR_INVALID, "%s: vocab %d: a draw needs at least one logit", fn,
                         vocab);
    return MW_OK;
}

mw_status mw__sampler_filter(mw_sampler *s, const float *logits, int vocab,
                             const mw__sample_entry **kept, int *n, double *total) {
    const char *fn = "mw__sampler_filter";
    mw_status st = check_args(fn, s, logits, vocab, kept, "kept");
    if (st == MW_OK && (!n || !total)) st = mw__error(MW_ERR_INVALID, "%s: n or total NULL", fn);
    return st != MW_OK ? st : filter(s, fn, logits, vocab, kept, n, total);
}

mw_status mw_sampler_draw(mw_sampler *s, const float *logits, int vocab, int32_t *token) {
    const char *fn = "mw_sampler_draw";
    const mw__sample_entry *e;
    int n = 0;
    double total = 0.0;
    mw_status st = check_args(fn, s, logits, vocab, token, "token");
    if (st == MW_OK) st = filter(s, fn, logits, vocab, &e, &n, &total);
    if (st != MW_OK) return st;
    if (s->temperature == 0.0) {
        *token = e[0].token;
        return MW_OK;
    }
    /* The walk adds the weights in the order their total was summed, so it reaches the total;
     * should u x total round up to it, the last token of positive weight is the one. */
    const double u = uniform(s, s->position) * total;
    double acc = 0.0;
    int pick = -1, last = 0;
    for (int j = 0; j < n && pick < 0; j++) {
        acc += e[j].weight;
        if (e[j].weight > 0.0) last = j;
        if (u < acc) pick = j;
    }
    *token = e[pick >= 0 ? pick : last].token;
    s->position++;
    return MW_OK;
}
