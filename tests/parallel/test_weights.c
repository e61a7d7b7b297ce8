/* Parameters in and out: listing a graph's and a trainer's parameters, safetensors files written
 * and read back, hand-made files (bytes as the format's specification lays them out) read with
 * their exact values, every kind of damaged header refused with a message naming the tensor and
 * the offset, and weights loaded only when every tensor asked for fits. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "meshwit.h"

typedef struct net {
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
} net;

/* loss = sum((x . w + b)^2) with w [Feature=3, Hidden=2], b [Hidden=2], g scalar. */
static void net_make(net *n, uint64_t seed) {
    memset(n, 0, sizeof *n);
    cr_assert_eq(mw_graph_new(&n->g), MW_OK);
    mw_graph_set_seed(n->g, seed);
    mw_graph *g = n->g;
    mw_tensor *x = mw_input(g, "x", MW_F32, MW_AXES({"Batch", 4}, {"Feature", 3}));
    mw_tensor *w = mw_param(g, "w", MW_AXES({"Feature", 3}, {"Hidden", 2}), MW_INIT_NORMAL(1));
    mw_tensor *b = mw_param(g, "b", MW_AXES({"Hidden", 2}), MW_INIT_NORMAL(1));
    mw_tensor *s = mw_param(g, "gain", MW_SCALAR, MW_INIT_CONST(2));
    mw_tensor *h = mw_scale(g, mw_mul(g, mw_add(g, mw_dot(g, x, w, "Feature"), b), s), 1.0f);
    mw_tensor *loss = mw_sum(g, mw_mul(g, h, h), NULL);
    cr_assert_eq(mw_graph_status(g), MW_OK, "%s", mw_graph_error(g));
    cr_assert_eq(mw_mesh_new("cpu:1", "X", &n->mesh), MW_OK);
    cr_assert_eq(mw_trainer_new(g, loss, n->mesh, NULL, &n->tr), MW_OK, "%s", mw_last_error());
}

static void net_free(net *n) {
    mw_trainer_free(n->tr);
    mw_mesh_free(n->mesh);
    mw_graph_free(n->g);
}

static char *tmp_path(const char *suffix) {
    static char path[128];
    snprintf(path, sizeof path, "/tmp/mw_weights_%d%s", (int)getpid(), suffix);
    return path;
}

Test(weights, parameters_are_listed_in_declaration_order) {
    net n;
    net_make(&n, 1);
    cr_assert_eq(mw_graph_param_count(n.g), 3);
    cr_assert_eq(mw_trainer_param_count(n.tr), 3);
    mw_param_info p;
    cr_assert_eq(mw_trainer_param_info(n.tr, 0, &p), MW_OK);
    cr_assert_str_eq(p.name, "w");
    cr_assert_eq(p.rank, 2);
    cr_assert_str_eq(p.axis[0].name, "Feature");
    cr_assert_eq(p.axis[0].size, 3);
    cr_assert_str_eq(p.axis[1].name, "Hidden");
    cr_assert_eq(p.axis[1].size, 2);
    cr_assert_eq(p.count, 6);
    cr_assert_eq(p.dtype, MW_F32);
    cr_assert_eq(mw_graph_param_info(n.g, 2, &p), MW_OK);
    cr_assert_str_eq(p.name, "gain");
    cr_assert_eq(p.rank, 0);
    cr_assert_eq(p.count, 1);
    cr_assert_eq(mw_graph_param_info(n.g, 3, &p), MW_ERR_INVALID);
    cr_assert_eq(mw_graph_param_info(n.g, -1, &p), MW_ERR_INVALID);
    cr_assert_eq(mw_graph_param_count(NULL), 0);
    net_free(&n);
}

