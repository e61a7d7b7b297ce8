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
    mw_status st;
    if ((st = mw_graph_new(&g))) fuzz_setup_failed("mw_graph_new", st);
    if ((st = gpt2_build(g, &config, &(gpt2_layout){.batch = 2, .seq = 4}, &m)))
        fuzz_setup_failed("gpt2_build", st);
    if ((st = mw_mesh_new("cpu:1", "X", &mesh))) fuzz_setup_failed("mw_mesh_new", st);
    if ((st = mw_trainer_new(g, m.loss, mesh, NULL, &trainer)))
        fuzz_setup_failed("mw_trainer_new", st);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size);
    char err[512];
    gpt2_config c;
    gpt2_read_header(path, &c, err, sizeof err);
    gpt2_load(trainer, &config, path, NULL, err, sizeof err);
    return 0;
}
