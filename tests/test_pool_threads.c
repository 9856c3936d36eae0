/*
 * test_pool_threads.c - the dynamic pool shared by many threads: thread
 * caches, cross-thread frees, concurrent large allocations, stats readers,
 * shrink while others allocate, and thread exit returning caches. Runs
 * under TSan in `make check`. Also the background purger, the one thread
 * llmem starts itself.
 */
#include <string.h>
#include <pthread.h>

#include "test_util.h"
#include "support/phase.h"
#include "support/inbox.h"
#include "support/cases.h"
#include "support/rng.h"

enum { THREADS = 8, OPS = 20000, QUEUE = 256 };

typedef struct item {
    unsigned char *p;
    size_t size;
    unsigned char tag;
} item;

/* A mutex-protected ring per thread: others push blocks for it to free. */
typedef test_inbox inbox; /* of QUEUE items */

typedef struct shared {
    llmem_pool *pool;
    inbox boxes[THREADS];
    pthread_barrier_t done_producing;
    uint64_t allocs[THREADS], frees[THREADS];
    bool with_large;
} shared;

typedef struct targ {
    shared *sh;
    int id;
} targ;

static void check_item(const item *it)
{
    for (size_t i = 0; i < it->size; i += 61)
        if (it->p[i] != (unsigned char)(it->tag + i)) fail_msg("block %p corrupted at %zu", (void *)it->p, i);
}

static void release(shared *sh, int id, item *it)
{
    check_item(it);
    assert_ok(llmem_pool_free(sh->pool, it->p));
    sh->frees[id]++;
}

static bool push(inbox *b, item it) { return test_inbox_push(b, &it); }
static bool pop(inbox *b, item *it) { return test_inbox_pop(b, it); }

static void *worker(void *arg)
{
    targ *a = arg;
    shared *sh = a->sh;
    uint64_t s = 0x1234567ull * (uint64_t)(a->id + 1);
    item mine[64];
    size_t n = 0;
    for (int op = 0; op < OPS; op++) {
        item it;
        while (pop(&sh->boxes[a->id], &it)) release(sh, a->id, &it);
        uint64_t r = test_rng_next(&s) % 100;
        if (r < 50 && n < 64) {
            size_t size = 1 + test_rng_next(&s) % (r < 2 && sh->with_large ? (300 << 10) : 2048);
            unsigned char *p = llmem_pool_alloc(sh->pool, size, NULL);
            if (!p) fail_msg("alloc %zu: %s", size, llmem_error_message());
            unsigned char tag = (unsigned char)test_rng_next(&s);
            for (size_t i = 0; i < size; i += 61) p[i] = (unsigned char)(tag + i);
            mine[n++] = (item){p, size, tag};
            sh->allocs[a->id]++;
        } else if (n) {
            size_t k = test_rng_next(&s) % n;
            item it2 = mine[k];
            mine[k] = mine[--n];
            /* Half go to the next thread to free. */
            if (r % 2 == 0 && push(&sh->boxes[(a->id + 1) % THREADS], it2)) continue;
            release(sh, a->id, &it2);
        }
        if (op % 5000 == 0 && a->id == 0) {
            llmem_pool_stats st = {0};
            assert_ok(llmem_pool_get_stats(sh->pool, &st));
            assert_true(st.live_allocations < (uint64_t)THREADS * (64 + QUEUE) + 1);
        }
        if (op % 7000 == 0 && a->id == 1) llmem_pool_shrink(sh->pool, 0);
    }
    for (size_t k = 0; k < n; k++) release(sh, a->id, &mine[k]);
    pthread_barrier_wait(&sh->done_producing);
    item it;
    while (pop(&sh->boxes[a->id], &it)) release(sh, a->id, &it);
    return NULL;
}

