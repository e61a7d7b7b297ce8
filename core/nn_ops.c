/* Reshaping and neural-network ops: their rules (by axis name) and the internal backward ops. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/graph_impl.h"

#define DESC(t, buf) mw__type_describe(g, &(t)->type, buf, sizeof buf)

static int usable(mw_graph *g, const char *op, mw_tensor *const *xs, int n) {
    if (!g || g->status) return 0;
    for (int i = 0; i < n; i++) {
        if (!xs[i]) {
            mw__graph_fail(g, MW_ERR_INVALID, "%s: operand %d is NULL", op, i);
            return 0;
        }
        if (xs[i]->g != g) {
            mw__graph_fail(g, MW_ERR_INVALID, "%s: operand %d belongs to another graph", op, i);
            return 0;
        }
    }
    return 1;
}

static int want_dtype(mw_graph *g, const char *op, const char *what, mw_tensor *x, mw_dtype d) {
    if (x->type.dtype == d) return 1;
    char dx[256];
    mw__graph_fail(g, MW_ERR_DTYPE, "%s: %s %s must be %s", op, what, DESC(x, dx),
                   d == MW_F32 ? "f32" : "i32");
    return 0;
}

/* Index of the axis named `name` in x, or -1 with the graph error set (MW_ERR_INVALID for a NULL
 * name, MW_ERR_AXIS for one x lacks). */
static int axis_of(mw_graph *g, const char *op, mw_tensor *x, const char *name) {
    if (!name) {
        mw__graph_fail(g, MW_ERR_INVALID, "%s: the axis name is NULL", op);
        return -1;
    }
    int id = mw__graph_find_name(g, name);
    int i = id < 0 ? -1 : mw__type_find_name(&x->type, id);
    if (i < 0) {
        char dx[256];
        mw__graph_fail(g, MW_ERR_AXIS, "%s: no axis named '%s' in %s", op, name, DESC(x, dx));
    }
    return i;
}

static int unsharded(mw_graph *g, const char *op, mw_tensor *x, int i) {
    if (x->type.ax[i].mesh < 0) return 1;
    char dx[256];
    mw__graph_fail(g, MW_ERR_SHARDING,
                   "%s: axis %s of %s is sharded; this op needs the whole axis on every device", op,
                   g->names[x->type.ax[i].name], DESC(x, dx));
    return 0;
}

/* A new axis name that x does not have yet; -1 with the error set. */
static int fresh_name(mw_graph *g, const char *op, const mw__type *t, const char *name, int skip_lo,
                      int skip_hi) {
    if (!name || !*name || strchr(name, '@') || strchr(name, ',') || strchr(name, '=')) {
        mw__graph_fail(g, MW_ERR_INVALID, "%s: bad axis name '%s'", op, name ? name : "(null)");
        return -1;
    }
    int id = mw__graph_intern(g, name);
    if (id < 0) return -1;
    for (int i = 0; i < t->rank; i++)
        if ((i < skip_lo || i > skip_hi) && t->ax[i].name == id) {
            mw__graph_fail(g, MW_ERR_AXIS, "%s: the tensor already has an axis named '%s'", op,
                           name);
            return -1;
        }
    return id;
}

static mw_tensor *alias(mw_graph *g, mw_tensor *x, const mw__type *t) {
    mw_tensor proto = {.op = MW__OP_ALIAS, .nin = 1, .in = {x}, .type = *t};
    proto.type.partial = x->type.partial;
    return mw__node_new(g, &proto);
}

mw_tensor *mw_rename(mw_graph *g, mw_tensor *x, const char *axis, const char *new_name) {
    if (!usable(g, "mw_rename", &x, 1)) return NULL;
    int i = axis_of(g, "mw_rename", x, axis);
    if (i < 0 || !unsharded(g, "mw_rename", x, i)) return NULL;
    int id = fresh_name(g, "mw_rename", &x->type, new_name, i, i);
    if (id < 0) return NULL;
    mw__type t = x->type;
    t.ax[i].name = id;
    return alias(g, x, &t);
}

