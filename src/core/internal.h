/*
 * internal.h - helpers shared by every llmem source file. Not installed.
 *
 * Arithmetic here is overflow-checked; atomics are GCC/Clang builtins on
 * plain integers (so public structs stay plain C and C++); sanitizer hooks
 * compile to nothing unless the build has AddressSanitizer.
 */
#ifndef LLMEM_INTERNAL_H
#define LLMEM_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include "debug.h"
#include "llmem/stats.h"
#include "llmem/status.h"

#define LLMEM_LIKELY(x) __builtin_expect(!!(x), 1)
#define LLMEM_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define LLMEM_UNUSED(x) ((void)(x))
#define LLMEM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Default alignments of what pools hand out (DESIGN.md): a cache line on the
 * host, 256 bytes on a device (cudaMalloc's guarantee). */
#define LLMEM_HOST_ALIGN ((size_t)64)
#define LLMEM_DEVICE_ALIGN ((size_t)256)

static inline bool llmem__is_pow2(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

/* Round x up to a multiple of the power of two a; false on overflow. */
static inline bool llmem__align_up(size_t x, size_t a, size_t *out)
{
    size_t r;
    if (__builtin_add_overflow(x, a - 1, &r)) return false;
    *out = r & ~(a - 1);
    return true;
}

static inline uintptr_t llmem__align_ptr(uintptr_t p, size_t a) { return (p + a - 1) & ~(uintptr_t)(a - 1); }

/* GPT-2's byte-level text: the code point standing for byte b (printable
 * Latin-1 bytes stand for themselves, the other 68 for U+0100.. in byte
 * order; a space is U+0120 "Ġ"). The GPT-2 BPE tokenizer and llmem synth's
 * made-up BPE vocabulary both need it. */
static inline bool llmem__gpt2_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}
static inline uint32_t llmem__gpt2_byte_cp(unsigned b)
{
    if (llmem__gpt2_printable(b)) return b;
    unsigned n = 0;
    for (unsigned c = 0; c < b; c++) n += !llmem__gpt2_printable(c);
    return 256 + n;
}

static inline bool llmem__add_ok(size_t a, size_t b, size_t *out) { return !__builtin_add_overflow(a, b, out); }
static inline bool llmem__mul_ok(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }

/* Smallest power of two >= x (x <= SIZE_MAX/2+1), 1 for x == 0. */
static inline size_t llmem__next_pow2(size_t x)
{
    if (x <= 1) return 1;
    return (size_t)1 << (64 - __builtin_clzll((unsigned long long)(x - 1)));
}

/* ---- relaxed atomic counters on plain uint64_t --------------------------- */
/* Offset of the first of n bytes at p that is not `byte`, or n: a word at
 * a time (checked pools verify fills and guards with it). */
static inline size_t llmem__first_unlike(const void *p, size_t n, unsigned char byte)
{
    const unsigned char *b = p;
    const uint64_t want = 0x0101010101010101ull * byte;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        __builtin_memcpy(&w, b + i, 8);
        if (w != want) break;
    }
    while (i < n && b[i] == byte) i++;
    return i;
}

