/* Bench cases "llmc" and "profile": the GPT-2 of llm.c's CPU trainer (4 layers, 4 heads, 256
 * channels, context 256, vocab 256; 3.3M parameters), batch 8 x 256 tokens, AdamW with clipping.
 *
 * llmc: meshwit on cpu:1 and cpu:2 (plus any --devices) against PyTorch on the same CPU, 1 thread,
 * 2 threads and DDP (gloo) over 2 processes, through bench/peers/torch_gpt2.py run by the Python
 * in MESHWIT_PEER_PYTHON (default python3; the peers are skipped, visibly, when it cannot import
 * torch). The configurations take turns, ROUNDS rounds, and each row reports its median, so a
 * drifting machine affects every column alike; each PyTorch run is also compared with the meshwit
 * run just before it (cpu:1 for one thread, cpu:2 for two), and the median of those paired
 * ratios is printed. It also measures the single-core GEMM rates (1024^3: OpenBLAS's sgemm,
 * meshwit's f32 and bf16) at the start of every round and reports cpu:1's model FLOP/s as a
 * share of them, round by round, and the median of those shares.
 *
 * profile: where a cpu:1 step of the same model goes (and of each --devices spec), per op kind and
 * phase (mw_trainer_profile). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "gpt2_run.h"

#ifndef MWB_SOURCE_DIR
#define MWB_SOURCE_DIR "."
#endif

#define ROUNDS 5
#define MAX_CONFIGS 24

static void llmc_setup(mwb_gpt2_setup *s, const char *devices, int quick) {
    memset(s, 0, sizeof *s);
    s->model = (gpt2_config){.layers = 4,
                             .heads = 4,
                             .channels = 256,
                             .max_seq = 256,
                             .vocab = 256,
                             .padded_vocab = 256};
    s->batch = 8;
    s->seq = quick ? 64 : 256;
    s->devices = devices;
    s->warmup = quick ? 1 : 2;
    s->repeats = quick ? 1 : 3;
    s->steps = quick ? 1 : 2;
}

typedef struct column {
    char name[48];
    const char *devices; /* meshwit, or NULL for a peer */
    int bf16;            /* meshwit: --precision bf16; a peer: autocast */
    char peer_args[64];
    int ref; /* a peer: the meshwit column it is paired with */
    double ms[ROUNDS];
    int n;
} column;

/* Runs the PyTorch peer with extra arguments; its median ms/step, or 0 on failure. */
static double run_peer(const char *python, const char *script, const char *args) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' '%s' %s 2>/dev/null", python, script, args);
    FILE *p = popen(cmd, "r");
    if (!p) return 0.0;
    char line[1024], last[1024] = "";
    while (fgets(line, sizeof line, p)) snprintf(last, sizeof last, "%s", line);
    int rc = pclose(p);
    const char *v = strstr(last, "\"ms_per_step\":");
    return rc == 0 && v ? strtod(v + strlen("\"ms_per_step\":"), NULL) : 0.0;
}

static int have_torch(const char *python) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "'%s' -c 'import torch' >/dev/null 2>&1", python);
    return system(cmd) == 0;
}

static int add_column(column *cols, int *n, const char *name, const char *devices, int bf16,
                      const char *peer_args, int ref) {
    if (*n == MAX_CONFIGS) return -1;
    column *c = &cols[(*n)++];
    *c = (column){.devices = devices, .bf16 = bf16, .ref = ref};
    snprintf(c->name, sizeof c->name, "%s", name);
    snprintf(c->peer_args, sizeof c->peer_args, "%s", peer_args ? peer_args : "");
    return *n - 1;
}

/* A JSON row per line of r->kernels: what ran each kind of contraction and attention. */
static void emit_kernels(mwb_ctx *ctx, const char *name, const char *devices, int bf16,
                         const mwb_gpt2_result *r) {
    for (const char *p = r->kernels; *p;) {
        while (*p == ' ') p++;
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len > 0) {
            char line[96];
            snprintf(line, sizeof line, "%.*s", (int)len, p);
            mwb_record rec = {0};
            mwb_record_str(&rec, "case", name);
            mwb_record_str(&rec, "devices", devices);
            mwb_record_str(&rec, "mode", "kernels");
            mwb_record_str(&rec, "precision", bf16 ? "bf16" : "fp32");
            mwb_record_str(&rec, "kernel", line);
            ctx->emit(ctx, &rec);
        }
        if (!e) break;
        p = e + 1;
    }
}

