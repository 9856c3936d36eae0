/*
 * test_arena.c - the linear arena: defaults and alignment, marks and
 * rollback, reset that keeps chunks, growth and skip-ahead over retained
 * chunks, fixed capacity and caller buffers, max_bytes, trim, owns, bad
 * input, a device arena over sim-device, ASan poisoning, a randomised
 * property test against a shadow model, and the stats schema.
 *
 * Resource figures come from a tracking adaptor wherever a test claims
 * "no resource call" or "reserved matches what is mapped", so those claims
 * are checked against what really reached the resource.
 */
#include "test_util.h"
#include "support/rng.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* ---- helpers ----------------------------------------------------------- */

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static uintptr_t up(uintptr_t x, size_t a) { return (x + a - 1) & ~(uintptr_t)(a - 1); }

static bool is_aligned(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

/* The arena's stats, with the struct_size the library writes. */
static llmem_arena_stats ast(const llmem_arena *a)
{
    llmem_arena_stats s = test_arena_stats(a);
    assert_int_equal(s.struct_size, sizeof s);
    return s;
}

static llmem_resource *new_tracking(void)
{
    llmem_resource *t = NULL;
    assert_ok(llmem_tracking_resource_create(llmem_resource_default(), &t));
    return t;
}

/* Destroy a tracking resource after checking nothing is left mapped. */
static void end_tracking(llmem_resource *t)
{
    llmem_tracking_stats s = test_tracking_stats(t);
    if (s.live_mappings != 0 || s.live_bytes != 0) {
        llmem_tracking_resource_report(t, stderr, NULL);
        fail_msg("%llu mappings (%llu bytes) leaked", (unsigned long long)s.live_mappings,
                 (unsigned long long)s.live_bytes);
    }
    assert_int_equal(s.refused_total, 0); /* the arena never sent a bad unmap */
    llmem_resource_destroy(t);
}

static llmem_arena *arena_over(llmem_resource *r, size_t chunk_bytes)
{
    llmem_arena_options o = llmem_arena_options_default();
    o.resource = r;
    o.chunk_bytes = chunk_bytes;
    llmem_arena *a = NULL;
    assert_ok(llmem_arena_create(&o, &a));
    assert_non_null(a);
    return a;
}

static llmem_arena *arena_with(const llmem_arena_options *o)
{
    llmem_arena *a = NULL;
    assert_ok(llmem_arena_create(o, &a));
    assert_non_null(a);
    return a;
}

/* An allocation that must succeed, with its status out-param checked. */
static unsigned char *must_alloc(llmem_arena *a, size_t size, size_t align)
{
    llmem_status st = LLMEM_ECORRUPT;
    void *p = llmem_arena_alloc(a, size, align, &st);
    if (!p || st != LLMEM_OK)
        fail_msg("alloc(%zu, %zu) -> %p %s: %s", size, align, p, llmem_status_name(st), llmem_error_message());
    return p;
}

/* An allocation that must fail with `want`, set the out-param, and leave a
 * fresh message mentioning `needle`. */
#define assert_alloc_fails(a, size, align, want, needle)                                                \
    do {                                                                                                \
        llmem_error_clear();                                                                            \
        llmem_status st__ = LLMEM_OK;                                                                   \
        void *p__ = llmem_arena_alloc((a), (size), (align), &st__);                                     \
        if (p__ != NULL) fail_msg("alloc(%s, %s) succeeded, expected %s", #size, #align, llmem_status_name(want)); \
        if (st__ != (want))                                                                             \
            fail_msg("alloc(%s, %s) -> %s, expected %s (%s)", #size, #align, llmem_status_name(st__),   \
                     llmem_status_name(want), llmem_error_message());                                      \
        assert_int_equal(llmem_error_status(), (want));                                                  \
        assert_error_mentions(needle);                                                                  \
    } while (0)

/* A call that must fail with `want` and a fresh message mentioning needle. */
#define assert_fails(expr, want, needle)                                                                \
    do {                                                                                                \
        llmem_error_clear();                                                                            \
        assert_status((expr), (want));                                                                  \
        assert_error_mentions(needle);                                                                  \
    } while (0)

static void fill(void *p, size_t n, unsigned seed)
{
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(seed * 131u + i * 7u + 1u);
}

static bool filled(const void *p, size_t n, unsigned seed)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != (unsigned char)(seed * 131u + i * 7u + 1u)) return false;
    return true;
}

/* The tracking mapping with the highest sequence number (the newest). */
typedef struct found_mapping {
    uintptr_t want;  /* for find_containing: the address looked for */
    bool found;
    void *ptr;
    size_t size;
    uint64_t seq;
    char tag[32];
} found_mapping;

static bool take_newest(void *user, const llmem_tracking_entry *e)
{
    found_mapping *f = user;
    if (!f->found || e->seq > f->seq) {
        f->found = true;
        f->ptr = e->ptr;
        f->size = e->size;
        f->seq = e->seq;
        snprintf(f->tag, sizeof f->tag, "%s", e->tag);
    }
    return true;
}

static found_mapping newest_mapping(const llmem_resource *t)
{
    found_mapping f;
    memset(&f, 0, sizeof f);
    assert_ok(llmem_tracking_resource_foreach(t, take_newest, &f));
    assert_true(f.found);
    return f;
}

static bool take_containing(void *user, const llmem_tracking_entry *e)
{
    found_mapping *f = user;
    if (f->want >= (uintptr_t)e->ptr && f->want < (uintptr_t)e->ptr + e->size) {
        f->found = true;
        f->ptr = e->ptr;
        f->size = e->size;
        f->seq = e->seq;
        return false;
    }
    return true;
}

/* The live tracked mapping holding [p, p+n), or fail. */
static found_mapping mapping_of(const llmem_resource *t, const void *p, size_t n)
{
    found_mapping f;
    memset(&f, 0, sizeof f);
    f.want = (uintptr_t)p;
    assert_ok(llmem_tracking_resource_foreach(t, take_containing, &f));
    if (!f.found) fail_msg("%p lies in no live mapping", p);
    if ((uintptr_t)p + n > (uintptr_t)f.ptr + f.size) fail_msg("[%p, +%zu) runs past its mapping", p, n);
    return f;
}

/* ---- defaults and alignment ---------------------------------------------- */

static void defaults_from_null_options(void **state)
{
    (void)state;
    llmem_arena_options d = llmem_arena_options_default();
    assert_string_equal(d.name, "arena");
    assert_null(d.resource);
    assert_int_equal(d.chunk_bytes, MiB);
    assert_int_equal(d.max_bytes, 0);
    assert_int_equal(d.capacity_bytes, 0);
    assert_null(d.buffer);
    assert_int_equal(d.buffer_bytes, 0);
    assert_int_equal(d.align, 0);

    llmem_resource *os = llmem_resource_default();
    assert_int_equal(llmem_resource_kind(os), LLMEM_MEM_HOST);
    llmem_resource_stats r0 = test_resource_stats(os);
    llmem_arena *a = NULL;
    assert_ok(llmem_arena_create(NULL, &a));
    assert_non_null(a);
    /* Nothing is mapped until the first allocation. */
    assert_int_equal(test_resource_stats(os).map_calls_total, r0.map_calls_total);
    llmem_arena_stats s = ast(a);
    assert_int_equal(s.chunks, 0);
    assert_int_equal(s.reserved_bytes, 0);

    unsigned char *p = must_alloc(a, 100, 0);
    assert_true(is_aligned(p, 64));
    llmem_resource_stats r1 = test_resource_stats(os);
    assert_int_equal(r1.map_calls_total, r0.map_calls_total + 1);
    assert_int_equal(r1.mapped_bytes, r0.mapped_bytes + MiB); /* one default chunk */
    /* Bump allocation: the next one starts at the next 64-byte boundary. */
    unsigned char *q = must_alloc(a, 1, 0);
    assert_ptr_equal(q, p + 128);

    static const size_t sizes[] = {1, 7, 63, 64, 65, 1000, 4097, 30000};
    unsigned char *ptrs[8];
    size_t requested = 101, last_end = 0;
    for (size_t i = 0; i < 8; i++) {
        ptrs[i] = must_alloc(a, sizes[i], 0);
        assert_true(is_aligned(ptrs[i], 64));
        assert_true(ptrs[i] >= (i ? ptrs[i - 1] + sizes[i - 1] : q + 1));
        fill(ptrs[i], sizes[i], (unsigned)i);
        requested += sizes[i];
        last_end = (size_t)(ptrs[i] + sizes[i] - p);
    }
    memset(p, 0xA5, 100);
    *q = 0x5A;
    for (size_t i = 0; i < 8; i++) assert_true(filled(ptrs[i], sizes[i], (unsigned)i));
    for (size_t i = 0; i < 100; i++) assert_int_equal(p[i], 0xA5);
    assert_int_equal(*q, 0x5A);

    s = ast(a);
    assert_int_equal(s.chunks, 1);
    assert_int_equal(s.grows_total, 1);
    assert_int_equal(s.reserved_bytes, MiB);
    assert_int_equal(s.allocs_total, 10);
    assert_int_equal(s.requested_bytes, requested);
    assert_int_equal(s.used_bytes, last_end); /* p is the chunk's first byte */
    assert_int_equal(s.waste_bytes, s.used_bytes - s.requested_bytes);
    assert_int_equal(s.used_peak_bytes, s.used_bytes);
    assert_int_equal(s.failures_total, 0);
    llmem_arena_destroy(a);
    llmem_resource_stats r2 = test_resource_stats(os);
    assert_int_equal(r2.mapped_bytes, r0.mapped_bytes);
    assert_int_equal(r2.unmap_calls_total, r0.unmap_calls_total + 1);

    /* A zeroed options struct means the same defaults. */
    llmem_arena_options z;
    memset(&z, 0, sizeof z);
    a = arena_with(&z);
    p = must_alloc(a, 3, 0);
    assert_true(is_aligned(p, 64));
    assert_int_equal(ast(a).reserved_bytes, MiB);
    llmem_arena_destroy(a);
}