mw_tensor *mw_split(mw_graph *g, mw_tensor *x, const char *axis, const char *new_axes) {
    if (!usable(g, "mw_split", &x, 1)) return NULL;
    int i = axis_of(g, "mw_split", x, axis);
    if (i < 0 || !unsharded(g, "mw_split", x, i)) return NULL;
    mw__axis parts[MW_MAX_RANK];
    int n = 0, unknown = -1;
    int64_t known = 1;
    const char *p = new_axes ? new_axes : "";
    char buf[MW_MAX_NAME];
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        size_t nlen = eq ? (size_t)(eq - p) : len;
        if (nlen == 0 || nlen >= sizeof buf || n == MW_MAX_RANK ||
            x->type.rank - 1 + n + 1 > MW_MAX_RANK)
            return mw__graph_fail(g, MW_ERR_INVALID, "mw_split: malformed axis list '%s'",
                                  new_axes);
        memcpy(buf, p, nlen);
        buf[nlen] = '\0';
        int id = fresh_name(g, "mw_split", &x->type, buf, i, i);
        if (id < 0) return NULL;
        for (int j = 0; j < n; j++)
            if (parts[j].name == id)
                return mw__graph_fail(g, MW_ERR_AXIS, "mw_split: axis '%s' named twice", buf);
        int64_t size = -1;
        if (eq) {
            char *end;
            size = strtoll(eq + 1, &end, 10);
            if (end != p + len || size < 1)
                return mw__graph_fail(g, MW_ERR_INVALID, "mw_split: bad size in '%s'", new_axes);
            known *= size;
        } else if (unknown >= 0) {
            return mw__graph_fail(g, MW_ERR_INVALID,
                                  "mw_split: only one size may be left out "
                                  "in '%s'",
                                  new_axes);
        } else {
            unknown = n;
        }
        parts[n++] = (mw__axis){.name = id, .mesh = -1, .size = size};
        p = e ? e + 1 : p + len;
    }
    int64_t total = x->type.ax[i].size;
    if (n == 0) return mw__graph_fail(g, MW_ERR_INVALID, "mw_split: no axes given");
    if (unknown >= 0) {
        if (total % known)
            return mw__graph_fail(g, MW_ERR_SHAPE,
                                  "mw_split: axis %s of size %lld is not "
                                  "divisible by %lld",
                                  axis, (long long)total, (long long)known);
        parts[unknown].size = total / known;
        known = total;
    }
    if (known != total)
        return mw__graph_fail(g, MW_ERR_SHAPE,
                              "mw_split: '%s' holds %lld elements but axis %s has "
                              "%lld",
                              new_axes, (long long)known, axis, (long long)total);
    mw__type t = x->type;
    t.rank = x->type.rank - 1 + n;
    for (int j = 0; j < n; j++) t.ax[i + j] = parts[j];
    for (int j = i + 1; j < x->type.rank; j++) t.ax[j + n - 1] = x->type.ax[j];
    return alias(g, x, &t);
}

mw_tensor *mw_merge(mw_graph *g, mw_tensor *x, const char *axes, const char *new_name) {
    if (!usable(g, "mw_merge", &x, 1)) return NULL;
    int first = -1, n = 0;
    int64_t size = 1;
    const char *p = axes ? axes : "";
    char buf[MW_MAX_NAME];
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0 || len >= sizeof buf)
            return mw__graph_fail(g, MW_ERR_INVALID, "mw_merge: malformed axis list '%s'", axes);
        memcpy(buf, p, len);
        buf[len] = '\0';
        int i = axis_of(g, "mw_merge", x, buf);
        if (i < 0 || !unsharded(g, "mw_merge", x, i)) return NULL;
        if (n == 0)
            first = i;
        else if (i != first + n)
            return mw__graph_fail(g, MW_ERR_SHAPE,
                                  "mw_merge: axes '%s' are not adjacent and in "
                                  "that order",
                                  axes);
        size *= x->type.ax[i].size;
        n++;
        p = e ? e + 1 : p + len;
    }
    if (n == 0) return mw__graph_fail(g, MW_ERR_INVALID, "mw_merge: no axes given");
    mw__type t = x->type;
    /* The merged axes themselves may carry the new name. */
    int id = fresh_name(g, "mw_merge", &t, new_name, first, first + n - 1);
    if (id < 0) return NULL;
    t.ax[first] = (mw__axis){.name = id, .mesh = -1, .size = size};
    for (int j = first + n; j < x->type.rank; j++) t.ax[j - n + 1] = x->type.ax[j];
    t.rank = x->type.rank - n + 1;
    return alias(g, x, &t);
}

mw_tensor *mw__slice_node(mw_graph *g, mw__op op, mw_tensor *x, const mw__type *t, int axis,
                          int64_t start, int64_t len) {
    mw_tensor proto = {.op = op, .nin = 1, .in = {x}, .type = *t, .p.slice = {axis, start, len}};
    proto.type.partial = x->type.partial;
    return mw__node_new(g, &proto);
}

