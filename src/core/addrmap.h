/*
 * addrmap.h - the process-wide address map: which superblock owns an
 * address. Not installed.
 *
 * A three-level radix tree over 64 KiB units of the low 48 bits of the
 * address space (tcmalloc's pagemap idea): free(ptr) finds its superblock
 * with three dependent loads, for host and device memory alike (device
 * pointers live in the same virtual address space under CUDA's unified
 * addressing, and sim-device memory is host address space). Readers take no
 * lock; writers (superblock map and unmap, rare) serialise on one mutex and
 * publish nodes with release stores. Nodes are never freed: the map only
 * grows with the address space ever used, 8 KiB per 64 MiB touched.
 *
 * Owners must cover whole units: a registered range starts and ends on a
 * 64 KiB boundary, so two owners never share a unit.
 */
#ifndef LLMEM_ADDRMAP_H
#define LLMEM_ADDRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/status.h"

#define LLMEM_ADDRMAP_SHIFT 16
#define LLMEM_ADDRMAP_UNIT ((size_t)1 << LLMEM_ADDRMAP_SHIFT)

/* Map every unit of [start, start+size) to owner. start and size must be
 * unit multiples. LLMEM_ENOTSUP for addresses beyond 48 bits, LLMEM_ENOMEM
 * when a node cannot be allocated (nothing is registered then). */
llmem_status llmem__addrmap_set(uintptr_t start, size_t size, void *owner);

/* Forget [start, start+size). */
void llmem__addrmap_clear(uintptr_t start, size_t size);

/* The tree, for the inline lookup below; written only by addrmap.c. */
typedef struct llmem__addrmap_leaf {
    void *owner[1024];
} llmem__addrmap_leaf;
typedef struct llmem__addrmap_node {
    llmem__addrmap_leaf *leaves[1024];
} llmem__addrmap_node;
extern llmem__addrmap_node *llmem__addrmap_root[4096];

/* The owner of the unit holding p, or NULL. Lock-free: three dependent
 * acquire loads (plain moves on x86). */
static inline void *llmem__addrmap_get(uintptr_t p)
{
    uint64_t key = (uint64_t)p >> LLMEM_ADDRMAP_SHIFT;
    if (key >> 32) return NULL;
    llmem__addrmap_node *n = __atomic_load_n(&llmem__addrmap_root[key >> 20], __ATOMIC_ACQUIRE);
    if (!n) return NULL;
    llmem__addrmap_leaf *l = __atomic_load_n(&n->leaves[(key >> 10) & 1023], __ATOMIC_ACQUIRE);
    if (!l) return NULL;
    return __atomic_load_n(&l->owner[key & 1023], __ATOMIC_ACQUIRE);
}

#endif
