/* Inference programs: a program (parallel/program.h) of the graph's forward part, with no
 * backward part and no optimizer, run chunk by chunk over any number of rows, with its own
 * parameters or a trainer's, read in place (its plan's parameter references are rebased onto the
 * trainer's flat parameter layout). */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "meshwit/infer.h"
#include "parallel/agree.h"
#include "parallel/infer_impl.h"
#include "parallel/pipeline_impl.h"
#include "parallel/program.h"
#include "parallel/trainer_impl.h"

typedef struct slot {
    const mw_tensor *t; /* the user's input or output */
    int has_chunk;      /* its first axis is the chunk axis */
    int64_t per_row;    /* elements per row of the chunk axis (all of them without it) */
    int used;           /* inputs: read by the program */
} slot;

struct mw_infer {
    mw__program *prog;
    const char *caller; /* the call that made it, prefixing its making's errors */
    mw_graph *graph;    /* the user's */
    int64_t chunk;      /* rows each run of the compiled program takes */
    slot *in, *out;
    int nin, nout;
    mw_feed *feeds;        /* one per graph input, in leaf order */
    const mw_feed **given; /* per graph input: the caller's feed of this run, or NULL */
    char *pad;             /* the last chunk's rows, padded */
    float *outbuf;         /* the last chunk's output */
};

/* Position of the axis named `name` in t, or -1. */
static int axis_pos(const mw_graph *g, const mw__type *t, const char *name) {
    for (int i = 0; i < t->rank; i++)
        if (!strcmp(g->names[t->ax[i].name], name)) return i;
    return -1;
}

/* Which nodes depend on the chunked rows and which mix them (a value of one row computed from
 * others: a sum, contraction, softmax, layer norm, slice or reshape along the chunk axis, or a
 * value without the axis that depends on it): an output that mixes rows would change with the
 * chunking (a mean over the batch would average the padding rows in). Refused by name. */
static mw_status check_rows(mw_infer *inf, int chunk_name, const char *axis,
                            mw_tensor *const *outputs) {
    mw_graph *g = inf->graph;
    char *dep = mw__calloc((size_t)g->nnodes + 1, 1), *mix = mw__calloc((size_t)g->nnodes + 1, 1);
    const char **why = mw__calloc((size_t)g->nnodes + 1, sizeof *why);
    if (!dep || !mix || !why) {
        mw__free(dep), mw__free(mix), mw__free(why);
        return mw__error(MW_ERR_NOMEM, "%s: out of memory", inf->caller);
    }
    for (int i = 0; i < g->nnodes; i++) {
        const mw_tensor *t = g->nodes[i];
        if (t->op == MW__OP_INPUT || t->op == MW__OP_STATE)
            dep[i] = chunk_name >= 0 && mw__type_find_name(&t->type, chunk_name) >= 0;
    }
    mw__graph_mixing(g, chunk_name, dep, mix, why);
    mw_status st = MW_OK;
    for (int o = 0; o < inf->nout && st == MW_OK; o++) {
        const mw_tensor *t = outputs[o];
        if (!mix[t->id]) continue;
        char d[256];
        st = mw__error(MW_ERR_SHAPE,
                       "%s: output %d, %s, mixes rows of the chunk axis '%s' (%s), so a "
                       "run chunk by chunk would change it; compute it with mw_trainer_eval, or "
                       "choose another chunk_axis",
                       inf->caller, o, mw__type_describe(g, &t->type, d, sizeof d), axis,
                       why[t->id]);
    }
    mw__free(dep), mw__free(mix), mw__free(why);
    return st;
}

