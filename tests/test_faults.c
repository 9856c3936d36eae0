/*
 * test_faults.c - the fault-injection campaign: every map call the arena
 * and the fixed pool make is failed at least once, and each time the pools
 * report the right status, lose no byte of what they handed out, stay
 * usable, and leak nothing.
 *
 * Stack: pool -> fault -> tracking -> os (and the same over sim-device,
 * where every byte goes in and out through copy()). For each scenario:
 *   1. run it with the fault disarmed (ops = MAP) and count its map calls, n;
 *   2. for k = 1..n arm fail_nth = k (one failure) and run it again: the
 *      failure surfaces as a NULL allocation (or a failed create) with
 *      LLMEM_ENOMEM and an "injected" message, the same request made again
 *      succeeds, every block keeps its pattern, and after destroy the
 *      tracking resource holds nothing;
 *   3. for k = 1..n arm fail_nth = k, fail_count = UINT64_MAX (every map
 *      from the kth on fails): allocations fail cleanly, frees and what
 *      needs no new memory keep working, destroy leaks nothing.
 * The fixed pool answers an out-of-memory chunk by retrying with halves
 * down to one block (fixed.h), and a thread-safe pool's refill keeps the
 * blocks it got before a failure: such a failure is absorbed (the
 * allocation succeeds, with a smaller chunk). Configurations with one-block
 * chunks and single-block refills cannot absorb, and there every injected
 * failure must surface.
 */
#include "test_util.h"
#include "support/cases.h"

#define KiB ((size_t)1 << 10)

/* ---- the stack and what one run observed --------------------------------- */

typedef struct ctx {
    test_fault_stack r; /* fault(tracking(os or sim)) */
    bool device;
    bool forever;      /* armed with fail_count = UINT64_MAX */
    bool strict;       /* the configuration cannot absorb a failure */
    unsigned surfaced; /* requests (alloc or create) that failed with the injected ENOMEM */
    unsigned absorbed; /* requests that succeeded although a map under them was failed */
    unsigned nulls;    /* NULL allocations, retries included (the pool's failures_total) */
    unsigned seed;     /* pattern seed of the next block */
} ctx;

static void ctx_init(ctx *c, bool device)
{
    memset(c, 0, sizeof *c);
    c->device = device;
    test_fault_stack_open(&c->r, device ? test_sim_new((size_t)256 << 20) : NULL);
}

static void ctx_fini(ctx *c)
{
    test_fault_stack_close(&c->r);
}

static llmem_fault_stats fstats(const ctx *c) { return test_fault_stats(c->r.fault); }

static uint64_t injected(const ctx *c) { return fstats(c).injected_total; }

static llmem_tracking_stats tstats(const ctx *c) { return test_tracking_stats(c->r.track); }

/* After a pool is destroyed: nothing mapped anywhere, nothing refused. */
static void assert_clean(const ctx *c)
{
    test_tracking_expect_clean(c->r.track); /* the pools never made an invalid call */
    llmem_resource_stats rs = test_resource_stats(c->r.base);
    assert_int_equal(rs.mapped_bytes, 0);
    assert_int_equal(rs.mappings, 0);
    assert_int_equal(rs.map_calls_total, rs.unmap_calls_total);
    if (c->device) {
        test_sim_expect_clean(c->r.base);
    }
}

/* ---- patterns, written and read through the resource on a device --------- */

static unsigned char iobuf[512 * 1024];

static unsigned char pat(unsigned seed, size_t i) { return (unsigned char)(seed * 151u + i * 13u + (i >> 9) + 1u); }

static void put_pattern(const ctx *c, void *p, size_t n, unsigned seed)
{
    unsigned char *dst = c->device ? iobuf : p;
    assert_true(n <= sizeof iobuf);
    for (size_t i = 0; i < n; i++) dst[i] = pat(seed, i);
    if (c->device) assert_ok(llmem_resource_copy(c->r.fault, p, iobuf, n));
}

