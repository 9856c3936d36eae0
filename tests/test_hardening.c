/*
 * test_hardening.c - what each allocator detects when it is misused, in
 * release and in checked mode, and what it says.
 *
 * Every detection must come back as a status (or, for a write through a
 * dangling pointer, which no call sees happen, as an error log line and a
 * counter) with a message that names the pool and the block, and must leave
 * the allocator consistent (llmem_pool_check) and usable. The misuses:
 *
 *   foreign free       a pointer from the stack, from malloc, from another pool
 *   interior free      a pointer into a live block, not its start
 *   double free        small and large blocks
 *   overflow           a write past the requested size (guard canaries)
 *   use after free     a write into a freed block (freed-block fill), and
 *                      under AddressSanitizer a read or write of a freed
 *                      block, which ASan reports (a death test in a child)
 *   stale handle       a KV sequence used after its free (generation check)
 *
 * Release mode is not asked to detect what its header says it does not (a
 * write past the end): that misuse is not run in release mode, since its
 * effect there is the corruption itself. The
 * table in docs/RELIABILITY.md is this file's cases.
 *
 * Writes that AddressSanitizer would stop first (into a guard, into a freed
 * block) unpoison the bytes they write in ASan builds: they stand for writes
 * ASan cannot see (uninstrumented code, DMA), which is what checked mode is
 * for.
 */
#include <pthread.h>

#include "test_util.h"
#include "support/cases.h"
#include "support/log_capture.h"

#ifdef TEST_ASAN
#define UNSEEN_WRITE(p, n) __asan_unpoison_memory_region((void *)(p), (n))
#else
#define UNSEEN_WRITE(p, n) ((void)(p), (void)(n))
#endif

/* ---- the last error-level log line --------------------------------------- */

static test_log_capture cap;

static int setup_capture(void **state)
{
    (void)state;
    test_log_capture_start(&cap, LLMEM_LOG_ERROR);
    return 0;
}

static int teardown_capture(void **state)
{
    (void)state;
    llmem_log_set(NULL, NULL, LLMEM_LOG_OFF);
    return 0;
}

/* The message names `name` and the pointer p as printed by %p. */
static void assert_names(const char *msg, const char *name, const void *p)
{
    char ptr[32];
    snprintf(ptr, sizeof ptr, "%p", p);
    if (!strstr(msg, name)) fail_msg("\"%s\" does not name the pool '%s'", msg, name);
    if (p && !strstr(msg, ptr)) fail_msg("\"%s\" does not name the block %s", msg, ptr);
}

/* ---- the dynamic pool -------------------------------------------------- */

static llmem_pool *pool_new(const char *name, bool checked)
{
    llmem_pool_options o = llmem_pool_options_default();
    o.name = name;
    o.checked = checked;
    o.purge = LLMEM_POOL_PURGE_MANUAL;
    llmem_pool *p = NULL;
    assert_ok(llmem_pool_create(&o, &p));
    return p;
}

/* Foreign, interior and large double frees: refused in both modes. */
static void pool_refusals(bool checked)
{
    const char *name = checked ? "hard-checked" : "hard-release";
    llmem_pool *p = pool_new(name, checked), *other = pool_new("other", checked);
    int on_stack = 0;
    void *heap = malloc(64);
    void *theirs = llmem_pool_alloc(other, 64, NULL);
    char *big = llmem_pool_alloc(p, 256 << 10, NULL);
    char *small = llmem_pool_alloc(p, 48, NULL);
    assert_non_null(theirs);
    assert_non_null(big);
    assert_non_null(small);
    memset(big, 7, 256 << 10);
    memset(small, 9, 48);

    assert_status(llmem_pool_free(p, &on_stack), LLMEM_EFOREIGN);
    assert_names(llmem_error_message(), name, &on_stack);
    assert_status(llmem_pool_free(p, heap), LLMEM_EFOREIGN);
    assert_names(llmem_error_message(), name, heap);
    assert_status(llmem_pool_free(p, theirs), LLMEM_EFOREIGN);
    assert_names(llmem_error_message(), name, theirs);
    assert_status(llmem_pool_free(p, big + 4096), LLMEM_EFOREIGN);
    assert_names(llmem_error_message(), name, big + 4096);
    assert_error_mentions("not its start");
    /* Nothing was freed: contents intact, the pool consistent. */
    for (size_t i = 0; i < (256u << 10); i += 4093) assert_int_equal(big[i], 7);
    assert_int_equal(small[47], 9);
    assert_ok(llmem_pool_check(p));

    assert_ok(llmem_pool_free(p, big));
    assert_status(llmem_pool_free(p, big), LLMEM_EDOUBLEFREE);
    assert_names(llmem_error_message(), name, big);
    assert_int_equal(test_pool_stats(p).invalid_frees_total, 5);
    assert_ok(llmem_pool_check(p));

    /* Still usable. */
    void *again = llmem_pool_alloc(p, 256 << 10, NULL);
    assert_non_null(again);
    assert_ok(llmem_pool_free(p, again));
    assert_ok(llmem_pool_free(p, small));
    assert_ok(llmem_pool_free(other, theirs));
    free(heap);
    assert_int_equal(test_pool_stats(p).live_allocations, 0);
    llmem_pool_destroy(p);
    llmem_pool_destroy(other);
}

