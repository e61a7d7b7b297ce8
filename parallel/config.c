/* What the field lists of config.h make: the program's configuration of a trainer's or an
 * inference program's, the fingerprints of both, and the checks that the lists describe the
 * public structs field for field. */
#include "parallel/config.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/graph_impl.h"

/* --- the lists against the structs -------------------------------------------------------------
 *
 * A mirror of each public struct made from its lists, in their order, must have its size and
 * every field at its offset: a field added to either and not the other, or moved, fails here. */

#define MEMBER_(type, name, kind, share, range, note) type name;
#define SAME_PLACE_(type, name, kind, share, range, note)                                          \
    _Static_assert(offsetof(MIRROR, name) == offsetof(PUBLIC, name),                               \
                   "field " #name " is not where its list puts it (parallel/config.h)");

struct optimizer_mirror {
    MW__OPTIMIZER_FIELDS(MEMBER_)
};
#define MIRROR struct optimizer_mirror
#define PUBLIC mw_optimizer
MW__OPTIMIZER_FIELDS(SAME_PLACE_)
#undef MIRROR
#undef PUBLIC
_Static_assert(sizeof(struct optimizer_mirror) == sizeof(mw_optimizer),
               "mw_optimizer has a field MW__OPTIMIZER_FIELDS lacks (parallel/config.h)");

struct trainer_mirror {
    mw_optimizer optimizer;
    MW__RUNTIME_FIELDS(MEMBER_)
    MW__TRAINING_RUNTIME_FIELDS(MEMBER_)
    MW__TRAINER_FIELDS(MEMBER_)
};
#define MIRROR struct trainer_mirror
#define PUBLIC mw_trainer_config
MW__RUNTIME_FIELDS(SAME_PLACE_)
MW__TRAINING_RUNTIME_FIELDS(SAME_PLACE_)
MW__TRAINER_FIELDS(SAME_PLACE_)
#undef MIRROR
#undef PUBLIC
_Static_assert(sizeof(struct trainer_mirror) == sizeof(mw_trainer_config),
               "mw_trainer_config has a field its lists lack (parallel/config.h)");

struct infer_mirror {
    MW__INFER_FIELDS(MEMBER_)
    MW__RUNTIME_FIELDS(MEMBER_)
};
#define MIRROR struct infer_mirror
#define PUBLIC mw_infer_config
MW__INFER_FIELDS(SAME_PLACE_)
MW__RUNTIME_FIELDS(SAME_PLACE_)
#undef MIRROR
#undef PUBLIC
_Static_assert(sizeof(struct infer_mirror) == sizeof(mw_infer_config),
               "mw_infer_config has a field its lists lack (parallel/config.h)");

/* --- copies ----------------------------------------------------------------------------------- */

#define COPY_(type, name, kind, share, range, note) p.name = c->name;

mw__program_config mw__program_config_of_trainer(const mw_trainer_config *c) {
    mw__program_config p;
    memset(&p, 0, sizeof p);
    MW__RUNTIME_FIELDS(COPY_)
    MW__TRAINING_RUNTIME_FIELDS(COPY_)
    return p;
}

mw__program_config mw__program_config_of_infer(const mw_infer_config *c) {
    mw__program_config p;
    memset(&p, 0, sizeof p);
    MW__RUNTIME_FIELDS(COPY_)
    return p;
}

/* --- validation ------------------------------------------------------------------------------ */

#define CHECK_RANGE_(name, lo, hi, expected)                                                       \
    if ((lo) <= (hi) && ((long long)(int)c->name < (lo) || (long long)(int)c->name > (hi)))        \
        return mw__error(MW_ERR_INVALID, "%s: " #name " is %d (expected %s)", caller,              \
                         (int)c->name, expected);
#define CHECK_RANGE_OF_(name, range) CHECK_RANGE_ID_(name, MW__UNPACK_ range)
#define CHECK_RANGE_ID_(...) CHECK_RANGE_(__VA_ARGS__)
#define MW__UNPACK_(lo, hi, expected) lo, hi, expected
#define CHECK_I_(name, range) CHECK_RANGE_OF_(name, range)
#define CHECK_Z_(name, range)
#define CHECK_F_(name, range)
#define CHECK_S_(name, range)
#define CHECK_P_(name, range)
#define CHECK_(type, name, kind, share, range, note) CHECK_##kind##_(name, range)

mw_status mw__check_trainer_config(const mw_trainer_config *c, const char *caller) {
    MW__RUNTIME_FIELDS(CHECK_)
    MW__TRAINING_RUNTIME_FIELDS(CHECK_)
    MW__TRAINER_FIELDS(CHECK_)
    return MW_OK;
}

mw_status mw__check_infer_config(const mw_infer_config *c, const char *caller) {
    MW__INFER_FIELDS(CHECK_)
    MW__RUNTIME_FIELDS(CHECK_)
    return MW_OK;
}

/* --- fingerprints ------------------------------------------------------------------------------
 */

typedef struct out {
    char *buf;
    size_t size, len;
} out;

static void put(out *o, const char *prefix, const char *name, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static void put(out *o, const char *prefix, const char *name, const char *fmt, ...) {
    char value[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(value, sizeof value, fmt, ap);
    va_end(ap);
    char *at = o->len < o->size ? o->buf + o->len : NULL;
    int n = snprintf(at, at ? o->size - o->len : 0, "%s%s %s\n", prefix, name, value);
    o->len += n > 0 ? (size_t)n : 0;
}

#define SHARED 1
#define LOCAL 0
#define PRINT_I(name) put(o, prefix, #name, "%lld", (long long)c->name)
#define PRINT_Z(name) put(o, prefix, #name, "%zu", (size_t)c->name)
#define PRINT_F(name) put(o, prefix, #name, "%.9g", (double)c->name)
#define PRINT_S(name) put(o, prefix, #name, "%s", c->name ? c->name : "(default)")
#define PRINT_P(name) (void)0
#define DESCRIBE_(type, name, kind, share, range, note)                                            \
    if (share) PRINT_##kind(name);

static void describe_optimizer(out *o, const mw_optimizer *c) {
    const char *prefix = "optimizer.";
    MW__OPTIMIZER_FIELDS(DESCRIBE_)
}

static void describe_outputs(out *o, mw_tensor *const *outputs, int n) {
    for (int i = 0; i < n; i++)
        put(o, "", "output", "%d is node %d", i, outputs && outputs[i] ? outputs[i]->id : -1);
}

static size_t finish(out *o) {
    if (o->size) o->buf[o->len < o->size ? o->len : o->size - 1] = '\0';
    return o->len;
}

size_t mw__describe_trainer_config(const mw_trainer_config *c, char *buf, size_t size) {
    out w = {buf, size, 0}, *o = &w;
    const char *prefix = "";
    describe_optimizer(o, &c->optimizer);
    MW__RUNTIME_FIELDS(DESCRIBE_)
    MW__TRAINING_RUNTIME_FIELDS(DESCRIBE_)
    MW__TRAINER_FIELDS(DESCRIBE_)
    describe_outputs(o, c->outputs, c->noutputs);
    return finish(o);
}

size_t mw__describe_infer_config(const mw_infer_config *c, char *buf, size_t size) {
    out w = {buf, size, 0}, *o = &w;
    const char *prefix = "";
    MW__INFER_FIELDS(DESCRIBE_)
    MW__RUNTIME_FIELDS(DESCRIBE_)
    describe_outputs(o, c->outputs, c->noutputs);
    return finish(o);
}

static char *text_of(const mw_trainer_config *tc, const mw_infer_config *ic) {
    size_t n =
        tc ? mw__describe_trainer_config(tc, NULL, 0) : mw__describe_infer_config(ic, NULL, 0);
    char *s = mw__malloc(n + 1);
    if (!s) return NULL;
    if (tc)
        mw__describe_trainer_config(tc, s, n + 1);
    else
        mw__describe_infer_config(ic, s, n + 1);
    return s;
}

char *mw__trainer_config_text(const mw_trainer_config *c) { return text_of(c, NULL); }

char *mw__infer_config_text(const mw_infer_config *c) { return text_of(NULL, c); }
