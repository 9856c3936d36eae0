/*
 * fixed.c - fixed-size block pool.
 *
 * Blocks come from chunks mapped from the resource. A new chunk is not
 * carved up front (that would touch, and commit, every page of it): the pool
 * hands out blocks from the free list first and otherwise bumps through the
 * newest chunk's uncarved tail; it maps a new chunk only when both are
 * empty. Chunk sizes double from chunk_bytes up to max_chunk_bytes; when
 * the resource is out of memory for a chunk, the pool retries with halves
 * down to a single block, so it can fill a capped resource to the brim.
 *
 * The free list is either in band - a singly linked list threaded through
 * the free blocks (plain, unchecked host pools: no metadata per block) - or
 * out of band - a stack of block pointers in host memory (device pools,
 * which must never touch their memory, and checked pools, whose metadata a
 * stray write must not corrupt). Checked pools also keep one state bit per
 * block (1 = handed out) in each chunk's descriptor.
 *
 * Thread-safe pools put a magazine (a small array of free block pointers)
 * in front of the free list for each thread, found through a pthread key.
 * Allocation pops from the magazine and free pushes onto it, with no lock
 * and no atomic read-modify-write (counters are relaxed stores by the owning
 * thread, read by stats under the lock); an empty magazine is refilled with
 * half its capacity, a full one flushes half, both under the pool lock. A
 * block freed by another thread simply joins that thread's magazine. The
 * key's destructor returns a magazine when its thread exits.
 *
 * Chunk lookup (checked frees, owns) is a binary search over a sorted
 * index of chunk descriptors. The index is replaced, never modified, when a
 * chunk is added, and published with a release store; old indexes are kept
 * until destroy, so lock-free readers always see a consistent one.
 *
 * Invariants (checked by the tests): carved = in use + in the free list +
 * in magazines; every block in the free list or a magazine has state bit 0
 * in checked pools; blocks never overlap and all lie inside their chunks.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "llmem/fixed.h"

typedef struct fixed_chunk {
    uintptr_t base;
    size_t mapped;      /* bytes mapped */
    size_t blocks;      /* blocks in the chunk */
    size_t number;      /* order of creation, for messages */
    uint64_t *state;    /* checked: bit per block, 1 = handed out */
} fixed_chunk;

typedef struct chunk_index {
    struct chunk_index *retired_next;
    size_t n;
    fixed_chunk *c[]; /* sorted by base */
} chunk_index;

typedef struct magazine {
    llmem_fixed *pool;
    struct magazine *prev, *next; /* all magazines of the pool, under its lock */
    uint32_t count;               /* written by the owner (relaxed store) */
    uint32_t cap;
    uint64_t allocs, frees;       /* written by the owner (relaxed store) */
    void *items[];
} magazine;

struct llmem_fixed {
    /* hot: the free list and the carve cursor */
    void *free_head;          /* in-band list */
    void **stack;             /* out-of-band list */
    size_t top, stack_cap;
    uintptr_t bump, bump_end; /* uncarved blocks of the newest chunk */
    size_t stride;
    bool inband, thread_safe, checked, host;
    /* plain pools' counters (thread-safe pools: allocs/frees of dead magazines) */
    uint64_t in_use, peak, allocs, frees;
    uint64_t failures, double_frees, foreign_frees, corruptions; /* atomic */
    size_t carved, global_free;
    /* chunks */
    chunk_index *index;       /* atomic pointer */
    chunk_index *retired;
    fixed_chunk **chunks;     /* creation order */
    size_t nchunks, chunks_cap;
    size_t total_blocks, reserved;
    size_t next_chunk_bytes, max_chunk_bytes, max_blocks;
    /* thread-safe machinery */
    pthread_mutex_t lock;
    pthread_key_t key;
    magazine *mags;
    uint32_t mag_cap;
    /* identity */
    llmem_resource *res;
    size_t block_size, align;
    char name[32];
    uint64_t id;              /* unique for the process's life (thread cache lookup) */
};

/* ---- chunk lookup ------------------------------------------------------------ */

static fixed_chunk *find_chunk(const llmem_fixed *p, uintptr_t a)
{
    const chunk_index *ix = __atomic_load_n(&p->index, __ATOMIC_ACQUIRE);
    if (!ix) return NULL;
    size_t lo = 0, hi = ix->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ix->c[mid]->base + ix->c[mid]->blocks * p->stride <= a) lo = mid + 1;
        else hi = mid;
    }
    if (lo < ix->n && a >= ix->c[lo]->base) return ix->c[lo];
    return NULL;
}

