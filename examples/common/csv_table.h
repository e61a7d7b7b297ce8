/* A CSV of numeric features and an integer label column, for the classify example and its tests.
 *
 * Format: comma-separated cells (spaces around a cell are ignored; no quoting), one row per line,
 * blank lines ignored, an optional header row of column names. Every cell of a feature column
 * must be a finite number within float's range, every label a 32-bit integer. The labels' distinct
 * values become classes 0..K-1 in increasing order of value. */
#ifndef CSV_TABLE_H
#define CSV_TABLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct csv_table {
    int64_t rows;
    int features;
    char **names; /* features + 1 column names ("column 3" without a header), label last */
    float *x;     /* rows x features, row-major */
    int32_t *y;   /* rows: class index */
    int nclasses;
    int32_t *classes; /* nclasses: the label value of each class, increasing */
    int64_t *line;    /* rows: the file line of each row (1-based) */
} csv_table;

/* Reads path. label: the label column's name (NULL: the last column); header: 1 the first row
 * is a header, 0 it is not, -1 decide (a header when one of its cells is not a number; a first
 * row 0,1,...,n-1, which pandas writes for unnamed columns, is refused as ambiguous). known
 * (nknown labels, or NULL): the classes of a trained model, in its order: every label must be
 * one of them and the table's classes are those. A UTF-8 byte-order mark is skipped. Errors
 * (-1, with the message in err naming the file, the line and the column): the file cannot be
 * read, is not a regular file, is empty or holds a NUL byte, a header without data rows, a row
 * with another number of cells, a cell that is not a number or beyond float's range, a label
 * that is not a 32-bit integer or (with known) not a known class, an unknown label column, fewer
 * than two classes (without known). */
int csv_table_load(const char *path, const char *label, int header, const int32_t *known,
                   int nknown, csv_table *out, char *err, size_t errsize);

void csv_table_free(csv_table *t);

#endif
