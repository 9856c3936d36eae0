/*
 * llmem/fault_resource.h - make a resource fail on purpose.
 *
 * Wraps any resource and fails chosen calls with a chosen status (default
 * LLMEM_ENOMEM) without calling upstream, so every error path above it can
 * be driven in a test. Three triggers, any combination:
 *  - the Nth counted call fails, and the `fail_count` calls after it
 *    (SQLite's "the next N succeed, then M fail"; SIZE_MAX = fail forever);
 *  - once the bytes mapped and committed through it would pass a budget;
 *  - each counted call fails with probability p from a seeded generator.
 * Which operations are counted is a mask (default: map and commit). A
 * fault campaign counts the calls of a scenario with the fault disarmed,
 * then reruns the scenario with fail_nth = k for every k.
 */
#ifndef LLMEM_FAULT_RESOURCE_H
#define LLMEM_FAULT_RESOURCE_H

#include "llmem/resource.h"
#include "llmem/stats.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    LLMEM_FAULT_OP_MAP = 1u << 0,
    LLMEM_FAULT_OP_UNMAP = 1u << 1,
    LLMEM_FAULT_OP_COMMIT = 1u << 2,
    LLMEM_FAULT_OP_DECOMMIT = 1u << 3,
    LLMEM_FAULT_OP_COPY = 1u << 4,
    LLMEM_FAULT_OP_ALL = 0x1f
};

typedef struct llmem_fault_options {
    uint64_t fail_nth;         /* 1-based index of the first counted call to fail; 0 = off */
    uint64_t fail_count;       /* how many consecutive calls fail from there; 0 means 1 */
    uint64_t fail_after_bytes; /* fail maps/commits that would pass this many bytes; 0 = off */
    double probability;        /* 0..1; each counted call fails with it; 0 = off */
    uint64_t seed;             /* for probability; 0 picks a fixed default */
    unsigned ops;              /* LLMEM_FAULT_OP_* mask of counted calls; 0 = MAP|COMMIT */
    llmem_status status;       /* returned by injected failures; 0 = LLMEM_ENOMEM */
} llmem_fault_options;

/* The fields of llmem_fault_stats after struct_size, in order: X(kind, value type,
 * name, help) for each; the struct and its schema are both made from it. */
#define LLMEM_FAULT_STATS_FIELDS(X) \
    X(COUNTER, U64, calls_total, "Counted calls since the last arm.") \
    X(COUNTER, U64, injected_total, "Failures injected since the last arm.") \
    /* bytes mapped+committed through it since the last arm (counted calls upstream accepted; what the byte budget is charged) */ \
    X(COUNTER, U64, bytes_total, "Bytes mapped and committed through it since the last arm.")

typedef struct llmem_fault_stats {
    size_t struct_size;
    LLMEM_FAULT_STATS_FIELDS(LLMEM_STATS_MEMBER)
} llmem_fault_stats;

LLMEM_API llmem_fault_options llmem_fault_options_default(void);

/* upstream is borrowed. opts NULL = disarmed (counts calls only). */
LLMEM_API llmem_status llmem_fault_resource_create(llmem_resource *upstream,
                                                   const llmem_fault_options *opts,
                                                   llmem_resource **out);

/* Re-arm with new options and reset the counters. NULL disarms. */
LLMEM_API llmem_status llmem_fault_resource_arm(llmem_resource *r, const llmem_fault_options *opts);

LLMEM_API llmem_status llmem_fault_resource_get_stats(const llmem_resource *r,
                                                      llmem_fault_stats *out);

/* The schema of llmem_fault_stats for the exporter (llmem/stats.h). */
LLMEM_API const llmem_stats_schema *llmem_fault_stats_schema(void);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_FAULT_RESOURCE_H */
