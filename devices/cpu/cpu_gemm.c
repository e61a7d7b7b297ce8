/* The CPU backend's GEMMs: oneDNN matmul primitives made when the worker starts, OpenBLAS where
 * oneDNN is absent or where it measures faster (CPUs without AVX-512, where oneDNN 2.x has no
 * brgemm kernels), unless OpenBLAS itself only has generic kernels for the CPU (then oneDNN takes
 * every matrix product), matrix-vector products on OpenBLAS or, where it has only generic
 * kernels, on our own loops (never on oneDNN: each of its calls allocates, and these products
 * gain nothing there), and bf16 operands widened to f32 where the CPU lacks bf16 instructions
 * (in the device's work buffer, cpu_state.h). Compiled once per vector level (cpu_kernels.h),
 * for its own loops. */
#define _GNU_SOURCE

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/plan.h"
#include "devices/cpu/cpu_dnnl.h"
#include "devices/cpu/cpu_isa.h"
#include "devices/cpu/cpu_kernels.h"
#include "devices/cpu/cpu_state.h"
#include "devices/cpu/simd.h"

enum { PATH_BLAS, PATH_DNNL, PATH_WIDEN };

/* A prepared GEMM. */
typedef struct cpu_gemm {
    int path;
    int loops;           /* a matrix-vector product on gemv_rows/gemv_cols, not OpenBLAS's sgemv */
    mw__dnnl_gemm *dnnl; /* DNNL: of the GEMM itself; WIDEN: of its f32 form, or NULL (BLAS) */
    size_t off_a, off_b, off_c; /* WIDEN: the f32 operands in the work buffer (off_c: C's, when
                                   it is bf16) */
    char name[96];
} cpu_gemm;

/* --- the kernels ----------------------------------------------------------------------------- */

/* Elements a GEMM operand spans: batch matrices `stride` apart, the last rows x ld. */
static int64_t span(const mw__k_gemm *k, int64_t rows, int64_t ld, int64_t stride) {
    return k->batch > 0 && rows > 0 ? (k->batch - 1) * stride + (rows - 1) * ld + ld : 0;
}

static int64_t span_a(const mw__k_gemm *k) {
    return span(k, k->trans_a ? k->k : k->m, k->lda, k->stride_a);
}
static int64_t span_b(const mw__k_gemm *k) {
    return span(k, k->trans_b ? k->n : k->k, k->ldb, k->stride_b);
}
static int64_t span_c(const mw__k_gemm *k) { return span(k, k->m, k->ldc, k->stride_c); }

/* The GEMMs' own loops: the epilogue BLAS leaves to us (C, f32, = beta C + bias + addend, put
 * there before the product, which is then added with beta 1). */
static void epilogue_first(const mw__k_gemm *k, float *c) {
    for (int64_t bi = 0; bi < k->batch; bi++)
        for (int64_t i = 0; i < k->m; i++) {
            float *row = c + bi * k->stride_c + i * k->ldc;
            const float *add = k->addend ? k->addend + bi * k->stride_c + i * k->ldc : NULL;
            for (int64_t j = 0; j < k->n; j++) {
                float v = k->beta != 0.0f ? row[j] : 0.0f;
                if (k->bias) v += k->bias[j];
                if (add) v += add[j];
                row[j] = v;
            }
        }
}

/* Matrix-vector products (y = beta y + A x) for where OpenBLAS has only generic kernels: 2-4x
 * its sgemv there, and faster than oneDNN's matmuls on these shapes (README). Each y[i] is
 * summed in the same order wherever it lies in y, so a given shape repeats bit for bit. */
