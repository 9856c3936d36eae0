/*
 * size_class.c - building the class table (see size_class.h).
 */
#include "size_class.h"

#include <assert.h>
#include <stdlib.h>

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

bool llmem__classes_init(llmem__size_classes *c, size_t align, size_t unit, size_t granule, const uint32_t *extra,
                         size_t n_extra)
{
    c->align = align;
    c->align_shift = (unsigned)__builtin_ctzll(align);
    c->unit = unit;
    c->max_small = 8 * unit;
    unsigned n = 0;
    size_t s = align;
    while (s <= c->max_small && n < LLMEM_MAX_CLASSES) {
        c->size[n++] = (uint32_t)s;
        if (s < 16 * align) {
            s += align;
        } else {
            size_t pow = 16 * align; /* largest power of two <= s, at least 16A */
            while (pow * 2 <= s) pow *= 2;
            s += pow / 8;
        }
    }
    assert(c->size[n - 1] == c->max_small);
    for (size_t e = 0; e < n_extra; e++) {
        size_t x = ((size_t)extra[e] + align - 1) & ~(align - 1);
        if (x == 0 || x > c->max_small) continue;
        bool dup = false;
        for (unsigned i = 0; i < n && !dup; i++) dup = c->size[i] == x;
        if (dup) continue;
        if (n == LLMEM_MAX_CLASSES) return false;
        c->size[n++] = (uint32_t)x;
    }
    qsort(c->size, n, sizeof c->size[0], cmp_u32);
    c->count = n;
    for (unsigned i = 0; i < n; i++) {
        size_t b = c->size[i];
        size_t min = 8 * b > 4 * unit ? 8 * b : 4 * unit;
        size_t slab = (min + granule - 1) / granule * granule;
        while ((slab % b) > slab / 16) slab += granule;
        /* A tail of up to 1/16 is allowed, but up to three granules more
         * buy one of at most 1/64 where they can. */
        for (size_t more = slab; more <= slab + 3 * granule; more += granule)
            if ((more % b) <= more / 64) {
                slab = more;
                break;
            }
        c->slab_bytes[i] = (uint32_t)slab;
        c->slab_blocks[i] = (uint32_t)(slab / b);
    }
    unsigned cls = 0;
    for (size_t k = 0; k * align <= c->max_small; k++) {
        while (c->size[cls] < k * align) cls++;
        c->lookup[k] = (uint8_t)cls;
    }
    return true;
}
