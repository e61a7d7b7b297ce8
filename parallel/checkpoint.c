/* Resumable training state: parameters, optimizer moments, the step (which fixes the
 * learning-rate schedule's position) and an opaque block of the caller's own state (its RNG, its
 * data position), written atomically and checked completely before anything is restored.
 *
 * Layout (little-endian, as the host writes it):
 *   "MWCKPT01" | u32 version | u32 optimizer | i64 step | u32 nparams | u32 moments (0, 1, 2)
 *   | u64 param elements | u64 user bytes
 *   | per parameter: name (MW_MAX_NAME bytes, zero padded) and i64 count
 *   | parameters (each in its declared order) | moments (same order: AdamW m then v; SGD's
 *   momentum buffer) | user bytes
 *   | u64 FNV-1a checksum of everything before it */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/file.h"
#include "core/hash.h"
#include "parallel/consistency.h"
#include "parallel/optimizer.h"
#include "parallel/pipeline_impl.h"
#include "parallel/trainer_impl.h"

#define MAGIC "MWCKPT01"
#define VERSION 1u
#define MAX_STEP ((int64_t)1 << 53) /* steps beyond this are a forged or damaged header */

typedef struct header {
    char magic[8];
    uint32_t version, optimizer;
    int64_t step;
    uint32_t nparams, moments;
    uint64_t elems, user_bytes;
} header;

typedef struct entry {
    char name[MW_MAX_NAME];
    int64_t count;
} entry;

/* Values start 8-byte aligned in a file image (see mw_trainer_load). */
_Static_assert(sizeof(header) % 8 == 0 && sizeof(entry) % 8 == 0, "checkpoint layout");

/* A pipeline spanning processes, or NULL. */
static mw_pipeline *spanning(const mw_trainer *tr) {
    return tr->pipe && mw__pipeline_processes(tr->pipe) > 1 ? tr->pipe : NULL;
}

/* Where a checkpoint's parameters live: the whole model's, in its declaration order (names,
 * sizes), and for each the trainers holding it with its node in theirs: the trainer itself, or
 * a pipeline's stages, the owner of a tied parameter first. Saving reads from the first holder;
 * loading writes the values to every holder and the moments to the first (a tied parameter's
 * other copy only ever receives the owner's updated value). */
typedef struct holder {
    mw_trainer *tr;
    const mw_tensor *t;
} holder;

typedef struct layout {
    const mw_graph *g;        /* the whole model's graph */
    int nparams, nstages;     /* nstages: 1 unless a pipeline */
    const mw_tensor **params; /* [nparams], declaration order */
    holder *hold;             /* [nparams][nstages] */
    int *nhold;               /* [nparams] */
} layout;

static void layout_free(layout *l) {
    mw__free(l->params);
    mw__free(l->hold);
    mw__free(l->nhold);
}

static mw_trainer *stage_trainer(mw_trainer *tr, int s) {
    return tr->pipe ? mw__pipeline_stage_trainer(tr->pipe, s) : tr;
}

static mw_status layout_of(mw_trainer *tr, const char *caller, layout *l) {
    *l = (layout){.g = tr->pipe ? mw__pipeline_graph(tr->pipe) : tr->prog->g,
                  .nstages = tr->pipe ? mw_pipeline_stages(tr->pipe) : 1};
    int n = l->g->nparams;
    l->params = mw__calloc((size_t)n + 1, sizeof *l->params);
    l->hold = mw__calloc((size_t)(n + 1) * (size_t)l->nstages, sizeof *l->hold);
    l->nhold = mw__calloc((size_t)n + 1, sizeof *l->nhold);
    if (!l->params || !l->hold || !l->nhold) {
        layout_free(l);
        return mw__error(MW_ERR_NOMEM, "%s: out of memory", caller);
    }
    for (int i = 0; i < l->g->nnodes; i++)
        if (l->g->nodes[i]->op == MW__OP_PARAM) l->params[l->g->nodes[i]->leaf] = l->g->nodes[i];
    l->nparams = n;
    for (int s = 0; s < l->nstages; s++) {
        mw_trainer *st = stage_trainer(tr, s);
        if (!st) continue; /* another process's stage */
        const mw_graph *gs = st->prog->g;
        for (int i = 0; i < gs->nnodes; i++) {
            const mw_tensor *t = gs->nodes[i];
            if (t->op != MW__OP_PARAM) continue;
            int p = tr->pipe ? -1 : t->leaf;
            for (int k = 0; p < 0 && k < n; k++)
                if (!strcmp(l->params[k]->name, t->name)) p = k;
            if (p < 0) continue; /* (every stage parameter is one of the model's) */
            l->hold[(size_t)p * (size_t)l->nstages + (size_t)l->nhold[p]++] = (holder){st, t};
        }
    }
    /* Across processes another process's stages hold the rest. */
    for (int p = 0; p < n && !spanning(tr); p++)
        if (!l->nhold[p]) {
            layout_free(l);
            return mw__error(MW_ERR_STATE, "%s: no stage holds parameter '%s'", caller,
                             l->params[p]->name);
        }
    return MW_OK;
}

