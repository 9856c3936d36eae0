/*
 * test_cuda.c - the CUDA resources on a real GPU: the resource contract
 * (sizes, alignment, copy round trips, stats, refusals) for cuda,
 * cuda-async, cuda-managed and cuda-host; managed memory refuses to
 * oversubscribe; cuda-async frees and maps again; pinned host memory is
 * CPU-writable; a device pool over cuda keeps its metadata on the host;
 * fenced frees with CUDA events are never reused before their event and
 * are waited for (one event, not the device) when the pool is full;
 * cuda-vmm commits and decommits inside a reservation keeping every other
 * byte, a pool over it grows in place, and the KV manager's CONTIGUOUS
 * layout over it keeps positions fixed while memory follows the tokens;
 * KV swapped out to pinned memory and back keeps every byte.
 *
 * Without a device the binary prints "skipped: no CUDA device (...)" and
 * exits 77, so CTest lists it as Skipped (tests/test_cuda_absent.c covers
 * that path's statuses).
 */
#include "test_util.h"
#include "support/cases.h"

#include <pthread.h>

#include <cuda_runtime_api.h>

#include "llmem/cuda_resource.h"

#define KiB ((size_t)1024)
#define MiB (KiB * 1024)

/* Skip the calling test unless a CUDA device is there. */
#define NEED_DEVICE()                                                                            \
    do {                                                                                         \
        int n_ = 0;                                                                              \
        llmem_status st_ = llmem_cuda_device_count(&n_);                                         \
        if (st_ != LLMEM_OK || n_ == 0) {                                                        \
            printf("skipped: no CUDA device (%s)\n", llmem_error_message());                        \
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

/* The same for a resource this device or driver may not offer
 * (LLMEM_ENOTSUP: the case is skipped, saying why). */
static llmem_resource *make_if_supported(creator fn)
{
    llmem_resource *r = NULL;
    llmem_status st = fn(NULL, &r);
    if (st == LLMEM_ENOTSUP) {
        printf("skipped: %s\n", llmem_error_message());
        skip();
    }
    assert_ok(st);
    return r;
}

/* Host -> mapping -> mapping -> host; the bytes come back unchanged. */
static void round_trip(llmem_resource *r, void *a, void *b, size_t n, unsigned seed)
{
    unsigned char *in = malloc(n), *out = malloc(n);
    assert_non_null(in);
    assert_non_null(out);
    test_pattern(in, n, seed);
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
    llmem_resource_stats s = test_resource_stats(r);
    assert_int_equal(s.mapped_bytes, bytes);
    assert_int_equal(s.mappings, 36);
    assert_int_equal(s.map_calls_total, 36);

    /* Bytes survive host -> device -> device -> host, at the edges too. */
    round_trip(r, maps[4][0], maps[4][1], 1 * MiB + 3, 1);
    round_trip(r, maps[5][5], maps[5][4], 33 * MiB, 2);
    round_trip(r, maps[0][0], maps[1][2], 1, 3);
    s = test_resource_stats(r);
    assert_int_equal(s.copy_calls_total, 9);

    /* Refusals: overlapping copy, decommit, foreign and mis-sized unmaps. */
    uint64_t failures = s.failures_total;
    llmem_error_clear();
    assert_status(llmem_resource_copy(r, (char *)maps[5][0] + 1, maps[5][0], 4096), LLMEM_EINVAL);
    assert_status(llmem_resource_decommit(r, maps[5][0], g), LLMEM_ENOTSUP);
    assert_ok(llmem_resource_commit(r, maps[5][0], g)); /* always backed: a no-op */
    int local;
    assert_status(llmem_resource_unmap(r, &local, g, g), LLMEM_EINVAL);
    assert_status(llmem_resource_unmap(r, maps[4][0], 64 * MiB, 64 * MiB), LLMEM_EINVAL);
    assert_int_equal(test_resource_stats(r).failures_total, failures + 4);

    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (size_t j = 0; j < sizeof aligns / sizeof aligns[0]; j++)
            assert_ok(llmem_resource_unmap(r, maps[i][j], sizes[i], sizes[i]));
    s = test_resource_stats(r);
    assert_int_equal(s.mapped_bytes, 0);
    assert_int_equal(s.mappings, 0);
    assert_int_equal(s.unmap_calls_total, 36);
}

/* The contract on each CUDA resource: one row a cmocka case (its name). */
typedef struct contract_row {
    creator create;
    const char *name;
    llmem_mem_kind kind;
    bool optional; /* may be LLMEM_ENOTSUP here: skipped */
} contract_row;

static const contract_row contract_rows[] = {
    {llmem_cuda_resource_create, "cuda", LLMEM_MEM_DEVICE, false},
    {llmem_cuda_async_resource_create, "cuda-async", LLMEM_MEM_DEVICE, false},
    {llmem_cuda_managed_resource_create, "cuda-managed", LLMEM_MEM_DEVICE, true},
    {llmem_cuda_host_resource_create, "cuda-host", LLMEM_MEM_HOST, false},
};

static void contract_case(void **state)
{
    const contract_row *row = *state;
    NEED_DEVICE();
    llmem_resource *r = row->optional ? make_if_supported(row->create) : make(row->create);
    contract(r, row->name, row->kind);
    llmem_resource_destroy(r);
}

/* Mapping more than the device has free is LLMEM_ENOMEM before any CUDA
 * allocation; a modest mapping still works afterwards. */
static void managed_refuses_past_free_memory(void **state)
{
    (void)state;
    NEED_DEVICE();
    llmem_resource *r = make_if_supported(llmem_cuda_managed_resource_create);
    void *p = (void *)&p;
    llmem_error_clear();
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
    llmem_resource_stats s = test_resource_stats(r);
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
    test_pattern(src, sizeof src, 9);
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
    llmem_resource_stats s = test_resource_stats(r);
    assert_int_equal(s.mapped_bytes, 0);
    llmem_resource_destroy(r);
}

/* ---- stream-ordered release with CUDA events ------------------------------
 *
 * A host function queued first on the stream holds it until the test opens
 * the gate, so the fence's event cannot complete before the test says so:
 * the checks do not depend on how fast the GPU is. */

typedef struct gate {
    int open;
} gate;

static void CUDART_CB gate_hold(void *arg)
{
    gate *g = arg;
    while (!__atomic_load_n(&g->open, __ATOMIC_ACQUIRE)) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

static void *gate_open_later(void *arg)
{
    struct timespec ts = {0, 50 * 1000000};
    nanosleep(&ts, NULL);
    __atomic_store_n(&((gate *)arg)->open, 1, __ATOMIC_RELEASE);
    return NULL;
}

static llmem_pool *gpu_pool(llmem_resource *r, size_t max_bytes)
{
    llmem_pool_options po = llmem_pool_options_default();
    po.name = "gpu-fenced";
    po.resource = r;
    po.purge = LLMEM_POOL_PURGE_MANUAL;
    po.max_bytes = max_bytes;
    if (max_bytes) po.first_superblock_bytes = po.max_superblock_bytes = max_bytes / 2;
    llmem_pool *p = NULL;
    assert_ok(llmem_pool_create(&po, &p));
    return p;
}

static void stream_ordered_reuse(void **state)
{
    (void)state;
    NEED_DEVICE();
    llmem_resource *r = make(llmem_cuda_resource_create);
    llmem_pool *p = gpu_pool(r, 0);
    cudaStream_t stream;
    assert_int_equal(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    gate g = {0};
    assert_int_equal(cudaLaunchHostFunc(stream, gate_hold, &g), cudaSuccess);
    void *a = llmem_pool_alloc(p, MiB, NULL);
    assert_non_null(a);
    assert_int_equal(cudaMemsetAsync(a, 0x5a, MiB, stream), cudaSuccess); /* work still using a */
    llmem_fence f;
    assert_ok(llmem_cuda_fence_record(stream, &f));
    assert_ok(llmem_pool_free_fenced(p, a, &f));
    assert_int_equal(test_pool_stats(p).fenced_pending, 1);
    /* Not reused while the stream has not reached the event. */
    void *got[40];
    for (int i = 0; i < 40; i++) {
        got[i] = llmem_pool_alloc(p, MiB, NULL);
        assert_non_null(got[i]);
        assert_ptr_not_equal(got[i], a);
    }
    assert_int_equal(llmem_pool_poll_fenced(p), 0);
    for (int i = 0; i < 40; i++) assert_ok(llmem_pool_free(p, got[i]));
    /* Open the gate: the memset runs, the event completes, a is free. */
    __atomic_store_n(&g.open, 1, __ATOMIC_RELEASE);
    assert_int_equal(llmem_pool_drain_fenced(p), 1);
    unsigned char host[256];
    assert_int_equal(cudaMemcpy(host, (char *)a + MiB - sizeof host, sizeof host, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    for (size_t i = 0; i < sizeof host; i++) assert_int_equal(host[i], 0x5a);
    bool seen = false;
    for (int i = 0; i < 40 && !seen; i++) {
        got[i] = llmem_pool_alloc(p, MiB, NULL);
        seen = got[i] == a;
        if (!seen) assert_ok(llmem_pool_free(p, got[i]));
        else assert_ok(llmem_pool_free(p, a));
    }
    assert_true(seen);
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
    assert_int_equal(cudaStreamDestroy(stream), cudaSuccess);
    llmem_resource_destroy(r);
}

static void full_device_pool_waits_for_events(void **state)
{
    (void)state;
    NEED_DEVICE();
    llmem_resource *r = make(llmem_cuda_resource_create);
    llmem_pool *p = gpu_pool(r, 64 * MiB);
    cudaStream_t stream;
    assert_int_equal(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    gate g = {0};
    assert_int_equal(cudaLaunchHostFunc(stream, gate_hold, &g), cudaSuccess);
    void *blk[128];
    int n = 0;
    while (n < 128 && (blk[n] = llmem_pool_alloc(p, 4 * MiB, NULL)) != NULL) n++;
    assert_true(n >= 4 && n < 128);
    for (int i = 0; i < n; i++) {
        assert_int_equal(cudaMemsetAsync(blk[i], i, 4 * MiB, stream), cudaSuccess);
        llmem_fence f;
        assert_ok(llmem_cuda_fence_record(stream, &f));
        assert_ok(llmem_pool_free_fenced(p, blk[i], &f));
    }
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, gate_open_later, &g), 0);
    void *b = llmem_pool_alloc(p, 4 * MiB, NULL); /* waits for the first event, not the device */
    assert_non_null(b);
    assert_true(test_pool_stats(p).fence_waits_total >= 1);
    pthread_join(t, NULL);
    assert_ok(llmem_pool_free(p, b));
    llmem_pool_drain_fenced(p);
    assert_int_equal(test_pool_stats(p).fenced_pending, 0);
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
    assert_int_equal(cudaStreamDestroy(stream), cudaSuccess);
    llmem_resource_destroy(r);
}

/* ---- cuda-vmm: reserve, commit, decommit; a pool that grows in place ---- */

/* A cuda-vmm resource on device 0; skips on a device without virtual
 * memory management. */
static llmem_resource *make_vmm(void) { return make_if_supported(llmem_cuda_vmm_resource_create); }

static void vmm_commit_decommit_keeps_bytes(void **state)
{
    (void)state;
    NEED_DEVICE();
    llmem_resource *r = make_vmm();
    llmem_resource_info info;
    assert_ok(llmem_resource_get_info(r, &info));
    assert_string_equal(info.name, "cuda-vmm");
    assert_int_equal(info.kind, LLMEM_MEM_DEVICE);
    assert_true(info.caps & LLMEM_RES_CAP_RESERVE);
    assert_true(info.caps & LLMEM_RES_CAP_DECOMMIT);
    const size_t g = info.granularity;
    printf("cuda-vmm granularity: %zu bytes\n", g);
    /* 64 chunks of address space, nothing behind them. */
    void *base = NULL;
    assert_ok(llmem_resource_map(r, 64 * g, 0, LLMEM_MAP_UNCOMMITTED, &base));
    assert_int_equal(test_resource_stats(r).committed_bytes, 0);
    /* Commit the first 8 chunks, fill them, commit the next 8: same place,
     * first bytes intact (growth in place, nothing moved). */
    assert_ok(llmem_resource_commit(r, base, 8 * g));
    unsigned char *host = malloc(16 * g), *back = malloc(16 * g);
    test_pattern(host, 16 * g, 5);
    assert_ok(llmem_resource_copy(r, base, host, 8 * g));
    assert_ok(llmem_resource_commit(r, (char *)base + 8 * g, 8 * g));
    assert_ok(llmem_resource_copy(r, (char *)base + 8 * g, host + 8 * g, 8 * g));
    assert_ok(llmem_resource_copy(r, back, base, 16 * g));
    assert_memory_equal(host, back, 16 * g);
    assert_int_equal(test_resource_stats(r).committed_bytes, 16 * g);
    /* Decommit the middle 4 chunks: the rest keeps its bytes; commit them
     * again and they are usable at the same addresses. */
    assert_ok(llmem_resource_decommit(r, (char *)base + 6 * g, 4 * g));
    assert_int_equal(test_resource_stats(r).committed_bytes, 12 * g);
    assert_ok(llmem_resource_copy(r, back, base, 6 * g));
    assert_memory_equal(host, back, 6 * g);
    assert_ok(llmem_resource_copy(r, back, (char *)base + 10 * g, 6 * g));
    assert_memory_equal(host + 10 * g, back, 6 * g);
    assert_ok(llmem_resource_commit(r, (char *)base + 6 * g, 4 * g));
    assert_ok(llmem_resource_copy(r, (char *)base + 6 * g, host + 6 * g, 4 * g));
    assert_ok(llmem_resource_copy(r, back, base, 16 * g));
    assert_memory_equal(host, back, 16 * g);
    /* Refusals. */
    int local;
    assert_status(llmem_resource_commit(r, &local, g), LLMEM_EINVAL);
    assert_status(llmem_resource_unmap(r, base, 8 * g, 8 * g), LLMEM_EINVAL);
    assert_ok(llmem_resource_unmap(r, base, 64 * g, 16 * g));
    /* A committed map, as the pool's ordinary superblocks use. */
    void *c = NULL;
    assert_ok(llmem_resource_map(r, 3 * g, 0, 0, &c));
    round_trip(r, c, (char *)c + g, g, 9);
    assert_ok(llmem_resource_unmap(r, c, 3 * g, 3 * g));
    llmem_resource_stats s = test_resource_stats(r);
    assert_int_equal(s.mapped_bytes, 0);
    assert_int_equal(s.committed_bytes, 0);
    free(host);
    free(back);
    llmem_resource_destroy(r);
}

static void vmm_pool_grows_in_place(void **state)
{
    (void)state;
    NEED_DEVICE();
    llmem_resource *r = make_vmm();
    llmem_pool_options po = llmem_pool_options_default();
    po.name = "gpu-in-place";
    po.resource = r;
    po.reserve_bytes = (size_t)64 << 30; /* address space, not memory */
    po.purge = LLMEM_POOL_PURGE_MANUAL;
    llmem_pool *p = NULL;
    assert_ok(llmem_pool_create(&po, &p));
    enum { N = 64 };
    void *blk[N];
    unsigned char *host = malloc(MiB), *back = malloc(MiB);
    for (int i = 0; i < N; i++) {
        blk[i] = llmem_pool_alloc(p, 16 * MiB, NULL);
        assert_non_null(blk[i]);
        test_pattern(host, MiB, (unsigned)i);
        assert_ok(llmem_resource_copy(r, blk[i], host, MiB));
        llmem_pool_stats s = test_pool_stats(p);
        assert_int_equal(s.superblocks, 1);
        assert_true(s.committed_bytes <= s.used_bytes + 4 * MiB); /* physical memory follows demand */
    }
    for (int i = 0; i < N; i += 2) assert_ok(llmem_pool_free(p, blk[i]));
    uint64_t before = test_pool_stats(p).committed_bytes;
    size_t released = llmem_pool_trim(p);
    assert_true(released >= (size_t)(N / 2) * 16 * MiB - 4 * MiB);
    assert_int_equal(test_pool_stats(p).committed_bytes, before - released);
    for (int i = 1; i < N; i += 2) {
        test_pattern(host, MiB, (unsigned)i);
        assert_ok(llmem_resource_copy(r, back, blk[i], MiB));
        assert_memory_equal(host, back, MiB);
    }
    for (int i = 1; i < N; i += 2) assert_ok(llmem_pool_free(p, blk[i]));
    llmem_pool_trim(p);
    assert_int_equal(test_pool_stats(p).committed_bytes, 0);
    assert_ok(llmem_pool_check(p));
    llmem_pool_destroy(p);
    assert_int_equal(test_resource_stats(r).mapped_bytes, 0);
    free(host);
    free(back);
    llmem_resource_destroy(r);
}

/* KV CONTIGUOUS on cuda-vmm: each layer of a sequence at fixed device
 * addresses, memory committed as it grows, bytes kept across growth. */
static void vmm_kv_contiguous(void **state)
{
    (void)state;
    NEED_DEVICE();
    llmem_resource *r = make_vmm();
    llmem_kv_options ko = llmem_kv_options_default();
    ko.name = "gpu-kv";
    ko.strategy = LLMEM_KV_CONTIGUOUS;
    ko.layers = 4;
    ko.kv_heads = 8;
    ko.head_dim = 128;
    ko.dtype = LLMEM_KV_F16;
    ko.max_seq_len = 8192;
    ko.resource = r;
    llmem_kv *kv = NULL;
    assert_ok(llmem_kv_create(&ko, &kv));
    llmem_kv_seq s;
    assert_ok(llmem_kv_seq_create(kv, 0, &s));
    size_t tb = llmem_kv_token_layer_bytes(kv);
    unsigned char *host = malloc(tb), *back = malloc(tb);
    void *k0 = NULL, *v0 = NULL;
    for (size_t t = 0; t < 3000; t++) {
        assert_ok(llmem_kv_seq_append(kv, s, 1, NULL, NULL));
        void *k, *v;
        assert_ok(llmem_kv_seq_token(kv, s, 3, t, &k, &v));
        if (t == 0) k0 = k, v0 = v;
        test_pattern(host, tb, (unsigned)t);
        assert_ok(llmem_resource_copy(r, k, host, tb));
    }
    /* Position 0 did not move while the sequence grew, and kept its bytes. */
    void *k, *v;
    assert_ok(llmem_kv_seq_token(kv, s, 3, 0, &k, &v));
    assert_ptr_equal(k, k0);
    assert_ptr_equal(v, v0);
    for (size_t t = 0; t < 3000; t += 499) {
        assert_ok(llmem_kv_seq_token(kv, s, 3, t, &k, &v));
        test_pattern(host, tb, (unsigned)t);
        assert_ok(llmem_resource_copy(r, back, k, tb));
        assert_memory_equal(host, back, tb);
    }
    llmem_kv_stats ks = {sizeof ks};
    assert_ok(llmem_kv_get_stats(kv, &ks));
    assert_true(ks.bytes_reserved < (size_t)8192 * llmem_kv_token_total_bytes(kv)); /* not the whole reservation */
    assert_ok(llmem_kv_check(kv));
    assert_ok(llmem_kv_seq_free(kv, s));
    llmem_kv_destroy(kv);
    assert_int_equal(test_resource_stats(r).mapped_bytes, 0);
    free(host);
    free(back);
    llmem_resource_destroy(r);
}

/* KV on the device, preempted to pinned host memory and back: every byte
 * of every layer comes back, at the sequence's positions. */
static void kv_swap_round_trip_to_pinned(void **state)
{
    (void)state;
    NEED_DEVICE();
    llmem_resource *dev = make(llmem_cuda_resource_create), *pinned = make(llmem_cuda_host_resource_create);
    llmem_kv_options ko = llmem_kv_options_default();
    ko.name = "gpu-kv-swap";
    ko.layers = 4;
    ko.kv_heads = 8;
    ko.head_dim = 64;
    ko.dtype = LLMEM_KV_F16;
    ko.max_seq_len = 2048;
    ko.resource = dev;
    ko.swap_resource = pinned;
    llmem_kv *kv = NULL;
    assert_ok(llmem_kv_create(&ko, &kv));
    llmem_kv_seq s, other;
    assert_ok(llmem_kv_seq_create(kv, 0, &s));
    assert_ok(llmem_kv_seq_create(kv, 0, &other));
    const size_t n = 700;
    assert_ok(llmem_kv_seq_append(kv, s, n, NULL, NULL));
    size_t tb = llmem_kv_token_layer_bytes(kv);
    unsigned char *host = malloc(tb), *back = malloc(tb);
    for (uint32_t l = 0; l < ko.layers; l++)
        for (size_t t = 0; t < n; t++) {
            void *k, *v;
            assert_ok(llmem_kv_seq_token(kv, s, l, t, &k, &v));
            test_pattern(host, tb, (unsigned)(l * 100003 + t));
            assert_ok(llmem_resource_copy(dev, k, host, tb));
            test_pattern(host, tb, (unsigned)(l * 100003 + t + 7));
            assert_ok(llmem_resource_copy(dev, v, host, tb));
        }
    assert_ok(llmem_kv_seq_swap_out(kv, s));
    /* Another sequence takes the freed device blocks meanwhile. */
    assert_ok(llmem_kv_seq_append(kv, other, n, NULL, NULL));
    assert_ok(llmem_kv_seq_free(kv, other));
    assert_ok(llmem_kv_seq_swap_in(kv, s));
    for (uint32_t l = 0; l < ko.layers; l++)
        for (size_t t = 0; t < n; t += 13) {
            void *k, *v;
            assert_ok(llmem_kv_seq_token(kv, s, l, t, &k, &v));
            test_pattern(host, tb, (unsigned)(l * 100003 + t));
            assert_ok(llmem_resource_copy(dev, back, k, tb));
            assert_memory_equal(host, back, tb);
            test_pattern(host, tb, (unsigned)(l * 100003 + t + 7));
            assert_ok(llmem_resource_copy(dev, back, v, tb));
            assert_memory_equal(host, back, tb);
        }
    llmem_kv_stats ks = {sizeof ks};
    assert_ok(llmem_kv_get_stats(kv, &ks));
    assert_int_equal(ks.swap_out_total, 1);
    assert_int_equal(ks.swap_in_total, 1);
    assert_true(ks.bytes_swapped_out_total >= n * llmem_kv_token_total_bytes(kv));
    printf("swap: %llu bytes out and in, %.3f ms in copies\n", (unsigned long long)ks.bytes_swapped_out_total,
           ks.swap_seconds_total * 1e3);
    assert_ok(llmem_kv_check(kv));
    assert_ok(llmem_kv_seq_free(kv, s));
    llmem_kv_destroy(kv);
    free(host);
    free(back);
    llmem_resource_destroy(pinned);
    llmem_resource_destroy(dev);
}

int main(void)
{
    int devices = 0;
    if (llmem_cuda_device_count(&devices) != LLMEM_OK || devices == 0) {
        printf("skipped: no CUDA device (%s)\n", devices == 0 && !llmem_error_message()[0] ? "none found" : llmem_error_message());
        return 77;
    }
    const struct CMUnitTest tests[] = {
        TEST_ROW("cuda_contract", contract_case, &contract_rows[0]),
        TEST_ROW("async_contract", contract_case, &contract_rows[1]),
        TEST_ROW("managed_contract", contract_case, &contract_rows[2]),
        TEST_ROW("host_contract", contract_case, &contract_rows[3]),
        cmocka_unit_test_setup(managed_refuses_past_free_memory, test_quiet_logs),
        cmocka_unit_test(async_frees_and_maps_again),
        cmocka_unit_test(host_memory_is_cpu_writable),
        cmocka_unit_test(pool_over_cuda),
        cmocka_unit_test(stream_ordered_reuse),
        cmocka_unit_test(full_device_pool_waits_for_events),
        cmocka_unit_test(vmm_commit_decommit_keeps_bytes),
        cmocka_unit_test(vmm_pool_grows_in_place),
        cmocka_unit_test(vmm_kv_contiguous),
        cmocka_unit_test(kv_swap_round_trip_to_pinned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
