/* The headers' errors, called: every public function of include/meshwit.h and the headers in
 * include/meshwit driven into each error its comment documents (NULL arguments, values out
 * of range, unknown names, calls out of order, bad files, unknown devices), one row per case, as
 * (function, case, a call that provokes it, the status the header promises, a substring of the
 * message where the header says what it names). A function without an error has a row that
 * checks what its header says it returns for NULL or out-of-range arguments. A second test reads
 * the headers from the source tree and fails for a declared function without a row, so a new
 * public function adds rows here. Functions that need several processes are called in their
 * single-process form. */
#define _GNU_SOURCE /* nftw, mkdtemp, mkfifo, open_memstream */
#include <criterion/criterion.h>
#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"
#include "meshwit.h"
#include "meshwit/testing.h"
#include "parallel/program.h"
#include "parallel/trainer_impl.h"

/* The rows' calls share one signature; many do not need the fixture. */
#pragma GCC diagnostic ignored "-Wunused-parameter"

/* A call that did something its header does not say (returned a value it does not promise, left
 * a tensor next to an error): not a status of the library. */
#define BROKEN ((mw_status)1)

#define ROWS 8 /* the small classifier: x[Batch=8, Feature=2] . w[Feature=2, Class=3] */
#define FEAT 2
#define CLASSES 3

/* What a row's call makes; freed after every row. */
typedef struct fx {
    mw_graph *g, *g2;
    /* graph(): a is f32[Batch=4, Feature=3], as the same split over X, ab its bf16 cast; ids is
     * i32[Batch=4], c f32[Batch=4, Class=2], p a parameter [Feature=3, Class=2], o of g2 */
    mw_tensor *a, *as, *ab, *ids, *c, *p, *o;
    /* model(): the classifier, its batch split over X */
    mw_tensor *x, *y, *w, *logits, *loss;
    mw_mesh *mesh;
    mw_trainer *tr;
    mw_infer *inf;
    mw_sampler *sampler;
    mw_tokenizer *tok;
    mw_safetensors *st;
    mw_file_set *files;
    mw_output *out;
    float xs[ROWS * FEAT];
    int32_t ys[ROWS];
    mw_feed feeds[2];
    char dir[64];        /* a scratch folder, made on first use */
    char paths[4][4200]; /* at()'s results */
    int next_path;
    char why[512]; /* what a BROKEN call did */
} fx;

static mw_status broken(fx *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->why, sizeof f->why, fmt, ap);
    va_end(ap);
    return BROKEN;
}

/* MW_OK when what the header promises holds. */
static mw_status holds(fx *f, int ok, const char *what) {
    return ok ? MW_OK : broken(f, "not as documented: %s", what);
}

/* A graph op's outcome: its graph's status, with NULL exactly on error and the graph's message
 * also the thread's. */
static mw_status traced(fx *f, const mw_tensor *t) {
    mw_status st = mw_graph_status(f->g);
    if (st != MW_OK && t) return broken(f, "a tensor returned with %s", mw_status_name(st));
    if (st == MW_OK && !t) return broken(f, "NULL returned without an error");
    if (st != MW_OK && strcmp(mw_graph_error(f->g), mw_last_error()) != 0)
        return broken(f, "graph error '%s' but mw_last_error '%s'", mw_graph_error(f->g),
                      mw_last_error());
    return st;
}

/* Makers of fixtures: 0, or -1 with f->why set. */
#define NEED(x)                                                                                    \
    do {                                                                                           \
        if ((x) != 0) return broken(f, "fixture: %s: %s", #x, mw_last_error());                    \
    } while (0)

static int failed(fx *f, const char *what) {
    broken(f, "fixture: %s: %s", what, mw_last_error());
    return -1;
}

static int graph(fx *f) {
    if (mw_graph_new(&f->g) || mw_graph_new(&f->g2)) return failed(f, "mw_graph_new");
    mw_graph *g = f->g;
    f->a = mw_input(g, "a", MW_F32, MW_AXES({"Batch", 4}, {"Feature", 3}));
    f->as = mw_shard(g, f->a, "Batch", "X");
    f->ab = mw_cast(g, f->a, MW_BF16);
    f->ids = mw_input(g, "ids", MW_I32, MW_AXES({"Batch", 4}));
    f->c = mw_input(g, "c", MW_F32, MW_AXES({"Batch", 4}, {"Class", 2}));
    f->p = mw_param(g, "p", MW_AXES({"Feature", 3}, {"Class", 2}), MW_INIT_NORMAL(0.1f));
    f->o = mw_input(f->g2, "o", MW_F32, MW_AXES({"Batch", 4}, {"Feature", 3}));
    return mw_graph_status(g) || !f->o ? failed(f, "tracing the fixture") : 0;
}

/* An input of g of the given axes. */
static mw_tensor *in(fx *f, const char *name, mw_axes axes) {
    return mw_input(f->g, name, MW_F32, axes);
}

static int model(fx *f) {
    if (mw_graph_new(&f->g) || mw_graph_new(&f->g2)) return failed(f, "mw_graph_new");
    mw_graph *g = f->g;
    f->x = mw_shard(g, mw_input(g, "x", MW_F32, MW_AXES({"Batch", ROWS}, {"Feature", FEAT})),
                    "Batch", "X");
    f->y = mw_shard(g, mw_input(g, "y", MW_I32, MW_AXES({"Batch", ROWS})), "Batch", "X");
    f->w = mw_param(g, "w", MW_AXES({"Feature", FEAT}, {"Class", CLASSES}), MW_INIT_NORMAL(0.1f));
    f->logits = mw_dot(g, f->x, f->w, "Feature");
    f->loss = mw_mean(g, mw_cross_entropy(g, f->logits, f->y, "Class", 0), NULL);
    f->o = mw_input(f->g2, "o", MW_F32, MW_AXES({"Batch", ROWS}));
    for (int i = 0; i < ROWS * FEAT; i++) f->xs[i] = (float)(i % 5) * 0.25f;
    for (int i = 0; i < ROWS; i++) f->ys[i] = i % CLASSES;
    f->feeds[0] = (mw_feed){"x", f->xs, ROWS * FEAT};
    f->feeds[1] = (mw_feed){"y", f->ys, ROWS};
    return mw_graph_status(g) ? failed(f, "tracing the model") : 0;
}

static mw_trainer_config sgd(void) { return (mw_trainer_config){.optimizer = MW_SGD_INIT(0.1f)}; }

/* The model's trainer on `devices` (axis X), reading the logits as an output. */
static int trainer_on(fx *f, const char *devices, mw_trainer_config c) {
    if (model(f)) return -1;
    if (mw_mesh_new(devices, "X", &f->mesh)) return failed(f, "mw_mesh_new");
    c.outputs = &f->logits;
    c.noutputs = 1;
    return mw_trainer_new(f->g, f->loss, f->mesh, &c, &f->tr) ? failed(f, "mw_trainer_new") : 0;
}

static int trainer(fx *f) { return trainer_on(f, "cpu:1", sgd()); }

static mw_status step(fx *f) { return mw_trainer_step(f->tr, f->feeds, 2, NULL); }

/* The model's logits as an inference program of its own. */
static int infer(fx *f) {
    if (model(f)) return -1;
    if (mw_mesh_new("cpu:1", "X", &f->mesh)) return failed(f, "mw_mesh_new");
    mw_infer_config c = {.outputs = &f->logits, .noutputs = 1};
    return mw_infer_new(f->g, f->mesh, &c, &f->inf) ? failed(f, "mw_infer_new") : 0;
}

/* --- files -------------------------------------------------------------------------------------
 */

/* `name` in the row's scratch folder. */
static const char *at(fx *f, const char *name) {
    if (!f->dir[0]) {
        snprintf(f->dir, sizeof f->dir, "/tmp/mw-api-errors-XXXXXX");
        if (!mkdtemp(f->dir)) f->dir[0] = '\0';
    }
    char *p = f->paths[f->next_path++ % 4];
    snprintf(p, sizeof f->paths[0], "%s/%s", f->dir, name);
    return p;
}

static const char *fifo(fx *f) {
    const char *p = at(f, "fifo");
    return mkfifo(p, 0600) == 0 ? p : "mkfifo failed";
}

static const char *folder(fx *f) {
    const char *p = at(f, "folder");
    return mkdir(p, 0700) == 0 ? p : "mkdir failed";
}

static const char *file_of(fx *f, const char *name, const void *bytes, size_t n) {
    const char *p = at(f, name);
    FILE *o = fopen(p, "wb");
    if (!o) return "fopen failed";
    fwrite(bytes, 1, n, o);
    fclose(o);
    return p;
}

static const char *text_file(fx *f, const char *name, const char *text) {
    return file_of(f, name, text, strlen(text));
}

/* A string literal's bytes, NULs included. */
#define BYTES(s) s, sizeof(s) - 1

/* tests/data/<name>, beside this file's folder. */
static const char *data(fx *f, const char *name) {
    const char *file = __FILE__, *slash = strrchr(file, '/');
    char *p = f->paths[f->next_path++ % 4];
    snprintf(p, sizeof f->paths[0], "%.*s/../data/%s", slash ? (int)(slash - file) : 1,
             slash ? file : ".", name);
    return p;
}

/* A safetensors file of one tensor `name` [FEAT, CLASSES] (the model's w) as F32, or, with
 * dtype "I32", as 32-bit integers. */
static const char *weights_file(fx *f, const char *name, const char *dtype, int rows) {
    char head[256];
    int n = snprintf(head, sizeof head,
                     "{\"%s\":{\"dtype\":\"%s\",\"shape\":[%d,%d],"
                     "\"data_offsets\":[0,%d]}}",
                     name, dtype, rows, CLASSES, rows * CLASSES * 4);
    while (n % 8) head[n++] = ' ';
    unsigned char buf[512] = {0};
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, head, (size_t)n);
    return file_of(f, "w.safetensors", buf, 8 + (size_t)n + (size_t)(rows * CLASSES * 4));
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void fx_free(fx *f) {
    mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)(0));
    mw_cancel_stop();
    mw_infer_free(f->inf);
    mw_sampler_free(f->sampler);
    mw_trainer_free(f->tr);
    mw_mesh_free(f->mesh);
    mw_graph_free(f->g);
    mw_graph_free(f->g2);
    mw_tokenizer_free(f->tok);
    mw_safetensors_close(f->st);
    mw_file_set_free(f->files);
    mw_output_abandon(f->out);
    if (f->dir[0]) nftw(f->dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* A row's call on a fixture: BROKEN when the fixture could not be made. */
#define OP(expr) (graph(f) ? BROKEN : traced(f, (expr)))
#define GRAPHED(expr) (graph(f) ? BROKEN : (expr))
#define MODELLED(expr) (model(f) ? BROKEN : (expr))
#define TRAINED(expr) (trainer(f) ? BROKEN : (expr))
#define STEPPED(expr)                                                                              \
    (trainer(f) ? BROKEN : step(f) ? broken(f, "step: %s", mw_last_error()) : (expr))
#define INFERRED(expr) (infer(f) ? BROKEN : (expr))
#define STORED(expr) (stored(f) ? BROKEN : (expr))
#define TOKENIZED(expr) (tokenizer(f) ? BROKEN : (expr))
#define FILED(expr) (files(f) ? BROKEN : (expr))

/* === include/meshwit.h, status.h, testing.h =================================================== */

static mw_status version_is_the_macros(fx *f) {
    char v[32];
    snprintf(v, sizeof v, "%d.%d.%d", MESHWIT_VERSION_MAJOR, MESHWIT_VERSION_MINOR,
             MESHWIT_VERSION_PATCH);
    return holds(f, strcmp(mw_version(), v) == 0, "mw_version() is MAJOR.MINOR.PATCH");
}
static mw_status strerror_unknown(fx *f) {
    return holds(f, !strcmp(mw_strerror((mw_status)-99), "unknown error"), "\"unknown error\"");
}
static mw_status status_name_never_null(fx *f) {
    return holds(
        f, mw_status_name((mw_status)-99) && !strcmp(mw_status_name(MW_ERR_STATE), "MW_ERR_STATE"),
        "a name, never NULL");
}
static void *last_error_of_a_new_thread(void *out) {
    *(int *)out = strcmp(mw_last_error(), "") == 0;
    return NULL;
}
static mw_status last_error_per_thread(fx *f) {
    mw_graph_new(NULL); /* fails on this thread only */
    int empty = 0;
    pthread_t t;
    if (pthread_create(&t, NULL, last_error_of_a_new_thread, &empty)) return broken(f, "thread");
    pthread_join(t, NULL);
    return holds(f, empty && *mw_last_error(), "\"\" on a thread where nothing failed");
}
static mw_status allocation_fails(fx *f) {
    mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)(1));
    mw_status st = mw_graph_new(&f->g);
    return st == MW_OK || f->g == NULL ? st : broken(f, "a graph despite the failure");
}
static mw_status allocations_counted(fx *f) {
    mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)(0));
    mw_graph_new(&f->g);
    return holds(f, mw_test_control(MW_TEST_ALLOCATIONS) >= 1, "the graph's allocation counted");
}

/* === mesh.h =================================================================================== */
static mw_status backend_describe_cpu(fx *f) {
    const char *d = mw_backend_describe("cpu");
    return holds(f, strstr(d, "OpenBLAS core ") && strstr(d, "vector loops ("),
                 "the BLAS core and the vector level");
}
static mw_status backend_describe_unknown(fx *f) {
    return holds(f,
                 !strcmp(mw_backend_describe("tpu"), "") && !strcmp(mw_backend_describe(NULL), ""),
                 "\"\" for NULL and a backend that is not there");
}
static mw_status backend_warning_a_string(fx *f) {
    return holds(f,
                 mw_backend_warning("cpu") != NULL && !strcmp(mw_backend_warning("tpu"), "") &&
                     !strcmp(mw_backend_warning(NULL), ""),
                 "a warning or \"\"; \"\" for NULL and a backend that is not there");
}

static mw_status mesh_out_null(fx *f) { return mw_mesh_new("cpu:1", "X", NULL); }
static mw_status mesh_spec_null(fx *f) { return mw_mesh_new(NULL, "X", &f->mesh); }
static mw_status mesh_spec_malformed(fx *f) { return mw_mesh_new("gpu:1", "X", &f->mesh); }
static mw_status mesh_cpu_0(fx *f) { return mw_mesh_new("cpu:0", "X", &f->mesh); }
static mw_status mesh_cpu_many(fx *f) { return mw_mesh_new("cpu:1000", "X", &f->mesh); }
static mw_status mesh_no_such_gpu(fx *f) { return mw_mesh_new("cuda:63", "X", &f->mesh); }
static mw_status mesh_axes_product(fx *f) { return mw_mesh_new("cpu:2", "X=3", &f->mesh); }
static mw_status mesh_axes_name(fx *f) { return mw_mesh_new("cpu:2", "X-1", &f->mesh); }
static mw_status mesh_axes_twice(fx *f) { return mw_mesh_new("cpu:4", "X=2,X=2", &f->mesh); }
static mw_status mesh_axes_size(fx *f) { return mw_mesh_new("cpu:2", "X=0,Y", &f->mesh); }
static mw_status mesh_local_spec(fx *f) { return mw_mesh_new_local("cpu:x", NULL, &f->mesh); }
static mw_status mesh_local_out_null(fx *f) { return mw_mesh_new_local("cpu", NULL, NULL); }
static mw_status mesh_processes_null(fx *f) {
    return holds(f, mw_mesh_processes(NULL) == 0, "0 for NULL");
}
static mw_status mesh_local_devices_null(fx *f) {
    int first = 7;
    return holds(f, mw_mesh_local_devices(NULL, &first) == 0 && first == 0, "0 for NULL");
}
static mw_status mesh_free_null(fx *f) {
    mw_mesh_free(NULL);
    return holds(f, !*mw_last_error(), "a no-op");
}
static mw_status mesh_size_null(fx *f) { return holds(f, mw_mesh_size(NULL) == 0, "0 for NULL"); }
static mw_status mesh_describe_null(fx *f) {
    return holds(f, !strcmp(mw_mesh_describe(NULL), "(null)"), "\"(null)\" for NULL");
}
static mw_status cuda_count_never_negative(fx *f) {
    return holds(f, mw_cuda_device_count() >= 0, "a count, never an error");
}

/* === graph.h ================================================================================== */

static float buf[64]; /* where rows read values to */

static mw_status graph_new_out_null(fx *f) { return mw_graph_new(NULL); }
static mw_status graph_free_null(fx *f) {
    mw_graph_free(NULL);
    return holds(f, !*mw_last_error(), "a no-op");
}
static mw_status graph_status_null(fx *f) {
    return holds(f, mw_graph_status(NULL) == MW_ERR_INVALID, "MW_ERR_INVALID for NULL");
}
static mw_status graph_status_first_error(fx *f) {
    NEED(graph(f));
    mw_sum(f->g, f->a, "Nope");
    mw_add(f->g, f->a, f->c); /* a second failure does not replace the first */
    return holds(f, mw_graph_status(f->g) == MW_ERR_AXIS, "the first failing op's status");
}
static mw_status graph_error_null(fx *f) {
    return holds(f, mw_graph_error(NULL) && *mw_graph_error(NULL), "a message for NULL");
}
static mw_status graph_error_first_message(fx *f) {
    NEED(graph(f));
    mw_sum(f->g, f->a, "Nope");
    mw_add(f->g, f->a, f->c);
    return holds(f, strstr(mw_graph_error(f->g), "'Nope'") != NULL, "the first op's message");
}
static mw_status graph_set_seed_null(fx *f) {
    mw_graph_set_seed(NULL, 1);
    return holds(f, !*mw_last_error(), "a no-op");
}
static mw_status region_begin_null_graph(fx *f) { return mw_region_begin(NULL, "r"); }
static mw_status region_begin_null_name(fx *f) { return GRAPHED(mw_region_begin(f->g, NULL)); }
static mw_status region_begin_empty_name(fx *f) { return GRAPHED(mw_region_begin(f->g, "")); }
static mw_status region_begin_long_name(fx *f) {
    return GRAPHED(mw_region_begin(f->g, "a_region_name_of_forty_eight_characters_or_more_"));
}
static mw_status region_begin_nested(fx *f) {
    NEED(graph(f));
    if (mw_region_begin(f->g, "outer")) return broken(f, "the first region");
    return mw_region_begin(f->g, "inner");
}
static mw_status region_begin_after_error(fx *f) {
    NEED(graph(f));
    mw_add(f->g, f->a, f->c);
    return mw_region_begin(f->g, "r");
}
static mw_status region_end_null(fx *f) { return mw_region_end(NULL); }
static mw_status region_end_none_open(fx *f) { return GRAPHED(mw_region_end(f->g)); }
static mw_status region_end_after_error(fx *f) {
    NEED(graph(f));
    mw_sum(f->g, f->a, "Nope");
    return mw_region_end(f->g);
}

/* leaves */
static mw_status input_null_graph(fx *f) {
    return holds(f, !mw_input(NULL, "x", MW_F32, MW_AXES({"A", 1})) && !*mw_last_error(),
                 "NULL, nothing recorded");
}
static mw_status input_empty_name(fx *f) {
    return OP(mw_input(f->g, "", MW_F32, MW_AXES({"A", 1})));
}
static mw_status input_null_name(fx *f) {
    return OP(mw_input(f->g, NULL, MW_F32, MW_AXES({"A", 1})));
}
static mw_status input_long_name(fx *f) {
    return OP(mw_input(f->g, "an_input_name_of_forty_eight_characters_or_more_", MW_F32,
                       MW_AXES({"A", 1})));
}
static mw_status input_name_taken(fx *f) {
    return OP(mw_input(f->g, "p", MW_F32, MW_AXES({"A", 1})));
}
static mw_status input_bf16(fx *f) { return OP(mw_input(f->g, "h", MW_BF16, MW_AXES({"A", 1}))); }
static mw_status input_rank_9(fx *f) {
    NEED(graph(f));
    mw_axes axes = {.rank = MW_MAX_RANK + 1};
    return traced(f, mw_input(f->g, "r", MW_F32, axes));
}
static mw_status input_size_0(fx *f) { return OP(in(f, "z", MW_AXES({"A", 0}))); }
static mw_status input_axis_twice(fx *f) { return OP(in(f, "t", MW_AXES({"A", 2}, {"A", 2}))); }
static mw_status input_axis_name(fx *f) { return OP(in(f, "n", MW_AXES({"A@X", 2}))); }
static mw_status full_size_negative(fx *f) { return OP(mw_full(f->g, MW_AXES({"A", -1}), 1.0f)); }
static mw_status full_null_graph(fx *f) {
    return holds(f, !mw_full(NULL, MW_SCALAR, 1.0f), "NULL for a NULL graph");
}
static mw_status param_name_taken(fx *f) {
    return OP(mw_param(f->g, "a", MW_AXES({"A", 1}), MW_INIT_ZEROS));
}
static mw_status param_unknown_init(fx *f) {
    return OP(mw_param(f->g, "q", MW_AXES({"A", 1}), ((mw_init){(mw_init_kind)9, 0})));
}
static mw_status param_axis_twice(fx *f) {
    return OP(mw_param(f->g, "q", MW_AXES({"A", 1}, {"A", 1}), MW_INIT_ZEROS));
}

/* sharding */
static mw_status shard_null(fx *f) { return OP(mw_shard(f->g, NULL, "A", "X")); }
static mw_status shard_other_graph(fx *f) { return OP(mw_shard(f->g, f->o, "Batch", "X")); }
static mw_status shard_no_axis(fx *f) { return OP(mw_shard(f->g, f->a, "Nope", "X")); }
static mw_status shard_twice(fx *f) { return OP(mw_shard(f->g, f->as, "Batch", "Y")); }
static mw_status shard_same_mesh_axis(fx *f) { return OP(mw_shard(f->g, f->as, "Feature", "X")); }
static mw_status shard_computed(fx *f) {
    return OP(mw_shard(f->g, mw_scale(f->g, f->a, 2.0f), "Batch", "X"));
}
static mw_status shard_used_param(fx *f) {
    NEED(graph(f));
    mw_dot(f->g, f->a, f->p, "Feature");
    return traced(f, mw_shard(f->g, f->p, "Class", "X"));
}
static mw_status shard_bad_mesh_axis(fx *f) { return OP(mw_shard(f->g, f->a, "Batch", "")); }