Test(weights, save_then_load_restores_every_parameter) {
    net a, b;
    net_make(&a, 1);
    net_make(&b, 2);
    const char *path = tmp_path(".safetensors");
    cr_assert_eq(mw_trainer_save_weights(a.tr, path, NULL, 0), MW_OK, "%s", mw_last_error());
    mw_safetensors *f;
    cr_assert_eq(mw_safetensors_open(path, &f), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_safetensors_count(f), 3);
    mw_stored_tensor t;
    cr_assert_eq(mw_safetensors_find(f, "w", &t), MW_OK);
    cr_assert_str_eq(t.dtype, "F32");
    cr_assert_eq(t.rank, 2);
    cr_assert_eq(t.shape[0], 3);
    cr_assert_eq(t.shape[1], 2);
    cr_assert_eq(mw_safetensors_find(f, "gain", &t), MW_OK);
    cr_assert_eq(t.rank, 0);
    cr_assert_str_eq(mw_safetensors_metadata(f, "format"), "pt");
    cr_assert_eq(mw_safetensors_find(f, "nope", &t), MW_ERR_NOT_FOUND);
    mw_safetensors_close(f);

    cr_assert_eq(mw_trainer_load_weights(b.tr, path, NULL, 0), MW_OK, "%s", mw_last_error());
    const char *names[] = {"w", "b", "gain"};
    const int counts[] = {6, 2, 1};
    for (int i = 0; i < 3; i++) {
        float x[6], y[6];
        cr_assert_eq(mw_trainer_read_param(a.tr, names[i], x, counts[i]), MW_OK);
        cr_assert_eq(mw_trainer_read_param(b.tr, names[i], y, counts[i]), MW_OK);
        cr_assert(memcmp(x, y, (size_t)counts[i] * 4) == 0, "%s differs", names[i]);
    }
    remove(path);
    net_free(&a);
    net_free(&b);
}

Test(weights, caller_chosen_names) {
    net a, b;
    net_make(&a, 1);
    net_make(&b, 2);
    const char *path = tmp_path("_named.safetensors");
    const mw_weight_name map[] = {{"w", "layer.weight"}, {"b", "layer.bias"}};
    cr_assert_eq(mw_trainer_save_weights(a.tr, path, map, 2), MW_OK, "%s", mw_last_error());
    mw_safetensors *f;
    cr_assert_eq(mw_safetensors_open(path, &f), MW_OK);
    cr_assert_eq(mw_safetensors_count(f), 2, "only the listed parameters are saved");
    mw_stored_tensor t;
    cr_assert_eq(mw_safetensors_tensor(f, 0, &t), MW_OK);
    cr_assert_str_eq(t.name, "layer.weight");
    mw_safetensors_close(f);
    /* Loading everything by own name fails on the first missing one, and changes nothing. */
    float before[6], after[6];
    cr_assert_eq(mw_trainer_read_param(b.tr, "w", before, 6), MW_OK);
    cr_assert_eq(mw_trainer_load_weights(b.tr, path, NULL, 0), MW_ERR_NOT_FOUND);
    cr_assert(strstr(mw_last_error(), "'w'") && strstr(mw_last_error(), path), "%s",
              mw_last_error());
    cr_assert_eq(mw_trainer_read_param(b.tr, "w", after, 6), MW_OK);
    cr_assert(memcmp(before, after, sizeof before) == 0);
    cr_assert_eq(mw_trainer_load_weights(b.tr, path, map, 2), MW_OK, "%s", mw_last_error());
    float want[6];
    cr_assert_eq(mw_trainer_read_param(a.tr, "w", want, 6), MW_OK);
    cr_assert_eq(mw_trainer_read_param(b.tr, "w", after, 6), MW_OK);
    cr_assert(memcmp(want, after, sizeof want) == 0);
    /* A stored shape that differs is named with both shapes. */
    const mw_weight_name wrong[] = {{"b", "layer.weight"}};
    cr_assert_eq(mw_trainer_load_weights(b.tr, path, wrong, 1), MW_ERR_SHAPE);
    cr_assert(strstr(mw_last_error(), "[3, 2]") && strstr(mw_last_error(), "Hidden=2"), "%s",
              mw_last_error());
    const mw_weight_name unknown[] = {{"bias", "layer.bias"}};
    cr_assert_eq(mw_trainer_load_weights(b.tr, path, unknown, 1), MW_ERR_NOT_FOUND);
    cr_assert_eq(mw_trainer_save_weights(b.tr, path, unknown, 1), MW_ERR_NOT_FOUND);
    remove(path);
    net_free(&a);
    net_free(&b);
}

/* A file: the 8-byte length, the header, then `data` bytes. */
static size_t make_file(unsigned char *out, const char *header, const void *data, size_t dsize) {
    size_t h = strlen(header);
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(out + 8, header, h);
    if (dsize) memcpy(out + 8 + h, data, dsize);
    return 8 + h + dsize;
}

