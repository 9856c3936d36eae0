/*
 * pool.c - the dynamic pool: superblocks, a best-fit page allocator,
 * size-class slabs.
 *
 * Layout. A superblock is one mapping from the resource, aligned to at
 * least 64 KiB (the address map's unit) and to the resource granularity,
 * and registered in the process-wide address map, so any pointer finds its
 * superblock in three loads. A superblock is tiled by blocks: runs of whole
 * units (U: 4 KiB host, 64 KiB device), each FREE, LARGE (one allocation) or
 * SLAB (blocks of one size class). Blocks are out-of-band descriptors,
 * linked in address order (prev/next) so freeing coalesces with free
 * neighbours; FREE blocks also sit in an AVL tree ordered by (size, address)
 * for best fit in O(log n). Each superblock has an owner table with one
 * entry per unit: the first unit of every FREE and LARGE block and every
 * unit of a SLAB point at their descriptor; other entries are NULL. So free
 * finds a pointer's block in one more load, and a pointer that is not a
 * live block start is recognised at once.
 *
 * Slabs. A slab carves blocks of its class lazily (a bump index), so a new
 * slab touches no page until its blocks are used. Free blocks go on a list
 * threaded through them (plain host pools) or on an index stack in host
 * memory (device pools, which must not touch their memory, and checked
 * pools). Slabs with free blocks sit on their class's partial list; a slab
 * whose last block comes back is kept if it is its class's only empty slab,
 * otherwise returned to the page allocator.
 *
 * Memory going back. A superblock whose blocks are all free is "empty"; it
 * is unmapped once it has stayed empty for the decay delay (checked on the
 * pool's slow paths), or at once by shrink/trim. Decommit works on runs of
 * units aligned to the resource granularity inside free blocks; a bit per
 * unit records what is decommitted, and taking a block first commits the
 * runs it covers, so a run is always wholly committed or wholly not.
 *
 * Checked mode adds a bit per slab block (allocated or not) and, on the
 * host, guard canaries: an allocation of n bytes takes a block of G + n + 16
 * bytes (G = 64, or the alignment if larger), the user pointer is block + G,
 * the first 16 bytes of the front guard hold a magic word, n and G, and the
 * rest of both guards hold a fixed pattern, verified on free.
 *
 * Locking: one mutex per pool guards everything.
 *
 * Invariants (llmem_pool_check verifies them): blocks tile each superblock
 * in address order; no two FREE blocks are adjacent; the tree holds exactly
 * the FREE blocks; owner table entries are as described; a slab's used +
 * free-list length = carved <= nblocks; the figures in the stats equal the
 * sums over blocks.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "addrmap.h"
#include "pool_internal.h"

static int free_cmp(const llmem_avl_node *a, const llmem_avl_node *b)
{
    const pblock *x = (const pblock *)((const char *)a - offsetof(pblock, node));
    const pblock *y = (const pblock *)((const char *)b - offsetof(pblock, node));
    if (x->size != y->size) return x->size < y->size ? -1 : 1;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* Key for lower_bound: the smallest size wanted, lowest address first. */
int llmem__pool_size_key_cmp(const void *key, const llmem_avl_node *n)
{
    size_t want = *(const size_t *)key;
    const pblock *b = (const pblock *)((const char *)n - offsetof(pblock, node));
    return want <= b->size ? -1 : 1;
}

/* ---- small helpers ------------------------------------------------------- */

pblock *llmem__pool_desc_new(llmem_pool *p)
{
    slab *s = llmem_fixed_alloc(p->descs, NULL);
    if (s) memset(s, 0, sizeof *s);
    return &s->b;
}

void llmem__pool_desc_free(llmem_pool *p, pblock *b) { llmem_fixed_free(p->descs, b); }

void llmem__pool_tree_insert(llmem_pool *p, pblock *b)
{
    b->kind = D_FREE;
    b->free_since = llmem__now_ns();
    b->purged = false;
    llmem__avl_insert(&p->free_tree, &b->node, free_cmp);
    p->st.free_bytes += b->size;
}

void llmem__pool_tree_remove(llmem_pool *p, pblock *b)
{
    llmem__avl_remove(&p->free_tree, &b->node);
    p->st.free_bytes -= b->size;
}

/* ---- superblocks ------------------------------------------------------- */

static void empty_list_add(llmem_pool *p, superblock *sb)
{
    if (sb->reserved) return; /* kept: its free pages are decommitted instead */
    sb->empty = true;
    sb->empty_since = llmem__now_ns();
    sb->eprev = NULL;
    sb->enext = p->empties;
    if (p->empties) p->empties->eprev = sb;
    p->empties = sb;
}

static void empty_list_remove(llmem_pool *p, superblock *sb)
{
    if (!sb->empty) return;
    if (sb->eprev) sb->eprev->enext = sb->enext;
    else p->empties = sb->enext;
    if (sb->enext) sb->enext->eprev = sb->eprev;
    sb->empty = false;
}

static void sb_free_meta(superblock *sb)
{
    free(sb->owner);
    free(sb->slab_info);
    free(sb->decommitted);
    free(sb);
}

/* Map a superblock able to hold `need` bytes at `align`; its single FREE
 * block goes into the tree. Lock held. */
static void mark_runs(llmem_pool *p, superblock *sb, uintptr_t r0, uintptr_t r1, bool decommitted);

/* Map a superblock of `size` bytes and add it to the pool as one free run:
 * committed, or (reserved) address space whose every page starts
 * decommitted, for take_run to commit as blocks need it. The map comes
 * first: a size the resource cannot hold (an absurd request) must fail
 * there, not cost host metadata in proportion to it first. Lock held. */
static llmem_status sb_map(llmem_pool *p, size_t size, bool reserved, superblock **out)
{
    void *base;
    llmem_status st = llmem_resource_map_tagged(p->res, size, p->sb_align, reserved ? LLMEM_MAP_UNCOMMITTED : 0,
                                                p->name, &base);
    p->st.resource_calls_total++;
    if (st) return st;
    size_t units = size >> p->ushift;
    superblock *sb = calloc(1, sizeof *sb);
    pblock *b = llmem__pool_desc_new(p);
    if (sb) {
        sb->owner = calloc(units, sizeof *sb->owner);
        sb->decommitted = calloc((units + 63) / 64, sizeof(uint64_t));
        sb->slab_info = calloc(units, sizeof *sb->slab_info);
    }
    if (!sb || !sb->owner || !sb->decommitted || !sb->slab_info || !b)
        st = llmem__fail(LLMEM_ENOMEM, "pool '%s': out of host memory for superblock metadata", p->name);
    else st = llmem__addrmap_set((uintptr_t)base, size, sb);
    if (st) {
        if (sb) sb_free_meta(sb);
        if (b) llmem__pool_desc_free(p, b);
        llmem_resource_unmap(p->res, base, size, reserved ? 0 : size);
        p->st.resource_calls_total++;
        return st;
    }
    if (p->host && !reserved) LLMEM_POISON(base, size);
    sb->base = (uintptr_t)base;
    sb->size = size;
    sb->pool = p;
    sb->reserved = reserved;
    if (reserved) mark_runs(p, sb, sb->base, sb->base + size, true);
    sb->next = p->sbs;
    if (p->sbs) p->sbs->prev = sb;
    p->sbs = sb;
    b->start = sb->base;
    b->size = size;
    b->sb = sb;
    sb->owner[0] = b;
    llmem__pool_tree_insert(p, b);
    b->purged = reserved; /* nothing of a reserved range is committed yet */
    empty_list_add(p, sb); /* a reserved range is never listed: see there */
    p->st.reserved_bytes += size;
    if (!reserved) p->st.committed_bytes += size;
    if (p->st.reserved_bytes > p->st.reserved_peak_bytes) p->st.reserved_peak_bytes = p->st.reserved_bytes;
    p->st.superblocks++;
    p->st.grows_total++;
    *out = sb;
    return LLMEM_OK;
}

static llmem_status grow(llmem_pool *p, size_t need, size_t align)
{
    if (p->reserve && !p->rsb) return sb_map(p, p->reserve, true, &p->rsb);
    size_t want = need, size;
    if (align > p->unit && !llmem__add_ok(want, align - p->unit, &want))
        return llmem__fail(LLMEM_EOVERFLOW, "pool '%s': %zu bytes at alignment %zu overflow", p->name, need, align);
    bool dedicated = want > p->max_sb;
    if (!dedicated && want < p->next_sb) want = p->next_sb;
    if (!llmem__align_up(want, p->sb_align, &size) || size > (size_t)PTRDIFF_MAX)
        return llmem__fail(LLMEM_EOVERFLOW, "pool '%s': a superblock for %zu bytes overflows", p->name, need);
    if (p->max_bytes && (size > p->max_bytes || p->st.reserved_bytes > p->max_bytes - size))
        return llmem__fail(LLMEM_ENOMEM, "pool '%s': a %zu-byte superblock would pass max_bytes %zu (%llu mapped)",
                           p->name, size, p->max_bytes, (unsigned long long)p->st.reserved_bytes);
    superblock *sb;
    llmem_status st = sb_map(p, size, false, &sb);
    if (st) return st;
    if (!dedicated) p->next_sb = p->next_sb > p->max_sb / 2 ? p->max_sb : p->next_sb * 2;
    return LLMEM_OK;
}

/* Unmap an empty superblock. Lock held. */
bool llmem__pool_release_sb(llmem_pool *p, superblock *sb)
{
    /* Out of the address map first: once unmapped, the range may be mapped
     * again for someone else, whose entries we must not clear. */
    llmem__addrmap_clear(sb->base, sb->size);
    size_t decommitted = sb->decommitted_units << p->ushift;
    p->st.resource_calls_total++;
    if (llmem_resource_unmap(p->res, (void *)sb->base, sb->size, sb->size - decommitted) != LLMEM_OK) {
        llmem__addrmap_set(sb->base, sb->size, sb); /* its nodes exist: cannot fail */
        sb->empty_since = llmem__now_ns();          /* try again after another delay */
        llmem__log(LLMEM_LOG_WARN, "pool '%s': superblock %p kept: %s", p->name, (void *)sb->base,
                   llmem_last_error());
        return false;
    }
    pblock *b = sb->owner[0];
    llmem__pool_tree_remove(p, b);
    llmem__pool_desc_free(p, b);
    empty_list_remove(p, sb);
    if (sb->prev) sb->prev->next = sb->next;
    else p->sbs = sb->next;
    if (sb->next) sb->next->prev = sb->prev;
    p->st.reserved_bytes -= sb->size;
    p->st.committed_bytes -= sb->size - decommitted;
    p->st.superblocks--;
    p->st.shrinks_total++;
    /* Growth steps back as superblocks go: after an idle shrink, the next
     * burst's first growth is not the size the previous burst ended on
     * (measured: llmem demo's second burst mapped 17.8 MB for 1.5 MB used). */
    if (sb->size < p->max_sb || sb->size <= p->next_sb)
        p->next_sb = p->next_sb / 2 > p->first_sb ? p->next_sb / 2 : p->first_sb;
    sb_free_meta(sb);
    return true;
}

