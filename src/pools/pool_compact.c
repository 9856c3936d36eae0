/*
 * pool_compact.c - movable allocations (handles) and compaction.
 *
 * A handle names an allocation the pool may move: the caller pins it to get
 * its address and unpins it when done; while no pin is held, compaction may
 * copy the block elsewhere and update the handle. Handle blocks are page
 * runs (LARGE blocks with a handle index), so a small movable allocation
 * takes a whole unit.
 *
 * The handle table is an array of entries, free ones chained through
 * next_free. A handle is (generation << 32) | (index + 1); freeing bumps the
 * entry's generation, so a stale handle is refused instead of naming the
 * entry's next owner.
 *
 * Compaction, under the pool lock, within a byte budget:
 *  1. evacuate: superblocks whose live blocks are all unpinned handle
 *     blocks, sparsest first, have each block copied into a best-fit free run
 *     of another superblock; a superblock left empty is unmapped at once;
 *  2. slide: in every superblock, an unpinned handle block moves down into
 *     the lowest free run before it that holds it, so free space gathers at
 *     the top and coalesces.
 * Raw allocations, slabs and pinned blocks never move. Copies go through
 * memmove on the host and the resource's copy on a device; source and
 * destination never overlap (the destination is a free run).
 */
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

#define H_INDEX(h) ((uint32_t)((h) & 0xffffffffu))
#define H_GEN(h) ((uint32_t)((h) >> 32))

/* The live entry a handle names, or NULL (error recorded). Lock held. */
static hentry *entry_of(llmem_pool *p, llmem_handle h)
{
    uint32_t i = H_INDEX(h);
    if (i == 0 || i > p->hcount || !p->handles[i - 1].b || p->handles[i - 1].gen != H_GEN(h)) {
        llmem__fail(LLMEM_EINVAL, "pool '%s': handle 0x%llx is not live (freed, or never made by this pool)", p->name,
                    (unsigned long long)h);
        return NULL;
    }
    return &p->handles[i - 1];
}

llmem_status llmem_pool_handle_alloc(llmem_pool *p, size_t size, llmem_handle *out)
{
    if (out) *out = LLMEM_HANDLE_NULL;
    if (!p || !out) return llmem__fail(LLMEM_EINVAL, "pool: null %s", p ? "out" : "pool");
    if (size == 0) return llmem__fail(LLMEM_EINVAL, "pool '%s': handle allocation of 0 bytes", p->name);
    size_t pages;
    if (!llmem__align_up(size, p->unit, &pages) || pages > (size_t)PTRDIFF_MAX)
        return llmem__fail(LLMEM_EOVERFLOW, "pool '%s': handle allocation of %zu bytes overflows", p->name, size);
    pthread_mutex_lock(&p->lock);
    llmem_status st = LLMEM_OK;
    if (!p->hfree && p->hcount == p->hcap) {
        uint32_t ncap = p->hcap ? p->hcap * 2 : 64;
        hentry *n = ncap > p->hcap ? realloc(p->handles, (size_t)ncap * sizeof *n) : NULL;
        if (!n) st = llmem__fail(LLMEM_ENOMEM, "pool '%s': out of memory for the handle table", p->name);
        else {
            p->handles = n;
            p->hcap = ncap;
        }
    }
    pblock *b = st ? NULL : llmem__pool_take_pages(p, heap_for(p, D_LARGE), pages, p->unit, &st);
    if (!b) {
        ST_ADD(p->st.failures_total, 1);
        pthread_mutex_unlock(&p->lock);
        return st;
    }
    uint32_t i;
    if (p->hfree) {
        i = p->hfree - 1;
        p->hfree = p->handles[i].next_free;
    } else {
        i = p->hcount++;
        p->handles[i].gen = 1;
    }
    hentry *e = &p->handles[i];
    e->b = b;
    e->pins = 0;
    e->next_free = 0;
    b->kind = D_LARGE;
    b->requested = size;
    b->user = b->start;
    b->handle = i + 1;
    b->sb->owner[unit_of(b->sb, b->start, p->ushift)] = b;
    if (p->host) LLMEM_UNPOISON((void *)b->start, size);
    ST_ADD(p->st.used_bytes, b->size);
    ST_ADD(p->st.live_allocations, 1);
    ST_ADD(p->st.allocs_total, 1);
    ST_ADD(p->st.handles, 1);
    llmem__pool_note_peak(p);
    *out = (uint64_t)e->gen << 32 | (i + 1);
    pthread_mutex_unlock(&p->lock);
    return LLMEM_OK;
}

