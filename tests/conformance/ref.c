/* The float64 reference of the conformance table (see ref.h): every primitive's value and its
 * adjoint, by plain loops over named axes. */
#include "ref.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RG_PI 3.14159265358979323846

enum {
    OP_LEAF,
    OP_IDS,
    OP_CONST,
    OP_ADD,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_SCALE,
    OP_MAP,
    OP_CONTRACT,
    OP_SUM,
    OP_SOFTMAX,
    OP_LAYERNORM,
    OP_EMBED,
    OP_XENT,
    OP_SLICE,
    OP_PAD,
    OP_MAX,
    OP_ARGMAX,
    OP_RESHAPE,
    OP_PERMUTE,
};

typedef struct rnode {
    int op;
    rg_axes ax;
    int64_t n;
    double *v, *g;
    int32_t *ids;
    int in[3], nin;
    double f;
    int fn;
    char a1[RG_NAME], a2[RG_NAME]; /* the axis an op works along; softmax: the query axis */
    int64_t start, len, valid;
} rnode;

/* Nodes are allocated one by one, so a pointer to a node (its axes, its values) stays valid
 * while later nodes are added. */
struct rg_graph {
    rnode **n;
    int count, cap;
};

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "conformance reference: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

static void *alloc(size_t n) {
    void *p = calloc(n ? n : 1, 1);
    if (!p) die("out of memory");
    return p;
}

rg_graph *rg_new(void) { return alloc(sizeof(rg_graph)); }

void rg_free(rg_graph *r) {
    if (!r) return;
    for (int i = 0; i < r->count; i++) {
        free(r->n[i]->v);
        free(r->n[i]->g);
        free(r->n[i]->ids);
        free(r->n[i]);
    }
    free(r->n);
    free(r);
}

int rg_find(const rg_axes *ax, const char *name) {
    for (int i = 0; i < ax->rank; i++)
        if (strcmp(ax->name[i], name) == 0) return i;
    return -1;
}

int64_t rg_axes_numel(const rg_axes *ax) {
    int64_t n = 1;
    for (int i = 0; i < ax->rank; i++) n *= ax->size[i];
    return n;
}

int rg_parse_axes(const char *spec, const char *sizes, rg_axes *out) {
    memset(out, 0, sizeof *out);
    const char *p = spec;
    while (p && *p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0 || len >= RG_NAME || out->rank == RG_MAX_RANK) return -1;
        char *nm = out->name[out->rank];
        memcpy(nm, p, len);
        nm[len] = '\0';
        /* its size: "Name=12" in sizes */
        int64_t size = -1;
        for (const char *s = sizes; s && *s;) {
            const char *se = strchr(s, ',');
            size_t sl = se ? (size_t)(se - s) : strlen(s);
            const char *eq = memchr(s, '=', sl);
            if (eq && (size_t)(eq - s) == len && memcmp(s, nm, len) == 0)
                size = strtoll(eq + 1, NULL, 10);
            s = se ? se + 1 : s + sl;
        }
        if (size < 1) return -1;
        out->size[out->rank++] = size;
        p = e ? e + 1 : p + len;
    }
    return 0;
}

