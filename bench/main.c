/* meshwit-bench: runs the benchmark cases, prints their tables and writes JSON/CSV records. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../examples/common/cli.h"
#include "bench.h"
#include "meshwit.h"

#ifndef MWB_SOURCE_DIR
#define MWB_SOURCE_DIR "."
#endif

typedef struct bench_case {
    const char *name;
    mwb_case_fn run;
    const char *what;
} bench_case;

static const bench_case cases[] = {
    {"linreg", mwb_case_linreg, "linear regression 8192 x 64: single vs sharded ms/step"},
    {"reduce", mwb_case_reduce, "all-reduce time and bandwidth of the reducers"},
    {"gpt2", mwb_case_gpt2, "tiny GPT-2: ms/step, tokens/s and peak memory per configuration"},
    {"llmc", mwb_case_llmc, "llm.c's GPT-2 (L4 C256 T256): cpu:1, cpu:2 vs PyTorch, sgemm rate"},
    {"llama", mwb_case_llama,
     "a Llama of llm.c's GPT-2 size (GQA, SwiGLU, rotary): cpu:1, cpu:2 vs PyTorch"},
    {"profile", mwb_case_profile, "where a step of llm.c's GPT-2 goes, per op and phase"},
    {"llama-profile", mwb_case_llama_profile,
     "where a step of the llama case's model goes, per op and phase"},
    {"contention", mwb_case_contention,
     "linreg and gpt2, single vs sharded (cpu:2, cpu:4), beside a busy process"},
    {"scaling", mwb_case_scaling, "tiny GPT-2 over 1, 2, 4 devices: where the step time goes"},
    {"gpt2-124m", mwb_case_gpt2_124m,
     "GPT-2 124M at context 1024 (default cuda:0, bf16): ms/step, tokens/s, MFU"},
    {"parallel", mwb_case_parallel,
     "llm.c's GPT-2: data, ZeRO-1, tensor, data x tensor parallel: speed, memory per device"},
    {"soak", mwb_case_soak, "thousands of steps on cpu:4 with faults and checkpoints: flat memory"},
    {"mpi", mwb_case_mpi, "under mpirun: all-reduce vs MPI_Allreduce, GPT-2 processes vs threads"},
    {"sample", mwb_case_sample,
     "llm.c's GPT-2 sampling 256 tokens: key/value cache vs recomputing, tokens/s"},
    {"attention", mwb_case_attention,
     "fused causal attention kernels, f32 and bf16 paths, forward and backward: ms, GFLOP/s"},
    {"rowops", mwb_case_rowops,
     "RMS norm, rotary embeddings and SwiGLU kernels beside a copy of the same bytes, GB/s"},
    {"pipeline", mwb_case_pipeline,
     "GPT-2 (124M; --quick: tiny) in stages on cpu:4 as P=4, every schedule: tokens/s, memory, "
     "idle per device measured and modelled"},
    {"tokenize", mwb_case_tokenize,
     "byte-level BPE tokenizer: encode MB/s vs Hugging Face tokenizers"},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

/* The driver's state behind mwb_ctx.driver: every record emitted so far. */
typedef struct driver {
    mwb_record *records;
    int count;
    int capacity;
    int dropped; /* records lost to an allocation failure */
} driver;

/* --- the interface for cases ------------------------------------------------------------------ */

double mwb_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts a copy: callers pair their values by round after taking a median (case_llmc.c), and a
 * median that sorted them in place had paired the rounds' order statistics instead. */
double mwb_median(const double *v, int n) {
    if (n <= 0) return NAN;
    double small[256],
        *t = (size_t)n <= sizeof small / sizeof *small ? small : malloc((size_t)n * sizeof *t);
    if (!t) return NAN;
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, compare_doubles);
    double m = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    if (t != small) free(t);
    return m;
}

/* The field called key: an existing one (so setting a key twice replaces it) or a new one; NULL
 * when the record is full, which is a bug in the case: say so once. */
static int field_slot(mwb_record *r, const char *key) {
    for (int i = 0; i < r->nfields; i++)
        if (strncmp(r->f[i].key, key, sizeof r->f[i].key - 1) == 0) return i;
    if (r->nfields >= MWB_MAX_FIELDS) {
        static int warned;
        if (!warned++) fprintf(stderr, "meshwit-bench: record full, field '%s' dropped\n", key);
        return -1;
    }
    int i = r->nfields++;
    snprintf(r->f[i].key, sizeof r->f[i].key, "%s", key);
    return i;
}