static void check_pattern(const ctx *c, const void *p, size_t n, unsigned seed)
{
    const unsigned char *src = p;
    if (c->device) {
        memset(iobuf, 0, n);
        assert_ok(llmem_resource_copy(c->r.fault, iobuf, p, n));
        src = iobuf;
    }
    for (size_t i = 0; i < n; i++)
        if (src[i] != pat(seed, i)) fail_msg("block %p (%zu bytes, seed %u) damaged at byte %zu", p, n, seed, i);
}

typedef struct blk {
    void *p;
    size_t n;
    unsigned seed;
} blk;

#define MAXB 512
typedef struct blocks {
    blk v[MAXB];
    size_t n;
} blocks;

static void keep(ctx *c, blocks *b, void *p, size_t n)
{
    assert_true(b->n < MAXB);
    unsigned seed = c->seed++;
    put_pattern(c, p, n, seed);
    b->v[b->n++] = (blk){p, n, seed};
}

static void check_all(const ctx *c, const blocks *b)
{
    for (size_t i = 0; i < b->n; i++) check_pattern(c, b->v[i].p, b->v[i].n, b->v[i].seed);
}

/* A request failed: it must be the injected failure. */
static void assert_injected_enomem(llmem_status st)
{
    if (st != LLMEM_ENOMEM)
        fail_msg("failed with %s, expected LLMEM_ENOMEM (%s)", llmem_status_name(st), llmem_error_message());
    assert_error_mentions("injected");
}

/* ---- scenario (a): an arena serving requests ----------------------------- */

/* One allocation. The arena has no fallback, so a map failed under it fails
 * the allocation, which changes nothing: the same request made again
 * succeeds after a single failure and fails again when failing forever. */
static void *arena_get(ctx *c, llmem_arena *a, size_t size, size_t align)
{
    uint64_t inj0 = injected(c);
    llmem_status st = LLMEM_EDEVICE;
    void *p = llmem_arena_alloc(a, size, align, &st);
    uint64_t inj1 = injected(c);
    if (p) {
        assert_int_equal(st, LLMEM_OK);
        assert_int_equal(inj1, inj0);
    } else {
        c->nulls++;
        assert_injected_enomem(st);
        assert_int_equal(inj1, inj0 + 1);
        c->surfaced++;
        p = llmem_arena_alloc(a, size, align, &st);
        if (c->forever) {
            assert_null(p);
            assert_injected_enomem(st);
            c->nulls++;
            return NULL;
        }
        if (!p) fail_msg("the arena did not recover after one injected failure: %s", llmem_error_message());
        assert_int_equal(st, LLMEM_OK);
    }
    size_t want = align ? align : c->device ? 256 : 64;
    assert_int_equal((uintptr_t)p % want, 0);
    assert_true(llmem_arena_owns(a, p));
    return p;
}

static void arena_take(ctx *c, llmem_arena *a, blocks *b, size_t size, size_t align)
{
    void *p = arena_get(c, a, size, align);
    if (p) keep(c, b, p, size);
}

