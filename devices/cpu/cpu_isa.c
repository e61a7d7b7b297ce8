/* What the CPU has (its /proc/cpuinfo flags) and the level the vector kernels run at. */
#include "devices/cpu/cpu_isa.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static mw__isa cpu_isa = MW__ISA_SSE2;
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

/* Whether the flags line lists flag (a whole word). */
static int has_word(const char *line, const char *flag) {
    size_t n = strlen(flag);
    for (const char *p = strstr(line, flag); p; p = strstr(p + 1, flag))
        if ((p == line || p[-1] == ' ' || p[-1] == '\t') &&
            (p[n] == ' ' || p[n] == '\n' || p[n] == '\0'))
            return 1;
    return 0;
}

static int has_all(const char *line, const char *const *flags) {
    for (; *flags; flags++)
        if (!has_word(line, *flags)) return 0;
    return 1;
}

static void read_cpu(void) {
    /* The features of each level the kernels are compiled for (x86-64-v3, x86-64-v4), and the
     * bf16 instructions. */
    static const char *const v3[] = {"avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", NULL};
    static const char *const v4[] = {"avx512f",  "avx512bw", "avx512cd",
                                     "avx512dq", "avx512vl", NULL};
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return; /* not Linux: the baseline; oneDNN still checks for itself */
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0) continue;
        if (has_all(line, v3)) cpu_isa = MW__ISA_AVX2;
        if (cpu_isa == MW__ISA_AVX2 && has_all(line, v4)) cpu_isa = MW__ISA_AVX512;
        if (cpu_isa == MW__ISA_AVX512 && has_word(line, "avx512_bf16"))
            cpu_isa = MW__ISA_AVX512_BF16;
        if (cpu_isa >= MW__ISA_AVX512 && has_word(line, "amx_bf16")) cpu_isa = MW__ISA_AMX;
        break;
    }
    fclose(f);
}

mw__isa mw__isa_of_cpu(void) {
    pthread_once(&isa_once, read_cpu);
    return cpu_isa;
}

int mw__isa_cap(const char *v) {
    static const char *const names[] = {"sse2", "avx2", "avx512", "avx512_bf16", "amx"};
    if (!v || !*v || strcmp(v, "auto") == 0) return MW__ISA_ANY;
    for (int i = 0; i < 5; i++)
        if (strcmp(v, names[i]) == 0) return MW__ISA_SSE2 + i;
    return -1;
}

/* ---- whether AVX512-BF16's dot products pay ----------------------------------------------------
 * VDPBF16PS does twice an FMA's multiply-adds per instruction, but not every core issues it as
 * often: Zen 4 and Zen 5 run it as often as VFMADD231PS (twice the f32 rate), the Intel Xeons of
 * family 6 model 207 (AMX hidden by the hypervisor) a quarter as often (half the f32 rate; their
 * bf16 GEMMs ran at 78 GFLOP/s against 125 in f32). Timing twelve independent chains of each
 * instruction for a fraction of a millisecond tells which, without a table of CPU models. The
 * best of several alternating trials is kept (an interruption only slows a trial), and the
 * choice is far from the threshold on both kinds of CPU measured, so it does not flip between
 * runs; MESHWIT_CPU_ISA=avx512_bf16 or amx uses the bf16 instructions whatever the ratio. */

static double bf16_ratio = -1.0;
static pthread_once_t ratio_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__) && defined(__GNUC__)
static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define MW__CHAINS(op)                                                                             \
    op " %%zmm12, %%zmm13, %%zmm0\n\t" op " %%zmm12, %%zmm13, %%zmm1\n\t" op                       \
       " %%zmm12, %%zmm13, %%zmm2\n\t" op " %%zmm12, %%zmm13, %%zmm3\n\t" op                       \
       " %%zmm12, %%zmm13, %%zmm4\n\t" op " %%zmm12, %%zmm13, %%zmm5\n\t" op                       \
       " %%zmm12, %%zmm13, %%zmm6\n\t" op " %%zmm12, %%zmm13, %%zmm7\n\t" op                       \
       " %%zmm12, %%zmm13, %%zmm8\n\t" op " %%zmm12, %%zmm13, %%zmm9\n\t" op                       \
       " %%zmm12, %%zmm13, %%zmm10\n\t" op " %%zmm12, %%zmm13, %%zmm11\n\t"
