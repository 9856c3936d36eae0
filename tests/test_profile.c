/*
 * test_profile.c - the size profiler, profile-refined pool classes, and the
 * multi-size pool built from a profile.
 */
#include "test_util.h"
#include "support/tmpdir.h"

static llmem_profile *new_profile(uint32_t every)
{
    llmem_profile_options o = llmem_profile_options_default();
    o.sample_every = every;
    llmem_profile *pr;
    assert_ok(llmem_profile_create(&o, &pr));
    return pr;
}

static void histogram_and_lifetimes(void **state)
{
    (void)state;
    llmem_profile *pr = new_profile(1);
    char dummy[1000];
    for (int i = 0; i < 300; i++) llmem_profile_record_alloc(pr, 72, dummy + i % 7);
    for (int i = 0; i < 100; i++) llmem_profile_record_alloc(pr, 4096, dummy + 100 + i % 5);
    llmem_profile_record_alloc(pr, 5, dummy + 500);
    usleep(2000);
    llmem_profile_record_free(pr, dummy + 500);   /* matched: lifetime >= 2 ms */
    llmem_profile_record_free(pr, dummy + 999);   /* never sampled: ignored */
    llmem_profile_entry top[8];
    size_t n;
    assert_ok(llmem_profile_top(pr, top, 8, &n));
    assert_int_equal(n, 3);
    assert_int_equal(top[0].size, 72);
    assert_int_equal(top[0].count, 300);
    assert_int_equal(top[0].bytes, 72 * 300);
    assert_int_equal(top[1].size, 4096);
    assert_int_equal(top[2].size, 5);
    assert_int_equal(top[2].lifetimes, 1);
    assert_true(top[2].mean_lifetime_s >= 0.002 && top[2].mean_lifetime_s < 5);
    llmem_profile_stats s = {0};
    assert_ok(llmem_profile_get_stats(pr, &s));
    assert_int_equal(s.samples_total, 401);
    assert_int_equal(s.distinct_sizes, 3);
    assert_int_equal(s.lifetimes_total, 1);
    /* cap smaller than the sizes */
    assert_ok(llmem_profile_top(pr, top, 1, &n));
    assert_int_equal(n, 1);
    llmem_profile_destroy(pr);
}

static void sampling_scales_counts(void **state)
{
    (void)state;
    llmem_profile *pr = new_profile(8);
    char x;
    for (int i = 0; i < 8000; i++) llmem_profile_record_alloc(pr, 100, &x);
    llmem_profile_entry e;
    size_t n;
    assert_ok(llmem_profile_top(pr, &e, 1, &n));
    assert_int_equal(n, 1);
    assert_int_equal(e.count, 8000); /* 1000 samples x 8 */
    llmem_profile_destroy(pr);
}

static void table_overflow_counts_other(void **state)
{
    (void)state;
    llmem_profile_options o = llmem_profile_options_default();
    o.sample_every = 1;
    o.max_sizes = 4;
    llmem_profile *pr;
    assert_ok(llmem_profile_create(&o, &pr));
    char x;
    for (size_t sz = 1; sz <= 10; sz++) llmem_profile_record_alloc(pr, sz, &x);
    llmem_profile_stats s = {0};
    assert_ok(llmem_profile_get_stats(pr, &s));
    assert_int_equal(s.distinct_sizes, 4);
    assert_int_equal(s.other_samples_total, 6);
    llmem_profile_destroy(pr);
}

static void suggest_classes(void **state)
{
    (void)state;
    llmem_profile *pr = new_profile(1);
    char x;
    size_t sizes[] = {600, 600, 600, 600, 1000, 1000, 1000, 40000, 40000, 40000, 40000, 40000, 3, 601};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) llmem_profile_record_alloc(pr, sizes[i], &x);
    uint32_t out[8];
    size_t n;
    /* 40000 is above max_size; 3 and 601 are under the share; 601 rounds
     * to 608, a duplicate of nothing; 600 -> 608 at align 16. */
    assert_ok(llmem_profile_suggest_classes(pr, 8, 32768, 16, 0.2, out, &n));
    assert_int_equal(n, 2);
    assert_int_equal(out[0], 608);
    assert_int_equal(out[1], 1008);
    assert_ok(llmem_profile_suggest_classes(pr, 1, 32768, 16, 0.0, out, &n));
    assert_int_equal(n, 1);
    assert_int_equal(out[0], 608);
    assert_status(llmem_profile_suggest_classes(pr, 8, 32768, 24, 0.1, out, &n), LLMEM_EALIGN);
    assert_status(llmem_profile_suggest_classes(pr, 8, 32768, 16, 1.5, out, &n), LLMEM_EINVAL);
    assert_status(llmem_profile_suggest_classes(NULL, 8, 32768, 16, 0.1, out, &n), LLMEM_EINVAL);
    llmem_profile_destroy(pr);
}

