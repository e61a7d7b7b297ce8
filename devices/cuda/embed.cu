/* Embedding lookup and its gradient, and the write of a row into a state at a position
 * (inference's key/value cache). */

#include "devices/cuda/cuda_impl.cuh"

#include <cub/device/device_radix_sort.cuh>

/* --- embedding -------------------------------------------------------------------------------- */

__global__ void k_embed(int64_t n_ids, int64_t vocab, int64_t dim, float *out, const int32_t *ids,
                        const float *table, err_rec *err, int *flag) {
    for (int64_t i = blockIdx.x; i < n_ids; i += gridDim.x) {
        int32_t id = ids[i];
        float *o = out + i * dim;
        if (id < 0 || id >= vocab) {
            if (threadIdx.x == 0) record_bad(&err[ERR_EMBED], flag, i, id, vocab);
            for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) o[c] = 0.0f;
            continue;
        }
        const float *t = table + (int64_t)id * dim;
        for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) o[c] = t[c];
    }
}

/* Marks the vocabulary rows that occur (racing stores of the same value) and records a bad id,
 * as the forward does. */
__global__ void k_mark_present(int64_t n_ids, int64_t vocab, const int32_t *ids,
                               unsigned char *present, err_rec *err, int *flag) {
    GRID_LOOP(i, n_ids) {
        int32_t id = ids[i];
        if (id >= 0 && id < vocab) {
            if (present) present[id] = 1;
        } else {
            record_bad(&err[ERR_EMBED], flag, i, id, vocab);
        }
    }
}

/* One block per vocabulary row v: scans ids in order, tile by tile, lists the positions equal to
 * v in increasing order and adds their gradient rows in that order. Each thread owns the columns
 * c = t, t + BS, ... of the row, so no two threads write the same element. Rows absent from ids
 * (present[v] == 0; present NULL: unknown) are just zeroed. */
template <int BS>
__global__ void k_embed_grad(int64_t n_ids, int64_t vocab, int64_t dim, float *out,
                             const int32_t *ids, const float *gy, const unsigned char *present) {
    __shared__ int64_t list[BS];
    __shared__ int wcount[BS / 32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t v = blockIdx.x; v < vocab; v += gridDim.x) {
        float *o = out + v * dim;
        for (int64_t c = threadIdx.x; c < dim; c += BS) o[c] = 0.0f;
        if (present && !present[v]) continue;
        for (int64_t base = 0; base < n_ids; base += BS) {
            int64_t i = base + threadIdx.x;
            int match = i < n_ids && ids[i] == v;
            unsigned ballot = __ballot_sync(0xffffffffu, match);
            if (lane == 0) wcount[warp] = __popc(ballot);
            __syncthreads();
            int before = 0, total = 0;
            for (int w = 0; w < BS / 32; w++) {
                before += w < warp ? wcount[w] : 0;
                total += wcount[w];
            }
            if (match) list[before + __popc(ballot & ((1u << lane) - 1u))] = i;
            __syncthreads();
            for (int q = 0; q < total; q++) {
                const float *g = gy + list[q] * dim;
                for (int64_t c = threadIdx.x; c < dim; c += BS) o[c] += g[c];
            }
            __syncthreads(); /* list and wcount are refilled by the next tile */
        }
    }
}

/* Linear in tokens: the (id, position) pairs sorted by id with a stable radix sort (positions
 * of one id stay in increasing order), then one block per run of equal ids adds that run's
 * gradient rows into the id's row in position order: the CPU's order, so the same bits. Ids
 * outside [0, vocab) get the key vocab and sort last, where no block reads them. */
__global__ void k_embed_keys(int64_t n_ids, int64_t vocab, const int32_t *ids, uint32_t *keys,
                             uint32_t *pos) {
    GRID_LOOP(i, n_ids) {
        int32_t id = ids[i];
        keys[i] = id >= 0 && id < vocab ? (uint32_t)id : (uint32_t)vocab;
        pos[i] = (uint32_t)i;
    }
}

__global__ void k_embed_grad_runs(int64_t n_ids, int64_t vocab, int64_t dim, float *out,
                                  const uint32_t *keys, const uint32_t *pos, const float *gy) {
    for (int64_t j = blockIdx.x; j < n_ids; j += gridDim.x) {
        uint32_t key = keys[j];
        if (key >= (uint64_t)vocab || (j > 0 && keys[j - 1] == key)) continue; /* not a run start */
        float *o = out + (int64_t)key * dim;
        for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
            float s = 0.0f;
            for (int64_t q = j; q < n_ids && keys[q] == key; q++)
                s += gy[(int64_t)pos[q] * dim + c];
            o[c] = s;
        }
    }
}

/* --- state write ------------------------------------------------------------------------------ */

/* out[o, ids[o], i] = a[o, i]; a row with a position outside [0, n) is left and recorded. */
__global__ void k_state_write(int64_t outer, int64_t n, int64_t inner, float *out, const float *a,
                              const int32_t *ids, err_rec *err, int *flag) {
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < outer * inner;
         t += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = t / inner, i = t % inner;
        int32_t at = ids[o];
        if (at < 0 || at >= n) {
            if (i == 0) record_bad(&err[ERR_POSITION], flag, o, at, n);
            continue;
        }
        out[(o * n + at) * inner + i] = a[t];
    }
}