static void explicit_alignments_are_honoured(void **state)
{
    (void)state;
    static const size_t aligns[] = {1, 16, 4096, 2 * MiB};
    static const size_t sizes[] = {1, 3, 17, 100, 1000, 5};
    for (size_t k = 0; k < 4; k++) {
        llmem_arena_options o = llmem_arena_options_default();
        o.align = aligns[k];
        llmem_arena *a = arena_with(&o);
        unsigned char *ptrs[6];
        for (size_t i = 0; i < 6; i++) {
            ptrs[i] = must_alloc(a, sizes[i], 0);
            if (!is_aligned(ptrs[i], aligns[k])) fail_msg("align %zu: %p", aligns[k], (void *)ptrs[i]);
            /* The arena packs to exactly its alignment, no coarser. */
            if (i && aligns[k] <= 4096)
                assert_ptr_equal(ptrs[i], (unsigned char *)up((uintptr_t)(ptrs[i - 1] + sizes[i - 1]), aligns[k]));
            fill(ptrs[i], sizes[i], (unsigned)(k * 10 + i));
        }
        /* A per-call alignment overrides the default, both ways. */
        unsigned char *big = must_alloc(a, 10, 8192);
        assert_true(is_aligned(big, 8192));
        fill(big, 10, 99);
        unsigned char *one = must_alloc(a, 1, 1);
        unsigned char *next = must_alloc(a, 1, 1);
        assert_ptr_equal(next, one + 1);
        for (size_t i = 0; i < 6; i++) assert_true(filled(ptrs[i], sizes[i], (unsigned)(k * 10 + i)));
        assert_true(filled(big, 10, 99));
        llmem_arena_stats s = ast(a);
        assert_int_equal(s.allocs_total, 9);
        assert_int_equal(s.waste_bytes, s.used_bytes - s.requested_bytes);
        llmem_arena_destroy(a);
    }
}

static void waste_counts_alignment_padding(void **state)
{
    (void)state;
    llmem_arena *a = arena_with(NULL);
    unsigned char *p = must_alloc(a, 1, 0);
    unsigned char *q = must_alloc(a, 1, 64);
    assert_ptr_equal(q, p + 64);
    llmem_arena_stats s = ast(a);
    assert_int_equal(s.requested_bytes, 2);
    assert_int_equal(s.used_bytes, 65);
    assert_true(s.waste_bytes >= 63);
    assert_int_equal(s.waste_bytes, s.used_bytes - s.requested_bytes);
    unsigned char *r = must_alloc(a, 8, 4096);
    assert_true(is_aligned(r, 4096));
    s = ast(a);
    assert_int_equal(s.used_bytes, (size_t)(r + 8 - p));
    assert_int_equal(s.waste_bytes, (size_t)(r + 8 - p) - 10);
    llmem_arena_destroy(a);
}

/* ---- marks --------------------------------------------------------------- */

static void rollback_frees_exactly_what_came_after(void **state)
{
    (void)state;
    llmem_arena *a = arena_with(NULL);
    unsigned char *p0 = must_alloc(a, 100, 0);
    fill(p0, 100, 1);
    llmem_arena_mark m = llmem_arena_save(a);
    llmem_arena_stats at_mark = ast(a);
    unsigned char *p1 = must_alloc(a, 1000, 0);
    must_alloc(a, 5000, 0);
    must_alloc(a, 3, 16);
    assert_true(ast(a).used_bytes > at_mark.used_bytes);
    assert_ok(llmem_arena_rollback(a, m));
    llmem_arena_stats s = ast(a);
    assert_int_equal(s.used_bytes, at_mark.used_bytes);
    assert_int_equal(s.requested_bytes, at_mark.requested_bytes);
    assert_int_equal(s.requested_bytes, 100);
    assert_int_equal(s.rollbacks_total, 1);
    assert_int_equal(s.allocs_total, 4); /* a counter, not a level */
    assert_true(s.used_peak_bytes >= at_mark.used_bytes + 1000 + 5000);
    /* The next allocation reuses the same address. */
    assert_ptr_equal(must_alloc(a, 1000, 0), p1);
    assert_true(filled(p0, 100, 1));
    /* A mark rolled back to stays valid: roll back to it again. */
    assert_ok(llmem_arena_rollback(a, m));
    assert_int_equal(ast(a).used_bytes, at_mark.used_bytes);
    assert_ok(llmem_arena_rollback(a, m)); /* nothing allocated since: a no-op */
    assert_int_equal(ast(a).used_bytes, at_mark.used_bytes);
    assert_int_equal(ast(a).rollbacks_total, 3);
    llmem_arena_destroy(a);
}

static void nested_marks_and_marks_rolled_back_past(void **state)
{
    (void)state;
    llmem_arena *a = arena_over(NULL, 64 * KiB);
    must_alloc(a, 10, 0);
    llmem_arena_mark m1 = llmem_arena_save(a);
    uint64_t u1 = ast(a).used_bytes;
    unsigned char *a1 = must_alloc(a, 50000, 0);
    llmem_arena_mark m2 = llmem_arena_save(a);
    uint64_t u2 = ast(a).used_bytes;
    unsigned char *a2 = must_alloc(a, 50000, 0); /* moves to a second chunk */
    llmem_arena_mark m3 = llmem_arena_save(a);
    uint64_t u3 = ast(a).used_bytes;
    unsigned char *a3 = must_alloc(a, 777, 0);
    assert_int_equal(ast(a).chunks, 2);

    assert_ok(llmem_arena_rollback(a, m3));
    assert_int_equal(ast(a).used_bytes, u3);
    assert_ok(llmem_arena_rollback(a, m2));
    assert_int_equal(ast(a).used_bytes, u2);
    assert_ok(llmem_arena_rollback(a, m1));
    assert_int_equal(ast(a).used_bytes, u1);
    assert_int_equal(ast(a).requested_bytes, 10);

    /* m2 and m3 now lie ahead of the cursor. */
    llmem_arena_stats before = ast(a);
    assert_fails(llmem_arena_rollback(a, m3), LLMEM_ESTATE, "ahead of the cursor");
    assert_fails(llmem_arena_rollback(a, m2), LLMEM_ESTATE, "ahead of the cursor");
    llmem_arena_stats after = ast(a);
    assert_int_equal(after.used_bytes, before.used_bytes);
    assert_int_equal(after.rollbacks_total, before.rollbacks_total);

    /* Overtaken again by the same allocations, they are valid positions. */
    assert_ptr_equal(must_alloc(a, 50000, 0), a1);
    assert_ptr_equal(must_alloc(a, 50000, 0), a2);
    assert_ptr_equal(must_alloc(a, 777, 0), a3);
    assert_ok(llmem_arena_rollback(a, m3));
    assert_int_equal(ast(a).used_bytes, u3);
    assert_ok(llmem_arena_rollback(a, m2));
    assert_int_equal(ast(a).used_bytes, u2);
    assert_int_equal(ast(a).requested_bytes, 50010);
    llmem_arena_destroy(a);
}

static void stale_and_foreign_marks_are_refused(void **state)
{
    (void)state;
    llmem_arena_options o = llmem_arena_options_default();
    o.name = "marks";
    llmem_arena *a = arena_with(&o), *b = arena_with(NULL);
    must_alloc(a, 100, 0);
    llmem_arena_mark m = llmem_arena_save(a);
    must_alloc(a, 100, 0);
    llmem_arena_mark mb = llmem_arena_save(b);

    /* Another arena's mark, and the zero mark of a NULL arena. */
    llmem_arena_stats s0 = ast(a);
    assert_fails(llmem_arena_rollback(a, mb), LLMEM_EINVAL, "another arena");
    assert_error_mentions("marks");
    assert_fails(llmem_arena_rollback(a, llmem_arena_save(NULL)), LLMEM_EINVAL, "another arena");
    assert_fails(llmem_arena_rollback(NULL, m), LLMEM_EINVAL, "null arena");
    /* A damaged mark (more requested than used) is refused too. */
    llmem_arena_mark bad = m;
    bad.requested = bad.used + 1;
    assert_fails(llmem_arena_rollback(a, bad), LLMEM_EINVAL, "damaged");
    llmem_arena_stats s1 = ast(a);
    assert_int_equal(s1.used_bytes, s0.used_bytes);
    assert_int_equal(s1.rollbacks_total, 0);

    /* A mark taken before a reset, even one at the very start. */
    llmem_arena_mark start = llmem_arena_save(a);
    llmem_arena_reset(a);
    assert_fails(llmem_arena_rollback(a, m), LLMEM_ESTATE, "before the last reset");
    assert_fails(llmem_arena_rollback(a, start), LLMEM_ESTATE, "before the last reset");
    must_alloc(a, 500, 0);
    must_alloc(a, 500, 0);
    assert_fails(llmem_arena_rollback(a, m), LLMEM_ESTATE, "reset");
    assert_int_equal(ast(a).used_bytes, 1024 - 12); /* untouched: 500 at 0, 500 at 512 */
    /* A fresh mark works. */
    llmem_arena_mark fresh = llmem_arena_save(a);
    must_alloc(a, 1, 0);
    assert_ok(llmem_arena_rollback(a, fresh));
    assert_int_equal(ast(a).used_bytes, 1012);
    llmem_arena_destroy(a);
    llmem_arena_destroy(b);
}

static void marks_of_an_empty_arena(void **state)
{
    (void)state;
    llmem_resource *tr = new_tracking();
    llmem_arena *a = arena_over(tr, 64 * KiB);
    /* A mark of an arena with no chunk yet. */
    llmem_arena_mark m0 = llmem_arena_save(a);
    assert_int_equal(m0.used, 0);
    assert_int_equal(m0.requested, 0);
    assert_ok(llmem_arena_rollback(a, m0)); /* nothing to free, still fine */
    assert_int_equal(test_tracking_stats(tr).live_mappings, 0);
    unsigned char *p = must_alloc(a, 300, 0);
    must_alloc(a, 100000, 0); /* a second chunk */
    assert_ok(llmem_arena_rollback(a, m0));
    llmem_arena_stats s = ast(a);
    assert_int_equal(s.used_bytes, 0);
    assert_int_equal(s.requested_bytes, 0);
    assert_int_equal(s.rollbacks_total, 2);
    assert_int_equal(s.chunks, 2); /* kept for reuse */
    assert_false(llmem_arena_owns(a, p));
    assert_ptr_equal(must_alloc(a, 300, 0), p);

    /* An empty arena that holds chunks (after a reset). */
    llmem_arena_reset(a);
    llmem_arena_mark e = llmem_arena_save(a);
    assert_ok(llmem_arena_rollback(a, e));
    assert_int_equal(ast(a).used_bytes, 0);
    must_alloc(a, 5, 0);
    must_alloc(a, 70000, 0);
    assert_ok(llmem_arena_rollback(a, e));
    assert_int_equal(ast(a).used_bytes, 0);
    assert_ptr_equal(must_alloc(a, 5, 0), p);
    llmem_arena_destroy(a);
    end_tracking(tr);
}

