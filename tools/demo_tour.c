/*
 * demo_tour.c - `llmem demo --tour`: a guided tour of the foundation layers
 * (the serving demo is cmd_demo.c), with figures read from the
 * library itself:
 *  1. per-request scratch in an arena: the first request maps chunks, the
 *     following ones reuse them with no resource call;
 *  2. KV-sized blocks in a fixed pool over a simulated GPU behind a byte
 *     cap: the pool fills the cap, gets a clear out-of-memory status, and
 *     data moves only through copy();
 *  3. an injected failure on the third map call and how the pool reports it;
 *  4. every component's stats through the one exporter.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "llmem/llmem.h"

#define CHECK(expr)                                                                  \
    do {                                                                             \
        llmem_status st_ = (expr);                                                   \
        if (st_) {                                                                   \
            fprintf(stderr, "llmem demo: %s failed: %s\n", #expr, llmem_error_message()); \
            return 1;                                                                \
        }                                                                            \
    } while (0)

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

static int demo_arena(llmem_exporter *ex)
{
    printf("1. Per-request scratch: an arena over the os resource (with tracking)\n");
    llmem_resource *track;
    CHECK(llmem_tracking_resource_create(llmem_resource_default(), &track));
    llmem_arena_options o = llmem_arena_options_default();
    o.name = "request";
    o.resource = track;
    o.chunk_bytes = 256 << 10;
    llmem_arena *a;
    CHECK(llmem_arena_create(&o, &a));
    /* A toy forward pass: per layer, activations of dim x tokens floats,
     * dropped after the layer with a mark. */
    const size_t dim = 512, layers = 8;
    const size_t prompts[] = {100, 37, 120, 64};
    for (size_t r = 0; r < sizeof prompts / sizeof prompts[0]; r++) {
        llmem_resource_stats before = {0}, after = {0};
        llmem_resource_get_stats(track, &before);
        size_t tokens = prompts[r];
        float *x = llmem_arena_alloc(a, tokens * dim * sizeof(float), 0, NULL);
        if (!x) return fprintf(stderr, "demo: %s\n", llmem_error_message()), 1;
        for (size_t l = 0; l < layers; l++) {
            llmem_arena_mark m = llmem_arena_save(a);
            float *q = llmem_arena_alloc(a, tokens * dim * sizeof(float), 0, NULL);
            float *att = llmem_arena_alloc(a, tokens * tokens * sizeof(float), 0, NULL);
            if (!q || !att) return fprintf(stderr, "demo: %s\n", llmem_error_message()), 1;
            memset(q, 0, tokens * dim * sizeof(float));
            memset(att, 0, tokens * tokens * sizeof(float));
            CHECK(llmem_arena_rollback(a, m));
        }
        llmem_arena_stats s = {0};
        llmem_arena_get_stats(a, &s);
        llmem_resource_get_stats(track, &after);
        printf("   request %zu (%3zu tokens): peak %6.2f MiB, arena holds %5.2f MiB in %llu chunk(s), "
               "map calls this request: %llu\n",
               r + 1, tokens, mib(s.used_peak_bytes), mib(s.reserved_bytes), (unsigned long long)s.chunks,
               (unsigned long long)(after.map_calls_total - before.map_calls_total));
        llmem_arena_reset(a);
    }
    llmem_arena_stats s = {0};
    llmem_arena_get_stats(a, &s);
    llmem_label lb[] = {{"arena", "request"}};
    CHECK(llmem_exporter_add(ex, llmem_arena_stats_schema(), &s, lb, 1));
    size_t released = llmem_arena_trim(a);
    printf("   idle: trim gave back %.2f MiB\n", mib(released));
    llmem_arena_destroy(a);
    size_t leaks = 0;
    llmem_tracking_stats ts = {0};
    llmem_tracking_resource_get_stats(track, &ts);
    leaks = (size_t)ts.live_mappings;
    printf("   after destroy: %zu live mapping(s) (tracking resource)\n\n", leaks);
    llmem_resource_destroy(track);
    return leaks != 0;
}

