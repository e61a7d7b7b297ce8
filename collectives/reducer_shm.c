/* The shared-memory reducer: collectives among worker threads of one process (virtual CPU
 * devices), with no copy through the kernel and no lock on the hot path.
 *
 * Synchronisation. All ranks share one atomic word, `sync`: its low bits count arrivals since the
 * last reset, its top bit says the communicator was aborted. Every collective is made of "steps"
 * that all ranks take in the same order; rank r's k-th step is complete when the count reaches
 * k * nranks, so a waiter watches one word and needs no barrier object: it spins briefly, then
 * sleeps in the kernel (collectives/wait.h) until an arrival wakes it, so that on a busy machine a
 * waiting rank gives its core to the peer it waits for instead of competing with it. A rank run
 * as a task of a gang (all ranks on one thread, collectives/fiber.h) neither spins nor sleeps: it
 * lets the gang's other ranks run until the step completes. (Per-rank
 * flags would spare the shared line, but could not make the decision below atomic; with at most a
 * handful of ranks per host the one line costs little.) Putting the abort bit in the same word as
 * the count is what makes abort safe: an arrival that may be refused increments the count with a
 * compare-exchange that fails once the bit is set, so a step's count can only reach its target if
 * every rank arrived before the abort. Every rank therefore makes the same decision from the same
 * word (target reached: proceed, even if the bit was set afterwards; target not reached and bit
 * set: give up), and no rank can be left writing into a buffer whose owner already returned.
 *
 * Large messages (in place, one pass). Each rank publishes its buffer; after the first step rank
 * r owns slice r (64-byte aligned, equal to within one cache line) and, chunk by chunk, sums that
 * slice over all buffers in rank order and writes the sum back into every buffer. Slices are
 * disjoint, so no rank reads anything another rank writes. The chunk is read from memory once and
 * written back from cache, so the whole collective moves 2 * nranks * bytes through memory: the
 * least any in-place all-reduce can. A second step ("done") keeps every rank inside until all
 * slices are written. It cannot be refused: once the first step completed every rank is doing
 * bounded work that waits for nobody.
 *
 * Small messages. Each rank copies its data into its own slot of a scratch area allocated with
 * the communicator, takes one step, and sums all slots in rank order into its own buffer. Slots
 * alternate by step parity: a rank refills the slot of step s only at step s + 2, after passing
 * step s + 1, which every peer reaches only after it finished reading step s's slots.
 *
 * Every collective starts with a refusable step that also publishes what the rank called (op,
 * length, buffer); all ranks then check the same descriptors, so a rank that passed a different
 * length fails on every rank instead of writing past a buffer. A zero-length all-reduce takes
 * that step too, so ranks always agree on which collective an abort stopped.
 *
 * An all-gather may be split in two (all_gather_start, then finish): the start publishes the
 * call and arrives at the first step without waiting; finish waits for that step, copies and
 * takes the done step. Any other call of the rank on the communicator finishes it first, so the
 * steps of all ranks stay in one order.
 *
 * Sums started with allreduce_start (the gradient buckets) meet no peer: the rank notes the
 * buffer and computes on. Its finish (or its next other call) takes every sum it started as one
 * all-reduce over their lengths added up: one refusable step that also checks that every rank
 * started the same sums, each rank's slice of the whole summed as the large path sums, and the
 * done step. Threads of one process cannot sum while they compute (the sum is their own work),
 * so what waiting at each bucket would cost is the peers' lateness at every bucket, added up;
 * the deferred sums wait once, at the end, for the latest rank.
 *
 * Both paths add in the same order (rank 0 + rank 1 + ...), element by element, so the result is
 * the same bits on every rank, on every run and whichever path ran.
 *
 * Point-to-point calls (reducer_shm_p2p.c) take no step: only their two ranks meet, through the
 * receiver's posted receive, and share with the collectives only the abort word and the waits. */
#include "collectives/reducer_shm_impl.h"

#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "collectives/fiber.h"
#include "collectives/wait.h"
#include "core/alloc.h"
#include "core/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define PAIR_BF16_AVX512 1 /* sum_pair_bf16_avx512, picked at run time */
#endif

