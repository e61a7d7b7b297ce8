/* Internal: backends that are not always registered. */
#ifndef MW__MODULE_H
#define MW__MODULE_H

#include "meshwit/status.h"

/* Makes the backend called name available, registering it when this build has it. MW_OK when
 * the backend is now registered; MW_ERR_NOT_FOUND (no message) when no backend of that name
 * exists; MW_ERR_DEVICE with a message when this build lacks it. */
mw_status mw__module_for_backend(const char *name);

#endif
