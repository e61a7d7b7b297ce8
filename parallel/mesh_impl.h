/* Internal: meshes. */
#ifndef MW__MESH_IMPL_H
#define MW__MESH_IMPL_H

#include "collectives/dist.h"
#include "devices/device.h"
#include "meshwit/mesh.h"

struct mw_mesh {
    const struct mw__backend *backend; /* every device of a mesh has the same backend */
    const mw__device_vtable *vt;       /* backend->vt */
    int ndevices;
    char device_name[MW_MAX_DEVICES][32]; /* "cpu:0", "cuda:0", "cuda:0#1" */
    int ordinal[MW_MAX_DEVICES];          /* backend number (GPU id; CPU: index) */
    int naxes;
    char axis_name[MW_MAX_MESH_AXES][MW_MAX_NAME];
    int axis_size[MW_MAX_MESH_AXES];
    char desc[64 + MW_MAX_DEVICES * 40];
    /* Processes the mesh spans (1: a process-local mesh). Devices are numbered process by process
     * (rank 0's first), each process's in its own spec's order; this process holds devices
     * [local_first, local_first + local_count). */
    int nprocs;
    int proc;
    int local_first, local_count;
    int proc_of[MW_MAX_DEVICES];
};

/* Index of the mesh axis called name, or -1. */
int mw__mesh_axis(const mw_mesh *m, const char *name);
/* Coordinate of device d along mesh axis a (row-major: the last axis varies fastest). */
int mw__mesh_coord(const mw_mesh *m, int d, int a);

#endif
