/*
 * test_pool.c - the dynamic pool: classes, large blocks, alignment,
 * ownership, checked mode, shrink and decay, reserve, realloc, device
 * pools, and a shadow-model property test over host and sim-device.
 */
#include "test_util.h"
#include "support/cases.h"
#include "support/rng.h"

static llmem_pool *new_pool(llmem_resource *r, bool checked)
{
    llmem_pool_options o = llmem_pool_options_default();
    o.resource = r;
    o.checked = checked;
    o.purge = LLMEM_POOL_PURGE_MANUAL; /* exact figures: no thread changes them under the test */
    llmem_pool *p;
    assert_ok(llmem_pool_create(&o, &p));
    return p;
}

/* ---- shadow model ---------------------------------------------------------- */

typedef struct live {
    unsigned char *p;
    size_t size;
    size_t align;
    unsigned char tag;
} live;

/* Log-uniform size in [1, max]. */
static size_t rand_size(uint64_t *s, size_t max)
{
    unsigned bits = 1 + (unsigned)(test_rng_next(s) % 63);
    size_t cap = bits >= 63 ? max : ((size_t)1 << (bits % 23));
    if (cap > max) cap = max;
    return 1 + (size_t)(test_rng_next(s) % cap);
}

static void fill(llmem_resource *dev, unsigned char *p, size_t n, unsigned char tag)
{
    unsigned char buf[4096];
    for (size_t off = 0; off < n; off += sizeof buf) {
        size_t k = n - off < sizeof buf ? n - off : sizeof buf;
        for (size_t i = 0; i < k; i++) buf[i] = (unsigned char)(tag + (off + i) * 7);
        if (dev) assert_ok(llmem_resource_copy(dev, p + off, buf, k));
        else memcpy(p + off, buf, k);
    }
}

static void verify(llmem_resource *dev, const unsigned char *p, size_t n, unsigned char tag)
{
    unsigned char *buf = test_read_back(dev, p, n);
    for (size_t i = 0; i < n; i++)
        if (buf[i] != (unsigned char)(tag + i * 7))
            fail_msg("block %p byte %zu: %u, expected %u", (void *)p, i, buf[i], (unsigned char)(tag + i * 7));
    free(buf);
}

static int by_addr(const void *a, const void *b)
{
    const live *x = a, *y = b;
    return x->p < y->p ? -1 : x->p > y->p;
}

static void no_overlap(live *v, size_t n)
{
    live *c = malloc(n * sizeof *c + 1);
    memcpy(c, v, n * sizeof *c);
    qsort(c, n, sizeof *c, by_addr);
    for (size_t i = 1; i < n; i++)
        if (c[i - 1].p + c[i - 1].size > c[i].p)
            fail_msg("blocks overlap: %p+%zu and %p", (void *)c[i - 1].p, c[i - 1].size, (void *)c[i].p);
    free(c);
}

/* Random alloc / aligned alloc / realloc / free against a shadow. */
static void property_run(llmem_resource *res, bool checked, uint64_t seed, int ops, size_t max_size)
{
    llmem_resource *dev = res && llmem_resource_kind(res) == LLMEM_MEM_DEVICE ? res : NULL;
    llmem_pool *p = new_pool(res, checked);
    size_t cap = 512, n = 0;
    live *v = calloc(cap, sizeof *v);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    unsigned char tag = 1;
    for (int op = 0; op < ops; op++) {
        uint64_t r = test_rng_next(&s) % 100;
        if ((r < 55 || n == 0) && n < cap) {
            size_t size = rand_size(&s, max_size);
            size_t align = 0;
            if (test_rng_next(&s) % 4 == 0) align = (size_t)1 << (test_rng_next(&s) % 17);
            llmem_status st;
            unsigned char *q = align ? llmem_pool_alloc_aligned(p, size, align, &st) : llmem_pool_alloc(p, size, &st);
            if (!q) fail_msg("alloc %zu align %zu: %s", size, align, llmem_error_message());
            size_t want = align > (dev ? 256u : 16u) ? align : (dev ? 256u : 16u);
            if ((uintptr_t)q % want) fail_msg("alloc %zu: %p not aligned to %zu", size, (void *)q, want);
            assert_true(llmem_pool_owns(p, q));
            assert_true(llmem_pool_usable_size(p, q) >= size);
            fill(dev, q, size, tag);
            v[n++] = (live){q, size, align, tag++};
        } else if (r < 70 && n) {
            size_t i = test_rng_next(&s) % n;
            size_t size = rand_size(&s, max_size);
            llmem_status st;
            unsigned char *q = llmem_pool_realloc(p, v[i].p, size, &st);
            if (!q) fail_msg("realloc %zu: %s", size, llmem_error_message());
            size_t keep = size < v[i].size ? size : v[i].size;
            verify(dev, q, keep, v[i].tag);
            fill(dev, q, size, tag);
            v[i] = (live){q, size, 0, tag++};
        } else if (n) {
            size_t i = test_rng_next(&s) % n;
            verify(dev, v[i].p, v[i].size, v[i].tag);
            assert_ok(llmem_pool_free(p, v[i].p));
            v[i] = v[--n];
        }
        if (op % 97 == 0) {
            no_overlap(v, n);
            assert_ok(llmem_pool_check(p));
            llmem_pool_stats st = test_pool_stats(p);
            assert_int_equal(st.live_allocations, n);
        }
        if (op % 500 == 250) llmem_pool_shrink(p, test_pool_stats(p).committed_bytes / 2);
    }
    for (size_t i = 0; i < n; i++) verify(dev, v[i].p, v[i].size, v[i].tag);
    no_overlap(v, n);
    assert_ok(llmem_pool_check(p));
    for (size_t i = 0; i < n; i++) assert_ok(llmem_pool_free(p, v[i].p));
    assert_int_equal(test_pool_stats(p).live_allocations, 0);
    assert_int_equal(test_pool_stats(p).used_bytes, 0);
    assert_ok(llmem_pool_check(p));
    llmem_pool_trim(p);
    assert_int_equal(test_pool_stats(p).reserved_bytes, 0);
    llmem_pool_destroy(p);
    free(v);
}

