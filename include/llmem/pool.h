/*
 * llmem/pool.h - the dynamic pool: general-purpose allocation over any
 * resource, host or device.
 *
 * Memory comes from the pool's resource in superblocks: the first of
 * first_superblock_bytes, each later one twice the last up to
 * max_superblock_bytes; a request larger than that gets a superblock of its
 * own. On the host (without reserve_bytes) slabs and large blocks live in
 * separate superblocks, each kind growing on its own, so that transparent
 * huge pages back only the slabs: small blocks are where the TLB decides
 * the speed, while a large block's first touch should fault in 4 KiB, not
 * zero 2 MiB (measured: 60% of the tensor mix's time went to clearing huge
 * pages, and a huge-page fault on a fragmented machine stalls in
 * compaction). Inside superblocks:
 *  - small and medium requests (up to 32 KiB on the host, 512 KiB on a
 *    device) are rounded to a size class (see below) and served from slabs,
 *    runs of pages holding blocks of one class (64 KiB or a multiple,
 *    aligned to 64 KiB: a free finds its slab in the process's address
 *    map with no table of the superblock's between);
 *  - larger requests take a best-fit run of pages (4 KiB host, 64 KiB
 *    device), split off the rest, and coalesce with free neighbours when
 *    freed (the BFC arena's method), in O(log n) through a tree of free runs.
 *
 *     llmem_pool *p;
 *     llmem_pool_create(NULL, &p);             // host, defaults
 *     float *x = llmem_pool_alloc(p, n * sizeof *x, NULL);
 *     llmem_pool_free(p, x);
 *     llmem_pool_trim(p);                      // give back what is free
 *     llmem_pool_destroy(p);
 *
 * Size classes: multiples of the pool's alignment (16 B host, 256 B device)
 * up to 16 times it, then eight per power of two. Internal waste is at
 * most 12.5% of the request from 128 B up on the host (2 KiB up on a
 * device); a 65-80 B request takes an 80 B block, because 16-byte alignment,
 * which malloc gives and std::pmr and SIMD code expect, rules out 8-byte
 * steps there.
 *
 * Alignment: every block is aligned to `align` (16 B host, 256 B device by
 * default); host blocks of 513 B or more are 64-byte aligned (except in
 * extra classes from a profile, which are exact to the pool's alignment),
 * large blocks page aligned. llmem_pool_alloc_aligned takes any power of two up to the
 * largest superblock.
 *
 * Device memory: over a device resource the pool keeps every byte of its
 * metadata in host memory and never reads or writes the memory it manages
 * (the sim-device resource turns any slip into a crash). On the host it
 * threads free lists through free small blocks.
 *
 * Ownership: free() of a pointer this pool did not hand out, or of a block
 * already freed, is refused (LLMEM_EFOREIGN, LLMEM_EDOUBLEFREE) and changes
 * nothing: the page owner table makes that check free for large blocks,
 * and every slab keeps a state byte per small block (in host memory, set
 * when the block is handed out, cleared when it is freed) that the free
 * fast path reads, so a small block freed twice is refused and never
 * handed out twice (two threads freeing one block at the same instant can
 * both pass). Checked mode takes the lock on every call, writes guard
 * canaries around every host block and verifies them on free
 * (LLMEM_ECORRUPT, the block is still freed). Freed host memory is poisoned
 * for AddressSanitizer in every mode when the library is built with it.
 *
 * Memory goes back: a free page run or a wholly free superblock that has
 * stayed free for the decay delay (250 ms by default, long enough that a
 * burst of frees followed by a burst of allocations does not thrash the
 * resource) is decommitted or unmapped by a process-wide background thread
 * (one for all pools; it takes pool locks with trylock only and sleeps when
 * nothing is pending). With LLMEM_POOL_PURGE_MANUAL there is no thread:
 * empty superblocks go on the pool's next slow path after the delay, and
 * shrink() and trim() do the rest at once. Small blocks freed inside slabs
 * that still hold live blocks keep their pages. reserve() maps and commits
 * ahead, so the next allocations up to that many bytes make no resource
 * call (the bytes go to the large blocks; small objects get up to the
 * first superblock).
 *
 * Reserved range (reserve_bytes): the first growth maps that much address
 * space as one superblock without committing it (the resource must be
 * able to: LLMEM_RES_CAP_RESERVE - os, sim-device, cuda-vmm), and blocks
 * commit its pages as they take them. The pool then grows in place: its
 * blocks stay in one virtually contiguous range, none ever moves, and
 * committed memory follows demand (free pages are decommitted after the
 * decay, or by shrink; the range is unmapped only at destroy). Past it,
 * ordinary superblocks are added as usual. The range counts in
 * reserved_bytes (and against max_bytes) from the start; host metadata is
 * about 24 bytes per unit of it (4 KiB host, 64 KiB device), in zeroed
 * pages the OS backs only where touched.
 *
 * Threads: a pool is safe to share between threads. Each thread keeps a
 * small cache of free small blocks per pool (not in checked mode), so
 * small allocations and frees take no lock and no atomic read-modify-write;
 * a block may be freed by any thread. A cache refills from and flushes to a
 * per-class transfer cache with a lock of its own, and only goes to the
 * pool lock (slabs, page runs) when that is empty or full. Blocks in a
 * thread's cache count as free in the stats but stay in their slabs until
 * that thread refills, flushes (llmem_pool_flush_thread_cache, shrink,
 * trim) or exits. Stats reads take no lock an allocation waits for (the
 * largest free run alone is read under the pool lock); with threads
 * running they are a snapshot: the in-use peak is sampled when caches
 * refill.
 */