void mwb_record_str(mwb_record *r, const char *key, const char *value) {
    int i = field_slot(r, key);
    if (i < 0) return;
    r->f[i].is_str = 1;
    r->f[i].num = 0.0;
    snprintf(r->f[i].str, sizeof r->f[i].str, "%s", value ? value : "");
}

void mwb_record_num(mwb_record *r, const char *key, double value) {
    int i = field_slot(r, key);
    if (i < 0) return;
    r->f[i].is_str = 0;
    r->f[i].num = value;
    r->f[i].str[0] = '\0';
}

/* The CPU's model name (/proc/cpuinfo), read once by print_header. */
static char cpu_model[96] = "unknown CPU";

static void emit(mwb_ctx *ctx, const mwb_record *r) {
    driver *d = ctx->driver;
    if (d->count == d->capacity) {
        int cap = d->capacity ? 2 * d->capacity : 16;
        mwb_record *grown = realloc(d->records, (size_t)cap * sizeof *grown);
        if (!grown) {
            d->dropped++;
            return;
        }
        d->records = grown;
        d->capacity = cap;
    }
    d->records[d->count] = *r;
    if (ctx->condition) mwb_record_str(&d->records[d->count], "condition", ctx->condition);
    mwb_record_str(&d->records[d->count], "cpu", cpu_model);
    mwb_record_str(&d->records[d->count], "cpu_kernels", mw_backend_describe("cpu"));
    d->count++;
}

int mwb_private_dir(char *dir, size_t size) {
    const char *t = getenv("TMPDIR");
    if (!t || !*t) t = "/tmp";
    int n = snprintf(dir, size, "%s/meshwit-bench-XXXXXX", t);
    if (n < 0 || (size_t)n >= size || !mkdtemp(dir)) {
        fprintf(stderr, "meshwit-bench: cannot make a folder in %s: %s\n", t,
                n < 0 || (size_t)n >= size ? "the path is too long" : strerror(errno));
        if (size) dir[0] = '\0';
        return -1;
    }
    return 0;
}

void mwb_private_dir_remove(const char *dir, const char *const *names) {
    char path[4200];
    if (!dir || !*dir) return;
    for (int i = 0; names && names[i]; i++)
        if (snprintf(path, sizeof path, "%s/%s", dir, names[i]) < (int)sizeof path) unlink(path);
    rmdir(dir);
}

/* --- output files ----------------------------------------------------------------------------- */

/* Integers exactly (sizes, counts), other numbers with 6 significant digits. */
static void format_number(double v, char *buf, size_t size) {
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, size, "%.0f", v);
    } else {
        snprintf(buf, size, "%.6g", v);
    }
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            fprintf(f, "\\%c", *p);
        } else if (*p < 0x20) {
            fprintf(f, "\\u%04x", *p);
        } else {
            fputc(*p, f);
        }
    }
    fputc('"', f);
}

/* An array of objects, one per record, fields in the order the case set them; a non-finite number
 * (which JSON cannot hold) is written as null. */
static void write_json(FILE *f, const driver *d) {
    fputs("[\n", f);
    for (int i = 0; i < d->count; i++) {
        const mwb_record *r = &d->records[i];
        fputs("  {", f);
        for (int k = 0; k < r->nfields; k++) {
            if (k) fputs(", ", f);
            json_string(f, r->f[k].key);
            fputs(": ", f);
            if (r->f[k].is_str) {
                json_string(f, r->f[k].str);
            } else if (!isfinite(r->f[k].num)) {
                fputs("null", f);
            } else {
                char num[48];
                format_number(r->f[k].num, num, sizeof num);
                fputs(num, f);
            }
        }
        fputs(i + 1 < d->count ? "},\n" : "}\n", f);
    }
    fputs("]\n", f);
}

