/* Graph tracing: leaves, names, and the lifetime of a graph. The op rules live in ops.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/graph_impl.h"
#include "devices/device.h"

mw_status mw_graph_new(mw_graph **out) {
    if (!out) return mw__error(MW_ERR_INVALID, "mw_graph_new: out is NULL");
    *out = NULL;
    mw_graph *g = mw__calloc(1, sizeof *g);
    if (!g) return mw__error(MW_ERR_NOMEM, "mw_graph_new: out of memory");
    g->seed = 1337;
    *out = g;
    return MW_OK;
}

void mw_graph_free(mw_graph *g) {
    if (!g) return;
    for (int i = 0; i < g->nnodes; i++) mw__free(g->nodes[i]);
    mw__free(g->nodes);
    mw__free(g->names);
    mw__free(g);
}

mw_status mw_graph_status(const mw_graph *g) { return g ? g->status : MW_ERR_INVALID; }

const char *mw_graph_error(const mw_graph *g) { return g ? g->error : "graph is NULL"; }

mw_status mw_region_begin(mw_graph *g, const char *name) {
    if (!g) return mw__error(MW_ERR_INVALID, "mw_region_begin: graph is NULL");
    if (g->status) return mw__error_copy(g->status, g->error);
    if (!name || !name[0])
        mw__graph_fail(g, MW_ERR_INVALID, "mw_region_begin: the region's name is NULL or empty");
    else if (strlen(name) >= MW_MAX_NAME)
        mw__graph_fail(g, MW_ERR_INVALID,
                       "mw_region_begin: region name '%.60s...' is longer than %d characters", name,
                       MW_MAX_NAME - 1);
    else if (g->region_open)
        mw__graph_fail(g, MW_ERR_INVALID,
                       "mw_region_begin(\"%s\"): region \"%s\" is still open; regions do not "
                       "nest: call mw_region_end first",
                       name, g->region_name);
    if (g->status) return g->status;
    g->region_open = ++g->nregions;
    snprintf(g->region_name, sizeof g->region_name, "%s", name);
    return MW_OK;
}

mw_status mw_region_end(mw_graph *g) {
    if (!g) return mw__error(MW_ERR_INVALID, "mw_region_end: graph is NULL");
    if (g->status) return mw__error_copy(g->status, g->error);
    if (!g->region_open) {
        mw__graph_fail(g, MW_ERR_INVALID,
                       "mw_region_end: no region is open (mw_region_begin starts one)");
        return g->status;
    }
    g->region_open = 0;
    return MW_OK;
}

void mw_graph_set_seed(mw_graph *g, uint64_t seed) {
    if (g) g->seed = seed;
}

mw_tensor *mw__graph_fail(mw_graph *g, mw_status status, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g && g->status == MW_OK) {
        g->status = status;
        memcpy(g->error, msg, sizeof g->error);
    }
    mw__error_copy(status, msg);
    return NULL;
}

int mw__graph_find_name(const mw_graph *g, const char *name) {
    for (int i = 0; i < g->nnames; i++)
        if (strcmp(g->names[i], name) == 0) return i;
    return -1;
}

int mw__graph_intern(mw_graph *g, const char *name) {
    int i = mw__graph_find_name(g, name);
    if (i >= 0) return i;
    if (strlen(name) >= MW_MAX_NAME) {
        mw__graph_fail(g, MW_ERR_INVALID, "axis name '%.60s...' is longer than %d characters", name,
                       MW_MAX_NAME - 1);
        return -1;
    }
    if (g->nnames == g->names_cap) {
        int cap = g->names_cap ? 2 * g->names_cap : 16;
        void *p = mw__realloc(g->names, (size_t)cap * sizeof *g->names);
        if (!p) {
            mw__graph_fail(g, MW_ERR_NOMEM, "out of memory interning axis name '%s'", name);
            return -1;
        }
        g->names = p;
        g->names_cap = cap;
    }
    snprintf(g->names[g->nnames], MW_MAX_NAME, "%s", name);
    return g->nnames++;
}

mw_tensor *mw__node_new(mw_graph *g, const mw_tensor *proto) {
    if (g->nnodes == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        void *p = mw__realloc(g->nodes, (size_t)cap * sizeof *g->nodes);
        if (!p) return mw__graph_fail(g, MW_ERR_NOMEM, "out of memory adding a graph node");
        g->nodes = p;
        g->cap = cap;
    }
    for (int i = 0; i < proto->type.rank; i++)
        for (int j = i + 1; j < proto->type.rank; j++)
            if (proto->type.ax[i].mesh >= 0 && proto->type.ax[i].mesh == proto->type.ax[j].mesh) {
                char d[256];
                return mw__graph_fail(g, MW_ERR_SHARDING,
                                      "%s: the result %s would split two axes over mesh axis %s; "
                                      "a tensor can split only one axis over each mesh axis",
                                      mw__op_name(proto->op),
                                      mw__type_describe(g, &proto->type, d, sizeof d),
                                      g->mesh_names[proto->type.ax[i].mesh]);
            }
    /* An op that is not linear reads true values: a partial input is all-reduced first (its
     * constructor need not remember to). */
    mw_tensor *in[3] = {proto->in[0], proto->in[1], proto->in[2]};
    for (int k = 0; k < proto->nin && !(mw__op_traits(proto->op) & MW__T_PARTIAL); k++)
        if (in[k] && in[k]->type.partial && !(in[k] = mw__replicated(g, in[k]))) return NULL;
    mw_tensor *t = mw__malloc(sizeof *t);
    if (!t) return mw__graph_fail(g, MW_ERR_NOMEM, "out of memory adding a graph node");
    *t = *proto;
    memcpy(t->in, in, sizeof in);
    if (!t->region) t->region = g->region_open;
    t->g = g;
    t->id = g->nnodes;
    g->nodes[g->nnodes++] = t;
    return t;
}