/* Release superblocks empty for longer than the decay delay. Lock held. */
static void decay(llmem_pool *p)
{
    if (!p->empties) return;
    uint64_t now = llmem__now_ns();
    for (superblock *sb = p->empties, *n; sb; sb = n) {
        n = sb->enext;
        if (now - sb->empty_since >= p->decay_ns) llmem__pool_release_sb(p, sb);
    }
}

/* ---- the background purger ---------------------------------------------
 *
 * One thread for the process, started with the first pool that wants it.
 * It sleeps until the oldest pending item of any registered pool (an empty
 * superblock, a free run not yet decommitted) has waited the pool's decay
 * delay, then unmaps or decommits it; with nothing pending it sleeps until
 * a pool kicks it. It takes pool locks with trylock only, so it never makes
 * an application thread wait, and retries a busy pool shortly after. Lock
 * order: a pool's lock, then the purger's (kick); the purger holds its own
 * and only tries pool locks.
 */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    llmem_pool *pools;
    bool started, sleeping;
    uint64_t kicks; /* bumped by every kick; the purger rescans if it moved */
} purger = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, false, false, 0};

static size_t decommit_block(llmem_pool *p, pblock *b, size_t budget);
bool llmem__pool_release_sb(llmem_pool *p, superblock *sb);

/* Something became free: make sure the purger sees it. Either the purger
 * reads the new kick count before it sleeps, or this reads its sleeping
 * flag and signals (both sides use sequentially consistent order). */
static void purger_kick(const llmem_pool *p)
{
    if (!p->purge_background) return;
    __atomic_add_fetch(&purger.kicks, 1, __ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&purger.sleeping, __ATOMIC_SEQ_CST)) return;
    pthread_mutex_lock(&purger.lock);
    pthread_cond_signal(&purger.wake);
    pthread_mutex_unlock(&purger.lock);
}

/* Give back what has waited the decay delay; return when the next pending
 * item will have, or UINT64_MAX. Pool lock held. */
static uint64_t purge_pass(llmem_pool *p, uint64_t now)
{
    uint64_t next = UINT64_MAX;
    for (superblock *sb = p->empties, *n; sb; sb = n) {
        n = sb->enext;
        if (now - sb->empty_since >= p->decay_ns) llmem__pool_release_sb(p, sb);
        else if (sb->empty_since + p->decay_ns < next) next = sb->empty_since + p->decay_ns;
    }
    for (llmem_avl_node *x = llmem__avl_first(&p->free_tree); x; x = llmem__avl_next(x)) {
        pblock *b = (pblock *)((char *)x - offsetof(pblock, node));
        if (b->purged) continue;
        if (now - b->free_since >= p->decay_ns) {
            decommit_block(p, b, SIZE_MAX);
            b->purged = true;
        } else if (b->free_since + p->decay_ns < next) {
            next = b->free_since + p->decay_ns;
        }
    }
    return next;
}

static void *purger_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&purger.lock);
    for (;;) {
        uint64_t seen = __atomic_load_n(&purger.kicks, __ATOMIC_SEQ_CST);
        uint64_t now = llmem__now_ns(), next = UINT64_MAX;
        for (llmem_pool *p = purger.pools; p; p = p->purge_next) {
            if (pthread_mutex_trylock(&p->lock) == 0) {
                uint64_t t = purge_pass(p, now);
                pthread_mutex_unlock(&p->lock);
                if (t < next) next = t;
            } else if (now + 10000000u < next) {
                next = now + 10000000u; /* busy: look again in 10 ms */
            }
        }
        if (next == UINT64_MAX) {
            __atomic_store_n(&purger.sleeping, true, __ATOMIC_SEQ_CST);
            if (__atomic_load_n(&purger.kicks, __ATOMIC_SEQ_CST) == seen) pthread_cond_wait(&purger.wake, &purger.lock);
            __atomic_store_n(&purger.sleeping, false, __ATOMIC_SEQ_CST);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            uint64_t wait = next > now ? next - now : 0;
            wait += 1000000u; /* a little past the deadline, so it has passed */
            ts.tv_sec += (time_t)(wait / 1000000000u);
            ts.tv_nsec += (long)(wait % 1000000000u);
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&purger.wake, &purger.lock, &ts);
        }
    }
    return NULL;
}

static llmem_status purger_register(llmem_pool *p)
{
    pthread_mutex_lock(&purger.lock);
    if (!purger.started) {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_destroy(&purger.wake);
        pthread_cond_init(&purger.wake, &ca);
        pthread_condattr_destroy(&ca);
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        bool ok = pthread_create(&t, &a, purger_main, NULL) == 0;
        pthread_attr_destroy(&a);
        if (!ok) {
            pthread_mutex_unlock(&purger.lock);
            return llmem__fail(LLMEM_EOS, "pool '%s': cannot start the background purge thread", p->name);
        }
        purger.started = true;
    }
    p->purge_next = purger.pools;
    purger.pools = p;
    pthread_cond_signal(&purger.wake);
    pthread_mutex_unlock(&purger.lock);
    return LLMEM_OK;
}

static void purger_unregister(llmem_pool *p)
{
    pthread_mutex_lock(&purger.lock); /* waits for a pass over p to end */
    for (llmem_pool **q = &purger.pools; *q; q = &(*q)->purge_next)
        if (*q == p) {
            *q = p->purge_next;
            break;
        }
    pthread_mutex_unlock(&purger.lock);
}

/* ---- commit and decommit inside superblocks ------------------------------ */

/* Set or clear the decommit bits of runs [r0, r1) (addresses). */
static void mark_runs(llmem_pool *p, superblock *sb, uintptr_t r0, uintptr_t r1, bool decommitted)
{
    size_t u0 = unit_of(sb, r0, p->ushift), u1 = unit_of(sb, r1, p->ushift);
    for (size_t u = u0; u < u1; u++) {
        if (decommitted) bit_set(sb->decommitted, u);
        else bit_clear(sb->decommitted, u);
    }
    if (decommitted) sb->decommitted_units += u1 - u0;
    else sb->decommitted_units -= u1 - u0;
}

/* Commit every decommitted run overlapping [a, a+n), one resource call per
 * stretch of consecutive decommitted runs. Lock held. */
llmem_status llmem__pool_commit_range(llmem_pool *p, superblock *sb, uintptr_t a, size_t n)
{
    if (!sb->decommitted_units) return LLMEM_OK;
    uintptr_t r = sb->base + ((a - sb->base) & ~(uintptr_t)(p->run - 1)), end = a + n;
    while (r < end) {
        if (!bit_get(sb->decommitted, unit_of(sb, r, p->ushift))) {
            r += p->run;
            continue;
        }
        uintptr_t r1 = r + p->run;
        while (r1 < end && bit_get(sb->decommitted, unit_of(sb, r1, p->ushift))) r1 += p->run;
        llmem_status st = llmem_resource_commit(p->res, (void *)r, r1 - r);
        p->st.resource_calls_total++;
        if (st) return st;
        mark_runs(p, sb, r, r1, false);
        p->st.committed_bytes += r1 - r;
        if (p->host) LLMEM_POISON((void *)r, r1 - r);
        r = r1;
    }
    return LLMEM_OK;
}

/* Decommit the committed runs inside free block b, one resource call per
 * stretch, until `budget` bytes were released. Returns the bytes released.
 * Lock held. */
static size_t decommit_block(llmem_pool *p, pblock *b, size_t budget)
{
    superblock *sb = b->sb;
    uintptr_t r = sb->base + llmem__align_ptr(b->start - sb->base, p->run);
    uintptr_t hi = sb->base + ((b->start + b->size - sb->base) & ~(uintptr_t)(p->run - 1));
    size_t released = 0;
    size_t run_units = p->run >> p->ushift;
    while (r < hi && released < budget) {
        size_t u = unit_of(sb, r, p->ushift);
        if (bit_get(sb->decommitted, u)) {
            /* Whole words of decommitted units at once: a reserved range is
             * mostly decommitted, and its free tail can be gigabytes. */
            if (u % 64 == 0 && 64 % run_units == 0 && sb->decommitted[u / 64] == ~0ull) r += (uintptr_t)64 << p->ushift;
            else r += p->run;
            continue;
        }
        uintptr_t r1 = r + p->run;
        while (r1 < hi && r1 - r < budget - released && !bit_get(sb->decommitted, unit_of(sb, r1, p->ushift)))
            r1 += p->run;
        llmem_status st = llmem_resource_decommit(p->res, (void *)r, r1 - r);
        p->st.resource_calls_total++;
        if (st) break; /* e.g. a resource that cannot decommit: nothing more to do here */
        mark_runs(p, sb, r, r1, true);
        p->st.committed_bytes -= r1 - r;
        p->st.decommitted_bytes_total += r1 - r;
        released += r1 - r;
        r = r1;
    }
    return released;
}

/* ---- the page allocator ------------------------------------------------ */

/* A FREE block that can hold size bytes at align, or NULL. */
static pblock *best_fit(llmem_pool *p, size_t size, size_t align)
{
    llmem_avl_node *n = llmem__avl_lower_bound(&p->free_tree, &size, llmem__pool_size_key_cmp);
    if (align <= p->unit) return node_block(n);
    /* Aligned: the smallest candidates first, then one that surely fits. */
    for (int tries = 0; n && tries < 32; tries++, n = llmem__avl_next(n)) {
        pblock *b = node_block(n);
        size_t pad = llmem__align_ptr(b->start, align) - b->start;
        if (pad <= b->size && size <= b->size - pad) return b;
    }
    size_t surely;
    if (!llmem__add_ok(size, align - p->unit, &surely)) return NULL;
    return node_block(llmem__avl_lower_bound(&p->free_tree, &surely, llmem__pool_size_key_cmp));
}

/* Split [b.start, b.start+at) off b as a new FREE block before it; b keeps
 * the rest. Lock held, b not in the tree. */
