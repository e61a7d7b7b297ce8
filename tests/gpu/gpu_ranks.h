/* The ranks of the GPU reducers' suites (test_gpu_collectives.c, test_gpu_p2p.c): p CUDA devices
 * and a communicator of one reducer over them. Include it where MESHWIT_HAVE_CUDA is defined. */
#ifndef MW_TESTS_GPU_GPU_RANKS_H
#define MW_TESTS_GPU_GPU_RANKS_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "collectives/reducer_select.h"
#include "devices/cuda/cuda.h"
#include "devices/device.h"
#include "gpu_test.h"

#define MAXR 4

typedef struct ranks {
    int p;
    const mw__reducer_vtable *R;
    mw__comm *comm;
    mw__device devs[MAXR], *dp[MAXR];
    uint8_t *out[MAXR], *in[MAXR]; /* device buffers of open_ranks' bytes each, or NULL */
} ranks;

/* p devices: all on GPU 0 (cuda-local), or on GPUs 0..p-1 (NCCL); each with two device buffers
 * of `bytes` (none for 0). */
static inline void open_ranks(ranks *k, int p, const mw__reducer_vtable *R, int timeout_ms,
                              size_t bytes) {
    memset(k, 0, sizeof *k);
    k->p = p;
    k->R = R;
    int shared = R == &mw__reducer_cuda_local;
    for (int r = 0; r < p; r++) {
        mw__device *d = &k->devs[r];
        d->vt = &mw__cuda_device;
        d->index = r;
        d->ordinal = shared ? 0 : r;
        snprintf(d->name, sizeof d->name, shared ? "cuda:0#%d" : "cuda:%d", r);
        OK(d->vt->init(d));
        k->dp[r] = d;
        if (bytes) {
            OK(d->vt->alloc(d, bytes, (void **)&k->out[r]));
            OK(d->vt->alloc(d, bytes, (void **)&k->in[r]));
        }
    }
    mw__comm_options opt = {.timeout_ms = timeout_ms};
    OK(R->comm_new(p, k->dp, &opt, &k->comm));
}

static inline void close_ranks(ranks *k) {
    k->R->comm_free(k->comm);
    for (int r = 0; r < k->p; r++) {
        if (k->out[r]) k->devs[r].vt->free(&k->devs[r], k->out[r]);
        if (k->in[r]) k->devs[r].vt->free(&k->devs[r], k->in[r]);
        k->devs[r].vt->shutdown(&k->devs[r]);
    }
}

#endif
