/*
 * test_fixed.c - the fixed-size block pool: strides and alignment, chunk
 * growth, the block cap, growth under a capped resource, checked-mode
 * detections, ownership, bad input, device pools over sim-device, stats,
 * AddressSanitizer poisoning, and a randomized property test against a
 * shadow model for every variant. The multi-threaded tests are in
 * test_fixed_threads.c.
 */
#include "test_util.h"
#include "support/log_capture.h"
#include "support/rng.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- helpers ----------------------------------------------------------------- */

typedef enum variant { V_PLAIN, V_CHECKED, V_TS, V_TS_CHECKED, V_COUNT } variant;
static const char *const variant_names[V_COUNT] = {"plain", "checked", "thread_safe", "thread_safe+checked"};

static bool is_checked(variant v) { return v == V_CHECKED || v == V_TS_CHECKED; }
static bool is_ts(variant v) { return v == V_TS || v == V_TS_CHECKED; }

static llmem_fixed_options opts_for(variant v, size_t block_size)
{
    llmem_fixed_options o = llmem_fixed_options_default();
    o.block_size = block_size;
    o.checked = is_checked(v);
    o.thread_safe = is_ts(v);
    return o;
}

static llmem_fixed *make(const llmem_fixed_options *o)
{
    llmem_fixed *p = (llmem_fixed *)(uintptr_t)1;
    assert_ok(llmem_fixed_create(o, &p));
    assert_non_null(p);
    return p;
}

static llmem_fixed_stats stats_of(const llmem_fixed *p)
{
    llmem_fixed_stats s;
    memset(&s, 0xEE, sizeof s);
    s.struct_size = sizeof s;
    assert_ok(llmem_fixed_get_stats(p, &s));
    assert_int_equal(s.struct_size, sizeof s);
    return s;
}

/* Stats with the calling thread's magazine flushed first, so that
 * blocks_in_use is exact for thread-safe pools too. */
static llmem_fixed_stats quiet_stats(llmem_fixed *p)
{
    llmem_fixed_flush_thread_cache(p);
    return stats_of(p);
}

static bool aligned(const void *b, size_t a) { return ((uintptr_t)b & (a - 1)) == 0; }

/* The byte at offset i of the pattern with identity id. */
static unsigned char pat(uint64_t id, size_t i)
{
    uint64_t x = (id + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)i + 1) * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    return (unsigned char)(x >> 56);
}

static void fill(void *b, size_t n, uint64_t id)
{
    unsigned char *c = b;
    for (size_t i = 0; i < n; i++) c[i] = pat(id, i);
}

static bool intact(const void *b, size_t n, uint64_t id)
{
    const unsigned char *c = b;
    for (size_t i = 0; i < n; i++)
        if (c[i] != pat(id, i)) return false;
    return true;
}

/* A free block of a checked host pool holds the freed pattern (0xDF). */
#if defined(__clang__) || defined(__GNUC__)
__attribute__((no_sanitize_address))
#endif
static bool freed_raw(const void *b, size_t n)
{
    const volatile unsigned char *c = b;
    for (size_t i = 0; i < n; i++)
        if (c[i] != 0xDF) return false;
    return true;
}

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
    return x < y ? -1 : x > y;
}

/* No two of the n blocks of `stride` bytes overlap (and none repeats). */
static void assert_disjoint(void *const *blocks, size_t n, size_t stride)
{
    void **s = malloc((n ? n : 1) * sizeof *s);
    assert_non_null(s);
    memcpy(s, blocks, n * sizeof *s);
    qsort(s, n, sizeof *s, cmp_ptr);
    for (size_t i = 1; i < n; i++)
        if ((uintptr_t)s[i - 1] + stride > (uintptr_t)s[i])
            fail_msg("blocks %p and %p (stride %zu) overlap", s[i - 1], s[i], stride);
    free(s);
}

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static void ptr_text(char *buf, size_t cap, const void *p) { snprintf(buf, cap, "%p", p); }

static llmem_tracking_stats tracking_of(const llmem_resource *tr)
{
    llmem_tracking_stats t;
    memset(&t, 0, sizeof t);
    t.struct_size = sizeof t;
    assert_ok(llmem_tracking_resource_get_stats(tr, &t));
    return t;
}

/* ---- basics: strides, alignment, distinct blocks, LIFO reuse ------------------- */

typedef struct stride_case {
    size_t block_size, align; /* options */
    size_t stride, eff_align; /* expected */
} stride_case;

static const stride_case stride_cases[] = {
    /* default alignment on the host: 16 below 64 bytes, 64 from 64 bytes */
    {1, 0, 16, 16},
    {8, 0, 16, 16},
    {24, 0, 32, 16},
    {63, 0, 64, 16},
    {64, 0, 64, 64},
    {100, 0, 128, 64},
    {4096, 0, 4096, 64},
    {5000, 0, 5056, 64},
    /* explicit alignments (below the size of a pointer they are raised to it) */
    {1, 4096, 4096, 4096},
    {100, 8, 104, 8},
    {24, 4, 24, 8},
    {3, 1, 8, 8},
    {100, 32, 128, 32},
    {64, 256, 256, 256},
    {5000, 4096, 8192, 4096},
    {4096, 2 * MiB, 2 * MiB, 2 * MiB},
};

static void basics_one(variant v, const stride_case *c)
{
    llmem_fixed_options o = opts_for(v, c->block_size);
    o.align = c->align;
    o.name = "basics";
    llmem_fixed *p = make(&o);
    size_t stride = llmem_fixed_block_size(p);
    if (stride != c->stride)
        fail_msg("%s pool, block_size %zu align %zu: stride %zu, expected %zu", variant_names[v], c->block_size,
                 c->align, stride, c->stride);
    llmem_fixed_stats s = stats_of(p);
    assert_int_equal(s.block_size, c->block_size);
    assert_int_equal(s.stride, c->stride);
    assert_int_equal(s.blocks_capacity, 0); /* nothing mapped before the first alloc */
    assert_int_equal(s.chunks, 0);
    assert_int_equal(s.reserved_bytes, 0);

    enum { N = 40 };
    size_t n = stride >= MiB ? 6 : N;
    void *b[N];
    for (size_t i = 0; i < n; i++) {
        llmem_status st = LLMEM_EINVAL;
        b[i] = llmem_fixed_alloc(p, &st);
        assert_non_null(b[i]);
        assert_int_equal(st, LLMEM_OK);
        if (!aligned(b[i], c->eff_align))
            fail_msg("%s pool: block %p not aligned to %zu", variant_names[v], b[i], c->eff_align);
        assert_true(llmem_fixed_owns(p, b[i]));
        fill(b[i], stride, i); /* the whole stride is usable */
    }
    assert_disjoint(b, n, stride);
    for (size_t i = 0; i < n; i++) assert_true(intact(b[i], stride, i));

    /* LIFO: the block freed last comes back first. */
    void *x = b[n / 2], *y = b[n / 3];
    assert_ok(llmem_fixed_free(p, x));
    assert_ptr_equal(llmem_fixed_alloc(p, NULL), x);
    assert_ok(llmem_fixed_free(p, x));
    assert_ok(llmem_fixed_free(p, y));
    assert_ptr_equal(llmem_fixed_alloc(p, NULL), y);
    assert_ptr_equal(llmem_fixed_alloc(p, NULL), x);
    fill(x, stride, n / 2);
    fill(y, stride, n / 3);
    for (size_t i = 0; i < n; i++) assert_true(intact(b[i], stride, i));

    s = quiet_stats(p);
    assert_int_equal(s.blocks_in_use, n);
    assert_int_equal(s.allocs_total, n + 3);
    assert_int_equal(s.frees_total, 3);
    assert_true(s.blocks_capacity >= n);
    assert_true(s.reserved_bytes >= s.blocks_capacity * stride);
    for (size_t i = 0; i < n; i++) assert_ok(llmem_fixed_free(p, b[i]));
    s = quiet_stats(p);
    assert_int_equal(s.blocks_in_use, 0);
    assert_int_equal(s.frees_total, n + 3);
    assert_int_equal(s.failures_total, 0);
    llmem_fixed_destroy(p);
}

