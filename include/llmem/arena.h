/*
 * llmem/arena.h - linear (bump) arena: the per-request scratch space.
 *
 * An arena hands out memory by moving a cursor forward; nothing is freed on
 * its own. A request's temporaries come from an arena and all go at once
 * with llmem_arena_reset(), or back to a saved position with marks:
 *
 *     llmem_arena *a;
 *     llmem_arena_create(NULL, &a);                 // 1 MiB chunks from the os
 *     for (each request) {
 *         float *x = llmem_arena_alloc(a, n * sizeof *x, 0, NULL);
 *         llmem_arena_mark m = llmem_arena_save(a);
 *         ... per-layer temporaries ...
 *         llmem_arena_rollback(a, m);               // drop just those
 *         llmem_arena_reset(a);                     // drop everything, keep chunks
 *     }
 *     llmem_arena_destroy(a);
 *
 * Memory comes in chunks from a resource. When the current chunk is full the
 * arena moves on to the next chunk it already holds that fits the request
 * (chunks passed over count as waste until the next reset), or maps a new
 * one at the end (chunk_bytes, or more for a larger request). reset() and rollback() keep
 * the chunks, so a steady stream of similar requests runs without resource
 * calls; trim() gives back chunks beyond the cursor. With `capacity_bytes`
 * (or a caller-provided buffer) the arena is fixed: one chunk, never grown,
 * LLMEM_ECAPACITY when full.
 *
 * The arena keeps its bookkeeping out of band, so it works unchanged over a
 * device resource (it never touches the memory it hands out). On host
 * memory, bytes not handed out are poisoned for AddressSanitizer.
 *
 * Thread safety: an arena belongs to one thread at a time.
 */
#ifndef LLMEM_ARENA_H
#define LLMEM_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/resource.h"
#include "llmem/stats.h"
#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_arena llmem_arena;

typedef struct llmem_arena_options {
    const char *name;          /* shown in messages and stats; default "arena" */
    llmem_resource *resource;  /* borrowed; default llmem_resource_default() */
    size_t chunk_bytes;        /* bytes per chunk mapped when growing; default 1 MiB */
    size_t max_bytes;          /* cap on bytes held in chunks; 0 = no cap */
    size_t capacity_bytes;     /* non-zero: fixed arena of this many bytes, mapped at create */
    void *buffer;              /* non-NULL: fixed arena over this caller memory (not freed) */
    size_t buffer_bytes;       /* size of buffer */
    size_t align;              /* default alignment (power of two); 0 = 64 host, 256 device */
} llmem_arena_options;

/* A saved position. Plain value; only valid for the arena that made it, until
 * that arena is reset or rolled back past it. */
typedef struct llmem_arena_mark {
    uint64_t arena_id;
    uint64_t epoch;            /* reset count when taken */
    size_t chunk;              /* chunk index */
    size_t offset;             /* cursor inside that chunk */
    size_t used;               /* used bytes at the mark */
    size_t requested;          /* requested bytes at the mark */
} llmem_arena_mark;

/* The fields of llmem_arena_stats after struct_size, in order: X(kind, value type,
 * name, help) for each; the struct and its schema are both made from it. */
#define LLMEM_ARENA_STATS_FIELDS(X) \
    /* bytes handed out since the last reset, padding included */ \
    X(GAUGE, U64, used_bytes, "Bytes handed out since the last reset, padding and skipped chunk tails included.") \
    /* highest used_bytes ever */ \
    X(GAUGE, U64, used_peak_bytes, "Highest used_bytes.") \
    X(GAUGE, U64, requested_bytes, "Bytes asked for since the last reset.") \
    X(GAUGE, U64, reserved_bytes, "Bytes held in chunks.") \
    X(GAUGE, U64, reserved_peak_bytes, "Highest reserved_bytes.") \
    /* used - requested: alignment padding and chunk tails skipped */ \
    X(GAUGE, U64, waste_bytes, "used_bytes - requested_bytes.") \
    X(GAUGE, U64, chunks, "Chunks held.") \
    X(COUNTER, U64, allocs_total, "Allocations served.") \
    X(COUNTER, U64, resets_total, "Resets.") \
    X(COUNTER, U64, rollbacks_total, "Rollbacks to a mark.") \
    X(COUNTER, U64, grows_total, "Chunks mapped.") \
    X(COUNTER, U64, releases_total, "Chunks unmapped by trim.") \
    X(COUNTER, U64, failures_total, "Allocations refused.")

typedef struct llmem_arena_stats {
    size_t struct_size;
    LLMEM_ARENA_STATS_FIELDS(LLMEM_STATS_MEMBER)
} llmem_arena_stats;

LLMEM_API llmem_arena_options llmem_arena_options_default(void);

/* opts may be NULL. Errors: LLMEM_EINVAL (null out, buffer with zero size,
 * buffer_bytes without a buffer, both buffer and capacity), LLMEM_EALIGN
 * (align not a power of two, or above 1 GiB), LLMEM_EOVERFLOW (chunk_bytes
 * or the buffer range overflows), LLMEM_ENOMEM, and the resource's errors
 * when capacity_bytes is mapped. */
LLMEM_API llmem_status llmem_arena_create(const llmem_arena_options *opts, llmem_arena **out);

/* Unmaps every chunk. NULL is a no-op. */
LLMEM_API void llmem_arena_destroy(llmem_arena *a);

/* size bytes aligned to align (0 = the arena's default). Returns NULL on
 * failure and, if status is non-NULL, the reason: LLMEM_EINVAL (null arena,
 * size 0), LLMEM_EOVERFLOW, LLMEM_EALIGN, LLMEM_ECAPACITY (fixed arena or
 * max_bytes), LLMEM_ENOMEM (the resource). A failed call changes nothing. */
LLMEM_API void *llmem_arena_alloc(llmem_arena *a, size_t size, size_t align,
                                  llmem_status *status);

/* The current position. */
LLMEM_API llmem_arena_mark llmem_arena_save(const llmem_arena *a);

/* Free everything allocated since mark m. LLMEM_EINVAL for a null arena,
 * another arena's mark or a damaged one, LLMEM_ESTATE for a mark taken
 * before the last reset or lying ahead of the cursor (already rolled back
 * past, or in chunks trim() gave back). A mark that was rolled back past and
 * then overtaken again is a valid position and frees what lies after it;
 * used_bytes then follows from the position, and requested_bytes is the
 * figure saved in the mark (at most used_bytes). */
LLMEM_API llmem_status llmem_arena_rollback(llmem_arena *a, llmem_arena_mark m);

/* Free everything; chunks are kept for reuse. */
LLMEM_API void llmem_arena_reset(llmem_arena *a);

/* Unmap chunks beyond the cursor, and the last one too when nothing is
 * allocated (after a reset: all of them); returns bytes released. Fixed
 * arenas release nothing. */
LLMEM_API size_t llmem_arena_trim(llmem_arena *a);

/* True if ptr lies in memory this arena has handed out since the last reset
 * and not rolled back (alignment padding between allocations included;
 * chunk tails and chunks passed over are not). */
LLMEM_API bool llmem_arena_owns(const llmem_arena *a, const void *ptr);

LLMEM_API llmem_status llmem_arena_get_stats(const llmem_arena *a, llmem_arena_stats *out);
LLMEM_API const llmem_stats_schema *llmem_arena_stats_schema(void);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_ARENA_H */
