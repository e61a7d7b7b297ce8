/* Row ops of neural networks: layer norm and RMS norm and their gradients, softmax and its
 * gradient, cross-entropy and its gradient. One block (or warp) per row, statistics in double. */

#include "devices/cuda/cuda_impl.cuh"

/* --- layer norm ------------------------------------------------------------------------------- */

/* Mean and 1/sqrt(biased variance + eps) of a row of n: two passes accumulated in double, as the
 * CPU backend does; every thread gets both. */
template <int BS>
__device__ __forceinline__ void row_stats(const float *x, int64_t n, float eps, double *sh,
                                          float *mean, float *rstd) {
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += BS) s += x[j];
    double mu = block_sum_d<BS>(s, sh) / (double)n;
    double q = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += BS) {
        double d = x[j] - mu;
        q += d * d;
    }
    double var = block_sum_d<BS>(q, sh) / (double)n;
    *mean = (float)mu;
    *rstd = (float)(1.0 / sqrt(var + eps));
}

template <int BS, typename O>
__global__ void k_layernorm(int64_t rows, int64_t n, float eps, O *out, const float *x,
                            const float *w, const float *b) {
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * n;
        O *o = out + r * n;
        float mean, rstd;
        row_stats<BS>(xr, n, eps, sh, &mean, &rstd);
        for (int64_t j = threadIdx.x; j < n; j += BS)
            mw__put(o, j, (xr[j] - mean) * rstd * w[j] + (b ? b[j] : 0.0f));
    }
}

/* dx = rstd * (dy - mean(dy) - xhat * mean(dy * xhat)), dy = gy * w; the means in double. */
template <int BS>
__global__ void k_layernorm_dx(int64_t rows, int64_t n, float eps, float *out, const float *gy,
                               const float *x, const float *w) {
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * n, *gr = gy + r * n;
        float *o = out + r * n;
        float mean, rstd;
        row_stats<BS>(xr, n, eps, sh, &mean, &rstd);
        double s1 = 0.0, s2 = 0.0;
        for (int64_t j = threadIdx.x; j < n; j += BS) {
            float dy = gr[j] * w[j], xhat = (xr[j] - mean) * rstd;
            s1 += dy;
            s2 += dy * xhat;
        }
        float c1 = (float)(block_sum_d<BS>(s1, sh) / (double)n);
        float c2 = (float)(block_sum_d<BS>(s2, sh) / (double)n);
        for (int64_t j = threadIdx.x; j < n; j += BS) {
            float dy = gr[j] * w[j], xhat = (xr[j] - mean) * rstd;
            o[j] = rstd * (dy - c1 - xhat * c2);
        }
    }
}

/* dw partials: block p sums gy * xhat over its chunk of rows, in row order, into partial row p
 * (accumulated in shared memory when n fits, else in the partial row itself). */
template <int BS>
__global__ void k_layernorm_dw_parts(int64_t rows, int64_t n, float eps, int64_t chunk,
                                     int use_shared, float *partial, const float *gy,
                                     const float *x) {
    extern __shared__ float acc_sh[];
    __shared__ double sh[32];
    int64_t p = blockIdx.x;
    int64_t r0 = p * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
    float *acc = use_shared ? acc_sh : partial + p * n;
    for (int64_t j = threadIdx.x; j < n; j += BS) acc[j] = 0.0f; /* each thread owns its j */
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * n, *gr = gy + r * n;
        float mean, rstd;
        row_stats<BS>(xr, n, eps, sh, &mean, &rstd);
        for (int64_t j = threadIdx.x; j < n; j += BS) acc[j] += gr[j] * (xr[j] - mean) * rstd;
    }
    if (use_shared)
        for (int64_t j = threadIdx.x; j < n; j += BS) partial[p * n + j] = acc[j];
}

