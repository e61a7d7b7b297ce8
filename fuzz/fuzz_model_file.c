/* libFuzzer harness: llm.c model files (gpt2_read_header, then gpt2_load when the header
 * describes the harness's model) on arbitrary bytes. */
#include <stdint.h>

#include "fuzz_common.h"
#include "gpt2_model.h"
#include "meshwit.h"

/* Kept for the whole run (reachable, so not reported as leaks). */
static mw_graph *g;
static mw_mesh *mesh;
static mw_trainer *trainer;
static const gpt2_config config = {
    .layers = 1, .heads = 2, .channels = 8, .max_seq = 4, .vocab = 16, .padded_vocab = 16};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    gpt2_graph m;
    if (mw_graph_new(&g) || gpt2_build(g, &config, 2, 4, NULL, &m) ||
        mw_mesh_new("cpu:1", "X", &mesh) || mw_trainer_new(g, m.loss, mesh, NULL, &trainer))
        return 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size);
    char err[512];
    gpt2_config c;
    if (!path) return 0;
    gpt2_read_header(path, &c, err, sizeof err);
    gpt2_load(trainer, &config, path, err, sizeof err);
    return 0;
}
