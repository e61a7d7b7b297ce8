/* Reading a CSV of numeric features and an integer label (see csv_table.h). */
#include "csv_table.h"

#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The cells of one line, split in place (the line is modified). */
typedef struct cells {
    int n, cap;
    char **c;
} cells;

static int split(char *line, cells *out) {
    out->n = 0;
    for (char *p = line;;) {
        char *end = strchr(p, ',');
        if (end) *end = '\0';
        while (isspace((unsigned char)*p)) p++;
        char *q = p + strlen(p);
        while (q > p && isspace((unsigned char)q[-1])) *--q = '\0';
        if (out->n == out->cap) {
            int cap = out->cap ? 2 * out->cap : 16;
            char **c = realloc(out->c, (size_t)cap * sizeof *c);
            if (!c) return -1;
            out->c = c;
            out->cap = cap;
        }
        out->c[out->n++] = p;
        if (!end) return 0;
        p = end + 1;
    }
}

/* A finite number: 0; not a number (or NaN, Inf): -1; beyond float's range: -2. */
static int number(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || !isfinite(v)) return -1;
    if ((errno == ERANGE && fabs(v) > 1.0) || fabs(v) > FLT_MAX) return -2;
    *out = v;
    return 0;
}

/* An integer label: 0; not an integer: -1; beyond 32 bits: -2. */
static int integer(const char *s, int32_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || !(isdigit((unsigned char)*s) || *s == '-' || *s == '+')) return -1;
    if (errno == ERANGE || v < INT32_MIN || v > INT32_MAX) return -2;
    *out = (int32_t)v;
    return 0;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

void csv_table_free(csv_table *t) {
    if (!t) return;
    for (int i = 0; t->names && i <= t->features; i++) free(t->names[i]);
    free(t->names);
    free(t->x);
    free(t->y);
    free(t->classes);
    free(t->line);
    memset(t, 0, sizeof *t);
}

/* Reads the whole file into a NUL-terminated buffer (its length to *len); a FIFO or device is
 * refused without blocking. */