#define MW__CLOBBERS                                                                               \
    "rcx", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",         \
        "xmm10", "xmm11", "xmm12", "xmm13", "cc"

/* Seconds for n rounds of twelve instructions (zeros in, so nothing overflows or goes subnormal:
 * the units' speed does not depend on the values). */
static double time_fma(long n) {
    double t = seconds();
    __asm__ volatile("vpxord %%zmm12, %%zmm12, %%zmm12\n\t"
                     "vpxord %%zmm13, %%zmm13, %%zmm13\n\t"
                     "mov %0, %%rcx\n\t"
                     "1:\n\t" MW__CHAINS("vfmadd231ps") "dec %%rcx\n\t"
                                                        "jnz 1b\n\t"
                     :
                     : "r"(n)
                     : MW__CLOBBERS);
    return seconds() - t;
}

static double time_dot(long n) {
    double t = seconds();
    __asm__ volatile("vpxord %%zmm12, %%zmm12, %%zmm12\n\t"
                     "vpxord %%zmm13, %%zmm13, %%zmm13\n\t"
                     "mov %0, %%rcx\n\t"
                     "1:\n\t" MW__CHAINS("vdpbf16ps") "dec %%rcx\n\t"
                                                      "jnz 1b\n\t"
                     :
                     : "r"(n)
                     : MW__CLOBBERS);
    return seconds() - t;
}

static void measure_ratio(void) {
    if (mw__isa_of_cpu() != MW__ISA_AVX512_BF16) return; /* AMX, or no bf16 instructions */
    const long n = 4096;                                 /* 49,152 instructions a trial */
    double fma = 1e30, dot = 1e30;
    for (int trial = 0; trial < 8; trial++) {
        double f = time_fma(n), d = time_dot(n);
        if (f < fma) fma = f;
        if (d < dot) dot = d;
    }
    /* multiply-adds per second: 16 per VFMADD231PS, 32 per VDPBF16PS */
    if (fma > 0 && dot > 0) bf16_ratio = (32.0 / dot) / (16.0 / fma);
}
#else
static void measure_ratio(void) {}
#endif

double mw__isa_bf16_dot_ratio(void) {
    pthread_once(&ratio_once, measure_ratio);
    return bf16_ratio;
}

int mw__isa_bf16_dot_pays(void) {
    mw__isa have = mw__isa_of_cpu();
    if (have == MW__ISA_AMX) return 1;
    return have == MW__ISA_AVX512_BF16 && mw__isa_bf16_dot_ratio() >= MW__BF16_DOT_PAYS;
}

int mw__isa_bf16(int cap) {
    mw__isa have = mw__isa_of_cpu();
    if (have != MW__ISA_AVX512_BF16 && have != MW__ISA_AMX) return 0;
    if (cap == MW__ISA_ANY) return mw__isa_bf16_dot_pays();
    return cap >= MW__ISA_AVX512_BF16;
}

static int level;
static pthread_once_t level_once = PTHREAD_ONCE_INIT;

static void choose_level(void) {
#ifdef MW__CPU_MULTILEVEL
    int cap = mw__isa_cap(getenv("MESHWIT_CPU_ISA"));
    int isa = (int)mw__isa_of_cpu();
    if (cap >= 0 && cap < isa) isa = cap; /* an unknown name is refused when a device starts */
    level = isa >= MW__ISA_AVX512 ? 4 : isa == MW__ISA_AVX2 ? 3 : 1;
#else
    level = 1; /* one build of the kernels for this architecture */
#endif
}

int mw__cpu_level(void) {
    pthread_once(&level_once, choose_level);
    return level;
}

const char *mw__cpu_vector_isa(void) {
    int l = mw__cpu_level();
#ifdef MW__CPU_MULTILEVEL
    return l == 4 ? "avx512" : l == 3 ? "avx2" : "sse2";
#else
    (void)l;
    return "generic";
#endif
}
