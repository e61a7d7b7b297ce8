/* Gangs of cooperative tasks on one thread (see fiber.h), on POSIX ucontext. Each task has its own
 * stack, mapped once with the gang (reserved, not committed: pages are touched only as deep as
 * the task's calls go) with a guard page below it. Switches go through the thread's own context:
 * task -> scheduler -> next task; the scheduler tests a parked task's readiness itself, so a task
 * that is not ready costs no switch. Under AddressSanitizer and ThreadSanitizer every switch is
 * announced to the sanitizer, which otherwise takes a task's stack for a corrupted one. */
#define _GNU_SOURCE /* MAP_ANONYMOUS, MAP_STACK, MAP_NORESERVE */
#include "collectives/fiber.h"

#include <stddef.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"

#if defined(__SANITIZE_ADDRESS__)
#define MW__FIBER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MW__FIBER_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define MW__FIBER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MW__FIBER_TSAN 1
#endif
#endif

#ifdef MW__FIBER_ASAN
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size);
void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old,
                                     size_t *size_old);
#endif
#ifdef MW__FIBER_TSAN
void *__tsan_get_current_fiber(void);
void *__tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void *fiber);
void __tsan_switch_to_fiber(void *fiber, unsigned flags);
#endif

/* A task's stack: deep enough for the kernels (BLAS included) and the collectives' chunk
 * buffers; only the pages a task touches are ever backed by memory. */
#define STACK_BYTES ((size_t)8 << 20)

typedef struct task {
    ucontext_t ctx;
    char *map; /* guard page, then the stack */
    char *stack;
    int done;
    void *arg;
    int (*ready)(void *); /* parked: the test that lets it resume; NULL: runnable */
    void *ready_arg;
    void *tsan;       /* the sanitizer's fiber */
    void *fake_stack; /* AddressSanitizer's fake stack of this task while it is switched out */
} task;

struct mw__gang {
    int capacity, n;
    mw__event *wake;
    int64_t spin_ns;
    task *t;
    size_t page;
    ucontext_t main; /* the thread's own context: the scheduler */
    int cur;         /* the running task, -1 in the scheduler */
    int unfinished;
    void (*fn)(void *);
    void *main_tsan;
    void *main_fake;
    const void *main_bottom; /* the thread's stack, for switches back to it */
    size_t main_size;
};

static _Thread_local mw__gang *active;

/* Sanitizer hooks around one switch: `before` in the context being left, towards the stack
 * [bottom, bottom + size); `after` first thing in the context that resumes. A context that ends
 * for good passes save == NULL. */
static void before(void **save, const void *bottom, size_t size, void *tsan_to) {
#ifdef MW__FIBER_ASAN
    __sanitizer_start_switch_fiber(save, bottom, size);
#else
    (void)save, (void)bottom, (void)size;
#endif
#ifdef MW__FIBER_TSAN
    __tsan_switch_to_fiber(tsan_to, 0);
#else
    (void)tsan_to;
#endif
}

static void after(void *save, const void **bottom_old, size_t *size_old) {
#ifdef MW__FIBER_ASAN
    __sanitizer_finish_switch_fiber(save, bottom_old, size_old);
#else
    (void)save, (void)bottom_old, (void)size_old;
#endif
}

static void trampoline(void) {
    mw__gang *g = active;
    task *t = &g->t[g->cur];
    after(NULL, &g->main_bottom, &g->main_size);
    g->fn(t->arg);
    t->done = 1;
    g->unfinished--;
    before(NULL, g->main_bottom, g->main_size, g->main_tsan);
    setcontext(&g->main); /* does not return: the scheduler never resumes a finished task */
}

