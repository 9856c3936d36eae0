/*
 * test_adaptors.c - the resource adaptors: limit (a byte cap, COMMITTED and
 * MAPPED modes, moving the cap), fault (nth call, runs of failures, byte
 * budget, seeded probability, the ops mask, custom status, re-arming),
 * tracking (tags, foreach order, the leak report, the contract checks it
 * refuses before upstream sees them, peaks), and stacks of all three under
 * a pool. Every adaptor gets a fresh upstream so the upstream's own
 * counters prove what reached it.
 */
#include <math.h>
#include <pthread.h>
#include <semaphore.h>

#include "test_util.h"
#include "support/cases.h"
#include "support/log_capture.h"
#include "llmem/resource_impl.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static llmem_resource *new_sim(size_t capacity, size_t granularity)
{
    llmem_sim_options o = llmem_sim_options_default();
    if (capacity) o.capacity = capacity;
    if (granularity) o.granularity = granularity;
    llmem_resource *r = NULL;
    assert_ok(llmem_sim_resource_create(&o, &r));
    return r;
}

static llmem_resource *new_limit(llmem_resource *up, size_t limit, llmem_limit_what what)
{
    llmem_limit_options o = llmem_limit_options_default();
    o.limit_bytes = limit;
    o.what = what;
    llmem_resource *r = NULL;
    assert_ok(llmem_limit_resource_create(up, &o, &r));
    assert_non_null(r);
    return r;
}

static size_t limit_used(const llmem_resource *l)
{
    size_t used = SIZE_MAX, lim = 0;
    assert_ok(llmem_limit_resource_usage(l, &used, &lim));
    return used;
}

static size_t limit_cap(const llmem_resource *l)
{
    size_t lim = 0;
    assert_ok(llmem_limit_resource_usage(l, NULL, &lim));
    return lim;
}

/* The info of an adaptor equals its upstream's, name aside. */
static void assert_same_info(const llmem_resource *a, const llmem_resource *up)
{
    llmem_resource_info x, y;
    assert_ok(llmem_resource_get_info(a, &x));
    assert_ok(llmem_resource_get_info(up, &y));
    assert_int_equal(x.kind, y.kind);
    assert_int_equal(x.granularity, y.granularity);
    assert_int_equal(x.min_align, y.min_align);
    assert_int_equal(x.max_align, y.max_align);
    assert_int_equal(x.caps, y.caps);
}

/* Fill / check host memory with a pattern derived from seed. */
static void fill(void *p, size_t n, unsigned seed)
{
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(seed * 131u + i * 7u + (i >> 8));
}

static bool holds(const void *p, size_t n, unsigned seed)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != (unsigned char)(seed * 131u + i * 7u + (i >> 8))) return false;
    return true;
}

/* ===== limit ============================================================== */

/* Every claim given back (nothing counted), then the limit destroyed. */
static void limit_done(llmem_resource *l)
{
    assert_int_equal(limit_used(l), 0);
    llmem_resource_destroy(l);
}

TEST_OS_CASE(limit_caps_maps_and_names_the_limit)
{
    llmem_resource *l = new_limit(os, MiB, LLMEM_LIMIT_COMMITTED);
    assert_int_equal(limit_cap(l), MiB);
    assert_int_equal(limit_used(l), 0);

    void *p[4];
    for (int i = 0; i < 4; i++) {
        assert_ok(llmem_resource_map(l, 256 * KiB, 0, 0, &p[i]));
        fill(p[i], 256 * KiB, (unsigned)i); /* committed host memory: usable */
        assert_int_equal(limit_used(l), (size_t)(i + 1) * 256 * KiB);
    }
    llmem_resource_stats up0 = test_resource_stats(os);
    assert_int_equal(up0.map_calls_total, 4);
    assert_int_equal(up0.mapped_bytes, MiB);

    /* One page more does not fit; nor does a single map above the cap. */
    void *q = (void *)1;
    llmem_error_clear();
    assert_status(llmem_resource_map(l, page, 0, 0, &q), LLMEM_ENOMEM);
    assert_null(q);
    assert_error_mentions("limit(os)");
    assert_error_mentions("1048576");
    assert_status(llmem_resource_map(l, 2 * MiB, 0, 0, &q), LLMEM_ENOMEM);
    assert_int_equal(limit_used(l), MiB);

    /* Refused maps never reached upstream: no call, no failure there. */
    llmem_resource_stats up1 = test_resource_stats(os);
    assert_int_equal(up1.map_calls_total, up0.map_calls_total);
    assert_int_equal(up1.failures_total, up0.failures_total);
    assert_int_equal(up1.mapped_bytes, MiB);
    /* The limit's own wrapper counted both refusals. */
    assert_int_equal(test_resource_stats(l).failures_total, 2);
    assert_int_equal(test_resource_stats(l).map_calls_total, 4);

    /* Unmap gives budget back, and exactly that much. */
    assert_true(holds(p[1], 256 * KiB, 1));
    assert_ok(llmem_resource_unmap(l, p[1], 256 * KiB, 256 * KiB));
    assert_int_equal(limit_used(l), 768 * KiB);
    assert_status(llmem_resource_map(l, 256 * KiB + page, 0, 0, &q), LLMEM_ENOMEM);
    assert_ok(llmem_resource_map(l, 256 * KiB, 0, 0, &p[1]));
    assert_int_equal(limit_used(l), MiB);
    assert_status(llmem_resource_map(l, page, 0, 0, &q), LLMEM_ENOMEM);

    for (int i = 0; i < 4; i++) {
        if (i != 1) assert_true(holds(p[i], 256 * KiB, (unsigned)i));
        assert_ok(llmem_resource_unmap(l, p[i], 256 * KiB, 256 * KiB));
    }
    limit_done(l);
}

TEST_OS_CASE(limit_sizes_are_rounded_before_counting)
{
    llmem_resource *l = new_limit(os, 4 * page, LLMEM_LIMIT_COMMITTED);
    void *a, *b, *c = (void *)1;
    assert_ok(llmem_resource_map(l, 1, 0, 0, &a)); /* one byte costs one page */
    assert_int_equal(limit_used(l), page);
    assert_ok(llmem_resource_map(l, 2 * page + 1, 0, 0, &b)); /* three pages */
    assert_int_equal(limit_used(l), 4 * page);
    assert_status(llmem_resource_map(l, 1, 0, 0, &c), LLMEM_ENOMEM);
    assert_null(c);
    assert_ok(llmem_resource_unmap(l, a, 1, 1)); /* rounded: one page back */
    assert_int_equal(limit_used(l), 3 * page);
    assert_ok(llmem_resource_unmap(l, b, 3 * page, 3 * page));
    /* Upstream was handed the rounded committed figure too (the case's end
     * checks that os holds no committed byte). */
    limit_done(l);
}

TEST_OS_CASE(limit_set_moves_the_cap)
{
    llmem_resource *l = new_limit(os, MiB, LLMEM_LIMIT_COMMITTED);
    void *big, *q = NULL;
    assert_ok(llmem_resource_map(l, 512 * KiB, 0, 0, &big));

    /* Lower the cap below what is in use: nothing new until usage drops. */
    assert_ok(llmem_limit_resource_set(l, 256 * KiB));
    assert_int_equal(limit_cap(l), 256 * KiB);
    assert_int_equal(limit_used(l), 512 * KiB);
    assert_status(llmem_resource_map(l, page, 0, 0, &q), LLMEM_ENOMEM);
    assert_error_mentions("262144");
    assert_ok(llmem_resource_unmap(l, big, 512 * KiB, 512 * KiB));
    assert_int_equal(limit_used(l), 0);
    assert_ok(llmem_resource_map(l, 256 * KiB, 0, 0, &q));
    void *r = NULL;
    assert_status(llmem_resource_map(l, page, 0, 0, &r), LLMEM_ENOMEM);

    /* Raise it: room again. */
    assert_ok(llmem_limit_resource_set(l, 2 * MiB));
    assert_int_equal(limit_cap(l), 2 * MiB);
    assert_ok(llmem_resource_map(l, MiB, 0, 0, &r));
    assert_int_equal(limit_used(l), MiB + 256 * KiB);
    void *s = NULL;
    assert_status(llmem_resource_map(l, MiB, 0, 0, &s), LLMEM_ENOMEM);

    /* A zero cap is refused and leaves the cap alone. */
    assert_status(llmem_limit_resource_set(l, 0), LLMEM_EINVAL);
    assert_int_equal(limit_cap(l), 2 * MiB);

    assert_ok(llmem_resource_unmap(l, q, 256 * KiB, 256 * KiB));
    assert_ok(llmem_resource_unmap(l, r, MiB, MiB));
    assert_int_equal(limit_used(l), 0);
    /* usage's out pointers are optional. */
    assert_ok(llmem_limit_resource_usage(l, NULL, NULL));
    llmem_resource_destroy(l);
}

