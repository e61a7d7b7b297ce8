/* GPT-2's files and data: llm.c token shards and model files (every kind of damage is a clear
 * error), the save/load round trip, llm.c's sequential batch windows, the random batches and the
 * built-in arithmetic corpus.
 *
 * Every test writes its files into its own mkdtemp directory, removed afterwards. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "examples/common/gpt2_data.h"
#include "examples/common/gpt2_model.h"

static char dir[64];

static void make_dir(void) {
    snprintf(dir, sizeof dir, "/tmp/mw_gpt2_io_XXXXXX");
    cr_assert_not_null(mkdtemp(dir), "mkdtemp failed");
}

static void remove_dir(void) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    closedir(d);
    rmdir(dir);
}

TestSuite(gpt2_io, .init = make_dir, .fini = remove_dir, .timeout = 60);

static const char *path_of(const char *name) {
    static char buf[4][256];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, 256, "%s/%s", dir, name);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

/* An llm.c token shard: header (magic, version, count) then `ntokens` tokens 0, 1, 2, ... */
static void write_shard(const char *path, int32_t magic, int32_t version, int32_t count,
                        int ntokens) {
    size_t n = 1024 + 2 * (size_t)ntokens;
    unsigned char *buf = calloc(1, n);
    int32_t h[3] = {magic, version, count};
    memcpy(buf, h, sizeof h);
    for (int i = 0; i < ntokens; i++) {
        uint16_t t = (uint16_t)i;
        memcpy(buf + 1024 + 2 * i, &t, 2);
    }
    write_bytes(path, buf, n);
    free(buf);
}

static char err[1024];

/* Loads `path` as a shard and expects `want`, with a message containing each of the strings. */
static void expect_shard_error(const char *path, mw_status want, const char *s1, const char *s2) {
    gpt2_tokens t;
    mw_status st = gpt2_tokens_load_shard(path, &t, err, sizeof err);
    cr_assert_eq(st, want, "status %s, want %s: %s", mw_status_name(st), mw_status_name(want), err);
    cr_assert_null(t.ids);
    cr_assert(strstr(err, path), "message does not name the file: %s", err);
    if (s1) cr_assert(strstr(err, s1), "message lacks '%s': %s", s1, err);
    if (s2) cr_assert(strstr(err, s2), "message lacks '%s': %s", s2, err);
}

/* --- token shards -------------------------------------------------------------------------- */

Test(gpt2_io, shard_loads) {
    const char *p = path_of("ok.bin");
    write_shard(p, GPT2_SHARD_MAGIC, 1, 300, 300);
    gpt2_tokens t;
    cr_assert_eq(gpt2_tokens_load(p, GPT2_DATA_AUTO, &t, err, sizeof err), MW_OK, "%s", err);
    cr_assert_eq(t.count, 300);
    for (int i = 0; i < 300; i++) cr_assert_eq(t.ids[i], i);
    gpt2_tokens_free(&t);
    cr_assert_null(t.ids);
}

Test(gpt2_io, shard_wrong_magic) {
    const char *p = path_of("magic.bin");
    write_shard(p, 12345, 1, 10, 10);
    expect_shard_error(p, MW_ERR_FORMAT, "magic 12345", "20240520");
}

Test(gpt2_io, shard_model_file_given_as_data) {
    const char *p = path_of("model.bin");
    write_shard(p, 20240326, 3, 10, 10);
    expect_shard_error(p, MW_ERR_FORMAT, "model file", "--load");
}

Test(gpt2_io, shard_wrong_version) {
    const char *p = path_of("version.bin");
    write_shard(p, GPT2_SHARD_MAGIC, 2, 10, 10);
    expect_shard_error(p, MW_ERR_FORMAT, "version 2", NULL);
}

Test(gpt2_io, shard_truncated_body) {
    const char *p = path_of("short.bin");
    write_shard(p, GPT2_SHARD_MAGIC, 1, 100, 60); /* 1024 + 200 bytes promised, 1144 there */
    expect_shard_error(p, MW_ERR_FORMAT, "1224 bytes", "has 1144 (truncated)");
}

Test(gpt2_io, shard_count_mismatch) {
    const char *p = path_of("long.bin");
    write_shard(p, GPT2_SHARD_MAGIC, 1, 100, 101);
    expect_shard_error(p, MW_ERR_FORMAT, "100 tokens", "1226");
}

