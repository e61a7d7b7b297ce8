/* The CUDA backend's device family: device memory, streams, the copies between host and device
 * and the data errors kernels flag (cuBLAS for contractions and our kernels for everything else
 * in the files of their families, cuda_kernels.h; the vtable in cuda_vtable.c).
 *
 * Each mw__device owns a non-blocking stream, a cuBLAS handle bound to it (with its own
 * workspace) and a scratch arena for reduction partials, all made in init on the worker thread;
 * a step allocates nothing. Every kernel is queued on the device's stream; sync() waits for them
 * and turns any failure into an mw_status. Several devices may share one GPU (cuda:0x2): each has
 * its own stream, so they run concurrently and never share scratch.
 *
 * Determinism: no kernel adds floats with atomics. Every reduction (reduce, layer-norm weight
 * gradient, softmax and cross-entropy rows, the embedding gradient) sums in an order fixed by the
 * problem's sizes only (not by the GPU model or timing), so a run is bitwise repeatable; sumsq
 * adds integers (exact in any order, the CPU's bits).
 *
 * Data errors (an embedding id or a cross-entropy target out of range) are found on the device:
 * the kernel records the smallest bad position of its kind in a device record and raises a flag
 * in mapped host memory; the launch wrapper reads that flag (no copy, no wait), and sync() and
 * every download read it after their wait, so nothing computed from bad data reaches the host
 * unreported. The report names every kind recorded (MW_ERR_INVALID with each id or target and
 * its position) and clears them. The trainer syncs before its update, so a bad id fails a step
 * before any parameter changes, also on one device.
 *
 * The embedding gradient is linear in tokens: a stable radix sort (CUB) of (id, position) pairs,
 * then one block per run of equal ids adds the run's rows in position order, the CPU's order. */
#include "devices/cuda/cuda_impl.cuh"
#include "devices/cuda/cuda_kernels.h"

#include <unistd.h>

/* Reads, reports and clears the data errors kernels recorded: both kinds, each with its first
 * bad position. Waits for the stream first, so the records are complete. */
static mw_status report_data_error(mw__device *dev) {
    cuda_impl *im = impl_of(dev);
    err_rec rec[NERR];
    CU(dev, cudaStreamSynchronize, im->stream);
    CU(dev, cudaMemcpyAsync, rec, im->err, sizeof rec, cudaMemcpyDeviceToHost, im->stream);
    CU(dev, cudaMemsetAsync, im->err, 0xff, sizeof rec, im->stream);
    CU(dev, cudaStreamSynchronize, im->stream);
    *im->flag = 0;
    mw__cuda_data_error kinds[NERR];
    for (int kind = 0; kind < NERR; kind++) {
        kinds[kind].set = rec[kind].key != ERR_NONE;
        kinds[kind].pos = (long long)(rec[kind].key >> 32);
        kinds[kind].value = (int)(uint32_t)(rec[kind].key & 0xffffffffu);
        kinds[kind].limit = rec[kind].limit;
    }
    /* MW_OK when the flag was raised but no record is set: nothing to report. */
    mw_status st = mw__cuda_data_errors(dev->name, &kinds[ERR_EMBED], &kinds[ERR_TARGET]);
    return st ? st : mw__cuda_position_error(dev->name, &kinds[ERR_POSITION]);
}

/* A data error an earlier kernel flagged (read without waiting). */
mw_status mw__cuda_flagged(mw__device *dev) {
    return *impl_of(dev)->flag ? report_data_error(dev) : MW_OK;
}

/* After a launch: its failure, or a data error an earlier kernel flagged. */
mw_status mw__cuda_launched(mw__device *dev, const char *kernel) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return cuda_fail(dev, kernel, e);
    return mw__cuda_flagged(dev);
}

/* --- the local reducer's kernel --------------------------------------------------------------- */

typedef struct buf_list {
    float *p[MW_MAX_DEVICES];
} buf_list;

__global__ void k_sum_slices(buf_list b, int nb, int64_t lo, int64_t hi) {
    GRID_LOOP(i, hi - lo) {
        int64_t e = lo + i;
        float s = b.p[0][e];
        for (int q = 1; q < nb; q++) s += b.p[q][e];
        for (int q = 0; q < nb; q++) b.p[q][e] = s;
    }
}

/* --- vtable: lifetime and memory -------------------------------------------------------------- */

static void release(mw__device *dev, cuda_impl *im) {
    if (!im) return;
    if (cudaSetDevice(dev->ordinal) == cudaSuccess) {
        if (im->stream) cudaStreamSynchronize(im->stream);
        if (im->blas) cublasDestroy(im->blas);
        cudaFree(im->blas_ws);
        cudaFree(im->scratch);
        if (im->flag) cudaFreeHost((void *)im->flag);
        if (im->stream) cudaStreamDestroy(im->stream);
    }
    (void)cudaGetLastError(); /* a failure while tearing down is not the next call's error */
    mw__free(im);
}

