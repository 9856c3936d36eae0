/*
 * test_fixed_threads.c - thread-safe fixed pools under real concurrency:
 * eight threads sharing a pool, handing blocks to each other to free
 * (cross-thread frees), checking every block's contents, while the main
 * thread reads stats; the same in checked mode with a deliberate double
 * free and foreign frees; and thread exits returning their caches. Built to
 * be clean under ThreadSanitizer (label "threads").
 *
 * cmocka's assertions are not thread-safe, so workers record the first
 * thing that went wrong and the main thread asserts after joining.
 */
#include <pthread.h>
#include <time.h>

#include "test_util.h"
#include "support/cases.h"
#include "support/rng.h"

#define KiB ((size_t)1 << 10)

enum { NT = 8, MAX_BATCH = 48 };

#ifdef TEST_TSAN
enum { ROUNDS = 1500 };
#else
enum { ROUNDS = 4000 };
#endif

static const uint32_t LIVE = 0x4C495645u, DEAD = 0x44454144u;

/* ---- helpers ---------------------------------------------------------------- */

static unsigned char pat(uint32_t tid, uint64_t seq, size_t i)
{
    uint64_t x = ((uint64_t)tid + 1) * 0x9E3779B97F4A7C15ull ^ (seq + 1) * 0xBF58476D1CE4E5B9ull ^ (uint64_t)i;
    x ^= x >> 29;
    x *= 0x94D049BB133111EBull;
    return (unsigned char)(x >> 56);
}

/* Block layout: magic, writer's thread id, writer's sequence number, then
 * a pattern derived from both up to the stride. */
typedef struct header {
    uint32_t magic;
    uint32_t tid;
    uint64_t seq;
} header;

static void stamp(void *b, size_t stride, uint32_t tid, uint64_t seq)
{
    header h = {LIVE, tid, seq};
    memcpy(b, &h, sizeof h);
    unsigned char *c = b;
    for (size_t i = sizeof h; i < stride; i++) c[i] = pat(tid, seq, i);
}

/* Check a block written by stamp(); 0 if intact, else a reason. */
static const char *verify(const void *b, size_t stride, uint32_t want_tid, header *out)
{
    header h;
    memcpy(&h, b, sizeof h);
    if (out) *out = h;
    if (h.magic != LIVE) return "magic is not LIVE";
    if (h.tid != want_tid) return "wrong writer";
    const unsigned char *c = b;
    for (size_t i = sizeof h; i < stride; i++)
        if (c[i] != pat(h.tid, h.seq, i)) return "pattern damaged";
    return NULL;
}

static void mark_dead(void *b)
{
    uint32_t d = DEAD;
    memcpy(b, &d, sizeof d);
}

typedef struct queue {
    pthread_mutex_t lock;
    void **items;
    size_t n, cap;
} queue;

typedef struct shared {
    llmem_fixed *p;
    size_t stride;
    bool checked;
    int double_free_tid;        /* the thread that tries a double free, or -1 */
    queue q[NT];
    pthread_barrier_t produced; /* every thread has pushed its last block */
    int running;                /* atomic: workers not finished yet */
} shared;

typedef struct worker {
    shared *sh;
    uint32_t tid;
    uint64_t allocs, frees, received, foreign_tries;
    llmem_status double_free_status;
    bool failed;
    char why[256];
} worker;

#define WFAIL(w, ...)                                                   \
    do {                                                                \
        if (!(w)->failed) {                                             \
            (w)->failed = true;                                         \
            snprintf((w)->why, sizeof (w)->why, __VA_ARGS__);           \
        }                                                               \
    } while (0)

static void free_checked(worker *w, void *b, uint32_t want_tid)
{
    header h;
    const char *bad = verify(b, w->sh->stride, want_tid, &h);
    if (bad)
        WFAIL(w, "thread %u: block %p from thread %u: %s (magic %08x tid %u seq %llu)", w->tid, b, want_tid, bad,
              h.magic, h.tid, (unsigned long long)h.seq);
    mark_dead(b);
    llmem_status st = llmem_fixed_free(w->sh->p, b);
    if (st) WFAIL(w, "thread %u: free of %p -> %s: %s", w->tid, b, llmem_status_name(st), llmem_error_message());
    w->frees++;
}

