/* Gradients of the neural-network and reshaping ops against central finite differences, and the
 * errors of their rules.
 *
 * Each case traces a small graph whose differentiable leaves are parameters (MW_INIT_NORMAL, so
 * deterministic), applies one op (or the few ops of one GPT-2 building block), and checks the
 * analytic gradient of L = sum(out * r) (mw_trainer_compute_grads on "cpu:1") element by element
 * against central differences in double (tests/common/fd_grad.h: the method and the tolerances,
 * derived there; cases through a layer norm get twice them).
 *
 * Where an op only moves values (relabels, slices, lookups) the expected gradient is also known
 * exactly (r itself, zero outside a slice, a sum of rows of r), and is checked as such. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "meshwit.h"
#include "tests/common/fd_grad.h"
#include "tests/common/rng.h"

/* The seed of every case's inputs. */
#define SEED 0x5EED0FA11

TestSuite(nn_grad, .description = "NN and reshaping ops: gradients against central differences",
          .timeout = 60);

/* --- embedding -------------------------------------------------------------------------------- */

/* ids [Batch=2, Seq=4]: row 1 is picked four times and row 4 twice (their gradients accumulate),
 * rows 2 and 3 never (zero gradient). d L / d table[v] = sum of r over the positions holding v. */
Test(nn_grad, embedding_repeated_ids) {
    fd_case c;
    fd_begin(&c, SEED);
    static const int32_t ids[8] = {1, 4, 1, 1, 0, 4, 5, 1};
    mw_tensor *table = fd_param(&c, "table", MW_AXES({"Vocab", 6}, {"Dim", 3}), 1.0f);
    mw_tensor *t = fd_ids(&c, "ids", MW_AXES({"Batch", 2}, {"Seq", 4}), ids);
    fd_check(&c, mw_embedding(c.g, table, t, "Vocab"));

    fd_leaf *p = fd_find(c.param, c.nparams, "table"), *r = fd_find(c.input, c.ninputs, "r");
    for (int v = 0; v < 6; v++)
        for (int d = 0; d < 3; d++) {
            double want = 0.0;
            for (int i = 0; i < 8; i++)
                if (ids[i] == v) want += r->data[i * 3 + d];
            /* At most four f32 additions of values below one: within 4 ulps of 4. */
            cr_assert_leq(fabs(p->grad[v * 3 + d] - want), 2e-6, "table[%d][%d]: %.9g, want %.9g",
                          v, d, p->grad[v * 3 + d], want);
            if (v == 2 || v == 3) cr_assert_eq(p->grad[v * 3 + d], 0.0f, "unused row %d", v);
        }
}

/* --- layer norm, GELU, softmax ---------------------------------------------------------------- */

/* x [Batch=2, Row=2, Dim=6]: leading axes are rows. Rows of six N(0, 1) values have standard
 * deviations near one, so 1/std stays small; gain and bias are random so that each term of
 * d/dx (w * xhat) shows. */
Test(nn_grad, layernorm) {
    fd_case c;
    fd_begin(&c, SEED);
    c.tol_scale = 2.0;
    mw_tensor *x = fd_param(&c, "x", MW_AXES({"Batch", 2}, {"Row", 2}, {"Dim", 6}), 1.0f);
    mw_tensor *w = fd_param(&c, "w", MW_AXES({"Dim", 6}), 1.0f);
    mw_tensor *b = fd_param(&c, "b", MW_AXES({"Dim", 6}), 1.0f);
    fd_check(&c, mw_layernorm(c.g, x, w, b, "Dim", 1e-5f));
}

/* Layer norm without a bias (b NULL), as the layernorm test. */
Test(nn_grad, layernorm_without_bias) {
    fd_case c;
    fd_begin(&c, SEED);
    c.tol_scale = 2.0;
    mw_tensor *x = fd_param(&c, "x", MW_AXES({"Batch", 2}, {"Row", 2}, {"Dim", 6}), 1.0f);
    mw_tensor *w = fd_param(&c, "w", MW_AXES({"Dim", 6}), 1.0f);
    fd_check(&c, mw_layernorm(c.g, x, w, NULL, "Dim", 1e-5f));
}

/* SiLU over values on both sides of 0; SwiGLU with the part axis first, in the middle and last
 * (its stride the whole row, a row's part, one element). */
Test(nn_grad, silu) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *x = fd_param(&c, "x", MW_AXES({"Batch", 3}, {"Dim", 5}), 2.0f);
    fd_check(&c, mw_silu(c.g, x));
}

Test(nn_grad, swiglu) {
    static const char *orders[] = {"Part,Batch,Hid", "Batch,Part,Hid", "Batch,Hid,Part"};
    for (int o = 0; o < 3; o++) {
        fd_case c;
        fd_begin(&c, SEED + (uint64_t)o);
        mw_tensor *x = fd_param(&c, "x", MW_AXES({"Batch", 2}, {"Part", 2}, {"Hid", 5}), 2.0f);
        fd_check(&c, mw_swiglu(c.g, mw_permute(c.g, x, orders[o]), "Part"));
    }
}

/* Rotary embeddings in both pairings, with an offset, a partial rotation, llama3 scaling and
 * positions fed per batch row: the gradient is the rotation back. */
Test(nn_grad, rope) {
    for (int v = 0; v < 4; v++) {
        fd_case c;
        fd_begin(&c, SEED + (uint64_t)v);
        mw_graph *g = c.g;
        mw_tensor *x =
            fd_param(&c, "x", MW_AXES({"Batch", 2}, {"Seq", 3}, {"Head", 2}, {"Dim", 8}), 1.0f);
        mw_rope_config cfg = {.theta = 10000.0f, .style = (mw_rope_style)(v & 1), .offset = 2 * v};
        if (v == 2) cfg.dims = 4;
        if (v == 3)
            cfg.scaling = MW_ROPE_SCALING_LLAMA3, cfg.factor = 8.0f, cfg.low_freq_factor = 1.0f,
            cfg.high_freq_factor = 4.0f, cfg.original_max_positions = 16;
        static const int32_t at[] = {5, 11};
        mw_tensor *pos = v == 1 ? fd_ids(&c, "pos", MW_AXES({"Batch", 2}), at) : NULL;
        fd_check(&c, mw_rope(g, x, "Seq", "Dim", pos, &cfg));
    }
}

