/*
 * test_shim_side.c - white-box tests of the malloc shim's side allocator
 * (src/shim/side.c) and of how the shim's entry points treat its blocks:
 * the blocks of the bootstrap, and of allocations the C library makes from
 * inside the pool, are pointers the pool did not hand out, and free,
 * realloc and malloc_usable_size must route them back here.
 *
 * The shim (malloc.c) is linked into this test, so this program's malloc
 * is the shim's, as under LD_PRELOAD. Also here, for the same link: the
 * pool internals only the shim uses (llmem__pool_release_free_runs).
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

#include <sys/mman.h>
#include <time.h>

#include "llmem/pool.h"
#include "pool_shim.h"
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

/* Pages of [p, p + n) resident now (p page-aligned). */
static size_t resident_pages(const void *p, size_t n)
{
    static unsigned char vec[4096];
    size_t pages = (n + 4095) / 4096, got = 0;
    assert_true(pages <= sizeof vec);
    assert_int_equal(mincore((void *)p, n, vec), 0);
    for (size_t i = 0; i < pages; i++) got += vec[i] & 1;
    return got;
}

/* llmem__pool_release_free_runs gives back the pages of free runs of at
 * least min_run bytes and at least min_age_ns old, keeps shorter (and
 * younger) runs resident, and the pool takes the given-back pages again
 * (committed, writable). */
static void test_release_free_runs(void **state)
{
    (void)state;
    llmem_pool_options o = llmem_pool_options_default();
    o.name = "release";
    o.purge = LLMEM_POOL_PURGE_MANUAL;
    llmem_pool *p = NULL;
    assert_int_equal(llmem_pool_create(&o, &p), LLMEM_OK);
    assert_int_equal(llmem__pool_release_free_runs(p, 1u << 20, 0), 0); /* nothing mapped yet */
    /* short (256 KiB), a live fence, long (2 MiB), a live fence: large
     * blocks, page runs of their own, adjacent in the pool's first
     * superblock. */
    size_t s_short = 256u << 10, s_long = 2u << 20;
    unsigned char *a = llmem_pool_alloc(p, s_short, NULL);
    unsigned char *f1 = llmem_pool_alloc(p, 64u << 10, NULL);
    unsigned char *b = llmem_pool_alloc(p, s_long, NULL);
    unsigned char *f2 = llmem_pool_alloc(p, 64u << 10, NULL);
    assert_non_null(a);
    assert_non_null(f1);
    assert_non_null(b);
    assert_non_null(f2);
    memset(a, 1, s_short);
    memset(f1, 2, 64u << 10);
    memset(b, 3, s_long);
    memset(f2, 4, 64u << 10);
    assert_int_equal(resident_pages(a, s_short), s_short / 4096);
    assert_int_equal(resident_pages(b, s_long), s_long / 4096);
    llmem_pool_stats st0 = {.struct_size = sizeof st0};
    llmem_pool_get_stats(p, &st0);
    assert_int_equal(llmem_pool_free(p, a), LLMEM_OK);
    assert_int_equal(llmem_pool_free(p, b), LLMEM_OK);
    /* Freed just now: a minimum age of a minute keeps every run. */
    assert_int_equal(llmem__pool_release_free_runs(p, 1u << 20, 60000000000ull), 0);
    assert_int_equal(resident_pages(b, s_long), s_long / 4096);
    size_t got = llmem__pool_release_free_runs(p, 1u << 20, 0);
    assert_true(got >= s_long);
    assert_int_equal(resident_pages(b, s_long), 0);             /* the long run went back */
    assert_int_equal(resident_pages(a, s_short), s_short / 4096); /* the short one stayed */
    assert_int_equal(resident_pages(f1, 64u << 10), 16);         /* live blocks untouched */
    for (size_t i = 0; i < (64u << 10); i++) assert_int_equal(f1[i], 2);
    llmem_pool_stats st1 = {.struct_size = sizeof st1};
    llmem_pool_get_stats(p, &st1);
    assert_true(st1.decommitted_bytes_total >= st0.decommitted_bytes_total + s_long);
    assert_true(st1.committed_bytes + s_long <= st0.committed_bytes);
    /* A second call finds nothing more to give back. */
    assert_int_equal(llmem__pool_release_free_runs(p, 1u << 20, 0), 0);
    /* The pool takes the run again: committed and writable. */
    unsigned char *c = llmem_pool_alloc(p, s_long, NULL);
    assert_non_null(c);
    memset(c, 5, s_long);
    for (size_t i = 0; i < s_long; i += 4096) assert_int_equal(c[i], 5);
    assert_int_equal(llmem_pool_check(p), LLMEM_OK);
    assert_int_equal(llmem_pool_free(p, c), LLMEM_OK);
    assert_int_equal(llmem_pool_free(p, f1), LLMEM_OK);
    assert_int_equal(llmem_pool_free(p, f2), LLMEM_OK);
    assert_int_equal(llmem__pool_release_free_runs(NULL, 1u << 20, 0), 0);
    llmem_pool_destroy(p);
}

