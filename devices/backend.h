/* Internal: the backend registry. A backend says everything the rest of meshwit needs to know
 * about one kind of device: the device-spec prefix it answers to and how to parse the rest, the
 * device vtable, which ops it implements, the family of reducers that moves data among its
 * devices and its process-wide hooks. Core and parallel code ask the registry and never name a
 * backend; a backend built as a separate module (CUDA) registers itself when the module is
 * loaded (devices/module.h), the first time a spec names it. A backend names its reducers' family
 * only: the collectives floor above the devices (collectives/reducer_select.h) picks the reducer
 * of that family for a group of devices.
 *
 * Thread-safety: lookups and registration may be called from any thread (a mutex guards the
 * table); an entry, once registered, is never removed or changed. */
#ifndef MW__BACKEND_H
#define MW__BACKEND_H

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>

#include "core/plan.h"
#include "devices/device.h"
#include "meshwit/mesh.h"

struct mw__plan;
struct mw_graph;

/* The devices a spec names, before they are placed in a mesh. */
typedef struct mw__spec_devices {
    int n;
    char name[MW_MAX_DEVICES][32]; /* "cpu:0", "cuda:1", "cuda:0#1" */
    int ordinal[MW_MAX_DEVICES];   /* the backend's own number (GPU id; CPU: index) */
} mw__spec_devices;

/* The reducers that can move a backend's buffers (collectives/reducer_select.c chooses among
 * them). */
typedef enum mw__reducer_family {
    MW__REDUCERS_NONE, /* not set: the registry refuses the backend */
    /* Buffers in the host's memory: shared memory among the devices of a process, hierarchical
     * over MPI across processes (libmeshwit-mpi.so). */
    MW__REDUCERS_HOST,
    /* CUDA device memory (libmeshwit-cuda.so): cuda-local among devices of one GPU, NCCL among
     * distinct GPUs, NCCL over MPI across processes (libmeshwit-nccl-mpi.so). */
    MW__REDUCERS_CUDA
} mw__reducer_family;

typedef struct mw__backend {
    const char *name; /* the spec prefix and the device kind: "cpu", "cuda" */
    const mw__device_vtable *vt;
    /* Parses spec, whose prefix is name and rest what follows it ("", ":2", ":0,1"), into out.
     * Errors: MW_ERR_DEVICE naming spec (malformed, no such device). */
    mw_status (*parse)(const char *spec, const char *rest, mw__spec_devices *out);
    /* Whether the backend runs plan instruction op (an mw__ins_kind) on dtype. NULL: an op is
     * supported when its vtable slot is set, on f32. */
    int (*supports)(int op, mw_dtype dtype);
    mw__reducer_family reducers; /* what moves data among a group of its devices */
    /* Process hook, optional: sets the process-wide thread count of the backend's math library
     * (n > 0; BLAS) and returns the previous one; the trainer sets it while it lives. */
    int (*set_threads)(int n);
    /* Optional: the number of devices present (GPUs); 0 on any failure. */
    int (*device_count)(void);
    /* Optional (mw_backend_describe, mw_backend_warning): what the backend's math runs on, in
     * one line, and a warning about a setup that costs speed, else "". Never NULL. */
    const char *(*describe)(void);
    const char *(*warning)(void);
} mw__backend;

/* The CPU backend (always built in). */
extern const mw__backend mw__cpu_backend;

/* Adds b to the registry (b is borrowed and must stay valid for the process's life). Errors:
 * MW_ERR_INVALID (a backend of that name is registered already, or the table is full). */
mw_status mw__backend_register(const mw__backend *b);

/* The backend whose name is the prefix of spec (followed by ':' or the end), loading its module
 * when it is one (CUDA); *out is NULL and the status an error otherwise: MW_ERR_DEVICE for a
 * spec no backend claims (naming it and the accepted forms), MW_ERR_UNSUPPORTED or
 * MW_ERR_DEVICE from the module when it cannot be loaded. */
