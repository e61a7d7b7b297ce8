/* Internal: recording error messages. */
#ifndef MW__ERROR_H
#define MW__ERROR_H

#include "meshwit/status.h"

#define MW__MSG_SIZE 512

/* Records a formatted message as the calling thread's mw_last_error() and returns `status`. */
mw_status mw__error(mw_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Sets the calling thread's last error to `msg` verbatim (a message carried over from another
 * thread) and returns `status`. */
mw_status mw__error_copy(mw_status status, const char *msg);

#endif