Test(weights, half_and_bfloat_read_exactly) {
    /* F16 1.0 = 0x3C00, -2.5 = 0xC100, smallest subnormal 2^-24 = 0x0001; BF16 1.0 = 0x3F80,
     * -0.5 = 0xBF00; F32 3.0 = 0x40400000. Little-endian bytes. */
    const unsigned char data[] = {0x00, 0x3C, 0x00, 0xC1, 0x01, 0x00, 0x80,
                                  0x3F, 0x00, 0xBF, 0x00, 0x00, 0x40, 0x40};
    unsigned char file[512];
    size_t n = make_file(file,
                         "{\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]}, "
                         "\"b\":{\"shape\":[1,2],\"dtype\":\"BF16\",\"data_offsets\":[6,10]},"
                         "\"f\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[10,14]},"
                         "\"__metadata__\":{\"k\":\"v\\u00e9\"}}   ",
                         data, sizeof data);
    mw_safetensors *f;
    cr_assert_eq(mw_safetensors_parse(file, n, "mem", &f), MW_OK, "%s", mw_last_error());
    float h[3], b[2], x;
    cr_assert_eq(mw_safetensors_read(f, "h", h, 3), MW_OK);
    cr_assert(h[0] == 1.0f && h[1] == -2.5f && h[2] == ldexpf(1.0f, -24), "%g %g %g", h[0], h[1],
              h[2]);
    cr_assert_eq(mw_safetensors_read(f, "b", b, 2), MW_OK);
    cr_assert(b[0] == 1.0f && b[1] == -0.5f);
    cr_assert_eq(mw_safetensors_read(f, "f", &x, 1), MW_OK);
    cr_assert(x == 3.0f);
    cr_assert_eq(mw_safetensors_read(f, "h", h, 2), MW_ERR_SHAPE);
    cr_assert_str_eq(mw_safetensors_metadata(f, "k"), "v\xc3\xa9");
    mw_safetensors_close(f);
    /* An integer tensor is listed but not read as f32. */
    const unsigned char i32[4] = {1, 0, 0, 0};
    n = make_file(file, "{\"i\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", i32, 4);
    cr_assert_eq(mw_safetensors_parse(file, n, "mem", &f), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_safetensors_read(f, "i", &x, 1), MW_ERR_DTYPE);
    mw_safetensors_close(f);
}

typedef struct bad_case {
    const char *header;
    size_t data; /* bytes of data after the header */
    const char *words[2];
} bad_case;

#define T(name, dtype, shape, off)                                                                 \
    "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":" off "}"

static const bad_case bad[] = {
    {"{" T("a", "F32", "[2]", "[0,8]") "}", 4, {"'a'", "run past"}},
    {"{" T("a", "F32", "[2]", "[0,4]") "}", 4, {"'a'", "needs 8 bytes"}},
    {"{" T("a", "F32", "[1]", "[4,8]") "}", 8, {"'a'", "a gap"}},
    {"{" T("a", "F32", "[2]", "[0,8]") "," T("b", "F32", "[1]", "[4,8]") "}",
     8,
     {"'b'", "overlaps"}},
    {"{" T("a", "F32", "[1]", "[0,4]") "}", 8, {"end at data byte 4", "8 bytes"}},
    {"{" T("a", "F32", "[1]", "[0,4]") "," T("a", "F32", "[1]", "[4,8]") "}", 8, {"'a'", "twice"}},
    {"{" T("a", "Q4", "[1]", "[0,4]") "}", 4, {"'a'", "unknown dtype 'Q4'"}},
    {"{" T("a", "F32", "[-1]", "[0,4]") "}", 4, {"'a'", "non-negative integer"}},
    {"{" T("a", "F32", "[01]", "[0,4]") "}", 4, {"'a'", "leading zero"}},
    {"{" T("a", "F32", "[1.0]", "[0,4]") "}", 4, {"'a'", "fraction"}},
    {"{" T("a", "F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]") "}", 4, {"'a'", "more than 8"}},
    {"{" T("a", "F32", "[4294967296,4294967296]", "[0,4]") "}", 4, {"'a'", "overflows"}},
    {"{" T("a", "F32", "[1]", "[4,0]") "}", 4, {"'a'", "end before"}},
    {"{" T("a", "F32", "[1]", "[0]") "}", 4, {"'a'", "','"}},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, {"'a'", "lacks \"data_offsets\""}},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}",
     4,
     {"'a'", "unknown field"}},
    {"{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
     4,
     {"'a'", "twice"}},
    {"{" T("a", "F32", "[1]", "[0,4]") "} x", 4, {"after the header", "header byte"}},
    {"{" T("a", "F32", "[1]", "[0,4]"), 4, {"'}'", "header byte"}},
    {"[]", 0, {"'{'", "header byte 0"}},
    {"{\"a\\x\":1}", 0, {"bad escape", "header byte"}},
    {"{\"\\ud800\":1}", 0, {"surrogate", "header byte"}},
    {"{\"a\xff\":1}", 0, {"UTF-8", "header byte"}},
    {"{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, {"empty name", ""}},
    {"{\"__metadata__\":{\"a\":1}}", 0, {"a string", "header byte"}},
    /* a bad value after the metadata table grew (its new slots once held garbage, then freed) */
    {"{\"__metadata__\":{\"a\":\"1\",\"b\":\"2\",\"c\":\"3\",\"d\":\"4\",\"e\":5}}",
     0,
     {"a string", "header byte"}},
    {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, {"twice", ""}},
    {"{\"a\":[]}", 0, {"'a'", "'{'"}},
};

