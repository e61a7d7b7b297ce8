/* The CUDA backend against the CPU backend, kernel by kernel, on random inputs, and the GPU
 * reducers (suite gpu). Every test that needs a GPU skips itself when none is visible, and fails
 * instead when MESHWIT_REQUIRE_GPU=1 (CTest runs the suite through main.c's gate, which reports
 * it skipped or failed as a whole); the few that need no GPU (device count, selection, failing
 * cleanly) are in suite gpu_host and run everywhere.
 *
 * Tolerances. Kernels that do one IEEE operation per element (binary, copy, fill, embedding and
 * its gradient, which adds in the same order) must match bit for bit. Sums in a different order
 * are held to the worst-case bound of float summation: two orders of n terms differ by at most
 * (n - 1) * FLT_EPSILON * sum |term|. Kernels with exp/tanh get a few ulps per transcendental,
 * stated at each test. */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/reducer_select.h"
#include "core/error.h"
#include "devices/cpu/cpu.h"
#include "devices/device.h"
#include "tests/common/rng.h"

#ifndef MESHWIT_HAVE_CUDA

Test(gpu, cuda_backend) { cr_skip("this build of meshwit has no CUDA backend"); }

Test(gpu_host, reducer_selection_without_cuda) {
    int ord[2] = {0, 0};
    cr_assert_eq(mw__reducer_for("cpu", 2, ord), &mw__reducer_shm);
    cr_assert_null(mw__reducer_for("cuda", 2, ord));
}

#else

#include "devices/cuda/cuda.h"
#include "gpu_test.h"

#define NEED_GPU()                                                                                 \
    do {                                                                                           \
        need_gpu();                                                                                \
        start();                                                                                   \
    } while (0)

/* --- harness ---------------------------------------------------------------------------------- */

#define MAX_BUFS 256

static mw__device cpu, gpu;

/* The device buffers a test made, each with the host buffer it stands for in the GPU's runs of
 * a kernel (NULL: none; see twin). */
static struct {
    void *dev;
    const void *host;
} bufs[MAX_BUFS];
static int nbufs;

static mw__device make_device(const mw__device_vtable *vt, const char *name, int index,
                              int ordinal) {
    mw__device d;
    memset(&d, 0, sizeof d);
    d.vt = vt;
    snprintf(d.name, sizeof d.name, "%s", name);
    d.index = index;
    d.ordinal = ordinal;
    return d;
}

static void start(void) {
    cpu = make_device(&mw__cpu_device, "cpu:0", 0, 0);
    gpu = make_device(&mw__cuda_device, "cuda:0", 0, 0);
    OK(cpu.vt->init(&cpu));
    OK(gpu.vt->init(&gpu));
}

static void finish(void) {
    for (int i = 0; i < nbufs; i++) gpu.vt->free(&gpu, bufs[i].dev);
    nbufs = 0;
    if (gpu.impl) gpu.vt->shutdown(&gpu);
}

TestSuite(gpu, .fini = finish);

static uint64_t rng = 0x9e3779b97f4a7c15u;

static double uniform(double lo, double hi) { return rng_range(rng_splitmix64(&rng), lo, hi); }

static void *host_alloc(size_t bytes) {
    void *p = calloc(bytes ? bytes : 1, 1);
    cr_assert_not_null(p, "out of host memory");
    return p;
}

static float *rand_floats(int64_t n, double lo, double hi) {
    float *p = host_alloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++) p[i] = (float)uniform(lo, hi);
    return p;
}

static float *zeros(int64_t n) { return host_alloc((size_t)n * sizeof(float)); }

/* A device buffer of `bytes` (at least one byte is allocated) that stands for `host` in the GPU's
 * runs, holding a copy of the bytes at init (nothing is copied when init is NULL). */
static void *put_for(const void *host, const void *init, size_t bytes) {
    cr_assert_lt(nbufs, MAX_BUFS);
    void *d = NULL;
    OK(gpu.vt->alloc(&gpu, bytes ? bytes : 4, &d));
    cr_assert_not_null(d);
    bufs[nbufs].dev = d;
    bufs[nbufs++].host = host;
    if (bytes && init) OK(gpu.vt->upload(&gpu, d, init, bytes));
    return d;
}

/* A device copy of `bytes` of host memory; with host NULL, an uninitialised buffer. */
static void *put(const void *host, size_t bytes) { return put_for(host, host, bytes); }

static float *putf(const float *host, int64_t n) { return put(host, (size_t)n * sizeof(float)); }

static void get(void *host, const void *dev, size_t bytes) {
    OK(gpu.vt->sync(&gpu));
    if (bytes) OK(gpu.vt->download(&gpu, host, dev, bytes));
}

static float *getf(const float *dev, int64_t n) {
    float *h = zeros(n);
    get(h, dev, (size_t)n * sizeof(float));
    return h;
}

/* --- one kernel on both devices ---------------------------------------------------------------
 * A test fills a kernel's parameters once, with host buffers: both_<kernel> runs them on the CPU,
 * then on the GPU with every buffer replaced by its twin, the device buffer last put for it
 * (on_both, on_both_as); the GPU's result is then read from the output's twin (gpu_result) and
 * compared with the CPU's, left in the host buffer. */

/* The device buffer that stands for host: the last one put for it. NULL for NULL. */
static void *twin(const void *host) {
    if (!host) return NULL;
    for (int i = nbufs - 1; i >= 0; i--)
        if (bufs[i].host == host) return bufs[i].dev;
    cr_assert_fail("host buffer %p has no device copy", host);
    return NULL;
}

/* host's n floats, with a device copy for the GPU's runs; returns host. */
static float *on_both(float *host, int64_t n) {
    putf(host, n);
    return host;
}

/* host's n floats, with a device buffer for the GPU's runs that starts as the n floats of init
 * (garbage a kernel must overwrite; NULL: uninitialised); returns host. */
static float *on_both_as(float *host, const float *init, int64_t n) {
    put_for(host, init, (size_t)n * sizeof(float));
    return host;
}

/* n ids, with a device copy for the GPU's runs; returns ids. */
static const int32_t *ids_on_both(const int32_t *ids, int64_t n) {
    put(ids, (size_t)n * sizeof *ids);
    return ids;
}

/* What the GPU's run left in the n floats of host's twin. */
static float *gpu_result(const float *host, int64_t n) { return getf(twin(host), n); }

/* The kernels run on both devices, each with its parameters' type and every buffer field. */
#define PAIRED_KERNELS(X)                                                                          \
    X(binary, mw__k_binary, TWIN(out) TWIN(a) TWIN(b))                                             \
    X(copy, mw__k_copy, TWIN(out) TWIN(a))                                                         \
    X(fill, mw__k_fill, TWIN(out))                                                                 \
    X(sgd, mw__k_sgd, TWIN(p) TWIN(g) TWIN(p16))                                                   \
    X(unary, mw__k_unary, TWIN(out) TWIN(a))                                                       \
    X(unary_grad, mw__k_unary_grad, TWIN(out) TWIN(gy) TWIN(x) TWIN(colsum))                       \
    X(adamw, mw__k_adamw, TWIN(p) TWIN(m) TWIN(v) TWIN(g) TWIN(p16))                               \
    X(reduce, mw__k_reduce, TWIN(out) TWIN(a))                                                     \
    X(sumsq, mw__k_sumsq, TWIN(out) TWIN(a))                                                       \
    X(gemm, mw__k_gemm, TWIN(c) TWIN(a) TWIN(b) TWIN(bias) TWIN(addend))                           \
    X(layernorm, mw__k_layernorm, TWIN(out) TWIN(x) TWIN(w) TWIN(b))                               \
    X(layernorm_dx, mw__k_layernorm_grad,                                                          \
      TWIN(out) TWIN(gy) TWIN(x) TWIN(w) TWIN(dw) TWIN(db) TWIN(addend))                           \
    X(layernorm_dw, mw__k_layernorm_grad,                                                          \
      TWIN(out) TWIN(gy) TWIN(x) TWIN(w) TWIN(dw) TWIN(db) TWIN(addend))                           \
    X(softmax, mw__k_softmax, TWIN(out) TWIN(a))                                                   \
    X(softmax_grad, mw__k_softmax_grad, TWIN(out) TWIN(gy) TWIN(p))                                \
    X(embed, mw__k_embed, TWIN(out) TWIN(ids) TWIN(table))                                         \
    X(embed_grad, mw__k_embed_grad, TWIN(out) TWIN(ids) TWIN(gy))                                  \
    X(xent, mw__k_xent, TWIN(out) TWIN(logits) TWIN(targets))                                      \
    X(xent_grad, mw__k_xent_grad, TWIN(out) TWIN(gy) TWIN(logits) TWIN(targets))

/* on_gpu_<kernel>(k): k on the GPU, its buffers replaced by their twins; both_<kernel>(k): k on
 * the CPU, then on the GPU. */
#define TWIN(field) k.field = twin(k.field);
#define PAIRED_RUNS(name, type, twins)                                                             \
    static inline void on_gpu_##name(type k) { twins OK(gpu.vt->name(&gpu, &k)); }                 \
    static inline void both_##name(type k) {                                                       \
        OK(cpu.vt->name(&cpu, &k));                                                                \
        on_gpu_##name(k);                                                                          \
    }
PAIRED_KERNELS(PAIRED_RUNS)
#undef PAIRED_RUNS
#undef TWIN

static void expect_equal(const char *what, const float *got, const float *ref, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        cr_assert(got[i] == ref[i] || (isnan(got[i]) && isnan(ref[i])),
                  "%s: element %lld is %.9g on the GPU and %.9g on the CPU", what, (long long)i,
                  got[i], ref[i]);
}

/* |got - ref| <= tol[i] (or atol + rtol |ref| when tol is NULL). */
static void expect_close(const char *what, const float *got, const float *ref, int64_t n,
                         const double *tol, double atol, double rtol) {
    for (int64_t i = 0; i < n; i++) {
        double t = tol ? tol[i] : atol + rtol * fabs(ref[i]);
        cr_assert(fabs((double)got[i] - ref[i]) <= t,
                  "%s: element %lld is %.9g on the GPU and %.9g on the CPU (tolerance %.3g)", what,
                  (long long)i, got[i], ref[i], t);
    }
}

