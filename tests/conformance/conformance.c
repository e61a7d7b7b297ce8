/* The conformance table's runner: every row of table.c over every legal layout of its operands
 * and every configuration this machine has, against the float64 reference (ref.h).
 *
 *   conformance [--quick] [--devices cpu|cuda] [--row NAME] [--verbose]
 *
 * A case is (row, variant, layout, configuration). A layout gives every operand an axis order the
 * op's header allows and a producer: the parameter itself, a contraction that computes it (so a
 * GEMM writes it, in bf16 where the op reads bf16, and the op's gradient feeds a GEMM), or a
 * scaling of a parameter (an elementwise kernel writes it). A configuration is a mesh (cpu:1;
 * cpu:2 with each of the row's split axes split; in the full sweep also cpu:3 and a 2 x 2 mesh),
 * a precision (f32, the bf16 policy) and, one child process each, an instruction level of the
 * CPU's (MESHWIT_CPU_ISA) and a GEMM engine (MESHWIT_CPU_GEMM). Each case builds the row's op in
 * a graph, the loss sum(out * R) for a fixed random R, computes the gradients and compares the
 * output and every operand's gradient with the reference's, relative to the largest element:
 *
 *   f32:  unit roundoff 2^-24 x (16 + 2 sqrt(K)) x amp, where K is the longest reduction of the
 *         op (the order of a sum of K terms changes its rounding by about sqrt(K) units; 16
 *         units for the kernels' exp, tanh and erf and the few roundings around them) and amp
 *         the row's error amplification (a division, a normalisation);
 *   bf16: 2^-8 (a bf16 rounding of each contraction operand, 2^-9, on both operands) x 4
 *         (the products of the longest chain: attention's backward rounds P, dS and dO) x amp;
 *
 * and requires every value finite. Besides the reference, bf16 must lie within 3e-2 of the same
 * case in f32, and f32 within 1e-5 of the first layout with the same producers: the promises of
 * the README. The reference's own gradients are checked by central finite differences on a
 * sample of elements of every operand. Splitting an axis the op refuses to split (or one it needs
 * whole, held by a computed operand) must fail with MW_ERR_SHARDING naming the axis; every other
 * split must run and agree. At the end every op of MW__OPS and every kernel of MW__KERNELS must
 * have run (the graph ops and plan instructions of every case are recorded), and in the full sweep
 * the planner's variants (fused epilogues, bf16 writes, kept probabilities, collectives).
 *
 * Exit status 0 when every case passes, 1 otherwise; a child for a GEMM engine this build lacks
 * exits 77 (reported as skipped). */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "conformance.h"
#include "core/graph_impl.h"
#include "core/plan.h"
#include "devices/backend.h"
#include "devices/cpu/cpu_isa.h"
#include "parallel/infer_impl.h"
#include "parallel/trainer_impl.h"

#define MAX_LAYOUTS 24
#define QUICK_LAYOUTS 3
#define NSRC 3
#define FD_SAMPLES 12
#define MAX_REPORT 6 /* failures printed per row */

enum { SRC_PARAM, SRC_GEMM, SRC_SCALE };
static const char *const src_name[NSRC] = {"param", "gemm", "scale"};

static int quick, verbose, use_cuda;
static const char *only_row;

/* --- deterministic values -------------------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_unit(void) { return (double)(rng_next() >> 11) * 0x1p-53; }

static uint64_t hash_str(const char *s, uint64_t h) {
    while (*s) h = (h ^ (unsigned char)*s++) * 0x100000001B3ull;
    return h;
}

/* --- small helpers ------------------------------------------------------------------------- */

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "conformance: out of memory\n");
        exit(2);
    }
    return p;
}

static int in_list(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && memcmp(p, name, n) == 0) return 1;
        p = e ? e + 1 : p + len;
    }
    return 0;
}

/* The i-th name of a comma-separated list into buf; 0 when there is none. */
static int list_item(const char *list, int i, char *buf, size_t size) {
    for (const char *p = list; p && *p; i--) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (i == 0) {
            snprintf(buf, size, "%.*s", (int)len, p);
            return 1;
        }
        p = e ? e + 1 : p + len;
    }
    return 0;
}

/* dst (axes `to`) = src (axes `from`, the same names in another order). */
static void reorder(const rg_axes *from, const double *src, const rg_axes *to, double *dst) {
    int64_t st[RG_MAX_RANK], s = 1, n = rg_axes_numel(to), idx[RG_MAX_RANK] = {0}, off = 0;
    int64_t sf[RG_MAX_RANK];
    for (int i = from->rank - 1; i >= 0; i--) sf[i] = s, s *= from->size[i];
    for (int i = 0; i < to->rank; i++) st[i] = sf[rg_find(from, to->name[i])];
    for (int64_t e = 0; e < n; e++) {
        dst[e] = src[off];
        for (int i = to->rank - 1; i >= 0; i--) {
            idx[i]++, off += st[i];
            if (idx[i] < to->size[i]) break;
            off -= st[i] * to->size[i], idx[i] = 0;
        }
    }
}

static void reorder_ids(const rg_axes *from, const int32_t *src, const rg_axes *to, int32_t *dst) {
    int64_t n = rg_axes_numel(to);
    double *a = xcalloc((size_t)n, sizeof *a), *b = xcalloc((size_t)n, sizeof *b);
    for (int64_t e = 0; e < n; e++) a[e] = src[e];
    reorder(from, a, to, b);
    for (int64_t e = 0; e < n; e++) dst[e] = (int32_t)b[e];
    free(a);
    free(b);
}

static rg_axes permuted(const rg_axes *ax, const int *perm) {
    rg_axes o = *ax;
    for (int i = 0; i < ax->rank; i++) {
        strcpy(o.name[i], ax->name[perm[i]]);
        o.size[i] = ax->size[perm[i]];
    }
    return o;
}

static void axes_list(const rg_axes *ax, char *buf, size_t size) {
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < ax->rank && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, "%s%s", i ? "," : "", ax->name[i]);
}

static mw_axes mw_axes_of(const rg_axes *ax) {
    mw_axes a = {.rank = ax->rank};
    for (int i = 0; i < ax->rank; i++) a.axis[i] = (mw_axis){ax->name[i], ax->size[i]};
    return a;
}

/* --- coverage ----------------------------------------------------------------------------------
 */

/* Variants of the plan the full sweep must have run, besides every op and kernel. */
#define VARIANTS(X)                                                                                \
    X(GEMM_BIAS, "gemm with a fused bias")                                                         \
    X(GEMM_ADDEND, "gemm with a fused addend")                                                     \
    X(GEMM_BATCHED, "batched gemm")                                                                \
    X(GEMM_BF16, "gemm of bf16 operands")                                                          \
    X(GEMM_BF16_OUT, "gemm writing bf16")                                                          \
    X(COPY_TO_BF16, "copy rounding to bf16")                                                       \
    X(UNARY_BF16_OUT, "gelu writing bf16")                                                         \
    X(UNARY_GRAD_COLSUM, "gelu gradient with fused column sums")                                   \
    X(LN_BF16_OUT, "layer norm writing bf16")                                                      \
    X(LN_DX_DWDB, "layer norm dx with fused dw and db")                                            \
    X(LN_DX_ADDEND, "layer norm dx with a fused addend")                                           \
    X(RMS_BF16_OUT, "RMS norm writing bf16")                                                       \
    X(RMS_DX_DW, "RMS norm dx with a fused dw")                                                    \
    X(RMS_DX_ADDEND, "RMS norm dx with a fused addend")                                            \
    X(ATTN_BF16, "attention of bf16 q, k, v")                                                      \
    X(ATTN_KEPT, "attention keeping its probabilities")                                            \
    X(ATTN_ROTARY, "attention rotating q and k (rope fused)")                                      \
    X(ATTN_ROTARY_BF16, "bf16 attention rotating q and k")                                         \
    X(ATTN_GRAD_ROTARY, "attention gradient rotating d(qkv) back")                                 \
    X(SOFTMAX_CAUSAL, "causal softmax")                                                            \
    X(ALLREDUCE, "forward all-reduce")                                                             \
    X(GRAD_BUCKET, "gradient bucket")                                                              \
    X(ALLGATHER, "all-gather (FSDP)")                                                              \
    X(REDUCE_SCATTER, "reduce-scatter (FSDP)")                                                     \
    X(GATHER_PREFETCH, "prefetched all-gather")

