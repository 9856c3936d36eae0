/*
 * bench_pools.c - `llmem bench pools`: fixed pool and arena throughput
 * against glibc malloc/free, side by side in one process.
 *
 * Each workload runs for llmem and for glibc in alternating order over
 * several rounds (llmem first in even rounds, glibc first in odd ones) and
 * reports the median. An operation is one allocation together with its
 * free (or its share of the arena reset). Every block is written and read
 * back, so neither side's work can be optimised away, and both sides run
 * the same loop text through the LOOP macros below. The pools are created
 * and warmed outside the timed region, as a long-running server's would be;
 * glibc's heap is warm from the warm-up pass too.
 *
 * Workloads:
 *   fixed_lifo_64   batches of 256 blocks of 64 B, freed in reverse
 *   fixed_rand_64   8192 slots of 64 B toggled at random (half full on average)
 *   fixed_ts_64     fixed_lifo_64 through the thread-safe pool (magazine path)
 *   fixed_rand_4k   1024 slots of 4 KiB toggled at random (KV-block sized)
 *   arena_request   64 allocations of 16 B - 4 KiB per request, then reset
 *                   (glibc: malloc each, free all)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "commands.h"
#include "llmem/llmem.h"

#define LIFO_BATCH 256

#define LIFO_LOOP(ALLOC, FREE)                                                  \
    do {                                                                        \
        void *p_[LIFO_BATCH];                                                   \
        for (uint64_t done_ = 0; done_ < ops; done_ += LIFO_BATCH) {            \
            for (int i_ = 0; i_ < LIFO_BATCH; i_++) {                           \
                void *q_ = (ALLOC);                                             \
                if (!q_) abort();                                               \
                *(volatile unsigned char *)q_ = (unsigned char)i_;              \
                p_[i_] = q_;                                                    \
            }                                                                   \
            for (int i_ = LIFO_BATCH - 1; i_ >= 0; i_--) {                      \
                sum += *(volatile unsigned char *)p_[i_];                       \
                FREE(p_[i_]);                                                   \
            }                                                                   \
        }                                                                       \
    } while (0)

#define RAND_LOOP(SLOTS, ALLOC, FREE)                                           \
    do {                                                                        \
        void **s_ = calloc((SLOTS), sizeof *s_);                                \
        if (!s_) abort();                                                       \
        uint64_t rng_ = 0x9e3779b97f4a7c15ull, n_ = 0;                          \
        while (n_ < ops) {                                                      \
            size_t k_ = (size_t)(bench_rand(&rng_) % (SLOTS));                  \
            if (s_[k_]) {                                                       \
                sum += *(volatile unsigned char *)s_[k_];                       \
                FREE(s_[k_]);                                                   \
                s_[k_] = NULL;                                                  \
            } else {                                                            \
                void *q_ = (ALLOC);                                             \
                if (!q_) abort();                                               \
                *(volatile unsigned char *)q_ = (unsigned char)k_;              \
                s_[k_] = q_;                                                    \
                n_++;                                                           \
            }                                                                   \
        }                                                                       \
        for (size_t k_ = 0; k_ < (SLOTS); k_++)                                 \
            if (s_[k_]) FREE(s_[k_]);                                           \
        free(s_);                                                               \
    } while (0)

#define REQ_ALLOCS 64

/* Sizes 16 B - 4 KiB, multiples of 16, the same sequence for both sides. */
static size_t req_sizes[REQ_ALLOCS * 16];

#define REQUEST_LOOP(ALLOC, RESET)                                              \
    do {                                                                        \
        void *p_[REQ_ALLOCS];                                                   \
        size_t z_ = 0;                                                          \
        for (uint64_t done_ = 0; done_ < ops; done_ += REQ_ALLOCS) {            \
            for (int i_ = 0; i_ < REQ_ALLOCS; i_++) {                           \
                size_t size_ = req_sizes[z_++ % (REQ_ALLOCS * 16)];             \
                void *q_ = (ALLOC);                                             \
                if (!q_) abort();                                               \
                *(volatile unsigned char *)q_ = (unsigned char)i_;              \
                p_[i_] = q_;                                                    \
            }                                                                   \
            for (int i_ = 0; i_ < REQ_ALLOCS; i_++) sum += *(volatile unsigned char *)p_[i_]; \
            RESET;                                                              \
        }                                                                       \
    } while (0)

