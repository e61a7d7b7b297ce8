/* Attention of bf16 q, k, v on the CPU's bf16 instructions (AMX, AVX512-BF16) through oneDNN:
 * per (batch, head) slice and block of queries, the products are oneDNN matmuls made when the
 * worker starts (one per block shape: the causal blocks see more keys as they go), reading q, k
 * and v where they lie; the softmax and its gradient run in f32 between them, as in the f32
 * kernel (cpu_attention.c), whose block layout and kept probabilities this path shares.
 *
 *   forward, block b of queries [i0, i0 + m) over keys [0, kend):
 *     S = Q_b K^T (f32) -> P = softmax(scale S) by row (f32; kept for the backward pass where
 *     the plan says) -> O_b = bf16(P) V, written in out's dtype
 *   backward, the same blocks:
 *     P (kept or recomputed), dP = bf16(dO_b) V^T (f32), dS = scale P (dP - rowsum(P dP)) ->
 *     dQ_b = bf16(dS) K; dK += bf16(dS)^T Q_b; dV += bf16(P)^T bf16(dO_b) (f32, d(qkv))
 *
 * So P, dS and dO are rounded to bf16 where a product reads them (as in bf16 flash attention);
 * the softmax statistics, dP and every sum stay f32. dK and dV accumulate over the blocks in
 * order, so the result is deterministic. */
#ifdef MESHWIT_HAVE_DNNL

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "devices/cpu/cpu_attention_impl.h"
#include "devices/cpu/cpu_dnnl.h"
#include "devices/cpu/cpu_isa.h"
#include "devices/cpu/cpu_kernels.h"
#include "devices/cpu/cpu_state.h"
#include "devices/cpu/rows.h"
#include "devices/math.h"

enum { P_S, P_O, P_DP, P_DQ, P_DK, P_DV, NPROD }; /* the products of a block */

/* What attention_prepare makes for one attention instruction. */
typedef struct dnnl_attention {
    mw__cpu_attention_impl_kind kind; /* MW__ATTN_IMPL_DNNL */
    int grad, nblocks;
    mw__dnnl_gemm **prod; /* nblocks x NPROD, NULL where the pass has no such product */
    mw__k_gemm *shape;    /* the descriptor each was made from (pointers set per call) */
    /* In the device's work buffer, after the largest scratchpad: S or P f32 (block x t), P and
     * dS as bf16 (block x t each), dP f32 (block x t), dO as bf16 (block x d). */
    size_t scratch, off_p16, off_dp, off_ds16, off_do16, bytes;
    char name[96];
} dnnl_attention;

static void attention_free(void *p) {
    dnnl_attention *a = p;
    for (int i = 0; a->prod && i < a->nblocks * NPROD; i++) mw__dnnl_gemm_free(a->prod[i]);
    mw__free(a->prod);
    mw__free(a->shape);
    mw__free(a);
}

static size_t up64(size_t n) { return (n + 63) / 64 * 64; }

static int64_t block_rows(const mw__k_attention *k, int b) {
    int64_t i0 = (int64_t)b * k->block;
    return k->t - i0 < k->block ? k->t - i0 : k->block;
}

static int64_t block_keys(const mw__k_attention *k, int b) {
    return k->causal ? (int64_t)b * k->block + block_rows(k, b) : k->t;
}

/* A row-major GEMM descriptor: C (m x n, ldc, dtype c) = A (m x k; stored transposed when ta)
 * B (k x n; transposed when tb), plus beta C. */
static mw__k_gemm gemm(int64_t m, int64_t n, int64_t kk, int ta, int64_t lda, int tb, int64_t ldb,
                       int64_t ldc, mw_dtype c, float beta) {
    return (mw__k_gemm){.beta = beta,
                        .batch = 1,
                        .m = m,
                        .n = n,
                        .k = kk,
                        .trans_a = ta,
                        .trans_b = tb,
                        .lda = lda,
                        .ldb = ldb,
                        .ldc = ldc,
                        .stride_a = 0,
                        .stride_b = 0,
                        .stride_c = 0,
                        .ab_dtype = MW_BF16,
                        .c_dtype = c};
}

