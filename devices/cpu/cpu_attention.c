/* CPU fused self-attention (mw_attention). Per (batch, head) slice, queries are taken in blocks
 * of k->block rows; a block's scores against the keys it may see go into a block x T scratch,
 * are softmaxed row by row, and multiplied into the output. With a causal mask a block only meets
 * the keys up to its last row, and within the block every product stops at the diagonal (to the
 * nearest micro tile), so the masked half is never computed. When the plan gives k->probs (short
 * sequences: the probabilities take no more memory than qkv), the forward writes each block's
 * probabilities there instead of into the scratch and the backward reads them back; otherwise
 * no Seq x Seq tensor outlives the kernel and the backward recomputes each block's probabilities
 * (bitwise the forward's). The backward then forms dS = P * (dP - D) with
 * D_i = sum_j P_ij dP_ij, and accumulates dK and dV block after block in a fixed order: the
 * result is deterministic, and the same bits whether the probabilities were kept or not.
 *
 * The products are this file's own register-tiled loops (tiles of sixteen columns by six rows of
 * two AVX2 accumulators, or eight rows of one AVX-512 accumulator, summing the same terms in the
 * same order) rather than sgemm calls: at head sizes of 64 and blocks of 64 rows a BLAS call
 * spends about as long packing and zeroing as multiplying, and it cannot stop at the diagonal
 * inside a block. The keys and values of a slice (and a block's queries and dO) are packed once
 * into the scratch (see pack), so that every product reads its B operand sequentially.
 *
 * Also the cached attention of inference (one query row per position against the keys and values
 * a key/value cache holds so far). */
#include <string.h>

#include "core/error.h"
#include "devices/cpu/cpu_attention_impl.h"
#include "devices/cpu/cpu_isa.h"
#include "devices/cpu/cpu_kernels.h"
#include "devices/cpu/cpu_state.h"
#include "devices/cpu/rope_angles.h"
#include "devices/cpu/rows.h"
#include "devices/math.h"

#define TILE_N 16 /* output columns per micro tile: two AVX2 vectors, one AVX-512 vector */
#define ALL ((int64_t)1 << 40) /* a product's limit that limits nothing */
#ifdef __AVX512F__
/* Output rows per micro tile: 8 AVX-512 accumulators, one row each, as many as two FMA units of
 * four cycles' latency keep busy (and blocks of 64 rows split into whole tiles). */
#define TILE_M 8
typedef float v16 __attribute__((vector_size(64)));
#else
#define TILE_M 6 /* output rows per micro tile: 12 AVX2 accumulators */
#endif

/* C = alpha * A B (add: C += alpha * A B) with A(r, p) = a[r * sar + p * sak] (row-major or
 * transposed alike) and B packed by pack(): `rows` rows in panels of TILE_N columns. */
typedef struct prod {
    const float *a;
    int64_t sar, sak;
    const float *b;
    int64_t rows;
    float *c;
    int64_t ldc;
    float alpha;
    int add;
} prod;

/* Rows [r, r + R) by columns [l, l + nc) of C over depth [p0, p1), summed in order of p. R is a
 * constant after inlining, so a full tile's accumulators stay in registers. */
MW__CPU_INLINE void micro(const prod *x, int R, int64_t r, int64_t l, int nc, int64_t p0,
                          int64_t p1) {
    const float *a = x->a + r * x->sar, *b = x->b + l * x->rows;
    float *c = x->c + r * x->ldc + l;
#ifdef __AVX512F__
    if (nc == TILE_N) { /* the same sums in the same order, a row of the tile per vector */
        v16 acc[TILE_M], b0, y;
        for (int i = 0; i < R; i++) acc[i] = (v16){0};
        for (int64_t p = p0; p < p1; p++) {
            memcpy(&b0, b + p * TILE_N, sizeof b0);
            for (int i = 0; i < R; i++) acc[i] += a[i * x->sar + p * x->sak] * b0;
        }
        for (int i = 0; i < R; i++) {
            if (x->add)
                memcpy(&y, c + i * x->ldc, sizeof y);
            else
                y = (v16){0};
            y += x->alpha * acc[i];
            memcpy(c + i * x->ldc, &y, sizeof y);
        }
        return;
    }
#else
    if (nc == TILE_N) {
        mw__v8 acc[TILE_M][2], b0, b1, y;
        for (int i = 0; i < R; i++) acc[i][0] = acc[i][1] = (mw__v8){0};
        for (int64_t p = p0; p < p1; p++) {
            memcpy(&b0, b + p * TILE_N, sizeof b0);
            memcpy(&b1, b + p * TILE_N + 8, sizeof b1);
            for (int i = 0; i < R; i++) {
                float av = a[i * x->sar + p * x->sak];
                acc[i][0] += av * b0;
                acc[i][1] += av * b1;
            }
        }
        for (int i = 0; i < R; i++)
            for (int h = 0; h < 2; h++) {
                if (x->add)
                    memcpy(&y, c + i * x->ldc + 8 * h, sizeof y);
                else
                    memset(&y, 0, sizeof y);
                y += x->alpha * acc[i][h];
                memcpy(c + i * x->ldc + 8 * h, &y, sizeof y);
            }
        return;
    }
#endif
    float acc[TILE_M][TILE_N] = {{0}};
    for (int64_t p = p0; p < p1; p++) {
        const float *bp = b + p * nc;
        for (int i = 0; i < R; i++) {
            float av = a[i * x->sar + p * x->sak];
            for (int j = 0; j < nc; j++) acc[i][j] += av * bp[j];
        }
    }
    for (int i = 0; i < R; i++)
        for (int j = 0; j < nc; j++)
            c[i * x->ldc + j] =
                x->add ? c[i * x->ldc + j] + x->alpha * acc[i][j] : x->alpha * acc[i][j];
}

