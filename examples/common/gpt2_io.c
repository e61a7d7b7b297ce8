/* llm.c's GPT-2 model file (fp32, version 3): reading its header, loading it into a trainer and
 * saving a trainer's weights into one.
 *
 * The file stores each kind of tensor for all layers together (every layer's ln1w, then every
 * layer's ln1b, ...), while a meshwit model has one parameter per layer ("h3.ln1w"). Both store a
 * linear layer's weight [Out, In] row-major, so a layer's slice of the stack is exactly the
 * parameter's memory and copies without any reordering. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gpt2_model.h"

#define MODEL_MAGIC 20240326
#define MODEL_VERSION_FP32 3
#define MODEL_VERSION_BF16 5
#define HEADER_INTS 256

/* The tensors of the file in llm.c's order; per-layer ones are stacked over L. */
typedef enum {
    WTE,
    WPE,
    LN1W,
    LN1B,
    QKVW,
    QKVB,
    ATTPROJW,
    ATTPROJB,
    LN2W,
    LN2B,
    FCW,
    FCB,
    FCPROJW,
    FCPROJB,
    LNFW,
    LNFB,
    NTENSORS
} tensor_id;

static const char *const tensor_names[NTENSORS] = {
    "wte",  "wpe",  "ln1w", "ln1b", "qkvw",    "qkvb",    "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw", "fcprojb", "lnfw",     "lnfb"};

static int per_layer(tensor_id t) { return t != WTE && t != WPE && t != LNFW && t != LNFB; }

/* Elements of one layer's slice of tensor t (of the whole tensor when it is not per layer). */
static int64_t slice_size(tensor_id t, const gpt2_config *c) {
    int64_t C = c->channels;
    switch (t) {
    case WTE: return (int64_t)c->padded_vocab * C;
    case WPE: return (int64_t)c->max_seq * C;
    case QKVW: return 3 * C * C;
    case QKVB: return 3 * C;
    case ATTPROJW: return C * C;
    case FCW:
    case FCPROJW: return 4 * C * C;
    case FCB: return 4 * C;
    default: return C; /* layer norms and the C-sized biases */
    }
}

/* The meshwit parameter holding layer l's slice of t. */
static void param_name(tensor_id t, int l, char *buf, size_t size) {
    if (per_layer(t))
        snprintf(buf, size, "h%d.%s", l, tensor_names[t]);
    else
        snprintf(buf, size, "%s", tensor_names[t]);
}

/* The header fields after magic and version, with the config field each one is. */
typedef struct header_field {
    const char *name; /* llm.c's name, then ours */
    int index;
    size_t offset;
} header_field;

static const header_field fields[] = {
    {"maxT (context)", 2, offsetof(gpt2_config, max_seq)},
    {"V (vocab)", 3, offsetof(gpt2_config, vocab)},
    {"L (layers)", 4, offsetof(gpt2_config, layers)},
    {"NH (heads)", 5, offsetof(gpt2_config, heads)},
    {"C (channels)", 6, offsetof(gpt2_config, channels)},
    {"Vp (padded vocab)", 7, offsetof(gpt2_config, padded_vocab)},
};
#define NFIELDS ((int)(sizeof fields / sizeof fields[0]))

static int *field_of(gpt2_config *c, const header_field *f) {
    return (int *)((char *)c + f->offset);
}

static int field_value(const gpt2_config *c, const header_field *f) {
    return *(const int *)((const char *)c + f->offset);
}

static int64_t file_bytes(const gpt2_config *c) {
    return (int64_t)(HEADER_INTS * sizeof(int32_t)) + gpt2_num_params(c) * (int64_t)sizeof(float);
}

/* Opens a model file and checks its magic, version, sizes and length. Fills *c from the header;
 * when `expect` is not NULL every header field must equal it. On success *f is positioned after
 * the header. */