#ifndef LLMEM_POOL_H
#define LLMEM_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/fence.h"
#include "llmem/resource.h"
#include "llmem/stats.h"
#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_pool llmem_pool;

typedef enum llmem_pool_purge {
    LLMEM_POOL_PURGE_DEFAULT = 0,    /* = BACKGROUND */
    LLMEM_POOL_PURGE_BACKGROUND = 1, /* a process-wide thread gives memory back after the decay delay */
    LLMEM_POOL_PURGE_MANUAL = 2      /* only shrink/trim, and empty superblocks on the pool's slow paths */
} llmem_pool_purge;

typedef struct llmem_pool_options {
    const char *name;              /* shown in messages and stats; default "pool" */
    llmem_resource *resource;      /* borrowed; default: the os resource with transparent huge
                                      pages advised for slab superblocks and plain pages for large
                                      blocks (a resource given here serves both) */
    size_t first_superblock_bytes; /* default 4 MiB host, 32 MiB device */
    size_t max_superblock_bytes;   /* growth cap per superblock; default 64 MiB host, 512 MiB device */
    size_t max_bytes;              /* cap on mapped bytes; 0 = none (LLMEM_ENOMEM past it) */
    size_t reserve_bytes;          /* grow in place: see "Reserved range" above; 0 = off */
    size_t align;                  /* minimum alignment of every block; default 16 host, 256 device */
    uint32_t decay_ms;             /* how long free memory is kept before it goes back; default 250 */
    llmem_pool_purge purge;        /* default LLMEM_POOL_PURGE_BACKGROUND */
    bool checked;                  /* double-free bits, canaries; see above */
    struct llmem_profile *profile; /* borrowed; record every allocation's size and lifetime (profile.h) */
    const uint32_t *extra_classes; /* sizes that get an exact class of their own (from a profile) */
    size_t extra_class_count;      /* at most LLMEM_POOL_MAX_EXTRA_CLASSES */
} llmem_pool_options;

#define LLMEM_POOL_MAX_EXTRA_CLASSES 24

/* The fields of llmem_pool_stats after struct_size, in order: X(kind, value type,
 * name, help) for each; the struct and its schema are both made from it. */
