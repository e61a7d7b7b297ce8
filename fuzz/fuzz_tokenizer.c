/* libFuzzer harness: the tokenizer reader (mw_tokenizer_load) on arbitrary bytes as a
 * tokenizer.json, and encoding on the same bytes as text: with the test tokenizer
 * (tests/data/tokenizer/tokenizer.json) and the Llama 3 style one (llama3.json, with its BOS)
 * decode(encode(x)) must give x back byte for byte; with the prefix-space variant (added tokens
 * with lstrip and rstrip), the Qwen2 style one (NFC) and the single_word ones (added tokens that
 * must stand alone, with and without NFC) the ids must stay within mw_tokenizer_max_ids and
 * decode; with whatever the bytes loaded as, the same. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "meshwit.h"

/* tests/data/tokenizer/<name>, from this file's folder (the fuzz script runs from the root). */
static mw_tokenizer *load_fixed(const char *name) {
    char path[4096];
    const char *file = __FILE__, *slash = strrchr(file, '/');
    snprintf(path, sizeof path, "%.*s/../tests/data/tokenizer/%s", slash ? (int)(slash - file) : 1,
             slash ? file : ".", name);
    mw_tokenizer *tok;
    mw_status st = mw_tokenizer_load(path, &tok);
    if (st != MW_OK) fuzz_setup_failed(path, st);
    return tok;
}

/* Encodes, checks the count against the bound, decodes; aborts on any inconsistency. With
 * `exact`, the decoded bytes must be the text. */
static void encode_decode(mw_tokenizer *tok, const uint8_t *data, size_t size, int exact) {
    size_t cap = mw_tokenizer_max_ids(tok, size), n = 0, len = 0;
    int32_t *ids = malloc((cap ? cap : 1) * sizeof *ids);
    char *back = malloc(4 * size + 64);
    if (!ids || !back) abort();
    if (mw_tokenizer_encode_with(tok, (const char *)data, size, MW_ENCODE_ADD_SPECIAL, ids, cap,
                                 &n) != MW_OK)
        abort();
    if (n > cap) abort();
    int32_t bos;
    size_t skip = mw_tokenizer_bos_id(tok, &bos) == MW_OK; /* it decodes to its own text */
    if (skip && (n == 0 || ids[0] != bos)) abort();
    mw_status st = mw_tokenizer_decode(tok, ids + skip, n - skip, back, 4 * size + 64, &len);
    if (st != MW_OK && st != MW_ERR_SHAPE) abort();
    if (exact && (st != MW_OK || len != size || memcmp(back, data, size) != 0)) abort();
    free(ids);
    free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static mw_tokenizer *fixed, *prefixed, *llama3, *qwen2, *word, *word_nfc;
    if (!fixed) {
        fixed = load_fixed("tokenizer.json");
        prefixed = load_fixed("variants/prefix_space.json");
        llama3 = load_fixed("llama3.json");
        qwen2 = load_fixed("qwen2.json");
        word = load_fixed("single_word/plain.json");
        word_nfc = load_fixed("single_word/nfc.json");
    }
    encode_decode(fixed, data, size, 1);
    encode_decode(prefixed, data, size, 0);
    encode_decode(llama3, data, size, 1);
    encode_decode(qwen2, data, size, 0);
    encode_decode(word, data, size, 0);
    encode_decode(word_nfc, data, size, 0);
    mw_tokenizer *tok;
    if (mw_tokenizer_load(fuzz_file(data, size), &tok) == MW_OK) {
        encode_decode(tok, data, size, 0);
        mw_tokenizer_free(tok);
    }
    return 0;
}
