/* meshwit: devices and meshes.
 *
 * A device spec names a list of devices:
 *   "cpu"  or "cpu:N"      N virtual CPU devices (one worker thread each, BLAS single-threaded)
 *   "cuda:0", "cuda:0,1"   CUDA GPUs by index; "cuda:all" every visible GPU
 *   "cuda:0x2"             two logical devices on GPU 0 (for testing the multi-device path)
 * A mesh arranges those devices on named axes: "X" puts all of them on one axis X;
 * "Host=2,X=2" makes a 2 x 2 mesh (the last axis varies fastest over the device list).
 *
 * Thread-safety: a mesh is immutable once made and may be shared by trainers on any thread. */
#ifndef MESHWIT_MESH_H
#define MESHWIT_MESH_H

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MW_MAX_MESH_AXES 4
#define MW_MAX_DEVICES 64

typedef struct mw_mesh mw_mesh;

/* Parses `devices` and arranges them on `axes` (NULL means one axis "X" over all devices; a
 * single name without a size takes all devices). *out is owned by the caller (mw_mesh_free).
 * Errors: MW_ERR_DEVICE (malformed spec, "cpu:0", a GPU that does not exist or a build without
 * CUDA), MW_ERR_INVALID (axis sizes whose product is not the device count, a bad axis name). */
mw_status mw_mesh_new(const char *devices, const char *axes, mw_mesh **out);

/* NULL is a no-op. Trainers using the mesh must be freed first. */
void mw_mesh_free(mw_mesh *mesh);

/* Number of devices in the mesh. */
int mw_mesh_size(const mw_mesh *mesh);

/* "Mesh(X -> 2) over cpu:0, cpu:1". Owned by the mesh. */
const char *mw_mesh_describe(const mw_mesh *mesh);

/* Number of CUDA devices usable by this process: 0 in a build without CUDA or on a machine
 * without a GPU driver (never an error). */
int mw_cuda_device_count(void);

#ifdef __cplusplus
}
#endif
#endif