Test(gpt2_io, shard_truncated_header) {
    const char *p = path_of("header.bin");
    int32_t h[3] = {GPT2_SHARD_MAGIC, 1, 0};
    write_bytes(p, h, sizeof h);
    expect_shard_error(p, MW_ERR_FORMAT, "1024 bytes", "has 12");
}

Test(gpt2_io, shard_empty_file) {
    const char *p = path_of("empty.bin");
    write_bytes(p, "", 0);
    expect_shard_error(p, MW_ERR_FORMAT, "has 0", NULL);
}

Test(gpt2_io, shard_without_tokens) {
    const char *p = path_of("none.bin");
    write_shard(p, GPT2_SHARD_MAGIC, 1, 0, 0);
    expect_shard_error(p, MW_ERR_FORMAT, "no tokens", NULL);
}

Test(gpt2_io, missing_files) {
    const char *p = path_of("absent.bin");
    gpt2_tokens t;
    expect_shard_error(p, MW_ERR_IO, "No such file", NULL);
    cr_assert_eq(gpt2_tokens_load_text(p, &t, err, sizeof err), MW_ERR_IO);
    cr_assert(strstr(err, p), "%s", err);
    gpt2_config c;
    cr_assert_eq(gpt2_read_header(p, &c, err, sizeof err), MW_ERR_IO);
    cr_assert(strstr(err, p), "%s", err);
}

Test(gpt2_io, directory_is_io_error) {
    gpt2_tokens t;
    cr_assert_eq(gpt2_tokens_load_text(dir, &t, err, sizeof err), MW_ERR_IO);
    cr_assert(strstr(err, "not a regular file"), "%s", err);
}

/* --- text ---------------------------------------------------------------------------------- */

Test(gpt2_io, text_is_bytes) {
    const char *p = path_of("t.txt");
    const unsigned char text[] = {'h', 'i', '\n', 0, 255, 0xc3, 0xa9};
    write_bytes(p, text, sizeof text);
    gpt2_tokens t;
    cr_assert_eq(gpt2_tokens_load(p, GPT2_DATA_AUTO, &t, err, sizeof err), MW_OK, "%s", err);
    cr_assert_eq(gpt2_data_detect(p, GPT2_DATA_AUTO), GPT2_DATA_TEXT);
    cr_assert_eq(t.count, (int64_t)sizeof text);
    for (size_t i = 0; i < sizeof text; i++) cr_assert_eq(t.ids[i], text[i]);
    gpt2_tokens_free(&t);
}

Test(gpt2_io, text_empty_file) {
    const char *p = path_of("empty.txt");
    write_bytes(p, "", 0);
    gpt2_tokens t;
    cr_assert_eq(gpt2_tokens_load(p, GPT2_DATA_AUTO, &t, err, sizeof err), MW_ERR_FORMAT);
    cr_assert(strstr(err, "empty") && strstr(err, p), "%s", err);
}

Test(gpt2_io, format_detection) {
    const char *shard = path_of("tokens.dat"), *bin = path_of("x.bin");
    write_shard(shard, GPT2_SHARD_MAGIC, 1, 4, 4);
    write_bytes(bin, "abc", 3);
    cr_assert_eq(gpt2_data_detect(shard, GPT2_DATA_AUTO), GPT2_DATA_SHARD); /* by its magic */
    cr_assert_eq(gpt2_data_detect(bin, GPT2_DATA_AUTO), GPT2_DATA_SHARD);   /* by its name */
    cr_assert_eq(gpt2_data_detect(bin, GPT2_DATA_TEXT), GPT2_DATA_TEXT);
    gpt2_tokens t;
    cr_assert_eq(gpt2_tokens_load(bin, GPT2_DATA_TEXT, &t, err, sizeof err), MW_OK);
    cr_assert_eq(t.count, 3);
    gpt2_tokens_free(&t);
}

/* --- vocabulary, split, entropy -------------------------------------------------------------- */

Test(gpt2_io, token_out_of_vocab) {
    uint16_t ids[] = {1, 2, 255, 256, 3};
    gpt2_tokens t = {ids, 5, 0};
    cr_assert_eq(gpt2_tokens_check_vocab(&t, 257, "data", err, sizeof err), MW_OK);
    cr_assert_eq(gpt2_tokens_check_vocab(&t, 256, "data.bin", err, sizeof err), MW_ERR_INVALID);
    cr_assert(strstr(err, "data.bin") && strstr(err, "token 256") && strstr(err, "position 3") &&
                  strstr(err, "vocabulary of 256"),
              "%s", err);
}