static void basics_strides_alignment_reuse(void **state)
{
    (void)state;
    for (int v = 0; v < V_COUNT; v++)
        for (size_t i = 0; i < ARRAY_LEN(stride_cases); i++) basics_one((variant)v, &stride_cases[i]);
}

static void default_options(void **state)
{
    (void)state;
    llmem_fixed_options o = llmem_fixed_options_default();
    assert_string_equal(o.name, "fixed");
    assert_null(o.resource);
    assert_int_equal(o.block_size, 0);
    assert_int_equal(o.align, 0);
    assert_int_equal(o.max_blocks, 0);
    assert_int_equal(o.initial_blocks, 0);
    assert_false(o.thread_safe);
    assert_false(o.checked);
    /* A NULL name falls back to "fixed" in messages. */
    o.name = NULL;
    o.block_size = 64;
    o.max_blocks = 1;
    llmem_fixed *p = make(&o);
    assert_non_null(llmem_fixed_alloc(p, NULL));
    llmem_status st = LLMEM_OK;
    assert_null(llmem_fixed_alloc(p, &st));
    assert_int_equal(st, LLMEM_ECAPACITY);
    assert_error_mentions("'fixed'");
    llmem_fixed_destroy(p);
    /* A long name is truncated, not overrun. */
    o.name = "a-very-long-pool-name-that-goes-on-and-on-and-on-for-ever";
    p = make(&o);
    assert_non_null(llmem_fixed_alloc(p, NULL));
    assert_null(llmem_fixed_alloc(p, &st));
    assert_error_mentions("a-very-long-pool-name");
    llmem_fixed_destroy(p);
}

/* ---- growth ------------------------------------------------------------------ */

typedef struct tag_check {
    const char *want;
    size_t n, bad;
    size_t sizes[64];
} tag_check;

static bool collect_mapping(void *user, const llmem_tracking_entry *e)
{
    tag_check *t = user;
    if (strcmp(e->tag, t->want) != 0) t->bad++;
    if (t->n < ARRAY_LEN(t->sizes)) t->sizes[t->n] = e->size;
    t->n++;
    return true;
}

/* Allocate block by block through `nchunks` chunks and check, at each
 * chunk boundary, the capacity, chunk count and reserved bytes against the
 * documented growth (chunk_bytes, doubling, capped at max_chunk_bytes, each
 * rounded up to the resource's granularity), and against what the tracking
 * resource under the pool says is live. */
static void growth_case(variant v, size_t block_size, size_t chunk_bytes, size_t max_chunk_bytes, size_t nchunks,
                        const size_t *want_sizes)
{
    llmem_resource *tr;
    assert_ok(llmem_tracking_resource_create(llmem_resource_default(), &tr));
    size_t gran = llmem_resource_granularity(tr);
    llmem_fixed_options o = opts_for(v, block_size);
    o.resource = tr;
    o.name = "grower";
    o.chunk_bytes = chunk_bytes;
    o.max_chunk_bytes = max_chunk_bytes;
    o.cache_blocks = 2; /* thread-safe: refill one block at a time, so growth is block-exact */
    llmem_fixed *p = make(&o);
    size_t stride = llmem_fixed_block_size(p);
    assert_int_equal(tracking_of(tr).live_mappings, 0);

    size_t next = chunk_bytes ? chunk_bytes : (8 * stride > 64 * KiB ? 8 * stride : 64 * KiB);
    size_t cap_bytes = max_chunk_bytes ? max_chunk_bytes : 16 * MiB;
    if (cap_bytes < next) cap_bytes = next;
    size_t capacity = 0, reserved = 0, allocated = 0;
    for (size_t k = 0; k < nchunks; k++) {
        size_t mapped = round_up(next, gran);
        if (want_sizes) assert_int_equal(mapped, want_sizes[k]);
        size_t blocks = mapped / stride;
        /* Fill the chunks so far: no growth before they are full. */
        while (allocated < capacity) {
            assert_non_null(llmem_fixed_alloc(p, NULL));
            allocated++;
        }
        llmem_fixed_stats s = stats_of(p);
        assert_int_equal(s.chunks, k);
        assert_int_equal(s.blocks_capacity, capacity);
        assert_int_equal(s.reserved_bytes, reserved);
        /* One more block maps the next chunk. */
        assert_non_null(llmem_fixed_alloc(p, NULL));
        allocated++;
        capacity += blocks;
        reserved += mapped;
        s = stats_of(p);
        if (s.chunks != k + 1 || s.blocks_capacity != capacity || s.reserved_bytes != reserved)
            fail_msg("%s pool, chunk %zu: chunks %llu capacity %llu reserved %llu; expected %zu, %zu, %zu",
                     variant_names[v], k, (unsigned long long)s.chunks, (unsigned long long)s.blocks_capacity,
                     (unsigned long long)s.reserved_bytes, k + 1, capacity, reserved);
        llmem_tracking_stats t = tracking_of(tr);
        assert_int_equal(t.live_bytes, s.reserved_bytes);
        assert_int_equal(t.live_mappings, s.chunks);
        next = next <= cap_bytes / 2 ? next * 2 : cap_bytes;
    }
    /* Every mapping carries the pool's name as its tag, in the sizes above. */
    tag_check tc = {.want = "grower"};
    assert_ok(llmem_tracking_resource_foreach(tr, collect_mapping, &tc));
    assert_int_equal(tc.n, nchunks);
    assert_int_equal(tc.bad, 0);
    if (want_sizes)
        for (size_t k = 0; k < nchunks; k++) assert_int_equal(tc.sizes[k], want_sizes[k]);
    /* Destroy unmaps every chunk, live blocks included. */
    llmem_fixed_destroy(p);
    test_tracking_expect_clean(tr);
    llmem_resource_destroy(tr);
}

static void growth_doubles_chunks_up_to_the_cap(void **state)
{
    (void)state;
    size_t gran = llmem_resource_granularity(llmem_resource_default());
    const size_t pow2[] = {64 * KiB, 128 * KiB, 256 * KiB, 256 * KiB, 256 * KiB};
    for (int v = 0; v < V_COUNT; v++) {
        /* 64 KiB, 128 KiB, then 256 KiB each. */
        growth_case((variant)v, 64, 64 * KiB, 256 * KiB, 5, pow2);
        /* Sizes that are not granularity multiples map rounded up. */
        size_t odd[] = {round_up(10000, gran), round_up(20000, gran), round_up(40000, gran), round_up(50000, gran),
                        round_up(50000, gran)};
        growth_case((variant)v, 100, 10000, 50000, 5, odd);
    }
    /* Defaults: 64 KiB (or 8 blocks) doubling to 16 MiB. */
    const size_t defaults[] = {64 * KiB, 128 * KiB, 256 * KiB, 512 * KiB, 1 * MiB,  2 * MiB,
                               4 * MiB,  8 * MiB,   16 * MiB,  16 * MiB};
    growth_case(V_PLAIN, 4096, 0, 0, 10, defaults);
    const size_t big[] = {8 * 64 * KiB, 16 * 64 * KiB};
    growth_case(V_CHECKED, 64 * KiB, 0, 0, 2, big); /* 8 blocks of 64 KiB */
    /* max_chunk_bytes below chunk_bytes: chunk_bytes wins, no growth. */
    const size_t flat[] = {round_up(128 * KiB, gran), round_up(128 * KiB, gran), round_up(128 * KiB, gran)};
    growth_case(V_TS, 64, 128 * KiB, 4 * KiB, 3, flat);
}