static void property_host(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 4; seed++) property_run(NULL, false, seed, 3000, (size_t)4 << 20);
}

static void property_host_checked(void **state)
{
    (void)state;
    for (uint64_t seed = 11; seed <= 13; seed++) property_run(NULL, true, seed, 2000, (size_t)2 << 20);
}

static void property_sim_device(void **state)
{
    (void)state;
    llmem_sim_options so = llmem_sim_options_default();
    so.capacity = (size_t)2 << 30;
    llmem_resource *sim;
    assert_ok(llmem_sim_resource_create(&so, &sim));
    for (uint64_t seed = 21; seed <= 23; seed++) property_run(sim, seed == 23, seed, 1500, (size_t)8 << 20);
    test_sim_expect_clean(sim);
    llmem_resource_destroy(sim);
}

/* ---- classes and waste ---------------------------------------------------- */

static void waste_is_bounded(void **state)
{
    (void)state;
    llmem_pool *p = new_pool(NULL, false);
    for (size_t n = 1; n <= 300000; n += n < 4096 ? 1 : 97) {
        void *q = llmem_pool_alloc(p, n, NULL);
        assert_non_null(q);
        size_t u = llmem_pool_usable_size(p, q);
        assert_true(u >= n);
        if (n >= 128 && (u - n) * 8 > n) fail_msg("request %zu got %zu usable: waste above 12.5%%", n, u);
        if (n < 128 && u - n >= 16) fail_msg("request %zu got %zu usable", n, u);
        assert_ok(llmem_pool_free(p, q));
    }
    llmem_pool_destroy(p);
}

static void alignment_and_bad_alignment(void **state)
{
    (void)state;
    llmem_pool *p = new_pool(NULL, false);
    size_t aligns[] = {1, 8, 16, 32, 64, 128, 256, 4096, 65536, (size_t)1 << 20, (size_t)4 << 20};
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
        size_t sizes[] = {1, 100, 5000, 100000};
        for (size_t j = 0; j < 4; j++) {
            char *q = llmem_pool_alloc_aligned(p, sizes[j], aligns[i], NULL);
            assert_non_null(q);
            assert_int_equal((uintptr_t)q % (aligns[i] > 16 ? aligns[i] : 16), 0);
            memset(q, 1, sizes[j]);
            assert_ok(llmem_pool_free(p, q));
        }
    }
    llmem_status st;
    assert_null(llmem_pool_alloc_aligned(p, 8, 3, &st));
    assert_int_equal(st, LLMEM_EALIGN);
    assert_null(llmem_pool_alloc_aligned(p, 8, (size_t)1 << 30, &st));
    assert_int_equal(st, LLMEM_EALIGN);
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
}

/* ---- bad input ------------------------------------------------------------ */

static void bad_input(void **state)
{
    (void)state;
    llmem_status st;
    assert_null(llmem_pool_alloc(NULL, 8, &st));
    assert_int_equal(st, LLMEM_EINVAL);
    assert_status(llmem_pool_free(NULL, &st), LLMEM_EINVAL);
    llmem_pool *p = new_pool(NULL, false);
    assert_null(llmem_pool_alloc(p, 0, &st));
    assert_int_equal(st, LLMEM_EINVAL);
    assert_null(llmem_pool_alloc(p, SIZE_MAX, &st));
    assert_int_equal(st, LLMEM_EOVERFLOW);
    assert_null(llmem_pool_alloc(p, SIZE_MAX / 2 + 1, &st));
    assert_int_equal(st, LLMEM_EOVERFLOW);
    assert_null(llmem_pool_calloc(p, SIZE_MAX / 2, 3, &st));
    assert_int_equal(st, LLMEM_EOVERFLOW);
    assert_ok(llmem_pool_free(p, NULL));
    int on_stack;
    assert_status(llmem_pool_free(p, &on_stack), LLMEM_EFOREIGN);
    void *m = malloc(64);
    assert_status(llmem_pool_free(p, m), LLMEM_EFOREIGN);
    free(m);
    llmem_pool *other = new_pool(NULL, false);
    void *o = llmem_pool_alloc(other, 100, NULL);
    assert_status(llmem_pool_free(p, o), LLMEM_EFOREIGN);
    assert_ok(llmem_pool_free(other, o));
    llmem_pool_destroy(other);
    /* Large blocks: double and interior frees are caught in release mode. */
    char *big = llmem_pool_alloc(p, 1 << 20, NULL);
    assert_status(llmem_pool_free(p, big + 4096), LLMEM_EFOREIGN);
    assert_status(llmem_pool_free(p, big + 1), LLMEM_EFOREIGN);
    assert_ok(llmem_pool_free(p, big));
    assert_status(llmem_pool_free(p, big), LLMEM_EDOUBLEFREE);
    /* Small blocks: interior pointers are caught in release mode. */
    char *small = llmem_pool_alloc(p, 100, NULL);
    assert_status(llmem_pool_free(p, small + 8), LLMEM_EFOREIGN);
    assert_ok(llmem_pool_free(p, small));
    assert_int_equal(test_pool_stats(p).invalid_frees_total, 7);
    assert_int_equal(test_pool_stats(p).live_allocations, 0);
    assert_ok(llmem_pool_check(p));
    assert_null(llmem_pool_realloc(p, &on_stack, 10, &st));
    assert_int_equal(st, LLMEM_EFOREIGN);
    llmem_pool_destroy(p);
    llmem_pool_destroy(NULL);
    llmem_pool_options po = llmem_pool_options_default();
    po.align = 3;
    assert_status(llmem_pool_create(&po, &p), LLMEM_EALIGN);
    po.align = 4096;
    assert_status(llmem_pool_create(&po, &p), LLMEM_EALIGN);
    assert_status(llmem_pool_create(NULL, NULL), LLMEM_EINVAL);
}

