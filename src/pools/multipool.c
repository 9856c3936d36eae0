/*
 * multipool.c - dedicated fixed pools for profiled sizes, a general pool
 * for the rest. Sizes are kept sorted; a request is rounded to the
 * alignment and looked up by binary search.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "llmem/fixed.h"
#include "llmem/multipool.h"

struct llmem_multipool {
    char name[32];
    size_t align;
    size_t n;
    uint32_t sizes[LLMEM_MULTIPOOL_MAX_SIZES];
    llmem_fixed *fixed[LLMEM_MULTIPOOL_MAX_SIZES];
    llmem_pool *general;
    uint64_t dedicated, fallback, requested, usable; /* atomic */
};

llmem_multipool_options llmem_multipool_options_default(void)
{
    llmem_multipool_options o;
    memset(&o, 0, sizeof o);
    o.name = "multipool";
    o.k = 8;
    o.min_share = 0.01;
    o.max_size = (size_t)1 << 20;
    o.fallback = llmem_pool_options_default();
    return o;
}

void llmem_multipool_destroy(llmem_multipool *mp)
{
    if (!mp) return;
    for (size_t i = 0; i < mp->n; i++) llmem_fixed_destroy(mp->fixed[i]);
    llmem_pool_destroy(mp->general);
    free(mp);
}

llmem_status llmem_multipool_create(const llmem_multipool_options *opts, const llmem_profile *profile,
                                    llmem_multipool **out)
{
    if (!out) return llmem__fail(LLMEM_EINVAL, "multipool: null out");
    *out = NULL;
    llmem_multipool_options o = opts ? *opts : llmem_multipool_options_default();
    llmem_multipool_options d = llmem_multipool_options_default();
    if (!o.k) o.k = d.k;
    if (!o.max_size) o.max_size = d.max_size;
    if (o.k > LLMEM_MULTIPOOL_MAX_SIZES)
        return llmem__fail(LLMEM_EINVAL, "multipool: k %zu above %d", o.k, LLMEM_MULTIPOOL_MAX_SIZES);
    if (!(o.min_share >= 0 && o.min_share <= 1)) return llmem__fail(LLMEM_EINVAL, "multipool: min_share outside [0, 1]");
    llmem_multipool *mp = calloc(1, sizeof *mp);
    if (!mp) return llmem__fail(LLMEM_ENOMEM, "multipool: out of memory");
    llmem__copy_name(mp->name, sizeof mp->name, o.name, "multipool");
    llmem_resource *res = o.resource ? o.resource : llmem_resource_default();
    mp->align = llmem_resource_kind(res) == LLMEM_MEM_HOST ? 16 : LLMEM_DEVICE_ALIGN;
    llmem_pool_options po = o.fallback;
    po.resource = res;
    if (!po.name) po.name = mp->name;
    llmem_status st = llmem_pool_create(&po, &mp->general);
    if (!st && profile) st = llmem_profile_suggest_classes(profile, o.k, o.max_size, mp->align, o.min_share, mp->sizes, &mp->n);
    for (size_t i = 0; !st && i < mp->n; i++) {
        llmem_fixed_options fo = llmem_fixed_options_default();
        fo.name = mp->name;
        fo.resource = res;
        fo.block_size = mp->sizes[i];
        fo.align = mp->align;
        fo.thread_safe = true;
        st = llmem_fixed_create(&fo, &mp->fixed[i]);
        if (st) mp->n = i; /* destroy only what exists */
    }
    if (st) {
        llmem_multipool_destroy(mp);
        return st;
    }
    *out = mp;
    return LLMEM_OK;
}

/* Index of the dedicated pool for size, or -1. */
static int pool_for(const llmem_multipool *mp, size_t size)
{
    size_t r = (size + mp->align - 1) & ~(mp->align - 1);
    size_t lo = 0, hi = mp->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (mp->sizes[mid] < r) lo = mid + 1;
        else hi = mid;
    }
    return lo < mp->n && mp->sizes[lo] == r ? (int)lo : -1;
}

