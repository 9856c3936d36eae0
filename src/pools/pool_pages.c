/*
 * pool_pages.c - the dynamic pool's superblocks and page runs: mapping and
 * unmapping superblocks, a best-fit page allocator over their free runs,
 * and commit/decommit inside them.
 *
 * Layout. A superblock is one mapping from the resource, aligned to at
 * least 64 KiB (the address map's unit) and to the resource granularity,
 * and registered in the process-wide address map, so any pointer finds its
 * superblock in three loads. A superblock is tiled by blocks: runs of whole
 * units (U: 4 KiB host, 64 KiB device), each FREE, LARGE (one allocation) or
 * SLAB (blocks of one size class, pool_slab.c). Blocks are out-of-band
 * descriptors, linked in address order (prev/next) so freeing coalesces with
 * free neighbours; FREE blocks also sit in an AVL tree ordered by (size,
 * address) for best fit in O(log n). Each superblock has an owner table with
 * one entry per unit: the first unit of every FREE and LARGE block and every
 * unit of a SLAB point at their descriptor; other entries are NULL. So free
 * finds a pointer's block in one more load, and a pointer that is not a
 * live block start is recognised at once.
 *
 * Heaps. A host pool without reserve_bytes has two page heaps, each a free
 * tree and a growth sequence of its own: slabs take pages from the small
 * heap, large blocks and handles from the large one, so the small heap's
 * superblocks alone get transparent huge pages (from the default resource;
 * the large heap maps plain pages unless the caller gave a resource). A
 * superblock belongs to one heap for its life; its free runs go back to
 * that heap's tree. Device pools and reserved ranges have one heap.
 *
 * Growth. The first superblock is first_superblock_bytes, each later one
 * twice the last up to max_superblock_bytes; a request larger than that gets
 * a superblock of its own. With reserve_bytes the first growth maps that
 * range uncommitted instead (the reserved superblock: never listed empty,
 * never unmapped before destroy). Growth steps back as superblocks go.
 *
 * Memory going back. A superblock whose blocks are all free is "empty"; it
 * is unmapped once it has stayed empty for the decay delay (the purger,
 * pool_purge.c, or the pool's slow paths here), or at once by shrink/trim.
 * Decommit works on runs of units aligned to the resource granularity
 * inside free blocks; a bit per unit records what is decommitted, and
 * taking a block first commits the runs it covers, so a run is always
 * wholly committed or wholly not.
 *
 * Invariants (llmem_pool_check verifies them): blocks tile each superblock
 * in address order; no two FREE blocks are adjacent; the trees hold
 * exactly the FREE blocks, each in its superblock's heap; the run cache's
 * lists hold exactly the CACHED blocks, each in its size's list; owner table entries are as described; a superblock's
 * used bytes are the sum of its LARGE, SLAB and CACHED blocks, and it is listed
 * empty exactly when that is 0 (except the reserved one); a live block has
 * no decommitted unit.
 *
 * The run cache. A freed large block of up to RUN_CACHE_UNITS units goes
 * whole, not coalesced, to a list of its exact size (kind D_CACHED), and a
 * large allocation of that size, or of a size it exceeds by at most half
 * (llmem__pool_fit_units; the smallest cached size that fits, found
 * through a bitmap of the lists that are not empty), takes it back whole
 * from there: no free-tree search, no split or merge, no descriptor made
 * or freed, no clock read. Slabs and handles take exact sizes only. An engine
 * frees and asks again for the same tensor sizes layer after layer (under
 * tensor_mix some 30% of the time was the tree's, docs/BENCHMARKS.md). A
 * cached run is free to the user (counted in free_bytes, a double free of
 * it is refused as one in a free run) but stays in its superblock's used
 * bytes, so no superblock holding one is listed empty; it stays committed.
 * The cache holds RUN_CACHE_BYTES at most, oldest out first (coalesced as
 * a free would have), and is flushed, every run coalesced, whenever the
 * free runs must be whole: before a growth (an allocation that fits
 * nowhere else), by reserve, shrink/trim and compaction, and by the purger
 * once the cache has seen no put or take for the decay delay. Only host
 * pools with the background purger have one: elsewhere nothing would
 * flush an idle cache.
 *
 * Timestamps (free_since, empty_since) come from llmem__pool_clock, a
 * coarse clock: CLOCK_MONOTONIC cost 150 ns a call on this project's VMs,
 * on every free of a page run. A free run cut from another keeps its
 * stamp (its pages were free since then), so a take reads no clock.
 *
 * Locking: every function here runs with the pool lock held.
 */