MW__CPU_INLINE float dot(int64_t n, const float *restrict a, const float *restrict x) {
    mw__v8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        mw__v8 a0, a1, a2, a3, x0, x1, x2, x3;
        memcpy(&a0, a + i, sizeof a0), memcpy(&x0, x + i, sizeof x0);
        memcpy(&a1, a + i + 8, sizeof a1), memcpy(&x1, x + i + 8, sizeof x1);
        memcpy(&a2, a + i + 16, sizeof a2), memcpy(&x2, x + i + 16, sizeof x2);
        memcpy(&a3, a + i + 24, sizeof a3), memcpy(&x3, x + i + 24, sizeof x3);
        s0 += a0 * x0, s1 += a1 * x1, s2 += a2 * x2, s3 += a3 * x3;
    }
    for (; i + 8 <= n; i += 8) {
        mw__v8 a0, x0;
        memcpy(&a0, a + i, sizeof a0), memcpy(&x0, x + i, sizeof x0);
        s0 += a0 * x0;
    }
    mw__v8 v = (s0 + s1) + (s2 + s3);
    float t = MW__SUM8(v);
    for (; i < n; i++) t += a[i] * x[i];
    return t;
}

/* y[i * incy] (i < m) = beta y + (row i of a, lda apart) . x (k); beta 0: y is not read. */
static void gemv_rows(int64_t m, int64_t k, const float *a, int64_t lda, const float *x, float beta,
                      float *y, int64_t incy) {
    for (int64_t i = 0; i < m; i++) {
        float t = dot(k, a + i * lda, x);
        y[i * incy] = beta != 0.0f ? t + beta * y[i * incy] : t;
    }
}

/* n results t[0..n) into y[j * incy]. */
MW__CPU_INLINE void put(int64_t n, const float *t, float beta, float *y, int64_t incy) {
    for (int64_t j = 0; j < n; j++) y[j * incy] = beta != 0.0f ? t[j] + beta * y[j * incy] : t[j];
}

/* y[j * incy] (j < n) = beta y + sum over p < k of x[p] b[p * ldb + j]: strips of 64 columns
 * held in eight accumulators while the rows stream past, then strips of 8, then one by one. */
static void gemv_cols(int64_t k, int64_t n, const float *b, int64_t ldb, const float *x, float beta,
                      float *y, int64_t incy) {
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) {
        mw__v8 acc[8] = {{0}};
        for (int64_t p = 0; p < k; p++) {
            const float *row = b + p * ldb + j;
            for (int q = 0; q < 8; q++) {
                mw__v8 v;
                memcpy(&v, row + 8 * q, sizeof v);
                acc[q] += x[p] * v;
            }
        }
        float t[64];
        memcpy(t, acc, sizeof t);
        put(64, t, beta, y + j * incy, incy);
    }
    for (; j + 8 <= n; j += 8) {
        mw__v8 acc = {0};
        for (int64_t p = 0; p < k; p++) {
            mw__v8 v;
            memcpy(&v, b + p * ldb + j, sizeof v);
            acc += x[p] * v;
        }
        float t[8];
        memcpy(t, &acc, sizeof t);
        put(8, t, beta, y + j * incy, incy);
    }
    for (; j < n; j++) {
        float t = 0.0f;
        for (int64_t p = 0; p < k; p++) t += x[p] * b[p * ldb + j];
        put(1, &t, beta, y + j * incy, incy);
    }
}

/* One matrix of an f32 GEMM with M or N 1 (and K > 0) on the loops above: A and B are
 * contiguous vectors of length K where they are vectors, whatever their transposition. */
static void loops_gemv(const mw__k_gemm *k, const float *a, const float *b, float *c, float beta) {
    if (k->m == 1 && k->n == 1)
        gemv_rows(1, k->k, a, k->k, b, beta, c, 1);
    else if (k->n == 1) /* C (M, ldc apart) = op(A) b */
        k->trans_a ? gemv_cols(k->k, k->m, a, k->lda, b, beta, c, k->ldc)
                   : gemv_rows(k->m, k->k, a, k->lda, b, beta, c, k->ldc);
    else /* C (N) = op(B)^T a */
        k->trans_b ? gemv_rows(k->n, k->k, b, k->ldb, a, beta, c, 1)
                   : gemv_cols(k->k, k->n, b, k->ldb, a, beta, c, 1);
}

