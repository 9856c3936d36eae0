/*
 * sim_device.c - device memory simulated with PROT_NONE host pages.
 *
 * Mappings are kept in an array sorted by address, each with a bitmap of
 * committed granules, all under one mutex. That makes the simulator a
 * strict checker of the resource contract, stricter than real hardware:
 * committing a committed granule, decommitting an uncommitted one, an unmap
 * whose `committed` figure disagrees with the bitmap, or a copy that leaves
 * a mapping or touches uncommitted memory, are all refused with
 * LLMEM_EINVAL and counted, and nothing changes.
 *
 * Capacity counts committed bytes (physical device memory): a plain map
 * commits all of it, an uncommitted reservation (as with the CUDA virtual
 * memory API) only what is committed later.
 *
 * copy() opens the device pages it touches with mprotect, copies, and
 * closes them, holding the mutex throughout; a thread that touches device
 * memory directly at any other moment faults.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"
#include "llmem/sim_resource.h"
#include "resource_internal.h"

typedef struct sim_map {
    uintptr_t start;
    size_t size;
    size_t committed;     /* bytes */
    uint64_t *bits;       /* one bit per granule: committed */
} sim_map;

typedef struct sim_resource {
    llmem_resource base;
    llmem_sim_options opts;
    size_t page;
    pthread_mutex_t lock; /* guards everything below */
    sim_map *maps;        /* sorted by start */
    size_t count, cap;
    llmem_sim_stats st;
} sim_resource;

static void charge(sim_resource *s, uint64_t ns)
{
    if (!ns) return;
    uint64_t end = llmem__now_ns() + ns;
    while (llmem__now_ns() < end) {
    }
    s->st.cost_ns_total += ns;
}

/* First index whose mapping ends after p (count if none). Lock held. */
static size_t lower(const sim_resource *s, uintptr_t p)
{
    size_t lo = 0, hi = s->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->maps[mid].start + s->maps[mid].size <= p) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Index of the mapping containing p, or -1. Lock held. */
static ptrdiff_t find(const sim_resource *s, uintptr_t p)
{
    size_t i = lower(s, p);
    if (i < s->count && p >= s->maps[i].start) return (ptrdiff_t)i;
    return -1;
}

/* Any mapping intersecting [p, p+n)? Lock held. */
static bool intersects(const sim_resource *s, uintptr_t p, size_t n)
{
    size_t i = lower(s, p);
    return i < s->count && s->maps[i].start < p + n;
}

static size_t granule(const sim_resource *s, const sim_map *m, uintptr_t p)
{
    return (size_t)(p - m->start) / s->base.info.granularity;
}

static bool bit(const sim_map *m, size_t i) { return (m->bits[i / 64] >> (i % 64)) & 1; }

/* Are granules [a, b) all in state `want`? */
static bool all_bits(const sim_map *m, size_t a, size_t b, bool want)
{
    for (size_t i = a; i < b; i++)
        if (bit(m, i) != want) return false;
    return true;
}

static void set_bits(sim_map *m, size_t a, size_t b, bool v)
{
    for (size_t i = a; i < b; i++) {
        if (v) m->bits[i / 64] |= 1ull << (i % 64);
        else m->bits[i / 64] &= ~(1ull << (i % 64));
    }
}

static void use(sim_resource *s, size_t n)
{
    s->st.used_bytes += n;
    if (s->st.used_bytes > s->st.used_peak_bytes) s->st.used_peak_bytes = s->st.used_bytes;
}

static llmem_status check_capacity(sim_resource *s, size_t n)
{
    if (n > s->st.capacity_bytes - s->st.used_bytes) {
        s->st.oom_total++;
        return llmem__fail(LLMEM_ENOMEM, "sim-device '%s': out of device memory: %zu bytes requested, %llu of %llu in use",
                           s->base.info.name, n, (unsigned long long)s->st.used_bytes,
                           (unsigned long long)s->st.capacity_bytes);
    }
    return LLMEM_OK;
}