TEST_CASE(pool_release_refusals, pool_refusals(false))
TEST_CASE(pool_checked_refusals, pool_refusals(true))

/* A small block freed twice, in both modes: refused with
 * LLMEM_EDOUBLEFREE wherever the first free left it (this thread's cache,
 * the slab after a flush, another thread's cache), counted, and never
 * handed out twice. Before release mode marked free small blocks, the
 * second free returned LLMEM_OK and the next two allocations returned the
 * same pointer. */
typedef struct twice_arg {
    llmem_pool *p;
    void *block;
    llmem_status first;
} twice_arg;

static void *free_elsewhere(void *v)
{
    twice_arg *a = v;
    a->first = llmem_pool_free(a->p, a->block);
    return NULL; /* this thread's cache keeps the block until it exits */
}

static void small_double_free(bool checked)
{
    const char *name = checked ? "hard-checked" : "hard-release";
    llmem_pool *p = pool_new(name, checked);
    uint64_t refused = 0;
    for (int where = 0; where < 3; where++) {
        void *a = llmem_pool_alloc(p, 100, NULL), *b = llmem_pool_alloc(p, 100, NULL);
        assert_non_null(a);
        assert_non_null(b);
        memset(a, 0x5a, 100);
        if (where == 2) { /* freed by another thread, still alive */
            twice_arg arg = {p, a, LLMEM_EINVAL};
            pthread_t t;
            assert_int_equal(pthread_create(&t, NULL, free_elsewhere, &arg), 0);
            assert_int_equal(pthread_join(t, NULL), 0);
            assert_ok(arg.first);
        } else {
            assert_ok(llmem_pool_free(p, a));
            if (where == 1) llmem_pool_flush_thread_cache(p); /* into its slab */
        }
        assert_status(llmem_pool_free(p, a), LLMEM_EDOUBLEFREE);
        assert_names(llmem_error_message(), name, a);
        assert_error_mentions("double free");
        assert_int_equal(test_pool_stats(p).invalid_frees_total, ++refused);
        assert_ok(llmem_pool_check(p));
        /* Handed out once, not twice: no two live blocks alike. */
        void *c[64];
        for (int i = 0; i < 64; i++) {
            c[i] = llmem_pool_alloc(p, 100, NULL);
            assert_non_null(c[i]);
            for (int j = 0; j < i; j++) assert_ptr_not_equal(c[i], c[j]);
            assert_ptr_not_equal(c[i], b);
        }
        for (int i = 0; i < 64; i++) assert_ok(llmem_pool_free(p, c[i]));
        assert_ok(llmem_pool_free(p, b));
        assert_int_equal(test_pool_stats(p).live_allocations, 0);
        assert_int_equal(test_pool_stats(p).allocs_total, test_pool_stats(p).frees_total);
    }
    llmem_pool_destroy(p);
}

TEST_CASE(pool_release_small_double_free, small_double_free(false))
TEST_CASE(pool_checked_small_double_free, small_double_free(true))

/* A device pool (nothing written into its memory) refuses it too. */
static void pool_device_small_double_free(void **state)
{
    (void)state;
    llmem_resource *sim;
    assert_ok(llmem_sim_resource_create(NULL, &sim));
    llmem_pool_options o = llmem_pool_options_default();
    o.name = "hard-device";
    o.resource = sim;
    o.purge = LLMEM_POOL_PURGE_MANUAL;
    llmem_pool *p;
    assert_ok(llmem_pool_create(&o, &p));
    void *a = llmem_pool_alloc(p, 1000, NULL);
    assert_non_null(a);
    assert_ok(llmem_pool_free(p, a));
    assert_status(llmem_pool_free(p, a), LLMEM_EDOUBLEFREE);
    assert_names(llmem_error_message(), "hard-device", a);
    void *c = llmem_pool_alloc(p, 1000, NULL), *d = llmem_pool_alloc(p, 1000, NULL);
    assert_ptr_not_equal(c, d);
    assert_ok(llmem_pool_free(p, c));
    assert_ok(llmem_pool_free(p, d));
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
    llmem_resource_destroy(sim);
}