/* An f32 GEMM through OpenBLAS, its matrix-vector products on our loops when `loops` (C f32). */
static void host_gemm(const mw__k_gemm *k, int loops) {
    float beta = k->beta;
    if (k->bias || k->addend) {
        epilogue_first(k, k->c);
        beta = 1.0f;
    }
    for (int64_t bi = 0; bi < k->batch; bi++) {
        const float *a = (const float *)k->a + bi * k->stride_a;
        const float *b = (const float *)k->b + bi * k->stride_b;
        float *c = (float *)k->c + bi * k->stride_c;
        if (k->k == 0) {
            if (beta == 0.0f)
                for (int64_t i = 0; i < k->m; i++) memset(c + i * k->ldc, 0, (size_t)k->n * 4);
        } else if (loops && (k->m == 1 || k->n == 1)) {
            loops_gemv(k, a, b, c, beta);
        } else if (k->n == 1 && k->m == 1) {
            /* A and B are contiguous vectors of length K whatever their transposition. */
            c[0] = cblas_sdot((int)k->k, a, 1, b, 1) + (beta != 0.0f ? beta * c[0] : 0.0f);
        } else if (k->n == 1) {
            /* C (M) = op(A) * b, with b a contiguous K-vector. */
            if (k->trans_a)
                cblas_sgemv(CblasRowMajor, CblasTrans, (int)k->k, (int)k->m, 1.0f, a, (int)k->lda,
                            b, 1, beta, c, (int)k->ldc);
            else
                cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)k->m, (int)k->k, 1.0f, a, (int)k->lda,
                            b, 1, beta, c, (int)k->ldc);
        } else if (k->m == 1) {
            /* C (N) = op(B)^T * a, with a a contiguous K-vector. */
            if (k->trans_b)
                cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)k->n, (int)k->k, 1.0f, b, (int)k->ldb,
                            a, 1, beta, c, 1);
            else
                cblas_sgemv(CblasRowMajor, CblasTrans, (int)k->k, (int)k->n, 1.0f, b, (int)k->ldb,
                            a, 1, beta, c, 1);
        } else {
            cblas_sgemm(CblasRowMajor, k->trans_a ? CblasTrans : CblasNoTrans,
                        k->trans_b ? CblasTrans : CblasNoTrans, (int)k->m, (int)k->n, (int)k->k,
                        1.0f, a, (int)k->lda, b, (int)k->ldb, beta, c, (int)k->ldc);
        }
    }
}

/* k with bf16 parts replaced by f32 ones at a, b, c (NULL: keep k's). */
static mw__k_gemm widened(const mw__k_gemm *k, const float *a, const float *b, float *c) {
    mw__k_gemm f = *k;
    f.ab_dtype = f.c_dtype = MW_F32;
    if (a) f.a = a, f.b = b;
    if (c) f.c = c;
    f.impl = NULL;
    return f;
}

/* The f32 GEMM f, prepared as g (g->dnnl, or BLAS and our loops; NULL: BLAS alone). */
static mw_status run_f32(mw__cpu_state *s, const cpu_gemm *g, const mw__k_gemm *f) {
#ifdef MESHWIT_HAVE_DNNL
    if (g && g->dnnl) return mw__dnnl_gemm_run(s->dnnl, g->dnnl, f, s->work);
#else
    (void)s;
#endif
    host_gemm(f, g && g->loops);
    return MW_OK;
}

/* A bf16 C (batch matrices of m x n, ldc and stride_c apart) widened into f32 at c, laid out
 * alike, or narrowed back from it: row by row, since the gaps between the rows of a C that is a
 * view into a wider tensor hold someone else's values (narrowing the whole span wrote the f32
 * buffer's leftovers there). */
static void widen_c(const mw__k_gemm *k, float *c) {
    for (int64_t bi = 0; bi < k->batch; bi++)
        mw__bf16_widen_rows(k->m, k->n, (const uint16_t *)k->c + bi * k->stride_c, k->ldc,
                            c + bi * k->stride_c, k->ldc);
}