/* A fresh chunk is mapped, not touched: handing out one block of a big
 * chunk costs about a page of resident memory, not the chunk. */
static void new_chunk_is_not_touched(void **state)
{
    (void)state;
    const size_t chunk = 128 * MiB;
    for (int v = 0; v < V_COUNT; v++) {
        llmem_fixed_options o = opts_for((variant)v, 4096);
        o.chunk_bytes = chunk;
        llmem_fixed *p = make(&o);
        size_t before = test_rss_bytes();
        assert_true(before > 0);
        void *b = llmem_fixed_alloc(p, NULL);
        assert_non_null(b);
        memset(b, 0x5A, 4096);
        void *b2 = llmem_fixed_alloc(p, NULL);
        assert_non_null(b2);
        memset(b2, 0x5B, 4096);
        size_t after = test_rss_bytes();
        llmem_fixed_stats s = stats_of(p);
        assert_int_equal(s.reserved_bytes, chunk);
        assert_int_equal(s.chunks, 1);
        /* Generous: ASan's shadow of the poisoned chunk is chunk/8. */
        size_t grew = after > before ? after - before : 0;
        if (grew > chunk / 4)
            fail_msg("%s pool: RSS grew by %zu bytes for two blocks of a %zu-byte chunk", variant_names[v], grew,
                     chunk);
        llmem_fixed_destroy(p);
    }
}

/* ---- the block cap and initial blocks ----------------------------------------- */

static void max_blocks_is_exact(void **state)
{
    (void)state;
    for (int v = 0; v < V_COUNT; v++) {
        for (size_t chunk = 4 * KiB; chunk <= 64 * KiB; chunk *= 16) {
            enum { MAX = 100 };
            llmem_fixed_options o = opts_for((variant)v, 64);
            o.name = "capped";
            o.max_blocks = MAX;
            o.chunk_bytes = chunk; /* 4 KiB: the cap falls in the second chunk; 64 KiB: in the first */
            llmem_fixed *p = make(&o);
            void *b[MAX];
            for (size_t i = 0; i < MAX; i++) {
                b[i] = llmem_fixed_alloc(p, NULL);
                if (!b[i]) fail_msg("%s pool: allocation %zu of max_blocks %d failed", variant_names[v], i, MAX);
                fill(b[i], 64, i);
            }
            assert_disjoint(b, MAX, 64);
            llmem_error_clear();
            llmem_status st = LLMEM_OK;
            assert_null(llmem_fixed_alloc(p, &st));
            assert_int_equal(st, LLMEM_ECAPACITY);
            assert_error_mentions("capped");
            assert_error_mentions("max_blocks");
            llmem_fixed_stats s = quiet_stats(p);
            assert_int_equal(s.failures_total, 1);
            assert_int_equal(s.blocks_in_use, MAX);
            assert_int_equal(s.blocks_capacity, MAX); /* never maps past the cap */
            assert_int_equal(s.allocs_total, MAX);
            /* Freeing one lets exactly one more in. */
            assert_ok(llmem_fixed_free(p, b[37]));
            void *again = llmem_fixed_alloc(p, &st);
            assert_ptr_equal(again, b[37]);
            assert_int_equal(st, LLMEM_OK);
            assert_null(llmem_fixed_alloc(p, &st));
            assert_int_equal(st, LLMEM_ECAPACITY);
            fill(b[37], 64, 37);
            for (size_t i = 0; i < MAX; i++) assert_true(intact(b[i], 64, i));
            s = quiet_stats(p);
            assert_int_equal(s.failures_total, 2);
            assert_int_equal(s.blocks_capacity, MAX);
            for (size_t i = 0; i < MAX; i++) assert_ok(llmem_fixed_free(p, b[i]));
            /* All of them again. */
            for (size_t i = 0; i < MAX; i++) assert_non_null(llmem_fixed_alloc(p, NULL));
            assert_null(llmem_fixed_alloc(p, &st));
            assert_int_equal(st, LLMEM_ECAPACITY);
            llmem_fixed_destroy(p);
        }
    }
}

static void expect_create_fails_(const llmem_fixed_options *o, llmem_status want)
{
    llmem_fixed *p = (llmem_fixed *)(uintptr_t)1;
    llmem_error_clear();
    assert_status(llmem_fixed_create(o, &p), want);
    assert_null(p);
}

static void initial_blocks_map_at_create(void **state)
{
    (void)state;
    for (int v = 0; v < V_COUNT; v++) {
        llmem_resource *tr;
        assert_ok(llmem_tracking_resource_create(llmem_resource_default(), &tr));
        llmem_fixed_options o = opts_for((variant)v, 64);
        o.resource = tr;
        o.name = "pre";
        o.initial_blocks = 3000; /* 192000 bytes, above the default first chunk */
        llmem_fixed *p = make(&o);
        llmem_tracking_stats t = tracking_of(tr);
        assert_int_equal(t.live_mappings, 1);
        assert_true(t.live_bytes >= 3000 * 64);
        llmem_fixed_stats s = stats_of(p);
        assert_true(s.blocks_capacity >= 3000);
        assert_int_equal(s.chunks, 1);
        assert_int_equal(s.reserved_bytes, t.live_bytes);
        assert_int_equal(s.blocks_in_use, 0);
        assert_int_equal(s.allocs_total, 0);
        /* They serve allocations without another mapping. */
        for (size_t i = 0; i < 3000; i++) assert_non_null(llmem_fixed_alloc(p, NULL));
        assert_int_equal(tracking_of(tr).live_mappings, 1);
        llmem_fixed_destroy(p);
        assert_int_equal(tracking_of(tr).live_mappings, 0);

        /* initial_blocks == max_blocks: exactly that many, all mapped at create. */
        o.initial_blocks = 50;
        o.max_blocks = 50;
        p = make(&o);
        assert_int_equal(tracking_of(tr).live_mappings, 1);
        assert_int_equal(stats_of(p).blocks_capacity, 50);
        for (size_t i = 0; i < 50; i++) assert_non_null(llmem_fixed_alloc(p, NULL));
        llmem_status st = LLMEM_OK;
        assert_null(llmem_fixed_alloc(p, &st));
        assert_int_equal(st, LLMEM_ECAPACITY);
        llmem_fixed_destroy(p);

        /* initial_blocks > max_blocks: refused, nothing mapped. */
        o.initial_blocks = 51;
        p = (llmem_fixed *)(uintptr_t)1;
        assert_status(llmem_fixed_create(&o, &p), LLMEM_ECAPACITY);
        assert_null(p);
        assert_error_mentions("initial_blocks");
        assert_int_equal(tracking_of(tr).live_mappings, 0);
        llmem_resource_destroy(tr);

        /* A resource that cannot hold them all: create fails, rather than
         * quietly mapping fewer. */
        llmem_limit_options lo = llmem_limit_options_default();
        lo.limit_bytes = 64 * KiB;
        llmem_resource *lim;
        assert_ok(llmem_limit_resource_create(llmem_resource_default(), &lo, &lim));
        o = opts_for((variant)v, 64);
        o.resource = lim;
        o.initial_blocks = 64 * KiB / 64 + 1;
        expect_create_fails_(&o, LLMEM_ENOMEM);
        size_t used = 1;
        assert_ok(llmem_limit_resource_usage(lim, &used, NULL));
        assert_int_equal(used, 0);
        o.initial_blocks = 64 * KiB / 64; /* exactly fits */
        p = make(&o);
        assert_int_equal(stats_of(p).blocks_capacity, 64 * KiB / 64);
        for (size_t i = 0; i < 64 * KiB / 64; i++) assert_non_null(llmem_fixed_alloc(p, NULL));
        assert_null(llmem_fixed_alloc(p, &st));
        assert_int_equal(st, LLMEM_ENOMEM);
        llmem_fixed_destroy(p);
        llmem_resource_destroy(lim);
    }
}

