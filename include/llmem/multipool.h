/*
 * llmem/multipool.h - dedicated fixed-size pools for the sizes a program
 * really asks for most, with the dynamic pool for everything else.
 *
 * Built from a profile (llmem/profile.h): the k most frequent sizes (each
 * at least min_share of all allocations, at most max_size bytes) get a
 * thread-safe fixed pool each, so they cost an O(1) pop and waste nothing
 * but alignment; every other size goes to a general llmem_pool. This is the
 * "multi-size pool built from a profile of the sizes an engine really asks
 * for" of the design.
 *
 *     llmem_multipool *mp;
 *     llmem_multipool_create(NULL, profile, &mp);
 *     void *x = llmem_multipool_alloc(mp, 4096, NULL);
 *     llmem_multipool_free_sized(mp, x, 4096);   // or llmem_multipool_free
 *
 * free() finds the owner by asking each dedicated pool (a binary search over
 * its few chunks each); free_sized() goes straight to the pool for that size
 * and trusts the size it is given.
 */
#ifndef LLMEM_MULTIPOOL_H
#define LLMEM_MULTIPOOL_H

#include "llmem/pool.h"
#include "llmem/profile.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_multipool llmem_multipool;

#define LLMEM_MULTIPOOL_MAX_SIZES 32

typedef struct llmem_multipool_options {
    const char *name;            /* default "multipool" */
    llmem_resource *resource;    /* borrowed; default llmem_resource_default() */
    size_t k;                    /* dedicated pools at most; default 8, at most LLMEM_MULTIPOOL_MAX_SIZES */
    double min_share;            /* a size needs this share of all allocations; default 0.01 */
    size_t max_size;             /* largest size given a pool of its own; default 1 MiB */
    llmem_pool_options fallback; /* the general pool's options (its resource is this one); zero = defaults */
} llmem_multipool_options;

/* The fields of llmem_multipool_stats after struct_size, in order: X(kind, value type,
 * name, help) for each; the struct and its schema are both made from it. */
#define LLMEM_MULTIPOOL_STATS_FIELDS(X) \
    X(GAUGE, U64, dedicated_pools, "Sizes with a fixed pool of their own.") \
    X(COUNTER, U64, dedicated_allocs_total, "Allocations served by a dedicated pool.") \
    X(COUNTER, U64, fallback_allocs_total, "Allocations served by the general pool.") \
    /* bytes asked for, over all allocations */ \
    X(COUNTER, U64, requested_bytes_total, "Bytes asked for.") \
    /* bytes handed out for them (block sizes) */ \
    X(COUNTER, U64, usable_bytes_total, "Bytes handed out for them.") \
    /* dedicated chunks plus the general pool's superblocks */ \
    X(GAUGE, U64, reserved_bytes, "Bytes mapped by all the pools.")

typedef struct llmem_multipool_stats {
    size_t struct_size;
    LLMEM_MULTIPOOL_STATS_FIELDS(LLMEM_STATS_MEMBER)
} llmem_multipool_stats;

LLMEM_API llmem_multipool_options llmem_multipool_options_default(void);

/* profile may be NULL (then everything goes to the general pool). */
LLMEM_API llmem_status llmem_multipool_create(const llmem_multipool_options *opts, const llmem_profile *profile,
                                              llmem_multipool **out);
LLMEM_API void llmem_multipool_destroy(llmem_multipool *mp);

LLMEM_API void *llmem_multipool_alloc(llmem_multipool *mp, size_t size, llmem_status *status);
LLMEM_API llmem_status llmem_multipool_free(llmem_multipool *mp, void *ptr);
LLMEM_API llmem_status llmem_multipool_free_sized(llmem_multipool *mp, void *ptr, size_t size);

/* The sizes with a pool of their own (ascending); returns how many. */
LLMEM_API size_t llmem_multipool_sizes(const llmem_multipool *mp, uint32_t *sizes, size_t cap);

/* The general pool, for its stats or its own calls. */
LLMEM_API llmem_pool *llmem_multipool_fallback(llmem_multipool *mp);

LLMEM_API llmem_status llmem_multipool_get_stats(const llmem_multipool *mp, llmem_multipool_stats *out);
LLMEM_API const llmem_stats_schema *llmem_multipool_stats_schema(void);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_MULTIPOOL_H */
