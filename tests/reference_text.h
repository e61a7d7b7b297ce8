/* The text reference files of tests/data/ (forward_ref.txt, optimizer_ref.txt): "#" comment
 * lines, then whitespace-separated records "name count value...", as the tools/ scripts that
 * make them document. Shared by the Criterion tests that read them. */
#ifndef MW_TESTS_REFERENCE_TEXT_H
#define MW_TESTS_REFERENCE_TEXT_H

#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

typedef struct reffile {
    FILE *f;
    char path[512];
} reffile;

/* Opens tests/data/<name> (found beside this header, so from any working directory) and skips
 * its comment lines. */
static inline void ref_open(reffile *r, const char *name) {
    const char *file = __FILE__, *slash = strrchr(file, '/');
    snprintf(r->path, sizeof r->path, "%.*s/data/%s", slash ? (int)(slash - file) : 1,
             slash ? file : ".", name);
    r->f = fopen(r->path, "r");
    cr_assert_not_null(r->f, "cannot open %s", r->path);
    int c;
    while ((c = fgetc(r->f)) == '#')
        while ((c = fgetc(r->f)) != '\n' && c != EOF) continue;
    ungetc(c, r->f);
}

/* Reads the word "end" that closes the file, and closes it. */
static inline void ref_close_at_end(reffile *r) {
    char end[16] = "";
    cr_assert_eq(fscanf(r->f, "%15s", end), 1, "%s: truncated", r->path);
    cr_assert_str_eq(end, "end", "%s: records the test does not know", r->path);
    fclose(r->f);
}

#endif
