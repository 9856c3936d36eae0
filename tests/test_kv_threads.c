/*
 * test_kv_threads.c - one PAGED KV manager with the prefix cache shared by
 * several threads. Each worker drives its own sequences - starts them on a
 * few shared prompts (so threads really hold the same cached blocks at
 * once), appends, forks, truncates, writes K and V through seq_token and
 * reads everything back - while another thread reads stats, checks the
 * invariants and trims. Runs under TSan in `make check`.
 *
 * The content model is tests/support/kv_content.h's, as in test_kv.c: a
 * token's K (or V) is a function of every token up to it, its position and
 * its layer. The shared prompts are
 * written before the workers start; afterwards every worker appends only
 * tokens of its own, so no block a thread writes is ever matched by another
 * thread (what an engine guarantees by writing a block before others can
 * match it).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "test_util.h"
#include "support/kv_content.h"
#include "support/rng.h"

enum { THREADS = 6, MAXL = 6, NPROMPT = 3, PLEN = 48, B = 16, LAYERS = 2, TB = 2 * 8 * 2, MAXLEN = 160 };

typedef struct lseq {
    llmem_kv_seq h;
    size_t length, first, window;
    int32_t tok[512];
    uint64_t ph[512];
} lseq;

typedef struct shared {
    llmem_kv *kv;
    llmem_resource *dev;
    int32_t prompts[NPROMPT][PLEN];
    atomic_int running;
    atomic_ullong hits;
    int rounds;
} shared;

typedef struct targ {
    shared *sh;
    int id;
} targ;

static void push(lseq *s, const int32_t *t, size_t n)
{
    assert_true(s->length + n <= 512);
    if (n) memcpy(s->tok + s->length, t, n * sizeof *t);
    test_kv_chain(s->ph, s->length, t, n);
    s->length += n;
    if (s->window) {
        size_t wb = s->window / B + 1, blocks = (s->length + B - 1) / B;
        if (blocks > wb && (blocks - wb) * B > s->first) s->first = (blocks - wb) * B;
    }
}

static void write_range(const shared *sh, const lseq *s, size_t from, size_t to)
{
    if (from < s->first) from = s->first;
    test_kv_write(sh->kv, sh->dev, s->h, s->ph, from, to, LAYERS);
}

static void verify(const shared *sh, const lseq *s)
{
    llmem_kv_seq_info in;
    assert_ok(llmem_kv_seq_get_info(sh->kv, s->h, &in));
    assert_int_equal(in.length, s->length);
    assert_int_equal(in.first, s->first);
    size_t nb = s->length > s->first ? (s->length + B - 1) / B - s->first / B : 0;
    assert_int_equal(in.blocks, nb);
    for (uint32_t l = 0; l < LAYERS; l++) {
        void *kt[40], *vt[40];
        size_t n = 0;
        assert_ok(llmem_kv_seq_table(sh->kv, s->h, l, kt, vt, 40, &n));
        assert_int_equal(n, nb);
        for (size_t p = s->first; p < s->length; p++) {
            void *k, *v;
            assert_ok(llmem_kv_seq_token(sh->kv, s->h, l, p, &k, &v));
            size_t i = p / B - s->first / B;
            assert_ptr_equal(k, (char *)kt[i] + (p % B) * TB);
            assert_ptr_equal(v, (char *)vt[i] + (p % B) * TB);
            test_kv_expect_token(sh->kv, sh->dev, s->h, s->ph[p], p, l);
        }
        void *k;
        assert_status(llmem_kv_seq_token(sh->kv, s->h, l, s->length, &k, NULL), LLMEM_ERANGE);
    }
}

/* Tokens no other thread ever appends. */
static void own_tokens(int id, uint64_t *r, int32_t *t, size_t n)
{
    for (size_t i = 0; i < n; i++) t[i] = (int32_t)((id + 1) * 1000000 + (int)(test_rng_next(r) % 999983));
}