static void narrow_c(const mw__k_gemm *k, const float *c) {
    for (int64_t bi = 0; bi < k->batch; bi++)
        mw__bf16_narrow_rows(k->m, k->n, c + bi * k->stride_c, k->ldc,
                             (uint16_t *)k->c + bi * k->stride_c, k->ldc);
}

/* k with its bf16 parts widened into the f32 buffers a and b (A and B, when they are bf16) and c
 * (C, when it is), run as an f32 GEMM (prepared as g, or BLAS), and a bf16 C rounded back. */
static mw_status run_widened(mw__cpu_state *s, const cpu_gemm *g, const mw__k_gemm *k, float *a,
                             float *b, float *c) {
    if (k->ab_dtype == MW_BF16) {
        mw__bf16_widen(span_a(k), k->a, a);
        mw__bf16_widen(span_b(k), k->b, b);
    }
    if (c && k->beta != 0.0f) widen_c(k, c);
    mw__k_gemm f = widened(k, k->ab_dtype == MW_BF16 ? a : NULL, b, c);
    mw_status st = run_f32(s, g, &f);
    if (st == MW_OK && c) narrow_c(k, c);
    return st;
}

/* A GEMM with no prepared state (a kernel called on its own): BLAS, through temporaries for bf16
 * parts. */
static mw_status unprepared(const mw__k_gemm *k) {
    if (k->ab_dtype == MW_F32 && k->c_dtype == MW_F32) {
        host_gemm(k, 0);
        return MW_OK;
    }
    int64_t na = k->ab_dtype == MW_BF16 ? span_a(k) : 0,
            nb = k->ab_dtype == MW_BF16 ? span_b(k) : 0;
    int64_t nc = k->c_dtype == MW_BF16 ? span_c(k) : 0;
    float *t = mw__malloc((size_t)(na + nb + nc + 1) * sizeof *t);
    if (!t) return mw__error(MW_ERR_NOMEM, "out of memory widening a bf16 GEMM");
    mw_status st = run_widened(NULL, NULL, k, t, t + na, nc ? t + na + nb : NULL);
    mw__free(t);
    return st;
}

mw_status MW__CPU(mw__cpu_gemm)(mw__device *dev, const mw__k_gemm *k) {
    cpu_gemm *g = k->impl;
    if (!g) return unprepared(k);
    mw__cpu_state *s = dev->impl;
    if (g->path == PATH_BLAS) {
        host_gemm(k, g->loops);
        return MW_OK;
    }
#ifdef MESHWIT_HAVE_DNNL
    if (g->path == PATH_DNNL) return mw__dnnl_gemm_run(s->dnnl, g->dnnl, k, s->work);
#endif
    /* WIDEN: the bf16 operands (and a bf16 C) as f32 in the work buffer; the scratchpad of the
     * f32 primitive lies at the start of it. */
    char *w = s->work;
    return run_widened(s, g, k, (float *)(w + g->off_a), (float *)(w + g->off_b),
                       k->c_dtype == MW_BF16 ? (float *)(w + g->off_c) : NULL);
}

static size_t round64(size_t n) { return (n + 63) / 64 * 64; }

static void gemm_free(void *p) {
    cpu_gemm *g = p;
#ifdef MESHWIT_HAVE_DNNL
    mw__dnnl_gemm_free(g->dnnl);
#endif
    mw__free(g);
}

