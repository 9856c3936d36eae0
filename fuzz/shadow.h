/*
 * shadow.h - what the allocator fuzz targets (fuzz_pool, fuzz_fixed,
 * fuzz_arena) share beyond support.h: sizes drawn from the input, the
 * resource stack under the allocator, and a content pattern for blocks.
 *
 * Each live block holds, at the offsets fz_ranges() names, a pattern that
 * depends on the block's id and the offset, so a block handed out twice,
 * moved without its bytes, or overwritten by a neighbour reads back wrong.
 * The offsets are sparse for large blocks (the first and last 256 bytes and
 * 16 bytes every 4 KiB), so a run stays fast with megabyte blocks. Device
 * memory (the sim-device resource, PROT_NONE to the host) is reached only
 * through llmem_resource_copy, and only at the two ends of a block.
 *
 * Header-only, static functions: each target is one executable.
 */
#ifndef LLMEM_FUZZ_SHADOW_H
#define LLMEM_FUZZ_SHADOW_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/llmem.h"

#include "support.h"

/* A size from 1 to cap: mostly small (where the size classes are), some
 * medium, a few large, so slabs, page runs and superblock growth all see
 * traffic. */
static inline size_t fz_size(fz_in *in, size_t cap)
{
    unsigned scale = fz_u8(in) % 8;
    size_t v = fz_u16(in), s;
    switch (scale) {
    case 0:
    case 1: s = 1 + v % 64; break;
    case 2:
    case 3: s = 1 + v % 1024; break;
    case 4: s = 1 + v % 8192; break;
    case 5: s = 1 + v % 65536; break;
    case 6: s = 1 + (v << 4); break;
    default: s = 1 + (v << 6); break;
    }
    return s > cap ? 1 + s % cap : s;
}

/* The resources under an allocator target: the os resource, or a sim
 * device (PROT_NONE to the host), with a tracking resource over it that
 * sees every mapping, and optionally a limit resource on top. */
typedef struct fz_stack {
    llmem_resource *base, *track, *limit;
} fz_stack;

/* The base (the os resource when so is NULL, else a sim device made with
 * *so) and tracking over it; returns the top of the stack. */
static inline llmem_resource *fz_stack_open(fz_stack *s, const llmem_sim_options *so)
{
    if (!so) s->base = llmem_resource_default();
    else FZ_CHECK(llmem_sim_resource_create(so, &s->base) == LLMEM_OK);
    FZ_CHECK(llmem_tracking_resource_create(s->base, &s->track) == LLMEM_OK);
    return s->track;
}

/* A limit resource of limit_bytes over tracking; returns the new top. */
static inline llmem_resource *fz_stack_limit(fz_stack *s, size_t limit_bytes)
{
    llmem_limit_options lo = llmem_limit_options_default();
    lo.limit_bytes = limit_bytes;
    FZ_CHECK(llmem_limit_resource_create(s->track, &lo, &s->limit) == LLMEM_OK);
    return s->limit;
}

/* After the allocator is destroyed: tracking must hold no mapping and have
 * refused nothing (the allocator never asked past a limit it knew); then
 * the stack comes down. */
static inline void fz_stack_close(fz_stack *s)
{
    llmem_tracking_stats ts = {sizeof ts};
    FZ_CHECK(llmem_tracking_resource_get_stats(s->track, &ts) == LLMEM_OK);
    FZ_CHECK(ts.live_mappings == 0 && ts.live_bytes == 0 && ts.refused_total == 0);
    llmem_resource_destroy(s->limit);
    llmem_resource_destroy(s->track);
    if (s->base != llmem_resource_default()) llmem_resource_destroy(s->base);
}

/* Pattern byte i of block id. */
static inline uint8_t fz_pat(uint32_t id, size_t i)
{
    uint32_t h = (id + 1) * 2654435761u;
    return (uint8_t)((h >> 24) + i * 7 + (i >> 8) * 13);
}

/* Where memory lives: host (dev NULL) or device, reached through copy. */
typedef struct fz_mem {
    llmem_resource *dev;
} fz_mem;

/* The ranges of a block of n bytes that carry the pattern, clipped to
 * [0, limit): fn(ctx, off, len) for each. Device blocks get only the ends
 * (each a copy, with two page-protection changes). */
static inline void fz_ranges(const fz_mem *m, size_t n, size_t limit,
                             void (*fn)(const fz_mem *, void *, size_t, size_t), void *ctx)
{
    size_t head = n < 256 ? n : 256, tail = n > 512 ? n - 256 : head;
    size_t spots[2][2] = {{0, head}, {tail, n}};
    for (int k = 0; k < 2; k++) {
        size_t a = spots[k][0], b = spots[k][1] < limit ? spots[k][1] : limit;
        if (a < b) fn(m, ctx, a, b - a);
    }
    if (m->dev) return;
    for (size_t a = 4096; a + 16 <= tail && a < limit; a += 4096) fn(m, ctx, a, a + 16 <= limit ? 16 : limit - a);
}

typedef struct fz_block_ref {
    void *p;
    uint32_t id;
    bool zero; /* expect zeros instead of the pattern (calloc) */
} fz_block_ref;

static inline void fz_fill_range(const fz_mem *m, void *ctx, size_t off, size_t len)
{
    const fz_block_ref *r = ctx;
    uint8_t buf[256];
    for (size_t i = 0; i < len; i++) buf[i] = fz_pat(r->id, off + i);
    if (!m->dev) memcpy((char *)r->p + off, buf, len);
    else FZ_CHECK(llmem_resource_copy(m->dev, (char *)r->p + off, buf, len) == LLMEM_OK);
}

static inline void fz_verify_range(const fz_mem *m, void *ctx, size_t off, size_t len)
{
    const fz_block_ref *r = ctx;
    uint8_t buf[256];
    if (!m->dev) memcpy(buf, (const char *)r->p + off, len);
    else FZ_CHECK(llmem_resource_copy(m->dev, buf, (const char *)r->p + off, len) == LLMEM_OK);
    for (size_t i = 0; i < len; i++) FZ_CHECK(buf[i] == (r->zero ? 0 : fz_pat(r->id, off + i)));
}

/* Write block id's pattern into the n bytes at p. */
static inline void fz_fill(const fz_mem *m, void *p, size_t n, uint32_t id)
{
    fz_block_ref r = {p, id, false};
    fz_ranges(m, n, n, fz_fill_range, &r);
}

/* Check the pattern of a block of n bytes written by fz_fill, in its first
 * limit bytes only (what a resize kept). */
static inline void fz_verify(const fz_mem *m, const void *p, size_t n, size_t limit, uint32_t id)
{
    fz_block_ref r = {(void *)(uintptr_t)p, id, false};
    fz_ranges(m, n, limit, fz_verify_range, &r);
}

/* Check that the n bytes at p read as zeros where the pattern would go. */
static inline void fz_verify_zero(const fz_mem *m, const void *p, size_t n)
{
    fz_block_ref r = {(void *)(uintptr_t)p, 0, true};
    fz_ranges(m, n, n, fz_verify_range, &r);
}

/* True if [a, a+an) and [b, b+bn) share a byte. */
static inline bool fz_overlap(const void *a, size_t an, const void *b, size_t bn)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + bn && y < x + an;
}

static inline bool fz_aligned(const void *p, size_t align) { return ((uintptr_t)p & (align - 1)) == 0; }

#endif /* LLMEM_FUZZ_SHADOW_H */
