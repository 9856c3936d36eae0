/*
 * resource.c - the checked front door of every resource.
 *
 * The wrappers validate what callers pass (so each implementation can trust
 * its arguments, see resource_impl.h), round sizes to the granularity, keep
 * the common counters with relaxed atomics, and make sure every failure
 * leaves a message naming the resource. Host memory is unpoisoned for
 * AddressSanitizer before it goes back to the kernel, because a pool may
 * have poisoned parts of it and the next mapping at that address must start
 * clean.
 */
#include <string.h>

#include "internal.h"
#include "resource_internal.h"

#define C(r) (&(r)->counters_)

void llmem_resource_init(llmem_resource *r, const llmem_resource_ops *ops, const char *name, llmem_mem_kind kind,
                         size_t granularity, size_t min_align, size_t max_align, unsigned caps)
{
    memset(r, 0, sizeof *r);
    r->ops = ops;
    llmem__copy_name(r->name_buf, sizeof r->name_buf, name, "resource");
    r->info.name = r->name_buf;
    r->info.kind = kind;
    r->info.granularity = granularity;
    r->info.min_align = min_align;
    r->info.max_align = max_align > LLMEM_MAX_ALIGN ? LLMEM_MAX_ALIGN : max_align;
    r->info.caps = caps;
    r->counters_.struct_size = sizeof r->counters_;
}

/* Count a failure and make sure a message exists naming the resource: ops
 * and the checks below leave one; if the last message was written before
 * this call (seq unchanged), write a generic one. */
static llmem_status failed_since(llmem_resource *r, llmem_status st, const char *op, uint64_t seq)
{
    llmem__add(&C(r)->failures_total, 1);
    if (llmem__error_seq() == seq)
        llmem__fail(st, "resource '%s': %s failed: %s", r->info.name, op, llmem_status_str(st));
    return st;
}

/* For checks in this file, which always write their own message. */
static llmem_status failed(llmem_resource *r, llmem_status st, const char *op)
{
    return failed_since(r, st, op, UINT64_MAX);
}

llmem_status llmem_resource_round(const llmem_resource *r, size_t size, size_t *out)
{
    if (!r || !out) return llmem__fail(LLMEM_EINVAL, "resource: null argument to round");
    if (!llmem__align_up(size, r->info.granularity, out) || *out > (size_t)PTRDIFF_MAX)
        return llmem__fail(LLMEM_EOVERFLOW, "resource '%s': size %zu overflows when rounded to %zu", r->info.name,
                           size, r->info.granularity);
    return LLMEM_OK;
}

/* Validate the resource and a (ptr, size) range argument, and round size. */
static llmem_status check_range(llmem_resource *r, const void *ptr, size_t size, const char *op, size_t *rounded)
{
    if (!r) return llmem__fail(LLMEM_EINVAL, "resource: null resource passed to %s", op);
    if (!ptr) return failed(r, llmem__fail(LLMEM_EINVAL, "resource '%s': %s of a null pointer", r->info.name, op), op);
    if (size == 0) return failed(r, llmem__fail(LLMEM_EINVAL, "resource '%s': %s of size 0", r->info.name, op), op);
    if ((uintptr_t)ptr & (r->info.granularity - 1))
        return failed(r,
                      llmem__fail(LLMEM_EINVAL, "resource '%s': %s of %p, not a multiple of the granularity %zu",
                                  r->info.name, op, ptr, r->info.granularity),
                      op);
    llmem_status st = llmem_resource_round(r, size, rounded);
    if (st) return failed(r, st, op);
    if ((uintptr_t)ptr > UINTPTR_MAX - *rounded)
        return failed(r, llmem__fail(LLMEM_EOVERFLOW, "resource '%s': %s range wraps around", r->info.name, op), op);
    return LLMEM_OK;
}