/* ---- kernels. The inner loops run a fixed 16 iterations so GCC's -O2 cost model vectorises
 * them (it will not add a scalar epilogue); restrict drops the run-time aliasing checks. AVX2
 * and x86-64-v4 clones, picked at load time, run 1.5-2x faster on data in cache (no gain once
 * memory-bound; bf16's rounding is what the v4 clone speeds up); the adds are element-wise, so
 * every clone gives the same bits. ---- */

/* GCC only: clang 14 makes the resolvers of static clones global symbols, which would clash.
 * Not under ThreadSanitizer: the dynamic loader runs the (instrumented) resolver before the
 * sanitizer's runtime is up, and the program crashes at load. */
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__GNUC__) && !defined(__clang__) &&       \
    !defined(__SANITIZE_THREAD__)
#define VEC_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define VEC_CLONES
#endif

VEC_CLONES static void add_into(float *restrict d, const float *restrict s, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (size_t j = 0; j < 16; j++) d[i + j] += s[i + j];
    for (; i < n; i++) d[i] += s[i];
}

VEC_CLONES static void add_two(float *restrict d, const float *restrict a, const float *restrict b,
                               size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (size_t j = 0; j < 16; j++) d[i + j] = a[i + j] + b[i + j];
    for (; i < n; i++) d[i] = a[i] + b[i];
}

/* Two ranks, one pass: both buffers get a + b. */
VEC_CLONES static void sum_pair(float *restrict a, float *restrict b, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (size_t j = 0; j < 16; j++) {
            float s = a[i + j] + b[i + j];
            a[i + j] = s;
            b[i + j] = s;
        }
    for (; i < n; i++) {
        float s = a[i] + b[i];
        a[i] = s;
        b[i] = s;
    }
}

/* The published buffer of rank q for step parity `parity`, as floats or bf16. */
static float *fbuf(mw__comm *c, int q, int parity) { return c->ranks[q].pub[parity].buf; }
static uint16_t *hbuf(mw__comm *c, int q, int parity) { return c->ranks[q].pub[parity].buf; }

/* Rank q's f32 buffer: the one it published for step parity `parity` (seg < 0), or the seg-th
 * sum it started (allreduce_start). */
static float *rank_buf(mw__comm *c, int q, int parity, int seg) {
    return seg < 0 ? fbuf(c, q, parity) : c->ranks[q].segs[seg].buf;
}

/* Sums [lo, hi) over the ranks' buffers (rank_buf), in rank order, and stores the sum into every
 * buffer. */
static void reduce_slice(mw__comm *c, int parity, int seg, size_t lo, size_t hi) {
    int p = c->nranks;
    for (size_t at = lo; at < hi; at += CHUNK_FLOATS) {
        size_t len = hi - at < CHUNK_FLOATS ? hi - at : CHUNK_FLOATS;
        float *acc = rank_buf(c, 0, parity, seg) + at; /* rank 0's copy is the accumulator */
        if (p == 2) {
            sum_pair(acc, rank_buf(c, 1, parity, seg) + at, len);
            continue;
        }
        for (int q = 1; q < p; q++) add_into(acc, rank_buf(c, q, parity, seg) + at, len);
        for (int q = 1; q < p; q++)
            memcpy(rank_buf(c, q, parity, seg) + at, acc, len * sizeof(float));
    }
}

/* bf16: acc[0..n) = the widened values of [at, at + n) summed in rank order, in f32 (the bits
 * of mw__bf16_to_f32 and mw__bf16_from_f32, devices/math.h, written out in fixed runs of 16 so
 * GCC -O2 vectorises them). */