/* Take everything in this thread's queue and free it after checking it
 * came from the previous thread intact. */
static void drain(worker *w)
{
    queue *q = &w->sh->q[w->tid];
    pthread_mutex_lock(&q->lock);
    void **items = q->items;
    size_t n = q->n;
    q->items = NULL;
    q->n = q->cap = 0;
    pthread_mutex_unlock(&q->lock);
    uint32_t from = (w->tid + NT - 1) % NT;
    for (size_t i = 0; i < n; i++) free_checked(w, items[i], from);
    w->received += n;
    free(items);
}

static void push(worker *w, void *const *blocks, size_t n)
{
    if (n == 0) return;
    queue *q = &w->sh->q[(w->tid + 1) % NT];
    pthread_mutex_lock(&q->lock);
    if (q->n + n > q->cap) {
        size_t ncap = q->cap ? q->cap * 2 : 64;
        while (ncap < q->n + n) ncap *= 2;
        void **ni = realloc(q->items, ncap * sizeof *ni);
        if (!ni) {
            pthread_mutex_unlock(&q->lock);
            WFAIL(w, "thread %u: out of memory for the queue", w->tid);
            return;
        }
        q->items = ni;
        q->cap = ncap;
    }
    memcpy(q->items + q->n, blocks, n * sizeof *blocks);
    q->n += n;
    pthread_mutex_unlock(&q->lock);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    shared *sh = w->sh;
    uint64_t r = 0x1234567ull + w->tid * 0x9E3779B97F4A7C15ull, seq = 0;
    void *mine[MAX_BATCH];
    for (int round = 0; round < ROUNDS && !w->failed; round++) {
        size_t n = 1 + (size_t)(test_rng_next(&r) % MAX_BATCH);
        for (size_t i = 0; i < n; i++) {
            llmem_status st = LLMEM_EINVAL;
            void *b = llmem_fixed_alloc(sh->p, &st);
            if (!b || st != LLMEM_OK) {
                WFAIL(w, "thread %u: alloc -> %s: %s", w->tid, llmem_status_name(st), llmem_error_message());
                n = i;
                break;
            }
            if (((uintptr_t)b & 63) != 0) WFAIL(w, "thread %u: block %p not 64-aligned", w->tid, b);
            uint32_t magic;
            memcpy(&magic, b, sizeof magic);
            if (magic == LIVE) WFAIL(w, "thread %u: block %p handed out while live", w->tid, b);
            stamp(b, sh->stride, w->tid, seq++);
            mine[i] = b;
            w->allocs++;
        }
        /* Half to the next thread, which frees them; the rest freed here. */
        size_t give = n / 2;
        push(w, mine, give);
        for (size_t i = give; i < n; i++) free_checked(w, mine[i], w->tid);
        drain(w);
        if (round % 64 == 63) llmem_fixed_flush_thread_cache(sh->p);
        if (sh->checked && round % 50 == 7) {
            /* A foreign pointer, while other threads grow the pool. */
            _Alignas(64) unsigned char local[128];
            memset(local, 0x77, sizeof local);
            llmem_status st = llmem_fixed_free(sh->p, local);
            if (st != LLMEM_EFOREIGN) WFAIL(w, "thread %u: foreign free -> %s", w->tid, llmem_status_name(st));
            for (size_t i = 0; i < sizeof local; i++)
                if (local[i] != 0x77) WFAIL(w, "thread %u: foreign free wrote to the buffer", w->tid);
            w->foreign_tries++;
        }
        if ((int)w->tid == sh->double_free_tid && round == ROUNDS / 2) {
            void *b = llmem_fixed_alloc(sh->p, NULL);
            if (!b) {
                WFAIL(w, "thread %u: alloc for the double free failed", w->tid);
            } else {
                w->allocs++;
                stamp(b, sh->stride, w->tid, seq++);
                free_checked(w, b, w->tid);
                w->double_free_status = llmem_fixed_free(sh->p, b); /* again */
                if (w->double_free_status == LLMEM_EDOUBLEFREE && !strstr(llmem_error_message(), "double free"))
                    WFAIL(w, "thread %u: double free message \"%s\"", w->tid, llmem_error_message());
            }
        }
    }
    /* Nobody pushes after the barrier: the last drain empties the queue. */
    pthread_barrier_wait(&sh->produced);
    drain(w);
    __atomic_sub_fetch(&sh->running, 1, __ATOMIC_RELEASE);
    return NULL; /* the magazine goes back to the pool in the key's destructor */
}

