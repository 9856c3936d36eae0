/*
 * threads.c - the engine's fixed thread team.
 *
 * A team of n threads is the caller (index 0) plus n - 1 worker pthreads
 * created once. A run publishes a job and waits for it:
 *
 *   caller: fn, ctx = job; pending = n - 1; gen += 1 (release);
 *           wake sleeping workers; fn(ctx, 0, n);
 *           wait until pending == 0 (acquire)
 *   worker: wait until gen != seen (acquire); fn(ctx, i, n);
 *           pending -= 1 (release); the last one wakes a sleeping caller
 *
 * Synchronisation is carried by the atomics alone: the job fields are plain
 * data, written before the release increment of `gen` and read after the
 * acquire load that sees it; the next run writes them only after the
 * caller's acquire load saw `pending` reach 0, which every worker released
 * after its last read. So no lock is held on the fast path and ThreadSanitizer
 * sees every happens-before edge (it does not understand futexes, and does
 * not need to: they only put threads to sleep).
 *
 * Waiting spins first (about SPIN_NS of pause instructions: a decode step issues
 * runs back to back, microseconds apart) and then sleeps on a futex (a
 * mutex and condition variable off Linux). A sleeper announces itself in a
 * counter before re-checking the word it waits on, and a waker checks that
 * counter after changing the word; both sides are sequentially consistent,
 * so either the sleeper sees the change or the waker sees the sleeper (the
 * Dekker pattern), and the futex's own compare closes the last window. When
 * nobody sleeps, a run makes no system call at all.
 *
 * Oversubscribed teams (more threads than cores) stay correct and fast
 * enough: a thread that does not get its job within the spin budget sleeps
 * and gives its core to the threads that have work.
 *
 * A barrier inside a run (llmem__threads_barrier) is one atomic counter
 * per use: each thread adds 1 (acq_rel) and spins, then yields, until it
 * reads count (acquire). It never sleeps: every thread of the run already
 * has its job, so the wait is one phase's imbalance, not an idle team.
 *
 * A run allocates nothing; create allocates the team and its workers.
 */
#include "threads.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#include "internal.h"

/* Spin budget before sleeping: SPIN_NS of pause instructions, counted once
 * per process (spin_calibrate), so about a millisecond: longer than the
 * gap between the kernels of one step or between two steps, far shorter
 * than a scheduler time slice. A count of pauses alone is not a time: a
 * pause is about 20 ns on Zen 4 and 35-50 ns on Intel cores since
 * Skylake-SP. With 4000 of them (80 us on Zen 4, 180 us on this project's
 * Emerald Rapids VMs) the worker had often spun its budget out before the
 * first run of a prefill and slept, and woke milliseconds late: tiny-15m's
 * 11-token prefill at 2 threads took 3-10 ms in a quarter of the runs
 * instead of 1 ms (`llmem run --warmup`, 2026-12-06; none in 20 runs with
 * a budget of about 1 ms, none at 1 thread). The count is kept within
 * [SPIN_ITERS_MIN, SPIN_ITERS_MAX] whatever the probe measured (a probe
 * preempted midway reads slow). A team with more threads than online CPUs
 * spins SPIN_ITERS_OVER instead: there a spinner holds the core that the
 * thread it waits for needs. Both then yield the CPU a few times (cheap
 * when nobody else wants it, a hand-over when somebody does) before
 * sleeping. */
#define SPIN_NS 1000000u
#define SPIN_ITERS_MIN 4000u
#define SPIN_ITERS_MAX 200000u
#define SPIN_ITERS_OVER 64
#define YIELD_ITERS 16

#define CACHE_LINE 64

typedef struct worker {
    pthread_t id;
    llmem__threads *t;
    unsigned index;       /* 1 .. n-1 */
} worker;

struct llmem__threads {
    unsigned n;           /* threads in all, the caller included */
    unsigned spin;        /* pause iterations before yielding, then sleeping */
    worker *workers;      /* n - 1 of them */

    /* The job: plain data, published by the release increment of gen. */
    llmem__thread_fn fn;
    void *ctx;

    /* Run generation: the futex word workers wait on. */
    _Alignas(CACHE_LINE) uint32_t gen;
    uint32_t stop;        /* set before the final gen increment of destroy */
    uint32_t idle_sleepers; /* workers asleep (or about to be) on gen */

