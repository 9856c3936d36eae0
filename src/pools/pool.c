/*
 * pool.c - the dynamic pool's front door: create, destroy, reserve, shrink,
 * the invariant check and the stats.
 *
 * The pool is split along its layers, each file with its algorithm and
 * invariants at its top, every cross-file internal declared once in
 * pool_internal.h:
 *   pool_pages.c   superblocks and the best-fit page allocator, commit/decommit
 *   pool_slab.c    size-class slabs; guards and fills of checked pools
 *   pool_tcache.c  thread caches and the allocation and free fast paths
 *   pool_free.c    the locked free path, realloc, usable_size, owns
 *   pool_purge.c   the background purger
 *   pool_fence.c   stream-ordered (fenced) frees
 *   pool_compact.c handles and compaction
 *
 * Invariants (llmem_pool_check verifies them all): those of each file, and
 * the figures in the stats equal the sums over blocks.
 *
 * Locking: one mutex per pool guards everything but the thread caches'
 * own stacks (see pool_tcache.c).
 */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "addrmap.h"
#include "../resource/resource_internal.h"
#include "pool_internal.h"

static uint64_t next_pool_id = 1;

/* ---- control ---------------------------------------------------------------- */

/* A committed free run of `need` bytes in heap h, not decaying yet. Lock
 * held. */
static llmem_status reserve_heap(llmem_pool *p, unsigned h, size_t need)
{
    llmem_status st = LLMEM_OK;
    pblock *b = node_block(llmem__avl_last(&p->free_tree[h]));
    /* Twice at most, as in llmem__pool_take_pages: the first grow of a pool
     * with reserve_bytes maps the reserved range, which may be smaller than
     * `need` (or in the other heap); only the second maps a superblock that
     * holds it. */
    for (int tries = 0; !st && (!b || b->size < need) && tries < 2; tries++) {
        st = llmem__pool_grow(p, h, need, p->unit);
        b = node_block(llmem__avl_last(&p->free_tree[h]));
    }
    if (!st && (!b || b->size < need))
        st = llmem__fail(LLMEM_ENOMEM, "pool '%s': no free run of %zu bytes after growing (internal error)", p->name,
                         need);
    if (!st) {
        st = llmem__pool_commit_range(p, b->sb, b->start, need);
        /* Reserved for use: not decaying yet. */
        if (b->sb->empty) b->sb->empty_since = llmem__pool_clock();
        b->free_since = llmem__pool_clock();
        b->purged = false;
    }
    return st;
}

/* The bytes go to the large heap (what is reserved ahead is tensors and
 * KV); a split pool's small heap gets a run of up to its first superblock,
 * so the small objects of the same step need no resource call either. */
llmem_status llmem_pool_reserve(llmem_pool *p, size_t bytes)
{
    if (!p) return llmem__fail(LLMEM_EINVAL, "pool: null pool");
    if (bytes == 0) return LLMEM_OK;
    size_t need;
    if (!llmem__align_up(bytes, p->unit, &need) || need > (size_t)PTRDIFF_MAX)
        return llmem__fail(LLMEM_EOVERFLOW, "pool '%s': reserve of %zu bytes overflows", p->name, bytes);
    pthread_mutex_lock(&p->lock);
    if (p->rc.bytes) llmem__pool_cache_flush(p, llmem__pool_clock()); /* the reserved run whole, not in pieces */
    llmem_status st = reserve_heap(p, heap_for(p, D_LARGE), need);
    if (!st && p->split) st = reserve_heap(p, HEAP_SMALL, need < p->first_sb ? need : p->first_sb);
    pthread_mutex_unlock(&p->lock);
    return st;
}

static int by_size_desc(const void *a, const void *b)
{
    const superblock *x = *(superblock *const *)a, *y = *(superblock *const *)b;
    return x->size > y->size ? -1 : x->size < y->size;
}