/* Marks against trim: positions in chunks given back are ahead of the
 * cursor, and a mark overtaken after chunks were mapped again counts used
 * bytes from its position, not from the figure it saved. */
static void marks_across_trim(void **state)
{
    (void)state;
    llmem_resource *tr = new_tracking();
    llmem_arena *a = arena_over(tr, 64 * KiB);
    llmem_arena_mark s = llmem_arena_save(a);   /* no chunk yet */
    must_alloc(a, 100 * KiB, 0);                /* chunk 0: 100 KiB of its own */
    unsigned char *x = must_alloc(a, 1, 0);     /* chunk 1: 64 KiB */
    llmem_arena_mark m = llmem_arena_save(a);
    assert_int_equal(ast(a).used_bytes, 100 * KiB + 1);
    assert_ok(llmem_arena_rollback(a, s));
    assert_int_equal(llmem_arena_trim(a), 100 * KiB + 64 * KiB); /* nothing in use: all goes */
    assert_int_equal(test_tracking_stats(tr).live_mappings, 0);
    assert_fails(llmem_arena_rollback(a, m), LLMEM_ESTATE, "ahead of the cursor");
    assert_ok(llmem_arena_rollback(a, s)); /* the origin still exists */
    assert_false(llmem_arena_owns(a, x));

    /* Grow again with different chunk sizes: 64 KiB then 64 KiB. */
    must_alloc(a, 10, 0);
    unsigned char *q = must_alloc(a, 64 * KiB, 0);
    assert_int_equal(test_tracking_stats(tr).live_mappings, 2);
    assert_ptr_equal(q, newest_mapping(tr).ptr);
    uint64_t used = ast(a).used_bytes;
    assert_int_equal(used, 128 * KiB);
    /* m = (chunk 1, offset 1) is now behind the cursor: valid. */
    assert_ok(llmem_arena_rollback(a, m));
    llmem_arena_stats st = ast(a);
    assert_int_equal(st.used_bytes, used - (64 * KiB - 1)); /* cursor moved back 64 KiB - 1 */
    assert_true(st.requested_bytes <= st.used_bytes);
    assert_int_equal(st.waste_bytes, st.used_bytes - st.requested_bytes);
    assert_true(llmem_arena_owns(a, q));
    assert_false(llmem_arena_owns(a, q + 1));
    assert_ptr_equal(must_alloc(a, 1, 0), q + 64);
    assert_int_equal(ast(a).used_bytes, 64 * KiB + 65);
    llmem_arena_destroy(a);
    end_tracking(tr);
}

/* ---- reset and growth ---------------------------------------------------- */

/* One "request": a fixed sequence of allocations with a mark in the middle. */
static size_t run_request(llmem_arena *a, unsigned char **addrs)
{
    static const size_t sizes[] = {1000, 30000, 70000, 5, 20000, 40000, 64, 100000, 3000};
    size_t n = 0;
    for (size_t i = 0; i < 9; i++) {
        addrs[n] = must_alloc(a, sizes[i], i == 4 ? 4096 : 0);
        fill(addrs[n], sizes[i] < 256 ? sizes[i] : 256, (unsigned)i);
        n++;
        if (i == 3) {
            llmem_arena_mark m = llmem_arena_save(a);
            must_alloc(a, 50000, 0);
            must_alloc(a, 12345, 0);
            assert_ok(llmem_arena_rollback(a, m));
        }
    }
    for (size_t i = 0; i < 9; i++) assert_true(filled(addrs[i], sizes[i] < 256 ? sizes[i] : 256, (unsigned)i));
    return n;
}

static void reset_keeps_chunks(void **state)
{
    (void)state;
    llmem_resource *tr = new_tracking();
    llmem_arena *a = arena_over(tr, 64 * KiB);
    unsigned char *first[16], *again[16];
    size_t n = run_request(a, first);
    llmem_resource_stats r0 = test_resource_stats(tr);
    llmem_tracking_stats t0 = test_tracking_stats(tr);
    llmem_arena_stats s0 = ast(a);
    assert_true(r0.map_calls_total >= 3); /* several chunks */
    assert_int_equal(s0.chunks, t0.live_mappings);
    assert_int_equal(s0.reserved_bytes, t0.live_bytes);
    for (int round = 1; round <= 5; round++) {
        llmem_arena_reset(a);
        llmem_arena_stats s = ast(a);
        assert_int_equal(s.used_bytes, 0);
        assert_int_equal(s.requested_bytes, 0);
        assert_int_equal(s.chunks, s0.chunks);
        assert_int_equal(s.resets_total, (uint64_t)round);
        assert_int_equal(run_request(a, again), n);
        for (size_t i = 0; i < n; i++) assert_ptr_equal(again[i], first[i]);
        llmem_resource_stats r = test_resource_stats(tr);
        assert_int_equal(r.map_calls_total, r0.map_calls_total);
        assert_int_equal(r.unmap_calls_total, 0);
        assert_int_equal(test_tracking_stats(tr).live_mappings, t0.live_mappings);
        s = ast(a);
        assert_int_equal(s.used_bytes, s0.used_bytes);
        assert_int_equal(s.requested_bytes, s0.requested_bytes);
        assert_int_equal(s.grows_total, r0.map_calls_total);
    }
    llmem_arena_destroy(a);
    end_tracking(tr);
}

static void growth_maps_chunks_the_resource_sees(void **state)
{
    (void)state;
    llmem_resource *tr = new_tracking();
    llmem_arena_options o = llmem_arena_options_default();
    o.resource = tr;
    o.chunk_bytes = 64 * KiB;
    o.name = "grower";
    llmem_arena *a = arena_with(&o);
    enum { N = 500, SZ = 1000, STRIDE = 1024 };
    static unsigned char *p[N];
    for (size_t i = 0; i < N; i++) {
        p[i] = must_alloc(a, SZ, 0);
        assert_true(is_aligned(p[i], 64));
        mapping_of(tr, p[i], SZ);
        fill(p[i], SZ, (unsigned)i);
    }
    llmem_arena_stats s = ast(a);
    llmem_tracking_stats t = test_tracking_stats(tr);
    size_t per_chunk = 64 * KiB / STRIDE;
    assert_int_equal(s.chunks, (N + per_chunk - 1) / per_chunk);
    assert_int_equal(s.chunks, t.live_mappings);
    assert_int_equal(s.reserved_bytes, t.live_bytes);
    assert_int_equal(s.reserved_bytes, s.chunks * 64 * KiB);
    assert_int_equal(s.reserved_peak_bytes, s.reserved_bytes);
    assert_int_equal(s.grows_total, s.chunks);
    assert_int_equal(s.requested_bytes, (uint64_t)N * SZ);
    assert_int_equal(s.waste_bytes, (uint64_t)(N - 1) * (STRIDE - SZ)); /* chunks fill exactly */
    assert_int_equal(s.used_bytes, s.requested_bytes + s.waste_bytes);
    assert_string_equal(newest_mapping(tr).tag, "grower");
    for (size_t i = 0; i < N; i++) assert_true(filled(p[i], SZ, (unsigned)i));

    /* Bigger than chunk_bytes: a chunk of its own, sized for it. */
    size_t big = 200000;
    unsigned char *b = must_alloc(a, big, 0);
    found_mapping nm = newest_mapping(tr);
    assert_ptr_equal(nm.ptr, b);
    assert_true(nm.size >= big && nm.size < big + page_size());
    llmem_tracking_stats t2 = test_tracking_stats(tr);
    assert_int_equal(t2.live_mappings, t.live_mappings + 1);
    assert_int_equal(t2.live_bytes, t.live_bytes + nm.size);
    s = ast(a);
    assert_int_equal(s.reserved_bytes, t2.live_bytes);
    assert_int_equal(s.chunks, t2.live_mappings);
    memset(b, 0x3C, big);
    /* Everything earlier is intact. */
    for (size_t i = 0; i < N; i++) assert_true(filled(p[i], SZ, (unsigned)i));
    llmem_arena_destroy(a);
    end_tracking(tr);
}

static void skip_ahead_reuses_retained_chunks_in_order(void **state)
{
    (void)state;
    llmem_resource *tr = new_tracking();
    llmem_arena *a = arena_over(tr, 64 * KiB);
    unsigned char *c0 = must_alloc(a, 60000, 0);
    unsigned char *c1 = must_alloc(a, 60000, 0);
    unsigned char *c2 = must_alloc(a, 100000, 0); /* a bigger chunk */
    assert_int_equal(ast(a).chunks, 3);
    llmem_arena_stats s3 = ast(a);
    uint64_t maps = test_resource_stats(tr).map_calls_total;

    /* After a reset the same requests land in the same chunks, in order. */
    llmem_arena_reset(a);
    assert_ptr_equal(must_alloc(a, 60000, 0), c0);
    llmem_arena_mark m = llmem_arena_save(a);
    assert_ptr_equal(must_alloc(a, 60000, 0), c1);
    assert_ptr_equal(must_alloc(a, 100000, 0), c2);
    assert_int_equal(test_resource_stats(tr).map_calls_total, maps);
    /* After a rollback, too. */
    assert_ok(llmem_arena_rollback(a, m));
    assert_ptr_equal(must_alloc(a, 60000, 0), c1);

    /* A request that does not fit the next retained chunk skips to one that
     * does; the chunk passed over counts as waste and is not owned. */
    assert_ok(llmem_arena_rollback(a, m));
    unsigned char *b = must_alloc(a, 90000, 0);
    assert_ptr_equal(b, c2);
    assert_int_equal(test_resource_stats(tr).map_calls_total, maps);
    llmem_arena_stats s = ast(a);
    assert_int_equal(s.used_bytes, 64 * KiB + 64 * KiB + 90000);
    assert_int_equal(s.requested_bytes, 60000 + 90000);
    assert_int_equal(s.waste_bytes, s.used_bytes - s.requested_bytes);
    assert_false(llmem_arena_owns(a, c1));
    assert_false(llmem_arena_owns(a, c0 + 60000)); /* the tail of chunk 0 */
    assert_true(llmem_arena_owns(a, c0 + 59999));
    assert_true(llmem_arena_owns(a, b + 89999));
    /* Rolling back before the skip gives the passed-over chunk back. */
    assert_ok(llmem_arena_rollback(a, m));
    assert_ptr_equal(must_alloc(a, 60000, 0), c1);
    assert_true(llmem_arena_owns(a, c1));

    /* Nothing retained fits: a new chunk at the end, everything retained
     * before it passed over. */
    llmem_arena_reset(a);
    must_alloc(a, 10, 0);
    unsigned char *n = must_alloc(a, 150000, 0);
    assert_int_equal(test_resource_stats(tr).map_calls_total, maps + 1);
    assert_ptr_equal(newest_mapping(tr).ptr, n);
    s = ast(a);
    assert_int_equal(s.chunks, 4);
    assert_int_equal(s.used_bytes, s3.reserved_bytes + 150000);
    assert_int_equal(s.waste_bytes, s3.reserved_bytes - 10);
    assert_false(llmem_arena_owns(a, c1));
    assert_false(llmem_arena_owns(a, c2));
    assert_int_equal(s.reserved_bytes, test_tracking_stats(tr).live_bytes);
    llmem_arena_destroy(a);
    end_tracking(tr);
}

