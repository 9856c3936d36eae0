/*
 * test_cuda.c - the CUDA resources on a real GPU: the resource contract
 * (sizes, alignment, copy round trips, stats, refusals) for cuda,
 * cuda-async, cuda-managed and cuda-host; managed memory refuses to
 * oversubscribe; cuda-async frees and maps again; pinned host memory is
 * CPU-writable; a device pool over cuda keeps its metadata on the host.
 *
 * Without a device every test prints "skipped: no CUDA device (...)" and
 * skips (tests/test_cuda_absent.c covers that path's statuses).
 */
#include "test_util.h"

#include "llmem/cuda_resource.h"

#define KiB ((size_t)1024)
#define MiB (KiB * 1024)

/* Skip the calling test unless a CUDA device is there. */
#define NEED_DEVICE()                                                                            \
    do {                                                                                         \
        int n_ = 0;                                                                              \
        llmem_status st_ = llmem_cuda_device_count(&n_);                                         \
        if (st_ != LLMEM_OK || n_ == 0) {                                                        \
            printf("skipped: no CUDA device (%s)\n", llmem_last_error());                        \
            skip();                                                                              \
        }                                                                                        \
    } while (0)

typedef llmem_status (*creator)(const llmem_cuda_options *, llmem_resource **);

static llmem_resource *make(creator fn)
{
    llmem_resource *r = NULL;
    assert_ok(fn(NULL, &r));
    assert_non_null(r);
    return r;
}

static llmem_resource_stats rstats(const llmem_resource *r)
{
    llmem_resource_stats s;
    memset(&s, 0, sizeof s);
    assert_ok(llmem_resource_get_stats(r, &s));
    return s;
}

static void pattern(unsigned char *buf, size_t n, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (unsigned char)(x >> 16);
    }
}

/* Host -> mapping -> mapping -> host; the bytes come back unchanged. */
static void round_trip(llmem_resource *r, void *a, void *b, size_t n, unsigned seed)
{
    unsigned char *in = malloc(n), *out = malloc(n);
    assert_non_null(in);
    assert_non_null(out);
    pattern(in, n, seed);
    memset(out, 0, n);
    assert_ok(llmem_resource_copy(r, a, in, n));
    assert_ok(llmem_resource_copy(r, b, a, n));
    assert_ok(llmem_resource_copy(r, out, b, n));
    assert_memory_equal(in, out, n);
    free(in);
    free(out);
}

/* The contract every flavour keeps. */
static void contract(llmem_resource *r, const char *name, llmem_mem_kind kind)
{
    llmem_resource_info info;
    assert_ok(llmem_resource_get_info(r, &info));
    assert_string_equal(info.name, name);
    assert_int_equal(info.kind, kind);
    assert_true(info.min_align >= 256);
    assert_int_equal(info.max_align, LLMEM_MAX_ALIGN);
    const size_t g = info.granularity;

    static const size_t sizes[] = {1, 255, 256, 4097, 1 * MiB + 3, 33 * MiB};
    static const size_t aligns[] = {0, 256, 4096, 64 * KiB, 2 * MiB, 32 * MiB};
    void *maps[sizeof sizes / sizeof sizes[0]][sizeof aligns / sizeof aligns[0]];
    uint64_t bytes = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (size_t j = 0; j < sizeof aligns / sizeof aligns[0]; j++) {
            void *p = NULL;
            assert_ok(llmem_resource_map(r, sizes[i], aligns[j], 0, &p));
            assert_non_null(p);
            size_t want = aligns[j] > info.min_align ? aligns[j] : info.min_align;
            if ((uintptr_t)p % want) fail_msg("%s: map(%zu, %zu) gave %p", name, sizes[i], aligns[j], p);
            maps[i][j] = p;
            bytes += (sizes[i] + g - 1) / g * g;
        }
    llmem_resource_stats s = rstats(r);
    assert_int_equal(s.mapped_bytes, bytes);
    assert_int_equal(s.mappings, 36);
    assert_int_equal(s.map_calls_total, 36);

    /* Bytes survive host -> device -> device -> host, at the edges too. */
    round_trip(r, maps[4][0], maps[4][1], 1 * MiB + 3, 1);
    round_trip(r, maps[5][5], maps[5][4], 33 * MiB, 2);
    round_trip(r, maps[0][0], maps[1][2], 1, 3);
    s = rstats(r);
    assert_int_equal(s.copy_calls_total, 9);

    /* Refusals: overlapping copy, decommit, foreign and mis-sized unmaps. */
    uint64_t failures = s.failures_total;
    llmem_clear_error();
    assert_status(llmem_resource_copy(r, (char *)maps[5][0] + 1, maps[5][0], 4096), LLMEM_EINVAL);
    assert_status(llmem_resource_decommit(r, maps[5][0], g), LLMEM_ENOTSUP);
    assert_ok(llmem_resource_commit(r, maps[5][0], g)); /* always backed: a no-op */
    int local;
    assert_status(llmem_resource_unmap(r, &local, g, g), LLMEM_EINVAL);
    assert_status(llmem_resource_unmap(r, maps[4][0], 64 * MiB, 64 * MiB), LLMEM_EINVAL);
    assert_int_equal(rstats(r).failures_total, failures + 4);

    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (size_t j = 0; j < sizeof aligns / sizeof aligns[0]; j++)
            assert_ok(llmem_resource_unmap(r, maps[i][j], sizes[i], sizes[i]));
    s = rstats(r);
    assert_int_equal(s.mapped_bytes, 0);
    assert_int_equal(s.mappings, 0);
    assert_int_equal(s.unmap_calls_total, 36);
}