/* Destroying a pool with live blocks says so: how many and how many bytes
 * (a leak, or memory still in use), instead of unmapping in silence. */
static void pool_destroy_reports_live_blocks(void **state)
{
    (void)state;
    test_log_capture_start(&cap, LLMEM_LOG_WARN);
    llmem_pool *p = pool_new("hard-leaky", false);
    void *a = llmem_pool_alloc(p, 100, NULL), *b = llmem_pool_alloc(p, 3000, NULL);
    void *c = llmem_pool_alloc(p, 1 << 20, NULL), *d = llmem_pool_alloc(p, 100, NULL);
    assert_ok(llmem_pool_free(p, d)); /* freed: not reported */
    (void)a, (void)b, (void)c;
    cap.last_at[LLMEM_LOG_WARN][0] = '\0';
    /* A destroy on a caller's error path leaves that error in place (the
     * report is a log line): the caller's last error is read after. */
    assert_null(llmem_pool_alloc(NULL, 1, NULL));
    assert_int_equal(llmem_error_status(), LLMEM_EINVAL);
    llmem_pool_destroy(p);
    /* 112 + 3072 + 1 MiB */
    assert_non_null(strstr(cap.last_at[LLMEM_LOG_WARN], "'hard-leaky'"));
    assert_non_null(strstr(cap.last_at[LLMEM_LOG_WARN], "3 live block(s) of 1051760 bytes"));
    assert_int_equal(llmem_error_status(), LLMEM_EINVAL);
    /* Nothing live: nothing said. */
    p = pool_new("hard-clean", false);
    a = llmem_pool_alloc(p, 100, NULL);
    assert_ok(llmem_pool_free(p, a));
    cap.last_at[LLMEM_LOG_WARN][0] = '\0';
    llmem_pool_destroy(p);
    assert_string_equal(cap.last_at[LLMEM_LOG_WARN], "");
    llmem_log_set(NULL, NULL, LLMEM_LOG_OFF);
}

/* Checked mode: a write past the requested size, small and large. */
static void pool_checked_overflow(void **state)
{
    (void)state;
    llmem_pool *p = pool_new("hard-checked", true);
    size_t sizes[] = {40, 300, 100000};
    for (size_t i = 0; i < 3; i++) {
        unsigned char *a = llmem_pool_alloc(p, sizes[i], NULL);
        assert_non_null(a);
        memset(a, 1, sizes[i]);
        UNSEEN_WRITE(a + sizes[i], 1);
        a[sizes[i]] = 0x41; /* one byte past the end */
        assert_status(llmem_pool_free(p, a), LLMEM_ECORRUPT);
        assert_names(llmem_error_message(), "hard-checked", a);
        assert_error_mentions("out of bounds");
        assert_int_equal(test_pool_stats(p).corruptions_total, i + 1);
        /* The block was freed anyway: nothing live, the pool consistent. */
        assert_int_equal(test_pool_stats(p).live_allocations, 0);
        assert_ok(llmem_pool_check(p));
    }
    llmem_pool_destroy(p);
}

/* Checked mode: a write into a freed small block is found by check() and
 * when the block is handed out again, without ASan. */