static void scenario_arena(ctx *c, const void *cfg)
{
    (void)cfg;
    static const size_t sizes[] = {100, 4000, 30000, 64, 20000, 50000, 7, 12345, 60000, 1, 40000, 3000, 900, 25000};
    static const size_t aligns[] = {0, 0, 4096, 0, 128, 0, 0};
    const size_t ns = sizeof sizes / sizeof sizes[0], na = sizeof aligns / sizeof aligns[0];
    llmem_arena_options o = llmem_arena_options_default();
    o.name = "req-arena";
    o.resource = c->r.fault;
    o.chunk_bytes = 64 * KiB;
    llmem_arena *a;
    assert_ok(llmem_arena_create(&o, &a)); /* maps nothing yet */
    blocks *b = calloc(1, sizeof *b);
    assert_non_null(b);
    size_t x = 0;
    for (int req = 0; req < 5; req++) {
        b->n = 0;
        /* The prompt: what lives for the whole request. */
        for (int i = 0; i < 4; i++, x++) arena_take(c, a, b, sizes[x % ns], aligns[x % na]);
        llmem_arena_mark m = llmem_arena_save(a);
        size_t at_mark = b->n;
        /* Per-layer temporaries, one of them bigger than a chunk. */
        for (int i = 0; i < 6; i++, x++) arena_take(c, a, b, sizes[x % ns], aligns[x % na]);
        if (req == 1 || req == 3) arena_take(c, a, b, 200 * KiB + 8, 0);
        check_all(c, b);
        assert_ok(llmem_arena_rollback(a, m));
        b->n = at_mark;
        check_all(c, b); /* what came before the mark survived the rollback */
        for (int i = 0; i < 5; i++, x++) arena_take(c, a, b, sizes[x % ns], aligns[x % na]);
        check_all(c, b);
        /* Everything the arena holds is mapped, and nothing else. */
        llmem_arena_stats as = test_arena_stats(a);
        assert_int_equal(tstats(c).live_bytes, as.reserved_bytes);
        assert_int_equal(tstats(c).live_mappings, as.chunks);
        assert_int_equal(as.failures_total, c->nulls);
        llmem_arena_reset(a);
        if (req == 2) {
            /* Between requests: give everything back, and grow again after. */
            size_t held = (size_t)test_arena_stats(a).reserved_bytes;
            assert_int_equal(llmem_arena_trim(a), held);
            assert_int_equal(test_arena_stats(a).reserved_bytes, 0);
            assert_int_equal(tstats(c).live_mappings, 0);
        }
    }
    free(b);
    llmem_arena_destroy(a);
}

/* ---- scenario (b): a fixed pool growing through several chunks ----------- */

typedef struct fixed_cfg {
    const char *name;
    size_t block, chunk, max_chunk, initial, cache;
    bool thread_safe, checked;
    bool strict;  /* one-block chunks and refills: every failure surfaces */
    size_t first; /* blocks allocated in the first round */
} fixed_cfg;

/* One block. A NULL must be the injected ENOMEM, and the same request made
 * again succeeds (one failure) or fails again (failing forever). A block
 * handed out although a map under it was failed is an absorbed failure. */
static void *fixed_get(ctx *c, llmem_fixed *p)
{
    uint64_t inj0 = injected(c);
    llmem_status st = LLMEM_EDEVICE;
    void *b = llmem_fixed_alloc(p, &st);
    uint64_t inj1 = injected(c);
    if (b) {
        assert_int_equal(st, LLMEM_OK);
        if (inj1 != inj0) {
            if (c->strict) fail_msg("a failure was absorbed by a pool that cannot absorb one");
            c->absorbed++;
        }
    } else {
        c->nulls++;
        assert_injected_enomem(st);
        assert_true(inj1 > inj0);
        c->surfaced++;
        b = llmem_fixed_alloc(p, &st);
        if (c->forever) {
            assert_null(b);
            assert_injected_enomem(st);
            c->nulls++;
            return NULL;
        }
        if (!b) fail_msg("the pool did not recover after one injected failure: %s", llmem_error_message());
        assert_int_equal(st, LLMEM_OK);
    }
    assert_true(llmem_fixed_owns(p, b));
    return b;
}

static llmem_fixed *fixed_open(ctx *c, const fixed_cfg *f)
{
    llmem_fixed_options o = llmem_fixed_options_default();
    o.name = f->name;
    o.resource = c->r.fault;
    o.block_size = f->block;
    o.chunk_bytes = f->chunk;
    o.max_chunk_bytes = f->max_chunk;
    o.initial_blocks = f->initial;
    o.thread_safe = f->thread_safe;
    o.checked = f->checked;
    o.cache_blocks = f->cache;
    llmem_fixed *p = (llmem_fixed *)1;
    uint64_t inj0 = injected(c);
    llmem_status st = llmem_fixed_create(&o, &p);
    uint64_t inj1 = injected(c);
    if (st == LLMEM_OK) {
        if (inj1 != inj0) {
            if (c->strict) fail_msg("create absorbed a failure in a pool that cannot absorb one");
            c->absorbed++;
        }
        return p;
    }
    assert_null(p);
    assert_injected_enomem(st);
    assert_true(f->initial > 0);
    assert_true(inj1 > inj0);
    c->surfaced++;
    assert_clean(c); /* a failed create leaves nothing behind */
    st = llmem_fixed_create(&o, &p);
    if (c->forever) {
        assert_injected_enomem(st);
        assert_null(p);
        return NULL;
    }
    assert_ok(st);
    return p;
}

