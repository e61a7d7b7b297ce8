/* Device specs and meshes. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "meshwit.h"
#include "parallel/mesh_impl.h"

#ifdef MESHWIT_HAVE_CUDA
#include "devices/cuda/cuda.h"
#endif

#ifndef MESHWIT_HAVE_MPI
/* A build without MPI: always one process. */
int mw__dist_size(void) { return 1; }
int mw__dist_rank(void) { return 0; }
mw_status mw__dist_allgather_ints(const int *mine, int n, int *out) {
    memcpy(out, mine, (size_t)n * sizeof *out);
    return MW_OK;
}
mw_status mw_distributed_init(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    return MW_OK;
}
void mw_distributed_finalize(void) {}
int mw_distributed_rank(void) { return 0; }
int mw_distributed_size(void) { return 1; }
int mw_distributed_available(void) { return 0; }
void mw_distributed_abort(int code) { exit(code); }
#endif

int mw_cuda_device_count(void) {
#ifdef MESHWIT_HAVE_CUDA
    return mw__cuda_device_count();
#else
    return 0;
#endif
}

static const char spec_help[] = "expected cpu, cpu:N (N >= 1), cuda:I[,J...], cuda:all or cuda:IxN";

/* Parses a positive decimal integer filling all of [s, end); -1 when it is not one. */
static long parse_count(const char *s, const char *end) {
    if (s == end || !isdigit((unsigned char)*s)) return -1;
    errno = 0;
    char *e;
    long v = strtol(s, &e, 10);
    if (e != end || errno || v > 1000000) return -1;
    return v;
}

static mw_status parse_cpu(mw_mesh *m, const char *spec, const char *rest) {
    long n = 1;
    if (*rest == ':') {
        n = parse_count(rest + 1, rest + strlen(rest));
        if (n < 0)
            return mw__error(MW_ERR_DEVICE, "malformed device spec '%s': %s", spec, spec_help);
    } else if (*rest) {
        return mw__error(MW_ERR_DEVICE, "malformed device spec '%s': %s", spec, spec_help);
    }
    if (n < 1)
        return mw__error(MW_ERR_DEVICE,
                         "device spec '%s' asks for no devices: use cpu:N with N >= 1", spec);
    if (n > MW_MAX_DEVICES)
        return mw__error(MW_ERR_DEVICE, "device spec '%s' asks for %ld devices; at most %d", spec,
                         n, MW_MAX_DEVICES);
    m->vt = &mw__cpu_device;
    m->ndevices = (int)n;
    for (int i = 0; i < m->ndevices; i++) {
        snprintf(m->device_name[i], sizeof m->device_name[i], "cpu:%d", i);
        m->ordinal[i] = i;
    }
    return MW_OK;
}

static mw_status parse_cuda(mw_mesh *m, const char *spec, const char *rest) {
    if (*rest != ':' || !rest[1])
        return mw__error(MW_ERR_DEVICE, "malformed device spec '%s': %s", spec, spec_help);
    rest++;
    int have = mw_cuda_device_count();
    int ids[MW_MAX_DEVICES], n = 0, copies = 1;
    if (strcmp(rest, "all") == 0) {
        for (int i = 0; i < have && n < MW_MAX_DEVICES; i++) ids[n++] = i;
    } else if (strchr(rest, 'x')) {
        const char *x = strchr(rest, 'x');
        long id = parse_count(rest, x), c = parse_count(x + 1, x + strlen(x));
        if (id < 0 || c < 1 || c > MW_MAX_DEVICES)
            return mw__error(MW_ERR_DEVICE, "malformed device spec '%s': %s", spec, spec_help);
        ids[n++] = (int)id;
        copies = (int)c;
    } else {
        const char *p = rest;
        for (;;) {
            const char *e = strchr(p, ',');
            if (!e) e = p + strlen(p);
            long id = parse_count(p, e);
            if (id < 0 || n == MW_MAX_DEVICES)
                return mw__error(MW_ERR_DEVICE, "malformed device spec '%s': %s", spec, spec_help);
            for (int j = 0; j < n; j++)
                if (ids[j] == id)
                    return mw__error(MW_ERR_DEVICE, "device spec '%s' names GPU %ld twice", spec,
                                     id);
            ids[n++] = (int)id;
            if (!*e) break;
            p = e + 1;
        }
    }
#ifndef MESHWIT_HAVE_CUDA
    (void)m;
    (void)copies;
    return mw__error(MW_ERR_DEVICE,
                     "device spec '%s': this build of meshwit has no CUDA backend (configure with "
                     "-DMESHWIT_CUDA=ON on a machine with the CUDA toolkit)",
                     spec);
#else
    if (have == 0 || n == 0)
        return mw__error(MW_ERR_DEVICE, "device spec '%s': no CUDA devices are available", spec);
    for (int j = 0; j < n; j++)
        if (ids[j] >= have)
            return mw__error(MW_ERR_DEVICE, "device spec '%s': GPU %d does not exist (%d visible)",
                             spec, ids[j], have);
    if (n * copies > MW_MAX_DEVICES)
        return mw__error(MW_ERR_DEVICE, "device spec '%s': more than %d devices", spec,
                         MW_MAX_DEVICES);
    m->vt = &mw__cuda_device;
    m->ndevices = 0;
    for (int j = 0; j < n; j++)
        for (int c = 0; c < copies; c++) {
            int d = m->ndevices++;
            m->ordinal[d] = ids[j];
            if (copies > 1)
                snprintf(m->device_name[d], sizeof m->device_name[d], "cuda:%d#%d", ids[j], c);
            else
                snprintf(m->device_name[d], sizeof m->device_name[d], "cuda:%d", ids[j]);
        }
    return MW_OK;
#endif
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
            long v = parse_count(eq + 1, e);
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
    if (strncmp(devices, "cpu", 3) == 0) return parse_cpu(m, devices, devices + 3);
    if (strncmp(devices, "cuda", 4) == 0) return parse_cuda(m, devices, devices + 4);
    return mw__error(MW_ERR_DEVICE, "malformed device spec '%s': %s", devices, spec_help);
}

/* Joins every process's devices into one list: process 0's first. Every process takes part even
 * when its own spec failed, so that all of them return the same status instead of some waiting
 * forever. */
static mw_status span_processes(mw_mesh *m, mw_status local_st) {
    int nprocs = mw__dist_size(), me = mw__dist_rank();
    int mine[2] = {local_st == MW_OK ? (m->vt == &mw__cpu_device ? 1 : 2) : 0,
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
        if (all[2 * p] != all[0])
            return mw__error(MW_ERR_DEVICE,
                             "processes 0 and %d have devices of different kinds (%s and %s); "
                             "every device of a mesh has the same backend",
                             p, all[0] == 1 ? "cpu" : "cuda", all[2 * p] == 1 ? "cpu" : "cuda");
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
    if (!devices) return mw__error(MW_ERR_DEVICE, "mw_mesh_new: device spec is NULL");
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
