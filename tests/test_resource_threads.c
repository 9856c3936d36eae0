/*
 * test_resource_threads.c - resources and adaptors under concurrent use
 * (label "threads": the TSan build runs it).
 *
 * 1. Eight threads hammer one stack, limit(tracking(fault(base))), base an
 *    os or a sim-device resource, with a small probability of an injected
 *    failure on every kind of call: each thread maps and unmaps random
 *    sizes, commits and decommits granules of uncommitted reservations,
 *    copies patterns in and out and checks them, and reads every layer's
 *    figures while the others work. Each thread's choices come from its
 *    own seed. Each thread counts the calls it made that reached the fault
 *    adaptor and the failures it saw; at the end those sums must equal the
 *    adaptors' counters, and every layer must be back at zero.
 * 2. Four threads share one thread-safe fixed pool over tracking(os),
 *    allocating, freeing their own blocks and blocks other threads handed
 *    them; after destroy, nothing is left mapped.
 */
#include <pthread.h>

#include "test_util.h"
#include "support/cases.h"
#include "support/rng.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static size_t rng_below(uint64_t *s, size_t n) { return (size_t)(test_rng_next(s) % n); }

/* ===== 1. one stack, eight threads ======================================= */

#define THREADS 8
#define SLOTS 4          /* live mappings per thread at most */
#define MAX_GRANULES 16  /* granules per mapping at most */

#ifdef TEST_TSAN
#define OPS 2500
#else
#define OPS 4000
#endif

typedef struct mapping {
    unsigned char *p;        /* NULL: slot free */
    size_t granules;
    bool committed[MAX_GRANULES];
    unsigned seed[MAX_GRANULES]; /* pattern of each committed granule (0: none written) */
} mapping;

typedef struct shared {
    llmem_resource *base, *fault, *track, *limit; /* limit is the top */
    size_t gran, cap;
} shared;

typedef struct worker {
    const shared *s;
    int id;
    uint64_t rng;
    mapping m[SLOTS];
    unsigned next_seed;
    /* what this thread saw */
    uint64_t reached;        /* calls that went past the limit to the fault adaptor */
    uint64_t injected;       /* failures the fault adaptor injected */
    uint64_t limited;        /* maps and commits the limit refused */
    uint64_t failures;       /* every failed call through the top of the stack */
    uint64_t maps, unmaps;   /* successful */
    uint64_t checks;         /* patterns verified */
    uint64_t seen[4][3];     /* last totals read per layer (map, unmap, failures) */
    char error[256];         /* first problem found, if any */
    unsigned char buf[MAX_GRANULES * 4096], back[MAX_GRANULES * 4096];
} worker;

#define CHECK(w, cond, ...)                                                   \
    do {                                                                      \
        if (!(cond) && !(w)->error[0]) snprintf((w)->error, sizeof (w)->error, __VA_ARGS__); \
    } while (0)

static unsigned char pat(unsigned seed, size_t i) { return (unsigned char)(seed * 167u + i * 11u + (i >> 10)); }

/* Classify a failed call through the top: the fault adaptor's (reached it),
 * the limit's (did not), anything else is a bug. */
static void failed(worker *w, llmem_status st, const char *what, bool may_be_limited)
{
    w->failures++;
    const char *msg = llmem_error_message();
    if (st == LLMEM_ENOMEM && strstr(msg, "injected")) {
        w->injected++;
        w->reached++;
    } else if (may_be_limited && st == LLMEM_ENOMEM && strstr(msg, "limit '")) {
        w->limited++;
    } else {
        CHECK(w, false, "thread %d: %s failed with %s: %s", w->id, what, llmem_status_name(st), msg);
    }
}

/* A call that went through. */
static void passed(worker *w) { w->reached++; }

