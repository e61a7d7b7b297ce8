/* Internal: parameters sharded over mesh axes (tensor parallelism). A parameter whose axis is
 * labelled "Hidden@Y" is stored on each device as its box of the whole tensor: rows
 * [lo, lo + len) of that axis (mw__split_lo/len at the device's coordinate along Y), every row of
 * the others. The functions here move values between the devices' boxes and whole host arrays
 * (reads, writes, checkpoints, initial values) and add up the gradient norm so that every element
 * counts once. */
#ifndef MW__SHARDS_H
#define MW__SHARDS_H

#include <stdint.h>

#include "parallel/trainer_impl.h"

/* Which of a parameter's values a transfer moves. */
typedef enum mw__held {
    MW__HELD_PARAMS,  /* the parameter */
    MW__HELD_GRADS,   /* its (reduced) gradient */
    MW__HELD_MOMENT0, /* the optimizer's first moment (AdamW m, SGD's momentum buffer) */
    MW__HELD_MOMENT1  /* the second (AdamW v) */
} mw__held;

/* Non-zero when some axis of parameter p is split over a mesh axis. */
int mw__param_sharded(const mw_tensor *p);

/* Device d's box of a tensor of type t (a parameter, an output). */
void mw__type_box(const mw_trainer *tr, int d, const mw__type *t, mw__box *out);

/* Copies the box's elements [from, to) (counted row-major within the box) between `local`
 * (which holds exactly those elements) and the whole array `global`; to_global chooses the
 * direction. */
void mw__box_copy(const mw__box *b, int64_t from, int64_t to, float *local, float *global,
                  int to_global);

/* Moves `held` values of parameter p between the whole host array `global` (numel of p's global
 * type) and this process's devices: write scatters every device's box into it; read gathers the
 * boxes from as few devices as hold all of them (mw__param_reader). Moments and, with ZeRO-1,
 * gradients are read from and written to the devices that own them. A part that is one run of
 * the whole array moves directly, without a host copy. */
mw_status mw__param_transfer(mw_trainer *tr, const mw_tensor *p, mw__held held, float *global,
                             int write);

/* Writes the initial values of every local device's boxes of every parameter into dst[d - first]
 * (that device's flat parameter layout), drawing each parameter whole once, as a single device
 * would. */
mw_status mw__param_init_boxes(const mw_trainer *tr, float *const *dst);

/* The gradient norm of a trainer with sharded parameters: each device adds the squares of the
 * gradient elements it owns per parameter, the per-parameter partial sums are all-gathered, and
 * every device adds, parameter by parameter in leaf order and device by device in index order,
 * the partials of the devices that together hold each element once. */
mw_status mw__grad_norm_sharded(worker *w, float *norm);

/* The first of this process's devices (d itself when no earlier one) holding the same part of
 * parameter p's `held` values as device d: the same box of p, and with ZeRO-1 the same slice of
 * the moments or gradients. */
int mw__param_holder(const mw_trainer *tr, int d, const mw_tensor *p, mw__held held);

/* Device d holds some of p's `held` values and is their holder (mw__param_holder): reading each
 * such device once gathers the whole tensor. */
int mw__param_reader(const mw_trainer *tr, int d, const mw_tensor *p, mw__held held);

#endif
