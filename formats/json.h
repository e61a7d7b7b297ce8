/* Internal: a strict JSON reader (RFC 8259, as serde_json reads it: UTF-8 only, no comments, no
 * trailing commas, escapes checked, at most 128 levels of nesting unless told fewer) that keeps
 * where every value starts, so that a reader of a format can name the place (line and column of a
 * file, or byte offset in a part of one) of whatever it refuses.
 *
 * A document is a tree of nodes in one array, members of an object in the order of the text;
 * strings are decoded (escapes and surrogate pairs resolved, may hold U+0000) into a buffer of the
 * document, each followed by a NUL byte. Numbers keep their text: an integer that fits int64 is
 * also read exactly (ival), any number as a double on request (mw__json_double). Everything is
 * owned by the document. */
#ifndef MW__FORMATS_JSON_H
#define MW__FORMATS_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "meshwit/status.h"

typedef enum mw__json_type {
    MW__JSON_NULL,
    MW__JSON_FALSE,
    MW__JSON_TRUE,
    MW__JSON_NUMBER,
    MW__JSON_STRING,
    MW__JSON_ARRAY,
    MW__JSON_OBJECT
} mw__json_type;

#define MW__JSON_NONE UINT32_MAX /* no node: the end of a list of children */

typedef struct mw__json_node {
    mw__json_type type;
    uint32_t offset;    /* byte offset in the text where the value starts */
    uint32_t str, len;  /* string: decoded bytes (mw__json_str); number: its text in the source */
    uint32_t key, klen; /* a member of an object: its decoded key; otherwise klen = 0, key unused */
    uint32_t first;     /* array or object: the first child, else MW__JSON_NONE */
    uint32_t next;      /* the next child of the same parent, or MW__JSON_NONE */
    uint32_t count;     /* array or object: number of children */
    int is_integer;     /* number: no fraction or exponent, and it fits int64 (ival); "-0" is 0 */
    int64_t ival;
} mw__json_node;

typedef struct mw__json {
    const char *text; /* borrowed: the caller keeps it alive while the document is used */
    size_t size;
    size_t end;      /* where the value and the white space after it end (size unless a prefix) */
    char label[256]; /* the file name used in messages */
    mw__json_node *nodes;
    uint32_t nnodes, cap;
    char *strings; /* decoded strings, back to back, each followed by a NUL byte */
    size_t nstrings;
} mw__json;

/* How a text is read; zero-initialised fields mean the defaults. */
typedef struct mw__json_options {
    int max_depth;    /* levels of nesting allowed (1: a flat array or object); 0 or more than 128:
                         128 */
    int prefix;       /* the text is a value followed by anything: the rest is not read, and
                         doc->end says where it starts */
    const char *part; /* NULL: the text is a whole file, and a syntax error names its place as
                         "label:line:column:"; else it is the part of a file so named ("header"),
                         and the place is "(<part> byte N)" after the message */
    /* Names the member of the top-level object that a syntax error lies in (the value of; its
     * decoded key is key[0, klen)): writes what to say before the message ("tensor 'a': ") into
     * buf. NULL: nothing is said. */
    void (*member)(const char *key, size_t klen, char *buf, size_t size);
} mw__json_options;

/* Parses text[0, size) (a file's contents, borrowed for the document's lifetime) into *out.
 * `label` names it in messages. Errors: MW_ERR_FORMAT ("label:line:column: JSON syntax: ..."),
 * MW_ERR_NOMEM. Node 0 is the root. */
mw_status mw__json_parse(const char *text, size_t size, const char *label, mw__json **out);

/* mw__json_parse as `opt` says (NULL: the defaults). With opt->part, a syntax error reads
 * "label: [member: ]JSON syntax: ... (<part> byte N)", N counted from text. */
mw_status mw__json_parse_with(const char *text, size_t size, const char *label,
                              const mw__json_options *opt, mw__json **out);

/* Frees the document (NULL: nothing). */
void mw__json_free(mw__json *doc);

static inline const mw__json_node *mw__json_node_at(const mw__json *doc, uint32_t i) {
    return i == MW__JSON_NONE ? NULL : &doc->nodes[i];
}

/* The decoded bytes of a string node (len bytes, then a NUL byte: a C string when it holds no
 * U+0000) and of a member's key (klen bytes, then a NUL byte). */
static inline const char *mw__json_str(const mw__json *doc, const mw__json_node *n) {
    return doc->strings + n->str;
}
static inline const char *mw__json_key(const mw__json *doc, const mw__json_node *n) {
    return doc->strings + n->key;
}

/* The member `key` of object `obj` (the first one when it appears more than once; see
 * mw__json_duplicate), or NULL. */
const mw__json_node *mw__json_get(const mw__json *doc, const mw__json_node *obj, const char *key);

/* A second member of obj with the same key as an earlier one among the keys listed (a
 * NULL-terminated list), or NULL. */
const mw__json_node *mw__json_duplicate(const mw__json *doc, const mw__json_node *obj,
                                        const char *const *keys);

/* The first member of obj whose key an earlier member has, or NULL (obj not an object: NULL).
 * Quadratic in the member count: for objects of a few hundred members. */
const mw__json_node *mw__json_repeated(const mw__json *doc, const mw__json_node *obj);

/* The value of number node n as the nearest double (the C library's conversion, whatever the
 * locale's decimal point), into *out. Errors: MW_ERR_INVALID (n is not a number), MW_ERR_NOMEM
 * (a number of more than a hundred characters, and no memory for its copy). */
mw_status mw__json_double(const mw__json *doc, const mw__json_node *n, double *out);

/* "line:column" (both from 1; the column counts characters) of byte offset `offset`. */
void mw__json_where(const mw__json *doc, size_t offset, char *buf, size_t size);

/* "null", "a string", "an object", ... for messages. */
const char *mw__json_type_name(mw__json_type t);

#endif