const char *mw__axis_label(const mw_graph *g, const mw__axis *a, char *buf, size_t size) {
    if (a->mesh >= 0)
        snprintf(buf, size, "%s@%s", g->names[a->name], g->mesh_names[a->mesh]);
    else
        snprintf(buf, size, "%s", g->names[a->name]);
    return buf;
}

const char *mw__dtype_name(mw_dtype d) {
    switch (d) {
    case MW_F32: return "f32";
    case MW_BF16: return "bf16";
    case MW_I32: return "i32";
    case MW_U16: return "u16";
    }
    return "?";
}

char *mw__type_describe(const mw_graph *g, const mw__type *t, char *buf, size_t size) {
    if (!size) return buf;
    size_t n = (size_t)snprintf(buf, size, "%s[", mw__dtype_name(t->dtype));
    for (int i = 0; i < t->rank && n < size; i++) {
        char label[2 * MW_MAX_NAME];
        n += (size_t)snprintf(buf + n, size - n, "%s%s=%lld", i ? ", " : "",
                              mw__axis_label(g, &t->ax[i], label, sizeof label),
                              (long long)t->ax[i].size);
    }
    if (n < size) snprintf(buf + n, size - n, "]");
    return buf;
}

int mw__type_find(const mw__type *t, const mw__axis *a) {
    for (int i = 0; i < t->rank; i++)
        if (t->ax[i].name == a->name && t->ax[i].mesh == a->mesh) return i;
    return -1;
}

int mw__type_find_name(const mw__type *t, int name) {
    for (int i = 0; i < t->rank; i++)
        if (t->ax[i].name == name) return i;
    return -1;
}

int64_t mw__type_numel(const mw__type *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->ax[i].size;
    return n;
}

