/*
 * bench_device.c - `llmem bench device`: llmem on a CUDA GPU, side by side
 * with the CUDA runtime's own allocators, in one process.
 *
 *   alloc    the llama-2-7b tensor mix (tensor_mix.h): mean time per
 *            allocation+free through a pool over cuda, a pool over cuda-vmm
 *            (reserve_bytes: grows in place), raw cudaMalloc/cudaFree, and
 *            cudaMallocAsync/cudaFreeAsync on a stream (a memory pool that
 *            keeps everything: its best case)
 *   grow     a buffer grown from 256 MiB to GROW_MAX in 256 MiB steps, then
 *            shrunk back: with cudaMalloc each step is allocate, copy, free
 *            (time and peak bytes); with cuda-vmm each step commits or
 *            decommits the next chunks of one reservation in place
 *   kv       KV append on the device: 16 sequences of llama-2-7b KV (F16,
 *            32 layers, 32 heads of 128) grow token by token through the
 *            KV manager over a device pool: tokens per second (block
 *            allocation and tables; the values are the engine's to write)
 *   swap     a 2048-token sequence swapped out to pinned host memory
 *            (cuda-host) and back: GB/s each way, next to a plain pinned
 *            cudaMemcpy of the same bytes (the link's practical figure)
 *
 * Without a device (or built without CUDA) it says so and exits 0 with
 * "skipped", so scripts can run it anywhere; scripts/gpu-check.sh runs it
 * on a GPU machine and puts its output in the report.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "commands.h"
#include "llmem/llmem.h"
#include "tensor_mix.h"

#if defined(LLMEM_HAVE_CUDA) && LLMEM_HAVE_CUDA

#include <cuda_runtime_api.h>

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

static bool json;

static void result(const char *bench, const char *subject, const char *metric, double value, const char *unit)
{
    if (json)
        printf("{\"bench\":\"%s\",\"subject\":\"%s\",\"metric\":\"%s\",\"value\":%.6g,\"unit\":\"%s\"}\n", bench,
               subject, metric, value, unit);
    else
        printf("%-6s %-28s %-22s %14.3f %s\n", bench, subject, metric, value, unit);
}

static void die(const char *what)
{
    fprintf(stderr, "llmem bench device: %s: %s\n", what, llmem_error_message());
    exit(1);
}

static void cuda_check(cudaError_t e, const char *call)
{
    if (e == cudaSuccess) return;
    fprintf(stderr, "llmem bench device: %s: %s\n", call, cudaGetErrorString(e));
    exit(1);
}

/* ---- alloc ---------------------------------------------------------------- */

static cudaStream_t g_stream;

static void *pool_alloc(void *ctx, size_t n)
{
    void *p = llmem_pool_alloc(ctx, n, NULL);
    if (!p) die("pool allocation");
    return p;
}
static void pool_free(void *ctx, void *p, size_t n)
{
    (void)n;
    llmem_pool_free(ctx, p);
}
static void *raw_alloc(void *ctx, size_t n)
{
    (void)ctx;
    void *p = NULL;
    cuda_check(cudaMalloc(&p, n), "cudaMalloc");
    return p;
}
static void raw_free(void *ctx, void *p, size_t n)
{
    (void)ctx;
    (void)n;
    cuda_check(cudaFree(p), "cudaFree");
}
static void *async_alloc(void *ctx, size_t n)
{
    (void)ctx;
    void *p = NULL;
    cuda_check(cudaMallocAsync(&p, n, g_stream), "cudaMallocAsync");
    return p;
}
static void async_free(void *ctx, void *p, size_t n)
{
    (void)ctx;
    (void)n;
    cuda_check(cudaFreeAsync(p, g_stream), "cudaFreeAsync");
}

/* Nanoseconds per allocation (with its free) over `steps` steps, after a
 * warm-up of a few steps on the same allocator. */
static double time_mix(const tensor_mix_ops *ops, int steps)
{
    tensor_mix_run(3, 7, NULL, ops);
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    uint64_t t0 = llmem_time_now_ns();
    uint64_t n = tensor_mix_run(steps, 42, NULL, ops);
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    uint64_t t1 = llmem_time_now_ns();
    return n ? (double)(t1 - t0) / (double)n : 0;
}

