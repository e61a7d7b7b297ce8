/* Waiting without taking a peer's core (see wait.h). */
#define _GNU_SOURCE /* syscall, sched_getaffinity */
#include "collectives/wait.h"

#include <limits.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#define SPIN_NS_DEFAULT 50000 /* 50 us */
#define SPIN_NS_OVERSUBSCRIBED 2000

int mw__cores(void) {
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int64_t mw__spin_ns(int threads) {
    return threads > mw__cores() ? SPIN_NS_OVERSUBSCRIBED : SPIN_NS_DEFAULT;
}

uint32_t mw__event_prepare(mw__event *e) {
    atomic_fetch_add(&e->sleepers, 1);
    return atomic_load(&e->epoch);
}

void mw__event_cancel(mw__event *e) { atomic_fetch_sub(&e->sleepers, 1); }

void mw__event_sleep(mw__event *e, uint32_t seen, int64_t timeout_ns) {
#ifdef __linux__
    struct timespec ts = {(time_t)(timeout_ns / 1000000000), (long)(timeout_ns % 1000000000)};
    /* Returns at once when the epoch moved since prepare (no lost wake-up). */
    syscall(SYS_futex, (uint32_t *)&e->epoch, FUTEX_WAIT_PRIVATE, seen, timeout_ns > 0 ? &ts : NULL,
            NULL, 0);
#else
    (void)timeout_ns;
    if (atomic_load(&e->epoch) == seen) {
        struct timespec nap = {0, 20000};
        nanosleep(&nap, NULL);
    }
#endif
    atomic_fetch_sub(&e->sleepers, 1);
}

void mw__event_notify(mw__event *e) {
    atomic_fetch_add(&e->epoch, 1);
#ifdef __linux__
    if (atomic_load(&e->sleepers))
        syscall(SYS_futex, (uint32_t *)&e->epoch, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#endif
}
