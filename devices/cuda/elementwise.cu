/* Element-wise ops: binary arithmetic, copies (permute, broadcast, scale), fill, GELU and its
 * gradient, the maps of devices/math.h and their gradients, dropout (its mask the CPU's integer
 * hash). Arithmetic, copies and the mask: one IEEE operation per element, the CPU's bits. GELU
 * and the maps evaluate devices/math.h's formulas with CUDA's expf, tanhf and erff and nvcc's
 * multiply-add contractions: within a few ulp of the CPU's values, not its bits (the tests
 * compare them with tolerances derived from the formulas). */

#include "devices/cuda/cuda_impl.cuh"

/* --- element-wise kernels --------------------------------------------------------------------- */

template <int OP>
__global__ void k_binary_1d(int64_t n, float *out, int64_t so, const float *a, int64_t sa,
                            const float *b, int64_t sb) {
    GRID_LOOP(i, n) out[i * so] = mw__binop_apply(OP, a[i * sa], b[i * sb]);
}

template <int OP, typename I>
__global__ void k_binary_nd(mw__nd nd, I total, float *out, const float *a, const float *b) {
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (I)blockDim.x * gridDim.x) {
        int64_t o[3];
        nd_offsets<3>(nd, i, o);
        out[o[0]] = mw__binop_apply(OP, a[o[1]], b[o[2]]);
    }
}

/* out = alpha a, converting between f32 and bf16 (O and A each float or uint16_t). */
template <typename O, typename A>
__global__ void k_copy_1d(int64_t n, float alpha, O *out, int64_t so, const A *a, int64_t sa) {
    GRID_LOOP(i, n) mw__put(out, i * so, alpha * mw__get(a, i * sa));
}

template <typename I, typename O, typename A>
__global__ void k_copy_nd(mw__nd nd, I total, float alpha, O *out, const A *a) {
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (I)blockDim.x * gridDim.x) {
        int64_t o[2];
        nd_offsets<2>(nd, i, o);
        mw__put(out, o[0], alpha * mw__get(a, o[1]));
    }
}

/* i32 elements moved as they are (the CPU's move_row): through a float, alpha * a would turn
 * every int in [-2^23 + 1, -1] (a NaN's bits) into 0x7FFFFFFF and round the large ones. */
__global__ void k_move_1d(int64_t n, uint32_t *out, int64_t so, const uint32_t *a, int64_t sa) {
    GRID_LOOP(i, n) out[i * so] = a[i * sa];
}

template <typename I>
__global__ void k_move_nd(mw__nd nd, I total, uint32_t *out, const uint32_t *a) {
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (I)blockDim.x * gridDim.x) {
        int64_t o[2];
        nd_offsets<2>(nd, i, o);
        out[o[0]] = a[o[1]];
    }
}

__global__ void k_fill(int64_t n, float value, float *out) { GRID_LOOP(i, n) out[i] = value; }

/* fn, an mw__unop: GELU's tanh form, its exact (erf) form, or SiLU. */
__device__ __forceinline__ float gelu_of(int fn, float x) {
    return fn == MW__UN_GELU_ERF ? mw__gelu_erf(x) : fn == MW__UN_SILU ? mw__silu(x) : mw__gelu(x);
}
__device__ __forceinline__ float gelu_grad_of(int fn, float x) {
    return fn == MW__UN_GELU_ERF ? mw__gelu_erf_grad(x)
           : fn == MW__UN_SILU   ? mw__silu_grad(x)
                                 : mw__gelu_grad(x);
}

template <typename O> __global__ void k_gelu(int64_t n, O *out, const float *a, int fn) {
    GRID_LOOP(i, n) mw__put(out, i, gelu_of(fn, a[i]));
}

/* One element of the GELU gradient, gy * gelu'(x), rounded as a product of its own (never fused
 * into a following addition): the f32 value both the gradient and its column sums use. */
__device__ __forceinline__ float gelu_grad_term(int fn, float gy, float x) {
    return __fmul_rn(gy, gelu_grad_of(fn, x));
}