static void fixed_put(ctx *c, llmem_fixed *p, blocks *b, size_t i)
{
    check_pattern(c, b->v[i].p, b->v[i].n, b->v[i].seed);
    assert_ok(llmem_fixed_free(p, b->v[i].p));
    b->v[i] = b->v[--b->n];
}

static void scenario_fixed(ctx *c, const void *cfg)
{
    const fixed_cfg *f = cfg;
    c->strict = f->strict;
    llmem_fixed *p = fixed_open(c, f);
    if (!p) return; /* failing forever from the create on */
    blocks *b = calloc(1, sizeof *b);
    assert_non_null(b);
    /* Grow through several chunks. */
    for (size_t i = 0; i < f->first; i++) {
        void *x = fixed_get(c, p);
        if (x) keep(c, b, x, f->block);
    }
    check_all(c, b);
    /* Free about half of them (swap-removal skips every block moved down)... */
    for (size_t i = 0; i < b->n; i++) fixed_put(c, p, b, i);
    /* ...and allocate more than that again: the free blocks first, then new chunks. */
    for (size_t i = 0; i < f->first / 2 + f->first / 4; i++) {
        void *x = fixed_get(c, p);
        if (x) keep(c, b, x, f->block);
    }
    check_all(c, b);
    /* No two blocks overlap. */
    for (size_t i = 0; i < b->n; i++)
        for (size_t j = i + 1; j < b->n; j++) {
            uintptr_t u = (uintptr_t)b->v[i].p, v = (uintptr_t)b->v[j].p;
            assert_true(u + f->block <= v || v + f->block <= u);
        }
    llmem_fixed_stats fs;
    memset(&fs, 0, sizeof fs);
    assert_ok(llmem_fixed_get_stats(p, &fs));
    assert_int_equal(fs.failures_total, c->nulls);
    assert_int_equal(tstats(c).live_bytes, fs.reserved_bytes);
    assert_int_equal(tstats(c).live_mappings, fs.chunks);
    if (!f->thread_safe) assert_int_equal(fs.blocks_in_use, b->n);
    /* Free a third, destroy with the rest still handed out. */
    for (size_t i = 0; i < b->n; i += 2) fixed_put(c, p, b, i);
    check_all(c, b);
    free(b);
    llmem_fixed_destroy(p);
}

/* ---- the campaign -------------------------------------------------------- */

typedef void (*scenario_fn)(ctx *c, const void *cfg);

static void arm(ctx *c, uint64_t nth, uint64_t count)
{
    test_fault_arm(c->r.fault, nth, count, LLMEM_FAULT_OP_MAP);
    c->forever = count == UINT64_MAX;
    c->surfaced = c->absorbed = c->nulls = 0;
    c->strict = false;
}

static void campaign(bool device, scenario_fn run, const void *cfg, const char *what)
{
    ctx c;
    ctx_init(&c, device);
    /* 1. Count the map calls. */
    arm(&c, 0, 1);
    run(&c, cfg);
    llmem_fault_stats fs = fstats(&c);
    uint64_t n = fs.calls_total;
    assert_int_equal(fs.injected_total, 0);
    assert_int_equal(c.surfaced + c.absorbed + c.nulls, 0);
    if (n < 3) fail_msg("%s: only %llu map calls, the scenario is too small", what, (unsigned long long)n);
    assert_clean(&c);

    /* 2. Fail each of them once. */
    uint64_t exercised = 0, surfaced = 0;
    for (uint64_t k = 1; k <= n; k++) {
        arm(&c, k, 1);
        run(&c, cfg);
        fs = fstats(&c);
        if (fs.calls_total < k) fail_msg("%s k=%llu: only %llu calls", what, (unsigned long long)k,
                                         (unsigned long long)fs.calls_total);
        assert_int_equal(fs.injected_total, 1);
        if (c.surfaced + c.absorbed == 1) exercised++;
        surfaced += c.surfaced;
        if (c.strict) assert_int_equal(c.surfaced, 1);
        assert_clean(&c);
    }
    if (exercised != n)
        fail_msg("%s: %llu of %llu map calls were failed and observed", what, (unsigned long long)exercised,
                 (unsigned long long)n);

    /* 3. Fail every map from the kth on. */
    for (uint64_t k = 1; k <= n; k++) {
        arm(&c, k, UINT64_MAX);
        run(&c, cfg);
        fs = fstats(&c);
        assert_true(fs.injected_total >= 1);
        assert_true(c.surfaced + c.absorbed >= 1);
        if (c.strict) assert_true(c.surfaced >= 1);
        assert_clean(&c);
    }
    print_message("%s over %s: %llu map calls, each failed once (%llu surfaced as ENOMEM, %llu absorbed) and "
                  "forever from there\n",
                  what, device ? "sim-device" : "os", (unsigned long long)n, (unsigned long long)surfaced,
                  (unsigned long long)(n - surfaced));
    ctx_fini(&c);
}