static mw_status describe(mw_infer *inf, const char *axis, mw_tensor *const *outputs) {
    mw_graph *g = inf->graph;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i]->op == MW__OP_INPUT) inf->nin++;
    inf->in = mw__calloc((size_t)inf->nin + 1, sizeof *inf->in);
    inf->out = mw__calloc((size_t)inf->nout + 1, sizeof *inf->out);
    inf->feeds = mw__calloc((size_t)inf->nin + 1, sizeof *inf->feeds);
    inf->given = mw__calloc((size_t)inf->nin + 1, sizeof *inf->given);
    if (!inf->in || !inf->out || !inf->feeds || !inf->given)
        return mw__error(MW_ERR_NOMEM, "%s: out of memory", inf->caller);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < (pass ? inf->nout : g->nnodes); i++) {
            const mw_tensor *t = pass ? outputs[i] : g->nodes[i];
            if (!pass && t->op != MW__OP_INPUT) continue;
            slot *s = pass ? &inf->out[i] : &inf->in[t->leaf];
            s->t = t;
            int at = axis_pos(g, &t->type, axis);
            char d[256];
            if (at > 0)
                return mw__error(MW_ERR_AXIS,
                                 "%s: %s %s has the chunk axis '%s' but not first; put it "
                                 "first (or choose another chunk_axis)",
                                 inf->caller, pass ? "output" : "input",
                                 mw__type_describe(g, &t->type, d, sizeof d), axis);
            s->has_chunk = at == 0;
            int64_t n = mw__type_numel(&t->type);
            s->per_row = s->has_chunk ? n / t->type.ax[0].size : n;
            if (!s->has_chunk) continue;
            if (inf->chunk && inf->chunk != t->type.ax[0].size)
                return mw__error(MW_ERR_SHAPE,
                                 "%s: the chunk axis '%s' has %lld rows in %s but %lld "
                                 "elsewhere",
                                 inf->caller, axis, (long long)t->type.ax[0].size,
                                 mw__type_describe(g, &t->type, d, sizeof d),
                                 (long long)inf->chunk);
            inf->chunk = t->type.ax[0].size;
        }
    return check_rows(inf, mw__graph_find_name(g, axis), axis, outputs);
}

/* Buffers for the last, padded chunk, and which inputs the program reads. */
static mw_status prepare(mw_infer *inf) {
    const mw__plan *p = &inf->prog->w[inf->prog->first].plan;
    for (int v = 0; v < p->nviews; v++) inf->in[p->views[v].input].used = 1;
    size_t pad = 64, out = 1;
    for (int i = 0; i < inf->nin; i++)
        if (inf->in[i].has_chunk) pad += (size_t)(inf->chunk * inf->in[i].per_row) * 4;
    for (int o = 0; o < inf->nout; o++) {
        size_t n = (size_t)(inf->out[o].has_chunk ? inf->chunk : 1) * (size_t)inf->out[o].per_row;
        if (n > out) out = n;
    }
    inf->pad = mw__calloc(pad, 1);
    inf->outbuf = mw__malloc(out * sizeof *inf->outbuf);
    if (!inf->pad || !inf->outbuf) return mw__error(MW_ERR_NOMEM, "%s: out of memory", inf->caller);
    return MW_OK;
}

/* Across processes: every process's graph and configuration agree (parallel/agree.h). */
static mw_status agree(const char *caller, const mw_infer_config *cfg, const mw_mesh *mesh,
                       const mw_graph *graph) {
    if (mesh->nprocs <= 1) return MW_OK;
    char *config = mw__infer_config_text(cfg);
    if (!config) return mw__error(MW_ERR_NOMEM, "%s: out of memory", caller);
    mw_status st = mw__program_agree(caller, graph, NULL, config, NULL, cfg->collective_timeout_ms);
    mw__free(config);
    return st;
}

static mw_status make(mw_graph *graph, mw_mesh *mesh, const mw_infer_config *config,
                      mw_trainer *from, mw_infer **out) {
    const char *caller = from ? "mw_infer_from_trainer" : "mw_infer_new";
    if (!out) return mw__error(MW_ERR_INVALID, "%s: out is NULL", caller);
    *out = NULL;
    if (!graph || !mesh || !config || config->noutputs < 1 || !config->outputs)
        return mw__error(MW_ERR_INVALID, "%s: a graph, a mesh and at least one output are needed",
                         caller);
    if (graph->status) return mw__error_copy(graph->status, graph->error);
    for (int o = 0; o < config->noutputs; o++)
        if (!config->outputs[o] || config->outputs[o]->g != graph)
            return mw__error(MW_ERR_INVALID, "%s: output %d is NULL or from another graph", caller,
                             o);
    mw_status st = mw__check_infer_config(config, caller);
    if (st) return st;
    mw_infer *inf = mw__calloc(1, sizeof *inf);
    if (!inf) return mw__error(MW_ERR_NOMEM, "%s: out of memory", caller);
    inf->caller = caller;
    inf->graph = graph;
    inf->nout = config->noutputs;
    st = describe(inf, config->chunk_axis ? config->chunk_axis : "Batch", config->outputs);
    mw_mesh *on = from ? from->prog->mesh : mesh;
    mw__program_config pc = mw__program_config_of_infer(config);
    if (from) pc.blas_threads = MW_BLAS_THREADS_KEEP; /* the trainer's setting holds */
    if (st == MW_OK) st = agree(caller, config, on, graph);
    if (st == MW_OK)
        st = mw__program_new(graph, on, &pc, from ? from->prog : NULL, caller, &inf->prog);
    mw__program *prog = inf->prog;
    if (st == MW_OK) st = mw__program_outputs(prog, config->outputs, config->noutputs);
    if (st == MW_OK) st = mw__program_plan(prog, prog->outputs[0], NULL);
    if (st == MW_OK) st = mw__program_start(prog, NULL);
    if (st == MW_OK) st = prepare(inf);
    if (st) {
        char msg[MW__MSG_SIZE];
        snprintf(msg, sizeof msg, "%s", mw_last_error());
        mw_infer_free(inf);
        return mw__error_copy(st, msg);
    }
    *out = inf;
    return MW_OK;
}