static inline float widen1(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

VEC_CLONES static void sum_bf16(mw__comm *c, int parity, size_t at, size_t n, float *restrict acc) {
    for (int q = 0; q < c->nranks; q++) {
        const uint16_t *restrict h = hbuf(c, q, parity) + at;
        size_t i = 0;
        if (q == 0) {
            for (; i + 16 <= n; i += 16)
                for (size_t j = 0; j < 16; j++) acc[i + j] = widen1(h[i + j]);
            for (; i < n; i++) acc[i] = widen1(h[i]);
        } else {
            for (; i + 16 <= n; i += 16)
                for (size_t j = 0; j < 16; j++) acc[i + j] += widen1(h[i + j]);
            for (; i < n; i++) acc[i] += widen1(h[i]);
        }
    }
}

static inline uint16_t round1(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;
    uint32_t nan = 0u - (uint32_t)((u & 0x7fffffffu) > 0x7f800000u); /* all ones for a NaN */
    return (uint16_t)((r & ~nan) | (q & nan));
}

VEC_CLONES static void round_bf16(const float *restrict acc, size_t n, uint16_t *restrict out) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (size_t j = 0; j < 16; j++) out[i + j] = round1(acc[i + j]);
    for (; i < n; i++) out[i] = round1(acc[i]);
}

/* Two ranks, one pass: both buffers get the f32 sum of their widened values, rounded once (the
 * bits of sum_bf16 and round_bf16, without their round trip through the accumulator). */
VEC_CLONES static void sum_pair_bf16(uint16_t *restrict a, uint16_t *restrict b, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (size_t j = 0; j < 16; j++) {
            uint16_t s = round1(widen1(a[i + j]) + widen1(b[i + j]));
            a[i + j] = s;
            b[i + j] = s;
        }
    for (; i < n; i++) {
        uint16_t s = round1(widen1(a[i]) + widen1(b[i]));
        a[i] = s;
        b[i] = s;
    }
}

/* sum_pair_bf16 in AVX-512 registers: the compiler's clones narrow through permutes and spend
 * more time rounding than memory takes. The same integer steps as round1, so the same bits. */
#ifdef PAIR_BF16_AVX512
__attribute__((target("avx512f"))) static void
sum_pair_bf16_avx512(uint16_t *restrict a, uint16_t *restrict b, size_t n) {
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    const __m512i quiet = _mm512_set1_epi32(0x40), magnitude = _mm512_set1_epi32(0x7fffffff);
    const __m512i inf = _mm512_set1_epi32(0x7f800000);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(a + i)));
        __m512i y = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(b + i)));
        __m512 sum = _mm512_add_ps(_mm512_castsi512_ps(_mm512_slli_epi32(x, 16)),
                                   _mm512_castsi512_ps(_mm512_slli_epi32(y, 16)));
        __m512i u = _mm512_castps_si512(sum), high = _mm512_srli_epi32(u, 16);
        __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, bias), _mm512_and_si512(high, one));
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, magnitude), inf);
        r = _mm512_mask_or_epi32(_mm512_srli_epi32(r, 16), nan, high, quiet);
        __m256i h = _mm512_cvtepi32_epi16(r);
        _mm256_storeu_si256((__m256i *)(a + i), h);
        _mm256_storeu_si256((__m256i *)(b + i), h);
    }
    for (; i < n; i++) {
        uint16_t s = round1(widen1(a[i]) + widen1(b[i]));
        a[i] = s;
        b[i] = s;
    }
}
#endif

/* reduce_slice for bf16 buffers: each sum in f32, rounded once and copied into every buffer. */
static void reduce_slice_bf16(mw__comm *c, int parity, size_t lo, size_t hi) {
    float acc[CHUNK_FLOATS];
    uint16_t sum[CHUNK_FLOATS];
    if (c->nranks == 2) {
#ifdef PAIR_BF16_AVX512
        if (__builtin_cpu_supports("avx512f")) {
            sum_pair_bf16_avx512(hbuf(c, 0, parity) + lo, hbuf(c, 1, parity) + lo, hi - lo);
            return;
        }
#endif
        sum_pair_bf16(hbuf(c, 0, parity) + lo, hbuf(c, 1, parity) + lo, hi - lo);
        return;
    }
    for (size_t at = lo; at < hi; at += CHUNK_FLOATS) {
        size_t len = hi - at < CHUNK_FLOATS ? hi - at : CHUNK_FLOATS;
        sum_bf16(c, parity, at, len, acc);
        round_bf16(acc, len, sum);
        for (int q = 0; q < c->nranks; q++) memcpy(hbuf(c, q, parity) + at, sum, len * sizeof *sum);
    }
}