Test(gpt2_io, split_holds_out_the_last_tenth) {
    uint16_t ids[1000] = {0};
    gpt2_tokens all = {ids, 1000, 0}, train, val;
    gpt2_tokens_split(&all, 0.1, &train, &val);
    cr_assert_eq(train.ids, ids);
    cr_assert_eq(train.count, 900);
    cr_assert_eq(val.ids, ids + 900);
    cr_assert_eq(val.count, 100);
    cr_assert_eq(val.owned, 0);
}

Test(gpt2_io, unigram_entropy) {
    uint16_t ids[8] = {0, 1, 2, 3, 0, 1, 2, 3};
    gpt2_tokens t = {ids, 8, 0};
    /* Four equally likely tokens: ln 4; the sum is exact to a few ulps. */
    cr_assert_float_eq(gpt2_tokens_entropy(&t), log(4.0), 1e-12);
    uint16_t same[3] = {7, 7, 7};
    t = (gpt2_tokens){same, 3, 0};
    cr_assert_float_eq(gpt2_tokens_entropy(&t), 0.0, 1e-12);
}

/* --- batches --------------------------------------------------------------------------------- */

Test(gpt2_io, sequential_batches_are_llmc_windows) {
    /* Tokens 0..99 from a real file: with B = 2, T = 5 llm.c reads batch k from position 10k
     * (inputs tokens[10k, 10k + 10), targets one later), while 10k + 11 <= 100: 9 batches, then
     * it starts over. */
    const char *p = path_of("seq.bin");
    write_shard(p, GPT2_SHARD_MAGIC, 1, 100, 100);
    gpt2_tokens t;
    cr_assert_eq(gpt2_tokens_load(p, GPT2_DATA_AUTO, &t, err, sizeof err), MW_OK, "%s", err);
    gpt2_batch b;
    cr_assert_eq(gpt2_batch_new(2, 5, &b), MW_OK);
    cr_assert_eq(gpt2_batch_count(&t, 2, 5), 9);
    cr_assert_eq(gpt2_batch_check(&t, 2, 5, 0, "seq.bin", err, sizeof err), MW_OK);
    for (int k = 0; k < 20; k++) {
        gpt2_batch_sequential(&b, &t, k);
        int base = (k % 9) * 10;
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < 5; i++) {
                cr_assert_eq(b.tokens[s * 5 + i], base + s * 5 + i, "batch %d seq %d pos %d", k, s,
                             i);
                cr_assert_eq(b.targets[s * 5 + i], base + s * 5 + i + 1);
            }
    }
    mw_feed feeds[2];
    gpt2_batch_feeds(&b, feeds);
    cr_assert_str_eq(feeds[0].name, "tokens");
    cr_assert_str_eq(feeds[1].name, "targets");
    cr_assert_eq(feeds[0].count, 10);
    cr_assert_eq(feeds[1].data, b.targets);
    gpt2_batch_free(&b);
    gpt2_tokens_free(&t);
}

Test(gpt2_io, batch_needs_enough_tokens) {
    uint16_t ids[10] = {0};
    gpt2_tokens t = {ids, 10, 0};
    cr_assert_eq(gpt2_batch_check(&t, 2, 5, 0, "tiny.txt", err, sizeof err), MW_ERR_INVALID);
    cr_assert(strstr(err, "tiny.txt has 10 tokens") && strstr(err, "at least 11"), "%s", err);
    cr_assert_eq(gpt2_batch_check(&t, 2, 5, 1, "tiny.txt", err, sizeof err), MW_OK);
    cr_assert_eq(gpt2_batch_check(&t, 2, 10, 1, "tiny.txt", err, sizeof err), MW_ERR_INVALID);
    cr_assert_eq(gpt2_batch_count(&t, 2, 5), 0);
}