mw_status mw_infer_new(mw_graph *graph, mw_mesh *mesh, const mw_infer_config *config,
                       mw_infer **out) {
    return make(graph, mesh, config, NULL, out);
}

mw_status mw_infer_from_trainer(mw_trainer *trainer, mw_graph *graph, const mw_infer_config *config,
                                mw_infer **out) {
    if (!trainer) return mw__error(MW_ERR_INVALID, "mw_infer_from_trainer: trainer is NULL");
    MW__NOT_PIPELINED(trainer, "mw_infer_from_trainer");
    return make(graph, trainer->prog->mesh, config, trainer, out);
}

void mw_infer_free(mw_infer *inf) {
    if (!inf) return;
    mw__program_free(inf->prog);
    mw__free(inf->in);
    mw__free(inf->out);
    mw__free(inf->feeds);
    mw__free(inf->given);
    mw__free(inf->pad);
    mw__free(inf->outbuf);
    mw__free(inf);
}

int64_t mw_infer_chunk_rows(const mw_infer *inf) { return inf ? inf->chunk : 0; }

mw__program *mw__infer_program(mw_infer *inf) { return inf ? inf->prog : NULL; }

/* Checks the caller's feeds and fetches for `rows` rows. */
static mw_status check_call(mw_infer *inf, const mw_feed *feeds, int nfeeds, int64_t rows,
                            const mw_fetch *fetches, int nfetches, const mw_feed **feed_of) {
    if (rows < 1 || nfeeds < 0 || nfetches < 0 || (nfeeds && !feeds) || (nfetches && !fetches))
        return mw__error(MW_ERR_INVALID, "mw_infer_run: bad arguments (rows %lld)",
                         (long long)rows);
    if (inf->graph->nstates && inf->chunk && rows != inf->chunk)
        return mw__error(MW_ERR_INVALID,
                         "mw_infer_run: this program has states (mw_state), whose rows are the "
                         "rows of every run: run exactly %lld rows, not %lld",
                         (long long)inf->chunk, (long long)rows);
    if (!inf->chunk && rows != 1)
        return mw__error(MW_ERR_INVALID,
                         "mw_infer_run: no input has the chunk axis, so a run is "
                         "of 1 row, not %lld",
                         (long long)rows);
    for (int f = 0; f < nfeeds; f++) {
        int i = 0;
        while (i < inf->nin && (!feeds[f].name || strcmp(inf->in[i].t->name, feeds[f].name))) i++;
        if (i == inf->nin)
            return mw__error(MW_ERR_INVALID, "feed '%s': the graph has no input of that name",
                             feeds[f].name ? feeds[f].name : "(null)");
        if (feed_of[i]) return mw__error(MW_ERR_INVALID, "feed '%s' is given twice", feeds[f].name);
        int64_t want = inf->in[i].has_chunk ? rows * inf->in[i].per_row : inf->in[i].per_row;
        if (feeds[f].count != want || !feeds[f].data)
            return mw__error(MW_ERR_INVALID,
                             "feed '%s' has %lld elements (data %s) but %lld rows of it hold %lld",
                             feeds[f].name, (long long)feeds[f].count,
                             feeds[f].data ? "given" : "NULL", (long long)rows, (long long)want);
        feed_of[i] = &feeds[f];
    }
    for (int i = 0; i < inf->nin; i++)
        if (inf->in[i].used && !feed_of[i])
            return mw__error(MW_ERR_INVALID, "input '%s' is not fed (the outputs need it)",
                             inf->in[i].t->name);
    for (int f = 0; f < nfetches; f++) {
        int o = 0;
        while (o < inf->nout && inf->out[o].t != fetches[f].output) o++;
        if (o == inf->nout)
            return mw__error(MW_ERR_NOT_FOUND,
                             "mw_infer_run: fetch %d is not an output of the program", f);
        const slot *s = &inf->out[o];
        if (!s->has_chunk && rows != inf->chunk && inf->chunk)
            return mw__error(MW_ERR_INVALID,
                             "mw_infer_run: output %d lacks the chunk axis, so it can only be "
                             "fetched from a run of exactly %lld rows",
                             o, (long long)inf->chunk);
        int64_t want = s->has_chunk ? rows * s->per_row : s->per_row;
        if (fetches[f].count != want || !fetches[f].data)
            return mw__error(MW_ERR_INVALID,
                             "mw_infer_run: fetch %d has room for %lld elements but %lld rows of "
                             "output %d hold %lld",
                             f, (long long)fetches[f].count, (long long)rows, o, (long long)want);
    }
    return MW_OK;
}