/* Values of every parameter, whole (the sum of their global sizes): the length of each part of
 * the file's image. */
static int64_t whole_elems(const layout *l) {
    int64_t n = 0;
    for (int p = 0; p < l->nparams; p++) n += mw__type_numel(&l->params[p]->type);
    return n;
}

/* Copies between the host image (params, then m, then v, each parameter whole in declaration
 * order) and the devices. Saving reads each value from the first of this process's devices that
 * holds it (moments: the owner of their slice with ZeRO-1; a split parameter: its shards);
 * loading writes every device's part. The file is the same in every mode and on every mesh. A
 * pipeline across processes: what another process's stage holds is not written by a load here,
 * and comes from that process when saving (pipe: a collective per parameter and part). */
static mw_status transfer(const layout *l, float *image, int moments, int to_devices,
                          mw_pipeline *pipe) {
    for (int part = 0; part <= moments; part++)
        for (int p = 0; p < l->nparams; p++) {
            const holder *h = &l->hold[(size_t)p * (size_t)l->nstages];
            int n = to_devices && part == 0 ? l->nhold[p] : l->nhold[p] ? 1 : 0;
            int64_t count = mw__type_numel(&l->params[p]->type);
            for (int k = 0; k < n; k++) {
                mw__holding held = part ? mw__held_moment(h[k].tr, part - 1) : mw__held_params;
                mw_status st = mw__param_transfer(h[k].tr->prog, h[k].t, &held, image, to_devices);
                if (st) return st;
            }
            if (pipe && !to_devices) {
                mw_status st = mw__pipeline_share_param(pipe, l->params[p]->name, image, count);
                if (st) return st;
            }
            image += count;
        }
    return MW_OK;
}

/* The step every stage has taken (a pipeline's stages step together). */
static int64_t steps_of(mw_trainer *tr) {
    return (tr->pipe ? mw__pipeline_first_trainer(tr->pipe) : tr)->prog->steps;
}

/* ZeRO-1 on a mesh spanning processes: each process holds the moments of its own devices'
 * slices, which (devices being numbered process by process) form one range of the flat layout.
 * Every process contributes its range and receives the others' (a collective call), then the
 * moments are written into the image in declaration order. */
static mw_status gather_moments(mw_trainer *tr, float *image, const layout *l, int moments) {
    int64_t elems = tr->prog->w[tr->prog->first].plan.param_elems;
    const mw_mesh *mesh = tr->prog->mesh;
    const size_t *sl = tr->slices;
    int nprocs = mesh->nprocs;
    int *counts = mw__calloc((size_t)nprocs, sizeof *counts);
    float *mine = mw__malloc((size_t)(elems + 1) * sizeof *mine);
    float *flat = mw__malloc((size_t)(elems + 1) * sizeof *flat);
    mw_status st =
        counts && mine && flat ? MW_OK : mw__error(MW_ERR_NOMEM, "mw_trainer_save: out of memory");
    for (int d = 0; st == MW_OK && d < tr->prog->nworkers; d++) {
        size_t bytes = (sl[d + 1] - sl[d]) * 4;
        if ((size_t)counts[mesh->proc_of[d]] + bytes > (size_t)INT32_MAX)
            st = mw__error(MW_ERR_UNSUPPORTED,
                           "mw_trainer_save: a process's optimizer slice exceeds 2 GB");
        else
            counts[mesh->proc_of[d]] += (int)bytes;
    }
    size_t lo = sl[tr->prog->first];
    for (int part = 1; st == MW_OK && part <= moments; part++) {
        for (int d = tr->prog->first; st == MW_OK && d < tr->prog->first + tr->prog->nlocal; d++) {
            worker *w = &tr->prog->w[d];
            const replica *r = &tr->rep[d];
            int64_t own = r->own_hi - r->own_lo;
            st = own ? w->dev.vt->download(&w->dev, mine + (r->own_lo - (int64_t)lo),
                                           (char *)r->moments + (size_t)((part - 1) * own) * 4,
                                           (size_t)own * 4)
                     : MW_OK;
        }
        if (st == MW_OK)
            st = mw__dist_allgatherv_bytes((const char *)mine, counts, (char *)flat,
                                           tr->cfg.collective_timeout_ms,
                                           "mw_trainer_save: gathering the optimizer moments");
        float *img = image + part * elems;
        for (int p = 0; st == MW_OK && p < l->nparams; p++) {
            const mw__param_slot *s = &tr->prog->w[tr->prog->first].plan.params[l->params[p]->leaf];
            memcpy(img, flat + s->off, (size_t)s->count * 4);
            img += s->count;
        }
    }
    mw__free(counts);
    mw__free(mine);
    mw__free(flat);
    return st;
}

