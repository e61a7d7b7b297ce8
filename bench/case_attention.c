/* The "attention" case: the fused causal attention kernels of a CPU device, forward and backward,
 * at llm.c's GPT-2 shapes (batch 8, 4 heads, T 256, head 64: qkv [Batch, Seq, Part, Head, D]) and
 * the llama case's grouped ones (2 key/value heads of 2 queries: [Batch, Seq, KvHead, Part, D]),
 * for each path the CPU has: f32 tiles; bf16 q, k, v on the default engine (AVX512-BF16
 * dot-product tiles where the CPU has them and no AMX, oneDNN with AMX, f32 tiles of widened
 * values without bf16 instructions); bf16 on oneDNN's matmuls (MESHWIT_CPU_GEMM=onednn). Medians
 * of repeated calls, the probabilities recomputed in the backward pass (as at long sequences),
 * and the GFLOP/s of the products a causal attention needs (the masked half not counted). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "devices/cpu/cpu.h"
#include "devices/device.h"
#include "meshwit.h"

typedef struct att_shape {
    const char *name;
    int64_t batch, t, kv, group, d; /* group 0: plain (Part = 3, kv heads = heads) */
} att_shape;

/* The kernel descriptor of shape s over qkv (dtype) and out, as the planner lays them out. */
static mw__k_attention descriptor(const att_shape *s, mw_dtype dtype, int grad) {
    int64_t parts = s->group ? s->group + 2 : 3, heads = s->kv, g = s->group ? s->group : 1;
    mw__k_attention k = {.causal = 1, .qkv_dtype = dtype, .scale = 0.125f, .t = s->t, .d = s->d};
    k.out_dtype = grad ? MW_F32 : dtype;
    k.group = g;
    k.block = s->t < MW__ATTN_BLOCK ? s->t : MW__ATTN_BLOCK;
    k.slices = s->batch * heads;
    k.walk.rank = 2;
    k.walk.dims[0] = s->batch, k.walk.dims[1] = heads;
    if (s->group) { /* [B, T, KvHead, Part, D]; out [B, T, KvHead, Group, D] */
        k.seq_qkv = heads * parts * s->d, k.part = s->d;
        k.walk.stride[1][0] = s->t * k.seq_qkv, k.walk.stride[1][1] = parts * s->d;
        k.seq_out = heads * g * s->d, k.out_group = s->d;
        k.walk.stride[0][0] = s->t * k.seq_out, k.walk.stride[0][1] = g * s->d;
    } else { /* [B, T, Part, Head, D]; out [B, T, Head, D] */
        k.seq_qkv = parts * heads * s->d, k.part = heads * s->d;
        k.walk.stride[1][0] = s->t * k.seq_qkv, k.walk.stride[1][1] = s->d;
        k.seq_out = heads * s->d, k.out_group = 0;
        k.walk.stride[0][0] = s->t * k.seq_out, k.walk.stride[0][1] = s->d;
    }
    k.scratch_elems = mw__attn_scratch_elems(&k, grad); /* the planner's */
    return k;
}

typedef struct att_result {
    double ms[2]; /* forward, backward; 0 when it did not run */
    char impl[2][96];
} att_result;

/* Both passes of shape s in dtype on a fresh device under MESHWIT_CPU_GEMM=engine. 0, or -1 when
 * the path is not this CPU's (impl_want given and not what ran) or a call failed. */
