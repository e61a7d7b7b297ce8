/* Device specs and meshes. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "devices/backend.h"
#include "meshwit.h"
#include "parallel/mesh_impl.h"

int mw_cuda_device_count(void) {
    const mw__backend *b = mw__backend_named("cuda");
    return b && b->device_count ? b->device_count() : 0;
}

static int valid_axis_name(const char *s, size_t len) {
    if (len == 0 || len >= MW_MAX_NAME) return 0;
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_') return 0;
    return 1;
}

static mw_status parse_axes(mw_mesh *m, const char *axes) {
    if (!axes) axes = "X";
    const char *p = axes;
    int product = 1, unsized = -1;
    m->naxes = 0;
    for (;;) {
        const char *e = strchr(p, ',');
        if (!e) e = p + strlen(p);
        const char *eq = memchr(p, '=', (size_t)(e - p));
        const char *name_end = eq ? eq : e;
        if (m->naxes == MW_MAX_MESH_AXES)
            return mw__error(MW_ERR_INVALID, "mesh axes '%s': more than %d axes", axes,
                             MW_MAX_MESH_AXES);
        if (!valid_axis_name(p, (size_t)(name_end - p)))
            return mw__error(MW_ERR_INVALID,
                             "mesh axes '%s': bad axis name (use letters, digits and '_')", axes);
        int a = m->naxes++;
        memcpy(m->axis_name[a], p, (size_t)(name_end - p));
        m->axis_name[a][name_end - p] = '\0';
        for (int j = 0; j < a; j++)
            if (strcmp(m->axis_name[j], m->axis_name[a]) == 0)
                return mw__error(MW_ERR_INVALID, "mesh axes '%s': axis %s appears twice", axes,
                                 m->axis_name[a]);
        if (eq) {
            long v = mw__parse_count(eq + 1, e);
            if (v < 1)
                return mw__error(MW_ERR_INVALID,
                                 "mesh axes '%s': size of %s is not a positive "
                                 "integer",
                                 axes, m->axis_name[a]);
            m->axis_size[a] = (int)v;
            product *= (int)v;
        } else if (unsized >= 0) {
            return mw__error(MW_ERR_INVALID, "mesh axes '%s': only one axis may omit its size",
                             axes);
        } else {
            unsized = a;
        }
        if (!*e) break;
        p = e + 1;
    }
    if (unsized >= 0) {
        if (m->ndevices % product)
            return mw__error(MW_ERR_INVALID, "mesh axes '%s' do not divide %d devices", axes,
                             m->ndevices);
        m->axis_size[unsized] = m->ndevices / product;
        product = m->ndevices;
    }
    if (product != m->ndevices)
        return mw__error(MW_ERR_INVALID, "mesh axes '%s' hold %d devices but the spec gives %d",
                         axes, product, m->ndevices);
    return MW_OK;
}

static mw_status parse_spec(mw_mesh *m, const char *devices) {
    const mw__backend *b;
    mw__spec_devices found;
    mw_status st = mw__backend_for_spec(devices, &b);
    if (st == MW_OK) st = b->parse(devices, devices + strlen(b->name), &found);
    if (st) return st;
    m->backend = b;
    m->vt = b->vt;
    m->ndevices = found.n;
    memcpy(m->device_name, found.name, sizeof found.name);
    memcpy(m->ordinal, found.ordinal, sizeof found.ordinal);
    return MW_OK;
}

/* A backend's name as an int that processes exchange (its first four bytes), and back. */
static int kind_code(const char *name) {
    unsigned char c[4] = {0};
    memcpy(c, name, strnlen(name, 4));
    return (int)((unsigned)c[0] | (unsigned)c[1] << 8 | (unsigned)c[2] << 16 |
                 (unsigned)c[3] << 24);
}

static const char *kind_name(int code, char out[5]) {
    for (int i = 0; i < 4; i++) out[i] = (char)((unsigned)code >> (8 * i) & 0xff);
    out[4] = '\0';
    return out;
}

/* Joins every process's devices into one list: process 0's first. Every process takes part even
 * when its own spec failed, so that all of them return the same status instead of some waiting
 * forever. */
