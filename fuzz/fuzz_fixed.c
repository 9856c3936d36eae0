/*
 * fuzz_fixed.c - API sequences on the fixed-size block pool against a
 * shadow model.
 *
 * The first bytes choose the pool: block size (sometimes 0: create must say
 * LLMEM_EINVAL), alignment (sometimes invalid: LLMEM_EALIGN), chunk sizes,
 * max_blocks and initial_blocks (more initial than max: LLMEM_ECAPACITY),
 * plain or thread_safe with a magazine size (above 65536: LLMEM_EINVAL),
 * checked or not, over the os resource (optionally under a limit) or
 * sim-device, with a tracking resource under it all. Then each op byte
 * picks alloc, free, an invalid free (checked pools only: double, foreign,
 * interior; the header documents those statuses), owns, the magazine
 * flush, or a full sweep; the next bytes are its arguments.
 *
 * The shadow keeps every live block (address, id). Every result is
 * checked: a block is aligned, lies on the pool's block grid (owns), never
 * overlaps a live block; its pattern (shadow.h, over the whole stride)
 * reads back on free and in sweeps; the pool refuses with LLMEM_ECAPACITY
 * exactly when max_blocks are live, and with LLMEM_ENOMEM only under a cap;
 * the stats agree with the shadow after every op (blocks in use,
 * allocations, frees, failures, double and foreign frees, capacity within
 * max_blocks, chunks and bytes as the tracking resource saw them). After
 * destroy the tracking resource holds no mapping.
 */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "llmem/llmem.h"
#include "shadow.h"

enum { MAXLIVE = 256, MAXSTEPS = 2000, SWEEP = 256 };

typedef struct blk {
    void *p;
    uint32_t id;
} blk;

typedef struct model {
    llmem_fixed *pool;
    fz_stack rs;
    fz_mem mem;
    bool host, checked, constrained;
    size_t stride, align, max_blocks;
    blk live[MAXLIVE];
    size_t nlive;
    void *freed[8];
    size_t nfreed;
    uint32_t next_id;
    uint64_t allocs, frees, failures, doubles, foreigns;
} model;

static char foreign_bytes[64];

static void stats_check(const model *m)
{
    llmem_fixed_stats s = {sizeof s};
    FZ_CHECK(llmem_fixed_get_stats(m->pool, &s) == LLMEM_OK);
    FZ_CHECK(s.stride == m->stride && llmem_fixed_block_size(m->pool) == m->stride);
    FZ_CHECK(s.blocks_in_use == m->nlive && s.blocks_in_use_peak >= s.blocks_in_use);
    FZ_CHECK(s.allocs_total == m->allocs && s.frees_total == m->frees);
    FZ_CHECK(s.failures_total == m->failures);
    FZ_CHECK(s.double_frees_total == m->doubles && s.foreign_frees_total == m->foreigns);
    FZ_CHECK(s.blocks_capacity >= m->nlive);
    if (m->max_blocks) FZ_CHECK(s.blocks_capacity <= m->max_blocks);
    FZ_CHECK(s.reserved_bytes >= s.blocks_capacity * s.stride);
    llmem_tracking_stats ts = {sizeof ts};
    FZ_CHECK(llmem_tracking_resource_get_stats(m->rs.track, &ts) == LLMEM_OK);
    FZ_CHECK(ts.live_mappings == s.chunks && ts.live_bytes == s.reserved_bytes && ts.refused_total == 0);
}

static void sweep(const model *m)
{
    for (size_t i = 0; i < m->nlive; i++) fz_verify(&m->mem, m->live[i].p, m->stride, m->stride, m->live[i].id);
}

static bool is_live(const model *m, const void *p)
{
    for (size_t i = 0; i < m->nlive; i++)
        if (m->live[i].p == p) return true;
    return false;
}

static void op_alloc(model *m)
{
    if (m->nlive == (m->host ? MAXLIVE : MAXLIVE / 4)) return;
    llmem_status st = LLMEM_EINVAL;
    void *p = llmem_fixed_alloc(m->pool, &st);
    bool full = m->max_blocks && m->nlive == m->max_blocks;
    if (!p) {
        m->failures++;
        if (full) FZ_CHECK(st == LLMEM_ECAPACITY);
        else FZ_CHECK(st == LLMEM_ENOMEM && m->constrained);
        return;
    }
    FZ_CHECK(st == LLMEM_OK && !full);
    FZ_CHECK(fz_aligned(p, m->align) && llmem_fixed_owns(m->pool, p));
    for (size_t i = 0; i < m->nlive; i++) FZ_CHECK(!fz_overlap(p, m->stride, m->live[i].p, m->stride));
    blk *b = &m->live[m->nlive++];
    *b = (blk){p, m->next_id++};
    fz_fill(&m->mem, p, m->stride, b->id);
    m->allocs++;
}

static void op_free(model *m, fz_in *in)
{
    unsigned which = fz_u8(in);
    if (!m->nlive) {
        FZ_CHECK(llmem_fixed_free(m->pool, NULL) == LLMEM_OK);
        return;
    }
    size_t i = which % m->nlive;
    fz_verify(&m->mem, m->live[i].p, m->stride, m->stride, m->live[i].id);
    FZ_CHECK(llmem_fixed_free(m->pool, m->live[i].p) == LLMEM_OK);
    m->freed[m->nfreed++ % 8] = m->live[i].p;
    m->live[i] = m->live[--m->nlive];
    m->frees++;
}

/* Only checked pools promise to catch these; release mode would corrupt its
 * free list, which is the caller's bug, not one to fuzz. */
