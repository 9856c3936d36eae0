/*
 * size_class.h - the size classes of the dynamic pool. Not installed.
 *
 * With A the pool's minimum alignment (16 on the host, 256 on a device)
 * and U its unit (the page of its large-block allocator: 4 KiB host, 64 KiB
 * device): classes are the multiples of A up to 16A, then eight classes per
 * power of two up to 8U. So waste (block - request) is at most 1/9 of the
 * block, 12.5% of the request, from 8A (128 B on the host) up; below that
 * the A-step bounds it (a 65 B request takes 80 B). Requests above 8U go to
 * the large-block allocator at unit granularity, again within 1/9.
 *
 * Each class has a slab size: the smallest multiple of the slab granule G
 * (a multiple of U: the pool lays slabs on whole units of its address map,
 * 64 KiB) that holds at least 8 blocks and 4 units, and wastes at most
 * 1/16 of itself at the tail; or, where one of the next three multiples
 * wastes at most 1/64, that one (sqlite3's 4,480-byte class wasted 4.3%
 * of a 64 KiB slab, 0.9% of 128 KiB: its peak RSS 62.7 -> 61.8 MiB). A
 * byte table maps a size to its class in one load.
 */
#ifndef LLMEM_SIZE_CLASS_H
#define LLMEM_SIZE_CLASS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LLMEM_MAX_CLASSES 96

typedef struct llmem__size_classes {
    size_t align;       /* A */
    unsigned align_shift; /* log2(A) */
    size_t unit;        /* U */
    size_t max_small;   /* largest class size (8U) */
    unsigned count;
    uint32_t size[LLMEM_MAX_CLASSES];
    uint32_t slab_bytes[LLMEM_MAX_CLASSES];
    uint32_t slab_blocks[LLMEM_MAX_CLASSES];
    uint8_t lookup[4096 + 1]; /* (size + A - 1) / A -> class, for size <= max_small */
} llmem__size_classes;

/* Build the table. align and unit are powers of two with unit >= 16 * align
 * and 8 * unit / align <= 4096; granule, the slabs' size step, is a power
 * of two of at least unit. `extra` sizes (n of them, profile-chosen)
 * become classes of their own, rounded up to align; sizes above the largest
 * class are ignored. False if the classes would be more than
 * LLMEM_MAX_CLASSES. */
bool llmem__classes_init(llmem__size_classes *c, size_t align, size_t unit, size_t granule, const uint32_t *extra,
                         size_t n);

/* Class of a size in 1..max_small. */
static inline unsigned llmem__class_of(const llmem__size_classes *c, size_t size)
{
    return c->lookup[(size + c->align - 1) >> c->align_shift];
}

#endif