mw_status mw_infer_run(mw_infer *inf, const mw_feed *feeds, int nfeeds, int64_t rows,
                       const mw_fetch *fetches, int nfetches) {
    if (!inf) return mw__error(MW_ERR_INVALID, "mw_infer_run: program is NULL");
    const mw_feed **of = inf->given;
    memset(of, 0, sizeof *of * (size_t)inf->nin);
    mw_status st = check_call(inf, feeds, nfeeds, rows, fetches, nfetches, of);
    int64_t chunk = inf->chunk ? inf->chunk : 1;
    for (int64_t done = 0; st == MW_OK && done < rows; done += chunk) {
        int64_t n = rows - done < chunk ? rows - done : chunk;
        char *pad = inf->pad;
        for (int i = 0; i < inf->nin; i++) {
            const slot *s = &inf->in[i];
            size_t es = 4; /* f32 and i32 */
            mw_feed *f = &inf->feeds[i];
            f->name = s->t->name;
            f->count = s->has_chunk ? chunk * s->per_row : s->per_row;
            if (!of[i]) {
                f->data = inf->pad; /* not read by the program */
                continue;
            }
            if (!s->has_chunk) {
                f->data = of[i]->data;
                continue;
            }
            const char *src = (const char *)of[i]->data + (size_t)(done * s->per_row) * es;
            if (n == chunk) {
                f->data = src;
                continue;
            }
            size_t have = (size_t)(n * s->per_row) * es, all = (size_t)(chunk * s->per_row) * es;
            memcpy(pad, src, have);
            memset(pad + have, 0, all - have); /* padding rows: zeros, valid ids */
            f->data = pad;
            pad += all;
        }
        st = mw__program_run(inf->prog, CMD_FORWARD, inf->feeds, inf->nin);
        for (int k = 0; st == MW_OK && k < nfetches; k++) {
            const mw_fetch *fe = &fetches[k];
            int o = 0;
            while (inf->out[o].t != fe->output) o++;
            const slot *s = &inf->out[o];
            int64_t all = s->has_chunk ? chunk * s->per_row : s->per_row;
            if (!s->has_chunk || n == chunk) {
                float *dst = fe->data + (s->has_chunk ? done * s->per_row : 0);
                st = mw__program_read_output(inf->prog, "mw_infer_run", s->t, dst, all);
            } else {
                st = mw__program_read_output(inf->prog, "mw_infer_run", s->t, inf->outbuf, all);
                if (st == MW_OK)
                    memcpy(fe->data + done * s->per_row, inf->outbuf,
                           (size_t)(n * s->per_row) * sizeof(float));
            }
        }
    }
    return st;
}

mw_status mw_infer_load_weights(mw_infer *inf, const char *path, const mw_weight_name *names,
                                int nnames) {
    if (!inf) return mw__error(MW_ERR_INVALID, "mw_infer_load_weights: program is NULL");
    return mw__program_load_weights(inf->prog, path, names, nnames);
}

mw_status mw_infer_write_param(mw_infer *inf, const char *name, const float *src, int64_t count) {
    if (!inf) return mw__error(MW_ERR_INVALID, "mw_infer_write_param: program is NULL");
    return mw__program_param(inf->prog, name, (float *)(uintptr_t)src, count, 1); /* reads src */
}

mw_status mw_infer_read_param(mw_infer *inf, const char *name, float *dst, int64_t count) {
    if (!inf) return mw__error(MW_ERR_INVALID, "mw_infer_read_param: program is NULL");
    return mw__program_param(inf->prog, name, dst, count, 0);
}