static bool split_front(llmem_pool *p, pblock *b, size_t at)
{
    pblock *f = llmem__pool_desc_new(p);
    if (!f) return false;
    f->start = b->start;
    f->size = at;
    f->sb = b->sb;
    f->prev = b->prev;
    f->next = b;
    if (b->prev) b->prev->next = f;
    b->prev = f;
    b->start += at;
    b->size -= at;
    f->sb->owner[unit_of(f->sb, f->start, p->ushift)] = f;
    llmem__pool_tree_insert(p, f);
    return true;
}

/* Split everything past `keep` bytes off b as a FREE block after it. */
void llmem__pool_split_back(llmem_pool *p, pblock *b, size_t keep)
{
    pblock *t = llmem__pool_desc_new(p);
    if (!t) return; /* keep the tail inside b: wasted, not lost */
    t->start = b->start + keep;
    t->size = b->size - keep;
    t->sb = b->sb;
    t->prev = b;
    t->next = b->next;
    if (b->next) b->next->prev = t;
    b->next = t;
    b->size = keep;
    t->sb->owner[unit_of(t->sb, t->start, p->ushift)] = t;
    llmem__pool_tree_insert(p, t);
}

/* Take `size` bytes (a unit multiple) at `align` from the free runs,
 * growing if needed. The block returned is out of the tree, its units
 * committed, kind still to be set by the caller. Lock held. */
pblock *llmem__pool_take_run(llmem_pool *p, pblock *b, size_t size, size_t align, llmem_status *st)
{
    size_t pad = llmem__align_ptr(b->start, align > p->unit ? align : p->unit) - b->start;
    *st = llmem__pool_commit_range(p, b->sb, b->start + pad, size);
    if (*st) return NULL;
    superblock *sb = b->sb;
    llmem__pool_tree_remove(p, b);
    if (pad && !split_front(p, b, pad)) {
        llmem__pool_tree_insert(p, b);
        *st = llmem__fail(LLMEM_ENOMEM, "pool '%s': out of host memory for a block descriptor", p->name);
        return NULL;
    }
    if (b->size > size) llmem__pool_split_back(p, b, size);
    if (sb->used == 0) empty_list_remove(p, sb);
    sb->used += b->size;
    return b;
}

pblock *llmem__pool_take_pages(llmem_pool *p, size_t size, size_t align, llmem_status *st)
{
    decay(p);
    pblock *b = best_fit(p, size, align);
    /* Twice at most: the reserved range first, if it is not mapped yet and
     * cannot hold the request, then an ordinary superblock. */
    for (int tries = 0; !b && tries < 2; tries++) {
        *st = grow(p, size, align);
        if (*st) return NULL;
        b = best_fit(p, size, align);
    }
    if (!b) {
        *st = llmem__fail(LLMEM_ENOMEM, "pool '%s': no fit after growing (internal error)", p->name);
        return NULL;
    }
    return llmem__pool_take_run(p, b, size, align, st);
}

/* Return a block to the free runs, coalescing with free neighbours. */
void llmem__pool_put_pages(llmem_pool *p, pblock *b)
{
    superblock *sb = b->sb;
    sb->used -= b->size;
    pblock *prev = b->prev, *next = b->next;
    if (prev && prev->kind == D_FREE) {
        llmem__pool_tree_remove(p, prev);
        sb->owner[unit_of(sb, b->start, p->ushift)] = NULL;
        prev->size += b->size;
        prev->next = next;
        if (next) next->prev = prev;
        llmem__pool_desc_free(p, b);
        b = prev;
    }
    if (next && next->kind == D_FREE) {
        llmem__pool_tree_remove(p, next);
        sb->owner[unit_of(sb, next->start, p->ushift)] = NULL;
        b->size += next->size;
        b->next = next->next;
        if (next->next) next->next->prev = b;
        llmem__pool_desc_free(p, next);
    }
    sb->owner[unit_of(sb, b->start, p->ushift)] = b;
    if (p->host) LLMEM_POISON((void *)b->start, b->size);
    llmem__pool_tree_insert(p, b);
    if (sb->used == 0) empty_list_add(p, sb);
    purger_kick(p);
}

/* ---- guards (checked host pools) ----------------------------------------- */

static inline size_t guard_front(size_t align) { return align > GUARD_MIN ? align : GUARD_MIN; }

/* Write the guards around [user, user+n) inside [block, block+bsize). */
static void guards_write(uintptr_t block, size_t bsize, uintptr_t user, size_t n)
{
    size_t g = user - block;
    LLMEM_UNPOISON((void *)block, g);
    uint32_t hdr[4] = {GUARD_MAGIC, (uint32_t)n, (uint32_t)g, (uint32_t)(n >> 32 >> 0)};
    memset((void *)block, GUARD_BYTE, g);
    memcpy((void *)block, hdr, sizeof hdr);
    LLMEM_POISON((void *)block, g);
    uintptr_t tail = user + n, end = block + bsize;
    LLMEM_UNPOISON((void *)tail, end - tail);
    memset((void *)tail, GUARD_BYTE, end - tail);
    LLMEM_POISON((void *)tail, end - tail);
}

/* Read the header at block: requested size and front guard. */
static bool guards_header(uintptr_t block, size_t *n, size_t *g)
{
    uint32_t hdr[4];
    LLMEM_UNPOISON((void *)block, sizeof hdr);
    memcpy(hdr, (void *)block, sizeof hdr);
    LLMEM_POISON((void *)block, sizeof hdr);
    if (hdr[0] != GUARD_MAGIC) return false;
    *n = (size_t)hdr[1] | ((size_t)hdr[3] << 32);
    *g = hdr[2];
    return true;
}

/* True when both guards are intact. */
static bool guards_intact(uintptr_t block, size_t bsize, uintptr_t user, size_t n)
{
    LLMEM_UNPOISON((void *)block, user - block);
    bool ok = llmem__first_unlike((const void *)(block + 16), user - block - 16, GUARD_BYTE) == user - block - 16;
    LLMEM_POISON((void *)block, user - block);
    uintptr_t tail = user + n, end = block + bsize;
    LLMEM_UNPOISON((void *)tail, end - tail);
    ok = ok && llmem__first_unlike((const void *)tail, end - tail, GUARD_BYTE) == end - tail;
    LLMEM_POISON((void *)tail, end - tail);
    return ok;
}

/* ---- freed-block fill (checked host pools) --------------------------------
 *
 * A freed small block is filled with FREED_BYTE; when it is handed out again
 * (and in llmem_pool_check) the fill is verified, so a write through a
 * dangling pointer is reported even without AddressSanitizer. The free
 * list of a checked pool lives out of band, so nothing else writes there.
 * Large blocks are not filled: they can be megabytes, and their pages may be
 * decommitted while free. */

static void freed_fill(uintptr_t block, size_t csize)
{
    LLMEM_UNPOISON((void *)block, csize);
    memset((void *)block, FREED_BYTE, csize);
}

/* Offset of the first byte that is not FREED_BYTE, or csize if none. */
static size_t freed_damage(uintptr_t block, size_t csize)
{
    LLMEM_UNPOISON((void *)block, csize);
    size_t at = llmem__first_unlike((const void *)block, csize, FREED_BYTE);
    LLMEM_POISON((void *)block, csize);
    return at;
}

/* ---- slabs ---------------------------------------------------------------- */

static void partial_add(central *c, slab *s)
{
    s->listed = true;
    s->lprev = NULL;
    s->lnext = c->partial;
    if (c->partial) c->partial->lprev = s;
    c->partial = s;
}

static void partial_remove(central *c, slab *s)
{
    if (!s->listed) return;
    if (s->lprev) s->lprev->lnext = s->lnext;
    else c->partial = s->lnext;
    if (s->lnext) s->lnext->lprev = s->lprev;
    s->listed = false;
}

static slab *slab_new(llmem_pool *p, unsigned cls, llmem_status *st)
{
    size_t bytes = p->cls.slab_bytes[cls];
    pblock *b = llmem__pool_take_pages(p, bytes, p->unit, st);
    if (!b) return NULL;
    slab *s = (slab *)b;
    s->nblocks = p->cls.slab_blocks[cls];
    s->used = s->carved = s->nfree = 0;
    s->free_head = NULL;
    s->free_idx = NULL;
    s->bits = NULL;
    s->listed = false;
    if (!p->inband) s->free_idx = malloc(s->nblocks * sizeof *s->free_idx);
    if (p->checked) s->bits = calloc((s->nblocks + 63) / 64, sizeof *s->bits);
    if ((!p->inband && !s->free_idx) || (p->checked && !s->bits)) {
        free(s->free_idx);
        free(s->bits);
        llmem__pool_put_pages(p, b);
        *st = llmem__fail(LLMEM_ENOMEM, "pool '%s': out of host memory for slab metadata", p->name);
        return NULL;
    }
    b->kind = D_SLAB;
    b->cls = (uint16_t)cls;
    superblock *sb = b->sb;
    size_t u0 = unit_of(sb, b->start, p->ushift), n = b->size >> p->ushift;
    for (size_t i = 0; i < n; i++) {
        sb->owner[u0 + i] = b;
        sb->slab_info[u0 + i] = (uint32_t)(cls + 1) << 24 | (uint32_t)i;
    }
    central *c = &p->central[cls];
    c->slabs++;
    c->empty_slabs++;
    partial_add(c, s);
    p->st.slab_bytes += b->size;
    return s;
}

static void slab_release(llmem_pool *p, slab *s)
{
    central *c = &p->central[s->b.cls];
    partial_remove(c, s);
    c->slabs--;
    c->empty_slabs--;
    free(s->free_idx);
    free(s->bits);
    superblock *sb = s->b.sb;
    size_t u0 = unit_of(sb, s->b.start, p->ushift), n = s->b.size >> p->ushift;
    for (size_t i = 1; i < n; i++) sb->owner[u0 + i] = NULL;
    for (size_t i = 0; i < n; i++) sb->slab_info[u0 + i] = 0;
    p->st.slab_bytes -= s->b.size;
    memset((char *)s + sizeof(pblock), 0, sizeof *s - sizeof(pblock));
    llmem__pool_put_pages(p, &s->b);
}

