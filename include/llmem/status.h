/*
 * llmem/status.h - status codes, the last-error message, and logging.
 *
 * Every llmem function that can fail returns an llmem_status (LLMEM_OK is 0)
 * or, when it returns a pointer, NULL plus an optional llmem_status out
 * parameter. Bad input from a caller is always a status, never an abort.
 *
 * When a call fails it also leaves a human-readable message for the calling
 * thread, naming the object and the value at fault ("fixed pool 'kv': double
 * free of 0x7f...: block 17 of chunk 2 is already free"). The message stays
 * until the next failure in the same thread; successful calls do not clear
 * it, so read it right after the failing call.
 */
#ifndef LLMEM_STATUS_H
#define LLMEM_STATUS_H

#include <stdarg.h>
#include <stdint.h>

#include "llmem/version.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum llmem_status {
    LLMEM_OK = 0,
    LLMEM_EINVAL = 1,      /* invalid argument: null handle, zero size, bad flag or option */
    LLMEM_EOVERFLOW = 2,   /* a size or count whose rounding or arithmetic overflows */
    LLMEM_EALIGN = 3,      /* alignment not a power of two, or above the supported maximum */
    LLMEM_ENOMEM = 4,      /* the resource (OS, device, a limit adaptor) has no memory left */
    LLMEM_ECAPACITY = 5,   /* a fixed-capacity object (arena, fixed pool cap) is full */
    LLMEM_ENOTSUP = 6,     /* the operation or option is not supported here (e.g. no NUMA) */
    LLMEM_ENOHUGE = 7,     /* explicit huge pages requested but none are reserved */
    LLMEM_EPERM = 8,       /* the OS refused for lack of permission or rlimit (mlock) */
    LLMEM_EFOREIGN = 9,    /* a pointer this object does not own */
    LLMEM_EDOUBLEFREE = 10,/* a block that is already free */
    LLMEM_ECORRUPT = 11,   /* damaged guard canaries or inconsistent metadata */
    LLMEM_ESTATE = 12,     /* call not valid in the object's current state (stale mark...) */
    LLMEM_EBUSY = 13,      /* the object is in use (pinned handle, live blocks) */
    LLMEM_ENOTFOUND = 14,  /* a name or key that does not exist */
    LLMEM_ERANGE = 15,     /* an output buffer too small, or a value out of range */
    LLMEM_EIO = 16,        /* reading or writing a file failed */
    LLMEM_EFORMAT = 17,    /* a malformed file or input */
    LLMEM_EOS = 18,        /* an unexpected operating-system error (see the message) */
    LLMEM_EDEVICE = 19,    /* an accelerator runtime error (see the message) */
    LLMEM_STATUS_COUNT_    /* number of codes; not a status */
} llmem_status;

/* The symbolic name and a one-line description of a status, e.g.
 * "LLMEM_ENOMEM: out of memory". Never NULL; unknown codes give
 * "LLMEM_E?: unknown status". The string is static. */
LLMEM_API const char *llmem_status_str(llmem_status status);

/* Just the symbolic name ("LLMEM_ENOMEM"). Never NULL. */
LLMEM_API const char *llmem_status_name(llmem_status status);

/* The message left by the last failing llmem call in this thread, or "" if
 * none failed yet. Valid until the next llmem call in this thread. */
LLMEM_API const char *llmem_error_message(void);

/* The status of the last failing llmem call in this thread (LLMEM_OK if
 * none failed yet). */
LLMEM_API llmem_status llmem_error_status(void);

/* Forget the last error of this thread. */
LLMEM_API void llmem_error_clear(void);

/* Record the calling thread's last error (status and message) and return
 * `status`: for resource ops and adaptors (llmem/resource_impl.h) and any
 * code built on llmem that reports through the same channel:
 * `return llmem_error_set(LLMEM_ENOMEM, "...", ...);` */
LLMEM_API llmem_status llmem_error_set(llmem_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* The names before 0.x (llmem_<thing>_<verb> everywhere since): the same
 * functions under their old names, kept for one minor release so that
 * programs built against them still link, and marked deprecated so that
 * they tell their authors at compile time. */
#if defined(__GNUC__)
#define LLMEM_DEPRECATED(msg) __attribute__((deprecated(msg)))
#else
#define LLMEM_DEPRECATED(msg)
#endif
LLMEM_API LLMEM_DEPRECATED("use llmem_error_message") const char *llmem_last_error(void);
LLMEM_API LLMEM_DEPRECATED("use llmem_error_status") llmem_status llmem_last_status(void);
LLMEM_API LLMEM_DEPRECATED("use llmem_error_clear") void llmem_clear_error(void);
LLMEM_API LLMEM_DEPRECATED("use llmem_error_set") llmem_status llmem_set_error(llmem_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---- time --------------------------------------------------------------- */

/* The library's clock: CLOCK_MONOTONIC in nanoseconds. The controller
 * stamps its events with it and the scheduler's latencies come from it, so
 * a caller that records timeline samples (llmem_timeline_sample.time_ns) or
 * times its own work beside them uses this clock and the two line up. */
LLMEM_API uint64_t llmem_time_now_ns(void);

/* ---- logging ------------------------------------------------------------ */

typedef enum llmem_log_level {
    LLMEM_LOG_DEBUG = 0,
    LLMEM_LOG_INFO = 1,
    LLMEM_LOG_WARN = 2,  /* misuse detected and refused: double free, foreign pointer */
    LLMEM_LOG_ERROR = 3, /* corruption or a failure the caller should not ignore */
    LLMEM_LOG_OFF = 4
} llmem_log_level;

/* A log sink. `msg` is one line without a trailing newline. Called from the
 * thread that hit the event; must be thread-safe and must not call back into
 * the llmem object that logged. */
typedef void (*llmem_log_fn)(void *user, llmem_log_level level, const char *msg);

/* Install a sink (NULL restores the default, which writes "llmem: <level>:
 * <msg>" to stderr) and the lowest level that reaches it (default
 * LLMEM_LOG_WARN). Process-wide; safe to call at any time. */
LLMEM_API void llmem_log_set(llmem_log_fn fn, void *user, llmem_log_level min_level);

/* The current minimum level. */
LLMEM_API llmem_log_level llmem_log_level_get(void);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_STATUS_H */
