/* The sampler (meshwit/sample.h) against Hugging Face: the tokens transformers' own temperature,
 * top-k and top-p warpers keep and their probabilities (tests/data/sample_ref.txt, made by
 * tools/make_sample_ref.py), draws whose frequencies follow them (Pearson's chi-square), the
 * same kept sets as a full sort on vocabularies of GPT-2's and Llama 3's size, greedy decoding,
 * the random stream the header documents, and draws that fail or run out of memory leaving the
 * sampler as it was. Bad arguments: tests/parallel/test_api_errors.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "meshwit.h"
#include "meshwit/testing.h"
#include "parallel/sample.h"
#include "tests/common/rng.h"
#include "tests/reference_text.h"

#define REF_VOCAB 1000 /* the largest case of sample_ref.txt */

static mw_sampler *sampler(double temperature, int top_k, double top_p, uint64_t seed) {
    mw_sample_config c = MW_SAMPLE_CONFIG_INIT;
    c.temperature = temperature, c.top_k = top_k, c.top_p = top_p, c.seed = seed;
    mw_sampler *s = NULL;
    cr_assert_eq(mw_sampler_new(&c, &s), MW_OK, "%s", mw_last_error());
    return s;
}

static int32_t draw(mw_sampler *s, const float *logits, int vocab) {
    int32_t t = -1;
    cr_assert_eq(mw_sampler_draw(s, logits, vocab, &t), MW_OK, "%s", mw_last_error());
    cr_assert(t >= 0 && t < vocab);
    return t;
}

/* The sampler's kept tokens as probabilities over the vocabulary (0 for a token left out). */
static void kept_probs(mw_sampler *s, const float *logits, int vocab, double *p) {
    const mw__sample_entry *e;
    int n = 0;
    double total = 0;
    cr_assert_eq(mw__sampler_filter(s, logits, vocab, &e, &n, &total), MW_OK, "%s",
                 mw_last_error());
    for (int i = 0; i < vocab; i++) p[i] = 0.0;
    for (int j = 0; j < n; j++) p[e[j].token] = e[j].weight / total;
}

/* Pearson's X^2 of `draws` draws against p (over the tokens p gives above 0), which no token of
 * p = 0 may be drawn; the bound is the chi-square quantile of 1 - 1e-5 by Wilson and Hilferty's
 * approximation (accurate to a few parts in a thousand from 4 degrees of freedom). The seed is
 * fixed, so a right sampler passes every run; one that keeps a token too many or too few, or
 * weights one by 10 % off at 100,000 draws, exceeds it many times over. */
static void check_frequencies(mw_sampler *s, const float *logits, int vocab, const double *p,
                              int draws, const char *what) {
    static int count[REF_VOCAB];
    cr_assert_leq(vocab, REF_VOCAB);
    memset(count, 0, sizeof count);
    for (int i = 0; i < draws; i++) {
        int32_t t = draw(s, logits, vocab);
        cr_assert_gt(p[t], 0.0, "%s: token %d drawn, but it is not kept", what, (int)t);
        count[t]++;
    }
    double x2 = 0.0;
    int df = -1;
    for (int i = 0; i < vocab; i++)
        if (p[i] > 0.0) {
            double e = draws * p[i], d = count[i] - e;
            x2 += d * d / e;
            df++;
        }
    if (df < 1) return; /* one token: every draw is it, checked above */
    const double z = 4.265, h = 2.0 / (9.0 * df);
    double bound = df * pow(1.0 - h + z * sqrt(h), 3.0);
    if (df < 4) bound += 5.0; /* the approximation is loose there; a wrong sampler is far above */
    cr_assert_lt(x2, bound, "%s: X^2 %.1f over %d degrees of freedom (bound %.1f)", what, x2, df,
                 bound);
}

/* --- transformers' warpers ------------------------------------------------------------------ */

typedef struct ref_case {
    double temperature, top_p;
    int top_k, vocab, nkept;
    float logits[REF_VOCAB];
    int kept[REF_VOCAB];
    double probs[REF_VOCAB];
} ref_case;

static int ref_count(reffile *r, const char *name) {
    char got[64];
    int n = -1;
    cr_assert_eq(fscanf(r->f, "%63s %d", got, &n), 2, "%s: truncated before %s", r->path, name);
    cr_assert_str_eq(got, name, "%s: record %s where %s was expected", r->path, got, name);
    cr_assert(n >= 0 && n <= REF_VOCAB, "%s: %s of %d values", r->path, name, n);
    return n;
}