static void run(bool checked, bool with_large)
{
    shared *sh = calloc(1, sizeof *sh);
    llmem_pool_options o = llmem_pool_options_default();
    o.checked = checked;
    assert_ok(llmem_pool_create(&o, &sh->pool));
    sh->with_large = with_large;
    for (int i = 0; i < THREADS; i++) test_inbox_init(&sh->boxes[i], sizeof(item), QUEUE);
    pthread_barrier_init(&sh->done_producing, NULL, THREADS);
    pthread_t t[THREADS];
    targ args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (targ){sh, i};
        assert_int_equal(pthread_create(&t[i], NULL, worker, &args[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    uint64_t allocs = 0, frees = 0;
    for (int i = 0; i < THREADS; i++) {
        allocs += sh->allocs[i];
        frees += sh->frees[i];
    }
    assert_int_equal(allocs, frees);
    /* The workers exited: their caches came back through the key destructor. */
    llmem_pool_stats st = {0};
    assert_ok(llmem_pool_get_stats(sh->pool, &st));
    assert_int_equal(st.live_allocations, 0);
    assert_int_equal(st.used_bytes, 0);
    assert_int_equal(st.allocs_total, allocs);
    assert_int_equal(st.frees_total, frees);
    assert_ok(llmem_pool_check(sh->pool));
    llmem_pool_trim(sh->pool);
    assert_ok(llmem_pool_get_stats(sh->pool, &st));
    assert_int_equal(st.reserved_bytes, 0);
    pthread_barrier_destroy(&sh->done_producing);
    for (int i = 0; i < THREADS; i++) test_inbox_destroy(&sh->boxes[i]);
    llmem_pool_destroy(sh->pool);
    free(sh);
}

TEST_CASE(cross_thread_small, run(false, false))
TEST_CASE(cross_thread_mixed, run(false, true))
TEST_CASE(cross_thread_checked, run(true, true))

/* Many short-lived threads: each exit returns its cache; the pool does
 * not grow without bound. */
/* Marks in free blocks are on by default once two threads use a pool
 * (pool_internal.h, "block states"); LLMEM_POOL_MARKS=0 keeps the state
 * bytes alone, the regime of one thread: the same churn in that regime. */
static void cross_thread_unmarked(void **state)
{
    (void)state;
    setenv("LLMEM_POOL_MARKS", "0", 1);
    run(false, true);
    unsetenv("LLMEM_POOL_MARKS");
}

/* A thread that makes the pool's second thread cache: marks on. */
static void *second_cache(void *v)
{
    llmem_pool *p = v;
    llmem_pool_free(p, llmem_pool_alloc(p, 48, NULL));
    return NULL;
}

/* The program's write into a block it freed, as a stale pointer would make
 * it (the block is poisoned under ASan: this is the bug under test). */
__attribute__((no_sanitize_address)) static void write_after_free(void *b)
{
    /* Not memset: ASan's interceptor checks the range whatever the caller's attribute. */
    for (int i = 0; i < 16; i++) ((volatile unsigned char *)b)[i] = 0x5a;
}

/* A marked free block written after its free loses its mark: the flush
 * that would return it to its slab drops and counts it, and no allocation
 * hands it out again. */
static void marked_write_after_free_dropped(void **state)
{
    (void)state;
    llmem_pool *p;
    assert_ok(llmem_pool_create(NULL, &p));
    llmem_pool_free(p, llmem_pool_alloc(p, 48, NULL)); /* this thread's cache */
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, second_cache, p), 0);
    pthread_join(t, NULL);
    void *x = llmem_pool_alloc(p, 48, NULL);
    assert_non_null(x);
    assert_ok(llmem_pool_free(p, x));
    write_after_free(x);
    llmem_pool_shrink(p, 0); /* this thread's cache back to the slabs */
    llmem_pool_stats st;
    assert_ok(llmem_pool_get_stats(p, &st));
    assert_int_equal(st.corruptions_total, 1);
    enum { K = 512 };
    void *got[K];
    for (int i = 0; i < K; i++) {
        assert_non_null(got[i] = llmem_pool_alloc(p, 48, NULL));
        assert_ptr_not_equal(got[i], x);
    }
    for (int i = 0; i < K; i++) assert_ok(llmem_pool_free(p, got[i]));
    llmem_pool_destroy(p);
}

enum { MARKED_N = 64 };
typedef struct marked_arg {
    llmem_pool *pool;
    void **blocks;
    llmem_status first[MARKED_N], second[MARKED_N];
} marked_arg;

static void *marked_freer(void *v)
{
    marked_arg *m = v;
    void *mine = llmem_pool_alloc(m->pool, 48, NULL); /* this thread's cache first: marks on */
    for (int i = 0; i < MARKED_N; i++) m->first[i] = llmem_pool_free(m->pool, m->blocks[i]);
    for (int i = 0; i < MARKED_N; i++) m->second[i] = llmem_pool_free(m->pool, m->blocks[i]);
    llmem_pool_free(m->pool, mine);
    return NULL;
}

static void marked_remote_double_free(void **state)
{
    (void)state;
    llmem_pool *p;
    assert_ok(llmem_pool_create(NULL, &p));
    void *blocks[MARKED_N];
    for (int i = 0; i < MARKED_N; i++) assert_non_null(blocks[i] = llmem_pool_alloc(p, 16 + (size_t)i * 8, NULL));
    marked_arg m = {p, blocks, {0}, {0}};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, marked_freer, &m), 0);
    pthread_join(t, NULL);
    for (int i = 0; i < MARKED_N; i++) {
        assert_int_equal(m.first[i], LLMEM_OK);
        assert_int_equal(m.second[i], LLMEM_EDOUBLEFREE);
    }
    /* Everything freed once: allocations see no block twice. */
    enum { K = 4 * MARKED_N };
    void *got[K];
    for (int i = 0; i < K; i++) assert_non_null(got[i] = llmem_pool_alloc(p, 16 + (size_t)(i % MARKED_N) * 8, NULL));
    for (int i = 0; i < K; i++)
        for (int j = i + 1; j < K; j++) assert_ptr_not_equal(got[i], got[j]);
    for (int i = 0; i < K; i++) assert_ok(llmem_pool_free(p, got[i]));
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
}

