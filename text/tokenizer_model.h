/* Internal: building a tokenizer (tokenizer_model.c), shared by the readers of tokenizer.json and
 * of vocab.json + merges.txt (tokenizer_load.c). */
#ifndef MW__TEXT_TOKENIZER_MODEL_H
#define MW__TEXT_TOKENIZER_MODEL_H

#include "text/tokenizer_impl.h"

/* A tokenizer with nothing in it yet (no prefix space, regex on, no unk). */
mw_status mw__tok_new(mw_tokenizer **out);

/* Appends n bytes to the arena; their offset in *off. MW_ERR_NOMEM, MW_ERR_UNSUPPORTED (4 GiB). */
mw_status mw__tok_store(mw_tokenizer *tok, const void *s, size_t n, uint32_t *off);

/* The id of the n bytes at s in the vocabulary, or MW__NO_ID. */
int32_t mw__tok_vocab_id(const mw_tokenizer *tok, const char *s, size_t n);

/* byte_id and the byte-fallback tables, once the vocabulary, prefix and suffix are set. */
mw_status mw__tok_byte_tables(mw_tokenizer *tok);

/* The two passes over the added tokens, once tok->added is complete. */
mw_status mw__tok_added_passes(mw_tokenizer *tok);

/* The decoding table for ids [0, tok->size): vocabulary entry i (of vocab_count) is the id
 * vocab_ids[i] with text arena[offs[i], + lens[i]); then the added tokens. */
mw_status mw__tok_decode_table(mw_tokenizer *tok, const int32_t *vocab_ids, const uint32_t *offs,
                               const uint32_t *lens);

/* The word cache, empty. */
mw_status mw__tok_cache(mw_tokenizer *tok);

#endif
