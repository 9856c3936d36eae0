/*
 * fuzz_arena.c - API sequences on the linear arena against a shadow model.
 *
 * The first bytes choose the arena: growable over the os resource or
 * sim-device (whose memory the host cannot touch), with a chunk size, a
 * default alignment (sometimes invalid: create must say LLMEM_EALIGN),
 * max_bytes or a limit resource; or fixed, with capacity_bytes or over a
 * caller buffer. A tracking resource sits under it. Then each op byte picks
 * alloc (size, alignment), save a mark, rollback to a mark (live, rolled
 * past, from before a reset, another arena's, damaged), reset, trim, a full
 * sweep of the contents, or an absurd request; the next bytes are its
 * arguments.
 *
 * The shadow keeps every allocation since the last reset (address, size,
 * id) and a stack of marks with the number of allocations each saw. Every
 * result is checked: a block is aligned, overlaps no live block, is owned
 * by the arena; rollback drops exactly the blocks after its mark and keeps
 * the others' bytes; marks behind the cursor are refused with the
 * documented status; a fixed arena is full exactly when the next block
 * does not fit; a cap refuses whenever what is in use plus the request
 * passes it; the stats (requested bytes, counters) agree with the shadow
 * after every op, and what the arena holds is what the tracking resource
 * saw. After destroy the tracking resource holds no mapping.
 */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "llmem/llmem.h"
#include "shadow.h"

enum { MAXLIVE = 512, MAXMARKS = 16, MAXSTEPS = 2000, SWEEP = 256, BUFBYTES = 256 << 10 };

typedef struct blk {
    void *p;
    size_t n;
    uint32_t id;
} blk;

typedef struct mark {
    llmem_arena_mark m;
    size_t nlive;     /* allocations before it */
    bool stale;       /* rolled back past: the cursor lay before it */
    uint64_t stale_at; /* allocations made when it went stale */
} mark;

typedef struct model {
    llmem_arena *arena, *other;
    fz_stack rs;
    fz_mem mem;
    bool host, fixed, buffered;
    size_t align, cap_bytes, max_bytes, limit_bytes;
    uintptr_t fixed_base; /* 0 until known */
    blk live[MAXLIVE];
    size_t nlive;
    mark marks[MAXMARKS];
    size_t nmarks;
    llmem_arena_mark old_epoch; /* a mark from before the last reset */
    bool have_old;
    uint32_t next_id;
    uint64_t allocs, failures, resets, rollbacks;
    size_t requested;
} model;

static _Alignas(4096) uint8_t arena_buffer[BUFBYTES];
static char foreign_bytes[16];

static void stats_check(const model *m)
{
    llmem_arena_stats s = {sizeof s};
    FZ_CHECK(llmem_arena_get_stats(m->arena, &s) == LLMEM_OK);
    FZ_CHECK(s.requested_bytes == m->requested);
    FZ_CHECK(s.used_bytes >= s.requested_bytes && s.waste_bytes == s.used_bytes - s.requested_bytes);
    FZ_CHECK(s.used_peak_bytes >= s.used_bytes && s.reserved_peak_bytes >= s.reserved_bytes);
    FZ_CHECK(s.allocs_total == m->allocs && s.failures_total == m->failures);
    FZ_CHECK(s.resets_total == m->resets && s.rollbacks_total == m->rollbacks);
    FZ_CHECK(s.used_bytes <= s.reserved_bytes);
    if (m->max_bytes) FZ_CHECK(s.reserved_bytes <= m->max_bytes);
    llmem_tracking_stats ts = {sizeof ts};
    FZ_CHECK(llmem_tracking_resource_get_stats(m->rs.track, &ts) == LLMEM_OK);
    FZ_CHECK(ts.refused_total == 0);
    if (!m->buffered) FZ_CHECK(ts.live_mappings == s.chunks);
    if (!m->buffered && !m->fixed) FZ_CHECK(ts.live_bytes == s.reserved_bytes);
    if (m->fixed) FZ_CHECK(s.chunks == 1);
}

static void sweep(const model *m)
{
    for (size_t i = 0; i < m->nlive; i++) fz_verify(&m->mem, m->live[i].p, m->live[i].n, m->live[i].n, m->live[i].id);
}

/* For a fixed arena whose base is known: would n bytes at align fit? */
static int fixed_fits(const model *m, size_t n, size_t align)
{
    if (!m->fixed_base) return -1;
    llmem_arena_mark at = llmem_arena_save(m->arena);
    uintptr_t cur = m->fixed_base + at.offset, p = (cur + align - 1) & ~(uintptr_t)(align - 1);
    return p - m->fixed_base <= m->cap_bytes && n <= m->cap_bytes - (p - m->fixed_base);
}

