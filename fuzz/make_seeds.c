/* Writes one valid input per harness into the folder given, so fuzzing starts from files that
 * reach deep into each parser: a checkpoint, an llm.c model file, a token shard and a safetensors
 * file. */
#include <stdio.h>
#include <string.h>

#include "gpt2_data.h"
#include "gpt2_model.h"
#include "meshwit.h"

static int write_tokenizer_seeds(const char *dir);

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: make_seeds DIR\n");
        return 2;
    }
    const gpt2_config c = {
        .layers = 1, .heads = 2, .channels = 8, .max_seq = 4, .vocab = 16, .padded_vocab = 16};
    mw_graph *g;
    mw_mesh *mesh;
    mw_trainer *tr;
    gpt2_graph m;
    mw_trainer_config cfg = {
        .optimizer = {MW_ADAMW, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f}};
    char path[4096], err[512];
    if (mw_graph_new(&g) || gpt2_build(g, &c, &(gpt2_layout){.batch = 2, .seq = 4}, &m) ||
        mw_mesh_new("cpu:1", "X", &mesh) || mw_trainer_new(g, m.loss, mesh, &cfg, &tr)) {
        fprintf(stderr, "make_seeds: %s\n", mw_last_error());
        return 1;
    }
    int rc = 0;
    snprintf(path, sizeof path, "%s/checkpoint/seed.mwc", argv[1]);
    rc |= mw_trainer_save(tr, path, "pos", 3) != MW_OK;
    snprintf(path, sizeof path, "%s/model_file/seed.bin", argv[1]);
    rc |= gpt2_save(tr, &c, path, err, sizeof err) != MW_OK;
    snprintf(path, sizeof path, "%s/safetensors/seed.safetensors", argv[1]);
    rc |= mw_trainer_save_weights(tr, path, NULL, 0) != MW_OK;
    snprintf(path, sizeof path, "%s/token_file/seed.bin", argv[1]);
    FILE *f = fopen(path, "wb");
    int32_t header[GPT2_HEADER_INTS] = {GPT2_SHARD_MAGIC, GPT2_SHARD_VERSION, 8};
    uint16_t tokens[8] = {1, 2, 3, 4, 5, 6, 7, 50256};
    rc |=
        !f || fwrite(header, sizeof header, 1, f) != 1 || fwrite(tokens, sizeof tokens, 1, f) != 1;
    if (f) fclose(f);
    rc |= write_tokenizer_seeds(argv[1]);
    if (rc) fprintf(stderr, "make_seeds: could not write the seeds under %s\n", argv[1]);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    return rc;
}

/* The tokenizer harness reads every input both as a tokenizer.json and as text: a small
 * tokenizer.json with an added token (single_word, lstrip), one with Llama 3's Split and template
 * and Qwen2's NFC, the prefix-space variant of the test data, and text in several scripts with the
 * special token and bytes that are not UTF-8. */
static int write_seed(const char *dir, const char *name, const void *data, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer/%s", dir, name);
    FILE *f = fopen(path, "wb");
    int bad = !f || fwrite(data, 1, n, f) != n;
    if (f) bad |= fclose(f) != 0;
    return bad;
}

static int write_tokenizer_seeds(const char *dir) {
    static const char tiny[] =
        "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,\n"
        " \"added_tokens\": [{\"id\": 5, \"content\": \"<|endoftext|>\", \"single_word\": true,\n"
        "   \"lstrip\": true, \"rstrip\": false, \"normalized\": false, \"special\": true}],\n"
        " \"normalizer\": null,\n"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true,\n"
        "   \"trim_offsets\": true, \"use_regex\": true},\n"
        " \"post_processor\": {\"type\": \"ByteLevel\"}, \"decoder\": {\"type\": \"ByteLevel\"},\n"
        " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": \"a\", \"fuse_unk\": "
        "true,\n"
        "   \"byte_fallback\": true,\n"
        "   \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"<0xC4>\": 3, \"<0xA0>\": 4},\n"
        "   \"merges\": [\"a b\"]}}\n";
    static const char text[] = "It's 42 o'clock \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 "
                               "\xe4\xbd\xa0\xe5\xa5\xbd<|endoftext|>  \t\n\n x\x80\xff\xc3 "
                               "e\xcc\x81 \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd";
    /* Llama 3's pre-tokenizer and post-processor, Qwen2's normalizer */
    static const char split[] =
        "{\"version\": \"1.0\",\n"
        " \"added_tokens\": [{\"id\": 3, \"content\": \"<|begin_of_text|>\", \"special\": true,\n"
        "   \"normalized\": false}],\n"
        " \"normalizer\": {\"type\": \"NFC\"},\n"
        " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [\n"
        "   {\"type\": \"Split\", \"pattern\": {\"Regex\": "
        "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "
        "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\n"
        "    \"behavior\": \"Isolated\", \"invert\": false},\n"
        "   {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]},\n"
        " \"post_processor\": {\"type\": \"Sequence\", \"processors\": [{\"type\": "
        "\"ByteLevel\"},\n"
        "   {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\":\n"
        "    \"<|begin_of_text|>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": "
        "0}}],\n"
        "    \"special_tokens\": {\"<|begin_of_text|>\": {\"id\": \"<|begin_of_text|>\", \"ids\": "
        "[3],\n"
        "     \"tokens\": [\"<|begin_of_text|>\"]}}}]},\n"
        " \"decoder\": {\"type\": \"ByteLevel\"},\n"
        " \"model\": {\"type\": \"BPE\", \"ignore_merges\": true,\n"
        "   \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [[\"a\", \"b\"]]}}\n";
    int rc = write_seed(dir, "tiny.json", tiny, sizeof tiny - 1);
    rc |= write_seed(dir, "split.json", split, sizeof split - 1);
    rc |= write_seed(dir, "text.txt", text, sizeof text - 1);
    char path[4096];
    const char *file = __FILE__, *slash = strrchr(file, '/');
    snprintf(path, sizeof path, "%.*s/../tests/data/tokenizer/variants/prefix_space.json",
             slash ? (int)(slash - file) : 1, slash ? file : ".");
    FILE *f = fopen(path, "rb");
    char buf[65536];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    rc |= !n || write_seed(dir, "prefix_space.json", buf, n);
    return rc;
}
