/* A stand-in for the CUDA runtime's header, for the host-side tests of tests/gpu/fake/: the
 * types, constants and functions the reducers of GPU memory use (collectives/cuda/,
 * collectives/nccl/, collectives/mpi/nccl_mpi.c), with the real header's names and values. The
 * functions are fakes (tests/gpu/fake/fake_gpu.c) that record what they are asked to do; no
 * GPU, driver or toolkit is needed. The real header checks the same sources in the CUDA build. */
#ifndef MW_TESTS_FAKE_CUDA_RUNTIME_API_H
#define MW_TESTS_FAKE_CUDA_RUNTIME_API_H

#include <stddef.h>

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600
} cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3
};

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;

#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02

cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t error);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream);

#endif
