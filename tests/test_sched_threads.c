/*
 * test_sched_threads.c - the scheduler under concurrent use, as a server
 * drives it: one thread steps (as a server's step loop, sleeping in
 * llmem_sched_wait_work when idle), client threads submit requests and
 * stream their tokens (llmem_sched_wait, llmem_sched_read), cancel some of
 * their own mid-stream and release them, and a rogue thread cancels and
 * releases requests it does not own; a /metrics-like reader takes stats
 * meanwhile. Over the simulated engine (realtime, so the threads really
 * interleave with steps; preemptions swap): reads only grow, a token once
 * read never changes (the whole output read again at the end equals what
 * was streamed), a cancelled request is finished when cancel returns, no
 * KV byte changes (write_kv), nothing moves inside llmem_sched_while_still,
 * and at the end the KV holds nothing and the counters close.
 * Label `threads` (the TSan build runs it).
 */
#include <pthread.h>
#include <stdatomic.h>

#include "test_util.h"
#include "support/rng.h"

enum { CLIENTS = 4, PER_CLIENT = 60, VOCAB = 4096 };

typedef struct world {
    llmem_sched *s;
    llmem_kv *kv;
    atomic_int stop;
    pthread_mutex_t ids_mu;
    llmem_sched_req ids[CLIENTS * PER_CLIENT];
    atomic_size_t nids;
    atomic_uint_fast64_t tokens_read, cancels, rogue_cancels;
    atomic_uint_fast64_t still_checks, still_moved; /* llmem_sched_while_still */
} world;

static void *stepper(void *arg)
{
    world *w = arg;
    while (!atomic_load(&w->stop)) {
        if (!llmem_sched_wait_work(w->s, 2000000)) continue;
        llmem_sched_step_report rep;
        if (llmem_sched_step(w->s, &rep)) abort();
    }
    return NULL;
}

typedef struct client {
    world *w;
    unsigned idx;
    uint64_t rng;
    unsigned failures;
} client;

static void *client_main(void *arg)
{
    client *c = arg;
    world *w = c->w;
    int32_t prompt[200], out[64];
    for (unsigned i = 0; i < PER_CLIENT; i++) {
        c->rng = test_mix64(c->rng + i);
        uint32_t len = 8 + (uint32_t)(c->rng % 150);
        for (uint32_t t = 0; t < len; t++) prompt[t] = (int32_t)((c->idx * 1000 + i * 31 + t * 7) % VOCAB);
        llmem_sched_params p = llmem_sched_params_default();
        p.prompt = prompt;
        p.prompt_len = len;
        p.max_tokens = 4 + (uint32_t)(c->rng >> 20) % 40;
        p.n = 1 + (uint32_t)(c->rng >> 40) % 2;
        llmem_sched_req id;
        llmem_status st;
        while ((st = llmem_sched_submit(w->s, &p, &id)) == LLMEM_ECAPACITY) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        if (st) {
            c->failures++;
            continue;
        }
        pthread_mutex_lock(&w->ids_mu);
        w->ids[atomic_fetch_add(&w->nids, 1)] = id;
        pthread_mutex_unlock(&w->ids_mu);
        bool cancel_mine = c->rng % 5 == 0;
        uint32_t cancel_at = (uint32_t)(c->rng >> 8) % 6;
        uint64_t progress = 0;
        size_t seen[2] = {0, 0};
        int32_t streamed[2][64];
        for (;;) {
            if (llmem_sched_wait(w->s, id, &progress, 50000000) == LLMEM_EINVAL) break; /* the rogue released it */
            bool all_done = true, gone = false;
            for (uint32_t k = 0; k < p.n; k++) {
                /* The state first, then the read: a step may append and
                 * finish between the two calls, so only a state seen before
                 * the read promises the read got every token. */
                llmem_sched_info info;
                if (llmem_sched_get_info(w->s, id, k, &info)) {
                    gone = true;
                    break;
                }
                size_t got;
                if (llmem_sched_read(w->s, id, k, seen[k], out, 64 - seen[k], &got)) {
                    gone = true;
                    break;
                }
                memcpy(&streamed[k][seen[k]], out, got * sizeof *out);
                atomic_fetch_add(&w->tokens_read, got);
                seen[k] += got;
                if (seen[k] < info.visible) c->failures++; /* reads only grow */
                if (info.state != LLMEM_SCHED_FINISHED) all_done = false;
            }
            if (gone) break;
            if (cancel_mine && seen[0] >= cancel_at) {
                if (llmem_sched_cancel(w->s, id) == LLMEM_OK) {
                    llmem_sched_info info;
                    if (llmem_sched_get_info(w->s, id, 0, &info) == LLMEM_OK && info.state != LLMEM_SCHED_FINISHED)
                        c->failures++; /* finished when cancel returns */
                    atomic_fetch_add(&w->cancels, 1);
                }
                break;
            }
            if (all_done) {
                for (uint32_t k = 0; k < p.n; k++) {
                    size_t got;
                    if (llmem_sched_read(w->s, id, k, 0, out, 64, &got)) break; /* the rogue */
                    if (got != seen[k] || memcmp(out, streamed[k], got * sizeof *out)) c->failures++;
                }
                break;
            }
        }
        llmem_sched_release(w->s, id); /* may be gone already (the rogue): EINVAL */
    }
    return NULL;
}

