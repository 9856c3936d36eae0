/*
 * test_controller.c - the stage-aware controller, on a fake clock: a
 * reserve before prefill makes the step's allocations call no resource;
 * the predictor sizes that reserve; an idle pool shrinks after the decay
 * and not before, keeping live blocks intact; a load hovering around the
 * high watermark grows a few geometric, capped steps and never shrinks in
 * decode; an idle, fragmented pool of handles is compacted, released and
 * its contents kept; the event ring, its JSON lines and the stats schema;
 * bad input; no heap growth from on_stage.
 */
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#include <malloc.h>
#endif

#include <math.h>

#include "test_util.h"
#include "support/cases.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define MS ((uint64_t)1000000)
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

typedef struct fake_clock {
    uint64_t ns;
} fake_clock;

static uint64_t fake_now(void *ctx) { return ((fake_clock *)ctx)->ns; }

/* A pool over a tracking resource: superblocks of sb bytes, manual purge
 * and a long decay, so nothing changes under the test but what it does. */
static llmem_pool *tracked_pool(llmem_resource **res, size_t sb)
{
    assert_ok(llmem_tracking_resource_create(llmem_resource_default(), res));
    llmem_pool_options o = llmem_pool_options_default();
    o.resource = *res;
    o.purge = LLMEM_POOL_PURGE_MANUAL;
    o.decay_ms = 60000;
    o.first_superblock_bytes = sb;
    o.max_superblock_bytes = sb;
    llmem_pool *p;
    assert_ok(llmem_pool_create(&o, &p));
    return p;
}

static void release_pool(llmem_pool *p, llmem_resource *r)
{
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
    assert_int_equal(test_tracking_stats(r).live_mappings, 0);
    llmem_resource_destroy(r);
}

static llmem_controller_options ctl_options(llmem_pool *p, fake_clock *clk)
{
    llmem_controller_options o = llmem_controller_options_default();
    o.pool = p;
    o.clock = fake_now;
    o.clock_ctx = clk;
    return o;
}

/* A controller case: a tracked pool of 1 MiB superblocks (r, p), a fake
 * clock starting at start_ns (clk) and the options of a controller on
 * both (o) for the body below the macro, which makes and destroys its
 * controller; after it, the pool is checked and released (nothing left
 * mapped). */
#define CONTROLLER_CASE(name, start_ns)                                                          \
    static void name##_on(llmem_resource *r, llmem_pool *p, fake_clock *clk, llmem_controller_options *o); \
    static void name(void **state)                                                               \
    {                                                                                            \
        (void)state;                                                                             \
        llmem_resource *r;                                                                       \
        llmem_pool *p = tracked_pool(&r, MIB);                                                   \
        fake_clock clk = {start_ns};                                                             \
        llmem_controller_options o = ctl_options(p, &clk);                                       \
        name##_on(r, p, &clk, &o);                                                               \
        release_pool(p, r);                                                                      \
    }                                                                                            \
    static void name##_on(__attribute__((unused)) llmem_resource *r, __attribute__((unused)) llmem_pool *p, \
                          __attribute__((unused)) fake_clock *clk, llmem_controller_options *o)

static llmem_controller *make_ctl(const llmem_controller_options *o)
{
    llmem_controller *c;
    assert_ok(llmem_controller_create(o, &c));
    return c;
}

static void stage(llmem_controller *c, llmem_stage s, uint32_t batch, uint64_t tokens)
{
    llmem_stage_event ev = {s, batch, tokens, 0};
    llmem_controller_on_stage(c, &ev);
}

static llmem_controller_stats cstats(const llmem_controller *c)
{
    llmem_controller_stats s = {0};
    assert_ok(llmem_controller_get_stats(c, &s));
    return s;
}

static uint64_t resource_calls(const llmem_resource *r)
{
    llmem_resource_stats s = test_resource_stats(r);
    return s.map_calls_total + s.unmap_calls_total + s.commit_calls_total + s.decommit_calls_total;
}

/* The events of one action (up to cap of them, oldest first); returns how
 * many there are. */
static size_t events_of(const llmem_controller *c, llmem_controller_action a, llmem_controller_event *out, size_t cap)
{
    static llmem_controller_event all[4096];
    size_t n = llmem_controller_events(c, all, ARRAY_LEN(all)), k = 0;
    for (size_t i = 0; i < n; i++)
        if (all[i].action == a) {
            if (k < cap) out[k] = all[i];
            k++;
        }
    return k;
}

static void fill(unsigned char *p, size_t n, unsigned tag)
{
    for (size_t i = 0; i < n; i += 64) p[i] = (unsigned char)(tag + i / 64);
    p[n - 1] = (unsigned char)tag;
}

static bool intact(const unsigned char *p, size_t n, unsigned tag)
{
    for (size_t i = 0; i < n; i += 64)
        if (p[i] != (unsigned char)(tag + i / 64)) return false;
    return p[n - 1] == (unsigned char)tag;
}

/* ---- 1. reserve before prefill -------------------------------------------------- */

