/* Internal: backends and services built as separately loaded modules (devices/module_abi.h). */
#ifndef MW__MODULE_H
#define MW__MODULE_H

#include "devices/module_abi.h"
#include "meshwit/status.h"

/* Makes the backend called name available: loads and registers the module that provides it when
 * there is one and it is not loaded yet. MW_OK when the backend is now registered;
 * MW_ERR_NOT_FOUND (no message) when no module provides it; otherwise the module's failure with
 * a message naming its file: MW_ERR_DEVICE when this build has no such backend or the module (or
 * a library it needs, such as libcudart) cannot be loaded, MW_ERR_UNSUPPORTED when it is not
 * found or does not match this libmeshwit. */
mw_status mw__module_for_backend(const char *name);

/* The table of module id (the type mw__module_id names), loading the module the first time it
 * is asked for; NULL when this build does not make it, when it cannot be loaded (the reason is
 * then the last error) and, for the MPI module, in a process no MPI launcher started
 * (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK unset) that has not loaded it yet. The table lives
 * as long as the process. */
const void *mw__module_api(mw__module_id id);

/* The MPI module's table (mw__module_api(MW__MODULE_MPI)): loaded the first time it is asked for in
 * a process started by an MPI launcher (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK set); NULL
 * otherwise, and when this build has no MPI module or it cannot be loaded (the reason is then the
 * last error). */
const mw__dist_api *mw__dist(void);

/* Whether this build of meshwit makes the MPI module. */
int mw__dist_built(void);

/* Why the MPI module could not be loaded (its status, with the message again); MW_OK when it
 * loaded or was never needed. */
mw_status mw__dist_failure(void);

#endif