/* ---- checked mode -------------------------------------------------------- */

static void checked_mode_catches_misuse(void **state)
{
    (void)state;
    llmem_pool *p = new_pool(NULL, true);
    size_t sizes[] = {24, 100, 3000, 40000, 1 << 20};
    for (size_t i = 0; i < 5; i++) {
        size_t n = sizes[i];
        char *a = llmem_pool_alloc(p, n, NULL);
        assert_non_null(a);
        assert_int_equal(llmem_pool_usable_size(p, a), n);
        memset(a, 0x5A, n);
        assert_ok(llmem_pool_free(p, a));
        assert_status(llmem_pool_free(p, a), LLMEM_EDOUBLEFREE);
        /* Overflow by one byte: detected, and the block is still freed. */
        char *b = llmem_pool_alloc(p, n, NULL);
#ifndef TEST_ASAN
        b[n] = 1;
        assert_status(llmem_pool_free(p, b), LLMEM_ECORRUPT);
        assert_error_mentions("canary");
#else
        assert_ok(llmem_pool_free(p, b)); /* ASan itself catches the write */
#endif
        char *c = llmem_pool_alloc(p, n, NULL);
        assert_status(llmem_pool_free(p, c + 16), LLMEM_EFOREIGN);
        assert_ok(llmem_pool_free(p, c));
    }
    assert_int_equal(test_pool_stats(p).live_allocations, 0);
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
}

/* ---- memory going back ------------------------------------------------------ */

static void trim_and_shrink_return_memory(void **state)
{
    (void)state;
    llmem_pool *p = new_pool(NULL, false);
    enum { N = 64 };
    char *b[N];
    size_t rss0 = test_rss_bytes();
    for (int i = 0; i < N; i++) {
        b[i] = llmem_pool_alloc(p, 1 << 20, NULL);
        assert_non_null(b[i]);
        memset(b[i], i, 1 << 20);
    }
    size_t rss1 = test_rss_bytes();
    assert_true(rss1 - rss0 > (size_t)48 << 20);
    /* Free every other block: nothing wholly free, shrink decommits. */
    for (int i = 0; i < N; i += 2) assert_ok(llmem_pool_free(p, b[i]));
    size_t committed = test_pool_stats(p).committed_bytes;
    size_t released = llmem_pool_shrink(p, 0);
    assert_true(released >= (size_t)24 << 20);
    assert_int_equal(test_pool_stats(p).committed_bytes, committed - released);
    size_t rss2 = test_rss_bytes();
    assert_true(rss1 - rss2 >= (size_t)24 << 20);
    for (int i = 1; i < N; i += 2)
        for (size_t k = 0; k < (1 << 20); k += 4096) assert_int_equal((unsigned char)b[i][k], (unsigned char)i);
    assert_ok(llmem_pool_check(p));
    /* Decommitted pages come back on allocation. */
    for (int i = 0; i < N; i += 2) {
        b[i] = llmem_pool_alloc(p, 1 << 20, NULL);
        assert_non_null(b[i]);
        memset(b[i], i, 1 << 20);
    }
    assert_ok(llmem_pool_check(p));
    for (int i = 0; i < N; i++) assert_ok(llmem_pool_free(p, b[i]));
    released = llmem_pool_trim(p);
    assert_true(released >= (size_t)64 << 20);
    llmem_pool_stats s = test_pool_stats(p);
    assert_int_equal(s.reserved_bytes, 0);
    assert_int_equal(s.superblocks, 0);
    assert_true(test_rss_bytes() < rss1 - ((size_t)48 << 20));
    llmem_pool_destroy(p);
}

static void empty_superblocks_decay(void **state)
{
    (void)state;
    llmem_pool_options o = llmem_pool_options_default();
    o.decay_ms = 200; /* wide, so a preempted test thread does not see it pass early */
    o.purge = LLMEM_POOL_PURGE_MANUAL;
    o.first_superblock_bytes = 1 << 20;
    o.max_superblock_bytes = 1 << 20;
    llmem_pool *p;
    assert_ok(llmem_pool_create(&o, &p));
    void *a = llmem_pool_alloc(p, 512 << 10, NULL), *b = llmem_pool_alloc(p, 800 << 10, NULL);
    assert_int_equal(test_pool_stats(p).superblocks, 2);
    assert_ok(llmem_pool_free(p, b));
    /* Within the delay it stays: a burst of frees then allocations does not thrash. */
    b = llmem_pool_alloc(p, 800 << 10, NULL);
    assert_int_equal(test_pool_stats(p).grows_total, 2);
    assert_ok(llmem_pool_free(p, b));
    usleep(260 * 1000);
    void *c = llmem_pool_alloc(p, 256 << 10, NULL); /* the next slow path releases it */
    assert_int_equal(test_pool_stats(p).superblocks, 1);
    assert_int_equal(test_pool_stats(p).shrinks_total, 1);
    assert_ok(llmem_pool_free(p, a));
    assert_ok(llmem_pool_free(p, c));
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
}