mw_status MW__CPU(mw__cpu_gemm_prepare)(mw__device *dev, mw__k_gemm *k) {
    mw__cpu_state *s = dev->impl; /* its oneDNN engine, the engine asked for, OpenBLAS's kernels */
    cpu_gemm *g = mw__calloc(1, sizeof *g);
    mw_status st = g ? mw__cpu_own(dev, g, gemm_free)
                     : mw__error(MW_ERR_NOMEM, "%s: out of memory preparing a GEMM", dev->name);
    if (st) return st;
    int bf16 = k->ab_dtype == MW_BF16 || k->c_dtype == MW_BF16;
    int vector = k->m == 1 || k->n == 1 || k->k == 0;
    size_t scratch = 0;
    /* f32 off oneDNN: OpenBLAS, matrix-vector products on our loops where its kernels are
     * generic, unless OpenBLAS was asked for. */
    g->path = PATH_BLAS;
    g->loops = vector && k->k > 0 && !s->blas_tuned && s->engine != MW__ENGINE_OPENBLAS;
    char host[48];
    if (g->loops)
        snprintf(host, sizeof host, "gemv loops (%s)", mw__cpu_vector_isa());
    else
        snprintf(host, sizeof host, "openblas %s", vector ? "sgemv" : "sgemm");
    snprintf(g->name, sizeof g->name, "%s", host);
#ifdef MESHWIT_HAVE_DNNL
    /* bf16 as it is, on bf16 instructions. */
    if (s->dnnl && bf16 && k->k > 0 && mw__isa_bf16(s->cap) && k->ab_dtype == MW_BF16) {
        if ((st = mw__dnnl_gemm_new(s->dnnl, k, &g->dnnl))) return st;
        if (g->dnnl) { /* the CPU has bf16 instructions (bf16_allowed): its kernels use them */
            g->path = PATH_DNNL;
            g->loops = 0;
            scratch = mw__dnnl_gemm_scratch(g->dnnl);
            snprintf(g->name, sizeof g->name, "onednn %s", mw__dnnl_gemm_impl(g->dnnl));
        } else {
            mw__dnnl_gemm_free(g->dnnl);
            g->dnnl = NULL;
        }
    }
#endif
    if (g->path == PATH_BLAS && bf16) {
        g->path = PATH_WIDEN;
        snprintf(g->name, sizeof g->name, "bf16 widened to f32, %s", host);
    }
#ifdef MESHWIT_HAVE_DNNL
    /* f32 (as it is, or the widened form) of a matrix product on oneDNN, where that is the
     * faster engine here. Never a matrix-vector product: every oneDNN call allocates (its
     * execute builds a map of the arguments), and OpenBLAS or the loops are faster at them. */
    if (s->dnnl && g->path != PATH_DNNL && !vector && s->engine != MW__ENGINE_OPENBLAS) {
        mw__k_gemm f = widened(k, NULL, NULL, NULL);
        if ((st = mw__dnnl_gemm_new(s->dnnl, &f, &g->dnnl))) return st;
        const char *impl = g->dnnl ? mw__dnnl_gemm_impl(g->dnnl) : "";
        if (g->dnnl &&
            (s->engine == MW__ENGINE_ONEDNN || strncmp(impl, "brg", 3) == 0 || !s->blas_tuned)) {
            scratch = mw__dnnl_gemm_scratch(g->dnnl);
            if (g->path == PATH_BLAS) g->path = PATH_DNNL;
            snprintf(g->name, sizeof g->name, "%sonednn %s",
                     g->path == PATH_WIDEN ? "bf16 widened to f32, " : "", impl);
        } else {
            mw__dnnl_gemm_free(g->dnnl);
            g->dnnl = NULL;
        }
    }
#endif
    size_t need = round64(scratch);
    if (g->path == PATH_WIDEN) {
        g->off_a = need;
        g->off_b = g->off_a + round64((size_t)span_a(k) * 4);
        g->off_c = g->off_b + round64((size_t)span_b(k) * 4);
        need = g->off_c + (k->c_dtype == MW_BF16 ? round64((size_t)span_c(k) * 4) : 0);
    }
    k->impl = g;
    return mw__cpu_work_reserve(dev, need);
}

const char *MW__CPU(mw__cpu_gemm_impl)(const mw__k_gemm *k) {
    const cpu_gemm *g = k->impl;
    return g ? g->name : "openblas (unprepared)";
}
