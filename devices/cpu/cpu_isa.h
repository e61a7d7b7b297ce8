/* Internal: what the CPU has and what the CPU kernels may use.
 *
 * MESHWIT_CPU_ISA = auto | sse2 | avx2 | avx512 | avx512_bf16 | amx caps the instructions:
 *   - the vector kernels (the files compiled once per level, cpu_levels.h) run at the widest of
 *     sse2 (x86-64), avx2 (x86-64-v3: AVX2 and FMA) and avx512 (x86-64-v4) that the CPU has and
 *     the cap allows, one level for the whole process, fixed when a CPU kernel or device first
 *     asks (so that every device of a process computes the same bits);
 *   - bf16 products run on bf16 instructions (AVX512-BF16, AMX, through oneDNN) only where the
 *     CPU has them and the cap is avx512_bf16 or amx, or with no cap where they are faster than
 *     f32 FMAs (mw__isa_bf16_dot_pays), decided per device when it starts;
 *   - oneDNN is capped alike, process-wide, from its first use on (cpu_dnnl.c). */
#ifndef MW__CPU_ISA_H
#define MW__CPU_ISA_H

typedef enum mw__isa {
    MW__ISA_SSE2,
    MW__ISA_AVX2,
    MW__ISA_AVX512,
    MW__ISA_AVX512_BF16,
    MW__ISA_AMX,
    MW__ISA_ANY /* no cap */
} mw__isa;

/* MESHWIT_CPU_ISA's value as a cap: MW__ISA_ANY for NULL, "" and "auto", -1 for a name that is
 * none of the levels. */
int mw__isa_cap(const char *value);

/* The names MESHWIT_CPU_ISA accepts, for messages: "auto, sse2, avx2, avx512, avx512_bf16 or
 * amx". */
#define MW__ISA_NAMES "auto, sse2, avx2, avx512, avx512_bf16 or amx"

/* The widest level the CPU has (MW__ISA_SSE2 .. MW__ISA_AMX), from /proc/cpuinfo (the baseline
 * elsewhere). */
mw__isa mw__isa_of_cpu(void);

/* Whether bf16 products run on bf16 instructions under cap: where the CPU has them and the cap
 * is avx512_bf16 or amx; with no cap (auto), only where they pay (mw__isa_bf16_dot_pays), else
 * bf16 operands are widened to f32. */
int mw__isa_bf16(int cap);

/* AVX512-BF16's dot products' multiply-add rate over the f32 FMAs', measured once per process on
 * the calling thread (about a millisecond); -1 where the CPU lacks them or has AMX. */
double mw__isa_bf16_dot_ratio(void);

/* The ratio at or above which bf16 products run on the dot products; below it, widened to f32
 * (measured: Zen 4 and Zen 5 about 2, Intel Xeon family 6 model 207 without AMX 0.5). */
#define MW__BF16_DOT_PAYS 0.8

/* Whether the CPU's bf16 instructions multiply faster than its f32 ones: AMX always, AVX512-BF16
 * where its ratio is at least MW__BF16_DOT_PAYS. */
int mw__isa_bf16_dot_pays(void);

/* The vector kernels' level for this process: 1 (sse2), 3 (avx2) or 4 (avx512); and its name. */
int mw__cpu_level(void);
const char *mw__cpu_vector_isa(void);

#endif