/* Grouped-query attention, three queries per key/value head, causal and not: each key's and
 * value's gradient sums over its group's queries. */
Test(nn_grad, attention_grouped) {
    for (int causal = 0; causal < 2; causal++) {
        fd_case c;
        fd_begin(&c, SEED + (uint64_t)causal);
        mw_tensor *qkv =
            fd_param(&c, "qkv", MW_AXES({"Seq", 4}, {"KvHead", 2}, {"Part", 5}, {"Dim", 4}), 1.0f);
        fd_check(&c, mw_attention_grouped(c.g, qkv, "Part", "Group", "Seq", "Dim", causal, 0.5f));
    }
}

/* RMS norm, x [Batch=2, Row=2, Dim=6] as the layer norm's: rows of N(0, 1) values have a root
 * mean square near one, so 1/rms stays small; a random gain shows each term of d/dx (w * x/rms).
 * Alone, and as a pre-norm residual block (x + rmsnorm(x) . wo), where the planner folds the
 * weight's gradient and the residual's into the dx kernel. */
Test(nn_grad, rmsnorm) {
    fd_case c;
    fd_begin(&c, SEED);
    c.tol_scale = 2.0;
    mw_tensor *x = fd_param(&c, "x", MW_AXES({"Batch", 2}, {"Row", 2}, {"Dim", 6}), 1.0f);
    mw_tensor *w = fd_param(&c, "w", MW_AXES({"Dim", 6}), 1.0f);
    fd_check(&c, mw_rmsnorm(c.g, x, w, "Dim", 1e-5f));
}

Test(nn_grad, rmsnorm_prenorm) {
    fd_case c;
    fd_begin(&c, SEED);
    c.tol_scale = 2.0;
    mw_graph *g = c.g;
    mw_tensor *x = fd_param(&c, "x", MW_AXES({"Seq", 3}, {"Embed", 4}), 1.0f);
    mw_tensor *w = fd_param(&c, "w", MW_AXES({"Embed", 4}), 1.0f);
    mw_tensor *wo = fd_param(&c, "wo", MW_AXES({"Out", 4}, {"Embed", 4}), 0.5f);
    mw_tensor *h = mw_dot(g, mw_rmsnorm(g, x, w, "Embed", 1e-5f), wo, "Embed");
    fd_check(&c, mw_add(g, x, mw_rename(g, h, "Out", "Embed")));
}

/* The gradient of a permutation is the inverse permutation; a constant adds nothing to it. */
Test(nn_grad, permute_and_full) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *x = fd_param(&c, "x", MW_AXES({"A", 3}, {"B", 4}, {"C", 2}), 1.0f);
    mw_tensor *y = mw_permute(c.g, x, "C,A,B");
    fd_check(&c, mw_mul(c.g, mw_add(c.g, y, mw_full(c.g, MW_AXES({"B", 4}), 0.5f)), y));
}

/* Values with standard deviation 2 reach GELU's curved region and both tails. */
Test(nn_grad, gelu) {
    fd_case c;
    fd_begin(&c, SEED);
    fd_check(&c, mw_gelu(c.g, fd_param(&c, "x", MW_AXES({"A", 3}, {"B", 8}), 2.0f)));
}

Test(nn_grad, gelu_erf) {
    fd_case c;
    fd_begin(&c, SEED);
    fd_check(&c, mw_gelu_erf(c.g, fd_param(&c, "x", MW_AXES({"A", 3}, {"B", 8}), 2.0f)));
}

/* The scale multiplies the logits, so it multiplies the gradient too. */
Test(nn_grad, softmax) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *x = fd_param(&c, "x", MW_AXES({"Row", 3}, {"Class", 5}), 1.0f);
    fd_check(&c, mw_softmax(c.g, x, "Class", 0.7f));
}

/* x [Head, Query, Key]: query i sees keys j <= i + (keys - queries); the hidden logits take no
 * part in the output, so their gradient is exactly zero. */
static void check_causal_softmax(int64_t queries, int64_t keys) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *x = fd_param(&c, "x", MW_AXES({"Head", 2}, {"Query", queries}, {"Key", keys}), 1.0f);
    fd_check(&c, mw_causal_softmax(c.g, x, "Query", "Key", 0.5f));
    fd_leaf *p = &c.param[0];
    for (int64_t h = 0; h < 2; h++)
        for (int64_t i = 0; i < queries; i++)
            for (int64_t j = 0; j < keys; j++) {
                float gr = p->grad[(h * queries + i) * keys + j];
                if (j > i + (keys - queries))
                    cr_assert_eq(gr, 0.0f, "hidden key %lld of query %lld has gradient %g",
                                 (long long)j, (long long)i, gr);
                else if (i + (keys - queries) > 0) /* one visible key: p = 1, a constant */
                    cr_assert_neq(gr, 0.0f, "visible key %lld of query %lld has no gradient",
                                  (long long)j, (long long)i);
            }
}

Test(nn_grad, causal_softmax_square) { check_causal_softmax(4, 4); }

Test(nn_grad, causal_softmax_longer_key) { check_causal_softmax(3, 5); }

/* --- cross-entropy ---------------------------------------------------------------------------- */

/* logits [Batch=2, Seq=3, Vocab=vocab] against targets; with valid < vocab the classes from
 * valid on are padding. Also checks the loss itself against the host's log-sum-exp. */
