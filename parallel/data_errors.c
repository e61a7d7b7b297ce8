/* Data errors found by a kernel (an embedding id or a cross-entropy target out of range) told in
 * the caller's terms: the kernel only knows a position in its device's shard, so the trainer looks
 * the value up again in the input the ids came from and names the global element of that input. */
#include <stdio.h>

#include "core/alloc.h"
#include "parallel/data_errors.h"

mw_status mw__explain_index_error(worker *w, const mw__ins *in, mw_status st) {
    if (st != MW_ERR_INVALID || (in->kind != MW__I_EMBED && in->kind != MW__I_XENT)) return st;
    mw__ref ids = in->kind == MW__I_EMBED ? in->ref.embed.ids : in->ref.xent.targets;
    if (ids.base < MW__BASE_VIEW0)
        return st; /* ids computed in the graph: keep the kernel's word */
    const mw__view *v = &w->plan.views[ids.base - MW__BASE_VIEW0];
    int64_t n = in->kind == MW__I_EMBED ? in->k.embed.n_ids : in->k.xent.rows;
    int64_t limit = in->kind == MW__I_EMBED ? in->k.embed.vocab : in->k.xent.valid;
    if (n > v->count) return st;
    int32_t *host = mw__malloc((size_t)(n ? n : 1) * sizeof *host);
    if (!host) return st;
    const char *src = w->bases[ids.base] + ids.off;
    if (w->dev.vt->download(&w->dev, host, src, (size_t)n * sizeof *host) != MW_OK) {
        mw__free(host);
        return st;
    }
    int64_t bad = 0;
    while (bad < n && host[bad] >= 0 && host[bad] < limit) bad++;
    int32_t value = bad < n ? host[bad] : 0;
    mw__free(host);
    if (bad == n) return st;
    /* The local position, as coordinates in the device's box, then in the whole input. */
    int64_t idx[MW_MAX_RANK], rest = bad, global = 0, stride = 1;
    const mw__box *b = &v->box;
    for (int i = b->rank - 1; i >= 0; i--) {
        idx[i] = b->lo[i] + rest % b->len[i];
        rest /= b->len[i];
        global += idx[i] * stride;
        stride *= b->global[i];
    }
    char where[160] = "", *p = where;
    for (int i = 0; i < b->rank && p < where + sizeof where - 24; i++)
        p += snprintf(p, (size_t)(where + sizeof where - p), "%s%lld", i ? ", " : "",
                      (long long)idx[i]);
    const char *name = "?";
    for (int i = 0; i < w->prog->g->nnodes; i++) {
        const mw_tensor *t = w->prog->g->nodes[i];
        if (t->op == MW__OP_INPUT && t->leaf == v->input) name = t->name;
    }
    return mw__error(MW_ERR_INVALID,
                     "%s %d at [%s] (element %lld) of input '%s' is outside [0, %lld)",
                     in->kind == MW__I_EMBED ? "embedding id" : "cross-entropy target", value,
                     where, (long long)global, name, (long long)limit);
}