TEST_OS_CASE(limit_committed_mode_counts_commits)
{
    llmem_resource *l = new_limit(os, MiB, LLMEM_LIMIT_COMMITTED);

    /* A reservation four times the cap costs nothing. */
    char *v = NULL;
    assert_ok(llmem_resource_map(l, 4 * MiB, 0, LLMEM_MAP_UNCOMMITTED, (void **)&v));
    assert_int_equal(limit_used(l), 0);
    assert_int_equal(test_resource_stats(os).committed_bytes, 0);

    /* Commit counts, and the memory is usable. */
    assert_ok(llmem_resource_commit(l, v, 512 * KiB));
    assert_int_equal(limit_used(l), 512 * KiB);
    fill(v, 512 * KiB, 3);
    /* A commit past the cap is refused before upstream sees it. */
    uint64_t commits = test_resource_stats(os).commit_calls_total;
    assert_status(llmem_resource_commit(l, v + 512 * KiB, 512 * KiB + page), LLMEM_ENOMEM);
    assert_error_mentions("limit(os)");
    assert_int_equal(test_resource_stats(os).commit_calls_total, commits);
    assert_int_equal(limit_used(l), 512 * KiB);
    assert_ok(llmem_resource_commit(l, v + 512 * KiB, 512 * KiB));
    assert_int_equal(limit_used(l), MiB);
    void *q = NULL;
    assert_status(llmem_resource_map(l, page, 0, 0, &q), LLMEM_ENOMEM);
    assert_status(llmem_resource_commit(l, v + MiB, page), LLMEM_ENOMEM);

    /* Decommit gives back. */
    assert_ok(llmem_resource_decommit(l, v + 256 * KiB, 256 * KiB));
    assert_int_equal(limit_used(l), 768 * KiB);
    assert_true(holds(v, 256 * KiB, 3));
    assert_ok(llmem_resource_commit(l, v + 2 * MiB, 256 * KiB));
    assert_int_equal(limit_used(l), MiB);

    /* Unmap gives back exactly the committed figure. */
    assert_ok(llmem_resource_unmap(l, v, 4 * MiB, MiB));
    assert_int_equal(limit_used(l), 0);

    /* A plain mapping counts whole; decommitting part of it gives that back. */
    char *w;
    assert_ok(llmem_resource_map(l, 512 * KiB, 0, 0, (void **)&w));
    assert_int_equal(limit_used(l), 512 * KiB);
    assert_ok(llmem_resource_decommit(l, w, 128 * KiB));
    assert_int_equal(limit_used(l), 384 * KiB);
    assert_ok(llmem_resource_unmap(l, w, 512 * KiB, 384 * KiB));
    limit_done(l);
}

TEST_OS_CASE(limit_mapped_mode_counts_reservations)
{
    llmem_resource *l = new_limit(os, MiB, LLMEM_LIMIT_MAPPED);
    char *v;
    assert_ok(llmem_resource_map(l, 768 * KiB, 0, LLMEM_MAP_UNCOMMITTED, (void **)&v));
    assert_int_equal(limit_used(l), 768 * KiB);
    /* Commit and decommit do not move address space. */
    assert_ok(llmem_resource_commit(l, v, 512 * KiB));
    assert_int_equal(limit_used(l), 768 * KiB);
    fill(v, 512 * KiB, 9);
    assert_ok(llmem_resource_decommit(l, v, 256 * KiB));
    assert_int_equal(limit_used(l), 768 * KiB);
    void *q = NULL, *r = NULL;
    assert_status(llmem_resource_map(l, 512 * KiB, 0, LLMEM_MAP_UNCOMMITTED, &r), LLMEM_ENOMEM);
    assert_status(llmem_resource_map(l, 512 * KiB, 0, 0, &r), LLMEM_ENOMEM);
    assert_ok(llmem_resource_map(l, 256 * KiB, 0, 0, &q));
    assert_int_equal(limit_used(l), MiB);
    assert_status(llmem_resource_map(l, page, 0, LLMEM_MAP_UNCOMMITTED, &r), LLMEM_ENOMEM);
    /* Unmap gives back the whole mapping whatever is committed. */
    assert_ok(llmem_resource_unmap(l, v, 768 * KiB, 256 * KiB));
    assert_int_equal(limit_used(l), 256 * KiB);
    assert_ok(llmem_resource_unmap(l, q, 256 * KiB, 256 * KiB));
    limit_done(l);
}

TEST_OS_CASE(limit_gives_claim_back_when_upstream_fails)
{
    llmem_fault_options fo = llmem_fault_options_default();
    fo.fail_nth = 1;
    llmem_resource *f;
    assert_ok(llmem_fault_resource_create(os, &fo, &f));
    llmem_resource *l = new_limit(f, 8 * page, LLMEM_LIMIT_COMMITTED);
    void *p = NULL;
    assert_status(llmem_resource_map(l, 4 * page, 0, 0, &p), LLMEM_ENOMEM);
    assert_error_mentions("injected"); /* the upstream's message, not the limit's */
    assert_int_equal(limit_used(l), 0);
    assert_ok(llmem_resource_map(l, 8 * page, 0, 0, &p)); /* the whole cap is free again */
    assert_int_equal(limit_used(l), 8 * page);
    assert_ok(llmem_resource_unmap(l, p, 8 * page, 8 * page));
    assert_ok(llmem_resource_map(l, 4 * page, 0, LLMEM_MAP_UNCOMMITTED, &p));
    assert_int_equal(test_fault_stats(f).injected_total, 1);
    assert_int_equal(test_fault_stats(f).calls_total, 3);
    assert_ok(llmem_resource_commit(l, p, 2 * page));
    assert_int_equal(limit_used(l), 2 * page);
    assert_ok(llmem_resource_unmap(l, p, 4 * page, 2 * page));
    assert_int_equal(limit_used(l), 0);

    /* Commit failing upstream gives its claim back too. */
    assert_ok(llmem_fault_resource_arm(f, &(llmem_fault_options){.fail_nth = 2}));
    assert_ok(llmem_resource_map(l, 4 * page, 0, LLMEM_MAP_UNCOMMITTED, &p));
    assert_status(llmem_resource_commit(l, p, 4 * page), LLMEM_ENOMEM);
    assert_int_equal(limit_used(l), 0);
    assert_ok(llmem_resource_commit(l, p, 4 * page));
    assert_int_equal(limit_used(l), 4 * page);
    assert_ok(llmem_resource_unmap(l, p, 4 * page, 4 * page));
    limit_done(l);
    llmem_resource_destroy(f);
}

TEST_OS_CASE(limit_bad_options_and_wrong_resources)
{
    llmem_resource *l = (llmem_resource *)1;
    llmem_limit_options o = llmem_limit_options_default();
    assert_int_equal(o.what, LLMEM_LIMIT_COMMITTED);
    /* limit 0 */
    assert_status(llmem_limit_resource_create(os, &o, &l), LLMEM_EINVAL);
    assert_null(l);
    /* unknown mode */
    o.limit_bytes = MiB;
    o.what = (llmem_limit_what)7;
    l = (llmem_resource *)1;
    assert_status(llmem_limit_resource_create(os, &o, &l), LLMEM_EINVAL);
    assert_null(l);
    o.what = (llmem_limit_what)-1;
    assert_status(llmem_limit_resource_create(os, &o, &l), LLMEM_EINVAL);
    o.what = LLMEM_LIMIT_MAPPED;
    /* NULL upstream, options, out */
    l = (llmem_resource *)1;
    assert_status(llmem_limit_resource_create(NULL, &o, &l), LLMEM_EINVAL);
    assert_null(l);
    assert_status(llmem_limit_resource_create(os, NULL, &l), LLMEM_EINVAL);
    assert_status(llmem_limit_resource_create(os, &o, NULL), LLMEM_EINVAL);

    /* usage / set on something that is not a limit. */
    size_t used = 123, lim = 456;
    assert_status(llmem_limit_resource_usage(os, &used, &lim), LLMEM_EINVAL);
    assert_int_equal(used, 123);
    assert_status(llmem_limit_resource_usage(NULL, &used, &lim), LLMEM_EINVAL);
    assert_status(llmem_limit_resource_usage(llmem_resource_default(), &used, &lim), LLMEM_EINVAL);
    assert_status(llmem_limit_resource_set(os, MiB), LLMEM_EINVAL);
    assert_status(llmem_limit_resource_set(NULL, MiB), LLMEM_EINVAL);
    llmem_resource *f;
    assert_ok(llmem_fault_resource_create(os, NULL, &f));
    assert_status(llmem_limit_resource_set(f, MiB), LLMEM_EINVAL);
    assert_status(llmem_limit_resource_usage(f, &used, NULL), LLMEM_EINVAL);
    llmem_resource_destroy(f);

    /* The good options work. */
    assert_ok(llmem_limit_resource_create(os, &o, &l));
    assert_ok(llmem_limit_resource_usage(l, &used, &lim));
    assert_int_equal(used, 0);
    assert_int_equal(lim, MiB);
    llmem_resource_destroy(l);
}

static void limit_inherits_info_over_os_and_sim(void **state)
{
    (void)state;
    llmem_resource *os = test_os_new();
    llmem_resource *l = new_limit(os, MiB, LLMEM_LIMIT_COMMITTED);
    assert_string_equal(llmem_resource_name(l), "limit(os)");
    assert_int_equal(llmem_resource_kind(l), LLMEM_MEM_HOST);
    assert_same_info(l, os);
    llmem_resource_destroy(l);
    llmem_resource_destroy(os);

    /* A sim-device with a granularity of its own. */
    llmem_resource *sim = new_sim(4 * MiB, 64 * KiB);
    l = new_limit(sim, 2 * MiB, LLMEM_LIMIT_COMMITTED);
    assert_string_equal(llmem_resource_name(l), "limit(sim-device)");
    assert_int_equal(llmem_resource_kind(l), LLMEM_MEM_DEVICE);
    assert_int_equal(llmem_resource_granularity(l), 64 * KiB);
    assert_same_info(l, sim);

    /* Works end to end: map, copy in and out, capped, sim's own figures agree. */
    char *d;
    assert_ok(llmem_resource_map(l, 100, 0, 0, (void **)&d)); /* rounds to 64 KiB */
    assert_int_equal(limit_used(l), 64 * KiB);
    assert_true(llmem_sim_resource_contains(sim, d, 64 * KiB));
    char in[1000], out[1000];
    fill(in, sizeof in, 5);
    memset(out, 0, sizeof out);
    assert_ok(llmem_resource_copy(l, d + 100, in, sizeof in));
    assert_ok(llmem_resource_copy(l, out, d + 100, sizeof out));
    assert_true(holds(out, sizeof out, 5));
    void *q = NULL;
    assert_status(llmem_resource_map(l, 2 * MiB, 0, 0, &q), LLMEM_ENOMEM);
    assert_error_mentions("limit(sim-device)");
    llmem_sim_stats ss = {0};
    assert_ok(llmem_sim_resource_get_stats(sim, &ss));
    assert_int_equal(ss.used_bytes, 64 * KiB);
    assert_int_equal(ss.oom_total, 0); /* the limit refused, not the device */

    /* The device refusing (its capacity below the cap) gives the claim back. */
    assert_ok(llmem_limit_resource_set(l, 64 * MiB));
    assert_status(llmem_resource_map(l, 8 * MiB, 0, 0, &q), LLMEM_ENOMEM);
    assert_error_mentions("sim-device");
    assert_int_equal(limit_used(l), 64 * KiB);
    assert_ok(llmem_sim_resource_get_stats(sim, &ss));
    assert_int_equal(ss.oom_total, 1);

    assert_ok(llmem_resource_unmap(l, d, 64 * KiB, 64 * KiB));
    limit_done(l);
    llmem_resource_destroy(sim);
}