template <typename O>
__global__ void k_gelu_grad(int64_t n, O *out, const float *gy, const float *x, int fn) {
    GRID_LOOP(i, n) mw__put(out, i, gelu_grad_term(fn, gy[i], x[i]));
}

/* colsum[j] = sum over rows, in row order, of gy * gelu'(x) at (r, j): the bias gradient of a
 * bf16 GELU gradient, from its f32 values, in the CPU kernel's order and roundings
 * (devices/cpu/cpu_elementwise.c: each row's products added into the sums as they are
 * written): s = s + round(gy * g'), each addition rounded (__fadd_rn: nvcc would otherwise fuse
 * s + gy * g' into one FMA). The sums then differ from the CPU's only as far as the terms do,
 * gelu' being within a few ulp of the CPU's (above). The order leaves no parallelism within
 * a column, so a block of COLSUM_THREADS takes COLSUM_COLS columns: all its threads compute the
 * products of COLSUM_ROWS rows into shared memory (the costly part, gelu' and the loads, spread
 * over 8 warps and ~cols / 32 blocks instead of one thread per column), then one thread per
 * column adds them in row order. */
#define COLSUM_COLS 32
#define COLSUM_ROWS 64
#define COLSUM_THREADS 256
__global__ void k_gelu_grad_colsum(int64_t rows, int64_t cols, float *colsum, const float *gy,
                                   const float *x, int fn) {
    __shared__ float tile[COLSUM_ROWS][COLSUM_COLS + 1];
    int lane = threadIdx.x % COLSUM_COLS, row0 = threadIdx.x / COLSUM_COLS;
    for (int64_t c0 = (int64_t)blockIdx.x * COLSUM_COLS; c0 < cols;
         c0 += (int64_t)gridDim.x * COLSUM_COLS) {
        int64_t j = c0 + lane;
        float s = 0.0f;
        for (int64_t r0 = 0; r0 < rows; r0 += COLSUM_ROWS) {
            int64_t m = rows - r0 < COLSUM_ROWS ? rows - r0 : COLSUM_ROWS;
            for (int r = row0; r < m; r += COLSUM_THREADS / COLSUM_COLS)
                if (j < cols) {
                    int64_t at = (r0 + r) * cols + j;
                    tile[r][lane] = gelu_grad_term(fn, gy[at], x[at]);
                }
            __syncthreads();
            if (threadIdx.x < COLSUM_COLS && j < cols)
                for (int r = 0; r < m; r++) s = __fadd_rn(s, tile[r][lane]);
            __syncthreads();
        }
        if (threadIdx.x < COLSUM_COLS && j < cols) colsum[j] = s;
    }
}

__global__ void k_map(int64_t n, int fn, float *out, const float *a) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = mw__map(fn, a[i]);
}

__global__ void k_map_grad(int64_t n, int fn, float *out, const float *x, const float *gy) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = gy[i] * mw__map_grad(fn, x[i]);
}

/* Element i of the local box: its global index from its local coordinates. */
__global__ void k_dropout(mw__k_dropout k, uint64_t key, uint32_t threshold) {
    float scale = 1.0f / (1.0f - k.p);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < k.count;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t rest = i, g = 0;
        for (int d = k.rank - 1; d >= 0; d--) {
            g += (k.lo[d] + rest % k.len[d]) * k.gstride[d];
            rest /= k.len[d];
        }
        k.out[i] = mw__dropout_keep(key, (uint64_t)g, threshold) ? k.a[i] * scale : 0.0f;
    }
}

/* --- entry points ------------------------------------------------------------------------ */

template <int OP>
static void launch_binary(cuda_impl *im, const mw__nd &nd, int64_t total, const mw__k_binary *k) {
    if (nd.rank <= 1) {
        int64_t s0 = nd.rank ? nd.stride[0][0] : 0, s1 = nd.rank ? nd.stride[1][0] : 0;
        int64_t s2 = nd.rank ? nd.stride[2][0] : 0;
        LAUNCH(k_binary_1d<OP>, blocks_for(total, THREADS), THREADS, 0, total, k->out, s0, k->a, s1,
               k->b, s2);
    } else if (total < INT32_MAX) {
        k_binary_nd<OP, uint32_t><<<blocks_for(total, THREADS), THREADS, 0, im->stream>>>(
            nd, (uint32_t)total, k->out, k->a, k->b);
    } else {
        k_binary_nd<OP, int64_t>
            <<<blocks_for(total, THREADS), THREADS, 0, im->stream>>>(nd, total, k->out, k->a, k->b);
    }
}

