/*
 * malloc.c - libllmem-malloc.so: the C allocation functions over one llmem
 * pool, for any program, through LD_PRELOAD or by linking.
 *
 *     LD_PRELOAD=/usr/local/lib/libllmem-malloc.so redis-server
 *
 * Exported (and nothing else: see libllmem-malloc.map): malloc, free,
 * calloc, realloc, reallocarray, posix_memalign, aligned_alloc, memalign,
 * valloc, pvalloc, malloc_usable_size, free_sized, free_aligned_sized (C23)
 * and malloc_trim; and C++'s operator new and delete, every standard form
 * (new_delete.c), so a C++ program's allocations take one call into the
 * pool instead of libstdc++'s operator new calling malloc. The library
 * carries its own copy of the
 * llmem core, resources and pools, hidden, so a program that also links
 * libllmem.so keeps its own pools apart.
 *
 * How a call is served:
 *  - The pool (a host pool over the os resource, purge MANUAL: no
 *    background thread, which would not survive fork) is created on the
 *    first call. Until it exists, while it is being created, and whenever
 *    the C library allocates on its own from inside a pool call (the
 *    thread-local `inside` flag says so: fopen of /proc files, qsort's
 *    buffer, pthread_atfork's table), requests go to the side allocator
 *    (side.c: a static buffer, then a reserved range; no dlsym, no
 *    pthread_key_create), so nothing recurses into the pool.
 *  - The pool's own metadata (its malloc/calloc/realloc/free calls) goes
 *    to the side allocator too: the link redirects them (-Wl,--wrap).
 *  - free, realloc and malloc_usable_size tell the pool's blocks from the
 *    side allocator's by the address map (a superblock owns the address:
 *    the pool's, which also refuses double and foreign frees), the side
 *    range and the table of mapped blocks; anything else (a pointer no allocator here handed out) is
 *    ignored by free and counted, and refused by realloc with EINVAL.
 *    Side blocks passed to realloc move into the pool.
 *  - The pool gets 15 size classes of the shim's own, just above each
 *    power of two from 1 to 16 KiB (near_pow2_classes), where programs'
 *    page-plus-header requests cluster.
 *  - Requests of 1 MiB and more are mappings of their own (mapped.c):
 *    free unmaps them or keeps a few for the next (250 ms, 8 MiB),
 *    realloc resizes them with mremap; a pool block
 *    that realloc grows past 1 MiB moves to one. Before it maps one, the
 *    pool gives back the pages of its free runs of 1 MiB and more; before
 *    a malloc or calloc of 128 KiB or more, those of its runs of 256 KiB
 *    and more free for 20 ms (big_alloc): the shim's pool has no purger,
 *    and those pages stayed resident beside new ones.
 *  - realloc and malloc_usable_size read a block's size without the
 *    pool's lock (llmem__pool_usable_nolock): programs such as redis ask
 *    for it at every malloc and free.
 *  - Errors are those of glibc: NULL with errno ENOMEM for a size that
 *    cannot be had (calloc and reallocarray check their products), EINVAL
 *    for a bad alignment; never an abort.
 *
 * fork: pthread_atfork handlers hold the pool's lock and the side lock
 * across fork (pool_shim.h), so a child of a threaded parent can allocate.
 * Thread exit: the pool's thread caches go back through its pthread key's
 * destructor. Process exit: nothing is torn down (destructors and atexit
 * handlers that run later may still free).
 *
 * Environment (read once, at the first allocation):
 *   LLMEM_MALLOC_THP=1       advise transparent huge pages on superblocks
 *   LLMEM_MALLOC_DECAY_MS=n  how long free superblocks are kept (default 250)
 *   LLMEM_MALLOC_CLASSES=a,b exact size classes of their own for these byte
 *                            sizes (up to 9, beside the shim's 15 near powers
 *                            of two; e.g. from an llmem profile)
 *   LLMEM_MALLOC_STATS=1     print the pool's figures to stderr at exit (a path
 *                            instead of 1: append them to that file)
 */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>