/* ---- growth under a capped resource --------------------------------------------- */

static void fills_a_capped_resource(variant v, size_t block_size, size_t cap)
{
    llmem_limit_options lo = llmem_limit_options_default();
    lo.limit_bytes = cap;
    llmem_resource *lim;
    assert_ok(llmem_limit_resource_create(llmem_resource_default(), &lo, &lim));
    llmem_fixed_options o = opts_for(v, block_size);
    o.resource = lim;
    o.name = "brim";
    o.chunk_bytes = 256 * KiB;
    o.max_chunk_bytes = 1 * MiB;
    llmem_fixed *p = make(&o);
    size_t stride = llmem_fixed_block_size(p);
    size_t max_n = cap / stride + 1;
    void **b = malloc(max_n * sizeof *b);
    assert_non_null(b);
    size_t n = 0;
    llmem_status st = LLMEM_OK;
    for (;;) {
        void *x = llmem_fixed_alloc(p, &st);
        if (!x) break;
        assert_true(n < max_n);
        b[n++] = x;
    }
    assert_int_equal(st, LLMEM_ENOMEM);
    assert_true(llmem_error_message()[0] != '\0');
    llmem_fixed_stats s = quiet_stats(p);
    assert_int_equal(s.blocks_capacity, n);
    assert_int_equal(s.blocks_in_use, n);
    assert_int_equal(s.failures_total, 1);
    size_t used = 0, limit = 0;
    assert_ok(llmem_limit_resource_usage(lim, &used, &limit));
    assert_int_equal(used, s.reserved_bytes);
    assert_true(n * stride <= cap);
    if (cap - n * stride >= stride)
        fail_msg("%s pool, stride %zu, cap %zu: stopped at %zu blocks (%zu bytes) in %llu chunks, %zu bytes short",
                 variant_names[v], stride, cap, n, n * stride, (unsigned long long)s.chunks, cap - n * stride);
    assert_true(s.chunks > 2); /* it did fall back to smaller chunks */

    /* Still usable: frees make room again, and the cap is still enforced. */
    for (size_t i = 0; i < 10; i++) assert_ok(llmem_fixed_free(p, b[n - 1 - i]));
    for (size_t i = 0; i < 10; i++) assert_non_null(llmem_fixed_alloc(p, NULL));
    assert_null(llmem_fixed_alloc(p, &st));
    assert_int_equal(st, LLMEM_ENOMEM);
    assert_int_equal(stats_of(p).failures_total, 2);

    /* Raise the cap: the pool grows again, to the new brim. */
    assert_ok(llmem_limit_resource_set(lim, cap + 64 * KiB));
    size_t more = 0;
    while (llmem_fixed_alloc(p, &st)) more++;
    assert_int_equal(st, LLMEM_ENOMEM);
    assert_true(more > 0);
    s = quiet_stats(p);
    assert_int_equal(s.blocks_capacity, n + more);
    assert_true((n + more) * stride <= cap + 64 * KiB);
    assert_true(cap + 64 * KiB - (n + more) * stride < stride);
    free(b);
    llmem_fixed_destroy(p);
    assert_ok(llmem_limit_resource_usage(lim, &used, NULL));
    assert_int_equal(used, 0);
    llmem_resource_destroy(lim);
}

static void growth_under_a_capped_resource(void **state)
{
    (void)state;
    size_t gran = llmem_resource_granularity(llmem_resource_default());
    for (int v = 0; v < V_COUNT; v++) {
        fills_a_capped_resource((variant)v, 64, 1 * MiB + 5 * gran);
        fills_a_capped_resource((variant)v, 1000, 2 * MiB + 3 * gran);
        fills_a_capped_resource((variant)v, 4096, 1 * MiB + 7 * gran);
    }
}

/* ---- checked mode ------------------------------------------------------------------- */

static void expect_foreign(llmem_fixed *p, void *ptr, const char *name)
{
    char txt[32];
    ptr_text(txt, sizeof txt, ptr);
    llmem_error_clear();
    assert_status(llmem_fixed_free(p, ptr), LLMEM_EFOREIGN);
    assert_error_mentions(name);
    assert_error_mentions(txt);
}

