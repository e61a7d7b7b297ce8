/* meshwit: byte-level BPE tokenizers (GPT-2's, Llama 3's, Qwen2's), token for token as Hugging
 * Face `tokenizers`.
 *
 * Text becomes token ids the way `tokenizers` (0.23) encodes it with a byte-level BPE model, the
 * kind GPT-2, Llama 3 and Qwen2 have and `ByteLevelBPETokenizer` trains:
 *
 *   1. added tokens (`<|endoftext|>`, `<|begin_of_text|>`, `<|im_start|>` and the like, special
 *      or not) are cut out of the text where they appear literally, leftmost-longest, before
 *      anything else: first those with "normalized": false, in the raw text; then the pieces
 *      between are normalized (NFC, when the file says so, as Qwen2's does) and those with
 *      "normalized": true are cut out of the result (the NFC of their content is what is found
 *      there). "lstrip" and "rstrip" make a token take the white space (\s) before or after
 *      it. A token with "single_word" is found only where it stands alone: not right after a
 *      word character nor right before one, in the text it is searched in (the raw text, or a
 *      normalized piece, whose ends are boundaries); its own white space (lstrip, rstrip) is
 *      not looked through. A word character is the Rust regex crate's \w, as `tokenizers` has
 *      it: letters and other Alphabetic characters (as U+2160 and U+24B6), marks, decimal
 *      digits of any script, connector punctuation ('_', U+203F) and U+200C, U+200D; not
 *      emoji, symbols, other numbers ('²', '½') or bytes that are not UTF-8. Where
 *      `tokenizers` finds a single_word token but drops it, its search goes on after it, so a
 *      shorter token at its start or one inside it is not found there either;
 *   2. each piece between them is cut by a Split pre-tokenizer's regex when the file has one:
 *      Llama 3's (one line)
 *        (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|
 *        \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *      Qwen2's (the same with \p{N} for \p{N}{1,3}) or GPT-2's below; then each piece, or each
 *      part of it, goes through ByteLevel: a leading space when "add_prefix_space" is set and it
 *      does not start with one, then GPT-2's regex
 *        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *      (unless "use_regex" is false, as after a Split). The regexes are written out by hand, with
 *      \p{L}, \p{N} and \s (White_Space) as Unicode 16.0.0 defines them, the version of the
 *      Oniguruma regex engine inside `tokenizers`, and (?i) folding as it does (a letter's other
 *      case; also U+017F for s); NFC is that of the crate `tokenizers` runs (Unicode 9.0's
 *      tables, so a mark encoded since has class 0 and a character decomposable since is left
 *      alone);
 *   3. each word's bytes are mapped to GPT-2's printable byte alphabet and merged by BPE: the
 *      pair of lowest merge rank first, the leftmost of equal ranks, exactly as `tokenizers`'
 *      Word::merge_all does (a heap of candidate merges, so a word of n bytes takes
 *      O(n log n)); with "ignore_merges" (Llama 3's) a word that is a token as a whole is that
 *      token; repeated words come from a bounded cache;
 *   4. with MW_ENCODE_ADD_SPECIAL, the tokens the post-processor's template puts around a text
 *      are added (Llama 3's <|begin_of_text|> before it), as encode(text,
 *      add_special_tokens=True) adds them; mw_tokenizer_encode adds none (as
 *      add_special_tokens=False).
 *
 * Input is bytes, not necessarily UTF-8 (the Python API of `tokenizers` cannot even be given
 * invalid UTF-8): a byte that does not start a valid UTF-8 sequence (a stray continuation byte,
 * an overlong form, a surrogate, a sequence cut short) is a character of its own of the "other"
 * class (neither letter, number nor space), so it joins a run of punctuation and is encoded as
 * the byte-level token(s) of that byte. Every byte is thus covered by exactly one token, and
 * mw_tokenizer_decode(mw_tokenizer_encode(x)) == x, byte for byte, for every x, when the
 * vocabulary holds the 256 byte tokens (as every trained byte-level vocabulary does;
 * mw_tokenizer_missing_byte says whether it does) and there is no normalizer (with NFC, it is
 * NFC(x), which is x for text already in NFC, as most is; bytes that are not UTF-8 pass NFC
 * unchanged).
 *
 * Decoding maps each token back to its bytes: an added token to its content, a vocabulary token
 * through GPT-2's byte alphabet (a token with a character outside that alphabet to its own UTF-8
 * bytes, as the ByteLevel decoder does). The result is bytes: where `tokenizers` would put
 * U+FFFD for bytes that are not valid UTF-8 (a sequence of ids cut inside a character), they are
 * returned as they are. (`tokenizers` also passes added tokens through the byte alphabet, which
 * differs only for an added token holding a character such as 'Ġ' or 'é': that is decoded here
 * to the token's own text, so that the round trip above holds.)
 *
 * Files. mw_tokenizer_load reads either
 *   - a `tokenizer.json` of `tokenizers` (Tokenizer.save): "model" of type "BPE" (its "vocab" and
 *     "merges", in the old "a b" or the newer ["a", "b"] form; "unk_token", "fuse_unk",
 *     "byte_fallback", "continuing_subword_prefix", "end_of_word_suffix", "ignore_merges" are
 *     honoured; "dropout" must be null or 0); "normalizer" null or "NFC"; "pre_tokenizer" of
 *     type "ByteLevel" (any "add_prefix_space", "use_regex", "trim_offsets") or a "Sequence" of
 *     a "Split" and a "ByteLevel" (the Split's "pattern" {"Regex": ...} one of the three above,
 *     character for character, "behavior" "Isolated", "invert" false), or of a ByteLevel alone;
 *     "decoder" of type "ByteLevel"; "post_processor" null, "ByteLevel" (it only moves
 *     offsets), "TemplateProcessing" (its "single" template, special tokens around "$A", each
 *     given by its "special_tokens" ids, which must be tokens; "pair" is not read: one text is
 *     encoded at a time) or a "Sequence" of them (at most one TemplateProcessing); "truncation"
 *     and "padding" null; and "added_tokens" ("single_word", "lstrip", "rstrip",
 *     "normalized" and "special" honoured as in step 1; the ids must be those `tokenizers`
 *     would assign: a token's id in "vocab" when it is there, else the next after the
 *     vocabulary; two tokens the same text once normalized are refused, as `tokenizers` finds
 *     one or the other at random);
 *   - or a folder: its `tokenizer.json` when it has one, else GPT-2's original pair `vocab.json`
 *     (token -> id) and `merges.txt` (one merge "a b" per line; lines starting "#version" are
 *     skipped) as `ByteLevelBPETokenizer(vocab, merges)` reads them (no prefix space, regex on),
 *     with `<|endoftext|>`, when vocab.json has it, a special token matched literally in the
 *     text, as Hugging Face's GPT-2 tokenizer adds it (transformers' GPT2TokenizerFast does
 *     exactly that on top of `ByteLevelBPETokenizer(vocab, merges)`).
 * Anything else is refused: MW_ERR_FORMAT for damage (JSON syntax, a value of the wrong type, a
 * missing field, an id given twice, a token listed twice, a merge of tokens that are not in the
 * vocabulary), MW_ERR_UNSUPPORTED for settings this tokenizer does not implement (another model,
 * normalizer, pre-tokenizer, Split pattern or behavior, post-processor or decoder, dropout,
 * truncation, padding), the setting quoted. Each message
 * names the file and the place: "tokenizer.json:12:5: model.vocab["the"]: ..." (line:column,
 * then the JSON path), "merges.txt:17: ...".
 *
 * Thread-safety: a loaded tokenizer is never changed by the calls below except for its word
 * cache, which one call at a time holds (another call made meanwhile, from another thread, runs
 * without it and gives the same ids): every function may be called from any number of threads
 * at once on one tokenizer. mw_tokenizer_free must not race with them. */