static mw_status open_model(const char *path, const gpt2_config *expect, FILE **f, gpt2_config *c,
                            char *err, size_t errsize) {
    int64_t size = 0;
    mw_status st = mw_input_open(path, NULL, 0, f, &size);
    if (st != MW_OK) {
        snprintf(err, errsize, "%s", mw_last_error());
        return st;
    }
    int32_t h[HEADER_INTS];
    if (size < (int64_t)sizeof h) {
        snprintf(err, errsize,
                 "%s is not an llm.c GPT-2 model file: the header needs %zu bytes, the file has "
                 "%lld",
                 path, sizeof h, (long long)size);
        goto format_fail;
    }
    if (fread(h, sizeof h, 1, *f) != 1) {
        snprintf(err, errsize, "cannot read %s: %s", path, strerror(errno));
        goto io_fail;
    }
    if (h[0] != MODEL_MAGIC) {
        snprintf(err, errsize, "%s is not an llm.c GPT-2 model file: magic %d, expected %d%s", path,
                 h[0], MODEL_MAGIC,
                 h[0] == 20240520 ? " (it is a token shard: pass it to --data)" : "");
        goto format_fail;
    }
    if (h[1] == MODEL_VERSION_BF16) {
        snprintf(err, errsize,
                 "%s: version 5 (bf16 weights) is not supported; only version 3 (fp32) files "
                 "can be read (llm.c writes one next to each bf16 file, e.g. gpt2_124M.bin)",
                 path);
        goto format_fail;
    }
    if (h[1] != MODEL_VERSION_FP32) {
        snprintf(err, errsize, "%s: unknown model file version %d (only 3, fp32, is supported)",
                 path, h[1]);
        goto format_fail;
    }
    memset(c, 0, sizeof *c);
    for (int i = 0; i < NFIELDS; i++) *field_of(c, &fields[i]) = h[fields[i].index];
    for (int i = 0; expect && i < NFIELDS; i++) {
        int got = field_value(c, &fields[i]), want = field_value(expect, &fields[i]);
        if (got == want) continue;
        snprintf(err, errsize,
                 "%s does not fit the model: %s is %d in the file but %d in the "
                 "model's configuration",
                 path, fields[i].name, got, want);
        goto format_fail;
    }
    char why[160];
    if (gpt2_config_check(c, why, sizeof why) != 0) {
        snprintf(err, errsize, "%s: the header describes no valid model: %s", path, why);
        goto format_fail;
    }
    int64_t want = file_bytes(c);
    if (size != want) {
        snprintf(err, errsize,
                 "%s: a model of %lld parameters needs a file of %lld bytes, found %lld (%s)", path,
                 (long long)gpt2_num_params(c), (long long)want, (long long)size,
                 size < want ? "truncated" : "trailing bytes");
        goto format_fail;
    }
    return MW_OK;
format_fail:
    fclose(*f);
    *f = NULL;
    return MW_ERR_FORMAT;
io_fail:
    fclose(*f);
    *f = NULL;
    return MW_ERR_IO;
}

mw_status gpt2_read_header(const char *path, gpt2_config *c, char *err, size_t errsize) {
    FILE *f;
    mw_status st = open_model(path, NULL, &f, c, err, errsize);
    if (f) fclose(f);
    return st;
}

/* Largest slice of any tensor: the buffer one copy goes through. */
static int64_t largest_slice(const gpt2_config *c) {
    int64_t m = 0;
    for (int t = 0; t < NTENSORS; t++)
        if (slice_size((tensor_id)t, c) > m) m = slice_size((tensor_id)t, c);
    return m;
}

/* Reports a failed trainer call on parameter `name`. */
static mw_status param_fail(mw_status st, const char *name, const char *path, char *err,
                            size_t errsize) {
    snprintf(err, errsize, "%s: parameter %s: %s", path, name, mw_last_error());
    return st;
}

/* Index of the first NaN or Inf of v[0..n), or -1. */
static int64_t first_nonfinite(const float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return i;
    return -1;
}

mw_status gpt2_load(mw_trainer *tr, const gpt2_config *c, const char *path,
                    const gpt2_load_options *options, char *err, size_t errsize) {
    const int allow_nonfinite = options && options->allow_nonfinite;
    FILE *f;
    gpt2_config file_config;
    mw_status st = open_model(path, c, &f, &file_config, err, errsize);
    if (st != MW_OK) return st;
    float *buf = malloc((size_t)largest_slice(c) * sizeof *buf);
    if (!buf) {
        fclose(f);
        snprintf(err, errsize, "out of memory loading %s", path);
        return MW_ERR_NOMEM;
    }
    for (int t = 0; t < NTENSORS && st == MW_OK; t++) {
        int64_t n = slice_size((tensor_id)t, c);
        for (int l = 0; l < (per_layer((tensor_id)t) ? c->layers : 1) && st == MW_OK; l++) {
            char name[64];
            param_name((tensor_id)t, l, name, sizeof name);
            if (fread(buf, sizeof *buf, (size_t)n, f) != (size_t)n) {
                snprintf(err, errsize, "cannot read %s at parameter %s: %s", path, name,
                         ferror(f) ? strerror(errno) : "the file ended early");
                st = MW_ERR_IO;
            } else if (!allow_nonfinite && first_nonfinite(buf, n) >= 0) {
                int64_t i = first_nonfinite(buf, n);
                snprintf(err, errsize,
                         "%s: parameter %s holds %s at index %lld (the model is damaged; "
                         "--allow-nonfinite loads it anyway)",
                         path, name,
                         isnan(buf[i]) ? "NaN"
                         : buf[i] > 0  ? "+Inf"
                                       : "-Inf",
                         (long long)i);
                st = MW_ERR_FORMAT;
            } else if ((st = mw_trainer_write_param(tr, name, buf, n)) != MW_OK) {
                st = param_fail(st, name, path, err, errsize);
            }
        }
    }
    free(buf);
    fclose(f);
    return st;
}