static void check_cross_entropy(int64_t vocab, int64_t valid, const int32_t targets[6]) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *logits =
        fd_param(&c, "logits", MW_AXES({"Batch", 2}, {"Seq", 3}, {"Vocab", vocab}), 2.0f);
    mw_tensor *t = fd_ids(&c, "targets", MW_AXES({"Batch", 2}, {"Seq", 3}), targets);
    double loss = fd_run(&c, mw_cross_entropy(c.g, logits, t, "Vocab", valid), 1);

    fd_leaf *p = &c.param[0], *r = fd_find(c.input, c.ninputs, "r");
    int64_t classes = valid ? valid : vocab;
    double want = 0.0;
    for (int row = 0; row < 6; row++) {
        const float *x = p->value + row * vocab;
        double s = 0.0;
        for (int64_t j = 0; j < classes; j++) s += exp((double)x[j]);
        want += r->data[row] * (log(s) - x[targets[row]]);
        for (int64_t j = classes; j < vocab; j++)
            cr_assert_eq(p->grad[row * vocab + j], 0.0f, "padded class %lld of row %d: %g",
                         (long long)j, row, p->grad[row * vocab + j]);
    }
    /* Six per-row losses of order one, each in f32: a few ulps of 10. */
    cr_assert_leq(fabs(loss - want), 1e-5 * (1.0 + fabs(want)), "loss %.9g, host %.9g", loss, want);
}

Test(nn_grad, cross_entropy) { check_cross_entropy(5, 0, (const int32_t[6]){0, 4, 2, 2, 1, 3}); }

/* Classes 5 and 6 are padding; target 4, the last real class, appears. */
Test(nn_grad, cross_entropy_padded_classes) {
    check_cross_entropy(7, 5, (const int32_t[6]){4, 0, 2, 4, 1, 3});
}

/* --- reshaping -------------------------------------------------------------------------------- */

Test(nn_grad, split) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *x = fd_param(&c, "x", MW_AXES({"A", 2}, {"B", 6}, {"C", 2}), 1.0f);
    fd_check(&c, mw_split(c.g, x, "B", "P=2,Q"));
    fd_expect_grad_is_r(&c, "x");
}

Test(nn_grad, merge) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *x = fd_param(&c, "x", MW_AXES({"A", 2}, {"B", 3}, {"C", 2}), 1.0f);
    fd_check(&c, mw_merge(c.g, x, "B,C", "BC"));
    fd_expect_grad_is_r(&c, "x");
}

Test(nn_grad, rename) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *x = fd_param(&c, "x", MW_AXES({"A", 3}, {"B", 4}), 1.0f);
    fd_check(&c, mw_rename(c.g, x, "B", "C"));
    fd_expect_grad_is_r(&c, "x");
}

/* A split and a merge back (GPT-2's heads) is the identity. */
Test(nn_grad, split_then_merge) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *x = fd_param(&c, "x", MW_AXES({"Seq", 2}, {"Embed", 12}), 1.0f);
    mw_tensor *h = mw_split(c.g, x, "Embed", "Head=3,HeadDim=4");
    fd_check(&c, mw_merge(c.g, h, "Head,HeadDim", "Embed"));
    fd_expect_grad_is_r(&c, "x");
}

/* x [A=3, Ctx=6], rows [1, 4) of Ctx as Seq: the gradient is r inside, exactly zero outside. */
Test(nn_grad, slice) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *x = fd_param(&c, "x", MW_AXES({"A", 3}, {"Ctx", 6}), 1.0f);
    fd_check(&c, mw_slice(c.g, x, "Ctx", 1, 3, "Seq"));
    fd_leaf *p = &c.param[0], *r = fd_find(c.input, c.ninputs, "r");
    for (int a = 0; a < 3; a++)
        for (int j = 0; j < 6; j++) {
            float want = j >= 1 && j < 4 ? r->data[a * 3 + (j - 1)] : 0.0f;
            cr_assert_eq(p->grad[a * 6 + j], want, "x[%d][%d]: %g, want %g", a, j,
                         p->grad[a * 6 + j], want);
        }
}

/* x [A=3, B=4, C=2], B = 2 selected (B dropped): r at B = 2, exactly zero elsewhere. */
Test(nn_grad, select) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *x = fd_param(&c, "x", MW_AXES({"A", 3}, {"B", 4}, {"C", 2}), 1.0f);
    fd_check(&c, mw_select(c.g, x, "B", 2));
    fd_leaf *p = &c.param[0], *r = fd_find(c.input, c.ninputs, "r");
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 4; b++)
            for (int k = 0; k < 2; k++) {
                float want = b == 2 ? r->data[a * 2 + k] : 0.0f;
                cr_assert_eq(p->grad[(a * 4 + b) * 2 + k], want, "x[%d][%d][%d]", a, b, k);
            }
}

/* GPT-2's qkv: [Seq, QKV=18] split into Part=3 x Head=2 x HeadDim=3, the key part selected from
 * the middle, heads merged back: the gradient is zero in the q and v columns. */
Test(nn_grad, select_part_of_split_axis) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *x = fd_param(&c, "x", MW_AXES({"Seq", 2}, {"QKV", 18}), 1.0f);
    mw_tensor *parts = mw_split(c.g, x, "QKV", "Part=3,Head=2,HeadDim=3");
    fd_check(&c, mw_merge(c.g, mw_select(c.g, parts, "Part", 1), "Head,HeadDim", "Embed"));
    fd_leaf *p = &c.param[0], *r = fd_find(c.input, c.ninputs, "r");
    for (int s = 0; s < 2; s++)
        for (int j = 0; j < 18; j++) {
            float want = j >= 6 && j < 12 ? r->data[s * 6 + (j - 6)] : 0.0f;
            cr_assert_eq(p->grad[s * 18 + j], want, "x[%d][%d]", s, j);
        }
}

