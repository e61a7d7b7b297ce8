/* The CPU backend: host memory, oneDNN or OpenBLAS for contractions (cpu_gemm.c), plain C loops
 * (written so the compiler vectorises the contiguous cases) for everything else, one file per op
 * family (cpu_kernels.h). This file: the device's lifetime, memory and copies, the vtable, and
 * OpenBLAS's settings. Each virtual CPU device is one worker thread; BLAS and oneDNN run
 * single-threaded inside it (the trainer sets OpenBLAS's thread count; oneDNN's is set around
 * each primitive). */
#define _GNU_SOURCE /* sched_setaffinity */
#include <cblas.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "devices/cpu/cpu.h"
#include "devices/cpu/cpu_isa.h"
#include "devices/cpu/cpu_kernels.h"
#include "devices/cpu/cpu_state.h"
#include "devices/device.h"

/* Pins the calling worker to the index-th CPU this process may use, when there are at least as
 * many such CPUs as there are devices (oversubscribed devices are left to the scheduler). */
static void pin_to_core(int index, int ndevices) {
    cpu_set_t allowed, one;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
    int count = CPU_COUNT(&allowed);
    if (count < ndevices || count < 2) return;
    for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &allowed)) continue;
        if (seen++ == index % count) {
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);
            sched_setaffinity(0, sizeof one,
                              &one); /* best effort: an unpinned worker still works */
            return;
        }
    }
}

static mw_status cpu_init(mw__device *dev) {
    if (dev->pin > 0) pin_to_core(dev->index, dev->pin);
    return mw__cpu_state_init(dev);
}

static void cpu_shutdown(mw__device *dev) { mw__cpu_state_free(dev); }

static mw_status cpu_alloc(mw__device *dev, size_t bytes, void **out) {
    size_t n = (bytes + 63) / 64 * 64;
    *out = n ? mw__aligned_alloc(64, n) : NULL;
    if (n && !*out)
        return mw__error(MW_ERR_NOMEM, "%s: out of memory allocating %zu bytes", dev->name, n);
    return MW_OK;
}

static void cpu_free(mw__device *dev, void *p) {
    (void)dev;
    mw__free(p);
}

static mw_status cpu_memcpy(mw__device *dev, void *dst, const void *src, size_t bytes) {
    (void)dev;
    if (bytes) memcpy(dst, src, bytes);
    return MW_OK;
}

static mw_status cpu_sync(mw__device *dev) {
    (void)dev;
    return MW_OK;
}

const mw__device_vtable mw__cpu_device = {
    .kind = "cpu",
    .host_memory = 1,
    .rotary_attention = 1,
    .init = cpu_init,
    .shutdown = cpu_shutdown,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_memcpy,
    .download = cpu_memcpy,
    .sync = cpu_sync,
/* the instruction table's kernels (devices/device.h's MW__KERNELS), each mw__cpu_<name> */
#define SLOT_(KIND, name, type, dtypes, ROLES) .name = mw__cpu_##name,
    MW__KERNELS(SLOT_)
#undef SLOT_
        .gemm_prepare = mw__cpu_gemm_prepare,
#ifdef MESHWIT_HAVE_DNNL
    .attention_prepare = mw__cpu_attention_prepare,
#endif
    .sgd = mw__cpu_sgd,
    .sgd_momentum = mw__cpu_sgd_momentum,
    .adamw = mw__cpu_adamw,
    .sumsq = mw__cpu_sumsq,
    .describe = mw__cpu_describe,
    .workspace = mw__cpu_workspace,
};

int mw__cpu_set_blas_threads(int n) {
    int prev = openblas_get_num_threads();
    if (n > 0 && n != prev) openblas_set_num_threads(n);
    return prev;
}

/* OpenBLAS's core name ("Haswell"), "unknown" when it names none. */
static const char *blas_core(void) {
    const char *core = openblas_get_corename();
    return core ? core : "unknown";
}

const char *mw__cpu_backend_describe(void) {
    static char text[256];
    char bf16[96] = "";
#ifdef MESHWIT_HAVE_DNNL
    /* Where the CPU has AVX512-BF16 without AMX, whether bf16 products use it (cpu_isa.h). */
    double r = mw__isa_bf16_dot_ratio();
    if (r > 0)
        snprintf(bf16, sizeof bf16, ", bf16 dot products at %.2fx the f32 rate: %s", r,
                 r >= MW__BF16_DOT_PAYS ? "bf16 on them" : "bf16 widened to f32");
#endif
    snprintf(text, sizeof text, "OpenBLAS core %s, %s, vector loops (%s)%s", blas_core(),
#ifdef MESHWIT_HAVE_DNNL
             "oneDNN built in",
#else
             "no oneDNN",
#endif
             mw__cpu_vector_isa(), bf16);
    return text;
}

const char *mw__cpu_backend_warning(void) {
    static char msg[256];
    const char *core = blas_core();
    static const char *const wide[] = {"SkylakeX", "Cooperlake", "SapphireRapids", "Zen"};
    for (size_t i = 0; i < sizeof wide / sizeof *wide; i++)
        if (strstr(core, wide[i])) return "";
    if (mw__isa_of_cpu() < MW__ISA_AVX512) return ""; /* the CPU's flags (cpu_isa.c) */
#ifdef MESHWIT_HAVE_DNNL
    /* Contractions run on oneDNN, which picks its kernels from the CPU's features; OpenBLAS
     * only multiplies matrices by vectors. */
    const char *engine = getenv("MESHWIT_CPU_GEMM");
    if (!engine || strcmp(engine, "openblas") != 0) return "";
#endif
    snprintf(msg, sizeof msg,
             "OpenBLAS runs its generic %s kernels on a CPU with AVX-512; "
             "OPENBLAS_CORETYPE=SkylakeX selects the fast ones",
             core);
    return msg;
}
