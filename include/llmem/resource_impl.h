/*
 * llmem/resource_impl.h - writing a resource.
 *
 * A resource is a struct that embeds `llmem_resource` as its first member
 * and points it at a static const ops table. The public wrappers in
 * llmem/resource.h validate arguments (null pointers, zero and overflowing
 * sizes, alignments, flags), round sizes to the granularity, keep the
 * common statistics, and record the last-error message, so the ops only do
 * the work and may assume:
 *  - size is a non-zero multiple of info.granularity;
 *  - align is a power of two with min_align <= align <= max_align;
 *  - flags only holds bits the resource's caps allow;
 *  - for unmap/commit/decommit, ptr and size are granularity-aligned.
 * Ops return LLMEM_OK or an error status after calling llmem_error_set()
 * with a message (the wrapper adds one naming the resource if they do not).
 *
 * Optional ops may be NULL: commit (memory is always committed), decommit
 * (LLMEM_ENOTSUP), copy (memmove for host resources, LLMEM_ENOTSUP for
 * device ones), destroy (nothing to free).
 *
 *     static const llmem_resource_ops my_ops = {
 *         .map = my_map, .unmap = my_unmap, .destroy = my_destroy,
 *     };
 *     llmem_resource_init(&self->base, &my_ops, "mine", LLMEM_MEM_HOST,
 *                         4096, 4096, LLMEM_MAX_ALIGN, 0);
 */
#ifndef LLMEM_RESOURCE_IMPL_H
#define LLMEM_RESOURCE_IMPL_H

#include "llmem/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_resource_ops {
    llmem_status (*map)(llmem_resource *r, size_t size, size_t align, unsigned flags,
                        const char *tag, void **out);
    llmem_status (*unmap)(llmem_resource *r, void *ptr, size_t size, size_t committed);
    llmem_status (*commit)(llmem_resource *r, void *ptr, size_t size);
    llmem_status (*decommit)(llmem_resource *r, void *ptr, size_t size);
    llmem_status (*copy)(llmem_resource *r, void *dst, const void *src, size_t n);
    void (*destroy)(llmem_resource *r);
} llmem_resource_ops;

/* The common part of every resource. Counters are updated by the wrappers
 * with atomic builtins; implementations must not write them. */
struct llmem_resource {
    const llmem_resource_ops *ops;
    llmem_resource_info info;
    char name_buf[48];
    llmem_resource_stats counters_; /* private to the wrappers */
    unsigned flags_;                /* private to the wrappers (llmem_resource_init zeroes it) */
};

/* Fill the common part. `name` is copied (truncated to 47 bytes).
 * granularity and min_align must be powers of two. */
LLMEM_API void llmem_resource_init(llmem_resource *r, const llmem_resource_ops *ops,
                                   const char *name, llmem_mem_kind kind, size_t granularity,
                                   size_t min_align, size_t max_align, unsigned caps);

/* Ops report failures through llmem_error_set (llmem/status.h). */

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_RESOURCE_IMPL_H */