#ifndef MESHWIT_TOKENIZER_H
#define MESHWIT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mw_tokenizer mw_tokenizer;

/* Loads the tokenizer at `path` (a tokenizer.json, or a folder: see above) into *out, owned by
 * the caller (mw_tokenizer_free). *out is NULL on failure. Errors: MW_ERR_INVALID (NULL
 * argument, a path too long), MW_ERR_IO (a file that cannot be opened or read, or that is a
 * FIFO or a device, said without blocking; a folder with neither a tokenizer.json nor both
 * vocab.json and merges.txt; the message names the file), MW_ERR_FORMAT, MW_ERR_UNSUPPORTED,
 * MW_ERR_NOMEM. */
mw_status mw_tokenizer_load(const char *path, mw_tokenizer **out);

/* Frees the tokenizer. NULL is a no-op. */
void mw_tokenizer_free(mw_tokenizer *tok);

/* One more than the largest token id (vocabulary and added tokens): every id encode produces is
 * below it. 0 for NULL. (A vocabulary with unassigned ids below it is allowed; decode refuses
 * those ids.) */
int32_t mw_tokenizer_vocab_size(const mw_tokenizer *tok);

/* The files the tokenizer was read from, in the order read: index 0 its tokenizer.json, or 0
 * vocab.json and 1 merges.txt; NULL past the last (and for NULL). Owned by the tokenizer. A
 * program writing files can name them as its inputs (meshwit/file.h), so that an output never
 * replaces one. */
const char *mw_tokenizer_file(const mw_tokenizer *tok, int index);

/* The first byte (0-255) the vocabulary has no token for, in some position of a word (with a
 * continuing_subword_prefix or end_of_word_suffix, each byte has four spellings), and byte
 * fallback does not spell either; -1 when every byte has one (GPT-2's tokenizer); -2 for NULL
 * (no tokenizer: not an answer, with a message in mw_last_error()). Encoding drops such a byte
 * (or writes the unknown token for it), as tokenizers does: the round trip
 * decode(encode(text)) == text holds for every text exactly when this is -1. */
