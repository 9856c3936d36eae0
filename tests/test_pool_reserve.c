/*
 * test_pool_reserve.c - a pool that grows in place (reserve_bytes): one
 * virtually contiguous range reserved up front, pages committed as blocks
 * take them and decommitted when they are free; no block ever moves, and
 * contents survive every growth and shrink. Over the os resource (host) and
 * the sim device (device rules: the pool never touches the memory, bytes
 * go through copy()); the same over cuda-vmm is in test_cuda.c.
 */
#include "test_util.h"
#include "support/cases.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

typedef struct env {
    llmem_resource *base, *track;
    llmem_pool *pool;
    bool device;
} env;

static void env_make(env *e, bool device, size_t reserve, size_t max_bytes)
{
    memset(e, 0, sizeof *e);
    e->device = device;
    /* 512 MiB physical on the device; the reservation is address space. */
    e->base = device ? test_sim_new(512 * MiB) : test_os_new();
    assert_ok(llmem_tracking_resource_create(e->base, &e->track));
    llmem_pool_options o = llmem_pool_options_default();
    o.name = "in-place";
    o.resource = e->track;
    o.reserve_bytes = reserve;
    o.max_bytes = max_bytes;
    o.purge = LLMEM_POOL_PURGE_MANUAL;
    assert_ok(llmem_pool_create(&o, &e->pool));
}

static void env_free(env *e)
{
    assert_ok(llmem_pool_check(e->pool));
    llmem_pool_destroy(e->pool);
    assert_int_equal(test_tracking_stats(e->track).live_mappings, 0);
    llmem_resource_destroy(e->track);
    llmem_resource_destroy(e->base);
}

/* Write and verify a block's pattern, directly or through copy(). */
static void put(env *e, void *b, size_t n, unsigned seed)
{
    unsigned char *buf = malloc(n);
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(seed * 131 + i * 7);
    if (e->device) assert_ok(llmem_resource_copy(e->track, b, buf, n));
    else memcpy(b, buf, n);
    free(buf);
}

static void check(env *e, const void *b, size_t n, unsigned seed)
{
    unsigned char *buf = malloc(n);
    if (e->device) assert_ok(llmem_resource_copy(e->track, buf, b, n));
    else memcpy(buf, b, n);
    for (size_t i = 0; i < n; i++)
        if (buf[i] != (unsigned char)(seed * 131 + i * 7)) fail_msg("block %p byte %zu changed", b, i);
    free(buf);
}