/* Take one block from a slab with a free or uncarved block. */
static uintptr_t slab_take(llmem_pool *p, slab *s, size_t csize)
{
    uintptr_t b;
    if (p->inband && s->free_head) {
        b = (uintptr_t)s->free_head;
        LLMEM_UNPOISON((void *)b, sizeof(void *));
        s->free_head = *(void **)b;
        LLMEM_POISON((void *)b, sizeof(void *));
        s->nfree--;
    } else if (!p->inband && s->nfree) {
        b = s->b.start + (uintptr_t)s->free_idx[--s->nfree] * csize;
        if (p->checked && p->host) {
            size_t at = freed_damage(b, csize);
            if (at < csize) {
                /* Reported, counted, and handed out anyway: the caller gets
                 * its memory, the bug is named where it can be found. */
                p->st.corruptions_total++;
                LLMEM_UNPOISON((void *)(b + at), 1);
                unsigned v = *(const unsigned char *)(b + at);
                LLMEM_POISON((void *)(b + at), 1);
                llmem__log(LLMEM_LOG_ERROR,
                           "pool '%s': the %zu-byte block at %p was written after it was freed "
                           "(byte %zu is 0x%02x): a use after free",
                           p->name, csize, (void *)b, at, v);
            }
        }
    } else {
        b = s->b.start + (uintptr_t)s->carved++ * csize;
    }
    if (s->used++ == 0) p->central[s->b.cls].empty_slabs--;
    return b;
}

static void slab_put(llmem_pool *p, slab *s, uintptr_t b, uint32_t idx)
{
    central *c = &p->central[s->b.cls];
    if (p->inband) {
        LLMEM_UNPOISON((void *)b, sizeof(void *));
        *(void **)b = s->free_head;
        s->free_head = (void *)b;
    } else {
        s->free_idx[s->nfree] = idx;
    }
    s->nfree++;
    if (p->checked && p->host) freed_fill(b, p->cls.size[s->b.cls]);
    if (p->host) LLMEM_POISON((void *)b, p->cls.size[s->b.cls]);
    if (!s->listed) partial_add(c, s);
    if (--s->used == 0) {
        c->empty_slabs++;
        if (c->empty_slabs > 1) slab_release(p, s);
    }
}

/* Block index of a pointer at offset off in a slab of class cls, exact:
 * (off * magic) >> 40 equals off / size for off below 2^24 * 16; false if
 * off is not a block boundary. */
static inline bool slab_index(const llmem_pool *p, unsigned cls, size_t off, uint32_t *idx)
{
    uint64_t i = ((uint64_t)off * p->magic[cls]) >> MAGIC_SHIFT;
    *idx = (uint32_t)i;
    return i * p->cls.size[cls] == off;
}

/* ---- allocation --------------------------------------------------------- */

/* ---- thread caches -------------------------------------------------------
 *
 * Each thread that uses a pool gets a cache per pool: for every class a
 * small stack of free block pointers (capacity: 16 units' worth of blocks,
 * 64 KiB on the host, 4 to 256 blocks). Allocation pops and free pushes with no lock and no
 * atomic read-modify-write: the counters are plain stores by the owning
 * thread, made with relaxed atomic stores so that stats (which read them
 * under the pool lock) never race. An empty stack is refilled with half its
 * capacity from the slabs, a full one flushes half back, both under the
 * lock. A block freed by another thread joins that thread's cache: blocks
 * of a class are interchangeable. The cache is found through a one-entry
 * thread-local memo in front of a pthread key; the key's destructor flushes
 * it when its thread exits. From the slabs' point of view cached blocks are
 * handed out; the stats subtract them.
 *
 * Checked pools have no thread caches: their per-block state must change
 * at every free, under the lock.
 */
typedef struct tcache {
    llmem_pool *pool;
    struct tcache *next, *prev;         /* the pool's caches, under its lock */
    uint32_t count[LLMEM_MAX_CLASSES];  /* owner: relaxed stores */
    uint32_t cap[LLMEM_MAX_CLASSES];
    uint64_t allocs[LLMEM_MAX_CLASSES]; /* owner: relaxed stores */
    void **items[LLMEM_MAX_CLASSES];
    void *storage[];
} tcache;

static _Thread_local struct {
    const llmem_pool *pool;
    uint64_t id;
    tcache *tc;
} tl_last;

static uint64_t next_pool_id = 1;