mw_status mw_trainer_save(mw_trainer *tr, const char *path, const void *user, size_t user_bytes) {
    if (!tr || !path || (user_bytes && !user))
        return mw__error(MW_ERR_INVALID, "mw_trainer_save: NULL argument");
    layout l;
    mw_status st = layout_of(tr, "mw_trainer_save", &l);
    if (st) return st;
    int moments = mw__optimizer_moments(&tr->cfg.optimizer);
    int64_t elems = whole_elems(&l);
    float *image = mw__malloc((size_t)(elems * (1 + moments) + 1) * sizeof *image);
    st = image ? transfer(&l, image, moments, 0, spanning(tr))
               : mw__error(MW_ERR_NOMEM, "mw_trainer_save: out of memory");
    if (st == MW_OK && !tr->pipe && tr->prog->zero1 && tr->prog->nlocal < tr->prog->nworkers &&
        !tr->prog->sharded_params)
        st = gather_moments(tr, image, &l, moments);
    /* Written beside the old checkpoint, which is replaced only by a complete new one. */
    mw_output *out = NULL;
    if (st == MW_OK) st = mw_output_open(path, "checkpoint", 0, &out);
    if (st == MW_OK) {
        header h = {.version = VERSION,
                    .optimizer = (uint32_t)tr->cfg.optimizer.kind,
                    .step = steps_of(tr),
                    .nparams = (uint32_t)l.nparams,
                    .moments = (uint32_t)moments,
                    .elems = (uint64_t)elems,
                    .user_bytes = user_bytes};
        memcpy(h.magic, MAGIC, 8);
        uint64_t sum = mw__fnv1a(MW__FNV_BASIS, &h, sizeof h);
        st = mw_output_write(out, &h, sizeof h);
        for (int p = 0; st == MW_OK && p < l.nparams; p++) {
            entry e = {.count = mw__type_numel(&l.params[p]->type)};
            snprintf(e.name, sizeof e.name, "%s", l.params[p]->name);
            sum = mw__fnv1a(sum, &e, sizeof e);
            st = mw_output_write(out, &e, sizeof e);
        }
        size_t data = (size_t)(elems * (1 + moments)) * sizeof *image;
        sum = mw__fnv1a(mw__fnv1a(sum, image, data), user, user_bytes);
        if (st == MW_OK) st = mw_output_write(out, image, data);
        if (st == MW_OK && user_bytes) st = mw_output_write(out, user, user_bytes);
        if (st == MW_OK) st = mw_output_write(out, &sum, sizeof sum);
        if (st == MW_OK) {
            st = mw_output_commit(out);
        } else {
            mw_output_abandon(out);
        }
    }
    mw__free(image);
    layout_free(&l);
    return st;
}

/* Reads the whole file; MW_ERR_IO when it cannot be read. Opening does not block (a FIFO
 * without a writer would), and anything but a regular file is refused before a read. */
static mw_status slurp(const char *path, unsigned char **data, size_t *size) {
    *data = NULL;
    *size = 0;
    int fd;
    int64_t n64;
    mw_status st = mw__file_open_read(path, "checkpoint", &fd, &n64);
    if (st) return st;
    if ((uint64_t)n64 > ((uint64_t)1 << 42))
        st = mw__error(MW_ERR_FORMAT, "checkpoint %s is too large to be one (%lld bytes)", path,
                       (long long)n64);
    size_t n = st ? 0 : (size_t)n64;
    if (st == MW_OK && !(*data = mw__malloc(n + 1)))
        st = mw__error(MW_ERR_NOMEM, "out of memory reading %s", path);
    if (st == MW_OK) st = mw__file_read_at(fd, *data, n, 0, path);
    close(fd);
    if (st) {
        mw__free(*data);
        *data = NULL;
        return st;
    }
    *size = n;
    return MW_OK;
}