double rg_bf16(double x) {
    float f = (float)x;
    if (f != f) return x;
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t lsb = (u >> 16) & 1u;
    u = (u + 0x7fffu + lsb) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

static int add_node(rg_graph *r, int op, const rg_axes *ax) {
    if (r->count == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->n = realloc(r->n, (size_t)r->cap * sizeof *r->n);
        if (!r->n) die("out of memory");
    }
    rnode *n = r->n[r->count] = calloc(1, sizeof *n);
    if (!n) die("out of memory");
    n->op = op;
    n->ax = *ax;
    n->n = rg_axes_numel(ax);
    n->v = alloc((size_t)n->n * sizeof(double));
    n->g = alloc((size_t)n->n * sizeof(double));
    return r->count++;
}

static rnode *node(rg_graph *r, int i) {
    if (i < 0 || i >= r->count) die("bad node %d", i);
    return r->n[i];
}

const rg_axes *rg_axes_of(const rg_graph *r, int n) { return &r->n[n]->ax; }
int64_t rg_numel(const rg_graph *r, int n) { return r->n[n]->n; }
double *rg_value(rg_graph *r, int n) { return node(r, n)->v; }
double *rg_grad(rg_graph *r, int n) { return node(r, n)->g; }
const int32_t *rg_idvalue(const rg_graph *r, int n) { return r->n[n]->ids; }

/* --- walking index spaces by name ---------------------------------------------------------- */

/* x's element strides along the axes of `over` (0 where x lacks one). */
static void strides_over(const rg_axes *over, const rg_axes *x, int64_t *st) {
    int64_t sx[RG_MAX_RANK], s = 1;
    for (int i = x->rank - 1; i >= 0; i--) {
        sx[i] = s;
        s *= x->size[i];
    }
    for (int i = 0; i < over->rank; i++) {
        int j = rg_find(x, over->name[i]);
        st[i] = j < 0 ? 0 : sx[j];
        if (j >= 0 && x->size[j] != over->size[i])
            die("axis %s has size %lld and %lld", over->name[i], (long long)x->size[j],
                (long long)over->size[i]);
    }
}

/* An odometer over `over` moving up to three operands' offsets. */
typedef struct walk {
    const rg_axes *over;
    int nops;
    int64_t st[3][RG_MAX_RANK], idx[RG_MAX_RANK], off[3];
} walk;

static void walk_init(walk *w, const rg_axes *over, int nops, const rg_axes *a, const rg_axes *b,
                      const rg_axes *c) {
    memset(w, 0, sizeof *w);
    w->over = over;
    w->nops = nops;
    const rg_axes *ops[3] = {a, b, c};
    for (int k = 0; k < nops; k++) strides_over(over, ops[k], w->st[k]);
}

static void walk_next(walk *w) {
    for (int i = w->over->rank - 1; i >= 0; i--) {
        w->idx[i]++;
        for (int k = 0; k < w->nops; k++) w->off[k] += w->st[k][i];
        if (w->idx[i] < w->over->size[i]) return;
        for (int k = 0; k < w->nops; k++) w->off[k] -= w->st[k][i] * w->over->size[i];
        w->idx[i] = 0;
    }
}

/* ax without axis i. */
static rg_axes drop_axis(const rg_axes *ax, int i) {
    rg_axes o = *ax;
    for (int j = i; j + 1 < ax->rank; j++) {
        strcpy(o.name[j], ax->name[j + 1]);
        o.size[j] = ax->size[j + 1];
    }
    o.rank--;
    return o;
}

static int64_t stride_of(const rg_axes *ax, int i) {
    int64_t s = 1;
    for (int j = ax->rank - 1; j > i; j--) s *= ax->size[j];
    return s;
}

static int subset(const rg_axes *x, const rg_axes *y) {
    for (int i = 0; i < x->rank; i++)
        if (rg_find(y, x->name[i]) < 0) return 0;
    return 1;
}

/* --- leaves and elementwise ops ------------------------------------------------------------ */

int rg_leaf(rg_graph *r, const rg_axes *ax, const double *values) {
    int i = add_node(r, OP_LEAF, ax);
    memcpy(r->n[i]->v, values, (size_t)r->n[i]->n * sizeof(double));
    return i;
}

int rg_ids(rg_graph *r, const rg_axes *ax, const int32_t *values) {
    int i = add_node(r, OP_IDS, ax);
    rnode *n = r->n[i];
    n->ids = alloc((size_t)n->n * sizeof(int32_t));
    memcpy(n->ids, values, (size_t)n->n * sizeof(int32_t));
    for (int64_t e = 0; e < n->n; e++) n->v[e] = values[e];
    return i;
}

int rg_const(rg_graph *r, const rg_axes *ax, double value) {
    int i = add_node(r, OP_CONST, ax);
    for (int64_t e = 0; e < r->n[i]->n; e++) r->n[i]->v[e] = value;
    return i;
}

static int binary(rg_graph *r, int op, int a, int b) {
    const rg_axes *aa = &node(r, a)->ax, *ab = &node(r, b)->ax;
    if (!subset(ab, aa) && !subset(aa, ab)) die("binary op: neither operand's axes a subset");
    rg_axes out = subset(ab, aa) ? *aa : *ab;
    int i = add_node(r, op, &out);
    rnode *n = r->n[i], *x = r->n[a], *y = r->n[b];
    n->in[0] = a, n->in[1] = b, n->nin = 2;
    walk w;
    walk_init(&w, &n->ax, 2, &x->ax, &y->ax, NULL);
    for (int64_t e = 0; e < n->n; e++, walk_next(&w)) {
        double p = x->v[w.off[0]], q = y->v[w.off[1]];
        n->v[e] = op == OP_ADD ? p + q : op == OP_SUB ? p - q : op == OP_MUL ? p * q : p / q;
    }
    return i;
}

int rg_add(rg_graph *r, int a, int b) { return binary(r, OP_ADD, a, b); }
int rg_sub(rg_graph *r, int a, int b) { return binary(r, OP_SUB, a, b); }
int rg_mul(rg_graph *r, int a, int b) { return binary(r, OP_MUL, a, b); }
int rg_div(rg_graph *r, int a, int b) { return binary(r, OP_DIV, a, b); }

int rg_scale(rg_graph *r, int x, double f) {
    int i = add_node(r, OP_SCALE, &node(r, x)->ax);
    rnode *n = r->n[i];
    n->in[0] = x, n->nin = 1, n->f = f;
    for (int64_t e = 0; e < n->n; e++) n->v[e] = f * r->n[x]->v[e];
    return i;
}

static double map_value(rg_fn fn, double x) {
    const double c = sqrt(2.0 / RG_PI);
    switch (fn) {
    case RG_RELU: return x > 0 ? x : 0;
    case RG_TANH: return tanh(x);
    case RG_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case RG_EXP: return exp(x);
    case RG_LOG: return log(x);
    case RG_SQRT: return sqrt(x);
    case RG_ABS: return fabs(x);
    case RG_GELU_TANH: return 0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x)));
    case RG_GELU_ERF: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case RG_SILU: return x / (1.0 + exp(-x));
    case RG_BF16: return rg_bf16(x);
    case RG_STEP_GT: return x > 0 ? 1.0 : 0.0;
    }
    return NAN;
}

