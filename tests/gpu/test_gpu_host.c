/* The CUDA backend's host-side decisions, which need no GPU (suite gpu_host): when a missing GPU
 * is an error, how data errors are reported, which ranks share a GPU. */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

#ifdef MESHWIT_HAVE_CUDA
#include "devices/cuda/cuda.h"
#include "devices/cuda/cuda_kernels.h"

Test(gpu_host, require_gpu_reads_the_environment) {
    static const struct {
        const char *value;
        int required;
    } cases[] = {{NULL, 0}, {"", 0}, {"0", 0}, {"1", 1}, {"yes", 1}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        if (cases[i].value)
            setenv("MESHWIT_REQUIRE_GPU", cases[i].value, 1);
        else
            unsetenv("MESHWIT_REQUIRE_GPU");
        cr_assert_eq(mw__gpu_required(), cases[i].required, "MESHWIT_REQUIRE_GPU=%s",
                     cases[i].value ? cases[i].value : "(unset)");
    }
    unsetenv("MESHWIT_REQUIRE_GPU");
}

Test(gpu_host, no_gpu_is_zero_unless_required) {
    int n = -1;
    /* cudaErrorInsufficientDriver (35), as a machine with an old driver reports it. */
    cr_assert_eq(mw__cuda_count_result(0, 35, "cudaErrorInsufficientDriver",
                                       "CUDA driver version is insufficient for CUDA runtime "
                                       "version",
                                       0, &n),
                 MW_OK);
    cr_assert_eq(n, 0);
    mw_status st = mw__cuda_count_result(0, 35, "cudaErrorInsufficientDriver",
                                         "CUDA driver version is insufficient for CUDA runtime "
                                         "version",
                                         1, &n);
    cr_assert_eq(st, MW_ERR_DEVICE);
    cr_assert_eq(n, 0);
    const char *msg = mw_last_error();
    cr_assert(strstr(msg, "MESHWIT_REQUIRE_GPU") && strstr(msg, "driver version is insufficient") &&
                  strstr(msg, "cudaErrorInsufficientDriver") && strstr(msg, "error 35"),
              "message: %s", msg);
    /* A count reported with an error is not trusted. */
    cr_assert_eq(
        mw__cuda_count_result(4, 100, "cudaErrorNoDevice", "no CUDA-capable device", 0, &n), MW_OK);
    cr_assert_eq(n, 0);
    /* No error but no device (CUDA_VISIBLE_DEVICES=""): required makes it an error too. */
    cr_assert_eq(mw__cuda_count_result(0, 0, "cudaSuccess", "no error", 1, &n), MW_ERR_DEVICE);
    cr_assert(strstr(mw_last_error(), "found no GPU"), "message: %s", mw_last_error());
    /* GPUs present: fine either way. */
    cr_assert_eq(mw__cuda_count_result(2, 0, "cudaSuccess", "no error", 1, &n), MW_OK);
    cr_assert_eq(n, 2);
}

Test(gpu_host, probe_agrees_with_the_device_count) {
    int n = -1;
    unsetenv("MESHWIT_REQUIRE_GPU");
    cr_assert_eq(mw__cuda_probe(&n), MW_OK, "%s", mw_last_error());
    cr_assert_eq(n, mw__cuda_device_count());
    setenv("MESHWIT_REQUIRE_GPU", "1", 1);
    mw_status st = mw__cuda_probe(&n);
    unsetenv("MESHWIT_REQUIRE_GPU");
    if (mw__cuda_device_count() > 0)
        cr_assert_eq(st, MW_OK, "%s", mw_last_error());
    else /* this machine: the message names the CUDA error that hides the GPUs */
        cr_assert(st == MW_ERR_DEVICE && strstr(mw_last_error(), "MESHWIT_REQUIRE_GPU"),
                  "got %s: %s", mw_status_name(st), mw_last_error());
}

Test(gpu_host, data_errors_report_each_kind) {
    mw__cuda_data_error none = {0}, id = {1, 7, 50, 50}, target = {1, 2, 9, 8};
    cr_assert_eq(mw__cuda_data_errors("cuda:0", &none, &none), MW_OK);
    cr_assert_eq(mw__cuda_data_errors("cuda:0", NULL, NULL), MW_OK);

    cr_assert_eq(mw__cuda_data_errors("cuda:0", &id, &none), MW_ERR_INVALID);
    const char *msg = mw_last_error();
    cr_assert(
        strstr(msg, "cuda:0: embedding id 50 at position 7 is outside the vocabulary [0, 50)"),
        "message: %s", msg);
    cr_assert_null(strstr(msg, "target"), "message: %s", msg);

    cr_assert_eq(mw__cuda_data_errors("cuda:1", &none, &target), MW_ERR_INVALID);
    msg = mw_last_error();
    cr_assert(strstr(msg, "cuda:1: cross-entropy target 9 at position 2 is outside the classes "
                          "[0, 8)"),
              "message: %s", msg);
    cr_assert_null(strstr(msg, "embedding"), "message: %s", msg);

    /* Both at once: both are named, neither hides the other. */
    cr_assert_eq(mw__cuda_data_errors("cuda:0#1", &id, &target), MW_ERR_INVALID);
    msg = mw_last_error();
    cr_assert(strstr(msg, "embedding id 50 at position 7") &&
                  strstr(msg, "cross-entropy target 9 at position 2"),
              "message: %s", msg);
}