#include <stdlib.h>
#include <string.h>

#include "addrmap.h"
#include "pool_internal.h"

int llmem__pool_free_cmp(const llmem__avl_node *a, const llmem__avl_node *b)
{
    const pblock *x = (const pblock *)((const char *)a - offsetof(pblock, node));
    const pblock *y = (const pblock *)((const char *)b - offsetof(pblock, node));
    if (x->size != y->size) return x->size < y->size ? -1 : 1;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* Key for lower_bound: the smallest size wanted, lowest address first. */
int llmem__pool_size_key_cmp(const void *key, const llmem__avl_node *n)
{
    size_t want = *(const size_t *)key;
    const pblock *b = (const pblock *)((const char *)n - offsetof(pblock, node));
    return want <= b->size ? -1 : 1;
}

/* ---- small helpers ------------------------------------------------------- */

pblock *llmem__pool_desc_new(llmem_pool *p)
{
    slab *s = llmem_fixed_alloc(p->descs, NULL);
    /* A call to memset, not the inline `rep stos` gcc makes of a constant
     * size: that instruction's start-up cost was 5% of tensor_mix (AMD EPYC
     * VM, perf annotate; docs/BENCHMARKS.md). */
    size_t n = sizeof *s;
    __asm__("" : "+r"(n));
    if (s) memset(s, 0, n);
    return &s->b;
}

void llmem__pool_desc_free(llmem_pool *p, pblock *b) { llmem_fixed_free(p->descs, b); }

/* Make b a FREE block in the tree, free since `stamp`. */
static void tree_add(llmem_pool *p, pblock *b, uint64_t stamp)
{
    b->kind = D_FREE;
    b->free_since = stamp;
    b->purged = false;
    llmem__avl_insert(&p->free_tree[b->sb->heap], &b->node, llmem__pool_free_cmp);
    ST_ADD(p->st.free_bytes, b->size);
}

void llmem__pool_tree_insert(llmem_pool *p, pblock *b) { tree_add(p, b, llmem__pool_clock()); }

void llmem__pool_tree_remove(llmem_pool *p, pblock *b)
{
    llmem__avl_remove(&p->free_tree[b->sb->heap], &b->node);
    ST_SUB(p->st.free_bytes, b->size);
}

/* Free run b, still in the tree, was `old` bytes and now has a new start
 * or size: the same as removing it at its old size and inserting it anew,
 * but it keeps its node where its neighbours in (size, address) order
 * still bracket it, which is the common case for a superblock's big
 * free tail that a take shortens or a free lengthens. It is free since
 * the later of its stamp and `stamp` (0 from a take: what is left of it
 * was free all along). */
static void tree_rekey(llmem_pool *p, pblock *b, size_t old, uint64_t stamp)
{
    llmem_avl *t = &p->free_tree[b->sb->heap];
    const llmem__avl_node *pr = llmem__avl_prev(&b->node), *nx = llmem__avl_next(&b->node);
    if ((pr && llmem__pool_free_cmp(pr, &b->node) >= 0) || (nx && llmem__pool_free_cmp(&b->node, nx) >= 0)) {
        llmem__avl_remove(t, &b->node);
        llmem__avl_insert(t, &b->node, llmem__pool_free_cmp);
    }
    ST_SUB(p->st.free_bytes, old);
    ST_ADD(p->st.free_bytes, b->size);
    b->kind = D_FREE;
    if (stamp > b->free_since) b->free_since = stamp;
    b->purged = false;
}

/* ---- superblocks ------------------------------------------------------- */

static void empty_list_add(llmem_pool *p, superblock *sb)
{
    if (sb->reserved) return; /* kept: its free pages are decommitted instead */
    sb->empty = true;
    sb->empty_since = llmem__pool_clock();
    LIST_PUSH(p->empties, sb, eprev, enext);
}

static void empty_list_remove(llmem_pool *p, superblock *sb)
{
    if (!sb->empty) return;
    LIST_UNLINK(p->empties, sb, eprev, enext);
    sb->empty = false;
}

void llmem__pool_sb_free_meta(superblock *sb)
{
    free(sb->owner);
    free(sb->decommitted);
    free(sb);
}

static void mark_runs(llmem_pool *p, superblock *sb, uintptr_t r0, uintptr_t r1, bool decommitted);

/* Map a superblock of `size` bytes and add it to the pool as one free run:
 * committed, or (reserved) address space whose every page starts
 * decommitted, for take_run to commit as blocks need it. The map comes
 * first: a size the resource cannot hold (an absurd request) must fail
 * there, not cost host metadata in proportion to it first. Lock held. */
static llmem_status sb_map(llmem_pool *p, unsigned h, size_t size, bool reserved, superblock **out)
{
    void *base;
    llmem_status st = llmem_resource_map_tagged(p->heap_res[h], size, p->sb_align, reserved ? LLMEM_MAP_UNCOMMITTED : 0,
                                                p->name, &base);
    ST_ADD(p->st.resource_calls_total, 1);
    if (st) return st;
    size_t units = size >> p->ushift;
    superblock *sb = aligned_alloc(64, (sizeof *sb + 63) & ~(size_t)63);
    if (sb) memset(sb, 0, sizeof *sb);
    pblock *b = llmem__pool_desc_new(p);
    if (sb) {
        sb->owner = calloc(units, sizeof *sb->owner);
        sb->decommitted = calloc((units + 63) / 64, sizeof(uint64_t));
    }
    if (!sb || !sb->owner || !sb->decommitted || !b)
        st = llmem__fail(LLMEM_ENOMEM, "pool '%s': out of host memory for superblock metadata", p->name);
    else {
        sb->base = (uintptr_t)base;
        st = llmem__addrmap_set((uintptr_t)base, size, sb);
    }
    if (st) {
        if (sb) llmem__pool_sb_free_meta(sb);
        if (b) llmem__pool_desc_free(p, b);
        llmem_resource_unmap(p->heap_res[h], base, size, reserved ? 0 : size);
        ST_ADD(p->st.resource_calls_total, 1);
        return st;
    }
    if (p->host && !reserved) LLMEM_POISON(base, size);
    sb->size = size;
    sb->pool = p;
    sb->reserved = reserved;
    sb->heap = (uint8_t)h;
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
    b->fresh = true;      /* nothing of a new mapping is resident yet */
    empty_list_add(p, sb); /* a reserved range is never listed: see there */
    ST_ADD(p->st.reserved_bytes, size);
    if (!reserved) ST_ADD(p->st.committed_bytes, size);
    if (p->st.reserved_bytes > p->st.reserved_peak_bytes) ST_SET(p->st.reserved_peak_bytes, p->st.reserved_bytes);
    ST_ADD(p->st.superblocks, 1);
    ST_ADD(p->st.grows_total, 1);
    /* A new committed free run (what the allocation that grew leaves of
     * it): a purger asleep with nothing pending must hear of it, or that
     * tail stays committed until some later free kicks it. */
    if (!reserved) llmem__pool_purger_kick(p);
    *out = sb;
    return LLMEM_OK;
}

llmem_status llmem__pool_grow(llmem_pool *p, unsigned h, size_t need, size_t align)
{
    if (p->reserve && !p->rsb) return sb_map(p, HEAP_SMALL, p->reserve, true, &p->rsb);
    size_t want = need, size;
    if (align > p->unit && !llmem__add_ok(want, align - p->unit, &want))
        return llmem__fail(LLMEM_EOVERFLOW, "pool '%s': %zu bytes at alignment %zu overflow", p->name, need, align);
    bool dedicated = want > p->max_sb;
    if (!dedicated && want < p->next_sb[h]) want = p->next_sb[h];
    if (!llmem__align_up(want, p->sb_align, &size) || size > (size_t)PTRDIFF_MAX)
        return llmem__fail(LLMEM_EOVERFLOW, "pool '%s': a superblock for %zu bytes overflows", p->name, need);
    if (p->max_bytes && (size > p->max_bytes || p->st.reserved_bytes > p->max_bytes - size))
        return llmem__fail(LLMEM_ENOMEM, "pool '%s': a %zu-byte superblock would pass max_bytes %zu (%llu mapped)",
                           p->name, size, p->max_bytes, (unsigned long long)p->st.reserved_bytes);
    superblock *sb;
    llmem_status st = sb_map(p, h, size, false, &sb);
    if (st) return st;
    if (!dedicated) p->next_sb[h] = p->next_sb[h] > p->max_sb / 2 ? p->max_sb : p->next_sb[h] * 2;
    return LLMEM_OK;
}

/* Unmap an empty superblock. Lock held. */
bool llmem__pool_release_sb(llmem_pool *p, superblock *sb)
{
    /* Out of the address map first: once unmapped, the range may be mapped
     * again for someone else, whose entries we must not clear. */
    llmem__addrmap_clear(sb->base, sb->size);
    size_t decommitted = sb->decommitted_units << p->ushift;
    ST_ADD(p->st.resource_calls_total, 1);
    if (llmem_resource_unmap(p->heap_res[sb->heap], (void *)sb->base, sb->size, sb->size - decommitted) != LLMEM_OK) {
        llmem__addrmap_set(sb->base, sb->size, sb); /* its nodes exist: cannot fail; empty, so no slab entries */
        sb->empty_since = llmem__pool_clock();          /* try again after another delay */
        llmem__log(LLMEM_LOG_WARN, "pool '%s': superblock %p kept: %s", p->name, (void *)sb->base,
                   llmem_error_message());
        return false;
    }
    pblock *b = sb->owner[0];
    llmem__pool_tree_remove(p, b);
    llmem__pool_desc_free(p, b);
    empty_list_remove(p, sb);
    LIST_UNLINK(p->sbs, sb, prev, next);
    ST_SUB(p->st.reserved_bytes, sb->size);
    ST_SUB(p->st.committed_bytes, sb->size - decommitted);
    ST_SUB(p->st.superblocks, 1);
    ST_ADD(p->st.shrinks_total, 1);
    /* Growth steps back as superblocks go: after an idle shrink, the next
     * burst's first growth is not the size the previous burst ended on
     * (measured: llmem demo's second burst mapped 17.8 MB for 1.5 MB used). */
    size_t *next = &p->next_sb[sb->heap];
    if (sb->size < p->max_sb || sb->size <= *next) *next = *next / 2 > p->first_sb ? *next / 2 : p->first_sb;
    llmem__pool_sb_free_meta(sb);
    return true;
}

/* Release superblocks empty for longer than the decay delay. Lock held. */
static void decay(llmem_pool *p)
{
    if (!p->empties) return;
    uint64_t now = llmem__pool_clock();
    for (superblock *sb = p->empties, *n; sb; sb = n) {
        n = sb->enext;
        if (now - sb->empty_since >= p->decay_ns) llmem__pool_release_sb(p, sb);
    }
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
        llmem_status st = llmem_resource_commit(p->heap_res[sb->heap], (void *)r, r1 - r);
        ST_ADD(p->st.resource_calls_total, 1);
        if (st) return st;
        mark_runs(p, sb, r, r1, false);
        ST_ADD(p->st.committed_bytes, r1 - r);
        if (p->host) LLMEM_POISON((void *)r, r1 - r);
        r = r1;
    }
    return LLMEM_OK;
}

