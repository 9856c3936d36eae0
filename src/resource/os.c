/*
 * os.c - the os resource: anonymous mmap, madvise, huge pages, NUMA, mlock.
 *
 * Alignment above the page size: map size + align - page bytes, keep the
 * aligned window, unmap the head and tail. Explicit huge pages: reserve an
 * aligned window of normal PROT_NONE address space first, then place the
 * MAP_HUGETLB mapping over it with MAP_FIXED, so no huge pages are spent on
 * alignment slack. A hugetlb attempt that fails (none reserved, or the
 * kernel refuses) falls back to normal pages plus MADV_HUGEPAGE unless the
 * options ask for strictness. Which live mappings are hugetlb is remembered
 * in a small locked list, so unmap and decommit know and the figures stay
 * right.
 *
 * NUMA: libnuma is loaded with dlopen on first need, so the library has no
 * hard dependency on it; binding uses its mbind() with MPOL_BIND.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"
#include "llmem/os_resource.h"
#include "resource_internal.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MPOL_BIND
#define MPOL_BIND 2
#endif

typedef struct huge_span {
    uintptr_t start;
    size_t size;
} huge_span;

typedef struct os_resource {
    llmem_resource base;
    llmem_os_options opts;
    size_t page;
    size_t huge_size;          /* system huge page size, 0 if unknown */
    llmem_os_stats st;         /* updated with atomic builtins */
    pthread_mutex_t lock;      /* guards huge_spans */
    huge_span *huge_spans;
    size_t huge_count, huge_cap;
} os_resource;

/* ---- libnuma, loaded on demand ----------------------------------------- */

static struct {
    pthread_once_t once;
    bool ok;
    int max_node;
    long (*mbind)(void *, unsigned long, int, const unsigned long *, unsigned long, unsigned);
} numa = {PTHREAD_ONCE_INIT, false, 0, NULL};

