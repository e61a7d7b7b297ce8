/* oneDNN matmul primitives for the CPU backend's GEMMs, through oneDNN's C API, version 2 (Debian
 * 12's 2.6) or 3 (Debian 13's): the two differ in how memory descriptors are made and freed, how
 * a matmul's primitive descriptor is made and in the arguments of the sum post-op, each handled
 * below where it arises. The bias is the matmul's own; an addend is a binary-add post-op reading
 * its own array; beta = 1 is a sum post-op. */
#ifdef MESHWIT_HAVE_DNNL

#include "devices/cpu/cpu_dnnl.h"

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

#define V3 (DNNL_VERSION_MAJOR >= 3)

#if V3
typedef dnnl_memory_desc_t md_t; /* an opaque handle, destroyed after use */
#define MD(m) (m)
#else
typedef dnnl_memory_desc_t md_t; /* a plain struct */
#define MD(m) (&(m))
#endif

/* libgomp's, when oneDNN runs on OpenMP: the calling thread's team size (its own ICV). */
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
int omp_get_max_threads(void);
void omp_set_num_threads(int n);
static int one_thread(void) {
    int prev = omp_get_max_threads();
    if (prev != 1) omp_set_num_threads(1);
    return prev;
}
static void restore_threads(int prev) {
    if (prev != 1) omp_set_num_threads(prev);
}
#else
static int one_thread(void) { return 1; }
static void restore_threads(int prev) { (void)prev; }
#endif

struct mw__dnnl {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
};

enum { M_A, M_B, M_C, M_BIAS, M_ADD, M_SCRATCH, M_COUNT };

struct mw__dnnl_gemm {
    dnnl_primitive_t prim;
    dnnl_memory_t mem[M_COUNT]; /* NULL where the GEMM has no such argument */
    const void *bound[M_COUNT]; /* the handle each memory has now */
    int add_post_op;            /* index of the binary post-op among the post-ops */
    size_t scratch;
    char impl[64];
};

static mw_status fail(dnnl_status_t s, const char *what) {
    return mw__error(MW_ERR_DEVICE, "oneDNN: %s failed: %s", what, dnnl_status2str(s));
}

int mw__dnnl_cap_isa(const char *name) {
    static const struct {
        const char *name;
        dnnl_cpu_isa_t isa;
    } caps[] = {{"sse2", dnnl_cpu_isa_sse41}, /* oneDNN's narrowest */
                {"avx2", dnnl_cpu_isa_avx2},
                {"avx512", dnnl_cpu_isa_avx512_core},
                {"avx512_bf16", dnnl_cpu_isa_avx512_core_bf16},
                {"amx", dnnl_cpu_isa_avx512_core_amx}};
    for (size_t i = 0; name && i < sizeof caps / sizeof *caps; i++) {
        if (strcmp(name, caps[i].name) != 0) continue;
        /* Settable once, before oneDNN first looks at the CPU (which the query below does). */
        return dnnl_set_max_cpu_isa(caps[i].isa) == dnnl_success ||
               dnnl_get_effective_cpu_isa() <= caps[i].isa;
    }
    return 1; /* no cap */
}

mw_status mw__dnnl_new(mw__dnnl **out) {
    *out = NULL;
    mw__dnnl *d = mw__calloc(1, sizeof *d);
    if (!d) return mw__error(MW_ERR_NOMEM, "out of memory making a oneDNN engine");
    dnnl_status_t s = dnnl_engine_create(&d->engine, dnnl_cpu, 0);
    if (s == dnnl_success) s = dnnl_stream_create(&d->stream, d->engine, dnnl_stream_default_flags);
    if (s != dnnl_success) {
        mw__dnnl_free(d);
        return fail(s, "making the CPU engine");
    }
    *out = d;
    return MW_OK;
}

void mw__dnnl_free(mw__dnnl *d) {
    if (!d) return;
    if (d->stream) dnnl_stream_destroy(d->stream);
    if (d->engine) dnnl_engine_destroy(d->engine);
    mw__free(d);
}

static dnnl_data_type_t dt_of(mw_dtype t) { return t == MW_BF16 ? dnnl_bf16 : dnnl_f32; }

static dnnl_status_t md_make(md_t *md, int nd, const dnnl_dims_t dims, mw_dtype dtype,
                             const dnnl_dims_t strides) {
#if V3
    return dnnl_memory_desc_create_with_strides(md, nd, dims, dt_of(dtype), strides);
#else
    return dnnl_memory_desc_init_by_strides(md, nd, dims, dt_of(dtype), strides);
#endif
}