static void cuda_contract(void **state)
{
    (void)state;
    NEED_DEVICE();
    llmem_resource *r = make(llmem_cuda_resource_create);
    contract(r, "cuda", LLMEM_MEM_DEVICE);
    llmem_resource_destroy(r);
}

static void async_contract(void **state)
{
    (void)state;
    NEED_DEVICE();
    llmem_resource *r = make(llmem_cuda_async_resource_create);
    contract(r, "cuda-async", LLMEM_MEM_DEVICE);
    llmem_resource_destroy(r);
}

static void managed_contract(void **state)
{
    (void)state;
    NEED_DEVICE();
    llmem_resource *r = NULL;
    llmem_status st = llmem_cuda_managed_resource_create(NULL, &r);
    if (st == LLMEM_ENOTSUP) {
        printf("skipped: %s\n", llmem_last_error());
        skip();
    }
    assert_ok(st);
    contract(r, "cuda-managed", LLMEM_MEM_DEVICE);
    llmem_resource_destroy(r);
}

static void host_contract(void **state)
{
    (void)state;
    NEED_DEVICE();
    llmem_resource *r = make(llmem_cuda_host_resource_create);
    contract(r, "cuda-host", LLMEM_MEM_HOST);
    llmem_resource_destroy(r);
}

/* Mapping more than the device has free is LLMEM_ENOMEM before any CUDA
 * allocation; a modest mapping still works afterwards. */
static void managed_refuses_past_free_memory(void **state)
{
    (void)state;
    NEED_DEVICE();
    llmem_resource *r = NULL;
    llmem_status st = llmem_cuda_managed_resource_create(NULL, &r);
    if (st == LLMEM_ENOTSUP) {
        printf("skipped: %s\n", llmem_last_error());
        skip();
    }
    assert_ok(st);
    void *p = (void *)&p;
    llmem_clear_error();
    assert_status(llmem_resource_map(r, (size_t)1 << 50, 0, 0, &p), LLMEM_ENOMEM); /* 1 PiB */
    assert_error_mentions("free");
    assert_null(p);
    assert_ok(llmem_resource_map(r, 4 * MiB, 0, 0, &p));
    round_trip(r, p, (char *)p + 2 * MiB, 2 * MiB, 7);
    assert_ok(llmem_resource_unmap(r, p, 4 * MiB, 4 * MiB));
    llmem_resource_destroy(r);
}

/* cuda-async: stream-ordered frees return blocks to the pool, and maps
 * after them work and hold data; a pool of its own with a threshold. */