#define LLMEM_POOL_STATS_FIELDS(X) \
    X(GAUGE, U64, reserved_bytes, "Bytes mapped in superblocks.") \
    X(GAUGE, U64, reserved_peak_bytes, "Highest reserved_bytes.") \
    /* reserved less decommitted pages */ \
    X(GAUGE, U64, committed_bytes, "Reserved bytes not decommitted.") \
    /* in live blocks, at their class or page-rounded size */ \
    X(GAUGE, U64, used_bytes, "Bytes in live blocks (class or page-rounded sizes).") \
    X(GAUGE, U64, used_peak_bytes, "Highest used_bytes.") \
    X(GAUGE, U64, live_allocations, "Live allocations.") \
    /* committed bytes not in live blocks: free page runs' committed pages and free (or cached) slab blocks */ \
    X(GAUGE, U64, free_bytes, "Committed bytes not in live blocks (free runs and free slab blocks).") \
    /* the longest committed free page run: the most one allocation can take with no resource call */ \
    X(GAUGE, U64, largest_free_bytes, "The longest committed free page run.") \
    /* 1 - largest_free / free_bytes; 0 when nothing is free */ \
    X(GAUGE, DOUBLE, fragmentation, "1 - largest committed free run / committed free bytes.") \
    /* in slabs (small blocks, used or not) */ \
    X(GAUGE, U64, slab_bytes, "Bytes in slabs of small blocks.") \
    X(GAUGE, U64, superblocks, "Superblocks mapped.") \
    X(COUNTER, U64, allocs_total, "Allocations served.") \
    /* frees taken (counted, per thread on the fast path) */ \
    X(COUNTER, U64, frees_total, "Blocks freed.") \
    X(COUNTER, U64, grows_total, "Superblocks mapped.") \
    X(COUNTER, U64, shrinks_total, "Superblocks unmapped.") \
    /* pages given back inside superblocks */ \
    X(COUNTER, U64, decommitted_bytes_total, "Bytes decommitted inside superblocks.") \
    X(COUNTER, U64, resource_calls_total, "Map, unmap, commit and decommit calls made.") \
    X(COUNTER, U64, failures_total, "Allocations refused.") \
    X(COUNTER, U64, invalid_frees_total, "Foreign and double frees refused.") \
    /* damaged canaries found (checked mode) */ \
    X(COUNTER, U64, corruptions_total, "Damaged guard canaries found.") \
    X(GAUGE, U64, handles, "Live movable allocations (handles).") \
    X(COUNTER, U64, compactions_total, "Compactions run.") \
    X(COUNTER, U64, moved_bytes_total, "Bytes moved by compaction.") \
    X(GAUGE, U64, fenced_pending, "Blocks freed with a fence that is not done yet.") \
    /* their bytes (still in used_bytes) */ \
    X(GAUGE, U64, fenced_pending_bytes, "Bytes of blocks whose fenced free is pending.") \
    X(COUNTER, U64, fenced_frees_total, "Fenced frees accepted.") \
    X(COUNTER, U64, fence_waits_total, "Fences waited for because an allocation would have failed.") \
    /* idle threads' caches taken back (purger, shrink) */ \
    X(COUNTER, U64, reclaimed_caches_total, "Idle threads' caches taken back.")

typedef struct llmem_pool_stats {
    size_t struct_size;
    LLMEM_POOL_STATS_FIELDS(LLMEM_STATS_MEMBER)
} llmem_pool_stats;

/* The fields of llmem_pool_class_stats after struct_size, in order: X(kind, value type,
 * name, help) for each; the struct and its schema are both made from it. */
#define LLMEM_POOL_CLASS_STATS_FIELDS(X) \
    X(GAUGE, U64, class_bytes, "Block size of the class.") \
    X(GAUGE, U64, slab_bytes, "Bytes per slab.") \
    /* slabs held now */ \
    X(GAUGE, U64, slabs, "Slabs held.") \
    X(GAUGE, U64, live_blocks, "Live blocks.") \
    X(COUNTER, U64, allocs_total, "Blocks allocated.") \
    /* frees taken (counted, per thread on the fast path) */ \
    X(COUNTER, U64, frees_total, "Blocks freed.") \
    /* allocations of this class refused */ \
    X(COUNTER, U64, failures_total, "Allocations of the class refused.")

/* Per size class figures, from llmem_pool_get_class_stats. */
typedef struct llmem_pool_class_stats {
    size_t struct_size;
    LLMEM_POOL_CLASS_STATS_FIELDS(LLMEM_STATS_MEMBER)
} llmem_pool_class_stats;

LLMEM_API llmem_pool_options llmem_pool_options_default(void);

/* opts may be NULL. Errors: LLMEM_EINVAL, LLMEM_EALIGN (align not a power of
 * two, or above the page size), LLMEM_EOVERFLOW, LLMEM_ENOMEM. Maps nothing
 * until the first allocation or reserve. */
LLMEM_API llmem_status llmem_pool_create(const llmem_pool_options *opts, llmem_pool **out);

/* Unmaps every superblock, live blocks included; pending fences are dropped
 * without waiting (drain first if work may still use the memory). Live
 * blocks (not counting those whose fenced free is pending) are reported:
 * a warning in the log naming their count and bytes, also left as the
 * calling thread's last error (LLMEM_ESTATE). NULL is a no-op. */
LLMEM_API void llmem_pool_destroy(llmem_pool *p);

/* The resource the pool takes its memory from (NULL for a NULL pool). */
LLMEM_API llmem_resource *llmem_pool_get_resource(const llmem_pool *p);