static void op_alloc(model *m, fz_in *in)
{
    size_t n = fz_size(in, (size_t)256 << 10), align = 0;
    unsigned a = fz_u8(in);
    if (a & 1) align = (size_t)1 << (a >> 1) % 16; /* explicit, up to 32 KiB */
    if (m->nlive == MAXLIVE) return;
    size_t eff = align ? align : m->align;
    int fits = m->fixed ? fixed_fits(m, n, eff) : -1;
    llmem_arena_stats s = {sizeof s};
    FZ_CHECK(llmem_arena_get_stats(m->arena, &s) == LLMEM_OK);
    bool must_fail = (m->max_bytes && s.used_bytes + n > m->max_bytes) ||
                     (m->limit_bytes && s.used_bytes + n > m->limit_bytes);
    llmem_status st = LLMEM_EINVAL;
    void *p = llmem_arena_alloc(m->arena, n, align, &st);
    if (!p) {
        m->failures++;
        if (m->fixed) FZ_CHECK(st == LLMEM_ECAPACITY && fits != 1);
        else if (st == LLMEM_ECAPACITY) FZ_CHECK(m->max_bytes);
        else FZ_CHECK(st == LLMEM_ENOMEM && (m->rs.limit || !m->host));
        return;
    }
    FZ_CHECK(st == LLMEM_OK && fits != 0 && !must_fail);
    FZ_CHECK(fz_aligned(p, eff));
    FZ_CHECK(llmem_arena_owns(m->arena, p) && llmem_arena_owns(m->arena, (char *)p + n - 1));
    for (size_t i = 0; i < m->nlive; i++) FZ_CHECK(!fz_overlap(p, n, m->live[i].p, m->live[i].n));
    if (m->fixed) {
        /* The mark after it tells where the chunk starts. */
        llmem_arena_mark at = llmem_arena_save(m->arena);
        uintptr_t base = (uintptr_t)p + n - at.offset;
        FZ_CHECK(!m->fixed_base || m->fixed_base == base);
        m->fixed_base = base;
        if (m->buffered) FZ_CHECK(base == (uintptr_t)arena_buffer);
    }
    blk *b = &m->live[m->nlive++];
    *b = (blk){p, n, m->next_id++};
    fz_fill(&m->mem, p, n, b->id);
    m->allocs++;
    m->requested += n;
}

static void op_save(model *m)
{
    if (m->nmarks == MAXMARKS) return;
    mark *k = &m->marks[m->nmarks++];
    k->m = llmem_arena_save(m->arena);
    k->nlive = m->nlive;
    k->stale = false;
}

/* Drop the blocks after the first keep: they are no longer the arena's. */
static void drop_after(model *m, size_t keep)
{
    size_t req = 0;
    for (size_t i = 0; i < keep; i++) req += m->live[i].n;
    for (size_t i = keep; i < m->nlive; i++) FZ_CHECK(!llmem_arena_owns(m->arena, m->live[i].p));
    m->nlive = keep;
    m->requested = req;
}

static void op_rollback(model *m, fz_in *in)
{
    unsigned how = fz_u8(in), which = fz_u8(in);
    llmem_status st;
    switch (how % 4) {
    case 0:
    case 1: { /* one of ours */
        if (!m->nmarks) return;
        size_t k = which % m->nmarks;
        mark *mk = &m->marks[k];
        /* A mark rolled back past lies ahead of the cursor until some
         * allocation overtakes it again; after that it may or may not be
         * behind, and a block may straddle it, so the shadow leaves it be. */
        if (mk->stale && mk->stale_at != m->allocs) return;
        st = llmem_arena_rollback(m->arena, mk->m);
        if (mk->stale) {
            FZ_CHECK(st == LLMEM_ESTATE);
            return;
        }
        FZ_CHECK(st == LLMEM_OK);
        m->rollbacks++;
        drop_after(m, mk->nlive);
        for (size_t j = 0; j < m->nmarks; j++)
            if (m->marks[j].nlive > mk->nlive && !m->marks[j].stale) {
                m->marks[j].stale = true;
                m->marks[j].stale_at = m->allocs;
            }
        sweep(m);
        break;
    }
    case 2: /* from before the last reset */
        if (!m->have_old) return;
        FZ_CHECK(llmem_arena_rollback(m->arena, m->old_epoch) == LLMEM_ESTATE);
        break;
    default: { /* another arena's, or a damaged one */
        llmem_arena_mark x = llmem_arena_save(which & 1 ? m->other : m->arena);
        if (!(which & 1)) x.requested = x.used + 1 + which;
        FZ_CHECK(llmem_arena_rollback(m->arena, x) == LLMEM_EINVAL);
        break;
    }
    }
}

static void op_reset(model *m)
{
    sweep(m);
    m->old_epoch = llmem_arena_save(m->arena);
    m->have_old = true;
    llmem_arena_reset(m->arena);
    m->resets++;
    drop_after(m, 0);
    m->nmarks = 0;
}

