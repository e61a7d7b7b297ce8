/* A program's command line as one table: each option's name, type, field, default and help,
 * written once. The usage text, the defaults, the parsing and the refusal of a bad value all come
 * from the table, and so do the settings a checkpoint records (CLI_RUN) and the text the
 * processes of an MPI job compare (every option but the CLI_LOCAL ones).
 *
 *   #define F(field) offsetof(options, field)
 *   static const cli_option table[] = {
 *       CLI_SECTION("training"),
 *       CLI_OPT("--batch", CLI_INT, F(batch), "32", "N", "sequences per step", .min = 1,
 *               .max = 1 << 30, .flags = CLI_RUN),
 *       CLI_OPT("--lr", CLI_DOUBLE, F(lr), "2e-3", "X", "peak learning rate", .max = 1e3),
 *       CLI_OPT("--sequential", CLI_FLAG, F(sequential), NULL, NULL, "batches in file order"),
 *   };
 *   static const cli_program program = {"gpt2", sizeof(options), table, CLI_COUNT(table),
 *                                        synopsis, epilogue};
 *   options o;
 *   int rc = cli_parse(&program, argc, argv, &o);   // 0, 1 (--help), -1 (reported)
 *
 * A value is given as "--name VALUE" or "--name=VALUE"; a flag is "--name" alone. A default is
 * written as a value would be given and read by the same parser, so the usage's "(default 32)"
 * is what the program runs with. */
#ifndef MW_EXAMPLES_OPTIONS_H
#define MW_EXAMPLES_OPTIONS_H

#include <stddef.h>
#include <stdio.h>

#include "cli.h"

typedef enum cli_type {
    CLI_HEADING, /* no option: a heading of the usage text (its help) */
    CLI_FLAG,    /* no value: an int field set to 1 */
    CLI_STRING,  /* const char *: the value as given (borrowed from argv) */
    CLI_INT,     /* int in [min, max] (decimal; a leading zero is not octal) */
    CLI_I64,     /* int64_t in [min, max] */
    CLI_U64,     /* uint64_t, decimal or 0x hex, no sign */
    CLI_DOUBLE,  /* double, finite, in [min, max] */
    CLI_CHOICE, /* int: the value of the choice named, or, when max > min, a number in [min, max] */
    CLI_NAME    /* const char *: one of the choices' names */
} cli_type;

/* A name a CLI_CHOICE or CLI_NAME option takes, and (CLI_CHOICE) the value it stands for. */
typedef struct cli_choice {
    const char *name;
    int value;
} cli_choice;

/* cli_option.flags */
enum {
    CLI_RUN = 1 << 0,    /* a setting of the run: a checkpoint records it (cli_options_identity) */
    CLI_LOCAL = 1 << 1,  /* may differ between the processes of a job (not in cli_options_text) */
    CLI_FILE = 1 << 2,   /* a file name: the processes compare whether it is given, not the name
                            (each may read its own copy) */
    CLI_HASHED = 1 << 3, /* the processes compare a hash of it (the text may hold newlines) */
    CLI_ABOVE_MIN = 1 << 4, /* a number above min, not min itself */
    CLI_BELOW_MAX = 1 << 5  /* a number below max, not max itself */
};

typedef struct cli_option {
    const char *name; /* "--batch" (CLI_HEADING: NULL) */
    cli_type type;
    size_t field;     /* offsetof(the program's options struct, the field) */
    const char *def;  /* the default, written as it would be given ("32"); NULL: none (the field
                         stays 0 or NULL, and the usage shows no default) */
    const char *arg;  /* the value's name in the usage ("N"); NULL for a flag */
    const char *help; /* one sentence or a few, wrapped by the usage */
    double min, max;  /* a number's range (both 0: CLI_CHOICE takes names only) */
    const cli_choice *choices; /* CLI_CHOICE and CLI_NAME: ended by {NULL} */
    unsigned flags;            /* CLI_RUN, CLI_LOCAL, ... */
    size_t given;              /* offsetof an int set to 1 when the option is given; 0: none (the
                                  options struct's first field is never such an int) */
} cli_option;

/* A row of the table: the columns every option has, then the ones it needs (.min, .max, .choices,
 * .flags, .given) by name. */
#define CLI_OPT(name_, type_, field_, def_, arg_, help_, ...)                                      \
    {                                                                                              \
        .name = (name_), .type = (type_), .field = (field_), .def = (def_), .arg = (arg_),         \
        .help = (help_), __VA_ARGS__                                                               \
    }
#define CLI_SECTION(title)                                                                         \
    { .type = CLI_HEADING, .help = (title) }
#define CLI_CHOICES(...) ((const cli_choice[]){__VA_ARGS__, {NULL, 0}})
#define CLI_COUNT(table) ((int)(sizeof(table) / sizeof *(table)))

typedef struct cli_program {
    const char *name;          /* the program's name, which starts every message */
    size_t size;               /* sizeof the options struct the table's fields are in */
    const cli_option *options; /* the table */
    int count;
    const char *synopsis; /* the usage's first lines, before the options (with their newline) */
    const char *epilogue; /* the usage's last lines, after them */
    /* An argument that is no option ("-" included): 0 when the program takes it, -1 when not (an
     * unknown argument), 1 when it refuses it with its own message on stderr. NULL: every such
     * argument is unknown. */
    int (*positional)(void *opts, const char *arg);
} cli_program;

/* Sets every option of opts to its default (the others to 0 or NULL: opts is cleared first),
 * then reads argv[1..argc) in order. Returns 0, 1 at --help or -h (the caller prints the usage
 * and exits 0), or -1 with the first bad argument reported on stderr ("gpt2: unknown argument
 * '--bogus' (see --help)", "gpt2: --batch needs a value (see --help)", "gpt2: bad value '0' for
 * --batch (see --help)", "gpt2: bad value 'x' for --schedule (expected cosine or constant)"),
 * after which the caller exits 2. */
int cli_parse(const cli_program *p, int argc, char **argv, void *opts);

/* The usage: the synopsis, then each option as "  --name ARG  help (default D)" under its
 * section, then "--help", then the epilogue. */
void cli_usage(const cli_program *p, FILE *f);

/* Appends "name value" to id for every CLI_RUN option, named without its dashes ("lr 0.002",
 * "sequential no", "schedule cosine"): a number as the shortest text that reads back as it, a
 * flag as yes or no, a choice by its name. */
void cli_options_identity(const cli_program *p, const void *opts, cli_identity *id);

/* Appends to buf (of `size` bytes, kept terminated) one line "--name value" for every option
 * but the CLI_LOCAL ones, in table order: the text the processes of a job compare
 * (mw_distributed_agree). A CLI_FILE is "given" or "none", a CLI_HASHED "hash <FNV-1a>". */
void cli_options_text(const cli_program *p, const void *opts, char *buf, size_t size);

/* The shortest text of v that reads back as v ("0.002", not "0.0020000000000000001"). */
const char *cli_exact(double v, char *buf, size_t size);

#endif
