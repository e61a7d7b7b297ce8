/* A CSV of numeric features and an integer label column, for the classify example and its tests.
 *
 * Format: comma-separated cells (spaces around a cell are ignored; no quoting), one row per line,
 * blank lines ignored, an optional header row of column names. Every cell of a feature column
 * must be a finite number, every label an integer. The labels' distinct values become classes
 * 0..K-1 in increasing order of value. */
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
 * is a header, 0 it is not, -1 decide (a header when one of its cells is not a number). Errors
 * (-1, with the message in err naming the file, the line and the column): the file cannot be
 * read or is empty, a header without data rows, a row with another number of cells, a cell that
 * is not a number, a label that is not an integer, an unknown label column, fewer than two
 * classes. */
int csv_table_load(const char *path, const char *label, int header, csv_table *out, char *err,
                   size_t errsize);

void csv_table_free(csv_table *t);

#endif