static mw_tensor *slice(mw_graph *g, const char *op, mw_tensor *x, const char *axis, int64_t start,
                        int64_t len, const char *new_name) {
    if (!usable(g, op, &x, 1)) return NULL;
    int i = axis_of(g, op, x, axis);
    if (i >= 0 && x->type.ax[i].mesh >= 0 && !(x = mw__gathered(g, x, NULL))) return NULL;
    if (i < 0 || !unsharded(g, op, x, i)) return NULL;
    int64_t size = x->type.ax[i].size, rows = len ? len : 1;
    if (start < 0 || rows < 1 || start + rows > size)
        return mw__graph_fail(g, MW_ERR_SHAPE,
                              "%s: rows [%lld, %lld) are outside axis %s of size "
                              "%lld",
                              op, (long long)start, (long long)(start + rows), axis,
                              (long long)size);
    mw__type t = x->type;
    if (len == 0) {
        for (int j = i + 1; j < t.rank; j++) t.ax[j - 1] = t.ax[j];
        t.rank--;
    } else {
        t.ax[i].size = len;
        if (new_name) {
            int id = fresh_name(g, op, &t, new_name, i, i);
            if (id < 0) return NULL;
            t.ax[i].name = id;
        }
    }
    return mw__slice_node(g, MW__OP_SLICE, x, &t, i, start, len);
}

mw_tensor *mw_slice(mw_graph *g, mw_tensor *x, const char *axis, int64_t start, int64_t len,
                    const char *new_name) {
    if (len < 1 && g && !g->status)
        return mw__graph_fail(g, MW_ERR_SHAPE, "mw_slice: length %lld is not positive",
                              (long long)len);
    return slice(g, "mw_slice", x, axis, start, len, new_name);
}

mw_tensor *mw_select(mw_graph *g, mw_tensor *x, const char *axis, int64_t index) {
    return slice(g, "mw_select", x, axis, index, 0, NULL);
}

static mw_tensor *gelu(mw_graph *g, const char *op, mw_tensor *x, int exact) {
    if (!usable(g, op, &x, 1) || !want_dtype(g, op, "x", x, MW_F32)) return NULL;
    x = mw__replicated(g, x);
    mw_tensor proto = {
        .op = MW__OP_GELU, .nin = 1, .in = {x}, .type = x->type, .p.gelu.exact = exact};
    return x ? mw__node_new(g, &proto) : NULL;
}

mw_tensor *mw_gelu(mw_graph *g, mw_tensor *x) { return gelu(g, "mw_gelu", x, 0); }

mw_tensor *mw_gelu_erf(mw_graph *g, mw_tensor *x) { return gelu(g, "mw_gelu_erf", x, 1); }

mw_tensor *mw_silu(mw_graph *g, mw_tensor *x) {
    if (!usable(g, "mw_silu", &x, 1) || !want_dtype(g, "mw_silu", "x", x, MW_F32)) return NULL;
    if (!(x = mw__replicated(g, x))) return NULL;
    mw_tensor proto = {.op = MW__OP_SILU, .nin = 1, .in = {x}, .type = x->type};
    return mw__node_new(g, &proto);
}

mw_tensor *mw_swiglu(mw_graph *g, mw_tensor *x, const char *part_axis) {
    const char *op = "mw_swiglu";
    if (!usable(g, op, &x, 1) || !want_dtype(g, op, "x", x, MW_F32)) return NULL;
    int i = axis_of(g, op, x, part_axis);
    if (i < 0 || !unsharded(g, op, x, i)) return NULL;
    if (x->type.ax[i].size != 2) {
        char dx[256];
        return mw__graph_fail(g, MW_ERR_SHAPE,
                              "%s: axis %s of %s must have size 2 (the gate, then the up "
                              "projection)",
                              op, part_axis, DESC(x, dx));
    }
    if (!(x = mw__replicated(g, x))) return NULL;
    mw__type t = x->type;
    for (int j = i + 1; j < t.rank; j++) t.ax[j - 1] = t.ax[j];
    t.rank--;
    mw_tensor proto = {.op = MW__OP_SWIGLU, .nin = 1, .in = {x}, .type = t, .p.along.axis = i};
    return mw__node_new(g, &proto);
}