static mw__nd nd_of(int rank, const int64_t *dims, const int64_t *s0, const int64_t *s1,
                    const int64_t *s2) {
    mw__nd nd;
    memset(&nd, 0, sizeof nd);
    nd.rank = rank;
    for (int d = 0; d < rank; d++) {
        nd.dims[d] = dims[d];
        nd.stride[0][d] = s0[d];
        nd.stride[1][d] = s1[d];
        nd.stride[2][d] = s2 ? s2[d] : 0;
    }
    return nd;
}

/* Operand k's element offset at the row-major index i of nd. */
static int64_t nd_offset(const mw__nd *nd, int k, int64_t i) {
    int64_t off = 0;
    for (int d = nd->rank - 1; d >= 0; d--) {
        off += i % nd->dims[d] * nd->stride[k][d];
        i /= nd->dims[d];
    }
    return off;
}

static int64_t nd_count(const mw__nd *nd) {
    int64_t n = 1;
    for (int d = 0; d < nd->rank; d++) n *= nd->dims[d];
    return n;
}

/* --- no GPU needed ---------------------------------------------------------------------------- */

Test(gpu_host, device_count_never_fails) {
    int n = mw__cuda_device_count();
    cr_assert_geq(n, 0);
    cr_assert_eq(mw__cuda_device_count(), n, "the count must be stable");
}

Test(gpu_host, missing_gpu_is_an_error_not_a_crash) {
    /* A GPU id past the last one: init and alloc fail with a message naming the device. */
    int n = mw__cuda_device_count();
    mw__device d = make_device(&mw__cuda_device, "cuda:77", 0, n + 77);
    mw_status st = d.vt->init(&d);
    cr_assert_eq(st, MW_ERR_DEVICE, "init gave %s", mw_status_name(st));
    cr_assert(strstr(mw_last_error(), "cuda:77") != NULL, "message: %s", mw_last_error());
    cr_assert_null(d.impl);
    cr_assert_null(mw__cuda_stream(&d));
    void *p = (void *)1;
    st = d.vt->alloc(&d, 1024, &p);
    cr_assert_eq(st, MW_ERR_DEVICE, "alloc gave %s", mw_status_name(st));
    cr_assert_null(p);
    d.vt->shutdown(&d); /* harmless without init */
}

/* The fused attention and its gradient, the state write and cached attention refuse a device
 * that was never initialised (no stream, no error records), naming it, before any CUDA call: no
 * launch on the legacy stream, no read of the missing device state. */
Test(gpu_host, kernels_refuse_a_device_before_its_init) {
    mw__device d = make_device(&mw__cuda_device, "cuda:5", 0, 0);
    mw__k_attention a = {.t = 4, .d = 8, .slices = 1, .block = 4, .scale = 1.0f};
    a.qkv_dtype = MW_F32, a.out_dtype = MW_F32, a.seq_qkv = 24, a.seq_out = 8, a.part = 8;
    mw__k_attention_cached c = {.outer = 1, .n = 4, .heads = 1, .dim = 8, .scale = 1.0f};
    mw__k_state_write w = {.outer = 1, .n = 4, .inner = 8};
    static const char *const names[] = {"attention", "attention gradient", "cached attention",
                                        "state write"};
    for (int i = 0; i < 4; i++) {
        mw_status st = i == 0   ? d.vt->attention(&d, &a)
                       : i == 1 ? d.vt->attention_grad(&d, &a)
                       : i == 2 ? d.vt->attention_cached(&d, &c)
                                : d.vt->state_write(&d, &w);
        cr_assert_eq(st, MW_ERR_STATE, "%s: %s: %s", names[i], mw_status_name(st), mw_last_error());
        cr_assert(strstr(mw_last_error(), "cuda:5: kernel called before the device's init"),
                  "%s: %s", names[i], mw_last_error());
    }
    cr_assert_null(d.impl);
}

Test(gpu_host, reducer_selection) {
    int same[3] = {0, 0, 0}, distinct[3] = {0, 1, 2}, mixed[3] = {0, 0, 1};
    cr_assert_eq(mw__reducer_for("cpu", 3, distinct), &mw__reducer_shm);
    /* The registry's are libmeshwit-cuda.so's; this test links its own copy: compare names. */
    cr_assert_str_eq(mw__reducer_for("cuda", 3, same)->name, mw__reducer_cuda_local.name);
    cr_assert_str_eq(mw__reducer_for("cuda", 1, same)->name, mw__reducer_cuda_local.name);
#ifdef MESHWIT_HAVE_NCCL
    cr_assert_str_eq(mw__reducer_for("cuda", 3, distinct)->name, mw__reducer_nccl.name);
#else
    cr_assert_null(mw__reducer_for("cuda", 3, distinct));
#endif
    cr_assert_null(mw__reducer_for("cuda", 3, mixed));
    cr_assert_null(mw__reducer_for("tpu", 3, same));
    cr_assert_null(mw__reducer_for(NULL, 3, same));
}

/* --- element-wise ----------------------------------------------------------------------------- */

static void binary_case(const char *what, mw__nd nd, int64_t na, int64_t nb, int64_t nout) {
    static const mw__binop ops[] = {MW__BIN_ADD, MW__BIN_SUB, MW__BIN_MUL, MW__BIN_DIV};
    float *a = on_both(rand_floats(na, -3, 3), na), *b = on_both(rand_floats(nb, 0.5, 3), nb);
    float *ref = on_both(zeros(nout), nout);
    for (int o = 0; o < 4; o++) {
        both_binary((mw__k_binary){.op = ops[o], .nd = nd, .out = ref, .a = a, .b = b});
        char label[96];
        snprintf(label, sizeof label, "binary %s, op %d", what, (int)ops[o]);
        expect_equal(label, gpu_result(ref, nout), ref, nout);
    }
}

Test(gpu, binary_matches_cpu_exactly) {
    NEED_GPU();
    int64_t d1[] = {1000}, one[] = {1};
    binary_case("contiguous", nd_of(1, d1, one, one, one), 1000, 1000, 1000);
    /* out [4,5,6]; a stored as [6,5,4] (permuted); b [5] broadcast over the rest. */
    int64_t d3[] = {4, 5, 6}, so[] = {30, 6, 1}, sa[] = {1, 4, 20}, sb[] = {0, 1, 0};
    binary_case("permuted and broadcast", nd_of(3, d3, so, sa, sb), 120, 5, 120);
    /* A scalar b over a [7, 9] a. */
    int64_t d2[] = {7, 9}, s2[] = {9, 1}, s0[] = {0, 0};
    binary_case("scalar", nd_of(2, d2, s2, s2, s0), 63, 1, 63);
    binary_case("rank 0", nd_of(0, NULL, NULL, NULL, NULL), 1, 1, 1);
}

static void copy_case(const char *what, mw__nd nd, float alpha, int64_t na, int64_t nout) {
    float *a = on_both(rand_floats(na, -3, 3), na), *ref = on_both(zeros(nout), nout);
    both_copy((mw__k_copy){.alpha = alpha, .nd = nd, .out = ref, .a = a});
    expect_equal(what, gpu_result(ref, nout), ref, nout);
}

Test(gpu, copy_matches_cpu_exactly) {
    NEED_GPU();
    int64_t d1[] = {5000}, one[] = {1};
    copy_case("contiguous", nd_of(1, d1, one, one, NULL), 1.0f, 5000, 5000);
    copy_case("scaled", nd_of(1, d1, one, one, NULL), 0.5f, 5000, 5000);
    int64_t dt[] = {37, 53}, st_out[] = {53, 1}, st_a[] = {1, 37};
    copy_case("transpose", nd_of(2, dt, st_out, st_a, NULL), -2.0f, 37 * 53, 37 * 53);
    int64_t db[] = {11, 13}, sbo[] = {13, 1}, sba[] = {0, 1};
    copy_case("broadcast rows", nd_of(2, db, sbo, sba, NULL), 1.0f, 13, 11 * 13);
    copy_case("rank 0", nd_of(0, NULL, NULL, NULL, NULL), 3.0f, 1, 1);
}

/* i32 elements (token ids) move as bits, strided too: each out element is a's element at the
 * index nd gives (an independent reference), and the CPU's move gives the same. Through a float
 * multiply, -1 and every int in [-2^23 + 1, -1] (NaN patterns) came out as 0x7FFFFFFF and the
 * large ones rounded. */
static void copy_i32_case(const char *what, mw__nd nd, int64_t na, int64_t nout) {
    static const int32_t special[] = {
        -1, 0, 1, INT32_MIN, INT32_MAX, -(1 << 23) + 1, -12345, (1 << 24) + 1, 50256, -(1 << 22)};
    int32_t *a = host_alloc((size_t)na * 4), *ref = host_alloc((size_t)nout * 4),
            *want = host_alloc((size_t)nout * 4), *got = host_alloc((size_t)nout * 4);
    for (int64_t i = 0; i < na; i++)
        a[i] = i < 10 ? special[i] : (int32_t)(uint32_t)(uniform(0, 4294967296.0));
    int64_t n = nd_count(&nd);
    for (int64_t i = 0; i < n; i++) want[nd_offset(&nd, 0, i)] = a[nd_offset(&nd, 1, i)];
    put(a, (size_t)na * 4);
    put_for(ref, NULL, (size_t)nout * 4);
    both_copy((mw__k_copy){
        .alpha = 1.0f, .out_dtype = MW_I32, .a_dtype = MW_I32, .nd = nd, .out = ref, .a = a});
    get(got, twin(ref), (size_t)nout * 4);
    for (int64_t i = 0; i < nout; i++) {
        cr_assert_eq(ref[i], want[i], "%s: the CPU's element %lld is %d, not %d", what,
                     (long long)i, ref[i], want[i]);
        cr_assert_eq(got[i], want[i], "%s: the GPU's element %lld is %d (0x%08x), not %d", what,
                     (long long)i, got[i], (unsigned)got[i], want[i]);
    }
}

