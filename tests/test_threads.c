/*
 * test_threads.c - the engine's thread team (src/engine/threads.c).
 *
 * Every index runs exactly once per run, with the right count, and what the
 * workers wrote is visible to the caller when run returns (plain stores:
 * TSan sees a race if the team's release/acquire edges are missing); teams
 * of 1, 2, 3 and 8 threads on whatever cores there are (8 on a 2-core
 * machine must sleep, not spin, to stay fast); runs after the workers fell
 * asleep and runs where the caller has to sleep for a slow worker; split
 * covers [0, total) in balanced, grain-aligned, contiguous parts; the
 * barrier inside a run; create and
 * destroy in a loop (LeakSanitizer and TSan's thread-leak check watch).
 * Runs under TSan in `make check`. Run latency is a benchmark, not a test:
 * `llmem bench kernels` (bench/bench_kernels.c).
 */
#include <stdatomic.h>

#include "test_util.h"

#include "../src/engine/threads.h"

#define MAXT 16

/* What one run's threads write: plain data, read by the caller after run. */
typedef struct count_job {
    unsigned expect_count;
    uint64_t run;             /* the run's number, read by every thread */
    uint64_t calls[MAXT];     /* per index: calls so far */
    uint64_t last_run[MAXT];  /* per index: the run it saw last */
    atomic_uint bad;          /* same, from any thread */
} count_job;

static void count_fn(void *ctx, unsigned index, unsigned count)
{
    count_job *j = ctx;
    if (count != j->expect_count || index >= count || index >= MAXT) {
        atomic_fetch_add(&j->bad, 1);
        return;
    }
    j->calls[index]++;
    j->last_run[index] = j->run;
}

static void run_counted(unsigned n, unsigned runs)
{
    llmem__threads *t;
    assert_ok(llmem__threads_create(n, &t));
    assert_int_equal(llmem__threads_count(t), n);
    count_job *j = calloc(1, sizeof *j);
    assert_non_null(j);
    j->expect_count = n;
    for (unsigned r = 1; r <= runs; r++) {
        j->run = r;
        llmem__threads_run(t, count_fn, j);
        /* Visible right after run returns, for every index. */
        for (unsigned i = 0; i < n; i++) {
            if (j->calls[i] != r || j->last_run[i] != r)
                fail_msg("team of %u, run %u: index %u called %llu times, last in run %llu", n, r, i,
                         (unsigned long long)j->calls[i], (unsigned long long)j->last_run[i]);
        }
    }
    for (unsigned i = n; i < MAXT; i++) assert_int_equal(j->calls[i], 0);
    assert_int_equal(atomic_load(&j->bad), 0);
    free(j);
    llmem__threads_destroy(t);
}

static void test_every_index_once(void **state)
{
    (void)state;
    static const unsigned teams[] = {1, 2, 3, 8};
    for (size_t i = 0; i < sizeof teams / sizeof teams[0]; i++) {
        uint64_t t0 = test_now_ms();
        run_counted(teams[i], 10000);
        printf("  team of %u: 10000 counted runs in %llu ms\n", teams[i], (unsigned long long)(test_now_ms() - t0));
    }
}

/* Oversubscribed: 8 threads on however many cores (2 on the CI machine).
 * A team that spun forever would take time slices (milliseconds) per run;
 * one that sleeps takes microseconds. The bound is loose, and skipped under
 * the sanitizers, whose slowdown is not the team's. */
static void test_oversubscribed_not_slow(void **state)
{
    (void)state;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned n = cpus > 0 && cpus * 4 > 8 ? (unsigned)cpus * 4 : 8;
    uint64_t t0 = test_now_ms();
    run_counted(n, 5000);
    uint64_t ms = test_now_ms() - t0;
    printf("  team of %u on %ld cpus: 5000 runs in %llu ms\n", n, cpus, (unsigned long long)ms);
#if !defined(TEST_ASAN) && !defined(TEST_TSAN)
    if (ms > 20000) fail_msg("oversubscribed team too slow: %llu ms for 5000 runs", (unsigned long long)ms);
#endif
}

/* Real work split over the team: partial sums of an array, each thread
 * writing only its own slot, the caller reading them all. */
typedef struct sum_job {
    const uint32_t *v;
    size_t len;
    uint64_t part[MAXT];
} sum_job;

static void sum_fn(void *ctx, unsigned index, unsigned count)
{
    sum_job *j = ctx;
    size_t lo, hi;
    llmem__threads_split(j->len, 64, index, count, &lo, &hi);
    uint64_t s = 0;
    for (size_t i = lo; i < hi; i++) s += j->v[i];
    j->part[index] = s;
}

