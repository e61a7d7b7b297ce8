/* A CPU device's state (cpu_state.h): the environment's choices, oneDNN, the shared work buffer and
 * what prepared kernels own. */
#include "devices/cpu/cpu_state.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "devices/cpu/cpu_dnnl.h"
#include "devices/cpu/cpu_isa.h"
#include "devices/cpu/cpu_kernels.h"

/* Whether OpenBLAS runs kernels written for a vector unit at least as wide as AVX2 here. */
static int blas_tuned(void) {
    static const char *const tuned[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake",
                                        "SapphireRapids"};
    const char *core = openblas_get_corename();
    for (size_t i = 0; core && i < sizeof tuned / sizeof *tuned; i++)
        if (strstr(core, tuned[i])) return 1;
    return mw__isa_of_cpu() < MW__ISA_AVX2; /* nothing better exists for such a CPU */
}

mw_status mw__cpu_state_init(mw__device *dev) {
    const char *eng = getenv("MESHWIT_CPU_GEMM"), *isa = getenv("MESHWIT_CPU_ISA");
    int engine = !eng || !*eng || strcmp(eng, "auto") == 0 ? MW__ENGINE_AUTO
                 : strcmp(eng, "onednn") == 0              ? MW__ENGINE_ONEDNN
                 : strcmp(eng, "openblas") == 0            ? MW__ENGINE_OPENBLAS
                                                           : -1;
    if (engine < 0)
        return mw__error(MW_ERR_INVALID, "MESHWIT_CPU_GEMM=%s: expected auto, onednn or openblas",
                         eng);
    int cap = mw__isa_cap(isa);
    if (cap < 0)
        return mw__error(MW_ERR_INVALID, "MESHWIT_CPU_ISA=%s: expected " MW__ISA_NAMES, isa);
#ifndef MESHWIT_HAVE_DNNL
    if (engine == MW__ENGINE_ONEDNN)
        return mw__error(MW_ERR_UNSUPPORTED,
                         "MESHWIT_CPU_GEMM=onednn, but this meshwit was built without oneDNN "
                         "(MESHWIT_DNNL=OFF, or libdnnl-dev missing)");
#endif
    (void)mw__cpu_level(); /* the vector kernels' level, from this environment on */
    mw__cpu_state *s = mw__calloc(1, sizeof *s);
    if (!s) return mw__error(MW_ERR_NOMEM, "%s: out of memory", dev->name);
    s->engine = engine;
    s->cap = cap;
    s->blas_tuned = blas_tuned();
    mw_status st = MW_OK;
#ifdef MESHWIT_HAVE_DNNL
    if (engine != MW__ENGINE_OPENBLAS) {
        /* The cap binds oneDNN from its first use in the process on (a later, narrower one
         * still decides where bf16 runs: mw__isa_bf16). */
        if (cap != MW__ISA_ANY) (void)mw__dnnl_cap_isa(isa);
        st = mw__dnnl_new(&s->dnnl);
        if (st && st != MW_ERR_NOMEM && engine == MW__ENGINE_AUTO) st = MW_OK; /* OpenBLAS */
    }
#endif
    if (st) {
        mw__free(s);
        return st;
    }
    dev->impl = s;
    return MW_OK;
}

struct mw__cpu_table {
    struct mw__cpu_table *next;
    void *key;
    size_t key_bytes;
    int64_t floats;
    float *values;
};

float *mw__cpu_table(mw__device *dev, const void *key, size_t key_bytes, int64_t floats,
                     int *fresh) {
    mw__cpu_state *s = dev->impl;
    *fresh = 0;
    for (struct mw__cpu_table *t = s->tables; t; t = t->next)
        if (t->key_bytes == key_bytes && t->floats == floats && !memcmp(t->key, key, key_bytes))
            return t->values;
    if (s->ntables >= MW__CPU_TABLES || floats <= 0) return NULL;
    struct mw__cpu_table *t = mw__calloc(1, sizeof *t);
    if (t) t->key = mw__malloc(key_bytes);
    if (t && t->key) t->values = mw__aligned_alloc(64, (size_t)floats * sizeof(float));
    if (!t || !t->key || !t->values) {
        if (t) mw__free(t->key);
        mw__free(t);
        return NULL; /* the caller makes its own values */
    }
    memcpy(t->key, key, key_bytes);
    t->key_bytes = key_bytes;
    t->floats = floats;
    t->next = s->tables;
    s->tables = t;
    s->ntables++;
    *fresh = 1;
    return t->values;
}

void mw__cpu_state_free(mw__device *dev) {
    mw__cpu_state *s = dev ? dev->impl : NULL;
    if (!s) return;
    while (s->tables) {
        struct mw__cpu_table *t = s->tables;
        s->tables = t->next;
        mw__free(t->values);
        mw__free(t->key);
        mw__free(t);
    }
    for (int i = s->nowned - 1; i >= 0; i--) s->owned[i].free(s->owned[i].p);
    mw__free(s->owned);
    mw__free(s->work);
#ifdef MESHWIT_HAVE_DNNL
    mw__dnnl_free(s->dnnl);
#endif
    mw__free(s);
    dev->impl = NULL;
}

int mw__cpu_bf16_native(const mw__device *dev) {
#ifdef MESHWIT_HAVE_DNNL
    const mw__cpu_state *s = dev ? dev->impl : NULL;
    return mw__isa_bf16(s ? s->cap : mw__isa_cap(getenv("MESHWIT_CPU_ISA")));
#else
    (void)dev;
    return 0; /* only oneDNN's kernels use bf16 instructions */
#endif
}

mw_status mw__cpu_work_reserve(mw__device *dev, size_t need) {
    mw__cpu_state *s = dev->impl;
    if (need <= s->work_bytes) return MW_OK;
    void *p = mw__aligned_alloc(64, need);
    if (!p) return mw__error(MW_ERR_NOMEM, "out of memory for %zu bytes of kernel workspace", need);
    mw__free(s->work);
    s->work = p;
    s->work_bytes = need;
    return MW_OK;
}

void *mw__cpu_work(const mw__device *dev) { return ((const mw__cpu_state *)dev->impl)->work; }

struct mw__dnnl *mw__cpu_dnnl(const mw__device *dev) {
    const mw__cpu_state *s = dev ? dev->impl : NULL;
    return s ? s->dnnl : NULL;
}

mw_status mw__cpu_own(mw__device *dev, void *p, void (*free_fn)(void *p)) {
    mw__cpu_state *s = dev->impl;
    if (s->nowned == s->cap_owned) {
        int cap = s->cap_owned ? 2 * s->cap_owned : 32;
        mw__cpu_owned *o = mw__realloc(s->owned, (size_t)cap * sizeof *o);
        if (!o) {
            free_fn(p);
            return mw__error(MW_ERR_NOMEM, "%s: out of memory preparing a kernel", dev->name);
        }
        s->owned = o;
        s->cap_owned = cap;
    }
    s->owned[s->nowned++] = (mw__cpu_owned){p, free_fn};
    return MW_OK;
}

size_t mw__cpu_workspace(const mw__device *dev) {
    const mw__cpu_state *s = dev ? dev->impl : NULL;
    return s ? s->work_bytes : 0;
}
