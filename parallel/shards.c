/* Parameters sharded over mesh axes: boxes, transfers between boxes and whole host arrays, and
 * the gradient norm that counts every element once. */
#include "parallel/shards.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/init.h"
#include "parallel/optimizer.h"

int mw__param_sharded(const mw_tensor *p) {
    for (int i = 0; i < p->type.rank; i++)
        if (p->type.ax[i].mesh >= 0) return 1;
    return 0;
}

void mw__type_box(const mw_trainer *tr, int d, const mw__type *t, mw__box *out) {
    mw__placement pl;
    mw__trainer_placement(tr, d, &pl);
    mw__box_of(t, &pl, out);
}

void mw__box_copy(const mw__box *b, int64_t from, int64_t to, float *local, float *global,
                  int to_global) {
    for (int64_t e = from, at, run; e < to; e += run) {
        run = mw__box_run(b, e, to, &at);
        if (to_global)
            memcpy(global + at, local + (e - from), (size_t)run * sizeof(float));
        else
            memcpy(local + (e - from), global + at, (size_t)run * sizeof(float));
    }
}

/* The part of slot s's values (`held`) that device w holds: the flat range [*lo, *hi) (empty when
 * it holds none). */
static void held_part(const worker *w, const mw__param_slot *s, mw__held held, int64_t *lo,
                      int64_t *hi) {
    *lo = s->off;
    *hi = s->off + s->count;
    if (held == MW__HELD_PARAMS || (held == MW__HELD_GRADS && !w->tr->zero1)) return;
    if (!mw__own_part(w, s, lo, hi)) *hi = *lo;
}

/* Where device w holds `held` values of slot s: the flat range [*lo, *hi) and its address. */
static char *held_range(worker *w, const mw__param_slot *s, mw__held held, int64_t *lo,
                        int64_t *hi) {
    held_part(w, s, held, lo, hi);
    if (held == MW__HELD_PARAMS) return (char *)w->params + *lo * 4;
    if (held == MW__HELD_GRADS) return (char *)w->grads + *lo * 4;
    int64_t own = w->own_hi - w->own_lo;
    return (char *)w->moments + ((int64_t)(held - MW__HELD_MOMENT0) * own + *lo - w->own_lo) * 4;
}

int mw__param_holder(const mw_trainer *tr, int d, const mw_tensor *p, mw__held held) {
    const mw__param_slot *s = &tr->w[d].plan.params[p->leaf];
    int64_t lo, hi;
    held_part(&tr->w[d], s, held, &lo, &hi);
    mw__box mine, other;
    mw__type_box(tr, d, &p->type, &mine);
    for (int e = tr->first; e < d; e++) {
        const mw__param_slot *t = &tr->w[e].plan.params[p->leaf];
        int64_t elo, ehi;
        held_part(&tr->w[e], t, held, &elo, &ehi);
        mw__type_box(tr, e, &p->type, &other);
        if (elo - t->off == lo - s->off && ehi - t->off == hi - s->off &&
            memcmp(mine.lo, other.lo, sizeof mine.lo) == 0)
            return e;
    }
    return d;
}

int mw__param_reader(const mw_trainer *tr, int d, const mw_tensor *p, mw__held held) {
    const mw__param_slot *s = &tr->w[d].plan.params[p->leaf];
    int64_t lo, hi;
    held_part(&tr->w[d], s, held, &lo, &hi);
    return lo < hi && mw__param_holder(tr, d, p, held) == d;
}

mw_status mw__param_transfer(mw_trainer *tr, const mw_tensor *p, mw__held held, float *global,
                             int write) {
    float *tmp = NULL; /* a box that is not one run of the whole array passes through it */
    mw_status st = MW_OK;
    for (int d = tr->first; d < tr->first + tr->nlocal && st == MW_OK; d++) {
        worker *w = &tr->w[d];
        if (!write && !mw__param_reader(tr, d, p, held)) continue;
        const mw__param_slot *s = &w->plan.params[p->leaf];
        int64_t lo, hi;
        char *at = held_range(w, s, held, &lo, &hi);
        if (lo == hi) continue;
        if (write && held == MW__HELD_PARAMS) w->version++; /* its bf16 copy is out of date */
        mw__box box;
        mw__type_box(tr, d, &p->type, &box);
        size_t bytes = (size_t)(hi - lo) * 4;
        int64_t whole_at;
        if (mw__box_run(&box, lo - s->off, hi - s->off, &whole_at) == hi - lo) {
            st = write ? w->dev.vt->upload(&w->dev, at, global + whole_at, bytes)
                       : w->dev.vt->download(&w->dev, global + whole_at, at, bytes);
            continue;
        }
        if (!tmp) {
            int64_t most = 1;
            for (int e = tr->first; e < tr->first + tr->nlocal; e++)
                if (tr->w[e].plan.params[p->leaf].count > most)
                    most = tr->w[e].plan.params[p->leaf].count;
            if (!(tmp = mw__malloc((size_t)most * sizeof *tmp)))
                return mw__error(MW_ERR_NOMEM, "out of memory moving parameter '%s'", p->name);
        }
        if (write) {
            mw__box_copy(&box, lo - s->off, hi - s->off, tmp, global, 0);
            st = w->dev.vt->upload(&w->dev, at, tmp, bytes);
        } else if ((st = w->dev.vt->download(&w->dev, tmp, at, bytes)) == MW_OK) {
            mw__box_copy(&box, lo - s->off, hi - s->off, tmp, global, 1);
        }
    }
    mw__free(tmp);
    return st;
}

