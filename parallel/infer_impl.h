/* Internal: what white-box tests (the conformance table) read of an inference program. */
#ifndef MW__INFER_IMPL_H
#define MW__INFER_IMPL_H

#include "meshwit/infer.h"
#include "parallel/program.h"

/* The program an inference program runs (its graph and per-device plans); NULL for NULL. */
mw__program *mw__infer_program(mw_infer *inf);

#endif