static char *slurp(const char *path, size_t *len, char *err, size_t errsize) {
    FILE *f;
    if (mw_input_open(path, NULL, 0, &f, NULL) != MW_OK) {
        snprintf(err, errsize, "%s", mw_last_error());
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t k; buf && (k = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += k;
        if (n + 1 == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) free(buf);
            buf = b;
        }
    }
    int failed = ferror(f);
    fclose(f);
    if (!buf || failed) {
        free(buf);
        snprintf(err, errsize, "cannot read %s", path);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Whether a row's cells are 0, 1, ..., n - 1: the column names pandas writes for a frame whose
 * columns were never named. */
static int pandas_names(const cells *c) {
    for (int k = 0; k < c->n; k++) {
        char want[16];
        snprintf(want, sizeof want, "%d", k);
        if (strcmp(c->c[k], want) != 0) return 0;
    }
    return 1;
}

int csv_table_load(const char *path, const char *label, int header, const int32_t *known,
                   int nknown, csv_table *t, char *err, size_t errsize) {
    memset(t, 0, sizeof *t);
    size_t size = 0;
    char *all = slurp(path, &size, err, errsize), *text = all;
    if (!all) return -1;
    const char *nul = memchr(all, '\0', size);
    if (nul) {
        int64_t line = 1, col = 1;
        for (const char *p = all; p < nul; p++) line += *p == '\n', col = *p == '\n' ? 1 : col + 1;
        snprintf(err, errsize, "%s: line %lld, byte %lld: a NUL byte; a CSV is text", path,
                 (long long)line, (long long)col);
        free(all);
        return -1;
    }
    if (size >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3)) text += 3; /* a UTF-8 byte-order mark */
    cells c = {0};
    int rc = -1, ncols = 0, label_col = -1;
    int64_t cap = 0, first_line = 0;
    int32_t *labels = NULL;
    char *save = NULL;
    int64_t lineno = 0;
    for (char *line = text; line; line = save) {
        lineno++;
        save = strchr(line, '\n');
        if (save) *save++ = '\0';
        size_t len = strlen(line);
        if (len && line[len - 1] == '\r') line[len - 1] = '\0';
        const char *p = line;
        while (isspace((unsigned char)*p)) p++;
        if (!*p) continue; /* a blank line */
        if (split(line, &c)) goto oom;
        if (!ncols) { /* the first row: the header, or the first data row */
            ncols = c.n;
            first_line = lineno;
            if (ncols < 2) {
                snprintf(err, errsize,
                         "%s: line %lld has %d column; a label and at least one "
                         "feature are needed",
                         path, (long long)lineno, ncols);
                goto fail;
            }
            int is_header = header;
            for (int k = 0; header < 0 && k < ncols && is_header < 1; k++) {
                double v;
                is_header = number(c.c[k], &v) ? 1 : 0;
            }
            if (header < 0 && is_header == 0 && pandas_names(&c)) {
                snprintf(err, errsize,
                         "%s: line %lld reads 0,1,...,%d: the column names pandas gives unnamed "
                         "columns, or a row of data? Say which with --header yes or --header no",
                         path, (long long)lineno, ncols - 1);
                goto fail;
            }
            t->features = ncols - 1;
            t->names = calloc((size_t)ncols, sizeof *t->names);
            if (!t->names) goto oom;
            label_col = ncols - 1;
            if (label) {
                label_col = -1;
                for (int k = 0; is_header == 1 && k < ncols; k++)
                    if (!strcmp(c.c[k], label)) label_col = k;
                if (label_col < 0) {
                    snprintf(err, errsize, "%s: line %lld: no column named '%s'%s", path,
                             (long long)lineno, label,
                             is_header == 1 ? "" : " (the file has no header row)");
                    goto fail;
                }
            }
            for (int k = 0, f = 0; k < ncols; k++) {
                char name[64];
                if (is_header != 1) snprintf(name, sizeof name, "column %d", k + 1);
                const char *s = is_header == 1 ? c.c[k] : name;
                char **slot = k == label_col ? &t->names[ncols - 1] : &t->names[f++];
                if (!(*slot = strdup(s))) goto oom;
            }
            if (is_header == 1) continue;
        }
        if (c.n != ncols) {
            snprintf(err, errsize, "%s: line %lld has %d columns but line %lld has %d", path,
                     (long long)lineno, c.n, (long long)first_line, ncols);
            goto fail;
        }
        if (t->rows == cap) {
            cap = cap ? 2 * cap : 256;
            float *x = realloc(t->x, (size_t)(cap * t->features) * sizeof *x);
            if (x) t->x = x;
            int32_t *l = realloc(labels, (size_t)cap * sizeof *l);
            if (l) labels = l;
            int64_t *ln = realloc(t->line, (size_t)cap * sizeof *ln);
            if (ln) t->line = ln;
            if (!x || !l || !ln) goto oom;
        }
        for (int k = 0, f = 0; k < ncols; k++) {
            const char *name = k == label_col ? t->names[ncols - 1] : t->names[f];
            if (k == label_col) {
                int why = integer(c.c[k], &labels[t->rows]);
                if (why) {
                    snprintf(err, errsize,
                             "%s: line %lld, column %d ('%s'): the label '%.40s' is %s", path,
                             (long long)lineno, k + 1, name, c.c[k],
                             why == -2 ? "outside the 32-bit integers" : "not an integer");
                    goto fail;
                }
                continue;
            }
            double v;
            int why = number(c.c[k], &v);
            if (why) {
                snprintf(err, errsize, "%s: line %lld, column %d ('%s'): '%.40s' is %s", path,
                         (long long)lineno, k + 1, name, c.c[k],
                         why == -2 ? "beyond float's range (about 3.4e38)" : "not a number");
                goto fail;
            }
            t->x[t->rows * t->features + f++] = (float)v;
        }
        t->line[t->rows++] = lineno;
    }
    if (!ncols) {
        snprintf(err, errsize, "%s: line 1: the file is empty", path);
        goto fail;
    }
    if (!t->rows) {
        snprintf(err, errsize, "%s: line %lld is a header and no data rows follow", path,
                 (long long)first_line);
        goto fail;
    }
    if (known) { /* the classes of a model: every label must be one of them */
        t->classes = malloc((size_t)nknown * sizeof *t->classes);
        t->y = malloc((size_t)t->rows * sizeof *t->y);
        if (!t->classes || !t->y) goto oom;
        memcpy(t->classes, known, (size_t)nknown * sizeof *known);
        t->nclasses = nknown;
        for (int64_t i = 0; i < t->rows; i++) {
            int hit = -1;
            for (int j = 0; j < nknown && hit < 0; j++)
                if (known[j] == labels[i]) hit = j;
            if (hit < 0) {
                char set[160] = "";
                for (int j = 0; j < nknown && strlen(set) < sizeof set - 16; j++)
                    snprintf(set + strlen(set), sizeof set - strlen(set), "%s%d", j ? ", " : "",
                             known[j]);
                snprintf(err, errsize,
                         "%s: line %lld, column %d ('%s'): the label %d is not one of the "
                         "model's classes (%s)",
                         path, (long long)t->line[i], label_col + 1, t->names[ncols - 1], labels[i],
                         set);
                goto fail;
            }
            t->y[i] = hit;
        }
        rc = 0;
        goto done;
    }
    /* Classes: the distinct labels, increasing. */
    int32_t *sorted = malloc((size_t)t->rows * sizeof *sorted);
    t->y = malloc((size_t)t->rows * sizeof *t->y);
    if (!sorted || !t->y) {
        free(sorted);
        goto oom;
    }
    memcpy(sorted, labels, (size_t)t->rows * sizeof *sorted);
    qsort(sorted, (size_t)t->rows, sizeof *sorted, cmp_i32);
    int k = 0;
    for (int64_t i = 0; i < t->rows; i++)
        if (i == 0 || sorted[i] != sorted[i - 1]) sorted[k++] = sorted[i];
    t->nclasses = k;
    t->classes = sorted;
    if (k < 2) {
        snprintf(err, errsize,
                 "%s: column %d ('%s') has the one label %d on every row (lines "
                 "%lld-%lld); a classifier needs at least two classes",
                 path, label_col + 1, t->names[ncols - 1], sorted[0], (long long)t->line[0],
                 (long long)t->line[t->rows - 1]);
        goto fail;
    }
    for (int64_t i = 0; i < t->rows; i++) {
        int32_t *hit = bsearch(&labels[i], sorted, (size_t)k, sizeof *sorted, cmp_i32);
        t->y[i] = (int32_t)(hit - sorted);
    }
    rc = 0;
    goto done;
oom:
    snprintf(err, errsize, "%s: out of memory", path);
fail:
    csv_table_free(t);
done:
    free(labels);
    free(c.c);
    free(all);
    return rc;
}
