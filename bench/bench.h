/* meshwit-bench: the interface between the driver (main.c) and the cases. */
#ifndef MWB_BENCH_H
#define MWB_BENCH_H

#include <stddef.h>
#include <stdio.h>

#define MWB_MAX_FIELDS 28

enum { MWB_FP32 = 1, MWB_BF16 = 2 }; /* mwb_ctx.precision */

/* One measured configuration: an ordered list of fields, written as one JSON object and one
 * CSV row. Every record has at least "case", "devices" and, for step benchmarks, "ms_per_step";
 * the driver adds "cpu" (the CPU's model name) and "cpu_kernels" (what the CPU backend runs on,
 * mw_backend_describe) to each, so no figure leaves the machine without them. */
typedef struct mwb_record {
    int nfields;
    struct {
        char key[32];
        int is_str;
        double num;
        char str[96];
    } f[MWB_MAX_FIELDS];
} mwb_record;

void mwb_record_str(mwb_record *r, const char *key, const char *value);
void mwb_record_num(mwb_record *r, const char *key, double value);

typedef struct mwb_ctx {
    const char *const *devices; /* --devices values, in order; cases use their defaults if none */
    int ndevices;
    int quick; /* --quick: fewer repeats, smaller sizes (for CI smoke runs) */
    /* --precision: MWB_FP32 | MWB_BF16 (bits) for the cases that train in either; 0: each
     * case's own default */
    int precision;
    void (*emit)(struct mwb_ctx *ctx, const mwb_record *r); /* appends to JSON/CSV output */
    void *driver;                                           /* the driver's own state */
    const char *condition; /* NULL, or added to every record as "condition" (e.g. "busy") */
} mwb_ctx;

/* A case prints its own table to stdout, emits one record per configuration and returns 0, or
 * prints the error to stderr and returns non-zero. */
typedef int (*mwb_case_fn)(mwb_ctx *ctx);

/* A new folder of this process's own (mode 0700, under $TMPDIR or /tmp) into dir, for files a
 * case writes and removes: a predictable name in /tmp could be a link another user planted.
 * 0, or -1 reported on stderr. mwb_private_dir_remove removes the folder and the file names
 * given (NULL-terminated), each relative to it. */
int mwb_private_dir(char *dir, size_t size);
void mwb_private_dir_remove(const char *dir, const char *const *names);

int mwb_case_linreg(mwb_ctx *ctx);
int mwb_case_reduce(mwb_ctx *ctx);
int mwb_case_scaling(mwb_ctx *ctx);
int mwb_case_gpt2(mwb_ctx *ctx);
int mwb_case_llmc(mwb_ctx *ctx);          /* llm.c-sized GPT-2 vs PyTorch on the same CPU */
int mwb_case_llama(mwb_ctx *ctx);         /* a Llama of that size vs PyTorch */
int mwb_case_profile(mwb_ctx *ctx);       /* where a step of it goes, per op */
int mwb_case_llama_profile(mwb_ctx *ctx); /* the same for the llama case */
int mwb_case_contention(mwb_ctx *ctx);    /* linreg and gpt2 with a competing busy process */
/* The gpt2 case on exactly these device specs (no defaults); its table and records. */
int mwb_gpt2_specs(mwb_ctx *ctx, const char *const *specs, int n);
int mwb_case_soak(mwb_ctx *ctx);
int mwb_case_parallel(mwb_ctx *ctx);  /* data, ZeRO-1, tensor and data x tensor parallelism */
int mwb_case_gpt2_124m(mwb_ctx *ctx); /* GPT-2 124M at T=1024 on a GPU: MFU */
int mwb_case_mpi(mwb_ctx *ctx);       /* all-reduce between processes vs threads (under mpirun) */
int mwb_case_sample(mwb_ctx *ctx);    /* sampling with and without the key/value cache */
int mwb_case_rowops(mwb_ctx *ctx);    /* RMS norm, rotary, SwiGLU kernels beside a copy */
int mwb_case_attention(mwb_ctx *ctx); /* the attention kernels, f32 and bf16 paths */
int mwb_case_tokenize(mwb_ctx *ctx);  /* GPT-2's tokenizer vs Hugging Face tokenizers, MB/s */
int mwb_case_pipeline(mwb_ctx *ctx);  /* every pipeline schedule vs gradient accumulation */

/* GPT-2 trained on a mesh, stepped by the caller (bench/gpt2_run.c; mwb_gpt2_make there takes
 * any model and batch): mwb_gpt2_new makes the tiny GPT-2 of the gpt2 case (batch 32 x 32,
 * AdamW, random windows of a generated corpus). On a mesh spanning processes every process
 * makes and steps it alike. Functions returning int return 0 on success and otherwise leave the
 * error in err. */
typedef struct mwb_gpt2 mwb_gpt2;
typedef struct mwb_gpt2_times {
    double ms, reduce_ms, update_ms; /* per step; reduce and update: device 0's mw_step_stats */
    int threads;                     /* that ran the last step (mw_step_stats) */
} mwb_gpt2_times;
struct mw_mesh;
int mwb_gpt2_new(struct mw_mesh *mesh, int blas_threads, mwb_gpt2 **out, char *err, size_t errlen);
/* n steps; out: their means. */
int mwb_gpt2_steps(mwb_gpt2 *m, int n, mwb_gpt2_times *out, char *err, size_t errlen);
void mwb_gpt2_free(mwb_gpt2 *m);

/* Monotonic time in seconds. */
double mwb_now(void);
/* Median of n values (v is left as it was: values paired by index stay paired). */
double mwb_median(const double *v, int n);

#endif
