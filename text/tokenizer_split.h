/* Internal: the regexes that cut text into words before BPE, each written out by hand over the
 * classes of text/unicode.h (no regex engine): GPT-2's (the ByteLevel pre-tokenizer's own, and a
 * Split with the same pattern), and the Split patterns of Llama 3 and Qwen2. Each gives the end
 * of the match at a position, as Oniguruma (inside Hugging Face tokenizers) finds it: the
 * alternatives in order, the first that matches wins. Every character matches some alternative,
 * so the matches tile the text. */
#ifndef MW__TEXT_TOKENIZER_SPLIT_H
#define MW__TEXT_TOKENIZER_SPLIT_H

#include <stddef.h>
#include <stdint.h>

/* The patterns, as a tokenizer.json writes them (JSON escapes undone). */
#define MW__PATTERN_GPT2                                                                           \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define MW__PATTERN_LLAMA3                                                                         \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "                     \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define MW__PATTERN_QWEN2                                                                          \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "                          \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

typedef enum mw__split {
    MW__SPLIT_NONE = 0, /* no Split pre-tokenizer */
    MW__SPLIT_GPT2,
    MW__SPLIT_LLAMA3,
    MW__SPLIT_QWEN2,
} mw__split;

/* The pattern whose text is p[0, n), or MW__SPLIT_NONE when it is none of the above. */
mw__split mw__split_pattern(const char *p, size_t n);

/* A short name for messages: "Llama 3's". */
const char *mw__split_name(mw__split which);

/* Fills the ASCII class table the functions below read (once; any thread). */
void mw__split_init(void);

/* The end of `which`'s match at i (< n) in s[0, n). mw__split_init first. */
size_t mw__split_end(mw__split which, const uint8_t *s, size_t i, size_t n);

/* The class (unicode.h) of the character at s[i] (i < n) and its length in *len: a byte that
 * does not start a valid UTF-8 sequence is a character of class "other". mw__split_init first. */
int mw__split_class(const uint8_t *s, size_t i, size_t n, size_t *len);

#endif