/* out[j] = sum over p of partial[p][j], in order of p. */
__global__ void k_sum_rows(int64_t n, int64_t nparts, float *out, const float *partial) {
    GRID_LOOP(j, n) {
        float s = 0.0f;
        for (int64_t p = 0; p < nparts; p++) s += partial[p * n + j];
        out[j] = s;
    }
}

/* --- RMS norm --------------------------------------------------------------------------------- */

/* 1/sqrt(mean(x^2) + eps) of a row of n, the squares accumulated in double; every thread gets it.
 */
template <int BS>
__device__ __forceinline__ float row_rstd(const float *x, int64_t n, float eps, double *sh) {
    double q = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += BS) q += (double)x[j] * x[j];
    return (float)(1.0 / sqrt(block_sum_d<BS>(q, sh) / (double)n + eps));
}

template <int BS, typename O>
__global__ void k_rmsnorm(int64_t rows, int64_t n, float eps, O *out, const float *x,
                          const float *w) {
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * n;
        O *o = out + r * n;
        float rstd = row_rstd<BS>(xr, n, eps, sh);
        for (int64_t j = threadIdx.x; j < n; j += BS) mw__put(o, j, xr[j] * rstd * w[j]);
    }
}

/* dx = rstd * (dy - xhat * mean(dy * xhat)), dy = gy * w, xhat = x * rstd; the mean in double. */
template <int BS>
__global__ void k_rmsnorm_dx(int64_t rows, int64_t n, float eps, float *out, const float *gy,
                             const float *x, const float *w) {
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * n, *gr = gy + r * n;
        float *o = out + r * n;
        float rstd = row_rstd<BS>(xr, n, eps, sh);
        double s = 0.0;
        for (int64_t j = threadIdx.x; j < n; j += BS) s += gr[j] * w[j] * (xr[j] * rstd);
        float c = (float)(block_sum_d<BS>(s, sh) / (double)n);
        for (int64_t j = threadIdx.x; j < n; j += BS)
            o[j] = rstd * (gr[j] * w[j] - xr[j] * rstd * c);
    }
}

/* dw partials, as k_layernorm_dw_parts: block p sums gy * xhat over its chunk of rows. */
template <int BS>
__global__ void k_rmsnorm_dw_parts(int64_t rows, int64_t n, float eps, int64_t chunk,
                                   int use_shared, float *partial, const float *gy,
                                   const float *x) {
    extern __shared__ float acc_sh[];
    __shared__ double sh[32];
    int64_t p = blockIdx.x;
    int64_t r0 = p * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
    float *acc = use_shared ? acc_sh : partial + p * n;
    for (int64_t j = threadIdx.x; j < n; j += BS) acc[j] = 0.0f; /* each thread owns its j */
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * n, *gr = gy + r * n;
        float rstd = row_rstd<BS>(xr, n, eps, sh);
        for (int64_t j = threadIdx.x; j < n; j += BS) acc[j] += gr[j] * (xr[j] * rstd);
    }
    if (use_shared)
        for (int64_t j = threadIdx.x; j < n; j += BS) partial[p * n + j] = acc[j];
}

/* --- softmax: one warp per row ---------------------------------------------------------------- */

/* Columns row i of a block of s rows sees (0 when none). */
__device__ __forceinline__ int64_t visible_cols(int64_t i, int64_t s, int64_t k, int causal) {
    if (!causal) return k;
    int64_t v = i + (k - s) + 1;
    return v < 0 ? 0 : v > k ? k : v;
}

#define WARP_ROW_LOOP(r, rows)                                                                     \
    for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < (rows);            \
         r += ((int64_t)blockDim.x * gridDim.x) >> 5)

