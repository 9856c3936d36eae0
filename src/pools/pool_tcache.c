/*
 * pool_tcache.c - the dynamic pool's thread caches and its fast paths:
 * allocation (llmem_pool_alloc, _aligned, _calloc) and the free of a small
 * block (llmem_pool_free; everything else goes to pool_free.c).
 *
 * Algorithm. Each thread that uses a pool gets a cache per pool: for every
 * class a small stack of free block pointers (capacity: 16 units' worth of
 * blocks, 64 KiB on the host, 4 to 256 blocks). Allocation pops and free
 * pushes with no lock and no atomic read-modify-write. An empty stack is
 * refilled with half its capacity, first from the class's transfer cache
 * (under that cache's own lock, no pool lock), then from the slabs (under
 * the pool lock); a full one flushes half into the transfer cache, or what
 * does not fit to the slabs. A block freed by another thread joins
 * that thread's cache: blocks of a class are interchangeable. The cache is
 * found through a one-entry thread-local memo in front of a pthread key; the
 * key's destructor flushes it when its thread exits.
 *
 * Idle caches. A thread that stops using a pool keeps its cache's blocks
 * until it exits; the purger and shrink take them back once the cache has
 * made no allocation or free for the decay delay (its counters stood
 * still between two looks; mimalloc reclaims an exited thread's abandoned
 * segments, here the thread may still be alive). The
 * owner's stacks take no lock, so the reclaimer and the owner meet in an
 * asymmetric handshake: every allocation and free stores busy = 1, then
 * reads reclaim, and stores busy = 0 (release) when done, with only
 * compiler barriers on its side; the reclaimer stores reclaim = 1, runs
 * membarrier(PRIVATE_EXPEDITED), which puts a full barrier on every
 * running thread of the process, then reads busy. Either the owner sees
 * reclaim (and takes the slow path, which waits for the pool lock the
 * reclaimer holds while it empties the cache, then clears reclaim) or the
 * reclaimer sees busy (and leaves the cache alone: it is not idle).
 * Without membarrier (kernels before 4.14) idle caches stay their
 * threads' until exit, as before.
 *
 * Large blocks. A host pool with a run cache (the background purger)
 * also gives each thread cache a small stack of freed large blocks (up to
 * RUN_CACHE_UNITS units; LCACHE_SLOTS of them and LCACHE_BYTES at most,
 * oldest first): a free of a live large block pushes it, marked tcached,
 * and an allocation of its unit count, or of a count it exceeds by at
 * most half (llmem__pool_fit_units; the smallest such entry, the newest
 * of that size), pops it whole, both with no lock
 * (tcmalloc serves up to 256 KiB from its per-thread lists; an engine
 * frees and asks again for the same tensor sizes layer after layer). The
 * block stays D_LARGE, in used_bytes and live_allocations like any cached
 * block (the stats subtract the caches); a free of a marked block is
 * refused as a double free by the locked path. A push that finds the stack
 * full evicts its oldest entries to the run cache under the pool lock. The
 * reclaimer, shrink, llmem_pool_flush_thread_cache and thread exit return
 * them to the free runs (free since the cache was last active), under the
 * same handshake as the small classes. Its requested field is not updated
 * by a pop (only checked pools and handles read it; neither is cached).
 *
 * Lock order: the pool lock, then a transfer cache's lock or tlock (both
 * leaves: nothing is taken while one is held).
 *
 * Invariants: from the slabs' point of view cached blocks are handed out
 * (the stats subtract them); a cache's counters are written only by its
 * thread, with relaxed atomic stores, so stats read under the lock never
 * race; every cache of a pool is on its list (under tlock) from its
 * first use to its thread's exit or the pool's destroy. Checked pools have
 * no thread caches: their per-block state must change at every free, under
 * the lock.
 */
#include <linux/membarrier.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "addrmap.h"
#include "pool_internal.h"

/* This thread's memo of its last pool and cache (pool_internal.h). */
_Thread_local __attribute__((tls_model("initial-exec"), visibility("hidden"))) llmem__tcache_memo llmem__tl_last;

/* The owner saw reclaim: wait for the reclaimer to finish (it holds the
 * pool lock while it empties the cache), then carry on. */
static __attribute__((noinline)) void owner_ack(llmem_pool *p, tcache *t)
{
    pthread_mutex_lock(&p->lock);
    __atomic_store_n(&t->reclaim, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&p->lock);
}

/* membarrier(PRIVATE_EXPEDITED), registered once; false if the kernel has
 * none. */
static int membarrier_state; /* 0 unknown, 1 usable, -1 not */