/* ===== fault ============================================================== */

static llmem_resource *new_fault(llmem_resource *up, const llmem_fault_options *o)
{
    llmem_resource *f = NULL;
    assert_ok(llmem_fault_resource_create(up, o, &f));
    assert_non_null(f);
    return f;
}

/* Try one map of `size` through f; true if it succeeded (then unmap it at
 * once). A failure must be the injected one. */
static bool try_map(llmem_resource *f, size_t size, llmem_status want_fail)
{
    void *p = (void *)1;
    llmem_error_clear();
    llmem_status st = llmem_resource_map(f, size, 0, 0, &p);
    if (st == LLMEM_OK) {
        assert_non_null(p);
        assert_ok(llmem_resource_unmap(f, p, size, size));
        return true;
    }
    if (st != want_fail) fail_msg("map -> %s, expected %s (%s)", llmem_status_name(st), llmem_status_name(want_fail),
                                  llmem_error_message());
    assert_null(p);
    assert_error_mentions("injected");
    return false;
}

TEST_OS_CASE(fault_fail_nth)
{
}

TEST_OS_CASE(fault_fail_count_runs)
{
    llmem_fault_options o = llmem_fault_options_default();
    o.fail_nth = 2;
    o.fail_count = 3;
    llmem_resource *f = new_fault(os, &o);
    bool want[] = {true, false, false, false, true, true, true};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (try_map(f, page, LLMEM_ENOMEM) != want[i]) fail_msg("call %zu: expected %s", i + 1, want[i] ? "ok" : "failure");
    llmem_fault_stats fs = test_fault_stats(f);
    assert_int_equal(fs.calls_total, 7);
    assert_int_equal(fs.injected_total, 3);
    assert_int_equal(test_resource_stats(os).map_calls_total, 4);

    /* fail_count 0 means 1. */
    o.fail_count = 0;
    o.fail_nth = 1;
    assert_ok(llmem_fault_resource_arm(f, &o));
    assert_false(try_map(f, page, LLMEM_ENOMEM));
    assert_true(try_map(f, page, LLMEM_ENOMEM));
    llmem_resource_destroy(f);
}

TEST_OS_CASE(fault_fail_forever)
{
    llmem_fault_options o = llmem_fault_options_default();
    o.fail_nth = 3;
    o.fail_count = UINT64_MAX;
    llmem_resource *f = new_fault(os, &o);
    assert_true(try_map(f, page, LLMEM_ENOMEM));
    assert_true(try_map(f, page, LLMEM_ENOMEM));
    for (int i = 0; i < 200; i++) assert_false(try_map(f, page, LLMEM_ENOMEM));
    llmem_fault_stats fs = test_fault_stats(f);
    assert_int_equal(fs.calls_total, 202);
    assert_int_equal(fs.injected_total, 200);
    assert_int_equal(test_resource_stats(os).map_calls_total, 2);
    llmem_resource_destroy(f);
}

TEST_OS_CASE(fault_fail_after_bytes)
{
    llmem_fault_options o = llmem_fault_options_default();
    o.fail_after_bytes = 3 * page;
    llmem_resource *f = new_fault(os, &o);
    void *a, *b, *q = NULL;
    assert_status(llmem_resource_map(f, 4 * page, 0, 0, &q), LLMEM_ENOMEM); /* alone above the budget */
    assert_error_mentions("byte budget");
    assert_ok(llmem_resource_map(f, 2 * page, 0, 0, &a));
    assert_status(llmem_resource_map(f, 2 * page, 0, 0, &q), LLMEM_ENOMEM); /* would pass it */
    assert_ok(llmem_resource_map(f, page, 0, 0, &b));                       /* exactly at it */
    assert_status(llmem_resource_map(f, page, 0, 0, &q), LLMEM_ENOMEM);
    /* The budget is cumulative since arming: unmapping gives nothing back. */
    assert_ok(llmem_resource_unmap(f, b, page, page));
    assert_status(llmem_resource_map(f, page, 0, 0, &q), LLMEM_ENOMEM);
    /* A reservation adds no bytes; committing it does. */
    char *v;
    assert_ok(llmem_resource_map(f, 4 * page, 0, LLMEM_MAP_UNCOMMITTED, (void **)&v));
    assert_status(llmem_resource_commit(f, v, page), LLMEM_ENOMEM);
    assert_error_mentions("commit");
    llmem_fault_stats fs = test_fault_stats(f);
    assert_int_equal(fs.bytes_total, 3 * page);
    assert_int_equal(fs.calls_total, 8);
    assert_int_equal(fs.injected_total, 5);
    /* Re-arming resets the budget. */
    assert_ok(llmem_fault_resource_arm(f, &o));
    assert_ok(llmem_resource_commit(f, v, 3 * page));
    assert_status(llmem_resource_commit(f, v + 3 * page, page), LLMEM_ENOMEM);
    assert_ok(llmem_resource_unmap(f, v, 4 * page, 3 * page));
    assert_ok(llmem_resource_unmap(f, a, 2 * page, 2 * page));
    llmem_resource_destroy(f);
}

TEST_OS_CASE(fault_budget_counts_only_what_went_through)
{
    /* fault over a limit that refuses: those bytes were never mapped, so
     * they neither count in bytes_total nor eat the fault's budget. */
    llmem_resource *l = new_limit(os, 2 * page, LLMEM_LIMIT_COMMITTED);
    llmem_fault_options o = llmem_fault_options_default();
    o.fail_after_bytes = 4 * page;
    llmem_resource *f = new_fault(l, &o);
    void *a, *b, *q = NULL;
    for (int i = 0; i < 3; i++) {
        assert_status(llmem_resource_map(f, 3 * page, 0, 0, &q), LLMEM_ENOMEM);
        assert_error_mentions("limit(os)");
    }
    llmem_fault_stats fs = test_fault_stats(f);
    assert_int_equal(fs.calls_total, 3);
    assert_int_equal(fs.injected_total, 0);
    assert_int_equal(fs.bytes_total, 0);
    assert_ok(llmem_resource_map(f, 2 * page, 0, 0, &a));
    assert_int_equal(test_fault_stats(f).bytes_total, 2 * page);
    assert_ok(llmem_resource_unmap(f, a, 2 * page, 2 * page));
    assert_ok(llmem_resource_map(f, 2 * page, 0, 0, &b));
    assert_int_equal(test_fault_stats(f).bytes_total, 4 * page);
    assert_ok(llmem_resource_unmap(f, b, 2 * page, 2 * page));
    assert_status(llmem_resource_map(f, page, 0, 0, &q), LLMEM_ENOMEM);
    assert_error_mentions("byte budget");
    /* Commits refused upstream do not count either. */
    o.fail_after_bytes = 2 * page;
    assert_ok(llmem_fault_resource_arm(f, &o));
    char *v;
    assert_ok(llmem_resource_map(f, 4 * page, 0, LLMEM_MAP_UNCOMMITTED, (void **)&v));
    assert_status(llmem_resource_commit(f, v, 3 * page), LLMEM_ENOMEM); /* above the budget: injected */
    assert_error_mentions("byte budget");
    assert_ok(llmem_resource_map(f, page, 0, 0, &a)); /* the limit now holds one of its two pages */
    assert_status(llmem_resource_commit(f, v, 2 * page), LLMEM_ENOMEM); /* within the budget, over the cap */
    assert_error_mentions("limit(os)");
    assert_int_equal(test_fault_stats(f).bytes_total, page);
    assert_ok(llmem_resource_commit(f, v, page));
    assert_int_equal(test_fault_stats(f).bytes_total, 2 * page);
    assert_ok(llmem_resource_unmap(f, v, 4 * page, page));
    assert_ok(llmem_resource_unmap(f, a, page, page));
    llmem_resource_destroy(f);
    llmem_resource_destroy(l);
}

TEST_OS_CASE(fault_probability_one_always_fails)
{
    llmem_fault_options o = llmem_fault_options_default();
    o.probability = 1.0;
    llmem_resource *f = new_fault(os, &o);
    for (int i = 0; i < 100; i++) assert_false(try_map(f, page, LLMEM_ENOMEM));
    assert_error_mentions("random");
    assert_int_equal(test_fault_stats(f).injected_total, 100);
    assert_int_equal(test_resource_stats(os).map_calls_total, 0);
    /* And probability 0 is off. */
    o.probability = 0;
    assert_ok(llmem_fault_resource_arm(f, &o));
    for (int i = 0; i < 100; i++) assert_true(try_map(f, page, LLMEM_ENOMEM));
    assert_int_equal(test_fault_stats(f).injected_total, 0);
    assert_int_equal(test_fault_stats(f).calls_total, 100);
    llmem_resource_destroy(f);
}

/* The pass/fail pattern of 128 maps, as two 64-bit words. */
static void pattern_of(llmem_resource *f, size_t page, uint64_t out[2])
{
    out[0] = out[1] = 0;
    for (int i = 0; i < 128; i++)
        if (try_map(f, page, LLMEM_ENOMEM)) out[i / 64] |= 1ull << (i % 64);
}

static int popcount2(const uint64_t w[2]) { return __builtin_popcountll(w[0]) + __builtin_popcountll(w[1]); }

