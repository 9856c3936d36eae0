/*
 * fuzz_pool.c - API sequences on the dynamic pool against a shadow model.
 *
 * The first bytes choose the pool: checked or release mode, host (the os
 * resource) or device (sim-device, whose memory the host cannot touch),
 * an alignment (sometimes an invalid one: create must say LLMEM_EALIGN),
 * superblock sizes, max_bytes, a limit resource, extra size classes,
 * background or manual purging and the decay delay. A tracking resource
 * sits under it all. Then each op byte picks alloc, alloc_aligned, calloc,
 * realloc, free, an invalid free (foreign, interior, double in checked
 * mode, a handle's address), absurd sizes, reserve, shrink/trim, the
 * thread-cache flush, usable_size/owns, handles (halloc, pin, unpin,
 * hfree, stale handles), compact, or a full check; the next bytes are its
 * arguments.
 *
 * The shadow keeps every live block (address, size asked, id) and handle.
 * Every result is checked: a new block is aligned, overlaps no live block,
 * its usable size covers the request; a block's pattern (shadow.h) reads
 * back on free, on realloc (the kept prefix) and in periodic sweeps; the
 * status of every failure is the one the header documents, and a refused
 * call changes nothing; the stats agree with the shadow after every op
 * (live blocks, handles, allocations, failures and refused frees counted,
 * used bytes equal to the usable sizes in release mode, never more mapped
 * than max_bytes, what is mapped is what the tracking resource saw). At the
 * end, trim must leave nothing mapped when nothing is live, and after
 * destroy the tracking resource holds no mapping.
 *
 * Fenced frees (stream-ordered release) with fences made of flags: a block
 * whose fence is not done is never handed out again (no new block overlaps
 * it), stays counted as live and in fenced_pending, a second free of it is
 * refused, every fence is dropped exactly once and never before it is
 * done; allocations short of memory wait for fences instead of failing.
 * The reserved range (reserve_bytes): growth in place, the range stays
 * mapped after trim with nothing committed.
 */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "llmem/llmem.h"
#include "shadow.h"

enum { MAXLIVE = 160, MAXH = 12, MAXSTALE = 8, MAXSTEPS = 2000, SWEEP = 256, MAXPEND = 24 };

/* A fence made of flags. Fences without wait() turn done by themselves
 * after a few polls, so a pool waiting on one always makes progress. */
typedef struct ffence {
    int done, dropped, in_use, polls_left;
} ffence;

static bool ff_done(void *f)
{
    ffence *x = f;
    FZ_CHECK(x->in_use && !x->dropped); /* never polled after its drop */
    if (x->polls_left && --x->polls_left == 0) x->done = 1;
    return x->done;
}

static llmem_status ff_wait(void *f)
{
    ffence *x = f;
    FZ_CHECK(x->in_use && !x->dropped);
    x->done = 1;
    return LLMEM_OK;
}

static void ff_drop(void *f)
{
    ffence *x = f;
    FZ_CHECK(x->in_use && !x->dropped); /* exactly once */
    x->dropped = 1;
}

typedef struct pend {
    void *p;
    size_t n, span; /* asked, and held (usable size at the free) */
    uint32_t id;
    unsigned slot;  /* its fence */
} pend;

typedef struct blk {
    void *p;
    size_t n; /* bytes asked */
    uint32_t id;
} blk;

typedef struct hnd {
    llmem_handle h;
    size_t n;
    uint32_t id;
    unsigned pins;
    void *at; /* address while pinned */
} hnd;

typedef struct model {
    llmem_pool *pool;
    fz_stack rs;
    fz_mem mem;
    bool checked, host, guarded, manual, constrained, extra;
    size_t max_bytes, limit_bytes, unit, align, max_sb;
    blk live[MAXLIVE];
    size_t nlive;
    hnd h[MAXH];
    size_t nh;
    llmem_handle stale[MAXSTALE];
    size_t nstale;
    void *freed[8]; /* recent frees, for double frees */
    size_t nfreed;
    pend pend[MAXPEND]; /* fenced frees not completed (as far as the model knows) */
    size_t npend;
    ffence fence[MAXPEND * 2]; /* stable addresses: the pool holds pointers to them */
    size_t reserve;           /* reserve_bytes (rounded), 0 = off */
    uint32_t next_id;
    uint64_t allocs, failures, invalid;
} model;

static char foreign_bytes[64]; /* an address no pool owns */

