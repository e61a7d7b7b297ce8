/* Parameter initialisers on a small, portable random stream (splitmix64). */
#include "core/init.h"

#include <math.h>
#include <string.h>

#include "core/hash.h"

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1): 53 random bits, never exactly 0. */
static double uniform01(uint64_t *s) {
    return ((double)(splitmix64(s) >> 11) + 0.5) / 9007199254740992.0;
}

void mw__param_init(const mw_graph *g, const mw_tensor *p, float *dst) {
    int64_t n = mw__type_numel(&p->type);
    uint64_t s = g->seed;
    s = mw__fnv1a(s, p->name, strlen(p->name));
    const float v = p->init.value;
    switch (p->init.kind) {
    case MW_INIT_KIND_ZEROS:
        for (int64_t i = 0; i < n; i++) dst[i] = 0.0f;
        break;
    case MW_INIT_KIND_CONST:
        for (int64_t i = 0; i < n; i++) dst[i] = v;
        break;
    case MW_INIT_KIND_UNIFORM:
        for (int64_t i = 0; i < n; i++) dst[i] = (float)((2.0 * uniform01(&s) - 1.0) * v);
        break;
    case MW_INIT_KIND_NORMAL:
        /* Box-Muller, both values used. */
        for (int64_t i = 0; i < n; i += 2) {
            double r = sqrt(-2.0 * log(uniform01(&s))), t = 6.283185307179586 * uniform01(&s);
            dst[i] = (float)(v * r * cos(t));
            if (i + 1 < n) dst[i + 1] = (float)(v * r * sin(t));
        }
        break;
    }
}