static int demo_device(llmem_exporter *ex)
{
    printf("2. KV-sized blocks on a simulated GPU behind a 4 MiB cap\n");
    /* One KV block: 16 tokens x K and V x 4 heads x 64 dims x f16. */
    const size_t block = 16 * 2 * 4 * 64 * 2;
    llmem_sim_options so = llmem_sim_options_default();
    so.capacity = 64 << 20;
    so.map_cost_ns = 20000; /* 20 us per map: cudaMalloc is slow */
    llmem_resource *gpu, *cap;
    CHECK(llmem_sim_resource_create(&so, &gpu));
    llmem_limit_options lo = llmem_limit_options_default();
    lo.limit_bytes = 4 << 20;
    CHECK(llmem_limit_resource_create(gpu, &lo, &cap));
    llmem_fixed_options fo = llmem_fixed_options_default();
    fo.name = "kv-blocks";
    fo.resource = cap;
    fo.block_size = block;
    fo.checked = true;
    llmem_fixed *kv;
    CHECK(llmem_fixed_create(&fo, &kv));
    void *blocks[1024];
    size_t n = 0;
    llmem_status st = LLMEM_OK;
    while (n < 1024 && (blocks[n] = llmem_fixed_alloc(kv, &st)) != NULL) n++;
    printf("   %zu blocks of %zu KiB fit; the next one: %s\n   (%s)\n", n, block / 1024, llmem_status_name(st),
           llmem_error_message());
    /* Data goes in and out through copy() only: the pool never touches it. */
    static unsigned char host[16 * 2 * 4 * 64 * 2], back[sizeof host];
    for (size_t i = 0; i < sizeof host; i++) host[i] = (unsigned char)(i * 31);
    CHECK(llmem_resource_copy(cap, blocks[0], host, block));
    CHECK(llmem_resource_copy(cap, back, blocks[0], block));
    printf("   host -> device -> host round trip: %s\n", memcmp(host, back, block) ? "MISMATCH" : "identical");
    st = llmem_fixed_free(kv, blocks[0]);
    st = llmem_fixed_free(kv, blocks[0]);
    printf("   freeing block 0 twice: %s\n   (%s)\n", llmem_status_name(st), llmem_error_message());
    for (size_t i = 1; i < n; i++) llmem_fixed_free(kv, blocks[i]);
    llmem_fixed_stats fs = {0};
    llmem_fixed_get_stats(kv, &fs);
    llmem_sim_stats ss = {0};
    llmem_sim_resource_get_stats(gpu, &ss);
    printf("   pool: %llu chunks, %.2f MiB reserved; device: peak %.2f MiB of %.0f MiB, %.1f ms charged to maps\n\n",
           (unsigned long long)fs.chunks, mib(fs.reserved_bytes), mib(ss.used_peak_bytes), mib(ss.capacity_bytes),
           (double)ss.cost_ns_total / 1e6);
    llmem_label lb[] = {{"pool", "kv-blocks"}};
    CHECK(llmem_exporter_add(ex, llmem_fixed_stats_schema(), &fs, lb, 1));
    llmem_label dl[] = {{"device", "sim0"}};
    CHECK(llmem_exporter_add(ex, llmem_sim_stats_schema(), &ss, dl, 1));
    llmem_fixed_destroy(kv);
    llmem_resource_destroy(cap);
    llmem_resource_destroy(gpu);
    return 0;
}

static int demo_fault(void)
{
    printf("3. Fault injection: the 3rd map call fails\n");
    llmem_fault_options fo = llmem_fault_options_default();
    fo.fail_nth = 3;
    llmem_resource *f;
    CHECK(llmem_fault_resource_create(llmem_resource_default(), &fo, &f));
    llmem_fixed_options po = llmem_fixed_options_default();
    po.name = "objects";
    po.resource = f;
    po.block_size = 4096;
    po.chunk_bytes = 64 << 10;
    po.max_chunk_bytes = 64 << 10;
    llmem_fixed *p;
    CHECK(llmem_fixed_create(&po, &p));
    size_t got = 0;
    llmem_status st = LLMEM_OK;
    void *b[64];
    while (got < 64 && (b[got] = llmem_fixed_alloc(p, &st)) != NULL) got++;
    printf("   %zu blocks, then %s: %s\n", got, llmem_status_name(st), llmem_error_message());
    void *again = llmem_fixed_alloc(p, &st);
    printf("   the next call maps again and succeeds: %s\n\n", again ? "yes" : "no");
    if (again) llmem_fixed_free(p, again);
    for (size_t i = 0; i < got; i++) llmem_fixed_free(p, b[i]);
    llmem_fixed_destroy(p);
    llmem_resource_destroy(f);
    return again ? 0 : 1;
}

int llmem_demo_tour(bool json)
{
    printf("llmem %s: a tour of the foundation layers (resources, arena, fixed pool)\n\n", llmem_version());
    llmem_log_set(NULL, NULL, LLMEM_LOG_OFF); /* the tour prints the messages itself */
    llmem_exporter *ex;
    CHECK(llmem_exporter_create(json ? LLMEM_EXPORT_JSON : LLMEM_EXPORT_PROMETHEUS, &ex));
    int rc = demo_arena(ex);
    if (!rc) rc = demo_device(ex);
    if (!rc) rc = demo_fault();
    if (!rc) {
        printf("4. The stats above, as %s:\n\n", json ? "JSON" : "Prometheus text");
        CHECK(llmem_exporter_write(ex, stdout));
    }
    llmem_exporter_destroy(ex);
    return rc;
}