static double ref_value(reffile *r) {
    char word[64];
    cr_assert_eq(fscanf(r->f, "%63s", word), 1, "%s: truncated", r->path);
    if (!strcmp(word, "-inf")) return -INFINITY;
    char *end;
    double v = strtod(word, &end);
    cr_assert(*end == '\0', "%s: '%s' is not a number", r->path, word);
    return v;
}

static void ref_case_read(reffile *r, ref_case *c) {
    cr_assert_eq(ref_count(r, "config"), 3);
    c->temperature = ref_value(r), c->top_k = (int)ref_value(r), c->top_p = ref_value(r);
    c->vocab = ref_count(r, "logits");
    for (int i = 0; i < c->vocab; i++) c->logits[i] = (float)ref_value(r);
    c->nkept = ref_count(r, "kept");
    for (int j = 0; j < c->nkept; j++) c->kept[j] = (int)ref_value(r);
    cr_assert_eq(ref_count(r, "probs"), c->nkept);
    for (int j = 0; j < c->nkept; j++) c->probs[j] = ref_value(r);
}

/* transformers computes the probabilities in f32 (the logits divided by the temperature, then a
 * softmax): a few ulps of 6e-8 each, and a logit of |l / T| <= 16 rounded by half an ulp moves
 * its probability by 5e-7 relative. 1e-5 relative + 1e-9 absolute leaves a margin of ten; a
 * wrong temperature or a token too many moves them by 1e-2 or more. */
#define RTOL_HF 1e-5

Test(sample, keeps_what_transformers_warpers_keep) {
    static ref_case c;
    static double p[REF_VOCAB];
    reffile r;
    ref_open(&r, "sample_ref.txt");
    cr_assert_eq(ref_count(&r, "cases"), 1);
    int ncases = (int)ref_value(&r);
    for (int k = 0; k < ncases; k++) {
        ref_case_read(&r, &c);
        mw_sampler *s = sampler(c.temperature, c.top_k, c.top_p, 7);
        kept_probs(s, c.logits, c.vocab, p);
        int n = 0;
        for (int i = 0; i < c.vocab; i++) n += p[i] > 0.0;
        cr_assert_eq(n, c.nkept, "case %d (T %g, top_k %d, top_p %g): %d tokens kept, %d by HF", k,
                     c.temperature, c.top_k, c.top_p, n, c.nkept);
        for (int j = 0; j < c.nkept; j++) {
            double want = c.probs[j], got = p[c.kept[j]];
            cr_assert(fabs(got - want) <= 1e-9 + RTOL_HF * want,
                      "case %d: token %d: probability %.9g, HF %.9g", k, c.kept[j], got, want);
        }
        /* and the draws follow it (the small cases: enough draws of each token) */
        if (c.vocab <= 64) check_frequencies(s, c.logits, c.vocab, p, 100000, "transformers case");
        mw_sampler_free(s);
    }
    cr_assert_eq(ref_count(&r, "streams"), 1);
    fclose(r.f);
}

/* The stream the header names: SplitMix64 from the seed, the top 53 bits. Through the public
 * call alone: 65536 equal logits make the draw floor(u x 65536), exactly (the weights are 1 and
 * their sums integers). */
Test(sample, draws_from_splitmix64_of_the_seed) {
    static ref_case c;
    static float flat[65536];
    reffile r;
    ref_open(&r, "sample_ref.txt");
    cr_assert_eq(ref_count(&r, "cases"), 1);
    int ncases = (int)ref_value(&r);
    for (int k = 0; k < ncases; k++) ref_case_read(&r, &c);
    cr_assert_eq(ref_count(&r, "streams"), 1);
    int nstreams = (int)ref_value(&r);
    for (int k = 0; k < nstreams; k++) {
        cr_assert_eq(ref_count(&r, "stream"), 5);
        uint64_t seed = (uint64_t)ref_value(&r);
        mw_sampler *s = sampler(1.0, 0, 1.0, seed);
        for (int i = 0; i < 4; i++) {
            double u = ref_value(&r);
            cr_assert_eq(draw(s, flat, 65536), (int32_t)(u * 65536.0), "seed %llu, number %d",
                         (unsigned long long)seed, i);
        }
        mw_sampler_free(s);
    }
    ref_close_at_end(&r);
}