/* Decommit the committed runs inside free block b, one resource call per
 * stretch, until `budget` bytes were released. Returns the bytes released.
 * Lock held. */
size_t llmem__pool_decommit_block(llmem_pool *p, pblock *b, size_t budget)
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
        llmem_status st = llmem_resource_decommit(p->heap_res[sb->heap], (void *)r, r1 - r);
        ST_ADD(p->st.resource_calls_total, 1);
        if (st) break; /* e.g. a resource that cannot decommit: nothing more to do here */
        mark_runs(p, sb, r, r1, true);
        ST_SUB(p->st.committed_bytes, r1 - r);
        ST_ADD(p->st.decommitted_bytes_total, r1 - r);
        released += r1 - r;
        r = r1;
    }
    if (r >= hi) b->fresh = true; /* nothing of it resident (but a partial unit at an unaligned edge) */
    return released;
}

/* ---- the page allocator ------------------------------------------------ */

pblock *llmem__pool_largest_free(const llmem_pool *p)
{
    pblock *big = NULL;
    for (unsigned h = 0; h < HEAPS; h++) {
        pblock *b = node_block(llmem__avl_last(&p->free_tree[h]));
        if (b && (!big || b->size > big->size)) big = b;
    }
    return big;
}

/* The longest stretch of committed units inside free run b, in bytes. */
static size_t committed_stretch(const llmem_pool *p, const pblock *b)
{
    const superblock *sb = b->sb;
    if (!sb->decommitted_units) return b->size;
    size_t u = unit_of(sb, b->start, p->ushift), end = u + (b->size >> p->ushift), best = 0, cur = 0;
    while (u < end) {
        uint64_t w = sb->decommitted[u / 64];
        /* Whole words at once: a reserved range's free tail is mostly
         * decommitted and can be millions of units. */
        if (u % 64 == 0 && end - u >= 64 && (w == 0 || w == ~0ull)) {
            if (w == 0) cur += 64;
            else {
                if (cur > best) best = cur;
                cur = 0;
            }
            u += 64;
            continue;
        }
        if ((w >> (u % 64)) & 1) {
            if (cur > best) best = cur;
            cur = 0;
        } else {
            cur++;
        }
        u++;
    }
    if (cur > best) best = cur;
    return best << p->ushift;
}

