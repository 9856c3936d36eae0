/*
 * llmem/resource.h - where bytes come from.
 *
 * A resource hands out large, aligned mappings (superblocks, chunks, slabs)
 * and takes them back. Pools never call mmap or cudaMalloc themselves: they
 * ask a resource. Because the interface is small - map/unmap,
 * commit/decommit, copy, a granularity, a kind - behaviours stack: a pool
 * over `fault(limit(tracking(os)))` fails on its 7th map call, is capped at
 * 2 GiB, and reports every mapping it leaked, with no `if` in the pool.
 *
 * Contract, for every resource:
 *  - map(size, align) returns a mapping of size rounded up to the
 *    resource's granularity, aligned to at least max(align, min_align).
 *    Alignments must be powers of two no larger than max_align.
 *  - Mappings are committed (usable) unless LLMEM_MAP_UNCOMMITTED asks for
 *    address space only (resources with LLMEM_RES_CAP_RESERVE); commit()
 *    makes a range usable, decommit() returns its physical pages while the
 *    address range stays reserved. Commit only uncommitted ranges and
 *    decommit only committed ones: the committed-bytes figures trust it.
 *  - unmap(ptr, size, committed) takes back a whole mapping exactly as
 *    mapped; `committed` says how many of its bytes are still committed
 *    (size for a mapping never decommitted) and is used for accounting.
 *  - copy(dst, src, n) moves bytes where each side is host memory or a live
 *    mapping of this resource; the ranges must not overlap. It is the only
 *    way llmem touches device memory.
 *  - Every function is thread-safe. Bad input is a status, never an abort.
 *  - Host resources hand out memory the CPU may touch; device resources do
 *    not (sim-device makes any direct touch a crash, as a GPU would).
 *
 * The process default resource (llmem_resource_default) is an os resource
 * with default options, created on first use and never destroyed; pools
 * created with a NULL resource use it.
 *
 * To write a resource of your own, see llmem/resource_impl.h.
 */
#ifndef LLMEM_RESOURCE_H
#define LLMEM_RESOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/stats.h"
#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_resource llmem_resource;

typedef enum llmem_mem_kind {
    LLMEM_MEM_HOST = 0,   /* the CPU may read and write the memory */
    LLMEM_MEM_DEVICE = 1  /* accelerator memory: touch it only through copy() */
} llmem_mem_kind;

/* Flags for llmem_resource_map. */
enum {
    LLMEM_MAP_UNCOMMITTED = 1u << 0, /* reserve address space only (needs LLMEM_RES_CAP_RESERVE) */
    LLMEM_MAP_POPULATE = 1u << 1     /* pre-fault the pages now (host), or touch nothing (device) */
};

/* Capability bits in llmem_resource_info.caps. */
enum {
    LLMEM_RES_CAP_DECOMMIT = 1u << 0, /* decommit() returns physical pages inside a mapping */
    LLMEM_RES_CAP_RESERVE = 1u << 1,  /* LLMEM_MAP_UNCOMMITTED mappings and commit() */
    LLMEM_RES_CAP_COPY = 1u << 2      /* copy() moves bytes to and from this resource */
};

/* The largest alignment any resource may be asked for: 1 GiB. */
#define LLMEM_MAX_ALIGN ((size_t)1 << 30)

typedef struct llmem_resource_info {
    const char *name;       /* e.g. "os", "sim-device", "limit(os)"; static for the resource's life */
    llmem_mem_kind kind;
    size_t granularity;     /* map/commit sizes are multiples of this (bytes, power of two) */
    size_t min_align;       /* every mapping is aligned at least this much (bytes) */
    size_t max_align;       /* the largest alignment map() accepts (bytes) */
    unsigned caps;          /* LLMEM_RES_CAP_* bits */
} llmem_resource_info;

/* The fields of llmem_resource_stats after struct_size, in order: X(kind, value type,
 * name, help) for each; the struct and its schema are both made from it. */
