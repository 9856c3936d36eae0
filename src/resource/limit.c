/*
 * limit.c - the limit adaptor: a byte cap in front of any resource.
 *
 * Bytes are claimed against the cap with a compare-and-swap before the call
 * goes upstream and handed back if upstream fails, so concurrent callers can
 * never overshoot the cap together.
 */
#include "adaptor.h"
#include "llmem/limit_resource.h"

typedef struct limit_resource {
    llmem__adaptor a;
    llmem_limit_what what;
    uint64_t limit;  /* atomic */
    uint64_t used;   /* atomic */
} limit_resource;

static llmem_status claim(limit_resource *l, size_t n)
{
    uint64_t cur = llmem__ld(&l->used);
    for (;;) {
        uint64_t lim = llmem__ld(&l->limit);
        if (n > lim || cur > lim - n)
            return llmem__fail(LLMEM_ENOMEM, "limit '%s': %zu more bytes would pass the cap (%llu of %llu in use)",
                               l->a.base.info.name, n, (unsigned long long)cur, (unsigned long long)lim);
        if (__atomic_compare_exchange_n(&l->used, &cur, cur + n, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return LLMEM_OK;
    }
}

static llmem_status limit_map(llmem_resource *r, size_t size, size_t align, unsigned flags, const char *tag, void **out)
{
    limit_resource *l = (limit_resource *)r;
    size_t n = (l->what == LLMEM_LIMIT_MAPPED || !(flags & LLMEM_MAP_UNCOMMITTED)) ? size : 0;
    llmem_status st = n ? claim(l, n) : LLMEM_OK;
    if (st) return st;
    st = llmem_resource_map_tagged(l->a.up, size, align, flags, tag, out);
    if (st) llmem__sub(&l->used, n);
    return st;
}

static llmem_status limit_unmap(llmem_resource *r, void *ptr, size_t size, size_t committed)
{
    limit_resource *l = (limit_resource *)r;
    /* The wrapper has rounded committed to whole granules, as commits are. */
    llmem_status st = llmem_resource_unmap(l->a.up, ptr, size, committed);
    if (!st) llmem__sub(&l->used, l->what == LLMEM_LIMIT_MAPPED ? size : committed);
    return st;
}

static llmem_status limit_commit(llmem_resource *r, void *ptr, size_t size)
{
    limit_resource *l = (limit_resource *)r;
    bool counted = l->what == LLMEM_LIMIT_COMMITTED;
    llmem_status st = counted ? claim(l, size) : LLMEM_OK;
    if (st) return st;
    st = llmem_resource_commit(l->a.up, ptr, size);
    if (st && counted) llmem__sub(&l->used, size);
    return st;
}

static llmem_status limit_decommit(llmem_resource *r, void *ptr, size_t size)
{
    limit_resource *l = (limit_resource *)r;
    llmem_status st = llmem_resource_decommit(l->a.up, ptr, size);
    if (!st && l->what == LLMEM_LIMIT_COMMITTED) llmem__sub(&l->used, size);
    return st;
}

static const llmem_resource_ops limit_ops = {
    .map = limit_map,
    .unmap = limit_unmap,
    .commit = limit_commit,
    .decommit = limit_decommit,
    .copy = llmem__adaptor_copy,
    .destroy = llmem__adaptor_free,
};

llmem_limit_options llmem_limit_options_default(void)
{
    llmem_limit_options o = {0};
    return o;
}

llmem_status llmem_limit_resource_create(llmem_resource *upstream, const llmem_limit_options *opts,
                                         llmem_resource **out)
{
    llmem_status st = llmem__adaptor_check("limit", upstream, out);
    if (st) return st;
    if (!opts) return llmem__fail(LLMEM_EINVAL, "limit: null options");
    if (opts->limit_bytes == 0) return llmem__fail(LLMEM_EINVAL, "limit: limit_bytes must be > 0");
    if ((unsigned)opts->what > LLMEM_LIMIT_MAPPED)
        return llmem__fail(LLMEM_EINVAL, "limit: unknown mode %d", (int)opts->what);
    limit_resource *l = llmem__adaptor_new(sizeof *l, &limit_ops, "limit", upstream);
    if (!l) return LLMEM_ENOMEM;
    l->what = opts->what;
    l->limit = opts->limit_bytes;
    *out = &l->a.base;
    return LLMEM_OK;
}

llmem_status llmem_limit_resource_set(llmem_resource *r, size_t limit_bytes)
{
    if (!r || r->ops != &limit_ops) return llmem__fail(LLMEM_EINVAL, "limit set: not a limit resource");
    if (limit_bytes == 0) return llmem__fail(LLMEM_EINVAL, "limit set: limit_bytes must be > 0");
    llmem__st(&((limit_resource *)r)->limit, limit_bytes);
    return LLMEM_OK;
}

llmem_status llmem_limit_resource_usage(const llmem_resource *r, size_t *used, size_t *limit)
{
    if (!r || r->ops != &limit_ops) return llmem__fail(LLMEM_EINVAL, "limit usage: not a limit resource");
    const limit_resource *l = (const limit_resource *)r;
    if (used) *used = (size_t)llmem__ld(&l->used);
    if (limit) *limit = (size_t)llmem__ld(&l->limit);
    return LLMEM_OK;
}
