/* Reductions: sums over any set of dims (reduce), in an order fixed by the sizes only; the exact
 * sum of squares (sumsq, in integer bins); the maximum and its position along one axis
 * (reduce_max, argmax). */

#include "devices/cuda/cuda_impl.cuh"

#define REDUCE_TARGET_JOBS ((int64_t)1 << 17) /* threads a split reduction aims for */

/* --- reduce ----------------------------------------------------------------------------------- */

/* The dims of nd split into kept ones (out's stride is not 0: K outputs) and reduced ones (R
 * terms per output). A job (k, p) sums the terms r = p, p + P, p + 2P, ... of output k in order;
 * with P > 1 the P partials of each output are then summed in order of p by a second kernel.
 * P depends only on K and R, so the order is fixed. */

typedef struct sub_nd {
    int rank;
    int64_t dims[MW__ND_MAX];
    int64_t sa[MW__ND_MAX]; /* stride in a */
    int64_t so[MW__ND_MAX]; /* stride in out */
} sub_nd;

__device__ __forceinline__ void sub_offsets(const sub_nd &s, int64_t i, int64_t *oa, int64_t *oo) {
    int64_t a = 0, o = 0;
    for (int d = s.rank - 1; d >= 0; d--) {
        int64_t x = i % s.dims[d];
        i /= s.dims[d];
        a += x * s.sa[d];
        o += x * s.so[d];
    }
    *oa = a;
    *oo = o;
}

__global__ void k_reduce_jobs(sub_nd kept, sub_nd red, int64_t K, int64_t R, int64_t P,
                              int p_fastest, float alpha, float *out, float *partial,
                              const float *a) {
    GRID_LOOP(j, K * P) {
        int64_t k = p_fastest ? j / P : j % K;
        int64_t p = p_fastest ? j % P : j / K;
        int64_t oa, oo;
        sub_offsets(kept, k, &oa, &oo);
        float s = 0.0f;
        if (red.rank <= 1) {
            int64_t st = red.rank ? red.sa[0] : 0;
            for (int64_t r = p; r < R; r += P) s += a[oa + r * st];
        } else {
            for (int64_t r = p; r < R; r += P) {
                int64_t ra, unused;
                sub_offsets(red, r, &ra, &unused);
                s += a[oa + ra];
            }
        }
        if (P == 1)
            out[oo] = alpha * s;
        else
            partial[p * K + k] = s;
    }
}

/* Few partials: one thread per output adds them in order. */
__global__ void k_reduce_parts_seq(sub_nd kept, int64_t K, int64_t P, float alpha, float *out,
                                   const float *partial) {
    GRID_LOOP(k, K) {
        float s = 0.0f;
        for (int64_t p = 0; p < P; p++) s += partial[p * K + k];
        int64_t oa, oo;
        sub_offsets(kept, k, &oa, &oo);
        out[oo] = alpha * s;
    }
}

/* Many partials: one block per output, a fixed tree over them. */
template <int BS>
__global__ void k_reduce_parts_tree(sub_nd kept, int64_t K, int64_t P, float alpha, float *out,
                                    const float *partial) {
    __shared__ float sh[32];
    for (int64_t k = blockIdx.x; k < K; k += gridDim.x) {
        float s = 0.0f;
        for (int64_t p = threadIdx.x; p < P; p += BS) s += partial[p * K + k];
        s = block_sum<BS>(s, sh);
        if (threadIdx.x == 0) {
            int64_t oa, oo;
            sub_offsets(kept, k, &oa, &oo);
            out[oo] = alpha * s;
        }
    }
}

/* --- sum of squares: exact integer bins, folded into the accumulator -------------------------
 * Block b bins elements [b SQ_CHUNK, (b+1) SQ_CHUNK) by exponent (mw__sq_split) in shared 64-bit
 * bins (at most SQ_CHUNK values under 2^48 each: no overflow) and adds each to a 128-bit bin in
 * global scratch, the carry out of its low word counted into its high one; one thread then folds
 * the bins into the accumulator. Integer additions only, so the order the blocks and threads run
 * in changes nothing, and the sum is the exact one the CPU's kernel computes another way. */

#define SQ_CHUNK 65536

struct sq_bins {
    unsigned long long lo[256], hi[256], special[2];
};

__global__ void k_sumsq_bins(int64_t count, sq_bins *g, const float *a) {
    __shared__ unsigned long long bins[256];
    __shared__ unsigned long long special[2];
    for (int e = threadIdx.x; e < 256; e += blockDim.x) bins[e] = 0;
    if (threadIdx.x < 2) special[threadIdx.x] = 0;
    __syncthreads();
    int64_t lo = (int64_t)blockIdx.x * SQ_CHUNK, hi = lo + SQ_CHUNK < count ? lo + SQ_CHUNK : count;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        unsigned bin;
        uint64_t m2;
        int kind = mw__sq_split(a[i], &bin, &m2);
        if (kind)
            atomicAdd(&special[kind - 1], 1ull);
        else if (m2)
            atomicAdd(&bins[bin], (unsigned long long)m2);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < 256; e += blockDim.x) {
        unsigned long long v = bins[e];
        if (!v) continue;
        unsigned long long old = atomicAdd(&g->lo[e], v);
        if (old + v < old) atomicAdd(&g->hi[e], 1ull);
    }
    if (threadIdx.x < 2 && special[threadIdx.x])
        atomicAdd(&g->special[threadIdx.x], special[threadIdx.x]);
}

