/* meshwit: hooks for testing failure paths, through one entry point (as sqlite3_test_control).
 * Not for production use, and not included by meshwit.h: a test includes meshwit/testing.h.
 *
 * Thread-safety: the allocation hooks are process-wide and thread-safe; the trainer hooks are
 * called between steps, from the thread that drives the trainer. */
#ifndef MESHWIT_TESTING_H
#define MESHWIT_TESTING_H

#include <stdint.h>

#include <stddef.h>

#include "status.h"
#include "tokenizer.h"
#include "trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The phases of a step, as error messages name them and as a fault is placed in. */
typedef enum mw_phase {
    MW_PHASE_FORWARD = 0,
    MW_PHASE_FORWARD_COLLECTIVE, /* an all-reduce the SPMD rules put in the forward pass */
    MW_PHASE_BACKWARD,
    MW_PHASE_GRAD_REDUCE, /* the bucketed gradient all-reduce */
    MW_PHASE_UPDATE       /* the optimizer */
} mw_phase;

/* What mw_test_control does, and the arguments each takes after op, in this order and of these
 * exact types (they are read as variadic arguments: cast a constant, (int64_t)3):
 *
 *   MW_TEST_FAIL_ALLOCATION  (int64_t n): makes the n-th host allocation meshwit attempts from
 *       now on fail, once (n >= 1); n <= 0 disarms it. Every call that hits the failure returns
 *       MW_ERR_NOMEM and leaks nothing. Returns MW_OK.
 *   MW_TEST_ALLOCATIONS  (): returns the host allocations meshwit attempted since the last
 *       MW_TEST_FAIL_ALLOCATION (a count, >= 0).
 *   MW_TEST_FAULT  (mw_trainer *tr, int device, mw_phase phase, int64_t step, mw_status status):
 *       makes device `device` of tr fail with `status` when it reaches `phase` of step `step`
 *       (the value mw_trainer_steps has when that step starts), once. The step then returns
 *       `status` with a message naming the device, the phase and "injected fault"; every worker
 *       is released. On a mesh spanning processes, `device` must be one of this process's
 *       (mw_mesh_local_devices). Errors: MW_ERR_INVALID for a NULL trainer, a device out of
 *       range or of another process, a phase that is not an mw_phase, or status MW_OK.
 *   MW_TEST_STALL  (mw_trainer *tr, int device, mw_phase phase, int64_t step, int ms): makes the
 *       device stall for ms milliseconds there instead, once; with
 *       mw_trainer_config.collective_timeout_ms below ms its peers give up waiting and the step
 *       fails with MW_ERR_TIMEOUT. Errors: as MW_TEST_FAULT's, or ms < 1.
 *   MW_TEST_TOKENIZER_WORDS  (mw_tokenizer *tok, const char *text, size_t len, size_t *lens,
 *       size_t cap, size_t *n): the words the pre-tokenizer cuts text into, as
 *       mw_tokenizer_encode would give them to BPE (added tokens left out, the rest normalized):
 *       the length in bytes of each into lens[0, cap), their count into *n. Errors: as
 *       mw_tokenizer_encode's (MW_ERR_SHAPE when more than cap).
 *
 * Any other op: MW_ERR_INVALID. */
typedef enum mw_test_op {
    MW_TEST_FAIL_ALLOCATION = 0,
    MW_TEST_ALLOCATIONS = 1,
    MW_TEST_FAULT = 2,
    MW_TEST_STALL = 3,
    MW_TEST_TOKENIZER_WORDS = 4
} mw_test_op;

int64_t mw_test_control(mw_test_op op, ...);

/* "forward", "forward collective", "backward", "gradient reduction", "update"; "unknown phase"
 * for another value. */
const char *mw_phase_name(mw_phase phase);

#ifdef __cplusplus
}
#endif
#endif
