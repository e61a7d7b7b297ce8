/* The CPU backend's registry entry: "cpu" and "cpu:N" specs (N virtual devices, one thread each,
 * sharing the host's memory), the host-memory reducers among them (the shared-memory reducer,
 * hierarchical over MPI across processes: collectives/reducer_select.c) and OpenBLAS's
 * process-wide thread count as its process hook. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/plan.h"
#include "devices/backend.h"
#include "devices/cpu/cpu.h"

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

const mw__backend mw__cpu_backend = {
    .name = "cpu",
    .vt = &mw__cpu_device,
    .parse = cpu_parse,
    .supports = mw__supports_bf16_kernels,
    .reducers = MW__REDUCERS_HOST,
    .set_threads = mw__cpu_set_blas_threads,
    .describe = mw__cpu_backend_describe,
    .warning = mw__cpu_backend_warning,
};