static int64_t clamp(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

#ifdef __AVX512F__
/* micro's full tile for the two column tiles l and l + TILE_N at once, the same sums. */
MW__CPU_INLINE void micro2(const prod *x, int R, int64_t r, int64_t l, int64_t p0, int64_t p1) {
    const float *a = x->a + r * x->sar, *b = x->b + l * x->rows, *b2 = b + TILE_N * x->rows;
    float *c = x->c + r * x->ldc + l;
    v16 acc[TILE_M], acc2[TILE_M], b0, b1, y;
    for (int i = 0; i < R; i++) acc[i] = acc2[i] = (v16){0};
    for (int64_t p = p0; p < p1; p++) {
        memcpy(&b0, b + p * TILE_N, sizeof b0);
        memcpy(&b1, b2 + p * TILE_N, sizeof b1);
        for (int i = 0; i < R; i++) {
            float av = a[i * x->sar + p * x->sak];
            acc[i] += av * b0;
            acc2[i] += av * b1;
        }
    }
    for (int i = 0; i < R; i++)
        for (int h = 0; h < 2; h++) {
            float *ci = c + i * x->ldc + h * TILE_N;
            if (x->add)
                memcpy(&y, ci, sizeof y);
            else
                y = (v16){0};
            y += x->alpha * (h ? acc2[i] : acc[i]);
            memcpy(ci, &y, sizeof y);
        }
}
#endif

/* The micro tiles of rows [r, end) of column tile l (nc columns; two: with the tile l + TILE_N,
 * full ones both), each summing the depth [r0 + lo, r0 + R + hi) clamped to [0, kn). */
MW__CPU_INLINE void row_tiles(const prod *x, int64_t r, int64_t end, int64_t l, int nc, int two,
                              int64_t kn, int64_t lo, int64_t hi) {
    (void)two;
    while (r < end) {
        int R = end - r >= TILE_M ? TILE_M : (int)(end - r);
        int64_t p0 = clamp(r + lo, 0, kn), p1 = clamp(r + R + hi, p0, kn);
#ifdef __AVX512F__
        if ((p1 > p0 || !x->add) && two) switch (R) {
            case 8: micro2(x, 8, r, l, p0, p1); break;
            case 7: micro2(x, 7, r, l, p0, p1); break;
            case 6: micro2(x, 6, r, l, p0, p1); break;
            case 5: micro2(x, 5, r, l, p0, p1); break;
            case 4: micro2(x, 4, r, l, p0, p1); break;
            case 3: micro2(x, 3, r, l, p0, p1); break;
            case 2: micro2(x, 2, r, l, p0, p1); break;
            default: micro2(x, 1, r, l, p0, p1); break;
            }
        else
#endif
            if (p1 > p0 || !x->add)
            switch (R) {
#if TILE_M > 6
            case 8: micro(x, 8, r, l, nc, p0, p1); break;
            case 7: micro(x, 7, r, l, nc, p0, p1); break;
#endif
            case 6: micro(x, 6, r, l, nc, p0, p1); break;
            case 5: micro(x, 5, r, l, nc, p0, p1); break;
            case 4: micro(x, 4, r, l, nc, p0, p1); break;
            case 3: micro(x, 3, r, l, nc, p0, p1); break;
            case 2: micro(x, 2, r, l, nc, p0, p1); break;
            default: micro(x, 1, r, l, nc, p0, p1); break;
            }
        r += R;
    }
}

/* C (m x n) = alpha op A B (add: +=). Row r of a micro tile starting at r0 sums the depth
 * [r0 + lo, end + hi) clamped to [0, kn), and column tile l is computed from row l - cols on:
 * the causal products pass the diagonal's offset there (and +-ALL for no limit), so they
 * stop at the diagonal to the nearest micro tile. What a tile computes past a row's diagonal is
 * left for the caller to ignore or overwrite. */
static void product(const prod *x, int64_t m, int64_t n, int64_t kn, int64_t lo, int64_t hi,
                    int64_t cols) {
    int64_t l = 0;
#ifdef __AVX512F__
    /* two column tiles at once: 16 accumulators, each A element read once for both; the rows
     * before the second tile's start take the first tile alone (the diagonal crosses it there) */
    for (; l + 2 * TILE_N <= n; l += 2 * TILE_N) {
        int64_t r = clamp(l - cols, 0, m), both = clamp(l + TILE_N - cols, 0, m);
        row_tiles(x, r, both, l, TILE_N, 0, kn, lo, hi);
        row_tiles(x, both, m, l, TILE_N, 1, kn, lo, hi);
    }
#endif
    for (; l < n; l += TILE_N) {
        int nc = n - l < TILE_N ? (int)(n - l) : TILE_N;
        row_tiles(x, clamp(l - cols, 0, m), m, l, nc, 0, kn, lo, hi);
    }
}

/* Columns of the 8 x 8 block whose rows are r[0..7]: r[k] becomes (r[0][k], ..., r[7][k]), in
 * three rounds of two-input shuffles (unpack, pairs of pairs, 128-bit halves). */
MW__CPU_INLINE void transpose8(mw__v8 r[8]) {
    mw__v8 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < 8; i += 4)
        for (int h = 0; h < 2; h++) {
            u[i + 2 * h] =
                __builtin_shufflevector(t[i + h], t[i + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
            u[i + 2 * h + 1] =
                __builtin_shufflevector(t[i + h], t[i + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        }
    for (int k = 0; k < 4; k++) {
        r[k] = __builtin_shufflevector(u[k], u[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        r[k + 4] = __builtin_shufflevector(u[k], u[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    }
}

/* A full panel of B(p, l) = src[p + l * sl], the transpose of 16 rows of src: 8 x 8 blocks
 * through registers, the rows past a multiple of 8 element by element. */
MW__CPU_INLINE void pack_transposed(const float *src, int64_t sl, int64_t rows, float *panel) {
    int64_t p = 0;
    for (; p + 8 <= rows; p += 8)
        for (int h = 0; h < TILE_N; h += 8) {
            mw__v8 r[8];
            for (int i = 0; i < 8; i++) memcpy(&r[i], src + (h + i) * sl + p, sizeof r[i]);
            transpose8(r);
            for (int k = 0; k < 8; k++) memcpy(panel + (p + k) * TILE_N + h, &r[k], sizeof r[k]);
        }
    for (; p < rows; p++)
        for (int j = 0; j < TILE_N; j++) panel[p * TILE_N + j] = src[p + j * sl];
}

/* dst = B (rows x n, B(p, l) = src[p * sp + l * sl]) in panels of TILE_N columns (the last one
 * narrower), each panel's rows contiguous: a product then reads B sequentially, where the rows of
 * q, k, v (a few KiB apart) would keep evicting each other from the L1 cache. */
static void pack(const float *src, int64_t sp, int64_t sl, int64_t rows, int64_t n, float *dst) {
    for (int64_t l = 0; l < n; l += TILE_N) {
        int64_t nc = n - l < TILE_N ? n - l : TILE_N;
        float *panel = dst + l * rows;
        if (sl == 1 && nc == TILE_N) /* a constant size: the copy inlines */
            for (int64_t p = 0; p < rows; p++)
                memcpy(panel + p * TILE_N, src + p * sp + l, TILE_N * sizeof(float));
        else if (sp == 1 && nc == TILE_N)
            pack_transposed(src + l * sl, sl, rows, panel);
        else if (sl == 1)
            for (int64_t p = 0; p < rows; p++)
                memcpy(panel + p * nc, src + p * sp + l, (size_t)nc * sizeof(float));
        else /* a panel row gathers from nc source rows: their cache misses overlap */
            for (int64_t p = 0; p < rows; p++)
                for (int64_t j = 0; j < nc; j++) panel[p * nc + j] = src[p * sp + (l + j) * sl];
    }
}

/* One (batch, key/value head) slice in f32: the group's first query q (query g, then the key and
 * the value `part` floats apart each: query g at q + g part, the key at q + G part, the value at
 * q + (G + 1) part), positions `seq` apart; the output positions (out or, backward, gy) `seq_out`
 * apart, query g's `out_group` after query 0's. Where the kernel's q, k, v or output are bf16,
 * these point at f32 copies of the slice in the scratch (stage_slice). */
typedef struct slice {
    const float *q;
    int64_t seq, part;
    float *out;
    const float *gy;
    int64_t seq_out, out_group;
} slice;

/* The slice's key and value (G = mw__attn_group(k) queries before them). */
static const float *slice_key(const mw__k_attention *k, const slice *v) {
    return v->q + mw__attn_group(k) * v->part;
}
static const float *slice_value(const mw__k_attention *k, const slice *v) {
    return v->q + (mw__attn_group(k) + 1) * v->part;
}

/* Keys the queries of the block [i0, i0 + m) may see. */
static int64_t block_keys(const mw__k_attention *k, int64_t i0, int64_t m) {
    return k->causal ? i0 + m : k->t;
}

/* P (m x kend, row stride kend) = softmax of scale * q k^T (kt = k^T packed) over the keys each row
 * may see; the masked entries of the block's last columns are 0. */
static void block_probs(const mw__k_attention *k, const slice *v, const float *kt, int64_t i0,
                        int64_t m, int64_t kend, float *p) {
    prod x = {.a = v->q + i0 * v->seq,
              .sar = v->seq,
              .sak = 1,
              .b = kt,
              .rows = k->d,
              .c = p,
              .ldc = kend,
              .alpha = k->scale};
    product(&x, m, kend, k->d, -ALL, ALL, k->causal ? i0 : ALL);
    for (int64_t r = 0; r < m; r++) {
        float *row = p + r * kend;
        int64_t n = k->causal ? i0 + r + 1 : kend;
        mw__row_softmax(row, row, n, 1.0f);
        for (int64_t j = n; j < kend; j++) row[j] = 0.0f;
    }
}

/* Depth limits (product's lo and hi) of a product whose rows are the block's queries and whose
 * depth is the keys (causal: row r stops at key i0 + r), or the other way round (causal: key row
 * j starts at query j - i0). */
static int64_t keys_hi(const mw__k_attention *k, int64_t i0) { return k->causal ? i0 : ALL; }
static int64_t queries_lo(const mw__k_attention *k, int64_t i0) { return k->causal ? -i0 : -ALL; }

/* The packed operands lie at the end of the scratch: forward k^T and v (2 d x t floats),
 * backward k^T, v^T, k (3 d x t) and a block's q and dO (2 block x d). */
static float *packed(const mw__k_attention *k, int grad) {
    int64_t n = grad ? 3 * k->d * k->t + 2 * k->block * k->d : 2 * k->d * k->t;
    return k->scratch + k->scratch_elems - n;
}

/* Rotary embeddings applied as a slice is staged (rotary_attention): the rotation, the angles of
 * each position (the device's table: cos, sin and the sine negated, 3 x half floats apart), for
 * the f32 tiles the slice's f32 copy (queries and key rotated, value copied; each rounded to bf16
 * where the products read bf16), and a row of d floats to rotate through. */
typedef struct rotation {
    mw__k_rope rot;
    const float *angles;
    int64_t half;
    float *slice, *row;
    int round;
} rotation;

/* n f32 rounded to bf16 in place (bf16 values as f32: what widening them gives), through tmp. */
static void round_bf16(float *x, int64_t n, uint16_t *tmp) {
    mw__bf16_narrow(n, x, tmp);
    mw__bf16_widen(n, tmp, x);
}

/* The slice at x (f32, rows seq_qkv apart, parts `part` apart) rotated into dst, compact
 * (positions d apart, parts t x d apart): its queries and key rotated, its value copied; dst is
 * bf16 where bf16 is set, else f32 (rounded to bf16 values where r->round is). A position's parts
 * at a time: where they lie together (a fused qkv's [.., Part, HeadDim]) the reads run through
 * memory in order, as far as the slice allows. */
static void rotate_slice(const mw__k_attention *k, const rotation *r, const float *x, void *dst,
                         int bf16) {
    const int64_t t = k->t, d = k->d, parts = mw__attn_group(k) + 2;
    for (int64_t i = 0; i < t; i++)
        for (int64_t p = 0; p < parts; p++) {
            const float *row = x + p * k->part + i * k->seq_qkv, *c = r->angles + i * 3 * r->half;
            int64_t o = (p * t + i) * d;
            if (p == parts - 1 && bf16) /* the value, copied */
                mw__bf16_narrow(d, row, (uint16_t *)dst + o);
            else if (p == parts - 1)
                memcpy((float *)dst + o, row, (size_t)d * sizeof *row);
            else if (bf16)
                mw__rope_row(&r->rot, row, dst, o, c, c + r->half, 1);
            else
                mw__rope_row(&r->rot, row, dst, o, c, c + r->half, 0);
            if (r->round && !bf16) round_bf16((float *)dst + o, d, (uint16_t *)r->row);
        }
}

/* Backward: a slice's d(qkv) from `from` (rows seq apart, parts `part` apart) into dx, laid out
 * like qkv, its queries' and key's rows rotated back (the gradient of the projection); the
 * value's rows copied where value is set. from may be dx itself: its rows go through r->row. */
static void rotate_back(const mw__k_attention *k, const rotation *r, const float *from, int64_t seq,
                        int64_t part, float *dx, int value) {
    const int64_t t = k->t, d = k->d, parts = mw__attn_group(k) + 1 + (value != 0);
    for (int64_t i = 0; i < t; i++)
        for (int64_t p = 0; p < parts; p++) {
            const float *src = from + p * part + i * seq, *c = r->angles + i * 3 * r->half;
            float *to = dx + p * k->part + i * k->seq_qkv;
            if (value && p == parts - 1) {
                memcpy(to, src, (size_t)d * sizeof *src);
                continue;
            }
            if (src == to) src = memcpy(r->row, src, (size_t)d * sizeof *src);
            mw__rope_row(&r->rot, src, to, 0, c, c + 2 * r->half, 0);
        }
}

/* Slice s as f32: in place where the kernel's operands are f32, else the group's queries, k and
 * v widened into the scratch at stage ((G + 2) x t x d: the queries, then k, then v; positions d
 * apart) and, forward, the output of one query made there (after them, t x d) and rounded into
 * out by finish_query; with a rotation (rot), the rotated slice it makes instead of either. */
static void stage_slice(const mw__k_attention *k, int64_t s, int grad, float *stage,
                        const rotation *rot, slice *v) {
    int64_t oo, oq, t = k->t, d = k->d;
    mw__attn_slice_offsets(&k->walk, s, &oo, &oq);
    if (rot) {
        rotate_slice(k, rot, (const float *)k->qkv + oq, rot->slice, 0);
        v->q = rot->slice, v->seq = d, v->part = t * d;
    } else if (k->qkv_dtype == MW_BF16) {
        const uint16_t *q = (const uint16_t *)k->qkv + oq;
        for (int64_t p = 0; p < mw__attn_group(k) + 2; p++)
            mw__bf16_widen_rows(t, d, q + p * k->part, k->seq_qkv, stage + p * t * d, d);
        v->q = stage, v->seq = d, v->part = t * d;
        stage += (mw__attn_group(k) + 2) * t * d;
    } else {
        v->q = (const float *)k->qkv + oq, v->seq = k->seq_qkv, v->part = k->part;
    }
    v->seq_out = k->seq_out;
    v->out_group = k->out_group;
    v->gy = grad ? k->gy + oo : NULL;
    if (grad) /* d(qkv): f32, laid out like qkv */
        v->out = (float *)k->out + oq;
    else if (k->out_dtype == MW_BF16)
        v->out = stage, v->seq_out = d, v->out_group = 0; /* one query's at a time */
    else
        v->out = (float *)k->out + oo;
}

/* Forward: the output of query g of slice s from its staged f32 copy, rounded to bf16. */
static void finish_query(const mw__k_attention *k, int64_t s, int64_t g, const slice *v) {
    if (k->out_dtype != MW_BF16) return;
    int64_t oo, oq;
    mw__attn_slice_offsets(&k->walk, s, &oo, &oq);
    mw__bf16_narrow_rows(k->t, k->d, v->out, v->seq_out, (uint16_t *)k->out + oo + g * k->out_group,
                         k->seq_out);
}

/* --- rotary embeddings as q and k are read (k->rope.dims set) ------------------------------ */

static mw_status rotary_attention(mw__device *dev, const mw__k_attention *k, int grad);

/* The f32 tiles' forward pass, the slices rotated as they are staged where rot is given. */
static void attention_tiles(const mw__k_attention *k, const rotation *rot) {
    int64_t ns = k->slices, blk = k->block, t = k->t, d = k->d;
    float *kt = packed(k, 0), *vp = kt + d * t;
    for (int64_t s = 0; s < ns; s++) {
        slice v;
        stage_slice(k, s, 0, k->scratch + blk * t, rot, &v);
        /* k and v packed once for the group's queries */
        pack(slice_key(k, &v), 1, v.seq, d, t, kt);
        pack(slice_value(k, &v), v.seq, 1, t, d, vp);
        for (int64_t g = 0; g < mw__attn_group(k); g++) {
            slice w = v;
            w.q = v.q + g * v.part;
            w.out = v.out + g * v.out_group;
            float *keep = mw__attn_kept(k, s, g);
            for (int64_t i0 = 0; i0 < t; i0 += blk) {
                int64_t m = t - i0 < blk ? t - i0 : blk, kend = block_keys(k, i0, m);
                float *p = keep ? keep : k->scratch;
                if (keep) keep += m * kend;
                block_probs(k, &w, kt, i0, m, kend, p);
                /* O = P V */
                prod o = {.a = p,
                          .sar = kend,
                          .sak = 1,
                          .b = vp,
                          .rows = t,
                          .c = w.out + i0 * w.seq_out,
                          .ldc = w.seq_out,
                          .alpha = 1.0f};
                product(&o, m, d, kend, -ALL, keys_hi(k, i0), ALL);
            }
            finish_query(k, s, g, &w);
        }
    }
}

mw_status MW__CPU(mw__cpu_attention)(mw__device *dev, const mw__k_attention *k) {
    if (k->rope.dims) return rotary_attention(dev, k, 0);
#ifdef MESHWIT_HAVE_DNNL
    if (k->impl) return MW__CPU(mw__cpu_attention_dnnl)(dev, k, 0);
#endif
    (void)dev;
    attention_tiles(k, NULL);
    return MW_OK;
}

/* dP (in place) -> dS / scale = P * (dP - D) row by row, 0 where masked. */
static void block_dscores(const mw__k_attention *k, const float *p, float *dp, int64_t i0,
                          int64_t m, int64_t kend) {
    for (int64_t r = 0; r < m; r++) {
        const float *pr = p + r * kend;
        float *dr = dp + r * kend;
        int64_t n = k->causal ? i0 + r + 1 : kend;
        float dsum = mw__row_dot(pr, dr, n);
        for (int64_t j = 0; j < n; j++) dr[j] = pr[j] * (dr[j] - dsum);
        for (int64_t j = n; j < kend; j++) dr[j] = 0.0f;
    }
}

/* dK or dV of the block [i0, i0 + m): C (kend x d) += A B over the block's queries, where rows
 * [0, fresh) of C hold earlier blocks' sums and rows [fresh, kend) are met for the first time and
 * are written instead (so that C needs no zeroing first). Tiles that start at fresh rather than
 * at a multiple of TILE_M only add terms that are exactly 0 (masked scores): the same sums. */
static void key_grad(const prod *x, const mw__k_attention *k, int64_t i0, int64_t m, int64_t kend,
                     int later) {
    /* later: a group's later query adds to what its first ones wrote (every row is met) */
    int64_t fresh = later ? kend : k->causal ? i0 : i0 == 0 ? 0 : kend;
    for (int part = 0; part < 2; part++) {
        int64_t r0 = part ? fresh : 0, r1 = part ? kend : fresh;
        if (r1 <= r0) continue;
        prod y = *x;
        y.a += r0 * y.sar;
        y.c += r0 * y.ldc;
        y.add = !part;
        product(&y, r1 - r0, k->d, m, queries_lo(k, i0) + r0, ALL, ALL);
    }
}

/* The f32 tiles' backward pass, the slices rotated as they are staged and their d(qkv) rotated
 * back where rot is given. */
static void attention_grad_tiles(const mw__k_attention *k, const rotation *rot) {
    int64_t ns = k->slices, blk = k->block, d = k->d, t = k->t;
    float *scores = k->scratch, *dp = k->scratch + blk * t, *kt = packed(k, 1), *vt = kt + d * t,
          *kp = vt + d * t, *qb = kp + t * d, *gb = qb + blk * d;
    float *stage = k->scratch + 2 * blk * t + 2 * ns * mw__attn_group(k) * t;
    for (int64_t s = 0; s < ns; s++) {
        slice v;
        stage_slice(k, s, 1, stage, rot, &v);
        int64_t seq = v.seq, seq_out = v.seq_out;
        const float *kk = slice_key(k, &v), *vv = slice_value(k, &v);
        float *dk = v.out + mw__attn_group(k) * k->part,
              *dv = v.out + (mw__attn_group(k) + 1) * k->part;
        if (!k->probs) pack(kk, 1, seq, d, t, kt);
        pack(vv, 1, seq, d, t, vt);
        pack(kk, seq, 1, t, d, kp);
        for (int64_t g = 0; g < mw__attn_group(k); g++) {
            const float *q = v.q + g * v.part, *gy = v.gy + g * v.out_group;
            float *dq = v.out + g * k->part;
            const float *keep = mw__attn_kept(k, s, g);
            slice w = v;
            w.q = q;
            for (int64_t i0 = 0; i0 < t; i0 += blk) {
                int64_t m = t - i0 < blk ? t - i0 : blk, kend = block_keys(k, i0, m);
                const float *p = keep ? keep : scores;
                if (keep)
                    keep += m * kend;
                else
                    block_probs(k, &w, kt, i0, m, kend, scores);
                /* dP = dO V^T */
                prod x = {.a = gy + i0 * seq_out, .sar = seq_out, .sak = 1, .b = vt, .rows = d};
                x.c = dp, x.ldc = kend, x.alpha = 1.0f;
                product(&x, m, kend, d, -ALL, ALL, k->causal ? i0 : ALL);
                block_dscores(k, p, dp, i0, m, kend);
                /* dQ = scale dS K; dK += scale dS^T Q; dV += P^T dO (written where first met) */
                x = (prod){.a = dp, .sar = kend, .sak = 1, .b = kp, .rows = t};
                x.c = dq + i0 * k->seq_qkv, x.ldc = k->seq_qkv, x.alpha = k->scale;
                product(&x, m, d, kend, -ALL, keys_hi(k, i0), ALL);
                pack(q + i0 * seq, seq, 1, m, d, qb);
                x = (prod){.a = dp, .sar = 1, .sak = kend, .b = qb, .rows = m};
                x.c = dk, x.ldc = k->seq_qkv, x.alpha = k->scale;
                key_grad(&x, k, i0, m, kend, g > 0);
                pack(gy + i0 * seq_out, seq_out, 1, m, d, gb);
                x = (prod){.a = p, .sar = 1, .sak = kend, .b = gb, .rows = m};
                x.c = dv, x.ldc = k->seq_qkv, x.alpha = 1.0f;
                key_grad(&x, k, i0, m, kend, g > 0);
            }
        }
        if (rot) rotate_back(k, rot, v.out, k->seq_qkv, k->part, v.out, 0);
    }
}

mw_status MW__CPU(mw__cpu_attention_grad)(mw__device *dev, const mw__k_attention *k) {
#ifdef MESHWIT_HAVE_DNNL
    if (k->impl && !k->rope.dims) return MW__CPU(mw__cpu_attention_dnnl)(dev, k, 1);
#endif
    if (k->out_dtype != MW_F32)
        return mw__error(MW_ERR_UNSUPPORTED, "attention gradient: d(qkv) is written in f32 only");
    if (k->rope.dims) return rotary_attention(dev, k, 1);
    attention_grad_tiles(k, NULL);
    return MW_OK;
}

/* The angles are the rope kernel's (the device's table, rope_angles.h; mw__rope_row rotates): the
 * same bits as a rope pass of its own. On the f32 tiles (no prepared kernel), each slice is
 * rotated straight into the f32 copy the tiles read (rounded to bf16 where qkv is bf16: what
 * widening a rope's bf16 output gives), and d(qkv) rotated back where the tiles wrote it. A
 * prepared kernel (oneDNN's products, the dot-product tiles) runs per slice on a compact rotated
 * slice in qkv_dtype (mw__attn_rotary_inner, the layout it was prepared for), and, backward, its
 * compact d(qkv) is rotated back into out. */
static mw_status rotary_attention(mw__device *dev, const mw__k_attention *k, int grad) {
    const int64_t t = k->t, d = k->d, half = k->rope.dims / 2;
    const int bf16 = k->qkv_dtype == MW_BF16;
    int64_t off[4];
    mw__attn_rotary_layout(k, grad, off);
    float *dqkv = k->scratch + off[2];
    void *stage = k->scratch + off[1];
    rotation r = {
        .rot = {.n = d, .dims = k->rope.dims, .style = k->rope.style, .freqs = k->rope.freqs},
        .half = half,
        .slice = stage,
        .row = k->scratch + off[0] + 3 * half * t,
        .round = bf16};
    r.angles = mw__cpu_rope_table(dev, &r.rot, k->rope.offset, t, k->scratch + off[0]);
    if (!k->impl) {
        mw__k_attention tiles = *k, sized;
        tiles.rope.dims = 0;
        tiles.qkv_dtype = MW_F32; /* the rotated slice */
        sized = mw__attn_rotary_inner(&tiles);
        tiles.scratch = k->scratch + off[3];
        tiles.scratch_elems = mw__attn_scratch_elems(&sized, grad);
        if (grad)
            attention_grad_tiles(&tiles, &r);
        else
            attention_tiles(&tiles, &r);
        return MW_OK;
    }
    mw__k_attention in = mw__attn_rotary_inner(k);
    in.impl = k->impl;
    in.qkv = stage;
    in.scratch = k->scratch + off[3];
    in.scratch_elems = mw__attn_scratch_elems(&in, grad);
    for (int64_t s = 0; s < k->slices; s++) {
        int64_t oo, oq;
        mw__attn_slice_offsets(&k->walk, s, &oo, &oq);
        rotate_slice(k, &r, (const float *)k->qkv + oq, stage, bf16);
        in.probs = mw__attn_kept(k, s, 0);
        mw_status st;
        if (grad) {
            in.gy = k->gy + oo;
            in.out = dqkv;
            st = MW__CPU(mw__cpu_attention_grad)(dev, &in);
        } else {
            in.out = (char *)k->out + oo * (k->out_dtype == MW_BF16 ? 2 : 4);
            st = MW__CPU(mw__cpu_attention)(dev, &in);
        }
        if (st) return st;
        if (grad) rotate_back(k, &r, dqkv, d, t * d, (float *)k->out + oq, 1);
    }
    return MW_OK;
}

/* Per row and head, the query against keys 0..pos in key order with a running maximum (the
 * output row holds the weighted sum of values as it grows), f32 throughout. */
mw_status MW__CPU(mw__cpu_attention_cached)(mw__device *dev, const mw__k_attention_cached *k) {
    mw_status st = MW__CPU(mw__cpu_positions_ok)(dev, k->pos, k->outer, k->n, "cached attention");
    if (st) return st;
    const int64_t H = k->heads, D = k->dim, row = 2 * H * D; /* one key position: keys, values */
    const int64_t G = k->group > 0 ? k->group : 1;           /* queries per key/value head */
    for (int64_t o = 0; o < k->outer; o++)
        for (int64_t hq = 0; hq < H * G; hq++) {
            int64_t h = hq / G;
            const float *q = k->q + (o * H * G + hq) * D, *kv = k->kv + o * k->n * row + h * D;
            float *acc = k->out + (o * H * G + hq) * D, m = -INFINITY, l = 0.0f;
            memset(acc, 0, (size_t)D * sizeof *acc);
            for (int64_t j = 0; j <= k->pos[o]; j++) {
                const float *key = kv + j * row, *val = key + H * D;
                float s = 0.0f;
                for (int64_t d = 0; d < D; d++) s += q[d] * key[d];
                s *= k->scale;
                if (s > m) { /* a new maximum: what is summed so far shrinks by e^(m - s) */
                    float c = mw__expf(m - s);
                    l *= c;
                    for (int64_t d = 0; d < D; d++) acc[d] *= c;
                    m = s;
                }
                float e = mw__expf(s - m);
                l += e;
                for (int64_t d = 0; d < D; d++) acc[d] += e * val[d];
            }
            float inv = 1.0f / l;
            for (int64_t d = 0; d < D; d++) acc[d] *= inv;
        }
    return MW_OK;
}

const char *MW__CPU(mw__cpu_attention_impl)(const mw__k_attention *k) {
    static const char *const names[2][3] = {
        {"f32 tiles (avx512)", "f32 tiles (avx2)", "f32 tiles (sse2)"},
        {"f32 tiles (avx512) of bf16 widened", "f32 tiles (avx2) of bf16 widened",
         "f32 tiles (sse2) of bf16 widened"}};
#ifdef MESHWIT_HAVE_DNNL
    if (k->impl) return MW__CPU(mw__cpu_attention_dnnl_name)(k);
#endif
    const char *isa = mw__cpu_vector_isa();
    int v = !strcmp(isa, "avx512") ? 0 : !strcmp(isa, "avx2") ? 1 : 2;
    return names[k->qkv_dtype == MW_BF16][v];
}