Test(gpu, copy_moves_i32_bits) {
    NEED_GPU();
    int64_t d1[] = {1000}, one[] = {1}, two[] = {2};
    copy_i32_case("contiguous", nd_of(1, d1, one, one, NULL), 1000, 1000);
    copy_i32_case("every other", nd_of(1, d1, one, two, NULL), 2000, 1000);
    int64_t dt[] = {37, 53}, st_out[] = {53, 1}, st_a[] = {1, 37};
    copy_i32_case("transpose", nd_of(2, dt, st_out, st_a, NULL), 37 * 53, 37 * 53);
    int64_t db[] = {11, 13}, sbo[] = {13, 1}, sba[] = {0, 1};
    copy_i32_case("broadcast rows", nd_of(2, db, sbo, sba, NULL), 13, 11 * 13);
    copy_i32_case("rank 0", nd_of(0, NULL, NULL, NULL, NULL), 1, 1);
    /* i32 only moves: scaling or converting it is refused, as on the CPU. */
    void *g = put(NULL, 64);
    mw__k_copy k = {.alpha = 2.0f,
                    .out_dtype = MW_I32,
                    .a_dtype = MW_I32,
                    .nd = nd_of(1, d1, one, one, NULL),
                    .out = g,
                    .a = g};
    cr_assert_eq(gpu.vt->copy(&gpu, &k), MW_ERR_DTYPE, "%s", mw_last_error());
    k.alpha = 1.0f, k.out_dtype = MW_F32;
    cr_assert_eq(gpu.vt->copy(&gpu, &k), MW_ERR_DTYPE, "%s", mw_last_error());
}

Test(gpu, fill_and_sgd) {
    NEED_GPU();
    int64_t n = 100003;
    float *ref = on_both(zeros(n), n);
    float values[] = {1.5f, 0.0f, -0.0f};
    for (int v = 0; v < 3; v++) {
        both_fill((mw__k_fill){.value = values[v], .count = n, .out = ref});
        float *got = gpu_result(ref, n);
        expect_equal("fill", got, ref, n);
        for (int64_t i = 0; i < n; i += 997)
            cr_assert_eq(signbit(got[i]), signbit(ref[i]), "fill: sign of element %lld",
                         (long long)i);
    }
    /* p - lr g: the GPU may fuse it into one rounding, the CPU rounds twice: they differ by at
     * most one rounding of each, 2 ulp of |p| + |lr g|. */
    float *p = on_both(rand_floats(n, -1, 1), n), *g = on_both(rand_floats(n, -10, 10), n);
    float *p0 = gpu_result(p, n);
    both_sgd((mw__k_sgd){.lr = 0.01f, .count = n, .p = p, .g = g});
    double *tol = host_alloc((size_t)n * sizeof *tol);
    for (int64_t i = 0; i < n; i++) tol[i] = 2.0 * FLT_EPSILON * (fabs(p0[i]) + fabs(0.01 * g[i]));
    expect_close("sgd", gpu_result(p, n), p, n, tol, 0, 0);
}

Test(gpu, gelu_and_its_gradient) {
    NEED_GPU();
    int64_t n = 100003;
    float *x = on_both(rand_floats(n, -6, 6), n), *gy = on_both(rand_floats(n, -2, 2), n);
    float *ref = on_both(zeros(n), n);
    /* Same formula on both; the GPU fuses multiply-adds inside mw__expf's polynomial and the
     * GELU expression, the CPU does not: a few ulps of the result, plus the tanh's ~1e-7
     * absolute error times |x| / 2 on each side, hence 4e-7 (1 + |x|) + 4 ulp. */
    both_unary((mw__k_unary){.op = MW__UN_GELU, .count = n, .out = ref, .a = x});
    double *tol = host_alloc((size_t)n * sizeof *tol);
    for (int64_t i = 0; i < n; i++)
        tol[i] = 4e-7 * (1.0 + fabs(x[i])) + 4.0 * FLT_EPSILON * fabs(ref[i]);
    expect_close("gelu", gpu_result(ref, n), ref, n, tol, 0, 0);
    /* The derivative: where tanh saturates, 1 + t and 1 - t^2 keep only ulp(1) = 6e-8, times
     * 0.5 |x| du/dx (see tests/devices/test_kernel_math.c); both sides may err so, hence twice
     * that bound, times |gy|, and an ulp of the product each side. */
    both_unary_grad(
        (mw__k_unary_grad){.op = MW__UN_GELU, .count = n, .out = ref, .gy = gy, .x = x});
    for (int64_t i = 0; i < n; i++) {
        double du = 0.7978845608 * (1.0 + 3.0 * 0.044715 * x[i] * x[i]);
        tol[i] = fabs(gy[i]) * 2.0 * 2.4e-7 * (1.0 + 0.5 * fabs(x[i]) * du) +
                 2.0 * FLT_EPSILON * fabs(ref[i]) + 1e-30;
    }
    expect_close("gelu gradient", gpu_result(ref, n), ref, n, tol, 0, 0);
}

Test(gpu, exact_gelu_against_float64) {
    NEED_GPU();
    int64_t n = 100003;
    float *x = rand_floats(n, -6, 6), *gy = rand_floats(n, -2, 2);
    float *gx = putf(x, n), *ggy = putf(gy, n), *gout = putf(zeros(n), n);
    /* CUDA's erfcf and the CPU's libm differ by a few ulp; both against float64: the argument's
     * rounding amplified by 2 z^2 + 1 (z = x / sqrt 2 <= 4.3), erfcf's error and two roundings. */
    double *want = host_alloc((size_t)n * sizeof *want), *dwant = host_alloc((size_t)n * 8);
    double *tol = host_alloc((size_t)n * sizeof *tol), *dtol = host_alloc((size_t)n * 8);
    float *ref = zeros(n);
    for (int64_t i = 0; i < n; i++) {
        double v = x[i], z = v / sqrt(2.0), amp = 2.0 * z * z + 1.0;
        want[i] = 0.5 * v * erfc(-z);
        dwant[i] = gy[i] * (0.5 * erfc(-z) + v * exp(-0.5 * v * v) / sqrt(6.283185307179586));
        tol[i] = (amp + 8.0) * FLT_EPSILON * fabs(want[i]) + 1e-30;
        dtol[i] = (amp + 8.0) * FLT_EPSILON * (fabs(gy[i]) * (1.0 + fabs(v))) + 1e-30;
    }
    mw__k_unary u = {.op = MW__UN_GELU_ERF, .count = n, .out = gout, .a = gx};
    OK(gpu.vt->unary(&gpu, &u));
    float *got = getf(gout, n);
    for (int64_t i = 0; i < n; i++) ref[i] = (float)want[i];
    expect_close("exact gelu", got, ref, n, tol, 0, 0);
    mw__k_unary_grad ug = {.op = MW__UN_GELU_ERF, .count = n, .out = gout, .gy = ggy, .x = gx};
    OK(gpu.vt->unary_grad(&gpu, &ug));
    got = getf(gout, n);
    for (int64_t i = 0; i < n; i++) ref[i] = (float)dwant[i];
    expect_close("exact gelu gradient", got, ref, n, dtol, 0, 0);
}

Test(gpu, adamw) {
    NEED_GPU();
    int64_t n = 100003;
    float *p = on_both(rand_floats(n, -1, 1), n), *m = on_both(rand_floats(n, -0.1, 0.1), n);
    float *v = on_both(rand_floats(n, 0, 0.01), n), *g = on_both(rand_floats(n, -1, 1), n);
    float *p0 = gpu_result(p, n), *m0 = gpu_result(m, n), *v0 = gpu_result(v, n);
    both_adamw((mw__k_adamw){.count = n,
                             .lr = 1e-3f,
                             .beta1 = 0.9f,
                             .beta2 = 0.95f,
                             .eps = 1e-8f,
                             .weight_decay = 0.1f,
                             .bias1 = 0.271f,
                             .bias2 = 0.142625f,
                             .grad_scale = 0.5f,
                             .p = p,
                             .m = m,
                             .v = v,
                             .g = g});
    /* Same formula; fused multiply-adds round some sums of products once instead of twice: m and
     * v differ by an ulp or two of their two terms; p by a few ulps of |p| and of the update
     * lr |mhat / (sqrt(vhat) + eps) + wd p|, whose ratio inherits the ulps of m and v. */
    double *tm = host_alloc((size_t)n * sizeof *tm), *tv = host_alloc((size_t)n * sizeof *tv);
    double *tp = host_alloc((size_t)n * sizeof *tp);
    for (int64_t i = 0; i < n; i++) {
        double gs = 0.5 * g[i];
        tm[i] = 4.0 * FLT_EPSILON * (0.9 * fabs(m0[i]) + 0.1 * fabs(gs));
        tv[i] = 4.0 * FLT_EPSILON * (0.95 * v0[i] + 0.05 * gs * gs) + 1e-30;
        double mh = (0.9 * m0[i] + 0.1 * gs) / 0.271,
               vh = (0.95 * v0[i] + 0.05 * gs * gs) / 0.142625;
        double upd = 1e-3 * fabs(mh / (sqrt(vh) + 1e-8) + 0.1 * p0[i]);
        tp[i] = 8.0 * FLT_EPSILON * (fabs(p0[i]) + upd);
    }
    expect_close("adamw m", gpu_result(m, n), m, n, tm, 0, 0);
    expect_close("adamw v", gpu_result(v, n), v, n, tv, 0, 0);
    expect_close("adamw p", gpu_result(p, n), p, n, tp, 0, 0);
}

/* --- reductions ------------------------------------------------------------------------------- */