enum {
#define V_ENUM(K, s) V_##K,
    VARIANTS(V_ENUM)
#undef V_ENUM
        V_COUNT
};
static const char *const variant_name[V_COUNT] = {
#define V_NAME(K, s) s,
    VARIANTS(V_NAME)
#undef V_NAME
};

static int seen_op[MW__OP_COUNT], seen_kernel[MW__I_COUNT], seen_variant[V_COUNT];
static int row_seen_op[MW__OP_COUNT];

/* Kernel descriptions of what ran (mw_trainer_kernels lines), deduplicated. */
static char kernels_seen[64][120];
static int nkernels_seen;

static void note_kernels(const char *text) {
    for (const char *p = text; *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        /* "gemm f32: openblas sgemm (2)": drop the count */
        size_t keep = len;
        while (keep > 0 && p[keep - 1] != '(') keep--;
        keep = keep > 1 ? keep - 2 : len;
        int found = 0;
        for (int i = 0; i < nkernels_seen && !found; i++)
            found = strlen(kernels_seen[i]) == keep && !strncmp(kernels_seen[i], p, keep);
        if (!found && nkernels_seen < 64 && keep > 0 && keep < 120)
            snprintf(kernels_seen[nkernels_seen++], 120, "%.*s", (int)keep, p);
        p = e ? e + 1 : p + len;
    }
}

static void note_program(const mw__program *prog) {
    const mw_graph *g = prog->g;
    for (int i = 0; i < g->nnodes; i++) {
        seen_op[g->nodes[i]->op] = 1;
        row_seen_op[g->nodes[i]->op] = 1;
    }
    for (int d = prog->first; d < prog->first + prog->nlocal; d++) {
        const mw__plan *p = &prog->w[d].plan;
        for (int i = 0; i < p->nins; i++) {
            const mw__ins *in = &p->ins[i];
            seen_kernel[in->kind] = 1;
            const union mw__kernel *k = &in->k;
            switch (in->kind) {
            case MW__I_GEMM:
                seen_variant[V_GEMM_BIAS] |= in->ref.gemm.bias.off >= 0;
                seen_variant[V_GEMM_ADDEND] |= in->ref.gemm.addend.off >= 0 || k->gemm.beta != 0;
                seen_variant[V_GEMM_BATCHED] |= k->gemm.batch > 1;
                seen_variant[V_GEMM_BF16] |= k->gemm.ab_dtype == MW_BF16;
                seen_variant[V_GEMM_BF16_OUT] |= k->gemm.c_dtype == MW_BF16;
                break;
            case MW__I_COPY: seen_variant[V_COPY_TO_BF16] |= k->copy.out_dtype == MW_BF16; break;
            case MW__I_UNARY:
                seen_variant[V_UNARY_BF16_OUT] |= k->unary.out_dtype == MW_BF16;
                break;
            case MW__I_UNARY_GRAD:
                seen_variant[V_UNARY_GRAD_COLSUM] |= in->ref.unary_grad.colsum.off >= 0;
                break;
            case MW__I_LAYERNORM:
                seen_variant[V_LN_BF16_OUT] |= k->layernorm.out_dtype == MW_BF16;
                break;
            case MW__I_LAYERNORM_DX:
                seen_variant[V_LN_DX_DWDB] |= in->ref.layernorm_dx.dw.off >= 0;
                seen_variant[V_LN_DX_ADDEND] |= in->ref.layernorm_dx.addend.off >= 0;
                break;
            case MW__I_RMSNORM:
                seen_variant[V_RMS_BF16_OUT] |= k->rmsnorm.out_dtype == MW_BF16;
                break;
            case MW__I_RMSNORM_DX:
                seen_variant[V_RMS_DX_DW] |= in->ref.rmsnorm_dx.dw.off >= 0;
                seen_variant[V_RMS_DX_ADDEND] |= in->ref.rmsnorm_dx.addend.off >= 0;
                break;
            case MW__I_ATTENTION:
                seen_variant[V_ATTN_BF16] |= k->attention.qkv_dtype == MW_BF16;
                seen_variant[V_ATTN_KEPT] |= in->ref.attention.probs.off >= 0;
                seen_variant[V_ATTN_ROTARY] |= k->attention.rope.dims > 0;
                seen_variant[V_ATTN_ROTARY_BF16] |=
                    k->attention.rope.dims > 0 && k->attention.qkv_dtype == MW_BF16;
                break;
            case MW__I_ATTENTION_GRAD:
                seen_variant[V_ATTN_GRAD_ROTARY] |= k->attention_grad.rope.dims > 0;
                break;
            case MW__I_SOFTMAX: seen_variant[V_SOFTMAX_CAUSAL] |= k->softmax.causal; break;
            case MW__I_ALLREDUCE: seen_variant[V_ALLREDUCE] = 1; break;
            case MW__I_GRAD_BUCKET: seen_variant[V_GRAD_BUCKET] = 1; break;
            case MW__I_ALLGATHER: seen_variant[V_ALLGATHER] = 1; break;
            case MW__I_REDUCE_SCATTER: seen_variant[V_REDUCE_SCATTER] = 1; break;
            case MW__I_GATHER_START: seen_variant[V_GATHER_PREFETCH] = 1; break;
            default: break;
            }
        }
    }
}

/* --- a case ------------------------------------------------------------------------------------
 */

/* What the configuration splits: up to two axes, each over its own mesh axis. */
typedef struct config {
    const char *devices, *mesh;
    int nsplit;
    char axis[2][RG_NAME];
    const char *over[2];
    mw_precision precision;
    mw_recompute recompute; /* the op traced as a region, recomputed in the backward pass */
    char label[96];
} config;

/* The values of one (row, variant): every operand's canonical axes and values, and what the
 * producers need (a contraction's W and U). */
typedef struct setup {
    const cf_row *row;
    const cf_variant *var;
    rg_axes ax[CF_MAX_OPS];
    double *val[CF_MAX_OPS];  /* f32 operands (rounded to f32), canonical order */
    int32_t *ids[CF_MAX_OPS]; /* i32 operands */
    rg_axes wax[CF_MAX_OPS];  /* W: the operand's axes then Src */
    double *w[CF_MAX_OPS], u[CF_MAX_OPS][3];
    double *gemm_val[CF_MAX_OPS]; /* sum over Src of W * U, the operand the contraction makes */
    int nperm[CF_MAX_OPS];
    int perm[CF_MAX_OPS][MAX_LAYOUTS][RG_MAX_RANK]; /* legal orders, identity first */
    /* The reference for each producer vector (k % NSRC): the output's axes and value, R, and the
     * gradient of every operand (the leaf the op reads). */
    rg_axes out_ax;
    double *r; /* the loss weights, over out_ax */
    double *ref_out[NSRC], *ref_grad[NSRC][CF_MAX_OPS];
    int have_ref[NSRC];
} setup;

/* Operand i's producer in layout k: every operand the parameter itself in layouts 0, 3, 6, ...;
 * in the others each a different one. k % NSRC alone decides, so NSRC references serve all. */
static int layout_src(const setup *s, int k, int i) {
    if (s->row->op[i].kind != CF_PARAM || (s->row->flags & CF_NO_SOURCES) || k % NSRC == 0)
        return SRC_PARAM;
    return (k + i) % NSRC;
}

static const int *layout_perm(const setup *s, int k, int i) {
    return s->perm[i][((int64_t)k * (2 * i + 1)) % s->nperm[i]];
}

static int nlayouts(const setup *s) {
    int n = 1;
    for (int i = 0; i < s->row->nops; i++)
        if (s->nperm[i] > n) n = s->nperm[i];
    if (!(s->row->flags & CF_NO_SOURCES) && n < NSRC * 2) n = NSRC * 2;
    if (n > MAX_LAYOUTS) n = MAX_LAYOUTS;
    return quick && n > QUICK_LAYOUTS ? QUICK_LAYOUTS : n;
}