    /* Workers yet to finish the current run: the futex word the caller
     * waits on. On its own line: every worker writes it. */
    _Alignas(CACHE_LINE) uint32_t pending;
    uint32_t caller_sleeps; /* 1 while the caller sleeps (or is about to) on pending */

#ifndef __linux__
    pthread_mutex_t mu;
    pthread_cond_t cv;
#endif
};


static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static unsigned spin_iters = SPIN_ITERS_MIN; /* written once, under spin_once */
static pthread_once_t spin_once = PTHREAD_ONCE_INIT;

/* Pauses in SPIN_NS on this CPU: the time of a few thousand, once. */
static void spin_calibrate(void)
{
    enum { PROBE = 2000 };
    uint64_t t0 = llmem_time_now_ns();
    for (unsigned i = 0; i < PROBE; i++) cpu_relax();
    uint64_t dt = llmem_time_now_ns() - t0;
    uint64_t it = dt ? (uint64_t)SPIN_NS * PROBE / dt : SPIN_ITERS_MAX;
    spin_iters = (unsigned)(it < SPIN_ITERS_MIN ? SPIN_ITERS_MIN : it > SPIN_ITERS_MAX ? SPIN_ITERS_MAX : it);
}

/* Sleep while *word == val (may return early: callers loop). */
static void sleep_on(llmem__threads *t, uint32_t *word, uint32_t val)
{
#ifdef __linux__
    (void)t;
    syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
#else
    pthread_mutex_lock(&t->mu);
    while (__atomic_load_n(word, __ATOMIC_SEQ_CST) == val) pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
#endif
}

/* Wake every thread sleeping on word. */
static void wake_all(llmem__threads *t, uint32_t *word)
{
#ifdef __linux__
    (void)t;
    syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    (void)word;
    pthread_mutex_lock(&t->mu);
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
#endif
}

/* Wait until t->gen differs from seen; returns the new generation. */
static uint32_t wait_gen(llmem__threads *t, uint32_t seen)
{
    uint32_t g;
    for (unsigned i = 0; i < t->spin + YIELD_ITERS; i++) {
        g = __atomic_load_n(&t->gen, __ATOMIC_ACQUIRE);
        if (g != seen) return g;
        if (i < t->spin) cpu_relax();
        else sched_yield();
    }
    for (;;) {
        __atomic_add_fetch(&t->idle_sleepers, 1, __ATOMIC_SEQ_CST);
        g = __atomic_load_n(&t->gen, __ATOMIC_SEQ_CST);
        if (g == seen) sleep_on(t, &t->gen, seen);
        __atomic_sub_fetch(&t->idle_sleepers, 1, __ATOMIC_SEQ_CST);
        g = __atomic_load_n(&t->gen, __ATOMIC_ACQUIRE);
        if (g != seen) return g;
    }
}

static void *worker_main(void *p)
{
    const worker *w = p;
    llmem__threads *t = w->t;
    unsigned index = w->index;
    uint32_t seen = 0;
    for (;;) {
        seen = wait_gen(t, seen);
        if (__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE)) break;
        t->fn(t->ctx, index, t->n);
        if (__atomic_sub_fetch(&t->pending, 1, __ATOMIC_SEQ_CST) == 0 &&
            __atomic_load_n(&t->caller_sleeps, __ATOMIC_SEQ_CST))
            wake_all(t, &t->pending);
    }
    return NULL;
}

/* Caller side: wait for every worker of the current run. */
static void wait_done(llmem__threads *t)
{
    for (unsigned i = 0; i < t->spin + YIELD_ITERS; i++) {
        if (__atomic_load_n(&t->pending, __ATOMIC_ACQUIRE) == 0) return;
        if (i < t->spin) cpu_relax();
        else sched_yield();
    }
    for (;;) {
        __atomic_store_n(&t->caller_sleeps, 1, __ATOMIC_SEQ_CST);
        uint32_t p = __atomic_load_n(&t->pending, __ATOMIC_SEQ_CST);
        if (p != 0) sleep_on(t, &t->pending, p);
        __atomic_store_n(&t->caller_sleeps, 0, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&t->pending, __ATOMIC_ACQUIRE) == 0) return;
    }
}

/* Publish a new generation and wake sleeping workers. */
static void publish(llmem__threads *t)
{
    __atomic_add_fetch(&t->gen, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&t->idle_sleepers, __ATOMIC_SEQ_CST)) wake_all(t, &t->gen);
}

/* Stop and join the first `started` workers. */
static void stop_workers(llmem__threads *t, unsigned started)
{
    if (started == 0) return;
    __atomic_store_n(&t->stop, 1, __ATOMIC_RELEASE);
    publish(t);
    for (unsigned i = 0; i < started; i++) pthread_join(t->workers[i].id, NULL);
}

