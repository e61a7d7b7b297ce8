/* Internal: the interface between libmeshwit and the modules it loads (libmeshwit-cuda.so,
 * libmeshwit-mpi.so, libmeshwit-nccl-mpi.so). Tables of function pointers in both directions, so
 * that a module never needs the core's symbols to be exported (a static executable exports none):
 *
 *   core -> module: the module's entry point, MW__MODULE_ENTRY, is given mw__core_api (errors,
 *   allocations with the core's fault injection, the other modules by mw__module_id) and fills
 *   mw__module_info with what it provides: a backend to register, and its own table.
 *
 * A module is built from the same source as the core it is loaded into: the core refuses one
 * whose abi or version differ. Inside a module, devices/module/imports.c defines the core's
 * internal functions (mw__error, mw__malloc, ...) over mw__core_api, so the core's sources
 * compile into a module unchanged. */
#ifndef MW__MODULE_ABI_H
#define MW__MODULE_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "devices/device.h"
#include "meshwit.h"

/* The module interface's version: a module of the same meshwit version built from other source is
 * refused rather than misread. Made of MW__MODULE_TABLES, raised by hand whenever the tables of
 * this file change (or the reducer vtable they hand over, collectives/reducer.h), and of what
 * follows from the instruction table by itself: the kernels' layout (MW__KERNEL_LAYOUT_OF) and
 * the device vtable's size. */
#define MW__MODULE_TABLES 11
#define MW__MODULE_ABI_OF(TABLE)                                                                   \
    ((int)((MW__MODULE_TABLES * 1000003u +                                                         \
            (MW__KERNEL_LAYOUT_OF(TABLE) ^ (unsigned)sizeof(mw__device_vtable))) &                 \
           0x7fffffffu))
#define MW__MODULE_ABI MW__MODULE_ABI_OF(MW__KERNELS)
#define MW__STR_(x) #x
#define MW__STR(x) MW__STR_(x)
/* "0.1.0", from meshwit.h's numbers. */
#define MW__VERSION_STRING                                                                         \
    MW__STR(MESHWIT_VERSION_MAJOR)                                                                 \
    "." MW__STR(MESHWIT_VERSION_MINOR) "." MW__STR(MESHWIT_VERSION_PATCH)
#define MW__MODULE_ENTRY "mw__module_entry"

struct mw__backend;
struct mw__device;
struct mw__device_vtable;
struct mw__reducer_vtable;
struct mw__dist_link;
struct mw__dist_send;
struct CUstream_st;

typedef struct mw__dist_api mw__dist_api;
typedef struct mw__cuda_api mw__cuda_api;

/* The modules, and the table each one's entry point hands the core (mw__module_info::api). */
typedef enum mw__module_id {
    MW__MODULE_CUDA,     /* libmeshwit-cuda.so: mw__cuda_module_api */
    MW__MODULE_MPI,      /* libmeshwit-mpi.so: mw__dist_api */
    MW__MODULE_NCCL_MPI, /* libmeshwit-nccl-mpi.so: NCCL across processes, a mw__reducer_vtable */
    MW__MODULE_COUNT
} mw__module_id;

typedef struct mw__core_api {
    int abi;
    const char *version; /* mw_version() */
    mw_status (*error_copy)(mw_status status, const char *msg);
    const char *(*last_error)(void);
    void *(*malloc)(size_t size);
    void *(*calloc)(size_t n, size_t size);
    void *(*realloc)(void *p, size_t size);
    void *(*aligned_alloc)(size_t align, size_t size);
    void (*free)(void *p);
    /* The table of module id (an mw__module_id; the type it names), loading the module; NULL
     * when this build has none, when it cannot be loaded (the reason is the last error) or, for
     * the MPI module, in a process no MPI launcher started (devices/module.h: mw__module_api). */
    const void *(*module)(int id);
} mw__core_api;

typedef struct mw__module_info {
    int abi;
    const char *version; /* the meshwit version the module was built from */
    const void *api;     /* the module's own table (the type its mw__module_id names), or NULL */
    const struct mw__backend *backend; /* the backend it provides, or NULL; the core registers
                                          it once it accepted the module */
} mw__module_info;

