/*
 * test_shim_side.c - white-box tests of the malloc shim's side allocator
 * (src/shim/side.c) and of how the shim's entry points treat its blocks:
 * the blocks of the bootstrap, and of allocations the C library makes from
 * inside the pool, are pointers the pool did not hand out, and free,
 * realloc and malloc_usable_size must route them back here.
 *
 * The shim (malloc.c) is linked into this test, so this program's malloc
 * is the shim's, as under LD_PRELOAD.
 */
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "side.h"

static llmem__side_stats stats(void)
{
    llmem__side_stats s;
    llmem__side_get_stats(&s);
    return s;
}

static void test_alignment_and_usable(void **state)
{
    (void)state;
    for (size_t a = 1; a <= ((size_t)1 << 20); a <<= 1) {
        for (size_t n = 1; n < 70000; n = n * 5 + 3) {
            unsigned char *p = llmem__side_alloc(n, a, false);
            assert_non_null(p);
            assert_int_equal((uintptr_t)p % (a < 16 ? 16 : a), 0);
            assert_true(llmem__side_owns(p));
            assert_true(llmem__side_usable(p) >= n);
            memset(p, 0xab, n);
            llmem__side_free(p);
        }
    }
    assert_null(llmem__side_alloc(SIZE_MAX - 8, 16, false));
    assert_null(llmem__side_alloc((size_t)1 << 45, 16, false)); /* beyond any range it reserves */
    assert_null(llmem__side_alloc(10, 48, false));              /* not a power of two */
    static char elsewhere[32];
    assert_false(llmem__side_owns(elsewhere));
    assert_int_equal(llmem__side_usable(elsewhere), 0);
}

static void test_zeroed_after_reuse(void **state)
{
    (void)state;
    static const size_t sizes[] = {1, 40, 1000, 5000, 70000, 300000, 3u << 20};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        for (int round = 0; round < 3; round++) {
            unsigned char *d = llmem__side_alloc(sizes[k], 16, false);
            assert_non_null(d);
            memset(d, 0xcd, sizes[k]);
            llmem__side_free(d);
            unsigned char *z = llmem__side_alloc(sizes[k], 16, true); /* the same block, reused */
            assert_ptr_equal(z, d);
            for (size_t i = 0; i < sizes[k]; i++)
                if (z[i]) fail_msg("size %zu: byte %zu is %d after reuse", sizes[k], i, z[i]);
            llmem__side_free(z);
        }
    }
}

static void test_double_and_bad_frees_refused(void **state)
{
    (void)state;
    void *p = llmem__side_alloc(100, 16, false);
    assert_non_null(p);
    llmem__side_stats before = stats();
    llmem__side_free(p);
    llmem__side_free(p); /* twice */
    llmem__side_free((char *)p + 16); /* not a block start */
    llmem__side_stats after = stats();
    assert_int_equal(after.live_blocks, before.live_blocks - 1);
    assert_int_equal(after.bad_frees_total, before.bad_frees_total + 2);
    /* The list was not corrupted: two allocations get two blocks. */
    void *a = llmem__side_alloc(100, 16, false), *b = llmem__side_alloc(100, 16, false);
    assert_ptr_not_equal(a, b);
    llmem__side_free(a);
    llmem__side_free(b);
}

static void test_boot_then_region(void **state)
{
    (void)state;
    /* Use up the static buffer: later blocks come from the reserved range,
     * and both kinds are owned. */
    enum { N = 200 };
    void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = llmem__side_alloc(4000, 16, false);
        assert_non_null(p[i]);
        assert_true(llmem__side_owns(p[i]));
        memset(p[i], i, 4000);
    }
    llmem__side_stats s = stats();
    assert_true(s.boot_bytes > (200u << 10));
    assert_true(s.region_bytes > 0);
    for (int i = 0; i < N; i++) {
        const unsigned char *b = p[i];
        assert_int_equal(b[0], (unsigned char)i);
        assert_int_equal(b[3999], (unsigned char)i);
        llmem__side_free(p[i]);
    }
}