static size_t esize(mw_dtype d) { return d == MW_BF16 ? 2 : 4; }

/* Rank `rank`'s slice [*lo, *hi) of n elements over p ranks, in whole 64-byte lines of `per`
 * elements, so that no two ranks write the same line. */
static void line_slice(size_t n, size_t per, int rank, int p, size_t *lo, size_t *hi) {
    size_t lines = (n + per - 1) / per;
    *lo = lines * (size_t)rank / (size_t)p * per;
    *hi = lines * (size_t)(rank + 1) / (size_t)p * per;
    if (*hi > n) *hi = n;
}

/* ---- vtable ---- */

static mw_status shm_comm_new(int nranks, struct mw__device *const *devices,
                              const mw__comm_options *opt, mw__comm **out) {
    (void)devices;
    if (!out) return mw__error(MW_ERR_INVALID, "shm comm_new: out is NULL");
    *out = NULL;
    if (nranks < 1 || nranks > MAX_RANKS)
        return mw__error(MW_ERR_INVALID, "shm comm_new: %d ranks (expected 1..%d)", nranks,
                         MAX_RANKS);
    if (opt && opt->timeout_ms < 0)
        return mw__error(MW_ERR_INVALID, "shm comm_new: timeout_ms is %d (expected >= 0)",
                         opt->timeout_ms);
    mw__comm *c = mw__aligned_alloc(LINE, sizeof *c);
    size_t ranks_size = (size_t)nranks * sizeof(rank_state);
    size_t slot_size = SMALL_MAX_FLOATS * sizeof(float);
    rank_state *ranks = mw__aligned_alloc(LINE, ranks_size);
    float *scratch = nranks > 1 ? mw__aligned_alloc(LINE, (size_t)nranks * 2 * slot_size) : NULL;
    int *names = opt && opt->names ? mw__malloc((size_t)nranks * sizeof *names) : NULL;
    if (!c || !ranks || (nranks > 1 && !scratch) || (opt && opt->names && !names)) {
        mw__free(c);
        mw__free(ranks);
        mw__free(scratch);
        mw__free(names);
        return mw__error(MW_ERR_NOMEM, "shm comm_new: out of memory for %d ranks", nranks);
    }
    memset(c, 0, sizeof *c);
    memset(ranks, 0, ranks_size);
    atomic_init(&c->sync, 0);
    atomic_init(&c->why, 0);
    c->nranks = nranks;
    c->timeout_ms = opt ? opt->timeout_ms : 0;
    c->wake = opt ? opt->wake : NULL;
    c->spin_ns = mw__spin_ns(nranks);
    c->scratch = scratch;
    c->ranks = ranks;
    c->names = names;
    if (names) memcpy(names, opt->names, (size_t)nranks * sizeof *names);
    for (int r = 0; r < nranks; r++) {
        atomic_init(&ranks[r].arrived, 0);
        atomic_init(&ranks[r].recv.state, P2P_IDLE);
        if (scratch) {
            ranks[r].slot[0] = scratch + (size_t)r * 2 * SMALL_MAX_FLOATS;
            ranks[r].slot[1] = ranks[r].slot[0] + SMALL_MAX_FLOATS;
        }
    }
    *out = c;
    return MW_OK;
}

static void shm_comm_free(mw__comm *c) {
    if (!c) return;
    for (int r = 0; r < c->nranks; r++) mw__free(c->ranks[r].segs);
    mw__free(c->scratch);
    mw__free(c->ranks);
    mw__free(c->names);
    mw__free(c);
}

static mw_status finish_gather(mw__comm *c, int rank);
static mw_status take_sums(mw__comm *c, int rank);

/* Completes what this rank started: its all-gather (started first: a sum started before it was
 * taken by its start), then its sums. */