/* Every permutation of rank axes that `rule` allows, identity first, then the reversal. */
static void legal_orders(setup *s, int i) {
    const cf_operand *o = &s->row->op[i];
    const rg_axes *ax = &s->ax[i];
    int n = ax->rank, p[RG_MAX_RANK] = {0}, c[RG_MAX_RANK] = {0}, cnt = 0;
    for (int k = 0; k < n; k++) p[k] = k;
    /* Heap's algorithm over all n! orders; keep the legal ones. */
    int all[720][RG_MAX_RANK], nall = 0;
    memcpy(all[nall++], p, sizeof p);
    for (int k = 1; k < n && nall < 720;) {
        if (c[k] < k) {
            int j = k % 2 ? c[k] : 0, t = p[j];
            p[j] = p[k], p[k] = t;
            memcpy(all[nall++], p, sizeof p);
            c[k]++, k = 1;
        } else {
            c[k] = 0, k++;
        }
    }
    /* The reversal right after the identity. */
    for (int a = 2; a < nall; a++) {
        int rev = 1;
        for (int k = 0; k < n; k++) rev &= all[a][k] == n - 1 - k;
        if (rev) {
            int t[RG_MAX_RANK];
            memcpy(t, all[1], sizeof t);
            memcpy(all[1], all[a], sizeof t);
            memcpy(all[a], t, sizeof t);
        }
    }
    for (int a = 0; a < nall && cnt < MAX_LAYOUTS; a++) {
        const int *q = all[a];
        int ok = 1;
        if (o->order == CF_FIXED) {
            for (int k = 0; k < n; k++) ok &= q[k] == k;
        } else if (o->order == CF_LAST || o->order == CF_FIRST) {
            int j = rg_find(ax, o->pin);
            ok = j >= 0 && q[o->order == CF_LAST ? n - 1 : 0] == j;
        } else if (o->order == CF_TAIL) {
            char nm[RG_NAME];
            int m = 0;
            while (list_item(o->pin, m, nm, sizeof nm)) m++;
            for (int t = 0; t < m; t++) {
                list_item(o->pin, t, nm, sizeof nm);
                ok &= q[n - m + t] == rg_find(ax, nm);
            }
        } else if (o->order == CF_LAST_BUT) {
            char a[RG_NAME], b[RG_NAME];
            list_item(o->pin, 0, a, sizeof a);
            list_item(o->pin, 1, b, sizeof b);
            int last = q[n - 1] == rg_find(ax, b) ? q[n - 2] : q[n - 1];
            ok = last == rg_find(ax, a);
        } else if (o->order == CF_LIKE) {
            ok = a == 0; /* derived from the other operand in case_orders */
        }
        if (ok) memcpy(s->perm[i][cnt++], q, sizeof s->perm[i][0]);
    }
    s->nperm[i] = cnt;
}

/* Operand i's axis order in layout k (CF_LIKE follows its model operand). */
static rg_axes case_axes(const setup *s, int k, int i) {
    const cf_operand *o = &s->row->op[i];
    if (o->order != CF_LIKE) return permuted(&s->ax[i], layout_perm(s, k, i));
    int m = 0;
    while (m < s->row->nops && strcmp(s->row->op[m].name, o->pin)) m++;
    rg_axes model = case_axes(s, k, m), out = {0};
    for (int a = 0; a < model.rank; a++)
        if (rg_find(&s->ax[i], model.name[a]) >= 0) {
            strcpy(out.name[out.rank], model.name[a]);
            out.size[out.rank++] = model.size[a];
        }
    return out;
}

static void make_values(setup *s) {
    const cf_row *row = s->row;
    rng_state = hash_str(row->name, hash_str(s->var->sizes, 1469598103934665603ull));
    for (int i = 0; i < row->nops; i++) {
        const cf_operand *o = &row->op[i];
        if (rg_parse_axes(o->axes, s->var->sizes, &s->ax[i])) {
            fprintf(stderr, "conformance: row %s: operand %s: axes '%s' without sizes in '%s'\n",
                    row->name, o->name, o->axes, s->var->sizes);
            exit(2);
        }
        int64_t n = rg_axes_numel(&s->ax[i]);
        if (o->kind == CF_IDS) {
            s->ids[i] = xcalloc((size_t)n, sizeof(int32_t));
            for (int64_t e = 0; e < n; e++)
                s->ids[i][e] = (int32_t)(o->lo + floor(rng_unit() * (o->hi - o->lo)));
        } else {
            s->val[i] = xcalloc((size_t)n, sizeof(double));
            for (int64_t e = 0; e < n; e++) {
                double u =
                    o->distinct ? ((double)((e * 7919 + 13) % n) + 0.5) / (double)n : rng_unit();
                double v = o->lo + u * (o->hi - o->lo);
                if (o->away > 0 && fabs(v) < o->away) v = v < 0 ? -o->away - fabs(v) : o->away + v;
                if (o->grid > 0) v = o->grid * floor(v / o->grid);
                s->val[i][e] = o->kind == CF_STATE ? 0.0 : (double)(float)v;
            }
        }
        legal_orders(s, i);
        if (o->kind != CF_PARAM) continue;
        /* The contraction producing it: W [axes..., Src=3] . U [Src], with U away from 0. */
        s->wax[i] = s->ax[i];
        strcpy(s->wax[i].name[s->wax[i].rank], "Src");
        s->wax[i].size[s->wax[i].rank++] = 3;
        s->w[i] = xcalloc((size_t)n * 3, sizeof(double));
        s->gemm_val[i] = xcalloc((size_t)n, sizeof(double));
        for (int j = 0; j < 3; j++)
            s->u[i][j] = (double)(float)(0.5 + 0.4 * rng_unit()) * (j == 1 ? -1 : 1);
        for (int64_t e = 0; e < n; e++) {
            /* The first term carries the operand's value, the others small: so the computed
             * operand keeps the value constraints (away from 0, distinct) of the row. */
            double w1 = (double)(float)(0.05 * (rng_unit() - 0.5)),
                   w2 = (double)(float)(0.05 * (rng_unit() - 0.5));
            double rest = w1 * s->u[i][1] + w2 * s->u[i][2];
            double w0 = (double)(float)((s->val[i][e] - rest) / s->u[i][0]);
            s->w[i][e * 3] = w0, s->w[i][e * 3 + 1] = w1, s->w[i][e * 3 + 2] = w2;
            s->gemm_val[i][e] = w0 * s->u[i][0] + rest;
        }
    }
}

/* The operand values the op reads under producer vector src. */
static const double *operand_value(const setup *s, int src, int i) {
    int k = src; /* layout k with k % NSRC == src has these producers */
    return layout_src(s, k, i) == SRC_GEMM ? s->gemm_val[i] : s->val[i];
}

/* Builds the reference with the operands' values (operand i's replaced by over[i] where over is
 * given and over[i] is not NULL). */
static int build_ref(const setup *s, int src, rg_graph *r, int *leaf, const double *const *over) {
    for (int i = 0; i < s->row->nops; i++) {
        if (s->row->op[i].kind == CF_IDS)
            leaf[i] = rg_ids(r, &s->ax[i], s->ids[i]);
        else
            leaf[i] = rg_leaf(r, &s->ax[i], over && over[i] ? over[i] : operand_value(s, src, i));
    }
    return s->row->ref(r, leaf, s->var);
}

static double loss_of(rg_graph *r, int out, const setup *s) {
    double l = 0, *v = rg_value(r, out);
    for (int64_t e = 0; e < rg_numel(r, out); e++) l += v[e] * s->r[e];
    return l;
}

/* The reference of producer vector src, and a finite-difference check of its gradients. Returns
 * the number of failed checks. */
