/* Run under mpirun: one process fails in the middle of training and the whole job must end with
 * a clear error in bounded time, never hang.
 *
 *   mpi_fault fault   rank 1's device fails (injected fault) in step 3; rank 1 reports it (and
 *                     that the trainer refuses another step) and ends the job with
 *                     mw_distributed_abort
 *   mpi_fault stall   rank 1's device stalls for 30 s in step 3; rank 0's collective times out
 *                     after 2 s (MW_ERR_TIMEOUT), and rank 0 ends the job
 *   mpi_fault exit    rank 1 exits with status 3 before step 3 without a word to its peers;
 *                     mpirun ends the job
 * Exit status of the job: non-zero. The test (tests/mpi/expect_failure.cmake) checks it and the
 * message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "linreg_model.h"
#include "meshwit/testing.h"

int main(int argc, char **argv) {
    if (mw_distributed_init(&argc, &argv) != MW_OK || argc != 2) {
        fprintf(stderr, "usage: mpi_fault fault|stall|exit\n");
        return 2;
    }
    const char *mode = argv[1];
    int rank = mw_distributed_rank();
    linreg_data data = {0};
    mw_mesh *mesh = NULL;
    mw_graph *g = NULL;
    mw_status gst = mw_graph_new(&g);
    mw_tensor *loss = NULL;
    mw_trainer *tr = NULL;
    mw_trainer_config cfg = {.optimizer = {MW_SGD, 0.05f},
                             .collective_timeout_ms = strcmp(mode, "stall") == 0 ? 2000 : 0};
    mw_status st = gst ? gst : linreg_data_make(1000, 8, 3, &data);
    if (st == MW_OK) st = mw_mesh_new("cpu:1", "X", &mesh);
    if (st == MW_OK) st = linreg_build(g, 1000, 8, 1, "X", &loss);
    if (st == MW_OK) st = mw_trainer_new(g, loss, mesh, &cfg, &tr);
    int first = 0;
    if (st == MW_OK) mw_mesh_local_devices(mesh, &first);
    if (st == MW_OK && rank == 1) {
        if (strcmp(mode, "fault") == 0)
            st = mw_test_control(MW_TEST_FAULT, tr, first, MW_PHASE_BACKWARD, (int64_t)(3),
                                 MW_ERR_DEVICE);
        else if (strcmp(mode, "stall") == 0)
            st = mw_test_control(MW_TEST_STALL, tr, first, MW_PHASE_GRAD_REDUCE, (int64_t)(3),
                                 30000);
    }
    mw_feed feeds[2];
    linreg_feeds(&data, feeds);
    for (int s = 0; st == MW_OK && s < 100; s++) {
        if (rank == 1 && s == 3 && strcmp(mode, "exit") == 0) {
            fprintf(stderr, "[rank 1] exiting with status 3 in the middle of training\n");
            exit(3);
        }
        st = mw_trainer_step(tr, feeds, 2, NULL);
    }
    if (st != MW_OK) {
        fprintf(stderr, "[rank %d] training failed: %s [%s]: %s\n", rank, mw_strerror(st),
                mw_status_name(st), mw_last_error());
        if (tr) { /* the trainer refuses to step again: its peers may be inside a collective */
            mw_status again = mw_trainer_step(tr, feeds, 2, NULL);
            fprintf(stderr, "[rank %d] next step: %s\n", rank, mw_status_name(again));
        }
        mw_distributed_abort(4);
    }
    mw_trainer_free(tr);
    mw_graph_free(g);
    mw_mesh_free(mesh);
    linreg_data_free(&data);
    mw_distributed_finalize();
    return 0;
}