/* ---- the tests ----------------------------------------------------------- */

TEST_CASE(arena_campaign_os, campaign(false, scenario_arena, NULL, "arena"))
TEST_CASE(arena_campaign_sim, campaign(true, scenario_arena, NULL, "arena"))

/* Blocks of 3000 bytes in chunks doubling from 16 KiB: ~6 chunks. */
static const fixed_cfg cfg_plain = {"plain", 3000, 16 * KiB, 0, 0, 0, false, false, false, 160};
static const fixed_cfg cfg_checked = {"checked", 3000, 16 * KiB, 0, 0, 0, false, true, false, 160};
static const fixed_cfg cfg_ts = {"thread-safe", 3000, 16 * KiB, 0, 0, 0, true, false, false, 160};
static const fixed_cfg cfg_initial = {"initial", 3000, 16 * KiB, 0, 40, 0, false, false, false, 160};
/* One block per chunk, one per refill: nothing to absorb a failure with. */
static const fixed_cfg cfg_strict = {"strict", 4096, 4096, 4096, 1, 0, false, false, true, 24};
static const fixed_cfg cfg_strict_ts = {"strict-ts", 4096, 4096, 4096, 1, 2, true, true, true, 24};

#define FIXED_TEST(fname, cfg)                                                           \
    static void fname##_os(void **state)                                                 \
    {                                                                                    \
        (void)state;                                                                     \
        campaign(false, scenario_fixed, &cfg, "fixed " #fname);                          \
    }                                                                                    \
    static void fname##_sim(void **state)                                                \
    {                                                                                    \
        (void)state;                                                                     \
        campaign(true, scenario_fixed, &cfg, "fixed " #fname);                           \
    }

FIXED_TEST(fixed_plain, cfg_plain)
FIXED_TEST(fixed_checked, cfg_checked)
FIXED_TEST(fixed_thread_safe, cfg_ts)
FIXED_TEST(fixed_initial_blocks, cfg_initial)
FIXED_TEST(fixed_one_block_chunks, cfg_strict)
FIXED_TEST(fixed_one_block_chunks_thread_safe, cfg_strict_ts)

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(arena_campaign_os),
        cmocka_unit_test(arena_campaign_sim),
        cmocka_unit_test(fixed_plain_os),
        cmocka_unit_test(fixed_plain_sim),
        cmocka_unit_test(fixed_checked_os),
        cmocka_unit_test(fixed_checked_sim),
        cmocka_unit_test(fixed_thread_safe_os),
        cmocka_unit_test(fixed_thread_safe_sim),
        cmocka_unit_test(fixed_initial_blocks_os),
        cmocka_unit_test(fixed_initial_blocks_sim),
        cmocka_unit_test(fixed_one_block_chunks_os),
        cmocka_unit_test(fixed_one_block_chunks_sim),
        cmocka_unit_test(fixed_one_block_chunks_thread_safe_os),
        cmocka_unit_test(fixed_one_block_chunks_thread_safe_sim),
    };
    return cmocka_run_group_tests(tests, test_quiet_logs, NULL);
}
