/*
 * test_stress_threads.c - a seeded stress of the dynamic pool, the
 * thread-safe fixed pool and the KV manager, all at once, by 8 threads
 * (more than the cores CI has, so the scheduler interleaves them at
 * arbitrary points). Runs under TSan in `make check`.
 *
 * One tracking resource over the os resource feeds a pool and a fixed
 * pool; a PAGED KV manager with a small budget takes its slabs from the
 * same pool. Each thread draws its operations from its own seeded
 * generator:
 *  - pool: allocations of mixed sizes (slab classes, page runs, now and then
 *    a whole superblock), reallocations, frees of its own blocks and of
 *    blocks other threads handed it;
 *  - handles: movable allocations, pinned to be written and checked,
 *    compaction (llmem_pool_compact) by any thread while others pin, and
 *    llmem_pool_handle_free by the thread they were handed to;
 *  - fixed: blocks allocated and freed, here or by another thread;
 *  - KV: sequences created, appended to (every slot written, K and V of
 *    every layer), forked, truncated, handed to another thread and freed
 *    there (a sequence is driven by one thread at a time: the hand-over
 *    goes through a mutex); budget refusals (LLMEM_ENOMEM) are expected
 *    and met by freeing a sequence;
 *  - upkeep: shrink to a random target, trim, thread-cache flushes,
 *    llmem_kv_trim, and stats readers (pool, class, fixed, KV, tracking)
 *    asserting what a snapshot must satisfy; now and then llmem_pool_check
 *    and llmem_kv_check while the others run.
 * Hand-overs go through a mutex-protected inbox per thread (a full inbox
 * means the sender frees the item itself). Every block, handle and KV slot
 * holds a pattern derived from its owner's seed, checked before it is
 * freed and at random while it lives: corruption fails the test.
 *
 * At the end (all threads joined, so their caches went back): no live
 * allocation, no used byte, no handle in the pool, no block in use in the
 * fixed pool, llmem_pool_check and llmem_kv_check pass, and after destroy
 * the tracking resource reports no live mapping.
 *
 * Length: LLMEM_STRESS_OPS operations in all (default 40000), or
 * LLMEM_STRESS_SECONDS of wall time instead (the long variant); seed:
 * LLMEM_STRESS_SEED (default 0x5eed). Prints "stress: N ops in S s, seed X".
 */
#include <pthread.h>
#include <stdatomic.h>

#include "test_util.h"
#include "support/inbox.h"
#include "support/kv_content.h"
#include "support/rng.h"

enum {
    THREADS = 8,
    DEFAULT_OPS = 40000,
    INBOX = 128,
    MAX_BLOCKS = 96,
    MAX_HANDLES = 12,
    MAX_FIXED = 64,
    MAX_SEQS = 6,
    FIXED_BYTES = 200,
    KV_LAYERS = 2,
    KV_MAXLEN = 256,
    KV_TOKEN = 2 * 16 * 4, /* kv_heads x head_dim x f32: bytes of one token's K (or V) in one layer */
};

/* ---- randomness and patterns --------------------------------------------- */

/* Byte i of a pattern seeded with `seed`. Written and checked at the same
 * offsets whatever the length (every byte of the first 256, then every
 * 61st), so a prefix of a block can be checked after a realloc; cheap on
 * big blocks. */
static unsigned char pat(uint64_t seed, size_t i)
{
    return (unsigned char)(test_mix64(seed + i / 64) >> (8 * (i % 8)));
}

static void fill(unsigned char *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i += i < 256 ? 1 : 61) p[i] = pat(seed, i);
}

static bool intact(const unsigned char *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i += i < 256 ? 1 : 61)
        if (p[i] != pat(seed, i)) return false;
    return true;
}

/* ---- what travels between threads ----------------------------------------- */

typedef enum kind { K_BLOCK, K_HANDLE, K_FIXED, K_SEQ } kind;

typedef struct seqstate {
    llmem_kv_seq h;
    size_t length;
    uint64_t seed[KV_MAXLEN]; /* per position: the seed of its K and V */
} seqstate;

typedef struct item {
    kind k;
    void *p;            /* block (K_BLOCK, K_FIXED), seqstate (K_SEQ) */
    llmem_handle h;     /* K_HANDLE */
    size_t n;           /* bytes */
    uint64_t seed;
} item;

typedef test_inbox inbox; /* of INBOX items */