static double map_slope(rg_fn fn, double x) {
    const double c = sqrt(2.0 / RG_PI);
    switch (fn) {
    case RG_RELU: return x > 0 ? 1 : 0;
    case RG_TANH: return 1.0 - tanh(x) * tanh(x);
    case RG_SIGMOID: {
        double s = 1.0 / (1.0 + exp(-x));
        return s * (1.0 - s);
    }
    case RG_EXP: return exp(x);
    case RG_LOG: return 1.0 / x;
    case RG_SQRT: return 0.5 / sqrt(x);
    case RG_ABS: return x > 0 ? 1 : x < 0 ? -1 : 0;
    case RG_GELU_TANH: {
        double u = c * (x + 0.044715 * x * x * x), t = tanh(u);
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
    }
    case RG_GELU_ERF:
        return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * RG_PI);
    case RG_SILU: {
        double s = 1.0 / (1.0 + exp(-x));
        return s * (1.0 + x * (1.0 - s));
    }
    case RG_BF16: return 1.0;
    case RG_STEP_GT: return 0.0;
    }
    return NAN;
}

int rg_map(rg_graph *r, int x, rg_fn fn) {
    int i = add_node(r, OP_MAP, &node(r, x)->ax);
    rnode *n = r->n[i];
    n->in[0] = x, n->nin = 1, n->fn = (int)fn;
    for (int64_t e = 0; e < n->n; e++) n->v[e] = map_value(fn, r->n[x]->v[e]);
    return i;
}

/* --- contractions and sums ----------------------------------------------------------------- */

/* out's axes, then a's not in out, then b's in neither. */
static rg_axes contract_space(const rg_axes *out, const rg_axes *a, const rg_axes *b) {
    rg_axes s = *out;
    for (int k = 0; k < 2; k++) {
        const rg_axes *x = k ? b : a;
        for (int i = 0; i < x->rank; i++)
            if (rg_find(&s, x->name[i]) < 0) {
                if (s.rank == RG_MAX_RANK) die("contraction over too many axes");
                strcpy(s.name[s.rank], x->name[i]);
                s.size[s.rank++] = x->size[i];
            }
    }
    return s;
}