static void reserve_avoids_resource_calls(void **state)
{
    (void)state;
    llmem_resource *t;
    assert_ok(llmem_tracking_resource_create(llmem_resource_default(), &t));
    llmem_pool *p = new_pool(t, false);
    assert_ok(llmem_pool_reserve(p, (size_t)40 << 20));
    llmem_resource_stats before = {0}, after = {0};
    assert_ok(llmem_resource_get_stats(t, &before));
    void *b[40];
    for (int i = 0; i < 40; i++) assert_non_null(b[i] = llmem_pool_alloc(p, (1 << 20) - 4096, NULL));
    assert_ok(llmem_resource_get_stats(t, &after));
    assert_int_equal(after.map_calls_total, before.map_calls_total);
    assert_int_equal(after.commit_calls_total, before.commit_calls_total);
    for (int i = 0; i < 40; i++) assert_ok(llmem_pool_free(p, b[i]));
    llmem_pool_destroy(p);
    llmem_tracking_stats ts = {0};
    assert_ok(llmem_tracking_resource_get_stats(t, &ts));
    assert_int_equal(ts.live_mappings, 0);
    llmem_resource_destroy(t);
}

static void max_bytes_caps_growth(void **state)
{
    (void)state;
    llmem_pool_options o = llmem_pool_options_default();
    o.max_bytes = 8 << 20;
    o.purge = LLMEM_POOL_PURGE_MANUAL;
    llmem_pool *p;
    assert_ok(llmem_pool_create(&o, &p));
    void *a = llmem_pool_alloc(p, 3 << 20, NULL);
    assert_non_null(a);
    llmem_status st;
    assert_null(llmem_pool_alloc(p, 6 << 20, &st));
    assert_int_equal(st, LLMEM_ENOMEM);
    assert_error_mentions("max_bytes");
    assert_int_equal(test_pool_stats(p).failures_total, 1);
    /* Small blocks until the cap: the refusal is counted for its class. */
    static void *small[1 << 16];
    size_t n = 0;
    while (n < (1u << 16) && (small[n] = llmem_pool_alloc(p, 1000, &st))) n++;
    assert_int_equal(st, LLMEM_ENOMEM);
    assert_int_equal(test_pool_stats(p).failures_total, 2);
    llmem_pool_class_stats cs[96];
    size_t count = 0, failed = 0;
    for (size_t i = 0; i < 96; i++) cs[i].struct_size = sizeof cs[i];
    assert_ok(llmem_pool_get_class_stats(p, cs, 96, &count));
    for (size_t i = 0; i < count; i++)
        if (cs[i].failures_total) {
            assert_int_equal(cs[i].class_bytes, 1024);
            assert_int_equal(cs[i].failures_total, 1);
            failed++;
        }
    assert_int_equal(failed, 1);
    for (size_t i = 0; i < n; i++) assert_ok(llmem_pool_free(p, small[i]));
    assert_ok(llmem_pool_free(p, a));
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
}

static void fault_campaign(void **state)
{
    (void)state;
    test_fault_stack fs;
    test_fault_stack_open(&fs, llmem_resource_default());
    /* A scenario: small and large allocations, frees, a trim (unmaps and
     * decommits), more. Every map, commit, unmap and decommit call fails
     * once in turn. A failure while a thread cache refills can be absorbed
     * (the blocks already taken serve the call), a refused unmap or
     * decommit just keeps memory; a failure on the large path reaches the
     * caller. The fault is disarmed before destroy, which cannot report. */
    uint64_t calls = 0, surfaced = 0;
    for (uint64_t k = 0;; k++) {
        test_fault_arm(fs.fault, k, 1, /* k = 0: count only */
                       LLMEM_FAULT_OP_MAP | LLMEM_FAULT_OP_COMMIT | LLMEM_FAULT_OP_UNMAP | LLMEM_FAULT_OP_DECOMMIT);
        llmem_pool_options o = llmem_pool_options_default();
        o.resource = fs.fault;
        o.purge = LLMEM_POOL_PURGE_MANUAL; /* the same calls in every run */
        o.first_superblock_bytes = 1 << 20;
        llmem_pool *p;
        assert_ok(llmem_pool_create(&o, &p));
        void *v[64] = {0};
        int failed = 0;
        for (int i = 0; i < 64; i++) {
            llmem_status st;
            v[i] = llmem_pool_alloc(p, i % 3 ? (size_t)(100 + i * 10) : (size_t)(i + 1) << 16, &st);
            if (!v[i]) {
                assert_int_equal(st, LLMEM_ENOMEM);
                failed++;
            } else {
                memset(v[i], i, 100);
            }
            if (i == 40) {
                for (int j = 0; j < 40; j += 2) {
                    assert_ok(llmem_pool_free(p, v[j]));
                    v[j] = NULL;
                }
                llmem_pool_trim(p);
                assert_ok(llmem_pool_check(p));
            }
        }
        assert_ok(llmem_pool_check(p));
        for (int i = 0; i < 64; i++)
            if (v[i]) {
                assert_int_equal(((unsigned char *)v[i])[0], (unsigned char)i);
                assert_ok(llmem_pool_free(p, v[i]));
            }
        llmem_pool_trim(p);
        assert_ok(llmem_pool_check(p));
        llmem_fault_stats f = test_fault_stats(fs.fault);
        if (k == 0) {
            calls = f.calls_total;
            assert_true(calls > 10);
        } else {
            assert_int_equal(f.injected_total, 1);
            assert_true(failed <= 1);
            surfaced += (uint64_t)failed;
        }
        assert_ok(llmem_fault_resource_arm(fs.fault, NULL));
        llmem_pool_destroy(p);
        assert_int_equal(test_tracking_stats(fs.track).live_mappings, 0);
        if (k >= calls) break;
    }
    assert_true(surfaced > 0);
    test_fault_stack_close(&fs);
}