mw_status mw__gang_new(int capacity, mw__event *wake, int64_t spin_ns, mw__gang **out) {
    *out = NULL;
    int n = capacity;
    mw__gang *g = mw__calloc(1, sizeof *g);
    task *t = mw__calloc((size_t)(n > 0 ? n : 1), sizeof *t);
    long page = sysconf(_SC_PAGESIZE);
    if (!g || !t || page <= 0) {
        mw__free(g);
        mw__free(t);
        return mw__error(MW_ERR_NOMEM, "out of memory making a gang of %d tasks", n);
    }
    g->capacity = g->n = n;
    g->wake = wake;
    g->spin_ns = spin_ns;
    g->t = t;
    g->page = (size_t)page;
    g->cur = -1;
    for (int i = 0; i < n; i++) {
        void *m = mmap(NULL, g->page + STACK_BYTES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
        if (m == MAP_FAILED || mprotect(m, g->page, PROT_NONE) != 0) {
            if (m != MAP_FAILED) munmap(m, g->page + STACK_BYTES);
            mw__gang_free(g);
            return mw__error(MW_ERR_NOMEM, "could not map a %zu MiB stack for task %d of %d",
                             STACK_BYTES >> 20, i, n);
        }
        t[i].map = m;
        t[i].stack = (char *)m + g->page;
#ifdef MW__FIBER_TSAN
        t[i].tsan = __tsan_create_fiber(0);
#endif
    }
    *out = g;
    return MW_OK;
}

void mw__gang_free(mw__gang *g) {
    if (!g) return;
    for (int i = 0; i < g->capacity; i++) {
        if (g->t[i].map) munmap(g->t[i].map, g->page + STACK_BYTES);
#ifdef MW__FIBER_TSAN
        if (g->t[i].tsan) __tsan_destroy_fiber(g->t[i].tsan);
#endif
    }
    mw__free(g->t);
    mw__free(g);
}

/* A fresh start of task t at the trampoline. Its own function: getcontext returns twice, and
 * the caller's loop variables must not live in a frame that does. */
__attribute__((noinline)) static void prepare(task *t, void *arg) {
    t->done = 0;
    t->arg = arg;
    t->ready = NULL;
    getcontext(&t->ctx);
    t->ctx.uc_stack.ss_sp = t->stack;
    t->ctx.uc_stack.ss_size = STACK_BYTES;
    t->ctx.uc_link = NULL;
    makecontext(&t->ctx, trampoline, 0);
}

static int any_ready(mw__gang *g) {
    for (int i = 0; i < g->n; i++)
        if (!g->t[i].done && (!g->t[i].ready || g->t[i].ready(g->t[i].ready_arg))) return 1;
    return 0;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Every unfinished task is parked and none is ready: they wait for another thread. Spins while
 * that thread is likely running, then sleeps until notified (a sleep is also cut short every
 * millisecond, for a deadline or a waker that does not know the gang's event). */
static void idle(mw__gang *g) {
    int64_t start = now_ns();
    for (unsigned spins = 0;; spins++) {
        if (any_ready(g)) return;
        if (spins % 64 != 63) {
            mw__cpu_relax();
            continue;
        }
        if (now_ns() - start < g->spin_ns) continue;
        if (!g->wake) {
            struct timespec nap = {0, 50000};
            nanosleep(&nap, NULL);
            continue;
        }
        uint32_t seen = mw__event_prepare(g->wake);
        if (any_ready(g)) {
            mw__event_cancel(g->wake);
            return;
        }
        mw__event_sleep(g->wake, seen, 1000000);
    }
}

void mw__gang_run(mw__gang *g, int n, void (*fn)(void *), void *const *args) {
    mw__gang *outer = active;
    active = g;
    g->fn = fn;
    g->n = n;
    g->unfinished = n;
#ifdef MW__FIBER_TSAN
    g->main_tsan = __tsan_get_current_fiber();
#endif
    for (int i = 0; i < n; i++) prepare(&g->t[i], args[i]);
    while (g->unfinished > 0) {
        int ran = 0;
        for (int i = 0; i < n; i++) {
            task *t = &g->t[i];
            if (t->done || (t->ready && !t->ready(t->ready_arg))) continue;
            t->ready = NULL;
            g->cur = i;
            before(&g->main_fake, t->stack, STACK_BYTES, t->tsan);
            swapcontext(&g->main, &t->ctx);
            after(g->main_fake, NULL, NULL);
            g->cur = -1;
            ran = 1;
        }
        if (!ran) idle(g);
    }
    active = outer;
}

int mw__gang_wait(int (*ready)(void *), void *arg) {
    mw__gang *g = active;
    if (!g || g->cur < 0 || g->unfinished < 2) return 0;
    task *t = &g->t[g->cur];
    t->ready = ready;
    t->ready_arg = arg;
    before(&t->fake_stack, g->main_bottom, g->main_size, g->main_tsan);
    swapcontext(&t->ctx, &g->main);
    after(t->fake_stack, NULL, NULL);
    return 1;
}
