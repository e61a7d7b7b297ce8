/* Listing parameters, and a program's (a trainer's, an inference program's) weights saved to and
 * loaded from safetensors files. */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "meshwit/pipeline.h"
#include "parallel/pipeline_impl.h"
#include "parallel/program.h"
#include "parallel/trainer_impl.h"

int mw_graph_param_count(const mw_graph *g) { return g ? g->nparams : 0; }

static const mw_tensor *param_node(const mw_graph *g, int i) {
    for (int n = 0; n < g->nnodes; n++)
        if (g->nodes[n]->op == MW__OP_PARAM && g->nodes[n]->leaf == i) return g->nodes[n];
    return NULL;
}

mw_status mw_graph_param_info(const mw_graph *g, int i, mw_param_info *out) {
    if (!g || !out) return mw__error(MW_ERR_INVALID, "mw_graph_param_info: NULL argument");
    const mw_tensor *t = i >= 0 && i < g->nparams ? param_node(g, i) : NULL;
    if (!t)
        return mw__error(MW_ERR_INVALID, "mw_graph_param_info: index %d is not in [0, %d)", i,
                         g->nparams);
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->dtype = t->type.dtype;
    out->rank = t->type.rank;
    for (int k = 0; k < t->type.rank; k++)
        out->axis[k] = (mw_axis){g->names[t->type.ax[k].name], t->type.ax[k].size};
    out->count = mw__type_numel(&t->type);
    out->decayed = -1;
    return MW_OK;
}

int mw_trainer_param_count(const mw_trainer *tr) {
    if (tr && tr->pipe) return mw__pipeline_graph(tr->pipe)->nparams;
    return tr ? tr->prog->g->nparams : 0;
}

mw_status mw_trainer_param_info(const mw_trainer *tr, int i, mw_param_info *out) {
    if (!tr) return mw__error(MW_ERR_INVALID, "mw_trainer_param_info: trainer is NULL");
    if (tr->pipe) { /* the whole graph's parameter, decayed as the stage holding it decided */
        mw_status st = mw_graph_param_info(mw__pipeline_graph(tr->pipe), i, out);
        mw_trainer *owner = st ? NULL : mw__pipeline_param_trainer(tr->pipe, out->name);
        for (int k = 0; owner && k < owner->prog->g->nparams; k++) {
            mw_param_info mine;
            if (mw_graph_param_info(owner->prog->g, k, &mine) == MW_OK &&
                !strcmp(mine.name, out->name))
                out->decayed = owner->decays[k];
        }
        return st;
    }
    mw_status st = mw_graph_param_info(tr->prog->g, i, out);
    if (st == MW_OK) out->decayed = tr->decays[i];
    return st;
}

/* Moves parameter `name`'s values between data (count floats) and what holds them. */
typedef mw_status (*param_io)(void *ctx, const char *name, float *data, int64_t count, int write);

static mw_status program_io(void *ctx, const char *name, float *data, int64_t count, int write) {
    return mw__program_param(ctx, name, data, count, write);
}

/* A pipeline: from the stage holding it; into every stage holding it (a tied parameter's two). */
static mw_status pipeline_io(void *ctx, const char *name, float *data, int64_t count, int write) {
    return write ? mw_pipeline_write_param(ctx, name, data, count)
                 : mw_pipeline_read_param(ctx, name, data, count);
}

/* The parameter called name, or NULL with MW_ERR_NOT_FOUND recorded. */
static const mw_tensor *named_param(const mw_graph *g, const char *name) {
    for (int n = 0; name && n < g->nnodes; n++) {
        const mw_tensor *t = g->nodes[n];
        if (t->op == MW__OP_PARAM && strcmp(t->name, name) == 0) return t;
    }
    mw__error(MW_ERR_NOT_FOUND, "the trainer has no parameter named '%s'", name ? name : "(null)");
    return NULL;
}

static mw_status save_weights(const mw_graph *g, param_io io, void *ctx, const char *path,
                              const mw_weight_name *names, int nnames);
static mw_status load_weights(const mw_graph *g, param_io io, void *ctx, const char *path,
                              const mw_weight_name *names, int nnames);

mw_status mw_trainer_save_weights(mw_trainer *tr, const char *path, const mw_weight_name *names,
                                  int nnames) {
    if (!tr) return mw__error(MW_ERR_INVALID, "mw_trainer_save_weights: NULL argument");
    if (tr->pipe)
        return save_weights(mw__pipeline_graph(tr->pipe), pipeline_io, tr->pipe, path, names,
                            nnames);
    return mw__program_save_weights(tr->prog, path, names, nnames);
}

mw_status mw_trainer_load_weights(mw_trainer *tr, const char *path, const mw_weight_name *names,
                                  int nnames) {
    if (!tr) return mw__error(MW_ERR_INVALID, "mw_trainer_load_weights: NULL argument");
    if (tr->pipe)
        return load_weights(mw__pipeline_graph(tr->pipe), pipeline_io, tr->pipe, path, names,
                            nnames);
    return mw__program_load_weights(tr->prog, path, names, nnames);
}