/* Open [p, p+n) of device memory for the host, or close it again. */
static void window(sim_resource *s, uintptr_t p, size_t n, bool open)
{
    uintptr_t a = p & ~(uintptr_t)(s->page - 1);
    uintptr_t b = llmem__align_ptr(p + n, s->page);
    mprotect((void *)a, b - a, open ? PROT_READ | PROT_WRITE : PROT_NONE);
}

static llmem_status sim_map_op(llmem_resource *r, size_t size, size_t align, unsigned flags, const char *tag,
                               void **out)
{
    LLMEM_UNUSED(tag);
    sim_resource *s = (sim_resource *)r;
    bool committed = !(flags & LLMEM_MAP_UNCOMMITTED);
    size_t granules = size / r->info.granularity;
    /* Refuse what can never be had before its metadata is allocated: an
     * absurd size must be a status, not a host allocation in proportion. */
    if (size > ((size_t)1 << 47))
        return llmem__fail(LLMEM_ENOMEM, "sim-device '%s': %zu bytes exceed the address space", r->info.name, size);
    if (committed) {
        pthread_mutex_lock(&s->lock);
        llmem_status cst = check_capacity(s, size);
        pthread_mutex_unlock(&s->lock);
        if (cst) return cst;
    }
    sim_map m = {0};
    m.bits = calloc((granules + 63) / 64, sizeof *m.bits);
    if (!m.bits) return llmem__fail(LLMEM_ENOMEM, "sim-device '%s': out of host memory for metadata", r->info.name);

    pthread_mutex_lock(&s->lock);
    llmem_status st = committed ? check_capacity(s, size) : LLMEM_OK;
    if (!st && s->count == s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 16;
        sim_map *n = realloc(s->maps, ncap * sizeof *n);
        if (!n) st = llmem__fail(LLMEM_ENOMEM, "sim-device '%s': out of host memory for metadata", r->info.name);
        else {
            s->maps = n;
            s->cap = ncap;
        }
    }
    void *p = NULL;
    if (!st) {
        charge(s, s->opts.map_cost_ns);
        p = llmem__mmap_aligned(size, align, s->page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE);
        if (!p)
            st = llmem__fail(LLMEM_ENOMEM, "sim-device '%s': host mmap of %zu bytes failed: %s", r->info.name, size,
                             strerror(errno));
    }
    if (st) {
        pthread_mutex_unlock(&s->lock);
        free(m.bits);
        return st;
    }
    m.start = (uintptr_t)p;
    m.size = size;
    if (committed) {
        set_bits(&m, 0, granules, true);
        m.committed = size;
        use(s, size);
        if (s->opts.fill) {
            window(s, m.start, size, true);
            memset(p, s->opts.fill, size);
            window(s, m.start, size, false);
        }
    }
    size_t i = lower(s, m.start);
    memmove(&s->maps[i + 1], &s->maps[i], (s->count - i) * sizeof *s->maps);
    s->maps[i] = m;
    s->count++;
    pthread_mutex_unlock(&s->lock);
    *out = p;
    return LLMEM_OK;
}

static llmem_status sim_unmap(llmem_resource *r, void *ptr, size_t size, size_t committed)
{
    sim_resource *s = (sim_resource *)r;
    pthread_mutex_lock(&s->lock);
    ptrdiff_t i = find(s, (uintptr_t)ptr);
    llmem_status st = LLMEM_OK;
    if (i < 0 || s->maps[i].start != (uintptr_t)ptr)
        st = llmem__fail(LLMEM_EINVAL, "sim-device '%s': unmap of %p, which is not the start of a mapping",
                         r->info.name, ptr);
    else if (s->maps[i].size != size)
        st = llmem__fail(LLMEM_EINVAL, "sim-device '%s': unmap of %p with size %zu, mapped with %zu", r->info.name,
                         ptr, size, s->maps[i].size);
    else if (s->maps[i].committed != committed)
        st = llmem__fail(LLMEM_EINVAL, "sim-device '%s': unmap of %p claims %zu committed bytes, %zu are",
                         r->info.name, ptr, committed, s->maps[i].committed);
    if (st) {
        pthread_mutex_unlock(&s->lock);
        return st;
    }
    charge(s, s->opts.unmap_cost_ns);
    munmap(ptr, size);
    s->st.used_bytes -= s->maps[i].committed;
    free(s->maps[i].bits);
    memmove(&s->maps[i], &s->maps[i + 1], (s->count - (size_t)i - 1) * sizeof *s->maps);
    s->count--;
    pthread_mutex_unlock(&s->lock);
    return LLMEM_OK;
}

