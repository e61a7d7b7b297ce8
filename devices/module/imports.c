/* Inside a module only: the core's internal functions that the module's sources call, over the
 * table the core passed to the module's entry point. Built with hidden visibility, so they never
 * stand in for the core's own. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "devices/module/imports.h"
#include "devices/module_abi.h"
#include "meshwit.h"

const mw__core_api *mw__core;

mw_status mw__module_check(const mw__core_api *core, const char *module) {
    if (!core || core->abi != MW__MODULE_ABI) return MW_ERR_UNSUPPORTED;
    mw__core = core;
    if (strcmp(core->version, MW__VERSION_STRING) != 0)
        return mw__error(MW_ERR_UNSUPPORTED, "%s is meshwit %s; the library loading it is %s",
                         module, MW__VERSION_STRING, core->version);
    return MW_OK;
}

mw_status mw__error(mw_status status, const char *fmt, ...) {
    char msg[MW__MSG_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return mw__core->error_copy(status, msg);
}

mw_status mw__error_copy(mw_status status, const char *msg) {
    return mw__core->error_copy(status, msg);
}

const char *mw_last_error(void) { return mw__core->last_error(); }

void *mw__malloc(size_t size) { return mw__core->malloc(size); }
void *mw__calloc(size_t n, size_t size) { return mw__core->calloc(n, size); }
void *mw__realloc(void *p, size_t size) { return mw__core->realloc(p, size); }
void *mw__aligned_alloc(size_t align, size_t size) { return mw__core->aligned_alloc(align, size); }
void mw__free(void *p) { mw__core->free(p); }
