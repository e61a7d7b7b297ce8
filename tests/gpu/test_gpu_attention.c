/* The CUDA fused attention against the CPU one: L = sum(attention(qkv * w) * r) on cuda:0 and on
 * cpu:1, the output and the gradient of w compared (causal and not, several query blocks, batch
 * and head axes), and the GPU result repeated bit for bit. Skipped, visibly, without a GPU;
 * MESHWIT_REQUIRE_GPU=1 turns the skip into a failure. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "meshwit.h"

#ifdef MESHWIT_HAVE_CUDA
#include "devices/cuda/cuda.h"
#endif

static void need_gpu(void) {
#ifdef MESHWIT_HAVE_CUDA
    if (mw__cuda_device_count() > 0) return;
#endif
    const char *req = getenv("MESHWIT_REQUIRE_GPU");
    if (req && strcmp(req, "1") == 0)
        cr_assert_fail("MESHWIT_REQUIRE_GPU=1 but no CUDA device is usable");
    cr_skip("no CUDA device: the GPU attention tests are skipped");
}

static void fill(float *x, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(seed >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
    }
}

enum { B = 2, T = 130, H = 2, D = 32 };
#define NQ ((int64_t)B * T * 3 * H * D)
#define NO (NQ / 3)
#define NW (3 * H * D)

static void run(const char *devices, int causal, const float *qkv, const float *r, float *out,
                float *grad) {
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *x =
        mw_input(g, "x", MW_F32,
                 MW_AXES({"Batch", B}, {"Seq", T}, {"Part", 3}, {"Head", H}, {"HeadDim", D}));
    mw_tensor *rr =
        mw_input(g, "r", MW_F32, MW_AXES({"Batch", B}, {"Seq", T}, {"Head", H}, {"HeadDim", D}));
    mw_tensor *w =
        mw_param(g, "w", MW_AXES({"Part", 3}, {"Head", H}, {"HeadDim", D}), MW_INIT_CONST(1.0f));
    mw_tensor *y = mw_attention(g, mw_mul(g, x, w), "Part", "Seq", "HeadDim", causal, 0.125f);
    mw_tensor *loss = mw_sum(g, mw_mul(g, y, rr), NULL);
    mw_tensor *outs[1] = {y};
    mw_trainer_config cfg = {.optimizer = {MW_SGD, .lr = 0.0f}, .outputs = outs, .noutputs = 1};
    mw_mesh *mesh;
    mw_trainer *tr;
    cr_assert_eq(mw_mesh_new(devices, "X", &mesh), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_new(g, loss, mesh, &cfg, &tr), MW_OK, "%s", mw_last_error());
    mw_feed feeds[2] = {{"x", qkv, NQ}, {"r", r, NO}};
    float l;
    cr_assert_eq(mw_trainer_compute_grads(tr, feeds, 2, &l), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_output(tr, y, out, NO), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_trainer_read_grad(tr, "w", grad, NW), MW_OK, "%s", mw_last_error());
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
}

/* Both sides sum at most T products of O(1) values in float, in different orders: a few hundred
 * ULPs of the magnitudes involved; 1e-5 absolute + 1e-4 relative (outputs) and 1e-4 of the sum of
 * magnitudes (gradients, summed over B x T rows) are well above that and far below any bug. */
static void compare(int causal) {
    need_gpu();
    float *qkv = malloc(sizeof(float) * NQ), *r = malloc(sizeof(float) * NO);
    float *oc = malloc(sizeof(float) * NO), *og = malloc(sizeof(float) * NO);
    float gc[NW], gg[NW], og2_grad[NW];
    float *og2 = malloc(sizeof(float) * NO);
    fill(qkv, NQ, 21);
    fill(r, NO, 22);
    run("cpu:1", causal, qkv, r, oc, gc);
    run("cuda:0", causal, qkv, r, og, gg);
    for (int64_t i = 0; i < NO; i++)
        cr_assert_leq(fabsf(og[i] - oc[i]), 1e-5f + 1e-4f * fabsf(oc[i]), "out[%lld]: %g vs %g",
                      (long long)i, og[i], oc[i]);
    for (int i = 0; i < NW; i++)
        cr_assert_leq(fabsf(gg[i] - gc[i]), 1e-3f * (1.0f + fabsf(gc[i])), "d w[%d]: %g vs %g", i,
                      gg[i], gc[i]);
    run("cuda:0", causal, qkv, r, og2, og2_grad);
    cr_assert_eq(memcmp(og, og2, sizeof(float) * NO), 0, "GPU output not repeatable");
    cr_assert_eq(memcmp(gg, og2_grad, sizeof gg), 0, "GPU gradient not repeatable");
    free(qkv), free(r), free(oc), free(og), free(og2);
}

TestSuite(gpu_attention, .description = "CUDA fused attention vs the CPU backend", .timeout = 120);

Test(gpu_attention, causal) { compare(1); }

Test(gpu_attention, full) { compare(0); }