size_t llmem_pool_shrink(llmem_pool *p, size_t target)
{
    if (!p) return 0;
    tcache *t = llmem__pool_tcache_get(p);
    pthread_mutex_lock(&p->lock);
    /* Cached blocks move to the slabs inside the reclaim sequence count, so
     * a stats read on another thread retries instead of counting them
     * twice or not at all (llmem__pool_reclaim_idle counts its own). */
    __atomic_add_fetch(&p->reclaim_seq, 1, __ATOMIC_SEQ_CST);
    if (t) llmem__pool_tcache_flush_all(p, t);
    __atomic_add_fetch(&p->reclaim_seq, 1, __ATOMIC_SEQ_CST);
    llmem__pool_reclaim_idle(p, llmem__pool_clock()); /* other threads' caches, if idle for the decay */
    __atomic_add_fetch(&p->reclaim_seq, 1, __ATOMIC_SEQ_CST);
    for (unsigned c = 0; c < p->cls.count; c++) llmem__pool_xfer_drain(p, c);
    __atomic_add_fetch(&p->reclaim_seq, 1, __ATOMIC_SEQ_CST);
    if (p->nfenced) llmem__pool_poll_fenced_locked(p); /* finished work gives its blocks back too */
    if (p->rc.bytes) llmem__pool_cache_flush(p, llmem__pool_clock()); /* cached runs may empty superblocks */
    size_t released = 0;
    /* Cached empty slabs first: returning them may empty whole superblocks. */
    for (unsigned c = 0; c < p->cls.count && p->st.committed_bytes > target; c++) {
        for (slab *s = p->central[c].partial, *n; s && p->central[c].empty_slabs; s = n) {
            n = s->lnext;
            if (s->used == 0) llmem__pool_slab_release(p, s);
        }
    }
    /* Empty superblocks, largest first; one the resource refuses to take
     * back is skipped. */
    size_t nempty = 0;
    for (superblock *sb = p->empties; sb; sb = sb->enext) nempty++;
    superblock **order = nempty ? malloc(nempty * sizeof *order) : NULL;
    if (order) {
        size_t k = 0;
        for (superblock *sb = p->empties; sb; sb = sb->enext) order[k++] = sb;
        qsort(order, nempty, sizeof *order, by_size_desc);
        for (size_t i = 0; i < nempty && p->st.committed_bytes > target; i++) {
            size_t held = order[i]->size - (order[i]->decommitted_units << p->ushift);
            if (llmem__pool_release_sb(p, order[i])) released += held;
        }
        free(order);
    }
    for (unsigned h = HEAPS; h-- > 0;)
        for (llmem__avl_node *n = llmem__avl_last(&p->free_tree[h]); n && p->st.committed_bytes > target;
             n = llmem__avl_prev(n))
            released += llmem__pool_decommit_block(p, node_block(n), p->st.committed_bytes - target);
    pthread_mutex_unlock(&p->lock);
    return released;
}

size_t llmem_pool_trim(llmem_pool *p) { return llmem_pool_shrink(p, 0); }

/* ---- invariants ------------------------------------------------------------- */

/* Whether any of the n units from u0 of sb is decommitted. */
static bool any_decommitted(const superblock *sb, size_t u0, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (bit_get(sb->decommitted, u0 + i)) return true;
    return false;
}

/* One slab's own structure for llmem_pool_check (under the pool's lock):
 * counts, the free list or free indices (and, checked, the freed fill),
 * and the state bytes. */
#define SLAB_BAD(...) return llmem__fail(LLMEM_ECORRUPT, __VA_ARGS__)
static llmem_status check_slab(const llmem_pool *p, slab *s)
{
    const pblock *b = &s->b;
    if (b->cls >= p->cls.count || b->size != p->cls.slab_bytes[b->cls] ||
        s->nblocks != p->cls.slab_blocks[b->cls] || s->carved > s->nblocks ||
        s->used + s->nfree != s->carved)
        SLAB_BAD("pool '%s': slab %p has inconsistent counts", p->name, (void *)b->start);
    size_t csize = p->cls.size[b->cls];
    if (p->inband) {
        size_t len = 0;
        for (void *f = s->free_head; f; len++) {
            if ((uintptr_t)f < b->start || (uintptr_t)f >= b->start + (uintptr_t)s->carved * csize ||
                ((uintptr_t)f - b->start) % csize || len > s->nfree)
                SLAB_BAD("pool '%s': slab %p has a bad free list", p->name, (void *)b->start);
            LLMEM_UNPOISON(f, sizeof(void *));
            void *next = *(void **)f;
            LLMEM_POISON(f, sizeof(void *));
            f = next;
        }
        if (len != s->nfree) SLAB_BAD("pool '%s': slab %p free list length", p->name, (void *)b->start);
    } else {
        for (uint32_t i = 0; i < s->nfree; i++) {
            if (s->free_idx[i] >= s->carved)
                SLAB_BAD("pool '%s': slab %p has a bad free index", p->name, (void *)b->start);
            uintptr_t fb = b->start + (uintptr_t)s->free_idx[i] * csize;
            if (p->checked && p->host && llmem__pool_freed_damage(fb, csize) < csize)
                SLAB_BAD("pool '%s': the free %zu-byte block at %p was written after it was freed "
                         "(a use after free)",
                         p->name, csize, (void *)fb);
        }
    }
    /* Handed-out blocks have their byte set; cached ones (counted in used)
     * too if marked (STATE_OUT), not otherwise. */
    uint32_t set = 0;
    for (uint32_t i = 0; i < s->nblocks; i++) set += state_get(slab_state(s, i)) != 0;
    if (set > s->used || (!p->tcache_on && set != s->used))
        SLAB_BAD("pool '%s': slab %p state bytes disagree", p->name, (void *)b->start);
    for (uint32_t i = s->carved; i < s->nblocks; i++)
        if (state_get(slab_state(s, i)))
            SLAB_BAD("pool '%s': slab %p: an uncarved block is live", p->name, (void *)b->start);
    return LLMEM_OK;
}
#undef SLAB_BAD

#define BAD(...)                                                  \
    do {                                                          \
        st = llmem__fail(LLMEM_ECORRUPT, __VA_ARGS__);            \
        goto done;                                                \
    } while (0)