llmem_status llmem__threads_create(unsigned n, llmem__threads **out)
{
    if (!out) return llmem__fail(LLMEM_EINVAL, "threads: out is NULL");
    *out = NULL;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus < 1) cpus = 1;
    if (n == 0) n = (unsigned)(cpus < 1024 ? cpus : 1024);
    if (n > 4096) return llmem__fail(LLMEM_EINVAL, "threads: team of %u threads is too large (at most 4096)", n);
    llmem__threads *t;
    if (posix_memalign((void **)&t, CACHE_LINE, sizeof *t) != 0)
        return llmem__fail(LLMEM_ENOMEM, "threads: out of memory for a team of %u", n);
    memset(t, 0, sizeof *t);
    t->n = n;
    pthread_once(&spin_once, spin_calibrate);
    t->spin = (long)n > cpus ? SPIN_ITERS_OVER : spin_iters;
#ifndef __linux__
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
#endif
    if (n > 1) {
        t->workers = malloc((size_t)(n - 1) * sizeof *t->workers);
        if (!t->workers) {
            llmem__threads_destroy(t);
            return llmem__fail(LLMEM_ENOMEM, "threads: out of memory for %u workers", n - 1);
        }
    }
    for (unsigned i = 1; i < n; i++) {
        worker *w = &t->workers[i - 1];
        w->t = t;
        w->index = i;
        int err = pthread_create(&w->id, NULL, worker_main, w);
        if (err) {
            stop_workers(t, i - 1);
            free(t->workers);
            t->workers = NULL;
#ifndef __linux__
            pthread_cond_destroy(&t->cv);
            pthread_mutex_destroy(&t->mu);
#endif
            free(t);
            return llmem__fail(err == EAGAIN ? LLMEM_ENOMEM : LLMEM_EOS, "threads: cannot start worker %u of %u (%s)",
                               i, n, strerror(err));
        }
    }
    *out = t;
    return LLMEM_OK;
}

void llmem__threads_destroy(llmem__threads *t)
{
    if (!t) return;
    if (t->workers) stop_workers(t, t->n - 1);
    free(t->workers);
#ifndef __linux__
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
#endif
    free(t);
}

unsigned llmem__threads_count(const llmem__threads *t) { return t ? t->n : 1; }

void llmem__threads_run(llmem__threads *t, llmem__thread_fn fn, void *ctx)
{
    if (!t || t->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    t->fn = fn;
    t->ctx = ctx;
    __atomic_store_n(&t->pending, t->n - 1, __ATOMIC_RELAXED);
    publish(t); /* release: orders fn, ctx and pending before the workers' reads */
    fn(ctx, 0, t->n);
    wait_done(t);
}

void llmem__threads_split(size_t total, size_t grain, unsigned index, unsigned count, size_t *lo, size_t *hi)
{
    if (grain == 0) grain = 1;
    if (count == 0) count = 1;
    if (index >= count) {
        *lo = *hi = total;
        return;
    }
    /* Whole grains, spread so that part sizes differ by at most one grain:
     * the last `extra` parts take one more, so the part that ends in the
     * partial grain is one of the larger ones. */
    size_t grains = total / grain + (total % grain != 0);
    size_t base = grains / count, extra = grains % count, first = count - extra;
    size_t g0 = (size_t)index * base + (index > first ? index - first : 0);
    size_t g1 = g0 + base + (index >= first);
    /* g0 <= g1 <= grains; only the last grain may be partial (and
     * grains * grain may exceed SIZE_MAX when total is close to it). */
    *lo = g0 == grains ? total : g0 * grain;
    *hi = g1 == grains ? total : g1 * grain;
}

void llmem__threads_barrier(const llmem__threads *t, uint32_t *arrived, unsigned count)
{
    if (count <= 1) return;
    unsigned spin = t ? t->spin : SPIN_ITERS_OVER;
    __atomic_add_fetch(arrived, 1, __ATOMIC_ACQ_REL);
    /* Every thread of a run has its job (the caller's wait_done needs them
     * all), so the wait is bounded by the slowest one's phase; the yields
     * give an oversubscribed core to the thread still working. */
    for (unsigned i = 0; __atomic_load_n(arrived, __ATOMIC_ACQUIRE) < count; i++) {
        if (i < spin) cpu_relax();
        else sched_yield();
    }
}