/* Write a fresh pattern into granule g of m (committed), through copy(). */
static void write_granule(worker *w, mapping *m, size_t g)
{
    const shared *s = w->s;
    unsigned seed = ++w->next_seed + ((unsigned)w->id << 24);
    for (size_t i = 0; i < s->gran; i++) w->buf[i] = pat(seed, i);
    llmem_status st = llmem_resource_copy(s->limit, m->p + g * s->gran, w->buf, s->gran);
    if (st) {
        failed(w, st, "copy in", false); /* the granule keeps its old contents */
        return;
    }
    passed(w);
    m->seed[g] = seed;
}

/* Copy device (or host) bytes out, again after injected failures. */
static bool copy_out(worker *w, void *dst, const void *src, size_t n)
{
    for (;;) {
        llmem_status st = llmem_resource_copy(w->s->limit, dst, src, n);
        if (st == LLMEM_OK) {
            passed(w);
            return true;
        }
        failed(w, st, "copy out", false);
        if (w->error[0]) return false; /* not an injected failure */
    }
}

/* Check every committed granule of m still holds its pattern. */
static void check_mapping(worker *w, mapping *m)
{
    const shared *s = w->s;
    size_t n = m->granules * s->gran;
    bool all = true;
    for (size_t g = 0; g < m->granules; g++) all = all && m->committed[g];
    if (all && !copy_out(w, w->back, m->p, n)) return; /* one copy for the whole mapping */
    for (size_t g = 0; g < m->granules; g++) {
        if (!m->committed[g] || !m->seed[g]) continue;
        unsigned char *src = w->back + g * s->gran;
        if (!all) {
            if (!copy_out(w, w->back, m->p + g * s->gran, s->gran)) return;
            src = w->back;
        }
        for (size_t i = 0; i < s->gran; i++)
            if (src[i] != pat(m->seed[g], i)) {
                CHECK(w, false, "thread %d: granule %zu of %p lost its pattern at byte %zu", w->id, g, (void *)m->p, i);
                return;
            }
        if (llmem_resource_kind(s->limit) == LLMEM_MEM_HOST) /* host memory reads the same directly */
            CHECK(w, memcmp(m->p + g * s->gran, src, s->gran) == 0, "thread %d: direct read differs", w->id);
        w->checks++;
    }
}

static void op_map(worker *w, mapping *m, bool reserve)
{
    const shared *s = w->s;
    size_t g = reserve ? MAX_GRANULES : 1 + rng_below(&w->rng, MAX_GRANULES);
    void *p = NULL;
    llmem_status st = llmem_resource_map_tagged(s->limit, g * s->gran, 0, reserve ? LLMEM_MAP_UNCOMMITTED : 0,
                                                reserve ? "reserve" : "plain", &p);
    if (st) {
        failed(w, st, "map", !reserve);
        CHECK(w, p == NULL, "thread %d: failed map left a pointer", w->id);
        return;
    }
    passed(w);
    w->maps++;
    memset(m, 0, sizeof *m);
    m->p = p;
    m->granules = g;
    if (!reserve)
        for (size_t i = 0; i < g; i++) {
            m->committed[i] = true;
            if (rng_below(&w->rng, 2)) write_granule(w, m, i);
        }
}

static void op_unmap(worker *w, mapping *m)
{
    const shared *s = w->s;
    check_mapping(w, m);
    size_t committed = 0;
    for (size_t g = 0; g < m->granules; g++) committed += m->committed[g] ? s->gran : 0;
    llmem_status st;
    int tries = 0;
    while ((st = llmem_resource_unmap(s->limit, m->p, m->granules * s->gran, committed)) != LLMEM_OK) {
        failed(w, st, "unmap", false);
        if (++tries > 1000) {
            CHECK(w, false, "thread %d: unmap keeps failing", w->id);
            return;
        }
    }
    passed(w);
    w->unmaps++;
    m->p = NULL;
}