typedef struct shared {
    llmem_resource *os, *track;
    llmem_pool *pool;
    llmem_fixed *fixed;
    llmem_kv *kv;
    inbox boxes[THREADS];
    pthread_barrier_t produced;
    uint64_t seed;
    uint64_t ops_per_thread;   /* 0: run until deadline_ns */
    uint64_t deadline_ns;
    atomic_ullong ops, compactions, moved, enomem, cross;
} shared;

typedef struct worker {
    shared *sh;
    int id;
    uint64_t s;
    item blocks[MAX_BLOCKS];
    size_t nblocks;
    item handles[MAX_HANDLES];
    size_t nhandles;
    item fixed[MAX_FIXED];
    size_t nfixed;
    seqstate *seqs[MAX_SEQS];
    size_t nseqs;
} worker;

static bool push(inbox *b, item it) { return test_inbox_push(b, &it); }
static bool pop(inbox *b, item *it) { return test_inbox_pop(b, it); }

/* ---- KV contents ------------------------------------------------------------ */

/* tests/support/kv_content.h's model, with a random word per position in
 * place of the prefix hash (no tokens here); a fork copies the words. */
static void kv_write(shared *sh, seqstate *q, size_t from, size_t to)
{
    test_kv_write(sh->kv, NULL, q->h, q->seed, from, to, KV_LAYERS);
}

static void kv_verify(shared *sh, const seqstate *q)
{
    llmem_kv_seq_info in;
    assert_ok(llmem_kv_seq_get_info(sh->kv, q->h, &in));
    assert_int_equal(in.length, q->length);
    for (size_t p = 0; p < q->length; p++)
        for (uint32_t l = 0; l < KV_LAYERS; l++) test_kv_expect_token(sh->kv, NULL, q->h, q->seed[p], p, l);
}

/* ---- releasing what a thread holds or was handed -------------------------- */

static void release(shared *sh, item *it)
{
    switch (it->k) {
    case K_BLOCK:
        if (!intact(it->p, it->n, it->seed)) fail_msg("pool block %p (%zu B) corrupted", it->p, it->n);
        assert_ok(llmem_pool_free(sh->pool, it->p));
        break;
    case K_HANDLE: {
        unsigned char *p = llmem_pool_pin(sh->pool, it->h, NULL);
        if (!p) fail_msg("pin: %s", llmem_error_message());
        if (!intact(p, it->n, it->seed)) fail_msg("handle 0x%llx corrupted", (unsigned long long)it->h);
        assert_ok(llmem_pool_unpin(sh->pool, it->h));
        assert_ok(llmem_pool_handle_free(sh->pool, it->h));
        break;
    }
    case K_FIXED:
        if (!intact(it->p, it->n, it->seed)) fail_msg("fixed block %p corrupted", it->p);
        assert_ok(llmem_fixed_free(sh->fixed, it->p));
        break;
    case K_SEQ: {
        seqstate *q = it->p;
        kv_verify(sh, q);
        assert_ok(llmem_kv_seq_free(sh->kv, q->h));
        free(q);
        break;
    }
    }
}

/* Hand the item to a random other thread, or free it here. */
static void give_away(worker *w, item it)
{
    int to = (w->id + 1 + (int)(test_rng_next(&w->s) % (THREADS - 1))) % THREADS;
    if (push(&w->sh->boxes[to], it)) atomic_fetch_add(&w->sh->cross, 1);
    else release(w->sh, &it);
}

static void drain(worker *w)
{
    item it;
    while (pop(&w->sh->boxes[w->id], &it)) release(w->sh, &it);
}

/* ---- the operations ---------------------------------------------------------- */

static size_t pick_size(uint64_t *s)
{
    uint64_t r = test_rng_next(s) % 100;
    if (r < 70) return 1 + test_rng_next(s) % 512;
    if (r < 90) return 513 + test_rng_next(s) % (32 << 10);
    if (r < 98) return (32 << 10) + test_rng_next(s) % (224 << 10);
    return (256 << 10) + test_rng_next(s) % (1792 << 10);
}

static void op_alloc(worker *w)
{
    if (w->nblocks == MAX_BLOCKS) return;
    size_t n = pick_size(&w->s);
    unsigned char *p = test_rng_next(&w->s) % 8
                           ? llmem_pool_alloc(w->sh->pool, n, NULL)
                           : llmem_pool_alloc_aligned(w->sh->pool, n, (size_t)64 << (test_rng_next(&w->s) % 8), NULL);
    if (!p) fail_msg("alloc %zu: %s", n, llmem_error_message());
    uint64_t seed = test_rng_next(&w->s);
    fill(p, n, seed);
    w->blocks[w->nblocks++] = (item){K_BLOCK, p, 0, n, seed};
}