static void csv_cell(FILE *f, const char *s) {
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

/* One table: a header with every field name in order of first appearance over all records, then
 * one row per record, empty where a record lacks a field (or its number is not finite). */
static int write_csv(FILE *f, const driver *d) {
    int ncols = 0;
    const char **cols = malloc(((size_t)d->count * MWB_MAX_FIELDS + 1) * sizeof *cols);
    if (!cols) return -1;
    for (int i = 0; i < d->count; i++) {
        for (int k = 0; k < d->records[i].nfields; k++) {
            const char *key = d->records[i].f[k].key;
            int c = 0;
            while (c < ncols && strcmp(cols[c], key) != 0) c++;
            if (c == ncols) cols[ncols++] = key;
        }
    }
    for (int c = 0; c < ncols; c++) {
        if (c) fputc(',', f);
        csv_cell(f, cols[c]);
    }
    fputc('\n', f);
    for (int i = 0; i < d->count; i++) {
        const mwb_record *r = &d->records[i];
        for (int c = 0; c < ncols; c++) {
            if (c) fputc(',', f);
            for (int k = 0; k < r->nfields; k++) {
                if (strcmp(r->f[k].key, cols[c]) != 0) continue;
                if (r->f[k].is_str) {
                    csv_cell(f, r->f[k].str);
                } else if (isfinite(r->f[k].num)) {
                    char num[48];
                    format_number(r->f[k].num, num, sizeof num);
                    fputs(num, f);
                }
                break;
            }
        }
        fputc('\n', f);
    }
    free(cols);
    return 0;
}

/* Writes the records beside path (the flag `what`; "-": standard output) and syncs them to the
 * disk: *out, renamed over path by mw_output_commit once both files are written (a failure of
 * either leaves both as they were). 0 on success, -1 reported. */
static int write_records(const char *path, const char *what, const driver *d, int csv,
                         mw_output **out) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    int bad = !f;
    if (f) {
        bad = csv ? write_csv(f, d) : (write_json(f, d), 0);
        if (fclose(f) != 0) bad = -1;
    }
    mw_status st = bad ? MW_ERR_NOMEM : mw_output_open(path, what, MW_FILE_STDIO, out);
    if (st == MW_OK && (st = mw_output_write(*out, text, len)) == MW_OK) st = mw_output_sync(*out);
    if (st != MW_OK && !bad) {
        mw_output_abandon(*out);
        *out = NULL;
    }
    free(text);
    if (st != MW_OK && bad)
        fprintf(stderr, "meshwit-bench: cannot write %s %s: out of memory\n", what, path);
    else if (st != MW_OK)
        fprintf(stderr, "meshwit-bench: %s\n", mw_last_error());
    return st == MW_OK ? 0 : -1;
}

/* The room asked for each of --json and --csv: an estimate, not a bound (how many records a case
 * emits depends on its devices and sizes): a case's records take a few kB, and this is ample for
 * every case of this program, yet small enough not to refuse a disk that would hold them. */
#define RECORDS_ROOM_PER_CASE (INT64_C(64) << 10)

/* Every file of the run, checked before the first case: the tokenize case's text and tokenizer
 * (its files, read now: a FIFO is refused without blocking), then --json and --csv (rank 0's):
 * no input, not each other, no FIFO, device, folder or read-only file, in a folder that takes a
 * new file, with room for RECORDS_ROOM_PER_CASE a case each. 0, or -1 reported. */
static int check_files(const bench_case *const *run, int nrun, const char *json, const char *csv) {
    mw_file_set *fs;
    mw_tokenizer *tok = NULL;
    const char *what = "";
    mw_status st = mw_file_set_new(&fs);
    for (int i = 0; i < nrun && st == MW_OK; i++) {
        if (run[i]->run != mwb_case_tokenize) continue;
        const char *x = getenv("MESHWIT_BENCH_TEXT"), *t = getenv("MESHWIT_BENCH_TOKENIZER");
        char deflt[4096];
        snprintf(deflt, sizeof deflt, "%s/tests/data/tokenizer/tokenizer.json", MWB_SOURCE_DIR);
        if (x && *x) st = mw_file_set_add_input(fs, x, "MESHWIT_BENCH_TEXT", 0);
        if (st == MW_OK && (st = mw_tokenizer_load(t && *t ? t : deflt, &tok)) != MW_OK)
            what = "the tokenize case's tokenizer (MESHWIT_BENCH_TOKENIZER): ";
        for (int k = 0; st == MW_OK && mw_tokenizer_file(tok, k); k++)
            st = mw_file_set_add_input(fs, mw_tokenizer_file(tok, k), "MESHWIT_BENCH_TOKENIZER", 0);
        mw_tokenizer_free(tok);
        tok = NULL;
        break;
    }
    int64_t room = RECORDS_ROOM_PER_CASE * nrun;
    if (st == MW_OK && json) st = mw_file_set_add_output(fs, json, "--json", MW_FILE_STDIO, room);
    if (st == MW_OK && csv) st = mw_file_set_add_output(fs, csv, "--csv", MW_FILE_STDIO, room);
    mw_file_set_free(fs);
    if (st == MW_OK) return 0;
    fprintf(stderr, "meshwit-bench: %s%s\n", what, mw_last_error());
    return -1;
}

