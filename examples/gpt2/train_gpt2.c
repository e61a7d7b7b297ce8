/* train_gpt2: GPT-2 trained data parallel on two virtual CPU devices, in one file, as llm.c's
 * train_gpt2.c: every setting fixed at the top, the whole loop in view.
 *
 * The model is the gpt2 program's "tiny" one (4 layers, 4 heads, 128 channels, context 128,
 * byte-level) and the data its default corpus, lines of arithmetic ("123+456=579"), the last 10%
 * held out. Data parallelism is one line: the model's inputs are sharded along Batch over the
 * mesh axis X (Batch -> Batch@X), so each device takes half of every batch; the library inserts
 * the gradients' all-reduce, and every replica takes the same AdamW step. At the end the trained
 * model writes a sample, one byte at a time, through a decoding program with a key/value cache
 * that reads the trainer's parameters in place, each byte drawn from the softmax of its logits
 * by the library's sampler (meshwit/sample.h).
 *
 * gpt2.c beside it is the same loop with every setting a flag (and checkpoints, files, tensor
 * parallelism, FSDP, ...). Exit status: 0 done, 1 a library call failed. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gpt2_data.h"
#include "gpt2_model.h"

#define DEVICES "cpu:2" /* two virtual CPU devices (threads of this process): the mesh X -> 2 */
#define B 8             /* sequences per step, split over the devices */
#define T 64            /* tokens per sequence */
#define STEPS 40
#define LR 1e-3f
#define VAL_EVERY 10 /* steps between two validation losses */
#define VAL_BATCHES 4
#define GEN_TOKENS 64
#define SEED 1

/* Stops at the first failed library call, naming it and the library's message. */
#define CHECK(call)                                                                                \
    do {                                                                                           \
        mw_status st_ = (call);                                                                    \
        if (st_ != MW_OK) {                                                                        \
            fprintf(stderr, "train_gpt2: %s: %s: %s\n", #call, mw_strerror(st_), mw_last_error()); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

/* The mean loss of the first VAL_BATCHES batches of val, in file order (the same every time). */
static float val_loss(mw_trainer *tr, gpt2_batch *batch, const gpt2_tokens *val) {
    mw_feed feeds[2];
    gpt2_batch_feeds(batch, feeds);
    float sum = 0.0f;
    for (int k = 0; k < VAL_BATCHES; k++) {
        float loss;
        gpt2_batch_sequential(batch, val, k);
        CHECK(mw_trainer_eval(tr, feeds, 2, &loss));
        sum += loss;
    }
    return sum / VAL_BATCHES;
}

int main(void) {
    /* the model: GPT-2 "tiny", its parameters initialised from SEED */
    gpt2_config config;
    gpt2_preset("tiny", &config);
    mw_graph *graph;
    CHECK(mw_graph_new(&graph));
    mw_graph_set_seed(graph, SEED);
    gpt2_graph model;
    CHECK(
        gpt2_build(graph, &config, &(gpt2_layout){.batch = B, .seq = T, .data_axis = "X"}, &model));

    /* the devices, and a trainer of the model on them: AdamW at a constant learning rate, with
     * GPT-2's beta2, weight decay and gradient clipping (as nanoGPT's) */
    mw_mesh *mesh;
    CHECK(mw_mesh_new(DEVICES, "X", &mesh));
    mw_trainer_config tc = {.optimizer = MW_ADAMW_INIT(LR)};
    tc.optimizer.beta2 = 0.95f;
    tc.optimizer.weight_decay = 0.1f;
    tc.optimizer.grad_clip = 1.0f;
    mw_trainer *trainer;
    CHECK(mw_trainer_new(graph, model.loss, mesh, &tc, &trainer));
    printf("%s\n", mw_mesh_describe(mesh));
    printf("GPT-2: %d layers, %d heads, %d channels, context %d, vocab %d: %lld parameters\n",
           config.layers, config.heads, config.channels, config.max_seq, config.vocab,
           (long long)gpt2_num_params(&config));

    /* the data: the default corpus as bytes, 90% to train on, 10% to validate */
    gpt2_tokens all, train, val;
    CHECK(gpt2_corpus_generate(GPT2_CORPUS_SEED, GPT2_CORPUS_BYTES, &all));
    gpt2_tokens_split(&all, 0.1, &train, &val);
    printf("train %lld tokens, val %lld; the loss of a model that knows only how often each "
           "byte occurs: %.4f\n",
           (long long)train.count, (long long)val.count, gpt2_tokens_entropy(&val));
    gpt2_batch batch;
    CHECK(gpt2_batch_new(B, T, &batch));
    mw_feed feeds[2]; /* "tokens" and "targets" [B, T], the batch's arrays */
    gpt2_batch_feeds(&batch, feeds);
    gpt2_rng rng;
    gpt2_rng_seed(&rng, SEED);

    /* train */
    for (int step = 0; step <= STEPS; step++) {
        if (step % VAL_EVERY == 0) printf("val loss %f\n", val_loss(trainer, &batch, &val));
        if (step == STEPS) break;
        gpt2_batch_random(&batch, &train, &rng); /* B windows of T + 1 bytes */
        double t0 = now_ms();
        float loss;
        CHECK(mw_trainer_step(trainer, feeds, 2, &loss)); /* forward, backward, update */
        printf("step %d: train loss %f (took %.1f ms)\n", step + 1, loss, now_ms() - t0);
    }

    /* sample: one position per run, each layer's keys and values kept in a cache */
    mw_graph *decode;
    CHECK(mw_graph_new(&decode));
    gpt2_graph next;
    CHECK(gpt2_build(decode, &config, &(gpt2_layout){.mode = GPT2_DECODE, .batch = 1}, &next));
    mw_infer *sampler;
    CHECK(mw_infer_from_trainer(
        trainer, decode, &(mw_infer_config){.outputs = &next.logits, .noutputs = 1}, &sampler));
    mw_sample_config how = MW_SAMPLE_CONFIG_INIT; /* temperature 1: the model's own softmax */
    how.seed = SEED;
    mw_sampler *draw;
    CHECK(mw_sampler_new(&how, &draw));
    float *logits = malloc((size_t)config.padded_vocab * sizeof *logits);
    int32_t token = '\n';
    printf("generating:\n---\n");
    for (int32_t pos = 0; logits && pos < GEN_TOKENS; pos++) {
        mw_feed in[2] = {{"tokens", &token, 1}, {"pos", &pos, 1}};
        mw_fetch out = {next.logits, logits, config.padded_vocab};
        CHECK(mw_infer_run(sampler, in, 2, 1, &out, 1));
        CHECK(mw_sampler_draw(draw, logits, config.vocab, &token));
        putchar(token >= ' ' && token < 0x7f ? token : token == '\n' ? '\n' : '?');
    }
    printf("\n---\n");

    free(logits);
    mw_sampler_free(draw);
    mw_infer_free(sampler);
    mw_graph_free(decode);
    gpt2_batch_free(&batch);
    gpt2_tokens_free(&all);
    mw_trainer_free(trainer);
    mw_mesh_free(mesh);
    mw_graph_free(graph);
    return 0;
}