static void contract_values(rg_graph *r, int i) {
    rnode *n = r->n[i], *a = r->n[n->in[0]], *b = r->n[n->in[1]];
    rg_axes space = contract_space(&n->ax, &a->ax, &b->ax);
    walk w;
    walk_init(&w, &space, 3, &n->ax, &a->ax, &b->ax);
    int64_t total = rg_axes_numel(&space);
    for (int64_t e = 0; e < total; e++, walk_next(&w))
        n->v[w.off[0]] += a->v[w.off[1]] * b->v[w.off[2]];
}

int rg_contract(rg_graph *r, int a, int b, const char *const *out, int nout) {
    rg_axes ax = {0};
    for (int k = 0; k < nout; k++) {
        const rg_axes *src = &node(r, a)->ax;
        int j = rg_find(src, out[k]);
        if (j < 0) src = &node(r, b)->ax, j = rg_find(src, out[k]);
        if (j < 0) die("contract: result axis %s in neither operand", out[k]);
        strcpy(ax.name[ax.rank], out[k]);
        ax.size[ax.rank++] = src->size[j];
    }
    int i = add_node(r, OP_CONTRACT, &ax);
    r->n[i]->in[0] = a, r->n[i]->in[1] = b, r->n[i]->nin = 2;
    contract_values(r, i);
    return i;
}

int rg_sum_to(rg_graph *r, int x, const char *const *keep, int nkeep) {
    const rg_axes *xa = &node(r, x)->ax;
    rg_axes ax = {0};
    for (int k = 0; k < nkeep; k++) {
        int j = rg_find(xa, keep[k]);
        if (j < 0) die("sum: no axis %s", keep[k]);
        strcpy(ax.name[ax.rank], keep[k]);
        ax.size[ax.rank++] = xa->size[j];
    }
    int i = add_node(r, OP_SUM, &ax);
    rnode *n = r->n[i], *s = r->n[x];
    n->in[0] = x, n->nin = 1;
    walk w;
    walk_init(&w, &s->ax, 2, &n->ax, &s->ax, NULL);
    for (int64_t e = 0; e < s->n; e++, walk_next(&w)) n->v[w.off[0]] += s->v[w.off[1]];
    return i;
}

/* --- rows: softmax, layer norm, cross-entropy, maxima -------------------------------------- */

/* Calls fn for every row of x along axis `axis`: the row's first element and its stride. */
typedef struct rows {
    rg_axes outer;
    walk w;
    int64_t count, n, stride;
} rows;

static void rows_init(rows *rw, const rg_axes *x, int axis) {
    rw->outer = drop_axis(x, axis);
    walk_init(&rw->w, &rw->outer, 1, x, NULL, NULL);
    rw->count = rg_axes_numel(&rw->outer);
    rw->n = x->size[axis];
    rw->stride = stride_of(x, axis);
}

static int axis_index(const rg_axes *ax, const char *name, const char *op) {
    int i = rg_find(ax, name);
    if (i < 0) die("%s: no axis %s", op, name);
    return i;
}

/* How many keys row `q` of a causal softmax sees (all without a query axis). */
static int64_t visible(const rnode *n, const rows *rw) {
    if (!n->a2[0]) return rw->n;
    int qo = rg_find(&rw->outer, n->a2);
    int64_t q = rw->w.idx[qo], nq = rw->outer.size[qo];
    int64_t k = q + 1 + (rw->n - nq);
    return k < rw->n ? k : rw->n;
}

int rg_softmax(rg_graph *r, int x, const char *axis, double scale, const char *query) {
    int i = add_node(r, OP_SOFTMAX, &node(r, x)->ax);
    rnode *n = r->n[i], *s = r->n[x];
    n->in[0] = x, n->nin = 1, n->f = scale;
    snprintf(n->a1, RG_NAME, "%s", axis);
    snprintf(n->a2, RG_NAME, "%s", query ? query : "");
    rows rw;
    rows_init(&rw, &s->ax, axis_index(&s->ax, axis, "softmax"));
    for (int64_t o = 0; o < rw.count; o++, walk_next(&rw.w)) {
        int64_t base = rw.w.off[0], m = visible(n, &rw);
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < m; j++) mx = fmax(mx, scale * s->v[base + j * rw.stride]);
        for (int64_t j = 0; j < m; j++) sum += exp(scale * s->v[base + j * rw.stride] - mx);
        for (int64_t j = 0; j < rw.n; j++)
            n->v[base + j * rw.stride] =
                j < m ? exp(scale * s->v[base + j * rw.stride] - mx) / sum : 0;
    }
    return i;
}

