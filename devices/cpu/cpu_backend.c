/* The CPU backend's registry entry: "cpu" and "cpu:N" specs (N virtual devices, one thread each,
 * sharing the host's memory), the shared-memory reducer among them (hierarchical over MPI across
 * processes, from libmeshwit-mpi.so) and OpenBLAS's process-wide thread count as its process hook.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/plan.h"
#include "devices/backend.h"
#include "devices/cpu/cpu.h"
#include "devices/module.h"
#include "parallel/reducer.h"

static mw_status cpu_parse(const char *spec, const char *rest, mw__spec_devices *out) {
    long n = 1;
    if (*rest == ':') {
        n = mw__parse_count(rest + 1, rest + strlen(rest));
        if (n < 0)
            return mw__error(MW_ERR_DEVICE, "malformed device spec '%s': %s", spec, MW__SPEC_HELP);
    } else if (*rest) {
        return mw__error(MW_ERR_DEVICE, "malformed device spec '%s': %s", spec, MW__SPEC_HELP);
    }
    if (n < 1)
        return mw__error(MW_ERR_DEVICE,
                         "device spec '%s' asks for no devices: use cpu:N with N >= 1", spec);
    if (n > MW_MAX_DEVICES)
        return mw__error(MW_ERR_DEVICE, "device spec '%s' asks for %ld devices; at most %d", spec,
                         n, MW_MAX_DEVICES);
    out->n = (int)n;
    for (int i = 0; i < out->n; i++) {
        snprintf(out->name[i], sizeof out->name[i], "cpu:%d", i);
        out->ordinal[i] = i;
    }
    return MW_OK;
}

static const mw__reducer_vtable *cpu_reducer(int ndevices, const int *ordinals, int nprocs) {
    (void)ordinals;
    if (ndevices < 1) return NULL;
    if (nprocs <= 1) return &mw__reducer_shm;
    const mw__dist_api *d = mw__dist(); /* across processes: the MPI module's */
    return d ? d->reducer_hier : NULL;
}

/* Every op on f32; i32 through copies; bf16 where the kernels take it: conversions and copies,
 * and the kernels that read or write the activations a bf16 contraction uses. */
static int cpu_supports(int op, mw_dtype dtype) {
    switch (dtype) {
    case MW_F32: return 1;
    case MW_I32: return op == MW__I_COPY;
    case MW_BF16:
        return op == MW__I_COPY || op == MW__I_GEMM || op == MW__I_ATTENTION ||
               op == MW__I_ATTENTION_GRAD || op == MW__I_LAYERNORM || op == MW__I_UNARY ||
               op == MW__I_UNARY_GRAD;
    default: return 0;
    }
}

const mw__backend mw__cpu_backend = {
    .name = "cpu",
    .vt = &mw__cpu_device,
    .parse = cpu_parse,
    .supports = cpu_supports,
    .reducer = cpu_reducer,
    .set_threads = mw__cpu_set_blas_threads,
};