mw_status MW__CPU(mw__cpu_attention_prepare)(mw__device *dev, mw__k_attention *k, int grad) {
    k->impl = NULL;
    if (k->rope.dims) { /* its kernel of one compact slice is what runs (cpu_attention.c) */
        mw__k_attention in = mw__attn_rotary_inner(k);
        mw_status st = MW__CPU(mw__cpu_attention_prepare)(dev, &in, grad);
        k->impl = in.impl;
        return st;
    }
    mw__dnnl *d = mw__cpu_dnnl(dev);
    if (k->qkv_dtype != MW_BF16 || !mw__cpu_bf16_native(dev)) return MW_OK;
#ifdef __AVX512F__
    /* AVX512-BF16 without AMX: this library's dot-product tiles, unless MESHWIT_CPU_GEMM=onednn
     * asks for oneDNN's products */
    const mw__cpu_state *cs = dev->impl;
    int amx = mw__isa_of_cpu() == MW__ISA_AMX && cs->cap >= MW__ISA_AMX;
    if (!amx && cs->engine != MW__ENGINE_ONEDNN)
        return MW__CPU(mw__cpu_attention_dp_prepare)(dev, k, grad);
#endif
    if (!d) return MW_OK;
    dnnl_attention *a = mw__calloc(1, sizeof *a);
    int nb = (int)((k->t + k->block - 1) / k->block);
    if (a) {
        a->prod = mw__calloc((size_t)nb * NPROD, sizeof *a->prod);
        a->shape = mw__calloc((size_t)nb * NPROD, sizeof *a->shape);
    }
    mw_status st =
        a && a->prod && a->shape
            ? mw__cpu_own(dev, a, attention_free)
            : mw__error(MW_ERR_NOMEM, "%s: out of memory preparing attention", dev->name);
    if (st) {
        if (a && (!a->prod || !a->shape)) attention_free(a);
        return st;
    }
    a->kind = MW__ATTN_IMPL_DNNL;
    a->grad = grad;
    a->nblocks = nb;
    int64_t seq = k->seq_qkv, d_ = k->d, t = k->t, blk = k->block;
    for (int b = 0; b < nb && st == MW_OK; b++) {
        int64_t m = block_rows(k, b), kend = block_keys(k, b);
        mw__k_gemm *s = &a->shape[b * NPROD];
        s[P_S] = gemm(m, kend, d_, 0, seq, 1, seq, kend, MW_F32, 0.0f);
        if (!grad) {
            s[P_O] = gemm(m, d_, kend, 0, kend, 0, seq, k->seq_out, k->out_dtype, 0.0f);
        } else {
            s[P_DP] = gemm(m, kend, d_, 0, d_, 1, seq, kend, MW_F32, 0.0f);
            s[P_DQ] = gemm(m, d_, kend, 0, kend, 0, seq, seq, MW_F32, 0.0f);
            s[P_DK] = gemm(kend, d_, m, 1, kend, 0, seq, seq, MW_F32, 1.0f);
            s[P_DV] = gemm(kend, d_, m, 1, kend, 0, d_, seq, MW_F32, 1.0f);
        }
        for (int p = 0; p < NPROD && st == MW_OK; p++) {
            if (!s[p].m) continue;
            if ((st = mw__dnnl_gemm_new(d, &s[p], &a->prod[b * NPROD + p]))) break;
            if (!a->prod[b * NPROD + p]) { /* no implementation: the f32 kernel instead */
                k->impl = NULL;
                return MW_OK;
            }
            size_t sp = mw__dnnl_gemm_scratch(a->prod[b * NPROD + p]);
            if (sp > a->scratch) a->scratch = sp;
        }
    }
    if (st) return st;
    /* Each array 64 bytes aligned: a bf16 array of odd length would leave the f32 one after it
     * misaligned. */
    size_t f = sizeof(float), h = sizeof(uint16_t);
    a->off_p16 = up64(a->scratch + (size_t)(blk * t) * f);
    a->off_dp = up64(a->off_p16 + (size_t)(blk * t) * h);
    a->off_ds16 = up64(a->off_dp + (size_t)(blk * t) * f);
    a->off_do16 = up64(a->off_ds16 + (size_t)(blk * t) * h);
    a->bytes = a->off_do16 + (size_t)(blk * d_) * h;
    snprintf(a->name, sizeof a->name, "onednn %s, blocks of %lld queries",
             mw__dnnl_gemm_impl(a->prod[P_S]), (long long)blk);
    k->impl = a;
    return mw__cpu_work_reserve(dev, up64(a->bytes));
}

const char *MW__CPU(mw__cpu_attention_dnnl_name)(const mw__k_attention *k) {
    if (mw__cpu_attention_kind(k) == MW__ATTN_IMPL_DP)
        return "bf16 dot-product tiles (avx512_bf16)";
    return ((const dnnl_attention *)k->impl)->name;
}

static mw_status run(mw__dnnl *d, const dnnl_attention *a, int b, int p, void *c, const void *x,
                     const void *y, void *work) {
    mw__k_gemm g = a->shape[b * NPROD + p];
    g.c = c, g.a = x, g.b = y;
    return mw__dnnl_gemm_run(d, a->prod[b * NPROD + p], &g, work);
}

/* P (m x kend, f32) from S in place: softmax of scale S over the keys each row sees, 0 beyond;
 * and its bf16 rounding into p16 (same layout). */