size_t llmem__pool_largest_committed_free(const llmem_pool *p)
{
    size_t best = 0;
    if (p->rc.bytes) /* cached runs are whole and committed */
        for (size_t u = RUN_CACHE_UNITS; u > 0 && !best; u--)
            if (p->rc.head[u]) best = u << p->ushift;
    for (unsigned h = 0; h < HEAPS; h++)
        for (llmem__avl_node *n = llmem__avl_last(&p->free_tree[h]); n; n = llmem__avl_prev(n)) {
            const pblock *b = node_block(n);
            if (b->size <= best) break; /* smaller from here on */
            size_t c = committed_stretch(p, b);
            if (c > best) best = c;
        }
    return best;
}

/* Best fit prefers pages the process holds already: when the smallest run
 * that fits is fresh (nothing of it resident), one of the next FRESH_SCAN
 * in size order that is not is taken instead (a bigger one: it fits too).
 * Fresh runs are new superblocks' tails and decommitted runs; the others
 * hold freed blocks' pages (glibc's heap takes its top chunk last,
 * jemalloc its dirty extents first). python3 under the shim: 24.5 k ->
 * 23 k page faults. The flag is coarse: a run that took in one freed
 * block counts as written all through (docs/BENCHMARKS.md: why it does
 * not help sqlite3's peak). */
