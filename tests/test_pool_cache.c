/*
 * test_pool_cache.c - the dynamic pool's run cache (src/pools/pool_pages.c,
 * "the run cache"): freed large blocks kept whole by exact size. Reuse of
 * the same size, refusals of frees into a cached run, the flush before a
 * growth, by trim and compaction and by the purger once idle, the byte
 * cap, a shadow-model run with the cache on; and, white box, that
 * llmem_pool_check fails when the cache's lists are broken.
 */
#include "test_util.h"
#include "support/rng.h"

#include "../src/pools/pool_internal.h"

/* A pool with the run cache: host, the background purger (the default). */
static llmem_pool *cache_pool(size_t max_bytes, uint32_t decay_ms)
{
    llmem_pool_options o = llmem_pool_options_default();
    o.max_bytes = max_bytes;
    o.decay_ms = decay_ms;
    llmem_pool *p;
    assert_ok(llmem_pool_create(&o, &p));
    p->lcache_on = false; /* the run cache alone: test_pool_lcache.c tests the thread caches' stacks in front */
    return p;
}

static size_t cached_bytes(llmem_pool *p)
{
    pthread_mutex_lock(&p->lock);
    size_t n = p->rc.bytes;
    pthread_mutex_unlock(&p->lock);
    return n;
}

static void same_size_comes_back(void **state)
{
    (void)state;
    llmem_pool *p = cache_pool(0, 60000); /* the purger will not flush during the test */
    char *a = llmem_pool_alloc(p, 40 << 10, NULL), *b = llmem_pool_alloc(p, 40 << 10, NULL);
    assert_non_null(a);
    assert_non_null(b);
    uint64_t free_before = test_pool_stats(p).free_bytes;
    assert_ok(llmem_pool_free(p, a));
    assert_int_equal(cached_bytes(p), 40 << 10);
    assert_int_equal(test_pool_stats(p).free_bytes, free_before + (40 << 10)); /* free to the user */
    assert_ok(llmem_pool_check(p));
    /* Refused like a free in a free run: the start, inside, and not owned. */
    llmem_status st = llmem_pool_free(p, a);
    assert_int_equal(st, LLMEM_EDOUBLEFREE);
    assert_int_equal(llmem_pool_free(p, a + 8192), LLMEM_EDOUBLEFREE);
    assert_false(llmem_pool_owns(p, a));
    assert_int_equal(llmem_pool_usable_size(p, a), 0);
    assert_int_equal(test_pool_stats(p).invalid_frees_total, 2);
    assert_ok(llmem_pool_check(p));
    /* The same size takes it back; a larger one does not (fitted_run
     * tests smaller ones). */
    char *c = llmem_pool_alloc(p, 44 << 10, NULL); /* 11 pages, not 10 */
    assert_non_null(c);
    assert_ptr_not_equal(c, a);
    char *d = llmem_pool_alloc(p, (40 << 10) - 100, NULL);
    assert_ptr_equal(d, a);
    assert_int_equal(cached_bytes(p), 0);
    memset(d, 1, (40 << 10) - 100);
    assert_ok(llmem_pool_check(p));
    assert_ok(llmem_pool_free(p, b));
    assert_ok(llmem_pool_free(p, c));
    assert_ok(llmem_pool_free(p, d));
    assert_ok(llmem_pool_check(p));
    /* Trim flushes the cache: every superblock goes. */
    llmem_pool_trim(p);
    assert_int_equal(cached_bytes(p), 0);
    assert_int_equal(test_pool_stats(p).reserved_bytes, 0);
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
}

/* A cached run serves a large allocation of up to a third fewer pages,
 * whole (the smallest cached size that fits, not the newest): usable
 * size, used and free bytes count the whole run, its tail stays poisoned,
 * and its free, double free and realloc treat it as the block it is. */
