/*
 * test_pool_lcache.c - the thread caches' stacks of freed large blocks
 * (src/pools/pool_tcache.c, "large blocks"): a free of a large block and
 * an allocation of its unit count served with no lock, counted as handed
 * out; double and interior frees of a cached block refused; the slot and
 * byte bounds (oldest out to the run cache); flush by
 * llmem_pool_flush_thread_cache, trim, an allocation that would fail, and
 * the purger's reclaim of an idle live thread's cache; and, white box,
 * llmem_pool_check failing on a corrupted entry.
 */
#include <pthread.h>
#include <unistd.h>

#include "test_util.h"
#include "support/phase.h"

#include "../src/pools/pool_internal.h"

static llmem_pool *lc_pool(size_t max_bytes, uint32_t decay_ms)
{
    llmem_pool_options o = llmem_pool_options_default();
    o.max_bytes = max_bytes;
    o.decay_ms = decay_ms;
    if (max_bytes) o.first_superblock_bytes = o.max_superblock_bytes = max_bytes;
    llmem_pool *p;
    assert_ok(llmem_pool_create(&o, &p));
    assert_true(p->lcache_on);
    return p;
}

/* This thread's large stack (read by its owner: no lock needed). */
static lcache *mine(llmem_pool *p) { return &llmem__pool_tcache_get(p)->large; }

static size_t run_cached(llmem_pool *p)
{
    pthread_mutex_lock(&p->lock);
    size_t n = p->rc.bytes;
    pthread_mutex_unlock(&p->lock);
    return n;
}

static void same_size_from_the_thread(void **state)
{
    (void)state;
    llmem_pool *p = lc_pool(0, 60000);
    char *a = llmem_pool_alloc(p, 40 << 10, NULL);
    assert_non_null(a);
    memset(a, 7, 40 << 10);
    llmem_pool_stats s0 = test_pool_stats(p);
    assert_ok(llmem_pool_free(p, a));
    assert_int_equal(mine(p)->count, 1);
    assert_int_equal(mine(p)->bytes, 40 << 10);
    assert_int_equal(run_cached(p), 0); /* not the run cache's */
    llmem_pool_stats s = test_pool_stats(p);
    assert_int_equal(s.live_allocations, s0.live_allocations - 1); /* free to the user */
    assert_int_equal(s.used_bytes, s0.used_bytes - (40 << 10));
    assert_int_equal(s.frees_total, s0.frees_total + 1);
    assert_ok(llmem_pool_check(p));
    /* A second free of it, and one inside it, are double frees. */
    assert_int_equal(llmem_pool_free(p, a), LLMEM_EDOUBLEFREE);
    assert_int_equal(llmem_pool_free(p, a + 8192), LLMEM_EDOUBLEFREE);
    assert_int_equal(llmem_pool_realloc(p, a, 100 << 10, NULL), NULL);
    assert_false(llmem_pool_owns(p, a));
    assert_int_equal(llmem_pool_usable_size(p, a), 0);
    assert_int_equal(test_pool_stats(p).invalid_frees_total, 3);
    assert_int_equal(mine(p)->count, 1);
    assert_ok(llmem_pool_check(p));
    /* A larger count does not take it (fitted_block tests smaller ones);
     * the same one does, before a newer block that would fit too. */
    char *c = llmem_pool_alloc(p, 44 << 10, NULL);
    assert_ptr_not_equal(c, a);
    assert_ok(llmem_pool_free(p, c)); /* cached too, newer than a */
    assert_int_equal(mine(p)->count, 2);
    char *d = llmem_pool_alloc(p, (40 << 10) - 100, NULL);
    assert_ptr_equal(d, a); /* its exact size, not the newer 44 KiB */
    assert_int_equal(mine(p)->count, 1);
    memset(d, 1, (40 << 10) - 100);
    s = test_pool_stats(p);
    assert_int_equal(s.allocs_total, s0.allocs_total + 2);
    assert_int_equal(s.live_allocations, s0.live_allocations);
    assert_ok(llmem_pool_check(p));
    assert_ok(llmem_pool_free(p, d));
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
}