static void stats_export(void **state)
{
    (void)state;
    llmem_pool *p = new_pool(NULL, false);
    void *a = llmem_pool_alloc(p, 100, NULL), *b = llmem_pool_alloc(p, 100000, NULL);
    llmem_pool_stats s = test_pool_stats(p);
    assert_int_equal(s.live_allocations, 2);
    assert_int_equal(s.used_bytes, 112 + 102400);
    assert_true(s.largest_free_bytes > 0 && s.largest_free_bytes <= s.free_bytes);
    size_t count = 0;
    llmem_pool_class_stats cs[96];
    for (size_t i = 0; i < 96; i++) cs[i].struct_size = sizeof cs[i]; /* what the caller knows of the struct */
    assert_ok(llmem_pool_get_class_stats(p, cs, 96, &count));
    assert_true(count >= 64 && count <= 96);
    size_t live_blocks = 0;
    for (size_t i = 0; i < count; i++) {
        live_blocks += cs[i].live_blocks;
        if (i) assert_true(cs[i].class_bytes > cs[i - 1].class_bytes);
    }
    assert_int_equal(live_blocks, 1);
    char buf[8192];
    assert_ok(llmem_stats_to_json(llmem_pool_stats_schema(), &s, NULL, 0, buf, sizeof buf, NULL));
    assert_non_null(strstr(buf, "\"live_allocations\":2"));
    /* Frees are counted, per class too; a refused allocation is a class's
     * failure. */
    void *c = llmem_pool_alloc(p, 100, NULL);
    assert_ok(llmem_pool_free(p, c));
    s = test_pool_stats(p);
    assert_int_equal(s.frees_total, 1);
    assert_int_equal(s.allocs_total, 3);
    /* The pool's and every used class's figures, in Prometheus and JSON. */
    llmem_label lb[] = {{"pool", "t"}};
    for (int fmt = 0; fmt < 2; fmt++) {
        llmem_exporter *ex;
        assert_ok(llmem_exporter_create(fmt ? LLMEM_EXPORT_JSON : LLMEM_EXPORT_PROMETHEUS, &ex));
        assert_ok(llmem_pool_export_stats(p, ex, lb, 1));
        static char out[1 << 16];
        assert_ok(llmem_exporter_render(ex, out, sizeof out, NULL));
        if (fmt) {
            assert_non_null(strstr(out, "\"type\":\"pool_class\",\"labels\":{\"pool\":\"t\",\"class_bytes\":\"112\"}"));
            assert_non_null(strstr(out, "\"frees_total\":1"));
        } else {
            assert_non_null(strstr(out, "llmem_pool_class_live_blocks{pool=\"t\",class_bytes=\"112\"} 1"));
            assert_non_null(strstr(out, "llmem_pool_class_frees_total{pool=\"t\",class_bytes=\"112\"} 1"));
            assert_non_null(strstr(out, "llmem_pool_class_allocs_total{pool=\"t\",class_bytes=\"112\"} 2"));
            assert_non_null(strstr(out, "llmem_pool_live_allocations{pool=\"t\"} 2"));
            assert_null(strstr(out, "class_bytes=\"16\"}")); /* unused classes are left out */
        }
        llmem_exporter_destroy(ex);
    }
    assert_status(llmem_pool_export_stats(p, NULL, NULL, 0), LLMEM_EINVAL);
    assert_ok(llmem_pool_free(p, a));
    assert_ok(llmem_pool_free(p, b));
    assert_int_equal(test_pool_stats(p).frees_total, 3);
    llmem_pool_destroy(p);
}

/* A large block that grows into the free run after it stays where it is
 * (no copy, never old and new at once: a growing buffer's peak is its
 * size, not twice it), also when that run was decommitted; with a live
 * block after it, it moves. Before, every growth past the block moved. */