CONTROLLER_CASE(reserve_before_prefill, 5 * MS)
{
    o->bytes_per_token_hint = 64 * KIB;
    llmem_controller *c = make_ctl(o);
    stage(c, LLMEM_STAGE_LOAD, 0, 0);
    stage(c, LLMEM_STAGE_IDLE, 0, 0);
    uint64_t calls0 = resource_calls(r);

    clk->ns += MS;
    stage(c, LLMEM_STAGE_PREFILL, 2, 512);
    uint64_t asked = (uint64_t)ceil(512.0 * 64 * KIB * 1.2);
    llmem_controller_event ev[4];
    assert_int_equal(events_of(c, LLMEM_CONTROLLER_RESERVE, ev, 4), 1);
    assert_int_equal(ev[0].detail, asked);
    assert_int_equal(ev[0].stage, LLMEM_STAGE_PREFILL);
    assert_int_equal(ev[0].time_ns, 6 * MS);
    assert_int_equal(ev[0].bytes_before, 0);
    assert_int_equal(ev[0].bytes_after, test_pool_stats(p).committed_bytes);
    assert_true(ev[0].bytes_after >= asked);
    assert_non_null(ev[0].reason);
    assert_true(resource_calls(r) > calls0); /* the reserve paid for it */
    llmem_controller_stats cs = cstats(c);
    assert_int_equal(cs.reserves_total, 1);
    assert_int_equal(cs.bytes_reserved_ahead_total, ev[0].bytes_after);
    assert_int_equal(cs.stage, LLMEM_STAGE_PREFILL);
    assert_int_equal(cs.failures_total, 0);
    /* The step is counted, once. */
    assert_int_equal(cs.prefill_steps_total, 1);
    assert_int_equal(cs.stage_changes_total, 3); /* load, idle, prefill */

    /* The step: the predicted bytes (tokens x hint) in blocks, and some
     * small objects, with no resource call. */
    uint64_t calls = resource_calls(r);
    llmem_resource_stats before = test_resource_stats(r);
    void *blocks[512];
    for (int i = 0; i < 512; i++) {
        assert_non_null(blocks[i] = llmem_pool_alloc(p, 64 * KIB, NULL));
        memset(blocks[i], i, 64 * KIB);
    }
    void *small[64];
    for (int i = 0; i < 64; i++) assert_non_null(small[i] = llmem_pool_alloc(p, 200, NULL));
    llmem_resource_stats after = test_resource_stats(r);
    assert_int_equal(after.map_calls_total, before.map_calls_total);
    assert_int_equal(after.commit_calls_total, before.commit_calls_total);
    assert_int_equal(resource_calls(r), calls);

    for (int i = 0; i < 512; i++) assert_ok(llmem_pool_free(p, blocks[i]));
    for (int i = 0; i < 64; i++) assert_ok(llmem_pool_free(p, small[i]));
    llmem_controller_destroy(c);
}

/* Without a predictor or a hint, a prefill reserves nothing. */
CONTROLLER_CASE(no_hint_no_reserve, 0)
{
    llmem_controller *c = make_ctl(o);
    stage(c, LLMEM_STAGE_PREFILL, 4, 4096);
    assert_int_equal(cstats(c).reserves_total, 0);
    assert_int_equal(events_of(c, LLMEM_CONTROLLER_STAGE, NULL, 0), 1);
    assert_int_equal(resource_calls(r), 0);
    assert_int_equal(cstats(c).prefill_steps_total, 1);
    llmem_controller_destroy(c);
}

/* A predictor of stories260k's shape, 4-byte KV elements. */
static llmem_predictor *stories_predictor(void)
{
    llmem_predictor_options po = llmem_predictor_options_default();
    assert_ok(llmem_shape_preset("stories260k", &po.shape));
    po.kv_elem_bytes = 4;
    llmem_predictor *pr;
    assert_ok(llmem_predictor_create(&po, &pr));
    return pr;
}

/* ---- 2. the predictor sizes the reserve ------------------------------------------ */

CONTROLLER_CASE(predictor_sizes_reserve, 0)
{
    llmem_predictor *pr = stories_predictor();
    o->predictor = pr;
    o->bytes_per_token_hint = 1; /* the predictor wins */
    o->safety_factor = 1.5;
    llmem_controller *c = make_ctl(o);

    static const struct {
        uint32_t batch;
        uint64_t tokens;
        uint32_t per_seq;
    } steps[] = {{2, 512, 256}, {3, 100, 34}, {0, 40, 40}};
    for (size_t i = 0; i < ARRAY_LEN(steps); i++) {
        llmem_prediction want;
        assert_ok(llmem_predictor_predict(pr, LLMEM_STAGE_PREFILL, steps[i].batch ? steps[i].batch : 1,
                                          steps[i].per_seq, 0, &want));
        /* The predictor's safety factor is in its reserve already: the
         * controller's (1.5 here) is not applied on top. */
        assert_int_equal(want.corrected_reserve_bytes, want.reserve_bytes); /* no observations yet */
        uint64_t asked = want.reserve_bytes;
        uint64_t committed0 = test_pool_stats(p).committed_bytes;
        stage(c, LLMEM_STAGE_PREFILL, steps[i].batch, steps[i].tokens);
        llmem_controller_event ev[8];
        size_t n = events_of(c, LLMEM_CONTROLLER_RESERVE, ev, 8);
        assert_int_equal(n, i + 1);
        assert_int_equal(ev[i].detail, asked);
        assert_int_equal(ev[i].bytes_before, committed0);
        /* A free run of the asked bytes now exists: committed covers it,
         * in whole superblocks (1 MiB here, or one of its own), plus the
         * small heap's first superblock for the step's small objects. */
        llmem_pool_stats ps = test_pool_stats(p);
        assert_true(ps.largest_free_bytes >= asked);
        assert_true(ps.committed_bytes <= committed0 + asked + 2 * MIB);
        stage(c, LLMEM_STAGE_DECODE, 1, 1);
    }
    llmem_controller_destroy(c);
    llmem_predictor_destroy(pr);
}

/* Measured peaks reach the predictor's corrector through the engine's
 * on_step_done; once the corrector predicts better than the formulas the
 * next prefill reserves what it says. Here the "engine" always needs twice
 * what the formulas say. */
