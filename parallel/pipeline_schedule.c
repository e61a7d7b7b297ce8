/* Pipeline-parallel schedules and their idle-time model (parallel/pipeline_schedule.h). The
 * simulation is list scheduling with fixed per-device orders: each action starts at the later of
 * its device becoming free and its inputs arriving, so the order in which the loop below visits
 * the devices cannot change a time, only how soon a deadlock is seen. */
#include "parallel/pipeline_schedule.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

/* The most actions of one device times the devices must fit an int, so that positions and the
 * simulator's table of (kind, stage, micro-batch) index without overflow. */
#define MAX_WORK (INT_MAX / (3 * MW_MAX_DEVICES))

static const char *sched_name(int kind) {
    switch (kind) {
    case MW__PIPE_GPIPE: return "GPipe";
    case MW__PIPE_1F1B: return "1F1B";
    case MW__PIPE_INTERLEAVED: return "interleaved 1F1B";
    case MW__PIPE_ZERO_BUBBLE: return "zero-bubble ZB-H1";
    default: return "unknown";
    }
}

static const char *action_name(int kind) {
    return kind == MW__PIPE_F ? "F" : kind == MW__PIPE_B ? "B" : kind == MW__PIPE_W ? "W" : "?";
}

static void push(mw__pipe_action *a, int *n, int kind, int micro, int chunk) {
    a[*n] = (mw__pipe_action){.kind = kind, .micro = micro, .chunk = chunk};
    (*n)++;
}

static int gpipe(int M, mw__pipe_action *a) {
    int n = 0;
    for (int m = 0; m < M; m++) push(a, &n, MW__PIPE_F, m, 0);
    for (int m = 0; m < M; m++) push(a, &n, MW__PIPE_B, m, 0);
    return n;
}

static int one_f_one_b(int P, int M, int d, mw__pipe_action *a) {
    int n = 0, warm = P - 1 - d < M ? P - 1 - d : M, f = 0, b = 0;
    while (f < warm) push(a, &n, MW__PIPE_F, f++, 0);
    while (f < M) {
        push(a, &n, MW__PIPE_F, f++, 0);
        push(a, &n, MW__PIPE_B, b++, 0);
    }
    while (b < M) push(a, &n, MW__PIPE_B, b++, 0);
    return n;
}

/* Megatron's map from a device's k-th forward (or backward) to its micro-batch and chunk: groups
 * of P micro-batches go through chunk 0, then chunk 1, ...; backwards visit the chunks from the
 * last, since the backward enters the device through its last stage. */
static void virtual_micro(int k, int P, int V, int forward, int *micro, int *chunk) {
    int in_group = k % (P * V);
    *chunk = forward ? in_group / P : V - 1 - in_group / P;
    *micro = k / (P * V) * P + k % P;
}

static int interleaved(int P, int M, int V, int d, mw__pipe_action *a) {
    int total = M * V, warm = (P - d - 1) * 2 + (V - 1) * P, n = 0, f = 0, b = 0, m, c;
    if (warm > total) warm = total;
    while (f < warm) {
        virtual_micro(f++, P, V, 1, &m, &c);
        push(a, &n, MW__PIPE_F, m, c);
    }
    while (f < total) {
        virtual_micro(f++, P, V, 1, &m, &c);
        push(a, &n, MW__PIPE_F, m, c);
        virtual_micro(b++, P, V, 0, &m, &c);
        push(a, &n, MW__PIPE_B, m, c);
    }
    while (b < total) {
        virtual_micro(b++, P, V, 0, &m, &c);
        push(a, &n, MW__PIPE_B, m, c);
    }
    return n;
}

/* ZB-H1: with W split off, the backward chain moves one B per device instead of B + W, so it
 * reaches device d sooner than that device's 1F1B order would be ready for it, unless device d
 * holds back d W's (the last devices, which start the chain, hold back the most) and runs them at
 * the end, where 1F1B has its cool-down bubble. */