#define FRESH_SCAN 8

static pblock *prefer_resident(llmem__avl_node *n)
{
    pblock *b = node_block(n);
    if (!b || !b->fresh) return b;
    llmem__avl_node *x = n;
    for (int i = 0; i < FRESH_SCAN && (x = llmem__avl_next(x)) != NULL; i++)
        if (!node_block(x)->fresh) return node_block(x);
    return b;
}

/* A FREE block of heap h that can hold size bytes at align, or NULL. */
pblock *llmem__pool_best_fit(llmem_pool *p, unsigned h, size_t size, size_t align)
{
    llmem_avl *tree = &p->free_tree[h];
    llmem__avl_node *n = llmem__avl_lower_bound(tree, &size, llmem__pool_size_key_cmp);
    if (align <= p->unit) return prefer_resident(n);
    /* Aligned: the smallest candidates first, then one that surely fits. */
    for (int tries = 0; n && tries < 32; tries++, n = llmem__avl_next(n)) {
        pblock *b = node_block(n);
        size_t pad = llmem__align_ptr(b->start, align) - b->start;
        if (pad <= b->size && size <= b->size - pad) return b;
    }
    size_t surely;
    if (!llmem__add_ok(size, align - p->unit, &surely)) return NULL;
    return node_block(llmem__avl_lower_bound(tree, &surely, llmem__pool_size_key_cmp));
}

/* A new descriptor for [b.start, b.start+at), linked before b, which
 * keeps the rest; the new one owns its first unit. NULL when out of
 * descriptors. Lock held. */
static pblock *cut_front(llmem_pool *p, pblock *b, size_t at)
{
    pblock *f = llmem__pool_desc_new(p);
    if (!f) return NULL;
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
    return f;
}

