/*
 * status.c - status names, the per-thread last error, logging, version.
 *
 * The last error is a thread-local buffer written only on failure paths, so
 * successful calls pay nothing. The log sink is process-wide and read with
 * acquire loads, so installing a sink while other threads log is safe; the
 * sink and its user pointer are published together behind one pointer.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <stdlib.h>
#include <unistd.h>

#include "debug.h"
#include "internal.h"
#include "llmem/version.h"

static const struct {
    const char *name;
    const char *text;
} status_table[LLMEM_STATUS_COUNT_] = {
    [LLMEM_OK] = {"LLMEM_OK", "success"},
    [LLMEM_EINVAL] = {"LLMEM_EINVAL", "invalid argument"},
    [LLMEM_EOVERFLOW] = {"LLMEM_EOVERFLOW", "size arithmetic overflows"},
    [LLMEM_EALIGN] = {"LLMEM_EALIGN", "invalid or unsupported alignment"},
    [LLMEM_ENOMEM] = {"LLMEM_ENOMEM", "out of memory"},
    [LLMEM_ECAPACITY] = {"LLMEM_ECAPACITY", "fixed capacity exhausted"},
    [LLMEM_ENOTSUP] = {"LLMEM_ENOTSUP", "not supported"},
    [LLMEM_ENOHUGE] = {"LLMEM_ENOHUGE", "no huge pages available"},
    [LLMEM_EPERM] = {"LLMEM_EPERM", "operation not permitted"},
    [LLMEM_EFOREIGN] = {"LLMEM_EFOREIGN", "pointer not owned by this object"},
    [LLMEM_EDOUBLEFREE] = {"LLMEM_EDOUBLEFREE", "block already free"},
    [LLMEM_ECORRUPT] = {"LLMEM_ECORRUPT", "memory corruption detected"},
    [LLMEM_ESTATE] = {"LLMEM_ESTATE", "invalid in the current state"},
    [LLMEM_EBUSY] = {"LLMEM_EBUSY", "object in use"},
    [LLMEM_ENOTFOUND] = {"LLMEM_ENOTFOUND", "not found"},
    [LLMEM_ERANGE] = {"LLMEM_ERANGE", "value or buffer out of range"},
    [LLMEM_EIO] = {"LLMEM_EIO", "input/output error"},
    [LLMEM_EFORMAT] = {"LLMEM_EFORMAT", "malformed input"},
    [LLMEM_EOS] = {"LLMEM_EOS", "operating system error"},
    [LLMEM_EDEVICE] = {"LLMEM_EDEVICE", "device runtime error"},
};

/* "NAME: text" for every code, built once. */
static char status_full[LLMEM_STATUS_COUNT_][64];
static pthread_once_t status_once = PTHREAD_ONCE_INIT;

static void status_init(void)
{
    for (int i = 0; i < LLMEM_STATUS_COUNT_; i++)
        snprintf(status_full[i], sizeof status_full[i], "%s: %s", status_table[i].name, status_table[i].text);
}

const char *llmem_status_str(llmem_status status)
{
    if ((unsigned)status >= LLMEM_STATUS_COUNT_) return "LLMEM_E?: unknown status";
    pthread_once(&status_once, status_init);
    return status_full[status];
}

const char *llmem_status_name(llmem_status status)
{
    if ((unsigned)status >= LLMEM_STATUS_COUNT_) return "LLMEM_E?";
    return status_table[status].name;
}

/* ---- last error ---------------------------------------------------------- */

static _Thread_local char last_msg[512];
static _Thread_local llmem_status last_status;
static _Thread_local uint64_t error_seq;

uint64_t llmem__error_seq(void) { return error_seq; }

const char *llmem_error_message(void) { return last_msg; }
llmem_status llmem_error_status(void) { return last_status; }

void llmem_error_clear(void)
{
    last_msg[0] = '\0';
    last_status = LLMEM_OK;
}

static void set_error_v(llmem_status status, const char *fmt, va_list ap)
{
    last_status = status;
    error_seq++;
    int n = vsnprintf(last_msg, sizeof last_msg, fmt, ap);
    if (n < 0) snprintf(last_msg, sizeof last_msg, "%s", llmem_status_str(status));
}

llmem_status llmem_error_set(llmem_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_error_v(status, fmt, ap);
    va_end(ap);
    return status;
}

/* The deprecated names (status.h) are the same functions, not wrappers:
 * one symbol each, so the old and new names can never disagree. */
const char *llmem_last_error(void) __attribute__((alias("llmem_error_message")));
llmem_status llmem_last_status(void) __attribute__((alias("llmem_error_status")));
void llmem_clear_error(void) __attribute__((alias("llmem_error_clear")));
llmem_status llmem_set_error(llmem_status status, const char *fmt, ...) __attribute__((alias("llmem_error_set")));

llmem_status llmem__fail_prefix(const char *prefix)
{
    char copy[sizeof last_msg];
    memcpy(copy, last_msg, sizeof copy); /* the message is rewritten in place */
    return llmem_error_set(last_status, "%s: %s", prefix, copy);
}