#include "addrmap.h"
#include "internal.h"
#include "llmem/os_resource.h"
#include "llmem/pool.h"
#include "pool_shim.h"
#include "shim.h"
#include "mapped.h"
#include "side.h"

#define EXPORT __attribute__((visibility("default")))

/* C23's, not yet in glibc 2.36's headers. */
void free_sized(void *ptr, size_t size);
void free_aligned_sized(void *ptr, size_t align, size_t size);
#define PAGE_BYTES ((size_t)4096)
/* Blocks from this size up that grow are offered to the pool's in-place
 * growth (page runs: the small classes end below it). */
#define GROW_IN_PLACE_MIN ((size_t)64 << 10)

/* The pool, published once created; NULL before and if creation failed. */
static llmem_pool *pool;
enum { INIT_NONE = 0, INIT_RUNNING = 1, INIT_DONE = 2, INIT_FAILED = 3 };
static int init_state;
/* LLMEM_MALLOC_STATS: "1" = stderr, else a file to append to; "" = off. */
static char stats_to[256];
static uint64_t unknown_frees;

/* What this thread is doing: IN_POOL inside a pool call (allocations the
 * C library makes meanwhile go to the side allocator), IN_FORK between
 * the fork handlers, holding the pool's and the side allocator's locks
 * (another library's prepare handler that runs after ours and allocates
 * gets the fork buffer, and its frees are dropped). Initial-exec TLS: the
 * shim is loaded at start-up, and a TLS access must not allocate. */
enum { IN_NONE = 0, IN_POOL = 1, IN_FORK = 2 };
static __thread int inside __attribute__((tls_model("initial-exec")));

/* ---- the fork buffer ------------------------------------------------------- */

/* Allocations in the fork window: a lock-free bump over a static buffer,
 * a 16-byte header holding the size; never reused (a fork's worth of them
 * is small), freed blocks are dropped, realloc moves them into the pool. */
#define FORK_BUF_BYTES ((size_t)256 << 10)
static _Alignas(64) unsigned char fork_buf[FORK_BUF_BYTES];
static size_t fork_buf_used;
static uint64_t fork_dropped_frees;