/* Inside llmem_sched_while_still nothing drives the backend: the KV's
 * figures hold still across a sleep that spans several steps. */
static void still_kv(void *arg)
{
    world *w = arg;
    llmem_kv_stats a = {sizeof a}, b = {sizeof b};
    llmem_kv_get_stats(w->kv, &a);
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
    llmem_kv_get_stats(w->kv, &b);
    if (a.sequences != b.sequences || a.blocks_used != b.blocks_used || a.tokens_written != b.tokens_written)
        atomic_fetch_add(&w->still_moved, 1);
    atomic_fetch_add(&w->still_checks, 1);
}

static void *rogue(void *arg)
{
    world *w = arg;
    uint64_t r = 77;
    while (!atomic_load(&w->stop)) {
        r = test_mix64(r);
        size_t n = atomic_load(&w->nids);
        if (n) {
            pthread_mutex_lock(&w->ids_mu);
            llmem_sched_req id = w->ids[r % n];
            pthread_mutex_unlock(&w->ids_mu);
            if ((r >> 32) % 4 == 0 ? llmem_sched_release(w->s, id) == LLMEM_OK : llmem_sched_cancel(w->s, id) == LLMEM_OK)
                atomic_fetch_add(&w->rogue_cancels, 1);
        }
        llmem_sched_stats st = {sizeof st};
        llmem_sched_get_stats(w->s, &st); /* a /metrics reader meanwhile */
        llmem_sched_histogram h;
        llmem_sched_get_histogram(w->s, LLMEM_SCHED_HIST_TTFT, &h);
        if ((r >> 40) % 4 == 0 && llmem_sched_while_still(w->s, still_kv, w)) abort();
        struct timespec ts = {0, 3000000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void concurrent_submit_stream_cancel(void **state)
{
    (void)state;
    llmem_pool_options po = llmem_pool_options_default();
    po.resource = llmem_resource_default();
    llmem_pool *pool;
    assert_ok(llmem_pool_create(&po, &pool));
    llmem_resource *swap;
    assert_ok(llmem_os_resource_create(NULL, &swap));
    llmem_kv_options ko = llmem_kv_options_default();
    ko.layers = 2;
    ko.kv_heads = 2;
    ko.head_dim = 8;
    ko.max_seq_len = 512;
    ko.budget_bytes = 40 << 10; /* 640 tokens: preemptions (swaps) happen */
    ko.slab_bytes = 4096;     /* 4 blocks a layer (the default 64 KiB floor would not fit) */
    ko.pool = pool;
    ko.prefix_cache = true;
    ko.swap_resource = swap;
    world w;
    memset(&w, 0, sizeof w);
    pthread_mutex_init(&w.ids_mu, NULL);
    assert_ok(llmem_kv_create(&ko, &w.kv));
    llmem_sched_sim_options so = llmem_sched_sim_options_default();
    so.kv = w.kv;
    so.vocab = VOCAB;
    so.write_kv = true;
    so.realtime = true; /* real time, so clients and steps interleave */
    so.model = llmem_step_model_linear(0.0002, 1e-7, 0, 0);
    llmem_sched_options o = llmem_sched_options_default();
    o.max_batch = 8;
    o.max_step_tokens = 128;
    o.max_waiting = 16;
    assert_ok(llmem_sched_create_sim(&so, &o, &w.s));
    pthread_t st, rg, cl[CLIENTS];
    client cs[CLIENTS];
    assert_int_equal(pthread_create(&st, NULL, stepper, &w), 0);
    assert_int_equal(pthread_create(&rg, NULL, rogue, &w), 0);
    for (unsigned i = 0; i < CLIENTS; i++) {
        cs[i] = (client){&w, i, 1000 + i, 0};
        assert_int_equal(pthread_create(&cl[i], NULL, client_main, &cs[i]), 0);
    }
    for (unsigned i = 0; i < CLIENTS; i++) pthread_join(cl[i], NULL);
    atomic_store(&w.stop, 1);
    pthread_join(rg, NULL);
    pthread_join(st, NULL);
    for (unsigned i = 0; i < CLIENTS; i++) assert_int_equal(cs[i].failures, 0);
    llmem_sched_stats s = {sizeof s};
    assert_ok(llmem_sched_get_stats(w.s, &s));
    print_message("%llu submitted, %llu finished, %llu cancelled (%llu by clients, %llu by the rogue), %llu tokens read, "
                  "%llu preemptions (%llu swapped), %llu forks\n",
                  (unsigned long long)s.requests_submitted_total, (unsigned long long)s.requests_finished_total,
                  (unsigned long long)s.requests_cancelled_total, (unsigned long long)atomic_load(&w.cancels),
                  (unsigned long long)atomic_load(&w.rogue_cancels), (unsigned long long)atomic_load(&w.tokens_read),
                  (unsigned long long)s.preemptions_total, (unsigned long long)s.preemptions_swap_total,
                  (unsigned long long)s.forks_total);
    assert_int_equal(s.requests_submitted_total, CLIENTS * PER_CLIENT);
    assert_int_equal(s.requests_finished_total, s.requests_submitted_total);
    assert_int_equal(llmem_sched_pending(w.s), 0);
    assert_true(atomic_load(&w.tokens_read) > 0);
    assert_true(s.requests_cancelled_total > 0);
    assert_true(s.preemptions_total > 0 && s.preemptions_swap_total > 0);
    assert_true(atomic_load(&w.still_checks) > 0);
    assert_int_equal(atomic_load(&w.still_moved), 0);
    assert_status(llmem_sched_while_still(NULL, still_kv, &w), LLMEM_EINVAL);
    assert_status(llmem_sched_while_still(w.s, NULL, &w), LLMEM_EINVAL);
    llmem_sched_sim_stats ss = {sizeof ss};
    assert_ok(llmem_sched_get_sim_stats(w.s, &ss));
    assert_int_equal(ss.kv_corruptions_total, 0);
    llmem_kv_stats ks = {sizeof ks};
    assert_ok(llmem_kv_get_stats(w.kv, &ks));
    assert_int_equal(ks.sequences, 0);
    assert_int_equal(ks.blocks_used, 0);
    assert_int_equal(ks.swapped_sequences, 0);
    assert_ok(llmem_kv_check(w.kv));
    llmem_sched_destroy(w.s);
    llmem_kv_destroy(w.kv);
    llmem_pool_destroy(pool);
    llmem_resource_destroy(swap);
    pthread_mutex_destroy(&w.ids_mu);
}

int main(void)
{
    llmem_log_set(NULL, NULL, LLMEM_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(concurrent_submit_stream_cancel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
