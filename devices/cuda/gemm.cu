/* Contractions through cuBLAS (full fp32, no TF32), and the empty-K case. */

#include "devices/cuda/cuda_impl.cuh"

/* Zeroes C[b] (m x n, leading dimension ldc) for every b: a product over an empty K. */
__global__ void k_zero_matrices(int64_t batch, int64_t m, int64_t n, int64_t ldc, int64_t sc,
                                float *c) {
    GRID_LOOP(i, batch * m * n) {
        int64_t b = i / (m * n), r = i / n % m, col = i % n;
        c[b * sc + r * ldc + col] = 0.0f;
    }
}

/* C[b] = beta C[b] + bias + addend[b] (m x n, leading dimension ldc): the epilogue, put into C
 * before the product is added to it. */
__global__ void k_epilogue_first(int64_t batch, int64_t m, int64_t n, int64_t ldc, int64_t sc,
                                 float beta, float *c, const float *bias, const float *addend) {
    GRID_LOOP(i, batch * m * n) {
        int64_t b = i / (m * n), r = i / n % m, col = i % n, at = b * sc + r * ldc + col;
        float v = beta != 0.0f ? c[at] : 0.0f;
        if (bias) v += bias[col];
        if (addend) v += addend[at];
        c[at] = v;
    }
}

static int fits_int(int64_t v) { return v >= 0 && v <= INT32_MAX; }

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: a row-major matrix is its
 * transpose in column-major with the same leading dimension, so cuBLAS gets B first, then A,
 * with m and n swapped. */
mw_status mw__cuda_gemm(mw__device *dev, const mw__k_gemm *k) {
    ENTER(dev);
    if (k->ab_dtype != MW_F32 || k->c_dtype != MW_F32)
        return mw__error(MW_ERR_UNSUPPORTED, "%s: gemm on bf16 is not implemented", dev->name);
    if (k->batch <= 0 || k->m <= 0 || k->n <= 0) return MW_OK;
    float beta = k->beta;
    float *c = (float *)k->c;
    if (k->bias || k->addend) {
        LAUNCH(k_epilogue_first, blocks_for(k->batch * k->m * k->n, THREADS), THREADS, 0, k->batch,
               k->m, k->n, k->ldc, k->stride_c, beta, c, k->bias, k->addend);
        mw_status st = mw__cuda_launched(dev, "gemm epilogue");
        if (st) return st;
        beta = 1.0f;
    }
    if (k->k <= 0) {
        if (beta != 0.0f) return MW_OK; /* C = A B + C with an empty product: unchanged */
        LAUNCH(k_zero_matrices, blocks_for(k->batch * k->m * k->n, THREADS), THREADS, 0, k->batch,
               k->m, k->n, k->ldc, k->stride_c, c);
        return mw__cuda_launched(dev, "gemm (empty K)");
    }
    if (!fits_int(k->m) || !fits_int(k->n) || !fits_int(k->k) || !fits_int(k->lda) ||
        !fits_int(k->ldb) || !fits_int(k->ldc) || !fits_int(k->batch))
        return mw__error(MW_ERR_UNSUPPORTED,
                         "%s: gemm of %lld x %lld x %lld (batch %lld) exceeds cuBLAS's 32-bit "
                         "sizes",
                         dev->name, (long long)k->m, (long long)k->n, (long long)k->k,
                         (long long)k->batch);
    const float one = 1.0f;
    BLAS(dev, cublasSgemmStridedBatched, im->blas, k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
         k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)k->n, (int)k->m, (int)k->k, &one,
         (const float *)k->b, (int)k->ldb, (long long)k->stride_b, (const float *)k->a, (int)k->lda,
         (long long)k->stride_a, &beta, c, (int)k->ldc, (long long)k->stride_c, (int)k->batch);
    return mw__cuda_flagged(dev); /* cuBLAS reports its launch failures in its status */
}