static void softmax_rows(const mw__k_attention *k, int64_t i0, int64_t m, int64_t kend, float *p,
                         uint16_t *p16) {
    for (int64_t r = 0; r < m; r++) {
        float *row = p + r * kend;
        int64_t n = k->causal ? i0 + r + 1 : kend;
        mw__row_softmax(row, row, n, k->scale);
        for (int64_t j = n; j < kend; j++) row[j] = 0.0f;
    }
    mw__bf16_narrow(m * kend, p, p16);
}

/* dS = scale P (dP - D) with D = rowsum(P dP) over the keys each row sees, rounded into ds16;
 * 0 where masked. */
static void dscores(const mw__k_attention *k, int64_t i0, int64_t m, int64_t kend, const float *p,
                    float *dp, uint16_t *ds16) {
    for (int64_t r = 0; r < m; r++) {
        const float *pr = p + r * kend;
        float *dr = dp + r * kend;
        int64_t n = k->causal ? i0 + r + 1 : kend;
        float dsum = mw__row_dot(pr, dr, n);
        for (int64_t j = 0; j < n; j++) dr[j] = k->scale * pr[j] * (dr[j] - dsum);
        for (int64_t j = n; j < kend; j++) dr[j] = 0.0f;
    }
    mw__bf16_narrow(m * kend, dp, ds16);
}

mw_status MW__CPU(mw__cpu_attention_dnnl)(mw__device *dev, const mw__k_attention *k, int grad) {
#ifdef __AVX512F__
    if (mw__cpu_attention_kind(k) == MW__ATTN_IMPL_DP)
        return MW__CPU(mw__cpu_attention_dp)(dev, k, grad);
#endif
    const dnnl_attention *a = k->impl;
    mw__dnnl *d = mw__cpu_dnnl(dev);
    char *work = mw__cpu_work(dev);
    float *sbuf = (float *)(work + a->scratch), *dp = (float *)(work + a->off_dp);
    uint16_t *p16 = (uint16_t *)(work + a->off_p16), *ds16 = (uint16_t *)(work + a->off_ds16);
    uint16_t *do16 = (uint16_t *)(work + a->off_do16);
    int64_t t = k->t, dd = k->d, seq = k->seq_qkv, esz = k->out_dtype == MW_BF16 ? 2 : 4;
    mw_status st = MW_OK;
    const int64_t G = mw__attn_group(k); /* queries per key/value head: k and v after them */
    for (int64_t s = 0; s < k->slices && st == MW_OK; s++) {
        int64_t oo0, oq0;
        mw__attn_slice_offsets(&k->walk, s, &oo0, &oq0);
        const uint16_t *kk = (const uint16_t *)k->qkv + oq0 + G * k->part, *v = kk + k->part;
        if (grad) { /* dK and dV accumulate over the blocks and the group's queries */
            float *dkv = (float *)k->out + oq0 + G * k->part;
            for (int64_t i = 0; i < t; i++) {
                memset(dkv + i * seq, 0, (size_t)dd * sizeof(float));
                memset(dkv + k->part + i * seq, 0, (size_t)dd * sizeof(float));
            }
        }
        for (int64_t g = 0; g < G && st == MW_OK; g++) {
            int64_t oo = oo0 + g * k->out_group, oq = oq0 + g * k->part;
            const uint16_t *q = (const uint16_t *)k->qkv + oq;
            float *keep = mw__attn_kept(k, s, g);
            for (int b = 0; b < a->nblocks && st == MW_OK; b++) {
                int64_t i0 = (int64_t)b * k->block, m = block_rows(k, b), kend = block_keys(k, b);
                const uint16_t *qb = q + i0 * seq;
                float *p = keep ? keep : sbuf;
                if (keep) keep += m * kend;
                if (!grad || !keep) { /* the block's probabilities, made (and kept) or made again */
                    if ((st = run(d, a, b, P_S, p, qb, kk, work))) break;
                    softmax_rows(k, i0, m, kend, p, p16);
                } else {
                    mw__bf16_narrow(m * kend, p, p16);
                }
                if (!grad) {
                    st = run(d, a, b, P_O, (char *)k->out + (oo + i0 * k->seq_out) * esz, p16, v,
                             work);
                    continue;
                }
                float *dq = (float *)k->out + oq + i0 * seq;
                float *dk = (float *)k->out + oq0 + G * k->part;
                mw__bf16_narrow_rows(m, dd, k->gy + oo + i0 * k->seq_out, k->seq_out, do16, dd);
                if ((st = run(d, a, b, P_DP, dp, do16, v, work))) break;
                dscores(k, i0, m, kend, p, dp, ds16);
                if ((st = run(d, a, b, P_DQ, dq, ds16, kk, work)) ||
                    (st = run(d, a, b, P_DK, dk, ds16, qb, work)))
                    break;
                st = run(d, a, b, P_DV, dk + k->part, p16, do16, work);
            }
        }
    }
    return st;
}

#else
/* ISO C forbids an empty translation unit. */
typedef int mw__cpu_attention_dnnl_unused;
#endif