/* Shared by commit and decommit: find the mapping and check the state. */
static llmem_status change_commit(sim_resource *s, void *ptr, size_t size, bool commit)
{
    const char *op = commit ? "commit" : "decommit";
    pthread_mutex_lock(&s->lock);
    ptrdiff_t i = find(s, (uintptr_t)ptr);
    llmem_status st = LLMEM_OK;
    sim_map *m = i >= 0 ? &s->maps[i] : NULL;
    if (!m || (uintptr_t)ptr + size > m->start + m->size) {
        st = llmem__fail(LLMEM_EINVAL, "sim-device '%s': %s of [%p, +%zu) outside any mapping", s->base.info.name, op,
                         ptr, size);
    } else {
        size_t a = granule(s, m, (uintptr_t)ptr), b = a + size / s->base.info.granularity;
        if (!all_bits(m, a, b, !commit))
            st = llmem__fail(LLMEM_EINVAL, "sim-device '%s': %s of [%p, +%zu), part of which is %s", s->base.info.name,
                             op, ptr, size, commit ? "already committed" : "not committed");
        else if (commit)
            st = check_capacity(s, size);
        if (!st) {
            set_bits(m, a, b, commit);
            if (commit) {
                m->committed += size;
                use(s, size);
                if (s->opts.fill) { /* freshly committed memory is as uninitialised as a fresh mapping */
                    window(s, (uintptr_t)ptr, size, true);
                    memset(ptr, s->opts.fill, size);
                    window(s, (uintptr_t)ptr, size, false);
                }
            } else {
                m->committed -= size;
                s->st.used_bytes -= size;
                madvise(ptr, size, MADV_DONTNEED);
            }
        }
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

static llmem_status sim_commit(llmem_resource *r, void *ptr, size_t size)
{
    return change_commit((sim_resource *)r, ptr, size, true);
}

static llmem_status sim_decommit(llmem_resource *r, void *ptr, size_t size)
{
    return change_commit((sim_resource *)r, ptr, size, false);
}

/* Classify one side of a copy: 1 device (inside a committed range of one
 * mapping), 0 host (touches no mapping), error otherwise. Lock held. */
static llmem_status classify(sim_resource *s, uintptr_t p, size_t n, const char *side, int *is_dev)
{
    ptrdiff_t i = find(s, p);
    if (i < 0) {
        if (intersects(s, p, n)) goto bad;
        *is_dev = 0;
        return LLMEM_OK;
    }
    const sim_map *m = &s->maps[i];
    if (p + n > m->start + m->size) goto bad;
    size_t a = granule(s, m, p), b = granule(s, m, p + n - 1) + 1;
    if (!all_bits(m, a, b, true)) {
        s->st.bad_copies_total++;
        return llmem__fail(LLMEM_EINVAL, "sim-device '%s': copy %s [%p, +%zu) touches uncommitted device memory",
                           s->base.info.name, side, (void *)p, n);
    }
    *is_dev = 1;
    return LLMEM_OK;
bad:
    s->st.bad_copies_total++;
    return llmem__fail(LLMEM_EINVAL, "sim-device '%s': copy %s [%p, +%zu) runs outside a device mapping",
                       s->base.info.name, side, (void *)p, n);
}

static llmem_status sim_copy(llmem_resource *r, void *dst, const void *src, size_t n)
{
    sim_resource *s = (sim_resource *)r;
    uintptr_t d = (uintptr_t)dst, sp = (uintptr_t)src;
    pthread_mutex_lock(&s->lock);
    int dev_d = 0, dev_s = 0;
    llmem_status st = classify(s, d, n, "destination", &dev_d);
    if (!st) st = classify(s, sp, n, "source", &dev_s);
    if (!st && d < sp + n && sp < d + n) {
        s->st.bad_copies_total++;
        st = llmem__fail(LLMEM_EINVAL, "sim-device '%s': copy ranges overlap (%p and %p, %zu bytes)", r->info.name,
                         dst, src, n);
    }
    if (!st && !s->opts.discard_data) {
        if (dev_d) window(s, d, n, true);
        if (dev_s) window(s, sp, n, true);
        memcpy(dst, src, n);
        if (dev_d) window(s, d, n, false);
        if (dev_s) window(s, sp, n, false);
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

static void sim_destroy(llmem_resource *r)
{
    sim_resource *s = (sim_resource *)r;
    for (size_t i = 0; i < s->count; i++) {
        munmap((void *)s->maps[i].start, s->maps[i].size);
        free(s->maps[i].bits);
    }
    free(s->maps);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static const llmem_resource_ops sim_ops = {
    .map = sim_map_op,
    .unmap = sim_unmap,
    .commit = sim_commit,
    .decommit = sim_decommit,
    .copy = sim_copy,
    .destroy = sim_destroy,
};

llmem_sim_options llmem_sim_options_default(void)
{
    llmem_sim_options o;
    memset(&o, 0, sizeof o);
    o.name = "sim-device";
    o.capacity = (size_t)1 << 30;
    o.granularity = llmem__page_size();
    return o;
}

llmem_status llmem_sim_resource_create(const llmem_sim_options *opts, llmem_resource **out)
{
    if (!out) return llmem__fail(LLMEM_EINVAL, "sim-device: null out");
    *out = NULL;
    llmem_sim_options o = opts ? *opts : llmem_sim_options_default();
    llmem_sim_options d = llmem_sim_options_default();
    if (!o.capacity) o.capacity = d.capacity;
    if (!o.granularity) o.granularity = d.granularity;
    if (!llmem__is_pow2(o.granularity) || o.granularity < llmem__page_size() || o.granularity > LLMEM_MAX_ALIGN)
        return llmem__fail(LLMEM_EINVAL, "sim-device: granularity %zu must be a power of two from the page size (%zu) "
                           "to 1 GiB", o.granularity, llmem__page_size());
    sim_resource *s = calloc(1, sizeof *s);
    if (!s) return llmem__fail(LLMEM_ENOMEM, "sim-device: out of memory");
    s->opts = o;
    s->page = llmem__page_size();
    s->st.struct_size = sizeof s->st;
    s->st.capacity_bytes = o.capacity;
    pthread_mutex_init(&s->lock, NULL);
    size_t min_align = o.granularity > LLMEM_DEVICE_ALIGN ? o.granularity : LLMEM_DEVICE_ALIGN;
    llmem_resource_init(&s->base, &sim_ops, o.name ? o.name : d.name, LLMEM_MEM_DEVICE, o.granularity, min_align,
                        LLMEM_MAX_ALIGN, LLMEM_RES_CAP_DECOMMIT | LLMEM_RES_CAP_RESERVE | LLMEM_RES_CAP_COPY);
    *out = &s->base;
    return LLMEM_OK;
}

llmem_status llmem_sim_resource_get_stats(const llmem_resource *r, llmem_sim_stats *out)
{
    if (!r || !out || r->ops != &sim_ops)
        return llmem__fail(LLMEM_EINVAL, "sim-device stats: not a sim-device resource");
    sim_resource *s = (sim_resource *)(uintptr_t)r;
    return llmem__stats_out_locked(out, &s->st, sizeof s->st, &s->lock);
}

bool llmem_sim_resource_contains(const llmem_resource *r, const void *ptr, size_t n)
{
    if (!r || r->ops != &sim_ops || !ptr || n == 0) return false;
    sim_resource *s = (sim_resource *)(uintptr_t)r;
    pthread_mutex_lock(&s->lock);
    ptrdiff_t i = find(s, (uintptr_t)ptr);
    /* n may be anything: compare against the room left, never form ptr + n. */
    bool ok = i >= 0 && n <= s->maps[i].start + s->maps[i].size - (uintptr_t)ptr;
    pthread_mutex_unlock(&s->lock);
    return ok;
}

LLMEM__STATS_SCHEMA_OF(llmem_sim_stats_schema, "sim_device", llmem_sim_stats, LLMEM_SIM_STATS_FIELDS)