static mw_status init_impl(mw__device *dev, cuda_impl *im) {
    CU(dev, cudaStreamCreateWithFlags, &im->stream, cudaStreamNonBlocking);
    BLAS(dev, cublasCreate, &im->blas);
    /* setStream resets the handle's workspace, so the workspace is set after it. */
    BLAS(dev, cublasSetStream, im->blas, im->stream);
    BLAS(dev, cublasSetMathMode, im->blas, CUBLAS_DEFAULT_MATH); /* full fp32, no TF32 */
    CU(dev, cudaMalloc, &im->blas_ws, BLAS_WORKSPACE);
    BLAS(dev, cublasSetWorkspace, im->blas, im->blas_ws, BLAS_WORKSPACE);
    CU(dev, cudaMalloc, (void **)&im->scratch, SCRATCH_BYTES + NERR * sizeof(err_rec));
    im->err = (err_rec *)(im->scratch + SCRATCH_BYTES);
    void *flag;
    CU(dev, cudaHostAlloc, &flag, 64, cudaHostAllocMapped);
    im->flag = (volatile int *)flag;
    *im->flag = 0;
    CU(dev, cudaHostGetDevicePointer, (void **)&im->flag_dev, flag, 0);
    CU(dev, cudaMemsetAsync, im->err, 0xff, NERR * sizeof(err_rec), im->stream);
    CU(dev, cudaStreamSynchronize, im->stream);
    return MW_OK;
}

extern "C" mw_status mw__cuda_init(mw__device *dev) {
    if (dev->impl) return MW_OK;
    mw_status st = bind(dev);
    if (st) return st;
    cuda_impl *im = (cuda_impl *)mw__calloc(1, sizeof *im);
    if (!im) return mw__error(MW_ERR_NOMEM, "%s: out of host memory initialising", dev->name);
    if ((st = init_impl(dev, im))) {
        char msg[MW__MSG_SIZE];
        snprintf(msg, sizeof msg, "%s", mw_last_error());
        release(dev, im);
        return mw__error_copy(st, msg);
    }
    dev->impl = im;
    return MW_OK;
}

extern "C" void mw__cuda_shutdown(mw__device *dev) {
    release(dev, impl_of(dev));
    dev->impl = NULL;
}

extern "C" mw_status mw__cuda_alloc(mw__device *dev, size_t bytes, void **out) {
    *out = NULL;
    if (!bytes) return MW_OK;
    mw_status st = bind(dev);
    if (st) return st;
    cudaError_t e = cudaMalloc(out, bytes); /* 256-byte aligned */
    if (e != cudaSuccess) {
        *out = NULL;
        (void)cudaGetLastError();
        mw_status code = e == cudaErrorMemoryAllocation ? MW_ERR_NOMEM : MW_ERR_DEVICE;
        return mw__error(code, "%s: cudaMalloc of %zu bytes failed: %s", dev->name, bytes,
                         cudaGetErrorString(e));
    }
    return MW_OK;
}

extern "C" void mw__cuda_free(mw__device *dev, void *p) {
    if (!p || cudaSetDevice(dev->ordinal) != cudaSuccess) return;
    cudaFree(p);
    (void)cudaGetLastError();
}

/* Synchronous copies through the device's stream, so they are ordered after its kernels. The
 * host side is pageable memory; the call returns when the copy is complete. */
static mw_status copy_sync(mw__device *dev, void *dst, const void *src, size_t bytes,
                           cudaMemcpyKind kind) {
    if (!bytes) return MW_OK;
    mw_status st = bind(dev);
    if (st) return st;
    cuda_impl *im = impl_of(dev);
    if (!im) {
        CU(dev, cudaMemcpy, dst, src, bytes, kind);
        return MW_OK;
    }
    CU(dev, cudaMemcpyAsync, dst, src, bytes, kind, im->stream);
    CU(dev, cudaStreamSynchronize, im->stream);
    /* Everything queued before has run: a data error it found is reported now, so a value read
     * back (a loss, a parameter) is never one computed from a bad id or target. */
    return mw__cuda_flagged(dev);
}

extern "C" mw_status mw__cuda_upload(mw__device *dev, void *dst, const void *src, size_t bytes) {
    return copy_sync(dev, dst, src, bytes, cudaMemcpyHostToDevice);
}

extern "C" mw_status mw__cuda_download(mw__device *dev, void *dst, const void *src, size_t bytes) {
    return copy_sync(dev, dst, src, bytes, cudaMemcpyDeviceToHost);
}