static int zero_bubble(int P, int M, int d, mw__pipe_action *a) {
    int n = 0, first = P - d < M ? P - d : M, f = 0, b = 0, w = 0;
    while (f < first) push(a, &n, MW__PIPE_F, f++, 0);
    while (b < M) {
        push(a, &n, MW__PIPE_B, b++, 0);
        if (f < M) push(a, &n, MW__PIPE_F, f++, 0);
        if (b - w > d) push(a, &n, MW__PIPE_W, w++, 0);
    }
    while (w < M) push(a, &n, MW__PIPE_W, w++, 0);
    return n;
}

mw_status mw__pipe_schedule_make(mw__pipe_sched kind, int devices, int micro, int chunks,
                                 mw__pipe_schedule *out) {
    if (!out) return mw__error(MW_ERR_INVALID, "pipeline schedule: out is NULL");
    memset(out, 0, sizeof *out);
    if (kind < MW__PIPE_GPIPE || kind > MW__PIPE_ZERO_BUBBLE)
        return mw__error(MW_ERR_INVALID,
                         "pipeline schedule: unknown kind %d; use MW__PIPE_GPIPE, MW__PIPE_1F1B, "
                         "MW__PIPE_INTERLEAVED or MW__PIPE_ZERO_BUBBLE",
                         (int)kind);
    const char *name = sched_name(kind);
    if (devices < 1 || devices > MW_MAX_DEVICES)
        return mw__error(MW_ERR_INVALID, "%s schedule: devices = %d; use 1 to %d devices", name,
                         devices, MW_MAX_DEVICES);
    if (micro < 1)
        return mw__error(MW_ERR_INVALID,
                         "%s schedule: micro = %d; a schedule needs at least 1 micro-batch", name,
                         micro);
    if (chunks < 1)
        return mw__error(MW_ERR_INVALID, "%s schedule: chunks = %d; use at least 1 chunk", name,
                         chunks);
    if (kind != MW__PIPE_INTERLEAVED && chunks != 1)
        return mw__error(MW_ERR_INVALID,
                         "%s schedule: chunks = %d, but only the interleaved schedule puts more "
                         "than one chunk on a device; use chunks = 1 or MW__PIPE_INTERLEAVED",
                         name, chunks);
    if (kind == MW__PIPE_INTERLEAVED && chunks < 2)
        return mw__error(MW_ERR_INVALID,
                         "%s schedule: chunks = %d; interleaving needs at least 2 chunks per "
                         "device (with 1, use MW__PIPE_1F1B)",
                         name, chunks);
    if (kind == MW__PIPE_INTERLEAVED && micro % devices != 0)
        return mw__error(MW_ERR_INVALID,
                         "%s schedule: micro = %d is not a multiple of devices = %d; Megatron's "
                         "interleaving runs micro-batches in groups of one per device, so use "
                         "%d or %d micro-batches",
                         name, micro, devices, micro / devices * devices,
                         (micro / devices + 1) * devices);
    if (micro > MAX_WORK / chunks)
        return mw__error(MW_ERR_INVALID,
                         "%s schedule: micro = %d with chunks = %d is more work than a schedule "
                         "counts; use at most %d micro-batches",
                         name, micro, chunks, MAX_WORK / chunks);

    out->kind = kind, out->devices = devices, out->micro = micro, out->chunks = chunks;
    int per_device = (kind == MW__PIPE_ZERO_BUBBLE ? 3 : 2) * micro * chunks;
    for (int d = 0; d < devices; d++) {
        mw__pipe_action *a = mw__malloc((size_t)per_device * sizeof *a);
        if (!a) {
            mw__pipe_schedule_free(out);
            return mw__error(MW_ERR_NOMEM, "%s schedule: no memory for device %d's %d actions",
                             name, d, per_device);
        }
        out->act[d] = a;
        switch (kind) {
        case MW__PIPE_GPIPE: out->nact[d] = gpipe(micro, a); break;
        case MW__PIPE_1F1B: out->nact[d] = one_f_one_b(devices, micro, d, a); break;
        case MW__PIPE_INTERLEAVED: out->nact[d] = interleaved(devices, micro, chunks, d, a); break;
        case MW__PIPE_ZERO_BUBBLE: out->nact[d] = zero_bubble(devices, micro, d, a); break;
        }
    }
    return MW_OK;
}

