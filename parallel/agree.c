/* What the processes of a mesh compare before they build a program: a fingerprint of the graph
 * and the configuration, compared across processes when it is made.
 *
 * A fingerprint is a canonical text, one self-describing line per node of the graph and per
 * option ("parameter 'h0.fcw' has axes f32[Hidden=256, Embed=64], init normal 0.02"), and its
 * hash. Processes exchange the hashes; only when they differ do they exchange the texts, so that
 * every process can name the first line that differs and the two ranks. The trainer adds its
 * own lines (parallel/consistency.c), as does whatever else builds a program. */
#include "parallel/agree.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "collectives/dist.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/graph_impl.h"
#include "core/hash.h"

void mw__text_add(mw__text *t, const char *fmt, ...) {
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

static const char *init_name(mw_init_kind k) {
    switch (k) {
    case MW_INIT_KIND_ZEROS: return "zeros";
    case MW_INIT_KIND_CONST: return "constant";
    case MW_INIT_KIND_NORMAL: return "normal";
    case MW_INIT_KIND_UNIFORM: return "uniform";
    }
    return "unknown";
}

static void describe_node(mw__text *t, const mw_graph *g, const mw_tensor *n) {
    char ty[512];
    mw__type_describe(g, &n->type, ty, sizeof ty);
    if (n->op == MW__OP_INPUT) {
        mw__text_add(t, "input '%s' is %s", n->name, ty);
    } else if (n->op == MW__OP_PARAM) {
        mw__text_add(t, "parameter '%s' has axes %s, init %s %.9g", n->name, ty,
                     init_name(n->init.kind), (double)n->init.value);
    } else {
        char ins[64] = "";
        for (int k = 0, o = 0; k < n->nin && o < (int)sizeof ins; k++)
            o += snprintf(ins + o, sizeof ins - (size_t)o, "%s%d", k ? ", " : " of nodes ",
                          n->in[k]->id);
        char params[160], region[32] = ""; /* regions decide what a policy recomputes */
        if (n->region) snprintf(region, sizeof region, "; in region %d", n->region);
        mw__text_add(t, "node %d (%s%s) is %s; %s%s", n->id, mw__op_name(n->op), ins, ty,
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
    uint64_t me[2] = {mw__fnv1a(MW__FNV_BASIS, mine, len), len};
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

mw_status mw__program_agree(const char *caller, const mw_graph *graph, const mw_tensor *result,
                            const char *config, const mw__text *extra, int timeout_ms) {
    mw__text t = {0};
    for (int i = 0; i < graph->nnodes; i++) describe_node(&t, graph, graph->nodes[i]);
    if (result) mw__text_add(&t, "the loss is node %d", result->id);
    mw__text_add(&t, "%s", config);
    if (extra && extra->s) mw__text_add(&t, "%s", extra->s);
    char what[96];
    snprintf(what, sizeof what, "%s: the model or its configuration", caller);
    mw_status st = t.oom || (extra && extra->oom)
                       ? mw__error(MW_ERR_NOMEM, "%s: out of memory", caller)
                       : agree(what, t.s, t.len, timeout_ms);
    mw__free(t.s);
    return st;
}