static void save_and_load(void **state)
{
    (void)state;
    llmem_profile *pr = new_profile(1);
    char x;
    for (int i = 0; i < 50; i++) llmem_profile_record_alloc(pr, 333, &x);
    for (int i = 0; i < 20; i++) llmem_profile_record_alloc(pr, 7777, &x);
    char path[512];
    test_tmp_file(path, sizeof path, "profile");
    assert_ok(llmem_profile_save(pr, path));
    llmem_profile *back = new_profile(1);
    assert_ok(llmem_profile_load(back, path));
    llmem_profile_entry a[4], b[4];
    size_t na, nb;
    assert_ok(llmem_profile_top(pr, a, 4, &na));
    assert_ok(llmem_profile_top(back, b, 4, &nb));
    assert_int_equal(na, nb);
    for (size_t i = 0; i < na; i++) {
        assert_int_equal(a[i].size, b[i].size);
        assert_int_equal(a[i].count, b[i].count);
    }
    /* Corrupt files: a status naming the line, nothing changed. */
    FILE *f = fopen(path, "w");
    fprintf(f, "# llmem profile v1\n100 5 0 0\nnot a number\n");
    fclose(f);
    assert_status(llmem_profile_load(back, path), LLMEM_EFORMAT);
    assert_error_mentions("line 3");
    assert_ok(llmem_profile_top(back, b, 4, &nb));
    assert_int_equal(nb, na);
    f = fopen(path, "w");
    fprintf(f, "0 5 0 0\n");
    fclose(f);
    assert_status(llmem_profile_load(back, path), LLMEM_EFORMAT);
    f = fopen(path, "w");
    fprintf(f, "18446744073709551615 18446744073709551615 0 1e300\n");
    fclose(f);
    assert_status(llmem_profile_load(back, path), LLMEM_EFORMAT);
    unlink(path);
    assert_status(llmem_profile_load(back, path), LLMEM_EIO);
    assert_status(llmem_profile_save(pr, "/nonexistent-dir/x.prof"), LLMEM_EIO);
    llmem_profile_destroy(back);
    llmem_profile_destroy(pr);
}

static void pool_records_into_a_profile(void **state)
{
    (void)state;
    llmem_profile *pr = new_profile(1);
    llmem_pool_options o = llmem_pool_options_default();
    o.profile = pr;
    llmem_pool *p;
    assert_ok(llmem_pool_create(&o, &p));
    void *v[100];
    for (int i = 0; i < 100; i++) v[i] = llmem_pool_alloc(p, i % 2 ? 600 : 100000, NULL);
    for (int i = 0; i < 100; i++) assert_ok(llmem_pool_free(p, v[i]));
    llmem_profile_entry top[4];
    size_t n;
    assert_ok(llmem_profile_top(pr, top, 4, &n));
    assert_int_equal(n, 2);
    assert_int_equal(top[0].count, 50);
    assert_int_equal(top[1].count, 50);
    llmem_profile_stats s = {0};
    assert_ok(llmem_profile_get_stats(pr, &s));
    assert_int_equal(s.lifetimes_total, 100);
    llmem_pool_destroy(p);
    llmem_profile_destroy(pr);
}

/* A profiled pool is never memoised by the fast paths (they do not test
 * the profile), so every call must still reach the recording slow path:
 * with its thread cache warm, and with another, unprofiled pool's calls
 * between its own (the memo naming that one), every allocation and free
 * is recorded. */
static void profiled_pool_records_with_caches_warm(void **state)
{
    (void)state;
    llmem_profile *pr = new_profile(1);
    llmem_pool_options o = llmem_pool_options_default();
    o.profile = pr;
    llmem_pool *p, *plain;
    assert_ok(llmem_pool_create(&o, &p));
    assert_ok(llmem_pool_create(NULL, &plain));
    void *v[64];
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < 64; i++) {
            v[i] = llmem_pool_alloc(p, 48, NULL);
            assert_non_null(v[i]);
            void *x = llmem_pool_alloc(plain, 48, NULL);
            assert_ok(llmem_pool_free(plain, x));
        }
        for (int i = 0; i < 64; i++) assert_ok(llmem_pool_free(p, v[i]));
    }
    llmem_profile_stats s = {0};
    assert_ok(llmem_profile_get_stats(pr, &s));
    assert_int_equal(s.lifetimes_total, 4 * 64);
    llmem_profile_entry top[2];
    size_t n;
    assert_ok(llmem_profile_top(pr, top, 2, &n));
    assert_int_equal(n, 1);
    assert_int_equal(top[0].count, 4 * 64);
    llmem_pool_destroy(plain);
    llmem_pool_destroy(p);
    llmem_profile_destroy(pr);
}

