/* Internal: the CUDA backend's functions, for its own files and the tests; the floors above the
 * devices reach what they need of them through mw__cuda_api (devices/module_abi.h). Includes no
 * CUDA header, so plain C code compiled without the toolkit's include path can use it; only code
 * built with MESHWIT_HAVE_CUDA may reference these symbols. */
#ifndef MW__CUDA_H
#define MW__CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "devices/device.h"
#include "devices/module_abi.h" /* MW__GPU_ID_SIZE */

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st; /* cudaStream_t is struct CUstream_st * */

/* The CUDA backend. mw__device::ordinal is the GPU id; several devices may share one GPU, each
 * with its own stream, cuBLAS handle and scratch memory. */
extern const mw__device_vtable mw__cuda_device;

/* The number of visible GPUs: 0 when there is none, no driver, or any other CUDA failure (never
 * prints, never fails). */
int mw__cuda_device_count(void);

/* Whether the environment asks for a GPU: MESHWIT_REQUIRE_GPU set, non-empty and not "0". Then
 * no usable GPU is an error, and the GPU tests fail instead of skipping. */
int mw__gpu_required(void);

/* The number of visible GPUs into *count, as mw__cuda_device_count; when mw__gpu_required() and
 * there is none, MW_ERR_DEVICE with a message naming the CUDA error that hid them (e.g. "CUDA
 * driver version is insufficient for CUDA runtime version"). */
mw_status mw__cuda_probe(int *count);

/* The decision of mw__cuda_probe, without CUDA: count and err (0: cudaSuccess, else the
 * cudaError_t with its name and text) as cudaGetDeviceCount gave them; *out is count, or 0 after
 * an error. MW_OK unless required and *out is 0. */
mw_status mw__cuda_count_result(int count, int err, const char *err_name, const char *err_text,
                                int required, int *out);

/* A data error of one kind as a kernel recorded it: the smallest bad position, its value and the
 * bound it broke. */
typedef struct mw__cuda_data_error {
    int set;
    long long pos;
    int value;
    long long limit;
} mw__cuda_data_error;

/* MW_OK when neither is set; else MW_ERR_INVALID with a message naming device dev and every kind
 * that is set (an embedding id and a cross-entropy target each with its position and range). */
mw_status mw__cuda_data_errors(const char *dev, const mw__cuda_data_error *embed,
                               const mw__cuda_data_error *target);
/* MW_OK when pos is not set; else MW_ERR_INVALID naming device dev, the row and the position a
 * state write or cached attention was given outside [0, limit). */
mw_status mw__cuda_position_error(const char *dev, const mw__cuda_data_error *pos);

/* Writes the identity of GPU ordinal into out: its host (mw__gpu_host_id), PCI bus id and UUID.
 * Errors: a CUDA failure as MW_ERR_DEVICE. */
mw_status mw__cuda_gpu_identity(int ordinal, char out[MW__GPU_ID_SIZE]);

/* The host a GPU identity names, into out (size bytes, terminated): NCCL_HOSTID when it is set
 * and not empty, as NCCL itself then tells hosts apart (two processes that set different ones
 * are two hosts to NCCL, which then connects them through its network transport, also on one
 * GPU of one machine), else the host name. */
void mw__gpu_host_id(char *out, size_t size);

/* Whether two of ids[0..n) name the same GPU (empty ids never match): the first such pair, in
 * order of the second index, into *first < *second. */
int mw__find_shared_gpu(const char (*ids)[MW__GPU_ID_SIZE], int n, int *first, int *second);

/* The device's compute stream (kernels, copies and collectives on it run in order), or NULL
 * before init. Borrowed: valid until the device's shutdown. */
struct CUstream_st *mw__cuda_stream(const mw__device *dev);

/* On dev's stream: for i in [lo, hi), s = bufs[0][i] + bufs[1][i] + ... (buffer order), then
 * bufs[q][i] = s for every q; waits until done. The buffers are device memory of dev's GPU
 * (nbufs <= MW_MAX_DEVICES). Call from dev's worker thread. Errors: MW_ERR_INVALID, and a CUDA
 * failure as MW_ERR_DEVICE. */
mw_status mw__cuda_sum_slices(mw__device *dev, float *const *bufs, int nbufs, size_t lo, size_t hi);

/* The same queued on stream (NULL: dev's own), without waiting: the caller orders it with events.
 */
mw_status mw__cuda_sum_slices_on(mw__device *dev, struct CUstream_st *stream, float *const *bufs,
                                 int nbufs, size_t lo, size_t hi);

#ifdef __cplusplus
}
#endif

#endif