/* --- the program ------------------------------------------------------------------------------ */

static void usage(FILE *f) {
    fprintf(f, "usage: meshwit-bench [CASE...] [--devices SPEC]... [--precision P] [--json FILE] "
               "[--csv FILE] [--quick]\n"
               "\n"
               "Cases (default: all):\n");
    for (int i = 0; i < NCASES; i++) fprintf(f, "  %-10s %s\n", cases[i].name, cases[i].what);
    fprintf(f,
            "\n"
            "  --devices SPEC  a device spec to measure (repeatable; e.g. cpu:2, cuda:0,1);\n"
            "                  each case has its own defaults when none is given\n"
            "  --json FILE     write every record to FILE as a JSON array of objects (-: standard\n"
            "                  output); FILE and --csv's are checked before the first case (no\n"
            "                  input, FIFO, device or folder; a folder that takes a new file) and\n"
            "                  replaced only by the complete file\n"
            "  --csv FILE      write every record to FILE as one CSV table: a header row naming\n"
            "                  every field of every case (case, devices, mode, ..., ms_per_step,\n"
            "                  ...), then one row per record; a field a case does not have is an\n"
            "                  empty cell. Filter on the case column in a spreadsheet, or in\n"
            "                  gnuplot: set datafile separator ','; set key autotitle columnhead\n"
            "  --precision P   fp32, bf16 or both: what the GPT-2 cases train in\n"
            "                  (mw_trainer_config.precision; llmc and profile default to both,\n"
            "                  the others to fp32)\n"
            "  --quick         fewer repeats (a smoke run, not a measurement)\n"
            "  --help          this text\n"
            "\n"
            "Each case prints a table; times are medians of repeats. Under mpirun with more than\n"
            "one process only the mpi case runs, and rank 0 alone prints and writes the files.\n"
            "Exit status: 0 ok, 1 a case or an output file failed, 2 bad arguments, an unknown\n"
            "case or a file refused before the first case.\n");
}

static void print_header(void) {
    char *model = cpu_model;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            char *colon = strchr(line, ':');
            if (strncmp(line, "model name", 10) != 0 || !colon) continue;
            colon += 1 + strspn(colon + 1, " \t");
            colon[strcspn(colon, "\n")] = '\0';
            snprintf(model, sizeof cpu_model, "%s", colon);
            break;
        }
        fclose(f);
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    printf("meshwit-bench %s\n", mw_version());
    printf("machine: %ld cores online, %s\n", cores, model);
    printf("cpu: %s\n", mw_backend_describe("cpu"));
    const char *warning = mw_backend_warning("cpu");
    if (warning && *warning) printf("warning: %s\n", warning);
    printf("\n");
    fflush(stdout);
}

static const bench_case *find_case(const char *name) {
    for (int i = 0; i < NCASES; i++)
        if (strcmp(cases[i].name, name) == 0) return &cases[i];
    return NULL;
}

