/*
 * size_class.c - building the class table (see size_class.h).
 */
#include "size_class.h"

#include <assert.h>

void llmem__classes_init(llmem_size_classes *c, size_t align, size_t unit)
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
    c->count = n;
    assert(c->size[n - 1] == c->max_small);
    for (unsigned i = 0; i < n; i++) {
        size_t b = c->size[i];
        size_t min = 8 * b > 4 * unit ? 8 * b : 4 * unit;
        size_t slab = (min + unit - 1) / unit * unit;
        while ((slab % b) > slab / 16) slab += unit;
        c->slab_bytes[i] = (uint32_t)slab;
        c->slab_blocks[i] = (uint32_t)(slab / b);
    }
    unsigned cls = 0;
    for (size_t k = 0; k * align <= c->max_small; k++) {
        while (c->size[cls] < k * align) cls++;
        c->lookup[k] = (uint8_t)cls;
    }
}
