/* Internal: a safetensors file as read (safetensors.c opens files and reads tensors,
 * safetensors_header.c reads and checks the header, safetensors_write.c writes files).
 *
 * Layout: u64 little-endian header length N | N bytes of JSON (UTF-8, maybe padded with spaces) |
 * data. The JSON is an object: "__metadata__" -> {string: string}, and per tensor name ->
 * {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, offsets relative to the data
 * section, which the tensors must tile exactly. */
#ifndef MW__FORMATS_SAFETENSORS_IMPL_H
#define MW__FORMATS_SAFETENSORS_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "formats/json.h"
#include "meshwit.h"

#define MW__ST_MAX_HEADER ((uint64_t)100 << 20) /* the safetensors package's own bound */

typedef struct mw__st_tensor {
    const char *name;  /* the header's decoded key (a C string: U+0000 is refused) */
    const char *dtype; /* static string */
    int esize;         /* bytes per element */
    int rank;
    int64_t shape[MW_MAX_RANK];
    int64_t count;
    uint64_t begin, end; /* data_offsets */
} mw__st_tensor;

struct mw_safetensors {
    unsigned char *buf; /* the file (or, while the header is checked, its first bytes) */
    size_t size;
    const unsigned char *data; /* the data section */
    uint64_t data_size;
    char label[256];
    mw__json *header;             /* the header's document: the names and metadata are its */
    const mw__json_node *meta;    /* "__metadata__" (an object of strings), or NULL */
    mw__st_tensor *t;             /* in the header's order */
    int n;                        /* tensors */
    const mw__st_tensor **byname; /* the tensors sorted by name (strcmp) */
};

/* Reads the header text[0, n) (the JSON after the length prefix; f->data_size already set) into
 * f: the tensors, the metadata, and the checks across tensors (each tensor's size matches its
 * dtype and shape, the tensors tile the data exactly, no name twice). Errors: MW_ERR_FORMAT
 * ("label: [tensor 'name': ]what (header byte N)"), MW_ERR_NOMEM. On failure f holds what was
 * read so far, freed by mw_safetensors_close. */
mw_status mw__st_read_header(mw_safetensors *f, const char *text, size_t n);

#endif