Test(gpt2_io, random_batches_are_seeded_windows) {
    uint16_t ids[1000];
    for (int i = 0; i < 1000; i++) ids[i] = (uint16_t)i;
    gpt2_tokens t = {ids, 1000, 0};
    gpt2_batch a, b;
    cr_assert_eq(gpt2_batch_new(4, 16, &a), MW_OK);
    cr_assert_eq(gpt2_batch_new(4, 16, &b), MW_OK);
    gpt2_rng r1, r2;
    gpt2_rng_seed(&r1, 7);
    gpt2_rng_seed(&r2, 7);
    int differs = 0;
    for (int step = 0; step < 50; step++) {
        gpt2_batch_random(&a, &t, &r1);
        gpt2_batch_random(&b, &t, &r2);
        cr_assert_arr_eq(a.tokens, b.tokens, sizeof(int32_t) * 64);
        for (int s = 0; s < 4; s++) {
            const int32_t *tok = a.tokens + s * 16, *tgt = a.targets + s * 16;
            cr_assert(tok[0] >= 0 && tok[15] + 1 <= 999);
            for (int i = 0; i < 16; i++) {
                cr_assert_eq(tok[i], tok[0] + i); /* one contiguous window */
                cr_assert_eq(tgt[i], tok[i] + 1);
            }
            differs |= tok[0] != a.tokens[0];
        }
    }
    cr_assert(differs, "every window started at the same place");
    gpt2_rng_seed(&r2, 8);
    gpt2_batch_random(&b, &t, &r2);
    gpt2_rng_seed(&r1, 7);
    gpt2_batch_random(&a, &t, &r1);
    cr_assert(memcmp(a.tokens, b.tokens, sizeof(int32_t) * 64) != 0, "seeds 7 and 8 agree");
    gpt2_batch_free(&a);
    gpt2_batch_free(&b);
}

/* --- the arithmetic corpus ------------------------------------------------------------------- */

Test(gpt2_io, corpus_is_deterministic_and_correct) {
    gpt2_tokens a, b, c;
    cr_assert_eq(gpt2_corpus_generate(GPT2_CORPUS_SEED, 200000, &a), MW_OK);
    cr_assert_eq(gpt2_corpus_generate(GPT2_CORPUS_SEED, 200000, &b), MW_OK);
    cr_assert_eq(gpt2_corpus_generate(GPT2_CORPUS_SEED + 1, 200000, &c), MW_OK);
    cr_assert(a.count >= 200000 && a.count < 200016);
    cr_assert_eq(a.count, b.count);
    cr_assert_arr_eq(a.ids, b.ids, sizeof(uint16_t) * (size_t)a.count);
    cr_assert(c.count != a.count || memcmp(a.ids, c.ids, sizeof(uint16_t) * (size_t)a.count));
    cr_assert_eq(a.ids[a.count - 1], '\n');

    /* Every line is correct arithmetic; both operators and every operand length occur. */
    char line[32];
    int n = 0, lines = 0, plus = 0, minus = 0, lengths[4] = {0};
    for (int64_t i = 0; i < a.count; i++) {
        cr_assert_lt(a.ids[i], 128);
        if (a.ids[i] != '\n') {
            cr_assert_lt(n, 31, "line %d too long", lines);
            line[n++] = (char)a.ids[i];
            continue;
        }
        line[n] = '\0';
        cr_assert_eq(gpt2_corpus_check_line(line, (size_t)n), GPT2_LINE_CORRECT, "line %d: %s",
                     lines, line);
        int a_len = (int)strcspn(line, "+-");
        plus += line[a_len] == '+';
        minus += line[a_len] == '-';
        lengths[a_len]++;
        lines++;
        n = 0;
    }
    cr_assert_gt(lines, 15000);
    cr_assert(plus > lines / 3 && minus > lines / 3, "+ %d, - %d of %d", plus, minus, lines);
    for (int len = 1; len <= 3; len++) cr_assert_gt(lengths[len], lines / 10);
    gpt2_tokens_free(&a);
    gpt2_tokens_free(&b);
    gpt2_tokens_free(&c);
}

