/*
 * bench_checked.c - `llmem bench checked`: what checked mode costs.
 *
 * The same workloads run on a release pool and on a checked pool (guard
 * canaries, a state bit per block, the lock on every call, freed-block fill
 * and verify; no thread cache) in alternating order, round after round, in
 * one process; the table shows medians and the ratio checked / release
 * (below 1: checked is slower). An operation is one allocation with its
 * free.
 *
 *   pool_small     64 K slots of 16 B - 1 KiB toggled at random
 *   pool_tensor    the llama-2-7b tensor mix (tensor_mix.h): activations of
 *                  up to tens of MB and the request objects around them
 *   pool_objects   the server's small-object mix (object_mix_run)
 *   fixed_64       fixed pool, 64 B blocks, 8 K slots toggled at random
 *   fixed_ts_64    the same on a thread-safe fixed pool
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "commands.h"
#include "llmem/llmem.h"
#include "tensor_mix.h"

typedef struct subject {
    llmem_pool *pool;
    llmem_fixed *fixed;
} subject;

static void *must(void *p)
{
    if (!p) {
        fprintf(stderr, "llmem bench checked: allocation failed: %s\n", llmem_error_message());
        exit(1);
    }
    return p;
}

static uint64_t toggle_slots(subject *s, uint64_t ops, size_t slots, size_t min, size_t max)
{
    void **slot = calloc(slots, sizeof *slot);
    if (!slot) exit(1);
    uint64_t rng = 0x9e3779b97f4a7c15ull, sum = 0;
    for (uint64_t n = 0; n < ops;) {
        size_t k = (size_t)(bench_rand(&rng) % slots);
        if (slot[k]) {
            sum += *(volatile unsigned char *)slot[k];
            if (s->pool) llmem_pool_free(s->pool, slot[k]);
            else llmem_fixed_free(s->fixed, slot[k]);
            slot[k] = NULL;
        } else {
            size_t size = min + (size_t)(bench_rand(&rng) % (max - min + 1));
            void *p = must(s->pool ? llmem_pool_alloc(s->pool, size, NULL) : llmem_fixed_alloc(s->fixed, NULL));
            *(volatile unsigned char *)p = (unsigned char)k;
            slot[k] = p;
            n++;
        }
    }
    for (size_t k = 0; k < slots; k++) {
        if (!slot[k]) continue;
        if (s->pool) llmem_pool_free(s->pool, slot[k]);
        else llmem_fixed_free(s->fixed, slot[k]);
    }
    free(slot);
    return sum;
}

static void *mix_alloc(void *ctx, size_t size) { return must(llmem_pool_alloc(ctx, size, NULL)); }
static void mix_free(void *ctx, void *p, size_t size)
{
    (void)size;
    llmem_pool_free(ctx, p);
}

/* Workloads: run `ops` operations (or the nearest whole number of steps)
 * and return the operations made. */
static uint64_t w_pool_small(subject *s, uint64_t ops)
{
    bench_sink += toggle_slots(s, ops, 65536, 16, 1024);
    return ops;
}

static uint64_t w_pool_tensor(subject *s, uint64_t ops)
{
    tensor_mix_ops o = {mix_alloc, mix_free, s->pool};
    return tensor_mix_run((int)(ops / 1000 ? ops / 1000 : 1), 42, NULL, &o);
}

static uint64_t w_pool_objects(subject *s, uint64_t ops)
{
    tensor_mix_ops o = {mix_alloc, mix_free, s->pool};
    return object_mix_run((int)(ops / 10 ? ops / 10 : 1), 42, &o);
}

static uint64_t w_fixed(subject *s, uint64_t ops)
{
    bench_sink += toggle_slots(s, ops, 8192, 64, 64);
    return ops;
}

typedef struct workload {
    const char *name;
    uint64_t ops;
    int kind; /* 0 pool, 1 fixed, 2 thread-safe fixed */
    uint64_t (*fn)(subject *, uint64_t);
} workload;

static const workload workloads[] = {
    {"pool_small", 2000000, 0, w_pool_small},
    {"pool_tensor", 40000, 0, w_pool_tensor},
    {"pool_objects", 400000, 0, w_pool_objects},
    {"fixed_64", 4000000, 1, w_fixed},
    {"fixed_ts_64", 4000000, 2, w_fixed},
};

