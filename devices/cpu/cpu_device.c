/* The CPU backend: host memory, oneDNN or OpenBLAS for contractions (cpu_gemm.c), plain C loops
 * (written so the compiler vectorises the contiguous cases) for everything else. Each virtual CPU
 * device is one worker thread; BLAS and oneDNN run single-threaded inside it (the trainer sets
 * OpenBLAS's thread count; oneDNN's is set around each primitive). */
#define _GNU_SOURCE /* sched_setaffinity */
#include <cblas.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "devices/cpu/cpu.h"
#include "devices/cpu/cpu_gemm.h"
#include "devices/cpu/cpu_nn.h"
#include "devices/cpu/cpu_ops_extra.h"
#include "devices/cpu/simd.h"
#include "devices/device.h"
#include "devices/math.h"

/* Pins the calling worker to the index-th CPU this process may use, when there are at least as
 * many such CPUs as there are devices (oversubscribed devices are left to the scheduler). */
static void pin_to_core(int index, int ndevices) {
    cpu_set_t allowed, one;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
    int count = CPU_COUNT(&allowed);
    if (count < ndevices || count < 2) return;
    for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &allowed)) continue;
        if (seen++ == index % count) {
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);
            sched_setaffinity(0, sizeof one,
                              &one); /* best effort: an unpinned worker still works */
            return;
        }
    }
}

static mw_status cpu_init(mw__device *dev) {
    if (dev->pin > 0) pin_to_core(dev->index, dev->pin);
    return mw__cpu_state_init(dev);
}

static void cpu_shutdown(mw__device *dev) { mw__cpu_state_free(dev); }

static mw_status cpu_alloc(mw__device *dev, size_t bytes, void **out) {
    size_t n = (bytes + 63) / 64 * 64;
    *out = n ? mw__aligned_alloc(64, n) : NULL;
    if (n && !*out)
        return mw__error(MW_ERR_NOMEM, "%s: out of memory allocating %zu bytes", dev->name, n);
    return MW_OK;
}

static void cpu_free(mw__device *dev, void *p) {
    (void)dev;
    mw__free(p);
}

static mw_status cpu_memcpy(mw__device *dev, void *dst, const void *src, size_t bytes) {
    (void)dev;
    if (bytes) memcpy(dst, src, bytes);
    return MW_OK;
}

static mw_status cpu_sync(mw__device *dev) {
    (void)dev;
    return MW_OK;
}

/* Walks every index of nd but the last dim, calling body(o0, o1, o2) with the element offsets of
 * each operand at the start of an innermost row. */
#define ND_ROWS(nd, nops, body)                                                                    \
    do {                                                                                           \
        int r_ = (nd)->rank;                                                                       \
        int64_t idx_[MW__ND_MAX] = {0};                                                            \
        int64_t o_[3] = {0, 0, 0};                                                                 \
        for (;;) {                                                                                 \
            int64_t o0 = o_[0], o1 = o_[1], o2 = o_[2];                                            \
            (void)o0, (void)o1, (void)o2;                                                          \
            body;                                                                                  \
            int d_ = r_ - 2;                                                                       \
            while (d_ >= 0) {                                                                      \
                for (int k_ = 0; k_ < (nops); k_++) o_[k_] += (nd)->stride[k_][d_];                \
                if (++idx_[d_] < (nd)->dims[d_]) break;                                            \
                for (int k_ = 0; k_ < (nops); k_++)                                                \
                    o_[k_] -= (nd)->stride[k_][d_] * (nd)->dims[d_];                               \
                idx_[d_] = 0;                                                                      \
                d_--;                                                                              \
            }                                                                                      \
            if (d_ < 0) break;                                                                     \
        }                                                                                          \
    } while (0)

static inline float apply(mw__binop op, float a, float b) {
    switch (op) {
    case MW__BIN_ADD: return a + b;
    case MW__BIN_SUB: return a - b;
    case MW__BIN_MUL: return a * b;
    case MW__BIN_DIV: return a / b;
    }
    return 0.0f;
}

/* One innermost row of a binary op; the common stride patterns get loops the compiler vectorises.
 */
