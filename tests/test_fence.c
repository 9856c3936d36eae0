/*
 * test_fence.c - the pool's fenced frees (stream-ordered release) with
 * fences made from flags: a fenced block is never handed out before its
 * fence is done, is handed out again after, an allocation that would fail
 * waits for fences instead, every fence is dropped exactly once on every
 * path, and misuse is refused. On the host and on the sim device; the same
 * with CUDA events is in test_cuda.c (needs a GPU).
 */
#include <pthread.h>

#include "test_util.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* ---- a fence made from a flag ----------------------------------------------- */

typedef struct flag_fence {
    int done;          /* set by the test (or a thread) when the "work" is complete */
    int drops;         /* how many times the pool dropped it */
    int polls;         /* done() calls */
    int waits;         /* wait() calls */
    int done_after;    /* > 0: done() turns true on this poll (a fence without wait) */
} flag_fence;

static bool ff_done(void *f)
{
    flag_fence *x = f;
    __atomic_add_fetch(&x->polls, 1, __ATOMIC_RELAXED);
    if (x->done_after && __atomic_load_n(&x->polls, __ATOMIC_RELAXED) >= x->done_after)
        __atomic_store_n(&x->done, 1, __ATOMIC_RELEASE);
    return __atomic_load_n(&x->done, __ATOMIC_ACQUIRE);
}

static llmem_status ff_wait(void *f)
{
    flag_fence *x = f;
    x->waits++;
    __atomic_store_n(&x->done, 1, __ATOMIC_RELEASE); /* "synchronise": the work completes */
    return LLMEM_OK;
}

static void ff_drop(void *f) { __atomic_add_fetch(&((flag_fence *)f)->drops, 1, __ATOMIC_RELAXED); }

static llmem_fence fence_of(flag_fence *f, bool with_wait)
{
    return (llmem_fence){ff_done, with_wait ? ff_wait : NULL, ff_drop, f};
}

/* ---- pools ---------------------------------------------------------------------- */

typedef struct env {
    llmem_resource *res; /* NULL: the default host resource */
    llmem_pool *pool;
    bool device;
} env;

static void env_make(env *e, bool device, bool checked, size_t max_bytes)
{
    memset(e, 0, sizeof *e);
    e->device = device;
    if (device) e->res = test_sim_new(256 * MiB);
    llmem_pool_options o = llmem_pool_options_default();
    o.name = "fenced";
    o.resource = e->res;
    o.checked = checked;
    o.max_bytes = max_bytes;
    if (max_bytes) o.first_superblock_bytes = o.max_superblock_bytes = max_bytes / 2;
    o.purge = LLMEM_POOL_PURGE_MANUAL;
    assert_ok(llmem_pool_create(&o, &e->pool));
}

static void env_free(env *e)
{
    assert_ok(llmem_pool_check(e->pool));
    llmem_pool_destroy(e->pool);
    llmem_resource_destroy(e->res);
}

/* ---- never before the fence ------------------------------------------------------ */

/* Free one block of `size` with a pending fence, then allocate `n` blocks
 * of that size: none is the fenced one. Then the fence completes, and the
 * block comes back on a later allocation. */
static void not_before_fence(bool device, bool checked, size_t size, int n)
{
    env e;
    env_make(&e, device, checked, 0);
    void *a = llmem_pool_alloc(e.pool, size, NULL);
    assert_non_null(a);
    flag_fence f = {0};
    llmem_fence fence = fence_of(&f, true);
    assert_ok(llmem_pool_free_fenced(e.pool, a, &fence));
    llmem_pool_stats s = test_pool_stats(e.pool);
    assert_int_equal(s.fenced_pending, 1);
    assert_true(s.fenced_pending_bytes >= size);
    assert_int_equal(s.fenced_frees_total, 1);
    assert_int_equal(s.live_allocations, 1); /* still allocated */
    assert_false(llmem_pool_owns(e.pool, a)); /* but no longer the caller's */

    void **got = calloc((size_t)n, sizeof *got);
    for (int i = 0; i < n; i++) {
        got[i] = llmem_pool_alloc(e.pool, size, NULL);
        assert_non_null(got[i]);
        assert_ptr_not_equal(got[i], a);
    }
    for (int i = 0; i < n; i++) assert_ok(llmem_pool_free(e.pool, got[i]));
    assert_int_equal(llmem_pool_poll_fenced(e.pool), 0);
    assert_int_equal(f.drops, 0);
    assert_int_equal(f.waits, 0); /* nothing was short of memory */

    __atomic_store_n(&f.done, 1, __ATOMIC_RELEASE);
    assert_int_equal(llmem_pool_poll_fenced(e.pool), 1);
    assert_int_equal(f.drops, 1);
    s = test_pool_stats(e.pool);
    assert_int_equal(s.fenced_pending, 0);
    assert_int_equal(s.fenced_pending_bytes, 0);
    assert_int_equal(s.live_allocations, 0);
    /* The block is free again: allocations of its size reach it. */
    free(got);
    got = calloc((size_t)n * 4, sizeof *got);
    bool seen = false;
    int m = 0;
    while (m < n * 4 && !seen) {
        got[m] = llmem_pool_alloc(e.pool, size, NULL);
        assert_non_null(got[m]);
        seen = got[m++] == a;
    }
    assert_true(seen);
    for (int i = 0; i < m; i++) assert_ok(llmem_pool_free(e.pool, got[i]));
    free(got);
    env_free(&e);
}