static void test_work_visible(void **state)
{
    (void)state;
    size_t len = 100003;
    uint32_t *v = malloc(len * sizeof *v);
    assert_non_null(v);
    uint64_t want = 0;
    for (unsigned n = 1; n <= 5; n++) {
        llmem__threads *t;
        assert_ok(llmem__threads_create(n, &t));
        sum_job j = {v, len, {0}};
        for (unsigned round = 0; round < 50; round++) {
            want = 0;
            for (size_t i = 0; i < len; i++) {
                v[i] = (uint32_t)(i * 2654435761u + round);
                want += v[i];
            }
            memset(j.part, 0xff, sizeof j.part);
            llmem__threads_run(t, sum_fn, &j);
            uint64_t got = 0;
            for (unsigned i = 0; i < n; i++) got += j.part[i];
            assert_int_equal(got, want);
        }
        llmem__threads_destroy(t);
    }
    free(v);
}

/* A barrier inside a run: each thread writes its own slot (plain stores),
 * waits, then reads every slot, so each sees all the others' writes (TSan
 * sees a race if the barrier's release/acquire edges are missing; a wrong
 * count leaves a slot unwritten). Teams of 1..5 and 8 (8 on 2 cores:
 * the waiters must yield to the threads still writing). */
typedef struct barrier_job {
    const llmem__threads *t;
    uint32_t arrived;
    uint64_t round;
    uint64_t slot[MAXT];
    uint64_t seen[MAXT];  /* per index: the sum of all slots it read after the barrier */
} barrier_job;

static void barrier_fn(void *ctx, unsigned index, unsigned count)
{
    barrier_job *j = ctx;
    j->slot[index] = j->round * 1000 + index;
    llmem__threads_barrier(j->t, &j->arrived, count);
    uint64_t s = 0;
    for (unsigned i = 0; i < count; i++) s += j->slot[i];
    j->seen[index] = s;
}

static void test_barrier(void **state)
{
    (void)state;
    static const unsigned ns[] = {1, 2, 3, 4, 5, 8};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        unsigned n = ns[k];
        llmem__threads *t;
        assert_ok(llmem__threads_create(n, &t));
        barrier_job j;
        memset(&j, 0, sizeof j);
        j.t = t;
        for (unsigned round = 1; round <= 300; round++) {
            j.arrived = 0; /* one use per run */
            j.round = round;
            memset(j.slot, 0, sizeof j.slot);
            llmem__threads_run(t, barrier_fn, &j);
            uint64_t want = (uint64_t)round * 1000 * n + (uint64_t)n * (n - 1) / 2;
            for (unsigned i = 0; i < n; i++)
                if (j.seen[i] != want) fail_msg("barrier, %u threads, round %u: index %u saw %llu, want %llu", n, round, i,
                                                (unsigned long long)j.seen[i], (unsigned long long)want);
        }
        llmem__threads_destroy(t);
    }
    /* A lone caller (count 1) does not wait. */
    uint32_t arrived = 0;
    llmem__threads_barrier(NULL, &arrived, 1);
}

/* Runs after the workers have gone to sleep (futex wake path), and runs in
 * which one worker is slow enough for the caller to sleep too. */
typedef struct slow_job {
    unsigned slow_index;
    unsigned sleep_ms;
    uint64_t done[MAXT];
} slow_job;

static void slow_fn(void *ctx, unsigned index, unsigned count)
{
    (void)count;
    slow_job *j = ctx;
    if (index == j->slow_index) {
        struct timespec ts = {0, (long)j->sleep_ms * 1000000L};
        nanosleep(&ts, NULL);
    }
    j->done[index]++;
}

static void test_sleep_paths(void **state)
{
    (void)state;
    llmem__threads *t;
    assert_ok(llmem__threads_create(3, &t));
    slow_job j = {0};
    for (unsigned r = 1; r <= 6; r++) {
        /* Idle long enough that every worker is asleep on the futex. */
        struct timespec ts = {0, 30 * 1000000L};
        nanosleep(&ts, NULL);
        j.slow_index = r % 3; /* the caller itself (0), or a worker */
        j.sleep_ms = 20;
        llmem__threads_run(t, slow_fn, &j);
        for (unsigned i = 0; i < 3; i++) assert_int_equal(j.done[i], r);
    }
    llmem__threads_destroy(t);
}

