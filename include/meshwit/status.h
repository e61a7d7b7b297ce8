/* meshwit: status codes and error messages.
 *
 * Every fallible call returns an mw_status: MW_OK (0) on success, a negative code on failure.
 * The code says what kind of failure it was; the message says exactly what went wrong (which
 * axis, shape, device or file). Library code never prints and never exits. */
#ifndef MESHWIT_STATUS_H
#define MESHWIT_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mw_status {
    MW_OK = 0,
    MW_ERR_INVALID = -1,     /* a bad argument: NULL where a value is required, a bad option */
    MW_ERR_SHAPE = -2,       /* axes or sizes that do not fit the op */
    MW_ERR_AXIS = -3,        /* an axis name that does not exist where it is used */
    MW_ERR_SHARDING = -4,    /* sharded mixed with unsharded, or a sharding that cannot be placed */
    MW_ERR_NOMEM = -5,       /* out of memory (host or device) */
    MW_ERR_DEVICE = -6,      /* a device spec that cannot be parsed or a device that failed */
    MW_ERR_IO = -7,          /* a file that cannot be opened, read or written */
    MW_ERR_FORMAT = -8,      /* a file whose contents are damaged or do not match */
    MW_ERR_UNSUPPORTED = -9, /* an op or dtype a backend does not implement */
    MW_ERR_ABORTED = -10,    /* a collective released because a peer failed */
    MW_ERR_TIMEOUT = -11,    /* a collective whose peers did not arrive in time */
    MW_ERR_NONFINITE = -12,  /* NaN or Inf where finite values were required */
    MW_ERR_STATE = -13,      /* a call that is not valid in the object's current state */
    MW_ERR_INTERRUPTED = -14, /* a stop was requested (mw_request_stop); nothing was changed */
    MW_ERR_NOT_FOUND = -15,   /* a parameter, output or tensor name that does not exist */
    MW_ERR_DTYPE = -16        /* a tensor of the wrong element type for the op or the call */
} mw_status;

/* A short, static description of a status code ("invalid argument", "shape mismatch", ...).
 * Unknown codes give "unknown error". Never NULL. */
const char *mw_strerror(mw_status status);

/* The symbolic name of a status code ("MW_ERR_SHAPE"). Never NULL. */
const char *mw_status_name(mw_status status);

/* The detailed message of the last failing meshwit call made on the calling thread, or "" when
 * none failed. Thread-local; valid until the next failing call on this thread. */
const char *mw_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
