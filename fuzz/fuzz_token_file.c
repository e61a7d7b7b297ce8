/* libFuzzer harness: llm.c token shards and text files (gpt2_tokens_load) on arbitrary bytes,
 * then the vocabulary check a trainer runs before its first batch. */
#include <stdint.h>

#include "fuzz_common.h"
#include "gpt2_data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size);
    char err[512];
    for (int f = GPT2_DATA_AUTO; f <= GPT2_DATA_SHARD; f++) {
        gpt2_tokens t = {0};
        if (gpt2_tokens_load(path, (gpt2_data_format)f, &t, err, sizeof err) == MW_OK)
            gpt2_tokens_check_vocab(&t, 50257, "fuzz", err, sizeof err);
        gpt2_tokens_free(&t);
    }
    return 0;
}