/* As the CPU backend: the row sum in double, then one reciprocal. */
__global__ void k_softmax(int64_t rows, int64_t s, int64_t k, int causal, float scale, float *out,
                          const float *a) {
    int lane = threadIdx.x & 31;
    WARP_ROW_LOOP(r, rows) {
        int64_t vis = visible_cols(r % s, s, k, causal);
        const float *ar = a + r * k;
        float *o = out + r * k;
        float m = -INFINITY;
        for (int64_t j = lane; j < vis; j += 32) m = fmaxf(m, scale * ar[j]);
        m = warp_max(m);
        double sum = 0.0;
        for (int64_t j = lane; j < vis; j += 32) sum += expf(scale * ar[j] - m);
        sum = warp_sum_d(sum);
        float inv = vis ? (float)(1.0 / sum) : 0.0f;
        for (int64_t j = lane; j < k; j += 32)
            o[j] = j < vis ? expf(scale * ar[j] - m) * inv : 0.0f;
    }
}

__global__ void k_softmax_grad(int64_t rows, int64_t s, int64_t k, int causal, float scale,
                               float *out, const float *gy, const float *p) {
    int lane = threadIdx.x & 31;
    WARP_ROW_LOOP(r, rows) {
        int64_t vis = visible_cols(r % s, s, k, causal);
        const float *gr = gy + r * k, *pr = p + r * k;
        float *o = out + r * k;
        double dot = 0.0;
        for (int64_t j = lane; j < vis; j += 32) dot += (double)gr[j] * pr[j];
        float d = (float)warp_sum_d(dot);
        for (int64_t j = lane; j < k; j += 32) o[j] = j < vis ? scale * pr[j] * (gr[j] - d) : 0.0f;
    }
}

/* --- cross-entropy: one block per row --------------------------------------------------------- */

/* Max and log-sum-exp of the first `valid` logits; the sum in double, as the CPU backend. */
template <int BS>
__device__ __forceinline__ void row_lse(const float *l, int64_t valid, float *shf, double *sh,
                                        float *max_out, double *lse_out) {
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < valid; j += BS) m = fmaxf(m, l[j]);
    m = block_max<BS>(m, shf);
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < valid; j += BS) s += expf(l[j] - m);
    s = block_sum_d<BS>(s, sh);
    *max_out = m;
    *lse_out = (double)m + log(s);
}

template <int BS>
__global__ void k_xent(int64_t rows, int64_t v, int64_t valid, float *out, const float *logits,
                       const int32_t *targets, err_rec *err, int *flag) {
    __shared__ double sh[32];
    __shared__ float shf[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *l = logits + r * v;
        float m;
        double lse;
        row_lse<BS>(l, valid, shf, sh, &m, &lse);
        if (threadIdx.x == 0) {
            int32_t t = targets[r];
            if (t < 0 || t >= valid) {
                record_bad(&err[ERR_TARGET], flag, r, t, valid);
                out[r] = 0.0f;
            } else {
                out[r] = (float)(lse - l[t]);
            }
        }
    }
}

/* softmax_j = e^(l_j - lse): the exponent in double (as the CPU backend), the exponential in
 * float. */
template <int BS>
__global__ void k_xent_grad(int64_t rows, int64_t v, int64_t valid, float *out, const float *gy,
                            const float *logits, const int32_t *targets, err_rec *err, int *flag) {
    __shared__ double sh[32];
    __shared__ float shf[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *l = logits + r * v;
        float *o = out + r * v;
        float m;
        double lse;
        row_lse<BS>(l, valid, shf, sh, &m, &lse);
        int32_t t = targets[r];
        if (t < 0 || t >= valid) {
            if (threadIdx.x == 0) record_bad(&err[ERR_TARGET], flag, r, t, valid);
            t = -1;
        }
        float g = gy[r];
        for (int64_t j = threadIdx.x; j < v; j += BS)
            o[j] =
                j < valid ? g * (expf((float)((double)l[j] - lse)) - (j == t ? 1.0f : 0.0f)) : 0.0f;
    }
}

/* --- entry points ------------------------------------------------------------------------ */

