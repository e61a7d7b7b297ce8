/* The CUDA backend's registry entry: "cuda:I[,J...]", "cuda:all" and "cuda:IxN" specs, and the
 * family of its reducers (collectives/reducer_select.c chooses the local one when every device
 * shares one GPU, NCCL when all are on distinct GPUs, NCCL over MPI across processes). */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/plan.h"
#include "devices/backend.h"
#include "devices/cuda/cuda.h"

static mw_status cuda_parse(const char *spec, const char *rest, mw__spec_devices *out) {
    if (*rest != ':' || !rest[1])
        return mw__error(MW_ERR_DEVICE, "malformed device spec '%s': %s", spec, MW__SPEC_HELP);
    rest++;
    int have = mw__cuda_device_count();
    int ids[MW_MAX_DEVICES], n = 0, copies = 1;
    if (strcmp(rest, "all") == 0) {
        for (int i = 0; i < have && n < MW_MAX_DEVICES; i++) ids[n++] = i;
    } else if (strchr(rest, 'x')) {
        const char *x = strchr(rest, 'x');
        long id = mw__parse_count(rest, x), c = mw__parse_count(x + 1, x + strlen(x));
        if (id < 0 || c < 1 || c > MW_MAX_DEVICES)
            return mw__error(MW_ERR_DEVICE, "malformed device spec '%s': %s", spec, MW__SPEC_HELP);
        ids[n++] = (int)id;
        copies = (int)c;
    } else {
        const char *p = rest;
        for (;;) {
            const char *e = strchr(p, ',');
            if (!e) e = p + strlen(p);
            long id = mw__parse_count(p, e);
            if (id < 0 || n == MW_MAX_DEVICES)
                return mw__error(MW_ERR_DEVICE, "malformed device spec '%s': %s", spec,
                                 MW__SPEC_HELP);
            for (int j = 0; j < n; j++)
                if (ids[j] == id)
                    return mw__error(MW_ERR_DEVICE, "device spec '%s' names GPU %ld twice", spec,
                                     id);
            ids[n++] = (int)id;
            if (!*e) break;
            p = e + 1;
        }
    }
    if (have == 0 || n == 0)
        return mw__error(MW_ERR_DEVICE, "device spec '%s': no CUDA devices are available", spec);
    for (int j = 0; j < n; j++)
        if (ids[j] >= have)
            return mw__error(MW_ERR_DEVICE, "device spec '%s': GPU %d does not exist (%d visible)",
                             spec, ids[j], have);
    if (n * copies > MW_MAX_DEVICES)
        return mw__error(MW_ERR_DEVICE, "device spec '%s': more than %d devices", spec,
                         MW_MAX_DEVICES);
    out->n = 0;
    for (int j = 0; j < n; j++)
        for (int c = 0; c < copies; c++) {
            int d = out->n++;
            out->ordinal[d] = ids[j];
            if (copies > 1)
                snprintf(out->name[d], sizeof out->name[d], "cuda:%d#%d", ids[j], c);
            else
                snprintf(out->name[d], sizeof out->name[d], "cuda:%d", ids[j]);
        }
    return MW_OK;
}

const mw__backend mw__cuda_backend = {
    .name = "cuda",
    .vt = &mw__cuda_device,
    .parse = cuda_parse,
    .supports = mw__supports_bf16_kernels,
    .reducers = MW__REDUCERS_CUDA,
    .device_count = mw__cuda_device_count,
};