static void op_free(worker *w)
{
    if (!w->nblocks) return;
    size_t i = test_rng_next(&w->s) % w->nblocks;
    item it = w->blocks[i];
    w->blocks[i] = w->blocks[--w->nblocks];
    if (test_rng_next(&w->s) % 2) give_away(w, it);
    else release(w->sh, &it);
}

static void op_realloc(worker *w)
{
    if (!w->nblocks) return;
    item *it = &w->blocks[test_rng_next(&w->s) % w->nblocks];
    if (!intact(it->p, it->n, it->seed)) fail_msg("pool block %p corrupted before realloc", it->p);
    size_t n = pick_size(&w->s);
    unsigned char *p = llmem_pool_realloc(w->sh->pool, it->p, n, NULL);
    if (!p) fail_msg("realloc %zu: %s", n, llmem_error_message());
    size_t keep = n < it->n ? n : it->n;
    if (!intact(p, keep, it->seed)) fail_msg("realloc lost bytes of %p", it->p);
    fill(p, n, it->seed);
    it->p = p;
    it->n = n;
}

static void op_handle(worker *w)
{
    uint64_t r = test_rng_next(&w->s) % 4;
    if (r < 2 && w->nhandles < MAX_HANDLES) {
        size_t n = 1 + test_rng_next(&w->s) % (test_rng_next(&w->s) % 4 ? (64 << 10) : (1 << 20));
        llmem_handle h;
        assert_ok(llmem_pool_handle_alloc(w->sh->pool, n, &h));
        unsigned char *p = llmem_pool_pin(w->sh->pool, h, NULL);
        if (!p) fail_msg("pin: %s", llmem_error_message());
        uint64_t seed = test_rng_next(&w->s);
        fill(p, n, seed);
        assert_ok(llmem_pool_unpin(w->sh->pool, h));
        w->handles[w->nhandles++] = (item){K_HANDLE, NULL, h, n, seed};
    } else if (w->nhandles) {
        size_t i = test_rng_next(&w->s) % w->nhandles;
        item it = w->handles[i];
        if (r == 2) {
            /* Pin, check, unpin: the contents survive any compaction. */
            unsigned char *p = llmem_pool_pin(w->sh->pool, it.h, NULL);
            if (!p) fail_msg("pin: %s", llmem_error_message());
            if (!intact(p, it.n, it.seed)) fail_msg("handle 0x%llx corrupted", (unsigned long long)it.h);
            assert_int_equal(llmem_pool_handle_size(w->sh->pool, it.h), it.n);
            assert_ok(llmem_pool_unpin(w->sh->pool, it.h));
            return;
        }
        w->handles[i] = w->handles[--w->nhandles];
        if (test_rng_next(&w->s) % 2) give_away(w, it);
        else release(w->sh, &it);
    }
}

static void op_fixed(worker *w)
{
    uint64_t r = test_rng_next(&w->s) % 2;
    if (r == 0 && w->nfixed < MAX_FIXED) {
        unsigned char *p = llmem_fixed_alloc(w->sh->fixed, NULL);
        if (!p) fail_msg("fixed alloc: %s", llmem_error_message());
        uint64_t seed = test_rng_next(&w->s);
        fill(p, FIXED_BYTES, seed);
        w->fixed[w->nfixed++] = (item){K_FIXED, p, 0, FIXED_BYTES, seed};
    } else if (w->nfixed) {
        size_t i = test_rng_next(&w->s) % w->nfixed;
        item it = w->fixed[i];
        w->fixed[i] = w->fixed[--w->nfixed];
        if (test_rng_next(&w->s) % 2) give_away(w, it);
        else release(w->sh, &it);
    }
}

static void seq_drop(worker *w, size_t i)
{
    item it = {K_SEQ, w->seqs[i], 0, 0, 0};
    w->seqs[i] = w->seqs[--w->nseqs];
    if (test_rng_next(&w->s) % 2) give_away(w, it);
    else release(w->sh, &it);
}

/* Append n slots to q, freeing this thread's other sequences while the
 * budget refuses; false if it still refuses (q unchanged). */
