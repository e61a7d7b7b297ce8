/* The backend registry: the CPU backend built in, others registered by their modules. */
#include "devices/backend.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/graph_impl.h"
#include "core/plan.h"
#include "devices/module.h"
#include "meshwit.h"

#define MAX_BACKENDS 8

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static const mw__backend *table[MAX_BACKENDS] = {&mw__cpu_backend};
static int ntable = 1;

static const mw__backend *find(const char *name, size_t len) {
    const mw__backend *b = NULL;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < ntable && !b; i++)
        if (strlen(table[i]->name) == len && strncmp(table[i]->name, name, len) == 0) b = table[i];
    pthread_mutex_unlock(&mu);
    return b;
}

mw_status mw__backend_register(const mw__backend *b) {
    if (!b || !b->name || !b->vt || !b->parse || b->reducers == MW__REDUCERS_NONE)
        return mw__error(MW_ERR_INVALID,
                         "a backend needs a name, a vtable, parse and a family of reducers");
    mw_status st = MW_OK;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < ntable && !st; i++)
        if (strcmp(table[i]->name, b->name) == 0)
            st = mw__error(MW_ERR_INVALID, "a backend called %s is registered already", b->name);
    if (!st && ntable == MAX_BACKENDS)
        st = mw__error(MW_ERR_INVALID, "backend %s: more than %d backends", b->name, MAX_BACKENDS);
    if (!st) table[ntable++] = b;
    pthread_mutex_unlock(&mu);
    return st;
}

/* The backend called name[0..len), loading the module that provides it when there is one. */
static mw_status lookup(const char *name, size_t len, const mw__backend **out) {
    if ((*out = find(name, len))) return MW_OK;
    char n[16];
    if (len >= sizeof n) return MW_ERR_NOT_FOUND;
    memcpy(n, name, len);
    n[len] = '\0';
    mw_status st = mw__module_for_backend(n);
    if (st) return st;
    if ((*out = find(name, len))) return MW_OK;
    return mw__error(MW_ERR_UNSUPPORTED,
                     "the module for '%s' devices loaded but registered no '%s' backend (a module "
                     "of another build?)",
                     n, n);
}

mw_status mw__backend_for_spec(const char *spec, const mw__backend **out) {
    *out = NULL;
    size_t len = strcspn(spec, ":");
    mw_status st = lookup(spec, len, out);
    if (st == MW_ERR_NOT_FOUND && !*out)
        return mw__error(MW_ERR_DEVICE, "malformed device spec '%s': %s", spec, MW__SPEC_HELP);
    if (st) {
        char msg[MW__MSG_SIZE];
        snprintf(msg, sizeof msg, "%s", mw_last_error());
        return mw__error(st, "device spec '%s': %s", spec, msg);
    }
    return MW_OK;
}

const mw__backend *mw__backend_named(const char *name) {
    const mw__backend *b;
    return lookup(name, strlen(name), &b) == MW_OK ? b : NULL;
}

/* --- what a backend runs ------------------------------------------------------------------- */

static const char *const op_names[MW__I_COUNT] = {
#define NAME(KIND, name, type, dtypes, ROLES) [MW__I_##KIND] = #name,
    MW__KERNELS(NAME)
#undef NAME
        [MW__I_ALLREDUCE] = "allreduce",
    [MW__I_GRAD_BUCKET] = "allreduce",
    [MW__I_ALLGATHER] = "all_gather",
    [MW__I_REDUCE_SCATTER] = "reduce_scatter",
    [MW__I_GATHER_START] = "all_gather_start",
    [MW__I_GATHER_WAIT] = "all_gather_wait",
};

const char *mw__ins_name(int kind) {
    return kind >= 0 && kind < MW__I_COUNT && op_names[kind] ? op_names[kind] : "?";
}

/* Whether the vtable has the kernel that instruction op calls. */
static int has_slot(const mw__device_vtable *vt, int op) {
    switch ((mw__ins_kind)op) {
#define SLOT(KIND, name, type, dtypes, ROLES)                                                      \
    case MW__I_##KIND: return vt->name != NULL;
        MW__KERNELS(SLOT)
#undef SLOT
    case MW__I_ALLREDUCE:
    case MW__I_GRAD_BUCKET:
    case MW__I_ALLGATHER:
    case MW__I_REDUCE_SCATTER:
    case MW__I_GATHER_START:
    case MW__I_GATHER_WAIT: return 1; /* the reducer's */
    case MW__I_COUNT: break;
    }
    return 0;
}