/* elementwise */
static mw_status add_null(fx *f) { return OP(mw_add(f->g, f->a, NULL)); }
static mw_status add_other_graph(fx *f) { return OP(mw_add(f->g, f->a, f->o)); }
static mw_status add_sizes(fx *f) {
    return OP(mw_add(f->g, f->a, in(f, "z", MW_AXES({"Batch", 4}, {"Feature", 5}))));
}
static mw_status add_no_subset(fx *f) { return OP(mw_add(f->g, f->a, f->c)); }
static mw_status add_sharding(fx *f) { return OP(mw_add(f->g, f->a, f->as)); }
static mw_status add_dtype(fx *f) { return OP(mw_add(f->g, f->ids, f->a)); }
static mw_status sub_no_subset(fx *f) { return OP(mw_sub(f->g, f->a, f->c)); }
static mw_status sub_sharding(fx *f) { return OP(mw_sub(f->g, f->as, f->a)); }
static mw_status mul_no_subset(fx *f) { return OP(mw_mul(f->g, f->c, f->a)); }
static mw_status mul_null(fx *f) { return OP(mw_mul(f->g, NULL, f->a)); }
static mw_status div_no_subset(fx *f) { return OP(mw_div(f->g, f->a, f->c)); }
static mw_status div_dtype(fx *f) { return OP(mw_div(f->g, f->a, f->ab)); }
static mw_status scale_null(fx *f) { return OP(mw_scale(f->g, NULL, 2.0f)); }
static mw_status scale_dtype(fx *f) { return OP(mw_scale(f->g, f->ids, 2.0f)); }
static mw_status cast_i32(fx *f) { return OP(mw_cast(f->g, f->ids, MW_F32)); }
static mw_status cast_to_i32(fx *f) { return OP(mw_cast(f->g, f->a, MW_I32)); }
static mw_status cast_null(fx *f) { return OP(mw_cast(f->g, NULL, MW_BF16)); }
static mw_status cast_other_graph(fx *f) { return OP(mw_cast(f->g, f->o, MW_BF16)); }

/* contractions */
static mw_status dot_no_axis(fx *f) { return OP(mw_dot(f->g, f->a, f->p, "Nope")); }
static mw_status dot_axis_in_a_only(fx *f) { return OP(mw_dot(f->g, f->a, f->p, "Batch")); }
static mw_status dot_null_axis(fx *f) { return OP(mw_dot(f->g, f->a, f->p, NULL)); }
static mw_status dot_sizes(fx *f) {
    return OP(mw_dot(f->g, f->a, in(f, "z", MW_AXES({"Feature", 5})), "Feature"));
}
static mw_status dot_sharding(fx *f) {
    return GRAPHED(traced(
        f, mw_dot(f->g, f->as, in(f, "z", MW_AXES({"Batch", 4}, {"Feature", 3})), "Feature")));
}
static mw_status dot_dtype(fx *f) { return OP(mw_dot(f->g, f->ab, f->p, "Feature")); }
static mw_status dot_null(fx *f) { return OP(mw_dot(f->g, f->a, NULL, "Feature")); }
static mw_status contract_result_axis(fx *f) {
    return OP(mw_contract(f->g, f->a, f->p, "Batch,Nope"));
}
static mw_status contract_named_twice(fx *f) {
    return OP(mw_contract(f->g, f->a, f->p, "Batch,Batch"));
}
static mw_status contract_uncontractable(fx *f) {
    return OP(mw_contract(f->g, f->a, f->p, "Class"));
}
static mw_status contract_sizes(fx *f) {
    return OP(mw_contract(f->g, f->a, in(f, "z", MW_AXES({"Feature", 5})), "Batch"));
}
static mw_status contract_sharding(fx *f) { return OP(mw_contract(f->g, f->as, f->a, "Batch")); }
static mw_status contract_null_axes(fx *f) { return OP(mw_contract(f->g, f->a, f->p, NULL)); }

/* reductions */
static mw_status sum_no_axis(fx *f) { return OP(mw_sum(f->g, f->a, "Nope")); }
static mw_status sum_malformed(fx *f) { return OP(mw_sum(f->g, f->a, "Batch,,")); }
static mw_status sum_null(fx *f) { return OP(mw_sum(f->g, NULL, NULL)); }
static mw_status sum_dtype(fx *f) { return OP(mw_sum(f->g, f->ids, NULL)); }
static mw_status mean_no_axis(fx *f) { return OP(mw_mean(f->g, f->a, "Class")); }

/* reshaping */
static mw_status rename_no_axis(fx *f) { return OP(mw_rename(f->g, f->a, "Nope", "N")); }
static mw_status rename_taken(fx *f) { return OP(mw_rename(f->g, f->a, "Batch", "Feature")); }
static mw_status rename_sharded(fx *f) { return OP(mw_rename(f->g, f->as, "Batch", "B")); }
static mw_status rename_bad_name(fx *f) { return OP(mw_rename(f->g, f->a, "Batch", "B@X")); }
static mw_status rename_null_axis(fx *f) { return OP(mw_rename(f->g, f->a, NULL, "B")); }
static mw_status permute_unknown(fx *f) { return OP(mw_permute(f->g, f->a, "Feature,Nope")); }
static mw_status permute_twice(fx *f) { return OP(mw_permute(f->g, f->a, "Feature,Feature")); }
static mw_status permute_left_out(fx *f) { return OP(mw_permute(f->g, f->a, "Feature")); }
static mw_status permute_null_order(fx *f) { return OP(mw_permute(f->g, f->a, NULL)); }
static mw_status split_product(fx *f) { return OP(mw_split(f->g, f->a, "Batch", "H=3,D=2")); }
static mw_status split_indivisible(fx *f) { return OP(mw_split(f->g, f->a, "Batch", "H=3,D")); }
static mw_status split_no_axis(fx *f) { return OP(mw_split(f->g, f->a, "Nope", "H=2,D")); }
static mw_status split_sharded(fx *f) { return OP(mw_split(f->g, f->as, "Batch", "H=2,D")); }
static mw_status split_bad_size(fx *f) { return OP(mw_split(f->g, f->a, "Batch", "H=x,D")); }
static mw_status split_two_unsized(fx *f) { return OP(mw_split(f->g, f->a, "Batch", "H,D")); }
static mw_status split_no_new_axes(fx *f) { return OP(mw_split(f->g, f->a, "Batch", NULL)); }
static mw_status split_name_taken(fx *f) {
    return OP(mw_split(f->g, f->a, "Batch", "Feature=2,D"));
}
static mw_status merge_not_adjacent(fx *f) {
    return OP(mw_merge(f->g, f->a, "Feature,Batch", "M"));
}
static mw_status merge_no_axis(fx *f) { return OP(mw_merge(f->g, f->a, "Batch,Nope", "M")); }
static mw_status merge_sharded(fx *f) { return OP(mw_merge(f->g, f->as, "Batch,Feature", "M")); }
static mw_status merge_no_axes(fx *f) { return OP(mw_merge(f->g, f->a, "", "M")); }
static mw_status merge_bad_name(fx *f) { return OP(mw_merge(f->g, f->a, "Batch,Feature", "")); }
static mw_status slice_length_0(fx *f) { return OP(mw_slice(f->g, f->a, "Batch", 0, 0, NULL)); }
static mw_status slice_outside(fx *f) { return OP(mw_slice(f->g, f->a, "Batch", 3, 2, NULL)); }
static mw_status slice_no_axis(fx *f) { return OP(mw_slice(f->g, f->a, "Nope", 0, 1, NULL)); }
static mw_status slice_sharded(fx *f) {
    return OP(mw_slice(f->g, mw_scale(f->g, f->as, 2.0f), "Batch", 0, 1, NULL));
}
static mw_status slice_name_taken(fx *f) {
    return OP(mw_slice(f->g, f->a, "Batch", 0, 1, "Feature"));
}
static mw_status select_outside(fx *f) { return OP(mw_select(f->g, f->a, "Batch", 4)); }
static mw_status select_negative(fx *f) { return OP(mw_select(f->g, f->a, "Batch", -1)); }
static mw_status select_no_axis(fx *f) { return OP(mw_select(f->g, f->a, "Nope", 0)); }

/* neural-network ops */
static mw_status gelu_dtype(fx *f) { return OP(mw_gelu(f->g, f->ids)); }
static mw_status gelu_null(fx *f) { return OP(mw_gelu(f->g, NULL)); }
static mw_status gelu_erf_dtype(fx *f) { return OP(mw_gelu_erf(f->g, f->ab)); }

static mw_tensor *vec(fx *f, const char *name, const char *axis, int64_t n) {
    return mw_param(f->g, name, MW_AXES({axis, n}), MW_INIT_ZEROS);
}
static mw_status layernorm_no_axis(fx *f) {
    NEED(graph(f));
    mw_tensor *v = vec(f, "v", "Feature", 3);
    return traced(f, mw_layernorm(f->g, f->a, v, v, "Nope", 1e-5f));
}
static mw_status layernorm_not_last(fx *f) {
    NEED(graph(f));
    mw_tensor *v = vec(f, "v", "Batch", 4);
    return traced(f, mw_layernorm(f->g, f->a, v, v, "Batch", 1e-5f));
}
static mw_status layernorm_weight_axes(fx *f) {
    NEED(graph(f));
    mw_tensor *v = vec(f, "v", "Feature", 3), *u = vec(f, "u", "Feature", 2);
    return traced(f, mw_layernorm(f->g, f->a, v, u, "Feature", 1e-5f));
}
static mw_status layernorm_sharded(fx *f) {
    NEED(graph(f));
    mw_tensor *v = vec(f, "v", "Batch", 4);
    return traced(
        f, mw_layernorm(f->g, mw_permute(f->g, f->as, "Feature,Batch"), v, v, "Batch", 1e-5f));
}
static mw_status layernorm_dtype(fx *f) {
    NEED(graph(f));
    mw_tensor *v = vec(f, "v", "Feature", 3);
    return traced(f, mw_layernorm(f->g, f->ab, v, v, "Feature", 1e-5f));
}
static mw_status layernorm_null(fx *f) {
    return OP(mw_layernorm(f->g, f->a, NULL, NULL, "Feature", 1e-5f));
}
static mw_status rmsnorm_no_axis(fx *f) {
    NEED(graph(f));
    return traced(f, mw_rmsnorm(f->g, f->a, vec(f, "v", "Feature", 3), "Nope", 1e-5f));
}
static mw_status rmsnorm_not_last(fx *f) {
    NEED(graph(f));
    return traced(f, mw_rmsnorm(f->g, f->a, vec(f, "v", "Batch", 4), "Batch", 1e-5f));
}
static mw_status rmsnorm_weight_axes(fx *f) {
    NEED(graph(f));
    return traced(f, mw_rmsnorm(f->g, f->a, vec(f, "v", "Feature", 2), "Feature", 1e-5f));
}
static mw_status rmsnorm_sharded(fx *f) {
    NEED(graph(f));
    mw_tensor *v = vec(f, "v", "Batch", 4);
    return traced(f, mw_rmsnorm(f->g, mw_permute(f->g, f->as, "Feature,Batch"), v, "Batch", 1e-5f));
}
static mw_status rmsnorm_dtype(fx *f) {
    NEED(graph(f));
    return traced(f, mw_rmsnorm(f->g, f->ab, vec(f, "v", "Feature", 3), "Feature", 1e-5f));
}
static mw_status rmsnorm_null(fx *f) { return OP(mw_rmsnorm(f->g, f->a, NULL, "Feature", 1e-5f)); }
static mw_status rmsnorm_negative_eps(fx *f) {
    NEED(graph(f));
    return traced(f, mw_rmsnorm(f->g, f->a, vec(f, "v", "Feature", 3), "Feature", -1e-5f));
}
static mw_status rmsnorm_nan_eps(fx *f) {
    NEED(graph(f));
    return traced(f, mw_rmsnorm(f->g, f->a, vec(f, "v", "Feature", 3), "Feature", NAN));
}
static mw_status layernorm_infinite_eps(fx *f) {
    NEED(graph(f));
    mw_tensor *v = vec(f, "v", "Feature", 3);
    return traced(f, mw_layernorm(f->g, f->a, v, v, "Feature", INFINITY));
}
static mw_status layernorm_bias_dtype(fx *f) {
    NEED(graph(f));
    mw_tensor *v = vec(f, "v", "Feature", 3);
    return traced(f, mw_layernorm(f->g, f->a, v, mw_cast(f->g, v, MW_BF16), "Feature", 1e-5f));
}
static mw_status silu_dtype(fx *f) { return OP(mw_silu(f->g, f->ids)); }
static mw_status silu_null(fx *f) { return OP(mw_silu(f->g, NULL)); }
/* a viewed as [Batch=4, Part=?]: Feature has size 3, not 2 */
static mw_status swiglu_size(fx *f) { return OP(mw_swiglu(f->g, f->a, "Feature")); }
static mw_status swiglu_no_axis(fx *f) { return OP(mw_swiglu(f->g, f->a, "Nope")); }
static mw_status swiglu_dtype(fx *f) { return OP(mw_swiglu(f->g, f->ab, "Feature")); }
static mw_status swiglu_sharded(fx *f) {
    NEED(graph(f));
    mw_tensor *x = in(f, "x", MW_AXES({"Batch", 4}, {"Part", 2}));
    return traced(f, mw_swiglu(f->g, mw_shard(f->g, x, "Part", "X"), "Part"));
}
/* x f32[Batch=4, Seq=4, Feature=4] */
static mw_tensor *rope_x(fx *f) {
    return in(f, "rx", MW_AXES({"Batch", 4}, {"Seq", 4}, {"Feature", 4}));
}
static mw_status rope_no_axis(fx *f) {
    NEED(graph(f));
    return traced(f, mw_rope(f->g, rope_x(f), "Nope", "Feature", NULL, NULL));
}
static mw_status rope_not_last(fx *f) {
    NEED(graph(f));
    return traced(f, mw_rope(f->g, rope_x(f), NULL, "Seq", NULL, NULL));
}
static mw_status rope_odd(fx *f) { return OP(mw_rope(f->g, f->a, NULL, "Feature", NULL, NULL)); }
static mw_status rope_dims(fx *f) {
    NEED(graph(f));
    mw_rope_config c = {.theta = 10000.0f, .dims = 6};
    return traced(f, mw_rope(f->g, rope_x(f), "Seq", "Feature", NULL, &c));
}
static mw_status rope_theta(fx *f) {
    NEED(graph(f));
    mw_rope_config c = {.theta = 0.5f};
    return traced(f, mw_rope(f->g, rope_x(f), "Seq", "Feature", NULL, &c));
}
static mw_status rope_style(fx *f) {
    NEED(graph(f));
    mw_rope_config c = {.theta = 10000.0f, .style = (mw_rope_style)7};
    return traced(f, mw_rope(f->g, rope_x(f), "Seq", "Feature", NULL, &c));
}
static mw_status rope_scaling(fx *f) {
    NEED(graph(f));
    mw_rope_config c = {.theta = 10000.0f, .scaling = MW_ROPE_SCALING_LLAMA3, .factor = 8.0f};
    return traced(f, mw_rope(f->g, rope_x(f), "Seq", "Feature", NULL, &c));
}
static mw_status rope_offset(fx *f) {
    NEED(graph(f));
    mw_rope_config c = {.theta = 10000.0f, .offset = -1};
    return traced(f, mw_rope(f->g, rope_x(f), "Seq", "Feature", NULL, &c));
}
static mw_status rope_pos_dtype(fx *f) {
    NEED(graph(f));
    mw_tensor *pos = in(f, "pos", MW_AXES({"Batch", 4}));
    return traced(f, mw_rope(f->g, rope_x(f), "Seq", "Feature", pos, NULL));
}
static mw_status rope_pos_axes(fx *f) {
    NEED(graph(f));
    mw_tensor *pos = mw_input(f->g, "pos", MW_I32, MW_AXES({"Seq", 4}));
    return traced(f, mw_rope(f->g, rope_x(f), "Seq", "Feature", pos, NULL));
}
static mw_status rope_sharded(fx *f) {
    NEED(graph(f));
    return traced(
        f, mw_rope(f->g, mw_shard(f->g, rope_x(f), "Seq", "X"), "Seq", "Feature", NULL, NULL));
}
static mw_status rope_dtype(fx *f) {
    NEED(graph(f));
    return traced(f,
                  mw_rope(f->g, mw_cast(f->g, rope_x(f), MW_BF16), "Seq", "Feature", NULL, NULL));
}
static mw_status rope_part_axis(fx *f) {
    NEED(graph(f));
    mw_rope_config c = {.theta = 10000.0f, .part_axis = "Nope", .parts = 1};
    return traced(f, mw_rope(f->g, rope_x(f), "Seq", "Feature", NULL, &c));
}
static mw_status rope_parts(fx *f) {
    NEED(graph(f));
    mw_rope_config c = {.theta = 10000.0f, .part_axis = "Batch", .parts = 5};
    return traced(f, mw_rope(f->g, rope_x(f), "Seq", "Feature", NULL, &c));
}
static mw_status rope_null(fx *f) { return OP(mw_rope(f->g, NULL, NULL, "Feature", NULL, NULL)); }
/* qkv f32[Batch=2, Seq=4, KvHead=2, Part=4, Dim=8]: two queries per key/value head */
static mw_tensor *gqkv(fx *f) {
    return in(f, "gqkv", MW_AXES({"Batch", 2}, {"Seq", 4}, {"KvHead", 2}, {"Part", 4}, {"Dim", 8}));
}
static mw_status grouped_null_group(fx *f) {
    NEED(graph(f));
    return traced(f, mw_attention_grouped(f->g, gqkv(f), "Part", NULL, "Seq", "Dim", 1, 0.3f));
}
static mw_status grouped_parts(fx *f) {
    NEED(graph(f));
    mw_tensor *x = in(f, "x2", MW_AXES({"Batch", 2}, {"Seq", 4}, {"Part", 2}, {"Dim", 8}));
    return traced(f, mw_attention_grouped(f->g, x, "Part", "Group", "Seq", "Dim", 1, 0.3f));
}
static mw_status grouped_existing(fx *f) {
    NEED(graph(f));
    return traced(f, mw_attention_grouped(f->g, gqkv(f), "Part", "Seq", "Seq", "Dim", 1, 0.3f));
}
static mw_status grouped_part_split(fx *f) {
    NEED(graph(f));
    mw_tensor *x = mw_shard(f->g, gqkv(f), "Part", "X");
    return traced(f, mw_attention_grouped(f->g, x, "Part", "Group", "Seq", "Dim", 1, 0.3f));
}
static mw_status softmax_no_axis(fx *f) { return OP(mw_softmax(f->g, f->a, "Nope", 1.0f)); }
static mw_status softmax_not_last(fx *f) { return OP(mw_softmax(f->g, f->a, "Batch", 1.0f)); }
static mw_status softmax_sharded(fx *f) { return OP(mw_softmax(f->g, f->as, "Batch", 1.0f)); }
static mw_status softmax_dtype(fx *f) { return OP(mw_softmax(f->g, f->ab, "Feature", 1.0f)); }

/* qkv f32[Batch=2, Part=3, Seq=4, Dim=8] */
static mw_tensor *qkv(fx *f) {
    return in(f, "qkv", MW_AXES({"Batch", 2}, {"Part", 3}, {"Seq", 4}, {"Dim", 8}));
}
static mw_status attention_no_axis(fx *f) {
    return OP(mw_attention(f->g, qkv(f), "Part", "Nope", "Dim", 1, 1.0f));
}
static mw_status attention_part_size(fx *f) {
    NEED(graph(f));
    mw_tensor *t = in(f, "t", MW_AXES({"Part", 2}, {"Seq", 4}, {"Dim", 8}));
    return traced(f, mw_attention(f->g, t, "Part", "Seq", "Dim", 1, 1.0f));
}
static mw_status attention_feature_not_last(fx *f) {
    return OP(mw_attention(f->g, qkv(f), "Part", "Dim", "Seq", 1, 1.0f));
}
static mw_status attention_same_axes(fx *f) {
    return OP(mw_attention(f->g, qkv(f), "Part", "Dim", "Dim", 1, 1.0f));
}
static mw_status attention_dtype(fx *f) {
    NEED(graph(f));
    mw_tensor *t = mw_input(f->g, "t", MW_I32, MW_AXES({"Part", 3}, {"Seq", 4}, {"Dim", 8}));
    return traced(f, mw_attention(f->g, t, "Part", "Seq", "Dim", 1, 1.0f));
}
static mw_status attention_sharded(fx *f) {
    NEED(graph(f));
    mw_tensor *t = mw_shard(f->g, qkv(f), "Seq", "X");
    return traced(f, mw_attention(f->g, t, "Part", "Seq", "Dim", 1, 1.0f));
}
static mw_tensor *scores(fx *f) { return in(f, "s", MW_AXES({"Batch", 2}, {"Q", 4}, {"K", 4})); }
static mw_status causal_not_before(fx *f) {
    return OP(mw_causal_softmax(f->g, scores(f), "Batch", "K", 1.0f));
}
static mw_status causal_no_axis(fx *f) {
    return OP(mw_causal_softmax(f->g, scores(f), "Nope", "K", 1.0f));
}
static mw_status causal_sharded(fx *f) {
    return OP(mw_causal_softmax(f->g, mw_shard(f->g, scores(f), "Q", "X"), "Q", "K", 1.0f));
}
static mw_status causal_dtype(fx *f) {
    return OP(mw_causal_softmax(f->g, mw_cast(f->g, scores(f), MW_BF16), "Q", "K", 1.0f));
}
static mw_tensor *lookup_table(fx *f) {
    return mw_param(f->g, "table", MW_AXES({"Vocab", 5}, {"Dim", 3}), MW_INIT_ZEROS);
}
static mw_status embedding_table_dtype(fx *f) {
    return OP(mw_embedding(f->g, f->ids, f->ids, "Batch"));
}
static mw_status embedding_ids_dtype(fx *f) {
    return OP(mw_embedding(f->g, lookup_table(f), f->a, "Vocab"));
}
static mw_status embedding_no_axis(fx *f) {
    return OP(mw_embedding(f->g, lookup_table(f), f->ids, "Nope"));
}
static mw_status embedding_vocab_not_first(fx *f) {
    return OP(mw_embedding(f->g, lookup_table(f), f->ids, "Dim"));
}
static mw_status embedding_ids_have_dim(fx *f) {
    NEED(graph(f));
    mw_tensor *ids = mw_input(f->g, "i", MW_I32, MW_AXES({"Dim", 2}));
    return traced(f, mw_embedding(f->g, lookup_table(f), ids, "Vocab"));
}
static mw_status embedding_computed_split(fx *f) {
    NEED(graph(f));
    mw_tensor *t = mw_shard(f->g, in(f, "t", MW_AXES({"Vocab", 5}, {"Dim", 4})), "Dim", "X");
    return traced(f, mw_embedding(f->g, t, f->ids, "Vocab"));
}
static mw_status xent_targets_dtype(fx *f) {
    return OP(mw_cross_entropy(f->g, f->c, in(f, "t", MW_AXES({"Batch", 4})), "Class", 0));
}
static mw_status xent_no_axis(fx *f) { return OP(mw_cross_entropy(f->g, f->c, f->ids, "Nope", 0)); }
static mw_status xent_valid(fx *f) { return OP(mw_cross_entropy(f->g, f->c, f->ids, "Class", 3)); }
static mw_status xent_targets_axes(fx *f) {
    NEED(graph(f));
    mw_tensor *t = mw_input(f->g, "t", MW_I32, MW_AXES({"Batch", 3}));
    return traced(f, mw_cross_entropy(f->g, f->c, t, "Class", 0));
}
static mw_status xent_sharding(fx *f) {
    return OP(mw_cross_entropy(f->g, mw_shard(f->g, f->c, "Batch", "X"), f->ids, "Class", 0));
}
static mw_status xent_not_last(fx *f) {
    NEED(graph(f));
    mw_tensor *t = mw_input(f->g, "t", MW_I32, MW_AXES({"Class", 2}));
    return traced(f, mw_cross_entropy(f->g, f->c, t, "Batch", 0));
}

