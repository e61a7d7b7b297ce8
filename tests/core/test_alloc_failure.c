/* Out of memory everywhere: make the Nth host allocation fail, for every N up to the number a
 * whole scenario makes, and check that each call reports MW_ERR_NOMEM (or succeeds when the
 * failure hit nothing it needed) and that everything can be freed. The AddressSanitizer build
 * runs these under LeakSanitizer, which fails the test on any leak. */
#include <criterion/criterion.h>
#include <string.h>

#include "gpt2_model.h"
#include "meshwit.h"
#include "meshwit/testing.h"

/* One scenario: trace a small GPT-2, compile it for `devices`, run a step. Returns the first
 * error (checking it is an out-of-memory one) or MW_OK. */
static mw_status scenario(const char *devices) {
    gpt2_config c = {
        .layers = 1, .heads = 2, .channels = 8, .max_seq = 4, .vocab = 16, .padded_vocab = 16};
    mw_graph *g = NULL;
    mw_mesh *mesh = NULL;
    mw_trainer *tr = NULL;
    gpt2_graph m;
    int32_t tokens[2 * 4 + 1];
    for (int i = 0; i < 9; i++) tokens[i] = i % 16;
    mw_feed feeds[2] = {{"tokens", tokens, 8}, {"targets", tokens + 1, 8}};
    mw_trainer_config cfg = {.optimizer = {MW_ADAMW, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f,
                                           .eps = 1e-8f, .weight_decay = 0.1f}};
    mw_status st = mw_graph_new(&g);
    if (st == MW_OK)
        st = gpt2_build(g, &c, &(gpt2_layout){.batch = 2, .seq = 4, .data_axis = "X"}, &m);
    if (st == MW_OK) st = mw_mesh_new(devices, "X", &mesh);
    if (st == MW_OK) st = mw_trainer_new(g, m.loss, mesh, &cfg, &tr);
    if (st == MW_OK) st = mw_trainer_step(tr, feeds, 2, NULL);
    if (st != MW_OK) {
        cr_assert_eq(st, MW_ERR_NOMEM, "expected MW_ERR_NOMEM, got %s: %s", mw_status_name(st),
                     mw_last_error());
        cr_assert(strstr(mw_last_error(), "out of memory"), "message: %s", mw_last_error());
    }
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    return st;
}

static void every_allocation(const char *devices) {
    mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)(0));
    cr_assert_eq(scenario(devices), MW_OK, "%s", mw_last_error());
    int64_t total = mw_test_control(MW_TEST_ALLOCATIONS);
    cr_assert_gt(total, 10);
    int failed = 0;
    for (int64_t n = 1; n <= total; n++) {
        mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)(n));
        failed += scenario(devices) != MW_OK;
    }
    mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)(0));
    /* Every allocation matters to some call, so every injected failure must surface. */
    cr_assert_eq(failed, total, "%d of %lld injected failures surfaced", failed, (long long)total);
    cr_assert_eq(scenario(devices), MW_OK, "the library does not recover after failures");
}

Test(alloc_failure, every_allocation_one_device, .timeout = 120) { every_allocation("cpu:1"); }

Test(alloc_failure, every_allocation_two_devices, .timeout = 120) { every_allocation("cpu:2"); }
