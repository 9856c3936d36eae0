/*
 * pool_shim.c - the pool internals libllmem-malloc.so needs (see
 * pool_shim.h): fork hooks and a lock-free usable size.
 *
 * Fork.
 * Everything a pool operation changes under the pool lock (slabs, free
 * runs, superblocks, the descriptor pool, the address map, the resource)
 * is changed only with the pool lock held, so holding it across fork
 * leaves the child a consistent pool. Thread-cache fast paths take no
 * lock but touch only their own thread's cache, which the child either
 * owns (the forking thread) or never touches again.
 *
 * Usable size without the lock. A live slab block keeps its slab (and so
 * the superblock's slab_info entries for it) alive, and a live large
 * block's descriptor and owner entry change only when it is freed or
 * resized, which its owner is not doing while it asks. So for a live
 * block start the tables can be read as they are; the locked query
 * answers everything this cannot vouch for.
 */
#include "pool_shim.h"

#include "addrmap.h"
#include "pool_internal.h"

void llmem__pool_fork_prepare(llmem_pool *p)
{
    if (p) pthread_mutex_lock(&p->lock);
}

void llmem__pool_fork_parent(llmem_pool *p)
{
    if (p) pthread_mutex_unlock(&p->lock);
}

void llmem__pool_fork_child(llmem_pool *p)
{
    if (p) pthread_mutex_init(&p->lock, NULL);
}

size_t llmem__pool_usable_nolock(const llmem_pool *p, const void *ptr)
{
    uintptr_t a = (uintptr_t)ptr;
    if (!p || !ptr || p->checked) return llmem_pool_usable_size(p, ptr);
    superblock *sb = llmem__addrmap_get(a);
    if (!sb || sb->pool != p) return 0;
    size_t u = unit_of(sb, a, p->ushift);
    uint32_t info = sb->slab_info[u];
    if (info) {
        unsigned c = (info >> 24) - 1;
        size_t csize = p->cls.size[c];
        size_t off = ((a - sb->base) & (p->unit - 1)) + ((size_t)(info & 0xffffff) << p->ushift);
        /* A block boundary: exact division by the class size with the
         * pool's reciprocal (as its free path checks it). */
        uint64_t i = ((uint64_t)off * p->magic[c]) >> MAGIC_SHIFT;
        if (i * csize == off) return csize;
    } else {
        const pblock *b = sb->owner[u];
        if (b && b->kind == D_LARGE && b->user == a) return b->start + b->size - a;
    }
    return llmem_pool_usable_size(p, ptr);
}