mw_status mw__program_save_weights(mw__program *prog, const char *path, const mw_weight_name *names,
                                   int nnames) {
    return save_weights(prog->g, program_io, prog, path, names, nnames);
}

mw_status mw__program_load_weights(mw__program *prog, const char *path, const mw_weight_name *names,
                                   int nnames) {
    return load_weights(prog->g, program_io, prog, path, names, nnames);
}

static mw_status save_weights(const mw_graph *g, param_io io, void *ctx, const char *path,
                              const mw_weight_name *names, int nnames) {
    if (!path || (names && nnames < 0))
        return mw__error(MW_ERR_INVALID, "mw_trainer_save_weights: NULL argument");
    int n = names ? nnames : g->nparams;
    mw_safetensors_entry *e = mw__calloc((size_t)n + 1, sizeof *e);
    float **data = mw__calloc((size_t)n + 1, sizeof *data);
    mw_status st = e && data ? MW_OK : mw__error(MW_ERR_NOMEM, "out of memory saving weights");
    for (int i = 0; i < n && st == MW_OK; i++) {
        const mw_tensor *t = names ? named_param(g, names[i].param) : param_node(g, i);
        if (!t) {
            st = MW_ERR_NOT_FOUND;
            break;
        }
        int64_t count = mw__type_numel(&t->type);
        data[i] = mw__malloc((size_t)(count ? count : 1) * sizeof(float));
        if (!data[i]) {
            st = mw__error(MW_ERR_NOMEM, "out of memory saving weights");
            break;
        }
        e[i].name = names ? names[i].stored : t->name;
        e[i].rank = t->type.rank;
        for (int k = 0; k < t->type.rank; k++) e[i].shape[k] = t->type.ax[k].size;
        e[i].data = data[i];
        st = io(ctx, t->name, data[i], count, 0);
    }
    if (st == MW_OK) st = mw_safetensors_write(path, e, n);
    for (int i = 0; data && i < n; i++) mw__free(data[i]);
    mw__free(data);
    mw__free(e);
    return st;
}

static mw_status load_weights(const mw_graph *g, param_io io, void *ctx, const char *path,
                              const mw_weight_name *names, int nnames) {
    if (!path || (names && nnames < 0))
        return mw__error(MW_ERR_INVALID, "mw_trainer_load_weights: NULL argument");
    mw_safetensors *f;
    mw_status st = mw_safetensors_open(path, &f);
    if (st) return st;
    int n = names ? nnames : g->nparams;
    float **data = mw__calloc((size_t)n + 1, sizeof *data);
    const mw_tensor **params = mw__calloc((size_t)n + 1, sizeof *params);
    if (!data || !params) st = mw__error(MW_ERR_NOMEM, "out of memory loading weights");
    /* Everything is read and checked before the first parameter changes. */
    for (int i = 0; i < n && st == MW_OK; i++) {
        const mw_tensor *t = names ? named_param(g, names[i].param) : param_node(g, i);
        if (!t) {
            st = MW_ERR_NOT_FOUND;
            break;
        }
        params[i] = t;
        const char *stored = names ? names[i].stored : t->name;
        mw_stored_tensor s;
        if ((st = mw_safetensors_find(f, stored, &s))) {
            if (st == MW_ERR_NOT_FOUND)
                mw__error(st, "%s has no tensor '%s' (for parameter '%s')", path,
                          stored ? stored : "(null)", t->name);
            break;
        }
        int same = s.rank == t->type.rank;
        for (int k = 0; same && k < s.rank; k++) same = s.shape[k] == t->type.ax[k].size;
        if (!same) {
            char want[256], got[160] = "", *p = got;
            mw__type_describe(g, &t->type, want, sizeof want);
            for (int k = 0; k < s.rank; k++)
                p += snprintf(p, (size_t)(got + sizeof got - p), "%s%lld", k ? ", " : "",
                              (long long)s.shape[k]);
            st = mw__error(MW_ERR_SHAPE, "%s: tensor '%s' has shape [%s] but parameter '%s' is %s",
                           path, stored, got, t->name, want);
            break;
        }
        data[i] = mw__malloc((size_t)(s.count ? s.count : 1) * sizeof(float));
        if (!data[i]) {
            st = mw__error(MW_ERR_NOMEM, "out of memory loading weights");
            break;
        }
        st = mw_safetensors_read(f, stored, data[i], s.count);
    }
    for (int i = 0; i < n && st == MW_OK; i++)
        st = io(ctx, params[i]->name, data[i], mw__type_numel(&params[i]->type), 1);
    for (int i = 0; data && i < n; i++) mw__free(data[i]);
    mw__free(data);
    mw__free(params);
    mw_safetensors_close(f);
    return st;
}