/* Split [b.start, b.start+at) off b as a new FREE block before it, free
 * since `stamp`; b keeps the rest. Lock held, b not in the tree. */
static bool split_front(llmem_pool *p, pblock *b, size_t at, uint64_t stamp)
{
    pblock *f = cut_front(p, b, at);
    if (!f) return false;
    f->fresh = b->fresh;
    tree_add(p, f, stamp);
    return true;
}

/* Split everything past `keep` bytes off b as a FREE block after it, free
 * since `stamp`, fresh or not (pblock.fresh) as the run it came from. */
static void split_back(llmem_pool *p, pblock *b, size_t keep, uint64_t stamp, bool fresh)
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
    t->fresh = fresh;
    tree_add(p, t, stamp);
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
    if (!pad && b->size > size) {
        /* The front goes out in a new descriptor; b stays in the tree as
         * the tail, as split_back would have inserted it. */
        const size_t old = b->size;
        pblock *f = cut_front(p, b, size);
        if (f) {
            sb->owner[unit_of(sb, b->start, p->ushift)] = b;
            tree_rekey(p, b, old, 0);
            if (sb->used == 0) empty_list_remove(p, sb);
            sb->used += f->size;
            return f;
        }
    }
    const uint64_t since = b->free_since;
    llmem__pool_tree_remove(p, b);
    if (pad && !split_front(p, b, pad, since)) {
        tree_add(p, b, since);
        *st = llmem__fail(LLMEM_ENOMEM, "pool '%s': out of host memory for a block descriptor", p->name);
        return NULL;
    }
    if (b->size > size) split_back(p, b, size, since, b->fresh);
    if (sb->used == 0) empty_list_remove(p, sb);
    sb->used += b->size;
    return b;
}

/* b takes in next, its free right neighbour in sb: next leaves the tree
 * and the owner map, its descriptor is freed. b's own tree key is the
 * caller's business. */
static inline void take_in_next(llmem_pool *p, superblock *sb, pblock *b, pblock *next)
{
    llmem__pool_tree_remove(p, next);
    sb->owner[unit_of(sb, next->start, p->ushift)] = NULL;
    b->size += next->size;
    b->next = next->next;
    if (next->next) next->next->prev = b;
    llmem__pool_desc_free(p, next);
}

bool llmem__pool_grow_in_place(llmem_pool *p, pblock *b, size_t size)
{
    pblock *next = b->next;
    if (size <= b->size || !next || next->kind != D_FREE || b->size + next->size < size) return false;
    superblock *sb = b->sb;
    size_t old = b->size;
    if (llmem__pool_commit_range(p, sb, next->start, size - old)) return false;
    const uint64_t since = next->free_since;
    const bool fresh = next->fresh;
    take_in_next(p, sb, b, next);
    if (b->size > size) split_back(p, b, size, since, fresh); /* the tail is next's */
    sb->used += b->size - old;
    return true;
}

/* A cached run of `size` bytes to `most` units at `align` in heap h (the
 * smallest size there is, its newest run), taken out of the cache (still
 * counted in its superblock's used bytes), or NULL. */
static pblock *cache_take(llmem_pool *p, unsigned h, size_t size, size_t most, size_t align);

/* llmem__pool_take_pages, with a cached run of up to `most` units taken
 * whole. */
static pblock *take_pages_upto(llmem_pool *p, unsigned h, size_t size, size_t most, size_t align, llmem_status *st)
{
    pblock *b = p->rc.bytes ? cache_take(p, h, size, most, align) : NULL;
    if (b) return b;
    decay(p);
    b = llmem__pool_best_fit(p, h, size, align);
    /* Nothing fits: the cached runs, coalesced, may make room before a
     * superblock is mapped. */
    if (!b && p->rc.bytes) {
        llmem__pool_cache_flush(p, llmem__pool_clock());
        b = llmem__pool_best_fit(p, h, size, align);
    }
    /* Twice at most: the reserved range first, if it is not mapped yet and
     * cannot hold the request, then an ordinary superblock. */
    for (int tries = 0; !b && tries < 2; tries++) {
        *st = llmem__pool_grow(p, h, size, align);
        if (*st) return NULL;
        b = llmem__pool_best_fit(p, h, size, align);
    }
    if (!b) {
        *st = llmem__fail(LLMEM_ENOMEM, "pool '%s': no fit after growing (internal error)", p->name);
        return NULL;
    }
    return llmem__pool_take_run(p, b, size, align, st);
}