static void *short_lived(void *arg)
{
    llmem_pool *p = arg;
    void *v[200];
    for (int i = 0; i < 200; i++) v[i] = llmem_pool_alloc(p, 16 + (size_t)i * 8, NULL);
    for (int i = 0; i < 200; i++) llmem_pool_free(p, v[i]);
    return NULL;
}

static void thread_exit_returns_cache(void **state)
{
    (void)state;
    llmem_pool_options o = llmem_pool_options_default();
    o.purge = LLMEM_POOL_PURGE_MANUAL; /* reserved bytes must only move with the threads */
    llmem_pool *p;
    assert_ok(llmem_pool_create(&o, &p));
    uint64_t reserved_after_first = 0;
    for (int round = 0; round < 40; round++) {
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, short_lived, p), 0);
        pthread_join(t, NULL);
        llmem_pool_stats st = {0};
        assert_ok(llmem_pool_get_stats(p, &st));
        assert_int_equal(st.live_allocations, 0);
        if (round == 0) reserved_after_first = st.reserved_bytes;
        assert_int_equal(st.reserved_bytes, reserved_after_first);
    }
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
}

/* An idle live thread's cache is memory no one uses: once it has seen no
 * refill or flush for the decay delay, shrink (manual purge) or the
 * purger (background) takes its blocks back, the slabs and superblocks
 * they pinned go, and the thread carries on when it wakes. Before, one
 * idle thread kept its cache, its slabs and their superblocks until it
 * exited. */
typedef struct idler {
    llmem_pool *pool;
    test_phase step; /* 0 working, 1 idle (main may reclaim), 2 wake up, 3 done */
    bool ok;
    uint64_t idle_ms; /* when the thread last used the pool before idling */
} idler;

static void idler_churn(idler *d)
{
    enum { N = 3000 };
    static __thread void *b[N];
    uint64_t seed = 99;
    for (int i = 0; i < N; i++) {
        size_t n = 16 + test_rng_next(&seed) % 1009;
        b[i] = llmem_pool_alloc(d->pool, n, NULL);
        if (!b[i]) d->ok = false;
        else memset(b[i], i & 0xff, n);
    }
    for (int i = 0; i < N; i++)
        if (b[i] && llmem_pool_free(d->pool, b[i]) != LLMEM_OK) d->ok = false;
}

static void *idler_main(void *v)
{
    idler *d = v;
    idler_churn(d); /* its cache now holds blocks of many classes */
    d->idle_ms = test_now_ms();
    test_phase_set(&d->step, 1);
    test_phase_wait(&d->step, 2);
    idler_churn(d); /* after the reclaim: the cache works as before */
    test_phase_set(&d->step, 3);
    return NULL;
}