static mw_status finish_started(mw__comm *c, int rank) {
    mw_status st = c->ranks[rank].pending ? finish_gather(c, rank) : MW_OK;
    return st == MW_OK && c->ranks[rank].nsegs ? take_sums(c, rank) : st;
}

/* Checks the arguments of a call; a bad one aborts the communicator, so peers are not left
 * waiting for a rank that will never arrive. A valid call first completes what this rank started
 * (all_gather_start, allreduce_start). */
mw_status mw__shm_check_args(mw__comm *c, int rank, const char *what, int bad_buf, mw_dtype dtype) {
    if (!c) return mw__error(MW_ERR_INVALID, "%s: communicator is NULL", what);
    if (dtype != MW_F32 && dtype != MW_BF16) {
        mw__shm_set_abort(c, mw__shm_pack_why(CAUSE_INVALID, rank, -1, 0));
        return mw__error(MW_ERR_UNSUPPORTED, "%s: elements of dtype %d (f32 and bf16 only)", what,
                         (int)dtype);
    }
    if (rank < 0 || rank >= c->nranks) {
        mw__shm_set_abort(c, mw__shm_pack_why(CAUSE_INVALID, -1, -1, 0));
        return mw__error(MW_ERR_INVALID, "%s: rank %d out of range 0..%d", what, rank,
                         c->nranks - 1);
    }
    if (bad_buf) {
        mw__shm_set_abort(c, mw__shm_pack_why(CAUSE_INVALID, rank, -1, 0));
        return mw__error(MW_ERR_INVALID, "%s: rank %d passed a NULL buffer", what, rank);
    }
    return finish_started(c, rank);
}

static mw_status shm_allreduce_sum(mw__comm *c, int rank, void *vbuf, size_t n, mw_dtype dtype) {
    mw_status st = mw__shm_check_args(c, rank, "all-reduce", !vbuf && n > 0, dtype);
    if (st != MW_OK) return st;
    float *buf = vbuf;
    int p = c->nranks;
    if (p == 1) {
        if (atomic_load_explicit(&c->sync, memory_order_acquire) & ABORT_BIT)
            return mw__shm_aborted_error(c, rank, OP_ALLREDUCE, c->ranks[rank].step + 1, 1);
        return MW_OK;
    }
    /* Nothing to add, but still one step: skipping it would let ranks disagree on which
     * collective an abort stopped, and would hide a peer that passed a different length. */
    if (n == 0) return mw__shm_enter(c, rank, OP_ALLREDUCE, buf, 0, dtype, NULL);
    rank_state *me = &c->ranks[rank];
    if (n <= SMALL_MAX_FLOATS && dtype == MW_F32) {
        int parity = (int)((me->step + 1) & 1);
        memcpy(me->slot[parity], buf, n * sizeof(float));
        st = mw__shm_enter(c, rank, OP_ALLREDUCE, buf, n, dtype, NULL);
        if (st != MW_OK) return st;
        add_two(buf, c->ranks[0].slot[parity], c->ranks[1].slot[parity], n);
        for (int q = 2; q < p; q++) add_into(buf, c->ranks[q].slot[parity], n);
        return MW_OK;
    }
    int parity = (int)((me->step + 1) & 1);
    st = mw__shm_enter(c, rank, OP_ALLREDUCE, buf, n, dtype, NULL);
    if (st != MW_OK) return st;
    size_t lo, hi;
    line_slice(n, 64 / esize(dtype), rank, p, &lo, &hi);
    if (lo < hi && dtype == MW_F32) reduce_slice(c, parity, -1, lo, hi);
    if (lo < hi && dtype == MW_BF16) reduce_slice_bf16(c, parity, lo, hi);
    return mw__shm_take_step(c, rank, OP_ALLREDUCE, 0);
}

/* Notes the sum for the rank's next finish (or other call); a sum that cannot wait (bf16, one
 * rank, no elements, a bad call) is made at once by allreduce_sum. */