/* gpt2_save's reads without its file: the part that a process other than the writer takes in a
 * save that gathers parameters from every process (the same reads in the same order). */
static mw_status read_all(mw_trainer *tr, const gpt2_config *c, char *err, size_t errsize) {
    float *buf = malloc((size_t)largest_slice(c) * sizeof *buf);
    mw_status st = buf ? MW_OK : MW_ERR_NOMEM;
    if (!buf) snprintf(err, errsize, "out of memory reading the parameters");
    for (int t = 0; t < NTENSORS && st == MW_OK; t++)
        for (int l = 0; l < (per_layer((tensor_id)t) ? c->layers : 1) && st == MW_OK; l++) {
            char name[64];
            param_name((tensor_id)t, l, name, sizeof name);
            if ((st = mw_trainer_read_param(tr, name, buf, slice_size((tensor_id)t, c))))
                snprintf(err, errsize, "parameter %s: %s", name, mw_last_error());
        }
    free(buf);
    return st;
}

mw_status gpt2_save(mw_trainer *tr, const gpt2_config *c, const char *path, char *err,
                    size_t errsize) {
    if (!path) return read_all(tr, c, err, errsize);
    char why[160];
    if (gpt2_config_check(c, why, sizeof why) != 0) {
        snprintf(err, errsize, "cannot save %s: %s", path, why);
        return MW_ERR_INVALID;
    }
    if (!gpt2_config_is_plain(c)) {
        snprintf(err, errsize,
                 "cannot save %s: llm.c's format holds GPT-2's layer-norm epsilon, tanh GELU "
                 "and attention scale only, and this model differs (save it as .safetensors)",
                 path);
        return MW_ERR_UNSUPPORTED;
    }
    float *buf = malloc((size_t)largest_slice(c) * sizeof *buf);
    if (!buf) {
        snprintf(err, errsize, "out of memory saving %s", path);
        return MW_ERR_NOMEM;
    }
    /* Written beside the final name, which is replaced only by the complete file. */
    mw_output *out;
    mw_status st = mw_output_open(path, "llm.c model file", 0, &out);
    if (st != MW_OK) {
        snprintf(err, errsize, "%s", mw_last_error());
        free(buf);
        return st;
    }
    int32_t h[HEADER_INTS] = {MODEL_MAGIC, MODEL_VERSION_FP32};
    for (int i = 0; i < NFIELDS; i++) h[fields[i].index] = field_value(c, &fields[i]);
    st = mw_output_write(out, h, sizeof h);
    if (st != MW_OK) snprintf(err, errsize, "%s", mw_last_error());
    for (int t = 0; t < NTENSORS && st == MW_OK; t++) {
        int64_t n = slice_size((tensor_id)t, c);
        for (int l = 0; l < (per_layer((tensor_id)t) ? c->layers : 1) && st == MW_OK; l++) {
            char name[64];
            param_name((tensor_id)t, l, name, sizeof name);
            if ((st = mw_trainer_read_param(tr, name, buf, n)) != MW_OK) {
                st = param_fail(st, name, path, err, errsize);
                break;
            }
            if ((st = mw_output_write(out, buf, (size_t)n * sizeof *buf)) != MW_OK)
                snprintf(err, errsize, "%s", mw_last_error());
        }
    }
    if (st == MW_OK) {
        if ((st = mw_output_commit(out)) != MW_OK) snprintf(err, errsize, "%s", mw_last_error());
    } else {
        mw_output_abandon(out);
    }
    free(buf);
    return st;
}

mw_status gpt2_copy_params(mw_trainer *tr, mw_infer *inf, const gpt2_config *c) {
    float *buf = malloc((size_t)largest_slice(c) * sizeof *buf);
    if (!buf) return MW_ERR_NOMEM;
    mw_status st = MW_OK;
    for (int t = 0; t < NTENSORS && st == MW_OK; t++) {
        int64_t n = slice_size((tensor_id)t, c);
        for (int l = 0; l < (per_layer((tensor_id)t) ? c->layers : 1) && st == MW_OK; l++) {
            char name[64];
            param_name((tensor_id)t, l, name, sizeof name);
            if ((st = mw_trainer_read_param(tr, name, buf, n)) == MW_OK)
                st = mw_infer_write_param(inf, name, buf, n);
        }
    }
    free(buf);
    return st;
}
