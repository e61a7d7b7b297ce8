/* The tensor-core attention kernels of attention_tc.cu (which describes them), in a header of
 * their own so that tests/gpu/emu can compile them for the host against a stand-in of CUDA's
 * threads and WMMA products (MW_TC_EMULATE) and hold them against a float64 reference on machines
 * without a GPU. Only attention_tc.cu and that test include it. */
#ifndef MW__ATTENTION_TC_CUH
#define MW__ATTENTION_TC_CUH

#ifdef MW_TC_EMULATE
#include "tests/gpu/emu/cuda_emu.h"
#define TC_DEVICE_CODE 1
#else
#include <cuda_bf16.h>
#include <mma.h>
#define TC_DEVICE_CODE (__CUDA_ARCH__ >= 800)
#define TC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
/* 16 bytes from s to d, both 16-byte aligned: one vector load and store. */
__device__ __forceinline__ void tc_copy16(void *d, const void *s) {
    *(uint4 *)d = *(const uint4 *)s;
}
__device__ __forceinline__ void tc_zero16(void *d) { *(uint4 *)d = make_uint4(0, 0, 0, 0); }
#endif

extern "C" {
#include "devices/device.h"
}
#include "devices/cuda/attention_slice.cuh"
#include "devices/math.h"

using namespace nvcuda;
typedef __nv_bfloat16 bf16;

#define TC_ROWS 64 /* queries (forward, dQ) or keys (dK, dV) per block */
#define TC_COLS 64 /* keys (forward, dQ) or queries (dK, dV) per tile */
#define TC_THREADS 128
#define TC_WARPS (TC_THREADS / 32)
#define TC_MAX_D 128
#define LDS (TC_COLS + 4) /* f32 tiles of scores: a multiple of 4 floats (WMMA's rule) */
#define LDP (TC_COLS + 8) /* bf16 tiles of probabilities: a multiple of 8 */
/* Tiles of keys and of queries are both TC_ROWS rows of features (half_tile). */
static_assert(TC_ROWS == TC_COLS && TC_ROWS == 16 * TC_WARPS, "a warp owns 16 rows of a tile");

/* The leading dimensions of a launch of head dimension d: bf16 rows of q, k, v, dO; f32 rows of
 * the accumulators. Every array below starts at a multiple of 32 bytes, as WMMA's loads need. */
__host__ __device__ static inline int ld_half(int d) { return d + 8; }
__host__ __device__ static inline int ld_acc(int d) { return d + 4; }

__host__ static inline size_t half_tile(int d) {
    return (size_t)TC_ROWS * ld_half(d) * sizeof(bf16);
}
__host__ static inline size_t acc_tile(int d) {
    return (size_t)TC_ROWS * ld_acc(d) * sizeof(float);
}
static const size_t SCORE_TILE = (size_t)TC_ROWS * LDS * sizeof(float);
static const size_t PROB_TILE = (size_t)TC_ROWS * LDP * sizeof(bf16);

/* Shared memory of each kernel: forward (q, k, v; scores; probabilities; output; max, sum and
 * rescaling per row), the query-block gradient (q, dO, k, v; scores and dP; dS; dQ; lse, sum, D),
 * the key-block gradient (k, v, q, dO; P^T and dP^T; their bf16 forms; dK and dV; lse and D of
 * the queries). */
__host__ static inline size_t smem_forward(int d) {
    return 3 * half_tile(d) + SCORE_TILE + PROB_TILE + acc_tile(d) + 3 * TC_ROWS * sizeof(float);
}
__host__ static inline size_t smem_dq(int d) {
    return 4 * half_tile(d) + 2 * SCORE_TILE + PROB_TILE + acc_tile(d) +
           3 * TC_ROWS * sizeof(float);
}
__host__ static inline size_t smem_dkv(int d) {
    return 4 * half_tile(d) + 2 * SCORE_TILE + 2 * PROB_TILE + 2 * acc_tile(d) +
           2 * TC_COLS * sizeof(float);
}

/* The device helpers exist where the kernels' bodies do (compute capability 8.0 and later, or
 * the host stand-in): CUDA's bf16 fragments do not before 8.0, and a build for older GPUs as
 * well must still compile. */