Test(weights, damaged_headers_are_refused_naming_tensor_and_offset) {
    static unsigned char file[4096];
    static const unsigned char zeros[64];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        size_t n = make_file(file, bad[i].header, zeros, bad[i].data);
        mw_safetensors *f = (mw_safetensors *)1;
        mw_status st = mw_safetensors_parse(file, n, "case.safetensors", &f);
        cr_assert_eq(st, MW_ERR_FORMAT, "case %zu (%s): got %s", i, bad[i].header,
                     mw_status_name(st));
        cr_assert_null(f);
        const char *msg = mw_last_error();
        for (int k = 0; k < 2; k++)
            cr_assert(strstr(msg, bad[i].words[k]), "case %zu (%s): message lacks '%s': %s", i,
                      bad[i].header, bad[i].words[k], msg);
        cr_assert(strstr(msg, "case.safetensors"), "case %zu: no file name: %s", i, msg);
    }
}

Test(weights, damaged_lengths_are_refused) {
    unsigned char file[64] = {0};
    mw_safetensors *f;
    cr_assert_eq(mw_safetensors_parse(file, 5, "short", &f), MW_ERR_FORMAT);
    cr_assert(strstr(mw_last_error(), "too short"), "%s", mw_last_error());
    file[0] = 200; /* a header longer than the file */
    cr_assert_eq(mw_safetensors_parse(file, 64, "long", &f), MW_ERR_FORMAT);
    cr_assert(strstr(mw_last_error(), "header length 200"), "%s", mw_last_error());
    memset(file, 0xff, 8); /* 2^64 - 1 */
    cr_assert_eq(mw_safetensors_parse(file, 64, "huge", &f), MW_ERR_FORMAT);
    cr_assert_eq(mw_safetensors_open("/nonexistent/x.safetensors", &f), MW_ERR_IO);
    /* An empty object is a valid file of no tensors. */
    size_t n = make_file(file, "{}", NULL, 0);
    cr_assert_eq(mw_safetensors_parse(file, n, "empty", &f), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_safetensors_count(f), 0);
    mw_safetensors_close(f);
}

Test(weights, a_byte_size_that_overflows_is_refused) {
    /* [2^31, 2^31] F32 needs 2^64 bytes, which wraps to the 0 bytes its offsets hold. */
    static unsigned char file[256];
    size_t n = make_file(file,
                         "{\"a\":{\"dtype\":\"F32\",\"shape\":[2147483648,2147483648],"
                         "\"data_offsets\":[0,0]}}",
                         NULL, 0);
    mw_safetensors *f;
    cr_assert_eq(mw_safetensors_parse(file, n, "wrap", &f), MW_ERR_FORMAT);
    cr_assert(strstr(mw_last_error(), "'a'") && strstr(mw_last_error(), "overflows"), "%s",
              mw_last_error());
}

/* A FIFO, a directory or a device is refused before anything is read (opening a FIFO without
 * a writer would block), and not replaced by a write. */
