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

/* The owner of the unit holding p, or NULL. Lock-free. */
void *llmem__addrmap_get(uintptr_t p);

#endif