/* Shared checks of mw_input and mw_param: a fresh name, well-formed axes. */
static int leaf_type(mw_graph *g, const char *what, const char *name, mw_dtype dtype, mw_axes axes,
                     mw__type *out) {
    if (!name || !*name) {
        mw__graph_fail(g, MW_ERR_INVALID, "%s: the name is %s", what, name ? "empty" : "NULL");
        return -1;
    }
    if (strlen(name) >= MW_MAX_NAME) {
        mw__graph_fail(g, MW_ERR_INVALID, "%s: name '%.60s...' is longer than %d characters", what,
                       name, MW_MAX_NAME - 1);
        return -1;
    }
    for (int i = 0; i < g->nnodes; i++) {
        const mw_tensor *t = g->nodes[i];
        if ((t->op == MW__OP_INPUT || t->op == MW__OP_PARAM || t->op == MW__OP_STATE) &&
            strcmp(t->name, name) == 0) {
            mw__graph_fail(g, MW_ERR_INVALID, "%s: the name '%s' is already used by %s", what, name,
                           t->op == MW__OP_INPUT   ? "an input"
                           : t->op == MW__OP_PARAM ? "a parameter"
                                                   : "a state");
            return -1;
        }
    }
    if (dtype != MW_F32 && dtype != MW_I32) {
        mw__graph_fail(g, MW_ERR_DTYPE,
                       "%s '%s': dtype %s; an input is f32 or i32 (mw_cast an f32 input to bf16)",
                       what, name, mw__dtype_name(dtype));
        return -1;
    }
    if (axes.rank < 0 || axes.rank > MW_MAX_RANK) {
        mw__graph_fail(g, MW_ERR_SHAPE, "%s '%s': rank %d is outside 0..%d", what, name, axes.rank,
                       MW_MAX_RANK);
        return -1;
    }
    memset(out, 0, sizeof *out);
    out->dtype = dtype;
    out->rank = axes.rank;
    for (int i = 0; i < axes.rank; i++) {
        const mw_axis *a = &axes.axis[i];
        if (!a->name || !*a->name || strchr(a->name, '@') || strchr(a->name, ',')) {
            mw__graph_fail(g, MW_ERR_INVALID,
                           "%s '%s': axis %d has an empty name or one containing '@' or ','", what,
                           name, i);
            return -1;
        }
        if (a->size <= 0) {
            mw__graph_fail(g, MW_ERR_SHAPE, "%s '%s': axis %s has size %lld; sizes must be >= 1",
                           what, name, a->name, (long long)a->size);
            return -1;
        }
        int id = mw__graph_intern(g, a->name);
        if (id < 0) return -1;
        for (int j = 0; j < i; j++)
            if (out->ax[j].name == id) {
                mw__graph_fail(g, MW_ERR_SHAPE, "%s '%s': axis %s appears twice", what, name,
                               a->name);
                return -1;
            }
        out->ax[i] = (mw__axis){.name = id, .mesh = -1, .size = a->size};
    }
    return 0;
}

/* A named leaf (proto's op and type set, name checked by leaf_type): the next of *count. */
static mw_tensor *leaf_node(mw_graph *g, mw_tensor *proto, const char *name, int *count) {
    snprintf(proto->name, sizeof proto->name, "%s", name);
    proto->leaf = *count;
    mw_tensor *t = mw__node_new(g, proto);
    if (t) ++*count;
    return t;
}

mw_tensor *mw_input(mw_graph *g, const char *name, mw_dtype dtype, mw_axes axes) {
    if (!g || g->status) return NULL;
    mw_tensor proto = {.op = MW__OP_INPUT};
    if (leaf_type(g, "mw_input", name, dtype, axes, &proto.type)) return NULL;
    return leaf_node(g, &proto, name, &g->ninputs);
}

mw_tensor *mw_state(mw_graph *g, const char *name, mw_axes axes) {
    if (!g || g->status) return NULL;
    mw_tensor proto = {.op = MW__OP_STATE};
    if (leaf_type(g, "mw_state", name, MW_F32, axes, &proto.type)) return NULL;
    return leaf_node(g, &proto, name, &g->nstates);
}

