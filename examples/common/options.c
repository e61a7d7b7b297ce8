/* A command line read, described and compared through its option table (options.h). */
#include "options.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define USAGE_INDENT 22 /* the column where an option's help starts */
#define USAGE_WIDTH 94  /* the column no help line reaches */

static void *field_of(void *opts, const cli_option *o) { return (char *)opts + o->field; }

static const void *value_of(const void *opts, const cli_option *o) {
    return (const char *)opts + o->field;
}

static int takes_value(const cli_option *o) { return o->type != CLI_FLAG; }

static int in_range(const cli_option *o, double v) {
    return !((o->flags & CLI_ABOVE_MIN) && !(v > o->min)) &&
           !((o->flags & CLI_BELOW_MAX) && !(v < o->max));
}

static const cli_choice *choice_named(const cli_option *o, const char *s) {
    for (const cli_choice *c = o->choices; c && c->name; c++)
        if (strcmp(c->name, s) == 0) return c;
    return NULL;
}

/* Reads s into o's field: 0, or -1 when s is not a value o takes. */
static int set_value(const cli_option *o, const char *s, void *opts) {
    void *f = field_of(opts, o);
    int ranged = o->min != 0.0 || o->max != 0.0;
    switch (o->type) {
    case CLI_HEADING: return -1;
    case CLI_FLAG: *(int *)f = 1; return 0;
    case CLI_STRING: *(const char **)f = s; return 0;
    case CLI_INT: {
        int v;
        if (cli_parse_int(s, ranged ? (long)o->min : INT_MIN, ranged ? (long)o->max : INT_MAX,
                          &v) != 0 ||
            !in_range(o, v))
            return -1;
        *(int *)f = v;
        return 0;
    }
    case CLI_I64: {
        int64_t v;
        if (cli_parse_i64(s, ranged ? (int64_t)o->min : INT64_MIN,
                          ranged ? (int64_t)o->max : INT64_MAX, &v) != 0 ||
            !in_range(o, (double)v))
            return -1;
        *(int64_t *)f = v;
        return 0;
    }
    case CLI_U64: return cli_parse_u64(s, (uint64_t *)f);
    case CLI_DOUBLE: {
        double v;
        if (cli_parse_double(s, ranged ? o->min : -HUGE_VAL, ranged ? o->max : HUGE_VAL, &v) != 0 ||
            !in_range(o, v))
            return -1;
        *(double *)f = v;
        return 0;
    }
    case CLI_CHOICE: {
        const cli_choice *c = choice_named(o, s);
        int v;
        if (c)
            v = c->value;
        else if (!(o->max > o->min) || cli_parse_int(s, (long)o->min, (long)o->max, &v) != 0)
            return -1;
        *(int *)f = v;
        return 0;
    }
    case CLI_NAME: {
        const cli_choice *c = choice_named(o, s);
        if (!c) return -1;
        *(const char **)f = c->name;
        return 0;
    }
    }
    return -1;
}

/* "cosine or constant", "auto, per-device or a number from 1 to 4096". */
static void choices_text(const cli_option *o, char *buf, size_t size) {
    int n = 0, numbers = o->type == CLI_CHOICE && o->max > o->min;
    while (o->choices && o->choices[n].name) n++;
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < n + numbers && k < size; i++) {
        const char *sep = i == 0 ? "" : i == n + numbers - 1 ? " or " : ", ";
        int w = i < n ? snprintf(buf + k, size - k, "%s%s", sep, o->choices[i].name)
                      : snprintf(buf + k, size - k, "%sa number from %.0f to %.0f", sep, o->min,
                                 o->max);
        if (w < 0) break;
        k += (size_t)w;
    }
}

static void report_bad(const cli_program *p, const cli_option *o, const char *v) {
    if (o->type == CLI_CHOICE || o->type == CLI_NAME) {
        char list[512];
        choices_text(o, list, sizeof list);
        fprintf(stderr, "%s: bad value '%s' for %s (expected %s)\n", p->name, v, o->name, list);
    } else {
        fprintf(stderr, "%s: bad value '%s' for %s (see --help)\n", p->name, v, o->name);
    }
}