static void reduce_case(const char *what, mw__nd nd, float alpha, int64_t na, int64_t nout) {
    float *a = on_both(rand_floats(na, -1, 1), na);
    float *ref = on_both_as(zeros(nout), rand_floats(nout, 5, 6), nout); /* garbage first */
    mw__k_reduce k = {.alpha = alpha, .nd = nd, .out_count = nout, .out = ref, .a = a};
    both_reduce(k);
    /* Per output: terms n and sum |term|, for the summation bound. */
    double *abs_sum = host_alloc((size_t)nout * sizeof *abs_sum);
    int64_t *terms = host_alloc((size_t)nout * sizeof *terms);
    for (int64_t i = 0, total = nd_count(&nd); i < total; i++) {
        int64_t o = nd_offset(&nd, 0, i);
        abs_sum[o] += fabs(alpha * a[nd_offset(&nd, 1, i)]);
        terms[o]++;
    }
    double *tol = host_alloc((size_t)nout * sizeof *tol);
    for (int64_t o = 0; o < nout; o++) tol[o] = (double)(terms[o] + 1) * FLT_EPSILON * abs_sum[o];
    expect_close(what, gpu_result(ref, nout), ref, nout, tol, 0, 0);
    /* Deterministic: a second run gives the same bits. */
    float *first = gpu_result(ref, nout);
    on_gpu_reduce(k);
    expect_equal("reduce rerun", gpu_result(ref, nout), first, nout);
}

Test(gpu, reduce_matches_cpu) {
    NEED_GPU();
    /* dims, out's strides (0 along a reduced dim) and a's; alpha; a's and out's elements. */
    static const struct {
        const char *what;
        int rank;
        int64_t dims[3], out_stride[3], a_stride[3];
        float alpha;
        int64_t na, nout;
    } cases[] = {
        {"column sums", 2, {1000, 37}, {0, 1}, {37, 1}, 0.25f, 37000, 37},  /* of [1000, 37] */
        {"row sums", 2, {300, 1000}, {1, 0}, {1000, 1}, 1.0f, 300000, 300}, /* of [300, 1000] */
        {"full sum", 1, {1000003}, {0}, {1}, 1.0f / 1000003, 1000003, 1},   /* into one scalar */
        {"middle dim", 3, {7, 500, 9}, {9, 0, 1}, {4500, 9, 1}, 1.0f, 31500, 63},
        /* dims 0 and 2 of [20, 30, 40]: two reduced dims */
        {"outer and inner dims", 3, {20, 30, 40}, {0, 1, 0}, {1200, 40, 1}, 2.0f, 24000, 30},
        /* a transposed walk: a stored [37, 1000], summed over its rows */
        {"transposed", 2, {1000, 37}, {0, 1}, {1, 1000}, 1.0f, 37000, 37},
        {"no reduced dim", 2, {5, 7}, {7, 1}, {7, 1}, 3.0f, 35, 35}, /* a scaled copy */
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        reduce_case(
            cases[c].what,
            nd_of(cases[c].rank, cases[c].dims, cases[c].out_stride, cases[c].a_stride, NULL),
            cases[c].alpha, cases[c].na, cases[c].nout);
}

/* The exact sum of squares: the GPU's bins, filled by blocks and threads in any order with
 * atomics, hold the CPU's bits exactly; also accumulated across calls, over values of every
 * exponent (subnormals included), and with NaNs and infinities counted. */
Test(gpu, sumsq_matches_cpu) {
    NEED_GPU();
    static const int64_t counts[] = {0, 5, 65536, 65537, 1000003};
    mw__sqacc ref, got;
    memset(&ref, 0, sizeof ref);
    put(&ref, sizeof ref);
    for (int c = 0; c < 5; c++) {
        int64_t n = counts[c];
        float *a = rand_floats(n, -2, 2);
        for (int64_t i = 0; i < n; i += 3) a[i] = ldexpf(a[i], (int)(i % 280) - 150);
        if (c == 4) a[77] = INFINITY, a[999999] = NAN;
        on_both(a, n);
        both_sumsq((mw__k_sumsq){.count = n, .out = &ref, .a = a, .zero = 1});
        /* again, into the same bins: a third, then the rest */
        both_sumsq((mw__k_sumsq){.count = n / 3, .out = &ref, .a = a, .zero = 0});
        get(&got, twin(&ref), sizeof got);
        cr_assert(memcmp(&ref, &got, sizeof ref) == 0, "n = %lld: the GPU's bins differ",
                  (long long)n);
        if (c == 4) cr_assert(isnan(mw__sqacc_value(&got)));
    }
}

/* --- gemm ------------------------------------------------------------------------------------- */

static void gemm_case(int64_t batch, int64_t m, int64_t n, int64_t kk, int ta, int tb, int pad) {
    int64_t ra = ta ? kk : m, ca = ta ? m : kk, rb = tb ? n : kk, cb = tb ? kk : n;
    int64_t lda = ca + pad, ldb = cb + pad, ldc = n + pad;
    int64_t sa = ra * lda + 5, sb = rb * ldb + 3, sc = m * ldc + 7;
    float *a = on_both(rand_floats(batch * sa, -1, 1), batch * sa);
    float *b = on_both(rand_floats(batch * sb, -1, 1), batch * sb);
    float *ref = on_both(zeros(batch * sc), batch * sc);
    both_gemm((mw__k_gemm){.batch = batch,
                           .m = m,
                           .n = n,
                           .k = kk,
                           .trans_a = ta,
                           .trans_b = tb,
                           .lda = lda,
                           .ldb = ldb,
                           .ldc = ldc,
                           .stride_a = sa,
                           .stride_b = sb,
                           .stride_c = sc,
                           .c = ref,
                           .a = a,
                           .b = b});
    float *got = gpu_result(ref, batch * sc);
    /* Dot products of length K in any order (and with fused multiply-adds): the difference is
     * at most (K + 1) FLT_EPSILON sum |a_il b_lj|. Padding elements must stay 0. */
    for (int64_t bi = 0; bi < batch; bi++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0;
                for (int64_t l = 0; l < kk; l++) {
                    float x = ta ? a[bi * sa + l * lda + i] : a[bi * sa + i * lda + l];
                    float y = tb ? b[bi * sb + j * ldb + l] : b[bi * sb + l * ldb + j];
                    s += fabs((double)x * y);
                }
                int64_t at = bi * sc + i * ldc + j;
                double tol = (double)(kk + 1) * FLT_EPSILON * s;
                cr_assert(fabs((double)got[at] - ref[at]) <= tol,
                          "gemm %lldx%lldx%lld ta %d tb %d: C[%lld][%lld][%lld] is %.9g on the "
                          "GPU and %.9g on the CPU (tolerance %.3g)",
                          (long long)m, (long long)n, (long long)kk, ta, tb, (long long)bi,
                          (long long)i, (long long)j, got[at], ref[at], tol);
            }
    for (int64_t bi = 0; bi < batch; bi++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = n; j < ldc; j++)
                cr_assert_eq(got[bi * sc + i * ldc + j], 0.0f, "gemm wrote into C's padding");
}

Test(gpu, gemm_matches_cpu) {
    NEED_GPU();
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gemm_case(3, 33, 17, 65, ta, tb, 3);
            gemm_case(1, 64, 64, 64, ta, tb, 0);
        }
    /* The CPU's vector paths: contiguous vectors, so no padding. */
    gemm_case(2, 1, 40, 50, 0, 0, 0);
    gemm_case(2, 1, 40, 50, 0, 1, 0);
    gemm_case(2, 40, 1, 50, 0, 0, 0);
    gemm_case(2, 40, 1, 50, 1, 0, 0);
    gemm_case(1, 1, 1, 64, 0, 1, 0);
}

/* --- layer norm ------------------------------------------------------------------------------- */

/* Row mean and rstd in double, for tolerances. */
static void stats(const float *x, int64_t n, float eps, double *mean, double *rstd) {
    double s = 0, q = 0;
    for (int64_t j = 0; j < n; j++) s += x[j];
    *mean = s / (double)n;
    for (int64_t j = 0; j < n; j++) q += (x[j] - *mean) * (x[j] - *mean);
    *rstd = 1.0 / sqrt(q / (double)n + eps);
}

static float *ln_input(int64_t rows, int64_t n) {
    float *x = rand_floats(rows * n, -2, 2);
    for (int64_t r = 0; r < rows; r++) {
        float shift = (float)uniform(-3, 3); /* rows with a mean away from 0 */
        for (int64_t j = 0; j < n; j++) x[r * n + j] += shift;
    }
    return x;
}

Test(gpu, layernorm_forward_and_input_gradient) {
    NEED_GPU();
    static const int64_t shapes[][2] = {{37, 300}, {5, 1000}, {64, 5}};
    for (int s = 0; s < 3; s++) {
        int64_t rows = shapes[s][0], n = shapes[s][1], len = rows * n;
        float eps = 1e-5f;
        float *x = on_both(ln_input(rows, n), len), *w = on_both(rand_floats(n, 0.5, 1.5), n);
        float *b = on_both(rand_floats(n, -0.5, 0.5), n),
              *gy = on_both(rand_floats(len, -1, 1), len);
        float *ref = on_both(zeros(len), len);
        both_layernorm((mw__k_layernorm){
            .rows = rows, .n = n, .eps = eps, .out = ref, .x = x, .w = w, .b = b});
        /* Mean and rstd are summed in double on both sides and rounded to float: they agree to
         * an ulp; the row formula has 3 roundings (2 when fused). So 8 ulp of the terms:
         * |xhat w| + |b| + ulp(mean) rstd |w|. */
        double *tol = host_alloc((size_t)len * sizeof *tol);
        for (int64_t r = 0; r < rows; r++) {
            double mean, rstd;
            stats(x + r * n, n, eps, &mean, &rstd);
            for (int64_t j = 0; j < n; j++) {
                double xhat = (x[r * n + j] - mean) * rstd;
                tol[r * n + j] =
                    8.0 * FLT_EPSILON *
                    (fabs(xhat * w[j]) + fabs(b[j]) + (fabs(mean) + 1.0) * rstd * w[j]);
            }
        }
        expect_close("layernorm", gpu_result(ref, len), ref, len, tol, 0, 0);

        both_layernorm_dx((mw__k_layernorm_grad){
            .rows = rows, .n = n, .eps = eps, .out = ref, .gy = gy, .x = x, .w = w});
        /* dx = rstd (dy - c1 - xhat c2): c1, c2 are double means rounded to float (an ulp each,
         * ulp of |dy| and |xhat c2| after cancellation); 8 ulp of rstd (|dy| + |c1| + |xhat c2|)
         * plus the mean/rstd ulps as above. */
        for (int64_t r = 0; r < rows; r++) {
            double mean, rstd, c1 = 0, c2 = 0;
            stats(x + r * n, n, eps, &mean, &rstd);
            for (int64_t j = 0; j < n; j++) {
                double dy = (double)gy[r * n + j] * w[j];
                c1 += dy;
                c2 += dy * (x[r * n + j] - mean) * rstd;
            }
            c1 /= (double)n;
            c2 /= (double)n;
            for (int64_t j = 0; j < n; j++) {
                double dy = (double)gy[r * n + j] * w[j], xhat = (x[r * n + j] - mean) * rstd;
                tol[r * n + j] =
                    8.0 * FLT_EPSILON * rstd *
                    (fabs(dy) + fabs(c1) + fabs(xhat * c2) + (fabs(mean) + 1.0) * rstd * fabs(c2));
            }
        }
        expect_close("layernorm dx", gpu_result(ref, len), ref, len, tol, 0, 0);
    }
}