/* more elementwise ops */
static mw_status relu_dtype(fx *f) { return OP(mw_relu(f->g, f->ids)); }
static mw_status relu_null(fx *f) { return OP(mw_relu(f->g, NULL)); }
static mw_status relu_other_graph(fx *f) { return OP(mw_relu(f->g, f->o)); }
static mw_status tanh_dtype(fx *f) { return OP(mw_tanh(f->g, f->ab)); }
static mw_status sigmoid_dtype(fx *f) { return OP(mw_sigmoid(f->g, f->ids)); }
static mw_status exp_dtype(fx *f) { return OP(mw_exp(f->g, f->ids)); }
static mw_status log_dtype(fx *f) { return OP(mw_log(f->g, f->ids)); }
static mw_status sqrt_dtype(fx *f) { return OP(mw_sqrt(f->g, f->ids)); }
static mw_status abs_dtype(fx *f) { return OP(mw_abs(f->g, f->ids)); }
static mw_status compare_unknown(fx *f) {
    return OP(mw_compare(f->g, f->a, f->a, (mw_comparison)17));
}
static mw_status compare_no_subset(fx *f) { return OP(mw_compare(f->g, f->a, f->c, MW_GT)); }
static mw_status compare_dtype(fx *f) { return OP(mw_compare(f->g, f->ids, f->a, MW_EQ)); }
static mw_status where_no_subset(fx *f) { return OP(mw_where(f->g, f->a, f->a, f->c)); }
static mw_status where_null_mask(fx *f) { return OP(mw_where(f->g, NULL, f->a, f->a)); }
static mw_status maximum_no_subset(fx *f) { return OP(mw_maximum(f->g, f->a, f->c)); }
static mw_status maximum_sharding(fx *f) { return OP(mw_maximum(f->g, f->a, f->as)); }
static mw_status minimum_dtype(fx *f) { return OP(mw_minimum(f->g, f->a, f->ab)); }
static mw_status max_no_axis(fx *f) { return OP(mw_max(f->g, f->a, "Nope")); }
static mw_status max_sharded(fx *f) { return OP(mw_max(f->g, f->as, "Batch")); }
static mw_status max_dtype(fx *f) { return OP(mw_max(f->g, f->ab, "Batch")); }
static mw_status argmax_no_axis(fx *f) { return OP(mw_argmax(f->g, f->a, "Nope")); }
static mw_status argmax_sharded(fx *f) { return OP(mw_argmax(f->g, f->as, "Batch")); }
static mw_status argmax_null_axis(fx *f) { return OP(mw_argmax(f->g, f->a, NULL)); }
static mw_status concat_none(fx *f) { return OP(mw_concat(f->g, &f->a, 0, "Batch")); }
static mw_status concat_null_array(fx *f) { return OP(mw_concat(f->g, NULL, 2, "Batch")); }
static mw_status concat_null_tensor(fx *f) {
    NEED(graph(f));
    mw_tensor *xs[2] = {f->a, NULL};
    return traced(f, mw_concat(f->g, xs, 2, "Batch"));
}
static mw_status concat_no_axis(fx *f) {
    NEED(graph(f));
    mw_tensor *xs[2] = {f->a, f->a};
    return traced(f, mw_concat(f->g, xs, 2, "Nope"));
}
static mw_status concat_other_axes(fx *f) {
    NEED(graph(f));
    mw_tensor *xs[2] = {f->a, f->c};
    return traced(f, mw_concat(f->g, xs, 2, "Batch"));
}
static mw_status concat_sharded(fx *f) {
    NEED(graph(f));
    mw_tensor *xs[2] = {f->as, f->as};
    return traced(f, mw_concat(f->g, xs, 2, "Batch"));
}
static mw_status dropout_p_1(fx *f) { return OP(mw_dropout(f->g, f->a, 1.0f, 1)); }
static mw_status dropout_p_negative(fx *f) { return OP(mw_dropout(f->g, f->a, -0.1f, 1)); }
static mw_status dropout_p_nan(fx *f) { return OP(mw_dropout(f->g, f->a, NAN, 1)); }
static mw_status dropout_dtype(fx *f) { return OP(mw_dropout(f->g, f->ids, 0.5f, 1)); }

/* states */
/* s f32[Batch=2, Ctx=4, F=3] written at Ctx by value v[Batch=2, F=3] and positions i32[Batch=2] */
static mw_tensor *state(fx *f) {
    return mw_state(f->g, "s", MW_AXES({"Batch", 2}, {"Ctx", 4}, {"F", 3}));
}
static mw_tensor *value(fx *f) { return in(f, "v", MW_AXES({"Batch", 2}, {"F", 3})); }
static mw_tensor *positions(fx *f) { return mw_input(f->g, "i", MW_I32, MW_AXES({"Batch", 2})); }
static mw_status state_name_taken(fx *f) { return OP(mw_state(f->g, "a", MW_AXES({"A", 1}))); }
static mw_status state_size_0(fx *f) { return OP(mw_state(f->g, "s", MW_AXES({"A", 0}))); }
static mw_status state_write_not_a_state(fx *f) {
    NEED(graph(f));
    mw_tensor *s = in(f, "s", MW_AXES({"Batch", 2}, {"Ctx", 4}, {"F", 3}));
    return traced(f, mw_state_write(f->g, s, value(f), "Ctx", positions(f)));
}
static mw_status state_write_not_latest(fx *f) {
    NEED(graph(f));
    mw_tensor *s = state(f), *v = value(f), *i = positions(f);
    mw_state_write(f->g, s, v, "Ctx", i);
    return traced(f, mw_state_write(f->g, s, v, "Ctx", i));
}
static mw_status state_write_no_axis(fx *f) {
    return OP(mw_state_write(f->g, state(f), value(f), "Nope", positions(f)));
}
static mw_status state_write_index_axes(fx *f) {
    NEED(graph(f));
    mw_tensor *i = mw_input(f->g, "i", MW_I32, MW_AXES({"Batch", 3}));
    return traced(f, mw_state_write(f->g, state(f), value(f), "Ctx", i));
}
static mw_status state_write_index_dtype(fx *f) {
    return GRAPHED(traced(
        f, mw_state_write(f->g, state(f), value(f), "Ctx", in(f, "i", MW_AXES({"Batch", 2})))));
}
static mw_status state_write_value_axes(fx *f) {
    NEED(graph(f));
    mw_tensor *v = in(f, "v", MW_AXES({"Batch", 2}, {"F", 4}));
    return traced(f, mw_state_write(f->g, state(f), v, "Ctx", positions(f)));
}
static mw_status state_write_sharded(fx *f) {
    NEED(graph(f));
    mw_tensor *s = mw_shard(f->g, state(f), "Ctx", "X");
    return traced(f, mw_state_write(f->g, s, value(f), "Ctx", positions(f)));
}
static mw_status state_write_null_index(fx *f) {
    return OP(mw_state_write(f->g, state(f), value(f), "Ctx", NULL));
}
/* kv f32[Batch=2, Ctx=4, Part=2, D=8], q f32[Batch=2, D=8], pos i32[Batch=2] */
static mw_tensor *kv(fx *f, int64_t parts) {
    return mw_state(f->g, "kv", MW_AXES({"Batch", 2}, {"Ctx", 4}, {"Part", parts}, {"D", 8}));
}
static mw_tensor *query(fx *f) { return in(f, "q", MW_AXES({"Batch", 2}, {"D", 8})); }
static mw_status cached_no_axis(fx *f) {
    return GRAPHED(traced(
        f, mw_attention_cached(f->g, query(f), kv(f, 2), "Part", "Nope", "D", positions(f), 1.0f)));
}
static mw_status cached_layout(fx *f) {
    return GRAPHED(traced(
        f, mw_attention_cached(f->g, query(f), kv(f, 3), "Part", "Ctx", "D", positions(f), 1.0f)));
}
static mw_status cached_pos_axes(fx *f) {
    NEED(graph(f));
    mw_tensor *pos = mw_input(f->g, "i", MW_I32, MW_AXES({"Batch", 3}));
    return traced(f, mw_attention_cached(f->g, query(f), kv(f, 2), "Part", "Ctx", "D", pos, 1.0f));
}
static mw_status cached_pos_dtype(fx *f) {
    NEED(graph(f));
    mw_tensor *pos = in(f, "i", MW_AXES({"Batch", 2}));
    return traced(f, mw_attention_cached(f->g, query(f), kv(f, 2), "Part", "Ctx", "D", pos, 1.0f));
}
static mw_status cached_q_axes(fx *f) {
    NEED(graph(f));
    mw_tensor *q = in(f, "q", MW_AXES({"Batch", 2}, {"D", 4}));
    return traced(f,
                  mw_attention_cached(f->g, q, kv(f, 2), "Part", "Ctx", "D", positions(f), 1.0f));
}
static mw_status cached_sharded(fx *f) {
    NEED(graph(f));
    mw_tensor *c = mw_shard(f->g, kv(f, 2), "Ctx", "X");
    return traced(f,
                  mw_attention_cached(f->g, query(f), c, "Part", "Ctx", "D", positions(f), 1.0f));
}
static mw_status cached_null_pos(fx *f) {
    return OP(mw_attention_cached(f->g, query(f), kv(f, 2), "Part", "Ctx", "D", NULL, 1.0f));
}

/* values refused when a program runs: an id or a position outside its axis */
static int32_t ints[8];
static float floats[64];
/* `out` of f->g as an inference program on cpu:1, run on `rows` rows of the inputs named in
 * `names` (i32 for "i", f32 otherwise), every id ints[r]. */
static mw_status run_program(fx *f, mw_tensor *out, int64_t rows, const char *const *names,
                             const int64_t *counts, int n) {
    if (!out) return broken(f, "fixture: %s", mw_graph_error(f->g));
    NEED(mw_mesh_new("cpu:1", "X", &f->mesh));
    mw_infer_config c = {.outputs = &out, .noutputs = 1};
    NEED(mw_infer_new(f->g, f->mesh, &c, &f->inf));
    mw_feed feeds[3];
    for (int k = 0; k < n; k++)
        feeds[k] =
            (mw_feed){names[k], names[k][0] == 'i' ? (void *)ints : (void *)floats, counts[k]};
    mw_fetch fe = {out, buf, mw_tensor_numel(out)};
    return mw_infer_run(f->inf, feeds, n, rows, &fe, 1);
}
static mw_status embedding_id_outside(fx *f) {
    NEED(mw_graph_new(&f->g));
    mw_tensor *ids = mw_input(f->g, "i", MW_I32, MW_AXES({"Batch", 4}));
    ints[0] = 1, ints[1] = 7, ints[2] = 0, ints[3] = 2;
    return run_program(f, mw_embedding(f->g, lookup_table(f), ids, "Vocab"), 4,
                       (const char *[]){"i"}, (const int64_t[]){4}, 1);
}
static mw_status state_write_position_outside(fx *f) {
    NEED(mw_graph_new(&f->g));
    mw_tensor *w = mw_state_write(f->g, state(f), value(f), "Ctx", positions(f));
    ints[0] = 1, ints[1] = 9;
    return run_program(f, w, 2, (const char *[]){"v", "i"}, (const int64_t[]){6, 2}, 2);
}
static mw_status cached_position_outside(fx *f) {
    NEED(mw_graph_new(&f->g));
    mw_tensor *a =
        mw_attention_cached(f->g, query(f), kv(f, 2), "Part", "Ctx", "D", positions(f), 1.0f);
    ints[0] = 0, ints[1] = 6;
    return run_program(f, a, 2, (const char *[]){"q", "i"}, (const int64_t[]){16, 2}, 2);
}

/* inspection */
static mw_status tensor_rank_null(fx *f) {
    return holds(f, mw_tensor_rank(NULL) == -1, "-1 for NULL");
}
static mw_status tensor_dtype_null(fx *f) {
    return holds(f, mw_tensor_dtype(NULL) == MW_F32, "MW_F32 for NULL");
}
static mw_status tensor_axis_out_of_range(fx *f) {
    return GRAPHED(mw_tensor_axis(f->a, 2, NULL, NULL, NULL));
}
static mw_status tensor_axis_null(fx *f) { return mw_tensor_axis(NULL, 0, NULL, NULL, NULL); }
static mw_status tensor_numel_null(fx *f) {
    return holds(f, mw_tensor_numel(NULL) == 0, "0 for NULL");
}
static mw_status tensor_describe_null(fx *f) {
    char buf[16] = "x";
    int ok = mw_tensor_describe(NULL, buf, sizeof buf) == buf && !strcmp(buf, "(null)");
    ok &= mw_tensor_describe(NULL, buf, 0) == buf && !strcmp(buf, "(null)");
    return holds(f, ok, "\"(null)\" for NULL, nothing written with size 0");
}

/* === trainer.h ================================================================================ */

static mw_status optimizer_defaults_are_pytorchs(fx *f) {
    mw_optimizer o = mw_optimizer_defaults(MW_ADAMW);
    return holds(f, o.beta1 == 0.9f && o.beta2 == 0.999f && o.eps == 1e-8f && o.lr == 1e-3f,
                 "AdamW's defaults");
}
static mw_status optimizer_defaults_unknown_kind(fx *f) {
    NEED(model(f));
    NEED(mw_mesh_new("cpu:1", "X", &f->mesh));
    mw_trainer_config c = {.optimizer = mw_optimizer_defaults((mw_optimizer_kind)7)};
    return mw_trainer_new(f->g, f->loss, f->mesh, &c, &f->tr);
}
static mw_status trainer_new_with(fx *f, mw_trainer_config c) {
    NEED(model(f));
    NEED(mw_mesh_new("cpu:1", "X", &f->mesh));
    return mw_trainer_new(f->g, f->loss, f->mesh, &c, &f->tr);
}
static mw_status trainer_new_out_null(fx *f) {
    NEED(model(f));
    NEED(mw_mesh_new("cpu:1", "X", &f->mesh));
    return mw_trainer_new(f->g, f->loss, f->mesh, NULL, NULL);
}
static mw_status trainer_new_null_graph(fx *f) {
    NEED(model(f));
    NEED(mw_mesh_new("cpu:1", "X", &f->mesh));
    return mw_trainer_new(NULL, f->loss, f->mesh, NULL, &f->tr);
}
static mw_status trainer_new_null_mesh(fx *f) {
    return MODELLED(mw_trainer_new(f->g, f->loss, NULL, NULL, &f->tr));
}
static mw_status trainer_new_null_loss(fx *f) {
    NEED(model(f));
    NEED(mw_mesh_new("cpu:1", "X", &f->mesh));
    return mw_trainer_new(f->g, NULL, f->mesh, NULL, &f->tr);
}
static mw_status trainer_new_loss_of_another_graph(fx *f) {
    NEED(model(f));
    NEED(mw_mesh_new("cpu:1", "X", &f->mesh));
    return mw_trainer_new(f->g, f->o, f->mesh, NULL, &f->tr);
}
static mw_status trainer_new_tracing_error(fx *f) {
    NEED(model(f));
    NEED(mw_mesh_new("cpu:1", "X", &f->mesh));
    mw_sum(f->g, f->x, "Nope");
    return mw_trainer_new(f->g, f->loss, f->mesh, NULL, &f->tr);
}
static mw_status trainer_new_loss_not_scalar(fx *f) {
    NEED(model(f));
    NEED(mw_mesh_new("cpu:1", "X", &f->mesh));
    return mw_trainer_new(f->g, f->logits, f->mesh, NULL, &f->tr);
}
static mw_status trainer_new_states(fx *f) {
    NEED(model(f));
    NEED(mw_mesh_new("cpu:1", "X", &f->mesh));
    mw_state(f->g, "s", MW_AXES({"A", 2}));
    return mw_trainer_new(f->g, f->loss, f->mesh, NULL, &f->tr);
}
static mw_status trainer_new_mesh_axis_missing(fx *f) {
    NEED(model(f));
    NEED(mw_mesh_new("cpu:1", "Y", &f->mesh));
    return mw_trainer_new(f->g, f->loss, f->mesh, NULL, &f->tr);
}
static mw_status trainer_new_rows_per_device(fx *f) {
    NEED(mw_graph_new(&f->g));
    mw_tensor *x = mw_shard(f->g, mw_input(f->g, "x", MW_F32, MW_AXES({"Batch", 1})), "Batch", "X");
    mw_tensor *w = mw_param(f->g, "w", MW_SCALAR, MW_INIT_ZEROS);
    mw_tensor *loss = mw_sum(f->g, mw_mul(f->g, x, w), NULL);
    NEED(mw_mesh_new("cpu:2", "X", &f->mesh));
    return mw_trainer_new(f->g, loss, f->mesh, NULL, &f->tr);
}
static mw_status trainer_new_lr(fx *f) {
    mw_trainer_config c = sgd();
    c.optimizer.lr = -1.0f;
    return trainer_new_with(f, c);
}
static mw_status trainer_new_eps(fx *f) {
    return trainer_new_with(f, (mw_trainer_config){.optimizer = {.kind = MW_ADAMW, .lr = 1e-3f}});
}
static mw_status trainer_new_nesterov(fx *f) {
    mw_trainer_config c = sgd();
    c.optimizer.nesterov = 1;
    return trainer_new_with(f, c);
}
static mw_status trainer_new_nonfinite(fx *f) {
    mw_trainer_config c = sgd();
    c.nonfinite = (mw_nonfinite)9;
    return trainer_new_with(f, c);
}
static mw_status trainer_new_recompute(fx *f) {
    mw_trainer_config c = sgd();
    c.recompute = (mw_recompute)9;
    return trainer_new_with(f, c);
}
static mw_status trainer_new_precision(fx *f) {
    mw_trainer_config c = sgd();
    c.precision = (mw_precision)9;
    return trainer_new_with(f, c);
}
static mw_status trainer_new_cpu_threads(fx *f) {
    mw_trainer_config c = sgd();
    c.cpu_threads = -2;
    return trainer_new_with(f, c);
}
static mw_status trainer_new_pin_threads(fx *f) {
    mw_trainer_config c = sgd();
    c.pin_threads = (mw_pinning)-1;
    return trainer_new_with(f, c);
}
static mw_status trainer_new_blas_threads(fx *f) {
    mw_trainer_config c = sgd();
    c.blas_threads = -2;
    return trainer_new_with(f, c);
}
static mw_status trainer_new_timeout(fx *f) {
    mw_trainer_config c = sgd();
    c.collective_timeout_ms = -1;
    return trainer_new_with(f, c);
}
static mw_status trainer_new_gathers(fx *f) {
    mw_trainer_config c = sgd();
    c.gathers = (mw_gathers)2;
    return trainer_new_with(f, c);
}
static mw_status trainer_new_check_replicas(fx *f) {
    mw_trainer_config c = sgd();
    c.check_replicas_every = -1;
    return trainer_new_with(f, c);
}
static mw_status trainer_new_region_open(fx *f) {
    NEED(model(f));
    NEED(mw_mesh_new("cpu:1", "X", &f->mesh));
    mw_region_begin(f->g, "block");
    return mw_trainer_new(f->g, f->loss, f->mesh, NULL, &f->tr);
}
static mw_status trainer_new_null_output(fx *f) {
    mw_tensor *none = NULL;
    mw_trainer_config c = sgd();
    c.outputs = &none;
    c.noutputs = 1;
    return trainer_new_with(f, c);
}
static mw_status trainer_new_output_of_another_graph(fx *f) {
    NEED(model(f));
    NEED(mw_mesh_new("cpu:1", "X", &f->mesh));
    mw_trainer_config c = sgd();
    c.outputs = &f->o;
    c.noutputs = 1;
    return mw_trainer_new(f->g, f->loss, f->mesh, &c, &f->tr);
}
static mw_status trainer_new_out_of_memory(fx *f) {
    NEED(model(f));
    NEED(mw_mesh_new("cpu:1", "X", &f->mesh));
    mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)(1));
    return mw_trainer_new(f->g, f->loss, f->mesh, NULL, &f->tr);
}
static mw_status trainer_free_null(fx *f) {
    mw_trainer_free(NULL);
    return holds(f, !*mw_last_error(), "a no-op");
}

