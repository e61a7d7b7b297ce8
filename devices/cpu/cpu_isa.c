/* What the CPU has (its /proc/cpuinfo flags) and the level the vector kernels run at. */
#include "devices/cpu/cpu_isa.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int mw__isa_bf16(int cap) {
    mw__isa have = mw__isa_of_cpu();
    return (have == MW__ISA_AVX512_BF16 || have == MW__ISA_AMX) && cap >= MW__ISA_AVX512_BF16;
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