/* size bytes, aligned to the pool's alignment. NULL on failure with
 * *status (optional): LLMEM_EINVAL (null pool, size 0), LLMEM_EOVERFLOW,
 * LLMEM_ENOMEM (the resource, or max_bytes). */
LLMEM_API void *llmem_pool_alloc(llmem_pool *p, size_t size, llmem_status *status);

/* The same with an explicit alignment: a power of two up to
 * max_superblock_bytes (LLMEM_EALIGN otherwise). */
LLMEM_API void *llmem_pool_alloc_aligned(llmem_pool *p, size_t size, size_t align, llmem_status *status);

/* Zeroed memory (host pools; LLMEM_ENOTSUP on a device pool). Checks
 * count * size for overflow. */
LLMEM_API void *llmem_pool_calloc(llmem_pool *p, size_t count, size_t size, llmem_status *status);

/* Resize, keeping min(old, new) bytes (moved with the resource's copy on a
 * device). ptr NULL allocates; size 0 is LLMEM_EINVAL (free explicitly). On
 * failure the old block is untouched and NULL is returned. */
LLMEM_API void *llmem_pool_realloc(llmem_pool *p, void *ptr, size_t size, llmem_status *status);

/* Return a block. NULL ptr is a no-op. LLMEM_EFOREIGN, LLMEM_EDOUBLEFREE
 * (see above), LLMEM_ECORRUPT (checked mode; the block is freed anyway). */
LLMEM_API llmem_status llmem_pool_free(llmem_pool *p, void *ptr);

/* True if ptr points into a live block of this pool. */
LLMEM_API bool llmem_pool_owns(const llmem_pool *p, const void *ptr);

/* Bytes usable from ptr (a block start returned by this pool), 0 if it is
 * not one. */
LLMEM_API size_t llmem_pool_usable_size(const llmem_pool *p, const void *ptr);

/* Make sure the next allocations of up to `bytes` in total need no
 * resource call: map a superblock and commit free pages as needed, so a
 * free run of at least `bytes` exists. LLMEM_ENOMEM if that cannot be had. */
LLMEM_API llmem_status llmem_pool_reserve(llmem_pool *p, size_t bytes);

/* Give memory back until committed bytes are at most target_bytes: first
 * unmap wholly free superblocks (largest first), then decommit free pages.
 * Returns the bytes released. Never touches live blocks. */
LLMEM_API size_t llmem_pool_shrink(llmem_pool *p, size_t target_bytes);

/* Return the calling thread's cached free blocks to the pool now (before a
 * long idle, or for exact stats). shrink() and trim() do it too. */
LLMEM_API void llmem_pool_flush_thread_cache(llmem_pool *p);

/* shrink(p, 0): everything free goes back. */
LLMEM_API size_t llmem_pool_trim(llmem_pool *p);

/* Walk every superblock, block and slab and verify the pool's invariants
 * (expensive; for tests and debugging). LLMEM_ECORRUPT with a message
 * naming the first violation. */
LLMEM_API llmem_status llmem_pool_check(llmem_pool *p);

/* ---- stream-ordered release (fenced frees) --------------------------------
 *
 * A block that asynchronous work may still read or write (a kernel queued
 * on a CUDA stream) can be freed at once with a fence: the block goes back
 * to the free lists only when the fence says that work is done, with no
 * device-wide synchronisation, the model of RMM's stream-ordered resources
 * and PyTorch's record_stream. Until then it stays allocated (used_bytes,
 * live_allocations) and is counted in fenced_pending. The pool polls its
 * fences, without blocking, on its slow paths (a thread-cache refill, a
 * large or aligned allocation) and in llmem_pool_poll_fenced; an allocation
 * that would fail with LLMEM_ENOMEM first waits for pending fences, oldest
 * first, one at a time, and retries. Allocations carry no stream, so a
 * fenced block is reused only after its fence, whatever stream asks.
 *
 * llmem_cuda_fence_record (cuda_resource.h) makes a fence from a CUDA
 * event; any other completion signal works through the callbacks of
 * llmem_fence (fence.h). */

/* Free ptr once f is done. The fence is polled once here: if it is done
 * already the block is freed now. The pool owns the fence from this call
 * on, whatever the outcome: it calls drop exactly once. Refusals are
 * those of llmem_pool_free (the block stays live), plus LLMEM_EDOUBLEFREE
 * for a block whose fenced free is pending, LLMEM_EINVAL for a handle block or a fence
 * without done, and LLMEM_ENOMEM when the pending list cannot grow and the
 * fence cannot be waited for (the block stays live). */