static bool seq_grow(worker *w, seqstate *q, size_t n)
{
    for (;;) {
        size_t first = 0;
        llmem_status st = llmem_kv_seq_append(w->sh->kv, q->h, n, NULL, &first);
        if (st == LLMEM_OK) {
            assert_int_equal(first, q->length);
            for (size_t p = q->length; p < q->length + n; p++) q->seed[p] = test_rng_next(&w->s);
            kv_write(w->sh, q, q->length, q->length + n);
            q->length += n;
            return true;
        }
        if (st != LLMEM_ENOMEM) fail_msg("append: %s: %s", llmem_status_name(st), llmem_error_message());
        atomic_fetch_add(&w->sh->enomem, 1);
        size_t victim = MAX_SEQS;
        for (size_t i = 0; i < w->nseqs; i++)
            if (w->seqs[i] != q) victim = i;
        if (victim == MAX_SEQS) return false;
        item it = {K_SEQ, w->seqs[victim], 0, 0, 0};
        w->seqs[victim] = w->seqs[--w->nseqs];
        release(w->sh, &it);
    }
}

static void op_kv(worker *w)
{
    shared *sh = w->sh;
    uint64_t r = test_rng_next(&w->s) % 10;
    if ((r < 2 || !w->nseqs) && w->nseqs < MAX_SEQS) {
        seqstate *q = calloc(1, sizeof *q);
        assert_non_null(q);
        assert_ok(llmem_kv_seq_create(sh->kv, 0, &q->h));
        w->seqs[w->nseqs++] = q;
        if (!seq_grow(w, q, 1 + test_rng_next(&w->s) % 64)) {
            for (size_t i = 0; i < w->nseqs; i++)
                if (w->seqs[i] == q) seq_drop(w, i);
        }
        return;
    }
    if (!w->nseqs) return;
    size_t i = test_rng_next(&w->s) % w->nseqs;
    seqstate *q = w->seqs[i];
    if (r < 6) {
        size_t n = 1 + test_rng_next(&w->s) % (r < 4 ? 2 : 24);
        if (q->length + n > KV_MAXLEN) seq_drop(w, i);
        else if (!seq_grow(w, q, n)) seq_drop(w, i);
    } else if (r == 6 && w->nseqs < MAX_SEQS) {
        seqstate *c = calloc(1, sizeof *c);
        assert_non_null(c);
        llmem_status st = llmem_kv_seq_fork(sh->kv, q->h, &c->h);
        if (st == LLMEM_ENOMEM) {
            free(c);
            return;
        }
        assert_ok(st);
        c->length = q->length;
        memcpy(c->seed, q->seed, q->length * sizeof *q->seed);
        w->seqs[w->nseqs++] = c;
    } else if (r == 7 && q->length > 1) {
        size_t n = test_rng_next(&w->s) % q->length;
        assert_ok(llmem_kv_seq_truncate(sh->kv, q->h, n));
        q->length = n;
    } else if (r == 8) {
        kv_verify(sh, q);
    } else {
        seq_drop(w, i);
    }
}

static void op_upkeep(worker *w)
{
    shared *sh = w->sh;
    uint64_t r = test_rng_next(&w->s) % 16;
    if (r < 1 + (test_rng_next(&w->s) % 2)) {
        llmem_pool_compact_report rep = {sizeof rep, 0, 0, 0, 0, 0, 0};
        assert_ok(llmem_pool_compact(sh->pool, test_rng_next(&w->s) % 4 ? (size_t)1 << 20 : 0, &rep));
        atomic_fetch_add(&sh->compactions, 1);
        atomic_fetch_add(&sh->moved, rep.bytes_moved);
    } else if (r < 5) {
        llmem_pool_stats st = {sizeof st};
        assert_ok(llmem_pool_get_stats(sh->pool, &st));
        llmem_pool_shrink(sh->pool, (size_t)(test_rng_next(&w->s) % (st.committed_bytes + 1)));
    } else if (r == 5) {
        llmem_pool_trim(sh->pool);
    } else if (r == 6) {
        llmem_pool_flush_thread_cache(sh->pool);
        llmem_fixed_flush_thread_cache(sh->fixed);
    } else if (r == 7) {
        llmem_kv_trim(sh->kv, test_rng_next(&w->s) % 2);
    } else if (r == 8 && test_rng_next(&w->s) % 8 == 0) {
        assert_ok(llmem_pool_check(sh->pool));
        assert_ok(llmem_kv_check(sh->kv));
    } else {
        /* Stats readers: what any snapshot must satisfy. */
        llmem_pool_stats ps = {sizeof ps};
        assert_ok(llmem_pool_get_stats(sh->pool, &ps));
        assert_true(ps.committed_bytes <= ps.reserved_bytes);
        assert_true(ps.used_bytes <= ps.reserved_bytes);
        assert_true(ps.largest_free_bytes <= ps.free_bytes);
        assert_true(ps.reserved_bytes <= ps.reserved_peak_bytes);
        llmem_pool_class_stats cls[80];
        for (size_t i = 0; i < 80; i++) cls[i].struct_size = sizeof cls[i];
        size_t ncls = 0;
        assert_ok(llmem_pool_get_class_stats(sh->pool, cls, 80, &ncls));
        llmem_fixed_stats fs = {sizeof fs};
        assert_ok(llmem_fixed_get_stats(sh->fixed, &fs));
        assert_true(fs.blocks_in_use <= fs.blocks_capacity);
        llmem_kv_stats ks = {sizeof ks};
        assert_ok(llmem_kv_get_stats(sh->kv, &ks));
        assert_true(ks.blocks_used + ks.blocks_cached + ks.blocks_free <= ks.blocks_total);
        llmem_tracking_stats ts = {sizeof ts};
        assert_ok(llmem_tracking_resource_get_stats(sh->track, &ts));
        assert_int_equal(ts.refused_total, 0);
    }
}

