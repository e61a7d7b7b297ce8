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
 *   mpi_gpt2 LOCAL_SPEC split AXES DATA MODEL
 *                              parameters split over mesh axis MODEL of the mesh AXES spanning
 *                              the processes (DATA: the batch axis, or - for none), e.g. cpu:2
 *                              split X=2,Y=2 X Y (tensor parallel inside each process) or cpu:1
 *                              split Y=2 - Y (across them): 10 steps' losses within 1e-5
 *                              relative of one device of one process, and every parameter within
 *                              1e-4 absolutely; a second run the same bits; the checkpoint
 * every process saves (gathering the other processes' shards) equal to that of the same mesh inside
 * one process to 1e-5, and loaded into a new trainer it gives back the same bits Exit 0 when they
 * agree, 1 when they do not, 2 on an error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpt2_model.h"

#define BATCH 4
#define SEQ 16
#define STEPS 10  /* at most; the zero1 and plain modes run 4 */
#define RTOL 1e-4 /* float sums in another order, through 2 layers and AdamW */

static int zero1_mode; /* comparing ZeRO-1 with the replicated update */
static int steps = 4;
static const char *model_axis; /* split mode: the trainer's mesh splits parameters over it */
static const char *save_to, *load_from; /* split mode: a checkpoint to write after training, or
                                         * to load instead of training */

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

/* The model axis of a split-mode mesh (NULL for the one-device reference). */
static const char *mesh_split(const mw_mesh *mesh) {
    return model_axis && mw_mesh_size(mesh) > 1 ? model_axis : NULL;
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
    const char *split = mesh_split(mesh);
    mw_status st =
        gst ? gst
            : gpt2_build(g, &config,
                         &(gpt2_layout){
                             .batch = BATCH, .seq = SEQ, .data_axis = axis, .model_axis = split},
                         &m);
    if (st == MW_OK) st = mw_trainer_new(g, m.loss, mesh, &cfg, &tr);
    if (st == MW_OK && split && load_from) st = mw_trainer_load(tr, load_from, NULL, 0, NULL);
    int32_t tokens[BATCH * SEQ], targets[BATCH * SEQ];
    for (int s = 0; st == MW_OK && !(split && load_from) && s < steps; s++) {
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
    if (st == MW_OK && split && save_to) st = mw_trainer_save(tr, save_to, NULL, 0);
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
    for (int s = 0; s < steps; s++) {
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
    printf("[rank %d] wte after %d steps: max relative difference %.2g\n", rank, steps, worst);
    return rc || !(worst <= RTOL);
}

/* ZeRO-1 against the replicated update on the same mesh, bit for bit. */
static int against_replicated(const mw_mesh *mesh, const run *zero1, const run *repl) {
    int rank = mw_distributed_rank(), rc = zero1->nparams != repl->nparams;
    for (int s = 0; s < steps; s++) {
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
           rank, (long long)repl->nparams, steps, (long long)differ);
    return rc || differ;
}

/* Split parameters: losses and parameters against one device, a second run bit for bit. */
static int split_against(const mw_mesh *mesh, const run *a, const run *again, const run *ref) {
    int rank = mw_distributed_rank(),
        rc = a->nparams != ref->nparams || a->nparams != again->nparams;
    for (int s = 0; s < steps; s++) {
        double rel = fabs((double)a->losses[s] - ref->losses[s]) / fabs((double)ref->losses[s]);
        int same = memcmp(&a->losses[s], &again->losses[s], sizeof(float)) == 0;
        if (rank == 0)
            printf("step %d: loss %.7f across %s (again: %s), %.7f on one device (relative "
                   "difference %.2g)\n",
                   s + 1, a->losses[s], mw_mesh_describe(mesh), same ? "the same bits" : "DIFFERS",
                   ref->losses[s], rel);
        if (!(rel <= 1e-5) || !same) rc = 1;
    }
    /* AdamW moves an element by about lr a step whatever its gradient's size, so an element
     * whose gradient is near zero may move differently after float-rounding differences: the
     * parameters are compared absolutely: 1e-4 (measured: 2.5e-6 after 10 steps of lr 1e-3). */
    double worst = 0;
    int64_t differ = 0;
    for (int64_t i = 0; !rc && i < a->nparams; i++) {
        double d = fabs((double)a->params[i] - ref->params[i]);
        if (!(d <= worst)) worst = d;
        differ += memcmp(&a->params[i], &again->params[i], sizeof(float)) != 0;
    }
    printf("[rank %d] %lld parameters after %d steps: max absolute difference %.2g from one "
           "device, %lld differ in the second run\n",
           rank, (long long)a->nparams, steps, worst, (long long)differ);
    return rc || differ || !(worst <= 1e-4);
}

/* Two checkpoint files: the same length, every 4-byte word the same or, as floats, within 1e-5
 * relative (the trailing checksum excepted). */
static int checkpoints_agree(const char *pa, const char *pb) {
    FILE *fa = fopen(pa, "rb"), *fb = fopen(pb, "rb");
    long na = 0, nb = 0, far = 0;
    float *a = NULL, *b = NULL;
    if (fa && fb && fseek(fa, 0, SEEK_END) == 0 && fseek(fb, 0, SEEK_END) == 0) {
        na = ftell(fa);
        nb = ftell(fb);
        rewind(fa);
        rewind(fb);
    }
    int ok = na > 8 && na == nb && na % 4 == 0 && (a = malloc((size_t)na)) &&
             (b = malloc((size_t)nb)) && fread(a, 1, (size_t)na, fa) == (size_t)na &&
             fread(b, 1, (size_t)nb, fb) == (size_t)nb;
    for (long i = 0; ok && i < (na - 8) / 4; i++)
        if (memcmp(&a[i], &b[i], 4) != 0 &&
            !(fabs((double)a[i] - b[i]) <= 1e-5 * fabs((double)b[i]) + 1e-30))
            far++;
    printf("[rank %d] checkpoint across processes against one process's of the same mesh: %s "
           "(%ld bytes, %ld words beyond 1e-5)\n",
           mw_distributed_rank(), ok && !far ? "agree" : "DIFFER", na, far);
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    free(a);
    free(b);
    return !ok || far;
}

static int split_main(const char *spec, const char *axes, const char *data, const char *model) {
    steps = STEPS;
    model_axis = model;
    const char *axis = strcmp(data, "-") ? data : NULL;
    run a = {0}, again = {0}, ref = {0}, local = {0}, back = {0};
    mw_mesh *mesh = NULL, *one = NULL, *same = NULL;
    char dist_path[64], local_path[64], nd[32];
    ckpt_path(dist_path, sizeof dist_path, "split");
    ckpt_path(local_path, sizeof local_path, "local");
    int rc = 2;
    if (mw_mesh_new(spec, axes, &mesh) != MW_OK || mw_mesh_new_local("cpu:1", "X", &one) != MW_OK ||
        (snprintf(nd, sizeof nd, "cpu:%d", mw_mesh_size(mesh)),
         mw_mesh_new_local(nd, axes, &same) != MW_OK)) {
        fprintf(stderr, "[rank %d] mesh: %s\n", mw_distributed_rank(), mw_last_error());
        goto done;
    }
    save_to = dist_path;
    if ((rc = train(mesh, axis, 0, &a))) goto done;
    save_to = NULL;
    if ((rc = train(mesh, axis, 0, &again)) || (rc = train(one, NULL, 0, &ref))) goto done;
    save_to = local_path;
    if ((rc = train(same, axis, 0, &local))) goto done;
    save_to = NULL;
    load_from = dist_path;
    if ((rc = train(mesh, axis, 0, &back))) goto done;
    load_from = NULL;
    rc = split_against(mesh, &a, &again, &ref) | checkpoints_agree(dist_path, local_path);
    int64_t differ = back.nparams != a.nparams;
    for (int64_t i = 0; !differ && i < a.nparams; i++)
        differ += memcmp(&a.params[i], &back.params[i], sizeof(float)) != 0;
    printf("[rank %d] the checkpoint loaded across processes: %lld parameters differ\n",
           mw_distributed_rank(), (long long)differ);
    rc |= differ != 0;
done:
    remove(dist_path);
    remove(local_path);
    free(a.params);
    free(again.params);
    free(ref.params);
    free(local.params);
    free(back.params);
    mw_mesh_free(mesh);
    mw_mesh_free(one);
    mw_mesh_free(same);
    return rc;
}

int main(int argc, char **argv) {
    if (mw_distributed_init(&argc, &argv) != MW_OK) return 2;
    if (argc == 6 && strcmp(argv[2], "split") == 0) {
        int rc = split_main(argv[1], argv[3], argv[4], argv[5]);
        if (rc == 2) mw_distributed_abort(2);
        mw_distributed_finalize();
        return rc;
    }
    int zero1 = argc == 3 && strcmp(argv[2], "zero1") == 0;
    zero1_mode = zero1;
    if (argc != 2 && !zero1) {
        fprintf(stderr, "usage: mpi_gpt2 LOCAL_SPEC [zero1 | split AXES DATA MODEL]\n");
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