static void idle_cache_reclaimed(bool background)
{
    llmem_pool_options o = llmem_pool_options_default();
    o.decay_ms = 100;
    o.purge = background ? LLMEM_POOL_PURGE_BACKGROUND : LLMEM_POOL_PURGE_MANUAL;
    o.first_superblock_bytes = 1 << 20;
    idler d = {.ok = true};
    assert_ok(llmem_pool_create(&o, &d.pool));
    test_phase_init(&d.step);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, idler_main, &d), 0);
    test_phase_wait(&d.step, 1);
    llmem_pool_stats s = test_pool_stats(d.pool);
    assert_int_equal(s.live_allocations, 0);
    assert_true(s.superblocks > 0);
    if (!background) {
        /* Within the delay the cache is the thread's: shrink leaves it. */
        llmem_pool_trim(d.pool);
        if (test_now_ms() - d.idle_ms < (uint64_t)o.decay_ms / 2) assert_true(test_pool_stats(d.pool).superblocks > 0);
    }
    /* Past the delay: everything goes, without the thread doing anything. */
    bool gone = false;
    for (int ms = 0; ms < 5000 && !gone; ms += 20) {
        usleep(20 * 1000);
        if (!background) llmem_pool_trim(d.pool);
        s = test_pool_stats(d.pool);
        gone = s.superblocks == 0 && s.committed_bytes == 0;
    }
    if (!gone)
        fail_msg("an idle thread's cache kept %llu superblocks, %llu bytes committed",
                 (unsigned long long)s.superblocks, (unsigned long long)s.committed_bytes);
    assert_true(s.reclaimed_caches_total >= 1); /* more if the thread stalled long in its churn */
    assert_int_equal(s.live_allocations, 0);
    assert_ok(llmem_pool_check(d.pool));
    test_phase_set(&d.step, 2);
    test_phase_wait(&d.step, 3);
    assert_true(d.ok);
    assert_ok(llmem_pool_check(d.pool));
    pthread_join(t, NULL);
    s = test_pool_stats(d.pool);
    assert_int_equal(s.live_allocations, 0);
    assert_int_equal(s.allocs_total, s.frees_total);
    llmem_pool_destroy(d.pool);
    test_phase_destroy(&d.step);
}

TEST_CASE(idle_cache_reclaimed_by_shrink, idle_cache_reclaimed(false))
TEST_CASE(idle_cache_reclaimed_by_purger, idle_cache_reclaimed(true))

/* Poll the pool's stats every 10 ms until done(stats) holds or the bound
 * passes; true if it held. The bound is generous (a loaded machine under
 * TSan may not run the purger for seconds): it only turns a purger that
 * never acts into a failure instead of a hang. */
#define PURGE_BOUND_MS 60000
static bool wait_stats(llmem_pool *p, bool (*done)(const llmem_pool_stats *, uint64_t), uint64_t arg,
                       llmem_pool_stats *last)
{
    uint64_t t0 = test_now_ms();
    for (;;) {
        *last = test_pool_stats(p);
        if (done(last, arg)) return true;
        if (test_now_ms() - t0 > PURGE_BOUND_MS) return false;
        usleep(10 * 1000);
    }
}

static bool nothing_free_committed(const llmem_pool_stats *s, uint64_t arg) { return (void)arg, s->free_bytes == 0; }
static bool committed_at_most(const llmem_pool_stats *s, uint64_t bytes) { return s->committed_bytes <= bytes; }
static bool nothing_reserved(const llmem_pool_stats *s, uint64_t arg) { return (void)arg, s->reserved_bytes == 0; }

/* Without any call into the pool, the background purger gives back free
 * runs and empty superblocks once they have waited the decay delay, and
 * not before.
 *
 * Deterministic on a loaded machine: the allocations leave free tails in
 * their superblocks, stamped while they ran; if they ran longer than the
 * delay, the purger could decommit those tails just after the frees and
 * the "nothing within the delay" check read it as freed memory going
 * early (it did, on loaded machines: 1-2 MiB). So the test first waits
 * until the purger has given back every committed free byte (no clock
 * involved: free_bytes reaches 0), and only then frees; what the purger
 * decommits afterwards can only be what the frees released. Every wait is
 * on a condition, with a generous bound. */