/* Check one random live block of each kind in place. */
static void op_inspect(worker *w)
{
    if (w->nblocks) {
        const item *it = &w->blocks[test_rng_next(&w->s) % w->nblocks];
        if (!intact(it->p, it->n, it->seed)) fail_msg("pool block %p corrupted", it->p);
        assert_true(llmem_pool_owns(w->sh->pool, it->p));
        assert_true(llmem_pool_usable_size(w->sh->pool, it->p) >= it->n);
    }
    if (w->nfixed) {
        const item *it = &w->fixed[test_rng_next(&w->s) % w->nfixed];
        if (!intact(it->p, it->n, it->seed)) fail_msg("fixed block %p corrupted", it->p);
    }
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    shared *sh = w->sh;
    uint64_t ops = 0;
    for (;; ops++) {
        if (sh->ops_per_thread ? ops >= sh->ops_per_thread : (ops % 64 == 0 && test_now_ns() >= sh->deadline_ns)) break;
        if (ops % 16 == 0) drain(w);
        uint64_t r = test_rng_next(&w->s) % 1000;
        if (r < 280) op_alloc(w);
        else if (r < 520) op_free(w);
        else if (r < 550) op_realloc(w);
        else if (r < 620) op_handle(w);
        else if (r < 740) op_fixed(w);
        else if (r < 900) op_kv(w);
        else if (r < 960) op_upkeep(w);
        else op_inspect(w);
    }
    /* Hand everything left to others or free it, then drain once nobody
     * produces any more. */
    while (w->nblocks) op_free(w);
    while (w->nfixed) {
        item it = w->fixed[--w->nfixed];
        give_away(w, it);
    }
    while (w->nhandles) {
        item it = w->handles[--w->nhandles];
        give_away(w, it);
    }
    while (w->nseqs) seq_drop(w, w->nseqs - 1);
    atomic_fetch_add(&sh->ops, ops);
    pthread_barrier_wait(&sh->produced);
    drain(w);
    return NULL;
}

static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    unsigned long long x = strtoull(v, &end, 0);
    if (*end) fail_msg("%s=%s is not a number", name, v);
    return x;
}

