/* Moving values between the host and a program's devices: parameters as whole host arrays
 * (each device holding its box of a split parameter; across processes, the boxes another process
 * holds gathered from it), initial values drawn whole and cut into boxes, outputs gathered from the
 * devices' boxes, borrowed parameters (another program's, read in place) and the bf16 copy of the
 * parameters kept current. */
#include <stdio.h>
#include <string.h>

#include "collectives/dist.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/init.h"
#include "parallel/program.h"

int mw__param_sharded(const mw_tensor *p) {
    for (int i = 0; i < p->type.rank; i++)
        if (p->type.ax[i].mesh >= 0) return 1;
    return 0;
}

void mw__type_box(const mw__program *prog, int d, const mw__type *t, mw__box *out) {
    mw__placement pl;
    mw__program_placement(prog, d, &pl);
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

static char *whole_params(void *ctx, const worker *w, const mw__param_slot *s, int64_t *lo,
                          int64_t *hi) {
    (void)ctx;
    *lo = s->off;
    *hi = s->off + s->count;
    return (char *)w->params + *lo * 4;
}

const mw__holding mw__held_params = {.range = whole_params, .params = 1};

int mw__param_holder(const mw__program *prog, int d, const mw_tensor *p, const mw__holding *held) {
    const mw__param_slot *s = &prog->w[d].plan.params[p->leaf];
    int64_t lo, hi;
    held->range(held->ctx, &prog->w[d], s, &lo, &hi);
    mw__box mine, other;
    mw__type_box(prog, d, &p->type, &mine);
    for (int e = prog->first; e < d; e++) {
        const mw__param_slot *t = &prog->w[e].plan.params[p->leaf];
        int64_t elo, ehi;
        held->range(held->ctx, &prog->w[e], t, &elo, &ehi);
        mw__type_box(prog, e, &p->type, &other);
        if (elo - t->off == lo - s->off && ehi - t->off == hi - s->off &&
            memcmp(mine.lo, other.lo, sizeof mine.lo) == 0)
            return e;
    }
    return d;
}

int mw__same_box(const mw__program *prog, int d, int e, const mw_tensor *p) {
    mw__box a, b;
    mw__type_box(prog, d, &p->type, &a);
    mw__type_box(prog, e, &p->type, &b);
    return memcmp(a.lo, b.lo, sizeof a.lo) == 0;
}

int mw__param_box_first(const mw__program *prog, int d, const mw_tensor *p) {
    for (int e = 0; e < d; e++)
        if (mw__same_box(prog, d, e, p)) return 0;
    return 1;
}

int mw__param_gathered(const mw__program *prog, const mw_tensor *p, const mw__holding *held) {
    const mw_mesh *mesh = prog->mesh;
    if (mesh->nprocs <= 1) return 0;
    if (held->sliced && prog->sharded_params) return 1;
    if (!mw__param_sharded(p)) return 0;
    /* Some process lacks some device's box. */
    for (int q = 0; q < mesh->nprocs; q++)
        for (int d = 0; d < mesh->ndevices; d++) {
            int has = 0;
            for (int e = 0; e < mesh->ndevices && !has; e++)
                has = mesh->proc_of[e] == q && mw__same_box(prog, d, e, p);
            if (!has) return 1;
        }
    return 0;
}

int mw__param_reader(const mw__program *prog, int d, const mw_tensor *p, const mw__holding *held) {
    const mw__param_slot *s = &prog->w[d].plan.params[p->leaf];
    int64_t lo, hi;
    held->range(held->ctx, &prog->w[d], s, &lo, &hi);
    return lo < hi && mw__param_holder(prog, d, p, held) == d;
}

/* The runs of the whole array that this process's readers of p's `held` values filled in
 * `global`: counted into *nruns and *nvals, and, when runs is not NULL, listed there (offset,
 * length) with their values copied to vals. */
static void local_runs(mw__program *prog, const mw_tensor *p, const mw__holding *held,
                       const float *global, int64_t *runs, float *vals, uint64_t *nruns,
                       uint64_t *nvals) {
    *nruns = *nvals = 0;
    for (int d = prog->first; d < prog->first + prog->nlocal; d++) {
        if (!mw__param_reader(prog, d, p, held)) continue;
        const mw__param_slot *s = &prog->w[d].plan.params[p->leaf];
        int64_t lo, hi, at;
        held->range(held->ctx, &prog->w[d], s, &lo, &hi);
        mw__box box;
        mw__type_box(prog, d, &p->type, &box);
        for (int64_t e = lo - s->off, run; e < hi - s->off; e += run) {
            run = mw__box_run(&box, e, hi - s->off, &at);
            if (runs) {
                runs[2 * *nruns] = at;
                runs[2 * *nruns + 1] = run;
                memcpy(vals + *nvals, global + at, (size_t)run * sizeof(float));
            }
            (*nruns)++;
            *nvals += (uint64_t)run;
        }
    }
}

/* The parts of p's values other processes read into their copy of `global`, copied into this
 * one's: every process sends the runs of the whole array its readers filled (offset, length and
 * values) and applies every other process's. Parts two processes both hold (replicas) are the
 * same bits, so the order they land in does not matter. */
static mw_status gather_processes(mw__program *prog, const mw_tensor *p, const mw__holding *held,
                                  float *global) {
    const mw_mesh *mesh = prog->mesh;
    int nprocs = mesh->nprocs, timeout = prog->cfg.collective_timeout_ms;
    char what[MW_MAX_NAME + 64];
    snprintf(what, sizeof what, "reading parameter '%s' from every process", p->name);
    uint64_t mine[2]; /* runs, elements */
    local_runs(prog, p, held, global, NULL, NULL, &mine[0], &mine[1]);
    uint64_t *all = mw__malloc((size_t)nprocs * sizeof mine);
    int *counts = mw__malloc((size_t)nprocs * sizeof *counts);
    if (!all || !counts) {
        mw__free(all);
        mw__free(counts);
        return mw__error(MW_ERR_NOMEM, "out of memory %s", what);
    }
    mw_status st = mw__dist_allgather_u64(mine, 2, all, timeout, what);
    size_t total = 0, own = 0;
    for (int q = 0; st == MW_OK && q < nprocs; q++) {
        uint64_t bytes = all[2 * q] * 2 * sizeof(int64_t) + all[2 * q + 1] * sizeof(float);
        if (bytes > (uint64_t)INT32_MAX)
            st = mw__error(MW_ERR_UNSUPPORTED, "%s: a process's part exceeds 2 GB", what);
        counts[q] = (int)bytes;
        if (q < mesh->proc) own += (size_t)bytes;
        total += (size_t)bytes;
    }
    char *buf = st == MW_OK ? mw__malloc(total + 1) : NULL;
    if (st == MW_OK && !buf) st = mw__error(MW_ERR_NOMEM, "out of memory %s", what);
    if (st == MW_OK) {
        /* This process's part: its runs, then their values (taken from `global`, just read). */
        int64_t *runs = (int64_t *)(void *)(buf + own);
        uint64_t nruns, nvals;
        local_runs(prog, p, held, global, runs, (float *)(void *)(runs + 2 * mine[0]), &nruns,
                   &nvals);
        char *part = mw__malloc((size_t)counts[mesh->proc] + 1);
        if (!part) st = mw__error(MW_ERR_NOMEM, "out of memory %s", what);
        if (part) memcpy(part, buf + own, (size_t)counts[mesh->proc]);
        if (st == MW_OK) st = mw__dist_allgatherv_bytes(part, counts, buf, timeout, what);
        mw__free(part);
    }
    for (size_t off = 0, q = 0; st == MW_OK && q < (size_t)nprocs; off += (size_t)counts[q], q++) {
        if ((int)q == mesh->proc) continue;
        const int64_t *runs = (const int64_t *)(const void *)(buf + off);
        const float *vals = (const float *)(const void *)(runs + 2 * all[2 * q]);
        int64_t numel = mw__type_numel(&p->type);
        for (uint64_t r = 0; r < all[2 * q]; r++) {
            if (runs[2 * r] < 0 || runs[2 * r + 1] < 0 || runs[2 * r] + runs[2 * r + 1] > numel) {
                st = mw__error(MW_ERR_STATE, "%s: rank %d sent a part outside it", what, (int)q);
                break;
            }
            memcpy(global + runs[2 * r], vals, (size_t)runs[2 * r + 1] * sizeof(float));
            vals += runs[2 * r + 1];
        }
    }
    if (st && st != MW_ERR_NOMEM) prog->broken = 1; /* a peer may still be inside the exchange */
    mw__free(buf);
    mw__free(counts);
    mw__free(all);
    return st;
}

mw_status mw__param_transfer(mw__program *prog, const mw_tensor *p, const mw__holding *held,
                             float *global, int write) {
    float *tmp = NULL; /* a box that is not one run of the whole array passes through it */
    mw_status st = MW_OK;
    for (int d = prog->first; d < prog->first + prog->nlocal && st == MW_OK; d++) {
        worker *w = &prog->w[d];
        if (!write && !mw__param_reader(prog, d, p, held)) continue;
        const mw__param_slot *s = &w->plan.params[p->leaf];
        int64_t lo, hi;
        char *at = held->range(held->ctx, w, s, &lo, &hi);
        if (lo == hi) continue;
        if (write && held->params) w->version++; /* its bf16 copy is out of date */
        mw__box box;
        mw__type_box(prog, d, &p->type, &box);
        size_t bytes = (size_t)(hi - lo) * 4;
        int64_t whole_at;
        if (mw__box_run(&box, lo - s->off, hi - s->off, &whole_at) == hi - lo) {
            st = write ? w->dev.vt->upload(&w->dev, at, global + whole_at, bytes)
                       : w->dev.vt->download(&w->dev, global + whole_at, at, bytes);
            continue;
        }
        if (!tmp) {
            int64_t most = 1;
            for (int e = prog->first; e < prog->first + prog->nlocal; e++)
                if (prog->w[e].plan.params[p->leaf].count > most)
                    most = prog->w[e].plan.params[p->leaf].count;
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
    if (st == MW_OK && !write && mw__param_gathered(prog, p, held))
        st = gather_processes(prog, p, held, global);
    return st;
}

mw_status mw__param_init_boxes(const mw__program *prog, float *const *dst) {
    for (int i = 0; i < prog->g->nnodes; i++) {
        const mw_tensor *t = prog->g->nodes[i];
        if (t->op != MW__OP_PARAM) continue;
        int64_t n = mw__type_numel(&t->type);
        float *whole = mw__malloc((size_t)(n ? n : 1) * sizeof *whole);
        if (!whole) return mw__error(MW_ERR_NOMEM, "out of memory initialising '%s'", t->name);
        mw__param_init(prog->g, t, whole);
        char what[MW_MAX_NAME + 64];
        snprintf(what, sizeof what, "%s: broadcasting rank 0's initial '%s'", prog->caller,
                 t->name);
        mw_status st =
            prog->mesh->nprocs > 1
                ? mw__dist_bcast_bytes(whole, (size_t)n * 4, prog->cfg.collective_timeout_ms, what)
                : MW_OK;
        if (st) {
            mw__free(whole);
            return st;
        }
        for (int d = prog->first; d < prog->first + prog->nlocal; d++) {
            const mw__param_slot *s = &prog->w[d].plan.params[t->leaf];
            mw__box box;
            mw__type_box(prog, d, &t->type, &box);
            mw__box_copy(&box, 0, s->count, dst[d - prog->first] + s->off, whole, 0);
        }
        mw__free(whole);
    }
    return MW_OK;
}

/* The parameter called name, whose whole tensor must have count elements. */
mw_status mw__program_find_param(const mw__program *prog, const char *name, int64_t count,
                                 const mw_tensor **param) {
    if (!prog || !name) return mw__error(MW_ERR_INVALID, "trainer or parameter name is NULL");
    for (int i = 0; i < prog->g->nnodes; i++) {
        const mw_tensor *t = prog->g->nodes[i];
        if (t->op != MW__OP_PARAM || strcmp(t->name, name) != 0) continue;
        int64_t whole = mw__type_numel(&t->type);
        if (whole != count)
            return mw__error(MW_ERR_SHAPE, "parameter '%s' has %lld elements, not %lld", name,
                             (long long)whole, (long long)count);
        *param = t;
        return MW_OK;
    }
    return mw__error(MW_ERR_NOT_FOUND, "the graph has no parameter named '%s'", name);
}

mw_status mw__program_param(mw__program *prog, const char *name, float *data, int64_t count,
                            int write) {
    const mw_tensor *p;
    mw_status st = mw__program_find_param(prog, name, count, &p);
    if (st) return st;
    if (count && !data)
        return mw__error(MW_ERR_INVALID, write ? "source is NULL" : "destination is NULL");
    return mw__param_transfer(prog, p, &mw__held_params, data, write);
}

mw_status mw__program_read_output(mw__program *prog, const char *caller, const mw_tensor *output,
                                  float *dst, int64_t count) {
    if (!prog || !output || (count && !dst))
        return mw__error(MW_ERR_INVALID, "%s: NULL argument", caller);
    int o = 0;
    while (o < prog->noutputs && prog->user_outputs[o] != output) o++;
    if (o == prog->noutputs)
        return mw__error(MW_ERR_NOT_FOUND, "%s: not one of the outputs its config lists", caller);
    if (!prog->outputs_ready)
        return mw__error(MW_ERR_STATE, "%s: no %s has run yet, so the output has no value", caller,
                         prog->commands ? prog->commands : "command");
    const mw__type *t = &prog->outputs[o]->type;
    if (count != mw__type_numel(t))
        return mw__error(MW_ERR_SHAPE, "%s: the output has %lld elements, not %lld", caller,
                         (long long)mw__type_numel(t), (long long)count);
    int sharded_output = 0;
    for (int i = 0; i < t->rank; i++) sharded_output |= t->ax[i].mesh >= 0;
    if (sharded_output && prog->mesh->nprocs > 1)
        return mw__error(MW_ERR_UNSUPPORTED,
                         "%s: a sharded output of a program that spans %d processes has rows "
                         "in other processes; reduce it to a replicated tensor in the graph",
                         caller, prog->mesh->nprocs);
    /* Each device holds a box of the global array; copy every box's rows into place. */
    float *tmp = NULL;
    int64_t cap = 0;
    mw_status st = MW_OK;
    for (int d = prog->first; d < prog->first + prog->nlocal && st == MW_OK; d++) {
        worker *w = &prog->w[d];
        mw__box box;
        mw__type_box(prog, d, t, &box);
        int64_t local = 1;
        for (int i = 0; i < box.rank; i++) local *= box.len[i];
        if (!sharded_output) /* replicated: one device has it all */
            return w->dev.vt->download(&w->dev, dst, mw__ptr(w, w->plan.outputs[o]),
                                       (size_t)count * 4);
        if (local > cap) {
            mw__free(tmp);
            cap = local;
            if (!(tmp = mw__malloc((size_t)cap * sizeof *tmp)))
                return mw__error(MW_ERR_NOMEM, "%s: out of memory", caller);
        }
        st = w->dev.vt->download(&w->dev, tmp, mw__ptr(w, w->plan.outputs[o]), (size_t)local * 4);
        if (st == MW_OK) mw__box_copy(&box, 0, local, tmp, dst, 1);
    }
    mw__free(tmp);
    return st;
}

/* Rebases the parameter references of w's plan onto params_from's layout. */
mw_status mw__share_params(mw__program *prog, worker *w) {
    const mw__program *src = prog->params_from;
    const mw__plan *sp = &src->w[w->index].plan;
    mw__plan *p = &w->plan;
    int64_t *to = mw__calloc((size_t)p->nparams + 1, sizeof *to);
    if (!to) return mw__error(MW_ERR_NOMEM, "out of memory making the inference program");
    mw_status st = MW_OK;
    for (int i = 0; i < prog->g->nnodes && st == MW_OK; i++) {
        const mw_tensor *t = prog->g->nodes[i], *u = NULL;
        if (t->op != MW__OP_PARAM) continue;
        for (int j = 0; j < src->g->nnodes && !u; j++)
            if (src->g->nodes[j]->op == MW__OP_PARAM && !strcmp(src->g->nodes[j]->name, t->name))
                u = src->g->nodes[j];
        int same = u && u->type.rank == t->type.rank, split = 1;
        for (int k = 0; same && k < t->type.rank; k++) {
            const mw__axis *a = &t->type.ax[k], *b = &u->type.ax[k];
            same = a->size == b->size;
            /* The same split (by mesh-axis name: the graphs number their names apart), or the
             * program would read another box of the trainer's shards. */
            split &= (a->mesh < 0) == (b->mesh < 0) &&
                     (a->mesh < 0 ||
                      (!strcmp(prog->g->names[a->name], src->g->names[b->name]) &&
                       !strcmp(prog->g->mesh_names[a->mesh], src->g->mesh_names[b->mesh])));
        }
        if (!u)
            st = mw__error(MW_ERR_NOT_FOUND, "the trainer has no parameter '%s'", t->name);
        else if (same && !split) {
            char a[256], b[256];
            st = mw__error(MW_ERR_SHARDING,
                           "parameter '%s' is %s in the program but %s in the trainer: split "
                           "the program's parameter as the trainer's (mw_shard)",
                           t->name, mw__type_describe(prog->g, &t->type, a, sizeof a),
                           mw__type_describe(src->g, &u->type, b, sizeof b));
        } else if (!same) {
            char a[256], b[256];
            st =
                mw__error(MW_ERR_SHAPE, "parameter '%s' is %s in the program but %s in the trainer",
                          t->name, mw__type_describe(prog->g, &t->type, a, sizeof a),
                          mw__type_describe(src->g, &u->type, b, sizeof b));
        } else
            to[t->leaf] = sp->params[u->leaf].off;
    }
    /* The program's bf16 copy (its own, made from the trainer's parameters) follows the same
     * layout: its references move alike. */
    for (int i = 0; i < p->nins && st == MW_OK; i++)
        for (int k = 0; k < mw__ins_roles(p->ins[i].kind); k++) {
            mw__ref *r = &p->ins[i].ref.all[k];
            if ((r->base != MW__BASE_PARAMS && r->base != MW__BASE_PARAMS16) || r->off < 0)
                continue;
            int64_t bytes = r->base == MW__BASE_PARAMS ? 4 : 2, e = r->off / bytes;
            for (int j = 0; j < p->nparams; j++) {
                const mw__param_slot *s = &p->params[j];
                if (s->count && e >= s->off && e < s->off + s->count) {
                    r->off = (to[j] + (e - s->off)) * bytes;
                    break;
                }
            }
        }
    for (int j = 0; j < p->nparams && st == MW_OK; j++) p->params[j].off = to[j];
    mw__free(to);
    return st;
}

mw_status mw__params16_refresh(worker *w, int64_t lo, int64_t hi) {
    const mw__plan *p = &w->plan;
    for (int j = 0; j < p->nparams; j++) {
        const mw__param_slot *s = &p->params[j];
        int64_t a = s->off > lo ? s->off : lo, b = s->off + s->count < hi ? s->off + s->count : hi;
        if (!s->bf16 || a >= b) continue;
        mw__k_copy k = {.alpha = 1.0f,
                        .out_dtype = MW_BF16,
                        .a_dtype = MW_F32,
                        .nd = {.rank = 1, .dims = {b - a}, .stride = {{1}, {1}}},
                        .out = (uint16_t *)w->params16 + a,
                        .a = (const float *)w->params + a};
        mw_status st = w->dev.vt->copy(&w->dev, &k);
        if (st) return st;
    }
    return MW_OK;
}

mw_status mw__params16_sync(worker *w) {
    if (!w->params16) return MW_OK;
    const mw__program *from = w->prog->params_from;
    uint64_t v = from ? from->w[w->index].version : w->version;
    if (v == w->version16) return MW_OK;
    mw_status st = mw__params16_refresh(w, 0, (int64_t)mw__params16_elems(w));
    if (st == MW_OK) w->version16 = v;
    return st;
}