void mw__pipe_schedule_free(mw__pipe_schedule *s) {
    if (!s) return;
    for (int d = 0; d < MW_MAX_DEVICES; d++) mw__free(s->act[d]);
    memset(s, 0, sizeof *s);
}

int mw__pipe_schedule_inflight(const mw__pipe_schedule *s, int d) {
    if (!s || d < 0 || d >= s->devices || d >= MW_MAX_DEVICES || !s->act[d]) return 0;
    int now = 0, most = 0;
    for (int i = 0; i < s->nact[d]; i++) {
        if (s->act[d][i].kind == MW__PIPE_F && ++now > most) most = now;
        if (s->act[d][i].kind == MW__PIPE_B) now--;
    }
    return most;
}

/* --- simulation ------------------------------------------------------------------------------ */

typedef struct sim {
    const mw__pipe_schedule *s;
    int stages;
    double *end; /* per (kind, stage, micro-batch): when it finished, or -1 */
    int *pos;    /* per (kind, stage, micro-batch): its position on its device, or -1 */
} sim;

static size_t slot(const sim *q, int kind, int stage, int micro) {
    return ((size_t)kind * (size_t)q->stages + (size_t)stage) * (size_t)q->s->micro + (size_t)micro;
}

/* What an action waits for: up to two (kind, stage) pairs of the same micro-batch, and whether
 * the wait crosses devices (and so pays comm). */
typedef struct dep {
    int kind, stage, crosses;
} dep;

static int deps_of(const sim *q, int kind, int stage, dep out[2]) {
    int n = 0, crosses = q->s->devices > 1;
    if (kind == MW__PIPE_F && stage > 0)
        out[n++] = (dep){.kind = MW__PIPE_F, .stage = stage - 1, .crosses = crosses};
    if (kind == MW__PIPE_B) {
        out[n++] = (dep){.kind = MW__PIPE_F, .stage = stage, .crosses = 0};
        if (stage < q->stages - 1)
            out[n++] = (dep){.kind = MW__PIPE_B, .stage = stage + 1, .crosses = crosses};
    }
    if (kind == MW__PIPE_W) out[n++] = (dep){.kind = MW__PIPE_B, .stage = stage, .crosses = 0};
    return n;
}

static int finite_nonneg(const double *v, int n) {
    for (int i = 0; i < n; i++)
        if (!isfinite(v[i]) || v[i] < 0) return i;
    return -1;
}

/* Every (stage, micro-batch) has exactly one F and one B on the stage's device, and one W
 * exactly when the backward is split: otherwise the simulation would time a different model. */