/* steps */
static mw_status step_null_trainer(fx *f) {
    return MODELLED(mw_trainer_step(NULL, f->feeds, 2, NULL));
}
static mw_status step_missing_feed(fx *f) {
    return TRAINED(mw_trainer_step(f->tr, f->feeds, 1, NULL));
}
static mw_status step_unknown_feed(fx *f) {
    NEED(trainer(f));
    f->feeds[1].name = "labels";
    return step(f);
}
static mw_status step_wrong_size(fx *f) {
    NEED(trainer(f));
    f->feeds[0].count--;
    return step(f);
}
static mw_status step_feed_twice(fx *f) {
    NEED(trainer(f));
    f->feeds[1] = f->feeds[0];
    return step(f);
}
static mw_status step_null_data(fx *f) {
    NEED(trainer(f));
    f->feeds[0].data = NULL;
    return step(f);
}
static mw_status step_negative_count(fx *f) {
    return TRAINED(mw_trainer_step(f->tr, f->feeds, -1, NULL));
}
static mw_status step_label_out_of_range(fx *f) {
    NEED(trainer(f));
    f->ys[6] = 5;
    return step(f);
}
static mw_status step_nonfinite(fx *f) {
    NEED(trainer(f));
    f->xs[3] = NAN;
    return step(f);
}
static mw_status accumulate_without_option(fx *f) {
    return TRAINED(mw_trainer_accumulate(f->tr, f->feeds, 2, NULL));
}
static mw_status accumulate_missing_feed(fx *f) {
    mw_trainer_config c = sgd();
    c.grad_accumulation = 1;
    NEED(trainer_on(f, "cpu:1", c));
    return mw_trainer_accumulate(f->tr, f->feeds, 1, NULL);
}
static mw_status accumulate_null(fx *f) {
    return MODELLED(mw_trainer_accumulate(NULL, f->feeds, 2, NULL));
}
static mw_status compute_grads_unknown_feed(fx *f) {
    NEED(trainer(f));
    f->feeds[0].name = "inputs";
    return mw_trainer_compute_grads(f->tr, f->feeds, 2, NULL);
}
static mw_status compute_grads_null(fx *f) {
    return MODELLED(mw_trainer_compute_grads(NULL, f->feeds, 2, NULL));
}
static mw_status eval_wrong_size(fx *f) {
    NEED(trainer(f));
    f->feeds[1].count = 3;
    return mw_trainer_eval(f->tr, f->feeds, 2, NULL);
}
static mw_status eval_not_interrupted(fx *f) {
    NEED(trainer(f));
    mw_request_stop();
    return mw_trainer_eval(f->tr, f->feeds, 2, NULL);
}

/* parameters, gradients, outputs */
static mw_status read_param_unknown(fx *f) {
    return TRAINED(mw_trainer_read_param(f->tr, "nope", buf, 6));
}
static mw_status read_param_count(fx *f) {
    return TRAINED(mw_trainer_read_param(f->tr, "w", buf, 5));
}
static mw_status read_param_null_name(fx *f) {
    return TRAINED(mw_trainer_read_param(f->tr, NULL, buf, 6));
}
static mw_status read_param_null_dst(fx *f) {
    return TRAINED(mw_trainer_read_param(f->tr, "w", NULL, 6));
}
static mw_status read_param_null_trainer(fx *f) { return mw_trainer_read_param(NULL, "w", buf, 6); }
static mw_status write_param_unknown(fx *f) {
    return TRAINED(mw_trainer_write_param(f->tr, "nope", buf, 6));
}
static mw_status write_param_count(fx *f) {
    return TRAINED(mw_trainer_write_param(f->tr, "w", buf, 7));
}
static mw_status write_param_null_src(fx *f) {
    return TRAINED(mw_trainer_write_param(f->tr, "w", NULL, 6));
}
static mw_status read_grad_before_a_step(fx *f) {
    return TRAINED(mw_trainer_read_grad(f->tr, "w", buf, 6));
}
static mw_status read_grad_after_eval_only(fx *f) {
    NEED(trainer(f));
    NEED(mw_trainer_eval(f->tr, f->feeds, 2, NULL));
    return mw_trainer_read_grad(f->tr, "w", buf, 6);
}
static mw_status read_grad_unknown(fx *f) {
    return STEPPED(mw_trainer_read_grad(f->tr, "nope", buf, 6));
}
static mw_status read_grad_count(fx *f) {
    return STEPPED(mw_trainer_read_grad(f->tr, "w", buf, 60));
}
static mw_status read_grad_null_dst(fx *f) {
    return STEPPED(mw_trainer_read_grad(f->tr, "w", NULL, 6));
}
static mw_status read_output_not_configured(fx *f) {
    return STEPPED(
        mw_trainer_read_output(f->tr, mw_scale(f->g, f->logits, 2.0f), buf, ROWS * CLASSES));
}
static mw_status read_output_before_a_step(fx *f) {
    return TRAINED(mw_trainer_read_output(f->tr, f->logits, buf, ROWS * CLASSES));
}
static mw_status read_output_count(fx *f) {
    NEED(trainer(f));
    NEED(mw_trainer_eval(f->tr, f->feeds, 2, NULL));
    return mw_trainer_read_output(f->tr, f->logits, buf, ROWS);
}
static mw_status read_output_null(fx *f) {
    return STEPPED(mw_trainer_read_output(f->tr, NULL, buf, ROWS * CLASSES));
}

/* checkpoints */
static mw_status save_null_path(fx *f) { return TRAINED(mw_trainer_save(f->tr, NULL, NULL, 0)); }
static mw_status save_null_user(fx *f) {
    return TRAINED(mw_trainer_save(f->tr, at(f, "ck"), NULL, 8));
}
static mw_status save_missing_folder(fx *f) {
    return TRAINED(mw_trainer_save(f->tr, at(f, "no/such/ck"), NULL, 0));
}
static mw_status save_over_a_folder(fx *f) {
    return TRAINED(mw_trainer_save(f->tr, folder(f), NULL, 0));
}
static mw_status save_over_a_fifo(fx *f) {
    return TRAINED(mw_trainer_save(f->tr, fifo(f), NULL, 0));
}
static const char *checkpoint(fx *f, size_t user_bytes) {
    static const char user[16] = "caller's state";
    const char *p = at(f, "ck");
    return mw_trainer_save(f->tr, p, user, user_bytes) ? "mw_trainer_save failed" : p;
}
static mw_status load_null_path(fx *f) {
    return TRAINED(mw_trainer_load(f->tr, NULL, NULL, 0, NULL));
}
static mw_status load_missing(fx *f) {
    return TRAINED(mw_trainer_load(f->tr, at(f, "none"), NULL, 0, NULL));
}
static mw_status load_folder(fx *f) {
    return TRAINED(mw_trainer_load(f->tr, folder(f), NULL, 0, NULL));
}
static mw_status load_fifo(fx *f) {
    return TRAINED(mw_trainer_load(f->tr, fifo(f), NULL, 0, NULL));
}
static mw_status load_not_a_checkpoint(fx *f) {
    return TRAINED(mw_trainer_load(
        f->tr, text_file(f, "t", "not a checkpoint at all, but some text"), NULL, 0, NULL));
}
static mw_status load_truncated(fx *f) {
    NEED(trainer(f));
    const char *p = checkpoint(f, 0);
    if (truncate(p, 100) != 0) return broken(f, "truncate");
    return mw_trainer_load(f->tr, p, NULL, 0, NULL);
}
static mw_status load_capacity(fx *f) {
    NEED(trainer(f));
    char user[4];
    return mw_trainer_load(f->tr, checkpoint(f, 8), user, sizeof user, NULL);
}
static mw_status load_another_optimizer(fx *f) {
    NEED(trainer(f));
    const char *p = checkpoint(f, 0);
    fx other = {0};
    mw_trainer_config adamw = {.optimizer = MW_ADAMW_INIT(1e-3f)};
    mw_status st = trainer_on(&other, "cpu:1", adamw) ? broken(f, "%s", other.why)
                                                      : mw_trainer_load(other.tr, p, NULL, 0, NULL);
    fx_free(&other);
    return st;
}
static mw_status checkpoint_info_null_path(fx *f) {
    return mw_checkpoint_info(NULL, NULL, NULL, 0, NULL);
}
static mw_status checkpoint_info_null_user(fx *f) {
    return TRAINED(mw_checkpoint_info(checkpoint(f, 8), NULL, NULL, 8, NULL));
}
static mw_status checkpoint_info_missing(fx *f) {
    return mw_checkpoint_info(at(f, "none"), NULL, NULL, 0, NULL);
}
static mw_status checkpoint_info_fifo(fx *f) {
    return mw_checkpoint_info(fifo(f), NULL, NULL, 0, NULL);
}
static mw_status checkpoint_info_garbage(fx *f) {
    return mw_checkpoint_info(text_file(f, "t",
                                        "0123456789abcdef0123456789abcdef0123456789abcdef"
                                        "0123456789abcdef"),
                              NULL, NULL, 0, NULL);
}
static mw_status checkpoint_info_capacity(fx *f) {
    NEED(trainer(f));
    char user[4];
    return mw_checkpoint_info(checkpoint(f, 8), NULL, user, sizeof user, NULL);
}

/* statistics */
static mw_status stats_null(fx *f) { return TRAINED(mw_trainer_stats(f->tr, NULL)); }
static mw_status memory_device(fx *f) {
    mw_device_memory m;
    NEED(trainer(f));
    return mw_trainer_memory(f->tr, 1, &m);
}
static mw_status memory_null(fx *f) { return TRAINED(mw_trainer_memory(f->tr, 0, NULL)); }
static mw_status kernels_size_0(fx *f) {
    char b[8];
    NEED(trainer(f));
    return mw_trainer_kernels(f->tr, b, 0);
}
static mw_status kernels_null(fx *f) { return mw_trainer_kernels(NULL, NULL, 8); }
static mw_status profile_not_enabled(fx *f) {
    int n;
    NEED(trainer(f));
    return mw_trainer_profile(f->tr, NULL, 0, &n);
}
static mw_status profile_null_count(fx *f) {
    mw_trainer_config c = sgd();
    c.profile = 1;
    NEED(trainer_on(f, "cpu:1", c));
    return mw_trainer_profile(f->tr, NULL, 0, NULL);
}
static mw_status profile_reset_null(fx *f) {
    mw_trainer_profile_reset(NULL);
    return holds(f, !*mw_last_error(), "a no-op");
}
static mw_status phase_name_unknown(fx *f) {
    return holds(f, !strcmp(mw_phase_name((mw_phase)42), "unknown phase"), "\"unknown phase\"");
}

/* testing hooks */
static mw_status inject_fault_fails_the_step(fx *f) {
    NEED(trainer(f));
    NEED(mw_test_control(MW_TEST_FAULT, f->tr, 0, MW_PHASE_BACKWARD, (int64_t)(0), MW_ERR_DEVICE));
    return step(f);
}
static mw_status inject_fault_device(fx *f) {
    return TRAINED(
        mw_test_control(MW_TEST_FAULT, f->tr, 1, MW_PHASE_FORWARD, (int64_t)(0), MW_ERR_DEVICE));
}
static mw_status inject_fault_ok(fx *f) {
    return TRAINED(mw_test_control(MW_TEST_FAULT, f->tr, 0, MW_PHASE_FORWARD, (int64_t)(0), MW_OK));
}
static mw_status inject_fault_phase(fx *f) {
    return TRAINED(
        mw_test_control(MW_TEST_FAULT, f->tr, 0, (mw_phase)9, (int64_t)(0), MW_ERR_DEVICE));
}
static mw_status inject_stall_times_out(fx *f) {
    mw_trainer_config c = sgd();
    c.collective_timeout_ms = 50;
    c.cpu_threads = MW_CPU_THREADS_PER_DEVICE;
    NEED(trainer_on(f, "cpu:2", c));
    NEED(mw_test_control(MW_TEST_STALL, f->tr, 1, MW_PHASE_GRAD_REDUCE, (int64_t)(0), 400));
    return step(f);
}
static mw_status inject_stall_time(fx *f) {
    return TRAINED(mw_test_control(MW_TEST_STALL, f->tr, 0, MW_PHASE_FORWARD, (int64_t)(0), 0));
}
static mw_status test_control_unknown_op(fx *f) {
    (void)f;
    return (mw_status)mw_test_control((mw_test_op)99);
}
static mw_status inject_stall_device(fx *f) {
    return TRAINED(mw_test_control(MW_TEST_STALL, f->tr, -1, MW_PHASE_FORWARD, (int64_t)(0), 10));
}
static mw_status steps_null(fx *f) { return holds(f, mw_trainer_steps(NULL) == 0, "0 for NULL"); }
static mw_status skipped_steps_null(fx *f) {
    return holds(f, mw_trainer_skipped_steps(NULL) == 0, "0 for NULL");
}
static mw_status check_replicas_differ(fx *f) {
    NEED(trainer_on(f, "cpu:2", sgd()));
    worker *w = &f->tr->prog->w[1];
    float other[FEAT * CLASSES] = {1, 2, 3, 4, 5, 6};
    NEED(w->dev.vt->upload(&w->dev, w->params, other, sizeof other));
    return mw_trainer_check_replicas(f->tr);
}
static mw_status check_replicas_null(fx *f) { return mw_trainer_check_replicas(NULL); }

/* stopping */
static mw_status request_stop_interrupts(fx *f) {
    NEED(trainer(f));
    mw_request_stop();
    return step(f);
}
static mw_status request_stop_stays(fx *f) {
    NEED(trainer(f));
    mw_request_stop();
    mw_status first = step(f), second = step(f);
    return holds(f,
                 first == MW_ERR_INTERRUPTED && second == MW_ERR_INTERRUPTED &&
                     mw_trainer_steps(f->tr) == 0,
                 "every step interrupted until mw_cancel_stop, nothing changed");
}
static mw_status trainer_request_stop_once(fx *f) {
    NEED(trainer(f));
    mw_trainer_request_stop(f->tr);
    mw_status first = step(f), second = step(f);
    mw_trainer_request_stop(NULL); /* a no-op */
    return first == MW_ERR_INTERRUPTED && second == MW_OK ? MW_ERR_INTERRUPTED
                                                          : broken(f, "consumed by one step");
}
static mw_status stop_requested_while_set(fx *f) {
    mw_request_stop();
    int set = mw_stop_requested();
    mw_cancel_stop();
    return holds(f, set && !mw_stop_requested(), "non-zero while requested");
}
static mw_status cancel_stop_steps_again(fx *f) {
    NEED(trainer(f));
    mw_request_stop();
    mw_cancel_stop();
    return step(f);
}

/* learning rates, norms, sizes */
static mw_status lr_null(fx *f) { return holds(f, mw_trainer_lr(NULL, 0) == 0.0f, "0 for NULL"); }
static mw_status set_lr_null(fx *f) { return mw_trainer_set_lr(NULL, 0.1f); }
static mw_status set_lr_negative(fx *f) { return TRAINED(mw_trainer_set_lr(f->tr, -0.5f)); }
static mw_status set_lr_nan(fx *f) { return TRAINED(mw_trainer_set_lr(f->tr, NAN)); }
static mw_status set_lr_infinite(fx *f) { return TRAINED(mw_trainer_set_lr(f->tr, INFINITY)); }
static mw_status grad_norm_before_a_step(fx *f) {
    return TRAINED(holds(f,
                         mw_trainer_grad_norm(f->tr) == 0.0f && mw_trainer_grad_norm(NULL) == 0.0f,
                         "0 before the first step and for NULL"));
}
static mw_status devices_null(fx *f) {
    return holds(f, mw_trainer_devices(NULL) == 0, "0 for NULL");
}
static mw_status local_size_unknown(fx *f) {
    NEED(trainer(f));
    int ok = mw_trainer_local_size(f->tr, 0, "Nope") == -1 &&
             mw_trainer_local_size(f->tr, 1, "Batch") == -1 &&
             mw_trainer_local_size(f->tr, 0, NULL) == -1 &&
             mw_trainer_local_size(NULL, 0, "Batch") == -1 &&
             mw_trainer_local_size(f->tr, 0, "Batch") == ROWS;
    return holds(f, ok, "-1 for an unknown axis or device, NULL");
}

/* === infer.h ================================================================================== */

static mw_status infer_new_out_null(fx *f) {
    NEED(model(f));
    NEED(mw_mesh_new("cpu:1", "X", &f->mesh));
    mw_infer_config c = {.outputs = &f->logits, .noutputs = 1};
    return mw_infer_new(f->g, f->mesh, &c, NULL);
}
static mw_status infer_new_with(fx *f, mw_tensor *output, const char *axes, mw_precision prec) {
    NEED(mw_mesh_new("cpu:1", axes, &f->mesh));
    mw_infer_config c = {.outputs = &output, .noutputs = output ? 1 : 0, .precision = prec};
    return mw_infer_new(f->g, f->mesh, &c, &f->inf);
}
static mw_status infer_new_blas_threads(fx *f) {
    NEED(model(f));
    NEED(mw_mesh_new("cpu:1", "X", &f->mesh));
    mw_infer_config c = {.outputs = &f->logits, .noutputs = 1, .blas_threads = -3};
    return mw_infer_new(f->g, f->mesh, &c, &f->inf);
}
static mw_status infer_new_no_outputs(fx *f) { return MODELLED(infer_new_with(f, NULL, "X", 0)); }
static mw_status infer_new_config_null(fx *f) {
    NEED(model(f));
    NEED(mw_mesh_new("cpu:1", "X", &f->mesh));
    return mw_infer_new(f->g, f->mesh, NULL, &f->inf);
}
static mw_status infer_new_output_of_another_graph(fx *f) {
    return MODELLED(infer_new_with(f, f->o, "X", 0));
}
static mw_status infer_new_chunk_axis_not_first(fx *f) {
    return MODELLED(infer_new_with(f, mw_permute(f->g, f->logits, "Class,Batch"), "X", 0));
}
static mw_status infer_new_mixes_rows(fx *f) {
    return MODELLED(infer_new_with(f, mw_mean(f->g, f->logits, "Batch"), "X", 0));
}
static mw_status infer_new_mesh_axis_missing(fx *f) {
    return MODELLED(infer_new_with(f, f->logits, "Y", 0));
}
static mw_status infer_new_precision(fx *f) {
    return MODELLED(infer_new_with(f, f->logits, "X", 7));
}
static mw_status infer_new_tracing_error(fx *f) {
    NEED(model(f));
    mw_sum(f->g, f->x, "Nope");
    return infer_new_with(f, f->logits, "X", 0);
}
static mw_status from_trainer_null(fx *f) {
    NEED(model(f));
    mw_infer_config c = {.outputs = &f->logits, .noutputs = 1};
    return mw_infer_from_trainer(NULL, f->g, &c, &f->inf);
}
/* A program of a graph with the trainer's x and logits = x . w2, where w2 is `name` of `axes`. */
static mw_status from_trainer_param(fx *f, const char *name, mw_axes axes, int split) {
    NEED(trainer(f));
    mw_graph *g = f->g2;
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", ROWS}, {"Feature", FEAT}));
    mw_tensor *w = mw_param(g, name, axes, MW_INIT_ZEROS);
    if (split) w = mw_shard(g, w, "Class", "X");
    mw_tensor *out = mw_dot(g, x, w, "Feature");
    mw_infer_config c = {.outputs = &out, .noutputs = 1};
    return mw_infer_from_trainer(f->tr, g, &c, &f->inf);
}
static mw_status from_trainer_unknown_param(fx *f) {
    return from_trainer_param(f, "v", MW_AXES({"Feature", FEAT}, {"Class", CLASSES}), 0);
}
static mw_status from_trainer_other_shape(fx *f) {
    return from_trainer_param(f, "w", MW_AXES({"Feature", FEAT}, {"Class", 4}), 0);
}
static mw_status from_trainer_other_split(fx *f) {
    return from_trainer_param(f, "w", MW_AXES({"Feature", FEAT}, {"Class", CLASSES}), 1);
}
static mw_status infer_free_null(fx *f) {
    mw_infer_free(NULL);
    return holds(f, !*mw_last_error(), "a no-op");
}
static mw_status infer_chunk_rows_null(fx *f) {
    return holds(f, mw_infer_chunk_rows(NULL) == 0, "0 for NULL");
}
static mw_status run_with(fx *f, int nfeeds, int64_t rows, int64_t fetch_count,
                          const mw_tensor *output) {
    mw_fetch fe = {output ? output : f->logits, buf, fetch_count};
    return mw_infer_run(f->inf, f->feeds, nfeeds, rows, &fe, 1);
}
static mw_status infer_run_null(fx *f) { return mw_infer_run(NULL, NULL, 0, 1, NULL, 0); }
static mw_status infer_run_rows_0(fx *f) { return INFERRED(run_with(f, 1, 0, 0, NULL)); }
static mw_status infer_run_missing_feed(fx *f) {
    return INFERRED(run_with(f, 0, 2, 2 * CLASSES, NULL));
}
static mw_status infer_run_unknown_feed(fx *f) {
    NEED(infer(f));
    f->feeds[0].name = "z";
    return run_with(f, 1, ROWS, ROWS * CLASSES, NULL);
}
static mw_status infer_run_feed_size(fx *f) {
    return INFERRED(run_with(f, 1, 3, 3 * CLASSES, NULL));
}
static mw_status infer_run_fetch_size(fx *f) { return INFERRED(run_with(f, 1, ROWS, 5, NULL)); }
static mw_status infer_run_not_an_output(fx *f) {
    return INFERRED(run_with(f, 1, ROWS, ROWS * CLASSES, mw_scale(f->g, f->logits, 2.0f)));
}
static mw_status infer_load_weights_null(fx *f) {
    return mw_infer_load_weights(NULL, at(f, "w"), NULL, 0);
}
static mw_status infer_load_weights_missing(fx *f) {
    return INFERRED(mw_infer_load_weights(f->inf, at(f, "none.safetensors"), NULL, 0));
}
static mw_status infer_load_weights_no_tensor(fx *f) {
    return INFERRED(mw_infer_load_weights(f->inf, weights_file(f, "v", "F32", FEAT), NULL, 0));
}
static mw_status infer_load_weights_shape(fx *f) {
    return INFERRED(mw_infer_load_weights(f->inf, weights_file(f, "w", "F32", 3), NULL, 0));
}
static mw_status infer_write_param_unknown(fx *f) {
    return INFERRED(mw_infer_write_param(f->inf, "v", buf, 6));
}
static mw_status infer_write_param_count(fx *f) {
    return INFERRED(mw_infer_write_param(f->inf, "w", buf, 2));
}
static mw_status infer_write_param_null(fx *f) { return mw_infer_write_param(NULL, "w", buf, 6); }
static mw_status infer_read_param_unknown(fx *f) {
    return INFERRED(mw_infer_read_param(f->inf, "v", buf, 6));
}
static mw_status infer_read_param_null_dst(fx *f) {
    return INFERRED(mw_infer_read_param(f->inf, "w", NULL, 6));
}