/* The last axis of x must be `axis`, unsharded. */
static int last_axis(mw_graph *g, const char *op, mw_tensor *x, const char *axis) {
    int i = axis_of(g, op, x, axis);
    if (i < 0 || !unsharded(g, op, x, i)) return -1;
    if (i != x->type.rank - 1) {
        char dx[256];
        mw__graph_fail(g, MW_ERR_SHAPE,
                       "%s: axis %s must be the last axis of %s (permute it "
                       "there first, e.g. with mw_contract's result order)",
                       op, axis, DESC(x, dx));
        return -1;
    }
    return i;
}

/* A normalisation's eps: finite and not negative (0 allowed, as torch allows it). */
static int eps_ok(mw_graph *g, const char *op, float eps) {
    if (isfinite(eps) && eps >= 0.0f) return 1;
    mw__graph_fail(g, MW_ERR_INVALID, "%s: eps %g must be finite and not negative (e.g. 1e-5)", op,
                   (double)eps);
    return 0;
}

mw_tensor *mw_layernorm(mw_graph *g, mw_tensor *x, mw_tensor *w, mw_tensor *b, const char *axis,
                        float eps) {
    mw_tensor *xs[3] = {x, w, b};
    int nin = b ? 3 : 2; /* without b: no bias (Llama-style models, torch's bias=False) */
    if (!usable(g, "mw_layernorm", xs, nin)) return NULL;
    if (!want_dtype(g, "mw_layernorm", "x", x, MW_F32) ||
        !want_dtype(g, "mw_layernorm", "w", w, MW_F32) ||
        (b && !want_dtype(g, "mw_layernorm", "b", b, MW_F32)) || !eps_ok(g, "mw_layernorm", eps))
        return NULL;
    int i = last_axis(g, "mw_layernorm", x, axis);
    if (i < 0) return NULL;
    for (int k = 1; k < nin; k++)
        if (!(xs[k] = mw__gathered(g, xs[k], NULL))) return NULL;
    for (int k = 1; k < nin; k++) {
        const mw__type *t = &xs[k]->type;
        if (t->rank == 1 && t->ax[0].mesh >= 0) {
            char dw[256];
            return mw__graph_fail(g, MW_ERR_SHARDING,
                                  "mw_layernorm: %s %s is split over mesh axis %s; layer norm "
                                  "needs the whole axis %s on every device",
                                  k == 1 ? "w" : "b", DESC(xs[k], dw), g->mesh_names[t->ax[0].mesh],
                                  axis);
        }
        if (t->rank != 1 || t->ax[0].name != x->type.ax[i].name ||
            t->ax[0].size != x->type.ax[i].size) {
            char dx[256], dw[256];
            return mw__graph_fail(g, MW_ERR_SHAPE,
                                  "mw_layernorm: %s %s must have exactly the "
                                  "axis %s of x %s",
                                  k == 1 ? "w" : "b", DESC(xs[k], dw), axis, DESC(x, dx));
        }
    }
    mw_tensor proto = {.op = MW__OP_LAYERNORM, .nin = nin, .type = x->type};
    proto.p.layernorm.eps = eps;
    xs[0] = x;
    for (int k = 0; k < nin; k++)
        if (!(proto.in[k] = mw__replicated(g, xs[k]))) return NULL;
    proto.type = proto.in[0]->type;
    return mw__node_new(g, &proto);
}

mw_tensor *mw_rmsnorm(mw_graph *g, mw_tensor *x, mw_tensor *w, const char *axis, float eps) {
    mw_tensor *xs[2] = {x, w};
    if (!usable(g, "mw_rmsnorm", xs, 2)) return NULL;
    if (!want_dtype(g, "mw_rmsnorm", "x", x, MW_F32) ||
        !want_dtype(g, "mw_rmsnorm", "w", w, MW_F32) || !eps_ok(g, "mw_rmsnorm", eps))
        return NULL;
    int i = last_axis(g, "mw_rmsnorm", x, axis);
    if (i < 0 || !(w = mw__gathered(g, w, NULL))) return NULL;
    const mw__type *t = &w->type;
    if (t->rank == 1 && t->ax[0].mesh >= 0) {
        char dw[256];
        return mw__graph_fail(g, MW_ERR_SHARDING,
                              "mw_rmsnorm: w %s is split over mesh axis %s; RMS norm needs the "
                              "whole axis %s on every device",
                              DESC(w, dw), g->mesh_names[t->ax[0].mesh], axis);
    }
    if (t->rank != 1 || t->ax[0].name != x->type.ax[i].name ||
        t->ax[0].size != x->type.ax[i].size) {
        char dx[256], dw[256];
        return mw__graph_fail(g, MW_ERR_SHAPE,
                              "mw_rmsnorm: w %s must have exactly the axis %s of x %s", DESC(w, dw),
                              axis, DESC(x, dx));
    }
    x = mw__replicated(g, x);
    w = mw__replicated(g, w);
    if (!x || !w) return NULL;
    mw_tensor proto = {
        .op = MW__OP_RMSNORM, .nin = 2, .in = {x, w}, .type = x->type, .p.rmsnorm.eps = eps};
    return mw__node_new(g, &proto);
}

