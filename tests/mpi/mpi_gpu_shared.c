/* Run under `mpirun -np 2` on one GPU: every process names the same GPU (SPEC cuda:0, or
 * cuda:0x2 for two devices in each process), so ranks of the NCCL communicator share it. Making
 * the trainer must fail in every process with meshwit's own message, before NCCL's
 * initialisation, and the job must end normally.
 *
 *   mpi_gpu_shared SPEC
 *
 * Exit 0 when every process got the message; 77 (skipped) without a GPU or without NCCL, or 1
 * with MESHWIT_REQUIRE_GPU=1; 1 otherwise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "linreg_model.h"

int main(int argc, char **argv) {
    if (mw_distributed_init(&argc, &argv) != MW_OK || argc != 2) {
        fprintf(stderr, "usage: mpi_gpu_shared SPEC\n");
        return 2;
    }
    int rank = mw_distributed_rank(), rc = 1;
    const char *require = getenv("MESHWIT_REQUIRE_GPU");
    int required = require && *require && strcmp(require, "0") != 0;
    mw_graph *g = NULL;
    mw_mesh *mesh = NULL;
    mw_trainer *tr = NULL;
    mw_tensor *loss = NULL;
    if (mw_cuda_device_count() == 0) {
        printf("[rank %d] no GPU: %s\n", rank, required ? "failed (required)" : "skipped");
        rc = required ? 1 : 77;
        goto done;
    }
    if (mw_mesh_new(argv[1], "X", &mesh) != MW_OK || mw_graph_new(&g) != MW_OK ||
        linreg_build(g, 1024, 8, 1, "X", &loss) != MW_OK) {
        fprintf(stderr, "[rank %d] setting up: %s\n", rank, mw_last_error());
        goto done;
    }
    mw_trainer_config cfg = {.optimizer = {MW_SGD, 0.05f}, .collective_timeout_ms = 20000};
    mw_status st = mw_trainer_new(g, loss, mesh, &cfg, &tr);
    const char *msg = mw_last_error();
    if (st == MW_ERR_UNSUPPORTED && strstr(msg, "no reducer")) {
        printf("[rank %d] skipped: this build has no NCCL (%s)\n", rank, msg);
        rc = 77;
    } else if (st == MW_ERR_INVALID && strstr(msg, "are on the same GPU")) {
        printf("[rank %d] refused as expected: %s\n", rank, msg);
        rc = 0;
    } else {
        fprintf(stderr, "[rank %d] expected MW_ERR_INVALID naming the shared GPU, got %s: %s\n",
                rank, mw_status_name(st), msg);
    }
done:
    mw_trainer_free(tr);
    mw_graph_free(g);
    mw_mesh_free(mesh);
    mw_distributed_finalize();
    return rc;
}