Test(gpt2_io, corpus_lines_are_classified) {
#define LINE(s) (s), sizeof(s) - 1
    cr_assert_eq(gpt2_corpus_check_line(LINE("123+456=579")), GPT2_LINE_CORRECT);
    cr_assert_eq(gpt2_corpus_check_line(LINE("907-46=861")), GPT2_LINE_CORRECT);
    cr_assert_eq(gpt2_corpus_check_line(LINE("0+0=0")), GPT2_LINE_CORRECT);
    cr_assert_eq(gpt2_corpus_check_line(LINE("999+999=1998")), GPT2_LINE_CORRECT);
    cr_assert_eq(gpt2_corpus_check_line(LINE("123+456=578")), GPT2_LINE_WRONG);
    cr_assert_eq(gpt2_corpus_check_line(LINE("5-7=2")), GPT2_LINE_WRONG);
    cr_assert_eq(gpt2_corpus_check_line(LINE("")), GPT2_LINE_MALFORMED);
    cr_assert_eq(gpt2_corpus_check_line(LINE("12+=4")), GPT2_LINE_MALFORMED);
    cr_assert_eq(gpt2_corpus_check_line(LINE("012+3=15")), GPT2_LINE_MALFORMED);
    cr_assert_eq(gpt2_corpus_check_line(LINE("1234+1=1235")), GPT2_LINE_MALFORMED);
    cr_assert_eq(gpt2_corpus_check_line(LINE("1+2=3=")), GPT2_LINE_MALFORMED);
    cr_assert_eq(gpt2_corpus_check_line(LINE("1*2=2")), GPT2_LINE_MALFORMED);
#undef LINE
    int lines, ok, correct;
    const char text[] = "9=9\n1+1=2\n2+2=5\nxx\n3+3=6"; /* the first and last lines are partial */
    gpt2_corpus_score(text, sizeof text - 1, 0, &lines, &ok, &correct);
    cr_assert(lines == 3 && ok == 2 && correct == 1, "%d %d %d", lines, ok, correct);
    gpt2_corpus_score(text + 4, sizeof text - 5, 1, &lines, &ok, &correct);
    cr_assert(lines == 3 && ok == 2 && correct == 1, "%d %d %d", lines, ok, correct);
}

/* --- model files ----------------------------------------------------------------------------- */

/* A GPT-2 small enough to save in a millisecond, with every size different so that a swapped
 * field or tensor shows. */
static const gpt2_config tiny = {
    .layers = 2, .heads = 2, .channels = 8, .max_seq = 6, .vocab = 20, .padded_vocab = 24};

typedef struct model {
    mw_mesh *mesh;
    mw_graph *g;
    gpt2_graph m;
    mw_trainer *tr;
} model;

static model make_model(uint64_t seed) {
    model md = {0};
    cr_assert_eq(mw_mesh_new("cpu:1", NULL, &md.mesh), MW_OK, "%s", mw_last_error());
    cr_assert_eq(mw_graph_new(&md.g), MW_OK);
    mw_graph_set_seed(md.g, seed);
    cr_assert_eq(gpt2_build(md.g, &tiny, &(gpt2_layout){.batch = 2, .seq = 4}, &md.m), MW_OK, "%s",
                 mw_graph_error(md.g));
    mw_trainer_config cfg = {
        .optimizer = {.kind = MW_ADAMW, .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f}};
    cr_assert_eq(mw_trainer_new(md.g, md.m.loss, md.mesh, &cfg, &md.tr), MW_OK, "%s",
                 mw_last_error());
    return md;
}

static void free_model(model *md) {
    mw_trainer_free(md->tr);
    mw_graph_free(md->g);
    mw_mesh_free(md->mesh);
}

/* One AdamW step so that biases and layer norms are no longer at their initial constants. */
static void train_one_step(model *md) {
    int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tgt[8] = {2, 3, 4, 5, 6, 7, 8, 19};
    mw_feed feeds[2] = {{"tokens", tok, 8}, {"targets", tgt, 8}};
    float loss;
    cr_assert_eq(mw_trainer_step(md->tr, feeds, 2, &loss), MW_OK, "%s", mw_last_error());
}

static unsigned char *read_all(const char *path, long *size) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    *size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)*size);
    cr_assert_eq(fread(buf, 1, (size_t)*size, f), (size_t)*size);
    fclose(f);
    return buf;
}

static float *param(mw_trainer *tr, const char *name, int64_t n) {
    float *p = malloc((size_t)n * sizeof *p);
    cr_assert_eq(mw_trainer_read_param(tr, name, p, n), MW_OK, "%s: %s", name, mw_last_error());
    return p;
}