/* The option argument `arg` names, and in *value the text after its '=' (NULL: none). */
static const cli_option *find(const cli_program *p, const char *arg, const char **value) {
    for (int i = 0; i < p->count; i++) {
        const cli_option *o = &p->options[i];
        size_t n = o->name ? strlen(o->name) : 0;
        if (o->type == CLI_HEADING || strncmp(arg, o->name, n) != 0) continue;
        if (arg[n] == '\0' || (arg[n] == '=' && takes_value(o))) {
            *value = arg[n] == '=' ? arg + n + 1 : NULL;
            return o;
        }
    }
    return NULL;
}

int cli_parse(const cli_program *p, int argc, char **argv, void *opts) {
    memset(opts, 0, p->size);
    for (int i = 0; i < p->count; i++) {
        const cli_option *o = &p->options[i];
        if (o->type != CLI_HEADING && o->def && set_value(o, o->def, opts) != 0) {
            fprintf(stderr, "%s: the default of %s, '%s', is not a value it takes\n", p->name,
                    o->name, o->def);
            return -1;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *v = NULL;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) return 1;
        const cli_option *o = find(p, arg, &v);
        if (!o) {
            int taken = p->positional && (arg[0] != '-' || strcmp(arg, "-") == 0)
                            ? p->positional(opts, arg)
                            : -1;
            if (taken == 0) continue;
            if (taken > 0) return -1; /* refused, and said so */
            fprintf(stderr, "%s: unknown argument '%s' (see --help)\n", p->name, arg);
            return -1;
        }
        if (takes_value(o) && !v) {
            if (i + 1 >= argc) {
                fprintf(stderr, "%s: %s needs a value (see --help)\n", p->name, arg);
                return -1;
            }
            v = argv[++i];
        }
        if (set_value(o, v, opts) != 0) {
            report_bad(p, o, v);
            return -1;
        }
        if (o->given) *(int *)((char *)opts + o->given) = 1;
    }
    return 0;
}

/* --- describing the options ------------------------------------------------------------------ */

const char *cli_exact(double v, char *buf, size_t size) {
    for (int digits = 6; digits <= 17; digits++) {
        snprintf(buf, size, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) break;
    }
    return buf;
}

/* The value of o's field as text: numbers exactly, flags as yes or no, choices by name. */
static const char *value_text(const cli_option *o, const void *opts, char *buf, size_t size) {
    const void *f = value_of(opts, o);
    switch (o->type) {
    case CLI_HEADING: return "";
    case CLI_FLAG: return *(const int *)f ? "yes" : "no";
    case CLI_STRING:
    case CLI_NAME: return *(const char *const *)f ? *(const char *const *)f : "none";
    case CLI_INT: snprintf(buf, size, "%d", *(const int *)f); return buf;
    case CLI_I64: snprintf(buf, size, "%" PRId64, *(const int64_t *)f); return buf;
    case CLI_U64: snprintf(buf, size, "%" PRIu64, *(const uint64_t *)f); return buf;
    case CLI_DOUBLE: return cli_exact(*(const double *)f, buf, size);
    case CLI_CHOICE:
        for (const cli_choice *c = o->choices; c && c->name; c++)
            if (c->value == *(const int *)f) return c->name;
        snprintf(buf, size, "%d", *(const int *)f);
        return buf;
    }
    return "";
}

void cli_options_identity(const cli_program *p, const void *opts, cli_identity *id) {
    char buf[64];
    for (int i = 0; i < p->count; i++) {
        const cli_option *o = &p->options[i];
        if (o->type != CLI_HEADING && (o->flags & CLI_RUN))
            cli_identity_add(id, o->name + strspn(o->name, "-"), "%s",
                             value_text(o, opts, buf, sizeof buf));
    }
}