/* Bytes the pool holds for block b in release mode (its class or its
 * pages): usable_size. */
static size_t usable(const model *m, const blk *b) { return llmem_pool_usable_size(m->pool, b->p); }

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static void remember_freed(model *m, void *p);

/* Fenced frees the pool completed (their fences were dropped) leave the
 * model; one whose fence is not done must still be pending. */
static void reconcile(model *m)
{
    for (size_t i = 0; i < m->npend;) {
        ffence *f = &m->fence[m->pend[i].slot];
        if (!f->dropped) {
            i++;
            continue;
        }
        FZ_CHECK(f->done);
        f->in_use = 0;
        remember_freed(m, m->pend[i].p);
        m->pend[i] = m->pend[--m->npend];
    }
}

static size_t pending_bytes(const model *m)
{
    size_t n = 0;
    for (size_t i = 0; i < m->npend; i++) n += m->pend[i].span;
    return n;
}

static void stats_check(model *m)
{
    reconcile(m);
    llmem_pool_stats s = {sizeof s};
    FZ_CHECK(llmem_pool_get_stats(m->pool, &s) == LLMEM_OK);
    if (fz_trace())
        fprintf(stderr, "stats: live %llu allocs %llu used %llu reserved %llu\n", (unsigned long long)s.live_allocations,
                (unsigned long long)s.allocs_total, (unsigned long long)s.used_bytes,
                (unsigned long long)s.reserved_bytes);
    FZ_CHECK(s.live_allocations == m->nlive + m->nh + m->npend);
    FZ_CHECK(s.fenced_pending == m->npend);
    /* The pool counts what each block holds; guarded blocks' span is what
     * was asked, the guards around it are the pool's. */
    if (m->guarded) FZ_CHECK(s.fenced_pending_bytes >= pending_bytes(m));
    else FZ_CHECK(s.fenced_pending_bytes == pending_bytes(m));
    FZ_CHECK(s.handles == m->nh);
    FZ_CHECK(s.allocs_total == m->allocs);
    FZ_CHECK(s.frees_total == m->allocs - m->nlive - m->nh - m->npend);
    FZ_CHECK(s.failures_total == m->failures);
    FZ_CHECK(s.invalid_frees_total == m->invalid);
    FZ_CHECK(s.corruptions_total == 0);
    FZ_CHECK(s.committed_bytes <= s.reserved_bytes);
    FZ_CHECK(s.used_bytes <= s.committed_bytes);
    FZ_CHECK(s.free_bytes <= s.reserved_bytes && s.largest_free_bytes <= s.free_bytes);
    FZ_CHECK(s.reserved_peak_bytes >= s.reserved_bytes && s.used_peak_bytes >= s.used_bytes);
    if (m->max_bytes) FZ_CHECK(s.reserved_bytes <= m->max_bytes);
    size_t want = 0;
    for (size_t i = 0; i < m->nlive; i++) want += m->guarded ? m->live[i].n : usable(m, &m->live[i]);
    for (size_t i = 0; i < m->nh; i++) want += round_up(m->h[i].n, m->unit);
    want += pending_bytes(m);
    if (m->guarded) FZ_CHECK(s.used_bytes >= want);
    else FZ_CHECK(s.used_bytes == want);
    if (m->manual) { /* no purger thread: the two figures are read at rest */
        llmem_tracking_stats ts = {sizeof ts};
        FZ_CHECK(llmem_tracking_resource_get_stats(m->rs.track, &ts) == LLMEM_OK);
        FZ_CHECK(ts.live_bytes == s.reserved_bytes && ts.live_mappings == s.superblocks);
        FZ_CHECK(ts.refused_total == 0);
    }
}

static void sweep(const model *m)
{
    for (size_t i = 0; i < m->nlive; i++) fz_verify(&m->mem, m->live[i].p, m->live[i].n, m->live[i].n, m->live[i].id);
    for (size_t i = 0; i < m->nh; i++)
        if (m->h[i].pins) fz_verify(&m->mem, m->h[i].at, m->h[i].n, m->h[i].n, m->h[i].id);
}

