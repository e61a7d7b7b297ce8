/* A stand-in for the CUDA the tensor-core attention kernels use (devices/cuda/attention_tc.cuh),
 * compiled for the host: each thread of a block is a host thread, __syncthreads and __syncwarp
 * are barriers of the block's and the warp's threads, __shfl_xor_sync exchanges values through
 * the warp without ordering any other memory (relaxed atomics and a spinning rendezvous, as on a
 * GPU, so that a kernel missing a barrier reads stale shared memory here too, and
 * ThreadSanitizer sees the race), and the WMMA calls (16 x 16 x 16, bf16 in, f32 accumulation)
 * are done by lane 0 of the warp alone, with no barrier of their own: what other lanes wrote
 * must reach it through the kernel's __syncwarp, as on the hardware. Every WMMA pointer is
 * checked against WMMA's rules (32-byte alignment, a leading dimension of a multiple of 16
 * bytes) and the block's shared memory. bf16 is the project's rounding (devices/math.h). Enough
 * to run the kernels' indexing, masking, tiling and synchronisation on a machine without a GPU;
 * nothing of the hardware's timing. */
#ifndef MW_CUDA_EMU_H
#define MW_CUDA_EMU_H

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <type_traits>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "devices/math.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(n)

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

/* A rendezvous of a warp's 32 threads that orders no memory (relaxed atomics). */
struct emu_rendezvous {
    std::atomic<int> count{0}, gen{0};
};

/* The block a thread runs in: its barriers, shared memory and warp exchanges. */
struct emu_block {
    pthread_barrier_t all;
    pthread_barrier_t warp[32];
    emu_rendezvous meet[32];
    std::atomic<float> xchg[32][32];
    unsigned char *smem;
    size_t smem_bytes;
};

extern thread_local dim3 threadIdx, blockIdx;
extern thread_local emu_block *emu_here;

#define TC_SHARED(name) unsigned char *name = emu_here->smem

inline void __syncthreads() { pthread_barrier_wait(&emu_here->all); }
inline void __syncwarp() { pthread_barrier_wait(&emu_here->warp[threadIdx.x / 32]); }

inline void emu_meet() {
    emu_rendezvous &m = emu_here->meet[threadIdx.x / 32];
    int g = m.gen.load(std::memory_order_relaxed);
    if (m.count.fetch_add(1, std::memory_order_relaxed) == 31) {
        m.count.store(0, std::memory_order_relaxed);
        m.gen.store(g + 1, std::memory_order_relaxed);
    } else {
        while (m.gen.load(std::memory_order_relaxed) == g) sched_yield();
    }
}

inline float __shfl_xor_sync(unsigned, float v, int m) {
    unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32;
    emu_here->xchg[w][lane].store(v, std::memory_order_relaxed);
    emu_meet();
    float r = emu_here->xchg[w][lane ^ (unsigned)m].load(std::memory_order_relaxed);
    emu_meet();
    return r;
}

/* WMMA's rules for a 16 x 16 tile at p (elements of esize bytes, leading dimension ldm): 32-byte
 * alignment, ldm a multiple of 16 bytes, inside the block's shared memory. */
inline void emu_check_tile(const void *p, unsigned ldm, size_t esize) {
    const unsigned char *b = (const unsigned char *)p;
    size_t off = (size_t)(b - emu_here->smem), end = off + (15 * (size_t)ldm + 16) * esize;
    if (b < emu_here->smem || off % 32 || (ldm * esize) % 16 || end > emu_here->smem_bytes) {
        std::fprintf(stderr, "WMMA tile at shared offset %zu, ldm %u: misaligned or outside\n", off,
                     ldm);
        std::abort();
    }
}

/* attention_tc.cuh's 16-byte vector copies (uint4 on a GPU), with the alignment they need. */
inline void emu_aligned16(const void *p) {
    if ((uintptr_t)p % 16) {
        std::fprintf(stderr, "a 16-byte vector access at %p is misaligned\n", p);
        std::abort();
    }
}
inline void tc_copy16(void *d, const void *s) {
    emu_aligned16(d), emu_aligned16(s);
    std::memcpy(d, s, 16);
}
inline void tc_zero16(void *d) {
    emu_aligned16(d);
    std::memset(d, 0, 16);
}