#if TC_DEVICE_CODE
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc_frag;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a_frag;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b_frag;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> bt_frag;

/* One element of an operand as bf16: q, k and v are bf16 already; dO (f32) is rounded. */
__device__ __forceinline__ bf16 to_bf16(uint16_t h) { return __ushort_as_bfloat16(h); }
__device__ __forceinline__ bf16 to_bf16(float f) { return __float2bfloat16_rn(f); }

/* Eight elements (16-byte aligned at both ends) as bf16: one 16-byte copy of bf16, two loads and
 * a rounding of f32. */
__device__ __forceinline__ void load8(bf16 *dst, const uint16_t *src) { tc_copy16(dst, src); }
__device__ __forceinline__ void load8(bf16 *dst, const float *src) {
    alignas(16) float f[8];
    alignas(16) bf16 h[8];
    tc_copy16(f, src), tc_copy16(f + 4, src + 4);
    for (int j = 0; j < 8; j++) h[j] = __float2bfloat16_rn(f[j]);
    tc_copy16(dst, h);
}

/* Rows [r0, r0 + TC_ROWS) of an operand (q, k, v: bf16; dO: f32; rows `stride` apart, d features
 * from src) into a bf16 tile of leading dimension ld; rows at or past t are zeros. Eight
 * features a step where src and the rows are 16-byte aligned (the tile's rows always are:
 * ld = d + 8, d a multiple of 16), else one at a time. */
template <typename S>
__device__ static void load_rows(bf16 *tile, int ld, const S *src, int64_t stride, int64_t r0,
                                 int64_t t, int d) {
    if ((uintptr_t)src % 16 == 0 && (stride * (int64_t)sizeof(S)) % 16 == 0) {
        const int pieces = d / 8;
        for (int idx = threadIdx.x; idx < TC_ROWS * pieces; idx += TC_THREADS) {
            int r = idx / pieces, e = idx % pieces * 8;
            int64_t row = r0 + r;
            if (row < t)
                load8(tile + r * ld + e, src + row * stride + e);
            else
                tc_zero16(tile + r * ld + e);
        }
        return;
    }
    for (int idx = threadIdx.x; idx < TC_ROWS * d; idx += TC_THREADS) {
        int r = idx / d, e = idx % d;
        int64_t row = r0 + r;
        tile[r * ld + e] = row < t ? to_bf16(src[row * stride + e]) : to_bf16((S)0);
    }
}

/* The 16 x TC_COLS products of warp w's 16 rows of a (leading dimension lda) with the TC_COLS rows
 * of b (ldb), over d features: out[r][c] = sum_e a[r][e] b[c][e], into f32 out (LDS). */
__device__ static void rows_times_rows(float *out, const bf16 *a, int lda, const bf16 *b, int ldb,
                                       int d) {
    for (int j = 0; j < TC_COLS / 16; j++) {
        acc_frag acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int e = 0; e < d; e += 16) {
            a_frag fa;
            bt_frag fb;
            wmma::load_matrix_sync(fa, a + e, lda);
            wmma::load_matrix_sync(fb, b + (size_t)j * 16 * ldb + e, ldb);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(out + j * 16, acc, LDS, wmma::mem_row_major);
    }
}

/* acc (16 x d, f32, leading dimension ldo) += p (16 x TC_COLS, bf16, LDP) times the TC_COLS x d
 * rows of v (ldv). */
__device__ static void add_probs_times(float *acc, int ldo, const bf16 *p, const bf16 *v, int ldv,
                                       int d) {
    for (int e = 0; e < d; e += 16) {
        acc_frag c;
        wmma::load_matrix_sync(c, acc + e, ldo, wmma::mem_row_major);
        for (int j = 0; j < TC_COLS; j += 16) {
            a_frag fa;
            b_frag fb;
            wmma::load_matrix_sync(fa, p + j, LDP);
            wmma::load_matrix_sync(fb, v + (size_t)j * ldv + e, ldv);
            wmma::mma_sync(c, fa, fb, c);
        }
        wmma::store_matrix_sync(acc + e, c, ldo, wmma::mem_row_major);
    }
}