int mw_tokenizer_missing_byte(const mw_tokenizer *tok);

/* The id of the token whose text is the NUL-terminated `token` (an added token's content, or a
 * vocabulary entry as the file spells it, in the byte alphabet: " the" is "Ġthe"). Errors:
 * MW_ERR_NOT_FOUND (no such token; the message names it), MW_ERR_INVALID (NULL argument). */
mw_status mw_tokenizer_token_id(const mw_tokenizer *tok, const char *token, int32_t *id);

/* 1 when `id` is an added token marked "special" (as `<|endoftext|>`), else 0 (also for an id
 * that is not a token, or NULL). */
int mw_tokenizer_is_special(const mw_tokenizer *tok, int32_t id);

/* The most ids a text of `len` bytes can need: len for GPT-2's and every tokenizer without
 * "add_prefix_space" or "byte_fallback" (each id covers at least one byte), 2 * len with
 * add_prefix_space, more when byte_fallback spells a byte as several "<0xXX>" tokens, three times
 * as many with NFC (which makes a text up to 3 times longer: 3 * len for Qwen2's); plus the
 * tokens MW_ENCODE_ADD_SPECIAL adds (Llama 3's: len + 1). SIZE_MAX when that overflows. 0 for
 * NULL. */
size_t mw_tokenizer_max_ids(const mw_tokenizer *tok, size_t len);

/* Encodes the `len` bytes at `text` (any bytes; see above) into ids[0, cap) and sets *n to the
 * number of ids the whole text needs. When that is more than cap, ids holds the first cap of
 * them and the call returns MW_ERR_SHAPE with a message giving both counts: call again with a
 * buffer of *n (ids may be NULL when cap is 0, to ask for the count alone), or size the buffer
 * by mw_tokenizer_max_ids beforehand. Empty text gives no ids. Errors: MW_ERR_SHAPE,
 * MW_ERR_INVALID (NULL argument), MW_ERR_NOMEM (scratch space for a word, or with
 * add_prefix_space a piece, too long for the stack; *n is then 0). */
mw_status mw_tokenizer_encode(mw_tokenizer *tok, const char *text, size_t len, int32_t *ids,
                              size_t cap, size_t *n);

/* Flags of mw_tokenizer_encode_with, or-ed together. */
typedef enum mw_encode_flag {
    /* The special tokens the file's post-processor puts around one text, as tokenizers'
     * encode(text, add_special_tokens=True) adds them (its TemplateProcessing's "single"
     * template): Llama 3's <|begin_of_text|> before the text; none for GPT-2's and Qwen2's,
     * whose post-processor (ByteLevel, or none) adds none. */
    MW_ENCODE_ADD_SPECIAL = 1,
} mw_encode_flag;

/* mw_tokenizer_encode, with `flags` (0 or MW_ENCODE_ADD_SPECIAL; 0 is mw_tokenizer_encode).
 * Errors: those of mw_tokenizer_encode; MW_ERR_INVALID for a flag that is not one of these. */
mw_status mw_tokenizer_encode_with(mw_tokenizer *tok, const char *text, size_t len, unsigned flags,
                                   int32_t *ids, size_t cap, size_t *n);

/* The token the post-processor's template puts before a text (bos) or after it (eos) when it
 * puts exactly one there: Llama 3's bos is <|begin_of_text|>, and it has no eos. A tokenizer.json
 * names no other token for either role (the end of text a model was trained with, such as
 * <|end_of_text|> or <|endoftext|>, is said in transformers' tokenizer_config.json: look it up
 * by name with mw_tokenizer_token_id). Errors: MW_ERR_NOT_FOUND (none, or several: encode an
 * empty text with MW_ENCODE_ADD_SPECIAL to have them all; *id is then -1), MW_ERR_INVALID (NULL
 * argument). */
mw_status mw_tokenizer_bos_id(const mw_tokenizer *tok, int32_t *id);
mw_status mw_tokenizer_eos_id(const mw_tokenizer *tok, int32_t *id);

/* Decodes the n ids into buf[0, cap) (bytes, not terminated; see above for what they are) and
 * sets *len to the number of bytes the whole sequence decodes to. An id that is not a token
 * fails with MW_ERR_INVALID naming its position and value, *len 0. When *len is more than cap,
 * buf holds the first cap bytes and the call returns MW_ERR_SHAPE giving both sizes (buf may be
 * NULL when cap is 0). Errors: MW_ERR_INVALID, MW_ERR_SHAPE. */
mw_status mw_tokenizer_decode(const mw_tokenizer *tok, const int32_t *ids, size_t n, char *buf,
                              size_t cap, size_t *len);

/* "16.0.0": the Unicode version whose letters, numbers and white space the pre-tokenizer
 * follows. */
const char *mw_tokenizer_unicode_version(void);

#ifdef __cplusplus
}
#endif
#endif
