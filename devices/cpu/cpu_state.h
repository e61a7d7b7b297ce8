/* Internal: a CPU device's state (dev->impl), made by init and freed by shutdown: the GEMM engine
 * and instruction cap the environment asked for (MESHWIT_CPU_GEMM, MESHWIT_CPU_ISA: see
 * cpu_isa.h), the device's oneDNN engine, one work buffer that every prepared kernel shares
 * (oneDNN scratchpads, widened operands: one kernel runs at a time; made while the worker starts,
 * so a step allocates nothing) and what the prepared kernels own until the device shuts down.
 *
 *   MESHWIT_CPU_GEMM = auto | onednn | openblas   the f32 engine (bf16 needs onednn for speed) */
#ifndef MW__CPU_STATE_H
#define MW__CPU_STATE_H

#include <stddef.h>

#include "devices/device.h"

struct mw__dnnl;

enum { MW__ENGINE_AUTO, MW__ENGINE_ONEDNN, MW__ENGINE_OPENBLAS };

/* Something a prepared kernel owns until the device shuts down. */
typedef struct mw__cpu_owned {
    void *p;
    void (*free)(void *p);
} mw__cpu_owned;

typedef struct mw__cpu_state {
    int engine;            /* MW__ENGINE_* from MESHWIT_CPU_GEMM */
    int cap;               /* mw__isa from MESHWIT_CPU_ISA */
    int blas_tuned;        /* OpenBLAS runs kernels written for this CPU's vector unit (at least
                              AVX2), not its generic ones (Debian 12's on Sapphire Rapids) */
    struct mw__dnnl *dnnl; /* NULL without oneDNN (not built, or openblas asked for) */
    void *work;            /* shared by the prepared kernels: one runs at a time */
    size_t work_bytes;
    mw__cpu_owned *owned;
    int nowned, cap_owned;
    struct mw__cpu_table *tables; /* mw__cpu_table's, newest first */
    int ntables;
} mw__cpu_state;

/* The device's state: made by init (MW_ERR_INVALID naming a bad variable's value,
 * MW_ERR_UNSUPPORTED for onednn without oneDNN, MW_ERR_NOMEM), freed by shutdown. */
mw_status mw__cpu_state_init(mw__device *dev);
void mw__cpu_state_free(mw__device *dev);

/* For the prepared kernels (GEMMs, attention): the device's oneDNN engine (NULL without one),
 * its work buffer (made at least `bytes` while the worker starts; its address is final once
 * every kernel is prepared), and the list of what they made, freed with the device (free_fn(p)
 * at once when it cannot be recorded). */
struct mw__dnnl *mw__cpu_dnnl(const mw__device *dev);
mw_status mw__cpu_work_reserve(mw__device *dev, size_t bytes);
void *mw__cpu_work(const mw__device *dev);
mw_status mw__cpu_own(mw__device *dev, void *p, void (*free_fn)(void *p));

/* A table the device keeps until it shuts down, for kernels that would otherwise make the same
 * values at every call (the angles of rotary embeddings: their sines and cosines cost about what
 * the rotation does): `floats` floats for the key of `key_bytes` bytes (compared byte for byte:
 * zero a struct's padding), *fresh set when it was just made and the caller must fill it. NULL
 * (nothing kept) when memory runs out or the device keeps MW__CPU_TABLES already: the caller
 * then makes the values itself. */
#define MW__CPU_TABLES 16
float *mw__cpu_table(mw__device *dev, const void *key, size_t key_bytes, int64_t floats,
                     int *fresh);

/* Whether this device may run bf16 products on bf16 instructions (the CPU has them,
 * MESHWIT_CPU_ISA allows them and libmeshwit was built with oneDNN); dev NULL: the process's CPU
 * and environment. */
int mw__cpu_bf16_native(const mw__device *dev);

/* The vtable's describe (cpu_describe.c) and workspace (devices/device.h). */
const char *mw__cpu_describe(const mw__device *dev, int kind, const void *k);
size_t mw__cpu_workspace(const mw__device *dev);

#endif
