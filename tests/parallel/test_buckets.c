/* Bucketed gradient reduction: however the flat gradient buffer is cut into buckets, training
 * gives the same result (each element is still summed over devices in device order, so the
 * results are not only within tolerance but bitwise equal), and a run repeats itself bit for bit.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2_model.h"
#include "meshwit.h"

#define B 6
#define T 8

static const gpt2_config config = {
    .layers = 2, .heads = 2, .channels = 16, .max_seq = 8, .vocab = 32, .padded_vocab = 32};

/* Trains 5 steps on `devices` with the given bucket size and returns wte afterwards. */
static float *train(const char *devices, size_t bucket_bytes) {
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
    gpt2_graph m;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    cr_assert_eq(gpt2_build(g, &config, &(gpt2_layout){.batch = B, .seq = T, .data_axis = "X"}, &m),
                 MW_OK);
    cr_assert_eq(mw_mesh_new_local(devices, "X", &mesh), MW_OK);
    mw_trainer_config cfg = {.optimizer = {MW_ADAMW, .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f,
                                           .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f},
                             .bucket_bytes = bucket_bytes};
    cr_assert_eq(mw_trainer_new(g, m.loss, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());
    int32_t tok[B * T + 1];
    mw_feed f[2] = {{"tokens", tok, B * T}, {"targets", tok + 1, B * T}};
    for (int s = 0; s < 5; s++) {
        for (int i = 0; i < B * T + 1; i++) tok[i] = (int32_t)((i * 11 + s * 5 + i / 3) % 32);
        cr_assert_eq(mw_trainer_step(tr, f, 2, NULL), MW_OK, "%s", mw_last_error());
    }
    float *w = malloc(32 * 16 * sizeof *w);
    cr_assert_eq(mw_trainer_read_param(tr, "wte", w, 32 * 16), MW_OK);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    return w;
}

Test(buckets, bucket_size_does_not_change_the_result) {
    /* 64 bytes: a bucket per gradient or less; 1 GB: a single bucket. */
    const size_t sizes[] = {64, 4096, 1 << 20, (size_t)1 << 30};
    const char *meshes[] = {"cpu:2", "cpu:3"};
    for (int m = 0; m < 2; m++) {
        float *ref = train(meshes[m], sizes[3]);
        for (int i = 0; i < 3; i++) {
            float *w = train(meshes[m], sizes[i]);
            cr_assert(memcmp(ref, w, 32 * 16 * sizeof *w) == 0,
                      "%s with %zu-byte buckets differs from one bucket", meshes[m], sizes[i]);
            free(w);
        }
        float *again = train(meshes[m], sizes[0]);
        cr_assert(memcmp(ref, again, 32 * 16 * sizeof *again) == 0, "a run did not repeat itself");
        free(again);
        free(ref);
    }
}
