/* Run under mpirun: ZeRO-1 (mw_trainer_config.shard_optimizer) on a mesh spanning every process
 * must train bitwise as the replicated update on the same mesh: a few AdamW steps with weight
 * decay and clipping of a small GPT-2 (examples/common/gpt2_model.c), every step's loss and
 * gradient norm, and every parameter after the last step. Saving a checkpoint and reading
 * gradients, which would need the other processes' slices, are refused with MW_ERR_UNSUPPORTED.
 *
 *   mpi_zero1 LOCAL_SPEC        e.g. cpu:1 or cpu:2 under `mpirun -np 2`
 * Exit 0 when they agree, 1 when they do not, 2 on an error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2_model.h"

#define BATCH 4
#define SEQ 16
#define STEPS 4

static const gpt2_config config = {
    .layers = 2, .heads = 2, .channels = 32, .max_seq = 16, .vocab = 61, .padded_vocab = 64};

typedef struct run {
    float losses[STEPS], norms[STEPS];
    float *params;
    int64_t nparams;
} run;

static int train(mw_mesh *mesh, int shard_optimizer, run *out) {
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
                                           .grad_clip = 0.5f},
                             .shard_optimizer = shard_optimizer};
    mw_status st = gst ? gst : gpt2_build(g, &config, BATCH, SEQ, "X", &m);
    if (st == MW_OK) st = mw_trainer_new(g, m.loss, mesh, &cfg, &tr);
    int32_t tokens[BATCH * SEQ], targets[BATCH * SEQ];
    for (int s = 0; st == MW_OK && s < STEPS; s++) {
        for (int i = 0; i < BATCH * SEQ; i++) {
            tokens[i] = (int32_t)((i * 7 + s * 13 + i / SEQ) % config.vocab);
            targets[i] = (int32_t)((tokens[i] * 3 + 1) % config.vocab);
        }
        mw_feed feeds[2] = {{"tokens", tokens, BATCH * SEQ}, {"targets", targets, BATCH * SEQ}};
        st = mw_trainer_step(tr, feeds, 2, &out->losses[s]);
        out->norms[s] = mw_trainer_grad_norm(tr);
    }
    /* Not gathered across processes yet: refused, instead of a file or gradients with holes. */
    if (st == MW_OK && shard_optimizer) {
        float g[32]; /* lnfb: channels floats */
        char path[64];
        snprintf(path, sizeof path, "mpi_zero1.%d.ckpt", mw_distributed_rank());
        if (mw_trainer_save(tr, path, NULL, 0) != MW_ERR_UNSUPPORTED ||
            mw_trainer_read_grad(tr, "lnfb", g, config.channels) != MW_ERR_UNSUPPORTED) {
            fprintf(stderr, "[rank %d] ZeRO-1 save or read_grad across processes not refused\n",
                    mw_distributed_rank());
            remove(path);
            st = MW_ERR_STATE;
        }
    }
    /* Every parameter, one after another. */
    int64_t at = 0;
    for (int i = 0; st == MW_OK && i < mw_graph_param_count(g); i++) {
        mw_param_info info;
        if ((st = mw_graph_param_info(g, i, &info))) break;
        float *grown = realloc(out->params, (size_t)(at + info.count) * sizeof(float));
        if (!grown) {
            st = MW_ERR_NOMEM;
            break;
        }
        out->params = grown;
        st = mw_trainer_read_param(tr, info.name, out->params + at, info.count);
        at += info.count;
    }
    out->nparams = at;
    if (st != MW_OK)
        fprintf(stderr, "[rank %d] %s, shard_optimizer %d: %s\n", mw_distributed_rank(),
                mw_mesh_describe(mesh), shard_optimizer, mw_last_error());
    mw_trainer_free(tr);
    mw_graph_free(g);
    return st == MW_OK ? 0 : 2;
}

int main(int argc, char **argv) {
    if (mw_distributed_init(&argc, &argv) != MW_OK || argc != 2) {
        fprintf(stderr, "usage: mpi_zero1 LOCAL_SPEC\n");
        return 2;
    }
    int rank = mw_distributed_rank();
    mw_mesh *mesh = NULL;
    run replicated = {0}, sharded = {0};
    int rc = 2;
    if (mw_mesh_new(argv[1], "X", &mesh) != MW_OK) {
        fprintf(stderr, "[rank %d] mesh: %s\n", rank, mw_last_error());
        goto done;
    }
    if ((rc = train(mesh, 0, &replicated)) || (rc = train(mesh, 1, &sharded))) goto done;
    rc = replicated.nparams != sharded.nparams;
    for (int s = 0; s < STEPS; s++) {
        int same = memcmp(&replicated.losses[s], &sharded.losses[s], sizeof(float)) == 0 &&
                   memcmp(&replicated.norms[s], &sharded.norms[s], sizeof(float)) == 0;
        if (rank == 0)
            printf("step %d across %s: loss %.7f, gradient norm %.7f; ZeRO-1 %.7f, %.7f%s\n", s,
                   mw_mesh_describe(mesh), replicated.losses[s], replicated.norms[s],
                   sharded.losses[s], sharded.norms[s], same ? "" : " DIFFER");
        if (!same) rc = 1;
    }
    int64_t differ = 0;
    for (int64_t i = 0; !rc && i < replicated.nparams; i++)
        differ += memcmp(&replicated.params[i], &sharded.params[i], sizeof(float)) != 0;
    printf("[rank %d] %lld parameters after %d steps: %lld differ from the replicated update\n",
           rank, (long long)replicated.nparams, STEPS, (long long)differ);
    if (differ) rc = 1;
done:
    free(replicated.params);
    free(sharded.params);
    mw_mesh_free(mesh);
    if (rc == 2) mw_distributed_abort(2);
    mw_distributed_finalize();
    return rc;
}