#define LLMEM_RESOURCE_STATS_FIELDS(X) \
    X(GAUGE, U64, mapped_bytes, "Address space currently mapped from the resource.") \
    X(GAUGE, U64, mapped_peak_bytes, "Highest mapped_bytes.") \
    /* sum of all successful map sizes */ \
    X(COUNTER, U64, mapped_bytes_total, "Bytes mapped over the resource's life.") \
    /* of mapped_bytes, how much is committed */ \
    X(GAUGE, U64, committed_bytes, "Mapped bytes currently committed.") \
    X(GAUGE, U64, committed_peak_bytes, "Highest committed_bytes.") \
    X(GAUGE, U64, mappings, "Live mappings.") \
    X(COUNTER, U64, map_calls_total, "Successful map calls.") \
    X(COUNTER, U64, unmap_calls_total, "Successful unmap calls.") \
    X(COUNTER, U64, commit_calls_total, "Successful commit calls.") \
    X(COUNTER, U64, decommit_calls_total, "Successful decommit calls.") \
    X(COUNTER, U64, copy_calls_total, "Successful copy calls.") \
    X(COUNTER, U64, copy_bytes_total, "Bytes copied.") \
    /* calls that returned an error, bad input included */ \
    X(COUNTER, U64, failures_total, "Calls that returned an error.")

/* Figures every resource keeps (through the common wrapper). Byte levels
 * follow the commit contract above. */
typedef struct llmem_resource_stats {
    size_t struct_size;
    LLMEM_RESOURCE_STATS_FIELDS(LLMEM_STATS_MEMBER)
} llmem_resource_stats;

/* The process-wide default os resource. Never NULL, never destroyed. */
LLMEM_API llmem_resource *llmem_resource_default(void);

/* Map `size` bytes (rounded up to the granularity) aligned to `align` (0
 * means min_align). On success *out is the mapping; on failure *out is NULL.
 * Errors: LLMEM_EINVAL (null r or out, size 0, unknown flags, UNCOMMITTED on
 * a resource without LLMEM_RES_CAP_RESERVE), LLMEM_EOVERFLOW (rounding
 * overflows), LLMEM_EALIGN, LLMEM_ENOMEM, and resource-specific codes. */
LLMEM_API llmem_status llmem_resource_map(llmem_resource *r, size_t size, size_t align,
                                          unsigned flags, void **out);

/* The same, with a caller tag (e.g. the pool's name) that adaptors such as
 * tracking record with the mapping. The tag is copied; NULL is allowed. */
LLMEM_API llmem_status llmem_resource_map_tagged(llmem_resource *r, size_t size, size_t align,
                                                 unsigned flags, const char *tag, void **out);

/* Return a whole mapping. `size` is the size passed to map (or its rounded
 * value); `committed` is how many of its bytes are still committed. */
LLMEM_API llmem_status llmem_resource_unmap(llmem_resource *r, void *ptr, size_t size,
                                            size_t committed);

/* Make [ptr, ptr+size) usable. ptr and size must be granularity multiples
 * inside one mapping. Resources without LLMEM_RES_CAP_RESERVE treat it as a
 * no-op that succeeds (their memory is always committed). */
LLMEM_API llmem_status llmem_resource_commit(llmem_resource *r, void *ptr, size_t size);

/* Give back the physical pages of [ptr, ptr+size) but keep the addresses.
 * Contents are lost. LLMEM_ENOTSUP without LLMEM_RES_CAP_DECOMMIT. */
LLMEM_API llmem_status llmem_resource_decommit(llmem_resource *r, void *ptr, size_t size);

/* Copy n bytes (see the contract above). n == 0 is a successful no-op.
 * LLMEM_ENOTSUP on a device resource without LLMEM_RES_CAP_COPY. */
LLMEM_API llmem_status llmem_resource_copy(llmem_resource *r, void *dst, const void *src,
                                           size_t n);

/* Round size up to the granularity; LLMEM_EOVERFLOW if it cannot. */
LLMEM_API llmem_status llmem_resource_round(const llmem_resource *r, size_t size, size_t *out);

LLMEM_API llmem_status llmem_resource_get_info(const llmem_resource *r, llmem_resource_info *out);

/* Convenience accessors; NULL r gives "", LLMEM_MEM_HOST, 0. */
LLMEM_API const char *llmem_resource_name(const llmem_resource *r);
LLMEM_API llmem_mem_kind llmem_resource_kind(const llmem_resource *r);
LLMEM_API size_t llmem_resource_granularity(const llmem_resource *r);

LLMEM_API llmem_status llmem_resource_get_stats(const llmem_resource *r, llmem_resource_stats *out);
LLMEM_API const llmem_stats_schema *llmem_resource_stats_schema(void);

/* Destroy a resource. Mappings still live are the caller's leak (a tracking
 * adaptor reports them). Adaptors do not destroy their upstream: destroy a
 * stack from the top down. NULL and the default resource are no-ops. */
LLMEM_API void llmem_resource_destroy(llmem_resource *r);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_RESOURCE_H */
