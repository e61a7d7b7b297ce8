/* safetensors files (safetensors_impl.h): opening and parsing them, finding and reading their
 * tensors. The header is read and checked whole (safetensors_header.c) before any tensor is used,
 * and in a file before its data is read; the writer is safetensors_write.c. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/file.h"
#include "formats/safetensors_impl.h"

/* --- reading ------------------------------------------------------------------------------- */

void mw_safetensors_close(mw_safetensors *f) {
    if (!f) return;
    mw__json_free(f->header);
    mw__free(f->t);
    mw__free(f->byname);
    mw__free(f->buf);
    mw__free(f);
}

/* Checks the length prefix and parses and checks the header of a file of `size` bytes whose
 * first bytes (at least 8 + the header's length, when the prefix is sane) are in buf; the data
 * section is not read. On success *hlen is the header's length. */
static mw_status parse_head(mw_safetensors *f, const unsigned char *buf, size_t avail, size_t size,
                            uint64_t *hlen_out) {
    const char *label = f->label;
    uint64_t hlen = 0;
    if (size < 8 || avail < 8)
        return mw__error(MW_ERR_FORMAT, "%s: %zu bytes is too short for a safetensors file", label,
                         size);
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    if (hlen > MW__ST_MAX_HEADER || hlen > size - 8)
        return mw__error(MW_ERR_FORMAT,
                         "%s: the header length %llu at byte 0 is more than the %zu bytes after "
                         "it%s",
                         label, (unsigned long long)hlen, size - 8,
                         hlen > MW__ST_MAX_HEADER ? " (or the 100 MB limit)" : "");
    if (hlen < 2)
        return mw__error(MW_ERR_FORMAT, "%s: a header of %llu bytes cannot hold a JSON object",
                         label, (unsigned long long)hlen);
    if (avail < 8 + hlen) return mw__error(MW_ERR_IO, "%s: the header was not read", label);
    f->data_size = size - 8 - hlen;
    *hlen_out = hlen;
    return mw__st_read_header(f, (const char *)buf + 8, (size_t)hlen);
}

static mw_safetensors *new_file(const char *label) {
    mw_safetensors *f = mw__calloc(1, sizeof *f);
    if (!f) {
        mw__error(MW_ERR_NOMEM, "out of memory reading %s", label);
        return NULL;
    }
    snprintf(f->label, sizeof f->label, "%s", label);
    return f;
}

/* Takes ownership of buf (size bytes). */
static mw_status parse_owned(unsigned char *buf, size_t size, const char *label,
                             mw_safetensors **out) {
    mw_safetensors *f = new_file(label);
    if (!f) {
        mw__free(buf);
        return MW_ERR_NOMEM;
    }
    f->buf = buf;
    f->size = size;
    uint64_t hlen = 0;
    mw_status st = parse_head(f, buf, size, size, &hlen);
    if (st) {
        mw_safetensors_close(f);
        return st;
    }
    f->data = buf + 8 + hlen;
    *out = f;
    return MW_OK;
}

mw_status mw_safetensors_parse(const void *data, size_t size, const char *label,
                               mw_safetensors **out) {
    if (!out || (size && !data))
        return mw__error(MW_ERR_INVALID, "mw_safetensors_parse: NULL argument");
    *out = NULL;
    unsigned char *buf = mw__malloc(size ? size : 1);
    if (!buf) return mw__error(MW_ERR_NOMEM, "out of memory reading %s", label ? label : "data");
    if (size) memcpy(buf, data, size);
    return parse_owned(buf, size, label ? label : "safetensors data", out);
}

mw_status mw_safetensors_open(const char *path, mw_safetensors **out) {
    if (!path || !out) return mw__error(MW_ERR_INVALID, "mw_safetensors_open: NULL argument");
    *out = NULL;
    int fd;
    int64_t size;
    mw_status st = mw__file_open_read(path, "safetensors file", &fd, &size);
    if (st) return st;
    if ((uint64_t)size > (uint64_t)SIZE_MAX - 1) {
        close(fd);
        return mw__error(MW_ERR_NOMEM, "%s: %lld bytes do not fit this process's memory", path,
                         (long long)size);
    }
    /* The length prefix and the header are read and checked before the data: a file that is
     * not one costs no more than its header. */
    mw_safetensors *f = new_file(path);
    unsigned char prefix[8];
    uint64_t hlen = 0;
    if (!f) st = MW_ERR_NOMEM;
    if (st == MW_OK && size >= 8) st = mw__file_read_at(fd, prefix, 8, 0, path);
    if (st == MW_OK) {
        for (int i = 7; i >= 0 && size >= 8; i--) hlen = hlen << 8 | prefix[i];
        /* Whatever is wrong with the prefix, parse_head says it without more than 8 bytes. */
        size_t head = size >= 8 && hlen <= MW__ST_MAX_HEADER && hlen <= (uint64_t)size - 8
                          ? (size_t)(8 + hlen)
                          : (size >= 8 ? 8 : (size_t)size);
        if (!(f->buf = mw__malloc(head ? head : 1)))
            st = mw__error(MW_ERR_NOMEM, "out of memory reading %s", path);
        if (st == MW_OK) st = mw__file_read_at(fd, f->buf, head, 0, path);
        if (st == MW_OK) st = parse_head(f, f->buf, head, (size_t)size, &hlen);
    }
    if (st == MW_OK) {
        unsigned char *all = mw__realloc(f->buf, (size_t)size + 1);
        if (!all) {
            st = mw__error(MW_ERR_NOMEM, "out of memory reading %s (%lld bytes)", path,
                           (long long)size);
        } else {
            f->buf = all;
            f->header->text = (const char *)all + 8; /* the header's text moved with the buffer */
        }
    }
    if (st == MW_OK)
        st = mw__file_read_at(fd, f->buf + 8 + hlen, (size_t)size - 8 - (size_t)hlen,
                              (int64_t)(8 + hlen), path);
    close(fd);
    if (st) {
        mw_safetensors_close(f);
        return st;
    }
    f->size = (size_t)size;
    f->data = f->buf + 8 + hlen;
    *out = f;
    return MW_OK;
}