static void test_realloc_side(void **state)
{
    (void)state;
    unsigned char *p = llmem__side_realloc(NULL, 10);
    assert_non_null(p);
    memcpy(p, "0123456789", 10);
    unsigned char *q = llmem__side_realloc(p, 12); /* room in its 32-byte block */
    assert_ptr_equal(q, p);
    q = llmem__side_realloc(q, 100000);
    assert_non_null(q);
    assert_memory_equal(q, "0123456789", 10);
    q = llmem__side_realloc(q, 20); /* far too big now: moves down */
    assert_non_null(q);
    assert_memory_equal(q, "0123456789", 10);
    llmem__side_free(q);
}

/* The shim's own entry points take side blocks back. They are reached
 * through dlsym: this file's own calls to malloc and friends are
 * redirected to the side allocator by the link (--wrap, as for the pool's
 * metadata), the exported definitions are the shim's. */
static void test_shim_routes_side_pointers(void **state)
{
    (void)state;
    void *(*malloc)(size_t), *(*realloc)(void *, size_t);
    void (*free)(void *);
    size_t (*malloc_usable_size)(void *);
    *(void **)&malloc = dlsym(RTLD_DEFAULT, "malloc");
    *(void **)&realloc = dlsym(RTLD_DEFAULT, "realloc");
    *(void **)&free = dlsym(RTLD_DEFAULT, "free");
    *(void **)&malloc_usable_size = dlsym(RTLD_DEFAULT, "malloc_usable_size");
    assert_non_null(malloc);
    assert_non_null(realloc);
    assert_non_null(free);
    assert_non_null(malloc_usable_size);
    void *warm = malloc(10); /* the pool exists from here on */
    assert_non_null(warm);
    assert_false(llmem__side_owns(warm));
    free(warm);
    unsigned char *p = llmem__side_alloc(300, 16, false);
    assert_non_null(p);
    for (int i = 0; i < 300; i++) p[i] = (unsigned char)i;
    assert_true(malloc_usable_size(p) >= 300);
    llmem__side_stats before = stats();
    unsigned char *q = realloc(p, 5000); /* moves into the pool */
    assert_non_null(q);
    assert_false(llmem__side_owns(q));
    for (int i = 0; i < 300; i++) assert_int_equal(q[i], (unsigned char)i);
    llmem__side_stats mid = stats();
    assert_int_equal(mid.live_blocks, before.live_blocks - 1);
    free(q);
    void *r = llmem__side_alloc(64, 16, true);
    assert_non_null(r);
    free(r); /* through the shim's free */
    llmem__side_stats after = stats();
    assert_int_equal(after.live_blocks, mid.live_blocks);
    assert_int_equal(after.bad_frees_total, before.bad_frees_total);
}

static void *side_worker(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    void *p[32] = {0};
    size_t n[32] = {0};
    for (int i = 0; i < 20000; i++) {
        seed = seed * 1103515245u + 12345u;
        unsigned k = (seed >> 8) % 32;
        if (p[k]) {
            const unsigned char *b = p[k];
            if (b[0] != (unsigned char)k || b[n[k] - 1] != (unsigned char)k) return (void *)1;
            llmem__side_free(p[k]);
        }
        n[k] = (seed >> 12) % 3000 + 1;
        p[k] = llmem__side_alloc(n[k], 16, false);
        if (!p[k]) return (void *)2;
        memset(p[k], (int)k, n[k]);
    }
    for (int k = 0; k < 32; k++) llmem__side_free(p[k]);
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    pthread_t t[4];
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&t[i], NULL, side_worker, (void *)(uintptr_t)(i + 1)), 0);
    for (int i = 0; i < 4; i++) {
        void *rv;
        pthread_join(t[i], &rv);
        assert_null(rv);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alignment_and_usable),
        cmocka_unit_test(test_zeroed_after_reuse),
        cmocka_unit_test(test_double_and_bad_frees_refused),
        cmocka_unit_test(test_boot_then_region),
        cmocka_unit_test(test_realloc_side),
        cmocka_unit_test(test_shim_routes_side_pointers),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