extern "C" mw_status mw__cuda_host_alloc(mw__device *dev, size_t bytes, void **out) {
    *out = NULL;
    if (!bytes) return MW_OK;
    mw_status st = bind(dev);
    if (st) return st;
    cudaError_t e = cudaMallocHost(out, bytes);
    if (e != cudaSuccess) {
        *out = NULL;
        (void)cudaGetLastError();
        return mw__error(e == cudaErrorMemoryAllocation ? MW_ERR_NOMEM : MW_ERR_DEVICE,
                         "%s: cudaMallocHost of %zu bytes failed: %s", dev->name, bytes,
                         cudaGetErrorString(e));
    }
    return MW_OK;
}

extern "C" void mw__cuda_host_free(mw__device *dev, void *p) {
    if (!p || cudaSetDevice(dev->ordinal) != cudaSuccess) return;
    cudaFreeHost(p);
    (void)cudaGetLastError();
}

/* Queued on the stream: the kernels that read dst run after it, and nothing waits here. */
extern "C" mw_status mw__cuda_upload_async(mw__device *dev, void *dst, const void *src,
                                           size_t bytes) {
    if (!bytes) return MW_OK;
    ENTER(dev);
    CU(dev, cudaMemcpyAsync, dst, src, bytes, cudaMemcpyHostToDevice, im->stream);
    return MW_OK;
}

extern "C" mw_status mw__cuda_sync(mw__device *dev) {
    ENTER(dev);
    CU(dev, cudaStreamSynchronize, im->stream);
    return mw__cuda_flagged(dev);
}

/* --- services --------------------------------------------------------------------------------- */

extern "C" int mw__cuda_device_count(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* e.g. no driver (error 35): no GPUs, and no error left behind */
        return 0;
    }
    return n;
}

extern "C" mw_status mw__cuda_probe(int *count) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) (void)cudaGetLastError();
    return mw__cuda_count_result(n, (int)e, cudaGetErrorName(e), cudaGetErrorString(e),
                                 mw__gpu_required(), count);
}

extern "C" mw_status mw__cuda_gpu_identity(int ordinal, char out[MW__GPU_ID_SIZE]) {
    char host[64] = "?", bus[32] = "?";
    out[0] = 0;
    mw__gpu_host_id(host, sizeof host);
    cudaError_t e = cudaDeviceGetPCIBusId(bus, (int)sizeof bus, ordinal);
    cudaDeviceProp prop;
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, ordinal);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return mw__error(MW_ERR_DEVICE, "GPU %d: its identity (PCI bus id, UUID) is unknown: %s",
                         ordinal, cudaGetErrorString(e));
    }
    int at = snprintf(out, MW__GPU_ID_SIZE, "%s %s GPU-", host, bus);
    for (int i = 0; i < 16 && at > 0 && at < MW__GPU_ID_SIZE - 2; i++)
        at += snprintf(out + at, (size_t)(MW__GPU_ID_SIZE - at), "%02x",
                       (unsigned char)prop.uuid.bytes[i]);
    return MW_OK;
}

extern "C" struct CUstream_st *mw__cuda_stream(const mw__device *dev) {
    cuda_impl *im = impl_of(dev);
    return im ? im->stream : NULL;
}

extern "C" mw_status mw__cuda_sum_slices_on(mw__device *dev, struct CUstream_st *stream,
                                            float *const *bufs, int nbufs, size_t lo, size_t hi) {
    if (nbufs < 1 || nbufs > MW_MAX_DEVICES || !bufs)
        return mw__error(MW_ERR_INVALID, "%s: sum of %d buffers (expected 1..%d)", dev->name, nbufs,
                         MW_MAX_DEVICES);
    ENTER(dev);
    if (hi > lo) {
        buf_list b;
        memset(&b, 0, sizeof b);
        for (int q = 0; q < nbufs; q++) b.p[q] = bufs[q];
        int64_t n = (int64_t)(hi - lo);
        k_sum_slices<<<blocks_for(n, THREADS), THREADS, 0, stream ? stream : im->stream>>>(
            b, nbufs, (int64_t)lo, (int64_t)hi);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return cuda_fail(dev, "sum kernel", e);
    }
    return MW_OK;
}

extern "C" mw_status mw__cuda_sum_slices(mw__device *dev, float *const *bufs, int nbufs, size_t lo,
                                         size_t hi) {
    mw_status st = mw__cuda_sum_slices_on(dev, NULL, bufs, nbufs, lo, hi);
    if (st) return st;
    CU(dev, cudaStreamSynchronize, impl_of(dev)->stream);
    return MW_OK;
}