llmem_status llmem_pool_check(llmem_pool *p)
{
    if (!p) return llmem__fail(LLMEM_EINVAL, "pool: null pool");
    llmem_status st = LLMEM_OK;
    pthread_mutex_lock(&p->lock);
    uint64_t reserved = 0, committed = 0, used = 0, free_bytes = 0, slab_bytes = 0, live = 0, nsb = 0;
    size_t free_blocks = 0, cached = 0, tcached = 0;
    llmem__pool_tcaches_freeze(p); /* the large-block stacks hold still for the walk */
    uint64_t cached_bytes = 0, class_live[LLMEM_MAX_CLASSES] = {0}, class_slabs[LLMEM_MAX_CLASSES] = {0};
    for (superblock *sb = p->sbs; sb; sb = sb->next) {
        nsb++;
        reserved += sb->size;
        committed += sb->size - (sb->decommitted_units << p->ushift);
        if (llmem__addrmap_get(sb->base) != sb || llmem__addrmap_get(sb->base + sb->size - 1) != sb)
            BAD("pool '%s': superblock %p is not in the address map", p->name, (void *)sb->base);
        uintptr_t at = sb->base;
        size_t sb_used = 0;
        pblock *prev = NULL;
        for (pblock *b = sb->owner[0]; b; prev = b, b = b->next) {
            if (b->start != at || b->sb != sb || b->prev != prev || b->size == 0 || b->size % p->unit)
                BAD("pool '%s': block %p breaks the tiling of superblock %p", p->name, (void *)b->start,
                    (void *)sb->base);
            size_t u0 = unit_of(sb, b->start, p->ushift), n = b->size >> p->ushift;
            if (sb->owner[u0] != b)
                BAD("pool '%s': owner entry of block %p (kind %d) is wrong", p->name, (void *)b->start, b->kind);
            for (size_t i = 1; i < n; i++) {
                pblock *o = sb->owner[u0 + i];
                bool ok = b->kind == D_SLAB ? o == b
                                            : o == NULL || (b->kind == D_LARGE && o == b &&
                                                            unit_of(sb, b->user, p->ushift) == u0 + i);
                if (!ok) BAD("pool '%s': owner entry %zu of block %p is wrong", p->name, i, (void *)b->start);
            }
            /* The address map's slab entry of each of its units, as the free
             * fast path reads it: its slab's class, place, state array and
             * this pool's tag, or all zero outside slabs (a slab covers
             * whole map units, so no other block shares one with it). */
            if (b->kind == D_SLAB && (b->start % LLMEM_ADDRMAP_UNIT || b->size % LLMEM_ADDRMAP_UNIT))
                BAD("pool '%s': slab %p does not cover whole address-map units", p->name, (void *)b->start);
            for (uintptr_t u = b->start & ~(uintptr_t)(LLMEM_ADDRMAP_UNIT - 1); u < b->start + b->size;
                 u += LLMEM_ADDRMAP_UNIT) { /* each map unit the block touches, once */
                const slab_unit *su = unit_entry(u);
                bool ok = b->kind == D_SLAB ? su->state == ((slab *)b)->state && su->ctag == (pool_utag(p) | b->cls) &&
                                                  su->start == (uint32_t)b->start
                                            : !su->state && !su->start && !su->ctag;
                if (!ok) BAD("pool '%s': slab entry at %p of block %p is wrong", p->name, (void *)u, (void *)b->start);
            }
            if (b->kind == D_FREE) {
                if (prev && prev->kind == D_FREE)
                    BAD("pool '%s': free blocks %p and %p are adjacent", p->name, (void *)prev->start,
                        (void *)b->start);
                free_bytes += b->size;
                free_blocks++;
            } else if (b->kind == D_CACHED) {
                /* Free to the user, whole and committed, in its superblock's used bytes. */
                if (any_decommitted(sb, u0, n))
                    BAD("pool '%s': cached run %p has decommitted pages", p->name, (void *)b->start);
                free_bytes += b->size;
                sb_used += b->size;
                cached++;
                cached_bytes += b->size;
            } else if (b->kind == D_LARGE) {
                if (b->user < b->start || b->requested > b->start + b->size - b->user)
                    BAD("pool '%s': large block %p has a bad user range", p->name, (void *)b->start);
                if (any_decommitted(sb, u0, n))
                    BAD("pool '%s': live block %p has decommitted pages", p->name, (void *)b->start);
                used += b->size;
                sb_used += b->size;
                live++;
                tcached += __atomic_load_n(&b->tcached, __ATOMIC_RELAXED) != 0;
            } else if (b->kind == D_SLAB) {
                slab *s = (slab *)b;
                if ((st = check_slab(p, s)) != LLMEM_OK) goto done;
                size_t csize = p->cls.size[b->cls];
                used += (uint64_t)s->used * csize;
                live += s->used;
                class_live[b->cls] += s->used;
                class_slabs[b->cls]++;
                slab_bytes += b->size;
                sb_used += b->size;
            } else {
                BAD("pool '%s': block %p has kind %d", p->name, (void *)b->start, b->kind);
            }
            at += b->size;
        }
        if (at != sb->base + sb->size) BAD("pool '%s': blocks do not cover superblock %p", p->name, (void *)sb->base);
        if (sb_used != sb->used) BAD("pool '%s': superblock %p used bytes disagree", p->name, (void *)sb->base);
        if (!sb->reserved && (sb->used == 0) != sb->empty)
            BAD("pool '%s': superblock %p empty flag", p->name, (void *)sb->base);
        if (sb->reserved && (sb != p->rsb || sb->empty))
            BAD("pool '%s': reserved range %p is not the pool's", p->name, (void *)sb->base);
    }
    uint64_t live_handles = 0;
    for (uint32_t i = 0; i < p->hcount; i++) {
        pblock *b = p->handles[i].b;
        if (!b) continue;
        live_handles++;
        if (b->kind != D_LARGE || b->handle != i + 1 || b->user != b->start)
            BAD("pool '%s': handle %u does not match its block", p->name, i + 1);
    }
    if (live_handles != p->st.handles) BAD("pool '%s': handle count disagrees", p->name);
    if (llmem__avl_check(&p->free_tree[HEAP_SMALL], llmem__pool_free_cmp) +
            llmem__avl_check(&p->free_tree[HEAP_LARGE], llmem__pool_free_cmp) !=
        (long)free_blocks)
        BAD("pool '%s': the free tree does not hold exactly the free blocks", p->name);
    if (!llmem__pool_cache_check(p, cached, cached_bytes))
        BAD("pool '%s': the run cache's lists do not hold exactly its %zu cached runs", p->name, cached);
    if (!llmem__pool_lcache_check(p, tcached))
        BAD("pool '%s': the thread caches' large-block entries do not name exactly its %zu cached large blocks",
            p->name, tcached);
    if (reserved != p->st.reserved_bytes || committed != p->st.committed_bytes || used != p->st.used_bytes ||
        free_bytes != p->st.free_bytes || slab_bytes != p->st.slab_bytes || live != p->st.live_allocations ||
        nsb != p->st.superblocks)
        BAD("pool '%s': stats disagree with the blocks (used %llu vs %llu, live %llu vs %llu)", p->name,
            (unsigned long long)used, (unsigned long long)p->st.used_bytes, (unsigned long long)live,
            (unsigned long long)p->st.live_allocations);
    for (unsigned c = 0; c < p->cls.count; c++)
        if (class_live[c] != p->central[c].live || class_slabs[c] != p->central[c].slabs)
            BAD("pool '%s': class %u figures disagree", p->name, c);
done:
    pthread_mutex_unlock(&p->lock);
    return st;
}

