/* Internal: the CPU backend, for its registry entry (devices/cpu/cpu_backend.c), the tests and
 * the bench; the rest of meshwit reaches it through the registry (devices/backend.h). */
#ifndef MW__CPU_H
#define MW__CPU_H

#include "devices/device.h"

/* The CPU backend's device vtable (devices/cpu/cpu_device.c). */
extern const mw__device_vtable mw__cpu_device;

/* Sets OpenBLAS's (process-wide) thread count; returns the previous one. */
int mw__cpu_set_blas_threads(int n);

/* The backend's describe and warning (mw_backend_describe, mw_backend_warning: mesh.h). */
const char *mw__cpu_backend_describe(void);
const char *mw__cpu_backend_warning(void);

#endif