/* Through the shim: a mapped block (1 MiB and more) first gives back the
 * pages of the pool's long free runs, so a freed 2 MiB of large blocks
 * does not stay resident beside the new mapping. */
static void test_shim_mapping_releases_free_runs(void **state)
{
    (void)state;
    void *(*malloc)(size_t);
    void (*free)(void *);
    *(void **)&malloc = dlsym(RTLD_DEFAULT, "malloc");
    *(void **)&free = dlsym(RTLD_DEFAULT, "free");
    assert_non_null(malloc);
    assert_non_null(free);
    enum { N = 40 };
    size_t bs = 64u << 10; /* above the small classes: page runs */
    unsigned char *blk[N];
    for (int i = 0; i < N; i++) {
        blk[i] = malloc(bs);
        assert_non_null(blk[i]);
        memset(blk[i], 7, bs);
    }
    unsigned char *fence = malloc(bs); /* keeps what follows apart */
    assert_non_null(fence);
    memset(fence, 8, bs);
    size_t before = 0;
    for (int i = 0; i < N; i++) before += resident_pages(blk[i], bs);
    assert_int_equal(before, N * bs / 4096);
    for (int i = 0; i < N; i++) free(blk[i]);
    unsigned char *big = malloc(3u << 20);
    assert_non_null(big);
    memset(big, 9, 3u << 20);
    size_t after = 0;
    for (int i = 0; i < N; i++) after += resident_pages(blk[i], bs);
    /* The 40 blocks were adjacent (one run of 2.5 MiB once free) unless
     * the pool placed some elsewhere: most of their pages went back. */
    assert_true(after < before / 4);
    assert_int_equal(resident_pages(fence, bs), bs / 4096);
    for (size_t i = 0; i < bs; i++) assert_int_equal(fence[i], 8);
    /* and the pool serves those pages again */
    unsigned char *again = malloc(bs);
    assert_non_null(again);
    memset(again, 10, bs);
    assert_int_equal(again[bs - 1], 10);
    free(again);
    free(big);
    free(fence);
}

/* Through the shim: a malloc of 128 KiB or more first gives back the
 * pool's free runs of 256 KiB and more that have been free 20 ms. */
static void test_shim_medium_request_releases_old_runs(void **state)
{
    (void)state;
    void *(*malloc)(size_t);
    void (*free)(void *);
    *(void **)&malloc = dlsym(RTLD_DEFAULT, "malloc");
    *(void **)&free = dlsym(RTLD_DEFAULT, "free");
    assert_non_null(malloc);
    assert_non_null(free);
    enum { N = 16 };
    size_t bs = 64u << 10;
    unsigned char *blk[N];
    for (int i = 0; i < N; i++) {
        blk[i] = malloc(bs);
        assert_non_null(blk[i]);
        memset(blk[i], 7, bs);
    }
    unsigned char *fence = malloc(bs);
    assert_non_null(fence);
    memset(fence, 8, bs);
    for (int i = 0; i < N; i++) free(blk[i]);
    /* Young runs stay: a request right away leaves them resident. */
    unsigned char *m1 = malloc(200u << 10);
    assert_non_null(m1);
    size_t young = 0;
    for (int i = 0; i < N; i++) young += resident_pages(blk[i], bs);
    assert_true(young > N * bs / 4096 / 2);
    free(m1);
    struct timespec pause = {0, 60000000}; /* past the age and the interval */
    nanosleep(&pause, NULL);
    unsigned char *m2 = malloc(200u << 10);
    assert_non_null(m2);
    size_t old = 0;
    for (int i = 0; i < N; i++) old += resident_pages(blk[i], bs);
    assert_true(old < N * bs / 4096 / 4);
    memset(m2, 3, 200u << 10); /* the pool serves given-back pages again */
    assert_int_equal(m2[(200u << 10) - 1], 3);
    assert_int_equal(resident_pages(fence, bs), bs / 4096);
    free(m2);
    free(fence);
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
        cmocka_unit_test(test_release_free_runs),
        cmocka_unit_test(test_shim_mapping_releases_free_runs),
        cmocka_unit_test(test_shim_medium_request_releases_old_runs),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