void *llmem_pool_pin(llmem_pool *p, llmem_handle h, llmem_status *status)
{
    if (!p) {
        llmem_status st = llmem__fail(LLMEM_EINVAL, "pool: null pool");
        if (status) *status = st;
        return NULL;
    }
    pthread_mutex_lock(&p->lock);
    hentry *e = entry_of(p, h);
    void *r = NULL;
    if (e && e->pins == UINT32_MAX) {
        llmem__fail(LLMEM_ERANGE, "pool '%s': handle 0x%llx pinned 2^32-1 times", p->name, (unsigned long long)h);
    } else if (e) {
        e->pins++;
        r = (void *)e->b->user;
    }
    llmem_status st = r ? LLMEM_OK : llmem_error_status();
    pthread_mutex_unlock(&p->lock);
    if (status) *status = st;
    return r;
}

llmem_status llmem_pool_unpin(llmem_pool *p, llmem_handle h)
{
    if (!p) return llmem__fail(LLMEM_EINVAL, "pool: null pool");
    pthread_mutex_lock(&p->lock);
    hentry *e = entry_of(p, h);
    llmem_status st = e ? LLMEM_OK : LLMEM_EINVAL;
    if (e && e->pins == 0)
        st = llmem__fail(LLMEM_ESTATE, "pool '%s': unpin of handle 0x%llx, which is not pinned", p->name,
                         (unsigned long long)h);
    else if (e)
        e->pins--;
    pthread_mutex_unlock(&p->lock);
    return st;
}

llmem_status llmem_pool_handle_free(llmem_pool *p, llmem_handle h)
{
    if (!p) return llmem__fail(LLMEM_EINVAL, "pool: null pool");
    if (h == LLMEM_HANDLE_NULL) return LLMEM_OK;
    pthread_mutex_lock(&p->lock);
    hentry *e = entry_of(p, h);
    llmem_status st = e ? LLMEM_OK : LLMEM_EINVAL;
    if (e && e->pins) {
        st = llmem__fail(LLMEM_EBUSY, "pool '%s': free of handle 0x%llx, still pinned %u time(s)", p->name,
                         (unsigned long long)h, e->pins);
    } else if (e) {
        pblock *b = e->b;
        b->handle = 0;
        ST_SUB(p->st.used_bytes, b->size);
        ST_SUB(p->st.live_allocations, 1);
        ST_SUB(p->st.handles, 1);
        ST_ADD(p->st.frees_total, 1);
        llmem__pool_put_pages(p, b);
        uint32_t i = (uint32_t)(e - p->handles);
        e->b = NULL;
        e->gen++;
        if (e->gen == 0) e->gen = 1;
        e->next_free = p->hfree;
        p->hfree = i + 1;
    }
    pthread_mutex_unlock(&p->lock);
    return st;
}

size_t llmem_pool_handle_size(const llmem_pool *cp, llmem_handle h)
{
    if (!cp) return 0;
    llmem_pool *p = (llmem_pool *)(uintptr_t)cp;
    pthread_mutex_lock(&p->lock);
    hentry *e = entry_of(p, h);
    size_t n = e ? e->b->requested : 0;
    pthread_mutex_unlock(&p->lock);
    return n;
}

/* ---- compaction ------------------------------------------------------------ */

static bool movable(const llmem_pool *p, const pblock *b)
{
    return b->kind == D_LARGE && b->handle && p->handles[b->handle - 1].pins == 0;
}

/* Copy block b into free run dest and point its handle there. False (and
 * nothing changed) if dest could not be committed. Lock held. */
static bool move_block(llmem_pool *p, pblock *b, pblock *dest, llmem_pool_compact_report *r)
{
    llmem_status st;
    pblock *d = llmem__pool_take_run(p, dest, b->size, p->unit, &st);
    if (!d) return false;
    if (p->host) {
        LLMEM_UNPOISON((void *)d->start, b->size);
        LLMEM_UNPOISON((void *)b->start, b->size);
        memmove((void *)d->start, (const void *)b->start, b->size);
        LLMEM_POISON((void *)(d->start + b->requested), b->size - b->requested);
    } else if (llmem_resource_copy(p->res, (void *)d->start, (const void *)b->start, b->size) != LLMEM_OK) {
        d->kind = D_LARGE; /* put_pages expects a live block */
        llmem__pool_put_pages(p, d);
        return false;
    }
    d->kind = D_LARGE;
    d->requested = b->requested;
    d->user = d->start;
    d->handle = b->handle;
    d->sb->owner[unit_of(d->sb, d->start, p->ushift)] = d;
    p->handles[b->handle - 1].b = d;
    b->handle = 0;
    llmem__pool_put_pages(p, b);
    r->bytes_moved += d->size;
    r->blocks_moved++;
    ST_ADD(p->st.moved_bytes_total, d->size);
    return true;
}

