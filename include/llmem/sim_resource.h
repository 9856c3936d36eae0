/*
 * llmem/sim_resource.h - device memory simulated on the host.
 *
 * Every GPU code path in llmem is tested through this resource on machines
 * without a GPU. Its mappings are host pages mapped PROT_NONE, so a pool or
 * KV manager that ever reads or writes device memory directly crashes at
 * once, as it would with a real device pointer. copy() is the only way in:
 * it checks that every device-side range lies inside a live mapping (an
 * out-of-bounds copy is LLMEM_EINVAL, like cuda-memcheck would report),
 * opens the pages for the copy and closes them again. Copies are serialised
 * per resource so one thread's open window does not hide another's bug for
 * long.
 *
 * Like cudaMalloc it aligns to 256 bytes, has a capacity (LLMEM_ENOMEM past
 * it), charges an optional cost per map and unmap call (a busy wait, to
 * model the synchronous price of cudaMalloc/cudaFree in benchmarks), and
 * keeps its own accounting apart from host memory.
 */
#ifndef LLMEM_SIM_RESOURCE_H
#define LLMEM_SIM_RESOURCE_H

#include "llmem/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_sim_options {
    const char *name;          /* default "sim-device" */
    size_t capacity;           /* device bytes; default 1 GiB */
    size_t granularity;        /* mapping granularity, power of two >= page size; default page size */
    uint64_t map_cost_ns;      /* busy-wait per map call; default 0 */
    uint64_t unmap_cost_ns;    /* busy-wait per unmap call; default 0 */
    unsigned char fill;        /* byte written into fresh mappings and into ranges committed
                                  later (0 = leave zeroed) so uninitialised reads show up;
                                  costs a page open per map or commit */
    bool discard_data;         /* copies are checked and counted but move no byte: for memory
                                  simulations (llmem replay) that allocate gigabytes they must
                                  not touch; device-to-host copies then leave the host side as it was */
} llmem_sim_options;

/* The fields of llmem_sim_stats after struct_size, in order: X(kind, value type,
 * name, help) for each; the struct and its schema are both made from it. */
#define LLMEM_SIM_STATS_FIELDS(X) \
    X(GAUGE, U64, capacity_bytes, "Simulated device capacity.") \
    /* mapped device bytes now */ \
    X(GAUGE, U64, used_bytes, "Committed device bytes now.") \
    X(GAUGE, U64, used_peak_bytes, "Highest used_bytes.") \
    /* maps refused for capacity */ \
    X(COUNTER, U64, oom_total, "Requests refused for capacity.") \
    /* copies refused: range outside live mappings or overlapping */ \
    X(COUNTER, U64, bad_copies_total, "Copies refused as out of bounds, uncommitted or overlapping.") \
    /* simulated time charged to map/unmap */ \
    X(COUNTER, U64, cost_ns_total, "Simulated nanoseconds charged to map and unmap calls.")

typedef struct llmem_sim_stats {
    size_t struct_size;
    LLMEM_SIM_STATS_FIELDS(LLMEM_STATS_MEMBER)
} llmem_sim_stats;

LLMEM_API llmem_sim_options llmem_sim_options_default(void);

LLMEM_API llmem_status llmem_sim_resource_create(const llmem_sim_options *opts,
                                                 llmem_resource **out);

/* LLMEM_EINVAL if r is not a sim-device resource. */
LLMEM_API llmem_status llmem_sim_resource_get_stats(const llmem_resource *r,
                                                    llmem_sim_stats *out);
LLMEM_API const llmem_stats_schema *llmem_sim_stats_schema(void);

/* True when [ptr, ptr+n) lies inside one live mapping of this sim resource
 * (for tests and for pools that want to validate a device pointer). */
LLMEM_API bool llmem_sim_resource_contains(const llmem_resource *r, const void *ptr, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_SIM_RESOURCE_H */