mw_status mw__cuda_binary(mw__device *dev, const mw__k_binary *k) {
    ENTER(dev);
    mw__nd nd = k->nd;
    mw__nd_simplify(&nd, 3);
    int64_t total = nd_total(&nd);
    if (total <= 0) return MW_OK;
    switch (k->op) {
    case MW__BIN_ADD: launch_binary<MW__BIN_ADD>(im, nd, total, k); break;
    case MW__BIN_SUB: launch_binary<MW__BIN_SUB>(im, nd, total, k); break;
    case MW__BIN_MUL: launch_binary<MW__BIN_MUL>(im, nd, total, k); break;
    case MW__BIN_DIV: launch_binary<MW__BIN_DIV>(im, nd, total, k); break;
    default:
        return mw__error(MW_ERR_UNSUPPORTED, "%s: unknown binary op %d", dev->name, (int)k->op);
    }
    return mw__cuda_launched(dev, "binary kernel");
}

template <typename O, typename A>
static void launch_copy(cuda_impl *im, const mw__nd &nd, int64_t total, float alpha, void *out,
                        const void *a) {
    if (nd.rank <= 1) {
        int64_t s0 = nd.rank ? nd.stride[0][0] : 0, s1 = nd.rank ? nd.stride[1][0] : 0;
        LAUNCH((k_copy_1d<O, A>), blocks_for(total, THREADS), THREADS, 0, total, alpha, (O *)out,
               s0, (const A *)a, s1);
    } else if (total < INT32_MAX) {
        LAUNCH((k_copy_nd<uint32_t, O, A>), blocks_for(total, THREADS), THREADS, 0, nd,
               (uint32_t)total, alpha, (O *)out, (const A *)a);
    } else {
        LAUNCH((k_copy_nd<int64_t, O, A>), blocks_for(total, THREADS), THREADS, 0, nd, total, alpha,
               (O *)out, (const A *)a);
    }
}

static void launch_move(cuda_impl *im, const mw__nd &nd, int64_t total, void *out, const void *a) {
    uint32_t *o = (uint32_t *)out;
    const uint32_t *src = (const uint32_t *)a;
    if (nd.rank <= 1) {
        int64_t s0 = nd.rank ? nd.stride[0][0] : 0, s1 = nd.rank ? nd.stride[1][0] : 0;
        LAUNCH(k_move_1d, blocks_for(total, THREADS), THREADS, 0, total, o, s0, src, s1);
    } else if (total < INT32_MAX) {
        LAUNCH(k_move_nd<uint32_t>, blocks_for(total, THREADS), THREADS, 0, nd, (uint32_t)total, o,
               src);
    } else {
        LAUNCH(k_move_nd<int64_t>, blocks_for(total, THREADS), THREADS, 0, nd, total, o, src);
    }
}

mw_status mw__cuda_copy(mw__device *dev, const mw__k_copy *k) {
    ENTER(dev);
    int i32 = k->out_dtype == MW_I32 || k->a_dtype == MW_I32;
    if (i32 && (k->out_dtype != k->a_dtype || k->alpha != 1.0f))
        return mw__error(MW_ERR_DTYPE, "%s: copy: i32 elements only move as they are", dev->name);
    mw__nd nd = k->nd;
    mw__nd_simplify(&nd, 2);
    int64_t total = nd_total(&nd);
    if (total <= 0) return MW_OK;
    int o16 = k->out_dtype == MW_BF16, a16 = k->a_dtype == MW_BF16;
    int64_t s0 = nd.rank ? nd.stride[0][0] : 0, s1 = nd.rank ? nd.stride[1][0] : 0;
    if (nd.rank <= 1 && s0 == 1 && s1 == 1 && k->alpha == 1.0f && o16 == a16) {
        /* 4-byte elements (f32, i32) or 2-byte ones (bf16) as they are */
        CU(dev, cudaMemcpyAsync, k->out, k->a, (size_t)total * (o16 ? 2 : 4),
           cudaMemcpyDeviceToDevice, im->stream);
        return mw__cuda_launched(dev, "copy");
    }
    if (i32)
        launch_move(im, nd, total, k->out, k->a);
    else if (o16 && a16)
        launch_copy<uint16_t, uint16_t>(im, nd, total, k->alpha, k->out, k->a);
    else if (o16)
        launch_copy<uint16_t, float>(im, nd, total, k->alpha, k->out, k->a);
    else if (a16)
        launch_copy<float, uint16_t>(im, nd, total, k->alpha, k->out, k->a);
    else
        launch_copy<float, float>(im, nd, total, k->alpha, k->out, k->a);
    return mw__cuda_launched(dev, "copy kernel");
}