/* --- contractions and GPT-2 blocks ------------------------------------------------------------ */

/* Attention scores: q [Batch, Seq, Head, HeadDim] . k [Batch, Key, Head, HeadDim] over HeadDim,
 * with Batch and Head as batch axes, in the order GPT-2 asks for. */
Test(nn_grad, contract_attention_scores) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *q =
        fd_param(&c, "q", MW_AXES({"Batch", 2}, {"Seq", 3}, {"Head", 2}, {"HeadDim", 2}), 1.0f);
    mw_tensor *k =
        fd_param(&c, "k", MW_AXES({"Batch", 2}, {"Key", 3}, {"Head", 2}, {"HeadDim", 2}), 1.0f);
    fd_check(&c, mw_contract(c.g, q, k, "Batch,Head,Seq,Key"));
}

/* Attention output: p [Batch, Head, Seq, Key] . v [Batch, Key, Head, HeadDim] over Key. */
Test(nn_grad, contract_attention_values) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *p =
        fd_param(&c, "p", MW_AXES({"Batch", 2}, {"Head", 2}, {"Seq", 3}, {"Key", 3}), 1.0f);
    mw_tensor *v =
        fd_param(&c, "v", MW_AXES({"Batch", 2}, {"Key", 3}, {"Head", 2}, {"HeadDim", 2}), 1.0f);
    fd_check(&c, mw_contract(c.g, p, v, "Batch,Seq,Head,HeadDim"));
}

/* y = x . W^T + b over named axes: W [Out, In], b [Out] broadcast over Batch. */
Test(nn_grad, linear_with_bias) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *x = fd_param(&c, "x", MW_AXES({"Batch", 3}, {"In", 4}), 1.0f);
    mw_tensor *w = fd_param(&c, "w", MW_AXES({"Out", 5}, {"In", 4}), 1.0f);
    mw_tensor *b = fd_param(&c, "b", MW_AXES({"Out", 5}), 1.0f);
    fd_check(&c, mw_add(c.g, mw_dot(c.g, x, w, "In"), b));
}

/* A residual block's output as gpt2_model.c traces it: x + rename(h . W^T + b, Out -> Embed),
 * which the plan computes as one GEMM onto b + x. */
Test(nn_grad, residual_linear_with_bias) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *x = fd_param(&c, "x", MW_AXES({"Batch", 3}, {"Embed", 4}), 1.0f);
    mw_tensor *h = fd_param(&c, "h", MW_AXES({"Batch", 3}, {"Hidden", 5}), 1.0f);
    mw_tensor *w = fd_param(&c, "w", MW_AXES({"Out", 4}, {"Hidden", 5}), 1.0f);
    mw_tensor *b = fd_param(&c, "b", MW_AXES({"Out", 4}), 1.0f);
    mw_tensor *y = mw_add(c.g, mw_dot(c.g, h, w, "Hidden"), b);
    fd_check(&c, mw_add(c.g, x, mw_rename(c.g, y, "Out", "Embed")));
}

/* An addend the GEMM's epilogue cannot read (one value per row, not per column, nor laid out
 * like C): put into C first, then the product is added onto it (beta 1). */
Test(nn_grad, linear_with_row_addend) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *x = fd_param(&c, "x", MW_AXES({"Batch", 3}, {"In", 4}), 1.0f);
    mw_tensor *w = fd_param(&c, "w", MW_AXES({"Out", 5}, {"In", 4}), 1.0f);
    mw_tensor *a = fd_param(&c, "a", MW_AXES({"Batch", 3}), 1.0f);
    fd_check(&c, mw_add(c.g, mw_dot(c.g, x, w, "In"), a));
}

/* An addend and a residual of the same kind (both laid out like C), which the GEMM's epilogue
 * takes one of at most: they are summed into C before the GEMM adds onto it. */
Test(nn_grad, residual_with_full_addend) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_tensor *x = fd_param(&c, "x", MW_AXES({"Batch", 3}, {"Embed", 4}), 1.0f);
    mw_tensor *h = fd_param(&c, "h", MW_AXES({"Batch", 3}, {"Hidden", 5}), 1.0f);
    mw_tensor *w = fd_param(&c, "w", MW_AXES({"Out", 4}, {"Hidden", 5}), 1.0f);
    mw_tensor *b = fd_param(&c, "b", MW_AXES({"Batch", 3}, {"Out", 4}), 1.0f);
    mw_tensor *y = mw_add(c.g, mw_dot(c.g, h, w, "Hidden"), b);
    fd_check(&c, mw_add(c.g, x, mw_rename(c.g, y, "Out", "Embed")));
}

/* Causal multi-head self-attention as gpt2_model.c traces it, from qkv [Batch, Seq, QKV]:
 * split, select q, k, v, rename Seq to Key, scores, causal softmax, values, merge heads. */
Test(nn_grad, causal_self_attention) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_graph *g = c.g;
    mw_tensor *qkv = fd_param(&c, "qkv", MW_AXES({"Batch", 2}, {"Seq", 3}, {"QKV", 12}), 1.0f);
    mw_tensor *parts = mw_split(g, qkv, "QKV", "Part=3,Head=2,HeadDim=2");
    mw_tensor *q = mw_select(g, parts, "Part", 0);
    mw_tensor *k = mw_rename(g, mw_select(g, parts, "Part", 1), "Seq", "Key");
    mw_tensor *v = mw_rename(g, mw_select(g, parts, "Part", 2), "Seq", "Key");
    mw_tensor *s = mw_contract(g, q, k, "Batch,Head,Seq,Key");
    mw_tensor *pr = mw_causal_softmax(g, s, "Seq", "Key", 1.0f / sqrtf(2.0f));
    mw_tensor *y = mw_contract(g, pr, v, "Batch,Seq,Head,HeadDim");
    fd_check(&c, mw_merge(g, y, "Head,HeadDim", "Embed"));
}