static mw_status shm_allreduce_start(mw__comm *c, int rank, void *buf, size_t n, mw_dtype dtype) {
    if (!c || rank < 0 || rank >= c->nranks || c->nranks == 1 || !buf || n == 0 || dtype != MW_F32)
        return shm_allreduce_sum(c, rank, buf, n, dtype);
    rank_state *me = &c->ranks[rank];
    if (me->nsegs == me->cap_segs) {
        int cap = me->cap_segs ? 2 * me->cap_segs : 16;
        sum_seg *grown = mw__realloc(me->segs, (size_t)cap * sizeof *grown);
        if (!grown) {
            mw__shm_set_abort(c, mw__shm_pack_why(CAUSE_INVALID, rank, -1, 0));
            return mw__error(MW_ERR_NOMEM, "all-reduce: rank %d: out of memory noting %d sums",
                             rank, cap);
        }
        me->segs = grown;
        me->cap_segs = cap;
    }
    me->segs[me->nsegs++] = (sum_seg){buf, n};
    return MW_OK;
}

/* The sums this rank started, taken as one all-reduce of their lengths added up (see the top of
 * this file). Every rank sees every rank's list after the first step, so a rank whose sums
 * differ from rank 0's makes every rank fail alike. */
static mw_status take_sums(mw__comm *c, int rank) {
    rank_state *me = &c->ranks[rank];
    int k = me->nsegs;
    size_t total = 0;
    for (int i = 0; i < k; i++) total += me->segs[i].n;
    me->nsegs = 0;
    me->nsegs_taken = k; /* read by the peers after the step publishes it */
    mw_status st = mw__shm_enter(c, rank, OP_ALLREDUCE, me->segs, total, MW_F32, NULL);
    if (st != MW_OK) return st;
    const rank_state *r0 = &c->ranks[0];
    for (int q = 1; q < c->nranks; q++) {
        const rank_state *r = &c->ranks[q];
        if (r->nsegs_taken != r0->nsegs_taken)
            return mw__error(MW_ERR_INVALID,
                             "all-reduce: rank 0 started %d sums and rank %d started %d",
                             r0->nsegs_taken, q, r->nsegs_taken);
        for (int i = 0; i < k; i++)
            if (r->segs[i].n != r0->segs[i].n)
                return mw__error(MW_ERR_INVALID,
                                 "all-reduce: sum %d started: rank 0 has %zu elements, rank %d "
                                 "has %zu",
                                 i, r0->segs[i].n, q, r->segs[i].n);
    }
    /* This rank's slice of the whole, each sum's part of it in turn. */
    size_t lo, hi;
    line_slice(total, 16, rank, c->nranks, &lo, &hi);
    for (size_t i = 0, base = 0; i < (size_t)k && base < hi; base += me->segs[i++].n) {
        size_t n = me->segs[i].n, a = lo > base ? lo - base : 0;
        size_t b = hi - base < n ? hi - base : n;
        if (a < b) reduce_slice(c, 0, (int)i, a, b);
    }
    return mw__shm_take_step(c, rank, OP_ALLREDUCE, 0);
}

/* One pass like the all-reduce's large path, but every rank writes its sum only into its own
 * buffer: the chunk is summed in rank order into a stack buffer (so rank r's own data is read
 * before it is overwritten), then copied home. Peers read this rank's other parts meanwhile,
 * which it does not write; the committed "done" step keeps every buffer alive until all parts
 * are summed. */