static void async_frees_and_maps_again(void **state)
{
    (void)state;
    NEED_DEVICE();
    llmem_cuda_options o;
    memset(&o, 0, sizeof o);
    o.release_threshold = 256 * MiB;
    llmem_resource *r = NULL;
    assert_ok(llmem_cuda_async_resource_create(&o, &r));
    for (unsigned round = 0; round < 50; round++) {
        void *a = NULL, *b = NULL;
        size_t n = (size_t)(1 + round % 7) * MiB;
        assert_ok(llmem_resource_map(r, n, 0, 0, &a));
        assert_ok(llmem_resource_map(r, n, 0, 0, &b));
        round_trip(r, a, b, n, round);
        assert_ok(llmem_resource_unmap(r, a, n, n));
        assert_ok(llmem_resource_unmap(r, b, n, n));
    }
    llmem_resource_stats s = rstats(r);
    assert_int_equal(s.map_calls_total, 100);
    assert_int_equal(s.unmap_calls_total, 100);
    assert_int_equal(s.mapped_bytes, 0);
    assert_int_equal(s.failures_total, 0);
    llmem_resource_destroy(r);

    /* The device's default pool works too. */
    o.use_default_pool = true;
    o.release_threshold = 0;
    assert_ok(llmem_cuda_async_resource_create(&o, &r));
    void *p = NULL;
    assert_ok(llmem_resource_map(r, 8 * MiB, 0, 0, &p));
    llmem_resource_destroy(r); /* frees the live mapping with it */
}

/* Pinned host memory: the CPU writes and reads it directly. */
static void host_memory_is_cpu_writable(void **state)
{
    (void)state;
    NEED_DEVICE();
    llmem_resource *r = make(llmem_cuda_host_resource_create);
    unsigned char *p = NULL;
    size_t n = 8 * MiB;
    assert_ok(llmem_resource_map(r, n, 0, 0, (void **)&p));
    memset(p, 0xa5, n);
    for (size_t i = 0; i < n; i += 4093) assert_int_equal(p[i], 0xa5);
    unsigned char src[64];
    pattern(src, sizeof src, 9);
    assert_ok(llmem_resource_copy(r, p + 100, src, sizeof src));
    assert_memory_equal(p + 100, src, sizeof src);
    assert_ok(llmem_resource_unmap(r, p, n, n));
    llmem_resource_destroy(r);
}

/* A device pool over cuda: blocks are device pointers, the pool never
 * touches them (it would crash: device memory is not host-mapped), data
 * moves only through the resource's copy. */
static void pool_over_cuda(void **state)
{
    (void)state;
    NEED_DEVICE();
    llmem_resource *r = make(llmem_cuda_resource_create);
    llmem_pool_options po = llmem_pool_options_default();
    po.name = "gpu";
    po.resource = r;
    po.purge = LLMEM_POOL_PURGE_MANUAL;
    llmem_pool *p = NULL;
    assert_ok(llmem_pool_create(&po, &p));
    enum { N = 400 };
    void *blocks[N];
    size_t sizes[N];
    for (size_t i = 0; i < N; i++) {
        sizes[i] = (i % 5 == 0) ? (i + 1) * 4096 + 17 : (i * 37) % 3000 + 1;
        llmem_status st = LLMEM_OK;
        blocks[i] = llmem_pool_alloc(p, sizes[i], &st);
        assert_ok(st);
        assert_non_null(blocks[i]);
        assert_int_equal((uintptr_t)blocks[i] % 256, 0);
    }
    assert_ok(llmem_pool_check(p));
    /* One block's bytes survive a trip through device memory. */
    round_trip(r, blocks[5], blocks[10], sizes[5] < sizes[10] ? sizes[5] : sizes[10], 11);
    for (size_t i = 0; i < N; i += 2) assert_ok(llmem_pool_free(p, blocks[i]));
    assert_ok(llmem_pool_check(p));
    for (size_t i = 1; i < N; i += 2) assert_ok(llmem_pool_free(p, blocks[i]));
    llmem_pool_trim(p);
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
    llmem_resource_stats s = rstats(r);
    assert_int_equal(s.mapped_bytes, 0);
    llmem_resource_destroy(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cuda_contract),
        cmocka_unit_test(async_contract),
        cmocka_unit_test(managed_contract),
        cmocka_unit_test(host_contract),
        cmocka_unit_test_setup(managed_refuses_past_free_memory, test_quiet_logs),
        cmocka_unit_test(async_frees_and_maps_again),
        cmocka_unit_test(host_memory_is_cpu_writable),
        cmocka_unit_test(pool_over_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