int rg_layernorm(rg_graph *r, int x, int w, int b, const char *axis, double eps) {
    int i = add_node(r, OP_LAYERNORM, &node(r, x)->ax);
    rnode *n = r->n[i], *s = r->n[x], *wt = r->n[w], *bs = r->n[b];
    n->in[0] = x, n->in[1] = w, n->in[2] = b, n->nin = 3, n->f = eps;
    snprintf(n->a1, RG_NAME, "%s", axis);
    rows rw;
    rows_init(&rw, &s->ax, axis_index(&s->ax, axis, "layernorm"));
    for (int64_t o = 0; o < rw.count; o++, walk_next(&rw.w)) {
        int64_t base = rw.w.off[0];
        double mean = 0, var = 0;
        for (int64_t j = 0; j < rw.n; j++) mean += s->v[base + j * rw.stride];
        mean /= (double)rw.n;
        for (int64_t j = 0; j < rw.n; j++) {
            double d = s->v[base + j * rw.stride] - mean;
            var += d * d;
        }
        double rstd = 1.0 / sqrt(var / (double)rw.n + eps);
        for (int64_t j = 0; j < rw.n; j++)
            n->v[base + j * rw.stride] =
                (s->v[base + j * rw.stride] - mean) * rstd * wt->v[j] + bs->v[j];
    }
    return i;
}

int rg_embedding(rg_graph *r, int table, int ids, const char *vocab) {
    const rg_axes *ta = &node(r, table)->ax, *ia = &node(r, ids)->ax;
    int v = axis_index(ta, vocab, "embedding");
    if (ta->rank != 2) die("embedding: the table must have two axes");
    rg_axes out = *ia;
    strcpy(out.name[out.rank], ta->name[1 - v]);
    out.size[out.rank++] = ta->size[1 - v];
    int i = add_node(r, OP_EMBED, &out);
    rnode *n = r->n[i], *t = r->n[table], *d = r->n[ids];
    n->in[0] = table, n->in[1] = ids, n->nin = 2;
    snprintf(n->a1, RG_NAME, "%s", vocab);
    int64_t dim = t->ax.size[1 - v], sv = stride_of(&t->ax, v), sd = stride_of(&t->ax, 1 - v);
    for (int64_t e = 0; e < d->n; e++)
        for (int64_t k = 0; k < dim; k++) n->v[e * dim + k] = t->v[d->ids[e] * sv + k * sd];
    return i;
}

int rg_xent(rg_graph *r, int logits, int targets, const char *vocab, int64_t valid) {
    const rg_axes *la = &node(r, logits)->ax;
    int v = axis_index(la, vocab, "cross-entropy");
    rg_axes out = drop_axis(la, v);
    int i = add_node(r, OP_XENT, &out);
    rnode *n = r->n[i], *l = r->n[logits], *t = r->n[targets];
    n->in[0] = logits, n->in[1] = targets, n->nin = 2, n->valid = valid;
    snprintf(n->a1, RG_NAME, "%s", vocab);
    rows rw;
    rows_init(&rw, &l->ax, v);
    walk tw;
    walk_init(&tw, &rw.outer, 1, &t->ax, NULL, NULL);
    for (int64_t o = 0; o < rw.count; o++, walk_next(&rw.w), walk_next(&tw)) {
        int64_t base = rw.w.off[0];
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < valid; j++) mx = fmax(mx, l->v[base + j * rw.stride]);
        for (int64_t j = 0; j < valid; j++) sum += exp(l->v[base + j * rw.stride] - mx);
        n->v[o] = mx + log(sum) - l->v[base + t->ids[tw.off[0]] * rw.stride];
    }
    return i;
}

static int extremum(rg_graph *r, int x, const char *axis, int op) {
    const rg_axes *xa = &node(r, x)->ax;
    int a = axis_index(xa, axis, "max");
    rg_axes out = drop_axis(xa, a);
    int i = add_node(r, op, &out);
    rnode *n = r->n[i], *s = r->n[x];
    n->in[0] = x, n->nin = op == OP_MAX;
    snprintf(n->a1, RG_NAME, "%s", axis);
    rows rw;
    rows_init(&rw, &s->ax, a);
    for (int64_t o = 0; o < rw.count; o++, walk_next(&rw.w)) {
        int64_t base = rw.w.off[0], at = 0;
        for (int64_t j = 1; j < rw.n; j++)
            if (s->v[base + j * rw.stride] > s->v[base + at * rw.stride]) at = j;
        n->v[o] = op == OP_MAX ? s->v[base + at * rw.stride] : (double)at;
    }
    return i;
}