/* --- closed forms ------------------------------------------------------------------------------
 */

Test(sample, top_k_0_and_top_p_1_are_the_plain_softmax) {
    float l[50];
    double p[50], want[50], z = 0.0;
    uint64_t st = 11;
    for (int i = 0; i < 50; i++) l[i] = (float)(2.0 * rng_uniform(&st));
    const double t = 0.8;
    for (int i = 0; i < 50; i++) z += want[i] = exp(l[i] / t);
    for (int k = 0; k < 2; k++) { /* top_k 0, and top_k beyond the vocabulary */
        mw_sampler *s = sampler(t, k ? 60 : 0, 1.0, 3);
        kept_probs(s, l, 50, p);
        for (int i = 0; i < 50; i++)
            cr_assert(fabs(p[i] - want[i] / z) <= 1e-14, "token %d: %.17g, softmax %.17g", i, p[i],
                      want[i] / z);
        check_frequencies(s, l, 50, p, 100000, "plain softmax");
        mw_sampler_free(s);
    }
}

Test(sample, greedy_takes_the_first_of_equal_maxima) {
    const float a[] = {1.0f, 3.0f, -INFINITY, 3.0f, 2.0f};
    const float b[] = {-INFINITY, -INFINITY, -5.0f, -5.0f};
    mw_sampler *s = sampler(0.0, 2, 0.5, 1);
    for (int i = 0; i < 3; i++) cr_assert_eq(draw(s, a, 5), 1);
    cr_assert_eq(draw(s, b, 4), 2);
    cr_assert_eq(mw_sampler_position(s), 0, "greedy draws use no random number");
    mw_sampler_free(s);
}

/* HF keeps every token tied with the k-th largest: top-k 1 is greedy unless the maximum ties. */
Test(sample, top_k_1_is_greedy_unless_the_maximum_ties) {
    float l[300];
    uint64_t st = 5;
    for (int i = 0; i < 300; i++) l[i] = (float)(4.0 * rng_uniform(&st));
    mw_sampler *g = sampler(0.0, 0, 1.0, 0), *s = sampler(1.5, 1, 1.0, 9);
    int32_t best = draw(g, l, 300);
    for (int i = 0; i < 200; i++) cr_assert_eq(draw(s, l, 300), best);
    const float tie[] = {0.0f, 2.0f, 1.0f, 2.0f};
    const double p[] = {0.0, 0.5, 0.0, 0.5};
    check_frequencies(s, tie, 4, p, 20000, "top-k 1 with a tie");
    mw_sampler_free(g);
    mw_sampler_free(s);
}

/* --- large vocabularies against a full sort ------------------------------------------------- */

typedef struct ranked {
    float logit;
    int id;
} ranked;

static int by_logit(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id - y->id;
}

/* The header's rules the obvious way: every token sorted by falling logit (equal ones by rising
 * id), the first k and those tied with the k-th, then the prefix whose predecessors hold less
 * than top_p of the probability. */
static void full_sort_probs(const float *l, int vocab, double t, int k, double top_p, double *p) {
    ranked *r = malloc((size_t)vocab * sizeof *r);
    double *w = malloc((size_t)vocab * sizeof *w);
    cr_assert(r && w);
    for (int i = 0; i < vocab; i++) r[i] = (ranked){l[i], i};
    qsort(r, (size_t)vocab, sizeof *r, by_logit);
    int n = vocab;
    if (k > 0 && k < vocab)
        for (n = k; n < vocab && r[n].logit == r[k - 1].logit;) n++;
    double z = 0.0;
    for (int j = 0; j < n; j++) z += w[j] = exp(((double)r[j].logit - r[0].logit) / t);
    if (top_p < 1.0) {
        double before = 0.0;
        int m = 0;
        while (m < n && before / z < top_p) before += w[m++];
        n = m, z = before;
    }
    for (int i = 0; i < vocab; i++) p[i] = 0.0;
    for (int j = 0; j < n; j++) p[r[j].id] = w[j] / z;
    free(r);
    free(w);
}

/* Sums of up to 150,000 weights in two orders differ by at most n x 2^-53 relative: 2e-11. */
#define RTOL_SUMS 1e-10