#undef BAD

/* ---- stats -------------------------------------------------------------------- */

/* The reclaim sequence count (see reclaim_seq in pool_internal.h): wait
 * until no reclaim is moving cached blocks, and say whether one ran since
 * `seq` (then the reader reads again). The reads between are relaxed
 * atomics; the second look is a read-modify-write adding 0 with release
 * order, which keeps them before it (a fence would do, but TSan cannot
 * check fences; Boehm, "Can seqlocks get along with programming language
 * memory models?", 2012). */
static uint64_t reclaim_seq_begin(const llmem_pool *p)
{
    uint64_t seq;
    while ((seq = __atomic_load_n(&p->reclaim_seq, __ATOMIC_ACQUIRE)) & 1) sched_yield();
    return seq;
}

static bool reclaim_seq_moved(llmem_pool *p, uint64_t seq)
{
    return __atomic_fetch_add(&p->reclaim_seq, 0, __ATOMIC_ACQ_REL) != seq;
}

/* Sum every thread cache's counters (allocs, frees, and the blocks each
 * holds per class) under the cache list's lock, which no fast path takes. */
static void thread_sums(llmem_pool *p, uint64_t *allocs, uint64_t *frees, uint64_t *class_allocs,
                        uint64_t *class_frees)
{
    pthread_mutex_lock(&p->tlock);
    for (const tcache *t = p->tcaches; t; t = t->next) {
        *allocs += __atomic_load_n(&t->large.allocs, __ATOMIC_RELAXED);
        *frees += __atomic_load_n(&t->large.frees, __ATOMIC_RELAXED);
        for (unsigned c = 0; c < p->cls.count; c++) {
            uint64_t a = __atomic_load_n(&t->bin[c].allocs, __ATOMIC_RELAXED);
            uint64_t f = __atomic_load_n(&t->bin[c].frees, __ATOMIC_RELAXED);
            *allocs += a;
            *frees += f;
            if (class_allocs) class_allocs[c] += a;
            if (class_frees) class_frees[c] += f;
        }
    }
    pthread_mutex_unlock(&p->tlock);
}

/* Lock-free but for the largest committed free run, which walks the free
 * trees under the pool lock (a few nodes: the walk stops at the first run
 * no longer than the best so far). Counters are read as they are now, so
 * with threads running the figures are a snapshot, clamped so that they
 * never wrap. */