/* The fused kernel on the same layout: qkv [Batch, Seq, Part, Head, HeadDim], causal or not. */
static void check_fused_attention(int causal) {
    fd_case c;
    fd_begin(&c, SEED);
    mw_graph *g = c.g;
    mw_tensor *qkv = fd_param(&c, "qkv", MW_AXES({"Batch", 2}, {"Seq", 5}, {"QKV", 12}), 1.0f);
    mw_tensor *parts = mw_split(g, qkv, "QKV", "Part=3,Head=2,HeadDim=2");
    mw_tensor *y = mw_attention(g, parts, "Part", "Seq", "HeadDim", causal, 1.0f / sqrtf(2.0f));
    fd_check(&c, mw_merge(g, y, "Head,HeadDim", "Embed"));
}

Test(nn_grad, fused_attention_causal) { check_fused_attention(1); }

Test(nn_grad, fused_attention_full) { check_fused_attention(0); }

/* A pre-LN residual block, x + gelu(ln(x) . W^T + b), renamed back to x's axes: x reaches the
 * output twice, once through the residual add. */
Test(nn_grad, residual_block) {
    fd_case c;
    fd_begin(&c, SEED);
    c.tol_scale = 2.0; /* through a layer norm, as in the layernorm test */
    mw_graph *g = c.g;
    mw_tensor *x = fd_param(&c, "x", MW_AXES({"Seq", 3}, {"Embed", 4}), 1.0f);
    mw_tensor *lw = fd_param(&c, "lnw", MW_AXES({"Embed", 4}), 1.0f);
    mw_tensor *lb = fd_param(&c, "lnb", MW_AXES({"Embed", 4}), 1.0f);
    mw_tensor *w = fd_param(&c, "w", MW_AXES({"Out", 4}, {"Embed", 4}), 0.5f);
    mw_tensor *b = fd_param(&c, "b", MW_AXES({"Out", 4}), 0.5f);
    mw_tensor *h = mw_layernorm(g, x, lw, lb, "Embed", 1e-5f);
    h = mw_gelu(g, mw_add(g, mw_dot(g, h, w, "Embed"), b));
    fd_check(&c, mw_add(g, x, mw_rename(g, h, "Out", "Embed")));
}

/* GPT-2's tied head: one table is both the embedding and the output projection,
 * loss = sum(r * xent(embedding(ids) . table)). Its gradient must be the sum of the two uses',
 * which the same graph with two separate tables of the same values gives. */
static mw_tensor *tied_model(fd_case *c, int separate, const float *values,
                             const int32_t *targets) {
    static const int32_t ids[5] = {3, 1, 3, 0, 3};
    mw_graph *g = c->g;
    mw_tensor *in = fd_param_values(c, "wte", MW_AXES({"Vocab", 6}, {"Embed", 4}), values);
    mw_tensor *out =
        separate ? fd_param_values(c, "head", MW_AXES({"Vocab", 6}, {"Embed", 4}), values) : in;
    mw_tensor *t = fd_ids(c, "ids", MW_AXES({"Tok", 5}), ids);
    mw_tensor *y = fd_ids(c, "targets", MW_AXES({"Tok", 5}), targets);
    mw_tensor *logits = mw_dot(g, mw_embedding(g, in, t, "Vocab"), out, "Embed");
    return mw_cross_entropy(g, logits, y, "Vocab", 5); /* row 5 is padding */
}

Test(nn_grad, tied_parameter_used_twice) {
    static const int32_t targets[5] = {1, 3, 0, 4, 2};
    float values[24];
    uint64_t rng = 7;
    for (int i = 0; i < 24; i++) values[i] = (float)rng_uniform(&rng);

    fd_case tied, split;
    fd_begin(&tied, SEED);
    fd_check(&tied, tied_model(&tied, 0, values, targets));
    fd_begin(&split, SEED);
    fd_run(&split, tied_model(&split, 1, values, targets), 0);

    /* Both graphs feed the same r (same generator, same order of draws). */
    fd_leaf *t = &tied.param[0], *in = &split.param[0], *out = &split.param[1];
    int both = 0;
    for (int i = 0; i < 24; i++) {
        double want = (double)in->grad[i] + out->grad[i];
        /* One f32 addition of terms of order one: a few ulps. */
        cr_assert_leq(fabs(t->grad[i] - want), 1e-6 * (1.0 + fabs(want)),
                      "wte[%d]: tied %.9g, embedding %.9g + head %.9g", i, t->grad[i], in->grad[i],
                      out->grad[i]);
        both += in->grad[i] != 0.0f && out->grad[i] != 0.0f;
    }
    cr_assert_geq(both, 8, "rows used by both the lookup and the head: each use contributes");
    /* Row 5 is padding and never looked up: no gradient from either use. */
    for (int i = 20; i < 24; i++) cr_assert_eq(t->grad[i], 0.0f, "padded row, wte[%d]", i);
}

/* --- errors of the rules ---------------------------------------------------------------------- */

TestSuite(nn_errors, .description = "errors of the NN and reshaping ops' rules", .timeout = 60);

static void expect_trace_error(mw_graph *g, mw_tensor *t, mw_status want, const char *needle1,
                               const char *needle2) {
    cr_assert_null(t, "the op should fail with %s", mw_status_name(want));
    cr_assert_eq(mw_graph_status(g), want, "%s, not %s: %s", mw_status_name(mw_graph_status(g)),
                 mw_status_name(want), mw_graph_error(g));
    const char *msg = mw_graph_error(g);
    cr_assert_not_null(strstr(msg, needle1), "message '%s' lacks '%s'", msg, needle1);
    if (needle2) cr_assert_not_null(strstr(msg, needle2), "message '%s' lacks '%s'", msg, needle2);
    mw_graph_free(g);
}