static void *fork_alloc(size_t n, size_t align, bool zero)
{
    (void)zero; /* never reused: still zero */
    if (align < 16) align = 16;
    size_t at = __atomic_load_n(&fork_buf_used, __ATOMIC_RELAXED), user, end;
    do {
        user = (at + 16 + align - 1) & ~(align - 1);
        if (user > FORK_BUF_BYTES || n > FORK_BUF_BYTES - user) {
            errno = ENOMEM;
            return NULL;
        }
        end = user + n;
    } while (!__atomic_compare_exchange_n(&fork_buf_used, &at, end, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    memcpy(&fork_buf[user - 16], &n, sizeof n);
    return &fork_buf[user];
}

static inline bool fork_owns(const void *p) { return (uintptr_t)p - (uintptr_t)fork_buf < FORK_BUF_BYTES; }

static size_t fork_usable(const void *p)
{
    size_t n;
    memcpy(&n, (const unsigned char *)p - 16, sizeof n);
    return n;
}

/* ---- set-up ---------------------------------------------------------------- */

static void fork_prepare(void)
{
    llmem__pool_fork_prepare(__atomic_load_n(&pool, __ATOMIC_ACQUIRE));
    llmem__side_fork_prepare();
    llmem__mapped_fork_prepare();
    inside = IN_FORK;
}

static void fork_parent(void)
{
    inside = IN_NONE;
    llmem__mapped_fork_parent();
    llmem__side_fork_parent();
    llmem__pool_fork_parent(__atomic_load_n(&pool, __ATOMIC_ACQUIRE));
}

static void fork_child(void)
{
    inside = IN_NONE;
    llmem__mapped_fork_child();
    llmem__side_fork_child();
    llmem__pool_fork_child(__atomic_load_n(&pool, __ATOMIC_ACQUIRE));
}

static unsigned long env_ulong(const char *name, unsigned long dflt)
{
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    unsigned long n = strtoul(v, &end, 10);
    return *end ? dflt : n;
}

/* The shim's own classes, added to the pool's (eight per power of two):
 * P + P/32, P + P/16 and P + 3P/32 for each power of two P from 1 KiB to
 * 16 KiB. Programs ask for a page or a buffer plus a small header far more
 * often than for any other size in that range (sqlite3's page cache 4,368
 * and 4,104 B, its 1,032 B blocks; python3's 8,224 B buffers), and those
 * fell just past P into the P + P/8 class, 5-12% of waste on most of
 * their memory (sqlite3: 53.7 MiB of blocks at the peak for 49.9 MiB
 * asked). With these the waste there is at most 1/32 of P. Fills out[]
 * and returns how many (15: the rest of LLMEM_POOL_MAX_EXTRA_CLASSES is
 * left to LLMEM_MALLOC_CLASSES). */
#define NEAR_POW2_FIRST ((uint32_t)1 << 10)
#define NEAR_POW2_LAST ((uint32_t)16 << 10)
static size_t near_pow2_classes(uint32_t *out)
{
    size_t n = 0;
    for (uint32_t pw = NEAR_POW2_FIRST; pw <= NEAR_POW2_LAST; pw *= 2)
        for (uint32_t k = 1; k <= 3; k++) out[n++] = pw + k * (pw / 32);
    return n;
}

/* Create the pool. The first caller does it with `inside` set; any other
 * thread meanwhile, and any allocation made during it, is served by the
 * side allocator. Returns the pool or NULL (then: side allocator). */
static __attribute__((noinline, cold)) llmem_pool *init_pool(void)
{
    int expect = INIT_NONE;
    if (inside || !__atomic_compare_exchange_n(&init_state, &expect, INIT_RUNNING, false, __ATOMIC_ACQ_REL,
                                               __ATOMIC_ACQUIRE))
        return __atomic_load_n(&pool, __ATOMIC_ACQUIRE);
    inside = IN_POOL;
    const char *sv = getenv("LLMEM_MALLOC_STATS");
    if (sv && *sv && strcmp(sv, "0") != 0 && strlen(sv) < sizeof stats_to) strcpy(stats_to, sv);
    llmem_pool_options o = llmem_pool_options_default();
    o.name = "malloc";
    o.purge = LLMEM_POOL_PURGE_MANUAL;
    o.decay_ms = (uint32_t)env_ulong("LLMEM_MALLOC_DECAY_MS", 0);
    llmem__mapped_set_keep_ns((uint64_t)(o.decay_ms ? o.decay_ms : 250) * 1000000u);
    llmem_resource *res = llmem_resource_default();
    if (env_ulong("LLMEM_MALLOC_THP", 0)) {
        llmem_os_options oo = llmem_os_options_default();
        oo.name = "malloc-thp";
        oo.huge = LLMEM_OS_HUGE_THP;
        llmem_resource *thp = NULL;
        if (llmem_os_resource_create(&oo, &thp) == LLMEM_OK) res = thp;
    }
    o.resource = res;
    /* Classes just above each power of two from 1 KiB to 16 KiB, then
     * exact classes for sizes a program is known to use a lot. */
    static uint32_t extra[LLMEM_POOL_MAX_EXTRA_CLASSES];
    o.extra_class_count = near_pow2_classes(extra);
    const char *cv = getenv("LLMEM_MALLOC_CLASSES");
    while (cv && *cv && o.extra_class_count < LLMEM_POOL_MAX_EXTRA_CLASSES) {
        char *end;
        unsigned long v = strtoul(cv, &end, 10);
        if (end == cv) break;
        if (v > 0 && v <= UINT32_MAX) extra[o.extra_class_count++] = (uint32_t)v;
        cv = *end == ',' ? end + 1 : end;
        if (*end != ',') break;
    }
    if (o.extra_class_count) o.extra_classes = extra;
    llmem_pool *p = NULL;
    llmem_status st = llmem_pool_create(&o, &p);
    if (st == LLMEM_OK && pthread_atfork(fork_prepare, fork_parent, fork_child) != 0) {
        /* Without fork handlers a child could inherit a held lock: serve
         * everything from the side allocator instead. */
        llmem_pool_destroy(p);
        p = NULL;
        st = LLMEM_ENOMEM;
    }
    if (st != LLMEM_OK) {
        static const char msg[] = "libllmem-malloc: cannot create the pool; using the side allocator\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
    }
    __atomic_store_n(&pool, p, __ATOMIC_RELEASE);
    __atomic_store_n(&init_state, p ? INIT_DONE : INIT_FAILED, __ATOMIC_RELEASE);
    inside = IN_NONE;
    return p;
}

/* The pool if this call may use it, else NULL (side allocator). */
static inline llmem_pool *pool_for_call(void)
{
    llmem_pool *p = __atomic_load_n(&pool, __ATOMIC_RELAXED);
    if (LLMEM_LIKELY(p && !inside)) return p;
    if (inside || __atomic_load_n(&init_state, __ATOMIC_ACQUIRE) != INIT_NONE) return NULL;
    return init_pool();
}

static inline bool pool_block(const void *ptr) { return llmem__addrmap_get((uintptr_t)ptr) != NULL; }

static void *side_or_enomem(size_t n, size_t align, bool zero)
{
    if (LLMEM_UNLIKELY(inside == IN_FORK)) return fork_alloc(n, align, zero);
    void *r = llmem__side_alloc(n, align, zero);
    if (!r) errno = ENOMEM;
    return r;
}

/* ---- allocation ------------------------------------------------------------ */

/* Requests from RELEASE_REQUEST_MIN (glibc's first mmap threshold) up to
 * the mapped size first have the pool give back its free runs of
 * RELEASE_RUN_MIN bytes and more that have been free RELEASE_AGE_NS, at
 * most once per RELEASE_EVERY_NS: cc1 grows hash tables and obstacks by
 * such blocks, and the old ones' runs stayed resident (its peak RSS
 * 62.6 -> 60.9 MiB; without the age, or with runs from 128 KiB, page
 * faults rose 8-40%). The age spares a run that a loop frees and takes
 * again; the interval bounds the walks of the free tree. */
#define RELEASE_REQUEST_MIN ((size_t)128 << 10)
#define RELEASE_RUN_MIN ((size_t)256 << 10)
#define RELEASE_AGE_NS ((uint64_t)20000000)
#define RELEASE_EVERY_NS ((uint64_t)5000000)
static uint64_t next_release_ns;

/* A request of RELEASE_REQUEST_MIN bytes or more, before it is served. A
 * mapping (LLMEM_SHIM_MAPPED_MIN and more) comes back from here, NULL if
 * the kernel refuses or the request is smaller (the caller tries the
 * pool). A freed block's kept mapping serves first (zeroed for calloc):
 * its pages are resident already. Before a fresh mapping the pool gives
 * back the pages of all its free runs of a megabyte and more, of any age
 * (llmem__pool_release_free_runs): the new mapping's pages would
 * otherwise add to the peak beside free pages that stay resident
 * (python3's test run held 6-7 MiB of them at its peak while its 5-10 MB
 * buffers were mapped). */
static __attribute__((noinline)) void *big_alloc(llmem_pool *p, size_t n, bool zero)
{
    if (n >= LLMEM_SHIM_MAPPED_MIN) {
        void *m = llmem__mapped_reuse(n, zero); /* pages the process holds already */
        if (m) return m;
    }
    int was = inside;
    inside = IN_POOL;
    if (n >= LLMEM_SHIM_MAPPED_MIN) {
        llmem__pool_release_free_runs(p, LLMEM_SHIM_MAPPED_MIN, 0);
    } else {
        uint64_t now = llmem__coarse_ns();
        if (now >= __atomic_load_n(&next_release_ns, __ATOMIC_RELAXED)) {
            __atomic_store_n(&next_release_ns, now + RELEASE_EVERY_NS, __ATOMIC_RELAXED);
            llmem__pool_release_free_runs(p, RELEASE_RUN_MIN, RELEASE_AGE_NS);
        }
    }
    inside = was;
    return n >= LLMEM_SHIM_MAPPED_MIN ? llmem__mapped_alloc(n) : NULL;
}

/* The entry points call each other through these, never by their
 * exported names: no PLT hop, and no --wrap in a test that links the shim
 * in can redirect them. */
static inline void *shim_malloc(size_t n)
{
    llmem_pool *p = pool_for_call();
    if (LLMEM_UNLIKELY(!p)) return side_or_enomem(n, 0, false);
    if (LLMEM_UNLIKELY(n >= RELEASE_REQUEST_MIN)) {
        void *m = big_alloc(p, n, false);
        if (m) return m;
    }
    inside = IN_POOL;
    void *r = llmem_pool_alloc(p, n ? n : 1, NULL);
    inside = IN_NONE;
    if (LLMEM_UNLIKELY(!r)) errno = ENOMEM;
    return r;
}

/* The thread-cache hit in one jump (llmem__pool_shim_alloc, pool_shim.c):
 * it needs no `inside` flag, since it calls nothing; anything else comes
 * back to shim_malloc through llmem__shim_alloc_miss. */
__attribute__((noinline)) void *llmem__shim_alloc_miss(size_t n) { return shim_malloc(n); }

EXPORT void *malloc(size_t n)
{
    llmem_pool *p = __atomic_load_n(&pool, __ATOMIC_RELAXED);
    if (LLMEM_LIKELY(p && !inside)) return llmem__pool_shim_alloc(p, n);
    return llmem__shim_alloc_miss(n); /* out of line: malloc keeps no frame */
}

EXPORT void *calloc(size_t count, size_t size)
{
    size_t n;
    if (__builtin_mul_overflow(count, size, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    llmem_pool *p = pool_for_call();
    if (LLMEM_UNLIKELY(!p)) return side_or_enomem(n, 0, true);
    if (LLMEM_UNLIKELY(n >= RELEASE_REQUEST_MIN)) {
        void *m = big_alloc(p, n, true); /* a fresh mapping is zero-filled by the kernel */
        if (m) return m;
    }
    inside = IN_POOL;
    void *r = llmem_pool_alloc(p, n ? n : 1, NULL);
    inside = IN_NONE;
    if (LLMEM_UNLIKELY(!r)) {
        errno = ENOMEM;
        return NULL;
    }
    return memset(r, 0, n);
}

/* align: a power of two. Over the pool's alignment limit (its largest
 * superblock) the side allocator serves, which takes any. */
static void *alloc_aligned(size_t align, size_t n)
{
    if (n == 0) n = 1;
    llmem_pool *p = pool_for_call();
    if (LLMEM_UNLIKELY(!p)) return side_or_enomem(n, align, false);
    llmem_status st;
    inside = IN_POOL;
    void *r = align <= 16 ? llmem_pool_alloc(p, n, &st) : llmem_pool_alloc_aligned(p, n, align, &st);
    inside = IN_NONE;
    if (LLMEM_UNLIKELY(!r)) {
        if (st == LLMEM_EALIGN) return side_or_enomem(n, align, false);
        errno = ENOMEM;
    }
    return r;
}

EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
    if (!align || (align & (align - 1)) || align % sizeof(void *)) return EINVAL;
    int saved = errno;
    void *r = alloc_aligned(align, n);
    errno = saved; /* POSIX: the result is the return value */
    if (!r) return ENOMEM;
    *out = r;
    return 0;
}

EXPORT void *aligned_alloc(size_t align, size_t n)
{
    if (!align || (align & (align - 1))) { /* C17 7.22.3.1; glibc 2.38 does the same */
        errno = EINVAL;
        return NULL;
    }
    return alloc_aligned(align, n);
}

EXPORT void *memalign(size_t align, size_t n)
{
    /* glibc: any alignment is rounded up to a power of two. */
    if (align > ((size_t)1 << (sizeof(size_t) * 8 - 1))) {
        errno = EINVAL;
        return NULL;
    }
    if (align & (align - 1)) align = llmem__next_pow2(align);
    return alloc_aligned(align ? align : 1, n);
}

EXPORT void *valloc(size_t n) { return alloc_aligned(PAGE_BYTES, n); }

EXPORT void *pvalloc(size_t n)
{
    size_t r;
    if (!llmem__align_up(n ? n : 1, PAGE_BYTES, &r)) {
        errno = ENOMEM;
        return NULL;
    }
    return alloc_aligned(PAGE_BYTES, r);
}

/* ---- free ------------------------------------------------------------------ */

static __attribute__((noinline)) void free_other(void *ptr)
{
    if (fork_owns(ptr) || inside == IN_FORK) __atomic_add_fetch(&fork_dropped_frees, 1, __ATOMIC_RELAXED);
    else if (llmem__side_owns(ptr)) llmem__side_free(ptr);
    else if (llmem__mapped_usable(ptr)) llmem__mapped_free(ptr);
    else __atomic_add_fetch(&unknown_frees, 1, __ATOMIC_RELAXED); /* not ours to free: leave it */
}

static inline void shim_free(void *ptr)
{
    if (!ptr) return;
    if (LLMEM_LIKELY(pool_block(ptr) && inside != IN_FORK)) {
        int was = inside;
        inside = IN_POOL;
        llmem_pool_free(pool, ptr); /* a refusal (double free) is logged by the pool */
        inside = was;
        return;
    }
    free_other(ptr);
}

/* The push onto this thread's cache in one jump (llmem__pool_shim_free);
 * anything else, a null pointer included, comes back to shim_free. */
__attribute__((noinline)) void llmem__shim_free_miss(void *ptr) { shim_free(ptr); }

static inline void free_jump(void *ptr)
{
    llmem_pool *p = __atomic_load_n(&pool, __ATOMIC_RELAXED);
    if (LLMEM_LIKELY(p && inside == IN_NONE)) {
        llmem__pool_shim_free(p, ptr);
        return;
    }
    llmem__shim_free_miss(ptr); /* out of line: free keeps no frame */
}

EXPORT void free(void *ptr) { free_jump(ptr); }

EXPORT void free_sized(void *ptr, size_t size)
{
    (void)size;
    free_jump(ptr);
}

EXPORT void free_aligned_sized(void *ptr, size_t align, size_t size)
{
    (void)align;
    (void)size;
    free_jump(ptr);
}

/* ---- resize ---------------------------------------------------------------- */

/* A mapped block to n > 0 bytes: mremap while it
 * stays big; back into the pool when it shrinks below a quarter of the
 * threshold (a small block does not keep a mapping of its own). */
static void *realloc_mapped(void *ptr, size_t n)
{
    void *r;
    if (n < LLMEM_SHIM_MAPPED_MIN / 4) {
        r = shim_malloc(n);
        if (!r) return NULL;
        memcpy(r, ptr, n);
        llmem__mapped_free(ptr);
        return r;
    }
    r = llmem__mapped_resize(ptr, n);
    if (!r) errno = ENOMEM;
    return r;
}

static void *shim_realloc(void *ptr, size_t n)
{
    if (!ptr) return shim_malloc(n);
    if (n == 0) { /* glibc: free and return NULL */
        shim_free(ptr);
        return NULL;
    }
    if (LLMEM_LIKELY(pool_block(ptr) && inside == IN_NONE)) {
        /* Without the pool's lock: stay in place when the block fits and
         * wastes at most half (the pool's own rule), else allocate, copy
         * and free, each on its thread-cache fast path when small. A
         * large block that grows goes to llmem_pool_realloc, which grows
         * it into the free run after it when there is one (python's lists
         * grow by steps of 1.25: copying each step held old and new at
         * once, where glibc mremaps them). A pointer that
         * is not a live block start (usable 0) gets the pool's refusal
         * from llmem_pool_realloc. */
        inside = IN_POOL;
        size_t have = llmem__pool_usable_nolock(pool, ptr);
        void *r;
        llmem_status st = LLMEM_OK;
        if (have && n <= have && n >= have / 2) {
            r = ptr;
        } else if (have && n > have && n >= LLMEM_SHIM_MAPPED_MIN && (r = big_alloc(pool, n, false)) != NULL) {
            memcpy(r, ptr, have); /* the last copy: mremap resizes it from here on */
            llmem_pool_free(pool, ptr);
        } else if (have && (n < have || have < GROW_IN_PLACE_MIN)) {
            r = llmem_pool_alloc(pool, n, &st);
            if (r) {
                memcpy(r, ptr, have < n ? have : n);
                llmem_pool_free(pool, ptr);
            }
        } else {
            r = llmem_pool_realloc(pool, ptr, n, &st);
        }
        inside = IN_NONE;
        if (LLMEM_UNLIKELY(!r)) errno = st == LLMEM_ENOMEM || st == LLMEM_EOVERFLOW ? ENOMEM : EINVAL;
        return r;
    }
    bool from_fork = fork_owns(ptr), from_side = !from_fork && llmem__side_owns(ptr);
    size_t mapped = from_fork || from_side || pool_block(ptr) ? 0 : llmem__mapped_usable(ptr);
    if (mapped && inside != IN_FORK) return realloc_mapped(ptr, n);
    size_t have = from_fork ? fork_usable(ptr)
                  : from_side ? llmem__side_usable(ptr)
                  : pool_block(ptr) ? llmem__pool_usable_nolock(pool, ptr) /* inside a pool call or fork */
                                    : mapped;
    if (!have) {
        errno = EINVAL;
        return NULL;
    }
    if (from_fork || inside == IN_FORK) {
        /* Copy and keep the old block: fork blocks are never reused, and
         * in the fork window a free could need a lock held. */
        void *r = inside == IN_FORK ? fork_alloc(n, 16, false) : shim_malloc(n);
        if (r) memcpy(r, ptr, have < n ? have : n);
        return r;
    }
    if (!from_side) { /* a pool block while inside a pool call: cannot happen, refuse */
        errno = EINVAL;
        return NULL;
    }
    llmem_pool *p = pool_for_call();
    if (!p) {
        void *r = llmem__side_realloc(ptr, n);
        if (!r) errno = ENOMEM;
        return r;
    }
    void *r = shim_malloc(n); /* into the pool: the side allocator is for the bootstrap */
    if (!r) return NULL;
    memcpy(r, ptr, have < n ? have : n);
    llmem__side_free(ptr);
    return r;
}

EXPORT void *realloc(void *ptr, size_t n) { return shim_realloc(ptr, n); }

EXPORT void *reallocarray(void *ptr, size_t count, size_t size)
{
    size_t n;
    if (__builtin_mul_overflow(count, size, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    return shim_realloc(ptr, n);
}

/* ---- for operator new and delete (new_delete.c) --------------------------- */

void *llmem__shim_new(size_t n, size_t align)
{
    int saved = errno; /* operator new reports by exception, not errno */
    void *r = align <= 16 ? shim_malloc(n) : alloc_aligned(align, n);
    errno = saved;
    return r;
}

void llmem__shim_delete(void *ptr) { free_jump(ptr); }

/* ---- queries --------------------------------------------------------------- */

EXPORT size_t malloc_usable_size(void *ptr)
{
    if (!ptr) return 0;
    if (fork_owns(ptr)) return fork_usable(ptr);
    if (pool_block(ptr)) {
        int was = inside;
        if (!was) inside = IN_POOL;
        size_t n = llmem__pool_usable_nolock(pool, ptr);
        inside = was;
        return n;
    }
    if (llmem__side_owns(ptr)) return llmem__side_usable(ptr);
    return llmem__mapped_usable(ptr);
}

/* glibc's: give free memory back; 1 if some was. pad is not honoured
 * (the pool keeps nothing at a heap top). */
EXPORT int malloc_trim(size_t pad)
{
    (void)pad;
    llmem_pool *p = pool_for_call();
    if (!p) return 0;
    inside = IN_POOL;
    size_t released = llmem_pool_trim(p);
    inside = IN_NONE;
    released += llmem__mapped_trim();
    return released > 0;
}

/* ---- figures at exit ---------------------------------------------------- */

static __attribute__((destructor)) void report_at_exit(void)
{
    llmem_pool *p = __atomic_load_n(&pool, __ATOMIC_ACQUIRE);
    if (!stats_to[0]) return;
    llmem_pool_stats s = {.struct_size = sizeof s};
    if (p) {
        inside = IN_POOL;
        llmem_pool_get_stats(p, &s);
        inside = IN_NONE;
    }
    llmem__side_stats ss;
    llmem__side_get_stats(&ss);
    llmem__mapped_stats ms;
    llmem__mapped_get_stats(&ms);
    char line[640];
    int n = snprintf(line, sizeof line,
                     "libllmem-malloc: pid %d pool %s allocs_total=%llu frees_total=%llu live=%llu used_peak_bytes=%llu "
                     "reserved_peak_bytes=%llu committed_bytes=%llu invalid_frees=%llu; side allocs_total=%llu "
                     "live_blocks=%llu boot_bytes=%llu region_bytes=%llu; mapped maps_total=%llu remaps_total=%llu "
                     "reuses_total=%llu live_blocks=%llu peak_bytes=%llu cached_bytes=%llu; unknown_frees=%llu\n",
                     (int)getpid(), p ? "on" : "off", (unsigned long long)s.allocs_total, (unsigned long long)s.frees_total,
                     (unsigned long long)s.live_allocations, (unsigned long long)s.used_peak_bytes,
                     (unsigned long long)s.reserved_peak_bytes, (unsigned long long)s.committed_bytes,
                     (unsigned long long)s.invalid_frees_total, (unsigned long long)ss.allocs_total,
                     (unsigned long long)ss.live_blocks, (unsigned long long)ss.boot_bytes,
                     (unsigned long long)ss.region_bytes, (unsigned long long)ms.maps_total,
                     (unsigned long long)ms.remaps_total, (unsigned long long)ms.reuses_total,
                     (unsigned long long)ms.live_blocks, (unsigned long long)ms.peak_bytes,
                     (unsigned long long)ms.cached_bytes, (unsigned long long)unknown_frees);
    if (n > 0) {
        bool to_stderr = strcmp(stats_to, "1") == 0;
        int fd = to_stderr ? 2 : open(stats_to, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) return;
        ssize_t w = write(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        (void)w;
        if (!to_stderr) close(fd);
    }
}

/* ---- the pool's own metadata (-Wl,--wrap=malloc,...) -------------------- */

void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t count, size_t size);
void *__wrap_realloc(void *ptr, size_t n);
void __wrap_free(void *ptr);
void *__wrap_aligned_alloc(size_t align, size_t n);
int __wrap_posix_memalign(void **out, size_t align, size_t n);

void *__wrap_malloc(size_t n) { return side_or_enomem(n, 0, false); }

void *__wrap_calloc(size_t count, size_t size)
{
    size_t n;
    if (__builtin_mul_overflow(count, size, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    return side_or_enomem(n, 0, true);
}

void *__wrap_realloc(void *ptr, size_t n)
{
    void *r = llmem__side_realloc(ptr, n);
    if (!r) errno = ENOMEM;
    return r;
}

void __wrap_free(void *ptr) { llmem__side_free(ptr); }

void *__wrap_aligned_alloc(size_t align, size_t n)
{
    if (!align || (align & (align - 1))) {
        errno = EINVAL;
        return NULL;
    }
    return side_or_enomem(n, align, false);
}

int __wrap_posix_memalign(void **out, size_t align, size_t n)
{
    if (!align || (align & (align - 1)) || align % sizeof(void *)) return EINVAL;
    void *r = llmem__side_alloc(n, align, false);
    if (!r) return ENOMEM;
    *out = r;
    return 0;
}