CONTROLLER_CASE(corrector_sizes_reserve, 0)
{
    llmem_predictor *pr = stories_predictor();
    o->predictor = pr;
    llmem_controller *c = make_ctl(o);
    for (uint32_t i = 1; i <= 12; i++) {
        uint32_t batch = 1 + i % 3, tokens = 8 * i;
        llmem_prediction f;
        assert_ok(llmem_predictor_predict(pr, LLMEM_STAGE_PREFILL, batch, tokens, 0, &f));
        llmem_controller_on_step_done(c, batch, tokens, 0, 2 * f.activation_bytes);
    }
    llmem_predictor_stats ps = {sizeof ps};
    assert_ok(llmem_predictor_get_stats(pr, &ps));
    assert_int_equal(ps.observations, 12);
    assert_true(ps.formula_error > 0.4);       /* off by half of every measurement */
    assert_true(ps.corrector_error < ps.formula_error);
    assert_int_equal(ps.corrector_in_use, 1);
    llmem_prediction want;
    assert_ok(llmem_predictor_predict(pr, LLMEM_STAGE_PREFILL, 2, 64, 0, &want));
    assert_true(want.corrected_reserve_bytes > want.reserve_bytes);
    stage(c, LLMEM_STAGE_PREFILL, 2, 128);
    llmem_controller_event ev[2];
    assert_int_equal(events_of(c, LLMEM_CONTROLLER_RESERVE, ev, 2), 1);
    assert_int_equal(ev[0].detail, want.corrected_reserve_bytes);
    assert_non_null(strstr(ev[0].reason, "corrected"));
    assert_true(test_pool_stats(p).largest_free_bytes >= want.corrected_reserve_bytes);
    /* Nothing without a predictor, or for zero figures. */
    llmem_controller_on_step_done(c, 0, 8, 0, 1000);
    llmem_controller_on_step_done(NULL, 1, 8, 0, 1000);
    assert_ok(llmem_predictor_get_stats(pr, &ps));
    assert_int_equal(ps.observations, 12);
    llmem_controller_destroy(c);
    llmem_predictor_destroy(pr);
}

/* ---- 3. idle shrink after the decay ---------------------------------------------- */

CONTROLLER_CASE(idle_shrink_after_decay, 1000 * MS)
{
    llmem_controller *c = make_ctl(o); /* decay 1000 ms, low watermark 0.30 */
    stage(c, LLMEM_STAGE_PREFILL, 1, 64);
    stage(c, LLMEM_STAGE_DECODE, 1, 1); /* before the allocations: no grow */

    /* 64 blocks of 256 KiB: 16 superblocks; keep one in 16. */
    enum { N = 64 };
    unsigned char *b[N];
    for (int i = 0; i < N; i++) {
        assert_non_null(b[i] = llmem_pool_alloc(p, 256 * KIB, NULL));
        fill(b[i], 256 * KIB, (unsigned)i);
    }
    for (int i = 0; i < N; i++)
        if (i % 16) assert_ok(llmem_pool_free(p, b[i]));
    llmem_pool_stats s0 = test_pool_stats(p);
    assert_int_equal(s0.committed_bytes, 16 * MIB);
    assert_int_equal(s0.used_bytes, 4 * 256 * KIB);

    clk->ns = 2000 * MS;
    stage(c, LLMEM_STAGE_IDLE, 0, 0);
    clk->ns += 999 * MS;
    llmem_controller_tick(c);
    assert_int_equal(events_of(c, LLMEM_CONTROLLER_SHRINK, NULL, 0), 0);
    assert_int_equal(test_pool_stats(p).committed_bytes, 16 * MIB);
    stage(c, LLMEM_STAGE_IDLE, 0, 0); /* a repeated IDLE does not restart the delay */
    clk->ns += 2 * MS;
    llmem_controller_tick(c);

    llmem_controller_event ev[4];
    assert_int_equal(events_of(c, LLMEM_CONTROLLER_SHRINK, ev, 4), 1);
    uint64_t target = (uint64_t)ceil((double)s0.used_bytes / 0.30);
    llmem_pool_stats s1 = test_pool_stats(p);
    assert_int_equal(ev[0].detail, target);
    assert_int_equal(ev[0].bytes_before, 16 * MIB);
    assert_int_equal(ev[0].bytes_after, s1.committed_bytes);
    assert_int_equal(ev[0].stage, LLMEM_STAGE_IDLE);
    assert_int_equal(ev[0].time_ns, 3001 * MS);
    /* Down to the low watermark, within the pool's granularity. */
    assert_true(s1.committed_bytes <= target);
    assert_true(s1.committed_bytes + MIB >= target);
    assert_true(s1.reserved_bytes <= target + MIB);
    assert_int_equal(s1.used_bytes, s0.used_bytes);
    assert_true((double)s1.used_bytes / (double)s1.committed_bytes >= 0.30);
    llmem_controller_stats cs = cstats(c);
    assert_int_equal(cs.shrinks_total, 1);
    assert_int_equal(cs.bytes_released_total, 16 * MIB - s1.committed_bytes);
    for (int i = 0; i < N; i += 16) assert_true(intact(b[i], 256 * KIB, (unsigned)i));
    assert_ok(llmem_pool_check(p));

    /* Once per idle period. */
    clk->ns += 10000 * MS;
    llmem_controller_tick(c);
    stage(c, LLMEM_STAGE_IDLE, 0, 0);
    assert_int_equal(cstats(c).shrinks_total, 1);

    /* A new idle period after work shrinks again (after its own delay). */
    stage(c, LLMEM_STAGE_PREFILL, 1, 16);
    for (int i = 1; i < 16; i++) assert_non_null(b[i] = llmem_pool_alloc(p, 256 * KIB, NULL));
    stage(c, LLMEM_STAGE_DECODE, 1, 1);
    for (int i = 1; i < 16; i++) assert_ok(llmem_pool_free(p, b[i]));
    stage(c, LLMEM_STAGE_IDLE, 0, 0);
    llmem_controller_tick(c);
    assert_int_equal(cstats(c).shrinks_total, 1);
    clk->ns += 1000 * MS;
    llmem_controller_tick(c);
    assert_int_equal(cstats(c).shrinks_total, 2);

    for (int i = 0; i < N; i += 16) assert_ok(llmem_pool_free(p, b[i]));
    llmem_controller_destroy(c);
}