void cli_options_text(const cli_program *p, const void *opts, char *buf, size_t size) {
    size_t k = strlen(buf);
    char v[64];
    for (int i = 0; i < p->count && k < size; i++) {
        const cli_option *o = &p->options[i];
        if (o->type == CLI_HEADING || (o->flags & CLI_LOCAL)) continue;
        const char *s =
            o->flags & (CLI_FILE | CLI_HASHED) ? *(const char *const *)value_of(opts, o) : NULL;
        int w;
        if (o->flags & CLI_FILE)
            w = snprintf(buf + k, size - k, "%s %s\n", o->name, s ? "given" : "none");
        else if (o->flags & CLI_HASHED)
            w = snprintf(buf + k, size - k, "%s hash %016" PRIx64 "\n", o->name,
                         s ? cli_hash(0, s, strlen(s)) : 0);
        else
            w = snprintf(buf + k, size - k, "%s %s\n", o->name, value_text(o, opts, v, sizeof v));
        if (w < 0) break;
        k += (size_t)w;
    }
}

/* --- the usage ------------------------------------------------------------------------------ */

/* Writes text's words after the cursor at column *col, wrapped at USAGE_WIDTH onto lines indented
 * to USAGE_INDENT (text as one word when `whole`); a newline in text breaks the line there.
 * *fresh: the cursor is where a word starts without a space before it. */
static void wrap(FILE *f, const char *text, int whole, int *col, int *fresh) {
    for (const char *p = text; *p;) {
        size_t word = whole ? strlen(p) : strcspn(p, " \n");
        if (*p == '\n' || (!*fresh && *col + 1 + (int)word > USAGE_WIDTH)) {
            fprintf(f, "\n%*s", USAGE_INDENT, "");
            *col = USAGE_INDENT;
            *fresh = 1;
            if (*p == '\n') p++;
            continue;
        }
        if (!*fresh) {
            fputc(' ', f);
            ++*col;
        }
        fwrite(p, 1, word, f);
        *col += (int)word;
        *fresh = 0;
        p += word;
        while (*p == ' ') p++;
    }
}

/* A default as the usage shows it: control characters as C escapes ("\n"). */
static void shown(const char *def, char *buf, size_t size) {
    size_t k = 0;
    for (const char *p = def; *p && k + 5 < size; p++) {
        if (*p == '\n')
            k += (size_t)snprintf(buf + k, size - k, "\\n");
        else if ((unsigned char)*p < 0x20)
            k += (size_t)snprintf(buf + k, size - k, "\\x%02x", (unsigned char)*p);
        else
            buf[k++] = *p;
    }
    buf[k] = '\0';
}

static void usage_line(FILE *f, const char *name, const char *arg, const char *help,
                       const char *def) {
    int col = fprintf(f, "  %s%s%s", name, arg ? " " : "", arg ? arg : ""), fresh = 1;
    col += fprintf(f, "%*s", col < USAGE_INDENT ? USAGE_INDENT - col : 1, "");
    wrap(f, help, 0, &col, &fresh);
    if (def) {
        char text[128], suffix[160];
        shown(def, text, sizeof text);
        snprintf(suffix, sizeof suffix, "(default %s)", text);
        wrap(f, suffix, 1, &col, &fresh);
    }
    fputc('\n', f);
}

void cli_usage(const cli_program *p, FILE *f) {
    if (p->synopsis) fputs(p->synopsis, f);
    for (int i = 0; i < p->count; i++) {
        const cli_option *o = &p->options[i];
        if (o->type == CLI_HEADING)
            fprintf(f, "%s\n", o->help);
        else
            usage_line(f, o->name, o->arg, o->help ? o->help : "",
                       o->type == CLI_FLAG ? NULL : o->def);
    }
    usage_line(f, "--help", NULL, "this text", NULL);
    if (p->epilogue) fputs(p->epilogue, f);
}