static inline bool state_bit(const fixed_chunk *c, size_t i)
{
    return (__atomic_load_n(&c->state[i / 64], __ATOMIC_RELAXED) >> (i % 64)) & 1;
}

/* Mark block i of c handed out. */
static void state_set(llmem_fixed *p, fixed_chunk *c, size_t i)
{
    uint64_t bit = 1ull << (i % 64);
    if (p->thread_safe) __atomic_fetch_or(&c->state[i / 64], bit, __ATOMIC_RELAXED);
    else c->state[i / 64] |= bit;
}

/* Validate a pointer being freed and clear its state bit. Checked pools. */
static llmem_status check_free(llmem_fixed *p, void *ptr)
{
    uintptr_t a = (uintptr_t)ptr;
    fixed_chunk *c = find_chunk(p, a);
    if (!c) {
        llmem__add(&p->foreign_frees, 1);
        return llmem__fail_log(LLMEM_LOG_WARN, LLMEM_EFOREIGN,
                               "fixed pool '%s': free of %p, which is not a block of this pool", p->name, ptr);
    }
    size_t off = (size_t)(a - c->base), i = off / p->stride;
    if (off % p->stride) {
        llmem__add(&p->foreign_frees, 1);
        return llmem__fail_log(LLMEM_LOG_WARN, LLMEM_EFOREIGN,
                               "fixed pool '%s': free of %p, %zu bytes into block %zu of chunk %zu, not its start",
                               p->name, ptr, off % p->stride, i, c->number);
    }
    uint64_t bit = 1ull << (i % 64), old;
    if (p->thread_safe) old = __atomic_fetch_and(&c->state[i / 64], ~bit, __ATOMIC_RELAXED);
    else {
        old = c->state[i / 64];
        c->state[i / 64] = old & ~bit;
    }
    if (!(old & bit)) {
        llmem__add(&p->double_frees, 1);
        return llmem__fail_log(LLMEM_LOG_WARN, LLMEM_EDOUBLEFREE,
                               "fixed pool '%s': double free of %p (block %zu of chunk %zu is already free)", p->name,
                               ptr, i, c->number);
    }
    return LLMEM_OK;
}

/* ---- freed-block fill (checked host pools) ------------------------------
 *
 * Every block a checked host pool does not hand out holds FREED_BYTE: it is
 * written when a block is carved and when it is freed, and verified when the
 * block is handed out, so a write through a dangling pointer is found
 * without AddressSanitizer. (A checked pool's free list is out of band, so
 * nothing else writes into free blocks.) */
#define FREED_BYTE 0xDF

static void freed_fill(const llmem_fixed *p, void *b)
{
    LLMEM_UNPOISON(b, p->stride);
    memset(b, FREED_BYTE, p->stride);
    LLMEM_POISON(b, p->stride);
}

/* Report a block written after its free. Called with the block unpoisoned. */
static void freed_verify(llmem_fixed *p, const void *b)
{
    const unsigned char *c = b;
    size_t i = llmem__first_unlike(b, p->stride, FREED_BYTE);
    if (i == p->stride) return;
    llmem__add(&p->corruptions, 1);
    llmem__log(LLMEM_LOG_ERROR,
               "fixed pool '%s': the %zu-byte block at %p was written after it was freed (byte %zu is 0x%02x): "
               "a use after free",
               p->name, p->stride, b, i, c[i]);
}

/* ---- growth ------------------------------------------------------------ */

static llmem_status publish_index(llmem_fixed *p, fixed_chunk *c)
{
    chunk_index *old = p->index;
    size_t n = old ? old->n : 0;
    chunk_index *ix = malloc(sizeof *ix + (n + 1) * sizeof ix->c[0]);
    if (!ix) return llmem__fail(LLMEM_ENOMEM, "fixed pool '%s': out of memory for metadata", p->name);
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        if (j == i && old->c[i]->base > c->base) ix->c[j++] = c;
        ix->c[j++] = old->c[i];
    }
    if (j == n) ix->c[j++] = c;
    ix->n = j;
    ix->retired_next = NULL;
    __atomic_store_n(&p->index, ix, __ATOMIC_RELEASE);
    if (old) {
        old->retired_next = p->retired;
        p->retired = old;
    }
    return LLMEM_OK;
}