Test(gpt2_io, save_writes_llmc_layout) {
    model md = make_model(1);
    train_one_step(&md);
    const char *p = path_of("m.bin");
    cr_assert_eq(gpt2_save(md.tr, &tiny, p, err, sizeof err), MW_OK, "%s", err);
    DIR *d = opendir(dir); /* no temporary file (".m.bin.tmp-mw-<writer>-<pid>-<n>") is left */
    cr_assert_not_null(d);
    for (struct dirent *e; (e = readdir(d));)
        cr_assert(!strstr(e->d_name, ".tmp"), "%s is left behind", e->d_name);
    closedir(d);

    long size;
    unsigned char *file = read_all(p, &size);
    const int64_t C = 8, L = 2, V = 24, T = 6;
    cr_assert_eq(size, 1024 + 4 * gpt2_num_params(&tiny));
    int32_t h[8];
    memcpy(h, file, sizeof h);
    int32_t want[8] = {20240326, 3, 6, 20, 2, 2, 8, 24};
    cr_assert_arr_eq(h, want, sizeof want);
    for (int i = 8; i < 256; i++) cr_assert_eq(((int32_t *)file)[i], 0);

    /* Offsets (in floats after the header) from llm.c's parameter order, computed here on their
     * own: wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw,
     * fcprojb, lnfw, lnfb, each per-layer one stacked over L. */
    const int64_t sizes[16] = {V * C,         T * C, L * C, L * C, L * 3 * C * C, L * 3 * C,
                               L * C * C,     L * C, L * C, L * C, L * 4 * C * C, L * 4 * C,
                               L * C * 4 * C, L * C, C,     C};
    int64_t off[16] = {0};
    for (int i = 1; i < 16; i++) off[i] = off[i - 1] + sizes[i - 1];
    cr_assert_eq(off[15] + C, gpt2_num_params(&tiny));
    const struct {
        const char *name;
        int64_t at, n;
    } checks[] = {{"wte", off[0], V * C},
                  {"wpe", off[1], T * C},
                  {"h0.ln1w", off[2], C},
                  {"h1.ln1b", off[3] + C, C},
                  {"h1.qkvw", off[4] + 3 * C * C, 3 * C * C},
                  {"h0.qkvb", off[5], 3 * C},
                  {"h1.attprojw", off[6] + C * C, C * C},
                  {"h1.attprojb", off[7] + C, C},
                  {"h0.ln2w", off[8], C},
                  {"h1.ln2b", off[9] + C, C},
                  {"h0.fcw", off[10], 4 * C * C},
                  {"h1.fcb", off[11] + 4 * C, 4 * C},
                  {"h1.fcprojw", off[12] + 4 * C * C, 4 * C * C},
                  {"h1.fcprojb", off[13] + C, C},
                  {"lnfw", off[14], C},
                  {"lnfb", off[15], C}};
    for (size_t i = 0; i < sizeof checks / sizeof *checks; i++) {
        float *p_tr = param(md.tr, checks[i].name, checks[i].n);
        cr_assert_arr_eq(p_tr, file + 1024 + 4 * checks[i].at, 4 * (size_t)checks[i].n,
                         "%s is not where llm.c keeps it", checks[i].name);
        free(p_tr);
    }
    free(file);

    gpt2_config c;
    cr_assert_eq(gpt2_read_header(p, &c, err, sizeof err), MW_OK, "%s", err);
    cr_assert_arr_eq(&c, &tiny, sizeof c);
    free_model(&md);
}

Test(gpt2_io, save_load_round_trip_is_bitwise) {
    model a = make_model(1), b = make_model(2);
    train_one_step(&a);
    const char *p = path_of("rt.bin"), *q = path_of("rt2.bin");
    cr_assert_eq(gpt2_save(a.tr, &tiny, p, err, sizeof err), MW_OK, "%s", err);
    float *wa = param(a.tr, "h1.fcw", 256), *wb = param(b.tr, "h1.fcw", 256);
    cr_assert(memcmp(wa, wb, sizeof(float) * 256) != 0, "different seeds gave equal weights");
    free(wb);
    cr_assert_eq(gpt2_load(b.tr, &tiny, p, NULL, err, sizeof err), MW_OK, "%s", err);
    wb = param(b.tr, "h1.fcw", 256);
    cr_assert_arr_eq(wa, wb, sizeof(float) * 256);
    free(wa);
    free(wb);
    /* Every parameter: saving the loaded model gives the same file, byte for byte. */
    cr_assert_eq(gpt2_save(b.tr, &tiny, q, err, sizeof err), MW_OK, "%s", err);
    long n1, n2;
    unsigned char *f1 = read_all(p, &n1), *f2 = read_all(q, &n2);
    cr_assert_eq(n1, n2);
    cr_assert_arr_eq(f1, f2, (size_t)n1);
    free(f1);
    free(f2);
    /* The same batch gives the same loss. */
    int32_t tok[8] = {3, 1, 4, 1, 5, 9, 2, 6}, tgt[8] = {1, 4, 1, 5, 9, 2, 6, 5};
    mw_feed feeds[2] = {{"tokens", tok, 8}, {"targets", tgt, 8}};
    float la, lb;
    cr_assert_eq(mw_trainer_eval(a.tr, feeds, 2, &la), MW_OK);
    cr_assert_eq(mw_trainer_eval(b.tr, feeds, 2, &lb), MW_OK);
    cr_assert_eq(la, lb);
    free_model(&a);
    free_model(&b);
}