/* ---- 4. hysteresis ------------------------------------------------------------------ */

CONTROLLER_CASE(hysteresis_under_alternating_load, 0)
{
    o->grow_min_bytes = MIB;
    o->grow_factor = 2;
    o->grow_max_bytes = 4 * MIB;
    o->idle_decay_ms = 100;
    llmem_controller *c = make_ctl(o);

    enum { BASE = 12, DRIFT = 20 };
    void *base[BASE + DRIFT];
    size_t nbase = 0;
    for (; nbase < BASE; nbase++) assert_non_null(base[nbase] = llmem_pool_alloc(p, 256 * KIB, NULL));
    void *pulse = NULL;
    uint64_t last_committed = 0;
    for (int i = 0; i < 200; i++) {
        /* Up and down by a quarter MiB every step, creeping up 256 KiB
         * every ten steps: 5 MiB in all. */
        if (i % 2) assert_non_null(pulse = llmem_pool_alloc(p, 256 * KIB, NULL));
        else if (pulse) {
            assert_ok(llmem_pool_free(p, pulse));
            pulse = NULL;
        }
        if (i % 10 == 9) assert_non_null(base[nbase++] = llmem_pool_alloc(p, 256 * KIB, NULL));
        clk->ns += 500 * MS; /* ticks past the idle decay: no shrink outside IDLE */
        stage(c, LLMEM_STAGE_DECODE, 4, 4);
        llmem_controller_tick(c);
        uint64_t committed = test_pool_stats(p).committed_bytes;
        assert_true(committed >= last_committed);
        last_committed = committed;
    }
    llmem_controller_event g[16];
    size_t grows = events_of(c, LLMEM_CONTROLLER_GROW, g, 16);
    assert_true(grows >= 3);
    assert_true(grows <= 6);
    assert_int_equal(events_of(c, LLMEM_CONTROLLER_SHRINK, NULL, 0), 0);
    assert_int_equal(cstats(c).shrinks_total, 0);
    size_t step = MIB;
    for (size_t i = 0; i < grows; i++) {
        assert_int_equal(g[i].detail, step); /* 1, 2, 4, 4... MiB */
        assert_int_equal(g[i].stage, LLMEM_STAGE_DECODE);
        assert_true(g[i].bytes_after >= g[i].bytes_before + step);
        step = step * 2 > 4 * MIB ? 4 * MIB : step * 2;
    }
    llmem_controller_stats cs = cstats(c);
    assert_int_equal(cs.grows_total, grows);
    assert_int_equal(cs.grow_step_bytes, step);
    assert_true(cs.bytes_grown_total >= MIB + 2 * MIB + 4 * MIB);
    /* The load ends well below the watermark of what is held. */
    llmem_pool_stats ps = test_pool_stats(p);
    assert_true((double)ps.used_bytes / (double)ps.committed_bytes <= 0.85 + 1e-9);

    /* Idle past the decay: a shrink, and the grow step starts over. */
    if (pulse) assert_ok(llmem_pool_free(p, pulse));
    for (size_t i = 0; i < nbase; i++) assert_ok(llmem_pool_free(p, base[i]));
    stage(c, LLMEM_STAGE_IDLE, 0, 0);
    clk->ns += 101 * MS;
    llmem_controller_tick(c);
    cs = cstats(c);
    assert_int_equal(cs.shrinks_total, 1);
    assert_int_equal(cs.grow_step_bytes, MIB);
    assert_int_equal(test_pool_stats(p).committed_bytes, 0);
    llmem_controller_destroy(c);
}

/* Decode grows once used / committed passes the watermark, with and
 * without a reserved range, and again after shrink decommitted free pages.
 * With reserve_bytes the pool's largest free run used to include the
 * range's uncommitted tail (gigabytes of address space), so the controller
 * never grew: 0 grows at 100% of committed memory in use. */
static void decode_grow(bool reserved)
{
    llmem_resource *r;
    assert_ok(llmem_tracking_resource_create(llmem_resource_default(), &r));
    llmem_pool_options po = llmem_pool_options_default();
    po.resource = r;
    po.purge = LLMEM_POOL_PURGE_MANUAL;
    po.decay_ms = 60000;
    po.first_superblock_bytes = po.max_superblock_bytes = MIB;
    if (reserved) po.reserve_bytes = 256 * MIB;
    llmem_pool *p;
    assert_ok(llmem_pool_create(&po, &p));
    fake_clock clk = {0};
    llmem_controller_options o = ctl_options(p, &clk);
    o.grow_min_bytes = MIB;
    o.grow_factor = 1;
    o.grow_max_bytes = MIB;
    llmem_controller *c = make_ctl(&o);
    enum { N = 24 };
    void *b[N];
    uint64_t grows = 0;
    for (int round = 0; round < 2; round++) {
        /* Fill what is committed: every block takes pages that were not. */
        for (int i = 0; i < N; i++) {
            assert_non_null(b[i] = llmem_pool_alloc(p, 256 * KIB, NULL));
            memset(b[i], i, 256 * KIB);
        }
        llmem_pool_stats s = test_pool_stats(p);
        assert_true((double)s.used_bytes / (double)s.committed_bytes > 0.85);
        assert_true(s.largest_free_bytes < MIB);
        assert_true(s.largest_free_bytes <= s.free_bytes);
        assert_true(s.free_bytes <= s.committed_bytes - s.used_bytes);
        uint64_t before = s.committed_bytes;
        stage(c, LLMEM_STAGE_DECODE, 1, 1);
        assert_int_equal(cstats(c).grows_total, ++grows);
        s = test_pool_stats(p);
        assert_true(s.committed_bytes >= before + MIB);
        assert_true(s.largest_free_bytes >= MIB); /* the step is there, committed */
        /* The room is there: the next steps do not grow again. */
        stage(c, LLMEM_STAGE_DECODE, 1, 1);
        assert_int_equal(cstats(c).grows_total, grows);
        for (int i = 0; i < N; i++) assert_ok(llmem_pool_free(p, b[i]));
        /* Decommit what is free (the range stays mapped, its pages go). */
        llmem_pool_trim(p);
        s = test_pool_stats(p);
        assert_int_equal(s.committed_bytes, 0);
        assert_int_equal(s.largest_free_bytes, 0);
        assert_true(s.fragmentation == 0.0);
        stage(c, LLMEM_STAGE_DECODE, 1, 1); /* below the watermark: re-armed */
    }
    llmem_controller_destroy(c);
    release_pool(p, r);
}