static mw_status span_processes(mw_mesh *m, mw_status local_st) {
    int nprocs = mw__dist_size(), me = mw__dist_rank();
    int mine[2] = {local_st == MW_OK ? kind_code(m->backend->name) : 0,
                   local_st == MW_OK ? m->ndevices : 0};
    int all[2 * MW_MAX_DEVICES];
    if (nprocs > MW_MAX_DEVICES)
        return mw__error(MW_ERR_DEVICE, "%d processes: a mesh holds at most %d devices", nprocs,
                         MW_MAX_DEVICES);
    mw_status st = mw__dist_allgather_ints(mine, 2, all);
    if (st) return st;
    if (local_st) return local_st;
    int total = 0, first = 0;
    for (int p = 0; p < nprocs; p++) {
        if (all[2 * p] == 0)
            return mw__error(MW_ERR_DEVICE, "process %d of %d could not parse its device spec", p,
                             nprocs);
        char k0[5], kp[5];
        if (all[2 * p] != all[0])
            return mw__error(MW_ERR_DEVICE,
                             "processes 0 and %d have devices of different kinds (%s and %s); "
                             "every device of a mesh has the same backend",
                             p, kind_name(all[0], k0), kind_name(all[2 * p], kp));
        if (p < me) first += all[2 * p + 1];
        total += all[2 * p + 1];
    }
    if (total > MW_MAX_DEVICES)
        return mw__error(MW_ERR_DEVICE, "%d processes hold %d devices; a mesh holds at most %d",
                         nprocs, total, MW_MAX_DEVICES);
    /* Move the local devices into place, then name everyone's. */
    char local_name[MW_MAX_DEVICES][32];
    int local_ordinal[MW_MAX_DEVICES];
    memcpy(local_name, m->device_name, sizeof local_name);
    memcpy(local_ordinal, m->ordinal, sizeof local_ordinal);
    const char *kind = m->vt->kind;
    for (int p = 0, d = 0; p < nprocs; p++)
        for (int i = 0; i < all[2 * p + 1]; i++, d++) {
            char name[64]; /* room for any rank and local name; names are cut to 31 characters */
            m->proc_of[d] = p;
            m->ordinal[d] = p == me ? local_ordinal[i] : i;
            if (p == me)
                snprintf(name, sizeof name, "rank%d/%.31s", p, local_name[i]);
            else
                snprintf(name, sizeof name, "rank%d/%.8s:%d", p, kind, i);
            snprintf(m->device_name[d], sizeof m->device_name[d], "%.31s", name);
        }
    m->ndevices = total;
    m->nprocs = nprocs;
    m->proc = me;
    m->local_first = first;
    m->local_count = all[2 * me + 1];
    return MW_OK;
}

static mw_status mesh_make(const char *devices, const char *axes, int local, mw_mesh **out) {
    if (!out) return mw__error(MW_ERR_INVALID, "mw_mesh_new: out is NULL");
    *out = NULL;
    if (!devices) return mw__error(MW_ERR_INVALID, "mw_mesh_new: the device spec is NULL");
    mw_mesh *m = mw__calloc(1, sizeof *m);
    if (!m) return mw__error(MW_ERR_NOMEM, "mw_mesh_new: out of memory");
    mw_status st = parse_spec(m, devices);
    m->nprocs = 1;
    if (!local && mw__dist_size() > 1) {
        st = span_processes(m, st);
    } else if (st == MW_OK) {
        m->local_count = m->ndevices;
        for (int d = 0; d < m->ndevices; d++) m->proc_of[d] = 0;
    }
    if (st == MW_OK) st = parse_axes(m, axes);
    if (st != MW_OK) {
        mw__free(m);
        return st;
    }
    size_t n = (size_t)snprintf(m->desc, sizeof m->desc, "Mesh(");
    for (int a = 0; a < m->naxes; a++)
        n += (size_t)snprintf(m->desc + n, sizeof m->desc - n, "%s%s -> %d", a ? ", " : "",
                              m->axis_name[a], m->axis_size[a]);
    n += (size_t)snprintf(m->desc + n, sizeof m->desc - n, ") over ");
    for (int d = 0; d < m->ndevices; d++)
        n += (size_t)snprintf(m->desc + n, sizeof m->desc - n, "%s%s", d ? ", " : "",
                              m->device_name[d]);
    *out = m;
    return MW_OK;
}

mw_status mw_mesh_new(const char *devices, const char *axes, mw_mesh **out) {
    return mesh_make(devices, axes, 0, out);
}

mw_status mw_mesh_new_local(const char *devices, const char *axes, mw_mesh **out) {
    return mesh_make(devices, axes, 1, out);
}

int mw_mesh_processes(const mw_mesh *mesh) { return mesh ? mesh->nprocs : 0; }

int mw_mesh_local_devices(const mw_mesh *mesh, int *first) {
    if (first) *first = mesh ? mesh->local_first : 0;
    return mesh ? mesh->local_count : 0;
}

void mw_mesh_free(mw_mesh *mesh) { mw__free(mesh); }

int mw_mesh_size(const mw_mesh *mesh) { return mesh ? mesh->ndevices : 0; }

const char *mw_mesh_describe(const mw_mesh *mesh) { return mesh ? mesh->desc : "(null)"; }

const char *mw_backend_describe(const char *backend) {
    const mw__backend *b = backend ? mw__backend_named(backend) : NULL;
    return b && b->describe ? b->describe() : "";
}

const char *mw_backend_warning(const char *backend) {
    const mw__backend *b = backend ? mw__backend_named(backend) : NULL;
    return b && b->warning ? b->warning() : "";
}

int mw__mesh_axis(const mw_mesh *m, const char *name) {
    for (int a = 0; a < m->naxes; a++)
        if (strcmp(m->axis_name[a], name) == 0) return a;
    return -1;
}

int mw__mesh_coord(const mw_mesh *m, int d, int a) {
    int stride = 1;
    for (int j = m->naxes - 1; j > a; j--) stride *= m->axis_size[j];
    return d / stride % m->axis_size[a];
}
