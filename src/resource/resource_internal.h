/*
 * resource_internal.h - what the resource layer's files (os.c, resource.c,
 * sim_device.c) share with each other and with the dynamic pool, the one
 * layer above that maps through the os resource directly. Not installed.
 * It lives here, not in src/core/internal.h, so that core depends on no
 * layer above it (docs/DECISIONS.md, "A map of the code").
 */
#ifndef LLMEM_RESOURCE_INTERNAL_H
#define LLMEM_RESOURCE_INTERNAL_H

#include <stddef.h>

#include "llmem/resource_impl.h"

/* mmap `size` bytes aligned to `align` (any power of two; over-map and trim
 * when above the page size). NULL with errno set on failure. (os.c) */
void *llmem__mmap_aligned(size_t size, size_t align, size_t page, int prot, int flags);

/* The os resource with transparent huge pages advised, the dynamic pool's
 * default (os.c). Never destroyed. */
llmem_resource *llmem__resource_default_thp(void);

/* llmem_resource.flags_: an immortal resource (a process-wide default) is
 * one llmem_resource_destroy leaves alone. Set once, at initialisation,
 * before the resource is published. */
#define LLMEM__RES_IMMORTAL 1u
static inline void llmem__resource_make_immortal(llmem_resource *r) { r->flags_ |= LLMEM__RES_IMMORTAL; }

#endif /* LLMEM_RESOURCE_INTERNAL_H */