/* Map a new chunk of at least min_bytes (0: one block) and make it the
 * carve region. Lock held (thread-safe). */
static llmem_status grow(llmem_fixed *p, size_t min_bytes)
{
    size_t left = p->max_blocks ? p->max_blocks - p->total_blocks : SIZE_MAX;
    if (left == 0)
        return llmem__fail(LLMEM_ECAPACITY, "fixed pool '%s': all %zu blocks (max_blocks) are in use", p->name,
                           p->max_blocks);
    size_t bytes = p->next_chunk_bytes;
    if (left < bytes / p->stride) bytes = left * p->stride; /* left * stride fits: checked at create */
    if (min_bytes < p->stride) min_bytes = p->stride;
    void *base;
    llmem_status st;
    /* Out of memory for a big chunk may still leave room for a smaller one:
     * halve down to one block (initial_blocks at create) before giving up,
     * and grow from there next. */
    while ((st = llmem_resource_map_tagged(p->res, bytes, p->align, 0, p->name, &base)) == LLMEM_ENOMEM &&
           bytes > min_bytes)
        bytes = bytes / 2 > min_bytes ? bytes / 2 : min_bytes;
    if (st) return st; /* nothing fit: the next growth starts from the usual size again */
    if (bytes < p->next_chunk_bytes) p->next_chunk_bytes = bytes; /* doubled below, as usual */
    size_t mapped;
    llmem_resource_round(p->res, bytes, &mapped); /* cannot fail: map succeeded with it */
    size_t blocks = mapped / p->stride;
    if (blocks > left) blocks = left;

    fixed_chunk *c = calloc(1, sizeof *c);
    bool ok = c != NULL;
    if (ok && p->checked) ok = (c->state = calloc((blocks + 63) / 64, sizeof(uint64_t))) != NULL;
    if (ok && !p->inband && p->stack_cap < p->total_blocks + blocks) {
        void **s = realloc(p->stack, (p->total_blocks + blocks) * sizeof *s);
        if (s) {
            p->stack = s;
            p->stack_cap = p->total_blocks + blocks;
        } else {
            ok = false;
        }
    }
    if (ok && p->nchunks == p->chunks_cap) {
        size_t ncap = p->chunks_cap ? p->chunks_cap * 2 : 8;
        fixed_chunk **n = realloc(p->chunks, ncap * sizeof *n);
        if (n) {
            p->chunks = n;
            p->chunks_cap = ncap;
        } else {
            ok = false;
        }
    }
    if (ok) {
        *c = (fixed_chunk){(uintptr_t)base, mapped, blocks, p->nchunks, c->state};
        ok = publish_index(p, c) == LLMEM_OK;
    }
    if (!ok) {
        if (c) free(c->state);
        free(c);
        llmem_resource_unmap(p->res, base, mapped, mapped);
        return llmem__fail(LLMEM_ENOMEM, "fixed pool '%s': out of memory for metadata", p->name);
    }
    p->chunks[p->nchunks++] = c;
    if (p->host) LLMEM_POISON(base, mapped);
    p->bump = c->base;
    p->bump_end = c->base + blocks * p->stride;
    p->total_blocks += blocks;
    p->reserved += mapped;
    if (p->next_chunk_bytes <= p->max_chunk_bytes / 2) p->next_chunk_bytes *= 2;
    else p->next_chunk_bytes = p->max_chunk_bytes;
    return LLMEM_OK;
}

/* ---- the shared free list (lock held in thread-safe pools) ----------------- */

static inline void *list_pop(llmem_fixed *p)
{
    void *b;
    if (p->inband) {
        b = p->free_head;
        if (!b) return NULL;
        /* Open the link word just to read it: the block may go to a thread
         * cache rather than to a caller, and must stay poisoned there. */
        LLMEM_UNPOISON(b, sizeof(void *));
        p->free_head = *(void **)b;
        LLMEM_POISON(b, sizeof(void *));
    } else {
        if (!p->top) return NULL;
        b = p->stack[--p->top];
    }
    p->global_free--;
    return b;
}

