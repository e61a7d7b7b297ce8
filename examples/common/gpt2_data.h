/* Token data for GPT-2: byte-level text, llm.c token shards, the built-in arithmetic corpus, the
 * train/validation split and the batches fed to a trainer.
 *
 * Tokens are held as uint16 (as in llm.c's shards): byte-level text uses ids 0..255, GPT-2's BPE
 * ids 0..50256. A batch is a pair of global [B, T] int32 arrays, "tokens" and "targets" (targets
 * are the tokens shifted by one); the trainer shards both along Batch.
 *
 * Every loader returns MW_OK or an error with a message written to err (always terminated):
 * MW_ERR_IO (a file that cannot be opened or read), MW_ERR_FORMAT (a damaged or mismatched
 * file), MW_ERR_INVALID (a token outside the model's vocabulary, data too short for a batch),
 * MW_ERR_NOMEM. Messages name the file. */
#ifndef GPT2_DATA_H
#define GPT2_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "meshwit.h"

#define GPT2_SHARD_MAGIC 20240520   /* llm.c token shard: header[0] */
#define GPT2_SHARD_VERSION 1        /* header[1]; header[2] is the token count */
#define GPT2_HEADER_INTS 256        /* both llm.c file kinds start with 256 int32 */
#define GPT2_CORPUS_SEED 20240901   /* the default corpus, the same on every run */
#define GPT2_CORPUS_BYTES (3 << 19) /* 1.5 MiB of arithmetic lines */

/* --- random numbers (splitmix64: small, seedable, the same on every platform) ---------------- */

typedef struct gpt2_rng {
    uint64_t state;
} gpt2_rng;

void gpt2_rng_seed(gpt2_rng *r, uint64_t seed);
uint64_t gpt2_rng_next(gpt2_rng *r);
/* Uniform in [0, 1). */
double gpt2_rng_uniform(gpt2_rng *r);
/* Uniform in [0, n), unbiased; n > 0. */
uint64_t gpt2_rng_below(gpt2_rng *r, uint64_t n);

/* --- token sets ---------------------------------------------------------------------------- */

typedef struct gpt2_tokens {
    uint16_t *ids;
    int64_t count;
    int owned; /* 1: ids was allocated by a loader and gpt2_tokens_free releases it; 0: a view */
} gpt2_tokens;

typedef enum gpt2_data_format {
    GPT2_DATA_AUTO = 0, /* a token shard when the name ends in ".bin" or the magic matches */
    GPT2_DATA_TEXT,     /* any file as bytes */
    GPT2_DATA_SHARD     /* an llm.c token shard */
} gpt2_data_format;

/* Every byte of the file at `path` is one token (vocabulary 256). An empty file is
 * MW_ERR_FORMAT. */
mw_status gpt2_tokens_load_text(const char *path, gpt2_tokens *out, char *err, size_t errsize);

/* The text of the file at `path` encoded by tok (meshwit/tokenizer.h) into token ids, which
 * must fit uint16 (MW_ERR_UNSUPPORTED naming the limit otherwise); the seconds encoding took to
 * *seconds when not NULL. An empty file is MW_ERR_FORMAT. */
mw_status gpt2_tokens_encode_text(const char *path, mw_tokenizer *tok, gpt2_tokens *out,
                                  double *seconds, char *err, size_t errsize);

/* An llm.c token shard: checks the magic, the version and that the header's token count matches
 * the file size exactly (MW_ERR_FORMAT with both sizes when it does not). */
mw_status gpt2_tokens_load_shard(const char *path, gpt2_tokens *out, char *err, size_t errsize);

/* The format `format` means for `path`: GPT2_DATA_TEXT or GPT2_DATA_SHARD (AUTO is resolved: a
 * name ending in ".bin" or a file starting with the shard magic is a shard). */
gpt2_data_format gpt2_data_detect(const char *path, gpt2_data_format format);

/* Either of the above, by gpt2_data_detect(path, format). */
mw_status gpt2_tokens_load(const char *path, gpt2_data_format format, gpt2_tokens *out, char *err,
                           size_t errsize);