static mw_graph *new_graph(void) {
    mw_graph *g = NULL;
    cr_assert_eq(mw_graph_new(&g), MW_OK, "%s", mw_last_error());
    return g;
}

/* Layer norm, RMS norm, softmax and cross-entropy normalise over the last axis only. */
Test(nn_errors, normalising_over_a_non_last_axis) {
    mw_graph *g = new_graph();
    mw_tensor *x = mw_param(g, "x", MW_AXES({"Row", 3}, {"Dim", 4}), MW_INIT_ZEROS);
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Row", 3}), MW_INIT_ZEROS);
    mw_tensor *b = mw_param(g, "b", MW_AXES({"Row", 3}), MW_INIT_ZEROS);
    expect_trace_error(g, mw_layernorm(g, x, w, b, "Row", 1e-5f), MW_ERR_SHAPE, "mw_layernorm",
                       "last axis");

    g = new_graph();
    x = mw_param(g, "x", MW_AXES({"Row", 3}, {"Dim", 4}), MW_INIT_ZEROS);
    w = mw_param(g, "w", MW_AXES({"Row", 3}), MW_INIT_ZEROS);
    expect_trace_error(g, mw_rmsnorm(g, x, w, "Row", 1e-5f), MW_ERR_SHAPE, "mw_rmsnorm",
                       "last axis");

    g = new_graph();
    x = mw_param(g, "x", MW_AXES({"Row", 3}, {"Dim", 4}), MW_INIT_ZEROS);
    expect_trace_error(g, mw_softmax(g, x, "Row", 1.0f), MW_ERR_SHAPE, "mw_softmax", "last axis");

    g = new_graph();
    x = mw_param(g, "x", MW_AXES({"Vocab", 5}, {"Row", 3}), MW_INIT_ZEROS);
    mw_tensor *t = mw_input(g, "t", MW_I32, MW_AXES({"Row", 3}));
    expect_trace_error(g, mw_cross_entropy(g, x, t, "Vocab", 0), MW_ERR_SHAPE, "mw_cross_entropy",
                       "last axis");

    /* Causal softmax: keys last, queries right before them. */
    g = new_graph();
    x = mw_param(g, "x", MW_AXES({"Query", 3}, {"Head", 2}, {"Key", 3}), MW_INIT_ZEROS);
    expect_trace_error(g, mw_causal_softmax(g, x, "Query", "Key", 1.0f), MW_ERR_SHAPE, "Query",
                       "right before");
}

/* Layer norm's gain and bias must have exactly the normalised axis. */
Test(nn_errors, layernorm_gain_with_other_axes) {
    mw_graph *g = new_graph();
    mw_tensor *x = mw_param(g, "x", MW_AXES({"Row", 3}, {"Dim", 4}), MW_INIT_ZEROS);
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Row", 3}, {"Dim", 4}), MW_INIT_ZEROS);
    mw_tensor *b = mw_param(g, "b", MW_AXES({"Dim", 4}), MW_INIT_ZEROS);
    expect_trace_error(g, mw_layernorm(g, x, w, b, "Dim", 1e-5f), MW_ERR_SHAPE, "mw_layernorm",
                       "Dim");
}

/* RMS norm's gain likewise; and it takes f32 only. */
Test(nn_errors, rmsnorm_gain_with_other_axes) {
    mw_graph *g = new_graph();
    mw_tensor *x = mw_param(g, "x", MW_AXES({"Row", 3}, {"Dim", 4}), MW_INIT_ZEROS);
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Dim", 5}), MW_INIT_ZEROS);
    expect_trace_error(g, mw_rmsnorm(g, x, w, "Dim", 1e-5f), MW_ERR_SHAPE, "mw_rmsnorm", "Dim");

    g = new_graph();
    x = mw_input(g, "x", MW_I32, MW_AXES({"Row", 3}, {"Dim", 4}));
    w = mw_param(g, "w", MW_AXES({"Dim", 4}), MW_INIT_ZEROS);
    expect_trace_error(g, mw_rmsnorm(g, x, w, "Dim", 1e-5f), MW_ERR_DTYPE, "mw_rmsnorm", "f32");
}

/* An input [Row=4, Batch=6] with Batch sharded over X: every op that needs Batch whole on one
 * device refuses it (one fresh graph per op: tracing errors are sticky). */
static mw_graph *sharded_graph(mw_tensor **x) {
    mw_graph *g = new_graph();
    *x = mw_shard(g, mw_input(g, "x", MW_F32, MW_AXES({"Row", 4}, {"Batch", 6})), "Batch", "X");
    cr_assert_not_null(*x, "%s", mw_graph_error(g));
    return g;
}