/* ---- logging ----------------------------------------------------------- */

typedef struct log_sink {
    llmem_log_fn fn;
    void *user;
} log_sink;

static log_sink default_sink; /* fn NULL = write to stderr */
static log_sink *current_sink = &default_sink;
static int min_level = LLMEM_LOG_WARN;
static pthread_mutex_t sink_lock = PTHREAD_MUTEX_INITIALIZER;
/* Sinks installed over the process's life; never freed, since a thread may
 * still be calling one that was just replaced. Installing sinks is rare. */
static log_sink sink_slots[64];
static unsigned sink_next;

void llmem_log_set(llmem_log_fn fn, void *user, llmem_log_level level)
{
    pthread_mutex_lock(&sink_lock);
    log_sink *s = &default_sink;
    if (fn) {
        s = &sink_slots[sink_next % LLMEM_ARRAY_LEN(sink_slots)];
        sink_next++;
        s->fn = fn;
        s->user = user;
    }
    __atomic_store_n(&current_sink, s, __ATOMIC_RELEASE);
    __atomic_store_n(&min_level, (int)level, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&sink_lock);
}

llmem_log_level llmem_log_level_get(void) { return (llmem_log_level)__atomic_load_n(&min_level, __ATOMIC_RELAXED); }

static void log_v(llmem_log_level level, const char *fmt, va_list ap)
{
    if ((int)level < __atomic_load_n(&min_level, __ATOMIC_RELAXED) || level >= LLMEM_LOG_OFF) return;
    char line[600];
    vsnprintf(line, sizeof line, fmt, ap);
    log_sink *s = __atomic_load_n(&current_sink, __ATOMIC_ACQUIRE);
    if (s->fn) {
        s->fn(s->user, level, line);
    } else {
        static const char *names[] = {"debug", "info", "warning", "error"};
        fprintf(stderr, "llmem: %s: %s\n", names[level], line);
    }
}

void llmem__log(llmem_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_v(level, fmt, ap);
    va_end(ap);
}

llmem_status llmem__fail_log(llmem_log_level level, llmem_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_error_v(status, fmt, ap);
    va_end(ap);
    llmem__log(level, "%s", last_msg);
    return status;
}

/* ---- small utilities --------------------------------------------------- */

uint64_t llmem_time_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

size_t llmem__page_size(void)
{
    static size_t cached;
    size_t p = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (!p) {
        long v = sysconf(_SC_PAGESIZE);
        p = v > 0 ? (size_t)v : 4096;
        __atomic_store_n(&cached, p, __ATOMIC_RELAXED);
    }
    return p;
}

void llmem__copy_name(char *dst, size_t cap, const char *src, const char *fallback)
{
    if (!src || !*src) src = fallback;
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* ---- version ----------------------------------------------------------- */

const char *llmem_version(void) { return LLMEM_VERSION_STRING; }

#ifndef LLMEM_BUILD_TYPE
#define LLMEM_BUILD_TYPE "unknown"
#endif

const char *llmem_build_info(void)
{
    return "llmem " LLMEM_VERSION_STRING " (" LLMEM_BUILD_TYPE
#if defined(__clang__)
           ", clang " __clang_version__
#elif defined(__GNUC__)
           ", gcc " __VERSION__
#endif
#ifdef LLMEM_ASAN
           ", asan"
#endif
#if defined(__SANITIZE_THREAD__)
           ", tsan"
#endif
           ", numa: runtime libnuma"
           ")";
}

/* ---- debug asserts (debug.h) ------------------------------------------------ */

_Noreturn void llmem__assert_fail(const char *what, const char *file, int line, const char *func)
{
    /* The last error says what a whole-structure check found. */
    fprintf(stderr, "llmem: %s:%d: %s: invariant failed: %s%s%s\n", file, line, func, what,
            last_status ? "; last error: " : "", last_status ? last_msg : "");
    fflush(stderr);
    abort();
}

/* The walk period's epoch (debug.h): starts at 1, so a call site's count,
 * zero at first, is reset on its first call. Relaxed: a reset is seen by
 * the threads that call after it, and nothing else is ordered by it. */
static _Atomic unsigned long walk_epoch = 1;

void llmem__debug_walk_reset(void) { atomic_fetch_add_explicit(&walk_epoch, 1, memory_order_relaxed); }

unsigned long llmem__debug_walk_epoch(void) { return atomic_load_explicit(&walk_epoch, memory_order_relaxed); }

#if LLMEM_DEBUG >= 3
void llmem__error_save(llmem__error_saved *s)
{
    s->status = last_status;
    s->seq = error_seq;
    memcpy(s->msg, last_msg, sizeof s->msg);
}

void llmem__error_restore(const llmem__error_saved *s)
{
    last_status = s->status;
    error_seq = s->seq;
    memcpy(last_msg, s->msg, sizeof last_msg);
}
#endif