/* Checks a header against the size of its file: magic, version, limits, the size it implies. */
static mw_status check_header(const char *path, const header *h, uint64_t size) {
    if (memcmp(h->magic, MAGIC, 8) != 0)
        return mw__error(MW_ERR_FORMAT, "%s is not a meshwit checkpoint (bad magic)", path);
    if (h->version != VERSION)
        return mw__error(MW_ERR_FORMAT, "checkpoint %s has version %u; this build reads %u", path,
                         h->version, VERSION);
    if (h->nparams > 1u << 20 || h->elems > (uint64_t)1 << 40 || h->moments > 2 ||
        h->user_bytes > (uint64_t)1 << 40)
        return mw__error(MW_ERR_FORMAT, "checkpoint %s has a corrupt header", path);
    uint64_t expect = sizeof *h + (uint64_t)h->nparams * sizeof(entry) +
                      h->elems * (1 + h->moments) * 4 + h->user_bytes + 8;
    if (size != expect)
        return mw__error(MW_ERR_FORMAT, "checkpoint %s is %s: expected %llu bytes, found %llu",
                         path, size < expect ? "truncated" : "too long", (unsigned long long)expect,
                         (unsigned long long)size);
    return MW_OK;
}

/* The step, once the checksum has vouched for the header. */
static mw_status check_step(const char *path, const header *h) {
    if (h->step < 0 || h->step > MAX_STEP)
        return mw__error(MW_ERR_FORMAT, "checkpoint %s has step %lld, outside [0, 2^53]", path,
                         (long long)h->step);
    return MW_OK;
}

static mw_status checksum_mismatch(const char *path) {
    return mw__error(MW_ERR_FORMAT, "checkpoint %s is damaged (checksum mismatch)", path);
}

/* Checks a file image on its own (magic, version, size, checksum, step); *h its header. */
static mw_status validate_image(const char *path, const unsigned char *data, size_t size,
                                header *h) {
    if (size < sizeof *h + 8)
        return mw__error(MW_ERR_FORMAT, "checkpoint %s is truncated: %zu bytes", path, size);
    memcpy(h, data, sizeof *h);
    mw_status st = check_header(path, h, size);
    if (st) return st;
    uint64_t sum;
    memcpy(&sum, data + size - 8, 8);
    if (sum != mw__fnv1a(MW__FNV_BASIS, data, size - 8)) return checksum_mismatch(path);
    return check_step(path, h);
}

/* Checks a file image against the trainer; on success *h is its header. */
static mw_status validate(mw_trainer *tr, const char *path, const unsigned char *data, size_t size,
                          const layout *l, header *h) {
    const mw_tensor *const *params = l->params;
    int nparams = l->nparams;
    mw_status st = validate_image(path, data, size, h);
    if (st) return st;
    int moments = mw__optimizer_moments(&tr->cfg.optimizer);
    if (h->optimizer != (uint32_t)tr->cfg.optimizer.kind || h->moments != (uint32_t)moments)
        return mw__error(MW_ERR_FORMAT, "checkpoint %s was written with another optimizer", path);
    if (h->nparams != (uint32_t)nparams)
        return mw__error(MW_ERR_FORMAT, "checkpoint %s holds %u parameters; the model has %d", path,
                         h->nparams, nparams);
    const unsigned char *p = data + sizeof *h;
    for (int i = 0; i < nparams; i++, p += sizeof(entry)) {
        entry e;
        memcpy(&e, p, sizeof e);
        e.name[MW_MAX_NAME - 1] = '\0';
        int64_t count = mw__type_numel(&params[i]->type);
        if (strcmp(e.name, params[i]->name) != 0 || e.count != count)
            return mw__error(MW_ERR_FORMAT,
                             "checkpoint %s: parameter %d is '%s' with %lld "
                             "values; the model's is '%s' with %lld",
                             path, i, e.name, (long long)e.count, params[i]->name,
                             (long long)count);
    }
    /* Per-parameter sizes agree, so the totals do unless the header lies. */
    if (h->elems != (uint64_t)whole_elems(l))
        return mw__error(MW_ERR_FORMAT,
                         "checkpoint %s holds %u parameters (%llu values); the "
                         "model has %d (%lld)",
                         path, h->nparams, (unsigned long long)h->elems, nparams,
                         (long long)whole_elems(l));
    return MW_OK;
}