TEST_CASE(decode_grow_plain, decode_grow(false))
TEST_CASE(decode_grow_reserved, decode_grow(true))

/* ---- 5. compaction ---------------------------------------------------------------------- */

CONTROLLER_CASE(idle_compaction, 0)
{
    llmem_controller *c = make_ctl(o);
    stage(c, LLMEM_STAGE_PREFILL, 1, 64);
    stage(c, LLMEM_STAGE_DECODE, 1, 1); /* before the allocations: no grow */

    /* 64 handles of 64 KiB fill four superblocks; every other one goes. */
    enum { N = 64 };
    llmem_handle h[N];
    for (int i = 0; i < N; i++) {
        assert_ok(llmem_pool_handle_alloc(p, 64 * KIB, &h[i]));
        unsigned char *x = llmem_pool_pin(p, h[i], NULL);
        assert_non_null(x);
        fill(x, 64 * KIB, (unsigned)(i * 7 + 1));
        assert_ok(llmem_pool_unpin(p, h[i]));
    }
    for (int i = 1; i < N; i += 2) assert_ok(llmem_pool_handle_free(p, h[i]));
    llmem_pool_stats s0 = test_pool_stats(p);
    assert_true(s0.fragmentation > 0.40);
    assert_int_equal(s0.committed_bytes, 4 * MIB);
    uint64_t unmaps0 = test_resource_stats(r).unmap_calls_total;

    stage(c, LLMEM_STAGE_IDLE, 0, 0);
    clk->ns += 1001 * MS;
    llmem_controller_tick(c);

    llmem_controller_event ev[4];
    assert_int_equal(events_of(c, LLMEM_CONTROLLER_COMPACT, ev, 4), 1);
    llmem_pool_stats s1 = test_pool_stats(p);
    assert_true(ev[0].detail > 0);
    assert_int_equal(ev[0].bytes_before, 4 * MIB);
    assert_int_equal(ev[0].bytes_after, s1.committed_bytes);
    assert_true(s1.committed_bytes < s0.committed_bytes);
    assert_true(s1.fragmentation < s0.fragmentation);
    assert_true(test_resource_stats(r).unmap_calls_total > unmaps0);
    llmem_controller_stats cs = cstats(c);
    assert_int_equal(cs.compactions_total, 1);
    assert_int_equal(cs.bytes_compacted_total, ev[0].detail);
    assert_true(cs.bytes_released_total >= s0.committed_bytes - s1.committed_bytes);
    assert_int_equal(cs.failures_total, 0);
    for (int i = 0; i < N; i += 2) {
        unsigned char *x = llmem_pool_pin(p, h[i], NULL);
        assert_non_null(x);
        assert_true(intact(x, 64 * KIB, (unsigned)(i * 7 + 1)));
        assert_ok(llmem_pool_unpin(p, h[i]));
    }
    assert_ok(llmem_pool_check(p));
    for (int i = 0; i < N; i += 2) assert_ok(llmem_pool_handle_free(p, h[i]));
    llmem_controller_destroy(c);
}

/* No handles, no compaction, however fragmented. */
CONTROLLER_CASE(no_compaction_without_handles, 0)
{
    o->low_watermark = 0.01; /* keep the shrink from taking the holes */
    llmem_controller *c = make_ctl(o);
    void *b[16];
    for (int i = 0; i < 16; i++) assert_non_null(b[i] = llmem_pool_alloc(p, 64 * KIB, NULL));
    for (int i = 1; i < 16; i += 2) assert_ok(llmem_pool_free(p, b[i]));
    assert_true(test_pool_stats(p).fragmentation > 0.40);
    stage(c, LLMEM_STAGE_DECODE, 1, 1);
    stage(c, LLMEM_STAGE_IDLE, 0, 0);
    clk->ns += 1001 * MS;
    llmem_controller_tick(c);
    assert_int_equal(cstats(c).compactions_total, 0);
    for (int i = 0; i < 16; i += 2) assert_ok(llmem_pool_free(p, b[i]));
    llmem_controller_destroy(c);
}

/* ---- 6. events, JSON lines, stats ------------------------------------------------------ */