static void stress(void **state)
{
    (void)state;
    shared *sh = calloc(1, sizeof *sh);
    assert_non_null(sh);
    sh->seed = env_u64("LLMEM_STRESS_SEED", 0x5eed);
    uint64_t seconds = env_u64("LLMEM_STRESS_SECONDS", 0);
    uint64_t total = env_u64("LLMEM_STRESS_OPS", DEFAULT_OPS);
    if (seconds) sh->deadline_ns = test_now_ns() + seconds * 1000000000ull;
    else sh->ops_per_thread = (total + THREADS - 1) / THREADS;

    assert_ok(llmem_os_resource_create(NULL, &sh->os));
    assert_ok(llmem_tracking_resource_create(sh->os, &sh->track));
    llmem_pool_options po = llmem_pool_options_default();
    po.name = "stress";
    po.resource = sh->track;
    po.first_superblock_bytes = 1 << 20;
    po.max_superblock_bytes = 8 << 20;
    po.decay_ms = 20; /* the background purger works while the threads do */
    assert_ok(llmem_pool_create(&po, &sh->pool));
    llmem_fixed_options fo = llmem_fixed_options_default();
    fo.name = "stress-fixed";
    fo.resource = sh->track;
    fo.block_size = FIXED_BYTES;
    fo.thread_safe = true;
    fo.cache_blocks = 16;
    assert_ok(llmem_fixed_create(&fo, &sh->fixed));
    llmem_kv_options ko = llmem_kv_options_default();
    ko.name = "stress-kv";
    ko.layers = KV_LAYERS;
    ko.kv_heads = 2;
    ko.head_dim = 16;
    ko.dtype = LLMEM_KV_F32;
    ko.max_seq_len = KV_MAXLEN;
    ko.budget_bytes = 1 << 20; /* below what the threads ask for: refusals happen */
    ko.pool = sh->pool;
    assert_ok(llmem_kv_create(&ko, &sh->kv));
    assert_int_equal(llmem_kv_token_layer_bytes(sh->kv), KV_TOKEN);

    for (int i = 0; i < THREADS; i++) test_inbox_init(&sh->boxes[i], sizeof(item), INBOX);
    pthread_barrier_init(&sh->produced, NULL, THREADS);
    worker *w = calloc(THREADS, sizeof *w);
    assert_non_null(w);
    pthread_t t[THREADS];
    uint64_t t0 = test_now_ns();
    for (int i = 0; i < THREADS; i++) {
        w[i].sh = sh;
        w[i].id = i;
        w[i].s = test_mix64(sh->seed * 0x9e3779b97f4a7c15ull + (uint64_t)i + 1) | 1;
        assert_int_equal(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    double secs = (double)(test_now_ns() - t0) * 1e-9;
    printf("stress: %llu ops in %.2f s, seed %llu (%d threads; %llu handed across threads, %llu compactions "
           "moving %llu bytes, %llu KV budget refusals)\n",
           (unsigned long long)atomic_load(&sh->ops), secs, (unsigned long long)sh->seed, THREADS,
           (unsigned long long)atomic_load(&sh->cross), (unsigned long long)atomic_load(&sh->compactions),
           (unsigned long long)atomic_load(&sh->moved), (unsigned long long)atomic_load(&sh->enomem));
    fflush(stdout);

    /* Every thread exited: its caches and magazines went back. */
    llmem_kv_stats ks = {sizeof ks};
    assert_ok(llmem_kv_get_stats(sh->kv, &ks));
    assert_int_equal(ks.sequences, 0);
    assert_int_equal(ks.blocks_used, 0);
    assert_ok(llmem_kv_check(sh->kv));
    llmem_kv_destroy(sh->kv);
    llmem_pool_stats ps = {sizeof ps};
    assert_ok(llmem_pool_get_stats(sh->pool, &ps));
    assert_int_equal(ps.live_allocations, 0);
    assert_int_equal(ps.used_bytes, 0);
    assert_int_equal(ps.handles, 0);
    assert_int_equal(ps.allocs_total, ps.frees_total);
    assert_int_equal(ps.invalid_frees_total, 0);
    assert_int_equal(ps.corruptions_total, 0);
    assert_ok(llmem_pool_check(sh->pool));
    llmem_fixed_stats fs = {sizeof fs};
    assert_ok(llmem_fixed_get_stats(sh->fixed, &fs));
    assert_int_equal(fs.blocks_in_use, 0);
    assert_int_equal(fs.allocs_total, fs.frees_total);
    llmem_pool_trim(sh->pool);
    assert_ok(llmem_pool_get_stats(sh->pool, &ps));
    assert_int_equal(ps.reserved_bytes, 0);
    llmem_pool_destroy(sh->pool);
    llmem_fixed_destroy(sh->fixed);
    size_t leaks = 1;
    assert_ok(llmem_tracking_resource_report(sh->track, stdout, &leaks));
    assert_int_equal(leaks, 0);
    test_tracking_expect_clean(sh->track);
    llmem_resource_destroy(sh->track);
    llmem_resource_destroy(sh->os);
    pthread_barrier_destroy(&sh->produced);
    for (int i = 0; i < THREADS; i++) test_inbox_destroy(&sh->boxes[i]);
    free(w);
    free(sh);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stress),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
