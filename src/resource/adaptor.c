/*
 * adaptor.c - what every resource adaptor shares (see adaptor.h): argument
 * checks and allocation for create, and forwarders for ops it leaves as
 * they are upstream.
 */
#include <stdio.h>
#include <stdlib.h>

#include "adaptor.h"

llmem_status llmem__adaptor_check(const char *kind, const llmem_resource *upstream, llmem_resource **out)
{
    if (!out) return llmem__fail(LLMEM_EINVAL, "%s: null out", kind);
    *out = NULL;
    if (!upstream) return llmem__fail(LLMEM_EINVAL, "%s: null upstream", kind);
    return LLMEM_OK;
}

void *llmem__adaptor_new(size_t size, const llmem_resource_ops *ops, const char *kind, llmem_resource *upstream)
{
    llmem__adaptor *a = calloc(1, size);
    if (!a) {
        llmem__fail(LLMEM_ENOMEM, "%s: out of memory", kind);
        return NULL;
    }
    char name[48];
    snprintf(name, sizeof name, "%s(%s)", kind, upstream->info.name);
    const llmem_resource_info *in = &upstream->info;
    llmem_resource_init(&a->base, ops, name, in->kind, in->granularity, in->min_align, in->max_align, in->caps);
    a->up = upstream;
    return a;
}

llmem_status llmem__adaptor_map(llmem_resource *r, size_t size, size_t align, unsigned flags, const char *tag,
                                void **out)
{
    return llmem_resource_map_tagged(llmem__adaptor_up(r), size, align, flags, tag, out);
}

llmem_status llmem__adaptor_unmap(llmem_resource *r, void *ptr, size_t size, size_t committed)
{
    return llmem_resource_unmap(llmem__adaptor_up(r), ptr, size, committed);
}

llmem_status llmem__adaptor_commit(llmem_resource *r, void *ptr, size_t size)
{
    return llmem_resource_commit(llmem__adaptor_up(r), ptr, size);
}

llmem_status llmem__adaptor_decommit(llmem_resource *r, void *ptr, size_t size)
{
    return llmem_resource_decommit(llmem__adaptor_up(r), ptr, size);
}

llmem_status llmem__adaptor_copy(llmem_resource *r, void *dst, const void *src, size_t n)
{
    return llmem_resource_copy(llmem__adaptor_up(r), dst, src, n);
}

void llmem__adaptor_free(llmem_resource *r) { free(r); }