TEST_OS_CASE(fault_probability_is_seeded)
{
    llmem_fault_options o = llmem_fault_options_default();
    o.probability = 0.5;
    o.seed = 42;
    llmem_resource *f1 = new_fault(os, &o), *f2 = new_fault(os, &o);
    o.seed = 43;
    llmem_resource *f3 = new_fault(os, &o);
    uint64_t p1[2], p2[2], p3[2], p4[2];
    pattern_of(f1, page, p1);
    pattern_of(f2, page, p2);
    pattern_of(f3, page, p3);
    assert_memory_equal(p1, p2, sizeof p1);
    assert_memory_not_equal(p1, p3, sizeof p1);
    /* About half pass (128 draws at p = 0.5: well inside 32..96). */
    assert_in_range(popcount2(p1), 32, 96);
    assert_in_range(popcount2(p3), 32, 96);
    assert_int_equal(test_fault_stats(f1).injected_total, 128 - (uint64_t)popcount2(p1));
    /* Re-arming with the same seed replays the same sequence. */
    o.seed = 42;
    assert_ok(llmem_fault_resource_arm(f3, &o));
    pattern_of(f3, page, p4);
    assert_memory_equal(p1, p4, sizeof p1);
    /* Seed 0 picks a fixed default: two such resources agree. */
    o.seed = 0;
    assert_ok(llmem_fault_resource_arm(f1, &o));
    assert_ok(llmem_fault_resource_arm(f2, &o));
    pattern_of(f1, page, p1);
    pattern_of(f2, page, p2);
    assert_memory_equal(p1, p2, sizeof p1);
    assert_in_range(popcount2(p1), 32, 96);
    llmem_resource_destroy(f3);
    llmem_resource_destroy(f2);
    llmem_resource_destroy(f1);
}

TEST_OS_CASE(fault_ops_mask_copy_only)
{
    llmem_fault_options o = llmem_fault_options_default();
    o.ops = LLMEM_FAULT_OP_COPY;
    o.fail_nth = 1;
    o.fail_count = UINT64_MAX;
    llmem_resource *f = new_fault(os, &o);
    char *a, *b;
    for (int i = 0; i < 10; i++) assert_true(try_map(f, page, LLMEM_ENOMEM));
    assert_ok(llmem_resource_map(f, page, 0, 0, (void **)&a));
    assert_ok(llmem_resource_map(f, page, 0, 0, (void **)&b));
    fill(a, page, 1);
    memset(b, 0, page);
    llmem_error_clear();
    assert_status(llmem_resource_copy(f, b, a, page), LLMEM_ENOMEM);
    assert_error_mentions("injected");
    assert_error_mentions("copy");
    for (size_t i = 0; i < page; i++) assert_int_equal(b[i], 0); /* nothing was copied */
    assert_int_equal(test_resource_stats(os).copy_calls_total, 0);
    /* n == 0 is a no-op that never reaches the adaptor. */
    assert_ok(llmem_resource_copy(f, b, a, 0));
    llmem_fault_stats fs = test_fault_stats(f);
    assert_int_equal(fs.calls_total, 1);
    assert_int_equal(fs.injected_total, 1);
    assert_int_equal(fs.bytes_total, 0);
    assert_ok(llmem_resource_unmap(f, a, page, page));
    assert_ok(llmem_resource_unmap(f, b, page, page));
    llmem_resource_destroy(f);
}

TEST_OS_CASE(fault_unmap_failure_leaves_mapping_live)
{
    llmem_fault_options o = llmem_fault_options_default();
    o.ops = LLMEM_FAULT_OP_UNMAP;
    o.fail_nth = 1;
    llmem_resource *f = new_fault(os, &o);
    char *a;
    assert_ok(llmem_resource_map(f, 2 * page, 0, 0, (void **)&a));
    fill(a, 2 * page, 4);
    assert_status(llmem_resource_unmap(f, a, 2 * page, 2 * page), LLMEM_ENOMEM);
    assert_error_mentions("unmap");
    /* Still mapped upstream and in the adaptor's own counters. */
    llmem_resource_stats us = test_resource_stats(os);
    assert_int_equal(us.mappings, 1);
    assert_int_equal(us.unmap_calls_total, 0);
    assert_int_equal(test_resource_stats(f).mappings, 1);
    assert_int_equal(test_resource_stats(f).mapped_bytes, 2 * page);
    assert_true(holds(a, 2 * page, 4)); /* and usable */
    assert_ok(llmem_resource_unmap(f, a, 2 * page, 2 * page));
    assert_int_equal(test_resource_stats(os).mappings, 0);
    assert_int_equal(test_resource_stats(f).mappings, 0);
    llmem_fault_stats fs = test_fault_stats(f);
    assert_int_equal(fs.calls_total, 2);
    assert_int_equal(fs.injected_total, 1);

    /* Decommit too. */
    o.ops = LLMEM_FAULT_OP_DECOMMIT;
    assert_ok(llmem_fault_resource_arm(f, &o));
    assert_ok(llmem_resource_map(f, 2 * page, 0, 0, (void **)&a));
    fill(a, 2 * page, 6);
    assert_status(llmem_resource_decommit(f, a, page), LLMEM_ENOMEM);
    assert_int_equal(test_resource_stats(os).committed_bytes, 2 * page);
    assert_true(holds(a, 2 * page, 6)); /* contents kept: decommit never happened */
    assert_ok(llmem_resource_decommit(f, a, page));
    assert_int_equal(test_resource_stats(os).committed_bytes, page);
    assert_ok(llmem_resource_unmap(f, a, 2 * page, page));
    llmem_resource_destroy(f);
}

TEST_OS_CASE(fault_custom_status)
{
    llmem_fault_options o = llmem_fault_options_default();
    o.fail_nth = 1;
    o.status = LLMEM_EIO;
    llmem_resource *f = new_fault(os, &o);
    void *p = (void *)1;
    assert_status(llmem_resource_map(f, page, 0, 0, &p), LLMEM_EIO);
    assert_null(p);
    assert_error_mentions("LLMEM_EIO");
    assert_int_equal(llmem_error_status(), LLMEM_EIO);
    assert_int_equal(test_resource_stats(f).failures_total, 1);
    o.status = LLMEM_EDEVICE;
    o.ops = LLMEM_FAULT_OP_ALL;
    assert_ok(llmem_fault_resource_arm(f, &o));
    assert_status(llmem_resource_map(f, page, 0, 0, &p), LLMEM_EDEVICE);
    assert_true(try_map(f, page, LLMEM_ENOMEM));
    llmem_resource_destroy(f);
}

TEST_OS_CASE(fault_arm_resets_and_disarms)
{
    /* Created disarmed: counts, never fails. */
    llmem_resource *f = new_fault(os, NULL);
    for (int i = 0; i < 5; i++) assert_true(try_map(f, page, LLMEM_ENOMEM));
    llmem_fault_stats fs = test_fault_stats(f);
    assert_int_equal(fs.calls_total, 5);
    assert_int_equal(fs.injected_total, 0);
    assert_int_equal(fs.bytes_total, 5 * page);

    llmem_fault_options o = llmem_fault_options_default();
    o.fail_nth = 2;
    assert_ok(llmem_fault_resource_arm(f, &o));
    fs = test_fault_stats(f);
    assert_int_equal(fs.calls_total, 0);
    assert_int_equal(fs.injected_total, 0);
    assert_int_equal(fs.bytes_total, 0);
    assert_true(try_map(f, page, LLMEM_ENOMEM));
    assert_false(try_map(f, page, LLMEM_ENOMEM));
    assert_true(try_map(f, page, LLMEM_ENOMEM));
    /* Arming the same options again re-numbers from 1. */
    assert_ok(llmem_fault_resource_arm(f, &o));
    assert_true(try_map(f, page, LLMEM_ENOMEM));
    assert_false(try_map(f, page, LLMEM_ENOMEM));
    assert_int_equal(test_fault_stats(f).calls_total, 2);
    /* A bad arm keeps the old arming (and its counters). */
    llmem_fault_options bad = o;
    bad.probability = 2;
    assert_status(llmem_fault_resource_arm(f, &bad), LLMEM_EINVAL);
    assert_int_equal(test_fault_stats(f).calls_total, 2);
    assert_int_equal(test_fault_stats(f).injected_total, 1);
    /* NULL disarms. */
    assert_ok(llmem_fault_resource_arm(f, NULL));
    for (int i = 0; i < 20; i++) assert_true(try_map(f, page, LLMEM_ENOMEM));
    fs = test_fault_stats(f);
    assert_int_equal(fs.calls_total, 20);
    assert_int_equal(fs.injected_total, 0);
    /* A struct_size naming a shorter struct gets only that prefix. */
    llmem_fault_stats shortst;
    memset(&shortst, 0xAB, sizeof shortst);
    shortst.struct_size = offsetof(llmem_fault_stats, injected_total);
    assert_ok(llmem_fault_resource_get_stats(f, &shortst));
    assert_int_equal(shortst.struct_size, offsetof(llmem_fault_stats, injected_total));
    assert_int_equal(shortst.calls_total, 20);
    assert_int_equal(shortst.injected_total, 0xABABABABABABABABull);
    llmem_resource_destroy(f);
}

