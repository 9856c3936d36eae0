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
 */
#include "mapped.h"

#include <pthread.h>
#include <sys/mman.h>

#define SLOTS 4096u
#define TOMB ((uintptr_t)1)
#define PAGE ((size_t)4096)

typedef struct slot {
    uintptr_t addr;
    size_t bytes;
} slot;

static slot table[SLOTS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static llmem__mapped_stats st; /* under lock */

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

void *llmem__mapped_alloc(size_t n)
{
    size_t bytes;
    if (!round_pages(n, &bytes)) return NULL;
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    pthread_mutex_lock(&lock);
    bool ok = insert((uintptr_t)m, bytes);
    if (ok) st.maps_total++;
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
    pthread_mutex_lock(&lock);
    slot *e = find((uintptr_t)p);
    size_t bytes = e ? e->bytes : 0;
    if (e) remove_slot(e);
    pthread_mutex_unlock(&lock);
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
