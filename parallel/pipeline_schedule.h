/* Internal: pipeline-parallel schedules (GPipe, 1F1B, interleaved 1F1B, zero-bubble ZB-H1) as
 * per-device lists of forward and backward work, and a model of their idle time. Pure host code:
 * nothing here runs a device; a pipeline executor follows the lists, and a planner compares the
 * schedules' makespans and activation memory before choosing one.
 *
 * Stages: the model is cut into devices * chunks stages; device d holds stages d, d + devices,
 * d + 2 * devices, ... (its chunks 0, 1, 2, ...), so stage = chunk * devices + device, and
 * every boundary between two stages crosses devices when devices > 1 (Megatron's placement).
 *
 * Thread-safety: a schedule is plain data; functions only read it, except make and free. */
#ifndef MW__PIPELINE_SCHEDULE_H
#define MW__PIPELINE_SCHEDULE_H

#include "meshwit/mesh.h"
#include "meshwit/status.h"

typedef enum mw__pipe_sched {
    MW__PIPE_GPIPE = 0,
    MW__PIPE_1F1B = 1,
    MW__PIPE_INTERLEAVED = 2,
    MW__PIPE_ZERO_BUBBLE = 3
} mw__pipe_sched;

typedef enum mw__pipe_kind { MW__PIPE_F = 0, MW__PIPE_B = 1, MW__PIPE_W = 2 } mw__pipe_kind;

/* One unit of work of one device: the forward (F) or backward (B) of micro-batch `micro`
 * through the device's chunk `chunk` (virtual stage; the model's stage is
 * chunk * devices + device). In GPipe, 1F1B and interleaved, B is the whole backward (input and
 * weight gradients). In zero-bubble (ZB-H1 of Qi et al. 2023, "Zero Bubble Pipeline
 * Parallelism"), B is the input gradient only and W the weight gradient, which may be delayed to
 * fill bubbles. */
typedef struct mw__pipe_action {
    int kind, micro, chunk;
} mw__pipe_action;

typedef struct mw__pipe_schedule {
    int kind, devices, micro, chunks; /* chunks: virtual stages per device (1 except interleaved) */
    int nact[MW_MAX_DEVICES];         /* actions of each device */
    mw__pipe_action *act[MW_MAX_DEVICES]; /* per device, in the order it runs them (owned) */
} mw__pipe_schedule;

/* Makes the schedule `kind` for `devices` devices, `micro` micro-batches and `chunks` chunks per
 * device into *out (owned: mw__pipe_schedule_free). The orders:
 *
 * - GPipe: every device runs F of micro-batches 0..M-1, then B of 0..M-1 (the order of
 *   torch.distributed.pipelining's ScheduleGPipe; B in rising order lets the last device start
 *   backward with the micro-batch whose forward finished first). M micro-batches in flight.
 * - 1F1B (PipeDream-flush, Megatron's non-interleaved schedule): device d runs
 *   w = min(P-1-d, M) warm-up forwards, then M-w pairs F, B, then the w remaining B. At most
 *   min(P-d, M) micro-batches in flight.
 * - Interleaved 1F1B (Megatron's virtual pipeline, Narayanan et al. 2021): the device's M*V
 *   forwards go over its chunks in groups of P micro-batches (micro-batches 0..P-1 through chunk
 *   0, then through chunk 1, ..., then P..2P-1 through chunk 0, ...); backwards in the same
 *   order with the chunks reversed. Warm-up min((P-d-1)*2 + (V-1)*P, M*V) forwards, then pairs
 *   F, B, then the remaining B, as Megatron-LM's forward_backward_pipelining_with_interleaving.
 *   Megatron runs every forward first when M == P, for its send/receive pairing; here nothing
 *   deadlocks without that, so M == P keeps the warm-up above. Warm-up + 1 (at most M*V) chunk
 *   activations in flight.
 * - Zero-bubble ZB-H1: 1F1B's order of F and B (P-d forwards, then B, F pairs, then the last
 *   B), each W as soon as d others are pending on device d: W of micro-batch m follows B of
 *   m + d, and the last d run at the end, where 1F1B's device waits on the backward chain; so
 *   the last devices, which start that chain, pass each B on sooner. With F = B = W and M >= P
 *   the bubble is P-1 per device against 1F1B's 3(P-1). Activations in flight as 1F1B.
 *
 * 1F1B and ZB-H1 accept micro < devices: the first devices then run every forward before their
 * first backward, as GPipe does, which deadlocks nothing and only lengthens the bubble.
 *
 * Errors: MW_ERR_INVALID (out NULL; devices outside 1..MW_MAX_DEVICES; micro < 1; chunks < 1;
 * chunks != 1 except for interleaved; interleaved with chunks < 2 or micro not a multiple of
 * devices, Megatron's rule; a schedule too long to count in an int; an unknown kind),
 * MW_ERR_NOMEM. On failure *out holds no arrays (mw__pipe_schedule_free on it is harmless). */
mw_status mw__pipe_schedule_make(mw__pipe_sched kind, int devices, int micro, int chunks,
                                 mw__pipe_schedule *out);

/* Frees the action lists of s and zeroes it. NULL: no-op. */
void mw__pipe_schedule_free(mw__pipe_schedule *s);

/* The most micro-batches whose activations device d holds at once (F done, B not yet), over all
 * its chunks: a micro-batch in flight through two of its chunks counts twice, since each chunk
 * keeps its own activations. 0 for a NULL schedule or a device outside it. */
int mw__pipe_schedule_inflight(const mw__pipe_schedule *s, int d);

/* Simulates s with per-stage durations tf, tb, tw (arrays of devices * chunks, indexed by model
 * stage = chunk * devices + device; borrowed) and a transfer time `comm` per boundary crossing
 * between devices. Each device runs its actions in order, each as soon as the device is free and
 * its inputs are there:
 *   F of stage s > 0 after F of stage s-1 of the same micro-batch (+ comm),
 *   B of stage s < last after B of stage s+1 (+ comm), B of the last stage after its own F
 *   (every B also after its own stage's F, which it needs),
 *   W after the B of the same stage and micro-batch.
 * Durations: F costs tf[s]. In ZB-H1, B costs tb[s] (the input gradient) and W tw[s] (the
 * weight gradient; tw NULL: W costs 0 and tb is the whole backward). In the other schedules B is
 * the whole backward and costs tb[s] + tw[s] (tw NULL: tb[s]), so the same arrays compare the
 * schedules fairly.
 * Writes the makespan (from time 0 to the last action's end) to *total and, per device, the
 * fraction of it the device is idle, idle[d] = 1 - busy_d / makespan, to idle[0..devices-1]
 * (idle may be NULL; a makespan of 0 gives idle 0).
 * Errors: MW_ERR_INVALID (s, tf, tb or total NULL; a duration or comm negative or not finite; an
 * action out of range, repeated or missing, or a W in a schedule without split backwards, the
 * message naming the device and the action; an order that deadlocks, the message naming the
 * device, the action it is stuck at and what that waits for), MW_ERR_NOMEM. */
mw_status mw__pipe_schedule_simulate(const mw__pipe_schedule *s, const double *tf, const double *tb,
                                     const double *tw, double comm, double *total, double *idle);

#endif