#define MW__ROPE_MAX_DIMS 8192 /* the kernels keep a row's frequencies on the stack */

static int rope_config_ok(mw_graph *g, const char *op, const mw_rope_config *c) {
    const char *bad = NULL;
    if (!(isfinite(c->theta) && c->theta > 1.0f))
        bad = "theta must be finite and above 1";
    else if (c->style != MW_ROPE_HALF && c->style != MW_ROPE_INTERLEAVED)
        bad = "style must be MW_ROPE_HALF or MW_ROPE_INTERLEAVED";
    else if (c->offset < 0)
        bad = "the position offset must not be negative";
    else if (c->scaling != MW_ROPE_SCALING_NONE && c->scaling != MW_ROPE_SCALING_LLAMA3)
        bad = "scaling must be MW_ROPE_SCALING_NONE or MW_ROPE_SCALING_LLAMA3";
    else if (c->scaling == MW_ROPE_SCALING_LLAMA3 &&
             !(isfinite(c->factor) && c->factor > 0 && isfinite(c->low_freq_factor) &&
               c->low_freq_factor > 0 && isfinite(c->high_freq_factor) &&
               c->high_freq_factor > c->low_freq_factor && c->original_max_positions > 0))
        bad = "llama3 scaling needs a finite factor > 0, 0 < low_freq_factor < "
              "high_freq_factor and original_max_positions > 0";
    if (!bad) return 1;
    mw__graph_fail(g, MW_ERR_INVALID, "%s: %s (theta %g, style %d, offset %lld, scaling %d)", op,
                   bad, (double)c->theta, (int)c->style, (long long)c->offset, (int)c->scaling);
    return 0;
}

mw_tensor *mw_rope(mw_graph *g, mw_tensor *x, const char *seq_axis, const char *feature_axis,
                   mw_tensor *pos, const mw_rope_config *cfg) {
    const char *op = "mw_rope";
    mw_tensor *xs[2] = {x, pos};
    if (!usable(g, op, xs, pos ? 2 : 1) || !want_dtype(g, op, "x", x, MW_F32)) return NULL;
    mw_rope_config c = cfg ? *cfg : (mw_rope_config){.theta = 10000.0f};
    if (!rope_config_ok(g, op, &c)) return NULL;
    int f = last_axis(g, op, x, feature_axis), s = -1;
    if (f < 0) return NULL;
    if (seq_axis) {
        if ((s = axis_of(g, op, x, seq_axis)) < 0 || !unsharded(g, op, x, s)) return NULL;
        if (s == f)
            return mw__graph_fail(g, MW_ERR_AXIS, "%s: the sequence and feature axes are both %s",
                                  op, seq_axis);
    }
    char dx[256], dp[256];
    int64_t n = x->type.ax[f].size, dims = c.dims ? c.dims : n;
    if (dims < 2 || dims % 2 || dims > n || dims > MW__ROPE_MAX_DIMS)
        return mw__graph_fail(g, MW_ERR_SHAPE,
                              "%s: %lld rotated features of %s: they must be even, at most the "
                              "axis %s and at most %d",
                              op, (long long)dims, DESC(x, dx), feature_axis, MW__ROPE_MAX_DIMS);
    if (pos) {
        int limit = s >= 0 ? s : f, ok = pos->type.rank <= limit;
        if (pos->type.dtype != MW_I32)
            return mw__graph_fail(g, MW_ERR_DTYPE, "%s: pos %s must be i32", op, DESC(pos, dp));
        for (int k = 0; ok && k < pos->type.rank; k++)
            ok = pos->type.ax[k].name == x->type.ax[k].name &&
                 pos->type.ax[k].size == x->type.ax[k].size &&
                 pos->type.ax[k].mesh == x->type.ax[k].mesh;
        if (!ok)
            return mw__graph_fail(g, MW_ERR_SHAPE,
                                  "%s: pos %s must have leading axes of x %s, in order, before "
                                  "%s",
                                  op, DESC(pos, dp), DESC(x, dx), s >= 0 ? seq_axis : feature_axis);
    }
    int part = -1;
    if (c.part_axis) {
        if ((part = axis_of(g, op, x, c.part_axis)) < 0 || !unsharded(g, op, x, part)) return NULL;
        if (part == s || part == f)
            return mw__graph_fail(g, MW_ERR_AXIS,
                                  "%s: the part axis %s is the sequence or the feature axis", op,
                                  c.part_axis);
        if (c.parts < 1 || c.parts > x->type.ax[part].size)
            return mw__graph_fail(
                g, MW_ERR_INVALID, "%s: %lld parts rotated of axis %s of %s (of size %lld)", op,
                (long long)c.parts, c.part_axis, DESC(x, dx), (long long)x->type.ax[part].size);
    }
    if (!(x = mw__replicated(g, x))) return NULL;
    mw_tensor proto = {.op = MW__OP_ROPE, .nin = pos ? 2 : 1, .in = {x, pos}, .type = x->type};
    proto.p.rope.part = part;
    proto.p.rope.parts = part >= 0 ? (int)c.parts : 1;
    proto.p.rope.seq = s;
    proto.p.rope.style = (int)c.style;
    proto.p.rope.dims = (int)dims;
    proto.p.rope.scaling = (int)c.scaling;
    proto.p.rope.offset = c.offset;
    proto.p.rope.theta = c.theta;
    if (c.scaling == MW_ROPE_SCALING_LLAMA3) {
        proto.p.rope.factor = c.factor;
        proto.p.rope.low = c.low_freq_factor;
        proto.p.rope.high = c.high_freq_factor;
        proto.p.rope.original = c.original_max_positions;
    }
    return mw__node_new(g, &proto);
}

