/* Device specs and meshes: how many devices a spec names, how a mesh describes itself, and the
 * error (code and message) of every malformed spec or axis list. */
#include <criterion/criterion.h>

#include <string.h>

#include "meshwit.h"

static mw_mesh *mesh_ok(const char *devices, const char *axes) {
    mw_mesh *m = NULL;
    mw_status st = mw_mesh_new(devices, axes, &m);
    cr_assert_eq(st, MW_OK, "mw_mesh_new(\"%s\", \"%s\"): %s: %s", devices, axes ? axes : "NULL",
                 mw_status_name(st), mw_last_error());
    cr_assert_not_null(m);
    return m;
}

static void expect_size(const char *devices, const char *axes, int size) {
    mw_mesh *m = mesh_ok(devices, axes);
    cr_assert_eq(mw_mesh_size(m), size, "%s has %d devices", devices, mw_mesh_size(m));
    mw_mesh_free(m);
}

static void expect_describe(const char *devices, const char *axes, const char *text) {
    mw_mesh *m = mesh_ok(devices, axes);
    cr_assert_str_eq(mw_mesh_describe(m), text);
    mw_mesh_free(m);
}

/* mw_mesh_new fails with `code`, leaves *out NULL, and the message contains `needle`. */
static void expect_fail(const char *devices, const char *axes, mw_status code, const char *needle) {
    mw_mesh *m = NULL;
    mw_status st = mw_mesh_new(devices, axes, &m);
    cr_assert_eq(st, code, "mw_mesh_new(\"%s\", \"%s\"): expected %s, got %s (%s)",
                 devices ? devices : "NULL", axes ? axes : "NULL", mw_status_name(code),
                 mw_status_name(st), mw_last_error());
    cr_assert_null(m);
    cr_assert_gt(strlen(mw_last_error()), 0);
    if (needle)
        cr_assert_not_null(strstr(mw_last_error(), needle), "message \"%s\" does not name \"%s\"",
                           mw_last_error(), needle);
}

TestSuite(mesh, .description = "device specs and meshes");

Test(mesh, cpu_device_counts) {
    expect_size("cpu", "X", 1);
    expect_size("cpu:1", "X", 1);
    expect_size("cpu:2", "X", 2);
    expect_size("cpu:4", "X", 4);
    expect_size("cpu:4", NULL, 4);
    expect_size("cpu:64", "X", MW_MAX_DEVICES);
}

Test(mesh, describe_one_axis) {
    expect_describe("cpu:2", "X", "Mesh(X -> 2) over cpu:0, cpu:1");
    expect_describe("cpu:2", NULL, "Mesh(X -> 2) over cpu:0, cpu:1");
    expect_describe("cpu:2", "X=2", "Mesh(X -> 2) over cpu:0, cpu:1");
    expect_describe("cpu", "X", "Mesh(X -> 1) over cpu:0");
    expect_describe("cpu:3", "Data", "Mesh(Data -> 3) over cpu:0, cpu:1, cpu:2");
}

Test(mesh, describe_two_axes) {
    mw_mesh *m = mesh_ok("cpu:4", "Host=2,X=2");
    cr_assert_eq(mw_mesh_size(m), 4);
    const char *text = mw_mesh_describe(m);
    const char *host = strstr(text, "Host -> 2"), *x = strstr(text, "X -> 2");
    cr_assert(host && x && host < x, "\"%s\" names Host -> 2, then X -> 2", text);
    cr_assert_not_null(strstr(text, "over cpu:0, cpu:1, cpu:2, cpu:3"), "%s", text);
    /* An axis without a size takes the devices the others leave. */
    mw_mesh *implicit = mesh_ok("cpu:4", "Host=2,X");
    cr_assert_str_eq(mw_mesh_describe(implicit), text);
    mw_mesh_free(implicit);
    mw_mesh_free(m);

    m = mesh_ok("cpu:6", "Host=3,X=2");
    text = mw_mesh_describe(m);
    cr_assert(strstr(text, "Host -> 3") && strstr(text, "X -> 2"), "%s", text);
    mw_mesh_free(m);
}

Test(mesh, malformed_device_specs) {
    const char *specs[] = {"cpu:0",  "cpu:-1", "cpu:abc", "gpu:0",
                           "cpu:2,", "cpu:",   "cpu:1x",  "cpu:65"};
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++)
        expect_fail(specs[i], "X", MW_ERR_DEVICE, specs[i]);
    expect_fail("", "X", MW_ERR_DEVICE, NULL);
}

Test(mesh, axes_that_do_not_fit_the_devices) {
    expect_fail("cpu:2", "X=3", MW_ERR_INVALID, "3");
    expect_fail("cpu:4", "Host=2,X=3", MW_ERR_INVALID, "6");
    expect_fail("cpu:4", "Host=2,X=2,Y=2", MW_ERR_INVALID, "8");
    expect_fail("cpu:2", "X=0", MW_ERR_INVALID, "X");
    expect_fail("cpu:2", "X=-2", MW_ERR_INVALID, "X");
    expect_fail("cpu:2", "A=1,B=1,C=1,D=1,E=2", MW_ERR_INVALID, NULL); /* > MW_MAX_MESH_AXES */
}

Test(mesh, bad_axis_names) {
    expect_fail("cpu:2", "X@Y", MW_ERR_INVALID, "X@Y");
    expect_fail("cpu:2", "", MW_ERR_INVALID, NULL);
    expect_fail("cpu:4", "X=2,X=2", MW_ERR_INVALID, "X");
    expect_fail("cpu:4", "Host=2,", MW_ERR_INVALID, NULL);
    expect_fail("cpu:2", "X=two", MW_ERR_INVALID, "two");
    char long_name[MW_MAX_NAME + 1];
    memset(long_name, 'L', MW_MAX_NAME);
    long_name[MW_MAX_NAME] = '\0';
    expect_fail("cpu:2", long_name, MW_ERR_INVALID, NULL);
}

Test(mesh, null_arguments) {
    mw_mesh *m = NULL;
    cr_assert_eq(mw_mesh_new("cpu:2", "X", NULL), MW_ERR_INVALID);
    cr_assert_neq(mw_mesh_new(NULL, "X", &m), MW_OK);
    cr_assert_null(m);
    mw_mesh_free(NULL);
}

/* Without a GPU (or in a build without CUDA) there are no CUDA devices, and naming one is a
 * device error that says so, not a crash. */
Test(mesh, cuda_without_gpus) {
    int count = mw_cuda_device_count();
    cr_assert_geq(count, 0);
    if (count > 0)
        cr_skip_test("%d CUDA devices present; this test covers machines without one", count);
    mw_mesh *m = NULL;
    cr_assert_eq(mw_mesh_new("cuda:0", "X", &m), MW_ERR_DEVICE, "%s", mw_last_error());
    cr_assert_null(m);
    const char *msg = mw_last_error();
    cr_log_info("cuda:0 without a GPU: %s", msg);
    cr_assert_not_null(strstr(msg, "cuda:0"), "the message names the device: %s", msg);
    cr_assert(strstr(msg, "no CUDA") || strstr(msg, "no GPU") || strstr(msg, "without CUDA") ||
                  strstr(msg, "not available") || strstr(msg, "0 CUDA"),
              "the message says that no GPU is usable: %s", msg);
    cr_assert_eq(mw_mesh_new("cuda:all", "X", &m), MW_ERR_DEVICE, "%s", mw_last_error());
    cr_assert_null(m);
}