static inline void list_push(llmem_fixed *p, void *b)
{
    if (p->inband) {
        LLMEM_UNPOISON(b, sizeof(void *));
        *(void **)b = p->free_head;
        p->free_head = b;
    } else {
        p->stack[p->top++] = b;
    }
    if (p->host) LLMEM_POISON(b, p->stride);
    p->global_free++;
}

/* A free block from the list, the carve region, or a new chunk. */
static void *take(llmem_fixed *p, llmem_status *st)
{
    void *b = list_pop(p);
    if (b) return b;
    if (p->bump_end - p->bump < p->stride) {
        *st = grow(p, 0);
        if (*st) return NULL;
    }
    b = (void *)p->bump;
    p->bump += p->stride;
    p->carved++;
    if (p->checked && p->host) freed_fill(p, b);
    return b;
}

/* ---- thread caches ------------------------------------------------------------ */

/* The pool this thread used last and its magazine, so the fast path skips
 * the pthread_getspecific call. Pool ids are unique for the process's life,
 * so an entry for a destroyed pool whose address was reused never matches;
 * the thread-exit destructor clears the entry before freeing its magazine. */
static _Thread_local struct {
    const llmem_fixed *pool;
    uint64_t id;
    magazine *mag;
} tl_last;

static uint64_t next_pool_id = 1;

static void mag_unlink(llmem_fixed *p, magazine *m)
{
    if (m->prev) m->prev->next = m->next;
    else p->mags = m->next;
    if (m->next) m->next->prev = m->prev;
}

/* Thread exit: give the magazine's blocks back and free it. */
static void mag_destructor(void *v)
{
    magazine *m = v;
    llmem_fixed *p = m->pool;
    if (tl_last.mag == m) tl_last.pool = NULL;
    pthread_mutex_lock(&p->lock);
    for (uint32_t i = 0; i < m->count; i++) list_push(p, m->items[i]);
    p->allocs += m->allocs;
    p->frees += m->frees;
    mag_unlink(p, m);
    pthread_mutex_unlock(&p->lock);
    free(m);
}

static magazine *mag_get(llmem_fixed *p)
{
    if (LLMEM_LIKELY(tl_last.pool == p && tl_last.id == p->id)) return tl_last.mag;
    magazine *m = pthread_getspecific(p->key);
    if (LLMEM_LIKELY(m)) {
        tl_last.pool = p;
        tl_last.id = p->id;
        tl_last.mag = m;
        return m;
    }
    m = calloc(1, sizeof *m + p->mag_cap * sizeof m->items[0]);
    if (!m) return NULL;
    m->pool = p;
    m->cap = p->mag_cap;
    if (pthread_setspecific(p->key, m) != 0) {
        free(m);
        return NULL;
    }
    pthread_mutex_lock(&p->lock);
    m->next = p->mags;
    if (p->mags) p->mags->prev = m;
    p->mags = m;
    pthread_mutex_unlock(&p->lock);
    tl_last.pool = p;
    tl_last.id = p->id;
    tl_last.mag = m;
    return m;
}

/* Blocks in magazines. Lock held. */
static uint64_t cached_blocks(const llmem_fixed *p)
{
    uint64_t n = 0;
    for (const magazine *m = p->mags; m; m = m->next) n += __atomic_load_n(&m->count, __ATOMIC_RELAXED);
    return n;
}

/* Blocks handed out now: carved, less those in the free list, in magazines
 * and `extra` more about to enter one. Magazine counts change under their
 * owners while this reads them one by one, so a block that leaves one
 * thread's cache through the caller's hands into another's can be counted
 * in both: saturate at zero rather than wrap to 2^64 (which a peak would
 * keep for good). Lock held. */
static uint64_t ts_in_use(const llmem_fixed *p, uint64_t extra)
{
    uint64_t free_now = (uint64_t)p->global_free + cached_blocks(p) + extra;
    return p->carved > free_now ? p->carved - free_now : 0;
}

/* Refill an empty magazine with up to half its capacity; return one block. */
static void *refill(llmem_fixed *p, magazine *m, llmem_status *st)
{
    uint32_t want = m->cap / 2 ? m->cap / 2 : 1, got = 0;
    pthread_mutex_lock(&p->lock);
    while (got < want) {
        void *b = take(p, st);
        if (!b) break;
        m->items[got++] = b;
    }
    if (got) {
        *st = LLMEM_OK;
        uint64_t in_use = ts_in_use(p, got - 1);
        if (in_use > p->peak) p->peak = in_use;
    }
    pthread_mutex_unlock(&p->lock);
    if (!got) return NULL;
    __atomic_store_n(&m->count, got - 1, __ATOMIC_RELAXED);
    return m->items[got - 1];
}

