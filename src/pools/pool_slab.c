/*
 * pool_slab.c - the dynamic pool's slabs of small blocks, and the guards
 * and fills of checked host pools.
 *
 * Slabs. A slab is a run of pages (pool_pages.c) holding blocks of one size
 * class. It carves blocks lazily (a bump index), so a new slab touches no
 * page until its blocks are used. Free blocks go on a list threaded through
 * them (plain host pools) or on an index stack in host memory (device pools,
 * which must not touch their memory, and checked pools). Slabs with a free
 * or uncarved block sit on their class's partial list; a slab whose last
 * block comes back is kept if it is its class's only empty slab, otherwise
 * returned to the page allocator. A slab covers whole units of the address
 * map (slab_granule), aligned, and each has the slab's entry there (its
 * state array, start and class under the pool's tag: slab_unit), so the
 * free fast path finds a pointer's class, block index and state byte
 * without touching the slab descriptor or the superblock.
 *
 * Checked mode adds a bit per slab block (allocated or not) and, on the
 * host, guard canaries: an allocation of n bytes takes a block of G + n + 16
 * bytes (G = 64, or the alignment if larger), the user pointer is block + G,
 * the first 16 bytes of the front guard hold a magic word, n and G, and the
 * rest of both guards hold a fixed pattern, verified on free. A freed small
 * block of a checked host pool is filled with FREED_BYTE, verified when it
 * is handed out again and by llmem_pool_check.
 *
 * Invariants (llmem_pool_check verifies them): a slab's used + free-list
 * length = carved <= nblocks; every free-list entry is a carved block
 * boundary; a slab's state bytes set number at most `used` (exactly, in a
 * pool without thread caches); a class's live and
 * slab counts equal the sums over its slabs.
 *
 * Locking: the pool lock is held for all but the guard helpers, which touch
 * only the block they are given.
 */
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

/* ---- guards (checked host pools) ----------------------------------------- */


/* Write the guards around [user, user+n) inside [block, block+bsize). */
void llmem__pool_guards_write(uintptr_t block, size_t bsize, uintptr_t user, size_t n)
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
bool llmem__pool_guards_header(uintptr_t block, size_t *n, size_t *g)
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
bool llmem__pool_guards_intact(uintptr_t block, size_t bsize, uintptr_t user, size_t n)
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
size_t llmem__pool_freed_damage(uintptr_t block, size_t csize)
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
    LIST_PUSH(c->partial, s, lprev, lnext);
}

static void partial_remove(central *c, slab *s)
{
    if (!s->listed) return;
    LIST_UNLINK(c->partial, s, lprev, lnext);
    s->listed = false;
}

static slab *slab_new(llmem_pool *p, unsigned cls, llmem_status *st)
{
    size_t bytes = p->cls.slab_bytes[cls];
    pblock *b = llmem__pool_take_pages(p, HEAP_SMALL, bytes, slab_granule(p->unit), st);
    if (!b) return NULL;
    slab *s = (slab *)b;
    s->nblocks = p->cls.slab_blocks[cls];
    s->used = s->carved = s->nfree = 0;
    s->free_head = NULL;
    s->free_idx = NULL;
    s->listed = false;
    if (!p->inband) s->free_idx = malloc(s->nblocks * sizeof *s->free_idx);
    s->state = llmem_fixed_alloc(p->states[state_pool(s->nblocks)], NULL);
    if (s->state) memset(s->state, 0, s->nblocks);
    if ((!p->inband && !s->free_idx) || !s->state) {
        free(s->free_idx);
        if (s->state) llmem_fixed_free(p->states[state_pool(s->nblocks)], s->state);
        llmem__pool_put_pages(p, b);
        *st = llmem__fail(LLMEM_ENOMEM, "pool '%s': out of host memory for slab metadata", p->name);
        return NULL;
    }
    b->kind = D_SLAB;
    b->cls = (uint16_t)cls;
    superblock *sb = b->sb;
    size_t u0 = unit_of(sb, b->start, p->ushift), n = b->size >> p->ushift;
    for (size_t i = 0; i < n; i++) sb->owner[u0 + i] = b;
    llmem__assert(b->start % LLMEM_ADDRMAP_UNIT == 0 && b->size % LLMEM_ADDRMAP_UNIT == 0);
    llmem__addrmap_set_slab(b->start, b->size, &(slab_unit){s->state, (uint32_t)b->start, pool_utag(p) | (uint32_t)cls});
    central *c = &p->central[cls];
    ST_ADD(c->slabs, 1);
    c->empty_slabs++;
    partial_add(c, s);
    ST_ADD(p->st.slab_bytes, b->size);
    return s;
}

void llmem__pool_slab_release(llmem_pool *p, slab *s)
{
    central *c = &p->central[s->b.cls];
    partial_remove(c, s);
    ST_SUB(c->slabs, 1);
    c->empty_slabs--;
    free(s->free_idx);
    llmem_fixed_free(p->states[state_pool(s->nblocks)], s->state);
    superblock *sb = s->b.sb;
    size_t u0 = unit_of(sb, s->b.start, p->ushift), n = s->b.size >> p->ushift;
    for (size_t i = 1; i < n; i++) sb->owner[u0 + i] = NULL;
    llmem__addrmap_set_slab(s->b.start, s->b.size, &(slab_unit){NULL, 0, 0});
    ST_SUB(p->st.slab_bytes, s->b.size);
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
            size_t at = llmem__pool_freed_damage(b, csize);
            if (at < csize) {
                /* Reported, counted, and handed out anyway: the caller gets
                 * its memory, the bug is named where it can be found. */
                ST_ADD(p->st.corruptions_total, 1);
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
    /* used + free-list length == carved, carved <= nblocks */
    llmem__assert(s->used + s->nfree == s->carved && s->carved <= s->nblocks);
    return b;
}

static void slab_put(llmem_pool *p, slab *s, uintptr_t b, uint32_t idx)
{
    central *c = &p->central[s->b.cls];
    llmem__assert(s->used > 0 && b >= s->b.start && b < s->b.start + (uintptr_t)s->carved * p->cls.size[s->b.cls]);
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
        if (c->empty_slabs > 1) llmem__pool_slab_release(p, s);
    }
}



/* A block of class cls out of the slabs (counted as handed out). Lock held. */
uintptr_t llmem__pool_small_take(llmem_pool *p, unsigned cls, llmem_status *st, uint8_t **state)
{
    central *c = &p->central[cls];
    slab *s = c->partial;
    if (!s && !(s = slab_new(p, cls, st))) return 0;
    size_t csize = p->cls.size[cls];
    uintptr_t block = slab_take(p, s, csize);
    if (s->used == s->nblocks) partial_remove(c, s);
    *state = slab_state(s, (uint32_t)((block - s->b.start) / csize));
    ST_ADD(c->live, 1);
    ST_ADD(p->st.used_bytes, csize);
    ST_ADD(p->st.live_allocations, 1);
    return block;
}

/* Give a slab block back. Lock held. */
void llmem__pool_small_put(llmem_pool *p, slab *s, uintptr_t block, uint32_t idx)
{
    ST_SUB(p->central[s->b.cls].live, 1);
    ST_SUB(p->st.used_bytes, p->cls.size[s->b.cls]);
    ST_SUB(p->st.live_allocations, 1);
    slab_put(p, s, block, idx);
}