void *llmem_multipool_alloc(llmem_multipool *mp, size_t size, llmem_status *status)
{
    if (!mp) {
        llmem_status st = llmem__fail(LLMEM_EINVAL, "multipool: null multipool");
        if (status) *status = st;
        return NULL;
    }
    int i = size ? pool_for(mp, size) : -1;
    void *r;
    size_t usable = 0;
    if (i >= 0) {
        r = llmem_fixed_alloc(mp->fixed[i], status);
        usable = mp->sizes[i];
        if (r) __atomic_add_fetch(&mp->dedicated, 1, __ATOMIC_RELAXED);
    } else {
        r = llmem_pool_alloc(mp->general, size, status);
        if (r) {
            usable = llmem_pool_usable_size(mp->general, r);
            __atomic_add_fetch(&mp->fallback, 1, __ATOMIC_RELAXED);
        }
    }
    if (r) {
        __atomic_add_fetch(&mp->requested, size, __ATOMIC_RELAXED);
        __atomic_add_fetch(&mp->usable, usable, __ATOMIC_RELAXED);
    }
    return r;
}

llmem_status llmem_multipool_free(llmem_multipool *mp, void *ptr)
{
    if (!mp) return llmem__fail(LLMEM_EINVAL, "multipool: null multipool");
    if (!ptr) return LLMEM_OK;
    for (size_t i = 0; i < mp->n; i++)
        if (llmem_fixed_owns(mp->fixed[i], ptr)) return llmem_fixed_free(mp->fixed[i], ptr);
    return llmem_pool_free(mp->general, ptr);
}

llmem_status llmem_multipool_free_sized(llmem_multipool *mp, void *ptr, size_t size)
{
    if (!mp) return llmem__fail(LLMEM_EINVAL, "multipool: null multipool");
    if (!ptr) return LLMEM_OK;
    int i = pool_for(mp, size);
    return i >= 0 ? llmem_fixed_free(mp->fixed[i], ptr) : llmem_pool_free(mp->general, ptr);
}

size_t llmem_multipool_sizes(const llmem_multipool *mp, uint32_t *sizes, size_t cap)
{
    if (!mp) return 0;
    for (size_t i = 0; i < mp->n && i < cap && sizes; i++) sizes[i] = mp->sizes[i];
    return mp->n;
}

llmem_pool *llmem_multipool_fallback(llmem_multipool *mp) { return mp ? mp->general : NULL; }

llmem_status llmem_multipool_get_stats(const llmem_multipool *mp, llmem_multipool_stats *out)
{
    if (!mp || !out) return llmem__fail(LLMEM_EINVAL, "multipool stats: null argument");
    llmem_multipool_stats s = {.struct_size = sizeof s};
    s.dedicated_pools = mp->n;
    s.dedicated_allocs_total = __atomic_load_n(&mp->dedicated, __ATOMIC_RELAXED);
    s.fallback_allocs_total = __atomic_load_n(&mp->fallback, __ATOMIC_RELAXED);
    s.requested_bytes_total = __atomic_load_n(&mp->requested, __ATOMIC_RELAXED);
    s.usable_bytes_total = __atomic_load_n(&mp->usable, __ATOMIC_RELAXED);
    llmem_pool_stats ps = {0};
    llmem_pool_get_stats(mp->general, &ps);
    s.reserved_bytes = ps.reserved_bytes;
    for (size_t i = 0; i < mp->n; i++) {
        llmem_fixed_stats fs = {0};
        llmem_fixed_get_stats(mp->fixed[i], &fs);
        s.reserved_bytes += fs.reserved_bytes;
    }
    return llmem__stats_out(out, &s, sizeof s);
}

LLMEM__STATS_SCHEMA_OF(llmem_multipool_stats_schema, "multipool", llmem_multipool_stats, LLMEM_MULTIPOOL_STATS_FIELDS)