llmem_status llmem_resource_map_tagged(llmem_resource *r, size_t size, size_t align, unsigned flags, const char *tag,
                                       void **out)
{
    if (out) *out = NULL;
    if (!r) return llmem__fail(LLMEM_EINVAL, "resource: null resource passed to map");
    if (!out) return failed(r, llmem__fail(LLMEM_EINVAL, "resource '%s': null out passed to map", r->info.name), "map");
    if (size == 0) return failed(r, llmem__fail(LLMEM_EINVAL, "resource '%s': map of size 0", r->info.name), "map");
    if (flags & ~(unsigned)(LLMEM_MAP_UNCOMMITTED | LLMEM_MAP_POPULATE))
        return failed(r, llmem__fail(LLMEM_EINVAL, "resource '%s': unknown map flags 0x%x", r->info.name, flags),
                      "map");
    if ((flags & LLMEM_MAP_UNCOMMITTED) && !(r->info.caps & LLMEM_RES_CAP_RESERVE))
        return failed(r,
                      llmem__fail(LLMEM_EINVAL, "resource '%s' cannot reserve uncommitted address space",
                                  r->info.name),
                      "map");
    if (align == 0) align = r->info.min_align;
    if (!llmem__is_pow2(align) || align > r->info.max_align)
        return failed(r,
                      llmem__fail(LLMEM_EALIGN, "resource '%s': alignment %zu is not a power of two up to %zu",
                                  r->info.name, align, r->info.max_align),
                      "map");
    if (align < r->info.min_align) align = r->info.min_align;
    size_t rounded;
    llmem_status st = llmem_resource_round(r, size, &rounded);
    if (st) return failed(r, st, "map");
    void *p = NULL;
    uint64_t seq = llmem__error_seq();
    st = r->ops->map(r, rounded, align, flags, tag, &p);
    if (st) return failed_since(r, st, "map", seq);
    llmem_resource_stats *c = C(r);
    llmem__max(&c->mapped_peak_bytes, llmem__add(&c->mapped_bytes, rounded));
    llmem__add(&c->mapped_bytes_total, rounded);
    llmem__add(&c->mappings, 1);
    llmem__add(&c->map_calls_total, 1);
    if (!(flags & LLMEM_MAP_UNCOMMITTED)) llmem__max(&c->committed_peak_bytes, llmem__add(&c->committed_bytes, rounded));
    *out = p;
    return LLMEM_OK;
}

llmem_status llmem_resource_map(llmem_resource *r, size_t size, size_t align, unsigned flags, void **out)
{
    return llmem_resource_map_tagged(r, size, align, flags, NULL, out);
}

llmem_status llmem_resource_unmap(llmem_resource *r, void *ptr, size_t size, size_t committed)
{
    size_t rounded;
    llmem_status st = check_range(r, ptr, size, "unmap", &rounded);
    if (st) return st;
    if (committed > rounded)
        return failed(r,
                      llmem__fail(LLMEM_EINVAL, "resource '%s': unmap of %zu bytes claims %zu committed",
                                  r->info.name, rounded, committed),
                      "unmap");
    /* Committed bytes are whole granules, like the size: a caller passing
     * the size it asked map for means "all of it". Cannot wrap (<= rounded). */
    llmem__align_up(committed, r->info.granularity, &committed);
    uint64_t seq = llmem__error_seq();
    st = r->ops->unmap(r, ptr, rounded, committed);
    if (st) return failed_since(r, st, "unmap", seq);
    /* Only now that the pages are gone: a refused unmap must not wipe the
     * poisoning of memory that still belongs to someone. */
    if (r->info.kind == LLMEM_MEM_HOST) LLMEM_UNPOISON(ptr, rounded);
    llmem_resource_stats *c = C(r);
    llmem__sub(&c->mapped_bytes, rounded);
    llmem__sub(&c->committed_bytes, committed);
    llmem__sub(&c->mappings, 1);
    llmem__add(&c->unmap_calls_total, 1);
    return LLMEM_OK;
}

llmem_status llmem_resource_commit(llmem_resource *r, void *ptr, size_t size)
{
    size_t rounded;
    llmem_status st = check_range(r, ptr, size, "commit", &rounded);
    if (st) return st;
    if (!(r->info.caps & LLMEM_RES_CAP_RESERVE) || !r->ops->commit) return LLMEM_OK; /* always committed */
    uint64_t seq = llmem__error_seq();
    st = r->ops->commit(r, ptr, rounded);
    if (st) return failed_since(r, st, "commit", seq);
    llmem_resource_stats *c = C(r);
    llmem__max(&c->committed_peak_bytes, llmem__add(&c->committed_bytes, rounded));
    llmem__add(&c->commit_calls_total, 1);
    return LLMEM_OK;
}