static void small_block_waits_for_its_fence(void **state)
{
    (void)state;
    not_before_fence(false, false, 64, 2000);
    not_before_fence(false, true, 64, 300);
    not_before_fence(true, false, 256, 2000);
}

static void large_block_waits_for_its_fence(void **state)
{
    (void)state;
    not_before_fence(false, false, 300 * KiB, 40);
    not_before_fence(false, true, 300 * KiB, 40);
    not_before_fence(true, false, 2 * MiB, 20);
}

/* The pool polls on its own slow paths: completed fences give their blocks
 * back without llmem_pool_poll_fenced. */
static void slow_paths_poll(void **state)
{
    (void)state;
    env e;
    env_make(&e, false, false, 0);
    flag_fence f[8] = {{0}};
    for (int i = 0; i < 8; i++) {
        void *a = llmem_pool_alloc(e.pool, MiB, NULL);
        llmem_fence fence = fence_of(&f[i], true);
        assert_ok(llmem_pool_free_fenced(e.pool, a, &fence));
    }
    for (int i = 0; i < 8; i += 2) f[i].done = 1;
    void *b = llmem_pool_alloc(e.pool, MiB, NULL); /* a large allocation: a slow path */
    assert_non_null(b);
    assert_int_equal(test_pool_stats(e.pool).fenced_pending, 4);
    for (int i = 0; i < 8; i++) assert_int_equal(f[i].drops, i % 2 == 0);
    assert_ok(llmem_pool_free(e.pool, b));
    /* Drain waits for the rest. */
    assert_int_equal(llmem_pool_drain_fenced(e.pool), 4);
    for (int i = 0; i < 8; i++) assert_int_equal(f[i].drops, 1);
    assert_int_equal(test_pool_stats(e.pool).fenced_pending, 0);
    assert_int_equal(test_pool_stats(e.pool).fence_waits_total, 0); /* a drain is not a forced wait */
    env_free(&e);
}

/* ---- short of memory: wait for fences, not fail ----------------------------------- */

static void full_pool_waits_for_fences(bool with_wait, bool device)
{
    env e;
    /* Room for about 8 blocks of 1 MiB, no more. */
    env_make(&e, device, false, 8 * MiB);
    void *blk[64];
    int n = 0;
    while (n < 64 && (blk[n] = llmem_pool_alloc(e.pool, MiB, NULL)) != NULL) n++;
    assert_true(n >= 4 && n < 64);
    flag_fence f[64];
    memset(f, 0, sizeof f);
    for (int i = 0; i < n; i++) {
        if (!with_wait) f[i].done_after = 3; /* completes on its third poll */
        llmem_fence fence = fence_of(&f[i], with_wait);
        assert_ok(llmem_pool_free_fenced(e.pool, blk[i], &fence));
    }
    uint64_t failures = test_pool_stats(e.pool).failures_total; /* the fill's last try */
    void *b = llmem_pool_alloc(e.pool, MiB, NULL);
    assert_non_null(b); /* instead of LLMEM_ENOMEM */
    llmem_pool_stats s = test_pool_stats(e.pool);
    assert_true(s.fence_waits_total >= 1);
    assert_int_equal(s.failures_total, failures);
    /* Oldest first: the first block's fence was the one completed. */
    assert_int_equal(f[0].drops, 1);
    if (with_wait) assert_int_equal(f[0].waits, 1);
    assert_ok(llmem_pool_free(e.pool, b));
    llmem_pool_drain_fenced(e.pool);
    for (int i = 0; i < n; i++) assert_int_equal(f[i].drops, 1);
    env_free(&e);
}

