/*
 * llmem/profile.h - what sizes a program really asks for, and for how long.
 *
 * A profile is a histogram of requested sizes with the mean lifetime of
 * each size, recorded from a running program cheaply enough to leave on:
 * a thread records one allocation in `sample_every` (a thread-local
 * countdown; the recorded ones update a lock-free table with atomic adds),
 * and a sampled allocation's lifetime is measured when it is freed (a
 * bitmap lets frees of unsampled pointers skip the lookup). Counts are
 * scaled back by the sampling rate.
 *
 * A pool records into a profile when its options name one. From a profile:
 *  - llmem_profile_suggest_classes picks the sizes worth a size class of
 *    their own, for llmem_pool_options.extra_classes (the pool then wastes
 *    nothing on them);
 *  - llmem/multipool.h builds dedicated fixed-size pools for the top sizes.
 * Profiles save to and load from a small text file, so one run's profile
 * shapes the next run's pools.
 *
 *     llmem_profile *prof;
 *     llmem_profile_create(NULL, &prof);
 *     opts.profile = prof;                      // pool records into it
 *     ... run ...
 *     llmem_profile_save(prof, "sizes.prof");
 */
#ifndef LLMEM_PROFILE_H
#define LLMEM_PROFILE_H

#include <stddef.h>
#include <stdint.h>

#include "llmem/stats.h"
#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_profile llmem_profile;

typedef struct llmem_profile_options {
    uint32_t sample_every;   /* record one allocation in this many per thread; default 16 (1 = all) */
    uint32_t max_sizes;      /* distinct sizes kept exactly; default 4096 (later ones are counted as other) */
} llmem_profile_options;

/* One requested size. */
typedef struct llmem_profile_entry {
    uint64_t size;           /* bytes asked for */
    uint64_t count;          /* allocations (estimated from samples) */
    uint64_t bytes;          /* size * count */
    uint64_t lifetimes;      /* sampled allocations whose free was seen */
    double mean_lifetime_s;  /* their mean lifetime, 0 if none */
} llmem_profile_entry;

/* The fields of llmem_profile_stats after struct_size, in order: X(kind, value type,
 * name, help) for each; the struct and its schema are both made from it. */
#define LLMEM_PROFILE_STATS_FIELDS(X) \
    X(COUNTER, U64, samples_total, "Allocations recorded.") \
    /* estimated allocations seen (samples * rate) */ \
    X(COUNTER, U64, allocations_total, "Allocations seen, estimated from the samples.") \
    X(GAUGE, U64, distinct_sizes, "Distinct sizes in the histogram.") \
    /* samples whose size found no room in the table */ \
    X(COUNTER, U64, other_samples_total, "Samples whose size found no room in the histogram.") \
    /* sampled frees matched */ \
    X(COUNTER, U64, lifetimes_total, "Sampled allocations whose free was seen.")

typedef struct llmem_profile_stats {
    size_t struct_size;
    LLMEM_PROFILE_STATS_FIELDS(LLMEM_STATS_MEMBER)
} llmem_profile_stats;

LLMEM_API llmem_profile_options llmem_profile_options_default(void);
LLMEM_API llmem_status llmem_profile_create(const llmem_profile_options *opts, llmem_profile **out);
LLMEM_API void llmem_profile_destroy(llmem_profile *pr);

/* Record an allocation of size bytes at ptr, and its free. Thread-safe;
 * NULL profile or pointer is a no-op. */
LLMEM_API void llmem_profile_record_alloc(llmem_profile *pr, size_t size, const void *ptr);
LLMEM_API void llmem_profile_record_free(llmem_profile *pr, const void *ptr);

/* The most frequent sizes, by count, largest first: fills up to cap
 * entries, *n gets how many were filled. */
LLMEM_API llmem_status llmem_profile_top(const llmem_profile *pr, llmem_profile_entry *out, size_t cap, size_t *n);

/* Sizes that deserve a class of their own: the up to k most frequent sizes
 * of at most max_size bytes, each at least min_share of all allocations,
 * rounded up to align (a power of two). Sorted ascending, duplicates
 * merged. */
LLMEM_API llmem_status llmem_profile_suggest_classes(const llmem_profile *pr, size_t k, size_t max_size, size_t align,
                                                     double min_share, uint32_t *sizes, size_t *n);

/* Text file: a header line, then "size count lifetimes mean_lifetime_s"
 * per size. load replaces the profile's contents. */
LLMEM_API llmem_status llmem_profile_save(const llmem_profile *pr, const char *path);
LLMEM_API llmem_status llmem_profile_load(llmem_profile *pr, const char *path);

LLMEM_API llmem_status llmem_profile_get_stats(const llmem_profile *pr, llmem_profile_stats *out);
LLMEM_API const llmem_stats_schema *llmem_profile_stats_schema(void);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_PROFILE_H */