mw_status mw__cuda_fill(mw__device *dev, const mw__k_fill *k) {
    ENTER(dev);
    if (k->count <= 0) return MW_OK;
    if (k->value == 0.0f && !signbit(k->value))
        CU(dev, cudaMemsetAsync, k->out, 0, (size_t)k->count * sizeof(float), im->stream);
    else
        LAUNCH(k_fill, blocks_for(k->count, THREADS), THREADS, 0, k->count, k->value, k->out);
    return mw__cuda_launched(dev, "fill kernel");
}

mw_status mw__cuda_unary(mw__device *dev, const mw__k_unary *k) {
    ENTER(dev);
    if (k->op != MW__UN_GELU && k->op != MW__UN_GELU_ERF && k->op != MW__UN_SILU)
        return mw__error(MW_ERR_UNSUPPORTED, "%s: unknown unary op %d", dev->name, (int)k->op);
    if (k->count <= 0) return MW_OK;
    int fn = (int)k->op; /* as gelu_of reads it */
    if (k->out_dtype == MW_BF16)
        LAUNCH(k_gelu<uint16_t>, blocks_for(k->count, THREADS), THREADS, 0, k->count,
               (uint16_t *)k->out, k->a, fn);
    else
        LAUNCH(k_gelu<float>, blocks_for(k->count, THREADS), THREADS, 0, k->count, (float *)k->out,
               k->a, fn);
    return mw__cuda_launched(dev, "unary kernel");
}

mw_status mw__cuda_unary_grad(mw__device *dev, const mw__k_unary_grad *k) {
    ENTER(dev);
    if (k->op != MW__UN_GELU && k->op != MW__UN_GELU_ERF && k->op != MW__UN_SILU)
        return mw__error(MW_ERR_UNSUPPORTED, "%s: unknown unary op %d", dev->name, (int)k->op);
    int bf16 = k->out_dtype == MW_BF16, fn = (int)k->op; /* as gelu_of reads it */
    if (k->count > 0) {
        if (bf16)
            LAUNCH(k_gelu_grad<uint16_t>, blocks_for(k->count, THREADS), THREADS, 0, k->count,
                   (uint16_t *)k->out, k->gy, k->x, fn);
        else
            LAUNCH(k_gelu_grad<float>, blocks_for(k->count, THREADS), THREADS, 0, k->count,
                   (float *)k->out, k->gy, k->x, fn);
        mw_status st = mw__cuda_launched(dev, "unary gradient kernel");
        if (st) return st;
    }
    if (!k->colsum) return MW_OK;
    if (bf16) {
        if (k->cols <= 0) return MW_OK;
        int64_t rows = k->count / k->cols;
        int64_t groups = (k->cols + COLSUM_COLS - 1) / COLSUM_COLS;
        LAUNCH(k_gelu_grad_colsum, (unsigned)(groups < 65535 ? groups : 65535), COLSUM_THREADS, 0,
               rows, k->cols, k->colsum, k->gy, k->x, fn);
        return mw__cuda_launched(dev, "unary gradient column sums");
    }
    /* The bias gradient the plan folded in: the column sums of out, by the reduce kernel. */
    mw__k_reduce kb = mw__column_sums(k->cols ? k->count / k->cols : 0, k->cols, k->cols, 1.0f,
                                      k->colsum, (const float *)k->out);
    return mw__cuda_reduce(dev, &kb);
}