static int measure(const att_shape *s, mw_dtype dtype, const char *engine, const char *impl_want,
                   int reps, att_result *r) {
    memset(r, 0, sizeof *r);
    const char *old = getenv("MESHWIT_CPU_GEMM");
    char saved[32] = "";
    if (old) snprintf(saved, sizeof saved, "%s", old);
    if (engine) setenv("MESHWIT_CPU_GEMM", engine, 1);
    mw__device dev = {.vt = &mw__cpu_device, .name = "cpu:0"};
    int rc = dev.vt->init(&dev) == MW_OK ? 0 : -1;
    if (engine) old ? setenv("MESHWIT_CPU_GEMM", saved, 1) : unsetenv("MESHWIT_CPU_GEMM");
    if (rc) return -1;
    int64_t parts = s->group ? s->group + 2 : 3, g = s->group ? s->group : 1;
    int64_t nq = s->batch * s->t * s->kv * parts * s->d, no = s->batch * s->t * s->kv * g * s->d;
    size_t es = dtype == MW_BF16 ? 2 : 4;
    char *qkv = malloc((size_t)nq * es);
    float *out = malloc((size_t)nq * sizeof(float)), *gy = malloc((size_t)no * sizeof(float));
    for (int grad = 0; grad < 2 && rc == 0 && qkv && out && gy; grad++) {
        for (int64_t i = 0; i < nq; i++) { /* scores of a few units */
            float v = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
            if (dtype == MW_BF16) {
                uint32_t u;
                memcpy(&u, &v, sizeof u);
                ((uint16_t *)qkv)[i] = (uint16_t)(u >> 16);
            } else {
                ((float *)qkv)[i] = v;
            }
        }
        for (int64_t i = 0; i < no; i++) gy[i] = (float)((i * 31) % 100) / 100.0f - 0.5f;
        mw__k_attention k = descriptor(s, dtype, grad);
        k.qkv = qkv, k.out = out, k.gy = grad ? gy : NULL;
        k.scratch = malloc((size_t)k.scratch_elems * sizeof(float));
        if (!k.scratch ||
            (dev.vt->attention_prepare && dev.vt->attention_prepare(&dev, &k, grad))) {
            free(k.scratch);
            rc = -1;
            break;
        }
        int kind = grad ? MW__I_ATTENTION_GRAD : MW__I_ATTENTION;
        snprintf(r->impl[grad], sizeof r->impl[grad], "%s", dev.vt->describe(&dev, kind, &k));
        if (impl_want && !strstr(r->impl[grad], impl_want)) {
            free(k.scratch);
            rc = -1;
            break;
        }
        double t[31];
        if (reps > 31) reps = 31;
        for (int i = -1; i < reps && rc == 0; i++) {
            double t0 = mwb_now();
            if ((grad ? dev.vt->attention_grad : dev.vt->attention)(&dev, &k) != MW_OK) rc = -1;
            if (i >= 0) t[i] = mwb_now() - t0;
        }
        if (rc == 0) r->ms[grad] = mwb_median(t, reps) * 1e3;
        free(k.scratch);
    }
    dev.vt->shutdown(&dev);
    free(qkv), free(out), free(gy);
    return rc;
}

int mwb_case_attention(mwb_ctx *ctx) {
    att_shape shapes[2] = {{"llmc", 8, 256, 4, 0, 64}, {"llama", 8, 256, 2, 2, 64}};
    if (ctx->quick) shapes[0].t = shapes[1].t = 64, shapes[0].batch = shapes[1].batch = 2;
    struct {
        const char *name;
        mw_dtype dtype;
        const char *engine, *want;
    } paths[3] = {{"f32", MW_F32, NULL, NULL},
                  {"bf16", MW_BF16, NULL, NULL},
                  {"bf16 onednn", MW_BF16, "onednn", "onednn"}};
    int reps = ctx->quick ? 3 : 15, failed = 0;
    printf("%-6s %-12s %10s %10s %9s %9s  %s\n", "shape", "path", "fwd ms", "bwd ms", "fwd GF/s",
           "bwd GF/s", "kernel");
    for (int si = 0; si < 2; si++) {
        const att_shape *s = &shapes[si];
        /* the products of a causal attention: forward Q K^T and P V, backward five */
        double heads = (double)s->kv * (s->group ? s->group : 1);
        double fwd = 2.0 * 2.0 * s->batch * heads * (double)s->t * s->t / 2 * s->d, bwd = 2.5 * fwd;
        for (int p = 0; p < 3; p++) {
            att_result r;
            if (measure(s, paths[p].dtype, paths[p].engine, paths[p].want, reps, &r) != 0) {
                if (!paths[p].want) {
                    fprintf(stderr, "attention: %s %s failed: %s\n", s->name, paths[p].name,
                            mw_last_error());
                    failed = 1;
                }
                continue; /* oneDNN's path is not this CPU's (no bf16 instructions or no oneDNN) */
            }
            printf("%-6s %-12s %10.3f %10.3f %9.1f %9.1f  %s\n", s->name, paths[p].name, r.ms[0],
                   r.ms[1], fwd / (r.ms[0] * 1e6), bwd / (r.ms[1] * 1e6), r.impl[0]);
            mwb_record rec = {0};
            mwb_record_str(&rec, "case", "attention");
            mwb_record_str(&rec, "shape", s->name);
            mwb_record_str(&rec, "path", paths[p].name);
            mwb_record_str(&rec, "kernel", r.impl[0]);
            mwb_record_num(&rec, "forward_ms", r.ms[0]);
            mwb_record_num(&rec, "backward_ms", r.ms[1]);
            mwb_record_num(&rec, "forward_gflops", fwd / (r.ms[0] * 1e6));
            mwb_record_num(&rec, "backward_gflops", bwd / (r.ms[1] * 1e6));
            ctx->emit(ctx, &rec);
        }
    }
    fflush(stdout);
    return failed;
}