/* ---- fixed capacity, caller buffers, max_bytes ---------------------------- */

static void fixed_capacity_arena(void **state)
{
    (void)state;
    llmem_resource *tr = new_tracking();
    llmem_arena_options o = llmem_arena_options_default();
    o.resource = tr;
    o.capacity_bytes = 4096;
    o.name = "fixed4k";
    llmem_arena *a = arena_with(&o);
    llmem_resource_stats r0 = test_resource_stats(tr);
    assert_int_equal(r0.map_calls_total, 1); /* mapped at create */
    assert_int_equal(ast(a).chunks, 1);
    unsigned char *first = NULL;
    for (size_t i = 0; i < 4096 / 64; i++) {
        unsigned char *p = must_alloc(a, 64, 0);
        if (!first) first = p;
        assert_ptr_equal(p, first + i * 64);
        fill(p, 64, (unsigned)i);
    }
    llmem_arena_stats s0 = ast(a);
    assert_int_equal(s0.used_bytes, 4096);
    assert_int_equal(s0.allocs_total, 64);
    assert_alloc_fails(a, 1, 0, LLMEM_ECAPACITY, "fixed4k");
    assert_error_mentions("capacity 4096");
    assert_alloc_fails(a, 1, 1, LLMEM_ECAPACITY, "capacity");
    /* A NULL status out-param is allowed. */
    assert_null(llmem_arena_alloc(a, 1, 0, NULL));
    llmem_arena_stats s1 = ast(a);
    assert_int_equal(s1.failures_total, 3);
    assert_int_equal(s1.used_bytes, 4096);
    assert_int_equal(s1.allocs_total, 64);
    assert_int_equal(s1.chunks, 1);
    assert_int_equal(s1.grows_total, 1);
    assert_int_equal(test_resource_stats(tr).map_calls_total, r0.map_calls_total); /* no growth attempted */
    assert_int_equal(test_resource_stats(tr).failures_total, 0);
    for (size_t i = 0; i < 64; i++) assert_true(filled(first + i * 64, 64, (unsigned)i));

    /* Exactly the capacity in one piece, after a reset; one byte more fails. */
    llmem_arena_reset(a);
    assert_ptr_equal(must_alloc(a, 4096, 0), first);
    llmem_arena_reset(a);
    assert_alloc_fails(a, 4097, 0, LLMEM_ECAPACITY, "capacity");
    llmem_arena_mark m = llmem_arena_save(a);
    must_alloc(a, 1, 0);
    assert_alloc_fails(a, 4033, 0, LLMEM_ECAPACITY, "capacity"); /* with its padding it would not fit */
    assert_ptr_equal(must_alloc(a, 4032, 0), first + 64);
    assert_alloc_fails(a, 1, 1, LLMEM_ECAPACITY, "capacity");
    assert_ok(llmem_arena_rollback(a, m));
    assert_int_equal(ast(a).used_bytes, 0);
    assert_int_equal(test_resource_stats(tr).map_calls_total, 1);
    llmem_arena_destroy(a);
    end_tracking(tr);

    /* A capacity that is not a page multiple is exact, not rounded up. */
    o = llmem_arena_options_default();
    o.capacity_bytes = 100;
    a = arena_with(&o);
    unsigned char *p = must_alloc(a, 100, 1);
    memset(p, 7, 100);
    assert_alloc_fails(a, 1, 1, LLMEM_ECAPACITY, "capacity 100");
    llmem_arena_reset(a);
    assert_alloc_fails(a, 101, 1, LLMEM_ECAPACITY, "capacity");
    llmem_arena_destroy(a);
}

static void caller_buffer_arena(void **state)
{
    (void)state;
    enum { RAW = 8192, N = 5000 };
    unsigned char *raw = malloc(RAW);
    assert_non_null(raw);
    memset(raw, 0xEE, RAW);
    unsigned char *buf = raw + 3; /* deliberately unaligned */
    llmem_resource *tr = new_tracking();
    llmem_arena_options o = llmem_arena_options_default();
    o.resource = tr;
    o.buffer = buf;
    o.buffer_bytes = N;
    o.name = "callerbuf";
    llmem_arena *a = arena_with(&o);
    llmem_arena_stats s = ast(a);
    assert_int_equal(s.chunks, 1);
    assert_int_equal(s.reserved_bytes, N);

    unsigned char *ptrs[64];
    size_t n = 0;
    for (;;) {
        llmem_status st = LLMEM_OK;
        unsigned char *p = llmem_arena_alloc(a, 100, 0, &st);
        if (!p) {
            assert_int_equal(st, LLMEM_ECAPACITY);
            assert_error_mentions("callerbuf");
            break;
        }
        assert_int_equal(st, LLMEM_OK);
        assert_true(n < 64);
        assert_true(is_aligned(p, 64));
        assert_true(p >= buf && p + 100 <= buf + N);
        fill(p, 100, (unsigned)n);
        ptrs[n++] = p;
    }
    /* Every 64-aligned slot of 100 bytes that fits was handed out. */
    size_t fits = 0;
    for (uintptr_t q = up((uintptr_t)buf, 64); q + 100 <= (uintptr_t)(buf + N); q += 128) fits++;
    assert_int_equal(n, fits);
    for (size_t i = 0; i < n; i++) assert_true(filled(ptrs[i], 100, (unsigned)i));
    assert_int_equal(test_resource_stats(tr).map_calls_total, 0);
    assert_int_equal(llmem_arena_trim(a), 0);

    /* With alignment 1 the whole buffer, to the byte. */
    llmem_arena_reset(a);
    unsigned char *all = must_alloc(a, N, 1);
    assert_ptr_equal(all, buf);
    memset(all, 0x11, N);
    assert_alloc_fails(a, 1, 1, LLMEM_ECAPACITY, "capacity");
    llmem_arena_reset(a);
    assert_alloc_fails(a, N + 1, 1, LLMEM_ECAPACITY, "capacity");
    llmem_arena_destroy(a);
    assert_int_equal(test_resource_stats(tr).map_calls_total, 0);
    assert_int_equal(test_resource_stats(tr).unmap_calls_total, 0);
    end_tracking(tr);

    /* The buffer is the caller's again: usable (and, under ASan, clean). */
#ifdef TEST_ASAN
    assert_null(__asan_region_is_poisoned(raw, RAW));
#endif
    for (size_t i = 0; i < N; i++) assert_int_equal(buf[i], 0x11);
    for (size_t i = 0; i < 3; i++) assert_int_equal(raw[i], 0xEE);
    for (size_t i = 3 + N; i < RAW; i++) assert_int_equal(raw[i], 0xEE);
    memset(raw, 0, RAW);
    free(raw);
}

static void max_bytes_caps_growth(void **state)
{
    (void)state;
    llmem_resource *tr = new_tracking();
    llmem_arena_options o = llmem_arena_options_default();
    o.resource = tr;
    o.chunk_bytes = 64 * KiB;
    o.max_bytes = 3 * 64 * KiB;
    o.name = "capped";
    llmem_arena *a = arena_with(&o);
    unsigned char *p[3];
    for (int i = 0; i < 3; i++) p[i] = must_alloc(a, 60000, 0);
    llmem_arena_stats s0 = ast(a);
    uint64_t maps = test_resource_stats(tr).map_calls_total;
    assert_int_equal(s0.chunks, 3);
    assert_alloc_fails(a, 60000, 0, LLMEM_ECAPACITY, "max_bytes");
    assert_error_mentions("capped");
    assert_alloc_fails(a, 300000, 0, LLMEM_ECAPACITY, "max_bytes"); /* more than the cap at once */
    llmem_arena_stats s1 = ast(a);
    assert_int_equal(s1.failures_total, 2);
    assert_int_equal(s1.used_bytes, s0.used_bytes);
    assert_int_equal(s1.requested_bytes, s0.requested_bytes);
    assert_int_equal(s1.allocs_total, s0.allocs_total);
    assert_int_equal(s1.reserved_bytes, s0.reserved_bytes);
    assert_int_equal(test_resource_stats(tr).map_calls_total, maps);
    assert_int_equal(test_tracking_stats(tr).live_mappings, 3);
    /* What fits still works: the tail of the last chunk. */
    unsigned char *t = must_alloc(a, 5000, 0);
    assert_true(t > p[2] && t + 5000 <= p[2] + 64 * KiB);
    /* And after a reset the chunks are reused. */
    llmem_arena_reset(a);
    for (int i = 0; i < 3; i++) assert_ptr_equal(must_alloc(a, 60000, 0), p[i]);
    /* Trim frees room under the cap. */
    llmem_arena_reset(a);
    assert_int_equal(llmem_arena_trim(a), 3 * 64 * KiB);
    unsigned char *big = must_alloc(a, 3 * 64 * KiB, 0);
    memset(big, 1, 3 * 64 * KiB);
    assert_alloc_fails(a, 1, 0, LLMEM_ECAPACITY, "max_bytes");
    llmem_arena_destroy(a);
    end_tracking(tr);
}