static void numa_load(void)
{
    void *h = dlopen("libnuma.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    /* POSIX's way to turn dlsym's object pointer into a function pointer. */
    int (*available)(void), (*max_node)(void);
    *(void **)&available = dlsym(h, "numa_available");
    *(void **)&max_node = dlsym(h, "numa_max_node");
    *(void **)&numa.mbind = dlsym(h, "mbind");
    if (!available || !max_node || !numa.mbind || available() < 0) return;
    numa.max_node = max_node();
    numa.ok = true;
}

#define NUMA_MASK_WORDS 16 /* up to 1024 nodes */

static llmem_status numa_bind(os_resource *o, void *p, size_t size)
{
    unsigned long mask[NUMA_MASK_WORDS] = {0};
    int node = o->opts.numa_node;
    mask[node / (8 * (int)sizeof(unsigned long))] |= 1ul << (node % (8 * (int)sizeof(unsigned long)));
    if (numa.mbind(p, size, MPOL_BIND, mask, NUMA_MASK_WORDS * 8 * sizeof(unsigned long), 0) != 0)
        return llmem__fail(LLMEM_EOS, "os resource '%s': mbind of %zu bytes to node %d failed: %s",
                           o->base.info.name, size, node, strerror(errno));
    llmem__add(&o->st.numa_bound_bytes_total, size);
    return LLMEM_OK;
}

/* ---- system facts ------------------------------------------------------ */

static uint64_t meminfo_value(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    size_t kl = strlen(key);
    uint64_t v = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            v = strtoull(line + kl + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return v;
}

static size_t system_huge_size(void)
{
    static size_t cached = (size_t)-1;
    size_t v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v == (size_t)-1) {
        v = (size_t)meminfo_value("Hugepagesize") * 1024;
        if (!llmem__is_pow2(v)) v = 0;
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}

llmem_status llmem_os_get_caps(llmem_os_caps *out)
{
    if (!out) return llmem__fail(LLMEM_EINVAL, "os caps: null out");
    memset(out, 0, sizeof *out);
    out->page_size = llmem__page_size();
    out->huge_page_size = system_huge_size();
    out->hugetlb_free = meminfo_value("HugePages_Free");
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f) {
        char buf[128] = {0};
        if (fgets(buf, sizeof buf, f)) out->thp_available = strstr(buf, "[never]") == NULL;
        fclose(f);
    }
    pthread_once(&numa.once, numa_load);
    out->numa_available = numa.ok;
    out->numa_nodes = numa.ok ? numa.max_node + 1 : 1;
    return LLMEM_OK;
}

/* ---- helpers ----------------------------------------------------------- */

static llmem_status errno_status(int e)
{
    switch (e) {
    case ENOMEM: case EAGAIN: return LLMEM_ENOMEM;
    case EPERM: case EACCES: return LLMEM_EPERM;
    default: return LLMEM_EOS;
    }
}

void *llmem__mmap_aligned(size_t size, size_t align, size_t page, int prot, int flags)
{
    if (align <= page) {
        void *p = mmap(NULL, size, prot, flags, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    size_t total;
    if (!llmem__add_ok(size, align - page, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    void *raw = mmap(NULL, total, prot, flags, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uintptr_t start = (uintptr_t)raw, aligned = llmem__align_ptr(start, align);
    if (aligned > start) munmap(raw, aligned - start);
    uintptr_t end = aligned + size, raw_end = start + total;
    if (raw_end > end) munmap((void *)end, raw_end - end);
    return (void *)aligned;
}

static bool huge_find(os_resource *o, uintptr_t p, size_t *index)
{
    for (size_t i = 0; i < o->huge_count; i++)
        if (p >= o->huge_spans[i].start && p < o->huge_spans[i].start + o->huge_spans[i].size) {
            *index = i;
            return true;
        }
    return false;
}

static bool huge_remember(os_resource *o, void *p, size_t size)
{
    pthread_mutex_lock(&o->lock);
    if (o->huge_count == o->huge_cap) {
        size_t ncap = o->huge_cap ? o->huge_cap * 2 : 16;
        huge_span *n = realloc(o->huge_spans, ncap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&o->lock);
            return false;
        }
        o->huge_spans = n;
        o->huge_cap = ncap;
    }
    o->huge_spans[o->huge_count++] = (huge_span){(uintptr_t)p, size};
    pthread_mutex_unlock(&o->lock);
    llmem__add(&o->st.hugetlb_bytes, size);
    return true;
}

static bool is_huge(os_resource *o, void *p)
{
    if (o->opts.huge != LLMEM_OS_HUGE_HUGETLB) return false;
    pthread_mutex_lock(&o->lock);
    size_t i;
    bool found = huge_find(o, (uintptr_t)p, &i);
    pthread_mutex_unlock(&o->lock);
    return found;
}

/* Try MAP_HUGETLB over an aligned reservation; NULL (errno set) on failure.
 * Never MAP_NORESERVE, even for an uncommitted mapping: without a
 * reservation the kernel hands out hugetlb address space when no huge page
 * is free, and the first touch after commit dies of SIGBUS. Reserving at
 * map time makes a shortage fail here, where the fallback (or
 * LLMEM_ENOHUGE) can deal with it. */
static void *map_hugetlb(os_resource *o, size_t size, size_t align, bool committed, bool populate)
{
    if (align < o->huge_size) align = o->huge_size;
    void *res = llmem__mmap_aligned(size, align, o->page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE);
    if (!res) return NULL;
    int prot = committed ? PROT_READ | PROT_WRITE : PROT_NONE;
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_HUGETLB;
    if (committed && (populate || o->opts.populate)) flags |= MAP_POPULATE;
    void *p = mmap(res, size, prot, flags, -1, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        munmap(res, size);
        errno = e;
        return NULL;
    }
    return p;
}

/* Everything a committed range gets: THP advice, population, mlock. */
static llmem_status on_commit(os_resource *o, void *p, size_t size, bool huge, bool thp, bool populate)
{
    if (thp && !huge && o->huge_size && size >= o->huge_size) {
        if (madvise(p, size, MADV_HUGEPAGE) == 0) llmem__add(&o->st.thp_advised_bytes_total, size);
    }
    if ((populate || o->opts.populate) && !huge) {
        if (madvise(p, size, MADV_POPULATE_WRITE) != 0) {
            /* Kernels before 5.14: touch each page. Fresh anonymous memory
             * reads as zero, so writing a zero keeps the contents. */
            for (size_t off = 0; off < size; off += o->page) ((volatile char *)p)[off] = 0;
        }
    }
    if (o->opts.mlock) {
        if (mlock(p, size) != 0) {
            int e = errno;
            return llmem__fail(errno_status(e) == LLMEM_ENOMEM ? LLMEM_EPERM : errno_status(e),
                               "os resource '%s': mlock of %zu bytes failed (%s); raise RLIMIT_MEMLOCK "
                               "(ulimit -l) or turn the mlock option off",
                               o->base.info.name, size, strerror(e));
        }
        llmem__add(&o->st.mlocked_bytes, size);
    }
    return LLMEM_OK;
}

/* Is all of [p, p+size) mapped in this process? msync(MS_ASYNC) does no work
 * on anonymous memory but fails with ENOMEM when the range has a hole, so a
 * double unmap, or a commit/decommit outside any mapping, is refused before
 * munmap (which would succeed silently) or mprotect/madvise (which would
 * apply to part of the range) runs. */
static llmem_status check_mapped(os_resource *o, void *p, size_t size, const char *op)
{
    if (msync(p, size, MS_ASYNC) == 0 || errno != ENOMEM) return LLMEM_OK;
    return llmem__fail(LLMEM_EINVAL, "os resource '%s': %s of [%p, +%zu), which is not (all) mapped%s",
                       o->base.info.name, op, p, size, strcmp(op, "unmap") == 0 ? " (unmapped twice?)" : "");
}

/* ---- ops ----------------------------------------------------------------- */

static llmem_status os_map(llmem_resource *r, size_t size, size_t align, unsigned flags, const char *tag, void **out)
{
    LLMEM_UNUSED(tag);
    os_resource *o = (os_resource *)r;
    bool committed = !(flags & LLMEM_MAP_UNCOMMITTED);
    bool huge = false, thp = o->opts.huge == LLMEM_OS_HUGE_THP;
    void *p = NULL;

    if (o->opts.huge == LLMEM_OS_HUGE_HUGETLB) {
        p = map_hugetlb(o, size, align, committed, flags & LLMEM_MAP_POPULATE);
        if (p) {
            huge = true;
            if (!huge_remember(o, p, size)) {
                munmap(p, size);
                return llmem__fail(LLMEM_ENOMEM, "os resource '%s': out of memory for metadata", r->info.name);
            }
        } else if (o->opts.huge_strict) {
            int e = errno;
            return llmem__fail(LLMEM_ENOHUGE,
                               "os resource '%s': MAP_HUGETLB of %zu bytes failed (%s): %llu huge pages of %zu KiB "
                               "free; reserve more with /proc/sys/vm/nr_hugepages or allow the fallback",
                               r->info.name, size, strerror(e),
                               (unsigned long long)meminfo_value("HugePages_Free"), o->huge_size / 1024);
        } else {
            llmem__add(&o->st.hugetlb_fallbacks_total, 1);
            thp = true;
        }
    }
    if (!p) {
        size_t a = align;
        if (thp && o->huge_size && size >= o->huge_size && a < o->huge_size) a = o->huge_size;
        int prot = committed ? PROT_READ | PROT_WRITE : PROT_NONE;
        int mflags = MAP_PRIVATE | MAP_ANONYMOUS | (committed ? 0 : MAP_NORESERVE);
        p = llmem__mmap_aligned(size, a, o->page, prot, mflags);
        if (!p) {
            int e = errno;
            return llmem__fail(errno_status(e), "os resource '%s': mmap of %zu bytes (align %zu) failed: %s",
                               r->info.name, size, a, strerror(e));
        }
    }
    llmem_status st = LLMEM_OK;
    if (o->opts.numa_bind) st = numa_bind(o, p, size);
    if (!st && committed) st = on_commit(o, p, size, huge, thp, flags & LLMEM_MAP_POPULATE);
    if (st) {
        if (huge) {
            pthread_mutex_lock(&o->lock);
            size_t i;
            if (huge_find(o, (uintptr_t)p, &i)) o->huge_spans[i] = o->huge_spans[--o->huge_count];
            pthread_mutex_unlock(&o->lock);
            llmem__sub(&o->st.hugetlb_bytes, size);
        }
        munmap(p, size);
        return st;
    }
    *out = p;
    return LLMEM_OK;
}

static llmem_status os_unmap(llmem_resource *r, void *ptr, size_t size, size_t committed)
{
    os_resource *o = (os_resource *)r;
    llmem_status st = check_mapped(o, ptr, size, "unmap");
    if (st) return st;
    if (munmap(ptr, size) != 0) {
        int e = errno;
        return llmem__fail(LLMEM_EINVAL, "os resource '%s': munmap(%p, %zu) failed: %s", r->info.name, ptr, size,
                           strerror(e));
    }
    if (o->opts.mlock) llmem__sub(&o->st.mlocked_bytes, committed);
    if (o->opts.huge == LLMEM_OS_HUGE_HUGETLB) {
        pthread_mutex_lock(&o->lock);
        size_t i;
        bool found = huge_find(o, (uintptr_t)ptr, &i);
        if (found) o->huge_spans[i] = o->huge_spans[--o->huge_count];
        pthread_mutex_unlock(&o->lock);
        if (found) llmem__sub(&o->st.hugetlb_bytes, size);
    }
    return LLMEM_OK;
}

static llmem_status os_commit(llmem_resource *r, void *ptr, size_t size)
{
    os_resource *o = (os_resource *)r;
    llmem_status st = check_mapped(o, ptr, size, "commit");
    if (st) return st;
    if (mprotect(ptr, size, PROT_READ | PROT_WRITE) != 0) {
        int e = errno;
        return llmem__fail(errno_status(e), "os resource '%s': commit (mprotect) of %zu bytes at %p failed: %s",
                           r->info.name, size, ptr, strerror(e));
    }
    bool huge = is_huge(o, ptr);
    /* Huge pages given back by an earlier decommit may be gone by now: fault
     * them in here, so a shortage is a status and not a SIGBUS on first
     * touch. (EINVAL: a kernel before 5.14, the map-time reservation has to
     * do.) */
    if (huge && madvise(ptr, size, MADV_POPULATE_WRITE) != 0 && errno != EINVAL) {
        int e = errno;
        madvise(ptr, size, MADV_DONTNEED);
        mprotect(ptr, size, PROT_NONE);
        return llmem__fail(LLMEM_ENOHUGE,
                           "os resource '%s': commit of %zu bytes of huge pages at %p failed (%s): %llu huge pages "
                           "free; reserve more with /proc/sys/vm/nr_hugepages",
                           r->info.name, size, ptr, strerror(e), (unsigned long long)meminfo_value("HugePages_Free"));
    }
    bool thp = o->opts.huge != LLMEM_OS_HUGE_NONE;
    st = on_commit(o, ptr, size, huge, thp, false);
    if (st) {
        /* Stay uncommitted, as the wrapper counts it, and give back any
         * pages the populate option faulted in. */
        madvise(ptr, size, MADV_DONTNEED);
        mprotect(ptr, size, PROT_NONE);
    }
    return st;
}

static llmem_status os_decommit(llmem_resource *r, void *ptr, size_t size)
{
    os_resource *o = (os_resource *)r;
    llmem_status st = check_mapped(o, ptr, size, "decommit");
    if (st) return st;
    if (o->opts.mlock) munlock(ptr, size); /* madvise refuses locked pages */
    int advice = o->opts.decommit == LLMEM_OS_DECOMMIT_FREE ? MADV_FREE : MADV_DONTNEED;
    if (advice == MADV_FREE && is_huge(o, ptr)) advice = MADV_DONTNEED; /* hugetlb has no MADV_FREE */
    if (madvise(ptr, size, advice) != 0 && !(advice == MADV_FREE && madvise(ptr, size, MADV_DONTNEED) == 0)) {
        int e = errno;
        /* The range stays committed (the wrapper counts it so): lock it
         * again, or stop counting it as locked if that fails. */
        if (o->opts.mlock && mlock(ptr, size) != 0) llmem__sub(&o->st.mlocked_bytes, size);
        return llmem__fail(errno_status(e), "os resource '%s': decommit (madvise) of %zu bytes at %p failed: %s",
                           r->info.name, size, ptr, strerror(e));
    }
    if (o->opts.mlock) llmem__sub(&o->st.mlocked_bytes, size);
    return LLMEM_OK;
}

static void os_destroy(llmem_resource *r)
{
    os_resource *o = (os_resource *)r;
    pthread_mutex_destroy(&o->lock);
    free(o->huge_spans);
    free(o);
}

static const llmem_resource_ops os_ops = {
    .map = os_map,
    .unmap = os_unmap,
    .commit = os_commit,
    .decommit = os_decommit,
    .copy = NULL, /* host memory: the wrapper's memmove */
    .destroy = os_destroy,
};

/* ---- creation -------------------------------------------------------------- */

llmem_os_options llmem_os_options_default(void)
{
    llmem_os_options o;
    memset(&o, 0, sizeof o);
    o.name = "os";
    return o;
}

static llmem_status os_init(os_resource *o, const llmem_os_options *opts)
{
    o->opts = opts ? *opts : llmem_os_options_default();
    if ((unsigned)o->opts.huge > LLMEM_OS_HUGE_HUGETLB)
        return llmem__fail(LLMEM_EINVAL, "os resource: unknown huge page mode %d", (int)o->opts.huge);
    if ((unsigned)o->opts.decommit > LLMEM_OS_DECOMMIT_FREE)
        return llmem__fail(LLMEM_EINVAL, "os resource: unknown decommit mode %d", (int)o->opts.decommit);
    if (o->opts.numa_bind) {
        pthread_once(&numa.once, numa_load);
        if (!numa.ok)
            return llmem__fail(LLMEM_ENOTSUP,
                               "os resource: NUMA binding asked for, but libnuma (libnuma.so.1) is not installed or "
                               "the kernel has no NUMA support");
        if (o->opts.numa_node < 0 || o->opts.numa_node > numa.max_node ||
            o->opts.numa_node >= NUMA_MASK_WORDS * 8 * (int)sizeof(unsigned long))
            return llmem__fail(LLMEM_ENOTSUP, "os resource: NUMA node %d does not exist (nodes 0..%d)",
                               o->opts.numa_node, numa.max_node);
    }
    o->page = llmem__page_size();
    o->huge_size = system_huge_size();
    size_t gran = o->page;
    if (o->opts.huge == LLMEM_OS_HUGE_HUGETLB) {
        if (!o->huge_size)
            return llmem__fail(LLMEM_ENOTSUP, "os resource: the kernel reports no huge page size");
        gran = o->huge_size;
    }
    pthread_mutex_init(&o->lock, NULL);
    o->st.struct_size = sizeof o->st;
    const char *name = o->opts.name && *o->opts.name ? o->opts.name : "os"; /* zeroed options: defaults */
    llmem_resource_init(&o->base, &os_ops, name, LLMEM_MEM_HOST, gran, gran, LLMEM_MAX_ALIGN,
                        LLMEM_RES_CAP_DECOMMIT | LLMEM_RES_CAP_RESERVE | LLMEM_RES_CAP_COPY);
    return LLMEM_OK;
}

llmem_status llmem_os_resource_create(const llmem_os_options *opts, llmem_resource **out)
{
    if (!out) return llmem__fail(LLMEM_EINVAL, "os resource: null out");
    *out = NULL;
    os_resource *o = calloc(1, sizeof *o);
    if (!o) return llmem__fail(LLMEM_ENOMEM, "os resource: out of memory");
    llmem_status st = os_init(o, opts);
    if (st) {
        free(o);
        return st;
    }
    *out = &o->base;
    return LLMEM_OK;
}

static os_resource default_os;
static pthread_once_t default_once = PTHREAD_ONCE_INIT;

static void default_init(void)
{
    llmem_os_options o = llmem_os_options_default();
    os_init(&default_os, &o); /* default options cannot fail */
    llmem__resource_make_immortal(&default_os.base);
}

llmem_resource *llmem_resource_default(void)
{
    pthread_once(&default_once, default_init);
    return &default_os.base;
}

/* The dynamic pool's default: the same, with transparent huge pages advised
 * for mappings of 2 MiB and more (superblocks), which spares the TLB. */
static os_resource default_thp;
static pthread_once_t default_thp_once = PTHREAD_ONCE_INIT;

static void default_thp_init(void)
{
    llmem_os_options o = llmem_os_options_default();
    o.name = "os-thp";
    o.huge = LLMEM_OS_HUGE_THP;
    os_init(&default_thp, &o); /* cannot fail */
    llmem__resource_make_immortal(&default_thp.base);
}

llmem_resource *llmem__resource_default_thp(void)
{
    pthread_once(&default_thp_once, default_thp_init);
    return &default_thp.base;
}

llmem_status llmem_os_resource_get_stats(const llmem_resource *r, llmem_os_stats *out)
{
    if (!r || !out || r->ops != &os_ops) return llmem__fail(LLMEM_EINVAL, "os resource stats: not an os resource");
    const os_resource *o = (const os_resource *)r;
    llmem_os_stats s = {.struct_size = sizeof s};
    s.hugetlb_bytes = llmem__ld(&o->st.hugetlb_bytes);
    s.hugetlb_fallbacks_total = llmem__ld(&o->st.hugetlb_fallbacks_total);
    s.thp_advised_bytes_total = llmem__ld(&o->st.thp_advised_bytes_total);
    s.mlocked_bytes = llmem__ld(&o->st.mlocked_bytes);
    s.numa_bound_bytes_total = llmem__ld(&o->st.numa_bound_bytes_total);
    return llmem__stats_out(out, &s, sizeof s);
}

LLMEM__STATS_SCHEMA_OF(llmem_os_stats_schema, "os", llmem_os_stats, LLMEM_OS_STATS_FIELDS)