#define BIN_ROW(OPEXPR)                                                                            \
    do {                                                                                           \
        if (sa == 1 && sb == 1)                                                                    \
            for (int64_t i = 0; i < n; i++) {                                                      \
                float x = a[i], y = b[i];                                                          \
                out[i] = OPEXPR;                                                                   \
            }                                                                                      \
        else if (sa == 1 && sb == 0) {                                                             \
            float y = b[0];                                                                        \
            for (int64_t i = 0; i < n; i++) {                                                      \
                float x = a[i];                                                                    \
                out[i] = OPEXPR;                                                                   \
            }                                                                                      \
        } else if (sa == 0 && sb == 1) {                                                           \
            float x = a[0];                                                                        \
            for (int64_t i = 0; i < n; i++) {                                                      \
                float y = b[i];                                                                    \
                out[i] = OPEXPR;                                                                   \
            }                                                                                      \
        } else                                                                                     \
            for (int64_t i = 0; i < n; i++) {                                                      \
                float x = a[i * sa], y = b[i * sb];                                                \
                out[i * so] = OPEXPR;                                                              \
            }                                                                                      \
    } while (0)

static void binary_row(mw__binop op, int64_t n, float *restrict out, int64_t so,
                       const float *restrict a, int64_t sa, const float *restrict b, int64_t sb) {
    if (so != 1) {
        for (int64_t i = 0; i < n; i++) out[i * so] = apply(op, a[i * sa], b[i * sb]);
        return;
    }
    switch (op) {
    case MW__BIN_ADD: BIN_ROW(x + y); break;
    case MW__BIN_SUB: BIN_ROW(x - y); break;
    case MW__BIN_MUL: BIN_ROW(x * y); break;
    case MW__BIN_DIV: BIN_ROW(x / y); break;
    }
}

static mw_status cpu_binary(mw__device *dev, const mw__k_binary *k) {
    (void)dev;
    const mw__nd *nd = &k->nd;
    if (nd->rank == 0) {
        k->out[0] = apply(k->op, k->a[0], k->b[0]);
        return MW_OK;
    }
    int l = nd->rank - 1;
    ND_ROWS(nd, 3,
            binary_row(k->op, nd->dims[l], k->out + o0, nd->stride[0][l], k->a + o1,
                       nd->stride[1][l], k->b + o2, nd->stride[2][l]));
    return MW_OK;
}

static void copy_row(float alpha, int64_t n, float *restrict out, int64_t so,
                     const float *restrict a, int64_t sa) {
    if (so == 1 && sa == 1 && alpha == 1.0f)
        memcpy(out, a, (size_t)n * sizeof *out);
    else if (so == 1 && sa == 1)
        for (int64_t i = 0; i < n; i++) out[i] = alpha * a[i];
    else if (so == 1 && sa == 0) {
        float v = alpha * a[0];
        for (int64_t i = 0; i < n; i++) out[i] = v;
    } else
        for (int64_t i = 0; i < n; i++) out[i * so] = alpha * a[i * sa];
}

/* f32 -> bf16: alpha * a, rounded. */
MW__CPU_CLONES
static void narrow_row(float alpha, int64_t n, uint16_t *restrict out, int64_t so,
                       const float *restrict a, int64_t sa) {
    int64_t i = 0;
    if (so == 1 && sa == 1)
        for (; i + 8 <= n; i += 8) {
            mw__v8 x;
            memcpy(&x, a + i, sizeof x);
            x *= alpha;
            mw__bf16_store8(out + i, &x);
        }
    for (; i < n; i++) out[i * so] = mw__bf16_from_f32(alpha * a[i * sa]);
}

/* bf16 -> f32 (alpha * a, exact for alpha 1), or bf16 -> bf16 (widen, scale, round). */
MW__CPU_CLONES
static void widen_row(float alpha, int64_t n, void *restrict out, int to_bf16, int64_t so,
                      const uint16_t *restrict a, int64_t sa) {
    uint16_t *o16 = out;
    float *o32 = out;
    int64_t i = 0;
    if (!to_bf16 && so == 1 && sa == 1)
        for (; i + 8 <= n; i += 8) {
            mw__v8 x;
            mw__bf16_load8(&x, a + i);
            x *= alpha;
            memcpy(o32 + i, &x, sizeof x);
        }
    if (to_bf16 && alpha == 1.0f)
        for (; i < n; i++) o16[i * so] = a[i * sa];
    for (; i < n; i++) {
        float v = alpha * mw__bf16_to_f32(a[i * sa]);
        if (to_bf16)
            o16[i * so] = mw__bf16_from_f32(v);
        else
            o32[i * so] = v;
    }
}

/* 4-byte elements moved as they are (i32 ids). */
static void move_row(int64_t n, uint32_t *restrict out, int64_t so, const uint32_t *restrict a,
                     int64_t sa) {
    for (int64_t i = 0; i < n; i++) out[i * so] = a[i * sa];
}

