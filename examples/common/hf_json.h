/* Reading a Hugging Face config.json strictly, for the examples' model loaders (gpt2_hf_config.c,
 * llama_hf.c): the library's JSON reader, with messages that name the file, line and column; and
 * what both loaders ask of the weights file beside it. */
#ifndef HF_JSON_H
#define HF_JSON_H

#include <stddef.h>

#include "formats/json.h"
#include "meshwit.h"

/* One config.json being read: its document, its name for messages, where they go. */
typedef struct hf_reader {
    const mw__json *doc;
    const char *cfg;
    char *err;
    size_t errsize;
} hf_reader;

/* The member of obj whose key is key[0, n), its last occurrence (Python's json keeps the last of
 * a repeated key); NULL when absent. hf_field: the same for a NUL-terminated key. */
const mw__json_node *hf_member(const mw__json *doc, const mw__json_node *obj, const char *key,
                               size_t n);
const mw__json_node *hf_field(const mw__json *doc, const mw__json_node *obj, const char *key);

/* Whether m is the string s. */
int hf_is_str(const mw__json *doc, const mw__json_node *m, const char *s);

/* "cfg:line:column: " (where m's value starts) then the message, into r->err; returns st. */
mw_status hf_refuse(const hf_reader *r, const mw__json_node *m, mw_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* "\"key\" is <value>; want" as hf_refuse writes it. */
mw_status hf_bad_value(const hf_reader *r, const mw__json_node *m, const char *want, mw_status st);

/* A number's value (m a number), or MW_ERR_NOMEM in r->err. */
mw_status hf_number(const hf_reader *r, const mw__json_node *m, double *v);

/* Whether key is a field of every transformers config that changes nothing a language model
 * computes from its weights (metadata, generation settings, initialisation, other heads' labels).
 */
int hf_inert_field(const char *key);

/* Whether key is one of list[0, n). */
int hf_in_list(const char *key, const char *const *list, size_t n);

/* Whether tensors a and b of f both hold count elements of the same values (a tied output head
 * saved beside the embedding it is); 0 also when either is missing or cannot be read. */
int hf_tensors_equal(const mw_safetensors *f, const char *a, const char *b, int64_t count);

/* The text of the config.json at cfg (a regular file of at most 64 KiB without NUL bytes), the
 * config of the weights at path (for messages), into *text (NUL-terminated, the caller frees it)
 * and *n. MW_ERR_IO, MW_ERR_FORMAT, MW_ERR_NOMEM with the message in err. */
mw_status hf_read_text(const char *cfg, const char *path, char **text, size_t *n, char *err,
                       size_t errsize);

#endif
