/*
 * pool_shim.c - the pool internals libllmem-malloc.so needs (see
 * pool_shim.h): fork hooks and a lock-free usable size.
 *
 * Fork.
 * The pool's locks, in the one order the hooks take them: the pool lock,
 * then every class's transfer-cache lock in class order, then the
 * thread-cache list lock (tlock). Everything else is changed only under
 * the pool lock (slabs, free runs, superblocks, the descriptor and state
 * fixed pools with their own locks, the address map's write lock, the
 * resource), so holding it quiesces those too. The transfer-cache locks
 * and tlock are leaves, taken with the pool lock held or with no lock at
 * all, and no thread waits for another lock while holding one, so holding
 * them all at once in this order cannot deadlock. With all held, no
 * refill or flush is moving blocks between a thread cache, a transfer
 * cache and the slabs, no reclaim is under way (reclaim_seq is even), and
 * no cache is joining or leaving the list: the child finds every
 * structure whole, and its locks are re-initialised unlocked. Thread-cache
 * fast paths take no lock but touch only their own thread's cache, which
 * the child either owns (the forking thread) or never touches again (a
 * reclaim in the child leaves such a cache alone if its thread was inside
 * a call at fork: its busy flag stays set).
 *
 * Usable size without the lock. A live slab block keeps its slab (and so
 * the address map's slab entries for it) alive, and a live large
 * block's descriptor and owner entry change only when it is freed or
 * resized, which its owner is not doing while it asks. So for a live
 * block start the tables can be read as they are; the locked query
 * answers everything this cannot vouch for.
 *
 * Releasing long free runs: see pool_shim.h.
 */
#include "pool_shim.h"

#include "addrmap.h"
#include "pool_internal.h"

void *llmem__pool_shim_alloc(llmem_pool *p, size_t n)
{
    void *r = llmem__tcache_pop(p, n);
    if (LLMEM_LIKELY(r)) return r;
    return llmem__shim_alloc_miss(n);
}

void llmem__pool_shim_free(llmem_pool *p, void *ptr)
{
    if (LLMEM_LIKELY(llmem__tl_last.id == p->id) && LLMEM_LIKELY(llmem__tcache_push(p, llmem__tl_last.tc, ptr) > 0))
        return;
    llmem__shim_free_miss(ptr);
}

void llmem__pool_fork_prepare(llmem_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    for (unsigned c = 0; c < p->cls.count; c++) pthread_mutex_lock(&p->xfer[c].lock);
    pthread_mutex_lock(&p->tlock);
}

void llmem__pool_fork_parent(llmem_pool *p)
{
    if (!p) return;
    pthread_mutex_unlock(&p->tlock);
    for (unsigned c = p->cls.count; c-- > 0;) pthread_mutex_unlock(&p->xfer[c].lock);
    pthread_mutex_unlock(&p->lock);
}

void llmem__pool_fork_child(llmem_pool *p)
{
    if (!p) return;
    pthread_mutex_init(&p->tlock, NULL);
    for (unsigned c = 0; c < p->cls.count; c++) pthread_mutex_init(&p->xfer[c].lock, NULL);
    pthread_mutex_init(&p->lock, NULL);
}

size_t llmem__pool_usable_nolock(const llmem_pool *p, const void *ptr)
{
    uintptr_t a = (uintptr_t)ptr;
    if (!p || !ptr || p->checked) return llmem_pool_usable_size(p, ptr);
    /* A slab block the way the free finds it: the map entry's slab
     * entry, whose tag says whose slab it is, so the superblock's header
     * is not read (redis-server asks at every malloc and free: that
     * header's line was an eighth of this call's samples, and the free
     * then reads the entry's line anyway). */
    const slab_unit *su = unit_entry(a);
    if ((su->ctag ^ pool_utag(p)) < 256) {
        /* A block boundary before the slab's end: the exact division
         * (llmem__pool_slab_index), as its free path checks it. */
        uint32_t idx;
        int c = unit_block(p, su, a, &idx);
        if (c >= 0) return p->cls.size[c];
        return llmem_pool_usable_size(p, ptr);
    }
    superblock *sb = llmem__addrmap_get(a);
    if (!sb || sb->pool != p) return 0;
    if (!su->ctag) {
        const pblock *b = sb->owner[unit_of(sb, a, p->ushift)];
        if (b && b->kind == D_LARGE && b->user == a) return b->start + b->size - a;
    }
    return llmem_pool_usable_size(p, ptr);
}

size_t llmem__pool_release_free_runs(llmem_pool *p, size_t min_run, uint64_t min_age_ns)
{
    if (!p || !p->host) return 0;
    size_t released = 0;
    uint64_t now = min_age_ns ? llmem__pool_clock() : 0;
    pthread_mutex_lock(&p->lock);
    for (unsigned h = 0; h < HEAPS; h++)
        for (llmem__avl_node *x = llmem__avl_last(&p->free_tree[h]); x; x = llmem__avl_prev(x)) {
            pblock *b = node_block(x);
            if (b->size < min_run) break; /* the tree is in size order */
            if (b->purged || (min_age_ns && now - b->free_since < min_age_ns)) continue;
            released += llmem__pool_decommit_block(p, b, SIZE_MAX);
            b->purged = true;
        }
    pthread_mutex_unlock(&p->lock);
    return released;
}