static mw_tensor *softmax(mw_graph *g, const char *op, mw_tensor *x, float scale, int causal) {
    x = mw__replicated(g, x);
    mw_tensor proto = {.op = MW__OP_SOFTMAX,
                       .nin = 1,
                       .in = {x},
                       .type = x->type,
                       .p.softmax = {.scale = scale, .causal = causal}};
    (void)op;
    return x ? mw__node_new(g, &proto) : NULL;
}

mw_tensor *mw_softmax(mw_graph *g, mw_tensor *x, const char *axis, float scale) {
    if (!usable(g, "mw_softmax", &x, 1) || !want_dtype(g, "mw_softmax", "x", x, MW_F32) ||
        last_axis(g, "mw_softmax", x, axis) < 0)
        return NULL;
    return softmax(g, "mw_softmax", x, scale, 0);
}

mw_tensor *mw_causal_softmax(mw_graph *g, mw_tensor *x, const char *query_axis,
                             const char *key_axis, float scale) {
    const char *op = "mw_causal_softmax";
    if (!usable(g, op, &x, 1) || !want_dtype(g, op, "x", x, MW_F32) ||
        last_axis(g, op, x, key_axis) < 0)
        return NULL;
    int q = axis_of(g, op, x, query_axis);
    if (q < 0 || !unsharded(g, op, x, q)) return NULL;
    if (q != x->type.rank - 2) {
        char dx[256];
        return mw__graph_fail(g, MW_ERR_SHAPE, "%s: axis %s must come right before %s in %s", op,
                              query_axis, key_axis, DESC(x, dx));
    }
    return softmax(g, op, x, scale, 1);
}

/* mw_attention (group_axis NULL: part of size 3, dropped from the output) and
 * mw_attention_grouped (part of size G + 2, the output's group axis of size G in its place). */