static void test_create_destroy(void **state)
{
    (void)state;
    size_t rss0 = 0;
    for (int i = 0; i < 100; i++) {
        llmem__threads *t;
        assert_ok(llmem__threads_create((unsigned)(i % 5) + 1, &t));
        if (i % 2) {
            count_job j = {0};
            j.expect_count = llmem__threads_count(t);
            j.run = 1;
            llmem__threads_run(t, count_fn, &j);
            for (unsigned k = 0; k < j.expect_count; k++) assert_int_equal(j.calls[k], 1);
        }
        llmem__threads_destroy(t);
        if (i == 9) rss0 = test_rss_bytes();
    }
    size_t rss1 = test_rss_bytes();
    /* Thread stacks and ids that were not given back would add megabytes. */
    if (rss0 && rss1 > rss0 + (8u << 20)) fail_msg("RSS grew from %zu to %zu bytes", rss0, rss1);
    llmem__threads_destroy(NULL);
}

static void test_defaults_and_errors(void **state)
{
    (void)state;
    llmem__threads *t;
    assert_ok(llmem__threads_create(0, &t));
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    assert_int_equal(llmem__threads_count(t), cpus > 0 ? (unsigned)cpus : 1);
    count_job j = {0};
    j.expect_count = llmem__threads_count(t);
    j.run = 7;
    llmem__threads_run(t, count_fn, &j);
    for (unsigned i = 0; i < j.expect_count && i < MAXT; i++) assert_int_equal(j.last_run[i], 7);
    llmem__threads_destroy(t);
    assert_status(llmem__threads_create(1, NULL), LLMEM_EINVAL);
    /* A NULL team runs inline, as one thread. */
    count_job k = {0};
    k.expect_count = 1;
    k.run = 1;
    llmem__threads_run(NULL, count_fn, &k);
    assert_int_equal(k.calls[0], 1);
    assert_int_equal(llmem__threads_count(NULL), 1);
}

/* Checks one (total, grain, count) against the contract. */
static void check_split(size_t total, size_t grain, unsigned count)
{
    size_t prev_hi = 0, min_sz = SIZE_MAX, max_sz = 0;
    size_t g = grain ? grain : 1;
    for (unsigned i = 0; i < count; i++) {
        size_t lo, hi;
        llmem__threads_split(total, grain, i, count, &lo, &hi);
        if (lo != prev_hi || hi < lo || hi > total)
            fail_msg("split(%zu, %zu, %u/%u) = [%zu, %zu) after %zu", total, grain, i, count, lo, hi, prev_hi);
        if (hi != total && hi % g != 0) fail_msg("split(%zu, %zu, %u/%u): hi %zu not a grain multiple", total, grain, i, count, hi);
        size_t sz = hi - lo;
        if (sz < min_sz) min_sz = sz;
        if (sz > max_sz) max_sz = sz;
        prev_hi = hi;
    }
    if (prev_hi != total) fail_msg("split(%zu, %zu, /%u) ends at %zu", total, grain, count, prev_hi);
    /* Balanced: in whole grains, sizes differ by at most one grain. */
    if (max_sz - min_sz > g) fail_msg("split(%zu, %zu, /%u): sizes %zu..%zu", total, grain, count, min_sz, max_sz);
    /* Out-of-range indices get nothing. */
    size_t lo, hi;
    llmem__threads_split(total, grain, count, count, &lo, &hi);
    assert_true(lo == hi);
}

static void test_split(void **state)
{
    (void)state;
    static const size_t grains[] = {0, 1, 2, 3, 4, 7, 8, 16, 32, 64, 100, 1000};
    static const size_t big[] = {255, 256, 257, 768, 1000, 1023, 1024, 4096, 11008, 32000, 100003};
    for (size_t gi = 0; gi < sizeof grains / sizeof grains[0]; gi++)
        for (unsigned count = 1; count <= 17; count++) {
            for (size_t total = 0; total <= 200; total++) check_split(total, grains[gi], count);
            for (size_t b = 0; b < sizeof big / sizeof big[0]; b++) check_split(big[b], grains[gi], count);
        }
    /* Totals near SIZE_MAX must not overflow the grain arithmetic. */
    check_split(SIZE_MAX - 5, 16, 3);
    check_split(SIZE_MAX, 1000, 7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_index_once),
        cmocka_unit_test(test_oversubscribed_not_slow),
        cmocka_unit_test(test_work_visible),
        cmocka_unit_test(test_barrier),
        cmocka_unit_test(test_sleep_paths),
        cmocka_unit_test(test_create_destroy),
        cmocka_unit_test(test_defaults_and_errors),
        cmocka_unit_test(test_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