static void pool_checked_write_after_free(void **state)
{
    (void)state;
    llmem_pool *p = pool_new("hard-checked", true);
    void *keep = llmem_pool_alloc(p, 200, NULL); /* keeps the slab alive */
    unsigned char *a = llmem_pool_alloc(p, 200, NULL);
    assert_non_null(a);
    assert_ok(llmem_pool_free(p, a));
    assert_ok(llmem_pool_check(p)); /* a clean free block passes */
    UNSEEN_WRITE(a + 10, 1);
    a[10] = 0x5a; /* through a dangling pointer */
    assert_status(llmem_pool_check(p), LLMEM_ECORRUPT);
    assert_error_mentions("written after it was freed");
    assert_error_mentions("hard-checked");
    uint64_t before = test_pool_stats(p).corruptions_total;
    unsigned logs = cap.errors;
    /* The next allocation of the class takes that block (LIFO) and says so. */
    void *b = llmem_pool_alloc(p, 200, NULL);
    assert_non_null(b);
    assert_int_equal(cap.errors, logs + 1);
    assert_non_null(strstr(cap.last, "written after it was freed"));
    assert_non_null(strstr(cap.last, "hard-checked"));
    assert_int_equal(test_pool_stats(p).corruptions_total, before + 1);
    assert_ok(llmem_pool_check(p)); /* handed out, the block is live again */
    assert_ok(llmem_pool_free(p, b));
    assert_ok(llmem_pool_free(p, keep));
    /* An honest free/alloc cycle reports nothing. */
    logs = cap.errors;
    for (int i = 0; i < 100; i++) {
        void *c = llmem_pool_alloc(p, 200, NULL);
        memset(c, 0xff, 200);
        assert_ok(llmem_pool_free(p, c));
    }
    assert_int_equal(cap.errors, logs);
    llmem_pool_destroy(p);
}

/* ---- the fixed pool ----------------------------------------------------- */

static llmem_fixed *fixed_new(const char *name, bool thread_safe)
{
    llmem_fixed_options o = llmem_fixed_options_default();
    o.name = name;
    o.block_size = 96;
    o.checked = true;
    o.thread_safe = thread_safe;
    llmem_fixed *f = NULL;
    assert_ok(llmem_fixed_create(&o, &f));
    return f;
}

static void fixed_checked(bool thread_safe)
{
    llmem_fixed *f = fixed_new("hard-fixed", thread_safe);
    int on_stack = 0;
    unsigned char *a = llmem_fixed_alloc(f, NULL), *b = llmem_fixed_alloc(f, NULL);
    assert_non_null(a);
    assert_non_null(b);
    memset(a, 3, 96);
    memset(b, 4, 96);
    assert_status(llmem_fixed_free(f, &on_stack), LLMEM_EFOREIGN);
    assert_names(llmem_error_message(), "hard-fixed", &on_stack);
    assert_status(llmem_fixed_free(f, a + 8), LLMEM_EFOREIGN);
    assert_names(llmem_error_message(), "hard-fixed", a + 8);
    assert_error_mentions("not its start");
    assert_ok(llmem_fixed_free(f, a));
    assert_status(llmem_fixed_free(f, a), LLMEM_EDOUBLEFREE);
    assert_names(llmem_error_message(), "hard-fixed", a);
    llmem_fixed_stats s = test_fixed_stats(f);
    assert_int_equal(s.foreign_frees_total, 2);
    assert_int_equal(s.double_frees_total, 1);
    assert_int_equal(s.blocks_in_use, 1);
    assert_int_equal(b[95], 4);

    /* A write after free is reported when the block is handed out again. */
    UNSEEN_WRITE(a + 50, 1);
    a[50] = 0;
    unsigned logs = cap.errors;
    void *c = llmem_fixed_alloc(f, NULL);
    assert_ptr_equal(c, a); /* LIFO */
    assert_int_equal(cap.errors, logs + 1);
    assert_names(cap.last, "hard-fixed", a);
    assert_non_null(strstr(cap.last, "written after it was freed"));
    assert_int_equal(test_fixed_stats(f).corruptions_total, 1);
    /* Honest cycles report nothing. */
    assert_ok(llmem_fixed_free(f, c));
    for (int i = 0; i < 200; i++) {
        void *d = llmem_fixed_alloc(f, NULL);
        memset(d, 0xee, 96);
        assert_ok(llmem_fixed_free(f, d));
    }
    assert_int_equal(cap.errors, logs + 1);
    assert_ok(llmem_fixed_free(f, b));
    llmem_fixed_destroy(f);
}

TEST_CASE(fixed_checked_plain, fixed_checked(false))
TEST_CASE(fixed_checked_thread_safe, fixed_checked(true))

/* ---- the KV manager: stale sequence handles ----------------------------- */