/* Commit a run of uncommitted granules, or decommit a run of committed ones. */
static void op_commit_change(worker *w, mapping *m, bool commit)
{
    const shared *s = w->s;
    size_t a = rng_below(&w->rng, m->granules), b = a;
    while (b < m->granules && b - a < 4 && m->committed[b] != commit) b++;
    if (b == a) return; /* granule a is already in the wanted state */
    llmem_status st = commit ? llmem_resource_commit(s->limit, m->p + a * s->gran, (b - a) * s->gran)
                             : llmem_resource_decommit(s->limit, m->p + a * s->gran, (b - a) * s->gran);
    if (st) {
        failed(w, st, commit ? "commit" : "decommit", commit);
        return;
    }
    passed(w);
    for (size_t g = a; g < b; g++) {
        m->committed[g] = commit;
        m->seed[g] = 0;
        if (commit) write_granule(w, m, g);
    }
}

static bool entry_sane(void *user, const llmem_tracking_entry *e)
{
    worker *w = user;
    CHECK(w, e->size % w->s->gran == 0 && e->committed <= e->size && e->seq >= 1, "thread %d: bad tracking entry",
          w->id);
    return true;
}

static void op_stats(worker *w)
{
    const shared *s = w->s;
    size_t used = 0, lim = 0;
    if (llmem_limit_resource_usage(s->limit, &used, &lim) == LLMEM_OK)
        CHECK(w, used <= lim && lim == s->cap, "thread %d: limit usage %zu over cap %zu", w->id, used, lim);
    llmem_tracking_stats ts = {0};
    if (llmem_tracking_resource_get_stats(s->track, &ts) == LLMEM_OK)
        CHECK(w, ts.live_mappings <= ts.peak_mappings && ts.live_bytes <= ts.peak_bytes && ts.refused_total == 0,
              "thread %d: tracking figures inconsistent", w->id);
    llmem_fault_stats fs = {0};
    if (llmem_fault_resource_get_stats(s->fault, &fs) == LLMEM_OK)
        CHECK(w, fs.injected_total <= fs.calls_total, "thread %d: fault figures inconsistent", w->id);
    /* Totals never go back, as seen by one thread. */
    llmem_resource *layers[] = {s->limit, s->track, s->fault, s->base};
    for (int i = 0; i < 4; i++) {
        llmem_resource_stats rs = {0};
        if (llmem_resource_get_stats(layers[i], &rs) != LLMEM_OK) continue;
        uint64_t now[3] = {rs.map_calls_total, rs.unmap_calls_total, rs.failures_total};
        for (int k = 0; k < 3; k++) {
            CHECK(w, now[k] >= w->seen[i][k], "thread %d: a total of layer %d went back", w->id, i);
            w->seen[i][k] = now[k];
        }
    }
    if (rng_below(&w->rng, 8) == 0) llmem_tracking_resource_foreach(s->track, entry_sane, w);
    if (rng_below(&w->rng, 32) == 0) {
        /* A report taken while others map and unmap agrees with itself:
         * one line per live mapping it counts, then the summary. */
        char *text = NULL;
        size_t len = 0, leaks = SIZE_MAX, lines = 0;
        FILE *f = open_memstream(&text, &len);
        if (!f) return;
        llmem_status st = llmem_tracking_resource_report(s->track, f, &leaks);
        fclose(f);
        for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
        CHECK(w, st == LLMEM_OK && lines == leaks + 1, "thread %d: report has %zu lines for %zu leaks", w->id, lines,
              leaks);
        free(text);
    }
}

static void *hammer(void *arg)
{
    worker *w = arg;
    for (int i = 0; i < OPS && !w->error[0]; i++) {
        mapping *m = &w->m[rng_below(&w->rng, SLOTS)];
        size_t op = rng_below(&w->rng, 10);
        if (!m->p) {
            if (op < 6) op_map(w, m, op >= 4);
            else op_stats(w);
            continue;
        }
        switch (op) {
        case 0: op_unmap(w, m); break;
        case 1: case 2: op_commit_change(w, m, true); break;
        case 3: op_commit_change(w, m, false); break;
        case 4: case 5: {
            size_t g = rng_below(&w->rng, m->granules);
            if (m->committed[g]) write_granule(w, m, g);
            break;
        }
        case 6: check_mapping(w, m); break;
        default: op_stats(w); break;
        }
    }
    for (int i = 0; i < SLOTS; i++)
        if (w->m[i].p) op_unmap(w, &w->m[i]);
    return NULL;
}