mw_status mw__cuda_layernorm(mw__device *dev, const mw__k_layernorm *k) {
    ENTER(dev);
    if (k->rows <= 0 || k->n <= 0) return MW_OK;
    if (k->out_dtype == MW_BF16)
        LAUNCH((k_layernorm<ROW_THREADS, uint16_t>), row_blocks(k->rows), ROW_THREADS, 0, k->rows,
               k->n, k->eps, (uint16_t *)k->out, k->x, k->w, k->b);
    else
        LAUNCH((k_layernorm<ROW_THREADS, float>), row_blocks(k->rows), ROW_THREADS, 0, k->rows,
               k->n, k->eps, (float *)k->out, k->x, k->w, k->b);
    return mw__cuda_launched(dev, "layernorm kernel");
}

/* out = addend + out, by the binary kernel: the residual gradient the plan folded into a
 * normalisation's dx (the ADD it absorbed). */
static mw_status add_addend(mw__device *dev, float *out, const float *addend, int64_t count) {
    mw__k_binary ka = {MW__BIN_ADD, {}, out, addend, out};
    ka.nd.rank = 1;
    ka.nd.dims[0] = count;
    ka.nd.stride[0][0] = ka.nd.stride[1][0] = ka.nd.stride[2][0] = 1;
    return mw__cuda_binary(dev, &ka);
}

/* With an addend, the binary kernel adds it to dx. With dw (and db) given (the plan's layer-norm
 * gradients in one instruction), the dw kernel (and a column sum of gy) follow the dx kernel on the
 * stream: the GPU reads gy and x from its own memory at a rate where one pass more costs little,
 * so they stay the kernels they were. */
mw_status mw__cuda_layernorm_dx(mw__device *dev, const mw__k_layernorm_grad *k) {
    ENTER(dev);
    if (k->rows > 0 && k->n > 0) {
        LAUNCH(k_layernorm_dx<ROW_THREADS>, row_blocks(k->rows), ROW_THREADS, 0, k->rows, k->n,
               k->eps, k->out, k->gy, k->x, k->w);
        mw_status st = mw__cuda_launched(dev, "layernorm dx kernel");
        if (st) return st;
        if (k->addend && (st = add_addend(dev, k->out, k->addend, k->rows * k->n))) return st;
    }
    if (!k->dw) return MW_OK;
    mw__k_layernorm_grad kw = *k;
    kw.out = k->dw;
    kw.w = NULL;
    kw.dw = kw.db = NULL;
    mw_status st = mw__cuda_layernorm_dw(dev, &kw);
    if (st || !k->db) return st;
    mw__k_reduce kb = mw__column_sums(k->rows, k->n, k->n, 1.0f, k->db, k->gy);
    return mw__cuda_reduce(dev, &kb);
}

#define LN_MAX_PARTS 1024

#define LN_SHARED_MAX_FLOATS 8192 /* 32 KiB, well inside the 48 KiB a block gets by default */

/* A normalisation's weight gradient, column sums over the rows of a per-element term: up to
 * LN_MAX_PARTS blocks of parts_kernel (layer norm's term or RMS norm's) each sum a chunk of rows
 * into their row of scratch, then k_sum_rows adds the parts in order. `what` names the op. */
typedef void (*norm_dw_parts)(int64_t rows, int64_t n, float eps, int64_t chunk, int use_shared,
                              float *partial, const float *gy, const float *x);