/* A block freed into the stack serves an allocation of up to a third
 * fewer units (llmem__pool_fit_units), whole: usable size, used bytes and
 * the stack's count say so, the tail past the request stays poisoned, and
 * a double free, realloc and check treat it as the block it is. Of two
 * that fit, the smaller is taken. */
static void fitted_block(void **state)
{
    (void)state;
    llmem_pool *p = lc_pool(0, 60000);
    char *a = llmem_pool_alloc(p, 56 << 10, NULL), *b = llmem_pool_alloc(p, 60 << 10, NULL);
    assert_non_null(a);
    assert_non_null(b);
    assert_ok(llmem_pool_free(p, a));
    assert_ok(llmem_pool_free(p, b)); /* newer, and larger */
    llmem_pool_stats s0 = test_pool_stats(p);
    /* 10 units fit 15: a (14 units) and b (15) both; a is the smaller. */
    size_t n = (40 << 10) - 100;
    char *f = llmem_pool_alloc(p, n, NULL);
    assert_ptr_equal(f, a);
    assert_int_equal(mine(p)->count, 1);
    assert_int_equal(mine(p)->bytes, 60 << 10);
    assert_fitted_block(p, f, n, 56 << 10, s0);
    /* Realloc within the usable size stays in place; one past it moves or
     * grows, keeping the bytes. */
    assert_ptr_equal(llmem_pool_realloc(p, f, 56 << 10, NULL), f);
    memset(f, 3, 56 << 10); /* the request and the tail the realloc gave it */
    char *g = llmem_pool_realloc(p, f, (56 << 10) + 1, NULL);
    assert_non_null(g);
    for (size_t i = 0; i < (56 << 10); i += 997) assert_int_equal(g[i], 3);
    assert_true(llmem_pool_usable_size(p, g) >= (56 << 10) + 1);
    assert_ok(llmem_pool_check(p));
    /* Freed again it is cached at its own size; a second free is refused. */
    assert_ok(llmem_pool_free(p, g));
    assert_int_equal(llmem_pool_free(p, g), LLMEM_EDOUBLEFREE);
    assert_int_equal(mine(p)->count, 2);
    assert_ok(llmem_pool_check(p));
    /* 9 units fit 13: neither cached block (15 units and more) serves them. */
    char *h = llmem_pool_alloc(p, 36 << 10, NULL);
    assert_ptr_not_equal(h, b);
    assert_ptr_not_equal(h, g);
    assert_int_equal(mine(p)->count, 2);
    assert_int_equal(llmem_pool_usable_size(p, h), 36 << 10);
    assert_ok(llmem_pool_free(p, h));
    llmem_pool_flush_thread_cache(p);
    llmem_pool_stats s = test_pool_stats(p);
    assert_int_equal(s.live_allocations, 0);
    assert_int_equal(s.used_bytes, 0);
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
}

/* At most LCACHE_SLOTS entries and LCACHE_BYTES; the oldest go to the run
 * cache; every step checked. */
static void bounded(void **state)
{
    (void)state;
    llmem_pool *p = lc_pool(0, 60000);
    enum { N = 40 };
    void *b[N];
    for (int i = 0; i < N; i++) assert_non_null(b[i] = llmem_pool_alloc(p, (size_t)(9 + i) << 12, NULL));
    for (int i = 0; i < N; i++) {
        assert_ok(llmem_pool_free(p, b[i]));
        assert_true(mine(p)->count <= LCACHE_SLOTS);
        assert_true(mine(p)->bytes <= LCACHE_BYTES);
        assert_ok(llmem_pool_check(p));
    }
    assert_true(run_cached(p) > 0);
    /* The newest is the thread's, the oldest the run cache's. */
    assert_int_equal(mine(p)->units[mine(p)->count - 1], 9 + N - 1);
    pthread_mutex_lock(&p->lock);
    bool oldest_in_run_cache = p->rc.head[9] != NULL;
    pthread_mutex_unlock(&p->lock);
    assert_true(oldest_in_run_cache);
    /* Blocks above 4 MiB in all do not fit: 8 of 1 MiB. */
    void *m[8];
    for (int i = 0; i < 8; i++) assert_non_null(m[i] = llmem_pool_alloc(p, 1 << 20, NULL));
    for (int i = 0; i < 8; i++) assert_ok(llmem_pool_free(p, m[i]));
    assert_true(mine(p)->bytes <= LCACHE_BYTES);
    assert_ok(llmem_pool_check(p));
    /* Past the run cache's sizes: never cached. */
    void *big = llmem_pool_alloc(p, (1 << 20) + 1, NULL);
    uint32_t before = mine(p)->count;
    assert_ok(llmem_pool_free(p, big));
    assert_int_equal(mine(p)->count, before);
    llmem_pool_flush_thread_cache(p);
    assert_int_equal(mine(p)->count, 0);
    assert_int_equal(mine(p)->bytes, 0);
    assert_ok(llmem_pool_check(p));
    llmem_pool_trim(p);
    llmem_pool_stats s = test_pool_stats(p);
    assert_int_equal(s.live_allocations, 0);
    assert_int_equal(s.superblocks, 0);
    llmem_pool_destroy(p);
}

