/* Ranks of the GPU reducers on fakes (test_cuda_local_host.c, test_nccl_host.c,
 * test_nccl_mpi_host.c): a communicator of fake GPUs, and one rank's point-to-point call on a
 * thread of its own; the worker records what the call returned, and the test thread asserts
 * after joining it. */
#ifndef MW_TESTS_GPU_FAKE_FAKE_RANKS_H
#define MW_TESTS_GPU_FAKE_FAKE_RANKS_H

#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>

#include "collectives/reducer.h"
#include "core/error.h"
#include "fake_gpu.h"

/* A communicator of reducer R over n fake devices (n <= 4) named cuda:0 .. cuda:n-1, on GPUs
 * 0 .. n-1, made into devs; asserts that comm_new succeeded. */
static inline mw__comm *fake_comm_new(const mw__reducer_vtable *R, int n, mw__device *devs,
                                      const mw__comm_options *opt) {
    mw__device *dp[4];
    for (int r = 0; r < n; r++) {
        char name[32];
        snprintf(name, sizeof name, "cuda:%d", r);
        fake_device(&devs[r], name, r);
        dp[r] = &devs[r];
    }
    mw__comm *c = NULL;
    mw_status st = R->comm_new(n, dp, opt, &c);
    cr_assert_eq(st, MW_OK, "comm_new: %s: %s", mw_status_name(st), mw_last_error());
    return c;
}

typedef struct p2p_worker {
    pthread_t thread;
    const mw__reducer_vtable *R; /* set by p2p_start */
    mw__comm *comm;
    int rank, to, from; /* -1: that half absent (a recv or a send) */
    size_t n;
    mw_dtype dtype;
    float out[64], in[64]; /* stand for device buffers: the fakes never touch them */
    mw_status st;
    char msg[MW__MSG_SIZE];
    int pending_after; /* queued work the fake still held on the rank's GPU when the call returned
                        */
} p2p_worker;

/* A thread's body: w's send, recv or sendrecv. */
static inline void *p2p_work(void *arg) {
    p2p_worker *w = arg;
    const mw__reducer_vtable *R = w->R;
    w->st = w->from < 0 ? R->send(w->comm, w->rank, w->to, w->out, w->n, w->dtype)
            : w->to < 0
                ? R->recv(w->comm, w->rank, w->from, w->in, w->n, w->dtype)
                : R->sendrecv(w->comm, w->rank, w->to, w->out, w->from, w->in, w->n, w->dtype);
    snprintf(w->msg, sizeof w->msg, "%s", mw_last_error());
    w->pending_after = fake_pending_on(w->rank);
    return NULL;
}

/* Starts w's call of reducer R on a thread of its own (join w->thread). */
static inline void p2p_start(const mw__reducer_vtable *R, p2p_worker *w) {
    w->R = R;
    pthread_create(&w->thread, NULL, p2p_work, w);
}

/* Runs the calls of p workers, one per rank, and joins them. */
static inline void p2p_run(const mw__reducer_vtable *R, p2p_worker *w, int p) {
    for (int r = 0; r < p; r++) p2p_start(R, &w[r]);
    for (int r = 0; r < p; r++) pthread_join(w[r].thread, NULL);
}

#endif