int main(int argc, char **argv) {
    const bench_case **run = calloc((size_t)argc + NCASES, sizeof *run);
    const char **devices = calloc((size_t)argc + 1, sizeof *devices);
    if (!run || !devices) {
        fprintf(stderr, "meshwit-bench: out of memory\n");
        return 2;
    }
    int nrun = 0, ndevices = 0, quick = 0, precision = 0, rc = 0;
    const char *json_path = NULL, *csv_path = NULL;
    /* Under mpirun every process runs the bench; rank 0 alone prints and writes the files. */
    if (mw_distributed_init(&argc, &argv) != MW_OK) {
        fprintf(stderr, "meshwit-bench: %s\n", mw_last_error());
        rc = 1;
        goto done;
    }
    int rank = mw_distributed_rank(), procs = mw_distributed_size();
    if (rank != 0 && !freopen("/dev/null", "w", stdout)) {
        perror("meshwit-bench: /dev/null");
        rc = 1;
        goto done;
    }
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *v;
        int missing = 0;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            usage(stdout);
            goto done;
        } else if (strcmp(arg, "--quick") == 0) {
            quick = 1;
        } else if ((v = cli_option_value(argc, argv, &i, "--devices", &missing))) {
            devices[ndevices++] = v;
        } else if ((v = cli_option_value(argc, argv, &i, "--precision", &missing))) {
            precision = !strcmp(v, "fp32")   ? MWB_FP32
                        : !strcmp(v, "bf16") ? MWB_BF16
                        : !strcmp(v, "both") ? MWB_FP32 | MWB_BF16
                                             : -1;
            if (precision < 0) {
                fprintf(stderr, "meshwit-bench: --precision %s: expected fp32, bf16 or both\n", v);
                rc = 2;
            }
        } else if ((v = cli_option_value(argc, argv, &i, "--json", &missing))) {
            json_path = v;
        } else if ((v = cli_option_value(argc, argv, &i, "--csv", &missing))) {
            csv_path = v;
        } else if (missing) {
            fprintf(stderr, "meshwit-bench: %s needs a value (see --help)\n", arg);
            rc = 2;
        } else if (arg[0] == '-') {
            fprintf(stderr, "meshwit-bench: unknown option '%s' (see --help)\n", arg);
            rc = 2;
        } else if (!(run[nrun++] = find_case(arg))) {
            fprintf(stderr, "meshwit-bench: unknown case '%s'; cases:", arg);
            for (int c = 0; c < NCASES; c++) fprintf(stderr, " %s", cases[c].name);
            fprintf(stderr, "\n");
            rc = 2;
        }
        if (rc) goto done;
    }
    if (nrun == 0)
        for (int c = 0; c < NCASES; c++)
            if (procs == 1 || cases[c].run == mwb_case_mpi) run[nrun++] = &cases[c];
    for (int i = 0; i < nrun && procs > 1; i++)
        if (run[i]->run != mwb_case_mpi) {
            fprintf(stderr,
                    "meshwit-bench: under mpirun (%d processes) only the mpi case runs; "
                    "run '%s' without mpirun\n",
                    procs, run[i]->name);
            rc = 2;
            goto done;
        }

    /* The files first: a bad path should not cost a whole run. Rank 0 alone writes them: under
     * mpirun its refusal ends every process (the others would wait in the mpi case). */
    if (rank != 0) json_path = csv_path = NULL;
    if (check_files(run, nrun, json_path, csv_path) != 0) {
        if (procs > 1) mw_distributed_abort(2);
        rc = 2;
        goto done;
    }

    print_header();
    driver d = {0};
    mwb_ctx ctx = {.devices = devices,
                   .ndevices = ndevices,
                   .quick = quick,
                   .precision = precision,
                   .emit = emit,
                   .driver = &d};
    for (int i = 0; i < nrun; i++) {
        printf("== %s: %s\n", run[i]->name, run[i]->what);
        fflush(stdout);
        if (run[i]->run(&ctx) != 0) {
            fprintf(stderr, "meshwit-bench: case %s failed\n", run[i]->name);
            rc = 1;
        }
        printf("\n");
        fflush(stdout);
    }
    if (d.dropped) {
        fprintf(stderr, "meshwit-bench: out of memory, %d records not written\n", d.dropped);
        rc = 1;
    }
    mw_output *json = NULL, *csv = NULL;
    int bad_out = (json_path && write_records(json_path, "--json", &d, 0, &json)) ||
                  (csv_path && write_records(csv_path, "--csv", &d, 1, &csv));
    mw_output **outs[2] = {&json, &csv};
    for (int k = 0; k < 2 && !bad_out; k++) {
        if (*outs[k] && mw_output_commit(*outs[k]) != MW_OK) {
            fprintf(stderr, "meshwit-bench: %s\n", mw_last_error());
            bad_out = 1;
        }
        *outs[k] = NULL;
    }
    mw_output_abandon(json);
    mw_output_abandon(csv);
    if (bad_out) rc = 1;
    free(d.records);

done:
    free(run);
    free(devices);
    mw_distributed_finalize();
    return rc;
}