static void make_subject(const workload *w, bool checked, subject *s)
{
    memset(s, 0, sizeof *s);
    llmem_status st;
    if (w->kind == 0) {
        llmem_pool_options o = llmem_pool_options_default();
        o.name = checked ? "checked" : "release";
        o.checked = checked;
        st = llmem_pool_create(&o, &s->pool);
    } else {
        llmem_fixed_options o = llmem_fixed_options_default();
        o.name = checked ? "checked" : "release";
        o.block_size = 64;
        o.checked = checked;
        o.thread_safe = w->kind == 2;
        st = llmem_fixed_create(&o, &s->fixed);
    }
    if (st) {
        fprintf(stderr, "llmem bench checked: cannot create the pool: %s\n", llmem_error_message());
        exit(1);
    }
}

/* Operations per second of one run; the pool is created and warmed outside
 * the timed part. Corruptions found would mean a bug in the benchmark or
 * the pool: fail loudly. */
static double time_run(const workload *w, bool checked, uint64_t ops, uint64_t *done)
{
    subject s;
    make_subject(w, checked, &s);
    w->fn(&s, ops / 20 + 1);
    uint64_t t0 = llmem_time_now_ns();
    *done = w->fn(&s, ops);
    uint64_t t1 = llmem_time_now_ns();
    uint64_t corrupt = 0;
    if (s.pool) {
        llmem_pool_stats ps;
        memset(&ps, 0, sizeof ps);
        llmem_pool_get_stats(s.pool, &ps);
        corrupt = ps.corruptions_total + ps.invalid_frees_total;
        llmem_pool_destroy(s.pool);
    } else {
        llmem_fixed_stats fs;
        memset(&fs, 0, sizeof fs);
        llmem_fixed_get_stats(s.fixed, &fs);
        corrupt = fs.corruptions_total + fs.double_frees_total + fs.foreign_frees_total;
        llmem_fixed_destroy(s.fixed);
    }
    if (corrupt) {
        fprintf(stderr, "llmem bench checked: %s reported %llu misuses in a correct workload\n", w->name,
                (unsigned long long)corrupt);
        exit(1);
    }
    return (double)*done / ((double)(t1 - t0) / 1e9);
}

int llmem_bench_checked(int argc, char **argv)
{
    bool json = false, quick = false;
    int rounds = 7;
    for (int i = 1; i < argc; i++) {
        if (!bench_common_arg(argc, argv, &i, &json, &quick, &rounds)) {
            FILE *f = strcmp(argv[i], "--help") ? stderr : stdout;
            fprintf(f, "usage: llmem bench checked [--json] [--quick] [--rounds N]\n"
                       "  release pools against checked pools, side by side, in one process\n"
                       "  --json      one JSON array, an object per (workload, mode)\n"
                       "  --quick     a fifth of the operations, for smoke tests\n"
                       "  --rounds N  rounds per workload and mode (default 7)\n");
            return f == stdout ? 0 : 2;
        }
    }
    if (!bench_rounds_ok("checked", rounds, 1000)) return 2;
    llmem_log_set(NULL, NULL, LLMEM_LOG_ERROR);
    size_t nw = sizeof workloads / sizeof workloads[0];
    bench_result res[2 * (sizeof workloads / sizeof workloads[0])];
    double *tr = calloc((size_t)rounds, sizeof *tr), *tc = calloc((size_t)rounds, sizeof *tc);
    if (!tr || !tc) return 1;
    for (size_t w = 0; w < nw; w++) {
        uint64_t ops = quick ? workloads[w].ops / 5 : workloads[w].ops, done = 0;
        for (int r = 0; r < rounds; r++) {
            bench_progress("bench checked: %s round %d/%d", workloads[w].name, r + 1, rounds);
            bool checked_first = r % 2;
            double a = time_run(&workloads[w], checked_first, ops, &done);
            double b = time_run(&workloads[w], !checked_first, ops, &done);
            tc[r] = checked_first ? a : b;
            tr[r] = checked_first ? b : a;
        }
        res[2 * w] = bench_summary(workloads[w].name, "checked", done, tc, rounds);
        res[2 * w + 1] = bench_summary(workloads[w].name, "release", done, tr, rounds);
    }
    bench_progress_done();
    free(tr);
    free(tc);
    bench_report(res, 2 * nw, json, "checked", rounds, "checked", "release");
    return 0;
}