static void hammer_stack(bool device)
{
    shared s;
    memset(&s, 0, sizeof s);
    if (device) {
        llmem_sim_options o = llmem_sim_options_default();
        o.capacity = 64 * MiB;
        assert_ok(llmem_sim_resource_create(&o, &s.base));
    } else {
        assert_ok(llmem_os_resource_create(NULL, &s.base));
    }
    s.gran = llmem_resource_granularity(s.base);
    assert_true(s.gran <= 4096); /* the workers' buffers */
    llmem_fault_options fo = llmem_fault_options_default();
    fo.probability = 0.02;
    fo.seed = device ? 7 : 11;
    fo.ops = LLMEM_FAULT_OP_ALL;
    assert_ok(llmem_fault_resource_create(s.base, &fo, &s.fault));
    assert_ok(llmem_tracking_resource_create(s.fault, &s.track));
    llmem_limit_options lo = llmem_limit_options_default();
    /* Below what eight threads may hold (8 x 4 x 16 granules), so the cap bites. */
    s.cap = lo.limit_bytes = 48 * s.gran * THREADS / 2;
    assert_ok(llmem_limit_resource_create(s.track, &lo, &s.limit));
    assert_string_equal(llmem_resource_name(s.limit),
                        device ? "limit(tracking(fault(sim-device)))" : "limit(tracking(fault(os)))");

    worker *w = calloc(THREADS, sizeof *w);
    assert_non_null(w);
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i].s = &s;
        w[i].id = i;
        w[i].rng = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1) + (device ? 1 : 2);
        assert_int_equal(pthread_create(&th[i], NULL, hammer, &w[i]), 0);
    }
    uint64_t reached = 0, injected = 0, limited = 0, failures = 0, maps = 0, unmaps = 0, checks = 0;
    /* Every thread joined before any check can end the test: a failure
     * that left threads running would have them race the next test. */
    for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < THREADS; i++) {
        if (w[i].error[0]) fail_msg("%s", w[i].error);
        reached += w[i].reached;
        injected += w[i].injected;
        limited += w[i].limited;
        failures += w[i].failures;
        maps += w[i].maps;
        unmaps += w[i].unmaps;
        checks += w[i].checks;
    }
    free(w);
    print_message("%s: %llu maps, %llu calls reached the fault adaptor, %llu injected, %llu refused by the limit, "
                  "%llu patterns checked\n",
                  device ? "sim-device" : "os", (unsigned long long)maps, (unsigned long long)reached,
                  (unsigned long long)injected, (unsigned long long)limited, (unsigned long long)checks);
    /* The run did what it is for. */
    assert_true(maps > 100);
    assert_true(checks > 100);
    assert_true(injected > 10);
    assert_true(limited > 0);
    assert_int_equal(maps, unmaps);

    /* Everything went back, at every layer. */
    assert_true(test_tracking_expect_clean(s.track).peak_mappings > 1);
    size_t used = 1;
    assert_ok(llmem_limit_resource_usage(s.limit, &used, NULL));
    assert_int_equal(used, 0);
    llmem_resource *layers[] = {s.limit, s.track, s.fault, s.base};
    for (int i = 0; i < 4; i++) {
        llmem_resource_stats rs = test_resource_stats(layers[i]);
        assert_int_equal(rs.mapped_bytes, 0);
        assert_int_equal(rs.committed_bytes, 0);
        assert_int_equal(rs.mappings, 0);
        assert_int_equal(rs.map_calls_total - rs.unmap_calls_total, 0);
        assert_int_equal(rs.map_calls_total, maps);
    }
    /* The counters agree with what the threads saw. */
    llmem_fault_stats fs = {0};
    assert_ok(llmem_fault_resource_get_stats(s.fault, &fs));
    assert_int_equal(fs.calls_total, reached);
    assert_int_equal(fs.injected_total, injected);
    assert_int_equal(test_resource_stats(s.limit).failures_total, failures);
    assert_int_equal(failures, injected + limited);
    if (device) {
        test_sim_expect_clean(s.base);
    }
    llmem_resource_destroy(s.limit);
    llmem_resource_destroy(s.track);
    llmem_resource_destroy(s.fault);
    llmem_resource_destroy(s.base);
}

