/* Run under mpirun: a few AdamW steps of a small GPT-2 (examples/common/gpt2_model.c) with the
 * batch sharded over every process.
 *
 *   mpi_gpt2 LOCAL_SPEC        e.g. cpu:1 under `mpirun -np 2`: must match unsharded training on
 *                              one device of one process: every step's loss, and the token
 *                              embedding after the last step, within 1e-4 relative
 *   mpi_gpt2 LOCAL_SPEC zero1  ZeRO-1 (shard_optimizer) on the mesh spanning the processes must
 *                              train bitwise as the replicated update on it: every step's loss
 *                              and gradient norm (clipping is active), every parameter after the
 *                              last step; the checkpoints both write (ZeRO-1 gathering the
 *                              other processes' moments) hold the same bytes; reading gradients,
 *                              which would need the other processes' slices, is refused
 *                              (MW_ERR_UNSUPPORTED)
 * Exit 0 when they agree, 1 when they do not, 2 on an error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpt2_model.h"

#define BATCH 4
#define SEQ 16
#define STEPS 4
#define RTOL 1e-4 /* float sums in another order, through 2 layers and AdamW */

static int zero1_mode; /* comparing ZeRO-1 with the replicated update */

static const gpt2_config config = {
    .layers = 2, .heads = 2, .channels = 32, .max_seq = 16, .vocab = 61, .padded_vocab = 64};

typedef struct run {
    float losses[STEPS], norms[STEPS];
    float *params;        /* every parameter, in declaration order */
    int64_t nparams, wte; /* wte: the token embedding's offset in params */
} run;

/* ZeRO-1 across processes: reading gradients, which needs the other processes' slices, is
 * refused. */
static mw_status refusals(mw_trainer *tr) {
    float g[32]; /* lnfb: channels floats */
    if (mw_trainer_read_grad(tr, "lnfb", g, config.channels) == MW_ERR_UNSUPPORTED) return MW_OK;
    fprintf(stderr, "[rank %d] ZeRO-1: reading gradients across processes was not refused\n",
            mw_distributed_rank());
    return MW_ERR_STATE;
}

/* This process's checkpoint of a run ("zero1" or "replicated"), named by its process id too:
 * the tests of this program run side by side under ctest -j in one folder. */
static void ckpt_path(char *out, size_t size, const char *mode) {
    snprintf(out, size, "mpi_gpt2.%ld.%d.%s.ckpt", (long)getpid(), mw_distributed_rank(), mode);
}

/* The two checkpoints hold the same bytes (both modes write whole moments). */
static int same_checkpoints(void) {
    char pa[64], pb[64];
    ckpt_path(pa, sizeof pa, "zero1");
    ckpt_path(pb, sizeof pb, "replicated");
    FILE *fa = fopen(pa, "rb"), *fb = fopen(pb, "rb");
    int same = fa && fb, ca = 0, cb = 0;
    long bytes = 0;
    while (same && (ca = fgetc(fa)) != EOF) {
        cb = fgetc(fb);
        same = ca == cb;
        bytes++;
    }
    same = same && fgetc(fb) == EOF && bytes > 0;
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    printf("[rank %d] checkpoints of ZeRO-1 and the replicated update: %s (%ld bytes)\n",
           mw_distributed_rank(), same ? "the same bytes" : "DIFFER", bytes);
    remove(pa);
    remove(pb);
    return !same;
}

static int train(mw_mesh *mesh, const char *axis, int shard_optimizer, run *out) {
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
                                           .grad_clip = 1.0f},
                             .shard_optimizer = shard_optimizer};
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
        st = mw_trainer_step(tr, feeds, 2, &out->losses[s]);
        out->norms[s] = mw_trainer_grad_norm(tr);
    }
    if (st == MW_OK && shard_optimizer) st = refusals(tr);
    if (st == MW_OK && axis && zero1_mode) { /* both runs of the zero1 comparison save */
        char path[64];
        ckpt_path(path, sizeof path, shard_optimizer ? "zero1" : "replicated");
        st = mw_trainer_save(tr, path, NULL, 0);
    }
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
        if (strcmp(info.name, "wte") == 0) out->wte = at;
        st = mw_trainer_read_param(tr, info.name, out->params + at, info.count);
        at += info.count;
    }
    out->nparams = at;
    if (st != MW_OK)
        fprintf(stderr, "[rank %d] %s%s: %s\n", mw_distributed_rank(), mw_mesh_describe(mesh),
                shard_optimizer ? " with ZeRO-1" : "", mw_last_error());
    mw_trainer_free(tr);
    mw_graph_free(g);
    return st == MW_OK ? 0 : 2;
}