pblock *llmem__pool_take_pages(llmem_pool *p, unsigned h, size_t size, size_t align, llmem_status *st)
{
    return take_pages_upto(p, h, size, size >> p->ushift, align, st);
}

pblock *llmem__pool_take_large(llmem_pool *p, unsigned h, size_t size, size_t align, llmem_status *st)
{
    return take_pages_upto(p, h, size, llmem__pool_fit_units(size >> p->ushift), align, st);
}

/* Return a block to the free runs, coalescing with free neighbours; it is
 * free since `stamp` (and the run it joins since the later stamp). */
static void put_run(llmem_pool *p, pblock *b, uint64_t stamp)
{
    superblock *sb = b->sb;
    llmem__assert(b->kind != D_FREE && b->size <= sb->used && b->size % p->unit == 0);
    sb->used -= b->size;
    pblock *prev = b->prev, *next = b->next, *kept = NULL; /* kept: a free neighbour that stays in the tree */
    size_t kept_old = 0;
    if (prev && prev->kind == D_FREE) {
        kept = prev;
        kept_old = prev->size;
        sb->owner[unit_of(sb, b->start, p->ushift)] = NULL;
        prev->size += b->size;
        prev->next = next;
        if (next) next->prev = prev;
        llmem__pool_desc_free(p, b);
        b = prev;
    }
    if (next && next->kind == D_FREE) {
        if (kept) {
            if (next->free_since > stamp) stamp = next->free_since;
            take_in_next(p, sb, b, next);
        } else {
            /* next's descriptor takes in b: it stays in the tree. */
            kept = next;
            kept_old = next->size;
            sb->owner[unit_of(sb, next->start, p->ushift)] = NULL;
            next->start = b->start;
            next->size += b->size;
            next->prev = b->prev;
            if (b->prev) b->prev->next = next;
            llmem__pool_desc_free(p, b);
            b = next;
        }
    }
    sb->owner[unit_of(sb, b->start, p->ushift)] = b;
    b->fresh = false; /* holds the freed block's pages */
    /* No two free runs are adjacent: b took in both free neighbours. */
    llmem__assert((!b->prev || b->prev->kind != D_FREE) && (!b->next || b->next->kind != D_FREE));
    if (p->host) LLMEM_POISON((void *)b->start, b->size);
    if (kept) tree_rekey(p, b, kept_old, stamp);
    else tree_add(p, b, stamp);
    if (sb->used == 0) empty_list_add(p, sb);
    llmem__pool_purger_kick(p);
}

void llmem__pool_put_pages(llmem_pool *p, pblock *b) { put_run(p, b, llmem__pool_clock()); }

void llmem__pool_put_pages_since(llmem_pool *p, pblock *b, uint64_t stamp) { put_run(p, b, stamp); }

/* ---- the run cache (see the top of this file) ----------------------------- */

/* Take cached run b out of both lists (counted free no more). */
static void cache_unlink(llmem_pool *p, pblock *b)
{
    run_cache *c = &p->rc;
    size_t u = b->size >> p->ushift;
    if (b->cprev) b->cprev->cnext = b->cnext;
    else if (!(c->head[u] = b->cnext)) bit_clear(c->nonempty, u);
    if (b->cnext) b->cnext->cprev = b->cprev;
    if (b->aprev) b->aprev->anext = b->anext;
    else c->newest = b->anext;
    if (b->anext) b->anext->aprev = b->aprev;
    else c->oldest = b->aprev;
    c->bytes -= b->size;
    c->ops++;
    ST_SUB(p->st.free_bytes, b->size);
}

/* The smallest u at or above `from` whose list is not empty, or a value
 * above `most` if none is up to `most` (<= RUN_CACHE_UNITS). */
static size_t cache_first(const run_cache *c, size_t from, size_t most)
{
    for (size_t w = from / 64; w <= most / 64; w++) {
        uint64_t bits = c->nonempty[w];
        if (w == from / 64) bits &= ~0ull << (from % 64);
        if (bits) return w * 64 + (size_t)__builtin_ctzll(bits);
    }
    return most + 1;
}