static mw_status check_actions(sim *q) {
    const mw__pipe_schedule *s = q->s;
    int split = s->kind == MW__PIPE_ZERO_BUBBLE;
    for (int d = 0; d < s->devices; d++) {
        if (s->nact[d] < 0 || (s->nact[d] > 0 && !s->act[d]))
            return mw__error(MW_ERR_INVALID, "pipeline schedule: device %d has %d actions%s", d,
                             s->nact[d], s->nact[d] < 0 ? "" : " but no list of them");
        for (int i = 0; i < s->nact[d]; i++) {
            mw__pipe_action a = s->act[d][i];
            if (a.kind < MW__PIPE_F || a.kind > MW__PIPE_W || (a.kind == MW__PIPE_W && !split))
                return mw__error(MW_ERR_INVALID,
                                 "pipeline schedule: device %d's action %d has kind %d, not one "
                                 "of F, B%s",
                                 d, i, a.kind, split ? " or W" : " (W only in zero-bubble)");
            if (a.micro < 0 || a.micro >= s->micro || a.chunk < 0 || a.chunk >= s->chunks)
                return mw__error(MW_ERR_INVALID,
                                 "pipeline schedule: device %d's action %d (%s) names micro-batch "
                                 "%d, chunk %d; the schedule has %d micro-batches, %d chunks",
                                 d, i, action_name(a.kind), a.micro, a.chunk, s->micro, s->chunks);
            size_t k = slot(q, a.kind, a.chunk * s->devices + d, a.micro);
            if (q->pos[k] >= 0)
                return mw__error(MW_ERR_INVALID,
                                 "pipeline schedule: device %d runs %s of micro-batch %d, chunk "
                                 "%d twice (actions %d and %d)",
                                 d, action_name(a.kind), a.micro, a.chunk, q->pos[k], i);
            q->pos[k] = i;
        }
    }
    for (int kind = MW__PIPE_F; kind <= (split ? MW__PIPE_W : MW__PIPE_B); kind++)
        for (int st = 0; st < q->stages; st++)
            for (int m = 0; m < s->micro; m++)
                if (q->pos[slot(q, kind, st, m)] < 0)
                    return mw__error(MW_ERR_INVALID,
                                     "pipeline schedule: device %d runs no %s of micro-batch %d, "
                                     "chunk %d (stage %d)",
                                     st % s->devices, action_name(kind), m, st / s->devices, st);
    return MW_OK;
}

/* What device d's stuck action waits for first: j of its n dependencies w. */
static int first_wait(const sim *q, int d, int next, dep w[2]) {
    mw__pipe_action a = q->s->act[d][next];
    int n = deps_of(q, a.kind, a.chunk * q->s->devices + d, w), j = 0;
    while (j < n - 1 && q->end[slot(q, w[j].kind, w[j].stage, a.micro)] >= 0) j++;
    return j;
}

/* Follows the waits from the first stuck device to a device that waits on itself or closes a
 * cycle, so the message names where the order is wrong rather than a device merely downstream. */
static mw_status deadlock(const sim *q, const int *next) {
    const mw__pipe_schedule *s = q->s;
    int d = 0, seen[MW_MAX_DEVICES] = {0};
    while (next[d] >= s->nact[d]) d++;
    dep w[2];
    int j;
    for (;;) {
        j = first_wait(q, d, next[d], w);
        int owner = w[j].stage % s->devices;
        if (owner == d || seen[owner]) break;
        seen[d] = 1;
        d = owner;
    }
    mw__pipe_action a = s->act[d][next[d]];
    int stage = a.chunk * s->devices + d;
    int owner = w[j].stage % s->devices, at = q->pos[slot(q, w[j].kind, w[j].stage, a.micro)];
    char where[96];
    if (owner == d)
        snprintf(where, sizeof where, "which device %d runs later, at its action %d", d, at);
    else
        snprintf(where, sizeof where,
                 "which device %d runs at its action %d, but it is stuck at "
                 "its action %d",
                 owner, at, next[owner]);
    return mw__error(MW_ERR_INVALID,
                     "%s schedule deadlocks: device %d's action %d (%s of micro-batch %d, stage "
                     "%d) waits for %s of micro-batch %d, stage %d, %s; order each device's "
                     "actions so that every one comes after what it waits for",
                     sched_name(s->kind), d, next[d], action_name(a.kind), a.micro, stage,
                     action_name(w[j].kind), a.micro, w[j].stage, where);
}

static double duration(const mw__pipe_schedule *s, int kind, int stage, const double *tf,
                       const double *tb, const double *tw) {
    double weight = tw ? tw[stage] : 0.0;
    if (kind == MW__PIPE_F) return tf[stage];
    if (kind == MW__PIPE_W) return weight;
    return s->kind == MW__PIPE_ZERO_BUBBLE ? tb[stage] : tb[stage] + weight;
}