static void resource_failure_changes_nothing(void **state)
{
    (void)state;
    llmem_resource *tr = new_tracking(), *lim = NULL;
    llmem_limit_options lo = llmem_limit_options_default();
    lo.limit_bytes = 2 * 64 * KiB;
    assert_ok(llmem_limit_resource_create(tr, &lo, &lim));
    llmem_arena *a = arena_over(lim, 64 * KiB);
    unsigned char *p0 = must_alloc(a, 60000, 0);
    must_alloc(a, 60000, 0);
    llmem_arena_stats s0 = ast(a);
    llmem_status st = LLMEM_OK;
    llmem_error_clear();
    assert_null(llmem_arena_alloc(a, 60000, 0, &st));
    assert_int_equal(st, LLMEM_ENOMEM);
    assert_true(llmem_error_message()[0] != '\0');
    llmem_arena_stats s1 = ast(a);
    assert_int_equal(s1.used_bytes, s0.used_bytes);
    assert_int_equal(s1.allocs_total, s0.allocs_total);
    assert_int_equal(s1.chunks, s0.chunks);
    assert_int_equal(s1.failures_total, s0.failures_total + 1);
    assert_int_equal(test_tracking_stats(tr).live_mappings, 2);
    /* Still usable for what fits, and a rollback still lands right. */
    llmem_arena_reset(a);
    assert_ptr_equal(must_alloc(a, 60000, 0), p0);
    llmem_arena_destroy(a);
    llmem_resource_destroy(lim);
    end_tracking(tr);
}

/* ---- trim ---------------------------------------------------------------- */

static void trim_releases_retained_chunks(void **state)
{
    (void)state;
    llmem_resource *tr = new_tracking();
    llmem_arena *a = arena_over(tr, 64 * KiB);
    assert_int_equal(llmem_arena_trim(a), 0); /* nothing held */
    unsigned char *p0 = must_alloc(a, 60000, 0);
    fill(p0, 60000, 5);
    llmem_arena_mark m = llmem_arena_save(a);
    for (int i = 0; i < 3; i++) must_alloc(a, 60000, 0);
    assert_int_equal(test_tracking_stats(tr).live_mappings, 4);
    assert_int_equal(llmem_arena_trim(a), 0); /* the cursor is in the last chunk */
    llmem_tracking_stats t0 = test_tracking_stats(tr);

    assert_ok(llmem_arena_rollback(a, m));
    size_t released = llmem_arena_trim(a);
    llmem_tracking_stats t1 = test_tracking_stats(tr);
    assert_int_equal(released, t0.live_bytes - t1.live_bytes);
    assert_int_equal(released, 3 * 64 * KiB);
    assert_int_equal(t1.live_mappings, 1);
    llmem_arena_stats s = ast(a);
    assert_int_equal(s.chunks, 1);
    assert_int_equal(s.reserved_bytes, t1.live_bytes);
    assert_int_equal(s.releases_total, 3);
    assert_int_equal(s.reserved_peak_bytes, t0.live_bytes);
    assert_true(llmem_arena_owns(a, p0));
    assert_true(filled(p0, 60000, 5));
    assert_int_equal(llmem_arena_trim(a), 0); /* the chunk in use stays */
    assert_int_equal(test_tracking_stats(tr).live_mappings, 1);

    /* Growth maps again. */
    uint64_t maps = test_resource_stats(tr).map_calls_total;
    must_alloc(a, 60000, 0);
    assert_int_equal(test_resource_stats(tr).map_calls_total, maps + 1);

    /* After a reset, everything goes. */
    llmem_arena_reset(a);
    llmem_tracking_stats t2 = test_tracking_stats(tr);
    assert_int_equal(llmem_arena_trim(a), t2.live_bytes);
    assert_int_equal(test_tracking_stats(tr).live_mappings, 0);
    assert_int_equal(test_tracking_stats(tr).live_bytes, 0);
    s = ast(a);
    assert_int_equal(s.chunks, 0);
    assert_int_equal(s.reserved_bytes, 0);
    assert_int_equal(s.used_bytes, 0);
    assert_int_equal(s.releases_total, 5);
    assert_int_equal(llmem_arena_trim(a), 0);
    assert_false(llmem_arena_owns(a, p0));

    /* And the arena still works: it maps again. */
    maps = test_resource_stats(tr).map_calls_total;
    unsigned char *p = must_alloc(a, 100, 0);
    assert_int_equal(test_resource_stats(tr).map_calls_total, maps + 1);
    memset(p, 9, 100);
    assert_true(llmem_arena_owns(a, p));
    assert_int_equal(ast(a).used_bytes, 100);
    assert_int_equal(ast(a).chunks, 1);
    llmem_arena_destroy(a);
    end_tracking(tr);
}

static void trim_of_fixed_arenas_releases_nothing(void **state)
{
    (void)state;
    llmem_resource *tr = new_tracking();
    llmem_arena_options o = llmem_arena_options_default();
    o.resource = tr;
    o.capacity_bytes = 64 * KiB;
    llmem_arena *a = arena_with(&o);
    must_alloc(a, 1000, 0);
    assert_int_equal(llmem_arena_trim(a), 0);
    llmem_arena_reset(a);
    assert_int_equal(llmem_arena_trim(a), 0);
    assert_int_equal(test_tracking_stats(tr).live_mappings, 1);
    assert_int_equal(ast(a).chunks, 1);
    assert_int_equal(ast(a).releases_total, 0);
    unsigned char *p = must_alloc(a, 64 * KiB, 0);
    memset(p, 1, 64 * KiB);
    llmem_arena_destroy(a);
    end_tracking(tr);

    static unsigned char buf[4096];
    o = llmem_arena_options_default();
    o.buffer = buf;
    o.buffer_bytes = sizeof buf;
    a = arena_with(&o);
    llmem_arena_reset(a);
    assert_int_equal(llmem_arena_trim(a), 0);
    assert_ptr_equal(must_alloc(a, sizeof buf, 1), buf);
    llmem_arena_destroy(a);
}

/* ---- owns ---------------------------------------------------------------- */

static void owns_only_live_allocations(void **state)
{
    (void)state;
    llmem_arena *a = arena_with(NULL), *b = arena_with(NULL);
    unsigned char *p = must_alloc(a, 100, 0);
    unsigned char *q = must_alloc(a, 200, 0);
    assert_true(llmem_arena_owns(a, p));
    assert_true(llmem_arena_owns(a, p + 99));
    assert_true(llmem_arena_owns(a, q));
    assert_true(llmem_arena_owns(a, q + 199));
    assert_false(llmem_arena_owns(a, q + 200)); /* the cursor */
    assert_false(llmem_arena_owns(a, p - 1));
    unsigned char *r = must_alloc(b, 10, 0);
    assert_false(llmem_arena_owns(a, r));
    assert_true(llmem_arena_owns(b, r));
    assert_false(llmem_arena_owns(b, p));
    int local = 0;
    assert_false(llmem_arena_owns(a, &local));
    assert_false(llmem_arena_owns(a, NULL));
    assert_false(llmem_arena_owns(NULL, p));
    void *heap = malloc(16);
    assert_non_null(heap);
    assert_false(llmem_arena_owns(a, heap));
    free(heap);

    llmem_arena_mark m = llmem_arena_save(a);
    unsigned char *f = must_alloc(a, 1000, 0);
    assert_true(llmem_arena_owns(a, f + 999));
    assert_ok(llmem_arena_rollback(a, m));
    assert_false(llmem_arena_owns(a, f));
    assert_false(llmem_arena_owns(a, f + 999));
    assert_true(llmem_arena_owns(a, q + 199));
    llmem_arena_reset(a);
    assert_false(llmem_arena_owns(a, p));
    assert_false(llmem_arena_owns(a, q));
    llmem_arena_destroy(a);
    llmem_arena_destroy(b);
}

/* ---- bad input ----------------------------------------------------------- */

static void bad_create_options(void **state)
{
    (void)state;
    static unsigned char buf[256];
    llmem_resource *tr = new_tracking();
    llmem_arena *const sentinel = (llmem_arena *)(void *)buf;
    llmem_arena *a;
    llmem_arena_options o;

    assert_fails(llmem_arena_create(NULL, NULL), LLMEM_EINVAL, "null out");

#define BAD(field_setup, want, needle)                                                                  \
    do {                                                                                                \
        o = llmem_arena_options_default();                                                              \
        o.name = "badopts";                                                                             \
        o.resource = tr;                                                                                \
        field_setup;                                                                                    \
        a = sentinel;                                                                                   \
        assert_fails(llmem_arena_create(&o, &a), want, needle);                                        \
        assert_error_mentions("badopts");                                                               \
        assert_null(a);                                                                                 \
    } while (0)

    BAD(o.align = 3, LLMEM_EALIGN, "alignment 3");
    BAD(o.align = 2 * GiB, LLMEM_EALIGN, "alignment");
    BAD(o.align = 96, LLMEM_EALIGN, "power of two");
    BAD((o.buffer = buf, o.buffer_bytes = sizeof buf, o.capacity_bytes = 4096), LLMEM_EINVAL, "not both");
    BAD((o.buffer = buf, o.buffer_bytes = 0), LLMEM_EINVAL, "0 bytes");
    BAD(o.buffer_bytes = 64, LLMEM_EINVAL, "without a buffer");
    BAD((o.buffer = (void *)(UINTPTR_MAX - 8), o.buffer_bytes = 64), LLMEM_EOVERFLOW, "wraps");
    BAD(o.chunk_bytes = SIZE_MAX, LLMEM_EOVERFLOW, "chunk_bytes");
#undef BAD
    /* No refused create reached the resource. */
    assert_int_equal(test_resource_stats(tr).map_calls_total, 0);
    assert_int_equal(test_resource_stats(tr).failures_total, 0);

    /* The largest alignment allowed is fine. */
    o = llmem_arena_options_default();
    o.align = GiB;
    assert_ok(llmem_arena_create(&o, &a));
    llmem_arena_destroy(a);
    end_tracking(tr);
}

