/* Status names and the per-thread last-error message. */
#include "core/error.h"
#include "meshwit.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[MW__MSG_SIZE];

const char *mw_strerror(mw_status status) {
    switch (status) {
    case MW_OK: return "ok";
    case MW_ERR_INVALID: return "invalid argument";
    case MW_ERR_SHAPE: return "shape mismatch";
    case MW_ERR_AXIS: return "unknown axis";
    case MW_ERR_SHARDING: return "sharding mismatch";
    case MW_ERR_NOMEM: return "out of memory";
    case MW_ERR_DEVICE: return "device error";
    case MW_ERR_IO: return "I/O error";
    case MW_ERR_FORMAT: return "bad file format";
    case MW_ERR_UNSUPPORTED: return "unsupported";
    case MW_ERR_ABORTED: return "aborted by a failing peer";
    case MW_ERR_TIMEOUT: return "timed out";
    case MW_ERR_NONFINITE: return "non-finite value";
    case MW_ERR_STATE: return "invalid state";
    case MW_ERR_INTERRUPTED: return "interrupted";
    case MW_ERR_NOT_FOUND: return "not found";
    case MW_ERR_DTYPE: return "wrong dtype";
    }
    return "unknown error";
}

const char *mw_status_name(mw_status status) {
    switch (status) {
    case MW_OK: return "MW_OK";
    case MW_ERR_INVALID: return "MW_ERR_INVALID";
    case MW_ERR_SHAPE: return "MW_ERR_SHAPE";
    case MW_ERR_AXIS: return "MW_ERR_AXIS";
    case MW_ERR_SHARDING: return "MW_ERR_SHARDING";
    case MW_ERR_NOMEM: return "MW_ERR_NOMEM";
    case MW_ERR_DEVICE: return "MW_ERR_DEVICE";
    case MW_ERR_IO: return "MW_ERR_IO";
    case MW_ERR_FORMAT: return "MW_ERR_FORMAT";
    case MW_ERR_UNSUPPORTED: return "MW_ERR_UNSUPPORTED";
    case MW_ERR_ABORTED: return "MW_ERR_ABORTED";
    case MW_ERR_TIMEOUT: return "MW_ERR_TIMEOUT";
    case MW_ERR_NONFINITE: return "MW_ERR_NONFINITE";
    case MW_ERR_STATE: return "MW_ERR_STATE";
    case MW_ERR_INTERRUPTED: return "MW_ERR_INTERRUPTED";
    case MW_ERR_NOT_FOUND: return "MW_ERR_NOT_FOUND";
    case MW_ERR_DTYPE: return "MW_ERR_DTYPE";
    }
    return "MW_ERR_UNKNOWN";
}

const char *mw_last_error(void) { return last_error; }

mw_status mw__error(mw_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

mw_status mw__error_copy(mw_status status, const char *msg) {
    if (msg != last_error) {
        size_t n = strlen(msg);
        if (n >= sizeof last_error) n = sizeof last_error - 1;
        memmove(last_error, msg, n);
        last_error[n] = '\0';
    }
    return status;
}

#define MW__STR(x) #x
#define MW__VERSION(a, b, c) MW__STR(a) "." MW__STR(b) "." MW__STR(c)

const char *mw_version(void) {
    return MW__VERSION(MESHWIT_VERSION_MAJOR, MESHWIT_VERSION_MINOR, MESHWIT_VERSION_PATCH);
}
