/* meshwit: parameters in and out.
 *
 * Listing a graph's or a trainer's parameters (name, axes, dtype), and weights-only files in
 * the safetensors format (the Hugging Face ecosystem's, read by PyTorch, JAX and NumPy through
 * the `safetensors` package): an 8-byte little-endian header length, a JSON header naming every
 * tensor's dtype, shape and byte range, then the raw little-endian data. The reader checks the
 * whole header before anything is used: every failure is MW_ERR_FORMAT with a message naming
 * the file, the tensor and the byte offset.
 *
 * Thread-safety: an open safetensors file is read-only and may be read from any thread; the
 * trainer functions follow the trainer's rule (one host thread at a time). */
#ifndef MESHWIT_WEIGHTS_H
#define MESHWIT_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "graph.h"
#include "status.h"
#include "trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- listing parameters -------------------------------------------------------------------- */

/* One parameter: its name and axes (strings owned by the graph or trainer, valid while it
 * lives), its dtype and its element count, and whether weight decay applies to it. */
typedef struct mw_param_info {
    const char *name;
    mw_dtype dtype;
    int rank;
    mw_axis axis[MW_MAX_RANK];
    int64_t count;
    /* A trainer's: 1 when its optimizer's rule (mw_optimizer.decay_rule or .decays) decays the
     * parameter (by weight_decay, which may be 0), else 0. A graph's: -1 (a graph has no
     * optimizer). */
    int decayed;
} mw_param_info;

/* Number of parameters of g (0 for NULL), and parameter i in declaration order (0-based).
 * Errors: MW_ERR_INVALID (NULL argument, i out of range). */
int mw_graph_param_count(const mw_graph *g);
mw_status mw_graph_param_info(const mw_graph *g, int i, mw_param_info *out);

/* The same for the graph a trainer was made from (0 parameters for NULL), with what its weight
 * decay applies to. */
int mw_trainer_param_count(const mw_trainer *tr);
mw_status mw_trainer_param_info(const mw_trainer *tr, int i, mw_param_info *out);

/* --- safetensors files --------------------------------------------------------------------- */

typedef struct mw_safetensors mw_safetensors; /* a file read and checked in memory */

/* A tensor as the file stores it. dtype is the file's name for it ("F32", "F16", "BF16", "I32",
 * ...); name and dtype are owned by the file object. */
typedef struct mw_stored_tensor {
    const char *name;
    const char *dtype;
    int rank;
    int64_t shape[MW_MAX_RANK];
    int64_t count;
} mw_stored_tensor;

/* Reads and checks the file at path: the header length (at most 100 MB, within the file), a JSON
 * object whose keys are unique tensor names (or "__metadata__", an object of strings) and whose
 * values each have exactly "dtype" (a known safetensors dtype), "shape" (at most MW_MAX_RANK
 * non-negative sizes) and "data_offsets" ([begin, end] with end - begin the tensor's byte
 * size), tensors that tile the data section with no gap, overlap or trailing byte. *out is owned
 * by the caller (mw_safetensors_close). Errors: MW_ERR_INVALID (NULL argument), MW_ERR_IO,
 * MW_ERR_FORMAT, MW_ERR_NOMEM. */
mw_status mw_safetensors_open(const char *path, mw_safetensors **out);

/* The same on `size` bytes in memory (copied), with `label` naming them in messages. Errors: as
 * mw_safetensors_open's, MW_ERR_INVALID for out NULL or data NULL with size > 0. */
mw_status mw_safetensors_parse(const void *data, size_t size, const char *label,
                               mw_safetensors **out);

/* Frees the file object. NULL is a no-op. */
void mw_safetensors_close(mw_safetensors *f);

/* Number of tensors (the metadata is not one; 0 for NULL), and tensor i in the header's order.
 * Errors: MW_ERR_INVALID (NULL argument, i out of range). */
int mw_safetensors_count(const mw_safetensors *f);
mw_status mw_safetensors_tensor(const mw_safetensors *f, int i, mw_stored_tensor *out);

/* The tensor called `name`. Errors: MW_ERR_NOT_FOUND (no such tensor), MW_ERR_INVALID. */
mw_status mw_safetensors_find(const mw_safetensors *f, const char *name, mw_stored_tensor *out);

/* The value of metadata key `key`, or NULL (also for a NULL file or key); owned by the file
 * object. */
const char *mw_safetensors_metadata(const mw_safetensors *f, const char *key);

/* Copies tensor `name` (count elements, row-major) into dst as f32, converting F16 and BF16
 * exactly. Errors: MW_ERR_NOT_FOUND, MW_ERR_SHAPE (count differs), MW_ERR_DTYPE (a dtype other
 * than F32, F16, BF16), MW_ERR_INVALID. */
mw_status mw_safetensors_read(const mw_safetensors *f, const char *name, float *dst, int64_t count);

/* A tensor to write: name, shape and count f32 values (borrowed during the call). */
typedef struct mw_safetensors_entry {
    const char *name;
    int rank;
    int64_t shape[MW_MAX_RANK];
    const float *data;
} mw_safetensors_entry;

/* Writes the entries as F32 tensors, in the given order, with metadata {"format": "pt"} (which
 * transformers' from_pretrained expects), atomically (a temporary file, flushed and synced, then
 * renamed over path). Errors: MW_ERR_INVALID (NULL argument, empty or duplicate name, a name
 * with a control character, "__metadata__", a bad rank or negative size), MW_ERR_IO,
 * MW_ERR_NOMEM. */
mw_status mw_safetensors_write(const char *path, const mw_safetensors_entry *entries, int n);

/* --- a trainer's weights ------------------------------------------------------------------- */

/* A parameter and the name it has in a file. */
typedef struct mw_weight_name {
    const char *param;
    const char *stored;
} mw_weight_name;

/* Saves the trainer's parameters (weights only, no optimizer state) to a safetensors file, each
 * with its declared shape: every parameter under its own name when names is NULL, else only the
 * nnames listed, under their stored names. Errors: those of mw_safetensors_write (two listed
 * under one stored name: MW_ERR_INVALID), MW_ERR_NOT_FOUND (a listed parameter that does not
 * exist), MW_ERR_INVALID (a NULL trainer or path, nnames < 0). */
mw_status mw_trainer_save_weights(mw_trainer *tr, const char *path, const mw_weight_name *names,
                                  int nnames);

/* Loads parameters from a safetensors file into every replica: every parameter from the tensor
 * of its own name when names is NULL, else the nnames listed from their stored names. Tensors of
 * the file that are not asked for are ignored. Nothing changes unless every tensor asked for is
 * present with the parameter's exact shape. Errors: those of mw_safetensors_open,
 * MW_ERR_NOT_FOUND (a parameter or a stored tensor missing: the message names it and the file),
 * MW_ERR_SHAPE (shapes differ: both are named), MW_ERR_DTYPE (a stored dtype other than F32, F16
 * and BF16), MW_ERR_INVALID (a NULL trainer or path, nnames < 0). */
mw_status mw_trainer_load_weights(mw_trainer *tr, const char *path, const mw_weight_name *names,
                                  int nnames);

#ifdef __cplusplus
}
#endif
#endif