static void check_large(const float *l, int vocab, double t, int k, double top_p) {
    double *p = malloc((size_t)vocab * sizeof *p), *want = malloc((size_t)vocab * sizeof *want);
    cr_assert(p && want);
    mw_sampler *s = sampler(t, k, top_p, 1);
    kept_probs(s, l, vocab, p);
    full_sort_probs(l, vocab, t, k, top_p, want);
    int n = 0, nwant = 0;
    for (int i = 0; i < vocab; i++) {
        n += p[i] > 0.0, nwant += want[i] > 0.0;
        cr_assert((p[i] > 0.0) == (want[i] > 0.0),
                  "vocab %d, T %g, top_k %d, top_p %g: token %d %s", vocab, t, k, top_p, i,
                  p[i] > 0.0 ? "kept, not by the full sort" : "left out, kept by the full sort");
        cr_assert(fabs(p[i] - want[i]) <= RTOL_SUMS * want[i], "token %d: %.17g, full sort %.17g",
                  i, p[i], want[i]);
    }
    cr_assert_eq(n, nwant);
    cr_log_info("vocab %d, T %g, top_k %d, top_p %g: %d tokens kept", vocab, t, k, top_p, n);
    mw_sampler_free(s);
    free(p);
    free(want);
}

Test(sample, large_vocabularies_keep_what_a_full_sort_keeps, .timeout = 120) {
    static float l[150000];
    uint64_t st = 2024;
    for (int vocab = 50257; vocab <= 150000; vocab += 150000 - 50257) {
        for (int i = 0; i < vocab; i++) l[i] = (float)(6.0 * rng_uniform(&st));
        check_large(l, vocab, 1.0, 50, 1.0);
        check_large(l, vocab, 0.7, 0, 0.9);
        check_large(l, vocab, 1.0, 1000, 0.95);
        check_large(l, vocab, 1.0, 40, 0.5);
        check_large(l, vocab, 1.0, 0, 0.999999); /* nearly every token: the whole sort */
        check_large(l, vocab, 0.05, 0, 0.9);     /* a sharp distribution: few tokens */
        /* Ties everywhere (logits in steps of 1/4): at the k-th and at the nucleus' edge. */
        for (int i = 0; i < vocab; i++) l[i] = floorf(l[i] * 4.0f) / 4.0f;
        check_large(l, vocab, 1.0, 100, 1.0);
        check_large(l, vocab, 1.0, 0, 0.3);
        check_large(l, vocab, 0.5, 3000, 0.8);
    }
}

/* --- the stream, failures -----------------------------------------------------------------------
 */

static void draw_many(mw_sampler *s, const float *l, int vocab, int32_t *out, int n) {
    for (int i = 0; i < n; i++) out[i] = draw(s, l, vocab);
}

Test(sample, the_seed_decides_the_tokens) {
    float l[1000];
    uint64_t st = 77;
    for (int i = 0; i < 1000; i++) l[i] = (float)rng_uniform(&st);
    int32_t a[64], b[64], c[64];
    mw_sampler *s1 = sampler(1.0, 100, 0.9, 42), *s2 = sampler(1.0, 100, 0.9, 42),
               *s3 = sampler(1.0, 100, 0.9, 43);
    draw_many(s1, l, 1000, a, 64);
    draw_many(s2, l, 1000, b, 64);
    draw_many(s3, l, 1000, c, 64);
    cr_assert_arr_eq(a, b, sizeof a, "the same seed drew other tokens");
    int same = 0;
    for (int i = 0; i < 64; i++) same += a[i] == c[i];
    cr_assert_lt(same, 8, "seeds 42 and 43 drew %d of 64 tokens alike", same);
    mw_sampler_free(s1);
    mw_sampler_free(s2);
    mw_sampler_free(s3);
}

Test(sample, a_position_resumes_the_stream) {
    float l[200];
    uint64_t st = 8;
    for (int i = 0; i < 200; i++) l[i] = (float)(3.0 * rng_uniform(&st));
    int32_t a[20], b[10];
    mw_sampler *s = sampler(0.9, 0, 0.95, 5), *r = sampler(0.9, 0, 0.95, 5);
    draw_many(s, l, 200, a, 20);
    cr_assert_eq(mw_sampler_position(s), 20);
    cr_assert_eq(mw_sampler_set_position(r, 10), MW_OK);
    draw_many(r, l, 200, b, 10);
    cr_assert_arr_eq(a + 10, b, sizeof b, "a sampler set to position 10 drew other tokens");
    mw_sampler_free(s);
    mw_sampler_free(r);
}