static bool membarrier_ready(void)
{
    int s = __atomic_load_n(&membarrier_state, __ATOMIC_ACQUIRE);
    if (s) return s > 0;
    long q = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    bool ok = q > 0 && (q & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
              syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
    __atomic_store_n(&membarrier_state, ok ? 1 : -1, __ATOMIC_RELEASE);
    return ok;
}

/* A refill or flush: the cache is in use; tell the purger once that it
 * holds blocks (so a sleeping purger wakes to take them when it idles). */
static void note_active(llmem_pool *p, tcache *t)
{
    __atomic_store_n(&t->last_active, llmem__pool_clock(), __ATOMIC_RELAXED);
    if (!__atomic_load_n(&t->kicked, __ATOMIC_RELAXED) && p->purge_background) {
        __atomic_store_n(&t->kicked, true, __ATOMIC_RELAXED);
        llmem__pool_purger_kick(p);
    }
}

/* Bytes and blocks sitting in thread and transfer caches. The tcache list
 * lock held. */
void llmem__pool_cached_totals(const llmem_pool *p, uint64_t *bytes, uint64_t *blocks, uint64_t *per_class)
{
    *bytes = *blocks = 0;
    for (unsigned c = 0; c < p->cls.count; c++) {
        uint32_t n = ld_u32(&p->xfer[c].count);
        *blocks += n;
        *bytes += (uint64_t)n * p->cls.size[c];
        if (per_class) per_class[c] += n;
    }
    for (const tcache *t = p->tcaches; t; t = t->next) {
        *blocks += ld_u32(&t->large.count);
        *bytes += __atomic_load_n(&t->large.bytes, __ATOMIC_RELAXED);
        for (unsigned c = 0; c < p->cls.count; c++) {
            uint32_t n = ld_u32(&t->bin[c].count);
            *blocks += n;
            *bytes += (uint64_t)n * p->cls.size[c];
            if (per_class) per_class[c] += n;
        }
    }
}

/* Record a new peak of used bytes (those in thread caches not counted). */
void llmem__pool_note_peak(llmem_pool *p)
{
    uint64_t used = p->st.used_bytes;
    if (used <= p->st.used_peak_bytes) return;
    if (p->tcache_on) {
        uint64_t bytes, blocks;
        pthread_mutex_lock(&p->tlock);
        llmem__pool_cached_totals(p, &bytes, &blocks, NULL);
        pthread_mutex_unlock(&p->tlock);
        used = used > bytes ? used - bytes : 0;
    }
    if (used > p->st.used_peak_bytes) ST_SET(p->st.used_peak_bytes, used);
}

/* A cached block (pool with marks) that lost its mark: written after its
 * free, or a second copy of a block freed twice whose first copy was
 * handed out or went back to its slab. Counted and logged; the caller
 * drops it (the slabs keep counting it as out: leaked, never handed out
 * twice). Pool lock held. */
static void cached_drop(llmem_pool *p, uintptr_t b, unsigned c, const char *when)
{
    ST_ADD(p->st.corruptions_total, 1);
    llmem__log(LLMEM_LOG_ERROR,
               "pool '%s': the free %zu-byte block at %p lost its mark %s: it was written after it was freed, "
               "or freed twice; dropped, not handed out",
               p->name, (size_t)p->cls.size[c], (void *)b, when);
}

/* A cached block (the slot's word, TSLOT_MARKED included) of class c back
 * to its slab. A marked one's state byte goes from STATE_OUT to 0 here; one
 * whose mark or state is not a cached block's is dropped (cached_drop).
 * Pool lock held. */
static void cached_put(llmem_pool *p, uintptr_t w, unsigned c)
{
    uintptr_t b = w & ~(uintptr_t)TSLOT_MARKED;
    superblock *sb = llmem__addrmap_get(b);
    slab *s = sb && sb->pool == p ? (slab *)sb->owner[unit_of(sb, b, p->ushift)] : NULL;
    uint32_t idx = s ? (uint32_t)((b - s->b.start) / p->cls.size[c]) : 0;
    if (w & TSLOT_MARKED) {
        uint8_t *state = s && s->b.kind == D_SLAB && s->b.cls == c && idx < s->carved ? slab_state(s, idx) : NULL;
        if (!state || state_get(state) != STATE_OUT || mark_load(b) != block_mark(p, b)) {
            cached_drop(p, b, c, "in a thread cache");
            return;
        }
        state_set(state, 0);
    }
    llmem__pool_small_put(p, s, b, idx);
}

/* Return cached blocks of class c to their slabs down to `keep`. Pool lock
 * held. */
static void tcache_flush_class_locked(llmem_pool *p, tcache *t, unsigned c, uint32_t keep)
{
    uint32_t n = t->bin[c].count;
    while (n > keep) cached_put(p, (uintptr_t)t->bin[c].items[--n].block, c);
    st_u32(&t->bin[c].count, n);
}

/* A full stack of class c: half goes into the transfer cache while it has
 * room (another thread's refill takes the batch as it is, no slab touched,
 * no pool lock), the rest back to the slabs under the pool lock. No lock
 * held. */
static void tcache_flush_half(llmem_pool *p, tcache *t, unsigned c)
{
    note_active(p, t);
    uint32_t n = t->bin[c].count, keep = t->bin[c].cap / 2;
    xfer_cache *x = &p->xfer[c];
    if (x->cap) {
        pthread_mutex_lock(&x->lock);
        uint32_t room = x->cap - x->count, move = n - keep < room ? n - keep : room;
        memcpy(&x->slots[x->count], &t->bin[c].items[n - move], move * sizeof(tslot));
        st_u32(&x->count, x->count + move);
        __atomic_store_n(&x->last_used, __atomic_load_n(&t->last_active, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
        pthread_mutex_unlock(&x->lock);
        n -= move;
        st_u32(&t->bin[c].count, n);
    }
    if (n > keep) {
        pthread_mutex_lock(&p->lock);
        tcache_flush_class_locked(p, t, c, keep);
        pthread_mutex_unlock(&p->lock);
    }
}

/* Return a class's transfer cache to its slabs. Pool lock held. */
void llmem__pool_xfer_drain(llmem_pool *p, unsigned c)
{
    xfer_cache *x = &p->xfer[c];
    pthread_mutex_lock(&x->lock);
    while (x->count) {
        uintptr_t b = (uintptr_t)x->slots[x->count - 1].block;
        st_u32(&x->count, x->count - 1);
        cached_put(p, b, c);
    }
    pthread_mutex_unlock(&x->lock);
}

/* ---- large blocks (see the top of this file) ---------------------------- */

static inline void st_uptr(uintptr_t *p, uintptr_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
static inline void st_pb(pblock **p, pblock *v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
static inline void tcached_set(pblock *b, uint8_t v) { __atomic_store_n(&b->tcached, v, __ATOMIC_RELAXED); }
static inline uint8_t tcached_get(const pblock *b) { return __atomic_load_n(&b->tcached, __ATOMIC_RELAXED); }

/* The entry to serve u units: of the smallest size from u to
 * llmem__pool_fit_units(u), the newest of that size; -1 if none. Owner. */
static inline int lcache_find(const lcache *l, uint32_t u)
{
    uint32_t most = (uint32_t)llmem__pool_fit_units(u), best = most + 1;
    int at = -1;
    for (int i = (int)l->count; i-- > 0;) {
        uint32_t v = l->units[i];
        if (v >= u && v < best) {
            best = v;
            at = i;
            if (v == u) break;
        }
    }
    return at;
}

/* Drop entry i (the younger ones move down one). Owner, or the pool lock
 * held with the owner outside any call. */
static inline void lcache_remove(lcache *l, uint32_t i, unsigned ushift)
{
    st_u64(&l->bytes, l->bytes - ((uint64_t)l->units[i] << ushift)); /* not b->size: a miss on the descriptor */
    for (uint32_t j = i + 1; j < l->count; j++) {
        st_u32(&l->units[j - 1], l->units[j]);
        st_uptr(&l->slot[j - 1].ptr, l->slot[j].ptr);
        st_pb(&l->slot[j - 1].b, l->slot[j].b);
    }
    st_u32(&l->count, l->count - 1);
}

/* Entry b back to the pool: free since `stamp` into the free runs, or (0)
 * into the run cache. Its free was counted when it was cached. Pool lock
 * held. */
static void lcache_release(llmem_pool *p, pblock *b, uint64_t stamp)
{
    tcached_set(b, 0);
    ST_SUB(p->st.used_bytes, b->size);
    ST_SUB(p->st.live_allocations, 1);
    if (stamp) llmem__pool_put_pages_since(p, b, stamp);
    else llmem__pool_put_large(p, b);
}

/* Every large entry of t back to the free runs, free since `stamp`. Pool
 * lock held. */
static void lcache_flush(llmem_pool *p, tcache *t, uint64_t stamp)
{
    lcache *l = &t->large;
    while (l->count) {
        pblock *b = l->slot[l->count - 1].b;
        lcache_remove(l, l->count - 1, p->ushift);
        lcache_release(p, b, stamp);
    }
}

/* A push of `bytes` finds the stack full: its oldest entries go to the run
 * cache, at least four if it was out of slots, until the push fits. The
 * owner, inside a call; takes the pool lock. */
static __attribute__((noinline)) void lcache_evict(llmem_pool *p, tcache *t, size_t bytes)
{
    lcache *l = &t->large;
    pthread_mutex_lock(&p->lock);
    while (l->count && (l->count > LCACHE_SLOTS - 4 || l->bytes + bytes > LCACHE_BYTES)) {
        pblock *b = l->slot[0].b;
        lcache_remove(l, 0, p->ushift);
        lcache_release(p, b, 0);
    }
    pthread_mutex_unlock(&p->lock);
}

/* The live large block starting at a that a free may cache, or NULL: the
 * superblock and owner tables read without the lock, which cannot change
 * for a live block while its owner frees it (anything else takes the
 * locked path, which explains). */
static inline pblock *large_block_of(const llmem_pool *p, uintptr_t a)
{
    superblock *sb = llmem__addrmap_get(a);
    if (!sb || sb->pool != p || (a & (p->unit - 1))) return NULL;
    pblock *b = sb->owner[unit_of(sb, a, p->ushift)];
    if (!b || b->kind != D_LARGE || b->user != a || b->handle || b->fenced ||
        b->size > ((size_t)RUN_CACHE_UNITS << p->ushift) || tcached_get(b))
        return NULL;
    return b;
}

/* Push the live large block b (at a) onto t's stack: poisoned, marked,
 * counted as a free. No lock held. */
static inline __attribute__((always_inline)) void lcache_push(llmem_pool *p, tcache *t, pblock *b, uintptr_t a)
{
    lcache *l = &t->large;
    owner_enter(t);
    if (owner_reclaimed(t)) owner_ack(p, t);
    if (l->count == LCACHE_SLOTS || l->bytes + b->size > LCACHE_BYTES) lcache_evict(p, t, b->size);
    if (!__atomic_load_n(&t->kicked, __ATOMIC_RELAXED)) note_active(p, t); /* the purger hears of it once */
    LLMEM_POISON((void *)b->start, b->size);
    tcached_set(b, 1);
    uint32_t n = l->count;
    st_u32(&l->units[n], (uint32_t)(b->size >> p->ushift));
    st_uptr(&l->slot[n].ptr, a);
    st_pb(&l->slot[n].b, b);
    st_u64(&l->bytes, l->bytes + b->size);
    st_u32(&l->count, n + 1);
    count_one(&l->frees);
    owner_leave(t);
}

/* A cached large block for size bytes (past the small classes, at the
 * pool's alignment), taken off t's stack, or NULL. No lock held. */
static inline __attribute__((always_inline)) void *lcache_pop(llmem_pool *p, tcache *t, size_t size)
{
    lcache *l = &t->large;
    uint32_t u = (uint32_t)((size + p->unit - 1) >> p->ushift);
    owner_enter(t);
    if (owner_reclaimed(t)) owner_ack(p, t);
    int i = lcache_find(l, u);
    if (i < 0) {
        owner_leave(t);
        return NULL;
    }
    pblock *b = l->slot[i].b;
    uintptr_t a = l->slot[i].ptr;
    lcache_remove(l, (uint32_t)i, p->ushift);
    tcached_set(b, 0);
    count_one(&l->allocs);
    owner_leave(t);
    /* The entry may be larger than asked (llmem__pool_fit_units): the
     * rest of it stays poisoned from the push, as a rounded block's tail. */
    LLMEM_UNPOISON((void *)a, size);
    return (void *)a;
}

void llmem__pool_tcaches_freeze(llmem_pool *p)
{
    if (!p->lcache_on || !membarrier_ready()) return;
    enum { BATCH = 64 };
    tcache *cand[BATCH];
    size_t n = 0;
    pthread_mutex_lock(&p->tlock);
    for (tcache *t = p->tcaches; t && n < BATCH; t = t->next)
        if (!__atomic_load_n(&t->reclaim, __ATOMIC_RELAXED)) {
            __atomic_store_n(&t->reclaim, 1, __ATOMIC_RELAXED);
            cand[n++] = t;
        }
    pthread_mutex_unlock(&p->tlock);
    if (!n) return;
    bool fenced = syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0;
    for (size_t i = 0; i < n; i++)
        if (!fenced || __atomic_load_n(&cand[i]->busy, __ATOMIC_ACQUIRE))
            __atomic_store_n(&cand[i]->reclaim, 0, __ATOMIC_RELAXED); /* in a call: not frozen */
}

bool llmem__pool_lcache_check(llmem_pool *p, size_t flagged)
{
    size_t n = 0;
    bool ok = true, exact = true;
    pthread_mutex_lock(&p->tlock);
    for (const tcache *t = p->tcaches; t && ok; t = t->next) {
        const lcache *l = &t->large;
        if (!__atomic_load_n(&t->reclaim, __ATOMIC_RELAXED)) { /* not frozen: its entries may be moving */
            exact = false;
            continue;
        }
        uint32_t cnt = ld_u32(&l->count);
        uint64_t bytes = 0;
        if (cnt > LCACHE_SLOTS) ok = false;
        for (uint32_t i = 0; i < cnt && ok; i++) {
            uintptr_t a = __atomic_load_n(&l->slot[i].ptr, __ATOMIC_RELAXED);
            const pblock *e = __atomic_load_n(&l->slot[i].b, __ATOMIC_RELAXED);
            size_t u = ld_u32(&l->units[i]);
            superblock *sb = llmem__addrmap_get(a);
            if (!sb || sb->pool != p || (a & (p->unit - 1))) {
                ok = false;
                break;
            }
            const pblock *b = sb->owner[unit_of(sb, a, p->ushift)];
            if (b != e || b->kind != D_LARGE || b->user != a || b->size != u << p->ushift || !tcached_get(b) ||
                b->handle)
                ok = false;
            else bytes += b->size;
        }
        if (ok && bytes != __atomic_load_n(&l->bytes, __ATOMIC_RELAXED)) ok = false;
        n += cnt;
    }
    pthread_mutex_unlock(&p->tlock);
    return ok && (exact ? n == flagged : n <= flagged);
}

/* Every block of t back, the large ones free since `stamp`. Pool lock held. */
static void tcache_flush_all_since(llmem_pool *p, tcache *t, uint64_t stamp)
{
    for (unsigned c = 0; c < p->cls.count; c++)
        if (t->bin[c].count) tcache_flush_class_locked(p, t, c, 0);
    if (t->large.count) lcache_flush(p, t, stamp);
}

void llmem__pool_tcache_flush_all(llmem_pool *p, tcache *t) { tcache_flush_all_since(p, t, llmem__pool_clock()); }

/* Transfer caches and kept empty slabs of classes idle for the decay go
 * back too: without that, the blocks taken from an idle cache would sit in
 * a transfer cache, or their last empty slab would keep its superblock
 * mapped. Returns the next deadline. Pool lock held. */
static uint64_t release_idle_classes(llmem_pool *p, uint64_t now)
{
    uint64_t next = UINT64_MAX;
    for (unsigned c = 0; c < p->cls.count; c++) {
        xfer_cache *x = &p->xfer[c];
        if (ld_u32(&x->count)) {
            uint64_t since = __atomic_load_n(&x->last_used, __ATOMIC_RELAXED);
            if (now >= since && now - since >= p->decay_ns) {
                __atomic_add_fetch(&p->reclaim_seq, 1, __ATOMIC_SEQ_CST); /* see get_stats */
                llmem__pool_xfer_drain(p, c);
                __atomic_add_fetch(&p->reclaim_seq, 1, __ATOMIC_SEQ_CST);
            }
            else if (since + p->decay_ns < next) next = since + p->decay_ns;
        }
        central *k = &p->central[c];
        if (!k->empty_slabs) continue;
        uint64_t since = k->last_take;
        if (now >= since && now - since >= p->decay_ns) {
            for (slab *s = k->partial, *n; s && k->empty_slabs; s = n) {
                n = s->lnext;
                if (s->used == 0) llmem__pool_slab_release(p, s);
            }
        } else if (since + p->decay_ns < next) {
            next = since + p->decay_ns;
        }
    }
    return next;
}

uint64_t llmem__pool_reclaim_idle(llmem_pool *p, uint64_t now)
{
    if (!p->tcache_on) return UINT64_MAX;
    uint64_t later = release_idle_classes(p, now);
    enum { BATCH = 64 };
    tcache *cand[BATCH];
    size_t n = 0;
    uint64_t next = UINT64_MAX;
    pthread_mutex_lock(&p->tlock);
    for (tcache *t = p->tcaches; t; t = t->next) {
        uint32_t held = ld_u32(&t->large.count);
        for (unsigned c = 0; c < p->cls.count && !held; c++) held = ld_u32(&t->bin[c].count);
        if (!held) {
            __atomic_store_n(&t->kicked, false, __ATOMIC_RELAXED); /* the next refill tells again */
            continue;
        }
        /* Fast-path calls alone (a cache whose classes balance) are use
         * too: a cache is idle only if its counters stood still. */
        uint64_t ops = __atomic_load_n(&t->large.allocs, __ATOMIC_RELAXED) +
                       __atomic_load_n(&t->large.frees, __ATOMIC_RELAXED);
        for (unsigned c = 0; c < p->cls.count; c++)
            ops += __atomic_load_n(&t->bin[c].allocs, __ATOMIC_RELAXED) +
                   __atomic_load_n(&t->bin[c].frees, __ATOMIC_RELAXED);
        if (ops != t->seen_ops) {
            t->seen_ops = ops;
            __atomic_store_n(&t->last_active, now, __ATOMIC_RELAXED);
        }
        uint64_t since = __atomic_load_n(&t->last_active, __ATOMIC_RELAXED);
        if (now - since < p->decay_ns || now < since) {
            if (since + p->decay_ns < next) next = since + p->decay_ns;
        } else if (n < BATCH) {
            __atomic_store_n(&t->reclaim, 1, __ATOMIC_RELAXED);
            cand[n++] = t;
        } else {
            next = now; /* more next pass */
        }
    }
    pthread_mutex_unlock(&p->tlock);
    if (later < next) next = later;
    /* The caches cannot go away meanwhile: their threads' exits wait for
     * the pool lock, which is held. */
    if (!n) return next;
    if (!membarrier_ready() || syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0) {
        for (size_t i = 0; i < n; i++) __atomic_store_n(&cand[i]->reclaim, 0, __ATOMIC_RELAXED);
        return next;
    }
    for (size_t i = 0; i < n; i++) {
        tcache *t = cand[i];
        if (__atomic_load_n(&t->busy, __ATOMIC_ACQUIRE)) { /* in use after all: not idle */
            __atomic_store_n(&t->reclaim, 0, __ATOMIC_RELAXED);
            continue;
        }
        /* reclaim stays set: the owner's next call clears it under the
         * pool lock, after this. */
        __atomic_add_fetch(&p->reclaim_seq, 1, __ATOMIC_SEQ_CST);
        /* Large blocks free since the cache's last activity: idle pages,
         * decommitted by this pass. */
        tcache_flush_all_since(p, t, __atomic_load_n(&t->last_active, __ATOMIC_RELAXED));
        __atomic_add_fetch(&p->reclaim_seq, 1, __ATOMIC_SEQ_CST);
        ST_ADD(p->st.reclaimed_caches_total, 1);
    }
    /* What came back waits its own delay in the slabs (the classes were
     * idle: their empty slabs can go now). */
    uint64_t again = release_idle_classes(p, now);
    return again < next ? again : next;
}

/* Thread exit: return the cache's blocks and fold its counters in. */
void llmem__pool_tcache_destructor(void *v)
{
    tcache *t = v;
    llmem_pool *p = t->pool;
    if (llmem__tl_last.tc == t) llmem__tl_last.id = 0;
    pthread_mutex_lock(&p->lock);
    llmem__pool_tcache_flush_all(p, t);
    /* Counters fold in and the cache leaves the list at once, under both
     * locks, so a stats read counts them exactly once. */
    pthread_mutex_lock(&p->tlock);
    ST_ADD(p->st.allocs_total, t->large.allocs);
    ST_ADD(p->st.frees_total, t->large.frees);
    for (unsigned c = 0; c < p->cls.count; c++) {
        ST_ADD(p->st.allocs_total, t->bin[c].allocs);
        ST_ADD(p->st.frees_total, t->bin[c].frees);
        ST_ADD(p->central[c].allocs, t->bin[c].allocs);
        ST_ADD(p->central[c].frees, t->bin[c].frees);
    }
    LIST_UNLINK(p->tcaches, t, prev, next);
    pthread_mutex_unlock(&p->tlock);
    pthread_mutex_unlock(&p->lock);
    free(t);
}

void llmem__pool_tcaches_destroy(llmem_pool *p)
{
    for (tcache *t = p->tcaches, *n; t; t = n) {
        n = t->next;
        free(t);
    }
    p->tcaches = NULL;
    if (llmem__tl_last.id == p->id) llmem__tl_last.id = 0;
}

/* This thread's cache for p, created on first use; NULL when the pool has
 * none or memory for one is short (then the locked path serves). */
tcache *llmem__pool_tcache_get(llmem_pool *p)
{
    if (LLMEM_LIKELY(llmem__tl_last.id == p->id)) return llmem__tl_last.tc;
    if (!p->tcache_on) return NULL;
    tcache *t = pthread_getspecific(p->tkey);
    if (!t) {
        t = calloc(1, sizeof *t + p->tcache_slots * sizeof(tslot));
        if (!t) return NULL;
        t->pool = p;
        t->last_active = llmem__pool_clock();
        size_t at = 0;
        for (unsigned c = 0; c < p->cls.count; c++) {
            t->bin[c].cap = p->tcache_cap[c];
            t->bin[c].items = &t->storage[at];
            at += t->bin[c].cap;
        }
        if (pthread_setspecific(p->tkey, t) != 0) {
            free(t);
            return NULL;
        }
        pthread_mutex_lock(&p->tlock);
        /* A second thread: mark from now on ("block states"). */
        if (p->marks && p->tcaches) __atomic_store_n(&p->marks_on, true, __ATOMIC_RELAXED);
        t->next = p->tcaches;
        if (p->tcaches) p->tcaches->prev = t;
        p->tcaches = t;
        pthread_mutex_unlock(&p->tlock);
    }
    /* A profiled pool is never memoised: its calls take the slow paths,
     * which record them, without a test of the profile on the fast ones. */
    if (!p->profile) {
        llmem__tl_last.id = p->id;
        llmem__tl_last.tc = t;
    }
    return t;
}

/* Refill the empty stack of class c with half its capacity; one block
 * goes to the caller (the slot returned, just above the new top). */
static tslot *tcache_refill(llmem_pool *p, tcache *t, unsigned c, llmem_status *st)
{
    uint32_t want = t->bin[c].cap / 2 ? t->bin[c].cap / 2 : 1, got = 0;
    note_active(p, t);
    xfer_cache *x = &p->xfer[c];
    if (ld_u32(&x->count)) {
        pthread_mutex_lock(&x->lock);
        got = x->count < want ? x->count : want;
        memcpy(t->bin[c].items, &x->slots[x->count - got], got * sizeof(tslot));
        st_u32(&x->count, x->count - got);
        __atomic_store_n(&x->last_used, __atomic_load_n(&t->last_active, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
        pthread_mutex_unlock(&x->lock);
    }
    if (got == want) {
        /* Served without the pool lock; sample the peak if it is free. */
        if (pthread_mutex_trylock(&p->lock) == 0) {
            llmem__pool_note_peak(p);
            pthread_mutex_unlock(&p->lock);
        }
        st_u32(&t->bin[c].count, got - 1);
        *st = LLMEM_OK;
        return &t->bin[c].items[got - 1];
    }
    pthread_mutex_lock(&p->lock);
    if (p->nfenced) llmem__pool_poll_fenced_locked(p);
    ST_SET(p->central[c].last_take, __atomic_load_n(&t->last_active, __ATOMIC_RELAXED));
    while (got < want) {
        uint8_t *state;
        uintptr_t b = llmem__pool_small_take(p, c, st, &state);
        if (!b && !got && *st == LLMEM_ENOMEM && llmem__pool_wait_one_fenced(p, true)) continue;
        if (!b) break;
        if (marking(p)) { /* out of the slab, free in the cache */
            state_set(state, STATE_OUT);
            mark_store(b, block_mark(p, b));
            t->bin[c].items[got++] = (tslot){(void *)(b | TSLOT_MARKED), state};
        } else {
            t->bin[c].items[got++] = (tslot){(void *)b, state};
        }
    }
    if (got) *st = LLMEM_OK;
    else {
        ST_ADD(p->st.failures_total, 1);
        ST_ADD(p->central[c].failures, 1);
    }
    llmem__pool_note_peak(p);
    pthread_mutex_unlock(&p->lock);
    if (!got) return NULL;
    st_u32(&t->bin[c].count, got - 1);
    return &t->bin[c].items[got - 1];
}

/* The class for n bytes at align (0 = the pool's), or cls.count if none. */
static unsigned class_for(const llmem_pool *p, size_t n, size_t align)
{
    if (n > p->cls.max_small) return p->cls.count;
    unsigned c = llmem__class_of(&p->cls, n);
    while (c < p->cls.count && p->cls.size[c] % align) c++;
    return c;
}

void *llmem__pool_alloc_locked(llmem_pool *p, size_t size, size_t align, llmem_status *st)
{
    size_t g = 0, inner = size;
    if (p->checked && p->host) {
        g = llmem__pool_guard_front(align);
        if (!llmem__add_ok(size, g + GUARD_TAIL, &inner)) {
            *st = llmem__fail(LLMEM_EOVERFLOW, "pool '%s': %zu bytes overflow with guards", p->name, size);
            return NULL;
        }
    }
    unsigned cls = align <= p->unit ? class_for(p, inner, align) : p->cls.count;
    uintptr_t block, user;
    if (cls < p->cls.count) {
        uint8_t *state;
        block = llmem__pool_small_take(p, cls, st, &state);
        if (!block) return NULL;
        state_set(state, 1);
        ST_ADD(p->central[cls].allocs, 1);
        user = block + g;
        if (g) llmem__pool_guards_write(block, p->cls.size[cls], user, size);
    } else {
        size_t pages;
        if (!llmem__align_up(inner, p->unit, &pages) || pages > (size_t)PTRDIFF_MAX) {
            *st = llmem__fail(LLMEM_EOVERFLOW, "pool '%s': %zu bytes overflow when rounded to pages", p->name, size);
            return NULL;
        }
        /* With guards the user pointer must keep the alignment: the block
         * starts aligned, and g is a multiple of it. */
        pblock *b = llmem__pool_take_large(p, heap_for(p, D_LARGE), pages, align, st);
        if (!b) return NULL;
        b->kind = D_LARGE;
        b->requested = size;
        block = b->start;
        user = block + g;
        b->user = user;
        superblock *sb = b->sb;
        sb->owner[unit_of(sb, block, p->ushift)] = b;
        if (g && unit_of(sb, user, p->ushift) != unit_of(sb, block, p->ushift))
            sb->owner[unit_of(sb, user, p->ushift)] = b;
        ST_ADD(p->st.used_bytes, b->size);
        ST_ADD(p->st.live_allocations, 1);
        if (g) llmem__pool_guards_write(block, b->size, user, size);
    }
    if (p->host) LLMEM_UNPOISON((void *)user, size);
    ST_ADD(p->st.allocs_total, 1);
    llmem__pool_note_peak(p);
    *st = LLMEM_OK;
    return (void *)user;
}

/* The locked path of an allocation of size bytes at align (at least the
 * pool's), valid: the slabs or page runs under the pool lock, waiting for
 * pending fences and, before an ENOMEM, coalescing lt's cached large blocks
 * (lt: this thread's cache when it may hold some, or NULL). Out of line, so
 * that the fast paths which fall back to it stay small; not `cold`, since
 * the shim's and checked pools' large blocks all come this way. */
static __attribute__((noinline)) void *alloc_locked_path(llmem_pool *p, size_t size, size_t align, tcache *lt,
                                                         llmem_status *status)
{
    llmem_status st;
    /* The class the locked path will try, for the per-class failure count. */
    size_t inner = size;
    if (p->checked && p->host) inner = size + llmem__pool_guard_front(align) + GUARD_TAIL;
    unsigned cls = align <= p->unit ? class_for(p, inner, align) : p->cls.count;
    pthread_mutex_lock(&p->lock);
    if (p->nfenced) llmem__pool_poll_fenced_locked(p);
    void *r = llmem__pool_alloc_locked(p, size, align, &st);
    /* Memory still in flight is not memory lost: wait for it before failing. */
    while (!r && st == LLMEM_ENOMEM && llmem__pool_wait_one_fenced(p, true)) r = llmem__pool_alloc_locked(p, size, align, &st);
    /* This thread's cached large blocks are free memory: coalesced, they
     * may hold it. */
    if (!r && st == LLMEM_ENOMEM && lt && lt->large.count) {
        __atomic_add_fetch(&p->reclaim_seq, 1, __ATOMIC_SEQ_CST);
        lcache_flush(p, lt, llmem__pool_clock());
        __atomic_add_fetch(&p->reclaim_seq, 1, __ATOMIC_SEQ_CST);
        r = llmem__pool_alloc_locked(p, size, align, &st);
    }
    if (!r) {
        ST_ADD(p->st.failures_total, 1);
        if (cls < p->cls.count) ST_ADD(p->central[cls].failures, 1);
    }
    pthread_mutex_unlock(&p->lock);
    if (status) *status = st;
    return r;
}

/* Everything but a thread-cache hit: the cache's first use and refills,
 * bad input, large and aligned requests, checked pools. */
static __attribute__((noinline)) void *alloc_slow(llmem_pool *p, size_t size, size_t align, llmem_status *status)
{
    if (p && size - 1 < p->cls.max_small && align <= p->align && !(align & (align - 1))) {
        tcache *t = llmem__pool_tcache_get(p);
        if (t) {
            unsigned c = llmem__class_of(&p->cls, size);
            tslot got;
            owner_enter(t);
            if (owner_reclaimed(t)) owner_ack(p, t);
            uint32_t n = t->bin[c].count;
            if (n) {
                got = t->bin[c].items[n - 1];
                st_u32(&t->bin[c].count, n - 1);
            } else {
                llmem_status st;
                tslot *sl = tcache_refill(p, t, c, &st);
                if (!sl) {
                    owner_leave(t);
                    return llmem__pool_alloc_failed(st, status);
                }
                got = *sl;
            }
            uintptr_t b = (uintptr_t)got.block & ~(uintptr_t)TSLOT_MARKED;
            if (b == (uintptr_t)got.block) state_set(got.state, 1);
            else mark_store(b, 0); /* as alloc_fast: a store, no load */
            got.block = (void *)b;
            count_one(&t->bin[c].allocs);
            owner_leave(t);
            if (p->host) LLMEM_UNPOISON(got.block, size);
            if (status) *status = LLMEM_OK;
            return got.block;
        }
    }
    if (!p) return llmem__pool_alloc_failed(llmem__fail(LLMEM_EINVAL, "pool: null pool"), status);
    tcache *lt = NULL; /* this thread's cache, when it may hold large blocks */
    if (p->lcache_on && size > p->cls.max_small && size <= ((size_t)RUN_CACHE_UNITS << p->ushift) &&
        align <= p->align && !(align & (align - 1)) && (lt = llmem__pool_tcache_get(p))) {
        void *r = lcache_pop(p, lt, size);
        if (r) {
            if (status) *status = LLMEM_OK;
            return r;
        }
    }
    llmem_status st;
    if (size == 0) st = llmem__fail(LLMEM_EINVAL, "pool '%s': allocation of 0 bytes", p->name);
    else if (size > (size_t)PTRDIFF_MAX)
        st = llmem__fail(LLMEM_EOVERFLOW, "pool '%s': allocation of %zu bytes overflows", p->name, size);
    else if (align && (!llmem__is_pow2(align) || align > p->max_sb))
        st = llmem__fail(LLMEM_EALIGN, "pool '%s': alignment %zu is not a power of two up to %zu", p->name, align,
                         p->max_sb);
    else st = LLMEM_OK;
    if (st) {
        pthread_mutex_lock(&p->lock);
        ST_ADD(p->st.failures_total, 1);
        pthread_mutex_unlock(&p->lock);
        return llmem__pool_alloc_failed(st, status);
    }
    return alloc_locked_path(p, size, align < p->align ? p->align : align, lt, status);
}

/* A large block of size bytes (past the small classes, up to the stacks'
 * largest) on a thread whose cache t has a stack of them: popped from it
 * with no lock, else the locked path (no checks to make: the size is
 * valid, the alignment the pool's), without alloc_slow's tests and cache
 * lookup. Out of line with the pop inlined: inlined into llmem_pool_alloc
 * it measured the same on tensor_mix but gave the small path two more
 * saved registers. */
static __attribute__((noinline)) void *alloc_large(llmem_pool *p, tcache *t, size_t size, llmem_status *status)
{
    void *r = lcache_pop(p, t, size);
    if (LLMEM_LIKELY(r != NULL)) {
        if (status) *status = LLMEM_OK;
        return r;
    }
    return alloc_locked_path(p, size, p->align, t, status);
}

/* alloc_slow, and the profile record, for the public calls: a miss of
 * alloc_fast tail-calls it, so the fast path keeps no frame. */
static __attribute__((noinline)) void *alloc_slow_recorded(llmem_pool *p, size_t size, size_t align,
                                                           llmem_status *status)
{
    void *r = alloc_slow(p, size, align, status);
    if (LLMEM_UNLIKELY(p && p->profile) && r) llmem_profile_record_alloc(p->profile, size, r);
    return r;
}

/* The fast path: a small block popped from this thread's cache, found
 * through the thread-local memo; its state byte is set through the slot,
 * with no lookup. Anything else (a profiled pool included) is a tail call
 * of alloc_slow_recorded: the hit is a leaf, with no stack frame and no
 * callee-saved register to spill (measured: four pushes and their pops
 * were a tenth of the function's samples in larson_2t). */
static inline __attribute__((always_inline)) void *alloc_fast(llmem_pool *p, size_t size, llmem_status *status)
{
    if (LLMEM_LIKELY(p)) {
        void *r = llmem__tcache_pop(p, size);
        if (LLMEM_LIKELY(r)) {
            if (status) *status = LLMEM_OK;
            return r;
        }
        /* Not a profiled pool (alloc_slow_recorded records those): past
         * the small classes, a large block for the thread's stack. */
        if (size - 1 >= p->cls.max_small && size - 1 < ((size_t)RUN_CACHE_UNITS << p->ushift) && p->lcache_on &&
            llmem__tl_last.id == p->id)
            return alloc_large(p, llmem__tl_last.tc, size, status);
    }
    return alloc_slow_recorded(p, size, 0, status);
}

void *llmem_pool_alloc_aligned(llmem_pool *p, size_t size, size_t align, llmem_status *status)
{
    void *r = LLMEM_LIKELY(p && align <= p->align && !(align & (align - 1))) ? alloc_fast(p, size, status)
                                                                               : alloc_slow_recorded(p, size, align, status);
    POOL_WALK(p);
    return r;
}

void *llmem_pool_alloc(llmem_pool *p, size_t size, llmem_status *status)
{
#if LLMEM_DEBUG >= 3
    void *r = alloc_fast(p, size, status);
    POOL_WALK(p);
    return r;
#else
    return alloc_fast(p, size, status);
#endif
}

void *llmem_pool_calloc(llmem_pool *p, size_t count, size_t size, llmem_status *status)
{
    size_t n;
    if (!p) return llmem__pool_alloc_failed(llmem__fail(LLMEM_EINVAL, "pool: null pool"), status);
    if (!p->host)
        return llmem__pool_alloc_failed(llmem__fail(LLMEM_ENOTSUP, "pool '%s': calloc on device memory", p->name), status);
    if (!llmem__mul_ok(count, size, &n))
        return llmem__pool_alloc_failed(llmem__fail(LLMEM_EOVERFLOW, "pool '%s': calloc of %zu x %zu overflows", p->name,
                                           count, size),
                            status);
    void *r = llmem_pool_alloc(p, n, status);
    if (r) memset(r, 0, n);
    return r;
}

/* Everything but a push onto a thread cache with room: the cache's first
 * use and flushes, large blocks, checked pools, bad pointers, and blocks
 * that are free already (the locked path refuses them). */
static __attribute__((noinline)) llmem_status free_slow(llmem_pool *p, void *ptr)
{
    if (!p) return llmem__fail(LLMEM_EINVAL, "pool: null pool");
    if (!ptr) return LLMEM_OK;
    if (p->profile) llmem_profile_record_free(p->profile, ptr);
    if (p->tcache_on) {
        uint8_t *state = NULL;
        int c = small_block_of(p, (uintptr_t)ptr, &state);
        uint8_t sv = c >= 0 ? state_get(state) : 0;
        tcache *t = c >= 0 && small_live(p, (uintptr_t)ptr, sv) ? llmem__pool_tcache_get(p) : NULL;
        if (t) {
            owner_enter(t);
            if (owner_reclaimed(t)) owner_ack(p, t);
            uint32_t n = t->bin[c].count;
            if (n == t->bin[c].cap) {
                tcache_flush_half(p, t, (unsigned)c);
                n = t->bin[c].count;
            }
            bin_push(p, &t->bin[c], (size_t)c, n, ptr, state, sv);
            owner_leave(t);
            return LLMEM_OK;
        }
        pblock *b = c < 0 && p->lcache_on ? large_block_of(p, (uintptr_t)ptr) : NULL;
        if (b && (t = llmem__pool_tcache_get(p))) {
            lcache_push(p, t, b, (uintptr_t)ptr);
            return LLMEM_OK;
        }
    }
    pthread_mutex_lock(&p->lock);
    llmem_status st = llmem__pool_free_locked(p, (uintptr_t)ptr, "free");
    pthread_mutex_unlock(&p->lock);
    return st;
}

/* A free that is not of a small block, on a thread with a cache: a live
 * large block goes onto its stack; anything else is free_slow's. Out of
 * line (as alloc_large), the push inlined into it. */
static __attribute__((noinline)) llmem_status free_large(llmem_pool *p, tcache *t, void *ptr)
{
    pblock *b = large_block_of(p, (uintptr_t)ptr);
    if (!b) return free_slow(p, ptr);
    lcache_push(p, t, b, (uintptr_t)ptr);
    return LLMEM_OK;
}

/* The fast path: a small block pushed onto this thread's cache, unless its
 * state byte says it is free already (a double free: free_slow refuses
 * it). The slab cannot change under us: it holds this live block. Every
 * other case is a tail call (free_large, free_slow), so the push is a leaf
 * with no stack frame. */
static inline __attribute__((always_inline)) llmem_status pool_free(llmem_pool *p, void *ptr)
{
    /* A null ptr is in no superblock: free_large, then free_slow, say OK. */
    if (LLMEM_LIKELY(p && llmem__tl_last.id == p->id)) {
        tcache *t = llmem__tl_last.tc;
        int r = llmem__tcache_push(p, t, ptr);
        if (LLMEM_LIKELY(r > 0)) return LLMEM_OK;
        if (r < 0 && p->lcache_on) return free_large(p, t, ptr);
    }
    return free_slow(p, ptr);
}

llmem_status llmem_pool_free(llmem_pool *p, void *ptr)
{
#if LLMEM_DEBUG >= 3
    llmem_status st = pool_free(p, ptr);
    POOL_WALK(p);
    return st;
#else
    return pool_free(p, ptr);
#endif
}