static void checked_one(variant v, size_t block_size)
{
    llmem_fixed_options o = opts_for(v, block_size);
    o.name = "kv-checked";
    o.chunk_bytes = 4 * KiB; /* several chunks, so lookups search */
    llmem_fixed *p = make(&o);
    o.name = "other";
    llmem_fixed *other = make(&o);
    size_t stride = llmem_fixed_block_size(p);

    /* Spread over a few chunks. */
    enum { N = 300 };
    void *blk[N];
    for (size_t i = 0; i < N; i++) {
        blk[i] = llmem_fixed_alloc(p, NULL);
        assert_non_null(blk[i]);
        fill(blk[i], stride, 1000 + i);
    }
    assert_true(stats_of(p).chunks >= 2);
    void *a = blk[N - 1], *b = blk[N / 2];

    /* A legitimate free fills the block with the freed pattern (0xDF), which
     * the next allocation verifies (test_hardening covers the detection);
     * the free list is out of band, so the pattern is all there is. */
    assert_ok(llmem_fixed_free(p, a));
    assert_true(freed_raw(a, stride));

    /* Double free: refused, named, logged, memory untouched. */
    static test_log_capture cap;
    test_log_capture_start(&cap, LLMEM_LOG_WARN);
    char txt[32];
    ptr_text(txt, sizeof txt, a);
    llmem_error_clear();
    assert_status(llmem_fixed_free(p, a), LLMEM_EDOUBLEFREE);
    assert_error_mentions("kv-checked");
    assert_error_mentions(txt);
    assert_error_mentions("double free");
    assert_int_equal(cap.count, 1);
    assert_int_equal(cap.level, LLMEM_LOG_WARN);
    assert_non_null(strstr(cap.last, "kv-checked"));
    llmem_log_set(NULL, NULL, LLMEM_LOG_OFF);
    assert_true(freed_raw(a, stride));

    /* A stack address. */
    _Alignas(64) unsigned char on_stack[512];
    fill(on_stack, sizeof on_stack, 7);
    expect_foreign(p, on_stack, "kv-checked");
    expect_foreign(p, on_stack + 64, "kv-checked");
    assert_true(intact(on_stack, sizeof on_stack, 7));
    /* A malloc'd pointer. */
    unsigned char *heap = malloc(stride);
    assert_non_null(heap);
    fill(heap, stride, 8);
    expect_foreign(p, heap, "kv-checked");
    assert_true(intact(heap, stride, 8));
    free(heap);
    /* Inside a live block, not at its start. */
    size_t offs[] = {1, 8, stride / 2, stride - 1};
    for (size_t i = 0; i < ARRAY_LEN(offs); i++) expect_foreign(p, (char *)b + offs[i], "kv-checked");
    assert_true(intact(b, stride, 1000 + N / 2));
    /* Inside a free block, not at its start. */
    expect_foreign(p, (char *)a + 8, "kv-checked");
    assert_true(freed_raw(a, stride));
    /* A live block of another pool. */
    void *x = llmem_fixed_alloc(other, NULL);
    assert_non_null(x);
    fill(x, stride, 9);
    expect_foreign(p, x, "kv-checked");
    assert_true(intact(x, stride, 9));
    assert_ok(llmem_fixed_free(other, x)); /* its own pool takes it */

    llmem_fixed_stats s = quiet_stats(p);
    assert_int_equal(s.double_frees_total, 1);
    assert_int_equal(s.foreign_frees_total, 2 + 1 + ARRAY_LEN(offs) + 1 + 1);
    assert_int_equal(s.allocs_total, N);
    assert_int_equal(s.frees_total, 1); /* refusals are not frees */
    assert_int_equal(s.blocks_in_use, N - 1);
    llmem_fixed_stats so = quiet_stats(other);
    assert_int_equal(so.double_frees_total, 0);
    assert_int_equal(so.foreign_frees_total, 0);
    for (size_t i = 0; i < N - 1; i++) assert_true(intact(blk[i], stride, 1000 + i));

    /* Still works: a free block comes back (the one just freed, for a pool
     * without thread caches: the stats call above flushed this thread's),
     * and every live block frees once. */
    void *again = llmem_fixed_alloc(p, NULL);
    assert_non_null(again);
    if (!is_ts(v)) assert_ptr_equal(again, a);
    for (size_t i = 0; i < N - 1; i++) assert_ptr_not_equal(again, blk[i]);
    blk[N - 1] = again;
    for (size_t i = 0; i < N; i++) assert_ok(llmem_fixed_free(p, blk[i]));
    assert_status(llmem_fixed_free(p, b), LLMEM_EDOUBLEFREE);
    s = quiet_stats(p);
    assert_int_equal(s.blocks_in_use, 0);
    assert_int_equal(s.double_frees_total, 2);
    for (size_t i = 0; i < N; i++) {
        blk[i] = llmem_fixed_alloc(p, NULL);
        assert_non_null(blk[i]);
        fill(blk[i], stride, i);
    }
    assert_disjoint(blk, N, stride);
    for (size_t i = 0; i < N; i++) assert_true(intact(blk[i], stride, i));
    for (size_t i = 0; i < N; i++) assert_ok(llmem_fixed_free(p, blk[i]));
    assert_int_equal(quiet_stats(p).blocks_in_use, 0);
    llmem_fixed_destroy(other);
    llmem_fixed_destroy(p);
}

static void checked_mode_detects_and_touches_nothing(void **state)
{
    (void)state;
    checked_one(V_CHECKED, 100);
    checked_one(V_TS_CHECKED, 100);
    checked_one(V_CHECKED, 24);
    checked_one(V_TS_CHECKED, 5000);
}

/* ---- ownership ---------------------------------------------------------------------- */

static void owns_block_starts_only(void **state)
{
    (void)state;
    for (int v = 0; v < V_COUNT; v++) {
        llmem_fixed_options o = opts_for((variant)v, 100);
        o.chunk_bytes = 4 * KiB;
        llmem_fixed *p = make(&o), *q = make(&o);
        size_t stride = llmem_fixed_block_size(p);
        assert_false(llmem_fixed_owns(p, NULL));
        enum { N = 80 };
        void *b[N];
        for (size_t i = 0; i < N; i++) b[i] = llmem_fixed_alloc(p, NULL);
        void *x = llmem_fixed_alloc(q, NULL);
        assert_non_null(x);
        int on_stack = 0;
        for (size_t i = 0; i < N; i++) {
            assert_non_null(b[i]);
            assert_true(llmem_fixed_owns(p, b[i]));
            assert_false(llmem_fixed_owns(q, b[i]));
            assert_false(llmem_fixed_owns(p, (char *)b[i] + 1));
            assert_false(llmem_fixed_owns(p, (char *)b[i] + stride / 2));
            assert_false(llmem_fixed_owns(p, (char *)b[i] + stride - 1));
        }
        for (size_t i = 0; i < N; i += 2) assert_ok(llmem_fixed_free(p, b[i]));
        for (size_t i = 0; i < N; i++) assert_true(llmem_fixed_owns(p, b[i])); /* free blocks too */
        assert_false(llmem_fixed_owns(p, x));
        assert_true(llmem_fixed_owns(q, x));
        assert_false(llmem_fixed_owns(p, &on_stack));
        assert_false(llmem_fixed_owns(NULL, b[1]));
        llmem_fixed_destroy(q);
        llmem_fixed_destroy(p);
    }
}

/* ---- bad input --------------------------------------------------------------------- */

static void expect_create_fails(const llmem_fixed_options *o, llmem_status want, const char *mention)
{
    llmem_fixed *p = (llmem_fixed *)(uintptr_t)1;
    llmem_error_clear();
    assert_status(llmem_fixed_create(o, &p), want);
    assert_null(p);
    if (mention) assert_error_mentions(mention);
}

static void bad_input_is_a_status(void **state)
{
    (void)state;
    llmem_fixed_options o = llmem_fixed_options_default();
    o.name = "bad";
    o.block_size = 64;
    llmem_fixed *p = (llmem_fixed *)(uintptr_t)1;

    llmem_error_clear();
    assert_status(llmem_fixed_create(NULL, &p), LLMEM_EINVAL);
    assert_null(p);
    llmem_error_clear();
    assert_status(llmem_fixed_create(&o, NULL), LLMEM_EINVAL);

    o.block_size = 0;
    expect_create_fails(&o, LLMEM_EINVAL, "block_size");
    o.block_size = SIZE_MAX;
    expect_create_fails(&o, LLMEM_EOVERFLOW, "bad");
    o.block_size = SIZE_MAX / 2 + 1;
    expect_create_fails(&o, LLMEM_EOVERFLOW, "bad");
    o.block_size = SIZE_MAX / 2 + 1;
    o.align = 4096;
    expect_create_fails(&o, LLMEM_EOVERFLOW, "bad");
    o.block_size = 64;
    o.align = 3;
    expect_create_fails(&o, LLMEM_EALIGN, "3");
    o.align = (size_t)2 << 30;
    expect_create_fails(&o, LLMEM_EALIGN, "bad");
    o.align = 48;
    expect_create_fails(&o, LLMEM_EALIGN, "48");
    o.align = 0;
    o.max_blocks = SIZE_MAX / 32; /* * 64 bytes overflows */
    expect_create_fails(&o, LLMEM_EOVERFLOW, "max_blocks");
    o.max_blocks = 0;
    o.initial_blocks = SIZE_MAX / 32;
    expect_create_fails(&o, LLMEM_EOVERFLOW, "initial_blocks");
    o.initial_blocks = 0;
    o.thread_safe = true;
    o.cache_blocks = 65537;
    expect_create_fails(&o, LLMEM_EINVAL, "cache_blocks");
    o.cache_blocks = 65536; /* the largest accepted */
    p = make(&o);
    assert_non_null(llmem_fixed_alloc(p, NULL));
    llmem_fixed_destroy(p);
    o.thread_safe = false;
    o.cache_blocks = 0;

    p = make(&o);
    llmem_status st = LLMEM_OK;
    llmem_error_clear();
    assert_null(llmem_fixed_alloc(NULL, &st));
    assert_int_equal(st, LLMEM_EINVAL);
    assert_true(llmem_error_message()[0] != '\0');
    assert_null(llmem_fixed_alloc(NULL, NULL));
    void *b = llmem_fixed_alloc(p, NULL);
    assert_non_null(b);
    llmem_error_clear();
    assert_status(llmem_fixed_free(NULL, b), LLMEM_EINVAL);
    assert_ok(llmem_fixed_free(p, NULL));
    llmem_fixed_stats s;
    memset(&s, 0, sizeof s);
    llmem_error_clear();
    assert_status(llmem_fixed_get_stats(NULL, &s), LLMEM_EINVAL);
    llmem_error_clear();
    assert_status(llmem_fixed_get_stats(p, NULL), LLMEM_EINVAL);
    assert_int_equal(llmem_fixed_block_size(NULL), 0);
    assert_false(llmem_fixed_owns(NULL, b));
    llmem_fixed_destroy(NULL);
    llmem_fixed_flush_thread_cache(NULL);
    /* Flushing a plain pool changes nothing. */
    llmem_fixed_stats before = stats_of(p);
    llmem_fixed_flush_thread_cache(p);
    llmem_fixed_stats after = stats_of(p);
    assert_memory_equal(&before, &after, sizeof before);
    assert_int_equal(after.blocks_in_use, 1);
    assert_int_equal(after.frees_total, 0); /* free(p, NULL) is no free */
    llmem_fixed_destroy(p);
}