static void grows_in_place(bool device)
{
    env e;
    env_make(&e, device, 4 * GiB, 0);
    llmem_pool_stats s = test_pool_stats(e.pool);
    assert_int_equal(s.reserved_bytes, 0); /* nothing mapped before the first allocation */

    /* A KV-cache-like growth: per-layer slabs of 2 MiB appended, plus
     * small objects and a few large activations, over 200 MiB in all. */
    enum { N = 120 };
    void *blk[N];
    size_t size[N];
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int i = 0; i < N; i++) {
        size[i] = i % 10 == 9 ? 8 * MiB + (size_t)i * 4096 : i % 3 ? 2 * MiB : 200 + (size_t)i * 13;
        blk[i] = llmem_pool_alloc(e.pool, size[i], NULL);
        assert_non_null(blk[i]);
        put(&e, blk[i], size[i] < 4096 ? size[i] : 4096, (unsigned)i);
        if ((uintptr_t)blk[i] < lo) lo = (uintptr_t)blk[i];
        if ((uintptr_t)blk[i] + size[i] > hi) hi = (uintptr_t)blk[i] + size[i];
        s = test_pool_stats(e.pool);
        assert_int_equal(s.superblocks, 1);      /* never a second mapping */
        assert_int_equal(s.reserved_bytes, 4 * GiB);
        assert_true(s.committed_bytes < 2 * s.used_bytes + 8 * MiB); /* follows demand */
    }
    assert_true(hi - lo <= 4 * GiB);
    assert_true(s.used_bytes > 200 * MiB);
    assert_true(s.resource_calls_total < 2 * N); /* a commit per growth step, not per block */

    /* Free every other block and shrink: committed memory goes back, the
     * range stays, the survivors do not move and keep their bytes. */
    for (int i = 0; i < N; i += 2) assert_ok(llmem_pool_free(e.pool, blk[i]));
    uint64_t before = test_pool_stats(e.pool).committed_bytes;
    size_t released = llmem_pool_trim(e.pool);
    s = test_pool_stats(e.pool);
    assert_true(released > 0);
    assert_int_equal(s.committed_bytes, before - released);
    assert_int_equal(s.reserved_bytes, 4 * GiB);
    assert_int_equal(s.superblocks, 1);
    for (int i = 1; i < N; i += 2) check(&e, blk[i], size[i] < 4096 ? size[i] : 4096, (unsigned)i);
    assert_ok(llmem_pool_check(e.pool));

    /* Grow again into the decommitted holes. */
    for (int i = 0; i < N; i += 2) {
        blk[i] = llmem_pool_alloc(e.pool, size[i], NULL);
        assert_non_null(blk[i]);
        assert_true((uintptr_t)blk[i] >= lo - 4 * GiB && (uintptr_t)blk[i] < lo + 4 * GiB);
        put(&e, blk[i], size[i] < 4096 ? size[i] : 4096, (unsigned)i + 1000);
    }
    for (int i = 1; i < N; i += 2) check(&e, blk[i], size[i] < 4096 ? size[i] : 4096, (unsigned)i);
    for (int i = 0; i < N; i++) assert_ok(llmem_pool_free(e.pool, blk[i]));
    llmem_pool_trim(e.pool);
    s = test_pool_stats(e.pool);
    assert_int_equal(s.used_bytes, 0);
    assert_int_equal(s.committed_bytes, 0); /* everything decommitted */
    assert_int_equal(s.reserved_bytes, 4 * GiB); /* the range stays until destroy */
    env_free(&e);
}

TEST_CASE(host_grows_in_place, grows_in_place(false))
TEST_CASE(device_grows_in_place, grows_in_place(true))

/* Past the range: ordinary superblocks, and the range is still used first. */
static void overflow_adds_superblocks(void **state)
{
    (void)state;
    env e;
    env_make(&e, false, 16 * MiB, 0);
    void *a = llmem_pool_alloc(e.pool, 12 * MiB, NULL);
    void *b = llmem_pool_alloc(e.pool, 12 * MiB, NULL); /* does not fit the rest */
    assert_non_null(a);
    assert_non_null(b);
    llmem_pool_stats s = test_pool_stats(e.pool);
    assert_int_equal(s.superblocks, 2);
    assert_ok(llmem_pool_free(e.pool, b));
    llmem_pool_trim(e.pool);
    assert_int_equal(test_pool_stats(e.pool).superblocks, 1); /* the extra one goes, the range stays */
    /* A request bigger than the whole range on the first growth. */
    assert_ok(llmem_pool_free(e.pool, a));
    env_free(&e);
    env_make(&e, true, 16 * MiB, 0);
    void *c = llmem_pool_alloc(e.pool, 40 * MiB, NULL);
    assert_non_null(c);
    assert_int_equal(test_pool_stats(e.pool).superblocks, 2);
    assert_ok(llmem_pool_free(e.pool, c));
    env_free(&e);
}

/* llmem_pool_reserve bigger than the whole range, as the pool's first
 * growth: the first grow maps the range, which cannot hold it, so a second
 * grow must map an ordinary superblock (a fuzzer found the reserve path
 * committing past the range's end instead). */
static void reserve_past_the_range(void **state)
{
    (void)state;
    env e;
    env_make(&e, false, 4 * MiB, 0);
    assert_ok(llmem_pool_reserve(e.pool, 10 * MiB));
    llmem_pool_stats s = test_pool_stats(e.pool);
    assert_int_equal(s.superblocks, 2);
    assert_true(s.committed_bytes >= 10 * MiB);
    void *a = llmem_pool_alloc(e.pool, 10 * MiB, NULL);
    assert_non_null(a);
    put(&e, a, 10 * MiB, 7);
    check(&e, a, 10 * MiB, 7);
    assert_ok(llmem_pool_free(e.pool, a));
    env_free(&e);
}