/* === sample.h ================================================================================= */

/* A sampler of config c changed by the row: MW_OK when made (freed with the fixture). */
static mw_status sampler_with(fx *f, mw_sample_config c) { return mw_sampler_new(&c, &f->sampler); }
static mw_sample_config plain(void) { return (mw_sample_config)MW_SAMPLE_CONFIG_INIT; }
static int sampler(fx *f) { return sampler_with(f, plain()) ? failed(f, "mw_sampler_new") : 0; }
#define SAMPLED(expr) (sampler(f) ? BROKEN : (expr))
static mw_status sampler_new_null_config(fx *f) { return mw_sampler_new(NULL, &f->sampler); }
static mw_status sampler_new_null_out(fx *f) {
    mw_sample_config c = plain();
    return mw_sampler_new(&c, NULL);
}
static mw_status sampler_new_negative_temperature(fx *f) {
    mw_sample_config c = plain();
    c.temperature = -0.5;
    return sampler_with(f, c);
}
static mw_status sampler_new_nan_temperature(fx *f) {
    mw_sample_config c = plain();
    c.temperature = NAN;
    return sampler_with(f, c);
}
static mw_status sampler_new_infinite_temperature(fx *f) {
    mw_sample_config c = plain();
    c.temperature = INFINITY;
    return sampler_with(f, c);
}
static mw_status sampler_new_negative_top_k(fx *f) {
    mw_sample_config c = plain();
    c.top_k = -1;
    return sampler_with(f, c);
}
static mw_status sampler_new_top_p_0(fx *f) {
    mw_sample_config c = plain();
    c.top_p = 0.0;
    return sampler_with(f, c);
}
static mw_status sampler_new_top_p_above_1(fx *f) {
    mw_sample_config c = plain();
    c.top_p = 1.5;
    return sampler_with(f, c);
}
static mw_status sampler_new_nan_top_p(fx *f) {
    mw_sample_config c = plain();
    c.top_p = NAN;
    return sampler_with(f, c);
}
static mw_status sampler_new_negative_neos(fx *f) {
    mw_sample_config c = plain();
    c.neos = -1;
    return sampler_with(f, c);
}
static mw_status sampler_new_null_eos_ids(fx *f) {
    mw_sample_config c = plain();
    c.neos = 2;
    return sampler_with(f, c);
}
static mw_status sampler_new_negative_eos_id(fx *f) {
    const int32_t eos[] = {50256, -3};
    mw_sample_config c = plain();
    c.eos_ids = eos, c.neos = 2;
    return sampler_with(f, c);
}
static mw_status sampler_free_null(fx *f) {
    mw_sampler_free(NULL);
    return holds(f, !*mw_last_error(), "a no-op");
}
static const float four_logits[] = {0.5f, 1.0f, 2.0f, -1.0f};
static mw_status sampler_draw_null(fx *f) {
    int32_t t;
    return mw_sampler_draw(NULL, four_logits, 4, &t);
}
static mw_status sampler_draw_null_logits(fx *f) {
    int32_t t;
    return SAMPLED(mw_sampler_draw(f->sampler, NULL, 4, &t));
}
static mw_status sampler_draw_null_token(fx *f) {
    return SAMPLED(mw_sampler_draw(f->sampler, four_logits, 4, NULL));
}
static mw_status sampler_draw_vocab_0(fx *f) {
    int32_t t;
    return SAMPLED(mw_sampler_draw(f->sampler, four_logits, 0, &t));
}
static mw_status sampler_draw_nan(fx *f) {
    const float l[] = {0.5f, 1.0f, NAN, -1.0f};
    int32_t t;
    return SAMPLED(mw_sampler_draw(f->sampler, l, 4, &t));
}
static mw_status sampler_draw_infinite(fx *f) {
    const float l[] = {0.5f, INFINITY, 2.0f, -1.0f};
    int32_t t;
    return SAMPLED(mw_sampler_draw(f->sampler, l, 4, &t));
}
static mw_status sampler_draw_all_ruled_out(fx *f) {
    const float l[] = {-INFINITY, -INFINITY, -INFINITY};
    int32_t t;
    return SAMPLED(mw_sampler_draw(f->sampler, l, 3, &t));
}
static mw_status sampler_is_eos_null(fx *f) {
    return holds(f, mw_sampler_is_eos(NULL, 0) == 0, "0 for NULL");
}
static mw_status sampler_position_null(fx *f) {
    return holds(f, mw_sampler_position(NULL) == 0, "0 for NULL");
}
static mw_status sampler_set_position_null(fx *f) { return mw_sampler_set_position(NULL, 3); }

/* === weights.h ================================================================================ */

static mw_status graph_param_count_null(fx *f) {
    return holds(f, mw_graph_param_count(NULL) == 0, "0 for NULL");
}
static mw_status graph_param_info_range(fx *f) {
    mw_param_info i;
    NEED(graph(f));
    return mw_graph_param_info(f->g, 5, &i);
}
static mw_status graph_param_info_null(fx *f) {
    return GRAPHED(mw_graph_param_info(f->g, 0, NULL));
}
static mw_status trainer_param_count_null(fx *f) {
    return holds(f, mw_trainer_param_count(NULL) == 0, "0 for NULL");
}
static mw_status trainer_param_info_range(fx *f) {
    mw_param_info i;
    NEED(trainer(f));
    return mw_trainer_param_info(f->tr, -1, &i);
}
static mw_status trainer_param_info_null(fx *f) {
    mw_param_info i;
    return mw_trainer_param_info(NULL, 0, &i);
}
static mw_status safetensors_open_null(fx *f) { return mw_safetensors_open(NULL, NULL); }
static mw_status safetensors_open_missing(fx *f) {
    return mw_safetensors_open(at(f, "none"), &f->st);
}
static mw_status safetensors_open_folder(fx *f) { return mw_safetensors_open(folder(f), &f->st); }
static mw_status safetensors_open_fifo(fx *f) { return mw_safetensors_open(fifo(f), &f->st); }
static mw_status safetensors_open_garbage(fx *f) {
    return mw_safetensors_open(file_of(f, "t", BYTES("\x10\0\0\0\0\0\0\0{\"a\": 1}        ")),
                               &f->st);
}
static mw_status safetensors_open_header_length(fx *f) {
    return mw_safetensors_open(file_of(f, "t", BYTES("\xff\xff\xff\xff\xff\xff\xff\x7f{}")),
                               &f->st);
}
static mw_status safetensors_parse_short(fx *f) {
    return mw_safetensors_parse("abc", 3, "three bytes", &f->st);
}
static mw_status safetensors_parse_null(fx *f) { return mw_safetensors_parse("abc", 3, "x", NULL); }
static mw_status safetensors_close_null(fx *f) {
    mw_safetensors_close(NULL);
    return holds(f, !*mw_last_error(), "a no-op");
}
static int stored(fx *f) {
    return mw_safetensors_open(weights_file(f, "w", "F32", FEAT), &f->st) ? failed(f, "open") : 0;
}
static mw_status safetensors_count_null(fx *f) {
    return holds(f, mw_safetensors_count(NULL) == 0, "0 for NULL");
}
static mw_status safetensors_tensor_range(fx *f) {
    mw_stored_tensor t;
    NEED(stored(f));
    return mw_safetensors_tensor(f->st, 1, &t);
}
static mw_status safetensors_tensor_null(fx *f) {
    return STORED(mw_safetensors_tensor(f->st, 0, NULL));
}
static mw_status safetensors_find_missing(fx *f) {
    mw_stored_tensor t;
    NEED(stored(f));
    return mw_safetensors_find(f->st, "v", &t);
}
static mw_status safetensors_find_null(fx *f) {
    mw_stored_tensor t;
    NEED(stored(f));
    return mw_safetensors_find(f->st, NULL, &t);
}
static mw_status safetensors_metadata_missing(fx *f) {
    return STORED(holds(f,
                        !mw_safetensors_metadata(f->st, "format") &&
                            !mw_safetensors_metadata(f->st, NULL) &&
                            !mw_safetensors_metadata(NULL, "a"),
                        "NULL for a missing key, a NULL key or file"));
}
static mw_status safetensors_read_missing(fx *f) {
    return STORED(mw_safetensors_read(f->st, "v", buf, 6));
}
static mw_status safetensors_read_count(fx *f) {
    return STORED(mw_safetensors_read(f->st, "w", buf, 4));
}
static mw_status safetensors_read_dtype(fx *f) {
    NEED(mw_safetensors_open(weights_file(f, "w", "I32", FEAT), &f->st));
    return mw_safetensors_read(f->st, "w", buf, 6);
}
static mw_status safetensors_read_null(fx *f) {
    return STORED(mw_safetensors_read(f->st, "w", NULL, 6));
}
static mw_status write_entry(fx *f, const char *path, mw_safetensors_entry e) {
    mw_safetensors_entry two[2] = {{"first", 1, {2}, buf}, e};
    return mw_safetensors_write(path ? path : at(f, "out.safetensors"), two, 2);
}
static mw_status safetensors_write_null_path(fx *f) { return mw_safetensors_write(NULL, NULL, 0); }
static mw_status safetensors_write_empty_name(fx *f) {
    return write_entry(f, NULL, (mw_safetensors_entry){"", 1, {2}, buf});
}
static mw_status safetensors_write_duplicate(fx *f) {
    return write_entry(f, NULL, (mw_safetensors_entry){"first", 1, {2}, buf});
}
static mw_status safetensors_write_reserved(fx *f) {
    return write_entry(f, NULL, (mw_safetensors_entry){"__metadata__", 1, {2}, buf});
}
static mw_status safetensors_write_control(fx *f) {
    return write_entry(f, NULL, (mw_safetensors_entry){"a\nb", 1, {2}, buf});
}
static mw_status safetensors_write_rank(fx *f) {
    return write_entry(f, NULL, (mw_safetensors_entry){"r", 9, {2}, buf});
}
static mw_status safetensors_write_size(fx *f) {
    return write_entry(f, NULL, (mw_safetensors_entry){"s", 1, {-2}, buf});
}
static mw_status safetensors_write_no_data(fx *f) {
    return write_entry(f, NULL, (mw_safetensors_entry){"d", 1, {2}, NULL});
}
static mw_status safetensors_write_missing_folder(fx *f) {
    return write_entry(f, at(f, "no/such.safetensors"), (mw_safetensors_entry){"b", 1, {2}, buf});
}
static mw_status safetensors_write_folder(fx *f) {
    return write_entry(f, folder(f), (mw_safetensors_entry){"b", 1, {2}, buf});
}
static mw_status save_weights_null_path(fx *f) {
    return TRAINED(mw_trainer_save_weights(f->tr, NULL, NULL, 0));
}
static mw_status save_weights_null_trainer(fx *f) {
    return mw_trainer_save_weights(NULL, at(f, "w"), NULL, 0);
}
static mw_status save_weights_unknown(fx *f) {
    mw_weight_name n = {"v", "v"};
    NEED(trainer(f));
    return mw_trainer_save_weights(f->tr, at(f, "w"), &n, 1);
}
static mw_status save_weights_duplicate(fx *f) {
    mw_weight_name n[2] = {{"w", "x"}, {"w", "x"}};
    NEED(trainer(f));
    return mw_trainer_save_weights(f->tr, at(f, "w"), n, 2);
}
static mw_status save_weights_missing_folder(fx *f) {
    return TRAINED(mw_trainer_save_weights(f->tr, at(f, "no/such"), NULL, 0));
}
static mw_status load_weights_null_path(fx *f) {
    return TRAINED(mw_trainer_load_weights(f->tr, NULL, NULL, 0));
}
static mw_status load_weights_missing(fx *f) {
    return TRAINED(mw_trainer_load_weights(f->tr, at(f, "none"), NULL, 0));
}
static mw_status load_weights_garbage(fx *f) {
    return TRAINED(
        mw_trainer_load_weights(f->tr, file_of(f, "t", BYTES("\x02\0\0\0\0\0\0\0[]")), NULL, 0));
}
static mw_status load_weights_no_tensor(fx *f) {
    return TRAINED(mw_trainer_load_weights(f->tr, weights_file(f, "v", "F32", FEAT), NULL, 0));
}
static mw_status load_weights_unknown_param(fx *f) {
    mw_weight_name n = {"nope", "w"};
    NEED(trainer(f));
    return mw_trainer_load_weights(f->tr, weights_file(f, "w", "F32", FEAT), &n, 1);
}
static mw_status load_weights_shape(fx *f) {
    return TRAINED(mw_trainer_load_weights(f->tr, weights_file(f, "w", "F32", 5), NULL, 0));
}
static mw_status load_weights_dtype(fx *f) {
    return TRAINED(mw_trainer_load_weights(f->tr, weights_file(f, "w", "I32", FEAT), NULL, 0));
}

/* === distributed.h (one process) ============================================================== */

static mw_status distributed_init_alone(fx *f) { return mw_distributed_init(NULL, NULL); }
static mw_status distributed_finalize_alone(fx *f) {
    mw_distributed_finalize();
    return holds(f, !*mw_last_error(), "a no-op");
}
static mw_status distributed_rank_alone(fx *f) {
    return holds(f, mw_distributed_rank() == 0, "rank 0 without MPI");
}
static mw_status distributed_size_alone(fx *f) {
    return holds(f, mw_distributed_size() == 1, "1 process without MPI");
}
static mw_status distributed_available_flag(fx *f) {
    int a = mw_distributed_available();
    return holds(f, a == 0 || a == 1, "0 or 1");
}
static mw_status agree_alone(fx *f) { return mw_distributed_agree("flags", "--seed 1", 0); }
static mw_status agree_null(fx *f) { return mw_distributed_agree(NULL, "--seed 1", 0); }
static mw_status agree_timeout(fx *f) { return mw_distributed_agree("flags", "", -1); }
static mw_status abort_exits(fx *f) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) mw_distributed_abort(3);
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return broken(f, "fork");
    return holds(f, WIFEXITED(status) && WEXITSTATUS(status) == 3, "exit status 3");
}

/* === tokenizer.h ============================================================================== */

static int tokenizer(fx *f) {
    return mw_tokenizer_load(data(f, "tokenizer/tokenizer.json"), &f->tok) ? failed(f, "load") : 0;
}
static mw_status tokenizer_load_null(fx *f) { return mw_tokenizer_load(NULL, NULL); }
static mw_status tokenizer_load_missing(fx *f) {
    return mw_tokenizer_load(at(f, "none.json"), &f->tok);
}
static mw_status tokenizer_load_fifo(fx *f) { return mw_tokenizer_load(fifo(f), &f->tok); }
static mw_status tokenizer_load_empty_folder(fx *f) {
    return mw_tokenizer_load(folder(f), &f->tok);
}
static mw_status tokenizer_load_damaged(fx *f) {
    return mw_tokenizer_load(text_file(f, "t.json", "{\"model\":"), &f->tok);
}
static mw_status tokenizer_load_other_model(fx *f) {
    char *text = NULL;
    size_t n = 0;
    FILE *in = fopen(data(f, "tokenizer/tokenizer.json"), "rb");
    if (!in) return broken(f, "tokenizer.json");
    FILE *mem = open_memstream(&text, &n);
    for (int c; (c = fgetc(in)) != EOF;) fputc(c, mem);
    fclose(in);
    fclose(mem);
    char *type = strstr(text, "\"type\": \"BPE\"");
    if (!type) {
        free(text);
        return broken(f, "no BPE model in tokenizer.json");
    }
    memcpy(type, "\"type\": \"BPX\"", 13);
    const char *p = file_of(f, "other.json", text, n);
    free(text);
    return mw_tokenizer_load(p, &f->tok);
}
static mw_status tokenizer_free_null(fx *f) {
    mw_tokenizer_free(NULL);
    return holds(f, !*mw_last_error(), "a no-op");
}
static mw_status tokenizer_vocab_size_null(fx *f) {
    return holds(f, mw_tokenizer_vocab_size(NULL) == 0, "0 for NULL");
}
static mw_status tokenizer_file_past_the_last(fx *f) {
    return TOKENIZED(holds(f,
                           mw_tokenizer_file(f->tok, 0) && !mw_tokenizer_file(f->tok, 1) &&
                               !mw_tokenizer_file(f->tok, -1) && !mw_tokenizer_file(NULL, 0),
                           "NULL past the last and for NULL"));
}
static mw_status tokenizer_missing_byte_null(fx *f) {
    return holds(f,
                 mw_tokenizer_missing_byte(NULL) == -2 &&
                     strstr(mw_last_error(), "mw_tokenizer_missing_byte"),
                 "-2, with a message, for NULL");
}
static mw_status token_id_missing(fx *f) {
    int32_t id;
    NEED(tokenizer(f));
    return mw_tokenizer_token_id(f->tok, "no such token here", &id);
}
static mw_status token_id_null(fx *f) {
    return TOKENIZED(mw_tokenizer_token_id(f->tok, "a", NULL));
}
static mw_status is_special_out_of_range(fx *f) {
    return TOKENIZED(holds(f,
                           !mw_tokenizer_is_special(f->tok, -1) &&
                               !mw_tokenizer_is_special(NULL, 0) &&
                               !mw_tokenizer_is_special(f->tok, mw_tokenizer_vocab_size(f->tok)),
                           "0 for an id that is not a token, or NULL"));
}
static mw_status max_ids_null(fx *f) {
    return holds(f, mw_tokenizer_max_ids(NULL, 10) == 0, "0 for NULL");
}
static mw_status encode_small_buffer(fx *f) {
    int32_t ids[1];
    size_t n;
    NEED(tokenizer(f));
    mw_status st = mw_tokenizer_encode(f->tok, "hello world, again", 18, ids, 1, &n);
    return st == MW_ERR_SHAPE && n <= 1 ? broken(f, "*n is %zu, not the count needed", n) : st;
}
static mw_status encode_null_count(fx *f) {
    return TOKENIZED(mw_tokenizer_encode(f->tok, "a", 1, NULL, 0, NULL));
}
static mw_status encode_null_text(fx *f) {
    size_t n;
    NEED(tokenizer(f));
    return mw_tokenizer_encode(f->tok, NULL, 3, NULL, 0, &n);
}
static mw_status decode_bad_id(fx *f) {
    const int32_t ids[2] = {1, 1 << 30};
    char b[8];
    size_t n;
    NEED(tokenizer(f));
    return mw_tokenizer_decode(f->tok, ids, 2, b, sizeof b, &n);
}
static mw_status decode_small_buffer(fx *f) {
    int32_t ids[8];
    size_t n, len;
    char b[2];
    NEED(tokenizer(f));
    NEED(mw_tokenizer_encode(f->tok, "hello world", 11, ids, 8, &n));
    return mw_tokenizer_decode(f->tok, ids, n, b, sizeof b, &len);
}
static mw_status decode_null_len(fx *f) {
    const int32_t ids[1] = {1};
    NEED(tokenizer(f));
    return mw_tokenizer_decode(f->tok, ids, 1, NULL, 0, NULL);
}
static mw_status encode_with_unknown_flag(fx *f) {
    int32_t ids[4];
    size_t n;
    return TOKENIZED(mw_tokenizer_encode_with(f->tok, "a", 1, 4, ids, 4, &n));
}
static mw_status encode_with_bos_counted(fx *f) {
    int32_t ids[1];
    size_t n;
    if (mw_tokenizer_load(data(f, "tokenizer/llama3.json"), &f->tok)) return failed(f, "load");
    mw_status st = mw_tokenizer_encode_with(f->tok, "hello", 5, MW_ENCODE_ADD_SPECIAL, ids, 1, &n);
    return st == MW_ERR_SHAPE && n < 2 ? broken(f, "*n is %zu, without the BOS", n) : st;
}
static mw_status bos_id_none(fx *f) {
    int32_t id;
    return TOKENIZED(mw_tokenizer_bos_id(f->tok, &id));
}
static mw_status bos_id_null(fx *f) { return mw_tokenizer_bos_id(NULL, NULL); }
static mw_status eos_id_llama3(fx *f) {
    int32_t id = 0;
    if (mw_tokenizer_load(data(f, "tokenizer/llama3.json"), &f->tok)) return failed(f, "load");
    mw_status st = mw_tokenizer_eos_id(f->tok, &id);
    return st == MW_ERR_NOT_FOUND && id != -1 ? broken(f, "*id is %d, not -1", id) : st;
}
static mw_status eos_id_null(fx *f) { return mw_tokenizer_eos_id(NULL, NULL); }
static mw_status tokenizer_words_null(fx *f) {
    size_t n;
    (void)f;
    return (mw_status)mw_test_control(MW_TEST_TOKENIZER_WORDS, (mw_tokenizer *)NULL, "a", (size_t)1,
                                      (size_t *)NULL, (size_t)0, &n);
}
static mw_status unicode_version_16(fx *f) {
    return holds(f, !strcmp(mw_tokenizer_unicode_version(), "16.0.0"), "\"16.0.0\"");
}