static void realloc_grows_large_blocks_in_place(void **state)
{
    (void)state;
    llmem_pool *p = new_pool(NULL, false);
    size_t n = 100 << 10;
    unsigned char *a = llmem_pool_alloc(p, n, NULL);
    assert_non_null(a);
    for (size_t i = 0; i < n; i++) a[i] = (unsigned char)(i * 7);
    uint64_t used = test_pool_stats(p).used_bytes;
    llmem_status st;
    unsigned char *g = llmem_pool_realloc(p, a, 1 << 20, &st);
    assert_ok(st);
    assert_ptr_equal(g, a);
    for (size_t i = 0; i < n; i++) assert_int_equal(g[i], (unsigned char)(i * 7));
    memset(g, 1, 1 << 20);
    assert_true(llmem_pool_usable_size(p, g) >= (1 << 20));
    assert_int_equal(test_pool_stats(p).used_bytes, used + (1 << 20) - (100 << 10));
    assert_ok(llmem_pool_check(p));
    /* The free run after it, decommitted by a trim: committed again. */
    llmem_pool_trim(p);
    uint64_t committed = test_pool_stats(p).committed_bytes;
    g = llmem_pool_realloc(p, a, 2 << 20, &st);
    assert_ptr_equal(g, a);
    memset(g, 2, 2 << 20);
    assert_true(test_pool_stats(p).committed_bytes >= committed + (1 << 20));
    assert_ok(llmem_pool_check(p));
    /* A live block right after it: it moves, contents kept. */
    unsigned char *b = llmem_pool_alloc(p, 100 << 10, NULL);
    assert_non_null(b);
    assert_ptr_equal(b, a + (2 << 20));
    g = llmem_pool_realloc(p, a, 3 << 20, &st);
    assert_non_null(g);
    assert_ptr_not_equal(g, a);
    for (size_t i = 0; i < (2 << 20); i++) assert_int_equal(g[i], 2);
    assert_ok(llmem_pool_check(p));
    assert_ok(llmem_pool_free(p, g));
    assert_ok(llmem_pool_free(p, b));
    assert_int_equal(test_pool_stats(p).live_allocations, 0);
    assert_int_equal(test_pool_stats(p).used_bytes, 0);
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
}

/* Best fit takes a freed run, whose pages the process holds, before a
 * smaller run of fresh pages (a new superblock's tail): a large block
 * freed in the middle of the superblock serves the next request that
 * fits, though the tail would fit it more tightly. Again after a trim
 * decommitted that run: then it is fresh too, and the tighter tail wins. */
static void best_fit_prefers_freed_pages(void **state)
{
    (void)state;
    llmem_pool_options o = llmem_pool_options_default();
    o.purge = LLMEM_POOL_PURGE_MANUAL;
    o.first_superblock_bytes = o.max_superblock_bytes = 1 << 20;
    llmem_pool *p;
    assert_ok(llmem_pool_create(&o, &p));
    unsigned char *x = llmem_pool_alloc(p, 512 << 10, NULL);
    unsigned char *y = llmem_pool_alloc(p, 64 << 10, NULL);
    unsigned char *z = llmem_pool_alloc(p, 256 << 10, NULL);
    assert_non_null(x);
    assert_ptr_equal(y, x + (512 << 10)); /* one superblock, taken from its front */
    assert_ptr_equal(z, y + (64 << 10));  /* a fresh tail of 192 KiB is left */
    memset(x, 1, 512 << 10);
    assert_ok(llmem_pool_free(p, x));
    unsigned char *w = llmem_pool_alloc(p, 128 << 10, NULL);
    assert_ptr_equal(w, x); /* not z + 256 KiB */
    assert_ok(llmem_pool_check(p));
    assert_ok(llmem_pool_free(p, w));
    llmem_pool_trim(p); /* x's run decommitted: fresh again */
    w = llmem_pool_alloc(p, 128 << 10, NULL);
    assert_ptr_equal(w, z + (256 << 10));
    assert_ok(llmem_pool_check(p));
    assert_ok(llmem_pool_free(p, w));
    assert_ok(llmem_pool_free(p, y));
    assert_ok(llmem_pool_free(p, z));
    llmem_pool_destroy(p);
}

/* ---- handles and compaction ------------------------------------------------ */

static void handles_misuse_is_refused(void **state)
{
    (void)state;
    llmem_pool *p = new_pool(NULL, false);
    llmem_handle h;
    assert_status(llmem_pool_handle_alloc(p, 0, &h), LLMEM_EINVAL);
    assert_int_equal(h, LLMEM_HANDLE_NULL);
    assert_status(llmem_pool_handle_alloc(p, SIZE_MAX, &h), LLMEM_EOVERFLOW);
    assert_status(llmem_pool_handle_alloc(NULL, 10, &h), LLMEM_EINVAL);
    assert_ok(llmem_pool_handle_alloc(p, 10000, &h));
    assert_int_equal(llmem_pool_handle_size(p, h), 10000);
    char *a = llmem_pool_pin(p, h, NULL);
    assert_non_null(a);
    memset(a, 3, 10000);
    assert_true(llmem_pool_owns(p, a));
    assert_status(llmem_pool_free(p, a), LLMEM_EINVAL);
    assert_error_mentions("llmem_pool_handle_free");
    llmem_status st;
    assert_null(llmem_pool_realloc(p, a, 20000, &st));
    assert_int_equal(st, LLMEM_EINVAL);
    assert_status(llmem_pool_handle_free(p, h), LLMEM_EBUSY);
    char *b = llmem_pool_pin(p, h, NULL); /* pins nest */
    assert_ptr_equal(a, b);
    assert_ok(llmem_pool_unpin(p, h));
    assert_ok(llmem_pool_unpin(p, h));
    assert_status(llmem_pool_unpin(p, h), LLMEM_ESTATE);
    assert_ok(llmem_pool_handle_free(p, h));
    /* Stale now, even once its entry is reused. */
    assert_status(llmem_pool_handle_free(p, h), LLMEM_EINVAL);
    assert_null(llmem_pool_pin(p, h, &st));
    assert_int_equal(st, LLMEM_EINVAL);
    llmem_handle h2;
    assert_ok(llmem_pool_handle_alloc(p, 100, &h2));
    assert_true(h2 != h);
    assert_status(llmem_pool_unpin(p, h), LLMEM_EINVAL);
    assert_int_equal(llmem_pool_handle_size(p, h), 0);
    assert_status(llmem_pool_unpin(p, 12345), LLMEM_EINVAL);
    assert_ok(llmem_pool_handle_free(p, LLMEM_HANDLE_NULL));
    assert_ok(llmem_pool_handle_free(p, h2));
    assert_int_equal(test_pool_stats(p).handles, 0);
    assert_int_equal(test_pool_stats(p).live_allocations, 0);
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
}