static mw_tensor *attention(mw_graph *g, const char *op, mw_tensor *qkv, const char *part_axis,
                            const char *group_axis, const char *seq_axis, const char *feature_axis,
                            int causal, float scale) {
    if (!usable(g, op, &qkv, 1)) return NULL;
    if (qkv->type.dtype != MW_BF16 && !want_dtype(g, op, "qkv", qkv, MW_F32)) return NULL;
    int p = axis_of(g, op, qkv, part_axis);
    int s = p < 0 ? -1 : axis_of(g, op, qkv, seq_axis);
    int f = s < 0 ? -1 : axis_of(g, op, qkv, feature_axis);
    char dx[256];
    if (f >= 0 && qkv->type.ax[p].mesh >= 0)
        return mw__graph_fail(g, MW_ERR_SHARDING,
                              "%s: axis %s of %s is split over mesh axis %s; the queries, key and "
                              "value of a head must be on one device: split the %s axis instead "
                              "(tensor parallelism over heads, each with its whole group)",
                              op, part_axis, DESC(qkv, dx), g->mesh_names[qkv->type.ax[p].mesh],
                              group_axis ? "key/value head" : "head");
    if (f < 0 || !unsharded(g, op, qkv, s) || !unsharded(g, op, qkv, f)) return NULL;
    int64_t parts = qkv->type.ax[p].size;
    if (!group_axis && parts != 3)
        return mw__graph_fail(g, MW_ERR_SHAPE, "%s: axis %s of %s must have size 3 (q, k, v)", op,
                              part_axis, DESC(qkv, dx));
    if (group_axis && parts < 3)
        return mw__graph_fail(g, MW_ERR_SHAPE,
                              "%s: axis %s of %s must have size G + 2 >= 3 (G queries, then the "
                              "key, then the value of each key/value head)",
                              op, part_axis, DESC(qkv, dx));
    if (f != qkv->type.rank - 1)
        return mw__graph_fail(g, MW_ERR_SHAPE, "%s: axis %s must be the last axis of %s", op,
                              feature_axis, DESC(qkv, dx));
    if (p == s || s == f || p == f)
        return mw__graph_fail(g, MW_ERR_AXIS,
                              "%s: the part, sequence and feature axes must be three different "
                              "axes of %s; got '%s', '%s' and '%s'",
                              op, DESC(qkv, dx), part_axis, seq_axis, feature_axis);
    mw__type t = qkv->type;
    if (group_axis) {
        int id = fresh_name(g, op, &t, group_axis, p, p);
        if (id < 0) return NULL;
        t.ax[p].name = id;
        t.ax[p].size = parts - 2;
    } else {
        t.rank--;
        for (int i = p; i < t.rank; i++) t.ax[i] = qkv->type.ax[i + 1];
    }
    t.dtype = MW_F32; /* of bf16 q, k, v too: the products are summed in f32 */
    qkv = mw__replicated(g, qkv);
    if (!qkv) return NULL;
    t.partial = qkv->type.partial;
    mw_tensor proto = {.op = MW__OP_ATTENTION,
                       .nin = 1,
                       .in = {qkv},
                       .type = t,
                       .p.attention = {.part = p,
                                       .seq = s,
                                       .feature = f,
                                       .scale = scale,
                                       .causal = causal != 0,
                                       .group = (int)(parts - 2),
                                       .keep = group_axis != NULL}};
    return mw__node_new(g, &proto);
}

mw_tensor *mw_attention(mw_graph *g, mw_tensor *qkv, const char *part_axis, const char *seq_axis,
                        const char *feature_axis, int causal, float scale) {
    return attention(g, "mw_attention", qkv, part_axis, NULL, seq_axis, feature_axis, causal,
                     scale);
}

mw_tensor *mw_attention_grouped(mw_graph *g, mw_tensor *qkv, const char *part_axis,
                                const char *group_axis, const char *seq_axis,
                                const char *feature_axis, int causal, float scale) {
    if (g && !g->status && !group_axis)
        return mw__graph_fail(g, MW_ERR_INVALID, "mw_attention_grouped: group_axis is NULL");
    return attention(g, "mw_attention_grouped", qkv, part_axis, group_axis, seq_axis, feature_axis,
                     causal, scale);
}

mw_tensor *mw_embedding(mw_graph *g, mw_tensor *table, mw_tensor *ids, const char *vocab_axis) {
    const char *op = "mw_embedding";
    mw_tensor *xs[2] = {table, ids};
    if (!usable(g, op, xs, 2) || !want_dtype(g, op, "table", table, MW_F32) ||
        !want_dtype(g, op, "ids", ids, MW_I32))
        return NULL;
    if (!(table = mw__gathered(g, table, NULL))) return NULL;
    int v = axis_of(g, op, table, vocab_axis);
    if (v < 0 || !unsharded(g, op, table, v)) return NULL;
    char dt[256], di[256];
    if (table->type.rank == 2 && table->type.ax[1].mesh >= 0)
        return mw__graph_fail(g, MW_ERR_SHARDING,
                              "%s: axis %s of table %s is sharded; a lookup needs whole rows of "
                              "the table on every device (split a parameter table: it is "
                              "gathered; a computed one cannot be)",
                              op, g->names[table->type.ax[1].name], DESC(table, dt));
    if (v != 0 || table->type.rank != 2)
        return mw__graph_fail(g, MW_ERR_SHAPE,
                              "%s: table %s must be [%s, Dim]: the vocabulary axis first, then "
                              "one other",
                              op, DESC(table, dt), vocab_axis);
    if (mw__type_find_name(&ids->type, table->type.ax[1].name) >= 0 ||
        ids->type.rank + 1 > MW_MAX_RANK)
        return mw__graph_fail(g, MW_ERR_SHAPE, "%s: ids %s already has the axis %s of table %s", op,
                              DESC(ids, di), g->names[table->type.ax[1].name], DESC(table, dt));
    table = mw__replicated(g, table);
    if (!table) return NULL;
    mw_tensor proto = {.op = MW__OP_EMBED, .nin = 2, .in = {table, ids}, .type = ids->type};
    proto.type.dtype = MW_F32;
    proto.type.ax[proto.type.rank++] = table->type.ax[1];
    return mw__node_new(g, &proto);
}