Test(gpt2_io, save_replaces_an_existing_file) {
    model md = make_model(1);
    const char *p = path_of("old.bin");
    write_bytes(p, "old", 3);
    cr_assert_eq(gpt2_save(md.tr, &tiny, p, err, sizeof err), MW_OK, "%s", err);
    gpt2_config c;
    cr_assert_eq(gpt2_read_header(p, &c, err, sizeof err), MW_OK, "%s", err);
    char missing_dir[300];
    snprintf(missing_dir, sizeof missing_dir, "%s/no/such/dir/m.bin", dir);
    cr_assert_eq(gpt2_save(md.tr, &tiny, missing_dir, err, sizeof err), MW_ERR_IO);
    cr_assert(strstr(err, "m.bin cannot be written: cannot create a file in") &&
                  strstr(err, "No such file"),
              "%s", err);
    free_model(&md);
}

/* Saves the tiny model, overwrites header int `index` with `value` and returns the path. */
static const char *saved_with_header(model *md, const char *name, int index, int32_t value) {
    const char *p = path_of(name);
    cr_assert_eq(gpt2_save(md->tr, &tiny, p, err, sizeof err), MW_OK, "%s", err);
    FILE *f = fopen(p, "r+b");
    cr_assert_not_null(f);
    fseek(f, 4L * index, SEEK_SET);
    cr_assert_eq(fwrite(&value, 4, 1, f), 1);
    fclose(f);
    return p;
}

/* The untouched parameter that a refused load must leave alone. */
static void expect_untouched(model *md, const float *before) {
    float *now = param(md->tr, "wte", 24 * 8);
    cr_assert_arr_eq(now, before, sizeof(float) * 24 * 8, "a refused load changed wte");
    free(now);
}