static void bad_alloc_changes_nothing(void **state)
{
    (void)state;
    llmem_arena_options o = llmem_arena_options_default();
    o.name = "badalloc";
    llmem_arena *a = arena_with(&o);
    unsigned char *p0 = must_alloc(a, 100, 0);
    llmem_arena_stats s0 = ast(a);

    llmem_status st = LLMEM_OK;
    llmem_error_clear();
    assert_null(llmem_arena_alloc(NULL, 16, 0, &st));
    assert_int_equal(st, LLMEM_EINVAL);
    assert_error_mentions("null arena");

    assert_alloc_fails(a, 0, 0, LLMEM_EINVAL, "0 bytes");
    assert_error_mentions("badalloc");
    assert_alloc_fails(a, SIZE_MAX, 0, LLMEM_EOVERFLOW, "overflow");
    assert_alloc_fails(a, SIZE_MAX / 2 + 1, 0, LLMEM_EOVERFLOW, "overflow");
    assert_alloc_fails(a, SIZE_MAX / 2, 0, LLMEM_EOVERFLOW, "overflow"); /* fits the check, not the rounding */
    assert_error_mentions("badalloc");
    assert_alloc_fails(a, 16, 3, LLMEM_EALIGN, "alignment 3");
    assert_alloc_fails(a, 16, 2 * GiB, LLMEM_EALIGN, "alignment");
    assert_alloc_fails(a, 16, SIZE_MAX, LLMEM_EALIGN, "alignment");
    assert_null(llmem_arena_alloc(a, 0, 0, NULL)); /* NULL status is fine */
    const int failures = 8;

    llmem_arena_stats s1 = ast(a);
    assert_int_equal(s1.used_bytes, s0.used_bytes);
    assert_int_equal(s1.requested_bytes, s0.requested_bytes);
    assert_int_equal(s1.allocs_total, s0.allocs_total);
    assert_int_equal(s1.reserved_bytes, s0.reserved_bytes);
    assert_int_equal(s1.chunks, s0.chunks);
    assert_int_equal(s1.grows_total, s0.grows_total);
    assert_int_equal(s1.used_peak_bytes, s0.used_peak_bytes);
    assert_int_equal(s1.failures_total, s0.failures_total + failures);
    /* The cursor did not move. */
    assert_ptr_equal(must_alloc(a, 1, 0), p0 + 128);

    /* stats with NULL */
    llmem_arena_stats s;
    assert_fails(llmem_arena_get_stats(NULL, &s), LLMEM_EINVAL, "null");
    assert_fails(llmem_arena_get_stats(a, NULL), LLMEM_EINVAL, "null");
    llmem_arena_destroy(a);
}

static void null_handles_are_no_ops(void **state)
{
    (void)state;
    llmem_arena_destroy(NULL);
    llmem_arena_reset(NULL);
    assert_int_equal(llmem_arena_trim(NULL), 0);
    assert_false(llmem_arena_owns(NULL, NULL));
    llmem_arena_mark m = llmem_arena_save(NULL);
    assert_int_equal(m.arena_id, 0);
    assert_int_equal(m.used, 0);
}

/* ---- a device arena ------------------------------------------------------ */

static void touch_device(void *arg) { *(volatile unsigned char *)arg = 1; }

static void device_arena_over_sim(void **state)
{
    (void)state;
    llmem_sim_options so = llmem_sim_options_default();
    so.capacity = 64 * MiB;
    llmem_resource *sim = NULL;
    assert_ok(llmem_sim_resource_create(&so, &sim));
    assert_int_equal(llmem_resource_kind(sim), LLMEM_MEM_DEVICE);
    llmem_arena *a = arena_over(sim, 64 * KiB);

    unsigned char *d1 = must_alloc(a, 1, 0);
    unsigned char *d2 = must_alloc(a, 1000, 0);
    unsigned char *d3 = must_alloc(a, 3000, 0);
    assert_true(is_aligned(d1, 256) && is_aligned(d2, 256) && is_aligned(d3, 256));
    assert_ptr_equal(d2, d1 + 256);
    assert_ptr_equal(d3, d2 + 1024);
    assert_true(llmem_sim_resource_contains(sim, d1, 1));
    assert_true(llmem_sim_resource_contains(sim, d2, 1000));
    assert_true(llmem_sim_resource_contains(sim, d3, 3000));
    /* The sim really faults on a host touch: nothing below touched it. */
    assert_true(test_child_faults(touch_device, d2));

    unsigned char src[3000], dst[3000];
    fill(src, sizeof src, 42);
    assert_ok(llmem_resource_copy(sim, d3, src, 3000));
    assert_ok(llmem_resource_copy(sim, d2, d3 + 1000, 1000)); /* device to device */
    memset(dst, 0, sizeof dst);
    assert_ok(llmem_resource_copy(sim, dst, d3, 3000));
    assert_memory_equal(dst, src, 3000);
    memset(dst, 0, sizeof dst);
    assert_ok(llmem_resource_copy(sim, dst, d2, 1000));
    assert_memory_equal(dst, src + 1000, 1000);

    /* Marks. */
    llmem_arena_mark m = llmem_arena_save(a);
    unsigned char *d4 = must_alloc(a, 5000, 0);
    assert_true(llmem_sim_resource_contains(sim, d4, 5000));
    assert_ok(llmem_arena_rollback(a, m));
    assert_false(llmem_arena_owns(a, d4));
    assert_ptr_equal(must_alloc(a, 5000, 0), d4);
    /* Growth: a chunk of its own. */
    unsigned char *big = must_alloc(a, 100000, 0);
    assert_true(is_aligned(big, 256));
    assert_true(llmem_sim_resource_contains(sim, big, 100000));
    static unsigned char hbig[100000], hback[100000];
    fill(hbig, sizeof hbig, 3);
    assert_ok(llmem_resource_copy(sim, big, hbig, sizeof hbig));
    assert_ok(llmem_resource_copy(sim, hback, big, sizeof hback));
    assert_memory_equal(hback, hbig, sizeof hbig);
    /* The device figures match. */
    llmem_sim_stats ss;
    memset(&ss, 0, sizeof ss);
    assert_ok(llmem_sim_resource_get_stats(sim, &ss));
    llmem_arena_stats s = ast(a);
    assert_int_equal(ss.used_bytes, s.reserved_bytes);
    assert_int_equal(s.chunks, 2);

    /* Reset reuses; trim after reset gives everything back. */
    llmem_arena_reset(a);
    assert_ptr_equal(must_alloc(a, 1, 0), d1);
    assert_ok(llmem_resource_copy(sim, d1, src, 1));
    assert_ok(llmem_resource_copy(sim, dst, d1, 1));
    assert_int_equal(dst[0], src[0]);
    assert_ok(llmem_arena_rollback(a, llmem_arena_save(a)));
    llmem_arena_reset(a);
    assert_int_equal(llmem_arena_trim(a), s.reserved_bytes);
    assert_ok(llmem_sim_resource_get_stats(sim, &ss));
    assert_int_equal(ss.used_bytes, 0);
    unsigned char *again = must_alloc(a, 777, 0);
    assert_true(is_aligned(again, 256));
    assert_true(llmem_sim_resource_contains(sim, again, 777));
    assert_ok(llmem_resource_copy(sim, again, src, 777));
    assert_ok(llmem_resource_copy(sim, dst, again, 777));
    assert_memory_equal(dst, src, 777);
    llmem_arena_destroy(a);
    assert_ok(llmem_sim_resource_get_stats(sim, &ss));
    assert_int_equal(ss.used_bytes, 0);

    /* A fixed device arena. */
    llmem_arena_options o = llmem_arena_options_default();
    o.resource = sim;
    o.capacity_bytes = 4096;
    a = arena_with(&o);
    unsigned char *f = must_alloc(a, 4096, 0);
    assert_true(llmem_sim_resource_contains(sim, f, 4096));
    assert_alloc_fails(a, 1, 0, LLMEM_ECAPACITY, "capacity");
    llmem_arena_destroy(a);
    llmem_resource_destroy(sim);
}

/* ---- AddressSanitizer poisoning ------------------------------------------ */

static void asan_poisoning(void **state)
{
    (void)state;
#ifdef TEST_ASAN
    llmem_arena *a = arena_with(NULL); /* 1 MiB chunks */
    unsigned char *p = must_alloc(a, 100, 0);
    assert_null(__asan_region_is_poisoned(p, 100));
    assert_true(__asan_address_is_poisoned(p + 100));
    assert_true(__asan_address_is_poisoned(p + 127));
    assert_true(__asan_address_is_poisoned(p + 4096));
    assert_true(__asan_address_is_poisoned(p + MiB - 1));
    unsigned char *q = must_alloc(a, 1, 0);
    assert_ptr_equal(q, p + 128);
    assert_false(__asan_address_is_poisoned(q));
    assert_true(__asan_address_is_poisoned(q + 1));
    assert_true(__asan_address_is_poisoned(p + 120)); /* padding stays poisoned */

    llmem_arena_mark m = llmem_arena_save(a);
    unsigned char *r = must_alloc(a, 5000, 0);
    assert_null(__asan_region_is_poisoned(r, 5000));
    assert_ok(llmem_arena_rollback(a, m));
    assert_ptr_equal(__asan_region_is_poisoned(r, 5000), r);
    assert_true(__asan_address_is_poisoned(r + 4999));
    assert_false(__asan_address_is_poisoned(q));
    /* Unaligned cursor: a rollback to the middle of an 8-byte granule. */
    unsigned char *u1 = must_alloc(a, 3, 1);
    llmem_arena_mark mu = llmem_arena_save(a);
    unsigned char *u2 = must_alloc(a, 9, 1);
    assert_ptr_equal(u2, u1 + 3);
    assert_null(__asan_region_is_poisoned(u1, 12));
    assert_ok(llmem_arena_rollback(a, mu));
    assert_null(__asan_region_is_poisoned(u1, 3));
    assert_true(__asan_address_is_poisoned(u2));
    assert_true(__asan_address_is_poisoned(u2 + 8));

    llmem_arena_reset(a);
    assert_true(__asan_address_is_poisoned(p));
    assert_true(__asan_address_is_poisoned(q));
    assert_true(__asan_address_is_poisoned(u1));
    assert_ptr_equal(must_alloc(a, 100, 0), p);
    assert_null(__asan_region_is_poisoned(p, 100));
    llmem_arena_destroy(a);

    /* Across chunks: a rollback poisons later chunks again, the skipped
     * tail of a chunk stays poisoned. */
    a = arena_over(NULL, 64 * KiB);
    unsigned char *c0 = must_alloc(a, 60000, 0);
    llmem_arena_mark m0 = llmem_arena_save(a);
    unsigned char *c1 = must_alloc(a, 60000, 0);
    unsigned char *c2 = must_alloc(a, 60000, 0);
    assert_true(__asan_address_is_poisoned(c0 + 60000)); /* skipped tail */
    assert_true(__asan_address_is_poisoned(c0 + 64 * KiB - 1));
    assert_null(__asan_region_is_poisoned(c1, 60000));
    assert_null(__asan_region_is_poisoned(c2, 60000));
    assert_ok(llmem_arena_rollback(a, m0));
    assert_ptr_equal(__asan_region_is_poisoned(c1, 60000), c1);
    assert_ptr_equal(__asan_region_is_poisoned(c2, 60000), c2);
    assert_null(__asan_region_is_poisoned(c0, 60000));
    llmem_arena_destroy(a);

    /* A fixed arena: everything past the cursor is poisoned from create. */
    llmem_arena_options o = llmem_arena_options_default();
    o.capacity_bytes = 4096;
    a = arena_with(&o);
    unsigned char *f = must_alloc(a, 10, 0);
    assert_null(__asan_region_is_poisoned(f, 10));
    assert_true(__asan_address_is_poisoned(f + 10));
    assert_true(__asan_address_is_poisoned(f + 4095));
    llmem_arena_destroy(a);
#else
    skip(); /* needs the ASan build */
#endif
}