static void md_free(md_t *md) {
#if V3
    if (*md) dnnl_memory_desc_destroy(*md);
    *md = NULL;
#else
    (void)md;
#endif
}

/* The memory descriptor of one GEMM operand: rows x cols of each of the batch's matrices,
 * row-major with leading dimension ld (stored transposed, cols x rows, when trans), the batch's
 * matrices `stride` apart; stride 0 with a batch broadcasts one matrix (the bias). */
static dnnl_status_t operand(md_t *md, const mw__k_gemm *k, int64_t rows, int64_t cols, int trans,
                             int64_t ld, int64_t stride, mw_dtype dtype) {
    dnnl_dims_t dims = {0}, strides = {0};
    int nd = 0;
    if (k->batch > 1) {
        dims[nd] = stride ? k->batch : 1;
        strides[nd++] = stride ? stride : rows * cols;
    }
    dims[nd] = rows;
    strides[nd++] = trans ? 1 : ld;
    dims[nd] = cols;
    strides[nd++] = trans ? ld : 1;
    return md_make(md, nd, dims, dtype, strides);
}

/* The descriptors of k's operands: A, B, C, the bias (one row of N) and the addend (laid out
 * like C), the last two only when k has them. */
enum { D_A, D_B, D_C, D_BIAS, D_ADD, D_COUNT };
static dnnl_status_t make_mds(const mw__k_gemm *k, md_t *mds) {
    dnnl_status_t s;
    if ((s = operand(&mds[D_A], k, k->m, k->k, k->trans_a, k->lda, k->stride_a, k->ab_dtype)) ||
        (s = operand(&mds[D_B], k, k->k, k->n, k->trans_b, k->ldb, k->stride_b, k->ab_dtype)) ||
        (s = operand(&mds[D_C], k, k->m, k->n, 0, k->ldc, k->stride_c, k->c_dtype)))
        return s;
    if (k->bias && (s = operand(&mds[D_BIAS], k, 1, k->n, 0, k->n, 0, MW_F32))) return s;
    if (k->addend && (s = operand(&mds[D_ADD], k, k->m, k->n, 0, k->ldc, k->stride_c, MW_F32)))
        return s;
    return dnnl_success;
}

/* Attributes: user scratchpad, then the post-ops (beta = 1 as a sum, the addend as a binary add
 * reading an array laid out like C). */
static dnnl_status_t make_attr(const mw__k_gemm *k, md_t *mds, dnnl_primitive_attr_t *attr,
                               int *add_post_op) {
    dnnl_status_t s = dnnl_primitive_attr_create(attr);
    if (s) return s;
    if ((s = dnnl_primitive_attr_set_scratchpad_mode(*attr, dnnl_scratchpad_mode_user))) return s;
    if (k->beta == 0.0f && !k->addend) return dnnl_success;
    dnnl_post_ops_t po;
    if ((s = dnnl_post_ops_create(&po))) return s;
    int n = 0;
    if (k->beta != 0.0f) {
#if V3
        s = dnnl_post_ops_append_sum(po, k->beta, 0, dnnl_data_type_undef);
#else
        s = dnnl_post_ops_append_sum(po, k->beta);
#endif
        n++;
    }
    if (s == dnnl_success && k->addend) {
        *add_post_op = n;
        s = dnnl_post_ops_append_binary(po, dnnl_binary_add, MD(mds[D_ADD]));
    }
    if (s == dnnl_success) s = dnnl_primitive_attr_set_post_ops(*attr, po);
    dnnl_post_ops_destroy(po);
    return s;
}

static dnnl_status_t make_pd(mw__dnnl *d, const mw__k_gemm *k, dnnl_primitive_attr_t attr,
                             md_t *mds, dnnl_primitive_desc_t *pd) {
#if V3
    return dnnl_matmul_primitive_desc_create(pd, d->engine, mds[D_A], mds[D_B],
                                             k->bias ? mds[D_BIAS] : NULL, mds[D_C], attr);
#else
    dnnl_matmul_desc_t desc;
    dnnl_status_t s = dnnl_matmul_desc_init(&desc, &mds[D_A], &mds[D_B],
                                            k->bias ? &mds[D_BIAS] : NULL, &mds[D_C]);
    return s ? s : dnnl_primitive_desc_create(pd, &desc, attr, d->engine, NULL);
#endif
}

