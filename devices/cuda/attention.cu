/* CUDA fused self-attention (mw_attention), the counterpart of devices/cpu/cpu_attention.c.
 *
 * Forward: one block per (query row, slice). Its warps compute the row's scores (one warp per key,
 * lanes over the features, a fixed shuffle tree), the block finds max and sum in a fixed tree, and
 * each thread sums its output features over the keys in key order. Backward: a first kernel per
 * query row recomputes the probabilities, writes dQ and keeps the row's log-sum-exp and
 * D_i = sum_j P_ij dP_ij in scratch; a second kernel per key row walks the queries that see it in
 * order and accumulates dK and dV. No atomics: every sum has an order fixed by the sizes, so
 * results repeat bit for bit. Scores of a row live in shared memory (T floats).
 *
 * Also the cached attention of inference (one query row per position against the keys and values
 * a key/value cache holds so far). */
#include "devices/cuda/cuda_impl.cuh"

#define ATT_THREADS MW__CUDA_ATT_THREADS
#define ATT_WARPS MW__CUDA_ATT_WARPS
#define KV_CHUNK 32 /* queries a key-row block scores at a time */

/* q, k, v are f32 or bf16 (widened as they are read: the same products as the CPU's f32 kernel
 * of the widened values); the output f32, or bf16 in the forward pass. */
__device__ __forceinline__ float get(const float *a, int64_t i) { return a[i]; }
__device__ __forceinline__ float get(const uint16_t *a, int64_t i) { return mw__bf16_to_f32(a[i]); }
__device__ __forceinline__ void put(float *o, int64_t i, float v) { o[i] = v; }
__device__ __forceinline__ void put(uint16_t *o, int64_t i, float v) {
    o[i] = mw__bf16_from_f32(v);
}

template <typename A, typename B>
__device__ static float warp_dot(const A *a, const B *b, int64_t d) {
    float s = 0.0f;
    for (int64_t e = threadIdx.x % 32; e < d; e += 32) s += get(a, e) * get(b, e);
    return warp_sum(s);
}

/* Block-wide max (op 0) or sum (op 1) of v, in a fixed tree; every thread gets the result. */
__device__ static float block_reduce(float v, int op, float *red) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int o = 16; o > 0; o >>= 1) {
        float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = op ? v + u : fmaxf(v, u);
    }
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = red[0];
    for (int w = 1; w < ATT_WARPS; w++) r = op ? r + red[w] : fmaxf(r, red[w]);
    return r;
}

/* p[j] = softmax_j(scale q_i . k_j) for j < n, in shared memory; returns the log-sum-exp. */
template <typename Q>
__device__ static float row_probs(const mw__k_attention &k, const Q *q, const Q *kk, int64_t i,
                                  int64_t n, float *p, float *red) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int64_t j = warp; j < n; j += ATT_WARPS) {
        float s = warp_dot(q + i * k.seq_qkv, kk + j * k.seq_qkv, k.d);
        if (lane == 0) p[j] = k.scale * s;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += ATT_THREADS) mx = fmaxf(mx, p[j]);
    mx = block_reduce(mx, 0, red);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += ATT_THREADS) {
        float e = mw__expf(p[j] - mx);
        p[j] = e;
        sum += e;
    }
    sum = block_reduce(sum, 1, red);
    float inv = 1.0f / sum;
    for (int64_t j = threadIdx.x; j < n; j += ATT_THREADS) p[j] *= inv;
    __syncthreads();
    return mx + logf(sum);
}

/* Block y of the grid: query g = y % G of slice s = y / G (k.group = G queries per key/value
 * head, then the key and the value, k.part apart). */
template <typename Q, typename O> __global__ static void k_attention(mw__k_attention k) {
    extern __shared__ float smem[];
    float *red = smem, *p = smem + ATT_WARPS;
    int64_t i = blockIdx.x, s = blockIdx.y / k.group, g = blockIdx.y % k.group;
    mw__cuda_slice off = mw__cuda_slice_at(k.walk, s);
    const Q *base = (const Q *)k.qkv + off.o1, *q = base + g * k.part;
    const Q *kk = base + k.group * k.part, *v = kk + k.part;
    int64_t n = k.causal ? i + 1 : k.t;
    row_probs(k, q, kk, i, n, p, red);
    O *out = (O *)k.out + off.o0 + g * k.out_group + i * k.seq_out;
    for (int64_t e = threadIdx.x; e < k.d; e += ATT_THREADS) {
        float acc = 0.0f;
        for (int64_t j = 0; j < n; j++) acc += p[j] * get(v, j * k.seq_qkv + e);
        put(out, e, acc);
    }
}