typedef struct ctx {
    llmem_fixed *fixed;
    llmem_arena *arena;
} ctx;

#define FIXED_ALLOC llmem_fixed_alloc(c->fixed, NULL)
#define FIXED_FREE(x) llmem_fixed_free(c->fixed, (x))
#define MALLOC_FREE(x) free(x)

static uint64_t w_lifo_llmem(ctx *c, uint64_t ops) { uint64_t sum = 0; LIFO_LOOP(FIXED_ALLOC, FIXED_FREE); return sum; }
static uint64_t w_lifo_glibc(ctx *c, uint64_t ops) { (void)c; uint64_t sum = 0; LIFO_LOOP(malloc(64), MALLOC_FREE); return sum; }
static uint64_t w_rand64_llmem(ctx *c, uint64_t ops) { uint64_t sum = 0; RAND_LOOP(8192, FIXED_ALLOC, FIXED_FREE); return sum; }
static uint64_t w_rand64_glibc(ctx *c, uint64_t ops) { (void)c; uint64_t sum = 0; RAND_LOOP(8192, malloc(64), MALLOC_FREE); return sum; }
static uint64_t w_rand4k_llmem(ctx *c, uint64_t ops) { uint64_t sum = 0; RAND_LOOP(1024, FIXED_ALLOC, FIXED_FREE); return sum; }
static uint64_t w_rand4k_glibc(ctx *c, uint64_t ops) { (void)c; uint64_t sum = 0; RAND_LOOP(1024, malloc(4096), MALLOC_FREE); return sum; }

static uint64_t w_req_llmem(ctx *c, uint64_t ops)
{
    uint64_t sum = 0;
    REQUEST_LOOP(llmem_arena_alloc(c->arena, size_, 0, NULL), llmem_arena_reset(c->arena));
    return sum;
}

static uint64_t w_req_glibc(ctx *c, uint64_t ops)
{
    (void)c;
    uint64_t sum = 0;
    REQUEST_LOOP(malloc(size_), for (int j_ = 0; j_ < REQ_ALLOCS; j_++) free(p_[j_]));
    return sum;
}

typedef struct workload {
    const char *name;
    uint64_t ops;
    size_t block;          /* fixed pool block size; 0 = arena */
    bool thread_safe;
    uint64_t (*llmem_fn)(ctx *, uint64_t);
    uint64_t (*glibc_fn)(ctx *, uint64_t);
} workload;

static const workload workloads[] = {
    {"fixed_lifo_64", 4000000, 64, false, w_lifo_llmem, w_lifo_glibc},
    {"fixed_rand_64", 2000000, 64, false, w_rand64_llmem, w_rand64_glibc},
    {"fixed_ts_64", 4000000, 64, true, w_lifo_llmem, w_lifo_glibc},
    {"fixed_rand_4k", 1000000, 4096, false, w_rand4k_llmem, w_rand4k_glibc},
    {"arena_request", 4000000, 0, false, w_req_llmem, w_req_glibc},
};

static int make_ctx(const workload *w, ctx *c)
{
    memset(c, 0, sizeof *c);
    if (w->block) {
        llmem_fixed_options o = llmem_fixed_options_default();
        o.name = w->name;
        o.block_size = w->block;
        o.thread_safe = w->thread_safe;
        return llmem_fixed_create(&o, &c->fixed) ? -1 : 0;
    }
    return llmem_arena_create(NULL, &c->arena) ? -1 : 0;
}

static void free_ctx(ctx *c)
{
    llmem_fixed_destroy(c->fixed);
    llmem_arena_destroy(c->arena);
}