mw_tensor *mw_full(mw_graph *g, mw_axes axes, float value) {
    if (!g || g->status) return NULL;
    mw_tensor proto = {.op = MW__OP_FILL, .p.fill.value = value};
    if (leaf_type(g, "mw_full", "(constant)", MW_F32, axes, &proto.type)) return NULL;
    return mw__node_new(g, &proto);
}

mw_tensor *mw_param(mw_graph *g, const char *name, mw_axes axes, mw_init init) {
    if (!g || g->status) return NULL;
    mw_tensor proto = {.op = MW__OP_PARAM, .init = init};
    if (leaf_type(g, "mw_param", name, MW_F32, axes, &proto.type)) return NULL;
    if (init.kind < MW_INIT_KIND_ZEROS || init.kind > MW_INIT_KIND_UNIFORM)
        return mw__graph_fail(g, MW_ERR_INVALID, "mw_param '%s': unknown initialiser kind %d", name,
                              (int)init.kind);
    return leaf_node(g, &proto, name, &g->nparams);
}

mw_tensor *mw_shard(mw_graph *g, mw_tensor *x, const char *axis, const char *mesh_axis) {
    if (!g || g->status) return NULL;
    if (!x || !axis || !mesh_axis)
        return mw__graph_fail(g, MW_ERR_INVALID, "mw_shard: NULL tensor, axis or mesh axis");
    if (x->g != g) return mw__graph_fail(g, MW_ERR_INVALID, "mw_shard: x belongs to another graph");
    char desc[256];
    mw__type_describe(g, &x->type, desc, sizeof desc);
    if (x->op != MW__OP_INPUT && x->op != MW__OP_SHARD && x->op != MW__OP_PARAM &&
        x->op != MW__OP_STATE && x->op != MW__OP_FILL)
        return mw__graph_fail(g, MW_ERR_SHARDING,
                              "mw_shard: %s is computed, not an input, a parameter or a constant; "
                              "shard the inputs or parameters it is computed from instead",
                              desc);
    int name = mw__graph_find_name(g, axis);
    int i = name < 0 ? -1 : mw__type_find_name(&x->type, name);
    if (i < 0)
        return mw__graph_fail(g, MW_ERR_AXIS, "mw_shard: %s has no axis named '%s'", desc, axis);
    if (x->type.ax[i].mesh >= 0)
        return mw__graph_fail(g, MW_ERR_SHARDING, "mw_shard: axis %s of %s is already sharded",
                              axis, desc);
    if (!*mesh_axis || strlen(mesh_axis) >= MW_MAX_NAME || strchr(mesh_axis, '@'))
        return mw__graph_fail(g, MW_ERR_INVALID, "mw_shard: bad mesh axis name '%s'", mesh_axis);
    int m = 0;
    while (m < g->nmesh_names && strcmp(g->mesh_names[m], mesh_axis) != 0) m++;
    for (int j = 0; m < g->nmesh_names && j < x->type.rank; j++)
        if (x->type.ax[j].mesh == m)
            return mw__graph_fail(g, MW_ERR_SHARDING,
                                  "mw_shard: %s already has an axis sharded over mesh axis %s; "
                                  "one tensor can split only one axis over each mesh axis",
                                  desc, mesh_axis);
    if (x->op == MW__OP_PARAM || x->op == MW__OP_STATE) {
        /* A parameter (or state) is stored sharded: the label goes on the leaf itself, which must
         * not have been used yet (its earlier uses would have seen it whole). */
        for (int j = x->id + 1; j < g->nnodes; j++)
            for (int k = 0; k < g->nodes[j]->nin; k++)
                if (g->nodes[j]->in[k] == x)
                    return mw__graph_fail(g, MW_ERR_SHARDING,
                                          "mw_shard: parameter '%s' %s is already used by an op; "
                                          "shard a parameter right after mw_param, before its "
                                          "first use",
                                          x->name, desc);
    }
    if (m == g->nmesh_names) {
        if (m == MW__MAX_MESH_NAMES)
            return mw__graph_fail(g, MW_ERR_INVALID, "mw_shard: more than %d mesh axis names",
                                  MW__MAX_MESH_NAMES);
        snprintf(g->mesh_names[m], MW_MAX_NAME, "%s", mesh_axis);
        g->nmesh_names++;
    }
    if (x->op == MW__OP_PARAM || x->op == MW__OP_STATE) {
        x->type.ax[i].mesh = m;
        return x;
    }
    if (x->op == MW__OP_FILL) { /* every shard of a constant is the same constant */
        mw__type t = x->type;
        t.ax[i].mesh = m;
        return mw__fill(g, &t, x->p.fill.value);
    }
    mw_tensor proto = {.op = MW__OP_SHARD, .nin = 1, .in = {x}, .type = x->type, .p.shard.axis = i};
    proto.type.ax[i].mesh = m;
    return mw__node_new(g, &proto);
}