/* --- entry points ------------------------------------------------------------------------ */

mw_status mw__cuda_embed(mw__device *dev, const mw__k_embed *k) {
    ENTER(dev);
    if (k->n_ids <= 0 || k->dim <= 0) return MW_OK;
    LAUNCH(k_embed, row_blocks(k->n_ids), THREADS, 0, k->n_ids, k->vocab, k->dim, k->out, k->ids,
           k->table, im->err, im->flag_dev);
    return mw__cuda_launched(dev, "embedding kernel");
}

/* Scratch bytes of the sorted embedding gradient for n ids (0: too many for the arena). */
static size_t embed_sort_bytes(int64_t n_ids, int64_t vocab, int *end_bit, size_t *temp) {
    if (n_ids <= 0 || n_ids > INT32_MAX || vocab >= INT32_MAX) return 0;
    *end_bit = 1;
    while (*end_bit < 32 && ((uint64_t)1 << *end_bit) <= (uint64_t)vocab) (*end_bit)++;
    *temp = 0;
    if (cub::DeviceRadixSort::SortPairs(NULL, *temp, (const uint32_t *)NULL, (uint32_t *)NULL,
                                        (const uint32_t *)NULL, (uint32_t *)NULL, (int)n_ids, 0,
                                        *end_bit) != cudaSuccess)
        return 0;
    size_t arrays = 4 * (((size_t)n_ids * sizeof(uint32_t) + 255) / 256 * 256);
    size_t total = arrays + *temp;
    return total <= SCRATCH_BYTES ? total : 0;
}

mw_status mw__cuda_embed_grad(mw__device *dev, const mw__k_embed_grad *k) {
    ENTER(dev);
    if (k->vocab <= 0 || k->dim <= 0) return MW_OK;
    int end_bit = 32;
    size_t temp = 0;
    if (embed_sort_bytes(k->n_ids, k->vocab, &end_bit, &temp)) {
        /* Rows that no id names stay 0; the others are written whole by their run's block. */
        CU(dev, cudaMemsetAsync, k->out, 0, (size_t)(k->vocab * k->dim) * sizeof(float),
           im->stream);
        size_t slot = ((size_t)k->n_ids * sizeof(uint32_t) + 255) / 256 * 256;
        uint32_t *keys = (uint32_t *)im->scratch, *keys_sorted = (uint32_t *)(im->scratch + slot);
        uint32_t *pos = (uint32_t *)(im->scratch + 2 * slot);
        uint32_t *pos_sorted = (uint32_t *)(im->scratch + 3 * slot);
        void *temp_mem = im->scratch + 4 * slot;
        LAUNCH(k_mark_present, blocks_for(k->n_ids, THREADS), THREADS, 0, k->n_ids, k->vocab,
               k->ids, (unsigned char *)NULL, im->err, im->flag_dev);
        LAUNCH(k_embed_keys, blocks_for(k->n_ids, THREADS), THREADS, 0, k->n_ids, k->vocab, k->ids,
               keys, pos);
        CU(dev, cub::DeviceRadixSort::SortPairs, temp_mem, temp, (const uint32_t *)keys,
           keys_sorted, (const uint32_t *)pos, pos_sorted, (int)k->n_ids, 0, end_bit, im->stream);
        LAUNCH(k_embed_grad_runs, row_blocks(k->n_ids), THREADS, 0, k->n_ids, k->vocab, k->dim,
               k->out, keys_sorted, pos_sorted, k->gy);
        return mw__cuda_launched(dev, "embedding gradient kernel");
    }
    /* Too many ids for the scratch arena: one block per vocabulary row scans every id. Rows that
     * no id names are only zeroed; a vocabulary too large for the arena scans every row. */
    unsigned char *present = NULL;
    if ((size_t)k->vocab <= SCRATCH_BYTES) {
        present = (unsigned char *)im->scratch;
        CU(dev, cudaMemsetAsync, present, 0, (size_t)k->vocab, im->stream);
    }
    if (k->n_ids > 0)
        LAUNCH(k_mark_present, blocks_for(k->n_ids, THREADS), THREADS, 0, k->n_ids, k->vocab,
               k->ids, present, im->err, im->flag_dev);
    LAUNCH(k_embed_grad<THREADS>, row_blocks(k->vocab), THREADS, 0, k->n_ids, k->vocab, k->dim,
           k->out, k->ids, k->gy, present);
    return mw__cuda_launched(dev, "embedding gradient kernel");
}

/* A position outside the state is recorded, and reported by the next ENTER-style kernel's check or
 * by sync (launch_error reports the launch's own failure only). */
extern "C" mw_status mw__cuda_state_write(mw__device *dev, const mw__k_state_write *k) {
    ENTER(dev);
    if (k->outer <= 0 || k->inner <= 0) return MW_OK;
    k_state_write<<<wide_blocks(k->outer * k->inner), THREADS, 0, im->stream>>>(
        k->outer, k->n, k->inner, k->out, k->value, k->ids, im->err, im->flag_dev);
    return launch_error(dev, "state write kernel");
}