/* Every module's entry point: checks core->abi and version, keeps core, fills *out. */
typedef mw_status (*mw__module_entry_fn)(const mw__core_api *core, mw__module_info *out);

/* A GPU's identity across processes and hosts: "host PCI-bus-id GPU-UUID". */
#define MW__GPU_ID_SIZE 160

/* What the reducers of GPU memory (collectives/cuda, collectives/nccl, collectives/mpi/nccl_mpi.c)
 * take from the CUDA backend, so that no floor above the devices includes its headers
 * (devices/cuda/cuda.h documents each function). */
struct mw__cuda_api {
    const struct mw__device_vtable *device; /* mw__cuda_device: a device is a GPU when its vt is */
    /* The device's compute stream (NULL before init). */
    struct CUstream_st *(*stream)(const struct mw__device *dev);
    mw_status (*gpu_identity)(int ordinal, char out[MW__GPU_ID_SIZE]);
    /* Whether two of ids[0..n) name the same GPU: the first such pair into *first < *second. */
    int (*find_shared_gpu)(const char (*ids)[MW__GPU_ID_SIZE], int n, int *first, int *second);
    /* bufs[q][i] = bufs[0][i] + bufs[1][i] + ... for i in [lo, hi), on dev's stream, waiting;
     * sum_slices_on queues it on stream (NULL: dev's own) without waiting. */
    mw_status (*sum_slices)(struct mw__device *dev, float *const *bufs, int nbufs, size_t lo,
                            size_t hi);
    mw_status (*sum_slices_on)(struct mw__device *dev, struct CUstream_st *stream,
                               float *const *bufs, int nbufs, size_t lo, size_t hi);
};

/* The CUDA backend's table (devices/cuda/cuda_vtable.c), inside libmeshwit-cuda.so and the
 * programs that link the backend's objects; libmeshwit-nccl-mpi.so reaches the CUDA module's
 * through the core instead (collectives/mpi/nccl_mpi_peers.c). */
extern const mw__cuda_api mw__cuda_services;

/* libmeshwit-cuda.so's table: the CUDA backend's services and the reducers among GPUs of one
 * process (collectives/cuda/cuda_module.c). */
typedef struct mw__cuda_module_api {
    const mw__cuda_api *cuda;               /* mw__cuda_services */
    const struct mw__reducer_vtable *local; /* devices that share one GPU */
    const struct mw__reducer_vtable *nccl;  /* devices on distinct GPUs; NULL without NCCL */
} mw__cuda_module_api;

/* libmeshwit-mpi.so: the MPI world (collectives/mpi/dist.c) and the reducer between processes. */
struct mw__dist_api {
    mw_status (*init)(int *argc, char ***argv);
    void (*finalize)(void);
    void (*abort)(int code);
    int (*size)(void);
    int (*rank)(void);
    mw_status (*allgather_ints)(const int *mine, int n, int *out);
    mw_status (*allgather_u64)(const uint64_t *mine, int n, uint64_t *out, int timeout_ms,
                               const char *what);
    mw_status (*allgatherv_bytes)(const char *mine, const int *counts, char *out, int timeout_ms,
                                  const char *what);
    mw_status (*bcast_bytes)(void *buf, size_t n, int timeout_ms, const char *what);
    mw_status (*max_int)(int mine, int *out, int timeout_ms, const char *what);
    void (*lock)(void);
    void (*unlock)(void);
    const struct mw__reducer_vtable *reducer_hier; /* mw__reducer_mpi_hier */
    /* Messages between processes (collectives/dist.h, collectives/mpi/link.c). */
    mw_status (*link_new)(struct mw__dist_link **out);
    void (*link_free)(struct mw__dist_link *l);
    mw_status (*link_isend)(struct mw__dist_link *l, int dest, int tag, const void *buf, size_t n,
                            struct mw__dist_send **out);
    mw_status (*link_wait)(struct mw__dist_link *l, struct mw__dist_send **sends, int n,
                           int timeout_ms, const char *what);
    mw_status (*link_recv)(struct mw__dist_link *l, int src, int tag, void *buf, size_t n,
                           int abort_tag, int (*stop)(void *ctx), void *ctx, int timeout_ms,
                           const char *what);
};

#endif
