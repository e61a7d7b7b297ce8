/* CUDA fused self-attention on tensor cores: mw_attention and its gradient where q, k and v are
 * bf16, flash-style (the scores of a block of queries against a tile of keys at a time, never a
 * whole row of them), on the WMMA bf16 products (16 x 16 x 16, f32 accumulation) of sm_80 and
 * later. The kernels of attention.cu stay the default; MESHWIT_CUDA_ATTENTION=tensor selects these
 * where they apply (flash_applies), so that the GPU check can hold them against the CPU
 * before they become the default.
 *
 * Forward: a block of TC_THREADS (4 warps) per TC_ROWS queries of a (slice, query of the group);
 * each warp owns 16 of the rows. For each tile of TC_COLS keys (causally only tiles at or before
 * the block's last query, the one on the diagonal masked element by element): S = Q K^T on tensor
 * cores into shared memory, the running maximum and sum of each row updated in f32 (two lanes a
 * row), P = exp(scale S - max) rounded to bf16, the row's output rescaled and O += P V on tensor
 * cores. The row sum adds the bf16 P that multiply V, so the normalisation matches them. The
 * output is O / sum, in f32 or bf16.
 *
 * Backward, deterministic (no atomics, every sum in an order fixed by the sizes):
 *   - per block of queries: the log-sum-exp of each row (a pass over the key tiles), then
 *     D_i = sum_j P_ij dP_ij with dP = dO V^T (a second pass), then dS = P (dP - D) rounded to
 *     bf16 and dQ = scale dS K (a third pass); lse and D go to scratch as attention.cu's do;
 *   - per block of keys: for each query of the group in order, the tiles of queries that see
 *     the keys: P^T and dP^T = V dO^T recomputed, dV += P^T dO and dK += dS^T Q, then
 *     dK = scale dK.
 * dO (gy, f32) is rounded to bf16 for its products. Accumulators live in shared memory (the
 * WMMA fragments' layout is opaque, and a row's rescaling needs it), loaded and stored per tile.
 *
 * Head dimensions 16 to TC_MAX_D in steps of 16; any sequence length (tiles past it are zeros and
 * masked). Shared memory: up to about 190 KB (the key-block kernel at D = 128): a launch that the
 * GPU cannot give that much runs attention.cu's kernels instead. */
#include "devices/cuda/attention_tc.cuh"
#include "devices/cuda/cuda_impl.cuh"

/* Whether GPU `ordinal` can run the tensor-core kernels at head dimension d (grad: the gradient's
 * too), and the shared memory they take into *smem: compute capability 8.0 or later, kernels
 * compiled for it (a build for older GPUs alone has empty bodies there: PTX below 8.0), and a
 * block's opt-in shared memory. */
static int device_can(int ordinal, int64_t d, int grad, size_t *smem) {
    if (d < 16 || d > TC_MAX_D || d % 16) return 0;
    int major = 0, optin = 0;
    cudaFuncAttributes fa;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ordinal) !=
            cudaSuccess ||
        cudaFuncGetAttributes(&fa, k_flash_forward<float>) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    int di = (int)d;
    size_t need = smem_forward(di);
    if (grad && smem_dq(di) > need) need = smem_dq(di);
    if (grad && smem_dkv(di) > need) need = smem_dkv(di);
    *smem = need;
    return major >= 8 && fa.ptxVersion >= 80 && need <= (size_t)optin;
}

/* Whether the tensor-core kernels run k (grad: its gradient) on dev: asked for
 * (MESHWIT_CUDA_ATTENTION=tensor), bf16 q, k and v, no rotation, and a GPU that can
 * (device_can). */
static int flash_applies(const mw__device *dev, const mw__k_attention *k, int grad, size_t *smem) {
    const char *want = getenv("MESHWIT_CUDA_ATTENTION");
    if (!want || strcmp(want, "tensor") != 0) return 0;
    if (k->qkv_dtype != MW_BF16 || k->rope.dims) return 0;
    return device_can(dev->ordinal, k->d, grad, smem);
}

extern "C" int mw__cuda_flash_fits(int ordinal, int64_t d) {
    size_t smem = 0;
    return device_can(ordinal, d, 1, &smem);
}

extern "C" const char *mw__cuda_describe(const mw__device *dev, int kind, const void *k) {
    if ((kind != MW__I_ATTENTION && kind != MW__I_ATTENTION_GRAD) || !k) return NULL;
    size_t smem = 0;
    return flash_applies(dev, (const mw__k_attention *)k, kind == MW__I_ATTENTION_GRAD, &smem)
               ? "tensor cores (wmma bf16, flash tiles of 64 x 64)"
               : "f32 rows (a block per query row)";
}

/* The outcome of a launch (e: cudaSuccess, then the launch's own error is asked for). */
static mw_status launched(const mw__device *dev, const mw__k_attention *k, const char *what,
                          cudaError_t e = cudaSuccess) {
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e == cudaSuccess) return MW_OK;
    return mw__error(MW_ERR_DEVICE, "%s: %s (t=%lld, d=%lld): %s", dev->name, what, (long long)k->t,
                     (long long)k->d, cudaGetErrorString(e));
}

template <typename F> static cudaError_t allow_smem(F *kernel, size_t bytes) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

int mw__cuda_flash(mw__device *dev, const mw__k_attention *k, int grad, mw_status *st) {
    size_t smem = 0;
    if (!flash_applies(dev, k, grad, &smem)) return 0;
    cuda_impl *im = impl_of(dev);
    mw__k_attention kk = *k;
    kk.group = mw__attn_group(k);
    int d = (int)k->d;
    unsigned qblocks = (unsigned)((k->t + TC_ROWS - 1) / TC_ROWS);
    dim3 grid(qblocks, (unsigned)(k->slices * kk.group));
    if (!grad) {
        size_t bytes = smem_forward(d);
        cudaError_t e = k->out_dtype == MW_BF16 ? allow_smem(k_flash_forward<uint16_t>, bytes)
                                                : allow_smem(k_flash_forward<float>, bytes);
        if (e != cudaSuccess) {
            *st = launched(dev, k, "attention kernel (tensor cores): shared memory", e);
            return 1;
        }
        if (k->out_dtype == MW_BF16)
            k_flash_forward<uint16_t><<<grid, TC_THREADS, bytes, im->stream>>>(kk);
        else
            k_flash_forward<float><<<grid, TC_THREADS, bytes, im->stream>>>(kk);
        *st = launched(dev, k, "attention kernel (tensor cores)");
        return 1;
    }
    /* lse and D where attention.cu's kernels keep them (the plan sized the scratch for those). */
    float *lse = k->scratch + 2 * k->block * k->t, *dsum = lse + k->slices * kk.group * k->t;
    cudaError_t e = allow_smem(k_flash_dq, smem_dq(d));
    if (e == cudaSuccess) e = allow_smem(k_flash_dkv, smem_dkv(d));
    if (e != cudaSuccess) {
        *st = launched(dev, k, "attention gradient kernel (tensor cores): shared memory", e);
        return 1;
    }
    k_flash_dq<<<grid, TC_THREADS, smem_dq(d), im->stream>>>(kk, lse, dsum);
    if ((*st = launched(dev, k, "attention gradient kernel (tensor cores, queries)"))) return 1;
    dim3 keys(qblocks, (unsigned)k->slices);
    k_flash_dkv<<<keys, TC_THREADS, smem_dkv(d), im->stream>>>(kk, lse, dsum);
    *st = launched(dev, k, "attention gradient kernel (tensor cores, keys and values)");
    return 1;
}