/* Per query row: dQ, and the row's log-sum-exp and D into scratch. */
template <typename Q>
__global__ static void k_attention_dq(mw__k_attention k, float *lse, float *dsum) {
    extern __shared__ float smem[];
    float *red = smem, *p = smem + ATT_WARPS, *dp = p + k.t;
    int64_t i = blockIdx.x, y = blockIdx.y, s = y / k.group, g = y % k.group;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    mw__cuda_slice off = mw__cuda_slice_at(k.walk, s);
    const Q *base = (const Q *)k.qkv + off.o1, *q = base + g * k.part;
    const Q *kk = base + k.group * k.part, *v = kk + k.part;
    const float *gy = k.gy + off.o0 + g * k.out_group + i * k.seq_out;
    int64_t n = k.causal ? i + 1 : k.t;
    float l = row_probs(k, q, kk, i, n, p, red);
    for (int64_t j = warp; j < n; j += ATT_WARPS) {
        float d = warp_dot(gy, v + j * k.seq_qkv, k.d);
        if (lane == 0) dp[j] = d;
    }
    __syncthreads();
    float part = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += ATT_THREADS) part += p[j] * dp[j];
    float D = block_reduce(part, 1, red);
    for (int64_t j = threadIdx.x; j < n; j += ATT_THREADS) dp[j] = p[j] * (dp[j] - D);
    __syncthreads();
    float *dq = (float *)k.out + off.o1 + g * k.part + i * k.seq_qkv;
    for (int64_t e = threadIdx.x; e < k.d; e += ATT_THREADS) {
        float acc = 0.0f;
        for (int64_t j = 0; j < n; j++) acc += dp[j] * get(kk, j * k.seq_qkv + e);
        dq[e] = k.scale * acc;
    }
    if (threadIdx.x == 0) {
        lse[y * k.t + i] = l;
        dsum[y * k.t + i] = D;
    }
}

/* Per key row j: dK_j = scale sum_i dS_ij q_i and dV_j = sum_i P_ij dO_i over the queries that
 * see j, query after query of the group, each in query order, KV_CHUNK queries at a time. */
template <typename Q>
__global__ static void k_attention_dkv(mw__k_attention k, const float *lse, const float *dsum) {
    __shared__ float ps[KV_CHUNK], ds[KV_CHUNK];
    int64_t j = blockIdx.x, s = blockIdx.y;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    mw__cuda_slice off = mw__cuda_slice_at(k.walk, s);
    const Q *base = (const Q *)k.qkv + off.o1, *kk = base + k.group * k.part, *v = kk + k.part;
    float *dk = (float *)k.out + off.o1 + k.group * k.part + j * k.seq_qkv, *dv = dk + k.part;
    /* Each thread owns features e = threadIdx.x, + ATT_THREADS, ...; at most 4 per thread. */
    float ak[4] = {0, 0, 0, 0}, av[4] = {0, 0, 0, 0};
    for (int64_t g = 0; g < k.group; g++) {
        const Q *q = base + g * k.part;
        const float *gy = k.gy + off.o0 + g * k.out_group;
        const float *lr = lse + (s * k.group + g) * k.t, *dr = dsum + (s * k.group + g) * k.t;
        for (int64_t i0 = k.causal ? j : 0; i0 < k.t; i0 += KV_CHUNK) {
            int64_t m = k.t - i0 < KV_CHUNK ? k.t - i0 : KV_CHUNK;
            for (int64_t c = warp; c < m; c += ATT_WARPS) {
                int64_t i = i0 + c;
                float sc = k.scale * warp_dot(q + i * k.seq_qkv, kk + j * k.seq_qkv, k.d);
                float dpv = warp_dot(gy + i * k.seq_out, v + j * k.seq_qkv, k.d);
                if (lane == 0) {
                    float pv = mw__expf(sc - lr[i]);
                    ps[c] = pv;
                    ds[c] = pv * (dpv - dr[i]);
                }
            }
            __syncthreads();
            for (int r = 0; r < 4; r++) {
                int64_t e = threadIdx.x + (int64_t)r * ATT_THREADS;
                if (e >= k.d) break;
                for (int64_t c = 0; c < m; c++) {
                    ak[r] += ds[c] * get(q, (i0 + c) * k.seq_qkv + e);
                    av[r] += ps[c] * gy[(i0 + c) * k.seq_out + e];
                }
            }
            __syncthreads();
        }
    }
    for (int r = 0; r < 4; r++) {
        int64_t e = threadIdx.x + (int64_t)r * ATT_THREADS;
        if (e >= k.d) break;
        dk[e] = k.scale * ak[r];
        dv[e] = av[r];
    }
}