static void *worker(void *arg)
{
    targ *a = arg;
    shared *sh = a->sh;
    uint64_t r = 0x9e3779b97f4a7c15ull * (uint64_t)(a->id + 3);
    lseq *s = calloc(MAXL, sizeof *s);
    size_t n = 0;
    unsigned long long hits = 0;
    int32_t t[64];
    for (int round = 0; round < sh->rounds; round++) {
        uint64_t x = test_rng_next(&r) % 100;
        size_t i = n ? (size_t)(test_rng_next(&r) % n) : 0;
        if (n == 0 || (x < 20 && n < MAXL)) {
            lseq *q = &s[n];
            memset(q, 0, sizeof *q);
            size_t w = test_rng_next(&r) % 4 == 0 ? 32 : 0;
            assert_ok(llmem_kv_seq_create(sh->kv, w, &q->h));
            q->window = w;
            n++;
            if (test_rng_next(&r) % 4) {
                /* A shared prompt: every block comes from the cache. */
                const int32_t *p = sh->prompts[test_rng_next(&r) % NPROMPT];
                size_t got = 0;
                assert_ok(llmem_kv_seq_match_prefix(sh->kv, q->h, p, PLEN, &got));
                assert_int_equal(got, PLEN);
                hits += got;
                push(q, p, got);
                verify(sh, q);
            }
            size_t m = 1 + (size_t)(test_rng_next(&r) % 20);
            own_tokens(a->id, &r, t, m);
            size_t fp = 0;
            assert_ok(llmem_kv_seq_append(sh->kv, q->h, m, t, &fp));
            assert_int_equal(fp, q->length);
            push(q, t, m);
            write_range(sh, q, fp, q->length);
        } else if (x < 55) {
            lseq *q = &s[i];
            size_t m = 1 + (size_t)(test_rng_next(&r) % 24);
            if (q->length + m > (q->window ? 500 : MAXLEN)) continue;
            own_tokens(a->id, &r, t, m);
            bool pass = test_rng_next(&r) % 5 != 0;
            size_t fp = 0;
            assert_ok(llmem_kv_seq_append(sh->kv, q->h, m, pass ? t : NULL, &fp));
            assert_int_equal(fp, q->length);
            push(q, t, m);
            write_range(sh, q, fp, q->length);
        } else if (x < 65 && n < MAXL) {
            lseq *c = &s[n];
            *c = s[i];
            assert_ok(llmem_kv_seq_fork(sh->kv, s[i].h, &c->h));
            n++;
        } else if (x < 75) {
            lseq *q = &s[i];
            size_t len = q->first + (size_t)(test_rng_next(&r) % (q->length - q->first + 1));
            assert_ok(llmem_kv_seq_truncate(sh->kv, q->h, len));
            q->length = len;
        } else if (x < 88) {
            verify(sh, &s[i]);
        } else {
            verify(sh, &s[i]);
            assert_ok(llmem_kv_seq_free(sh->kv, s[i].h));
            s[i] = s[--n];
        }
    }
    for (size_t i = 0; i < n; i++) {
        verify(sh, &s[i]);
        assert_ok(llmem_kv_seq_free(sh->kv, s[i].h));
    }
    free(s);
    atomic_fetch_add(&sh->hits, hits);
    atomic_fetch_sub(&sh->running, 1);
    return NULL;
}

static void *observer(void *arg)
{
    shared *sh = arg;
    uint64_t loops = 0, last_hits = 0;
    while (atomic_load(&sh->running) > 0) {
        llmem_kv_stats st;
        memset(&st, 0, sizeof st);
        assert_ok(llmem_kv_get_stats(sh->kv, &st));
        assert_int_equal(st.blocks_used + st.blocks_cached + st.blocks_free, st.blocks_total);
        assert_true(st.sequences <= THREADS * MAXL);
        assert_true(st.tokens_written <= st.tokens_reserved);
        assert_true(st.bytes_reserved <= st.bytes_reserved_peak);
        assert_true(st.prefix_hit_tokens_total >= last_hits);
        last_hits = st.prefix_hit_tokens_total;
        if (loops % 8 == 0) assert_ok(llmem_kv_check(sh->kv));
        if (loops % 16 == 5) llmem_kv_trim(sh->kv, false); /* wholly free slabs only: the cache stays */
        loops++;
        sched_yield();
    }
    return NULL;
}