/* === file.h =================================================================================== */

static mw_status input_open_null(fx *f) { return mw_input_open(NULL, "--data", 0, NULL, NULL); }
static mw_status input_open_empty(fx *f) {
    FILE *o;
    return mw_input_open("", "--data", 0, &o, NULL);
}
static mw_status input_open_with(fx *f, const char *path) {
    FILE *o = NULL;
    mw_status st = mw_input_open(path, "--data", 0, &o, NULL);
    if (o) fclose(o);
    return st == MW_OK ? broken(f, "%s opened", path) : st;
}
static mw_status input_open_missing(fx *f) { return input_open_with(f, at(f, "none")); }
static mw_status input_open_fifo(fx *f) { return input_open_with(f, fifo(f)); }
static mw_status input_open_folder(fx *f) { return input_open_with(f, folder(f)); }
static mw_status files_new_null(fx *f) { return mw_file_set_new(NULL); }
static mw_status files_free_null(fx *f) {
    mw_file_set_free(NULL);
    return holds(f, !*mw_last_error(), "a no-op");
}
static int files(fx *f) { return mw_file_set_new(&f->files) ? failed(f, "mw_file_set_new") : 0; }
static mw_status files_input_empty(fx *f) {
    return FILED(mw_file_set_add_input(f->files, "", "--data", 0));
}
static mw_status files_input_null(fx *f) { return mw_file_set_add_input(NULL, "x", "--data", 0); }
static mw_status files_input_missing(fx *f) {
    return FILED(mw_file_set_add_input(f->files, at(f, "none"), "--data", 0));
}
static mw_status files_input_fifo(fx *f) {
    return FILED(mw_file_set_add_input(f->files, fifo(f), "--data", 0));
}
static mw_status files_input_folder(fx *f) {
    return FILED(mw_file_set_add_input(f->files, folder(f), "--data", 0));
}
static mw_status files_input_an_output(fx *f) {
    NEED(files(f));
    const char *p = text_file(f, "d", "data");
    NEED(mw_file_set_add_output(f->files, p, "--save", 0, 0));
    return mw_file_set_add_input(f->files, p, "--data", 0);
}
static mw_status files_output_empty(fx *f) {
    return FILED(mw_file_set_add_output(f->files, "", "--save", 0, 0));
}
static mw_status files_output_an_input(fx *f) {
    NEED(files(f));
    const char *p = text_file(f, "d", "data");
    NEED(mw_file_set_add_input(f->files, p, "--data", 0));
    return mw_file_set_add_output(f->files, p, "--save", 0, 0);
}
static mw_status files_output_twice(fx *f) {
    NEED(files(f));
    const char *p = at(f, "out");
    NEED(mw_file_set_add_output(f->files, p, "--save", 0, 0));
    return mw_file_set_add_output(f->files, p, "--log", 0, 0);
}
static mw_status files_output_fifo(fx *f) {
    return FILED(mw_file_set_add_output(f->files, fifo(f), "--save", 0, 0));
}
static mw_status files_output_folder(fx *f) {
    return FILED(mw_file_set_add_output(f->files, folder(f), "--save", 0, 0));
}
static mw_status files_output_missing_folder(fx *f) {
    return FILED(mw_file_set_add_output(f->files, at(f, "no/such"), "--save", 0, 0));
}
static mw_status files_output_no_room(fx *f) {
    return FILED(mw_file_set_add_output(f->files, at(f, "big"), "--save", 0, INT64_MAX / 2));
}
static mw_status output_open_null(fx *f) { return mw_output_open(NULL, "--save", 0, NULL); }
static mw_status output_open_empty(fx *f) { return mw_output_open("", "--save", 0, &f->out); }
static mw_status output_open_folder(fx *f) {
    return mw_output_open(folder(f), "--save", 0, &f->out);
}
static mw_status output_open_missing_folder(fx *f) {
    return mw_output_open(at(f, "no/such"), "--save", 0, &f->out);
}
static mw_status output_write_null(fx *f) { return mw_output_write(NULL, "a", 1); }
static mw_status output_write_null_data(fx *f) {
    NEED(mw_output_open(at(f, "o"), "--save", 0, &f->out));
    return mw_output_write(f->out, NULL, 1);
}
static mw_status output_printf_null_format(fx *f) {
    NEED(mw_output_open(at(f, "o"), "--save", 0, &f->out));
    /* Through a pointer: the call is what a caller passing a NULL format does. */
    mw_status (*print)(mw_output *, const char *, ...) = mw_output_printf;
    return print(f->out, NULL);
}
static mw_status output_sync_null(fx *f) { return mw_output_sync(NULL); }
static mw_status output_commit_null(fx *f) { return mw_output_commit(NULL); }
static mw_status output_commit_not_replaced(fx *f) {
    const char *p = at(f, "o");
    NEED(mw_output_open(p, "--save", 0, &f->out));
    NEED(mw_output_write(f->out, "abc", 3));
    if (mkfifo(p, 0600) != 0) return broken(f, "mkfifo");
    mw_output *o = f->out;
    f->out = NULL; /* freed by the commit */
    return mw_output_commit(o);
}
static mw_status output_abandon_null(fx *f) {
    mw_output_abandon(NULL);
    return holds(f, !*mw_last_error(), "a no-op");
}

/* === the table ================================================================================ */

/* pipeline.h: the classifier (no regions, so no pipeline of two stages can be cut from it) on
 * cpu:2 as P=2, the pipeline along `axis`; out NULL with no_out. */
static mw_status pipeline_new_case(fx *f, const char *axis, int no_out) {
    mw_mesh *m = NULL;
    mw_pipeline *p = NULL;
    if (model(f)) return MW_ERR_STATE;
    if (mw_mesh_new("cpu:2", "P=2", &m)) {
        failed(f, "mw_mesh_new");
        return MW_ERR_STATE;
    }
    mw_pipeline_config c = {.trainer = sgd(), .axis = axis, .micro_batches = 2};
    if (axis && !strcmp(axis, "nested")) c.axis = c.trainer.pipeline_axis = "P";
    mw_status st = mw_pipeline_new(f->g, f->loss, m, &c, no_out ? NULL : &p);
    mw_pipeline_free(p);
    mw_mesh_free(m);
    return st;
}
static mw_status pipeline_out_null(fx *f) { return pipeline_new_case(f, "P", 1); }
static mw_status pipeline_no_regions(fx *f) { return pipeline_new_case(f, "P", 0); }
static mw_status pipeline_unknown_axis(fx *f) { return pipeline_new_case(f, "Q", 0); }
static mw_status pipeline_nested(fx *f) { return pipeline_new_case(f, "nested", 0); }
static mw_status pipeline_free_null(fx *f) {
    mw_pipeline_free(NULL);
    return holds(f, !*mw_last_error(), "a no-op");
}
static mw_status pipeline_step_null(fx *f) {
    (void)f;
    return mw_pipeline_step(NULL, NULL, 0, NULL);
}
static mw_status pipeline_read_param_null(fx *f) {
    (void)f;
    float x;
    return mw_pipeline_read_param(NULL, "w", &x, 1);
}
static mw_status pipeline_write_param_null(fx *f) {
    (void)f;
    float x = 0;
    return mw_pipeline_write_param(NULL, "w", &x, 1);
}
static mw_status pipeline_stages_null(fx *f) {
    return holds(f, mw_pipeline_stages(NULL) == 0, "0 for NULL");
}
static mw_status pipeline_stage_null(fx *f) {
    (void)f;
    mw_pipeline_stage_info i;
    return mw_pipeline_stage(NULL, 0, &i);
}
static mw_status pipeline_idle_null(fx *f) {
    return holds(f, mw_pipeline_idle(NULL, 0) == -1.0, "-1 for NULL");
}

typedef struct row {
    const char *fn;           /* the public function */
    void (*fn_address)(void); /* the same, so that a misspelt name does not compile */
    const char *what;         /* the case: its call's name */
    mw_status (*call)(fx *f);
    mw_status want;   /* the status its header promises (MW_OK: a value it promises) */
    const char *says; /* a substring of the message, or NULL */
} row;

