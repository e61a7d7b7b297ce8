/* Internal: waiting for another thread without taking its core. A waiter spins briefly (a peer
 * that is running arrives within microseconds), then sleeps in the kernel until a notifier wakes
 * it (futex on Linux; short sleeps elsewhere). A sleeping waiter frees its core, so on a busy
 * machine the scheduler can run the peer it waits for there; the notifier pays a system call
 * only while someone sleeps.
 *
 * The protocol (an event count): the waiter calls mw__event_prepare, re-checks its condition,
 * and only then mw__event_sleep with the value prepare returned; the notifier changes the state,
 * then calls mw__event_notify. Either the waiter's re-check sees the change or the notifier sees
 * the sleeper (all accesses are sequentially consistent), so no wake-up is lost. */
#ifndef MW__WAIT_H
#define MW__WAIT_H

#include <stdatomic.h>
#include <stdint.h>

typedef struct mw__event {
    _Atomic uint32_t epoch;    /* bumped by every notify */
    _Atomic uint32_t sleepers; /* waiters between prepare and the end of their sleep */
} mw__event;

/* The cores this process may run on (its affinity mask; the online cores where that is unknown). */
int mw__cores(void);

/* How long a waiter spins before it sleeps: long enough to cover a peer that is running, short
 * enough that a peer waiting for this core loses little. Fewer cores than busy threads: less. */
int64_t mw__spin_ns(int threads);

/* CPU hint inside a spin loop. */
static inline void mw__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

uint32_t mw__event_prepare(mw__event *e);
/* Sleeps until notified (or a spurious wake-up, or timeout_ns > 0 passes); then the caller
 * re-checks. Ends the sleeper registration of prepare. */
void mw__event_sleep(mw__event *e, uint32_t seen, int64_t timeout_ns);
/* Ends a registration without sleeping (the re-check succeeded). */
void mw__event_cancel(mw__event *e);
void mw__event_notify(mw__event *e);

#endif