static void op_bad_free(model *m, fz_in *in)
{
    unsigned how = fz_u8(in), which = fz_u8(in);
    if (!m->checked) return;
    switch (how % 3) {
    case 0: {
        if (!m->nfreed) return;
        void *p = m->freed[which % (m->nfreed < 8 ? m->nfreed : 8)];
        if (is_live(m, p)) return; /* handed out again: a valid free */
        FZ_CHECK(llmem_fixed_free(m->pool, p) == LLMEM_EDOUBLEFREE);
        FZ_CHECK(llmem_fixed_owns(m->pool, p)); /* free blocks are the pool's too */
        m->doubles++;
        break;
    }
    case 1:
        FZ_CHECK(llmem_fixed_free(m->pool, foreign_bytes + which % 32) == LLMEM_EFOREIGN);
        FZ_CHECK(!llmem_fixed_owns(m->pool, foreign_bytes + which % 32));
        m->foreigns++;
        break;
    default: {
        if (!m->nlive || m->stride < 2) return;
        char *p = (char *)m->live[which % m->nlive].p + 1 + fz_u16(in) % (m->stride - 1);
        FZ_CHECK(llmem_fixed_free(m->pool, p) == LLMEM_EFOREIGN);
        FZ_CHECK(!llmem_fixed_owns(m->pool, p));
        m->foreigns++;
        break;
    }
    }
}

/* The status create must return for these options (configure's order). */
static llmem_status create_status(const llmem_fixed_options *o, bool host)
{
    if (!o->block_size) return LLMEM_EINVAL;
    size_t align = o->align ? o->align : !host ? 256 : o->block_size >= 64 ? 64 : 16;
    if (align & (align - 1) || align > ((size_t)1 << 30)) return LLMEM_EALIGN;
    if (o->initial_blocks && o->max_blocks && o->initial_blocks > o->max_blocks) return LLMEM_ECAPACITY;
    if (o->cache_blocks > 65536) return LLMEM_EINVAL;
    return LLMEM_OK;
}

static bool setup(model *m, fz_in *in)
{
    unsigned f = fz_u8(in), a = fz_u8(in), c = fz_u8(in), k = fz_u8(in);
    m->host = !(f & 4);
    llmem_sim_options so = llmem_sim_options_default();
    so.capacity = (size_t)(2 + c % 16) << 20;
    llmem_resource *top = fz_stack_open(&m->rs, m->host ? NULL : &so);
    if (f & 32) top = fz_stack_limit(&m->rs, (size_t)(1 + c % 8) << 18);
    m->constrained = m->rs.limit || !m->host;
    llmem_fixed_options o = llmem_fixed_options_default();
    o.name = "fuzz";
    o.resource = top;
    o.checked = m->checked = f & 1;
    o.thread_safe = f & 2;
    o.block_size = a % 16 == 0 ? 0 : fz_size(in, (size_t)64 << 10);
    static const size_t aligns[] = {0, 0, 0, 0, 1, 8, 16, 64, 256, 4096, 48};
    o.align = aligns[a / 16 % (sizeof aligns / sizeof *aligns)];
    if (f & 8) m->max_blocks = o.max_blocks = 1 + k % 64;
    if (f & 16) o.initial_blocks = k / 4 % 72;
    if (f & 64) o.cache_blocks = c % 32 == 0 ? 70000 : c % 32;
    if (f & 128) {
        o.chunk_bytes = (size_t)(1 + c % 8) << 12;
        o.max_chunk_bytes = o.chunk_bytes << (k % 4);
    }
    llmem_status want = create_status(&o, m->host), st = llmem_fixed_create(&o, &m->pool);
    if (!want && st == LLMEM_ENOMEM && o.initial_blocks && m->constrained) want = st; /* they did not fit */
    FZ_CHECK(st == want);
    if (st) {
        FZ_CHECK(!m->pool);
        return false;
    }
    size_t align = o.align ? o.align : !m->host ? 256 : o.block_size >= 64 ? 64 : 16;
    m->align = align < sizeof(void *) ? sizeof(void *) : align;
    m->stride = (o.block_size + m->align - 1) / m->align * m->align;
    m->mem.dev = m->host ? NULL : top;
    llmem_fixed_stats s = {sizeof s};
    FZ_CHECK(llmem_fixed_get_stats(m->pool, &s) == LLMEM_OK);
    FZ_CHECK(s.blocks_capacity >= o.initial_blocks && s.block_size == o.block_size);
    return true;
}

static void teardown(model *m)
{
    llmem_fixed_destroy(m->pool);
    fz_stack_close(&m->rs);
}

/* One op of the program (FZ_PROGRAM then runs the model's checks). */
static void step(model *m, fz_in *in, int i)
{
    unsigned op = fz_u8(in) % 8;
    if (fz_trace()) fprintf(stderr, "step %d op %u live %zu\n", i, op, m->nlive);
    switch (op) {
    case 0:
    case 1:
    case 2: op_alloc(m); break;
    case 3:
    case 4: op_free(m, in); break;
    case 5: op_bad_free(m, in); break;
    case 6: llmem_fixed_flush_thread_cache(m->pool); break;
    default: /* every 8th such op: a sweep over device memory is a copy per block end */
        if (m->host || i % 8 == 0) sweep(m);
        break;
    }
}

/* Everything back, and the end-state checks. */
static void finish(model *m)
{
    sweep(m);
    while (m->nlive) {
        FZ_CHECK(llmem_fixed_free(m->pool, m->live[--m->nlive].p) == LLMEM_OK);
        m->frees++;
    }
    llmem_fixed_flush_thread_cache(m->pool);
    stats_check(m);
}

FZ_PROGRAM(model, setup, step, stats_check, sweep, SWEEP, finish, teardown, MAXSTEPS)