#define R(fn, call, want, says)                                                                    \
    { #fn, (void (*)(void))fn, #call, call, want, says }

static const row table[] = {
    /* meshwit.h, status.h, testing.h */
    R(mw_version, version_is_the_macros, MW_OK, NULL),
    R(mw_strerror, strerror_unknown, MW_OK, NULL),
    R(mw_status_name, status_name_never_null, MW_OK, NULL),
    R(mw_last_error, last_error_per_thread, MW_OK, NULL),
    R(mw_test_control, allocation_fails, MW_ERR_NOMEM, "out of memory"),
    R(mw_test_control, allocations_counted, MW_OK, NULL),
    /* mesh.h */
    R(mw_mesh_new, mesh_out_null, MW_ERR_INVALID, "out"),
    R(mw_mesh_new, mesh_spec_null, MW_ERR_INVALID, "device spec"),
    R(mw_mesh_new, mesh_spec_malformed, MW_ERR_DEVICE, "'gpu:1'"),
    R(mw_mesh_new, mesh_cpu_0, MW_ERR_DEVICE, "'cpu:0'"),
    R(mw_mesh_new, mesh_cpu_many, MW_ERR_DEVICE, "cpu:1000"),
    R(mw_mesh_new, mesh_no_such_gpu, MW_ERR_DEVICE, NULL),
    R(mw_mesh_new, mesh_axes_product, MW_ERR_INVALID, "'X=3'"),
    R(mw_mesh_new, mesh_axes_name, MW_ERR_INVALID, "'X-1'"),
    R(mw_mesh_new, mesh_axes_twice, MW_ERR_INVALID, "twice"),
    R(mw_mesh_new, mesh_axes_size, MW_ERR_INVALID, "positive"),
    R(mw_mesh_new_local, mesh_local_spec, MW_ERR_DEVICE, "'cpu:x'"),
    R(mw_mesh_new_local, mesh_local_out_null, MW_ERR_INVALID, NULL),
    R(mw_mesh_processes, mesh_processes_null, MW_OK, NULL),
    R(mw_mesh_local_devices, mesh_local_devices_null, MW_OK, NULL),
    R(mw_mesh_free, mesh_free_null, MW_OK, NULL),
    R(mw_mesh_size, mesh_size_null, MW_OK, NULL),
    R(mw_mesh_describe, mesh_describe_null, MW_OK, NULL),
    R(mw_backend_describe, backend_describe_cpu, MW_OK, NULL),
    R(mw_backend_describe, backend_describe_unknown, MW_OK, NULL),
    R(mw_backend_warning, backend_warning_a_string, MW_OK, NULL),
    R(mw_cuda_device_count, cuda_count_never_negative, MW_OK, NULL),
    /* graph.h */
    R(mw_graph_new, graph_new_out_null, MW_ERR_INVALID, "out"),
    R(mw_graph_new, allocation_fails, MW_ERR_NOMEM, NULL),
    R(mw_graph_free, graph_free_null, MW_OK, NULL),
    R(mw_graph_status, graph_status_null, MW_OK, NULL),
    R(mw_graph_status, graph_status_first_error, MW_OK, NULL),
    R(mw_graph_error, graph_error_null, MW_OK, NULL),
    R(mw_graph_error, graph_error_first_message, MW_OK, NULL),
    R(mw_graph_set_seed, graph_set_seed_null, MW_OK, NULL),
    R(mw_region_begin, region_begin_null_graph, MW_ERR_INVALID, NULL),
    R(mw_region_begin, region_begin_null_name, MW_ERR_INVALID, "name"),
    R(mw_region_begin, region_begin_empty_name, MW_ERR_INVALID, "name"),
    R(mw_region_begin, region_begin_long_name, MW_ERR_INVALID, "longer than"),
    R(mw_region_begin, region_begin_nested, MW_ERR_INVALID, "\"outer\""),
    R(mw_region_begin, region_begin_after_error, MW_ERR_SHAPE, "mw_add"),
    R(mw_region_end, region_end_null, MW_ERR_INVALID, NULL),
    R(mw_region_end, region_end_none_open, MW_ERR_INVALID, "no region is open"),
    R(mw_region_end, region_end_after_error, MW_ERR_AXIS, "'Nope'"),
    R(mw_input, input_null_graph, MW_OK, NULL),
    R(mw_input, input_empty_name, MW_ERR_INVALID, "name"),
    R(mw_input, input_null_name, MW_ERR_INVALID, "the name is NULL"),
    R(mw_input, input_long_name, MW_ERR_INVALID, "longer than"),
    R(mw_input, input_name_taken, MW_ERR_INVALID, "'p' is already used by a parameter"),
    R(mw_input, input_bf16, MW_ERR_DTYPE, "bf16"),
    R(mw_input, input_rank_9, MW_ERR_SHAPE, "rank 9"),
    R(mw_input, input_size_0, MW_ERR_SHAPE, "axis A"),
    R(mw_input, input_axis_twice, MW_ERR_SHAPE, "axis A appears twice"),
    R(mw_input, input_axis_name, MW_ERR_INVALID, "'@'"),
    R(mw_full, full_size_negative, MW_ERR_SHAPE, "axis A"),
    R(mw_full, full_null_graph, MW_OK, NULL),
    R(mw_param, param_name_taken, MW_ERR_INVALID, "'a' is already used by an input"),
    R(mw_param, param_unknown_init, MW_ERR_INVALID, "initialiser"),
    R(mw_param, param_axis_twice, MW_ERR_SHAPE, "twice"),
    R(mw_shard, shard_null, MW_ERR_INVALID, NULL),
    R(mw_shard, shard_other_graph, MW_ERR_INVALID, "another graph"),
    R(mw_shard, shard_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_shard, shard_twice, MW_ERR_SHARDING, "already sharded"),
    R(mw_shard, shard_same_mesh_axis, MW_ERR_SHARDING, "mesh axis X"),
    R(mw_shard, shard_computed, MW_ERR_SHARDING, "computed"),
    R(mw_shard, shard_used_param, MW_ERR_SHARDING, "'p'"),
    R(mw_shard, shard_bad_mesh_axis, MW_ERR_INVALID, "mesh axis"),
    R(mw_add, add_null, MW_ERR_INVALID, "mw_add"),
    R(mw_add, add_other_graph, MW_ERR_INVALID, "another graph"),
    R(mw_add, add_sizes, MW_ERR_SHAPE, "Feature"),
    R(mw_add, add_no_subset, MW_ERR_SHAPE, "subset"),
    R(mw_add, add_sharding, MW_ERR_SHARDING, "mw_shard"),
    R(mw_add, add_dtype, MW_ERR_DTYPE, "i32"),
    R(mw_sub, sub_no_subset, MW_ERR_SHAPE, "mw_sub"),
    R(mw_sub, sub_sharding, MW_ERR_SHARDING, "Batch@X"),
    R(mw_mul, mul_no_subset, MW_ERR_SHAPE, "mw_mul"),
    R(mw_mul, mul_null, MW_ERR_INVALID, "mw_mul"),
    R(mw_div, div_no_subset, MW_ERR_SHAPE, "mw_div"),
    R(mw_div, div_dtype, MW_ERR_DTYPE, "bf16"),
    R(mw_scale, scale_null, MW_ERR_INVALID, "mw_scale"),
    R(mw_scale, scale_dtype, MW_ERR_DTYPE, "i32"),
    R(mw_cast, cast_i32, MW_ERR_DTYPE, "i32"),
    R(mw_cast, cast_to_i32, MW_ERR_DTYPE, "i32"),
    R(mw_cast, cast_null, MW_ERR_INVALID, "mw_cast"),
    R(mw_cast, cast_other_graph, MW_ERR_INVALID, "another graph"),
    R(mw_dot, dot_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_dot, dot_axis_in_a_only, MW_ERR_AXIS, "'Batch'"),
    R(mw_dot, dot_null_axis, MW_ERR_INVALID, "mw_dot"),
    R(mw_dot, dot_sizes, MW_ERR_SHAPE, "Feature"),
    R(mw_dot, dot_sharding, MW_ERR_SHARDING, "Batch@X"),
    R(mw_dot, dot_dtype, MW_ERR_DTYPE, "bf16"),
    R(mw_dot, dot_null, MW_ERR_INVALID, "mw_dot"),
    R(mw_contract, contract_result_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_contract, contract_named_twice, MW_ERR_AXIS, "twice"),
    R(mw_contract, contract_uncontractable, MW_ERR_AXIS, "Batch"),
    R(mw_contract, contract_sizes, MW_ERR_SHAPE, "Feature"),
    R(mw_contract, contract_sharding, MW_ERR_SHARDING, "Batch@X"),
    R(mw_contract, contract_null_axes, MW_ERR_INVALID, "mw_contract"),
    R(mw_sum, sum_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_sum, sum_malformed, MW_ERR_AXIS, "'Batch,,'"),
    R(mw_sum, sum_null, MW_ERR_INVALID, "mw_sum"),
    R(mw_sum, sum_dtype, MW_ERR_DTYPE, "i32"),
    R(mw_mean, mean_no_axis, MW_ERR_AXIS, "'Class'"),
    R(mw_rename, rename_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_rename, rename_taken, MW_ERR_AXIS, "'Feature'"),
    R(mw_rename, rename_sharded, MW_ERR_SHARDING, "Batch"),
    R(mw_rename, rename_bad_name, MW_ERR_INVALID, "'B@X'"),
    R(mw_rename, rename_null_axis, MW_ERR_INVALID, "mw_rename"),
    R(mw_permute, permute_unknown, MW_ERR_AXIS, "'Nope'"),
    R(mw_permute, permute_twice, MW_ERR_AXIS, "twice"),
    R(mw_permute, permute_left_out, MW_ERR_AXIS, "every axis"),
    R(mw_permute, permute_null_order, MW_ERR_INVALID, "order"),
    R(mw_split, split_product, MW_ERR_SHAPE, "'H=3,D=2'"),
    R(mw_split, split_indivisible, MW_ERR_SHAPE, "divisible"),
    R(mw_split, split_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_split, split_sharded, MW_ERR_SHARDING, "Batch"),
    R(mw_split, split_bad_size, MW_ERR_INVALID, "'H=x,D'"),
    R(mw_split, split_two_unsized, MW_ERR_INVALID, "one size"),
    R(mw_split, split_no_new_axes, MW_ERR_INVALID, "mw_split"),
    R(mw_split, split_name_taken, MW_ERR_AXIS, "'Feature'"),
    R(mw_merge, merge_not_adjacent, MW_ERR_SHAPE, "adjacent"),
    R(mw_merge, merge_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_merge, merge_sharded, MW_ERR_SHARDING, "Batch"),
    R(mw_merge, merge_no_axes, MW_ERR_INVALID, "mw_merge"),
    R(mw_merge, merge_bad_name, MW_ERR_INVALID, "mw_merge"),
    R(mw_slice, slice_length_0, MW_ERR_SHAPE, "length 0"),
    R(mw_slice, slice_outside, MW_ERR_SHAPE, "[3, 5)"),
    R(mw_slice, slice_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_slice, slice_sharded, MW_ERR_SHARDING, "Batch"),
    R(mw_slice, slice_name_taken, MW_ERR_AXIS, "'Feature'"),
    R(mw_select, select_outside, MW_ERR_SHAPE, "[4, 5)"),
    R(mw_select, select_negative, MW_ERR_SHAPE, "Batch"),
    R(mw_select, select_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_gelu, gelu_dtype, MW_ERR_DTYPE, "i32"),
    R(mw_gelu, gelu_null, MW_ERR_INVALID, "mw_gelu"),
    R(mw_gelu_erf, gelu_erf_dtype, MW_ERR_DTYPE, "bf16"),
    R(mw_layernorm, layernorm_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_layernorm, layernorm_not_last, MW_ERR_SHAPE, "last axis"),
    R(mw_layernorm, layernorm_weight_axes, MW_ERR_SHAPE, "Feature=2"),
    R(mw_layernorm, layernorm_sharded, MW_ERR_SHARDING, "Batch"),
    R(mw_layernorm, layernorm_dtype, MW_ERR_DTYPE, "bf16"),
    R(mw_layernorm, layernorm_null, MW_ERR_INVALID, "mw_layernorm"),
    R(mw_layernorm, layernorm_bias_dtype, MW_ERR_DTYPE, "b"),
    R(mw_layernorm, layernorm_infinite_eps, MW_ERR_INVALID, "eps inf"),
    R(mw_silu, silu_dtype, MW_ERR_DTYPE, "mw_silu"),
    R(mw_silu, silu_null, MW_ERR_INVALID, "mw_silu"),
    R(mw_swiglu, swiglu_size, MW_ERR_SHAPE, "size 2"),
    R(mw_swiglu, swiglu_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_swiglu, swiglu_dtype, MW_ERR_DTYPE, "bf16"),
    R(mw_swiglu, swiglu_sharded, MW_ERR_SHARDING, "Part"),
    R(mw_rope, rope_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_rope, rope_not_last, MW_ERR_SHAPE, "last axis"),
    R(mw_rope, rope_odd, MW_ERR_SHAPE, "even"),
    R(mw_rope, rope_dims, MW_ERR_SHAPE, "6 rotated"),
    R(mw_rope, rope_theta, MW_ERR_INVALID, "theta"),
    R(mw_rope, rope_style, MW_ERR_INVALID, "style"),
    R(mw_rope, rope_scaling, MW_ERR_INVALID, "llama3"),
    R(mw_rope, rope_offset, MW_ERR_INVALID, "offset"),
    R(mw_rope, rope_pos_dtype, MW_ERR_DTYPE, "i32"),
    R(mw_rope, rope_pos_axes, MW_ERR_SHAPE, "leading axes"),
    R(mw_rope, rope_sharded, MW_ERR_SHARDING, "Seq"),
    R(mw_rope, rope_dtype, MW_ERR_DTYPE, "bf16"),
    R(mw_rope, rope_null, MW_ERR_INVALID, "mw_rope"),
    R(mw_rope, rope_part_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_rope, rope_parts, MW_ERR_INVALID, "5 parts"),

    R(mw_attention_grouped, grouped_null_group, MW_ERR_INVALID, "group_axis"),
    R(mw_attention_grouped, grouped_parts, MW_ERR_SHAPE, "G + 2"),
    R(mw_attention_grouped, grouped_existing, MW_ERR_AXIS, "'Seq'"),
    R(mw_attention_grouped, grouped_part_split, MW_ERR_SHARDING, "key/value head axis instead"),
    R(mw_rmsnorm, rmsnorm_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_rmsnorm, rmsnorm_not_last, MW_ERR_SHAPE, "last axis"),
    R(mw_rmsnorm, rmsnorm_weight_axes, MW_ERR_SHAPE, "Feature=2"),
    R(mw_rmsnorm, rmsnorm_sharded, MW_ERR_SHARDING, "Batch"),
    R(mw_rmsnorm, rmsnorm_dtype, MW_ERR_DTYPE, "bf16"),
    R(mw_rmsnorm, rmsnorm_null, MW_ERR_INVALID, "mw_rmsnorm"),
    R(mw_rmsnorm, rmsnorm_negative_eps, MW_ERR_INVALID, "eps -1e-05"),
    R(mw_rmsnorm, rmsnorm_nan_eps, MW_ERR_INVALID, "eps nan"),
    R(mw_softmax, softmax_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_softmax, softmax_not_last, MW_ERR_SHAPE, "last axis"),
    R(mw_softmax, softmax_sharded, MW_ERR_SHARDING, "Batch"),
    R(mw_softmax, softmax_dtype, MW_ERR_DTYPE, "bf16"),
    R(mw_attention, attention_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_attention, attention_part_size, MW_ERR_SHAPE, "size 3"),
    R(mw_attention, attention_feature_not_last, MW_ERR_SHAPE, "last axis"),
    R(mw_attention, attention_same_axes, MW_ERR_AXIS, "three different"),
    R(mw_attention, attention_dtype, MW_ERR_DTYPE, "i32"),
    R(mw_attention, attention_sharded, MW_ERR_SHARDING, "Seq"),
    R(mw_causal_softmax, causal_not_before, MW_ERR_SHAPE, "right before"),
    R(mw_causal_softmax, causal_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_causal_softmax, causal_sharded, MW_ERR_SHARDING, "Q"),
    R(mw_causal_softmax, causal_dtype, MW_ERR_DTYPE, "bf16"),
    R(mw_embedding, embedding_table_dtype, MW_ERR_DTYPE, "table"),
    R(mw_embedding, embedding_ids_dtype, MW_ERR_DTYPE, "ids"),
    R(mw_embedding, embedding_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_embedding, embedding_vocab_not_first, MW_ERR_SHAPE, "vocabulary axis first"),
    R(mw_embedding, embedding_ids_have_dim, MW_ERR_SHAPE, "Dim"),
    R(mw_embedding, embedding_computed_split, MW_ERR_SHARDING, "Dim"),
    R(mw_embedding, embedding_id_outside, MW_ERR_INVALID, "id 7 at [1]"),
    R(mw_cross_entropy, xent_targets_dtype, MW_ERR_DTYPE, "targets"),
    R(mw_cross_entropy, xent_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_cross_entropy, xent_valid, MW_ERR_SHAPE, "3 valid classes"),
    R(mw_cross_entropy, xent_targets_axes, MW_ERR_SHAPE, "Batch=3"),
    R(mw_cross_entropy, xent_sharding, MW_ERR_SHARDING, "mw_shard"),
    R(mw_cross_entropy, xent_not_last, MW_ERR_SHAPE, "last axis"),
    R(mw_cross_entropy, step_label_out_of_range, MW_ERR_INVALID, "target 5 at [6]"),
    R(mw_relu, relu_dtype, MW_ERR_DTYPE, "mw_relu"),
    R(mw_relu, relu_null, MW_ERR_INVALID, "mw_relu"),
    R(mw_relu, relu_other_graph, MW_ERR_INVALID, "another graph"),
    R(mw_tanh, tanh_dtype, MW_ERR_DTYPE, "mw_tanh"),
    R(mw_sigmoid, sigmoid_dtype, MW_ERR_DTYPE, "mw_sigmoid"),
    R(mw_exp, exp_dtype, MW_ERR_DTYPE, "mw_exp"),
    R(mw_log, log_dtype, MW_ERR_DTYPE, "mw_log"),
    R(mw_sqrt, sqrt_dtype, MW_ERR_DTYPE, "mw_sqrt"),
    R(mw_abs, abs_dtype, MW_ERR_DTYPE, "mw_abs"),
    R(mw_compare, compare_unknown, MW_ERR_INVALID, "17"),
    R(mw_compare, compare_no_subset, MW_ERR_SHAPE, "mw_compare: mw_sub: axes"),
    R(mw_compare, compare_dtype, MW_ERR_DTYPE, "mw_compare: mw_sub: a i32"),
    R(mw_where, where_no_subset, MW_ERR_SHAPE, "mw_where: mw_sub: axes"),
    R(mw_where, where_null_mask, MW_ERR_INVALID, "mw_where: mw_mul: operand is NULL"),
    R(mw_maximum, maximum_no_subset, MW_ERR_SHAPE, "mw_maximum: mw_sub: axes"),
    R(mw_maximum, maximum_sharding, MW_ERR_SHARDING, "mw_maximum: mw_sub: axis Batch"),
    R(mw_minimum, minimum_dtype, MW_ERR_DTYPE, "mw_minimum: mw_sub: b bf16"),
    R(mw_max, max_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_max, max_sharded, MW_ERR_SHARDING, "Batch"),
    R(mw_max, max_dtype, MW_ERR_DTYPE, "bf16"),
    R(mw_argmax, argmax_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_argmax, argmax_sharded, MW_ERR_SHARDING, "Batch"),
    R(mw_argmax, argmax_null_axis, MW_ERR_INVALID, "mw_argmax"),
    R(mw_concat, concat_none, MW_ERR_INVALID, "mw_concat"),
    R(mw_concat, concat_null_array, MW_ERR_INVALID, "mw_concat"),
    R(mw_concat, concat_null_tensor, MW_ERR_INVALID, "mw_concat"),
    R(mw_concat, concat_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_concat, concat_other_axes, MW_ERR_SHAPE, "tensor 1"),
    R(mw_concat, concat_sharded, MW_ERR_SHARDING, "Batch"),
    R(mw_dropout, dropout_p_1, MW_ERR_INVALID, "[0, 1)"),
    R(mw_dropout, dropout_p_negative, MW_ERR_INVALID, "[0, 1)"),
    R(mw_dropout, dropout_p_nan, MW_ERR_INVALID, "[0, 1)"),
    R(mw_dropout, dropout_dtype, MW_ERR_DTYPE, "i32"),
    R(mw_state, state_name_taken, MW_ERR_INVALID, "'a'"),
    R(mw_state, state_size_0, MW_ERR_SHAPE, "axis A"),
    R(mw_state_write, state_write_not_a_state, MW_ERR_INVALID, "not a state"),
    R(mw_state_write, state_write_not_latest, MW_ERR_INVALID, "'s' was written already"),
    R(mw_state_write, state_write_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_state_write, state_write_index_axes, MW_ERR_SHAPE, "Batch=3"),
    R(mw_state_write, state_write_index_dtype, MW_ERR_DTYPE, "index"),
    R(mw_state_write, state_write_value_axes, MW_ERR_SHAPE, "F=4"),
    R(mw_state_write, state_write_sharded, MW_ERR_SHARDING, "Ctx"),
    R(mw_state_write, state_write_null_index, MW_ERR_INVALID, "index"),
    R(mw_state_write, state_write_position_outside, MW_ERR_INVALID, "position 9"),
    R(mw_attention_cached, cached_no_axis, MW_ERR_AXIS, "'Nope'"),
    R(mw_attention_cached, cached_layout, MW_ERR_SHAPE, "Part=2"),
    R(mw_attention_cached, cached_pos_axes, MW_ERR_SHAPE, "Batch=3"),
    R(mw_attention_cached, cached_pos_dtype, MW_ERR_DTYPE, "pos"),
    R(mw_attention_cached, cached_q_axes, MW_ERR_SHAPE, "D=4"),
    R(mw_attention_cached, cached_sharded, MW_ERR_SHARDING, "Ctx"),
    R(mw_attention_cached, cached_null_pos, MW_ERR_INVALID, "pos"),
    R(mw_attention_cached, cached_position_outside, MW_ERR_INVALID, "position 6"),
    R(mw_tensor_rank, tensor_rank_null, MW_OK, NULL),
    R(mw_tensor_dtype, tensor_dtype_null, MW_OK, NULL),
    R(mw_tensor_axis, tensor_axis_out_of_range, MW_ERR_INVALID, "2"),
    R(mw_tensor_axis, tensor_axis_null, MW_ERR_INVALID, NULL),
    R(mw_tensor_numel, tensor_numel_null, MW_OK, NULL),
    R(mw_tensor_describe, tensor_describe_null, MW_OK, NULL),
    /* trainer.h */
    R(mw_optimizer_defaults, optimizer_defaults_are_pytorchs, MW_OK, NULL),
    R(mw_optimizer_defaults, optimizer_defaults_unknown_kind, MW_ERR_INVALID, "optimizer.kind"),
    R(mw_trainer_new, trainer_new_out_null, MW_ERR_INVALID, "out"),
    R(mw_trainer_new, trainer_new_null_graph, MW_ERR_INVALID, "graph"),
    R(mw_trainer_new, trainer_new_null_mesh, MW_ERR_INVALID, "mesh"),
    R(mw_trainer_new, trainer_new_null_loss, MW_ERR_INVALID, "loss"),
    R(mw_trainer_new, trainer_new_loss_of_another_graph, MW_ERR_INVALID, "another graph"),
    R(mw_trainer_new, trainer_new_tracing_error, MW_ERR_AXIS, "'Nope'"),
    R(mw_trainer_new, trainer_new_loss_not_scalar, MW_ERR_SHAPE, "scalar"),
    R(mw_trainer_new, trainer_new_states, MW_ERR_UNSUPPORTED, "states"),
    R(mw_trainer_new, trainer_new_mesh_axis_missing, MW_ERR_SHARDING, "'X'"),
    R(mw_trainer_new, trainer_new_rows_per_device, MW_ERR_SHARDING, "at least one row"),
    R(mw_trainer_new, trainer_new_lr, MW_ERR_INVALID, "optimizer.lr"),
    R(mw_trainer_new, trainer_new_eps, MW_ERR_INVALID, "optimizer.eps"),
    R(mw_trainer_new, trainer_new_nesterov, MW_ERR_INVALID, "optimizer.nesterov"),
    R(mw_trainer_new, trainer_new_nonfinite, MW_ERR_INVALID, "nonfinite"),
    R(mw_trainer_new, trainer_new_recompute, MW_ERR_INVALID, "recompute"),
    R(mw_trainer_new, trainer_new_precision, MW_ERR_INVALID, "precision"),
    R(mw_trainer_new, trainer_new_cpu_threads, MW_ERR_INVALID, "cpu_threads"),
    R(mw_trainer_new, trainer_new_pin_threads, MW_ERR_INVALID, "pin_threads is -1"),
    R(mw_trainer_new, trainer_new_blas_threads, MW_ERR_INVALID, "blas_threads is -2"),
    R(mw_trainer_new, trainer_new_timeout, MW_ERR_INVALID, "collective_timeout_ms is -1"),
    R(mw_trainer_new, trainer_new_gathers, MW_ERR_INVALID, "gathers is 2"),
    R(mw_trainer_new, trainer_new_check_replicas, MW_ERR_INVALID, "check_replicas_every is -1"),
    R(mw_trainer_new, trainer_new_region_open, MW_ERR_INVALID, "\"block\""),
    R(mw_trainer_new, trainer_new_null_output, MW_ERR_INVALID, "output 0"),
    R(mw_trainer_new, trainer_new_output_of_another_graph, MW_ERR_INVALID, "output 0"),
    R(mw_trainer_new, trainer_new_out_of_memory, MW_ERR_NOMEM, "out of memory"),
    R(mw_trainer_free, trainer_free_null, MW_OK, NULL),
    R(mw_trainer_step, step_null_trainer, MW_ERR_INVALID, "NULL"),
    R(mw_trainer_step, step_missing_feed, MW_ERR_INVALID, "'y' is not fed"),
    R(mw_trainer_step, step_unknown_feed, MW_ERR_INVALID, "'labels'"),
    R(mw_trainer_step, step_wrong_size, MW_ERR_INVALID, "'x' has 15 elements"),
    R(mw_trainer_step, step_feed_twice, MW_ERR_INVALID, "'x' is given twice"),
    R(mw_trainer_step, step_null_data, MW_ERR_INVALID, "'x'"),
    R(mw_trainer_step, step_negative_count, MW_ERR_INVALID, "-1"),
    R(mw_trainer_step, step_label_out_of_range, MW_ERR_INVALID, "target 5 at [6]"),
    R(mw_trainer_step, step_nonfinite, MW_ERR_NONFINITE, "step 0"),
    R(mw_trainer_accumulate, accumulate_without_option, MW_ERR_STATE, "grad_accumulation"),
    R(mw_trainer_accumulate, accumulate_missing_feed, MW_ERR_INVALID, "'y' is not fed"),
    R(mw_trainer_accumulate, accumulate_null, MW_ERR_INVALID, NULL),
    R(mw_trainer_compute_grads, compute_grads_unknown_feed, MW_ERR_INVALID, "'inputs'"),
    R(mw_trainer_compute_grads, compute_grads_null, MW_ERR_INVALID, NULL),
    R(mw_trainer_eval, eval_wrong_size, MW_ERR_INVALID, "'y' has 3 elements"),
    R(mw_trainer_eval, eval_not_interrupted, MW_OK, NULL),
    R(mw_trainer_read_param, read_param_unknown, MW_ERR_NOT_FOUND, "'nope'"),
    R(mw_trainer_read_param, read_param_count, MW_ERR_SHAPE, "'w' has 6 elements, not 5"),
    R(mw_trainer_read_param, read_param_null_name, MW_ERR_INVALID, NULL),
    R(mw_trainer_read_param, read_param_null_dst, MW_ERR_INVALID, NULL),
    R(mw_trainer_read_param, read_param_null_trainer, MW_ERR_INVALID, NULL),
    R(mw_trainer_write_param, write_param_unknown, MW_ERR_NOT_FOUND, "'nope'"),
    R(mw_trainer_write_param, write_param_count, MW_ERR_SHAPE, "not 7"),
    R(mw_trainer_write_param, write_param_null_src, MW_ERR_INVALID, NULL),
    R(mw_trainer_read_grad, read_grad_before_a_step, MW_ERR_STATE, "no step"),
    R(mw_trainer_read_grad, read_grad_after_eval_only, MW_ERR_STATE, "no step"),
    R(mw_trainer_read_grad, read_grad_unknown, MW_ERR_NOT_FOUND, "'nope'"),
    R(mw_trainer_read_grad, read_grad_count, MW_ERR_SHAPE, "not 60"),
    R(mw_trainer_read_grad, read_grad_null_dst, MW_ERR_INVALID, NULL),
    R(mw_trainer_read_output, read_output_not_configured, MW_ERR_NOT_FOUND, "outputs"),
    R(mw_trainer_read_output, read_output_before_a_step, MW_ERR_STATE, "no step"),
    R(mw_trainer_read_output, read_output_count, MW_ERR_SHAPE, "24 elements, not 8"),
    R(mw_trainer_read_output, read_output_null, MW_ERR_INVALID, NULL),
    R(mw_trainer_save, save_null_path, MW_ERR_INVALID, NULL),
    R(mw_trainer_save, save_null_user, MW_ERR_INVALID, NULL),
    R(mw_trainer_save, save_missing_folder, MW_ERR_IO, "no/such/ck"),
    R(mw_trainer_save, save_over_a_folder, MW_ERR_IO, "a directory"),
    R(mw_trainer_save, save_over_a_fifo, MW_ERR_IO, "a FIFO"),
    R(mw_trainer_load, load_null_path, MW_ERR_INVALID, NULL),
    R(mw_trainer_load, load_missing, MW_ERR_IO, "none"),
    R(mw_trainer_load, load_folder, MW_ERR_IO, "a directory"),
    R(mw_trainer_load, load_fifo, MW_ERR_IO, "a FIFO"),
    R(mw_trainer_load, load_not_a_checkpoint, MW_ERR_FORMAT, "/t"),
    R(mw_trainer_load, load_truncated, MW_ERR_FORMAT, "truncated"),
    R(mw_trainer_load, load_capacity, MW_ERR_FORMAT, "8 bytes of caller state"),
    R(mw_trainer_load, load_another_optimizer, MW_ERR_FORMAT, "another optimizer"),
    R(mw_checkpoint_info, checkpoint_info_null_path, MW_ERR_INVALID, NULL),
    R(mw_checkpoint_info, checkpoint_info_null_user, MW_ERR_INVALID, NULL),
    R(mw_checkpoint_info, checkpoint_info_missing, MW_ERR_IO, "none"),
    R(mw_checkpoint_info, checkpoint_info_fifo, MW_ERR_IO, "a FIFO"),
    R(mw_checkpoint_info, checkpoint_info_garbage, MW_ERR_FORMAT, "not a meshwit checkpoint"),
    R(mw_checkpoint_info, checkpoint_info_capacity, MW_ERR_FORMAT, "8 bytes of caller state"),
    R(mw_trainer_stats, stats_null, MW_ERR_INVALID, NULL),
    R(mw_trainer_memory, memory_device, MW_ERR_INVALID, "device 1"),
    R(mw_trainer_memory, memory_null, MW_ERR_INVALID, NULL),
    R(mw_trainer_kernels, kernels_size_0, MW_ERR_INVALID, "size 0"),
    R(mw_trainer_kernels, kernels_null, MW_ERR_INVALID, NULL),
    R(mw_trainer_profile, profile_not_enabled, MW_ERR_STATE, "profile"),
    R(mw_trainer_profile, profile_null_count, MW_ERR_INVALID, NULL),
    R(mw_trainer_profile_reset, profile_reset_null, MW_OK, NULL),
    R(mw_phase_name, phase_name_unknown, MW_OK, NULL),
    R(mw_test_control, inject_fault_fails_the_step, MW_ERR_DEVICE, "injected fault"),
    R(mw_test_control, inject_fault_device, MW_ERR_INVALID, "device 1 is not in [0, 1)"),
    R(mw_test_control, inject_fault_ok, MW_ERR_INVALID, "MW_OK"),
    R(mw_test_control, inject_fault_phase, MW_ERR_INVALID, "phase 9"),
    R(mw_test_control, inject_stall_times_out, MW_ERR_TIMEOUT, "timed out after 50 ms"),
    R(mw_test_control, inject_stall_time, MW_ERR_INVALID, "ms is 0"),
    R(mw_test_control, inject_stall_device, MW_ERR_INVALID, "device -1"),
    R(mw_test_control, test_control_unknown_op, MW_ERR_INVALID, "op 99 is not an mw_test_op"),
    R(mw_trainer_steps, steps_null, MW_OK, NULL),
    R(mw_trainer_skipped_steps, skipped_steps_null, MW_OK, NULL),
    R(mw_trainer_check_replicas, check_replicas_differ, MW_ERR_STATE, "'w'"),
    R(mw_trainer_check_replicas, check_replicas_null, MW_ERR_INVALID, NULL),
    R(mw_request_stop, request_stop_interrupts, MW_ERR_INTERRUPTED, "stop was requested"),
    R(mw_request_stop, request_stop_stays, MW_OK, NULL),
    R(mw_trainer_request_stop, trainer_request_stop_once, MW_ERR_INTERRUPTED, NULL),
    R(mw_stop_requested, stop_requested_while_set, MW_OK, NULL),
    R(mw_cancel_stop, cancel_stop_steps_again, MW_OK, NULL),
    R(mw_trainer_lr, lr_null, MW_OK, NULL),
    R(mw_trainer_set_lr, set_lr_null, MW_ERR_INVALID, NULL),
    R(mw_trainer_set_lr, set_lr_negative, MW_ERR_INVALID, "-0.5"),
    R(mw_trainer_set_lr, set_lr_nan, MW_ERR_INVALID, "nan"),
    R(mw_trainer_set_lr, set_lr_infinite, MW_ERR_INVALID, "inf"),
    R(mw_trainer_grad_norm, grad_norm_before_a_step, MW_OK, NULL),
    R(mw_trainer_devices, devices_null, MW_OK, NULL),
    R(mw_trainer_local_size, local_size_unknown, MW_OK, NULL),
    /* infer.h */
    R(mw_infer_new, infer_new_out_null, MW_ERR_INVALID, "out"),
    R(mw_infer_new, infer_new_no_outputs, MW_ERR_INVALID, "output"),
    R(mw_infer_new, infer_new_config_null, MW_ERR_INVALID, NULL),
    R(mw_infer_new, infer_new_output_of_another_graph, MW_ERR_INVALID, "output 0"),
    R(mw_infer_new, infer_new_chunk_axis_not_first, MW_ERR_AXIS, "'Batch'"),
    R(mw_infer_new, infer_new_mixes_rows, MW_ERR_SHAPE, "output 0"),
    R(mw_infer_new, infer_new_mesh_axis_missing, MW_ERR_SHARDING, "'X'"),
    R(mw_infer_new, infer_new_precision, MW_ERR_INVALID, "precision"),
    R(mw_infer_new, infer_new_blas_threads, MW_ERR_INVALID, "mw_infer_new: blas_threads is -3"),
    R(mw_infer_new, infer_new_tracing_error, MW_ERR_AXIS, "'Nope'"),
    R(mw_infer_from_trainer, from_trainer_null, MW_ERR_INVALID, "trainer"),
    R(mw_infer_from_trainer, from_trainer_unknown_param, MW_ERR_NOT_FOUND, "'v'"),
    R(mw_infer_from_trainer, from_trainer_other_shape, MW_ERR_SHAPE, "'w'"),
    R(mw_infer_from_trainer, from_trainer_other_split, MW_ERR_SHARDING, "'w'"),
    R(mw_infer_free, infer_free_null, MW_OK, NULL),
    R(mw_infer_chunk_rows, infer_chunk_rows_null, MW_OK, NULL),
    R(mw_infer_run, infer_run_null, MW_ERR_INVALID, NULL),
    R(mw_infer_run, infer_run_rows_0, MW_ERR_INVALID, "rows 0"),
    R(mw_infer_run, infer_run_missing_feed, MW_ERR_INVALID, "'x' is not fed"),
    R(mw_infer_run, infer_run_unknown_feed, MW_ERR_INVALID, "'z'"),
    R(mw_infer_run, infer_run_feed_size, MW_ERR_INVALID, "'x'"),
    R(mw_infer_run, infer_run_fetch_size, MW_ERR_INVALID, "fetch 0"),
    R(mw_infer_run, infer_run_not_an_output, MW_ERR_NOT_FOUND, "fetch 0"),
    R(mw_infer_load_weights, infer_load_weights_null, MW_ERR_INVALID, NULL),
    R(mw_infer_load_weights, infer_load_weights_missing, MW_ERR_IO, "none.safetensors"),
    R(mw_infer_load_weights, infer_load_weights_no_tensor, MW_ERR_NOT_FOUND, "'w'"),
    R(mw_infer_load_weights, infer_load_weights_shape, MW_ERR_SHAPE, "'w'"),
    R(mw_infer_write_param, infer_write_param_unknown, MW_ERR_NOT_FOUND, "'v'"),
    R(mw_infer_write_param, infer_write_param_count, MW_ERR_SHAPE, "not 2"),
    R(mw_infer_write_param, infer_write_param_null, MW_ERR_INVALID, NULL),
    R(mw_infer_read_param, infer_read_param_unknown, MW_ERR_NOT_FOUND, "'v'"),
    R(mw_infer_read_param, infer_read_param_null_dst, MW_ERR_INVALID, NULL),
    /* sample.h */
    R(mw_sampler_new, sampler_new_null_config, MW_ERR_INVALID, "config is NULL"),
    R(mw_sampler_new, sampler_new_null_out, MW_ERR_INVALID, "out is NULL"),
    R(mw_sampler_new, sampler_new_negative_temperature, MW_ERR_INVALID, "temperature -0.5"),
    R(mw_sampler_new, sampler_new_nan_temperature, MW_ERR_INVALID, "temperature nan"),
    R(mw_sampler_new, sampler_new_infinite_temperature, MW_ERR_INVALID, "temperature inf"),
    R(mw_sampler_new, sampler_new_negative_top_k, MW_ERR_INVALID, "top_k -1"),
    R(mw_sampler_new, sampler_new_top_p_0, MW_ERR_INVALID, "top_p 0 is not in (0, 1]"),
    R(mw_sampler_new, sampler_new_top_p_above_1, MW_ERR_INVALID, "top_p 1.5"),
    R(mw_sampler_new, sampler_new_nan_top_p, MW_ERR_INVALID, "top_p nan"),
    R(mw_sampler_new, sampler_new_negative_neos, MW_ERR_INVALID, "neos -1"),
    R(mw_sampler_new, sampler_new_null_eos_ids, MW_ERR_INVALID, "eos_ids NULL"),
    R(mw_sampler_new, sampler_new_negative_eos_id, MW_ERR_INVALID, "eos_ids[1] is -3"),
    R(mw_sampler_free, sampler_free_null, MW_OK, NULL),
    R(mw_sampler_draw, sampler_draw_null, MW_ERR_INVALID, "the sampler is NULL"),
    R(mw_sampler_draw, sampler_draw_null_logits, MW_ERR_INVALID, "logits is NULL"),
    R(mw_sampler_draw, sampler_draw_null_token, MW_ERR_INVALID, "token is NULL"),
    R(mw_sampler_draw, sampler_draw_vocab_0, MW_ERR_INVALID, "vocab 0"),
    R(mw_sampler_draw, sampler_draw_nan, MW_ERR_NONFINITE, "logit 2 of 4 is NaN"),
    R(mw_sampler_draw, sampler_draw_infinite, MW_ERR_NONFINITE, "logit 1 of 4 is +Inf"),
    R(mw_sampler_draw, sampler_draw_all_ruled_out, MW_ERR_NONFINITE, "all 3 logits are -Inf"),
    R(mw_sampler_is_eos, sampler_is_eos_null, MW_OK, NULL),
    R(mw_sampler_position, sampler_position_null, MW_OK, NULL),
    R(mw_sampler_set_position, sampler_set_position_null, MW_ERR_INVALID, NULL),
    /* weights.h */
    R(mw_graph_param_count, graph_param_count_null, MW_OK, NULL),
    R(mw_graph_param_info, graph_param_info_range, MW_ERR_INVALID, "5"),
    R(mw_graph_param_info, graph_param_info_null, MW_ERR_INVALID, NULL),
    R(mw_trainer_param_count, trainer_param_count_null, MW_OK, NULL),
    R(mw_trainer_param_info, trainer_param_info_range, MW_ERR_INVALID, "-1"),
    R(mw_trainer_param_info, trainer_param_info_null, MW_ERR_INVALID, NULL),
    R(mw_safetensors_open, safetensors_open_null, MW_ERR_INVALID, NULL),
    R(mw_safetensors_open, safetensors_open_missing, MW_ERR_IO, "none"),
    R(mw_safetensors_open, safetensors_open_folder, MW_ERR_IO, "a directory"),
    R(mw_safetensors_open, safetensors_open_fifo, MW_ERR_IO, "a FIFO"),
    R(mw_safetensors_open, safetensors_open_garbage, MW_ERR_FORMAT, "/t"),
    R(mw_safetensors_open, safetensors_open_header_length, MW_ERR_FORMAT, "byte 0"),
    R(mw_safetensors_parse, safetensors_parse_short, MW_ERR_FORMAT, "three bytes"),
    R(mw_safetensors_parse, safetensors_parse_null, MW_ERR_INVALID, NULL),
    R(mw_safetensors_close, safetensors_close_null, MW_OK, NULL),
    R(mw_safetensors_count, safetensors_count_null, MW_OK, NULL),
    R(mw_safetensors_tensor, safetensors_tensor_range, MW_ERR_INVALID, "1"),
    R(mw_safetensors_tensor, safetensors_tensor_null, MW_ERR_INVALID, NULL),
    R(mw_safetensors_find, safetensors_find_missing, MW_ERR_NOT_FOUND, "'v'"),
    R(mw_safetensors_find, safetensors_find_null, MW_ERR_INVALID, NULL),
    R(mw_safetensors_metadata, safetensors_metadata_missing, MW_OK, NULL),
    R(mw_safetensors_read, safetensors_read_missing, MW_ERR_NOT_FOUND, "'v'"),
    R(mw_safetensors_read, safetensors_read_count, MW_ERR_SHAPE, "not 4"),
    R(mw_safetensors_read, safetensors_read_dtype, MW_ERR_DTYPE, "I32"),
    R(mw_safetensors_read, safetensors_read_null, MW_ERR_INVALID, NULL),
    R(mw_safetensors_write, safetensors_write_null_path, MW_ERR_INVALID, NULL),
    R(mw_safetensors_write, safetensors_write_empty_name, MW_ERR_INVALID, "entry 1"),
    R(mw_safetensors_write, safetensors_write_duplicate, MW_ERR_INVALID, "'first'"),
    R(mw_safetensors_write, safetensors_write_reserved, MW_ERR_INVALID, "__metadata__"),
    R(mw_safetensors_write, safetensors_write_control, MW_ERR_INVALID, "entry 1"),
    R(mw_safetensors_write, safetensors_write_rank, MW_ERR_INVALID, "'r'"),
    R(mw_safetensors_write, safetensors_write_size, MW_ERR_INVALID, "'s'"),
    R(mw_safetensors_write, safetensors_write_no_data, MW_ERR_INVALID, "'d'"),
    R(mw_safetensors_write, safetensors_write_missing_folder, MW_ERR_IO, "no/such.safetensors"),
    R(mw_safetensors_write, safetensors_write_folder, MW_ERR_IO, "a directory"),
    R(mw_trainer_save_weights, save_weights_null_path, MW_ERR_INVALID, NULL),
    R(mw_trainer_save_weights, save_weights_null_trainer, MW_ERR_INVALID, NULL),
    R(mw_trainer_save_weights, save_weights_unknown, MW_ERR_NOT_FOUND, "'v'"),
    R(mw_trainer_save_weights, save_weights_duplicate, MW_ERR_INVALID, "'x'"),
    R(mw_trainer_save_weights, save_weights_missing_folder, MW_ERR_IO, "no/such"),
    R(mw_trainer_load_weights, load_weights_null_path, MW_ERR_INVALID, NULL),
    R(mw_trainer_load_weights, load_weights_missing, MW_ERR_IO, "none"),
    R(mw_trainer_load_weights, load_weights_garbage, MW_ERR_FORMAT, "/t"),
    R(mw_trainer_load_weights, load_weights_no_tensor, MW_ERR_NOT_FOUND,
      "w.safetensors has no tensor 'w'"),
    R(mw_trainer_load_weights, load_weights_unknown_param, MW_ERR_NOT_FOUND, "'nope'"),
    R(mw_trainer_load_weights, load_weights_shape, MW_ERR_SHAPE, "[5, 3] but parameter 'w'"),
    R(mw_trainer_load_weights, load_weights_dtype, MW_ERR_DTYPE, "I32"),
    /* distributed.h */
    R(mw_distributed_init, distributed_init_alone, MW_OK, NULL),
    R(mw_distributed_finalize, distributed_finalize_alone, MW_OK, NULL),
    R(mw_distributed_rank, distributed_rank_alone, MW_OK, NULL),
    R(mw_distributed_size, distributed_size_alone, MW_OK, NULL),
    R(mw_distributed_available, distributed_available_flag, MW_OK, NULL),
    R(mw_distributed_agree, agree_alone, MW_OK, NULL),
    R(mw_distributed_agree, agree_null, MW_ERR_INVALID, NULL),
    R(mw_distributed_agree, agree_timeout, MW_ERR_INVALID, "-1"),
    R(mw_distributed_abort, abort_exits, MW_OK, NULL),
    /* tokenizer.h */
    R(mw_tokenizer_load, tokenizer_load_null, MW_ERR_INVALID, NULL),
    R(mw_tokenizer_load, tokenizer_load_missing, MW_ERR_IO, "none.json"),
    R(mw_tokenizer_load, tokenizer_load_fifo, MW_ERR_IO, "a FIFO"),
    R(mw_tokenizer_load, tokenizer_load_empty_folder, MW_ERR_IO, "vocab.json"),
    R(mw_tokenizer_load, tokenizer_load_damaged, MW_ERR_FORMAT, "t.json:1:"),
    R(mw_tokenizer_load, tokenizer_load_other_model, MW_ERR_UNSUPPORTED, "\"BPX\""),
    R(mw_tokenizer_free, tokenizer_free_null, MW_OK, NULL),
    R(mw_tokenizer_vocab_size, tokenizer_vocab_size_null, MW_OK, NULL),
    R(mw_tokenizer_file, tokenizer_file_past_the_last, MW_OK, NULL),
    R(mw_tokenizer_missing_byte, tokenizer_missing_byte_null, MW_OK, NULL),
    R(mw_tokenizer_token_id, token_id_missing, MW_ERR_NOT_FOUND, "\"no such token here\""),
    R(mw_tokenizer_token_id, token_id_null, MW_ERR_INVALID, NULL),
    R(mw_tokenizer_is_special, is_special_out_of_range, MW_OK, NULL),
    R(mw_tokenizer_max_ids, max_ids_null, MW_OK, NULL),
    R(mw_tokenizer_encode, encode_small_buffer, MW_ERR_SHAPE, "holds 1"),
    R(mw_tokenizer_encode, encode_null_count, MW_ERR_INVALID, NULL),
    R(mw_tokenizer_encode, encode_null_text, MW_ERR_INVALID, NULL),
    R(mw_tokenizer_decode, decode_bad_id, MW_ERR_INVALID, "id 1073741824 at position 1"),
    R(mw_tokenizer_decode, decode_small_buffer, MW_ERR_SHAPE, "holds 2"),
    R(mw_tokenizer_decode, decode_null_len, MW_ERR_INVALID, NULL),
    R(mw_tokenizer_encode_with, encode_with_unknown_flag, MW_ERR_INVALID, "unknown flags 0x4"),
    R(mw_tokenizer_encode_with, encode_with_bos_counted, MW_ERR_SHAPE, "holds 1"),
    R(mw_tokenizer_bos_id, bos_id_none, MW_ERR_NOT_FOUND, "no token before the text"),
    R(mw_tokenizer_bos_id, bos_id_null, MW_ERR_INVALID, NULL),
    R(mw_tokenizer_eos_id, eos_id_llama3, MW_ERR_NOT_FOUND, "no token after the text"),
    R(mw_tokenizer_eos_id, eos_id_null, MW_ERR_INVALID, NULL),
    R(mw_test_control, tokenizer_words_null, MW_ERR_INVALID, "MW_TEST_TOKENIZER_WORDS"),
    R(mw_tokenizer_unicode_version, unicode_version_16, MW_OK, NULL),
    /* file.h */
    R(mw_input_open, input_open_null, MW_ERR_INVALID, NULL),
    R(mw_input_open, input_open_empty, MW_ERR_INVALID, "--data"),
    R(mw_input_open, input_open_missing, MW_ERR_IO, "No such file or directory"),
    R(mw_input_open, input_open_fifo, MW_ERR_IO, "it is a FIFO, not a regular file"),
    R(mw_input_open, input_open_folder, MW_ERR_IO, "a directory"),
    R(mw_file_set_new, files_new_null, MW_ERR_INVALID, NULL),
    R(mw_file_set_free, files_free_null, MW_OK, NULL),
    R(mw_file_set_add_input, files_input_empty, MW_ERR_INVALID, "--data"),
    R(mw_file_set_add_input, files_input_null, MW_ERR_INVALID, NULL),
    R(mw_file_set_add_input, files_input_missing, MW_ERR_IO, "--data"),
    R(mw_file_set_add_input, files_input_fifo, MW_ERR_IO, "a FIFO"),
    R(mw_file_set_add_input, files_input_folder, MW_ERR_IO, "a directory"),
    R(mw_file_set_add_input, files_input_an_output, MW_ERR_INVALID, "--save"),
    R(mw_file_set_add_output, files_output_empty, MW_ERR_INVALID, "--save"),
    R(mw_file_set_add_output, files_output_an_input, MW_ERR_INVALID, "--data"),
    R(mw_file_set_add_output, files_output_twice, MW_ERR_INVALID, "--save"),
    R(mw_file_set_add_output, files_output_fifo, MW_ERR_IO, "a FIFO"),
    R(mw_file_set_add_output, files_output_folder, MW_ERR_IO, "a directory"),
    R(mw_file_set_add_output, files_output_missing_folder, MW_ERR_IO, "no/such"),
    R(mw_file_set_add_output, files_output_no_room, MW_ERR_IO, "B free"),
    R(mw_output_open, output_open_null, MW_ERR_INVALID, NULL),
    R(mw_output_open, output_open_empty, MW_ERR_INVALID, "--save"),
    R(mw_output_open, output_open_folder, MW_ERR_IO, "a directory"),
    R(mw_output_open, output_open_missing_folder, MW_ERR_IO, "cannot create"),
    R(mw_output_write, output_write_null, MW_ERR_INVALID, NULL),
    R(mw_output_write, output_write_null_data, MW_ERR_INVALID, NULL),
    R(mw_output_printf, output_printf_null_format, MW_ERR_INVALID, NULL),
    R(mw_output_sync, output_sync_null, MW_ERR_INVALID, NULL),
    R(mw_output_commit, output_commit_null, MW_ERR_INVALID, NULL),
    R(mw_output_commit, output_commit_not_replaced, MW_ERR_IO, "a FIFO"),
    R(mw_output_abandon, output_abandon_null, MW_OK, NULL),
    /* pipeline.h */
    R(mw_pipeline_new, pipeline_out_null, MW_ERR_INVALID, "out is NULL"),
    R(mw_pipeline_new, pipeline_no_regions, MW_ERR_INVALID, "0 regions but the pipeline has 2"),
    R(mw_pipeline_new, pipeline_unknown_axis, MW_ERR_INVALID, "no axis 'Q'"),
    R(mw_pipeline_new, pipeline_nested, MW_ERR_INVALID, "config.trainer.pipeline_axis"),
    R(mw_pipeline_free, pipeline_free_null, MW_OK, NULL),
    R(mw_pipeline_step, pipeline_step_null, MW_ERR_INVALID, "NULL"),
    R(mw_pipeline_read_param, pipeline_read_param_null, MW_ERR_INVALID, "NULL"),
    R(mw_pipeline_write_param, pipeline_write_param_null, MW_ERR_INVALID, "NULL"),
    R(mw_pipeline_stages, pipeline_stages_null, MW_OK, NULL),
    R(mw_pipeline_stage, pipeline_stage_null, MW_ERR_INVALID, "NULL"),
    R(mw_pipeline_idle, pipeline_idle_null, MW_OK, NULL),
};
#define NROWS ((int)(sizeof table / sizeof *table))

TestSuite(api_errors, .timeout = 300);

Test(api_errors, every_documented_error) {
    int bad = 0;
    for (int i = 0; i < NROWS; i++) {
        const row *r = &table[i];
        fx f = {0};
        mw__error(MW_OK, "%s", ""); /* no message left over from the row before */
        mw_status got = r->call(&f);
        char msg[MW__MSG_SIZE];
        snprintf(msg, sizeof msg, "%s", got == BROKEN ? f.why : mw_last_error());
        fx_free(&f);
        const char *fault = NULL;
        if (got != r->want)
            fault = "status";
        else if (r->want != MW_OK && !msg[0])
            fault = "no message";
        else if (r->says && !strstr(msg, r->says))
            fault = "message";
        if (!fault) continue;
        bad++;
        cr_log_error("%s, %s: %s: got %s, the header says %s%s%s; message: %s", r->fn, r->what,
                     fault, got == BROKEN ? "BROKEN" : mw_status_name(got), mw_status_name(r->want),
                     r->says ? " naming " : "", r->says ? r->says : "", msg);
    }
    cr_assert_eq(bad, 0, "%d of %d rows differ from their headers", bad, NROWS);
}

/* --- every public function has a row --------------------------------------------------------- */

/* The names of the functions declared in `path`: identifiers "mw_..." followed by '(' outside
 * comments, string literals and preprocessor lines. */
static int declared(const char *path, char names[][64], int n, int cap) {
    FILE *in = fopen(path, "rb");
    cr_assert_not_null(in, "cannot open %s", path);
    static char text[1 << 18];
    size_t len = fread(text, 1, sizeof text - 1, in);
    fclose(in);
    text[len] = '\0';
    int line_start = 1;
    for (size_t i = 0; i < len;) {
        char c = text[i];
        if (c == '/' && text[i + 1] == '*') {
            const char *end = strstr(text + i + 2, "*/");
            i = end ? (size_t)(end - text) + 2 : len;
        } else if (c == '/' && text[i + 1] == '/') {
            while (i < len && text[i] != '\n') i++;
        } else if (c == '"') {
            for (i++; i < len && text[i] != '"'; i++)
                if (text[i] == '\\') i++;
            i++;
        } else if (c == '#' && line_start) {
            while (i < len && (text[i] != '\n' || text[i - 1] == '\\')) i++;
        } else if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            size_t s = i;
            while (i < len &&
                   (text[i] == '_' || (text[i] >= 'a' && text[i] <= 'z') ||
                    (text[i] >= 'A' && text[i] <= 'Z') || (text[i] >= '0' && text[i] <= '9')))
                i++;
            size_t e = i;
            while (i < len && (text[i] == ' ' || text[i] == '\n')) i++;
            if (e - s > 3 && !strncmp(text + s, "mw_", 3) && text[i] == '(' && e - s < 64) {
                cr_assert_lt(n, cap);
                snprintf(names[n++], 64, "%.*s", (int)(e - s), text + s);
            }
            line_start = 0;
            continue;
        } else {
            i++;
        }
        if (c == '\n')
            line_start = 1;
        else if (c != ' ')
            line_start = 0;
    }
    return n;
}