mw_status mw__pipe_schedule_simulate(const mw__pipe_schedule *s, const double *tf, const double *tb,
                                     const double *tw, double comm, double *total, double *idle) {
    if (!s || !tf || !tb || !total)
        return mw__error(MW_ERR_INVALID, "pipeline simulation: %s is NULL",
                         !s    ? "the schedule"
                         : !tf ? "tf"
                         : !tb ? "tb"
                               : "total");
    if (s->devices < 1 || s->devices > MW_MAX_DEVICES || s->micro < 1 || s->chunks < 1 ||
        s->micro > MAX_WORK / s->chunks)
        return mw__error(MW_ERR_INVALID,
                         "pipeline simulation: a schedule of %d devices, %d micro-batches, %d "
                         "chunks; make it with mw__pipe_schedule_make",
                         s->devices, s->micro, s->chunks);
    int stages = s->devices * s->chunks, bad;
    const char *names[3] = {"tf", "tb", "tw"};
    const double *arrays[3] = {tf, tb, tw};
    for (int i = 0; i < 3; i++)
        if (arrays[i] && (bad = finite_nonneg(arrays[i], stages)) >= 0)
            return mw__error(MW_ERR_INVALID,
                             "pipeline simulation: %s[%d] = %g; durations must be finite and "
                             ">= 0",
                             names[i], bad, arrays[i][bad]);
    if (!isfinite(comm) || comm < 0)
        return mw__error(MW_ERR_INVALID,
                         "pipeline simulation: comm = %g; a transfer time must be finite and "
                         ">= 0",
                         comm);

    sim q = {.s = s, .stages = stages};
    size_t cells = 3 * (size_t)stages * (size_t)s->micro;
    q.end = mw__malloc(cells * sizeof *q.end);
    q.pos = mw__malloc(cells * sizeof *q.pos);
    int *next = mw__calloc((size_t)s->devices, sizeof *next);
    double *free_at = mw__calloc((size_t)s->devices, sizeof *free_at);
    double *busy = mw__calloc((size_t)s->devices, sizeof *busy);
    mw_status st = MW_OK;
    if (!q.end || !q.pos || !next || !free_at || !busy) {
        st =
            mw__error(MW_ERR_NOMEM, "pipeline simulation: no memory for %zu actions' times", cells);
        goto done;
    }
    for (size_t i = 0; i < cells; i++) q.end[i] = -1.0, q.pos[i] = -1;
    if ((st = check_actions(&q)) != MW_OK) goto done;

    int64_t left = 0;
    for (int d = 0; d < s->devices; d++) left += s->nact[d];
    double makespan = 0.0;
    while (left > 0) {
        int moved = 0;
        for (int d = 0; d < s->devices; d++) {
            while (next[d] < s->nact[d]) {
                mw__pipe_action a = s->act[d][next[d]];
                int stage = a.chunk * s->devices + d;
                dep w[2];
                int n = deps_of(&q, a.kind, stage, w), ready = 1;
                double start = free_at[d];
                for (int j = 0; j < n && ready; j++) {
                    double e = q.end[slot(&q, w[j].kind, w[j].stage, a.micro)];
                    if (e < 0)
                        ready = 0;
                    else if (e + (w[j].crosses ? comm : 0.0) > start)
                        start = e + (w[j].crosses ? comm : 0.0);
                }
                if (!ready) break;
                double t = duration(s, a.kind, stage, tf, tb, tw);
                q.end[slot(&q, a.kind, stage, a.micro)] = free_at[d] = start + t;
                if (start + t > makespan) makespan = start + t;
                busy[d] += t;
                next[d]++, left--, moved = 1;
            }
        }
        if (!moved) {
            st = deadlock(&q, next);
            goto done;
        }
    }
    *total = makespan;
    if (idle)
        for (int d = 0; d < s->devices; d++)
            idle[d] = makespan > 0 ? 1.0 - busy[d] / makespan : 0.0;
done:
    mw__free(q.end);
    mw__free(q.pos);
    mw__free(next);
    mw__free(free_at);
    mw__free(busy);
    return st;
}
