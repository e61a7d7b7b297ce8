/* Host-side decisions of the CUDA backend, kept free of CUDA calls so that a machine without a
 * GPU can test them: whether a missing GPU is an error, how a data error a kernel recorded is
 * reported, which host a GPU is on and which ranks of a communicator share one GPU. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "devices/cuda/cuda.h"
#include "devices/cuda/cuda_kernels.h"

int mw__gpu_required(void) {
    const char *v = getenv("MESHWIT_REQUIRE_GPU");
    return v && *v && strcmp(v, "0") != 0;
}

mw_status mw__cuda_count_result(int count, int err, const char *err_name, const char *err_text,
                                int required, int *out) {
    *out = err ? 0 : count;
    if (!required || *out > 0) return MW_OK;
    if (err)
        return mw__error(MW_ERR_DEVICE,
                         "MESHWIT_REQUIRE_GPU is set but no GPU is usable: cudaGetDeviceCount "
                         "failed: %s (%s, error %d)",
                         err_text ? err_text : "?", err_name ? err_name : "?", err);
    return mw__error(MW_ERR_DEVICE, "MESHWIT_REQUIRE_GPU is set but cudaGetDeviceCount found no "
                                    "GPU (check CUDA_VISIBLE_DEVICES)");
}

mw_status mw__cuda_data_errors(const char *dev, const mw__cuda_data_error *embed,
                               const mw__cuda_data_error *target) {
    char a[200] = "", b[200] = "";
    if (embed && embed->set)
        snprintf(a, sizeof a,
                 "embedding id %d at position %lld is outside the vocabulary [0, %lld)",
                 embed->value, embed->pos, embed->limit);
    if (target && target->set)
        snprintf(b, sizeof b,
                 "cross-entropy target %d at position %lld is outside the classes [0, %lld)",
                 target->value, target->pos, target->limit);
    if (!*a && !*b) return MW_OK;
    return mw__error(MW_ERR_INVALID, "%s: %s%s%s", dev, a, *a && *b ? "; and " : "", b);
}

mw_status mw__cuda_position_error(const char *dev, const mw__cuda_data_error *pos) {
    if (!pos || !pos->set) return MW_OK;
    return mw__error(MW_ERR_INVALID,
                     "%s: a state write or cached attention: position %d of row %lld is outside "
                     "[0, %lld)",
                     dev, pos->value, pos->pos, pos->limit);
}

void mw__gpu_host_id(char *out, size_t size) {
    const char *id = getenv("NCCL_HOSTID");
    if (id && *id)
        snprintf(out, size, "%s", id);
    else if (gethostname(out, size) != 0)
        snprintf(out, size, "?");
    out[size - 1] = '\0';
}

int mw__find_shared_gpu(const char (*ids)[MW__GPU_ID_SIZE], int n, int *first, int *second) {
    for (int j = 1; j < n; j++)
        for (int i = 0; i < j; i++)
            if (ids[i][0] && strcmp(ids[i], ids[j]) == 0) {
                *first = i;
                *second = j;
                return 1;
            }
    return 0;
}

static int fits_int32(int64_t v) { return v >= 0 && v <= INT32_MAX; }

mw_status mw__cuda_check(int kind, const void *k) {
    switch (kind) {
    case MW__I_ATTENTION:
    case MW__I_ATTENTION_GRAD: {
        const mw__k_attention *a = k;
        if (a->rope.dims) /* the plan fuses rotary embeddings only where the target asks */
            return mw__error(MW_ERR_UNSUPPORTED,
                             "fused attention on a GPU does not rotate q and k as it reads them; "
                             "apply mw_rope as an op of its own");
        if (a->d > MW__CUDA_ATT_MAX_D)
            return mw__error(MW_ERR_UNSUPPORTED,
                             "fused attention on a GPU takes head dimensions up to %d, not %lld; "
                             "split the heads finer",
                             MW__CUDA_ATT_MAX_D, (long long)a->d);
        if (mw__cuda_attention_smem(a->t) > MW__CUDA_SHARED_BYTES)
            return mw__error(
                MW_ERR_UNSUPPORTED,
                "fused attention on a GPU takes sequences up to %lld, not %lld; "
                "write the attention out with mw_contract and mw_causal_softmax",
                (long long)((MW__CUDA_SHARED_BYTES / sizeof(float) - MW__CUDA_ATT_WARPS) / 2),
                (long long)a->t);
        if (a->slices * mw__attn_group(a) > MW__CUDA_MAX_GRID_Y || a->t > INT32_MAX)
            return mw__error(MW_ERR_UNSUPPORTED,
                             "fused attention on a GPU takes up to %d (batch x head) slices, not "
                             "%lld; shard the batch over more devices or feed smaller batches",
                             MW__CUDA_MAX_GRID_Y, (long long)(a->slices * mw__attn_group(a)));
        return MW_OK;
    }
    case MW__I_ATTENTION_CACHED: {
        const mw__k_attention_cached *c = k;
        if (c->dim > MW__CUDA_CACHED_MAX_DIM)
            return mw__error(MW_ERR_UNSUPPORTED,
                             "cached attention on a GPU takes head sizes up to %d, not %lld",
                             MW__CUDA_CACHED_MAX_DIM, (long long)c->dim);
        return MW_OK;
    }
    case MW__I_GEMM: {
        const mw__k_gemm *g = k;
        if (!fits_int32(g->m) || !fits_int32(g->n) || !fits_int32(g->k) || !fits_int32(g->lda) ||
            !fits_int32(g->ldb) || !fits_int32(g->ldc) || !fits_int32(g->batch))
            return mw__error(MW_ERR_UNSUPPORTED,
                             "a GEMM of %lld x %lld x %lld (batch %lld) exceeds cuBLAS's 32-bit "
                             "sizes; split the contraction",
                             (long long)g->m, (long long)g->n, (long long)g->k,
                             (long long)g->batch);
        return MW_OK;
    }
    default: return MW_OK;
    }
}