/* ---- stats -------------------------------------------------------------------------- */

static void stats_are_exact(void **state)
{
    (void)state;
    for (int v = 0; v < V_COUNT; v++) {
        llmem_fixed_options o = opts_for((variant)v, 48);
        llmem_fixed *p = make(&o);
        enum { N = 300 };
        void *b[N];
        uint64_t peak = 0, live = 0;
        for (size_t i = 0; i < 200; i++) b[i] = llmem_fixed_alloc(p, NULL), live++;
        peak = live;
        for (size_t i = 0; i < 150; i++) {
            assert_ok(llmem_fixed_free(p, b[i]));
            live--;
        }
        llmem_fixed_stats s = is_ts((variant)v) ? quiet_stats(p) : stats_of(p);
        assert_int_equal(s.blocks_in_use, live);
        assert_int_equal(s.allocs_total, 200);
        assert_int_equal(s.frees_total, 150);
        assert_int_equal(s.failures_total, 0);
        assert_int_equal(s.double_frees_total, 0);
        assert_int_equal(s.foreign_frees_total, 0);
        if (!is_ts((variant)v)) assert_int_equal(s.blocks_in_use_peak, peak);
        else assert_true(s.blocks_in_use_peak >= s.blocks_in_use && s.blocks_in_use_peak <= peak);
        for (size_t i = 0; i < 150; i++) b[i] = llmem_fixed_alloc(p, NULL), live++;
        for (size_t i = 200; i < N; i++) b[i] = llmem_fixed_alloc(p, NULL), live++;
        if (live > peak) peak = live;
        for (size_t i = 0; i < N; i += 3) {
            assert_ok(llmem_fixed_free(p, b[i]));
            live--;
        }
        s = is_ts((variant)v) ? quiet_stats(p) : stats_of(p);
        assert_int_equal(s.blocks_in_use, live);
        assert_int_equal(s.allocs_total, 200 + 150 + 100);
        assert_int_equal(s.frees_total, 150 + 100);
        if (!is_ts((variant)v)) assert_int_equal(s.blocks_in_use_peak, peak);
        else assert_true(s.blocks_in_use_peak >= s.blocks_in_use && s.blocks_in_use_peak <= peak);
        assert_int_equal(s.block_size, 48);
        assert_int_equal(s.stride, 48);
        assert_true(s.blocks_capacity >= peak);

        /* A caller with an older, shorter struct gets only that much. */
        llmem_fixed_stats short_s;
        memset(&short_s, 0xAB, sizeof short_s);
        short_s.struct_size = offsetof(llmem_fixed_stats, blocks_in_use_peak);
        assert_ok(llmem_fixed_get_stats(p, &short_s));
        assert_int_equal(short_s.struct_size, offsetof(llmem_fixed_stats, blocks_in_use_peak));
        assert_int_equal(short_s.blocks_in_use, live);
        const unsigned char *tail = (const unsigned char *)&short_s + short_s.struct_size;
        for (size_t i = 0; i < sizeof short_s - short_s.struct_size; i++) assert_int_equal(tail[i], 0xAB);

        /* The schema serves the exporter. */
        const llmem_stats_schema *sch = llmem_fixed_stats_schema();
        assert_non_null(sch);
        char json[2048], want[64];
        assert_ok(llmem_stats_to_json(sch, &s, NULL, 0, json, sizeof json, NULL));
        snprintf(want, sizeof want, "\"blocks_in_use\":%llu", (unsigned long long)live);
        assert_non_null(strstr(json, want));
        assert_non_null(strstr(json, "\"allocs_total\":450"));
        assert_non_null(strstr(json, "\"type\":\"fixed\""));
        llmem_fixed_destroy(p);
    }
}

/* ---- device pools over sim-device ---------------------------------------------------- */

static llmem_resource *make_sim(size_t capacity)
{
    llmem_sim_options so = llmem_sim_options_default();
    so.capacity = capacity;
    so.fill = 0xC3; /* fresh device memory is not zero: a round trip proves the copy */
    llmem_resource *sim;
    assert_ok(llmem_sim_resource_create(&so, &sim));
    return sim;
}

static void dev_write(llmem_resource *sim, void *dst, size_t n, uint64_t id, unsigned char *buf)
{
    fill(buf, n, id);
    assert_ok(llmem_resource_copy(sim, dst, buf, n));
}

static bool dev_intact(llmem_resource *sim, const void *src, size_t n, uint64_t id, unsigned char *buf)
{
    memset(buf, 0, n);
    assert_ok(llmem_resource_copy(sim, buf, src, n));
    return intact(buf, n, id);
}

