/*
 * mapped.c - mapped blocks of the malloc shim (see mapped.h).
 *
 * Table. SLOTS entries of (address, bytes), linear probing on a hash of
 * the address. An entry's address is 0 (never used: ends a probe),
 * TOMB (freed: probes go on) or a live block's start. Inserts reuse the
 * first free or tomb slot on their probe path and keep at most SLOTS / 2
 * blocks live, so a probe always ends; removal leaves a tomb, so a lookup
 * that runs past it while another block is removed still finds its own.
 * Writers hold `lock`; readers read the address with acquire, and the
 * size was stored before it with release.
 *
 * Cache. A freed block's mapping is kept, its pages resident, for keep_ns
 * (the pool's decay) in one of CACHE_SLOTS entries: at most
 * CACHE_MAX_BYTES in all, or one block of up to CACHE_BLOCK_MAX alone.
 * The next big request takes the best fit (the smallest that holds it,
 * else the largest, grown with mremap: its pages move with it) and gives
 * back a tail of more than a quarter it does not need. Entries older than
 * keep_ns, and the oldest when the cache is full, are unmapped at the
 * next mapped call (malloc_trim unmaps them all).
 * The cache turns on only once a program shows it maps big blocks
 * again and again: a fresh mapping within keep_ns of an unmap. A block
 * kept and never asked for again stays resident until the next mapped
 * call (sqlite3's one 2 MB block added 2 MiB to its peak RSS that way).
 * Why: without it every big block was fresh pages. python3's test run
 * maps 3, 8 and 10 MB buffers again and again; it took 27-29 k page faults
 * against glibc's 20 k (glibc's raised mmap threshold serves them from
 * its heap) and ran 10% slower. With the cache: 24 k faults, 3% slower
 * than glibc, the same peak RSS. A 64 MiB cap took 23 k faults but
 * 5.3 MiB more peak RSS (these pages serve only big blocks, where glibc's
 * heap serves any request from them); 16 MiB, 2.3 MiB more.
 */
#include "mapped.h"

#include <pthread.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

#define SLOTS 4096u
#define TOMB ((uintptr_t)1)
#define PAGE ((size_t)4096)

typedef struct slot {
    uintptr_t addr;
    size_t bytes;
} slot;

#define CACHE_SLOTS 8u
#define CACHE_MAX_BYTES ((size_t)8 << 20)
#define CACHE_BLOCK_MAX ((size_t)32 << 20)