/* Time one run in seconds; the pool is created and warmed outside. */
static double time_run(const workload *w, bool llmem, uint64_t ops)
{
    ctx c = {0};
    if (llmem && make_ctx(w, &c)) {
        fprintf(stderr, "llmem bench: cannot create the pool: %s\n", llmem_error_message());
        exit(1);
    }
    uint64_t (*fn)(ctx *, uint64_t) = llmem ? w->llmem_fn : w->glibc_fn;
    bench_sink += fn(&c, ops / 50 + LIFO_BATCH); /* warm-up */
    uint64_t t0 = llmem_time_now_ns();
    bench_sink += fn(&c, ops);
    uint64_t t1 = llmem_time_now_ns();
    if (llmem) free_ctx(&c);
    return (double)(t1 - t0) / 1e9;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: llmem bench pools [--json] [--quick] [--rounds N]\n\n"
               "Fixed pool and arena throughput against glibc malloc/free, alternating runs in one process.\n"
               "  --json      one JSON array, an object per (workload, allocator)\n"
               "  --quick     a fifth of the operations and 3 rounds (for CI smoke runs)\n"
               "  --rounds N  rounds per workload and allocator (default 7)\n");
}

static int bench_pools(int argc, char **argv)
{
    bool json = false, quick = false;
    int rounds = 7;
    for (int i = 1; i < argc; i++) {
        if (bench_common_arg(argc, argv, &i, &json, &quick, &rounds)) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (quick && rounds == 7) rounds = 3;
    if (!bench_rounds_ok("pools", rounds, 1000)) return 2;
    uint64_t rng = 42;
    for (size_t i = 0; i < sizeof req_sizes / sizeof req_sizes[0]; i++)
        req_sizes[i] = 16 * (1 + bench_rand(&rng) % 256);

    size_t nw = sizeof workloads / sizeof workloads[0];
    bench_result res[2 * (sizeof workloads / sizeof workloads[0])];
    double *times = calloc((size_t)rounds, sizeof *times * 2);
    if (!times) return 1;
    for (size_t w = 0; w < nw; w++) {
        uint64_t ops = quick ? workloads[w].ops / 5 : workloads[w].ops;
        double *tl = times, *tg = times + rounds;
        for (int r = 0; r < rounds; r++) {
            bench_progress("bench pools: %s round %d/%d", workloads[w].name, r + 1, rounds);
            bool llmem_first = r % 2 == 0;
            double a = time_run(&workloads[w], llmem_first, ops);
            double b = time_run(&workloads[w], !llmem_first, ops);
            tl[r] = (double)ops / (llmem_first ? a : b);
            tg[r] = (double)ops / (llmem_first ? b : a);
        }
        res[2 * w] = bench_summary(workloads[w].name, "llmem", ops, tl, rounds);
        res[2 * w + 1] = bench_summary(workloads[w].name, "glibc", ops, tg, rounds);
    }
    bench_progress_done();
    free(times);
    bench_report(res, 2 * nw, json, "pools", rounds, "llmem", "glibc");
    return 0;
}

int llmem_cmd_bench(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        FILE *f = argc < 2 ? stderr : stdout;
        fprintf(f, "usage: llmem bench <benchmark> [options]\n\nbenchmarks:\n"
                   "  alloc   the dynamic pool against glibc, jemalloc, mimalloc, tcmalloc\n"
                   "  pools   fixed pool and arena against glibc malloc/free\n"
                   "  waste   internal waste on the tensor mix: default, profile-refined, multi-size\n"
                   "  checked what checked mode costs: release pools against checked pools\n"
                   "  kernels the engine's matmul (each path and weight type) against run.c's loop; thread team latency\n"
                   "  device  a CUDA GPU: pool, cuda-vmm, KV append and swap against the CUDA runtime\n"
                   "  serve   llmem serve under open-loop streaming load: paged vs static KV, prefix cache on vs off\n");
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "pools")) return bench_pools(argc - 1, argv + 1);
    if (!strcmp(argv[1], "alloc")) return llmem_bench_alloc(argc - 1, argv + 1);
    if (!strcmp(argv[1], "waste")) return llmem_bench_waste(argc - 1, argv + 1);
    if (!strcmp(argv[1], "checked")) return llmem_bench_checked(argc - 1, argv + 1);
    if (!strcmp(argv[1], "kernels")) return llmem_bench_kernels(argc - 1, argv + 1);
    if (!strcmp(argv[1], "device")) return llmem_bench_device(argc - 1, argv + 1);
    if (!strcmp(argv[1], "serve")) return llmem_bench_serve(argc - 1, argv + 1);
    fprintf(stderr, "llmem bench: unknown benchmark '%s'\n", argv[1]);
    return 2;
}