Test(weights, odd_files_are_refused_without_blocking, .timeout = 30) {
    char fifo[160], dir[160];
    snprintf(fifo, sizeof fifo, "%s", tmp_path("_fifo.safetensors"));
    snprintf(dir, sizeof dir, "%s", tmp_path("_dir.safetensors"));
    unlink(fifo);
    rmdir(dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    cr_assert_eq(mkdir(dir, 0700), 0);
    const struct {
        const char *path, *kind;
    } odd[] = {{fifo, "a FIFO"}, {dir, "a directory"}, {"/dev/zero", "a character device"}};
    const float x = 1.0f;
    const mw_safetensors_entry e[] = {{"x", 0, {0}, &x}};
    for (int i = 0; i < 3; i++) {
        mw_safetensors *f = (mw_safetensors *)1;
        cr_assert_eq(mw_safetensors_open(odd[i].path, &f), MW_ERR_IO);
        cr_assert_null(f);
        cr_assert(strstr(mw_last_error(), odd[i].kind) && strstr(mw_last_error(), odd[i].path),
                  "%s", mw_last_error());
        cr_assert_eq(mw_safetensors_write(odd[i].path, e, 1), MW_ERR_IO);
        cr_assert(strstr(mw_last_error(), odd[i].kind), "%s", mw_last_error());
    }
    struct stat sb;
    cr_assert(stat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode));
    cr_assert(stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode));
    unlink(fifo);
    rmdir(dir);
}

/* The length prefix and the header are checked before the data is read: a large file that is
 * not a safetensors file costs no memory (here 3 GB of zeros, a sparse file, under a 1 GB
 * address-space limit). */
Test(weights, the_header_is_checked_before_the_data_is_read) {
    const char *path = tmp_path("_zeros.safetensors");
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    cr_assert(fd >= 0);
    int sized = ftruncate(fd, (off_t)3 << 30) == 0;
    close(fd);
    if (!sized) {
        unlink(path);
        cr_skip_test("this file system does not take a sparse file of 3 GB");
    }
#ifndef __SANITIZE_ADDRESS__ /* AddressSanitizer reserves terabytes of address space */
    struct rlimit lim = {(rlim_t)1 << 30, (rlim_t)1 << 30};
    cr_assert_eq(setrlimit(RLIMIT_AS, &lim), 0);
#endif
    mw_safetensors *f;
    cr_assert_eq(mw_safetensors_open(path, &f), MW_ERR_FORMAT);
    cr_assert(strstr(mw_last_error(), "header of 0 bytes"), "%s", mw_last_error());
    /* A sane header whose tensors run past the end: refused from the header alone. */
    unsigned char file[256];
    size_t n = make_file(file,
                         "{\"a\":{\"dtype\":\"F32\",\"shape\":[1000000000],"
                         "\"data_offsets\":[0,4000000000]}}",
                         NULL, 0);
    FILE *fp = fopen(path, "r+b");
    cr_assert(fp);
    cr_assert_eq(fwrite(file, 1, n, fp), n);
    fclose(fp);
    cr_assert_eq(mw_safetensors_open(path, &f), MW_ERR_FORMAT);
    cr_assert(strstr(mw_last_error(), "run past"), "%s", mw_last_error());
    unlink(path);
}

Test(weights, writer_output_is_laid_out_as_specified) {
    /* The header is JSON padded with spaces to 8 bytes, the data the tensors in order. */
    const float a[2] = {1.5f, -2.0f}, b = 7.0f;
    const mw_safetensors_entry e[] = {{"a\"q", 1, {2}, a}, {"b", 0, {0}, &b}};
    const char *path = tmp_path("_layout.safetensors");
    cr_assert_eq(mw_safetensors_write(path, e, 2), MW_OK, "%s", mw_last_error());
    FILE *fp = fopen(path, "rb");
    cr_assert(fp);
    unsigned char buf[512];
    size_t n = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    uint64_t h = 0;
    for (int i = 7; i >= 0; i--) h = h << 8 | buf[i];
    cr_assert_eq(h % 8, 0);
    cr_assert_eq(n, 8 + h + 12);
    const char *want = "{\"__metadata__\":{\"format\":\"pt\"},\"a\\\"q\":{\"dtype\":\"F32\","
                       "\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":"
                       "[],\"data_offsets\":[8,12]}}";
    cr_assert(memcmp(buf + 8, want, strlen(want)) == 0, "%.*s", (int)h, buf + 8);
    for (size_t i = 8 + strlen(want); i < 8 + h; i++) cr_assert_eq(buf[i], ' ');
    cr_assert(memcmp(buf + 8 + h, a, 8) == 0 && memcmp(buf + 16 + h, &b, 4) == 0);
    const mw_safetensors_entry dup[] = {{"a", 0, {0}, &b}, {"a", 0, {0}, &b}};
    cr_assert_eq(mw_safetensors_write(path, dup, 2), MW_ERR_INVALID);
    const mw_safetensors_entry meta[] = {{"__metadata__", 0, {0}, &b}};
    cr_assert_eq(mw_safetensors_write(path, meta, 1), MW_ERR_INVALID);
    remove(path);
}