CONTROLLER_CASE(events_ring_and_json, 7 * MS)
{
    o->bytes_per_token_hint = 4096;
    o->event_capacity = 8;
    llmem_controller *c = make_ctl(o);
    for (int i = 0; i < 20; i++) {
        clk->ns += MS;
        stage(c, LLMEM_STAGE_PREFILL, 1, 16);
        clk->ns += MS;
        stage(c, LLMEM_STAGE_DECODE, 1, 1);
    }
    /* 40 stage changes and 20 reserves. */
    llmem_controller_stats cs = cstats(c);
    assert_int_equal(cs.events_total, 60);
    assert_int_equal(cs.events_dropped, 52);
    assert_int_equal(cs.reserves_total, 20);
    llmem_controller_event ev[16];
    assert_int_equal(llmem_controller_events(c, ev, 16), 8);
    for (int i = 1; i < 8; i++) assert_true(ev[i].time_ns >= ev[i - 1].time_ns);
    assert_int_equal(ev[7].action, LLMEM_CONTROLLER_STAGE);
    assert_int_equal(ev[7].stage, LLMEM_STAGE_DECODE);
    assert_int_equal(ev[7].time_ns, clk->ns);
    assert_int_equal(ev[6].action, LLMEM_CONTROLLER_RESERVE);
    assert_int_equal(ev[6].detail, (uint64_t)ceil(16 * 4096 * 1.2));
    assert_int_equal(llmem_controller_events(c, ev, 3), 3); /* the oldest three */
    assert_int_equal(ev[0].time_ns, clk->ns - 5 * MS);
    assert_int_equal(llmem_controller_events(c, NULL, 0), 0);
    assert_int_equal(llmem_controller_events(c, NULL, 4), 0);

    FILE *f = tmpfile();
    assert_non_null(f);
    assert_ok(llmem_controller_write_events(c, f));
    rewind(f);
    char line[512];
    int lines = 0, reserves = 0;
    while (fgets(line, sizeof line, f)) {
        lines++;
        assert_true(strncmp(line, "{\"t_ms\":", 8) == 0);
        assert_non_null(strstr(line, "\"action\":\""));
        assert_non_null(strstr(line, "\"stage\":\""));
        assert_non_null(strstr(line, "\"reason\":\""));
        assert_non_null(strstr(line, "\"detail\":"));
        assert_true(line[strlen(line) - 2] == '}' && line[strlen(line) - 1] == '\n');
        if (strstr(line, "\"action\":\"reserve\"")) {
            reserves++;
            assert_non_null(strstr(line, "\"stage\":\"prefill\""));
        }
    }
    fclose(f);
    assert_int_equal(lines, 8);
    assert_int_equal(reserves, 3);
    /* The last line is 40 ms after creation. */
    f = tmpfile();
    assert_ok(llmem_controller_write_events(c, f));
    rewind(f);
    char last[512] = "";
    while (fgets(line, sizeof line, f)) memcpy(last, line, sizeof line);
    fclose(f);
    assert_true(strncmp(last, "{\"t_ms\":40.000,\"stage\":\"decode\",\"action\":\"stage\"", 48) == 0);

    char buf[8192];
    size_t len;
    llmem_label lb[] = {{"controller", "main"}};
    assert_ok(llmem_stats_to_json(llmem_controller_stats_schema(), &cs, lb, 1, buf, sizeof buf, &len));
    assert_non_null(strstr(buf, "\"events_dropped\":52"));
    assert_non_null(strstr(buf, "\"reserves_total\":20"));
    assert_non_null(strstr(buf, "\"grow_step_bytes\":"));
    assert_string_equal(llmem_controller_stats_schema()->name, "controller");
    assert_int_equal(llmem_controller_stats_schema()->struct_size, sizeof(llmem_controller_stats));
    llmem_exporter *ex;
    assert_ok(llmem_exporter_create(LLMEM_EXPORT_PROMETHEUS, &ex));
    assert_ok(llmem_exporter_add(ex, llmem_controller_stats_schema(), &cs, lb, 1));
    assert_ok(llmem_exporter_render(ex, buf, sizeof buf, &len));
    assert_non_null(strstr(buf, "llmem_controller_events_dropped{controller=\"main\"} 52"));
    llmem_exporter_destroy(ex);

    /* An old caller's smaller struct gets what fits. */
    llmem_controller_stats small = {offsetof(llmem_controller_stats, events_dropped)};
    small.events_dropped = 12345;
    assert_ok(llmem_controller_get_stats(c, &small));
    assert_int_equal(small.events_total, 60);
    assert_int_equal(small.events_dropped, 12345);

    assert_string_equal(llmem_controller_action_name(LLMEM_CONTROLLER_COMPACT), "compact");
    assert_string_equal(llmem_controller_action_name((llmem_controller_action)99), "?");
    llmem_controller_destroy(c);
}

/* ---- 7. bad input --------------------------------------------------------------------------- */