TEST_OS_CASE(fault_bad_options_and_wrong_resources)
{
    llmem_fault_options o = llmem_fault_options_default();
    assert_int_equal(o.ops, LLMEM_FAULT_OP_MAP | LLMEM_FAULT_OP_COMMIT);
    assert_int_equal(o.status, LLMEM_ENOMEM);
    llmem_fault_options bad[8];
    for (int i = 0; i < 8; i++) bad[i] = o;
    bad[0].probability = 1.5;
    bad[1].probability = NAN;
    bad[2].probability = -0.25;
    bad[3].ops = LLMEM_FAULT_OP_ALL + 1;
    bad[4].ops = 1u << 31;
    bad[5].status = LLMEM_STATUS_COUNT_;
    bad[6].status = (llmem_status)-3;
    bad[7].probability = INFINITY;
    llmem_resource *f;
    for (int i = 0; i < 8; i++) {
        f = (llmem_resource *)1;
        llmem_error_clear();
        if (llmem_fault_resource_create(os, &bad[i], &f) != LLMEM_EINVAL) fail_msg("bad option set %d accepted", i);
        assert_null(f);
        assert_true(llmem_error_message()[0] != '\0');
    }
    f = (llmem_resource *)1;
    assert_status(llmem_fault_resource_create(NULL, &o, &f), LLMEM_EINVAL);
    assert_null(f);
    assert_status(llmem_fault_resource_create(os, &o, NULL), LLMEM_EINVAL);

    f = new_fault(os, &o);
    for (int i = 0; i < 8; i++)
        if (llmem_fault_resource_arm(f, &bad[i]) != LLMEM_EINVAL) fail_msg("bad option set %d accepted by arm", i);
    /* Limits of the valid range are accepted. */
    o.probability = 1.0;
    o.ops = LLMEM_FAULT_OP_ALL;
    o.status = LLMEM_EDEVICE;
    assert_ok(llmem_fault_resource_arm(f, &o));

    /* arm / stats on something that is not a fault resource. */
    llmem_fault_stats fs;
    memset(&fs, 0, sizeof fs);
    assert_status(llmem_fault_resource_arm(os, NULL), LLMEM_EINVAL);
    assert_status(llmem_fault_resource_arm(NULL, NULL), LLMEM_EINVAL);
    assert_status(llmem_fault_resource_arm(llmem_resource_default(), &o), LLMEM_EINVAL);
    assert_status(llmem_fault_resource_get_stats(os, &fs), LLMEM_EINVAL);
    assert_status(llmem_fault_resource_get_stats(NULL, &fs), LLMEM_EINVAL);
    assert_status(llmem_fault_resource_get_stats(f, NULL), LLMEM_EINVAL);
    llmem_resource *l = new_limit(os, MiB, LLMEM_LIMIT_COMMITTED);
    assert_status(llmem_fault_resource_arm(l, NULL), LLMEM_EINVAL);
    assert_status(llmem_fault_resource_get_stats(l, &fs), LLMEM_EINVAL);
    llmem_resource_destroy(l);
    llmem_resource_destroy(f);
}

static void fault_over_sim_device(void **state)
{
    (void)state;
    llmem_resource *sim = new_sim(0, 0);
    size_t g = llmem_resource_granularity(sim);
    llmem_fault_options o = llmem_fault_options_default();
    o.ops = LLMEM_FAULT_OP_COMMIT;
    o.fail_nth = 2;
    llmem_resource *f = new_fault(sim, &o);
    assert_string_equal(llmem_resource_name(f), "fault(sim-device)");
    assert_int_equal(llmem_resource_kind(f), LLMEM_MEM_DEVICE);
    assert_same_info(f, sim);
    char *d;
    assert_ok(llmem_resource_map(f, 4 * g, 0, LLMEM_MAP_UNCOMMITTED, (void **)&d));
    assert_ok(llmem_resource_commit(f, d, g));
    assert_status(llmem_resource_commit(f, d + g, g), LLMEM_ENOMEM);
    /* The device never saw the failed commit: copying there is refused. */
    char buf[64] = {0};
    assert_status(llmem_resource_copy(f, d + g, buf, sizeof buf), LLMEM_EINVAL);
    assert_ok(llmem_resource_commit(f, d + g, g));
    assert_ok(llmem_resource_copy(f, d + g, buf, sizeof buf));
    llmem_sim_stats ss = {0};
    assert_ok(llmem_sim_resource_get_stats(sim, &ss));
    assert_int_equal(ss.used_bytes, 2 * g);
    assert_ok(llmem_resource_unmap(f, d, 4 * g, 2 * g));
    assert_ok(llmem_sim_resource_get_stats(sim, &ss));
    assert_int_equal(ss.used_bytes, 0);
    llmem_resource_destroy(f);
    llmem_resource_destroy(sim);
}

/* ===== tracking =========================================================== */

typedef struct seen {
    size_t n, stop_after;
    llmem_tracking_entry e[16];
    char tags[16][32];
} seen;

static bool collect(void *user, const llmem_tracking_entry *e)
{
    seen *s = user;
    assert_true(s->n < 16);
    s->e[s->n] = *e;
    snprintf(s->tags[s->n], sizeof s->tags[0], "%s", e->tag);
    s->e[s->n].tag = s->tags[s->n];
    s->n++;
    return !s->stop_after || s->n < s->stop_after;
}

static llmem_resource *new_tracking(llmem_resource *up)
{
    llmem_resource *t = NULL;
    assert_ok(llmem_tracking_resource_create(up, &t));
    assert_non_null(t);
    return t;
}

TEST_OS_CASE(tracking_foreach_oldest_first)
{
    llmem_resource *t = new_tracking(os);
    assert_string_equal(llmem_resource_name(t), "tracking(os)");
    assert_same_info(t, os);

    /* Six mappings with distinct sizes; the tag is copied at map time. */
    char tag[40] = {0};
    void *p[6];
    const char *tags[6] = {"kv", "arena", "", "weights", "kv", "a-tag-longer-than-thirty-one-bytes!!"};
    for (int i = 0; i < 6; i++) {
        snprintf(tag, sizeof tag, "%s", tags[i]);
        unsigned flags = i == 1 ? LLMEM_MAP_UNCOMMITTED : 0;
        assert_ok(llmem_resource_map_tagged(t, (size_t)(i + 1) * page, 0, flags, i == 2 ? NULL : tag, &p[i]));
        memset(tag, 'X', sizeof tag - 1);
    }
    assert_ok(llmem_resource_commit(t, (char *)p[1] + page, page)); /* 1 of arena's 2 pages */

    seen s;
    memset(&s, 0, sizeof s);
    assert_ok(llmem_tracking_resource_foreach(t, collect, &s));
    assert_int_equal(s.n, 6);
    for (size_t i = 0; i < 6; i++) {
        assert_int_equal(s.e[i].seq, i + 1);
        assert_ptr_equal(s.e[i].ptr, p[i]);
        assert_int_equal(s.e[i].size, (i + 1) * page);
        assert_int_equal(s.e[i].committed, i == 1 ? page : (i + 1) * page);
    }
    assert_string_equal(s.tags[0], "kv");
    assert_string_equal(s.tags[1], "arena");
    assert_string_equal(s.tags[2], "");
    assert_string_equal(s.tags[3], "weights");
    assert_string_equal(s.tags[4], "kv");
    assert_int_equal(strlen(s.tags[5]), 31); /* truncated, not overflowed */
    assert_memory_equal(s.tags[5], tags[5], 31);

    /* Early stop. */
    memset(&s, 0, sizeof s);
    s.stop_after = 2;
    assert_ok(llmem_tracking_resource_foreach(t, collect, &s));
    assert_int_equal(s.n, 2);
    assert_int_equal(s.e[1].seq, 2);

    /* Unmap the oldest and the middle: order and seq of the rest hold, a new
     * mapping gets the next seq. */
    assert_ok(llmem_resource_unmap(t, p[0], page, page));
    assert_ok(llmem_resource_unmap(t, p[3], 4 * page, 4 * page));
    void *n;
    assert_ok(llmem_resource_map_tagged(t, page, 0, 0, "late", &n));
    memset(&s, 0, sizeof s);
    assert_ok(llmem_tracking_resource_foreach(t, collect, &s));
    assert_int_equal(s.n, 5);
    uint64_t want_seq[] = {2, 3, 5, 6, 7};
    for (size_t i = 0; i < 5; i++) assert_int_equal(s.e[i].seq, want_seq[i]);
    assert_string_equal(s.tags[4], "late");
    assert_ptr_equal(s.e[4].ptr, n);

    llmem_tracking_stats ts = test_tracking_stats(t);
    assert_int_equal(ts.struct_size, sizeof ts);
    assert_int_equal(ts.live_mappings, 5);
    assert_int_equal(ts.live_bytes, (2 + 3 + 5 + 6 + 1) * page);
    assert_int_equal(ts.refused_total, 0);

    assert_ok(llmem_resource_unmap(t, p[1], 2 * page, page));
    assert_ok(llmem_resource_unmap(t, p[2], 3 * page, 3 * page));
    assert_ok(llmem_resource_unmap(t, p[4], 5 * page, 5 * page));
    assert_ok(llmem_resource_unmap(t, p[5], 6 * page, 6 * page));
    assert_ok(llmem_resource_unmap(t, n, page, page));
    memset(&s, 0, sizeof s);
    assert_ok(llmem_tracking_resource_foreach(t, collect, &s));
    assert_int_equal(s.n, 0);
    assert_int_equal(test_tracking_stats(t).live_bytes, 0);
    llmem_resource_destroy(t);
}

/* Read a whole stream back into a malloc'ed string. */
static char *slurp(FILE *f)
{
    fflush(f);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    return buf;
}