static mw_status norm_dw(mw__device *dev, norm_dw_parts parts_kernel, const char *what,
                         int64_t rows, int64_t n, float eps, float *out, const float *gy,
                         const float *x) {
    ENTER(dev);
    char done[48];
    if (n <= 0) return MW_OK;
    if (rows <= 0) {
        CU(dev, cudaMemsetAsync, out, 0, (size_t)n * sizeof(float), im->stream);
        snprintf(done, sizeof done, "%s dw", what);
        return mw__cuda_launched(dev, done);
    }
    int64_t room = (int64_t)(SCRATCH_BYTES / sizeof(float)) / n;
    if (room < 1)
        return mw__error(MW_ERR_UNSUPPORTED, "%s: %s rows of %lld exceed the scratch memory",
                         dev->name, what, (long long)n);
    int64_t parts = rows < LN_MAX_PARTS ? rows : LN_MAX_PARTS;
    if (parts > room) parts = room;
    int64_t chunk = (rows + parts - 1) / parts;
    parts = (rows + chunk - 1) / chunk;
    int use_shared = n <= LN_SHARED_MAX_FLOATS;
    size_t smem = use_shared ? (size_t)n * sizeof(float) : 0;
    float *partial = (float *)im->scratch;
    LAUNCH(parts_kernel, (unsigned)parts, ROW_THREADS, smem, rows, n, eps, chunk, use_shared,
           partial, gy, x);
    LAUNCH(k_sum_rows, blocks_for(n, THREADS), THREADS, 0, n, parts, out, partial);
    snprintf(done, sizeof done, "%s dw kernel", what);
    return mw__cuda_launched(dev, done);
}

mw_status mw__cuda_layernorm_dw(mw__device *dev, const mw__k_layernorm_grad *k) {
    return norm_dw(dev, k_layernorm_dw_parts<ROW_THREADS>, "layernorm", k->rows, k->n, k->eps,
                   k->out, k->gy, k->x);
}

mw_status mw__cuda_rmsnorm(mw__device *dev, const mw__k_rmsnorm *k) {
    ENTER(dev);
    if (k->rows <= 0 || k->n <= 0) return MW_OK;
    if (k->out_dtype == MW_BF16)
        LAUNCH((k_rmsnorm<ROW_THREADS, uint16_t>), row_blocks(k->rows), ROW_THREADS, 0, k->rows,
               k->n, k->eps, (uint16_t *)k->out, k->x, k->w);
    else
        LAUNCH((k_rmsnorm<ROW_THREADS, float>), row_blocks(k->rows), ROW_THREADS, 0, k->rows, k->n,
               k->eps, (float *)k->out, k->x, k->w);
    return mw__cuda_launched(dev, "rmsnorm kernel");
}

/* As mw__cuda_layernorm_dx: the binary kernel adds the addend, and with dw given the dw kernel
 * follows on the stream. */
mw_status mw__cuda_rmsnorm_dx(mw__device *dev, const mw__k_rmsnorm_grad *k) {
    ENTER(dev);
    if (k->rows > 0 && k->n > 0) {
        LAUNCH(k_rmsnorm_dx<ROW_THREADS>, row_blocks(k->rows), ROW_THREADS, 0, k->rows, k->n,
               k->eps, k->out, k->gy, k->x, k->w);
        mw_status st = mw__cuda_launched(dev, "rmsnorm dx kernel");
        if (st) return st;
        if (k->addend && (st = add_addend(dev, k->out, k->addend, k->rows * k->n))) return st;
    }
    if (!k->dw) return MW_OK;
    mw__k_rmsnorm_grad kw = *k;
    kw.out = k->dw;
    kw.w = NULL;
    kw.dw = NULL;
    kw.addend = NULL;
    return mw__cuda_rmsnorm_dw(dev, &kw);
}

mw_status mw__cuda_rmsnorm_dw(mw__device *dev, const mw__k_rmsnorm_grad *k) {
    return norm_dw(dev, k_rmsnorm_dw_parts<ROW_THREADS>, "rmsnorm", k->rows, k->n, k->eps, k->out,
                   k->gy, k->x);
}

/* Warp-per-row kernels: THREADS / 32 rows per block. */
static unsigned warp_row_blocks(int64_t rows) { return blocks_for(rows * 32, THREADS); }

mw_status mw__cuda_softmax(mw__device *dev, const mw__k_softmax *k) {
    ENTER(dev);
    int64_t rows = k->outer * k->s;
    if (rows <= 0 || k->k <= 0) return MW_OK;
    LAUNCH(k_softmax, warp_row_blocks(rows), THREADS, 0, rows, k->s, k->k, k->causal, k->scale,
           k->out, k->a);
    return mw__cuda_launched(dev, "softmax kernel");
}