Test(sample, a_failed_draw_leaves_the_sampler_as_it_was) {
    float l[] = {0.5f, 1.0f, 2.0f, NAN, 0.0f}, inf[] = {-INFINITY, -INFINITY};
    mw_sampler *s = sampler(1.0, 0, 1.0, 3), *fresh = sampler(1.0, 0, 1.0, 3);
    int32_t t = -7;
    cr_assert_eq(mw_sampler_draw(s, l, 5, &t), MW_ERR_NONFINITE);
    cr_assert(strstr(mw_last_error(), "logit 3 of 5 is NaN"), "%s", mw_last_error());
    cr_assert_eq(mw_sampler_draw(s, inf, 2, &t), MW_ERR_NONFINITE);
    cr_assert_eq(t, -7, "the token was written");
    cr_assert_eq(mw_sampler_position(s), 0);
    l[3] = -INFINITY; /* a ruled-out token is fine */
    cr_assert_eq(draw(s, l, 5), draw(fresh, l, 5));
    mw_sampler_free(s);
    mw_sampler_free(fresh);
}

/* Every allocation of making a sampler and of its first draws, made to fail in turn: each call
 * that hits one returns MW_ERR_NOMEM and changes nothing, and the sampler then draws what one
 * that never failed draws. */
Test(sample, out_of_memory_changes_nothing) {
    float l[3000];
    uint64_t st = 4;
    for (int i = 0; i < 3000; i++) l[i] = (float)(2.0 * rng_uniform(&st));
    const int32_t eos[] = {2999, 0};
    mw_sample_config c = MW_SAMPLE_CONFIG_INIT;
    c.top_k = 20, c.top_p = 0.9, c.seed = 6, c.eos_ids = eos, c.neos = 2;
    mw_sampler *clean;
    cr_assert_eq(mw_sampler_new(&c, &clean), MW_OK);
    int32_t want[3] = {draw(clean, l, 1000), draw(clean, l, 3000), draw(clean, l, 3000)};
    int failures = 0;
    for (int64_t n = 1;; n++) {
        mw_test_control(MW_TEST_FAIL_ALLOCATION, n);
        mw_sampler *s = NULL;
        mw_status st1 = mw_sampler_new(&c, &s);
        int32_t got[3] = {-1, -1, -1};
        int done = 0;
        while (st1 == MW_OK && done < 3) {
            mw_status d = mw_sampler_draw(s, l, done ? 3000 : 1000, &got[done]);
            if (d == MW_OK) {
                done++;
                continue;
            }
            cr_assert_eq(d, MW_ERR_NOMEM, "allocation %lld: %s", (long long)n, mw_last_error());
            cr_assert_eq(mw_sampler_position(s), (uint64_t)done);
            failures++; /* the failure was once: the same draw again */
        }
        int64_t made = mw_test_control(MW_TEST_ALLOCATIONS);
        mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)0);
        if (st1 != MW_OK) {
            cr_assert_eq(st1, MW_ERR_NOMEM);
            cr_assert_null(s);
            failures++;
        } else {
            cr_assert_arr_eq(got, want, sizeof got, "allocation %lld failed: other tokens",
                             (long long)n);
            cr_assert(mw_sampler_is_eos(s, 2999) && mw_sampler_is_eos(s, 0));
        }
        mw_sampler_free(s);
        if (made < n) break; /* the n-th allocation was never reached: every one was tried */
    }
    cr_assert_geq(failures, 4, "only %d allocations failed", failures);
    mw_sampler_free(clean);
}

Test(sample, eos_ids_are_copied) {
    int32_t eos[] = {50256, 7};
    mw_sample_config c = MW_SAMPLE_CONFIG_INIT;
    c.eos_ids = eos, c.neos = 2;
    mw_sampler *s, *none;
    cr_assert_eq(mw_sampler_new(&c, &s), MW_OK);
    eos[0] = 1;
    cr_assert(mw_sampler_is_eos(s, 50256) && mw_sampler_is_eos(s, 7));
    cr_assert(!mw_sampler_is_eos(s, 1) && !mw_sampler_is_eos(s, 8));
    c.eos_ids = NULL, c.neos = 0;
    cr_assert_eq(mw_sampler_new(&c, &none), MW_OK);
    cr_assert(!mw_sampler_is_eos(none, 0) && !mw_sampler_is_eos(none, 50256));
    mw_sampler_free(s);
    mw_sampler_free(none);
}