/* An allocation that fits nowhere coalesces this thread's cached blocks
 * before it fails. */
static void flushed_before_failing(void **state)
{
    (void)state;
    llmem_pool *p = lc_pool(1 << 20, 60000);
    void *b[4];
    for (int i = 0; i < 4; i++) assert_non_null(b[i] = llmem_pool_alloc(p, 256 << 10, NULL));
    for (int i = 0; i < 4; i++) assert_ok(llmem_pool_free(p, b[i]));
    assert_int_equal(mine(p)->count, 4);
    void *all = llmem_pool_alloc(p, 1 << 20, NULL);
    assert_non_null(all);
    assert_int_equal(mine(p)->count, 0);
    assert_ok(llmem_pool_check(p));
    assert_ok(llmem_pool_free(p, all));
    llmem_pool_destroy(p);
}

/* check() finds entries that do not name a cached large block. */
static void check_sees_corrupt_entries(void **state)
{
    (void)state;
    test_quiet_logs(NULL);
    llmem_pool *p = lc_pool(0, 60000);
    void *a = llmem_pool_alloc(p, 64 << 10, NULL), *keep = llmem_pool_alloc(p, 64 << 10, NULL);
    assert_ok(llmem_pool_free(p, a));
    lcache *l = mine(p);
    assert_int_equal(l->count, 1);
    assert_ok(llmem_pool_check(p));
    l->units[0]++; /* wrong size */
    assert_int_equal(llmem_pool_check(p), LLMEM_ECORRUPT);
    l->units[0]--;
    l->slot[0].ptr = (uintptr_t)keep; /* a live block */
    assert_int_equal(llmem_pool_check(p), LLMEM_ECORRUPT);
    l->slot[0].ptr = (uintptr_t)a + 4096; /* not a block start */
    assert_int_equal(llmem_pool_check(p), LLMEM_ECORRUPT);
    l->slot[0].ptr = (uintptr_t)a;
    l->bytes += 4096; /* the byte count */
    assert_int_equal(llmem_pool_check(p), LLMEM_ECORRUPT);
    l->bytes -= 4096;
    pblock *b = l->slot[0].b;
    b->tcached = 0; /* the mark lost */
    assert_int_equal(llmem_pool_check(p), LLMEM_ECORRUPT);
    b->tcached = 1;
    assert_ok(llmem_pool_check(p));
    assert_ok(llmem_pool_free(p, keep));
    llmem_pool_destroy(p);
}

/* An idle live thread's cached large blocks go back through the purger,
 * and its pages are decommitted; the thread's next free caches again. */
typedef struct idler {
    llmem_pool *pool;
    test_phase step; /* 1 idle, 2 wake up, 3 done */
    bool ok;
} idler;

