/* libFuzzer harness: the safetensors reader (mw_safetensors_parse) on arbitrary bytes, then every
 * accessor on what it accepted: tensors listed, looked up by name and read as f32. */
#include <stdint.h>
#include <stdlib.h>

#include "meshwit.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mw_safetensors *f;
    if (mw_safetensors_parse(data, size, "fuzz", &f) != MW_OK) return 0;
    mw_safetensors_metadata(f, "format");
    for (int i = 0; i < mw_safetensors_count(f); i++) {
        mw_stored_tensor t, again;
        if (mw_safetensors_tensor(f, i, &t) != MW_OK) abort();
        if (mw_safetensors_find(f, t.name, &again) != MW_OK || again.count != t.count) abort();
        if (t.count > (1 << 20)) continue;
        float *dst = malloc((size_t)(t.count ? t.count : 1) * sizeof *dst);
        if (!dst) continue;
        mw_safetensors_read(f, t.name, dst, t.count);
        free(dst);
    }
    mw_safetensors_close(f);
    return 0;
}
