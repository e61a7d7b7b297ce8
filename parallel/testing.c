/* The test hooks (meshwit/testing.h): allocation failures (core/alloc.c), faults placed in a
 * trainer's step (the workers' fault fields, which parallel/executor.c fires) and the words of
 * a tokenizer (text/tokenizer.c). */
#include <stdarg.h>

#include "core/alloc.h"
#include "core/error.h"
#include "meshwit/testing.h"
#include "parallel/trainer_impl.h"
#include "text/tokenizer_impl.h"

/* The checks both fault hooks make: MW_OK, or MW_ERR_INVALID naming what is wrong. */
static mw_status injectable(const mw_trainer *tr, const char *hook, int device, mw_phase phase) {
    if (!tr) return mw__error(MW_ERR_INVALID, "%s: trainer is NULL", hook);
    if (device < 0 || device >= tr->prog->nworkers)
        return mw__error(MW_ERR_INVALID, "%s: device %d is not in [0, %d)", hook, device,
                         tr->prog->nworkers);
    if (phase < MW_PHASE_FORWARD || phase > MW_PHASE_UPDATE)
        return mw__error(MW_ERR_INVALID, "%s: phase %d is not an mw_phase", hook, (int)phase);
    if (device < tr->prog->first || device >= tr->prog->first + tr->prog->nlocal)
        return mw__error(MW_ERR_INVALID, "%s: device %d belongs to process %d", hook, device,
                         tr->prog->mesh->proc_of[device]);
    return MW_OK;
}

/* MW_TEST_FAULT (ms 0) and MW_TEST_STALL. */
static mw_status arm(mw_trainer *tr, int device, mw_phase phase, int64_t step, mw_status status,
                     int ms) {
    const char *hook = ms ? "MW_TEST_STALL" : "MW_TEST_FAULT";
    if (tr && tr->pipe) { /* on the device's first stage */
        int local = 0;
        mw_trainer *stage = tr->stage_of_device(tr, device, &local);
        if (!stage)
            return mw__error(MW_ERR_INVALID, "%s: device %d is not the pipeline's", hook, device);
        return arm(stage, local, phase, step, status, ms);
    }
    mw_status st = injectable(tr, hook, device, phase);
    if (st) return st;
    if (!ms && status == MW_OK)
        return mw__error(MW_ERR_INVALID, "%s: status MW_OK is no fault", hook);
    if (ms < 0 || (ms == 0 && status == MW_OK))
        return mw__error(MW_ERR_INVALID, "%s: ms is %d, not >= 1", hook, ms);
    worker *w = &tr->prog->w[device];
    w->fault_phase = phase;
    w->fault_step = step;
    w->fault_status = ms ? MW_OK : status;
    w->fault_ms = ms;
    w->fault_armed = 1;
    return MW_OK;
}

int64_t mw_test_control(mw_test_op op, ...) {
    va_list ap;
    va_start(ap, op);
    int64_t r = MW_OK;
    switch (op) {
    case MW_TEST_FAIL_ALLOCATION: mw__alloc_fail_at(va_arg(ap, int64_t)); break;
    case MW_TEST_ALLOCATIONS: r = mw__alloc_count(); break;
    case MW_TEST_FAULT:
    case MW_TEST_STALL: {
        mw_trainer *tr = va_arg(ap, mw_trainer *);
        int device = va_arg(ap, int);
        mw_phase phase = (mw_phase)va_arg(ap, int);
        int64_t step = va_arg(ap, int64_t);
        if (op == MW_TEST_FAULT) {
            mw_status status = (mw_status)va_arg(ap, int);
            r = arm(tr, device, phase, step, status, 0);
        } else {
            int ms = va_arg(ap, int);
            r = ms < 1 ? mw__error(MW_ERR_INVALID, "MW_TEST_STALL: ms is %d, not >= 1", ms)
                       : arm(tr, device, phase, step, MW_OK, ms);
        }
        break;
    }
    case MW_TEST_TOKENIZER_WORDS: {
        mw_tokenizer *tok = va_arg(ap, mw_tokenizer *);
        const char *text = va_arg(ap, const char *);
        size_t len = va_arg(ap, size_t);
        size_t *lens = va_arg(ap, size_t *);
        size_t cap = va_arg(ap, size_t);
        size_t *n = va_arg(ap, size_t *);
        r = mw__tokenizer_words(tok, text, len, lens, cap, n);
        break;
    }
    default: r = mw__error(MW_ERR_INVALID, "mw_test_control: op %d is not an mw_test_op", (int)op);
    }
    va_end(ap);
    return r;
}
