/* Internal: data errors of kernels retold in the caller's terms (data_errors.c). */
#ifndef MW__DATA_ERRORS_H
#define MW__DATA_ERRORS_H

#include "parallel/program.h"

/* A kernel's MW_ERR_INVALID for an id or target out of range, retold with the value's global
 * coordinates in the input it came from; other errors are returned as they are. */
mw_status mw__explain_index_error(worker *w, const mw__ins *in, mw_status st);

#endif