int mw_tensor_rank(const mw_tensor *t) { return t ? t->type.rank : -1; }

mw_dtype mw_tensor_dtype(const mw_tensor *t) { return t ? t->type.dtype : MW_F32; }

mw_status mw_tensor_axis(const mw_tensor *t, int i, const char **name, int64_t *size,
                         const char **mesh_axis) {
    if (!t) return mw__error(MW_ERR_INVALID, "mw_tensor_axis: the tensor is NULL");
    if (i < 0 || i >= t->type.rank)
        return mw__error(MW_ERR_INVALID, "mw_tensor_axis: index %d is not in [0, %d)", i,
                         t->type.rank);
    const mw__axis *a = &t->type.ax[i];
    if (name) *name = t->g->names[a->name];
    if (size) *size = a->size;
    if (mesh_axis) *mesh_axis = a->mesh >= 0 ? t->g->mesh_names[a->mesh] : NULL;
    return MW_OK;
}

int64_t mw_tensor_numel(const mw_tensor *t) { return t ? mw__type_numel(&t->type) : 0; }

char *mw_tensor_describe(const mw_tensor *t, char *buf, size_t size) {
    if (!buf || !size) return buf;
    if (!t) {
        snprintf(buf, size, "(null)");
        return buf;
    }
    return mw__type_describe(t->g, &t->type, buf, size);
}

mw_status mw__graph_new_like(const mw_graph *g, mw_graph **out) {
    *out = NULL;
    mw_graph *c = mw__calloc(1, sizeof *c);
    if (!c) return mw__error(MW_ERR_NOMEM, "out of memory copying the graph");
    *c = *g;
    c->nodes = NULL;
    c->names = NULL;
    c->nnodes = c->cap = 0;
    c->ninputs = c->nparams = c->nstates = 0;
    c->names_cap = g->nnames;
    if (g->nnames) {
        c->names = mw__malloc((size_t)g->nnames * sizeof *c->names);
        if (!c->names) {
            mw_graph_free(c);
            return mw__error(MW_ERR_NOMEM, "out of memory copying the graph");
        }
        memcpy(c->names, g->names, (size_t)g->nnames * sizeof *c->names);
    }
    *out = c;
    return MW_OK;
}

mw_status mw__graph_clone(const mw_graph *g, mw_graph **out) {
    mw_graph *c;
    mw_status st = mw__graph_new_like(g, &c);
    *out = NULL;
    if (st) return st;
    c->ninputs = g->ninputs, c->nparams = g->nparams, c->nstates = g->nstates;
    for (int i = 0; i < g->nnodes; i++) {
        mw_tensor proto = *g->nodes[i];
        for (int k = 0; k < proto.nin; k++) proto.in[k] = c->nodes[proto.in[k]->id];
        if (!mw__node_new(c, &proto)) goto oom;
    }
    *out = c;
    return MW_OK;
oom:
    mw_graph_free(c);
    return mw__error(MW_ERR_NOMEM, "out of memory copying the graph");
}

static const char *const op_names[MW__OP_COUNT] = {
#define NAME(KIND, name, params, traits, bf16) [MW__OP_##KIND] = name,
    MW__OPS(NAME)
#undef NAME
};