#endif

/* Whether query i sees key j. */
__device__ __forceinline__ bool sees(const mw__k_attention &k, int64_t i, int64_t j) {
    return i < k.t && j < k.t && (!k.causal || j <= i);
}

__device__ __forceinline__ void put_out(float *o, int64_t i, float v) { o[i] = v; }
__device__ __forceinline__ void put_out(uint16_t *o, int64_t i, float v) {
    o[i] = mw__bf16_from_f32(v);
}

/* The keys [0, end) a block of queries from q0 may see: causally up to its last query. */
__device__ __forceinline__ int64_t keys_end(const mw__k_attention &k, int64_t q0) {
    return k.causal ? (q0 + TC_ROWS < k.t ? q0 + TC_ROWS : k.t) : k.t;
}

/* f(r, at, e) for each feature e of each of warp w's 16 rows r of the block, at = r0 + r, whose
 * row is before t: the kernels' writes of their results. */
template <typename F> __device__ static void each_result(int64_t r0, int64_t t, int d, F f) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int idx = lane; idx < 16 * d; idx += 32) {
        int r = warp * 16 + idx / d;
        if (r0 + r < t) f(r, r0 + r, idx % d);
    }
}

/* Block (x, y): queries [64 x, 64 x + 64) of query g = y % G of slice y / G. */
template <typename O>
__global__ static void __launch_bounds__(TC_THREADS) k_flash_forward(mw__k_attention k) {
#if TC_DEVICE_CODE
    TC_SHARED(sm);
    const int d = (int)k.d, ldh = ld_half(d), ldo = ld_acc(d);
    bf16 *qs = (bf16 *)sm, *ks = qs + TC_ROWS * ldh, *vs = ks + TC_ROWS * ldh;
    float *ss = (float *)(vs + TC_ROWS * ldh);
    bf16 *ps = (bf16 *)(ss + TC_ROWS * LDS);
    float *os = (float *)(ps + TC_ROWS * LDP);
    float *mrow = os + TC_ROWS * ldo, *lrow = mrow + TC_ROWS, *arow = lrow + TC_ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t q0 = (int64_t)blockIdx.x * TC_ROWS, s = blockIdx.y / k.group,
                  g = blockIdx.y % k.group;
    mw__cuda_slice off = mw__cuda_slice_at(k.walk, s);
    const uint16_t *base = (const uint16_t *)k.qkv + off.o1;
    const uint16_t *q = base + g * k.part, *kk = base + k.group * k.part, *v = kk + k.part;
    load_rows(qs, ldh, q, k.seq_qkv, q0, k.t, d);
    for (int i = threadIdx.x; i < TC_ROWS * ldo; i += TC_THREADS) os[i] = 0.0f;
    for (int i = threadIdx.x; i < TC_ROWS; i += TC_THREADS) mrow[i] = -INFINITY, lrow[i] = 0.0f;
    const int64_t kend = keys_end(k, q0);
    /* Two lanes per row of the warp's 16, each over half the tile's columns. */
    const int row = warp * 16 + lane / 2, c0 = (lane % 2) * (TC_COLS / 2);
    const int64_t i = q0 + row;
    for (int64_t k0 = 0; k0 < kend; k0 += TC_COLS) {
        __syncthreads(); /* the last tile's readers are done */
        load_rows(ks, ldh, kk, k.seq_qkv, k0, k.t, d);
        load_rows(vs, ldh, v, k.seq_qkv, k0, k.t, d);
        __syncthreads();
        rows_times_rows(ss + warp * 16 * LDS, qs + warp * 16 * ldh, ldh, ks, ldh, d);
        __syncwarp();
        float *srow = ss + row * LDS;
        float mx = -INFINITY;
        for (int c = c0; c < c0 + TC_COLS / 2; c++) {
            float x = sees(k, i, k0 + c) ? k.scale * srow[c] : -INFINITY;
            srow[c] = x;
            mx = fmaxf(mx, x);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        const float mold = mrow[row], mnew = fmaxf(mold, mx);
        /* A row that saw no key before this tile rescales nothing (alpha 0); masked scores give
         * exactly 0 (mw__expf of -inf would give 1e-38); rows past t see no key and are never
         * written. */
        const float alpha = mold == -INFINITY ? 0.0f : mw__expf(mold - mnew);
        float sum = 0.0f;
        bf16 *prow = ps + row * LDP;
        for (int c = c0; c < c0 + TC_COLS / 2; c++) {
            bf16 p = __float2bfloat16_rn(srow[c] == -INFINITY ? 0.0f : mw__expf(srow[c] - mnew));
            prow[c] = p;
            sum += __bfloat162float(p);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        __syncwarp(); /* both lanes of the row have read mrow */
        if (lane % 2 == 0) {
            mrow[row] = mnew;
            lrow[row] = alpha * lrow[row] + sum;
            arow[row] = alpha;
        }
        __syncwarp();
        for (int idx = lane; idx < 16 * d; idx += 32) {
            int r = warp * 16 + idx / d;
            os[r * ldo + idx % d] *= arow[r];
        }
        __syncwarp();
        add_probs_times(os + warp * 16 * ldo, ldo, ps + warp * 16 * LDP, vs, ldh, d);
        __syncwarp();
    }
    each_result(q0, k.t, d, [&](int r, int64_t at, int e) {
        O *out = (O *)k.out + off.o0 + g * k.out_group + at * k.seq_out;
        put_out(out, e, os[r * ldo + e] / lrow[r]);
    });
#endif
}

/* P (f32, in place of the scores of warp w's rows in ss) = exp(scale S - lse), 0 where the query
 * does not see the key; rows i0 + r, columns k0 + c. */
__device__ static void probs_of_scores(const mw__k_attention &k, float *ss, const float *lse,
                                       int64_t i0, int64_t k0) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int idx = lane; idx < 16 * TC_COLS; idx += 32) {
        int r = warp * 16 + idx / TC_COLS, c = idx % TC_COLS;
        float *x = ss + r * LDS + c;
        *x = sees(k, i0 + r, k0 + c) ? mw__expf(k.scale * *x - lse[r]) : 0.0f;
    }
}