mw_status mw__dnnl_gemm_new(mw__dnnl *d, const mw__k_gemm *k, mw__dnnl_gemm **out) {
    *out = NULL;
    mw__dnnl_gemm *g = mw__calloc(1, sizeof *g);
    if (!g) return mw__error(MW_ERR_NOMEM, "out of memory making a oneDNN matmul");
    md_t mds[D_COUNT];
    memset(mds, 0, sizeof mds);
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    int threads = one_thread(); /* the kernel is chosen for the thread count it will run on */
    mw_status st = MW_OK;
    dnnl_status_t s = make_mds(k, mds);
    if (s == dnnl_success) s = make_attr(k, mds, &attr, &g->add_post_op);
    if (s == dnnl_success) s = make_pd(d, k, attr, mds, &pd);
    if (s == dnnl_unimplemented) goto done; /* no implementation: the caller takes another path */
    if (s != dnnl_success) {
        st = fail(s, "making a matmul");
        goto done;
    }
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
        snprintf(g->impl, sizeof g->impl, "%s", impl);
    else
        snprintf(g->impl, sizeof g->impl, "?");
#if V3
    const_dnnl_memory_desc_t sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
#else
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
#endif
    g->scratch = sp ? dnnl_memory_desc_get_size(sp) : 0;
    if ((s = dnnl_primitive_create(&g->prim, pd)) != dnnl_success) {
        st = fail(s, "making a matmul primitive");
        goto done;
    }
    const int have[M_COUNT] = {1, 1, 1, k->bias != NULL, k->addend != NULL, g->scratch > 0};
    static const int desc_of[M_COUNT] = {D_A, D_B, D_C, D_BIAS, D_ADD, -1};
    for (int i = 0; i < M_COUNT && s == dnnl_success; i++) {
        if (!have[i]) continue;
        if (i == M_SCRATCH)
            s = dnnl_memory_create(&g->mem[i], sp, d->engine, DNNL_MEMORY_NONE);
        else
            s = dnnl_memory_create(&g->mem[i], MD(mds[desc_of[i]]), d->engine, DNNL_MEMORY_NONE);
    }
    if (s != dnnl_success) st = fail(s, "making a matmul's memory");
done:
    restore_threads(threads);
    for (int i = 0; i < D_COUNT; i++) md_free(&mds[i]);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (st == MW_OK && g->prim) {
        *out = g;
        return MW_OK;
    }
    mw__dnnl_gemm_free(g);
    return st;
}

void mw__dnnl_gemm_free(mw__dnnl_gemm *g) {
    if (!g) return;
    for (int i = 0; i < M_COUNT; i++)
        if (g->mem[i]) dnnl_memory_destroy(g->mem[i]);
    if (g->prim) dnnl_primitive_destroy(g->prim);
    mw__free(g);
}

const char *mw__dnnl_gemm_impl(const mw__dnnl_gemm *g) { return g->impl; }

size_t mw__dnnl_gemm_scratch(const mw__dnnl_gemm *g) { return (g->scratch + 63) / 64 * 64; }

mw_status mw__dnnl_gemm_run(mw__dnnl *d, mw__dnnl_gemm *g, const mw__k_gemm *k, void *scratch) {
    const void *ptr[M_COUNT] = {k->a, k->b, k->c, k->bias, k->addend, scratch};
    static const int arg[M_COUNT] = {DNNL_ARG_SRC,  DNNL_ARG_WEIGHTS, DNNL_ARG_DST,
                                     DNNL_ARG_BIAS, DNNL_ARG_SRC_1,   DNNL_ARG_SCRATCHPAD};
    dnnl_exec_arg_t args[M_COUNT];
    int n = 0;
    dnnl_status_t s = dnnl_success;
    for (int i = 0; i < M_COUNT && s == dnnl_success; i++) {
        if (!g->mem[i]) continue;
        if (g->bound[i] != ptr[i]) {
            s = dnnl_memory_set_data_handle(g->mem[i], (void *)(uintptr_t)ptr[i]);
            g->bound[i] = ptr[i];
        }
        args[n].arg =
            i == M_ADD ? (DNNL_ARG_ATTR_MULTIPLE_POST_OP(g->add_post_op) | arg[i]) : arg[i];
        args[n++].memory = g->mem[i];
    }
    if (s != dnnl_success) return fail(s, "binding a matmul's memory");
    int threads = one_thread();
    s = dnnl_primitive_execute(g->prim, d->stream, n, args);
    if (s == dnnl_success) s = dnnl_stream_wait(d->stream);
    restore_threads(threads);
    return s == dnnl_success ? MW_OK : fail(s, "running a matmul");
}

#else
/* ISO C forbids an empty translation unit. */
typedef int mw__cpu_dnnl_unused;
#endif