static mw_status check(const mw__device *dev, const mw__k_attention *k, const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return MW_OK;
    return mw__error(MW_ERR_DEVICE, "%s: %s (t=%lld, d=%lld): %s", dev->name, what, (long long)k->t,
                     (long long)k->d, cudaGetErrorString(e));
}

/* The limits the plan was checked against (mw__cuda_check), asked again of a kernel called on its
 * own. */
static mw_status shape_ok(const mw__device *dev, int kind, const mw__k_attention *k) {
    mw_status st = mw__cuda_check(kind, k);
    if (st == MW_OK) return MW_OK;
    char msg[MW__MSG_SIZE];
    snprintf(msg, sizeof msg, "%s", mw_last_error());
    return mw__error(st, "%s: %s", dev->name, msg);
}

/* The entry points bind the device's GPU and clear the last error (ENTER), so a launch check sees
 * only its own launch's failure; no rows or no slices is nothing to do (a grid of 0 blocks would
 * fail to launch). */
extern "C" mw_status mw__cuda_attention(mw__device *dev, const mw__k_attention *k) {
    ENTER(dev);
    if (k->t <= 0 || k->slices <= 0) return MW_OK;
    size_t smem = (size_t)(ATT_WARPS + k->t) * sizeof(float);
    mw_status st = shape_ok(dev, MW__I_ATTENTION, k);
    if (st || mw__cuda_flash(dev, k, 0, &st)) return st;
    mw__k_attention kk = *k;
    kk.group = mw__attn_group(k);
    dim3 grid((unsigned)k->t, (unsigned)(k->slices * kk.group));
    cudaStream_t stream = im->stream;
    int q16 = k->qkv_dtype == MW_BF16, o16 = k->out_dtype == MW_BF16;
    if (q16 && o16)
        k_attention<uint16_t, uint16_t><<<grid, ATT_THREADS, smem, stream>>>(kk);
    else if (q16)
        k_attention<uint16_t, float><<<grid, ATT_THREADS, smem, stream>>>(kk);
    else if (o16)
        k_attention<float, uint16_t><<<grid, ATT_THREADS, smem, stream>>>(kk);
    else
        k_attention<float, float><<<grid, ATT_THREADS, smem, stream>>>(kk);
    return check(dev, k, "attention kernel");
}

extern "C" mw_status mw__cuda_attention_grad(mw__device *dev, const mw__k_attention *k) {
    ENTER(dev);
    if (k->out_dtype != MW_F32)
        return mw__error(MW_ERR_UNSUPPORTED,
                         "%s: attention gradient: d(qkv) is written in f32 only", dev->name);
    if (k->t <= 0 || k->slices <= 0) return MW_OK;
    size_t smem = mw__cuda_attention_smem(k->t);
    mw_status st = shape_ok(dev, MW__I_ATTENTION_GRAD, k);
    if (st || mw__cuda_flash(dev, k, 1, &st)) return st;
    int64_t ns = k->slices, blk = k->block;
    mw__k_attention kk = *k;
    kk.group = mw__attn_group(k);
    float *lse = k->scratch + 2 * blk * k->t, *dsum = lse + ns * kk.group * k->t;
    dim3 grid((unsigned)k->t, (unsigned)(ns * kk.group)), keys((unsigned)k->t, (unsigned)ns);
    cudaStream_t stream = im->stream;
    if (k->qkv_dtype == MW_BF16)
        k_attention_dq<uint16_t><<<grid, ATT_THREADS, smem, stream>>>(kk, lse, dsum);
    else
        k_attention_dq<float><<<grid, ATT_THREADS, smem, stream>>>(kk, lse, dsum);
    if ((st = check(dev, k, "attention gradient kernel (queries)"))) return st;
    if (k->qkv_dtype == MW_BF16)
        k_attention_dkv<uint16_t><<<keys, ATT_THREADS, 0, stream>>>(kk, lse, dsum);
    else
        k_attention_dkv<float><<<keys, ATT_THREADS, 0, stream>>>(kk, lse, dsum);
    return check(dev, k, "attention gradient kernel (keys and values)");
}