/* The distributed run against one device of one process, within RTOL. */
static int against_one_device(const mw_mesh *mesh, const run *dist, const run *ref) {
    int rank = mw_distributed_rank(), rc = 0;
    for (int s = 0; s < STEPS; s++) {
        double rel = fabs((double)dist->losses[s] - ref->losses[s]) / fabs((double)ref->losses[s]);
        if (rank == 0)
            printf("step %d: loss %.6f across %s, %.6f on one device (relative difference %.2g)\n",
                   s, dist->losses[s], mw_mesh_describe(mesh), ref->losses[s], rel);
        if (!(rel <= RTOL)) rc = 1;
    }
    double worst = 0;
    size_t n = (size_t)config.padded_vocab * config.channels;
    const float *a = dist->params + dist->wte, *b = ref->params + ref->wte;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / (1e-3 + fabs((double)b[i]));
        if (!(d <= worst)) worst = d;
    }
    printf("[rank %d] wte after %d steps: max relative difference %.2g\n", rank, STEPS, worst);
    return rc || !(worst <= RTOL);
}

/* ZeRO-1 against the replicated update on the same mesh, bit for bit. */
static int against_replicated(const mw_mesh *mesh, const run *zero1, const run *repl) {
    int rank = mw_distributed_rank(), rc = zero1->nparams != repl->nparams;
    for (int s = 0; s < STEPS; s++) {
        int same = memcmp(&zero1->losses[s], &repl->losses[s], sizeof(float)) == 0 &&
                   memcmp(&zero1->norms[s], &repl->norms[s], sizeof(float)) == 0;
        if (rank == 0)
            printf("step %d across %s: loss %.7f, gradient norm %.7f; ZeRO-1 %.7f, %.7f%s\n", s,
                   mw_mesh_describe(mesh), repl->losses[s], repl->norms[s], zero1->losses[s],
                   zero1->norms[s], same ? "" : " DIFFER");
        if (!same) rc = 1;
    }
    int64_t differ = 0;
    for (int64_t i = 0; !rc && i < repl->nparams; i++)
        differ += memcmp(&zero1->params[i], &repl->params[i], sizeof(float)) != 0;
    printf("[rank %d] %lld parameters after %d steps: %lld differ from the replicated update\n",
           rank, (long long)repl->nparams, STEPS, (long long)differ);
    return rc || differ;
}

int main(int argc, char **argv) {
    if (mw_distributed_init(&argc, &argv) != MW_OK) return 2;
    int zero1 = argc == 3 && strcmp(argv[2], "zero1") == 0;
    zero1_mode = zero1;
    if (argc != 2 && !zero1) {
        fprintf(stderr, "usage: mpi_gpt2 LOCAL_SPEC [zero1]\n");
        return 2;
    }
    int rank = mw_distributed_rank();
    run a = {0}, b = {0};
    mw_mesh *mesh = NULL, *ref_mesh = NULL;
    int rc = 2;
    if (mw_mesh_new(argv[1], "X", &mesh) != MW_OK ||
        mw_mesh_new_local("cpu:1", "X", &ref_mesh) != MW_OK) {
        fprintf(stderr, "[rank %d] mesh: %s\n", rank, mw_last_error());
        goto done;
    }
    if ((rc = train(mesh, "X", zero1, &a)) ||
        (rc = zero1 ? train(mesh, "X", 0, &b) : train(ref_mesh, NULL, 0, &b)))
        goto done;
    rc = zero1 ? against_replicated(mesh, &a, &b) || same_checkpoints()
               : against_one_device(mesh, &a, &b);
done:
    free(a.params);
    free(b.params);
    mw_mesh_free(mesh);
    mw_mesh_free(ref_mesh);
    if (rc == 2) mw_distributed_abort(2);
    mw_distributed_finalize();
    return rc;
}