static size_t count_lines(const char *s, const char *needle)
{
    size_t n = 0;
    for (const char *p = s; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
    return n;
}

/* Destroyed with live mappings, a tracking resource says so (it used to be
 * silent): an error line with the count and bytes, then each mapping; none
 * when everything was returned. */
TEST_OS_CASE(tracking_destroy_reports_live_mappings)
{
    llmem_resource *t = new_tracking(os);
    void *a, *b, *c;
    assert_ok(llmem_resource_map_tagged(t, 3 * page, 0, 0, "kv-cache", &a));
    assert_ok(llmem_resource_map_tagged(t, page, 0, 0, "scratch", &b));
    assert_ok(llmem_resource_map(t, page, 0, 0, &c));
    assert_ok(llmem_resource_unmap(t, c, page, page));
    static test_log_capture cap;
    test_log_capture_start(&cap, LLMEM_LOG_DEBUG);
    llmem_resource_destroy(t);
    llmem_log_set(NULL, NULL, LLMEM_LOG_WARN);
    assert_int_equal(cap.errors, 3); /* the summary and two mappings */
    char want[160];
    snprintf(want, sizeof want, "destroyed with 2 live mappings (%zu bytes)", 4 * page);
    if (!strstr(cap.text, want)) fail_msg("no summary '%s' in: %s", want, cap.text);
    snprintf(want, sizeof want, "%zu bytes at %p (tag 'kv-cache'", 3 * page, a);
    if (!strstr(cap.text, want)) fail_msg("no line '%s' in: %s", want, cap.text);
    snprintf(want, sizeof want, "%zu bytes at %p (tag 'scratch'", page, b);
    if (!strstr(cap.text, want)) fail_msg("no line '%s' in: %s", want, cap.text);
    /* Left mapped upstream: the caller's leak to clean up. */
    memset(a, 1, 3 * page);
    assert_ok(llmem_resource_unmap(os, a, 3 * page, 3 * page));
    assert_ok(llmem_resource_unmap(os, b, page, page));
    /* Nothing live: nothing said. */
    t = new_tracking(os);
    assert_ok(llmem_resource_map(t, page, 0, 0, &c));
    assert_ok(llmem_resource_unmap(t, c, page, page));
    test_log_capture_start(&cap, LLMEM_LOG_DEBUG);
    llmem_resource_destroy(t);
    llmem_log_set(NULL, NULL, LLMEM_LOG_WARN);
    assert_int_equal(cap.len, 0);
}

TEST_OS_CASE(tracking_report_lists_leaks)
{
    llmem_resource *t = new_tracking(os);
    void *a, *b, *c;
    assert_ok(llmem_resource_map_tagged(t, 3 * page, 0, 0, "kv-cache", &a));
    assert_ok(llmem_resource_map_tagged(t, page, 0, LLMEM_MAP_UNCOMMITTED, "scratch", &b));
    assert_ok(llmem_resource_map(t, 2 * page, 0, 0, &c));

    FILE *f = tmpfile();
    assert_non_null(f);
    size_t leaks = 0;
    assert_ok(llmem_tracking_resource_report(t, f, &leaks));
    assert_int_equal(leaks, 3);
    char *text = slurp(f);
    fclose(f);
    assert_int_equal(count_lines(text, "\n"), 4); /* three mappings and the summary */
    assert_int_equal(count_lines(text, "leak"), 3);
    char line[128];
    snprintf(line, sizeof line, "%zu bytes at %p (tag 'kv-cache'", 3 * page, a);
    const char *la = strstr(text, line);
    assert_non_null(la);
    snprintf(line, sizeof line, "%zu bytes at %p (tag 'scratch'", page, b);
    const char *lb = strstr(text, line);
    assert_non_null(lb);
    snprintf(line, sizeof line, "%zu bytes at %p (tag '-'", 2 * page, c);
    const char *lc = strstr(text, line);
    assert_non_null(lc);
    assert_true(la < lb && lb < lc); /* oldest first */
    const char *zero = strstr(lb, ", 0 committed)");
    assert_non_null(zero);
    assert_true(zero < lc);
    /* The summary is last and names the resource and the count. */
    const char *last = strrchr(text, '\n');
    while (last > text && last[-1] != '\n') last--;
    assert_true(last > lc);
    assert_non_null(strstr(last, "tracking(os)"));
    assert_non_null(strstr(last, "3 live mappings"));
    snprintf(line, sizeof line, "%zu bytes", 6 * page);
    assert_non_null(strstr(last, line));
    free(text);

    /* leaks is optional. */
    f = tmpfile();
    assert_non_null(f);
    assert_ok(llmem_tracking_resource_report(t, f, NULL));
    fclose(f);

    assert_ok(llmem_resource_unmap(t, a, 3 * page, 3 * page));
    assert_ok(llmem_resource_unmap(t, b, page, 0));
    assert_ok(llmem_resource_unmap(t, c, 2 * page, 2 * page));
    f = tmpfile();
    assert_non_null(f);
    leaks = 99;
    assert_ok(llmem_tracking_resource_report(t, f, &leaks));
    assert_int_equal(leaks, 0);
    text = slurp(f);
    fclose(f);
    assert_int_equal(count_lines(text, "\n"), 1);
    assert_null(strstr(text, "leak"));
    assert_non_null(strstr(text, "0 live mappings"));
    free(text);
    llmem_resource_destroy(t);
}

TEST_OS_CASE(tracking_refuses_what_would_corrupt_upstream)
{
    llmem_resource *t = new_tracking(os);
    char *mine, *foreign, *res;
    assert_ok(llmem_resource_map_tagged(t, 4 * page, 0, 0, "mine", (void **)&mine));
    assert_ok(llmem_resource_map(os, 2 * page, 0, 0, (void **)&foreign)); /* behind its back */
    assert_ok(llmem_resource_map_tagged(t, 4 * page, 0, LLMEM_MAP_UNCOMMITTED, "res", (void **)&res));
    fill(mine, 4 * page, 1);
    fill(foreign, 2 * page, 2);
    llmem_resource_stats up = test_resource_stats(os);
    uint64_t refused = 0;

    /* A pointer it never mapped, and one inside a mapping it did. */
    llmem_error_clear();
    assert_status(llmem_resource_unmap(t, foreign, 2 * page, 2 * page), LLMEM_EFOREIGN);
    assert_error_mentions("never mapped");
    refused++;
    assert_status(llmem_resource_unmap(t, mine + page, 3 * page, 3 * page), LLMEM_EFOREIGN);
    refused++;
    /* Wrong sizes. */
    assert_status(llmem_resource_unmap(t, mine, 2 * page, 2 * page), LLMEM_EINVAL);
    assert_error_mentions("mine");
    refused++;
    assert_status(llmem_resource_unmap(t, mine, 8 * page, 4 * page), LLMEM_EINVAL);
    refused++;
    /* A committed figure that disagrees with what it saw. */
    assert_status(llmem_resource_unmap(t, mine, 4 * page, 3 * page), LLMEM_EINVAL);
    assert_error_mentions("committed");
    refused++;
    assert_status(llmem_resource_unmap(t, res, 4 * page, page), LLMEM_EINVAL);
    refused++;
    /* Commit ranges outside any mapping, or past the end of one. */
    assert_status(llmem_resource_commit(t, foreign, page), LLMEM_EINVAL);
    assert_error_mentions("outside");
    refused++;
    assert_status(llmem_resource_commit(t, res, 5 * page), LLMEM_EINVAL);
    refused++;
    assert_status(llmem_resource_commit(t, res + 3 * page, 2 * page), LLMEM_EINVAL);
    refused++;
    /* More than the mapping holds uncommitted. */
    assert_ok(llmem_resource_commit(t, res, 3 * page));
    assert_status(llmem_resource_commit(t, res, 2 * page), LLMEM_EINVAL);
    refused++;
    assert_status(llmem_resource_commit(t, mine, page), LLMEM_EINVAL); /* all committed already */
    refused++;
    /* Decommit more than is committed, or outside. */
    assert_status(llmem_resource_decommit(t, res, 4 * page), LLMEM_EINVAL);
    refused++;
    assert_status(llmem_resource_decommit(t, foreign, page), LLMEM_EINVAL);
    refused++;

    /* None of it reached upstream. */
    llmem_resource_stats up2 = test_resource_stats(os);
    assert_int_equal(up2.unmap_calls_total, up.unmap_calls_total);
    assert_int_equal(up2.commit_calls_total, up.commit_calls_total + 1); /* the good commit */
    assert_int_equal(up2.decommit_calls_total, up.decommit_calls_total);
    assert_int_equal(up2.failures_total, up.failures_total);
    assert_int_equal(up2.mappings, 3);
    assert_true(holds(mine, 4 * page, 1));
    assert_true(holds(foreign, 2 * page, 2));
    llmem_tracking_stats ts = test_tracking_stats(t);
    assert_int_equal(ts.refused_total, refused);
    assert_int_equal(ts.live_mappings, 2);
    assert_int_equal(ts.live_bytes, 8 * page);
    /* The tracking resource's wrapper counted every refusal as a failure. */
    assert_int_equal(test_resource_stats(t).failures_total, refused);

    /* Everything is still live and tracked, with the right figures. */
    seen s;
    memset(&s, 0, sizeof s);
    assert_ok(llmem_tracking_resource_foreach(t, collect, &s));
    assert_int_equal(s.n, 2);
    assert_ptr_equal(s.e[0].ptr, mine);
    assert_int_equal(s.e[0].committed, 4 * page);
    assert_ptr_equal(s.e[1].ptr, res);
    assert_int_equal(s.e[1].committed, 3 * page);

    /* The right calls go through. */
    assert_ok(llmem_resource_decommit(t, mine, page));
    assert_ok(llmem_resource_unmap(t, mine, 4 * page, 3 * page));
    assert_ok(llmem_resource_unmap(t, res, 4 * page, 3 * page));
    assert_ok(llmem_resource_unmap(os, foreign, 2 * page, 2 * page));
    assert_int_equal(test_tracking_stats(t).live_mappings, 0);
    assert_int_equal(test_tracking_stats(t).refused_total, refused);
    llmem_resource_destroy(t);
}

TEST_OS_CASE(tracking_upstream_failure_keeps_mapping)
{
    /* An unmap refused upstream (an injected fault) is not a refusal of the
     * tracker's: the mapping stays tracked, and unmapping later works. */
    llmem_fault_options o = llmem_fault_options_default();
    o.ops = LLMEM_FAULT_OP_UNMAP | LLMEM_FAULT_OP_MAP | LLMEM_FAULT_OP_COMMIT;
    o.fail_nth = 2;
    o.fail_count = 2;
    llmem_resource *f = new_fault(os, &o);
    llmem_resource *t = new_tracking(f);
    void *a, *q = NULL;
    assert_ok(llmem_resource_map(t, 2 * page, 0, LLMEM_MAP_UNCOMMITTED, &a)); /* call 1 */
    assert_status(llmem_resource_commit(t, a, page), LLMEM_ENOMEM);          /* call 2 */
    assert_status(llmem_resource_unmap(t, a, 2 * page, 0), LLMEM_ENOMEM);    /* call 3 */
    llmem_tracking_stats ts = test_tracking_stats(t);
    assert_int_equal(ts.live_mappings, 1);
    assert_int_equal(ts.live_bytes, 2 * page);
    assert_int_equal(ts.refused_total, 0);
    seen s;
    memset(&s, 0, sizeof s);
    assert_ok(llmem_tracking_resource_foreach(t, collect, &s));
    assert_int_equal(s.n, 1);
    assert_int_equal(s.e[0].committed, 0); /* the failed commit did not count */
    assert_ok(llmem_resource_commit(t, a, page));
    assert_ok(llmem_resource_unmap(t, a, 2 * page, page));
    /* A map failing upstream is not recorded. */
    assert_ok(llmem_fault_resource_arm(f, &(llmem_fault_options){.fail_nth = 1}));
    assert_status(llmem_resource_map(t, page, 0, 0, &q), LLMEM_ENOMEM);
    ts = test_tracking_stats(t);
    assert_int_equal(ts.live_mappings, 0);
    assert_int_equal(ts.live_bytes, 0);
    assert_int_equal(ts.peak_mappings, 1);
    llmem_resource_destroy(t);
    llmem_resource_destroy(f);
}

static void tracking_committed_figure_is_rounded(void **state)
{
    (void)state;
    /* A caller that unmaps with the sizes it asked map for (one byte, all of
     * it committed) is right by the contract; the tracker agrees and hands
     * upstream the figure in whole granules. */
    llmem_resource *sim = new_sim(0, 0), *t = new_tracking(sim);
    size_t g = llmem_resource_granularity(sim);
    void *a, *b;
    assert_ok(llmem_resource_map(t, 1, 0, 0, &a));
    assert_ok(llmem_resource_map(t, g + 1, 0, 0, &b));
    assert_status(llmem_resource_unmap(t, a, 1, 0), LLMEM_EINVAL); /* a page is committed, not 0 */
    assert_ok(llmem_resource_unmap(t, a, 1, 1));
    assert_ok(llmem_resource_unmap(t, b, g + 1, g + 1));
    llmem_sim_stats ss = {0};
    assert_ok(llmem_sim_resource_get_stats(sim, &ss));
    assert_int_equal(ss.used_bytes, 0);
    assert_int_equal(test_resource_stats(sim).committed_bytes, 0);
    assert_int_equal(test_tracking_stats(t).live_mappings, 0);
    assert_int_equal(test_tracking_stats(t).refused_total, 1);
    llmem_resource_destroy(t);
    llmem_resource_destroy(sim);
}

/* A resource whose unmap can be held at a gate and then refused, to put an
 * unmap in flight while other threads map. */
typedef struct gate_resource {
    llmem_resource base;
    llmem_resource *up;
    sem_t entered, release;
    int hold; /* next unmap waits at the gate and fails */
} gate_resource;

static llmem_status gate_map(llmem_resource *r, size_t size, size_t align, unsigned flags, const char *tag, void **out)
{
    return llmem_resource_map_tagged(((gate_resource *)r)->up, size, align, flags, tag, out);
}

static llmem_status gate_unmap(llmem_resource *r, void *ptr, size_t size, size_t committed)
{
    gate_resource *g = (gate_resource *)r;
    if (__atomic_exchange_n(&g->hold, 0, __ATOMIC_ACQ_REL)) {
        sem_post(&g->entered);
        sem_wait(&g->release);
        return llmem_error_set(LLMEM_EIO, "gate: unmap refused");
    }
    return llmem_resource_unmap(g->up, ptr, size, committed);
}

static const llmem_resource_ops gate_ops = {.map = gate_map, .unmap = gate_unmap};

typedef struct unmap_job {
    llmem_resource *t;
    void *p;
    size_t size;
    llmem_status st;
} unmap_job;

static void *unmap_thread(void *arg)
{
    unmap_job *j = arg;
    j->st = llmem_resource_unmap(j->t, j->p, j->size, j->size);
    return NULL;
}

TEST_OS_CASE(tracking_unmap_refused_while_others_map)
{
    gate_resource g;
    memset(&g, 0, sizeof g);
    llmem_resource_init(&g.base, &gate_ops, "gate", LLMEM_MEM_HOST, page, page, LLMEM_MAX_ALIGN, 0);
    g.up = os;
    sem_init(&g.entered, 0, 0);
    sem_init(&g.release, 0, 0);
    llmem_resource *t = new_tracking(&g.base);
    assert_string_equal(llmem_resource_name(t), "tracking(gate)");

    /* Fill the tracker's table to a power of two (its growth steps). */
    enum { N = 32 };
    void *p[N + 1];
    for (int i = 0; i < N; i++) assert_ok(llmem_resource_map(t, page, 0, 0, &p[i]));
    /* One unmap goes in flight and waits upstream... */
    __atomic_store_n(&g.hold, 1, __ATOMIC_RELEASE);
    unmap_job j = {t, p[0], page, LLMEM_OK};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, unmap_thread, &j), 0);
    sem_wait(&g.entered);
    assert_int_equal(test_tracking_stats(t).live_mappings, N - 1);
    /* ...while another map takes its slot; then upstream refuses the unmap
     * and the tracker must put the mapping back without overflowing. */
    assert_ok(llmem_resource_map(t, page, 0, 0, &p[N]));
    sem_post(&g.release);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(j.st, LLMEM_EIO);
    llmem_tracking_stats ts = test_tracking_stats(t);
    assert_int_equal(ts.live_mappings, N + 1);
    assert_int_equal(ts.live_bytes, (N + 1) * page);
    assert_int_equal(ts.refused_total, 0);
    /* N + 1 live now, though no map saw more than N: the peaks follow. */
    assert_int_equal(ts.peak_mappings, N + 1);
    assert_int_equal(ts.peak_bytes, (N + 1) * page);
    seen s;
    memset(&s, 0, sizeof s);
    s.stop_after = 1;
    assert_ok(llmem_tracking_resource_foreach(t, collect, &s));
    assert_ptr_equal(s.e[0].ptr, p[0]); /* back, with its age */
    assert_int_equal(s.e[0].seq, 1);
    for (int i = 0; i <= N; i++) assert_ok(llmem_resource_unmap(t, p[i], page, page));
    assert_int_equal(test_tracking_stats(t).live_mappings, 0);
    assert_int_equal(test_resource_stats(os).mappings, 0);
    llmem_resource_destroy(t);
    sem_destroy(&g.entered);
    sem_destroy(&g.release);
}

