/* CPU fused self-attention (mw_attention). Per (batch, head) slice, queries are taken in blocks
 * of MW__ATTN_BLOCK rows; a block's scores against the keys it may see are one GEMM into a
 * block x T scratch, softmaxed row by row, and multiplied into the output by a second GEMM. With
 * a causal mask a block only meets the keys up to its last row, so the masked half of the score
 * matrix is never computed, and no Seq x Seq tensor outlives the kernel. The backward pass
 * recomputes each block's probabilities (bitwise the forward's), then forms dS = P * (dP - D)
 * with D_i = sum_j P_ij dP_ij, and accumulates dK and dV block after block in a fixed order: the
 * result is deterministic. */
#include <cblas.h>
#include <string.h>

#include "devices/cpu/cpu_nn.h"
#include "devices/cpu/rows.h"

/* Offsets of slice s in operand 0 (out or gy) and operand 1 (qkv, and d(qkv) alike). */
static void slice_offsets(const mw__nd *w, int64_t s, int64_t *o0, int64_t *o1) {
    *o0 = *o1 = 0;
    for (int i = w->rank - 1; i >= 0; i--) {
        int64_t idx = s % w->dims[i];
        s /= w->dims[i];
        *o0 += idx * w->stride[0][i];
        *o1 += idx * w->stride[1][i];
    }
}

/* Keys the queries of the block [i0, i0 + m) may see. */
static int64_t block_keys(const mw__k_attention *k, int64_t i0, int64_t m) {
    return k->causal ? i0 + m : k->t;
}

/* P (m x kend, row stride kend) = softmax of scale * q k^T over the keys each row may see; the
 * masked entries of the block's last columns are 0. */
MW__CPU_CLONES
static void block_probs(const mw__k_attention *k, const float *q, const float *kk, int64_t i0,
                        int64_t m, int64_t kend, float *p) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)kend, (int)k->d, k->scale,
                q + i0 * k->seq_qkv, (int)k->seq_qkv, kk, (int)k->seq_qkv, 0.0f, p, (int)kend);
    for (int64_t r = 0; r < m; r++) {
        float *row = p + r * kend;
        int64_t n = k->causal ? i0 + r + 1 : kend;
        mw__row_softmax(row, row, n, 1.0f);
        for (int64_t j = n; j < kend; j++) row[j] = 0.0f;
    }
}

mw_status mw__cpu_attention(mw__device *dev, const mw__k_attention *k) {
    (void)dev;
    int64_t ns = k->slices, blk = k->block;
    for (int64_t s = 0; s < ns; s++) {
        int64_t oo, oq;
        slice_offsets(&k->walk, s, &oo, &oq);
        const float *q = k->qkv + oq, *kk = q + k->part, *v = q + 2 * k->part;
        float *out = k->out + oo;
        for (int64_t i0 = 0; i0 < k->t; i0 += blk) {
            int64_t m = k->t - i0 < blk ? k->t - i0 : blk, kend = block_keys(k, i0, m);
            block_probs(k, q, kk, i0, m, kend, k->scratch);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)k->d, (int)kend,
                        1.0f, k->scratch, (int)kend, v, (int)k->seq_qkv, 0.0f,
                        out + i0 * k->seq_out, (int)k->seq_out);
        }
    }
    return MW_OK;
}

/* dP (in place) -> dS / scale = P * (dP - D) row by row, 0 where masked. */
MW__CPU_CLONES
static void block_dscores(const mw__k_attention *k, const float *p, float *dp, int64_t i0,
                          int64_t m, int64_t kend) {
    for (int64_t r = 0; r < m; r++) {
        const float *pr = p + r * kend;
        float *dr = dp + r * kend;
        int64_t n = k->causal ? i0 + r + 1 : kend;
        float dsum = mw__row_dot(pr, dr, n);
        for (int64_t j = 0; j < n; j++) dr[j] = pr[j] * (dr[j] - dsum);
        for (int64_t j = n; j < kend; j++) dr[j] = 0.0f;
    }
}

mw_status mw__cpu_attention_grad(mw__device *dev, const mw__k_attention *k) {
    (void)dev;
    int64_t ns = k->slices, blk = k->block;
    const int seq = (int)k->seq_qkv, seq_out = (int)k->seq_out, d = (int)k->d;
    float *p = k->scratch, *dp = k->scratch + blk * k->t;
    for (int64_t s = 0; s < ns; s++) {
        int64_t og, oq;
        slice_offsets(&k->walk, s, &og, &oq);
        const float *q = k->qkv + oq, *kk = q + k->part, *v = q + 2 * k->part;
        const float *gy = k->gy + og;
        float *dq = k->out + oq, *dk = dq + k->part, *dv = dq + 2 * k->part;
        for (int64_t i = 0; i < k->t; i++) {
            memset(dk + i * seq, 0, (size_t)d * sizeof(float));
            memset(dv + i * seq, 0, (size_t)d * sizeof(float));
        }
        for (int64_t i0 = 0; i0 < k->t; i0 += blk) {
            int64_t m = k->t - i0 < blk ? k->t - i0 : blk, kend = block_keys(k, i0, m);
            block_probs(k, q, kk, i0, m, kend, p);
            /* dP = dO V^T */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)kend, d, 1.0f,
                        gy + i0 * seq_out, seq_out, v, seq, 0.0f, dp, (int)kend);
            block_dscores(k, p, dp, i0, m, kend);
            /* dQ = scale dS K; dK += scale dS^T Q; dV += P^T dO */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, d, (int)kend, k->scale,
                        dp, (int)kend, kk, seq, 0.0f, dq + i0 * seq, seq);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)kend, d, (int)m, k->scale, dp,
                        (int)kend, q + i0 * seq, seq, 1.0f, dk, seq);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)kend, d, (int)m, 1.0f, p,
                        (int)kend, gy + i0 * seq_out, seq_out, 1.0f, dv, seq);
        }
    }
    return MW_OK;
}