/* Compaction moves handle blocks into the range, never out of it. */
static void compaction_keeps_the_range(void **state)
{
    (void)state;
    env e;
    env_make(&e, false, 64 * MiB, 0);
    llmem_handle h[24];
    for (int i = 0; i < 24; i++) assert_ok(llmem_pool_handle_alloc(e.pool, 2 * MiB, &h[i]));
    for (int i = 0; i < 24; i += 3) assert_ok(llmem_pool_handle_free(e.pool, h[i]));
    llmem_pool_compact_report r;
    memset(&r, 0, sizeof r);
    assert_ok(llmem_pool_compact(e.pool, 0, &r));
    llmem_pool_stats s = test_pool_stats(e.pool);
    assert_int_equal(s.superblocks, 1);
    assert_int_equal(s.reserved_bytes, 64 * MiB);
    for (int i = 0; i < 24; i++)
        if (i % 3) assert_ok(llmem_pool_handle_free(e.pool, h[i]));
    env_free(&e);
}

static void bad_options(void **state)
{
    (void)state;
    llmem_pool_options o = llmem_pool_options_default();
    o.reserve_bytes = 64 * MiB;
    o.max_bytes = 32 * MiB;
    llmem_pool *p = NULL;
    assert_status(llmem_pool_create(&o, &p), LLMEM_EINVAL);
    assert_null(p);
    o.max_bytes = 0;
    o.reserve_bytes = SIZE_MAX - 5;
    assert_status(llmem_pool_create(&o, &p), LLMEM_EOVERFLOW);
    /* max_bytes counts the range: nothing else fits beside a full one. */
    env e;
    env_make(&e, false, 32 * MiB, 32 * MiB);
    void *a = llmem_pool_alloc(e.pool, 30 * MiB, NULL);
    assert_non_null(a);
    llmem_status st;
    assert_null(llmem_pool_alloc(e.pool, 8 * MiB, &st));
    assert_int_equal(st, LLMEM_ENOMEM);
    assert_ok(llmem_pool_free(e.pool, a));
    env_free(&e);
}

/* Faults: a commit that fails surfaces as ENOMEM and changes nothing. */
static void commit_failure_is_clean(void **state)
{
    (void)state;
    test_fault_stack fs;
    test_fault_stack_open(&fs, NULL);
    llmem_pool_options o = llmem_pool_options_default();
    o.resource = fs.fault;
    o.reserve_bytes = 256 * MiB;
    o.purge = LLMEM_POOL_PURGE_MANUAL;
    llmem_pool *p = NULL;
    assert_ok(llmem_pool_create(&o, &p));
    void *a = llmem_pool_alloc(p, 4 * MiB, NULL);
    assert_non_null(a);
    memset(a, 1, 4 * MiB);
    test_fault_arm(fs.fault, 1, 1, LLMEM_FAULT_OP_COMMIT);
    llmem_pool_stats s0 = test_pool_stats(p);
    llmem_status st;
    assert_null(llmem_pool_alloc(p, 4 * MiB, &st));
    assert_int_equal(st, LLMEM_ENOMEM);
    llmem_pool_stats s1 = test_pool_stats(p);
    assert_int_equal(s1.committed_bytes, s0.committed_bytes);
    assert_int_equal(s1.used_bytes, s0.used_bytes);
    assert_ok(llmem_pool_check(p));
    void *b = llmem_pool_alloc(p, 4 * MiB, NULL); /* the fault was one-shot */
    assert_non_null(b);
    assert_int_equal(((unsigned char *)a)[4 * MiB - 1], 1);
    assert_ok(llmem_pool_free(p, a));
    assert_ok(llmem_pool_free(p, b));
    llmem_pool_destroy(p);
    assert_int_equal(test_tracking_stats(fs.track).live_mappings, 0);
    test_fault_stack_close(&fs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(host_grows_in_place),
        cmocka_unit_test(device_grows_in_place),
        cmocka_unit_test(overflow_adds_superblocks),
        cmocka_unit_test(reserve_past_the_range),
        cmocka_unit_test(compaction_keeps_the_range),
        cmocka_unit_test(bad_options),
        cmocka_unit_test(commit_failure_is_clean),
    };
    return cmocka_run_group_tests(tests, test_quiet_logs, NULL);
}