static void op_trim(model *m)
{
    llmem_arena_stats before = {sizeof before}, after = {sizeof after};
    FZ_CHECK(llmem_arena_get_stats(m->arena, &before) == LLMEM_OK);
    size_t released = llmem_arena_trim(m->arena);
    FZ_CHECK(llmem_arena_get_stats(m->arena, &after) == LLMEM_OK);
    if (m->fixed) FZ_CHECK(released == 0);
    FZ_CHECK(after.reserved_bytes + released == before.reserved_bytes);
    FZ_CHECK(after.used_bytes == before.used_bytes);
    if (!m->fixed && before.used_bytes == 0) FZ_CHECK(after.reserved_bytes == 0 && after.chunks == 0);
    sweep(m);
}

static void op_absurd(model *m, fz_in *in)
{
    unsigned how = fz_u8(in);
    llmem_status st = LLMEM_OK, want;
    void *p;
    switch (how % 4) {
    case 0:
        p = llmem_arena_alloc(m->arena, 0, 0, &st);
        want = LLMEM_EINVAL;
        break;
    case 1:
        p = llmem_arena_alloc(m->arena, 16, 3u << (how % 8), &st);
        want = LLMEM_EALIGN;
        break;
    case 2:
        p = llmem_arena_alloc(m->arena, 16, (size_t)2 << 30, &st);
        want = LLMEM_EALIGN;
        break;
    default:
        p = llmem_arena_alloc(m->arena, SIZE_MAX - how, 0, &st);
        want = LLMEM_EOVERFLOW;
        break;
    }
    FZ_CHECK(!p && st == want);
    m->failures++;
    FZ_CHECK(!llmem_arena_owns(m->arena, foreign_bytes));
}

static bool setup(model *m, fz_in *in)
{
    unsigned f = fz_u8(in), a = fz_u8(in), c = fz_u8(in);
    m->host = !(f & 1);
    llmem_sim_options so = llmem_sim_options_default();
    so.capacity = (size_t)(4 + c % 32) << 20;
    llmem_resource *top = fz_stack_open(&m->rs, m->host ? NULL : &so);
    llmem_arena_options o = llmem_arena_options_default();
    o.name = "fuzz";
    switch (f / 2 % 4) {
    case 0:
    case 1: /* growable */
        o.chunk_bytes = (size_t)(1 + c % 16) << (12 + f / 8 % 6);
        if (f & 64) m->max_bytes = o.max_bytes = (size_t)(1 + c / 16) << 20;
        if (f & 128) top = fz_stack_limit(&m->rs, m->limit_bytes = (size_t)(1 + c % 8) << 20);
        break;
    case 2: /* fixed capacity */
        m->fixed = true;
        m->cap_bytes = o.capacity_bytes = 1 + ((size_t)c << (4 + f / 8 % 8));
        break;
    default: /* a caller buffer, host only */
        if (!m->host) break;
        m->fixed = m->buffered = true;
        m->cap_bytes = o.buffer_bytes = 1 + (size_t)c * 1024 % BUFBYTES;
        o.buffer = arena_buffer;
        break;
    }
    o.resource = top;
    static const size_t aligns[] = {0, 0, 0, 1, 8, 16, 64, 256, 4096, 65536, 24, (size_t)2 << 30};
    o.align = aligns[a % (sizeof aligns / sizeof *aligns)];
    m->align = o.align ? o.align : m->host ? 64 : 256;
    llmem_status want = o.align && ((o.align & (o.align - 1)) || o.align > ((size_t)1 << 30)) ? LLMEM_EALIGN : LLMEM_OK;
    llmem_status st = llmem_arena_create(&o, &m->arena);
    if (!want && st && m->fixed && !m->buffered) FZ_CHECK(st == LLMEM_ENOMEM && !m->host); /* over capacity */
    else FZ_CHECK(st == want);
    if (st) FZ_CHECK(!m->arena);
    if (m->buffered) m->fixed_base = (uintptr_t)arena_buffer;
    m->mem.dev = m->host ? NULL : top;
    if (!st) FZ_CHECK(llmem_arena_create(NULL, &m->other) == LLMEM_OK);
    return st == LLMEM_OK;
}

static void teardown(model *m)
{
    llmem_arena_destroy(m->arena);
    llmem_arena_destroy(m->other);
    fz_stack_close(&m->rs);
}

/* One op of the program (FZ_PROGRAM then runs the model's checks). */
static void step(model *m, fz_in *in, int i)
{
    unsigned op = fz_u8(in) % 10;
    if (fz_trace()) fprintf(stderr, "step %d op %u live %zu marks %zu\n", i, op, m->nlive, m->nmarks);
    switch (op) {
    case 0:
    case 1:
    case 2:
    case 3: op_alloc(m, in); break;
    case 4: op_save(m); break;
    case 5: op_rollback(m, in); break;
    case 6: op_reset(m); break;
    case 7: op_trim(m); break;
    case 8: op_absurd(m, in); break;
    default: /* every 8th such op on a device: a copy per block end */
        if (m->host || i % 8 == 0) sweep(m);
        break;
    }
}

/* Everything back, and the end-state checks. */
static void finish(model *m)
{
    op_reset(m);
    op_trim(m);
    stats_check(m);
}

FZ_PROGRAM(model, setup, step, stats_check, sweep, SWEEP, finish, teardown, MAXSTEPS)