int mw_safetensors_count(const mw_safetensors *f) { return f ? f->n : 0; }

static void info(const mw__st_tensor *t, mw_stored_tensor *out) {
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->dtype = t->dtype;
    out->rank = t->rank;
    memcpy(out->shape, t->shape, sizeof t->shape);
    out->count = t->count;
}

mw_status mw_safetensors_tensor(const mw_safetensors *f, int i, mw_stored_tensor *out) {
    if (!f || !out || i < 0 || i >= f->n)
        return mw__error(MW_ERR_INVALID, "mw_safetensors_tensor: NULL argument or index %d", i);
    info(&f->t[i], out);
    return MW_OK;
}

static const mw__st_tensor *lookup(const mw_safetensors *f, const char *name) {
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(f->byname[mid]->name, name);
        if (c == 0) return f->byname[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    mw__error(MW_ERR_NOT_FOUND, "%s has no tensor named '%s'", f->label, name);
    return NULL;
}

mw_status mw_safetensors_find(const mw_safetensors *f, const char *name, mw_stored_tensor *out) {
    if (!f || !name || !out) return mw__error(MW_ERR_INVALID, "mw_safetensors_find: NULL argument");
    const mw__st_tensor *t = lookup(f, name);
    if (!t) return MW_ERR_NOT_FOUND;
    info(t, out);
    return MW_OK;
}

const char *mw_safetensors_metadata(const mw_safetensors *f, const char *key) {
    if (!f || !f->meta || !key) return NULL;
    const mw__json *doc = f->header;
    size_t n = strlen(key);
    for (const mw__json_node *v = mw__json_node_at(doc, f->meta->first); v;
         v = mw__json_node_at(doc, v->next))
        if (v->klen == n && memcmp(mw__json_key(doc, v), key, n) == 0) return mw__json_str(doc, v);
    return NULL;
}

/* IEEE half to float, exactly (subnormals included). */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = h >> 10 & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | man << 13;
    } else if (exp) {
        bits = sign | (exp + 112) << 23 | man << 13;
    } else if (man) { /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        bits = sign | (uint32_t)(112 - e) << 23 | (man & 0x3FF) << 13;
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

mw_status mw_safetensors_read(const mw_safetensors *f, const char *name, float *dst,
                              int64_t count) {
    if (!f || !name || (count && !dst))
        return mw__error(MW_ERR_INVALID, "mw_safetensors_read: NULL argument");
    const mw__st_tensor *t = lookup(f, name);
    if (!t) return MW_ERR_NOT_FOUND;
    if (count != t->count)
        return mw__error(MW_ERR_SHAPE, "%s: tensor '%s' has %lld elements, not %lld", f->label,
                         name, (long long)t->count, (long long)count);
    const unsigned char *src = f->data + t->begin;
    if (strcmp(t->dtype, "F32") == 0) {
        memcpy(dst, src, (size_t)count * 4); /* the file and the host are little-endian */
    } else if (strcmp(t->dtype, "F16") == 0 || strcmp(t->dtype, "BF16") == 0) {
        int bf = t->dtype[0] == 'B';
        for (int64_t i = 0; i < count; i++) {
            uint16_t h = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
            uint32_t bits = (uint32_t)h << 16;
            if (bf)
                memcpy(&dst[i], &bits, sizeof bits);
            else
                dst[i] = half_to_float(h);
        }
    } else {
        return mw__error(MW_ERR_DTYPE, "%s: tensor '%s' is %s; only F32, F16 and BF16 read as f32",
                         f->label, name, t->dtype);
    }
    return MW_OK;
}