llmem_status llmem_resource_decommit(llmem_resource *r, void *ptr, size_t size)
{
    size_t rounded;
    llmem_status st = check_range(r, ptr, size, "decommit", &rounded);
    if (st) return st;
    if (!(r->info.caps & LLMEM_RES_CAP_DECOMMIT) || !r->ops->decommit)
        return failed(r, llmem__fail(LLMEM_ENOTSUP, "resource '%s' cannot decommit", r->info.name), "decommit");
    uint64_t seq = llmem__error_seq();
    st = r->ops->decommit(r, ptr, rounded);
    if (st) return failed_since(r, st, "decommit", seq);
    if (r->info.kind == LLMEM_MEM_HOST) LLMEM_UNPOISON(ptr, rounded); /* the pages are fresh now */
    llmem_resource_stats *c = C(r);
    llmem__sub(&c->committed_bytes, rounded);
    llmem__add(&c->decommit_calls_total, 1);
    return LLMEM_OK;
}

llmem_status llmem_resource_copy(llmem_resource *r, void *dst, const void *src, size_t n)
{
    if (!r) return llmem__fail(LLMEM_EINVAL, "resource: null resource passed to copy");
    if (n == 0) return LLMEM_OK;
    if (!dst || !src)
        return failed(r, llmem__fail(LLMEM_EINVAL, "resource '%s': copy with a null pointer", r->info.name), "copy");
    if ((uintptr_t)dst > UINTPTR_MAX - n || (uintptr_t)src > UINTPTR_MAX - n)
        return failed(r, llmem__fail(LLMEM_EOVERFLOW, "resource '%s': copy range wraps around", r->info.name), "copy");
    llmem_status st;
    uint64_t seq = llmem__error_seq();
    if (r->ops->copy) {
        st = r->ops->copy(r, dst, src, n);
    } else if (r->info.kind == LLMEM_MEM_HOST) {
        memmove(dst, src, n);
        st = LLMEM_OK;
    } else {
        st = llmem__fail(LLMEM_ENOTSUP, "resource '%s' cannot copy", r->info.name);
    }
    if (st) return failed_since(r, st, "copy", seq);
    llmem__add(&C(r)->copy_calls_total, 1);
    llmem__add(&C(r)->copy_bytes_total, n);
    return LLMEM_OK;
}

llmem_status llmem_resource_get_info(const llmem_resource *r, llmem_resource_info *out)
{
    if (!r || !out) return llmem__fail(LLMEM_EINVAL, "resource: null argument to get_info");
    *out = r->info;
    return LLMEM_OK;
}

const char *llmem_resource_name(const llmem_resource *r) { return r ? r->info.name : ""; }
llmem_mem_kind llmem_resource_kind(const llmem_resource *r) { return r ? r->info.kind : LLMEM_MEM_HOST; }
size_t llmem_resource_granularity(const llmem_resource *r) { return r ? r->info.granularity : 0; }

llmem_status llmem_resource_get_stats(const llmem_resource *r, llmem_resource_stats *out)
{
    if (!r || !out) return llmem__fail(LLMEM_EINVAL, "resource: null argument to get_stats");
    llmem_resource_stats s;
    const uint64_t *src = (const uint64_t *)((const char *)&r->counters_ + offsetof(llmem_resource_stats, mapped_bytes));
    uint64_t *dst = (uint64_t *)((char *)&s + offsetof(llmem_resource_stats, mapped_bytes));
    size_t n = (sizeof s - offsetof(llmem_resource_stats, mapped_bytes)) / sizeof(uint64_t);
    for (size_t i = 0; i < n; i++) dst[i] = llmem__ld(&src[i]);
    return llmem__stats_out(out, &s, sizeof s);
}

LLMEM__STATS_SCHEMA_OF(llmem_resource_stats_schema, "resource", llmem_resource_stats, LLMEM_RESOURCE_STATS_FIELDS)

void llmem_resource_destroy(llmem_resource *r)
{
    if (!r || (r->flags_ & LLMEM__RES_IMMORTAL)) return; /* the process defaults */
    if (r->ops->destroy) r->ops->destroy(r);
}