TEST_OS_CASE(tracking_peaks)
{
    llmem_resource *t = new_tracking(os);
    void *p[5];
    assert_ok(llmem_resource_map(t, 2 * page, 0, 0, &p[0]));
    assert_ok(llmem_resource_map(t, 3 * page, 0, 0, &p[1]));
    assert_ok(llmem_resource_map(t, 4 * page, 0, 0, &p[2]));
    assert_ok(llmem_resource_unmap(t, p[1], 3 * page, 3 * page));
    assert_ok(llmem_resource_unmap(t, p[2], 4 * page, 4 * page));
    assert_ok(llmem_resource_map(t, 8 * page, 0, 0, &p[3]));
    llmem_tracking_stats ts = test_tracking_stats(t);
    assert_int_equal(ts.peak_mappings, 3);
    assert_int_equal(ts.peak_bytes, 10 * page); /* 2 + 8 beats 2 + 3 + 4 */
    assert_int_equal(ts.live_bytes, 10 * page);
    assert_int_equal(ts.live_mappings, 2);
    assert_ok(llmem_resource_map(t, page, 0, 0, &p[4]));
    assert_ok(llmem_resource_unmap(t, p[0], 2 * page, 2 * page));
    assert_ok(llmem_resource_unmap(t, p[3], 8 * page, 8 * page));
    assert_ok(llmem_resource_unmap(t, p[4], page, page));
    ts = test_tracking_stats(t);
    assert_int_equal(ts.peak_mappings, 3);
    assert_int_equal(ts.peak_bytes, 11 * page);
    assert_int_equal(ts.live_bytes, 0);
    assert_int_equal(ts.live_mappings, 0);
    /* Many mappings (the table grows). */
    void *many[100];
    for (int i = 0; i < 100; i++) assert_ok(llmem_resource_map(t, page, 0, 0, &many[i]));
    assert_int_equal(test_tracking_stats(t).peak_mappings, 100);
    for (int i = 0; i < 100; i += 2) assert_ok(llmem_resource_unmap(t, many[i], page, page));
    for (int i = 1; i < 100; i += 2) assert_ok(llmem_resource_unmap(t, many[i], page, page));
    assert_int_equal(test_tracking_stats(t).live_mappings, 0);
    llmem_resource_destroy(t);
}

TEST_OS_CASE(tracking_wrong_resources)
{
    llmem_tracking_stats ts;
    memset(&ts, 0, sizeof ts);
    assert_status(llmem_tracking_resource_get_stats(os, &ts), LLMEM_EINVAL);
    assert_status(llmem_tracking_resource_get_stats(NULL, &ts), LLMEM_EINVAL);
    assert_status(llmem_tracking_resource_get_stats(llmem_resource_default(), &ts), LLMEM_EINVAL);
    seen s;
    memset(&s, 0, sizeof s);
    assert_status(llmem_tracking_resource_foreach(os, collect, &s), LLMEM_EINVAL);
    size_t leaks = 7;
    assert_status(llmem_tracking_resource_report(os, stderr, &leaks), LLMEM_EINVAL);
    assert_int_equal(leaks, 7);
    llmem_resource *t = (llmem_resource *)1;
    assert_status(llmem_tracking_resource_create(NULL, &t), LLMEM_EINVAL);
    assert_null(t);
    assert_status(llmem_tracking_resource_create(os, NULL), LLMEM_EINVAL);
    t = new_tracking(os);
    assert_status(llmem_tracking_resource_get_stats(t, NULL), LLMEM_EINVAL);
    assert_status(llmem_tracking_resource_foreach(t, NULL, NULL), LLMEM_EINVAL);
    assert_status(llmem_tracking_resource_report(t, NULL, &leaks), LLMEM_EINVAL);
    llmem_resource *l = new_limit(t, MiB, LLMEM_LIMIT_COMMITTED);
    assert_status(llmem_tracking_resource_get_stats(l, &ts), LLMEM_EINVAL);
    llmem_resource_destroy(l);
    /* The schema describes the struct. */
    const llmem_stats_schema *sc = llmem_tracking_stats_schema();
    assert_non_null(sc);
    assert_int_equal(sc->struct_size, sizeof(llmem_tracking_stats));
    llmem_resource_destroy(t);
}