static mw_status cpu_copy(mw__device *dev, const mw__k_copy *k) {
    (void)dev;
    const mw__nd *nd = &k->nd;
    int l = nd->rank - 1;
    int64_t n = nd->rank ? nd->dims[l] : 1, so = nd->rank ? nd->stride[0][l] : 0,
            sa = nd->rank ? nd->stride[1][l] : 0;
    mw__nd one = {.rank = 1, .dims = {1}};
    if (nd->rank == 0) nd = &one; /* a single element: one row of one */
    l = nd->rank - 1;
    if (k->a_dtype == MW_I32 || k->out_dtype == MW_I32) {
        if (k->a_dtype != k->out_dtype || k->alpha != 1.0f)
            return mw__error(MW_ERR_DTYPE, "copy: i32 elements only move as they are");
        ND_ROWS(nd, 2, move_row(n, (uint32_t *)k->out + o0, so, (const uint32_t *)k->a + o1, sa));
    } else if (k->a_dtype == MW_F32 && k->out_dtype == MW_F32) {
        ND_ROWS(nd, 2,
                copy_row(k->alpha, n, (float *)k->out + o0, so, (const float *)k->a + o1, sa));
    } else if (k->a_dtype == MW_F32) {
        ND_ROWS(nd, 2,
                narrow_row(k->alpha, n, (uint16_t *)k->out + o0, so, (const float *)k->a + o1, sa));
    } else {
        int to16 = k->out_dtype == MW_BF16;
        ND_ROWS(nd, 2,
                widen_row(k->alpha, n, (char *)k->out + o0 * (to16 ? 2 : 4), to16, so,
                          (const uint16_t *)k->a + o1, sa));
    }
    return MW_OK;
}

/* Sum of a row in a fixed order: eight interleaved partial sums, then combined pairwise. The
 * order depends only on n, so results are repeatable. */
