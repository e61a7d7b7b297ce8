/* Internal: the device interface. A backend is a table of functions (NULL = not supported); core
 * code lowers every graph node to the kernels below and never includes a backend's own headers.
 *
 * Threading: every function is called from the device's worker thread, except alloc/free and the
 * copies, which the host may also call while the worker is idle; a backend binds its device
 * itself where it has to (CUDA: cudaSetDevice). Kernels run in order on the device's stream;
 * sync() waits for all of them. */
#ifndef MW__DEVICE_H
#define MW__DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "meshwit/graph.h"
#include "meshwit/status.h"

#define MW__ND_MAX MW_MAX_RANK

/* A strided walk over an n-d index space: dims[] is the space, stride[k][] the element stride of
 * operand k along each dim (0 = broadcast). Operand 0 is the output. */
typedef struct mw__nd {
    int rank;
    int64_t dims[MW__ND_MAX];
    int64_t stride[3][MW__ND_MAX];
} mw__nd;

typedef enum mw__binop { MW__BIN_ADD, MW__BIN_SUB, MW__BIN_MUL, MW__BIN_DIV } mw__binop;

/* out[i] = a[i] op b[i] over nd (operands 0, 1, 2 = out, a, b). */
typedef struct mw__k_binary {
    mw__binop op;
    mw__nd nd;
    float *out;
    const float *a, *b;
} mw__k_binary;

/* out[i] = alpha * a[i] over nd (operands 0, 1): copies, permutations, broadcasts, scaling. */
typedef struct mw__k_copy {
    float alpha;
    mw__nd nd;
    float *out;
    const float *a;
} mw__k_copy;

/* out = alpha * sum of a over the dims where out's stride is 0 (operands 0, 1; nd walks a). The
 * summation order is fixed (row-major over nd), so the result is deterministic. */
typedef struct mw__k_reduce {
    float alpha;
    mw__nd nd;
    int64_t out_count; /* elements of out */
    float *out;
    const float *a;
} mw__k_reduce;

/* C[b] = A[b] * B[b] for b < batch, row-major; A is M x K (K x M when trans_a), B is K x N
 * (N x K when trans_b), C is M x N; leading dimensions are those of the stored matrices. */
typedef struct mw__k_gemm {
    int64_t batch, m, n, k;
    int trans_a, trans_b;
    int64_t lda, ldb, ldc;
    int64_t stride_a, stride_b, stride_c;
    float *c;
    const float *a, *b;
} mw__k_gemm;

typedef struct mw__k_fill {
    float value;
    int64_t count;
    float *out;
} mw__k_fill;

/* p[i] -= lr * g[i] */
typedef struct mw__k_sgd {
    float lr;
    int64_t count;
    float *p;
    const float *g;
} mw__k_sgd;

typedef struct mw__device mw__device;

typedef struct mw__device_vtable {
    const char *kind;   /* "cpu", "cuda" */
    int host_memory;    /* buffers are plain host memory: inputs can be read in place */
    mw_status (*init)(mw__device *dev);      /* on the worker thread, once */
    void (*shutdown)(mw__device *dev);       /* on the worker thread, once */
    mw_status (*alloc)(mw__device *dev, size_t bytes, void **out); /* 64-byte aligned */
    void (*free)(mw__device *dev, void *p);
    mw_status (*upload)(mw__device *dev, void *dst, const void *src, size_t bytes);
    mw_status (*download)(mw__device *dev, void *dst, const void *src, size_t bytes);
    mw_status (*sync)(mw__device *dev);
    mw_status (*binary)(mw__device *dev, const mw__k_binary *k);
    mw_status (*copy)(mw__device *dev, const mw__k_copy *k);
    mw_status (*reduce)(mw__device *dev, const mw__k_reduce *k);
    mw_status (*gemm)(mw__device *dev, const mw__k_gemm *k);
    mw_status (*fill)(mw__device *dev, const mw__k_fill *k);
    mw_status (*sgd)(mw__device *dev, const mw__k_sgd *k);
} mw__device_vtable;

struct mw__device {
    const mw__device_vtable *vt;
    char name[32]; /* "cpu:0" */
    int index;     /* position in the mesh's device list */
    int ordinal;   /* backend's own number (GPU id) */
    int pin;       /* CPU: devices sharing the host when the worker should pin itself, else 0 */
    void *impl;    /* backend state */
};

/* The CPU backend. */
extern const mw__device_vtable mw__cpu_device;

/* Merges adjacent dims that are contiguous for every operand (nops operands) and drops size-1
 * dims, so kernels walk as few, as long rows as possible. A rank-0 nd means a single element. */
void mw__nd_simplify(mw__nd *nd, int nops);

#endif