Test(gpu, layernorm_weight_gradient) {
    NEED_GPU();
    /* Many rows (split over blocks), a row too wide for shared memory, a single row. */
    static const int64_t shapes[][2] = {{3000, 200}, {40, 13000}, {1, 7}};
    for (int s = 0; s < 3; s++) {
        int64_t rows = shapes[s][0], n = shapes[s][1], len = rows * n;
        float eps = 1e-5f;
        float *x = on_both(ln_input(rows, n), len), *gy = on_both(rand_floats(len, -1, 1), len);
        float *ref = on_both_as(zeros(n), rand_floats(n, 1, 2), n);
        mw__k_layernorm_grad d = {
            .rows = rows, .n = n, .eps = eps, .out = ref, .gy = gy, .x = x, .w = NULL};
        both_layernorm_dw(d);
        /* Each term gy (x - mean) rstd agrees to ~4 ulp of |gy| (|x| + |mean|) rstd (the float
         * mean and rstd may differ by an ulp); the sums over rows by the summation bound. */
        double *tol = host_alloc((size_t)n * sizeof *tol);
        for (int64_t r = 0; r < rows; r++) {
            double mean, rstd;
            stats(x + r * n, n, eps, &mean, &rstd);
            for (int64_t j = 0; j < n; j++)
                tol[j] += fabs(gy[r * n + j]) * (fabs(x[r * n + j]) + fabs(mean)) * rstd;
        }
        for (int64_t j = 0; j < n; j++) tol[j] *= (double)(rows + 8) * FLT_EPSILON;
        expect_close("layernorm dw", gpu_result(ref, n), ref, n, tol, 0, 0);
        float *first = gpu_result(ref, n);
        on_gpu_layernorm_dw(d);
        expect_equal("layernorm dw rerun", gpu_result(ref, n), first, n);
    }
}

/* got (n sums) against the column sums of a (rows x n, host) in double, within the summation
 * bound of float sums: (rows + 8) eps sum |a|. */
static void expect_column_sums(const char *what, const float *got, const float *a, int64_t rows,
                               int64_t n) {
    float *ref = zeros(n);
    double *tol = host_alloc((size_t)n * sizeof *tol), *sum = host_alloc((size_t)n * sizeof *sum);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n; j++) {
            sum[j] += a[r * n + j];
            tol[j] += fabs(a[r * n + j]);
        }
    for (int64_t j = 0; j < n; j++) {
        ref[j] = (float)sum[j];
        tol[j] *= (double)(rows + 8) * FLT_EPSILON;
    }
    expect_close(what, got, ref, n, tol, 0, 0);
}

/* The dx kernel given dw and db (the plan's layer-norm gradients in one instruction) writes the
 * dx, dw of the separate kernels bit for bit, and db as the CPU's column sums of gy within the
 * summation bound. */
Test(gpu, layernorm_gradients_in_one_instruction) {
    NEED_GPU();
    static const int64_t shapes[][2] = {{3000, 200}, {37, 300}, {1, 7}};
    for (int s = 0; s < 3; s++) {
        int64_t rows = shapes[s][0], n = shapes[s][1], len = rows * n;
        float *x = ln_input(rows, n), *gy = rand_floats(len, -1, 1), *w = rand_floats(n, 0.5, 1.5);
        float *gx = putf(x, len), *ggy = putf(gy, len), *gw = putf(w, n);
        float *dx1 = putf(zeros(len), len), *dx2 = putf(zeros(len), len);
        float *dw1 = putf(zeros(n), n), *dw2 = putf(rand_floats(n, 1, 2), n);
        float *db = putf(rand_floats(n, 1, 2), n);
        mw__k_layernorm_grad d = {
            .rows = rows, .n = n, .eps = 1e-5f, .out = dx1, .gy = ggy, .x = gx, .w = gw};
        OK(gpu.vt->layernorm_dx(&gpu, &d));
        d.out = dw1;
        d.w = NULL;
        OK(gpu.vt->layernorm_dw(&gpu, &d));
        d.out = dx2;
        d.w = gw;
        d.dw = dw2;
        d.db = db;
        OK(gpu.vt->layernorm_dx(&gpu, &d));
        expect_equal("layernorm dx with dw, db", getf(dx2, len), getf(dx1, len), len);
        expect_equal("layernorm dw beside dx", getf(dw2, n), getf(dw1, n), n);
        expect_column_sums("layernorm db beside dx", getf(db, n), gy, rows, n);
        /* With an addend: addend + dx, as the binary kernel adds them. */
        float *ad = rand_floats(len, -1, 1), *gad = putf(ad, len), *dx3 = putf(zeros(len), len);
        float *want = getf(dx1, len);
        for (int64_t i = 0; i < len; i++) want[i] = ad[i] + want[i];
        d.out = dx3;
        d.addend = gad;
        OK(gpu.vt->layernorm_dx(&gpu, &d));
        expect_equal("layernorm dx + addend", getf(dx3, len), want, len);
    }
}

/* The GELU gradient given colsum (a bias gradient the plan folded in) writes what it writes
 * without, and the column sums of that within the summation bound of the CPU's. */
Test(gpu, gelu_gradient_with_column_sums) {
    NEED_GPU();
    static const int64_t shapes[][2] = {{2048, 1024}, {37, 13}, {1, 5}};
    for (int s = 0; s < 3; s++) {
        int64_t rows = shapes[s][0], cols = shapes[s][1], len = rows * cols;
        float *x = rand_floats(len, -4, 4), *gy = rand_floats(len, -1, 1);
        float *gx = putf(x, len), *ggy = putf(gy, len);
        float *o1 = putf(zeros(len), len), *o2 = putf(zeros(len), len);
        float *gs = putf(rand_floats(cols, 1, 2), cols);
        mw__k_unary_grad k = {.op = MW__UN_GELU, .count = len, .out = o1, .gy = ggy, .x = gx};
        OK(gpu.vt->unary_grad(&gpu, &k));
        k.out = o2;
        k.cols = cols;
        k.colsum = gs;
        OK(gpu.vt->unary_grad(&gpu, &k));
        float *got = getf(o2, len);
        expect_equal("gelu grad with column sums", got, getf(o1, len), len);
        expect_column_sums("gelu grad column sums", getf(gs, cols), got, rows, cols);
    }
}

/* --- softmax ---------------------------------------------------------------------------------- */

Test(gpu, softmax_and_its_gradient) {
    NEED_GPU();
    /* outer, s, k, causal: causal with k > s (an offset), square, plain rows longer than a
     * warp, and k < s (the first rows see nothing). */
    static const int64_t cases[][4] = {
        {3, 17, 40, 1}, {2, 33, 33, 1}, {4, 5, 1000, 0}, {2, 8, 4, 1}};
    static const float scales[] = {0.125f, 1.0f, 0.5f, 1.0f};
    for (int c = 0; c < 4; c++) {
        int64_t outer = cases[c][0], s = cases[c][1], k = cases[c][2], len = outer * s * k;
        int causal = (int)cases[c][3];
        float *a = on_both(rand_floats(len, -4, 4), len);
        float *ref = on_both_as(zeros(len), rand_floats(len, 1, 2), len);
        both_softmax((mw__k_softmax){.outer = outer,
                                     .s = s,
                                     .k = k,
                                     .causal = causal,
                                     .scale = scales[c],
                                     .out = ref,
                                     .a = a});
        /* out = expf(scale a - max) * (float)(1 / double sum): the GPU may fuse the argument
         * (half an ulp of |scale a| <= 4, so 2.4e-7 relative after exp), expf is within 2 ulp on
         * the GPU and 1 on the host, the reciprocal within an ulp, one product each side: under
         * 9 ulp relative; 16 ulp. Masked columns: exactly 0 on both. */
        expect_close("softmax", gpu_result(ref, len), ref, len, NULL, 0, 16.0 * FLT_EPSILON);

        /* Both gradients from the CPU's probabilities (ref, uploaded again), the GPU's into the
         * values its softmax wrote. */
        float *gy = on_both(rand_floats(len, -1, 1), len);
        float *gref = on_both_as(zeros(len), gpu_result(ref, len), len);
        on_both(ref, len);
        both_softmax_grad((mw__k_softmax_grad){.outer = outer,
                                               .s = s,
                                               .k = k,
                                               .causal = causal,
                                               .scale = scales[c],
                                               .out = gref,
                                               .gy = gy,
                                               .p = ref});
        /* scale p (gy - dot), dot summed in double and rounded: (gy - dot) is good to an ulp of
         * |gy| + |dot| each side, then two products: 4 ulp of scale p (|gy| + |dot|). */
        double *tol = host_alloc((size_t)len * sizeof *tol);
        for (int64_t r = 0; r < outer * s; r++) {
            double dot = 0;
            for (int64_t j = 0; j < k; j++) dot += (double)gy[r * k + j] * ref[r * k + j];
            for (int64_t j = 0; j < k; j++)
                tol[r * k + j] = 4.0 * FLT_EPSILON * scales[c] * ref[r * k + j] *
                                 (fabs(gy[r * k + j]) + fabs(dot));
        }
        expect_close("softmax gradient", gpu_result(gref, len), gref, len, tol, 0, 0);
    }
}