static inline uint64_t llmem__ld(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline void llmem__st(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
static inline uint64_t llmem__add(uint64_t *p, uint64_t v) { return __atomic_add_fetch(p, v, __ATOMIC_RELAXED); }
static inline uint64_t llmem__sub(uint64_t *p, uint64_t v) { return __atomic_sub_fetch(p, v, __ATOMIC_RELAXED); }
static inline void llmem__max(uint64_t *p, uint64_t v)
{
    uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (cur < v && !__atomic_compare_exchange_n(p, &cur, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

/* ---- errors and logs --------------------------------------------------- */

/* Record the thread's last error and return status (llmem_error_set). */
#define llmem__fail llmem_error_set

/* Put "prefix: " before the thread's last error message, keeping its
 * status, and return that status (a module reporting a helper's failure
 * under its own name: "timeline: cannot write ..."). */
llmem_status llmem__fail_prefix(const char *prefix);

/* Log through the installed sink if level passes the threshold. */
void llmem__log(llmem_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Record the error and log it at `level` in one go (checked-mode detections). */
llmem_status llmem__fail_log(llmem_log_level level, llmem_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Hand a filled stats struct (whose first field is size_t struct_size) to a
 * caller: copy as much as the caller's struct_size allows (see
 * llmem_stats_fill_size) and record that size in it. Returns LLMEM_OK, so a
 * getter can end with `return llmem__stats_out(...)`, as with the _locked
 * form below. */
static inline llmem_status llmem__stats_out(void *out, void *filled, size_t size)
{
    size_t caller, n;
    memcpy(&caller, out, sizeof caller);
    n = llmem_stats_fill_size(caller, size);
    memcpy(filled, &n, sizeof n);
    memcpy(out, filled, n);
    return LLMEM_OK;
}

/* llmem__stats_out of a stats struct that `lock` guards (a module's
 * counters kept under its mutex): the copy is taken under the lock, the
 * caller's struct is written without it. Returns LLMEM_OK. (stats.c) */
llmem_status llmem__stats_out_locked(void *out, const void *guarded, size_t size, pthread_mutex_t *lock);

/* A row of a stats schema (llmem/stats.h): the field `name` of the stats
 * struct `type`, a GAUGE or COUNTER (`kind`) whose value is U64 or DOUBLE
 * (`vtype`). A field list's entries become rows through a local F that
 * names the struct (serve_report.c), or through LLMEM__STATS_SCHEMA_OF. */
#define LLMEM__STAT_FIELD(type, kind, vtype, name, help) \
    {#name, help, LLMEM_METRIC_##kind, LLMEM_VALUE_##vtype, offsetof(type, name)}

/* The static schema `var` named `label` for the struct `type`, whose rows
 * are the array `fields`; metric names are `prefix` + field, or
 * llmem_<label>_<field> when prefix is NULL. */
#define LLMEM__SCHEMA(var, label, type, fields, prefix) \
    static const llmem_stats_schema var = {label, sizeof(type), LLMEM_ARRAY_LEN(fields), fields, prefix}

/* The public getter `fn` of the schema named `label` for the stats struct
 * `type`, whose rows are made from its field list `list`
 * (LLMEM_<THING>_STATS_FIELDS, llmem/stats.h): one row per entry, in list
 * order. The local typedef names the struct for LLMEM__STAT_ROW. */
#define LLMEM__STAT_ROW(kind, vtype, name, help) \
    {#name, help, LLMEM_METRIC_##kind, LLMEM_VALUE_##vtype, offsetof(llmem__stats_type, name)},
#define LLMEM__STATS_SCHEMA_OF(fn, label, type, list) \
    const llmem_stats_schema *fn(void) \
    { \
        typedef type llmem__stats_type; \
        static const llmem_stat_field fields[] = {list(LLMEM__STAT_ROW)}; \
        static const llmem_stats_schema schema = {label, sizeof(type), LLMEM_ARRAY_LEN(fields), fields, NULL}; \
        return &schema; \
    }

/* Number of errors recorded in this thread so far: compare before and after
 * a call to know whether it left its own message. */
uint64_t llmem__error_seq(void);

/* The whole file at path in a malloc'd buffer (*data, *size; free() it).
 * Over max_bytes: LLMEM_EFORMAT. Messages start with `what`. Opened as
 * llmem__open_regular does. (file.c) */
llmem_status llmem__read_file(const char *path, size_t max_bytes, const char *what, void **data, size_t *size);

/* Open path read-only without blocking (O_NONBLOCK: a FIFO or a device
 * returns at once) and require a regular file: LLMEM_EIO naming what it
 * is otherwise, or the system's reason when it cannot be opened. *fd (O_CLOEXEC,
 * blocking again) and *st (may be NULL) on success. Messages start with
 * `what`. (file.c) */
struct stat;
llmem_status llmem__open_regular(const char *path, const char *what, int *fd, struct stat *st);

/* "a FIFO", "a directory", ... for an st_mode, for messages. (file.c) */
const char *llmem__file_kind(mode_t mode);

/* Monotonic clock in nanoseconds: the public llmem_time_now_ns
 * (llmem/status.h), under the name the library's files have always used. */
#define llmem__now_ns llmem_time_now_ns

/* CLOCK_MONOTONIC_COARSE in nanoseconds: a few ns a call where
 * CLOCK_MONOTONIC cost 150 ns on this project's virtual machines, at one
 * tick (1-10 ms) of resolution; for the hot paths' timestamps (the pool's
 * decay, the shim's release interval). */
static inline uint64_t llmem__coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Page size of the host, cached. */
size_t llmem__page_size(void);

/* Copy a name into a fixed buffer, NUL-terminated, truncating. */
void llmem__copy_name(char *dst, size_t cap, const char *src, const char *fallback);

/* ---- AddressSanitizer manual poisoning ----------------------------------- */
#if defined(__SANITIZE_ADDRESS__)
#define LLMEM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LLMEM_ASAN 1
#endif
#endif

#ifdef LLMEM_ASAN
#include <sanitizer/asan_interface.h>
#define LLMEM_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define LLMEM_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define LLMEM_POISON(p, n) ((void)(p), (void)(n))
#define LLMEM_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#endif /* LLMEM_INTERNAL_H */