/* llmc, or (llama given) the llama case: the same columns, rounds and pairing for a Llama-shaped
 * model of the same size, its PyTorch peer the same script's --llama model. */
static int llmc_like(mwb_ctx *ctx, const char *name_of_case, const llama_config *llama) {
    mwb_gpt2_setup s;
    llmc_setup(&s, "cpu:1", ctx->quick);
    s.llama = llama;
    char model_args[96] = "";
    if (llama)
        snprintf(model_args, sizeof model_args, " --llama --kv-heads %d --hidden %d --theta %g",
                 llama->kv_heads, llama->hidden, (double)llama->rope.theta);
    const char *python = getenv("MESHWIT_PEER_PYTHON");
    if (!python || !*python) python = "python3";
    char script[512];
    snprintf(script, sizeof script, "%s/bench/peers/torch_gpt2.py", MWB_SOURCE_DIR);
    int peers = !ctx->quick && have_torch(python);
    int precisions = ctx->precision ? ctx->precision : MWB_FP32 | MWB_BF16;

    /* meshwit cpu:1 and cpu:2 (and every --devices) in each precision; PyTorch beside them on
     * 1 and 2 threads and DDP over 2 processes, in f32 or under autocast, eager and (bf16) with
     * torch.compile; each PyTorch column is paired with the meshwit one of its thread count and
     * precision. */
    column cols[MAX_CONFIGS];
    int ncols = 0;
    const char *mine[MAX_CONFIGS] = {"cpu:1", "cpu:2"};
    int nmine = 2;
    for (int i = 0; i < ctx->ndevices && nmine < 4; i++) mine[nmine++] = ctx->devices[i];
    for (int bf16 = 0; bf16 < 2; bf16++) {
        if (!(precisions & (bf16 ? MWB_BF16 : MWB_FP32))) continue;
        const char *p = bf16 ? " bf16" : "", *a = bf16 ? " --bf16" : "";
        for (int i = 0; i < nmine; i++) {
            char name[48], args[192];
            snprintf(name, sizeof name, "meshwit %s%s", mine[i], p);
            int me = add_column(cols, &ncols, name, mine[i], bf16, NULL, 0);
            if (me < 0 || !peers || i > 1) continue;
            int threads = i + 1;
            snprintf(name, sizeof name, "pytorch %d thread%s%s", threads, threads > 1 ? "s" : "",
                     p);
            snprintf(args, sizeof args, "--threads %d%s%s", threads, a, model_args);
            add_column(cols, &ncols, name, NULL, bf16, args, me);
            if (bf16) {
                snprintf(name, sizeof name, "pytorch %d thread%s bf16 compile", threads,
                         threads > 1 ? "s" : "");
                snprintf(args, sizeof args, "--threads %d --bf16 --compile%s", threads, model_args);
                add_column(cols, &ncols, name, NULL, bf16, args, me);
            }
            if (threads == 2) {
                snprintf(name, sizeof name, "pytorch ddp gloo x2%s", p);
                snprintf(args, sizeof args, "--ddp 2%s%s", a, model_args);
                add_column(cols, &ncols, name, NULL, bf16, args, me);
            }
        }
    }
    int rounds = ctx->quick ? 1 : ROUNDS;
    if (llama)
        printf("a Llama of llm.c's GPT-2 size (L%d H%d, %d key/value heads, C%d, SwiGLU %d, "
               "rope theta %g, untied head, vocab %d; %lld parameters), batch %d x %d, AdamW + "
               "clipping; %d rounds, configurations in turn, median per row\n",
               llama->layers, llama->heads, llama->kv_heads, llama->channels, llama->hidden,
               (double)llama->rope.theta, llama->vocab, (long long)llama_num_params(llama), s.batch,
               s.seq, rounds);
    else
        printf("llm.c's GPT-2 (L%d H%d C%d, context %d, vocab %d; %lld parameters), batch %d x "
               "%d, AdamW + clipping; %d rounds, configurations in turn, median per row\n",
               s.model.layers, s.model.heads, s.model.channels, s.model.max_seq, s.model.vocab,
               (long long)gpt2_num_params(&s.model), s.batch, s.seq, rounds);
    if (!peers)
        printf("peers: %s\n", ctx->quick ? "skipped in --quick"
                                         : "skipped: MESHWIT_PEER_PYTHON (default python3) "
                                           "cannot import torch");
    printf("cpu: %s%s%s\n", mw_backend_describe("cpu"), *mw_backend_warning("cpu") ? "; " : "",
           mw_backend_warning("cpu"));
    /* The GEMM rates, measured again at the start of every round: a rate taken once, in a
     * fraction of a second, moved the model's share of it by a tenth between runs on a shared
     * machine; each round's share is taken against its own round's rate. */
    char impl32[96] = "", impl16[96] = "";
    double sgemm_r[ROUNDS] = {0}, gemm32_r[ROUNDS] = {0}, gemm16_r[ROUNDS] = {0};
    int failed = 0;
    for (int round = 0; round < rounds; round++) {
        if (!ctx->quick) {
            sgemm_r[round] = mwb_sgemm_gflops(1024);
            gemm32_r[round] = mwb_gemm_gflops(1024, MW_F32, impl32, sizeof impl32);
            gemm16_r[round] = mwb_gemm_gflops(1024, MW_BF16, impl16, sizeof impl16);
        }
        fflush(stdout);
        for (int c = 0; c < ncols; c++) {
            double ms = 0.0;
            if (cols[c].devices) {
                mwb_gpt2_result r;
                s.devices = cols[c].devices;
                s.precision = cols[c].bf16 ? MW_PRECISION_BF16 : MW_PRECISION_FP32;
                mwb_gpt2_measure(&s, &r);
                if (!r.ok) {
                    fprintf(stderr, "%s: %s: %s\n", name_of_case, cols[c].name, r.error);
                    failed = 1;
                    continue;
                }
                ms = r.ms;
                if (round == 0) {
                    mwb_print_kernels(cols[c].name, &r);
                    emit_kernels(ctx, name_of_case, cols[c].devices, cols[c].bf16, &r);
                }
            } else {
                char args[320];
                snprintf(args, sizeof args, "%s --batch %d --seq %d --steps %d", cols[c].peer_args,
                         s.batch, s.seq, s.repeats * s.steps);
                if ((ms = run_peer(python, script, args)) <= 0.0) {
                    fprintf(stderr, "%s: %s: the peer script failed (%s)\n", name_of_case,
                            cols[c].name, script);
                    continue;
                }
            }
            cols[c].ms[cols[c].n++] = ms;
        }
    }
    double sgemm = ctx->quick ? 0.0 : mwb_median(sgemm_r, rounds),
           gemm32 = ctx->quick ? 0.0 : mwb_median(gemm32_r, rounds),
           gemm16 = ctx->quick ? 0.0 : mwb_median(gemm16_r, rounds);
    double fpt = llama ? mwb_llama_flops_per_token(llama, s.seq)
                       : mwb_gpt2_flops_per_token(&s.model, s.seq),
           tokens = (double)s.batch * s.seq;
    /* The "vs" columns' meshwit cpu:1 and cpu:2: in f32, or in bf16 where f32 did not run */
    double ref_ms[2] = {0, 0}, ref16_ms[2] = {0, 0};
    for (int c = 0; c < ncols; c++) {
        if (!cols[c].n || !cols[c].devices) continue;
        double ms = mwb_median(cols[c].ms, cols[c].n), *ref = cols[c].bf16 ? ref16_ms : ref_ms;
        if (strcmp(cols[c].devices, "cpu:1") == 0) ref[0] = ms;
        if (strcmp(cols[c].devices, "cpu:2") == 0) ref[1] = ms;
    }
    for (int i = 0; i < 2; i++)
        if (ref_ms[i] <= 0) ref_ms[i] = ref16_ms[i];
    printf("%-30s %10s %10s %13s %14s %16s\n", "run", "ms/step", "tokens/s", "model GFLOP/s",
           "vs cpu:1 (x)", "vs cpu:2 (x)");
    for (int c = 0; c < ncols; c++) {
        if (!cols[c].n) continue;
        double ms = mwb_median(cols[c].ms, cols[c].n), gf = tokens / (ms * 1e-3) * fpt * 1e-9;
        printf("%-30s %10.1f %10.0f %13.1f %14.2f %16.2f\n", cols[c].name, ms, tokens / (ms * 1e-3),
               gf, ref_ms[0] > 0 ? ms / ref_ms[0] : NAN, ref_ms[1] > 0 ? ms / ref_ms[1] : NAN);
        mwb_record rec = {0};
        mwb_record_str(&rec, "case", name_of_case);
        mwb_record_str(&rec, "devices", cols[c].devices ? cols[c].devices : "-");
        mwb_record_str(&rec, "mode", cols[c].name);
        mwb_record_str(&rec, "precision", cols[c].bf16 ? "bf16" : "fp32");
        mwb_record_num(&rec, "batch", s.batch);
        mwb_record_num(&rec, "seq", s.seq);
        mwb_record_num(&rec, "rounds", cols[c].n);
        mwb_record_num(&rec, "ms_per_step", ms);
        mwb_record_num(&rec, "tokens_per_s", tokens / (ms * 1e-3));
        mwb_record_num(&rec, "model_gflops", gf);
        if (sgemm > 0) mwb_record_num(&rec, "sgemm_1core_gflops", sgemm);
        double rate = cols[c].bf16 ? gemm16 : gemm32;
        if (rate > 0 && cols[c].devices) mwb_record_num(&rec, "gemm_1core_gflops", rate);
        ctx->emit(ctx, &rec);
    }
    /* Paired: each PyTorch run against the meshwit run of the same round. */
    for (int c = 0; c < ncols; c++) {
        const column *p = &cols[c], *m = &cols[p->ref];
        if (p->devices || !p->n || p->n != rounds || m->n != rounds) continue;
        double ratio[ROUNDS];
        for (int r = 0; r < rounds; r++) ratio[r] = p->ms[r] / m->ms[r];
        double med = mwb_median(ratio, rounds);
        printf("%s vs %s, paired by round: meshwit %.2fx the tokens/s (rounds:", m->name, p->name,
               med);
        for (int r = 0; r < rounds; r++) printf(" %.2f", ratio[r]);
        printf(")\n");
        mwb_record rec = {0};
        mwb_record_str(&rec, "case", name_of_case);
        mwb_record_str(&rec, "devices", m->devices);
        mwb_record_str(&rec, "mode", "paired ratio");
        mwb_record_str(&rec, "precision", p->bf16 ? "bf16" : "fp32");
        mwb_record_str(&rec, "peer", p->name);
        mwb_record_num(&rec, "rounds", rounds);
        mwb_record_num(&rec, "ratio", med);
        ctx->emit(ctx, &rec);
    }
    if (sgemm > 0 || gemm32 > 0)
        printf("single-core GEMM 1024^3, median of %d rounds: OpenBLAS sgemm %.1f GFLOP/s; meshwit "
               "f32 %.1f (%s), bf16 %.1f (%s)\n",
               rounds, sgemm, gemm32, impl32, gemm16, impl16);
    for (int c = 0; c < ncols; c++) {
        if (ctx->quick || cols[c].n != rounds || !cols[c].devices ||
            strcmp(cols[c].devices, "cpu:1") != 0)
            continue;
        const double *rate = cols[c].bf16 ? gemm16_r : gemm32_r;
        double share[ROUNDS];
        for (int r = 0; r < rounds; r++)
            share[r] = rate[r] > 0 ? tokens / (cols[c].ms[r] * 1e-3) * fpt * 1e-9 / rate[r] : 0.0;
        double ms = mwb_median(cols[c].ms, cols[c].n), gf = tokens / (ms * 1e-3) * fpt * 1e-9;
        double med = mwb_median(share, rounds);
        printf("%s runs the model at %.1f GFLOP/s; its share of the %s GEMM rate, paired by "
               "round: %.0f%% (rounds:",
               cols[c].name, gf, cols[c].bf16 ? "bf16" : "f32", 100.0 * med);
        for (int r = 0; r < rounds; r++) printf(" %.0f", 100.0 * share[r]);
        printf(")\n");
        /* On a shared machine a round's step and the rate taken before it can meet different
         * neighbours (single rounds above 100 % were seen): the fastest step against the fastest
         * rate, each what the machine gives when nothing else runs, bounds the share more
         * steadily. */
        double best_ms = cols[c].ms[0], best_rate = rate[0];
        for (int r = 1; r < rounds; r++) {
            if (cols[c].ms[r] < best_ms) best_ms = cols[c].ms[r];
            if (rate[r] > best_rate) best_rate = rate[r];
        }
        double best = best_rate > 0 ? tokens / (best_ms * 1e-3) * fpt * 1e-9 / best_rate : 0.0;
        printf("%s: its fastest round (%.1f ms/step) against the fastest %s GEMM rate (%.1f "
               "GFLOP/s): %.0f%%\n",
               cols[c].name, best_ms, cols[c].bf16 ? "bf16" : "f32", best_rate, 100.0 * best);
        for (int fastest = 0; fastest < 2; fastest++) {
            mwb_record rec = {0};
            mwb_record_str(&rec, "case", name_of_case);
            mwb_record_str(&rec, "devices", cols[c].devices);
            mwb_record_str(&rec, "mode",
                           fastest ? "share of the GEMM rate, fastest against fastest"
                                   : "share of the GEMM rate");
            mwb_record_str(&rec, "precision", cols[c].bf16 ? "bf16" : "fp32");
            mwb_record_num(&rec, "rounds", rounds);
            if (fastest) {
                mwb_record_num(&rec, "ms_per_step", best_ms);
                mwb_record_num(&rec, "gemm_1core_gflops", best_rate);
            }
            mwb_record_num(&rec, "ratio", fastest ? best : med);
            ctx->emit(ctx, &rec);
        }
    }
    return failed;
}

