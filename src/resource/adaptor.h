/*
 * adaptor.h - shared start of every resource adaptor (limit, fault,
 * tracking). Not installed. An adaptor looks exactly like its upstream
 * (kind, granularity, alignments, capabilities) and is named after it:
 * "limit(os)", "fault(tracking(sim-device))".
 */
#ifndef LLMEM_ADAPTOR_H
#define LLMEM_ADAPTOR_H

#include <stdio.h>

#include "internal.h"

static inline void llmem__adaptor_init(llmem_resource *self, const llmem_resource_ops *ops, const char *kind,
                                       const llmem_resource *up)
{
    char name[48];
    snprintf(name, sizeof name, "%s(%s)", kind, up->info.name);
    llmem_resource_init(self, ops, name, up->info.kind, up->info.granularity, up->info.min_align,
                        up->info.max_align, up->info.caps);
}

#endif /* LLMEM_ADAPTOR_H */
