/* meshwit: devices and meshes.
 *
 * A device spec names a list of devices:
 *   "cpu"  or "cpu:N"      N virtual CPU devices (one thread each, BLAS single-threaded)
 *   "cuda:0", "cuda:0,1"   CUDA GPUs by index; "cuda:all" every visible GPU
 *   "cuda:0x2"             two logical devices on GPU 0 (for testing the multi-device path)
 * A mesh arranges those devices on named axes: "X" puts all of them on one axis X;
 * "Host=2,X=2" makes a 2 x 2 mesh (the last axis varies fastest over the device list).
 *
 * CUDA devices live in the module libmeshwit-cuda.so, loaded the first time a "cuda" spec is
 * given (or mw_cuda_device_count is called); a program that names only CPU devices never loads
 * it, nor the CUDA, cuBLAS or NCCL libraries. When the module is missing or its libraries cannot
 * be loaded, a "cuda" spec fails with MW_ERR_UNSUPPORTED or MW_ERR_DEVICE, the message naming the
 * module's file and the loader's error (README: "Building, installing and linking").
 *
 * Across processes (a build with MPI, under `mpirun -np P` after mw_distributed_init): a mesh
 * spans every process. Each process passes its own local spec ("cpu:1", "cuda:0"); the devices
 * are numbered process by process (rank 0's first, each process's in its spec's order) and named
 * "rank<r>/<device>", e.g. "Mesh(X -> 4) over rank0/cpu:0, rank0/cpu:1, rank1/cpu:0, rank1/cpu:1".
 * "Host=2,X=2" then puts the processes on axis Host and each process's devices on X. Every
 * process must make the same meshes and trainers in the same order with the same axes (making a
 * distributed mesh or trainer is a collective call). A trainer on such a mesh runs workers only
 * for this process's devices, and each of them reads only its own rows of the global batch.
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
 * single name without a size takes all devices). Under mpirun the mesh spans all processes (see
 * above); MW_ERR_DEVICE then also reports a process whose spec failed or whose devices are of
 * another kind. *out is owned by the caller (mw_mesh_free).
 * Errors: MW_ERR_DEVICE (malformed spec, "cpu:0", more than MW_MAX_DEVICES devices, a GPU that
 * does not exist or a build without CUDA; the message names the spec), MW_ERR_UNSUPPORTED (a
 * "cuda" spec whose module cannot be used: see above), MW_ERR_INVALID (devices or out NULL, axis
 * sizes whose product is not the device count, a size that is not a positive integer, more than
 * one axis without a size, a bad axis name, one named twice, more than MW_MAX_MESH_AXES axes),
 * MW_ERR_NOMEM. */
mw_status mw_mesh_new(const char *devices, const char *axes, mw_mesh **out);

/* Like mw_mesh_new, but the mesh holds only this process's devices even under mpirun (e.g. a
 * single-device baseline that every process runs on its own). Never a collective call. Errors:
 * as mw_mesh_new's. */
mw_status mw_mesh_new_local(const char *devices, const char *axes, mw_mesh **out);

/* Number of processes the mesh spans (1 for a process-local mesh; 0 for NULL). */
int mw_mesh_processes(const mw_mesh *mesh);

/* Number of the mesh's devices that belong to this process; their global indices start at
 * *first (when first is not NULL). 0 (and *first 0) for NULL. */
int mw_mesh_local_devices(const mw_mesh *mesh, int *first);

/* NULL is a no-op. Trainers using the mesh must be freed first. */
void mw_mesh_free(mw_mesh *mesh);

/* Number of devices in the mesh (0 for NULL). */
int mw_mesh_size(const mw_mesh *mesh);

/* "Mesh(X -> 2) over cpu:0, cpu:1". Owned by the mesh; "(null)" for NULL. */
const char *mw_mesh_describe(const mw_mesh *mesh);

/* What the math of the backend called `backend` ("cpu", "cuda": a device spec's prefix) runs on,
 * in one line, for logs and bench records: for "cpu" the BLAS library and its core (OpenBLAS's
 * core name, "Haswell"), whether oneDNN is built in and the level of the vector loops
 * ("OpenBLAS core Zen, oneDNN built in, vector loops (avx2)"). "" for NULL, a backend that is
 * not there (its module missing) or one that says nothing. Loads the backend's module when it
 * is one. Never NULL; valid until the next call. */
const char *mw_backend_describe(const char *backend);

/* A warning about the backend's setup that costs speed, else "": for "cpu", OpenBLAS running its
 * generic kernels on a CPU with AVX-512 where OpenBLAS does the contractions (the fix named).
 * "" for NULL or a backend that is not there. Never NULL. */
const char *mw_backend_warning(const char *backend);

/* Number of CUDA devices usable by this process: 0 in a build without CUDA, when the CUDA module
 * cannot be loaded, or on a machine without a GPU driver (never an error). Loads the CUDA
 * module (and so the CUDA runtime) when this build has it. */
int mw_cuda_device_count(void);

#ifdef __cplusplus
}
#endif
#endif