static void tracking_over_sim_device(void **state)
{
    (void)state;
    llmem_resource *sim = new_sim(0, 0), *t = new_tracking(sim);
    size_t g = llmem_resource_granularity(sim);
    assert_string_equal(llmem_resource_name(t), "tracking(sim-device)");
    assert_same_info(t, sim);
    char *d;
    assert_ok(llmem_resource_map_tagged(t, 4 * g, 0, LLMEM_MAP_UNCOMMITTED, "dev", (void **)&d));
    assert_ok(llmem_resource_commit(t, d + g, 2 * g));
    assert_ok(llmem_resource_decommit(t, d + 2 * g, g));
    seen s;
    memset(&s, 0, sizeof s);
    assert_ok(llmem_tracking_resource_foreach(t, collect, &s));
    assert_int_equal(s.n, 1);
    assert_int_equal(s.e[0].committed, g);
    assert_string_equal(s.tags[0], "dev");
    /* Tracking refuses the wrong figure before the device has to. */
    llmem_sim_stats ss = {0};
    assert_status(llmem_resource_unmap(t, d, 4 * g, 2 * g), LLMEM_EINVAL);
    assert_error_mentions("tracking(sim-device)");
    assert_ok(llmem_resource_unmap(t, d, 4 * g, g));
    assert_ok(llmem_sim_resource_get_stats(sim, &ss));
    assert_int_equal(ss.used_bytes, 0);
    assert_int_equal(test_tracking_stats(t).live_mappings, 0);
    llmem_resource_destroy(t);
    llmem_resource_destroy(sim);
}

/* ===== stacks ============================================================= */

typedef struct stack {
    llmem_resource *sim, *track, *limit, *fault;
} stack;

static stack build_stack(size_t limit)
{
    stack s;
    s.sim = new_sim(64 * MiB, 0);
    s.track = new_tracking(s.sim);
    s.limit = new_limit(s.track, limit, LLMEM_LIMIT_COMMITTED);
    s.fault = new_fault(s.limit, NULL);
    return s;
}

static void destroy_stack(stack *s)
{
    llmem_resource_destroy(s->fault);
    llmem_resource_destroy(s->limit);
    llmem_resource_destroy(s->track);
    llmem_resource_destroy(s->sim);
}

static void stack_names_and_info(void **state)
{
    (void)state;
    stack s = build_stack(MiB);
    assert_string_equal(llmem_resource_name(s.fault), "fault(limit(tracking(sim-device)))");
    assert_int_equal(llmem_resource_kind(s.fault), LLMEM_MEM_DEVICE);
    assert_same_info(s.fault, s.sim);
    assert_same_info(s.limit, s.sim);
    /* Every layer keeps its own honest counters. */
    void *p;
    assert_ok(llmem_resource_map_tagged(s.fault, 100 * KiB, 0, 0, "x", &p));
    size_t g = llmem_resource_granularity(s.sim), rounded = (100 * KiB + g - 1) / g * g;
    llmem_resource *layers[] = {s.fault, s.limit, s.track, s.sim};
    for (int i = 0; i < 4; i++) {
        llmem_resource_stats rs = test_resource_stats(layers[i]);
        assert_int_equal(rs.mapped_bytes, rounded);
        assert_int_equal(rs.map_calls_total, 1);
    }
    assert_int_equal(limit_used(s.limit), rounded);
    assert_ok(llmem_resource_unmap(s.fault, p, 100 * KiB, rounded));
    for (int i = 0; i < 4; i++) assert_int_equal(test_resource_stats(layers[i]).mapped_bytes, 0);
    destroy_stack(&s);
}

static void stack_fixed_pool_leaves_nothing(void **state)
{
    (void)state;
    stack s = build_stack(MiB);
    llmem_fixed_options o = llmem_fixed_options_default();
    o.name = "kv";
    o.resource = s.fault;
    o.block_size = 4096;
    o.checked = true;
    llmem_fixed *p;
    assert_ok(llmem_fixed_create(&o, &p));
    char *blocks[300];
    size_t n = 0;
    unsigned char buf[4096], back[4096];
    llmem_status st = LLMEM_OK;
    /* Fill the 1 MiB cap to the brim: the pool sees the limit as ENOMEM. */
    for (;;) {
        char *b = llmem_fixed_alloc(p, &st);
        if (!b) break;
        assert_true(n < 300);
        fill(buf, sizeof buf, (unsigned)n);
        assert_ok(llmem_resource_copy(s.fault, b, buf, sizeof buf));
        blocks[n++] = b;
    }
    assert_int_equal(st, LLMEM_ENOMEM);
    assert_error_mentions("limit");
    assert_int_equal(n, MiB / 4096);
    assert_int_equal(limit_used(s.limit), MiB);
    /* Every map the pool made is tracked under its name. */
    seen sn;
    memset(&sn, 0, sizeof sn);
    assert_ok(llmem_tracking_resource_foreach(s.track, collect, &sn));
    assert_true(sn.n > 0);
    for (size_t i = 0; i < sn.n; i++) assert_string_equal(sn.tags[i], "kv");
    for (size_t i = 0; i < n; i += 2) {
        assert_ok(llmem_resource_copy(s.fault, back, blocks[i], sizeof back));
        assert_true(holds(back, sizeof back, (unsigned)i));
        assert_ok(llmem_fixed_free(p, blocks[i]));
    }
    for (size_t i = 0; i < n; i += 2) {
        blocks[i] = llmem_fixed_alloc(p, &st);
        assert_non_null(blocks[i]);
        fill(buf, sizeof buf, (unsigned)(i + 1000));
        assert_ok(llmem_resource_copy(s.fault, blocks[i], buf, sizeof buf));
    }
    for (size_t i = 0; i < n; i++) {
        assert_ok(llmem_resource_copy(s.fault, back, blocks[i], sizeof back));
        assert_true(holds(back, sizeof back, (unsigned)(i % 2 ? i : i + 1000)));
    }
    llmem_fixed_destroy(p);

    test_tracking_expect_clean(s.track);
    assert_int_equal(limit_used(s.limit), 0);
    test_sim_expect_clean(s.sim);
    destroy_stack(&s);
}

static void stack_fault_on_top_drives_pool_errors(void **state)
{
    (void)state;
    stack s = build_stack(16 * MiB);
    llmem_fixed_options o = llmem_fixed_options_default();
    o.resource = s.fault;
    o.block_size = 4096;
    o.chunk_bytes = 4096;
    o.max_chunk_bytes = 4096; /* a chunk per block: every alloc of a new block maps */
    llmem_fixed *p;
    assert_ok(llmem_fixed_create(&o, &p));
    llmem_fault_options fo = llmem_fault_options_default();
    fo.fail_nth = 3;
    assert_ok(llmem_fault_resource_arm(s.fault, &fo));
    void *b[4];
    llmem_status st;
    assert_non_null(b[0] = llmem_fixed_alloc(p, &st));
    assert_non_null(b[1] = llmem_fixed_alloc(p, &st));
    assert_null(llmem_fixed_alloc(p, &st));
    assert_int_equal(st, LLMEM_ENOMEM);
    assert_error_mentions("injected");
    assert_non_null(b[2] = llmem_fixed_alloc(p, &st));
    assert_int_equal(test_tracking_stats(s.track).live_mappings, 3);
    assert_int_equal(test_resource_stats(s.sim).map_calls_total, 3);
    llmem_fixed_destroy(p);
    assert_int_equal(test_tracking_stats(s.track).live_mappings, 0);
    assert_int_equal(limit_used(s.limit), 0);
    destroy_stack(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(limit_caps_maps_and_names_the_limit),
        cmocka_unit_test(limit_sizes_are_rounded_before_counting),
        cmocka_unit_test(limit_set_moves_the_cap),
        cmocka_unit_test(limit_committed_mode_counts_commits),
        cmocka_unit_test(limit_mapped_mode_counts_reservations),
        cmocka_unit_test(limit_gives_claim_back_when_upstream_fails),
        cmocka_unit_test(limit_bad_options_and_wrong_resources),
        cmocka_unit_test(limit_inherits_info_over_os_and_sim),
        cmocka_unit_test(fault_fail_nth),
        cmocka_unit_test(fault_fail_count_runs),
        cmocka_unit_test(fault_fail_forever),
        cmocka_unit_test(fault_fail_after_bytes),
        cmocka_unit_test(fault_budget_counts_only_what_went_through),
        cmocka_unit_test(fault_probability_one_always_fails),
        cmocka_unit_test(fault_probability_is_seeded),
        cmocka_unit_test(fault_ops_mask_copy_only),
        cmocka_unit_test(fault_unmap_failure_leaves_mapping_live),
        cmocka_unit_test(fault_custom_status),
        cmocka_unit_test(fault_arm_resets_and_disarms),
        cmocka_unit_test(fault_bad_options_and_wrong_resources),
        cmocka_unit_test(fault_over_sim_device),
        cmocka_unit_test(tracking_foreach_oldest_first),
        cmocka_unit_test(tracking_report_lists_leaks),
        cmocka_unit_test(tracking_destroy_reports_live_mappings),
        cmocka_unit_test(tracking_refuses_what_would_corrupt_upstream),
        cmocka_unit_test(tracking_upstream_failure_keeps_mapping),
        cmocka_unit_test(tracking_committed_figure_is_rounded),
        cmocka_unit_test(tracking_unmap_refused_while_others_map),
        cmocka_unit_test(tracking_peaks),
        cmocka_unit_test(tracking_wrong_resources),
        cmocka_unit_test(tracking_over_sim_device),
        cmocka_unit_test(stack_names_and_info),
        cmocka_unit_test(stack_fixed_pool_leaves_nothing),
        cmocka_unit_test(stack_fault_on_top_drives_pool_errors),
    };
    return cmocka_run_group_tests(tests, test_quiet_logs, NULL);
}