static void run(llmem_resource *dev, int rounds)
{
    shared *sh = calloc(1, sizeof *sh);
    sh->dev = dev;
    sh->rounds = rounds;
    llmem_kv_options o = llmem_kv_options_default();
    o.name = "kv-threads";
    o.layers = LAYERS;
    o.kv_heads = 2;
    o.head_dim = 8;
    o.block_tokens = B;
    o.max_seq_len = MAXLEN;
    o.prefix_cache = true;
    o.slab_bytes = 8 * 2 * TB * B; /* 8 blocks per slab: slabs come and go */
    o.resource = dev;
    assert_ok(llmem_kv_create(&o, &sh->kv));
    assert_int_equal(llmem_kv_token_layer_bytes(sh->kv), TB);

    /* The shared prompts, written before any worker runs, then cached. */
    uint64_t r = 42;
    for (int p = 0; p < NPROMPT; p++) {
        for (int i = 0; i < PLEN; i++) sh->prompts[p][i] = (int32_t)(1 + test_rng_next(&r) % 50000);
        lseq *q = calloc(1, sizeof *q);
        assert_ok(llmem_kv_seq_create(sh->kv, 0, &q->h));
        size_t fp = 1;
        assert_ok(llmem_kv_seq_append(sh->kv, q->h, PLEN, sh->prompts[p], &fp));
        assert_int_equal(fp, 0);
        push(q, sh->prompts[p], PLEN);
        write_range(sh, q, 0, PLEN);
        verify(sh, q);
        assert_ok(llmem_kv_seq_free(sh->kv, q->h));
        free(q);
    }
    llmem_kv_stats st;
    memset(&st, 0, sizeof st);
    assert_ok(llmem_kv_get_stats(sh->kv, &st));
    assert_int_equal(st.blocks_cached, NPROMPT * PLEN / B);
    assert_int_equal(st.blocks_used, 0);

    pthread_t th[THREADS], obs;
    targ args[THREADS];
    atomic_store(&sh->running, THREADS);
    for (int i = 0; i < THREADS; i++) {
        args[i] = (targ){sh, i};
        assert_int_equal(pthread_create(&th[i], NULL, worker, &args[i]), 0);
    }
    assert_int_equal(pthread_create(&obs, NULL, observer, sh), 0);
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    pthread_join(obs, NULL);

    assert_ok(llmem_kv_check(sh->kv));
    memset(&st, 0, sizeof st);
    assert_ok(llmem_kv_get_stats(sh->kv, &st));
    assert_int_equal(st.sequences, 0);
    assert_int_equal(st.blocks_used, 0);
    assert_int_equal(st.tokens_written, 0);
    assert_int_equal(st.evictions_total, 0);
    assert_int_equal(st.preemptions_total, 0);
    assert_int_equal(st.prefix_hit_tokens_total, atomic_load(&sh->hits));
    assert_true(st.prefix_hit_tokens_total >= PLEN); /* the threads did share cached blocks */
    /* The prompts are still cached and still intact. */
    for (int p = 0; p < NPROMPT; p++) {
        lseq *q = calloc(1, sizeof *q);
        size_t got = 0;
        assert_ok(llmem_kv_seq_create(sh->kv, 0, &q->h));
        assert_ok(llmem_kv_seq_match_prefix(sh->kv, q->h, sh->prompts[p], PLEN, &got));
        assert_int_equal(got, PLEN);
        push(q, sh->prompts[p], PLEN);
        verify(sh, q);
        assert_ok(llmem_kv_seq_free(sh->kv, q->h));
        free(q);
    }
    llmem_kv_trim(sh->kv, true);
    memset(&st, 0, sizeof st);
    assert_ok(llmem_kv_get_stats(sh->kv, &st));
    assert_int_equal(st.bytes_reserved, 0);
    assert_int_equal(st.blocks_total, 0);
    assert_ok(llmem_kv_check(sh->kv));
    llmem_kv_destroy(sh->kv);
    free(sh);
}

static void threads_host(void **state)
{
    (void)state;
#ifdef TEST_TSAN
    run(NULL, 500);
#else
    run(NULL, 600);
#endif
}

static void threads_sim_device(void **state)
{
    (void)state;
    llmem_sim_options so = llmem_sim_options_default();
    so.fill = 0x5c;
    llmem_resource *sim;
    assert_ok(llmem_sim_resource_create(&so, &sim));
#ifdef TEST_TSAN
    run(sim, 150);
#else
    run(sim, 200);
#endif
    test_sim_expect_clean(sim);
    llmem_resource_destroy(sim);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(threads_host),
        cmocka_unit_test(threads_sim_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