static float sum_row(int64_t n, const float *restrict a, int64_t sa) {
    if (sa != 1) {
        float s = 0.0f;
        for (int64_t i = 0; i < n; i++) s += a[i * sa];
        return s;
    }
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += a[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

#define COLSUM_ROWS 32 /* rows per pass: 32 rows of up to 1024 floats stay in the L2 cache */
#define COLSUM_VECS 8  /* a strip of 64 columns, summed in registers */

/* out[j] += a[r * lda + j] for r < rows, j < n, each column summed over the rows in order (the
 * order of the row-by-row loop, so the bits are the same). The rows are taken COLSUM_ROWS at a
 * time and, within them, a strip of columns stays in registers over all the rows: out is loaded
 * and stored once per strip and pass instead of once per row. */
MW__CPU_CLONES
static void column_sums(int64_t rows, int64_t n, int64_t lda, const float *restrict a,
                        float *restrict out) {
    for (int64_t r0 = 0; r0 < rows; r0 += COLSUM_ROWS) {
        int64_t r1 = rows - r0 < COLSUM_ROWS ? rows : r0 + COLSUM_ROWS, j = 0;
        for (; j + 8 * COLSUM_VECS <= n; j += 8 * COLSUM_VECS) {
            mw__v8 acc[COLSUM_VECS], v;
            memcpy(acc, out + j, sizeof acc);
            for (int64_t r = r0; r < r1; r++)
                for (int h = 0; h < COLSUM_VECS; h++) {
                    memcpy(&v, a + r * lda + j + 8 * h, sizeof v);
                    acc[h] += v;
                }
            memcpy(out + j, acc, sizeof acc);
        }
        for (; j + 8 <= n; j += 8) {
            mw__v8 acc, v;
            memcpy(&acc, out + j, sizeof acc);
            for (int64_t r = r0; r < r1; r++) {
                memcpy(&v, a + r * lda + j, sizeof v);
                acc += v;
            }
            memcpy(out + j, &acc, sizeof acc);
        }
        for (; j < n; j++)
            for (int64_t r = r0; r < r1; r++) out[j] += a[r * lda + j];
    }
}

static mw_status cpu_reduce(mw__device *dev, const mw__k_reduce *k) {
    (void)dev;
    const mw__nd *nd = &k->nd;
    memset(k->out, 0, (size_t)k->out_count * sizeof *k->out);
    if (nd->rank == 0) {
        k->out[0] = k->a[0];
    } else {
        int l = nd->rank - 1;
        int64_t n = nd->dims[l], so = nd->stride[0][l], sa = nd->stride[1][l];
        if (nd->rank == 2 && so == 1 && sa == 1 && nd->stride[0][0] == 0)
            column_sums(nd->dims[0], n, nd->stride[1][0], k->a, k->out);
        else
            ND_ROWS(nd, 2, {
                float *restrict out = k->out + o0;
                const float *restrict a = k->a + o1;
                if (so == 0)
                    out[0] += sum_row(n, a, sa);
                else if (so == 1 && sa == 1)
                    for (int64_t i = 0; i < n; i++) out[i] += a[i];
                else
                    for (int64_t i = 0; i < n; i++) out[i * so] += a[i * sa];
            });
    }
    if (k->alpha != 1.0f)
        for (int64_t i = 0; i < k->out_count; i++) k->out[i] *= k->alpha;
    return MW_OK;
}

static mw_status cpu_fill(mw__device *dev, const mw__k_fill *k) {
    (void)dev;
    for (int64_t i = 0; i < k->count; i++) k->out[i] = k->value;
    return MW_OK;
}

static mw_status cpu_sgd(mw__device *dev, const mw__k_sgd *k) {
    (void)dev;
    float *restrict p = k->p;
    const float *restrict g = k->g;
    for (int64_t i = 0; i < k->count; i++) p[i] -= k->lr * g[i];
    if (k->p16) narrow_row(1.0f, k->count, k->p16, 1, p, 1);
    return MW_OK;
}

const mw__device_vtable mw__cpu_device = {
    .kind = "cpu",
    .host_memory = 1,
    .init = cpu_init,
    .shutdown = cpu_shutdown,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_memcpy,
    .download = cpu_memcpy,
    .sync = cpu_sync,
    .binary = cpu_binary,
    .copy = cpu_copy,
    .reduce = cpu_reduce,
    .gemm = mw__cpu_gemm,
    .gemm_prepare = mw__cpu_gemm_prepare,
    .fill = cpu_fill,
    .sgd = cpu_sgd,
    .unary = mw__cpu_unary,
    .unary_grad = mw__cpu_unary_grad,
    .layernorm = mw__cpu_layernorm,
    .layernorm_dx = mw__cpu_layernorm_dx,
    .layernorm_dw = mw__cpu_layernorm_dw,
    .softmax = mw__cpu_softmax,
    .softmax_grad = mw__cpu_softmax_grad,
    .embed = mw__cpu_embed,
    .embed_grad = mw__cpu_embed_grad,
    .xent = mw__cpu_xent,
    .xent_grad = mw__cpu_xent_grad,
    .sumsq = mw__cpu_sumsq,
    .adamw = mw__cpu_adamw,
    .attention = mw__cpu_attention,
    .attention_grad = mw__cpu_attention_grad,
#ifdef MESHWIT_HAVE_DNNL
    .attention_prepare = mw__cpu_attention_prepare,
#endif
    .describe = mw__cpu_describe,
    .workspace = mw__cpu_workspace,
    .sgd_momentum = mw__cpu_sgd_momentum,
    .map = mw__cpu_map,
    .map_grad = mw__cpu_map_grad,
    .dropout = mw__cpu_dropout,
    .argmax = mw__cpu_argmax,
    .reduce_max = mw__cpu_reduce_max,
    .state_write = mw__cpu_state_write,
    .attention_cached = mw__cpu_attention_cached,
};

int mw__cpu_set_blas_threads(int n) {
    int prev = openblas_get_num_threads();
    if (n > 0 && n != prev) openblas_set_num_threads(n);
    return prev;
}

const char *mw_blas_core(void) {
    const char *core = openblas_get_corename();
    return core ? core : "unknown";
}

const char *mw_blas_warning(void) {
    static char msg[256];
    const char *core = mw_blas_core();
    static const char *const wide[] = {"SkylakeX", "Cooperlake", "SapphireRapids", "Zen"};
    for (size_t i = 0; i < sizeof wide / sizeof *wide; i++)
        if (strstr(core, wide[i])) return "";
    if (strcmp(mw__cpu_vector_isa(), "avx512") != 0) return ""; /* the CPU's flags (cpu_gemm.c) */
#ifdef MESHWIT_HAVE_DNNL
    /* Contractions run on oneDNN, which picks its kernels from the CPU's features; OpenBLAS
     * only multiplies matrices by vectors. */
    const char *engine = getenv("MESHWIT_CPU_GEMM");
    if (!engine || strcmp(engine, "openblas") != 0) return "";
#endif
    snprintf(msg, sizeof msg,
             "OpenBLAS runs its generic %s kernels on a CPU with AVX-512; "
             "OPENBLAS_CORETYPE=SkylakeX selects the fast ones",
             core);
    return msg;
}
