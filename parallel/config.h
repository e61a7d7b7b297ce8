/* Internal: the fields of the runtime's configurations, each listed once, and everything made from
 * the lists: the program's configuration (mw__program_config), the copies into it from a
 * trainer's and an inference program's configuration, the cross-process fingerprint and the
 * checks that the lists and the public structs agree.
 *
 * A row is XX(type, name, kind, share, note):
 *   kind   how the fingerprint prints it: I (an integer or enum), Z (a size), F (a float),
 *          S (a string, NULL printed as "(default)"), P (a pointer: never printed)
 *   share  SHARED: every process of a mesh must pass the same value (the fingerprint compares
 *          it); LOCAL: each process's own, for the reason in note (the headers say so too)
 * The lists follow the public structs' declaration order: mw_trainer_config is the optimizer,
 * then MW__RUNTIME_FIELDS, MW__TRAINING_RUNTIME_FIELDS and MW__TRAINER_FIELDS; mw_infer_config is
 * MW__INFER_FIELDS, then MW__RUNTIME_FIELDS. A field added to a struct and not to its list (or
 * the other way round) fails the build (config.c's static assertions). */
#ifndef MW__CONFIG_H
#define MW__CONFIG_H

#include <stddef.h>

#include "meshwit/infer.h"
#include "meshwit/trainer.h"

/* mw_optimizer's fields. */
#define MW__OPTIMIZER_FIELDS(XX)                                                                   \
    XX(mw_optimizer_kind, kind, I, SHARED, "")                                                     \
    XX(float, lr, F, SHARED, "")                                                                   \
    XX(float, beta1, F, SHARED, "")                                                                \
    XX(float, beta2, F, SHARED, "")                                                                \
    XX(float, eps, F, SHARED, "")                                                                  \
    XX(float, weight_decay, F, SHARED, "")                                                         \
    XX(float, grad_clip, F, SHARED, "")                                                            \
    XX(int, warmup_steps, I, SHARED, "")                                                           \
    XX(int, decay_steps, I, SHARED, "")                                                            \
    XX(float, min_lr_ratio, F, SHARED, "")                                                         \
    XX(float, momentum, F, SHARED, "")                                                             \
    XX(float, dampening, F, SHARED, "")                                                            \
    XX(int, nesterov, I, SHARED, "")                                                               \
    XX(mw_decay_rule, decay_rule, I, SHARED, "")                                                   \
    XX(mw_decay_fn, decays, P, LOCAL,                                                              \
       "a function of this process; the parameters it decays are compared")                        \
    XX(voidp, decay_user, P, LOCAL, "the decays function's own")

/* Every program's options: trainers' and inference programs' alike. */
#define MW__RUNTIME_FIELDS(XX)                                                                     \
    XX(mw_precision, precision, I, SHARED, "")                                                     \
    XX(int, cpu_threads, I, LOCAL, "how this process runs its devices; the same bits either way")  \
    XX(int, pin_threads, I, LOCAL, "where this process's threads run; the same bits either way")   \
    XX(int, blas_threads, I, LOCAL, "this process's BLAS threads; the same bits either way")       \
    XX(int, collective_timeout_ms, I, LOCAL, "how long this process waits for the others")

/* A training program's options beyond those. */
#define MW__TRAINING_RUNTIME_FIELDS(XX)                                                            \
    XX(size_t, bucket_bytes, Z, SHARED, "")                                                        \
    XX(int, serial_gathers, I, SHARED, "")                                                         \
    XX(int, profile, I, LOCAL, "timing only; the same bits either way")

/* The trainer's own. */
#define MW__TRAINER_FIELDS(XX)                                                                     \
    XX(mw_nonfinite, nonfinite, I, SHARED, "")                                                     \
    XX(mw_recompute, recompute, I, SHARED, "")                                                     \
    XX(int, keep_gathered, I, SHARED, "")                                                          \
    XX(int, grad_accumulation, I, SHARED, "")                                                      \
    XX(int, shard_optimizer, I, SHARED, "")                                                        \
    XX(int, check_replicas_every, I, SHARED, "")                                                   \
    XX(outputs_t, outputs, P, SHARED, "compared as the nodes they are")                            \
    XX(int, noutputs, I, SHARED, "")

/* An inference program's own. */
#define MW__INFER_FIELDS(XX)                                                                       \
    XX(outputs_t, outputs, P, SHARED, "compared as the nodes they are")                            \
    XX(int, noutputs, I, SHARED, "")                                                               \
    XX(cstring, chunk_axis, S, SHARED, "")

/* The types the lists name that have no single-word C spelling. */
typedef int (*mw_decay_fn)(const char *name, int rank, void *decay_user);
typedef void *voidp;
typedef mw_tensor *const *outputs_t;
typedef const char *cstring;

/* The options of a program (parallel/program.h): the runtime's, and a training program's. */
#define MW__CONFIG_MEMBER_(type, name, kind, share, note) type name;
typedef struct mw__program_config {
    MW__RUNTIME_FIELDS(MW__CONFIG_MEMBER_)
    MW__TRAINING_RUNTIME_FIELDS(MW__CONFIG_MEMBER_)
} mw__program_config;

/* The program's configuration of a trainer's (every runtime field) and of an inference
 * program's (its runtime fields; the training ones at their defaults). */
mw__program_config mw__program_config_of_trainer(const mw_trainer_config *c);
mw__program_config mw__program_config_of_infer(const mw_infer_config *c);

/* Appends to buf (size bytes, always terminated) the fingerprint of a configuration: a line
 * "name value" per SHARED field, in list order ("optimizer.lr 0.001"), outputs as the graph
 * node ids they are. Returns the length it needed (as snprintf). */
size_t mw__describe_trainer_config(const mw_trainer_config *c, char *buf, size_t size);
size_t mw__describe_infer_config(const mw_infer_config *c, char *buf, size_t size);

#endif