mw_tensor *mw_cross_entropy(mw_graph *g, mw_tensor *logits, mw_tensor *targets,
                            const char *vocab_axis, int64_t valid) {
    const char *op = "mw_cross_entropy";
    mw_tensor *xs[2] = {logits, targets};
    if (!usable(g, op, xs, 2) || !want_dtype(g, op, "logits", logits, MW_F32) ||
        !want_dtype(g, op, "targets", targets, MW_I32))
        return NULL;
    int v = last_axis(g, op, logits, vocab_axis);
    if (v < 0) return NULL;
    int64_t size = logits->type.ax[v].size;
    if (valid < 0 || valid > size)
        return mw__graph_fail(g, MW_ERR_SHAPE, "%s: %lld valid classes but axis %s has %lld", op,
                              (long long)valid, vocab_axis, (long long)size);
    int ok = targets->type.rank == logits->type.rank - 1;
    for (int i = 0; ok && i < targets->type.rank; i++)
        ok = targets->type.ax[i].name == logits->type.ax[i].name &&
             targets->type.ax[i].mesh == logits->type.ax[i].mesh &&
             targets->type.ax[i].size == logits->type.ax[i].size;
    if (!ok) {
        char dl[256], dt[256];
        for (int i = 0; i < targets->type.rank; i++) {
            int j = mw__type_find_name(&logits->type, targets->type.ax[i].name);
            if (j >= 0 && logits->type.ax[j].mesh != targets->type.ax[i].mesh)
                return mw__graph_fail(g, MW_ERR_SHARDING,
                                      "%s: logits %s and targets %s are sharded differently along "
                                      "%s: shard both the same way with mw_shard",
                                      op, DESC(logits, dl), DESC(targets, dt),
                                      g->names[targets->type.ax[i].name]);
        }
        return mw__graph_fail(g, MW_ERR_SHAPE,
                              "%s: targets %s must have the axes of logits %s "
                              "without %s, in the same order",
                              op, DESC(targets, dt), DESC(logits, dl), vocab_axis);
    }
    logits = mw__replicated(g, logits);
    if (!logits) return NULL;
    mw_tensor proto = {.op = MW__OP_XENT,
                       .nin = 2,
                       .in = {logits, targets},
                       .type = targets->type,
                       .p.xent.valid = valid ? valid : size};
    proto.type.dtype = MW_F32;
    return mw__node_new(g, &proto);
}

/* --- backward ops (made by autodiff only) --------------------------------------------------------
 */

mw_tensor *mw__backward_op(mw_graph *g, mw__op op, const mw__type *t, mw_tensor *a, mw_tensor *b,
                           mw_tensor *c, const mw_tensor *fwd) {
    if (!a || !b) return NULL;
    mw_tensor proto = {.op = op, .nin = c ? 3 : 2, .in = {a, b, c}, .type = *t};
    proto.type.partial = 0;
    for (int k = 0; k < proto.nin; k++) {
        if (proto.in[k]->type.dtype == MW_F32) proto.in[k] = mw__replicated(g, proto.in[k]);
        if (!proto.in[k]) return NULL;
        /* Summing over a sharded axis leaves a partial sum, as everywhere. */
        const mw__type *ti = &proto.in[k]->type;
        for (int i = 0; i < ti->rank; i++)
            if (ti->ax[i].mesh >= 0 && mw__type_find(t, &ti->ax[i]) < 0)
                proto.type.partial |= 1u << ti->ax[i].mesh;
    }
    if (fwd) proto.p = fwd->p;
    return mw__node_new(g, &proto);
}