/* A fresh block: aligned, inside the pool, clear of every live block. */
static void check_new(const model *m, const void *p, size_t n, size_t align, long skip)
{
    FZ_CHECK(p != NULL);
    FZ_CHECK(fz_aligned(p, align > m->align ? align : m->align));
    /* Documented for host blocks; extra classes are exact to the pool's
     * alignment by design (tests/test_profile.c), so not for them. */
    if (m->host && n >= 513 && !m->extra) FZ_CHECK(fz_aligned(p, 64));
    size_t u = llmem_pool_usable_size(m->pool, p);
    FZ_CHECK(u >= n);
    if (m->guarded) FZ_CHECK(u == n);
    FZ_CHECK(llmem_pool_owns(m->pool, p) && llmem_pool_owns(m->pool, (const char *)p + n - 1));
    size_t span = m->guarded ? n : u;
    for (size_t i = 0; i < m->nlive; i++) {
        if ((long)i == skip) continue;
        const blk *b = &m->live[i];
        FZ_CHECK(!fz_overlap(p, span, b->p, m->guarded ? b->n : usable(m, b)));
    }
    for (size_t i = 0; i < m->nh; i++)
        if (m->h[i].pins) FZ_CHECK(!fz_overlap(p, span, m->h[i].at, m->h[i].n));
    /* The heart of stream-ordered release: not before its fence. */
    for (size_t i = 0; i < m->npend; i++)
        if (!m->fence[m->pend[i].slot].done) FZ_CHECK(!fz_overlap(p, span, m->pend[i].p, m->pend[i].span));
}

/* Must an allocation of n more bytes fail for lack of memory? When the cap
 * (max_bytes, or the limit resource, which counts committed bytes) cannot
 * hold what is in use plus n: live blocks are always mapped and committed.
 * Asked before the call. */
static bool must_fail(const model *m, size_t n)
{
    llmem_pool_stats s = {sizeof s};
    FZ_CHECK(llmem_pool_get_stats(m->pool, &s) == LLMEM_OK);
    /* Pending fenced blocks are waited for rather than failed on. */
    uint64_t used = s.used_bytes - s.fenced_pending_bytes;
    return (m->max_bytes && used + n > m->max_bytes) || (m->limit_bytes && used + n > m->limit_bytes);
}

/* A refusal for lack of memory is right only under a cap (or over the
 * sim-device's capacity), and the status must say ENOMEM. */
static void check_nomem(const model *m, llmem_status st)
{
    FZ_CHECK(st == LLMEM_ENOMEM);
    FZ_CHECK(m->constrained);
}

static void remember_freed(model *m, void *p)
{
    m->freed[m->nfreed++ % 8] = p;
}

static void drop(model *m, size_t i)
{
    remember_freed(m, m->live[i].p);
    m->live[i] = m->live[--m->nlive];
}

/* The status an allocation of n at align must fail with, before any memory
 * is looked at; LLMEM_OK if it may succeed. */
static llmem_status arg_status(const model *m, size_t n, size_t align)
{
    if (n == 0) return LLMEM_EINVAL;
    if (n > (size_t)PTRDIFF_MAX) return LLMEM_EOVERFLOW;
    if (align && ((align & (align - 1)) || align > m->max_sb)) return LLMEM_EALIGN;
    return LLMEM_OK;
}

static void op_alloc(model *m, fz_in *in, unsigned kind)
{
    size_t n = fz_size(in, m->host ? (size_t)2 << 20 : (size_t)4 << 20), align = 0;
    if (kind == 1) {
        unsigned a = fz_u8(in);
        align = (size_t)1 << (a % 24);
        if (a & 0x80) align *= 3; /* not a power of two */
    }
    if (m->nlive == MAXLIVE) return;
    llmem_status st = LLMEM_EINVAL, want = arg_status(m, n, align);
    bool must = must_fail(m, n);
    void *p;
    if (kind == 2) { /* calloc: count x size */
        size_t count = 1 + fz_u8(in) % 16, each = (n + count - 1) / count;
        n = count * each;
        p = llmem_pool_calloc(m->pool, count, each, &st);
        if (!m->host) {
            FZ_CHECK(!p && st == LLMEM_ENOTSUP);
            return;
        }
    } else {
        p = kind == 1 ? llmem_pool_alloc_aligned(m->pool, n, align, &st) : llmem_pool_alloc(m->pool, n, &st);
    }
    if (want) {
        FZ_CHECK(!p && st == want);
        m->failures++;
        return;
    }
    if (!p) {
        check_nomem(m, st);
        m->failures++;
        return;
    }
    FZ_CHECK(st == LLMEM_OK && !must);
    check_new(m, p, n, align, -1);
    if (kind == 2) fz_verify_zero(&m->mem, p, n);
    blk *b = &m->live[m->nlive++];
    *b = (blk){p, n, m->next_id++};
    fz_fill(&m->mem, p, n, b->id);
    m->allocs++;
}

