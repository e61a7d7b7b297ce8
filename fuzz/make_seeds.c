/* Writes one valid input per harness into the folder given, so fuzzing starts from files that
 * reach deep into each parser: a checkpoint, an llm.c model file, a token shard and a safetensors
 * file. */
#include <stdio.h>
#include <string.h>

#include "gpt2_data.h"
#include "gpt2_model.h"
#include "meshwit.h"

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
    if (mw_graph_new(&g) || gpt2_build(g, &c, 2, 4, NULL, &m) || mw_mesh_new("cpu:1", "X", &mesh) ||
        mw_trainer_new(g, m.loss, mesh, &cfg, &tr)) {
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
    if (rc) fprintf(stderr, "make_seeds: could not write the seeds under %s\n", argv[1]);
    mw_trainer_free(tr);
    mw_mesh_free(mesh);
    mw_graph_free(g);
    return rc;
}