static mw_status shm_reduce_scatter_sum(mw__comm *c, int rank, void *buf, size_t n, mw_dtype dtype,
                                        const size_t *bounds) {
    mw_status st = mw__shm_check_args(c, rank, "reduce-scatter", (!buf && n > 0) || !bounds, dtype);
    if (st != MW_OK) return st;
    if (mw__bad_bounds(bounds, c->nranks, n)) {
        mw__shm_set_abort(c, mw__shm_pack_why(CAUSE_INVALID, rank, -1, 0));
        return mw__error(MW_ERR_INVALID, "reduce-scatter: rank %d passed parts outside 0..%zu",
                         rank, n);
    }
    int p = c->nranks;
    if (p == 1) return shm_allreduce_sum(c, rank, buf, n, dtype);
    int parity = (int)((c->ranks[rank].step + 1) & 1);
    if ((st = mw__shm_enter(c, rank, OP_REDUCE_SCATTER, buf, n, dtype, bounds)) != MW_OK) return st;
    float acc[CHUNK_FLOATS];
    for (size_t at = bounds[rank]; at < bounds[rank + 1]; at += CHUNK_FLOATS) {
        size_t left = bounds[rank + 1] - at, len = left < CHUNK_FLOATS ? left : CHUNK_FLOATS;
        if (dtype == MW_BF16) {
            sum_bf16(c, parity, at, len, acc);
            round_bf16(acc, len, (uint16_t *)buf + at);
            continue;
        }
        add_two(acc, fbuf(c, 0, parity) + at, fbuf(c, 1, parity) + at, len);
        for (int q = 2; q < p; q++) add_into(acc, fbuf(c, q, parity) + at, len);
        memcpy((float *)buf + at, acc, len * sizeof(float));
    }
    return mw__shm_take_step(c, rank, OP_REDUCE_SCATTER, 0);
}

/* An all-gather's checks; a bad call aborts the communicator. */
static mw_status gather_args(mw__comm *c, int rank, void *buf, size_t n, mw_dtype dtype,
                             const size_t *bounds) {
    mw_status st = mw__shm_check_args(c, rank, "all-gather", (!buf && n > 0) || !bounds, dtype);
    if (st != MW_OK) return st;
    if (!mw__bad_bounds(bounds, c->nranks, n)) return MW_OK;
    mw__shm_set_abort(c, mw__shm_pack_why(CAUSE_INVALID, rank, -1, 0));
    return mw__error(MW_ERR_INVALID, "all-gather: rank %d passed parts outside 0..%zu", rank, n);
}

/* The all-gather after its first step (every rank arrived at it): checks the calls, copies the
 * peers' parts out of their buffers into this rank's (nobody writes a part another rank reads)
 * and takes the committed "done" step, which keeps every buffer alive until all are copied. */
static mw_status gather_rest(mw__comm *c, int rank) {
    int parity = (int)(c->ranks[rank].step & 1);
    const desc *d = &c->ranks[rank].pub[parity];
    mw_status st = mw__shm_same_calls(c, OP_ALL_GATHER, parity);
    if (st != MW_OK) return st;
    size_t es = esize(d->dtype);
    for (int q = 0; q < c->nranks; q++)
        if (q != rank && d->bounds[q] < d->bounds[q + 1])
            memcpy((char *)d->buf + d->bounds[q] * es,
                   (const char *)c->ranks[q].pub[parity].buf + d->bounds[q] * es,
                   (d->bounds[q + 1] - d->bounds[q]) * es);
    return mw__shm_take_step(c, rank, OP_ALL_GATHER, 0);
}

static mw_status shm_all_gather(mw__comm *c, int rank, void *buf, size_t n, mw_dtype dtype,
                                const size_t *bounds) {
    mw_status st = gather_args(c, rank, buf, n, dtype, bounds);
    if (st != MW_OK) return st;
    if (c->nranks == 1) return shm_allreduce_sum(c, rank, buf, n, dtype);
    if ((st = mw__shm_enter(c, rank, OP_ALL_GATHER, buf, n, dtype, bounds)) != MW_OK) return st;
    return gather_rest(c, rank);
}

/* Split in two: the start publishes the call and arrives at its first step without waiting, so
 * that this rank computes on while its peers reach the gather; finish waits for them, copies and
 * takes the done step. */
static mw_status shm_all_gather_start(mw__comm *c, int rank, void *buf, size_t n, mw_dtype dtype,
                                      const size_t *bounds) {
    mw_status st = gather_args(c, rank, buf, n, dtype, bounds);
    if (st != MW_OK) return st;
    if (c->nranks == 1) return shm_allreduce_sum(c, rank, buf, n, dtype);
    if ((st = mw__shm_announce(c, rank, OP_ALL_GATHER, buf, n, dtype, bounds, 0)) != MW_OK)
        return st;
    c->ranks[rank].pending = 1;
    return MW_OK;
}