Test(api_errors, every_public_function_has_a_row) {
    static char names[512][64];
    const char *file = __FILE__, *slash = strrchr(file, '/');
    char dir[4096], path[4096 + 512];
    snprintf(dir, sizeof dir, "%.*s/../../include", slash ? (int)(slash - file) : 1,
             slash ? file : ".");
    snprintf(path, sizeof path, "%s/meshwit.h", dir);
    int n = declared(path, names, 0, 512), headers = 1;
    strcat(dir, "/meshwit");
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "cannot open %s", dir);
    for (struct dirent *e; (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (l < 3 || strcmp(e->d_name + l - 2, ".h") != 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        n = declared(path, names, n, 512);
        headers++;
    }
    closedir(d);
    cr_assert_gt(headers, 10, "the headers of %s", dir);
    int missing = 0;
    for (int i = 0; i < n; i++) {
        int found = 0;
        for (int r = 0; r < NROWS && !found; r++) found = !strcmp(table[r].fn, names[i]);
        if (!found) cr_log_error("%s is declared but has no row", names[i]), missing++;
    }
    for (int r = 0; r < NROWS; r++) {
        int found = 0;
        for (int i = 0; i < n && !found; i++) found = !strcmp(table[r].fn, names[i]);
        if (!found)
            cr_log_error("row %s: no header declares %s", table[r].what, table[r].fn), missing++;
    }
    cr_assert_eq(missing, 0, "%d functions without rows or rows without functions", missing);
    cr_assert_gt(n, 150, "only %d functions found in the headers", n);
    cr_log_info("%d rows over %d public functions of %d headers", NROWS, n, headers);
}