int mwb_case_llmc(mwb_ctx *ctx) { return llmc_like(ctx, "llmc", NULL); }

/* The llama case's model: L4 H4 KV2 C256, SwiGLU 688, context 256, bytes. */
static void llama_bench_model(llama_config *c) {
    llama_preset("small", c);
    c->vocab = 256;
    c->rope.theta = 10000.0f;
}

int mwb_case_llama(mwb_ctx *ctx) {
    llama_config c;
    llama_bench_model(&c);
    return llmc_like(ctx, "llama", &c);
}

/* profile, or (llama given) llama-profile: the same table for the llama case's model. */
static int profile_like(mwb_ctx *ctx, const char *name_of_case, const llama_config *llama) {
    const char *specs[MAX_CONFIGS] = {"cpu:1"};
    int n = 1;
    for (int i = 0; i < ctx->ndevices && i < MAX_CONFIGS; i++) specs[i] = ctx->devices[i];
    if (ctx->ndevices) n = ctx->ndevices < MAX_CONFIGS ? ctx->ndevices : MAX_CONFIGS;
    int precisions = ctx->precision ? ctx->precision : MWB_FP32 | MWB_BF16;
    int failed = 0;
    for (int j = 0; j < 2 * n; j++) {
        int i = j / 2, bf16 = j % 2;
        if (!(precisions & (bf16 ? MWB_BF16 : MWB_FP32))) continue;
        mwb_gpt2_setup s;
        llmc_setup(&s, specs[i], ctx->quick);
        s.llama = llama;
        s.profile = 1;
        s.precision = bf16 ? MW_PRECISION_BF16 : MW_PRECISION_FP32;
        mwb_gpt2_result r;
        mwb_gpt2_measure(&s, &r);
        if (!r.ok) {
            fprintf(stderr, "%s: %s: %s\n", name_of_case, specs[i], r.error);
            failed = 1;
            continue;
        }
        int steps = s.repeats * s.steps;
        printf("%s, %s: %s, batch %d x %d: %.1f ms/step (median), per op over %d "
               "steps (per device):\n",
               specs[i], bf16 ? "bf16" : "fp32", llama ? "the llama case's model" : "llm.c's GPT-2",
               s.batch, s.seq, r.ms, steps);
        char who[64];
        snprintf(who, sizeof who, "%s %s", specs[i], bf16 ? "bf16" : "fp32");
        mwb_print_kernels(who, &r);
        emit_kernels(ctx, name_of_case, specs[i], bf16, &r);
        mwb_print_profile(&r, steps);
        for (int k = 0; k < r.nprofile; k++) {
            mwb_record rec = {0};
            mwb_record_str(&rec, "case", name_of_case);
            mwb_record_str(&rec, "devices", specs[i]);
            mwb_record_str(&rec, "precision", bf16 ? "bf16" : "fp32");
            mwb_record_str(&rec, "op", r.profile[k].op);
            mwb_record_str(&rec, "phase", r.profile[k].phase);
            mwb_record_num(&rec, "calls_per_step", (double)r.profile[k].calls / steps);
            mwb_record_num(&rec, "ms_per_step", r.profile[k].ms / steps);
            ctx->emit(ctx, &rec);
        }
        fflush(stdout);
    }
    return failed;
}

int mwb_case_profile(mwb_ctx *ctx) { return profile_like(ctx, "profile", NULL); }

int mwb_case_llama_profile(mwb_ctx *ctx) {
    llama_config c;
    llama_bench_model(&c);
    return profile_like(ctx, "llama-profile", &c);
}