extern "C" mw_status mw__cuda_map(mw__device *dev, const mw__k_map *k) {
    mw_status st = enter_gpu(dev);
    if (st || k->count <= 0) return st;
    k_map<<<wide_blocks(k->count), THREADS, 0, mw__cuda_stream(dev)>>>(k->count, k->fn, k->out,
                                                                       k->a);
    return launch_error(dev, "map kernel");
}

extern "C" mw_status mw__cuda_map_grad(mw__device *dev, const mw__k_map_grad *k) {
    mw_status st = enter_gpu(dev);
    if (st || k->count <= 0) return st;
    k_map_grad<<<wide_blocks(k->count), THREADS, 0, mw__cuda_stream(dev)>>>(k->count, k->fn, k->out,
                                                                            k->x, k->gy);
    return launch_error(dev, "map gradient kernel");
}

extern "C" mw_status mw__cuda_dropout(mw__device *dev, const mw__k_dropout *k) {
    mw_status st = enter_gpu(dev);
    if (st || k->count <= 0) return st;
    cudaStream_t s = mw__cuda_stream(dev);
    if (!k->active || k->p <= 0.0f) {
        if (k->out == k->a) return MW_OK;
        cudaError_t e = cudaMemcpyAsync(k->out, k->a, (size_t)k->count * sizeof(float),
                                        cudaMemcpyDeviceToDevice, s);
        return e == cudaSuccess ? MW_OK
                                : mw__error(MW_ERR_DEVICE, "%s: dropout copy failed: %s", dev->name,
                                            cudaGetErrorString(e));
    }
    k_dropout<<<wide_blocks(k->count), THREADS, 0, s>>>(*k, mw__dropout_key(k->seed, k->step),
                                                        mw__dropout_threshold(k->p));
    return launch_error(dev, "dropout kernel");
}

/* SwiGLU: out[o, i] = silu(gate) * up, gate and up the two rows of inner of block o of x. */
template <typename O>
__global__ void k_swiglu(int64_t outer, int64_t inner, O *out, const float *x) {
    GRID_LOOP(t, outer * inner) {
        int64_t o = t / inner, i = t - o * inner;
        const float *gate = x + 2 * o * inner;
        mw__put(out, t, mw__silu(gate[i]) * gate[inner + i]);
    }
}

/* Its gradient into x's layout: gy * up * silu'(gate), then gy * silu(gate). */
__global__ void k_swiglu_grad(int64_t outer, int64_t inner, float *dx, const float *gy,
                              const float *x) {
    GRID_LOOP(t, outer * inner) {
        int64_t o = t / inner, i = t - o * inner, at = 2 * o * inner + i;
        float g = gy[t], a = x[at], u = x[at + inner];
        dx[at] = g * u * mw__silu_grad(a);
        dx[at + inner] = g * mw__silu(a);
    }
}

extern "C" mw_status mw__cuda_swiglu(mw__device *dev, const mw__k_swiglu *k) {
    ENTER(dev);
    int64_t n = k->outer * k->inner;
    if (n <= 0) return MW_OK;
    if (k->out_dtype == MW_BF16)
        LAUNCH(k_swiglu<uint16_t>, blocks_for(n, THREADS), THREADS, 0, k->outer, k->inner,
               (uint16_t *)k->out, k->x);
    else
        LAUNCH(k_swiglu<float>, blocks_for(n, THREADS), THREADS, 0, k->outer, k->inner,
               (float *)k->out, k->x);
    return mw__cuda_launched(dev, "swiglu kernel");
}

extern "C" mw_status mw__cuda_swiglu_grad(mw__device *dev, const mw__k_swiglu *k) {
    ENTER(dev);
    int64_t n = k->outer * k->inner;
    if (n <= 0) return MW_OK;
    LAUNCH(k_swiglu_grad, blocks_for(n, THREADS), THREADS, 0, k->outer, k->inner, (float *)k->out,
           k->gy, k->x);
    return mw__cuda_launched(dev, "swiglu gradient kernel");
}