static void flush(llmem_fixed *p, magazine *m, uint32_t keep)
{
    pthread_mutex_lock(&p->lock);
    uint32_t c = m->count;
    while (c > keep) list_push(p, m->items[--c]);
    __atomic_store_n(&m->count, c, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&p->lock);
}

/* ---- public API ----------------------------------------------------------------- */

static void *alloc_failed(llmem_fixed *p, llmem_status st, llmem_status *status)
{
    if (p) llmem__add(&p->failures, 1);
    if (status) *status = st;
    return NULL;
}

void *llmem_fixed_alloc(llmem_fixed *p, llmem_status *status)
{
    if (LLMEM_UNLIKELY(!p)) return alloc_failed(p, llmem__fail(LLMEM_EINVAL, "fixed pool: null pool"), status);
    llmem_status st = LLMEM_OK;
    void *b;
    if (p->thread_safe) {
        magazine *m = mag_get(p);
        if (LLMEM_UNLIKELY(!m))
            return alloc_failed(p, llmem__fail(LLMEM_ENOMEM, "fixed pool '%s': out of memory for a thread cache", p->name),
                                status);
        uint32_t c = m->count;
        if (LLMEM_LIKELY(c)) {
            b = m->items[c - 1];
            __atomic_store_n(&m->count, c - 1, __ATOMIC_RELAXED);
        } else {
            b = refill(p, m, &st);
            if (!b) return alloc_failed(p, st, status);
        }
        __atomic_store_n(&m->allocs, m->allocs + 1, __ATOMIC_RELAXED);
    } else {
        b = take(p, &st);
        if (LLMEM_UNLIKELY(!b)) return alloc_failed(p, st, status);
        p->allocs++;
        if (++p->in_use > p->peak) p->peak = p->in_use;
    }
    if (p->checked) {
        fixed_chunk *c = find_chunk(p, (uintptr_t)b);
        state_set(p, c, ((uintptr_t)b - c->base) / p->stride);
    }
    if (p->host) LLMEM_UNPOISON(b, p->stride); /* the stride is the usable size (llmem_fixed_block_size) */
    if (p->checked && p->host) freed_verify(p, b);
    if (status) *status = LLMEM_OK;
    return b;
}

llmem_status llmem_fixed_free(llmem_fixed *p, void *ptr)
{
    if (LLMEM_UNLIKELY(!p)) return llmem__fail(LLMEM_EINVAL, "fixed pool: null pool");
    if (!ptr) return LLMEM_OK;
    if (p->checked) {
        llmem_status st = check_free(p, ptr);
        if (st) return st;
        if (p->host) freed_fill(p, ptr);
    }
    if (p->thread_safe) {
        magazine *m = mag_get(p);
        if (LLMEM_UNLIKELY(!m)) { /* no cache for this thread: straight to the shared list */
            pthread_mutex_lock(&p->lock);
            list_push(p, ptr);
            p->frees++;
            pthread_mutex_unlock(&p->lock);
            return LLMEM_OK;
        }
        if (LLMEM_UNLIKELY(m->count == m->cap)) flush(p, m, m->cap / 2);
        uint32_t c = m->count;
        m->items[c] = ptr;
        if (p->host) LLMEM_POISON(ptr, p->stride);
        __atomic_store_n(&m->count, c + 1, __ATOMIC_RELAXED);
        __atomic_store_n(&m->frees, m->frees + 1, __ATOMIC_RELAXED);
    } else {
        list_push(p, ptr);
        p->frees++;
        p->in_use--;
    }
    return LLMEM_OK;
}

bool llmem_fixed_owns(const llmem_fixed *p, const void *ptr)
{
    if (!p || !ptr) return false;
    fixed_chunk *c = find_chunk(p, (uintptr_t)ptr);
    return c && ((uintptr_t)ptr - c->base) % p->stride == 0;
}

size_t llmem_fixed_block_size(const llmem_fixed *p) { return p ? p->stride : 0; }