static void fitted_run(void **state)
{
    (void)state;
    test_quiet_logs(NULL);
    llmem_pool *p = cache_pool(0, 60000);
    char *a = llmem_pool_alloc(p, 56 << 10, NULL), *gap = llmem_pool_alloc(p, 4 << 10, NULL);
    char *b = llmem_pool_alloc(p, 60 << 10, NULL), *keep = llmem_pool_alloc(p, 4 << 10, NULL);
    assert_non_null(gap);
    assert_non_null(keep);
    assert_ok(llmem_pool_free(p, a));
    assert_ok(llmem_pool_free(p, b)); /* newer */
    assert_int_equal(cached_bytes(p), 116 << 10);
    llmem_pool_stats s0 = test_pool_stats(p);
    /* 10 pages fit 15: a (14 pages) and b (15) both; a is the smaller. */
    size_t n = (40 << 10) - 100;
    char *f = llmem_pool_alloc(p, n, NULL);
    assert_ptr_equal(f, a);
    assert_int_equal(cached_bytes(p), 60 << 10);
    assert_fitted_block(p, f, n, 56 << 10, s0);
    assert_int_equal(test_pool_stats(p).free_bytes, s0.free_bytes - (56 << 10));
    /* 9 pages fit 13: b (15) is too large. */
    char *g = llmem_pool_alloc(p, 36 << 10, NULL);
    assert_ptr_not_equal(g, b);
    assert_int_equal(cached_bytes(p), 60 << 10);
    /* 11 pages fit 16: b, whole. */
    char *h = llmem_pool_alloc(p, 44 << 10, NULL);
    assert_ptr_equal(h, b);
    assert_int_equal(llmem_pool_usable_size(p, h), 60 << 10);
    assert_int_equal(cached_bytes(p), 0);
    assert_ok(llmem_pool_check(p));
    /* Realloc in place up to the run's size. */
    assert_ptr_equal(llmem_pool_realloc(p, h, 60 << 10, NULL), h);
    memset(h, 6, 60 << 10);
    assert_ok(llmem_pool_free(p, h));
    assert_int_equal(llmem_pool_free(p, h), LLMEM_EDOUBLEFREE);
    assert_ok(llmem_pool_free(p, f));
    assert_int_equal(llmem_pool_free(p, f), LLMEM_EDOUBLEFREE);
    assert_int_equal(cached_bytes(p), 116 << 10); /* back at their own sizes */
    assert_ok(llmem_pool_check(p));
    assert_ok(llmem_pool_free(p, g));
    assert_ok(llmem_pool_free(p, gap));
    assert_ok(llmem_pool_free(p, keep));
    llmem_pool_stats s = test_pool_stats(p);
    assert_int_equal(s.used_bytes, 0);
    assert_int_equal(s.live_allocations, 0);
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
}

/* Cached runs fill the only superblock max_bytes allows: an allocation
 * that needs them coalesced gets them, with no growth. */
static void flush_before_growing(void **state)
{
    (void)state;
    llmem_pool_options o = llmem_pool_options_default();
    o.first_superblock_bytes = 1 << 20;
    o.max_superblock_bytes = 1 << 20;
    o.max_bytes = 1 << 20;
    o.decay_ms = 60000;
    llmem_pool *p;
    assert_ok(llmem_pool_create(&o, &p));
    p->lcache_on = false; /* as in cache_pool */
    void *b[4];
    for (int i = 0; i < 4; i++) assert_non_null(b[i] = llmem_pool_alloc(p, 256 << 10, NULL));
    for (int i = 0; i < 4; i++) assert_ok(llmem_pool_free(p, b[i]));
    assert_int_equal(cached_bytes(p), 1 << 20);
    assert_int_equal(test_pool_stats(p).largest_free_bytes, 256 << 10); /* cached runs count, whole */
    assert_ok(llmem_pool_check(p));
    void *all = llmem_pool_alloc(p, 1 << 20, NULL);
    assert_non_null(all);
    assert_int_equal(test_pool_stats(p).grows_total, 1);
    assert_int_equal(cached_bytes(p), 0);
    assert_ok(llmem_pool_check(p));
    assert_ok(llmem_pool_free(p, all));
    llmem_pool_destroy(p);
}