static void op_free(model *m, fz_in *in)
{
    if (!m->nlive) return;
    size_t i = fz_u8(in) % m->nlive;
    blk *b = &m->live[i];
    fz_verify(&m->mem, b->p, b->n, b->n, b->id);
    FZ_CHECK(llmem_pool_free(m->pool, b->p) == LLMEM_OK);
    drop(m, i);
}

static void op_realloc(model *m, fz_in *in)
{
    size_t n = fz_size(in, m->host ? (size_t)2 << 20 : (size_t)4 << 20);
    unsigned how = fz_u8(in);
    if (!m->nlive) return;
    size_t i = how % m->nlive;
    blk *b = &m->live[i];
    if (how & 0x80) n = how & 0x40 ? 0 : (size_t)PTRDIFF_MAX + 1 + how; /* refused: nothing may change */
    llmem_status st = LLMEM_EINVAL;
    void *p = llmem_pool_realloc(m->pool, b->p, n, &st);
    if (n == 0 || n > (size_t)PTRDIFF_MAX) {
        FZ_CHECK(!p && st == (n ? LLMEM_EOVERFLOW : LLMEM_EINVAL));
        fz_verify(&m->mem, b->p, b->n, b->n, b->id);
        return;
    }
    if (!p) {
        check_nomem(m, st);
        m->failures++;
        fz_verify(&m->mem, b->p, b->n, b->n, b->id);
        return;
    }
    FZ_CHECK(st == LLMEM_OK);
    check_new(m, p, n, 0, (long)i);
    size_t keep = b->n < n ? b->n : n;
    fz_verify(&m->mem, p, b->n, keep, b->id);
    if (p != b->p) {
        m->allocs++; /* a move: a new block, the old one freed */
        remember_freed(m, b->p);
    }
    b->p = p;
    b->n = n;
    b->id = m->next_id++;
    fz_fill(&m->mem, p, n, b->id);
}

/* Is p the start of a live block again (its memory handed out anew)? Then
 * freeing it is no double free. Anywhere else - free space, inside a block,
 * its guards - a checked pool must refuse. */
static bool is_live(const model *m, const void *p)
{
    for (size_t i = 0; i < m->nlive; i++)
        if (m->live[i].p == p) return true;
    return false;
}

static void op_bad_free(model *m, fz_in *in)
{
    unsigned how = fz_u8(in), which = fz_u8(in);
    llmem_status st;
    switch (how % 4) {
    case 0: /* not the pool's at all */
        st = llmem_pool_free(m->pool, foreign_bytes + which % 32);
        FZ_CHECK(st == LLMEM_EFOREIGN);
        break;
    case 1: { /* inside a live block */
        if (!m->nlive) return;
        const blk *b = &m->live[which % m->nlive];
        size_t u = m->checked ? b->n : usable(m, b);
        if (u < 2) return;
        st = llmem_pool_free(m->pool, (char *)b->p + 1 + (size_t)fz_u16(in) % (u - 1));
        FZ_CHECK(st == LLMEM_EFOREIGN);
        break;
    }
    case 2: { /* freed already; release mode only catches this for page runs */
        if (!m->checked || !m->nfreed || m->nh) return;
        void *p = m->freed[which % (m->nfreed < 8 ? m->nfreed : 8)];
        if (is_live(m, p)) return;
        st = llmem_pool_free(m->pool, p);
        FZ_CHECK(st == LLMEM_EDOUBLEFREE || st == LLMEM_EFOREIGN);
        break;
    }
    default: { /* a pinned handle's address */
        size_t k;
        for (k = 0; k < m->nh && !m->h[k].pins; k++) {}
        if (k == m->nh) return;
        st = llmem_pool_free(m->pool, m->h[k].at);
        FZ_CHECK(st == LLMEM_EINVAL);
        fz_verify(&m->mem, m->h[k].at, m->h[k].n, m->h[k].n, m->h[k].id);
        break;
    }
    }
    m->invalid++;
}