const char *mw__op_name(int op) { return op >= 0 && op < MW__OP_COUNT ? op_names[op] : "?"; }

static const unsigned op_traits[MW__OP_COUNT] = {
#define TRAITS(KIND, name, params, traits, bf16) [MW__OP_##KIND] = (traits),
    MW__OPS(TRAITS)
#undef TRAITS
};

unsigned mw__op_traits(int op) { return op >= 0 && op < MW__OP_COUNT ? op_traits[op] : 0u; }

int mw__node_mixes(const mw_tensor *t, int chunk_name, int from_rows, int xat, int at) {
    const mw_tensor *x = t->nin ? t->in[0] : NULL;
    switch (mw__op_traits(t->op) & MW__T_MIX) {
    case MW__T_MIX_LAST: return xat >= 0 && xat == x->type.rank - 1;
    case MW__T_MIX_RESHAPE:
        return from_rows && xat >= 0 && x->type.ax[xat].size != t->type.ax[at].size;
    case MW__T_MIX_SLICE: {
        const mw_tensor *big = t->op == MW__OP_PAD ? t : x;
        int a = t->p.slice.axis;
        return a >= 0 && a < big->type.rank && big->type.ax[a].name == chunk_name;
    }
    case MW__T_MIX_ALONG: return xat >= 0 && xat == t->p.along.axis;
    case MW__T_MIX_ATTENTION:
        return xat >= 0 && (xat == t->p.attention.part || xat == t->p.attention.seq ||
                            xat == t->p.attention.feature);
    case MW__T_MIX_CACHED: {
        const mw_tensor *kv = t->in[1];
        int k = mw__type_find_name(&kv->type, chunk_name);
        return k >= 0 && (k == t->p.cached.seq || k == t->p.cached.part || k == kv->type.rank - 1);
    }
    default: return 0;
    }
}

const char *mw__node_mixes_what(const mw_tensor *t) {
    switch (mw__op_traits(t->op) & MW__T_MIX) {
    case MW__T_MIX_RESHAPE: return "a split or merge of the chunk axis";
    case MW__T_MIX_SLICE: return "a slice of the chunk axis";
    case MW__T_MIX_ATTENTION: return "attention along the chunk axis";
    case MW__T_MIX_CACHED: return "cached attention along the chunk axis";
    case MW__T_MIX_ALONG: return "a write along the chunk axis";
    default:
        return t->op == MW__OP_SOFTMAX     ? "a softmax over the chunk axis"
               : t->op == MW__OP_LAYERNORM ? "a layer norm over the chunk axis"
                                           : "a normalisation over the chunk axis";
    }
}

void mw__graph_mixing(const mw_graph *g, int name, char *dep, char *mix, const char **why) {
    for (int i = 0; i < g->nnodes; i++) {
        const mw_tensor *t = g->nodes[i];
        int at = name >= 0 ? mw__type_find_name(&t->type, name) : -1;
        int from_rows = 0; /* an input that depends on the positions and has the axis */
        for (int k = 0; k < t->nin; k++) {
            int j = t->in[k]->id;
            dep[i] |= dep[j];
            if (mix[j] && !mix[i]) mix[i] = 1, why[i] = why[j];
            from_rows |= dep[j] && mw__type_find_name(&t->in[k]->type, name) >= 0;
        }
        if (!dep[i] || mix[i]) continue;
        const mw_tensor *x = t->nin ? t->in[0] : NULL;
        int xat = x ? mw__type_find_name(&x->type, name) : -1;
        const char *w = NULL;
        if (at < 0)
            w = "a value without the chunk axis computed from it";
        else if (mw__node_mixes(t, name, from_rows, xat, at))
            w = mw__node_mixes_what(t);
        if (w) mix[i] = 1, why[i] = w;
    }
}

static const int op_bf16_kernels[MW__OP_COUNT] = {
#define BF16(KIND, name, params, traits, bf16) [MW__OP_##KIND] = MW__I_##bf16,
    MW__OPS(BF16)
#undef BF16
};