Test(nn_errors, sharded_axis_where_the_op_needs_it_whole) {
    mw_tensor *x;
    mw_graph *g = sharded_graph(&x);
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Batch", 6}), MW_INIT_ZEROS);
    expect_trace_error(g, mw_layernorm(g, x, w, w, "Batch", 1e-5f), MW_ERR_SHARDING, "mw_layernorm",
                       "sharded");
    g = sharded_graph(&x);
    w = mw_param(g, "w", MW_AXES({"Batch", 6}), MW_INIT_ZEROS);
    expect_trace_error(g, mw_rmsnorm(g, x, w, "Batch", 1e-5f), MW_ERR_SHARDING, "mw_rmsnorm",
                       "sharded");

    g = sharded_graph(&x);
    expect_trace_error(g, mw_softmax(g, x, "Batch", 1.0f), MW_ERR_SHARDING, "mw_softmax", "Batch");
    g = sharded_graph(&x);
    expect_trace_error(g, mw_causal_softmax(g, x, "Row", "Batch", 1.0f), MW_ERR_SHARDING,
                       "mw_causal_softmax", "Batch");
    g = sharded_graph(&x);
    expect_trace_error(g, mw_split(g, x, "Batch", "P=2,Q=3"), MW_ERR_SHARDING, "mw_split", "Batch");
    g = sharded_graph(&x);
    expect_trace_error(g, mw_merge(g, x, "Row,Batch", "RB"), MW_ERR_SHARDING, "mw_merge", "Batch");
    g = sharded_graph(&x);
    expect_trace_error(g, mw_rename(g, x, "Batch", "B"), MW_ERR_SHARDING, "mw_rename", "Batch");
    g = sharded_graph(&x);
    expect_trace_error(g, mw_slice(g, x, "Batch", 0, 2, NULL), MW_ERR_SHARDING, "mw_slice",
                       "Batch");
    g = sharded_graph(&x);
    expect_trace_error(g, mw_select(g, x, "Batch", 1), MW_ERR_SHARDING, "mw_select", "Batch");

    /* Classes sharded: the softmax of cross-entropy needs every class of a row. */
    g = sharded_graph(&x);
    mw_tensor *t = mw_input(g, "t", MW_I32, MW_AXES({"Row", 4}));
    expect_trace_error(g, mw_cross_entropy(g, x, t, "Batch", 0), MW_ERR_SHARDING,
                       "mw_cross_entropy", "Batch");
}

/* Sharding the rows is fine, but logits and targets must be sharded alike. */
Test(nn_errors, cross_entropy_targets_sharded_differently) {
    mw_graph *g = new_graph();
    mw_tensor *logits = mw_shard(
        g, mw_input(g, "logits", MW_F32, MW_AXES({"Batch", 4}, {"Vocab", 5})), "Batch", "X");
    mw_tensor *t = mw_input(g, "t", MW_I32, MW_AXES({"Batch", 4}));
    expect_trace_error(g, mw_cross_entropy(g, logits, t, "Vocab", 0), MW_ERR_SHARDING,
                       "sharded differently", "mw_shard");
}

Test(nn_errors, cross_entropy_mismatched_target_axes) {
    /* A different axis name. */
    mw_graph *g = new_graph();
    mw_tensor *x = mw_param(g, "x", MW_AXES({"Seq", 3}, {"Vocab", 5}), MW_INIT_ZEROS);
    mw_tensor *t = mw_input(g, "t", MW_I32, MW_AXES({"Row", 3}));
    expect_trace_error(g, mw_cross_entropy(g, x, t, "Vocab", 0), MW_ERR_SHAPE, "targets",
                       "same order");
    /* The same axes in another order. */
    g = new_graph();
    x = mw_param(g, "x", MW_AXES({"Batch", 2}, {"Seq", 3}, {"Vocab", 5}), MW_INIT_ZEROS);
    t = mw_input(g, "t", MW_I32, MW_AXES({"Seq", 3}, {"Batch", 2}));
    expect_trace_error(g, mw_cross_entropy(g, x, t, "Vocab", 0), MW_ERR_SHAPE, "targets",
                       "same order");
    /* A different size. */
    g = new_graph();
    x = mw_param(g, "x", MW_AXES({"Seq", 3}, {"Vocab", 5}), MW_INIT_ZEROS);
    t = mw_input(g, "t", MW_I32, MW_AXES({"Seq", 4}));
    expect_trace_error(g, mw_cross_entropy(g, x, t, "Vocab", 0), MW_ERR_SHAPE, "targets", NULL);
    /* One axis too many. */
    g = new_graph();
    x = mw_param(g, "x", MW_AXES({"Seq", 3}, {"Vocab", 5}), MW_INIT_ZEROS);
    t = mw_input(g, "t", MW_I32, MW_AXES({"Seq", 3}, {"Vocab", 5}));
    expect_trace_error(g, mw_cross_entropy(g, x, t, "Vocab", 0), MW_ERR_SHAPE, "targets", NULL);
    /* f32 targets. */
    g = new_graph();
    x = mw_param(g, "x", MW_AXES({"Seq", 3}, {"Vocab", 5}), MW_INIT_ZEROS);
    t = mw_input(g, "t", MW_F32, MW_AXES({"Seq", 3}));
    expect_trace_error(g, mw_cross_entropy(g, x, t, "Vocab", 0), MW_ERR_DTYPE, "targets", "i32");
    /* More valid classes than the axis has. */
    g = new_graph();
    x = mw_param(g, "x", MW_AXES({"Seq", 3}, {"Vocab", 5}), MW_INIT_ZEROS);
    t = mw_input(g, "t", MW_I32, MW_AXES({"Seq", 3}));
    expect_trace_error(g, mw_cross_entropy(g, x, t, "Vocab", 6), MW_ERR_SHAPE, "6 valid", "Vocab");
}

Test(nn_errors, embedding_table_layout) {
    /* The vocabulary must be the table's first axis. */
    mw_graph *g = new_graph();
    mw_tensor *table = mw_param(g, "table", MW_AXES({"Dim", 3}, {"Vocab", 5}), MW_INIT_ZEROS);
    mw_tensor *ids = mw_input(g, "ids", MW_I32, MW_AXES({"Tok", 4}));
    expect_trace_error(g, mw_embedding(g, table, ids, "Vocab"), MW_ERR_SHAPE, "mw_embedding",
                       "Vocab");
    /* f32 ids. */
    g = new_graph();
    table = mw_param(g, "table", MW_AXES({"Vocab", 5}, {"Dim", 3}), MW_INIT_ZEROS);
    ids = mw_input(g, "ids", MW_F32, MW_AXES({"Tok", 4}));
    expect_trace_error(g, mw_embedding(g, table, ids, "Vocab"), MW_ERR_DTYPE, "ids", "i32");
    /* ids that already have the table's Dim axis. */
    g = new_graph();
    table = mw_param(g, "table", MW_AXES({"Vocab", 5}, {"Dim", 3}), MW_INIT_ZEROS);
    ids = mw_input(g, "ids", MW_I32, MW_AXES({"Dim", 4}));
    expect_trace_error(g, mw_embedding(g, table, ids, "Vocab"), MW_ERR_SHAPE, "mw_embedding",
                       "Dim");
}