LLMEM_API llmem_status llmem_pool_free_fenced(llmem_pool *p, void *ptr, const llmem_fence *f);

/* Complete the fenced frees whose fences are done; returns how many. */
LLMEM_API size_t llmem_pool_poll_fenced(llmem_pool *p);

/* Wait for every pending fence and complete its free (at a stage boundary,
 * or before destroy). Returns how many were completed. */
LLMEM_API size_t llmem_pool_drain_fenced(llmem_pool *p);

/* ---- movable allocations ------------------------------------------------
 *
 * A handle names an allocation the pool may move to fight fragmentation:
 * pin it to get its current address, unpin it when done. Only unpinned
 * blocks move, and only during llmem_pool_compact(); raw allocations from
 * llmem_pool_alloc never move. Handle blocks are whole pages (4 KiB host,
 * 64 KiB device): use them for tensors and KV slabs, not small objects.
 *
 *     llmem_handle h;
 *     llmem_pool_handle_alloc(p, bytes, &h);
 *     float *x = llmem_pool_pin(p, h, NULL);  ... use x ...
 *     llmem_pool_unpin(p, h);                  // x may move from now on
 *     llmem_pool_compact(p, 0, &report);       // when idle
 *     llmem_pool_handle_free(p, h);
 */
typedef uint64_t llmem_handle;
#define LLMEM_HANDLE_NULL ((llmem_handle)0)

typedef struct llmem_pool_compact_report {
    size_t struct_size;
    uint64_t bytes_moved;
    uint64_t blocks_moved;
    uint64_t bytes_released;          /* superblocks unmapped */
    uint64_t superblocks_released;
    double fragmentation_before;      /* 1 - largest free run / free bytes */
    double fragmentation_after;
} llmem_pool_compact_report;

/* A movable allocation of size bytes. LLMEM_EINVAL, LLMEM_EOVERFLOW,
 * LLMEM_ENOMEM. */
LLMEM_API llmem_status llmem_pool_handle_alloc(llmem_pool *p, size_t size, llmem_handle *out);

/* Its address, which stays valid until the matching unpin. Pins nest.
 * NULL with LLMEM_EINVAL for a stale or foreign handle. */
LLMEM_API void *llmem_pool_pin(llmem_pool *p, llmem_handle h, llmem_status *status);

/* LLMEM_ESTATE if not pinned, LLMEM_EINVAL for a stale handle. */
LLMEM_API llmem_status llmem_pool_unpin(llmem_pool *p, llmem_handle h);

/* Free it. LLMEM_EBUSY while pinned; LLMEM_EINVAL for a stale handle;
 * LLMEM_HANDLE_NULL is a no-op. (llmem_pool_free on its address is
 * refused with LLMEM_EINVAL.) */
LLMEM_API llmem_status llmem_pool_handle_free(llmem_pool *p, llmem_handle h);

/* The size it was allocated with, 0 for a stale handle. */
LLMEM_API size_t llmem_pool_handle_size(const llmem_pool *p, llmem_handle h);

/* Move unpinned handle blocks, until budget_bytes have moved (0 = no
 * limit; the block that crosses the budget still moves whole): empty
 * sparse superblocks into the others and unmap them, then slide blocks
 * down into holes so free space coalesces. The pool is locked meanwhile.
 * out (optional) reports what moved and what was released. */
LLMEM_API llmem_status llmem_pool_compact(llmem_pool *p, size_t budget_bytes, llmem_pool_compact_report *out);

LLMEM_API llmem_status llmem_pool_get_stats(const llmem_pool *p, llmem_pool_stats *out);
LLMEM_API const llmem_stats_schema *llmem_pool_stats_schema(void);

/* Per-class figures: fills up to cap entries (struct_size as for every
 * stats struct, per entry) and sets *count to the number of classes. */
LLMEM_API llmem_status llmem_pool_get_class_stats(const llmem_pool *p, llmem_pool_class_stats *out, size_t cap,
                                                  size_t *count);
LLMEM_API const llmem_stats_schema *llmem_pool_class_stats_schema(void);

/* Add the pool's stats and each size class's (those that ever held a slab
 * or served a block) to an exporter (llmem/stats.h), for Prometheus or
 * JSON: the pool's with `labels`, each class's with them and
 * class_bytes="<block size>". At most 16 labels. */
LLMEM_API llmem_status llmem_pool_export_stats(const llmem_pool *p, llmem_exporter *ex, const llmem_label *labels,
                                               size_t label_count);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_POOL_H */