static void asan_caller_buffer(void **state)
{
    (void)state;
#ifdef TEST_ASAN
    enum { RAW = 4096, N = 3000 };
    unsigned char *raw = malloc(RAW);
    assert_non_null(raw);
    unsigned char *buf = raw + 5;
    llmem_arena_options o = llmem_arena_options_default();
    o.buffer = buf;
    o.buffer_bytes = N;
    llmem_arena *a = arena_with(&o);
    /* Poisoned from create (except a partial last granule ASan cannot
     * express), the caller's bytes before it untouched. */
    assert_true(__asan_address_is_poisoned(buf));
    assert_true(__asan_address_is_poisoned(buf + N - 16));
    assert_null(__asan_region_is_poisoned(raw, 5));
    unsigned char *p = must_alloc(a, 100, 0);
    assert_null(__asan_region_is_poisoned(p, 100));
    assert_true(__asan_address_is_poisoned(p + 100));
    assert_true(__asan_address_is_poisoned(buf)); /* the padding before p */
    llmem_arena_mark m = llmem_arena_save(a);
    unsigned char *q = must_alloc(a, 500, 0);
    assert_ok(llmem_arena_rollback(a, m));
    assert_true(__asan_address_is_poisoned(q));
    llmem_arena_destroy(a);
    assert_null(__asan_region_is_poisoned(raw, RAW));
    memset(raw, 0, RAW);
    free(raw);
#else
    skip(); /* needs the ASan build */
#endif
}

/* ---- property test against a shadow model --------------------------------
 *
 * The model knows the placement rule from arena.h: an allocation goes at
 * the aligned cursor if it fits the current chunk, else at the start of the
 * first later retained chunk it fits, else at the start of a newly mapped
 * chunk (learnt from the tracking resource). Positions give used bytes;
 * marks, rollback, reset and trim follow the header's contract. */

#define PM_CHUNKS 4096
#define PM_MARKS 64
#define PM_LIVE 4096

typedef struct pm_chunk {
    uintptr_t base;
    size_t size, before;
} pm_chunk;

typedef struct pm_live {
    unsigned char *p;
    size_t size, align;
    unsigned seed;
} pm_live;

typedef struct pm_mark {
    llmem_arena_mark m;
    size_t chunk, off, used, requested, nlive;
} pm_mark;

typedef struct pm_model {
    pm_chunk chunks[PM_CHUNKS];
    size_t nchunks, cur, off;
    size_t used, requested, used_peak, reserved_peak;
    uint64_t allocs, resets, rollbacks, grows, releases, failures;
    pm_live live[PM_LIVE];
    size_t nlive;
    pm_mark marks[PM_MARKS], dead[PM_MARKS];
    size_t nmarks, ndead;
    bool have_stale;
    llmem_arena_mark stale;
} pm_model;

static size_t pm_reserved(const pm_model *md)
{
    size_t r = 0;
    for (size_t i = 0; i < md->nchunks; i++) r += md->chunks[i].size;
    return r;
}

static bool pm_fits(const pm_chunk *c, uintptr_t from, size_t size, size_t align, uintptr_t *at)
{
    uintptr_t p = up(from, align);
    if (p - c->base > c->size || size > c->size - (p - c->base)) return false;
    *at = p;
    return true;
}

static int cmp_live(const void *x, const void *y)
{
    const pm_live *a = x, *b = y;
    return a->p < b->p ? -1 : a->p > b->p;
}

static void pm_check_stats(const pm_model *md, llmem_arena *a, llmem_resource *tr)
{
    llmem_arena_stats s = ast(a);
    llmem_tracking_stats t = test_tracking_stats(tr);
    assert_int_equal(s.used_bytes, md->used);
    assert_int_equal(s.requested_bytes, md->requested);
    assert_int_equal(s.waste_bytes, md->used - md->requested);
    assert_int_equal(s.used_peak_bytes, md->used_peak);
    assert_int_equal(s.allocs_total, md->allocs);
    assert_int_equal(s.resets_total, md->resets);
    assert_int_equal(s.rollbacks_total, md->rollbacks);
    assert_int_equal(s.grows_total, md->grows);
    assert_int_equal(s.releases_total, md->releases);
    assert_int_equal(s.failures_total, md->failures);
    assert_int_equal(s.chunks, md->nchunks);
    assert_int_equal(s.reserved_bytes, pm_reserved(md));
    assert_int_equal(s.reserved_peak_bytes, md->reserved_peak);
    assert_int_equal(t.live_mappings, md->nchunks);
    assert_int_equal(t.live_bytes, pm_reserved(md));
}

/* Every live allocation: aligned, in a chunk in use, owned, no overlap,
 * its bytes intact. */
static void pm_check_live(const pm_model *md, llmem_arena *a)
{
    static pm_live sorted[PM_LIVE];
    static unsigned char ref[4096];
    for (size_t i = 0; i < md->nlive; i++) {
        const pm_live *l = &md->live[i];
        assert_true(is_aligned(l->p, l->align));
        bool in = false;
        for (size_t c = 0; c < md->nchunks && c <= md->cur && !in; c++)
            in = (uintptr_t)l->p >= md->chunks[c].base &&
                 (uintptr_t)l->p + l->size <= md->chunks[c].base + md->chunks[c].size;
        assert_true(in);
        assert_true(llmem_arena_owns(a, l->p));
        assert_true(llmem_arena_owns(a, l->p + l->size - 1));
        memset(ref, (int)(l->seed & 0xff), sizeof ref);
        for (size_t off = 0; off < l->size; off += sizeof ref) {
            size_t n = l->size - off < sizeof ref ? l->size - off : sizeof ref;
            if (memcmp(l->p + off, ref, n) != 0) fail_msg("allocation %p (%zu bytes) was overwritten", (void *)l->p, l->size);
        }
        sorted[i] = *l;
    }
    qsort(sorted, md->nlive, sizeof *sorted, cmp_live);
    for (size_t i = 1; i < md->nlive; i++) assert_true(sorted[i - 1].p + sorted[i - 1].size <= sorted[i].p);
}

static void pm_alloc(pm_model *md, llmem_arena *a, llmem_resource *tr, uint64_t *rs, size_t chunk_bytes)
{
    uint64_t r = test_rng_next(rs);
    size_t size;
    switch (r % 4) {
    case 0: size = 1 + (size_t)(test_rng_next(rs) % 100000); break;
    case 1: size = 1 + (size_t)(test_rng_next(rs) % 4096); break;
    default: size = 1 + (size_t)(test_rng_next(rs) % 256); break;
    }
    size_t align = (r >> 8) % 8 == 0 ? 0 : (size_t)1 << ((r >> 16) % 13);
    size_t eff = align ? align : 64;

    /* Predict. */
    size_t idx = SIZE_MAX;
    uintptr_t at = 0;
    if (md->nchunks && pm_fits(&md->chunks[md->cur], md->chunks[md->cur].base + md->off, size, eff, &at))
        idx = md->cur;
    if (idx == SIZE_MAX)
        for (size_t j = md->nchunks ? md->cur + 1 : 0; j < md->nchunks && idx == SIZE_MAX; j++)
            if (pm_fits(&md->chunks[j], md->chunks[j].base, size, eff, &at)) idx = j;
    uint64_t maps = test_resource_stats(tr).map_calls_total;
    unsigned char *p = must_alloc(a, size, align);
    if (idx == SIZE_MAX) {
        assert_int_equal(test_resource_stats(tr).map_calls_total, maps + 1);
        found_mapping nm = newest_mapping(tr);
        assert_true(nm.size >= chunk_bytes && nm.size >= size);
        assert_true(md->nchunks < PM_CHUNKS);
        pm_chunk *last = md->nchunks ? &md->chunks[md->nchunks - 1] : NULL;
        md->chunks[md->nchunks] = (pm_chunk){(uintptr_t)nm.ptr, nm.size, last ? last->before + last->size : 0};
        idx = md->nchunks++;
        md->grows++;
        assert_true(pm_fits(&md->chunks[idx], md->chunks[idx].base, size, eff, &at));
        size_t res = pm_reserved(md);
        if (res > md->reserved_peak) md->reserved_peak = res;
    } else {
        assert_int_equal(test_resource_stats(tr).map_calls_total, maps);
    }
    if ((uintptr_t)p != at)
        fail_msg("alloc(%zu, %zu) at %p, the model expected %p (chunk %zu)", size, align, (void *)p, (void *)at, idx);
    md->cur = idx;
    md->off = (size_t)(at + size - md->chunks[idx].base);
    md->used = md->chunks[idx].before + md->off;
    if (md->used > md->used_peak) md->used_peak = md->used;
    md->requested += size;
    md->allocs++;
    assert_true(md->nlive < PM_LIVE);
    pm_live *l = &md->live[md->nlive++];
    *l = (pm_live){p, size, eff, (unsigned)(r >> 32)};
    memset(p, (int)(l->seed & 0xff), size);
}