static llmem_pool *device_pool(llmem_resource *r, const char *name, size_t reserve)
{
    llmem_pool_options o = llmem_pool_options_default();
    o.name = name;
    o.resource = r;
    o.reserve_bytes = reserve;
    llmem_pool *p = NULL;
    if (llmem_pool_create(&o, &p)) die("pool create");
    return p;
}

static void bench_alloc(int device, int steps, int rounds)
{
    llmem_cuda_options co = {.device = device};
    llmem_resource *cuda = NULL, *vmm = NULL;
    if (llmem_cuda_resource_create(&co, &cuda)) die("cuda resource");
    bool have_vmm = llmem_cuda_vmm_resource_create(&co, &vmm) == LLMEM_OK;
    llmem_pool *pc = device_pool(cuda, "bench-cuda", 0);
    llmem_pool *pv = have_vmm ? device_pool(vmm, "bench-vmm", (size_t)64 << 30) : NULL;
    cudaMemPool_t mp;
    cuda_check(cudaDeviceGetDefaultMemPool(&mp, device), "cudaDeviceGetDefaultMemPool");
    uint64_t keep = UINT64_MAX;
    cuda_check(cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");

    tensor_mix_ops ops[4] = {{pool_alloc, pool_free, pc},
                             {pool_alloc, pool_free, pv},
                             {raw_alloc, raw_free, NULL},
                             {async_alloc, async_free, NULL}};
    const char *names[4] = {"pool(cuda)", "pool(cuda-vmm,in-place)", "cudaMalloc/cudaFree",
                            "cudaMallocAsync/FreeAsync"};
    double *t[4];
    for (int k = 0; k < 4; k++) t[k] = calloc((size_t)rounds, sizeof(double));
    for (int r = 0; r < rounds; r++)
        for (int j = 0; j < 4; j++) {
            int k = (j + r) % 4; /* rotate the order */
            if (k == 1 && !pv) continue;
            bench_progress("bench device: alloc %s round %d/%d", names[k], r + 1, rounds);
            t[k][r] = time_mix(&ops[k], steps);
        }
    bench_progress_done();
    for (int k = 0; k < 4; k++) {
        if (k == 1 && !pv) continue;
        result("alloc", names[k], "ns_per_alloc_free", bench_median(t[k], (size_t)rounds), "ns");
        free(t[k]);
    }
    if (!pv) printf("# cuda-vmm: %s\n", llmem_error_message());
    llmem_pool_destroy(pc);
    llmem_pool_destroy(pv);
    llmem_resource_destroy(cuda);
    llmem_resource_destroy(vmm);
}

/* ---- grow / shrink ------------------------------------------------------------ */

static void bench_grow(int device, size_t max)
{
    const size_t step = 256 * MiB;
    /* cudaMalloc: a new buffer per step, the old one copied over and freed. */
    void *buf = NULL;
    size_t have = 0, peak = 0;
    uint64_t t0 = llmem_time_now_ns();
    for (size_t want = step; want <= max; want += step) {
        void *nb = NULL;
        cuda_check(cudaMalloc(&nb, want), "cudaMalloc");
        if (have + want > peak) peak = have + want;
        if (buf) {
            cuda_check(cudaMemcpy(nb, buf, have, cudaMemcpyDeviceToDevice), "cudaMemcpy");
            cuda_check(cudaFree(buf), "cudaFree");
        }
        buf = nb;
        have = want;
    }
    uint64_t t1 = llmem_time_now_ns();
    for (size_t want = max - step; want >= step; want -= step) {
        void *nb = NULL;
        cuda_check(cudaMalloc(&nb, want), "cudaMalloc");
        cuda_check(cudaMemcpy(nb, buf, want, cudaMemcpyDeviceToDevice), "cudaMemcpy");
        cuda_check(cudaFree(buf), "cudaFree");
        buf = nb;
    }
    uint64_t t2 = llmem_time_now_ns();
    cuda_check(cudaFree(buf), "cudaFree");
    result("grow", "cudaMalloc+copy", "grow_ms", (double)(t1 - t0) / 1e6, "ms");
    result("grow", "cudaMalloc+copy", "shrink_ms", (double)(t2 - t1) / 1e6, "ms");
    result("grow", "cudaMalloc+copy", "peak_bytes", (double)peak, "bytes");

    llmem_cuda_options co = {.device = device};
    llmem_resource *vmm = NULL;
    if (llmem_cuda_vmm_resource_create(&co, &vmm)) {
        printf("# grow: cuda-vmm unavailable: %s\n", llmem_error_message());
        return;
    }
    void *base = NULL;
    if (llmem_resource_map(vmm, max, 0, LLMEM_MAP_UNCOMMITTED, &base)) die("cuda-vmm reserve");
    t0 = llmem_time_now_ns();
    for (size_t at = 0; at < max; at += step)
        if (llmem_resource_commit(vmm, (char *)base + at, step)) die("cuda-vmm commit");
    t1 = llmem_time_now_ns();
    for (size_t at = max - step; at >= step; at -= step)
        if (llmem_resource_decommit(vmm, (char *)base + at, step)) die("cuda-vmm decommit");
    t2 = llmem_time_now_ns();
    llmem_resource_stats s;
    memset(&s, 0, sizeof s);
    llmem_resource_get_stats(vmm, &s);
    result("grow", "cuda-vmm in place", "grow_ms", (double)(t1 - t0) / 1e6, "ms");
    result("grow", "cuda-vmm in place", "shrink_ms", (double)(t2 - t1) / 1e6, "ms");
    result("grow", "cuda-vmm in place", "peak_bytes", (double)s.committed_peak_bytes, "bytes");
    llmem_resource_unmap(vmm, base, max, step);
    llmem_resource_destroy(vmm);
}

/* ---- KV append and swap ---------------------------------------------------------- */

static llmem_kv *device_kv(llmem_pool *pool, llmem_resource *swap)
{
    llmem_kv_options o = llmem_kv_options_default();
    o.name = "bench-kv";
    o.layers = 32;
    o.kv_heads = 32;
    o.head_dim = 128;
    o.dtype = LLMEM_KV_F16;
    o.max_seq_len = 4096;
    o.pool = pool;
    o.swap_resource = swap;
    llmem_kv *kv = NULL;
    if (llmem_kv_create(&o, &kv)) die("kv create");
    return kv;
}

static void bench_kv(int device, int tokens)
{
    llmem_cuda_options co = {.device = device};
    llmem_resource *cuda = NULL, *host = NULL;
    if (llmem_cuda_resource_create(&co, &cuda)) die("cuda resource");
    if (llmem_cuda_host_resource_create(&co, &host)) die("cuda-host resource");
    llmem_pool *pool = device_pool(cuda, "bench-kv", 0);
    llmem_kv *kv = device_kv(pool, host);

    enum { SEQS = 16 };
    llmem_kv_seq s[SEQS];
    for (int i = 0; i < SEQS; i++)
        if (llmem_kv_seq_create(kv, 0, &s[i])) die("kv seq create");
    uint64_t t0 = llmem_time_now_ns();
    for (int t = 0; t < tokens; t++)
        for (int i = 0; i < SEQS; i++)
            if (llmem_kv_seq_append(kv, s[i], 1, NULL, NULL)) die("kv append");
    uint64_t t1 = llmem_time_now_ns();
    result("kv", "append (16 seqs, llama-2-7b)", "tokens_per_s", (double)tokens * SEQS / ((double)(t1 - t0) / 1e9),
           "tok/s");
    for (int i = 1; i < SEQS; i++) llmem_kv_seq_free(kv, s[i]);

    /* Swap the first sequence out and in a few times. */
    llmem_kv_stats ks;
    double out_s = 0, in_s = 0;
    uint64_t bytes = 0;
    for (int r = 0; r < 5; r++) {
        uint64_t a = llmem_time_now_ns();
        if (llmem_kv_seq_swap_out(kv, s[0])) die("kv swap out");
        uint64_t b = llmem_time_now_ns();
        if (llmem_kv_seq_swap_in(kv, s[0])) die("kv swap in");
        uint64_t c = llmem_time_now_ns();
        out_s += (double)(b - a) / 1e9;
        in_s += (double)(c - b) / 1e9;
    }
    memset(&ks, 0, sizeof ks);
    llmem_kv_get_stats(kv, &ks);
    bytes = ks.bytes_swapped_out_total / 5;
    result("swap", "kv swap out (to pinned)", "GB_per_s", (double)bytes * 5 / out_s / 1e9, "GB/s");
    result("swap", "kv swap in (from pinned)", "GB_per_s", (double)bytes * 5 / in_s / 1e9, "GB/s");
    result("swap", "kv sequence", "bytes", (double)bytes, "bytes");

    /* The same bytes with one pinned cudaMemcpy each way. */
    void *d = NULL, *h = NULL;
    cuda_check(cudaMalloc(&d, bytes), "cudaMalloc");
    cuda_check(cudaHostAlloc(&h, bytes, cudaHostAllocDefault), "cudaHostAlloc");
    cuda_check(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    uint64_t a = llmem_time_now_ns();
    for (int r = 0; r < 5; r++) cuda_check(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    uint64_t b = llmem_time_now_ns();
    for (int r = 0; r < 5; r++) cuda_check(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    uint64_t c = llmem_time_now_ns();
    result("swap", "cudaMemcpy D2H pinned", "GB_per_s", (double)bytes * 5 / ((double)(b - a) / 1e9) / 1e9, "GB/s");
    result("swap", "cudaMemcpy H2D pinned", "GB_per_s", (double)bytes * 5 / ((double)(c - b) / 1e9) / 1e9, "GB/s");
    cudaFree(d);
    cudaFreeHost(h);
    llmem_kv_seq_free(kv, s[0]);
    llmem_kv_destroy(kv);
    llmem_pool_destroy(pool);
    llmem_resource_destroy(host);
    llmem_resource_destroy(cuda);
}

int llmem_bench_device(int argc, char **argv)
{
    int device = 0, rounds = 5;
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (bench_common_arg(argc, argv, &i, &json, &quick, &rounds)) continue;
        if (!strcmp(argv[i], "--device") && i + 1 < argc) device = atoi(argv[++i]);
        else {
            FILE *f = strcmp(argv[i], "--help") ? stderr : stdout;
            fprintf(f, "usage: llmem bench device [--json] [--quick] [--device N] [--rounds N]\n"
                       "  the pool, cuda-vmm, KV append and swap on a CUDA GPU against the CUDA runtime\n");
            return f == stdout ? 0 : 2;
        }
    }
    if (rounds < 1 || rounds > 100) rounds = 5;
    int n = 0;
    if (llmem_cuda_device_count(&n) || n == 0) {
        printf("llmem bench device: skipped: no CUDA device (%s)\n", llmem_error_message());
        return 0;
    }
    if (device < 0 || device >= n) {
        fprintf(stderr, "llmem bench device: no device %d (%d found)\n", device, n);
        return 2;
    }
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    cuda_check(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking), "cudaStreamCreate");
    struct cudaDeviceProp prop;
    cuda_check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    if (!json)
        printf("llmem %s bench device: %s (%.1f GiB), medians of %d rounds\n\n", llmem_version(), prop.name,
               (double)prop.totalGlobalMem / (double)GiB, rounds);
    else printf("{\"bench\":\"device\",\"name\":\"%s\",\"memory_bytes\":%zu}\n", prop.name, prop.totalGlobalMem);
    llmem_log_set(NULL, NULL, LLMEM_LOG_ERROR);
    bench_alloc(device, quick ? 4 : 16, rounds);
    bench_grow(device, quick ? 1 * GiB : 8 * GiB);
    bench_kv(device, quick ? 256 : 2048);
    cudaStreamDestroy(g_stream);
    return 0;
}

#else /* built without CUDA */

int llmem_bench_device(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("llmem bench device: skipped: llmem was built without CUDA (cmake -DLLMEM_CUDA=ON)\n");
    return 0;
}

#endif