Test(gpu_host, shared_gpus_are_found) {
    char ids[4][MW__GPU_ID_SIZE] = {"node1 0000:01:00.0 GPU-aa", "node1 0000:02:00.0 GPU-bb",
                                    "node2 0000:01:00.0 GPU-cc", ""};
    int a = -1, b = -1;
    cr_assert_eq(mw__find_shared_gpu((const char(*)[MW__GPU_ID_SIZE])ids, 4, &a, &b), 0);
    /* An empty identity (a rank of no process here) never matches another empty one. */
    strcpy(ids[2], "");
    cr_assert_eq(mw__find_shared_gpu((const char(*)[MW__GPU_ID_SIZE])ids, 4, &a, &b), 0);
    strcpy(ids[3], ids[1]);
    cr_assert_eq(mw__find_shared_gpu((const char(*)[MW__GPU_ID_SIZE])ids, 4, &a, &b), 1);
    cr_assert(a == 1 && b == 3, "pair %d, %d", a, b);
    strcpy(ids[2], ids[0]); /* (0, 2) comes before (1, 3) in order of the second index */
    cr_assert_eq(mw__find_shared_gpu((const char(*)[MW__GPU_ID_SIZE])ids, 4, &a, &b), 1);
    cr_assert(a == 0 && b == 2, "pair %d, %d", a, b);
}

/* NCCL_HOSTID names the host in a GPU's identity, as NCCL tells hosts apart by it: two
 * processes on one GPU that set different ones are two hosts, so they are not refused (the
 * NCCL-over-MPI check of scripts/gpu-check.sh on one GPU). */
Test(gpu_host, nccl_hostid_names_the_host) {
    char host[64], name[64];
    unsetenv("NCCL_HOSTID");
    mw__gpu_host_id(host, sizeof host);
    cr_assert_eq(gethostname(name, sizeof name), 0);
    name[sizeof name - 1] = 0;
    cr_assert_str_eq(host, name);
    setenv("NCCL_HOSTID", "", 1); /* empty: unset, as for NCCL */
    mw__gpu_host_id(host, sizeof host);
    cr_assert_str_eq(host, name);
    setenv("NCCL_HOSTID", "meshwit-rank-1", 1);
    mw__gpu_host_id(host, sizeof host);
    cr_assert_str_eq(host, "meshwit-rank-1");
    /* Truncated to the buffer, always terminated. */
    char small[5];
    mw__gpu_host_id(small, sizeof small);
    cr_assert_str_eq(small, "mesh");
    unsetenv("NCCL_HOSTID");
}

/* The kernels' limits are refused when a plan is checked (mw__device_vtable.check), naming the
 * limit and the size; sizes at the limit pass. */
Test(gpu_host, kernel_limits_refuse_a_plan) {
    mw__k_attention a = {.t = 1024, .d = MW__CUDA_ATT_MAX_D, .slices = 96};
    cr_assert_eq(mw__cuda_check(MW__I_ATTENTION, &a), MW_OK, "%s", mw_last_error());
    a.d = MW__CUDA_ATT_MAX_D + 1;
    cr_assert_eq(mw__cuda_check(MW__I_ATTENTION_GRAD, &a), MW_ERR_UNSUPPORTED);
    cr_assert(strstr(mw_last_error(), "head dimensions up to 512, not 513"), "%s", mw_last_error());
    a.d = 64;
    a.t = 6144; /* (48 KiB / 4 - 4 warps) / 2 = 6142 keys at most */
    cr_assert_eq(mw__cuda_check(MW__I_ATTENTION, &a), MW_ERR_UNSUPPORTED);
    cr_assert(strstr(mw_last_error(), "sequences up to 6142, not 6144"), "%s", mw_last_error());
    a.t = 6142;
    cr_assert_eq(mw__cuda_check(MW__I_ATTENTION, &a), MW_OK, "%s", mw_last_error());
    a.slices = MW__CUDA_MAX_GRID_Y + 1;
    cr_assert_eq(mw__cuda_check(MW__I_ATTENTION, &a), MW_ERR_UNSUPPORTED);
    mw__k_attention_cached c = {.dim = MW__CUDA_CACHED_MAX_DIM + 1};
    cr_assert_eq(mw__cuda_check(MW__I_ATTENTION_CACHED, &c), MW_ERR_UNSUPPORTED);
    mw__k_gemm g = {
        .batch = 1, .m = 4, .n = 4, .k = (int64_t)1 << 31, .lda = 1, .ldb = 1, .ldc = 1};
    cr_assert_eq(mw__cuda_check(MW__I_GEMM, &g), MW_ERR_UNSUPPORTED);
    cr_assert(strstr(mw_last_error(), "32-bit"), "%s", mw_last_error());
    g.k = 4;
    cr_assert_eq(mw__cuda_check(MW__I_GEMM, &g), MW_OK);
    mw__k_fill f = {.count = (int64_t)1 << 40};
    cr_assert_eq(mw__cuda_check(MW__I_FILL, &f), MW_OK, "kernels without limits pass");
}

#else

Test(gpu_host, no_cuda_backend) { cr_skip("this build of meshwit has no CUDA backend"); }

#endif