/* A free run of at least `size` bytes outside superblock `not`, best fit. */
static pblock *fit_elsewhere(llmem_pool *p, size_t size, const superblock *not)
{
    llmem__avl_node *n = llmem__avl_lower_bound(&p->free_tree[not->heap], &size, llmem__pool_size_key_cmp);
    for (; n; n = llmem__avl_next(n)) {
        pblock *f = node_block(n);
        if (f->sb != not) return f;
    }
    return NULL;
}

static int by_used(const void *a, const void *b)
{
    const superblock *x = *(superblock *const *)a, *y = *(superblock *const *)b;
    return x->used < y->used ? -1 : x->used > y->used;
}

/* Phase 1: empty sparse superblocks into the others. */
static void evacuate(llmem_pool *p, size_t budget, llmem_pool_compact_report *r)
{
    size_t n = 0;
    for (superblock *sb = p->sbs; sb; sb = sb->next) n++;
    superblock **v = n ? malloc(n * sizeof *v) : NULL;
    if (!v) return;
    n = 0;
    for (superblock *sb = p->sbs; sb; sb = sb->next)
        if (sb->used && !sb->reserved) v[n++] = sb; /* the reserved range is where blocks go, not leave */
    qsort(v, n, sizeof *v, by_used);
    for (size_t i = 0; i < n && r->bytes_moved < budget; i++) {
        superblock *sb = v[i];
        bool all_movable = true;
        for (pblock *b = sb->owner[0]; b && all_movable; b = b->next)
            if (b->kind != D_FREE && !movable(p, b)) all_movable = false;
        if (!all_movable) continue;
        for (pblock *b = sb->owner[0], *next; b && r->bytes_moved < budget; b = next) {
            next = b->next;
            if (b->kind == D_FREE) continue;
            pblock *dest = fit_elsewhere(p, b->size, sb);
            if (!dest || !move_block(p, b, dest, r)) break;
            /* b's run may have merged with its free neighbours: carry on
             * from whatever now follows the run that holds b's old start. */
            next = sb->owner[0];
            while (next && next->kind == D_FREE) next = next->next;
        }
        if (sb->used == 0) {
            size_t size = sb->size;
            if (llmem__pool_release_sb(p, sb)) {
                r->bytes_released += size;
                r->superblocks_released++;
            }
        }
    }
    free(v);
}

/* Phase 2: in each superblock, move blocks down into earlier holes. */
static void slide(llmem_pool *p, size_t budget, llmem_pool_compact_report *r)
{
    for (superblock *sb = p->sbs; sb && r->bytes_moved < budget; sb = sb->next) {
        bool moved = true;
        while (moved && r->bytes_moved < budget) {
            moved = false;
            for (pblock *b = sb->owner[0]; b; b = b->next) {
                if (!movable(p, b)) continue;
                pblock *hole = NULL;
                for (pblock *f = sb->owner[0]; f != b; f = f->next)
                    if (f->kind == D_FREE && f->size >= b->size) {
                        hole = f;
                        break;
                    }
                if (hole && move_block(p, b, hole, r)) {
                    moved = true;
                    break; /* the list changed: walk again */
                }
            }
        }
    }
}

static double fragmentation(const llmem_pool *p)
{
    const pblock *big = llmem__pool_largest_free(p);
    if (!big || !p->st.free_bytes) return 0;
    return 1.0 - (double)big->size / (double)p->st.free_bytes;
}

llmem_status llmem_pool_compact(llmem_pool *p, size_t budget, llmem_pool_compact_report *out)
{
    if (!p) return llmem__fail(LLMEM_EINVAL, "pool: null pool");
    llmem_pool_compact_report r = {.struct_size = sizeof r};
    if (budget == 0) budget = SIZE_MAX;
    pthread_mutex_lock(&p->lock);
    llmem__pool_cache_flush(p, llmem__pool_clock()); /* cached runs are not movable, nor holes: coalesce them */
    r.fragmentation_before = fragmentation(p);
    evacuate(p, budget, &r);
    slide(p, budget, &r);
    /* Whatever emptied goes now: that is what compaction is for. */
    for (superblock *sb = p->empties, *n; sb; sb = n) {
        n = sb->enext;
        size_t size = sb->size;
        if (llmem__pool_release_sb(p, sb)) {
            r.bytes_released += size;
            r.superblocks_released++;
        }
    }
    r.fragmentation_after = fragmentation(p);
    ST_ADD(p->st.compactions_total, 1);
    pthread_mutex_unlock(&p->lock);
    if (out) llmem__stats_out(out, &r, sizeof r);
    return LLMEM_OK;
}