TEST_CASE(stack_hammered_over_sim, hammer_stack(true))
TEST_CASE(stack_hammered_over_os, hammer_stack(false))

/* ===== 2. one thread-safe fixed pool, four threads ====================== */

#define POOL_THREADS 4
#define BLOCK 200
#define LOCAL 64
#define XCHG 32
#ifdef TEST_TSAN
#define POOL_OPS 30000
#else
#define POOL_OPS 60000
#endif

typedef struct pblock {
    unsigned char *p;
    unsigned seed;
} pblock;

typedef struct pool_shared {
    llmem_fixed *pool;
    pthread_mutex_t lock; /* the exchange: blocks handed from one thread to another */
    pblock xchg[XCHG];
    size_t nx;
} pool_shared;

typedef struct pool_worker {
    pool_shared *s;
    int id;
    uint64_t rng;
    pblock mine[LOCAL];
    size_t n;
    unsigned next_seed;
    uint64_t allocs, frees, foreign_frees;
    char error[160];
} pool_worker;

static void pfill(pblock b)
{
    for (size_t i = 0; i < BLOCK; i++) b.p[i] = pat(b.seed, i);
}

static bool pholds(pblock b)
{
    for (size_t i = 0; i < BLOCK; i++)
        if (b.p[i] != pat(b.seed, i)) return false;
    return true;
}

static void pfree(pool_worker *w, pblock b)
{
    CHECK(w, pholds(b), "thread %d: block %p (seed %u) damaged", w->id, (void *)b.p, b.seed);
    llmem_status st = llmem_fixed_free(w->s->pool, b.p);
    CHECK(w, st == LLMEM_OK, "thread %d: free -> %s: %s", w->id, llmem_status_name(st), llmem_error_message());
    w->frees++;
}

static void *pool_hammer(void *arg)
{
    pool_worker *w = arg;
    pool_shared *s = w->s;
    for (int i = 0; i < POOL_OPS && !w->error[0]; i++) {
        size_t op = rng_below(&w->rng, 8);
        if (op < 4 && w->n < LOCAL) { /* allocate */
            llmem_status st;
            unsigned char *p = llmem_fixed_alloc(s->pool, &st);
            CHECK(w, p != NULL, "thread %d: alloc -> %s: %s", w->id, llmem_status_name(st), llmem_error_message());
            if (!p) break;
            w->allocs++;
            pblock b = {p, ++w->next_seed + ((unsigned)w->id << 24)};
            pfill(b);
            w->mine[w->n++] = b;
        } else if (op < 6 && w->n) { /* free one of mine */
            size_t j = rng_below(&w->rng, w->n);
            pfree(w, w->mine[j]);
            w->mine[j] = w->mine[--w->n];
        } else if (op == 6 && w->n) { /* hand one over */
            size_t j = rng_below(&w->rng, w->n);
            pthread_mutex_lock(&s->lock);
            bool room = s->nx < XCHG;
            if (room) s->xchg[s->nx++] = w->mine[j];
            pthread_mutex_unlock(&s->lock);
            if (room) w->mine[j] = w->mine[--w->n];
        } else { /* free one another thread handed over */
            pblock b = {NULL, 0};
            pthread_mutex_lock(&s->lock);
            if (s->nx) b = s->xchg[--s->nx];
            pthread_mutex_unlock(&s->lock);
            if (b.p) {
                pfree(w, b);
                w->foreign_frees++;
            }
        }
    }
    while (w->n) pfree(w, w->mine[--w->n]);
    return NULL;
}