static void allocation_waits_instead_of_failing(void **state)
{
    (void)state;
    full_pool_waits_for_fences(true, false);
    full_pool_waits_for_fences(false, false); /* done() polled with sleeps */
    full_pool_waits_for_fences(true, true);
}

/* Small blocks too: a refill that finds no memory waits. */
static void small_refill_waits(void **state)
{
    (void)state;
    env e;
    env_make(&e, false, false, 4 * MiB);
    enum { N = 200000 };
    void **blk = calloc(N, sizeof *blk);
    int n = 0;
    while (n < N && (blk[n] = llmem_pool_alloc(e.pool, 1024, NULL)) != NULL) n++;
    assert_true(n > 100 && n < N);
    flag_fence f = {0};
    llmem_fence fence = fence_of(&f, true);
    /* One fence for a whole batch would be one event on one stream: here each
     * block gets its own, all sharing a flag, dropped once per block. */
    for (int i = 0; i < n; i++) assert_ok(llmem_pool_free_fenced(e.pool, blk[i], &fence));
    llmem_pool_flush_thread_cache(e.pool);
    void *b = llmem_pool_alloc(e.pool, 1024, NULL);
    assert_non_null(b);
    assert_true(test_pool_stats(e.pool).fence_waits_total >= 1);
    assert_ok(llmem_pool_free(e.pool, b));
    llmem_pool_drain_fenced(e.pool);
    assert_int_equal(f.drops, n);
    free(blk);
    env_free(&e);
}

/* ---- misuse, and drops on every path --------------------------------------------- */

static void refusals_drop_the_fence(void **state)
{
    (void)state;
    env e;
    env_make(&e, false, true, 0);
    flag_fence f = {0};
    llmem_fence fence = fence_of(&f, true);
    int on_stack;
    assert_status(llmem_pool_free_fenced(e.pool, &on_stack, &fence), LLMEM_EFOREIGN);
    assert_int_equal(f.drops, 1);
    llmem_fence no_done = {NULL, NULL, ff_drop, &f};
    void *a = llmem_pool_alloc(e.pool, 64, NULL);
    assert_status(llmem_pool_free_fenced(e.pool, a, &no_done), LLMEM_EINVAL);
    assert_int_equal(f.drops, 2);
    assert_status(llmem_pool_free_fenced(NULL, a, &fence), LLMEM_EINVAL);
    assert_int_equal(f.drops, 3);
    assert_status(llmem_pool_free_fenced(e.pool, a, NULL), LLMEM_EINVAL);
    assert_ok(llmem_pool_free_fenced(e.pool, NULL, &fence)); /* NULL ptr: nothing to free */
    assert_int_equal(f.drops, 4);

    /* Pending: a second free of either kind is a double free. */
    flag_fence g = {0}, h = {0};
    llmem_fence fg = fence_of(&g, true), fh = fence_of(&h, true);
    assert_ok(llmem_pool_free_fenced(e.pool, a, &fg));
    assert_status(llmem_pool_free(e.pool, a), LLMEM_EDOUBLEFREE);
    assert_error_mentions("fenced free is pending");
    assert_status(llmem_pool_free_fenced(e.pool, a, &fh), LLMEM_EDOUBLEFREE);
    assert_int_equal(h.drops, 1);
    assert_null(llmem_pool_realloc(e.pool, a, 128, NULL));
    assert_int_equal(llmem_pool_usable_size(e.pool, a), 0);
    env_free(&e);

    env_make(&e, false, false, 0);
    void *big = llmem_pool_alloc(e.pool, MiB, NULL);
    flag_fence k = {0};
    llmem_fence fk = fence_of(&k, true);
    assert_ok(llmem_pool_free_fenced(e.pool, big, &fk));
    assert_status(llmem_pool_free(e.pool, big), LLMEM_EDOUBLEFREE);
    /* Release mode, small block: the thread-cache path refuses it too. */
    void *sm = llmem_pool_alloc(e.pool, 64, NULL);
    flag_fence ks = {0};
    llmem_fence fks = fence_of(&ks, true);
    assert_ok(llmem_pool_free_fenced(e.pool, sm, &fks));
    assert_status(llmem_pool_free(e.pool, sm), LLMEM_EDOUBLEFREE);
    assert_error_mentions("fenced free is pending");
    /* A handle block is freed with llmem_pool_handle_free, fenced or not. */
    llmem_handle hd;
    assert_ok(llmem_pool_handle_alloc(e.pool, 64 * KiB, &hd));
    void *hp = llmem_pool_pin(e.pool, hd, NULL);
    assert_status(llmem_pool_free_fenced(e.pool, hp, &fk), LLMEM_EINVAL);
    assert_int_equal(k.drops, 1);
    llmem_pool_unpin(e.pool, hd);
    assert_ok(llmem_pool_handle_free(e.pool, hd));
    /* Destroy with a fence pending drops it without waiting. */
    assert_ok(llmem_pool_check(e.pool));
    llmem_pool_destroy(e.pool);
    assert_int_equal(k.drops, 1 + 1);
    assert_int_equal(k.waits, 0);
}

