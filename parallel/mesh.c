/* Device specs and meshes. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "parallel/mesh_impl.h"

#ifdef MESHWIT_HAVE_CUDA
#include "devices/cuda/cuda.h"
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

mw_status mw_mesh_new(const char *devices, const char *axes, mw_mesh **out) {
    if (!out) return mw__error(MW_ERR_INVALID, "mw_mesh_new: out is NULL");
    *out = NULL;
    if (!devices) return mw__error(MW_ERR_DEVICE, "mw_mesh_new: device spec is NULL");
    mw_mesh *m = mw__calloc(1, sizeof *m);
    if (!m) return mw__error(MW_ERR_NOMEM, "mw_mesh_new: out of memory");
    mw_status st;
    if (strncmp(devices, "cpu", 3) == 0)
        st = parse_cpu(m, devices, devices + 3);
    else if (strncmp(devices, "cuda", 4) == 0)
        st = parse_cuda(m, devices, devices + 4);
    else
        st = mw__error(MW_ERR_DEVICE, "malformed device spec '%s': %s", devices, spec_help);
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