static void device_one(variant v, size_t block_size, size_t align)
{
    llmem_resource *sim = make_sim(256 * MiB);
    llmem_fixed_options o = opts_for(v, block_size);
    o.resource = sim;
    o.align = align;
    o.name = "dev";
    o.chunk_bytes = 16 * KiB;
    o.max_chunk_bytes = 64 * KiB;
    llmem_fixed *p = make(&o);
    size_t stride = llmem_fixed_block_size(p);
    size_t want_align = align ? align : 256;
    assert_int_equal(stride, round_up(block_size, want_align));
    unsigned char *buf = malloc(stride);
    assert_non_null(buf);

    enum { N = 150 };
    void *b[N];
    uint64_t id[N];
    for (size_t i = 0; i < N; i++) {
        llmem_status st = LLMEM_EINVAL;
        b[i] = llmem_fixed_alloc(p, &st);
        assert_non_null(b[i]);
        assert_int_equal(st, LLMEM_OK);
        assert_true(aligned(b[i], want_align));
        assert_true(llmem_sim_resource_contains(sim, b[i], stride));
        assert_true(llmem_fixed_owns(p, b[i]));
        id[i] = i;
        dev_write(sim, b[i], stride, id[i], buf);
    }
    assert_disjoint(b, N, stride);
    for (size_t i = 0; i < N; i++) assert_true(dev_intact(sim, b[i], stride, id[i], buf));

    /* Free half, take them back (LIFO), rewrite, everything still round-trips. */
    for (size_t i = 0; i < N; i += 2) assert_ok(llmem_fixed_free(p, b[i]));
    for (size_t i = 1; i < N; i += 2) assert_true(dev_intact(sim, b[i], stride, id[i], buf));
    if (is_checked(v)) {
        llmem_error_clear();
        assert_status(llmem_fixed_free(p, b[0]), LLMEM_EDOUBLEFREE);
        assert_error_mentions("dev");
        assert_status(llmem_fixed_free(p, (char *)b[1] + 8), LLMEM_EFOREIGN);
        assert_status(llmem_fixed_free(p, buf), LLMEM_EFOREIGN);
        assert_true(dev_intact(sim, b[1], stride, id[1], buf));
    }
    for (size_t i = (N - 1) / 2 * 2;; i -= 2) {
        void *x = llmem_fixed_alloc(p, NULL);
        assert_non_null(x);
        assert_true(llmem_sim_resource_contains(sim, x, stride));
        /* LIFO: the last freed comes back first (a thread cache mixes in
         * blocks it refilled earlier, so only for the other variants). */
        if (!is_ts(v)) assert_ptr_equal(x, b[i]);
        b[i] = x;
        id[i] = 1000 + i;
        dev_write(sim, x, stride, id[i], buf);
        if (i == 0) break;
    }
    assert_disjoint(b, N, stride);
    for (size_t i = 0; i < N; i++) assert_true(dev_intact(sim, b[i], stride, id[i], buf));

    llmem_fixed_stats s = quiet_stats(p);
    assert_int_equal(s.blocks_in_use, N);
    assert_int_equal(s.allocs_total, N + (N + 1) / 2);
    assert_int_equal(s.frees_total, (N + 1) / 2);
    assert_int_equal(s.double_frees_total, is_checked(v) ? 1 : 0);
    assert_int_equal(s.foreign_frees_total, is_checked(v) ? 2 : 0);
    llmem_sim_stats ss;
    memset(&ss, 0, sizeof ss);
    ss.struct_size = sizeof ss;
    assert_ok(llmem_sim_resource_get_stats(sim, &ss));
    assert_int_equal(ss.used_bytes, s.reserved_bytes);
    assert_int_equal(ss.bad_copies_total, 0);
    for (size_t i = 0; i < N; i++) assert_ok(llmem_fixed_free(p, b[i]));
    assert_int_equal(quiet_stats(p).blocks_in_use, 0);
    llmem_fixed_destroy(p);
    assert_ok(llmem_sim_resource_get_stats(sim, &ss));
    assert_int_equal(ss.used_bytes, 0);
    free(buf);
    llmem_resource_destroy(sim);
}

static void device_pools_keep_metadata_out_of_band(void **state)
{
    (void)state;
    for (int v = 0; v < V_COUNT; v++) {
        device_one((variant)v, 1000, 0);
        device_one((variant)v, 24, 0);
        device_one((variant)v, 5000, 0);
        device_one((variant)v, 100, 4096);
    }
}

typedef struct touch_arg {
    void *block;
} touch_arg;

static void touch_block(void *arg) { memset(((touch_arg *)arg)->block, 1, 8); }

/* The check above means something: touching a device block crashes. */
static void device_block_touch_faults(void **state)
{
    (void)state;
#ifdef TEST_TSAN
    skip();
#endif
    llmem_resource *sim = make_sim(16 * MiB);
    llmem_fixed_options o = opts_for(V_PLAIN, 64);
    o.resource = sim;
    llmem_fixed *p = make(&o);
    touch_arg a = {llmem_fixed_alloc(p, NULL)};
    assert_non_null(a.block);
    assert_true(test_child_faults(touch_block, &a));
    llmem_fixed_destroy(p);
    llmem_resource_destroy(sim);
}

/* ---- AddressSanitizer poisoning ------------------------------------------------------- */

#ifdef TEST_ASAN
static bool fully_poisoned(const void *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!__asan_address_is_poisoned((const char *)b + i)) return false;
    return true;
}

static void asan_one(variant v)
{
    llmem_fixed_options o = opts_for(v, 100);
    o.chunk_bytes = 16 * KiB;
    o.max_chunk_bytes = 16 * KiB;
    llmem_fixed *p = make(&o);
    size_t stride = llmem_fixed_block_size(p);
    char *a = llmem_fixed_alloc(p, NULL);
    assert_non_null(a);
    if (__asan_region_is_poisoned(a, stride))
        fail_msg("%s pool: a live block is poisoned at %p", variant_names[v], __asan_region_is_poisoned(a, stride));
    memset(a, 1, stride); /* the whole stride is usable */
    /* Every other block of the chunk was never handed out: poisoned. */
    size_t others = 0;
    for (char *x = a + stride; llmem_fixed_owns(p, x); x += stride, others++)
        if (!fully_poisoned(x, stride)) fail_msg("%s pool: unused block %p not poisoned", variant_names[v], x);
    for (char *x = a - stride; llmem_fixed_owns(p, x); x -= stride, others++)
        if (!fully_poisoned(x, stride)) fail_msg("%s pool: unused block %p not poisoned", variant_names[v], x);
    assert_int_equal(others + 1, stats_of(p).blocks_capacity);

    /* Freed blocks are poisoned, live ones are not, through every path:
     * the free list, magazines, flushes and refills. */
    enum { N = 400 };
    char *b[N];
    for (size_t i = 0; i < N; i++) {
        b[i] = llmem_fixed_alloc(p, NULL);
        assert_non_null(b[i]);
        assert_null(__asan_region_is_poisoned(b[i], stride));
    }
    for (size_t i = 0; i < N; i++) {
        assert_ok(llmem_fixed_free(p, b[i]));
        if (!fully_poisoned(b[i], stride)) fail_msg("%s pool: freed block %zu not poisoned", variant_names[v], i);
    }
    llmem_fixed_flush_thread_cache(p);
    for (int round = 0; round < 3; round++) {
        char *c = llmem_fixed_alloc(p, NULL);
        assert_non_null(c);
        assert_null(__asan_region_is_poisoned(c, stride));
        memset(c, 2, stride);
        size_t free_ones = 0;
        for (size_t i = 0; i < N; i++) {
            if (b[i] == c) continue;
            free_ones++;
            if (!fully_poisoned(b[i], stride))
                fail_msg("%s pool, round %d: free block %p not poisoned", variant_names[v], round, (void *)b[i]);
        }
        assert_int_equal(free_ones, N - 1);
        assert_ok(llmem_fixed_free(p, c));
        assert_true(fully_poisoned(c, stride));
        llmem_fixed_flush_thread_cache(p);
    }
    assert_true(__asan_address_is_poisoned(a) == 0);
    assert_ok(llmem_fixed_free(p, a));
    assert_true(fully_poisoned(a, stride));
    llmem_fixed_destroy(p);
}
#endif

static void asan_poisons_free_blocks(void **state)
{
    (void)state;
#ifdef TEST_ASAN
    for (int v = 0; v < V_COUNT; v++) asan_one((variant)v);
#else
    skip(); /* the ASan build runs it */
#endif
}

/* ---- property test against a shadow model --------------------------------------------- */

typedef struct live_block {
    void *b;
    uint64_t id;
} live_block;

typedef struct model {
    llmem_fixed *p;
    llmem_resource *sim; /* NULL for host pools */
    variant v;
    size_t stride, align;
    unsigned char *buf;
    live_block *live;
    size_t n;
    uint64_t allocs, frees, failures, peak;
} model;

static void write_block(model *m, void *b, uint64_t id)
{
    if (m->sim) dev_write(m->sim, b, m->stride, id, m->buf);
    else fill(b, m->stride, id);
}