/* --- embedding -------------------------------------------------------------------------------- */

static int32_t *rand_ids(int64_t n, int32_t hi) {
    int32_t *ids = host_alloc((size_t)n * sizeof *ids);
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)uniform(0, hi);
    return ids;
}

/* The embedding and its gradient on n_ids ids against the CPU: the same bits (the gradient adds
 * rows in order of position on both sides; rows no id names are zero). */
static void embed_case(const char *what, int64_t vocab, int64_t dim, int64_t n_ids,
                       const int32_t *ids) {
    float *table = on_both(rand_floats(vocab * dim, -1, 1), vocab * dim);
    float *ref = on_both(zeros(n_ids * dim), n_ids * dim);
    ids_on_both(ids, n_ids);
    both_embed((mw__k_embed){
        .n_ids = n_ids, .vocab = vocab, .dim = dim, .out = ref, .ids = ids, .table = table});
    char label[96];
    snprintf(label, sizeof label, "embed, %s", what);
    expect_equal(label, gpu_result(ref, n_ids * dim), ref, n_ids * dim);

    float *gy = on_both(rand_floats(n_ids * dim, -1, 1), n_ids * dim);
    float *gref = on_both_as(zeros(vocab * dim), rand_floats(vocab * dim, 1, 2), vocab * dim);
    both_embed_grad((mw__k_embed_grad){
        .n_ids = n_ids, .vocab = vocab, .dim = dim, .out = gref, .ids = ids, .gy = gy});
    snprintf(label, sizeof label, "embed gradient, %s", what);
    expect_equal(label, gpu_result(gref, vocab * dim), gref, vocab * dim);
}

Test(gpu, embedding_and_its_gradient_exactly) {
    NEED_GPU();
    static const int64_t cases[][3] = {{50, 33, 100}, {40, 300, 500}, {3, 5, 1000}};
    for (int c = 0; c < 3; c++) {
        int64_t vocab = cases[c][0], dim = cases[c][1], n_ids = cases[c][2];
        /* A quarter of the vocabulary never occurs. */
        int32_t *ids = rand_ids(n_ids, (int32_t)(vocab > 10 ? vocab * 3 / 4 : vocab));
        embed_case("random ids", vocab, dim, n_ids, ids);
    }
}

/* Runs a kernel expected to fail on data: the error may show at the launch or at the next sync. */
static mw_status then_sync(mw_status st) { return st ? st : gpu.vt->sync(&gpu); }

Test(gpu, bad_embedding_id_fails_at_sync) {
    NEED_GPU();
    int64_t vocab = 50, dim = 8, n = 20;
    int32_t *ids = rand_ids(n, 50);
    ids[7] = 50;
    ids[12] = -3;
    int32_t *gids = put(ids, (size_t)n * sizeof *ids);
    float *gtable = putf(rand_floats(vocab * dim, -1, 1), vocab * dim);
    float *gout = putf(zeros(n * dim), n * dim);
    mw__k_embed e = {
        .n_ids = n, .vocab = vocab, .dim = dim, .out = gout, .ids = gids, .table = gtable};
    mw_status st = then_sync(gpu.vt->embed(&gpu, &e));
    cr_assert_eq(st, MW_ERR_INVALID, "got %s", mw_status_name(st));
    /* The first bad position is reported, with its id and the vocabulary. */
    const char *msg = mw_last_error();
    cr_assert(strstr(msg, "cuda:0") && strstr(msg, "id 50") && strstr(msg, "position 7") &&
                  strstr(msg, "[0, 50)"),
              "message: %s", msg);
    /* Reported once: the device is usable again. */
    ids[7] = 1;
    ids[12] = 2;
    OK(gpu.vt->upload(&gpu, gids, ids, (size_t)n * sizeof *ids));
    OK(then_sync(gpu.vt->embed(&gpu, &e)));
    /* The gradient checks ids too. */
    ids[3] = 99;
    OK(gpu.vt->upload(&gpu, gids, ids, (size_t)n * sizeof *ids));
    float *gg = putf(zeros(vocab * dim), vocab * dim);
    mw__k_embed_grad g = {
        .n_ids = n, .vocab = vocab, .dim = dim, .out = gg, .ids = gids, .gy = gout};
    st = then_sync(gpu.vt->embed_grad(&gpu, &g));
    cr_assert_eq(st, MW_ERR_INVALID, "got %s", mw_status_name(st));
    cr_assert(strstr(mw_last_error(), "id 99 at position 3"), "message: %s", mw_last_error());
}

/* --- cross-entropy ---------------------------------------------------------------------------- */

Test(gpu, cross_entropy_and_its_gradient) {
    NEED_GPU();
    static const int64_t cases[][3] = {{20, 1000, 997}, {7, 50304, 50257}, {3, 5, 5}};
    for (int c = 0; c < 3; c++) {
        int64_t rows = cases[c][0], v = cases[c][1], valid = cases[c][2];
        float *logits = on_both(rand_floats(rows * v, -5, 5), rows * v);
        const int32_t *t = ids_on_both(rand_ids(rows, (int32_t)valid), rows);
        float *ref = on_both(zeros(rows), rows);
        both_xent((mw__k_xent){
            .rows = rows, .v = v, .valid = valid, .out = ref, .logits = logits, .targets = t});
        /* lse - l[t] with lse in double on both sides (the GPU sums float expf, within 2 ulp
         * each): lse agrees to ~3 ulp(1) absolute; one rounding of the result. */
        expect_close("cross-entropy", gpu_result(ref, rows), ref, rows, NULL, 4e-7,
                     2.0 * FLT_EPSILON);

        float *gy = on_both(rand_floats(rows, -2, 2), rows);
        float *gref = on_both_as(zeros(rows * v), rand_floats(rows * v, 1, 2), rows * v);
        both_xent_grad((mw__k_xent_grad){.rows = rows,
                                         .v = v,
                                         .valid = valid,
                                         .out = gref,
                                         .gy = gy,
                                         .logits = logits,
                                         .targets = t});
        /* softmax_j = e^(l_j - lse): both form the exponent in double; the GPU rounds it to
         * float (half an ulp of a value below 32: |l| <= 5, lse <= 5 + log v < 16, so < 1e-6
         * absolute, 1e-6 relative after the exponential) and calls expf (2 ulp), the host rounds
         * e^(.) once: 4e-6 relative of |gy| p_j is twice that, plus an ulp of 1 each side where
         * the target's 1 is subtracted. */
        double *tol = host_alloc((size_t)(rows * v) * sizeof *tol);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < v; j++) {
                double p = gy[r] != 0 ? gref[r * v + j] / gy[r] + (j == t[r]) : 0;
                tol[r * v + j] =
                    fabs(gy[r]) * (4e-6 * fabs(p) + (j == t[r] ? 2.0 * FLT_EPSILON : 0)) + 1e-30;
            }
        expect_close("cross-entropy gradient", gpu_result(gref, rows * v), gref, rows * v, tol, 0,
                     0);
    }
}

Test(gpu, bad_target_fails_at_sync) {
    NEED_GPU();
    int64_t rows = 4, v = 10, valid = 8;
    int32_t t[4] = {1, 2, 9, 3};
    float *gl = putf(rand_floats(rows * v, -1, 1), rows * v), *gout = putf(zeros(rows), rows);
    int32_t *gt = put(t, sizeof t);
    mw__k_xent x = {.rows = rows, .v = v, .valid = valid, .out = gout, .logits = gl, .targets = gt};
    mw_status st = then_sync(gpu.vt->xent(&gpu, &x));
    cr_assert_eq(st, MW_ERR_INVALID, "got %s", mw_status_name(st));
    cr_assert(strstr(mw_last_error(), "target 9 at position 2") &&
                  strstr(mw_last_error(), "[0, 8)"),
              "message: %s", mw_last_error());
    t[2] = 7;
    OK(gpu.vt->upload(&gpu, gt, t, sizeof t));
    OK(then_sync(gpu.vt->xent(&gpu, &x)));
}

/* --- what a real run touches ------------------------------------------------------------------ */

Test(gpu, staging_through_page_locked_memory) {
    NEED_GPU();
    /* The trainer's input path: a page-locked buffer, copies queued without waiting, then the
     * kernels that read them. */
    int64_t n = 300007;
    float *pinned = NULL;
    OK(gpu.vt->host_alloc(&gpu, (size_t)n * sizeof(float), (void **)&pinned));
    cr_assert_not_null(pinned);
    for (int64_t i = 0; i < n; i++) pinned[i] = (float)i * 0.5f;
    float *d = putf(zeros(n), n), *d2 = putf(zeros(n), n);
    OK(gpu.vt->upload_async(&gpu, d, pinned, (size_t)n * sizeof(float)));
    OK(gpu.vt->upload_async(&gpu, d2, pinned + 1, (size_t)(n - 1) * sizeof(float)));
    int64_t one[] = {1}, dims[] = {n};
    mw__k_binary k = {
        .op = MW__BIN_ADD, .nd = nd_of(1, dims, one, one, one), .out = d, .a = d, .b = d2};
    OK(gpu.vt->binary(&gpu, &k));
    float *got = getf(d, n);
    for (int64_t i = 0; i < n - 1; i++)
        cr_assert_eq(got[i], (float)i * 0.5f + (float)(i + 1) * 0.5f, "element %lld", (long long)i);
    cr_assert_eq(got[n - 1], (float)(n - 1) * 0.5f);
    gpu.vt->host_free(&gpu, pinned);
    OK(gpu.vt->upload_async(&gpu, d, NULL, 0)); /* nothing to copy: nothing happens */
}

Test(gpu, gemm_with_empty_k_writes_zeros) {
    NEED_GPU();
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) gemm_case(3, 7, 5, 0, ta, tb, 2);
}

