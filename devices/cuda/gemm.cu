/* Contractions through cuBLAS (f32 in full f32, no TF32; bf16 on tensor cores with f32 sums),
 * the epilogue, and the empty-K case. */

#include "devices/cuda/cuda_impl.cuh"

/* Zeroes C[b] (m x n, leading dimension ldc) for every b: a product over an empty K. */
__global__ void k_zero_matrices(int64_t batch, int64_t m, int64_t n, int64_t ldc, int64_t sc,
                                float *c) {
    GRID_LOOP(i, batch * m * n) {
        int64_t b = i / (m * n), r = i / n % m, col = i % n;
        c[b * sc + r * ldc + col] = 0.0f;
    }
}

/* C[b] = beta C[b] + bias + addend[b] (m x n, leading dimension ldc), rounded when C is bf16:
 * the epilogue, put into C before the product is added to it (for a bf16 C that rounds the
 * epilogue once more than the CPU's oneDNN path, which adds it in f32: within half a bf16 ulp of
 * the bias, as PyTorch's autocast adds a bf16 bias). */
template <typename C>
__global__ void k_epilogue_first(int64_t batch, int64_t m, int64_t n, int64_t ldc, int64_t sc,
                                 float beta, C *c, const float *bias, const float *addend) {
    GRID_LOOP(i, batch * m * n) {
        int64_t b = i / (m * n), r = i / n % m, col = i % n, at = b * sc + r * ldc + col;
        float v = beta != 0.0f ? mw__get(c, at) : 0.0f;
        if (bias) v += bias[col];
        if (addend) v += addend[at];
        mw__put(c, at, v);
    }
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: a row-major matrix is its
 * transpose in column-major with the same leading dimension, so cuBLAS gets B first, then A,
 * with m and n swapped. f32 operands: SGEMM in full f32 (no TF32); bf16 ones: tensor cores with
 * f32 accumulation (cublasGemmStridedBatchedEx, CUBLAS_COMPUTE_32F), C in f32 or bf16. */
mw_status mw__cuda_gemm(mw__device *dev, const mw__k_gemm *k) {
    ENTER(dev);
    int ab16 = k->ab_dtype == MW_BF16, c16 = k->c_dtype == MW_BF16;
    if (c16 && (!ab16 || k->beta != 0.0f))
        return mw__error(MW_ERR_UNSUPPORTED, "%s: gemm: a bf16 C needs bf16 operands and beta 0",
                         dev->name);
    if (k->batch <= 0 || k->m <= 0 || k->n <= 0) return MW_OK;
    float beta = k->beta;
    if (k->bias || k->addend) {
        int64_t total = k->batch * k->m * k->n;
        if (c16)
            LAUNCH(k_epilogue_first<uint16_t>, blocks_for(total, THREADS), THREADS, 0, k->batch,
                   k->m, k->n, k->ldc, k->stride_c, beta, (uint16_t *)k->c, k->bias, k->addend);
        else
            LAUNCH(k_epilogue_first<float>, blocks_for(total, THREADS), THREADS, 0, k->batch, k->m,
                   k->n, k->ldc, k->stride_c, beta, (float *)k->c, k->bias, k->addend);
        mw_status st = mw__cuda_launched(dev, "gemm epilogue");
        if (st) return st;
        beta = 1.0f;
    }
    if (k->k <= 0) {
        if (beta != 0.0f) return MW_OK; /* C = A B + C with an empty product: unchanged */
        if (c16) {
            for (int64_t b = 0; b < k->batch; b++)
                CU(dev, cudaMemset2DAsync, (uint16_t *)k->c + b * k->stride_c, (size_t)k->ldc * 2,
                   0, (size_t)k->n * 2, (size_t)k->m, im->stream);
            return mw__cuda_launched(dev, "gemm (empty K)");
        }
        LAUNCH(k_zero_matrices, blocks_for(k->batch * k->m * k->n, THREADS), THREADS, 0, k->batch,
               k->m, k->n, k->ldc, k->stride_c, (float *)k->c);
        return mw__cuda_launched(dev, "gemm (empty K)");
    }
    mw_status limits = mw__cuda_check(MW__I_GEMM, k); /* as the plan was checked */
    if (limits) return limits;
    const float one = 1.0f;
    cublasOperation_t ob = k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t oa = k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (!ab16) {
        BLAS(dev, cublasSgemmStridedBatched, im->blas, ob, oa, (int)k->n, (int)k->m, (int)k->k,
             &one, (const float *)k->b, (int)k->ldb, (long long)k->stride_b, (const float *)k->a,
             (int)k->lda, (long long)k->stride_a, &beta, (float *)k->c, (int)k->ldc,
             (long long)k->stride_c, (int)k->batch);
    } else {
        BLAS(dev, cublasGemmStridedBatchedEx, im->blas, ob, oa, (int)k->n, (int)k->m, (int)k->k,
             &one, k->b, CUDA_R_16BF, (int)k->ldb, (long long)k->stride_b, k->a, CUDA_R_16BF,
             (int)k->lda, (long long)k->stride_a, &beta, k->c, c16 ? CUDA_R_16BF : CUDA_R_32F,
             (int)k->ldc, (long long)k->stride_c, (int)k->batch, CUBLAS_COMPUTE_32F,
             CUBLAS_GEMM_DEFAULT);
    }
    return mw__cuda_flagged(dev); /* cuBLAS reports its launch failures in its status */
}