static void *idler_main(void *v)
{
    idler *d = v;
    void *b[3];
    for (int i = 0; i < 3; i++) {
        b[i] = llmem_pool_alloc(d->pool, (size_t)(100 + i) << 12, NULL);
        if (!b[i]) d->ok = false;
        else memset(b[i], 1, (size_t)(100 + i) << 12);
    }
    for (int i = 0; i < 3; i++)
        if (llmem_pool_free(d->pool, b[i]) != LLMEM_OK) d->ok = false;
    if (mine(d->pool)->count != 3) d->ok = false;
    test_phase_set(&d->step, 1);
    test_phase_wait(&d->step, 2);
    if (mine(d->pool)->count != 0) d->ok = false; /* reclaimed */
    void *c = llmem_pool_alloc(d->pool, 100 << 12, NULL);
    if (!c || llmem_pool_free(d->pool, c) != LLMEM_OK || mine(d->pool)->count != 1) d->ok = false;
    test_phase_set(&d->step, 3);
    return NULL;
}

static void idle_thread_reclaimed(void **state)
{
    (void)state;
    llmem_pool *p = lc_pool(0, 50);
    idler d = {.pool = p, .ok = true};
    test_phase_init(&d.step);
    void *keep = llmem_pool_alloc(p, 64 << 10, NULL); /* the superblock stays */
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, idler_main, &d), 0);
    test_phase_wait(&d.step, 1);
    llmem_pool_stats s = test_pool_stats(p);
    assert_int_equal(s.live_allocations, 1);
    uint64_t committed = s.committed_bytes;
    bool gone = false;
    for (int ms = 0; ms < 5000 && !gone; ms += 10) {
        usleep(10 * 1000);
        s = test_pool_stats(p);
        gone = s.reclaimed_caches_total >= 1 && s.committed_bytes + (303u << 12) <= committed;
    }
    if (!gone)
        fail_msg("an idle thread's large blocks stayed: %llu reclaims, %llu of %llu bytes committed",
                 (unsigned long long)s.reclaimed_caches_total, (unsigned long long)s.committed_bytes,
                 (unsigned long long)committed);
    assert_ok(llmem_pool_check(p));
    test_phase_set(&d.step, 2);
    test_phase_wait(&d.step, 3);
    pthread_join(t, NULL);
    assert_true(d.ok);
    /* The thread's exit returned its cache. */
    assert_ok(llmem_pool_check(p));
    s = test_pool_stats(p);
    assert_int_equal(s.live_allocations, 1);
    assert_ok(llmem_pool_free(p, keep));
    llmem_pool_destroy(p);
    test_phase_destroy(&d.step);
}

/* Freed on one thread, allocated on another: each thread's stack is its
 * own, so the block goes through the locked path there. */
static void *other_alloc(void *v)
{
    llmem_pool *p = v;
    void *x = llmem_pool_alloc(p, 40 << 10, NULL);
    if (x) llmem_pool_free(p, x);
    return x;
}

static void no_cache_without_purger(void **state)
{
    (void)state;
    llmem_pool_options o = llmem_pool_options_default();
    o.purge = LLMEM_POOL_PURGE_MANUAL;
    llmem_pool *p;
    assert_ok(llmem_pool_create(&o, &p));
    assert_false(p->lcache_on);
    void *a = llmem_pool_alloc(p, 40 << 10, NULL);
    assert_ok(llmem_pool_free(p, a));
    assert_int_equal(mine(p)->count, 0);
    assert_int_equal(llmem_pool_free(p, a), LLMEM_EDOUBLEFREE);
    llmem_pool_destroy(p);
    o.purge = LLMEM_POOL_PURGE_BACKGROUND;
    o.checked = true;
    assert_ok(llmem_pool_create(&o, &p));
    assert_false(p->lcache_on);
    llmem_pool_destroy(p);
    /* Two threads, one pool. */
    p = lc_pool(0, 60000);
    pthread_t t;
    void *x;
    assert_int_equal(pthread_create(&t, NULL, other_alloc, p), 0);
    pthread_join(t, &x);
    assert_non_null(x);
    assert_ok(llmem_pool_check(p));
    assert_int_equal(test_pool_stats(p).live_allocations, 0);
    llmem_pool_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(same_size_from_the_thread, test_quiet_logs),
        cmocka_unit_test_setup(fitted_block, test_quiet_logs),
        cmocka_unit_test(bounded),
        cmocka_unit_test(flushed_before_failing),
        cmocka_unit_test(check_sees_corrupt_entries),
        cmocka_unit_test(idle_thread_reclaimed),
        cmocka_unit_test_setup(no_cache_without_purger, test_quiet_logs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