static void fill_h(llmem_resource *dev, llmem_pool *p, llmem_handle h, size_t n, unsigned char tag)
{
    unsigned char *a = llmem_pool_pin(p, h, NULL);
    assert_non_null(a);
    fill(dev, a, n, tag);
    assert_ok(llmem_pool_unpin(p, h));
}

static void verify_h(llmem_resource *dev, llmem_pool *p, llmem_handle h, size_t n, unsigned char tag)
{
    unsigned char *a = llmem_pool_pin(p, h, NULL);
    assert_non_null(a);
    verify(dev, a, n, tag);
    assert_ok(llmem_pool_unpin(p, h));
}

/* Sparse superblocks of handle blocks: compaction moves the survivors
 * together, unmaps what emptied, keeps every byte, never moves pinned
 * blocks or raw allocations. */
static void compaction_run(llmem_resource *res, size_t budget)
{
    llmem_resource *dev = res && llmem_resource_kind(res) == LLMEM_MEM_DEVICE ? res : NULL;
    llmem_pool_options o = llmem_pool_options_default();
    o.resource = res;
    o.purge = LLMEM_POOL_PURGE_MANUAL;
    o.first_superblock_bytes = dev ? 4 << 20 : 1 << 20;
    o.max_superblock_bytes = o.first_superblock_bytes;
    llmem_pool *p;
    assert_ok(llmem_pool_create(&o, &p));
    size_t unit = dev ? 65536 : 4096, hs = o.first_superblock_bytes / 16 - unit;
    enum { N = 96 };
    llmem_handle h[N];
    void *raw = llmem_pool_alloc(p, 50000, NULL);
    assert_non_null(raw);
    fill(dev, raw, 50000, 99);
    for (int i = 0; i < N; i++) {
        assert_ok(llmem_pool_handle_alloc(p, hs, &h[i]));
        fill_h(dev, p, h[i], hs, (unsigned char)i);
    }
    /* Pin two, free three quarters of the rest, scattered. */
    unsigned char *pinned5 = llmem_pool_pin(p, h[5], NULL), *pinned50 = llmem_pool_pin(p, h[50], NULL);
    bool alive[N];
    for (int i = 0; i < N; i++) {
        alive[i] = i % 4 == 0 || i == 5 || i == 50;
        if (!alive[i]) {
            assert_ok(llmem_pool_handle_free(p, h[i]));
            h[i] = LLMEM_HANDLE_NULL;
        }
    }
    llmem_pool_stats before = test_pool_stats(p);
    llmem_pool_compact_report r = {0};
    assert_ok(llmem_pool_compact(p, budget, &r));
    llmem_pool_stats after = test_pool_stats(p);
    assert_ok(llmem_pool_check(p));
    assert_true(r.blocks_moved > 0);
    if (budget) {
        assert_true(r.bytes_moved <= budget + hs + unit);
    } else {
        assert_true(r.superblocks_released > 0);
        assert_int_equal(after.reserved_bytes, before.reserved_bytes - r.bytes_released);
        assert_true(r.fragmentation_after <= r.fragmentation_before);
    }
    assert_int_equal(after.moved_bytes_total, r.bytes_moved);
    assert_int_equal(after.live_allocations, before.live_allocations);
    assert_ptr_equal(llmem_pool_pin(p, h[5], NULL), pinned5);
    assert_ptr_equal(llmem_pool_pin(p, h[50], NULL), pinned50);
    for (int i = 0; i < N; i++)
        if (alive[i]) verify_h(dev, p, h[i], hs, (unsigned char)i);
    verify(dev, raw, 50000, 99);
    for (int k = 0; k < 2; k++) {
        assert_ok(llmem_pool_unpin(p, h[5]));
        assert_ok(llmem_pool_unpin(p, h[50]));
    }
    for (int i = 0; i < N; i++) assert_ok(llmem_pool_handle_free(p, h[i]));
    assert_ok(llmem_pool_free(p, raw));
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
}

TEST_CASE(compaction_host, compaction_run(NULL, 0))
TEST_CASE(compaction_budget, compaction_run(NULL, 100000))

static void compaction_sim_device(void **state)
{
    (void)state;
    llmem_resource *sim;
    assert_ok(llmem_sim_resource_create(NULL, &sim));
    compaction_run(sim, 0);
    test_sim_expect_clean(sim);
    llmem_resource_destroy(sim);
}

/* The free fast path finds a block's unit entry through the address map
 * alone (no superblock load), so the entry's pool tag is all that tells a
 * block of another pool: freed with this pool's thread cache warm (the
 * memo names this pool), it must still be refused, at every class, and
 * neither pool may change. Then the same block frees in its own pool, and
 * a double free there is caught on the fast path's state byte. */