static void fixed_pool_shared_by_threads(bool checked)
{
    llmem_resource *os, *track;
    assert_ok(llmem_os_resource_create(NULL, &os));
    assert_ok(llmem_tracking_resource_create(os, &track));
    pool_shared s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.lock, NULL);
    llmem_fixed_options o = llmem_fixed_options_default();
    o.name = checked ? "shared-checked" : "shared";
    o.resource = track;
    o.block_size = BLOCK;
    o.chunk_bytes = 16 * KiB; /* small chunks: the pool grows while threads race */
    o.thread_safe = true;
    o.checked = checked;
    o.cache_blocks = 16;
    assert_ok(llmem_fixed_create(&o, &s.pool));

    pool_worker *w = calloc(POOL_THREADS, sizeof *w);
    assert_non_null(w);
    pthread_t th[POOL_THREADS];
    for (int i = 0; i < POOL_THREADS; i++) {
        w[i].s = &s;
        w[i].id = i;
        w[i].rng = 0xd1b54a32d192ed03ull * (uint64_t)(i + 1) + (checked ? 5 : 3);
        assert_int_equal(pthread_create(&th[i], NULL, pool_hammer, &w[i]), 0);
    }
    uint64_t allocs = 0, frees = 0, foreign = 0;
    for (int i = 0; i < POOL_THREADS; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < POOL_THREADS; i++) {
        if (w[i].error[0]) fail_msg("%s", w[i].error);
        allocs += w[i].allocs;
        frees += w[i].frees;
        foreign += w[i].foreign_frees;
    }
    free(w);
    /* What is left in the exchange goes back from this thread. */
    for (size_t i = 0; i < s.nx; i++) {
        assert_true(pholds(s.xchg[i]));
        assert_ok(llmem_fixed_free(s.pool, s.xchg[i].p));
        frees++;
    }
    assert_int_equal(allocs, frees);
    assert_true(foreign > 100); /* blocks did cross threads */
    llmem_fixed_flush_thread_cache(s.pool);
    llmem_fixed_stats fs;
    memset(&fs, 0, sizeof fs);
    assert_ok(llmem_fixed_get_stats(s.pool, &fs));
    assert_int_equal(fs.allocs_total, allocs);
    assert_int_equal(fs.frees_total, frees);
    assert_int_equal(fs.blocks_in_use, 0);
    assert_int_equal(fs.failures_total, 0);
    assert_int_equal(fs.double_frees_total, 0);
    assert_int_equal(fs.foreign_frees_total, 0);
    assert_true(fs.chunks > 1);
    llmem_tracking_stats ts = {0};
    assert_ok(llmem_tracking_resource_get_stats(track, &ts));
    assert_int_equal(ts.live_mappings, fs.chunks);
    assert_int_equal(ts.live_bytes, fs.reserved_bytes);

    llmem_fixed_destroy(s.pool);
    test_tracking_expect_clean(track);
    pthread_mutex_destroy(&s.lock);
    llmem_resource_destroy(track);
    assert_int_equal(test_resource_stats(os).mapped_bytes, 0);
    llmem_resource_destroy(os);
}

TEST_CASE(fixed_pool_four_threads, fixed_pool_shared_by_threads(false))
TEST_CASE(fixed_pool_four_threads_checked, fixed_pool_shared_by_threads(true))

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stack_hammered_over_sim),
        cmocka_unit_test(stack_hammered_over_os),
        cmocka_unit_test(fixed_pool_four_threads),
        cmocka_unit_test(fixed_pool_four_threads_checked),
    };
    return cmocka_run_group_tests(tests, test_quiet_logs, NULL);
}