static mw_status finish_gather(mw__comm *c, int rank) {
    c->ranks[rank].pending = 0;
    mw_status st = mw__shm_await_step(c, rank, OP_ALL_GATHER, 1);
    return st ? st : gather_rest(c, rank);
}

static mw_status shm_finish(mw__comm *c, int rank) {
    if (!c) return mw__error(MW_ERR_INVALID, "finish: communicator is NULL");
    if (rank < 0 || rank >= c->nranks)
        return mw__error(MW_ERR_INVALID, "finish: rank %d out of range 0..%d", rank, c->nranks - 1);
    return finish_started(c, rank);
}

/* Every rank but the root copies the root's buffer; nobody writes what another rank reads. */
static mw_status shm_broadcast(mw__comm *c, int rank, void *buf, size_t n, mw_dtype dtype,
                               int root) {
    mw_status st = mw__shm_check_args(c, rank, "broadcast", !buf && n > 0, dtype);
    if (st != MW_OK) return st;
    if (root < 0 || root >= c->nranks) {
        mw__shm_set_abort(c, mw__shm_pack_why(CAUSE_INVALID, rank, -1, 0));
        return mw__error(MW_ERR_INVALID, "broadcast: rank %d named root %d (expected 0..%d)", rank,
                         root, c->nranks - 1);
    }
    if (c->nranks == 1) return shm_allreduce_sum(c, rank, buf, n, dtype);
    int parity = (int)((c->ranks[rank].step + 1) & 1);
    if ((st = mw__shm_enter_root(c, rank, OP_BROADCAST, buf, n, dtype, NULL, root)) != MW_OK)
        return st;
    const void *from = c->ranks[root].pub[parity].buf;
    if (rank != root && n > 0 && from != buf) memcpy(buf, from, n * esize(dtype));
    return mw__shm_take_step(c, rank, OP_BROADCAST, 0);
}

static mw_status shm_barrier(mw__comm *c, int rank) {
    mw_status st = mw__shm_check_args(c, rank, "barrier", 0, MW_F32);
    if (st != MW_OK) return st;
    if (c->nranks == 1) {
        if (atomic_load_explicit(&c->sync, memory_order_acquire) & ABORT_BIT)
            return mw__shm_aborted_error(c, rank, OP_BARRIER, c->ranks[rank].step + 1, 1);
        return MW_OK;
    }
    return mw__shm_enter(c, rank, OP_BARRIER, NULL, 0, MW_F32, NULL);
}

static void shm_abort(mw__comm *c) {
    if (c) mw__shm_set_abort(c, mw__shm_pack_why(CAUSE_ABORT, -1, -1, 0));
}

static void shm_reset(mw__comm *c) {
    if (!c) return;
    for (int r = 0; r < c->nranks; r++) {
        c->ranks[r].step = 0;
        c->ranks[r].pending = 0;
        c->ranks[r].nsegs = c->ranks[r].nsegs_taken = 0;
        atomic_store_explicit(&c->ranks[r].arrived, 0, memory_order_relaxed);
        atomic_store_explicit(&c->ranks[r].recv.state, P2P_IDLE, memory_order_relaxed);
    }
    atomic_store_explicit(&c->why, 0, memory_order_relaxed);
    atomic_store_explicit(&c->sync, 0, memory_order_release);
    mw__event_notify(&c->ev);
}

const mw__reducer_vtable mw__reducer_shm = {
    .name = "shm",
    .comm_new = shm_comm_new,
    .comm_free = shm_comm_free,
    .allreduce_sum = shm_allreduce_sum,
    .barrier = shm_barrier,
    .abort = shm_abort,
    .reset = shm_reset,
    .reduce_scatter_sum = shm_reduce_scatter_sum,
    .all_gather = shm_all_gather,
    .broadcast = shm_broadcast,
    .allreduce_start = shm_allreduce_start,
    .all_gather_start = shm_all_gather_start,
    .finish = shm_finish,
    .send = mw__shm_send,
    .recv = mw__shm_recv,
    .sendrecv = mw__shm_sendrecv,
};
