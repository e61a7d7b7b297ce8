/* Trust between replicas and between processes: a trainer's fingerprint compared across
 * processes when it is made, rank 0's initial parameters broadcast to every process, stop
 * requests honoured at step boundaries, skipped non-finite steps counted, and replicas compared
 * by checksum.
 *
 * A fingerprint is a canonical text, one self-describing line per node of the graph and per
 * option ("parameter 'h0.fcw' has axes f32[Hidden=256, Embed=64], init normal 0.02"), and its
 * hash. Processes exchange the hashes; only when they differ do they exchange the texts, so that
 * every process can name the first line that differs and the two ranks. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "parallel/config.h"
#include "parallel/consistency.h"
#include "parallel/optimizer.h"
#include "parallel/trainer_impl.h"

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "a stop request must be a lock-free store");

/* --- stop requests ---------------------------------------------------------------------------- */

static _Atomic int stop_all;

void mw_request_stop(void) { atomic_store(&stop_all, 1); }

void mw_cancel_stop(void) { atomic_store(&stop_all, 0); }

int mw_stop_requested(void) { return atomic_load(&stop_all); }

void mw_trainer_request_stop(mw_trainer *tr) {
    if (tr) atomic_store(&tr->stop, 1);
}

mw_status mw__trainer_stop_point(mw_trainer *tr) {
    int mine = atomic_exchange(&tr->stop, 0) | atomic_load(&stop_all), any = mine;
    if (tr->prog->mesh->nprocs > 1) {
        mw_status st = mw__dist_max_int(mine, &any, tr->cfg.collective_timeout_ms,
                                        "the stop check before a step");
        if (st) {
            tr->prog->broken = 1; /* the request may still be pending: no more collectives */
            return st;
        }
    }
    if (!any) return MW_OK;
    return mw__error(MW_ERR_INTERRUPTED,
                     "a stop was requested%s; the trainer stopped after step %lld, unchanged",
                     mine ? "" : " in another process", (long long)tr->prog->steps);
}

/* --- canonical text -----------------------------------------------------------------------------
 */

typedef struct text {
    char *s;
    size_t len, cap;
    int oom;
} text;