static void sleep_us(long us)
{
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

/* ---- eight threads, cross-thread frees ------------------------------------------ */

static void run_shared_pool(bool checked, size_t cache_blocks)
{
    llmem_fixed_options o = llmem_fixed_options_default();
    o.name = checked ? "mt-checked" : "mt";
    o.block_size = 100; /* stride 128 */
    o.thread_safe = true;
    o.checked = checked;
    o.cache_blocks = cache_blocks;
    o.chunk_bytes = 4 * KiB; /* many chunks, mapped while others look them up */
    o.max_chunk_bytes = 64 * KiB;
    shared sh;
    memset(&sh, 0, sizeof sh);
    assert_ok(llmem_fixed_create(&o, &sh.p));
    sh.stride = llmem_fixed_block_size(sh.p);
    assert_int_equal(sh.stride, 128);
    sh.checked = checked;
    sh.double_free_tid = checked ? 3 : -1;
    sh.running = NT;
    for (int i = 0; i < NT; i++) pthread_mutex_init(&sh.q[i].lock, NULL);
    assert_int_equal(pthread_barrier_init(&sh.produced, NULL, NT), 0);

    worker w[NT];
    pthread_t t[NT];
    memset(w, 0, sizeof w);
    for (uint32_t i = 0; i < NT; i++) {
        w[i].sh = &sh;
        w[i].tid = i;
        w[i].double_free_status = LLMEM_OK;
        assert_int_equal(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
    }
    /* Stats while they run: a consistent picture, never a wrapped count. */
    uint64_t polls = 0;
    while (__atomic_load_n(&sh.running, __ATOMIC_ACQUIRE) > 0) {
        llmem_fixed_stats s = test_fixed_stats(sh.p);
        if (s.blocks_in_use > s.blocks_capacity || s.blocks_in_use_peak > s.blocks_capacity)
            fail_msg("stats while running: in use %llu, peak %llu, capacity %llu",
                     (unsigned long long)s.blocks_in_use, (unsigned long long)s.blocks_in_use_peak,
                     (unsigned long long)s.blocks_capacity);
        assert_true(s.blocks_capacity * s.stride <= s.reserved_bytes);
        polls++;
        sleep_us(200);
    }
    uint64_t allocs = 0, frees = 0, received = 0, foreign = 0;
    /* All joined before a check can end the test (see test_resource_threads). */
    for (int i = 0; i < NT; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
    for (int i = 0; i < NT; i++) {
        if (w[i].failed) fail_msg("%s", w[i].why);
        allocs += w[i].allocs;
        frees += w[i].frees;
        received += w[i].received;
        foreign += w[i].foreign_tries;
    }
    assert_true(polls > 0);
    assert_true(received > 0); /* cross-thread frees did happen */
    assert_int_equal(allocs, frees);
    if (checked) {
        assert_int_equal(w[sh.double_free_tid].double_free_status, LLMEM_EDOUBLEFREE);
        assert_true(foreign > 0);
    }

    /* Every thread has exited: their caches came back through the key's
     * destructor, and the counters add up. */
    llmem_fixed_stats s = test_fixed_stats(sh.p);
    assert_int_equal(s.blocks_in_use, 0);
    assert_int_equal(s.allocs_total, allocs);
    assert_int_equal(s.frees_total, frees);
    assert_int_equal(s.failures_total, 0);
    assert_int_equal(s.double_frees_total, checked ? 1 : 0);
    assert_int_equal(s.foreign_frees_total, checked ? foreign : 0);
    assert_true(s.blocks_in_use_peak > 0 && s.blocks_in_use_peak <= s.blocks_capacity);
    /* ...so this thread can have every block without the pool growing. */
    size_t cap = (size_t)s.blocks_capacity;
    void **all = malloc(cap * sizeof *all);
    assert_non_null(all);
    for (size_t i = 0; i < cap; i++) {
        all[i] = llmem_fixed_alloc(sh.p, NULL);
        assert_non_null(all[i]);
    }
    llmem_fixed_stats s2 = test_fixed_stats(sh.p);
    assert_int_equal(s2.blocks_capacity, cap);
    assert_int_equal(s2.chunks, s.chunks);
    assert_int_equal(s2.blocks_in_use, cap);
    for (size_t i = 0; i < cap; i++) assert_ok(llmem_fixed_free(sh.p, all[i]));
    free(all);
    llmem_fixed_flush_thread_cache(sh.p);
    assert_int_equal(test_fixed_stats(sh.p).blocks_in_use, 0);

    pthread_barrier_destroy(&sh.produced);
    for (int i = 0; i < NT; i++) {
        assert_int_equal(sh.q[i].n, 0);
        free(sh.q[i].items);
        pthread_mutex_destroy(&sh.q[i].lock);
    }
    llmem_fixed_destroy(sh.p);
}

TEST_CASE(eight_threads_cross_thread_frees, run_shared_pool(false, 0))

static void eight_threads_small_caches(void **state)
{
    (void)state;
    run_shared_pool(false, 4); /* refills and flushes all the time */
}

TEST_CASE(eight_threads_checked_with_double_free, run_shared_pool(true, 8))

/* ---- thread exit returns the cache --------------------------------------------- */

typedef struct exit_arg {
    llmem_fixed *p;
    size_t n, keep; /* allocate n, free all but keep */
    void **kept;
    bool ok;
} exit_arg;

static void *alloc_free_exit(void *arg)
{
    exit_arg *a = arg;
    void **b = malloc(a->n * sizeof *b);
    a->ok = b != NULL;
    for (size_t i = 0; a->ok && i < a->n; i++) {
        b[i] = llmem_fixed_alloc(a->p, NULL);
        if (!b[i]) a->ok = false;
        else memset(b[i], (int)i, 64);
    }
    if (a->ok) {
        for (size_t i = 0; i < a->keep; i++) a->kept[i] = b[i];
        for (size_t i = a->keep; i < a->n; i++)
            if (llmem_fixed_free(a->p, b[i]) != LLMEM_OK) a->ok = false;
    }
    free(b);
    return NULL; /* exits with its cache full of free blocks */
}

static void run_thread(exit_arg *a)
{
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, alloc_free_exit, a), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(a->ok);
}

static void thread_exit_returns_its_cache(void **state)
{
    (void)state;
    /* One chunk of 64 blocks, all of them capped: after a thread took all
     * 64 into its hands and freed them into its cache (64 fit: default
     * cache), only their return at thread exit lets this thread have them. */
    llmem_fixed_options o = llmem_fixed_options_default();
    o.name = "exit";
    o.block_size = 64;
    o.thread_safe = true;
    o.chunk_bytes = 4 * KiB;
    o.max_chunk_bytes = 4 * KiB;
    o.max_blocks = 64;
    llmem_fixed *p;
    assert_ok(llmem_fixed_create(&o, &p));
    exit_arg a = {p, 64, 0, NULL, false};
    run_thread(&a);
    llmem_fixed_stats s = test_fixed_stats(p);
    assert_int_equal(s.blocks_in_use, 0);
    assert_int_equal(s.allocs_total, 64);
    assert_int_equal(s.frees_total, 64);
    assert_int_equal(s.blocks_capacity, 64);
    void *b[64];
    for (int i = 0; i < 64; i++) {
        b[i] = llmem_fixed_alloc(p, NULL);
        if (!b[i]) fail_msg("block %d of 64 not available after the thread exited: %s", i, llmem_error_message());
    }
    llmem_status st = LLMEM_OK;
    assert_null(llmem_fixed_alloc(p, &st));
    assert_int_equal(st, LLMEM_ECAPACITY);
    s = test_fixed_stats(p);
    assert_int_equal(s.blocks_capacity, 64);
    assert_int_equal(s.chunks, 1);
    assert_int_equal(s.blocks_in_use, 64);
    for (int i = 0; i < 64; i++) assert_ok(llmem_fixed_free(p, b[i]));
    llmem_fixed_destroy(p);

    /* Uncapped: thread after thread allocates and frees the same amount;
     * the pool does not grow after the first, and blocks a thread left live
     * at exit stay in use until freed elsewhere. */
    o.max_blocks = 0;
    o.checked = true;
    assert_ok(llmem_fixed_create(&o, &p));
    enum { THREADS = 12, N = 200, KEEP = 5 };
    void *kept[THREADS][KEEP];
    uint64_t cap1 = 0;
    for (int i = 0; i < THREADS; i++) {
        exit_arg e = {p, N, KEEP, kept[i], false};
        run_thread(&e);
        s = test_fixed_stats(p);
        assert_int_equal(s.blocks_in_use, (uint64_t)(i + 1) * KEEP);
        assert_int_equal(s.allocs_total, (uint64_t)(i + 1) * N);
        assert_int_equal(s.frees_total, (uint64_t)(i + 1) * (N - KEEP));
        if (i == 0) cap1 = s.blocks_capacity;
        /* Each thread needs N blocks; all the others' are back, but KEEP per
         * earlier thread stay out: the pool grows by at most those. */
        if (s.blocks_capacity > cap1 + (uint64_t)i * KEEP + 64)
            fail_msg("capacity %llu after %d threads (first: %llu): caches leaked",
                     (unsigned long long)s.blocks_capacity, i + 1, (unsigned long long)cap1);
    }
    for (int i = 0; i < THREADS; i++)
        for (int k = 0; k < KEEP; k++) assert_ok(llmem_fixed_free(p, kept[i][k])); /* cross-thread, after exit */
    llmem_fixed_flush_thread_cache(p);
    s = test_fixed_stats(p);
    assert_int_equal(s.blocks_in_use, 0);
    assert_int_equal(s.allocs_total, s.frees_total);
    assert_int_equal(s.double_frees_total, 0);
    llmem_fixed_destroy(p);
}

/* Threads that each run a whole pool's life concurrently: pool-private
 * keys and caches do not cross. */
typedef struct own_pool_arg {
    int id;
    bool ok;
} own_pool_arg;

static void *own_pool(void *arg)
{
    own_pool_arg *a = arg;
    llmem_fixed_options o = llmem_fixed_options_default();
    o.block_size = 32 + (size_t)a->id * 16;
    o.thread_safe = true;
    o.checked = a->id % 2;
    llmem_fixed *p;
    a->ok = llmem_fixed_create(&o, &p) == LLMEM_OK;
    for (int round = 0; a->ok && round < 50; round++) {
        void *b[100];
        for (int i = 0; a->ok && i < 100; i++) {
            b[i] = llmem_fixed_alloc(p, NULL);
            if (!b[i]) a->ok = false;
            else memset(b[i], a->id, o.block_size);
        }
        for (int i = 0; a->ok && i < 100; i++) {
            for (size_t k = 0; k < o.block_size; k++)
                if (((unsigned char *)b[i])[k] != (unsigned char)a->id) a->ok = false;
            if (llmem_fixed_free(p, b[i]) != LLMEM_OK) a->ok = false;
        }
    }
    if (a->ok) {
        llmem_fixed_flush_thread_cache(p);
        llmem_fixed_stats s = {.struct_size = sizeof s};
        a->ok = llmem_fixed_get_stats(p, &s) == LLMEM_OK && s.blocks_in_use == 0 && s.allocs_total == 5000 &&
                s.frees_total == 5000;
        llmem_fixed_destroy(p);
    }
    return NULL;
}

static void pools_per_thread(void **state)
{
    (void)state;
    pthread_t t[NT];
    own_pool_arg a[NT];
    for (int i = 0; i < NT; i++) {
        a[i] = (own_pool_arg){i, false};
        assert_int_equal(pthread_create(&t[i], NULL, own_pool, &a[i]), 0);
    }
    for (int i = 0; i < NT; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
    for (int i = 0; i < NT; i++) assert_true(a[i].ok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(eight_threads_cross_thread_frees),
        cmocka_unit_test(eight_threads_small_caches),
        cmocka_unit_test(eight_threads_checked_with_double_free),
        cmocka_unit_test(thread_exit_returns_its_cache),
        cmocka_unit_test(pools_per_thread),
    };
    return cmocka_run_group_tests(tests, test_quiet_logs, NULL);
}