static void op_absurd(model *m, fz_in *in)
{
    unsigned how = fz_u8(in);
    /* Just under PTRDIFF_MAX reaches the resource, which must refuse it
     * before it allocates metadata in proportion (sim-device did not). */
    size_t n = how % 3 == 0 ? 0 : how % 3 == 1 ? SIZE_MAX - how : (size_t)PTRDIFF_MAX - how * 4096u;
    llmem_status st = LLMEM_OK;
    void *p = llmem_pool_alloc(m->pool, n, &st);
    FZ_CHECK(!p);
    if (how % 3 == 0) FZ_CHECK(st == LLMEM_EINVAL);
    else if (how % 3 == 1) FZ_CHECK(st == LLMEM_EOVERFLOW);
    else FZ_CHECK(st == LLMEM_EOVERFLOW || st == LLMEM_ENOMEM);
    m->failures++;
    /* calloc overflow and handle arguments: refused before the pool is
     * asked, so not counted as refused allocations */
    if (m->host) FZ_CHECK(!llmem_pool_calloc(m->pool, SIZE_MAX / 2, 3 + how % 5, &st) && st == LLMEM_EOVERFLOW);
    llmem_handle h = 1;
    FZ_CHECK(llmem_pool_handle_alloc(m->pool, how & 1 ? 0 : SIZE_MAX - how, &h) == (how & 1 ? LLMEM_EINVAL : LLMEM_EOVERFLOW));
    FZ_CHECK(h == LLMEM_HANDLE_NULL);
}

static void op_handle(model *m, fz_in *in)
{
    unsigned how = fz_u8(in), which = fz_u8(in);
    hnd *h = m->nh ? &m->h[which % m->nh] : NULL;
    llmem_status st = LLMEM_OK;
    switch (how % 6) {
    case 0: { /* new */
        size_t n = fz_size(in, (size_t)1 << 20);
        if (m->nh == MAXH) return;
        llmem_handle x;
        bool must = must_fail(m, n);
        st = llmem_pool_handle_alloc(m->pool, n, &x);
        if (st) {
            check_nomem(m, st);
            FZ_CHECK(x == LLMEM_HANDLE_NULL);
            m->failures++;
            return;
        }
        FZ_CHECK(!must);
        FZ_CHECK(llmem_pool_handle_size(m->pool, x) == n);
        void *p = llmem_pool_pin(m->pool, x, &st);
        FZ_CHECK(st == LLMEM_OK);
        check_new(m, p, n, m->unit, -1);
        hnd *nh = &m->h[m->nh++];
        *nh = (hnd){x, n, m->next_id++, 1, p};
        fz_fill(&m->mem, p, n, nh->id);
        m->allocs++;
        if (how & 8) {
            FZ_CHECK(llmem_pool_unpin(m->pool, x) == LLMEM_OK);
            nh->pins = 0;
        }
        break;
    }
    case 1: /* pin */
        if (!h) return;
        h->at = llmem_pool_pin(m->pool, h->h, &st);
        FZ_CHECK(st == LLMEM_OK && h->at && fz_aligned(h->at, m->unit));
        h->pins++;
        fz_verify(&m->mem, h->at, h->n, h->n, h->id);
        break;
    case 2: /* unpin */
        if (!h) return;
        st = llmem_pool_unpin(m->pool, h->h);
        FZ_CHECK(st == (h->pins ? LLMEM_OK : LLMEM_ESTATE));
        if (h->pins) h->pins--;
        break;
    case 3: /* free: refused while pinned */
        if (!h) return;
        st = llmem_pool_handle_free(m->pool, h->h);
        if (h->pins) {
            FZ_CHECK(st == LLMEM_EBUSY);
            return;
        }
        FZ_CHECK(st == LLMEM_OK);
        m->stale[m->nstale++ % MAXSTALE] = h->h;
        *h = m->h[--m->nh];
        break;
    case 4: { /* a stale handle: refused everywhere */
        if (!m->nstale) return;
        llmem_handle x = m->stale[which % (m->nstale < MAXSTALE ? m->nstale : MAXSTALE)];
        FZ_CHECK(!llmem_pool_pin(m->pool, x, &st) && st == LLMEM_EINVAL);
        FZ_CHECK(llmem_pool_unpin(m->pool, x) == LLMEM_EINVAL);
        FZ_CHECK(llmem_pool_handle_free(m->pool, x) == LLMEM_EINVAL);
        FZ_CHECK(llmem_pool_handle_size(m->pool, x) == 0);
        break;
    }
    default: { /* compact: unpinned blocks may move, and keep their bytes */
        llmem_pool_compact_report r = {sizeof r};
        size_t budget = how & 8 ? 0 : fz_size(in, (size_t)4 << 20);
        FZ_CHECK(llmem_pool_compact(m->pool, budget, &r) == LLMEM_OK);
        /* The budget is checked before each move, so the last block may
         * pass it (as tests/test_pool.c expects), by one block at most. */
        size_t biggest = 0;
        for (size_t i = 0; i < m->nh; i++)
            if (round_up(m->h[i].n, m->unit) > biggest) biggest = round_up(m->h[i].n, m->unit);
        if (budget) FZ_CHECK(r.bytes_moved < budget + biggest);
        for (size_t i = 0; i < m->nh; i++) {
            hnd *k = &m->h[i];
            void *p = llmem_pool_pin(m->pool, k->h, &st);
            FZ_CHECK(st == LLMEM_OK);
            if (k->pins) FZ_CHECK(p == k->at); /* pinned blocks stay */
            k->at = p;
            fz_verify(&m->mem, p, k->n, k->n, k->id);
            FZ_CHECK(llmem_pool_unpin(m->pool, k->h) == LLMEM_OK);
        }
        sweep(m);
        break;
    }
    }
}