mw_status mw__param_init_boxes(const mw_trainer *tr, float *const *dst) {
    for (int i = 0; i < tr->g->nnodes; i++) {
        const mw_tensor *t = tr->g->nodes[i];
        if (t->op != MW__OP_PARAM) continue;
        int64_t n = mw__type_numel(&t->type);
        float *whole = mw__malloc((size_t)(n ? n : 1) * sizeof *whole);
        if (!whole) return mw__error(MW_ERR_NOMEM, "out of memory initialising '%s'", t->name);
        mw__param_init(tr->g, t, whole);
        for (int d = tr->first; d < tr->first + tr->nlocal; d++) {
            const mw__param_slot *s = &tr->w[d].plan.params[t->leaf];
            mw__box box;
            mw__type_box(tr, d, &t->type, &box);
            mw__box_copy(&box, 0, s->count, dst[d - tr->first] + s->off, whole, 0);
        }
        mw__free(whole);
    }
    return MW_OK;
}

/* The device holding piece k of parameter p's gradient for the shard that device d holds: d
 * itself, or with ZeRO-1 the device of d's data group whose part is k. */
static int piece_owner(const mw_trainer *tr, int d, int k) {
    if (!tr->zero1) return d;
    int gi = tr->zero_group;
    for (int e = 0; e < tr->nworkers; e++)
        if (tr->w[e].comm[gi] == tr->w[d].comm[gi] && tr->w[e].rank[gi] == k) return e;
    return d;
}

mw_status mw__grad_norm_sharded(worker *w, float *norm) {
    mw_trainer *tr = w->tr;
    const mw__device_vtable *vt = w->dev.vt;
    int np = tr->g->nparams, n = tr->nworkers, parts = w->zparts;
    int first = tr->zero1 ? w->rank[tr->zero_group] : 0, last = tr->zero1 ? first + 1 : parts;
    size_t per = (size_t)np * (size_t)parts; /* pieces of one device */
    float *mine = w->partials + (size_t)w->index * per;
    mw_status st;
    /* Piece (l, k): parameter l's elements in slice k of the flat layout. */
    for (int l = 0; l < np; l++) {
        const mw__param_slot *s = &w->plan.params[l];
        for (int k = first; k < last; k++) {
            int64_t lo = (int64_t)w->zslices[k], hi = (int64_t)w->zslices[k + 1];
            if (lo < s->off) lo = s->off;
            if (hi > s->off + s->count) hi = s->off + s->count;
            mw__k_sumsq q = {.count = hi > lo ? hi - lo : 0,
                             .out = w->scratch + (size_t)l * (size_t)parts + (size_t)k,
                             .a = (const float *)w->grads + lo};
            if (q.count && (st = vt->sumsq(&w->dev, &q))) return st;
        }
    }
    if (per && (st = vt->download(&w->dev, mine, w->scratch, per * sizeof(float)))) return st;
    for (int l = 0; l < np; l++) {
        const mw__param_slot *s = &w->plan.params[l];
        for (int k = first; k < last; k++)
            if ((int64_t)w->zslices[k + 1] <= s->off || (int64_t)w->zslices[k] >= s->off + s->count)
                mine[(size_t)l * (size_t)parts + (size_t)k] = 0.0f;
    }
    if (tr->all) {
        for (int r = 0; r <= n; r++) w->bounds[r] = (size_t)r * per;
        if ((st = tr->all_reducer->all_gather(tr->all, w->index, w->partials, (size_t)n * per,
                                              MW_F32, w->bounds)))
            return st;
    }
    /* Parameter by parameter, shard by shard (the devices with coordinate 0 off the axes that
     * split the parameter), piece by piece: the same order with and without ZeRO-1. */
    double sq = 0.0;
    for (int i = 0; i < tr->g->nnodes; i++) {
        const mw_tensor *p = tr->g->nodes[i];
        if (p->op != MW__OP_PARAM) continue;
        for (int d = 0; d < n; d++) {
            if (!mw__param_reader(tr, d, p, MW__HELD_PARAMS)) continue;
            for (int k = 0; k < parts; k++) {
                int e = piece_owner(tr, d, k);
                sq +=
                    (double)
                        w->partials[(size_t)e * per + (size_t)p->leaf * (size_t)parts + (size_t)k];
            }
        }
    }
    *norm = (float)sqrt(sq);
    return MW_OK;
}