static void extra_classes_waste_nothing(void **state)
{
    (void)state;
    uint32_t extra[] = {600, 5000, 20000, 100000 /* above the largest class: ignored */};
    llmem_pool_options o = llmem_pool_options_default();
    o.extra_classes = extra;
    o.extra_class_count = 4;
    llmem_pool *p;
    assert_ok(llmem_pool_create(&o, &p));
    size_t want[] = {600, 5000, 20000};
    for (int i = 0; i < 3; i++) {
        void *a = llmem_pool_alloc(p, want[i], NULL);
        assert_int_equal(llmem_pool_usable_size(p, a), (want[i] + 15) & ~(size_t)15); /* exact up to alignment */
        assert_ok(llmem_pool_free(p, a));
    }
    /* Others still get their usual classes. */
    void *b = llmem_pool_alloc(p, 609, NULL); /* above the 608 class */
    assert_int_equal(llmem_pool_usable_size(p, b), 640);
    assert_ok(llmem_pool_free(p, b));
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
    uint32_t many[30];
    for (int i = 0; i < 30; i++) many[i] = 100 + 8 * (uint32_t)i;
    o.extra_classes = many;
    o.extra_class_count = 30;
    assert_status(llmem_pool_create(&o, &p), LLMEM_EINVAL);
    o.extra_classes = NULL;
    o.extra_class_count = 1;
    assert_status(llmem_pool_create(&o, &p), LLMEM_EINVAL);
}

static void multipool_from_profile(void **state)
{
    (void)state;
    llmem_profile *pr = new_profile(1);
    char x;
    for (int i = 0; i < 100; i++) llmem_profile_record_alloc(pr, 600, &x);
    for (int i = 0; i < 50; i++) llmem_profile_record_alloc(pr, 3000, &x);
    llmem_profile_record_alloc(pr, 77, &x);
    llmem_multipool_options mo = llmem_multipool_options_default();
    mo.min_share = 0.1;
    llmem_multipool *mp;
    assert_ok(llmem_multipool_create(&mo, pr, &mp));
    uint32_t sizes[4];
    assert_int_equal(llmem_multipool_sizes(mp, sizes, 4), 2);
    assert_int_equal(sizes[0], 608);
    assert_int_equal(sizes[1], 3008);
    enum { N = 300 };
    void *v[N];
    size_t sz[N];
    for (int i = 0; i < N; i++) {
        sz[i] = i % 3 == 0 ? 600 : i % 3 == 1 ? 3000 : 12345;
        v[i] = llmem_multipool_alloc(mp, sz[i], NULL);
        assert_non_null(v[i]);
        memset(v[i], i & 0xff, sz[i]);
    }
    for (int i = 0; i < N; i++) {
        assert_int_equal(((unsigned char *)v[i])[sz[i] - 1], i & 0xff);
        if (i % 2) assert_ok(llmem_multipool_free(mp, v[i]));
        else assert_ok(llmem_multipool_free_sized(mp, v[i], sz[i]));
    }
    llmem_multipool_stats s = {0};
    assert_ok(llmem_multipool_get_stats(mp, &s));
    assert_int_equal(s.dedicated_pools, 2);
    assert_int_equal(s.dedicated_allocs_total, 200);
    assert_int_equal(s.fallback_allocs_total, 100);
    assert_true(s.usable_bytes_total >= s.requested_bytes_total);
    /* 600 -> 608 and 3000 -> 3008; 12345 -> its class. */
    llmem_pool_stats ps = {0};
    assert_ok(llmem_pool_get_stats(llmem_multipool_fallback(mp), &ps));
    assert_int_equal(ps.live_allocations, 0);
    int on_stack;
    assert_status(llmem_multipool_free(mp, &on_stack), LLMEM_EFOREIGN);
    llmem_multipool_destroy(mp);
    /* Without a profile everything goes to the general pool. */
    assert_ok(llmem_multipool_create(NULL, NULL, &mp));
    assert_int_equal(llmem_multipool_sizes(mp, NULL, 0), 0);
    void *a = llmem_multipool_alloc(mp, 600, NULL);
    assert_ok(llmem_multipool_free(mp, a));
    llmem_multipool_destroy(mp);
    mo.k = 100;
    assert_status(llmem_multipool_create(&mo, pr, &mp), LLMEM_EINVAL);
    llmem_profile_destroy(pr);
}

static void bad_input(void **state)
{
    (void)state;
    assert_status(llmem_profile_create(NULL, NULL), LLMEM_EINVAL);
    llmem_profile_options o = llmem_profile_options_default();
    o.max_sizes = 1u << 30;
    llmem_profile *pr;
    assert_status(llmem_profile_create(&o, &pr), LLMEM_EINVAL);
    llmem_profile_record_alloc(NULL, 10, &o);
    llmem_profile_record_free(NULL, &o);
    llmem_profile_destroy(NULL);
    size_t n;
    assert_status(llmem_profile_top(NULL, NULL, 0, &n), LLMEM_EINVAL);
    assert_status(llmem_profile_get_stats(NULL, NULL), LLMEM_EINVAL);
    assert_null(llmem_multipool_alloc(NULL, 10, NULL));
    assert_status(llmem_multipool_free(NULL, &o), LLMEM_EINVAL);
    llmem_multipool_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(histogram_and_lifetimes),
        cmocka_unit_test(sampling_scales_counts),
        cmocka_unit_test(table_overflow_counts_other),
        cmocka_unit_test(suggest_classes),
        cmocka_unit_test(save_and_load),
        cmocka_unit_test(pool_records_into_a_profile),
        cmocka_unit_test(profiled_pool_records_with_caches_warm),
        cmocka_unit_test(extra_classes_waste_nothing),
        cmocka_unit_test_setup(multipool_from_profile, test_quiet_logs),
        cmocka_unit_test(bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