static void foreign_small_block_refused_on_the_fast_path(void **state)
{
    (void)state;
    llmem_pool *p = new_pool(NULL, false), *other = new_pool(NULL, false);
    size_t sizes[] = {16, 100, 1000, 4000};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        void *o = llmem_pool_alloc(other, sizes[k], NULL);
        assert_non_null(o);
        void *mine = llmem_pool_alloc(p, sizes[k], NULL); /* the memo now names p */
        assert_non_null(mine);
        assert_status(llmem_pool_free(p, o), LLMEM_EFOREIGN);
        assert_false(llmem_pool_owns(p, o));
        assert_ok(llmem_pool_free(p, mine));
        assert_ok(llmem_pool_free(other, o));
        assert_status(llmem_pool_free(other, o), LLMEM_EDOUBLEFREE);
    }
    assert_int_equal(test_pool_stats(p).invalid_frees_total, 4);
    assert_int_equal(test_pool_stats(other).invalid_frees_total, 4);
    assert_int_equal(test_pool_stats(p).live_allocations, 0);
    assert_int_equal(test_pool_stats(other).live_allocations, 0);
    assert_ok(llmem_pool_check(p));
    assert_ok(llmem_pool_check(other));
    llmem_pool_destroy(other);
    llmem_pool_destroy(p);
}

/* The free fast path does not test for a null pointer: it finds no
 * superblock and falls through to the slow path, which returns OK. With
 * the thread cache warm (the memo names the pool) and a block of every
 * class live, a null free changes nothing. */
static void null_free_with_cache_warm(void **state)
{
    (void)state;
    llmem_pool *p = new_pool(NULL, false);
    void *v[4];
    size_t sizes[] = {16, 100, 1000, 4000};
    for (int i = 0; i < 4; i++) assert_non_null(v[i] = llmem_pool_alloc(p, sizes[i], NULL));
    llmem_pool_stats before = test_pool_stats(p);
    assert_ok(llmem_pool_free(p, NULL));
    llmem_pool_stats after = test_pool_stats(p);
    assert_int_equal(after.frees_total, before.frees_total);
    assert_int_equal(after.invalid_frees_total, 0);
    assert_int_equal(after.live_allocations, 4);
    for (int i = 0; i < 4; i++) assert_ok(llmem_pool_free(p, v[i]));
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
}

/* Pools of other units share one address map: a device pool's 64 KiB
 * units against a host pool's pages. A block of either passed to the
 * other is refused (free, usable size, ownership, realloc) on the fast
 * paths too, which index the unit table by their own pool's shift: before
 * the map's word carried the shift, a device block freed into a host pool
 * read far outside the table and crashed. */
static void foreign_block_of_other_units_refused(void **state)
{
    (void)state;
    llmem_resource *sim = test_sim_new(0);
    llmem_pool *host = new_pool(NULL, false), *dev = new_pool(sim, false);
    size_t sizes[] = {64, 1000, 4000, 100 << 10};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        void *d = llmem_pool_alloc(dev, sizes[k], NULL), *h = llmem_pool_alloc(host, sizes[k], NULL);
        assert_non_null(d);
        assert_non_null(h);
        void *warm = llmem_pool_alloc(host, sizes[k], NULL); /* both memos name their pools */
        void *dwarm = llmem_pool_alloc(dev, sizes[k], NULL);
        assert_status(llmem_pool_free(host, d), LLMEM_EFOREIGN);
        assert_status(llmem_pool_free(dev, h), LLMEM_EFOREIGN);
        assert_int_equal(llmem_pool_usable_size(host, d), 0);
        assert_int_equal(llmem_pool_usable_size(dev, h), 0);
        assert_false(llmem_pool_owns(host, d));
        assert_false(llmem_pool_owns(dev, h));
        assert_null(llmem_pool_realloc(host, d, sizes[k] * 2, NULL));
        assert_ok(llmem_pool_free(host, warm));
        assert_ok(llmem_pool_free(dev, dwarm));
        assert_ok(llmem_pool_free(dev, d));
        assert_ok(llmem_pool_free(host, h));
    }
    assert_int_equal(test_pool_stats(host).live_allocations, 0);
    assert_int_equal(test_pool_stats(dev).live_allocations, 0);
    assert_int_equal(test_pool_stats(host).invalid_frees_total, 8); /* the frees and the reallocs */
    assert_int_equal(test_pool_stats(dev).invalid_frees_total, 4);
    assert_ok(llmem_pool_check(host));
    assert_ok(llmem_pool_check(dev));
    llmem_pool_destroy(dev);
    llmem_pool_destroy(host);
    test_sim_expect_clean(sim);
    llmem_resource_destroy(sim);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(waste_is_bounded),
        cmocka_unit_test(alignment_and_bad_alignment),
        cmocka_unit_test_setup(bad_input, test_quiet_logs),
        cmocka_unit_test_setup(foreign_small_block_refused_on_the_fast_path, test_quiet_logs),
        cmocka_unit_test(null_free_with_cache_warm),
        cmocka_unit_test_setup(foreign_block_of_other_units_refused, test_quiet_logs),
        cmocka_unit_test_setup(checked_mode_catches_misuse, test_quiet_logs),
        cmocka_unit_test(trim_and_shrink_return_memory),
        cmocka_unit_test(empty_superblocks_decay),
        cmocka_unit_test(reserve_avoids_resource_calls),
        cmocka_unit_test(max_bytes_caps_growth),
        cmocka_unit_test_setup(fault_campaign, test_quiet_logs),
        cmocka_unit_test(stats_export),
        cmocka_unit_test_setup(handles_misuse_is_refused, test_quiet_logs),
        cmocka_unit_test(compaction_host),
        cmocka_unit_test(compaction_budget),
        cmocka_unit_test(compaction_sim_device),
        cmocka_unit_test(realloc_grows_large_blocks_in_place),
        cmocka_unit_test(best_fit_prefers_freed_pages),
        cmocka_unit_test(property_host),
        cmocka_unit_test_setup(property_host_checked, test_quiet_logs),
        cmocka_unit_test(property_sim_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