/* A fence already done at the call: an ordinary free. */
static void done_fence_frees_at_once(void **state)
{
    (void)state;
    env e;
    env_make(&e, false, false, 0);
    flag_fence f = {.done = 1};
    llmem_fence fence = fence_of(&f, true);
    void *a = llmem_pool_alloc(e.pool, 5000, NULL);
    assert_ok(llmem_pool_free_fenced(e.pool, a, &fence));
    assert_int_equal(f.drops, 1);
    llmem_pool_stats s = test_pool_stats(e.pool);
    assert_int_equal(s.fenced_pending, 0);
    assert_int_equal(s.fenced_frees_total, 0);
    assert_int_equal(s.live_allocations, 0);
    env_free(&e);
}

/* Shrink polls first: a completed fence's superblock can go back. */
static void shrink_sees_completed_fences(void **state)
{
    (void)state;
    env e;
    env_make(&e, false, false, 0);
    void *a = llmem_pool_alloc(e.pool, 3 * MiB, NULL);
    flag_fence f = {0};
    llmem_fence fence = fence_of(&f, true);
    assert_ok(llmem_pool_free_fenced(e.pool, a, &fence));
    assert_true(llmem_pool_trim(e.pool) < 3 * MiB); /* in flight: the block's pages stay */
    assert_true(test_pool_stats(e.pool).committed_bytes >= 3 * MiB);
    f.done = 1;
    assert_true(llmem_pool_trim(e.pool) >= 3 * MiB);
    assert_int_equal(test_pool_stats(e.pool).reserved_bytes, 0);
    env_free(&e);
}

/* ---- another thread completes the work ----------------------------------------------- */

typedef struct completer {
    flag_fence *f;
    int n;
} completer;

static void *complete_all(void *arg)
{
    completer *c = arg;
    for (int i = 0; i < c->n; i++) {
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
        __atomic_store_n(&c->f[i].done, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

static void fences_completed_by_another_thread(void **state)
{
    (void)state;
    env e;
    env_make(&e, false, false, 0);
    enum { N = 64 };
    flag_fence f[N];
    memset(f, 0, sizeof f);
    void *blk[N];
    for (int i = 0; i < N; i++) {
        blk[i] = llmem_pool_alloc(e.pool, 256 * KiB, NULL);
        llmem_fence fence = fence_of(&f[i], false);
        assert_ok(llmem_pool_free_fenced(e.pool, blk[i], &fence));
    }
    completer c = {f, N};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, complete_all, &c), 0);
    /* Allocate while fences complete: never a block whose fence is not done. */
    for (int round = 0; round < 200; round++) {
        void *b = llmem_pool_alloc(e.pool, 256 * KiB, NULL);
        assert_non_null(b);
        for (int i = 0; i < N; i++)
            if (b == blk[i]) assert_true(__atomic_load_n(&f[i].done, __ATOMIC_ACQUIRE));
        assert_ok(llmem_pool_free(e.pool, b));
    }
    pthread_join(t, NULL);
    llmem_pool_drain_fenced(e.pool);
    for (int i = 0; i < N; i++) assert_int_equal(f[i].drops, 1);
    env_free(&e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(small_block_waits_for_its_fence),
        cmocka_unit_test(large_block_waits_for_its_fence),
        cmocka_unit_test(slow_paths_poll),
        cmocka_unit_test(allocation_waits_instead_of_failing),
        cmocka_unit_test(small_refill_waits),
        cmocka_unit_test(refusals_drop_the_fence),
        cmocka_unit_test(done_fence_frees_at_once),
        cmocka_unit_test(shrink_sees_completed_fences),
        cmocka_unit_test(fences_completed_by_another_thread),
    };
    return cmocka_run_group_tests(tests, test_quiet_logs, NULL);
}
