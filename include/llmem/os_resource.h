/*
 * llmem/os_resource.h - host memory straight from the kernel.
 *
 * Anonymous private mmap. Alignments above the page size (up to 1 GiB) are
 * had by over-reserving address space and trimming both ends, so no memory
 * is wasted. Decommit is madvise(MADV_DONTNEED) (RSS drops at once) or,
 * optionally, MADV_FREE (the kernel reclaims lazily, cheaper when memory is
 * reused soon). Huge pages: transparent ones by MADV_HUGEPAGE on mappings of
 * at least 2 MiB, or explicit ones by MAP_HUGETLB; when the system has no
 * huge pages reserved the mapping falls back to normal pages with
 * MADV_HUGEPAGE, or fails with LLMEM_ENOHUGE if `huge_strict` is set.
 * NUMA binding uses libnuma, loaded at run time when it is installed
 * (LLMEM_ENOTSUP at create when it is not, or when the node does not exist).
 * Uncommitted mappings are PROT_NONE with MAP_NORESERVE; commit is mprotect.
 * (Explicit huge pages are reserved at map time even for uncommitted
 * mappings, so a shortage is a map error, never a SIGBUS on first touch.)
 * unmap, commit and decommit of a range that is not all mapped (a double
 * unmap, a stale pointer) are refused with LLMEM_EINVAL, and change nothing.
 */
#ifndef LLMEM_OS_RESOURCE_H
#define LLMEM_OS_RESOURCE_H

#include <stdbool.h>

#include "llmem/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum llmem_os_huge {
    LLMEM_OS_HUGE_NONE = 0,    /* default: normal pages, the kernel's THP policy applies */
    LLMEM_OS_HUGE_THP = 1,     /* madvise(MADV_HUGEPAGE) on mappings of >= one huge page */
    LLMEM_OS_HUGE_HUGETLB = 2  /* MAP_HUGETLB; granularity becomes the huge page size */
} llmem_os_huge;

typedef enum llmem_os_decommit {
    LLMEM_OS_DECOMMIT_DONTNEED = 0, /* default: pages freed immediately, read back as zero */
    LLMEM_OS_DECOMMIT_FREE = 1      /* MADV_FREE: freed lazily under memory pressure */
} llmem_os_decommit;

typedef struct llmem_os_options {
    const char *name;          /* resource name; default "os" */
    llmem_os_huge huge;        /* default LLMEM_OS_HUGE_NONE */
    bool huge_strict;          /* HUGETLB only: fail with LLMEM_ENOHUGE instead of falling back */
    llmem_os_decommit decommit;/* default LLMEM_OS_DECOMMIT_DONTNEED */
    bool numa_bind;            /* bind every mapping to numa_node (needs libnuma) */
    int numa_node;             /* node for numa_bind */
    bool mlock;                /* mlock every committed mapping (LLMEM_EPERM past RLIMIT_MEMLOCK) */
    bool populate;             /* pre-fault every committed mapping (as LLMEM_MAP_POPULATE) */
} llmem_os_options;

/* The fields of llmem_os_stats after struct_size, in order: X(kind, value type,
 * name, help) for each; the struct and its schema are both made from it. */
#define LLMEM_OS_STATS_FIELDS(X) \
    X(GAUGE, U64, hugetlb_bytes, "Bytes mapped with MAP_HUGETLB now.") \
    /* HUGETLB mappings that fell back to normal pages */ \
    X(COUNTER, U64, hugetlb_fallbacks_total, "Huge page mappings that fell back to normal pages.") \
    /* bytes given MADV_HUGEPAGE */ \
    X(COUNTER, U64, thp_advised_bytes_total, "Bytes advised MADV_HUGEPAGE.") \
    /* locked now */ \
    X(GAUGE, U64, mlocked_bytes, "Bytes locked in memory now.") \
    X(COUNTER, U64, numa_bound_bytes_total, "Bytes bound to the NUMA node.")

/* Figures specific to the os resource. */
typedef struct llmem_os_stats {
    size_t struct_size;
    LLMEM_OS_STATS_FIELDS(LLMEM_STATS_MEMBER)
} llmem_os_stats;

LLMEM_API llmem_os_options llmem_os_options_default(void);

/* Create an os resource. opts may be NULL (defaults). Errors: LLMEM_EINVAL
 * (bad enum value), LLMEM_ENOTSUP (NUMA asked for but libnuma or the node is
 * missing), LLMEM_ENOMEM. */
LLMEM_API llmem_status llmem_os_resource_create(const llmem_os_options *opts,
                                                llmem_resource **out);

/* LLMEM_EINVAL if r is not an os resource. */
LLMEM_API llmem_status llmem_os_resource_get_stats(const llmem_resource *r, llmem_os_stats *out);
LLMEM_API const llmem_stats_schema *llmem_os_stats_schema(void);

/* What this host offers, for capability reports and tests. */
typedef struct llmem_os_caps {
    size_t page_size;          /* bytes */
    size_t huge_page_size;     /* bytes, 0 if unknown */
    uint64_t hugetlb_free;     /* reserved huge pages free now */
    bool thp_available;        /* transparent huge pages not "never" */
    bool numa_available;       /* libnuma loaded and the kernel has NUMA */
    int numa_nodes;            /* configured nodes (1 without NUMA) */
} llmem_os_caps;

LLMEM_API llmem_status llmem_os_get_caps(llmem_os_caps *out);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_OS_RESOURCE_H */
