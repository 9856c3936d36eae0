/*
 * addrmap.h - the process-wide address map: which superblock owns an
 * address. Not installed.
 *
 * A two-level radix tree over 64 KiB units of the low 48 bits of the
 * address space (tcmalloc's pagemap idea): free(ptr) finds its superblock
 * with two dependent loads, for host and device memory alike (device
 * pointers live in the same virtual address space under CUDA's unified
 * addressing, and sim-device memory is host address space). Readers take no
 * lock; writers (superblock map and unmap, rare) serialise on one mutex and
 * publish leaves with release stores. Leaves are never freed: the map only
 * grows with the address space ever used, 16 KiB resident per 64 MiB of
 * superblocks (a leaf's untouched pages stay unbacked).
 *
 * Owners must cover whole units: a registered range starts and ends on a
 * 64 KiB boundary, so two owners never share a unit.
 *
 * Each entry also holds the dynamic pool's slab entry for the unit
 * (llmem__slab_unit), read with the same two loads: a pool lays its slabs
 * on whole units, so a free finds a pointer's slab (its class, start and
 * state bytes) in the map itself, with no table of the superblock's to
 * load after it (one dependent load and eleven instructions fewer than
 * the per-superblock table reached through an aux word that this
 * replaced; see pool_internal.h, "slab_unit").
 */
#ifndef LLMEM_ADDRMAP_H
#define LLMEM_ADDRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/status.h"

#define LLMEM_ADDRMAP_SHIFT 16
#define LLMEM_ADDRMAP_UNIT ((size_t)1 << LLMEM_ADDRMAP_SHIFT)

/* A unit's slab entry, as the dynamic pool's free fast path reads it
 * (pool_internal.h, "slab_unit"): the slab's state array, the low half of
 * the slab's start address, and its class under its pool's tag. All zero
 * for a unit outside slabs. */
typedef struct llmem__slab_unit {
    uint8_t *state;             /* the slab's state bytes */
    uint32_t start;             /* (uint32_t) of the slab's first byte */
    uint32_t ctag;              /* pool tag | class: never below 256 in a slab, 0 outside */
} llmem__slab_unit;

/* Map every unit of [start, start+size) to owner, with zero slab entries.
 * start and size must be unit multiples. LLMEM_ENOTSUP for addresses
 * beyond 48 bits, LLMEM_ENOMEM when a node cannot be allocated (nothing
 * is registered then). */
llmem_status llmem__addrmap_set(uintptr_t start, size_t size, void *owner);

/* Set the slab entry of every unit of [start, start+size) (unit
 * multiples, registered by the caller, who alone writes them: no lock).
 * Plain stores: a reader of an entry got its address from a block the
 * owner handed out after writing it, under the owner's own lock. */
void llmem__addrmap_set_slab(uintptr_t start, size_t size, const llmem__slab_unit *su);

/* Forget [start, start+size), slab entries included. */
void llmem__addrmap_clear(uintptr_t start, size_t size);

/* The tree, for the inline lookups below; written only by addrmap.c. Two
 * levels of 2^16 entries: the root is a static array (untouched pages of it
 * cost nothing), leaves (2 MiB each, for 4 GiB of address space; only the
 * pages holding entries ever touched: one page per 8 MiB of address space
 * used) are allocated on first use. An entry is 32 bytes, aligned, so its
 * index is a shift and its words share a line: a lookup misses once. */
typedef struct llmem__addrmap_entry {
    void *owner;
    void *spare;                /* pads the entry to 32 bytes */
    llmem__slab_unit slab;
} llmem__addrmap_entry;
typedef struct llmem__addrmap_leaf {
    llmem__addrmap_entry e[65536];
} llmem__addrmap_leaf;
extern llmem__addrmap_leaf *llmem__addrmap_root[65536];

/* The entry of the unit holding p, or NULL when no leaf covers it. */
static inline const llmem__addrmap_entry *llmem__addrmap_entry_of(uintptr_t p)
{
    uint64_t hi = (uint64_t)p >> 32; /* the root's index: 48-bit addresses only */
    if (hi > 65535) return NULL;
    llmem__addrmap_leaf *l = __atomic_load_n(&llmem__addrmap_root[hi], __ATOMIC_ACQUIRE);
    return l ? &l->e[((uint64_t)p >> LLMEM_ADDRMAP_SHIFT) & 65535] : NULL;
}

/* The owner of the unit holding p, or NULL. Lock-free: two dependent
 * acquire loads (plain moves on x86). */
static inline void *llmem__addrmap_get(uintptr_t p)
{
    const llmem__addrmap_entry *e = llmem__addrmap_entry_of(p);
    return e ? __atomic_load_n(&e->owner, __ATOMIC_ACQUIRE) : NULL;
}

/* The slab entry of the unit holding p: all zero (a static entry) when
 * no leaf covers p, so never NULL and the caller tests one field. Two
 * dependent loads (root, then the entry's fields). */
static inline const llmem__slab_unit *llmem__addrmap_slab(uintptr_t p)
{
    static const llmem__slab_unit none;
    const llmem__addrmap_entry *e = llmem__addrmap_entry_of(p);
    return e ? &e->slab : &none;
}

#endif
