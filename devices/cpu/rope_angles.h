/* Internal: the angles of rotary embeddings over positions offset .. offset + t - 1, for the rope
 * kernel and the attention that rotates q and k as it reads them (cpu_nn.c, cpu_attention.c):
 * per position its cosines, its sines and its sines negated (3 x dims / 2 floats), each made by
 * mw__rope_angles as the kernels made them at every call before, so the same bits. The device
 * keeps them (mw__cpu_table) once made: a training step's rotations, forward and backward, every
 * layer, share one table. Inlined into each level's kernels (rows.h). */
#ifndef MW__CPU_ROPE_ANGLES_H
#define MW__CPU_ROPE_ANGLES_H

#include <string.h>

#include "devices/cpu/cpu_state.h"
#include "devices/cpu/rows.h"

#define MW__ROPE_HALF_MAX 4096 /* dims / 2 (graph.h: at most 8192 features rotated) */

/* The table of rotation rot (its dims and frequencies) over t positions from offset: the
 * device's, or made into fallback (3 x dims / 2 x t floats) where it keeps none. */
MW__CPU_INLINE const float *mw__cpu_rope_table(mw__device *dev, const mw__k_rope *rot,
                                               int64_t offset, int64_t t, float *fallback) {
    const int half = rot->dims / 2;
    struct {
        char kind[8];
        mw__rope_freqs f;
        int64_t offset, t;
    } key;
    memset(&key, 0, sizeof key);
    memcpy(key.kind, "rope", 4);
    key.f.theta = rot->freqs.theta;
    key.f.factor = rot->freqs.factor;
    key.f.low = rot->freqs.low;
    key.f.high = rot->freqs.high;
    key.f.original = rot->freqs.original;
    key.f.dims = rot->freqs.dims;
    key.f.llama3 = rot->freqs.llama3;
    key.offset = offset;
    key.t = t;
    int fresh = 0;
    float *tab = mw__cpu_table(dev, &key, sizeof key, 3 * (int64_t)half * t, &fresh);
    if (tab && !fresh) return tab;
    if (!tab) tab = fallback;
    float freq[MW__ROPE_HALF_MAX];
    for (int j = 0; j < half; j++) freq[j] = mw__rope_freq(&rot->freqs, j);
    mw__k_rope fwd = *rot;
    fwd.inverse = 0;
    for (int64_t i = 0; i < t; i++) {
        float *c = tab + 3 * half * i;
        mw__rope_angles(&fwd, freq, offset + i, c, c + half);
        for (int j = 0; j < half; j++) c[2 * half + j] = -c[half + j];
    }
    return tab;
}

#endif