mw_status mw__backend_for_spec(const char *spec, const mw__backend **out);

/* The registered backend called name, loading its module when it is one; NULL when there is none
 * (the reason, when a module failed to load, is left as the last error). */
const mw__backend *mw__backend_named(const char *name);

/* The row of the instruction table for kernel kind op (MW__DT_* bits); 0 for a kind out of range
 * or a collective. */
static inline unsigned mw__kernel_dtypes(int op) {
    static const unsigned char dtypes[MW__I_COUNT] = {
#define MW__DTYPES_(KIND, name, type, dt, ROLES) [MW__I_##KIND] = (dt),
        MW__KERNELS(MW__DTYPES_)
#undef MW__DTYPES_
    };
    return op >= 0 && op < MW__I_COUNT ? dtypes[op] : 0u;
}

/* The supports of a backend whose every vtable slot is filled and whose kernels take bf16 where a
 * bf16 contraction needs them (the CPU's and CUDA's): every op on f32, and bf16 and i32 where the
 * instruction table's row says so (conversions and copies, GEMMs, attention, layer norm, GELU and
 * its gradient; i32 through copies). Whether a bf16 operand is read or written is the row's too:
 * mw__backend_check_plan asks it operand by operand. */
static inline int mw__supports_bf16_kernels(int op, mw_dtype dtype) {
    if (op < 0 || op >= MW__I_COUNT) return 0;
    unsigned dt = mw__kernel_dtypes(op);
    switch (dtype) {
    case MW_F32: return 1;
    case MW_I32: return (dt & MW__DT_I32) != 0;
    case MW_BF16: return (dt & (MW__DT_BF16 | MW__DT_BF16_OUT)) != 0;
    default: return 0;
    }
}

/* The instruction's name ("gemm", "layernorm_dx", "allreduce"), "?" for a kind out of range. */
const char *mw__ins_name(int kind);

/* Whether b runs plan instruction op on dtype (b->supports, or the vtable's slot). */
int mw__backend_supports(const mw__backend *b, int op, mw_dtype dtype);

/* The instruction kinds (bit k: mw__ins_kind k) whose kernels b runs with a bf16 output (their
 * row has MW__DT_BF16_OUT): those the plan may have write a value that is only read as bf16 in
 * bf16 directly. */
uint64_t mw__backend_bf16_writers(const mw__backend *b);
/* Where the plan applies rotary embeddings that attention reads on this backend
 * (mw__plan_target.rotary): 0 in rope passes of their own, always where its attention kernels
 * cannot (the vtable's rotary_attention) or MESHWIT_ROPE=separate asks; 2 inside the attention
 * kernels wherever the graph allows (MESHWIT_ROPE=fused); 1 (auto, the default) inside them where
 * the attention reads f32. */
int mw__backend_rotary_attention(const mw__backend *b);

/* MW_OK when b runs every instruction of plan: its kind, on the dtypes of its operands (a bf16
 * input where the row has MW__DT_BF16, a bf16 output where it has MW__DT_BF16_OUT); otherwise
 * MW_ERR_UNSUPPORTED naming the first op it lacks, the operand, the graph node it comes from and
 * device (its name, "cuda:0"). */
mw_status mw__backend_check_plan(const mw__backend *b, const struct mw_graph *g,
                                 const struct mw__plan *plan, const char *device);

/* A positive decimal integer filling all of [s, end), at most 1000000; -1 when it is not one
 * (inline: the backend modules parse specs with it too). */
static inline long mw__parse_count(const char *s, const char *end) {
    if (s == end || !isdigit((unsigned char)*s)) return -1;
    errno = 0;
    char *e;
    long v = strtol(s, &e, 10);
    if (e != end || errno || v > 1000000) return -1;
    return v;
}

/* The accepted spec forms, for messages. */
#define MW__SPEC_HELP "expected cpu, cpu:N (N >= 1), cuda:I[,J...], cuda:all or cuda:IxN"

#endif