static inline void st_u32(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
static inline void st_u64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
static inline uint32_t ld_u32(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

/* Bytes and blocks sitting in thread and transfer caches. Lock held. */
static void cached_totals(const llmem_pool *p, uint64_t *bytes, uint64_t *blocks, uint64_t *per_class)
{
    *bytes = p->xfer_bytes;
    *blocks = p->xfer_blocks;
    if (per_class)
        for (unsigned c = 0; c < p->cls.count; c++) per_class[c] += p->central[c].xcount;
    for (const tcache *t = p->tcaches; t; t = t->next) {
        for (unsigned c = 0; c < p->cls.count; c++) {
            uint32_t n = ld_u32(&t->count[c]);
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
    if (p->tcaches || p->xfer_blocks) {
        uint64_t bytes, blocks;
        cached_totals(p, &bytes, &blocks, NULL);
        used -= bytes;
    }
    if (used > p->st.used_peak_bytes) p->st.used_peak_bytes = used;
}

/* A block of class cls out of the slabs (counted as handed out). Lock held. */
static uintptr_t small_take(llmem_pool *p, unsigned cls, llmem_status *st)
{
    central *c = &p->central[cls];
    slab *s = c->partial;
    if (!s && !(s = slab_new(p, cls, st))) return 0;
    size_t csize = p->cls.size[cls];
    uintptr_t block = slab_take(p, s, csize);
    if (s->used == s->nblocks) partial_remove(c, s);
    if (p->checked) bit_set(s->bits, (uint32_t)((block - s->b.start) / csize));
    c->live++;
    p->st.used_bytes += csize;
    p->st.live_allocations++;
    return block;
}

/* Give a slab block back. Lock held. */
static void small_put(llmem_pool *p, slab *s, uintptr_t block, uint32_t idx)
{
    p->central[s->b.cls].live--;
    p->st.used_bytes -= p->cls.size[s->b.cls];
    p->st.live_allocations--;
    slab_put(p, s, block, idx);
}

/* Flush cached blocks of class c down to `keep`. Lock held. */
static void tcache_flush_class(llmem_pool *p, tcache *t, unsigned c, uint32_t keep)
{
    uint32_t n = t->count[c];
    size_t csize = p->cls.size[c];
    /* Into the transfer cache while it has room: another thread's refill
     * takes the batch as it is, no slab touched. */
    central *x = &p->central[c];
    uint32_t room = x->xcap - x->xcount, move = n - keep < room ? n - keep : room;
    if (move && keep) {
        memcpy(&x->xfer[x->xcount], &t->items[c][n - move], move * sizeof(void *));
        x->xcount += move;
        p->xfer_blocks += move;
        p->xfer_bytes += (uint64_t)move * csize;
        n -= move;
    }
    while (n > keep) {
        uintptr_t b = (uintptr_t)t->items[c][--n];
        superblock *sb = llmem__addrmap_get(b);
        slab *s = (slab *)sb->owner[unit_of(sb, b, p->ushift)];
        uint32_t idx = (uint32_t)((b - s->b.start) / csize);
        if (idx >= s->carved) { /* a bogus free of a never-carved block slipped through release mode */
            llmem__log(LLMEM_LOG_ERROR, "pool '%s': dropped %p from a thread cache: not a carved block", p->name,
                       (void *)b);
            continue;
        }
        small_put(p, s, b, idx);
    }
    st_u32(&t->count[c], n);
}

/* Return a class's transfer cache to its slabs. Lock held. */
static void xfer_drain(llmem_pool *p, unsigned c)
{
    central *x = &p->central[c];
    size_t csize = p->cls.size[c];
    while (x->xcount) {
        uintptr_t b = (uintptr_t)x->xfer[--x->xcount];
        superblock *sb = llmem__addrmap_get(b);
        slab *s = (slab *)sb->owner[unit_of(sb, b, p->ushift)];
        p->xfer_blocks--;
        p->xfer_bytes -= csize;
        small_put(p, s, b, (uint32_t)((b - s->b.start) / csize));
    }
}

static void tcache_flush_all(llmem_pool *p, tcache *t)
{
    for (unsigned c = 0; c < p->cls.count; c++)
        if (t->count[c]) tcache_flush_class(p, t, c, 0);
}

/* Thread exit: return the cache's blocks and fold its counters in. */
static void tcache_destructor(void *v)
{
    tcache *t = v;
    llmem_pool *p = t->pool;
    if (tl_last.tc == t) tl_last.pool = NULL;
    pthread_mutex_lock(&p->lock);
    tcache_flush_all(p, t);
    for (unsigned c = 0; c < p->cls.count; c++) {
        p->st.allocs_total += t->allocs[c];
        p->central[c].allocs += t->allocs[c];
    }
    if (t->prev) t->prev->next = t->next;
    else p->tcaches = t->next;
    if (t->next) t->next->prev = t->prev;
    pthread_mutex_unlock(&p->lock);
    free(t);
}

/* This thread's cache for p, created on first use; NULL when the pool has
 * none or memory for one is short (then the locked path serves). */
static tcache *tcache_get(llmem_pool *p)
{
    if (LLMEM_LIKELY(tl_last.pool == p && tl_last.id == p->id)) return tl_last.tc;
    if (!p->tcache_on) return NULL;
    tcache *t = pthread_getspecific(p->tkey);
    if (!t) {
        t = calloc(1, sizeof *t + p->tcache_slots * sizeof(void *));
        if (!t) return NULL;
        t->pool = p;
        size_t at = 0;
        for (unsigned c = 0; c < p->cls.count; c++) {
            t->cap[c] = p->tcache_cap[c];
            t->items[c] = &t->storage[at];
            at += t->cap[c];
        }
        if (pthread_setspecific(p->tkey, t) != 0) {
            free(t);
            return NULL;
        }
        pthread_mutex_lock(&p->lock);
        t->next = p->tcaches;
        if (p->tcaches) p->tcaches->prev = t;
        p->tcaches = t;
        pthread_mutex_unlock(&p->lock);
    }
    tl_last.pool = p;
    tl_last.id = p->id;
    tl_last.tc = t;
    return t;
}

/* Refill the empty stack of class c with half its capacity; one block
 * goes to the caller. */
static void *tcache_refill(llmem_pool *p, tcache *t, unsigned c, llmem_status *st)
{
    uint32_t want = t->cap[c] / 2 ? t->cap[c] / 2 : 1, got = 0;
    pthread_mutex_lock(&p->lock);
    central *x = &p->central[c];
    if (x->xcount) {
        got = x->xcount < want ? x->xcount : want;
        x->xcount -= got;
        memcpy(t->items[c], &x->xfer[x->xcount], got * sizeof(void *));
        p->xfer_blocks -= got;
        p->xfer_bytes -= (uint64_t)got * p->cls.size[c];
    }
    if (got < want && p->nfenced) llmem__pool_poll_fenced_locked(p);
    while (got < want) {
        uintptr_t b = small_take(p, c, st);
        if (!b && !got && *st == LLMEM_ENOMEM && llmem__pool_wait_one_fenced(p, true)) continue;
        if (!b) break;
        t->items[c][got++] = (void *)b;
    }
    if (got) *st = LLMEM_OK;
    else p->st.failures_total++;
    llmem__pool_note_peak(p);
    pthread_mutex_unlock(&p->lock);
    if (!got) return NULL;
    st_u32(&t->count[c], got - 1);
    return t->items[c][got - 1];
}



/* The class for n bytes at align (0 = the pool's), or cls.count if none. */
static unsigned class_for(const llmem_pool *p, size_t n, size_t align)
{
    if (n > p->cls.max_small) return p->cls.count;
    unsigned c = llmem__class_of(&p->cls, n);
    while (c < p->cls.count && p->cls.size[c] % align) c++;
    return c;
}

static void *alloc_locked(llmem_pool *p, size_t size, size_t align, llmem_status *st)
{
    size_t g = 0, inner = size;
    if (p->checked && p->host) {
        g = guard_front(align);
        if (!llmem__add_ok(size, g + GUARD_TAIL, &inner)) {
            *st = llmem__fail(LLMEM_EOVERFLOW, "pool '%s': %zu bytes overflow with guards", p->name, size);
            return NULL;
        }
    }
    unsigned cls = align <= p->unit ? class_for(p, inner, align) : p->cls.count;
    uintptr_t block, user;
    if (cls < p->cls.count) {
        block = small_take(p, cls, st);
        if (!block) return NULL;
        p->central[cls].allocs++;
        user = block + g;
        if (g) guards_write(block, p->cls.size[cls], user, size);
    } else {
        size_t pages;
        if (!llmem__align_up(inner, p->unit, &pages) || pages > (size_t)PTRDIFF_MAX) {
            *st = llmem__fail(LLMEM_EOVERFLOW, "pool '%s': %zu bytes overflow when rounded to pages", p->name, size);
            return NULL;
        }
        /* With guards the user pointer must keep the alignment: the block
         * starts aligned, and g is a multiple of it. */
        pblock *b = llmem__pool_take_pages(p, pages, align, st);
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
        p->st.used_bytes += b->size;
        p->st.live_allocations++;
        if (g) guards_write(block, b->size, user, size);
    }
    if (p->host) LLMEM_UNPOISON((void *)user, size);
    p->st.allocs_total++;
    llmem__pool_note_peak(p);
    *st = LLMEM_OK;
    return (void *)user;
}

static void *alloc_failed(llmem_status st, llmem_status *status)
{
    if (status) *status = st;
    return NULL;
}

/* Everything but a thread-cache hit: the cache's first use and refills,
 * bad input, large and aligned requests, checked pools. */
static __attribute__((noinline)) void *alloc_slow(llmem_pool *p, size_t size, size_t align, llmem_status *status)
{
    if (p && size - 1 < p->cls.max_small && align <= p->align && !(align & (align - 1))) {
        tcache *t = tcache_get(p);
        if (t) {
            unsigned c = llmem__class_of(&p->cls, size);
            void *b;
            uint32_t n = t->count[c];
            if (n) {
                b = t->items[c][n - 1];
                st_u32(&t->count[c], n - 1);
            } else {
                llmem_status st;
                b = tcache_refill(p, t, c, &st);
                if (!b) return alloc_failed(st, status);
            }
            st_u64(&t->allocs[c], t->allocs[c] + 1);
            if (p->host) LLMEM_UNPOISON(b, size);
            if (status) *status = LLMEM_OK;
            return b;
        }
    }
    if (!p) return alloc_failed(llmem__fail(LLMEM_EINVAL, "pool: null pool"), status);
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
        p->st.failures_total++;
        pthread_mutex_unlock(&p->lock);
        return alloc_failed(st, status);
    }
    if (align < p->align) align = p->align;
    pthread_mutex_lock(&p->lock);
    if (p->nfenced) llmem__pool_poll_fenced_locked(p);
    void *r = alloc_locked(p, size, align, &st);
    /* Memory still in flight is not memory lost: wait for it before failing. */
    while (!r && st == LLMEM_ENOMEM && llmem__pool_wait_one_fenced(p, true)) r = alloc_locked(p, size, align, &st);
    if (!r) p->st.failures_total++;
    pthread_mutex_unlock(&p->lock);
    if (status) *status = st;
    return r;
}

/* The fast path: a small block popped from this thread's cache, found
 * through the thread-local memo. Anything else goes to alloc_slow. */
static inline void *alloc_fast(llmem_pool *p, size_t size, llmem_status *status)
{
    if (LLMEM_LIKELY(p && size - 1 < p->cls.max_small && tl_last.pool == p && tl_last.id == p->id)) {
        tcache *t = tl_last.tc;
        unsigned c = llmem__class_of(&p->cls, size);
        uint32_t n = t->count[c];
        if (LLMEM_LIKELY(n)) {
            void *b = t->items[c][n - 1];
            st_u32(&t->count[c], n - 1);
            st_u64(&t->allocs[c], t->allocs[c] + 1);
            if (p->host) LLMEM_UNPOISON(b, size);
            if (status) *status = LLMEM_OK;
            return b;
        }
    }
    return alloc_slow(p, size, 0, status);
}

void *llmem_pool_alloc_aligned(llmem_pool *p, size_t size, size_t align, llmem_status *status)
{
    void *r = LLMEM_LIKELY(p && align <= p->align && !(align & (align - 1))) ? alloc_fast(p, size, status)
                                                                               : alloc_slow(p, size, align, status);
    if (LLMEM_UNLIKELY(p && p->profile) && r) llmem_profile_record_alloc(p->profile, size, r);
    return r;
}

void *llmem_pool_alloc(llmem_pool *p, size_t size, llmem_status *status)
{
    void *r = alloc_fast(p, size, status);
    if (LLMEM_UNLIKELY(p && p->profile) && r) llmem_profile_record_alloc(p->profile, size, r);
    return r;
}

void *llmem_pool_calloc(llmem_pool *p, size_t count, size_t size, llmem_status *status)
{
    size_t n;
    if (!p) return alloc_failed(llmem__fail(LLMEM_EINVAL, "pool: null pool"), status);
    if (!p->host)
        return alloc_failed(llmem__fail(LLMEM_ENOTSUP, "pool '%s': calloc on device memory", p->name), status);
    if (!llmem__mul_ok(count, size, &n))
        return alloc_failed(llmem__fail(LLMEM_EOVERFLOW, "pool '%s': calloc of %zu x %zu overflows", p->name,
                                           count, size),
                            status);
    void *r = llmem_pool_alloc(p, n, status);
    if (r) memset(r, 0, n);
    return r;
}

/* ---- free --------------------------------------------------------------- */

/* What a pointer is, found under the lock. */
typedef struct located {
    superblock *sb;
    pblock *b;       /* D_SLAB or D_LARGE descriptor */
    uint32_t idx;    /* slab block index */
    uintptr_t block; /* block start */
    size_t off;      /* offset into the block, when not its start */
    size_t extent;   /* size of the run or block found, for messages */
} located;

typedef enum where {
    AT_BLOCK = 0,    /* the start of a live block */
    NOT_OURS,        /* not in this pool */
    IN_FREE_RUN,     /* in a free run: freed already */
    FREE_SLAB_BLOCK, /* a slab block that is free: freed already */
    INSIDE_BLOCK,    /* inside a live block, not its start */
    BAD_HEADER,      /* checked host: the guard header is damaged */
    NOT_A_BLOCK,     /* in a superblock but no block starts there */
    FENCED           /* a live block whose fenced free is pending */
} where;

/* Find the block containing a in a superblock: the nearest owner entry at
 * or before it. Lock held. */
static pblock *containing(const llmem_pool *p, const superblock *sb, uintptr_t a)
{
    for (size_t u = unit_of(sb, a, p->ushift) + 1; u-- > 0;) {
        pblock *b = sb->owner[u];
        if (b) return a < b->start + b->size ? b : NULL;
    }
    return NULL;
}

/* Where ptr lies. No side effect. Lock held. */
static where find_block_raw(const llmem_pool *p, uintptr_t a, located *l)
{
    memset(l, 0, sizeof *l);
    superblock *sb = llmem__addrmap_get(a);
    if (!sb || sb->pool != p) return NOT_OURS;
    l->sb = sb;
    pblock *b = sb->owner[unit_of(sb, a, p->ushift)];
    l->b = b;
    if (b && b->kind == D_SLAB) {
        slab *s = (slab *)b;
        size_t csize = p->cls.size[b->cls], off = a - b->start;
        uint32_t idx = (uint32_t)(off / csize);
        l->extent = csize;
        l->idx = idx;
        l->block = b->start + (uintptr_t)idx * csize;
        l->off = off % csize;
        if (p->checked && p->host) {
            /* The user pointer sits g bytes into its block. */
            if (idx >= s->carved || !bit_get(s->bits, idx)) return FREE_SLAB_BLOCK;
            size_t n, g;
            if (!guards_header(l->block, &n, &g)) return BAD_HEADER;
            if (l->block + g != a) return INSIDE_BLOCK;
            return AT_BLOCK;
        }
        if (!slab_index(p, b->cls, off, &idx)) return INSIDE_BLOCK;
        if (idx >= s->carved || (p->checked && !bit_get(s->bits, idx))) return FREE_SLAB_BLOCK;
        return AT_BLOCK;
    }
    if (b && b->kind == D_LARGE && b->user == a) {
        l->block = b->start;
        return AT_BLOCK;
    }
    pblock *c = containing(p, sb, a);
    if (!c) return NOT_A_BLOCK;
    l->b = c;
    l->extent = c->size;
    if (c->kind == D_FREE) return IN_FREE_RUN;
    if (c->kind == D_LARGE) {
        l->off = a - c->user;
        return INSIDE_BLOCK;
    }
    return NOT_A_BLOCK;
}

/* find_block_raw, and FENCED for a block whose fenced free is pending. */
static where find_block(const llmem_pool *p, uintptr_t a, located *l)
{
    where w = find_block_raw(p, a, l);
    if (w == AT_BLOCK && p->nfenced &&
        (l->b->kind == D_LARGE ? l->b->fenced : llmem__pool_fenced_has(p, a)))
        return FENCED;
    return w;
}

/* Count, log and describe a refused free. Lock held. */
static llmem_status refuse_free(llmem_pool *p, uintptr_t a, where w, const located *l)
{
    p->st.invalid_frees_total++;
    void *ptr = (void *)a;
    switch (w) {
    case NOT_OURS:
        return llmem__fail_log(LLMEM_LOG_WARN, LLMEM_EFOREIGN, "pool '%s': free of %p, which is not from this pool",
                               p->name, ptr);
    case IN_FREE_RUN:
        return llmem__fail_log(LLMEM_LOG_WARN, LLMEM_EDOUBLEFREE,
                               "pool '%s': double free of %p (it lies in a free run of %zu bytes)", p->name, ptr,
                               l->extent);
    case FREE_SLAB_BLOCK:
        return llmem__fail_log(LLMEM_LOG_WARN, LLMEM_EDOUBLEFREE,
                               "pool '%s': double free of %p (block %u of a %zu-byte class slab is free)", p->name,
                               ptr, l->idx, l->extent);
    case INSIDE_BLOCK:
        return llmem__fail_log(LLMEM_LOG_WARN, LLMEM_EFOREIGN,
                               "pool '%s': free of %p, %zu bytes into a live %zu-byte block, not its start", p->name,
                               ptr, l->off, l->extent);
    case FENCED:
        return llmem__fail_log(LLMEM_LOG_WARN, LLMEM_EDOUBLEFREE,
                               "pool '%s': double free of %p (its fenced free is pending)", p->name, ptr);
    case BAD_HEADER:
        p->st.corruptions_total++;
        return llmem__fail_log(LLMEM_LOG_ERROR, LLMEM_ECORRUPT,
                               "pool '%s': free of %p: the guard header of its %zu-byte block at %p is damaged",
                               p->name, ptr, l->extent, (void *)l->block);
    default:
        return llmem__fail_log(LLMEM_LOG_WARN, LLMEM_EFOREIGN,
                               "pool '%s': free of %p, which is not the start of a live block", p->name, ptr);
    }
}

static llmem_status free_located(llmem_pool *p, uintptr_t a, located *l)
{
    llmem_status st = LLMEM_OK;
    pblock *b = l->b;
    if (b->kind == D_SLAB) {
        slab *s = (slab *)b;
        size_t csize = p->cls.size[b->cls];
        if (p->checked) {
            if (p->host) {
                size_t n = 0, g = 0;
                if (!guards_header(l->block, &n, &g) || !guards_intact(l->block, csize, a, n)) {
                    p->st.corruptions_total++;
                    st = llmem__fail_log(LLMEM_LOG_ERROR, LLMEM_ECORRUPT,
                                         "pool '%s': guard canary around the %zu-byte block at %p (%zu bytes asked) "
                                         "is damaged: something wrote out of bounds; the block is freed",
                                         p->name, csize, (void *)a, n);
                }
            }
            bit_clear(s->bits, l->idx);
        }
        small_put(p, s, l->block, l->idx);
    } else {
        if (p->checked && p->host && !guards_intact(b->start, b->size, b->user, b->requested)) {
            p->st.corruptions_total++;
            st = llmem__fail_log(LLMEM_LOG_ERROR, LLMEM_ECORRUPT,
                                 "pool '%s': guard canary around the block at %p (%zu bytes asked) is damaged: "
                                 "something wrote out of bounds; the block is freed",
                                 p->name, (void *)a, b->requested);
        }
        superblock *sb = l->sb;
        if (b->user != b->start) sb->owner[unit_of(sb, b->user, p->ushift)] = NULL;
        p->st.used_bytes -= b->size;
        p->st.live_allocations--;
        llmem__pool_put_pages(p, b);
    }
    return st;
}

/* The rules of every free (`what` names the call in messages): a live raw
 * block of this pool, not a handle's, not pending a fenced free; else the
 * refusal, counted and logged. Lock held. */
static llmem_status check_free(llmem_pool *p, uintptr_t a, located *l, const char *what)
{
    where w = find_block(p, a, l);
    if (w != AT_BLOCK) return refuse_free(p, a, w, l);
    if (l->b->kind == D_LARGE && l->b->handle) {
        p->st.invalid_frees_total++;
        return llmem__fail_log(LLMEM_LOG_WARN, LLMEM_EINVAL,
                               "pool '%s': %s of %p, which belongs to a handle: use llmem_pool_hfree", p->name, what,
                               (void *)a);
    }
    return LLMEM_OK;
}

llmem_status llmem__pool_validate_free(llmem_pool *p, uintptr_t a, size_t *bytes, pblock **b)
{
    located l;
    llmem_status st = check_free(p, a, &l, "fenced free");
    if (st) return st;
    *bytes = l.b->kind == D_SLAB ? p->cls.size[l.b->cls] : l.b->size;
    *b = l.b;
    return LLMEM_OK;
}

llmem_status llmem__pool_free_locked(llmem_pool *p, uintptr_t a, const char *what)
{
    located l;
    llmem_status st = check_free(p, a, &l, what);
    return st ? st : free_located(p, a, &l);
}

llmem_status llmem__pool_free_valid(llmem_pool *p, uintptr_t a)
{
    located l;
    where w = find_block_raw(p, a, &l);
    if (w != AT_BLOCK) return refuse_free(p, a, w, &l); /* cannot happen: the block was validated */
    return free_located(p, a, &l);
}

/* The slab block a pointer starts, read from the superblock's slab table
 * without touching the slab descriptor: its class, or -1 if it is not a
 * block boundary of a slab of this pool (then the slow path explains). */
static inline int small_class_of(const llmem_pool *p, uintptr_t a)
{
    superblock *sb = llmem__addrmap_get(a);
    if (!sb || sb->pool != p) return -1;
    size_t u = unit_of(sb, a, p->ushift);
    uint32_t info = sb->slab_info[u];
    if (!info) return -1;
    unsigned c = (info >> 24) - 1;
    /* Offset into the slab: into this unit, plus the units before it. */
    size_t off = ((a - sb->base) & (p->unit - 1)) + ((size_t)(info & 0xffffff) << p->ushift);
    uint32_t idx;
    return slab_index(p, c, off, &idx) ? (int)c : -1;
}

/* Everything but a push onto a thread cache with room: the cache's first
 * use and flushes, large blocks, checked pools, bad pointers. */
static __attribute__((noinline)) llmem_status free_slow(llmem_pool *p, void *ptr)
{
    if (!p) return llmem__fail(LLMEM_EINVAL, "pool: null pool");
    if (!ptr) return LLMEM_OK;
    if (p->profile) llmem_profile_record_free(p->profile, ptr);
    if (p->tcache_on) {
        int c = small_class_of(p, (uintptr_t)ptr);
        tcache *t = c >= 0 ? tcache_get(p) : NULL;
        if (t) {
            uint32_t n = t->count[c];
            if (n == t->cap[c]) {
                pthread_mutex_lock(&p->lock);
                tcache_flush_class(p, t, (unsigned)c, t->cap[c] / 2);
                pthread_mutex_unlock(&p->lock);
                n = t->count[c];
            }
            t->items[c][n] = ptr;
            st_u32(&t->count[c], n + 1);
            if (p->host) LLMEM_POISON(ptr, p->cls.size[c]);
            return LLMEM_OK;
        }
    }
    pthread_mutex_lock(&p->lock);
    llmem_status st = llmem__pool_free_locked(p, (uintptr_t)ptr, "free");
    pthread_mutex_unlock(&p->lock);
    return st;
}

/* The fast path: a small block pushed onto this thread's cache. The slab
 * cannot change under us: it holds this live block. */
llmem_status llmem_pool_free(llmem_pool *p, void *ptr)
{
    if (LLMEM_LIKELY(p && ptr && tl_last.pool == p && tl_last.id == p->id && !p->profile)) {
        int c = small_class_of(p, (uintptr_t)ptr);
        tcache *t = tl_last.tc;
        if (LLMEM_LIKELY(c >= 0)) {
            uint32_t n = t->count[c];
            if (LLMEM_LIKELY(n < t->cap[c])) {
                t->items[c][n] = ptr;
                st_u32(&t->count[c], n + 1);
                    if (p->host) LLMEM_POISON(ptr, p->cls.size[c]);
                return LLMEM_OK;
            }
        }
    }
    return free_slow(p, ptr);
}

/* Usable bytes at a located block. Lock held. */
static size_t usable_locked(const llmem_pool *p, uintptr_t a, const located *l)
{
    if (l->b->kind == D_SLAB) {
        size_t csize = p->cls.size[l->b->cls];
        if (p->checked && p->host) {
            size_t n, g;
            return guards_header(l->block, &n, &g) ? n : 0;
        }
        return csize;
    }
    if (p->checked && p->host) return l->b->requested;
    return l->b->start + l->b->size - a;
}

size_t llmem_pool_usable_size(const llmem_pool *cp, const void *ptr)
{
    if (!cp || !ptr) return 0;
    llmem_pool *p = (llmem_pool *)(uintptr_t)cp; /* the lock is internal state */
    pthread_mutex_lock(&p->lock);
    located l;
    size_t n = find_block(p, (uintptr_t)ptr, &l) == AT_BLOCK ? usable_locked(p, (uintptr_t)ptr, &l) : 0;
    pthread_mutex_unlock(&p->lock);
    return n;
}

void *llmem_pool_realloc(llmem_pool *p, void *ptr, size_t size, llmem_status *status)
{
    if (!p) return alloc_failed(llmem__fail(LLMEM_EINVAL, "pool: null pool"), status);
    if (!ptr) return llmem_pool_alloc(p, size, status);
    if (size == 0)
        return alloc_failed(llmem__fail(LLMEM_EINVAL, "pool '%s': realloc to 0 bytes (free it instead)", p->name),
                            status);
    if (size > (size_t)PTRDIFF_MAX)
        return alloc_failed(llmem__fail(LLMEM_EOVERFLOW, "pool '%s': realloc to %zu bytes overflows", p->name, size),
                            status);
    uintptr_t a = (uintptr_t)ptr;
    pthread_mutex_lock(&p->lock);
    located l;
    where w = find_block(p, a, &l);
    if (w != AT_BLOCK || (l.b->kind == D_LARGE && l.b->handle)) {
        llmem_status st = w != AT_BLOCK ? refuse_free(p, a, w, &l)
                                        : llmem__fail(LLMEM_EINVAL, "pool '%s': realloc of %p, which belongs to a handle",
                                                      p->name, ptr);
        pthread_mutex_unlock(&p->lock);
        return alloc_failed(st, status);
    }
    size_t usable = usable_locked(p, a, &l);
    bool guarded = p->checked && p->host;
    /* Fits and does not waste more than half: stay in place. Guarded blocks
     * only if the guards can be moved within the block. */
    size_t room = guarded ? (l.b->kind == D_SLAB ? p->cls.size[l.b->cls] : l.b->size) - (a - l.block) - GUARD_TAIL
                          : usable;
    if (size <= room && size >= usable / 2) {
        if (guarded) {
            size_t bsize = l.b->kind == D_SLAB ? p->cls.size[l.b->cls] : l.b->size;
            if (l.b->kind == D_LARGE) l.b->requested = size;
            LLMEM_UNPOISON(ptr, size);
            guards_write(l.block, bsize, a, size);
        } else if (p->host) {
            LLMEM_UNPOISON(ptr, size);
        }
        pthread_mutex_unlock(&p->lock);
        if (status) *status = LLMEM_OK;
        return ptr;
    }
    llmem_status st;
    void *n = alloc_locked(p, size, p->align, &st);
    if (!n) {
        p->st.failures_total++;
        pthread_mutex_unlock(&p->lock);
        return alloc_failed(st, status);
    }
    size_t keep = usable < size ? usable : size;
    if (p->host) {
        LLMEM_UNPOISON(ptr, keep); /* release mode does not know how much of the old block was asked for */
        memcpy(n, ptr, keep);
    } else {
        st = llmem_resource_copy(p->res, n, ptr, keep);
        if (st) {
            located nl;
            find_block(p, (uintptr_t)n, &nl);
            free_located(p, (uintptr_t)n, &nl);
            p->st.allocs_total--; /* the move never happened */
            p->st.failures_total++;
            pthread_mutex_unlock(&p->lock);
            return alloc_failed(st, status);
        }
    }
    free_located(p, a, &l);
    pthread_mutex_unlock(&p->lock);
    if (status) *status = LLMEM_OK;
    return n;
}

bool llmem_pool_owns(const llmem_pool *cp, const void *ptr)
{
    if (!cp || !ptr) return false;
    llmem_pool *p = (llmem_pool *)(uintptr_t)cp;
    pthread_mutex_lock(&p->lock);
    located l;
    where w = find_block(p, (uintptr_t)ptr, &l);
    pthread_mutex_unlock(&p->lock);
    return w == AT_BLOCK || w == INSIDE_BLOCK;
}

/* ---- control ---------------------------------------------------------------- */

llmem_status llmem_pool_reserve(llmem_pool *p, size_t bytes)
{
    if (!p) return llmem__fail(LLMEM_EINVAL, "pool: null pool");
    if (bytes == 0) return LLMEM_OK;
    size_t need;
    if (!llmem__align_up(bytes, p->unit, &need) || need > (size_t)PTRDIFF_MAX)
        return llmem__fail(LLMEM_EOVERFLOW, "pool '%s': reserve of %zu bytes overflows", p->name, bytes);
    pthread_mutex_lock(&p->lock);
    llmem_status st = LLMEM_OK;
    pblock *b = node_block(llmem__avl_last(&p->free_tree));
    if (!b || b->size < need) {
        st = grow(p, need, p->unit);
        b = node_block(llmem__avl_last(&p->free_tree));
    }
    if (!st) {
        st = llmem__pool_commit_range(p, b->sb, b->start, need);
        /* Reserved for use: not decaying yet. */
        if (b->sb->empty) b->sb->empty_since = llmem__now_ns();
        b->free_since = llmem__now_ns();
        b->purged = false;
    }
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
    tcache *t = tcache_get(p);
    pthread_mutex_lock(&p->lock);
    if (t) tcache_flush_all(p, t); /* other threads' caches stay theirs */
    for (unsigned c = 0; c < p->cls.count; c++) xfer_drain(p, c);
    if (p->nfenced) llmem__pool_poll_fenced_locked(p); /* finished work gives its blocks back too */
    size_t released = 0;
    /* Cached empty slabs first: returning them may empty whole superblocks. */
    for (unsigned c = 0; c < p->cls.count && p->st.committed_bytes > target; c++) {
        for (slab *s = p->central[c].partial, *n; s && p->central[c].empty_slabs; s = n) {
            n = s->lnext;
            if (s->used == 0) slab_release(p, s);
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
    for (llmem_avl_node *n = llmem__avl_last(&p->free_tree); n && p->st.committed_bytes > target;
         n = llmem__avl_prev(n))
        released += decommit_block(p, node_block(n), p->st.committed_bytes - target);
    pthread_mutex_unlock(&p->lock);
    return released;
}

size_t llmem_pool_trim(llmem_pool *p) { return llmem_pool_shrink(p, 0); }

/* ---- invariants ------------------------------------------------------------- */

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
    size_t free_blocks = 0;
    uint64_t class_live[LLMEM_MAX_CLASSES] = {0}, class_slabs[LLMEM_MAX_CLASSES] = {0};
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
            if (sb->owner[u0] != b) BAD("pool '%s': owner entry of block %p is wrong", p->name, (void *)b->start);
            for (size_t i = 1; i < n; i++) {
                pblock *o = sb->owner[u0 + i];
                bool ok = b->kind == D_SLAB ? o == b
                                            : o == NULL || (b->kind == D_LARGE && o == b &&
                                                            unit_of(sb, b->user, p->ushift) == u0 + i);
                if (!ok) BAD("pool '%s': owner entry %zu of block %p is wrong", p->name, i, (void *)b->start);
            }
            if (b->kind == D_FREE) {
                if (prev && prev->kind == D_FREE)
                    BAD("pool '%s': free blocks %p and %p are adjacent", p->name, (void *)prev->start,
                        (void *)b->start);
                free_bytes += b->size;
                free_blocks++;
            } else if (b->kind == D_LARGE) {
                if (b->user < b->start || b->requested > b->start + b->size - b->user)
                    BAD("pool '%s': large block %p has a bad user range", p->name, (void *)b->start);
                for (size_t i = 0; i < n; i++)
                    if (bit_get(sb->decommitted, u0 + i))
                        BAD("pool '%s': live block %p has decommitted pages", p->name, (void *)b->start);
                used += b->size;
                sb_used += b->size;
                live++;
            } else if (b->kind == D_SLAB) {
                slab *s = (slab *)b;
                if (b->cls >= p->cls.count || b->size != p->cls.slab_bytes[b->cls] ||
                    s->nblocks != p->cls.slab_blocks[b->cls] || s->carved > s->nblocks ||
                    s->used + s->nfree != s->carved)
                    BAD("pool '%s': slab %p has inconsistent counts", p->name, (void *)b->start);
                size_t csize = p->cls.size[b->cls];
                if (p->inband) {
                    size_t len = 0;
                    for (void *f = s->free_head; f; len++) {
                        if ((uintptr_t)f < b->start || (uintptr_t)f >= b->start + (uintptr_t)s->carved * csize ||
                            ((uintptr_t)f - b->start) % csize || len > s->nfree)
                            BAD("pool '%s': slab %p has a bad free list", p->name, (void *)b->start);
                        LLMEM_UNPOISON(f, sizeof(void *));
                        void *next = *(void **)f;
                        LLMEM_POISON(f, sizeof(void *));
                        f = next;
                    }
                    if (len != s->nfree) BAD("pool '%s': slab %p free list length", p->name, (void *)b->start);
                } else {
                    for (uint32_t i = 0; i < s->nfree; i++) {
                        if (s->free_idx[i] >= s->carved)
                            BAD("pool '%s': slab %p has a bad free index", p->name, (void *)b->start);
                        uintptr_t fb = b->start + (uintptr_t)s->free_idx[i] * csize;
                        if (p->checked && p->host && freed_damage(fb, csize) < csize)
                            BAD("pool '%s': the free %zu-byte block at %p was written after it was freed "
                                "(a use after free)", p->name, csize, (void *)fb);
                    }
                }
                if (p->checked) {
                    uint32_t set = 0;
                    for (uint32_t i = 0; i < s->nblocks; i++) set += bit_get(s->bits, i);
                    if (set != s->used) BAD("pool '%s': slab %p state bits disagree", p->name, (void *)b->start);
                }
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
    if (llmem__avl_check(&p->free_tree, free_cmp) != (long)free_blocks)
        BAD("pool '%s': the free tree does not hold exactly the free blocks", p->name);
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

void llmem_pool_note_stage(llmem_pool *p, const llmem_stage_event *ev)
{
    if (!p || !ev || (unsigned)ev->stage >= LLMEM_STAGE_COUNT_) return;
    /* Under the lock: get_stats copies the figures as a whole. Once per
     * step, so the lock costs nothing that matters. */
    pthread_mutex_lock(&p->lock);
    if (p->st.stage != (uint64_t)ev->stage) p->st.stage_changes_total++;
    p->st.stage = (uint64_t)ev->stage;
    if (ev->stage == LLMEM_STAGE_PREFILL) p->st.prefill_steps_total++;
    if (ev->stage == LLMEM_STAGE_DECODE) p->st.decode_steps_total++;
    pthread_mutex_unlock(&p->lock);
}

llmem_status llmem_pool_get_stats(const llmem_pool *cp, llmem_pool_stats *out)
{
    if (!cp || !out) return llmem__fail(LLMEM_EINVAL, "pool stats: null argument");
    llmem_pool *p = (llmem_pool *)(uintptr_t)cp;
    pthread_mutex_lock(&p->lock);
    llmem_pool_stats s = p->st;
    pblock *big = node_block(llmem__avl_last(&p->free_tree));
    /* Blocks in thread caches are free to the user; their owners' counters
     * are read as they are now, so with threads running the figures are a
     * snapshot, clamped so that they never wrap. */
    uint64_t bytes, blocks;
    cached_totals(p, &bytes, &blocks, NULL);
    s.used_bytes = s.used_bytes > bytes ? s.used_bytes - bytes : 0;
    s.live_allocations = s.live_allocations > blocks ? s.live_allocations - blocks : 0;
    /* The peak is sampled when caches refill: never report it below now. */
    if (s.used_peak_bytes < s.used_bytes) s.used_peak_bytes = s.used_bytes;
    for (const tcache *t = p->tcaches; t; t = t->next)
        for (unsigned c = 0; c < p->cls.count; c++) s.allocs_total += __atomic_load_n(&t->allocs[c], __ATOMIC_RELAXED);
    /* Every free ends an allocation: counting them would cost the free path
     * a store it does not need. */
    s.frees_total = s.allocs_total > s.live_allocations ? s.allocs_total - s.live_allocations : 0;
    s.largest_free_bytes = big ? big->size : 0;
    pthread_mutex_unlock(&p->lock);
    s.fragmentation = s.free_bytes ? 1.0 - (double)s.largest_free_bytes / (double)s.free_bytes : 0.0;
    llmem__stats_out(out, &s, sizeof s);
    return LLMEM_OK;
}

llmem_status llmem_pool_get_class_stats(const llmem_pool *cp, llmem_pool_class_stats *out, size_t cap, size_t *count)
{
    if (!cp || (cap && !out)) return llmem__fail(LLMEM_EINVAL, "pool class stats: null argument");
    llmem_pool *p = (llmem_pool *)(uintptr_t)cp;
    pthread_mutex_lock(&p->lock);
    uint64_t cached[LLMEM_MAX_CLASSES] = {0}, bytes, blocks;
    cached_totals(p, &bytes, &blocks, cached);
    for (unsigned c = 0; c < p->cls.count && c < cap; c++) {
        uint64_t allocs = p->central[c].allocs, live = p->central[c].live;
        for (const tcache *t = p->tcaches; t; t = t->next) allocs += __atomic_load_n(&t->allocs[c], __ATOMIC_RELAXED);
        out[c] = (llmem_pool_class_stats){sizeof *out, p->cls.size[c], p->cls.slab_bytes[c], p->central[c].slabs,
                                          live > cached[c] ? live - cached[c] : 0, allocs};
    }
    if (count) *count = p->cls.count;
    pthread_mutex_unlock(&p->lock);
    return LLMEM_OK;
}

#define F(kind, name, help) {#name, help, LLMEM_METRIC_##kind, LLMEM_VALUE_U64, offsetof(llmem_pool_stats, name)}
static const llmem_stat_field pool_fields[] = {
    F(GAUGE, reserved_bytes, "Bytes mapped in superblocks."),
    F(GAUGE, reserved_peak_bytes, "Highest reserved_bytes."),
    F(GAUGE, committed_bytes, "Reserved bytes not decommitted."),
    F(GAUGE, used_bytes, "Bytes in live blocks (class or page-rounded sizes)."),
    F(GAUGE, used_peak_bytes, "Highest used_bytes."),
    F(GAUGE, live_allocations, "Live allocations."),
    F(GAUGE, free_bytes, "Bytes in free page runs."),
    F(GAUGE, largest_free_bytes, "The largest free page run."),
    {"fragmentation", "1 - largest free run / free bytes.", LLMEM_METRIC_GAUGE, LLMEM_VALUE_DOUBLE,
     offsetof(llmem_pool_stats, fragmentation)},
    F(GAUGE, slab_bytes, "Bytes in slabs of small blocks."),
    F(GAUGE, superblocks, "Superblocks mapped."),
    F(COUNTER, allocs_total, "Allocations served."),
    F(COUNTER, frees_total, "Blocks freed."),
    F(COUNTER, grows_total, "Superblocks mapped."),
    F(COUNTER, shrinks_total, "Superblocks unmapped."),
    F(COUNTER, decommitted_bytes_total, "Bytes decommitted inside superblocks."),
    F(COUNTER, resource_calls_total, "Map, unmap, commit and decommit calls made."),
    F(COUNTER, failures_total, "Allocations refused."),
    F(COUNTER, invalid_frees_total, "Foreign and double frees refused."),
    F(COUNTER, corruptions_total, "Damaged guard canaries found."),
    F(GAUGE, handles, "Live movable allocations (handles)."),
    F(COUNTER, compactions_total, "Compactions run."),
    F(COUNTER, moved_bytes_total, "Bytes moved by compaction."),
    F(GAUGE, stage, "The stage last noted: 0 idle, 1 load, 2 prefill, 3 decode."),
    F(COUNTER, stage_changes_total, "Stage notes that changed the stage."),
    F(COUNTER, prefill_steps_total, "Prefill steps noted."),
    F(COUNTER, decode_steps_total, "Decode steps noted."),
    F(GAUGE, fenced_pending, "Blocks freed with a fence that is not done yet."),
    F(GAUGE, fenced_pending_bytes, "Bytes of blocks whose fenced free is pending."),
    F(COUNTER, fenced_frees_total, "Fenced frees accepted."),
    F(COUNTER, fence_waits_total, "Fences waited for because an allocation would have failed."),
};
#undef F
static const llmem_stats_schema pool_schema = {"pool", sizeof(llmem_pool_stats), LLMEM_ARRAY_LEN(pool_fields),
                                               pool_fields};
const llmem_stats_schema *llmem_pool_stats_schema(void) { return &pool_schema; }

#define F(kind, name, help) {#name, help, LLMEM_METRIC_##kind, LLMEM_VALUE_U64, offsetof(llmem_pool_class_stats, name)}
static const llmem_stat_field class_fields[] = {
    F(GAUGE, class_bytes, "Block size of the class."),
    F(GAUGE, slab_bytes, "Bytes per slab."),
    F(GAUGE, slabs, "Slabs held."),
    F(GAUGE, live_blocks, "Live blocks."),
    F(COUNTER, allocs_total, "Blocks allocated."),
};
#undef F
static const llmem_stats_schema class_schema = {"pool_class", sizeof(llmem_pool_class_stats),
                                                LLMEM_ARRAY_LEN(class_fields), class_fields};
const llmem_stats_schema *llmem_pool_class_stats_schema(void) { return &class_schema; }

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
    if (!llmem__align_up(first, p->sb_align, &p->next_sb) || !llmem__align_up(max, p->sb_align, &p->max_sb) ||
        p->next_sb > (size_t)PTRDIFF_MAX / 2 || p->max_sb > (size_t)PTRDIFF_MAX / 2)
        return llmem__fail(LLMEM_EOVERFLOW, "pool '%s': superblock sizes overflow", p->name);
    if (p->max_sb < p->next_sb) p->max_sb = p->next_sb;
    p->first_sb = p->next_sb;
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
    p->decay_ns = (uint64_t)(o->decay_ms ? o->decay_ms : 250) * 1000000u;
    if ((unsigned)o->purge > LLMEM_POOL_PURGE_MANUAL)
        return llmem__fail(LLMEM_EINVAL, "pool '%s': unknown purge mode %d", p->name, (int)o->purge);
    p->purge_background = o->purge != LLMEM_POOL_PURGE_MANUAL;
    p->checked = o->checked;
    p->inband = p->host && !p->checked;
    if (o->extra_class_count && !o->extra_classes)
        return llmem__fail(LLMEM_EINVAL, "pool '%s': extra_class_count without extra_classes", p->name);
    if (o->extra_class_count > LLMEM_POOL_MAX_EXTRA_CLASSES ||
        !llmem__classes_init(&p->cls, p->align, p->unit, o->extra_classes, o->extra_class_count))
        return llmem__fail(LLMEM_EINVAL, "pool '%s': at most %d extra classes", p->name, LLMEM_POOL_MAX_EXTRA_CLASSES);
    p->profile = o->profile;
    for (unsigned c = 0; c < p->cls.count; c++)
        p->magic[c] = (((uint64_t)1 << MAGIC_SHIFT) + p->cls.size[c] - 1) / p->cls.size[c];
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
    }
    if (st) {
        free(p);
        return st;
    }
    pthread_mutex_init(&p->lock, NULL);
    p->st.struct_size = sizeof p->st;
    p->id = __atomic_fetch_add(&next_pool_id, 1, __ATOMIC_RELAXED);
    /* Thread caches, unless checked; without a pthread key left (over a
     * thousand pools alive) the pool simply runs on its lock. */
    p->tcache_on = !p->checked && pthread_key_create(&p->tkey, tcache_destructor) == 0;
    size_t xslots = 0;
    for (unsigned c = 0; c < p->cls.count; c++) {
        size_t cap = 16 * p->unit / p->cls.size[c];
        p->tcache_cap[c] = (uint32_t)(cap < 4 ? 4 : cap > 256 ? 256 : cap);
        p->tcache_slots += p->tcache_cap[c];
        p->central[c].xcap = p->tcache_on ? 4 * p->tcache_cap[c] : 0;
        xslots += p->central[c].xcap;
    }
    if (xslots) {
        p->xfer_storage = malloc(xslots * sizeof(void *));
        size_t at = 0;
        for (unsigned c = 0; c < p->cls.count; c++) {
            p->central[c].xfer = p->xfer_storage ? &p->xfer_storage[at] : NULL;
            if (!p->xfer_storage) p->central[c].xcap = 0; /* no room: flush straight to slabs */
            at += p->central[c].xcap;
        }
    }
    if (p->purge_background) {
        st = purger_register(p);
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
    if (p->purge_background) purger_unregister(p);
    if (p->tcache_on) {
        pthread_key_delete(p->tkey);
        for (tcache *t = p->tcaches, *n; t; t = n) {
            n = t->next;
            free(t);
        }
        if (tl_last.pool == p) tl_last.pool = NULL;
    }
    for (superblock *sb = p->sbs, *n; sb; sb = n) {
        n = sb->next;
        for (pblock *b = sb->owner[0]; b; b = b->next) {
            if (b->kind != D_SLAB) continue;
            free(((slab *)b)->free_idx);
            free(((slab *)b)->bits);
        }
        llmem__addrmap_clear(sb->base, sb->size);
        llmem_resource_unmap(p->res, (void *)sb->base, sb->size, sb->size - (sb->decommitted_units << p->ushift));
        sb_free_meta(sb);
    }
    llmem__pool_drop_fenced(p);
    llmem_fixed_destroy(p->descs);
    free(p->xfer_storage);
    free(p->handles);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

void llmem_pool_flush_thread_cache(llmem_pool *p)
{
    if (!p) return;
    tcache *t = tcache_get(p);
    if (!t) return;
    pthread_mutex_lock(&p->lock);
    tcache_flush_all(p, t);
    pthread_mutex_unlock(&p->lock);
}

llmem_resource *llmem_pool_get_resource(const llmem_pool *p) { return p ? p->res : NULL; }