/* No more than the cap, oldest out first; every step checked. */
static void cap_evicts_oldest(void **state)
{
    (void)state;
    llmem_pool *p = cache_pool(0, 60000);
    enum { N = 60 };
    void *b[N];
    size_t total = 0;
    for (int i = 0; i < N; i++) {
        size_t n = (size_t)(100 + i) << 12; /* distinct sizes, 100-159 pages */
        assert_non_null(b[i] = llmem_pool_alloc(p, n, NULL));
        total += n;
    }
    assert_true(total > RUN_CACHE_BYTES);
    for (int i = 0; i < N; i++) {
        assert_ok(llmem_pool_free(p, b[i]));
        assert_true(cached_bytes(p) <= RUN_CACHE_BYTES);
        assert_ok(llmem_pool_check(p));
    }
    /* The newest are kept: the last freed comes back, the first does not. */
    pthread_mutex_lock(&p->lock);
    bool newest_kept = p->rc.head[100 + N - 1] != NULL, oldest_gone = p->rc.head[100] == NULL;
    pthread_mutex_unlock(&p->lock);
    assert_true(newest_kept);
    assert_true(oldest_gone);
    llmem_pool_destroy(p);
}

/* An idle cache goes back through the purger: coalesced, then
 * decommitted (its runs were free for the delay). */
static void idle_cache_is_purged(void **state)
{
    (void)state;
    llmem_pool *p = cache_pool(0, 30);
    void *keep = llmem_pool_alloc(p, 64 << 10, NULL); /* the superblock stays */
    void *a = llmem_pool_alloc(p, 512 << 10, NULL);
    assert_non_null(keep);
    assert_non_null(a);
    memset(a, 1, 512 << 10);
    uint64_t committed = test_pool_stats(p).committed_bytes;
    assert_ok(llmem_pool_free(p, a));
    int waited = 0;
    while ((cached_bytes(p) || test_pool_stats(p).committed_bytes > committed - (512 << 10)) && waited < 5000) {
        usleep(10 * 1000);
        waited += 10;
    }
    assert_int_equal(cached_bytes(p), 0);
    assert_true(test_pool_stats(p).committed_bytes <= committed - (512 << 10));
    assert_true(waited >= 30); /* not before the delay */
    assert_ok(llmem_pool_check(p));
    assert_ok(llmem_pool_free(p, keep));
    llmem_pool_destroy(p);
}

/* A compaction coalesces the cache first: cached runs are neither
 * movable nor holes. */
static void compaction_flushes(void **state)
{
    (void)state;
    llmem_pool *p = cache_pool(0, 60000);
    void *a = llmem_pool_alloc(p, 64 << 10, NULL), *b = llmem_pool_alloc(p, 64 << 10, NULL);
    assert_ok(llmem_pool_free(p, a));
    assert_int_equal(cached_bytes(p), 64 << 10);
    llmem_pool_compact_report r = {sizeof r};
    assert_ok(llmem_pool_compact(p, 0, &r));
    assert_int_equal(cached_bytes(p), 0);
    assert_ok(llmem_pool_check(p));
    assert_ok(llmem_pool_free(p, b));
    llmem_pool_destroy(p);
}

/* Random sizes around the cache's limit, with frees, reallocs and
 * alignment, the whole pool checked as it goes. */