static void pm_rollback(pm_model *md, llmem_arena *a, uint64_t *rs)
{
    if (!md->nmarks) return;
    size_t k = (size_t)(test_rng_next(rs) % md->nmarks);
    pm_mark *mk = &md->marks[k];
    pm_check_live(md, a);
    size_t old_nlive = md->nlive;
    assert_ok(llmem_arena_rollback(a, mk->m));
    md->cur = mk->chunk;
    md->off = mk->off;
    md->used = mk->used;
    md->requested = mk->requested;
    md->nlive = mk->nlive;
    md->rollbacks++;
    for (size_t i = md->nlive; i < old_nlive; i++) assert_false(llmem_arena_owns(a, md->live[i].p));
    for (size_t i = k + 1; i < md->nmarks && md->ndead < PM_MARKS; i++) md->dead[md->ndead++] = md->marks[i];
    md->nmarks = k + 1;
}

/* A mark rolled back past, if still ahead of the cursor, is refused and
 * changes nothing. */
static void pm_dead_rollback(pm_model *md, llmem_arena *a, llmem_resource *tr, uint64_t *rs)
{
    if (!md->ndead) return;
    size_t k = (size_t)(test_rng_next(rs) % md->ndead);
    pm_mark d = md->dead[k];
    md->dead[k] = md->dead[--md->ndead];
    bool ahead = d.chunk > md->cur || (d.chunk == md->cur && d.off > md->off);
    if (!ahead) return; /* overtaken again: a valid position, not modelled */
    assert_fails(llmem_arena_rollback(a, d.m), LLMEM_ESTATE, "ahead");
    pm_check_stats(md, a, tr);
}

static void pm_reset(pm_model *md, llmem_arena *a)
{
    pm_check_live(md, a);
    if (md->nmarks) {
        md->stale = md->marks[md->nmarks - 1].m;
    } else {
        md->stale = llmem_arena_save(a);
    }
    md->have_stale = true;
    llmem_arena_reset(a);
    for (size_t i = 0; i < md->nlive; i++) assert_false(llmem_arena_owns(a, md->live[i].p));
    md->cur = md->off = md->used = md->requested = 0;
    md->nlive = md->nmarks = md->ndead = 0;
    md->resets++;
}

static void pm_trim(pm_model *md, llmem_arena *a)
{
    size_t want = 0;
    while (md->nchunks > md->cur + 1) {
        want += md->chunks[--md->nchunks].size;
        md->releases++;
    }
    if (md->used == 0 && md->nchunks == 1) {
        want += md->chunks[0].size;
        md->nchunks = 0;
        md->cur = md->off = 0;
        md->releases++;
    }
    assert_int_equal(llmem_arena_trim(a), want);
}

static void property_random_sequences(void **state)
{
    (void)state;
    static pm_model md;
    for (uint64_t seed = 1; seed <= 8; seed++) {
        memset(&md, 0, sizeof md);
        uint64_t rs = seed * 0x9E3779B97F4A7C15ull;
        size_t chunk_bytes = (64 * KiB) << (seed % 3);
        llmem_resource *tr = new_tracking();
        llmem_arena *a = arena_over(tr, chunk_bytes);
        for (int op = 0; op < 1500; op++) {
            uint64_t r = test_rng_next(&rs) % 100;
            if (r < 55) {
                pm_alloc(&md, a, tr, &rs, chunk_bytes);
            } else if (r < 67) {
                if (md.nmarks < PM_MARKS)
                    md.marks[md.nmarks++] = (pm_mark){llmem_arena_save(a), md.cur, md.off, md.used, md.requested,
                                                      md.nlive};
            } else if (r < 79) {
                pm_rollback(&md, a, &rs);
            } else if (r < 84) {
                pm_dead_rollback(&md, a, tr, &rs);
            } else if (r < 88) {
                pm_reset(&md, a);
            } else if (r < 94) {
                pm_trim(&md, a);
            } else if (r < 97) {
                if (md.have_stale) assert_fails(llmem_arena_rollback(a, md.stale), LLMEM_ESTATE, "reset");
            } else {
                /* A refused allocation changes nothing but the failure count. */
                assert_alloc_fails(a, (r & 1) ? 0 : SIZE_MAX, 0, (r & 1) ? LLMEM_EINVAL : LLMEM_EOVERFLOW, "arena");
                md.failures++;
            }
            pm_check_stats(&md, a, tr);
            if (op % 16 == 0) pm_check_live(&md, a);
        }
        pm_check_live(&md, a);
        llmem_arena_destroy(a);
        end_tracking(tr);
    }
}

/* ---- stats schema -------------------------------------------------------- */

static void stats_schema_and_json(void **state)
{
    (void)state;
    const llmem_stats_schema *sc = llmem_arena_stats_schema();
    assert_non_null(sc);
    assert_string_equal(sc->name, "arena");
    assert_int_equal(sc->struct_size, sizeof(llmem_arena_stats));
    /* Every uint64_t after struct_size is described, once, in order. */
    size_t nfields = (sizeof(llmem_arena_stats) - offsetof(llmem_arena_stats, used_bytes)) / sizeof(uint64_t);
    assert_int_equal(sc->field_count, nfields);
    for (size_t i = 0; i < sc->field_count; i++) {
        const llmem_stat_field *f = &sc->fields[i];
        assert_int_equal(f->offset, offsetof(llmem_arena_stats, used_bytes) + i * sizeof(uint64_t));
        assert_int_equal(f->type, LLMEM_VALUE_U64);
        size_t n = strlen(f->name);
        bool total = n > 6 && strcmp(f->name + n - 6, "_total") == 0;
        assert_int_equal(f->kind == LLMEM_METRIC_COUNTER, total);
        assert_true(f->help && f->help[0]);
    }

    llmem_arena *a = arena_over(NULL, 64 * KiB);
    must_alloc(a, 100, 0);
    llmem_arena_mark m = llmem_arena_save(a);
    must_alloc(a, 70000, 0);
    assert_ok(llmem_arena_rollback(a, m));
    must_alloc(a, 3, 8);
    llmem_arena_reset(a);
    must_alloc(a, 50, 0);
    assert_null(llmem_arena_alloc(a, 0, 0, NULL));
    llmem_arena_stats s = ast(a);
    assert_true(s.allocs_total == 4 && s.rollbacks_total == 1 && s.resets_total == 1 && s.failures_total == 1);

    llmem_label lb[] = {{"arena", "req"}};
    char buf[2048];
    size_t len = 0;
    assert_ok(llmem_stats_to_json(sc, &s, lb, 1, buf, sizeof buf, &len));
    assert_int_equal(len, strlen(buf));
    const char *head = "{\"type\":\"arena\",\"labels\":{\"arena\":\"req\"},";
    assert_true(strncmp(buf, head, strlen(head)) == 0);
    for (size_t i = 0; i < sc->field_count; i++) {
        uint64_t v;
        memcpy(&v, (const char *)&s + sc->fields[i].offset, sizeof v);
        char needle[96];
        snprintf(needle, sizeof needle, "\"%s\":%llu%c", sc->fields[i].name, (unsigned long long)v,
                 i + 1 == sc->field_count ? '}' : ',');
        if (!strstr(buf, needle)) fail_msg("%s not in %s", needle, buf);
    }
    /* A caller with an older, shorter struct gets only that prefix. */
    llmem_arena_stats old;
    memset(&old, 0xAB, sizeof old);
    old.struct_size = offsetof(llmem_arena_stats, reserved_bytes);
    assert_ok(llmem_arena_get_stats(a, &old));
    assert_int_equal(old.struct_size, offsetof(llmem_arena_stats, reserved_bytes));
    assert_int_equal(old.used_bytes, s.used_bytes);
    assert_int_equal(old.requested_bytes, s.requested_bytes);
    const unsigned char *tail = (const unsigned char *)&old + offsetof(llmem_arena_stats, reserved_bytes);
    for (size_t i = 0; i < sizeof old - offsetof(llmem_arena_stats, reserved_bytes); i++)
        assert_int_equal(tail[i], 0xAB);
    llmem_arena_destroy(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(defaults_from_null_options),
        cmocka_unit_test(explicit_alignments_are_honoured),
        cmocka_unit_test(waste_counts_alignment_padding),
        cmocka_unit_test(rollback_frees_exactly_what_came_after),
        cmocka_unit_test(nested_marks_and_marks_rolled_back_past),
        cmocka_unit_test(stale_and_foreign_marks_are_refused),
        cmocka_unit_test(marks_of_an_empty_arena),
        cmocka_unit_test(marks_across_trim),
        cmocka_unit_test(reset_keeps_chunks),
        cmocka_unit_test(growth_maps_chunks_the_resource_sees),
        cmocka_unit_test(skip_ahead_reuses_retained_chunks_in_order),
        cmocka_unit_test(fixed_capacity_arena),
        cmocka_unit_test(caller_buffer_arena),
        cmocka_unit_test(max_bytes_caps_growth),
        cmocka_unit_test(resource_failure_changes_nothing),
        cmocka_unit_test(trim_releases_retained_chunks),
        cmocka_unit_test(trim_of_fixed_arenas_releases_nothing),
        cmocka_unit_test(owns_only_live_allocations),
        cmocka_unit_test(bad_create_options),
        cmocka_unit_test(bad_alloc_changes_nothing),
        cmocka_unit_test(null_handles_are_no_ops),
        cmocka_unit_test(device_arena_over_sim),
        cmocka_unit_test(asan_poisoning),
        cmocka_unit_test(asan_caller_buffer),
        cmocka_unit_test(property_random_sequences),
        cmocka_unit_test(stats_schema_and_json),
    };
    return cmocka_run_group_tests(tests, test_quiet_logs, NULL);
}
