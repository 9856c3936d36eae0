/*
 * test_controller_threads.c - the controller shared between an engine-like
 * thread (stage events, allocations) and a housekeeping thread (tick, stats,
 * event reads), on the real clock with a short decay so that shrinks and
 * grows happen while both run. Run under TSan by `make check-tsan`.
 */
#include <pthread.h>

#include "test_util.h"

#define KIB ((size_t)1 << 10)

typedef struct shared {
    llmem_pool *pool;
    llmem_controller *ctl;
    int done;
} shared;

static void stage(llmem_controller *c, llmem_stage s, uint32_t batch, uint64_t tokens)
{
    llmem_stage_event ev = {s, batch, tokens, 0};
    llmem_controller_on_stage(c, &ev);
}

static void *engine_thread(void *arg)
{
    shared *sh = arg;
    void *held[64] = {0};
    for (int round = 0; round < 40; round++) {
        stage(sh->ctl, LLMEM_STAGE_PREFILL, 2, 64);
        for (int i = 0; i < 64; i++)
            held[i] = llmem_pool_alloc(sh->pool, (size_t)(16 + (i * 37 + round) % 96) * KIB, NULL);
        for (int step = 0; step < 50; step++) {
            stage(sh->ctl, LLMEM_STAGE_DECODE, 2, 2);
            int k = (step * 13 + round) % 64;
            llmem_pool_free(sh->pool, held[k]);
            held[k] = llmem_pool_alloc(sh->pool, (size_t)(8 + step % 64) * KIB, NULL);
        }
        for (int i = 0; i < 64; i++) {
            llmem_pool_free(sh->pool, held[i]);
            held[i] = NULL;
        }
        stage(sh->ctl, LLMEM_STAGE_IDLE, 0, 0);
        usleep(3000); /* past the 1 ms decay: the other thread's tick shrinks */
    }
    __atomic_store_n(&sh->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void *housekeeping_thread(void *arg)
{
    shared *sh = arg;
    llmem_controller_event ev[32];
    while (!__atomic_load_n(&sh->done, __ATOMIC_ACQUIRE)) {
        llmem_controller_tick(sh->ctl);
        llmem_controller_stats s = {0};
        assert_ok(llmem_controller_get_stats(sh->ctl, &s));
        size_t n = llmem_controller_events(sh->ctl, ev, 32);
        for (size_t i = 1; i < n; i++) assert_true(ev[i].time_ns >= ev[i - 1].time_ns);
        usleep(200);
    }
    return NULL;
}

static void tick_while_staging(void **state)
{
    (void)state;
    llmem_pool_options po = llmem_pool_options_default();
    po.purge = LLMEM_POOL_PURGE_MANUAL;
    po.first_superblock_bytes = 1 << 20;
    po.max_superblock_bytes = 1 << 20;
    shared sh = {0};
    assert_ok(llmem_pool_create(&po, &sh.pool));
    llmem_controller_options o = llmem_controller_options_default();
    o.pool = sh.pool;
    o.bytes_per_token_hint = 16 * KIB;
    o.idle_decay_ms = 1;
    o.grow_min_bytes = 256 * KIB;
    o.event_capacity = 64;
    assert_ok(llmem_controller_create(&o, &sh.ctl));
    pthread_t a, b;
    assert_int_equal(pthread_create(&a, NULL, engine_thread, &sh), 0);
    assert_int_equal(pthread_create(&b, NULL, housekeeping_thread, &sh), 0);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    llmem_controller_stats s = {0};
    assert_ok(llmem_controller_get_stats(sh.ctl, &s));
    assert_int_equal(s.reserves_total, 40);
    assert_true(s.shrinks_total >= 1);
    assert_true(s.events_dropped > 0);
    assert_int_equal(s.failures_total, 0);
    FILE *f = tmpfile();
    assert_non_null(f);
    assert_ok(llmem_controller_write_events(sh.ctl, f));
    fclose(f);
    llmem_controller_destroy(sh.ctl);
    assert_ok(llmem_pool_check(sh.pool));
    llmem_pool_destroy(sh.pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tick_while_staging),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