/* --- cached attention (inference) ------------------------------------------------------------ */

/* One warp per (row, head): the query against keys 0..pos in key order, with a running maximum
 * (the CPU kernel's order of terms per feature; the dot products summed by a fixed shuffle
 * tree). Each lane keeps the features lane, lane + 32, ... (dim <= 256). */
#define CACHED_MAX_DIM MW__CUDA_CACHED_MAX_DIM
__global__ void k_attention_cached(mw__k_attention_cached k, err_rec *err, int *flag) {
    int64_t pair = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    int64_t G = k.group > 0 ? k.group : 1, HG = k.heads * G; /* query heads per outer row */
    if (pair >= k.outer * HG) return;
    int64_t o = pair / HG, hq = pair % HG, h = hq / G, H = k.heads, D = k.dim, row = 2 * H * D;
    int32_t pos = k.pos[o];
    if (pos < 0 || pos >= k.n) {
        if (lane == 0 && hq == 0) record_bad(&err[ERR_POSITION], flag, o, pos, k.n);
        return;
    }
    const float *q = k.q + (o * HG + hq) * D, *kv = k.kv + o * k.n * row + h * D;
    float acc[CACHED_MAX_DIM / 32], qv[CACHED_MAX_DIM / 32];
    int per = (int)((D + 31) / 32);
    for (int r = 0; r < per; r++) {
        int64_t d = lane + 32 * r;
        acc[r] = 0.0f;
        qv[r] = d < D ? q[d] : 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = 0; j <= pos; j++) {
        const float *key = kv + j * row, *val = key + H * D;
        float s = 0.0f;
        for (int r = 0; r < per; r++) {
            int64_t d = lane + 32 * r;
            if (d < D) s += qv[r] * key[d];
        }
        for (int w = 16; w > 0; w >>= 1) s += __shfl_xor_sync(0xffffffffu, s, w);
        s *= k.scale;
        if (s > m) {
            float c = mw__expf(m - s);
            l *= c;
            for (int r = 0; r < per; r++) acc[r] *= c;
            m = s;
        }
        float e = mw__expf(s - m);
        l += e;
        for (int r = 0; r < per; r++) {
            int64_t d = lane + 32 * r;
            if (d < D) acc[r] += e * val[d];
        }
    }
    float inv = 1.0f / l;
    for (int r = 0; r < per; r++) {
        int64_t d = lane + 32 * r;
        if (d < D) k.out[(o * HG + hq) * D + d] = acc[r] * inv;
    }
}

/* A position outside the cache is recorded, and reported by the next ENTER-style kernel's check
 * or by sync (launch_error reports the launch's own failure only). */
extern "C" mw_status mw__cuda_attention_cached(mw__device *dev, const mw__k_attention_cached *k) {
    ENTER(dev);
    if (k->outer <= 0 || k->heads <= 0) return MW_OK;
    if (k->dim > CACHED_MAX_DIM)
        return mw__error(MW_ERR_UNSUPPORTED,
                         "%s: cached attention supports head sizes up to %d, not %lld", dev->name,
                         CACHED_MAX_DIM, (long long)k->dim);
    int64_t pairs = k->outer * k->heads * (k->group > 0 ? k->group : 1), per_block = THREADS / 32;
    unsigned blocks = (unsigned)((pairs + per_block - 1) / per_block);
    k_attention_cached<<<blocks, THREADS, 0, im->stream>>>(*k, im->err, im->flag_dev);
    return launch_error(dev, "cached attention kernel");
}