int mw__backend_supports(const mw__backend *b, int op, mw_dtype dtype) {
    if (b->supports) return b->supports(op, dtype);
    /* The kernels compute in f32; i32 values (token ids) only pass through copies of 4-byte
     * elements. */
    return (dtype == MW_F32 || (dtype == MW_I32 && op == MW__I_COPY)) && has_slot(b->vt, op);
}

int mw__backend_rotary_attention(const mw__backend *b) {
    const char *env = getenv("MESHWIT_ROPE");
    if (!b->vt->rotary_attention || (env && !strcmp(env, "separate"))) return 0;
    return env && !strcmp(env, "fused") ? 2 : 1;
}

uint64_t mw__backend_bf16_writers(const mw__backend *b) {
    uint64_t mask = 0;
    for (int k = 0; k < MW__I_COUNT; k++)
        if ((mw__kernel_dtypes(k) & MW__DT_BF16_OUT) && mw__backend_supports(b, k, MW_BF16))
            mask |= UINT64_C(1) << k;
    return mask;
}

/* The names of each kernel's operands, in the order of its row's roles. */
#define ROLE_NAME_(X, role) #role,
#define ROLE_NAMES_(KIND, name, type, dtypes, ROLES) [MW__I_##KIND] = {ROLES(ROLE_NAME_, name)},
static const char *const role_names[MW__I_COUNT][MW__MAX_ROLES] = {MW__KERNELS(ROLE_NAMES_)};
#undef ROLE_NAMES_
#undef ROLE_NAME_

/* The first operand of in (its output is role 0) that b cannot serve in its dtype, or -1; *dtype
 * is the dtype asked for: bf16 where an operand is bf16 (read where the row has MW__DT_BF16,
 * written where it has MW__DT_BF16_OUT), else what the kernel writes. */
static int refused_operand(const mw__backend *b, const mw__ins *in, mw_dtype *dtype) {
    int op = (int)in->kind, n = mw__ins_roles(op);
    unsigned dt = mw__kernel_dtypes(op);
    for (int r = 0; r < n; r++) {
        const mw__ref *ref = &in->ref.all[r];
        if (ref->off < 0 || ref->dtype != MW_BF16) continue;
        *dtype = MW_BF16;
        if (!mw__backend_supports(b, op, MW_BF16) || !(dt & (r ? MW__DT_BF16 : MW__DT_BF16_OUT)))
            return r;
    }
    *dtype = in->ref.all[0].dtype;
    return mw__backend_supports(b, op, *dtype) ? -1 : 0;
}

mw_status mw__backend_check_plan(const mw__backend *b, const struct mw_graph *g,
                                 const struct mw__plan *plan, const char *device) {
    for (int i = 0; i < plan->nins; i++) {
        const mw__ins *in = &plan->ins[i];
        mw_dtype dtype;
        int r = refused_operand(b, in, &dtype);
        if (r < 0 && b->vt->check && in->kind < MW__I_ALLREDUCE) {
            mw_status st = b->vt->check((int)in->kind, &in->k);
            if (st) {
                char msg[MW__MSG_SIZE];
                snprintf(msg, sizeof msg, "%s", mw_last_error());
                const char *node = in->node >= 0 && in->node < g->nnodes
                                       ? mw__op_name(g->nodes[in->node]->op)
                                       : "?";
                return mw__error(st, "device %s: %s (graph node %d, %s)", device, msg, in->node,
                                 node);
            }
        }
        if (r < 0) continue;
        int op = (int)in->kind;
        const char *what = mw__ins_name(op);
        const char *node =
            in->node >= 0 && in->node < g->nnodes ? mw__op_name(g->nodes[in->node]->op) : "?";
        const char *role = op < MW__I_COUNT && role_names[op][r] ? role_names[op][r] : "buffer";
        const char *hint = op == MW__I_ATTENTION || op == MW__I_ATTENTION_GRAD
                               ? "; write the attention out with mw_contract and "
                                 "mw_causal_softmax for this device"
                               : "";
        return mw__error(MW_ERR_UNSUPPORTED,
                         "device %s (%s backend) does not support op %s with its %s %s %s "
                         "(graph node %d, %s)%s",
                         device, b->name, what, r ? "operand" : "output", role,
                         mw__dtype_name(dtype), in->node, node, hint);
    }
    return MW_OK;
}