static void bad_input(void **state)
{
    (void)state;
    llmem_pool *p;
    assert_ok(llmem_pool_create(NULL, &p));
    llmem_controller *c = (llmem_controller *)&c;
    llmem_controller_options o = llmem_controller_options_default();
    assert_status(llmem_controller_create(&o, &c), LLMEM_EINVAL); /* no pool */
    assert_null(c);
    o.pool = p;
    assert_status(llmem_controller_create(NULL, &c), LLMEM_EINVAL);
    assert_status(llmem_controller_create(&o, NULL), LLMEM_EINVAL);

    static const struct {
        double safety, high, low, factor, compact;
    } bad[] = {
        {0.5, 0.85, 0.30, 2, 0.4},  /* safety below 1 */
        {1.2, 0.80, 0.80, 2, 0.4},  /* low == high */
        {1.2, 0.50, 0.70, 2, 0.4},  /* low above high */
        {1.2, 1.50, 0.30, 2, 0.4},  /* high past 1 */
        {1.2, 0.85, -0.1, 2, 0.4},  /* low negative */
        {1.2, -0.5, 0.30, 2, 0.4},  /* high negative */
        {1.2, NAN, 0.30, 2, 0.4},   /* not a number */
        {NAN, 0.85, 0.30, 2, 0.4},
        {1.2, 0.85, 0.30, 0.5, 0.4}, /* a shrinking grow */
        {1.2, 0.85, 0.30, 2, 1.5},   /* compaction threshold past 1 */
        {1.2, 0.85, 0.30, 2, -0.2},
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        llmem_controller_options b = o;
        b.safety_factor = bad[i].safety;
        b.high_watermark = bad[i].high;
        b.low_watermark = bad[i].low;
        b.grow_factor = bad[i].factor;
        b.compact_threshold = bad[i].compact;
        assert_status(llmem_controller_create(&b, &c), LLMEM_EINVAL);
    }
    llmem_controller_options b = o;
    b.grow_min_bytes = 8 * MIB;
    b.grow_max_bytes = 4 * MIB;
    assert_status(llmem_controller_create(&b, &c), LLMEM_EINVAL);
    assert_error_mentions("grow_max_bytes");
    b = o;
    b.event_capacity = SIZE_MAX / 2;
    assert_status(llmem_controller_create(&b, &c), LLMEM_EOVERFLOW);

    /* Zeros are defaults; 1.0 for the high watermark and compaction are allowed. */
    llmem_controller_options z = {0};
    z.pool = p;
    z.high_watermark = 1.0;
    z.compact_threshold = 1.0;
    assert_ok(llmem_controller_create(&z, &c));
    llmem_controller_stats cs = cstats(c);
    assert_int_equal(cs.grow_step_bytes, 4 * MIB);
    assert_int_equal(cs.stage, LLMEM_STAGE_IDLE);
    assert_int_equal(cs.events_total, 0);

    /* Null arguments: statuses, or nothing done. */
    llmem_stage_event ev = {LLMEM_STAGE_DECODE, 1, 1, 0};
    llmem_controller_on_stage(NULL, &ev);
    llmem_controller_on_stage(c, NULL);
    ev.stage = (llmem_stage)99;
    llmem_controller_on_stage(c, &ev);
    assert_int_equal(cstats(c).events_total, 0);
    llmem_controller_tick(NULL);
    assert_status(llmem_controller_get_stats(NULL, &cs), LLMEM_EINVAL);
    assert_status(llmem_controller_get_stats(c, NULL), LLMEM_EINVAL);
    assert_status(llmem_controller_write_events(NULL, stdout), LLMEM_EINVAL);
    assert_status(llmem_controller_write_events(c, NULL), LLMEM_EINVAL);
    llmem_controller_event e[2];
    assert_int_equal(llmem_controller_events(NULL, e, 2), 0);
    assert_int_equal(llmem_controller_events(c, e, 2), 0);
    llmem_controller_destroy(c);
    llmem_controller_destroy(NULL);
    assert_non_null(llmem_controller_stats_schema());
    llmem_pool_destroy(p);
}

/* A reserve the pool refuses is a FAIL event, not an error. */
static void refused_reserve_is_an_event(void **state)
{
    (void)state;
    llmem_pool_options po = llmem_pool_options_default();
    po.purge = LLMEM_POOL_PURGE_MANUAL;
    po.first_superblock_bytes = MIB;
    po.max_bytes = 4 * MIB;
    llmem_pool *p;
    assert_ok(llmem_pool_create(&po, &p));
    fake_clock clk = {0};
    llmem_controller_options o = ctl_options(p, &clk);
    o.bytes_per_token_hint = MIB;
    llmem_controller *c = make_ctl(&o);
    stage(c, LLMEM_STAGE_PREFILL, 1, 64); /* 76.8 MiB: past max_bytes */
    llmem_controller_event ev[2];
    assert_int_equal(events_of(c, LLMEM_CONTROLLER_FAIL, ev, 2), 1);
    assert_int_equal(ev[0].detail, (uint64_t)ceil(64.0 * MIB * 1.2));
    assert_int_equal(ev[0].stage, LLMEM_STAGE_PREFILL);
    llmem_controller_stats cs = cstats(c);
    assert_int_equal(cs.failures_total, 1);
    assert_int_equal(cs.reserves_total, 0);
    stage(c, LLMEM_STAGE_PREFILL, 1, 2); /* 2.4 MiB fits */
    assert_int_equal(cstats(c).reserves_total, 1);
    llmem_controller_destroy(c);
    llmem_pool_destroy(p);
}

/* ---- an engine with the controller attached ------------------------------------------------ */

typedef struct listener {
    llmem_controller *ctl;
    llmem_resource *res;
    llmem_pool *ctl_pool;              /* the pool the controller runs */
    llmem_resource_stats after_notice; /* the resource's figures once the controller has acted */
    uint64_t pool_calls_after_notice;  /* the pool's resource calls by then */
    int prefills;
} listener;

static void on_stage_then_snapshot(void *ctx, const llmem_stage_event *ev)
{
    listener *l = ctx;
    llmem_controller_on_stage(l->ctl, ev);
    l->after_notice = test_resource_stats(l->res);
    l->pool_calls_after_notice = test_pool_stats(l->ctl_pool).resource_calls_total;
    if (ev->stage == LLMEM_STAGE_PREFILL) l->prefills++;
}

