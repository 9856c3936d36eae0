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
 * Each entry also holds a word for the owner's fast path (aux), read with
 * the same two loads: the dynamic pool stores there its superblock's
 * per-unit table, biased by the superblock's base, so that a free finds a
 * pointer's unit entry without loading the superblock first (one
 * dependent load fewer; see pool_internal.h, "slab_unit").
 */
#ifndef LLMEM_ADDRMAP_H
#define LLMEM_ADDRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/status.h"

#define LLMEM_ADDRMAP_SHIFT 16
#define LLMEM_ADDRMAP_UNIT ((size_t)1 << LLMEM_ADDRMAP_SHIFT)

/* Map every unit of [start, start+size) to owner, with the word aux (0 if
 * the owner has no use for it). start and size must be unit multiples.
 * LLMEM_ENOTSUP for addresses beyond 48 bits, LLMEM_ENOMEM when a node
 * cannot be allocated (nothing is registered then). */
llmem_status llmem__addrmap_set(uintptr_t start, size_t size, void *owner, uintptr_t aux);

/* Forget [start, start+size). */
void llmem__addrmap_clear(uintptr_t start, size_t size);

/* The tree, for the inline lookups below; written only by addrmap.c. Two
 * levels of 2^16 entries: the root is a static array (untouched pages of it
 * cost nothing), leaves (1 MiB each, for 4 GiB of address space; only the
 * pages holding entries ever touched) are allocated on first use. An entry's two
 * words share a line: a lookup of both misses once. */
typedef struct llmem__addrmap_entry {
    void *owner;
    uintptr_t aux;
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

/* The aux word of the unit holding p, or 0 (no owner, or none set). Two
 * dependent acquire loads, as llmem__addrmap_get. A reader that got p from
 * the owner (a block it handed out) sees the word stored with the
 * registration. */
static inline uintptr_t llmem__addrmap_aux(uintptr_t p)
{
    const llmem__addrmap_entry *e = llmem__addrmap_entry_of(p);
    return e ? __atomic_load_n(&e->aux, __ATOMIC_ACQUIRE) : 0;
}

#endif