static slot table[SLOTS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static llmem__mapped_stats st; /* under lock */

typedef struct cached {
    uintptr_t addr;
    size_t bytes;
    uint64_t freed_ns;
} cached;
static cached cache[CACHE_SLOTS]; /* [0, ncached), under lock */
static unsigned ncached;
static uint64_t keep_ns = 250000000u;
/* The cache is off until a fresh mapping comes within keep_ns of a free
 * that unmapped (a program that maps big blocks again and again); then
 * on for good. Under lock. */
static bool cache_on;
static uint64_t last_unmap_ns;

static inline unsigned hash_of(uintptr_t a) { return (unsigned)((a >> 12) * 0x9E3779B97F4A7C15ull >> 52) % SLOTS; }

/* The live entry of a, or NULL. Lock-free. */
static slot *find(uintptr_t a)
{
    if (!a || a & (PAGE - 1)) return NULL;
    for (unsigned i = hash_of(a), n = 0; n < SLOTS; i = (i + 1) % SLOTS, n++) {
        uintptr_t v = __atomic_load_n(&table[i].addr, __ATOMIC_ACQUIRE);
        if (v == a) return &table[i];
        if (v == 0) return NULL;
    }
    return NULL;
}

/* Record a live block. false when the table is full. Lock held. */
static bool insert(uintptr_t a, size_t bytes)
{
    if (st.live_blocks >= SLOTS / 2) return false;
    for (unsigned i = hash_of(a);; i = (i + 1) % SLOTS) {
        uintptr_t v = table[i].addr;
        if (v == 0 || v == TOMB) {
            table[i].bytes = bytes;
            __atomic_store_n(&table[i].addr, a, __ATOMIC_RELEASE);
            break;
        }
    }
    st.live_blocks++;
    st.live_bytes += bytes;
    if (st.live_bytes > st.peak_bytes) st.peak_bytes = st.live_bytes;
    return true;
}

/* Drop entry e. Lock held. */
static void remove_slot(slot *e)
{
    st.live_blocks--;
    st.live_bytes -= e->bytes;
    __atomic_store_n(&e->addr, TOMB, __ATOMIC_RELEASE);
}

static bool round_pages(size_t n, size_t *out)
{
    if (n > SIZE_MAX - PAGE) return false;
    *out = (n + PAGE - 1) & ~(PAGE - 1);
    return true;
}

void llmem__mapped_set_keep_ns(uint64_t ns)
{
    pthread_mutex_lock(&lock);
    keep_ns = ns;
    pthread_mutex_unlock(&lock);
}

/* Mappings to unmap once the lock is dropped. */
typedef struct unmap_list {
    unsigned n;
    cached e[CACHE_SLOTS + 1];
} unmap_list;

/* Take entry i out of the cache. Lock held. */
static cached cache_take(unsigned i)
{
    cached c = cache[i];
    st.cached_bytes -= c.bytes;
    cache[i] = cache[--ncached];
    return c;
}

static void cache_drop(unsigned i, unmap_list *out) { out->e[out->n++] = cache_take(i); }

/* Move entries older than keep_ns (all when now is 0) to out. Lock held. */
static void cache_expire(uint64_t now, unmap_list *out)
{
    for (unsigned i = ncached; i-- > 0;)
        if (!now || now - cache[i].freed_ns >= keep_ns) cache_drop(i, out);
}

/* Unmap them; the bytes unmapped. */
static size_t unmap_all(const unmap_list *l)
{
    size_t bytes = 0;
    for (unsigned i = 0; i < l->n; i++) {
        munmap((void *)l->e[i].addr, l->e[i].bytes);
        bytes += l->e[i].bytes;
    }
    return bytes;
}

void *llmem__mapped_reuse(size_t n, bool zero)
{
    size_t need;
    if (!round_pages(n, &need)) return NULL;
    unmap_list drop = {0};
    pthread_mutex_lock(&lock);
    cache_expire(llmem__coarse_ns(), &drop);
    unsigned best = CACHE_SLOTS;
    for (unsigned i = 0; i < ncached; i++) {
        if (best == CACHE_SLOTS) best = i;
        else if (cache[i].bytes >= need ? cache[best].bytes < need || cache[i].bytes < cache[best].bytes
                                        : cache[best].bytes < need && cache[i].bytes > cache[best].bytes)
            best = i;
    }
    cached c = best < CACHE_SLOTS ? cache_take(best) : (cached){0};
    pthread_mutex_unlock(&lock);
    unmap_all(&drop);
    if (!c.addr) return NULL;
    void *m = (void *)c.addr;
    size_t kept = c.bytes; /* pages that may hold old bytes */
    if (c.bytes > need + need / 4) { /* give back the tail it does not need */
        munmap((char *)m + need, c.bytes - need);
        c.bytes = kept = need;
    } else if (c.bytes < need) {
        m = mremap(m, c.bytes, need, MREMAP_MAYMOVE); /* resident pages move with it */
        if (m == MAP_FAILED) {
            munmap((void *)c.addr, c.bytes);
            return NULL;
        }
        c.bytes = need;
    }
    if (zero) memset(m, 0, kept < n ? kept : n); /* pages added by mremap are zero already */
    pthread_mutex_lock(&lock);
    bool ok = insert((uintptr_t)m, c.bytes);
    if (ok) st.reuses_total++;
    pthread_mutex_unlock(&lock);
    if (!ok) {
        munmap(m, c.bytes);
        return NULL;
    }
    return m;
}

size_t llmem__mapped_trim(void)
{
    unmap_list drop = {0};
    pthread_mutex_lock(&lock);
    cache_expire(0, &drop);
    pthread_mutex_unlock(&lock);
    return unmap_all(&drop);
}

void *llmem__mapped_alloc(size_t n)
{
    size_t bytes;
    if (!round_pages(n, &bytes)) return NULL;
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    pthread_mutex_lock(&lock);
    bool ok = insert((uintptr_t)m, bytes);
    if (ok) {
        st.maps_total++;
        if (!cache_on && last_unmap_ns && llmem__coarse_ns() - last_unmap_ns < keep_ns) cache_on = true;
    }
    pthread_mutex_unlock(&lock);
    if (!ok) {
        munmap(m, bytes);
        return NULL;
    }
    return m;
}

size_t llmem__mapped_usable(const void *p)
{
    slot *e = find((uintptr_t)p);
    return e ? e->bytes : 0;
}

void *llmem__mapped_resize(void *p, size_t n)
{
    size_t bytes;
    if (!round_pages(n, &bytes)) return NULL;
    pthread_mutex_lock(&lock);
    slot *e = find((uintptr_t)p);
    if (!e) {
        pthread_mutex_unlock(&lock);
        return NULL;
    }
    size_t old = e->bytes;
    void *m = bytes == old ? p : mremap(p, old, bytes, MREMAP_MAYMOVE);
    if (m == MAP_FAILED) {
        pthread_mutex_unlock(&lock);
        return NULL;
    }
    remove_slot(e);
    insert((uintptr_t)m, bytes); /* one out, one in: cannot be full */
    st.remaps_total++;
    pthread_mutex_unlock(&lock);
    return m;
}

void llmem__mapped_free(void *p)
{
    unmap_list drop = {0};
    pthread_mutex_lock(&lock);
    slot *e = find((uintptr_t)p);
    size_t bytes = e ? e->bytes : 0;
    if (e) {
        remove_slot(e);
        uint64_t now = llmem__coarse_ns();
        cache_expire(now, &drop);
        if (!cache_on || !keep_ns || bytes > CACHE_BLOCK_MAX) {
            last_unmap_ns = now;
        } else {
            /* Make room: the oldest go first. */
            while (ncached && (ncached == CACHE_SLOTS || st.cached_bytes + bytes > CACHE_MAX_BYTES)) {
                unsigned old = 0;
                for (unsigned i = 1; i < ncached; i++)
                    if (cache[i].freed_ns < cache[old].freed_ns) old = i;
                cache_drop(old, &drop);
            }
            cache[ncached++] = (cached){(uintptr_t)p, bytes, now};
            st.cached_bytes += bytes;
            bytes = 0; /* kept */
        }
    }
    pthread_mutex_unlock(&lock);
    unmap_all(&drop);
    if (bytes) munmap(p, bytes);
}

void llmem__mapped_get_stats(llmem__mapped_stats *out)
{
    pthread_mutex_lock(&lock);
    *out = st;
    pthread_mutex_unlock(&lock);
}

void llmem__mapped_fork_prepare(void) { pthread_mutex_lock(&lock); }
void llmem__mapped_fork_parent(void) { pthread_mutex_unlock(&lock); }
void llmem__mapped_fork_child(void) { pthread_mutex_init(&lock, NULL); }
