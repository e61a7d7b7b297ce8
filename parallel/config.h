/* Internal: the fields of the runtime's configurations, each listed once, and everything made from
 * the lists: the program's configuration (mw__program_config), the copies into it from a
 * trainer's and an inference program's configuration, the cross-process fingerprint and the
 * checks that the lists and the public structs agree.
 *
 * A row is XX(type, name, kind, share, range, note):
 *   kind   how the fingerprint prints it: I (an integer or enum), Z (a size), F (a float),
 *          S (a string, NULL printed as "(default)"), P (a pointer: never printed)
 *   share  SHARED: every process of a mesh must pass the same value (the fingerprint compares
 *          it); LOCAL: each process's own, for the reason in note (the headers say so too)
 *   range  (lo, hi, "the values expected"): an I field outside [lo, hi] is MW_ERR_INVALID, the
 *          message naming the field, its value and the text; MW__ANY: any value (a flag, where
 *          non-zero is on, or a field whose rules are its owner's: the optimizer's depend on
 *          its kind, mw__optimizer_resolve)
 * Every field's default is 0 (or NULL): a zeroed struct is the default configuration, and a
 * named constant spells each special value (MW_CPU_THREADS_AUTO, MW_BLAS_THREADS_KEEP, ...).
 * The lists follow the public structs' declaration order: mw_trainer_config is the optimizer,
 * then MW__RUNTIME_FIELDS, MW__TRAINING_RUNTIME_FIELDS and MW__TRAINER_FIELDS; mw_infer_config is
 * MW__INFER_FIELDS, then MW__RUNTIME_FIELDS. A field added to a struct and not to its list (or
 * the other way round) fails the build (config.c's static assertions). */
#ifndef MW__CONFIG_H
#define MW__CONFIG_H

#include <limits.h>
#include <stddef.h>

#include "meshwit/infer.h"
#include "meshwit/trainer.h"

#define MW__ANY (1, 0, "")

/* mw_optimizer's fields. */
#define MW__OPTIMIZER_FIELDS(XX)                                                                   \
    XX(mw_optimizer_kind, kind, I, SHARED, MW__ANY, "")                                            \
    XX(float, lr, F, SHARED, MW__ANY, "")                                                          \
    XX(float, beta1, F, SHARED, MW__ANY, "")                                                       \
    XX(float, beta2, F, SHARED, MW__ANY, "")                                                       \
    XX(float, eps, F, SHARED, MW__ANY, "")                                                         \
    XX(float, weight_decay, F, SHARED, MW__ANY, "")                                                \
    XX(float, grad_clip, F, SHARED, MW__ANY, "")                                                   \
    XX(int, warmup_steps, I, SHARED, MW__ANY, "")                                                  \
    XX(int, decay_steps, I, SHARED, MW__ANY, "")                                                   \
    XX(float, min_lr_ratio, F, SHARED, MW__ANY, "")                                                \
    XX(float, momentum, F, SHARED, MW__ANY, "")                                                    \
    XX(float, dampening, F, SHARED, MW__ANY, "")                                                   \
    XX(int, nesterov, I, SHARED, MW__ANY, "")                                                      \
    XX(mw_decay_rule, decay_rule, I, SHARED, MW__ANY, "")                                          \
    XX(mw_decay_fn, decays, P, LOCAL, MW__ANY,                                                     \
       "a function of this process; the parameters it decays are compared")                        \
    XX(voidp, decay_user, P, LOCAL, MW__ANY, "the decays function's own")

/* Every program's options: trainers' and inference programs' alike. */
#define MW__RUNTIME_FIELDS(XX)                                                                     \
    XX(mw_precision, precision, I, SHARED, (0, 1, "MW_PRECISION_FP32 or MW_PRECISION_BF16"), "")   \
    XX(int, cpu_threads, I, LOCAL,                                                                 \
       (-1, INT_MAX, "MW_CPU_THREADS_AUTO, MW_CPU_THREADS_PER_DEVICE or a thread count >= 1"),     \
       "how this process runs its devices; the same bits either way")                              \
    XX(mw_pinning, pin_threads, I, LOCAL, (0, 1, "MW_PIN_NONE or MW_PIN_CORES"),                   \
       "where this process's threads run; the same bits either way")                               \
    XX(int, blas_threads, I, LOCAL,                                                                \
       (-1, INT_MAX, "MW_BLAS_THREADS_ONE, MW_BLAS_THREADS_KEEP or a thread count >= 1"),          \
       "this process's BLAS threads; the same bits either way")                                    \
    XX(int, collective_timeout_ms, I, LOCAL,                                                       \
       (0, INT_MAX, "0 to wait forever, or milliseconds >= 1"),                                    \
       "how long this process waits for the others")