static void kv_stale_handle(void **state)
{
    (void)state;
    llmem_kv_options o = llmem_kv_options_default();
    o.name = "hard-kv";
    o.layers = 2;
    o.kv_heads = 2;
    o.head_dim = 8;
    o.max_seq_len = 256;
    llmem_kv *kv = NULL;
    assert_ok(llmem_kv_create(&o, &kv));
    llmem_kv_seq s = 0, t = 0;
    assert_ok(llmem_kv_seq_create(kv, 0, &s));
    assert_ok(llmem_kv_seq_append(kv, s, 20, NULL, NULL));
    assert_ok(llmem_kv_seq_free(kv, s));
    assert_status(llmem_kv_seq_free(kv, s), LLMEM_EINVAL);
    assert_error_mentions("hard-kv");
    assert_error_mentions("not live");
    /* A new sequence in the same slot does not answer to the old handle. */
    assert_ok(llmem_kv_seq_create(kv, 0, &t));
    assert_status(llmem_kv_seq_append(kv, s, 1, NULL, NULL), LLMEM_EINVAL);
    assert_status(llmem_kv_seq_truncate(kv, s, 0), LLMEM_EINVAL);
    assert_ok(llmem_kv_seq_append(kv, t, 3, NULL, NULL));
    assert_ok(llmem_kv_check(kv));
    assert_ok(llmem_kv_seq_free(kv, t));
    llmem_kv_destroy(kv);
}

/* ---- AddressSanitizer: a read of a freed block is reported ---------------- */

#ifdef TEST_ASAN
typedef void (*misuse_fn)(void);

static void uaf_pool_small(void)
{
    llmem_pool *p = pool_new("asan", false);
    volatile char *a = llmem_pool_alloc(p, 64, NULL);
    llmem_pool_free(p, (void *)a);
    (void)a[3];
}

static void uaf_pool_large(void)
{
    llmem_pool *p = pool_new("asan", false);
    volatile char *a = llmem_pool_alloc(p, 1 << 20, NULL);
    llmem_pool_free(p, (void *)a);
    a[12345] = 1;
}

static void uaf_fixed(void)
{
    llmem_fixed_options o = llmem_fixed_options_default();
    o.block_size = 128;
    llmem_fixed *f = NULL;
    if (llmem_fixed_create(&o, &f)) return;
    volatile char *a = llmem_fixed_alloc(f, NULL);
    llmem_fixed_free(f, (void *)a);
    (void)a[100];
}

static void uaf_arena_reset(void)
{
    llmem_arena_options o = llmem_arena_options_default();
    llmem_arena *ar = NULL;
    if (llmem_arena_create(&o, &ar)) return;
    volatile char *a = llmem_arena_alloc(ar, 256, 16, NULL);
    llmem_arena_reset(ar);
    (void)a[0];
}

/* Run fn in a child; true when ASan reported a poisoned access there. */
static bool asan_reports(misuse_fn fn)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        fn();
        _exit(0); /* not reported: a plain exit */
    }
    close(fds[1]);
    char buf[8192];
    size_t n = 0;
    ssize_t got;
    while ((got = read(fds[0], buf + n, sizeof buf - 1 - n)) > 0 && n < sizeof buf - 1) n += (size_t)got;
    buf[n] = '\0';
    close(fds[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    bool died = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return died && strstr(buf, "AddressSanitizer") && strstr(buf, "use-after-poison");
}
#endif

static void asan_use_after_free(void **state)
{
    (void)state;
#ifdef TEST_ASAN
    assert_true(asan_reports(uaf_pool_small));
    assert_true(asan_reports(uaf_pool_large));
    assert_true(asan_reports(uaf_fixed));
    assert_true(asan_reports(uaf_arena_reset));
#else
    skip(); /* needs the ASan build (make check runs it there) */
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(pool_release_refusals, setup_capture, teardown_capture),
        cmocka_unit_test_setup_teardown(pool_checked_refusals, setup_capture, teardown_capture),
        cmocka_unit_test_setup_teardown(pool_release_small_double_free, setup_capture, teardown_capture),
        cmocka_unit_test_setup_teardown(pool_checked_small_double_free, setup_capture, teardown_capture),
        cmocka_unit_test_setup_teardown(pool_device_small_double_free, setup_capture, teardown_capture),
        cmocka_unit_test(pool_destroy_reports_live_blocks),
        cmocka_unit_test_setup_teardown(pool_checked_overflow, setup_capture, teardown_capture),
        cmocka_unit_test_setup_teardown(pool_checked_write_after_free, setup_capture, teardown_capture),
        cmocka_unit_test_setup_teardown(fixed_checked_plain, setup_capture, teardown_capture),
        cmocka_unit_test_setup_teardown(fixed_checked_thread_safe, setup_capture, teardown_capture),
        cmocka_unit_test_setup_teardown(kv_stale_handle, setup_capture, teardown_capture),
        cmocka_unit_test_setup_teardown(asan_use_after_free, setup_capture, teardown_capture),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