static int make_ref(setup *s, int src) {
    if (s->have_ref[src]) return 0;
    const cf_row *row = s->row;
    rg_graph *r = rg_new();
    int leaf[CF_MAX_OPS];
    int out = build_ref(s, src, r, leaf, NULL);
    if (!s->r) {
        s->out_ax = *rg_axes_of(r, out);
        int64_t n = rg_axes_numel(&s->out_ax);
        s->r = xcalloc((size_t)n, sizeof(double));
        for (int64_t e = 0; e < n; e++) s->r[e] = (double)(float)(2.0 * rng_unit() - 1.0);
    }
    int64_t nout = rg_numel(r, out);
    s->ref_out[src] = xcalloc((size_t)nout, sizeof(double));
    memcpy(s->ref_out[src], rg_value(r, out), (size_t)nout * sizeof(double));
    rg_backward(r, out, s->r);
    int fails = 0;
    for (int i = 0; i < row->nops; i++) {
        int64_t n = rg_axes_numel(&s->ax[i]);
        s->ref_grad[src][i] = xcalloc((size_t)n, sizeof(double));
        if (row->op[i].kind != CF_PARAM) continue;
        memcpy(s->ref_grad[src][i], rg_grad(r, leaf[i]), (size_t)n * sizeof(double));
    }
    rg_free(r);
    s->have_ref[src] = 1;
    if (row->flags & (CF_NO_GRAD | CF_TIES | CF_DROPOUT | CF_INFER | CF_NO_FD)) return 0;
    /* Central differences of the reference's loss on a sample of each operand's elements. */
    for (int i = 0; i < row->nops; i++) {
        if (row->op[i].kind != CF_PARAM) continue;
        int64_t n = rg_axes_numel(&s->ax[i]);
        double *x = xcalloc((size_t)n, sizeof(double)), big = 0;
        memcpy(x, operand_value(s, src, i), (size_t)n * sizeof(double));
        for (int64_t e = 0; e < n; e++) big = fmax(big, fabs(s->ref_grad[src][i][e]));
        for (int t = 0; t < FD_SAMPLES && t < n; t++) {
            int64_t e = (int64_t)(((uint64_t)t * 2654435761u) % (uint64_t)n);
            double x0 = x[e], h = 1e-5 * fmax(1.0, fabs(x0)), l[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                x[e] = x0 + (sgn ? -h : h);
                rg_graph *q = rg_new();
                int lq[CF_MAX_OPS];
                const double *over[CF_MAX_OPS] = {0};
                over[i] = x;
                l[sgn] = loss_of(q, build_ref(s, src, q, lq, over), s);
                rg_free(q);
            }
            x[e] = x0;
            double fd = (l[0] - l[1]) / (2 * h), an = s->ref_grad[src][i][e];
            if (fabs(fd - an) > 1e-6 * fmax(big, 1e-3)) {
                printf("FAIL %s [%s]: the reference's gradient of %s[%lld] is %.10g, finite "
                       "differences give %.10g\n",
                       row->name, s->var->sizes, row->op[i].name, (long long)e, an, fd);
                fails++;
            }
        }
        free(x);
    }
    return fails;
}

static void free_setup(setup *s) {
    for (int i = 0; i < CF_MAX_OPS; i++) {
        free(s->val[i]);
        free(s->ids[i]);
        free(s->w[i]);
        free(s->gemm_val[i]);
        for (int k = 0; k < NSRC; k++) free(s->ref_grad[k][i]);
    }
    for (int k = 0; k < NSRC; k++) free(s->ref_out[k]);
    free(s->r);
}

/* What a case computed, in the reference's canonical orders. */
typedef struct outcome {
    int ran;
    double *out;
    double *grad[CF_MAX_OPS]; /* of the op's operands (W's for a contraction producer: its value
                                 compared is the operand's gradient, see case_grad) */
} outcome;

static void free_outcome(outcome *o) {
    free(o->out);
    for (int i = 0; i < CF_MAX_OPS; i++) free(o->grad[i]);
    memset(o, 0, sizeof *o);
}

/* The tensors of the case's graph and what to feed them. */
typedef struct built {
    mw_graph *g;
    mw_tensor *out, *loss;
    mw_feed feeds[2 * CF_MAX_OPS + 2];
    int nfeeds;
    void *owned[4 * CF_MAX_OPS + 4]; /* feeds' data and names, freed with the case */
    int nowned;
    rg_axes out_mw;           /* out's axes as the graph made them */
    rg_axes pax[CF_MAX_OPS];  /* each parameter's declared axes (W's for a contraction) */
    double *pval[CF_MAX_OPS]; /* its values in that order */
} built;

static void *own(built *b, void *p) {
    b->owned[b->nowned++] = p;
    return p;
}

static void free_built(built *b) {
    for (int f = 0; f < b->nowned; f++) free(b->owned[f]);
    for (int i = 0; i < CF_MAX_OPS; i++) free(b->pval[i]);
    mw_graph_free(b->g);
    memset(b, 0, sizeof *b);
}

static const char *split_over(const config *c, const char *axis) {
    for (int k = 0; k < c->nsplit; k++)
        if (!strcmp(c->axis[k], axis)) return c->over[k];
    return NULL;
}

/* x with every axis the configuration splits that it has split. */
static mw_tensor *shard_all(mw_graph *g, mw_tensor *x, const rg_axes *ax, const config *c) {
    for (int a = 0; a < ax->rank; a++) {
        const char *m = split_over(c, ax->name[a]);
        if (m) x = mw_shard(g, x, ax->name[a], m);
    }
    return x;
}

static void add_feed(built *b, const char *name, void *data, int64_t count) {
    b->feeds[b->nfeeds++] = (mw_feed){own(b, strdup(name)), own(b, data), count};
}

static float *to_floats(const double *v, int64_t n) {
    float *f = xcalloc((size_t)n, sizeof *f);
    for (int64_t e = 0; e < n; e++) f[e] = (float)v[e];
    return f;
}

/* W's axes in layout k: the operand's order, then Src (first in odd layouts). */
static rg_axes w_axes(const rg_axes *ax, int k) {
    rg_axes w = *ax;
    int at = k % 2 ? 0 : ax->rank;
    for (int a = ax->rank; a > at; a--) {
        strcpy(w.name[a], w.name[a - 1]);
        w.size[a] = w.size[a - 1];
    }
    strcpy(w.name[at], "Src");
    w.size[at] = 3;
    w.rank = ax->rank + 1;
    return w;
}

/* The case's graph: operands in layout k's orders and producers, split as c says, the op, and
 * the loss sum(out * R). Returns the graph's status. */
static mw_status build_case(const setup *s, int k, const config *c, built *b) {
    const cf_row *row = s->row;
    memset(b, 0, sizeof *b);
    if (mw_graph_new(&b->g) != MW_OK) return MW_ERR_NOMEM;
    mw_graph *g = b->g;
    mw_tensor *x[CF_MAX_OPS] = {0};
    for (int i = 0; i < row->nops; i++) {
        const cf_operand *o = &row->op[i];
        rg_axes ax = case_axes(s, k, i);
        int64_t n = rg_axes_numel(&ax);
        if (o->kind == CF_IDS) {
            int32_t *ids = xcalloc((size_t)n, sizeof *ids);
            reorder_ids(&s->ax[i], s->ids[i], &ax, ids);
            x[i] = shard_all(g, mw_input(g, o->name, MW_I32, mw_axes_of(&ax)), &ax, c);
            add_feed(b, o->name, ids, n);
        } else if (o->kind == CF_STATE) {
            x[i] = shard_all(g, mw_state(g, o->name, mw_axes_of(&ax)), &ax, c);
        } else if (o->kind == CF_MASK) {
            double *v = xcalloc((size_t)n, sizeof *v);
            reorder(&s->ax[i], s->val[i], &ax, v);
            x[i] = shard_all(g, mw_input(g, o->name, MW_F32, mw_axes_of(&ax)), &ax, c);
            add_feed(b, o->name, to_floats(v, n), n);
            free(v);
        } else if (layout_src(s, k, i) == SRC_GEMM) {
            rg_axes wax = w_axes(&ax, k);
            b->pax[i] = wax;
            b->pval[i] = xcalloc((size_t)n * 3, sizeof(double));
            reorder(&s->wax[i], s->w[i], &wax, b->pval[i]);
            mw_tensor *w =
                shard_all(g, mw_param(g, o->name, mw_axes_of(&wax), MW_INIT_ZEROS), &wax, c);
            char nm[64], order[RG_MAX_RANK * (RG_NAME + 1)];
            snprintf(nm, sizeof nm, "%s.u", o->name);
            float *uf = xcalloc(3, sizeof *uf);
            for (int j = 0; j < 3; j++) uf[j] = (float)s->u[i][j];
            add_feed(b, nm, uf, 3);
            axes_list(&ax, order, sizeof order);
            x[i] = mw_contract(g, w, mw_input(g, nm, MW_F32, MW_AXES({"Src", 3})), order);
        } else {
            int scaled = layout_src(s, k, i) == SRC_SCALE;
            b->pax[i] = ax;
            b->pval[i] = xcalloc((size_t)n, sizeof(double));
            reorder(&s->ax[i], s->val[i], &ax, b->pval[i]);
            for (int64_t e = 0; scaled && e < n; e++) b->pval[i][e] *= 2.0;
            mw_tensor *p =
                shard_all(g, mw_param(g, o->name, mw_axes_of(&ax), MW_INIT_ZEROS), &ax, c);
            x[i] = scaled ? mw_scale(g, p, 0.5f) : p;
        }
    }
    if (mw_graph_status(g)) return mw_graph_status(g);
    mw_region_begin(g, row->name);
    b->out = row->build(g, x, s->var);
    mw_region_end(g);
    if (mw_graph_status(g)) return mw_graph_status(g);
    /* R over out's axes, split as out is. */
    mw_axes rax = {.rank = mw_tensor_rank(b->out)};
    const char *mesh_of[RG_MAX_RANK];
    b->out_mw.rank = rax.rank;
    for (int a = 0; a < rax.rank; a++) {
        const char *name;
        int64_t size;
        mw_tensor_axis(b->out, a, &name, &size, &mesh_of[a]);
        snprintf(b->out_mw.name[a], RG_NAME, "%s", name);
        b->out_mw.size[a] = size;
        rax.axis[a] = (mw_axis){b->out_mw.name[a], size};
    }
    if (row->flags & CF_INFER) return MW_OK;
    mw_tensor *r = mw_input(g, "R", MW_F32, rax);
    for (int a = 0; a < rax.rank; a++)
        if (mesh_of[a]) r = mw_shard(g, r, b->out_mw.name[a], mesh_of[a]);
    int64_t nr = rg_axes_numel(&b->out_mw);
    double *rv = xcalloc((size_t)nr, sizeof *rv);
    reorder(&s->out_ax, s->r, &b->out_mw, rv);
    add_feed(b, "R", to_floats(rv, nr), nr);
    free(rv);
    b->loss = mw_sum(g, mw_mul(g, b->out, r), NULL);
    return mw_graph_status(g);
}