llmem_status llmem_pool_get_stats(const llmem_pool *cp, llmem_pool_stats *out)
{
    if (!cp || !out) return llmem__fail(LLMEM_EINVAL, "pool stats: null argument");
    llmem_pool *p = (llmem_pool *)(uintptr_t)cp;
    llmem_pool_stats s;
    const llmem_stats_schema *sch = llmem_pool_stats_schema();
    uint64_t bytes, blocks, seq;
    do { /* again if a reclaimer moved cached blocks meanwhile (rare, short) */
        seq = reclaim_seq_begin(p);
        memset(&s, 0, sizeof s);
        s.struct_size = sizeof s;
        for (size_t i = 0; i < sch->field_count; i++)
            if (sch->fields[i].type == LLMEM_VALUE_U64) {
                const uint64_t *from = (const uint64_t *)((const char *)&p->st + sch->fields[i].offset);
                *(uint64_t *)((char *)&s + sch->fields[i].offset) = __atomic_load_n(from, __ATOMIC_RELAXED);
            }
        /* Blocks in thread and transfer caches are free to the user. */
        pthread_mutex_lock(&p->tlock);
        llmem__pool_cached_totals(p, &bytes, &blocks, NULL);
        pthread_mutex_unlock(&p->tlock);
    } while (reclaim_seq_moved(p, seq));
    thread_sums(p, &s.allocs_total, &s.frees_total, NULL, NULL);
    s.used_bytes = s.used_bytes > bytes ? s.used_bytes - bytes : 0;
    s.live_allocations = s.live_allocations > blocks ? s.live_allocations - blocks : 0;
    /* The peak is sampled when caches refill: never report it below now. */
    if (s.used_peak_bytes < s.used_bytes) s.used_peak_bytes = s.used_bytes;
    /* Free memory is committed memory not in live blocks: free page runs'
     * committed pages, free and cached slab blocks. The largest free run
     * counts committed pages only: what one allocation can take without a
     * resource call (a reserved range's uncommitted tail is not free
     * memory, it is address space). */
    s.free_bytes = s.committed_bytes > s.used_bytes ? s.committed_bytes - s.used_bytes : 0;
    pthread_mutex_lock(&p->lock);
    s.largest_free_bytes = llmem__pool_largest_committed_free(p);
    pthread_mutex_unlock(&p->lock);
    if (s.largest_free_bytes > s.free_bytes) s.largest_free_bytes = s.free_bytes; /* a snapshot's skew */
    s.fragmentation = s.free_bytes ? 1.0 - (double)s.largest_free_bytes / (double)s.free_bytes : 0.0;
    return llmem__stats_out(out, &s, sizeof s);
}

llmem_status llmem_pool_get_class_stats(const llmem_pool *cp, llmem_pool_class_stats *out, size_t cap, size_t *count)
{
    if (!cp || (cap && !out)) return llmem__fail(LLMEM_EINVAL, "pool class stats: null argument");
    llmem_pool *p = (llmem_pool *)(uintptr_t)cp;
    uint64_t cached[LLMEM_MAX_CLASSES] = {0}, allocs[LLMEM_MAX_CLASSES] = {0}, frees[LLMEM_MAX_CLASSES] = {0};
    uint64_t bytes, blocks, a = 0, f = 0, seq;
    uint64_t live[LLMEM_MAX_CLASSES];
    do { /* as in llmem_pool_get_stats */
        seq = reclaim_seq_begin(p);
        memset(cached, 0, sizeof cached);
        for (unsigned c = 0; c < p->cls.count; c++) live[c] = ST_GET(p->central[c].live);
        pthread_mutex_lock(&p->tlock);
        llmem__pool_cached_totals(p, &bytes, &blocks, cached);
        pthread_mutex_unlock(&p->tlock);
    } while (reclaim_seq_moved(p, seq));
    thread_sums(p, &a, &f, allocs, frees);
    for (unsigned c = 0; c < p->cls.count && c < cap; c++) {
        const central *x = &p->central[c];
        llmem_pool_class_stats cs = {sizeof cs,
                                     p->cls.size[c],
                                     p->cls.slab_bytes[c],
                                     ST_GET(x->slabs),
                                     live[c] > cached[c] ? live[c] - cached[c] : 0,
                                     ST_GET(x->allocs) + allocs[c],
                                     ST_GET(x->frees) + frees[c],
                                     ST_GET(x->failures)};
        llmem__stats_out(&out[c], &cs, sizeof cs);
    }
    if (count) *count = p->cls.count;
    return LLMEM_OK;
}

