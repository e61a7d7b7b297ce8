/* Run under mpirun: a few AdamW steps of a small GPT-2 (examples/common/gpt2_model.c) with the
 * batch sharded over every process must match unsharded training on one device of one process:
 * every step's loss, and the token embedding after the last step, within 1e-4 relative.
 *
 *   mpi_gpt2 LOCAL_SPEC        e.g. cpu:1 under `mpirun -np 2`
 * Exit 0 when they agree, 1 when they do not, 2 on an error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpt2_model.h"

#define BATCH 4
#define SEQ 16
#define STEPS 4
#define RTOL 1e-4 /* float sums in another order, through 2 layers and AdamW */

static const gpt2_config config = {
    .layers = 2, .heads = 2, .channels = 32, .max_seq = 16, .vocab = 61, .padded_vocab = 64};

static int train(mw_mesh *mesh, const char *axis, float *losses, float *wte) {
    mw_graph *g = NULL;
    mw_status gst = mw_graph_new(&g);
    gpt2_graph m;
    mw_trainer *tr = NULL;
    mw_trainer_config cfg = {.optimizer = {.kind = MW_ADAMW,
                                           .lr = 1e-3f,
                                           .beta1 = 0.9f,
                                           .beta2 = 0.95f,
                                           .eps = 1e-8f,
                                           .weight_decay = 0.1f,
                                           .grad_clip = 1.0f}};
    mw_status st = gst ? gst : gpt2_build(g, &config, BATCH, SEQ, axis, &m);
    if (st == MW_OK) st = mw_trainer_new(g, m.loss, mesh, &cfg, &tr);
    int32_t tokens[BATCH * SEQ], targets[BATCH * SEQ];
    for (int s = 0; st == MW_OK && s < STEPS; s++) {
        /* Fixed batches: a simple pattern the model can start to learn. */
        for (int i = 0; i < BATCH * SEQ; i++) {
            tokens[i] = (int32_t)((i * 7 + s * 13 + i / SEQ) % config.vocab);
            targets[i] = (int32_t)((tokens[i] * 3 + 1) % config.vocab);
        }
        mw_feed feeds[2] = {{"tokens", tokens, BATCH * SEQ}, {"targets", targets, BATCH * SEQ}};
        st = mw_trainer_step(tr, feeds, 2, &losses[s]);
    }
    int64_t n = (int64_t)config.padded_vocab * config.channels;
    if (st == MW_OK) st = mw_trainer_read_param(tr, "wte", wte, n);
    if (st != MW_OK)
        fprintf(stderr, "[rank %d] %s: %s\n", mw_distributed_rank(), mw_mesh_describe(mesh),
                mw_last_error());
    mw_trainer_free(tr);
    mw_graph_free(g);
    return st == MW_OK ? 0 : 2;
}

int main(int argc, char **argv) {
    if (mw_distributed_init(&argc, &argv) != MW_OK || argc != 2) {
        fprintf(stderr, "usage: mpi_gpt2 LOCAL_SPEC\n");
        return 2;
    }
    int rank = mw_distributed_rank();
    size_t n = (size_t)config.padded_vocab * config.channels;
    float dist_loss[STEPS], ref_loss[STEPS];
    float *dist_wte = malloc(n * sizeof(float)), *ref_wte = malloc(n * sizeof(float));
    mw_mesh *mesh = NULL, *ref_mesh = NULL;
    int rc = 2;
    if (!dist_wte || !ref_wte) goto done;
    if (mw_mesh_new(argv[1], "X", &mesh) != MW_OK ||
        mw_mesh_new_local("cpu:1", "X", &ref_mesh) != MW_OK) {
        fprintf(stderr, "[rank %d] mesh: %s\n", rank, mw_last_error());
        goto done;
    }
    if ((rc = train(mesh, "X", dist_loss, dist_wte)) ||
        (rc = train(ref_mesh, NULL, ref_loss, ref_wte)))
        goto done;
    rc = 0;
    for (int s = 0; s < STEPS; s++) {
        double rel = fabs((double)dist_loss[s] - ref_loss[s]) / fabs((double)ref_loss[s]);
        if (rank == 0)
            printf("step %d: loss %.6f across %s, %.6f on one device (relative difference %.2g)\n",
                   s, dist_loss[s], mw_mesh_describe(mesh), ref_loss[s], rel);
        if (!(rel <= RTOL)) rc = 1;
    }
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)dist_wte[i] - ref_wte[i]) / (1e-3 + fabs((double)ref_wte[i]));
        if (!(d <= worst)) worst = d;
    }
    printf("[rank %d] wte after %d steps: max relative difference %.2g\n", rank, STEPS, worst);
    if (!(worst <= RTOL)) rc = 1;
done:
    free(dist_wte);
    free(ref_wte);
    mw_mesh_free(mesh);
    mw_mesh_free(ref_mesh);
    if (rc == 2) mw_distributed_abort(2);
    mw_distributed_finalize();
    return rc;
}