/* The default corpus: lines of correct arithmetic such as "123+456=579\n" and "907-46=861\n"
 * (operands of 1 to 3 digits, + or -, never a negative result), whole lines until at least
 * `bytes` bytes, all drawn from `seed`. Byte tokens. */
mw_status gpt2_corpus_generate(uint64_t seed, int64_t bytes, gpt2_tokens *out);

/* Frees an owned token set (a view or a zeroed struct is left alone) and zeroes it. */
void gpt2_tokens_free(gpt2_tokens *t);

/* Views of the first `count - count * val_fraction` tokens (train) and the rest (val) of `all`,
 * which must outlive them. val_fraction in (0, 1). */
void gpt2_tokens_split(const gpt2_tokens *all, double val_fraction, gpt2_tokens *train,
                       gpt2_tokens *val);

/* MW_OK when every token is below `vocab`; otherwise MW_ERR_INVALID naming the first bad token,
 * its position and the vocabulary size. `what` names the set in the message ("data.bin"). */
mw_status gpt2_tokens_check_vocab(const gpt2_tokens *t, int vocab, const char *what, char *err,
                                  size_t errsize);

/* Entropy in nats of the tokens' unigram distribution: the loss of a model that knows only the
 * token frequencies, the baseline a trained model must beat. NAN when empty or out of memory. */
double gpt2_tokens_entropy(const gpt2_tokens *t);

/* --- the arithmetic corpus's lines ----------------------------------------------------------- */

typedef enum gpt2_line_kind {
    GPT2_LINE_MALFORMED = 0, /* not "A+B=C" or "A-B=C" with 1-3 digit operands */
    GPT2_LINE_WRONG = 1,     /* well formed, but C is not the answer */
    GPT2_LINE_CORRECT = 2
} gpt2_line_kind;

/* Classifies one line (without its newline) of `len` bytes. */
gpt2_line_kind gpt2_corpus_check_line(const char *line, size_t len);

/* Counts the complete lines of `text` (those between two newlines, or from the start when
 * `from_line_start`) and how many are well formed and correct. */
void gpt2_corpus_score(const char *text, size_t len, int from_line_start, int *lines,
                       int *well_formed, int *correct);

/* --- batches ---------------------------------------------------------------------------------- */

typedef struct gpt2_batch {
    int batch, seq;
    int32_t *tokens;  /* [batch, seq] */
    int32_t *targets; /* [batch, seq]: tokens shifted by one */
} gpt2_batch;

/* Allocates a batch of batch x seq; MW_ERR_NOMEM or MW_ERR_INVALID (a size below 1). */
mw_status gpt2_batch_new(int batch, int seq, gpt2_batch *out);
void gpt2_batch_free(gpt2_batch *b);

/* The feeds of one step: feeds[0] = "tokens", feeds[1] = "targets" (borrowing b's arrays). */
void gpt2_batch_feeds(const gpt2_batch *b, mw_feed feeds[2]);

/* Sequential batches per pass over t: floor((count - 1) / (B * T)), 0 when t is too short. */
int64_t gpt2_batch_count(const gpt2_tokens *t, int batch, int seq);

/* MW_OK when t holds enough tokens for a sequential batch (B * T + 1) or, when `random`, for a
 * random one (T + 1); MW_ERR_INVALID naming `what` and both counts otherwise. */
mw_status gpt2_batch_check(const gpt2_tokens *t, int batch, int seq, int random, const char *what,
                           char *err, size_t errsize);

/* Batch k in file order, as llm.c's loader reads a shard without shuffling: batch k covers tokens
 * [p, p + B*T + 1) with p = (k mod gpt2_batch_count) * B*T; sequence b takes tokens
 * [p + b*T, p + b*T + T) and its targets start one later. Needs gpt2_batch_check to pass. */
void gpt2_batch_sequential(gpt2_batch *b, const gpt2_tokens *t, int64_t k);

/* B windows of T + 1 tokens at starts drawn uniformly from rng, one after another. Needs
 * gpt2_batch_check(random = 1) to pass. */
void gpt2_batch_random(gpt2_batch *b, const gpt2_tokens *t, gpt2_rng *rng);

#endif