void llmem_fixed_flush_thread_cache(llmem_fixed *p)
{
    if (!p || !p->thread_safe) return;
    magazine *m = pthread_getspecific(p->key);
    if (m) flush(p, m, 0);
}

/* ---- create / destroy --------------------------------------------------------- */

llmem_fixed_options llmem_fixed_options_default(void)
{
    llmem_fixed_options o;
    memset(&o, 0, sizeof o);
    o.name = "fixed";
    return o;
}

static llmem_status configure(llmem_fixed *p, const llmem_fixed_options *o)
{
    llmem__copy_name(p->name, sizeof p->name, o->name, "fixed");
    p->res = o->resource ? o->resource : llmem_resource_default();
    p->host = llmem_resource_kind(p->res) == LLMEM_MEM_HOST;
    if (o->block_size == 0) return llmem__fail(LLMEM_EINVAL, "fixed pool '%s': block_size must be > 0", p->name);
    size_t align = o->align ? o->align : !p->host ? LLMEM_DEVICE_ALIGN : o->block_size >= 64 ? LLMEM_HOST_ALIGN : 16;
    if (!llmem__is_pow2(align) || align > LLMEM_MAX_ALIGN)
        return llmem__fail(LLMEM_EALIGN, "fixed pool '%s': alignment %zu is not a power of two up to 1 GiB", p->name,
                           align);
    if (align < sizeof(void *)) align = sizeof(void *); /* room and alignment for the in-band link */
    size_t stride;
    if (!llmem__align_up(o->block_size, align, &stride) || stride > (size_t)PTRDIFF_MAX / 8)
        return llmem__fail(LLMEM_EOVERFLOW, "fixed pool '%s': block_size %zu overflows when aligned to %zu", p->name,
                           o->block_size, align);
    p->block_size = o->block_size;
    p->align = align;
    p->stride = stride;
    size_t chunk = o->chunk_bytes ? o->chunk_bytes : (stride * 8 > 65536 ? stride * 8 : 65536);
    if (chunk < stride) chunk = stride;
    size_t rounded;
    if (!llmem__align_up(chunk, llmem_resource_granularity(p->res), &rounded) || rounded > (size_t)PTRDIFF_MAX)
        return llmem__fail(LLMEM_EOVERFLOW, "fixed pool '%s': chunk_bytes %zu overflows", p->name, chunk);
    p->max_chunk_bytes = o->max_chunk_bytes ? o->max_chunk_bytes : ((size_t)16 << 20);
    if (p->max_chunk_bytes < chunk) p->max_chunk_bytes = chunk;
    p->next_chunk_bytes = chunk;
    size_t tmp;
    if (o->max_blocks && !llmem__mul_ok(o->max_blocks, stride, &tmp))
        return llmem__fail(LLMEM_EOVERFLOW, "fixed pool '%s': max_blocks %zu of %zu bytes overflows", p->name,
                           o->max_blocks, stride);
    p->max_blocks = o->max_blocks;
    if (o->initial_blocks) {
        if (o->max_blocks && o->initial_blocks > o->max_blocks)
            return llmem__fail(LLMEM_ECAPACITY, "fixed pool '%s': initial_blocks %zu > max_blocks %zu", p->name,
                               o->initial_blocks, o->max_blocks);
        if (!llmem__mul_ok(o->initial_blocks, stride, &tmp) || tmp > (size_t)PTRDIFF_MAX)
            return llmem__fail(LLMEM_EOVERFLOW, "fixed pool '%s': initial_blocks %zu overflows", p->name,
                               o->initial_blocks);
        if (tmp > p->next_chunk_bytes) p->next_chunk_bytes = tmp;
        if (p->max_chunk_bytes < tmp) p->max_chunk_bytes = tmp;
    }
    p->thread_safe = o->thread_safe;
    p->checked = o->checked;
    p->inband = p->host && !p->checked;
    if (o->cache_blocks) {
        if (o->cache_blocks > 65536)
            return llmem__fail(LLMEM_EINVAL, "fixed pool '%s': cache_blocks %zu is above 65536", p->name,
                               o->cache_blocks);
        p->mag_cap = (uint32_t)o->cache_blocks;
    } else {
        size_t by_bytes = ((size_t)256 << 10) / stride;
        p->mag_cap = stride <= 4096 ? 64 : (uint32_t)(by_bytes < 4 ? 4 : by_bytes > 64 ? 64 : by_bytes);
    }
    if (p->mag_cap < 2) p->mag_cap = 2;
    return LLMEM_OK;
}