/* A one-device trainer of loss = sum(r * op(...)) for the run-time errors below. */
typedef struct runner {
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
} runner;

static void runner_start(runner *rn, mw_tensor *out, mw_axes r_axes) {
    mw_graph *g = rn->g;
    mw_tensor *loss = mw_sum(g, mw_mul(g, out, mw_input(g, "r", MW_F32, r_axes)), NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &rn->mesh), MW_OK, "%s", mw_last_error());
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.5f}};
    cr_assert_eq(mw_trainer_new(g, loss, rn->mesh, &cfg, &rn->tr), MW_OK, "%s", mw_last_error());
}

static void runner_free(runner *rn) {
    mw_trainer_free(rn->tr);
    mw_mesh_free(rn->mesh);
    mw_graph_free(rn->g);
}

/* Every way of running the step fails with MW_ERR_INVALID and a message naming the bad value;
 * nothing is updated, and the trainer runs again with good values. */
static void expect_run_error(mw_trainer *tr, const char *ids_name, const int32_t *bad,
                             const int32_t *good, int64_t n, const float *r, int64_t nr,
                             const char *param, int64_t nparam, const char *needle1,
                             const char *needle2) {
    mw_feed feeds[2] = {{ids_name, bad, n}, {"r", r, nr}};
    float before[64], after[64], loss = 0.0f;
    cr_assert_leq(nparam, 64);
    cr_assert_eq(mw_trainer_read_param(tr, param, before, nparam), MW_OK, "%s", mw_last_error());
    for (int way = 0; way < 3; way++) {
        mw_status st = way == 0   ? mw_trainer_eval(tr, feeds, 2, &loss)
                       : way == 1 ? mw_trainer_compute_grads(tr, feeds, 2, &loss)
                                  : mw_trainer_step(tr, feeds, 2, &loss);
        cr_assert_eq(st, MW_ERR_INVALID, "way %d: %s", way, mw_status_name(st));
        const char *msg = mw_last_error();
        cr_assert_not_null(strstr(msg, needle1), "message '%s' lacks '%s'", msg, needle1);
        cr_assert_not_null(strstr(msg, needle2), "message '%s' lacks '%s'", msg, needle2);
    }
    cr_assert_eq(mw_trainer_read_param(tr, param, after, nparam), MW_OK, "%s", mw_last_error());
    cr_assert_arr_eq(before, after, sizeof(float) * (size_t)nparam, "a failed step changed %s",
                     param);
    cr_assert_eq(mw_trainer_steps(tr), 0);

    feeds[0].data = good;
    cr_assert_eq(mw_trainer_step(tr, feeds, 2, &loss), MW_OK, "%s", mw_last_error());
    cr_assert(isfinite(loss));
    cr_assert_eq(mw_trainer_steps(tr), 1);
}

Test(nn_errors, embedding_id_out_of_range_at_run_time) {
    static const float r[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    static const int32_t good[4] = {0, 4, 2, 4};
    runner rn = {.g = new_graph()};
    mw_tensor *table = mw_param(rn.g, "table", MW_AXES({"Vocab", 5}, {"Dim", 2}), MW_INIT_CONST(1));
    mw_tensor *ids = mw_input(rn.g, "ids", MW_I32, MW_AXES({"Tok", 4}));
    runner_start(&rn, mw_embedding(rn.g, table, ids, "Vocab"), MW_AXES({"Tok", 4}, {"Dim", 2}));
    /* The vocabulary's size itself, at position 2. */
    expect_run_error(rn.tr, "ids", (const int32_t[4]){0, 1, 5, 3}, good, 4, r, 8, "table", 10,
                     "embedding id 5", "[0, 5)");
    runner_free(&rn);

    rn = (runner){.g = new_graph()};
    table = mw_param(rn.g, "table", MW_AXES({"Vocab", 5}, {"Dim", 2}), MW_INIT_CONST(1));
    ids = mw_input(rn.g, "ids", MW_I32, MW_AXES({"Tok", 4}));
    runner_start(&rn, mw_embedding(rn.g, table, ids, "Vocab"), MW_AXES({"Tok", 4}, {"Dim", 2}));
    expect_run_error(rn.tr, "ids", (const int32_t[4]){-1, 1, 2, 3}, good, 4, r, 8, "table", 10,
                     "embedding id -1", "at [0] (element 0) of input 'ids'");
    runner_free(&rn);
}

Test(nn_errors, cross_entropy_target_out_of_range_at_run_time) {
    static const float r[3] = {1, 2, 3};
    static const int32_t good[3] = {0, 3, 2};
    const int32_t *bad[3] = {(const int32_t[3]){0, 4, 1},   /* a padded class */
                             (const int32_t[3]){0, 1, 7},   /* beyond the axis */
                             (const int32_t[3]){-2, 1, 1}}; /* negative */
    static const char *needle[3] = {"target 4", "target 7", "target -2"};
    for (int k = 0; k < 3; k++) {
        runner rn = {.g = new_graph()};
        mw_tensor *logits =
            mw_param(rn.g, "logits", MW_AXES({"Row", 3}, {"Vocab", 6}), MW_INIT_NORMAL(1));
        mw_tensor *t = mw_input(rn.g, "targets", MW_I32, MW_AXES({"Row", 3}));
        runner_start(&rn, mw_cross_entropy(rn.g, logits, t, "Vocab", 4), MW_AXES({"Row", 3}));
        expect_run_error(rn.tr, "targets", bad[k], good, 3, r, 3, "logits", 18, needle[k],
                         "[0, 4)");
        runner_free(&rn);
    }
}
