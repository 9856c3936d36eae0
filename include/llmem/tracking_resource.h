/*
 * llmem/tracking_resource.h - remember every live mapping.
 *
 * Wraps any resource and records each live mapping with its size, its
 * committed bytes and the tag of the caller that mapped it (a pool's name).
 * It refuses, with a status and nothing forwarded upstream, what would
 * corrupt the upstream: unmapping a pointer it never handed out, a size
 * that differs from the mapping's, a committed figure that does not match
 * the commit/decommit calls seen, commit ranges outside a mapping. After a
 * test or at shutdown, the leak report lists what is still mapped.
 * llmem_resource_destroy on a tracking resource with live mappings logs
 * them at LLMEM_LOG_ERROR (a summary with the count and bytes, then the 16
 * oldest one by one) and leaves them mapped upstream: they are a leak of
 * the caller's, perhaps still in use.
 */
#ifndef LLMEM_TRACKING_RESOURCE_H
#define LLMEM_TRACKING_RESOURCE_H

#include <stdio.h>

#include "llmem/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The fields of llmem_tracking_stats after struct_size, in order: X(kind, value type,
 * name, help) for each; the struct and its schema are both made from it. */
#define LLMEM_TRACKING_STATS_FIELDS(X) \
    X(GAUGE, U64, live_mappings, "Mappings live now.") \
    X(GAUGE, U64, live_bytes, "Bytes in live mappings.") \
    X(GAUGE, U64, peak_bytes, "Highest live_bytes.") \
    X(GAUGE, U64, peak_mappings, "Highest live_mappings.") \
    /* calls refused as invalid (foreign pointer, size mismatch...) */ \
    X(COUNTER, U64, refused_total, "Calls refused as invalid.")

typedef struct llmem_tracking_stats {
    size_t struct_size;
    LLMEM_TRACKING_STATS_FIELDS(LLMEM_STATS_MEMBER)
} llmem_tracking_stats;

/* One live mapping, as passed to the foreach callback. */
typedef struct llmem_tracking_entry {
    void *ptr;
    size_t size;               /* rounded mapping size */
    size_t committed;          /* bytes committed now, by the contract */
    const char *tag;           /* caller tag, "" if none */
    uint64_t seq;              /* 1 for the first map through this resource, and so on */
} llmem_tracking_entry;

/* upstream is borrowed. */
LLMEM_API llmem_status llmem_tracking_resource_create(llmem_resource *upstream,
                                                      llmem_resource **out);

LLMEM_API llmem_status llmem_tracking_resource_get_stats(const llmem_resource *r,
                                                         llmem_tracking_stats *out);
LLMEM_API const llmem_stats_schema *llmem_tracking_stats_schema(void);

/* Call fn for each live mapping, oldest first, under the resource's lock
 * (fn must not call into this resource). Stops early if fn returns false. */
LLMEM_API llmem_status llmem_tracking_resource_foreach(const llmem_resource *r,
                                                       bool (*fn)(void *user,
                                                                  const llmem_tracking_entry *e),
                                                       void *user);

/* Write a leak report (one line per live mapping, then a summary) to f and
 * return the number of live mappings in *leaks (optional). Prints nothing
 * but the summary when there are none. */
LLMEM_API llmem_status llmem_tracking_resource_report(const llmem_resource *r, FILE *f,
                                                      size_t *leaks);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_TRACKING_RESOURCE_H */
