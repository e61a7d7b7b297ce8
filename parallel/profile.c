/* Per-op profiling of a program's commands: every instruction of a worker's plan belongs to one
 * category (the graph op it implements, whether it is that op's rearranging copy, the phase);
 * the executor adds each instruction's time to its category (executor.c), and
 * mw__program_profile sums the categories over this process's devices into rows (the trainer's
 * mw_trainer_profile). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "parallel/program.h"

static const char *const phase_names[3] = {"forward", "backward", "update"};

static int category(const mw_graph *g, const mw__plan *p, int i) {
    const mw__ins *in = &p->ins[i];
    int phase = i < p->fwd_end ? 0 : 1;
    if (in->kind == MW__I_GRAD_BUCKET) return phase * MW__PROF_PER_PHASE + 2 * MW__OP_COUNT;
    mw__op op = g->nodes[in->node]->op;
    /* A copy is the op's own work for the ops that are copies; otherwise it rearranges an
     * operand (or, for an all-reduce, the value before the collective). */
    int copy = in->kind == MW__I_COPY && op != MW__OP_SCALE && op != MW__OP_PERMUTE &&
               op != MW__OP_BROADCAST && op != MW__OP_SLICE && op != MW__OP_PAD;
    return phase * MW__PROF_PER_PHASE + 2 * (int)op + copy;
}

mw_status mw__profile_init(worker *w, const mw_graph *g) {
    w->prof_cat = mw__calloc((size_t)w->plan.nins + 1, sizeof *w->prof_cat);
    w->prof_ms = mw__calloc(MW__PROF_CATS, sizeof *w->prof_ms);
    w->prof_calls = mw__calloc(MW__PROF_CATS, sizeof *w->prof_calls);
    if (!w->prof_cat || !w->prof_ms || !w->prof_calls) {
        mw__profile_free(w);
        return mw__error(MW_ERR_NOMEM, "out of memory making the profile");
    }
    for (int i = 0; i < w->plan.nins; i++) w->prof_cat[i] = category(g, &w->plan, i);
    return MW_OK;
}

void mw__profile_free(worker *w) {
    mw__free(w->prof_cat);
    mw__free(w->prof_ms);
    mw__free(w->prof_calls);
    w->prof_cat = NULL;
    w->prof_ms = NULL;
    w->prof_calls = NULL;
}

static int by_time(const void *a, const void *b) {
    double x = ((const mw_profile_row *)a)->ms, y = ((const mw_profile_row *)b)->ms;
    return (x < y) - (x > y);
}

void mw__program_profile(const mw__program *prog, mw_profile_row *rows, int capacity, int *count) {
    mw_profile_row all[MW__PROF_CATS];
    int n = 0;
    for (int c = 0; c < MW__PROF_CATS; c++) {
        double ms = 0;
        int64_t calls = 0;
        for (int d = prog->first; d < prog->first + prog->nlocal; d++) {
            ms += prog->w[d].prof_ms[c];
            calls += prog->w[d].prof_calls[c];
        }
        if (!calls) continue;
        mw_profile_row *r = &all[n++];
        int phase = c / MW__PROF_PER_PHASE, k = c % MW__PROF_PER_PHASE;
        if (k == 2 * MW__OP_COUNT)
            snprintf(r->op, sizeof r->op, "gradient all-reduce");
        else if (k == 2 * MW__OP_COUNT + 1)
            snprintf(r->op, sizeof r->op, "optimizer");
        else
            snprintf(r->op, sizeof r->op, "%s%s", mw__op_name(k / 2), k % 2 ? ":copy" : "");
        r->phase = phase_names[phase];
        r->ms = ms / prog->nlocal;
        r->calls = calls / prog->nlocal;
    }
    qsort(all, (size_t)n, sizeof *all, by_time);
    if (rows)
        for (int i = 0; i < n && i < capacity; i++) rows[i] = all[i];
    *count = n;
}

void mw__program_profile_reset(mw__program *prog) {
    for (int d = prog->first; d < prog->first + prog->nlocal; d++) {
        memset(prog->w[d].prof_ms, 0, MW__PROF_CATS * sizeof *prog->w[d].prof_ms);
        memset(prog->w[d].prof_calls, 0, MW__PROF_CATS * sizeof *prog->w[d].prof_calls);
    }
}
