/* The backend registry (devices/backend.h): spec lookup, registration, the reducer and thread
 * hooks, and the capability check that refuses a plan a backend cannot run, naming op and
 * device. A "slowcpu" backend registered here is the CPU backend without fused attention and
 * without the ops beyond the core set. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

#include "collectives/reducer_select.h"
#include "core/error.h"
#include "core/plan.h"
#include "devices/backend.h"
#include "devices/cpu/cpu.h"
#include "devices/module_abi.h"
#include "meshwit.h"

static mw__device_vtable slow_vt;
static int threads_set;

static mw_status slow_parse(const char *spec, const char *rest, mw__spec_devices *out) {
    mw_status st = mw__cpu_backend.parse(spec, rest, out);
    for (int i = 0; st == MW_OK && i < out->n; i++)
        snprintf(out->name[i], sizeof out->name[i], "slow:%d", i);
    return st;
}

static int slow_threads(int n) {
    int prev = threads_set;
    threads_set = n;
    return prev ? prev : 7;
}

static mw__backend slow = {
    .name = "slowcpu", .vt = &slow_vt, .parse = slow_parse, .reducers = MW__REDUCERS_HOST};

/* The slow backend's kernel limit: contractions of depth at most 100. */
static mw_status slow_check(int kind, const void *k) {
    const mw__k_gemm *g = k;
    if (kind == MW__I_GEMM && g->k > 100)
        return mw__error(MW_ERR_UNSUPPORTED, "slow gemm: depth %lld exceeds 100", (long long)g->k);
    return MW_OK;
}

static void register_slow(void) {
    slow_vt = mw__cpu_device;
    slow_vt.kind = "slowcpu";
    slow_vt.attention = NULL;
    slow_vt.attention_grad = NULL;
    slow_vt.dropout = NULL;
    slow_vt.check = slow_check;
    slow.set_threads = slow_threads;
    cr_assert_eq(mw__backend_register(&slow), MW_OK, "%s", mw_last_error());
}

Test(backend, lookup_by_spec) {
    const mw__backend *b;
    cr_assert_eq(mw__backend_for_spec("cpu:3", &b), MW_OK);
    cr_assert_eq(b, &mw__cpu_backend);
    cr_assert_eq(mw__backend_named("cpu"), &mw__cpu_backend);
    cr_assert_eq(mw__backend_for_spec("cpux:3", &b), MW_ERR_DEVICE);
    cr_assert_null(b);
    cr_assert(strstr(mw_last_error(), "'cpux:3'"), "%s", mw_last_error());
    cr_assert_eq(mw__backend_for_spec("tpu", &b), MW_ERR_DEVICE);
    cr_assert(strstr(mw_last_error(), "expected cpu"), "%s", mw_last_error());
    cr_assert_null(mw__backend_named("tpu"));
}

Test(backend, register_once) {
    register_slow();
    cr_assert_eq(mw__backend_named("slowcpu"), &slow);
    cr_assert_eq(mw__backend_register(&slow), MW_ERR_INVALID);
    cr_assert(strstr(mw_last_error(), "slowcpu"), "%s", mw_last_error());
    mw__backend nameless = {.vt = &slow_vt};
    cr_assert_eq(mw__backend_register(&nameless), MW_ERR_INVALID);
}

Test(backend, cpu_reducers) {
    cr_assert_eq(mw__cpu_backend.reducers, MW__REDUCERS_HOST);
    cr_assert_eq(mw__reducer_for_procs("cpu", 4, NULL, 1), &mw__reducer_shm);
    cr_assert_eq(mw__reducer_host(1), &mw__reducer_shm);
    /* Across processes, the MPI module's: not loaded in a process mpirun did not start. */
    cr_assert_null(mw__reducer_for_procs("cpu", 4, NULL, 2));
    cr_assert_null(mw__reducer_host(2));
    cr_assert_null(mw__reducer_for_procs("cpu", 0, NULL, 1));
    /* A backend registered with the host family gets the host's reducers. */
    register_slow();
    cr_assert_eq(mw__reducer_for("slowcpu", 2, NULL), &mw__reducer_shm);
}

Test(backend, supports_follows_the_vtable) {
    register_slow();
    cr_assert(mw__backend_supports(&mw__cpu_backend, MW__I_ATTENTION, MW_F32));
    cr_assert(!mw__backend_supports(&mw__cpu_backend, MW__I_ATTENTION, MW_I32));
    cr_assert(!mw__backend_supports(&slow, MW__I_ATTENTION, MW_F32));
    cr_assert(!mw__backend_supports(&slow, MW__I_DROPOUT, MW_F32));
    cr_assert(mw__backend_supports(&slow, MW__I_GEMM, MW_F32));
}

/* A graph with fused attention on a backend without it: refused when the trainer is made, naming
 * the op and the device, and the backend's thread hook is set and restored around the trainer. */