/* A training program's options beyond those. */
#define MW__TRAINING_RUNTIME_FIELDS(XX)                                                            \
    XX(size_t, bucket_bytes, Z, SHARED, MW__ANY, "")                                               \
    XX(mw_gathers, gathers, I, SHARED, (0, 1, "MW_GATHERS_AHEAD or MW_GATHERS_AT_USE"), "")        \
    XX(int, profile, I, LOCAL, MW__ANY, "timing only; the same bits either way")

/* The trainer's own. */
#define MW__TRAINER_FIELDS(XX)                                                                     \
    XX(mw_nonfinite, nonfinite, I, SHARED,                                                         \
       (0, 2, "MW_NONFINITE_STOP, MW_NONFINITE_SKIP or MW_NONFINITE_IGNORE"), "")                  \
    XX(mw_recompute, recompute, I, SHARED,                                                         \
       (0, 2, "MW_RECOMPUTE_NONE, MW_RECOMPUTE_BLOCKS or MW_RECOMPUTE_DOTS"), "")                  \
    XX(int, keep_gathered, I, SHARED, MW__ANY, "")                                                 \
    XX(int, grad_accumulation, I, SHARED, MW__ANY, "")                                             \
    XX(int, shard_optimizer, I, SHARED, MW__ANY, "")                                               \
    XX(int, check_replicas_every, I, SHARED, (0, INT_MAX, "0 for never, or a step count >= 1"),    \
       "")                                                                                         \
    XX(outputs_t, outputs, P, SHARED, MW__ANY, "compared as the nodes they are")                   \
    XX(int, noutputs, I, SHARED, (0, INT_MAX, "a count >= 0"), "")                                 \
    XX(cstring, pipeline_axis, S, SHARED, MW__ANY, "")                                             \
    XX(int, micro_batches, I, SHARED, (0, INT_MAX, "0 or a count >= 1"), "")                       \
    XX(mw_pipeline_schedule, pipeline_schedule, I, SHARED,                                         \
       (0, 3, "MW_SCHEDULE_GPIPE, _1F1B, _INTERLEAVED or _ZERO_BUBBLE"), "")                       \
    XX(int, virtual_stages, I, SHARED, (0, INT_MAX, "0, 1, or >= 2 for MW_SCHEDULE_INTERLEAVED"),  \
       "")

/* An inference program's own. */
#define MW__INFER_FIELDS(XX)                                                                       \
    XX(outputs_t, outputs, P, SHARED, MW__ANY, "compared as the nodes they are")                   \
    XX(int, noutputs, I, SHARED, MW__ANY, "")                                                      \
    XX(cstring, chunk_axis, S, SHARED, MW__ANY, "")

/* The types the lists name that have no single-word C spelling. */
typedef int (*mw_decay_fn)(const char *name, int rank, void *decay_user);
typedef void *voidp;
typedef mw_tensor *const *outputs_t;
typedef const char *cstring;

/* The options of a program (parallel/program.h): the runtime's, and a training program's. */
#define MW__CONFIG_MEMBER_(type, name, kind, share, range, note) type name;
typedef struct mw__program_config {
    MW__RUNTIME_FIELDS(MW__CONFIG_MEMBER_)
    MW__TRAINING_RUNTIME_FIELDS(MW__CONFIG_MEMBER_)
} mw__program_config;

/* The program's configuration of a trainer's (every runtime field) and of an inference
 * program's (its runtime fields; the training ones at their defaults). */
mw__program_config mw__program_config_of_trainer(const mw_trainer_config *c);
mw__program_config mw__program_config_of_infer(const mw_infer_config *c);

/* MW_OK, or MW_ERR_INVALID for the first field outside its range, as "caller: name is v
 * (expected ...)". The trainer's checks every runtime, training and trainer field; the inference
 * program's its own and the runtime's. */
mw_status mw__check_trainer_config(const mw_trainer_config *c, const char *caller);
mw_status mw__check_infer_config(const mw_infer_config *c, const char *caller);

/* Appends to buf (size bytes, always terminated) the fingerprint of a configuration: a line
 * "name value" per SHARED field, in list order ("optimizer.lr 0.001"), outputs as the graph
 * node ids they are. Returns the length it needed (as snprintf). */
size_t mw__describe_trainer_config(const mw_trainer_config *c, char *buf, size_t size);
size_t mw__describe_infer_config(const mw_infer_config *c, char *buf, size_t size);
/* The same, in memory the caller frees (mw__free); NULL when it ran out. */
char *mw__trainer_config_text(const mw_trainer_config *c);
char *mw__infer_config_text(const mw_infer_config *c);

#endif
