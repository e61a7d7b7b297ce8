/* Run under mpirun: linear regression on a mesh spanning every process must end with the same
 * parameters as the same mesh inside one process.
 *
 *   mpi_linreg ROWS LOCAL_SPEC REFERENCE_SPEC AXES SHARD_AXIS
 *
 * e.g. under `mpirun -np 3`: mpi_linreg 8191 cpu:1 cpu:3 X X. Every process checks; exit 0 when
 * they agree, 1 when they do not, 2 on an error.
 *
 * Tolerance. Each device computes the same partial gradients as its twin in one process; only
 * the order of the gradient all-reduce can differ (include/meshwit/distributed.h):
 * - one device per process in every reduction group (one axis over cpu:1 processes, or a Host
 *   axis), or a group inside one process: the sum in rank order, as in one process, so the
 *   parameters must be bitwise equal (tolerance 0);
 * - one axis over processes of several devices each: (r0 + r1) + (r2 + r3) instead of
 *   ((r0 + r1) + r2) + r3. Two orders of a 4-term float sum differ by at most 2 (4 - 1) u S per
 *   element, u = 2^-24 and S the sum of the terms' magnitudes; here the gradient is
 *   (2/N) sum err x with x ~ N(0, 1) and |err| <= |y| ~ 5.7 at the start (true weights -2..2 over
 *   16 features), so S <= 2 E|err x| ~ 9 and each step's gradient differs by <= 6 u 9 ~ 3.2e-6.
 *   SGD with lr 0.05 on this loss (Hessian ~ 2 I) contracts a parameter difference by 0.9 a
 *   step, so it stays below lr * 3.2e-6 / (1 - 0.9) = 1.6e-6; the test allows 1e-5. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "linreg_model.h"

#define FEATURES 16
#define STEPS 40
#define TOLERANCE_REORDERED 1e-5 /* see above: the bound is about 1.6e-6 */

static int train(mw_mesh *mesh, const linreg_data *data, int64_t rows, const char *axis,
                 float *params) {
    mw_graph *g = NULL;
    mw_status gst = mw_graph_new(&g);
    mw_tensor *loss = NULL;
    mw_trainer *tr = NULL;
    mw_status st = gst ? gst : linreg_build(g, rows, FEATURES, 1, axis, &loss);
    mw_trainer_config cfg = {.optimizer = {MW_SGD, 0.05f}};
    if (st == MW_OK) st = mw_trainer_new(g, loss, mesh, &cfg, &tr);
    if (st == MW_OK) st = linreg_steps(tr, data, STEPS, NULL, NULL);
    if (st == MW_OK) st = linreg_read_params(tr, FEATURES, params, params + FEATURES);
    if (st != MW_OK)
        fprintf(stderr, "[rank %d] %s: %s\n", mw_distributed_rank(), mw_mesh_describe(mesh),
                mw_last_error());
    mw_trainer_free(tr);
    mw_graph_free(g);
    return st == MW_OK ? 0 : 2;
}

int main(int argc, char **argv) {
    if (mw_distributed_init(&argc, &argv) != MW_OK) {
        fprintf(stderr, "mpi_linreg: %s\n", mw_last_error());
        return 2;
    }
    if (argc != 6) {
        fprintf(stderr, "usage: mpi_linreg ROWS LOCAL_SPEC REFERENCE_SPEC AXES SHARD_AXIS\n");
        return 2;
    }
    int64_t rows = atoll(argv[1]);
    int rank = mw_distributed_rank();
    linreg_data data = {0};
    mw_mesh *mesh = NULL, *ref_mesh = NULL;
    float dist[FEATURES + 1], ref[FEATURES + 1];
    int rc = 2;
    if (linreg_data_make(rows, FEATURES, 7, &data) != MW_OK) goto done;
    if (mw_mesh_new(argv[2], argv[4], &mesh) != MW_OK ||
        mw_mesh_new_local(argv[3], argv[4], &ref_mesh) != MW_OK) {
        fprintf(stderr, "[rank %d] mesh: %s\n", rank, mw_last_error());
        goto done;
    }
    if (rank == 0) printf("%s (%d processes)\n", mw_mesh_describe(mesh), mw_mesh_processes(mesh));
    if ((rc = train(mesh, &data, rows, argv[5], dist)) ||
        (rc = train(ref_mesh, &data, rows, argv[5], ref)))
        goto done;
    double diff = 0;
    for (int i = 0; i <= FEATURES; i++) diff = fmax(diff, fabs((double)dist[i] - ref[i]));
    printf("[rank %d] bias %+.6f (one process: %+.6f), max |difference| %.3g\n", rank,
           dist[FEATURES], ref[FEATURES], diff);
    /* Several devices in this process on the one axis that spans processes: reordered sums. */
    int reordered = strcmp(argv[4], argv[5]) == 0 && mw_mesh_local_devices(mesh, NULL) > 1 &&
                    mw_mesh_processes(mesh) > 1;
    double tolerance = reordered ? TOLERANCE_REORDERED : 0.0;
    if (rank == 0) printf("tolerance %g\n", tolerance);
    rc = diff <= tolerance ? 0 : 1;
done:
    mw_mesh_free(mesh);
    mw_mesh_free(ref_mesh);
    linreg_data_free(&data);
    if (rc == 2) mw_distributed_abort(2);
    mw_distributed_finalize();
    return rc;
}
