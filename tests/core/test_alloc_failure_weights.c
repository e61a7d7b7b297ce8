/* Out of memory in the paths around weights and inference: saving and loading a safetensors
 * file, an inference program made from a trainer and one with its own parameters, each run. The
 * Nth host allocation fails, for every N the scenario makes; every call must report
 * MW_ERR_NOMEM (LeakSanitizer, in the AddressSanitizer build, fails any leak). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gpt2_model.h"
#include "meshwit.h"
#include "meshwit/testing.h"

static mw_status scenario(const char *path) {
    gpt2_config c = {
        .layers = 1, .heads = 2, .channels = 8, .max_seq = 4, .vocab = 16, .padded_vocab = 16};
    mw_graph *g = NULL;
    mw_mesh *mesh = NULL;
    mw_trainer *tr = NULL;
    mw_infer *shared = NULL, *own = NULL;
    gpt2_graph m;
    int32_t tokens[3 * 4];
    float logits[3 * 4 * 16];
    for (int i = 0; i < 12; i++) tokens[i] = i % 16;
    mw_feed feed = {"tokens", tokens, 12};
    mw_fetch fetch = {NULL, logits, 3 * 4 * 16};
    mw_status st = mw_graph_new(&g);
    if (st == MW_OK) st = gpt2_build(g, &c, &(gpt2_layout){.batch = 2, .seq = 4}, &m);
    fetch.output = m.logits;
    mw_infer_config ic = {.outputs = &m.logits, .noutputs = 1};
    if (st == MW_OK) st = mw_mesh_new("cpu:1", "X", &mesh);
    if (st == MW_OK) st = mw_trainer_new(g, m.loss, mesh, NULL, &tr);
    if (st == MW_OK) st = mw_trainer_save_weights(tr, path, NULL, 0);
    if (st == MW_OK) st = mw_trainer_load_weights(tr, path, NULL, 0);
    if (st == MW_OK) st = mw_infer_from_trainer(tr, g, &ic, &shared);
    if (st == MW_OK) st = mw_infer_run(shared, &feed, 1, 3, &fetch, 1);
    if (st == MW_OK) st = mw_infer_new(g, mesh, &ic, &own);
    if (st == MW_OK) st = mw_infer_load_weights(own, path, NULL, 0);
    if (st == MW_OK) st = mw_infer_run(own, &feed, 1, 3, &fetch, 1);
    if (st != MW_OK) {
        cr_assert_eq(st, MW_ERR_NOMEM, "expected MW_ERR_NOMEM, got %s: %s", mw_status_name(st),
                     mw_last_error());
        cr_assert(strstr(mw_last_error(), "out of memory"), "message: %s", mw_last_error());
    }
    mw_infer_free(own);
    mw_infer_free(shared);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    return st;
}

Test(alloc_failure, weights_and_inference, .timeout = 120) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/mw_alloc_%d.safetensors", (int)getpid());
    mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)(0));
    cr_assert_eq(scenario(path), MW_OK, "%s", mw_last_error());
    int64_t total = mw_test_control(MW_TEST_ALLOCATIONS);
    int failed = 0;
    for (int64_t n = 1; n <= total; n++) {
        mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)(n));
        failed += scenario(path) != MW_OK;
    }
    mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)(0));
    cr_assert_eq(failed, total, "%d of %lld injected failures surfaced", failed, (long long)total);
    cr_assert_eq(scenario(path), MW_OK, "the library does not recover after failures");
    remove(path);
}