static void op_control(model *m, fz_in *in)
{
    unsigned how = fz_u8(in);
    switch (how % 5) {
    case 0: { /* reserve */
        size_t n = fz_size(in, (size_t)8 << 20);
        llmem_status st = llmem_pool_reserve(m->pool, n);
        /* A free run of n bytes cannot exist in a superblock over the cap. */
        if (m->max_bytes && round_up(n, m->unit) > m->max_bytes) FZ_CHECK(st == LLMEM_ENOMEM);
        if (st) check_nomem(m, st);
        break;
    }
    case 1: /* shrink to a target */
        llmem_pool_shrink(m->pool, fz_size(in, (size_t)16 << 20));
        sweep(m);
        break;
    case 2: { /* trim: with nothing live, nothing may stay mapped */
        llmem_pool_trim(m->pool);
        llmem_pool_stats s = {sizeof s};
        FZ_CHECK(llmem_pool_get_stats(m->pool, &s) == LLMEM_OK);
        if (!m->nlive && !m->nh && !s.fenced_pending) {
            if (m->reserve && s.superblocks) /* the range stays, nothing committed in it */
                FZ_CHECK(s.superblocks == 1 && s.reserved_bytes == m->reserve && s.committed_bytes == 0);
            else FZ_CHECK(s.reserved_bytes == 0 && s.superblocks == 0);
        }
        if (s.reserved_bytes) FZ_CHECK(s.committed_bytes >= s.used_bytes);
        sweep(m);
        break;
    }
    case 3:
        llmem_pool_flush_thread_cache(m->pool);
        break;
    default: /* the pool's own walk, and every block's bytes */
        FZ_CHECK(llmem_pool_check(m->pool) == LLMEM_OK);
        sweep(m);
        break;
    }
}

static void op_query(model *m, fz_in *in)
{
    unsigned which = fz_u8(in);
    if (!m->nlive) return;
    const blk *b = &m->live[which % m->nlive];
    size_t u = llmem_pool_usable_size(m->pool, b->p);
    FZ_CHECK(u >= b->n);
    FZ_CHECK(llmem_pool_owns(m->pool, b->p) && llmem_pool_owns(m->pool, (char *)b->p + b->n - 1));
    FZ_CHECK(!llmem_pool_owns(m->pool, foreign_bytes));
    if (b->n > 1) FZ_CHECK(llmem_pool_usable_size(m->pool, (char *)b->p + 1) == 0);
    llmem_pool_class_stats cs[LLMEM_POOL_MAX_EXTRA_CLASSES + 96];
    size_t count = 0, live = 0;
    for (size_t c = 0; c < sizeof cs / sizeof *cs; c++) cs[c].struct_size = sizeof *cs;
    FZ_CHECK(llmem_pool_get_class_stats(m->pool, cs, sizeof cs / sizeof *cs, &count) == LLMEM_OK);
    for (size_t c = 0; c < count && c < sizeof cs / sizeof *cs; c++) live += cs[c].live_blocks;
    FZ_CHECK(live <= m->nlive + m->npend); /* pending fenced blocks are still out */
}

static unsigned fence_slot(model *m)
{
    for (unsigned k = 0; k < MAXPEND * 2; k++)
        if (!m->fence[k].in_use) return k;
    return MAXPEND * 2;
}