static void add(text *t, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void add(text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (t->oom || n < 0) return;
    if (t->len + (size_t)n + 2 > t->cap) {
        size_t cap = 2 * (t->len + (size_t)n + 2) + 256;
        char *s = mw__realloc(t->s, cap);
        if (!s) {
            t->oom = 1;
            return;
        }
        t->s = s;
        t->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
    t->s[t->len++] = '\n';
    t->s[t->len] = '\0';
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}

#define FNV_BASIS 0xCBF29CE484222325ull

static const char *init_name(mw_init_kind k) {
    switch (k) {
    case MW_INIT_KIND_ZEROS: return "zeros";
    case MW_INIT_KIND_CONST: return "constant";
    case MW_INIT_KIND_NORMAL: return "normal";
    case MW_INIT_KIND_UNIFORM: return "uniform";
    }
    return "unknown";
}

static void describe_node(text *t, const mw_graph *g, const mw_tensor *n) {
    char ty[512];
    mw__type_describe(g, &n->type, ty, sizeof ty);
    if (n->op == MW__OP_INPUT) {
        add(t, "input '%s' is %s", n->name, ty);
    } else if (n->op == MW__OP_PARAM) {
        add(t, "parameter '%s' has axes %s, init %s %.9g", n->name, ty, init_name(n->init.kind),
            (double)n->init.value);
    } else {
        char ins[64] = "";
        for (int k = 0, o = 0; k < n->nin && o < (int)sizeof ins; k++)
            o += snprintf(ins + o, sizeof ins - (size_t)o, "%s%d", k ? ", " : " of nodes ",
                          n->in[k]->id);
        char params[160], region[32] = ""; /* regions decide what a policy recomputes */
        if (n->region) snprintf(region, sizeof region, "; in region %d", n->region);
        add(t, "node %d (%s%s) is %s; %s%s", n->id, mw__op_name(n->op), ins, ty,
            mw__op_params_describe(n, params, sizeof params), region);
    }
}

/* The line of text s that starts at line index `line` ("(end)" when s has fewer lines). */
static void line_at(const char *s, size_t len, int line, char *out, size_t size) {
    size_t i = 0;
    for (int l = 0; l < line && i < len; i++)
        if (s[i] == '\n') l++;
    if (i >= len) {
        snprintf(out, size, "(nothing: its description ends after %d lines)", line);
        return;
    }
    size_t e = i;
    while (e < len && s[e] != '\n') e++;
    snprintf(out, size, "%.*s", (int)(e - i), s + i);
}

/* Index of the first line where a and b differ. */
static int first_difference(const char *a, size_t alen, const char *b, size_t blen) {
    int line = 0;
    for (size_t i = 0; i < alen || i < blen; i++) {
        if (i >= alen || i >= blen || a[i] != b[i]) return line;
        if (a[i] == '\n') line++;
    }
    return line;
}

/* Compares `mine` with every process's text: MW_OK when all agree; else MW_ERR_INVALID naming
 * the lowest rank that differs from rank 0, the first line that differs and both ranks. */
static mw_status agree(const char *what, const char *mine, size_t len, int timeout_ms) {
    int nprocs = mw__dist_size();
    if (nprocs <= 1) return MW_OK;
    if (len > (size_t)1 << 30) return mw__error(MW_ERR_INVALID, "%s: description too long", what);
    uint64_t me[2] = {fnv1a(FNV_BASIS, mine, len), len};
    uint64_t *all = mw__malloc((size_t)nprocs * sizeof me);
    if (!all) return mw__error(MW_ERR_NOMEM, "%s: out of memory", what);
    mw_status st = mw__dist_allgather_u64(me, 2, all, timeout_ms, what);
    int same = 1;
    for (int p = 1; st == MW_OK && p < nprocs; p++)
        same &= all[2 * p] == all[0] && all[2 * p + 1] == all[1];
    if (st || same) {
        mw__free(all);
        return st;
    }
    /* They differ: every process gets every text and finds the same first difference. */
    int *counts = mw__malloc((size_t)nprocs * sizeof *counts);
    size_t total = 0;
    for (int p = 0; p < nprocs; p++) total += (size_t)all[2 * p + 1];
    char *texts = counts ? mw__malloc(total + 1) : NULL;
    if (!texts) {
        mw__free(counts);
        mw__free(all);
        return mw__error(MW_ERR_NOMEM, "%s: out of memory", what);
    }
    for (int p = 0; p < nprocs; p++) counts[p] = (int)all[2 * p + 1];
    st = mw__dist_allgatherv_bytes(mine, counts, texts, timeout_ms, what);
    if (st == MW_OK) {
        size_t off = (size_t)counts[0];
        int p = 1;
        for (; p < nprocs; off += (size_t)counts[p], p++)
            if (all[2 * p] != all[0] || counts[p] != counts[0]) break;
        int line = first_difference(texts + off, (size_t)counts[p], texts, (size_t)counts[0]);
        char theirs[200], ours[200];
        line_at(texts + off, (size_t)counts[p], line, theirs, sizeof theirs);
        line_at(texts, (size_t)counts[0], line, ours, sizeof ours);
        st = mw__error(MW_ERR_INVALID, "%s: the processes disagree: rank %d: %s; rank 0: %s", what,
                       p, theirs, ours);
    }
    mw__free(texts);
    mw__free(counts);
    mw__free(all);
    return st;
}

mw_status mw_distributed_agree(const char *what, const char *text_, int timeout_ms) {
    if (!what || !text_) return mw__error(MW_ERR_INVALID, "mw_distributed_agree: NULL argument");
    if (timeout_ms < 0)
        return mw__error(MW_ERR_INVALID, "mw_distributed_agree: timeout_ms is %d", timeout_ms);
    return agree(what, text_, strlen(text_), timeout_ms);
}

/* The fingerprint of a program of `graph` computing `result` (NULL: none) with the configuration
 * described in config (config.h) and `extra` lines, compared across the processes of mesh. */
static mw_status agree_program(const char *caller, const mw_mesh *mesh, const mw_graph *graph,
                               const mw_tensor *result, const char *config, const text *extra,
                               int timeout_ms) {
    (void)mesh;
    text t = {0};
    for (int i = 0; i < graph->nnodes; i++) describe_node(&t, graph, graph->nodes[i]);
    if (result) add(&t, "the loss is node %d", result->id);
    add(&t, "%s", config);
    if (extra && extra->s) add(&t, "%s", extra->s);
    char what[96];
    snprintf(what, sizeof what, "%s: the model or its configuration", caller);
    mw_status st = t.oom || (extra && extra->oom)
                       ? mw__error(MW_ERR_NOMEM, "%s: out of memory", caller)
                       : agree(what, t.s, t.len, timeout_ms);
    mw__free(t.s);
    return st;
}

/* A configuration's description (config.h) in memory the caller frees; NULL when it ran out. */
static char *config_text(const mw_trainer_config *tc, const mw_infer_config *ic) {
    size_t n =
        tc ? mw__describe_trainer_config(tc, NULL, 0) : mw__describe_infer_config(ic, NULL, 0);
    char *s = mw__malloc(n + 1);
    if (!s) return NULL;
    if (tc)
        mw__describe_trainer_config(tc, s, n + 1);
    else
        mw__describe_infer_config(ic, s, n + 1);
    return s;
}

mw_status mw__trainer_agree(const mw_trainer_config *cfg, const mw_mesh *mesh,
                            const mw_graph *graph, const mw_tensor *loss) {
    if (mesh->nprocs <= 1) return MW_OK;
    /* What the weight decay applies to: the decays function is each process's own. */
    text extra = {0};
    unsigned char *decays = mw__calloc((size_t)graph->nparams + 1, 1);
    mw_status st = decays ? mw__decay_flags(graph, &cfg->optimizer, decays)
                          : mw__error(MW_ERR_NOMEM, "mw_trainer_new: out of memory");
    for (int i = 0; st == MW_OK && i < graph->nnodes; i++)
        if (graph->nodes[i]->op == MW__OP_PARAM)
            add(&extra, "weight decay %s parameter '%s'",
                decays[graph->nodes[i]->leaf] ? "applies to" : "skips", graph->nodes[i]->name);
    char *config = st ? NULL : config_text(cfg, NULL);
    if (st == MW_OK && !config) st = mw__error(MW_ERR_NOMEM, "mw_trainer_new: out of memory");
    if (st == MW_OK)
        st = agree_program("mw_trainer_new", mesh, graph, loss, config, &extra,
                           cfg->collective_timeout_ms);
    mw__free(config);
    mw__free(extra.s);
    mw__free(decays);
    return st;
}

mw_status mw__infer_agree(const mw_infer_config *cfg, const mw_mesh *mesh, const mw_graph *graph) {
    if (mesh->nprocs <= 1) return MW_OK;
    char *config = config_text(NULL, cfg);
    if (!config) return mw__error(MW_ERR_NOMEM, "inference: out of memory");
    mw_status st =
        agree_program("inference", mesh, graph, NULL, config, NULL, cfg->collective_timeout_ms);
    mw__free(config);
    return st;
}

/* The most devices one process of the mesh holds. */
static int most_local(const mw_mesh *mesh) {
    int count[MW_MAX_DEVICES] = {0}, most = 0;
    for (int d = 0; d < mesh->ndevices; d++)
        if (++count[mesh->proc_of[d]] > most) most = count[mesh->proc_of[d]];
    return most > 0 ? most : 1;
}

/* The host scratch of the replica check: one replica's parameters, and per-parameter checksums
 * of every local device (most_local rows, the last ones unused where this process holds fewer)
 * and of every process's devices. */
static mw_status replica_scratch(mw_trainer *tr) {
    if (tr->replica_buf) return MW_OK;
    const mw_mesh *mesh = tr->prog->mesh;
    size_t np = (size_t)tr->prog->g->nparams + 1, rows = (size_t)most_local(mesh);
    int64_t most = 0;
    for (int d = tr->prog->first; d < tr->prog->first + tr->prog->nlocal; d++)
        if (tr->prog->w[d].plan.param_elems > most) most = tr->prog->w[d].plan.param_elems;
    tr->replica_buf = mw__malloc((size_t)(most + 1) * sizeof(float));
    tr->replica_sums = mw__calloc(np * rows * (1 + (size_t)mesh->nprocs), sizeof(uint64_t));
    if (tr->replica_buf && tr->replica_sums) return MW_OK;
    mw__trainer_consistency_free(tr);
    return mw__error(MW_ERR_NOMEM, "out of memory for the replica check");
}

mw_status mw__trainer_prepare(mw_trainer *tr) {
    mw_status st = tr->cfg.check_replicas_every > 0 ? replica_scratch(tr) : MW_OK;
    /* Sharded parameters were broadcast as they were drawn (mw__param_init_boxes). */
    if (st || tr->prog->mesh->nprocs <= 1 || !tr->prog->init_values) return st;
    size_t bytes = (size_t)tr->prog->w[tr->prog->first].plan.param_elems * sizeof(float);
    return mw__dist_bcast_bytes(tr->prog->init_values, bytes, tr->cfg.collective_timeout_ms,
                                "mw_trainer_new: broadcasting rank 0's initial parameters");
}

/* --- replicas -----------------------------------------------------------------------------------
 */

int64_t mw_trainer_skipped_steps(const mw_trainer *tr) { return tr ? tr->skipped : 0; }

/* The parameter nodes of the trainer's graph, by leaf index. */
static const mw_tensor *param_of(const mw_trainer *tr, int leaf) {
    for (int i = 0; i < tr->prog->g->nnodes; i++)
        if (tr->prog->g->nodes[i]->op == MW__OP_PARAM && tr->prog->g->nodes[i]->leaf == leaf)
            return tr->prog->g->nodes[i];
    return NULL;
}

mw_status mw_trainer_check_replicas(mw_trainer *tr) {
    if (!tr) return mw__error(MW_ERR_INVALID, "mw_trainer_check_replicas: trainer is NULL");
    if (tr->prog->broken)
        return mw__error(MW_ERR_STATE, "mw_trainer_check_replicas: an earlier step of this "
                                       "trainer failed across processes; end the job");
    int np = tr->prog->g->nparams;
    mw_status st = replica_scratch(tr);
    if (st) return st;
    /* Each device's parameters against those of the first device holding the same values (the
     * same shard of a split parameter). */
    const mw_mesh *mesh = tr->prog->mesh;
    size_t stride = (size_t)np + 1, rows = (size_t)most_local(mesh);
    uint64_t *sums = tr->replica_sums, *all = sums + rows * stride;
    for (int d = tr->prog->first; d < tr->prog->first + tr->prog->nlocal; d++) {
        worker *w = &tr->prog->w[d];
        const mw__plan *p = &w->plan;
        st = w->dev.vt->download(&w->dev, tr->replica_buf, w->params,
                                 (size_t)p->param_elems * sizeof(float));
        if (st) return st;
        uint64_t *mine = sums + (size_t)(d - tr->prog->first) * stride;
        for (int l = 0; l < np; l++)
            mine[l] = fnv1a(FNV_BASIS, tr->replica_buf + p->params[l].off,
                            (size_t)p->params[l].count * sizeof(float));
        for (int l = 0; d > tr->prog->first && l < np; l++) {
            const mw_tensor *pn = param_of(tr, l);
            int e = mw__param_holder(tr->prog, d, pn, &mw__held_params);
            if (e != d && sums[(size_t)(e - tr->prog->first) * stride + (size_t)l] != mine[l])
                return mw__error(MW_ERR_STATE,
                                 "replicas diverged by step %lld: parameter '%s'%s differs between "
                                 "devices %s and %s",
                                 (long long)tr->prog->steps, pn->name,
                                 mw__param_sharded(pn) ? " (the same shard)" : "", w->dev.name,
                                 tr->prog->w[e].dev.name);
        }
    }
    int nprocs = mesh->nprocs;
    if (nprocs <= 1) return MW_OK;
    /* Every process sends every local device's checksums; each device of the mesh is compared
     * with the first device of another process holding the same box (every box of a split
     * parameter, whichever of its devices holds it). */
    st = mw__dist_allgather_u64(sums, (int)(rows * stride), all, tr->cfg.collective_timeout_ms,
                                "the replica check");
    if (st) {
        tr->prog->broken = 1; /* the request may still be pending */
        return st;
    }
    int row[MW_MAX_DEVICES], seen[MW_MAX_DEVICES] = {0};
    for (int d = 0; d < mesh->ndevices; d++) row[d] = seen[mesh->proc_of[d]]++;
    for (int d = 0; d < mesh->ndevices; d++)
        for (int l = 0; l < np; l++) {
            const mw_tensor *pn = param_of(tr, l);
            int pd = mesh->proc_of[d], e = 0;
            while (e < d && (mesh->proc_of[e] == pd || !mw__same_box(tr->prog, e, d, pn))) e++;
            if (e == d) continue; /* the first of its box, or its box's first is in this process */
            int pe = mesh->proc_of[e];
            uint64_t a = all[((size_t)pd * rows + (size_t)row[d]) * stride + (size_t)l],
                     b = all[((size_t)pe * rows + (size_t)row[e]) * stride + (size_t)l];
            if (a == b) continue;
            return mw__error(MW_ERR_STATE,
                             "replicas diverged by step %lld: parameter '%s'%s differs between "
                             "rank %d and rank %d (devices %s and %s; checksums %016llx and "
                             "%016llx)",
                             (long long)tr->prog->steps, pn->name,
                             mw__param_sharded(pn) ? " (the same shard)" : "", pd, pe,
                             mesh->device_name[d], mesh->device_name[e], (unsigned long long)a,
                             (unsigned long long)b);
        }
    return MW_OK;
}

mw_status mw__trainer_after_step(mw_trainer *tr) {
    if (tr->rep[tr->prog->first].skipped) {
        tr->skipped++;
        return MW_OK;
    }
    tr->prog->steps++;
    int every = tr->cfg.check_replicas_every;
    return every > 0 && tr->prog->steps % every == 0 ? mw_trainer_check_replicas(tr) : MW_OK;
}

void mw__trainer_consistency_free(mw_trainer *tr) {
    mw__free(tr->replica_buf);
    mw__free(tr->replica_sums);
    tr->replica_buf = NULL;
    tr->replica_sums = NULL;
}