/* --- running and judging a case --------------------------------------------------------------- */

/* Counts of one row. */
typedef struct tally {
    int cases, passed, failed, refused, skipped, reported;
    double worst[2]; /* the largest error / tolerance, f32 and bf16 */
} tally;

static void fail(tally *t, const char *fmt, ...) {
    t->failed++;
    if (t->reported++ >= MAX_REPORT && !verbose) return;
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

static double tolerance(const cf_row *row, const setup *s, mw_precision p) {
    double k = 1;
    char nm[RG_NAME];
    for (int i = 0; list_item(row->reduce, i, nm, sizeof nm); i++) {
        for (int o = 0; o < row->nops; o++) {
            int a = rg_find(&s->ax[o], nm);
            if (a >= 0) {
                k *= (double)s->ax[o].size[a];
                break;
            }
        }
    }
    double amp = row->amp > 0 ? row->amp : 1;
    return p == MW_PRECISION_BF16 ? 0x1p-8 * 4 * amp : 0x1p-24 * (16 + 2 * sqrt(k)) * amp;
}

/* max |got - want| / max |want| (0 when both are 0), and whether every got is finite. */
static double rel_error(const double *got, const double *want, int64_t n, int *finite) {
    double big = 0, err = 0;
    *finite = 1;
    for (int64_t e = 0; e < n; e++) {
        big = fmax(big, fabs(want[e]));
        if (!isfinite(got[e])) *finite = 0;
        err = fmax(err, fabs(got[e] - want[e]));
    }
    return big > 0 ? err / big : err > 0 ? INFINITY : 0;
}

/* Reads the case's output and gradients into canonical orders. */
static mw_status read_results(const setup *s, int k, built *b, mw_trainer *tr, mw_infer *inf,
                              outcome *o) {
    int64_t nout = rg_axes_numel(&b->out_mw);
    float *f = xcalloc((size_t)nout, sizeof *f);
    mw_status st;
    if (inf) {
        mw_fetch fetch = {b->out, f, nout};
        st = mw_infer_run(inf, b->feeds, b->nfeeds, 1, &fetch, 1);
    } else {
        st = mw_trainer_read_output(tr, b->out, f, nout);
    }
    if (st) {
        free(f);
        return st;
    }
    double *d = xcalloc((size_t)nout, sizeof *d);
    for (int64_t e = 0; e < nout; e++) d[e] = f[e];
    o->out = xcalloc((size_t)nout, sizeof(double));
    reorder(&b->out_mw, d, &s->out_ax, o->out);
    free(f);
    free(d);
    for (int i = 0; i < s->row->nops && tr; i++) {
        if (s->row->op[i].kind != CF_PARAM) continue;
        int64_t n = rg_axes_numel(&b->pax[i]);
        float *gf = xcalloc((size_t)n, sizeof *gf);
        st = mw_trainer_read_grad(tr, s->row->op[i].name, gf, n);
        if (st) {
            free(gf);
            return st;
        }
        double *gd = xcalloc((size_t)n, sizeof *gd);
        for (int64_t e = 0; e < n; e++) gd[e] = gf[e];
        free(gf);
        int src = layout_src(s, k, i);
        const rg_axes *canon = src == SRC_GEMM ? &s->wax[i] : &s->ax[i];
        o->grad[i] = xcalloc((size_t)n, sizeof(double));
        reorder(&b->pax[i], gd, canon, o->grad[i]);
        free(gd);
    }
    return MW_OK;
}

/* The reference gradient of what the case's parameter i is (canonical order): the operand's own,
 * half of it for a scaled producer (x = p / 2), and dW = dx U for a contraction. */
static double *ref_param_grad(const setup *s, int k, int i, int64_t *n) {
    int src = layout_src(s, k, i);
    const double *gx = s->ref_grad[k % NSRC][i];
    int64_t m = rg_axes_numel(&s->ax[i]);
    *n = src == SRC_GEMM ? 3 * m : m;
    double *g = xcalloc((size_t)*n, sizeof *g);
    for (int64_t e = 0; e < m; e++) {
        if (src == SRC_GEMM)
            for (int j = 0; j < 3; j++) g[e * 3 + j] = gx[e] * s->u[i][j];
        else
            g[e] = src == SRC_SCALE ? 0.5 * gx[e] : gx[e];
    }
    return g;
}

/* The dropout row's own check: every output is x kept and scaled by 1 / (1 - p), or 0; the
 * gradient is R through the same mask; about 1 - p of the elements are kept. */
static void check_dropout(const setup *s, int k, const config *c, const outcome *o,
                          const char *what, tally *t) {
    const double p = s->var->f[0], keep = 1.0 / (1.0 - p);
    /* x itself is rounded where a bf16 contraction makes it */
    const double tol = c->precision == MW_PRECISION_BF16 ? 2e-2 : 1e-5;
    int64_t n = rg_axes_numel(&s->ax[0]), kept = 0;
    const double *x = operand_value(s, k % NSRC, 0);
    for (int64_t e = 0; e < n; e++) {
        double want = x[e] * keep, got = o->out[e];
        int on = fabs(got - want) <= tol * fabs(want) + 1e-30, off = got == 0.0;
        if (!on && !off) {
            fail(t, "%s: out[%lld] = %.9g is neither 0 nor x / (1 - p) = %.9g", what, (long long)e,
                 got, want);
            return;
        }
        kept += on;
        int src = layout_src(s, k, 0);
        double gx = on ? s->r[e] * keep : 0.0;
        double gw = src == SRC_GEMM ? o->grad[0][e * 3] : o->grad[0][e];
        double wgw = src == SRC_GEMM ? gx * s->u[0][0] : src == SRC_SCALE ? 0.5 * gx : gx;
        if (fabs(gw - wgw) > tol * fabs(wgw) + 1e-6) {
            fail(t, "%s: the gradient at %lld is %.9g, the mask gives %.9g", what, (long long)e, gw,
                 wgw);
            return;
        }
    }
    double mean = (1 - p) * (double)n, sd = sqrt((double)n * p * (1 - p));
    if (fabs((double)kept - mean) > 6 * sd + 1)
        fail(t, "%s: %lld of %lld kept, expected about %.0f", what, (long long)kept, (long long)n,
             mean);
}

/* Compares a case's outcome with the reference (and with the f32 run of the same case and the
 * first f32 layout of its producers, where given). */
static void judge(const setup *s, int k, const config *c, const outcome *o, const outcome *f32,
                  const outcome *first, const char *what, tally *t) {
    const cf_row *row = s->row;
    if (row->flags & CF_DROPOUT) {
        check_dropout(s, k, c, o, what, t);
        return;
    }
    double tol = tolerance(row, s, c->precision);
    int bf = c->precision == MW_PRECISION_BF16, finite;
    int64_t nout = rg_axes_numel(&s->out_ax);
    const double *want = s->ref_out[k % NSRC];
    double e = rel_error(o->out, want, nout, &finite);
    if ((row->flags & CF_EXACT) && !bf) tol = 0;
    if (!finite || e > tol) {
        fail(t,
             "%s: output differs from the reference by %.3g of its largest element (tolerance "
             "%.3g)%s",
             what, e, tol, finite ? "" : "; not finite");
        return;
    }
    if (tol > 0) t->worst[bf] = fmax(t->worst[bf], e / tol);
    if (bf && f32 && f32->ran) {
        double d = rel_error(o->out, f32->out, nout, &finite);
        if (d > 3e-2) fail(t, "%s: output in bf16 differs from f32 by %.3g (3e-2)", what, d);
    }
    if (!bf && first && first->ran && first != o) {
        double d = rel_error(o->out, first->out, nout, &finite);
        if (d > 1e-5) fail(t, "%s: output differs from the first layout's by %.3g (1e-5)", what, d);
    }
    if (row->flags & (CF_NO_GRAD | CF_INFER)) return;
    for (int i = 0; i < row->nops; i++) {
        if (row->op[i].kind != CF_PARAM) continue;
        int64_t n;
        double *wg = ref_param_grad(s, k, i, &n);
        e = rel_error(o->grad[i], wg, n, &finite);
        free(wg);
        if (!finite || e > tol) {
            fail(t,
                 "%s: gradient of %s differs from the reference by %.3g of its largest "
                 "element (tolerance %.3g)%s",
                 what, row->op[i].name, e, tol, finite ? "" : "; not finite");
            return;
        }
        if (tol > 0) t->worst[bf] = fmax(t->worst[bf], e / tol);
        if (bf && f32 && f32->ran && rel_error(o->grad[i], f32->grad[i], n, &finite) > 3e-2)
            fail(t, "%s: gradient of %s in bf16 differs from f32 by %.3g (3e-2)", what,
                 row->op[i].name, rel_error(o->grad[i], f32->grad[i], n, &finite));
        if (!bf && first && first->ran && first != o &&
            rel_error(o->grad[i], first->grad[i], n, &finite) > 1e-5)
            fail(t, "%s: gradient of %s differs from the first layout's by %.3g (1e-5)", what,
                 row->op[i].name, rel_error(o->grad[i], first->grad[i], n, &finite));
    }
}

/* Whether the op must refuse configuration c: it splits an axis the row refuses split, or one it
 * needs whole that a computed operand (or a fed one) holds. */
static int refusal_expected(const setup *s, int k, const config *c, char *axis, size_t size) {
    const cf_row *row = s->row;
    for (int j = 0; j < c->nsplit; j++) {
        if (in_list(row->refuse, c->axis[j])) {
            snprintf(axis, size, "%s", c->axis[j]);
            return 1;
        }
        if (!in_list(row->whole, c->axis[j])) continue;
        for (int i = 0; i < row->nops; i++)
            if (rg_find(&s->ax[i], c->axis[j]) >= 0 &&
                (row->op[i].kind != CF_PARAM || layout_src(s, k, i) != SRC_PARAM)) {
                snprintf(axis, size, "%s", c->axis[j]);
                return 1;
            }
    }
    return 0;
}

/* Runs case (s, layout k, c): 1 when it ran (o filled), 0 when refused as expected or failed. */
static int run_case(const setup *s, int k, const config *c, outcome *o, tally *t,
                    const char *what) {
    const cf_row *row = s->row;
    built b;
    char axis[RG_NAME];
    int refuse = refusal_expected(s, k, c, axis, sizeof axis);
    mw_status st = build_case(s, k, c, &b);
    t->cases++;
    if (refuse || st == MW_ERR_SHARDING) {
        const char *msg = b.g ? mw_graph_error(b.g) : "";
        if (refuse && st == MW_ERR_SHARDING && strstr(msg, axis)) {
            t->refused++;
        } else if (refuse) {
            fail(t,
                 "%s: splitting %s should be refused with MW_ERR_SHARDING naming it; got %s "
                 "(%s)",
                 what, axis, mw_strerror(st), st ? msg : "it ran");
        } else {
            fail(t, "%s: refused: %s", what, msg);
        }
        free_built(&b);
        return 0;
    }
    if (st) {
        fail(t, "%s: the graph failed: %s", what, mw_graph_error(b.g));
        free_built(&b);
        return 0;
    }
    mw_mesh *mesh = NULL;
    mw_trainer *tr = NULL;
    mw_infer *inf = NULL;
    st = mw_mesh_new(c->devices, c->mesh, &mesh);
    if (!st && (row->flags & CF_INFER)) {
        mw_infer_config ic = {
            .outputs = &b.out, .noutputs = 1, .chunk_axis = "Chunk", .precision = c->precision};
        st = mw_infer_new(b.g, mesh, &ic, &inf);
    } else if (!st) {
        mw_trainer_config tc = {.optimizer = {MW_SGD, .lr = 0.0f},
                                .precision = c->precision,
                                .recompute = c->recompute,
                                .outputs = &b.out,
                                .noutputs = 1};
        st = mw_trainer_new(b.g, b.loss, mesh, &tc, &tr);
    }
    for (int i = 0; !st && i < row->nops; i++) {
        if (row->op[i].kind != CF_PARAM) continue;
        int64_t n = rg_axes_numel(&b.pax[i]);
        float *v = to_floats(b.pval[i], n);
        st = inf ? mw_infer_write_param(inf, row->op[i].name, v, n)
                 : mw_trainer_write_param(tr, row->op[i].name, v, n);
        free(v);
    }
    if (!st && tr) {
        float loss;
        st = mw_trainer_compute_grads(tr, b.feeds, b.nfeeds, &loss);
    }
    if (!st) {
        const mw__program *prog = tr ? tr->prog : mw__infer_program(inf);
        note_program(prog);
        char kb[1024];
        if (tr && mw_trainer_kernels(tr, kb, sizeof kb) == MW_OK) note_kernels(kb);
        st = read_results(s, k, &b, tr, inf, o);
    }
    if (st) fail(t, "%s: %s: %s", what, mw_strerror(st), mw_last_error());
    mw_trainer_free(tr);
    mw_infer_free(inf);
    mw_mesh_free(mesh);
    free_built(&b);
    if (st) return 0;
    o->ran = 1;
    return 1;
}

/* --- the sweep ---------------------------------------------------------------------------------
 */

/* The meshes a row runs on: cpu:1, then each split axis on 2 devices; in the full sweep also the
 * first split axis on 3 (uneven shards) and the first two on a 2 x 2 mesh. */
static int make_configs(const setup *s, config *out, int cap) {
    const cf_row *row = s->row;
    const char *one = use_cuda ? "cuda:0" : "cpu:1", *two = use_cuda ? "cuda:0x2" : "cpu:2";
    int n = 0;
    out[n++] = (config){.devices = one, .mesh = "X"};
    char ax[RG_NAME], splits[8][RG_NAME];
    int ns = 0;
    for (int i = 0; list_item(row->split, i, ax, sizeof ax) && ns < 8; i++) {
        /* an axis some operand has, with at least 2 rows */
        int64_t size = 0;
        for (int o = 0; o < row->nops; o++) {
            int a = rg_find(&s->ax[o], ax);
            if (a >= 0) size = s->ax[o].size[a];
        }
        if (size >= 2) strcpy(splits[ns++], ax);
    }
    for (int i = 0; i < ns && n < cap; i++) {
        if (quick && i > 0) break;
        config c = {.devices = two, .mesh = "X", .nsplit = 1, .over = {"X"}};
        strcpy(c.axis[0], splits[i]);
        out[n++] = c;
    }
    if (!quick && ns > 0 && n < cap && !use_cuda) {
        int64_t size = 0;
        for (int o = 0; o < row->nops; o++) {
            int a = rg_find(&s->ax[o], splits[0]);
            if (a >= 0) size = s->ax[o].size[a];
        }
        if (size >= 3) {
            config c = {.devices = "cpu:3", .mesh = "X", .nsplit = 1, .over = {"X"}};
            strcpy(c.axis[0], splits[0]);
            out[n++] = c;
        }
    }
    if (!quick && ns > 1 && n < cap) {
        config c = {.devices = use_cuda ? "cuda:0x4" : "cpu:4",
                    .mesh = "X=2,Y=2",
                    .nsplit = 2,
                    .over = {"X", "Y"}};
        strcpy(c.axis[0], splits[0]);
        strcpy(c.axis[1], splits[1]);
        out[n++] = c;
    }
    /* The full sweep recomputes the op's activations on one and two devices (everything but
     * contractions, and everything). */
    if (!quick && !(row->flags & CF_INFER) && n + 2 <= cap) {
        out[n] = out[0], out[n++].recompute = MW_RECOMPUTE_BLOCKS;
        if (n > 2) out[n] = out[1], out[n++].recompute = MW_RECOMPUTE_DOTS;
    }
    for (int i = 0; i < n; i++) {
        config *c = &out[i];
        int at = snprintf(c->label, sizeof c->label, "%s", c->devices);
        for (int j = 0; j < c->nsplit; j++)
            at += snprintf(c->label + at, sizeof c->label - (size_t)at, "%s%s@%s", j ? "," : " ",
                           c->axis[j], c->over[j]);
        if (c->recompute)
            snprintf(c->label + at, sizeof c->label - (size_t)at, ", recomputing %s",
                     c->recompute == MW_RECOMPUTE_DOTS ? "all but contractions" : "all");
    }
    return n;
}

static void describe_layout(const setup *s, int k, char *buf, size_t size) {
    size_t at = 0;
    for (int i = 0; i < s->row->nops && at < size; i++) {
        rg_axes ax = case_axes(s, k, i);
        char order[RG_MAX_RANK * (RG_NAME + 1)];
        axes_list(&ax, order, sizeof order);
        at +=
            (size_t)snprintf(buf + at, size - at, "%s%s[%s]%s%s", i ? " " : "", s->row->op[i].name,
                             order, s->row->op[i].kind == CF_PARAM ? "<-" : "",
                             s->row->op[i].kind == CF_PARAM ? src_name[layout_src(s, k, i)] : "");
    }
}

/* Position of element e along axis a of ax (row-major, the last axis fastest). */
static int64_t coord_of(const rg_axes *ax, int64_t e, int a) {
    int64_t stride = 1;
    for (int b = ax->rank - 1; b > a; b--) stride *= ax->size[b];
    return (e / stride) % ax->size[a];
}

/* The row's mixing as its float64 reference computes it, against what the library decides from
 * the ops' traits (mw__graph_mixing, which an inference program's chunk check runs): for each
 * axis of the output that an f32 operand holds, the operands' values at position 0 of it are
 * changed and the reference's output read at every other position. Values that move there mean
 * the row mixes positions along that axis; a library that says it does not would let inference
 * chunk along it and change the values, silently: a failure (a new op's missing MW__T_MIX_*
 * trait). Saying it mixes where the values do not move (a slice shifts rows) is only cautious.
 * Inference and random rows are skipped. */
static void check_mixing(setup *s, tally *t) {
    const cf_row *row = s->row;
    if (row->flags & (CF_INFER | CF_DROPOUT)) return;
    config c = {.devices = use_cuda ? "cuda:0" : "cpu:1", .mesh = "X"};
    built b;
    if (build_case(s, 0, &c, &b) != MW_OK || !b.out) {
        free_built(&b);
        return;
    }
    const mw_graph *g = b.g;
    const mw_tensor *node = b.out;
    char *dep = xcalloc((size_t)g->nnodes, 1), *mix = xcalloc((size_t)g->nnodes, 1);
    const char **why = xcalloc((size_t)g->nnodes, sizeof *why);
    /* The reference's output as make_ref computed it for these producers. */
    const rg_axes *oax = &s->out_ax;
    const double *base = s->ref_out[0];
    int64_t nout = rg_axes_numel(oax);
    for (int a = 0; a < oax->rank; a++) {
        int at = -1;
        for (int i = 0; i < node->type.rank; i++)
            if (!strcmp(g->names[node->type.ax[i].name], oax->name[a])) at = i;
        if (oax->size[a] < 2 || at < 0) continue;
        int name = node->type.ax[at].name, holders = 0;
        double *vals[CF_MAX_OPS] = {0};
        memset(dep, 0, (size_t)g->nnodes);
        memset(mix, 0, (size_t)g->nnodes);
        for (int i = 0; i < row->nops; i++) {
            int ia = rg_find(&s->ax[i], oax->name[a]);
            if (row->op[i].kind == CF_IDS || ia < 0) continue;
            int64_t n = rg_axes_numel(&s->ax[i]);
            vals[i] = xcalloc((size_t)n, sizeof(double));
            memcpy(vals[i], operand_value(s, 0, i), (size_t)n * sizeof(double));
            for (int64_t e = 0; e < n; e++)
                if (coord_of(&s->ax[i], e, ia) == 0) vals[i][e] += 0.25 + 0.5 * fabs(vals[i][e]);
            holders++;
            for (int j = 0; j < g->nnodes; j++) {
                const mw_tensor *x = g->nodes[j];
                if ((x->op == MW__OP_PARAM || x->op == MW__OP_INPUT) &&
                    !strcmp(x->name, row->op[i].name))
                    dep[j] = 1;
            }
        }
        if (holders) {
            rg_graph *r1 = rg_new();
            int leaf1[CF_MAX_OPS];
            const double *moved =
                rg_value(r1, build_ref(s, 0, r1, leaf1, (const double *const *)vals));
            int mixed = 0;
            for (int64_t e = 0; e < nout && !mixed; e++)
                mixed = coord_of(oax, e, a) != 0 &&
                        fabs(moved[e] - base[e]) > 1e-9 * (1.0 + fabs(base[e]));
            rg_free(r1);
            mw__graph_mixing(g, name, dep, mix, why);
            int says = mix[node->id];
            if (mixed && !says)
                fail(t,
                     "%s [%s]: the output mixes positions along %s (its reference's values at "
                     "other positions move with those at position 0), but the ops' traits "
                     "(MW__T_MIX_*, core/graph_impl.h) do not say so: an inference program "
                     "would chunk along %s and change the values",
                     row->name, s->var->sizes, oax->name[a], oax->name[a]);
            else if (verbose)
                printf("  mixing %s [%s] along %s: reference %s, traits %s%s%s\n", row->name,
                       s->var->sizes, oax->name[a], mixed ? "mixes" : "does not mix",
                       says ? "mix: " : "do not mix", says ? why[node->id] : "", "");
        }
        for (int i = 0; i < row->nops; i++) free(vals[i]);
    }
    free(dep), free(mix), free(why);
    free_built(&b);
}

static int run_row(const cf_row *row, tally *t) {
    memset(row_seen_op, 0, sizeof row_seen_op);
    int nvar = quick && row->nvar > 2 ? 2 : row->nvar;
    for (int v = 0; v < nvar; v++) {
        setup s = {.row = row, .var = &row->var[v]};
        make_values(&s);
        if (make_ref(&s, 0)) t->failed++;
        check_mixing(&s, t);
        config cfg[10];
        int ncfg = make_configs(&s, cfg, 10);
        int nl = nlayouts(&s);
        outcome *firsts = xcalloc((size_t)ncfg * NSRC, sizeof *firsts);
        for (int k = 0; k < nl; k++) {
            if (make_ref(&s, k % NSRC)) t->failed++;
            char layout[512];
            describe_layout(&s, k, layout, sizeof layout);
            for (int ci = 0; ci < ncfg; ci++) {
                /* f32 first: its outcome is the bf16 run's yardstick, and the first f32 layout of
                 * these producers is every later one's. */
                outcome *first = &firsts[ci * NSRC + k % NSRC], f32 = {0};
                const outcome *f32p = NULL;
                for (int p = 0; p < 2; p++) {
                    config c = cfg[ci];
                    c.precision = p ? MW_PRECISION_BF16 : MW_PRECISION_FP32;
                    char what[900];
                    snprintf(what, sizeof what, "%s [%s] %s on %s, %s", row->name, s.var->sizes,
                             layout, c.label, p ? "bf16" : "f32");
                    outcome o = {0};
                    int before = t->failed;
                    if (!run_case(&s, k, &c, &o, t, what)) continue;
                    judge(&s, k, &c, &o, p ? f32p : NULL, p ? NULL : first, what, t);
                    if (t->failed == before) t->passed++;
                    if (verbose) printf("  %s %s\n", t->failed == before ? "ok  " : "FAIL", what);
                    if (p) {
                        free_outcome(&o);
                    } else if (!first->ran) {
                        *first = o;
                        f32p = first;
                    } else {
                        f32 = o;
                        f32p = &f32;
                    }
                }
                free_outcome(&f32);
            }
        }
        for (int i = 0; i < ncfg * NSRC; i++) free_outcome(&firsts[i]);
        free(firsts);
        free_setup(&s);
    }
    /* The ops the row claims must have run in its cases. */
    int bad = 0;
    char nm[40];
    for (int i = 0; list_item(row->covers, i, nm, sizeof nm); i++) {
        int op = 0;
        while (op < MW__OP_COUNT && strcmp(mw__op_name(op), nm)) op++;
        if (op == MW__OP_COUNT) {
            printf("FAIL %s: covers '%s', which is not an op of MW__OPS\n", row->name, nm);
            bad++;
        } else if (!row_seen_op[op] && !quick) {
            printf("FAIL %s: covers '%s', but no case of the row ran it\n", row->name, nm);
            bad++;
        }
    }
    t->failed += bad;
    return t->failed;
}

/* --- the report and the driver -----------------------------------------------------------------
 */

static int coverage(void) {
    int bad = 0;
    for (int op = 0; op < MW__OP_COUNT; op++) {
        int claimed = 0;
        for (int r = 0; r < cf_nrows; r++) claimed |= in_list(cf_rows[r].covers, mw__op_name(op));
        if (!claimed) {
            printf("FAIL coverage: op '%s' of MW__OPS has no row in the conformance table\n",
                   mw__op_name(op));
            bad++;
        } else if (!seen_op[op] && !only_row) {
            printf("FAIL coverage: op '%s' never ran\n", mw__op_name(op));
            bad++;
        }
    }
    if (only_row) return bad;
    for (int k = 0; k < MW__I_COUNT; k++)
        if (!seen_kernel[k]) {
            printf("FAIL coverage: kernel '%s' never ran\n", mw__ins_name(k));
            bad++;
        }
    for (int v = 0; v < V_COUNT && !quick; v++)
        if (!seen_variant[v]) {
            printf("FAIL coverage: the plan never chose %s\n", variant_name[v]);
            bad++;
        }
    return bad;
}

static int run_child(void) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int total = 0, passed = 0, failed = 0, refused = 0;
    for (int r = 0; r < cf_nrows; r++) {
        const cf_row *row = &cf_rows[r];
        if (only_row && strcmp(only_row, row->name)) continue;
        tally t = {0};
        run_row(row, &t);
        printf("%-22s %5d cases %5d passed %4d refused %3d failed   worst f32 %.2f, bf16 %.2f of "
               "tolerance\n",
               row->name, t.cases, t.passed, t.refused, t.failed, t.worst[0], t.worst[1]);
        fflush(stdout);
        total += t.cases, passed += t.passed, failed += t.failed, refused += t.refused;
    }
    failed += coverage();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("kernels that ran:\n");
    for (int i = 0; i < nkernels_seen; i++) printf("  %s\n", kernels_seen[i]);
    printf("%d cases: %d passed, %d refused as documented, %d failed (%.1f s)\n", total, passed,
           refused, failed,
           (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    return failed ? 1 : 0;
}

/* The instruction levels this CPU has, narrowest first (MESHWIT_CPU_ISA's names): the baseline
 * and each wider level the kernels or oneDNN use differently. */
static int cpu_levels(const char **out) {
    static const char *const names[] = {"sse2", "avx2", "avx512", "avx512_bf16", "amx"};
    int n = 0;
    for (int l = MW__ISA_SSE2; l <= (int)mw__isa_of_cpu(); l++) out[n++] = names[l];
    return n;
}

static void cpu_name(char *buf, size_t size) {
    char line[512];
    snprintf(buf, size, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            snprintf(buf, size, "%s", strchr(line, ':') + 2);
            buf[strcspn(buf, "\n")] = '\0';
            break;
        }
    if (f) fclose(f);
}

/* One child per (instruction level, GEMM engine): oneDNN binds its level from its first use in a
 * process, so each gets a process of its own. */
static int run_sweep(char **argv) {
    const char *levels[5];
    int nl = cpu_levels(levels);
    char cpu[256];
    cpu_name(cpu, sizeof cpu);
    printf("conformance: %s, instruction levels:", cpu);
    for (int i = 0; i < nl; i++) printf(" %s", levels[i]);
    printf("\n");
    static const char *const engines[] = {"openblas", "onednn"};
    int failed = 0, runs = 0;
    char summary[16][160];
    for (int l = 0; l < nl; l++)
        for (int e = 0; e < 2; e++) {
            printf("\n== MESHWIT_CPU_ISA=%s MESHWIT_CPU_GEMM=%s\n", levels[l], engines[e]);
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                setenv("MESHWIT_CPU_ISA", levels[l], 1);
                setenv("MESHWIT_CPU_GEMM", engines[e], 1);
                setenv("CONFORMANCE_CHILD", "1", 1);
                /* every rotation the graph allows inside the attention kernels, bf16 too (the
                   default keeps bf16's apart): each attention path runs it */
                setenv("MESHWIT_ROPE", "fused", 1);
                execv("/proc/self/exe", argv);
                _exit(127);
            }
            int status = 0;
            waitpid(pid, &status, 0);
            int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            snprintf(summary[runs++], sizeof summary[0],
                     "MESHWIT_CPU_ISA=%-12s MESHWIT_CPU_GEMM=%-9s %s", levels[l], engines[e],
                     rc == 0    ? "passed"
                     : rc == 77 ? "skipped (not built)"
                                : "FAILED");
            if (rc != 0 && rc != 77) failed++;
        }
    printf("\n== conformance on %s\n", cpu);
    for (int i = 0; i < runs; i++) printf("  %s\n", summary[i]);
    return failed ? 1 : 0;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--verbose"))
            verbose = 1;
        else if (!strcmp(argv[i], "--devices") && i + 1 < argc)
            use_cuda = !strcmp(argv[++i], "cuda");
        else if (!strcmp(argv[i], "--row") && i + 1 < argc)
            only_row = argv[++i];
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc) {
            /* As a Criterion program takes it (scripts/mutants.sh): "ROW" or "ROW/..." (a glob),
             * the quick subset of that row. */
            static char row[64];
            snprintf(row, sizeof row, "%s", argv[++i]);
            row[strcspn(row, "/")] = '\0';
            only_row = row, quick = 1;
        } else if (!strcmp(argv[i], "--jobs") && i + 1 < argc)
            i++; /* Criterion's; the sweep runs its children one at a time */
        else if (!strcmp(argv[i], "--list")) {
            for (int r = 0; r < cf_nrows; r++)
                printf("%-22s %s\n", cf_rows[r].name, cf_rows[r].covers);
            return 0;
        } else {
            fprintf(stderr,
                    "usage: conformance [--quick] [--devices cpu|cuda] [--row NAME] [--verbose] "
                    "[--list] [--filter ROW[/*]] [--jobs N]\n");
            return 2;
        }
    }
    if (use_cuda || getenv("CONFORMANCE_CHILD")) {
        const char *gemm = getenv("MESHWIT_CPU_GEMM");
        if (!use_cuda && gemm && !strcmp(gemm, "onednn")) {
            /* A build without oneDNN refuses the engine: say so and skip. */
            mw_mesh *m;
            mw_graph *g;
            mw_trainer *tr = NULL;
            mw_graph_new(&g);
            mw_tensor *p = mw_param(g, "p", MW_AXES({"A", 2}), MW_INIT_ZEROS);
            mw_mesh_new("cpu:1", "X", &m);
            mw_trainer_config tc = {.optimizer = {MW_SGD, .lr = 0.0f}};
            mw_status st = mw_trainer_new(g, mw_sum(g, p, NULL), m, &tc, &tr);
            mw_trainer_free(tr);
            mw_mesh_free(m);
            mw_graph_free(g);
            if (st == MW_ERR_UNSUPPORTED) {
                printf("skipped: %s\n", mw_last_error());
                return 77;
            }
        }
        return run_child();
    }
    return run_sweep(argv);
}