llmem_status llmem_pool_export_stats(const llmem_pool *p, llmem_exporter *ex, const llmem_label *labels,
                                     size_t label_count)
{
    if (!p || !ex || (label_count && !labels) || label_count > 16)
        return llmem__fail(LLMEM_EINVAL, "pool export: null argument or more than 16 labels");
    llmem_pool_stats s = {sizeof s};
    llmem_status st = llmem_pool_get_stats(p, &s);
    if (!st) st = llmem_exporter_add(ex, llmem_pool_stats_schema(), &s, labels, label_count);
    llmem_pool_class_stats cs[LLMEM_MAX_CLASSES];
    for (size_t c = 0; c < LLMEM_MAX_CLASSES; c++) cs[c].struct_size = sizeof cs[c];
    size_t n = 0;
    if (!st) st = llmem_pool_get_class_stats(p, cs, LLMEM_MAX_CLASSES, &n);
    llmem_label lb[17];
    if (label_count) memcpy(lb, labels, label_count * sizeof *lb);
    char size[24];
    lb[label_count] = (llmem_label){"class_bytes", size};
    for (size_t c = 0; !st && c < n; c++) {
        if (!cs[c].slabs && !cs[c].allocs_total) continue;
        snprintf(size, sizeof size, "%llu", (unsigned long long)cs[c].class_bytes);
        st = llmem_exporter_add(ex, llmem_pool_class_stats_schema(), &cs[c], lb, label_count + 1);
    }
    return st;
}

LLMEM__STATS_SCHEMA_OF(llmem_pool_stats_schema, "pool", llmem_pool_stats, LLMEM_POOL_STATS_FIELDS)

LLMEM__STATS_SCHEMA_OF(llmem_pool_class_stats_schema, "pool_class", llmem_pool_class_stats, LLMEM_POOL_CLASS_STATS_FIELDS)

/* ---- create / destroy ----------------------------------------------------------- */

llmem_pool_options llmem_pool_options_default(void)
{
    llmem_pool_options o;
    memset(&o, 0, sizeof o);
    o.name = "pool";
    o.decay_ms = 250;
    return o;
}

static llmem_status configure(llmem_pool *p, const llmem_pool_options *o)
{
    llmem__copy_name(p->name, sizeof p->name, o->name, "pool");
    p->res = o->resource ? o->resource : llmem__resource_default_thp();
    p->host = llmem_resource_kind(p->res) == LLMEM_MEM_HOST;
    size_t page = llmem__page_size();
    p->unit = p->host ? (page > 4096 ? page : 4096) : ((size_t)64 << 10);
    p->ushift = (unsigned)__builtin_ctzll(p->unit);
    /* Slabs reach 64 units (the 8U class's eight blocks, rounded), and the
     * free's exact division takes 32-bit offsets (slab_index). */
    if (p->ushift > 22)
        return llmem__fail(LLMEM_ENOTSUP, "pool '%s': pages of %zu bytes are not supported", p->name, p->unit);
    size_t min_align = p->unit / 512 > 8 ? p->unit / 512 : 8, max_align = p->unit / 16;
    p->align = o->align ? o->align : (p->host ? 16 : LLMEM_DEVICE_ALIGN);
    if (!llmem__is_pow2(p->align) || p->align < min_align || p->align > max_align)
        return llmem__fail(LLMEM_EALIGN,
                           "pool '%s': align %zu must be a power of two from %zu to %zu (use "
                           "llmem_pool_alloc_aligned for more)",
                           p->name, p->align, min_align, max_align);
    size_t gran = llmem_resource_granularity(p->res);
    p->run = gran > p->unit ? gran : p->unit;
    p->sb_align = p->run > LLMEM_ADDRMAP_UNIT ? p->run : LLMEM_ADDRMAP_UNIT;
    size_t first = o->first_superblock_bytes ? o->first_superblock_bytes
                                             : (p->host ? (size_t)4 << 20 : (size_t)32 << 20);
    size_t max = o->max_superblock_bytes ? o->max_superblock_bytes : (p->host ? (size_t)64 << 20 : (size_t)512 << 20);
    if (!llmem__align_up(first, p->sb_align, &p->first_sb) || !llmem__align_up(max, p->sb_align, &p->max_sb) ||
        p->first_sb > (size_t)PTRDIFF_MAX / 2 || p->max_sb > (size_t)PTRDIFF_MAX / 2)
        return llmem__fail(LLMEM_EOVERFLOW, "pool '%s': superblock sizes overflow", p->name);
    if (p->max_sb < p->first_sb) p->max_sb = p->first_sb;
    p->next_sb[HEAP_SMALL] = p->next_sb[HEAP_LARGE] = p->first_sb;
    p->max_bytes = o->max_bytes;
    if (o->reserve_bytes) {
        llmem_resource_info info;
        memset(&info, 0, sizeof info);
        llmem_resource_get_info(p->res, &info);
        if (!(info.caps & LLMEM_RES_CAP_RESERVE))
            return llmem__fail(LLMEM_ENOTSUP, "pool '%s': reserve_bytes needs a resource that can reserve address "
                               "space (%s cannot)", p->name, llmem_resource_name(p->res));
        if (!llmem__align_up(o->reserve_bytes, p->sb_align, &p->reserve) || p->reserve > ((size_t)1 << 46))
            return llmem__fail(LLMEM_EOVERFLOW, "pool '%s': reserve_bytes %zu is above 64 TiB", p->name,
                               o->reserve_bytes);
        if (p->max_bytes && p->reserve > p->max_bytes)
            return llmem__fail(LLMEM_EINVAL, "pool '%s': reserve_bytes %zu is above max_bytes %zu", p->name,
                               p->reserve, p->max_bytes);
    }
    /* Slabs and large blocks in separate superblocks on the host, so that
     * transparent huge pages (by default) back only slabs, where the TLB
     * decides the speed; a large block's first touch faults in a 4 KiB page,
     * not 2 MiB (see pool_pages.c). A reserved range holds both. */
    p->split = p->host && !p->reserve;
    p->heap_res[HEAP_SMALL] = p->res;
    p->heap_res[HEAP_LARGE] = o->resource ? o->resource : llmem_resource_default();
    struct timespec tick = {0, 10000000};
    clock_getres(CLOCK_MONOTONIC_COARSE, &tick);
    p->decay_ns = (uint64_t)(o->decay_ms ? o->decay_ms : 250) * 1000000u + 2 * (uint64_t)tick.tv_nsec;
    if ((unsigned)o->purge > LLMEM_POOL_PURGE_MANUAL)
        return llmem__fail(LLMEM_EINVAL, "pool '%s': unknown purge mode %d", p->name, (int)o->purge);
    p->purge_background = o->purge != LLMEM_POOL_PURGE_MANUAL;
    p->rc.cap = p->host && p->purge_background ? RUN_CACHE_BYTES : 0; /* see pool_pages.c, "the run cache" */
    p->checked = o->checked;
    p->inband = p->host && !p->checked;
    if (o->extra_class_count && !o->extra_classes)
        return llmem__fail(LLMEM_EINVAL, "pool '%s': extra_class_count without extra_classes", p->name);
    if (o->extra_class_count > LLMEM_POOL_MAX_EXTRA_CLASSES ||
        !llmem__classes_init(&p->cls, p->align, p->unit, slab_granule(p->unit), o->extra_classes,
                             o->extra_class_count))
        return llmem__fail(LLMEM_EINVAL, "pool '%s': at most %d extra classes", p->name, LLMEM_POOL_MAX_EXTRA_CLASSES);
    p->profile = o->profile;
    for (unsigned c = 0; c < p->cls.count; c++) {
        uint32_t size = p->cls.size[c];
        unsigned k = (unsigned)__builtin_ctz(size);
        uint32_t d = size >> k, inv = d; /* Newton's iteration: each step doubles the correct low bits */
        for (int i = 0; i < 5; i++) inv *= 2 - d * inv;
        p->div.inv[c] = inv;
        p->div.last[c] = p->cls.slab_blocks[c] - 1;
        p->div.shift[c] = (uint8_t)k;
    }
    return LLMEM_OK;
}