static bool block_intact(model *m, const live_block *l)
{
    return m->sim ? dev_intact(m->sim, l->b, m->stride, l->id, m->buf) : intact(l->b, m->stride, l->id);
}

static void model_check(model *m, uint64_t seed, size_t op)
{
    void **ptrs = malloc((m->n ? m->n : 1) * sizeof *ptrs);
    assert_non_null(ptrs);
    for (size_t i = 0; i < m->n; i++) {
        ptrs[i] = m->live[i].b;
        if (!block_intact(m, &m->live[i]))
            fail_msg("%s%s pool, seed %llu, op %zu: live block %p lost its pattern", m->sim ? "device " : "",
                     variant_names[m->v], (unsigned long long)seed, op, m->live[i].b);
        assert_true(aligned(ptrs[i], m->align));
        assert_true(llmem_fixed_owns(m->p, ptrs[i]));
    }
    assert_disjoint(ptrs, m->n, m->stride);
    free(ptrs);
    llmem_fixed_stats s = is_ts(m->v) ? quiet_stats(m->p) : stats_of(m->p);
    if (s.blocks_in_use != m->n || s.allocs_total != m->allocs || s.frees_total != m->frees ||
        s.failures_total != m->failures)
        fail_msg("%s pool, seed %llu, op %zu: in use %llu allocs %llu frees %llu failures %llu; model %zu %llu %llu %llu",
                 variant_names[m->v], (unsigned long long)seed, op, (unsigned long long)s.blocks_in_use,
                 (unsigned long long)s.allocs_total, (unsigned long long)s.frees_total,
                 (unsigned long long)s.failures_total, m->n, (unsigned long long)m->allocs,
                 (unsigned long long)m->frees, (unsigned long long)m->failures);
    if (!is_ts(m->v)) assert_int_equal(s.blocks_in_use_peak, m->peak);
    else assert_true(s.blocks_in_use_peak <= m->peak && s.blocks_in_use_peak >= s.blocks_in_use);
    assert_true(s.blocks_capacity >= m->n);
    assert_int_equal(s.double_frees_total, 0);
    assert_int_equal(s.foreign_frees_total, 0);
}

static void property_run(variant v, bool device, uint64_t seed)
{
    uint64_t r = seed * 0x9E3779B97F4A7C15ull + 1;
    static const size_t sizes[] = {1, 8, 24, 64, 100, 1000, 5000};
    size_t bs = sizes[test_rng_next(&r) % ARRAY_LEN(sizes)];
    model m = {.v = v};
    if (device) m.sim = make_sim(512 * MiB);
    llmem_fixed_options o = opts_for(v, bs);
    o.resource = m.sim;
    o.name = "prop";
    o.chunk_bytes = (size_t)4096 << (test_rng_next(&r) % 3); /* small chunks: many of them */
    o.max_chunk_bytes = o.chunk_bytes * 4;
    size_t max_blocks = seed % 2 ? 100 + test_rng_next(&r) % 200 : 0;
    o.max_blocks = max_blocks;
    if (is_ts(v)) o.cache_blocks = test_rng_next(&r) % 3 == 0 ? 0 : 2 + test_rng_next(&r) % 20;
    m.p = make(&o);
    m.stride = llmem_fixed_block_size(m.p);
    m.align = device ? 256 : bs >= 64 ? 64 : 16;
    assert_int_equal(m.stride, round_up(bs, m.align));
    enum { CAP = 500, OPS = 3000 };
    m.live = malloc(CAP * sizeof *m.live);
    m.buf = malloc(m.stride);
    assert_non_null(m.live);
    assert_non_null(m.buf);
    uint64_t next_id = seed << 32;
    for (size_t op = 0; op < OPS; op++) {
        unsigned bias = (op / 400) % 2 ? 30 : 70; /* phases that fill and drain */
        bool do_alloc = m.n == 0 || (m.n < CAP && test_rng_next(&r) % 100 < bias);
        if (do_alloc) {
            llmem_status st = LLMEM_EINVAL;
            void *b = llmem_fixed_alloc(m.p, &st);
            if (max_blocks && m.n == max_blocks) {
                assert_null(b);
                assert_int_equal(st, LLMEM_ECAPACITY);
                m.failures++;
            } else {
                if (!b)
                    fail_msg("%s pool, seed %llu, op %zu: alloc failed: %s", variant_names[v],
                             (unsigned long long)seed, op, llmem_error_message());
                assert_int_equal(st, LLMEM_OK);
                assert_true(aligned(b, m.align));
                if (m.sim) assert_true(llmem_sim_resource_contains(m.sim, b, m.stride));
                live_block l = {b, next_id++};
                write_block(&m, b, l.id);
                m.live[m.n++] = l;
                m.allocs++;
                if (m.n > m.peak) m.peak = m.n;
            }
        } else {
            size_t i = (size_t)(test_rng_next(&r) % m.n);
            if (!block_intact(&m, &m.live[i]))
                fail_msg("%s pool, seed %llu, op %zu: block %p lost its pattern before its free", variant_names[v],
                         (unsigned long long)seed, op, m.live[i].b);
            assert_ok(llmem_fixed_free(m.p, m.live[i].b));
            m.live[i] = m.live[--m.n];
            m.frees++;
        }
        if (op % 300 == 299) model_check(&m, seed, op);
    }
    model_check(&m, seed, OPS);
    if (max_blocks) assert_true(stats_of(m.p).blocks_capacity <= max_blocks);
    while (m.n) {
        assert_true(block_intact(&m, &m.live[m.n - 1]));
        assert_ok(llmem_fixed_free(m.p, m.live[--m.n].b));
        m.frees++;
    }
    model_check(&m, seed, OPS + 1);
    llmem_fixed_destroy(m.p);
    free(m.live);
    free(m.buf);
    if (m.sim) llmem_resource_destroy(m.sim);
}

static void property_plain_host(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 6; seed++) property_run(V_PLAIN, false, seed);
}

static void property_checked_host(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 6; seed++) property_run(V_CHECKED, false, seed);
}

static void property_thread_safe_host(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 6; seed++) property_run(V_TS, false, seed);
    for (uint64_t seed = 7; seed <= 10; seed++) property_run(V_TS_CHECKED, false, seed);
}

static void property_device(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 6; seed++) property_run(V_PLAIN, true, seed);
    for (uint64_t seed = 7; seed <= 8; seed++) property_run(V_CHECKED, true, seed);
    for (uint64_t seed = 9; seed <= 10; seed++) property_run(V_TS, true, seed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(basics_strides_alignment_reuse),
        cmocka_unit_test(default_options),
        cmocka_unit_test(growth_doubles_chunks_up_to_the_cap),
        cmocka_unit_test(new_chunk_is_not_touched),
        cmocka_unit_test(max_blocks_is_exact),
        cmocka_unit_test(initial_blocks_map_at_create),
        cmocka_unit_test(growth_under_a_capped_resource),
        cmocka_unit_test(checked_mode_detects_and_touches_nothing),
        cmocka_unit_test(owns_block_starts_only),
        cmocka_unit_test(bad_input_is_a_status),
        cmocka_unit_test(stats_are_exact),
        cmocka_unit_test(device_pools_keep_metadata_out_of_band),
        cmocka_unit_test(device_block_touch_faults),
        cmocka_unit_test(asan_poisons_free_blocks),
        cmocka_unit_test(property_plain_host),
        cmocka_unit_test(property_checked_host),
        cmocka_unit_test(property_thread_safe_host),
        cmocka_unit_test(property_device),
    };
    return cmocka_run_group_tests(tests, test_quiet_logs, NULL);
}
