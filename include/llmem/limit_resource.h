/*
 * llmem/limit_resource.h - cap the bytes a resource may hand out.
 *
 * Wraps any resource. A map or commit that would take the counted bytes
 * past the cap fails with LLMEM_ENOMEM (the message names the limit), so a
 * pool sees exactly what it would see on a smaller machine or GPU. By
 * default committed bytes are counted (a plain mapping is committed; an
 * uncommitted reservation counts when committed); LLMEM_LIMIT_MAPPED counts
 * address space instead. The cap can be moved at run time; lowering it
 * below the current usage refuses new memory until usage drops.
 */
#ifndef LLMEM_LIMIT_RESOURCE_H
#define LLMEM_LIMIT_RESOURCE_H

#include "llmem/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum llmem_limit_what {
    LLMEM_LIMIT_COMMITTED = 0, /* default */
    LLMEM_LIMIT_MAPPED = 1
} llmem_limit_what;

typedef struct llmem_limit_options {
    size_t limit_bytes;        /* the cap; required (0 is LLMEM_EINVAL) */
    llmem_limit_what what;     /* default LLMEM_LIMIT_COMMITTED */
} llmem_limit_options;

LLMEM_API llmem_limit_options llmem_limit_options_default(void);

/* upstream is borrowed: destroy the limit resource before it. */
LLMEM_API llmem_status llmem_limit_resource_create(llmem_resource *upstream,
                                                   const llmem_limit_options *opts,
                                                   llmem_resource **out);

LLMEM_API llmem_status llmem_limit_resource_set(llmem_resource *r, size_t limit_bytes);

/* Bytes counted against the cap now, and the cap. */
LLMEM_API llmem_status llmem_limit_resource_usage(const llmem_resource *r, size_t *used,
                                                  size_t *limit);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_LIMIT_RESOURCE_H */
