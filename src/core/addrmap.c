/*
 * addrmap.c - two-level radix tree from 64 KiB units to owners.
 *
 * Key = address >> 16 (32 bits for 48-bit addresses), split 16/16: a
 * static root of 65536 leaf pointers, leaves of 65536 (owner, slab entry)
 * entries mapped zeroed on first use (calloc of 2 MiB: fresh pages,
 * touched only where entries are written). A registration stores the
 * zeroed slab entry before the owner, and a removal clears the owner
 * first.
 */
#include "addrmap.h"

#include <pthread.h>
#include <stdlib.h>

#include "internal.h"

#define KEY_BITS 32
#define LEAF_BITS 16
#define LEAF_SIZE ((uint64_t)1 << LEAF_BITS)

typedef llmem__addrmap_leaf leaf;
_Static_assert(sizeof(llmem__addrmap_entry) == 32, "an entry's index is a shift");
_Static_assert(sizeof(leaf) == LEAF_SIZE * sizeof(llmem__addrmap_entry), "leaf size");

leaf *llmem__addrmap_root[(size_t)1 << (KEY_BITS - LEAF_BITS)];
#define root llmem__addrmap_root
static pthread_mutex_t write_lock = PTHREAD_MUTEX_INITIALIZER;

static inline bool in_range(uintptr_t p) { return (uint64_t)p >> (LLMEM_ADDRMAP_SHIFT + KEY_BITS) == 0; }

/* The leaf for key, created if `create`. Write lock held. */
static leaf *leaf_for(uint64_t key, bool create)
{
    leaf **lp = &root[key >> LEAF_BITS];
    leaf *l = *lp;
    if (!l) {
        if (!create || !(l = calloc(1, sizeof *l))) return NULL;
        __atomic_store_n(lp, l, __ATOMIC_RELEASE);
    }
    return l;
}

llmem_status llmem__addrmap_set(uintptr_t start, size_t size, void *owner)
{
    if (size == 0) return LLMEM_OK;
    uintptr_t last = start + size - 1;
    if (last < start || !in_range(last))
        return llmem__fail(LLMEM_ENOTSUP, "address map: [%p, +%zu) lies beyond the 48-bit address space",
                           (void *)start, size);
    uint64_t k0 = (uint64_t)start >> LLMEM_ADDRMAP_SHIFT, k1 = (uint64_t)last >> LLMEM_ADDRMAP_SHIFT;
    pthread_mutex_lock(&write_lock);
    /* Create every leaf first, so a failure registers nothing. */
    for (uint64_t k = k0; k <= k1; k = (k | (LEAF_SIZE - 1)) + 1) {
        if (!leaf_for(k, true)) {
            pthread_mutex_unlock(&write_lock);
            return llmem__fail(LLMEM_ENOMEM, "address map: out of memory for a leaf");
        }
    }
    for (uint64_t k = k0; k <= k1; k++) {
        llmem__addrmap_entry *e = &leaf_for(k, false)->e[k & (LEAF_SIZE - 1)];
        e->slab = (llmem__slab_unit){NULL, 0, 0};
        __atomic_store_n(&e->owner, owner, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&write_lock);
    return LLMEM_OK;
}

void llmem__addrmap_clear(uintptr_t start, size_t size)
{
    if (size == 0) return;
    uintptr_t last = start + size - 1;
    if (last < start || !in_range(last)) return;
    uint64_t k0 = (uint64_t)start >> LLMEM_ADDRMAP_SHIFT, k1 = (uint64_t)last >> LLMEM_ADDRMAP_SHIFT;
    pthread_mutex_lock(&write_lock);
    for (uint64_t k = k0; k <= k1; k++) {
        leaf *l = leaf_for(k, false);
        if (!l) continue;
        __atomic_store_n(&l->e[k & (LEAF_SIZE - 1)].owner, NULL, __ATOMIC_RELEASE);
        l->e[k & (LEAF_SIZE - 1)].slab = (llmem__slab_unit){NULL, 0, 0};
    }
    pthread_mutex_unlock(&write_lock);
}

void llmem__addrmap_set_slab(uintptr_t start, size_t size, const llmem__slab_unit *su)
{
    if (size == 0) return;
    uint64_t k0 = (uint64_t)start >> LLMEM_ADDRMAP_SHIFT, k1 = (uint64_t)(start + size - 1) >> LLMEM_ADDRMAP_SHIFT;
    for (uint64_t k = k0; k <= k1; k++) {
        leaf *l = __atomic_load_n(&root[k >> LEAF_BITS], __ATOMIC_ACQUIRE);
        if (l) l->e[k & (LEAF_SIZE - 1)].slab = *su;
    }
}
