/* The dispatchers of the per-level CPU kernels (cpu_kernels.h): each runs the version compiled for
 * the process's vector level (cpu_isa.h). */
#include "devices/cpu/cpu_isa.h"
#include "devices/cpu/cpu_kernels.h"

#ifdef MW__CPU_MULTILEVEL
#define DISPATCH_S_(ret, name, params, args)                                                       \
    ret name params {                                                                              \
        switch (mw__cpu_level()) {                                                                 \
        case 4: return name##_v4 args;                                                             \
        case 3: return name##_v3 args;                                                             \
        default: return name##_v1 args;                                                            \
        }                                                                                          \
    }
#define DISPATCH_V_(name, params, args)                                                            \
    void name params {                                                                             \
        switch (mw__cpu_level()) {                                                                 \
        case 4: name##_v4 args; break;                                                             \
        case 3: name##_v3 args; break;                                                             \
        default: name##_v1 args; break;                                                            \
        }                                                                                          \
    }
#else /* one build of the kernels */
#define DISPATCH_S_(ret, name, params, args)                                                       \
    ret name params { return name##_v1 args; }
#define DISPATCH_V_(name, params, args)                                                            \
    void name params { name##_v1 args; }
#endif

#define DISPATCH_K_(KIND, name, type, dtypes, ROLES)                                               \
    MW__CPU_KERNEL_ENTRY_(DISPATCH_S_, KIND, name, type)
MW__KERNELS(DISPATCH_K_)
MW__CPU_EXTRA_ENTRIES(DISPATCH_S_, DISPATCH_V_)
