/* Internal: what a sampler's draw chooses among, for the tests to compare with a reference. */
#ifndef MW__SAMPLE_H
#define MW__SAMPLE_H

#include <stdint.h>

#include "meshwit/sample.h"

/* A token a draw may pick and its weight: its probability times the sum of the kept weights. */
typedef struct mw__sample_entry {
    double weight;
    int32_t token;
} mw__sample_entry;

/* The tokens mw_sampler_draw would choose among for these logits, after temperature, top-k and
 * top-p, in the order the draw walks them (top-p: by falling weight, equal ones by rising id;
 * otherwise by rising id), into *kept (the sampler's scratch, valid until its next call), *n of
 * them, and the sum of their weights into *total; greedy (temperature 0): the one token, weight
 * 1. Uses no random number. Errors: those of mw_sampler_draw. */
mw_status mw__sampler_filter(mw_sampler *s, const float *logits, int vocab,
                             const mw__sample_entry **kept, int *n, double *total);

#endif