mw_status mw_trainer_load(mw_trainer *tr, const char *path, void *user, size_t capacity,
                          size_t *user_bytes) {
    if (!tr || !path || (capacity && !user))
        return mw__error(MW_ERR_INVALID, "mw_trainer_load: NULL argument");
    layout l;
    mw_status st = layout_of(tr, "mw_trainer_load", &l);
    if (st) return st;
    unsigned char *data = NULL;
    size_t size = 0;
    header h;
    st = slurp(path, &data, &size);
    if (st == MW_OK) st = validate(tr, path, data, size, &l, &h);
    if (st == MW_OK && h.user_bytes > capacity)
        st = mw__error(MW_ERR_FORMAT,
                       "checkpoint %s carries %llu bytes of caller state; the "
                       "buffer holds %zu",
                       path, (unsigned long long)h.user_bytes, capacity);
    if (st == MW_OK) {
        /* Everything checked: only now does the trainer change. */
        const unsigned char *body = data + sizeof h + (size_t)h.nparams * sizeof(entry);
        size_t values = (size_t)h.elems * (1 + h.moments) * 4;
        /* The values sit 8-byte aligned in the file image (a 48-byte header and 56-byte
         * entries), so they go to the devices from there, without another copy. */
        st = transfer(&l, (float *)(uintptr_t)body, (int)h.moments, 1, spanning(tr));
        if (st == MW_OK) {
            for (int s = 0; s < l.nstages; s++)
                if (stage_trainer(tr, s)) stage_trainer(tr, s)->prog->steps = h.step;
            if (h.user_bytes) memcpy(user, body + values, (size_t)h.user_bytes);
            if (user_bytes) *user_bytes = (size_t)h.user_bytes;
        }
    }
    mw__free(data);
    layout_free(&l);
    return st;
}

#define INFO_CHUNK ((size_t)1 << 20) /* mw_checkpoint_info's read buffer */

/* The checks of validate_image on an open file, read in pieces: the header, then the checksum
 * over everything before it in chunks of INFO_CHUNK bytes (so memory does not grow with the
 * file). *h its header. */
static mw_status validate_file(const char *path, int fd, int64_t size, header *h) {
    if (size < (int64_t)(sizeof *h + 8))
        return mw__error(MW_ERR_FORMAT, "checkpoint %s is truncated: %lld bytes", path,
                         (long long)size);
    mw_status st = mw__file_read_at(fd, h, sizeof *h, 0, path);
    if (!st) st = check_header(path, h, (uint64_t)size);
    unsigned char *buf = st ? NULL : mw__malloc(INFO_CHUNK);
    if (!st && !buf) st = mw__error(MW_ERR_NOMEM, "out of memory reading %s", path);
    uint64_t sum = MW__FNV_BASIS, stored = 0;
    for (int64_t at = 0; !st && at < size - 8;) {
        size_t n = (size_t)(size - 8 - at) < INFO_CHUNK ? (size_t)(size - 8 - at) : INFO_CHUNK;
        if (!(st = mw__file_read_at(fd, buf, n, at, path))) sum = mw__fnv1a(sum, buf, n);
        at += (int64_t)n;
    }
    mw__free(buf);
    if (!st) st = mw__file_read_at(fd, &stored, 8, size - 8, path);
    if (!st && stored != sum) st = checksum_mismatch(path);
    return st ? st : check_step(path, h);
}

mw_status mw_checkpoint_info(const char *path, int64_t *step, void *user, size_t capacity,
                             size_t *user_bytes) {
    if (!path || (capacity && !user))
        return mw__error(MW_ERR_INVALID, "mw_checkpoint_info: NULL argument");
    int fd;
    int64_t size;
    header h;
    mw_status st = mw__file_open_read(path, "checkpoint", &fd, &size);
    if (st) return st;
    st = validate_file(path, fd, size, &h);
    if (st == MW_OK && user && h.user_bytes > capacity)
        st = mw__error(MW_ERR_FORMAT,
                       "checkpoint %s carries %llu bytes of caller state; the buffer holds %zu",
                       path, (unsigned long long)h.user_bytes, capacity);
    if (st == MW_OK && user && h.user_bytes)
        st = mw__file_read_at(fd, user, (size_t)h.user_bytes, size - 8 - (int64_t)h.user_bytes,
                              path);
    close(fd);
    if (st == MW_OK) {
        if (step) *step = h.step;
        if (user_bytes) *user_bytes = (size_t)h.user_bytes;
    }
    return st;
}