static pblock *cache_take(llmem_pool *p, unsigned h, size_t size, size_t most, size_t align)
{
    size_t u = size >> p->ushift;
    if (h != heap_for(p, D_LARGE) || u > RUN_CACHE_UNITS) return NULL;
    if (most > RUN_CACHE_UNITS) most = RUN_CACHE_UNITS;
    u = cache_first(&p->rc, u, most);
    if (u > most) return NULL;
    pblock *b = p->rc.head[u];
    if (align > p->unit && (b->start & (align - 1))) return NULL;
    cache_unlink(p, b);
    return b;
}

/* Coalesce cached run b into the free runs, free since `stamp`. */
static void cache_evict(llmem_pool *p, pblock *b, uint64_t stamp)
{
    cache_unlink(p, b);
    b->kind = D_LARGE; /* what put_run takes */
    put_run(p, b, stamp);
}

void llmem__pool_put_large(llmem_pool *p, pblock *b)
{
    run_cache *c = &p->rc;
    size_t u = b->size >> p->ushift;
    if (!c->cap || u > RUN_CACHE_UNITS || b->size > c->cap) {
        llmem__pool_put_pages(p, b);
        return;
    }
    b->kind = D_CACHED;
    /* The caller cleared the user pointer's entry, which in a checked pool
     * may be the first unit's. */
    b->sb->owner[unit_of(b->sb, b->start, p->ushift)] = b;
    b->cprev = NULL;
    b->cnext = c->head[u];
    if (b->cnext) b->cnext->cprev = b;
    c->head[u] = b;
    bit_set(c->nonempty, u);
    b->aprev = NULL;
    b->anext = c->newest;
    if (c->newest) c->newest->aprev = b;
    else c->oldest = b;
    c->newest = b;
    c->bytes += b->size;
    c->ops++;
    ST_ADD(p->st.free_bytes, b->size);
    if (p->host) LLMEM_POISON((void *)b->start, b->size);
    if (c->bytes > c->cap) {
        uint64_t now = llmem__pool_clock();
        while (c->bytes > c->cap) cache_evict(p, c->oldest, now);
    }
    /* An idle cache is flushed by the purger: it must hear of a cache that
     * was empty. While it holds runs the purger's passes look again by
     * themselves (llmem__pool_cache_purge gives them a time), so later puts
     * need not: that saves a locked instruction per free. */
    if (c->bytes == b->size) llmem__pool_purger_kick(p);
}

void llmem__pool_cache_flush(llmem_pool *p, uint64_t stamp)
{
    while (p->rc.oldest) cache_evict(p, p->rc.oldest, stamp);
}

uint64_t llmem__pool_cache_purge(llmem_pool *p, uint64_t now)
{
    run_cache *c = &p->rc;
    if (!c->bytes) return UINT64_MAX;
    if (c->ops != c->seen_ops) {
        c->seen_ops = c->ops;
        c->seen_at = now;
        return now + p->decay_ns;
    }
    if (now - c->seen_at < p->decay_ns) return c->seen_at + p->decay_ns;
    /* No put or take since seen_at: every cached run was freed before it. */
    llmem__pool_cache_flush(p, c->seen_at);
    return UINT64_MAX;
}

bool llmem__pool_cache_check(const llmem_pool *p, size_t cached, uint64_t bytes)
{
    const run_cache *c = &p->rc;
    size_t n = 0, m = 0;
    uint64_t sum = 0;
    for (size_t u = 0; u <= RUN_CACHE_UNITS; u++) {
        if (bit_get(c->nonempty, u) != (c->head[u] != NULL)) return false;
        for (const pblock *b = c->head[u], *prev = NULL; b; prev = b, b = b->cnext, n++)
            if (b->kind != D_CACHED || b->size != u << p->ushift || b->cprev != prev ||
                b->sb->heap != heap_for(p, D_LARGE) || n > cached)
                return false;
    }
    const pblock *last = NULL;
    for (const pblock *b = c->newest; b; last = b, b = b->anext, m++) {
        if (b->kind != D_CACHED || b->aprev != last || m > cached) return false;
        sum += b->size;
    }
    return n == cached && m == cached && last == c->oldest && sum == bytes && c->bytes == bytes && bytes <= c->cap;
}