mw_status mw__cuda_softmax_grad(mw__device *dev, const mw__k_softmax_grad *k) {
    ENTER(dev);
    int64_t rows = k->outer * k->s;
    if (rows <= 0 || k->k <= 0) return MW_OK;
    LAUNCH(k_softmax_grad, warp_row_blocks(rows), THREADS, 0, rows, k->s, k->k, k->causal, k->scale,
           k->out, k->gy, k->p);
    return mw__cuda_launched(dev, "softmax gradient kernel");
}

mw_status mw__cuda_xent(mw__device *dev, const mw__k_xent *k) {
    ENTER(dev);
    if (k->rows <= 0) return MW_OK;
    LAUNCH(k_xent<ROW_THREADS>, row_blocks(k->rows), ROW_THREADS, 0, k->rows, k->v, k->valid,
           k->out, k->logits, k->targets, im->err, im->flag_dev);
    return mw__cuda_launched(dev, "cross-entropy kernel");
}

mw_status mw__cuda_xent_grad(mw__device *dev, const mw__k_xent_grad *k) {
    ENTER(dev);
    if (k->rows <= 0 || k->v <= 0) return MW_OK;
    LAUNCH(k_xent_grad<ROW_THREADS>, row_blocks(k->rows), ROW_THREADS, 0, k->rows, k->v, k->valid,
           k->out, k->gy, k->logits, k->targets, im->err, im->flag_dev);
    return mw__cuda_launched(dev, "cross-entropy gradient kernel");
}

/* Rotary embeddings, a thread per pair of features: the row's position, the pair's frequency
 * (mw__rope_freq, as the CPU's), the angle an f32 product, its cos and sin (sincosf, full
 * precision), the sine negated for the inverse rotation; then the features past dims copied. */
template <typename O> __global__ void k_rope(mw__k_rope k, O *out) {
    int64_t half = k.dims / 2;
    GRID_LOOP(t, k.rows * half) {
        int64_t r = t / half, j = t - r * half;
        const float *x = k.x + r * k.n;
        O *y = out + r * k.n;
        if (k.parts > 0 && (r / k.part_inner) % k.part_size >= k.parts) { /* copied rows */
            mw__put(y, 2 * j, x[2 * j]);
            mw__put(y, 2 * j + 1, x[2 * j + 1]);
            continue;
        }
        int64_t p = k.offset + (r / k.inner) % k.seq + (k.pos ? k.pos[r / k.prefix] : 0);
        float s, c;
        sincosf((float)p * mw__rope_freq(&k.freqs, (int)j), &s, &c);
        if (k.inverse) s = -s;
        int64_t i0 = k.style == MW_ROPE_INTERLEAVED ? 2 * j : j;
        int64_t i1 = k.style == MW_ROPE_INTERLEAVED ? 2 * j + 1 : j + half;
        float a = x[i0], b = x[i1];
        mw__put(y, i0, a * c - b * s);
        mw__put(y, i1, b * c + a * s);
    }
    int64_t rest = k.n - k.dims;
    GRID_LOOP(t, k.rows * rest) {
        int64_t r = t / rest, j = k.dims + (t - r * rest);
        mw__put(out + r * k.n, j, k.x[r * k.n + j]);
    }
}

mw_status mw__cuda_rope(mw__device *dev, const mw__k_rope *k) {
    ENTER(dev);
    int64_t n = k->rows * (k->dims / 2 > k->n - k->dims ? k->dims / 2 : k->n - k->dims);
    if (n <= 0) return MW_OK;
    if (k->out_dtype == MW_BF16)
        LAUNCH(k_rope<uint16_t>, blocks_for(n, THREADS), THREADS, 0, *k, (uint16_t *)k->out);
    else
        LAUNCH(k_rope<float>, blocks_for(n, THREADS), THREADS, 0, *k, (float *)k->out);
    return mw__cuda_launched(dev, "rope kernel");
}