static llmem_fence fence_at(model *m, unsigned k, unsigned how)
{
    ffence *f = &m->fence[k];
    *f = (ffence){0, 0, 1, 0};
    if (how & 1) f->done = 1;                  /* work already finished */
    else if (!(how & 2)) f->polls_left = 1 + how / 8 % 6; /* no wait(): done after a few polls */
    return (llmem_fence){ff_done, how & 2 ? ff_wait : NULL, ff_drop, f};
}

/* Free a live block with a fence; sometimes free a pending one again. */
static void op_fenced(model *m, fz_in *in)
{
    unsigned how = fz_u8(in), which = fz_u8(in);
    unsigned k = fence_slot(m);
    if (k == MAXPEND * 2) return;
    if (how & 4 && m->npend) { /* a second free of a pending block: refused, its fence dropped */
        pend *q = &m->pend[which % m->npend];
        llmem_fence f = fence_at(m, k, how & ~1u);
        FZ_CHECK(llmem_pool_free_fenced(m->pool, q->p, &f) == LLMEM_EDOUBLEFREE);
        FZ_CHECK(m->fence[k].dropped);
        m->fence[k].in_use = 0;
        m->invalid++;
        /* a plain free of it too, where the slow path sees every free */
        if (m->checked && !m->fence[q->slot].dropped) {
            FZ_CHECK(llmem_pool_free(m->pool, q->p) == LLMEM_EDOUBLEFREE);
            m->invalid++;
        }
        return;
    }
    if (!m->nlive || m->npend == MAXPEND) return;
    size_t i = which % m->nlive;
    blk *b = &m->live[i];
    fz_verify(&m->mem, b->p, b->n, b->n, b->id);
    size_t span = m->guarded ? b->n : usable(m, b);
    llmem_fence f = fence_at(m, k, how);
    bool done_before = m->fence[k].done;
    FZ_CHECK(llmem_pool_free_fenced(m->pool, b->p, &f) == LLMEM_OK);
    /* The call polls once: a fence done by then is an ordinary free. */
    if (done_before) FZ_CHECK(m->fence[k].dropped);
    if (m->fence[k].dropped) {
        FZ_CHECK(m->fence[k].done);
        m->fence[k].in_use = 0;
        drop(m, i);
        return;
    }
    m->pend[m->npend++] = (pend){b->p, b->n, span, b->id, k};
    m->live[i] = m->live[--m->nlive];
}

/* The work behind fences finishes; the pool polls, or waits for all. */
static void op_fence_progress(model *m, fz_in *in)
{
    unsigned how = fz_u8(in), which = fz_u8(in);
    switch (how % 3) {
    case 0:
        if (m->npend) m->fence[m->pend[which % m->npend].slot].done = 1;
        break;
    case 1: {
        size_t n = llmem_pool_poll_fenced(m->pool);
        FZ_CHECK(n <= m->npend);
        break;
    }
    default:
        llmem_pool_drain_fenced(m->pool);
        for (size_t i = 0; i < m->npend; i++) FZ_CHECK(m->fence[m->pend[i].slot].dropped);
        break;
    }
}

/* The pool the first bytes ask for, over tracking (and a limit); false if
 * the options were invalid and create said so correctly. */