static void background_purge_returns_idle_memory(void **state)
{
    (void)state;
    llmem_pool_options o = llmem_pool_options_default();
    o.decay_ms = 150;
    llmem_pool *p;
    assert_ok(llmem_pool_create(&o, &p));
    enum { N = 48 };
    char *b[N];
    for (int i = 0; i < N; i++) {
        b[i] = llmem_pool_alloc(p, 1 << 20, NULL);
        assert_non_null(b[i]);
        memset(b[i], 7, 1 << 20);
    }
    llmem_pool_stats full;
    if (!wait_stats(p, nothing_free_committed, 0, &full))
        fail_msg("the purger left %llu committed free bytes (the allocations' tails) for %d s",
                 (unsigned long long)full.free_bytes, PURGE_BOUND_MS / 1000);
    size_t rss_full = test_rss_bytes();
    uint64_t t0 = test_now_ms();
    for (int i = 0; i < N; i++)
        if (i % 4) assert_ok(llmem_pool_free(p, b[i]));
    llmem_pool_stats before = test_pool_stats(p);
    uint64_t took = test_now_ms() - t0;
    /* Within the delay, nothing goes: nothing else is free, so any
     * decommit would be of the blocks just freed. Readable only if the
     * frees and this read finished inside half the delay (the coarse
     * clock is a few ms; a loaded machine may take longer, then there is
     * nothing to see). */
    if (took < (uint64_t)o.decay_ms / 2) {
        assert_int_equal(before.decommitted_bytes_total, full.decommitted_bytes_total);
        assert_int_equal(before.free_bytes, (uint64_t)36 << 20); /* the 36 frees, all committed */
    }
    llmem_pool_stats after;
    if (!wait_stats(p, committed_at_most, full.committed_bytes - ((size_t)30 << 20), &after))
        fail_msg("the purger gave back %llu of %llu free bytes in %d s",
                 (unsigned long long)(full.committed_bytes - after.committed_bytes),
                 (unsigned long long)before.free_bytes, PURGE_BOUND_MS / 1000);
    /* Not early: the frees' runs had waited the delay (on the test's clock,
     * which the pool's coarse one trails by at most a tick, 10 ms at HZ=100). */
    assert_true(test_now_ms() - t0 + 20 >= (uint64_t)o.decay_ms);
    assert_true(test_rss_bytes() < rss_full - ((size_t)24 << 20));
    for (int i = 0; i < N; i += 4)
        for (size_t k = 0; k < (1 << 20); k += 4096) assert_int_equal(b[i][k], 7);
    for (int i = 0; i < N; i += 4) assert_ok(llmem_pool_free(p, b[i]));
    llmem_pool_stats end;
    if (!wait_stats(p, nothing_reserved, 0, &end))
        fail_msg("the purger kept %llu bytes of empty superblocks for %d s", (unsigned long long)end.reserved_bytes,
                 PURGE_BOUND_MS / 1000);
    assert_ok(llmem_pool_check(p));
    /* Memory given back comes back on demand. */
    void *again = llmem_pool_alloc(p, 8 << 20, NULL);
    assert_non_null(again);
    memset(again, 1, 8 << 20);
    assert_ok(llmem_pool_free(p, again));
    llmem_pool_destroy(p);
}

/* Shadow model per thread on one shared pool, under TSan: alloc, realloc,
 * aligned alloc and free with random sizes; each thread checks that its own
 * blocks keep their bytes, are aligned and never overlap. */
typedef struct pm_arg {
    llmem_pool *pool;
    uint64_t seed;
    llmem_resource *dev; /* non-NULL: the pool is on this device, bytes move through copy */
} pm_arg;

/* Write n bytes of tag at q, or check them (stride 97), directly on the
 * host or through the device's copy. */
static void pm_fill(llmem_resource *dev, unsigned char *q, size_t n, unsigned char tag)
{
    if (!dev) {
        memset(q, tag, n);
        return;
    }
    unsigned char buf[4096];
    memset(buf, tag, sizeof buf);
    for (size_t off = 0; off < n; off += sizeof buf)
        assert_ok(llmem_resource_copy(dev, q + off, buf, n - off < sizeof buf ? n - off : sizeof buf));
}

static void pm_check(llmem_resource *dev, const unsigned char *q, size_t n, unsigned char tag)
{
    unsigned char *buf = test_read_back(dev, q, n);
    for (size_t off = 0; off < n; off += 4096) /* every 97th byte of each 4 KiB */
        for (size_t i = off; i < n && i < off + 4096; i += 97)
            if (buf[i] != tag) fail_msg("block %p lost byte %zu", (void *)q, i);
    free(buf);
}

typedef struct pm_live {
    unsigned char *p;
    size_t n;
    unsigned char tag;
} pm_live;

static int pm_by_addr(const void *a, const void *b)
{
    const pm_live *x = a, *y = b;
    return x->p < y->p ? -1 : x->p > y->p;
}