__global__ void k_sumsq_fold(mw__sqacc *acc, const sq_bins *g) {
    for (unsigned e = 1; e < 255; e++)
        if (g->lo[e] || g->hi[e]) mw__sqacc_add_bin(acc, e, g->lo[e], g->hi[e]);
    acc->nan += g->special[0];
    acc->inf += g->special[1];
}

/* --- maximum and its position along one axis ---------------------------------------------- */

__global__ void k_reduce_max(int64_t outer, int64_t n, int64_t inner, int arg, float *out,
                             const float *a) {
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < outer * inner;
         t += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = t / inner, i = t % inner;
        const float *x = a + o * n * inner + i;
        int64_t best = 0;
        for (int64_t j = 1; j < n; j++) /* the CPU's rule: larger wins, a number beats NaN */
            if (x[j * inner] > x[best * inner] ||
                (x[best * inner] != x[best * inner] && x[j * inner] == x[j * inner]))
                best = j;
        out[t] = arg ? (float)best : x[best * inner];
    }
}

/* --- entry points ------------------------------------------------------------------------ */

mw_status mw__cuda_reduce(mw__device *dev, const mw__k_reduce *k) {
    ENTER(dev);
    mw__nd nd = k->nd;
    mw__nd_simplify(&nd, 2);
    sub_nd kept, red;
    memset(&kept, 0, sizeof kept);
    memset(&red, 0, sizeof red);
    int64_t K = 1, R = 1;
    for (int d = 0; d < nd.rank; d++) {
        sub_nd *s = nd.stride[0][d] ? &kept : &red;
        s->dims[s->rank] = nd.dims[d];
        s->sa[s->rank] = nd.stride[1][d];
        s->so[s->rank] = nd.stride[0][d];
        s->rank++;
        *(nd.stride[0][d] ? &K : &R) *= nd.dims[d];
    }
    if (K < k->out_count || K == 0 || R == 0)
        CU(dev, cudaMemsetAsync, k->out, 0, (size_t)k->out_count * sizeof(float), im->stream);
    if (K == 0 || R == 0) return mw__cuda_launched(dev, "reduce");

    /* Split each output's terms over P jobs when there are few outputs and many terms; each
     * job keeps at least 16 terms. */
    int64_t P = 1;
    if (K < REDUCE_TARGET_JOBS && R >= 32) {
        P = (REDUCE_TARGET_JOBS + K - 1) / K;
        int64_t cap = (R + 15) / 16;
        if (P > cap) P = cap;
        int64_t room = (int64_t)(SCRATCH_BYTES / sizeof(float)) / K;
        if (P > room) P = room;
        if (P < 1) P = 1;
    }
    /* Coalesced reads: neighbouring threads take neighbouring elements of a's innermost dim. */
    int p_fastest = nd.rank > 0 && nd.stride[0][nd.rank - 1] == 0;
    float *partial = (float *)im->scratch;
    LAUNCH(k_reduce_jobs, blocks_for(K * P, THREADS), THREADS, 0, kept, red, K, R, P, p_fastest,
           k->alpha, k->out, partial, k->a);
    if (P > 1) {
        if (P <= 32)
            LAUNCH(k_reduce_parts_seq, blocks_for(K, THREADS), THREADS, 0, kept, K, P, k->alpha,
                   k->out, partial);
        else
            LAUNCH(k_reduce_parts_tree<THREADS>, row_blocks(K), THREADS, 0, kept, K, P, k->alpha,
                   k->out, partial);
    }
    return mw__cuda_launched(dev, "reduce kernel");
}

mw_status mw__cuda_sumsq(mw__device *dev, const mw__k_sumsq *k) {
    ENTER(dev);
    if (k->zero) CU(dev, cudaMemsetAsync, k->out, 0, sizeof *k->out, im->stream);
    if (k->count <= 0) return mw__cuda_launched(dev, "sumsq");
    sq_bins *g = (sq_bins *)im->scratch;
    CU(dev, cudaMemsetAsync, g, 0, sizeof *g, im->stream);
    int64_t blocks = (k->count + SQ_CHUNK - 1) / SQ_CHUNK;
    LAUNCH(k_sumsq_bins, (unsigned)blocks, THREADS, 0, k->count, g, k->a);
    LAUNCH(k_sumsq_fold, 1, 1, 0, k->out, g);
    return mw__cuda_launched(dev, "sumsq kernel");
}

static mw_status reduce_max(mw__device *dev, const mw__k_max *k, int arg) {
    mw_status st = enter_gpu(dev);
    if (st || k->outer * k->inner <= 0) return st;
    k_reduce_max<<<wide_blocks(k->outer * k->inner), THREADS, 0, mw__cuda_stream(dev)>>>(
        k->outer, k->n, k->inner, arg, k->out, k->a);
    return launch_error(dev, "max kernel");
}

extern "C" mw_status mw__cuda_argmax(mw__device *dev, const mw__k_max *k) {
    return reduce_max(dev, k, 1);
}

extern "C" mw_status mw__cuda_reduce_max(mw__device *dev, const mw__k_max *k) {
    return reduce_max(dev, k, 0);
}