static void shadow_run(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        llmem_pool_options o = llmem_pool_options_default();
        o.checked = seed == 3;
        o.decay_ms = seed == 2 ? 1 : 60000; /* seed 2: the purger flushes under the test */
        llmem_pool *p;
        assert_ok(llmem_pool_create(&o, &p));
        enum { SLOTS = 48 };
        unsigned char *v[SLOTS] = {0};
        size_t size[SLOTS] = {0};
        uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
        for (int op = 0; op < 6000; op++) {
            size_t k = test_rng_next(&s) % SLOTS;
            if (v[k]) {
                for (size_t i = 0; i < size[k]; i += 4093) assert_int_equal(v[k][i], (unsigned char)k);
                if (test_rng_next(&s) % 8 == 0) {
                    size_t n = ((size_t)1 + test_rng_next(&s) % 300) << 12;
                    unsigned char *q = llmem_pool_realloc(p, v[k], n, NULL);
                    assert_non_null(q);
                    v[k] = q;
                    size[k] = n;
                    memset(q, (int)k, n);
                } else {
                    assert_ok(llmem_pool_free(p, v[k]));
                    v[k] = NULL;
                }
            } else {
                size_t n = ((size_t)1 + test_rng_next(&s) % 300) << 12;
                if (test_rng_next(&s) % 3 == 0) n -= test_rng_next(&s) % 4000;
                size_t align = test_rng_next(&s) % 6 == 0 ? (size_t)8192 << (test_rng_next(&s) % 4) : 0;
                v[k] = align ? llmem_pool_alloc_aligned(p, n, align, NULL) : llmem_pool_alloc(p, n, NULL);
                assert_non_null(v[k]);
                if (align) assert_int_equal((uintptr_t)v[k] % align, 0);
                size[k] = n;
                memset(v[k], (int)k, n);
            }
            if (op % 13 == 0) assert_ok(llmem_pool_check(p));
            if (op % 1000 == 999) llmem_pool_shrink(p, test_pool_stats(p).committed_bytes / 2);
        }
        for (size_t k = 0; k < SLOTS; k++)
            if (v[k]) assert_ok(llmem_pool_free(p, v[k]));
        assert_ok(llmem_pool_check(p));
        assert_int_equal(test_pool_stats(p).used_bytes, 0);
        llmem_pool_trim(p);
        assert_int_equal(test_pool_stats(p).reserved_bytes, 0);
        llmem_pool_destroy(p);
    }
}

/* White box: the check sees a cached run missing from its list, one in
 * the wrong size's list, and a wrong byte count. */
static void check_sees_broken_lists(void **state)
{
    (void)state;
    test_quiet_logs(NULL);
    llmem_pool *p = cache_pool(0, 60000);
    void *a = llmem_pool_alloc(p, 40 << 10, NULL), *b = llmem_pool_alloc(p, 40 << 10, NULL);
    void *c = llmem_pool_alloc(p, 20 << 10, NULL);
    assert_ok(llmem_pool_free(p, a));
    assert_ok(llmem_pool_free(p, b));
    assert_ok(llmem_pool_check(p));
    pblock *head = p->rc.head[10];
    assert_non_null(head);
    /* Missing from its size's list. */
    p->rc.head[10] = head->cnext;
    assert_int_equal(llmem_pool_check(p), LLMEM_ECORRUPT);
    p->rc.head[10] = head;
    assert_ok(llmem_pool_check(p));
    /* In the wrong size's list. */
    p->rc.head[10] = NULL;
    p->rc.head[11] = head;
    assert_int_equal(llmem_pool_check(p), LLMEM_ECORRUPT);
    p->rc.head[11] = NULL;
    p->rc.head[10] = head;
    assert_ok(llmem_pool_check(p));
    /* The byte count. */
    p->rc.bytes += 4096;
    assert_int_equal(llmem_pool_check(p), LLMEM_ECORRUPT);
    p->rc.bytes -= 4096;
    /* A cached run marked decommitted. */
    bit_set(head->sb->decommitted, unit_of(head->sb, head->start, p->ushift));
    assert_int_equal(llmem_pool_check(p), LLMEM_ECORRUPT);
    bit_clear(head->sb->decommitted, unit_of(head->sb, head->start, p->ushift));
    assert_ok(llmem_pool_check(p));
    assert_ok(llmem_pool_free(p, c));
    llmem_pool_destroy(p);
}

/* Device-like and manual-purge pools have no cache: a free coalesces. */
static void no_cache_without_purger(void **state)
{
    (void)state;
    llmem_pool_options o = llmem_pool_options_default();
    o.purge = LLMEM_POOL_PURGE_MANUAL;
    llmem_pool *p;
    assert_ok(llmem_pool_create(&o, &p));
    void *a = llmem_pool_alloc(p, 40 << 10, NULL);
    assert_ok(llmem_pool_free(p, a));
    assert_int_equal(cached_bytes(p), 0);
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(same_size_comes_back, test_quiet_logs),
        cmocka_unit_test(fitted_run),
        cmocka_unit_test(flush_before_growing),
        cmocka_unit_test(cap_evicts_oldest),
        cmocka_unit_test(idle_cache_is_purged),
        cmocka_unit_test(compaction_flushes),
        cmocka_unit_test(shadow_run),
        cmocka_unit_test(check_sees_broken_lists),
        cmocka_unit_test(no_cache_without_purger),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