int rg_max(rg_graph *r, int x, const char *axis) { return extremum(r, x, axis, OP_MAX); }
int rg_argmax(rg_graph *r, int x, const char *axis) { return extremum(r, x, axis, OP_ARGMAX); }

/* --- moving data ----------------------------------------------------------------------------- */

static int slice_like(rg_graph *r, int op, int x, const char *axis, int64_t start, int64_t len,
                      int64_t size, const char *name) {
    const rg_axes *xa = &node(r, x)->ax;
    int a = axis_index(xa, axis, op == OP_SLICE ? "slice" : "pad");
    rg_axes out = *xa;
    if (op == OP_SLICE && len == 0) {
        out = drop_axis(xa, a);
    } else {
        out.size[a] = op == OP_SLICE ? len : size;
        if (name) snprintf(out.name[a], RG_NAME, "%s", name);
    }
    int i = add_node(r, op, &out);
    rnode *n = r->n[i], *s = r->n[x];
    n->in[0] = x, n->nin = 1, n->start = start, n->len = op == OP_SLICE ? len : s->ax.size[a];
    n->fn = a; /* the axis's place in both tensors (a dropped axis: in the input) */
    /* Walk the larger tensor's rows of the region: the sliced input or the padded result. */
    const rnode *big = op == OP_SLICE ? s : n;
    int64_t sb = stride_of(&big->ax, a) * start, outer = 1,
            rows_in = op == OP_SLICE ? (len ? len : 1) : n->len;
    for (int k = 0; k < a; k++) outer *= big->ax.size[k];
    int64_t inner = stride_of(&big->ax, a), bigrow = big->ax.size[a] * inner;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < rows_in * inner; j++) {
            int64_t ib = o * bigrow + sb + j, is = o * rows_in * inner + j;
            if (op == OP_SLICE)
                n->v[is] = s->v[ib];
            else
                n->v[ib] = s->v[is];
        }
    return i;
}

int rg_slice(rg_graph *r, int x, const char *axis, int64_t start, int64_t len, const char *name) {
    return slice_like(r, OP_SLICE, x, axis, start, len, 0, name);
}

int rg_pad(rg_graph *r, int x, const char *axis, int64_t start, int64_t size, const char *name) {
    return slice_like(r, OP_PAD, x, axis, start, 0, size, name);
}

int rg_reshape(rg_graph *r, int x, const rg_axes *to) {
    if (rg_axes_numel(to) != node(r, x)->n) die("reshape: sizes differ");
    int i = add_node(r, OP_RESHAPE, to);
    r->n[i]->in[0] = x, r->n[i]->nin = 1;
    memcpy(r->n[i]->v, r->n[x]->v, (size_t)r->n[i]->n * sizeof(double));
    return i;
}

int rg_permute(rg_graph *r, int x, const char *const *order, int nord) {
    const rg_axes *xa = &node(r, x)->ax;
    if (nord != xa->rank) die("permute: %d axes for a tensor of %d", nord, xa->rank);
    rg_axes out = {0};
    for (int k = 0; k < nord; k++) {
        int j = axis_index(xa, order[k], "permute");
        strcpy(out.name[k], order[k]);
        out.size[k] = xa->size[j];
    }
    out.rank = nord;
    int i = add_node(r, OP_PERMUTE, &out);
    rnode *n = r->n[i], *s = r->n[x];
    n->in[0] = x, n->nin = 1;
    walk w;
    walk_init(&w, &n->ax, 1, &s->ax, NULL, NULL);
    for (int64_t e = 0; e < n->n; e++, walk_next(&w)) n->v[e] = s->v[w.off[0]];
    return i;
}

/* --- adjoints --------------------------------------------------------------------------------- */