struct __nv_bfloat16 {
    uint16_t bits;
};
inline __nv_bfloat16 __ushort_as_bfloat16(uint16_t h) { return __nv_bfloat16{h}; }
inline __nv_bfloat16 __float2bfloat16_rn(float x) { return __nv_bfloat16{mw__bf16_from_f32(x)}; }
inline float __bfloat162float(__nv_bfloat16 h) { return mw__bf16_to_f32(h.bits); }

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    float x[16][16]; /* element (r, c) of the tile, as read */
};

inline float value_of(float v) { return v; }
inline float value_of(__nv_bfloat16 v) { return __bfloat162float(v); }

inline bool emu_lane0() { return threadIdx.x % 32 == 0; }

template <typename Use, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout> &f, const T *p, unsigned ldm) {
    if (!emu_lane0()) return;
    emu_check_tile(p, ldm, sizeof(T));
    const bool col = std::is_same<Layout, col_major>::value;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r][c] = value_of(col ? p[c * ldm + r] : p[r * ldm + c]);
}

template <typename T>
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, T> &f, const float *p, unsigned ldm,
                             layout_t) {
    if (!emu_lane0()) return;
    emu_check_tile(p, ldm, sizeof(float));
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r][c] = p[r * ldm + c];
}

template <typename T>
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, T> &f, unsigned ldm,
                              layout_t) {
    if (!emu_lane0()) return;
    emu_check_tile(p, ldm, sizeof(float));
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) p[r * ldm + c] = f.x[r][c];
}

template <typename T> inline void fill_fragment(fragment<accumulator, 16, 16, 16, T> &f, float v) {
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r][c] = v;
}

template <typename T, typename A, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, T> &d,
                     const fragment<matrix_a, 16, 16, 16, A, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, A, LB> &b,
                     const fragment<accumulator, 16, 16, 16, T> &c) {
    if (!emu_lane0()) return;
    float out[16][16];
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) {
            float s = c.x[r][n];
            for (int k = 0; k < 16; k++) s += a.x[r][k] * b.x[k][n];
            out[r][n] = s;
        }
    std::memcpy(d.x, out, sizeof out);
}
} // namespace wmma
} // namespace nvcuda

/* Runs kernel(args...) on a grid of blocks of `threads` threads, one block after another, with
 * smem bytes of shared memory (filled with NaNs, as nothing clears it on a GPU: a read of
 * what the kernel never wrote shows in its results). */
template <typename F> struct emu_job {
    F *fn;
    emu_block *b;
    dim3 block_idx;
    unsigned thread;
};

template <typename F> void *emu_thread(void *arg) {
    emu_job<F> *j = (emu_job<F> *)arg;
    threadIdx = dim3(j->thread);
    blockIdx = j->block_idx;
    emu_here = j->b;
    (*j->fn)();
    return nullptr;
}

template <typename F> void emu_launch(dim3 grid, unsigned threads, size_t smem, F fn) {
    std::vector<unsigned char> mem(smem + 1);
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            emu_block b;
            std::fill(mem.begin(), mem.end(), (unsigned char)0xff); /* NaNs, f32 or bf16 */
            b.smem = mem.data();
            b.smem_bytes = smem;
            pthread_barrier_init(&b.all, nullptr, threads);
            for (unsigned w = 0; w < threads / 32; w++)
                pthread_barrier_init(&b.warp[w], nullptr, 32);
            std::vector<pthread_t> t(threads);
            std::vector<emu_job<F>> jobs(threads);
            for (unsigned i = 0; i < threads; i++) {
                jobs[i] = emu_job<F>{&fn, &b, dim3(bx, by), i};
                if (pthread_create(&t[i], nullptr, emu_thread<F>, &jobs[i]) != 0) std::abort();
            }
            for (unsigned i = 0; i < threads; i++) pthread_join(t[i], nullptr);
            pthread_barrier_destroy(&b.all);
            for (unsigned w = 0; w < threads / 32; w++) pthread_barrier_destroy(&b.warp[w]);
        }
}

#endif