static void engine_prefill_makes_no_resource_call(void **state)
{
    (void)state;
    llmem_model *m;
    assert_ok(llmem_model_open(test_shared_path("models/stories260K.bin"), NULL, &m));
    const llmem_model_config *mc = llmem_model_get_config(m);
    llmem_predictor_options po = llmem_predictor_options_default();
    po.shape = mc->shape;
    po.weight_type = mc->weight_type;
    po.kv_elem_bytes = 4;
    po.threads = 1;
    llmem_predictor *pr;
    assert_ok(llmem_predictor_create(&po, &pr));
    llmem_resource *r;
    llmem_pool *p = tracked_pool(&r, MIB);
    llmem_controller_options co = llmem_controller_options_default();
    co.pool = p;
    co.predictor = pr;
    llmem_controller *c = make_ctl(&co);
    listener l = {c, r, p, {0}, 0, 0};
    llmem_engine_options eo = llmem_engine_options_default();
    eo.threads = 1;
    eo.pool = p;
    eo.on_stage = on_stage_then_snapshot;
    eo.stage_ctx = &l;
    llmem_engine *e;
    assert_ok(llmem_engine_create(m, &eo, &e));

    int32_t toks[96];
    for (int i = 0; i < 96; i++) toks[i] = 1 + (i * 17) % 500;
    llmem_engine_seq s[2];
    for (int i = 0; i < 2; i++) assert_ok(llmem_engine_seq_create(e, &s[i]));
    llmem_engine_batch_item items[2] = {{s[0], toks, 48}, {s[1], toks + 48, 48}};
    assert_ok(llmem_engine_step(e, items, 2));
    assert_int_equal(l.prefills, 1);
    assert_true(test_pool_stats(p).used_bytes > 0); /* the step's KV came from the pool */
    /* The controlled pool made no resource call after the reserve. The
     * resource under it also serves the KV manager's small metadata pool
     * (engine.c passes the pool's resource on), whose first table growth
     * may map a chunk: that is not the pool's, and not what a reserve
     * covers. */
    assert_int_equal(test_pool_stats(p).resource_calls_total, l.pool_calls_after_notice);
    llmem_controller_event ev[2];
    assert_int_equal(events_of(c, LLMEM_CONTROLLER_RESERVE, ev, 2), 1);
    assert_true(ev[0].bytes_after >= ev[0].detail);
    /* The engine's stage reports reached the controller once each, and
     * both count the same steps. */
    llmem_engine_stats es = {sizeof es};
    assert_ok(llmem_engine_get_stats(e, &es));
    assert_int_equal(cstats(c).prefill_steps_total, 1);
    assert_int_equal(cstats(c).prefill_steps_total, es.prefill_steps_total);
    assert_int_equal(cstats(c).stage, LLMEM_STAGE_PREFILL);

    llmem_engine_destroy(e);
    llmem_controller_destroy(c);
    release_pool(p, r);
    llmem_predictor_destroy(pr);
    llmem_model_close(m);
}

/* ---- 8. no heap growth from on_stage --------------------------------------------------------- */

static void on_stage_keeps_the_heap(void **state)
{
    (void)state;
#if defined(TEST_ASAN) || defined(TEST_TSAN) || !defined(__GLIBC__)
    /* Sanitizers replace the allocator: mallinfo2 says nothing there. */
    print_message("skipped: heap figures need glibc's allocator (this build has a sanitizer)\n");
    skip();
#else
    llmem_pool_options po = llmem_pool_options_default();
    po.purge = LLMEM_POOL_PURGE_MANUAL;
    llmem_pool *p;
    assert_ok(llmem_pool_create(&po, &p));
    void *x = llmem_pool_alloc(p, 1000, NULL);
    assert_non_null(x);
    fake_clock clk = {0};
    llmem_controller_options o = ctl_options(p, &clk);
    o.event_capacity = 256; /* wraps many times below */
    llmem_controller *c = make_ctl(&o);
    static const llmem_stage cycle[] = {LLMEM_STAGE_PREFILL, LLMEM_STAGE_DECODE, LLMEM_STAGE_DECODE,
                                        LLMEM_STAGE_DECODE, LLMEM_STAGE_IDLE};
    /* One round first: the pool's own first-use allocations (this thread's
     * cache) are not the controller's. */
    for (int i = 0; i < 10; i++) {
        clk.ns += 300 * MS;
        stage(c, cycle[i % 5], 2, 4);
        llmem_controller_tick(c);
    }
    size_t heap0 = mallinfo2().uordblks;
    for (int i = 0; i < 10000; i++) {
        clk.ns += 300 * MS;
        stage(c, cycle[i % 5], 2, 4);
        if (i % 7 == 0) llmem_controller_tick(c);
    }
    size_t heap1 = mallinfo2().uordblks;
    assert_int_equal(heap1, heap0);
    assert_true(cstats(c).events_dropped > 0);
    llmem_controller_destroy(c);
    assert_ok(llmem_pool_free(p, x));
    llmem_pool_destroy(p);
#endif
}

int main(int argc, char **argv)
{
    /* On a real model of the shared folder (test_controller_shared). */
    const struct CMUnitTest shared_tests[] = {
        cmocka_unit_test(engine_prefill_makes_no_resource_call),
    };
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reserve_before_prefill),
        cmocka_unit_test(no_hint_no_reserve),
        cmocka_unit_test(predictor_sizes_reserve),
        cmocka_unit_test(corrector_sizes_reserve),
        cmocka_unit_test(idle_shrink_after_decay),
        cmocka_unit_test(hysteresis_under_alternating_load),
        cmocka_unit_test(decode_grow_plain),
        cmocka_unit_test(decode_grow_reserved),
        cmocka_unit_test(idle_compaction),
        cmocka_unit_test(no_compaction_without_handles),
        cmocka_unit_test(events_ring_and_json),
        cmocka_unit_test(bad_input),
        cmocka_unit_test(refused_reserve_is_an_event),
        cmocka_unit_test(on_stage_keeps_the_heap),
    };
    return test_main(argc, argv, "test_controller", TEST_GROUP(tests, test_quiet_logs, NULL),
                     TEST_GROUP(shared_tests, test_quiet_logs, NULL),
                     (const char *const[]){"models/stories260K.bin", NULL});
}