llmem_status llmem_pool_create(const llmem_pool_options *opts, llmem_pool **out)
{
    if (!out) return llmem__fail(LLMEM_EINVAL, "pool: null out");
    *out = NULL;
    llmem_pool_options o = opts ? *opts : llmem_pool_options_default();
    size_t bytes = (sizeof(llmem_pool) + 63) & ~(size_t)63;
    llmem_pool *p = aligned_alloc(64, bytes);
    if (!p) return llmem__fail(LLMEM_ENOMEM, "pool: out of memory");
    memset(p, 0, bytes);
    llmem_status st = configure(p, &o);
    if (!st) {
        llmem_fixed_options fo = llmem_fixed_options_default();
        fo.name = "pool-metadata";
        fo.block_size = sizeof(slab);
        st = llmem_fixed_create(&fo, &p->descs);
        fo.name = "pool-states";
        for (unsigned c = 0; c < p->cls.count && !st; c++) {
            unsigned k = state_pool(p->cls.slab_blocks[c]);
            if (k >= STATE_POOLS) {
                st = llmem__fail(LLMEM_ENOTSUP, "pool '%s': a slab of %u blocks has no state array size", p->name,
                                 p->cls.slab_blocks[c]);
            } else if (!p->states[k]) {
                fo.block_size = (size_t)64 << k;
                st = llmem_fixed_create(&fo, &p->states[k]);
            }
        }
    }
    if (st) {
        llmem_fixed_destroy(p->descs);
        for (unsigned k = 0; k < STATE_POOLS; k++) llmem_fixed_destroy(p->states[k]);
        free(p);
        return st;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_mutex_init(&p->tlock, NULL);
    p->st.struct_size = sizeof p->st;
    p->id = __atomic_fetch_add(&next_pool_id, 1, __ATOMIC_RELAXED);
    p->utag = pool_utag_of(p->id);
    /* Thread caches, unless checked; without a pthread key left (over a
     * thousand pools alive) the pool simply runs on its lock. */
    p->tcache_on = !p->checked && pthread_key_create(&p->tkey, llmem__pool_tcache_destructor) == 0;
    p->lcache_on = p->tcache_on && p->rc.cap; /* the purger reclaims idle ones, as it flushes the run cache */
    /* Marks in free blocks (pool_internal.h, "block states"): blocks of
     * at least a word, at least 8-aligned; the key differs per pool and
     * per run, and its low bits are set so that no mark is 0. On unless
     * LLMEM_POOL_MARKS=0 in the environment: with two threads they double
     * larson and cost cross_thread 40%, which stays 1.5x of the best peer
     * (docs/BENCHMARKS.md, branch s29-marks); one thread never marks. */
    const char *mv = getenv("LLMEM_POOL_MARKS");
    p->marks = !(mv && mv[0] == '0') && p->tcache_on && p->inband && p->cls.size[0] >= sizeof(uint64_t) && p->align >= 8;
    uint64_t k = p->id ^ (uint64_t)(uintptr_t)p ^ llmem__pool_clock();
    k = (k ^ (k >> 30)) * 0xbf58476d1ce4e5b9ull;
    k = (k ^ (k >> 27)) * 0x94d049bb133111ebull;
    p->mark_key = (k ^ (k >> 31)) | 7;
    size_t xslots = 0;
    for (unsigned c = 0; c < p->cls.count; c++) {
        size_t cap = 16 * p->unit / p->cls.size[c];
        p->tcache_cap[c] = (uint32_t)(cap < 4 ? 4 : cap > 256 ? 256 : cap);
        p->tcache_slots += p->tcache_cap[c];
        pthread_mutex_init(&p->xfer[c].lock, NULL);
        p->xfer[c].cap = p->tcache_on ? 4 * p->tcache_cap[c] : 0;
        xslots += p->xfer[c].cap;
    }
    if (xslots) {
        p->xfer_storage = malloc(xslots * sizeof *p->xfer_storage);
        size_t at = 0;
        for (unsigned c = 0; c < p->cls.count; c++) {
            p->xfer[c].slots = p->xfer_storage ? &p->xfer_storage[at] : NULL;
            if (!p->xfer_storage) p->xfer[c].cap = 0; /* no room: flush straight to slabs */
            at += p->xfer[c].cap;
        }
    }
    if (p->purge_background) {
        st = llmem__pool_purger_register(p);
        if (st) {
            llmem_pool_destroy(p);
            return st;
        }
    }
    *out = p;
    return LLMEM_OK;
}

void llmem_pool_destroy(llmem_pool *p)
{
    if (!p) return;
    if (p->purge_background) llmem__pool_purger_unregister(p);
    /* Live blocks are reported, not unmapped in silence: a leak, or memory
     * someone still uses. Blocks whose fenced free is pending were freed
     * by their owner and do not count. */
    llmem_pool_stats s = {sizeof s};
    llmem_pool_get_stats(p, &s);
    uint64_t live = s.live_allocations > s.fenced_pending ? s.live_allocations - s.fenced_pending : 0;
    uint64_t bytes = s.used_bytes > s.fenced_pending_bytes ? s.used_bytes - s.fenced_pending_bytes : 0;
    /* Logged, not made the thread's last error: a destroy on a caller's
     * error path must leave that error for the caller to read. */
    if (live)
        llmem__log(LLMEM_LOG_WARN,
                   "pool '%s': destroyed with %llu live block(s) of %llu bytes (%llu handle(s)); their memory is unmapped",
                   p->name, (unsigned long long)live, (unsigned long long)bytes, (unsigned long long)s.handles);
    if (p->tcache_on) {
        pthread_key_delete(p->tkey);
        llmem__pool_tcaches_destroy(p);
    }
    for (superblock *sb = p->sbs, *n; sb; sb = n) {
        n = sb->next;
        for (pblock *b = sb->owner[0]; b; b = b->next) {
            if (b->kind != D_SLAB) continue;
            free(((slab *)b)->free_idx);
        }
        llmem__addrmap_clear(sb->base, sb->size);
        llmem_resource_unmap(p->heap_res[sb->heap], (void *)sb->base, sb->size, sb->size - (sb->decommitted_units << p->ushift));
        llmem__pool_sb_free_meta(sb);
    }
    llmem__pool_drop_fenced(p);
    llmem_fixed_destroy(p->descs);
    for (unsigned k = 0; k < STATE_POOLS; k++) llmem_fixed_destroy(p->states[k]);
    free(p->xfer_storage);
    for (unsigned c = 0; c < p->cls.count; c++) pthread_mutex_destroy(&p->xfer[c].lock);
    free(p->handles);
    pthread_mutex_destroy(&p->lock);
    pthread_mutex_destroy(&p->tlock);
    free(p);
}

void llmem_pool_flush_thread_cache(llmem_pool *p)
{
    if (!p) return;
    tcache *t = llmem__pool_tcache_get(p);
    if (!t) return;
    pthread_mutex_lock(&p->lock);
    llmem__pool_tcache_flush_all(p, t);
    pthread_mutex_unlock(&p->lock);
}

llmem_resource *llmem_pool_get_resource(const llmem_pool *p) { return p ? p->res : NULL; }