static bool setup(model *m, fz_in *in)
{
    unsigned f = fz_u8(in), a = fz_u8(in), sb = fz_u8(in), cap = fz_u8(in);
    m->checked = f & 1;
    m->host = !(f & 2);
    m->guarded = m->checked && m->host;
    m->manual = !(f & 16);
    llmem_sim_options so = llmem_sim_options_default();
    so.capacity = (size_t)(16 + cap % 32) << 20;
    so.fill = f & 64 ? 0xa5 : 0;
    llmem_resource *top = fz_stack_open(&m->rs, m->host ? NULL : &so);
    if (f & 8) top = fz_stack_limit(&m->rs, m->limit_bytes = (size_t)(1 + cap % 24) << 19);
    llmem_pool_options o = llmem_pool_options_default();
    o.name = "fuzz";
    o.resource = top;
    o.checked = m->checked;
    o.purge = m->manual ? LLMEM_POOL_PURGE_MANUAL : LLMEM_POOL_PURGE_BACKGROUND;
    o.decay_ms = f & 32 ? 1 : 0;
    m->unit = m->host ? 4096 : (size_t)64 << 10;
    o.first_superblock_bytes = (m->host ? (size_t)64 << 10 : (size_t)256 << 10) << (sb % 4);
    o.max_superblock_bytes = o.first_superblock_bytes << (sb / 4 % 4);
    m->max_sb = o.max_superblock_bytes;
    if (f & 4) m->max_bytes = o.max_bytes = (size_t)(1 + (cap >> 3) % 16) << (m->host ? 19 : 21);
    m->constrained = m->max_bytes || m->rs.limit || !m->host;
    static const size_t aligns[] = {0, 0, 0, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 8192, 24, 4};
    size_t align = aligns[a % (sizeof aligns / sizeof *aligns)];
    size_t lo = m->host ? 8 : 128, hi = m->host ? 256 : 4096;
    llmem_status want = align && ((align & (align - 1)) || align < lo || align > hi) ? LLMEM_EALIGN : LLMEM_OK;
    if (sb & 16) { /* grow in place inside one reserved range */
        o.reserve_bytes = ((size_t)1 + (sb >> 5 & 3)) << (m->host ? 21 : 23);
        m->reserve = o.reserve_bytes; /* multiples of 2 MiB: already rounded */
        if (!want && m->max_bytes && m->reserve > m->max_bytes) want = LLMEM_EINVAL;
    }
    o.align = align;
    m->align = align ? align : m->host ? 16 : 256;
    uint32_t extra[4];
    if (f & 128) { /* profile-style exact classes */
        o.extra_class_count = 1 + a / 16 % 4;
        for (size_t i = 0; i < o.extra_class_count; i++) extra[i] = 24 + 40u * fz_u8(in);
        o.extra_classes = extra;
        m->extra = true;
    }
    llmem_status st = llmem_pool_create(&o, &m->pool);
    FZ_CHECK(st == want);
    if (st) FZ_CHECK(m->pool == NULL);
    m->mem.dev = m->host ? NULL : top;
    return st == LLMEM_OK;
}

static void teardown(model *m)
{
    llmem_pool_destroy(m->pool);
    fz_stack_close(&m->rs);
}

/* One op of the program (FZ_PROGRAM then runs the model's checks). */
static void step(model *m, fz_in *in, int i)
{
    unsigned op = fz_u8(in) % 14;
    if (fz_trace()) fprintf(stderr, "step %d op %u live %zu handles %zu\n", i, op, m->nlive, m->nh);
    switch (op) {
    case 0:
    case 1:
    case 2: op_alloc(m, in, op == 2 ? 1 : 0); break;
    case 3: op_alloc(m, in, 2); break;
    case 4:
    case 5: op_free(m, in); break;
    case 6: op_realloc(m, in); break;
    case 7: op_bad_free(m, in); break;
    case 8: op_absurd(m, in); break;
    case 9: op_handle(m, in); break;
    case 10: op_control(m, in); break;
    case 12: op_fenced(m, in); break;
    case 13: op_fence_progress(m, in); break;
    default: op_query(m, in); break;
    }
}

/* Everything back, and the end-state checks. */
static void finish(model *m)
{
    sweep(m);
    /* Everything back: nothing may stay live, and trim gives it all back. */
    while (m->nlive) {
        FZ_CHECK(llmem_pool_free(m->pool, m->live[m->nlive - 1].p) == LLMEM_OK);
        m->nlive--;
    }
    for (size_t i = 0; i < m->nh; i++) {
        while (m->h[i].pins--) FZ_CHECK(llmem_pool_unpin(m->pool, m->h[i].h) == LLMEM_OK);
        FZ_CHECK(llmem_pool_handle_free(m->pool, m->h[i].h) == LLMEM_OK);
    }
    m->nh = 0;
    llmem_pool_drain_fenced(m->pool);
    stats_check(m);
    FZ_CHECK(m->npend == 0);
    FZ_CHECK(llmem_pool_check(m->pool) == LLMEM_OK);
    llmem_pool_trim(m->pool);
    llmem_pool_stats s = {sizeof s};
    FZ_CHECK(llmem_pool_get_stats(m->pool, &s) == LLMEM_OK);
    FZ_CHECK(s.used_bytes == 0 && s.live_allocations == 0 && s.committed_bytes == 0);
    FZ_CHECK(s.reserved_bytes == 0 || (m->reserve && s.reserved_bytes == m->reserve && s.superblocks == 1));
}

FZ_PROGRAM(model, setup, step, stats_check, sweep, SWEEP, finish, teardown, MAXSTEPS)