static void backward_node(rg_graph *r, int i) {
    rnode *n = r->n[i];
    double *gy = n->g;
    switch (n->op) {
    case OP_LEAF:
    case OP_IDS:
    case OP_CONST:
    case OP_ARGMAX: return;
    case OP_ADD:
    case OP_SUB:
    case OP_MUL:
    case OP_DIV: {
        rnode *a = r->n[n->in[0]], *b = r->n[n->in[1]];
        walk w;
        walk_init(&w, &n->ax, 2, &a->ax, &b->ax, NULL);
        for (int64_t e = 0; e < n->n; e++, walk_next(&w)) {
            double p = a->v[w.off[0]], q = b->v[w.off[1]];
            double da = n->op == OP_MUL ? q : n->op == OP_DIV ? 1.0 / q : 1.0;
            double db = n->op == OP_ADD   ? 1.0
                        : n->op == OP_SUB ? -1.0
                        : n->op == OP_MUL ? p
                                          : -p / (q * q);
            a->g[w.off[0]] += gy[e] * da;
            b->g[w.off[1]] += gy[e] * db;
        }
        return;
    }
    case OP_SCALE: {
        rnode *x = r->n[n->in[0]];
        for (int64_t e = 0; e < n->n; e++) x->g[e] += n->f * gy[e];
        return;
    }
    case OP_MAP: {
        rnode *x = r->n[n->in[0]];
        for (int64_t e = 0; e < n->n; e++) x->g[e] += gy[e] * map_slope((rg_fn)n->fn, x->v[e]);
        return;
    }
    case OP_CONTRACT: {
        rnode *a = r->n[n->in[0]], *b = r->n[n->in[1]];
        rg_axes space = contract_space(&n->ax, &a->ax, &b->ax);
        walk w;
        walk_init(&w, &space, 3, &n->ax, &a->ax, &b->ax);
        int64_t total = rg_axes_numel(&space);
        for (int64_t e = 0; e < total; e++, walk_next(&w)) {
            double g = gy[w.off[0]];
            a->g[w.off[1]] += g * b->v[w.off[2]];
            b->g[w.off[2]] += g * a->v[w.off[1]];
        }
        return;
    }
    case OP_SUM: {
        rnode *x = r->n[n->in[0]];
        walk w;
        walk_init(&w, &x->ax, 1, &n->ax, NULL, NULL);
        for (int64_t e = 0; e < x->n; e++, walk_next(&w)) x->g[e] += gy[w.off[0]];
        return;
    }
    case OP_SOFTMAX: {
        rnode *x = r->n[n->in[0]];
        rows rw;
        rows_init(&rw, &x->ax, rg_find(&x->ax, n->a1));
        for (int64_t o = 0; o < rw.count; o++, walk_next(&rw.w)) {
            int64_t base = rw.w.off[0], m = visible(n, &rw);
            double dot = 0;
            for (int64_t j = 0; j < m; j++)
                dot += gy[base + j * rw.stride] * n->v[base + j * rw.stride];
            for (int64_t j = 0; j < m; j++) {
                int64_t at = base + j * rw.stride;
                x->g[at] += n->f * n->v[at] * (gy[at] - dot);
            }
        }
        return;
    }
    case OP_LAYERNORM: {
        rnode *x = r->n[n->in[0]], *w = r->n[n->in[1]], *b = r->n[n->in[2]];
        rows rw;
        rows_init(&rw, &x->ax, rg_find(&x->ax, n->a1));
        double *xh = alloc((size_t)rw.n * sizeof(double));
        for (int64_t o = 0; o < rw.count; o++, walk_next(&rw.w)) {
            int64_t base = rw.w.off[0];
            double mean = 0, var = 0, a = 0, c = 0;
            for (int64_t j = 0; j < rw.n; j++) mean += x->v[base + j * rw.stride];
            mean /= (double)rw.n;
            for (int64_t j = 0; j < rw.n; j++) {
                double d = x->v[base + j * rw.stride] - mean;
                var += d * d;
            }
            double rstd = 1.0 / sqrt(var / (double)rw.n + n->f);
            for (int64_t j = 0; j < rw.n; j++) {
                int64_t at = base + j * rw.stride;
                xh[j] = (x->v[at] - mean) * rstd;
                double gh = gy[at] * w->v[j];
                a += gh;
                c += gh * xh[j];
                w->g[j] += gy[at] * xh[j];
                b->g[j] += gy[at];
            }
            a /= (double)rw.n;
            c /= (double)rw.n;
            for (int64_t j = 0; j < rw.n; j++) {
                int64_t at = base + j * rw.stride;
                x->g[at] += rstd * (gy[at] * w->v[j] - a - xh[j] * c);
            }
        }
        free(xh);
        return;
    }
    case OP_EMBED: {
        rnode *t = r->n[n->in[0]], *d = r->n[n->in[1]];
        int v = rg_find(&t->ax, n->a1);
        int64_t dim = t->ax.size[1 - v], sv = stride_of(&t->ax, v), sd = stride_of(&t->ax, 1 - v);
        for (int64_t e = 0; e < d->n; e++)
            for (int64_t k = 0; k < dim; k++) t->g[d->ids[e] * sv + k * sd] += gy[e * dim + k];
        return;
    }
    case OP_XENT: {
        rnode *l = r->n[n->in[0]], *t = r->n[n->in[1]];
        rows rw;
        rows_init(&rw, &l->ax, rg_find(&l->ax, n->a1));
        walk tw;
        walk_init(&tw, &rw.outer, 1, &t->ax, NULL, NULL);
        for (int64_t o = 0; o < rw.count; o++, walk_next(&rw.w), walk_next(&tw)) {
            int64_t base = rw.w.off[0];
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < n->valid; j++) mx = fmax(mx, l->v[base + j * rw.stride]);
            for (int64_t j = 0; j < n->valid; j++) sum += exp(l->v[base + j * rw.stride] - mx);
            for (int64_t j = 0; j < n->valid; j++) {
                int64_t at = base + j * rw.stride;
                l->g[at] += gy[o] * (exp(l->v[at] - mx) / sum - (j == t->ids[tw.off[0]]));
            }
        }
        return;
    }
    case OP_SLICE:
    case OP_PAD: {
        rnode *x = r->n[n->in[0]];
        const rnode *big = n->op == OP_SLICE ? x : n;
        int a = n->fn;
        int64_t outer = 1, rows_in = n->op == OP_SLICE ? (n->len ? n->len : 1) : n->len;
        for (int k = 0; k < a; k++) outer *= big->ax.size[k];
        int64_t inner = stride_of(&big->ax, a), bigrow = big->ax.size[a] * inner;
        int64_t sb = inner * n->start;
        for (int64_t o = 0; o < outer; o++)
            for (int64_t j = 0; j < rows_in * inner; j++) {
                int64_t ib = o * bigrow + sb + j, is = o * rows_in * inner + j;
                if (n->op == OP_SLICE)
                    x->g[ib] += gy[is];
                else
                    x->g[is] += gy[ib];
            }
        return;
    }
    case OP_MAX: {
        rnode *x = r->n[n->in[0]];
        rows rw;
        rows_init(&rw, &x->ax, rg_find(&x->ax, n->a1));
        for (int64_t o = 0; o < rw.count; o++, walk_next(&rw.w)) {
            int64_t base = rw.w.off[0], ties = 0;
            for (int64_t j = 0; j < rw.n; j++) ties += x->v[base + j * rw.stride] == n->v[o];
            for (int64_t j = 0; j < rw.n; j++)
                if (x->v[base + j * rw.stride] == n->v[o])
                    x->g[base + j * rw.stride] += gy[o] / (double)ties;
        }
        return;
    }
    case OP_RESHAPE: {
        rnode *x = r->n[n->in[0]];
        for (int64_t e = 0; e < n->n; e++) x->g[e] += gy[e];
        return;
    }
    case OP_PERMUTE: {
        rnode *x = r->n[n->in[0]];
        walk w;
        walk_init(&w, &n->ax, 1, &x->ax, NULL, NULL);
        for (int64_t e = 0; e < n->n; e++, walk_next(&w)) x->g[w.off[0]] += gy[e];
        return;
    }
    }
    die("no adjoint for op %d", n->op);
}

void rg_backward(rg_graph *r, int seed, const double *dy) {
    for (int i = 0; i < r->count; i++) memset(r->n[i]->g, 0, (size_t)r->n[i]->n * sizeof(double));
    memcpy(node(r, seed)->g, dy, (size_t)r->n[seed]->n * sizeof(double));
    for (int i = seed; i >= 0; i--) backward_node(r, i);
}