static void *property_worker(void *arg)
{
    pm_arg *a = arg;
    uint64_t s = a->seed;
    enum { CAP = 128 };
    pm_live v[CAP];
    size_t n = 0;
    size_t min_align = a->dev ? 256 : 16;
    for (int op = 0; op < (a->dev ? 1200 : 3000); op++) {
        uint64_t r = test_rng_next(&s) % 100;
        if ((r < 50 || n == 0) && n < CAP) {
            size_t size = 1 + (size_t)(test_rng_next(&s) % (test_rng_next(&s) % 8 == 0 ? 262144 : 2048));
            size_t align = test_rng_next(&s) % 5 == 0 ? (size_t)1 << (4 + test_rng_next(&s) % 9) : 0;
            unsigned char *q = align ? llmem_pool_alloc_aligned(a->pool, size, align, NULL) : llmem_pool_alloc(a->pool, size, NULL);
            if (!q) fail_msg("alloc %zu: %s", size, llmem_error_message());
            size_t want = align > min_align ? align : min_align;
            if ((uintptr_t)q % want) fail_msg("%p not aligned to %zu", (void *)q, want);
            unsigned char tag = (unsigned char)test_rng_next(&s);
            pm_fill(a->dev, q, size, tag);
            v[n++] = (pm_live){q, size, tag};
        } else if (r < 65 && n) {
            size_t i = test_rng_next(&s) % n, size = 1 + (size_t)(test_rng_next(&s) % 70000);
            unsigned char *q = llmem_pool_realloc(a->pool, v[i].p, size, NULL);
            if (!q) fail_msg("realloc %zu: %s", size, llmem_error_message());
            pm_check(a->dev, q, size < v[i].n ? size : v[i].n, v[i].tag);
            pm_fill(a->dev, q, size, v[i].tag);
            v[i].p = q;
            v[i].n = size;
        } else if (n) {
            size_t i = test_rng_next(&s) % n;
            pm_check(a->dev, v[i].p, v[i].n, v[i].tag);
            assert_ok(llmem_pool_free(a->pool, v[i].p));
            v[i] = v[--n];
        }
        if (op % 250 == 0 && n > 1) {
            pm_live c[CAP];
            memcpy(c, v, n * sizeof *c);
            qsort(c, n, sizeof *c, pm_by_addr);
            for (size_t k = 1; k < n; k++)
                if (c[k - 1].p + c[k - 1].n > c[k].p) fail_msg("blocks overlap");
        }
    }
    for (size_t i = 0; i < n; i++) assert_ok(llmem_pool_free(a->pool, v[i].p));
    return NULL;
}

static void property_run(llmem_resource *dev)
{
    llmem_pool_options o = llmem_pool_options_default();
    o.resource = dev;
    llmem_pool *p;
    assert_ok(llmem_pool_create(&o, &p));
    enum { T = 4 };
    pthread_t t[T];
    pm_arg args[T];
    for (int i = 0; i < T; i++) {
        args[i] = (pm_arg){p, 0x9e3779b97f4a7c15ull * (uint64_t)(i + 3), dev};
        assert_int_equal(pthread_create(&t[i], NULL, property_worker, &args[i]), 0);
    }
    for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
    llmem_pool_stats st = test_pool_stats(p);
    assert_int_equal(st.live_allocations, 0);
    assert_int_equal(st.used_bytes, 0);
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
}

TEST_CASE(property_per_thread, property_run(NULL))

static void property_per_thread_sim_device(void **state)
{
    (void)state;
    llmem_resource *sim;
    assert_ok(llmem_sim_resource_create(NULL, &sim));
    property_run(sim);
    test_sim_expect_clean(sim);
    llmem_resource_destroy(sim);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cross_thread_small),
        cmocka_unit_test(cross_thread_mixed),
        cmocka_unit_test(cross_thread_checked),
        cmocka_unit_test(cross_thread_unmarked),
        cmocka_unit_test(marked_remote_double_free),
        cmocka_unit_test(marked_write_after_free_dropped),
        cmocka_unit_test(thread_exit_returns_cache),
        cmocka_unit_test(background_purge_returns_idle_memory),
        cmocka_unit_test(idle_cache_reclaimed_by_shrink),
        cmocka_unit_test(idle_cache_reclaimed_by_purger),
        cmocka_unit_test(property_per_thread),
        cmocka_unit_test(property_per_thread_sim_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
