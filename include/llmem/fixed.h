/*
 * llmem/fixed.h - fixed-size block pool.
 *
 * Blocks of one size (a KV block, a hot tensor shape, a request object),
 * allocated and freed in O(1), carved from chunks mapped from a resource as
 * the pool grows (each chunk twice the last, up to max_chunk_bytes).
 *
 *     llmem_fixed_options o = llmem_fixed_options_default();
 *     o.block_size = 4096;
 *     llmem_fixed *p;
 *     llmem_fixed_create(&o, &p);
 *     void *b = llmem_fixed_alloc(p, NULL);
 *     llmem_fixed_free(p, b);
 *     llmem_fixed_destroy(p);
 *
 * Variants, chosen by options:
 *  - plain (default): one thread at a time; on host memory the free list is
 *    threaded through the free blocks themselves (no metadata per block).
 *  - thread_safe: any thread may allocate and free, including blocks
 *    another thread allocated. Each thread keeps a small cache of free
 *    blocks (a magazine), so the fast path takes no lock and no atomic
 *    read-modify-write; only refilling or flushing a magazine takes the
 *    pool's lock. A thread's magazine goes back to the pool when the thread
 *    exits.
 *  - checked: the free list lives out of band and every block has a state
 *    bit, so freeing a block twice or a pointer the pool never handed out
 *    (another pool's, a stack address, the middle of a block) returns
 *    LLMEM_EDOUBLEFREE or LLMEM_EFOREIGN with a message naming the pool and
 *    the block, and touches no memory. Costs a chunk lookup (binary search
 *    over the few chunks) per free. On host memory a checked pool also fills
 *    each free block with a pattern and verifies it when the block is handed
 *    out again: a write through a dangling pointer is logged as an error
 *    naming the pool and the block, and counted (corruptions_total), even
 *    without AddressSanitizer. Costs a write and a read of the block per
 *    free/alloc pair.
 * Over a device resource the pool keeps all metadata out of band and never
 * touches block memory. On host memory, free blocks are poisoned for
 * AddressSanitizer.
 *
 * In release (unchecked) mode a double or foreign free is not detected: it
 * corrupts the free list (plain host pools) or hands the block out twice.
 */
#ifndef LLMEM_FIXED_H
#define LLMEM_FIXED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/resource.h"
#include "llmem/stats.h"
#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_fixed llmem_fixed;

typedef struct llmem_fixed_options {
    const char *name;          /* shown in messages and stats; default "fixed" */
    llmem_resource *resource;  /* borrowed; default llmem_resource_default() */
    size_t block_size;         /* bytes per block; required */
    size_t align;              /* block alignment, power of two; default 64 host (16 for
                                  blocks under 64 B), 256 device */
    size_t chunk_bytes;        /* first chunk; default max(64 KiB, 8 blocks) */
    size_t max_chunk_bytes;    /* growth cap per chunk; default max(16 MiB, chunk_bytes) */
    size_t initial_blocks;     /* blocks mapped at create, all or LLMEM_ENOMEM; default 0
                                  (first alloc maps) */
    size_t max_blocks;         /* cap on blocks; 0 = none (LLMEM_ECAPACITY past it) */
    bool thread_safe;          /* see above */
    bool checked;              /* see above */
    size_t cache_blocks;       /* thread_safe: magazine size; default 64 (fewer for big blocks) */
} llmem_fixed_options;

/* The fields of llmem_fixed_stats after struct_size, in order: X(kind, value type,
 * name, help) for each; the struct and its schema are both made from it. */
#define LLMEM_FIXED_STATS_FIELDS(X) \
    /* as requested */ \
    X(GAUGE, U64, block_size, "Requested block size in bytes.") \
    /* bytes between blocks (size rounded to alignment) */ \
    X(GAUGE, U64, stride, "Bytes between blocks.") \
    /* handed out now (thread_safe: exact when threads are quiet) */ \
    X(GAUGE, U64, blocks_in_use, "Blocks handed out now.") \
    /* thread_safe: sampled when magazines refill */ \
    X(GAUGE, U64, blocks_in_use_peak, "Highest blocks_in_use.") \
    /* capacity of all chunks */ \
    X(GAUGE, U64, blocks_capacity, "Blocks in all chunks.") \
    X(GAUGE, U64, chunks, "Chunks mapped.") \
    X(GAUGE, U64, reserved_bytes, "Bytes mapped in chunks.") \
    X(COUNTER, U64, allocs_total, "Blocks allocated.") \
    X(COUNTER, U64, frees_total, "Blocks freed.") \
    X(COUNTER, U64, failures_total, "Allocations refused.") \
    /* checked mode detections */ \
    X(COUNTER, U64, double_frees_total, "Double frees detected (checked mode).") \
    /* checked mode detections */ \
    X(COUNTER, U64, foreign_frees_total, "Frees of pointers the pool does not own (checked mode).") \
    /* checked host pools: free blocks found written after their free */ \
    X(COUNTER, U64, corruptions_total, "Free blocks found written after their free (checked host pools).")

typedef struct llmem_fixed_stats {
    size_t struct_size;
    LLMEM_FIXED_STATS_FIELDS(LLMEM_STATS_MEMBER)
} llmem_fixed_stats;

LLMEM_API llmem_fixed_options llmem_fixed_options_default(void);

/* Errors: LLMEM_EINVAL (null, block_size 0...), LLMEM_EOVERFLOW (block or
 * chunk sizes whose rounding overflows), LLMEM_EALIGN, LLMEM_ENOMEM (also:
 * the resource cannot map initial_blocks), LLMEM_ECAPACITY (initial_blocks >
 * max_blocks). */
LLMEM_API llmem_status llmem_fixed_create(const llmem_fixed_options *opts, llmem_fixed **out);

/* Unmaps every chunk, live blocks included. Call when no other thread uses
 * the pool. NULL is a no-op. */
LLMEM_API void llmem_fixed_destroy(llmem_fixed *p);

/* One block, or NULL with *status (optional) set: LLMEM_EINVAL,
 * LLMEM_ECAPACITY (max_blocks), LLMEM_ENOMEM (the resource). */
LLMEM_API void *llmem_fixed_alloc(llmem_fixed *p, llmem_status *status);

/* Return a block. NULL ptr is a no-op. Checked mode: LLMEM_EDOUBLEFREE,
 * LLMEM_EFOREIGN, memory untouched. */
LLMEM_API llmem_status llmem_fixed_free(llmem_fixed *p, void *ptr);

/* True if ptr is the start of a block of this pool (allocated or free). */
LLMEM_API bool llmem_fixed_owns(const llmem_fixed *p, const void *ptr);

/* Block stride in bytes (usable size of every block). */
LLMEM_API size_t llmem_fixed_block_size(const llmem_fixed *p);

/* thread_safe pools: return the calling thread's magazine to the pool now
 * (for stats or before a long idle). No-op otherwise. */
LLMEM_API void llmem_fixed_flush_thread_cache(llmem_fixed *p);

LLMEM_API llmem_status llmem_fixed_get_stats(const llmem_fixed *p, llmem_fixed_stats *out);
LLMEM_API const llmem_stats_schema *llmem_fixed_stats_schema(void);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_FIXED_H */
