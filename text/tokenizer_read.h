/* Internal: what the two readers of tokenizer files share (tokenizer_vocab.c reads vocabularies
 * and merges, in either format; tokenizer_load.c reads everything else and puts it together):
 * the state of one load and the messages that name a file and a place in it. */
#ifndef MW__TEXT_TOKENIZER_READ_H
#define MW__TEXT_TOKENIZER_READ_H

#include <stddef.h>
#include <stdint.h>

#include "formats/json.h"
#include "text/tokenizer_model.h"

typedef struct mw__loader {
    mw_tokenizer *tok;
    const char *label; /* the file being read */
    const mw__json *doc;
    /* the vocabulary as read, for the decoding table */
    int32_t *vids;
    uint32_t *voff, *vlen;
    uint8_t *used; /* per id below nused (the vocabulary's size): 1 when the vocabulary has it */
    size_t nused;
    char *scratch; /* a merged token */
    size_t scratch_cap;
} mw__loader;
/* s[0, n) as a JSON string literal into buf, cut to about 40 characters in a buffer of 64 bytes
 * or less, to what fits in a larger one. */
const char *mw__tok_quote(const char *s, size_t n, char *buf, size_t size);

/* "file:line:column: path: message" for the value n of ld->doc (NULL: the start of the file),
 * recorded as the calling thread's error; returns st. */
mw_status mw__tok_fail_at(mw__loader *ld, const mw__json_node *n, mw_status st, const char *path,
                          const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

/* obj[key]: a boolean into *out; absent (or null when `nullable`): *out unchanged; anything else
 * refused. `path` names obj in messages. */
mw_status mw__tok_get_bool(mw__loader *ld, const mw__json_node *obj, const char *key,
                           const char *path, int nullable, int *out);

/* obj[key]: NULL when absent or null; a string node; anything else refused (*st set). */
const mw__json_node *mw__tok_get_string(mw__loader *ld, const mw__json_node *obj, const char *key,
                                        const char *path, mw_status *st);

/* The "type" string of component object v (at path) into *type; refused when v is not an object
 * with one. */
mw_status mw__tok_type_of(mw__loader *ld, const mw__json_node *v, const char *path,
                          const mw__json_node **type);

/* v's "type" checked to be `want` (e.g. "ByteLevel"); a missing v is refused too, `why` saying
 * what the supported one does. */
mw_status mw__tok_check_type(mw__loader *ld, const mw__json_node *v, const char *path,
                             const char *want, const char *why);

/* root.normalizer (null, or NFC as Qwen2's) into tok->nfc (tokenizer_pipeline.c). */
mw_status mw__tok_read_normalizer(mw__loader *ld, const mw__json_node *root);

/* root.pre_tokenizer into tok->split, add_prefix_space, use_regex (tokenizer_pipeline.c). */
mw_status mw__tok_read_pre_tokenizer(mw__loader *ld, const mw__json_node *root);

/* root.post_processor into tok->template_ids, once the vocabulary and the added tokens are read
 * (its ids must be tokens). */
mw_status mw__tok_read_post_processor(mw__loader *ld, const mw__json_node *root);

/* What a value is, for "found ..." in messages: its type, a string's text or a number's. */
const char *mw__tok_what(mw__loader *ld, const mw__json_node *n, char *buf, size_t size);

/* obj (of ld->doc): token -> id, into tok->vocab, tok->vocab_count, tok->size and ld's copies.
 * `path` names it in messages ("model.vocab"; "" for vocab.json). */
mw_status mw__tok_read_vocab(mw__loader *ld, const mw__json_node *obj, const char *path);

/* model.merges of a tokenizer.json: ["a b", ...] or [["a", "b"], ...]. */
mw_status mw__tok_read_merges_json(mw__loader *ld, const mw__json_node *arr);

/* merges.txt (text[0, n), `label` its name): one "a b" a line, "#version" lines skipped. */
mw_status mw__tok_read_merges_txt(mw__loader *ld, const char *text, size_t n, const char *label);

#endif