/* Block (x, y) as the forward's: dQ of its queries, and their lse and D into scratch. */
__global__ static void __launch_bounds__(TC_THREADS)
    k_flash_dq(mw__k_attention k, float *lse_out, float *dsum_out) {
#if TC_DEVICE_CODE
    TC_SHARED(sm);
    const int d = (int)k.d, ldh = ld_half(d), ldo = ld_acc(d);
    bf16 *qs = (bf16 *)sm, *dos = qs + TC_ROWS * ldh, *ks = dos + TC_ROWS * ldh,
         *vs = ks + TC_ROWS * ldh;
    float *ss = (float *)(vs + TC_ROWS * ldh), *dps = ss + TC_ROWS * LDS;
    bf16 *dss = (bf16 *)(dps + TC_ROWS * LDS);
    float *dq = (float *)(dss + TC_ROWS * LDP);
    float *mrow = dq + TC_ROWS * ldo, *lrow = mrow + TC_ROWS, *drow = lrow + TC_ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t q0 = (int64_t)blockIdx.x * TC_ROWS, y = blockIdx.y, s = y / k.group,
                  g = y % k.group;
    mw__cuda_slice off = mw__cuda_slice_at(k.walk, s);
    const uint16_t *base = (const uint16_t *)k.qkv + off.o1;
    const uint16_t *q = base + g * k.part, *kk = base + k.group * k.part, *v = kk + k.part;
    const float *gy = k.gy + off.o0 + g * k.out_group;
    load_rows(qs, ldh, q, k.seq_qkv, q0, k.t, d);
    load_rows(dos, ldh, gy, k.seq_out, q0, k.t, d);
    for (int i = threadIdx.x; i < TC_ROWS * ldo; i += TC_THREADS) dq[i] = 0.0f;
    for (int i = threadIdx.x; i < TC_ROWS; i += TC_THREADS)
        mrow[i] = -INFINITY, lrow[i] = 0.0f, drow[i] = 0.0f;
    const int64_t kend = keys_end(k, q0);
    const int row = warp * 16 + lane / 2, c0 = (lane % 2) * (TC_COLS / 2);
    const int64_t i = q0 + row;
    /* 1: each row's maximum and sum of exponentials, in f32: its log-sum-exp. */
    for (int64_t k0 = 0; k0 < kend; k0 += TC_COLS) {
        __syncthreads();
        load_rows(ks, ldh, kk, k.seq_qkv, k0, k.t, d);
        __syncthreads();
        rows_times_rows(ss + warp * 16 * LDS, qs + warp * 16 * ldh, ldh, ks, ldh, d);
        __syncwarp();
        const float *srow = ss + row * LDS;
        float mx = -INFINITY;
        for (int c = c0; c < c0 + TC_COLS / 2; c++)
            if (sees(k, i, k0 + c)) mx = fmaxf(mx, k.scale * srow[c]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        const float mold = mrow[row], mnew = fmaxf(mold, mx);
        float sum = 0.0f;
        if (mnew != -INFINITY)
            for (int c = c0; c < c0 + TC_COLS / 2; c++)
                if (sees(k, i, k0 + c)) sum += mw__expf(k.scale * srow[c] - mnew);
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        __syncwarp();
        if (lane % 2 == 0 && mnew != -INFINITY) {
            lrow[row] = lrow[row] * mw__expf(mold - mnew) + sum;
            mrow[row] = mnew;
        }
        __syncwarp();
    }
    for (int r = lane; r < 16; r += 32) {
        int rr = warp * 16 + r;
        mrow[rr] = lrow[rr] > 0.0f ? mrow[rr] + logf(lrow[rr]) : 0.0f; /* now the lse */
    }
    __syncwarp();
    /* 2 and 3: D = sum_j P dP, then dQ += dS K with dS = P (dP - D). */
    for (int pass = 2; pass <= 3; pass++)
        for (int64_t k0 = 0; k0 < kend; k0 += TC_COLS) {
            __syncthreads();
            load_rows(ks, ldh, kk, k.seq_qkv, k0, k.t, d);
            load_rows(vs, ldh, v, k.seq_qkv, k0, k.t, d);
            __syncthreads();
            rows_times_rows(ss + warp * 16 * LDS, qs + warp * 16 * ldh, ldh, ks, ldh, d);
            rows_times_rows(dps + warp * 16 * LDS, dos + warp * 16 * ldh, ldh, vs, ldh, d);
            __syncwarp();
            probs_of_scores(k, ss, mrow, q0, k0);
            __syncwarp();
            if (pass == 2) {
                float part = 0.0f;
                for (int c = c0; c < c0 + TC_COLS / 2; c++)
                    part += ss[row * LDS + c] * dps[row * LDS + c];
                part += __shfl_xor_sync(0xffffffffu, part, 1);
                if (lane % 2 == 0) drow[row] += part;
                __syncwarp();
                continue;
            }
            for (int idx = lane; idx < 16 * TC_COLS; idx += 32) {
                int r = warp * 16 + idx / TC_COLS, c = idx % TC_COLS;
                float p = ss[r * LDS + c];
                dss[r * LDP + c] = __float2bfloat16_rn(p * (dps[r * LDS + c] - drow[r]));
            }
            __syncwarp();
            add_probs_times(dq + warp * 16 * ldo, ldo, dss + warp * 16 * LDP, ks, ldh, d);
            __syncwarp();
        }
    each_result(q0, k.t, d, [&](int r, int64_t at, int e) {
        float *out = (float *)k.out + off.o1 + g * k.part + at * k.seq_qkv;
        out[e] = k.scale * dq[r * ldo + e];
    });
    for (int r = lane; r < 16; r += 32) {
        int64_t at = q0 + warp * 16 + r;
        if (at >= k.t) continue;
        lse_out[y * k.t + at] = mrow[warp * 16 + r];
        dsum_out[y * k.t + at] = drow[warp * 16 + r];
    }
#endif
}

/* Block (x, y): dK and dV of keys [64 x, 64 x + 64) of slice y, summed over the group's queries
 * in order, each over the tiles of queries that see the keys, in order. */
__global__ static void __launch_bounds__(TC_THREADS)
    k_flash_dkv(mw__k_attention k, const float *lse, const float *dsum) {
#if TC_DEVICE_CODE
    TC_SHARED(sm);
    const int d = (int)k.d, ldh = ld_half(d), ldo = ld_acc(d);
    bf16 *ks = (bf16 *)sm, *vs = ks + TC_ROWS * ldh, *qs = vs + TC_ROWS * ldh,
         *dos = qs + TC_ROWS * ldh;
    float *pt = (float *)(dos + TC_ROWS * ldh), *dpt = pt + TC_ROWS * LDS;
    bf16 *pth = (bf16 *)(dpt + TC_ROWS * LDS), *dsth = pth + TC_ROWS * LDP;
    float *dk = (float *)(dsth + TC_ROWS * LDP), *dv = dk + TC_ROWS * ldo;
    float *lq = dv + TC_ROWS * ldo, *dd = lq + TC_COLS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t j0 = (int64_t)blockIdx.x * TC_ROWS, s = blockIdx.y;
    mw__cuda_slice off = mw__cuda_slice_at(k.walk, s);
    const uint16_t *base = (const uint16_t *)k.qkv + off.o1;
    const uint16_t *kk = base + k.group * k.part, *v = kk + k.part;
    load_rows(ks, ldh, kk, k.seq_qkv, j0, k.t, d);
    load_rows(vs, ldh, v, k.seq_qkv, j0, k.t, d);
    for (int i = threadIdx.x; i < TC_ROWS * ldo; i += TC_THREADS) dk[i] = 0.0f, dv[i] = 0.0f;
    for (int64_t g = 0; g < k.group; g++) {
        const uint16_t *q = base + g * k.part;
        const float *gy = k.gy + off.o0 + g * k.out_group;
        const float *lr = lse + (s * k.group + g) * k.t, *dr = dsum + (s * k.group + g) * k.t;
        for (int64_t i0 = k.causal ? j0 : 0; i0 < k.t; i0 += TC_COLS) {
            __syncthreads();
            load_rows(qs, ldh, q, k.seq_qkv, i0, k.t, d);
            load_rows(dos, ldh, gy, k.seq_out, i0, k.t, d);
            for (int c = threadIdx.x; c < TC_COLS; c += TC_THREADS) {
                lq[c] = i0 + c < k.t ? lr[i0 + c] : 0.0f;
                dd[c] = i0 + c < k.t ? dr[i0 + c] : 0.0f;
            }
            __syncthreads();
            /* P^T and dP^T of the warp's 16 keys against the tile's queries. */
            rows_times_rows(pt + warp * 16 * LDS, ks + warp * 16 * ldh, ldh, qs, ldh, d);
            rows_times_rows(dpt + warp * 16 * LDS, vs + warp * 16 * ldh, ldh, dos, ldh, d);
            __syncwarp();
            for (int idx = lane; idx < 16 * TC_COLS; idx += 32) {
                int r = warp * 16 + idx / TC_COLS, c = idx % TC_COLS;
                float p =
                    sees(k, i0 + c, j0 + r) ? mw__expf(k.scale * pt[r * LDS + c] - lq[c]) : 0.0f;
                pth[r * LDP + c] = __float2bfloat16_rn(p);
                dsth[r * LDP + c] = __float2bfloat16_rn(p * (dpt[r * LDS + c] - dd[c]));
            }
            __syncwarp();
            add_probs_times(dv + warp * 16 * ldo, ldo, pth + warp * 16 * LDP, dos, ldh, d);
            add_probs_times(dk + warp * 16 * ldo, ldo, dsth + warp * 16 * LDP, qs, ldh, d);
            __syncwarp();
        }
    }
    each_result(j0, k.t, d, [&](int r, int64_t at, int e) {
        float *out = (float *)k.out + off.o1 + k.group * k.part + at * k.seq_qkv;
        out[e] = k.scale * dk[r * ldo + e];
        out[k.part + e] = dv[r * ldo + e];
    });
#endif
}

#endif