Test(backend, plan_with_an_op_the_backend_lacks) {
    register_slow();
    mw_graph *g;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Seq", 4}, {"Part", 3}, {"D", 2}));
    mw_tensor *w = mw_param(g, "w", MW_AXES({"D", 2}), MW_INIT_CONST(1.0f));
    mw_tensor *y = mw_attention(g, mw_mul(g, x, w), "Part", "Seq", "D", 1, 1.0f);
    mw_tensor *loss = mw_sum(g, y, NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    mw_mesh *mesh;
    cr_assert_eq(mw_mesh_new("slowcpu:2", "X", &mesh), MW_OK, "%s", mw_last_error());
    cr_assert(strstr(mw_mesh_describe(mesh), "slow:1"), "%s", mw_mesh_describe(mesh));
    mw_trainer *tr = NULL;
    cr_assert_eq(mw_trainer_new(g, loss, mesh, NULL, &tr), MW_ERR_UNSUPPORTED);
    cr_assert_null(tr);
    const char *msg = mw_last_error();
    cr_assert(strstr(msg, "slow:0") && strstr(msg, "slowcpu backend"), "%s", msg);
    cr_assert(strstr(msg, "op attention"), "%s", msg);

    /* The same backend runs a graph without attention, with its thread hook set meanwhile. */
    mw_graph *g2;
    cr_assert_eq(mw_graph_new(&g2), MW_OK);
    mw_tensor *x2 = mw_input(g2, "x", MW_F32, MW_AXES({"Batch", 4}, {"D", 2}));
    mw_tensor *w2 = mw_param(g2, "w", MW_AXES({"D", 2}), MW_INIT_CONST(1.0f));
    mw_tensor *l2 = mw_sum(g2, mw_mul(g2, mw_shard(g2, x2, "Batch", "X"), w2), NULL);
    threads_set = 0;
    cr_assert_eq(mw_trainer_new(g2, l2, mesh, NULL, &tr), MW_OK, "%s", mw_last_error());
    cr_assert_eq(threads_set, 1, "the trainer asks the backend for one math thread per device");
    float xs[8] = {1, 2, 3, 4, 5, 6, 7, 8}, l = 0;
    mw_feed feed = {"x", xs, 8};
    cr_assert_eq(mw_trainer_step(tr, &feed, 1, &l), MW_OK, "%s", mw_last_error());
    cr_assert_float_eq(l, 36.0f, 1e-6f, "sum of x * 1 is 36, got %g", l);
    mw_trainer_free(tr);
    cr_assert_eq(threads_set, 7, "the previous thread count is restored");
    mw_mesh_free(mesh);
    mw_graph_free(g);
    mw_graph_free(g2);
}

/* A kernel's limits (the backend's check) refuse the plan when the trainer is made, naming the
 * limit, the device and the op, not at a step; a plan inside them runs. */
Test(backend, a_kernel_limit_refuses_the_plan_when_the_trainer_is_made) {
    register_slow();
    for (int deep = 0; deep < 2; deep++) {
        int64_t k = deep ? 101 : 100;
        mw_graph *g;
        cr_assert_eq(mw_graph_new(&g), MW_OK);
        mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", 4}, {"K", k}));
        mw_tensor *w = mw_param(g, "w", MW_AXES({"K", k}, {"Out", 3}), MW_INIT_CONST(0.01f));
        mw_tensor *loss = mw_sum(g, mw_dot(g, x, w, "K"), NULL);
        mw_mesh *mesh;
        cr_assert_eq(mw_mesh_new("slowcpu:1", "X", &mesh), MW_OK, "%s", mw_last_error());
        mw_trainer *tr = NULL;
        mw_status st = mw_trainer_new(g, loss, mesh, NULL, &tr);
        if (deep) {
            cr_assert_eq(st, MW_ERR_UNSUPPORTED, "%s", mw_status_name(st));
            cr_assert_null(tr);
            const char *msg = mw_last_error();
            cr_assert(strstr(msg, "slow:0") && strstr(msg, "depth 101 exceeds 100") &&
                          strstr(msg, "contract"),
                      "%s", msg);
        } else {
            cr_assert_eq(st, MW_OK, "%s", mw_last_error());
        }
        mw_trainer_free(tr);
        mw_mesh_free(mesh);
        mw_graph_free(g);
    }
}

/* The module interface's version follows from the instruction table (MW__KERNEL_LAYOUT_OF): a new
 * row, a descriptor that grows and an operand that moves each give another number, so a module
 * built from such source is refused without anyone bumping a constant. */
typedef struct grown_fill {
    float value;
    int64_t count;
    float *out;
    int64_t more;
} grown_fill;
typedef struct moved_fill {
    float *out;
    float value;
    int64_t count;
} moved_fill;
#define ONE_ROW(XX) XX(FILL, fill, mw__k_fill, 0, MW__ROLES_FILL)
#define GROWN_ROW(XX) XX(FILL, fill, grown_fill, 0, MW__ROLES_FILL)
#define MOVED_ROW(XX) XX(FILL, fill, moved_fill, 0, MW__ROLES_FILL)
#define OTHER_KIND(XX) XX(COPY, fill, mw__k_fill, 0, MW__ROLES_FILL)
#define OTHER_DTYPES(XX) XX(FILL, fill, mw__k_fill, MW__DT_BF16, MW__ROLES_FILL)
#define ONE_MORE(XX) MW__KERNELS(XX) XX(FILL, fill, mw__k_fill, 0, MW__ROLES_FILL)

Test(backend, module_interface_follows_the_instruction_table) {
    unsigned base = MW__KERNEL_LAYOUT_OF(ONE_ROW);
    cr_assert_neq(MW__KERNEL_LAYOUT_OF(GROWN_ROW), base);
    cr_assert_neq(MW__KERNEL_LAYOUT_OF(MOVED_ROW), base);
    cr_assert_neq(MW__KERNEL_LAYOUT_OF(OTHER_KIND), base);
    cr_assert_neq(MW__KERNEL_LAYOUT_OF(OTHER_DTYPES), base);
    cr_assert_neq(MW__KERNEL_LAYOUT_OF(ONE_MORE), MW__KERNEL_LAYOUT_OF(MW__KERNELS));
    cr_assert_gt(MW__MODULE_ABI, 0);
}