/* Row kernels loop once their rows pass the grid's 65,535 blocks (and the warp-per-row kernels
 * their 8,192 blocks): every row must still be computed. */
Test(gpu, rows_past_the_grid_limit) {
    NEED_GPU();
    int64_t rows = 70001, n = 8;
    float *x = on_both(ln_input(rows, n), rows * n), *w = on_both(rand_floats(n, 0.5, 1.5), n);
    float *b = on_both(rand_floats(n, -1, 1), n), *ref = on_both(zeros(rows * n), rows * n);
    both_layernorm(
        (mw__k_layernorm){.rows = rows, .n = n, .eps = 1e-5f, .out = ref, .x = x, .w = w, .b = b});
    /* Same double-precision statistics: a few ulps of the output, plus 1e-6 absolute. */
    expect_close("layernorm past 65,535 rows", gpu_result(ref, rows * n), ref, rows * n, NULL, 1e-6,
                 8 * FLT_EPSILON);

    both_softmax((mw__k_softmax){
        .outer = 1, .s = rows, .k = n, .causal = 0, .scale = 1.0f, .out = ref, .a = x});
    expect_close("softmax past the grid", gpu_result(ref, rows * n), ref, rows * n, NULL, 0,
                 16 * FLT_EPSILON);

    const int32_t *t = ids_on_both(rand_ids(rows, (int32_t)n), rows);
    float *xref = on_both(zeros(rows), rows);
    both_xent(
        (mw__k_xent){.rows = rows, .v = n, .valid = n, .out = xref, .logits = x, .targets = t});
    expect_close("cross-entropy past the grid", gpu_result(xref, rows), xref, rows, NULL, 4e-7,
                 2.0 * FLT_EPSILON);

    /* Embedding and its gradient over 70,001 ids of a vocabulary of 100: long runs of each id. */
    embed_case("70,001 ids", 100, 8, rows, rand_ids(rows, 100));
}

/* Both kinds of data error, found by kernels queued one after the other: each is named with its
 * first bad position, also when both are pending at once, and a download reports them before it
 * hands back anything computed from them. */
Test(gpu, both_data_error_kinds) {
    NEED_GPU();
    int64_t vocab = 50, dim = 8, n = 20, rows = 4, v = 10, valid = 8;
    int32_t *ids = rand_ids(n, (int32_t)vocab);
    ids[11] = 77;
    int32_t t[4] = {1, 2, 9, 3};
    int32_t *gids = put(ids, (size_t)n * sizeof *ids), *gt = put(t, sizeof t);
    float *gtable = putf(rand_floats(vocab * dim, -1, 1), vocab * dim);
    float *gemb = putf(zeros(n * dim), n * dim);
    float *gl = putf(rand_floats(rows * v, -1, 1), rows * v), *gxe = putf(zeros(rows), rows);
    mw__k_embed e = {
        .n_ids = n, .vocab = vocab, .dim = dim, .out = gemb, .ids = gids, .table = gtable};
    mw__k_xent x = {.rows = rows, .v = v, .valid = valid, .out = gxe, .logits = gl, .targets = gt};
    const char *id_msg = "embedding id 77 at position 11", *t_msg = "target 9 at position 2";
    mw_status st = gpu.vt->embed(&gpu, &e);
    if (st == MW_OK) {
        /* The xent kernel is queued before any check reads the flag, so the report (at its
         * launch or at the download) names both. */
        st = gpu.vt->xent(&gpu, &x);
        if (st == MW_OK) {
            float host[4];
            st = gpu.vt->download(&gpu, host, gxe, sizeof host);
        }
        cr_assert_eq(st, MW_ERR_INVALID, "got %s: %s", mw_status_name(st), mw_last_error());
        cr_assert(strstr(mw_last_error(), id_msg) && strstr(mw_last_error(), t_msg), "message: %s",
                  mw_last_error());
    } else {
        /* The flag was seen at the embedding's own launch: only it ran. */
        cr_assert_eq(st, MW_ERR_INVALID, "got %s: %s", mw_status_name(st), mw_last_error());
        cr_assert(strstr(mw_last_error(), id_msg), "message: %s", mw_last_error());
        st = then_sync(gpu.vt->xent(&gpu, &x));
        cr_assert_eq(st, MW_ERR_INVALID, "got %s", mw_status_name(st));
        cr_assert(strstr(mw_last_error(), t_msg), "message: %s", mw_last_error());
    }
    /* Reported once, then cleared: good data runs. */
    ids[11] = 1;
    t[2] = 7;
    OK(gpu.vt->upload(&gpu, gids, ids, (size_t)n * sizeof *ids));
    OK(gpu.vt->upload(&gpu, gt, t, sizeof t));
    OK(then_sync(gpu.vt->embed(&gpu, &e)));
    OK(then_sync(gpu.vt->xent(&gpu, &x)));
}

/* Every kernel run twice on the same inputs gives the same bits (no atomics in float sums, an
 * order fixed by the sizes). */
Test(gpu, every_kernel_repeats_bit_for_bit) {
    NEED_GPU();
    int64_t rows = 300, n = 257, len = rows * n;
    float *x = ln_input(rows, n), *y = rand_floats(len, -1, 1), *w = rand_floats(n, 0.5, 1.5);
    float *gx = putf(x, len), *gy = putf(y, len), *gw = putf(w, n), *gb = putf(w, n);
    float *o1 = putf(zeros(len), len), *o2 = putf(zeros(len), len);
    int32_t *ids = rand_ids(rows, 40), *gids = put(ids, (size_t)rows * sizeof *ids);
    int64_t d2[] = {rows, n}, s2[] = {n, 1}, red[] = {0, 1};
    const char *names[] = {"binary",       "copy",      "reduce",       "gemm",         "gelu",
                           "gelu grad",    "layernorm", "layernorm dx", "layernorm dw", "softmax",
                           "softmax grad", "embed",     "embed grad",   "xent",         "xent grad",
                           "sumsq",        "adamw"};
    for (int kind = 0; kind < (int)(sizeof names / sizeof *names); kind++) {
        float *res[2];
        for (int rep = 0; rep < 2; rep++) {
            float *o = rep ? o2 : o1;
            switch (kind) {
            case 0: {
                mw__k_binary k = {MW__BIN_MUL, nd_of(2, d2, s2, s2, s2), o, gx, gy};
                OK(gpu.vt->binary(&gpu, &k));
            } break;
            case 1: {
                mw__k_copy k = {.alpha = 0.5f, .nd = nd_of(2, d2, s2, s2, NULL), .out = o, .a = gx};
                OK(gpu.vt->copy(&gpu, &k));
            } break;
            case 2: {
                mw__k_reduce k = {1.0f, nd_of(2, d2, red, s2, NULL), n, o, gx};
                OK(gpu.vt->reduce(&gpu, &k));
            } break;
            case 3: {
                mw__k_gemm k = {.batch = 1,
                                .m = rows,
                                .n = 200, /* C is rows x 200: within the output buffer */
                                .k = n,
                                .trans_b = 1,
                                .lda = n,
                                .ldb = n,
                                .ldc = 200,
                                .c = o,
                                .a = gx,
                                .b = gy};
                OK(gpu.vt->gemm(&gpu, &k));
            } break;
            case 4: {
                mw__k_unary k = {.op = MW__UN_GELU, .count = len, .out = o, .a = gx};
                OK(gpu.vt->unary(&gpu, &k));
            } break;
            case 5: {
                mw__k_unary_grad k = {.op = MW__UN_GELU, .count = len, .out = o, .gy = gy, .x = gx};
                OK(gpu.vt->unary_grad(&gpu, &k));
            } break;
            case 6: {
                mw__k_layernorm k = {
                    .rows = rows, .n = n, .eps = 1e-5f, .out = o, .x = gx, .w = gw, .b = gb};
                OK(gpu.vt->layernorm(&gpu, &k));
            } break;
            case 7:
            case 8: {
                mw__k_layernorm_grad k = {rows, n,    1e-5f, o, gy, gx, kind == 7 ? gw : NULL,
                                          NULL, NULL, NULL};
                OK(kind == 7 ? gpu.vt->layernorm_dx(&gpu, &k) : gpu.vt->layernorm_dw(&gpu, &k));
            } break;
            case 9: {
                mw__k_softmax k = {3, 100, n, 1, 0.3f, o, gx};
                OK(gpu.vt->softmax(&gpu, &k));
            } break;
            case 10: {
                mw__k_softmax_grad k = {3, 100, n, 1, 0.3f, o, gy, gx};
                OK(gpu.vt->softmax_grad(&gpu, &k));
            } break;
            case 11: {
                mw__k_embed k = {rows, 40, n, o, gids, gx};
                OK(gpu.vt->embed(&gpu, &k));
            } break;
            case 12: {
                mw__k_embed_grad k = {rows, 40, n, o, gids, gy};
                OK(gpu.vt->embed_grad(&gpu, &k));
            } break;
            case 13:
            case 14: {
                int32_t *gt = gids; /* ids < 40 <= valid */
                if (kind == 13) {
                    mw__k_xent k = {rows, n, 250, o, gx, gt};
                    OK(gpu.vt->xent(&gpu, &k));
                } else {
                    mw__k_xent_grad k = {rows, n, 250, o, gy, gx, gt};
                    OK(gpu.vt->xent_grad(&gpu, &k));
                }
            } break;
            case 15: {
                mw__k_sumsq k = {len, (mw__sqacc *)o, gx, 1}; /* len floats hold one */
                OK(gpu.vt->sumsq(&gpu, &k));
            } break;
            case 16: {
                /* Fresh state each repeat: p, m, v copied from the same inputs. */
                float *p = o, *m = putf(y, len), *vv = putf(w, n < len ? n : len);
                OK(gpu.vt->upload(&gpu, p, x, (size_t)len * sizeof(float)));
                mw__k_adamw k = {.count = n,
                                 .lr = 1e-3f,
                                 .beta1 = 0.9f,
                                 .beta2 = 0.95f,
                                 .eps = 1e-8f,
                                 .weight_decay = 0.1f,
                                 .bias1 = 0.1f,
                                 .bias2 = 0.05f,
                                 .grad_scale = 1.0f,
                                 .p = p,
                                 .m = m,
                                 .v = vv,
                                 .g = gy};
                OK(gpu.vt->adamw(&gpu, &k));
            } break;
            }
            res[rep] = getf(o, len);
        }
        expect_equal(names[kind], res[1], res[0], len);
    }
}