int mw__op_bf16_kernel(int op) { return op >= 0 && op < MW__OP_COUNT ? op_bf16_kernels[op] : -1; }

/* Each member of mw__op_params as text (the op's row of MW__OPS names the member). */
typedef union mw__op_params params;
static void describe_none(const params *p, char *buf, size_t size) {
    (void)p;
    (void)size;
    buf[0] = '\0';
}
static void describe_shard(const params *p, char *buf, size_t size) {
    snprintf(buf, size, "axis %d", p->shard.axis);
}
static void describe_fill(const params *p, char *buf, size_t size) {
    snprintf(buf, size, "value %.9g", (double)p->fill.value);
}
static void describe_scale(const params *p, char *buf, size_t size) {
    snprintf(buf, size, "factor %.9g", (double)p->scale.factor);
}
static void describe_slice(const params *p, char *buf, size_t size) {
    snprintf(buf, size, "axis %d, rows %lld+%lld", p->slice.axis, (long long)p->slice.start,
             (long long)p->slice.len);
}
static void describe_gelu(const params *p, char *buf, size_t size) {
    snprintf(buf, size, "%s", p->gelu.exact ? "exact" : "tanh");
}
static void describe_layernorm(const params *p, char *buf, size_t size) {
    snprintf(buf, size, "eps %.9g", (double)p->layernorm.eps);
}
static void describe_rmsnorm(const params *p, char *buf, size_t size) {
    snprintf(buf, size, "eps %.9g", (double)p->rmsnorm.eps);
}
static void describe_rope(const params *p, char *buf, size_t size) {
    snprintf(buf, size,
             "seq %d, part %d/%d, style %d, dims %d, theta %.9g, offset %lld, scaling %d (%.9g "
             "%.9g %.9g %lld)",
             p->rope.seq, p->rope.part, p->rope.parts, p->rope.style, p->rope.dims,
             (double)p->rope.theta, (long long)p->rope.offset, p->rope.scaling,
             (double)p->rope.factor, (double)p->rope.low, (double)p->rope.high,
             (long long)p->rope.original);
}
static void describe_softmax(const params *p, char *buf, size_t size) {
    snprintf(buf, size, "scale %.9g, causal %d", (double)p->softmax.scale, p->softmax.causal);
}
static void describe_xent(const params *p, char *buf, size_t size) {
    snprintf(buf, size, "valid %lld", (long long)p->xent.valid);
}
static void describe_attention(const params *p, char *buf, size_t size) {
    snprintf(buf, size, "axes %d/%d/%d, scale %.9g, causal %d, group %d%s", p->attention.part,
             p->attention.seq, p->attention.feature, (double)p->attention.scale,
             p->attention.causal, p->attention.group, p->attention.keep ? " kept" : "");
}
static void describe_map(const params *p, char *buf, size_t size) {
    snprintf(buf, size, "function %d", p->map.fn);
}
static void describe_dropout(const params *p, char *buf, size_t size) {
    snprintf(buf, size, "p %.9g, stream %llu", (double)p->dropout.p,
             (unsigned long long)p->dropout.stream);
}
static void describe_along(const params *p, char *buf, size_t size) {
    snprintf(buf, size, "axis %d", p->along.axis);
}
static void describe_cached(const params *p, char *buf, size_t size) {
    snprintf(buf, size, "axes %d/%d, scale %.9g", p->cached.seq, p->cached.part,
             (double)p->cached.scale);
}

char *mw__op_params_describe(const mw_tensor *n, char *buf, size_t size) {
    buf[0] = '\0';
    switch (n->op) {
#define DESCRIBE(KIND, name, member, traits, bf16)                                                 \
    case MW__OP_##KIND: describe_##member(&n->p, buf, size); break;
        MW__OPS(DESCRIBE)
#undef DESCRIBE
    case MW__OP_COUNT: break;
    }
    return buf;
}
