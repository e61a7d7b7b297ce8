/* Internal, inside a module only: the core's table (devices/module_abi.h). */
#ifndef MW__MODULE_IMPORTS_H
#define MW__MODULE_IMPORTS_H

#include "devices/module_abi.h"

/* The table the core passed to this module's entry point (set by mw__module_check). */
extern const mw__core_api *mw__core;

/* Keeps core for this module when its abi and version match the module's; else
 * MW_ERR_UNSUPPORTED, with a message naming module when the table can carry one. */
mw_status mw__module_check(const mw__core_api *core, const char *module);

#endif