/* --- reducers --------------------------------------------------------------------------------- */

#define MAXR 4

typedef struct rank_job {
    pthread_t thread;
    const mw__reducer_vtable *R;
    mw__comm *comm;
    int rank;
    mw__device *dev;
    float *buf;
    size_t n;
    mw_status st;
    char msg[MW__MSG_SIZE];
} rank_job;

static void *rank_main(void *arg) {
    rank_job *j = arg;
    j->st = j->R->allreduce_sum(j->comm, j->rank, j->buf, j->n, MW_F32);
    snprintf(j->msg, sizeof j->msg, "%s", mw_last_error());
    return NULL;
}

/* Runs an all-reduce on p threads over devs[r]; returns every rank's result on the host (rank
 * r's at out + r n). Asserts only on this thread. */
static void run_allreduce(const mw__reducer_vtable *R, mw__comm *comm, int p, mw__device **devs,
                          float **dbufs, size_t n, float *out) {
    rank_job jobs[MAXR];
    for (int r = 0; r < p; r++) {
        jobs[r] =
            (rank_job){.R = R, .comm = comm, .rank = r, .dev = devs[r], .buf = dbufs[r], .n = n};
        cr_assert_eq(pthread_create(&jobs[r].thread, NULL, rank_main, &jobs[r]), 0);
    }
    for (int r = 0; r < p; r++) pthread_join(jobs[r].thread, NULL);
    for (int r = 0; r < p; r++) {
        cr_assert_eq(jobs[r].st, MW_OK, "%s all-reduce: rank %d got %s: %s", R->name, r,
                     mw_status_name(jobs[r].st), jobs[r].msg);
        if (n) OK(devs[r]->vt->download(devs[r], out + (size_t)r * n, dbufs[r], n * sizeof(float)));
    }
}

Test(gpu, cuda_local_reducer_sums_in_rank_order) {
    NEED_GPU();
    static const size_t lens[] = {0, 1, 7, 100003};
    for (int p = 1; p <= 3; p++) {
        mw__device devs[MAXR], *dp[MAXR];
        for (int r = 0; r < p; r++) {
            char name[32];
            snprintf(name, sizeof name, "cuda:0#%d", r);
            devs[r] = make_device(&mw__cuda_device, name, r, 0);
            OK(devs[r].vt->init(&devs[r]));
            dp[r] = &devs[r];
        }
        mw__comm *comm = NULL;
        mw__comm_options opt = {.timeout_ms = 60000};
        OK(mw__reducer_cuda_local.comm_new(p, dp, &opt, &comm));
        for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
            size_t n = lens[li];
            float *in[MAXR], *dbufs[MAXR], *out = zeros((int64_t)(n * (size_t)p) + 1);
            for (int r = 0; r < p; r++) {
                in[r] = rand_floats((int64_t)n, -1, 1);
                OK(devs[r].vt->alloc(&devs[r], n ? n * sizeof(float) : 4, (void **)&dbufs[r]));
                if (n) OK(devs[r].vt->upload(&devs[r], dbufs[r], in[r], n * sizeof(float)));
            }
            run_allreduce(&mw__reducer_cuda_local, comm, p, dp, dbufs, n, out);
            for (size_t i = 0; i < n; i++) {
                float s = in[0][i];
                for (int r = 1; r < p; r++) s += in[r][i]; /* rank order, in float */
                for (int r = 0; r < p; r++)
                    cr_assert_eq(out[(size_t)r * n + i], s,
                                 "%d ranks, n %zu: rank %d element %zu is %.9g, expected %.9g", p,
                                 n, r, i, out[(size_t)r * n + i], s);
            }
            for (int r = 0; r < p; r++) devs[r].vt->free(&devs[r], dbufs[r]);
        }
        mw__reducer_cuda_local.comm_free(comm);
        for (int r = 0; r < p; r++) devs[r].vt->shutdown(&devs[r]);
    }
}

Test(gpu, cuda_local_reducer_times_out_and_resets) {
    NEED_GPU();
    mw__device devs[2], *dp[2];
    for (int r = 0; r < 2; r++) {
        devs[r] = make_device(&mw__cuda_device, r ? "cuda:0#1" : "cuda:0#0", r, 0);
        OK(devs[r].vt->init(&devs[r]));
        dp[r] = &devs[r];
    }
    mw__comm *comm = NULL;
    mw__comm_options opt = {.timeout_ms = 200};
    OK(mw__reducer_cuda_local.comm_new(2, dp, &opt, &comm));
    float *d0, *d1, host[64];
    OK(devs[0].vt->alloc(&devs[0], sizeof host, (void **)&d0));
    OK(devs[1].vt->alloc(&devs[1], sizeof host, (void **)&d1));
    for (int i = 0; i < 64; i++) host[i] = (float)i;
    OK(devs[0].vt->upload(&devs[0], d0, host, sizeof host));
    OK(devs[1].vt->upload(&devs[1], d1, host, sizeof host));
    /* Rank 1 never comes. */
    mw_status st = mw__reducer_cuda_local.allreduce_sum(comm, 0, d0, 64, MW_F32);
    cr_assert_eq(st, MW_ERR_TIMEOUT, "got %s: %s", mw_status_name(st), mw_last_error());
    /* Aborted until reset; then a full collective works. */
    st = mw__reducer_cuda_local.allreduce_sum(comm, 1, d1, 64, MW_F32);
    cr_assert_eq(st, MW_ERR_ABORTED, "got %s", mw_status_name(st));
    mw__reducer_cuda_local.reset(comm);
    float *bufs[2] = {d0, d1}, out[128];
    run_allreduce(&mw__reducer_cuda_local, comm, 2, dp, bufs, 64, out);
    for (int i = 0; i < 64; i++) cr_assert_eq(out[i], 2.0f * (float)i);
    mw__reducer_cuda_local.comm_free(comm);
    devs[0].vt->free(&devs[0], d0);
    devs[1].vt->free(&devs[1], d1);
    for (int r = 0; r < 2; r++) devs[r].vt->shutdown(&devs[r]);
}

#ifdef MESHWIT_HAVE_NCCL
Test(gpu, nccl_reducer_one_rank) {
    NEED_GPU();
    mw__device *dp[1] = {&gpu};
    mw__comm *comm = NULL;
    mw__comm_options opt = {.timeout_ms = 60000};
    OK(mw__reducer_nccl.comm_new(1, dp, &opt, &comm));
    size_t n = 100003;
    float *in = rand_floats((int64_t)n, -1, 1), *d = putf(in, (int64_t)n), *out = zeros((int64_t)n);
    run_allreduce(&mw__reducer_nccl, comm, 1, dp, &d, n, out);
    expect_equal("nccl all-reduce of one rank", out, in, (int64_t)n);
    OK(mw__reducer_nccl.barrier(comm, 0));
    /* Abort releases later calls until reset; nothing was in flight, so reset keeps the
     * communicator and it works again. */
    mw__reducer_nccl.abort(comm);
    mw_status st = mw__reducer_nccl.allreduce_sum(comm, 0, d, n, MW_F32);
    cr_assert_eq(st, MW_ERR_ABORTED, "got %s", mw_status_name(st));
    mw__reducer_nccl.reset(comm);
    run_allreduce(&mw__reducer_nccl, comm, 1, dp, &d, n, out);
    expect_equal("nccl all-reduce after reset", out, in, (int64_t)n);
    mw__reducer_nccl.comm_free(comm);
}

/* Sums started and never waited for (a step that failed mid-backward): reset re-creates the
 * communicator, and sums work again. */
Test(gpu, nccl_reset_after_an_abandoned_sum) {
    NEED_GPU();
    mw__device *dp[1] = {&gpu};
    mw__comm *comm = NULL;
    mw__comm_options opt = {.timeout_ms = 60000};
    OK(mw__reducer_nccl.comm_new(1, dp, &opt, &comm));
    size_t n = 4099;
    float *in = rand_floats((int64_t)n, -1, 1), *d = putf(in, (int64_t)n);
    cr_assert_not_null(mw__reducer_nccl.allreduce_start);
    OK(mw__reducer_nccl.allreduce_start(comm, 0, d, n, MW_F32));
    OK(mw__reducer_nccl.allreduce_start(comm, 0, d, n / 2, MW_F32));
    mw__reducer_nccl.abort(comm);
    mw_status st = mw__reducer_nccl.allreduce_start(comm, 0, d, n, MW_F32);
    cr_assert_eq(st, MW_ERR_ABORTED, "got %s", mw_status_name(st));
    mw__reducer_nccl.reset(comm);
    float *out = zeros((int64_t)n);
    OK(mw__reducer_nccl.allreduce_start(comm, 0, d, n, MW_F32));
    OK(mw__reducer_nccl.finish(comm, 0));
    OK(gpu.vt->download(&gpu, out, d, n * sizeof(float)));
    expect_equal("nccl sum of one rank after reset", out, in, (int64_t)n);
    mw__reducer_nccl.comm_free(comm);
}

Test(gpu, nccl_refuses_two_ranks_on_one_gpu) {
    NEED_GPU();
    mw__device other = make_device(&mw__cuda_device, "cuda:0#1", 1, 0);
    mw__device *dp[2] = {&gpu, &other};
    mw__comm *comm = NULL;
    mw_status st = mw__reducer_nccl.comm_new(2, dp, NULL, &comm);
    cr_assert_eq(st, MW_ERR_INVALID, "got %s", mw_status_name(st));
    cr_assert(strstr(mw_last_error(), "cuda-local"), "message: %s", mw_last_error());
    cr_assert_null(comm);
}
#endif

#endif /* MESHWIT_HAVE_CUDA */
