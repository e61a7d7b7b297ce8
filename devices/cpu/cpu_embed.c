/* CPU kernels of the indexed ops: the embedding lookup and its gradient, and the write of a row
 * into a state at a position (inference's key/value cache). Also the range checks of indices the
 * other families share (cpu_kernels.h). */
#include <string.h>

#include "core/error.h"
#include "devices/cpu/cpu_kernels.h"
#include "devices/cpu/simd.h"
#include "devices/device.h"

/* A bad id or target: the position is within the device's shard of the batch. */
mw_status MW__CPU(mw__cpu_out_of_range)(const char *what, int32_t v, int64_t pos, int64_t limit) {
    return mw__error(MW_ERR_INVALID,
                     "%s %d at position %lld of this device's shard is outside [0, %lld)", what, v,
                     (long long)pos, (long long)limit);
}

/* A position per outer row in [0, n), or an error naming the first that is not. */
mw_status MW__CPU(mw__cpu_positions_ok)(const mw__device *dev, const int32_t *ids, int64_t outer,
                                        int64_t n, const char *what) {
    for (int64_t o = 0; o < outer; o++)
        if (ids[o] < 0 || ids[o] >= n)
            return mw__error(MW_ERR_INVALID, "%s: %s: position %d of row %lld is outside [0, %lld)",
                             dev ? dev->name : "cpu", what, (int)ids[o], (long long)o,
                             (long long)n);
    return MW_OK;
}

mw_status MW__CPU(mw__cpu_embed)(mw__device *dev, const mw__k_embed *k) {
    (void)dev;
    for (int64_t i = 0; i < k->n_ids; i++) {
        int32_t id = k->ids[i];
        if (id < 0 || id >= k->vocab)
            return MW__CPU(mw__cpu_out_of_range)("embedding id", id, i, k->vocab);
        memcpy(k->out + i * k->dim, k->table + (int64_t)id * k->dim, (size_t)k->dim * 4);
    }
    return MW_OK;
}

mw_status MW__CPU(mw__cpu_embed_grad)(mw__device *dev, const mw__k_embed_grad *k) {
    (void)dev;
    memset(k->out, 0, (size_t)(k->vocab * k->dim) * sizeof *k->out);
    for (int64_t i = 0; i < k->n_ids; i++) {
        int32_t id = k->ids[i];
        if (id < 0 || id >= k->vocab)
            return MW__CPU(mw__cpu_out_of_range)("embedding id", id, i, k->vocab);
        float *dst = k->out + (int64_t)id * k->dim;
        const float *src = k->gy + i * k->dim;
        for (int64_t j = 0; j < k->dim; j++) dst[j] += src[j];
    }
    return MW_OK;
}

mw_status MW__CPU(mw__cpu_state_write)(mw__device *dev, const mw__k_state_write *k) {
    mw_status st = MW__CPU(mw__cpu_positions_ok)(dev, k->ids, k->outer, k->n, "state write");
    if (st) return st;
    for (int64_t o = 0; o < k->outer; o++)
        memcpy(k->out + (o * k->n + k->ids[o]) * k->inner, k->value + o * k->inner,
               (size_t)k->inner * sizeof *k->out);
    return MW_OK;
}