Test(gpt2_io, load_rejects_header_that_disagrees) {
    model md = make_model(1);
    float *before = param(md.tr, "wte", 24 * 8);
    /* Each field doubled (still a valid model), with the name the message must give. */
    const struct {
        int index;
        int32_t value;
        const char *field;
    } cases[] = {{2, 12, "maxT (context) is 12 in the file but 6"},
                 {3, 40, "V (vocab) is 40 in the file but 20"},
                 {4, 4, "L (layers) is 4 in the file but 2"},
                 {5, 4, "NH (heads) is 4 in the file but 2"},
                 {6, 16, "C (channels) is 16 in the file but 8"},
                 {7, 48, "Vp (padded vocab) is 48 in the file but 24"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char name[32];
        snprintf(name, sizeof name, "field%d.bin", cases[i].index);
        const char *p = saved_with_header(&md, name, cases[i].index, cases[i].value);
        mw_status st = gpt2_load(md.tr, &tiny, p, NULL, err, sizeof err);
        cr_assert_eq(st, MW_ERR_FORMAT, "field %d: %s", cases[i].index, mw_status_name(st));
        cr_assert(strstr(err, cases[i].field) && strstr(err, p), "field %d: %s", cases[i].index,
                  err);
        expect_untouched(&md, before);
    }
    free(before);
    free_model(&md);
}

Test(gpt2_io, load_rejects_bad_magic_version_and_sizes) {
    model md = make_model(1);
    float *before = param(md.tr, "wte", 24 * 8);
    const char *p = saved_with_header(&md, "magic.bin", 0, 1234);
    cr_assert_eq(gpt2_load(md.tr, &tiny, p, NULL, err, sizeof err), MW_ERR_FORMAT);
    cr_assert(strstr(err, "magic 1234") && strstr(err, "20240326"), "%s", err);

    p = saved_with_header(&md, "bf16.bin", 1, 5);
    cr_assert_eq(gpt2_load(md.tr, &tiny, p, NULL, err, sizeof err), MW_ERR_FORMAT);
    cr_assert(strstr(err, "version 5") && strstr(err, "bf16") && strstr(err, "not supported"), "%s",
              err);

    p = saved_with_header(&md, "v2.bin", 1, 2);
    cr_assert_eq(gpt2_load(md.tr, &tiny, p, NULL, err, sizeof err), MW_ERR_FORMAT);
    cr_assert(strstr(err, "version 2"), "%s", err);

    p = saved_with_header(&md, "heads.bin", 5, 3); /* 8 channels do not split into 3 heads */
    gpt2_config c;
    cr_assert_eq(gpt2_read_header(p, &c, err, sizeof err), MW_ERR_FORMAT);
    cr_assert(strstr(err, "divisible"), "%s", err);

    p = path_of("token_shard.bin");
    write_shard(p, GPT2_SHARD_MAGIC, 1, 10, 10);
    cr_assert_eq(gpt2_load(md.tr, &tiny, p, NULL, err, sizeof err), MW_ERR_FORMAT);
    cr_assert(strstr(err, "token shard"), "%s", err);

    p = path_of("empty_model.bin");
    write_bytes(p, "", 0);
    cr_assert_eq(gpt2_load(md.tr, &tiny, p, NULL, err, sizeof err), MW_ERR_FORMAT);
    cr_assert(strstr(err, "1024 bytes") && strstr(err, "has 0"), "%s", err);
    expect_untouched(&md, before);
    free(before);
    free_model(&md);
}

Test(gpt2_io, load_rejects_truncated_or_long_file) {
    model md = make_model(1);
    float *before = param(md.tr, "wte", 24 * 8);
    const char *p = path_of("full.bin");
    cr_assert_eq(gpt2_save(md.tr, &tiny, p, err, sizeof err), MW_OK, "%s", err);
    long size;
    unsigned char *file = read_all(p, &size);
    char want[64], found[64];
    snprintf(want, sizeof want, "%ld bytes", size);

    const char *cut = path_of("cut.bin");
    write_bytes(cut, file, (size_t)size - 4);
    snprintf(found, sizeof found, "found %ld (truncated)", size - 4);
    cr_assert_eq(gpt2_load(md.tr, &tiny, cut, NULL, err, sizeof err), MW_ERR_FORMAT);
    cr_assert(strstr(err, want) && strstr(err, found), "%s", err);
    gpt2_config c;
    cr_assert_eq(gpt2_read_header(cut, &c, err, sizeof err), MW_ERR_FORMAT);

    const char *header_only = path_of("header_only.bin");
    write_bytes(header_only, file, 1024);
    cr_assert_eq(gpt2_load(md.tr, &tiny, header_only, NULL, err, sizeof err), MW_ERR_FORMAT);
    cr_assert(strstr(err, "found 1024"), "%s", err);

    unsigned char *longer = calloc(1, (size_t)size + 8);
    memcpy(longer, file, (size_t)size);
    const char *extra = path_of("extra.bin");
    write_bytes(extra, longer, (size_t)size + 8);
    cr_assert_eq(gpt2_load(md.tr, &tiny, extra, NULL, err, sizeof err), MW_ERR_FORMAT);
    cr_assert(strstr(err, "trailing"), "%s", err);
    expect_untouched(&md, before);
    free(longer);
    free(file);
    free(before);
    free_model(&md);
}

Test(gpt2_io, sequence_longer_than_context_is_an_error) {
    mw_graph *g;
    gpt2_graph m;
    cr_assert_eq(mw_graph_new(&g), MW_OK);
    /* The position table has max_seq rows: the model cannot be traced for longer sequences (the
     * gpt2 example checks --seq against the context before it builds, with its own message). */
    mw_status st = gpt2_build(g, &tiny, &(gpt2_layout){.batch = 2, .seq = tiny.max_seq + 1}, &m);
    cr_assert_eq(st, MW_ERR_SHAPE, "%s", mw_status_name(st));
    cr_assert(strstr(mw_graph_error(g), "Ctx"), "%s", mw_graph_error(g));
    mw_graph_free(g);
}