llmem_status llmem_fixed_create(const llmem_fixed_options *opts, llmem_fixed **out)
{
    if (!out) return llmem__fail(LLMEM_EINVAL, "fixed pool: null out");
    *out = NULL;
    if (!opts) return llmem__fail(LLMEM_EINVAL, "fixed pool: null options (block_size is required)");
    llmem_fixed *p = calloc(1, sizeof *p);
    if (!p) return llmem__fail(LLMEM_ENOMEM, "fixed pool: out of memory");
    llmem_status st = configure(p, opts);
    if (st) {
        free(p);
        return st;
    }
    pthread_mutex_init(&p->lock, NULL);
    p->id = __atomic_fetch_add(&next_pool_id, 1, __ATOMIC_RELAXED);
    if (p->thread_safe && pthread_key_create(&p->key, mag_destructor) != 0) {
        pthread_mutex_destroy(&p->lock);
        free(p);
        return llmem__fail(LLMEM_ENOMEM, "fixed pool '%s': no thread-local key left (too many thread-safe pools)",
                           opts->name ? opts->name : "fixed");
    }
    if (opts->initial_blocks) {
        /* All of them, or fail: not a smaller chunk (fits: checked in configure). */
        st = grow(p, opts->initial_blocks * p->stride);
        if (st) {
            llmem_fixed_destroy(p);
            return st;
        }
    }
    *out = p;
    return LLMEM_OK;
}

void llmem_fixed_destroy(llmem_fixed *p)
{
    if (!p) return;
    if (p->thread_safe) {
        pthread_key_delete(p->key);
        for (magazine *m = p->mags, *n; m; m = n) {
            n = m->next;
            free(m);
        }
    }
    for (size_t i = 0; i < p->nchunks; i++) {
        fixed_chunk *c = p->chunks[i];
        llmem_resource_unmap(p->res, (void *)c->base, c->mapped, c->mapped);
        free(c->state);
        free(c);
    }
    free(p->chunks);
    free(p->stack);
    free(p->index);
    for (chunk_index *r = p->retired, *n; r; r = n) {
        n = r->retired_next;
        free(r);
    }
    pthread_mutex_destroy(&p->lock);
    free(p);
}

llmem_status llmem_fixed_get_stats(const llmem_fixed *cp, llmem_fixed_stats *out)
{
    if (!cp || !out) return llmem__fail(LLMEM_EINVAL, "fixed pool stats: null argument");
    llmem_fixed *p = (llmem_fixed *)(uintptr_t)cp; /* the lock is internal state */
    llmem_fixed_stats s = {.struct_size = sizeof s};
    pthread_mutex_lock(&p->lock);
    s.block_size = p->block_size;
    s.stride = p->stride;
    s.blocks_capacity = p->total_blocks;
    s.chunks = p->nchunks;
    s.reserved_bytes = p->reserved;
    s.allocs_total = p->allocs;
    s.frees_total = p->frees;
    if (p->thread_safe) {
        for (const magazine *m = p->mags; m; m = m->next) {
            s.allocs_total += __atomic_load_n(&m->allocs, __ATOMIC_RELAXED);
            s.frees_total += __atomic_load_n(&m->frees, __ATOMIC_RELAXED);
        }
        s.blocks_in_use = ts_in_use(p, 0);
        s.blocks_in_use_peak = p->peak > s.blocks_in_use ? p->peak : s.blocks_in_use;
    } else {
        s.blocks_in_use = p->in_use;
        s.blocks_in_use_peak = p->peak;
    }
    pthread_mutex_unlock(&p->lock);
    s.failures_total = llmem__ld(&p->failures);
    s.double_frees_total = llmem__ld(&p->double_frees);
    s.foreign_frees_total = llmem__ld(&p->foreign_frees);
    s.corruptions_total = llmem__ld(&p->corruptions);
    return llmem__stats_out(out, &s, sizeof s);
}

LLMEM__STATS_SCHEMA_OF(llmem_fixed_stats_schema, "fixed", llmem_fixed_stats, LLMEM_FIXED_STATS_FIELDS)
